//! Weight scales of a packed integer matrix: one per row and group of `k`.
//!
//! Our quantisers and GGUF's 32-element blocks (Q8_0, Q4_0, Q4_1, Q5_0) keep an f16 per
//! row and group of 32. GGUF's K-quants keep an integer per sub-block (of 32 in Q4_K, of
//! 16 in Q6_K and Q3_K) times an f16 per super-block of 256. Their product `d · s` needs
//! up to 11 + 8 significant bits: f32 holds it exactly, f16 would round it. So the
//! super-block form keeps the file's two factors and the kernels multiply them in f32
//! where they load a scale. The weights the kernels multiply are then the file's, and the
//! scales cost about a byte per sub-block, what the file spends, not two.
//!
//! Both forms are laid out by 16-row packed block, `[n_pad / 16][groups][16]` (the
//! super-block factors `[n_pad / 16][supers][16]`), so a kernel loads sixteen rows'
//! scales at once.

use half::f16;

use crate::int8::{scale_index, BLOCK_K, ROWS_PER_BLOCK};

/// Values of `k` per K-quant super-block.
pub const SUPER_K: usize = 256;

/// One scale per row and group of [`Scales::group_k`] values of `k`.
#[derive(Debug, Clone, PartialEq)]
pub struct Scales {
    group_k: usize,
    /// Groups per row.
    groups: usize,
    form: Form,
}

/// Row-major `[n, per_row.0]` values as `[n_pad / 16][per_row.1][16]`, the rest zero.
fn lay_out<T: Copy>(
    values: &[T],
    n: usize,
    n_pad: usize,
    per_row: (usize, usize),
    zero: T,
) -> Vec<T> {
    let mut out = vec![zero; n_pad * per_row.1];
    for row in 0..n {
        for g in 0..per_row.0 {
            out[scale_index(row, g, per_row.1)] = values[row * per_row.0 + g];
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Form {
    Half(Vec<f16>),
    /// `scale = d[super] · sub[group]`.
    SuperBlock {
        d: Vec<f16>,
        sub: Vec<i8>,
    },
}

impl Scales {
    /// f16 scales per row and group of `group_k`, already laid out by row block.
    pub(crate) fn half(group_k: usize, groups: usize, laid_out: Vec<f16>) -> Self {
        Self {
            group_k,
            groups,
            form: Form::Half(laid_out),
        }
    }

    /// f16 scales for rows `[n, k]`, one per row and block of 32 (`[n, k.div_ceil(32)]`,
    /// row-major).
    pub fn per_block(n: usize, k: usize, values: &[f16]) -> Self {
        let groups = k.div_ceil(BLOCK_K);
        assert_eq!(values.len(), n * groups, "scales must be [n, k / 32]");
        let n_pad = n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
        Self::half(
            BLOCK_K,
            groups,
            lay_out(values, n, n_pad, (groups, groups), f16::ZERO),
        )
    }

    /// A K-quant's scales for rows `[n, k]`: `d` (`[n, k.div_ceil(256)]`) times `sub`
    /// (`[n, k.div_ceil(group_k)]`), both row-major, `group_k` a divisor of 32. Groups in
    /// the padding of `k` to whole blocks of 32 get a zero scale.
    pub fn super_block(n: usize, k: usize, group_k: usize, d: &[f16], sub: &[i8]) -> Self {
        assert!(
            group_k > 0 && BLOCK_K.is_multiple_of(group_k),
            "sub-blocks must divide a block of 32"
        );
        let (groups_in, supers_in) = (k.div_ceil(group_k), k.div_ceil(SUPER_K));
        assert_eq!(d.len(), n * supers_in, "d must be [n, k / 256]");
        assert_eq!(
            sub.len(),
            n * groups_in,
            "sub-scales must be [n, k / group_k]"
        );
        let k_pad = k.div_ceil(BLOCK_K) * BLOCK_K;
        let (groups, supers) = (k_pad / group_k, k_pad.div_ceil(SUPER_K));
        let n_pad = n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
        Self {
            group_k,
            groups,
            form: Form::SuperBlock {
                d: lay_out(d, n, n_pad, (supers_in, supers), f16::ZERO),
                sub: lay_out(sub, n, n_pad, (groups_in, groups), 0),
            },
        }
    }

    /// Values of `k` per scale: 32, or 16 for Q6_K's and Q3_K's sub-blocks.
    pub fn group_k(&self) -> usize {
        self.group_k
    }

    /// Groups per row.
    pub fn groups(&self) -> usize {
        self.groups
    }

    fn supers(&self) -> usize {
        (self.groups * self.group_k).div_ceil(SUPER_K)
    }

    /// Whether these are the file's K-quant factors rather than f16 per group.
    pub fn is_super_block(&self) -> bool {
        matches!(self.form, Form::SuperBlock { .. })
    }

    /// Whether the scales cover `n_pad` rows (a whole number of row blocks).
    pub(crate) fn covers(&self, n_pad: usize) -> bool {
        match &self.form {
            Form::Half(v) => v.len() == n_pad * self.groups,
            Form::SuperBlock { d, sub } => {
                sub.len() == n_pad * self.groups && d.len() == n_pad * self.supers()
            }
        }
    }

    /// The scale of `row`'s group `group`.
    #[inline]
    pub fn get(&self, row: usize, group: usize) -> f32 {
        match &self.form {
            Form::Half(v) => v[scale_index(row, group, self.groups)].to_f32(),
            Form::SuperBlock { d, sub } => {
                let sup = group * self.group_k / SUPER_K;
                d[scale_index(row, sup, self.supers())].to_f32()
                    * f32::from(sub[scale_index(row, group, self.groups)])
            }
        }
    }

    pub fn bytes(&self) -> usize {
        match &self.form {
            Form::Half(v) => 2 * v.len(),
            Form::SuperBlock { d, sub } => 2 * d.len() + sub.len(),
        }
    }

    /// Sixteen rows' scales of row block `block`'s group `group`.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `block` is a row block of the matrix and `group < groups`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) unsafe fn load16_avx512(
        &self,
        block: usize,
        group: usize,
    ) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let at = (block * self.groups + group) * ROWS_PER_BLOCK;
        match &self.form {
            Form::Half(v) => _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(at).cast())),
            Form::SuperBlock { d, sub } => {
                let sup = (block * self.supers() + group * self.group_k / SUPER_K) * ROWS_PER_BLOCK;
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(d.as_ptr().add(sup).cast()));
                let sub = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                    sub.as_ptr().add(at).cast(),
                )));
                _mm512_mul_ps(d, sub)
            }
        }
    }

    /// As [`Scales::load16_avx512`], as rows 0–7 and 8–15.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; `block` is a row block of the matrix and
    /// `group < groups`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(crate) unsafe fn load16_avx2(
        &self,
        block: usize,
        group: usize,
    ) -> [std::arch::x86_64::__m256; 2] {
        use std::arch::x86_64::*;
        let at = (block * self.groups + group) * ROWS_PER_BLOCK;
        match &self.form {
            Form::Half(v) => {
                let v = v.as_ptr().add(at);
                [
                    _mm256_cvtph_ps(_mm_loadu_si128(v.cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(v.add(8).cast())),
                ]
            }
            Form::SuperBlock { d, sub } => {
                let sup = (block * self.supers() + group * self.group_k / SUPER_K) * ROWS_PER_BLOCK;
                let (d, sub) = (d.as_ptr().add(sup), sub.as_ptr().add(at));
                let half = |h: usize| {
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(d.add(8 * h).cast()));
                    let s = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sub.add(8 * h).cast()));
                    _mm256_mul_ps(d, _mm256_cvtepi32_ps(s))
                };
                [half(0), half(1)]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Isa;

    /// Scales of a 37-row, 3-super-block matrix with sub-blocks of 16, with every sign and
    /// magnitude of sub-scale and f16 factors whose products need more than f16 holds.
    fn sample() -> (usize, usize, Vec<f16>, Vec<i8>, Scales) {
        let (n, k) = (37, 2 * SUPER_K + 40);
        let d: Vec<f16> = (0..n * 3)
            .map(|i| f16::from_f32(0.001_237 * (i as f32 + 1.0)))
            .collect();
        let sub: Vec<i8> = (0..n * k.div_ceil(16))
            .map(|i| (i * 37 % 256) as u8 as i8)
            .collect();
        let scales = Scales::super_block(n, k, 16, &d, &sub);
        (n, k, d, sub, scales)
    }

    #[test]
    fn a_super_block_scale_is_the_exact_product_of_the_two_factors() {
        let (n, k, d, sub, scales) = sample();
        let groups = k.div_ceil(16);
        // k pads to 2 · 256 + 64: four groups of 16 past the last super-block's start.
        assert_eq!(scales.groups(), 36);
        for row in 0..n {
            assert_eq!(scales.get(row, 35), 0.0, "padding");
            for g in 0..groups {
                let want = f64::from(d[row * 3 + g * 16 / SUPER_K].to_f32())
                    * f64::from(sub[row * groups + g]);
                assert_eq!(f64::from(scales.get(row, g)), want, "row {row} group {g}");
            }
        }
        assert!(scales.covers(48) && !scales.covers(32));
        assert_eq!(scales.bytes(), 48 * 3 * 2 + 48 * 36);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_loads_equal_get() {
        let (n, _, _, _, scales) = sample();
        if !Isa::available().contains(&Isa::Avx2) {
            return;
        }
        for block in 0..n.div_ceil(ROWS_PER_BLOCK) {
            for g in 0..scales.groups() {
                let want: Vec<f32> = (0..16)
                    .map(|r| scales.get(block * ROWS_PER_BLOCK + r, g))
                    .collect();
                let mut got = [0.0f32; 16];
                // SAFETY: AVX2 and F16C come with `Isa::Avx2`; block and group in range.
                unsafe {
                    let [lo, hi] = scales.load16_avx2(block, g);
                    std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr(), lo);
                    std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr().add(8), hi);
                }
                assert_eq!(got.to_vec(), want, "avx2 block {block} group {g}");
                if Isa::available().contains(&Isa::Avx512) {
                    // SAFETY: AVX-512F comes with `Isa::Avx512`.
                    unsafe {
                        let v = scales.load16_avx512(block, g);
                        std::arch::x86_64::_mm512_storeu_ps(got.as_mut_ptr(), v);
                    }
                    assert_eq!(got.to_vec(), want, "avx512 block {block} group {g}");
                }
            }
        }
    }
}
