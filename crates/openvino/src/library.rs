//! Finding and loading `libopenvino_c` at run time, so building pyramid never needs
//! OpenVINO and the native backend never loads it.
//!
//! The `openvino` wheel ships only versioned files (`libopenvino_c.so.2641`), which
//! `openvino-sys`'s own finder does not look for; pyramid searches itself and hands the
//! file to `openvino_sys::library::load_from`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::{OvError, Result};

/// Names the library file, or a directory holding it.
pub const LIBRARY_ENV: &str = "PYRAMID_OPENVINO_LIB";

/// The loaded library: its path and OpenVINO build number.
#[derive(Debug, Clone)]
pub struct Library {
    pub path: PathBuf,
    pub version: String,
}

static LOADED: OnceLock<Result<Library>> = OnceLock::new();

/// Loads OpenVINO once per process; later calls return the first outcome.
pub fn load() -> Result<&'static Library> {
    LOADED
        .get_or_init(|| load_file(&locate()?))
        .as_ref()
        .map_err(Clone::clone)
}

/// C functions pyramid calls that older releases lack; checked before `openvino-sys`
/// binds the library, whose wrappers would otherwise panic on the first missing one.
const REQUIRED_SYMBOLS: [&str; 4] = [
    "ov_get_openvino_version",
    "ov_core_compile_model_props",
    "ov_core_read_model_from_memory_buffer",
    "ov_tensor_create_from_host_ptr",
];

fn load_file(path: &Path) -> Result<Library> {
    let not_installed = |reason: String| OvError::NotInstalled { reason };
    let wrong = |detail: String| OvError::WrongVersion {
        path: path.display().to_string(),
        detail,
    };
    // SAFETY: loading runs the library's initialisers; the file is the user's chosen
    // OpenVINO (or the setup script's), the same trust as linking it.
    let probe = unsafe { libloading::Library::new(path) }
        .map_err(|e| not_installed(format!("cannot open {}: {e}", path.display())))?;
    for symbol in REQUIRED_SYMBOLS {
        // SAFETY: only the symbol's presence is checked; it is never called through this.
        if unsafe { probe.get::<unsafe extern "C" fn()>(symbol.as_bytes()) }.is_err() {
            return Err(wrong(format!("it has no {symbol}")));
        }
    }
    // openvino-sys rejects releases before 2025.1, whose element-type numbering differs.
    openvino_sys::library::load_from(path).map_err(|e| {
        if e.contains("too old") {
            wrong(e)
        } else {
            not_installed(e)
        }
    })?;
    Ok(Library {
        path: path.to_path_buf(),
        version: version_string()
            .ok_or_else(|| not_installed("the library does not report its version".into()))?,
    })
}

fn version_string() -> Option<String> {
    let mut v = openvino_sys::ov_version_t {
        buildNumber: std::ptr::null(),
        description: std::ptr::null(),
    };
    // SAFETY: the library is loaded; `v` is freed by the matching call below.
    unsafe {
        if openvino_sys::ov_get_openvino_version(&mut v) != openvino_sys::ov_status_e::OK {
            return None;
        }
        let s = std::ffi::CStr::from_ptr(v.buildNumber)
            .to_string_lossy()
            .into_owned();
        openvino_sys::ov_version_free(&mut v);
        Some(s)
    }
}

/// `PYRAMID_OPENVINO_LIB`, else the newest install under `$PYRAMID_HOME/openvino`.
fn locate() -> Result<PathBuf> {
    locate_path().map_err(|reason| OvError::NotInstalled { reason })
}

fn locate_path() -> std::result::Result<PathBuf, String> {
    if let Some(given) = std::env::var_os(LIBRARY_ENV) {
        let given = PathBuf::from(given);
        return if given.is_dir() {
            find_in(&given)
                .ok_or_else(|| format!("{LIBRARY_ENV}={} has no libopenvino_c", given.display()))
        } else if given.is_file() {
            Ok(given)
        } else {
            Err(format!("{LIBRARY_ENV}={} does not exist", given.display()))
        };
    }
    let root = install_root();
    let mut versions: Vec<PathBuf> = std::fs::read_dir(&root)
        .map_err(|_| format!("nothing is installed in {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path().join("libs")))
        .filter(|p| p.is_dir())
        .collect();
    versions.sort();
    versions
        .iter()
        .rev()
        .find_map(|dir| find_in(dir))
        .ok_or_else(|| format!("no libopenvino_c under {}", root.display()))
}

/// Where `scripts/setup-openvino.sh` installs: `$PYRAMID_HOME/openvino/<version>/libs`.
pub fn install_root() -> PathBuf {
    let home = std::env::var_os("PYRAMID_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/pyramid")))
        .unwrap_or_else(|| PathBuf::from(".pyramid"));
    home.join("openvino")
}

fn find_in(dir: &Path) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n == "libopenvino_c.so" || n.starts_with("libopenvino_c.so."))
        })
        .collect();
    candidates.sort();
    candidates.pop()
}
