//! AVX2 W4A8 kernel (AVX-512 machines use it too: at 4 bits decode is bound by memory,
//! not by the width of the multiply).
//!
//! A group's 16 bytes unpack into 32 unsigned nibbles, which `vpmaddubsw` multiplies
//! with the signed activations directly (pairs stay within ±2·15·127, far from
//! saturating) and `vpmaddwd` widens to i32; the minimum's term takes the token's
//! precomputed `Σ a`. Up to four tokens share each unpacked group.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{PackedI4, GROUP, GROUP_BYTES};
use crate::int8::QuantizedView;
use crate::matmul::x86::hsum256;

/// Tokens that share one unpacking of a weight group.
const TOKENS_PER_TILE: usize = 4;

/// # Safety
/// The CPU has AVX2 and FMA; `out` points to `m * w.n` floats and no other thread writes
/// the columns in `rows`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemm_rows_avx2(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    rows: Range<usize>,
) {
    let m = a.m;
    let mut i = 0;
    while i < m {
        let tokens = (m - i).min(TOKENS_PER_TILE);
        for col in rows.clone() {
            match tokens {
                4 => tile::<4>(a, w, out, i, col),
                3 => tile::<3>(a, w, out, i, col),
                2 => tile::<2>(a, w, out, i, col),
                _ => tile::<1>(a, w, out, i, col),
            }
        }
        i += tokens;
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const MR: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    i0: usize,
    col: usize,
) {
    let n_groups = w.n_groups();
    let low_nibbles = _mm_set1_epi8(0x0F);
    let ones_i16 = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); MR];
    let mut min_terms = [0.0f32; MR];
    let w_row = w.data.as_ptr().add(col * n_groups * GROUP_BYTES);
    let scale_row = w.scales.as_ptr().add(col * n_groups);
    let min_row = w.mins.as_ptr().add(col * n_groups);
    let a_base = a.data.as_ptr().add(i0 * a.k_pad);
    for g in 0..n_groups {
        let packed = _mm_loadu_si128(w_row.add(g * GROUP_BYTES).cast());
        let lo = _mm_and_si128(packed, low_nibbles);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), low_nibbles);
        let nibbles = _mm256_set_m128i(hi, lo);
        let (scale, min) = (*scale_row.add(g), *min_row.add(g));
        for (t, (acc_t, min_t)) in acc.iter_mut().zip(&mut min_terms).enumerate() {
            let x = _mm256_loadu_si256(a_base.add(t * a.k_pad + g * GROUP).cast());
            let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles, x), ones_i16);
            let at = (i0 + t) * n_groups + g;
            let a_scale = *a.scales.get_unchecked(at);
            *acc_t = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(dot),
                _mm256_set1_ps(scale * a_scale),
                *acc_t,
            );
            *min_t += *a.block_sums.get_unchecked(at) as f32 * (min * a_scale);
        }
    }
    for (t, (acc_t, min_t)) in acc.iter().zip(&min_terms).enumerate() {
        *out.add((i0 + t) * w.n + col) = hsum256(*acc_t) + min_t;
    }
}
