//! One block of rows' attention shared by every thread of a team.
//!
//! A sequence's decoding row (or verified draft) attends as one item per KV head, so a
//! team of two takes SmolLM2's three heads 2:1 and Gemma 3's one head 1:0, and at a long
//! context the whole step waits for the thread with the most cache to read.
//! [`attend_rows_shared`] splits one item instead: each thread scores its own run of
//! positions, the team agrees on each row's maximum, each exponentiates its run, and
//! each then forms its own value columns over every position. Every element is the
//! single-thread kernel's chain in the same order: a position's score and exponential
//! depend on nothing but the position and the maximum (a maximum on nothing but the set),
//! the sum of exponentials is one chain in position order (the first thread starts it
//! over its run, each thread carries it over the rest), and an output column is the same
//! fused sum over the positions. So a shared block equals what [`super::attend_rows`]
//! gives, bit for bit, whatever the team's size.

use crate::isa::Isa;
use crate::threadpool::{SharedSlice, Team};

use super::{KvRows, MAX_GROUP, MAX_ROWS};

/// Bytes of keys and values from which a block's attention is worth sharing. Measured on
/// Sapphire Rapids, two threads, 90 caches of SmolLM2's heads (`cargo bench -p
/// pyramid-kernels -- decode_attention_team`), one row shared against one thread per
/// head: f32 at 512 positions (256 KiB a head) 7 % faster, at 2,048 22 %, at 4,096 27 %;
/// INT8 at 512 (64 KiB) 50 % slower (three barriers against a short read), at 2,048
/// (256 KiB) 4 % faster, at 4,096 10 %.
pub const SHARE_MIN_BYTES: usize = 256 << 10;

/// Whether a block over `kv` reads enough cache to be worth [`attend_rows_shared`].
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

/// Floats of the buffer the threads sharing a block of up to `n_rows` rows over up to
/// `n_pos` positions meet in: per row, weights and exponentials per position (eight lanes
/// each), a maximum per thread and a partial sum.
pub fn meeting_len(n_pos: usize, n_rows: usize, n_threads: usize) -> usize {
    (2 * n_pos + n_threads + 1) * n_rows * MAX_GROUP
}

/// Whether [`attend_rows_shared`] takes rows of `head_dim` on `isa`: the vector kernels,
/// whose arithmetic per position and per column it shares.
pub fn can_share(isa: Isa, head_dim: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && matches!(isa, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512 | Isa::Amx)
        && head_dim.is_multiple_of(8)
}

/// [`super::attend_rows`] of a block of consecutive rows (row `r` sees the first
/// `first_len + r` positions of `kv`, which holds exactly the last row's), the work split
/// between the threads of `team`; row `r`'s output `[n_q, head_dim]` goes to
/// `out[out_at[r]..]`. Every thread calls it with the same arguments; it meets them at
/// barriers, in `meeting`, and returns at one: then every output is written and
/// `meeting` is free again.
///
/// # Panics
/// If the shapes disagree, `first_len` is 0, `meeting` is shorter than [`meeting_len`]
/// or `can_share(isa, head_dim)` is false.
///
/// # Safety
/// Every thread of the team makes this call with the same arguments; the output spans do
/// not overlap, and no thread outside this call reads or writes `meeting` or them while
/// it runs.
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_rows_shared(
    team: &Team,
    isa: Isa,
    q: &[&[f32]],
    head_dim: usize,
    kv: KvRows<'_>,
    first_len: usize,
    scale: f32,
    meeting: &SharedSlice<'_, f32>,
    out: &SharedSlice<'_, f32>,
    out_at: &[usize],
) {
    assert!(
        can_share(isa, head_dim),
        "{isa} cannot share rows of head_dim {head_dim}"
    );
    isa.assert_supported();
    let n_rows = q.len();
    let width = q.first().map_or(0, |r| r.len());
    let n_q = width / head_dim;
    assert!(
        (1..=MAX_ROWS).contains(&n_rows)
            && out_at.len() == n_rows
            && width == n_q * head_dim
            && (1..=MAX_GROUP).contains(&n_q)
            && q.iter().all(|r| r.len() == width),
        "1..={MAX_ROWS} query rows of [n_q <= {MAX_GROUP}, head_dim], an output for each"
    );
    assert!(
        kv.is_consistent(head_dim) && first_len >= 1,
        "keys and values must be [n_pos, head_dim] (with a scale per row), every row seeing one"
    );
    let n_pos = first_len + n_rows - 1;
    assert!(
        kv.len() == n_pos * head_dim,
        "the cache must hold exactly the last row's {n_pos} positions"
    );
    assert!(
        meeting.len() >= meeting_len(n_pos, n_rows, team.n_threads()),
        "the meeting buffer holds {} floats, {} needed",
        meeting.len(),
        meeting_len(n_pos, n_rows, team.n_threads())
    );
    assert!(
        out_at
            .iter()
            .all(|&at| at.checked_add(width).is_some_and(|end| end <= out.len())),
        "an output span is outside `out`"
    );
    #[cfg(target_arch = "x86_64")]
    {
        let wide = isa >= Isa::Avx512 && head_dim.is_multiple_of(16);
        let mut out_rows = [std::ptr::null_mut(); MAX_ROWS];
        for (row, &at) in out_rows.iter_mut().zip(out_at) {
            *row = out.as_mut_ptr().add(at);
        }
        // SAFETY: `can_share` held, so the CPU has AVX2, FMA and F16C (and AVX-512 F, BW
        // and VL for `wide`); the shapes were checked above; the caller keeps `meeting`
        // and the output spans to this call's threads, which write disjoint parts of them.
        x86::attend_rows_shared(
            team,
            q,
            head_dim,
            kv,
            first_len,
            scale,
            meeting.as_mut_ptr(),
            &out_rows[..n_rows],
            wide,
        );
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::super::x86::{
        by_group, exponentiate, exponentiate_wide, prefetch_positions, score_pairs_wide,
        score_positions, weighted_sums, wide_pairs, Cache, Weights, Widen, KEYS_AHEAD,
    };
    use super::super::{KvRows, MAX_ROWS};
    use crate::ops::exp_avx2 as exp256;
    use crate::ops::exp_avx512 as exp512;
    use crate::threadpool::{split_range, Team};

    /// What every phase of a shared block reads: the rows, the cache, the meeting buffer.
    struct Block<'a, 'q, T> {
        q: &'a [&'q [f32]],
        cache: &'a Cache<'a, T>,
        first_len: usize,
        n_pos: usize,
        meeting: *mut f32,
    }

    /// The parts of the meeting buffer, laid out as [`super::meeting_len`] counts them.
    /// Safety of each: `r` is below the block's rows, `t` at most the team's size.
    impl<T> Block<'_, '_, T> {
        /// Row `r`'s scores, then weights in place: `[n_pos][8]`.
        unsafe fn weights(&self, r: usize) -> *mut f32 {
            self.meeting.add(r * self.n_pos * 8)
        }

        /// Row `r`'s exponentials before the value rows' scales, where the cache has
        /// them (else its weights are those).
        unsafe fn unscaled(&self, r: usize) -> *mut f32 {
            match self.cache.value_scales {
                Some(_) => self.meeting.add((self.q.len() + r) * self.n_pos * 8),
                None => self.weights(r),
            }
        }

        /// Thread `t`'s maximum of row `r`'s scores.
        unsafe fn maximum(&self, t: usize, r: usize) -> *mut f32 {
            let rows = self.q.len();
            self.meeting.add((2 * rows * self.n_pos + t * rows + r) * 8)
        }

        /// Row `r`'s sum of exponentials over the first thread's run.
        unsafe fn first_sum(&self, n_threads: usize, r: usize) -> *mut f32 {
            self.maximum(n_threads, r)
        }

        /// The positions row `r` sees.
        fn len(&self, r: usize) -> usize {
            self.first_len + r
        }
    }

    /// # Safety
    /// As [`super::attend_rows_shared`] after its checks: `meeting` holds
    /// [`super::meeting_len`] floats, `out` a row pointer per query row.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_rows_shared(
        team: &Team,
        q: &[&[f32]],
        head_dim: usize,
        kv: KvRows<'_>,
        first_len: usize,
        scale: f32,
        meeting: *mut f32,
        out: &[*mut f32],
        wide: bool,
    ) {
        by_group!(
            kv,
            head_dim,
            q[0].len() / head_dim,
            share(team, q, first_len, scale, meeting, out, wide)
        )
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
        cache: &Cache<'_, T>,
        team: &Team,
        q: &[&[f32]],
        first_len: usize,
        scale: f32,
        meeting: *mut f32,
        out: &[*mut f32],
        wide: bool,
    ) {
        let head_dim = cache.head_dim;
        let (n_pos, n_rows) = (cache.keys.len() / head_dim, q.len());
        let block = Block {
            q,
            cache,
            first_len,
            n_pos,
            meeting,
        };
        let (me, n_threads) = (team.idx(), team.n_threads());

        // 1. Every row's scores of this thread's positions, and their maxima.
        let step = if wide { 2 * wide_pairs(NQ) } else { P };
        let run = |thread: usize| split_range(n_pos, n_threads, thread, step);
        let mine = run(me);
        let my_keys = &cache.keys[..mine.end * head_dim];
        let align = if wide { 16 } else { 8 };
        let my_cols = split_range(head_dim, n_threads, me, align);
        let mut max = [_mm256_set1_ps(f32::NEG_INFINITY); MAX_ROWS];
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
            // Rows from the first whose causal window holds position p0.
            let first_row = (p0 + 1).saturating_sub(block.first_len);
            for (r, max_r) in max.iter_mut().enumerate().take(n_rows).skip(first_row) {
                let (q_r, dst) = (block.q.get_unchecked(r).as_ptr(), block.weights(r));
                let seen = (block.len(r).min(mine.end) - p0).min(step);
                if seen == step && wide {
                    score_pairs_wide::<T, NQ>(q_r, cache, p0, scale, dst, max_r);
                } else if seen == step {
                    score_positions::<T, NQ, P>(q_r, cache, p0, scale, dst, max_r);
                } else {
                    for p in p0..p0 + seen {
                        score_positions::<T, NQ, 1>(q_r, cache, p, scale, dst, max_r);
                    }
                }
            }
        }
        for (r, max_r) in max.iter().enumerate().take(n_rows) {
            _mm256_storeu_ps(block.maximum(me, r), *max_r);
        }
        team.sync();

        // 2. Each row's maximum over all positions, and the exponentials of this thread's
        // positions. A row's sum of exponentials is one chain in position order: the
        // first thread starts it over its run, as the single-thread kernel does.
        for r in 0..n_rows {
            let mut max = _mm256_loadu_ps(block.maximum(0, r));
            for other in 1..n_threads {
                max = _mm256_max_ps(max, _mm256_loadu_ps(block.maximum(other, r)));
            }
            let (weights, unscaled) = (block.weights(r), block.unscaled(r));
            let end = block.len(r).min(mine.end);
            if me == 0 {
                let sum = if wide {
                    exponentiate_wide(weights, end, max, cache.value_scales)
                } else {
                    exponentiate(
                        weights,
                        0,
                        end,
                        max,
                        cache.value_scales,
                        _mm256_setzero_ps(),
                    )
                };
                _mm256_storeu_ps(block.first_sum(n_threads, r), sum);
                continue;
            }
            let mut p = mine.start;
            if wide {
                while p + 2 <= end {
                    exponentiate_pair(weights, unscaled, p, max, cache.value_scales);
                    p += 2;
                }
            }
            for p in p..end {
                let at = weights.add(p * 8);
                let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(at), max));
                _mm256_storeu_ps(unscaled.add(p * 8), e);
                if let Some(s) = cache.value_scales {
                    _mm256_storeu_ps(at, _mm256_mul_ps(e, _mm256_set1_ps(*s.get_unchecked(p))));
                }
            }
        }
        team.sync();

        // 3. Each row's chain carried on over the other runs, then this thread's columns
        // of every head and row over all positions.
        let mut inv = [[0.0f32; 8]; MAX_ROWS];
        for (r, inv_r) in inv.iter_mut().enumerate().take(n_rows) {
            let mut sum = _mm256_loadu_ps(block.first_sum(n_threads, r));
            for p in run(0).end..block.len(r) {
                sum = _mm256_add_ps(sum, _mm256_loadu_ps(block.unscaled(r).add(p * 8)));
            }
            _mm256_storeu_ps(inv_r.as_mut_ptr(), _mm256_div_ps(_mm256_set1_ps(1.0), sum));
        }
        let weights = Weights {
            scores: block.meeting,
            n_pos,
            first_len: block.first_len,
            n_rows,
            inv: &inv,
        };
        weighted_sums::<T, NQ, Z>(cache, &weights, out, my_cols, wide);
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

    /// A block shared by teams of two and three equals the block on one thread, bit for
    /// bit, on every ISA that shares: every cache type, group size and head width, one
    /// row to a whole block (which alone would take the tiles), with runs of positions
    /// and columns that do not divide evenly and rows that end inside the first run.
    #[test]
    fn a_shared_block_equals_the_block_on_one_thread_bit_for_bit() {
        let pools = [ThreadPool::new(2).unwrap(), ThreadPool::new(3).unwrap()];
        for (head_dim, n_q, first_len, n_rows) in [
            (64, 3, 1, 1),
            (64, 3, 1000, 1),
            (64, 3, 700, 9),
            (64, 7, 301, 1),
            (64, 7, 1, 5),
            (64, 1, 37, 16),
            (256, 4, 530, 1),
            (48, 5, 99, 3),
            (8, 8, 70, 2),
            (128, 2, 513, 12),
            (40, 6, 45, 7),
        ] {
            let seed = (head_dim * 7 + first_len + n_rows) as u64;
            let width = n_q * head_dim;
            let q = random(n_rows * width, seed);
            let q_rows: Vec<&[f32]> = q.chunks_exact(width).collect();
            let n_pos = first_len + n_rows - 1;
            let caches = Caches::random(n_pos, head_dim, seed + 1);
            for isa in Isa::available() {
                if !can_share(isa, head_dim) {
                    continue;
                }
                for kv in caches.all() {
                    let mut alone = vec![f32::NAN; q.len()];
                    let mut outs: Vec<&mut [f32]> = alone.chunks_exact_mut(width).collect();
                    attend_rows_with(
                        isa,
                        &q_rows,
                        head_dim,
                        kv,
                        first_len,
                        0.3,
                        &mut Vec::new(),
                        &mut outs,
                    );
                    // Row r's output at (2 r + 1) widths: room around each, which no thread
                    // may touch.
                    let out_at: Vec<usize> = (0..n_rows).map(|r| (2 * r + 1) * width).collect();
                    for pool in &pools {
                        let n_threads = pool.n_threads();
                        let mut meeting = vec![f32::NAN; meeting_len(n_pos, n_rows, n_threads)];
                        let mut out = vec![f32::NAN; (2 * n_rows + 1) * width];
                        let (meet, shared_out) =
                            (SharedSlice::new(&mut meeting), SharedSlice::new(&mut out));
                        pool.run_team(&|team| unsafe {
                            attend_rows_shared(
                                team,
                                isa,
                                &q_rows,
                                head_dim,
                                kv,
                                first_len,
                                0.3,
                                &meet,
                                &shared_out,
                                &out_at,
                            )
                        });
                        let what = format!(
                            "{isa}, {n_threads} threads, hd={head_dim} n_q={n_q} \
                             first_len={first_len} rows={n_rows} {:?}",
                            std::mem::discriminant(&kv)
                        );
                        for (r, chunk) in out.chunks_exact(width).enumerate() {
                            if r % 2 == 1 {
                                assert_eq!(chunk, &alone[r / 2 * width..][..width], "{what}");
                            } else {
                                assert!(chunk.iter().all(|v| v.is_nan()), "{what}: gap {r}");
                            }
                        }
                    }
                }
            }
        }
    }
}
