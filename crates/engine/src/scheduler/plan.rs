//! Deciding a step: tokens, windows, drafts, compiles.
//!
//! - **Tokens**: every decoding sequence feeds one token; prompts share at most
//!   `prefill_chunk` tokens per step, most urgent first and, within a priority, in equal
//!   parts (on mixed passes), so a long prompt is prefilled over several steps while the
//!   others keep decoding and a short one behind it starts soon.
//! - **Windows**: a sequence that this step would overflow moves to the next rung first
//!   (a migration, or a re-prefill under [`Arm::Reprefill`]); on a static route only
//!   once that window's artifacts are compiled. Until then it stalls (counted) and the
//!   rest of the batch runs.
//! - **Compiles**: missing windows and decode batch sizes compile in the background; under
//!   [`Arm::Predictive`], the next window compiles when the predictor expects the crossing
//!   sooner than the compile would take.

use std::time::Instant;

use pyramid_runtime::ArtifactShape;

use super::{Scheduler, StoredPrefixes};
use crate::pyramid::Arm;
use crate::request::{Event, RequestId};
use crate::sequence::Sequence;
use crate::session::Session;
use crate::speculate::{Speculation, Tokens};
use crate::step::{decode_batches, DecodeRun, Move, Schedule};
use crate::EngineError;

impl Scheduler {
    /// Decides the next step. Admission happens here (a stored conversation a candidate
    /// resumes from comes from `stored`); nothing runs.
    pub fn schedule(&mut self, stored: &mut dyn StoredPrefixes) -> Schedule {
        self.admit(stored);
        // The most urgent get the prefill chunk first; arrival order within a priority.
        self.running
            .sort_by_key(|s| (s.request.priority, s.arrival));
        let now = Instant::now();
        let mut schedule = Schedule::default();
        let shares = self.prefill_shares();
        let mut decoding: Vec<(RequestId, usize)> = Vec::new();
        let mut overflow: Vec<RequestId> = Vec::new();
        let mut planned_bytes = self.running_bytes();
        // Decoding sequences that may draft: (running index, window) and their rank.
        let mut candidates: Vec<((usize, usize), f64)> = Vec::new();
        for i in 0..self.running.len() {
            let seq = &self.running[i];
            let prefilling = seq.prefilling();
            let n = if prefilling {
                shares
                    .iter()
                    .find(|s| s.0 == seq.request.id)
                    .map_or(0, |s| s.1)
            } else {
                usize::from(seq.next_input.is_some())
            };
            if n == 0 {
                continue;
            }
            let id = seq.request.id;
            let needed = seq.session.len() + n;
            let current = seq.session.window();
            let held = seq.session.kv_bytes().0;
            let priority = seq.request.priority;
            let (window, how) = match current {
                Some(w) if needed <= w => (w, None),
                _ => {
                    let Some(target) = self.target_window(seq) else {
                        overflow.push(id);
                        continue;
                    };
                    let how = match (current, self.config.pyramid.arm) {
                        (None, _) => Move::First,
                        (Some(_), Arm::Reprefill) => Move::Reprefill,
                        (Some(_), _) => Move::Migrate,
                    };
                    (target, Some(how))
                }
            };
            if let Some(how) = how {
                let ready = self.mixed || self.artifacts.window_ready(window);
                // `running_bytes` already counts an unplaced sequence at its target.
                let counted = match current {
                    Some(_) => held,
                    None => self.kv.bytes(window),
                };
                let extra = self.kv.bytes(window).saturating_sub(counted);
                let fits = self.evict_for(planned_bytes + extra, priority);
                if !ready || !fits {
                    if !ready && !self.artifacts.is_prepared(window) {
                        schedule
                            .compiles
                            .extend(self.artifacts.shapes(window).iter().copied());
                    }
                    schedule.stalled.push((id, window));
                    continue;
                }
                planned_bytes += extra;
                schedule.moves.push((id, window, how));
                if let Some(since) = self.running[i].stalled_since.take() {
                    if how != Move::First {
                        schedule
                            .stalls
                            .push((id, now.saturating_duration_since(since)));
                    }
                }
            }
            if prefilling {
                schedule.prefills.push((id, n));
            } else {
                // A draft rides only in the window the sequence already has.
                if how.is_none() {
                    candidates.push(((i, window), self.running[i].drafter.rank()));
                }
                decoding.push((id, window));
            }
        }
        let rows = schedule.prefills.iter().map(|p| p.1).sum::<usize>() + decoding.len();
        let room = self.config.speculative.pass_rows.saturating_sub(rows);
        let drafts = fit_drafts(candidates, room, |(i, window), room| {
            self.draft_for(i, window, room)
        });
        schedule.drafts = drafts
            .into_iter()
            .map(|((i, _), draft)| (self.running[i].request.id, draft))
            .collect();
        for id in overflow {
            // Admission and sampling keep sequences within the largest window; this is
            // the guard should they not.
            if let Some(i) = self.running.iter().position(|s| s.request.id == id) {
                let seq = self.running.swap_remove(i);
                let needed = seq.session.len() + 1;
                let largest = self.config.pyramid.ladder.largest();
                self.events.push(Event::Failed {
                    id,
                    error: EngineError::Runtime(
                        pyramid_runtime::RuntimeError::BeyondLargestWindow { needed, largest },
                    ),
                });
            }
        }
        self.plan_decodes(&decoding, &mut schedule);
        self.plan_predictive_compiles(&mut schedule);
        schedule.compiles.sort_unstable();
        schedule.compiles.dedup();
        schedule
    }

    /// This step's prompt tokens per prefilling sequence, within the prefill chunk: the
    /// most urgent priority first. Within a priority, on a route of mixed passes, the
    /// chunk is shared (an equal part each, then what is left in arrival order), so a
    /// short prompt arriving behind a long one starts within a few steps instead of
    /// after the whole long prompt. On a static route each part would be padded to the
    /// artifact's chunk, so there the chunk goes whole, in arrival order.
    fn prefill_shares(&self) -> Vec<(RequestId, usize)> {
        let mut budget = self.config.pyramid.prefill_chunk;
        let mut shares: Vec<(RequestId, usize)> = Vec::new();
        let prefilling: Vec<&Sequence> = self.running.iter().filter(|s| s.prefilling()).collect();
        // `running` is sorted by (priority, arrival): groups are consecutive.
        for group in prefilling.chunk_by(|a, b| a.request.priority == b.request.priority) {
            if budget == 0 {
                break;
            }
            let need = |s: &Sequence| s.input.len() - s.fed;
            let equal = if self.mixed {
                (budget / group.len()).max(1)
            } else {
                budget
            };
            let mut given: Vec<usize> = Vec::with_capacity(group.len());
            for s in group {
                let n = need(s).min(equal).min(budget);
                budget -= n;
                given.push(n);
            }
            for (s, n) in group.iter().zip(&mut given) {
                let more = (need(s) - *n).min(budget);
                budget -= more;
                *n += more;
            }
            shares.extend(group.iter().map(|s| s.request.id).zip(given));
        }
        shares
    }

    /// The window a sequence moves to when it has none yet or outgrows its own: the
    /// smallest holding what it needs plus the generation reserve where the ladder
    /// allows (the largest from the start under [`Arm::Largest`]). `None` beyond the
    /// largest window.
    pub(crate) fn target_window(&self, seq: &Sequence) -> Option<usize> {
        let cfg = &self.config.pyramid;
        let ladder = &cfg.ladder;
        let n = if seq.prefilling() {
            (seq.input.len() - seq.fed).min(cfg.prefill_chunk)
        } else {
            1
        };
        let needed = seq.session.len() + n;
        if seq.session.window().is_some() {
            return self.window_for(needed, needed, seq.request.max_tokens);
        }
        if cfg.arm == Arm::Largest {
            return (needed <= ladder.largest()).then_some(ladder.largest());
        }
        // A new session reserves room for its whole prompt and some generation.
        self.window_for(needed, needed.max(seq.input.len()), seq.request.max_tokens)
    }

    /// The window a new request with a prompt of `prompt_len` tokens starts on (what
    /// [`Scheduler::target_window`] gives its sequence before it runs); `None` beyond the
    /// largest window.
    pub(crate) fn first_window(&self, prompt_len: usize, max_tokens: usize) -> Option<usize> {
        let largest = self.config.pyramid.ladder.largest();
        if self.config.pyramid.arm == Arm::Largest {
            return (prompt_len <= largest).then_some(largest);
        }
        self.window_for(prompt_len, prompt_len, max_tokens)
    }

    /// The smallest window holding `needed` positions, and `horizon` plus the generation
    /// reserve (at most `max_tokens`) where the ladder allows.
    fn window_for(&self, needed: usize, horizon: usize, max_tokens: usize) -> Option<usize> {
        let cfg = &self.config.pyramid;
        let ladder = &cfg.ladder;
        let reserve = max_tokens.min(cfg.generation_reserve);
        let rung = ladder.rung_for(needed).ok()?.max(
            ladder
                .rung_for(horizon.saturating_add(reserve).min(ladder.largest()))
                .ok()?,
        );
        Some(ladder.windows()[rung])
    }

    /// A draft for the decoding sequence `running[i]` on `window`: within the window, its
    /// `max_tokens`, the `pass_room` rows left in the pass and the engine's draft length;
    /// none on static artifacts (one row of logits per sequence) or under a grammar
    /// constraint.
    fn draft_for(&mut self, i: usize, window: usize, pass_room: usize) -> Vec<u32> {
        let config = self.config.speculative;
        let mixed = self.mixed;
        let seq = &mut self.running[i];
        let Some(next) = seq.next_input else {
            return Vec::new();
        };
        if !mixed || seq.request.speculation == Speculation::Off || seq.request.constraint.is_some()
        {
            return Vec::new();
        }
        // The next input and the draft take positions len..=len+d; the draft's last
        // token is sampled only if all of it is accepted, so it ends the reply at most.
        let in_window = window.saturating_sub(seq.session.len() + 1);
        let in_reply = seq.request.max_tokens.saturating_sub(seq.generated + 1);
        let tokens = Tokens {
            history: seq.session.tokens(),
            next,
            reply_len: seq.generated,
        };
        let room = in_window.min(in_reply).min(pass_room);
        seq.drafter
            .propose(&config, &tokens, &seq.request.prediction, room)
    }

    /// Groups decoding sequences by window into runs of compiled batch sizes; a batch
    /// size not compiled yet is requested and meanwhile covered by smaller ones.
    fn plan_decodes(&self, decoding: &[(RequestId, usize)], schedule: &mut Schedule) {
        if decoding.is_empty() {
            return;
        }
        if self.mixed {
            // One pass for everyone: the window is only a grouping label here.
            schedule.decodes.push(DecodeRun {
                window: self.config.pyramid.ladder.largest(),
                batch: decoding.len(),
                ids: decoding.iter().map(|d| d.0).collect(),
            });
            return;
        }
        let sizes = decode_batches(self.config.max_batch);
        let mut windows: Vec<usize> = decoding.iter().map(|d| d.1).collect();
        windows.sort_unstable();
        windows.dedup();
        for window in windows {
            let mut ids: Vec<RequestId> = decoding
                .iter()
                .filter(|d| d.1 == window)
                .map(|d| d.0)
                .collect();
            let ready = |b: usize| b == 1 || self.artifacts.decode_ready(b, window);
            while !ids.is_empty() {
                let fitting = *sizes.iter().find(|&&b| b >= ids.len()).unwrap_or(&1);
                let batch = if ready(fitting) {
                    fitting
                } else {
                    schedule.compiles.push(ArtifactShape::Decode {
                        batch: fitting,
                        window,
                    });
                    sizes
                        .iter()
                        .copied()
                        .filter(|&b| b <= ids.len() && ready(b))
                        .max()
                        .unwrap_or(1)
                };
                let rest = ids.split_off(batch.min(ids.len()));
                schedule.decodes.push(DecodeRun { window, batch, ids });
                ids = rest;
            }
        }
    }

    /// Under [`Arm::Predictive`], asks for each running session's next window when its
    /// predicted crossing is nearer than that window's compile; a session not placed yet
    /// is judged at the window it is about to get, holding its whole prompt.
    fn plan_predictive_compiles(&self, schedule: &mut Schedule) {
        for seq in &self.running {
            let (window, len) = match seq.session.window() {
                Some(w) => (w, seq.session.len()),
                None => match self.target_window(seq) {
                    Some(w) => (w, seq.input.len()),
                    None => continue,
                },
            };
            let Some(next) = self.predicted_next_window(&seq.session, window, len) else {
                continue;
            };
            if !self.artifacts.is_prepared(next) {
                schedule
                    .compiles
                    .extend(self.artifacts.shapes(next).iter().copied());
            }
        }
    }

    /// The window after `window`, when [`Arm::Predictive`] expects `session` (holding
    /// `len` tokens) to reach it sooner than its artifacts would compile.
    pub(crate) fn predicted_next_window(
        &self,
        session: &Session,
        window: usize,
        len: usize,
    ) -> Option<usize> {
        let cfg = &self.config.pyramid;
        if cfg.arm != Arm::Predictive || self.mixed {
            return None;
        }
        let next = *cfg.ladder.windows().iter().find(|&&w| w > window)?;
        let expected = self.artifacts.expected_compile(next);
        session
            .should_prepare_after(window, len, expected, cfg.margin)
            .then_some(next)
    }

    /// Whether running and paused sessions reserving `running_bytes` fit the KV budget
    /// for a sequence of priority `priority` to grow, evicting pooled caches, cached
    /// sessions and then paused sequences less urgent than it, as needed.
    fn evict_for(&mut self, running_bytes: usize, priority: i32) -> bool {
        self.make_room(running_bytes, i64::from(priority), Instant::now(), false)
    }
}

/// The drafts a pass with room for `room` more rows verifies. Candidates ask `propose`
/// in order of their drafts' acceptance (ties in running order), each for at most the
/// room left (a draft's prefix is a draft too); once the pass is full no one else asks, so
/// a sequence that could not fit neither searches its history nor spends a pass of its
/// cool-down. A sequence left out keeps its rank, so it drafts again once the leaders'
/// acceptance falls or the batch thins.
fn fit_drafts<K: Copy>(
    mut candidates: Vec<(K, f64)>,
    mut room: usize,
    mut propose: impl FnMut(K, usize) -> Vec<u32>,
) -> Vec<(K, Vec<u32>)> {
    candidates.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut drafts = Vec::new();
    for (key, _) in candidates {
        if room == 0 {
            break;
        }
        let mut draft = propose(key, room);
        draft.truncate(room);
        if !draft.is_empty() {
            room -= draft.len();
            drafts.push((key, draft));
        }
    }
    drafts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_fit_the_room_best_accepted_first_and_no_one_asks_a_full_pass() {
        let candidates = vec![(1, 0.2), (2, 0.9), (3, 0.5), (4, 0.5)];
        let drafts = |id: u32| -> Vec<u32> {
            match id {
                1 => vec![10, 11, 12],
                2 => vec![20, 21, 22, 23],
                3 => vec![30, 31],
                _ => Vec::new(),
            }
        };
        let fit = |room| {
            let mut asked = Vec::new();
            let fitted = fit_drafts(candidates.clone(), room, |id, room| {
                asked.push((id, room));
                let mut draft = drafts(id);
                draft.truncate(room);
                draft
            });
            (fitted, asked)
        };
        // Best rank first; an empty draft takes no room; the last asks for what is left.
        let (fitted, asked) = fit(7);
        assert_eq!(
            fitted,
            [(2, vec![20, 21, 22, 23]), (3, vec![30, 31]), (1, vec![10])]
        );
        assert_eq!(asked, [(2, 7), (3, 3), (4, 1), (1, 1)]);
        // Once the room is gone no one else is asked.
        let (fitted, asked) = fit(5);
        assert_eq!(fitted, [(2, vec![20, 21, 22, 23]), (3, vec![30])]);
        assert_eq!(asked, [(2, 5), (3, 1)]);
        assert!(fit(0).1.is_empty());
        assert_eq!(fit(100).0.len(), 3);
    }
}
