//! The engine's moves of a cache's window: growing it (a new bound within a reserve, a
//! copy beyond it), truncating it, and copying a prefix into another cache to fork a
//! conversation.

use super::KvCache;
use crate::{ModelError, Result};

impl KvCache {
    /// Whether each (layer, head) run is exactly the window (growing it copies).
    pub fn is_compact(&self) -> bool {
        self.stride == self.capacity
    }

    /// Forgets positions from `len` on (e.g. a chat turn that diverged from the cache).
    /// The caller checks [`KvCache::resumable_at`] first where rows may have been given
    /// back.
    pub fn truncate(&mut self, len: usize) {
        debug_assert!(
            self.resumable_at(len.min(self.len)),
            "truncated below released rows"
        );
        self.len = self.len.min(len);
    }

    /// Makes room for `needed` positions: within the reserve by moving the bound, beyond
    /// it by copying the live positions into a larger buffer. Doubling stops at the
    /// model's context; `needed` beyond it is left for the forward pass to reject.
    pub fn reserve(&mut self, needed: usize) {
        let needed = needed.min(self.max_capacity);
        if needed <= self.capacity {
            return;
        }
        let new_capacity = needed
            .max(self.capacity.saturating_mul(2))
            .min(self.max_capacity);
        self.set_window(new_capacity);
    }

    /// Moves the cache to a window of exactly `capacity` positions, keeping the live
    /// positions bit for bit: a reserved cache within its reserve only changes its bound;
    /// otherwise the live positions are copied into new compact runs. Returns the bytes
    /// copied (0 without a copy). On error the cache is unchanged.
    pub fn grow_to(&mut self, capacity: usize) -> Result<usize> {
        self.check_window(capacity)?;
        Ok(self.set_window(capacity))
    }

    fn check_window(&self, capacity: usize) -> Result<()> {
        if capacity < self.len || capacity > self.max_capacity {
            return Err(ModelError::ContextLengthExceeded {
                needed: self.len.max(capacity),
                n_ctx: if capacity < self.len {
                    capacity
                } else {
                    self.max_capacity
                },
            });
        }
        Ok(())
    }

    /// `capacity` is valid: within a reserve it is a new bound; otherwise (or to keep a
    /// compact cache compact) a copy.
    fn set_window(&mut self, capacity: usize) -> usize {
        let in_place = if self.is_compact() {
            capacity == self.capacity
        } else {
            capacity <= self.stride
        };
        if in_place {
            self.capacity = capacity;
            return 0;
        }
        let copied = self.used_bytes();
        let starts = self.run_starts();
        for store in [&mut self.k, &mut self.v] {
            *store = store.regrow(&starts, self.stride, capacity, self.len, self.head_dim);
        }
        self.capacity = capacity;
        self.stride = capacity;
        copied
    }

    /// Copies the first `n` live positions into `dst` (compact or reserved, of the same
    /// model and type, holding at least `n`), which then holds exactly those; returns the
    /// bytes copied. This cache is unchanged: a conversation forked from it keeps both.
    pub fn copy_prefix_into(&self, n: usize, dst: &mut KvCache) -> Result<usize> {
        let same = dst.kind == self.kind
            && (dst.n_layer, dst.n_head_kv, dst.head_dim)
                == (self.n_layer, self.n_head_kv, self.head_dim);
        if !same || dst.capacity < n || n > self.len {
            return Err(ModelError::BadConfig(format!(
                "a cache of {} positions ({}) cannot take {n} of the {} live positions of a {} cache",
                dst.capacity, dst.kind, self.len, self.kind
            )));
        }
        if !self.resumable_at(n) {
            return Err(ModelError::BadConfig(format!(
                "positions before {n} of this cache's sliding-window layers were given back"
            )));
        }
        let hd = self.head_dim;
        let starts = self.run_starts();
        self.k
            .copy_runs_into(&mut dst.k, &starts, self.stride, dst.stride, n, hd);
        self.v
            .copy_runs_into(&mut dst.v, &starts, self.stride, dst.stride, n, hd);
        dst.len = n;
        // The destination's older rows were not written: it has given them back too.
        if let (Some(d), Some(s)) = (&mut dst.sliding, &self.sliding) {
            d.released = s.released.min(n);
        }
        Ok(self.live_bytes(n))
    }
}
