//! (chunk, layer) tasks of one prefill on two executors at once, out of order as their
//! dependencies allow.
//!
//! Task (c, l) needs (c, l − 1), whose output rows are its input, and (c − 1, l), after
//! which every earlier chunk's keys and values at layer l exist. A layer's tasks
//! therefore run in chunk order, and two tasks running at once are always on different
//! layers. Each executor keeps its own host cache; when a task ends, its rows' keys and
//! values go to the other executor, which writes them before its next task. A cache is
//! only ever written by the thread that owns it, and nothing is locked while computing.
//! An idle executor takes the ready task of the earliest chunk among the layers it may
//! run ([`Assignment`]), the faster executor (by its mean task time so far) choosing
//! first, so the work forms a wavefront: the faster one carries the earliest chunk down
//! the layers while the other starts the next.
//!
//! The policy ([`Policy`]) is plain data, driven here by real executors on two threads
//! and in [`crate::split`] by predicted task times, so a prediction follows the very
//! choices a run makes.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{AffinityError, Result};

/// Which executor may run a layer's tasks. The workers of [`run_tasks`] are `[native,
/// device]`; the native one's cache is the session's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Assignment {
    /// Whichever is free first.
    Either,
    Native,
    Device,
}

impl Assignment {
    fn allows(self, worker: usize) -> bool {
        match self {
            Assignment::Either => true,
            Assignment::Native => worker == 0,
            Assignment::Device => worker == 1,
        }
    }
}

/// Keys and values of a task's rows, `[n_head_kv, rows, head_dim]` each.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rows {
    pub keys: Vec<f32>,
    pub values: Vec<f32>,
}

/// One executor of layer tasks, owning its cache.
pub trait LayerWorker: Send {
    /// Runs layer `layer` on `hidden` (a chunk's rows at cache positions `pos..`,
    /// replaced by the layer's output), attending to this executor's cache; returns the
    /// rows' keys and values, which it has also stored.
    fn run(&mut self, layer: usize, pos: usize, hidden: &mut Vec<f32>) -> Result<Rows>;
    /// Stores the other executor's rows of `layer` at positions `pos..`.
    fn apply(&mut self, layer: usize, pos: usize, rows: &Rows) -> Result<()>;
}

/// What each executor did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScheduleStats {
    pub wall: Duration,
    /// Per executor: tasks run and time spent running them.
    pub tasks: [usize; 2],
    pub busy: [Duration; 2],
    /// Tasks that started while the other executor was running one.
    pub overlapped: usize,
}

enum Order {
    Run {
        layer: usize,
        pos: usize,
        hidden: Vec<f32>,
        updates: Vec<(usize, usize, Rows)>,
    },
    Stop,
}

struct Report {
    worker: usize,
    result: Result<(Vec<f32>, Rows)>,
    took: Duration,
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Waiting,
    Running,
    Done,
}

/// Which task each idle executor takes next, and what has run.
pub(crate) struct Policy<'a> {
    assignment: &'a [Assignment],
    state: Vec<Vec<State>>,
    running: [Option<(usize, usize)>; 2],
    left: usize,
    pub(crate) stats: ScheduleStats,
}

impl<'a> Policy<'a> {
    /// `assignment` holds one entry per layer.
    pub(crate) fn new(n_chunks: usize, assignment: &'a [Assignment]) -> Self {
        Self {
            assignment,
            state: vec![vec![State::Waiting; assignment.len()]; n_chunks],
            running: [None, None],
            left: n_chunks * assignment.len(),
            stats: ScheduleStats::default(),
        }
    }

    /// The tasks `(worker, chunk, layer)` that start now, each marked running.
    pub(crate) fn start(&mut self) -> Vec<(usize, usize, usize)> {
        let stats = &self.stats;
        let mean = |w: usize| stats.busy[w].as_secs_f64() / stats.tasks[w].max(1) as f64;
        let first = usize::from(mean(1) < mean(0));
        let mut started = Vec::new();
        for w in [first, 1 - first] {
            if self.running[w].is_some() {
                continue;
            }
            let ready = (0..self.state.len()).find_map(|c| {
                let l = self.state[c].iter().position(|s| *s != State::Done)?;
                let input_ready = self.state[c][l] == State::Waiting;
                let earlier_done = c == 0 || self.state[c - 1][l] == State::Done;
                (input_ready && earlier_done && self.assignment[l].allows(w)).then_some((c, l))
            });
            let Some((c, l)) = ready else { continue };
            self.state[c][l] = State::Running;
            if self.running[1 - w].is_some() {
                self.stats.overlapped += 1;
            }
            self.running[w] = Some((c, l));
            started.push((w, c, l));
        }
        started
    }

    /// Worker `w`'s task ended after `took`, done or not; returns its (chunk, layer).
    pub(crate) fn finish(&mut self, w: usize, took: Duration, done: bool) -> (usize, usize) {
        let (c, l) = self.running[w]
            .take()
            .expect("a task ends only once it has started");
        self.stats.tasks[w] += 1;
        self.stats.busy[w] += took;
        if done {
            self.state[c][l] = State::Done;
            self.left -= 1;
        } else {
            self.state[c][l] = State::Waiting;
        }
        (c, l)
    }

    /// Whether `w` is running a task.
    pub(crate) fn is_running(&self, w: usize) -> bool {
        self.running[w].is_some()
    }

    pub(crate) fn all_done(&self) -> bool {
        self.left == 0
    }
}

/// Runs every layer over every chunk: `chunks[c]` is chunk c's rows (its input to layer
/// 0, replaced by the last layer's output) at cache position `positions[c]`; layer l's
/// tasks run where `assignment[l]` allows. Returns when all tasks are done, or with the
/// first executor's error once the other is idle.
pub fn run_tasks(
    assignment: &[Assignment],
    positions: &[usize],
    chunks: &mut [Vec<f32>],
    workers: [&mut dyn LayerWorker; 2],
) -> Result<ScheduleStats> {
    let n_chunks = chunks.len();
    if positions.len() != n_chunks {
        return Err(AffinityError::Plan(format!(
            "{n_chunks} chunks but {} positions",
            positions.len()
        )));
    }
    let start = Instant::now();
    let mut policy = Policy::new(n_chunks, assignment);
    let (report_tx, reports) = mpsc::channel::<Report>();
    std::thread::scope(|scope| {
        let mut orders = Vec::new();
        for (index, worker) in workers.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Order>();
            orders.push(tx);
            let report = report_tx.clone();
            scope.spawn(move || {
                while let Ok(Order::Run {
                    layer,
                    pos,
                    mut hidden,
                    updates,
                }) = rx.recv()
                {
                    let began = Instant::now();
                    // A panicking executor reports an error: the schedule never waits for
                    // a result that cannot come.
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        for (l, p, rows) in &updates {
                            worker.apply(*l, *p, rows)?;
                        }
                        worker.run(layer, pos, &mut hidden)
                    }))
                    .unwrap_or_else(|_| {
                        Err(AffinityError::Plan(format!(
                            "executor {index} panicked on layer {layer}"
                        )))
                    })
                    .map(|rows| (hidden, rows));
                    let took = began.elapsed();
                    if report
                        .send(Report {
                            worker: index,
                            result,
                            took,
                        })
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
        drop(report_tx);
        let mut pending: [Vec<(usize, usize, Rows)>; 2] = Default::default();
        let mut failure = None;
        loop {
            if failure.is_none() {
                for (w, c, l) in policy.start() {
                    let order = Order::Run {
                        layer: l,
                        pos: positions[c],
                        hidden: std::mem::take(&mut chunks[c]),
                        updates: std::mem::take(&mut pending[w]),
                    };
                    if orders[w].send(order).is_err() {
                        failure = Some(AffinityError::Plan(format!("executor {w} stopped")));
                        policy.finish(w, Duration::ZERO, false);
                    }
                }
            }
            if !policy.is_running(0) && !policy.is_running(1) {
                // Nothing runs and nothing could start: done, or stopped by a failure.
                break;
            }
            let Ok(report) = reports.recv() else {
                failure.get_or_insert(AffinityError::Plan("every executor stopped".into()));
                break;
            };
            let w = report.worker;
            match report.result {
                Ok((hidden, rows)) => {
                    let (c, l) = policy.finish(w, report.took, true);
                    chunks[c] = hidden;
                    pending[1 - w].push((l, positions[c], rows));
                }
                Err(e) => {
                    policy.finish(w, report.took, false);
                    failure.get_or_insert(e);
                }
            }
        }
        for order in &orders {
            let _ = order.send(Order::Stop);
        }
        let mut stats = std::mem::take(&mut policy.stats);
        stats.wall = start.elapsed();
        match failure {
            Some(e) => Err(e),
            // Every layer allows an executor, so an idle pair always finds the next task.
            None if !policy.all_done() => Err(AffinityError::Plan(
                "the schedule stopped with tasks left".into(),
            )),
            None => Ok(stats),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// (executor, position, layer) of each task, in the order they started.
    type Log = Arc<Mutex<Vec<(usize, usize, usize)>>>;
    /// A schedule's result, its chunks' final rows, and its log.
    type Outcome = (
        Result<ScheduleStats>,
        Vec<Vec<f32>>,
        Vec<(usize, usize, usize)>,
    );

    /// A layer adds 1 plus the sum of every earlier position's value at that layer (its
    /// "cache"), so any missing dependency changes the result. `delay` slows it; the log
    /// records (executor, position, layer) as each task starts.
    struct Scripted {
        cache: Vec<Vec<f32>>,
        delay: Duration,
        log: Log,
        id: usize,
        fail_on: Option<usize>,
    }

    impl Scripted {
        fn new(id: usize, layers: usize, delay_ms: u64, log: &Log) -> Self {
            Self {
                cache: vec![vec![f32::NAN; 64]; layers],
                delay: Duration::from_millis(delay_ms),
                log: Arc::clone(log),
                id,
                fail_on: None,
            }
        }
    }

    impl LayerWorker for Scripted {
        fn run(&mut self, layer: usize, pos: usize, hidden: &mut Vec<f32>) -> Result<Rows> {
            if self.fail_on == Some(layer) {
                return Err(AffinityError::Plan(format!("device lost on layer {layer}")));
            }
            self.log.lock().unwrap().push((self.id, pos, layer));
            std::thread::sleep(self.delay);
            let past: f32 = self.cache[layer][..pos].iter().sum();
            assert!(
                !past.is_nan(),
                "layer {layer} at {pos} ran before an earlier chunk"
            );
            for v in hidden.iter_mut() {
                *v += 1.0 + past;
            }
            self.cache[layer][pos..pos + hidden.len()].copy_from_slice(hidden);
            Ok(Rows {
                keys: hidden.clone(),
                values: Vec::new(),
            })
        }

        fn apply(&mut self, layer: usize, pos: usize, rows: &Rows) -> Result<()> {
            self.cache[layer][pos..pos + rows.keys.len()].copy_from_slice(&rows.keys);
            Ok(())
        }
    }

    fn run(delays: [u64; 2], fail: Option<(usize, usize)>) -> Outcome {
        run_assigned(delays, fail, &[Assignment::Either; 5])
    }

    fn run_assigned(
        delays: [u64; 2],
        fail: Option<(usize, usize)>,
        assignment: &[Assignment],
    ) -> Outcome {
        let (layers, rows) = (assignment.len(), 2);
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut a = Scripted::new(0, layers, delays[0], &log);
        let mut b = Scripted::new(1, layers, delays[1], &log);
        match fail {
            Some((0, layer)) => a.fail_on = Some(layer),
            Some((_, layer)) => b.fail_on = Some(layer),
            None => {}
        }
        let positions: Vec<usize> = (0..4).map(|c| c * rows).collect();
        let mut chunks: Vec<Vec<f32>> = (0..4).map(|c| vec![c as f32; rows]).collect();
        let result = run_tasks(assignment, &positions, &mut chunks, [&mut a, &mut b]);
        let log = log.lock().unwrap().clone();
        (result, chunks, log)
    }

    #[test]
    fn dependencies_hold_and_results_do_not_depend_on_the_interleaving() {
        let (quick, slow_a, slow_b) = (run([0, 0], None), run([3, 0], None), run([0, 3], None));
        quick.0.as_ref().unwrap();
        assert_eq!(quick.1, slow_a.1);
        assert_eq!(quick.1, slow_b.1);
        for (_, _, log) in [&quick, &slow_a, &slow_b] {
            assert_eq!(log.len(), 20);
            // Each chunk's layers in order, and each layer's chunks in order.
            for (i, &(_, pos, layer)) in log.iter().enumerate() {
                let before = &log[..i];
                assert!(layer == 0 || before.iter().any(|&(_, p, l)| p == pos && l == layer - 1));
                assert!(pos == 0 || before.iter().any(|&(_, p, l)| p == pos - 2 && l == layer));
            }
        }
    }

    #[test]
    fn a_slow_executor_does_not_hold_back_ready_work() {
        let (result, _, log) = run([20, 1], None);
        let stats = result.unwrap();
        assert_eq!(stats.tasks[0] + stats.tasks[1], 20);
        assert!(stats.tasks[1] > stats.tasks[0], "{stats:?}");
        assert!(stats.overlapped > 0, "{stats:?}");
        // Out of order: a later chunk's task was issued before an earlier chunk's.
        assert!(log.windows(2).any(|w| w[1].1 < w[0].1), "{log:?}");
    }

    #[test]
    fn layers_run_only_where_they_are_assigned() {
        use Assignment::{Device, Either, Native};
        let assignment = [Native, Device, Either, Device, Native];
        let free = run([0, 0], None);
        // A slow native executor must still get every native layer, and nothing else
        // takes them; a slow device likewise.
        for delays in [[0, 0], [4, 0], [0, 4]] {
            let (result, chunks, log) = run_assigned(delays, None, &assignment);
            let stats = result.unwrap();
            assert_eq!(chunks, free.1, "the same rows as an unassigned run");
            assert_eq!(log.len(), 20);
            for &(worker, _, layer) in &log {
                assert!(assignment[layer].allows(worker), "{log:?}");
            }
            assert!(stats.tasks[0] >= 8 && stats.tasks[1] >= 8, "{stats:?}");
        }
    }

    #[test]
    fn a_failing_executor_ends_the_schedule_with_its_error() {
        for who in [0, 1] {
            let (result, _, log) = run([1, 1], Some((who, 2)));
            let err = result.unwrap_err().to_string();
            assert!(err.contains("device lost on layer 2"), "{err}");
            assert!(log.len() < 20);
        }
    }

    #[test]
    fn a_panicking_executor_is_an_error_not_a_hang() {
        struct Panics;
        impl LayerWorker for Panics {
            fn run(&mut self, _: usize, _: usize, _: &mut Vec<f32>) -> Result<Rows> {
                panic!("kernel bug")
            }
            fn apply(&mut self, _: usize, _: usize, _: &Rows) -> Result<()> {
                Ok(())
            }
        }
        let mut chunks = vec![vec![0.0; 2]; 3];
        let either = [Assignment::Either; 3];
        let err = run_tasks(&either, &[0, 2, 4], &mut chunks, [&mut Panics, &mut Panics])
            .unwrap_err()
            .to_string();
        assert!(err.contains("panicked"), "{err}");
    }
}
