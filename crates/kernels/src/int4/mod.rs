//! W4A8 matrix multiplication for decode, where reading weights is the bound: 4-bit
//! weights in groups of [`GROUP`] along `k`, each group with its own f32 scale and
//! minimum (`w ≈ q · scale + min`, `q` in 0..=15), times INT8 activations quantised per
//! token and block of 32 ([`QuantizedRows`](crate::int8::QuantizedRows)).
//!
//! Scale-and-minimum groups of 32 are what GGUF's Q4_1 and Q4_K blocks are, so a model
//! shipped in those re-packs almost losslessly; a symmetric 4-bit format would round them
//! a second time. The minimum costs one extra sum per group: `Σ a·w = scale·Σ a·q +
//! min·Σ a`, where `Σ a` comes once per token with the activations
//! ([`QuantizedRows::block_sums`](crate::int8::QuantizedRows::block_sums)). Weight groups
//! and activation blocks coincide, so each group's float term carries both scales.
//!
//! A weight row is stored as `[k_pad / 32][16]` bytes: byte `j` of a group holds element
//! `j` in its low nibble and element `j + 16` in its high nibble, so a group unpacks into
//! 32 bytes in `k` order with two masks and a shift. Integer sums are exact per group;
//! variants differ only in the order the per-group float terms are added.

mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::ops::Range;

use crate::int8::QuantizedView;
use crate::isa::{self, Isa};
use crate::threadpool::{SharedSlice, ThreadPool};
use crate::COLUMN_ALIGN;

/// Weights per scale and minimum.
pub const GROUP: usize = crate::int8::BLOCK_K;
/// Packed bytes per group.
pub const GROUP_BYTES: usize = GROUP / 2;

/// 4-bit weights `[n, k]` with one scale and minimum per group of 32 along `k`.
#[derive(Debug, Clone)]
pub struct PackedI4 {
    pub n: usize,
    pub k: usize,
    /// `k` rounded up to whole groups; the padding is zero.
    pub k_pad: usize,
    /// `[n][k_pad / 32][16]`
    pub data: Vec<u8>,
    /// `[n][k_pad / 32]`: `w ≈ nibble * scale + min`.
    pub scales: Vec<f32>,
    /// `[n][k_pad / 32]`
    pub mins: Vec<f32>,
}

impl PackedI4 {
    /// Quantises a row-major f32 matrix `[n, k]`: each group's range `min..=max` is cut
    /// into 15 steps.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w must be [n, k]");
        let k_pad = k.div_ceil(GROUP) * GROUP;
        let n_groups = k_pad / GROUP;
        let mut data = vec![0u8; n * n_groups * GROUP_BYTES];
        let mut scales = vec![0.0f32; n * n_groups];
        let mut mins = vec![0.0f32; n * n_groups];
        let mut group = [0.0f32; GROUP];
        for row in 0..n {
            for g in 0..n_groups {
                let start = g * GROUP;
                let end = (start + GROUP).min(k);
                let values = &w[row * k + start..row * k + end];
                let min = values.iter().copied().fold(f32::INFINITY, f32::min);
                let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let (min, scale) = if min.is_finite() && max > min {
                    (min, (max - min) / 15.0)
                } else {
                    (if min.is_finite() { min } else { 0.0 }, 0.0)
                };
                let inv = if scale == 0.0 { 0.0 } else { 1.0 / scale };
                group.fill(min); // padding: any value works, its activations are zero
                group[..values.len()].copy_from_slice(values);
                let nibble = |v: f32| ((v - min) * inv).round().clamp(0.0, 15.0) as u8;
                let bytes = &mut data[(row * n_groups + g) * GROUP_BYTES..][..GROUP_BYTES];
                for (j, b) in bytes.iter_mut().enumerate() {
                    *b = nibble(group[j]) | (nibble(group[j + GROUP_BYTES]) << 4);
                }
                scales[row * n_groups + g] = scale;
                mins[row * n_groups + g] = min;
            }
        }
        Self {
            n,
            k,
            k_pad,
            data,
            scales,
            mins,
        }
    }

    pub fn n_groups(&self) -> usize {
        self.k_pad / GROUP
    }

    /// The weight as the kernels see it, back in f32.
    pub fn dequantize_row(&self, row: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.k];
        self.dequantize_row_into(row, &mut out);
        out
    }

    /// As [`PackedI4::dequantize_row`], into `out` (`[k]`): a tied model's embeddings.
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        let n_groups = self.n_groups();
        for (kk, o) in out[..self.k].iter_mut().enumerate() {
            let (g, j) = (kk / GROUP, kk % GROUP);
            let byte = self.data[(row * n_groups + g) * GROUP_BYTES + j % GROUP_BYTES];
            let nibble = if j < GROUP_BYTES {
                byte & 0xF
            } else {
                byte >> 4
            };
            *o =
                f32::from(nibble) * self.scales[row * n_groups + g] + self.mins[row * n_groups + g];
        }
    }

    pub fn bytes(&self) -> usize {
        self.data.len() + 4 * (self.scales.len() + self.mins.len())
    }
}

/// `out[m, n] = dequant(a) · dequant(w)ᵀ` with the active ISA.
pub fn gemm_i4(pool: &ThreadPool, a: &QuantizedView<'_>, w: &PackedI4, out: &mut [f32]) {
    gemm_i4_with(isa::active(), pool, a, w, out)
}

/// As [`gemm_i4`] with an explicit ISA (tests compare every ISA against scalar).
pub fn gemm_i4_with(
    isa: Isa,
    pool: &ThreadPool,
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: &mut [f32],
) {
    let out = SharedSlice::new(out);
    pool.run_team(&|team| {
        // SAFETY: the team's column splits are disjoint; `out` is not read until the end.
        unsafe { gemm_i4_cols(isa, a, w, &out, team.split(w.n, COLUMN_ALIGN)) }
    });
}

/// Computes output columns `cols` of every row: the part of a [`gemm_i4`] one thread of a
/// region does.
///
/// # Safety
/// No other thread accesses these columns of `out` until the next barrier.
pub unsafe fn gemm_i4_cols(
    isa: Isa,
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: &SharedSlice<'_, f32>,
    cols: Range<usize>,
) {
    let m = a.m;
    assert_eq!(a.k_pad, w.k_pad, "activations and weights disagree on k");
    assert!(
        w.k_pad.is_multiple_of(GROUP) && w.k <= w.k_pad,
        "k_pad must cover k in whole groups"
    );
    // The kernels load whole groups unchecked.
    assert_eq!(
        Some(w.data.len()),
        w.n.checked_mul(w.k_pad / 2),
        "packed weights must be [n, k_pad / 2]"
    );
    assert!(
        w.scales.len() == w.n * w.n_groups() && w.mins.len() == w.scales.len(),
        "one scale and minimum per row and group"
    );
    assert!(
        a.data.len() >= m * a.k_pad,
        "activations must be [m, k_pad]"
    );
    assert!(
        a.block_sums.len() >= m * w.n_groups() && a.scales.len() >= m * w.n_groups(),
        "activations carry one scale and sum per group"
    );
    assert_eq!(Some(out.len()), m.checked_mul(w.n), "out must be [m, n]");
    assert!(cols.end <= w.n, "columns beyond the weights");
    assert!(
        isa <= Isa::detect(),
        "{isa} kernels requested on a CPU without them"
    );
    let out = out.as_mut_ptr();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2 for both `Isa::Avx2` and `Isa::Avx512`.
        Isa::Avx512 | Isa::Avx2 => x86::gemm_rows_avx2(a, w, out, cols),
        _ => reference::gemm_rows_scalar(a, w, out, cols),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::QuantizedRows;
    use crate::test_support::{random, RAGGED_GEMM_SHAPES};

    #[test]
    fn every_isa_matches_scalar_on_ragged_shapes() {
        let pool = ThreadPool::new(2).unwrap();
        for (m, k, n) in RAGGED_GEMM_SHAPES {
            let w = PackedI4::quantize(&random(n * k, 2), n, k);
            let mut a = QuantizedRows::default();
            a.quantize(&random(m * k, 1), m, k, w.k_pad);
            let mut expected = vec![0.0; m * n];
            gemm_i4_with(Isa::Scalar, &pool, &a.view(), &w, &mut expected);
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; m * n];
                gemm_i4_with(isa, &pool, &a.view(), &w, &mut got);
                for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                    // Exact group sums; only the order of k / 32 float terms differs.
                    assert!(
                        (g - e).abs() <= 1e-5 * (1.0 + e.abs()),
                        "{isa} m={m} k={k} n={n} at {i}: {g} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn product_equals_the_dequantised_operands_product() {
        let (m, k, n) = (3, 256, 20);
        let (x, wf) = (random(m * k, 3), random(n * k, 4));
        let w = PackedI4::quantize(&wf, n, k);
        let mut a = QuantizedRows::default();
        a.quantize(&x, m, k, w.k_pad);
        let mut got = vec![0.0; m * n];
        gemm_i4(&ThreadPool::new(1).unwrap(), &a.view(), &w, &mut got);
        for i in 0..m {
            for col in 0..n {
                let want: f64 = w
                    .dequantize_row(col)
                    .iter()
                    .zip(&a.data[i * w.k_pad..])
                    .enumerate()
                    .map(|(kk, (&wv, &q))| {
                        let a_scale = a.scales[i * w.n_groups() + kk / GROUP];
                        f64::from(wv) * f64::from(q) * f64::from(a_scale)
                    })
                    .sum();
                let g = f64::from(got[i * n + col]);
                assert!((g - want).abs() < 1e-4, "{g} vs {want}");
            }
        }
    }

    #[test]
    fn packing_round_trips_within_half_a_step() {
        let (n, k) = (5, 70);
        let wf = random(n * k, 5);
        let w = PackedI4::quantize(&wf, n, k);
        for row in 0..n {
            for (kk, (got, want)) in w
                .dequantize_row(row)
                .iter()
                .zip(&wf[row * k..(row + 1) * k])
                .enumerate()
            {
                let step = w.scales[row * w.n_groups() + kk / GROUP];
                assert!((got - want).abs() <= step / 2.0 + 1e-6, "{got} vs {want}");
            }
        }
    }

    #[test]
    fn a_grid_of_sixteen_levels_packs_exactly() {
        // What a Q4_1 block dequantises to: q·d + m with q spanning 0..=15.
        let (d, m) = (0.03125f32, -0.25f32);
        let wf: Vec<f32> = (0..64).map(|i| ((i * 7) % 16) as f32 * d + m).collect();
        let w = PackedI4::quantize(&wf, 1, 64);
        assert_eq!(w.dequantize_row(0), wf);
    }

    #[test]
    fn constant_group_and_empty_inner_dimension() {
        let pool = ThreadPool::new(2).unwrap();
        let w = PackedI4::quantize(&[0.5; 3 * 40], 3, 40);
        assert!(w.scales.iter().all(|&s| s == 0.0));
        assert!(w.dequantize_row(2).iter().all(|&v| v == 0.5));
        let empty = PackedI4::quantize(&[], 5, 0);
        let mut a = QuantizedRows::default();
        a.quantize(&[], 3, 0, empty.k_pad);
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; 15];
            gemm_i4_with(isa, &pool, &a.view(), &empty, &mut out);
            assert!(out.iter().all(|&v| v == 0.0), "{isa}");
        }
    }
}
