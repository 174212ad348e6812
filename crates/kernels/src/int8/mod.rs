//! W8A8 matrix multiplication: INT8 weights (symmetric, per output channel) times INT8
//! activations (symmetric, per token, quantised at run time), integer dot products,
//! float scales applied once per output.
//!
//! Weights are packed once at load as `[n / 16][k / 4][16][4]`: one 64-byte vector holds
//! four consecutive `k` of sixteen output rows, which is exactly what AVX-512 VNNI's
//! `vpdpbusd` consumes (and two AVX2 halves of it). Every ISA variant computes the same
//! exact integer sums, so all of them agree with the scalar oracle bit for bit.

mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::isa::{self, Isa};
use std::ops::Range;

use crate::threadpool::{SharedSlice, ThreadPool};
use crate::COLUMN_ALIGN;

/// Output rows per packed block.
pub const ROWS_PER_BLOCK: usize = 16;
/// `k` values per packed group (one 32-bit lane of `vpdpbusd`).
pub const K_PER_GROUP: usize = 4;

/// INT8 weights `[n, k]` in the packed layout, with per-row scales.
#[derive(Debug, Clone)]
pub struct PackedI8 {
    pub n: usize,
    pub k: usize,
    /// `k` rounded up to a whole group; the padding is zero.
    pub k_pad: usize,
    /// `[n_pad / 16][k_pad / 4][16][4]`.
    pub data: Vec<i8>,
    /// Dequantisation scale per output row: `w ≈ q * scale`. `[n_pad]`
    pub scales: Vec<f32>,
    /// `Σ_k q[row][k]` per row, to undo the +128 offset VNNI needs on activations. `[n_pad]`
    pub row_sums: Vec<i32>,
}

impl PackedI8 {
    /// Quantises a row-major f32 matrix `[n, k]` to INT8, one scale per row.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w must be [n, k]");
        let k_pad = k.div_ceil(K_PER_GROUP) * K_PER_GROUP;
        let n_pad = n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
        let mut data = vec![0i8; n_pad * k_pad];
        let mut scales = vec![0.0f32; n_pad];
        let mut row_sums = vec![0i32; n_pad];
        let mut q_row = vec![0i8; k];
        for row in 0..n {
            scales[row] = quantize_row(&w[row * k..(row + 1) * k], &mut q_row);
            row_sums[row] = q_row.iter().map(|&q| i32::from(q)).sum();
            for (kk, &q) in q_row.iter().enumerate() {
                data[packed_index(row, kk, k_pad)] = q;
            }
        }
        Self {
            n,
            k,
            k_pad,
            data,
            scales,
            row_sums,
        }
    }

    /// The weight as the kernels see it, back in f32 (tests and diagnostics).
    pub fn dequantize_row(&self, row: usize) -> Vec<f32> {
        (0..self.k)
            .map(|kk| f32::from(self.data[packed_index(row, kk, self.k_pad)]) * self.scales[row])
            .collect()
    }

    pub fn bytes(&self) -> usize {
        self.data.len() + 8 * self.scales.len()
    }
}

/// Position of `w[row][kk]` in the packed layout.
#[inline]
pub fn packed_index(row: usize, kk: usize, k_pad: usize) -> usize {
    let block = row / ROWS_PER_BLOCK;
    let group = kk / K_PER_GROUP;
    ((block * (k_pad / K_PER_GROUP) + group) * ROWS_PER_BLOCK + row % ROWS_PER_BLOCK) * K_PER_GROUP
        + kk % K_PER_GROUP
}

/// Symmetric INT8 quantisation of one row into `[-127, 127]` (never -128, so the AVX2
/// sign trick cannot overflow). Returns the scale; an all-zero row gets scale 0.
pub fn quantize_row(x: &[f32], out: &mut [i8]) -> f32 {
    quantize_row_excluding(x, &[], out)
}

/// As [`quantize_row`], with the `excluded` channels (ascending) left out of the scale and
/// quantised to zero: how the outlier channels computed in float are split off.
pub fn quantize_row_excluding(x: &[f32], excluded: &[usize], out: &mut [i8]) -> f32 {
    debug_assert!(out.len() >= x.len());
    let mut max = 0.0f32;
    let mut from = 0;
    for &c in excluded.iter().chain(std::iter::once(&x.len())) {
        max = x[from..c].iter().fold(max, |m, v| m.max(v.abs()));
        from = c + 1;
    }
    if max == 0.0 || !max.is_finite() {
        out[..x.len()].fill(0);
        return 0.0;
    }
    let inv = 127.0 / max;
    for (o, &v) in out.iter_mut().zip(x) {
        // Round half away from zero by truncating `v ± 0.5`: `f32::round` is a libm call
        // on baseline x86-64, and this runs for every activation of every token.
        let scaled = (v * inv).clamp(-127.0, 127.0);
        *o = (scaled + 0.5f32.copysign(scaled)) as i8;
    }
    for &c in excluded {
        out[c] = 0;
    }
    max / 127.0
}

/// `Σ q` of each [`SUM_GROUP`] of a quantised row.
pub fn sum_groups(q: &[i8], sums: &mut [i32]) {
    for (sum, g) in sums.iter_mut().zip(q.chunks(SUM_GROUP)) {
        *sum = g.iter().map(|&v| i32::from(v)).sum();
    }
}

/// Width of the groups [`QuantizedRows::group_sums`] sums over (the W4A8 group).
pub const SUM_GROUP: usize = 32;

/// Activations quantised per row, `k` padded with zeros to the weights' `k_pad`.
#[derive(Debug, Default, Clone)]
pub struct QuantizedRows {
    pub data: Vec<i8>,    // [m, k_pad]
    pub scales: Vec<f32>, // [m]
    /// `Σ q` of each row per [`SUM_GROUP`] values, `[m, ceil(k_pad / 32)]`: once per token
    /// here rather than once per weight row in the W4A8 kernel, which needs it for its
    /// groups' minimums.
    pub group_sums: Vec<i32>,
    pub k_pad: usize,
}

impl QuantizedRows {
    /// Quantises `x` (`[m, k]`) in place of whatever this buffer held.
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize, k_pad: usize) {
        debug_assert_eq!(x.len(), m * k);
        let n_sums = k_pad.div_ceil(SUM_GROUP);
        self.data.clear();
        self.data.resize(m * k_pad, 0);
        self.scales.clear();
        self.group_sums.clear();
        self.group_sums.resize(m * n_sums, 0);
        self.k_pad = k_pad;
        for row in 0..m {
            let q = &mut self.data[row * k_pad..(row + 1) * k_pad];
            self.scales
                .push(quantize_row(&x[row * k..(row + 1) * k], &mut q[..k]));
            sum_groups(q, &mut self.group_sums[row * n_sums..(row + 1) * n_sums]);
        }
    }

    pub fn view(&self) -> QuantizedView<'_> {
        QuantizedView {
            data: &self.data,
            scales: &self.scales,
            group_sums: &self.group_sums,
            k_pad: self.k_pad,
        }
    }
}

/// Quantised activations as the kernels read them. Borrowed, so the threads of a region
/// can fill one shared buffer row by row and then all read it.
#[derive(Debug, Clone, Copy)]
pub struct QuantizedView<'a> {
    pub data: &'a [i8],    // [m, k_pad]
    pub scales: &'a [f32], // [m]
    pub group_sums: &'a [i32],
    pub k_pad: usize,
}

impl QuantizedView<'_> {
    pub fn m(&self) -> usize {
        self.scales.len()
    }
}

/// `out[m, n] = dequant(a) · dequant(w)ᵀ` with the active ISA.
pub fn gemm_i8(pool: &ThreadPool, a: &QuantizedView<'_>, w: &PackedI8, out: &mut [f32]) {
    gemm_i8_with(isa::active(), pool, a, w, out)
}

/// As [`gemm_i8`] with an explicit ISA (tests compare every ISA against scalar).
pub fn gemm_i8_with(
    isa: Isa,
    pool: &ThreadPool,
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: &mut [f32],
) {
    let out = SharedSlice::new(out);
    pool.run_team(&|team| {
        // SAFETY: the team's column splits are disjoint; `out` is not read until the end.
        unsafe { gemm_i8_cols(isa, a, w, &out, team.split(w.n, COLUMN_ALIGN)) }
    });
}

/// Computes output columns `cols` of every row: the part of a [`gemm_i8`] one thread of a
/// region does. `cols` starts on a multiple of [`COLUMN_ALIGN`].
///
/// # Safety
/// No other thread accesses these columns of `out` until the next barrier.
pub unsafe fn gemm_i8_cols(
    isa: Isa,
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: &SharedSlice<'_, f32>,
    cols: Range<usize>,
) {
    let m = a.m();
    assert_eq!(a.k_pad, w.k_pad, "activations and weights disagree on k");
    assert!(
        w.k_pad.is_multiple_of(K_PER_GROUP) && w.k <= w.k_pad,
        "k_pad must cover k in whole groups"
    );
    let n_pad = w.n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
    // The kernels load whole 16-row blocks and 4-byte activation groups unchecked.
    assert_eq!(
        Some(w.data.len()),
        n_pad.checked_mul(w.k_pad),
        "packed weights must be [n_pad, k_pad]"
    );
    assert!(
        w.scales.len() >= n_pad && w.row_sums.len() >= n_pad,
        "scales and row sums cover n_pad"
    );
    assert!(
        a.data.len() >= m * a.k_pad,
        "activations must be [m, k_pad]"
    );
    assert_eq!(Some(out.len()), m.checked_mul(w.n), "out must be [m, n]");
    assert!(
        (cols.is_empty() || cols.start.is_multiple_of(ROWS_PER_BLOCK)) && cols.end <= w.n,
        "columns must start on a block"
    );
    assert!(
        isa <= Isa::detect(),
        "{isa} kernels requested on a CPU without them"
    );
    let blocks = cols.start / ROWS_PER_BLOCK..cols.end.div_ceil(ROWS_PER_BLOCK);
    let out = out.as_mut_ptr();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` is only selected when the CPU has AVX-512 (VNNI checked inside).
        Isa::Avx512 if x86::has_vnni() => x86::gemm_blocks_vnni(a, w, out, blocks),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2 for `Isa::Avx512` too, and selects `Isa::Avx2`
        // only when present.
        Isa::Avx512 | Isa::Avx2 => x86::gemm_blocks_avx2(a, w, out, blocks),
        _ => reference::gemm_blocks_scalar(a, w, out, blocks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{random, RAGGED_GEMM_SHAPES};

    #[test]
    fn every_isa_matches_scalar_exactly_on_ragged_shapes() {
        let pool = ThreadPool::new(2).unwrap();
        for (m, k, n) in RAGGED_GEMM_SHAPES {
            let w = PackedI8::quantize(&random(n * k, 2), n, k);
            let mut a = QuantizedRows::default();
            a.quantize(&random(m * k, 1), m, k, w.k_pad);
            let mut expected = vec![0.0; m * n];
            gemm_i8_with(Isa::Scalar, &pool, &a.view(), &w, &mut expected);
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; m * n];
                gemm_i8_with(isa, &pool, &a.view(), &w, &mut got);
                assert_eq!(got, expected, "{isa} m={m} k={k} n={n}");
            }
        }
    }

    #[test]
    fn empty_inner_dimension_gives_zeros() {
        let pool = ThreadPool::new(2).unwrap();
        let w = PackedI8::quantize(&[], 5, 0);
        let mut a = QuantizedRows::default();
        a.quantize(&[], 3, 0, w.k_pad);
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; 15];
            gemm_i8_with(isa, &pool, &a.view(), &w, &mut out);
            assert!(out.iter().all(|&v| v == 0.0), "{isa}");
        }
    }

    #[test]
    fn int8_product_approximates_f32() {
        let (m, k, n) = (3, 256, 20);
        let (x, wf) = (random(m * k, 3), random(n * k, 4));
        let w = PackedI8::quantize(&wf, n, k);
        let mut a = QuantizedRows::default();
        a.quantize(&x, m, k, w.k_pad);
        let mut got = vec![0.0; m * n];
        gemm_i8(&ThreadPool::new(1).unwrap(), &a.view(), &w, &mut got);
        let mut want = vec![0.0; m * n];
        crate::matmul::matmul_scalar(&x, &wf, &mut want, m, k, n);
        for (g, e) in got.iter().zip(&want) {
            // Two 8-bit roundings of values in [-1, 1] over k = 256 terms.
            assert!((g - e).abs() < 0.1, "{g} vs {e}");
        }
    }

    #[test]
    fn quantize_row_is_symmetric_and_handles_zero() {
        let mut q = [0i8; 4];
        let s = quantize_row(&[1.0, -2.0, 0.5, 2.0], &mut q);
        assert_eq!(q, [64, -127, 32, 127]);
        assert!((s - 2.0 / 127.0).abs() < 1e-7);
        assert_eq!(quantize_row(&[0.0; 4], &mut q), 0.0);
        assert_eq!(q, [0; 4]);
    }

    #[test]
    fn excluded_channels_leave_the_scale_and_quantise_to_zero() {
        let mut q = [0i8; 5];
        let s = quantize_row_excluding(&[1.0, 300.0, -2.0, 0.5, -900.0], &[1, 4], &mut q);
        assert_eq!(q, [64, 0, -127, 32, 0]);
        assert!((s - 2.0 / 127.0).abs() < 1e-7);
        let mut sums = [0; 1];
        sum_groups(&q, &mut sums);
        assert_eq!(sums, [64 - 127 + 32]);
    }

    #[test]
    fn packing_round_trips() {
        let (n, k) = (19, 10);
        let wf = random(n * k, 5);
        let w = PackedI8::quantize(&wf, n, k);
        for row in 0..n {
            for (got, want) in w
                .dequantize_row(row)
                .iter()
                .zip(&wf[row * k..(row + 1) * k])
            {
                assert!((got - want).abs() <= w.scales[row] / 2.0 + 1e-6);
            }
        }
    }
}
