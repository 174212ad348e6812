//! Whether a device computed what the native f32 path computes.
//!
//! A time is worth reporting only for the right arithmetic: a graph that dropped a
//! residual or mis-bound an input can be fast. Each cell's output is compared with the
//! native f32 computation on the same inputs; for a block, the comparison is of what the
//! block adds to its input (its output less the input), since the residual stream passes
//! through unchanged and would make any block look right.

use serde::{Deserialize, Serialize};

/// How a device's output compares with the f32 reference.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Agreement {
    /// Pearson correlation of the two outputs.
    pub correlation: f64,
    /// Largest absolute difference.
    pub max_abs_diff: f64,
    /// Largest absolute value of the reference, the scale the difference is read against.
    pub reference_scale: f64,
}

impl Agreement {
    /// `got` against `reference`, both less `input` where given (a block's residual).
    /// `None` when the lengths differ.
    pub fn of(reference: &[f32], got: &[f32], input: Option<&[f32]>) -> Option<Self> {
        if reference.len() != got.len() || input.is_some_and(|x| x.len() != got.len()) {
            return None;
        }
        let base = |i: usize| input.map_or(0.0, |x| x[i] as f64);
        let n = got.len().max(1) as f64;
        let pairs = || {
            (0..got.len()).map(move |i| (reference[i] as f64 - base(i), got[i] as f64 - base(i)))
        };
        let (mean_r, mean_g) = pairs().fold((0.0, 0.0), |(a, b), (r, g)| (a + r / n, b + g / n));
        let (mut srg, mut srr, mut sgg) = (0.0, 0.0, 0.0);
        let (mut max_abs_diff, mut reference_scale) = (0.0f64, 0.0f64);
        for (r, g) in pairs() {
            srg += (r - mean_r) * (g - mean_g);
            srr += (r - mean_r) * (r - mean_r);
            sgg += (g - mean_g) * (g - mean_g);
            max_abs_diff = max_abs_diff.max((r - g).abs());
            reference_scale = reference_scale.max(r.abs());
        }
        let correlation = if srr > 0.0 && sgg > 0.0 {
            srg / (srr * sgg).sqrt()
        } else if max_abs_diff == 0.0 {
            1.0
        } else {
            0.0
        };
        Some(Self {
            correlation,
            max_abs_diff,
            reference_scale,
        })
    }

    /// Why the output is not the reference's at `precision` (`f32`, `bf16`, `int8`,
    /// `int4`), or `None` when it is.
    ///
    /// f32 must agree to rounding (a different summation order): correlation ≥ 0.9999
    /// and differences within 1e-3 of the reference's scale. Compressed weights change
    /// every value a little but not the pattern: correlation ≥ 0.98 (INT4: 0.9).
    pub fn problem(&self, precision: &str) -> Option<String> {
        let (min_corr, max_rel) = match precision {
            "f32" => (0.9999, 1e-3),
            "int4" => (0.9, f64::INFINITY),
            _ => (0.98, f64::INFINITY),
        };
        let rel = self.max_abs_diff / self.reference_scale.max(f64::MIN_POSITIVE);
        // A NaN correlation (a device returning NaNs) fails too.
        if self.correlation.is_nan() || self.correlation < min_corr {
            Some(format!(
                "correlation {:.5} with the native f32 output, below {min_corr}",
                self.correlation
            ))
        } else if rel > max_rel {
            Some(format!(
                "max abs difference {:.3e} is {rel:.1e} of the reference's scale, above {max_rel:e}",
                self.max_abs_diff
            ))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_outputs_agree_and_a_dropped_part_does_not() {
        let input: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin() * 10.0).collect();
        let added: Vec<f32> = (0..64).map(|i| (i as f32 * 1.3).cos() * 0.1).collect();
        let block: Vec<f32> = input.iter().zip(&added).map(|(x, a)| x + a).collect();
        let same = Agreement::of(&block, &block, Some(&input)).unwrap();
        assert_eq!(same.correlation, 1.0);
        assert!(same.problem("f32").is_none());
        // Without its part the block returns the input: its output still correlates
        // with the reference's at 0.9999 (the residual dominates), the difference does not.
        let dropped = Agreement::of(&block, &input, Some(&input)).unwrap();
        assert!(dropped.problem("f32").is_some());
        assert!(dropped.problem("int8").is_some(), "{dropped:?}");
        let raw = Agreement::of(&block, &input, None).unwrap();
        assert!(
            raw.correlation > 0.999,
            "what the residual would hide: {raw:?}"
        );
    }

    #[test]
    fn compressed_weights_pass_with_small_errors() {
        let reference: Vec<f32> = (0..256).map(|i| (i as f32 * 0.11).sin()).collect();
        let noisy: Vec<f32> = reference
            .iter()
            .enumerate()
            .map(|(i, r)| r + 0.02 * ((i * 7919 % 13) as f32 / 6.0 - 1.0))
            .collect();
        let a = Agreement::of(&reference, &noisy, None).unwrap();
        assert!(a.problem("int8").is_none(), "{a:?}");
        assert!(a.problem("f32").is_some());
        assert!(Agreement::of(&reference, &noisy[1..], None).is_none());
    }
}
