//! Conversations that survive a restart, on the fake backend of `common`: written to the
//! session store when evicted or at shutdown, resumed from it by a new engine with the
//! same tokens, swapped out to it under memory pressure, and skipped when corrupt or
//! another model's.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use pyramid_engine::{Arm, Engine, EngineConfig, Request};
use pyramid_kernels::ThreadPool;
use pyramid_model::KvType;

/// A fresh directory under the system's temporary one, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("pyramid-persist-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cfg(max_batch: usize) -> EngineConfig {
    EngineConfig {
        aging: Duration::ZERO,
        speculative: pyramid_engine::SpeculativeConfig::default(),
        ..config(Arm::OnDemand, &[64, 128], 16, max_batch)
    }
}

fn with_store(fake: &std::sync::Arc<Fake>, config: EngineConfig, dir: &TempDir) -> Engine {
    let mut engine = engine(fake, config);
    engine.open_session_store(&dir.0, None).unwrap();
    engine
}

fn turn(
    engine: &mut Engine,
    pool: &ThreadPool,
    id: u64,
    prompt: &[u32],
    n: usize,
) -> pyramid_engine::Completion {
    let n_vocab = engine.pyramid().backend().model().config.n_vocab;
    let done = engine
        .generate(pool, Request::greedy(id, prompt.to_vec(), n), &mut |_| true)
        .unwrap();
    assert_eq!(done.tokens, expected(prompt, n, n_vocab), "request {id}");
    done
}

#[test]
fn a_conversation_saved_at_shutdown_resumes_in_a_new_engine_with_the_same_tokens() {
    let pool = ThreadPool::new(1).unwrap();
    // Natively and on a static route.
    for mixed in [true, false] {
        let dir = TempDir::new(&format!("restart-{mixed}"));
        let fake = Fake::new(Duration::ZERO, mixed);
        let first = prompt(1, 30);
        let mut engine = with_store(&fake, cfg(2), &dir);
        let reply = turn(&mut engine, &pool, 0, &first, 5);
        assert_eq!(engine.save_cached(), 1);
        drop(engine);

        let mut engine = with_store(&fake, cfg(2), &dir);
        assert!(engine.take_warnings().is_empty());
        let next = [first.clone(), reply.tokens.clone(), prompt(2, 7)].concat();
        let done = turn(&mut engine, &pool, 1, &next, 5);
        // Everything the first engine cached: the prompt and the reply but its last token.
        assert_eq!(done.usage.cached_tokens, 30 + 4, "mixed {mixed}");
        assert_eq!(
            done.usage.restored_tokens,
            30 + 4,
            "read back from the store"
        );
        let stats = engine.stats();
        assert_eq!(
            (stats.persisted.n_loaded, stats.persisted.loaded_tokens),
            (1, 34)
        );
    }
}

#[test]
fn files_of_another_model_or_corrupt_ones_are_skipped_with_a_warning() {
    let pool = ThreadPool::new(1).unwrap();
    let dir = TempDir::new("skip");
    let fake = Fake::new(Duration::ZERO, true);
    let first = prompt(3, 30);
    let mut engine = with_store(&fake, cfg(2), &dir);
    let reply = turn(&mut engine, &pool, 0, &first, 5);
    engine.save_cached();
    drop(engine);
    let next = [first.clone(), reply.tokens.clone(), prompt(4, 7)].concat();

    // Another model file (another id): the file is skipped when the directory is indexed.
    let mut other = Engine::new(fake.clone(), 2, KvType::F32, cfg(2)).unwrap();
    other.open_session_store(&dir.0, None).unwrap();
    let warnings = other.take_warnings();
    assert!(
        warnings.iter().any(|w| w.contains("another setup")),
        "{warnings:?}"
    );
    assert_eq!(turn(&mut other, &pool, 1, &next, 3).usage.cached_tokens, 0);
    // One process (here, one engine) holds the directory at a time.
    drop(other);

    // A flipped byte in the KV: the load fails its checksum, the request prefills.
    let file = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "pyrsession"))
        .unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 9;
    bytes[at] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let mut engine = with_store(&fake, cfg(2), &dir);
    let done = turn(&mut engine, &pool, 2, &next, 3);
    assert_eq!(done.usage.cached_tokens, 0);
    let warnings = engine.take_warnings();
    assert!(
        warnings.iter().any(|w| w.contains("corrupt")),
        "{warnings:?}"
    );
    assert_eq!(engine.stats().persisted.n_load_failed, 1);
}

#[test]
fn a_swapped_out_sequence_goes_to_disk_and_resumes_from_it_without_recomputing() {
    let pool = ThreadPool::new(1).unwrap();
    let dir = TempDir::new("swap");
    let fake = Fake::new(Duration::ZERO, true);
    let window = fake.model.new_kv_cache_of(64, KvType::F32).bytes();
    let mut config = cfg(2);
    config.kv_budget = 2 * window;
    config.pyramid.ladder = pyramid_runtime::WindowLadder::new(vec![64], 256).unwrap();
    let mut engine = with_store(&fake, config, &dir);
    let n_vocab = fake.model.config.n_vocab;
    let mut background = Request::greedy(0, prompt(5, 20), 30);
    background.priority = 5;
    let mut other = Request::greedy(1, prompt(6, 20), 30);
    other.priority = 5;
    engine.add_request(background.clone());
    engine.add_request(other.clone());
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); 4];
    let mut record = |events: Vec<pyramid_engine::Event>| {
        for e in events {
            match e {
                pyramid_engine::Event::Token { id, token, .. } => tokens[id as usize].push(token),
                pyramid_engine::Event::Failed { id, error } => panic!("{id}: {error}"),
                _ => {}
            }
        }
    };
    for _ in 0..4 {
        record(engine.step(&pool));
    }
    // An urgent request needs a window: one background sequence is paused and its KV
    // written to disk.
    let mut urgent = Request::greedy(2, prompt(7, 10), 4);
    urgent.priority = 0;
    engine.add_request(urgent.clone());
    record(engine.step(&pool));
    // The write runs on the session thread; waiting for it makes the resume read the
    // file (until it is written, the conversation resumes from memory).
    engine.flush_sessions();
    let stats = engine.stats();
    assert_eq!(stats.preemption.n_swapped_out, 1);
    assert_eq!(stats.persisted.n_saved, 1, "{stats:?}");
    assert_eq!(stats.persisted.pending_writes, 0);
    while engine.has_work() {
        record(engine.step(&pool));
    }
    for r in [&background, &other, &urgent] {
        assert_eq!(
            tokens[r.id as usize],
            expected(&r.prompt, r.max_tokens, n_vocab),
            "request {}",
            r.id
        );
    }
    let stats = engine.stats();
    assert_eq!(stats.persisted.n_loaded, 1);
    assert_eq!(stats.preemption.recomputed_tokens, 0, "resumed from disk");
}
