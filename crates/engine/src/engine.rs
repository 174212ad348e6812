//! The engine core every entry point drives (`run`, `chat`, `serve`, `bench`, `replay`):
//! continuous batching on the window pyramid, on any backend route.
//!
//! One [`Engine::step`] is three phases with plain data between them, as in vLLM v1:
//! - [`Engine::schedule`] admits queued requests, decides which sequences run and how
//!   many tokens each feeds, which move to a larger window first, which wait for an
//!   artifact, and which artifacts start compiling ([`Schedule`]);
//! - [`Engine::execute`] places and migrates sessions and runs the passes on the
//!   route's artifacts ([`Executed`]: logits per sequence);
//! - [`Engine::update`] samples, applies stop tokens and limits, retires finished
//!   sequences into the prefix cache, and returns [`Event`]s.
//!
//! The engine owns the sessions (running and cached), the prefix cache, the artifact
//! cache and the growth predictor; it knows token ids only. A request's tokens do not
//! depend on what else runs beside it: every row of a pass is computed on its own.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyramid_kernels::ThreadPool;
use pyramid_model::KvFootprint;
use pyramid_runtime::{ArtifactShape, Backend, Executable, Sampler};
use serde::Serialize;

use crate::admission::PreemptionStats;
use crate::executor::Executed;
use crate::persist::PersistStats;
use crate::prefix_cache::PrefixCache;
use crate::pyramid::{PyramidConfig, PyramidStats, WindowPyramid};
use crate::request::{Event, FinishReason, Request, RequestId, Timings, TokenLogprobs, Usage};
use crate::scheduler::Schedule;
use crate::session::Session;
use crate::session_store::SessionStore;
use crate::speculate::{DraftStats, Drafter, SpeculativeConfig};
use crate::step_logits::LogitBuffers;
use crate::{EngineError, Result};

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Windows, prefill chunk, window policy, artifact budget, prediction margins.
    pub pyramid: PyramidConfig,
    /// Sequences advanced together in one step.
    pub max_batch: usize,
    /// Bytes of KV cache held by running and cached sessions together.
    pub kv_budget: usize,
    /// Sessions held at once, running and cached.
    pub max_sessions: usize,
    /// Run through per-window static artifacts even on a backend that takes mixed
    /// passes, as a static device would (what `replay` measures).
    pub static_shapes: bool,
    /// Waiting this long (queued, or paused) makes a request one priority level more
    /// urgent, so that nothing starves; zero turns aging off.
    pub aging: Duration,
    /// Drafts for requests asking for speculation (verified on mixed passes only).
    pub speculative: SpeculativeConfig,
}

/// How long a request waits before it is one level more urgent, by default.
pub const DEFAULT_AGING: Duration = Duration::from_secs(2);

/// A request not admitted yet.
pub(crate) struct Queued {
    pub request: Request,
    pub submitted: Instant,
    /// Its place in line among requests of one level.
    pub arrival: u64,
}

/// A request being served (running or paused).
pub(crate) struct Sequence {
    /// Its prompt moved to `input`.
    pub request: Request,
    pub prompt_len: usize,
    /// Tokens to have in the cache before the next sample: the prompt, or (swapped out
    /// and resumed) everything the session held and the token after it.
    pub input: Vec<u32>,
    pub session: Session,
    /// Tokens of `input` in the cache so far (the first `cached_tokens` of the prompt
    /// came with it).
    pub fed: usize,
    pub cached_tokens: usize,
    /// The sampled token to feed next, once the prompt is in.
    pub next_input: Option<u32>,
    pub sampler: Sampler,
    pub generated: usize,
    pub submitted: Instant,
    pub arrival: u64,
    pub admitted: Instant,
    /// Since it last entered the batch, and at which level.
    pub running_since: Instant,
    pub entry_level: i64,
    /// Since when it is paused, if it is.
    pub paused_since: Option<Instant>,
    /// Time spent paused before the current run.
    pub paused_for: Duration,
    /// Tokens its session held when it was swapped out (0 unless it was).
    pub swapped_len: usize,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    /// Since when it waits for an artifact or memory to move to a larger window.
    pub stalled_since: Option<Instant>,
    /// Time spent on the constraint's masks.
    pub mask_time: Duration,
    pub drafter: Drafter,
}

impl Sequence {
    pub fn prefilling(&self) -> bool {
        self.fed < self.input.len()
    }

    /// Its priority level now: paused, its priority lowered by its wait; running, its
    /// priority, or for one aging interval after it entered the batch the level it
    /// entered at, if lower (so an aged request runs a quantum before it can be paused
    /// again).
    pub fn level(&self, now: Instant, aging: Duration) -> i64 {
        let own = i64::from(self.request.priority);
        match self.paused_since {
            Some(t) => crate::admission::level(
                self.request.priority,
                now.saturating_duration_since(t),
                aging,
            ),
            None if now.saturating_duration_since(self.running_since) < aging => {
                own.min(self.entry_level)
            }
            None => own,
        }
    }
}

/// What the last step ran, for the driver's metrics.
#[derive(Debug, Clone, Default)]
pub struct StepSummary {
    /// Sequences that decoded one token.
    pub n_decoded: usize,
    /// Prompt tokens prefilled.
    pub n_prefilled: usize,
    /// Draft tokens verified beside the decoded ones.
    pub n_drafted: usize,
    /// How long each migration took.
    pub migrations: Vec<Duration>,
}

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
    pub compiling: usize,
    /// Drafts verified and accepted, and passes that sampled, over every request.
    pub speculative: DraftStats,
}

pub struct Engine {
    pub(crate) pyramid: Arc<WindowPyramid>,
    pub(crate) config: EngineConfig,
    /// The one artifact of a backend that runs mixed passes; `None` on static routes.
    pub(crate) mixed: Option<Arc<dyn Executable>>,
    /// KV bytes of a session as a function of its window.
    pub(crate) kv_footprint: KvFootprint,
    pub(crate) waiting: VecDeque<Queued>,
    pub(crate) running: Vec<Sequence>,
    pub(crate) paused: Vec<Sequence>,
    pub(crate) next_arrival: u64,
    pub(crate) preemption: PreemptionStats,
    pub(crate) cache: PrefixCache,
    pub(crate) summary: StepSummary,
    pub(crate) events: Vec<Event>,
    /// Tells session files of other setups apart.
    pub(crate) model_id: u64,
    /// Conversations on disk, when persistence is on.
    pub(crate) store: Option<SessionStore>,
    pub(crate) persisted: PersistStats,
    pub(crate) warnings: Vec<String>,
    /// What speculation did across every request.
    pub(crate) speculative: DraftStats,
    /// Pass buffers of logits, reused from step to step.
    pub(crate) logit_buffers: LogitBuffers,
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
        let kv_footprint = KvFootprint::of(&model.config, kv_type);
        Ok(Self {
            pyramid,
            config,
            mixed,
            kv_footprint,
            waiting: VecDeque::new(),
            running: Vec::new(),
            paused: Vec::new(),
            next_arrival: 0,
            preemption: PreemptionStats::default(),
            cache: PrefixCache::default(),
            summary: StepSummary::default(),
            events: Vec::new(),
            model_id,
            store: None,
            persisted: PersistStats::default(),
            warnings: Vec::new(),
            speculative: DraftStats::default(),
            logit_buffers: LogitBuffers::default(),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn pyramid(&self) -> &Arc<WindowPyramid> {
        &self.pyramid
    }

    /// Whether requests asking for speculation get it: drafts are on
    /// ([`SpeculativeConfig::max_draft`]) and the route runs mixed passes, which verify them.
    pub fn speculates(&self) -> bool {
        self.config.speculative.max_draft > 0 && self.mixed.is_some()
    }

    /// The largest context a request can reach.
    pub fn max_context(&self) -> usize {
        self.config.pyramid.ladder.largest()
    }

    /// Queues `request`. One that can never run (an empty prompt, beyond the largest
    /// window, a first window beyond the KV budget) fails at once, with the next step's
    /// events; other errors come when it is admitted.
    pub fn add_request(&mut self, request: Request) {
        if let Some(error) = self.refusal(&request) {
            self.events.push(Event::Failed {
                id: request.id,
                error,
            });
            return;
        }
        self.waiting.push_back(Queued {
            request,
            submitted: Instant::now(),
            arrival: self.next_arrival,
        });
        self.next_arrival += 1;
    }

    /// Whether anything is queued, running or paused (or an event is to be reported).
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty()
            || !self.running.is_empty()
            || !self.paused.is_empty()
            || !self.events.is_empty()
    }

    pub fn n_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Ends a request now (a client went away, a stop string matched). Its session is
    /// kept for reuse. Returns its usage, or `None` if the engine does not hold it.
    pub fn abort(&mut self, id: RequestId) -> Option<Usage> {
        if let Some(i) = self.waiting.iter().position(|q| q.request.id == id) {
            let queued = self.waiting.remove(i)?;
            return Some(Usage {
                prompt_tokens: queued.request.prompt.len(),
                ..Usage::default()
            });
        }
        let seq = match self.running.iter().position(|s| s.request.id == id) {
            Some(i) => self.running.swap_remove(i),
            None => {
                let i = self.paused.iter().position(|s| s.request.id == id)?;
                self.paused.swap_remove(i)
            }
        };
        let usage = usage_of(&seq);
        self.retire(seq.session);
        Some(usage)
    }

    /// One step: schedule, execute, update. Blocks only when every runnable sequence
    /// waits for an artifact compile, and then only until it is ready; a compile that
    /// failed in the background is retried once in the foreground before the sequences
    /// needing it fail.
    pub fn step(&mut self, pool: &ThreadPool) -> Vec<Event> {
        self.summary = StepSummary::default();
        let mut schedule = self.schedule();
        self.mark_stalled(&schedule);
        let mut wait_for: Vec<usize> = schedule
            .stalled
            .iter()
            .map(|&(_, w)| w)
            .filter(|&w| self.pyramid.failure(w).is_some())
            .collect();
        if schedule.is_idle() {
            wait_for.extend(schedule.stalled.first().map(|&(_, w)| w));
        }
        wait_for.sort_unstable();
        wait_for.dedup();
        if !wait_for.is_empty() {
            for window in wait_for {
                if let Err(e) = self.pyramid.acquire_window(window) {
                    self.fail_stalled_on(window, &schedule, e);
                }
            }
            schedule = self.schedule();
            self.mark_stalled(&schedule);
        }
        if schedule.is_idle() {
            // Still nothing runs: what waits with its artifacts ready waits for memory
            // that no running sequence will free.
            self.fail_over_budget(&schedule);
        }
        let mut executed = self.execute(pool, &schedule);
        self.mask(pool, &mut executed);
        self.update(&schedule, executed);
        std::mem::take(&mut self.events)
    }

    fn mark_stalled(&mut self, schedule: &Schedule) {
        let now = Instant::now();
        for &(id, _) in &schedule.stalled {
            if let Some(seq) = self.running.iter_mut().find(|s| s.request.id == id) {
                seq.stalled_since.get_or_insert(now);
            }
        }
    }

    /// Applies a step's results: samples each sequence whose prompt is in (its logits
    /// already masked by its grammar, if it has one), ends those that sampled a stop
    /// token, completed their grammar or reached a limit, and keeps their sessions for reuse.
    pub fn update(&mut self, schedule: &Schedule, executed: Executed) {
        debug_assert!(executed.logits.len() <= schedule.n_scheduled());
        for (id, error) in executed.failed {
            if let Some(i) = self.running.iter().position(|s| s.request.id == id) {
                // Its cache is left as before the pass, but the sequence ends here.
                let seq = self.running.swap_remove(i);
                self.retire(seq.session);
            }
            self.events.push(Event::Failed { id, error });
        }
        let largest = self.config.pyramid.ladder.largest();
        let n_vocab = self.pyramid.backend().model().config.n_vocab;
        let mut finished = Vec::new();
        let mut failed = Vec::new();
        let mut unmasked = executed.unmasked;
        let mut step_logits = executed.logits;
        for (id, logits) in step_logits.iter_mut() {
            let Some(seq) = self.running.iter_mut().find(|s| s.request.id == id) else {
                continue;
            };
            if seq.prefilling() {
                // More prompt to come: these logits are not sampled.
                continue;
            }
            let draft = schedule.draft_of(id);
            let rows = SampledRows {
                logits: &mut *logits,
                draft,
                unmasked: &mut unmasked,
                n_vocab,
                largest,
            };
            let events = &mut self.events;
            let speculative = &mut self.speculative;
            let outcome =
                crate::boundary::isolate("sampling", || rows.sample(seq, events, speculative));
            match outcome {
                Ok(Some(Err(error))) | Err(error) => failed.push((id, error)),
                Ok(Some(Ok(Some(reason)))) => finished.push((id, reason)),
                Ok(Some(Ok(None))) => {}
                // The last row's token never extends the draft, so only missing rows
                // end here.
                Ok(None) => failed.push((
                    id,
                    EngineError::Pass(format!("{} rows of logits", logits.len() / n_vocab)),
                )),
            }
        }
        self.logit_buffers.give_back(step_logits.into_buffers());
        for (id, error) in failed {
            if let Some(i) = self.running.iter().position(|s| s.request.id == id) {
                let seq = self.running.swap_remove(i);
                self.retire(seq.session);
            }
            self.events.push(Event::Failed { id, error });
        }
        for (id, reason) in finished {
            let Some(i) = self.running.iter().position(|s| s.request.id == id) else {
                continue;
            };
            let mut seq = self.running.swap_remove(i);
            let usage = usage_of(&seq);
            let timings = timings_of(&seq);
            let grown = usage.prompt_tokens - usage.cached_tokens + usage.completion_tokens;
            seq.session.observe_turn(grown, seq.admitted.elapsed());
            // The next turn may cross: its window compiles while the caller thinks.
            if let Some(window) = seq.session.window() {
                let len = seq.session.len();
                if let Some(next) = self.predicted_next_window(&seq.session, window, len) {
                    self.pyramid.prepare(next);
                }
            }
            self.events.push(Event::Finished {
                id,
                reason,
                usage,
                timings,
            });
            self.retire(seq.session);
        }
        // Sliding-window layers give back what their windows left behind, between steps.
        for seq in &mut self.running {
            seq.session.release_out_of_window();
        }
    }

    /// What the last step ran.
    pub fn last_step(&self) -> &StepSummary {
        &self.summary
    }

    pub fn stats(&self) -> EngineStats {
        let (reserved, used) = self
            .running
            .iter()
            .chain(&self.paused)
            .map(|s| s.session.kv_bytes())
            .fold(
                (self.cache.bytes(), self.cache.used_bytes()),
                |(r, u), (a, b)| (r + a, u + b),
            );
        let mut waiting_by_priority = BTreeMap::new();
        let priorities = self.waiting.iter().map(|q| q.request.priority);
        for p in priorities.chain(self.paused.iter().map(|s| s.request.priority)) {
            *waiting_by_priority.entry(p).or_insert(0) += 1;
        }
        EngineStats {
            pyramid: self.pyramid.stats(),
            running: self.running.len(),
            waiting: self.waiting.len(),
            paused: self.paused.len(),
            waiting_by_priority: waiting_by_priority.into_iter().collect(),
            preemption: self.preemption,
            persisted: self.persisted,
            cached_sessions: self.cache.len(),
            kv_bytes_reserved: reserved,
            kv_bytes_used: used,
            artifacts: self.pyramid.resident(),
            compiling: self.pyramid.n_compiling(),
            speculative: self.speculative,
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
                    Event::Started { .. } => {}
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

    /// KV bytes a session on `window` reserves.
    pub(crate) fn kv_bytes_for(&self, window: usize) -> usize {
        self.kv_footprint.bytes(window)
    }

    /// KV bytes the running and paused sessions reserve, counting running ones not yet
    /// placed at the window they will get.
    pub(crate) fn running_bytes(&self) -> usize {
        let paused: usize = self.paused.iter().map(|s| s.session.kv_bytes().0).sum();
        paused
            + self
                .running
                .iter()
                .map(|s| match s.session.window() {
                    Some(_) => s.session.kv_bytes().0,
                    None => self.target_window(s).map_or(0, |w| self.kv_bytes_for(w)),
                })
                .sum::<usize>()
    }

    /// Keeps a session for reuse, then evicts what the session limit and the KV budget
    /// no longer allow.
    pub(crate) fn retire(&mut self, session: Session) {
        self.cache.insert(session);
        self.fit_budget(self.running_bytes(), self.max_cached());
    }

    /// Cached sessions allowed beside the running and paused ones.
    pub(crate) fn max_cached(&self) -> usize {
        self.config
            .max_sessions
            .saturating_sub(self.running.len() + self.paused.len())
    }

    /// Makes cached sessions fit the KV budget beside running sessions reserving
    /// `running_bytes`, and keeps at most `max_cached` of them (least recently used go
    /// first).
    pub(crate) fn fit_budget(&mut self, running_bytes: usize, max_cached: usize) {
        let room = self.config.kv_budget.saturating_sub(running_bytes);
        let evicted = self.cache.evict_to(max_cached, room);
        for session in &evicted {
            self.persist(session);
        }
    }

    /// Fails the stalled sequences whose artifacts are ready: alone, they wait for KV
    /// memory that nothing will free.
    fn fail_over_budget(&mut self, schedule: &Schedule) {
        for &(id, window) in &schedule.stalled {
            let ready = self.mixed.is_some() || self.pyramid.window_ready(window).is_some();
            let Some(i) = self.running.iter().position(|s| s.request.id == id) else {
                continue;
            };
            if ready {
                let seq = self.running.swap_remove(i);
                self.retire(seq.session);
                self.events.push(Event::Failed {
                    id,
                    error: EngineError::OverBudget {
                        bytes: self.kv_bytes_for(window),
                        budget: self.config.kv_budget,
                    },
                });
            }
        }
    }

    /// Fails every sequence stalled on `window`, whose compile failed; their sessions
    /// stay cached, untouched.
    fn fail_stalled_on(&mut self, window: usize, schedule: &Schedule, error: EngineError) {
        let reason = error.to_string();
        let mut error = Some(error);
        for &(id, w) in &schedule.stalled {
            if w != window {
                continue;
            }
            let Some(i) = self.running.iter().position(|s| s.request.id == id) else {
                continue;
            };
            let seq = self.running.swap_remove(i);
            self.retire(seq.session);
            let error = error.take().unwrap_or_else(|| EngineError::Unavailable {
                window,
                reason: reason.clone(),
            });
            self.events.push(Event::Failed { id, error });
        }
    }
}

/// One sequence's rows of logits this step, to sample.
struct SampledRows<'a> {
    /// `[1 + draft, n_vocab]`: row j follows the next input and the draft's first j tokens.
    logits: &'a mut [f32],
    draft: &'a [u32],
    /// Unmasked logits of constrained sequences reporting log-probabilities.
    unmasked: &'a mut Vec<(RequestId, Vec<f32>)>,
    n_vocab: usize,
    largest: usize,
}

impl SampledRows<'_> {
    /// Samples each row as plain decoding would, keeping the draft while it agrees, and
    /// truncates the rejected rest of the draft from the cache. `Some(Ok(Some(reason)))`
    /// when the sequence ends, `Some(Ok(None))` when it goes on, `Some(Err)` when its
    /// grammar refused a token; `None` when the rows ran out first.
    fn sample(
        self,
        seq: &mut Sequence,
        events: &mut Vec<Event>,
        speculative: &mut DraftStats,
    ) -> Option<Result<Option<FinishReason>>> {
        let id = seq.request.id;
        let draft = self.draft;
        let before = seq.session.len() - (1 + draft.len());
        let mut kept = 0;
        let mut outcome = None;
        for (j, row) in self.logits.chunks_exact_mut(self.n_vocab).enumerate() {
            #[cfg(test)]
            crate::boundary::inject::check_sampling(id);
            // Log-probabilities are of the model's distribution, before sampling (or
            // a grammar, which never drafts) reshapes it.
            let raw = seq.request.logprobs.map(|k| {
                let unmasked = self.unmasked.iter_mut().find(|(u, _)| *u == id);
                let raw = unmasked.map_or_else(|| row.to_vec(), |(_, raw)| std::mem::take(raw));
                (k, raw)
            });
            let seen = &seq.session.tokens()[..before + 1 + j];
            let token = seq.sampler.sample(row, seen);
            if let Some(constraint) = seq.request.constraint.as_mut() {
                if let Err(error) = constraint.accept(token) {
                    outcome = Some(Err(EngineError::Grammar(error)));
                    break;
                }
            }
            let logprobs = raw.map(|(k, raw)| TokenLogprobs::of(&raw, token, k));
            let now = Instant::now();
            seq.first_token.get_or_insert(now);
            seq.last_token = Some(now);
            seq.generated += 1;
            kept = j;
            events.push(Event::Token {
                id,
                token,
                logprobs,
            });
            let complete = seq
                .request
                .constraint
                .as_ref()
                .is_some_and(|c| c.is_finished());
            if seq.request.stop_tokens.contains(&token) || complete {
                outcome = Some(Ok(Some(FinishReason::Stop)));
            } else if seq.generated >= seq.request.max_tokens || seen.len() + 1 > self.largest {
                // The next decode would need a position beyond the largest window.
                outcome = Some(Ok(Some(FinishReason::Length)));
            } else if draft.get(j) != Some(&token) {
                seq.next_input = Some(token);
                outcome = Some(Ok(None));
            }
            if outcome.is_some() {
                break;
            }
        }
        let counted = seq.drafter.stats;
        seq.drafter.record(draft.len(), kept.min(draft.len()));
        speculative.add(&seq.drafter.stats.since(&counted));
        // The rejected part of the draft leaves the cache.
        seq.session.truncate(before + 1 + kept);
        outcome
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

pub(crate) fn usage_of(seq: &Sequence) -> Usage {
    Usage {
        prompt_tokens: seq.prompt_len,
        completion_tokens: seq.generated,
        cached_tokens: seq.cached_tokens,
        speculative: seq.drafter.stats,
    }
}

fn timings_of(seq: &Sequence) -> Timings {
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
    let first = seq.first_token.unwrap_or(seq.admitted);
    Timings {
        prefill_ms: ms(seq.admitted, first),
        n_prefill: seq.prompt_len - seq.cached_tokens,
        decode_ms: ms(first, seq.last_token.unwrap_or(first)),
        n_decode: seq.generated.saturating_sub(1),
        queue_ms: ms(seq.submitted, seq.admitted),
        paused_ms: (seq.paused_for + seq.paused_since.map_or(Duration::ZERO, |t| t.elapsed()))
            .as_secs_f64()
            * 1e3,
        mask_ms: seq.mask_time.as_secs_f64() * 1e3,
    }
}
