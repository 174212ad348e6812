//! The window pyramid: sessions start on the smallest window that holds them, move up the
//! ladder as they grow by copying their live KV cache into the next window's cache, and
//! (with [`Arm::Predictive`]) have the next window's artifacts compiled in the background
//! before they need them.
//!
//! [`WindowPyramid`] is shared by all sessions of one model and backend: it owns the
//! artifact cache and the background compiles. [`PyramidSession`] is one conversation.
//! The four [`Arm`]s are the strategies `pyramid replay` compares; only the pyramid arms
//! migrate, and none of them ever changes a token.

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyramid_kernels::ThreadPool;
use pyramid_model::{KvCache, KvType, Segment};
use pyramid_runtime::artifact::compile_timed;
use pyramid_runtime::{
    prefill_chunked, ArtifactCache, ArtifactKey, ArtifactShape, Backend, Executable, Prefill,
    RuntimeError, WindowLadder,
};
use serde::Serialize;

use crate::predictor::GrowthPredictor;
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
    pub n_compiles: usize,
    pub compile_ms: f64,
    pub n_migrations: usize,
    pub migration_ms: f64,
    pub migration_bytes: usize,
    pub n_reprefills: usize,
    pub reprefill_ms: f64,
    pub reprefill_tokens: usize,
    /// Sessions waited for an artifact they needed to continue.
    pub n_stalls: usize,
    pub stall_ms: f64,
    pub n_evicted: usize,
    /// Where prefill and decode artifacts really ran, as their backend reports it (the
    /// route audit).
    pub prefill_executed_on: Option<String>,
    pub decode_executed_on: Option<String>,
}

struct State {
    cache: ArtifactCache,
    compiling: HashSet<ArtifactShape>,
    /// Background compiles that failed, kept for the session that needs the shape; it
    /// retries once in the foreground before giving up.
    failed: HashMap<ArtifactShape, String>,
    /// The latest measured prefill compile time, with its window.
    last_prefill_compile: Option<(usize, Duration)>,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere leaves the data consistent here (every update is one assignment).
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
                compiling: HashSet::new(),
                failed: HashMap::new(),
                last_prefill_compile: None,
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

    fn shapes(&self, window: usize) -> [ArtifactShape; 2] {
        [
            ArtifactShape::Prefill {
                chunk: self.config.prefill_chunk,
                window,
            },
            ArtifactShape::Decode { batch: 1, window },
        ]
    }

    /// Whether both artifacts of `window` are compiled or being compiled.
    fn is_prepared(&self, window: usize) -> bool {
        let state = lock(&self.state);
        self.shapes(window)
            .iter()
            .all(|&s| state.compiling.contains(&s) || state.cache.contains(&self.key(s)))
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
        for shape in self.shapes(window) {
            {
                let mut state = lock(&self.state);
                if state.compiling.contains(&shape)
                    || state.failed.contains_key(&shape)
                    || state.cache.contains(&self.key(shape))
                {
                    continue;
                }
                state.compiling.insert(shape);
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
        state.compiling.remove(&shape);
        let published = result.map_err(EngineError::from).and_then(|compiled| {
            let t = compiled.compile_time;
            let device = compiled.executable.executing_device();
            if matches!(shape, ArtifactShape::Prefill { .. }) {
                state.last_prefill_compile = Some((shape.window(), t));
            }
            let exe = state.cache.insert(self.key(shape), compiled)?;
            let mut stats = lock(&self.stats);
            stats.n_compiles += 1;
            stats.compile_ms += t.as_secs_f64() * 1e3;
            match shape {
                ArtifactShape::Prefill { .. } => stats.prefill_executed_on.get_or_insert(device),
                ArtifactShape::Decode { .. } => stats.decode_executed_on.get_or_insert(device),
            };
            Ok(exe)
        });
        if let Err(e) = &published {
            state.failed.insert(shape, e.to_string());
        }
        drop(state);
        self.compiled.notify_all();
        published
    }

    /// The artifact for `shape`: from the cache, from a compile in flight (waiting for
    /// it), or compiled now (retrying once after a failed background compile). Returns it
    /// with the time spent waiting (zero on a hit).
    fn acquire(self: &Arc<Self>, shape: ArtifactShape) -> Result<(Arc<dyn Executable>, Duration)> {
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
            if state.compiling.contains(&shape) {
                state = self.compiled.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.failed.remove(&shape);
            state.compiling.insert(shape);
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

    fn record(&self, update: impl FnOnce(&mut PyramidStats)) {
        update(&mut lock(&self.stats));
    }
}

/// A window's prefill and decode artifacts.
type ArtifactPair = (Arc<dyn Executable>, Arc<dyn Executable>);

/// The artifacts a session runs on: both compiled for its current window.
struct Placement {
    window: usize,
    prefill: Arc<dyn Executable>,
    decode: Arc<dyn Executable>,
    kv: KvCache,
}

/// One conversation on the pyramid.
pub struct PyramidSession {
    pyramid: Arc<WindowPyramid>,
    tokens: Vec<u32>,
    placement: Option<Placement>,
    predictor: GrowthPredictor,
    /// Decode speed, tokens/s (moving average).
    decode_rate: Option<f64>,
    logits: Vec<f32>,
}

impl PyramidSession {
    pub fn new(pyramid: Arc<WindowPyramid>) -> Self {
        Self {
            pyramid,
            tokens: Vec::new(),
            placement: None,
            predictor: GrowthPredictor::default(),
            decode_rate: None,
            logits: Vec::new(),
        }
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The current window, once the session has one.
    pub fn window(&self) -> Option<usize> {
        self.placement.as_ref().map(|p| p.window)
    }

    /// KV bytes reserved (the window) and used (the live positions).
    pub fn kv_bytes(&self) -> (usize, usize) {
        self.placement
            .as_ref()
            .map_or((0, 0), |p| (p.kv.bytes(), p.kv.used_bytes()))
    }

    /// Makes the session hold exactly `context`, running only what follows the longest
    /// prefix already cached (an agent re-sends its whole context each step). Returns the
    /// logits after the last token.
    pub fn prefill(&mut self, pool: &ThreadPool, context: &[u32]) -> Result<&[f32]> {
        if context.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let common = self
            .tokens
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count()
            .min(context.len() - 1);
        self.tokens.truncate(common);
        if let Some(p) = &mut self.placement {
            p.kv.truncate(common);
        }
        self.ensure_room(pool, context.len())?;
        let p = self
            .placement
            .as_mut()
            .expect("ensure_room placed the session");
        let new = &context[common..];
        prefill_chunked(p.prefill.as_ref(), pool, new, &mut p.kv, &mut self.logits)?;
        self.tokens.extend_from_slice(new);
        self.maybe_prepare_next();
        Ok(&self.logits)
    }

    /// Appends one token and returns the logits after it.
    pub fn decode(&mut self, pool: &ThreadPool, token: u32) -> Result<&[f32]> {
        self.ensure_room(pool, self.tokens.len() + 1)?;
        let p = self
            .placement
            .as_mut()
            .expect("ensure_room placed the session");
        let start = Instant::now();
        let tokens = [token];
        let mut segments = [Segment::new(&tokens, &mut p.kv)];
        p.decode.run(pool, &mut segments, &mut self.logits)?;
        let rate = 1.0 / start.elapsed().as_secs_f64().max(1e-9);
        self.decode_rate = Some(self.decode_rate.map_or(rate, |r| 0.8 * r + 0.2 * rate));
        self.tokens.push(token);
        self.maybe_prepare_next();
        Ok(&self.logits)
    }

    /// Tells the predictor a step ended: `tokens` were added in `elapsed`.
    pub fn end_step(&mut self, tokens: usize, elapsed: Duration) {
        self.predictor.observe_step(tokens, elapsed);
        self.maybe_prepare_next();
    }

    /// Places the session on a window holding `needed` positions (plus the generation
    /// reserve where the ladder allows): its first window, or a move up the ladder
    /// (migration or re-prefill, by arm). On failure the session is left as it was.
    fn ensure_room(&mut self, pool: &ThreadPool, needed: usize) -> Result<()> {
        let pyramid = Arc::clone(&self.pyramid);
        let cfg = pyramid.config();
        let ladder = &cfg.ladder;
        let rung = ladder.rung_for(needed)?.max(
            ladder.rung_for(
                needed
                    .saturating_add(cfg.generation_reserve)
                    .min(ladder.largest()),
            )?,
        );
        let Some(current) = &self.placement else {
            let rung = match cfg.arm {
                Arm::Largest => ladder.windows().len() - 1,
                _ => rung,
            };
            let window = ladder.windows()[rung];
            let ((prefill, decode), _) = self.acquire_window(window)?;
            let kv = pyramid
                .backend
                .model()
                .new_kv_cache_of(window, pyramid.kv_type);
            self.placement = Some(Placement {
                window,
                prefill,
                decode,
                kv,
            });
            return Ok(());
        };
        if needed <= current.window {
            return Ok(());
        }
        let window = ladder.windows()[rung];
        let ((prefill, decode), waited) = self.acquire_window(window)?;
        pyramid.record(|s| {
            s.n_stalls += usize::from(!waited.is_zero());
            s.stall_ms += waited.as_secs_f64() * 1e3;
        });
        let start = Instant::now();
        let kv = if cfg.arm == Arm::Reprefill {
            let mut kv = pyramid
                .backend
                .model()
                .new_kv_cache_of(window, pyramid.kv_type);
            let live = &self.tokens[..current.kv.len()];
            if !live.is_empty() {
                prefill_chunked(prefill.as_ref(), pool, live, &mut kv, &mut self.logits)?;
            }
            let n = live.len();
            pyramid.record(|s| {
                s.n_reprefills += 1;
                s.reprefill_ms += start.elapsed().as_secs_f64() * 1e3;
                s.reprefill_tokens += n;
            });
            kv
        } else {
            let kv = current.kv.migrated(window)?;
            let bytes = current.kv.used_bytes();
            pyramid.record(|s| {
                s.n_migrations += 1;
                s.migration_ms += start.elapsed().as_secs_f64() * 1e3;
                s.migration_bytes += bytes;
            });
            kv
        };
        // The old window's artifacts are released here, so the cache may evict them.
        self.placement = Some(Placement {
            window,
            prefill,
            decode,
            kv,
        });
        self.maybe_prepare_next();
        Ok(())
    }

    /// Both artifacts of `window` (prefill, decode) and how long the session waited.
    fn acquire_window(&self, window: usize) -> Result<(ArtifactPair, Duration)> {
        let [prefill_shape, decode_shape] = self.pyramid.shapes(window);
        // Both compile at once when neither is ready; the wait is for the slower.
        self.pyramid.prepare(window);
        let (prefill, w1) = self.pyramid.acquire(prefill_shape)?;
        let (decode, w2) = self.pyramid.acquire(decode_shape)?;
        Ok(((prefill, decode), w1 + w2))
    }

    /// With [`Arm::Predictive`], compiles the next window in the background when the
    /// predictor says the crossing is nearer than that compile.
    fn maybe_prepare_next(&mut self) {
        let cfg = self.pyramid.config();
        if cfg.arm != Arm::Predictive {
            return;
        }
        let Some(p) = &self.placement else { return };
        let Some(&next) = cfg.ladder.windows().iter().find(|&&w| w > p.window) else {
            return;
        };
        if self.pyramid.is_prepared(next) {
            return;
        }
        let remaining = p.window - self.tokens.len();
        let expected = self.pyramid.expected_compile(next);
        if self
            .predictor
            .should_prepare(remaining, self.decode_rate, expected, cfg.margin)
        {
            self.pyramid.prepare(next);
        }
    }
}

impl pyramid_runtime::Decoder for PyramidSession {
    type Error = EngineError;

    fn prefill_prompt(&mut self, pool: &ThreadPool, prompt: &[u32]) -> Result<Prefill> {
        // What `prefill` keeps: the longest common prefix, leaving one token to run.
        let n_reused = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len().saturating_sub(1));
        let logits = self.prefill(pool, prompt)?.to_vec();
        Ok(Prefill {
            logits,
            n_reused,
            n_computed: prompt.len() - n_reused,
        })
    }

    fn decode_token(&mut self, pool: &ThreadPool, token: u32) -> Result<Vec<f32>> {
        Ok(self.decode(pool, token)?.to_vec())
    }

    fn remaining_context(&self) -> usize {
        self.pyramid
            .config()
            .ladder
            .largest()
            .saturating_sub(self.tokens.len())
    }
}
