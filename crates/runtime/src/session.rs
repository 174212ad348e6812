//! One conversation's tokens and KV cache.

use std::sync::Arc;

use pyramid_kernels::ThreadPool;
use pyramid_model::{KvCache, LogitsFor, Model, Scratch};

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
        let kv = model.new_kv_cache(capacity.max(1));
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

    /// Positions still free before the model's context limit.
    pub fn remaining_context(&self) -> usize {
        self.model.config.n_ctx_train - self.tokens.len()
    }
}
