//! AVX-512 VNNI, AVX-VNNI and AVX2 versions of the W8A8 kernel. Each keeps a tile's
//! integer sums for one block of `k` in registers, then folds them into float
//! accumulators with the block's weight and activation scales.
//!
//! VNNI (either width): `vpdpbusd` multiplies unsigned by signed bytes, so activations are
//! offset by +128 (an XOR of the sign bit) and each block's sums start at `-128 · Σ w`.
//! AVX2 has no byte dot product that cannot saturate on `u8 × i8`, so it moves the
//! activation's sign onto the weight (`vpsignb`) and multiplies `|a| · ±w`, whose pair
//! sums stay below 2¹⁵. The 256-bit forms are one tile, generic over [`ByteDot`].

use std::arch::x86_64::*;
use std::ops::Range;

use crate::byte_dot::{entry_points_256, ByteDot};
use crate::column::{add_column_avx2 as add_column, Codes};

use super::{
    PackedI8, QuantizedView, Scaling, BLOCK_K, GROUPS_PER_BLOCK, K_PER_GROUP, ROWS_PER_BLOCK,
};

pub(crate) fn has_vnni() -> bool {
    is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw")
}

/// Blocks of activations [`quantize_activation_batch_avx512`] quantises in one call.
pub(super) const ACTIVATION_BATCH: usize = 16;

/// Bytes of one packed group of a block: 16 rows × 4 k.
pub(super) const GROUP_BYTES: usize = ROWS_PER_BLOCK * K_PER_GROUP;

/// Weight bytes walked by all activation rows before moving on: half of a 1–2 MiB L2, so
/// a prefill streams each weight from memory once rather than once per 4-row tile.
const L2_CHUNK_BYTES: usize = 512 * 1024;

/// Splits `blocks` (of `block_bytes` packed weights each) into runs that fit in
/// [`L2_CHUNK_BYTES`] (even-sized, so VNNI's block pairs stay whole).
pub(super) fn block_chunks(
    blocks: Range<usize>,
    block_bytes: usize,
) -> impl Iterator<Item = Range<usize>> {
    let per_chunk = (L2_CHUNK_BYTES / block_bytes.max(1)).max(2) & !1;
    (blocks.start..blocks.end)
        .step_by(per_chunk)
        .map(move |start| start..(start + per_chunk).min(blocks.end))
}

/// The four activation bytes of `row` in packed group `group`, as one lane.
#[inline(always)]
pub(crate) unsafe fn load_a4(a: &QuantizedView<'_>, row: usize, group: usize) -> i32 {
    // SAFETY (caller): `row < m` and `group < k_pad / 4`, so the 4 bytes are in bounds.
    std::ptr::read_unaligned(a.data.as_ptr().add(row * a.k_pad + group * K_PER_GROUP) as *const i32)
}

/// Asks for the `bytes` of `data` from byte `from` on (as far as `data` goes) to be
/// brought into L1, a cache line at a time.
///
/// A decoding batch reads every weight once, from L3 or memory, and each integer kernel
/// on its own has little of that in flight: an AMX tile load cannot start before the
/// multiply that reads its register ends, and the VNNI and AVX2 kernels walk one or two
/// streams a whole weight block apart. So while a kernel multiplies one scale block it
/// asks for the one [`PREFETCH_AHEAD`] blocks on ([`blocks_ahead`]). On a chain of
/// SmolLM2's products (2 threads, Sapphire Rapids) that took the weights read per second
/// from 25–26 to 27–28 G at one row (VNNI), from 19–21 to 22–23 G at eight (AMX), from
/// 7.3 to 11 G at eight on AVX2 and from 44 to 58–60 G on the INT4 kernel at one; on the
/// whole model, INT4 decode went from 210–220 to 314–322 tokens/s. Prefill, whose later
/// row passes find a chunk in L2, did not change.
#[inline(always)]
fn prefetch<T: Copy>(data: &[T], from: usize, bytes: usize) {
    let base = data.as_ptr().cast::<i8>();
    let end = std::mem::size_of_val(data).min(from.saturating_add(bytes));
    for line in (from..end).step_by(64) {
        // SAFETY: `line` is inside `data`; a prefetch reads nothing architecturally.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(line)) };
    }
}

/// Scale blocks of `k` the kernels ask for ahead of the one they multiply: of 2, 4, 8
/// and 16, the best on both models' shapes.
const PREFETCH_AHEAD: usize = 8;

/// The weight blocks (from the first, `nb` of them) and scale block a tile of `nb` blocks
/// from `block0` at scale block `kb` of `n_blocks` asks for: [`PREFETCH_AHEAD`] further on in
/// the same blocks, or at the start of the next tile's once they end.
#[inline(always)]
fn blocks_ahead(block0: usize, nb: usize, kb: usize, n_blocks: usize) -> (usize, usize) {
    let kb = kb + PREFETCH_AHEAD;
    if kb < n_blocks {
        (block0, kb)
    } else {
        (block0 + nb, kb - n_blocks)
    }
}

/// [`prefetch`] of the weights [`blocks_ahead`] names, for a tile of `NB` blocks from
/// `block0` at scale block `kb`, in the packed layout of either integer format: `data`
/// holds each 16-row block's groups of four `k` in turn, `group_bytes` apiece.
#[inline(always)]
pub(crate) fn prefetch_ahead<const NB: usize, T: Copy>(
    data: &[T],
    k_pad: usize,
    group_bytes: usize,
    block0: usize,
    kb: usize,
) {
    let n_groups = k_pad / K_PER_GROUP;
    let (first, kb) = blocks_ahead(block0, NB, kb, k_pad / BLOCK_K);
    for block in first..first + NB {
        let from = (block * n_groups + kb * GROUPS_PER_BLOCK) * group_bytes;
        prefetch(data, from, GROUPS_PER_BLOCK * group_bytes);
    }
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
    let split = w.scales.group_k() != BLOCK_K;
    for_each_pair_tile(
        a.m,
        blocks,
        ROWS_PER_BLOCK * w.k_pad,
        |rows, row, b, pair| {
            if split {
                vnni_tiles::<{ GROUPS_PER_BLOCK / 2 }>(a, w, out, rows, row, b, pair)
            } else {
                vnni_tiles::<GROUPS_PER_BLOCK>(a, w, out, rows, row, b, pair)
            }
        },
    );
}

/// One VNNI tile of `rows` activation rows and one or two (`pair`) weight blocks whose
/// scales cover `G` packed groups each.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn vnni_tiles<const G: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    rows: usize,
    row: usize,
    b: usize,
    pair: bool,
) {
    pair_tile!(tile_vnni[G], rows, pair, a, w, out, row, b)
}

/// Activation rows one VNNI tile multiplies: eight rows by two weight blocks keep sixteen
/// integer sums in registers, and each weight vector loaded serves eight `vpdpbusd`, so a
/// decoding batch of up to eight reads its weights from memory once.
pub(crate) const PASS_ROWS: usize = 8;

/// `$tile::<MR, NB, ...>($args)` for a pair tile of `$rows` activation rows (up to
/// [`PASS_ROWS`]) and two weight blocks, or one when `$pair` is false: the one match every
/// AVX-512 VNNI kernel dispatches its monomorphised tiles through. Extra const arguments
/// (`[G]`) follow `MR` and `NB`.
macro_rules! pair_tile {
    ($tile:ident [$($extra:tt)*], $rows:expr, $pair:expr, $($arg:expr),* $(,)?) => {
        match ($rows, $pair) {
            (8, true) => $tile::<8, 2 $(, $extra)*>($($arg),*),
            (7, true) => $tile::<7, 2 $(, $extra)*>($($arg),*),
            (6, true) => $tile::<6, 2 $(, $extra)*>($($arg),*),
            (5, true) => $tile::<5, 2 $(, $extra)*>($($arg),*),
            (4, true) => $tile::<4, 2 $(, $extra)*>($($arg),*),
            (3, true) => $tile::<3, 2 $(, $extra)*>($($arg),*),
            (2, true) => $tile::<2, 2 $(, $extra)*>($($arg),*),
            (_, true) => $tile::<1, 2 $(, $extra)*>($($arg),*),
            (8, false) => $tile::<8, 1 $(, $extra)*>($($arg),*),
            (7, false) => $tile::<7, 1 $(, $extra)*>($($arg),*),
            (6, false) => $tile::<6, 1 $(, $extra)*>($($arg),*),
            (5, false) => $tile::<5, 1 $(, $extra)*>($($arg),*),
            (4, false) => $tile::<4, 1 $(, $extra)*>($($arg),*),
            (3, false) => $tile::<3, 1 $(, $extra)*>($($arg),*),
            (2, false) => $tile::<2, 1 $(, $extra)*>($($arg),*),
            (_, false) => $tile::<1, 1 $(, $extra)*>($($arg),*),
        }
    };
}
pub(crate) use pair_tile;

/// Calls `tile(rows, row, block, pair)` for every tile of up to [`PASS_ROWS`] activation
/// rows and two 16-row weight blocks (one when `pair` is false: a chunk's odd last block),
/// a chunk of weights that fits in L2 at a time: the walk both AVX-512 VNNI kernels take.
#[inline(always)]
pub(crate) fn for_each_pair_tile(
    m: usize,
    blocks: Range<usize>,
    block_bytes: usize,
    mut tile: impl FnMut(usize, usize, usize, bool),
) {
    for chunk in block_chunks(blocks, block_bytes) {
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(PASS_ROWS);
            let mut b = chunk.start;
            while b < chunk.end {
                let pair = chunk.end - b >= 2;
                tile(rows, row, b, pair);
                b += if pair { 2 } else { 1 };
            }
            row += rows;
        }
    }
}

/// `G` is the packed groups of four `k` per weight scale: eight (a block of 32) or four
/// (a K-quant's sub-block of 16), whose sums are folded in separately.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn tile_vnni<const MR: usize, const NB: usize, const G: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    row0: usize,
    block0: usize,
) {
    let (n_groups, n_blocks) = (w.k_pad / K_PER_GROUP, w.n_blocks());
    let scale_groups = w.scales.groups();
    let sign = _mm256_set1_epi8(i8::MIN);
    let mut acc = [[_mm512_setzero_ps(); NB]; MR];
    let w_base = w.data.as_ptr();
    // The block's activations offset to unsigned once per row, not once per weight
    // vector they meet: the XOR would otherwise take a vector port from `vpdpbusd`.
    let mut a_unsigned = [[0i32; GROUPS_PER_BLOCK]; MR];
    for kb in 0..n_blocks {
        if row0 == 0 {
            prefetch_ahead::<NB, _>(&w.data, w.k_pad, GROUP_BYTES, block0, kb);
        }
        for (r, a_r) in a_unsigned.iter_mut().enumerate() {
            let at = a.data.as_ptr().add((row0 + r) * a.k_pad + kb * BLOCK_K);
            let offset = _mm256_xor_si256(_mm256_loadu_si256(at.cast()), sign);
            _mm256_storeu_si256(a_r.as_mut_ptr().cast(), offset);
        }
        // Read back from memory, so each lane reaches `vpdpbusd` as a broadcast load (a
        // load port) rather than as shuffles of a register (the port `vpdpbusd` needs).
        std::hint::black_box(&mut a_unsigned);
        for h in 0..GROUPS_PER_BLOCK / G {
            let s = kb * (GROUPS_PER_BLOCK / G) + h;
            // The sums start at `-128 · Σ w`, which takes the offset back out.
            let mut start = [_mm512_setzero_si512(); NB];
            for (j, st) in start.iter_mut().enumerate() {
                let at = ((block0 + j) * scale_groups + s) * ROWS_PER_BLOCK;
                let sums =
                    _mm512_cvtepi16_epi32(_mm256_loadu_si256(w.block_sums.as_ptr().add(at).cast()));
                *st = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, 7));
            }
            let mut dots = [start; MR];
            for g in h * G..(h + 1) * G {
                let group = kb * GROUPS_PER_BLOCK + g;
                let mut wv = [_mm512_setzero_si512(); NB];
                for (j, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_loadu_si512(
                        w_base.add(((block0 + j) * n_groups + group) * GROUP_BYTES) as *const _,
                    );
                }
                for (dots_r, a_r) in dots.iter_mut().zip(&a_unsigned) {
                    let av = _mm512_set1_epi32(a_r[g]);
                    for (d, wv_j) in dots_r.iter_mut().zip(&wv) {
                        *d = _mm512_dpbusd_epi32(*d, av, *wv_j);
                    }
                }
            }
            for j in 0..NB {
                let w_scale = w.scales.load16_avx512(block0 + j, s);
                let w_min = w.mins.as_ref().map(|m| m.load16_avx512(block0 + j, s));
                for (r, (acc_r, dots_r)) in acc.iter_mut().zip(&dots).enumerate() {
                    let at = (row0 + r) * n_blocks + kb;
                    let a_scale = *a.scales.get_unchecked(at);
                    acc_r[j] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(dots_r[j]),
                        _mm512_mul_ps(w_scale, _mm512_set1_ps(a_scale)),
                        acc_r[j],
                    );
                    // Q5_1/Q5_K: `min · Σ a` after the scaled sum, as the oracle adds it.
                    if let Some(w_min) = w_min {
                        let a_sum = *a.block_sums.get_unchecked(at) as f32 * a_scale;
                        acc_r[j] = _mm512_fmadd_ps(w_min, _mm512_set1_ps(a_sum), acc_r[j]);
                    }
                }
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (j, acc_rj) in acc_r.iter().enumerate() {
            store_block_row(out, w.n, row0 + r, block0 + j, *acc_rj);
        }
    }
}

/// Stores `row`'s sixteen outputs of weight block `block`, leaving out the columns at or
/// past `n` (the padding rows of the last block): how the AVX-512 kernels write a tile.
///
/// # Safety
/// The CPU has AVX-512F; `out` points to `[m, n]` floats and holds `row`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn store_block_row(
    out: *mut f32,
    n: usize,
    row: usize,
    block: usize,
    acc: __m512,
) {
    let col0 = block * ROWS_PER_BLOCK;
    let valid = n.saturating_sub(col0).min(ROWS_PER_BLOCK);
    let mask: __mmask16 = ((1u32 << valid) - 1) as __mmask16;
    _mm512_mask_storeu_ps(out.add(row * n + col0), mask, acc);
}

entry_points_256!(PackedI8, |w| ROWS_PER_BLOCK * w.k_pad);

/// The tile of `rows` activation rows, inlined into the entry point of `D`'s ISA.
#[inline(always)]
unsafe fn tiles_256<D: ByteDot>(
    a: &QuantizedView<'_>,
    w: &PackedI8,
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

/// `$tile::<$pre, MR, $post>($args)` for a tile of `$rows` activation rows (up to four):
/// the one match the 256-bit integer kernels dispatch their monomorphised tiles through.
macro_rules! row_tile {
    ($tile:ident [$pre:ty] [$post:expr], $rows:expr, $($arg:expr),* $(,)?) => {
        match $rows {
            4 => $tile::<$pre, 4, $post>($($arg),*),
            3 => $tile::<$pre, 3, $post>($($arg),*),
            2 => $tile::<$pre, 2, $post>($($arg),*),
            _ => $tile::<$pre, 1, $post>($($arg),*),
        }
    };
}
pub(crate) use row_tile;

/// Calls `tile(rows, row, block)` for every tile of up to four activation rows and one
/// 16-row weight block, a chunk of weights that fits in L2 at a time, so a prefill streams
/// each weight from memory once: the walk both AVX2 integer kernels take.
#[inline(always)]
pub(crate) fn for_each_tile(
    m: usize,
    blocks: Range<usize>,
    block_bytes: usize,
    mut tile: impl FnMut(usize, usize, usize),
) {
    for chunk in block_chunks(blocks, block_bytes) {
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(4);
            for b in chunk.clone() {
                tile(rows, row, b);
            }
            row += rows;
        }
    }
}

/// `G` is the packed groups of four `k` per weight scale, as in [`tile_vnni`].
///
/// Where `D`'s pair sums hold activations offset to unsigned (VNNI), they are, and the
/// sums start at `-128 · Σ w` as in [`tile_vnni`]: one `vpdpbusd` per weight vector. AVX2
/// moves each activation's sign onto the weight instead (`vpsignb`) and multiplies `|a|`.
#[inline(always)]
unsafe fn tile_256<D: ByteDot, const MR: usize, const G: usize>(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    row0: usize,
    block: usize,
) {
    let offset = D::RUN_LIMIT >= 2 * 255 * 128;
    let (n_groups, n_blocks) = (w.k_pad / K_PER_GROUP, w.n_blocks());
    let scale_groups = w.scales.groups();
    let sign = _mm256_set1_epi8(i8::MIN);
    // [row][half]: rows 0-7 and 8-15 of the block.
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    let w_base = w.data.as_ptr().add(block * n_groups * GROUP_BYTES);
    for kb in 0..n_blocks {
        if row0 == 0 {
            prefetch_ahead::<1, _>(&w.data, w.k_pad, GROUP_BYTES, block, kb);
        }
        for h in 0..GROUPS_PER_BLOCK / G {
            let s = kb * (GROUPS_PER_BLOCK / G) + h;
            let start = if offset {
                let at = (block * scale_groups + s) * ROWS_PER_BLOCK;
                let sums = w.block_sums.as_ptr().add(at);
                std::array::from_fn(|half| {
                    let sums = _mm256_cvtepi16_epi32(_mm_loadu_si128(sums.add(8 * half).cast()));
                    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<7>(sums))
                })
            } else {
                [_mm256_setzero_si256(); 2]
            };
            let mut dots = [start; MR];
            let first = kb * GROUPS_PER_BLOCK + h * G;
            for g in first..first + G {
                let w_lo = _mm256_loadu_si256(w_base.add(g * GROUP_BYTES) as *const _);
                let w_hi = _mm256_loadu_si256(w_base.add(g * GROUP_BYTES + 32) as *const _);
                for (r, dots_r) in dots.iter_mut().enumerate() {
                    let av = _mm256_set1_epi32(load_a4(a, row0 + r, g));
                    if offset {
                        let a_unsigned = _mm256_xor_si256(av, sign);
                        for (d, wh) in dots_r.iter_mut().zip([w_lo, w_hi]) {
                            *d = D::dot(*d, a_unsigned, wh);
                        }
                    } else {
                        let a_abs = _mm256_abs_epi8(av);
                        for (d, wh) in dots_r.iter_mut().zip([w_lo, w_hi]) {
                            *d = D::dot(*d, a_abs, _mm256_sign_epi8(wh, av));
                        }
                    }
                }
            }
            let w_scale = w.scales.load16_avx2(block, s);
            let w_min = w.mins.as_ref().map(|m| m.load16_avx2(block, s));
            for (r, (acc_r, dots_r)) in acc.iter_mut().zip(&dots).enumerate() {
                let at = (row0 + r) * n_blocks + kb;
                let a_scale = *a.scales.get_unchecked(at);
                // Read only with minimums, whose callers are asserted to pass the sums.
                let a_sum =
                    w_min.map(|_| _mm256_set1_ps(*a.block_sums.get_unchecked(at) as f32 * a_scale));
                let a_scale = _mm256_set1_ps(a_scale);
                for (half, (acc_rh, d)) in acc_r.iter_mut().zip(dots_r).enumerate() {
                    *acc_rh = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(*d),
                        _mm256_mul_ps(w_scale[half], a_scale),
                        *acc_rh,
                    );
                    // Q5_1/Q5_K: `min · Σ a` after the scaled sum, as the oracle adds it.
                    if let (Some(w_min), Some(a_sum)) = (w_min, a_sum) {
                        *acc_rh = _mm256_fmadd_ps(w_min[half], a_sum, *acc_rh);
                    }
                }
            }
        }
    }
    store_tile(&acc, out, w.n, row0, block);
}

/// Stores a tile's sums, rows `row0..` and the block's two halves of eight outputs, leaving
/// out the columns at or past `n` (the padding rows of the last block).
///
/// # Safety
/// The CPU has AVX; `out` points to `[m, n]` floats and holds the tile's rows.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn store_tile<const MR: usize>(
    acc: &[[__m256; 2]; MR],
    out: *mut f32,
    n: usize,
    row0: usize,
    block: usize,
) {
    for (r, acc_r) in acc.iter().enumerate() {
        for (h, acc_rh) in acc_r.iter().enumerate() {
            let col0 = block * ROWS_PER_BLOCK + h * 8;
            if col0 >= n {
                continue;
            }
            let valid = (n - col0).min(8);
            let dst = out.add((row0 + r) * n + col0);
            if valid == 8 {
                _mm256_storeu_ps(dst, *acc_rh);
            } else {
                let mut tmp = [0.0f32; 8];
                _mm256_storeu_ps(tmp.as_mut_ptr(), *acc_rh);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, valid);
            }
        }
    }
}

/// One whole block quantised as the scalar path does it: the same scale ([`Scaling`]),
/// and each value scaled, clamped to ±127, rounded half away from zero by truncating
/// `v ± 0.5`, with NaN giving 0. Returns the scale.
///
/// # Safety
/// The CPU has AVX2; `x` and `q` hold at least [`super::BLOCK_K`] elements.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_block_avx2(x: &[f32], q: &mut [i8], scaling: Scaling) -> f32 {
    debug_assert!(x.len() >= super::BLOCK_K && q.len() >= super::BLOCK_K);
    let sign_bit = _mm256_set1_ps(-0.0);
    let v = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(x.as_ptr().add(i)));
    let mut max = _mm256_setzero_ps();
    for vi in v {
        // A NaN lane keeps `max` (the second operand), as `f32::max` ignores NaN.
        max = _mm256_max_ps(_mm256_andnot_ps(sign_bit, vi), max);
    }
    let half = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps::<1>(max));
    let half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    let max = _mm_cvtss_f32(_mm_max_ss(half, _mm_shuffle_ps::<1>(half, half)));
    let (inv, scale) = scaling.step(max);
    if inv == 0.0 {
        q[..super::BLOCK_K].fill(0);
        return scale;
    }
    let inv = _mm256_set1_ps(inv);
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let rounded = v.map(|vi| {
        let scaled = _mm256_mul_ps(vi, inv);
        let scaled = _mm256_and_ps(scaled, _mm256_cmp_ps::<_CMP_ORD_Q>(scaled, scaled));
        let scaled = _mm256_min_ps(_mm256_max_ps(scaled, lo), hi);
        let half = _mm256_or_ps(_mm256_and_ps(scaled, sign_bit), _mm256_set1_ps(0.5));
        _mm256_cvttps_epi32(_mm256_add_ps(scaled, half))
    });
    // Packing works within 128-bit lanes; the permute puts the four dwords back in order.
    let words = [
        _mm256_packs_epi32(rounded[0], rounded[1]),
        _mm256_packs_epi32(rounded[2], rounded[3]),
    ];
    let bytes = _mm256_packs_epi16(words[0], words[1]);
    let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.as_mut_ptr().cast(), ordered);
    scale
}

/// Up to sixteen blocks of activations quantised as [`quantize_block_avx512`] quantises
/// each, with [`Scaling::Activations`] and the values outside `keep` (a mask per sixteen
/// values: the excluded channels and the padding past `x`) read as zeros. The scales of
/// all the blocks come from one pair of vector divisions instead of two scalar ones per
/// block; division is correctly rounded in both, and a block that cannot be scaled gets
/// the multiplier 0, which zeroes it as the scalar path does. So the bytes and scales are
/// the scalar path's.
///
/// # Safety
/// The CPU has AVX-512F; `keep` has no lane set at or past `x.len()`; `q` holds the
/// padded blocks (`x.len()` rounded up to [`super::BLOCK_K`]) and `scales` one per block.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn quantize_activation_batch_avx512(
    x: &[f32],
    keep: &[__mmask16; ACTIVATION_BATCH * 2],
    q: &mut [i8],
    scales: &mut [f32],
) {
    let n_blocks = x.len().div_ceil(super::BLOCK_K);
    debug_assert!(n_blocks <= ACTIVATION_BATCH && scales.len() >= n_blocks);
    debug_assert!(q.len() >= n_blocks * super::BLOCK_K);
    let mut maxes = [0.0f32; ACTIVATION_BATCH];
    for (b, max) in maxes.iter_mut().enumerate().take(n_blocks) {
        // As in `quantize_block_avx512`: a NaN lane keeps the running maximum.
        let mut m = _mm512_setzero_ps();
        for h in [2 * b, 2 * b + 1] {
            m = _mm512_max_ps(_mm512_abs_ps(load_kept(x, keep, h)), m);
        }
        *max = _mm512_reduce_max_ps(m);
    }
    // `Scaling::Activations::step` for every block at once: a maximum is never NaN here,
    // so a block scales when its maximum is above zero and finite.
    let hi = _mm512_set1_ps(127.0);
    let max = _mm512_loadu_ps(maxes.as_ptr());
    let scalable = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(max, _mm512_setzero_ps())
        & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(max, _mm512_set1_ps(f32::INFINITY));
    let mut invs = [0.0f32; ACTIVATION_BATCH];
    _mm512_storeu_ps(invs.as_mut_ptr(), _mm512_maskz_div_ps(scalable, hi, max));
    _mm512_mask_storeu_ps(
        scales.as_mut_ptr(),
        ((1u32 << n_blocks) - 1) as __mmask16,
        _mm512_maskz_div_ps(scalable, max, hi),
    );
    for (b, &inv) in invs.iter().enumerate().take(n_blocks) {
        let inv = _mm512_set1_ps(inv);
        for h in [2 * b, 2 * b + 1] {
            let bytes = scale_round_avx512(load_kept(x, keep, h), inv);
            _mm_storeu_si128(q.as_mut_ptr().add(16 * h).cast(), bytes);
        }
    }
}

/// Sixteen values scaled by `inv` and rounded to bytes as the scalar path does: clamped
/// to ±127, half away from zero by truncating `v ± 0.5`, NaN giving 0.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn scale_round_avx512(v: __m512, inv: __m512) -> __m128i {
    let scaled = _mm512_mul_ps(v, inv);
    let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(scaled, scaled);
    let scaled = _mm512_maskz_mov_ps(ordered, scaled);
    let scaled = _mm512_min_ps(
        _mm512_max_ps(scaled, _mm512_set1_ps(-127.0)),
        _mm512_set1_ps(127.0),
    );
    let half = _mm512_or_si512(
        _mm512_and_si512(_mm512_castps_si512(scaled), _mm512_set1_epi32(i32::MIN)),
        _mm512_castps_si512(_mm512_set1_ps(0.5)),
    );
    let rounded = _mm512_cvttps_epi32(_mm512_add_ps(scaled, _mm512_castsi512_ps(half)));
    _mm512_cvtsepi32_epi8(rounded)
}

/// Values `16 · h ..` of `x` where `keep[h]` has their lane, zeros elsewhere.
///
/// # Safety
/// The CPU has AVX-512F; `keep[h]` has no lane set at or past `x.len()`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_kept(x: &[f32], keep: &[__mmask16], h: usize) -> __m512 {
    // Masked lanes are never read, so a half past the end of `x` reads nothing.
    _mm512_maskz_loadu_ps(keep[h], x.as_ptr().wrapping_add(16 * h))
}

/// As [`quantize_block_avx2`], the block in two AVX-512 vectors: the same operations on
/// each value, so the same bytes and scale.
///
/// # Safety
/// The CPU has AVX-512F; `x` and `q` hold at least [`super::BLOCK_K`] elements.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn quantize_block_avx512(x: &[f32], q: &mut [i8], scaling: Scaling) -> f32 {
    debug_assert!(x.len() >= super::BLOCK_K && q.len() >= super::BLOCK_K);
    let v = [0, 16].map(|i| _mm512_loadu_ps(x.as_ptr().add(i)));
    let mut max = _mm512_setzero_ps();
    for vi in v {
        // A NaN lane keeps `max` (the second operand), as `f32::max` ignores NaN.
        max = _mm512_max_ps(_mm512_abs_ps(vi), max);
    }
    let (inv, scale) = scaling.step(_mm512_reduce_max_ps(max));
    if inv == 0.0 {
        q[..super::BLOCK_K].fill(0);
        return scale;
    }
    let inv = _mm512_set1_ps(inv);
    for (i, vi) in v.into_iter().enumerate() {
        let bytes = scale_round_avx512(vi, inv);
        _mm_storeu_si128(q.as_mut_ptr().add(16 * i).cast(), bytes);
    }
    scale
}

/// [`PackedI8::add_column`] eight rows at a time.
///
/// # Safety
/// The CPU has AVX2 and F16C; `kk < w.k` and `cols` is inside `0..w.n`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn add_column_avx2(
    w: &PackedI8,
    kk: usize,
    v: f32,
    out: &mut [f32],
    cols: Range<usize>,
) {
    let (group, s) = (kk / K_PER_GROUP, kk / w.scales.group_k());
    let n_groups = w.k_pad / K_PER_GROUP;
    add_column(kk % K_PER_GROUP, Codes::Signed, v, out, cols, |block, h| {
        let at = (block * n_groups + group) * GROUP_BYTES + h * 32;
        let codes = _mm256_loadu_si256(w.data.as_ptr().add(at).cast());
        let min = w.mins.as_ref().map(|m| m.load16_avx2(block, s)[h]);
        (codes, w.scales.load16_avx2(block, s)[h], min)
    })
}
