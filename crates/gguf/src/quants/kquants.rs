//! K-quants: 256-element super-blocks split into sub-blocks, each with its own scale
//! (and for Q2_K/Q4_K/Q5_K, its own min), the scales themselves quantised against
//! per-super-block f16 factors. Callers pass exactly one super-block.
//!
//! Arithmetic follows GGML's reference order (scale products first, then code times
//! scale, then minus min) so results are bit-identical to other implementations.

use super::f16_at;
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

/// `hmask[32], qs[64], scales[12], d`: 3-bit codes as two low bits (laid out as in
/// Q2_K) plus a high bit from `hmask`; a clear high bit means subtract 4. Sixteen 6-bit
/// signed scales (offset 32): low nibbles in bytes 0..8, top two bits in bytes 8..12.
pub(super) fn dequant_q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..QK_K / 8];
    let qs = &b[QK_K / 8..QK_K / 8 + QK_K / 4];
    let sc = &b[QK_K / 8 + QK_K / 4..QK_K / 8 + QK_K / 4 + 12];
    let d = f16_at(b, QK_K / 8 + QK_K / 4 + 12);
    for sub in 0..QK_K / 16 {
        let low = if sub < 8 {
            sc[sub] & 0x0f
        } else {
            sc[sub - 8] >> 4
        };
        let high = (sc[8 + sub % 4] >> (2 * (sub / 4))) & 3;
        let scale = (low | high << 4) as i32 - 32;
        let dl = d * scale as f32;
        let start = (sub % 2) * 16;
        let bytes = &qs[(sub / 8) * 32 + start..][..16];
        let masks = &hmask[start..start + 16];
        let shift = 2 * ((sub / 2) % 4);
        // The high bit of a pass comes from bit (pass index over the whole block).
        let hbit = 1u8 << (sub / 2);
        for (l, (&q, &m)) in bytes.iter().zip(masks).enumerate() {
            let code = ((q >> shift) & 3) as i32 - if m & hbit != 0 { 0 } else { 4 };
            y[sub * 16 + l] = dl * code as f32;
        }
    }
}

/// Scale and min `j` (0..8) of a Q4_K/Q5_K block: eight 6-bit pairs in 12 bytes. The
/// first four keep their low six bits in bytes 0..8; the last four keep four bits in
/// bytes 8..12 and borrow the spare top two bits of bytes 0..8.
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4,
            (s[j + 4] >> 4) | (s[j] >> 6) << 4,
        )
    }
}

/// `d, dmin, scales[12], qs[128]`: eight sub-blocks of 32 four-bit codes; each 32-byte
/// run of qs holds one sub-block in low nibbles and the next in high nibbles.
pub(super) fn dequant_q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..16 + QK_K / 2];
    for sub in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(sub, scales);
        let dl = d * sc as f32;
        let ml = dmin * m as f32;
        let shift = 4 * (sub % 2);
        for (l, &q) in qs[(sub / 2) * 32..][..32].iter().enumerate() {
            y[sub * 32 + l] = dl * ((q >> shift) & 0x0f) as f32 - ml;
        }
    }
}

/// `d, dmin, scales[12], qh[32], qs[128]`: Q4_K plus a fifth bit per element; bit `sub`
/// of `qh[l]` belongs to element `l` of sub-block `sub`.
pub(super) fn dequant_q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..16 + QK_K / 8];
    let qs = &b[16 + QK_K / 8..16 + QK_K / 8 + QK_K / 2];
    for sub in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(sub, scales);
        let dl = d * sc as f32;
        let ml = dmin * m as f32;
        let shift = 4 * (sub % 2);
        let bytes = &qs[(sub / 2) * 32..][..32];
        for (l, (&q, &h)) in bytes.iter().zip(qh).enumerate() {
            let code = ((q >> shift) & 0x0f) | ((h >> sub) & 1) << 4;
            y[sub * 32 + l] = dl * code as f32 - ml;
        }
    }
}

/// `ql[128], qh[64], scales[16]: i8, d`: 6-bit codes (offset 32), sixteen sub-blocks of
/// 16 with signed 8-bit scales. Each half of the block (128 elements) uses 64 bytes of
/// ql (low nibbles then high nibbles, in two 32-byte runs) and 32 bytes of qh (two bits
/// for each of the four 32-element quarters).
pub(super) fn dequant_q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..QK_K / 2];
    let qh = &b[QK_K / 2..QK_K / 2 + QK_K / 4];
    let scales = &b[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
    let d = f16_at(b, QK_K / 2 + QK_K / 4 + QK_K / 16);
    for half in 0..2 {
        let ql = &ql[half * 64..][..64];
        let qh = &qh[half * 32..][..32];
        let y = &mut y[half * 128..][..128];
        for quarter in 0..4 {
            let low = &ql[(quarter % 2) * 32..][..32];
            let nibble_shift = 4 * (quarter / 2);
            let high_shift = 2 * quarter;
            for l in 0..32 {
                let code = ((low[l] >> nibble_shift) & 0x0f) | ((qh[l] >> high_shift) & 3) << 4;
                let scale = scales[half * 8 + quarter * 2 + l / 16] as i8;
                y[quarter * 32 + l] = d * scale as f32 * (code as i32 - 32) as f32;
            }
        }
    }
}
