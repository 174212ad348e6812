//! The AVX-512 VNNI form: sixteen (row, head) pairs to a tile, `vpdpbusd` for both
//! products. Its unsigned operand is the query, offset by 128 when the tile is prepared,
//! so a key quad is the broadcast memory operand of one instruction; each position's sum
//! starts at `-128 · Σ key codes` to take the offset back out, exactly.

use std::arch::x86_64::*;

use super::regions::{value_quad, Plan, Queries, Regions};
use super::{weight_step, Cache, BLOCK, WEIGHT_MAX};
use crate::ops::{exp_avx512 as exp, exp_scalar};

const LANES: usize = 16;

/// Zero value rows standing in for positions past the cache in its last block.
static ZERO_ROW: [i8; super::MAX_HEAD_DIM] = [0; super::MAX_HEAD_DIM];

/// # Safety
/// The CPU has AVX-512 F, BW, VL and VNNI, AVX2 and FMA; `head_dim` is a multiple of 64
/// and at most [`super::MAX_HEAD_DIM`]; the shapes were checked by the caller (every row
/// and output `[n_q, head_dim]`, the cache holding the last row's positions).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn attend(
    q: &[&[f32]],
    head_dim: usize,
    cache: Cache<'_>,
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    let plan = Plan::new(head_dim, LANES, q.len(), q[0].len() / head_dim);
    let r = Regions::prepare(
        &plan,
        q,
        first_len,
        scale,
        Queries::Tiles { offset: true },
        scratch,
    );
    let n_pos = cache.key_scales.len();
    for b0 in (0..n_pos).step_by(BLOCK) {
        let (keys, key_scales, value_scales) = r.block_keys(cache, b0, head_dim);
        key_starts(&r, keys, head_dim);
        interleave_values(&r, cache.values, head_dim, b0);
        for tile in 0..plan.n_tiles {
            let lens = _mm512_loadu_si512(r.lens.add(tile * LANES).cast());
            if b0 as i32 >= _mm512_reduce_max_epi32(lens) {
                continue; // Past every pair's end: nothing in the tile would change.
            }
            score(&r, tile, keys, key_scales, head_dim, b0, lens);
            weigh(&r, tile, value_scales);
            let pairs = tile * LANES..((tile + 1) * LANES).min(plan.n_pairs);
            for p in pairs {
                if b0 < *r.lens.add(p) as usize {
                    add_values(&r, p, p - tile * LANES, head_dim);
                }
            }
        }
    }
    r.finish(&plan, first_len, out);
}

/// The form for a single row (a decoding step, or a draft's first row alone): its heads
/// are too few to fill a tile's lanes, so the block's positions fill them instead,
/// sixteen to a vector. The keys are transposed once per block into quads of positions
/// (offset by 128: the unsigned operand), and each head's query quad is the broadcast
/// signed one; a head's sum starts at `-128 · Σ query codes`. Sums of a block's
/// exponentials fold the lanes in [`super::block_sum`]'s tree; the weighted sums are the
/// tile form's.
///
/// # Safety
/// As [`attend`], with `q` and `out` one row each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(super) unsafe fn attend_row(
    q: &[&[f32]],
    head_dim: usize,
    cache: Cache<'_>,
    len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    let n_q = q[0].len() / head_dim;
    let plan = Plan::new(head_dim, LANES, 1, n_q);
    let r = Regions::prepare(&plan, q, len, scale, Queries::Rows, scratch);
    let quads = head_dim / 4;
    let transposed = r.keys.add(BLOCK * head_dim / 4);
    for b0 in (0..len).step_by(BLOCK) {
        let (keys, key_scales, value_scales) = r.block_keys(cache, b0, head_dim);
        transpose_keys(keys, head_dim, transposed);
        interleave_values(&r, cache.values, head_dim, b0);
        let seen: [__mmask16; 2] = [0, 1].map(|g| {
            let n = len.saturating_sub(b0 + 16 * g).min(16);
            ((1u32 << n) - 1) as __mmask16
        });
        for h in 0..n_q {
            let query = r.queries.add(h * quads);
            let start = _mm512_set1_epi32(*r.query_starts.add(h));
            let query_scale = _mm512_set1_ps(*r.query_scales.add(h));
            let mut s = [_mm512_setzero_ps(); 2];
            for (g, s) in s.iter_mut().enumerate() {
                let mut acc = start;
                for quad in 0..quads {
                    let k = _mm512_loadu_si512(transposed.add((g * quads + quad) * LANES).cast());
                    acc = _mm512_dpbusd_epi32(acc, k, _mm512_set1_epi32(*query.add(quad) as i32));
                }
                let scores = _mm512_mul_ps(
                    _mm512_mul_ps(_mm512_cvtepi32_ps(acc), query_scale),
                    _mm512_loadu_ps(key_scales.add(16 * g)),
                );
                *s = _mm512_mask_blend_ps(seen[g], _mm512_set1_ps(f32::NEG_INFINITY), scores);
            }
            let block_max = _mm512_reduce_max_ps(_mm512_max_ps(s[0], s[1]));
            let max = *r.maxima.add(h);
            let new_max = max.max(block_max);
            let rescale = exp_scalar(max - new_max);
            let e = s.map(|s| exp(_mm512_sub_ps(s, _mm512_set1_ps(new_max))));
            let w = [0, 1].map(|g| _mm512_mul_ps(e[g], _mm512_loadu_ps(value_scales.add(16 * g))));
            let top = _mm512_reduce_max_ps(_mm512_max_ps(w[0], w[1])).max(0.0);
            *r.maxima.add(h) = new_max;
            *r.sums.add(h) = *r.sums.add(h) * rescale + tree_sum(e[0], e[1]);
            let (inv, step) = weight_step(top);
            for (g, w) in w.into_iter().enumerate() {
                let codes =
                    _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(w, _mm512_set1_ps(inv))));
                let mut quads4 = [0u32; 4];
                _mm_storeu_si128(quads4.as_mut_ptr().cast(), codes);
                for (k, &c) in quads4.iter().enumerate() {
                    *r.codes.add((4 * g + k) * LANES + h) = c;
                }
            }
            let tail = r.codes.add(BLOCK / 4 * LANES).cast::<f32>();
            *tail.add(h) = rescale;
            *tail.add(LANES + h) = step;
            add_values(&r, h, h, head_dim);
        }
    }
    r.finish(&plan, len, out);
}

/// [`super::block_sum`] of the exponentials of positions `0..16` (`lo`) and `16..32`.
#[inline(always)]
unsafe fn tree_sum(lo: __m512, hi: __m512) -> f32 {
    let s16 = _mm512_add_ps(lo, hi);
    let s8 = _mm256_add_ps(
        _mm512_castps512_ps256(s16),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s16))),
    );
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
}

/// The block's keys, offset by 128, as `[half][quad][position]` quads: each quad of
/// sixteen positions in one vector.
#[inline(always)]
unsafe fn transpose_keys(keys: *const i8, head_dim: usize, transposed: *mut u32) {
    let quads = head_dim / 4;
    let flip = _mm512_set1_epi8(i8::MIN);
    for g in 0..BLOCK / 16 {
        for c in (0..quads).step_by(16) {
            let mut rows = [_mm512_setzero_si512(); 16];
            for (p, row) in rows.iter_mut().enumerate() {
                let at = keys.add((16 * g + p) * head_dim + 4 * c);
                *row = _mm512_xor_si512(_mm512_loadu_si512(at.cast()), flip);
            }
            let columns = transpose16(rows);
            for (j, col) in columns.into_iter().enumerate() {
                _mm512_storeu_si512(transposed.add((g * quads + c + j) * LANES).cast(), col);
            }
        }
    }
}

/// A 16 × 16 transpose of 32-bit elements: `out[j]` lane `p` is `rows[p]` lane `j`.
#[inline(always)]
unsafe fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
    // Pairs of rows interleaved, then quads: `u[4b + j]`'s 128-bit lane `L` holds column
    // `4L + j` of rows `4b..4b + 4`.
    let mut u = [_mm512_setzero_si512(); 16];
    for b in 0..4 {
        let (r0, r1, r2, r3) = (r[4 * b], r[4 * b + 1], r[4 * b + 2], r[4 * b + 3]);
        let (t0, t1) = (_mm512_unpacklo_epi32(r0, r1), _mm512_unpackhi_epi32(r0, r1));
        let (t2, t3) = (_mm512_unpacklo_epi32(r2, r3), _mm512_unpackhi_epi32(r2, r3));
        u[4 * b] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * b + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * b + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * b + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    // Column `4L + j` gathers lane `L` of `u[j]`, `u[4 + j]`, `u[8 + j]`, `u[12 + j]`.
    let mut out = [_mm512_setzero_si512(); 16];
    for j in 0..4 {
        let (a, b, c, d) = (u[j], u[4 + j], u[8 + j], u[12 + j]);
        let ab_lo = _mm512_shuffle_i32x4::<0b01_00_01_00>(a, b);
        let ab_hi = _mm512_shuffle_i32x4::<0b11_10_11_10>(a, b);
        let cd_lo = _mm512_shuffle_i32x4::<0b01_00_01_00>(c, d);
        let cd_hi = _mm512_shuffle_i32x4::<0b11_10_11_10>(c, d);
        out[j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(ab_lo, cd_lo);
        out[4 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(ab_lo, cd_lo);
        out[8 + j] = _mm512_shuffle_i32x4::<0b10_00_10_00>(ab_hi, cd_hi);
        out[12 + j] = _mm512_shuffle_i32x4::<0b11_01_11_01>(ab_hi, cd_hi);
    }
    out
}

/// `-128 · Σ key codes` of each of the block's positions.
#[inline(always)]
unsafe fn key_starts(r: &Regions, keys: *const i8, head_dim: usize) {
    let ones = _mm512_set1_epi8(1);
    for j in 0..BLOCK {
        let mut sum = _mm512_setzero_si512();
        for c in (0..head_dim).step_by(64) {
            let k = _mm512_loadu_si512(keys.add(j * head_dim + c).cast());
            sum = _mm512_dpbusd_epi32(sum, ones, k);
        }
        *r.key_starts.add(j) = -128 * _mm512_reduce_add_epi32(sum);
    }
}

/// The block's value rows as `[quad][column]` quads of positions, in the column order of
/// [`super::interleaved_column`].
#[inline(always)]
unsafe fn interleave_values(r: &Regions, values: &[i8], head_dim: usize, b0: usize) {
    let zeros = &ZERO_ROW[..head_dim];
    for quad in 0..BLOCK / 4 {
        let rows = value_quad(values, head_dim, b0, quad, zeros);
        let dst = r.values.add(quad * head_dim);
        for c in (0..head_dim).step_by(64) {
            let mut row = [_mm512_setzero_si512(); 4];
            for (v, src) in row.iter_mut().zip(rows) {
                *v = _mm512_loadu_si512(src.as_ptr().add(c).cast());
            }
            let (r01_lo, r01_hi) = (
                _mm512_unpacklo_epi8(row[0], row[1]),
                _mm512_unpackhi_epi8(row[0], row[1]),
            );
            let (r23_lo, r23_hi) = (
                _mm512_unpacklo_epi8(row[2], row[3]),
                _mm512_unpackhi_epi8(row[2], row[3]),
            );
            let at = dst.add(c).cast::<__m512i>();
            _mm512_storeu_si512(at, _mm512_unpacklo_epi16(r01_lo, r23_lo));
            _mm512_storeu_si512(at.add(1), _mm512_unpackhi_epi16(r01_lo, r23_lo));
            _mm512_storeu_si512(at.add(2), _mm512_unpacklo_epi16(r01_hi, r23_hi));
            _mm512_storeu_si512(at.add(3), _mm512_unpackhi_epi16(r01_hi, r23_hi));
        }
    }
}

/// The tile's scores of the block's positions, `-inf` past each pair's length.
#[inline(always)]
unsafe fn score(
    r: &Regions,
    tile: usize,
    keys: *const i8,
    key_scales: *const f32,
    head_dim: usize,
    b0: usize,
    lens: __m512i,
) {
    let quads = head_dim / 4;
    let queries = r.queries.add(tile * quads * LANES);
    let query_scales = _mm512_loadu_ps(r.query_scales.add(tile * LANES));
    for j in (0..BLOCK).step_by(4) {
        let mut acc = [_mm512_setzero_si512(); 4];
        for (i, a) in acc.iter_mut().enumerate() {
            *a = _mm512_set1_epi32(*r.key_starts.add(j + i));
        }
        for quad in 0..quads {
            let qv = _mm512_loadu_si512(queries.add(quad * LANES).cast());
            for (i, a) in acc.iter_mut().enumerate() {
                let k = keys
                    .add((j + i) * head_dim + 4 * quad)
                    .cast::<i32>()
                    .read_unaligned();
                *a = _mm512_dpbusd_epi32(*a, qv, _mm512_set1_epi32(k));
            }
        }
        for (i, a) in acc.into_iter().enumerate() {
            let s = _mm512_mul_ps(
                _mm512_mul_ps(_mm512_cvtepi32_ps(a), query_scales),
                _mm512_set1_ps(*key_scales.add(j + i)),
            );
            let seen = _mm512_cmpgt_epi32_mask(lens, _mm512_set1_epi32((b0 + j + i) as i32));
            let s = _mm512_mask_blend_ps(seen, _mm512_set1_ps(f32::NEG_INFINITY), s);
            _mm512_storeu_ps(r.scores.add((j + i) * LANES), s);
        }
    }
}

/// The online softmax step: new maxima, rescaled sums, and the block's weights (times
/// the value rows' scales) as codes in `[0, 127]` with their step, beside the rescale.
#[inline(always)]
unsafe fn weigh(r: &Regions, tile: usize, value_scales: *const f32) {
    let at = tile * LANES;
    let mut block_max = _mm512_set1_ps(f32::NEG_INFINITY);
    for j in 0..BLOCK {
        block_max = _mm512_max_ps(block_max, _mm512_loadu_ps(r.scores.add(j * LANES)));
    }
    let max = _mm512_loadu_ps(r.maxima.add(at));
    let new_max = _mm512_max_ps(max, block_max);
    let rescale = exp(_mm512_sub_ps(max, new_max));
    let mut top = _mm512_setzero_ps();
    let mut halves = [_mm512_setzero_ps(); BLOCK / 2];
    for (i, half) in halves.iter_mut().enumerate() {
        let mut pair = [_mm512_setzero_ps(); 2];
        for (k, e) in pair.iter_mut().enumerate() {
            let j = i + k * BLOCK / 2;
            let s = r.scores.add(j * LANES);
            *e = exp(_mm512_sub_ps(_mm512_loadu_ps(s), new_max));
            let w = _mm512_mul_ps(*e, _mm512_set1_ps(*value_scales.add(j)));
            top = _mm512_max_ps(top, w);
            _mm512_storeu_ps(s, w);
        }
        *half = _mm512_add_ps(pair[0], pair[1]);
    }
    let mut width = BLOCK / 4;
    while width > 0 {
        for i in 0..width {
            halves[i] = _mm512_add_ps(halves[i], halves[i + width]);
        }
        width /= 2;
    }
    let sum = _mm512_add_ps(
        _mm512_mul_ps(_mm512_loadu_ps(r.sums.add(at)), rescale),
        halves[0],
    );
    _mm512_storeu_ps(r.maxima.add(at), new_max);
    _mm512_storeu_ps(r.sums.add(at), sum);
    let weighted = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(top, _mm512_setzero_ps());
    let inv = _mm512_maskz_div_ps(weighted, _mm512_set1_ps(WEIGHT_MAX), top);
    let step = _mm512_maskz_div_ps(weighted, top, _mm512_set1_ps(WEIGHT_MAX));
    for quad in 0..BLOCK / 4 {
        let mut code = [_mm512_setzero_si512(); 4];
        for (i, c) in code.iter_mut().enumerate() {
            let w = _mm512_loadu_ps(r.scores.add((4 * quad + i) * LANES));
            *c = _mm512_cvtps_epi32(_mm512_mul_ps(w, inv));
        }
        let packed = _mm512_or_si512(
            _mm512_or_si512(code[0], _mm512_slli_epi32::<8>(code[1])),
            _mm512_or_si512(
                _mm512_slli_epi32::<16>(code[2]),
                _mm512_slli_epi32::<24>(code[3]),
            ),
        );
        _mm512_storeu_si512(r.codes.add(quad * LANES).cast(), packed);
    }
    let tail = r.codes.add(BLOCK / 4 * LANES).cast::<f32>();
    _mm512_storeu_ps(tail, rescale);
    _mm512_storeu_ps(tail.add(LANES), step);
}

/// Pair `p` (lane `lane` of its tile): `o = o · rescale + step · Σ codes · values`.
#[inline(always)]
unsafe fn add_values(r: &Regions, p: usize, lane: usize, head_dim: usize) {
    let mut codes = [_mm512_setzero_si512(); BLOCK / 4];
    for (quad, code) in codes.iter_mut().enumerate() {
        *code = _mm512_set1_epi32(*r.codes.add(quad * LANES + lane) as i32);
    }
    let tail = r.codes.add(BLOCK / 4 * LANES).cast::<f32>();
    let rescale = _mm512_set1_ps(*tail.add(lane));
    let step = _mm512_set1_ps(*tail.add(LANES + lane));
    let o = r.outputs.add(p * head_dim);
    for c in (0..head_dim).step_by(LANES) {
        let mut acc = _mm512_setzero_si512();
        for (quad, &code) in codes.iter().enumerate() {
            let v = _mm512_loadu_si512(r.values.add(quad * head_dim + c).cast());
            acc = _mm512_dpbusd_epi32(acc, code, v);
        }
        let t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), step);
        _mm512_storeu_ps(
            o.add(c),
            _mm512_fmadd_ps(_mm512_loadu_ps(o.add(c)), rescale, t),
        );
    }
}
