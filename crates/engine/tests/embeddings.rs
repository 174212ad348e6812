//! Embedding requests through the engine: batched with each other and with generation,
//! prefilled in chunks the scheduler picks, they give the vector one pass over the text
//! gives, bit for bit; they reuse no cached prefix and leave no KV behind; a static route
//! refuses them.

use std::sync::Arc;

use pyramid_engine::{Arm, Engine, EngineError, Event, Pooling, Request};
use pyramid_kernels::ThreadPool;
use pyramid_model::{KvType, LogitsFor, Model, Scratch, Segment};
use pyramid_runtime::CpuBackend;

mod common;

fn engine(model: &Arc<Model>, pool: &ThreadPool, chunk: usize, static_shapes: bool) -> Engine {
    let mut config = common::config(Arm::OnDemand, &[64, 128], chunk, 8);
    config.static_shapes = static_shapes;
    let backend = Arc::new(CpuBackend::new(Arc::clone(model), pool.n_threads()));
    Engine::new(backend, 3, KvType::F32, config).unwrap()
}

fn engine_alone(model: &Arc<Model>, pool: &ThreadPool) -> Engine {
    engine(model, pool, 64, false)
}

/// The embedding of `text` from one pass of the model alone.
fn one_pass(model: &Model, pool: &ThreadPool, text: &[u32], pooling: Pooling) -> Vec<f32> {
    let mut sum = vec![0.0f32; model.config.n_embd];
    let mut kv = model.new_kv_cache(128);
    let rows = pooling.rows(0, text.len(), text.len());
    model
        .forward_batch(
            pool,
            &mut [Segment::pooled(text, &mut kv, rows, &mut sum)],
            &mut Scratch::default(),
            LogitsFor::Last,
        )
        .unwrap();
    pooling.finish(sum, text.len())
}

#[test]
fn embeddings_batched_in_chunks_equal_one_pass_and_keep_no_kv() {
    let model = common::tiny();
    let pool = ThreadPool::new(2).unwrap();
    let texts: Vec<Vec<u32>> = [(1, 40), (2, 7), (3, 1), (4, 23)]
        .iter()
        .map(|&(seed, n)| common::prompt(seed, n))
        .collect();
    for pooling in Pooling::ALL {
        // Chunks of 16 shared by four texts and a reply being generated beside them.
        let mut engine = engine(&model, &pool, 16, false);
        engine.add_request(Request::greedy(100, common::prompt(9, 20), 12));
        for (id, text) in texts.iter().enumerate() {
            engine.add_request(Request::embedding(id as u64, text.clone(), pooling));
        }
        let (mut reply, mut embedded) = (Vec::new(), vec![Vec::new(); texts.len()]);
        while engine.has_work() {
            for event in engine.step(&pool) {
                match event {
                    Event::Token { token, .. } => reply.push(token),
                    Event::Embedding { id, embedding } => embedded[id as usize] = embedding,
                    Event::Failed { error, .. } => panic!("{error}"),
                    _ => {}
                }
            }
        }
        let mut alone = engine_alone(&model, &pool);
        let expected = alone.generate(
            &pool,
            Request::greedy(1, common::prompt(9, 20), 12),
            &mut |_| true,
        );
        assert_eq!(
            reply,
            expected.unwrap().tokens,
            "the reply is the same beside embeddings"
        );
        for (text, vector) in texts.iter().zip(&embedded) {
            assert_eq!(
                vector,
                &one_pass(&model, &pool, text, pooling),
                "{pooling:?}"
            );
            let norm: f32 = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "unit length, not {norm}");
        }
        // Only the generated reply's conversation is cached.
        assert_eq!(engine.stats().cached_sessions, 1);
        // A text the cache holds a prefix of is prefilled whole all the same.
        let mut conversation = common::prompt(9, 20);
        conversation.extend_from_slice(&reply);
        let again = engine.embed(&pool, 10, vec![conversation.clone()], pooling);
        assert_eq!(
            again.unwrap()[0],
            one_pass(&model, &pool, &conversation, pooling)
        );
        assert_eq!(engine.stats().cached_sessions, 1);
    }
    // The first pooling differs from the last: the rows chosen matter.
    let text = &texts[0];
    assert_ne!(
        one_pass(&model, &pool, text, Pooling::Mean),
        one_pass(&model, &pool, text, Pooling::Last)
    );
}

#[test]
fn an_embedding_reports_its_prompt_and_no_cached_tokens() {
    let model = common::tiny();
    let pool = ThreadPool::new(1).unwrap();
    let mut engine = engine(&model, &pool, 64, false);
    let text = common::prompt(5, 30);
    engine.add_request(Request::greedy(1, text.clone(), 3));
    common::drain(&mut engine, &pool);
    engine.add_request(Request::embedding(2, text, Pooling::Mean));
    let mut events = Vec::new();
    while engine.has_work() {
        events.extend(engine.step(&pool));
    }
    let finished = events.iter().find_map(|e| match e {
        Event::Finished { usage, .. } => Some(*usage),
        _ => None,
    });
    let usage = finished.expect("the embedding finished");
    assert_eq!((usage.prompt_tokens, usage.cached_tokens), (30, 0));
    assert_eq!(usage.completion_tokens, 0);
    assert!(events.iter().any(|e| matches!(e, Event::Embedding { .. })));
}

#[test]
fn a_static_route_refuses_embeddings_by_name() {
    let model = common::tiny();
    let pool = ThreadPool::new(1).unwrap();
    let mut engine = engine(&model, &pool, 16, true);
    let err = engine
        .embed(&pool, 0, vec![common::prompt(1, 5)], Pooling::Mean)
        .unwrap_err();
    assert!(matches!(err, EngineError::BadRequest(_)), "{err}");
    assert!(err.to_string().contains("native route"), "{err}");
}
