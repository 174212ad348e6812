//! W6A8 for GGUF's 5- and 6-bit blocks (Q6_K, Q3_K, Q5_0) at the file's own size: codes
//! `u` in 0..=63 with a zero point, `w = (u - zero) · scale`, one scale per row and group
//! of 16 (Q6_K's and Q3_K's sub-blocks, zero 32) or 32 (Q5_0, zero 16).
//!
//! As INT8 codes these blocks cost 1.07–1.19 bytes per weight against the file's 0.69–0.82,
//! and decode reads every byte per token. Here a code is its low nibble, in
//! [`PackedI4`](crate::int4::PackedI4)'s layout (32 bytes per group of sixteen rows × four
//! `k`), plus its top two bits in a plane of 16 bytes per group: byte `j` holds the bits of
//! positions `j`, `j + 16`, `j + 32` and `j + 48` of the group's 64 codes (rows 0–7 in
//! positions 0–31, rows 8–15 in 32–63, four `k` per row), two bits each from bit 0 up. A
//! kernel broadcasts the plane to four 16-byte lanes, shifts lane `i` right by `2i`, masks
//! two bits and lifts them above the nibbles: 0.75 bytes per weight plus the scales.
//!
//! Unsigned codes multiply signed activations exactly (`vpdpbusd`, `vpmaddubsw` whose pair
//! sums stay below 2¹⁵), and the zero point comes out once per group: `Σ a·w = scale ·
//! (Σ a·u - zero · Σ a)`, with `Σ a` summed from the activation bytes in the kernel. Every
//! variant computes the same integer per group and scales it in the same order, so all
//! agree with the scalar oracle bit for bit.

mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::ops::Range;

use rayon::prelude::*;

use crate::int4::{block_rows, lay_out_nibbles, lay_out_quads, GROUP_BYTES as NIBBLE_BYTES};
use crate::int8::{
    check_operands, column_blocks, QuantizedView, BLOCK_K, K_PER_GROUP, ROWS_PER_BLOCK,
};
use crate::isa::{self, Isa};
use crate::scales::Scales;
use crate::threadpool::{SharedSlice, ThreadPool};
use crate::COLUMN_ALIGN;

/// Bytes of one group's high-bit plane.
pub(crate) const PLANE_BYTES: usize = 16;

/// 6-bit weights `[n, k]` with a zero point and one scale per row and group of 16 or 32.
#[derive(Debug, Clone)]
pub struct PackedI6 {
    pub n: usize,
    pub k: usize,
    /// `k` rounded up to whole blocks of 32; the padding is zero.
    pub k_pad: usize,
    /// Low nibbles, `[n_pad / 16][k_pad / 4][32]` as in `PackedI4`.
    pub nibbles: Vec<u8>,
    /// Top two bits, `[n_pad / 16][k_pad / 4][16]` (see the module documentation).
    pub high: Vec<u8>,
    /// Subtracted from every code: 32 for Q6_K and Q3_K, 16 for Q5_0.
    pub zero: u8,
    /// One per row and group of 16 or 32 along `k`.
    pub scales: Scales,
}

/// Position of row `r` (of a 16-row block) and `k` index `j` (of a group of four) among the
/// group's 64 codes.
#[inline]
fn position(r: usize, j: usize) -> usize {
    (r / 8) * 32 + (r % 8) * K_PER_GROUP + j
}

impl PackedI6 {
    /// Packs codes exactly, `w = (code - zero) · scale` with `scales` of groups of 16 or 32
    /// (from [`Scales::super_block`] or [`Scales::per_block`]): `row_codes(row, out)` writes
    /// row `row`'s `k` codes, each in `0..=63`, so a caller decodes its blocks one row at a
    /// time with no copy of the whole matrix. Row blocks are packed on every core.
    pub fn from_rows(
        n: usize,
        k: usize,
        zero: u8,
        scales: Scales,
        row_codes: impl Fn(usize, &mut [u8]) + Sync,
    ) -> Self {
        let k_pad = k.div_ceil(BLOCK_K) * BLOCK_K;
        let n_pad = n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
        assert!(
            BLOCK_K.is_multiple_of(scales.group_k())
                && scales.groups() * scales.group_k() == k_pad
                && scales.covers(n_pad),
            "one scale per row and group of 16 or 32"
        );
        let groups_per_row = k_pad / K_PER_GROUP;
        let mut nibbles = vec![0u8; n_pad * k_pad / 2];
        let mut high = vec![0u8; n_pad * k_pad / 4];
        if n > 0 && k > 0 {
            nibbles
                .par_chunks_mut(groups_per_row * NIBBLE_BYTES)
                .zip(high.par_chunks_mut(groups_per_row * PLANE_BYTES))
                .enumerate()
                .for_each(|(block, (nibbles, high))| {
                    // The block's rows decoded whole, then combined a byte per `k` and
                    // laid out a group's four bytes at a time (see `position`): rows `r`
                    // and `r + 8` share a nibble byte, rows `a`, `a + 4`, `a + 8` and
                    // `a + 12` a plane byte.
                    let rows = block_rows(block, (n, k, k_pad), 6, &row_codes);
                    let mut combined = vec![0u8; k_pad];
                    lay_out_nibbles(&rows, &mut combined, nibbles);
                    let row = |r: usize| &rows[r * k_pad..][..k_pad];
                    for a in 0..ROWS_PER_BLOCK / 4 {
                        let quads = row(a).iter().zip(row(a + 4));
                        let quads = quads.zip(row(a + 8).iter().zip(row(a + 12)));
                        for (b, ((&c0, &c1), (&c2, &c3))) in combined.iter_mut().zip(quads) {
                            *b = c0 >> 4 | (c1 >> 4) << 2 | (c2 >> 4) << 4 | (c3 >> 4) << 6;
                        }
                        lay_out_quads(&combined, high, PLANE_BYTES, a);
                    }
                });
        }
        Self {
            n,
            k,
            k_pad,
            nibbles,
            high,
            zero,
            scales,
        }
    }

    /// The code of `w[row][kk]`, in `0..=63`.
    pub fn code(&self, row: usize, kk: usize) -> u8 {
        let (block, r) = (row / ROWS_PER_BLOCK, row % ROWS_PER_BLOCK);
        let group = block * (self.k_pad / K_PER_GROUP) + kk / K_PER_GROUP;
        let p = position(r, kk % K_PER_GROUP);
        let byte = self.nibbles[group * NIBBLE_BYTES + p % 32];
        let low = if p < 32 { byte & 0x0f } else { byte >> 4 };
        let high = (self.high[group * PLANE_BYTES + p % 16] >> (2 * (p / 16))) & 3;
        low | high << 4
    }

    /// `w[row][kk]` as the kernels see it.
    #[inline]
    pub fn weight(&self, row: usize, kk: usize) -> f32 {
        let code = i32::from(self.code(row, kk)) - i32::from(self.zero);
        code as f32 * self.scales.get(row, kk / self.scales.group_k())
    }

    /// The weight as the kernels see it, back in f32, into `out` (`[k]`).
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        for (kk, o) in out[..self.k].iter_mut().enumerate() {
            *o = self.weight(row, kk);
        }
    }

    /// `out[i] += v · w[cols.start + i][kk]`, as [`PackedI8::add_column`](crate::int8::PackedI8::add_column).
    pub fn add_column(&self, kk: usize, v: f32, out: &mut [f32], cols: Range<usize>) {
        self.add_column_with(isa::active(), kk, v, out, cols)
    }

    /// As [`PackedI6::add_column`] with an explicit ISA: the same sums on every ISA.
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
        self.nibbles.len() + self.high.len() + self.scales.bytes()
    }
}

/// `out[m, n] = dequant(a) · dequant(w)ᵀ` with the active ISA.
pub fn gemm_i6(pool: &ThreadPool, a: &QuantizedView<'_>, w: &PackedI6, out: &mut [f32]) {
    gemm_i6_with(isa::active(), pool, a, w, out)
}

/// As [`gemm_i6`] with an explicit ISA (tests compare every ISA against scalar).
pub fn gemm_i6_with(
    isa: Isa,
    pool: &ThreadPool,
    a: &QuantizedView<'_>,
    w: &PackedI6,
    out: &mut [f32],
) {
    let out = SharedSlice::new(out);
    pool.run_team(&|team| {
        // SAFETY: the team's column splits are disjoint; `out` is not read until the end.
        unsafe { gemm_i6_cols(isa, a, w, &out, team.split(w.n, COLUMN_ALIGN)) }
    });
}

/// Computes output columns `cols` of every row: one thread's part of a [`gemm_i6`].
/// `cols` starts on a multiple of [`COLUMN_ALIGN`].
///
/// # Safety
/// No other thread accesses these columns of `out` until the next barrier.
pub unsafe fn gemm_i6_cols(
    isa: Isa,
    a: &QuantizedView<'_>,
    w: &PackedI6,
    out: &SharedSlice<'_, f32>,
    cols: Range<usize>,
) {
    check_operands(a, (w.n, w.k, w.k_pad), out, false);
    let n_pad = w.n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
    // The kernels load whole 16-row groups and 4-byte activation groups unchecked.
    assert!(
        w.nibbles.len() == n_pad * w.k_pad / 2 && w.high.len() == n_pad * w.k_pad / 4,
        "packed weights must be [n_pad, k_pad] codes"
    );
    assert!(
        BLOCK_K.is_multiple_of(w.scales.group_k())
            && w.scales.groups() * w.scales.group_k() == w.k_pad
            && w.scales.covers(n_pad),
        "one scale per row and group of 16 or 32"
    );
    let Some(blocks) = column_blocks(cols, w.n) else {
        return;
    };
    isa.assert_supported();
    let out = out.as_mut_ptr();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and above have AVX-512F; `has_vnni` checked VNNI and BW. The
        // tiles sum whole blocks of 32, so `Isa::Amx` runs the VNNI kernel here.
        Isa::Amx | Isa::Avx512 if crate::int8::x86::has_vnni() => {
            x86::gemm_blocks_vnni(a, w, out, blocks)
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::AvxVnni` is only selected when the CPU has AVX2, FMA, F16C and
        // AVX-VNNI (asserted above).
        Isa::AvxVnni => x86::gemm_blocks_avxvnni(a, w, out, blocks),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2, FMA and F16C for `Isa::Avx2` and above.
        Isa::Amx | Isa::Avx512 | Isa::Avx2 => x86::gemm_blocks_avx2(a, w, out, blocks),
        _ => reference::gemm_blocks_scalar(a, w, out, blocks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::QuantizedRows;
    use crate::test_support::{
        assert_an_empty_column_range_writes_nothing, assert_every_isa_matches_scalar, random,
        refuse_a_range_ending_inside_a_block, rows_of, PackedGemm, L2_CROSSING_GEMM_SHAPES,
        PREFILL_GEMM_SHAPES, RAGGED_GEMM_SHAPES,
    };
    use half::f16;

    #[test]
    fn every_isa_matches_scalar_exactly() {
        assert_every_isa_matches_scalar::<PackedI6>(&RAGGED_GEMM_SHAPES, &[2], (3, 4));
        assert_every_isa_matches_scalar::<PackedI6>(&L2_CROSSING_GEMM_SHAPES, &[1], (5, 6));
        assert_every_isa_matches_scalar::<PackedI6>(&PREFILL_GEMM_SHAPES, &[1, 2], (7, 8));
    }

    /// Scales per 32 and a zero point of 16 (Q5_0's form) through every ISA too.
    #[test]
    fn blocks_of_32_match_scalar_exactly() {
        struct Q5(PackedI6);
        impl PackedGemm for Q5 {
            fn pack(w: &[f32], n: usize, k: usize) -> Self {
                let codes: Vec<u8> = w.iter().map(|v| ((v + 1.0) * 15.5).round() as u8).collect();
                let scales: Vec<f16> = (0..n * k.div_ceil(32))
                    .map(|i| f16::from_f32(0.01 + (i % 7) as f32 * 0.003))
                    .collect();
                let scales = Scales::per_block(n, k, &scales);
                Q5(PackedI6::from_rows(n, k, 16, scales, rows_of(&codes, k)))
            }
            fn k_pad(&self) -> usize {
                self.0.k_pad
            }
            fn gemm_with(
                isa: Isa,
                pool: &ThreadPool,
                a: &QuantizedView<'_>,
                w: &Self,
                out: &mut [f32],
            ) {
                gemm_i6_with(isa, pool, a, &w.0, out)
            }
            unsafe fn gemm_cols(
                isa: Isa,
                a: &QuantizedView<'_>,
                w: &Self,
                out: &SharedSlice<'_, f32>,
                cols: Range<usize>,
            ) {
                gemm_i6_cols(isa, a, &w.0, out, cols)
            }
        }
        assert_every_isa_matches_scalar::<Q5>(&RAGGED_GEMM_SHAPES, &[2], (3, 4));
        assert_every_isa_matches_scalar::<Q5>(&PREFILL_GEMM_SHAPES, &[1], (7, 8));
    }

    #[test]
    fn an_empty_column_range_writes_nothing() {
        assert_an_empty_column_range_writes_nothing::<PackedI6>();
    }

    #[test]
    #[should_panic(expected = "end on a block or at n")]
    fn a_range_ending_inside_a_block_is_refused() {
        refuse_a_range_ending_inside_a_block::<PackedI6>();
    }

    #[test]
    fn codes_round_trip_and_the_product_is_the_dequantised_operands() {
        let (m, n, k) = (3, 37, 2 * 256 + 96);
        let w = PackedI6::pack(&random(n * k, 3), n, k);
        let codes: Vec<u8> = random(n * k, 3)
            .iter()
            .map(|v| ((v + 1.0) * 31.5).round() as u8)
            .collect();
        for row in 0..n {
            for kk in 0..k {
                assert_eq!(w.code(row, kk), codes[row * k + kk], "row {row} k {kk}");
            }
        }
        let mut a = QuantizedRows::default();
        a.quantize(&random(m * k, 4), m, k, w.k_pad);
        let mut got = vec![0.0; m * n];
        gemm_i6(&ThreadPool::new(2).unwrap(), &a.view(), &w, &mut got);
        let mut row = vec![0.0; k];
        for col in 0..n {
            w.dequantize_row_into(col, &mut row);
            for i in 0..m {
                let want: f64 = row
                    .iter()
                    .enumerate()
                    .map(|(kk, &wv)| {
                        let a_scale = a.scales[i * (w.k_pad / BLOCK_K) + kk / BLOCK_K];
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
}
