//! W8A8 matrix multiplication in the layout of GGUF's Q8_0: INT8 weights and INT8
//! activations (activations quantised per token at run time), both symmetric with one
//! scale per [`BLOCK_K`] values along `k`; integer dot products per block, whose sums are
//! scaled and accumulated in float.
//!
//! One scale per row (or per token) is cheaper, but a row of a small model spans several
//! orders of magnitude: with per-row scales SmolLM2-135M's greedy tokens left the f32
//! path's within five tokens on most reference prompts. Blocks of 32 are what llama.cpp's
//! Q8_0 × Q8_0 product uses; they cost one convert and one fused multiply-add per block
//! and output.
//!
//! Weights are packed once at load as `[n / 16][k / 4][16][4]`: one 64-byte vector holds
//! four consecutive `k` of sixteen output rows, which is exactly what AVX-512 VNNI's
//! `vpdpbusd` consumes (and two AVX2 halves of it). Every ISA variant computes the same
//! exact integer sums per block and scales them in the same order, so all of them agree
//! with the scalar oracle bit for bit.

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
mod reference;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use half::f16;
use rayon::prelude::*;

use crate::isa::{self, Isa};
use crate::scales::Scales;
use std::ops::Range;

use crate::threadpool::{SharedSlice, ThreadPool};
use crate::COLUMN_ALIGN;

/// Output rows per packed block.
pub const ROWS_PER_BLOCK: usize = 16;
/// `k` values per packed group (one 32-bit lane of `vpdpbusd`).
pub const K_PER_GROUP: usize = 4;
/// `k` values sharing one scale, in weights and activations alike.
pub const BLOCK_K: usize = 32;
/// Packed groups per scale block.
pub const GROUPS_PER_BLOCK: usize = BLOCK_K / K_PER_GROUP;
/// Activation rows from which [`Isa::Amx`] multiplies on tiles. Below, a tile is mostly
/// empty and VNNI is as fast or faster. Batches this small are decode steps, whose weights
/// come from L3 or memory: on a step of SmolLM2's and Qwen2.5-0.5B's products (2 threads,
/// Sapphire Rapids, both kernels prefetching) the tiles read 25–28 G weights/s at 5 to 8
/// rows against VNNI's 17–23 G when its tiles had four rows, tied at 4, and at 3 lost on
/// SmolLM2's (25 against 28). With eight-row VNNI tiles the two tie at 8 rows
/// (`cargo bench -- decode_step/int8/8`, 4.19–4.32 ms against 4.27–4.31) and the tiles win
/// at 16 (5.4 against 7.7 ms).
const AMX_MIN_ROWS: usize = 5;

/// INT8 weights `[n, k]` in the packed layout, with one scale per row and block of `k`.
#[derive(Debug, Clone)]
pub struct PackedI8 {
    pub n: usize,
    pub k: usize,
    /// `k` rounded up to a whole block; the padding is zero.
    pub k_pad: usize,
    /// `[n_pad / 16][k_pad / 4][16][4]`.
    pub data: Vec<i8>,
    /// Dequantisation scales, `w ≈ q * scale`: f16 per row and block of 32 as in Q8_0
    /// (decode reads every byte of them per token), or a K-quant's factors per sub-block
    /// of 16 (Q6_K, Q3_K).
    pub scales: Scales,
    /// `Σ q` per row and scale group, to undo the +128 offset VNNI needs on activations;
    /// laid out as the scales, `[n_pad / 16][groups][16]`.
    pub block_sums: Vec<i16>,
    /// A minimum per row and block of 32, `w = q · scale + min`: GGUF's Q5_1 and Q5_K,
    /// whose 5-bit codes 0..=31 have one. Each costs one more multiply-add per block by
    /// the activations' block sum, as in the INT4 kernels.
    pub mins: Option<Scales>,
}

/// A code [`PackedI8::from_rows`] cannot pack exactly: -128 at `w[row][col]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("INT8 code -128 at row {row}, column {col}: the kernels multiply codes in -127..=127")]
pub struct UnrepresentableCode {
    pub row: usize,
    pub col: usize,
}

impl PackedI8 {
    /// Quantises a row-major f32 matrix `[n, k]` to INT8, one scale per row and block.
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Self {
        Self::quantize_with(isa::active(), w, n, k)
    }

    /// As [`PackedI8::quantize`] with an explicit ISA (tests compare every ISA against
    /// scalar).
    pub fn quantize_with(isa: Isa, w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w must be [n, k]");
        isa.assert_supported();
        Self::pack(n, k, |row, b, q| {
            let xb = &w[row * k + b * BLOCK_K..row * k + k.min((b + 1) * BLOCK_K)];
            let mut padded = [0.0f32; BLOCK_K];
            let block = if xb.len() == BLOCK_K {
                xb
            } else {
                padded[..xb.len()].copy_from_slice(xb);
                &padded
            };
            // The f16 value `Scaling::Weights` quantised against: exact in f16.
            f16::from_f32(quantize_block(isa, block, q, Scaling::Weights))
        })
    }

    /// Packs codes with their scales exactly, `w = q · scale (+ min)`:
    /// `row_codes(row, out)` writes row `row`'s `k` codes, so a caller decodes its blocks
    /// one row at a time with no copy of the whole matrix. `scales` are per 32 or per 16
    /// (from [`Scales::per_block`] or [`Scales::super_block`]); `mins`, per 32 only, are
    /// GGUF's Q5_1 and Q5_K minimums. Fails on a code of -128, which the AVX2 kernel's
    /// sign trick cannot multiply exactly (GGUF's quantisers never write one: Q8_0's codes
    /// are `round(127 · x / max)`). Row blocks are packed on every core.
    pub fn from_rows(
        n: usize,
        k: usize,
        scales: Scales,
        mins: Option<Scales>,
        row_codes: impl Fn(usize, &mut [i8]) + Sync,
    ) -> Result<Self, UnrepresentableCode> {
        let k_pad = k.div_ceil(BLOCK_K) * BLOCK_K;
        let n_pad = n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
        let (group_k, groups) = (scales.group_k(), scales.groups());
        assert!(
            BLOCK_K.is_multiple_of(group_k) && groups * group_k == k_pad && scales.covers(n_pad),
            "one scale per row and group, groups dividing a block of 32"
        );
        assert!(
            mins.as_ref().is_none_or(|m| group_k == BLOCK_K
                && m.group_k() == BLOCK_K
                && m.groups() == groups
                && m.covers(n_pad)),
            "a minimum per row and block of 32, beside a scale per block of 32"
        );
        let mut data = vec![0i8; n_pad * k_pad];
        let mut block_sums = vec![0i16; n_pad * groups];
        if n > 0 && k > 0 {
            data.par_chunks_mut(ROWS_PER_BLOCK * k_pad)
                .zip(block_sums.par_chunks_mut(ROWS_PER_BLOCK * groups))
                .enumerate()
                .try_for_each(|(row_block, (data, sums))| {
                    let first = row_block * ROWS_PER_BLOCK;
                    // A row padded with zeros to whole groups, so each group's four
                    // codes move as one fixed-size copy.
                    let mut codes = vec![0i8; k_pad];
                    for row in 0..ROWS_PER_BLOCK.min(n - first) {
                        row_codes(first + row, &mut codes[..k]);
                        // A check over the whole row first, which vectorises where
                        // `position` would stop early; the column only for the message.
                        let any_min = codes.iter().fold(false, |any, &v| any | (v == i8::MIN));
                        if any_min {
                            let col = codes.iter().position(|&v| v == i8::MIN).unwrap_or(0);
                            return Err(UnrepresentableCode {
                                row: first + row,
                                col,
                            });
                        }
                        for (g, group) in codes.chunks_exact(group_k).enumerate() {
                            sums[scale_index(row, g, groups)] =
                                group.iter().map(|&v| i16::from(v)).sum();
                        }
                        let slots = data.chunks_exact_mut(ROWS_PER_BLOCK * K_PER_GROUP);
                        for (quad, slot) in codes.chunks_exact(K_PER_GROUP).zip(slots) {
                            slot[row * K_PER_GROUP..][..K_PER_GROUP].copy_from_slice(quad);
                        }
                    }
                    Ok(())
                })?;
        }
        Ok(Self {
            n,
            k,
            k_pad,
            data,
            scales,
            block_sums,
            mins,
        })
    }

    /// [`PackedI8::quantize`]'s packer: `block(row, b, q)` writes row `row`'s block `b` (zeros past `k`) into `q` and
    /// returns its scale.
    ///
    /// Each 16-row block's bytes, scales and sums are contiguous, so the blocks are packed
    /// on every core ([`rayon`]): a model is packed once per load, and on one core this
    /// was most of Qwen2.5-0.5B's.
    fn pack(
        n: usize,
        k: usize,
        block: impl Fn(usize, usize, &mut [i8; BLOCK_K]) -> f16 + Sync,
    ) -> Self {
        let k_pad = k.div_ceil(BLOCK_K) * BLOCK_K;
        let n_pad = n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
        let n_blocks = k_pad / BLOCK_K;
        let mut data = vec![0i8; n_pad * k_pad];
        let mut scales = vec![f16::ZERO; n_pad * n_blocks];
        let mut block_sums = vec![0i16; n_pad * n_blocks];
        if n > 0 && k > 0 {
            data.par_chunks_mut(ROWS_PER_BLOCK * k_pad)
                .zip(scales.par_chunks_mut(ROWS_PER_BLOCK * n_blocks))
                .zip(block_sums.par_chunks_mut(ROWS_PER_BLOCK * n_blocks))
                .enumerate()
                .for_each(|(row_block, ((data, scales), sums))| {
                    let first = row_block * ROWS_PER_BLOCK;
                    let mut q = [0i8; BLOCK_K];
                    for row in 0..ROWS_PER_BLOCK.min(n - first) {
                        for b in 0..n_blocks {
                            let at = scale_index(row, b, n_blocks);
                            scales[at] = block(first + row, b, &mut q);
                            sums[at] = q.iter().map(|&v| i16::from(v)).sum();
                            for (g, group) in q.chunks_exact(K_PER_GROUP).enumerate() {
                                let at = packed_index(row, b * BLOCK_K + g * K_PER_GROUP, k_pad);
                                data[at..at + K_PER_GROUP].copy_from_slice(group);
                            }
                        }
                    }
                });
        }
        Self {
            n,
            k,
            k_pad,
            data,
            scales: Scales::half(BLOCK_K, n_blocks, scales),
            block_sums,
            mins: None,
        }
    }

    /// Blocks of 32 along `k`: the activations' scale blocks.
    pub fn n_blocks(&self) -> usize {
        self.k_pad / BLOCK_K
    }

    /// The scale of `row`'s scale group `group` (a block of 32 unless the scales are a
    /// K-quant's sub-blocks).
    pub fn scale(&self, row: usize, group: usize) -> f32 {
        self.scales.get(row, group)
    }

    /// The weight as the kernels see it, back in f32.
    pub fn dequantize_row(&self, row: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.k];
        self.dequantize_row_into(row, &mut out);
        out
    }

    /// As [`PackedI8::dequantize_row`], into `out` (`[k]`): a tied model's embeddings.
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        let group_k = self.scales.group_k();
        for (g, group) in out[..self.k].chunks_mut(group_k).enumerate() {
            for (j, o) in group.iter_mut().enumerate() {
                *o = self.weight(row, g * group_k + j);
            }
        }
    }

    /// `w[row][kk]` as the kernels see it.
    #[inline]
    pub fn weight(&self, row: usize, kk: usize) -> f32 {
        let g = kk / self.scales.group_k();
        let scaled = f32::from(self.data[packed_index(row, kk, self.k_pad)]) * self.scale(row, g);
        match &self.mins {
            Some(mins) => scaled + mins.get(row, g),
            None => scaled,
        }
    }

    /// `out[i] += v · w[cols.start + i][kk]`: input channel `kk`'s part of a product,
    /// for a channel computed beside the integer kernels in f32 (`out` is `[cols.len()]`).
    pub fn add_column(&self, kk: usize, v: f32, out: &mut [f32], cols: Range<usize>) {
        self.add_column_with(isa::active(), kk, v, out, cols)
    }

    /// As [`PackedI8::add_column`] with an explicit ISA: the same sums on every ISA.
    pub fn add_column_with(
        &self,
        isa: Isa,
        kk: usize,
        v: f32,
        out: &mut [f32],
        cols: Range<usize>,
    ) {
        assert!(kk < self.k && cols.end <= self.n && out.len() == cols.len());
        isa.assert_supported();
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx2 {
            // SAFETY: `Isa::Avx2` and above have AVX2 and F16C (asserted); `kk` and `cols`
            // are inside the matrix.
            return unsafe { x86::add_column_avx2(self, kk, v, out, cols) };
        }
        for (o, row) in out.iter_mut().zip(cols) {
            *o += v * self.weight(row, kk);
        }
    }

    pub fn bytes(&self) -> usize {
        self.data.len()
            + self.scales.bytes()
            + self.mins.as_ref().map_or(0, Scales::bytes)
            + 2 * self.block_sums.len()
    }
}

/// Position of `w[row][kk]` in the packed layout.
#[inline]
pub fn packed_index(row: usize, kk: usize, k_pad: usize) -> usize {
    let block = row / ROWS_PER_BLOCK;
    let group = kk / K_PER_GROUP;
    ((block * (k_pad / K_PER_GROUP) + group) * ROWS_PER_BLOCK + row % ROWS_PER_BLOCK) * K_PER_GROUP
        + kk % K_PER_GROUP
}

/// Position of the scale of `row`'s block `block` (of `n_blocks`) in [`PackedI8::scales`].
#[inline]
pub fn scale_index(row: usize, block: usize, n_blocks: usize) -> usize {
    ((row / ROWS_PER_BLOCK) * n_blocks + block) * ROWS_PER_BLOCK + row % ROWS_PER_BLOCK
}

/// How a block's scale follows from its largest magnitude.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scaling {
    /// Activations, quantised per token at run time: scaled by `127 / max`, the scale kept
    /// in f32. A zero or non-finite `max` zeroes the block.
    Activations,
    /// Weights, whose scales are stored in f16: scaled against the stored scale, so no
    /// step is off by its rounding.
    Weights,
}

impl Scaling {
    /// The multiplier a block of largest magnitude `max` is scaled by before rounding (0
    /// zeroes the block), and the scale kept.
    #[inline(always)]
    pub(crate) fn step(self, max: f32) -> (f32, f32) {
        match self {
            Scaling::Activations if max == 0.0 || !max.is_finite() => (0.0, 0.0),
            Scaling::Activations => (127.0 / max, max / 127.0),
            Scaling::Weights => {
                let stored = f16::from_f32(max / 127.0).to_f32();
                (if stored > 0.0 { 1.0 / stored } else { 0.0 }, stored)
            }
        }
    }
}

/// One whole block ([`BLOCK_K`] values) quantised into `q` by `scaling`, on `isa`'s
/// vector path or the scalar one: the same bytes and scale on every ISA. Returns the
/// scale.
fn quantize_block(isa: Isa, block: &[f32], q: &mut [i8], scaling: Scaling) -> f32 {
    assert!(block.len() == BLOCK_K && q.len() >= BLOCK_K);
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: the callers checked `isa` is supported: `Isa::detect` requires AVX2 for
        // `Isa::Avx2` and every family above, and AVX-512F for `Isa::Avx512` and above;
        // `block` and `q` hold a whole block.
        return unsafe {
            if isa >= Isa::Avx512 {
                x86::quantize_block_avx512(block, q, scaling)
            } else {
                x86::quantize_block_avx2(block, q, scaling)
            }
        };
    }
    let max = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    quantize_with_max(block, max, q, scaling)
}

/// Symmetric INT8 quantisation of one row into `[-127, 127]` (never -128, so the AVX2
/// sign trick cannot overflow) with a single scale: the INT8 KV cache's rows. Returns
/// the scale; an all-zero row gets scale 0.
pub fn quantize_row(x: &[f32], out: &mut [i8]) -> f32 {
    debug_assert!(out.len() >= x.len());
    let max = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    quantize_with_max(x, max, out, Scaling::Activations)
}

/// Quantises `x`, whose largest magnitude is `max`, by `scaling`; returns the scale.
fn quantize_with_max(x: &[f32], max: f32, out: &mut [i8], scaling: Scaling) -> f32 {
    let (inv, scale) = scaling.step(max);
    if inv == 0.0 {
        out[..x.len()].fill(0);
    } else {
        quantize_scaled(x, inv, out);
    }
    scale
}

/// `out = round(x · inv)` clamped to `[-127, 127]`.
fn quantize_scaled(x: &[f32], inv: f32, out: &mut [i8]) {
    for (o, &v) in out.iter_mut().zip(x) {
        // Round half away from zero by truncating `v ± 0.5`: `f32::round` is a libm call
        // on baseline x86-64, and this runs for every activation of every token.
        let scaled = (v * inv).clamp(-127.0, 127.0);
        *o = (scaled + 0.5f32.copysign(scaled)) as i8;
    }
}

/// Quantises a row block by block ([`BLOCK_K`]), the `excluded` channels (ascending) left
/// out of their block's scale and quantised to zero: how the outlier channels computed in
/// float are split off. `out` is the row padded to whole blocks (the padding gets zeros),
/// `scales` one per block.
pub fn quantize_blocks_excluding(
    x: &[f32],
    excluded: &[usize],
    out: &mut [i8],
    scales: &mut [f32],
) {
    quantize_blocks_excluding_with(isa::active(), x, excluded, out, scales)
}

/// As [`quantize_blocks_excluding`] with an explicit ISA. Every token's activations go
/// through this at each projection site, so every block takes a vector path, which gives
/// the scalar one's bytes and scales exactly: on AVX-512 sixteen blocks at a time, reading
/// the excluded channels and the padding as zeros through load masks, on AVX2 block by
/// block (a block with excluded channels, or the short last one, as a copy with zeros
/// there).
pub fn quantize_blocks_excluding_with(
    isa: Isa,
    x: &[f32],
    excluded: &[usize],
    out: &mut [i8],
    scales: &mut [f32],
) {
    let k_pad = x.len().div_ceil(BLOCK_K) * BLOCK_K;
    assert!(out.len() >= k_pad && scales.len() >= k_pad / BLOCK_K);
    isa.assert_supported();
    out[x.len()..k_pad].fill(0);
    let mut excluded = excluded.iter().copied().peekable();
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        const BATCH: usize = x86::ACTIVATION_BATCH * BLOCK_K;
        for (i, xs) in x.chunks(BATCH).enumerate() {
            let start = i * BATCH;
            let len = xs.len().next_multiple_of(BLOCK_K);
            // The values read: all of `xs` but the excluded channels.
            let mut keep = [0u16; 2 * x86::ACTIVATION_BATCH];
            for (h, mask) in keep.iter_mut().enumerate() {
                let lanes = xs.len().saturating_sub(16 * h).min(16);
                *mask = ((1u32 << lanes) - 1) as u16;
            }
            while let Some(c) = excluded.next_if(|&c| c < start + xs.len()) {
                keep[(c - start) / 16] &= !(1 << ((c - start) % 16));
            }
            // SAFETY: `Isa::detect` requires AVX-512F for `Isa::Avx512` and above, and the
            // callers checked `isa` is supported; `keep` covers only `xs`; `out` and
            // `scales` hold the whole padded row (asserted above).
            unsafe {
                x86::quantize_activation_batch_avx512(
                    xs,
                    &keep,
                    &mut out[start..start + len],
                    &mut scales[start / BLOCK_K..(start + len) / BLOCK_K],
                )
            };
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        let mut zeroed: [f32; BLOCK_K];
        for (b, (xb, qb)) in x.chunks(BLOCK_K).zip(out.chunks_mut(BLOCK_K)).enumerate() {
            let (start, end) = (b * BLOCK_K, b * BLOCK_K + xb.len());
            let whole = xb.len() == BLOCK_K && excluded.peek().is_none_or(|&c| c >= end);
            let block = if whole {
                xb
            } else {
                // Excluded channels and padding as zeros: they leave the scale and quantise
                // to zero, which is what the scalar path below gives them.
                zeroed = [0.0; BLOCK_K];
                zeroed[..xb.len()].copy_from_slice(xb);
                while let Some(c) = excluded.next_if(|&c| c < end) {
                    zeroed[c - start] = 0.0;
                }
                &zeroed
            };
            scales[b] = quantize_block(isa, block, qb, Scaling::Activations);
        }
        return;
    }
    for (b, (xb, qb)) in x.chunks(BLOCK_K).zip(out.chunks_mut(BLOCK_K)).enumerate() {
        let start = b * BLOCK_K;
        let mut skipped = [false; BLOCK_K];
        let mut any_skipped = false;
        while let Some(c) = excluded.next_if(|&c| c < start + xb.len()) {
            skipped[c - start] = true;
            any_skipped = true;
        }
        let mut max = 0.0f32;
        for (v, skip) in xb.iter().zip(skipped) {
            if !skip {
                max = max.max(v.abs());
            }
        }
        scales[b] = quantize_with_max(xb, max, qb, Scaling::Activations);
        if any_skipped {
            for (q, skip) in qb.iter_mut().zip(skipped) {
                if skip {
                    *q = 0;
                }
            }
        }
    }
}

/// `Σ q` of each [`BLOCK_K`] of a quantised row.
pub fn sum_blocks(q: &[i8], sums: &mut [i32]) {
    for (sum, g) in sums.iter_mut().zip(q.chunks(BLOCK_K)) {
        *sum = g.iter().map(|&v| i32::from(v)).sum();
    }
}

/// Activations quantised per row and block, `k` padded with zeros to the weights' `k_pad`.
#[derive(Debug, Default, Clone)]
pub struct QuantizedRows {
    pub data: Vec<i8>,    // [m, k_pad]
    pub scales: Vec<f32>, // [m, k_pad / 32]
    /// `Σ q` of each row per block, `[m, k_pad / 32]`: once per token here rather than
    /// once per weight row in the W4A8 kernel, which needs it for its groups' minimums.
    pub block_sums: Vec<i32>,
    pub k_pad: usize,
    pub m: usize,
}

impl QuantizedRows {
    /// Quantises `x` (`[m, k]`) in place of whatever this buffer held.
    pub fn quantize(&mut self, x: &[f32], m: usize, k: usize, k_pad: usize) {
        debug_assert_eq!(x.len(), m * k);
        let n_blocks = k_pad / BLOCK_K;
        self.data.clear();
        self.data.resize(m * k_pad, 0);
        self.scales.clear();
        self.scales.resize(m * n_blocks, 0.0);
        self.block_sums.clear();
        self.block_sums.resize(m * n_blocks, 0);
        self.k_pad = k_pad;
        self.m = m;
        for row in 0..m {
            let q = &mut self.data[row * k_pad..(row + 1) * k_pad];
            let blocks = row * n_blocks..(row + 1) * n_blocks;
            quantize_blocks_excluding(
                &x[row * k..(row + 1) * k],
                &[],
                q,
                &mut self.scales[blocks.clone()],
            );
            sum_blocks(q, &mut self.block_sums[blocks]);
        }
    }

    pub fn view(&self) -> QuantizedView<'_> {
        QuantizedView {
            data: &self.data,
            scales: &self.scales,
            block_sums: &self.block_sums,
            k_pad: self.k_pad,
            m: self.m,
        }
    }
}

/// Quantised activations as the kernels read them. Borrowed, so the threads of a region
/// can fill one shared buffer row by row and then all read it.
#[derive(Debug, Clone, Copy)]
pub struct QuantizedView<'a> {
    pub data: &'a [i8],        // [m, k_pad]
    pub scales: &'a [f32],     // [m, k_pad / 32]
    pub block_sums: &'a [i32], // [m, k_pad / 32]
    pub k_pad: usize,
    pub m: usize,
}

impl QuantizedView<'_> {
    pub fn n_blocks(&self) -> usize {
        self.k_pad / BLOCK_K
    }
}

/// The checks every integer product makes before its kernels read unchecked: weights
/// `[n, k]` padded to `k_pad` (whole blocks of 32), activations `[m, k_pad]` with a scale
/// (and, when `sums`, a sum) per block, `out` `[m, n]`.
pub(crate) fn check_operands(
    a: &QuantizedView<'_>,
    (n, k, k_pad): (usize, usize, usize),
    out: &SharedSlice<'_, f32>,
    sums: bool,
) {
    let (m, n_blocks) = (a.m, k_pad / BLOCK_K);
    assert_eq!(a.k_pad, k_pad, "activations and weights disagree on k");
    assert!(
        k_pad.is_multiple_of(BLOCK_K) && k <= k_pad,
        "k_pad must cover k in whole blocks"
    );
    assert!(
        a.data.len() >= m * k_pad
            && a.scales.len() >= m * n_blocks
            && (!sums || a.block_sums.len() >= m * n_blocks),
        "activations must be [m, k_pad] with a scale (and sum) per block"
    );
    assert_eq!(Some(out.len()), m.checked_mul(n), "out must be [m, n]");
}

/// The 16-row weight blocks of columns `cols` of `n`: the kernels compute whole blocks. An
/// empty range computes none (a trailing thread's share can be `n..n` with `n`
/// unaligned); otherwise a range starts on a block and ends on one or at `n`, so no block
/// is shared with another thread's range.
pub(crate) fn column_blocks(cols: Range<usize>, n: usize) -> Option<Range<usize>> {
    if cols.is_empty() {
        return None;
    }
    assert!(
        cols.start.is_multiple_of(ROWS_PER_BLOCK)
            && (cols.end.is_multiple_of(ROWS_PER_BLOCK) || cols.end == n)
            && cols.end <= n,
        "columns must start on a block and end on a block or at n"
    );
    Some(cols.start / ROWS_PER_BLOCK..cols.end.div_ceil(ROWS_PER_BLOCK))
}

/// `out[m, n] = dequant(a) · dequant(w)ᵀ` with the active ISA.
pub fn gemm_i8(pool: &ThreadPool, a: &QuantizedView<'_>, w: &PackedI8, out: &mut [f32]) {
    gemm_i8_with(isa::active(), pool, a, w, out)
}

/// As [`gemm_i8`] with an explicit ISA (tests compare every ISA against scalar).
pub fn gemm_i8_with(
    isa: Isa,
    pool: &ThreadPool,
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: &mut [f32],
) {
    let out = SharedSlice::new(out);
    pool.run_team(&|team| {
        // SAFETY: the team's column splits are disjoint; `out` is not read until the end.
        unsafe { gemm_i8_cols(isa, a, w, &out, team.split(w.n, COLUMN_ALIGN)) }
    });
}

/// Computes output columns `cols` of every row: the part of a [`gemm_i8`] one thread of a
/// region does. `cols` starts on a multiple of [`COLUMN_ALIGN`].
///
/// # Safety
/// No other thread accesses these columns of `out` until the next barrier.
pub unsafe fn gemm_i8_cols(
    isa: Isa,
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: &SharedSlice<'_, f32>,
    cols: Range<usize>,
) {
    let m = a.m;
    check_operands(a, (w.n, w.k, w.k_pad), out, w.mins.is_some());
    let n_pad = w.n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
    // The kernels load whole 16-row blocks and 4-byte activation groups unchecked.
    assert_eq!(
        Some(w.data.len()),
        n_pad.checked_mul(w.k_pad),
        "packed weights must be [n_pad, k_pad]"
    );
    let n_blocks = w.n_blocks();
    let split = w.scales.group_k() != BLOCK_K;
    assert!(
        w.scales.covers(n_pad)
            && w.scales.groups() * w.scales.group_k() == w.k_pad
            && BLOCK_K.is_multiple_of(w.scales.group_k())
            && w.block_sums.len() == n_pad * w.scales.groups(),
        "one scale and sum per row and scale group"
    );
    assert!(
        w.mins.as_ref().is_none_or(|m| !split
            && m.group_k() == BLOCK_K
            && m.groups() == n_blocks
            && m.covers(n_pad)),
        "minimums need a block of 32 per scale"
    );
    let Some(blocks) = column_blocks(cols, w.n) else {
        return;
    };
    isa.assert_supported();
    let out = out.as_mut_ptr();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Amx` is only detected when `amx::enable` granted the tiles to a
        // CPU with AVX-512. The tiles sum whole blocks of 32, so scales per 16 go to VNNI.
        Isa::Amx if m >= AMX_MIN_ROWS && !split => amx::gemm_blocks_amx(a, w, out, blocks),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512
        // and AVX2 with FMA and F16C (VNNI checked inside).
        Isa::Amx | Isa::Avx512 if x86::has_vnni() => x86::gemm_blocks_vnni(a, w, out, blocks),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::AvxVnni` is only selected when the CPU has AVX2, FMA, F16C and
        // AVX-VNNI (asserted above).
        Isa::AvxVnni => x86::gemm_blocks_avxvnni(a, w, out, blocks),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2, FMA and F16C for `Isa::Avx512` too, and
        // selects `Isa::Avx2` only when they are present.
        Isa::Amx | Isa::Avx512 | Isa::Avx2 => x86::gemm_blocks_avx2(a, w, out, blocks),
        _ => reference::gemm_blocks_scalar(a, w, out, blocks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{
        assert_an_empty_column_range_writes_nothing, assert_every_isa_matches_scalar, random,
        refuse_a_range_ending_inside_a_block, rows_of, MinimumI8, PackedGemm, SubBlockI8,
        L2_CROSSING_GEMM_SHAPES, PREFILL_GEMM_SHAPES, RAGGED_GEMM_SHAPES,
    };

    #[test]
    fn every_isa_matches_scalar_exactly_across_l2_chunks() {
        assert_every_isa_matches_scalar::<PackedI8>(&L2_CROSSING_GEMM_SHAPES, &[1, 2], (7, 8));
    }

    #[test]
    fn every_isa_matches_scalar_exactly_on_prefill_batches() {
        assert_every_isa_matches_scalar::<PackedI8>(&PREFILL_GEMM_SHAPES, &[1, 2], (5, 6));
    }

    #[test]
    fn an_empty_column_range_writes_nothing() {
        assert_an_empty_column_range_writes_nothing::<PackedI8>();
    }

    #[test]
    #[should_panic(expected = "end on a block or at n")]
    fn a_range_ending_inside_a_block_is_refused() {
        refuse_a_range_ending_inside_a_block::<PackedI8>();
    }

    #[test]
    fn every_isa_matches_scalar_exactly_on_ragged_shapes() {
        assert_every_isa_matches_scalar::<PackedI8>(&RAGGED_GEMM_SHAPES, &[2], (2, 1));
    }

    #[test]
    fn scales_per_16_match_scalar_on_every_isa() {
        assert_every_isa_matches_scalar::<SubBlockI8>(&RAGGED_GEMM_SHAPES, &[2], (3, 4));
        assert_every_isa_matches_scalar::<SubBlockI8>(&L2_CROSSING_GEMM_SHAPES, &[1], (5, 6));
        assert_every_isa_matches_scalar::<SubBlockI8>(&PREFILL_GEMM_SHAPES, &[1, 2], (7, 8));
    }

    #[test]
    fn minimums_match_scalar_on_every_isa() {
        assert_every_isa_matches_scalar::<MinimumI8>(&RAGGED_GEMM_SHAPES, &[2], (3, 4));
        assert_every_isa_matches_scalar::<MinimumI8>(&L2_CROSSING_GEMM_SHAPES, &[1], (5, 6));
        assert_every_isa_matches_scalar::<MinimumI8>(&PREFILL_GEMM_SHAPES, &[1, 2], (7, 8));
    }

    #[test]
    fn minimums_product_equals_the_dequantised_operands_product() {
        assert_product_is_the_dequantised_operands(
            &MinimumI8::pack(&random(37 * 608, 3), 37, 608).0,
        );
    }

    #[test]
    fn scales_per_16_product_equals_the_dequantised_operands_product() {
        let w = SubBlockI8::pack(&random(37 * 608, 3), 37, 608).0;
        assert_eq!((w.scales.group_k(), w.scales.groups()), (16, w.k_pad / 16));
        assert_product_is_the_dequantised_operands(&w);
    }

    /// `gemm_i8` of `w` and random activations equals the f64 product of `w`'s weights
    /// (as `weight` gives them) and the dequantised activations.
    fn assert_product_is_the_dequantised_operands(w: &PackedI8) {
        let (m, k, n) = (3, w.k, w.n);
        let mut a = QuantizedRows::default();
        a.quantize(&random(m * k, 4), m, k, w.k_pad);
        let mut got = vec![0.0; m * n];
        gemm_i8(&ThreadPool::new(2).unwrap(), &a.view(), w, &mut got);
        for i in 0..m {
            for col in 0..n {
                let want: f64 = w
                    .dequantize_row(col)
                    .iter()
                    .enumerate()
                    .map(|(kk, &wv)| {
                        let a_scale = a.scales[i * w.n_blocks() + kk / BLOCK_K];
                        f64::from(wv) * f64::from(a.data[i * w.k_pad + kk]) * f64::from(a_scale)
                    })
                    .sum();
                let g = f64::from(got[i * n + col]);
                assert!(
                    (g - want).abs() < 1e-4 * want.abs().max(1.0),
                    "{g} vs {want}"
                );
            }
        }
    }

    #[test]
    fn super_block_scales_dequantise_to_the_exact_products() {
        let (n, k): (usize, usize) = (19, 256 + 48);
        let q: Vec<i8> = (0..n * k).map(|i| ((i * 7) % 64) as i8 - 32).collect();
        let d: Vec<f16> = (0..n * 2)
            .map(|i| f16::from_f32(0.0137 * (i as f32 + 1.0)))
            .collect();
        let sub: Vec<i8> = (0..n * k.div_ceil(16))
            .map(|i| (i % 251) as u8 as i8)
            .collect();
        let scales = Scales::super_block(n, k, 16, &d, &sub);
        let w = PackedI8::from_rows(n, k, scales, None, rows_of(&q, k)).expect("no -128");
        for row in 0..n {
            let want: Vec<f32> = (0..k)
                .map(|kk| {
                    let s = d[row * 2 + kk / 256].to_f32() * f32::from(sub[row * 19 + kk / 16]);
                    s * f32::from(q[row * k + kk])
                })
                .collect();
            assert_eq!(w.dequantize_row(row), want, "row {row}");
        }
        let one = Scales::super_block(1, 16, 16, &[f16::ONE], &[1]);
        let err = PackedI8::from_rows(1, 16, one, None, |_, out| out[3] = -128);
        assert_eq!(err.unwrap_err(), UnrepresentableCode { row: 0, col: 3 });
    }

    #[test]
    fn empty_inner_dimension_gives_zeros() {
        let pool = ThreadPool::new(2).unwrap();
        let w = PackedI8::quantize(&[], 5, 0);
        let mut a = QuantizedRows::default();
        a.quantize(&[], 3, 0, w.k_pad);
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; 15];
            gemm_i8_with(isa, &pool, &a.view(), &w, &mut out);
            assert!(out.iter().all(|&v| v == 0.0), "{isa}");
        }
    }

    #[test]
    fn int8_product_approximates_f32() {
        let (m, k, n) = (3, 256, 20);
        let (x, wf) = (random(m * k, 3), random(n * k, 4));
        let w = PackedI8::quantize(&wf, n, k);
        let mut a = QuantizedRows::default();
        a.quantize(&x, m, k, w.k_pad);
        let mut got = vec![0.0; m * n];
        gemm_i8(&ThreadPool::new(1).unwrap(), &a.view(), &w, &mut got);
        let mut want = vec![0.0; m * n];
        crate::matmul::matmul_scalar(&x, &wf, &mut want, m, k, n);
        for (g, e) in got.iter().zip(&want) {
            // Two 8-bit roundings of values in [-1, 1] over k = 256 terms.
            assert!((g - e).abs() < 0.1, "{g} vs {e}");
        }
    }

    #[test]
    fn quantize_row_is_symmetric_and_handles_zero() {
        let mut q = [0i8; 4];
        let s = quantize_row(&[1.0, -2.0, 0.5, 2.0], &mut q);
        assert_eq!(q, [64, -127, 32, 127]);
        assert!((s - 2.0 / 127.0).abs() < 1e-7);
        assert_eq!(quantize_row(&[0.0; 4], &mut q), 0.0);
        assert_eq!(q, [0; 4]);
    }

    #[test]
    fn excluded_channels_leave_the_scale_and_quantise_to_zero() {
        let mut x = vec![0.0f32; 40];
        x[..5].copy_from_slice(&[1.0, 300.0, -2.0, 0.5, -900.0]);
        x[33] = 4.0;
        x[35] = 1000.0;
        let (mut q, mut s) = ([9i8; 64], [0.0f32; 2]);
        quantize_blocks_excluding(&x, &[1, 4, 35], &mut q, &mut s);
        assert_eq!(q[..5], [64, 0, -127, 32, 0]);
        assert_eq!(q[32..36], [0, 127, 0, 0]);
        assert!(q[40..].iter().all(|&v| v == 0), "padding is zero");
        assert!((s[0] - 2.0 / 127.0).abs() < 1e-7 && (s[1] - 4.0 / 127.0).abs() < 1e-7);
        let mut sums = [0; 2];
        sum_blocks(&q, &mut sums);
        assert_eq!(sums, [64 - 127 + 32, 127]);
    }

    #[test]
    fn vectorised_activation_quantisation_matches_scalar() {
        // 40 whole blocks and a short one: the vector path's batches of sixteen blocks,
        // the last one short.
        let mut x: Vec<f32> = random(40 * BLOCK_K + 5, 9)
            .iter()
            .map(|v| v * 40.0)
            .collect();
        x[40..72].fill(0.0); // a zero run across two blocks
        x[75] = -0.0;
        x[100] = f32::NAN;
        x[130] = f32::INFINITY; // a block that cannot be scaled
        x[20 * BLOCK_K..21 * BLOCK_K].fill(0.0); // an all-zero block
        x[25 * BLOCK_K..26 * BLOCK_K].fill(-1e-40); // a subnormal maximum: 127 / max is ∞

        // Excluded: an infinity and the largest value (left out of their blocks' scales),
        // one on each side of a batch boundary, and a channel of the short last block.
        let excluded = [
            3,
            16 * BLOCK_K - 1,
            16 * BLOCK_K,
            37 * BLOCK_K + 8,
            40 * BLOCK_K + 2,
        ];
        x[3] = f32::INFINITY;
        x[37 * BLOCK_K + 8] = -5000.0;
        let run = |isa, x: &[f32], excluded: &[usize]| {
            let k_pad = x.len().div_ceil(BLOCK_K) * BLOCK_K;
            let (mut q, mut s) = (vec![7i8; k_pad], vec![-1.0f32; k_pad / BLOCK_K]);
            quantize_blocks_excluding_with(isa, x, excluded, &mut q, &mut s);
            (q, s.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
        };
        // And rows shorter than a block, a batch, or just past one.
        for len in [x.len(), 1, 17, BLOCK_K, 16 * BLOCK_K, 16 * BLOCK_K + 1] {
            let (x, excluded) = if len == x.len() {
                (&x[..], &excluded[..])
            } else {
                (&x[100..100 + len], &[0][..])
            };
            let expected = run(Isa::Scalar, x, excluded);
            for isa in Isa::available() {
                assert_eq!(run(isa, x, excluded), expected, "{isa}, {len} values");
            }
        }
    }

    #[test]
    fn vectorised_weight_packing_matches_scalar() {
        // Three row blocks, the last one short, and a short last block along `k`.
        let (n, k) = (37, 7 * BLOCK_K + 5);
        let mut w: Vec<f32> = random(n * k, 11).iter().map(|v| v * 40.0).collect();
        w[2 * k..3 * k].fill(0.0); // an all-zero row
        w[5 * k + 40] = f32::NAN;
        w[6 * k + 70] = f32::INFINITY; // a block that cannot be scaled
        w[20 * k + 100] = 1e30; // a scale past f16's range
        w[21 * k + 3] = -0.0;
        w[36 * k + k - 1] = -5000.0;
        let run = |isa| {
            let p = PackedI8::quantize_with(isa, &w, n, k);
            let scales: Vec<u32> = (0..n * p.n_blocks())
                .map(|i| p.scale(i / p.n_blocks(), i % p.n_blocks()).to_bits())
                .collect();
            (p.data, scales, p.block_sums)
        };
        let expected = run(Isa::Scalar);
        for isa in Isa::available() {
            assert!(run(isa) == expected, "{isa}");
        }
    }

    #[test]
    fn each_block_has_its_own_scale() {
        // A row whose halves differ 1000-fold keeps both halves' precision: within half a
        // step of its own block (a row-wide scale would round the small half to zero).
        let magnitude = |i: usize| if i < 32 { 1000.0 } else { 1.0 };
        let w: Vec<f32> = (0..64)
            .map(|i| magnitude(i) * ((i % 7) as f32 - 3.0))
            .collect();
        let p = PackedI8::quantize(&w, 1, 64);
        for (i, (got, want)) in p.dequantize_row(0).iter().zip(&w).enumerate() {
            let half_step = 3.0 * magnitude(i) / 254.0;
            assert!((got - want).abs() <= half_step * 1.001, "{got} vs {want}");
        }
    }

    /// `p`'s codes `[n, k]` and scales `[n, k / 32]`, row-major.
    fn unpacked(p: &PackedI8) -> (Vec<i8>, Vec<f16>) {
        let q = (0..p.n * p.k)
            .map(|i| p.data[packed_index(i / p.k, i % p.k, p.k_pad)])
            .collect();
        let n_blocks = p.n_blocks();
        let scales = (0..p.n * n_blocks)
            .map(|i| f16::from_f32(p.scale(i / n_blocks, i % n_blocks)))
            .collect();
        (q, scales)
    }

    #[test]
    fn from_rows_packs_what_quantize_packed() {
        // Padding along both axes, a shape without, and a tiny one.
        for (n, k) in [(37, 7 * BLOCK_K + 5), (16, 2 * BLOCK_K), (3, 10)] {
            let w: Vec<f32> = random(n * k, 12).iter().map(|v| v * 3.0).collect();
            let quantized = PackedI8::quantize(&w, n, k);
            let (q, scales) = unpacked(&quantized);
            let scales = Scales::per_block(n, k, &scales);
            let packed = PackedI8::from_rows(n, k, scales, None, rows_of(&q, k)).expect("no -128");
            assert_eq!((packed.n, packed.k, packed.k_pad), (n, k, quantized.k_pad));
            assert_eq!(packed.data, quantized.data, "{n}×{k}");
            assert_eq!(packed.scales, quantized.scales, "{n}×{k}");
            assert_eq!(packed.block_sums, quantized.block_sums, "{n}×{k}");
        }
    }

    #[test]
    fn from_rows_dequantises_to_its_inputs_exactly() {
        let (n, k) = (21, 3 * BLOCK_K + 7);
        let n_blocks = k.div_ceil(BLOCK_K);
        let q: Vec<i8> = (0..n * k)
            .map(|i| ((i * 37) % 255) as i8 / 2 * 2 + 1)
            .collect();
        let scales: Vec<f16> = (0..n * n_blocks)
            .map(|i| f16::from_f32((i as f32 - 30.0) * 0.0123))
            .collect();
        let per_block = Scales::per_block(n, k, &scales);
        let packed = PackedI8::from_rows(n, k, per_block, None, rows_of(&q, k)).expect("no -128");
        for row in 0..n {
            let want: Vec<f32> = (0..k)
                .map(|kk| {
                    scales[row * n_blocks + kk / BLOCK_K].to_f32() * f32::from(q[row * k + kk])
                })
                .collect();
            assert_eq!(packed.dequantize_row(row), want, "row {row}");
        }
    }

    #[test]
    fn from_rows_refuses_minus_128() {
        let mut q = vec![1i8; 2 * 40];
        q[40 + 33] = i8::MIN;
        let scales = Scales::per_block(2, 40, &[f16::ONE; 4]);
        let err = PackedI8::from_rows(2, 40, scales, None, rows_of(&q, 40)).unwrap_err();
        assert_eq!(err, UnrepresentableCode { row: 1, col: 33 });
    }

    #[test]
    fn packing_round_trips() {
        let (n, k) = (19, 10);
        let wf = random(n * k, 5);
        let w = PackedI8::quantize(&wf, n, k);
        for row in 0..n {
            for (got, want) in w
                .dequantize_row(row)
                .iter()
                .zip(&wf[row * k..(row + 1) * k])
            {
                assert!(
                    (got - want).abs() <= w.scale(row, 0) / 2.0 + 1e-6,
                    "{got} vs {want}"
                );
            }
        }
    }
}
