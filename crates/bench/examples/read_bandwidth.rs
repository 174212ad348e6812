//! The memory read bandwidth a decode step can hope for: `THREADS` threads (default 2)
//! each sum their own part of a `MIB`-MiB buffer (default 1024, far past any cache),
//! `ROUNDS` times (default 5); prints the best round in GB/s. Decode of a model that does
//! not fit in cache reads every weight once per token, so bytes per token over this is
//! the bound a side-by-side run states beside its figures.
//!
//! `cargo run --release -p pyramid-bench --example read_bandwidth -- [THREADS] [MIB] [ROUNDS]`

use std::time::Instant;

fn main() {
    let arg = |i: usize, default: usize| -> usize {
        std::env::args()
            .nth(i)
            .map(|s| s.parse().expect("a whole number"))
            .unwrap_or(default)
    };
    let (threads, mib, rounds) = (arg(1, 2).max(1), arg(2, 1024).max(1), arg(3, 5).max(1));
    let words = mib * (1 << 20) / 8;
    // Written once, so every page is resident before timing.
    let buffer: Vec<u64> = (0..words as u64).collect();
    let chunk = words.div_ceil(threads);
    let mut best = 0.0f64;
    let mut checksum = 0u64;
    for _ in 0..rounds {
        let start = Instant::now();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = buffer
                .chunks(chunk)
                .map(|part| s.spawn(move || sum(part)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let seconds = start.elapsed().as_secs_f64();
        checksum = checksum.wrapping_add(sums.iter().fold(0, |a, &b| a.wrapping_add(b)));
        best = best.max((words * 8) as f64 / seconds / 1e9);
    }
    println!(
        "{best:.1} GB/s read ({threads} threads, {mib} MiB, best of {rounds}; checksum {checksum})"
    );
}

/// Eight independent sums, so the loop is bound by loads, not by one addition chain.
fn sum(part: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut blocks = part.chunks_exact(8);
    for block in &mut blocks {
        for (lane, &v) in lanes.iter_mut().zip(block) {
            *lane = lane.wrapping_add(v);
        }
    }
    let tail = blocks
        .remainder()
        .iter()
        .fold(0u64, |a, &b| a.wrapping_add(b));
    lanes.iter().fold(tail, |a, &b| a.wrapping_add(b))
}
