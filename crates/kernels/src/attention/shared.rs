//! One decoding row's attention shared by every thread of a team.
//!
//! A decoding sequence's attention is one item per KV head, so a team of two takes
//! SmolLM2's three heads 2:1 and Gemma 3's one head 1:0, and at a long context the whole
//! step waits for the thread with the most cache to read. [`attend_row_shared`] splits
//! one item instead: each thread scores its own run of positions, the team agrees on the
//! maximum, each exponentiates its run, and each then forms its own value columns over
//! every position. Every element is the single-thread kernel's chain in the same order:
//! a position's score and exponential depend on nothing but the position and the
//! maximum (a maximum on nothing but the set), the sum of exponentials is one chain in
//! position order (the first thread starts it over its run, each thread carries it over
//! the rest), and an output column is the same fused sum over the positions. So a shared
//! row equals the row [`super::attend_rows`] gives, bit for bit, whatever the team's
//! size.

use crate::isa::Isa;
use crate::threadpool::{SharedSlice, Team};

use super::{KvRows, MAX_GROUP};

/// Bytes of keys and values from which a row's attention is worth sharing. Measured on
/// Sapphire Rapids, two threads, 90 caches of SmolLM2's heads (`cargo bench -p
/// pyramid-kernels -- decode_attention_team`), shared against one thread per head: f32
/// at 512 positions (256 KiB a head) 7 % faster, at 2,048 22 %, at 4,096 27 %; INT8 at
/// 512 (64 KiB) 50 % slower (three barriers against a short read), at 2,048 (256 KiB)
/// 4 % faster, at 4,096 10 %.
pub const SHARE_MIN_BYTES: usize = 256 << 10;

/// Whether a row over `kv` reads enough cache to be worth [`attend_row_shared`].
pub fn worth_sharing(kv: KvRows<'_>) -> bool {
    use std::mem::size_of_val;
    let bytes = match kv {
        KvRows::F32 { keys, values } => size_of_val(keys) + size_of_val(values),
        KvRows::F16 { keys, values } => size_of_val(keys) + size_of_val(values),
        KvRows::Int8 {
            keys,
            key_scales,
            values,
            value_scales,
        } => {
            size_of_val(keys)
                + size_of_val(key_scales)
                + size_of_val(values)
                + size_of_val(value_scales)
        }
    };
    bytes >= SHARE_MIN_BYTES
}

/// Floats of the buffer the threads sharing a row of up to `n_pos` positions meet in:
/// weights and exponentials per position (eight lanes each), a maximum per thread and
/// a partial sum.
pub fn meeting_len(n_pos: usize, n_threads: usize) -> usize {
    (2 * n_pos + n_threads + 1) * MAX_GROUP
}

/// Whether [`attend_row_shared`] takes rows of `head_dim` on `isa`: the vector kernels,
/// whose arithmetic per position and per column it shares.
pub fn can_share(isa: Isa, head_dim: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Amx)
        && head_dim.is_multiple_of(8)
}

/// `out[h] = softmax(scale · q[h] · Kᵀ) · V` over every position of `kv`, for the query
/// heads of one KV head (`q` and the output `[n_q, head_dim]`, the output at
/// `out[out_at..]`), the work split between the threads of `team`. Every thread calls it
/// with the same arguments; it meets them at barriers, in `meeting`, and returns at one:
/// then the whole output is written and `meeting` is free again.
///
/// # Panics
/// If the shapes disagree, `kv` is empty, `meeting` is shorter than [`meeting_len`] or
/// `can_share(isa, head_dim)` is false.
///
/// # Safety
/// No thread outside this call reads or writes `meeting` or the output span while it
/// runs.
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_row_shared(
    team: &Team,
    isa: Isa,
    q: &[f32],
    head_dim: usize,
    kv: KvRows<'_>,
    scale: f32,
    meeting: &SharedSlice<'_, f32>,
    out: &SharedSlice<'_, f32>,
    out_at: usize,
) {
    assert!(
        can_share(isa, head_dim),
        "{isa} cannot share rows of head_dim {head_dim}"
    );
    isa.assert_supported();
    let n_q = q.len() / head_dim;
    assert!(
        q.len() == n_q * head_dim && (1..=MAX_GROUP).contains(&n_q),
        "the query must be [n_q <= {MAX_GROUP}, head_dim]"
    );
    assert!(
        kv.is_consistent(head_dim) && kv.len() >= head_dim,
        "keys and values must be [n_pos >= 1, head_dim] (with a scale per row)"
    );
    let n_pos = kv.len() / head_dim;
    assert!(
        meeting.len() >= meeting_len(n_pos, team.n_threads()),
        "the meeting buffer holds {} floats, {} needed",
        meeting.len(),
        meeting_len(n_pos, team.n_threads())
    );
    assert!(
        out_at
            .checked_add(q.len())
            .is_some_and(|end| end <= out.len()),
        "the output span is outside `out`"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let wide = isa >= Isa::Avx512 && head_dim.is_multiple_of(16);
        // SAFETY: `can_share` held, so the CPU has AVX2, FMA and F16C (and AVX-512 F, BW
        // and VL for `wide`); the shapes were checked above; the caller keeps `meeting`
        // and the output span to this call's threads, which write disjoint parts of them.
        x86::attend_row_shared(
            team,
            q,
            head_dim,
            kv,
            scale,
            meeting.as_mut_ptr(),
            out.as_mut_ptr().add(out_at),
            wide,
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::super::x86::{
        exponentiate, exponentiate_wide, prefetch_positions, score_pairs_wide, score_positions,
        weighted_sums, wide_pairs, Cache, Weights, Widen, KEYS_AHEAD,
    };
    use super::super::{KvRows, MAX_ROWS};
    use crate::ops::exp_avx2 as exp256;
    use crate::ops::exp_avx512 as exp512;
    use crate::threadpool::{split_range, Team};

    /// # Safety
    /// As [`super::attend_row_shared`] after its checks: `meeting` holds
    /// [`super::meeting_len`] floats, `out` the `[n_q, head_dim]` output.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_row_shared(
        team: &Team,
        q: &[f32],
        head_dim: usize,
        kv: KvRows<'_>,
        scale: f32,
        meeting: *mut f32,
        out: *mut f32,
        wide: bool,
    ) {
        let q_heads = q.len() / head_dim;
        macro_rules! by_group {
            ($keys:expr, $ks:expr, $values:expr, $vs:expr) => {{
                let cache = Cache {
                    keys: $keys,
                    key_scales: $ks,
                    values: $values,
                    value_scales: $vs,
                    head_dim,
                };
                let q = q.as_ptr();
                // The (positions, columns) per step of `super::super::x86::attend_rows`.
                match q_heads {
                    1 => share::<_, 1, 8, 8>(team, q, &cache, scale, meeting, out, wide),
                    2 => share::<_, 2, 4, 4>(team, q, &cache, scale, meeting, out, wide),
                    3 => share::<_, 3, 3, 2>(team, q, &cache, scale, meeting, out, wide),
                    4 => share::<_, 4, 2, 2>(team, q, &cache, scale, meeting, out, wide),
                    5 => share::<_, 5, 2, 1>(team, q, &cache, scale, meeting, out, wide),
                    6 => share::<_, 6, 2, 1>(team, q, &cache, scale, meeting, out, wide),
                    7 => share::<_, 7, 1, 1>(team, q, &cache, scale, meeting, out, wide),
                    8 => share::<_, 8, 1, 1>(team, q, &cache, scale, meeting, out, wide),
                    n_q => unreachable!("{n_q} query heads: the caller checks 1..=8"),
                }
            }};
        }
        match kv {
            KvRows::F32 { keys, values } => by_group!(keys, None, values, None),
            KvRows::F16 { keys, values } => by_group!(keys, None, values, None),
            KvRows::Int8 {
                keys,
                key_scales,
                values,
                value_scales,
            } => by_group!(keys, Some(key_scales), values, Some(value_scales)),
        }
    }

    /// Asks for columns `cols` of `rows`' positions `positions` (those that exist) in L2:
    /// a hint with no effect on any result.
    #[inline(always)]
    fn prefetch_columns<T>(
        rows: &[T],
        head_dim: usize,
        positions: Range<usize>,
        cols: &Range<usize>,
    ) {
        for p in positions {
            let Some(row) = rows.get(p * head_dim + cols.start..p * head_dim + cols.end) else {
                return;
            };
            let first = row.as_ptr().cast::<i8>();
            for line in (0..std::mem::size_of_val(row)).step_by(64) {
                // SAFETY: `line` is inside `row`; a prefetch reads nothing architecturally.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(first.add(line)) };
            }
        }
    }

    /// Positions `p` and `p + 1` of step 2 in one 16-wide vector: `exp(s - max)` into
    /// `unscaled`, and times each position's value scale (if any) over the scores.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; both buffers and the scales hold both positions.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn exponentiate_pair(
        scores: *mut f32,
        unscaled: *mut f32,
        p: usize,
        max: __m256,
        value_scales: Option<&[f32]>,
    ) {
        let max2 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(max)));
        let at = scores.add(p * 8);
        let e = exp512(_mm512_sub_ps(_mm512_loadu_ps(at), max2));
        _mm512_storeu_ps(unscaled.add(p * 8), e);
        if let Some(s) = value_scales {
            let scales = _mm512_mask_blend_ps(
                0xFF00,
                _mm512_set1_ps(*s.get_unchecked(p)),
                _mm512_set1_ps(*s.get_unchecked(p + 1)),
            );
            _mm512_storeu_ps(at, _mm512_mul_ps(e, scales));
        }
    }

    /// The three phases, each ending at a barrier.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn share<T: Widen, const NQ: usize, const P: usize, const Z: usize>(
        team: &Team,
        q: *const f32,
        cache: &Cache<'_, T>,
        scale: f32,
        meeting: *mut f32,
        out: *mut f32,
        wide: bool,
    ) {
        let head_dim = cache.head_dim;
        let n_pos = cache.keys.len() / head_dim;
        let (me, n_threads) = (team.idx(), team.n_threads());
        // `[n_pos][8]` scores, then weights in place (exponentials times the value rows'
        // scales, where the cache has them); `[n_pos][8]` the exponentials themselves,
        // for a cache with scales; `[n_threads][8]` maxima; the first run's sum.
        let weights = meeting;
        let unscaled = match cache.value_scales {
            Some(_) => meeting.add(n_pos * 8),
            None => weights,
        };
        let maxima = meeting.add(2 * n_pos * 8);
        let first_sum = maxima.add(n_threads * 8);

        // 1. This thread's positions' scores, and their maximum.
        let step = if wide { 2 * wide_pairs(NQ) } else { P };
        let run = |thread: usize| split_range(n_pos, n_threads, thread, step);
        let mine = run(me);
        let my_keys = &cache.keys[..mine.end * head_dim];
        let align = if wide { 16 } else { 8 };
        let my_cols = split_range(head_dim, n_threads, me, align);
        let mut max = _mm256_set1_ps(f32::NEG_INFINITY);
        for p0 in mine.clone().step_by(step) {
            prefetch_positions::<T, _MM_HINT_T0>(my_keys, head_dim, p0 + KEYS_AHEAD, step);
            // The value columns this thread sums in step 3, of every position: as many
            // positions from each thread's run as this step scores of its own.
            for other in 0..n_threads {
                let theirs = run(other);
                let from = theirs.start + (p0 - mine.start);
                let to = (from + step).min(theirs.end);
                prefetch_columns(cache.values, head_dim, from..to, &my_cols);
            }
            let seen = (mine.end - p0).min(step);
            if seen == step && wide {
                score_pairs_wide::<T, NQ>(q, cache, p0, scale, weights, &mut max);
            } else if seen == step {
                score_positions::<T, NQ, P>(q, cache, p0, scale, weights, &mut max);
            } else {
                for p in p0..p0 + seen {
                    score_positions::<T, NQ, 1>(q, cache, p, scale, weights, &mut max);
                }
            }
        }
        _mm256_storeu_ps(maxima.add(me * 8), max);
        team.sync();

        // 2. The maximum of all positions, and this thread's positions' exponentials. The
        // sum of exponentials is one chain in position order: the first thread starts it
        // over its run, as the single-thread kernel does.
        let mut max = _mm256_loadu_ps(maxima);
        for other in 1..n_threads {
            max = _mm256_max_ps(max, _mm256_loadu_ps(maxima.add(other * 8)));
        }
        if me == 0 {
            let sum = if wide {
                exponentiate_wide(weights, mine.end, max, cache.value_scales)
            } else {
                exponentiate(
                    weights,
                    0,
                    mine.end,
                    max,
                    cache.value_scales,
                    _mm256_setzero_ps(),
                )
            };
            _mm256_storeu_ps(first_sum, sum);
        } else {
            let mut p = mine.start;
            if wide {
                while p + 2 <= mine.end {
                    exponentiate_pair(weights, unscaled, p, max, cache.value_scales);
                    p += 2;
                }
            }
            for p in p..mine.end {
                let at = weights.add(p * 8);
                let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(at), max));
                _mm256_storeu_ps(unscaled.add(p * 8), e);
                if let Some(s) = cache.value_scales {
                    _mm256_storeu_ps(at, _mm256_mul_ps(e, _mm256_set1_ps(*s.get_unchecked(p))));
                }
            }
        }
        team.sync();

        // 3. The chain carried on over the other runs, then this thread's columns of
        // every head over all positions.
        let mut sum = _mm256_loadu_ps(first_sum);
        for p in run(0).end..n_pos {
            sum = _mm256_add_ps(sum, _mm256_loadu_ps(unscaled.add(p * 8)));
        }
        let mut inv = [[0.0f32; 8]; MAX_ROWS];
        _mm256_storeu_ps(inv[0].as_mut_ptr(), _mm256_div_ps(_mm256_set1_ps(1.0), sum));
        let weights = Weights {
            scores: weights,
            n_pos,
            first_len: n_pos,
            n_rows: 1,
            inv: &inv,
        };
        weighted_sums::<T, NQ, Z>(cache, &weights, &[out], my_cols, wide);
        team.sync();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::Caches;
    use super::*;
    use crate::attention::attend_rows_with;
    use crate::test_support::random;
    use crate::threadpool::ThreadPool;

    /// A row shared by teams of two and three equals the row alone, bit for bit, on
    /// every ISA that shares: every cache type, group size and head width, with runs of
    /// positions and columns that do not divide evenly.
    #[test]
    fn a_shared_row_equals_the_row_alone_bit_for_bit() {
        let pools = [ThreadPool::new(2).unwrap(), ThreadPool::new(3).unwrap()];
        for (head_dim, n_q, n_pos) in [
            (64, 3, 1),
            (64, 3, 1000),
            (64, 7, 301),
            (64, 1, 37),
            (256, 4, 530),
            (48, 5, 99),
            (8, 8, 70),
            (128, 2, 513),
            (40, 6, 45),
        ] {
            let seed = (head_dim * 7 + n_pos) as u64;
            let q = random(n_q * head_dim, seed);
            let caches = Caches::random(n_pos, head_dim, seed + 1);
            for isa in Isa::available() {
                if !can_share(isa, head_dim) {
                    continue;
                }
                for kv in caches.all() {
                    let mut alone = vec![f32::NAN; q.len()];
                    attend_rows_with(
                        isa,
                        &[&q],
                        head_dim,
                        kv,
                        n_pos,
                        0.3,
                        &mut Vec::new(),
                        &mut [&mut alone],
                    );
                    for pool in &pools {
                        let mut meeting = vec![f32::NAN; meeting_len(n_pos, pool.n_threads())];
                        // Room on both sides, which no thread may touch.
                        let mut out = vec![f32::NAN; q.len() + 2 * head_dim];
                        let (meet, shared_out) =
                            (SharedSlice::new(&mut meeting), SharedSlice::new(&mut out));
                        pool.run_team(&|team| unsafe {
                            attend_row_shared(
                                team,
                                isa,
                                &q,
                                head_dim,
                                kv,
                                0.3,
                                &meet,
                                &shared_out,
                                head_dim,
                            )
                        });
                        let what = format!(
                            "{isa}, {} threads, hd={head_dim} n_q={n_q} n_pos={n_pos} {:?}",
                            pool.n_threads(),
                            std::mem::discriminant(&kv)
                        );
                        assert_eq!(&out[head_dim..head_dim + q.len()], &alone[..], "{what}");
                        assert!(out[..head_dim].iter().all(|v| v.is_nan()), "{what}");
                        assert!(
                            out[head_dim + q.len()..].iter().all(|v| v.is_nan()),
                            "{what}"
                        );
                    }
                }
            }
        }
    }
}
