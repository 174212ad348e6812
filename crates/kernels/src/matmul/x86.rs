//! AVX-512 and AVX2 tiles for `out = a · wᵀ`.
//!
//! A tile computes `MR` activation rows against `NR` weight rows, keeping `MR × NR`
//! vector accumulators in registers (AVX-512: 4 × 4 of 32 zmm; AVX2: 4 × 2 of 16 ymm),
//! and reduces each accumulator horizontally once at the end. Weight loads widen to f32
//! through [`WeightElem`]; tails shorter than a vector run in scalar.

use std::arch::x86_64::*;
use std::ops::Range;

use super::WeightElem;

/// Walks a column block in tiles; `$tile::<R, C>` must exist for R in 1..=4, C in {NR, 1}.
macro_rules! driver {
    ($name:ident, $tile:ident, $feature:literal, $nr:literal) => {
        /// # Safety
        /// The CPU supports the enabled features; `out` points to `m * n` floats and no
        /// other thread writes columns in `cols`.
        #[target_feature(enable = $feature)]
        pub(super) unsafe fn $name<W: WeightElem>(
            a: &[f32],
            w: &[W],
            out: *mut f32,
            m: usize,
            k: usize,
            n: usize,
            cols: Range<usize>,
        ) {
            debug_assert!(a.len() == m * k && w.len() == n * k && cols.end <= n);
            let (a, w) = (a.as_ptr(), w.as_ptr());
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(4);
                let a_i = a.add(i * k);
                let mut j = cols.start;
                while j < cols.end {
                    let w_j = w.add(j * k);
                    let out_ij = out.add(i * n + j);
                    if cols.end - j >= $nr {
                        match rows {
                            4 => $tile::<W, 4, $nr>(a_i, w_j, k, out_ij, n),
                            3 => $tile::<W, 3, $nr>(a_i, w_j, k, out_ij, n),
                            2 => $tile::<W, 2, $nr>(a_i, w_j, k, out_ij, n),
                            _ => $tile::<W, 1, $nr>(a_i, w_j, k, out_ij, n),
                        }
                        j += $nr;
                    } else {
                        match rows {
                            4 => $tile::<W, 4, 1>(a_i, w_j, k, out_ij, n),
                            3 => $tile::<W, 3, 1>(a_i, w_j, k, out_ij, n),
                            2 => $tile::<W, 2, 1>(a_i, w_j, k, out_ij, n),
                            _ => $tile::<W, 1, 1>(a_i, w_j, k, out_ij, n),
                        }
                        j += 1;
                    }
                }
                i += rows;
            }
        }
    };
}

driver!(matmul_cols_avx512, tile_avx512, "avx512f,fma", 4);
driver!(matmul_cols_avx2, tile_avx2, "avx2,fma", 2);

#[target_feature(enable = "avx512f,fma")]
#[inline]
unsafe fn tile_avx512<W: WeightElem, const MR: usize, const NR: usize>(
    a: *const f32,
    w: *const W,
    k: usize,
    out: *mut f32,
    n: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); NR]; MR];
    let mut p = 0;
    while p + 16 <= k {
        let mut wv = [_mm512_setzero_ps(); NR];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = W::load16(w.add(j * k + p));
        }
        for (i, acc_i) in acc.iter_mut().enumerate() {
            let av = _mm512_loadu_ps(a.add(i * k + p));
            for (acc_ij, wv_j) in acc_i.iter_mut().zip(&wv) {
                *acc_ij = _mm512_fmadd_ps(av, *wv_j, *acc_ij);
            }
        }
        p += 16;
    }
    for (i, acc_i) in acc.iter().enumerate() {
        for (j, acc_ij) in acc_i.iter().enumerate() {
            *out.add(i * n + j) = _mm512_reduce_add_ps(*acc_ij) + tail(a, w, k, i, j, p);
        }
    }
}

/// The `k - p` products a vector loop left over, in scalar.
#[inline(always)]
unsafe fn tail<W: WeightElem>(
    a: *const f32,
    w: *const W,
    k: usize,
    i: usize,
    j: usize,
    p: usize,
) -> f32 {
    (p..k).fold(0.0, |sum, q| {
        sum + *a.add(i * k + q) * (*w.add(j * k + q)).to_f32()
    })
}

/// Sum of the eight lanes.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn hsum256(v: __m256) -> f32 {
    let sum4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
    let sum1 = _mm_add_ss(sum2, _mm_shuffle_ps(sum2, sum2, 1));
    _mm_cvtss_f32(sum1)
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_avx2<W: WeightElem, const MR: usize, const NR: usize>(
    a: *const f32,
    w: *const W,
    k: usize,
    out: *mut f32,
    n: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let mut p = 0;
    while p + 8 <= k {
        let mut wv = [_mm256_setzero_ps(); NR];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = W::load8(w.add(j * k + p));
        }
        for (i, acc_i) in acc.iter_mut().enumerate() {
            let av = _mm256_loadu_ps(a.add(i * k + p));
            for (acc_ij, wv_j) in acc_i.iter_mut().zip(&wv) {
                *acc_ij = _mm256_fmadd_ps(av, *wv_j, *acc_ij);
            }
        }
        p += 8;
    }
    for (i, acc_i) in acc.iter().enumerate() {
        for (j, acc_ij) in acc_i.iter().enumerate() {
            *out.add(i * n + j) = hsum256(*acc_ij) + tail(a, w, k, i, j, p);
        }
    }
}
