//! The byte products of the 256-bit integer kernels, in the two forms x86 has them: AVX2's
//! `vpmaddubsw` (unsigned × signed bytes into saturating 16-bit pair sums) then
//! `vpmaddwd` to widen, and AVX-VNNI's `vpdpbusd`, which does both in one instruction and
//! cannot saturate. The INT4, INT6 and INT8 tiles are written once, generic over
//! [`ByteDot`], and compiled once per ISA inside an entry point that enables its features:
//! every method is `#[inline(always)]`, so its intrinsics compile into that entry point.
//!
//! A tile adds its products in runs ([`ByteDot::begin`] … [`ByteDot::end`]) as long as
//! [`ByteDot::RUN_LIMIT`] allows: AVX2 widens a run's 16-bit pair sums once at its end,
//! VNNI's runs are its 32-bit sums themselves.

use std::arch::x86_64::*;

/// Four-way products of unsigned by signed bytes, summed per 32-bit lane.
pub(crate) trait ByteDot {
    /// A run's sums since [`ByteDot::begin`].
    type Run: Copy;

    /// The largest magnitude a pair of products, or a run's sum of pairs, may reach.
    const RUN_LIMIT: i32;

    /// A run whose products [`ByteDot::end`] adds to `sums`.
    ///
    /// # Safety
    /// The CPU has the ISA's features (the caller's entry point enables them).
    unsafe fn begin(sums: __m256i) -> Self::Run;

    /// `run` plus the products of `u`'s unsigned and `s`'s signed bytes.
    ///
    /// # Safety
    /// As [`ByteDot::begin`]; the run stays within [`ByteDot::RUN_LIMIT`].
    unsafe fn add(run: Self::Run, u: __m256i, s: __m256i) -> Self::Run;

    /// `sums` with the run's products added, as 32-bit sums.
    ///
    /// # Safety
    /// As [`ByteDot::begin`]; `sums` is the vector the run began from.
    unsafe fn end(sums: __m256i, run: Self::Run) -> __m256i;

    /// A run of one product.
    ///
    /// # Safety
    /// As [`ByteDot::add`].
    #[inline(always)]
    unsafe fn dot(sums: __m256i, u: __m256i, s: __m256i) -> __m256i {
        Self::end(sums, Self::add(Self::begin(sums), u, s))
    }

    /// How many groups of products, each summing to at most `group_bound` per lane, one run
    /// may take (at least one, at most `groups`).
    #[inline(always)]
    fn run_groups(group_bound: i32, groups: usize) -> usize {
        usize::try_from(Self::RUN_LIMIT / group_bound)
            .unwrap_or(1)
            .clamp(1, groups)
    }
}

/// AVX2: `vpmaddubsw` into 16-bit pair sums, widened by `vpmaddwd` at a run's end.
pub(crate) struct Maddubs;

impl ByteDot for Maddubs {
    type Run = __m256i;
    const RUN_LIMIT: i32 = i16::MAX as i32;

    #[inline(always)]
    unsafe fn begin(_sums: __m256i) -> __m256i {
        _mm256_setzero_si256()
    }

    #[inline(always)]
    unsafe fn add(run: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi16(run, _mm256_maddubs_epi16(u, s))
    }

    #[inline(always)]
    unsafe fn end(sums: __m256i, run: __m256i) -> __m256i {
        _mm256_add_epi32(sums, _mm256_madd_epi16(run, _mm256_set1_epi16(1)))
    }
}

/// AVX-VNNI: `vpdpbusd` adds into the 32-bit sums directly.
pub(crate) struct Vnni256;

impl ByteDot for Vnni256 {
    type Run = __m256i;
    const RUN_LIMIT: i32 = i32::MAX;

    #[inline(always)]
    unsafe fn begin(sums: __m256i) -> __m256i {
        sums
    }

    #[inline(always)]
    unsafe fn add(run: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(run, u, s)
    }

    #[inline(always)]
    unsafe fn end(_sums: __m256i, run: __m256i) -> __m256i {
        run
    }
}

/// The AVX2 and AVX-VNNI entry points, `gemm_blocks_avx2` and `gemm_blocks_avxvnni`, of an
/// integer kernel over `$packed` weights whose 16-row blocks take `$block_bytes` bytes (of
/// weights `$w`) and whose tiles `tiles_256::<D>(a, w, out, rows, row, block)` picks: the
/// one place that says which CPU features each [`ByteDot`] form is compiled with.
macro_rules! entry_points_256 {
    ($packed:ty, |$w:ident| $block_bytes:expr) => {
        /// # Safety
        /// The CPU has AVX2, FMA and F16C; `out` points to `m * w.n` floats and no other
        /// thread writes the columns of `blocks`.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn gemm_blocks_avx2(
            a: &QuantizedView<'_>,
            $w: &$packed,
            out: *mut f32,
            blocks: Range<usize>,
        ) {
            // The closure is written here, so it is compiled with these features and the
            // generic tile's intrinsics are inlined into it.
            for_each_tile(a.m, blocks, $block_bytes, |rows, row, b| {
                tiles_256::<$crate::byte_dot::Maddubs>(a, $w, out, rows, row, b)
            })
        }

        /// # Safety
        /// As [`gemm_blocks_avx2`], and the CPU has AVX-VNNI.
        #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
        pub(super) unsafe fn gemm_blocks_avxvnni(
            a: &QuantizedView<'_>,
            $w: &$packed,
            out: *mut f32,
            blocks: Range<usize>,
        ) {
            for_each_tile(a.m, blocks, $block_bytes, |rows, row, b| {
                tiles_256::<$crate::byte_dot::Vnni256>(a, $w, out, rows, row, b)
            })
        }
    };
}
pub(crate) use entry_points_256;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    /// Lane sums of `u · s` over four bytes each, as i32.
    fn expected(u: &[u8; 32], s: &[i8; 32], from: [i32; 8]) -> [i32; 8] {
        std::array::from_fn(|lane| {
            from[lane]
                + (0..4)
                    .map(|b| i32::from(u[4 * lane + b]) * i32::from(s[4 * lane + b]))
                    .sum::<i32>()
        })
    }

    #[target_feature(enable = "avx2")]
    unsafe fn run_of<D: ByteDot>(u: &[u8; 32], s: &[i8; 32], from: [i32; 8]) -> [i32; 8] {
        let sums = _mm256_loadu_si256(from.as_ptr().cast());
        let uv = _mm256_loadu_si256(u.as_ptr().cast());
        let sv = _mm256_loadu_si256(s.as_ptr().cast());
        let mut out = [0i32; 8];
        _mm256_storeu_si256(out.as_mut_ptr().cast(), D::dot(sums, uv, sv));
        out
    }

    #[target_feature(enable = "avx2,avxvnni")]
    unsafe fn run_vnni(u: &[u8; 32], s: &[i8; 32], from: [i32; 8]) -> [i32; 8] {
        run_of::<Vnni256>(u, s, from)
    }

    #[test]
    fn both_forms_sum_products_within_their_limits() {
        let available = Isa::available();
        let from = [5, -7, 0, 1 << 20, -(1 << 20), 3, 9, -1];
        // Pairs of 127 · 127 fit AVX2's 16-bit sums; offset bytes of 255 · -128 need VNNI.
        let small_u: [u8; 32] = std::array::from_fn(|i| (i * 37 % 128) as u8);
        let wide_u: [u8; 32] = std::array::from_fn(|i| 255 - (i % 3) as u8);
        let s: [i8; 32] = std::array::from_fn(|i| if i % 2 == 0 { -128 } else { 127 - i as i8 });
        if available.contains(&Isa::Avx2) {
            // SAFETY: the CPU has AVX2.
            let got = unsafe { run_of::<Maddubs>(&small_u, &s, from) };
            assert_eq!(got, expected(&small_u, &s, from));
        }
        if available.contains(&Isa::AvxVnni) {
            for u in [&small_u, &wide_u] {
                // SAFETY: the CPU has AVX2 and AVX-VNNI.
                let got = unsafe { run_vnni(u, &s, from) };
                assert_eq!(got, expected(u, &s, from));
            }
        }
    }

    #[test]
    fn runs_are_as_long_as_the_limit_allows() {
        // INT4: 2 · 15 · 128 per group of four `k` takes a block of eight on AVX2.
        assert_eq!(Maddubs::run_groups(2 * 15 * 128, 8), 8);
        assert_eq!(Maddubs::run_groups(2 * 63 * 128, 8), 2);
        assert_eq!(Maddubs::run_groups(2 * 127 * 128, 8), 1);
        assert_eq!(Vnni256::run_groups(2 * 255 * 128, 8), 8);
    }
}
