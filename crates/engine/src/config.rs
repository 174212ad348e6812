//! How an engine is set up: its windows, batch, budgets, aging and speculation.

use std::time::Duration;

use crate::pyramid::PyramidConfig;
use crate::speculate::SpeculativeConfig;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Windows, prefill chunk, window policy, artifact budget, prediction margins.
    pub pyramid: PyramidConfig,
    /// Sequences advanced together in one step.
    pub max_batch: usize,
    /// Bytes of KV cache held by running and cached sessions together.
    pub kv_budget: usize,
    /// Sessions held at once, running and cached.
    pub max_sessions: usize,
    /// Run through per-window static artifacts even on a backend that takes mixed
    /// passes, as a static device would (what `replay` measures).
    pub static_shapes: bool,
    /// Waiting this long (queued, or paused) makes a request one priority level more
    /// urgent, so that nothing starves; zero turns aging off.
    pub aging: Duration,
    /// Drafts for requests asking for speculation (verified on mixed passes only).
    pub speculative: SpeculativeConfig,
}

/// How long a request waits before it is one level more urgent, by default.
pub const DEFAULT_AGING: Duration = Duration::from_secs(2);
