//! The vector helpers the other families build on: `dot` and `axpy`, which the per-head
//! attention helpers call once per cached position and so have AVX2 and AVX-512 builds of
//! the same code beside their scalar oracle, and the residual add. Loops use independent
//! accumulators so the compiler vectorises them without reassociating sums.

use crate::isa::{self, Isa};

/// Dot product, vectorised for the active ISA (attention calls it once per cached position).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F.
        Isa::Avx512 | Isa::Amx => unsafe { dot_avx512(a, b) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only selected when the CPU has AVX2 and FMA.
        Isa::Avx2 | Isa::AvxVnni => unsafe { dot_avx2(a, b) },
        _ => dot_lanes::<8>(a, b),
    }
}

/// The scalar oracle for [`dot`]: eight independent partial sums.
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<8>(a, b)
}

/// `L` independent partial sums: with a vector ISA enabled the compiler maps them onto
/// one register of `L` lanes without reassociating any sum.
#[inline(always)]
pub(super) fn dot_lanes<const L: usize>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; L];
    let chunks = a.len() / L * L;
    for (ca, cb) in a[..chunks].chunks_exact(L).zip(b[..chunks].chunks_exact(L)) {
        for l in 0..L {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut sum = acc.iter().sum::<f32>();
    for (x, y) in a[chunks..].iter().zip(&b[chunks..]) {
        sum += x * y;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<16>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<8>(a, b)
}

/// `y += alpha * x`, vectorised for the active ISA.
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F.
        Isa::Avx512 | Isa::Amx => unsafe { axpy_avx512(y, alpha, x) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only selected when the CPU has AVX2 and FMA.
        Isa::Avx2 | Isa::AvxVnni => unsafe { axpy_avx2(y, alpha, x) },
        _ => axpy_scalar(y, alpha, x),
    }
}

/// The scalar oracle for [`axpy`].
#[inline(always)]
pub fn axpy_scalar(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_avx512(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_scalar(y, alpha, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_scalar(y, alpha, x)
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectorised_dot_and_axpy_match_scalar() {
        for len in [0, 1, 15, 16, 17, 64, 100] {
            let a: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..len).map(|i| (i as f32 * 0.11).cos()).collect();
            assert!((dot(&a, &b) - dot_scalar(&a, &b)).abs() < 1e-5, "len {len}");
            let (mut y, mut y_ref) = (b.clone(), b.clone());
            axpy(&mut y, 0.5, &a);
            axpy_scalar(&mut y_ref, 0.5, &a);
            assert_eq!(y, y_ref, "len {len}");
        }
    }

    #[test]
    fn dot_matches_naive_on_ragged_lengths() {
        for len in [0, 1, 7, 8, 9, 31] {
            let a: Vec<f32> = (0..len).map(|i| i as f32).collect();
            let naive: f32 = a.iter().map(|v| v * v).sum();
            assert_eq!(dot(&a, &a), naive);
        }
    }
}
