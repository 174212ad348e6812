//! One conversation's tokens and KV cache.

use std::sync::Arc;

use pyramid_kernels::ThreadPool;
use pyramid_model::{KvCache, KvType, LogitsFor, Model, Scratch, Segment};

use crate::{Result, RuntimeError};

/// What a prefill computed and what it reused.
#[derive(Debug)]
pub struct Prefill {
    /// Logits at the last prompt position: `[n_vocab]`.
    pub logits: Vec<f32>,
    /// Leading prompt tokens whose keys and values were already cached.
    pub n_reused: usize,
    /// Tokens run through the model now.
    pub n_computed: usize,
}

pub struct Session {
    model: Arc<Model>,
    kv: KvCache,
    tokens: Vec<u32>,
    scratch: Scratch,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("n_tokens", &self.tokens.len())
            .field("kv_capacity", &self.kv.capacity())
            .finish()
    }
}

impl Session {
    /// `capacity` positions are reserved up front; the cache grows on demand up to the
    /// model's context length.
    pub fn new(model: Arc<Model>, capacity: usize) -> Self {
        Self::with_kv_type(model, capacity, KvType::F32)
    }

    /// As [`Session::new`], caching keys and values as `kv_type`.
    pub fn with_kv_type(model: Arc<Model>, capacity: usize, kv_type: KvType) -> Self {
        let kv = model.new_kv_cache_of(capacity.max(1), kv_type);
        Self {
            model,
            kv,
            tokens: Vec::new(),
            scratch: Scratch::default(),
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    fn check_context(&self, needed: usize) -> Result<()> {
        let n_ctx = self.model.config.n_ctx_train;
        if needed > n_ctx {
            return Err(RuntimeError::ContextLengthExceeded { needed, n_ctx });
        }
        Ok(())
    }

    /// Makes the session hold exactly `prompt`, running only the part after the longest
    /// prefix already cached. At least the last token is always run, for its logits.
    pub fn prefill(&mut self, pool: &ThreadPool, prompt: &[u32]) -> Result<Prefill> {
        if prompt.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        self.check_context(prompt.len())?;
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let n_reused = common.min(prompt.len() - 1);
        self.kv.truncate(n_reused);
        self.tokens.truncate(n_reused);
        self.kv.reserve(prompt.len());
        let new = &prompt[n_reused..];
        let logits =
            self.model
                .forward(pool, new, &mut self.kv, &mut self.scratch, LogitsFor::Last)?;
        self.tokens.extend_from_slice(new);
        Ok(Prefill {
            logits,
            n_reused,
            n_computed: new.len(),
        })
    }

    /// Appends one token and returns the logits for the position after it.
    pub fn decode(&mut self, pool: &ThreadPool, token: u32) -> Result<Vec<f32>> {
        self.check_context(self.tokens.len() + 1)?;
        self.kv.reserve(self.tokens.len() + 1);
        let logits = self.model.forward(
            pool,
            &[token],
            &mut self.kv,
            &mut self.scratch,
            LogitsFor::Last,
        )?;
        self.tokens.push(token);
        Ok(logits)
    }

    /// Keeps the first `len` tokens and their cache: the part of an earlier conversation a
    /// new request shares.
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.kv.truncate(len);
    }

    /// Moves the cache into a buffer of exactly `capacity` positions (a window of the
    /// pyramid), copying the live positions unchanged.
    pub fn migrate(&mut self, capacity: usize) -> Result<()> {
        self.kv = self.kv.migrated(capacity)?;
        Ok(())
    }

    /// Positions still free before the model's context limit.
    pub fn remaining_context(&self) -> usize {
        self.model.config.n_ctx_train - self.tokens.len()
    }
}

/// Appends `new_tokens[i]` to `sessions[i]` for every `i` in one forward pass, reading each
/// weight once for the whole batch, and returns each session's logits at its last new token.
/// A prefill chunk and single decode tokens may be mixed; the results are exactly those of
/// running each session alone.
pub fn step_batch(
    pool: &ThreadPool,
    sessions: &mut [&mut Session],
    new_tokens: &[&[u32]],
    scratch: &mut Scratch,
) -> Result<Vec<Vec<f32>>> {
    assert_eq!(
        sessions.len(),
        new_tokens.len(),
        "one token list per session"
    );
    let Some(first) = sessions.first() else {
        return Ok(Vec::new());
    };
    let model = Arc::clone(&first.model);
    for (session, tokens) in sessions.iter_mut().zip(new_tokens) {
        if !Arc::ptr_eq(&session.model, &model) {
            return Err(RuntimeError::MixedModels);
        }
        if tokens.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        session.check_context(session.tokens.len() + tokens.len())?;
        session.kv.reserve(session.tokens.len() + tokens.len());
    }
    let mut segments: Vec<Segment> = sessions
        .iter_mut()
        .zip(new_tokens)
        .map(|(session, tokens)| Segment::new(tokens, &mut session.kv))
        .collect();
    let logits = model.forward_batch(pool, &mut segments, scratch, LogitsFor::Last)?;
    for (session, tokens) in sessions.iter_mut().zip(new_tokens) {
        session.tokens.extend_from_slice(tokens);
    }
    let n_vocab = model.config.n_vocab;
    Ok(logits.chunks_exact(n_vocab).map(<[f32]>::to_vec).collect())
}
