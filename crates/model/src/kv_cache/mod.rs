//! Keys and values of every position seen so far, per layer and KV head.
//!
//! Layout `[n_layer][n_head_kv][stride][head_dim]`: attention for one head walks its
//! positions contiguously. The cache holds `capacity` positions (its window) in runs of
//! `stride` ≥ `capacity` rows:
//! - a *compact* cache (`stride == capacity`, [`KvCache::new`]) holds exactly its window;
//!   moving it to a larger window copies each (layer, head) run;
//! - a *reserved* cache ([`KvCache::with_reserve`], what the engine gives every session)
//!   allocates runs of its largest window up front as address space only: the kernel
//!   commits a page when a position on it is first written, so memory follows the live
//!   positions, and a larger window is the same memory with a new bound (no copy, no page
//!   faults at the crossing, which cost ~95 % of a copy's time here: measured in
//!   docs/BENCHMARKS.md). Each run's first `capacity` rows are contiguous in either
//!   layout, so a device binding host memory binds them per head ([`KvCache::head_f32`]).
//!
//! A sliding-window layer (Gemma 3's local layers) reads only its last `window` positions,
//! so [`KvCache::release_out_of_window`] gives the pages of its older rows back to the
//! kernel (they read as zeros afterwards): its memory stays near the window whatever the
//! context, while the layout, and every index, is unchanged. Only global layers grow with
//! the window ladder. A cache cannot then resume from a length whose window reaches below
//! the released rows ([`KvCache::resumable_at`]).
//!
//! With [`KvType::Int8`] each stored row (one position of one head) is symmetric INT8
//! with its own f32 scale: a quarter of the bytes for long contexts, where decode is bound
//! by reading the cache.
//!
//! Files, by concern:
//! - this file: the type, its construction, and the rows the forward pass and backends
//!   read and write;
//! - `store`: one tensor's storage (f32, f16 or INT8 rows) and its page-level memory;
//! - `sliding`: giving back a sliding-window layer's rows older than its window;
//! - `window`: the engine's window moves: growing, truncating, forking a prefix;
//! - `footprint`: the bytes a cache counts against a budget, now or at any window;
//! - `file`: a cache's live positions written to and read from disk.

mod file;
mod footprint;
mod sliding;
mod store;
mod window;

use pyramid_kernels::attention::KvRows;

use crate::config::ModelConfig;
use crate::{ModelError, Result};
pub use footprint::KvFootprint;
use sliding::Sliding;
use store::Store;

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
#[derive(Debug, Clone)]
pub struct KvCache {
    kind: KvType,
    n_layer: usize,
    n_head_kv: usize,
    head_dim: usize,
    capacity: usize,
    /// Rows allocated per (layer, head) run: `capacity` when compact, the reserve when
    /// reserved.
    stride: usize,
    /// The model's context: growth stops here.
    max_capacity: usize,
    len: usize,
    k: Store,
    v: Store,
    sliding: Option<Sliding>,
}

impl KvCache {
    /// A compact cache of `capacity` positions.
    pub fn new(cfg: &ModelConfig, capacity: usize, kind: KvType) -> Self {
        Self::with_reserve(cfg, capacity, capacity, kind)
    }

    /// A cache of `capacity` positions with room reserved for `reserve` (at most the
    /// model's context): growing to any window up to it copies nothing. Where the
    /// allocator refuses that much address space (a long context on a small machine), the
    /// cache is compact instead and growing it copies.
    pub fn with_reserve(cfg: &ModelConfig, capacity: usize, reserve: usize, kind: KvType) -> Self {
        let max_capacity = cfg.n_ctx_train.max(capacity);
        let runs = cfg.n_layer * cfg.n_head_kv;
        let reserved = |stride: usize| {
            let n_rows = runs.checked_mul(stride)?;
            let k = Store::try_new(kind, n_rows, cfg.head_dim)?;
            Some((stride, k, Store::try_new(kind, n_rows, cfg.head_dim)?))
        };
        let (stride, k, v) = reserved(reserve.clamp(capacity, max_capacity)).unwrap_or_else(|| {
            let n_rows = runs * capacity;
            let store = || Store::new(kind, n_rows, cfg.head_dim);
            (capacity, store(), store())
        });
        Self {
            kind,
            n_layer: cfg.n_layer,
            n_head_kv: cfg.n_head_kv,
            head_dim: cfg.head_dim,
            capacity,
            stride,
            max_capacity,
            len: 0,
            k,
            v,
            sliding: Sliding::of(cfg),
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

    /// Layers, KV heads and head size: what a cache of another model differs in.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.n_layer, self.n_head_kv, self.head_dim)
    }
}

// The forward pass's side: room for a pass, its rows stored, each head's rows read back.
impl KvCache {
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
        (layer * self.n_head_kv + kv_head) * self.stride + pos
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

// Backends that compute rows outside this crate: bind a head's f32 rows, write rows, and
// make them live.
impl KvCache {
    /// One head's keys and values over the whole window, `[capacity, head_dim]` each, when
    /// stored in f32: what a backend keeping the cache in host memory binds as its input
    /// without copying. Each (layer, head) run is contiguous in any layout, so a reserved
    /// cache's larger window is the same memory with a longer view. Rows past the length
    /// are unspecified (zeros or stale); graphs mask them.
    pub fn head_f32(&self, layer: usize, kv_head: usize) -> Option<(&[f32], &[f32])> {
        if layer >= self.n_layer || kv_head >= self.n_head_kv {
            return None;
        }
        let r0 = self.row(layer, kv_head, 0);
        let range = r0 * self.head_dim..(r0 + self.capacity) * self.head_dim;
        match (&self.k, &self.v) {
            (Store::F32(k), Store::F32(v)) => Some((&k[range.clone()], &v[range])),
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
}
