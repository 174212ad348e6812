//! A persistent pool that runs one closure on every thread, with barriers inside it.
//!
//! Written here rather than taken from rayon because a forward pass is one parallel
//! region per call ([`ThreadPool::run_team`]): the threads stay inside it for every
//! layer and meet at a [`Team::sync`] barrier between steps, so each step costs a
//! barrier, not a task-queue round trip or a thread wake-up; and the split of work is
//! static, so every thread touches the same weight rows every step (they stay in its
//! cache).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::KernelError;

/// Spin iterations (a `pause` each, 9 ns on a Sapphire Rapids VM, more on others) before a
/// thread waiting at a barrier starts yielding: short enough that a thread whose partner
/// was descheduled (a shared, oversubscribed machine) gives its core back quickly instead
/// of spinning through its time slice.
const SPIN_ITERS: u32 = 2_000;

/// How long a thread spins for the next region, or for the workers to finish one, before
/// it parks. Longer than the serial work between two decode steps (sampling and
/// scheduling: 50 µs a step at batch 1 and 180 µs at batch 8 on SmolLM2), so a decoding
/// worker does not park between steps: parking every step cost each step a futex wake,
/// and on a VM an idle virtual CPU's wake-up, which was sometimes hundreds of µs.
const SPIN_BEFORE_PARKING: Duration = Duration::from_micros(500);

/// Spins while `waiting()` holds, for at most [`SPIN_BEFORE_PARKING`]; true if it still
/// holds, i.e. the caller should park.
fn spin_while(waiting: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    let mut spins = 0u32;
    while waiting() {
        spins = spins.wrapping_add(1);
        // Reading the clock costs more than a pause: every 64th spin is enough.
        if spins.is_multiple_of(64) && start.elapsed() >= SPIN_BEFORE_PARKING {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

/// Type-erased pointer to the caller's closure; valid only while `run_team` waits.
#[derive(Clone, Copy)]
struct Job(*const (dyn Fn(&Team) + Sync));

/// A spin-then-yield barrier for the threads of one region. Yielding rather than parking:
/// between two steps of a layer the wait is microseconds, and a descheduled partner is
/// better served by giving it the core than by a futex round trip.
#[derive(Default)]
struct Barrier {
    arrived: AtomicUsize,
    /// Bumped by the last thread to arrive, releasing the others.
    epoch: AtomicUsize,
    /// A thread of the region panicked: the others must not wait for it.
    poisoned: AtomicBool,
}

impl Barrier {
    fn wait(&self, n_threads: usize) {
        if n_threads == 1 {
            return;
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == n_threads {
            self.arrived.store(0, Ordering::Relaxed);
            self.epoch.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.epoch.load(Ordering::Acquire) == epoch {
            if self.poisoned.load(Ordering::Relaxed) {
                panic!("another thread of the parallel region panicked");
            }
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    fn reset(&self) {
        self.arrived.store(0, Ordering::Relaxed);
        self.poisoned.store(false, Ordering::Relaxed);
    }
}

/// One thread's view of a [`ThreadPool::run_team`] region.
pub struct Team<'a> {
    idx: usize,
    n_threads: usize,
    barrier: &'a Barrier,
}

impl Team<'_> {
    /// A team of one: what a region degrades to when the pool is busy.
    fn solo(barrier: &Barrier) -> Team<'_> {
        Team {
            idx: 0,
            n_threads: 1,
            barrier,
        }
    }

    pub fn idx(&self) -> usize {
        self.idx
    }

    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Returns once every thread of the team has called `sync` as often as this one: what
    /// any thread wrote before it is visible to all after it.
    pub fn sync(&self) {
        self.barrier.wait(self.n_threads);
    }

    /// This thread's share of `0..n`, in multiples of `align`.
    pub fn split(&self, n: usize, align: usize) -> std::ops::Range<usize> {
        split_range(n, self.n_threads, self.idx, align)
    }
}

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
    /// A region is in progress; concurrent or nested calls run as a team of one instead.
    busy: AtomicBool,
    barrier: Barrier,
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
            barrier: Barrier::default(),
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
                .spawn(move || worker_loop(&shared, idx, n_threads))
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

    /// Runs `f` on every thread of the pool as one team and returns when all calls have
    /// returned. A call made while the pool is busy (nested, or from another thread) runs
    /// `f` once on the calling thread as a team of one, so code must split its work by
    /// [`Team::n_threads`], never by the pool's size. A panic in any call is re-raised
    /// here, after every thread has let go of `f`; threads waiting at a barrier for the
    /// one that panicked panic too rather than wait forever.
    pub fn run_team(&self, f: &(dyn Fn(&Team) + Sync)) {
        let shared = &*self.shared;
        if self.n_threads == 1
            || shared
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            f(&Team::solo(&Barrier::default()));
            return;
        }
        // SAFETY: erase the lifetime; we do not return (or unwind) until `pending` reaches
        // zero, i.e. until no worker can touch `f` any more.
        let job = Job(unsafe {
            std::mem::transmute::<*const (dyn Fn(&Team) + Sync + '_), *const (dyn Fn(&Team) + Sync)>(
                f,
            )
        });
        // SAFETY: all workers are idle (the previous call waited for `pending == 0`, and
        // `busy` excludes concurrent callers), so nobody reads `job` until the generation
        // below is published.
        unsafe { *shared.job.get() = Some(job) };
        shared.pending.store(self.n_threads - 1, Ordering::SeqCst);
        shared.generation.fetch_add(1, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = shared.lock.lock().expect("pool lock poisoned");
            shared.wake.notify_all();
        }
        let team = self.member(0);
        let own = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&team)));
        if own.is_err() {
            shared.barrier.poisoned.store(true, Ordering::SeqCst);
        }
        self.wait_for_workers();
        shared.barrier.reset();
        shared.busy.store(false, Ordering::Release);
        let worker_panicked = shared.worker_panicked.swap(false, Ordering::SeqCst);
        if let Err(payload) = own {
            std::panic::resume_unwind(payload);
        }
        if worker_panicked {
            panic!("a thread-pool worker panicked");
        }
    }

    fn member(&self, idx: usize) -> Team<'_> {
        Team {
            idx,
            n_threads: self.n_threads,
            barrier: &self.shared.barrier,
        }
    }

    fn wait_for_workers(&self) {
        let shared = &*self.shared;
        if !spin_while(|| shared.pending.load(Ordering::Acquire) != 0) {
            return;
        }
        let mut guard = shared.lock.lock().unwrap_or_else(|e| e.into_inner());
        shared.caller_waiting.store(true, Ordering::SeqCst);
        while shared.pending.load(Ordering::SeqCst) != 0 {
            guard = shared.done.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        shared.caller_waiting.store(false, Ordering::SeqCst);
    }
}

fn worker_loop(shared: &Shared, idx: usize, n_threads: usize) {
    let mut seen = 0u64;
    loop {
        let idle = || {
            shared.generation.load(Ordering::Acquire) == seen
                && !shared.shutdown.load(Ordering::Acquire)
        };
        if spin_while(idle) {
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
        let team = Team {
            idx,
            n_threads,
            barrier: &shared.barrier,
        };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&team))).is_err() {
            shared.barrier.poisoned.store(true, Ordering::SeqCst);
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

/// A buffer the threads of one region fill in disjoint parts and read after a barrier.
///
/// Every accessor is `unsafe`: the caller guarantees that between two [`Team::sync`]s no
/// element is written by one thread while another thread reads or writes it.
pub struct SharedSlice<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: access is governed by the contract above; `T: Send` is enough for threads to
// write their elements and `T: Sync` for all of them to read.
unsafe impl<T: Send> Send for SharedSlice<'_, T> {}
unsafe impl<T: Send + Sync> Sync for SharedSlice<'_, T> {}

impl<'a, T> SharedSlice<'a, T> {
    pub fn new(buf: &'a mut [T]) -> Self {
        Self {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw base, for kernels that write strided columns.
    pub fn as_mut_ptr(&self) -> *mut T {
        self.ptr
    }

    /// The elements `range` as a buffer of their own, under the same contract: a step
    /// that works on a group of rows (one expert's) hands kernels that group alone.
    pub fn sub(&self, range: std::ops::Range<usize>) -> SharedSlice<'_, T> {
        assert!(range.start <= range.end && range.end <= self.len);
        SharedSlice {
            // SAFETY: in bounds, checked above; the view borrows `self`.
            ptr: unsafe { self.ptr.add(range.start) },
            len: range.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// # Safety
    /// No other thread touches `range` until the next barrier.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range_mut(&self, range: std::ops::Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len())
    }

    /// # Safety
    /// No thread writes `range` until the next barrier.
    pub unsafe fn range(&self, range: std::ops::Range<usize>) -> &[T] {
        assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts(self.ptr.add(range.start), range.len())
    }

    /// # Safety
    /// No thread writes any element until the next barrier.
    pub unsafe fn as_slice(&self) -> &[T] {
        std::slice::from_raw_parts(self.ptr, self.len)
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
    fn a_sub_slice_views_its_range_of_the_buffer() {
        let mut buf: Vec<u32> = (0..10).collect();
        let shared = SharedSlice::new(&mut buf);
        let sub = shared.sub(3..7);
        assert_eq!(sub.len(), 4);
        // SAFETY: one thread.
        unsafe {
            sub.range_mut(1..2)[0] = 40;
            assert_eq!(sub.as_slice(), &[3, 40, 5, 6]);
        }
        let out_of_bounds = std::panic::AssertUnwindSafe(|| shared.sub(8..11).len());
        assert!(std::panic::catch_unwind(out_of_bounds).is_err());
        assert_eq!(buf[4], 40);
    }

    #[test]
    fn every_thread_runs_once_per_call() {
        let pool = ThreadPool::new(3).unwrap();
        let hits = AtomicU64::new(0);
        for _ in 0..1000 {
            pool.run_team(&|team| {
                hits.fetch_add(1 << (team.idx() * 16), Ordering::Relaxed);
            });
        }
        assert_eq!(
            hits.load(Ordering::Relaxed),
            1000 * (1 + (1 << 16) + (1 << 32))
        );
    }

    #[test]
    fn parked_threads_wake_for_the_next_region_and_its_end() {
        let pool = ThreadPool::new(3).unwrap();
        let hits = AtomicU64::new(0);
        let long = SPIN_BEFORE_PARKING * 4;
        for round in 0..3 {
            // Idle for longer than the spin: both workers park.
            let deadline = Instant::now() + Duration::from_secs(10);
            while pool.shared.sleepers.load(Ordering::SeqCst) < 2 {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: workers never parked"
                );
                std::thread::sleep(long);
            }
            pool.run_team(&|team| {
                // A worker slower than the spin: the caller parks until it is done.
                if team.idx() == 2 {
                    std::thread::sleep(long);
                }
                hits.fetch_add(1 << (team.idx() * 16), Ordering::Relaxed);
            });
            // Every thread's work is complete when `run_team` returns.
            let expected = (round + 1) * (1 + (1 << 16) + (1 << 32));
            assert_eq!(hits.load(Ordering::Relaxed), expected);
        }
    }

    #[test]
    fn sync_orders_every_write_before_every_later_read() {
        let pool = ThreadPool::new(3).unwrap();
        let mut buf = vec![0u64; 3 * 64];
        let shared = SharedSlice::new(&mut buf);
        let mismatches = AtomicUsize::new(0);
        pool.run_team(&|team| {
            for step in 1..=500u64 {
                let mine = team.split(shared.len(), 1);
                // SAFETY: each thread writes its own split, between barriers.
                unsafe { shared.range_mut(mine) }.fill(step);
                team.sync();
                // SAFETY: nobody writes until the next barrier.
                let all = unsafe { shared.as_slice() };
                if all.iter().any(|&v| v != step) {
                    mismatches.fetch_add(1, Ordering::Relaxed);
                }
                team.sync();
            }
        });
        assert_eq!(mismatches.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn panics_propagate_and_the_pool_stays_usable() {
        let pool = ThreadPool::new(2).unwrap();
        for bad in [0, 1] {
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.run_team(&|team| {
                    assert_ne!(team.idx(), bad, "thread {bad} fails");
                    // The survivor must not wait here forever for the thread that failed.
                    team.sync();
                });
            }));
            assert!(
                caught.is_err(),
                "a panic on thread {bad} must reach the caller"
            );
        }
        let hits = AtomicUsize::new(0);
        pool.run_team(&|team| {
            team.sync();
            hits.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn nested_regions_run_as_a_team_of_one() {
        let pool = ThreadPool::new(2).unwrap();
        let hits = AtomicUsize::new(0);
        pool.run_team(&|_| {
            pool.run_team(&|inner| {
                assert_eq!(inner.n_threads(), 1);
                inner.sync();
                hits.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(hits.load(Ordering::Relaxed), 2);
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
