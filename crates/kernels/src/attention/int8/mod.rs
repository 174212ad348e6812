//! Attention in INT8 products over an INT8 cache (`--attention int8`): flash attention,
//! its two matrix products in bytes.
//!
//! The exact kernels ([`super::attend_rows`]) widen every cached key and value to f32 and
//! keep every position's score for a two-pass softmax; at a depth of thousands of
//! positions their f32 multiply-adds, not the weights', are what prefill costs. Here:
//! - **Q·K** in integers: each (row, head) query is quantised once to INT8 with one scale
//!   ([`quantize_row`], as the cache's rows are), so a score is an exact integer dot of
//!   bytes times two scales. `vpdpbusd` (AVX-512 VNNI, AVX-VNNI) or `vpmaddubsw` (AVX2)
//!   does four products per lane, four to sixteen times the f32 rate.
//! - **Online softmax** per [`BLOCK`] of positions, in f32: a running maximum `m`, sum
//!   `l` and output `o`, rescaled by `exp(m_old - m_new)` as a new block raises the
//!   maximum, so nothing per position outlives its block. A block's exponentials are
//!   summed in a fixed tree ([`block_sum`]).
//! - **P·V** in integers: a block's weights times the value rows' scales are quantised to
//!   `[0, 127]` against the block's own largest, so a block's small weights are not lost
//!   to another block's large ones; the block's integer sums fold into `o` with that step.
//!
//! Every (row, head) pair is computed on its own, in one fixed order of f32 operations
//! that does not depend on which other pairs share its vector, its tile or its thread,
//! and the integer dots are exact however they are summed. So the vector kernels equal
//! the scalar oracle ([`attend_pair`]) bit for bit, a verified draft's rows equal plain
//! decoding, chunked prefill equals whole prefill, and any thread count gives the same
//! bits. Positions past a pair's length, and blocks past its end, change nothing in it
//! exactly (a weight of 0, a rescale by `exp(0) = 1`).
//!
//! The vector kernels put (row, head) pairs in the lanes (16 to a tile on AVX-512, 8 on
//! AVX2): a broadcast key quad meets every pair's query quad in one product, for a
//! decoding row's heads as for a prompt block's rows. The weighted sums turn the other
//! way, the value columns in the lanes: each block's values are interleaved once into
//! quads of positions per column ([`interleaved_column`] gives the order) and meet one
//! broadcast quad of weights per pair.

use super::{check_block, KvRows};
use crate::int8::quantize_row;
use crate::isa::{self, Isa};
use crate::ops::exp_scalar;

#[cfg(target_arch = "x86_64")]
mod avx256;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod regions;

/// Key positions one step of the online softmax takes: the weights of a block share one
/// INT8 step, and a block's integer sums fold into the f32 output once.
pub const BLOCK: usize = 32;

/// The largest weight code: `[0, 127]` keeps AVX2's `vpmaddubsw` pair sums in 16 bits
/// (`2 · 127 · 127`) against values in `[-127, 127]`.
const WEIGHT_MAX: f32 = 127.0;

/// The largest head the vector kernels take (their zero row for a last block's padding).
const MAX_HEAD_DIM: usize = 512;

/// The INT8 cache's keys, values and their per-row scales.
#[derive(Clone, Copy)]
struct Cache<'a> {
    keys: &'a [i8],
    key_scales: &'a [f32],
    values: &'a [i8],
    value_scales: &'a [f32],
}

/// Whether the INT8 kernels take rows of `head_dim` in their vector form on `isa`;
/// otherwise they run the scalar oracle, which is slow.
pub fn has_vector_kernel(isa: Isa, head_dim: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && isa >= Isa::Avx2
        && head_dim.is_multiple_of(32)
        && head_dim <= MAX_HEAD_DIM
}

/// As [`super::attend_rows`], in INT8 products over an INT8 cache: row `r` of `q` attends
/// to the first `first_len + r` positions of `kv` and writes `out[r]`. Panics on any other
/// cache type.
pub fn attend_rows_int8(
    q: &[&[f32]],
    head_dim: usize,
    kv: KvRows<'_>,
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    attend_rows_int8_with(
        isa::active(),
        q,
        head_dim,
        kv,
        first_len,
        scale,
        scratch,
        out,
    )
}

/// As [`attend_rows_int8`] with an explicit ISA.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows_int8_with(
    isa: Isa,
    q: &[&[f32]],
    head_dim: usize,
    kv: KvRows<'_>,
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    isa.assert_supported();
    let KvRows::Int8 {
        keys,
        key_scales,
        values,
        value_scales,
    } = kv
    else {
        panic!("INT8 attention needs an INT8 cache");
    };
    let Some((n_rows, _)) = check_block(q, head_dim, kv, first_len, out) else {
        return;
    };
    let n_pos = first_len + n_rows - 1;
    let cache = Cache {
        keys: &keys[..n_pos * head_dim],
        key_scales: &key_scales[..n_pos],
        values: &values[..n_pos * head_dim],
        value_scales: &value_scales[..n_pos],
    };
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Amx | Isa::Avx512
            if has_vector_kernel(isa, head_dim)
                && head_dim.is_multiple_of(64)
                && is_x86_feature_detected!("avx512vnni") =>
        {
            // SAFETY: `Isa::Avx512` and `Isa::Amx` mean AVX-512 F, BW and VL (and AVX2,
            // FMA), VNNI was checked here; the shapes were checked above.
            unsafe {
                if n_rows == 1 {
                    avx512::attend_row(q, head_dim, cache, first_len, scale, scratch, out)
                } else {
                    avx512::attend(q, head_dim, cache, first_len, scale, scratch, out)
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni if has_vector_kernel(isa, head_dim) => {
            // SAFETY: `Isa::AvxVnni` means AVX2, FMA, F16C and AVX-VNNI; shapes as above.
            unsafe {
                if n_rows == 1 {
                    avx256::attend_row_vnni(q, head_dim, cache, first_len, scale, scratch, out)
                } else {
                    avx256::attend_vnni(q, head_dim, cache, first_len, scale, scratch, out)
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        _ if has_vector_kernel(isa, head_dim) => {
            // SAFETY: every level from `Isa::Avx2` up has AVX2, FMA and F16C.
            unsafe {
                if n_rows == 1 {
                    avx256::attend_row_avx2(q, head_dim, cache, first_len, scale, scratch, out)
                } else {
                    avx256::attend_avx2(q, head_dim, cache, first_len, scale, scratch, out)
                }
            }
        }
        _ => {
            let mut query = vec![0; head_dim];
            let mut o = vec![0.0; head_dim];
            for (r, (q_r, out_r)) in q.iter().zip(out.iter_mut()).enumerate() {
                for (q_h, out_h) in q_r
                    .chunks_exact(head_dim)
                    .zip(out_r.chunks_exact_mut(head_dim))
                {
                    attend_pair(q_h, cache, first_len + r, scale, &mut query, &mut o);
                    out_h.copy_from_slice(&o);
                }
            }
        }
    }
}

/// The oracle: one (row, head) pair's query `q` attending to the first `len` positions,
/// into `out`; `query` holds its INT8 codes.
fn attend_pair(
    q: &[f32],
    cache: Cache<'_>,
    len: usize,
    scale: f32,
    query: &mut [i8],
    out: &mut [f32],
) {
    let hd = q.len();
    out.fill(0.0);
    if len == 0 {
        return;
    }
    let q_scale = quantize_row(q, query) * scale;
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    let mut weights = [0.0f32; BLOCK];
    let mut codes = [0i32; BLOCK];
    for b0 in (0..len).step_by(BLOCK) {
        let n = (len - b0).min(BLOCK);
        let positions = b0..b0 + n;
        let mut scores = [f32::NEG_INFINITY; BLOCK];
        for (s, p) in scores.iter_mut().zip(positions.clone()) {
            let key = &cache.keys[p * hd..(p + 1) * hd];
            let dot: i32 = query
                .iter()
                .zip(key)
                .map(|(&a, &b)| a as i32 * b as i32)
                .sum();
            *s = (dot as f32 * q_scale) * cache.key_scales[p];
        }
        let block_max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let new_max = max.max(block_max);
        let rescale = exp_scalar(max - new_max);
        let mut exps = [0.0f32; BLOCK];
        let mut top = 0.0f32;
        for (((w, x), &s), p) in weights
            .iter_mut()
            .zip(&mut exps)
            .zip(&scores)
            .zip(positions.clone())
        {
            *x = exp_scalar(s - new_max);
            *w = *x * cache.value_scales[p];
            top = top.max(*w);
        }
        sum = sum * rescale + block_sum(exps);
        max = new_max;
        let (inv, step) = weight_step(top);
        for (c, &w) in codes.iter_mut().zip(&weights[..n]) {
            *c = (w * inv).round_ties_even() as i32;
        }
        for (d, o) in out.iter_mut().enumerate() {
            let dot: i32 = codes[..n]
                .iter()
                .zip(positions.clone())
                .map(|(&c, p)| c * cache.values[p * hd + d] as i32)
                .sum();
            *o = o.mul_add(rescale, dot as f32 * step);
        }
    }
    let inv_sum = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv_sum);
}

/// The sum of a block's exponentials in the order every form takes them: halves added
/// lane by lane (`e[i] + e[i + 16]`, then `+ [i + 8]`, ...), which a vector of positions
/// and a run of vectors of pairs both compute in the same operations.
fn block_sum(mut e: [f32; BLOCK]) -> f32 {
    let mut width = BLOCK / 2;
    while width > 0 {
        for i in 0..width {
            e[i] += e[i + width];
        }
        width /= 2;
    }
    e[0]
}

/// A block's weight codes: `(127 / top, top / 127)`, or zeros for a block of no weight.
fn weight_step(top: f32) -> (f32, f32) {
    if top > 0.0 {
        (WEIGHT_MAX / top, top / WEIGHT_MAX)
    } else {
        (0.0, 0.0)
    }
}

/// The column the vector kernels keep at index `idx` of a pair's output: each chunk of
/// `4 · lanes` columns is interleaved by 128-bit lanes of 16 byte columns, so vector `k`
/// of a chunk holds columns `16 L + 4 k + i` in its 128-bit lane `L`, dword `i`.
fn interleaved_column(idx: usize, lanes: usize) -> usize {
    let chunk = 4 * lanes;
    let (base, at) = (idx - idx % chunk, idx % chunk);
    let (k, lane, i) = (at / lanes, (at % lanes) / 4, at % 4);
    base + 16 * lane + 4 * k + i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::attend_rows_with;
    use crate::test_support::random;

    /// One KV head's INT8 cache of random rows, quantised as the model's cache is.
    struct Int8Cache {
        keys: Vec<i8>,
        key_scales: Vec<f32>,
        values: Vec<i8>,
        value_scales: Vec<f32>,
    }

    impl Int8Cache {
        fn random(n_pos: usize, head_dim: usize, seed: u64) -> Self {
            let quantize = |x: Vec<f32>| {
                let mut codes = vec![0; x.len()];
                let scales = x
                    .chunks_exact(head_dim)
                    .zip(codes.chunks_exact_mut(head_dim))
                    .map(|(row, out)| quantize_row(row, out))
                    .collect();
                (codes, scales)
            };
            // Keys with a few large channels, as real models' keys have.
            let keys = random(n_pos * head_dim, seed)
                .into_iter()
                .enumerate()
                .map(|(i, v)| if i % head_dim == 3 { 8.0 * v } else { v })
                .collect();
            let (keys, key_scales) = quantize(keys);
            let (values, value_scales) = quantize(random(n_pos * head_dim, seed + 1));
            Self {
                keys,
                key_scales,
                values,
                value_scales,
            }
        }

        fn rows(&self) -> KvRows<'_> {
            KvRows::Int8 {
                keys: &self.keys,
                key_scales: &self.key_scales,
                values: &self.values,
                value_scales: &self.value_scales,
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        isa: Isa,
        q: &[f32],
        n_rows: usize,
        head_dim: usize,
        kv: KvRows<'_>,
        first_len: usize,
        scratch: &mut Vec<f32>,
        exact: bool,
    ) -> Vec<f32> {
        let width = q.len() / n_rows;
        let q_rows: Vec<&[f32]> = q.chunks_exact(width).collect();
        let mut got = vec![f32::NAN; q.len()];
        let mut outs: Vec<&mut [f32]> = got.chunks_exact_mut(width).collect();
        let attend = if exact {
            attend_rows_with
        } else {
            attend_rows_int8_with
        };
        attend(
            isa, &q_rows, head_dim, kv, first_len, 0.125, scratch, &mut outs,
        );
        got
    }

    /// Every vector form equals the oracle bit for bit, and a block of rows gives each row
    /// what it gets alone: across softmax blocks, the cache's last partial block, tiles of
    /// pairs left short, both vector widths' column chunks, and rows from position 0.
    #[test]
    fn every_isa_equals_the_oracle_and_rows_equal_rows_alone() {
        for (head_dim, n_q, first_len, n_rows) in [
            (64, 7, 1, 16),
            (64, 3, 100, 16),
            (64, 1, 1, 1),
            (64, 2, 33, 1),
            (64, 8, 31, 9),
            (128, 2, 64, 5),
            (128, 5, 200, 16),
            (32, 4, 7, 3),
            (96, 3, 40, 8),
            (256, 1, 65, 2),
            (64, 6, 0, 4),
            (64, 7, 300, 1),
        ] {
            let n_pos = first_len + n_rows + 5; // the cache may hold more
            let seed = (head_dim * 1000 + first_len * 10 + n_q) as u64;
            let q: Vec<f32> = random(n_rows * n_q * head_dim, seed)
                .iter()
                .map(|v| 4.0 * v)
                .collect();
            let cache = Int8Cache::random(n_pos, head_dim, seed + 7);
            let mut scratch = Vec::new();
            let shape = format!("hd={head_dim} n_q={n_q} first={first_len} rows={n_rows}");
            let oracle = run(
                Isa::Scalar,
                &q,
                n_rows,
                head_dim,
                cache.rows(),
                first_len,
                &mut scratch,
                false,
            );
            let width = n_q * head_dim;
            for isa in Isa::available() {
                let got = run(
                    isa,
                    &q,
                    n_rows,
                    head_dim,
                    cache.rows(),
                    first_len,
                    &mut scratch,
                    false,
                );
                let (got_bits, want_bits): (Vec<u32>, Vec<u32>) = (
                    got.iter().map(|v| v.to_bits()).collect(),
                    oracle.iter().map(|v| v.to_bits()).collect(),
                );
                assert_eq!(got_bits, want_bits, "{isa} {shape}");
                for r in 0..n_rows {
                    let q_r = &q[r * width..(r + 1) * width];
                    let alone = run(
                        isa,
                        q_r,
                        1,
                        head_dim,
                        cache.rows(),
                        first_len + r,
                        &mut scratch,
                        false,
                    );
                    assert_eq!(
                        alone,
                        got[r * width..(r + 1) * width],
                        "{isa} {shape} row {r}"
                    );
                }
            }
            // And it is attention: close to the exact f32 products over the same cache.
            let exact = run(
                Isa::Scalar,
                &q,
                n_rows,
                head_dim,
                cache.rows(),
                first_len,
                &mut scratch,
                true,
            );
            let err = oracle
                .iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            let norm = exact.iter().map(|v| v.abs()).fold(0.0, f32::max);
            assert!(
                err <= 0.05 * norm.max(1e-3),
                "{shape}: error {err} against {norm}"
            );
        }
    }

    #[test]
    fn a_dominant_position_takes_all_the_weight() {
        let head_dim = 64;
        let mut cache = Int8Cache::random(40, head_dim, 3);
        // Position 35's key is the query's direction, far above the others.
        let q = vec![1.0; head_dim];
        cache.keys[35 * head_dim..36 * head_dim].fill(127);
        cache.key_scales[35] = 1.0;
        for isa in Isa::available() {
            let got = run(
                isa,
                &q,
                1,
                head_dim,
                cache.rows(),
                40,
                &mut Vec::new(),
                false,
            );
            for (d, g) in got.iter().enumerate() {
                let want = cache.values[35 * head_dim + d] as f32 * cache.value_scales[35];
                assert!(
                    (g - want).abs() <= 1e-6 + 1e-5 * want.abs(),
                    "{isa} column {d}: {g} vs {want}"
                );
            }
        }
    }

    #[test]
    fn the_column_order_is_a_permutation() {
        for lanes in [8, 16] {
            let mut seen: Vec<usize> = (0..128).map(|i| interleaved_column(i, lanes)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..128).collect::<Vec<_>>());
        }
    }
}
