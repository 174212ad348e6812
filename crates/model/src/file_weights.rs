//! `--precision file`: projections exactly as the file stores them. Each block type the
//! integer kernels represent exactly is repacked without rounding again, its codes and
//! factors read by `pyramid_gguf::quants::codes`:
//!
//! - Q8_0 (`d`, 32 × i8, `w = d · q`) is [`PackedI8`]'s layout itself.
//! - Q4_1 (`d`, `m`, 32 nibbles, `w = d · q + m`) is [`PackedI4`]'s.
//! - Q4_0 (`d`, 32 nibbles, `w = d · (q - 8)`) is Q4_1 with `m = -8 · d`, which f16 holds
//!   exactly unless it overflows; a tensor where it would goes to [`PackedI8`] with codes
//!   `q - 8` instead, exact too.
//! - Q4_K (nibbles, a 6-bit scale and minimum per 32, f16 `d` and `dmin` per 256) is
//!   [`PackedI4`] with K-quant scales: the kernels multiply `d · sc` in f32, where it is
//!   exact ([`pyramid_kernels::scales`]).
//! - Q6_K and Q3_K (signed 6- and 3-bit codes, an 8-bit scale per 16, f16 `d` per 256) and
//!   Q5_0 (`w = d · (q - 16)`, q five bits, an f16 `d` per 32) are [`PackedI6`]: the codes
//!   offset to 0..=63 with a zero point of 32 or 16, at 6 bits per weight (Q3_K's 3.4 bits
//!   and Q5_0's 5.5 still take 6).
//! - Q5_1 and Q5_K (5-bit codes 0..=31 with a minimum per 32) are [`PackedI8`] with
//!   minimums.
//! - IQ4_NL and IQ4_XS (4-bit indices into sixteen INT8 levels, an f16 scale per 32, or a
//!   6-bit one per 32 under an f16 per 256) are [`PackedI8`] holding the levels.
//!
//! Float tensors keep their form: F32 and F16 in f32 (bf16 has fewer mantissa bits than
//! f16, and f32 holds every f16), BF16 in bf16. Q2_K (a minimum per 16, which the
//! activations' sums per 32 cannot carry) and the other IQ types are refused by name: a
//! second rounding is what `int8` and `int4` are for, never done silently here. No
//! calibration: activation outliers are found per token instead
//! ([`QuantLinear::from_file`]).
//!
//! The blocks are read from the mapped file and unpacked one tensor at a time (a byte per
//! weight at most), never through an f32 copy.

use half::f16;
use pyramid_gguf::quants::{self, codes};
use pyramid_gguf::{GgmlType, GgufError, QK_K};
use pyramid_kernels::int4::PackedI4;
use pyramid_kernels::int6::PackedI6;
use pyramid_kernels::int8::PackedI8;
use pyramid_kernels::scales::Scales;

use crate::checkpoint::TensorSource;
use crate::linear::{Linear, PackedWeights, QuantLinear};
use crate::weights::{check_dims, streamed_matrix, Matrix};
use crate::{ModelError, Precision, Result};

/// Elements per block of the types repacked here.
const QK: usize = 32;

/// The float precision a tensor of `ty` keeps, `None` for a block type.
pub(crate) fn float_precision(ty: GgmlType) -> Option<Precision> {
    match ty {
        GgmlType::F32 | GgmlType::F16 => Some(Precision::F32),
        GgmlType::BF16 => Some(Precision::Bf16),
        _ => None,
    }
}

/// The float form of a tensor whose type `float_precision` named.
fn float_linear(precision: Precision, m: Matrix) -> Linear {
    match precision {
        Precision::Bf16 => Linear::to_bf16(&m),
        _ => Linear::F32(m),
    }
}

/// Matrix `name` (`[Σ parts, n_cols]`) as consecutive blocks of `parts` rows (Phi-3's
/// fused projections; one part otherwise), each as the file stores it.
pub(crate) fn projections(
    file: &dyn TensorSource,
    name: &str,
    parts: &[usize],
    n_cols: usize,
) -> Result<Vec<Linear>> {
    let ty = file.tensor_type(name)?;
    let n_rows: usize = parts.iter().sum();
    if let Some(precision) = float_precision(ty) {
        let m = streamed_matrix(file, name, n_rows, n_cols)?;
        return Ok(match parts {
            [_] => vec![float_linear(precision, m)],
            _ => m
                .split_rows(parts)
                .into_iter()
                .map(|m| float_linear(precision, m))
                .collect(),
        });
    }
    check_dims(file, name, &[n_cols as u64, n_rows as u64])?;
    let row_bytes = row_bytes(name, ty, n_cols)?;
    let bytes = file.tensor_bytes(name)?;
    let mut at = 0;
    let linears = parts
        .iter()
        .map(|&n| {
            let part = &bytes[at * row_bytes..(at + n) * row_bytes];
            at += n;
            repack(name, ty, part, n, n_cols)
        })
        .collect();
    file.release(name);
    linears
}

/// Expert `expert` of the stacked experts' tensor `name` (`[n_rows, n_cols, n_expert]`),
/// as the file stores it.
pub(crate) fn expert(
    file: &dyn TensorSource,
    name: &str,
    expert: usize,
    [n_rows, n_cols, n_expert]: [usize; 3],
) -> Result<Linear> {
    let ty = file.tensor_type(name)?;
    if let Some(precision) = float_precision(ty) {
        let m = Matrix {
            data: file.expert_f32(name, expert, [n_rows, n_cols, n_expert])?,
            n_rows,
            n_cols,
        };
        return Ok(float_linear(precision, m));
    }
    check_dims(file, name, &[n_cols as u64, n_rows as u64, n_expert as u64])?;
    let expert_bytes = n_rows * row_bytes(name, ty, n_cols)?;
    let bytes = file.tensor_bytes(name)?;
    let start = expert * expert_bytes;
    let part = bytes
        .get(start..start + expert_bytes)
        .ok_or_else(|| ModelError::MissingTensor(format!("{name}, expert {expert}")))?;
    repack(name, ty, part, n_rows, n_cols)
}

/// Bytes of one row of `n_cols` elements of `ty`: rows are whole blocks in GGUF.
fn row_bytes(name: &str, ty: GgmlType, n_cols: usize) -> Result<usize> {
    ty.bytes_for(n_cols as u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| ModelError::FileBlocks {
            name: name.to_string(),
            reason: format!("rows of {n_cols} are not whole {ty} blocks"),
        })
}

/// Whether `--precision file` runs `ty`'s blocks exactly.
pub(crate) fn runs_blocks_of(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        Q8_0 | Q5_0 | Q5_1 | Q4_0 | Q4_1 | Q4K | Q5K | Q6K | Q3K | IQ4NL | IQ4XS
    )
}

/// `n_rows` rows of `n_cols` elements of `ty` (`bytes`, whole blocks) repacked exactly.
fn repack(name: &str, ty: GgmlType, bytes: &[u8], n_rows: usize, n_cols: usize) -> Result<Linear> {
    // A type no precision reads is named as the others name it, not as `file`'s gap.
    if !quants::can_dequantize(ty) {
        return Err(GgufError::UnsupportedTensor {
            tensor: name.to_string(),
            ty,
        }
        .into());
    }
    if !runs_blocks_of(ty) {
        return Err(ModelError::FileType {
            name: name.to_string(),
            ty,
        });
    }
    let inexact = |reason: String| ModelError::FileBlocks {
        name: name.to_string(),
        reason,
    };
    if bytes.len() != n_rows * row_bytes(name, ty, n_cols)? {
        return Err(inexact(format!(
            "{} bytes for {n_rows} rows of {n_cols} {ty}",
            bytes.len()
        )));
    }
    let blocks = || bytes.chunks_exact(ty.block_bytes());
    let f16_at = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]);
    let per_block = |at: usize| {
        let values: Vec<f16> = blocks().map(|b| f16_at(b, at)).collect();
        Scales::per_block(n_rows, n_cols, &values)
    };
    // Row `row`'s codes: each of its blocks decoded by `decode`, straight from the map.
    let row_len = row_bytes(name, ty, n_cols)?;
    let rows = |decode: fn(&[u8], &mut [i8])| {
        move |row: usize, out: &mut [i8]| {
            let row_blocks =
                bytes[row * row_len..(row + 1) * row_len].chunks_exact(ty.block_bytes());
            for (b, out) in row_blocks.zip(out.chunks_exact_mut(ty.block_len())) {
                decode(b, out);
            }
        }
    };
    let int8 = |scales: Scales, mins: Option<Scales>, decode: fn(&[u8], &mut [i8])| {
        PackedI8::from_rows(n_rows, n_cols, scales, mins, rows(decode))
            .map(PackedWeights::I8)
            .map_err(|e| inexact(e.to_string()))
    };
    // Signed codes of at most six bits, offset by `zero` into 0..=63.
    let six_bit = |zero: i8, scales: Scales, decode: fn(&[u8], &mut [i8])| {
        let signed = rows(decode);
        PackedWeights::I6(PackedI6::from_rows(
            n_rows,
            n_cols,
            zero as u8,
            scales,
            |row, out| {
                let mut codes = vec![0i8; out.len()];
                signed(row, &mut codes);
                for (o, &c) in out.iter_mut().zip(&codes) {
                    *o = (c + zero) as u8;
                }
            },
        ))
    };
    let packed = match ty {
        GgmlType::Q8_0 => int8(per_block(0), None, |b, out| {
            for (o, &v) in out.iter_mut().zip(&b[2..2 + QK]) {
                *o = v as i8;
            }
        })?,
        GgmlType::IQ4NL => int8(per_block(0), None, |b, out| {
            codes::iq4_nl_codes(b, out);
        })?,
        GgmlType::IQ4XS => {
            let (d, sc): (Vec<f16>, Vec<[i8; 8]>) = blocks().map(codes::iq4_xs_scales).unzip();
            let sc: Vec<i8> = sc.into_iter().flatten().collect();
            let scales = Scales::super_block(n_rows, n_cols, QK, &d, &sc);
            int8(scales, None, |b, out| {
                codes::iq4_xs_codes(b, out);
            })?
        }
        // Five-bit codes 0..=31 are INT8 codes with a minimum per block.
        GgmlType::Q5_1 => int8(per_block(0), Some(per_block(2)), |b, out| {
            let mut q = [0u8; QK];
            codes::q5_1_codes(b, &mut q);
            for (o, &v) in out.iter_mut().zip(&q) {
                *o = v as i8;
            }
        })?,
        GgmlType::Q5K => {
            let s: Vec<codes::Q4KScales> = blocks().map(codes::k4_scales).collect();
            let (scales, mins) = k_quant_scales(n_rows, n_cols, &s);
            int8(scales, Some(mins), |b, out| {
                let mut q = [0u8; QK_K];
                codes::q5_k_codes(b, &mut q);
                for (o, &v) in out.iter_mut().zip(&q) {
                    *o = v as i8;
                }
            })?
        }
        GgmlType::Q5_0 => six_bit(16, per_block(0), |b, out| {
            codes::q5_0_codes(b, out);
        }),
        GgmlType::Q6K | GgmlType::Q3K => {
            let read_scales: fn(&[u8]) -> codes::SubBlockScales = if ty == GgmlType::Q6K {
                codes::q6_k_scales
            } else {
                codes::q3_k_scales
            };
            let (d, sc): (Vec<f16>, Vec<[i8; 16]>) =
                blocks().map(read_scales).map(|s| (s.d, s.sc)).unzip();
            let sc: Vec<i8> = sc.into_iter().flatten().collect();
            let scales = Scales::super_block(n_rows, n_cols, QK / 2, &d, &sc);
            if ty == GgmlType::Q6K {
                six_bit(32, scales, |b, out| {
                    codes::q6_k_codes(b, out);
                })
            } else {
                six_bit(32, scales, |b, out| {
                    codes::q3_k_codes(b, out);
                })
            }
        }
        GgmlType::Q4K => {
            let s: Vec<codes::Q4KScales> = blocks().map(codes::k4_scales).collect();
            let (scales, mins) = k_quant_scales(n_rows, n_cols, &s);
            PackedWeights::I4(PackedI4::from_rows(
                n_rows,
                n_cols,
                scales,
                mins,
                |row, out| {
                    let row_blocks =
                        bytes[row * row_len..(row + 1) * row_len].chunks_exact(ty.block_bytes());
                    for (b, out) in row_blocks.zip(out.chunks_exact_mut(QK_K)) {
                        codes::q4_k_codes(b, out);
                    }
                },
            ))
        }
        _ => {
            // Q4_0 is `d, qs[16]`, Q4_1 `d, m, qs[16]`.
            let qs_at = if ty == GgmlType::Q4_1 { 4 } else { 2 };
            let nibbles = move |b: &[u8], out: &mut [u8]| {
                for (j, &byte) in b[qs_at..qs_at + QK / 2].iter().enumerate() {
                    (out[j], out[j + QK / 2]) = (byte & 0x0f, byte >> 4);
                }
            };
            // Q4_0's minimum, -8·d, is exact in f16 wherever it is finite.
            let mins: Option<Vec<f16>> = if ty == GgmlType::Q4_1 {
                Some(blocks().map(|b| f16_at(b, 2)).collect())
            } else {
                blocks()
                    .map(|b| {
                        Some(f16::from_f32(-8.0 * f16_at(b, 0).to_f32())).filter(|m| m.is_finite())
                    })
                    .collect()
            };
            match mins {
                Some(mins) => {
                    let mins = Scales::per_block(n_rows, n_cols, &mins);
                    PackedWeights::I4(PackedI4::from_rows(
                        n_rows,
                        n_cols,
                        per_block(0),
                        mins,
                        |row, out| {
                            let row_blocks = bytes[row * row_len..(row + 1) * row_len]
                                .chunks_exact(ty.block_bytes());
                            for (b, out) in row_blocks.zip(out.chunks_exact_mut(QK)) {
                                nibbles(b, out);
                            }
                        },
                    ))
                }
                // Where -8·d overflows, INT8 codes `q - 8` instead, exact too.
                None => int8(per_block(0), None, |b, out| {
                    let qs_at = 2;
                    for (j, &byte) in b[qs_at..qs_at + QK / 2].iter().enumerate() {
                        out[j] = (byte & 0x0f) as i8 - 8;
                        out[j + QK / 2] = (byte >> 4) as i8 - 8;
                    }
                })?,
            }
        }
    };
    Ok(Linear::Quant(Box::new(QuantLinear::from_file(packed))))
}

/// Q4_K's and Q5_K's factors as kernel scales, `w = code · (d · sc) + (-dmin) · m`.
fn k_quant_scales(n_rows: usize, n_cols: usize, blocks: &[codes::Q4KScales]) -> (Scales, Scales) {
    let six_bits = |v: &[u8; 8]| v.map(|x| x as i8);
    let d: Vec<f16> = blocks.iter().map(|s| s.d).collect();
    let minus_dmin: Vec<f16> = blocks.iter().map(|s| -s.dmin).collect();
    let sc: Vec<i8> = blocks.iter().flat_map(|s| six_bits(&s.sc)).collect();
    let m: Vec<i8> = blocks.iter().flat_map(|s| six_bits(&s.m)).collect();
    (
        Scales::super_block(n_rows, n_cols, QK, &d, &sc),
        Scales::super_block(n_rows, n_cols, QK, &minus_dmin, &m),
    )
}

/// Projections that share their prepared input (one site of a layer) must all be float
/// or all integer: an integer one reads the rows the first one prepared.
pub(crate) fn check_site(layer: usize, site: &[(&str, &Linear)]) -> Result<()> {
    let is_int = |l: &Linear| matches!(l, Linear::Quant(_));
    if let Some((first, lin)) = site.first() {
        if let Some((other, _)) = site.iter().find(|(_, l)| is_int(l) != is_int(lin)) {
            return Err(ModelError::FileBlocks {
                name: format!("blk.{layer}.{other}"),
                reason: format!(
                    "it shares its input with blk.{layer}.{first}, but one is stored in \
                     float and the other in blocks"
                ),
            });
        }
    }
    Ok(())
}
