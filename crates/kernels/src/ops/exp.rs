//! The vector `e^x` the activations and the attention kernels share: one polynomial on
//! eight and on sixteen lanes, the same operations per lane, so AVX-512 and AVX2 give the
//! same values.

/// [`exp_avx2`] on one value, the same operations in the same order (fused where it is
/// fused), so the same bits: the oracle of kernels whose vector forms use it.
pub fn exp_scalar(x: f32) -> f32 {
    let x = x.min(88.0);
    if x < -87.0 {
        return 0.0;
    }
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(0.693_145_75, x);
    let r = (-n).mul_add(1.428_606_8e-6, r);
    let mut p = 1.0f32 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = p.mul_add(r, c);
    }
    p * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// `e^x` per lane: `2^n · p(r)` with `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, and a degree-6
/// polynomial (relative error about 2e-7); `x ≤ -88` gives 0, as softmax needs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn exp_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let x = _mm256_min_ps(x, _mm256_set1_ps(88.0));
    let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // ln 2 split in two so `n · ln 2` subtracts without losing `r`'s low bits.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    _mm256_andnot_ps(underflow, _mm256_mul_ps(p, pow2n))
}

/// [`exp_avx2`] on sixteen lanes: the same operations per lane, so the same values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn exp_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let x = _mm512_min_ps(x, _mm512_set1_ps(88.0));
    let kept = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let pow2n = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    )));
    _mm512_maskz_mov_ps(kept, _mm512_mul_ps(p, pow2n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn sixteen_lane_exp_equals_two_eight_lane_ones_and_the_scalar_one() {
        use std::arch::x86_64::*;
        if !Isa::available().contains(&Isa::Avx512) {
            return;
        }
        let mut xs: Vec<f32> = (0..4096).map(|i| -100.0 + i as f32 * 0.0495).collect();
        xs.extend([
            f32::NEG_INFINITY,
            -87.0,
            -87.000_01,
            -88.0,
            0.0,
            -0.0,
            88.0,
            89.0,
        ]);
        xs.extend([
            f32::INFINITY,
            f32::NAN,
            -1e-30,
            1e-30,
            -20.5,
            0.3466,
            -0.3466,
            1.0,
        ]);
        for chunk in xs.chunks_exact(16) {
            let (mut wide, mut narrow) = ([0.0f32; 16], [0.0f32; 16]);
            // SAFETY: the CPU has AVX-512F (checked above), so AVX2 and FMA too.
            unsafe {
                _mm512_storeu_ps(
                    wide.as_mut_ptr(),
                    exp_avx512(_mm512_loadu_ps(chunk.as_ptr())),
                );
                for half in 0..2 {
                    let x = _mm256_loadu_ps(chunk.as_ptr().add(8 * half));
                    _mm256_storeu_ps(narrow.as_mut_ptr().add(8 * half), exp_avx2(x));
                }
            }
            assert_eq!(
                wide.map(f32::to_bits),
                narrow.map(f32::to_bits),
                "{chunk:?}"
            );
            let scalar: Vec<u32> = chunk.iter().map(|&x| exp_scalar(x).to_bits()).collect();
            assert_eq!(scalar, narrow.map(f32::to_bits), "scalar {chunk:?}");
        }
    }
}
