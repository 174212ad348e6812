//! One input channel's part of a packed product, `out[i] += v · w[i][kk]`, in f32: how the
//! per-token outlier channels of a file's own precision, left out of the integer product,
//! are multiplied. Each token has up to eight such channels at every product, so at a
//! decoding batch of eight the scalar form (an index and a scale lookup per weight) took
//! half of SmolLM2's step; this walks a block's codes eight rows at a time instead, with
//! the same float operations in the same order, so its sums equal the scalar ones bit for
//! bit.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::int8::ROWS_PER_BLOCK;

/// How a format's codes become weights: `code · scale (+ min)`.
#[derive(Clone, Copy)]
pub(crate) enum Codes {
    /// Signed bytes (INT8).
    Signed,
    /// Unsigned codes less `zero` (INT4 with 0, INT6 with its zero point).
    Unsigned { zero: i32 },
}

/// Rows one 256-bit vector holds.
const HALF: usize = ROWS_PER_BLOCK / 2;

/// `out[i] += v · w[cols.start + i][kk]`, where `half(block, h)` gives rows
/// `16 · block + 8 · h ..` of the packed matrix as codes (row `r`'s four `k` in 32-bit
/// lane `r`, `kk`'s at byte `j`), with their scales and minimums.
///
/// # Safety
/// The CPU has AVX2; the caller's entry point enables it, and `half` reads inside the
/// matrix for every row block `cols` touches (its padding rows included).
#[inline(always)]
pub(crate) unsafe fn add_column_avx2(
    j: usize,
    codes: Codes,
    v: f32,
    out: &mut [f32],
    cols: Range<usize>,
    half: impl Fn(usize, usize) -> (__m256i, __m256, Option<__m256>),
) {
    debug_assert!(j < 4 && out.len() == cols.len());
    let v8 = _mm256_set1_ps(v);
    let mut row = cols.start;
    while row < cols.end {
        let first = row - row % HALF;
        let end = (first + HALF).min(cols.end);
        let (packed, scale, min) = half(first / ROWS_PER_BLOCK, first % ROWS_PER_BLOCK / HALF);
        let code = match codes {
            Codes::Signed => _mm256_sra_epi32(
                _mm256_sll_epi32(packed, _mm_cvtsi32_si128(24 - 8 * j as i32)),
                _mm_cvtsi32_si128(24),
            ),
            Codes::Unsigned { zero } => _mm256_sub_epi32(
                _mm256_and_si256(
                    _mm256_srl_epi32(packed, _mm_cvtsi32_si128(8 * j as i32)),
                    _mm256_set1_epi32(0xFF),
                ),
                _mm256_set1_epi32(zero),
            ),
        };
        let mut w = _mm256_mul_ps(_mm256_cvtepi32_ps(code), scale);
        if let Some(min) = min {
            w = _mm256_add_ps(w, min);
        }
        let dst = &mut out[row - cols.start..end - cols.start];
        if dst.len() == HALF {
            let sum = _mm256_add_ps(_mm256_loadu_ps(dst.as_ptr()), _mm256_mul_ps(v8, w));
            _mm256_storeu_ps(dst.as_mut_ptr(), sum);
        } else {
            let mut weights = [0.0f32; HALF];
            _mm256_storeu_ps(weights.as_mut_ptr(), w);
            for (o, w) in dst.iter_mut().zip(&weights[row - first..]) {
                *o += v * w;
            }
        }
        row = end;
    }
}

#[cfg(test)]
mod tests {
    use crate::int4::PackedI4;
    use crate::int6::PackedI6;
    use crate::int8::PackedI8;
    use crate::isa::Isa;
    use crate::test_support::{random, MinimumI8, PackedGemm, SubBlockI8, SuperGroupI4};

    /// Each format's `add_column` on every ISA against the scalar `v · weight(row, kk)`, bit
    /// for bit, over column ranges that start and end inside a half block and on every
    /// channel of a group.
    fn agrees_with_weights<P: PackedGemm>(
        weight: impl Fn(&P, usize, usize) -> f32,
        add_column: impl Fn(&P, Isa, usize, f32, &mut [f32], std::ops::Range<usize>),
    ) {
        let (n, k) = (53, 70);
        let w = P::pack(&random(n * k, 3), n, k);
        for isa in Isa::available() {
            for cols in [0..n, 0..16, 3..50, 16..53, 8..9, 40..48, 52..53] {
                for kk in [0, 1, 2, 3, 33, 69] {
                    let v = 0.37 - kk as f32 * 0.01;
                    let start: Vec<f32> = cols.clone().map(|c| c as f32 * 0.25).collect();
                    let mut got = start.clone();
                    add_column(&w, isa, kk, v, &mut got, cols.clone());
                    let expected: Vec<f32> = start
                        .iter()
                        .zip(cols.clone())
                        .map(|(s, row)| s + v * weight(&w, row, kk))
                        .collect();
                    let (got, expected) = (bits(&got), bits(&expected));
                    assert_eq!(got, expected, "{isa} cols {cols:?} kk {kk}");
                }
            }
        }
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn int8_columns_match_the_weights() {
        agrees_with_weights::<PackedI8>(PackedI8::weight, PackedI8::add_column_with);
        agrees_with_weights::<SubBlockI8>(
            |w, r, c| w.0.weight(r, c),
            |w, i, c, v, o, r| w.0.add_column_with(i, c, v, o, r),
        );
        agrees_with_weights::<MinimumI8>(
            |w, r, c| w.0.weight(r, c),
            |w, i, c, v, o, r| w.0.add_column_with(i, c, v, o, r),
        );
    }

    #[test]
    fn int4_columns_match_the_weights() {
        agrees_with_weights::<PackedI4>(PackedI4::weight, PackedI4::add_column_with);
        agrees_with_weights::<SuperGroupI4>(
            |w, r, c| w.0.weight(r, c),
            |w, i, c, v, o, r| w.0.add_column_with(i, c, v, o, r),
        );
    }

    #[test]
    fn int6_columns_match_the_weights() {
        agrees_with_weights::<PackedI6>(PackedI6::weight, PackedI6::add_column_with);
    }
}
