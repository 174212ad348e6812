//! Priorities on the fake backend of `common`: admission order, batch slots and the
//! prefill chunk by priority, pausing and resuming (with the KV kept, or swapped out and
//! recomputed) with identical tokens, aging, and the order in which the KV budget frees
//! memory.

mod common;

use std::time::Duration;

use common::*;
use pyramid_engine::{Arm, Engine, EngineConfig, Event, FinishReason, Request, RequestId};
use pyramid_kernels::ThreadPool;
use pyramid_model::KvType;

fn request(id: RequestId, seed: u32, n_prompt: usize, n_gen: usize, priority: i32) -> Request {
    let mut r = Request::greedy(id, prompt(seed, n_prompt), n_gen);
    r.priority = priority;
    r
}

/// A config without aging unless a test asks for it, so that orders are exact.
fn strict(windows: &[usize], chunk: usize, max_batch: usize) -> EngineConfig {
    EngineConfig {
        aging: Duration::ZERO,
        speculative: pyramid_engine::SpeculativeConfig::default(),
        ..config(Arm::OnDemand, windows, chunk, max_batch)
    }
}

/// Every request's tokens and the order they finished in, over all steps.
#[derive(Default)]
struct Record {
    tokens: Vec<(RequestId, Vec<u32>)>,
    finished: Vec<RequestId>,
}

impl Record {
    fn step(&mut self, engine: &mut Engine, pool: &ThreadPool) -> Vec<Event> {
        let events = engine.step(pool);
        for event in &events {
            match event {
                Event::Token { id, token, .. } => {
                    match self.tokens.iter_mut().find(|t| t.0 == *id) {
                        Some(t) => t.1.push(*token),
                        None => self.tokens.push((*id, vec![*token])),
                    }
                }
                Event::Finished { id, .. } => self.finished.push(*id),
                Event::Failed { id, error } => panic!("request {id} failed: {error}"),
                Event::Started { .. } | Event::Embedding { .. } => {}
            }
        }
        events
    }

    /// Steps until every request ended and checks each one's tokens against the fake
    /// model's; returns the ids in the order they finished.
    fn drain(
        &mut self,
        engine: &mut Engine,
        pool: &ThreadPool,
        requests: &[Request],
    ) -> Vec<RequestId> {
        let n_vocab = engine.pyramid().backend().model().config.n_vocab;
        for _ in 0..10_000 {
            if !engine.has_work() {
                break;
            }
            self.step(engine, pool);
        }
        assert!(!engine.has_work(), "the engine did not finish");
        for r in requests {
            let got = &self.tokens.iter().find(|t| t.0 == r.id).expect("tokens").1;
            assert_eq!(
                got,
                &expected(&r.prompt, r.max_tokens, n_vocab),
                "request {}",
                r.id
            );
        }
        self.finished
            .iter()
            .copied()
            .filter(|id| requests.iter().any(|r| r.id == *id))
            .collect()
    }
}

fn started(events: &[Event]) -> Vec<RequestId> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Started { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn the_queue_is_admitted_most_urgent_first_and_in_arrival_order_within_a_priority() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let mut rec = Record::default();
    let mut engine = engine(&fake, strict(&[64, 128], 16, 1));
    let first = request(0, 0, 8, 3, 0);
    engine.add_request(first.clone());
    rec.step(&mut engine, &pool);
    // Arriving while 0 runs, at equal urgency with it or below: none pauses it.
    let queued = [
        request(1, 1, 8, 3, 5),
        request(2, 2, 8, 3, 1),
        request(3, 3, 8, 3, 5),
        request(4, 4, 8, 3, 0),
    ];
    for r in &queued {
        engine.add_request(r.clone());
    }
    let all: Vec<Request> = [vec![first], queued.to_vec()].concat();
    let order = rec.drain(&mut engine, &pool, &all);
    assert_eq!(order, [0, 4, 2, 1, 3]);
    assert_eq!(engine.stats().preemption.n_paused, 0);
}

#[test]
fn an_urgent_request_pauses_a_background_one_which_resumes_with_its_kv() {
    let pool = ThreadPool::new(1).unwrap();
    // Natively (mixed passes) and on a static route.
    for mixed in [true, false] {
        let fake = Fake::new(Duration::ZERO, mixed);
        let mut rec = Record::default();
        let mut engine = engine(&fake, strict(&[64, 128], 16, 2));
        let background = [request(0, 0, 20, 30, 10), request(1, 1, 20, 30, 10)];
        for r in &background {
            engine.add_request(r.clone());
        }
        for _ in 0..5 {
            rec.step(&mut engine, &pool);
        }
        let urgent = request(2, 2, 12, 4, 0);
        engine.add_request(urgent.clone());
        let s = engine.schedule();
        assert_eq!(s.prefills, [(2, 12)], "the urgent prompt runs at once");
        let decoding: Vec<RequestId> = s.decodes.iter().flat_map(|d| d.ids.clone()).collect();
        assert_eq!(
            decoding,
            [1],
            "the background request running longest is paused"
        );
        let stats = engine.stats();
        assert_eq!((stats.running, stats.paused), (2, 1));
        assert!(stats.kv_bytes_reserved > 0);
        let all = [background.to_vec(), vec![urgent]].concat();
        let order = rec.drain(&mut engine, &pool, &all);
        assert_eq!(order[0], 2, "the urgent request finishes first");
        let p = engine.stats().preemption;
        assert_eq!((p.n_paused, p.n_resumed), (1, 1));
        assert_eq!(
            (p.n_swapped_out, p.recomputed_tokens),
            (0, 0),
            "nothing recomputed"
        );
    }
}

#[test]
fn the_prefill_chunk_goes_to_the_most_urgent_prompt_first() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let mut rec = Record::default();
    let mut engine = engine(&fake, strict(&[64, 128], 8, 4));
    engine.add_request(request(0, 0, 30, 2, 3));
    rec.step(&mut engine, &pool);
    engine.add_request(request(1, 1, 30, 2, 1));
    let s = engine.schedule();
    assert_eq!(
        s.prefills,
        [(1, 8)],
        "the urgent prompt takes the whole chunk"
    );
    engine.add_request(request(2, 2, 30, 2, 1));
    rec.step(&mut engine, &pool);
    let s = engine.schedule();
    assert_eq!(
        s.prefills,
        [(1, 4), (2, 4)],
        "one priority shares the chunk; the less urgent 0 gets none"
    );
}

#[test]
fn aging_lets_a_background_request_run_under_a_steady_stream_of_urgent_ones() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let run = |aging: Duration| {
        let mut cfg = strict(&[64, 128], 16, 1);
        cfg.aging = aging;
        let mut engine = engine(&fake, cfg);
        engine.add_request(request(0, 0, 8, 2, 0));
        engine.add_request(request(1, 1, 8, 2, 3));
        let mut next = 2;
        let mut background_done = false;
        for _ in 0..400 {
            for event in engine.step(&pool) {
                if let Event::Finished { id, .. } = event {
                    if id == 1 {
                        background_done = true;
                    } else {
                        // Another urgent turn arrives as soon as one ends.
                        engine.add_request(request(next, next as u32, 8, 2, 0));
                        next += 1;
                    }
                }
            }
            if background_done {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        background_done
    };
    assert!(!run(Duration::ZERO), "without aging it starves");
    assert!(run(Duration::from_millis(20)), "aging lets it run");
}

#[test]
fn memory_comes_from_cached_sessions_then_paused_then_less_urgent_running_ones() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let window = fake.model.new_kv_cache_of(64, KvType::F32).bytes();
    let mut cfg = strict(&[64], 16, 3);
    cfg.kv_budget = 3 * window;
    let mut rec = Record::default();
    let mut engine = engine(&fake, cfg);
    // A finished conversation stays cached.
    let cached = request(0, 0, 10, 2, 0);
    engine.add_request(cached.clone());
    rec.drain(&mut engine, &pool, &[cached]);
    assert_eq!(engine.stats().cached_sessions, 1);
    // Three background sequences would fill the budget with the cached session: it goes.
    let background: Vec<Request> = (1..=3).map(|i| request(i, i as u32, 10, 40, 5)).collect();
    for r in &background {
        engine.add_request(r.clone());
    }
    rec.step(&mut engine, &pool);
    let stats = engine.stats();
    assert_eq!((stats.running, stats.cached_sessions), (3, 0));
    rec.step(&mut engine, &pool);
    // An urgent request needs a slot and a window: memory is full and nothing is cached
    // or paused, so a background sequence is paused and swapped out, which also frees
    // the slot.
    let urgent = request(4, 4, 10, 3, 0);
    engine.add_request(urgent.clone());
    rec.step(&mut engine, &pool);
    let stats = engine.stats();
    assert_eq!((stats.running, stats.paused), (3, 1));
    assert_eq!(stats.preemption.n_swapped_out, 1);
    assert!(stats.kv_bytes_reserved <= 3 * window);
    // Another urgent one: the paused sequence holds no memory any more, so another
    // running background sequence is paused and swapped out.
    let second = request(5, 5, 10, 3, 0);
    engine.add_request(second.clone());
    rec.step(&mut engine, &pool);
    let stats = engine.stats();
    assert_eq!(stats.preemption.n_swapped_out, 2);
    assert!(stats.kv_bytes_reserved <= 3 * window);
    let all = [background, vec![urgent, second]].concat();
    let order = rec.drain(&mut engine, &pool, &all);
    assert_eq!(&order[..2], [4, 5], "the urgent ones finish first");
    let p = engine.stats().preemption;
    assert_eq!(p.n_resumed, 2);
    assert!(
        p.recomputed_tokens >= 10,
        "swapped out and evicted sessions are prefilled again: {p:?}"
    );
}

#[test]
fn a_request_that_can_never_fit_fails_at_once_even_behind_a_queue() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let window = fake.model.new_kv_cache_of(64, KvType::F32).bytes();
    let mut cfg = strict(&[64, 128], 16, 1);
    cfg.kv_budget = window + window / 2;
    let mut engine = engine(&fake, cfg);
    engine.add_request(request(0, 0, 10, 50, 0));
    engine.add_request(request(1, 1, 10, 50, 0));
    engine.step(&pool);
    // 100 tokens need the 128 window: twice the 64 window's bytes.
    engine.add_request(request(2, 2, 100, 4, 0));
    let events = engine.step(&pool);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Failed { id: 2, error }
            if error.to_string().contains("budget"))),
        "{events:?}"
    );
    assert!(!started(&events).contains(&2));
}

#[test]
fn a_paused_sequence_gives_its_memory_up_before_a_running_one_is_paused() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let window = fake.model.new_kv_cache_of(64, KvType::F32).bytes();
    let mut cfg = strict(&[64], 16, 2);
    cfg.kv_budget = 3 * window;
    let mut rec = Record::default();
    let mut engine = engine(&fake, cfg);
    let background = [request(0, 0, 10, 40, 5), request(1, 1, 10, 40, 5)];
    for r in &background {
        engine.add_request(r.clone());
    }
    rec.step(&mut engine, &pool);
    rec.step(&mut engine, &pool);
    // The batch is full: the first urgent request pauses background 0, which keeps its
    // KV (three windows fit).
    let first = request(2, 2, 10, 30, 0);
    engine.add_request(first.clone());
    rec.step(&mut engine, &pool);
    let stats = engine.stats();
    assert_eq!((stats.paused, stats.preemption.n_swapped_out), (1, 0));
    // The second needs background 1's slot and a fourth window: the paused sequence's
    // memory goes first, and background 1 is paused with its KV.
    let second = request(3, 3, 10, 3, 0);
    engine.add_request(second.clone());
    rec.step(&mut engine, &pool);
    let stats = engine.stats();
    assert_eq!((stats.running, stats.paused), (2, 2));
    assert_eq!(stats.preemption.n_swapped_out, 1);
    assert_eq!(stats.kv_bytes_reserved, 3 * window);
    let all = [background.to_vec(), vec![first, second]].concat();
    rec.drain(&mut engine, &pool, &all);
    let p = engine.stats().preemption;
    assert_eq!((p.n_paused, p.n_resumed, p.n_swapped_out), (2, 2, 1));
}

/// Two conversations on the small window both grow past it, under a budget that holds
/// one larger window: one is swapped out and the other grows and finishes; then the
/// first resumes. Nobody gets a 400 that blames the request.
#[test]
fn two_conversations_growing_under_a_budget_for_one_larger_window_both_finish() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let n_vocab = fake.model.config.n_vocab;
    let large = fake.model.new_kv_cache_of(128, KvType::F32).bytes();
    let mut config = config(Arm::OnDemand, &[64, 128], 16, 4);
    config.kv_budget = large;
    let mut engine = engine(&fake, config);
    let a = Request::greedy(0, prompt(1, 40), 60);
    let b = Request::greedy(1, prompt(2, 40), 60);
    engine.add_request(a.clone());
    engine.add_request(b.clone());
    let done = drain(&mut engine, &pool);
    assert_eq!(done.len(), 2, "{done:?}");
    for (r, (id, tokens, reason)) in [&a, &b].into_iter().zip(&done) {
        assert_eq!(*id, r.id);
        assert_eq!(*reason, FinishReason::Length);
        assert_eq!(
            tokens,
            &expected(&r.prompt, r.max_tokens, n_vocab),
            "request {id}"
        );
    }
    assert!(engine.stats().preemption.n_swapped_out >= 1);
}
