//! Per-call time by a reps-slope fit.
//!
//! A call's measured time carries a fixed cost that is not the computation's: the timer,
//! a device's submission and synchronisation, caches warming. Timing `k` and then `2k`
//! back-to-back calls and taking the slope, `(t(2k) − t(k)) / k`, cancels whatever is paid
//! once per batch of calls; what is left is what one more call costs. Several trials give
//! the fit's spread, reported beside it so a noisy figure shows itself.

use serde::{Deserialize, Serialize};

/// Where the fit reads time from: seconds on any monotonic scale.
pub trait Clock {
    fn now(&mut self) -> f64;
}

/// The process's monotonic clock.
pub struct WallClock(std::time::Instant);

impl Default for WallClock {
    fn default() -> Self {
        Self(std::time::Instant::now())
    }
}

impl Clock for WallClock {
    fn now(&mut self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// How many calls a fit makes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FitPlan {
    /// Calls in the shorter batch of a trial (the longer has twice as many), at least.
    pub k: usize,
    pub trials: usize,
    /// Seconds the shorter batch should last at least: `k` grows to reach it, so a
    /// call of microseconds is not fitted from a difference of timer noise.
    pub min_batch: f64,
}

/// A reps-slope fit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SlopeFit {
    /// Seconds one more call costs: the median of the trials' slopes.
    pub seconds: f64,
    /// The slopes' range, `(max − min) / median`: 0 for a quiet machine.
    pub spread: f64,
    /// Seconds paid once per batch whatever its size (the median intercept).
    pub fixed: f64,
    pub plan: FitPlan,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Fits `call`'s per-call time: one untimed call first, one timed to size the batches,
/// then `plan.trials` trials of `k` and `2k` calls. The first error stops the fit and is
/// returned.
pub fn reps_slope<E>(
    plan: FitPlan,
    clock: &mut dyn Clock,
    mut call: impl FnMut() -> Result<(), E>,
) -> Result<SlopeFit, E> {
    call()?;
    let start = clock.now();
    call()?;
    let one = clock.now() - start;
    let needed = if one > 0.0 {
        (plan.min_batch / one).ceil().min(1e6) as usize
    } else {
        1
    };
    let (k, trials) = (plan.k.max(needed).max(1), plan.trials.max(1));
    let mut batch = |n: usize, clock: &mut dyn Clock| -> Result<f64, E> {
        let start = clock.now();
        for _ in 0..n {
            call()?;
        }
        Ok(clock.now() - start)
    };
    let (mut slopes, mut intercepts) = (Vec::new(), Vec::new());
    for _ in 0..trials {
        let short = batch(k, clock)?;
        let long = batch(2 * k, clock)?;
        let slope = (long - short) / k as f64;
        slopes.push(slope);
        intercepts.push(short - k as f64 * slope);
    }
    let lo = slopes.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = slopes.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let seconds = median(slopes);
    Ok(SlopeFit {
        seconds,
        spread: if seconds > 0.0 {
            (hi - lo) / seconds
        } else {
            f64::INFINITY
        },
        fixed: median(intercepts),
        plan: FitPlan { k, ..plan },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Time advances by what the calls cost, plus a fixed cost per reading.
    struct Scripted<'a> {
        time: &'a Cell<f64>,
        per_reading: f64,
    }

    impl Clock for Scripted<'_> {
        fn now(&mut self) -> f64 {
            self.time.set(self.time.get() + self.per_reading);
            self.time.get()
        }
    }

    #[test]
    fn the_slope_cancels_the_fixed_cost() {
        let time = Cell::new(0.0);
        let mut clock = Scripted {
            time: &time,
            per_reading: 0.5,
        };
        let plan = FitPlan {
            k: 4,
            trials: 3,
            min_batch: 0.0,
        };
        let fit = reps_slope::<()>(plan, &mut clock, || {
            time.set(time.get() + 0.003);
            Ok(())
        })
        .unwrap();
        assert!((fit.seconds - 0.003).abs() < 1e-12, "{fit:?}");
        assert!(fit.spread < 1e-6);
        // The batch's end reading is inside its interval: one reading's cost per batch.
        assert!((fit.fixed - 0.5).abs() < 1e-9, "{fit:?}");
    }

    #[test]
    fn noise_shows_in_the_spread() {
        let time = Cell::new(0.0);
        let mut clock = Scripted {
            time: &time,
            per_reading: 0.0,
        };
        // The untimed call, the sizing call, then three trials of 1 and 2 calls.
        let costs = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0, 1.0, 1.0, 1.0];
        let mut i = 0;
        let plan = FitPlan {
            k: 1,
            trials: 3,
            min_batch: 0.0,
        };
        let fit = reps_slope::<()>(plan, &mut clock, || {
            time.set(time.get() + costs[i % costs.len()]);
            i += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(fit.seconds, 1.0);
        assert!(fit.spread >= 2.0, "{fit:?}");
    }

    #[test]
    fn an_error_stops_the_fit() {
        let mut clock = WallClock::default();
        let mut calls = 0;
        let plan = FitPlan {
            k: 2,
            trials: 2,
            min_batch: 0.0,
        };
        let result = reps_slope(plan, &mut clock, || {
            calls += 1;
            if calls == 4 {
                Err("device lost")
            } else {
                Ok(())
            }
        });
        assert_eq!(result.unwrap_err(), "device lost");
        assert_eq!(calls, 4);
    }

    #[test]
    fn short_calls_get_batches_of_the_minimum_length() {
        let time = Cell::new(0.0);
        let mut clock = Scripted {
            time: &time,
            per_reading: 0.0,
        };
        let plan = FitPlan {
            k: 2,
            trials: 2,
            min_batch: 0.05,
        };
        let fit = reps_slope::<()>(plan, &mut clock, || {
            time.set(time.get() + 0.001);
            Ok(())
        })
        .unwrap();
        assert_eq!(fit.plan.k, 50);
        assert!((fit.seconds - 0.001).abs() < 1e-12);
    }
}
