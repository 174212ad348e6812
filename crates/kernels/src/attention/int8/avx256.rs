//! The 256-bit forms: eight (row, head) pairs to a tile, the byte products generic over
//! [`ByteDot`] (AVX2's `vpmaddubsw`, AVX-VNNI's `vpdpbusd`). The unsigned operand of a
//! key product is the key quad's magnitude and the signed one the query with the key's
//! signs (`vpsignb`): every pair sum stays within `2 · 127 · 127`, which `vpmaddubsw`
//! holds in 16 bits, and needs no correction.

use std::arch::x86_64::*;

use super::regions::{value_quad, Plan, Queries, Regions};
use super::{weight_step, Cache, BLOCK, MAX_HEAD_DIM, WEIGHT_MAX};
use crate::attention::MAX_GROUP;
use crate::byte_dot::{ByteDot, Maddubs, Vnni256};
use crate::ops::{exp_avx2 as exp, exp_scalar};

const LANES: usize = 8;

/// Zero value rows standing in for positions past the cache in its last block.
static ZERO_ROW: [i8; super::MAX_HEAD_DIM] = [0; super::MAX_HEAD_DIM];

/// # Safety
/// The CPU has AVX2, FMA and F16C; `head_dim` is a multiple of 32 and at most
/// [`super::MAX_HEAD_DIM`]; the shapes were checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_avx2(
    q: &[&[f32]],
    head_dim: usize,
    cache: Cache<'_>,
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    attend::<Maddubs>(q, head_dim, cache, first_len, scale, scratch, out)
}

/// # Safety
/// As [`attend_avx2`], and the CPU has AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn attend_vnni(
    q: &[&[f32]],
    head_dim: usize,
    cache: Cache<'_>,
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    attend::<Vnni256>(q, head_dim, cache, first_len, scale, scratch, out)
}

/// # Safety
/// As [`attend_avx2`], with `q` and `out` one row each.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_row_avx2(
    q: &[&[f32]],
    head_dim: usize,
    cache: Cache<'_>,
    len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    attend_row::<Maddubs>(q, head_dim, cache, len, scale, scratch, out)
}

/// # Safety
/// As [`attend_vnni`], with `q` and `out` one row each.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(super) unsafe fn attend_row_vnni(
    q: &[&[f32]],
    head_dim: usize,
    cache: Cache<'_>,
    len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    attend_row::<Vnni256>(q, head_dim, cache, len, scale, scratch, out)
}

#[inline(always)]
unsafe fn attend<D: ByteDot>(
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
        Queries::Tiles { offset: false },
        scratch,
    );
    let n_pos = cache.key_scales.len();
    for b0 in (0..n_pos).step_by(BLOCK) {
        let (keys, key_scales, value_scales) = r.block_keys(cache, b0, head_dim);
        interleave_values(&r, cache.values, head_dim, b0);
        for tile in 0..plan.n_tiles {
            let lens = _mm256_loadu_si256(r.lens.add(tile * LANES).cast());
            let tile_len = (0..LANES).map(|l| *r.lens.add(tile * LANES + l)).max();
            if b0 as i32 >= tile_len.unwrap_or(0) {
                continue; // Past every pair's end: nothing in the tile would change.
            }
            score::<D>(&r, tile, keys, key_scales, head_dim, b0, lens);
            weigh(&r, tile, value_scales);
            let pairs = tile * LANES..((tile + 1) * LANES).min(plan.n_pairs);
            for p in pairs {
                if b0 < *r.lens.add(p) as usize {
                    add_values::<D>(&r, p, p - tile * LANES, head_dim);
                }
            }
        }
    }
    r.finish(&plan, first_len, out);
}

/// The form for a single row, as the AVX-512 one ([`super::avx512::attend_row`]): the
/// block's positions in the lanes, eight to a vector. The unsigned operand of a key
/// product is the query quad's magnitude and the signed one the key with the query's
/// signs.
#[inline(always)]
unsafe fn attend_row<D: ByteDot>(
    q: &[&[f32]],
    head_dim: usize,
    cache: Cache<'_>,
    len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    const GROUPS: usize = BLOCK / LANES;
    let n_q = q[0].len() / head_dim;
    let plan = Plan::new(head_dim, LANES, 1, n_q);
    let r = Regions::prepare(&plan, q, len, scale, Queries::Rows, scratch);
    let quads = head_dim / 4;
    let mut magnitudes = [0u32; MAX_GROUP * MAX_HEAD_DIM / 4];
    for (m, &quad) in magnitudes
        .iter_mut()
        .zip(std::slice::from_raw_parts(r.queries, n_q * quads))
    {
        *m = u32::from_le_bytes(quad.to_le_bytes().map(|b| (b as i8).unsigned_abs()));
    }
    let transposed = r.keys.add(BLOCK * head_dim / 4);
    let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    // Byte 0 of each 32-bit lane into the lane's low four bytes: four codes to a quad.
    let gather = _mm256_setr_epi8(
        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1,
        -1, -1, -1, -1, -1, -1, -1, -1,
    );
    for b0 in (0..len).step_by(BLOCK) {
        let (keys, key_scales, value_scales) = r.block_keys(cache, b0, head_dim);
        transpose_keys(keys, head_dim, transposed);
        interleave_values(&r, cache.values, head_dim, b0);
        let mut seen = [_mm256_setzero_ps(); GROUPS];
        for (g, m) in seen.iter_mut().enumerate() {
            let n = len.saturating_sub(b0 + LANES * g).min(LANES) as i32;
            *m = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), iota));
        }
        for h in 0..n_q {
            let query = r.queries.add(h * quads);
            let magnitude = magnitudes.as_ptr().add(h * quads);
            let query_scale = _mm256_set1_ps(*r.query_scales.add(h));
            let mut s = [_mm256_setzero_ps(); GROUPS];
            for (g, s) in s.iter_mut().enumerate() {
                let mut acc = _mm256_setzero_si256();
                for quad in 0..quads {
                    let k = _mm256_loadu_si256(transposed.add((g * quads + quad) * LANES).cast());
                    let signed = _mm256_sign_epi8(k, _mm256_set1_epi32(*query.add(quad) as i32));
                    let unsigned = _mm256_set1_epi32(*magnitude.add(quad) as i32);
                    acc = D::dot(acc, unsigned, signed);
                }
                let scores = _mm256_mul_ps(
                    _mm256_mul_ps(_mm256_cvtepi32_ps(acc), query_scale),
                    _mm256_loadu_ps(key_scales.add(LANES * g)),
                );
                *s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), scores, seen[g]);
            }
            let block_max = max_lane(_mm256_max_ps(
                _mm256_max_ps(s[0], s[1]),
                _mm256_max_ps(s[2], s[3]),
            ));
            let max = *r.maxima.add(h);
            let new_max = max.max(block_max);
            let rescale = exp_scalar(max - new_max);
            let mut e = [_mm256_setzero_ps(); GROUPS];
            let mut w = [_mm256_setzero_ps(); GROUPS];
            for g in 0..GROUPS {
                e[g] = exp(_mm256_sub_ps(s[g], _mm256_set1_ps(new_max)));
                w[g] = _mm256_mul_ps(e[g], _mm256_loadu_ps(value_scales.add(LANES * g)));
            }
            let top = max_lane(_mm256_max_ps(
                _mm256_max_ps(w[0], w[1]),
                _mm256_max_ps(w[2], w[3]),
            ));
            let top = top.max(0.0);
            *r.maxima.add(h) = new_max;
            // [`super::block_sum`]: `e[i] + e[i + 16]` is groups 0 + 2 and 1 + 3.
            let s8 = _mm256_add_ps(_mm256_add_ps(e[0], e[2]), _mm256_add_ps(e[1], e[3]));
            *r.sums.add(h) = *r.sums.add(h) * rescale + sum_lanes(s8);
            let (inv, step) = weight_step(top);
            for (g, &w) in w.iter().enumerate() {
                let codes = _mm256_cvtps_epi32(_mm256_mul_ps(w, _mm256_set1_ps(inv)));
                let codes = _mm256_shuffle_epi8(codes, gather);
                *r.codes.add(2 * g * LANES + h) = _mm256_extract_epi32::<0>(codes) as u32;
                *r.codes.add((2 * g + 1) * LANES + h) = _mm256_extract_epi32::<4>(codes) as u32;
            }
            let tail = r.codes.add(BLOCK / 4 * LANES).cast::<f32>();
            *tail.add(h) = rescale;
            *tail.add(LANES + h) = step;
            add_values::<D>(&r, h, h, head_dim);
        }
    }
    r.finish(&plan, len, out);
}

/// The largest lane.
#[inline(always)]
unsafe fn max_lane(v: __m256) -> f32 {
    let m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)))
}

/// The last three levels of [`super::block_sum`]'s tree, over its eight-wide level.
#[inline(always)]
unsafe fn sum_lanes(s8: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
}

/// The block's keys as `[group][quad][position]` quads: each quad of eight positions in
/// one vector.
#[inline(always)]
unsafe fn transpose_keys(keys: *const i8, head_dim: usize, transposed: *mut u32) {
    let quads = head_dim / 4;
    for g in 0..BLOCK / LANES {
        for c in (0..quads).step_by(8) {
            let mut rows = [_mm256_setzero_si256(); 8];
            for (p, row) in rows.iter_mut().enumerate() {
                *row = _mm256_loadu_si256(keys.add((LANES * g + p) * head_dim + 4 * c).cast());
            }
            let mut u = [_mm256_setzero_si256(); 8];
            for b in 0..2 {
                let (r0, r1, r2, r3) = (
                    rows[4 * b],
                    rows[4 * b + 1],
                    rows[4 * b + 2],
                    rows[4 * b + 3],
                );
                let (t0, t1) = (_mm256_unpacklo_epi32(r0, r1), _mm256_unpackhi_epi32(r0, r1));
                let (t2, t3) = (_mm256_unpacklo_epi32(r2, r3), _mm256_unpackhi_epi32(r2, r3));
                u[4 * b] = _mm256_unpacklo_epi64(t0, t2);
                u[4 * b + 1] = _mm256_unpackhi_epi64(t0, t2);
                u[4 * b + 2] = _mm256_unpacklo_epi64(t1, t3);
                u[4 * b + 3] = _mm256_unpackhi_epi64(t1, t3);
            }
            // `u[4b + j]`'s 128-bit lane `L` is column `4L + j` of rows `4b..4b + 4`.
            for j in 0..4 {
                let at = |col: usize| transposed.add((g * quads + c + col) * LANES).cast();
                _mm256_storeu_si256(at(j), _mm256_permute2x128_si256::<0x20>(u[j], u[4 + j]));
                _mm256_storeu_si256(at(4 + j), _mm256_permute2x128_si256::<0x31>(u[j], u[4 + j]));
            }
        }
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
        for c in (0..head_dim).step_by(32) {
            let mut row = [_mm256_setzero_si256(); 4];
            for (v, src) in row.iter_mut().zip(rows) {
                *v = _mm256_loadu_si256(src.as_ptr().add(c).cast());
            }
            let (r01_lo, r01_hi) = (
                _mm256_unpacklo_epi8(row[0], row[1]),
                _mm256_unpackhi_epi8(row[0], row[1]),
            );
            let (r23_lo, r23_hi) = (
                _mm256_unpacklo_epi8(row[2], row[3]),
                _mm256_unpackhi_epi8(row[2], row[3]),
            );
            let at = dst.add(c).cast::<__m256i>();
            _mm256_storeu_si256(at, _mm256_unpacklo_epi16(r01_lo, r23_lo));
            _mm256_storeu_si256(at.add(1), _mm256_unpackhi_epi16(r01_lo, r23_lo));
            _mm256_storeu_si256(at.add(2), _mm256_unpacklo_epi16(r01_hi, r23_hi));
            _mm256_storeu_si256(at.add(3), _mm256_unpackhi_epi16(r01_hi, r23_hi));
        }
    }
}

/// The tile's scores of the block's positions, `-inf` past each pair's length.
#[inline(always)]
unsafe fn score<D: ByteDot>(
    r: &Regions,
    tile: usize,
    keys: *const i8,
    key_scales: *const f32,
    head_dim: usize,
    b0: usize,
    lens: __m256i,
) {
    let quads = head_dim / 4;
    let queries = r.queries.add(tile * quads * LANES);
    let query_scales = _mm256_loadu_ps(r.query_scales.add(tile * LANES));
    for j in (0..BLOCK).step_by(4) {
        let mut acc = [_mm256_setzero_si256(); 4];
        for quad in 0..quads {
            let qv = _mm256_loadu_si256(queries.add(quad * LANES).cast());
            for (i, a) in acc.iter_mut().enumerate() {
                let k = keys
                    .add((j + i) * head_dim + 4 * quad)
                    .cast::<i32>()
                    .read_unaligned();
                let k = _mm256_set1_epi32(k);
                *a = D::dot(*a, _mm256_abs_epi8(k), _mm256_sign_epi8(qv, k));
            }
        }
        for (i, a) in acc.into_iter().enumerate() {
            let s = _mm256_mul_ps(
                _mm256_mul_ps(_mm256_cvtepi32_ps(a), query_scales),
                _mm256_set1_ps(*key_scales.add(j + i)),
            );
            let seen = _mm256_cmpgt_epi32(lens, _mm256_set1_epi32((b0 + j + i) as i32));
            let s = _mm256_blendv_ps(
                _mm256_set1_ps(f32::NEG_INFINITY),
                s,
                _mm256_castsi256_ps(seen),
            );
            _mm256_storeu_ps(r.scores.add((j + i) * LANES), s);
        }
    }
}

/// The online softmax step, as the AVX-512 form's.
#[inline(always)]
unsafe fn weigh(r: &Regions, tile: usize, value_scales: *const f32) {
    let at = tile * LANES;
    let mut block_max = _mm256_set1_ps(f32::NEG_INFINITY);
    for j in 0..BLOCK {
        block_max = _mm256_max_ps(block_max, _mm256_loadu_ps(r.scores.add(j * LANES)));
    }
    let max = _mm256_loadu_ps(r.maxima.add(at));
    let new_max = _mm256_max_ps(max, block_max);
    let rescale = exp(_mm256_sub_ps(max, new_max));
    let mut top = _mm256_setzero_ps();
    let mut halves = [_mm256_setzero_ps(); BLOCK / 2];
    for (i, half) in halves.iter_mut().enumerate() {
        let mut pair = [_mm256_setzero_ps(); 2];
        for (k, e) in pair.iter_mut().enumerate() {
            let j = i + k * BLOCK / 2;
            let s = r.scores.add(j * LANES);
            *e = exp(_mm256_sub_ps(_mm256_loadu_ps(s), new_max));
            let w = _mm256_mul_ps(*e, _mm256_set1_ps(*value_scales.add(j)));
            top = _mm256_max_ps(top, w);
            _mm256_storeu_ps(s, w);
        }
        *half = _mm256_add_ps(pair[0], pair[1]);
    }
    let mut width = BLOCK / 4;
    while width > 0 {
        for i in 0..width {
            halves[i] = _mm256_add_ps(halves[i], halves[i + width]);
        }
        width /= 2;
    }
    let sum = _mm256_add_ps(
        _mm256_mul_ps(_mm256_loadu_ps(r.sums.add(at)), rescale),
        halves[0],
    );
    _mm256_storeu_ps(r.maxima.add(at), new_max);
    _mm256_storeu_ps(r.sums.add(at), sum);
    let weighted = _mm256_cmp_ps::<_CMP_GT_OQ>(top, _mm256_setzero_ps());
    let inv = _mm256_and_ps(weighted, _mm256_div_ps(_mm256_set1_ps(WEIGHT_MAX), top));
    let step = _mm256_and_ps(weighted, _mm256_div_ps(top, _mm256_set1_ps(WEIGHT_MAX)));
    for quad in 0..BLOCK / 4 {
        let mut code = [_mm256_setzero_si256(); 4];
        for (i, c) in code.iter_mut().enumerate() {
            let w = _mm256_loadu_ps(r.scores.add((4 * quad + i) * LANES));
            *c = _mm256_cvtps_epi32(_mm256_mul_ps(w, inv));
        }
        let packed = _mm256_or_si256(
            _mm256_or_si256(code[0], _mm256_slli_epi32::<8>(code[1])),
            _mm256_or_si256(
                _mm256_slli_epi32::<16>(code[2]),
                _mm256_slli_epi32::<24>(code[3]),
            ),
        );
        _mm256_storeu_si256(r.codes.add(quad * LANES).cast(), packed);
    }
    let tail = r.codes.add(BLOCK / 4 * LANES).cast::<f32>();
    _mm256_storeu_ps(tail, rescale);
    _mm256_storeu_ps(tail.add(LANES), step);
}

/// Pair `p` (lane `lane` of its tile): `o = o · rescale + step · Σ codes · values`.
#[inline(always)]
unsafe fn add_values<D: ByteDot>(r: &Regions, p: usize, lane: usize, head_dim: usize) {
    let mut codes = [_mm256_setzero_si256(); BLOCK / 4];
    for (quad, code) in codes.iter_mut().enumerate() {
        *code = _mm256_set1_epi32(*r.codes.add(quad * LANES + lane) as i32);
    }
    let tail = r.codes.add(BLOCK / 4 * LANES).cast::<f32>();
    let rescale = _mm256_set1_ps(*tail.add(lane));
    let step = _mm256_set1_ps(*tail.add(LANES + lane));
    let o = r.outputs.add(p * head_dim);
    for c in (0..head_dim).step_by(LANES) {
        let mut acc = _mm256_setzero_si256();
        for (quad, &code) in codes.iter().enumerate() {
            let v = _mm256_loadu_si256(r.values.add(quad * head_dim + c).cast());
            acc = D::dot(acc, code, v);
        }
        let t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), step);
        _mm256_storeu_ps(
            o.add(c),
            _mm256_fmadd_ps(_mm256_loadu_ps(o.add(c)), rescale, t),
        );
    }
}
