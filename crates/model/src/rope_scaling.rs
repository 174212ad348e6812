//! RoPE scaling for contexts beyond the trained one, as per-frequency divisors of the
//! inverse frequencies (what every backend rotates by: see
//! [`crate::ModelConfig::rope_frequencies`]) and a factor on cos and sin
//! ([`crate::ModelConfig::rope_scale`]), which scales the rotated dims of queries and keys
//! (all of them, unless the rotation is partial).
//!
//! - Linear (position interpolation): every frequency divided by `factor`.
//! - YaRN, as transformers computes it: frequencies that turn fewer than `beta_slow`
//!   times over the original context are interpolated (divided by `factor`), those that
//!   turn more than `beta_fast` times are kept, and a linear ramp blends the ones
//!   between; cos and sin are multiplied by the attention factor (`0.1 ln(factor) + 1`
//!   unless given).
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
    /// LongRoPE (Phi-3.5, Phi-4-mini): the long factors for a model whose context is
    /// beyond the original one (as llama.cpp chooses them for such a context; transformers
    /// uses the short ones while a sequence is within the original length), cos and sin
    /// times `sqrt(1 + ln(context / original) / ln(original))` unless given.
    LongRope {
        short: Vec<f32>,
        long: Vec<f32>,
        original_context: f32,
        context: f32,
        attention_factor: Option<f32>,
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
            RopeScaling::LongRope {
                short,
                long,
                original_context,
                context,
                attention_factor,
            } => {
                positive("original context", *original_context)?;
                positive("context", *context)?;
                if let Some(a) = attention_factor {
                    positive("attention factor", *a)?;
                }
                if let Some(f) = short
                    .iter()
                    .chain(long)
                    .find(|f| !(f.is_finite() && **f > 0.0))
                {
                    return Err(bad(format!(
                        "LongRoPE factor {f} must be a positive number"
                    )));
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
    pub fn divisors(&self, n_rot: usize, theta: f32) -> Result<Vec<f32>> {
        let n_pairs = n_rot / 2;
        Ok(match self {
            RopeScaling::LongRope {
                short,
                long,
                original_context,
                context,
                ..
            } => {
                let chosen = if context > original_context {
                    long
                } else {
                    short
                };
                if chosen.len() != n_pairs {
                    return Err(bad(format!(
                        "LongRoPE has {} factors for {n_pairs} rotated pairs",
                        chosen.len()
                    )));
                }
                chosen.clone()
            }
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
        })
    }

    /// What cos and sin are multiplied by (transformers' `attention_scaling`): 1 unless
    /// YaRN or LongRoPE.
    pub fn attention_factor(&self) -> f32 {
        match self {
            RopeScaling::Linear { .. } | RopeScaling::Llama3 { .. } => 1.0,
            RopeScaling::LongRope {
                original_context,
                context,
                attention_factor,
                ..
            } => {
                let factor = context / original_context;
                attention_factor.unwrap_or_else(|| {
                    if factor <= 1.0 {
                        1.0
                    } else {
                        (1.0 + factor.ln() / original_context.ln()).sqrt()
                    }
                })
            }
            RopeScaling::Yarn(y) => y.attention_factor.unwrap_or_else(|| {
                if y.factor <= 1.0 {
                    1.0
                } else {
                    0.1 * y.factor.ln() + 1.0
                }
            }),
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
        let d = yarn.divisors(128, 1_000_000.0).unwrap();
        assert_eq!(d.len(), 64);
        assert_eq!(d[0], 1.0, "the fastest frequency is kept");
        assert_eq!(d[63], 4.0, "the slowest is interpolated");
        assert!(d.windows(2).all(|w| w[0] <= w[1]), "a ramp between");
        let a = 0.1 * 4f32.ln() + 1.0;
        assert!((yarn.attention_factor() - a).abs() < 1e-6);
        assert_eq!(
            RopeScaling::Linear { factor: 2.0 }
                .divisors(8, 1e4)
                .unwrap(),
            [2.0; 4]
        );
        assert!(RopeScaling::Linear { factor: 0.0 }.checked().is_err());
    }
}
