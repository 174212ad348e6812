//! Keys and values of every position seen so far, per layer and KV head.
//!
//! Layout `[n_layer][n_head_kv][capacity][head_dim]`: attention for one head walks its
//! positions contiguously, and moving a session into a larger cache is one copy per
//! (layer, head) run. With [`KvType::Int8`] each stored row (one position of one head)
//! is symmetric INT8 with its own f32 scale: a quarter of the bytes for long contexts,
//! where decode is bound by reading the cache.

use half::f16;
use half::slice::HalfFloatSliceExt;
use pyramid_kernels::attention::KvRows;
use pyramid_kernels::int8::quantize_row;

use crate::config::ModelConfig;
use crate::{ModelError, Result};

/// How cached keys and values are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    /// Half the bytes of f32, the format static-shape accelerators keep caches in.
    F16,
    Int8,
}

impl KvType {
    pub const ALL: [KvType; 3] = [KvType::F32, KvType::F16, KvType::Int8];

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Int8 => "int8",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One of the two tensors (keys or values), `[n_layer][n_head_kv][capacity][head_dim]`.
#[derive(Debug, Clone)]
enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Values and one scale per row (`[n_layer][n_head_kv][capacity]`).
    Int8 {
        q: Vec<i8>,
        scales: Vec<f32>,
    },
}

impl Store {
    fn new(kind: KvType, n_rows: usize, head_dim: usize) -> Self {
        match kind {
            KvType::F32 => Store::F32(vec![0.0; n_rows * head_dim]),
            KvType::F16 => Store::F16(vec![f16::ZERO; n_rows * head_dim]),
            KvType::Int8 => Store::Int8 {
                q: vec![0; n_rows * head_dim],
                scales: vec![0.0; n_rows],
            },
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Store::F32(d) => d.len() * 4,
            Store::F16(d) => d.len() * 2,
            Store::Int8 { q, scales } => q.len() + scales.len() * 4,
        }
    }

    /// Writes row `row` (of `head_dim` values).
    fn put(&mut self, row: usize, x: &[f32]) {
        let hd = x.len();
        match self {
            Store::F32(d) => d[row * hd..(row + 1) * hd].copy_from_slice(x),
            Store::F16(d) => d[row * hd..(row + 1) * hd].convert_from_f32_slice(x),
            Store::Int8 { q, scales } => {
                scales[row] = quantize_row(x, &mut q[row * hd..(row + 1) * hd])
            }
        }
    }

    /// Copies, for each of `n_runs` runs, the first `live` rows from runs of `old_run` rows
    /// into runs of `new_run` rows.
    fn regrow(
        &self,
        n_runs: usize,
        old_run: usize,
        new_run: usize,
        live: usize,
        hd: usize,
    ) -> Self {
        fn copy<T: Copy + Default>(
            src: &[T],
            n_runs: usize,
            old: usize,
            new: usize,
            live: usize,
        ) -> Vec<T> {
            let mut out = vec![T::default(); n_runs * new];
            for r in 0..n_runs {
                out[r * new..r * new + live].copy_from_slice(&src[r * old..r * old + live]);
            }
            out
        }
        match self {
            Store::F32(d) => Store::F32(copy(d, n_runs, old_run * hd, new_run * hd, live * hd)),
            Store::F16(d) => Store::F16(copy(d, n_runs, old_run * hd, new_run * hd, live * hd)),
            Store::Int8 { q, scales } => Store::Int8 {
                q: copy(q, n_runs, old_run * hd, new_run * hd, live * hd),
                scales: copy(scales, n_runs, old_run, new_run, live),
            },
        }
    }
}

#[derive(Debug, Clone)]
pub struct KvCache {
    kind: KvType,
    n_layer: usize,
    n_head_kv: usize,
    head_dim: usize,
    capacity: usize,
    /// The model's context: growth stops here.
    max_capacity: usize,
    len: usize,
    k: Store,
    v: Store,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, capacity: usize, kind: KvType) -> Self {
        let n_rows = cfg.n_layer * cfg.n_head_kv * capacity;
        Self {
            kind,
            n_layer: cfg.n_layer,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            capacity,
            max_capacity: cfg.n_ctx_train.max(capacity),
            len: 0,
            k: Store::new(kind, n_rows, cfg.head_dim),
            v: Store::new(kind, n_rows, cfg.head_dim),
        }
    }

    pub fn kind(&self) -> KvType {
        self.kind
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
        self.k.bytes() + self.v.bytes()
    }

    /// Forgets positions from `len` on (e.g. a chat turn that diverged from the cache).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Makes room for `needed` positions, copying the live ones into a larger buffer.
    /// Doubling stops at the model's context; `needed` beyond it is left for the forward
    /// pass to reject.
    pub fn reserve(&mut self, needed: usize) {
        let needed = needed.min(self.max_capacity);
        if needed <= self.capacity {
            return;
        }
        let new_capacity = needed
            .max(self.capacity.saturating_mul(2))
            .min(self.max_capacity);
        let n_runs = self.n_layer * self.n_head_kv;
        for store in [&mut self.k, &mut self.v] {
            *store = store.regrow(n_runs, self.capacity, new_capacity, self.len, self.head_dim);
        }
        self.capacity = new_capacity;
    }

    /// The live positions copied into a cache of exactly `capacity` positions: moving a
    /// session to another window without recomputing anything. Keys and values are
    /// copied as stored (INT8 rows keep their scales), so the result is bit-identical.
    pub fn migrated(&self, capacity: usize) -> Result<KvCache> {
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
        let n_runs = self.n_layer * self.n_head_kv;
        let (old, hd) = (self.capacity, self.head_dim);
        Ok(KvCache {
            capacity,
            k: self.k.regrow(n_runs, old, capacity, self.len, hd),
            v: self.v.regrow(n_runs, old, capacity, self.len, hd),
            ..*self
        })
    }

    /// Bytes the live positions occupy (what a migration copies).
    pub fn used_bytes(&self) -> usize {
        if self.capacity == 0 {
            return 0;
        }
        self.bytes() / self.capacity * self.len
    }

    /// Checks that `n_new` more positions fit.
    pub fn check_room(&self, n_new: usize) -> Result<()> {
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

    /// Index of the row holding `pos` of `kv_head` in `layer`.
    fn row(&self, layer: usize, kv_head: usize, pos: usize) -> usize {
        (layer * self.n_head_kv + kv_head) * self.capacity + pos
    }

    /// One head's positions `0..n_pos`.
    pub fn head(&self, layer: usize, kv_head: usize, n_pos: usize) -> KvRows<'_> {
        let (r0, hd) = (self.row(layer, kv_head, 0), self.head_dim);
        let (rows, elems) = (r0..r0 + n_pos, r0 * hd..(r0 + n_pos) * hd);
        match (&self.k, &self.v) {
            (Store::F32(k), Store::F32(v)) => KvRows::F32 {
                keys: &k[elems.clone()],
                values: &v[elems],
            },
            (Store::F16(k), Store::F16(v)) => KvRows::F16 {
                keys: &k[elems.clone()],
                values: &v[elems],
            },
            (Store::Int8 { q: kq, scales: ks }, Store::Int8 { q: vq, scales: vs }) => {
                KvRows::Int8 {
                    keys: &kq[elems.clone()],
                    key_scales: &ks[rows.clone()],
                    values: &vq[elems],
                    value_scales: &vs[rows],
                }
            }
            _ => unreachable!("keys and values are created with the same type"),
        }
    }

    /// One layer's keys and values for every head and position, `[n_head_kv, capacity,
    /// head_dim]` each, when stored in f32: what a backend keeping the cache in host
    /// memory binds as its input without copying.
    pub fn layer_f32(&self, layer: usize) -> Option<(&[f32], &[f32])> {
        let span = self.n_head_kv * self.capacity * self.head_dim;
        let range = layer * span..(layer + 1) * span;
        match (&self.k, &self.v) {
            (Store::F32(k), Store::F32(v)) if layer < self.n_layer => {
                Some((&k[range.clone()], &v[range]))
            }
            _ => None,
        }
    }

    /// Writes consecutive positions from `pos` of one head (`keys` and `values`
    /// `[n, head_dim]`), for backends that compute new rows outside this crate; they
    /// become part of the cache with [`KvCache::commit`].
    pub fn write_head_rows(
        &mut self,
        layer: usize,
        kv_head: usize,
        pos: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let hd = self.head_dim;
        let n = keys.len() / hd;
        if layer >= self.n_layer
            || kv_head >= self.n_head_kv
            || keys.len() != values.len()
            || !keys.len().is_multiple_of(hd)
        {
            return Err(ModelError::BadConfig(format!(
                "KV rows for layer {layer} head {kv_head}: {} keys and {} values of head_dim {hd}",
                keys.len(),
                values.len()
            )));
        }
        if pos + n > self.capacity {
            return Err(ModelError::ContextLengthExceeded {
                needed: pos + n,
                n_ctx: self.capacity,
            });
        }
        for (i, (k, v)) in keys
            .chunks_exact(hd)
            .zip(values.chunks_exact(hd))
            .enumerate()
        {
            let row = self.row(layer, kv_head, pos + i);
            self.k.put(row, k);
            self.v.put(row, v);
        }
        Ok(())
    }

    /// Makes the `n` positions after the live ones live (their rows written first).
    pub fn commit(&mut self, n: usize) -> Result<()> {
        self.check_room(n)?;
        self.advance(n);
        Ok(())
    }

    /// Stores one position's keys and values for every KV head (`[n_head_kv * head_dim]` each).
    pub(crate) fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let hd = self.head_dim;
        for (h, (kh, vh)) in k.chunks_exact(hd).zip(v.chunks_exact(hd)).enumerate() {
            let row = self.row(layer, h, pos);
            self.k.put(row, kh);
            self.v.put(row, vh);
        }
    }
}
