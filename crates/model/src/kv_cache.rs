//! Keys and values of every position seen so far, per layer and KV head.
//!
//! Layout `[n_layer][n_head_kv][stride][head_dim]`: attention for one head walks its
//! positions contiguously. The cache holds `capacity` positions (its window) in runs of
//! `stride` ≥ `capacity` rows:
//! - a *compact* cache (`stride == capacity`, [`KvCache::new`]) is what a device binding
//!   the window's memory as a graph input needs; moving it to a larger window copies each
//!   (layer, head) run;
//! - a *reserved* cache ([`KvCache::with_reserve`]) allocates runs of its largest window
//!   up front as address space only: the kernel commits a page when a position on it is
//!   first written, so memory follows the live positions, and a larger window is the
//!   same memory with a new bound (no copy, no page faults at the crossing, which cost
//!   ~95 % of a copy's time here: measured in docs/BENCHMARKS.md).
//!
//! With [`KvType::Int8`] each stored row (one position of one head) is symmetric INT8
//! with its own f32 scale: a quarter of the bytes for long contexts, where decode is bound
//! by reading the cache.

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

/// Bytes one stored row (one position of one head) takes.
fn row_bytes(kind: KvType, head_dim: usize) -> usize {
    match kind {
        KvType::F32 => head_dim * 4,
        KvType::F16 => head_dim * 2,
        KvType::Int8 => head_dim + 4,
    }
}

/// Element types whose all-zero bit pattern is a valid value (0.0 or 0).
///
/// # Safety
/// Implementors must be plain data for which every zero byte pattern is a valid value.
unsafe trait ZeroBits: Copy {}
// SAFETY: zero bits are 0.0 / 0 for each of these.
unsafe impl ZeroBits for f32 {}
unsafe impl ZeroBits for f16 {}
unsafe impl ZeroBits for i8 {}

/// `n` zeroed elements straight from the allocator's zeroed pages (nothing is touched
/// until written), or `None` when it refuses: a reserve larger than memory and swap is
/// refused by the kernel's overcommit check, and must not abort the process.
fn try_zeroed<T: ZeroBits>(n: usize) -> Option<Vec<T>> {
    let layout = std::alloc::Layout::array::<T>(n).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[T; n]` (which is
    // what `Vec<T>` with capacity `n` frees with), and its `n` zeroed elements are valid
    // values by `ZeroBits`.
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

impl Store {
    /// Zeroed storage for `n_rows` rows, or `None` when the allocator refuses it.
    fn try_new(kind: KvType, n_rows: usize, head_dim: usize) -> Option<Self> {
        let n = n_rows.checked_mul(head_dim)?;
        Some(match kind {
            KvType::F32 => Store::F32(try_zeroed(n)?),
            KvType::F16 => Store::F16(try_zeroed(n)?),
            KvType::Int8 => Store::Int8 {
                q: try_zeroed(n)?,
                scales: try_zeroed(n_rows)?,
            },
        })
    }

    /// As [`Store::try_new`] for storage sized by a window the caller admitted; the
    /// allocator refusing it is out of memory like any other allocation.
    fn new(kind: KvType, n_rows: usize, head_dim: usize) -> Self {
        Self::try_new(kind, n_rows, head_dim).unwrap_or_else(|| {
            let bytes = n_rows.saturating_mul(row_bytes(kind, head_dim));
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(bytes, 8)
                    .unwrap_or(std::alloc::Layout::new::<u8>()),
            )
        })
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

    fn kind(&self) -> KvType {
        match self {
            Store::F32(_) => KvType::F32,
            Store::F16(_) => KvType::F16,
            Store::Int8 { .. } => KvType::Int8,
        }
    }

    /// Writes one element of every page holding the first `rows` rows of each of
    /// `n_runs` runs of `run` rows, so the kernel commits that memory now.
    fn prefault(&mut self, n_runs: usize, run: usize, rows: usize, hd: usize) {
        fn touch<T: Copy>(d: &mut [T], n_runs: usize, run: usize, rows: usize, zero: T) {
            let step = (4096 / std::mem::size_of::<T>()).max(1);
            for r in 0..n_runs {
                for x in d[r * run..r * run + rows].iter_mut().step_by(step) {
                    *x = zero;
                }
            }
        }
        match self {
            Store::F32(d) => touch(d, n_runs, run * hd, rows * hd, 0.0),
            Store::F16(d) => touch(d, n_runs, run * hd, rows * hd, f16::ZERO),
            Store::Int8 { q, scales } => {
                touch(q, n_runs, run * hd, rows * hd, 0);
                touch(scales, n_runs, run, rows, 0.0);
            }
        }
    }

    /// Copies, for each of `n_runs` runs, the first `live` rows from runs of `old_run` rows
    /// into `out`'s runs of `new_run` rows.
    fn copy_runs_into(
        &self,
        out: &mut Store,
        n_runs: usize,
        old_run: usize,
        new_run: usize,
        live: usize,
        hd: usize,
    ) {
        fn copy<T: Copy>(
            src: &[T],
            out: &mut [T],
            n_runs: usize,
            old: usize,
            new: usize,
            live: usize,
        ) {
            for r in 0..n_runs {
                out[r * new..r * new + live].copy_from_slice(&src[r * old..r * old + live]);
            }
        }
        let (old, new, rows) = (old_run * hd, new_run * hd, live * hd);
        match (self, out) {
            (Store::F32(d), Store::F32(o)) => copy(d, o, n_runs, old, new, rows),
            (Store::F16(d), Store::F16(o)) => copy(d, o, n_runs, old, new, rows),
            (Store::Int8 { q, scales }, Store::Int8 { q: oq, scales: os }) => {
                copy(q, oq, n_runs, old, new, rows);
                copy(scales, os, n_runs, old_run, new_run, live);
            }
            _ => unreachable!("caches of one type copy into each other"),
        }
    }

    /// Copies, for each of `n_runs` runs, the first `live` rows from runs of `old_run` rows
    /// into runs of `new_run` rows of fresh zeroed storage (only the copied rows' pages
    /// are touched).
    fn regrow(
        &self,
        n_runs: usize,
        old_run: usize,
        new_run: usize,
        live: usize,
        hd: usize,
    ) -> Self {
        let mut out = Store::new(self.kind(), n_runs * new_run, hd);
        self.copy_runs_into(&mut out, n_runs, old_run, new_run, live, hd);
        out
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

    /// Bytes of the window (`capacity` positions of keys and values): what a budget
    /// counts. A reserved cache's memory is at most this, committed as positions fill.
    pub fn bytes(&self) -> usize {
        2 * self.n_layer * self.n_head_kv * self.capacity * row_bytes(self.kind, self.head_dim)
    }

    /// Whether each (layer, head) run is exactly the window, as a device binding the
    /// cache's memory needs.
    pub fn is_compact(&self) -> bool {
        self.stride == self.capacity
    }

    /// Forgets positions from `len` on (e.g. a chat turn that diverged from the cache).
    pub fn truncate(&mut self, len: usize) {
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
        let n_runs = self.n_layer * self.n_head_kv;
        for store in [&mut self.k, &mut self.v] {
            *store = store.regrow(n_runs, self.stride, capacity, self.len, self.head_dim);
        }
        self.capacity = capacity;
        self.stride = capacity;
        copied
    }

    /// Commits the memory of positions `0..positions` now rather than at their first
    /// write (see [`KvCache::with_reserve`]): for a window a session will move into, the
    /// rows its copy will fill, faulted in before the crossing.
    pub fn prefault(&mut self, positions: usize) {
        let (n_runs, hd) = (self.n_layer * self.n_head_kv, self.head_dim);
        let rows = positions.min(self.capacity);
        self.k.prefault(n_runs, self.stride, rows, hd);
        self.v.prefault(n_runs, self.stride, rows, hd);
    }

    /// Copies the live positions into `dst` (which must hold as many, be compact and of
    /// the same model and type), replacing what it held; returns the bytes copied. Rows
    /// beyond them in `dst` are left as they were: nothing reads positions past a cache's
    /// length.
    pub fn copy_into(&self, dst: &mut KvCache) -> Result<usize> {
        if !dst.is_compact() {
            return Err(ModelError::BadConfig(
                "a migration copies into a compact cache".to_string(),
            ));
        }
        self.copy_prefix_into(self.len, dst)
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
        let n_runs = self.n_layer * self.n_head_kv;
        let hd = self.head_dim;
        self.k
            .copy_runs_into(&mut dst.k, n_runs, self.stride, dst.stride, n, hd);
        self.v
            .copy_runs_into(&mut dst.v, n_runs, self.stride, dst.stride, n, hd);
        dst.len = n;
        Ok(2 * n_runs * n * row_bytes(self.kind, hd))
    }

    /// Bytes the live positions occupy (what a copy to another window moves).
    pub fn used_bytes(&self) -> usize {
        2 * self.n_layer * self.n_head_kv * self.len * row_bytes(self.kind, self.head_dim)
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

    /// One layer's keys and values for every head and position, `[n_head_kv, capacity,
    /// head_dim]` each, when stored in f32 and compact: what a backend keeping the cache
    /// in host memory binds as its input without copying.
    pub fn layer_f32(&self, layer: usize) -> Option<(&[f32], &[f32])> {
        if !self.is_compact() {
            return None;
        }
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
