//! RoPE scaling for contexts beyond the trained one, as per-frequency divisors of the
//! inverse frequencies (what every backend rotates by: see
//! [`crate::ModelConfig::rope_frequencies`]) and a factor on the attention scores.
//!
//! - Linear (position interpolation): every frequency divided by `factor`.
//! - YaRN, as transformers computes it: frequencies that turn fewer than `beta_slow`
//!   times over the original context are interpolated (divided by `factor`), those that
//!   turn more than `beta_fast` times are kept, and a linear ramp blends the ones
//!   between; cos and sin are multiplied by the attention factor (`0.1 ln(factor) + 1`
//!   unless given), which scales every score by its square.
//! - Llama 3: high frequencies kept, low ones divided by `factor`, those between smoothed
//!   (what llama.cpp's converter stores as `rope_freqs`).

use crate::{ModelError, Result};

fn bad(message: String) -> ModelError {
    ModelError::BadConfig(message)
}

/// YaRN's parameters, with transformers' defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Yarn {
    pub factor: f32,
    pub original_context: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// What cos and sin are multiplied by; `None`: `0.1 ln(factor) + 1`.
    pub attention_factor: Option<f32>,
}

/// A scaling the model was trained with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RopeScaling {
    Linear {
        factor: f32,
    },
    Yarn(Yarn),
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context: f32,
    },
}

impl RopeScaling {
    /// Checks the numbers a file gave.
    pub fn checked(self) -> Result<Self> {
        let positive = |name: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(bad(format!(
                    "RoPE scaling's {name} {v} must be a positive number"
                )))
            }
        };
        match &self {
            RopeScaling::Linear { factor } => positive("factor", *factor)?,
            RopeScaling::Yarn(y) => {
                positive("factor", y.factor)?;
                positive("original context", y.original_context)?;
                positive("beta_fast", y.beta_fast)?;
                positive("beta_slow", y.beta_slow)?;
                if let Some(a) = y.attention_factor {
                    positive("attention factor", a)?;
                }
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_context,
            } => {
                positive("factor", *factor)?;
                positive("low_freq_factor", *low_freq_factor)?;
                positive("high_freq_factor", *high_freq_factor)?;
                positive("original context", *original_context)?;
                if high_freq_factor <= low_freq_factor {
                    return Err(bad(format!(
                        "llama3 RoPE scaling needs high_freq_factor {high_freq_factor} above \
                         low_freq_factor {low_freq_factor}"
                    )));
                }
            }
        }
        Ok(self)
    }

    /// The divisor of each of the `n_rot / 2` inverse frequencies `theta^(-2i/n_rot)`.
    pub fn divisors(&self, n_rot: usize, theta: f32) -> Vec<f32> {
        let n_pairs = n_rot / 2;
        match self {
            RopeScaling::Linear { factor } => vec![*factor; n_pairs],
            RopeScaling::Yarn(y) => {
                let dim = n_rot as f64;
                let base = f64::from(theta);
                let correction = |rotations: f32| {
                    let turns = f64::from(y.original_context)
                        / (f64::from(rotations) * 2.0 * std::f64::consts::PI);
                    dim * turns.ln() / (2.0 * base.ln())
                };
                let low = correction(y.beta_fast).floor().max(0.0);
                let mut high = correction(y.beta_slow).ceil().min(dim - 1.0);
                if low == high {
                    high += 0.001;
                }
                let factor = f64::from(y.factor);
                (0..n_pairs)
                    .map(|i| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        // Kept (1) below the ramp, interpolated (1 / factor) above it.
                        let kept = 1.0 - ramp;
                        let scale = kept + (1.0 - kept) / factor;
                        (1.0 / scale) as f32
                    })
                    .collect()
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_context: old_len,
            } => {
                let (low_wavelen, high_wavelen) = (old_len / low, old_len / high);
                pyramid_kernels::ops::rope_inv_freq(n_rot, theta)
                    .into_iter()
                    .map(|freq| {
                        let wavelen = 2.0 * std::f32::consts::PI / freq;
                        if wavelen < high_wavelen {
                            1.0
                        } else if wavelen > low_wavelen {
                            *factor
                        } else {
                            let smooth = (old_len / wavelen - low) / (high - low);
                            1.0 / ((1.0 - smooth) / factor + smooth)
                        }
                    })
                    .collect()
            }
        }
    }

    /// What attention scores are multiplied by besides `1 / sqrt(head_dim)`.
    pub fn score_scale(&self) -> f32 {
        match self {
            RopeScaling::Linear { .. } | RopeScaling::Llama3 { .. } => 1.0,
            RopeScaling::Yarn(y) => {
                let a = y.attention_factor.unwrap_or_else(|| {
                    if y.factor <= 1.0 {
                        1.0
                    } else {
                        0.1 * y.factor.ln() + 1.0
                    }
                });
                a * a
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_keeps_fast_frequencies_and_interpolates_slow_ones() {
        let yarn = RopeScaling::Yarn(Yarn {
            factor: 4.0,
            original_context: 4096.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: None,
        });
        let d = yarn.divisors(128, 1_000_000.0);
        assert_eq!(d.len(), 64);
        assert_eq!(d[0], 1.0, "the fastest frequency is kept");
        assert_eq!(d[63], 4.0, "the slowest is interpolated");
        assert!(d.windows(2).all(|w| w[0] <= w[1]), "a ramp between");
        let a = 0.1 * 4f32.ln() + 1.0;
        assert!((yarn.score_scale() - a * a).abs() < 1e-6);
        assert_eq!(
            RopeScaling::Linear { factor: 2.0 }.divisors(8, 1e4),
            [2.0; 4]
        );
        assert!(RopeScaling::Linear { factor: 0.0 }.checked().is_err());
    }
}
