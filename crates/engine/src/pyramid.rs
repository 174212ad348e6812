//! The window pyramid: sessions start on the smallest window that holds them, move up the
//! ladder as they grow by migrating their KV cache to the next window (a reserved cache
//! only changes its bound; a compact one copies its live rows), and
//! (with [`Arm::Predictive`]) have the next window's artifacts compiled in the background
//! before they need them.
//!
//! [`WindowPyramid`] is shared by all sessions of one model and backend: it owns the
//! artifact cache and the background compiles; the engine ([`crate::Engine`]) asks it for
//! artifacts and moves sessions between windows. The four [`Arm`]s are the strategies
//! `pyramid replay` compares (the engine's window policy); only the pyramid arms migrate,
//! and none of them ever changes a token.

use std::collections::{HashMap, HashSet};
use std::ops::RangeInclusive;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyramid_model::KvType;
use pyramid_runtime::artifact::compile_timed;
use pyramid_runtime::{
    ArtifactCache, ArtifactKey, ArtifactShape, Backend, Executable, RuntimeError, WindowLadder,
};
use serde::Serialize;

use crate::observe::{ArtifactState, ArtifactView, Happening, HappeningLog, RungView, What};
use crate::{EngineError, Result};

/// How a session's window follows its growth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    /// One artifact at the largest window from the start.
    Largest,
    /// The smallest window that fits; on overflow, compile the next and re-prefill into it.
    Reprefill,
    /// The pyramid, compiling the next window when the session reaches it.
    OnDemand,
    /// The pyramid, compiling the next window ahead of the predicted crossing.
    Predictive,
}

impl Arm {
    pub const ALL: [Arm; 4] = [Arm::Largest, Arm::Reprefill, Arm::OnDemand, Arm::Predictive];

    pub fn name(self) -> &'static str {
        match self {
            Arm::Largest => "largest",
            Arm::Reprefill => "reprefill",
            Arm::OnDemand => "on-demand",
            Arm::Predictive => "predictive",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }
}

#[derive(Debug, Clone)]
pub struct PyramidConfig {
    pub ladder: WindowLadder,
    /// Tokens per prefill run (the last chunk is padded).
    pub prefill_chunk: usize,
    pub arm: Arm,
    /// Positions kept free for generation when a session picks its first window.
    pub generation_reserve: usize,
    /// Memory the artifact cache may hold.
    pub artifact_budget: usize,
    /// Extra lead time for a predicted compile.
    pub margin: Duration,
    /// Assumed compile time before any has been measured.
    pub first_compile_estimate: Duration,
}

/// What the pyramid did, summed over all its sessions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PyramidStats {
    /// Artifacts compiled, and the time it took.
    pub n_compiles: usize,
    pub compile_ms: f64,
    /// Artifacts the backend loaded from its store of compiled artifacts instead (the
    /// compiles a store kept across starts avoided), and the time loading took.
    pub n_store_loads: usize,
    pub store_load_ms: f64,
    pub n_migrations: usize,
    pub migration_ms: f64,
    /// Bytes migrations copied: 0 for caches that reserve their largest window.
    pub migration_bytes: usize,
    /// Live KV bytes of the sessions that migrated (what a copy would move).
    pub migration_live_bytes: usize,
    pub n_reprefills: usize,
    pub reprefill_ms: f64,
    pub reprefill_tokens: usize,
    /// New conversations that copied the prefix they share with a cached one, leaving it
    /// whole, and the KV bytes those copies moved.
    pub n_forks: usize,
    pub fork_bytes: usize,
    /// Sessions waited for an artifact they needed to continue.
    pub n_stalls: usize,
    pub stall_ms: f64,
    pub n_evicted: usize,
    /// Where prefill and decode artifacts really ran, as their backend reports it (the
    /// route audit).
    pub prefill_executed_on: Option<String>,
    pub decode_executed_on: Option<String>,
}

impl PyramidStats {
    /// Effective copy speed of migrations, GB/s; `None` when they copied nothing.
    pub fn migration_gb_per_s(&self) -> Option<f64> {
        (self.migration_bytes > 0 && self.migration_ms > 0.0)
            .then(|| self.migration_bytes as f64 / (self.migration_ms * 1e6))
    }
}

struct State {
    cache: ArtifactCache,
    /// Compiles in flight, with when each started.
    compiling: HashMap<ArtifactShape, Instant>,
    /// Every shape compiled so far: those no longer in the cache were evicted.
    compiled: HashSet<ArtifactShape>,
    /// Compiled shapes whose eviction has been recorded (until compiled again).
    evicted: HashSet<ArtifactShape>,
    /// Compiles and evictions, for a watcher.
    happenings: HappeningLog,
    /// Background compiles that failed, kept for the session that needs the shape; it
    /// retries once in the foreground before giving up.
    failed: HashMap<ArtifactShape, String>,
    /// The latest measured prefill compile time, with its window.
    last_prefill_compile: Option<(usize, Duration)>,
    /// How each shape's latest artifact was made.
    builds: HashMap<ArtifactShape, Build>,
}

/// How an artifact was made: compiled, or loaded from the backend's store, and how long
/// it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Build {
    pub took: Duration,
    pub loaded: bool,
}

pub struct WindowPyramid {
    backend: Arc<dyn Backend>,
    model_id: u64,
    kv_type: KvType,
    config: PyramidConfig,
    state: Mutex<State>,
    compiled: Condvar,
    stats: Mutex<PyramidStats>,
    background: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for WindowPyramid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowPyramid")
            .field("device", &self.backend.device())
            .field("ladder", &self.config.ladder)
            .finish_non_exhaustive()
    }
}

/// Locks `m` even after a panic elsewhere: every holder's update is one assignment or
/// one push or removal, so the data stays consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl WindowPyramid {
    pub fn new(
        backend: Arc<dyn Backend>,
        model_id: u64,
        kv_type: KvType,
        config: PyramidConfig,
    ) -> Result<Arc<Self>> {
        let largest = config.ladder.largest();
        if config.prefill_chunk == 0 || config.prefill_chunk > largest {
            return Err(EngineError::BadConfig(format!(
                "the prefill chunk must be between 1 and the largest window ({largest}) tokens, got {}",
                config.prefill_chunk
            )));
        }
        Ok(Arc::new(Self {
            state: Mutex::new(State {
                cache: ArtifactCache::new(config.artifact_budget),
                compiling: HashMap::new(),
                compiled: HashSet::new(),
                evicted: HashSet::new(),
                happenings: HappeningLog::default(),
                failed: HashMap::new(),
                last_prefill_compile: None,
                builds: HashMap::new(),
            }),
            backend,
            model_id,
            kv_type,
            config,
            compiled: Condvar::new(),
            stats: Mutex::new(PyramidStats::default()),
            background: Mutex::new(Vec::new()),
        }))
    }

    pub fn config(&self) -> &PyramidConfig {
        &self.config
    }

    pub fn stats(&self) -> PyramidStats {
        let mut stats = lock(&self.stats).clone();
        stats.n_evicted = lock(&self.state).cache.n_evicted();
        stats
    }

    fn key(&self, shape: ArtifactShape) -> ArtifactKey {
        ArtifactKey {
            model_id: self.model_id,
            device: self.backend.device(),
            precision: self.backend.model().precision,
            kv_type: self.kv_type,
            shape,
        }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    /// The artifacts every session on `window` holds: prefill and one-sequence decode.
    pub fn shapes(&self, window: usize) -> [ArtifactShape; 2] {
        [
            ArtifactShape::Prefill {
                chunk: self.config.prefill_chunk,
                window,
            },
            ArtifactShape::Decode { batch: 1, window },
        ]
    }

    /// Whether both artifacts of `window` are compiled or being compiled.
    pub fn is_prepared(&self, window: usize) -> bool {
        let state = lock(&self.state);
        self.shapes(window)
            .iter()
            .all(|&s| state.compiling.contains_key(&s) || state.cache.contains(&self.key(s)))
    }

    /// The expected compile time of `window`'s artifacts: the latest measurement scaled
    /// by window size (buffers grow with it), or the configured first estimate.
    pub fn expected_compile(&self, window: usize) -> Duration {
        match lock(&self.state).last_prefill_compile {
            Some((w, t)) => t.mul_f64(window as f64 / w as f64) * 2,
            None => self.config.first_compile_estimate,
        }
    }

    /// Starts compiling `window`'s artifacts in the background: those not compiled, not
    /// in flight, and not already failed (a failure is retried by the session needing it).
    pub fn prepare(self: &Arc<Self>, window: usize) {
        self.prepare_shapes(&self.shapes(window));
    }

    /// Starts compiling `shapes` in the background, as [`WindowPyramid::prepare`] does.
    pub fn prepare_shapes(self: &Arc<Self>, shapes: &[ArtifactShape]) {
        for &shape in shapes {
            {
                let mut state = lock(&self.state);
                if state.compiling.contains_key(&shape)
                    || state.failed.contains_key(&shape)
                    || state.cache.contains(&self.key(shape))
                {
                    continue;
                }
                state.start_compile(shape);
            }
            let pyramid = Arc::clone(self);
            let handle = std::thread::spawn(move || {
                // The artifact stays in the cache; a failure stays in `failed`.
                let _ = pyramid.compile_and_publish(shape);
            });
            lock(&self.background).push(handle);
        }
    }

    /// Waits for every background compile started so far.
    pub fn join_background(&self) {
        let handles = std::mem::take(&mut *lock(&self.background));
        for h in handles {
            // A compile panic is already recorded as a failure of its shape.
            let _ = h.join();
        }
    }

    /// Compiles `shape` (already marked as compiling), publishes the result, wakes the
    /// waiters, and returns the artifact. A panicking backend counts as a failed compile,
    /// so nobody waits forever.
    fn compile_and_publish(&self, shape: ArtifactShape) -> Result<Arc<dyn Executable>> {
        let result = catch_unwind(AssertUnwindSafe(|| {
            compile_timed(self.backend.as_ref(), shape)
        }))
        .unwrap_or_else(|_| {
            Err(RuntimeError::BadShape {
                shape,
                reason: "the backend panicked while compiling".to_string(),
            })
        });
        let mut state = lock(&self.state);
        let started = state.compiling.remove(&shape);
        let took = started.map_or(Duration::ZERO, |t| t.elapsed());
        let n_evicted = state.cache.n_evicted();
        let published = result.map_err(EngineError::from).and_then(|compiled| {
            let t = compiled.compile_time;
            let device = compiled.executable.executing_device();
            let loaded = compiled.executable.loaded_from_store();
            // A load from the store says nothing of how long the next compile takes.
            if matches!(shape, ArtifactShape::Prefill { .. }) && !loaded {
                state.last_prefill_compile = Some((shape.window(), t));
            }
            state.builds.insert(shape, Build { took: t, loaded });
            let exe = state.cache.insert(self.key(shape), compiled)?;
            state.compiled.insert(shape);
            state.evicted.remove(&shape);
            let mut stats = lock(&self.stats);
            if loaded {
                stats.n_store_loads += 1;
                stats.store_load_ms += t.as_secs_f64() * 1e3;
            } else {
                stats.n_compiles += 1;
                stats.compile_ms += t.as_secs_f64() * 1e3;
            }
            match shape {
                ArtifactShape::Prefill { .. } => {
                    stats.prefill_executed_on.get_or_insert(device);
                }
                ArtifactShape::Decode { .. } => {
                    stats.decode_executed_on.get_or_insert(device);
                }
                ArtifactShape::Mixed { .. } => {
                    stats.prefill_executed_on.get_or_insert(device.clone());
                    stats.decode_executed_on.get_or_insert(device);
                }
            }
            Ok(exe)
        });
        if let Err(e) = &published {
            state.failed.insert(shape, e.to_string());
        }
        state.happenings.record(What::CompileFinished {
            shape,
            took,
            ok: published.is_ok(),
        });
        if state.cache.n_evicted() != n_evicted {
            state.record_evictions(|s| self.key(s));
        }
        drop(state);
        self.compiled.notify_all();
        published
    }

    /// The artifact for `shape`: from the cache, from a compile in flight (waiting for
    /// it), or compiled now (retrying once after a failed background compile). Returns it
    /// with the time spent waiting (zero on a hit).
    pub fn acquire(
        self: &Arc<Self>,
        shape: ArtifactShape,
    ) -> Result<(Arc<dyn Executable>, Duration)> {
        let start = Instant::now();
        let key = self.key(shape);
        let mut state = lock(&self.state);
        let mut waited = false;
        loop {
            if let Some(exe) = state.cache.get(&key) {
                let wait = if waited {
                    start.elapsed()
                } else {
                    Duration::ZERO
                };
                return Ok((exe, wait));
            }
            waited = true;
            if state.compiling.contains_key(&shape) {
                state = self.compiled.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.failed.remove(&shape);
            state.start_compile(shape);
            drop(state);
            let exe = self
                .compile_and_publish(shape)
                .map_err(|e| EngineError::Compile {
                    shape,
                    reason: e.to_string(),
                })?;
            lock(&self.state).failed.remove(&shape);
            return Ok((exe, start.elapsed()));
        }
    }

    /// The artifact for `shape` if it is compiled: never waits, never compiles.
    pub fn get_ready(&self, shape: ArtifactShape) -> Option<Arc<dyn Executable>> {
        lock(&self.state).cache.get(&self.key(shape))
    }

    /// The prefill artifacts of `shape`'s chunk, ready now, on the ladder's smaller
    /// windows a prefill whose chunks need `needs` positions steps through
    /// ([`pyramid_runtime::prefill_stepping`]), ascending: those holding the first
    /// chunk's need, up to the first holding the last's. Only those are looked up, so
    /// only they count as used in the artifact cache; nothing is compiled for this.
    pub fn ready_prefills_below(
        &self,
        shape: ArtifactShape,
        needs: RangeInclusive<usize>,
    ) -> Vec<Arc<dyn Executable>> {
        let ArtifactShape::Prefill { chunk, window } = shape else {
            return Vec::new();
        };
        let windows = self.config.ladder.windows();
        let past_last = windows.partition_point(|&w| w < *needs.end());
        windows[..(past_last + 1).min(windows.len())]
            .iter()
            .filter(|&&w| w >= *needs.start() && w < window)
            .filter_map(|&w| self.get_ready(ArtifactShape::Prefill { chunk, window: w }))
            .collect()
    }

    /// Both artifacts of `window`, if both are compiled.
    pub fn window_ready(&self, window: usize) -> Option<ArtifactPair> {
        let [prefill, decode] = self.shapes(window);
        Some((self.get_ready(prefill)?, self.get_ready(decode)?))
    }

    /// Both artifacts of `window` (compiling them now if nobody has started) and how long
    /// the caller waited for them.
    pub fn acquire_window(self: &Arc<Self>, window: usize) -> Result<(ArtifactPair, Duration)> {
        let [prefill_shape, decode_shape] = self.shapes(window);
        // Both compile at once when neither is ready; the wait is for the slower.
        self.prepare(window);
        let (prefill, w1) = self.acquire(prefill_shape)?;
        let (decode, w2) = self.acquire(decode_shape)?;
        Ok(((prefill, decode), w1 + w2))
    }

    /// A compile of a shape failed (in the background or now): the error, if any.
    pub fn failure(&self, window: usize) -> Option<String> {
        let state = lock(&self.state);
        self.shapes(window)
            .iter()
            .find_map(|s| state.failed.get(s).cloned())
    }

    /// Compiled artifacts by window: `(window, count, bytes)`, smallest window first.
    pub fn resident(&self) -> Vec<(usize, usize, usize)> {
        let state = lock(&self.state);
        let mut by_window: Vec<(usize, usize, usize)> = Vec::new();
        for (shape, bytes) in state.cache.entries() {
            let w = shape.window();
            match by_window.iter_mut().find(|e| e.0 == w) {
                Some(e) => {
                    e.1 += 1;
                    e.2 += bytes;
                }
                None => by_window.push((w, 1, bytes)),
            }
        }
        by_window.sort_unstable();
        by_window
    }

    /// How every shape built so far was made (its latest build), in shape order.
    pub fn builds(&self) -> Vec<(ArtifactShape, Build)> {
        let state = lock(&self.state);
        let mut builds: Vec<(ArtifactShape, Build)> =
            state.builds.iter().map(|(&s, &b)| (s, b)).collect();
        builds.sort_by_key(|&(s, _)| (s.window(), shape_order(s)));
        builds
    }

    /// Background compiles in flight.
    pub fn n_compiling(&self) -> usize {
        lock(&self.state).compiling.len()
    }

    pub(crate) fn record(&self, update: impl FnOnce(&mut PyramidStats)) {
        update(&mut lock(&self.stats));
    }

    /// Starts recording compiles and evictions for a watcher.
    pub(crate) fn watch(&self) {
        lock(&self.state).happenings.enable();
    }

    /// Moves the compiles and evictions since the last call into `out`.
    pub(crate) fn drain_happenings(&self, out: &mut Vec<Happening>) {
        lock(&self.state).happenings.drain_into(out);
    }

    /// The ladder's rungs with every artifact shape known on each (resident, compiling
    /// or evicted), ordered by kind and rows, and the bytes the cache holds.
    pub(crate) fn ladder(&self) -> (Vec<RungView>, usize) {
        let state = lock(&self.state);
        let resident: HashMap<ArtifactShape, usize> = state.cache.entries().collect();
        let mut rungs: Vec<RungView> = self
            .config
            .ladder
            .windows()
            .iter()
            .map(|&window| RungView {
                window,
                artifacts: Vec::new(),
            })
            .collect();
        let shapes = state
            .compiled
            .iter()
            .chain(state.compiling.keys())
            .chain(resident.keys());
        let mut seen = HashSet::new();
        for &shape in shapes {
            if !seen.insert(shape) {
                continue;
            }
            let view = match (resident.get(&shape), state.compiling.get(&shape)) {
                (Some(&bytes), _) => ArtifactView {
                    shape,
                    state: ArtifactState::Resident,
                    compiling_for: None,
                    bytes: Some(bytes),
                },
                (None, Some(since)) => ArtifactView {
                    shape,
                    state: ArtifactState::Compiling,
                    compiling_for: Some(since.elapsed()),
                    bytes: None,
                },
                (None, None) => ArtifactView {
                    shape,
                    state: ArtifactState::Evicted,
                    compiling_for: None,
                    bytes: None,
                },
            };
            let window = shape.window();
            let i = match rungs.iter().position(|r| r.window == window) {
                Some(i) => i,
                None => {
                    rungs.push(RungView {
                        window,
                        artifacts: Vec::new(),
                    });
                    rungs.len() - 1
                }
            };
            rungs[i].artifacts.push(view);
        }
        rungs.sort_by_key(|r| r.window);
        for rung in &mut rungs {
            rung.artifacts.sort_by_key(|a| shape_order(a.shape));
        }
        (rungs, state.cache.bytes())
    }
}

/// Prefill, decode, mixed; fewer rows first.
fn shape_order(shape: ArtifactShape) -> (u8, usize) {
    match shape {
        ArtifactShape::Prefill { chunk, .. } => (0, chunk),
        ArtifactShape::Decode { batch, .. } => (1, batch),
        ArtifactShape::Mixed { rows, .. } => (2, rows),
    }
}

impl State {
    fn start_compile(&mut self, shape: ArtifactShape) {
        self.compiling.insert(shape, Instant::now());
        self.happenings.record(What::CompileStarted { shape });
    }

    /// Records the compiled shapes the cache no longer holds whose eviction is not
    /// recorded yet.
    fn record_evictions(&mut self, key: impl Fn(ArtifactShape) -> ArtifactKey) {
        let gone: Vec<ArtifactShape> = self
            .compiled
            .iter()
            .copied()
            .filter(|&s| !self.evicted.contains(&s) && !self.cache.contains(&key(s)))
            .collect();
        for shape in gone {
            self.evicted.insert(shape);
            self.happenings.record(What::ArtifactEvicted { shape });
        }
    }
}

/// A window's prefill and decode artifacts.
pub type ArtifactPair = (Arc<dyn Executable>, Arc<dyn Executable>);
