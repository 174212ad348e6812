//! The gated feed-forward activations, SwiGLU (Llama, Qwen2) and GeGLU (Gemma), each with
//! its scalar oracle beside AVX2 and AVX-512 builds: they run over every FFN column of
//! every token, and the scalar path's `exp` or `tanh` is a libm call per element.

#[cfg(target_arch = "x86_64")]
use super::exp::{exp_avx2, exp_avx512};
use crate::isa::{self, Isa};

/// SwiGLU: `gate = silu(gate) * up`, the feed-forward activation of Llama and Qwen2,
/// vectorised for the active ISA: it runs over every FFN column of every token, and the
/// scalar path's `exp` is a libm call per element.
pub fn silu_mul_in_place(gate: &mut [f32], up: &[f32]) {
    silu_mul_in_place_with(isa::active(), gate, up)
}

/// As [`silu_mul_in_place`] with an explicit ISA; [`Isa::Scalar`] is the oracle.
pub fn silu_mul_in_place_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up differ in length");
    isa.assert_supported();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX-512F, AVX2 and FMA for `Isa::Avx512` and
        // `Isa::Amx`.
        Isa::Avx512 | Isa::Amx => unsafe { silu_mul_avx512(gate, up) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2 and FMA for `Isa::Avx2`.
        Isa::Avx2 | Isa::AvxVnni => unsafe { silu_mul_avx2(gate, up) },
        _ => silu_mul_scalar(gate, up),
    }
}

fn silu_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let whole = gate.len() / 8 * 8;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    for i in (0..whole).step_by(8) {
        let x = _mm256_loadu_ps(g.add(i));
        let e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(g.add(i), _mm256_mul_ps(silu, _mm256_loadu_ps(u.add(i))));
    }
    silu_mul_scalar(&mut gate[whole..], &up[whole..]);
}

/// [`silu_mul_avx2`] on sixteen lanes, the rest on AVX2: the same operations per value
/// ([`exp_avx512`] is [`exp_avx2`]'s), so the same result as on AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let whole = gate.len() / 16 * 16;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    for i in (0..whole).step_by(16) {
        let x = _mm512_loadu_ps(g.add(i));
        let e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        let silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
        _mm512_storeu_ps(g.add(i), _mm512_mul_ps(silu, _mm512_loadu_ps(u.add(i))));
    }
    silu_mul_avx2(&mut gate[whole..], &up[whole..]);
}

/// GeGLU: `gate = gelu_tanh(gate) * up`, the feed-forward activation of Gemma, with GELU in
/// its tanh approximation `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))` (PyTorch's
/// `gelu(approximate="tanh")`). Vectorised like [`silu_mul_in_place`], which it matches in
/// cost per element.
pub fn gelu_tanh_mul_in_place(gate: &mut [f32], up: &[f32]) {
    gelu_tanh_mul_in_place_with(isa::active(), gate, up)
}

/// As [`gelu_tanh_mul_in_place`] with an explicit ISA; [`Isa::Scalar`] is the oracle.
pub fn gelu_tanh_mul_in_place_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up differ in length");
    isa.assert_supported();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX-512F, AVX2 and FMA for `Isa::Avx512` and
        // `Isa::Amx`.
        Isa::Avx512 | Isa::Amx => unsafe { gelu_tanh_mul_avx512(gate, up) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2 and FMA for `Isa::Avx2`.
        Isa::Avx2 | Isa::AvxVnni => unsafe { gelu_tanh_mul_avx2(gate, up) },
        _ => gelu_tanh_mul_scalar(gate, up),
    }
}

/// `√(2/π)`.
const GELU_SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

fn gelu_tanh_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
}

/// `(1 + tanh y) / 2 = 1 / (1 + e^(-2y))`: one vector `exp` and a division per lane,
/// without the cancellation `1 + tanh y` suffers for large negative `y`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_tanh_mul_avx2(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let whole = gate.len() / 8 * 8;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    let (c, k) = (
        _mm256_set1_ps(-2.0 * GELU_SQRT_2_OVER_PI),
        _mm256_set1_ps(GELU_CUBIC),
    );
    for i in (0..whole).step_by(8) {
        let x = _mm256_loadu_ps(g.add(i));
        let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        let minus_2y = _mm256_mul_ps(c, _mm256_fmadd_ps(k, x3, x));
        let e = exp_avx2(minus_2y);
        let gelu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(g.add(i), _mm256_mul_ps(gelu, _mm256_loadu_ps(u.add(i))));
    }
    gelu_tanh_mul_scalar(&mut gate[whole..], &up[whole..]);
}

/// [`gelu_tanh_mul_avx2`] on sixteen lanes, the rest on AVX2: the same operations per
/// value, so the same result as on AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gelu_tanh_mul_avx512(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let whole = gate.len() / 16 * 16;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    let (c, k) = (
        _mm512_set1_ps(-2.0 * GELU_SQRT_2_OVER_PI),
        _mm512_set1_ps(GELU_CUBIC),
    );
    for i in (0..whole).step_by(16) {
        let x = _mm512_loadu_ps(g.add(i));
        let x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        let minus_2y = _mm512_mul_ps(c, _mm512_fmadd_ps(k, x3, x));
        let e = exp_avx512(minus_2y);
        let gelu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
        _mm512_storeu_ps(g.add(i), _mm512_mul_ps(gelu, _mm512_loadu_ps(u.add(i))));
    }
    gelu_tanh_mul_avx2(&mut gate[whole..], &up[whole..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectorised_silu_matches_scalar() {
        for len in [1, 7, 8, 13, 96, 1000, 1021] {
            // Past ±88 the vector `exp` saturates; SiLU is then `x` or ±0 either way.
            let gate: Vec<f32> = crate::test_support::random(len, len as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 97 == 5 { v * 200.0 } else { v * 12.0 })
                .collect();
            let up = crate::test_support::random(len, len as u64 + 1);
            let mut expected = gate.clone();
            silu_mul_in_place_with(Isa::Scalar, &mut expected, &up);
            // AVX-512 runs AVX2's operations per value: the same bits.
            let on = |isa| {
                let mut got = gate.clone();
                silu_mul_in_place_with(isa, &mut got, &up);
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            for isa in Isa::available()
                .into_iter()
                .filter(|&isa| isa >= Isa::Avx512)
            {
                assert_eq!(on(isa), on(Isa::Avx2), "{isa} len {len}");
            }
            for isa in Isa::available() {
                let mut got = gate.clone();
                silu_mul_in_place_with(isa, &mut got, &up);
                for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-6 * e.abs().max(1e-3),
                        "{isa} len {len} at {i}: {g} vs {e} (gate {})",
                        gate[i]
                    );
                }
            }
        }
    }

    #[test]
    fn vectorised_gelu_tanh_matches_scalar() {
        for len in [1, 7, 8, 13, 96, 1000, 1021] {
            let gate: Vec<f32> = crate::test_support::random(len, len as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 97 == 5 { v * 200.0 } else { v * 12.0 })
                .collect();
            let up = crate::test_support::random(len, len as u64 + 1);
            let mut expected = gate.clone();
            gelu_tanh_mul_in_place_with(Isa::Scalar, &mut expected, &up);
            // AVX-512 runs AVX2's operations per value: the same bits.
            let on = |isa| {
                let mut got = gate.clone();
                gelu_tanh_mul_in_place_with(isa, &mut got, &up);
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            for isa in Isa::available()
                .into_iter()
                .filter(|&isa| isa >= Isa::Avx512)
            {
                assert_eq!(on(isa), on(Isa::Avx2), "{isa} len {len}");
            }
            for isa in Isa::available() {
                let mut got = gate.clone();
                gelu_tanh_mul_in_place_with(isa, &mut got, &up);
                for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                    // The oracle's `1 + tanh y` loses up to an ulp of 1 where it cancels:
                    // an error of about `1e-7 · |x · up|`, however small the result.
                    let tol = 1e-6 * e.abs() + 2e-7 * (gate[i] * up[i]).abs();
                    assert!(
                        (g - e).abs() <= tol,
                        "{isa} len {len} at {i}: {g} vs {e} (gate {})",
                        gate[i]
                    );
                }
            }
        }
        // Known values of PyTorch's gelu(approximate="tanh").
        let mut g = [0.0f32, 1.0, -1.0, 3.0];
        gelu_tanh_mul_in_place_with(Isa::Scalar, &mut g, &[1.0; 4]);
        for (got, want) in g.iter().zip([0.0, 0.841_192, -0.158_808, 2.996_363]) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
    }
}
