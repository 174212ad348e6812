//! The scheduler: who runs, on which window, with how many tokens, and what a step's
//! results mean for each sequence.
//!
//! It owns the sequences (queued, running, paused), the prefix cache of conversations
//! kept for reuse, and the KV and session budgets. [`Scheduler::schedule`] decides a step
//! ([`Schedule`]); [`Scheduler::batch`] lends the scheduled sessions to the executor;
//! [`Scheduler::update`] applies what the executor returned ([`Executed`]): it samples,
//! ends sequences and reports [`Event`]s. It never runs a pass and never touches a file:
//! what it learns of artifacts comes through [`Artifacts`], and conversations it evicts
//! wait in an outbox for the session writer ([`Scheduler::take_evicted`]). So its tests
//! need no backend at all.
//!
//! - `plan`: the step's tokens, windows, drafts and compiles.
//! - `admission`: admission by priority, pausing, swapping out, prefix reuse.
//! - `update`: sampling, stop conditions, retirement.
//! - `constrain`: grammar masks, between the executor and the update.

mod admission;
mod constrain;
mod plan;
mod shared_prefill;
#[cfg(test)]
mod tests;
mod update;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyramid_model::{ModelConfig, Pooled};
use pyramid_runtime::{ArtifactShape, Sampler};

pub use admission::PreemptionStats;

use crate::config::EngineConfig;
use crate::kv::KvAllocator;
use crate::observe::{Happening, HappeningLog, SessionKey, SessionState, SessionView, What};
use crate::prefix_cache::PrefixCache;
use crate::request::{Event, Request, RequestId, Usage};
use crate::sequence::Sequence;
use crate::session::Session;
use crate::speculate::DraftStats;
use crate::step::{Batch, Move, Schedule, Slot};
use crate::EngineError;

/// What the scheduler knows of the route's artifacts: which windows are compiled and
/// what a compile takes. The window pyramid answers on a real route; a test answers
/// from a table.
pub trait Artifacts: Send + Sync {
    /// Both artifacts of `window` are compiled.
    fn window_ready(&self, window: usize) -> bool;
    /// The decode artifact of `batch` sequences on `window` is compiled.
    fn decode_ready(&self, batch: usize, window: usize) -> bool;
    /// Both artifacts of `window` are compiled or compiling.
    fn is_prepared(&self, window: usize) -> bool;
    /// The prefill and decode shapes of `window`.
    fn shapes(&self, window: usize) -> [ArtifactShape; 2];
    /// How long compiling `window` is expected to take.
    fn expected_compile(&self, window: usize) -> Duration;
    /// A new conversation copied `bytes` of a cached one's prefix (counted with the
    /// pyramid's figures).
    fn record_fork(&self, bytes: usize);
}

/// A conversation kept outside memory that a request could resume from.
pub enum Stored {
    /// None longer than the prefix cache holds.
    Nothing,
    /// One at hand (copied from memory): the request takes it when admitted.
    Ready(Box<Session>),
    /// One being read from disk: the request waits for it (`Loading`), and
    /// [`Scheduler::loaded`] brings it.
    Loading,
}

/// Where conversations kept outside memory come back from: the session writer on a
/// real engine, nothing in a test. Asked only for a sequence about to be admitted.
pub trait StoredPrefixes {
    /// A conversation sharing a longer prefix with `prompt` (request `id`'s) than the
    /// `cached` tokens the prefix cache covers.
    fn longer_prefix(&mut self, id: RequestId, prompt: &[u32], cached: usize) -> Stored;
}

/// No conversations kept outside memory.
pub struct NoStore;

impl StoredPrefixes for NoStore {
    fn longer_prefix(&mut self, _id: RequestId, _prompt: &[u32], _cached: usize) -> Stored {
        Stored::Nothing
    }
}

/// The scheduler's part of the engine's state, for `/metrics` and reports.
#[derive(Debug, Clone, Default)]
pub(crate) struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    pub paused: usize,
    pub waiting_by_priority: Vec<(i32, usize)>,
    pub preemption: PreemptionStats,
    pub cached_sessions: usize,
    pub kv_bytes_reserved: usize,
    pub kv_bytes_used: usize,
    pub speculative: DraftStats,
}

pub struct Scheduler {
    config: EngineConfig,
    /// Whether the route runs one mixed pass of any shape (no windows to wait for).
    mixed: bool,
    artifacts: Arc<dyn Artifacts>,
    kv: KvAllocator,
    n_vocab: usize,
    /// The width of an embedding.
    n_embd: usize,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    paused: Vec<Sequence>,
    next_arrival: u64,
    preemption: PreemptionStats,
    cache: PrefixCache,
    events: Vec<Event>,
    /// Conversations evicted from the prefix cache, for the session writer.
    evicted: Vec<Session>,
    /// Windows to compile ahead of a finished conversation's next turn.
    compile_ahead: Vec<usize>,
    /// What speculation did across every request.
    speculative: DraftStats,
    /// What a watcher follows: pauses, forks, swaps, moves, caching.
    happenings: HappeningLog,
}

impl Scheduler {
    pub(crate) fn new(
        config: EngineConfig,
        mixed: bool,
        artifacts: Arc<dyn Artifacts>,
        kv: KvAllocator,
        model: &ModelConfig,
    ) -> Self {
        Self {
            config,
            mixed,
            artifacts,
            kv,
            n_vocab: model.n_vocab,
            n_embd: model.n_embd,
            waiting: VecDeque::new(),
            running: Vec::new(),
            paused: Vec::new(),
            next_arrival: 0,
            preemption: PreemptionStats::default(),
            cache: PrefixCache::default(),
            events: Vec::new(),
            evicted: Vec::new(),
            compile_ahead: Vec::new(),
            speculative: DraftStats::default(),
            happenings: HappeningLog::default(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues `request`. One that can never run (an empty prompt, beyond the largest
    /// window, a first window beyond the KV budget, sampling settings refused) fails at
    /// once, with the next step's events.
    pub fn add_request(&mut self, request: Request) {
        let id = request.id;
        if let Some(error) = self.refusal(&request) {
            self.events.push(Event::Failed { id, error });
            return;
        }
        let sampler = match Sampler::new(request.sampler.clone()) {
            Ok(s) => s,
            Err(error) => {
                self.events.push(Event::Failed {
                    id,
                    error: error.into(),
                });
                return;
            }
        };
        let seq = Sequence::queued(request, sampler, self.next_arrival, Instant::now());
        self.next_arrival += 1;
        self.waiting.push_back(seq);
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
    /// kept for reuse. Returns its usage, or `None` if the scheduler does not hold it.
    pub fn abort(&mut self, id: RequestId) -> Option<Usage> {
        if let Some(i) = self.waiting.iter().position(|q| q.id() == id) {
            let queued = self.waiting.remove(i)?;
            return Some(Usage {
                prompt_tokens: queued.prompt_len,
                ..Usage::default()
            });
        }
        let seq = match self.running.iter().position(|s| s.id() == id) {
            Some(i) => self.running.swap_remove(i),
            None => {
                let i = self.paused.iter().position(|s| s.id() == id)?;
                self.paused.swap_remove(i)
            }
        };
        let usage = seq.usage();
        self.release(seq);
        Some(usage)
    }

    /// The events since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Conversations evicted since the last call, for the session writer.
    pub(crate) fn take_evicted(&mut self) -> Vec<Session> {
        std::mem::take(&mut self.evicted)
    }

    /// Windows to compile ahead of finished conversations' next turns, since the last call.
    pub(crate) fn take_compile_ahead(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.compile_ahead)
    }

    /// The scheduled sequences' sessions and the tokens each feeds, lent to the executor
    /// for one step.
    pub fn batch(&mut self, schedule: &Schedule) -> Batch<'_> {
        let mut batch = Vec::with_capacity(schedule.n_scheduled());
        let n_embd = self.n_embd;
        for seq in &mut self.running {
            let id = seq.request.id;
            let tokens = if let Some(&(_, n)) = schedule.prefills.iter().find(|p| p.0 == id) {
                seq.input[seq.fed..seq.fed + n].to_vec()
            } else if schedule.decodes.iter().any(|d| d.ids.contains(&id)) {
                let Some(next) = seq.next_input else {
                    continue;
                };
                let mut tokens = vec![next];
                tokens.extend_from_slice(schedule.draft_of(id));
                tokens
            } else {
                continue;
            };
            let prefill = seq.prefilling();
            let rows = seq.pooled_rows(tokens.len());
            if rows.is_some() {
                seq.pooled.resize(n_embd, 0.0);
            }
            let pooled = rows.map(|rows| Pooled {
                rows,
                sum: &mut seq.pooled[..],
            });
            batch.push(Slot {
                id,
                prefill,
                session: &mut seq.session,
                tokens,
                pooled,
            });
        }
        batch
    }

    /// Marks the sequences `schedule` left stalled (their wait is measured from now).
    pub(crate) fn mark_stalled(&mut self, schedule: &Schedule) {
        let now = Instant::now();
        for &(id, _) in &schedule.stalled {
            if let Some(seq) = self.running.iter_mut().find(|s| s.id() == id) {
                seq.stalled_since.get_or_insert(now);
            }
        }
    }

    /// Resolves a step where nothing runs and sequences wait for KV memory with their
    /// artifacts ready (nothing running will free any): a sequence whose window could
    /// never fit the budget even alone fails (`OverBudget`); otherwise the least urgent
    /// running sequence (ties: the latest to arrive) is swapped out, its session going to
    /// the prefix cache and from there to disk or nowhere, so the others proceed, and it
    /// resumes once they have made room.
    pub(crate) fn resolve_memory_stall(&mut self, schedule: &Schedule) {
        let budget = self.config.kv_budget;
        let mut waiting_for_memory = false;
        for &(id, window) in &schedule.stalled {
            let ready = self.mixed || self.artifacts.window_ready(window);
            let Some(i) = self.running.iter().position(|s| s.id() == id) else {
                continue;
            };
            if !ready {
                continue;
            }
            let bytes = self.kv.bytes(window);
            if bytes > budget {
                let seq = self.running.swap_remove(i);
                self.release(seq);
                self.events.push(Event::Failed {
                    id,
                    error: EngineError::OverBudget { bytes, budget },
                });
            } else {
                waiting_for_memory = true;
            }
        }
        if !waiting_for_memory || self.running.len() < 2 {
            return;
        }
        let now = Instant::now();
        let aging = self.config.aging;
        let victim = (0..self.running.len())
            .max_by_key(|&i| {
                let s = &self.running[i];
                (s.level(now, aging), s.arrival)
            })
            .expect("two or more are running");
        self.swap_out_running(victim, now);
    }

    /// Fails every sequence stalled on `window`, whose compile failed; their sessions
    /// stay cached, untouched.
    pub(crate) fn fail_stalled_on(
        &mut self,
        window: usize,
        schedule: &Schedule,
        error: EngineError,
    ) {
        let reason = error.to_string();
        let mut error = Some(error);
        for &(id, w) in &schedule.stalled {
            if w != window {
                continue;
            }
            let Some(i) = self.running.iter().position(|s| s.id() == id) else {
                continue;
            };
            let seq = self.running.swap_remove(i);
            self.release(seq);
            let error = error.take().unwrap_or_else(|| EngineError::Unavailable {
                window,
                reason: reason.clone(),
            });
            self.events.push(Event::Failed { id, error });
        }
    }

    pub(crate) fn stats(&self) -> SchedulerStats {
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
        for s in self.waiting.iter().chain(&self.paused) {
            *waiting_by_priority.entry(s.request.priority).or_insert(0) += 1;
        }
        SchedulerStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            paused: self.paused.len(),
            waiting_by_priority: waiting_by_priority.into_iter().collect(),
            preemption: self.preemption,
            cached_sessions: self.cache.len(),
            kv_bytes_reserved: reserved,
            kv_bytes_used: used,
            speculative: self.speculative,
        }
    }

    /// Starts recording [`Happening`]s for a watcher.
    pub(crate) fn watch(&mut self) {
        self.happenings.enable();
    }

    /// Records a happening the scheduler did not cause itself (its events', the
    /// engine's).
    pub(crate) fn record(&mut self, what: What) {
        self.happenings.record(what);
    }

    /// Moves the happenings since the last call into `out`.
    pub(crate) fn drain_happenings(&mut self, out: &mut Vec<Happening>) {
        self.happenings.drain_into(out);
    }

    /// Records the window moves and stalls `schedule` is about to carry out, before
    /// they change the sessions' windows.
    pub(crate) fn record_moves(&mut self, schedule: &Schedule) {
        for &(id, to, how) in &schedule.moves {
            if how == Move::First {
                continue;
            }
            if let Some(&(_, waited)) = schedule.stalls.iter().find(|s| s.0 == id) {
                self.happenings.record(What::Stall {
                    id,
                    window: to,
                    waited,
                });
            }
            let from = self
                .running
                .iter()
                .find(|s| s.id() == id)
                .and_then(|s| s.session.window());
            self.happenings.record(What::Migration {
                id,
                from,
                to,
                reprefill: how == Move::Reprefill,
            });
        }
    }

    /// Every session the scheduler holds, as a watcher sees it: running, paused, queued
    /// and swapped sequences, then cached conversations.
    pub(crate) fn observe(&self, out: &mut Vec<SessionView>) {
        let mut sequences: Vec<SessionView> = self
            .running
            .iter()
            .chain(&self.paused)
            .chain(&self.waiting)
            .filter_map(|s| s.view())
            .collect();
        sequences.sort_by_key(|v| match v.state {
            SessionState::Running => 0,
            SessionState::Paused => 1,
            SessionState::Queued => 2,
            SessionState::Swapped => 3,
            SessionState::Cached => 4,
        });
        out.extend(sequences);
        out.extend(self.cache.iter().map(|(key, session, since)| SessionView {
            key: SessionKey::Cached(key),
            state: SessionState::Cached,
            priority: 0,
            prompt_len: 0,
            n_generated: 0,
            context_len: session.len(),
            window: session.window(),
            since,
        }));
    }

    /// The prefix cache, for the session writer: conversations to save at shutdown,
    /// to export, and to take restored ones in.
    pub(crate) fn cache_mut(&mut self) -> &mut PrefixCache {
        &mut self.cache
    }

    pub(crate) fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// Takes a conversation read from disk into the prefix cache, then evicts what the
    /// budgets no longer allow.
    pub(crate) fn cache_restored(&mut self, session: Session) {
        self.happenings.record(What::Restored {
            id: None,
            tokens: session.len(),
        });
        self.retire(session);
    }

    /// Ends `seq`'s hold on its session: kept for reuse ([`Scheduler::retire`]), or, an
    /// embedding's, dropped (off the engine thread, with the evicted).
    pub(crate) fn release(&mut self, seq: Sequence) {
        if seq.embeds() {
            // A conversation of no tokens is freed, never written.
            let mut session = seq.session;
            session.truncate(0);
            self.evicted.push(session);
        } else {
            self.retire(seq.session);
        }
    }

    /// Keeps a session for reuse, then evicts what the session limit and the KV budget
    /// no longer allow.
    pub(crate) fn retire(&mut self, session: Session) {
        let (tokens, window) = (session.len(), session.window());
        if let Some(key) = self.cache.insert(session) {
            self.happenings.record(What::Cached {
                key,
                tokens,
                window,
            });
        }
        self.fit_budget(self.running_bytes(), self.max_cached());
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
                    None => self.target_window(s).map_or(0, |w| self.kv.bytes(w)),
                })
                .sum::<usize>()
    }

    /// Cached sessions allowed beside the running and paused ones.
    fn max_cached(&self) -> usize {
        self.config
            .max_sessions
            .saturating_sub(self.running.len() + self.paused.len())
    }

    /// Makes cached sessions fit the KV budget beside running sessions reserving
    /// `running_bytes`, and keeps at most `max_cached` of them (least recently used go
    /// first, to the session writer's outbox).
    fn fit_budget(&mut self, running_bytes: usize, max_cached: usize) {
        let room = self.config.kv_budget.saturating_sub(running_bytes);
        for (key, session) in self.cache.evict_to(max_cached, room) {
            self.happenings.record(What::SessionEvicted {
                key,
                tokens: session.len(),
            });
            self.evicted.push(session);
        }
    }
}
