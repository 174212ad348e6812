//! A persistent pool that runs one closure on every thread and waits for all.
//!
//! Written here rather than taken from rayon because a forward pass issues hundreds of
//! small parallel regions per token: each must cost a wake-up, not a task-queue round
//! trip or a thread spawn, and the split of work must be static so every thread touches
//! the same weight rows every step (they stay in its cache).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::KernelError;

/// Spin iterations (a `pause` each, ~20 ns on current x86) before a waiting thread parks:
/// long enough to bridge the serial work between two parallel regions of a forward pass,
/// short enough that a thread whose partner was descheduled (a shared, oversubscribed
/// machine) gives its core back quickly instead of spinning through its time slice.
const SPIN_ITERS: u32 = 2_000;

/// Type-erased pointer to the caller's closure; valid only while `run` waits.
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn(usize) + Sync));

struct Shared {
    /// Bumped once per `run`; workers compare it with the last one they served.
    generation: AtomicU64,
    /// Written by `run` only while every worker is idle (`pending == 0`), read by workers
    /// only after they observe the matching `generation`.
    job: UnsafeCell<Option<Job>>,
    pending: AtomicUsize,
    shutdown: AtomicBool,
    /// Workers parked on `wake`; `run` takes the lock and notifies only when some are.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// The caller parked on `done`, waiting for the last worker.
    caller_waiting: AtomicBool,
    /// A `run` is in progress; concurrent or nested calls run inline instead.
    busy: AtomicBool,
    /// A worker's call panicked; `run` re-raises it once all workers are done.
    worker_panicked: AtomicBool,
    done: Condvar,
}

// SAFETY: `job` is accessed under the generation/pending protocol described on the field;
// everything else is atomics or std sync types.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

impl ThreadPool {
    /// `n_threads` counts the calling thread, which always takes part as thread 0.
    pub fn new(n_threads: usize) -> Result<Self, KernelError> {
        if n_threads == 0 {
            return Err(KernelError::ZeroThreads);
        }
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            pending: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            caller_waiting: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            worker_panicked: AtomicBool::new(false),
            done: Condvar::new(),
        });
        let mut pool = Self {
            shared,
            workers: Vec::with_capacity(n_threads - 1),
            n_threads,
        };
        for idx in 1..n_threads {
            let shared = Arc::clone(&pool.shared);
            let worker = std::thread::Builder::new()
                .name(format!("pyramid-worker-{idx}"))
                .spawn(move || worker_loop(&shared, idx))
                // Dropping `pool` shuts down and joins the workers started so far.
                .map_err(|e| KernelError::Spawn(e.to_string()))?;
            pool.workers.push(worker);
        }
        Ok(pool)
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
    /// calls have returned. A call made while the pool is busy (nested, or from another
    /// thread) runs all indices on the calling thread instead. A panic in any call is
    /// re-raised here, after every worker has let go of `f`.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        let shared = &*self.shared;
        if self.n_threads == 1
            || shared
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            (0..self.n_threads).for_each(f);
            return;
        }
        // SAFETY: erase the lifetime; we do not return (or unwind) until `pending` reaches
        // zero, i.e. until no worker can touch `f` any more.
        let job = Job(unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync)>(
                f,
            )
        });
        // SAFETY: all workers are idle (the previous `run` waited for `pending == 0`, and
        // `busy` excludes concurrent callers), so nobody reads `job` until the generation
        // below is published.
        unsafe { *shared.job.get() = Some(job) };
        shared.pending.store(self.n_threads - 1, Ordering::SeqCst);
        shared.generation.fetch_add(1, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = shared.lock.lock().expect("pool lock poisoned");
            shared.wake.notify_all();
        }
        let own = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(0)));
        self.wait_for_workers();
        shared.busy.store(false, Ordering::Release);
        if let Err(payload) = own {
            std::panic::resume_unwind(payload);
        }
        if shared.worker_panicked.swap(false, Ordering::SeqCst) {
            panic!("a thread-pool worker panicked");
        }
    }

    fn wait_for_workers(&self) {
        let shared = &*self.shared;
        for _ in 0..SPIN_ITERS {
            if shared.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            std::hint::spin_loop();
        }
        let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
        shared.caller_waiting.store(true, Ordering::SeqCst);
        while shared.pending.load(Ordering::SeqCst) != 0 {
            guard = shared.done.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        shared.caller_waiting.store(false, Ordering::SeqCst);
    }
}

fn worker_loop(shared: &Shared, idx: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        while shared.generation.load(Ordering::Acquire) == seen
            && !shared.shutdown.load(Ordering::Acquire)
        {
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
                continue;
            }
            let mut guard = shared.lock.lock().expect("pool lock poisoned");
            shared.sleepers.fetch_add(1, Ordering::SeqCst);
            while shared.generation.load(Ordering::SeqCst) == seen
                && !shared.shutdown.load(Ordering::SeqCst)
            {
                guard = shared.wake.wait(guard).expect("pool lock poisoned");
            }
            shared.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        seen = shared.generation.load(Ordering::Acquire);
        // SAFETY: `run` published `job` before bumping the generation we just observed and
        // keeps the closure alive until we decrement `pending`.
        let job = unsafe { (*shared.job.get()).expect("a new generation always carries a job") };
        let f = unsafe { &*job.0 };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(idx))).is_err() {
            shared.worker_panicked.store(true, Ordering::SeqCst);
        }
        if shared.pending.fetch_sub(1, Ordering::SeqCst) == 1
            && shared.caller_waiting.load(Ordering::SeqCst)
        {
            // Taking the lock orders us after the caller's check of `pending`, so the
            // notification cannot fall between that check and its wait.
            let _guard = shared.lock.lock().expect("pool lock poisoned");
            shared.done.notify_all();
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.lock.lock();
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A buffer that the threads of one [`ThreadPool::run`] fill in disjoint parts.
///
/// Every user must guarantee that no two threads write the same element and that the
/// buffer outlives the `run`; the `unsafe` blocks that dereference [`SharedMut::get`] say how.
#[derive(Clone, Copy)]
pub struct SharedMut(*mut f32);

// SAFETY: only a pointer is shared; each user writes disjoint elements inside `run`, which
// returns only after all threads are done.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

impl SharedMut {
    pub fn new(buf: &mut [f32]) -> Self {
        Self(buf.as_mut_ptr())
    }

    /// A method (not field access) so closures capture the `Sync` wrapper, not the raw pointer.
    pub fn get(self) -> *mut f32 {
        self.0
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

    #[test]
    fn every_thread_runs_once_per_call() {
        let pool = ThreadPool::new(3).unwrap();
        let hits = AtomicU64::new(0);
        for _ in 0..1000 {
            pool.run(&|idx| {
                hits.fetch_add(1 << (idx * 16), Ordering::Relaxed);
            });
        }
        assert_eq!(
            hits.load(Ordering::Relaxed),
            1000 * (1 + (1 << 16) + (1 << 32))
        );
    }

    #[test]
    fn panics_propagate_and_the_pool_stays_usable() {
        let pool = ThreadPool::new(2).unwrap();
        for bad in [0, 1] {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run(&|idx| assert_ne!(idx, bad, "thread {bad} fails"));
            }));
            assert!(
                caught.is_err(),
                "a panic on thread {bad} must reach the caller"
            );
        }
        let hits = AtomicUsize::new(0);
        pool.run(&|_| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn nested_runs_execute_inline() {
        let pool = ThreadPool::new(2).unwrap();
        let hits = AtomicUsize::new(0);
        pool.run(&|_| {
            pool.run(&|_| {
                hits.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(hits.load(Ordering::Relaxed), 4);
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
                    assert!(r.start.is_multiple_of(4) || r.start == n);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
