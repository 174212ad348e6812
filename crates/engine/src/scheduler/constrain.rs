//! Grammar masks for the sequences about to sample, before they sample.
//!
//! A mask over a 150k-token vocabulary costs from tens of microseconds to a millisecond
//! (inside a length-bounded string every token must be checked). Computed one after
//! another on the engine thread, a batch of constrained sequences would add their sum to
//! every step; here they are spread over the thread pool, one sequence per thread at a
//! time, each thread writing only its own sequences' logits and grammar state.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyramid_grammar::Constraint;
use pyramid_kernels::ThreadPool;

use super::Scheduler;
use crate::request::RequestId;
use crate::step::Executed;
use crate::EngineError;

/// One sequence's mask to compute.
struct MaskJob<'a> {
    id: RequestId,
    constraint: &'a mut Constraint,
    logits: &'a mut [f32],
    /// The logits before masking, kept when the request reports log-probabilities.
    unmasked: Option<Vec<f32>>,
    took: &'a mut Duration,
    result: Result<(), EngineError>,
}

impl MaskJob<'_> {
    /// Masks this sequence's logits; a panic in the grammar engine fails this sequence
    /// alone (the boundary module), never the pool's thread or the engine.
    fn run(&mut self) {
        let started = Instant::now();
        let (constraint, logits) = (&mut *self.constraint, &mut *self.logits);
        self.result =
            crate::boundary::isolate("the grammar mask", || constraint.mask_logits(logits))
                .and_then(|masked| masked.map_err(EngineError::Grammar));
        *self.took += started.elapsed();
    }
}

impl Scheduler {
    /// Masks the logits of every constrained sequence that samples this step. A mask that
    /// fails ends its sequence (`executed.failed`); the logits of the others stand.
    pub(crate) fn mask(&mut self, pool: &ThreadPool, executed: &mut Executed) {
        let mut logits: HashMap<RequestId, &mut [f32]> = executed.logits.iter_mut().collect();
        let mut jobs = Vec::new();
        for seq in &mut self.running {
            if seq.prefilling() {
                continue;
            }
            let id = seq.request.id;
            let (Some(constraint), Some(logits)) =
                (seq.request.constraint.as_mut(), logits.remove(&id))
            else {
                continue;
            };
            let unmasked = seq.request.logprobs.map(|_| logits.to_vec());
            jobs.push(Mutex::new(MaskJob {
                id,
                constraint,
                logits,
                unmasked,
                took: &mut seq.mask_time,
                result: Ok(()),
            }));
        }
        match jobs.len() {
            0 => return,
            1 => jobs[0].get_mut().unwrap_or_else(|e| e.into_inner()).run(),
            _ => pool.run_team(&|team| {
                for job in jobs.iter().skip(team.idx()).step_by(team.n_threads()) {
                    job.lock().unwrap_or_else(|e| e.into_inner()).run();
                }
            }),
        }
        for job in jobs {
            let job = job.into_inner().unwrap_or_else(|e| e.into_inner());
            if let Some(raw) = job.unmasked {
                executed.unmasked.push((job.id, raw));
            }
            if let Err(error) = job.result {
                executed.failed.push((job.id, error));
            }
        }
    }
}
