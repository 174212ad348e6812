//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and IQ4_NL.
//!
//! Within a block, 4-bit codes pack element `j` in the low nibble of byte `j` and element
//! `j + 16` in the high nibble; Q5 types keep each element's fifth bit in a 32-bit mask.
//! Callers pass exactly one block of bytes and one block of elements.

use half::f16;

use super::f16_at;

const QK: usize = 32;

/// `d, qs[16]`: x = d * (q - 8).
pub(super) fn dequant_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..2 + QK / 2];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = d * ((q & 0x0f) as i32 - 8) as f32;
        y[j + QK / 2] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// `d, m, qs[16]`: x = d * q + m.
pub(super) fn dequant_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..4 + QK / 2];
    for (j, &q) in qs.iter().enumerate() {
        y[j] = d * (q & 0x0f) as f32 + m;
        y[j + QK / 2] = d * (q >> 4) as f32 + m;
    }
}

/// Q5_0: `d · code` ([`super::codes::q5_0_codes`]).
pub(super) fn dequant_q5_0(b: &[u8], y: &mut [f32]) {
    let mut codes = [0i8; QK];
    let d = super::codes::q5_0_codes(b, &mut codes).to_f32();
    for (y, &q) in y.iter_mut().zip(&codes) {
        *y = d * q as f32;
    }
}

/// Q5_1: `d · code + m` ([`super::codes::q5_1_codes`]).
pub(super) fn dequant_q5_1(b: &[u8], y: &mut [f32]) {
    let mut codes = [0u8; QK];
    let (d, m) = super::codes::q5_1_codes(b, &mut codes);
    let (d, m) = (d.to_f32(), m.to_f32());
    for (y, &q) in y.iter_mut().zip(&codes) {
        *y = d * q as f32 + m;
    }
}

/// `d, qs[32]: i8`: x = d * q.
pub(super) fn dequant_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (yj, &q) in y.iter_mut().zip(&b[2..2 + QK]) {
        *yj = d * (q as i8) as f32;
    }
}

/// The element of largest magnitude, keeping its sign; the first one wins ties, as in GGML.
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// Inverse scale, with 0 for an all-zero block so every code becomes the zero point.
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// Writes `d` (and `m` for the offset types) then the low nibbles of `q`, and returns the
/// high bits of every code as Q5's 32-bit mask.
fn pack_nibbles(q: &[u8; QK], qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0f) | (q[j + QK / 2] & 0x0f) << 4;
        qh |= ((q[j] >> 4) as u32 & 1) << j;
        qh |= ((q[j + QK / 2] >> 4) as u32 & 1) << (j + QK / 2);
    }
    qh
}

/// Symmetric codes: the largest-magnitude element maps to code 0 (it is `-half * d`).
fn symmetric_codes(x: &[f32], half: f32, top: i32) -> (f32, [u8; QK]) {
    let d = signed_absmax(x) / -half;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        // Truncation after adding half+0.5 rounds to nearest; `as` saturates, NaN -> 0.
        *qj = ((v * id + (half + 0.5)) as i32).clamp(0, top) as u8;
    }
    (d, q)
}

/// Offset codes spanning [min, max] in `top` steps.
fn offset_codes(x: &[f32], top: i32) -> (f32, f32, [u8; QK]) {
    let (min, max) = min_max(x);
    let d = (max - min) / top as f32;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = (((v - min) * id + 0.5) as i32).clamp(0, top) as u8;
    }
    (d, min, q)
}

pub(super) fn quant_q4_0(x: &[f32], b: &mut [u8]) {
    let (d, q) = symmetric_codes(x, 8.0, 15);
    b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    pack_nibbles(&q, &mut b[2..]);
}

pub(super) fn quant_q4_1(x: &[f32], b: &mut [u8]) {
    let (d, m, q) = offset_codes(x, 15);
    b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
    pack_nibbles(&q, &mut b[4..]);
}

pub(super) fn quant_q5_0(x: &[f32], b: &mut [u8]) {
    let (d, q) = symmetric_codes(x, 16.0, 31);
    b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let qh = pack_nibbles(&q, &mut b[6..]);
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

pub(super) fn quant_q5_1(x: &[f32], b: &mut [u8]) {
    let (d, m, q) = offset_codes(x, 31);
    b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    b[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
    let qh = pack_nibbles(&q, &mut b[8..]);
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

/// d = absmax / 127, codes rounded half away from zero (C's `roundf`).
pub(super) fn quant_q8_0(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    b[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (bj, &v) in b[2..2 + QK].iter_mut().zip(x) {
        *bj = ((v * id).round() as i8) as u8;
    }
}

/// IQ4_NL: `d · level` ([`super::codes::iq4_nl_codes`]).
pub(super) fn dequant_iq4_nl(b: &[u8], y: &mut [f32]) {
    let mut levels = [0i8; QK];
    let d = super::codes::iq4_nl_codes(b, &mut levels).to_f32();
    for (y, &q) in y.iter_mut().zip(&levels) {
        *y = d * q as f32;
    }
}
