//! How attention multiplies: the exact f32 products, or INT8 products over an INT8 cache.

/// The products attention runs in, chosen at load like [`crate::Precision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Attention {
    /// Keys and values widened to f32 from any cache type, f32 products, a two-pass
    /// softmax: the reference.
    #[default]
    Exact,
    /// Over an INT8 cache: queries and softmax weights quantised to INT8 per block of
    /// positions, integer products, an online softmax in f32
    /// ([`pyramid_kernels::attention::int8`]). Over any other cache, the exact products.
    Int8,
}

impl Attention {
    pub const ALL: [Attention; 2] = [Attention::Exact, Attention::Int8];

    pub fn name(self) -> &'static str {
        match self {
            Attention::Exact => "exact",
            Attention::Int8 => "int8",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == s)
    }
}

impl std::fmt::Display for Attention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
