//! Models by Hugging Face id against a hub served from the test (no network): a fresh
//! fetch into the standard cache layout, a cached model resolved with no request, a
//! resumed download, a bad checksum refused, a split GGUF loaded as one, a transformers
//! checkpoint, and the errors a user meets.
#![cfg(unix)]

mod hub;

use std::path::{Path, PathBuf};

use hub::{FakeHub, HubFile};
use pyramid_gguf::split::split_file_name;
use pyramid_gguf::{GgufFile, GgufWriter};
use pyramid_registry::{HfHub, HfModelId, NoProgress, RegistryError};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(rel)
}

fn tiny_gguf() -> Vec<u8> {
    std::fs::read(testdata("llama3-rope/tiny-llama3.gguf")).unwrap()
}

fn id(text: &str) -> HfModelId {
    HfModelId::parse(text).unwrap()
}

/// A hub serving `test/tiny-GGUF`: two quantisations and a README.
fn gguf_hub() -> FakeHub {
    let hub = FakeHub::start();
    let mut other = tiny_gguf();
    other.extend_from_slice(b"another quantisation");
    hub.put(
        "test/tiny-GGUF",
        COMMIT,
        vec![
            HubFile::new("README.md", b"# tiny\n".to_vec()),
            HubFile::new("tiny-Q8_0.gguf", tiny_gguf()),
            HubFile::new("tiny-F16.gguf", other),
        ],
    );
    hub
}

fn client(hub: &FakeHub, dir: &Path) -> HfHub {
    HfHub::new(&hub.url, dir.join("hub"))
}

#[test]
fn a_fresh_fetch_fills_the_standard_cache_and_a_second_makes_no_request() {
    let hub = gguf_hub();
    let dir = tempfile::tempdir().unwrap();
    let hf = client(&hub, dir.path());

    let path = hf
        .resolve(&id("hf:test/tiny-GGUF:q8_0"), &NoProgress)
        .unwrap();
    let repo_dir = dir.path().join("hub/models--test--tiny-GGUF");
    assert_eq!(
        path,
        repo_dir
            .join("snapshots")
            .join(COMMIT)
            .join("tiny-Q8_0.gguf")
    );
    assert_eq!(std::fs::read(&path).unwrap(), tiny_gguf());
    // The layout every Hugging Face tool shares: a relative link to the blob named by
    // its SHA-256, and the ref.
    let sha = hub::hex(&<sha2::Sha256 as sha2::Digest>::digest(tiny_gguf()));
    assert_eq!(
        std::fs::read_link(&path).unwrap(),
        PathBuf::from(format!("../../blobs/{sha}"))
    );
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        COMMIT
    );
    let seen = hub.take_seen();
    assert!(seen
        .iter()
        .any(|s| s.url.starts_with("/api/models/test/tiny-GGUF")));
    assert!(seen.iter().any(|s| s.url.starts_with("/cdn/")));
    assert!(
        !seen.iter().any(|s| s.url.contains("F16")),
        "only the quant asked for"
    );

    // Again, as the same id and as the file: from the cache, without a request.
    for again in ["hf:test/tiny-GGUF:Q8_0", "hf:test/tiny-GGUF/tiny-Q8_0.gguf"] {
        assert_eq!(hf.resolve(&id(again), &NoProgress).unwrap(), path);
    }
    assert_eq!(hub.take_seen().len(), 0, "a cached model made requests");
    // Offline, the cached model still resolves and another one is refused.
    let offline = client(&hub, dir.path()).with_offline(true);
    assert_eq!(
        offline
            .resolve(&id("hf:test/tiny-GGUF:Q8_0"), &NoProgress)
            .unwrap(),
        path
    );
    let err = offline
        .resolve(&id("hf:test/tiny-GGUF:F16"), &NoProgress)
        .unwrap_err();
    assert!(matches!(err, RegistryError::HfNotCached { .. }), "{err}");
    assert_eq!(hub.take_seen().len(), 0);

    // A new commit that changed only the README: the other quantisation is fetched into
    // its snapshot, and the first, no longer in `main`'s snapshot, is linked from its
    // blob without downloading it again.
    let new_commit = "fedcba9876543210fedcba9876543210fedcba98";
    let mut other = tiny_gguf();
    other.extend_from_slice(b"another quantisation");
    hub.put(
        "test/tiny-GGUF",
        new_commit,
        vec![
            HubFile::new("README.md", b"# tiny, v2\n".to_vec()),
            HubFile::new("tiny-Q8_0.gguf", tiny_gguf()),
            HubFile::new("tiny-F16.gguf", other),
        ],
    );
    hf.resolve(&id("hf:test/tiny-GGUF:F16"), &NoProgress)
        .unwrap();
    hub.take_seen();
    let relinked = hf
        .resolve(&id("hf:test/tiny-GGUF:Q8_0"), &NoProgress)
        .unwrap();
    assert_eq!(
        relinked,
        repo_dir
            .join("snapshots")
            .join(new_commit)
            .join("tiny-Q8_0.gguf")
    );
    assert_eq!(std::fs::read(&relinked).unwrap(), tiny_gguf());
    let seen = hub.take_seen();
    assert!(
        !seen
            .iter()
            .any(|s| s.url.contains("/resolve/") || s.url.starts_with("/cdn/")),
        "{seen:?}"
    );
}

#[test]
fn a_cut_download_resumes_with_a_range_request() {
    let hub = gguf_hub();
    let dir = tempfile::tempdir().unwrap();
    let bytes = tiny_gguf();
    let sha = hub::hex(&<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    // What hf-hub leaves when a download is cut: the first bytes in `<blob>.part`.
    let blobs = dir.path().join("hub/models--test--tiny-GGUF/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let half = bytes.len() / 2;
    std::fs::write(blobs.join(format!("{sha}.part")), &bytes[..half]).unwrap();

    let path = client(&hub, dir.path())
        .resolve(&id("hf:test/tiny-GGUF:Q8_0"), &NoProgress)
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let downloads: Vec<_> = hub
        .take_seen()
        .into_iter()
        .filter(|s| s.url.starts_with("/cdn/") && s.range.as_deref() != Some("bytes=0-0"))
        .collect();
    assert_eq!(downloads.len(), 1, "{downloads:?}");
    assert_eq!(
        downloads[0].range.as_deref(),
        Some(format!("bytes={half}-").as_str())
    );
    assert!(!blobs.join(format!("{sha}.part")).exists());
}

#[test]
fn a_file_whose_checksum_is_not_the_hubs_is_refused_and_removed() {
    let hub = FakeHub::start();
    let mut file = HubFile::new("tiny-Q8_0.gguf", tiny_gguf());
    let claimed = "ab".repeat(32);
    file.claimed_sha256 = Some(claimed.clone());
    hub.put("test/corrupt", COMMIT, vec![file]);
    let dir = tempfile::tempdir().unwrap();

    let err = client(&hub, dir.path())
        .resolve(&id("hf:test/corrupt"), &NoProgress)
        .unwrap_err();
    let actual = hub::hex(&<sha2::Sha256 as sha2::Digest>::digest(tiny_gguf()));
    match &err {
        RegistryError::ChecksumMismatch {
            model,
            expected,
            actual: got,
        } => {
            assert_eq!(model, "test/corrupt/tiny-Q8_0.gguf");
            assert_eq!((expected, got), (&claimed, &actual));
        }
        other => panic!("expected a checksum mismatch, got {other}"),
    }
    assert!(err.to_string().contains("removed"), "{err}");
    let repo_dir = dir.path().join("hub/models--test--corrupt");
    let snapshot = repo_dir.join("snapshots").join(COMMIT);
    assert!(std::fs::read_dir(&snapshot).map_or(true, |mut d| d.next().is_none()));
    assert!(std::fs::read_dir(repo_dir.join("blobs"))
        .unwrap()
        .flatten()
        .all(|e| e.file_name().to_string_lossy().ends_with(".lock")));
}

#[test]
fn a_split_gguf_is_fetched_whole_and_opens_as_one_file() {
    let whole_path = testdata("llama3-rope/tiny-llama3.gguf");
    let whole = GgufFile::open(&whole_path).unwrap();
    let parts = GgufWriter::from_file(&whole)
        .unwrap()
        .to_split_bytes(3)
        .unwrap();
    let hub = FakeHub::start();
    let mut files = vec![HubFile::new("README.md", b"split\n".to_vec())];
    for (idx, bytes) in parts.into_iter().enumerate() {
        files.push(HubFile::new(
            &format!("Q8_0/{}", split_file_name("tiny-Q8_0", idx, 3)),
            bytes,
        ));
    }
    hub.put("test/split", COMMIT, files);
    let dir = tempfile::tempdir().unwrap();

    let path = client(&hub, dir.path())
        .resolve(&id("hf:test/split:Q8_0"), &NoProgress)
        .unwrap();
    assert!(
        path.ends_with("Q8_0/tiny-Q8_0-00001-of-00003.gguf"),
        "{}",
        path.display()
    );
    let split = GgufFile::open(&path).unwrap();
    assert_eq!(split.split_paths().len(), 3);
    assert_eq!(split.tensors().len(), whole.tensors().len());
    for info in whole.tensors() {
        let got = split.tensor_info(&info.name).unwrap();
        assert_eq!(
            split.tensor_bytes(got),
            whole.tensor_bytes(info),
            "{}",
            info.name
        );
    }
    assert_eq!(
        split.metadata().get("general.architecture"),
        whole.metadata().get("general.architecture")
    );
}

#[test]
fn a_transformers_repository_becomes_its_snapshot_directory() {
    let src = testdata("hf/tiny-qwen2");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        files.push(HubFile::new(&name, std::fs::read(entry.path()).unwrap()));
    }
    let hub = FakeHub::start();
    hub.put("test/tiny-qwen2", COMMIT, files);
    let dir = tempfile::tempdir().unwrap();
    let hf = client(&hub, dir.path());

    let path = hf.resolve(&id("hf:test/tiny-qwen2"), &NoProgress).unwrap();
    assert_eq!(
        path,
        dir.path()
            .join("hub/models--test--tiny-qwen2/snapshots")
            .join(COMMIT)
    );
    for name in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ] {
        assert_eq!(
            std::fs::read(path.join(name)).unwrap(),
            std::fs::read(src.join(name)).unwrap(),
            "{name}"
        );
    }
    assert!(
        !path.join("reference.json").exists(),
        "only what the loader reads"
    );
    hub.take_seen();
    assert_eq!(
        hf.resolve(&id("hf:test/tiny-qwen2"), &NoProgress).unwrap(),
        path
    );
    assert_eq!(hub.take_seen().len(), 0);
}

#[test]
fn errors_say_what_is_wrong() {
    let hub = gguf_hub();
    let dir = tempfile::tempdir().unwrap();
    let hf = client(&hub, dir.path());
    let message =
        |hf: &HfHub, text: &str| hf.resolve(&id(text), &NoProgress).unwrap_err().to_string();

    let err = message(&hf, "hf:nobody/nothing");
    assert!(
        err.contains(&format!("no model hf:nobody/nothing on {}", hub.url))
            && err.contains("HF_TOKEN"),
        "{err}"
    );
    let err = message(&hf, "hf:test/tiny-GGUF");
    assert!(
        err.contains("tiny-F16.gguf, tiny-Q8_0.gguf") && err.contains(":QUANT"),
        "{err}"
    );
    let err = message(&hf, "hf:test/tiny-GGUF:Q2_K");
    assert!(err.contains("has no Q2_K GGUF file"), "{err}");

    // A port nobody listens on: no network.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let err = message(
        &HfHub::new(&url, dir.path().join("hub")),
        "hf:test/tiny-GGUF:Q8_0",
    );
    assert!(
        err.contains("cannot reach the Hugging Face hub") && err.contains(&url),
        "{err}"
    );
}

/// A fetch killed between hf-hub linking a file and its check leaves the blob marked
/// unchecked: the cache does not serve it, and the next fetch checks it (here: bytes
/// changed on disk, so it is refused and removed) instead of trusting it.
#[test]
fn a_file_left_unchecked_by_a_cut_fetch_is_checked_before_it_is_served() {
    let hub = gguf_hub();
    let dir = tempfile::tempdir().unwrap();
    let client = client(&hub, dir.path());
    let path = client
        .resolve(&id("hf:test/tiny-GGUF:Q8_0"), &NoProgress)
        .unwrap();
    let blob = std::fs::canonicalize(&path).unwrap();
    let marker = PathBuf::from(format!("{}.unverified", blob.display()));
    assert!(!marker.exists(), "a checked file leaves no marker");
    // As if killed after the link, before the check, with the bytes not the hub's.
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    std::fs::write(&marker, b"").unwrap();
    assert!(client.cached(&id("hf:test/tiny-GGUF:Q8_0")).is_none());
    let err = client
        .resolve(&id("hf:test/tiny-GGUF:Q8_0"), &NoProgress)
        .unwrap_err();
    assert!(
        matches!(err, RegistryError::ChecksumMismatch { .. }),
        "{err}"
    );
    assert!(!path.exists() && !blob.exists() && !marker.exists());
    // The next fetch downloads it again, checked.
    client
        .resolve(&id("hf:test/tiny-GGUF:Q8_0"), &NoProgress)
        .unwrap();
    assert!(path.is_file() && !marker.exists());
}
