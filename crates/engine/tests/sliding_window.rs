//! Sessions of a model with sliding-window layers (a tiny Gemma 3, windows of 8): their
//! caches give back old rows between steps, yet every reply equals a fresh engine's; a
//! conversation extended from its end reuses its cache, and a prompt sharing only an early
//! prefix (from where the released rows would be read) is prefilled again, not served from
//! zeros.

use std::collections::HashMap;
use std::sync::Arc;

use pyramid_engine::{Arm, Engine, Event, Request, RequestId, Usage};
use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, KvType, Model};
use pyramid_runtime::{CpuBackend, WindowLadder};

mod common;

fn gemma() -> Arc<Model> {
    let spec = SyntheticSpec {
        n_ctx: 2048,
        ..SyntheticSpec::tiny(Architecture::Gemma3)
    };
    let bytes = synthetic_gguf(&spec).unwrap().to_bytes();
    Arc::new(Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap())
}

fn engine(model: &Arc<Model>, pool: &ThreadPool) -> Engine {
    let mut config = common::config(Arm::OnDemand, &[256], 128, 2);
    config.pyramid.ladder = WindowLadder::new(vec![1024, 2048], 2048).unwrap();
    let backend = Arc::new(CpuBackend::new(Arc::clone(model), pool.n_threads()));
    Engine::new(backend, 7, KvType::F32, config).unwrap()
}

/// Runs one request to its end: its tokens and usage.
fn run(engine: &mut Engine, pool: &ThreadPool, request: Request) -> (Vec<u32>, Usage) {
    let id = request.id;
    engine.add_request(request);
    let mut tokens: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut usage = None;
    while engine.has_work() {
        for event in engine.step(pool) {
            match event {
                Event::Token { id, token, .. } => tokens.entry(id).or_default().push(token),
                Event::Finished { usage: u, .. } => usage = Some(u),
                Event::Failed { id, error } => panic!("request {id} failed: {error}"),
                Event::Started { .. } | Event::Embedding { .. } => {}
            }
        }
    }
    (
        tokens.remove(&id).unwrap_or_default(),
        usage.expect("finished"),
    )
}

fn fresh(model: &Arc<Model>, pool: &ThreadPool, prompt: &[u32], n: usize) -> Vec<u32> {
    run(
        &mut engine(model, pool),
        pool,
        Request::greedy(0, prompt.to_vec(), n),
    )
    .0
}

#[test]
fn released_rows_never_serve_a_reply() {
    let pool = ThreadPool::new(2).unwrap();
    let model = gemma();
    let first = common::prompt(3, 900);
    let mut e = engine(&model, &pool);
    let (reply, _) = run(&mut e, &pool, Request::greedy(1, first.clone(), 40));
    assert_eq!(reply, fresh(&model, &pool, &first, 40));
    // The running session gave back its local layers' old rows.
    let stats = e.stats();
    let held = stats.kv_bytes_used;
    let cfg = &model.config;
    let position_bytes = 2 * cfg.kv_dim() * 4;
    let every_row = (first.len() + 40) * cfg.n_layer * position_bytes;
    let n_local = (0..cfg.n_layer)
        .filter(|&l| cfg.layer_window(l).is_some())
        .count();
    // Its five local layers gave back at least the positions before 512.
    assert!(
        held <= every_row - 512 * n_local * position_bytes,
        "{held} of {every_row} bytes held"
    );

    // The conversation goes on from its end: its cache is reused.
    let mut next = first.clone();
    next.extend(&reply);
    next.extend(common::prompt(4, 30));
    let (more, usage) = run(&mut e, &pool, Request::greedy(2, next.clone(), 20));
    assert!(usage.cached_tokens > first.len(), "{usage:?}");
    assert_eq!(more, fresh(&model, &pool, &next, 20));

    // A prompt sharing only the first 100 tokens cannot go on from there: prefilled anew.
    let mut other = first[..100].to_vec();
    other.extend(common::prompt(5, 50));
    let (diverged, usage) = run(&mut e, &pool, Request::greedy(3, other.clone(), 20));
    assert_eq!(usage.cached_tokens, 0);
    assert_eq!(diverged, fresh(&model, &pool, &other, 20));
}

#[test]
fn a_conversation_longer_than_its_local_windows_is_saved_and_resumed() {
    let pool = ThreadPool::new(2).unwrap();
    let model = gemma();
    let dir = std::env::temp_dir().join(format!("pyramid-gemma-sessions-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let first = common::prompt(6, 900);
    let mut e = engine(&model, &pool);
    e.open_session_store(&dir, None).unwrap();
    let (reply, _) = run(&mut e, &pool, Request::greedy(1, first.clone(), 40));
    // Its local layers gave back rows before it was saved.
    assert!(
        e.stats().kv_bytes_used < e.stats().kv_bytes_reserved,
        "{:?}",
        e.stats()
    );
    assert_eq!(e.save_cached(), 1);
    assert!(e.take_warnings().is_empty());
    drop(e);

    let mut e = engine(&model, &pool);
    e.open_session_store(&dir, None).unwrap();
    assert!(e.take_warnings().is_empty());
    let next = [first.clone(), reply, common::prompt(7, 30)].concat();
    let (more, usage) = run(&mut e, &pool, Request::greedy(2, next.clone(), 20));
    assert!(e.take_warnings().is_empty());
    assert!(usage.cached_tokens > first.len(), "{usage:?}");
    assert_eq!(more, fresh(&model, &pool, &next, 20));
    let _ = std::fs::remove_dir_all(&dir);
}
