//! The element types weights may be stored in for the float matmul.
//!
//! bf16 halves the bytes decode must stream against f32 and widens to f32 exactly (a
//! 16-bit shift), so the same tiles serve both; only the load differs.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

pub use half::bf16;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// A weight element the float matmul reads, widened to f32 on load.
pub trait WeightElem: Copy + Send + Sync + sealed::Sealed + 'static {
    fn to_f32(self) -> f32;

    /// Eight consecutive elements as f32.
    ///
    /// # Safety
    /// The CPU has AVX2; `p` points to eight readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;

    /// Sixteen consecutive elements as f32.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `p` points to sixteen readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> __m512;
}

impl WeightElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        _mm256_loadu_ps(p)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl WeightElem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        let halves = _mm_loadu_si128(p.cast());
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves)))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        let halves = _mm256_loadu_si256(p.cast());
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(halves)))
    }
}
