//! What goes into the engine and what comes out: token ids and plain data, no text.
//!
//! A [`Request`] is a tokenised prompt with its sampling settings; the engine answers
//! with [`Event`]s. Detokenisation, stop strings and the formatting of log-probabilities
//! belong to whoever drives the engine (the server, the CLI).

use std::sync::Arc;

use pyramid_grammar::Constraint;
use pyramid_model::Pooling;
use pyramid_runtime::SamplerConfig;
use serde::Serialize;

use crate::speculate::{DraftStats, Speculation};
use crate::EngineError;

/// Chosen by the caller; unique among the requests the engine holds.
pub type RequestId = u64;

#[derive(Debug, Clone)]
pub struct Request {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    /// Tokens to generate at most; generation also ends when the largest window is full.
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Tokens that end generation when sampled (end of sequence, end of turn); empty to
    /// generate until `max_tokens`.
    pub stop_tokens: Vec<u32>,
    /// Tokens never sampled, whatever their logits (the tokenizer's `suppressed_ids`:
    /// control tokens a text reply has no use for); empty to sample the whole vocabulary.
    pub suppressed_tokens: Arc<[u32]>,
    /// Stop tokens are not sampled before the reply holds this many tokens (unless a
    /// grammar allows nothing else); 0 lets them end it at once.
    pub min_tokens: usize,
    /// Log-probabilities of each sampled token and of the `k` most likely ones.
    pub logprobs: Option<usize>,
    /// A grammar the reply must follow: tokens it forbids are masked before sampling,
    /// and the reply ends (`Stop`) when the grammar is complete.
    pub constraint: Option<Constraint>,
    /// Lower is more urgent (vLLM's convention); 0 by default. Admission, the batch's
    /// slots and the prefill chunk go to the most urgent first, and a less urgent
    /// sequence may be paused for a more urgent one (see the admission module).
    pub priority: i32,
    /// Whether decoding verifies drafts looked up in the sequence's own tokens (see the
    /// speculate module); the tokens are the same either way.
    pub speculation: Speculation,
    /// Tokens the reply is expected to contain (OpenAI's predicted outputs, e.g. a file
    /// being edited): drafts come from them too. Only speculation reads them.
    pub prediction: Vec<u32>,
    /// An embedding rather than a reply: the prompt is prefilled on its own (no cached
    /// prefix, no KV kept after), nothing is sampled, and the engine answers with the
    /// pooled, L2-normalised hidden state ([`Event::Embedding`]) before `Finished`.
    /// Runs on mixed passes only: static artifacts return logits.
    pub pooling: Option<Pooling>,
}

impl Request {
    /// Greedy generation of `max_tokens` after `prompt`, stopping at `stop_tokens`.
    pub fn greedy(id: RequestId, prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            id,
            prompt,
            max_tokens,
            sampler: SamplerConfig::greedy(),
            stop_tokens: Vec::new(),
            suppressed_tokens: Arc::from([]),
            min_tokens: 0,
            logprobs: None,
            constraint: None,
            priority: 0,
            speculation: Speculation::Off,
            prediction: Vec::new(),
            pooling: None,
        }
    }

    /// The embedding of `prompt`, pooled as `pooling` says.
    pub fn embedding(id: RequestId, prompt: Vec<u32>, pooling: Pooling) -> Self {
        Self {
            pooling: Some(pooling),
            ..Self::greedy(id, prompt, 0)
        }
    }

    pub fn is_embedding(&self) -> bool {
        self.pooling.is_some()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was sampled (it is the request's last token).
    Stop,
    /// `max_tokens` were generated, or the largest window is full.
    Length,
    /// The caller aborted the request.
    Aborted,
}

impl FinishReason {
    /// OpenAI's names (`stop`, `length`), and `aborted`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Aborted => "aborted",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV came from a cached conversation instead of a prefill.
    pub cached_tokens: usize,
    /// Of those, the tokens of a conversation read back from the session store (kept on
    /// disk, `--session-dir`), not found in memory.
    pub restored_tokens: usize,
    /// Drafts verified and accepted, and decode passes run.
    pub speculative: DraftStats,
}

/// Where a request's time went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Timings {
    /// From admission to the first sampled token: prefill of the uncached prompt.
    pub prefill_ms: f64,
    pub n_prefill: usize,
    /// From the first sampled token to the last.
    pub decode_ms: f64,
    /// Tokens decoded after the first.
    pub n_decode: usize,
    /// From submission to admission: time spent queued.
    pub queue_ms: f64,
    /// Time spent paused for more urgent requests, after admission.
    pub paused_ms: f64,
    /// Spent computing the grammar's token masks (0 without a constraint).
    pub mask_ms: f64,
}

impl Timings {
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.n_prefill, self.prefill_ms)
    }

    pub fn decode_tok_s(&self) -> f64 {
        rate(self.n_decode, self.decode_ms)
    }
}

fn rate(n: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        n as f64 * 1000.0 / ms
    } else {
        0.0
    }
}

/// A sampled token's log-probability under the model's distribution (before sampling
/// reshaped it) and the most likely tokens', most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// `token`'s log-probability under `logits` and the `k` most likely tokens'.
    pub fn of(logits: &[f32], token: u32, k: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let log_sum = logits
            .iter()
            .map(|&l| f64::from(l - max).exp())
            .sum::<f64>()
            .ln() as f32
            + max;
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        let k = k.min(order.len());
        if k > 0 && k < order.len() {
            order.select_nth_unstable_by(k - 1, by_logit);
        }
        order.truncate(k);
        order.sort_by(by_logit);
        Self {
            logprob: logits[token as usize] - log_sum,
            top: order
                .into_iter()
                .map(|id| (id, logits[id as usize] - log_sum))
                .collect(),
        }
    }
}

/// What one engine step tells its driver, per request.
#[derive(Debug)]
pub enum Event {
    /// The request left the queue; `cached_tokens` of its prompt came from the cache.
    Started { id: RequestId, cached_tokens: usize },
    Token {
        id: RequestId,
        token: u32,
        logprobs: Option<TokenLogprobs>,
    },
    Finished {
        id: RequestId,
        reason: FinishReason,
        usage: Usage,
        timings: Timings,
    },
    /// An embedding request's vector (`[n_embd]`, unit length), just before its
    /// `Finished`.
    Embedding { id: RequestId, embedding: Vec<f32> },
    /// The request ended with an error; its other events stand.
    Failed { id: RequestId, error: EngineError },
}

impl Event {
    pub fn id(&self) -> RequestId {
        match self {
            Event::Started { id, .. }
            | Event::Token { id, .. }
            | Event::Finished { id, .. }
            | Event::Embedding { id, .. }
            | Event::Failed { id, .. } => *id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_normalised_and_ordered() {
        let logits = [1.0f32, 3.0, 2.0, 0.0];
        let lp = TokenLogprobs::of(&logits, 2, 2);
        let total: f32 = logits.iter().map(|&l| (l - 3.0).exp()).sum::<f32>().ln() + 3.0;
        assert!((lp.logprob - (2.0 - total)).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(TokenLogprobs::of(&logits, 0, 9).top.len(), 4);
        assert!(TokenLogprobs::of(&logits, 0, 0).top.is_empty());
    }
}
