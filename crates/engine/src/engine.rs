//! The engine core every entry point drives (`run`, `chat`, `serve`, `bench`, `replay`):
//! continuous batching on the window pyramid, on any backend route.
//!
//! [`Engine`] composes three parts and owns nothing else of substance:
//! - the [`Scheduler`] decides each step ([`Schedule`]) and applies its results,
//!   sampling and ending sequences ([`Event`]s);
//! - the [`Executor`] places and migrates sessions and runs the passes on the route's
//!   artifacts ([`Executed`]);
//! - the session writer keeps conversations on disk and reads them back.
//!
//! One [`Engine::step`] is schedule → execute → update with plain data between them, as
//! in vLLM v1. A request's tokens do not depend on what else runs beside it: every row
//! of a pass is computed on its own.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pyramid_kernels::ThreadPool;
use pyramid_model::{KvCache, Pooling};
use pyramid_runtime::{ArtifactShape, Backend, WindowLadder};
use serde::Serialize;

use crate::config::EngineConfig;
use crate::executor::Executor;
use crate::kv::KvAllocator;
use crate::observe::{EngineView, Happening, What};
use crate::persist::{Found, PersistStats, SessionWriter};
use crate::pyramid::{ArtifactPair, Build, PyramidStats, WindowPyramid};
use crate::request::{Event, FinishReason, Request, RequestId, Timings, Usage};
use crate::scheduler::{Artifacts, PreemptionStats, Scheduler, Stored, StoredPrefixes};
use crate::session::{Placement, Session};
use crate::session_store::{load_session, read_header, save_session, SessionIdentity, StoreError};
use crate::speculate::DraftStats;
use crate::step::{Schedule, StepSummary};
use crate::{EngineError, Result};

/// The engine's state, for `/metrics` and reports.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineStats {
    #[serde(flatten)]
    pub pyramid: PyramidStats,
    pub running: usize,
    pub waiting: usize,
    /// Sequences paused for more urgent ones (with their KV, or swapped out).
    pub paused: usize,
    /// Queued and paused requests by priority: `(priority, count)`, most urgent first.
    pub waiting_by_priority: Vec<(i32, usize)>,
    #[serde(flatten)]
    pub preemption: PreemptionStats,
    #[serde(flatten)]
    pub persisted: PersistStats,
    pub cached_sessions: usize,
    /// KV bytes of running, paused and cached sessions: reserved (their windows) and used.
    pub kv_bytes_reserved: usize,
    pub kv_bytes_used: usize,
    /// Compiled artifacts by window: `(window, count, bytes)`.
    pub artifacts: Vec<(usize, usize, usize)>,
    /// How each shape's latest artifact was made (compiled or loaded from the backend's
    /// store), in window and shape order.
    #[serde(skip)]
    pub builds: Vec<(ArtifactShape, Build)>,
    pub compiling: usize,
    /// Drafts verified and accepted, and passes that sampled, over every request.
    pub speculative: DraftStats,
}

pub struct Engine {
    /// The setup (the scheduler keeps its own copy): the ladder restores read.
    config: EngineConfig,
    scheduler: Scheduler,
    executor: Executor,
    sessions: SessionWriter,
    /// Tells session files of other setups apart.
    model_id: u64,
    /// What the last step ran.
    summary: StepSummary,
    /// Whether a watcher follows the engine's happenings ([`Engine::watch`]).
    watched: bool,
}

impl Engine {
    /// An engine over `backend`; `model_id` tells artifacts of different files apart.
    pub fn new(
        backend: Arc<dyn Backend>,
        model_id: u64,
        kv_type: pyramid_model::KvType,
        config: EngineConfig,
    ) -> Result<Self> {
        if config.max_batch == 0 || config.max_sessions == 0 {
            return Err(EngineError::BadConfig(
                "max_batch and max_sessions must be at least 1".to_string(),
            ));
        }
        let model = Arc::clone(backend.model());
        let pyramid = WindowPyramid::new(backend, model_id, kv_type, config.pyramid.clone())?;
        let mixed = if pyramid.backend().runs_mixed_passes() && !config.static_shapes {
            // Every decoding sequence may verify a draft beside its next token.
            let per_sequence = 1 + config.speculative.max_draft;
            let shape = ArtifactShape::Mixed {
                rows: config.pyramid.prefill_chunk + config.max_batch * per_sequence,
                batch: config.max_batch,
                logits: config.max_batch * per_sequence,
                window: config.pyramid.ladder.largest(),
            };
            Some(pyramid.acquire(shape)?.0)
        } else {
            None
        };
        let kv = KvAllocator::new(&model.config, kv_type, config.pyramid.ladder.largest());
        let executor = Executor::new(
            Arc::clone(&pyramid),
            mixed,
            kv.clone(),
            config.pyramid.prefill_chunk,
        );
        let artifacts: Arc<dyn Artifacts> = pyramid;
        let scheduler = Scheduler::new(
            config.clone(),
            executor.runs_mixed(),
            artifacts,
            kv,
            &model.config,
        );
        Ok(Self {
            config,
            scheduler,
            executor,
            sessions: SessionWriter::default(),
            model_id,
            summary: StepSummary::default(),
            watched: false,
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn pyramid(&self) -> &Arc<WindowPyramid> {
        self.executor.pyramid()
    }

    /// Whether requests asking for speculation get it: drafts are on
    /// ([`crate::SpeculativeConfig::max_draft`]) and the route runs mixed passes, which
    /// verify them.
    pub fn speculates(&self) -> bool {
        self.config().speculative.max_draft > 0 && self.executor.runs_mixed()
    }

    /// Whether embedding requests can run: their passes return hidden states, which
    /// only mixed passes do (static artifacts return logits).
    pub fn embeds(&self) -> bool {
        self.executor.runs_mixed()
    }

    /// The largest context a request can reach.
    pub fn max_context(&self) -> usize {
        self.config().pyramid.ladder.largest()
    }

    /// Queues `request`. One that can never run (an empty prompt, beyond the largest
    /// window, a first window beyond the KV budget, sampling settings refused) fails at
    /// once, with the next step's events; other errors come when it is admitted.
    pub fn add_request(&mut self, request: Request) {
        self.scheduler.add_request(request);
    }

    /// Whether anything is queued, running or paused (or an event is to be reported).
    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    pub fn n_waiting(&self) -> usize {
        self.scheduler.n_waiting()
    }

    /// Ends a request now (a client went away, a stop string matched). Its session is
    /// kept for reuse. Returns its usage, or `None` if the engine does not hold it.
    pub fn abort(&mut self, id: RequestId) -> Option<Usage> {
        let usage = self.scheduler.abort(id);
        if usage.is_some() {
            self.scheduler.record(What::Finished {
                id,
                reason: Some(FinishReason::Aborted),
            });
        }
        self.write_evicted();
        usage
    }

    /// Decides the next step without running it (what [`Engine::step`] does first).
    pub fn schedule(&mut self) -> Schedule {
        let mut stored = Restorer {
            sessions: &mut self.sessions,
            executor: &self.executor,
            ladder: &self.config.pyramid.ladder,
        };
        let schedule = self.scheduler.schedule(&mut stored);
        self.write_evicted();
        schedule
    }

    /// One step: schedule, execute, update. Blocks only when every runnable sequence
    /// waits for an artifact compile, and then only until it is ready; a compile that
    /// failed in the background is retried once in the foreground before the sequences
    /// needing it fail.
    pub fn step(&mut self, pool: &ThreadPool) -> Vec<Event> {
        self.take_loaded(false);
        let mut schedule = self.schedule();
        if schedule.is_idle() && schedule.stalled.is_empty() && self.sessions.is_loading() {
            // Everything runnable waits for a file: wait for the session thread.
            self.take_loaded(true);
            schedule = self.schedule();
        }
        self.scheduler.mark_stalled(&schedule);
        let pyramid = self.executor.pyramid();
        let mut wait_for: Vec<usize> = schedule
            .stalled
            .iter()
            .map(|&(_, w)| w)
            .filter(|&w| pyramid.failure(w).is_some())
            .collect();
        if schedule.is_idle() {
            wait_for.extend(schedule.stalled.first().map(|&(_, w)| w));
        }
        wait_for.sort_unstable();
        wait_for.dedup();
        if !wait_for.is_empty() {
            for window in wait_for {
                if let Err(e) = self.executor.wait_for_window(window) {
                    self.scheduler.fail_stalled_on(window, &schedule, e);
                }
            }
            schedule = self.schedule();
            self.scheduler.mark_stalled(&schedule);
        }
        if schedule.is_idle() {
            // Still nothing runs: what waits with its artifacts ready waits for memory
            // that no running sequence will free.
            self.scheduler.resolve_memory_stall(&schedule);
        }
        if self.watched {
            self.scheduler.record_moves(&schedule);
        }
        let batch = self.scheduler.batch(&schedule);
        let mut executed = self.executor.execute(pool, &schedule, batch);
        self.summary = std::mem::take(&mut executed.summary);
        let events = self.scheduler.update(pool, &schedule, &mut executed);
        if self.watched {
            self.record_events(&events);
        }
        self.executor.recycle(executed);
        for window in self.scheduler.take_compile_ahead() {
            self.executor.pyramid().prepare(window);
        }
        self.write_evicted();
        events
    }

    /// What the last step ran.
    pub fn last_step(&self) -> &StepSummary {
        &self.summary
    }

    /// Starts recording [`Happening`]s for a watcher, who drains them with
    /// [`Engine::drain_happenings`]. Until then nothing is recorded.
    pub fn watch(&mut self) {
        self.watched = true;
        self.scheduler.watch();
        self.executor.pyramid().watch();
    }

    /// Moves what happened since the last call into `out`, oldest first: the
    /// scheduler's admissions, pauses, forks, swaps, moves and endings, and the
    /// pyramid's compiles and evictions (which run in the background).
    pub fn drain_happenings(&mut self, out: &mut Vec<Happening>) {
        let start = out.len();
        self.scheduler.drain_happenings(out);
        self.executor.pyramid().drain_happenings(out);
        out[start..].sort_by_key(|h| h.at);
    }

    /// The engine now: its sessions, the window ladder's artifacts, and memory against
    /// the budgets. Allocates; meant for a watcher a few times a second, not per token.
    pub fn observe(&self) -> EngineView {
        let mut sessions = Vec::new();
        self.scheduler.observe(&mut sessions);
        let (ladder, artifact_bytes) = self.executor.pyramid().ladder();
        let s = self.scheduler.stats();
        EngineView {
            sessions,
            ladder,
            kv_used_bytes: s.kv_bytes_used,
            kv_reserved_bytes: s.kv_bytes_reserved,
            kv_budget_bytes: self.config.kv_budget,
            artifact_bytes,
            artifact_budget_bytes: self.config.pyramid.artifact_budget,
        }
    }

    /// Admissions and endings, from the step's events.
    fn record_events(&mut self, events: &[Event]) {
        for event in events {
            let what = match *event {
                Event::Started { id, cached_tokens } => What::Admitted { id, cached_tokens },
                Event::Finished { id, reason, .. } => What::Finished {
                    id,
                    reason: Some(reason),
                },
                Event::Failed { id, .. } => What::Finished { id, reason: None },
                Event::Token { .. } | Event::Embedding { .. } => continue,
            };
            self.scheduler.record(what);
        }
    }

    pub fn stats(&self) -> EngineStats {
        let s = self.scheduler.stats();
        let pyramid = self.executor.pyramid();
        EngineStats {
            pyramid: pyramid.stats(),
            running: s.running,
            waiting: s.waiting,
            paused: s.paused,
            waiting_by_priority: s.waiting_by_priority,
            preemption: s.preemption,
            persisted: self.sessions.stats(),
            cached_sessions: s.cached_sessions,
            kv_bytes_reserved: s.kv_bytes_reserved,
            kv_bytes_used: s.kv_bytes_used,
            artifacts: pyramid.resident(),
            builds: pyramid.builds(),
            compiling: pyramid.n_compiling(),
            speculative: s.speculative,
        }
    }

    /// Runs `request` to its end, calling `on_token` with each sampled token;
    /// `on_token` returning `false` aborts it. For drivers with one request at a time
    /// (`run`, `chat`, `replay`); other requests' events are not reported.
    pub fn generate(
        &mut self,
        pool: &ThreadPool,
        request: Request,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Completion> {
        let id = request.id;
        self.add_request(request);
        let mut tokens = Vec::new();
        loop {
            for event in self.step(pool).into_iter().filter(|e| e.id() == id) {
                match event {
                    Event::Token { token, .. } => {
                        tokens.push(token);
                        if !on_token(token) {
                            let usage = self.abort(id).unwrap_or_default();
                            return Ok(Completion {
                                tokens,
                                finish_reason: FinishReason::Aborted,
                                usage,
                                timings: Timings::default(),
                            });
                        }
                    }
                    Event::Finished {
                        reason,
                        usage,
                        timings,
                        ..
                    } => {
                        return Ok(Completion {
                            tokens,
                            finish_reason: reason,
                            usage,
                            timings,
                        })
                    }
                    Event::Failed { error, .. } => return Err(error),
                    Event::Started { .. } | Event::Embedding { .. } => {}
                }
            }
            if !self.has_work() {
                // Every path ends a request with an event; this guards against a loop.
                return Err(EngineError::Pass(format!(
                    "request {id} left the engine without finishing"
                )));
            }
        }
    }

    /// The embeddings of `texts`, pooled as `pooling` says, each request `first_id + i`
    /// (ids the engine does not hold), batched like any prefill. For callers that own the
    /// engine alone (`pyramid bench`, tests); the server steps it with other requests.
    pub fn embed(
        &mut self,
        pool: &ThreadPool,
        first_id: RequestId,
        texts: Vec<Vec<u32>>,
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>> {
        let n = texts.len();
        for (i, text) in texts.into_iter().enumerate() {
            self.add_request(Request::embedding(first_id + i as u64, text, pooling));
        }
        let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
        let mut done = 0;
        while done < n {
            if !self.has_work() {
                return Err(EngineError::Pass(
                    "an embedding left the engine unfinished".into(),
                ));
            }
            for event in self.step(pool) {
                let slot = event.id().checked_sub(first_id).map(|i| i as usize);
                match (event, slot) {
                    (Event::Embedding { embedding, .. }, Some(i)) if i < n => {
                        out[i] = Some(embedding);
                        done += 1;
                    }
                    (Event::Failed { error, .. }, Some(i)) if i < n => return Err(error),
                    _ => {}
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// What a session file must match to be resumed here: the model file, the weights'
    /// precision and the route that computes the KV, the KV type and shape.
    pub fn session_identity(&self) -> SessionIdentity {
        let pyramid = self.executor.pyramid();
        let backend = pyramid.backend();
        let model = backend.model();
        let precision = format!("{}@{}", model.precision.name(), backend.device());
        SessionIdentity::new(self.model_id, &precision, pyramid.kv_type(), &model.config)
    }

    /// Keeps conversations in `dir` (indexed now; files of other setups are skipped with
    /// a warning), within `disk_budget` bytes if given.
    pub fn open_session_store(
        &mut self,
        dir: &Path,
        disk_budget: Option<u64>,
    ) -> std::result::Result<(), StoreError> {
        let identity = self.session_identity();
        self.sessions.open(dir, identity, disk_budget)
    }

    /// Messages about skipped or unwritable session files since the last call, for the
    /// driver to show.
    pub fn take_warnings(&mut self) -> Vec<String> {
        self.sessions.take_warnings()
    }

    /// Writes every cached conversation to the store (at shutdown); returns how many
    /// were written.
    pub fn save_cached(&mut self) -> usize {
        let before = self.sessions.stats().n_saved;
        for session in self.scheduler.cache_mut().drain() {
            self.sessions.save(session);
        }
        self.sessions.flush();
        self.sessions.stats().n_saved - before
    }

    /// Waits until every conversation handed to the session writer is on disk.
    pub fn flush_sessions(&mut self) {
        self.sessions.flush();
    }

    /// Puts the conversation in the session file at `path` (`pyramid chat --session`)
    /// into the prefix cache; returns its tokens and the note saved with it.
    pub fn import_session_file(
        &mut self,
        path: &Path,
    ) -> std::result::Result<(Vec<u32>, Vec<u8>), StoreError> {
        let header = read_header(path)?;
        let (window, artifacts, kv) = restore_target(
            &self.executor,
            &self.config.pyramid.ladder,
            header.tokens.len(),
        )
        .map_err(|reason| StoreError::BadCache {
            path: path.to_path_buf(),
            reason,
        })?;
        let mut stored = load_session(path, &self.session_identity(), kv)?;
        let tokens = stored.tokens.clone();
        let note = std::mem::take(&mut stored.note);
        self.sessions.record_loaded(tokens.len());
        let placement = Placement {
            window,
            kv: stored.kv,
            artifacts,
        };
        self.scheduler
            .cache_restored(Session::restored(stored.tokens, placement));
        self.write_evicted();
        Ok((tokens, note))
    }

    /// Writes the cached conversation sharing the longest prefix with `tokens` to the
    /// session file at `path`, with `note`; returns how many tokens it holds, or `None`
    /// when nothing is cached.
    pub fn export_session_file(
        &self,
        tokens: &[u32],
        path: &Path,
        note: &[u8],
    ) -> std::result::Result<Option<usize>, StoreError> {
        let cache = self.scheduler.cache();
        let Some((i, _)) = cache.longest(tokens) else {
            return Ok(None);
        };
        let session = cache.session(i);
        let Some(placement) = session.placement() else {
            return Ok(None);
        };
        save_session(
            path,
            &self.session_identity(),
            session.tokens(),
            placement.window,
            &placement.kv,
            note,
        )?;
        Ok(Some(session.len()))
    }

    /// Hands conversations the scheduler evicted to the session writer.
    fn write_evicted(&mut self) {
        for session in self.scheduler.take_evicted() {
            self.sessions.save(session);
        }
    }

    /// Takes in what the session thread did (waiting for it with `wait`), and gives the
    /// conversations it read back to the requests waiting for them.
    fn take_loaded(&mut self, wait: bool) {
        self.sessions.poll(wait);
        for (id, session) in self.sessions.take_loaded() {
            self.scheduler.loaded(id, session);
        }
    }
}

/// The window pyramid answers the scheduler's questions about artifacts.
impl Artifacts for WindowPyramid {
    fn window_ready(&self, window: usize) -> bool {
        WindowPyramid::window_ready(self, window).is_some()
    }

    fn decode_ready(&self, batch: usize, window: usize) -> bool {
        self.get_ready(ArtifactShape::Decode { batch, window })
            .is_some()
    }

    fn is_prepared(&self, window: usize) -> bool {
        WindowPyramid::is_prepared(self, window)
    }

    fn shapes(&self, window: usize) -> [ArtifactShape; 2] {
        WindowPyramid::shapes(self, window)
    }

    fn expected_compile(&self, window: usize) -> Duration {
        WindowPyramid::expected_compile(self, window)
    }

    fn record_fork(&self, bytes: usize) {
        self.record(|s| {
            s.n_forks += 1;
            s.fork_bytes += bytes;
        });
    }
}

/// A request run to its end by [`Engine::generate`].
#[derive(Debug, Clone)]
pub struct Completion {
    /// Sampled tokens, the stop token included when `finish_reason` is `Stop`.
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
}

/// The session writer and the executor together, restoring stored conversations for
/// the scheduler's admission.
struct Restorer<'a> {
    sessions: &'a mut SessionWriter,
    executor: &'a Executor,
    ladder: &'a WindowLadder,
}

impl StoredPrefixes for Restorer<'_> {
    fn longer_prefix(&mut self, id: RequestId, prompt: &[u32], cached: usize) -> Stored {
        let executor = self.executor;
        let ladder = self.ladder;
        let found = self.sessions.longer_prefix(
            id,
            prompt,
            cached,
            |n_tokens| restore_target(executor, ladder, n_tokens),
            |window| executor.new_cache(window),
        );
        match found {
            Found::Nothing => Stored::Nothing,
            Found::InMemory(session) => Stored::Ready(session),
            Found::Loading => Stored::Loading,
        }
    }
}

/// Where a restored conversation of `n_tokens` goes: the smallest rung of `ladder`
/// holding it (the file's own window may not be one), that window's artifacts on a
/// static route, and an empty cache for it.
fn restore_target(
    executor: &Executor,
    ladder: &WindowLadder,
    n_tokens: usize,
) -> std::result::Result<(usize, Option<ArtifactPair>, KvCache), String> {
    let rung = ladder.rung_for(n_tokens.max(1)).map_err(|_| {
        format!(
            "its {n_tokens} tokens exceed the largest window ({})",
            ladder.largest()
        )
    })?;
    let window = ladder.windows()[rung];
    let artifacts = if executor.runs_mixed() {
        None
    } else {
        Some(
            executor
                .pyramid()
                .acquire_window(window)
                .map_err(|e| e.to_string())?
                .0,
        )
    };
    Ok((window, artifacts, executor.new_cache(window)))
}
