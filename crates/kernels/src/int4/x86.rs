//! AVX2 W4A8 kernel (AVX-512 machines use it too: at 4 bits decode is bound by memory,
//! not by the width of the multiply).
//!
//! A group's 32 bytes give rows 0–7 (low nibbles) and 8–15 (high nibbles) of four `k`;
//! `vpmaddubsw` multiplies them with four broadcast activations of a token. Its pair sums
//! are at most 2·15·127, so a whole block of eight groups adds up in 16-bit lanes
//! (≤ 30,480) and widens once per block with `vpmaddwd`. Up to four tokens share each
//! unpacked group.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{PackedI4, GROUP_BYTES};
use crate::int8::x86::{blocks_ahead, for_each_tile, load_a4, prefetch, store_tile};
use crate::int8::{QuantizedView, GROUPS_PER_BLOCK, K_PER_GROUP, ROWS_PER_BLOCK};

/// # Safety
/// The CPU has AVX2, FMA and F16C; `out` points to `m * w.n` floats and no other thread
/// writes the columns of `blocks`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm_blocks_avx2(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    blocks: Range<usize>,
) {
    for_each_tile(
        a.m,
        blocks,
        ROWS_PER_BLOCK * w.k_pad / 2,
        |rows, row, b| match rows {
            4 => tile::<4>(a, w, out, row, b),
            3 => tile::<3>(a, w, out, row, b),
            2 => tile::<2>(a, w, out, row, b),
            _ => tile::<1>(a, w, out, row, b),
        },
    );
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile<const MR: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    row0: usize,
    block: usize,
) {
    let (n_groups, n_blocks) = (w.k_pad / K_PER_GROUP, w.n_groups());
    let low_nibbles = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    // [row][half]: rows 0-7 and 8-15 of the block.
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    let w_base = w.data.as_ptr().add(block * n_groups * GROUP_BYTES);
    let scale_base = block * n_blocks * ROWS_PER_BLOCK;
    for kb in 0..n_blocks {
        if row0 == 0 {
            // As the INT8 kernels do (see `prefetch`).
            let (block, kb) = blocks_ahead(block, 1, kb, n_blocks);
            let from = (block * n_groups + kb * GROUPS_PER_BLOCK) * GROUP_BYTES;
            prefetch(&w.data, from, GROUPS_PER_BLOCK * GROUP_BYTES);
        }
        let mut pairs = [[_mm256_setzero_si256(); 2]; MR];
        for g in kb * GROUPS_PER_BLOCK..(kb + 1) * GROUPS_PER_BLOCK {
            let packed = _mm256_loadu_si256(w_base.add(g * GROUP_BYTES).cast());
            let lo = _mm256_and_si256(packed, low_nibbles);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low_nibbles);
            for (r, pairs_r) in pairs.iter_mut().enumerate() {
                let av = _mm256_set1_epi32(load_a4(a, row0 + r, g));
                for (p, nibbles) in pairs_r.iter_mut().zip([lo, hi]) {
                    *p = _mm256_add_epi16(*p, _mm256_maddubs_epi16(nibbles, av));
                }
            }
        }
        let at = scale_base + kb * ROWS_PER_BLOCK;
        let (scales, mins) = (w.scales.as_ptr().add(at), w.mins.as_ptr().add(at));
        let w_scale = [
            _mm256_cvtph_ps(_mm_loadu_si128(scales.cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(scales.add(8).cast())),
        ];
        let w_min = [
            _mm256_cvtph_ps(_mm_loadu_si128(mins.cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(mins.add(8).cast())),
        ];
        for (r, (acc_r, pairs_r)) in acc.iter_mut().zip(&pairs).enumerate() {
            let at = (row0 + r) * n_blocks + kb;
            let a_scale = *a.scales.get_unchecked(at);
            let a_sum = _mm256_set1_ps(*a.block_sums.get_unchecked(at) as f32 * a_scale);
            let a_scale = _mm256_set1_ps(a_scale);
            for h in 0..2 {
                let dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs_r[h], ones));
                let scaled = _mm256_fmadd_ps(dot, _mm256_mul_ps(w_scale[h], a_scale), acc_r[h]);
                acc_r[h] = _mm256_fmadd_ps(w_min[h], a_sum, scaled);
            }
        }
    }
    store_tile(&acc, out, w.n, row0, block);
}
