//! Running a [`Schedule`] on the route's artifacts.
//!
//! Sessions are placed or moved first (a migration grows the KV cache to the new window:
//! in place natively, a copy of the live rows on backends that bind cache memory; a
//! re-prefill runs every cached token again), then the passes run: one mixed pass for
//! everyone on a backend that takes any shape, otherwise each prompt chunk through its
//! window's prefill artifact and each decode run through the decode artifact of its
//! window and batch size. A pass that fails fails only the sequences in it; a failed pass
//! leaves their caches as they were.

use std::sync::Arc;
use std::time::Instant;

use pyramid_kernels::ThreadPool;
use pyramid_model::{KvCache, Segment};
use pyramid_runtime::{prefill_chunked, ArtifactShape, Executable};

use crate::engine::{Engine, Sequence};
use crate::pyramid::ArtifactPair;
use crate::request::RequestId;
use crate::scheduler::{Move, Schedule};
use crate::session::Placement;
use crate::step_logits::StepLogits;
use crate::{EngineError, Result};

/// What a step's passes produced.
#[derive(Debug, Default)]
pub struct Executed {
    /// Logits after each sequence's last fed token, for the sequences that ran; after
    /// each of its fed tokens for a sequence verifying a draft (`[1 + draft, n_vocab]`).
    pub logits: StepLogits,
    /// Sequences whose placement, pass or grammar mask failed.
    pub failed: Vec<(RequestId, EngineError)>,
    /// The logits of constrained sequences reporting log-probabilities, before their
    /// grammar masked them (log-probabilities are of the model's distribution).
    pub unmasked: Vec<(RequestId, Vec<f32>)>,
}

/// What one sequence feeds this step.
struct Feed {
    idx: usize,
    /// A prompt chunk, or the next input and its draft.
    tokens: Vec<u32>,
    prefill: bool,
    /// Rows of logits wanted: the last token's, or every token's to verify a draft.
    n_logits: usize,
}

impl Engine {
    /// Places, migrates and runs what `schedule` says.
    pub fn execute(&mut self, pool: &ThreadPool, schedule: &Schedule) -> Executed {
        let mut out = Executed::default();
        self.pyramid.prepare_shapes(&schedule.compiles);
        for &(id, window, how) in &schedule.moves {
            if let Err(e) = self.move_session(pool, id, window, how) {
                out.failed.push((id, e));
            }
        }
        let feeds = |ids: &mut dyn Iterator<Item = (RequestId, Option<usize>)>| -> Vec<Feed> {
            ids.filter(|(id, _)| !out.failed.iter().any(|f| f.0 == *id))
                .filter_map(|(id, n)| {
                    let idx = self.running.iter().position(|s| s.request.id == id)?;
                    let seq = &self.running[idx];
                    Some(match n {
                        Some(n) => Feed {
                            idx,
                            tokens: seq.input[seq.fed..seq.fed + n].to_vec(),
                            prefill: true,
                            n_logits: 1,
                        },
                        None => {
                            let mut tokens = vec![seq.next_input?];
                            tokens.extend_from_slice(schedule.draft_of(id));
                            Feed {
                                idx,
                                n_logits: tokens.len(),
                                tokens,
                                prefill: false,
                            }
                        }
                    })
                })
                .collect()
        };
        let prefill_feeds = feeds(&mut schedule.prefills.iter().map(|&(id, n)| (id, Some(n))));
        let decode_runs: Vec<(Vec<Feed>, usize, usize)> = schedule
            .decodes
            .iter()
            .map(|run| {
                let f = feeds(&mut run.ids.iter().map(|&id| (id, None)));
                (f, run.window, run.batch)
            })
            .collect();
        if let Some(mixed) = self.mixed.clone() {
            let mut all = prefill_feeds;
            all.extend(decode_runs.into_iter().flat_map(|(f, _, _)| f));
            if !all.is_empty() {
                self.run_pass(pool, mixed.as_ref(), all, &mut out);
            }
            return out;
        }
        self.run_each_alone(pool, prefill_feeds, |a| &a.0, &mut out);
        for (feeds, window, batch) in decode_runs {
            if feeds.is_empty() {
                continue;
            }
            let batched = (batch > 1)
                .then(|| {
                    self.pyramid
                        .get_ready(ArtifactShape::Decode { batch, window })
                })
                .flatten();
            if let Some(exe) = batched {
                self.run_pass(pool, exe.as_ref(), feeds, &mut out);
                continue;
            }
            // One at a time through each session's own decode artifact (also when the
            // batch artifact was evicted since the schedule was made).
            self.run_each_alone(pool, feeds, |a| &a.1, &mut out);
        }
        out
    }

    /// Runs each feed alone through the artifact its session holds for its window
    /// (`stage` picks the prefill or the decode one).
    fn run_each_alone(
        &mut self,
        pool: &ThreadPool,
        feeds: Vec<Feed>,
        stage: fn(&ArtifactPair) -> &Arc<dyn Executable>,
        out: &mut Executed,
    ) {
        for feed in feeds {
            let seq = &self.running[feed.idx];
            let held = seq
                .session
                .placement()
                .and_then(|p| p.artifacts.as_ref())
                .map(|a| Arc::clone(stage(a)));
            match held {
                Some(exe) => self.run_pass(pool, exe.as_ref(), vec![feed], out),
                None => out.failed.push((seq.request.id, not_placed())),
            }
        }
    }

    /// Runs `feeds` through `exe` as one pass and records what it appended.
    fn run_pass(
        &mut self,
        pool: &ThreadPool,
        exe: &dyn Executable,
        feeds: Vec<Feed>,
        out: &mut Executed,
    ) {
        let start = Instant::now();
        let n_vocab = self.pyramid.backend().model().config.n_vocab;
        let idx: Vec<usize> = feeds.iter().map(|f| f.idx).collect();
        let mut logits = self.logit_buffers.take();
        let result = {
            let seqs = pick_mut(&mut self.running, &idx);
            let static_prefill = matches!(exe.shape(), ArtifactShape::Prefill { .. });
            if static_prefill {
                let kv = seqs
                    .into_iter()
                    .next()
                    .map_or_else(|| Err(not_placed()), kv_of);
                kv.and_then(|kv| {
                    Ok(prefill_chunked(
                        exe,
                        pool,
                        &feeds[0].tokens,
                        kv,
                        &mut logits,
                    )?)
                })
            } else {
                let kvs: Result<Vec<&mut KvCache>> = seqs.into_iter().map(kv_of).collect();
                kvs.and_then(|kvs| {
                    let mut segments: Vec<Segment<'_>> = kvs
                        .into_iter()
                        .zip(&feeds)
                        .map(|(kv, f)| Segment::with_logits(&f.tokens, kv, f.n_logits))
                        .collect();
                    Ok(exe.run(pool, &mut segments, &mut logits)?)
                })
            }
        };
        if let Err(e) = result {
            // The first sequence keeps the error itself (its code, e.g. a context limit).
            let message = e.to_string();
            let mut first = Some(e);
            for f in &feeds {
                let id = self.running[f.idx].request.id;
                let error = first
                    .take()
                    .unwrap_or_else(|| EngineError::Pass(message.clone()));
                out.failed.push((id, error));
            }
            self.logit_buffers.give_back([logits]);
            return;
        }
        let elapsed = start.elapsed();
        let returned = logits.len();
        let pass = out.logits.push_pass(logits);
        let mut offset = 0;
        for f in &feeds {
            let seq = &mut self.running[f.idx];
            let n = f.n_logits * n_vocab;
            if offset + n > returned {
                // The cache keeps only what the session records.
                seq.session.truncate(seq.session.len());
                out.failed.push((
                    seq.request.id,
                    EngineError::Pass(format!("{} returned too few logits", exe.shape())),
                ));
                continue;
            }
            out.logits
                .push_rows(seq.request.id, pass, offset..offset + n);
            offset += n;
            seq.session.extend(&f.tokens);
            if f.prefill {
                seq.fed += f.tokens.len();
                self.summary.n_prefilled += f.tokens.len();
            } else {
                seq.next_input = None;
                seq.session.observe_decode(elapsed);
                self.summary.n_decoded += 1;
                self.summary.n_drafted += f.tokens.len() - 1;
            }
        }
    }

    /// Puts sequence `id` on `window`: its first placement, a migration of its live
    /// cache, or a re-prefill of every cached token. On failure the session is as it was.
    fn move_session(
        &mut self,
        pool: &ThreadPool,
        id: RequestId,
        window: usize,
        how: Move,
    ) -> Result<()> {
        let idx = self
            .running
            .iter()
            .position(|s| s.request.id == id)
            .ok_or_else(not_placed)?;
        let artifacts = match &self.mixed {
            Some(_) => None,
            None => Some(self.pyramid.acquire_window(window)?.0),
        };
        let model = Arc::clone(self.pyramid.backend().model());
        let kv_type = self.pyramid.kv_type();
        let start = Instant::now();
        // A migration grows the cache it has; everything else needs a new one.
        let fresh = (how != Move::Migrate).then(|| self.new_cache(window));
        let seq = &mut self.running[idx];
        let stalled = seq.stalled_since.take().map(|t| start - t);
        let kv = match how {
            Move::First => fresh.ok_or_else(not_placed)?,
            Move::Migrate => {
                let placement = seq.session.placement_mut().ok_or_else(not_placed)?;
                let live = placement.kv.used_bytes();
                let copied = placement.kv.grow_to(window)?;
                let took = start.elapsed();
                self.summary.migrations.push(took);
                self.pyramid.record(|s| {
                    s.n_migrations += 1;
                    s.migration_ms += took.as_secs_f64() * 1e3;
                    s.migration_bytes += copied;
                    s.migration_live_bytes += live;
                });
                // The grown cache moves into the new placement below.
                std::mem::replace(&mut placement.kv, KvCache::new(&model.config, 0, kv_type))
            }
            Move::Reprefill => {
                let mut kv = fresh.ok_or_else(not_placed)?;
                let live = seq.session.tokens().to_vec();
                if !live.is_empty() {
                    let mut logits = Vec::new();
                    match (&artifacts, &self.mixed) {
                        (Some((prefill, _)), _) => {
                            prefill_chunked(prefill.as_ref(), pool, &live, &mut kv, &mut logits)?
                        }
                        (None, Some(mixed)) => {
                            for piece in live.chunks(self.config.pyramid.prefill_chunk) {
                                mixed.run(
                                    pool,
                                    &mut [Segment::new(piece, &mut kv)],
                                    &mut logits,
                                )?;
                            }
                        }
                        (None, None) => unreachable!("a static route has artifacts"),
                    }
                }
                let took = start.elapsed();
                self.pyramid.record(|s| {
                    s.n_reprefills += 1;
                    s.reprefill_ms += took.as_secs_f64() * 1e3;
                    s.reprefill_tokens += live.len();
                });
                kv
            }
        };
        if let (Some(waited), Move::Migrate | Move::Reprefill) = (stalled, how) {
            self.pyramid.record(|s| {
                s.n_stalls += 1;
                s.stall_ms += waited.as_secs_f64() * 1e3;
            });
        }
        let seq = &mut self.running[idx];
        seq.session.place(Placement {
            window,
            kv,
            artifacts,
        });
        Ok(())
    }
}

impl Engine {
    /// An empty cache for `window` reserving the ladder's largest (address space only),
    /// so every crossing on every backend is a new bound with no copy at all.
    pub(crate) fn new_cache(&self, window: usize) -> KvCache {
        let model = self.pyramid.backend().model();
        let largest = self.config.pyramid.ladder.largest();
        KvCache::with_reserve(&model.config, window, largest, self.pyramid.kv_type())
    }
}

fn not_placed() -> EngineError {
    EngineError::Pass("the sequence has no window to run on".to_string())
}

fn kv_of(seq: &mut Sequence) -> Result<&mut KvCache> {
    seq.session
        .placement_mut()
        .map(|p| &mut p.kv)
        .ok_or_else(not_placed)
}

/// Mutable references to the elements of `items` at the distinct indices `idx`, in order.
fn pick_mut<'a, T>(items: &'a mut [T], idx: &[usize]) -> Vec<&'a mut T> {
    let mut slots: Vec<Option<&mut T>> = items.iter_mut().map(Some).collect();
    idx.iter()
        .map(|&i| slots[i].take().expect("indices are distinct"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_mut_follows_the_indices() {
        let mut v = [10, 20, 30];
        let picked = pick_mut(&mut v, &[2, 0]);
        assert_eq!(picked.iter().map(|x| **x).collect::<Vec<_>>(), [30, 10]);
    }
}
