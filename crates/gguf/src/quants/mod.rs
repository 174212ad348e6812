//! Block dequantisation to f32, and round-to-nearest reference quantisers.
//!
//! Layouts follow GGML (little endian, f16 scales). Every function checks the byte
//! count against the element count first, so no input can index out of bounds.

pub mod codes;
mod kquants;
mod legacy;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::{GgmlType, GgufError, Result};

/// Whether [`dequantize`] handles `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q2K
            | Q3K
            | Q4K
            | Q5K
            | Q6K
            | IQ4NL
            | IQ4XS
    )
}

/// Whether [`quantize`] handles `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0)
}

/// Bytes that `n_elements` of `ty` occupy, as an error naming the problem when the count
/// is not a whole number of blocks.
fn expected_bytes(ty: GgmlType, n_elements: usize) -> Result<usize> {
    ty.bytes_for(n_elements as u64)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            GgufError::Invalid(format!(
                "{n_elements} elements are not a whole number of {ty} blocks of {}",
                ty.block_len()
            ))
        })
}

/// Dequantises `data`, holding `out.len()` elements of type `ty`, into `out`.
///
/// Fails with [`GgufError::UnsupportedTensorType`] for types without a decoder here, and
/// with [`GgufError::Invalid`] when `data.len()` does not match `out.len()`.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    if !can_dequantize(ty) {
        return Err(GgufError::UnsupportedTensorType(ty));
    }
    let expected = expected_bytes(ty, out.len())?;
    if data.len() != expected {
        return Err(GgufError::Invalid(format!(
            "{} elements of {ty} need {expected} bytes, got {}",
            out.len(),
            data.len()
        )));
    }
    let each: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, y| y[0] = f16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::BF16 => |b, y| y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        GgmlType::Q4_0 => legacy::dequant_q4_0,
        GgmlType::Q4_1 => legacy::dequant_q4_1,
        GgmlType::Q5_0 => legacy::dequant_q5_0,
        GgmlType::Q5_1 => legacy::dequant_q5_1,
        GgmlType::Q8_0 => legacy::dequant_q8_0,
        GgmlType::Q2K => kquants::dequant_q2_k,
        GgmlType::Q3K => kquants::dequant_q3_k,
        GgmlType::Q4K => kquants::dequant_q4_k,
        GgmlType::Q5K => kquants::dequant_q5_k,
        GgmlType::Q6K => kquants::dequant_q6_k,
        GgmlType::IQ4NL => legacy::dequant_iq4_nl,
        GgmlType::IQ4XS => kquants::dequant_iq4_xs,
        _ => return Err(GgufError::UnsupportedTensorType(ty)),
    };
    // Runs of blocks on every core: a model is dequantised tensor by tensor at each load.
    let per_run = (DEQUANTIZE_RUN / ty.block_len()).max(1);
    data.par_chunks(per_run * ty.block_bytes())
        .zip(out.par_chunks_mut(per_run * ty.block_len()))
        .for_each(|(data, out)| {
            let blocks = data.chunks_exact(ty.block_bytes());
            for (block, y) in blocks.zip(out.chunks_exact_mut(ty.block_len())) {
                each(block, y);
            }
        });
    Ok(())
}

/// Elements one task of [`dequantize`] decodes: large enough that a task is far longer
/// than handing it to a thread.
const DEQUANTIZE_RUN: usize = 1 << 16;

/// Quantises `src` to `ty` with GGML's reference (round-to-nearest) schemes, so tests can
/// write tiny models. K-quants need an optimising search and are not offered.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>> {
    if !can_quantize(ty) {
        return Err(GgufError::UnsupportedTensorType(ty));
    }
    let n_bytes = expected_bytes(ty, src.len())?;
    let mut out = vec![0u8; n_bytes];
    let each: fn(&[f32], &mut [u8]) = match ty {
        GgmlType::F32 => |x, b| b.copy_from_slice(&x[0].to_le_bytes()),
        GgmlType::F16 => |x, b| b.copy_from_slice(&f16::from_f32(x[0]).to_le_bytes()),
        GgmlType::BF16 => |x, b| b.copy_from_slice(&f32_to_bf16_bits(x[0]).to_le_bytes()),
        GgmlType::Q4_0 => legacy::quant_q4_0,
        GgmlType::Q4_1 => legacy::quant_q4_1,
        GgmlType::Q5_0 => legacy::quant_q5_0,
        GgmlType::Q5_1 => legacy::quant_q5_1,
        GgmlType::Q8_0 => legacy::quant_q8_0,
        _ => return Err(GgufError::UnsupportedTensorType(ty)),
    };
    for (x, b) in src
        .chunks_exact(ty.block_len())
        .zip(out.chunks_exact_mut(ty.block_bytes()))
    {
        each(x, b);
    }
    Ok(out)
}

/// f32 to bf16 as GGML does it: round to nearest even, NaNs kept NaN by forcing a
/// quiet bit (plain truncation could turn a NaN into infinity).
fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounded = (bits as u64 + 0x7fff + ((bits >> 16) & 1) as u64) >> 16;
    rounded as u16
}

/// Reads the little-endian f16 at `b[i..i + 2]` as f32.
#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_wrong_lengths() {
        let mut out = [0f32; 32];
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out),
            Err(GgufError::Invalid(_))
        ));
        let mut out = [0f32; 31];
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0u8; 18], &mut out),
            Err(GgufError::Invalid(_))
        ));
        assert!(matches!(
            quantize(GgmlType::Q8_0, &[0f32; 33]),
            Err(GgufError::Invalid(_))
        ));
    }

    #[test]
    fn rejects_unsupported_types() {
        for ty in [GgmlType::Q8_1, GgmlType::Q8K, GgmlType::I8, GgmlType::F64] {
            let mut out = vec![0f32; ty.block_len()];
            let data = vec![0u8; ty.block_bytes()];
            assert!(matches!(
                dequantize(ty, &data, &mut out),
                Err(GgufError::UnsupportedTensorType(t)) if t == ty
            ));
        }
        for ty in [GgmlType::Q2K, GgmlType::Q4K, GgmlType::Q6K, GgmlType::I32] {
            let src = vec![0f32; ty.block_len()];
            assert!(matches!(
                quantize(ty, &src),
                Err(GgufError::UnsupportedTensorType(t)) if t == ty
            ));
        }
    }

    #[test]
    fn empty_input_is_fine() {
        for ty in [GgmlType::F32, GgmlType::Q4K, GgmlType::Q8_0] {
            dequantize(ty, &[], &mut []).expect("empty dequantises");
        }
        assert!(quantize(GgmlType::Q4_0, &[])
            .expect("empty quantises")
            .is_empty());
    }

    #[test]
    fn bf16_rounding_and_nan() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        let nan = f32::from_bits(0x7f80_0001);
        assert!(bf16::from_bits(f32_to_bf16_bits(nan)).is_nan());
    }

    #[test]
    fn every_quantisable_type_round_trips_roughly() {
        let src: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) / 8.0)
            .collect();
        // Offset types err by half a step; symmetric ones (Q4_0, Q5_0) map the largest
        // magnitude to code 0 and clip its opposite extreme, erring by up to a full step.
        for (ty, tol) in [
            (GgmlType::F32, 0.0),
            (GgmlType::F16, 1e-3),
            (GgmlType::BF16, 2e-2),
            (GgmlType::Q8_0, 0.02),
            (GgmlType::Q5_0, 0.26),
            (GgmlType::Q5_1, 0.15),
            (GgmlType::Q4_0, 0.5),
            (GgmlType::Q4_1, 0.3),
        ] {
            let bytes = quantize(ty, &src).expect("quantises");
            let mut back = vec![0f32; src.len()];
            dequantize(ty, &bytes, &mut back).expect("dequantises");
            for (a, b) in src.iter().zip(&back) {
                assert!((a - b).abs() <= tol, "{ty}: {a} came back as {b}");
            }
        }
    }
}
