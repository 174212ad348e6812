//! Which executor runs each layer of a split prefill, chosen by predicting the schedule.
//!
//! A prediction drives the scheduler's own [`Policy`] with task times taken from a
//! profile's block figures, so it makes the choices a run would make. The candidates are
//! every layer on whichever executor is free, and, for each count k of native layers,
//! those k spread evenly through the model, first, last, or where the device is slowest
//! relative to the native kernels (a device that runs one kind of layer badly keeps
//! those native). The least predicted time wins; a tie keeps the free-for-all, which
//! adapts to a machine whose speed drifts.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::schedule::{Assignment, Policy};
use crate::{AffinityError, Result};

/// A split's layers and what they are predicted to take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitPlan {
    pub assignment: Vec<Assignment>,
    /// Predicted seconds for one chunk's tasks under `assignment`.
    pub predicted: f64,
    /// Predicted seconds with every layer on whichever executor is free.
    pub predicted_either: f64,
}

impl SplitPlan {
    /// `cpu 0-3,8 · ov:CPU 4-7 · either 9`: the layers of each place as ranges, the
    /// executors named `native` and `device`.
    pub fn describe(&self, native: &str, device: &str) -> String {
        let mut parts = Vec::new();
        for (place, name) in [
            (Assignment::Native, native),
            (Assignment::Device, device),
            (Assignment::Either, "either"),
        ] {
            let layers: Vec<usize> = (0..self.assignment.len())
                .filter(|&l| self.assignment[l] == place)
                .collect();
            if !layers.is_empty() {
                parts.push(format!("{name} {}", ranges(&layers)));
            }
        }
        parts.join(" · ")
    }
}

/// `0-3,8,10-11` for sorted layers.
fn ranges(layers: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut start = 0;
    for i in 1..=layers.len() {
        if i == layers.len() || layers[i] != layers[i - 1] + 1 {
            let (a, b) = (layers[start], layers[i - 1]);
            out.push(if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            });
            start = i;
        }
    }
    out.join(",")
}

/// Predicted wall seconds of [`crate::schedule::run_tasks`] over `n_chunks` chunks when a
/// task of layer l takes `task_seconds[l][w]` on worker w (`[native, device]`).
pub fn simulate(task_seconds: &[[f64; 2]], n_chunks: usize, assignment: &[Assignment]) -> f64 {
    let mut policy = Policy::new(n_chunks, assignment);
    let mut now = 0.0;
    let mut ends: [Option<(f64, f64)>; 2] = [None, None];
    loop {
        for (w, _, layer) in policy.start() {
            let took = task_seconds[layer][w];
            ends[w] = Some((now + took, took));
        }
        let next = (0..2)
            .filter_map(|w| ends[w].map(|(end, _)| (w, end)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let Some((w, end)) = next else { break };
        let (_, took) = ends[w].take().expect("a running task has an end");
        now = end;
        policy.finish(w, Duration::from_secs_f64(took), true);
    }
    now
}

/// The assignment of the least predicted time for `n_chunks` chunks whose tasks of layer
/// l take `task_seconds[l]` on `[native, device]`.
pub fn plan_layers(task_seconds: &[[f64; 2]], n_chunks: usize) -> Result<SplitPlan> {
    let n = task_seconds.len();
    if n == 0 || n_chunks == 0 {
        return Err(AffinityError::Plan(
            "a split needs at least one layer and one chunk".into(),
        ));
    }
    if let Some(bad) = task_seconds
        .iter()
        .flatten()
        .find(|s| !(s.is_finite() && **s > 0.0))
    {
        return Err(AffinityError::Plan(format!(
            "a split prefill cannot schedule a task time of {bad} s: the profile's block figures must be positive"
        )));
    }
    let either = vec![Assignment::Either; n];
    let predicted_either = simulate(task_seconds, n_chunks, &either);
    let mut best = (either, predicted_either);
    let native_if = |on_native: &dyn Fn(usize) -> bool| -> Vec<Assignment> {
        (0..n)
            .map(|l| {
                if on_native(l) {
                    Assignment::Native
                } else {
                    Assignment::Device
                }
            })
            .collect()
    };
    // Layers by how much slower the device runs them than the native kernels.
    let mut by_device_penalty: Vec<usize> = (0..n).collect();
    by_device_penalty.sort_by(|&a, &b| {
        let ratio = |l: usize| task_seconds[l][1] / task_seconds[l][0];
        ratio(b).total_cmp(&ratio(a))
    });
    for k in 0..=n {
        let worst_on_device = &by_device_penalty[..k];
        let candidates = [
            native_if(&|l| worst_on_device.contains(&l)),
            // Bresenham: layer l is native when the running share k·l/n steps up at it.
            native_if(&|l| (l + 1) * k / n > l * k / n),
            native_if(&|l| l < k),
            native_if(&|l| l >= n - k),
        ];
        for assignment in candidates {
            let predicted = simulate(task_seconds, n_chunks, &assignment);
            if predicted < best.1 {
                best = (assignment, predicted);
            }
        }
    }
    Ok(SplitPlan {
        assignment: best.0,
        predicted: best.1,
        predicted_either,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Assignment::{Device, Either, Native};

    #[test]
    fn a_simulated_schedule_respects_the_dependencies_and_the_assignment() {
        // One executor alone: every task in sequence.
        let costs = [[1.0, 2.0]; 3];
        assert_eq!(simulate(&costs, 4, &[Native; 3]), 12.0);
        assert_eq!(simulate(&costs, 4, &[Device; 3]), 24.0);
        // Two layers, one per executor, equal speed: a two-stage pipeline, one task of
        // fill then both busy.
        let equal = [[1.0, 1.0]; 2];
        assert_eq!(simulate(&equal, 4, &[Native, Device]), 5.0);
        // The free-for-all can do no better: chunk 3's second layer waits for the chain
        // of four first layers.
        assert_eq!(simulate(&equal, 4, &[Either; 2]), 5.0);
        // A fast native executor takes most tasks of the free-for-all.
        let uneven = [[1.0, 3.0]; 4];
        let either = simulate(&uneven, 4, &[Either; 4]);
        assert!(
            (16.0 / (1.0 + 1.0 / 3.0)..16.0).contains(&either),
            "{either}"
        );
    }

    #[test]
    fn the_plan_keeps_layers_off_the_executor_that_runs_them_badly() {
        // The device runs layers 2 and 5 at a tenth of its speed: both stay native.
        let mut costs = vec![[2.0, 1.0]; 8];
        costs[2][1] = 10.0;
        costs[5][1] = 10.0;
        let plan = plan_layers(&costs, 4).unwrap();
        assert_eq!(plan.assignment[2], Native, "{plan:?}");
        assert_eq!(plan.assignment[5], Native, "{plan:?}");
        assert!(plan.predicted < plan.predicted_either, "{plan:?}");
        assert_eq!(
            plan.predicted,
            simulate(&costs, 4, &plan.assignment),
            "the prediction is the plan's own schedule"
        );
        // Uniform layers: the free-for-all is as good as any fixed assignment.
        let uniform = plan_layers(&[[1.0, 1.0]; 8], 4).unwrap();
        assert!(uniform.predicted <= uniform.predicted_either);
    }

    #[test]
    fn bad_costs_are_refused() {
        for costs in [vec![[1.0, 0.0]], vec![[f64::NAN, 1.0]], vec![]] {
            let err = plan_layers(&costs, 4).unwrap_err().to_string();
            assert!(err.contains("split"), "{err}");
        }
        assert!(plan_layers(&[[1.0, 1.0]], 0).is_err());
    }

    #[test]
    fn a_plan_names_its_layers_as_ranges() {
        let plan = SplitPlan {
            assignment: vec![Native, Native, Device, Native, Either, Either],
            predicted: 1.0,
            predicted_either: 1.0,
        };
        assert_eq!(
            plan.describe("cpu", "ov:CPU"),
            "cpu 0-1,3 · ov:CPU 2 · either 4-5"
        );
    }
}
