//! AVX2, AVX-VNNI and AVX-512 VNNI W6A8 kernels: each group's codes rebuilt from its
//! nibbles and high-bit plane, multiplied as unsigned bytes by signed activations, the
//! zero point taken out per scale group with the activations' sum. The two 256-bit forms
//! are one tile, generic over [`ByteDot`].

use std::arch::x86_64::*;
use std::ops::Range;

use super::{PackedI6, PLANE_BYTES};
use crate::byte_dot::{entry_points_256, ByteDot};
use crate::column::{add_column_avx2 as add_column, Codes};
use crate::int4::x86::split_nibbles;
use crate::int4::GROUP_BYTES as NIBBLE_BYTES;
use crate::int8::x86::{
    for_each_pair_tile, for_each_tile, load_a4, pair_tile, prefetch_ahead, row_tile,
    store_block_row, store_tile,
};
use crate::int8::{QuantizedView, BLOCK_K, GROUPS_PER_BLOCK, K_PER_GROUP, ROWS_PER_BLOCK};

/// Bytes of one 16-row block's codes per `k`: nibbles and the plane.
const BYTES_PER_K: usize = ROWS_PER_BLOCK * 3 / 4;

/// `Σ x` of `len` (16 or 32) activation bytes, by `psadbw` on the bytes offset to unsigned.
///
/// # Safety
/// The CPU has SSE2; `x` points to `len` readable bytes.
#[target_feature(enable = "sse2")]
#[inline]
unsafe fn sum_bytes(x: *const i8, len: usize) -> i32 {
    let sign = _mm_set1_epi8(i8::MIN);
    let mut total = 0i64;
    for at in (0..len).step_by(16) {
        let v = _mm_xor_si128(_mm_loadu_si128(x.add(at).cast()), sign);
        let sad = _mm_sad_epu8(v, _mm_setzero_si128());
        total += _mm_cvtsi128_si64(sad) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(sad, sad));
    }
    (total - 128 * len as i64) as i32
}

/// Each row's `Σ a` over scale group `s` (of `G` packed groups) for rows `row0..row0 + MR`.
///
/// # Safety
/// As [`sum_bytes`], with the rows and group inside `a`.
#[inline(always)]
unsafe fn group_sums<const MR: usize, const G: usize>(
    a: &QuantizedView<'_>,
    row0: usize,
    s: usize,
) -> [i32; MR] {
    std::array::from_fn(|r| {
        let at = (row0 + r) * a.k_pad + s * G * K_PER_GROUP;
        sum_bytes(a.data.as_ptr().add(at), G * K_PER_GROUP)
    })
}

/// # Safety
/// The CPU has AVX-512 F/BW and VNNI; `out` points to `m * w.n` floats and no other thread
/// writes the columns of `blocks`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn gemm_blocks_vnni(
    a: &QuantizedView<'_>,
    w: &PackedI6,
    out: *mut f32,
    blocks: Range<usize>,
) {
    let per_16 = w.scales.group_k() != BLOCK_K;
    for_each_pair_tile(a.m, blocks, BYTES_PER_K * w.k_pad, |rows, row, b, pair| {
        if per_16 {
            vnni_tiles::<{ GROUPS_PER_BLOCK / 2 }>(a, w, out, rows, row, b, pair)
        } else {
            vnni_tiles::<GROUPS_PER_BLOCK>(a, w, out, rows, row, b, pair)
        }
    });
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn vnni_tiles<const G: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI6,
    out: *mut f32,
    rows: usize,
    row: usize,
    b: usize,
    pair: bool,
) {
    pair_tile!(tile_vnni[G], rows, pair, a, w, out, row, b)
}

/// The 64 codes of packed group `group` (counted over the whole matrix's groups).
///
/// # Safety
/// The CPU has AVX-512 F/BW; `group` is inside the matrix.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn codes_512(w: &PackedI6, group: usize) -> __m512i {
    let [lo, hi] = split_nibbles(_mm256_loadu_si256(
        w.nibbles.as_ptr().add(group * NIBBLE_BYTES).cast(),
    ));
    let low = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
    let plane = _mm512_broadcast_i32x4(_mm_loadu_si128(
        w.high.as_ptr().add(group * PLANE_BYTES).cast(),
    ));
    // Lane `i` of the broadcast plane holds positions 16i..16i + 16 at bits 2i, 2i + 1.
    let shifts = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
    let bits = _mm512_and_si512(_mm512_srlv_epi32(plane, shifts), _mm512_set1_epi8(3));
    _mm512_or_si512(low, _mm512_slli_epi32::<4>(bits))
}

/// `G` is the packed groups of four `k` per scale: four (sub-blocks of 16) or eight.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn tile_vnni<const MR: usize, const NB: usize, const G: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI6,
    out: *mut f32,
    row0: usize,
    block0: usize,
) {
    let (n_groups, n_blocks) = (w.k_pad / K_PER_GROUP, w.k_pad / BLOCK_K);
    let zero = i32::from(w.zero);
    let mut acc = [[_mm512_setzero_ps(); NB]; MR];
    for s in 0..w.scales.groups() {
        let kb = s * G / GROUPS_PER_BLOCK;
        if row0 == 0 && (s * G).is_multiple_of(GROUPS_PER_BLOCK) {
            prefetch_ahead::<NB, _>(&w.nibbles, w.k_pad, NIBBLE_BYTES, block0, kb);
            prefetch_ahead::<NB, _>(&w.high, w.k_pad, PLANE_BYTES, block0, kb);
        }
        let a_sums = group_sums::<MR, G>(a, row0, s);
        let mut dots = [[_mm512_setzero_si512(); NB]; MR];
        for g in s * G..(s + 1) * G {
            let mut wv = [_mm512_setzero_si512(); NB];
            for (j, v) in wv.iter_mut().enumerate() {
                *v = codes_512(w, (block0 + j) * n_groups + g);
            }
            for (r, dots_r) in dots.iter_mut().enumerate() {
                let av = _mm512_set1_epi32(load_a4(a, row0 + r, g));
                for (d, wv_j) in dots_r.iter_mut().zip(&wv) {
                    *d = _mm512_dpbusd_epi32(*d, *wv_j, av);
                }
            }
        }
        for j in 0..NB {
            let w_scale = w.scales.load16_avx512(block0 + j, s);
            for (r, (acc_r, dots_r)) in acc.iter_mut().zip(&dots).enumerate() {
                let a_scale = *a.scales.get_unchecked((row0 + r) * n_blocks + kb);
                let isum = _mm512_sub_epi32(dots_r[j], _mm512_set1_epi32(zero * a_sums[r]));
                acc_r[j] = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(isum),
                    _mm512_mul_ps(w_scale, _mm512_set1_ps(a_scale)),
                    acc_r[j],
                );
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (j, acc_rj) in acc_r.iter().enumerate() {
            store_block_row(out, w.n, row0 + r, block0 + j, *acc_rj);
        }
    }
}

entry_points_256!(PackedI6, |w| BYTES_PER_K * w.k_pad);

/// The tile of `rows` activation rows, inlined into the entry point of `D`'s ISA.
#[inline(always)]
unsafe fn tiles_256<D: ByteDot>(
    a: &QuantizedView<'_>,
    w: &PackedI6,
    out: *mut f32,
    rows: usize,
    row: usize,
    b: usize,
) {
    if w.scales.group_k() == BLOCK_K {
        row_tile!(tile_256[D][GROUPS_PER_BLOCK], rows, a, w, out, row, b)
    } else {
        row_tile!(
            tile_256[D][{ GROUPS_PER_BLOCK / 2 }],
            rows,
            a,
            w,
            out,
            row,
            b
        )
    }
}

/// A group's codes as rows 0–7 and 8–15 (positions 0–31 and 32–63).
///
/// # Safety
/// The CPU has AVX2; `group` is inside the matrix.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn codes_256(w: &PackedI6, group: usize) -> [__m256i; 2] {
    let [lo, hi] = split_nibbles(_mm256_loadu_si256(
        w.nibbles.as_ptr().add(group * NIBBLE_BYTES).cast(),
    ));
    let plane = _mm256_broadcastsi128_si256(_mm_loadu_si128(
        w.high.as_ptr().add(group * PLANE_BYTES).cast(),
    ));
    [
        lift(lo, plane, _mm256_set_epi32(2, 2, 2, 2, 0, 0, 0, 0)),
        lift(hi, plane, _mm256_set_epi32(6, 6, 6, 6, 4, 4, 4, 4)),
    ]
}

/// `half`'s nibbles with the plane's two bits (shifted right by `shifts` per 32 bits)
/// above them.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn lift(half: __m256i, plane: __m256i, shifts: __m256i) -> __m256i {
    let bits = _mm256_and_si256(_mm256_srlv_epi32(plane, shifts), _mm256_set1_epi8(3));
    _mm256_or_si256(half, _mm256_slli_epi32::<4>(bits))
}

/// `G` as in [`tile_vnni`]. Codes times activations are at most 2 · 63 · 128 per pair and
/// group, so AVX2's 16-bit pair sums take runs of two groups.
#[inline(always)]
unsafe fn tile_256<D: ByteDot, const MR: usize, const G: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI6,
    out: *mut f32,
    row0: usize,
    block: usize,
) {
    let (n_groups, n_blocks) = (w.k_pad / K_PER_GROUP, w.k_pad / BLOCK_K);
    let zero = i32::from(w.zero);
    let run_groups = D::run_groups(2 * 63 * 128, G);
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for s in 0..w.scales.groups() {
        let kb = s * G / GROUPS_PER_BLOCK;
        if row0 == 0 && (s * G).is_multiple_of(GROUPS_PER_BLOCK) {
            prefetch_ahead::<1, _>(&w.nibbles, w.k_pad, NIBBLE_BYTES, block, kb);
            prefetch_ahead::<1, _>(&w.high, w.k_pad, PLANE_BYTES, block, kb);
        }
        let a_sums = group_sums::<MR, G>(a, row0, s);
        let mut dots = [[_mm256_setzero_si256(); 2]; MR];
        for run in (s * G..(s + 1) * G).step_by(run_groups) {
            let mut runs = [[D::begin(_mm256_setzero_si256()); 2]; MR];
            for (runs_r, dots_r) in runs.iter_mut().zip(&dots) {
                for (p, d) in runs_r.iter_mut().zip(dots_r) {
                    *p = D::begin(*d);
                }
            }
            for g in run..run + run_groups {
                let halves = codes_256(w, block * n_groups + g);
                for (r, runs_r) in runs.iter_mut().enumerate() {
                    let av = _mm256_set1_epi32(load_a4(a, row0 + r, g));
                    for (p, codes) in runs_r.iter_mut().zip(halves) {
                        *p = D::add(*p, codes, av);
                    }
                }
            }
            for (dots_r, runs_r) in dots.iter_mut().zip(runs) {
                for (d, p) in dots_r.iter_mut().zip(runs_r) {
                    *d = D::end(*d, p);
                }
            }
        }
        let w_scale = w.scales.load16_avx2(block, s);
        for (r, (acc_r, dots_r)) in acc.iter_mut().zip(&dots).enumerate() {
            let a_scale = _mm256_set1_ps(*a.scales.get_unchecked((row0 + r) * n_blocks + kb));
            let offset = _mm256_set1_epi32(zero * a_sums[r]);
            for ((acc_rh, d), ws) in acc_r.iter_mut().zip(dots_r).zip(w_scale) {
                *acc_rh = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(*d, offset)),
                    _mm256_mul_ps(ws, a_scale),
                    *acc_rh,
                );
            }
        }
    }
    store_tile(&acc, out, w.n, row0, block);
}

/// [`PackedI6::add_column`] eight rows at a time.
///
/// # Safety
/// The CPU has AVX2 and F16C; `kk < w.k` and `cols` is inside `0..w.n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn add_column_avx2(
    w: &PackedI6,
    kk: usize,
    v: f32,
    out: &mut [f32],
    cols: Range<usize>,
) {
    let (group, s) = (kk / K_PER_GROUP, kk / w.scales.group_k());
    let n_groups = w.k_pad / K_PER_GROUP;
    let codes = Codes::Unsigned {
        zero: i32::from(w.zero),
    };
    add_column(kk % K_PER_GROUP, codes, v, out, cols, |block, h| {
        let halves = codes_256(w, block * n_groups + group);
        (halves[h], w.scales.load16_avx2(block, s)[h], None)
    })
}
