//! AVX2, AVX-VNNI and AVX-512 VNNI W4A8 kernels.
//!
//! A group's 32 bytes give rows 0–7 (low nibbles) and 8–15 (high nibbles) of four `k`.
//!
//! AVX2 and AVX-VNNI (one tile, generic over [`ByteDot`]): `vpmaddubsw` or `vpdpbusd`
//! multiplies them with four broadcast activations of a token. AVX2's pair sums are at
//! most 2·15·127, so a whole block of eight groups adds up in 16-bit lanes (≤ 30,480) and
//! widens once per block with `vpmaddwd`. Up to four tokens share each unpacked group.
//!
//! VNNI: the two halves side by side are the sixteen rows × four `k` that one `vpdpbusd`
//! multiplies, unsigned nibbles by signed activations, into 32-bit sums (no offset, unlike
//! INT8, whose weights are signed). It takes two weight blocks by up to four tokens, as the
//! INT8 VNNI kernel does. A single token is bound by memory either way, but a batch or a
//! prefill is bound by the multiply: against the AVX2 kernel on the same host (2 threads,
//! Sapphire Rapids), SmolLM2's batch-8 decode went from 693–702 to 895–921 tokens/s and
//! its pp512 from 963–1,021 to 1,612–1,632, Qwen2.5-0.5B's from 208–212 to 262–279 and
//! from 336–351 to 576–606.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{PackedI4, GROUP, GROUP_BYTES};
use crate::byte_dot::{entry_points_256, ByteDot};
use crate::column::{add_column_avx2 as add_column, Codes};
use crate::int8::x86::{
    for_each_pair_tile, for_each_tile, load_a4, pair_tile, prefetch_ahead, store_block_row,
    store_tile,
};
use crate::int8::{QuantizedView, GROUPS_PER_BLOCK, K_PER_GROUP, ROWS_PER_BLOCK};

/// A packed group's rows 0–7 (its low nibbles) and 8–15 (its high nibbles) as bytes.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn split_nibbles(packed: __m256i) -> [__m256i; 2] {
    let low_nibbles = _mm256_set1_epi8(0x0F);
    [
        _mm256_and_si256(packed, low_nibbles),
        _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low_nibbles),
    ]
}

entry_points_256!(PackedI4, |w| ROWS_PER_BLOCK * w.k_pad / 2);

/// The tile of `rows` activation rows, inlined into the entry point of `D`'s ISA.
#[inline(always)]
unsafe fn tiles_256<D: ByteDot>(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    rows: usize,
    row: usize,
    b: usize,
) {
    match rows {
        4 => tile_256::<D, 4>(a, w, out, row, b),
        3 => tile_256::<D, 3>(a, w, out, row, b),
        2 => tile_256::<D, 2>(a, w, out, row, b),
        _ => tile_256::<D, 1>(a, w, out, row, b),
    }
}

/// Nibbles times activations: at most 2 · 15 · 128 per pair and group, so a whole block
/// is one run even in AVX2's 16-bit pair sums.
#[inline(always)]
unsafe fn tile_256<D: ByteDot, const MR: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    row0: usize,
    block: usize,
) {
    let (n_groups, n_blocks) = (w.k_pad / K_PER_GROUP, w.n_groups());
    let run_groups = D::run_groups(2 * 15 * 128, GROUPS_PER_BLOCK);
    // [row][half]: rows 0-7 and 8-15 of the block.
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    let w_base = w.data.as_ptr().add(block * n_groups * GROUP_BYTES);
    for kb in 0..n_blocks {
        if row0 == 0 {
            prefetch_ahead::<1, _>(&w.data, w.k_pad, GROUP_BYTES, block, kb);
        }
        let mut dots = [[_mm256_setzero_si256(); 2]; MR];
        let groups = kb * GROUPS_PER_BLOCK..(kb + 1) * GROUPS_PER_BLOCK;
        for run in groups.step_by(run_groups) {
            let mut runs = [[D::begin(_mm256_setzero_si256()); 2]; MR];
            for (runs_r, dots_r) in runs.iter_mut().zip(&dots) {
                for (p, d) in runs_r.iter_mut().zip(dots_r) {
                    *p = D::begin(*d);
                }
            }
            for g in run..run + run_groups {
                let halves = split_nibbles(_mm256_loadu_si256(w_base.add(g * GROUP_BYTES).cast()));
                for (r, runs_r) in runs.iter_mut().enumerate() {
                    let av = _mm256_set1_epi32(load_a4(a, row0 + r, g));
                    for (p, nibbles) in runs_r.iter_mut().zip(halves) {
                        *p = D::add(*p, nibbles, av);
                    }
                }
            }
            for (dots_r, runs_r) in dots.iter_mut().zip(runs) {
                for (d, p) in dots_r.iter_mut().zip(runs_r) {
                    *d = D::end(*d, p);
                }
            }
        }
        let (w_scale, w_min) = (
            w.scales.load16_avx2(block, kb),
            w.mins.load16_avx2(block, kb),
        );
        for (r, (acc_r, dots_r)) in acc.iter_mut().zip(&dots).enumerate() {
            let at = (row0 + r) * n_blocks + kb;
            let a_scale = *a.scales.get_unchecked(at);
            let a_sum = _mm256_set1_ps(*a.block_sums.get_unchecked(at) as f32 * a_scale);
            let a_scale = _mm256_set1_ps(a_scale);
            for h in 0..2 {
                let dot = _mm256_cvtepi32_ps(dots_r[h]);
                let scaled = _mm256_fmadd_ps(dot, _mm256_mul_ps(w_scale[h], a_scale), acc_r[h]);
                acc_r[h] = _mm256_fmadd_ps(w_min[h], a_sum, scaled);
            }
        }
    }
    store_tile(&acc, out, w.n, row0, block);
}

/// # Safety
/// The CPU has AVX-512 F/BW and VNNI; `out` points to `m * w.n` floats and no other thread
/// writes the columns of `blocks`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn gemm_blocks_vnni(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    blocks: Range<usize>,
) {
    for_each_pair_tile(
        a.m,
        blocks,
        ROWS_PER_BLOCK * w.k_pad / 2,
        |rows, row, b, pair| pair_tile!(tile_vnni[], rows, pair, a, w, out, row, b),
    );
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn tile_vnni<const MR: usize, const NB: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    row0: usize,
    block0: usize,
) {
    let (n_groups, n_blocks) = (w.k_pad / K_PER_GROUP, w.n_groups());
    let mut acc = [[_mm512_setzero_ps(); NB]; MR];
    let w_base = w.data.as_ptr();
    for kb in 0..n_blocks {
        if row0 == 0 {
            prefetch_ahead::<NB, _>(&w.data, w.k_pad, GROUP_BYTES, block0, kb);
        }
        let mut dots = [[_mm512_setzero_si512(); NB]; MR];
        for g in kb * GROUPS_PER_BLOCK..(kb + 1) * GROUPS_PER_BLOCK {
            let mut wv = [_mm512_setzero_si512(); NB];
            for (j, v) in wv.iter_mut().enumerate() {
                let packed = _mm256_loadu_si256(
                    w_base
                        .add(((block0 + j) * n_groups + g) * GROUP_BYTES)
                        .cast(),
                );
                let [lo, hi] = split_nibbles(packed);
                *v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            }
            for (r, dots_r) in dots.iter_mut().enumerate() {
                let av = _mm512_set1_epi32(load_a4(a, row0 + r, g));
                for (d, wv_j) in dots_r.iter_mut().zip(&wv) {
                    *d = _mm512_dpbusd_epi32(*d, *wv_j, av);
                }
            }
        }
        for j in 0..NB {
            let w_scale = w.scales.load16_avx512(block0 + j, kb);
            let w_min = w.mins.load16_avx512(block0 + j, kb);
            for (r, (acc_r, dots_r)) in acc.iter_mut().zip(&dots).enumerate() {
                let at = (row0 + r) * n_blocks + kb;
                let a_scale = *a.scales.get_unchecked(at);
                let a_sum = _mm512_set1_ps(*a.block_sums.get_unchecked(at) as f32 * a_scale);
                let a_scale = _mm512_set1_ps(a_scale);
                let dot = _mm512_cvtepi32_ps(dots_r[j]);
                let scaled = _mm512_fmadd_ps(dot, _mm512_mul_ps(w_scale, a_scale), acc_r[j]);
                acc_r[j] = _mm512_fmadd_ps(w_min, a_sum, scaled);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (j, acc_rj) in acc_r.iter().enumerate() {
            store_block_row(out, w.n, row0 + r, block0 + j, *acc_rj);
        }
    }
}

/// [`PackedI4::add_column`] eight rows at a time.
///
/// # Safety
/// The CPU has AVX2 and F16C; `kk < w.k` and `cols` is inside `0..w.n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn add_column_avx2(
    w: &PackedI4,
    kk: usize,
    v: f32,
    out: &mut [f32],
    cols: Range<usize>,
) {
    let (group, s) = (kk / K_PER_GROUP, kk / GROUP);
    let n_groups = w.k_pad / K_PER_GROUP;
    let codes = Codes::Unsigned { zero: 0 };
    add_column(kk % K_PER_GROUP, codes, v, out, cols, |block, h| {
        let at = (block * n_groups + group) * GROUP_BYTES;
        let halves = split_nibbles(_mm256_loadu_si256(w.data.as_ptr().add(at).cast()));
        let (scale, min) = (w.scales.load16_avx2(block, s), w.mins.load16_avx2(block, s));
        (halves[h], scale[h], Some(min[h]))
    })
}
