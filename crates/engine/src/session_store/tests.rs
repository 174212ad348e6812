//! Round trips, refusals and the directory store's index and budget.

use std::fs;

use std::path::{Path, PathBuf};

use pyramid_model::{Activation, Architecture, KvCache, KvType, ModelConfig};

use super::*;

fn cfg(n_layer: usize, n_head_kv: usize, head_dim: usize) -> ModelConfig {
    ModelConfig {
        arch: Architecture::Qwen2,
        name: "tiny".to_string(),
        n_vocab: 64,
        n_embd: n_head_kv * head_dim * 2,
        n_layer,
        n_head: n_head_kv * 2,
        n_head_kv,
        head_dim,
        n_ff: 64,
        n_ctx_train: 8192,
        n_rot: head_dim,
        rope_base: 10_000.0,
        rms_eps: 1e-5,
        embedding_scale: 1.0,
        attention_scale: 1.0 / (head_dim as f32).sqrt(),
        activation: Activation::Silu,
        sliding_window: None,
        rope_factors: None,
        rope_scale: 1.0,
        pooling: None,
        no_rope_layers: Vec::new(),
        experts: None,
    }
}

fn tiny() -> ModelConfig {
    cfg(2, 2, 8)
}

fn identity(kind: KvType) -> SessionIdentity {
    SessionIdentity::new(0xfeed, "int8", kind, &tiny())
}

/// A cache of `window` positions holding `n` positions of distinct values.
fn filled(c: &ModelConfig, kind: KvType, window: usize, n: usize, seed: f32) -> KvCache {
    let mut kv = KvCache::new(c, window, kind);
    for layer in 0..c.n_layer {
        for h in 0..c.n_head_kv {
            let keys: Vec<f32> = (0..n * c.head_dim)
                .map(|i| seed + (layer * 31 + h * 7) as f32 + i as f32 * 0.013)
                .collect();
            let values: Vec<f32> = keys.iter().map(|x| 0.5 - x).collect();
            kv.write_head_rows(layer, h, 0, &keys, &values)
                .expect("rows fit");
        }
    }
    kv.commit(n).expect("room");
    kv
}

fn live_bytes(kv: &KvCache) -> Vec<u8> {
    let mut out = Vec::new();
    kv.write_live(&mut out).expect("write to memory");
    out
}

fn conversation(n: usize, start: u32) -> Vec<u32> {
    (start..start + n as u32).collect()
}

/// A store over `dir` that must open without warnings.
fn open(dir: &Path, kind: KvType, budget: Option<u64>) -> SessionStore {
    let (store, warnings) = SessionStore::open(dir, identity(kind), budget).expect("open");
    assert!(warnings.is_empty(), "{warnings:?}");
    store
}

fn save(store: &mut SessionStore, tokens: &[u32]) -> SaveReport {
    let kv = filled(&tiny(), store.identity().kv_type, 32, tokens.len(), 1.0);
    store.save(tokens, 32, &kv).expect("save")
}

fn file_of(store: &SessionStore, i: usize) -> PathBuf {
    store.entries[i].path.clone()
}

#[test]
fn session_store_file_round_trip_every_kv_type() {
    let dir = tempfile::tempdir().expect("temp dir");
    let c = tiny();
    for kind in KvType::ALL {
        let id = identity(kind);
        let tokens = conversation(11, 100);
        let kv = filled(&c, kind, 16, tokens.len(), 3.0);
        let path = dir.path().join(format!("{kind}.{SESSION_EXT}"));
        let bytes = save_session(&path, &id, &tokens, 16, &kv, &[]).expect("save");
        assert_eq!(bytes, fs::metadata(&path).expect("saved").len());
        assert_eq!(Some(bytes), id.file_bytes(tokens.len() as u64));
        let header = read_header(&path).expect("header");
        assert_eq!(header.identity, id);
        assert_eq!((header.window, &header.tokens), (16, &tokens));
        for dst in [
            KvCache::new(&c, 16, kind),
            KvCache::with_reserve(&c, 16, 1024, kind),
        ] {
            let stored = load_session(&path, &id, dst).expect("load");
            assert_eq!((stored.tokens.as_slice(), stored.window), (&tokens[..], 16));
            assert_eq!(stored.kv.len(), tokens.len());
            assert_eq!(live_bytes(&stored.kv), live_bytes(&kv), "{kind}");
        }
    }
}

#[test]
fn session_store_load_refuses_a_cache_that_does_not_fit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let id = identity(KvType::F16);
    let tokens = conversation(10, 0);
    let path = dir.path().join(format!("a.{SESSION_EXT}"));
    let kv = filled(&tiny(), KvType::F16, 16, 10, 0.0);
    save_session(&path, &id, &tokens, 16, &kv, &[]).expect("save");
    for wrong in [
        KvCache::new(&tiny(), 8, KvType::F16),
        KvCache::new(&tiny(), 16, KvType::F32),
        KvCache::new(&cfg(3, 2, 8), 16, KvType::F16),
        filled(&tiny(), KvType::F16, 16, 1, 0.0),
    ] {
        let err = load_session(&path, &id, wrong).err().expect("refused");
        assert!(matches!(err, StoreError::BadCache { .. }), "{err}");
    }
    let err = save_session(&path, &id, &tokens[..9], 16, &kv, &[]).expect_err("mismatch");
    assert!(matches!(err, StoreError::BadCache { .. }), "{err}");
}

#[test]
fn session_store_open_skips_other_setups_with_a_warning() {
    let dir = tempfile::tempdir().expect("temp dir");
    let c = tiny();
    let tokens = conversation(6, 1);
    let write = |name: &str, id: &SessionIdentity| {
        let shape = cfg(id.n_layer, id.n_head_kv, id.head_dim);
        let kv = filled(&shape, id.kv_type, 8, tokens.len(), 0.0);
        let path = dir.path().join(format!("{name}.{SESSION_EXT}"));
        save_session(&path, id, &tokens, 8, &kv, &[]).expect("save");
        path
    };
    write("ours", &identity(KvType::Int8));
    let other_model = SessionIdentity {
        model_id: 7,
        ..identity(KvType::Int8)
    };
    write("model", &other_model);
    write(
        "precision",
        &SessionIdentity::new(0xfeed, "int4", KvType::Int8, &c),
    );
    write("kvtype", &identity(KvType::F16));
    write(
        "shape",
        &SessionIdentity::new(0xfeed, "int8", KvType::Int8, &cfg(3, 2, 8)),
    );
    let version = write("version", &identity(KvType::Int8));
    let mut bytes = fs::read(&version).expect("read");
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    fs::write(&version, bytes).expect("write");
    fs::write(dir.path().join(format!("junk.{SESSION_EXT}")), b"hello").expect("write");
    fs::write(dir.path().join("notes.txt"), b"not ours").expect("write");

    let (store, warnings) =
        SessionStore::open(dir.path(), identity(KvType::Int8), None).expect("open");
    assert_eq!(store.len(), 1);
    assert!(store.entries[0]
        .path
        .ends_with(format!("ours.{SESSION_EXT}")));
    let joined = warnings.join("\n");
    assert_eq!(warnings.len(), 6, "{joined}");
    for needle in [
        "model id 0000000000000007, this server runs 000000000000feed",
        "precision int4, this server runs int8",
        "KV type f16, this server runs int8",
        "KV shape 3×2×8",
        "version 2, this build reads 1",
        "not a session file",
    ] {
        assert!(joined.contains(needle), "{needle} missing from {joined}");
    }
    // Other setups' files are left alone.
    assert!(version.exists());
    assert!(dir.path().join("notes.txt").exists());
}

#[test]
fn session_store_rejects_truncated_and_flipped_files_and_drops_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kind = KvType::F32;
    let mut store = open(dir.path(), kind, None);
    save(&mut store, &conversation(10, 0));
    save(&mut store, &conversation(10, 500));
    save(&mut store, &conversation(10, 900));
    assert_eq!(store.len(), 3);

    // One byte of the KV flipped: only the whole-file checksum can see it.
    let flipped = file_of(&store, 0);
    let mut bytes = fs::read(&flipped).expect("read");
    let kv_start = bytes.len() - 4 - identity(kind).kv_bytes(10).expect("small") as usize;
    bytes[kv_start + 100] ^= 0x10;
    fs::write(&flipped, bytes).expect("write");
    let i = store.longest(&conversation(10, 0)).expect("indexed").0;
    let err = store
        .load(i, KvCache::new(&tiny(), 32, kind))
        .err()
        .expect("flipped");
    assert!(
        matches!(&err, StoreError::Corrupt { reason, .. } if reason.starts_with("checksum")),
        "{err}"
    );
    assert_eq!(store.len(), 2);
    assert!(!flipped.exists());

    // Truncated after indexing.
    let i = store.longest(&conversation(10, 500)).expect("indexed").0;
    let truncated = file_of(&store, i);
    let file = fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .expect("open");
    let len = file.metadata().expect("metadata").len();
    file.set_len(len - 50).expect("truncate");
    drop(file);
    let err = store
        .load(i, KvCache::new(&tiny(), 32, kind))
        .err()
        .expect("truncated");
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert_eq!(store.len(), 1);
    assert!(!truncated.exists());

    // Truncated before indexing: skipped by open, with a warning.
    let survivor = file_of(&store, 0);
    let file = fs::OpenOptions::new()
        .write(true)
        .open(&survivor)
        .expect("open");
    file.set_len(200).expect("truncate");
    drop(file);
    drop(store);
    let (store, warnings) = SessionStore::open(dir.path(), identity(kind), None).expect("open");
    assert_eq!(store.len(), 0);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("corrupt"), "{warnings:?}");
}

#[test]
fn session_store_removes_leftover_temp_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = open(dir.path(), KvType::F32, None);
    save(&mut store, &conversation(5, 0));
    let leftover = dir
        .path()
        .join(format!("0123456789abcdef.{SESSION_EXT}.tmp-999-3"));
    fs::write(&leftover, b"half a file").expect("write");
    drop(store);
    let (store, warnings) =
        SessionStore::open(dir.path(), identity(KvType::F32), None).expect("open");
    assert!(!leftover.exists());
    assert_eq!(store.len(), 1);
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("interrupted save"), "{warnings:?}");
    let names: Vec<_> = fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .filter(|name| name != ".lock")
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn session_store_longest_picks_the_longest_shared_prefix() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = open(dir.path(), KvType::F16, None);
    assert_eq!(store.longest(&[1, 2, 3]), None);
    save(&mut store, &[1, 2, 3, 4]);
    save(&mut store, &[1, 2, 9, 9, 9, 9]);
    save(&mut store, &[7, 7]);
    let at = |store: &SessionStore, prompt: &[u32]| {
        store
            .longest(prompt)
            .map(|(i, n)| (store.tokens(i).to_vec(), n))
    };
    assert_eq!(at(&store, &[1, 2, 3, 4, 5, 6]), Some((vec![1, 2, 3, 4], 4)));
    assert_eq!(at(&store, &[1, 2, 9, 0]), Some((vec![1, 2, 9, 9, 9, 9], 3)));
    assert_eq!(at(&store, &[7]), Some((vec![7, 7], 1)));
    assert_eq!(at(&store, &[5, 1, 2]), None);
    // Between equals, the smaller file.
    assert_eq!(at(&store, &[1, 2, 0]), Some((vec![1, 2, 3, 4], 2)));
    let (i, _) = store.longest(&[1, 2, 3, 4, 5]).expect("indexed");
    assert_eq!(store.window(i), 32);
    let stored = store
        .load(i, KvCache::new(&tiny(), store.window(i), KvType::F16))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(stored.tokens, [1, 2, 3, 4]);
    assert_eq!(
        live_bytes(&stored.kv),
        live_bytes(&filled(&tiny(), KvType::F16, 32, 4, 1.0))
    );
}

#[test]
fn session_store_grown_conversation_supersedes_its_prefix() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = open(dir.path(), KvType::Int8, None);
    let turn1 = conversation(6, 10);
    let turn2 = conversation(12, 10);
    let fork = [&turn1[..4], &[99, 98][..]].concat();
    assert_eq!(save(&mut store, &turn1).superseded, 0);
    save(&mut store, &fork);
    let first = file_of(&store, 0);
    let report = save(&mut store, &turn2);
    assert_eq!((report.superseded, report.kept), (1, true));
    assert!(!first.exists());
    assert_eq!(store.len(), 2);
    assert_eq!(store.longest(&turn1), Some((1, 6)));
    assert_eq!(store.tokens(1), &turn2[..]);
    // Saving the same conversation again replaces its file, not adds one.
    save(&mut store, &turn2);
    assert_eq!(store.len(), 2);
    let bytes = store.bytes();
    drop(store);
    let reopened = open(dir.path(), KvType::Int8, None);
    assert_eq!(reopened.len(), 2);
    assert_eq!(reopened.bytes(), bytes);
}

#[test]
fn session_store_disk_budget_evicts_least_recently_used_first() {
    let dir = tempfile::tempdir().expect("temp dir");
    let per_file = identity(KvType::F32).file_bytes(8).expect("small");
    let mut store = open(dir.path(), KvType::F32, Some(3 * per_file));
    let convs: Vec<Vec<u32>> = (0..4).map(|k| conversation(8, 100 * k)).collect();
    for c in &convs[..3] {
        assert_eq!(save(&mut store, c).evicted, 0);
    }
    assert_eq!(store.bytes(), 3 * per_file);
    // Loading the oldest makes it the most recent: the second goes instead.
    let (i, _) = store.longest(&convs[0]).expect("indexed");
    store
        .load(i, KvCache::new(&tiny(), 32, KvType::F32))
        .unwrap_or_else(|e| panic!("{e}"));
    let report = save(&mut store, &convs[3]);
    assert_eq!((report.evicted, report.kept), (1, true));
    assert_eq!(store.len(), 3);
    assert!(store.bytes() <= 3 * per_file);
    assert_eq!(store.longest(&convs[1]), None);
    for c in [&convs[0], &convs[2], &convs[3]] {
        assert_eq!(store.longest(c).map(|(_, n)| n), Some(8));
    }
    // One conversation over the budget alone is not written, and evicts nothing.
    let big = conversation(30, 5000);
    let report = save(&mut store, &big);
    assert_eq!(
        report,
        SaveReport {
            bytes: 0,
            kept: false,
            superseded: 0,
            evicted: 0
        }
    );
    assert_eq!(store.len(), 3);
    // A smaller budget at the next start evicts the oldest down to it.
    drop(store);
    let (smaller, warnings) =
        SessionStore::open(dir.path(), identity(KvType::F32), Some(per_file)).expect("open");
    assert_eq!(smaller.len(), 1);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let files = fs::read_dir(dir.path())
        .expect("list")
        .filter(|e| e.as_ref().expect("entry").file_name() != ".lock")
        .count();
    assert_eq!(files, 1);
}

#[test]
fn session_store_refuses_huge_length_fields_without_allocating() {
    let dir = tempfile::tempdir().expect("temp dir");
    let id = identity(KvType::F32);
    let path = dir.path().join(format!("a.{SESSION_EXT}"));
    let kv = filled(&tiny(), KvType::F32, 8, 4, 0.0);
    save_session(&path, &id, &[1, 2, 3, 4], 8, &kv, &[]).expect("save");
    let good = fs::read(&path).expect("read");
    // Offsets of window, n_tokens and n_layer in the fixed header.
    let (n_layer_at, window_at, n_tokens_at) = (21, 33, 37);
    for (at, value) in [
        (n_tokens_at, u32::MAX),
        (n_layer_at, u32::MAX),
        (window_at, 2),
    ] {
        let mut bytes = good.clone();
        if at == n_tokens_at {
            // Keep the window consistent so only the size check can catch it.
            bytes[window_at..window_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        }
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        fs::write(&path, bytes).expect("write");
        let err = read_header(&path).expect_err("refused");
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    }
    // A flipped window (within the size) is caught by the header checksum.
    let mut bytes = good.clone();
    bytes[window_at..window_at + 4].copy_from_slice(&4096u32.to_le_bytes());
    fs::write(&path, bytes).expect("write");
    let err = read_header(&path).expect_err("refused");
    assert!(err.to_string().contains("header checksum"), "{err}");
}

/// Save and load of a Qwen2.5-0.5B-sized cache of 4,000 positions (~100 MB): run with
/// `--ignored --nocapture` in an optimised build for the figures.
#[test]
#[ignore]
fn session_store_throughput_100mb() {
    let dir = tempfile::tempdir().expect("temp dir");
    let c = cfg(24, 2, 64);
    let n = 4000;
    let id = SessionIdentity::new(1, "int8", KvType::F32, &c);
    let kv = filled(&c, KvType::F32, 4096, n, 0.0);
    let tokens = conversation(n, 0);
    let path = dir.path().join(format!("big.{SESSION_EXT}"));
    let mb = |b: u64, s: f64| b as f64 / s / 1e6;
    let t = std::time::Instant::now();
    let bytes = save_session(&path, &id, &tokens, 4096, &kv, &[]).expect("save");
    let s = t.elapsed().as_secs_f64();
    println!(
        "save {:.1} MB in {:.0} ms: {:.0} MB/s (with fsync)",
        bytes as f64 / 1e6,
        s * 1e3,
        mb(bytes, s)
    );
    for round in 0..3 {
        let dst = KvCache::new(&c, 4096, KvType::F32);
        let t = std::time::Instant::now();
        let stored = load_session(&path, &id, dst).expect("load");
        let s = t.elapsed().as_secs_f64();
        println!(
            "load {round} (compact): {:.0} ms, {:.0} MB/s",
            s * 1e3,
            mb(bytes, s)
        );
        assert_eq!(stored.kv.len(), n);
    }
    let dst = KvCache::with_reserve(&c, 4096, 8192, KvType::F32);
    let t = std::time::Instant::now();
    load_session(&path, &id, dst).expect("load");
    let s = t.elapsed().as_secs_f64();
    println!(
        "load (reserved): {:.0} ms, {:.0} MB/s",
        s * 1e3,
        mb(bytes, s)
    );
}

#[test]
fn session_store_file_keeps_the_writers_note() {
    let dir = tempfile::tempdir().expect("temp dir");
    let c = tiny();
    let id = identity(KvType::F16);
    let tokens = conversation(5, 7);
    let kv = filled(&c, KvType::F16, 8, tokens.len(), 1.0);
    let path = dir.path().join(format!("note.{SESSION_EXT}"));
    let note = br#"[{"role":"user","content":"hi"}]"#;
    save_session(&path, &id, &tokens, 8, &kv, note).expect("save");
    assert_eq!(read_header(&path).expect("header").note, note);
    let stored = load_session(&path, &id, KvCache::new(&c, 8, KvType::F16)).expect("load");
    assert_eq!((stored.note.as_slice(), stored.tokens), (&note[..], tokens));
}

#[test]
fn session_store_is_one_process_directory_and_skips_what_is_not_a_regular_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = open(dir.path(), KvType::F32, None);
    save(&mut store, &conversation(5, 0));
    // A second store on the same directory is refused while the first holds it.
    let err = SessionStore::open(dir.path(), identity(KvType::F32), None)
        .err()
        .expect("refused");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    drop(store);
    // A FIFO named like a session file would block a plain open for ever.
    let fifo = dir.path().join(format!("fifo.{SESSION_EXT}"));
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo reads it only.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    let (store, warnings) =
        SessionStore::open(dir.path(), identity(KvType::F32), None).expect("open");
    assert_eq!(store.len(), 1);
    assert!(
        warnings.iter().any(|w| w.contains("not a session file")),
        "{warnings:?}"
    );
}

#[test]
fn session_store_bounds_what_a_sparse_crafted_header_makes_it_read() {
    let dir = tempfile::tempdir().expect("temp dir");
    let id = identity(KvType::F32);
    let path = dir.path().join(format!("a.{SESSION_EXT}"));
    let kv = filled(&tiny(), KvType::F32, 8, 4, 0.0);
    save_session(&path, &id, &[1, 2, 3, 4], 8, &kv, &[]).expect("save");
    let mut bytes = fs::read(&path).expect("read");
    // A 1 GiB note, and a file made as long as the header says, without its bytes.
    let note_at = 43;
    bytes[note_at..note_at + 4].copy_from_slice(&(1u32 << 30).to_le_bytes());
    fs::write(&path, &bytes).expect("write");
    let claimed = id.file_bytes_with(4 + id.precision.len() as u64, 1 << 30, 4);
    let file = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    file.set_len(claimed.expect("fits") + 64).expect("sparse");
    let err = read_header(&path).expect_err("refused");
    assert!(err.to_string().contains("beyond the bounds"), "{err}");
}
