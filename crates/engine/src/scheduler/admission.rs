//! Who runs: admission by priority, pausing, swapping out, and the KV budget.
//!
//! - **Order.** Queued requests and paused sequences compete by *level*: their
//!   `priority` (lower is more urgent, vLLM's convention) minus one for every
//!   [`EngineConfig::aging`](crate::EngineConfig::aging) they have waited (queued, or
//!   paused since they last ran); ties go to the earlier arrival. A running sequence is
//!   at its own priority, except for a *quantum* of one aging interval after it entered
//!   the batch, during which it keeps the level it entered at. Nothing starves: waiting
//!   only lowers a level, so a waiting request eventually beats every running one and
//!   then runs at least a quantum. Under a steady load of requests `d` levels more
//!   urgent, a background sequence runs about one interval in every `d + 2`.
//! - **Batch.** When the batch is full, a candidate more urgent than the least urgent
//!   running sequence (ties: the one running longest) pauses it. A paused sequence keeps
//!   its session and KV and resumes where it stopped, recomputing nothing.
//! - **Memory.** The KV budget holds running, paused and cached sessions together. A
//!   candidate that does not fit frees, in this order: cached conversations (least
//!   recently used first), then paused sequences (least urgent first), then running
//!   sequences less urgent than itself. A sequence giving up its memory is *swapped
//!   out*: its session goes to the prefix cache, from where eviction writes it to the
//!   session store when there is one (and a resume reads it back) or drops it (and a
//!   resume prefills it again, counted in `recomputed_tokens`). A request whose first
//!   window alone exceeds the budget fails when it is added, never waiting.

use std::time::Instant;

use pyramid_runtime::RuntimeError;

use super::{Scheduler, Stored, StoredPrefixes};
use crate::observe::What;
use crate::request::{Event, Request, RequestId};
use crate::sequence::{Sequence, SequenceStatus};
use crate::session::Session;
use crate::EngineError;

/// How a sequence about to run came by its session.
#[derive(Clone, Copy, Default)]
struct Reuse {
    /// A copy of a cached conversation's prefix.
    forked: bool,
    /// Looked up again for a swapped-out sequence.
    reattached: bool,
}

/// Who is next in line.
#[derive(Clone, Copy)]
enum Candidate {
    Queued(usize),
    Paused(usize),
}

/// Scheduling counters, for `/metrics` and reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PreemptionStats {
    /// Sequences paused for a more urgent one (keeping their KV).
    pub n_paused: usize,
    /// Paused sequences that ran again.
    pub n_resumed: usize,
    /// Paused or running sequences whose KV was given up for memory.
    pub n_swapped_out: usize,
    /// Tokens prefilled again because a swapped-out session was evicted meanwhile.
    pub recomputed_tokens: usize,
}

impl Scheduler {
    /// Why `request` can never run, if it cannot: checked once, when it is added.
    pub(crate) fn refusal(&self, request: &Request) -> Option<EngineError> {
        let largest = self.config.pyramid.ladder.largest();
        if request.prompt.is_empty() {
            Some(EngineError::EmptyPrompt)
        } else if request.is_embedding() && !self.mixed {
            Some(EngineError::BadRequest(
                "embeddings run on the native route (--device cpu): this route's compiled \
                 artifacts return logits, not hidden states"
                    .to_string(),
            ))
        } else if request.max_tokens == 0 && !request.is_embedding() {
            Some(EngineError::BadRequest(
                "max_tokens must be at least 1".to_string(),
            ))
        } else if request.prompt.len() > largest {
            let needed = request.prompt.len();
            Some(EngineError::Runtime(RuntimeError::BeyondLargestWindow {
                needed,
                largest,
            }))
        } else {
            let window = self.first_window(request.prompt.len(), request.max_tokens)?;
            let bytes = self.kv.bytes(window);
            (bytes > self.config.kv_budget).then_some(EngineError::OverBudget {
                bytes,
                budget: self.config.kv_budget,
            })
        }
    }

    fn candidate(&self, c: Candidate) -> &Sequence {
        match c {
            Candidate::Queued(i) => &self.waiting[i],
            Candidate::Paused(i) => &self.paused[i],
        }
    }

    fn candidate_mut(&mut self, c: Candidate) -> &mut Sequence {
        match c {
            Candidate::Queued(i) => &mut self.waiting[i],
            Candidate::Paused(i) => &mut self.paused[i],
        }
    }

    fn candidate_level(&self, c: Candidate, now: Instant) -> (i64, u64) {
        let s = self.candidate(c);
        (s.level(now, self.config.aging), s.arrival)
    }

    /// Asks `stored` for a conversation outside memory that `c` would resume from,
    /// sharing more than the prefix cache holds: one in memory is attached to it at once;
    /// for one being read from disk it waits (`Loading`, and `true`).
    fn waits_for_stored(&mut self, c: Candidate, stored: &mut dyn StoredPrefixes) -> bool {
        let seq = self.candidate(c);
        let kept = seq.session.window().is_some();
        if kept || seq.restored.is_some() || seq.asked_store || seq.embeds() {
            return false;
        }
        let cached = self.cache.longest(&seq.input).map_or(0, |(_, n)| n);
        match stored.longer_prefix(seq.id(), &seq.input, cached) {
            Stored::Nothing => false,
            Stored::Ready(session) => {
                let id = seq.id();
                self.happenings.record(What::Restored {
                    id: Some(id),
                    tokens: session.len(),
                });
                self.candidate_mut(c).restored = Some(*session);
                false
            }
            Stored::Loading => {
                self.candidate_mut(c).start_loading();
                true
            }
        }
    }

    /// A conversation read back for request `id` (`None`: the read failed): attached to
    /// it, which competes for admission again; kept in the prefix cache if the request
    /// is gone.
    pub fn loaded(&mut self, id: RequestId, restored: Option<Session>) {
        let seq = self
            .waiting
            .iter_mut()
            .chain(self.paused.iter_mut())
            .find(|s| s.id() == id);
        if let Some(session) = &restored {
            self.happenings.record(What::Restored {
                id: Some(id),
                tokens: session.len(),
            });
        }
        match (seq, restored) {
            (Some(seq), restored) => seq.loaded(restored),
            (None, Some(session)) => self.retire(session),
            (None, None) => {}
        }
    }

    /// The most urgent queued request or paused sequence.
    fn next_candidate(&self, now: Instant) -> Option<Candidate> {
        let queued = (0..self.waiting.len()).map(Candidate::Queued);
        let paused = (0..self.paused.len()).map(Candidate::Paused);
        queued
            .chain(paused)
            .filter(|&c| self.candidate(c).status() != SequenceStatus::Loading)
            .filter(|&c| match c {
                Candidate::Queued(i) => {
                    let seq = &self.waiting[i];
                    seq.embeds() || !self.waits_for_shared_prefill(&seq.input)
                }
                Candidate::Paused(_) => true,
            })
            .min_by_key(|&c| self.candidate_level(c, now))
    }

    /// The running sequence to pause for a candidate at `level`: the least urgent (ties:
    /// running longest), if it is less urgent than the candidate.
    fn victim(&self, level: i64, now: Instant) -> Option<usize> {
        let aging = self.config.aging;
        (0..self.running.len())
            .max_by_key(|&i| {
                let s = &self.running[i];
                (s.level(now, aging), std::cmp::Reverse(s.running_since))
            })
            .filter(|&i| self.running[i].level(now, aging) > level)
    }

    /// Moves queued requests and paused sequences into the batch, most urgent first,
    /// while the batch has room (or holds something less urgent to pause) and the KV
    /// budget holds them.
    pub(crate) fn admit(&mut self, stored: &mut dyn StoredPrefixes) {
        loop {
            let now = Instant::now();
            let Some(candidate) = self.next_candidate(now) else {
                break;
            };
            let (cand_level, _) = self.candidate_level(candidate, now);
            if self.running.len() >= self.config.max_batch && self.victim(cand_level, now).is_none()
            {
                break;
            }
            if self.waits_for_stored(candidate, stored) {
                continue;
            }
            let (mut seq, reuse) = match candidate {
                Candidate::Queued(i) => self.take_queued(i, now),
                Candidate::Paused(i) => self.unpause(i),
            };
            // What it adds to the reserved bytes: its window, or the cache it holds.
            let held = seq.session.kv_bytes().0;
            let needed = if seq.session.window().is_some() {
                held
            } else {
                self.target_window(&seq)
                    .map_or(0, |w| self.kv.bytes(w))
                    .max(held)
            };
            // Running sequences waiting to grow come first: their growth is reserved.
            let total = self
                .running_bytes()
                .saturating_add(self.stalled_growth())
                .saturating_add(needed);
            if !self.make_room(total, cand_level, now, true) {
                let holds_nothing = self.running.is_empty() && self.paused.is_empty();
                if holds_nothing && matches!(candidate, Candidate::Queued(_)) {
                    // Nothing holds memory that could be freed: it never fits.
                    self.events.push(Event::Failed {
                        id: seq.request.id,
                        error: EngineError::OverBudget {
                            bytes: needed,
                            budget: self.config.kv_budget,
                        },
                    });
                    seq.finish();
                    if !reuse.forked {
                        self.cache.insert(std::mem::take(&mut seq.session));
                    }
                    continue;
                }
                self.put_back(seq, reuse);
                break;
            }
            if self.running.len() >= self.config.max_batch {
                match self.victim(cand_level, now) {
                    Some(v) => self.pause(v, now),
                    None => {
                        self.put_back(seq, reuse);
                        break;
                    }
                }
            }
            self.run(seq, cand_level, now);
        }
        self.fit_budget(self.running_bytes(), self.max_cached());
    }

    /// Frees KV memory until running and paused sessions reserving `total` bytes fit
    /// the budget: cached sessions first, then paused sequences, then (with
    /// `running_too`) running ones less urgent than `level`, least urgent first.
    /// `false` if that is not enough, and then nothing was swapped out.
    pub(crate) fn make_room(
        &mut self,
        total: usize,
        level: i64,
        now: Instant,
        running_too: bool,
    ) -> bool {
        let budget = self.config.kv_budget;
        let aging = self.config.aging;
        if total <= budget {
            self.fit_budget(total, usize::MAX);
            return true;
        }
        let mut bytes = total;
        // `(running?, index, level, bytes)` of what could give its memory up.
        let mut victims: Vec<(bool, usize, i64, usize)> = Vec::new();
        for (i, s) in self.paused.iter().enumerate() {
            // Admitting, every paused sequence is at most as urgent as the candidate.
            let l = s.level(now, aging);
            if (running_too || l > level) && s.session.window().is_some() {
                victims.push((false, i, l, s.session.kv_bytes().0));
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            let l = s.level(now, aging);
            if running_too && l > level && s.session.window().is_some() {
                victims.push((true, i, l, s.session.kv_bytes().0));
            }
        }
        let freeable: usize = victims.iter().map(|v| v.3).sum();
        if bytes > budget.saturating_add(freeable) {
            return false;
        }
        victims.sort_by_key(|&(running, _, l, _)| (running, std::cmp::Reverse(l)));
        let mut chosen = Vec::new();
        for v in victims {
            if bytes <= budget {
                break;
            }
            bytes -= v.3;
            chosen.push(v);
        }
        // Running victims pause first (highest index first, so the others stay valid),
        // then every chosen paused sequence swaps out (likewise).
        let mut paused: Vec<usize> = chosen.iter().filter(|v| !v.0).map(|v| v.1).collect();
        let mut running: Vec<usize> = chosen.iter().filter(|v| v.0).map(|v| v.1).collect();
        running.sort_unstable_by(|a, b| b.cmp(a));
        for i in running {
            self.pause(i, now);
            paused.push(self.paused.len() - 1);
        }
        paused.sort_unstable_by(|a, b| b.cmp(a));
        for i in paused {
            self.swap_out(i);
        }
        self.fit_budget(bytes, usize::MAX);
        true
    }

    /// Pauses running sequence `i`, keeping its KV.
    fn pause(&mut self, i: usize, now: Instant) {
        let mut seq = self.running.remove(i);
        seq.pause(now);
        self.preemption.n_paused += 1;
        self.happenings.record(What::Pause { id: seq.id() });
        self.paused.push(seq);
    }

    /// KV bytes the running sequences stalled on a larger window will add once they
    /// move: what admission must leave them.
    fn stalled_growth(&self) -> usize {
        self.running
            .iter()
            .filter(|s| s.stalled_since.is_some() && s.session.window().is_some())
            .filter_map(|s| {
                let target = self.target_window(s)?;
                Some(self.kv.bytes(target).saturating_sub(s.session.kv_bytes().0))
            })
            .sum()
    }

    /// Pauses running sequence `i` and gives its KV up at once.
    pub(super) fn swap_out_running(&mut self, i: usize, now: Instant) {
        self.pause(i, now);
        let last = self.paused.len() - 1;
        if self.paused[last].session.window().is_some() {
            self.swap_out(last);
        }
        self.fit_budget(self.running_bytes(), self.max_cached());
    }

    /// Gives paused sequence `i`'s KV up: its session goes to the prefix cache (and on
    /// from there to the session store or nowhere), and the sequence will prefill what
    /// it held again unless its resume finds it cached.
    fn swap_out(&mut self, i: usize) {
        let session = self.paused[i].swap_out();
        self.preemption.n_swapped_out += 1;
        self.happenings.record(What::SwapOut {
            id: self.paused[i].id(),
        });
        if self.paused[i].embeds() {
            // It will prefill again, pooling every row: nothing of it is kept.
            let mut session = session;
            session.truncate(0);
            self.evicted.push(session);
        } else {
            self.cache.insert(session);
        }
    }

    /// Takes paused sequence `i` out of the paused list to run it; one without a
    /// session (swapped out) gets the longest cached prefix of what it held.
    fn unpause(&mut self, i: usize) -> (Sequence, Reuse) {
        let mut seq = self.paused.swap_remove(i);
        let mut reuse = Reuse::default();
        // A swapped-out embedding prefills from nothing, as it started.
        if seq.session.window().is_none() && !seq.embeds() {
            let restored = seq.restored.take();
            let (session, reused, forked) =
                self.reuse_for(&seq.input, seq.request.max_tokens, restored);
            seq.reattach(session, reused);
            reuse = Reuse {
                forked,
                reattached: true,
            };
        }
        (seq, reuse)
    }

    /// Returns a sequence that could not run to where it came from, and a session it
    /// took from the cache to the cache (a fork is dropped: what it copied is still
    /// cached).
    fn put_back(&mut self, mut seq: Sequence, reuse: Reuse) {
        if seq.status() == SequenceStatus::Queued {
            let session = seq.requeue();
            if !reuse.forked {
                self.cache.insert(session);
            }
            self.waiting.push_back(seq);
            return;
        }
        if reuse.reattached {
            let session = seq.detach();
            if !reuse.forked {
                self.cache.insert(session);
            }
        }
        self.paused.push(seq);
    }

    /// Puts a sequence in the batch at `level`: a new one (`Started`), or a paused one
    /// resuming.
    fn run(&mut self, mut seq: Sequence, level: i64, now: Instant) {
        if seq.is_paused() {
            self.preemption.n_resumed += 1;
            let id = seq.id();
            self.happenings.record(match seq.status() {
                SequenceStatus::Swapped => What::SwapIn { id },
                _ => What::Resume { id },
            });
            if seq.swapped_len > 0 {
                self.preemption.recomputed_tokens += seq.swapped_len.saturating_sub(seq.fed);
                seq.swapped_len = 0;
            }
        } else {
            self.events.push(Event::Started {
                id: seq.request.id,
                cached_tokens: seq.cached_tokens,
            });
        }
        seq.start_running(level, now);
        self.running.push(seq);
    }

    /// Takes queued request `i` out of the queue, admitted on the cached session sharing
    /// its longest prefix (whether that is a fork is in the [`Reuse`]).
    /// [`Scheduler::refusal`] passed it when it was added.
    fn take_queued(&mut self, i: usize, now: Instant) -> (Sequence, Reuse) {
        let mut seq = self
            .waiting
            .remove(i)
            .expect("a candidate's index is in the queue");
        // The last prompt token always runs, for the logits the first sample needs.
        let restored = seq.restored.take();
        let from_store = restored.is_some();
        let running = (restored.is_none() && !seq.embeds())
            .then(|| self.fork_running(&seq.input, seq.request.max_tokens))
            .flatten();
        let (mut session, reused, forked) = match running {
            Some((fork, shared)) => (fork, shared, true),
            // An embedding pools every row: it prefills from nothing.
            None if seq.embeds() => (Session::default(), 0, false),
            None => self.reuse_for(&seq.input, seq.request.max_tokens, restored),
        };
        if forked {
            self.happenings.record(What::Fork {
                id: seq.id(),
                shared: reused,
            });
        }
        session.truncate(reused);
        if session.is_empty() {
            let reply = seq
                .request
                .max_tokens
                .min(self.config.pyramid.generation_reserve);
            session.assume_turn(seq.prompt_len.saturating_add(reply));
        }
        seq.admit(session, reused, now);
        // The stored conversation is longer than any cached prefix, so it is the one used.
        seq.restored_tokens = if from_store { reused } else { 0 };
        (
            seq,
            Reuse {
                forked,
                reattached: false,
            },
        )
    }

    /// The cached session a prompt reuses, the prompt tokens it covers (never the last
    /// one), and whether it is a fork. A prompt that extends a cached conversation takes
    /// it; one that diverges from it (another agent on the same system prompt) gets a copy
    /// of the shared prefix, and the conversation stays cached whole. If the copy cannot
    /// be made the conversation is taken and cut, as the last resort before a full prefill.
    /// A conversation that cannot go on from the shared prefix (its sliding-window layers
    /// gave back rows that far back) is not reused. A conversation `restored` for the
    /// sequence from outside memory joins the cache first.
    pub(crate) fn reuse_for(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
        restored: Option<Session>,
    ) -> (Session, usize, bool) {
        if let Some(session) = restored {
            self.cache.insert(session);
        }
        let Some((i, shared)) = self.cache.longest(prompt) else {
            return (Session::default(), 0, false);
        };
        let reused = shared.min(prompt.len() - 1);
        let cached = self.cache.session(i);
        if !cached.resumable_at(reused) {
            // Its sliding-window layers gave back what going on from there would read.
            return (Session::default(), 0, false);
        }
        if reused < cached.len() {
            if let Some(parent) = cached.window() {
                let window = self.fork_window(parent, prompt.len(), max_tokens);
                let kv = self.kv.new_cache(window);
                if let Some((fork, copied)) = self.cache.session(i).fork(reused, window, kv) {
                    self.cache.touch(i);
                    self.artifacts.record_fork(copied);
                    return (fork, reused, true);
                }
            }
        }
        (self.cache.take(i), reused, false)
    }

    /// The window a fork of a conversation on `parent` starts on: the one its own prompt
    /// and reply need (an agent branching off a long conversation's system prompt does not
    /// hold the long one's window), if its artifacts are compiled; the parent's otherwise,
    /// whose artifacts the fork shares, rather than waiting for a compile.
    pub(super) fn fork_window(&self, parent: usize, prompt_len: usize, max_tokens: usize) -> usize {
        self.first_window(prompt_len, max_tokens)
            .filter(|&own| own == parent || self.mixed || self.artifacts.window_ready(own))
            .unwrap_or(parent)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::sequence::level;

    #[test]
    fn waiting_lowers_the_level_one_step_per_aging_interval() {
        let s = Duration::from_secs(1);
        assert_eq!(level(3, Duration::ZERO, s), 3);
        assert_eq!(level(3, Duration::from_millis(999), s), 3);
        assert_eq!(level(3, Duration::from_millis(2500), s), 1);
        assert_eq!(level(-1, Duration::from_secs(3600), Duration::ZERO), -1);
        assert_eq!(
            level(i32::MIN, Duration::MAX, Duration::from_nanos(1)),
            i64::MIN
        );
    }
}
