//! The INT8 projections' outlier side product: the few calibrated channels kept out of
//! the quantised matmul and multiplied in f16 beside it. Its scalar oracle sits beside the
//! AVX2 and AVX-512 tilings, which agree with it bit for bit.

use std::ops::Range;

use half::f16;

use crate::isa::{self, Isa};
use crate::threadpool::SharedSlice;

/// The outlier channels' side product: `out[r][j] += Σ_o x[r][o] · w[o][j]` for every row
/// `r` of `x` (`[m, n_o]`) and the columns `cols` of `w` (`[n_o, n_out]`, f16: decode
/// reads all of it every token) and of `out` (`[m, n_out]`).
///
/// Each output adds its channels in ascending order, each with a multiply and an add, so
/// its value depends on nothing but its own row, whatever the batch or the tiling; the
/// vector version tiles four rows by sixteen columns so a widened weight serves four
/// tokens, and agrees with the scalar one bit for bit.
///
/// # Safety
/// No other thread accesses these columns of `out` until the next barrier.
pub unsafe fn outlier_product_cols(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: &SharedSlice<'_, f32>,
    n_out: usize,
    cols: Range<usize>,
) {
    outlier_product_cols_with(isa::active(), x, n_o, w, out, n_out, cols)
}

/// As [`outlier_product_cols`] with an explicit ISA (tests compare every ISA against scalar).
///
/// # Safety
/// As [`outlier_product_cols`].
pub unsafe fn outlier_product_cols_with(
    isa: Isa,
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: &SharedSlice<'_, f32>,
    n_out: usize,
    cols: Range<usize>,
) {
    if n_o == 0 || cols.is_empty() {
        return;
    }
    let m = x.len() / n_o;
    assert!(
        x.len() == m * n_o && Some(w.len()) == n_o.checked_mul(n_out),
        "x must be [m, n_o] and w [n_o, n_out]"
    );
    assert!(
        Some(out.len()) == m.checked_mul(n_out) && cols.end <= n_out,
        "out must be [m, n_out] and cols within it"
    );
    isa.assert_supported();
    let out = out.as_mut_ptr();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F,
        // AVX2 and F16C; shapes checked above.
        Isa::Amx | Isa::Avx512 => outlier_product_avx512(x, n_o, w, out, n_out, cols),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2 and F16C for `Isa::Avx2`; shapes checked above.
        Isa::Avx2 | Isa::AvxVnni => outlier_product_avx2(x, n_o, w, out, n_out, cols),
        _ => outlier_product_scalar(x, n_o, w, out, n_out, cols),
    }
}

/// # Safety
/// Shapes as [`outlier_product_cols_with`] checks; `out` points to `[m, n_out]` floats.
#[inline(always)]
unsafe fn outlier_product_scalar(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    cols: Range<usize>,
) {
    for (r, x_r) in x.chunks_exact(n_o).enumerate() {
        let row = std::slice::from_raw_parts_mut(out.add(r * n_out + cols.start), cols.len());
        for (&x_ro, w_o) in x_r.iter().zip(w.chunks_exact(n_out)) {
            for (y, w_oj) in row.iter_mut().zip(&w_o[cols.clone()]) {
                *y += x_ro * w_oj.to_f32();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn outlier_product_avx2(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    cols: Range<usize>,
) {
    let m = x.len() / n_o;
    let whole = cols.start + cols.len() / 16 * 16;
    let mut r = 0;
    while r < m {
        let rows = (m - r).min(4);
        for j in (cols.start..whole).step_by(16) {
            match rows {
                4 => outlier_tile::<4>(x, n_o, w, out, n_out, r, j),
                3 => outlier_tile::<3>(x, n_o, w, out, n_out, r, j),
                2 => outlier_tile::<2>(x, n_o, w, out, n_out, r, j),
                _ => outlier_tile::<1>(x, n_o, w, out, n_out, r, j),
            }
        }
        r += rows;
    }
    outlier_product_scalar(x, n_o, w, out, n_out, whole..cols.end);
}

/// As [`outlier_product_avx2`], in tiles of up to eight rows by 32 columns; the columns
/// past the last whole 32 take the AVX2 path. Each output is the same chain in the same
/// order on every path.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn outlier_product_avx512(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    cols: Range<usize>,
) {
    let m = x.len() / n_o;
    let whole = cols.start + cols.len() / 32 * 32;
    let mut r = 0;
    while r < m {
        let rows = (m - r).min(8);
        for j in (cols.start..whole).step_by(32) {
            match rows {
                8 => outlier_tile_wide::<8>(x, n_o, w, out, n_out, r, j),
                7 => outlier_tile_wide::<7>(x, n_o, w, out, n_out, r, j),
                6 => outlier_tile_wide::<6>(x, n_o, w, out, n_out, r, j),
                5 => outlier_tile_wide::<5>(x, n_o, w, out, n_out, r, j),
                4 => outlier_tile_wide::<4>(x, n_o, w, out, n_out, r, j),
                3 => outlier_tile_wide::<3>(x, n_o, w, out, n_out, r, j),
                2 => outlier_tile_wide::<2>(x, n_o, w, out, n_out, r, j),
                _ => outlier_tile_wide::<1>(x, n_o, w, out, n_out, r, j),
            }
        }
        r += rows;
    }
    outlier_product_avx2(x, n_o, w, out, n_out, whole..cols.end);
}

/// Rows `r0..r0 + MR` by columns `j0..j0 + 32`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn outlier_tile_wide<const MR: usize>(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    r0: usize,
    j0: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for (r, acc_r) in acc.iter_mut().enumerate() {
        for (h, a) in acc_r.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(out.add((r0 + r) * n_out + j0 + 16 * h));
        }
    }
    for o in 0..n_o {
        let w_o = w.as_ptr().add(o * n_out + j0);
        let wv = [
            _mm512_cvtph_ps(_mm256_loadu_si256(w_o.cast())),
            _mm512_cvtph_ps(_mm256_loadu_si256(w_o.add(16).cast())),
        ];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let xv = _mm512_set1_ps(*x.get_unchecked((r0 + r) * n_o + o));
            for (a, wh) in acc_r.iter_mut().zip(wv) {
                // Multiply then add, not fused: the scalar oracle's two roundings.
                *a = _mm512_add_ps(*a, _mm512_mul_ps(xv, wh));
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (h, a) in acc_r.iter().enumerate() {
            _mm512_storeu_ps(out.add((r0 + r) * n_out + j0 + 16 * h), *a);
        }
    }
}

/// Rows `r0..r0 + MR` by columns `j0..j0 + 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn outlier_tile<const MR: usize>(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    r0: usize,
    j0: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for (r, acc_r) in acc.iter_mut().enumerate() {
        for (h, a) in acc_r.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(out.add((r0 + r) * n_out + j0 + 8 * h));
        }
    }
    for o in 0..n_o {
        let w_o = w.as_ptr().add(o * n_out + j0);
        let wv = [
            _mm256_cvtph_ps(_mm_loadu_si128(w_o.cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(w_o.add(8).cast())),
        ];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let xv = _mm256_set1_ps(*x.get_unchecked((r0 + r) * n_o + o));
            for (a, wh) in acc_r.iter_mut().zip(wv) {
                // Multiply then add, not fused: the scalar oracle's two roundings.
                *a = _mm256_add_ps(*a, _mm256_mul_ps(xv, wh));
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (h, a) in acc_r.iter().enumerate() {
            _mm256_storeu_ps(out.add((r0 + r) * n_out + j0 + 8 * h), *a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outlier_product_matches_scalar_and_each_row_alone() {
        // (outlier channels, outputs, rows): a partial tile of each width, and on the wide
        // path a full one, a partial one and a tail past the last 32 columns.
        for (n_o, n_out, m) in [(5, 45, 6), (3, 100, 11)] {
            let w: Vec<f16> = (0..n_o * n_out)
                .map(|i| f16::from_f32((i as f32 * 0.37).sin()))
                .collect();
            let x: Vec<f32> = (0..m * n_o)
                .map(|i| (i as f32 * 0.11).cos() * 3.0)
                .collect();
            let start: Vec<f32> = (0..m * n_out).map(|i| (i as f32 * 0.05).sin()).collect();
            let run = |isa, x: &[f32], start: &[f32], cols: Range<usize>| {
                let mut out = start.to_vec();
                let shared = SharedSlice::new(&mut out);
                // SAFETY: one thread owns every column.
                unsafe { outlier_product_cols_with(isa, x, n_o, &w, &shared, n_out, cols) };
                out
            };
            for cols in [0..n_out, 16..n_out, 3..7] {
                let expected = run(Isa::Scalar, &x, &start, cols.clone());
                let last = m - 1;
                for isa in Isa::available() {
                    let got = run(isa, &x, &start, cols.clone());
                    assert_eq!(got, expected, "{isa} {cols:?}");
                    // The last row alone (a batch of one) gets exactly its values in the batch.
                    let alone = run(isa, &x[last * n_o..], &start[last * n_out..], cols.clone());
                    assert_eq!(alone, got[last * n_out..], "{isa} {cols:?}");
                }
                let untouched = (0..n_out).filter(|j| !cols.contains(j));
                assert!(untouched.into_iter().all(|j| expected[j] == start[j]));
            }
        }
    }
}
