//! The plain data at the seams of a step: what the scheduler decided ([`Schedule`]), what
//! the executor ran it into ([`Executed`]), and the sessions it lends the executor for it
//! ([`Batch`]). Neither side reaches into the other: this module is all they share.

use std::time::Duration;

use pyramid_model::Pooled;
use pyramid_runtime::ArtifactShape;

use crate::request::RequestId;
use crate::session::Session;
use crate::step_logits::StepLogits;
use crate::EngineError;

/// How a sequence gets the window it runs on this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Its first window.
    First,
    /// The live cache copied into a larger window.
    Migrate,
    /// A larger window, every cached token prefilled again ([`crate::Arm::Reprefill`]).
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
    /// How long each moving sequence waited for its window's artifacts or memory.
    pub stalls: Vec<(RequestId, Duration)>,
    /// Prompt chunks: `(id, tokens fed this step)`.
    pub prefills: Vec<(RequestId, usize)>,
    /// Decode runs, grouped by window.
    pub decodes: Vec<DecodeRun>,
    /// Drafts that decoding sequences verify beside their next token: `(id, draft)`.
    pub drafts: Vec<(RequestId, Vec<u32>)>,
    /// Sequences waiting for the artifacts (or the memory) of a window: `(id, window)`.
    pub stalled: Vec<(RequestId, usize)>,
    /// Artifacts to start compiling in the background.
    pub compiles: Vec<ArtifactShape>,
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

    /// The draft sequence `id` verifies this step (empty if none).
    pub fn draft_of(&self, id: RequestId) -> &[u32] {
        self.drafts
            .iter()
            .find(|d| d.0 == id)
            .map_or(&[], |d| d.1.as_slice())
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

/// One scheduled sequence's part of a step: its session, lent to the executor for the
/// step, and the tokens it feeds.
pub struct Slot<'a> {
    pub id: RequestId,
    pub session: &'a mut Session,
    /// A prompt chunk, or the next input followed by its draft.
    pub tokens: Vec<u32>,
    pub prefill: bool,
    /// An embedding's rows to pool this pass, and its sum so far, lent like the session.
    pub pooled: Option<Pooled<'a>>,
}

/// The scheduled sequences' slots, in no particular order.
pub type Batch<'a> = Vec<Slot<'a>>;

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
    /// Sequences whose tokens went into their caches: `(id, tokens, prefill)`.
    pub fed: Vec<(RequestId, usize, bool)>,
    pub summary: StepSummary,
}

/// What a step ran, for the driver's metrics.
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
