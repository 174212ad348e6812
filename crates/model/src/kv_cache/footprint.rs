//! What a cache costs: the bytes a budget counts for its window (or, before any cache
//! exists, for any window: [`KvFootprint`]) and the bytes its live positions occupy.

use super::sliding::Sliding;
use super::store::row_bytes;
use super::{KvCache, KvType};
use crate::config::ModelConfig;

/// KV bytes of a model's cache as a function of its window: global layers grow with it,
/// sliding-window layers stop at their window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvFootprint {
    global_per_position: usize,
    local_per_position: usize,
    local_rows: usize,
}

impl KvFootprint {
    pub fn of(cfg: &ModelConfig, kind: KvType) -> Self {
        let per_layer = 2 * cfg.n_head_kv * row_bytes(kind, cfg.head_dim);
        let sliding = Sliding::of(cfg);
        let n_local = sliding
            .as_ref()
            .map_or(0, |s| s.local.iter().filter(|&&l| l).count());
        Self {
            global_per_position: per_layer * (cfg.n_layer - n_local),
            local_per_position: per_layer * n_local,
            local_rows: sliding.map_or(0, |s| s.local_rows()),
        }
    }

    /// Bytes of a cache on `window` positions, as [`KvCache::bytes`] counts them.
    pub fn bytes(&self, window: usize) -> usize {
        self.global_per_position.saturating_mul(window)
            + self.local_per_position * window.min(self.local_rows)
    }
}

impl KvCache {
    /// Bytes of the window (`capacity` positions of keys and values, a sliding-window
    /// layer's at most its window and what it keeps behind): what a budget counts. A
    /// reserved cache's memory is at most this, committed as positions fill.
    pub fn bytes(&self) -> usize {
        let per_layer = 2 * self.n_head_kv * row_bytes(self.kind, self.head_dim);
        (0..self.n_layer)
            .map(|l| per_layer * self.rows_held(l, self.capacity))
            .sum()
    }

    /// Rows layer `l` holds of `positions`: a sliding-window layer at most its window
    /// and what it keeps behind.
    fn rows_held(&self, l: usize, positions: usize) -> usize {
        match &self.sliding {
            Some(s) if s.local[l] => positions.min(s.local_rows()),
            _ => positions,
        }
    }

    /// Bytes the live positions occupy (what a copy to another window moves): a
    /// sliding-window layer's only from its released rows on.
    pub fn used_bytes(&self) -> usize {
        self.live_bytes(self.len)
    }

    /// Bytes of the first `n` positions still held.
    pub(super) fn live_bytes(&self, n: usize) -> usize {
        let row = 2 * row_bytes(self.kind, self.head_dim);
        self.run_starts()
            .iter()
            .map(|&start| row * n.saturating_sub(start))
            .sum()
    }
}
