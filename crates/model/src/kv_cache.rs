//! Keys and values of every position seen so far, per layer and KV head.
//!
//! Layout `[n_layer][n_head_kv][capacity][head_dim]`: attention for one head walks its
//! positions contiguously, and moving a session into a larger cache is one copy per
//! (layer, head) run.

use crate::config::ModelConfig;
use crate::{ModelError, Result};

#[derive(Debug, Clone)]
pub struct KvCache {
    n_layer: usize,
    n_head_kv: usize,
    head_dim: usize,
    capacity: usize,
    len: usize,
    k: Vec<f32>, // [n_layer][n_head_kv][capacity][head_dim]
    v: Vec<f32>, // [n_layer][n_head_kv][capacity][head_dim]
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, capacity: usize) -> Self {
        let n = cfg.n_layer * cfg.n_head_kv * capacity * cfg.head_dim;
        Self {
            n_layer: cfg.n_layer,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            capacity,
            len: 0,
            k: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// Positions filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * std::mem::size_of::<f32>()
    }

    /// Forgets positions from `len` on (e.g. a chat turn that diverged from the cache).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Makes room for `needed` positions, copying the live ones into a larger buffer.
    pub fn reserve(&mut self, needed: usize) {
        if needed <= self.capacity {
            return;
        }
        let new_capacity = needed.max(self.capacity * 2);
        let n_rows = self.n_layer * self.n_head_kv;
        let row_old = self.capacity * self.head_dim;
        let row_new = new_capacity * self.head_dim;
        let live = self.len * self.head_dim;
        for buf in [&mut self.k, &mut self.v] {
            let mut grown = vec![0.0; n_rows * row_new];
            for r in 0..n_rows {
                grown[r * row_new..r * row_new + live]
                    .copy_from_slice(&buf[r * row_old..r * row_old + live]);
            }
            *buf = grown;
        }
        self.capacity = new_capacity;
    }

    /// Checks that `n_new` more positions fit.
    pub(crate) fn check_room(&self, n_new: usize) -> Result<()> {
        if self.len + n_new > self.capacity {
            return Err(ModelError::ContextLengthExceeded {
                needed: self.len + n_new,
                n_ctx: self.capacity,
            });
        }
        Ok(())
    }

    pub(crate) fn advance(&mut self, n: usize) {
        debug_assert!(self.len + n <= self.capacity);
        self.len += n;
    }

    fn offset(&self, layer: usize, kv_head: usize, pos: usize) -> usize {
        ((layer * self.n_head_kv + kv_head) * self.capacity + pos) * self.head_dim
    }

    /// Keys of one head for positions `0..n_pos`: `[n_pos, head_dim]`.
    pub fn keys(&self, layer: usize, kv_head: usize, n_pos: usize) -> &[f32] {
        let start = self.offset(layer, kv_head, 0);
        &self.k[start..start + n_pos * self.head_dim]
    }

    /// Values of one head for positions `0..n_pos`: `[n_pos, head_dim]`.
    pub fn values(&self, layer: usize, kv_head: usize, n_pos: usize) -> &[f32] {
        let start = self.offset(layer, kv_head, 0);
        &self.v[start..start + n_pos * self.head_dim]
    }

    /// Stores one position's keys and values for every KV head (`[n_head_kv * head_dim]` each).
    pub(crate) fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        for (h, (kh, vh)) in k
            .chunks_exact(self.head_dim)
            .zip(v.chunks_exact(self.head_dim))
            .enumerate()
        {
            let o = self.offset(layer, h, pos);
            self.k[o..o + self.head_dim].copy_from_slice(kh);
            self.v[o..o + self.head_dim].copy_from_slice(vh);
        }
    }
}
