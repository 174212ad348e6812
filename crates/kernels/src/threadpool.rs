//! A persistent pool that runs one closure on every thread and waits for all.
//!
//! Written here rather than taken from rayon because a forward pass issues hundreds of
//! small parallel regions per token: each must cost a wake-up, not a task-queue round
//! trip or a thread spawn, and the split of work must be static so every thread touches
//! the same weight rows every step (they stay in its cache).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::KernelError;

/// Type-erased pointer to the caller's closure; valid only while `run` waits.
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn(usize) + Sync));

// SAFETY: the pointee is `Sync`, and `run` keeps it alive until every worker is done.
unsafe impl Send for Job {}

struct State {
    generation: u64,
    job: Option<Job>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    pending: AtomicUsize,
    done_lock: Mutex<()>,
    done: Condvar,
}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool").field("n_threads", &self.n_threads).finish()
    }
}

impl ThreadPool {
    /// `n_threads` counts the calling thread, which always takes part as thread 0.
    pub fn new(n_threads: usize) -> Result<Self, KernelError> {
        if n_threads == 0 {
            return Err(KernelError::ZeroThreads);
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                job: None,
                shutdown: false,
            }),
            wake: Condvar::new(),
            pending: AtomicUsize::new(0),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
        });
        let workers = (1..n_threads)
            .map(|idx| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("pyramid-worker-{idx}"))
                    .spawn(move || worker_loop(&shared, idx))
                    .expect("spawning a worker thread")
            })
            .collect();
        Ok(Self {
            shared,
            workers,
            n_threads,
        })
    }

    /// One thread per available core.
    pub fn with_available_parallelism() -> Self {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::new(n).expect("at least one thread")
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(thread_idx)` for every `thread_idx` in `0..n_threads` and returns when all
    /// calls have returned. Calls from the same pool must not nest.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.n_threads == 1 {
            f(0);
            return;
        }
        // SAFETY: erase the lifetime; we do not return until `pending` reaches zero,
        // i.e. until no worker can touch `f` any more.
        let job = Job(unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync)>(f)
        });
        self.shared.pending.store(self.n_threads - 1, Ordering::Release);
        {
            let mut state = self.shared.state.lock().expect("pool lock poisoned");
            state.generation += 1;
            state.job = Some(job);
        }
        self.shared.wake.notify_all();
        f(0);
        // Brief spin first: the workers usually finish within microseconds of us.
        for _ in 0..2000 {
            if self.shared.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            std::hint::spin_loop();
        }
        let mut guard = self.shared.done_lock.lock().expect("pool lock poisoned");
        while self.shared.pending.load(Ordering::Acquire) != 0 {
            guard = self.shared.done.wait(guard).expect("pool lock poisoned");
        }
    }
}

fn worker_loop(shared: &Shared, idx: usize) {
    let mut seen = 0u64;
    loop {
        let job = {
            let mut state = shared.state.lock().expect("pool lock poisoned");
            while state.generation == seen && !state.shutdown {
                state = shared.wake.wait(state).expect("pool lock poisoned");
            }
            if state.shutdown {
                return;
            }
            seen = state.generation;
            state.job.expect("a new generation always carries a job")
        };
        // SAFETY: `run` keeps the closure alive until we decrement `pending`.
        let f = unsafe { &*job.0 };
        f(idx);
        if shared.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _guard = shared.done_lock.lock().expect("pool lock poisoned");
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        if let Ok(mut state) = self.shared.state.lock() {
            state.shutdown = true;
        }
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// The half-open range of `0..n` that thread `idx` of `n_threads` owns, in multiples of
/// `align` so SIMD tiles never straddle two threads.
pub fn split_range(n: usize, n_threads: usize, idx: usize, align: usize) -> std::ops::Range<usize> {
    let n_blocks = n.div_ceil(align);
    let per = n_blocks / n_threads;
    let extra = n_blocks % n_threads;
    let start_block = idx * per + idx.min(extra);
    let end_block = start_block + per + usize::from(idx < extra);
    (start_block * align).min(n)..(end_block * align).min(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_thread_runs_once_per_call() {
        let pool = ThreadPool::new(3).unwrap();
        let hits = AtomicU64::new(0);
        for _ in 0..1000 {
            pool.run(&|idx| {
                hits.fetch_add(1 << (idx * 16), Ordering::Relaxed);
            });
        }
        assert_eq!(hits.load(Ordering::Relaxed), 1000 * (1 + (1 << 16) + (1 << 32)));
    }

    #[test]
    fn zero_threads_is_an_error() {
        assert!(matches!(ThreadPool::new(0), Err(KernelError::ZeroThreads)));
    }

    #[test]
    fn split_range_covers_everything_once() {
        for n in [0, 1, 5, 64, 100, 1000] {
            for t in 1..5 {
                let mut next = 0;
                for idx in 0..t {
                    let r = split_range(n, t, idx, 4);
                    assert_eq!(r.start, next);
                    assert!(r.start % 4 == 0 || r.start == n);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
