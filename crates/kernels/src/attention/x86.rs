//! The AVX2 and AVX-512 kernels of [`super::attend_rows`]: a block's rows one at a time
//! against each key row, with the row's arithmetic fixed whatever the block.

use std::arch::x86_64::*;
use std::ops::Range;

use half::f16;

use super::{KvRows, MAX_GROUP, MAX_ROWS};
use crate::ops::exp_avx2 as exp256;
use crate::ops::exp_avx512 as exp512;

/// A cache element type: eight of them widen to one f32 vector.
pub(super) trait Widen: Copy {
    /// The rows themselves where they are f32 already, so need no widening.
    fn as_f32(rows: &[Self]) -> Option<&[f32]>;

    /// # Safety
    /// Eight elements are readable at `p`; the CPU has AVX2 and F16C.
    unsafe fn load8(p: *const Self) -> __m256;

    /// # Safety
    /// Sixteen elements are readable at `p`; the CPU has AVX-512 F and BW.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Widen for f32 {
    fn as_f32(rows: &[Self]) -> Option<&[f32]> {
        Some(rows)
    }

    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn load8(p: *const Self) -> __m256 {
        _mm256_loadu_ps(p)
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    unsafe fn load16(p: *const Self) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl Widen for f16 {
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }

    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn load8(p: *const Self) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    unsafe fn load16(p: *const Self) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
}

impl Widen for i8 {
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }

    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn load8(p: *const Self) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())))
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    unsafe fn load16(p: *const Self) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())))
    }
}

/// `$run::<T, NQ, P, Z>(&cache, args..)` with `kv`'s rows as a [`Cache`] of their storage
/// type and `$n_q` query heads: the positions (`P`) and value column chunks (`Z`) a step
/// takes for each group size, chosen here for the block kernel and the shared one alike.
macro_rules! by_group {
    ($kv:expr, $head_dim:expr, $n_q:expr, $run:ident($($arg:expr),*)) => {
        match $kv {
            KvRows::F32 { keys, values } => {
                by_group!(@heads keys, None, values, None, $head_dim, $n_q, $run($($arg),*))
            }
            KvRows::F16 { keys, values } => {
                by_group!(@heads keys, None, values, None, $head_dim, $n_q, $run($($arg),*))
            }
            KvRows::Int8 {
                keys,
                key_scales,
                values,
                value_scales,
            } => by_group!(
                @heads keys, Some(key_scales), values, Some(value_scales), $head_dim, $n_q,
                $run($($arg),*)
            ),
        }
    };
    (@heads $keys:expr, $ks:expr, $values:expr, $vs:expr, $head_dim:expr, $n_q:expr,
     $run:ident($($arg:expr),*)) => {{
        let cache = Cache {
            keys: $keys,
            key_scales: $ks,
            values: $values,
            value_scales: $vs,
            head_dim: $head_dim,
        };
        match $n_q {
            1 => $run::<_, 1, 8, 8>(&cache, $($arg),*),
            2 => $run::<_, 2, 4, 4>(&cache, $($arg),*),
            3 => $run::<_, 3, 3, 2>(&cache, $($arg),*),
            4 => $run::<_, 4, 2, 2>(&cache, $($arg),*),
            5 => $run::<_, 5, 2, 1>(&cache, $($arg),*),
            6 => $run::<_, 6, 2, 1>(&cache, $($arg),*),
            7 => $run::<_, 7, 1, 1>(&cache, $($arg),*),
            8 => $run::<_, 8, 1, 1>(&cache, $($arg),*),
            n_q => unreachable!(
                "{n_q} query heads: the caller checks 1..={}",
                $crate::attention::MAX_GROUP
            ),
        }
    }};
}
pub(super) use by_group;

/// # Safety
/// The CPU has AVX2, FMA and F16C; `head_dim` is a multiple of 8; the shapes are as
/// [`super::attend_rows_with`] checks, with at least one query head, `first_len >= 1`
/// and `kv` holding exactly the last row's positions. `wide`: the CPU has AVX-512 (F,
/// BW, VL) and `head_dim` is a multiple of 16, so the 16-lane paths may run.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_rows(
    q: &[&[f32]],
    head_dim: usize,
    kv: KvRows<'_>,
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
    wide: bool,
) {
    by_group!(
        kv,
        head_dim,
        q[0].len() / head_dim,
        rows(q, first_len, scale, scratch, out, wide)
    )
}

/// One KV head's rows in their storage type.
pub(super) struct Cache<'a, T> {
    pub(super) keys: &'a [T],
    pub(super) key_scales: Option<&'a [f32]>,
    pub(super) values: &'a [T],
    pub(super) value_scales: Option<&'a [f32]>,
    pub(super) head_dim: usize,
}

/// Scores are kept position-major per row, `[n_rows][n_pos][8]` with head `h` in lane
/// `h`, so the softmax of all heads runs on whole vectors. Row `r`'s products, sums and
/// exponentials are the same operations in the same order whatever `n_rows` is: the
/// loops over rows only sit inside the loops over positions, so that a key row and a
/// block of value rows are read once for every query row.
///
/// A sum of products is a chain of fused multiply-adds, each waiting for the last. A
/// group of few heads (SmolLM2 has three per KV head) gives too few chains to keep the
/// multipliers busy, so the scores take `P` positions and the weighted sums `Z`
/// eight-wide column chunks at once: more independent chains, and every element still
/// the same chain in the same order, so the results do not depend on `P` or `Z`.
/// `wide` (AVX-512) runs the same chains two positions to a vector: scores in pairs
/// ([`score_pairs_wide`]), exponentials and weighted sums 16 lanes at a time.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows<T: Widen, const NQ: usize, const P: usize, const Z: usize>(
    cache: &Cache<'_, T>,
    q: &[&[f32]],
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
    wide: bool,
) {
    const { assert!(NQ <= MAX_GROUP) };
    let head_dim = cache.head_dim;
    let n_rows = q.len();
    let n_pos = cache.keys.len() / head_dim;
    let len = |r: usize| first_len + r;
    // A row's scores are written for every position it sees before any is read, so the
    // buffer only grows and is never cleared (clearing it wrote 32 bytes per position and
    // row on every call).
    if scratch.len() < n_rows * n_pos * 8 {
        scratch.resize(n_rows * n_pos * 8, 0.0);
    }
    let scores = scratch.as_mut_ptr();
    let row_scores = |r: usize| scores.add(r * n_pos * 8);

    // Scores, and their running maximum per row and head, `step` positions at a time.
    let mut max = [_mm256_set1_ps(f32::NEG_INFINITY); MAX_ROWS];
    let step = if wide { 2 * wide_pairs(NQ) } else { P };
    for p0 in (0..n_pos).step_by(step) {
        // A decoding batch reads each sequence's cache once per step, from memory rather
        // than cache: the keys a few steps on and the values this step's weighted sums
        // will read are asked for now, so the loads below do not wait for them.
        prefetch_positions::<T, _MM_HINT_T0>(cache.keys, head_dim, p0 + KEYS_AHEAD, step);
        prefetch_positions::<T, _MM_HINT_T1>(cache.values, head_dim, p0, step);
        // Rows from the first whose causal window holds position p0.
        let first_row = (p0 + 1).saturating_sub(first_len);
        for (r, max_r) in max.iter_mut().enumerate().take(n_rows).skip(first_row) {
            let q_r = q.get_unchecked(r).as_ptr();
            let seen = (len(r) - p0).min(step);
            if seen == step && wide {
                score_pairs_wide::<T, NQ>(q_r, cache, p0, scale, row_scores(r), max_r);
            } else if seen == step {
                score_positions::<T, NQ, P>(q_r, cache, p0, scale, row_scores(r), max_r);
            } else {
                for p in p0..p0 + seen {
                    score_positions::<T, NQ, 1>(q_r, cache, p, scale, row_scores(r), max_r);
                }
            }
        }
    }

    // exp(s - max) in place, a value row's scale folded in; the sum stays unscaled.
    let mut inv = [[0.0f32; 8]; MAX_ROWS];
    for r in 0..n_rows {
        let (at, value_scales) = (row_scores(r), cache.value_scales);
        let sum = if wide {
            exponentiate_wide(at, len(r), max[r], value_scales)
        } else {
            exponentiate(at, 0, len(r), max[r], value_scales, _mm256_setzero_ps())
        };
        _mm256_storeu_ps(inv[r].as_mut_ptr(), _mm256_div_ps(_mm256_set1_ps(1.0), sum));
    }

    let weights = Weights {
        scores,
        n_pos,
        first_len,
        n_rows,
        inv: &inv,
    };
    let mut out_rows = [std::ptr::null_mut(); MAX_ROWS];
    for (o, row) in out_rows.iter_mut().zip(out.iter_mut()) {
        *o = row.as_mut_ptr();
    }
    weighted_sums::<T, NQ, Z>(cache, &weights, &out_rows[..n_rows], 0..head_dim, wide);
}

/// Output columns `cols` (whole eight-wide chunks, or 16-wide with `wide`) of every head
/// of the rows at `out`, each `[NQ, head_dim]`.
///
/// # Safety
/// As [`rows`]; no other thread writes these columns of the rows while this runs.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn weighted_sums<T: Widen, const NQ: usize, const Z: usize>(
    cache: &Cache<'_, T>,
    weights: &Weights<'_>,
    out: &[*mut f32],
    cols: Range<usize>,
    wide: bool,
) {
    if wide {
        weighted_sums_wide::<T, NQ>(cache, weights, out, cols);
        return;
    }
    let (mut c, end) = (cols.start / 8, cols.end / 8);
    while c < end {
        if end - c >= Z {
            columns::<T, NQ, Z>(cache, weights, out, c);
            c += Z;
        } else {
            columns::<T, NQ, 1>(cache, weights, out, c);
            c += 1;
        }
    }
}

/// Positions the score loop asks for keys ahead of the ones it reads.
pub(super) const KEYS_AHEAD: usize = 16;

/// Asks the memory system for every cache line of positions `from..from + n` of `rows`
/// (`head_dim` elements each), those that exist: a hint (`_MM_HINT_T0` into L1,
/// `_MM_HINT_T1` into L2) with no effect on any result, for streams too short for the
/// hardware prefetcher to catch up with, such as a decoding sequence's rows of one head.
#[inline(always)]
pub(super) fn prefetch_positions<T, const HINT: i32>(
    rows: &[T],
    head_dim: usize,
    from: usize,
    n: usize,
) {
    let end = ((from + n) * head_dim).min(rows.len());
    let wanted = &rows[(from * head_dim).min(end)..end];
    let first = wanted.as_ptr().cast::<i8>();
    for line in (0..std::mem::size_of_val(wanted)).step_by(64) {
        // SAFETY: `line` is inside `wanted`; a prefetch reads nothing architecturally.
        unsafe { _mm_prefetch::<HINT>(first.add(line)) };
    }
}

/// Replaces one row's scores of positions `from..to` (`scores[p][..8]`) by `exp(s - max)`
/// times the position's value scale, if any; returns `sum` plus the exponentials, added
/// in position order.
///
/// # Safety
/// The CPU has AVX2 and FMA; `scores` holds the positions, `value_scales` (if any) too.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn exponentiate(
    scores: *mut f32,
    from: usize,
    to: usize,
    max: __m256,
    value_scales: Option<&[f32]>,
    mut sum: __m256,
) -> __m256 {
    for p in from..to {
        let at = scores.add(p * 8);
        let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(at), max));
        sum = _mm256_add_ps(sum, e);
        let weight = match value_scales {
            Some(s) => _mm256_mul_ps(e, _mm256_set1_ps(*s.get_unchecked(p))),
            None => e,
        };
        _mm256_storeu_ps(at, weight);
    }
    sum
}

/// [`exponentiate`] of positions `0..len`, two positions to a 16-wide vector: the same
/// operations per lane, and the sum still taken one position after the other.
///
/// # Safety
/// As [`exponentiate`], and the CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
pub(super) unsafe fn exponentiate_wide(
    scores: *mut f32,
    len: usize,
    max: __m256,
    value_scales: Option<&[f32]>,
) -> __m256 {
    let max2 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(max)));
    let mut sum = _mm256_setzero_ps();
    let pairs = len / 2 * 2;
    for p in (0..pairs).step_by(2) {
        let at = scores.add(p * 8);
        let e = exp512(_mm512_sub_ps(_mm512_loadu_ps(at), max2));
        let first = _mm512_castps512_ps256(e);
        let second = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e)));
        sum = _mm256_add_ps(_mm256_add_ps(sum, first), second);
        let weight = match value_scales {
            Some(s) => _mm512_mul_ps(
                e,
                _mm512_mask_blend_ps(
                    0xFF00,
                    _mm512_set1_ps(*s.get_unchecked(p)),
                    _mm512_set1_ps(*s.get_unchecked(p + 1)),
                ),
            ),
            None => e,
        };
        _mm512_storeu_ps(at, weight);
    }
    exponentiate(scores, pairs, len, max, value_scales, sum)
}

/// One query row's scores of positions `p0..p0 + P` (each the lane sums of its heads'
/// products, times the scale), stored at `dst[p][..8]` and folded into `max`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `q_r` holds `NQ` heads of `head_dim`, the cache
/// holds the positions and `dst` has room for them.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn score_positions<T: Widen, const NQ: usize, const P: usize>(
    q_r: *const f32,
    cache: &Cache<'_, T>,
    p0: usize,
    scale: f32,
    dst: *mut f32,
    max: &mut __m256,
) {
    let head_dim = cache.head_dim;
    let keys = cache.keys.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); 8]; P];
    for c in 0..head_dim / 8 {
        let mut k = [_mm256_setzero_ps(); P];
        for (i, k_i) in k.iter_mut().enumerate() {
            *k_i = T::load8(keys.add((p0 + i) * head_dim + c * 8));
        }
        for h in 0..NQ {
            let q_hc = _mm256_loadu_ps(q_r.add(h * head_dim + c * 8));
            for (acc_i, k_i) in acc.iter_mut().zip(&k) {
                acc_i[h] = _mm256_fmadd_ps(q_hc, *k_i, acc_i[h]);
            }
        }
    }
    for (i, acc_i) in acc.iter().enumerate() {
        let p = p0 + i;
        let row_scale = cache
            .key_scales
            .map_or(scale, |s| scale * *s.get_unchecked(p));
        let s = _mm256_mul_ps(sum_lanes::<NQ>(acc_i), _mm256_set1_ps(row_scale));
        _mm256_storeu_ps(dst.add(p * 8), s);
        *max = _mm256_max_ps(*max, s);
    }
}

/// Position pairs [`score_pairs_wide`] takes at once for a group of `nq` heads: as many
/// sums as fit in 32 registers beside the keys.
pub(super) const fn wide_pairs(nq: usize) -> usize {
    match nq {
        1..=3 => 4,
        4..=6 => 2,
        _ => 1,
    }
}

/// [`score_positions`] of `2 · wide_pairs(NQ)` positions with AVX-512: two positions
/// to a vector, lanes 0–7 the first one's and 8–15 the second's, so every lane is the
/// 8-wide path's chain and the lane sums its additions, on half the instructions.
///
/// # Safety
/// As [`score_positions`], and the CPU has AVX-512 F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn score_pairs_wide<T: Widen, const NQ: usize>(
    q_r: *const f32,
    cache: &Cache<'_, T>,
    p0: usize,
    scale: f32,
    dst: *mut f32,
    max: &mut __m256,
) {
    match wide_pairs(NQ) {
        4 => score_pairs::<T, NQ, 4>(q_r, cache, p0, scale, dst, max),
        2 => score_pairs::<T, NQ, 2>(q_r, cache, p0, scale, dst, max),
        _ => score_pairs::<T, NQ, 1>(q_r, cache, p0, scale, dst, max),
    }
}

/// Two 8-lane vectors as one 16-lane one, `lo` in lanes 0–7.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn join(lo: __m256, hi: __m256) -> __m512 {
    let lo = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(hi)))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn score_pairs<T: Widen, const NQ: usize, const PAIRS: usize>(
    q_r: *const f32,
    cache: &Cache<'_, T>,
    p0: usize,
    scale: f32,
    dst: *mut f32,
    max: &mut __m256,
) {
    let head_dim = cache.head_dim;
    let keys = cache.keys.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); 8]; PAIRS];
    for c in 0..head_dim / 8 {
        let mut k = [_mm512_setzero_ps(); PAIRS];
        for (i, k_i) in k.iter_mut().enumerate() {
            let first = keys.add((p0 + 2 * i) * head_dim + c * 8);
            *k_i = join(T::load8(first), T::load8(first.add(head_dim)));
        }
        for h in 0..NQ {
            let q_hc = _mm256_loadu_ps(q_r.add(h * head_dim + c * 8));
            let q_hc = join(q_hc, q_hc);
            for (acc_i, k_i) in acc.iter_mut().zip(&k) {
                acc_i[h] = _mm512_fmadd_ps(q_hc, *k_i, acc_i[h]);
            }
        }
    }
    for (i, acc_i) in acc.iter().enumerate() {
        let sums = sum_lane_pairs::<NQ>(acc_i);
        let halves = [
            _mm512_castps512_ps256(sums),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sums))),
        ];
        for (j, half) in halves.into_iter().enumerate() {
            let p = p0 + 2 * i + j;
            let row_scale = cache
                .key_scales
                .map_or(scale, |s| scale * *s.get_unchecked(p));
            let s = _mm256_mul_ps(half, _mm256_set1_ps(row_scale));
            _mm256_storeu_ps(dst.add(p * 8), s);
            *max = _mm256_max_ps(*max, s);
        }
    }
}

/// [`sum_lanes`] of two positions at once: `acc[h]` holds head `h`'s sums of the first
/// position in lanes 0–7 and of the second in 8–15; so does the result, head `h` in
/// lane `h` of each half. The same additions of the same operands as [`sum_lanes`].
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn sum_lane_pairs<const NQ: usize>(acc: &[__m512; 8]) -> __m512 {
    // `vhaddps` within each 128-bit lane, which AVX-512 lacks: [a0+a1, a2+a3, b0+b1, b2+b3].
    let hadd = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_ps::<0b10_00_10_00>(a, b),
            _mm512_shuffle_ps::<0b11_01_11_01>(a, b),
        )
    };
    let s0123 = hadd(hadd(acc[0], acc[1]), hadd(acc[2], acc[3]));
    let s4567 = if NQ <= 4 {
        _mm512_setzero_ps()
    } else {
        hadd(hadd(acc[4], acc[5]), hadd(acc[6], acc[7]))
    };
    // 128-bit lanes: s0123 = [A0, A1, B0, B1] (A the first position, B the second),
    // s4567 = [C0, C1, D0, D1]; the sums are [A0 + A1, B0 + B1, C0 + C1, D0 + D1].
    let sums = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(s0123, s4567),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(s0123, s4567),
    );
    // [A, C, B, D]: the first position's eight heads, then the second's.
    _mm512_shuffle_f32x4::<0b11_01_10_00>(sums, sums)
}

/// Each row's softmax weights, `[n_rows][n_pos][8]`, and its heads' `1 / Σ exp`.
pub(super) struct Weights<'a> {
    pub(super) scores: *const f32,
    pub(super) n_pos: usize,
    pub(super) first_len: usize,
    pub(super) n_rows: usize,
    pub(super) inv: &'a [[f32; 8]; MAX_ROWS],
}

impl Weights<'_> {
    /// Row `r`'s weights of position `p`, head `h` in lane `h`.
    ///
    /// # Safety
    /// `r < n_rows`, `p < n_pos`.
    unsafe fn at(&self, r: usize, p: usize) -> *const f32 {
        self.scores.add((r * self.n_pos + p) * 8)
    }

    /// The first row whose causal window holds position `p`.
    fn first_row_seeing(&self, p: usize) -> usize {
        (p + 1).saturating_sub(self.first_len)
    }
}

/// `out[r][h] = inv[r][h] · Σ_p w[r][p][h] · v[p]` for output columns `8 c0..8 (c0 +
/// Z)` of every head; each row's sums carried across value blocks in `partial` (stored
/// and reloaded exactly), so every element is the same fused sum over `p` in order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn columns<T: Widen, const NQ: usize, const Z: usize>(
    cache: &Cache<'_, T>,
    weights: &Weights<'_>,
    out: &[*mut f32],
    c0: usize,
) {
    let head_dim = cache.head_dim;
    let values = cache.values.as_ptr();
    let mut partial = [[[_mm256_setzero_ps(); Z]; NQ]; MAX_ROWS];
    for block in (0..weights.n_pos).step_by(super::VALUE_BLOCK) {
        let first_row = weights.first_row_seeing(block);
        let rows = partial.iter_mut().enumerate().take(weights.n_rows);
        for (r, part) in rows.skip(first_row) {
            let end = (block + super::VALUE_BLOCK).min(weights.first_len + r);
            let mut acc = *part;
            for p in block..end {
                let row = values.add(p * head_dim + c0 * 8);
                let w = weights.at(r, p);
                let mut w_h = [_mm256_setzero_ps(); NQ];
                for (h, w_h) in w_h.iter_mut().enumerate() {
                    *w_h = _mm256_broadcast_ss(&*w.add(h));
                }
                for j in 0..Z {
                    let v = T::load8(row.add(8 * j));
                    for (acc_h, w_h) in acc.iter_mut().zip(&w_h) {
                        acc_h[j] = _mm256_fmadd_ps(*w_h, v, acc_h[j]);
                    }
                }
            }
            *part = acc;
        }
    }
    for (r, &o) in out.iter().enumerate() {
        for (h, acc_h) in partial[r].iter().enumerate() {
            let inv = _mm256_set1_ps(weights.inv[r][h]);
            for (j, a) in acc_h.iter().enumerate() {
                let at = o.add(h * head_dim + (c0 + j) * 8);
                _mm256_storeu_ps(at, _mm256_mul_ps(*a, inv));
            }
        }
    }
}

/// [`columns`] with 16-wide vectors, 32 output columns of every head at a time
/// (32 registers hold the sums of up to eight heads): one weight broadcast feeds two
/// products instead of one, and the loads no longer bound the products. The same fused
/// sum per element in the same order, so the results equal the 8-wide ones bit for bit.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn weighted_sums_wide<T: Widen, const NQ: usize>(
    cache: &Cache<'_, T>,
    weights: &Weights<'_>,
    out: &[*mut f32],
    cols: Range<usize>,
) {
    let (mut d, end) = (cols.start, cols.end);
    while d < end {
        // A pass over the positions per 64 columns where the sums fit in registers (four
        // heads or fewer), so a row of 64 values is read once as one stream, not in
        // halves by two passes.
        if NQ <= 4 && end - d >= 64 {
            columns_wide::<T, NQ, 4>(cache, weights, out, d);
            d += 64;
        } else if end - d >= 32 {
            columns_wide::<T, NQ, 2>(cache, weights, out, d);
            d += 32;
        } else {
            columns_wide::<T, NQ, 1>(cache, weights, out, d);
            d += 16;
        }
    }
}

/// Output columns `d0..d0 + 16 Z` of every head and row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn columns_wide<T: Widen, const NQ: usize, const Z: usize>(
    cache: &Cache<'_, T>,
    weights: &Weights<'_>,
    out: &[*mut f32],
    d0: usize,
) {
    let head_dim = cache.head_dim;
    let values = cache.values.as_ptr();
    let mut partial = [[[_mm512_setzero_ps(); Z]; NQ]; MAX_ROWS];
    for block in (0..weights.n_pos).step_by(super::VALUE_BLOCK) {
        let first_row = weights.first_row_seeing(block);
        let rows = partial.iter_mut().enumerate().take(weights.n_rows);
        for (r, part) in rows.skip(first_row) {
            let end = (block + super::VALUE_BLOCK).min(weights.first_len + r);
            let mut acc = *part;
            for p in block..end {
                let row = values.add(p * head_dim + d0);
                let v: [__m512; Z] = std::array::from_fn(|j| T::load16(row.add(16 * j)));
                let w = weights.at(r, p);
                for (h, acc_h) in acc.iter_mut().enumerate() {
                    let w_h = _mm512_set1_ps(*w.add(h));
                    for (a, v_j) in acc_h.iter_mut().zip(&v) {
                        *a = _mm512_fmadd_ps(w_h, *v_j, *a);
                    }
                }
            }
            *part = acc;
        }
    }
    for (r, &o) in out.iter().enumerate() {
        for (h, acc_h) in partial[r].iter().enumerate() {
            let inv = _mm512_set1_ps(weights.inv[r][h]);
            for (j, a) in acc_h.iter().enumerate() {
                _mm512_storeu_ps(o.add(h * head_dim + d0 + 16 * j), _mm512_mul_ps(*a, inv));
            }
        }
    }
}

/// The eight horizontal sums of `acc`, lane `h` holding `Σ acc[h]`, where the heads
/// from `NQ` on are zero. Lanes 0–3 come from heads 0–3 alone and lanes 4–7 from
/// heads 4–7, so with four heads or fewer the upper half is a sum of zeros (zero) and
/// is not computed: half the shuffles of a score, bit for bit the same lanes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn sum_lanes<const NQ: usize>(acc: &[__m256; 8]) -> __m256 {
    let s01 = _mm256_hadd_ps(acc[0], acc[1]);
    let s23 = _mm256_hadd_ps(acc[2], acc[3]);
    let s0123 = _mm256_hadd_ps(s01, s23);
    if NQ <= 4 {
        let halves = _mm_add_ps(
            _mm256_castps256_ps128(s0123),
            _mm256_extractf128_ps::<1>(s0123),
        );
        return _mm256_zextps128_ps256(halves);
    }
    let s45 = _mm256_hadd_ps(acc[4], acc[5]);
    let s67 = _mm256_hadd_ps(acc[6], acc[7]);
    let s4567 = _mm256_hadd_ps(s45, s67);
    // Each 128-bit half now holds partial sums of heads 0-3 / 4-7 in lane order.
    let lo = _mm256_permute2f128_ps::<0x20>(s0123, s4567);
    let hi = _mm256_permute2f128_ps::<0x31>(s0123, s4567);
    _mm256_add_ps(lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::random;

    /// Rows of `q` through [`rows`] with `P` positions and `Z` column chunks at once.
    fn run<T: Widen, const NQ: usize, const P: usize, const Z: usize>(
        q: &[Vec<f32>],
        cache: &Cache<'_, T>,
        first_len: usize,
    ) -> Vec<Vec<f32>> {
        let q_rows: Vec<&[f32]> = q.iter().map(Vec::as_slice).collect();
        let mut out = vec![vec![f32::NAN; q[0].len()]; q.len()];
        let mut outs: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
        // SAFETY: the caller checked AVX2, FMA and F16C; `check` gives a head_dim that
        // is a multiple of 8, NQ heads per row and a cache of exactly the last row's
        // positions.
        unsafe {
            rows::<T, NQ, P, Z>(
                cache,
                &q_rows,
                first_len,
                0.3,
                &mut Vec::new(),
                &mut outs,
                false,
            )
        };
        out
    }

    /// `rows::<NQ, P, Z>` equals `rows::<NQ, 1, 1>` bit for bit on f32 and INT8
    /// caches, across value blocks, with position groups and column chunks left over.
    fn check<const NQ: usize, const P: usize, const Z: usize>() {
        let (head_dim, first_len, n_rows) = (40, 70, 5);
        let n_pos = first_len + n_rows - 1;
        let q: Vec<Vec<f32>> = (0..n_rows)
            .map(|r| random(NQ * head_dim, 10 + r as u64))
            .collect();
        let (keys, values) = (random(n_pos * head_dim, 1), random(n_pos * head_dim, 2));
        let to_i8 = |v: &[f32]| -> Vec<i8> { v.iter().map(|x| (x * 127.0) as i8).collect() };
        let (keys_q, values_q) = (to_i8(&keys), to_i8(&values));
        let scales: Vec<f32> = random(n_pos, 3).iter().map(|s| s.abs() + 0.01).collect();
        let f32_cache = Cache {
            keys: &keys[..],
            key_scales: None,
            values: &values[..],
            value_scales: None,
            head_dim,
        };
        let i8_cache = Cache {
            keys: &keys_q[..],
            key_scales: Some(&scales[..]),
            values: &values_q[..],
            value_scales: Some(&scales[..]),
            head_dim,
        };
        assert_eq!(
            run::<_, NQ, P, Z>(&q, &f32_cache, first_len),
            run::<_, NQ, 1, 1>(&q, &f32_cache, first_len),
            "f32, {NQ} heads, P={P}, Z={Z}"
        );
        assert_eq!(
            run::<_, NQ, P, Z>(&q, &i8_cache, first_len),
            run::<_, NQ, 1, 1>(&q, &i8_cache, first_len),
            "int8, {NQ} heads, P={P}, Z={Z}"
        );
    }

    #[test]
    fn positions_and_columns_taken_together_change_no_bit() {
        if !crate::isa::Isa::available().contains(&crate::isa::Isa::Avx2) {
            return;
        }
        check::<1, 8, 8>();
        check::<2, 4, 4>();
        check::<3, 3, 2>();
        check::<4, 2, 2>();
        check::<6, 2, 1>();
        check::<3, 5, 3>();
    }
}
