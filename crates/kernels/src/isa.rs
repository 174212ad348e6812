//! Which instruction set the kernels use, detected once.

use std::sync::OnceLock;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("PYRAMID_ISA='{0}' is not one of: scalar, avx2, avxvnni, avx512, amx")]
    UnknownIsa(String),
    #[error(
        "PYRAMID_ISA={requested} was requested but this CPU lacks it (best available: {available})"
    )]
    IsaUnavailable { requested: Isa, available: Isa },
    #[error("thread count must be at least 1")]
    ZeroThreads,
    #[error("cannot start a worker thread: {0}")]
    Spawn(String),
}

/// Kernel families, in increasing capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA.
    Avx2,
    /// AVX2 with AVX-VNNI, the VEX-encoded `vpdpbusd` of Intel's laptop cores (Alder Lake
    /// to Panther Lake) and Zen 5: the integer kernels multiply bytes in one instruction
    /// where AVX2 needs three; everything else runs as [`Isa::Avx2`].
    AvxVnni,
    /// AVX-512 F/BW/VL (+ VNNI where present, used by the integer kernels).
    Avx512,
    /// AVX-512 with VNNI and the AMX-INT8 tile unit (Sapphire Rapids and later): the INT8
    /// GEMM of prefill-sized batches runs on tiles, everything else as [`Isa::Avx512`].
    Amx,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
        }
    }

    pub fn parse(s: &str) -> Result<Self, KernelError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Ok(Isa::Scalar),
            "avx2" => Ok(Isa::Avx2),
            "avxvnni" => Ok(Isa::AvxVnni),
            "avx512" => Ok(Isa::Avx512),
            "amx" => Ok(Isa::Amx),
            _ => Err(KernelError::UnknownIsa(s.to_string())),
        }
    }

    /// The best family this CPU supports.
    pub fn detect() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.supported())
            .unwrap_or(Isa::Scalar)
    }

    const ALL: [Isa; 5] = [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512, Isa::Amx];

    /// Whether this CPU has every feature `self`'s kernels use, probed once. The families
    /// are ordered by capability but not nested on every CPU: Zen 4 and Ice Lake have
    /// AVX-512 VNNI without AVX-VNNI.
    fn supported(self) -> bool {
        static SUPPORTED: OnceLock<[bool; 5]> = OnceLock::new();
        SUPPORTED.get_or_init(|| Isa::ALL.map(Isa::probe))[self as usize]
    }

    fn probe(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = || {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            };
            let avx512 = || {
                avx2()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
            };
            match self {
                Isa::Scalar => true,
                Isa::Avx2 => avx2(),
                Isa::AvxVnni => avx2() && is_x86_feature_detected!("avxvnni"),
                Isa::Avx512 => avx512(),
                Isa::Amx => {
                    avx512() && is_x86_feature_detected!("avx512vnni") && crate::int8::amx::enable()
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Scalar
        }
    }

    /// Panics unless this CPU runs `self`'s kernels: the `_with` entry points take an ISA
    /// from their caller and their vector paths' safety rests on this check.
    #[track_caller]
    pub fn assert_supported(self) {
        assert!(
            self.supported(),
            "{self} kernels requested on a CPU without them"
        );
    }

    /// Every family usable on this CPU; tests run each against the scalar oracle.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|isa| isa.supported()).collect()
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

static ACTIVE: OnceLock<Isa> = OnceLock::new();

/// Resolves `PYRAMID_ISA` against the CPU. Binaries call this first so a bad value is
/// reported; kernels then use [`active`].
pub fn init_from_env() -> Result<Isa, KernelError> {
    let chosen = resolve_env()?;
    Ok(*ACTIVE.get_or_init(|| chosen))
}

fn resolve_env() -> Result<Isa, KernelError> {
    Ok(match std::env::var("PYRAMID_ISA") {
        Ok(v) if !v.trim().is_empty() => {
            let requested = Isa::parse(&v)?;
            if !requested.supported() {
                return Err(KernelError::IsaUnavailable {
                    requested,
                    available: Isa::detect(),
                });
            }
            requested
        }
        _ => Isa::detect(),
    })
}

/// The family kernels dispatch to. If [`init_from_env`] was never called (library use,
/// tests), a valid `PYRAMID_ISA` is still honoured and an invalid one ignored.
pub fn active() -> Isa {
    *ACTIVE.get_or_init(|| resolve_env().unwrap_or_else(|_| Isa::detect()))
}
