//! Inputs the kernel tests share.

use rand::{Rng, SeedableRng};

/// `len` seeded values in `[-1, 1)`.
pub fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// `(m, k, n)` of integer GEMM parity tests: none a multiple of every block size, so
/// the packed layouts' padding and the kernels' tails are all exercised.
pub const RAGGED_GEMM_SHAPES: [(usize, usize, usize); 8] = [
    (1, 1, 1),
    (1, 5, 17),
    (3, 33, 7),
    (5, 64, 40),
    (4, 130, 33),
    (9, 576, 67),
    (1, 1000, 16),
    (7, 63, 129),
];

/// `(m, k, n)` whose packed weights span more than one of the integer kernels' L2 chunks
/// on one thread (4864 columns of a k ≤ 208 block walk past 512 KiB), so chunk seams are
/// checked bit-exactly too.
pub const L2_CROSSING_GEMM_SHAPES: [(usize, usize, usize); 3] =
    [(5, 112, 4864), (3, 208, 4864), (1, 896, 4864)];
