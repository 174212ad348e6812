//! One tensor's storage (keys or values): rows of f32, f16 or INT8 with a scale each, in
//! (layer, head) runs, allocated as zeroed pages the kernel commits only when written, and
//! whose pages can be given back. What the cache's other concerns build on.

use half::f16;
use half::slice::HalfFloatSliceExt;
use pyramid_kernels::int8::quantize_row;

use super::KvType;

/// One of the two tensors (keys or values), `[n_layer][n_head_kv][capacity][head_dim]`.
#[derive(Debug, Clone)]
pub(super) enum Store {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// Values and one scale per row (`[n_layer][n_head_kv][capacity]`).
    Int8 {
        q: Vec<i8>,
        scales: Vec<f32>,
    },
}

/// Bytes one stored row (one position of one head) takes.
pub(super) fn row_bytes(kind: KvType, head_dim: usize) -> usize {
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

impl Store {
    /// Zeroed storage for `n_rows` rows, or `None` when the allocator refuses it.
    pub(super) fn try_new(kind: KvType, n_rows: usize, head_dim: usize) -> Option<Self> {
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
    pub(super) fn new(kind: KvType, n_rows: usize, head_dim: usize) -> Self {
        Self::try_new(kind, n_rows, head_dim).unwrap_or_else(|| {
            let bytes = n_rows.saturating_mul(row_bytes(kind, head_dim));
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(bytes, 8)
                    .unwrap_or(std::alloc::Layout::new::<u8>()),
            )
        })
    }

    /// Writes row `row` (of `head_dim` values).
    pub(super) fn put(&mut self, row: usize, x: &[f32]) {
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
    pub(super) fn copy_runs_into(
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
    pub(super) fn regrow(
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
    pub(super) fn release_rows(
        &mut self,
        r: usize,
        run: usize,
        rows: std::ops::Range<usize>,
        hd: usize,
    ) {
        let elems = (r * run + rows.start) * hd..(r * run + rows.end) * hd;
        match self {
            Store::F32(d) => release_pages(&mut d[elems]),
            Store::F16(d) => release_pages(&mut d[elems]),
            // The row scales are a 256th of the values: left committed.
            Store::Int8 { q, .. } => release_pages(&mut q[elems]),
        }
    }
}
