//! AVX-512 VNNI and AVX2 versions of the W8A8 kernel.
//!
//! VNNI: `vpdpbusd` multiplies unsigned by signed bytes, so activations are offset by +128
//! (an XOR of the sign bit) and `128 · Σ w` is subtracted at the end. AVX2 has no byte dot
//! product that cannot saturate on `u8 × i8`, so it moves the activation's sign onto the
//! weight (`vpsignb`) and multiplies `|a| · ±w`, whose pair sums stay below 2¹⁵.

use std::arch::x86_64::*;
use std::ops::Range;

use super::{PackedI8, QuantizedView, K_PER_GROUP, ROWS_PER_BLOCK};

pub(super) fn has_vnni() -> bool {
    is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw")
}

/// Bytes of one packed group of a block: 16 rows × 4 k.
const GROUP_BYTES: usize = ROWS_PER_BLOCK * K_PER_GROUP;

/// Weight bytes walked by all activation rows before moving on: half of a 1–2 MiB L2, so
/// a prefill streams each weight from memory once rather than once per 4-row tile.
const L2_CHUNK_BYTES: usize = 512 * 1024;

/// Splits `blocks` into runs whose packed weights fit in [`L2_CHUNK_BYTES`] (even-sized,
/// so VNNI's block pairs stay whole).
fn block_chunks(blocks: Range<usize>, k_pad: usize) -> impl Iterator<Item = Range<usize>> {
    let block_bytes = (ROWS_PER_BLOCK * k_pad).max(1);
    let per_chunk = (L2_CHUNK_BYTES / block_bytes).max(2) & !1;
    (blocks.start..blocks.end)
        .step_by(per_chunk)
        .map(move |start| start..(start + per_chunk).min(blocks.end))
}

#[inline(always)]
unsafe fn load_a4(a: &QuantizedView<'_>, row: usize, group: usize) -> i32 {
    // SAFETY (caller): `row < m` and `group < k_pad / 4`, so the 4 bytes are in bounds.
    std::ptr::read_unaligned(a.data.as_ptr().add(row * a.k_pad + group * K_PER_GROUP) as *const i32)
}

/// # Safety
/// The CPU has AVX-512 F/BW and VNNI; `out` points to `m * w.n` floats and no other thread
/// writes the columns of `blocks`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn gemm_blocks_vnni(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    blocks: Range<usize>,
) {
    let m = a.m();
    for chunk in block_chunks(blocks, w.k_pad) {
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(4);
            let mut b = chunk.start;
            while b < chunk.end {
                let pair = chunk.end - b >= 2;
                match (rows, pair) {
                    (4, true) => tile_vnni::<4, 2>(a, w, out, row, b),
                    (3, true) => tile_vnni::<3, 2>(a, w, out, row, b),
                    (2, true) => tile_vnni::<2, 2>(a, w, out, row, b),
                    (_, true) => tile_vnni::<1, 2>(a, w, out, row, b),
                    (4, false) => tile_vnni::<4, 1>(a, w, out, row, b),
                    (3, false) => tile_vnni::<3, 1>(a, w, out, row, b),
                    (2, false) => tile_vnni::<2, 1>(a, w, out, row, b),
                    (_, false) => tile_vnni::<1, 1>(a, w, out, row, b),
                }
                b += if pair { 2 } else { 1 };
            }
            row += rows;
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn tile_vnni<const MR: usize, const NB: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    row0: usize,
    block0: usize,
) {
    let n_groups = w.k_pad / K_PER_GROUP;
    let offset = _mm512_set1_epi32(0x8080_8080u32 as i32);
    let mut acc = [[_mm512_setzero_si512(); NB]; MR];
    let w_base = w.data.as_ptr();
    for g in 0..n_groups {
        let mut wv = [_mm512_setzero_si512(); NB];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(
                w_base.add(((block0 + j) * n_groups + g) * GROUP_BYTES) as *const _
            );
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let av = _mm512_xor_si512(_mm512_set1_epi32(load_a4(a, row0 + r, g)), offset);
            for (acc_rj, wv_j) in acc_r.iter_mut().zip(&wv) {
                *acc_rj = _mm512_dpbusd_epi32(*acc_rj, av, *wv_j);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let a_scale = _mm512_set1_ps(a.scales[row0 + r]);
        for (j, acc_rj) in acc_r.iter().enumerate() {
            let col0 = (block0 + j) * ROWS_PER_BLOCK;
            let sums = _mm512_loadu_si512(w.row_sums.as_ptr().add(col0) as *const _);
            let exact = _mm512_sub_epi32(*acc_rj, _mm512_slli_epi32(sums, 7));
            let scaled = _mm512_mul_ps(
                _mm512_mul_ps(_mm512_cvtepi32_ps(exact), a_scale),
                _mm512_loadu_ps(w.scales.as_ptr().add(col0)),
            );
            let valid = w.n.saturating_sub(col0).min(ROWS_PER_BLOCK);
            let mask: __mmask16 = ((1u32 << valid) - 1) as __mmask16;
            _mm512_mask_storeu_ps(out.add((row0 + r) * w.n + col0), mask, scaled);
        }
    }
}

/// # Safety
/// The CPU has AVX2; `out` points to `m * w.n` floats and no other thread writes the
/// columns of `blocks`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn gemm_blocks_avx2(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    blocks: Range<usize>,
) {
    let m = a.m();
    for chunk in block_chunks(blocks, w.k_pad) {
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(4);
            for b in chunk.clone() {
                match rows {
                    4 => tile_avx2::<4>(a, w, out, row, b),
                    3 => tile_avx2::<3>(a, w, out, row, b),
                    2 => tile_avx2::<2>(a, w, out, row, b),
                    _ => tile_avx2::<1>(a, w, out, row, b),
                }
            }
            row += rows;
        }
    }
}

#[target_feature(enable = "avx2")]
#[inline]
unsafe fn tile_avx2<const MR: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    row0: usize,
    block: usize,
) {
    let n_groups = w.k_pad / K_PER_GROUP;
    let ones = _mm256_set1_epi16(1);
    // [row][half]: rows 0-7 and 8-15 of the block.
    let mut acc = [[_mm256_setzero_si256(); 2]; MR];
    let w_base = w.data.as_ptr().add(block * n_groups * GROUP_BYTES);
    for g in 0..n_groups {
        let w_lo = _mm256_loadu_si256(w_base.add(g * GROUP_BYTES) as *const _);
        let w_hi = _mm256_loadu_si256(w_base.add(g * GROUP_BYTES + 32) as *const _);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let av = _mm256_set1_epi32(load_a4(a, row0 + r, g));
            let a_abs = _mm256_abs_epi8(av);
            for (acc_rh, wh) in acc_r.iter_mut().zip([w_lo, w_hi]) {
                let pairs = _mm256_maddubs_epi16(a_abs, _mm256_sign_epi8(wh, av));
                *acc_rh = _mm256_add_epi32(*acc_rh, _mm256_madd_epi16(pairs, ones));
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let a_scale = _mm256_set1_ps(a.scales[row0 + r]);
        for (h, acc_rh) in acc_r.iter().enumerate() {
            let col0 = block * ROWS_PER_BLOCK + h * 8;
            if col0 >= w.n {
                continue;
            }
            let scaled = _mm256_mul_ps(
                _mm256_mul_ps(_mm256_cvtepi32_ps(*acc_rh), a_scale),
                _mm256_loadu_ps(w.scales.as_ptr().add(col0)),
            );
            let valid = (w.n - col0).min(8);
            let dst = out.add((row0 + r) * w.n + col0);
            if valid == 8 {
                _mm256_storeu_ps(dst, scaled);
            } else {
                let mut tmp = [0.0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), scaled);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, valid);
            }
        }
    }
}
