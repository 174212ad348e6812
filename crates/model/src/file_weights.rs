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
    let blocks = bytes.chunks_exact(ty.block_bytes());
    let (n_blocks, row_len) = (blocks.len(), row_bytes(name, ty, n_cols)?);
    let f16_at = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]);
    let int8 = |q: &[i8], scales: &[f16]| {
        PackedI8::from_blocks(n_rows, n_cols, q, scales)
            .map(PackedWeights::I8)
            .map_err(|e| inexact(e.to_string()))
    };
    // Five-bit codes 0..=31 are INT8 codes with a minimum per block.
    let with_minimums = |q: &[u8], scales, mins| {
        let q: Vec<i8> = q.iter().map(|&v| v as i8).collect();
        PackedI8::with_minimums(n_rows, n_cols, &q, scales, mins)
            .map(PackedWeights::I8)
            .map_err(|e| inexact(e.to_string()))
    };
    let packed = match ty {
        GgmlType::Q8_0 => {
            let scales: Vec<f16> = blocks.clone().map(|b| f16_at(b, 0)).collect();
            let q: Vec<i8> = blocks
                .flat_map(|b| b[2..2 + QK].iter().map(|&v| v as i8))
                .collect();
            int8(&q, &scales)?
        }
        GgmlType::Q5_0 => {
            let mut q = vec![0i8; n_blocks * QK];
            let scales: Vec<f16> = blocks
                .zip(q.chunks_exact_mut(QK))
                .map(|(b, q)| codes::q5_0_codes(b, q))
                .collect();
            // Offset to 0..=31 in place: the same allocation, no second copy.
            let codes: Vec<u8> = q.into_iter().map(|v| (v + 16) as u8).collect();
            let scales = Scales::per_block(n_rows, n_cols, &scales);
            PackedWeights::I6(PackedI6::from_codes(n_rows, n_cols, &codes, 16, scales))
        }
        GgmlType::IQ4NL => {
            let mut q = vec![0i8; n_blocks * QK];
            let scales: Vec<f16> = blocks
                .zip(q.chunks_exact_mut(QK))
                .map(|(b, q)| codes::iq4_nl_codes(b, q))
                .collect();
            int8(&q, &scales)?
        }
        GgmlType::IQ4XS => {
            let mut q = vec![0i8; n_blocks * QK_K];
            let (mut d, mut sc) = (
                Vec::with_capacity(n_blocks),
                Vec::with_capacity(n_blocks * 8),
            );
            for (b, out) in blocks.zip(q.chunks_exact_mut(QK_K)) {
                let (block_d, block_sc) = codes::iq4_xs_codes(b, out);
                d.push(block_d);
                sc.extend(block_sc);
            }
            let scales = Scales::super_block(n_rows, n_cols, QK, &d, &sc);
            PackedWeights::I8(
                PackedI8::with_scales(n_rows, n_cols, &q, scales)
                    .map_err(|e| inexact(e.to_string()))?,
            )
        }
        GgmlType::Q5_1 => {
            let mut q = vec![0u8; n_blocks * QK];
            let (d, m): (Vec<f16>, Vec<f16>) = blocks
                .zip(q.chunks_exact_mut(QK))
                .map(|(b, q)| codes::q5_1_codes(b, q))
                .unzip();
            let (scales, mins) = (
                Scales::per_block(n_rows, n_cols, &d),
                Scales::per_block(n_rows, n_cols, &m),
            );
            with_minimums(&q, scales, mins)?
        }
        GgmlType::Q5K => {
            let mut q = vec![0u8; n_blocks * QK_K];
            let s: Vec<codes::Q4KScales> = blocks
                .zip(q.chunks_exact_mut(QK_K))
                .map(|(b, q)| codes::q5_k_codes(b, q))
                .collect();
            let (scales, mins) = k_quant_scales(n_rows, n_cols, &s);
            with_minimums(&q, scales, mins)?
        }
        GgmlType::Q4K => {
            let s: Vec<codes::Q4KScales> = blocks.map(codes::k4_scales).collect();
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
        GgmlType::Q6K | GgmlType::Q3K => {
            let six = ty == GgmlType::Q6K;
            let read_scales: fn(&[u8]) -> codes::SubBlockScales = if six {
                codes::q6_k_scales
            } else {
                codes::q3_k_scales
            };
            let read_codes: fn(&[u8], &mut [i8]) -> codes::SubBlockScales = if six {
                codes::q6_k_codes
            } else {
                codes::q3_k_codes
            };
            let (d, sc): (Vec<f16>, Vec<[i8; 16]>) =
                blocks.map(read_scales).map(|s| (s.d, s.sc)).unzip();
            let sc: Vec<i8> = sc.into_iter().flatten().collect();
            let scales = Scales::super_block(n_rows, n_cols, QK / 2, &d, &sc);
            PackedWeights::I6(PackedI6::from_rows(
                n_rows,
                n_cols,
                32,
                scales,
                |row, out| {
                    let row_blocks =
                        bytes[row * row_len..(row + 1) * row_len].chunks_exact(ty.block_bytes());
                    let mut q = [0i8; QK_K];
                    for (b, out) in row_blocks.zip(out.chunks_exact_mut(QK_K)) {
                        read_codes(b, &mut q);
                        for (o, &v) in out.iter_mut().zip(&q) {
                            *o = (v + 32) as u8;
                        }
                    }
                },
            ))
        }
        _ => {
            // Q4_0 is `d, qs[16]`, Q4_1 `d, m, qs[16]`; byte `j` of `qs` holds element `j`
            // in its low nibble and element `j + 16` in its high one.
            let qs_at = if ty == GgmlType::Q4_1 { 4 } else { 2 };
            let scales: Vec<f16> = blocks.clone().map(|b| f16_at(b, 0)).collect();
            let mut nibbles = vec![0u8; n_blocks * QK];
            for (b, out) in blocks.clone().zip(nibbles.chunks_exact_mut(QK)) {
                for (j, &byte) in b[qs_at..qs_at + QK / 2].iter().enumerate() {
                    (out[j], out[j + QK / 2]) = (byte & 0x0f, byte >> 4);
                }
            }
            let mins: Option<Vec<f16>> = if ty == GgmlType::Q4_1 {
                Some(blocks.map(|b| f16_at(b, 2)).collect())
            } else {
                // -8·d is exact in f16 wherever it is finite.
                scales
                    .iter()
                    .map(|d| Some(f16::from_f32(-8.0 * d.to_f32())).filter(|m| m.is_finite()))
                    .collect()
            };
            match mins {
                Some(mins) => PackedWeights::I4(PackedI4::from_groups(
                    n_rows, n_cols, &nibbles, &scales, &mins,
                )),
                None => {
                    let q: Vec<i8> = nibbles.iter().map(|&v| v as i8 - 8).collect();
                    int8(&q, &scales)?
                }
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
