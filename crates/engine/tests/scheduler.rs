//! The engine core on a fake backend, without HTTP and without running a model: admission,
//! the prefill chunk budget, batching by window, migration and its order, predictive
//! compile timing, the KV budget and aborts.
//!
//! On the fake backend of `common`, whose tokens come out right only if the cache holds
//! exactly each sequence's history.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use pyramid_engine::{Arm, Engine, Event, FinishReason, Move, Request, RequestId};
use pyramid_kernels::ThreadPool;
use pyramid_model::KvType;
use pyramid_runtime::ArtifactShape;

#[test]
fn admission_waits_for_room_in_the_batch_and_results_do_not_depend_on_it() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let n_vocab = fake.model.config.n_vocab;
    let mut engine = engine(&fake, config(Arm::OnDemand, &[32, 64, 128], 16, 2));
    for id in 0..3 {
        engine.add_request(Request::greedy(id, prompt(id as u32, 10), 6));
    }
    let s = engine.schedule();
    let admitted: Vec<RequestId> = s.prefills.iter().map(|p| p.0).collect();
    assert_eq!(admitted, [0, 1], "two fit the batch, the third waits");
    assert_eq!(engine.n_waiting(), 1);
    let done = drain(&mut engine, &pool);
    for (id, tokens, reason) in &done {
        assert_eq!(*reason, FinishReason::Length);
        assert_eq!(
            tokens,
            &expected(&prompt(*id as u32, 10), 6, n_vocab),
            "request {id}"
        );
    }
    assert_eq!(done.len(), 3);
}

#[test]
fn prompts_share_the_chunk_budget_while_others_decode() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let mut engine = engine(&fake, config(Arm::OnDemand, &[64, 128], 8, 4));
    engine.add_request(Request::greedy(0, prompt(0, 3), 20));
    engine.step(&pool); // 0 prefilled and sampled its first token
    engine.add_request(Request::greedy(1, prompt(1, 20), 2));
    engine.add_request(Request::greedy(2, prompt(2, 20), 2));
    let s = engine.schedule();
    assert_eq!(
        s.prefills,
        [(1, 4), (2, 4)],
        "prompts of one priority share the budget"
    );
    assert_eq!(s.decodes.len(), 1);
    assert_eq!(
        s.decodes[0].ids,
        [0],
        "the decoding sequence runs alongside"
    );
    engine.step(&pool);
    engine.step(&pool);
    engine.step(&pool);
    engine.step(&pool);
    // 16 of each are in; 1 and 2 need 4 more: a short prompt arriving now gets its part.
    engine.add_request(Request::greedy(3, prompt(3, 3), 2));
    let s = engine.schedule();
    assert_eq!(
        s.prefills,
        [(1, 4), (2, 2), (3, 2)],
        "an equal part each, what is left in arrival order"
    );
    engine.step(&pool);
    let s = engine.schedule();
    assert_eq!(s.prefills, [(2, 2), (3, 1)], "1 is in and decodes");
}

#[test]
fn a_short_prompt_behind_a_long_one_of_its_priority_starts_within_a_few_steps() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let mut engine = engine(&fake, config(Arm::OnDemand, &[256], 16, 4));
    engine.add_request(Request::greedy(0, prompt(0, 200), 2));
    engine.step(&pool);
    engine.add_request(Request::greedy(1, prompt(1, 10), 2));
    let mut steps = 0;
    loop {
        steps += 1;
        let events = engine.step(&pool);
        if events
            .iter()
            .any(|e| matches!(e, pyramid_engine::Event::Token { id: 1, .. }))
        {
            break;
        }
        assert!(steps < 10, "the short prompt waits behind the long one");
    }
    assert!(
        steps <= 2,
        "{steps} steps to the short prompt's first token"
    );
}

#[test]
fn static_decode_runs_are_grouped_by_window_and_batch_sizes_compile_in_the_background() {
    let pool = ThreadPool::new(1).unwrap();
    // Compiles take long enough that one started in a step is still running when the
    // next schedule is made (an instant compile could finish in between, at random).
    let fake = Fake::new(Duration::from_millis(50), false);
    let n_vocab = fake.model.config.n_vocab;
    let mut engine = engine(&fake, config(Arm::OnDemand, &[32, 64], 64, 4));
    // Two short conversations on window 32, one on 64.
    engine.add_request(Request::greedy(0, prompt(0, 5), 12));
    engine.add_request(Request::greedy(1, prompt(1, 6), 12));
    engine.add_request(Request::greedy(2, prompt(2, 40), 12));
    engine.step(&pool); // 0 and 1 prefilled; 2 waits for window 64's compile
    engine.pyramid().join_background();
    engine.step(&pool); // 2 prefilled
    let s = engine.schedule();
    let mut by_window: Vec<(usize, Vec<RequestId>)> = s
        .decodes
        .iter()
        .map(|d| (d.window, d.ids.clone()))
        .collect();
    by_window.sort();
    // Batch 2 on window 32 is not compiled yet: two runs of one, and a compile of it.
    assert_eq!(by_window, [(32, vec![0]), (32, vec![1]), (64, vec![2])]);
    assert!(s.compiles.contains(&ArtifactShape::Decode {
        batch: 2,
        window: 32
    }));
    engine.step(&pool);
    engine.pyramid().join_background();
    fake.runs();
    engine.step(&pool);
    let runs = fake.runs();
    assert!(
        runs.contains(&(
            ArtifactShape::Decode {
                batch: 2,
                window: 32
            },
            2
        )),
        "once compiled, both sequences on window 32 decode in one run: {runs:?}"
    );
    for (id, tokens, _) in drain(&mut engine, &pool) {
        // The steps above took the first few tokens; the rest follow them exactly.
        let all = expected(&prompt(id as u32, [5, 6, 40][id as usize]), 12, n_vocab);
        assert!(!tokens.is_empty());
        assert_eq!(tokens, all[12 - tokens.len()..], "request {id}");
    }
}

#[test]
fn a_crossing_migrates_before_the_run_and_waits_for_its_artifacts() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::from_millis(30), false);
    let n_vocab = fake.model.config.n_vocab;
    let mut engine = engine(&fake, config(Arm::OnDemand, &[16, 32, 64], 64, 2));
    engine.add_request(Request::greedy(0, prompt(0, 10), 30));
    let mut moves = Vec::new();
    let mut stalled_windows = Vec::new();
    let mut tokens = Vec::new();
    while engine.has_work() {
        let s = engine.schedule();
        moves.extend(s.moves.iter().map(|m| (m.1, m.2)));
        stalled_windows.extend(s.stalled.iter().map(|st| st.1));
        for e in engine.step(&pool) {
            if let Event::Token { token, .. } = e {
                tokens.push(token);
            }
        }
    }
    // On demand every window waits for its compile: the first, then each crossing
    // (the engine waits inside the step, so the moves themselves happen there).
    stalled_windows.dedup();
    assert_eq!(stalled_windows, [16, 32, 64]);
    assert!(
        moves.is_empty(),
        "nothing moves before its artifacts exist: {moves:?}"
    );
    let stats = engine.stats().pyramid;
    assert_eq!(stats.n_migrations, 2);
    assert!(stats.n_stalls >= 1 && stats.stall_ms > 0.0, "{stats:?}");
    assert_eq!(tokens, expected(&prompt(0, 10), 30, n_vocab));
}

/// Caches reserve their largest window, so moving up copies nothing.
#[test]
fn without_artifacts_to_wait_for_a_session_moves_up_the_ladder_in_order() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let n_vocab = fake.model.config.n_vocab;
    let mut engine = engine(&fake, config(Arm::OnDemand, &[16, 32, 64], 64, 2));
    engine.add_request(Request::greedy(0, prompt(0, 10), 30));
    let mut moves = Vec::new();
    let mut tokens = Vec::new();
    while engine.has_work() {
        let s = engine.schedule();
        assert!(s.stalled.is_empty());
        moves.extend(s.moves.iter().map(|m| (m.1, m.2)));
        for e in engine.step(&pool) {
            if let Event::Token { token, .. } = e {
                tokens.push(token);
            }
        }
    }
    assert_eq!(
        moves,
        [(16, Move::First), (32, Move::Migrate), (64, Move::Migrate)]
    );
    let stats = engine.stats().pyramid;
    assert_eq!(stats.n_stalls, 0);
    assert!(stats.migration_live_bytes > 0);
    assert_eq!(stats.migration_bytes, 0, "reserved caches grow in place");
    assert_eq!(stats.migration_gb_per_s(), None);
    assert_eq!(tokens, expected(&prompt(0, 10), 30, n_vocab));
    // A second conversation on the same engine is untouched by the first.
    let other = prompt(7, 12);
    let done = engine
        .generate(&pool, Request::greedy(1, other.clone(), 30), &mut |_| true)
        .unwrap();
    assert_eq!(done.tokens, expected(&other, 30, n_vocab), "second");
}

#[test]
fn predictive_compiles_the_next_window_before_the_crossing() {
    let pool = ThreadPool::new(1).unwrap();
    // Each turn adds 20 tokens; a compile takes 20 ms.
    let turns = |arm: Arm| {
        let fake = Fake::new(Duration::from_millis(20), false);
        let mut engine = engine(&fake, config(arm, &[32, 64, 128, 256], 64, 1));
        let mut context = Vec::new();
        for turn in 0..8u32 {
            context.extend(prompt(turn, 10));
            let request = Request::greedy(u64::from(turn), context.clone(), 10);
            let done = engine.generate(&pool, request, &mut |_| true).unwrap();
            context.extend(done.tokens);
            // The agent's own work between turns.
            std::thread::sleep(Duration::from_millis(30));
        }
        (engine.stats().pyramid, context)
    };
    let (predictive, tokens_p) = turns(Arm::Predictive);
    let (on_demand, tokens_o) = turns(Arm::OnDemand);
    assert_eq!(tokens_p, tokens_o);
    assert!(predictive.n_migrations >= 2, "{predictive:?}");
    assert_eq!(predictive.n_stalls, 0, "{predictive:?}");
    assert!(on_demand.n_stalls >= 2, "{on_demand:?}");
    assert_eq!(predictive.n_migrations, on_demand.n_migrations);
    // A static route's caches reserve their largest window too: no crossing copies.
    assert_eq!(predictive.migration_bytes, 0, "{predictive:?}");
    assert!(predictive.migration_live_bytes > 0, "{predictive:?}");
}

#[test]
fn the_kv_budget_holds_running_work_and_queues_what_does_not_fit() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let model = Arc::clone(&fake.model);
    let window_bytes = model.new_kv_cache_of(64, KvType::F32).bytes();
    let mut cfg = config(Arm::OnDemand, &[64, 128], 64, 4);
    // Room for one 64-position session, not two.
    cfg.kv_budget = window_bytes * 3 / 2;
    let mut engine = engine(&fake, cfg);
    engine.add_request(Request::greedy(0, prompt(0, 10), 4));
    engine.add_request(Request::greedy(1, prompt(1, 10), 4));
    let events = engine.step(&pool);
    let started = events
        .iter()
        .filter(|e| matches!(e, Event::Started { .. }))
        .count();
    assert_eq!(started, 1, "the second waits in the queue");
    assert!(engine.stats().kv_bytes_reserved <= window_bytes * 3 / 2);
    let done = drain(&mut engine, &pool);
    assert_eq!(done.len(), 2, "it runs once the first is done");
    assert!(engine.stats().kv_bytes_reserved <= window_bytes * 3 / 2);

    // A request needing more than the whole budget fails instead of waiting forever.
    let mut engine = {
        let mut cfg = config(Arm::OnDemand, &[64, 128], 64, 4);
        cfg.kv_budget = window_bytes / 2;
        Engine::new(fake.clone(), 1, KvType::F32, cfg).unwrap()
    };
    engine.add_request(Request::greedy(7, prompt(0, 10), 4));
    let events = engine.step(&pool);
    assert!(
        events.iter().any(
            |e| matches!(e, Event::Failed { id: 7, error } if error.to_string().contains("budget"))
        ),
        "{events:?}"
    );
}

#[test]
fn an_aborted_request_keeps_its_session_for_the_next_one() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let mut engine = engine(&fake, config(Arm::OnDemand, &[64, 128], 64, 4));
    let p = prompt(3, 20);
    engine.add_request(Request::greedy(0, p.clone(), 50));
    engine.add_request(Request::greedy(1, prompt(4, 5), 50));
    engine.step(&pool);
    engine.step(&pool);
    let usage = engine.abort(0).unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (20, 2));
    assert!(engine.abort(0).is_none(), "aborted once");
    // Aborting a queued request removes it.
    engine.add_request(Request::greedy(2, prompt(5, 5), 5));
    assert!(engine.abort(2).is_some());
    assert_eq!(engine.n_waiting(), 0);
    engine.abort(1);
    // The aborted conversation's prefix is reused.
    let mut longer = p.clone();
    longer.extend([1, 2, 3]);
    let done = engine
        .generate(&pool, Request::greedy(3, longer, 1), &mut |_| true)
        .unwrap();
    assert_eq!(done.usage.cached_tokens, 20);
}

#[test]
fn stop_tokens_end_a_request_and_are_its_last_token() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, true);
    let n_vocab = fake.model.config.n_vocab;
    let p = prompt(9, 8);
    let tokens = expected(&p, 5, n_vocab);
    let mut engine = engine(&fake, config(Arm::OnDemand, &[64], 64, 1));
    let mut request = Request::greedy(0, p, 100);
    request.stop_tokens = vec![tokens[3]];
    let done = engine.generate(&pool, request, &mut |_| true).unwrap();
    let stop_at = tokens.iter().position(|&t| t == tokens[3]).unwrap();
    assert_eq!(done.finish_reason, FinishReason::Stop);
    assert_eq!(done.tokens, tokens[..=stop_at]);
}

#[test]
fn a_fork_of_a_long_conversation_runs_on_the_small_window_it_needs() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, false);
    let n_vocab = fake.model.config.n_vocab;
    let mut engine = engine(&fake, config(Arm::OnDemand, &[64, 128], 16, 4));
    let mut turn = |id: RequestId, p: &[u32]| {
        let done = engine
            .generate(&pool, Request::greedy(id, p.to_vec(), 4), &mut |_| true)
            .unwrap();
        assert_eq!(done.tokens, expected(p, 4, n_vocab), "request {id}");
        done
    };
    // A short request compiles the small window; a long conversation takes the large one.
    turn(0, &prompt(5, 10));
    let system = prompt(9, 24);
    turn(1, &[system.clone(), prompt(1, 80)].concat());
    fake.runs();
    // An agent sharing only the system prompt forks it onto the small window, whose
    // artifacts it takes when it first runs.
    let b = turn(2, &[system, prompt(2, 6)].concat());
    assert_eq!(b.usage.cached_tokens, 24);
    let windows: Vec<usize> = fake.runs().iter().map(|(s, _)| s.window()).collect();
    assert!(!windows.is_empty());
    assert!(windows.iter().all(|&w| w == 64), "ran on {windows:?}");
}

#[test]
fn a_full_largest_window_ends_generation_with_length() {
    let pool = ThreadPool::new(1).unwrap();
    let fake = Fake::new(Duration::ZERO, false);
    let mut engine = engine(&fake, config(Arm::OnDemand, &[16, 32], 8, 1));
    let done = engine
        .generate(&pool, Request::greedy(0, prompt(0, 20), 100), &mut |_| true)
        .unwrap();
    assert_eq!(done.finish_reason, FinishReason::Length);
    // 20 prompt tokens and 12 decoded fill 32 positions; the 13th token is sampled last.
    assert_eq!(done.tokens.len(), 13);
}

#[test]
fn a_prompt_sharing_only_a_prefix_forks_the_cached_conversation_and_leaves_it_whole() {
    let pool = ThreadPool::new(1).unwrap();
    // Natively (mixed passes) and on a static route.
    for mixed in [true, false] {
        let fake = Fake::new(Duration::ZERO, mixed);
        let n_vocab = fake.model.config.n_vocab;
        let mut engine = engine(&fake, config(Arm::OnDemand, &[64, 128], 16, 4));
        let system = prompt(9, 24);
        let agent = |k: u32| [system.clone(), prompt(k, 6)].concat();
        let turn = |engine: &mut Engine, id: RequestId, p: &[u32]| {
            let done = engine
                .generate(&pool, Request::greedy(id, p.to_vec(), 4), &mut |_| true)
                .unwrap();
            assert_eq!(done.tokens, expected(p, 4, n_vocab), "request {id}");
            done
        };
        let a1 = turn(&mut engine, 0, &agent(1));
        // Agent B shares only the system prompt with A's cached conversation: it gets a
        // copy of those 24 positions and prefills only its own tokens.
        let b1 = turn(&mut engine, 1, &agent(2));
        assert_eq!(b1.usage.cached_tokens, 24);
        // A's conversation is still whole: its next turn reuses all of it (the prompt
        // and the generated tokens but the last, which was never fed).
        let a2_prompt = [agent(1), a1.tokens.clone(), prompt(3, 5)].concat();
        let a2 = turn(&mut engine, 2, &a2_prompt);
        assert_eq!(a2.usage.cached_tokens, 30 + 3, "mixed {mixed}");
        // And so is B's.
        let b2_prompt = [agent(2), b1.tokens.clone(), prompt(4, 5)].concat();
        let b2 = turn(&mut engine, 3, &b2_prompt);
        assert_eq!(b2.usage.cached_tokens, 30 + 3, "mixed {mixed}");
        let stats = engine.stats();
        assert_eq!(stats.pyramid.n_forks, 1);
        assert!(stats.pyramid.fork_bytes > 0);
        assert_eq!(stats.cached_sessions, 2);
    }
}

#[test]
fn requests_with_one_prompt_prefill_it_once_and_share_it() {
    let pool = ThreadPool::new(1).unwrap();
    // Natively (mixed passes) and on a static route.
    for mixed in [true, false] {
        let fake = Fake::new(Duration::ZERO, mixed);
        let n_vocab = fake.model.config.n_vocab;
        let mut engine = engine(&fake, config(Arm::OnDemand, &[64, 128], 8, 4));
        let shared = prompt(3, 40);
        for id in 0..3 {
            engine.add_request(Request::greedy(id, shared.clone(), 4));
        }
        // A request with its own prompt is not held back.
        engine.add_request(Request::greedy(3, prompt(7, 12), 4));
        if mixed {
            // (A static route first waits for its artifacts.)
            let s = engine.schedule();
            assert_eq!(
                s.prefills,
                [(0, 4), (3, 4)],
                "the copies of a prompt wait for the first to prefill it"
            );
        }
        let mut cached = vec![None; 4];
        let mut tokens = vec![Vec::new(); 4];
        while engine.has_work() {
            for event in engine.step(&pool) {
                match event {
                    Event::Token { id, token, .. } => tokens[id as usize].push(token),
                    Event::Finished { id, usage, .. } => {
                        cached[id as usize] = Some(usage.cached_tokens)
                    }
                    Event::Failed { id, error } => panic!("request {id} failed: {error}"),
                    Event::Started { .. } | Event::Embedding { .. } => {}
                }
            }
        }
        // Each copy's cache held exactly its history (the fake backend checks it).
        for (id, t) in tokens.iter().enumerate().take(3) {
            assert_eq!(t, &expected(&shared, 4, n_vocab), "request {id}");
        }
        assert_eq!(
            cached,
            [Some(0), Some(39), Some(39), Some(0)],
            "the copies took all but the last prompt position from the first"
        );
    }
}
