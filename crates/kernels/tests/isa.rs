//! Which instruction sets this run's parity tests exercise, and a hard failure when the
//! one `PYRAMID_ISA` asks for is missing: library code falls back to the best available
//! family, so without this a CI host lacking AVX-512 would pass `PYRAMID_ISA=avx512`
//! while checking only AVX2.

use pyramid_kernels::isa::{self, Isa};

#[test]
fn the_requested_isa_is_exercised() {
    let available = Isa::available();
    let names: Vec<&str> = available.iter().map(|isa| isa.name()).collect();
    println!(
        "kernel parity tests exercise: {} (against the scalar oracle)",
        names.join(", ")
    );
    match std::env::var("PYRAMID_ISA") {
        Ok(requested) if !requested.trim().is_empty() => {
            let chosen = isa::init_from_env().unwrap_or_else(|e| panic!("{e}"));
            assert!(available.contains(&chosen));
            assert_eq!(isa::active(), chosen);
        }
        _ => assert_eq!(isa::active(), Isa::detect()),
    }
}
