//! One conversation: its tokens, its KV cache on a window of the ladder, and what the
//! predictor has learnt of its growth. Running or cached, a session is the same value;
//! the engine moves it between the two.

use std::time::Duration;

use pyramid_model::KvCache;

use crate::predictor::GrowthPredictor;
use crate::pyramid::ArtifactPair;

/// Where a session's cache lives: its window, the cache, and (on static backends) that
/// window's artifacts, held so the artifact cache never evicts them under the session.
pub(crate) struct Placement {
    pub window: usize,
    pub kv: KvCache,
    pub artifacts: Option<ArtifactPair>,
}

#[derive(Default)]
pub struct Session {
    tokens: Vec<u32>,
    placement: Option<Placement>,
    predictor: GrowthPredictor,
    /// Decode speed, tokens/s (moving average).
    decode_rate: Option<f64>,
}

impl Session {
    /// Tokens whose keys and values are cached, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The current window, once the session has one.
    pub fn window(&self) -> Option<usize> {
        self.placement.as_ref().map(|p| p.window)
    }

    /// KV bytes reserved (the window) and used (the live positions).
    pub fn kv_bytes(&self) -> (usize, usize) {
        self.placement
            .as_ref()
            .map_or((0, 0), |p| (p.kv.bytes(), p.kv.used_bytes()))
    }

    /// Whether the session can go on from its first `len` tokens: its cache still holds
    /// what sliding-window layers read from there on.
    pub fn resumable_at(&self, len: usize) -> bool {
        self.placement
            .as_ref()
            .is_none_or(|p| p.kv.resumable_at(len))
    }

    /// Gives back the cache rows sliding-window layers no longer read.
    pub fn release_out_of_window(&mut self) {
        if let Some(p) = &mut self.placement {
            p.kv.release_out_of_window();
        }
    }

    /// Keeps the first `len` tokens and their cache.
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        if let Some(p) = &mut self.placement {
            p.kv.truncate(len);
        }
    }

    /// A new conversation holding this one's first `n` tokens, their keys and values
    /// copied into `kv` (an empty cache for `window`). On this session's window it shares
    /// its artifacts; on another it holds none until the executor gives it that window's.
    /// This session is unchanged. Returns the fork and the bytes copied.
    pub(crate) fn fork(
        &self,
        n: usize,
        window: usize,
        mut kv: KvCache,
    ) -> Option<(Session, usize)> {
        let placement = self.placement.as_ref()?;
        let copied = placement.kv.copy_prefix_into(n, &mut kv).ok()?;
        let artifacts = if window == placement.window {
            placement.artifacts.clone()
        } else {
            None
        };
        let fork = Session {
            tokens: self.tokens[..n].to_vec(),
            placement: Some(Placement {
                window,
                kv,
                artifacts,
            }),
            ..Session::default()
        };
        Some((fork, copied))
    }

    /// A conversation read back from disk: `tokens`, their KV in `placement`.
    pub(crate) fn restored(tokens: Vec<u32>, placement: Placement) -> Self {
        debug_assert_eq!(placement.kv.len(), tokens.len());
        Session {
            tokens,
            placement: Some(placement),
            ..Session::default()
        }
    }

    pub(crate) fn placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }

    pub(crate) fn placement_mut(&mut self) -> Option<&mut Placement> {
        self.placement.as_mut()
    }

    /// Puts the session on a new placement; the old one (and its artifacts) is released.
    pub(crate) fn place(&mut self, placement: Placement) {
        debug_assert_eq!(placement.kv.len(), self.tokens.len());
        self.placement = Some(placement);
    }

    /// Records tokens the last pass appended to the cache.
    pub(crate) fn extend(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        debug_assert_eq!(
            self.placement.as_ref().map(|p| p.kv.len()),
            Some(self.tokens.len())
        );
    }

    pub(crate) fn observe_decode(&mut self, step: Duration) {
        let rate = 1.0 / step.as_secs_f64().max(1e-9);
        self.decode_rate = Some(self.decode_rate.map_or(rate, |r| 0.8 * r + 0.2 * rate));
    }

    /// A turn ended: `tokens` were added in `elapsed`.
    pub(crate) fn observe_turn(&mut self, tokens: usize, elapsed: Duration) {
        self.predictor.observe_step(tokens, elapsed);
    }

    /// A new conversation's first turn is expected to add `tokens`.
    pub(crate) fn assume_turn(&mut self, tokens: usize) {
        self.predictor.assume_step(tokens);
    }

    /// Whether the window after `window` should start compiling now, for a session that
    /// will hold `len` tokens there, given what that compile is expected to take
    /// (`expected_compile` plus `margin`).
    pub(crate) fn should_prepare_after(
        &self,
        window: usize,
        len: usize,
        expected_compile: Duration,
        margin: Duration,
    ) -> bool {
        self.predictor.should_prepare(
            window.saturating_sub(len),
            self.decode_rate,
            expected_compile,
            margin,
        )
    }
}
