//! `out[m, n] = a[m, k] · w[n, k]ᵀ` in f32.
//!
//! Work is split across the pool by output column (weight row) so each thread streams
//! only its share of the weights: decode (m = 1) is bound by reading weights once.
//! Within a thread, tiles of up to 4 activation rows × 4 weight rows reuse every loaded
//! vector four times; weight rows are walked in blocks that stay in L2 while all
//! activation rows pass over them. Weights may be f32 or bf16 ([`WeightElem`]); the
//! activations and the accumulation are f32 either way.

mod elem;
mod reference;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub use elem::{bf16, WeightElem};
pub use reference::matmul_scalar;

use crate::isa::{self, Isa};
use crate::threadpool::{SharedSlice, ThreadPool};
use crate::COLUMN_ALIGN;

/// Weight rows per cache block: 64 rows of k ≤ 4864 floats stay within a Zen 4 / modern Intel L2.
const N_BLOCK: usize = 64;

/// Multithreaded `out = a · wᵀ` with the active ISA.
pub fn matmul<W: WeightElem>(
    pool: &ThreadPool,
    a: &[f32],
    w: &[W],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    matmul_with(isa::active(), pool, a, w, out, m, k, n)
}

/// As [`matmul`] with an explicit ISA (tests compare every ISA against scalar).
#[allow(clippy::too_many_arguments)]
pub fn matmul_with<W: WeightElem>(
    isa: Isa,
    pool: &ThreadPool,
    a: &[f32],
    w: &[W],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    let out = SharedSlice::new(out);
    pool.run_team(&|team| {
        // SAFETY: the team's column splits are disjoint; `out` is not read until the end.
        unsafe { matmul_cols(isa, a, w, &out, m, k, n, team.split(n, COLUMN_ALIGN)) }
    });
}

/// Computes output columns `cols` of every row: the part of a [`matmul`] one thread of a
/// region does.
///
/// # Safety
/// No other thread accesses these columns of `out` until the next barrier.
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_cols<W: WeightElem>(
    isa: Isa,
    a: &[f32],
    w: &[W],
    out: &SharedSlice<'_, f32>,
    m: usize,
    k: usize,
    n: usize,
    cols: std::ops::Range<usize>,
) {
    // Checked products: a wrapped product could let mismatched slices through to raw loads.
    assert_eq!(Some(a.len()), m.checked_mul(k), "a must be [m, k]");
    assert_eq!(Some(w.len()), n.checked_mul(k), "w must be [n, k]");
    assert_eq!(Some(out.len()), m.checked_mul(n), "out must be [m, n]");
    assert!(cols.end <= n, "columns beyond the weights");
    isa.assert_supported();
    let out = out.as_mut_ptr();
    for block_start in cols.clone().step_by(N_BLOCK) {
        let block = block_start..(block_start + N_BLOCK).min(cols.end);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx512` and `Isa::Amx` are only ever selected when the CPU has AVX-512F.
            Isa::Avx512 | Isa::Amx => x86::matmul_cols_avx512(a, w, out, m, k, n, block),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` is only ever selected when the CPU has AVX2 and FMA.
            Isa::Avx2 | Isa::AvxVnni => x86::matmul_cols_avx2(a, w, out, m, k, n, block),
            _ => reference::matmul_cols_scalar(a, w, out, m, k, n, block),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::random;

    #[test]
    fn every_isa_matches_scalar_on_ragged_shapes() {
        let pool = ThreadPool::new(2).unwrap();
        for &(m, k, n) in &[
            (1, 1, 1),
            (1, 17, 5),
            (3, 33, 7),
            (5, 64, 9),
            (4, 100, 130),
            (9, 576, 67),
            (1, 1000, 3),
        ] {
            let a = random(m * k, 1);
            let w = random(n * k, 2);
            let w_bf16: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            check_against_scalar(&pool, &a, &w, m, k, n);
            check_against_scalar(&pool, &a, &w_bf16, m, k, n);
        }
    }

    fn check_against_scalar<W: WeightElem>(
        pool: &ThreadPool,
        a: &[f32],
        w: &[W],
        m: usize,
        k: usize,
        n: usize,
    ) {
        let mut expected = vec![0.0; m * n];
        matmul_scalar(a, w, &mut expected, m, k, n);
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; m * n];
            matmul_with(isa, pool, a, w, &mut got, m, k, n);
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                // Sums of k products of magnitude < 1 reassociated: error grows like sqrt(k)·eps.
                assert!(
                    (g - e).abs() <= 1e-5 * (k as f32),
                    "{isa} {} m={m} k={k} n={n} at {i}: {g} vs {e}",
                    std::any::type_name::<W>()
                );
            }
        }
    }

    #[test]
    fn bf16_weights_approximate_f32_weights() {
        let (m, k, n) = (2, 300, 11);
        let (a, w) = (random(m * k, 3), random(n * k, 4));
        let w_bf16: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
        let (mut exact, mut rounded) = (vec![0.0; m * n], vec![0.0; m * n]);
        matmul_scalar(&a, &w, &mut exact, m, k, n);
        matmul_scalar(&a, &w_bf16, &mut rounded, m, k, n);
        for (r, e) in rounded.iter().zip(&exact) {
            // bf16 keeps 8 mantissa bits: relative error 2^-9 per weight, summed over k.
            assert!((r - e).abs() < 0.05, "{r} vs {e}");
        }
    }
}
