//! Choosing the next token from logits.
//!
//! Order (as in Hugging Face's `generate`, after OpenAI's logit bias): repetition penalty, temperature, top-k,
//! top-p, min-p, then a draw from the renormalised distribution. Temperature 0 is greedy:
//! argmax with ties going to the lowest id, exactly as the references were made.

use pyramid_kernels::ops::argmax;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Result, RuntimeError};

#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables; applied to tokens among the last `repeat_last_n`.
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub seed: u64,
    /// Added to these tokens' logits before anything else (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |name, value: f32, reason| RuntimeError::BadSamplingParameter {
            name,
            value: value.to_string(),
            reason,
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(bad(
                "temperature",
                self.temperature,
                "must be a finite number >= 0",
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(bad("top_p", self.top_p, "must be in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(bad("min_p", self.min_p, "must be in [0, 1]"));
        }
        if let Some(&(_, bias)) = self.logit_bias.iter().find(|(_, b)| !b.is_finite()) {
            return Err(bad("logit_bias", bias, "must be finite"));
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return Err(bad(
                "repeat_penalty",
                self.repeat_penalty,
                "must be a finite number > 0",
            ));
        }
        Ok(())
    }
}

impl SamplerConfig {
    /// Checks the token ids the settings name against a vocabulary of `n_vocab` tokens.
    pub fn check_vocab(&self, n_vocab: usize) -> Result<()> {
        match self
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= n_vocab)
        {
            Some(&(id, _)) => Err(RuntimeError::BadSamplingParameter {
                name: "logit_bias",
                value: id.to_string(),
                reason: "is not a token id of this vocabulary",
            }),
            None => Ok(()),
        }
    }
}

#[derive(Debug)]
pub struct Sampler {
    config: SamplerConfig,
    rng: StdRng,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Result<Self> {
        config.validate()?;
        let rng = StdRng::seed_from_u64(config.seed);
        Ok(Self {
            config,
            rng,
            candidates: Vec::new(),
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Picks the next token. `logits` is modified (penalties); `history` is every token so far.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let cfg = &self.config;
        for &(id, bias) in &cfg.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if cfg.repeat_penalty != 1.0 {
            let recent = &history[history.len().saturating_sub(cfg.repeat_last_n)..];
            let mut seen = std::collections::HashSet::new();
            for &id in recent {
                if seen.insert(id) {
                    if let Some(l) = logits.get_mut(id as usize) {
                        *l = if *l > 0.0 {
                            *l / cfg.repeat_penalty
                        } else {
                            *l * cfg.repeat_penalty
                        };
                    }
                }
            }
        }
        if cfg.temperature == 0.0 {
            return argmax(logits);
        }

        // Logits are shifted to at most 0 before dividing, so a temperature small enough
        // to overflow `l / t` gives -inf (weight 0) rather than inf - inf = NaN: the top
        // logits keep all the weight, i.e. an underflowing temperature is greedy.
        let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let c = &mut self.candidates;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, (l - top) / cfg.temperature)),
        );
        // Highest first; ties by lowest id so results do not depend on sort stability.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if cfg.top_k > 0 && cfg.top_k < c.len() {
            c.select_nth_unstable_by(cfg.top_k - 1, by_logit);
            c.truncate(cfg.top_k);
        }
        c.sort_unstable_by(by_logit);

        // Softmax over the survivors.
        let max = c[0].1;
        let mut sum = 0.0f32;
        for cand in c.iter_mut() {
            cand.1 = (cand.1 - max).exp();
            sum += cand.1;
        }
        for cand in c.iter_mut() {
            cand.1 /= sum;
        }

        if cfg.top_p < 1.0 {
            let mut cumulative = 0.0;
            let mut keep = c.len();
            for (i, cand) in c.iter().enumerate() {
                cumulative += cand.1;
                if cumulative >= cfg.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
        }
        if cfg.min_p > 0.0 {
            let threshold = c[0].1 * cfg.min_p;
            let keep = c
                .iter()
                .take_while(|cand| cand.1 >= threshold)
                .count()
                .max(1);
            c.truncate(keep);
        }

        let total: f32 = c.iter().map(|cand| cand.1).sum();
        let mut r = self.rng.random::<f32>() * total;
        for cand in c.iter() {
            if r < cand.1 {
                return cand.0;
            }
            r -= cand.1;
        }
        c[c.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(f: impl FnOnce(&mut SamplerConfig)) -> Sampler {
        let mut cfg = SamplerConfig::greedy();
        f(&mut cfg);
        Sampler::new(cfg).unwrap()
    }

    #[test]
    fn greedy_ties_go_to_lowest_id() {
        let mut s = sampler(|_| {});
        assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, 2.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_other_seed_differs() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = sampler(|c| {
                c.temperature = 1.0;
                c.seed = seed;
            });
            (0..50)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = sampler(|c| {
            c.temperature = 5.0;
            c.top_k = 1;
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&mut [0.1, 0.5, 0.4], &[]), 1);
        }
    }

    #[test]
    fn logit_bias_moves_and_bans_tokens() {
        let logits = [0.5f32, 3.25, -2.0, 3.0];
        let mut s = sampler(|c| c.logit_bias = vec![(2, 10.0), (9, 5.0)]);
        assert_eq!(s.sample(&mut logits.clone(), &[]), 2);
        let mut s = sampler(|c| c.logit_bias = vec![(1, -100.0)]);
        assert_eq!(s.sample(&mut logits.clone(), &[]), 3);
        let bad = SamplerConfig {
            logit_bias: vec![(0, f32::NAN)],
            ..SamplerConfig::greedy()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn a_temperature_that_underflows_is_greedy() {
        let logits = [0.5f32, 3.25, -2.0, 3.0, 0.0];
        for t in [1e-30f32, 1e-38, 1e-40, 1e-45] {
            let mut s = sampler(|c| {
                c.temperature = t;
                c.seed = 3;
            });
            for _ in 0..20 {
                assert_eq!(s.sample(&mut logits.clone(), &[]), 1, "temperature {t:e}");
            }
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // Probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.5 keeps only the first.
        let logits = [3.0, 2.0, 1.0, 0.0];
        let mut s = sampler(|c| {
            c.temperature = 1.0;
            c.top_p = 0.5;
        });
        assert!((0..50).all(|_| s.sample(&mut logits.clone(), &[]) == 0));
        let mut s = sampler(|c| {
            c.temperature = 1.0;
            c.min_p = 0.3; // keeps p >= 0.19: tokens 0 and 1
        });
        let draws: Vec<u32> = (0..200)
            .map(|_| s.sample(&mut logits.clone(), &[]))
            .collect();
        assert!(draws.iter().all(|&t| t <= 1));
        assert!(draws.contains(&1));
    }

    #[test]
    fn repetition_penalty_demotes_recent_tokens() {
        let mut s = sampler(|c| c.repeat_penalty = 2.0);
        // 2.0 / 2 = 1.0 < 1.5: token 0 was seen, so token 1 wins.
        assert_eq!(s.sample(&mut [2.0, 1.5], &[0]), 1);
        // Negative logits are multiplied, pushing them further down.
        assert_eq!(s.sample(&mut [-1.0, -1.5], &[0]), 1);
    }

    #[test]
    fn bad_values_are_rejected_by_name() {
        for (cfg, name) in [
            (
                SamplerConfig {
                    temperature: -1.0,
                    ..SamplerConfig::greedy()
                },
                "temperature",
            ),
            (
                SamplerConfig {
                    top_p: 0.0,
                    ..SamplerConfig::greedy()
                },
                "top_p",
            ),
            (
                SamplerConfig {
                    min_p: 1.5,
                    ..SamplerConfig::greedy()
                },
                "min_p",
            ),
            (
                SamplerConfig {
                    repeat_penalty: 0.0,
                    ..SamplerConfig::greedy()
                },
                "repeat_penalty",
            ),
            (
                SamplerConfig {
                    temperature: f32::NAN,
                    ..SamplerConfig::greedy()
                },
                "temperature",
            ),
        ] {
            match Sampler::new(cfg) {
                Err(RuntimeError::BadSamplingParameter { name: n, .. }) => assert_eq!(n, name),
                other => panic!("expected error for {name}, got {other:?}"),
            }
        }
    }
}
