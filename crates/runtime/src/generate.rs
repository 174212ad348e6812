//! The generation loop: prefill the prompt, then sample and decode one token at a time.

use std::time::Instant;

use pyramid_kernels::ThreadPool;

use crate::sampler::{Sampler, SamplerConfig};
use crate::session::{Prefill, Session};
use crate::Result;

/// What the generation loop drives: a native [`Session`], or a session on compiled
/// artifacts (the window pyramid, any backend).
pub trait Decoder {
    type Error: From<crate::RuntimeError>;

    /// Makes the context exactly `prompt`, reusing what is cached.
    fn prefill_prompt(&mut self, pool: &ThreadPool, prompt: &[u32])
        -> Result<Prefill, Self::Error>;

    /// Appends `token`; returns the logits after it.
    fn decode_token(&mut self, pool: &ThreadPool, token: u32) -> Result<Vec<f32>, Self::Error>;

    /// Positions left before the context is full.
    fn remaining_context(&self) -> usize;
}

impl Decoder for Session {
    type Error = crate::RuntimeError;

    fn prefill_prompt(&mut self, pool: &ThreadPool, prompt: &[u32]) -> Result<Prefill> {
        self.prefill(pool, prompt)
    }

    fn decode_token(&mut self, pool: &ThreadPool, token: u32) -> Result<Vec<f32>> {
        self.decode(pool, token)
    }

    fn remaining_context(&self) -> usize {
        Session::remaining_context(self)
    }
}

#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    /// Tokens that end generation (EOS, end-of-turn), unless `ignore_eos`.
    pub stop_tokens: Vec<u32>,
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated (it is included in the output tokens).
    Stop,
    /// `max_tokens` reached or the model's context is full.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
}

impl FinishReason {
    /// Names as in OpenAI's API (`stop`, `length`), plus `cancelled` for our own stop.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    pub prefill_ms: f64,
    /// Tokens run through the model in prefill (the prompt minus the reused prefix).
    pub n_prefill: usize,
    pub decode_ms: f64,
    /// Single-token forward passes after prefill.
    pub n_decode: usize,
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

#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub n_prompt_reused: usize,
    pub timings: Timings,
}

/// Generates after `prompt`, calling `on_token` with each new token as soon as it is
/// chosen; `on_token` returning `false` cancels.
pub fn generate<D: Decoder + ?Sized>(
    session: &mut D,
    pool: &ThreadPool,
    prompt: &[u32],
    params: &GenerateParams,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<Generation, D::Error> {
    let mut sampler = Sampler::new(params.sampler.clone())?;
    let mut timings = Timings::default();

    let start = Instant::now();
    let prefill = session.prefill_prompt(pool, prompt)?;
    timings.prefill_ms = start.elapsed().as_secs_f64() * 1e3;
    timings.n_prefill = prefill.n_computed;

    let mut logits = prefill.logits;
    let mut tokens = Vec::new();
    let mut history = prompt.to_vec();
    let decode_start = Instant::now();
    let finish_reason = loop {
        if tokens.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        let token = sampler.sample(&mut logits, &history);
        tokens.push(token);
        history.push(token);
        let keep_going = on_token(token);
        if !params.ignore_eos && params.stop_tokens.contains(&token) {
            break FinishReason::Stop;
        }
        if !keep_going {
            break FinishReason::Cancelled;
        }
        if tokens.len() >= params.max_tokens {
            break FinishReason::Length;
        }
        if session.remaining_context() == 0 {
            break FinishReason::Length;
        }
        logits = session.decode_token(pool, token)?;
        timings.n_decode += 1;
    };
    timings.decode_ms = decode_start.elapsed().as_secs_f64() * 1e3;
    Ok(Generation {
        tokens,
        finish_reason,
        n_prompt_reused: prefill.n_reused,
        timings,
    })
}
