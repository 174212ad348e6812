//! A block's integer codes and the factors that scale them, exactly as the file stores
//! them: what the dequantisers multiply out, and what a consumer running the file's own
//! precision packs for its integer kernels instead. Each layout's bit positions live here
//! once.
//!
//! Callers pass exactly one block of bytes and one block of codes.

use half::f16;

use crate::QK_K;

fn f16_at(b: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([b[at], b[at + 1]])
}

/// Q5_0 (`d, qh: u32, qs[16]`): returns `d` and writes the codes `q - 16` (in -16..=15),
/// so `w = d · code`.
pub fn q5_0_codes(b: &[u8], codes: &mut [i8]) -> f16 {
    let mut q = [0u8; 32];
    five_bit_codes(
        u32::from_le_bytes([b[2], b[3], b[4], b[5]]),
        &b[6..6 + 16],
        &mut q,
    );
    for (c, q) in codes.iter_mut().zip(q) {
        *c = q as i8 - 16;
    }
    f16_at(b, 0)
}

/// Q5_1 (`d, m, qh: u32, qs[16]`): returns `(d, m)` and writes the codes (0..=31), so
/// `w = d · code + m`; bits laid out as in Q5_0.
pub fn q5_1_codes(b: &[u8], codes: &mut [u8]) -> (f16, f16) {
    five_bit_codes(
        u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        &b[8..8 + 16],
        codes,
    );
    (f16_at(b, 0), f16_at(b, 2))
}

/// Q5_0's and Q5_1's codes: element `j`'s low four bits in byte `j % 16` of `qs` (the
/// low nibble for `j < 16`), its fifth in bit `j` of `qh`.
fn five_bit_codes(qh: u32, qs: &[u8], codes: &mut [u8]) {
    for (j, &q) in qs.iter().enumerate() {
        codes[j] = ((q & 0x0f) as u32 | ((qh >> j) & 1) << 4) as u8;
        codes[j + 16] = ((q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as u8;
    }
}

/// The factors of a Q4_K block: `w = (d · sc[s]) · nibble - dmin · m[s]` for sub-block
/// `s` of 32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Q4KScales {
    pub d: f16,
    pub dmin: f16,
    /// 6-bit scales, one per sub-block of 32.
    pub sc: [u8; 8],
    /// 6-bit minimums, one per sub-block of 32.
    pub m: [u8; 8],
}

/// Q4_K (`d, dmin, scales[12], qs[128]`): the nibbles (0..=15) and the factors. Each
/// 32-byte run of `qs` holds one sub-block in its low nibbles and the next in its high
/// ones. The eight 6-bit scale and minimum pairs fill 12 bytes: the first four keep their
/// low six bits in bytes 0..8; the last four keep four bits in bytes 8..12 and borrow the
/// spare top two bits of bytes 0..8.
pub fn q4_k_codes(b: &[u8], nibbles: &mut [u8]) -> Q4KScales {
    let qs = &b[16..16 + QK_K / 2];
    // Whole runs by iterators, which the compiler vectorises: a load decodes every weight
    // of a Q4_K file through here.
    for (pair, run) in nibbles[..QK_K]
        .chunks_exact_mut(64)
        .zip(qs.chunks_exact(32))
    {
        let (low, high) = pair.split_at_mut(32);
        for ((l, h), &q) in low.iter_mut().zip(high).zip(run) {
            (*l, *h) = (q & 0x0f, q >> 4);
        }
    }
    k4_scales(b)
}

/// Q5_K (`d, dmin, scales[12], qh[32], qs[128]`): the codes (0..=31) and the factors,
/// `w = (d · sc[s]) · code - dmin · m[s]`. Q4_K's nibbles, plus a fifth bit per element:
/// bit `s` of `qh[l]` belongs to element `l` of sub-block `s`.
pub fn q5_k_codes(b: &[u8], codes: &mut [u8]) -> Q4KScales {
    let qh = &b[16..16 + QK_K / 8];
    let qs = &b[16 + QK_K / 8..16 + QK_K / 8 + QK_K / 2];
    for sub in 0..QK_K / 32 {
        let shift = 4 * (sub % 2);
        for (l, (&q, &h)) in qs[(sub / 2) * 32..][..32].iter().zip(qh).enumerate() {
            codes[sub * 32 + l] = ((q >> shift) & 0x0f) | ((h >> sub) & 1) << 4;
        }
    }
    k4_scales(b)
}

/// The factors of a Q4_K or Q5_K block alone: the `d, dmin, scales[12]` that open it.
pub fn k4_scales(b: &[u8]) -> Q4KScales {
    let s = &b[4..16];
    let mut scales = Q4KScales {
        d: f16_at(b, 0),
        dmin: f16_at(b, 2),
        sc: [0; 8],
        m: [0; 8],
    };
    for j in 0..8 {
        (scales.sc[j], scales.m[j]) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0x0f) | (s[j - 4] >> 6) << 4,
                (s[j + 4] >> 4) | (s[j] >> 6) << 4,
            )
        };
    }
    scales
}

/// The factors of a Q6_K or Q3_K block: `w = (d · sc[s]) · code` for sub-block `s` of 16.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SubBlockScales {
    pub d: f16,
    pub sc: [i8; 16],
}

/// Q6_K (`ql[128], qh[64], scales[16]: i8, d`): the codes `q - 32` (in -32..=31) and
/// the factors. Each half of the block (128 elements) uses 64 bytes of `ql` (low nibbles
/// then high nibbles, in two 32-byte runs) and 32 bytes of `qh` (two bits for each of the
/// four 32-element quarters).
pub fn q6_k_codes(b: &[u8], codes: &mut [i8]) -> SubBlockScales {
    let ql = &b[0..QK_K / 2];
    let qh = &b[QK_K / 2..QK_K / 2 + QK_K / 4];
    let halves = codes[..QK_K].chunks_exact_mut(128);
    for (codes, (ql, qh)) in halves.zip(ql.chunks_exact(64).zip(qh.chunks_exact(32))) {
        for (quarter, codes) in codes.chunks_exact_mut(32).enumerate() {
            let low = &ql[(quarter % 2) * 32..][..32];
            let (nibble_shift, high_shift) = (4 * (quarter / 2), 2 * quarter);
            for ((c, &lo), &hi) in codes.iter_mut().zip(low).zip(qh) {
                let code = ((lo >> nibble_shift) & 0x0f) | ((hi >> high_shift) & 3) << 4;
                *c = code as i8 - 32;
            }
        }
    }
    q6_k_scales(b)
}

/// The factors of a Q6_K block alone.
pub fn q6_k_scales(b: &[u8]) -> SubBlockScales {
    let sc = &b[QK_K / 2 + QK_K / 4..QK_K / 2 + QK_K / 4 + QK_K / 16];
    SubBlockScales {
        d: f16_at(b, QK_K / 2 + QK_K / 4 + QK_K / 16),
        sc: std::array::from_fn(|s| sc[s] as i8),
    }
}

/// Q3_K (`hmask[32], qs[64], scales[12], d`): the codes (in -4..=3) and the factors.
/// A code is two low bits (laid out as in Q2_K: 32 bytes a half, each pass taking the
/// next two bits of each byte) plus a high bit from `hmask`, whose being clear means
/// subtract 4. The sixteen 6-bit signed scales (offset 32) keep their low nibbles in
/// bytes 0..8 and their top two bits in bytes 8..12.
pub fn q3_k_codes(b: &[u8], codes: &mut [i8]) -> SubBlockScales {
    let hmask = &b[0..QK_K / 8];
    let qs = &b[QK_K / 8..QK_K / 8 + QK_K / 4];
    for sub in 0..QK_K / 16 {
        let start = (sub % 2) * 16;
        let bytes = &qs[(sub / 8) * 32 + start..][..16];
        let masks = &hmask[start..start + 16];
        let shift = 2 * ((sub / 2) % 4);
        // The high bit of a pass comes from bit (pass index over the whole block).
        let hbit = 1u8 << (sub / 2);
        for (l, (&q, &m)) in bytes.iter().zip(masks).enumerate() {
            codes[sub * 16 + l] = ((q >> shift) & 3) as i8 - if m & hbit != 0 { 0 } else { 4 };
        }
    }
    q3_k_scales(b)
}

/// The factors of a Q3_K block alone.
pub fn q3_k_scales(b: &[u8]) -> SubBlockScales {
    let s = &b[QK_K / 8 + QK_K / 4..QK_K / 8 + QK_K / 4 + 12];
    let sc = std::array::from_fn(|sub| {
        let low = if sub < 8 {
            s[sub] & 0x0f
        } else {
            s[sub - 8] >> 4
        };
        let high = (s[8 + sub % 4] >> (2 * (sub / 4))) & 3;
        (low | high << 4) as i8 - 32
    });
    SubBlockScales {
        d: f16_at(b, QK_K / 8 + QK_K / 4 + 12),
        sc,
    }
}

/// IQ4_NL's and IQ4_XS's sixteen levels: a 4-bit code indexes an INT8 value.
pub const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Sixteen bytes of IQ4 codes as their levels: element `j` in the low nibble of byte `j`,
/// element `j + 16` in the high one.
fn iq4_levels(qs: &[u8], codes: &mut [i8]) {
    for (j, &q) in qs[..16].iter().enumerate() {
        codes[j] = IQ4_LEVELS[(q & 0x0f) as usize];
        codes[j + 16] = IQ4_LEVELS[(q >> 4) as usize];
    }
}

/// IQ4_NL (`d, qs[16]`): returns `d` and writes the levels, `w = d · level`.
pub fn iq4_nl_codes(b: &[u8], codes: &mut [i8]) -> f16 {
    iq4_levels(&b[2..18], codes);
    f16_at(b, 0)
}

/// IQ4_XS (`d, scales_h: u16, scales_l[4], qs[128]`): returns `d` and the eight 6-bit
/// scales less 32 (one per 32, `w = (d · sc) · level`), and writes the levels. Scale `s`
/// keeps its low four bits in nibble `s % 2` of `scales_l[s / 2]` and its top two in bits
/// `2s..2s + 2` of `scales_h`.
pub fn iq4_xs_codes(b: &[u8], codes: &mut [i8]) -> (f16, [i8; 8]) {
    let qs = &b[8..8 + QK_K / 2];
    for (s, codes) in codes.chunks_exact_mut(32).enumerate() {
        iq4_levels(&qs[s * 16..], codes);
    }
    iq4_xs_scales(b)
}

/// The factors of an IQ4_XS block alone.
pub fn iq4_xs_scales(b: &[u8]) -> (f16, [i8; 8]) {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..8];
    let sc = std::array::from_fn(|s| {
        let low = (scales_l[s / 2] >> (4 * (s % 2))) & 0x0f;
        let high = ((scales_h >> (2 * s)) & 3) as u8;
        (low | high << 4) as i8 - 32
    });
    (f16_at(b, 0), sc)
}
