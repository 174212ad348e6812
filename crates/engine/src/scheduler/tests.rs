//! The scheduler alone: no backend, no executor. Artifacts come from a table the test
//! fills, so what it decides is checked without running a pass.

use std::sync::Mutex;

use super::*;
use pyramid_model::KvType;

use crate::step::{Executed, Move};
use crate::test_harness::{config, tiny};
use crate::{Arm, FinishReason, Request};

/// Which windows' artifacts are compiled, and the forks recorded.
#[derive(Default)]
struct Table {
    ready: Mutex<Vec<usize>>,
    forks: Mutex<usize>,
}

impl Artifacts for Table {
    fn window_ready(&self, window: usize) -> bool {
        self.ready.lock().unwrap().contains(&window)
    }
    fn decode_ready(&self, _batch: usize, window: usize) -> bool {
        self.window_ready(window)
    }
    fn is_prepared(&self, window: usize) -> bool {
        self.window_ready(window)
    }
    fn shapes(&self, window: usize) -> [ArtifactShape; 2] {
        [
            ArtifactShape::Prefill { chunk: 8, window },
            ArtifactShape::Decode { batch: 1, window },
        ]
    }
    fn expected_compile(&self, _window: usize) -> Duration {
        Duration::from_millis(10)
    }
    fn record_fork(&self, _bytes: usize) {
        *self.forks.lock().unwrap() += 1;
    }
}

fn scheduler(mixed: bool, table: Arc<Table>, edit: impl FnOnce(&mut EngineConfig)) -> Scheduler {
    let mut cfg = config(Arm::OnDemand, &[32, 64], 8, 2);
    edit(&mut cfg);
    let model = tiny();
    let kv = KvAllocator::new(&model.config, KvType::F32, 64);
    Scheduler::new(cfg, mixed, table, kv, &model.config)
}

/// Request `id`: a prompt of `len` tokens all its own (requests sharing a prompt would
/// wait for each other's prefill).
fn request(id: RequestId, len: usize, priority: i32) -> Request {
    let first = 1 + 1000 * id as u32;
    let mut r = Request::greedy(id, (first..first + len as u32).collect(), 4);
    r.priority = priority;
    r
}

#[test]
fn the_prefill_chunk_goes_to_the_most_urgent_and_the_batch_is_bounded() {
    let mut s = scheduler(true, Arc::default(), |_| {});
    s.add_request(request(1, 12, 0));
    s.add_request(request(2, 5, -1));
    s.add_request(request(3, 3, 5));
    let plan = s.schedule(&mut NoStore);
    // Two fit the batch; the urgent one takes its whole prompt, the next the rest.
    assert_eq!(plan.prefills, [(2, 5), (1, 3)]);
    assert_eq!(
        plan.moves,
        [(2, 32, Move::First), (1, 32, Move::First)],
        "both start on the smallest window"
    );
    assert_eq!(s.n_waiting(), 1);
    let events = s.take_events();
    let started: Vec<RequestId> = events
        .iter()
        .filter_map(|e| match e {
            Event::Started { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(started, [2, 1]);
    let statuses: Vec<_> = s.running.iter().map(|q| q.status()).collect();
    assert!(statuses
        .iter()
        .all(|st| *st == crate::SequenceStatus::Prefilling));
    assert_eq!(s.waiting[0].status(), crate::SequenceStatus::Queued);
}

#[test]
fn a_static_route_stalls_on_a_window_not_compiled_and_asks_for_it() {
    let table = Arc::new(Table::default());
    let mut s = scheduler(false, Arc::clone(&table), |_| {});
    s.add_request(request(1, 6, 0));
    let plan = s.schedule(&mut NoStore);
    assert!(plan.is_idle());
    assert_eq!(plan.stalled, [(1, 32)]);
    assert!(plan.compiles.contains(&ArtifactShape::Prefill {
        chunk: 8,
        window: 32
    }));
    table.ready.lock().unwrap().push(32);
    let plan = s.schedule(&mut NoStore);
    assert_eq!(plan.prefills, [(1, 6)]);
    assert!(plan.stalled.is_empty());
}

#[test]
fn requests_that_can_never_run_fail_when_added_and_an_abort_ends_a_queued_one() {
    let mut s = scheduler(true, Arc::default(), |c| c.kv_budget = 1);
    s.add_request(request(1, 4, 0));
    s.add_request(Request::greedy(2, Vec::new(), 4));
    s.add_request(request(3, 100, 0));
    let failed: Vec<(RequestId, String)> = s
        .take_events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Failed { id, error } => Some((id, error.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 3, "{failed:?}");
    assert!(failed[0].1.contains("beyond the budget"), "{failed:?}");
    assert!(failed[1].1.contains("prompt is empty"), "{failed:?}");
    assert!(!s.has_work());
    let mut s = scheduler(true, Arc::default(), |_| {});
    s.add_request(request(7, 4, 0));
    assert_eq!(s.abort(7).unwrap().prompt_tokens, 4);
    assert!(!s.has_work());
    assert!(s.abort(7).is_none());
}

#[test]
fn a_failed_pass_ends_its_sequence_and_keeps_the_others() {
    let mut s = scheduler(true, Arc::default(), |_| {});
    s.add_request(request(1, 4, 0));
    s.add_request(request(2, 4, 0));
    let plan = s.schedule(&mut NoStore);
    s.take_events();
    let pool = pyramid_kernels::ThreadPool::new(1).unwrap();
    let mut executed = Executed {
        failed: vec![(1, EngineError::Pass("a test".into()))],
        ..Executed::default()
    };
    let events = s.update(&pool, &plan, &mut executed);
    assert!(matches!(&events[..], [Event::Failed { id: 1, .. }]));
    assert_eq!(s.running.len(), 1);
    assert_eq!(s.running[0].id(), 2);
    // Nothing finished: no reason was reported for the survivor.
    assert!(!events.iter().any(|e| matches!(
        e,
        Event::Finished {
            reason: FinishReason::Stop,
            ..
        }
    )));
}

/// Answers `Loading` for one request's stored conversation.
struct LoadingFor(RequestId);

impl StoredPrefixes for LoadingFor {
    fn longer_prefix(&mut self, id: RequestId, _prompt: &[u32], _cached: usize) -> Stored {
        if id == self.0 {
            Stored::Loading
        } else {
            Stored::Nothing
        }
    }
}

#[test]
fn a_request_waiting_for_its_file_lets_the_others_run_and_joins_when_it_arrives() {
    let mut s = scheduler(true, Arc::default(), |_| {});
    s.add_request(request(1, 6, -5));
    s.add_request(request(2, 6, 0));
    let plan = s.schedule(&mut LoadingFor(1));
    assert_eq!(plan.prefills, [(2, 6)], "the urgent one waits for its file");
    assert_eq!(s.waiting[0].status(), crate::SequenceStatus::Loading);
    // Still reading: it is not a candidate, whatever its priority.
    let plan = s.schedule(&mut LoadingFor(1));
    assert!(!plan.prefills.iter().any(|p| p.0 == 1));
    assert_eq!(s.waiting.len(), 1);
    // The read failed: it prefills instead, and does not ask for the file again.
    s.loaded(1, None);
    assert_eq!(s.waiting[0].status(), crate::SequenceStatus::Queued);
    let plan = s.schedule(&mut LoadingFor(1));
    assert_eq!(plan.prefills[0], (1, 6), "the most urgent prefills first");
}

#[test]
fn a_fork_starts_on_the_window_its_own_prompt_needs_when_that_is_compiled() {
    // Compiled windows, and where the fork lands: its own (32), or the parent's (64)
    // rather than waiting for a compile.
    for (ready, expected) in [(vec![32, 64], 32), (vec![64], 64)] {
        let table = Arc::new(Table::default());
        *table.ready.lock().unwrap() = ready;
        let mut s = scheduler(false, Arc::clone(&table), |_| {});
        // A long conversation that grew onto the larger window, cached.
        let mut kv = s.kv.new_cache(64);
        kv.commit(40).unwrap();
        let long: Vec<u32> = (1..=40).collect();
        let placement = crate::session::Placement {
            window: 64,
            kv,
            artifacts: None,
        };
        s.cache.insert(Session::restored(long, placement));
        // Another agent shares its first 10 tokens and goes its own way.
        let mut prompt: Vec<u32> = (1..=10).collect();
        prompt.extend([50, 51]);
        s.add_request(Request::greedy(1, prompt, 4));
        let plan = s.schedule(&mut NoStore);
        assert_eq!(plan.prefills, [(1, 2)], "the shared 10 are copied, not run");
        assert!(plan.moves.is_empty());
        assert_eq!(s.running[0].session.window(), Some(expected));
        assert_eq!(s.running[0].session.len(), 10);
        assert_eq!(*table.forks.lock().unwrap(), 1);
        assert_eq!(s.cache.len(), 1, "the long conversation stays cached whole");
        assert_eq!(s.cache.session(0).len(), 40);
    }
}
