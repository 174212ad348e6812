//! Rotary position embeddings: the inverse frequencies and the rotation of every head of
//! a row, in the interleaved (Llama in GGUF) or NeoX (Qwen2, Gemma) pairing.

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: Llama as stored in GGUF (Q/K rows were permuted at conversion).
    Interleaved,
    /// Halves `(i, i + d/2)`: Qwen2 and other "NeoX" models.
    Neox,
}

/// Inverse frequencies `base^(-2i/d)` for `i < n_rot/2`, computed as the reference does in f32.
pub fn rope_inv_freq(n_rot: usize, base: f32) -> Vec<f32> {
    (0..n_rot / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / n_rot as f32))
        .collect()
}

/// Rotates every head in `x` (`[n_head, head_dim]`) for position `pos`; only the first
/// `2 * inv_freq.len()` dimensions of each head rotate, and those grow by `scale` (cos and
/// sin times it: YaRN's and LongRoPE's attention factor; 1 otherwise).
pub fn rope_in_place(
    x: &mut [f32],
    head_dim: usize,
    pos: usize,
    inv_freq: &[f32],
    style: RopeStyle,
    scale: f32,
) {
    debug_assert!(x.len().is_multiple_of(head_dim) && 2 * inv_freq.len() <= head_dim);
    let n_rot = 2 * inv_freq.len();
    // Frequencies outside, heads inside: one `sin_cos` (a libm call) per frequency serves
    // every head.
    for (i, &freq) in inv_freq.iter().enumerate() {
        let theta = pos as f32 * freq;
        let (sin, cos) = theta.sin_cos();
        let (sin, cos) = (sin * scale, cos * scale);
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + n_rot / 2),
        };
        for head in x.chunks_exact_mut(head_dim) {
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::dot;

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let inv_freq = rope_inv_freq(8, 10000.0);
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
            let mut x = orig.clone();
            rope_in_place(&mut x, 8, 0, &inv_freq, style, 1.0);
            assert_eq!(x, orig);
            rope_in_place(&mut x, 8, 37, &inv_freq, style, 1.0);
            assert!((dot(&x, &x) - dot(&orig, &orig)).abs() < 1e-4);
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn a_scale_grows_only_the_rotated_dims() {
        // Half of each 8-wide head rotates (2 frequencies).
        let inv_freq = rope_inv_freq(4, 10000.0);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
        let (mut plain, mut scaled) = (orig.clone(), orig.clone());
        rope_in_place(&mut plain, 8, 5, &inv_freq, RopeStyle::Neox, 1.0);
        rope_in_place(&mut scaled, 8, 5, &inv_freq, RopeStyle::Neox, 1.5);
        for (i, (p, s)) in plain.iter().zip(&scaled).enumerate() {
            let rotated = i % 8 < 4;
            let want = if rotated { p * 1.5 } else { *p };
            assert!((s - want).abs() < 1e-6, "dim {i}: {s} against {want}");
        }
    }
}
