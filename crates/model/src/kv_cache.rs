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

/// Gives the whole pages inside `elems` back to the kernel: their memory is uncommitted,
/// and they read as zeros until written again.
fn release_pages<T: ZeroBits>(elems: &mut [T]) {
    const PAGE: usize = 4096;
    let start = elems.as_mut_ptr() as usize;
    let end = start + std::mem::size_of_val(elems);
    let (first, last) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
    if last <= first {
        return;
    }
    // SAFETY: `[first, last)` lies inside `elems`, which this borrow owns exclusively; the
    // pages are private anonymous memory (the allocator's), whose contents MADV_DONTNEED
    // replaces with zeros, a valid value of `T` by `ZeroBits`. The allocator's own
    // bookkeeping sits outside `elems`. A refusal leaves the memory as it was.
    unsafe {
        libc::madvise(
            first as *mut libc::c_void,
            last - first,
            libc::MADV_DONTNEED,
        );
    }
}

/// Positions kept behind the window of a sliding-window layer, so that what the engine
/// takes back after a step (a rejected speculative draft) is still there.
const KEEP_BEHIND: usize = 256;
/// Sliding-window rows are given back in steps of this many positions: whole pages, few
/// system calls.
const RELEASE_STEP: usize = 256;

/// Which layers slide, and how far their rows have been given back.
#[derive(Debug, Clone)]
struct Sliding {
    window: usize,
    /// Per layer: whether it attends only to its last `window` positions.
    local: Vec<bool>,
    /// Local layers' rows below this position may have been given back (read as zeros).
    released: usize,
}

impl Sliding {
    fn of(cfg: &ModelConfig) -> Option<Self> {
        let window = cfg.sliding_window?.size;
        Some(Self {
            window,
            local: (0..cfg.n_layer)
                .map(|l| cfg.layer_window(l).is_some())
                .collect(),
            released: 0,
        })
    }

    /// Rows a local layer holds after a release, at most: its window, what is kept behind
    /// it, and a step not yet given back. Until the next release, the rows of the engine
    /// step in between (one prefill chunk) come on top; budgets count this figure.
    fn local_rows(&self) -> usize {
        self.window + KEEP_BEHIND + RELEASE_STEP
    }
}

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

/// Elements stored on disk as their little-endian bytes ([`KvCache::write_live`]).
///
/// # Safety
/// Implementors have no padding and every bit pattern of their size is a valid value, so
/// a slice of them may be viewed, and overwritten, as bytes.
#[cfg_attr(all(target_endian = "little", not(test)), allow(dead_code))]
unsafe trait LeBytes: Copy {
    const SIZE: usize;
    fn put_le(self, out: &mut [u8]);
    fn get_le(bytes: &[u8]) -> Self;
}
// SAFETY: f32 (4 bytes), f16 (a transparent u16) and i8 have no padding, and any bits are
// a value of each (NaN payloads included).
unsafe impl LeBytes for f32 {
    const SIZE: usize = 4;
    fn put_le(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_le_bytes());
    }
    fn get_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}
// SAFETY: as above.
unsafe impl LeBytes for f16 {
    const SIZE: usize = 2;
    fn put_le(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_bits().to_le_bytes());
    }
    fn get_le(b: &[u8]) -> Self {
        f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
}
// SAFETY: as above.
unsafe impl LeBytes for i8 {
    const SIZE: usize = 1;
    fn put_le(self, out: &mut [u8]) {
        out[0] = self as u8;
    }
    fn get_le(b: &[u8]) -> Self {
        b[0] as i8
    }
}

/// Writes `s` as little-endian bytes in one call: on a little-endian target the elements'
/// memory already is that, so a run of rows goes to the writer without a copy.
#[cfg(target_endian = "little")]
fn write_le<T: LeBytes>(w: &mut dyn std::io::Write, s: &[T]) -> std::io::Result<()> {
    // SAFETY: `T: LeBytes` has no padding, so every byte of the slice is initialised; the
    // view covers exactly the slice's memory and borrows it immutably.
    let bytes =
        unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) };
    w.write_all(bytes)
}

#[cfg(not(target_endian = "little"))]
fn write_le<T: LeBytes>(w: &mut dyn std::io::Write, s: &[T]) -> std::io::Result<()> {
    write_le_portable(w, s)
}

/// Fills `s` from little-endian bytes, reading straight into its memory where that is
/// the layout already.
#[cfg(target_endian = "little")]
fn read_le<T: LeBytes>(r: &mut dyn std::io::Read, s: &mut [T]) -> std::io::Result<()> {
    // SAFETY: `T: LeBytes` has no padding and every bit pattern is a valid `T`, so any
    // bytes written through the view leave valid elements; the view covers exactly the
    // slice's memory and borrows it mutably for its lifetime.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s))
    };
    r.read_exact(bytes)
}

#[cfg(not(target_endian = "little"))]
fn read_le<T: LeBytes>(r: &mut dyn std::io::Read, s: &mut [T]) -> std::io::Result<()> {
    read_le_portable(r, s)
}

/// Bytes converted per chunk by the portable paths.
#[cfg_attr(all(target_endian = "little", not(test)), allow(dead_code))]
const LE_CHUNK_BYTES: usize = 64 * 1024;

/// [`write_le`] for any byte order: element by element through a reusable buffer.
#[cfg_attr(all(target_endian = "little", not(test)), allow(dead_code))]
fn write_le_portable<T: LeBytes>(w: &mut dyn std::io::Write, s: &[T]) -> std::io::Result<()> {
    let per_chunk = LE_CHUNK_BYTES / T::SIZE;
    let mut buf = vec![0u8; per_chunk.min(s.len()) * T::SIZE];
    for chunk in s.chunks(per_chunk) {
        let out = &mut buf[..chunk.len() * T::SIZE];
        for (x, b) in chunk.iter().zip(out.chunks_exact_mut(T::SIZE)) {
            x.put_le(b);
        }
        w.write_all(out)?;
    }
    Ok(())
}

/// [`read_le`] for any byte order.
#[cfg_attr(all(target_endian = "little", not(test)), allow(dead_code))]
fn read_le_portable<T: LeBytes>(r: &mut dyn std::io::Read, s: &mut [T]) -> std::io::Result<()> {
    let per_chunk = LE_CHUNK_BYTES / T::SIZE;
    let mut buf = vec![0u8; per_chunk.min(s.len()) * T::SIZE];
    for chunk in s.chunks_mut(per_chunk) {
        let bytes = &mut buf[..chunk.len() * T::SIZE];
        r.read_exact(bytes)?;
        for (x, b) in chunk.iter_mut().zip(bytes.chunks_exact(T::SIZE)) {
            *x = T::get_le(b);
        }
    }
    Ok(())
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

    /// Copies, for each run `r`, rows `starts[r]..live` from runs of `old_run` rows into
    /// `out`'s runs of `new_run` rows (a run's rows before its start were given back).
    fn copy_runs_into(
        &self,
        out: &mut Store,
        starts: &[usize],
        old_run: usize,
        new_run: usize,
        live: usize,
        hd: usize,
    ) {
        fn copy<T: Copy>(
            src: &[T],
            out: &mut [T],
            starts: &[usize],
            (old, new, width): (usize, usize, usize),
            live: usize,
        ) {
            for (r, &start) in starts.iter().enumerate() {
                let (from, to) = (start.min(live) * width, live * width);
                out[r * new + from..r * new + to]
                    .copy_from_slice(&src[r * old + from..r * old + to]);
            }
        }
        let (old, new) = (old_run * hd, new_run * hd);
        match (self, out) {
            (Store::F32(d), Store::F32(o)) => copy(d, o, starts, (old, new, hd), live),
            (Store::F16(d), Store::F16(o)) => copy(d, o, starts, (old, new, hd), live),
            (Store::Int8 { q, scales }, Store::Int8 { q: oq, scales: os }) => {
                copy(q, oq, starts, (old, new, hd), live);
                copy(scales, os, starts, (old_run, new_run, 1), live);
            }
            _ => unreachable!("caches of one type copy into each other"),
        }
    }

    /// As [`Store::copy_runs_into`], into fresh zeroed storage of runs of `new_run` rows
    /// (only the copied rows' pages are touched).
    fn regrow(
        &self,
        starts: &[usize],
        old_run: usize,
        new_run: usize,
        live: usize,
        hd: usize,
    ) -> Self {
        let mut out = Store::new(self.kind(), starts.len() * new_run, hd);
        self.copy_runs_into(&mut out, starts, old_run, new_run, live, hd);
        out
    }

    /// Gives back the pages of rows `rows` of run `r` (runs of `run` rows).
    fn release_rows(&mut self, r: usize, run: usize, rows: std::ops::Range<usize>, hd: usize) {
        let elems = (r * run + rows.start) * hd..(r * run + rows.end) * hd;
        match self {
            Store::F32(d) => release_pages(&mut d[elems]),
            Store::F16(d) => release_pages(&mut d[elems]),
            // The row scales are a 256th of the values: left committed.
            Store::Int8 { q, .. } => release_pages(&mut q[elems]),
        }
    }

    /// Writes the first `live` rows of each of `n_runs` runs of `run` rows, run by run
    /// (INT8: a run's values, then its `live` scales).
    fn write_runs(
        &self,
        w: &mut dyn std::io::Write,
        n_runs: usize,
        run: usize,
        live: usize,
        hd: usize,
    ) -> std::io::Result<()> {
        for r in 0..n_runs {
            let elems = r * run * hd..(r * run + live) * hd;
            match self {
                Store::F32(d) => write_le(w, &d[elems])?,
                Store::F16(d) => write_le(w, &d[elems])?,
                Store::Int8 { q, scales } => {
                    write_le(w, &q[elems])?;
                    write_le(w, &scales[r * run..r * run + live])?;
                }
            }
        }
        Ok(())
    }

    /// Fills what [`Store::write_runs`] wrote for `live` rows per run into runs of `run`
    /// rows.
    fn read_runs(
        &mut self,
        rd: &mut dyn std::io::Read,
        n_runs: usize,
        run: usize,
        live: usize,
        hd: usize,
    ) -> std::io::Result<()> {
        for r in 0..n_runs {
            let elems = r * run * hd..(r * run + live) * hd;
            match self {
                Store::F32(d) => read_le(rd, &mut d[elems])?,
                Store::F16(d) => read_le(rd, &mut d[elems])?,
                Store::Int8 { q, scales } => {
                    read_le(rd, &mut q[elems])?;
                    read_le(rd, &mut scales[r * run..r * run + live])?;
                }
            }
        }
        Ok(())
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

    /// First row of each (layer, head) run still held: local layers' rows below the
    /// released position are gone.
    fn run_starts(&self) -> Vec<usize> {
        let released = |l: usize| match &self.sliding {
            Some(s) if s.local[l] => s.released,
            _ => 0,
        };
        (0..self.n_layer)
            .flat_map(|l| std::iter::repeat_n(released(l), self.n_head_kv))
            .collect()
    }

    /// Gives back the pages of sliding-window layers' rows older than their window (and
    /// what is kept behind it), in steps; returns the bytes given back. The engine calls
    /// it between steps, never inside a pass, so a pass that fails and rolls the cache back
    /// finds its rows where they were.
    pub fn release_out_of_window(&mut self) -> usize {
        let Some(s) = &self.sliding else {
            return 0;
        };
        let keep_from =
            self.len.saturating_sub(s.window + KEEP_BEHIND) / RELEASE_STEP * RELEASE_STEP;
        if keep_from <= s.released {
            return 0;
        }
        let (from, hd, stride) = (s.released, self.head_dim, self.stride);
        let local: Vec<usize> = (0..self.n_layer).filter(|&l| s.local[l]).collect();
        for &l in &local {
            for h in 0..self.n_head_kv {
                let r = l * self.n_head_kv + h;
                self.k.release_rows(r, stride, from..keep_from, hd);
                self.v.release_rows(r, stride, from..keep_from, hd);
            }
        }
        if let Some(s) = &mut self.sliding {
            s.released = keep_from;
        }
        2 * local.len() * self.n_head_kv * (keep_from - from) * row_bytes(self.kind, hd)
    }

    /// Whether the cache can go on from length `len` (after [`KvCache::truncate`]): every
    /// row a sliding-window layer reads from there on is still held.
    pub fn resumable_at(&self, len: usize) -> bool {
        match &self.sliding {
            Some(s) if s.released > 0 => len + 1 >= s.released + s.window,
            _ => true,
        }
    }

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

    /// Bytes the live positions occupy (what a copy to another window moves): a
    /// sliding-window layer's only from its released rows on.
    pub fn used_bytes(&self) -> usize {
        self.live_bytes(self.len)
    }

    /// Bytes of the first `n` positions still held.
    fn live_bytes(&self, n: usize) -> usize {
        let row = 2 * row_bytes(self.kind, self.head_dim);
        self.run_starts()
            .iter()
            .map(|&start| row * n.saturating_sub(start))
            .sum()
    }

    /// Writes the live positions (rows given back as the zeros they read as), for a
    /// conversation kept on disk: keys, then values; each
    /// as its (layer, head) runs in order, a run's first `len` rows (INT8: the run's
    /// values, then its `len` row scales); every element little-endian (f16 as its bits).
    /// Exactly [`KvCache::used_bytes`] bytes, whatever the window or reserve, so a reader
    /// may lay them out on another. A run is one write: at memory speed, since resuming
    /// must cost a small fraction of prefilling again.
    pub fn write_live(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        let n_runs = self.n_layer * self.n_head_kv;
        for store in [&self.k, &self.v] {
            store.write_runs(w, n_runs, self.stride, self.len, self.head_dim)?;
        }
        Ok(())
    }

    /// Fills this empty cache's first `n` positions from what [`KvCache::write_live`]
    /// wrote for a cache of `n` live positions of the same model and type (the caller
    /// checks that: the bytes carry no layout); then `n` positions are live. On error the
    /// cache stays empty (rows may have been written, but nothing reads past `len`).
    pub fn read_live(&mut self, n: usize, r: &mut dyn std::io::Read) -> Result<()> {
        if self.len != 0 || n > self.capacity {
            return Err(ModelError::BadConfig(format!(
                "reading {n} positions needs an empty cache holding them; this one holds {} of {}",
                self.len, self.capacity
            )));
        }
        let (n_runs, stride, hd) = (self.n_layer * self.n_head_kv, self.stride, self.head_dim);
        for store in [&mut self.k, &mut self.v] {
            store
                .read_runs(r, n_runs, stride, n, hd)
                .map_err(ModelError::KvIo)?;
        }
        self.len = n;
        // The writer may have given back rows older than its window (they were written as
        // zeros): counted as given back here too, and released from memory again.
        self.release_out_of_window();
        Ok(())
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

#[cfg(test)]
mod kv_file_tests {
    use super::*;
    use crate::{Activation, Architecture};

    fn cfg() -> ModelConfig {
        ModelConfig {
            arch: Architecture::Llama,
            name: "tiny".to_string(),
            n_vocab: 32,
            n_embd: 32,
            n_layer: 3,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 8,
            n_ff: 64,
            n_ctx_train: 256,
            n_rot: 8,
            rope_base: 10_000.0,
            rms_eps: 1e-5,
            embedding_scale: 1.0,
            attention_scale: 0.125,
            activation: Activation::Silu,
            sliding_window: None,
            rope_factors: None,
        }
    }

    /// A cache with `n` live positions of distinct values.
    fn filled(cache: &mut KvCache, n: usize) {
        let c = cfg();
        for layer in 0..c.n_layer {
            for h in 0..c.n_head_kv {
                let keys: Vec<f32> = (0..n * c.head_dim)
                    .map(|i| (layer * 1000 + h * 100) as f32 + i as f32 * 0.37 - 7.0)
                    .collect();
                let values: Vec<f32> = keys.iter().map(|x| -x * 1.5 + 0.25).collect();
                cache
                    .write_head_rows(layer, h, 0, &keys, &values)
                    .expect("rows fit");
            }
        }
        cache.commit(n).expect("room");
    }

    fn same_rows(a: &KvCache, b: &KvCache, n: usize) {
        let c = cfg();
        for layer in 0..c.n_layer {
            for h in 0..c.n_head_kv {
                match (a.head(layer, h, n), b.head(layer, h, n)) {
                    (KvRows::F32 { keys, values }, KvRows::F32 { keys: k, values: v }) => {
                        let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(keys), bits(k));
                        assert_eq!(bits(values), bits(v));
                    }
                    (KvRows::F16 { keys, values }, KvRows::F16 { keys: k, values: v }) => {
                        let bits = |s: &[f16]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(keys), bits(k));
                        assert_eq!(bits(values), bits(v));
                    }
                    (
                        KvRows::Int8 {
                            keys,
                            key_scales,
                            values,
                            value_scales,
                        },
                        KvRows::Int8 {
                            keys: k,
                            key_scales: ks,
                            values: v,
                            value_scales: vs,
                        },
                    ) => {
                        let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!((keys, values), (k, v));
                        assert_eq!(bits(key_scales), bits(ks));
                        assert_eq!(bits(value_scales), bits(vs));
                    }
                    _ => panic!("different KV types"),
                }
            }
        }
    }

    #[test]
    fn kv_file_round_trip_every_type_and_layout() {
        let c = cfg();
        let n = 13;
        for kind in KvType::ALL {
            let sources = [
                KvCache::new(&c, 16, kind),
                KvCache::with_reserve(&c, 16, 128, kind),
            ];
            for mut src in sources {
                filled(&mut src, n);
                let mut bytes = Vec::new();
                src.write_live(&mut bytes).expect("write to memory");
                assert_eq!(bytes.len(), src.used_bytes(), "{kind}");
                let destinations = [
                    KvCache::new(&c, n, kind),
                    KvCache::new(&c, 64, kind),
                    KvCache::with_reserve(&c, 32, 200, kind),
                ];
                for mut dst in destinations {
                    dst.read_live(n, &mut bytes.as_slice()).expect("read back");
                    assert_eq!(dst.len(), n);
                    same_rows(&src, &dst, n);
                    let mut again = Vec::new();
                    dst.write_live(&mut again).expect("write to memory");
                    assert_eq!(again, bytes, "{kind}: rewritten bytes differ");
                }
            }
        }
    }

    #[test]
    fn kv_file_truncated_input_is_an_error_and_leaves_the_cache_empty() {
        let c = cfg();
        for kind in KvType::ALL {
            let mut src = KvCache::new(&c, 16, kind);
            filled(&mut src, 10);
            let mut bytes = Vec::new();
            src.write_live(&mut bytes).expect("write to memory");
            for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
                let mut dst = KvCache::new(&c, 16, kind);
                let err = dst
                    .read_live(10, &mut &bytes[..cut])
                    .expect_err("truncated input");
                assert!(matches!(err, ModelError::KvIo(_)), "{err}");
                assert_eq!(dst.len(), 0);
            }
        }
    }

    #[test]
    fn kv_file_read_needs_an_empty_cache_with_room() {
        let c = cfg();
        let mut src = KvCache::new(&c, 16, KvType::F32);
        filled(&mut src, 10);
        let mut bytes = Vec::new();
        src.write_live(&mut bytes).expect("write to memory");
        let mut small = KvCache::new(&c, 8, KvType::F32);
        assert!(small.read_live(10, &mut bytes.as_slice()).is_err());
        let mut busy = KvCache::new(&c, 16, KvType::F32);
        filled(&mut busy, 1);
        assert!(busy.read_live(10, &mut bytes.as_slice()).is_err());
        assert_eq!(busy.len(), 1);
    }

    #[test]
    fn kv_file_portable_bytes_match_the_fast_path() {
        let xs: Vec<f32> = (0..70_000).map(|i| i as f32 * -0.5 + 3.0).collect();
        let (mut fast, mut portable) = (Vec::new(), Vec::new());
        write_le(&mut fast, &xs).expect("write");
        write_le_portable(&mut portable, &xs).expect("write");
        assert_eq!(fast, portable);
        let expected: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(fast, expected);
        let mut back = vec![0f32; xs.len()];
        read_le_portable(&mut fast.as_slice(), &mut back).expect("read");
        assert_eq!(back, xs);
        let hs: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
        let (mut fast, mut portable) = (Vec::new(), Vec::new());
        write_le(&mut fast, &hs).expect("write");
        write_le_portable(&mut portable, &hs).expect("write");
        assert_eq!(fast, portable);
        let qs: Vec<i8> = (0..300).map(|i| (i % 256) as u8 as i8).collect();
        let (mut fast, mut portable) = (Vec::new(), Vec::new());
        write_le(&mut fast, &qs).expect("write");
        write_le_portable(&mut portable, &qs).expect("write");
        assert_eq!(fast, portable);
        let mut back = vec![0i8; qs.len()];
        read_le(&mut fast.as_slice(), &mut back).expect("read");
        assert_eq!(back, qs);
    }
}
