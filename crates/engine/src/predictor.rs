//! When will a session outgrow its window? Predicted from its own growth.
//!
//! An agent session grows in steps: a burst of appended context (prefilled) and a run of
//! generated tokens. The predictor keeps exponential moving averages of two things: the
//! tokens a step adds, and the rate at which the session grows in wall time. A window is
//! about to be outgrown when either says so:
//! - by count: the next step is expected to add more than the room left; or
//! - by time: at the observed rate, the room left is used up sooner than the next
//!   window's artifact takes to compile (plus a margin).
//!
//! Everything is a plain function of what it is told, with no clock of its own, so the
//! policy is tested with scripted growth.

use std::time::Duration;

/// Weight of the newest observation in the moving averages.
const EMA_WEIGHT: f64 = 0.5;
/// Act when the room left is within this multiple of the expected step growth: agent steps
/// vary around their median (twice it is the 99th percentile of a log-normal spread of
/// σ = 0.3), and compiling one step early costs only the artifact's memory.
const STEP_HEADROOM: f64 = 2.0;

#[derive(Debug, Clone, Copy, Default)]
struct Ema(Option<f64>);

impl Ema {
    fn push(&mut self, x: f64) {
        self.0 = Some(match self.0 {
            None => x,
            Some(m) => m + EMA_WEIGHT * (x - m),
        });
    }
}

#[derive(Debug, Clone, Default)]
pub struct GrowthPredictor {
    tokens_per_step: Ema,
    tokens_per_sec: Ema,
}

impl GrowthPredictor {
    /// A finished step: `tokens` added (appended and generated) in `elapsed`.
    pub fn observe_step(&mut self, tokens: usize, elapsed: Duration) {
        self.tokens_per_step.push(tokens as f64);
        let secs = elapsed.as_secs_f64();
        if secs > 0.0 {
            self.tokens_per_sec.push(tokens as f64 / secs);
        }
    }

    /// Takes `tokens` as the expected step until a step has been seen: a new session's
    /// first turn (its prompt and reply) is the best guess of what a turn adds.
    pub fn assume_step(&mut self, tokens: usize) {
        if self.tokens_per_step.0.is_none() {
            self.tokens_per_step.push(tokens as f64);
        }
    }

    /// Tokens the next step is expected to add, once a step has been seen.
    pub fn expected_step_tokens(&self) -> Option<f64> {
        self.tokens_per_step.0
    }

    /// Wall time until `remaining` free positions are used, at the observed rate (or at
    /// `decode_rate` tokens/s if that is faster: within a step a session grows at least as
    /// fast as it decodes).
    pub fn time_to_cross(&self, remaining: usize, decode_rate: Option<f64>) -> Option<Duration> {
        let rate = match (self.tokens_per_sec.0, decode_rate) {
            (Some(a), Some(b)) => a.max(b),
            (a, b) => a.or(b)?,
        };
        // A rate decayed towards zero gives no usable prediction rather than a panic.
        Duration::try_from_secs_f64(remaining as f64 / rate).ok()
    }

    /// Whether the next window's artifacts should be compiled now.
    pub fn should_prepare(
        &self,
        remaining: usize,
        decode_rate: Option<f64>,
        expected_compile: Duration,
        margin: Duration,
    ) -> bool {
        if let Some(step) = self.expected_step_tokens() {
            if remaining as f64 <= step * STEP_HEADROOM {
                return true;
            }
        }
        self.time_to_cross(remaining, decode_rate)
            .is_some_and(|t| t <= expected_compile + margin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn steady_growth_triggers_one_step_ahead() {
        let mut p = GrowthPredictor::default();
        assert!(!p.should_prepare(100, None, MS, MS), "no evidence yet");
        for _ in 0..3 {
            p.observe_step(200, 1000 * MS);
        }
        // 200 tokens a step: 1000 left is five steps away, 350 within the next two.
        assert!(!p.should_prepare(1000, None, 10 * MS, 10 * MS));
        assert!(p.should_prepare(350, None, 10 * MS, 10 * MS));
    }

    #[test]
    fn a_slow_compile_triggers_earlier() {
        let mut p = GrowthPredictor::default();
        p.observe_step(100, 1000 * MS); // 100 tokens/s
                                        // 1000 left = 10 s away: a 2 s compile can wait, a 9 s one cannot.
        assert!(!p.should_prepare(1000, None, 2000 * MS, 500 * MS));
        assert!(p.should_prepare(1000, None, 9000 * MS, 1500 * MS));
    }

    #[test]
    fn decoding_faster_than_the_step_average_counts() {
        let mut p = GrowthPredictor::default();
        p.observe_step(10, 10_000 * MS); // 1 token/s on average (long pauses)
        let t = p.time_to_cross(100, Some(50.0)).unwrap();
        assert_eq!(t, 2000 * MS);
        assert!(p.should_prepare(100, Some(50.0), 1500 * MS, 600 * MS));
    }

    #[test]
    fn averages_follow_a_change_of_pace() {
        let mut p = GrowthPredictor::default();
        p.observe_step(100, 1000 * MS);
        p.observe_step(300, 1000 * MS);
        assert_eq!(p.expected_step_tokens(), Some(200.0));
    }

    #[test]
    fn idle_steps_give_no_prediction_rather_than_a_panic() {
        let mut p = GrowthPredictor::default();
        for _ in 0..2000 {
            p.observe_step(0, 1000 * MS);
        }
        assert_eq!(p.time_to_cross(10, None), None);
        assert!(!p.should_prepare(usize::MAX, None, MS, MS));
    }
}
