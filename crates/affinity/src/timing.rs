//! Per-call time by a reps-slope fit.
//!
//! A call's measured time carries a fixed cost that is not the computation's: the timer,
//! a device's submission and synchronisation, caches warming. Timing `k` and then `2k`
//! back-to-back calls and taking the slope, `(t(2k) − t(k)) / k`, cancels whatever is paid
//! once per batch of calls; what is left is what one more call costs. Several trials give
//! the fit's spread, reported beside it so a noisy figure shows itself. Fits to be
//! compared (a block and the block without a part) run in alternation, trial by trial,
//! and their difference is taken per trial, so a shared machine's drift cancels.

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlopeFit {
    /// Seconds one more call costs: the median of the trials' slopes.
    pub seconds: f64,
    /// The slopes' range, `(max − min) / |median|`: 0 for a quiet machine.
    pub spread: f64,
    /// Seconds paid once per batch whatever its size (the median intercept).
    pub fixed: f64,
    pub plan: FitPlan,
    /// Each trial's slope, in order.
    pub slopes: Vec<f64>,
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

impl SlopeFit {
    fn of_trials(slopes: Vec<f64>, intercepts: Vec<f64>, plan: FitPlan) -> Self {
        let lo = slopes.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = slopes.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let seconds = median(slopes.clone());
        Self {
            seconds,
            spread: if seconds != 0.0 {
                (hi - lo) / seconds.abs()
            } else {
                f64::INFINITY
            },
            fixed: median(intercepts),
            plan,
            slopes,
        }
    }

    /// This fit less `other`, trial by trial: for fits taken in alternation
    /// ([`reps_slope_alternating`]), so a drift common to both cancels in each pair.
    pub fn minus(&self, other: &SlopeFit) -> SlopeFit {
        let slopes = self
            .slopes
            .iter()
            .zip(&other.slopes)
            .map(|(a, b)| a - b)
            .collect();
        SlopeFit::of_trials(slopes, vec![self.fixed - other.fixed], self.plan)
    }
}

/// Fits each call's per-call time: for each, one untimed call and one timed to size its
/// batches; then `plan.trials` rounds in which every call runs one trial of `k` and `2k`
/// calls, so the machine's drift over the fits reaches all of them alike. The first error
/// stops the fits and is returned.
pub fn reps_slope_alternating<E>(
    plan: FitPlan,
    clock: &mut dyn Clock,
    calls: &mut [&mut dyn FnMut() -> Result<(), E>],
) -> Result<Vec<SlopeFit>, E> {
    let mut ks = Vec::with_capacity(calls.len());
    for call in calls.iter_mut() {
        call()?;
        let start = clock.now();
        call()?;
        let one = clock.now() - start;
        let needed = if one > 0.0 {
            (plan.min_batch / one).ceil().min(1e6) as usize
        } else {
            1
        };
        ks.push(plan.k.max(needed).max(1));
    }
    let batch = |call: &mut dyn FnMut() -> Result<(), E>, n: usize, clock: &mut dyn Clock| {
        let start = clock.now();
        for _ in 0..n {
            call()?;
        }
        Ok(clock.now() - start)
    };
    let mut trials = vec![(Vec::new(), Vec::new()); calls.len()];
    for _ in 0..plan.trials.max(1) {
        for ((call, &k), (slopes, intercepts)) in calls.iter_mut().zip(&ks).zip(&mut trials) {
            let short = batch(&mut **call, k, clock)?;
            let long = batch(&mut **call, 2 * k, clock)?;
            let slope = (long - short) / k as f64;
            slopes.push(slope);
            intercepts.push(short - k as f64 * slope);
        }
    }
    Ok(trials
        .into_iter()
        .zip(ks)
        .map(|((slopes, intercepts), k)| {
            SlopeFit::of_trials(slopes, intercepts, FitPlan { k, ..plan })
        })
        .collect())
}

/// [`reps_slope_alternating`], taken again, up to `retries` more times, while any call's
/// per-call time comes out zero or negative. Every call costs time, so such a slope
/// measured the machine (a stall during a shorter batch on a shared host), not the call,
/// and a prediction would have to drop it.
pub fn reps_slope_alternating_positive<E>(
    plan: FitPlan,
    clock: &mut dyn Clock,
    calls: &mut [&mut dyn FnMut() -> Result<(), E>],
    retries: usize,
) -> Result<Vec<SlopeFit>, E> {
    let mut fits = reps_slope_alternating(plan, clock, calls)?;
    for _ in 0..retries {
        if fits.iter().all(|f| f.seconds > 0.0) {
            break;
        }
        fits = reps_slope_alternating(plan, clock, calls)?;
    }
    Ok(fits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// One call's fit.
    fn reps_slope<E>(
        plan: FitPlan,
        clock: &mut dyn Clock,
        mut call: impl FnMut() -> Result<(), E>,
    ) -> Result<SlopeFit, E> {
        let mut fits = reps_slope_alternating(plan, clock, &mut [&mut call])?;
        Ok(fits.remove(0))
    }

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
    fn alternating_fits_take_turns_and_differ_per_trial() {
        let order = std::cell::RefCell::new(String::new());
        let mut clock = WallClock::default();
        let plan = FitPlan {
            k: 1,
            trials: 2,
            min_batch: 0.0,
        };
        let mut a = || -> Result<(), ()> {
            order.borrow_mut().push('a');
            Ok(())
        };
        let mut b = || -> Result<(), ()> {
            order.borrow_mut().push('b');
            Ok(())
        };
        let fits = reps_slope_alternating(plan, &mut clock, &mut [&mut a, &mut b]).unwrap();
        assert_eq!(fits.len(), 2);
        // Warm-up and sizing of each, then per trial one short and one long batch each.
        assert_eq!(*order.borrow(), "aabbaaabbbaaabbb");

        let whole = SlopeFit::of_trials(vec![1.0, 3.0, 1.1], vec![0.0; 3], plan);
        let ablated = SlopeFit::of_trials(vec![0.5, 2.5, 0.55], vec![0.0; 3], plan);
        let part = whole.minus(&ablated);
        assert_eq!(part.slopes, vec![0.5, 0.5, 0.55]);
        assert_eq!(part.seconds, 0.5);
        assert!((part.spread - 0.1).abs() < 1e-12, "{part:?}");
    }

    #[test]
    fn a_slope_made_negative_by_a_stall_is_measured_again() {
        let time = Cell::new(0.0);
        let mut clock = Scripted {
            time: &time,
            per_reading: 0.0,
        };
        let plan = FitPlan {
            k: 1,
            trials: 1,
            min_batch: 0.0,
        };
        // Untimed call, sizing call, then one short (1) and one long (2) batch: a stall of
        // 4 in the short batch makes the first slope (2 - 5) / 1 = -3.
        let costs = [1.0, 1.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        let mut calls = 0;
        let mut call = || -> Result<(), ()> {
            time.set(time.get() + costs[calls]);
            calls += 1;
            Ok(())
        };
        let fits = reps_slope_alternating_positive(plan, &mut clock, &mut [&mut call], 3).unwrap();
        assert_eq!(fits[0].seconds, 1.0);
        assert_eq!(calls, 10, "one fit taken again, not more");

        // A positive fit is kept as it is.
        let mut calls = 0;
        let mut steady = || -> Result<(), ()> {
            time.set(time.get() + 1.0);
            calls += 1;
            Ok(())
        };
        let fits =
            reps_slope_alternating_positive(plan, &mut clock, &mut [&mut steady], 3).unwrap();
        assert_eq!(fits[0].seconds, 1.0);
        assert_eq!(calls, 5);
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
