//! Applying a step's results: sequences advance by what they fed, their logits are
//! masked by their grammars and sampled, and those that sampled a stop token, completed
//! their grammar or reached a limit end, their sessions kept for reuse.

use std::time::Instant;

use pyramid_kernels::ThreadPool;

use super::Scheduler;
use crate::request::{Event, FinishReason, RequestId, TokenLogprobs};
use crate::sequence::Sequence;
use crate::speculate::DraftStats;
use crate::step::{Executed, Schedule};
use crate::{EngineError, Result};

impl Scheduler {
    /// Applies what `schedule` ran into: ends the sequences whose pass failed, advances
    /// the others, masks constrained logits (on `pool`), samples every sequence whose
    /// prompt is in, and ends those that are done. Returns the step's events.
    /// The logits stay in `executed`, for the executor to reuse their buffers.
    pub fn update(
        &mut self,
        pool: &ThreadPool,
        schedule: &Schedule,
        executed: &mut Executed,
    ) -> Vec<Event> {
        debug_assert!(executed.logits.len() <= schedule.n_scheduled());
        for (id, error) in std::mem::take(&mut executed.failed) {
            if let Some(i) = self.running.iter().position(|s| s.id() == id) {
                // Its cache is left as before the pass, but the sequence ends here.
                let seq = self.running.swap_remove(i);
                self.release(seq);
            }
            self.events.push(Event::Failed { id, error });
        }
        for &(id, n, prefill) in &executed.fed {
            if let Some(seq) = self.running.iter_mut().find(|s| s.id() == id) {
                seq.fed_tokens(n, prefill);
            }
        }
        self.finish_embeddings(&executed.fed);
        self.mask(pool, executed);
        let largest = self.config.pyramid.ladder.largest();
        let n_vocab = self.n_vocab;
        let mut finished = Vec::new();
        let mut failed = std::mem::take(&mut executed.failed);
        let unmasked = &mut executed.unmasked;
        for (id, logits) in executed.logits.iter_mut() {
            let Some(seq) = self.running.iter_mut().find(|s| s.id() == id) else {
                continue;
            };
            if seq.prefilling() || failed.iter().any(|f| f.0 == id) {
                // More prompt to come (these logits are not sampled), or its mask failed.
                continue;
            }
            let rows = SampledRows {
                logits: &mut *logits,
                draft: schedule.draft_of(id),
                unmasked: &mut *unmasked,
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
        for (id, error) in failed {
            if let Some(i) = self.running.iter().position(|s| s.id() == id) {
                let seq = self.running.swap_remove(i);
                self.release(seq);
            }
            self.events.push(Event::Failed { id, error });
        }
        for (id, reason) in finished {
            let Some(i) = self.running.iter().position(|s| s.id() == id) else {
                continue;
            };
            let mut seq = self.running.swap_remove(i);
            seq.finish();
            let usage = seq.usage();
            let timings = seq.timings();
            let grown = usage.prompt_tokens - usage.cached_tokens + usage.completion_tokens;
            let admitted = seq.admitted.unwrap_or(seq.submitted);
            seq.session.observe_turn(grown, admitted.elapsed());
            // The next turn may cross: its window compiles while the caller thinks.
            if let Some(window) = seq.session.window() {
                let len = seq.session.len();
                if let Some(next) = self.predicted_next_window(&seq.session, window, len) {
                    self.compile_ahead.push(next);
                }
            }
            self.events.push(Event::Finished {
                id,
                reason,
                usage,
                timings,
            });
            self.release(seq);
        }
        // Sliding-window layers give back what their windows left behind, between steps.
        for seq in &mut self.running {
            seq.session.release_out_of_window();
        }
        self.take_events()
    }
}

impl Scheduler {
    /// Ends the embeddings whose prompt went in whole this step, with their vectors.
    fn finish_embeddings(&mut self, fed: &[(RequestId, usize, bool)]) {
        for &(id, _, _) in fed {
            let Some(i) = self
                .running
                .iter()
                .position(|s| s.id() == id && s.embeds() && !s.prefilling())
            else {
                continue;
            };
            let mut seq = self.running.swap_remove(i);
            let now = Instant::now();
            seq.first_token = Some(now);
            seq.last_token = Some(now);
            seq.finish();
            let pooling = seq.request.pooling.expect("an embedding has a pooling");
            let embedding = pooling.finish(std::mem::take(&mut seq.pooled), seq.prompt_len);
            self.events.push(Event::Embedding { id, embedding });
            self.events.push(Event::Finished {
                id,
                reason: FinishReason::Stop,
                usage: seq.usage(),
                timings: seq.timings(),
            });
            self.release(seq);
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
            let suppressed = &seq.request.suppressed_tokens;
            mask_unless_alone(row, suppressed, |id| suppressed.binary_search(&id).is_ok());
            if seq.generated < seq.request.min_tokens {
                let stop = &seq.request.stop_tokens;
                mask_unless_alone(row, stop, |id| stop.contains(&id));
            }
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

/// Masks `tokens` out of `row` unless nothing else could be sampled: the suppressed
/// tokens (ascending; thousands long for Gemma's unused tokens), and stop tokens while a
/// reply is short of its `min_tokens` (a grammar that allows only an end token ends there).
/// `is_masked` answers for one id whether it is among `tokens`.
fn mask_unless_alone(row: &mut [f32], tokens: &[u32], is_masked: impl Fn(u32) -> bool) {
    if tokens.is_empty() {
        return;
    }
    let masked = |i: usize| is_masked(i as u32);
    // Over a quarter-million vocabulary, whether another token remains is asked of the
    // row's best first.
    let best = pyramid_kernels::ops::argmax(row) as usize;
    let other = (row[best] > f32::NEG_INFINITY && !masked(best))
        || row
            .iter()
            .enumerate()
            .any(|(i, &x)| x > f32::NEG_INFINITY && !masked(i));
    if other {
        for &t in tokens {
            if let Some(x) = row.get_mut(t as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}
