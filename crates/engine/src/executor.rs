//! The executor: running a [`Schedule`] on the route's artifacts.
//!
//! It owns the window pyramid's artifacts (the backend, the artifact cache, background
//! compiles), the one mixed-pass artifact on a backend that takes any shape, and the
//! logit buffers; the scheduler lends it the scheduled sessions for the step
//! ([`Batch`]). Sessions are placed or moved first (a migration grows the KV cache to the
//! new window: a cache reserved for the largest window only changes its bound, a compact
//! one copies its live rows; a re-prefill runs every cached token again), then the
//! passes run: one mixed
//! pass for everyone on a backend that takes any shape, otherwise each prompt chunk
//! through its window's prefill artifact and each decode run through the decode artifact
//! of its window and batch size. A pass that fails fails only the sequences in it; a
//! failed pass leaves their caches as they were. It decides nothing: which sequence runs,
//! where and with what is the schedule's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyramid_kernels::ThreadPool;
use pyramid_model::{KvCache, Segment};
use pyramid_runtime::{prefill_stepping, ArtifactShape, Executable};

use crate::kv::KvAllocator;
use crate::pyramid::{ArtifactPair, WindowPyramid};
use crate::request::RequestId;
use crate::session::{Placement, Session};
use crate::step::{Batch, Executed, Move, Schedule, Slot};
use crate::step_logits::LogitBuffers;
use crate::{EngineError, Result};

/// What one sequence feeds in a pass.
struct Feed {
    /// Its slot in the batch.
    slot: usize,
    n_logits: usize,
}

pub struct Executor {
    pyramid: Arc<WindowPyramid>,
    /// The one artifact of a backend that runs mixed passes; `None` on static routes.
    mixed: Option<Arc<dyn Executable>>,
    kv: KvAllocator,
    /// Tokens per re-prefill pass on a mixed route.
    prefill_chunk: usize,
    n_vocab: usize,
    /// Pass buffers of logits, reused from step to step.
    logit_buffers: LogitBuffers,
}

impl Executor {
    pub(crate) fn new(
        pyramid: Arc<WindowPyramid>,
        mixed: Option<Arc<dyn Executable>>,
        kv: KvAllocator,
        prefill_chunk: usize,
    ) -> Self {
        let n_vocab = pyramid.backend().model().config.n_vocab;
        Self {
            pyramid,
            mixed,
            kv,
            prefill_chunk,
            n_vocab,
            logit_buffers: LogitBuffers::default(),
        }
    }

    pub fn pyramid(&self) -> &Arc<WindowPyramid> {
        &self.pyramid
    }

    /// Whether passes are mixed (any shape, one artifact) rather than static per window.
    pub fn runs_mixed(&self) -> bool {
        self.mixed.is_some()
    }

    /// Places, migrates and runs what `schedule` says, on the sessions of `batch`.
    pub fn execute(
        &mut self,
        pool: &ThreadPool,
        schedule: &Schedule,
        mut batch: Batch<'_>,
    ) -> Executed {
        let mut out = Executed::default();
        self.pyramid.prepare_shapes(&schedule.compiles);
        for &(id, window, how) in &schedule.moves {
            let Some(slot) = batch.iter_mut().find(|s| s.id == id) else {
                continue;
            };
            match self.move_session(pool, slot.session, window, how, &mut out) {
                Ok(()) => {
                    if let Some(&(_, waited)) = schedule.stalls.iter().find(|s| s.0 == id) {
                        self.pyramid.record(|s| {
                            s.n_stalls += 1;
                            s.stall_ms += waited.as_secs_f64() * 1e3;
                        });
                    }
                }
                Err(e) => out.failed.push((id, e)),
            }
        }
        let feeds =
            |ids: &mut dyn Iterator<Item = RequestId>, batch: &Batch<'_>, out: &Executed| {
                ids.filter(|id| !out.failed.iter().any(|f| f.0 == *id))
                    .filter_map(|id| {
                        let slot = batch.iter().position(|s| s.id == id)?;
                        let s = &batch[slot];
                        let n_logits = match (&s.pooled, s.prefill) {
                            (Some(_), _) => 0,
                            (None, true) => 1,
                            (None, false) => s.tokens.len(),
                        };
                        Some(Feed { slot, n_logits })
                    })
                    .collect::<Vec<Feed>>()
            };
        let prefill_feeds = feeds(&mut schedule.prefills.iter().map(|p| p.0), &batch, &out);
        let decode_runs: Vec<(Vec<Feed>, usize, usize)> = schedule
            .decodes
            .iter()
            .map(|run| {
                (
                    feeds(&mut run.ids.iter().copied(), &batch, &out),
                    run.window,
                    run.batch,
                )
            })
            .collect();
        if let Some(mixed) = self.mixed.clone() {
            let mut all = prefill_feeds;
            all.extend(decode_runs.into_iter().flat_map(|(f, _, _)| f));
            if !all.is_empty() {
                self.run_pass(pool, mixed.as_ref(), &mut batch, all, &mut out);
            }
            return out;
        }
        self.run_each_alone(pool, &mut batch, prefill_feeds, |a| &a.0, &mut out);
        for (feeds, window, n_batch) in decode_runs {
            if feeds.is_empty() {
                continue;
            }
            let batched = (n_batch > 1)
                .then(|| {
                    self.pyramid.get_ready(ArtifactShape::Decode {
                        batch: n_batch,
                        window,
                    })
                })
                .flatten();
            if let Some(exe) = batched {
                self.run_pass(pool, exe.as_ref(), &mut batch, feeds, &mut out);
                continue;
            }
            // One at a time through each session's own decode artifact (also when the
            // batch artifact was evicted since the schedule was made).
            self.run_each_alone(pool, &mut batch, feeds, |a| &a.1, &mut out);
        }
        out
    }

    /// An empty cache for `window`, as a placement on it gets.
    pub(crate) fn new_cache(&self, window: usize) -> KvCache {
        self.kv.new_cache(window)
    }

    /// Takes back a step's logit buffers once the scheduler has sampled from them.
    pub fn recycle(&mut self, executed: Executed) {
        self.logit_buffers.give_back(executed.logits.into_buffers());
    }

    /// Runs each feed alone through the artifact its session holds for its window
    /// (`stage` picks the prefill or the decode one).
    fn run_each_alone(
        &mut self,
        pool: &ThreadPool,
        batch: &mut Batch<'_>,
        feeds: Vec<Feed>,
        stage: fn(&ArtifactPair) -> &Arc<dyn Executable>,
        out: &mut Executed,
    ) {
        for feed in feeds {
            let slot = &mut batch[feed.slot];
            match self.held_artifacts(slot.session) {
                Ok(pair) => {
                    let exe = Arc::clone(stage(&pair));
                    self.run_pass(pool, exe.as_ref(), batch, vec![feed], out);
                }
                Err(e) => out.failed.push((slot.id, e)),
            }
        }
    }

    /// The artifacts `session` runs through on its window. A fork placed on a window
    /// other than its parent's (see `Session::fork`) holds none yet and takes that
    /// window's from the pyramid now.
    fn held_artifacts(&self, session: &mut Session) -> Result<ArtifactPair> {
        let placement = session.placement_mut().ok_or_else(not_placed)?;
        if placement.artifacts.is_none() {
            placement.artifacts = Some(self.pyramid.acquire_window(placement.window)?.0);
        }
        placement.artifacts.clone().ok_or_else(not_placed)
    }

    /// Runs `feeds` through `exe` as one pass and records what it appended.
    fn run_pass(
        &mut self,
        pool: &ThreadPool,
        exe: &dyn Executable,
        batch: &mut Batch<'_>,
        feeds: Vec<Feed>,
        out: &mut Executed,
    ) {
        let start = Instant::now();
        let n_vocab = self.n_vocab;
        let idx: Vec<usize> = feeds.iter().map(|f| f.slot).collect();
        let mut logits = self.logit_buffers.take();
        let result = {
            let slots = pick_mut(batch, &idx);
            let static_prefill = matches!(exe.shape(), ArtifactShape::Prefill { .. });
            if static_prefill {
                match slots.into_iter().next() {
                    None => Err(not_placed()),
                    Some(slot) => {
                        let tokens = &slot.tokens;
                        kv_of(slot.session)
                            .and_then(|kv| self.prefill_static(exe, pool, tokens, kv, &mut logits))
                    }
                }
            } else {
                let mut segments = Vec::with_capacity(slots.len());
                let mut placed = Ok(());
                for (slot, f) in slots.into_iter().zip(&feeds) {
                    let Slot {
                        session,
                        tokens,
                        pooled,
                        ..
                    } = slot;
                    match kv_of(session) {
                        Ok(kv) => segments.push(match pooled {
                            Some(p) => Segment::pooled(tokens, kv, p.rows.clone(), &mut *p.sum),
                            None => Segment::with_logits(tokens, kv, f.n_logits),
                        }),
                        Err(e) => {
                            placed = Err(e);
                            break;
                        }
                    }
                }
                placed.and_then(|()| Ok(exe.run(pool, &mut segments, &mut logits)?))
            }
        };
        if let Err(e) = result {
            // The first sequence keeps the error itself (its code, e.g. a context limit).
            let message = e.to_string();
            let mut first = Some(e);
            for f in &feeds {
                let error = first
                    .take()
                    .unwrap_or_else(|| EngineError::Pass(message.clone()));
                out.failed.push((batch[f.slot].id, error));
            }
            self.logit_buffers.give_back([logits]);
            return;
        }
        let elapsed = start.elapsed();
        let returned = logits.len();
        let pass = out.logits.push_pass(logits);
        let mut offset = 0;
        for f in &feeds {
            let slot: &mut Slot<'_> = &mut batch[f.slot];
            let n = f.n_logits * n_vocab;
            if offset + n > returned {
                // The cache keeps only what the session records.
                slot.session.truncate(slot.session.len());
                out.failed.push((
                    slot.id,
                    EngineError::Pass(format!("{} returned too few logits", exe.shape())),
                ));
                continue;
            }
            if n > 0 {
                out.logits.push_rows(slot.id, pass, offset..offset + n);
            }
            offset += n;
            slot.session.extend(&slot.tokens);
            out.fed.push((slot.id, slot.tokens.len(), slot.prefill));
            if slot.prefill {
                out.summary.n_prefilled += slot.tokens.len();
            } else {
                slot.session.observe_decode(elapsed);
                out.summary.n_decoded += 1;
                out.summary.n_drafted += slot.tokens.len() - 1;
            }
        }
    }

    /// Puts `session` on `window`: its first placement, a migration of its live cache,
    /// or a re-prefill of every cached token. On failure the session is as it was.
    fn move_session(
        &mut self,
        pool: &ThreadPool,
        session: &mut Session,
        window: usize,
        how: Move,
        out: &mut Executed,
    ) -> Result<()> {
        let artifacts = match &self.mixed {
            Some(_) => None,
            None => Some(self.pyramid.acquire_window(window)?.0),
        };
        let start = Instant::now();
        let kv = match how {
            Move::First => self.kv.new_cache(window),
            Move::Migrate => {
                let placement = session.placement_mut().ok_or_else(not_placed)?;
                let live = placement.kv.used_bytes();
                let copied = placement.kv.grow_to(window)?;
                let took = start.elapsed();
                out.summary.migrations.push(took);
                self.pyramid.record(|s| {
                    s.n_migrations += 1;
                    s.migration_ms += took.as_secs_f64() * 1e3;
                    s.migration_bytes += copied;
                    s.migration_live_bytes += live;
                });
                // The grown cache moves into the new placement below.
                std::mem::replace(&mut placement.kv, self.kv.placeholder())
            }
            Move::Reprefill => {
                let mut kv = self.kv.new_cache(window);
                let live = session.tokens().to_vec();
                if !live.is_empty() {
                    self.prefill_into(pool, artifacts.as_ref(), &live, &mut kv)?;
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
        session.place(Placement {
            window,
            kv,
            artifacts,
        });
        Ok(())
    }

    /// Prefills `tokens` into `kv` through the window's prefill artifact `exe`, its early
    /// chunks on the smaller windows' artifacts that are ready.
    fn prefill_static(
        &self,
        exe: &dyn Executable,
        pool: &ThreadPool,
        tokens: &[u32],
        kv: &mut KvCache,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let ArtifactShape::Prefill { chunk, .. } = exe.shape() else {
            return Ok(prefill_stepping(&[exe], pool, tokens, kv, logits)?);
        };
        // A compact cache would copy to move its bound: it steps nowhere.
        let lower = if kv.is_compact() {
            Vec::new()
        } else {
            let first = kv.len() + chunk;
            let last = kv.len() + tokens.len().div_ceil(chunk) * chunk;
            self.pyramid.ready_prefills_below(exe.shape(), first..=last)
        };
        let mut rungs: Vec<&dyn Executable> = lower.iter().map(|r| r.as_ref()).collect();
        rungs.push(exe);
        Ok(prefill_stepping(&rungs, pool, tokens, kv, logits)?)
    }

    /// Prefills `tokens` into `kv`: through the window's prefill artifact on a static
    /// route, in chunks through the mixed artifact otherwise.
    fn prefill_into(
        &self,
        pool: &ThreadPool,
        artifacts: Option<&ArtifactPair>,
        tokens: &[u32],
        kv: &mut KvCache,
    ) -> Result<()> {
        let mut logits = Vec::new();
        match (artifacts, &self.mixed) {
            (Some((prefill, _)), _) => {
                self.prefill_static(prefill.as_ref(), pool, tokens, kv, &mut logits)?;
            }
            (None, Some(mixed)) => {
                for piece in tokens.chunks(self.prefill_chunk) {
                    mixed.run(pool, &mut [Segment::new(piece, kv)], &mut logits)?;
                }
            }
            (None, None) => return Err(not_placed()),
        }
        Ok(())
    }

    /// Waits for `window`'s artifacts (compiling them now if nobody has), for a
    /// sequence stalled on them; how long that took.
    pub(crate) fn wait_for_window(&self, window: usize) -> Result<Duration> {
        self.pyramid
            .acquire_window(window)
            .map(|(_, waited)| waited)
    }
}

fn not_placed() -> EngineError {
    EngineError::Pass("the sequence has no window to run on".to_string())
}

fn kv_of(session: &mut Session) -> Result<&mut KvCache> {
    session
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
    use std::time::Duration;

    use pyramid_model::KvType;

    use super::*;
    use crate::step::DecodeRun;
    use crate::test_harness::{config, next_token, Fake};
    use crate::Arm;

    #[test]
    fn pick_mut_follows_the_indices() {
        let mut v = [10, 20, 30];
        let picked = pick_mut(&mut v, &[2, 0]);
        assert_eq!(picked.iter().map(|x| **x).collect::<Vec<_>>(), [30, 10]);
    }

    /// An executor on the fake backend's static artifacts, with no scheduler.
    fn executor(fake: &Arc<Fake>) -> Executor {
        let cfg = config(Arm::OnDemand, &[32, 64], 8, 2);
        let pyramid =
            WindowPyramid::new(fake.clone(), 1, KvType::F32, cfg.pyramid.clone()).unwrap();
        let kv = KvAllocator::new(&fake.model.config, KvType::F32, 64);
        Executor::new(pyramid, None, kv, 8)
    }

    #[test]
    fn a_schedule_places_prefills_decodes_and_migrates_sessions_it_is_lent() {
        let fake = Fake::new(Duration::ZERO, false);
        let n_vocab = fake.model.config.n_vocab;
        let mut ex = executor(&fake);
        let pool = ThreadPool::new(1).unwrap();
        let (mut a, mut b) = (Session::default(), Session::default());
        let prompt: Vec<u32> = (1..=6).collect();
        // Both start on 32; `a` prefills its prompt, `b` has no placement to decode on.
        let schedule = Schedule {
            moves: vec![(1, 32, Move::First)],
            prefills: vec![(1, prompt.len())],
            decodes: vec![DecodeRun {
                window: 32,
                batch: 1,
                ids: vec![2],
            }],
            ..Schedule::default()
        };
        let batch = vec![
            Slot {
                id: 1,
                session: &mut a,
                tokens: prompt.clone(),
                prefill: true,
                pooled: None,
            },
            Slot {
                id: 2,
                session: &mut b,
                tokens: vec![9],
                prefill: false,
                pooled: None,
            },
        ];
        let executed = ex.execute(&pool, &schedule, batch);
        assert_eq!(executed.fed, [(1, 6, true)]);
        assert_eq!(executed.failed.len(), 1);
        assert_eq!(executed.failed[0].0, 2, "no window to decode on");
        let row: Vec<f32> = executed
            .logits
            .iter()
            .find(|r| r.0 == 1)
            .unwrap()
            .1
            .to_vec();
        let argmax = (0..n_vocab)
            .max_by(|&i, &j| row[i].total_cmp(&row[j]))
            .unwrap();
        assert_eq!(argmax as u32, next_token(&prompt, n_vocab));
        ex.recycle(executed);
        assert_eq!((a.len(), a.window()), (6, Some(32)));
        // A migration to 64, then a decode there.
        let next = next_token(&prompt, n_vocab);
        let schedule = Schedule {
            moves: vec![(1, 64, Move::Migrate)],
            decodes: vec![DecodeRun {
                window: 64,
                batch: 1,
                ids: vec![1],
            }],
            ..Schedule::default()
        };
        let batch = vec![Slot {
            id: 1,
            session: &mut a,
            tokens: vec![next],
            prefill: false,
            pooled: None,
        }];
        let executed = ex.execute(&pool, &schedule, batch);
        assert!(executed.failed.is_empty());
        assert_eq!(executed.fed, [(1, 1, false)]);
        assert_eq!(executed.summary.migrations.len(), 1);
        assert_eq!((a.len(), a.window()), (7, Some(64)));
        assert_eq!(ex.pyramid().stats().n_migrations, 1);
    }
}
