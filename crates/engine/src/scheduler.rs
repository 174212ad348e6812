//! Deciding a step: admission, token budget, windows, compiles.
//!
//! - **Admission** in arrival order while the batch has room and the KV budget holds the
//!   request's first window (evicting cached sessions first); a request that does not
//!   fit waits in the queue, and one that could never fit fails.
//! - **Prefix reuse**: an admitted request takes the cached session sharing the longest
//!   prefix with its prompt and feeds only the rest (always at least its last token).
//! - **Tokens**: every decoding sequence feeds one token; prompts share at most
//!   `prefill_chunk` tokens per step, in admission order, so a long prompt is prefilled
//!   over several steps while the others keep decoding.
//! - **Windows**: a sequence that this step would overflow moves to the next rung first
//!   (a migration, or a re-prefill under [`Arm::Reprefill`]); on a static backend only
//!   once that window's artifacts are compiled. Until then it stalls (counted) and the
//!   rest of the batch runs.
//! - **Compiles**: missing windows and decode batch sizes compile in the background; under
//!   [`Arm::Predictive`], the next window compiles when the predictor expects the crossing
//!   sooner than the compile would take.

use std::time::{Duration, Instant};

use pyramid_runtime::{ArtifactShape, Sampler};

use crate::engine::{Engine, Sequence};
use crate::pyramid::Arm;
use crate::request::{Event, RequestId};
use crate::session::Session;
use crate::EngineError;

/// How a sequence gets the window it runs on this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Its first window.
    First,
    /// The live cache copied into a larger window.
    Migrate,
    /// A larger window, every cached token prefilled again ([`Arm::Reprefill`]).
    Reprefill,
}

/// One run of a decode artifact: sequences on one window, at most `batch` of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeRun {
    pub window: usize,
    /// The compiled batch size used (static backends); the sequence count otherwise.
    pub batch: usize,
    pub ids: Vec<RequestId>,
}

/// What one step runs, decided before anything runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Sequences placed on a window before they run: `(id, window, how)`.
    pub moves: Vec<(RequestId, usize, Move)>,
    /// Prompt chunks: `(id, tokens fed this step)`.
    pub prefills: Vec<(RequestId, usize)>,
    /// Decode runs, grouped by window.
    pub decodes: Vec<DecodeRun>,
    /// Sequences waiting for the artifacts (or the memory) of a window: `(id, window)`.
    pub stalled: Vec<(RequestId, usize)>,
    /// Artifacts to start compiling in the background.
    pub compiles: Vec<ArtifactShape>,
    /// Compact caches to fault in on a background thread ahead of a predicted crossing
    /// (backends that bind cache memory): `(window, positions)`, the positions being the
    /// window the session leaves, which its migration will copy.
    pub prefaults: Vec<(usize, usize)>,
}

impl Schedule {
    /// Whether nothing runs this step.
    pub fn is_idle(&self) -> bool {
        self.prefills.is_empty() && self.decodes.is_empty()
    }

    /// Sequences that feed tokens this step.
    pub fn n_scheduled(&self) -> usize {
        self.prefills.len() + self.decodes.iter().map(|d| d.ids.len()).sum::<usize>()
    }
}

/// Decode batch sizes compiled for static backends: powers of two up to `max_batch`,
/// and `max_batch` itself.
pub fn decode_batches(max_batch: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = std::iter::successors(Some(1usize), |b| b.checked_mul(2))
        .take_while(|&b| b < max_batch)
        .collect();
    sizes.push(max_batch.max(1));
    sizes
}

impl Engine {
    /// Decides the next step. Admission happens here; nothing runs.
    pub fn schedule(&mut self) -> Schedule {
        self.admit();
        let mut schedule = Schedule::default();
        let mut budget = self.config.pyramid.prefill_chunk;
        let mut decoding: Vec<(RequestId, usize)> = Vec::new();
        let mut overflow: Vec<RequestId> = Vec::new();
        let mut planned_bytes = self.running_bytes();
        for i in 0..self.running.len() {
            let seq = &self.running[i];
            let prefilling = seq.prefilling();
            let n = if prefilling {
                (seq.request.prompt.len() - seq.fed).min(budget)
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
                let ready = self.mixed.is_some() || self.pyramid.window_ready(window).is_some();
                // `running_bytes` already counts an unplaced sequence at its target.
                let counted = match current {
                    Some(_) => held,
                    None => self.kv_bytes_for(window),
                };
                let extra = self.kv_bytes_for(window).saturating_sub(counted);
                let fits = self.evict_for(planned_bytes + extra);
                if !ready || !fits {
                    if !ready && !self.pyramid.is_prepared(window) {
                        schedule
                            .compiles
                            .extend(self.pyramid.shapes(window).iter().copied());
                    }
                    schedule.stalled.push((id, window));
                    continue;
                }
                planned_bytes += extra;
                schedule.moves.push((id, window, how));
            }
            if prefilling {
                budget -= n;
                schedule.prefills.push((id, n));
            } else {
                decoding.push((id, window));
            }
        }
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
        schedule.prefaults.sort_unstable();
        schedule.prefaults.dedup();
        schedule
    }

    /// The window a sequence moves to when it has none yet or outgrows its own: the
    /// smallest holding what it needs plus the generation reserve where the ladder
    /// allows (the largest from the start under [`Arm::Largest`]). `None` beyond the
    /// largest window.
    pub(crate) fn target_window(&self, seq: &Sequence) -> Option<usize> {
        let cfg = &self.config.pyramid;
        let ladder = &cfg.ladder;
        let n = if seq.prefilling() {
            (seq.request.prompt.len() - seq.fed).min(cfg.prefill_chunk)
        } else {
            1
        };
        let needed = seq.session.len() + n;
        if seq.session.window().is_none() && cfg.arm == Arm::Largest {
            return (needed <= ladder.largest()).then_some(ladder.largest());
        }
        // A new session reserves room for its whole prompt and some generation.
        let horizon = if seq.session.window().is_none() {
            needed.max(seq.request.prompt.len())
        } else {
            needed
        };
        let reserve = seq.request.max_tokens.min(cfg.generation_reserve);
        let rung = ladder.rung_for(needed).ok()?.max(
            ladder
                .rung_for(horizon.saturating_add(reserve).min(ladder.largest()))
                .ok()?,
        );
        Some(ladder.windows()[rung])
    }

    /// Groups decoding sequences by window into runs of compiled batch sizes; a batch
    /// size not compiled yet is requested and meanwhile covered by smaller ones.
    fn plan_decodes(&self, decoding: &[(RequestId, usize)], schedule: &mut Schedule) {
        if decoding.is_empty() {
            return;
        }
        if self.mixed.is_some() {
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
            let ready = |b: usize| {
                b == 1
                    || self
                        .pyramid
                        .get_ready(ArtifactShape::Decode { batch: b, window })
                        .is_some()
            };
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
                    Some(w) => (w, seq.request.prompt.len()),
                    None => continue,
                },
            };
            let Some(next) = self.predicted_next_window(&seq.session, window, len) else {
                continue;
            };
            if !self.pyramid.is_prepared(next) {
                schedule
                    .compiles
                    .extend(self.pyramid.shapes(next).iter().copied());
            }
            if self.kv_pool.as_ref().is_some_and(|p| !p.has(next)) {
                schedule.prefaults.push((next, window));
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
        if cfg.arm != Arm::Predictive || self.mixed.is_some() {
            return None;
        }
        let next = *cfg.ladder.windows().iter().find(|&&w| w > window)?;
        let expected = self.pyramid.expected_compile(next);
        session
            .should_prepare_after(window, len, expected, cfg.margin)
            .then_some(next)
    }

    /// Whether running sessions reserving `running_bytes` fit the KV budget, evicting
    /// pooled caches and cached sessions as needed.
    fn evict_for(&mut self, running_bytes: usize) -> bool {
        if running_bytes > self.config.kv_budget {
            return false;
        }
        self.fit_budget(running_bytes, usize::MAX);
        true
    }

    /// Moves queued requests into the batch while it has room and memory.
    fn admit(&mut self) {
        while self.running.len() < self.config.max_batch {
            let Some((request, submitted)) = self.waiting.pop_front() else {
                break;
            };
            let id = request.id;
            let largest = self.config.pyramid.ladder.largest();
            let refused = if request.prompt.is_empty() {
                Some(EngineError::EmptyPrompt)
            } else if request.max_tokens == 0 {
                Some(EngineError::BadRequest(
                    "max_tokens must be at least 1".to_string(),
                ))
            } else if request.prompt.len() > largest {
                let needed = request.prompt.len();
                Some(EngineError::Runtime(
                    pyramid_runtime::RuntimeError::BeyondLargestWindow { needed, largest },
                ))
            } else {
                None
            };
            let sampler =
                match refused.map_or_else(|| Ok(Sampler::new(request.sampler.clone())?), Err) {
                    Ok(s) => s,
                    Err(error) => {
                        self.events.push(Event::Failed { id, error });
                        continue;
                    }
                };
            // The last prompt token always runs, for the logits the first sample needs.
            let (session, reused, forked) = self.reuse_for(&request.prompt);
            let mut seq = Sequence {
                request,
                session,
                fed: reused,
                cached_tokens: reused,
                next_input: None,
                sampler,
                generated: 0,
                submitted,
                admitted: Instant::now(),
                first_token: None,
                last_token: None,
                stalled_since: None,
                mask_time: Duration::ZERO,
            };
            seq.session.truncate(reused);
            if seq.session.is_empty() {
                let reply = seq
                    .request
                    .max_tokens
                    .min(self.config.pyramid.generation_reserve);
                seq.session
                    .assume_turn(seq.request.prompt.len().saturating_add(reply));
            }
            let window_bytes = self
                .target_window(&seq)
                .map_or(0, |w| self.kv_bytes_for(w))
                .max(seq.session.kv_bytes().0);
            let running = self.running_bytes() + window_bytes;
            if running > self.config.kv_budget {
                if self.running.is_empty() {
                    let budget = self.config.kv_budget;
                    self.events.push(Event::Failed {
                        id,
                        error: EngineError::OverBudget {
                            bytes: window_bytes,
                            budget,
                        },
                    });
                    continue;
                }
                // It waits for a running sequence to finish; its session goes back (a
                // fork is dropped: what it copied is still cached).
                if !forked {
                    self.cache.insert(std::mem::take(&mut seq.session));
                }
                self.waiting.push_front((seq.request, submitted));
                break;
            }
            self.evict_for(running);
            self.events.push(Event::Started {
                id,
                cached_tokens: reused,
            });
            self.running.push(seq);
        }
        self.fit_budget(self.running_bytes(), self.max_cached());
    }

    /// The cached session a prompt reuses, the prompt tokens it covers (never the last
    /// one), and whether it is a fork. A prompt that extends a cached conversation takes
    /// it; one that diverges from it (another agent on the same system prompt) gets a copy
    /// of the shared prefix, and the conversation stays cached whole. If the copy cannot
    /// be made the conversation is taken and cut, as the last resort before a full prefill.
    fn reuse_for(&mut self, prompt: &[u32]) -> (Session, usize, bool) {
        let Some((i, shared)) = self.cache.longest(prompt) else {
            return (Session::default(), 0, false);
        };
        let reused = shared.min(prompt.len() - 1);
        let cached = self.cache.session(i);
        if reused < cached.len() {
            if let Some(window) = cached.window() {
                let (kv, _) = self.new_cache(window);
                if let Some((fork, copied)) = self.cache.session(i).fork(reused, kv) {
                    self.cache.touch(i);
                    self.pyramid.record(|s| {
                        s.n_forks += 1;
                        s.fork_bytes += copied;
                    });
                    return (fork, reused, true);
                }
            }
        }
        (self.cache.take(i), reused, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_batch_sizes_are_powers_of_two_and_the_maximum() {
        assert_eq!(decode_batches(1), [1]);
        assert_eq!(decode_batches(8), [1, 2, 4, 8]);
        assert_eq!(decode_batches(12), [1, 2, 4, 8, 12]);
    }
}
