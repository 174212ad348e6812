//! K-quants: 256-element super-blocks split into sub-blocks, each with its own scale
//! (and for Q2_K/Q4_K/Q5_K, its own min), the scales themselves quantised against
//! per-super-block f16 factors. Callers pass exactly one super-block.
//!
//! Arithmetic follows GGML's reference order (scale products first, then code times
//! scale, then minus min) so results are bit-identical to other implementations.

use super::{codes, f16_at};
use crate::QK_K;

/// `scales[16], qs[64], d, dmin`: 16 sub-blocks of 16 two-bit codes; each scale byte is
/// a 4-bit scale (low) and 4-bit min (high). Codes are read 32 bytes at a time, every
/// pass taking the next two bits of each byte.
pub(super) fn dequant_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..QK_K / 16];
    let qs = &b[QK_K / 16..QK_K / 16 + QK_K / 4];
    let d = f16_at(b, QK_K / 16 + QK_K / 4);
    let dmin = f16_at(b, QK_K / 16 + QK_K / 4 + 2);
    for sub in 0..QK_K / 16 {
        let sc = scales[sub];
        let dl = d * (sc & 0x0f) as f32;
        let ml = dmin * (sc >> 4) as f32;
        // Sub-block `sub` lives in half (sub / 8) of qs, at bit pass (sub / 2) % 4,
        // in the first or second 16 bytes of that half's 32.
        let bytes = &qs[(sub / 8) * 32 + (sub % 2) * 16..][..16];
        let shift = 2 * ((sub / 2) % 4);
        for (l, &q) in bytes.iter().enumerate() {
            y[sub * 16 + l] = dl * ((q >> shift) & 3) as f32 - ml;
        }
    }
}

/// Q3_K: `(d · sc) · code` per sub-block of 16 ([`codes::q3_k_codes`]).
pub(super) fn dequant_q3_k(b: &[u8], y: &mut [f32]) {
    let mut codes = [0i8; QK_K];
    let scales = codes::q3_k_codes(b, &mut codes);
    sub_blocks_of_16(&scales, &codes, y);
}

/// Q4_K: `(d · sc) · nibble - dmin · m` per sub-block of 32 ([`codes::q4_k_codes`]).
pub(super) fn dequant_q4_k(b: &[u8], y: &mut [f32]) {
    let mut nibbles = [0u8; QK_K];
    let s = codes::q4_k_codes(b, &mut nibbles);
    with_minimums(&s, &nibbles, y);
}

/// `(d · sc[s]) · code - dmin · m[s]` over sub-blocks of 32: GGML's order for Q4_K and
/// Q5_K.
fn with_minimums(s: &codes::Q4KScales, codes: &[u8], y: &mut [f32]) {
    let (d, dmin) = (s.d.to_f32(), s.dmin.to_f32());
    for (sub, (y, q)) in y
        .chunks_exact_mut(32)
        .zip(codes.chunks_exact(32))
        .enumerate()
    {
        let dl = d * s.sc[sub] as f32;
        let ml = dmin * s.m[sub] as f32;
        for (y, &q) in y.iter_mut().zip(q) {
            *y = dl * q as f32 - ml;
        }
    }
}

/// Q5_K: `(d · sc) · code - dmin · m` per sub-block of 32 ([`codes::q5_k_codes`]).
pub(super) fn dequant_q5_k(b: &[u8], y: &mut [f32]) {
    let mut five_bits = [0u8; QK_K];
    let s = codes::q5_k_codes(b, &mut five_bits);
    with_minimums(&s, &five_bits, y);
}

/// Q6_K: `(d · sc) · code` per sub-block of 16 ([`codes::q6_k_codes`]).
pub(super) fn dequant_q6_k(b: &[u8], y: &mut [f32]) {
    let mut codes = [0i8; QK_K];
    let scales = codes::q6_k_codes(b, &mut codes);
    sub_blocks_of_16(&scales, &codes, y);
}

/// `(d · sc[s]) · code` over sub-blocks of 16: the product order of GGML's Q3_K and Q6_K
/// dequantisers.
fn sub_blocks_of_16(s: &codes::SubBlockScales, codes: &[i8], y: &mut [f32]) {
    let d = s.d.to_f32();
    for ((y, q), &sc) in y
        .chunks_exact_mut(16)
        .zip(codes.chunks_exact(16))
        .zip(&s.sc)
    {
        let dl = d * sc as f32;
        for (y, &q) in y.iter_mut().zip(q) {
            *y = dl * q as f32;
        }
    }
}

/// IQ4_XS: `(d · sc) · level` per sub-block of 32 ([`codes::iq4_xs_codes`]).
pub(super) fn dequant_iq4_xs(b: &[u8], y: &mut [f32]) {
    let mut levels = [0i8; QK_K];
    let (d, sc) = codes::iq4_xs_codes(b, &mut levels);
    let d = d.to_f32();
    for ((y, q), &sc) in y.chunks_exact_mut(32).zip(levels.chunks_exact(32)).zip(&sc) {
        let dl = d * sc as f32;
        for (y, &q) in y.iter_mut().zip(q) {
            *y = dl * q as f32;
        }
    }
}
