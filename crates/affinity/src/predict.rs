//! What each level predicts of the whole model, and a route chosen from a profile.
//!
//! A level predicts a generation of `seq` prompt tokens and `n_gen` greedy tokens as
//! its prefill figure plus `n_gen` times its decode figure, scaled to the model: a stage
//! figure is the stage itself, a block's runs `n_layer` times, operators' sums (attention
//! and FFN in their block; the seven projections and the attention core alone) run
//! `n_layer` times. Set beside the measured end-to-end run, the ratios show which
//! granularity can be trusted to place work: the coarser levels see the embedding, the
//! output head and the calls between layers that the finer ones miss.

use serde::{Deserialize, Serialize};

use crate::profile::{Level, Stage};
use crate::report::AffinityReport;

/// One level's prediction of one target's end-to-end time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub level: Level,
    pub device: String,
    pub precision: String,
    /// Seconds for the prompt's prefill and for one decode step.
    pub prefill: f64,
    pub decode_step: f64,
    /// `prefill + n_gen · decode_step`.
    pub predicted: f64,
    /// The end-to-end run, where it was measured and valid.
    pub measured: Option<f64>,
}

impl Prediction {
    /// Predicted ÷ measured.
    pub fn ratio(&self) -> Option<f64> {
        self.measured.map(|m| self.predicted / m)
    }
}

const OPERATOR_UNITS: [&str; 2] = ["attention", "ffn"];
const ISOLATED_UNITS: [&str; 8] = [
    "wq",
    "wk",
    "wv",
    "wo",
    "gate",
    "up",
    "down",
    "attention core",
];

impl AffinityReport {
    /// Seconds `level` gives one stage of `target`'s whole model, when every cell it
    /// needs is valid and the sum is positive (an ablation difference within the noise
    /// can be negative; it predicts nothing).
    fn stage_seconds(&self, level: Level, stage: Stage, target: &(String, String)) -> Option<f64> {
        self.level_sum(level, stage, target).filter(|&s| s > 0.0)
    }

    fn level_sum(&self, level: Level, stage: Stage, target: &(String, String)) -> Option<f64> {
        let sum = |units: &[&str]| -> Option<f64> {
            units
                .iter()
                .map(|u| self.find(level, stage, u, target).map(|c| c.seconds))
                .sum()
        };
        let layers = self.n_layer as f64;
        match level {
            Level::Stage => sum(&["stage"]),
            Level::Block => sum(&["block"]).map(|s| s * layers),
            Level::Operator => sum(&OPERATOR_UNITS).map(|s| s * layers),
            Level::Isolated => sum(&ISOLATED_UNITS).map(|s| s * layers),
            Level::Model => None,
        }
    }

    /// Every level's prediction for every target.
    pub fn predictions(&self) -> Vec<Prediction> {
        let n_gen = self.plan.n_gen as f64;
        let mut out = Vec::new();
        for target in &self.targets {
            let measured = self
                .cells
                .iter()
                .find(|c| {
                    c.level == Level::Model && (&c.device, &c.precision) == (&target.0, &target.1)
                })
                .map(|c| c.seconds);
            for level in [Level::Isolated, Level::Operator, Level::Block, Level::Stage] {
                let (Some(prefill), Some(decode_step)) = (
                    self.stage_seconds(level, Stage::Prefill, target),
                    self.stage_seconds(level, Stage::Decode, target),
                ) else {
                    continue;
                };
                out.push(Prediction {
                    level,
                    device: target.0.clone(),
                    precision: target.1.clone(),
                    prefill,
                    decode_step,
                    predicted: prefill + n_gen * decode_step,
                    measured,
                });
            }
        }
        out
    }

    /// The level whose predictions are nearest the measured runs (mean |log ratio|).
    pub fn best_level(&self) -> Option<Level> {
        let predictions = self.predictions();
        [Level::Isolated, Level::Operator, Level::Block, Level::Stage]
            .into_iter()
            .filter_map(|level| {
                let errors: Vec<f64> = predictions
                    .iter()
                    .filter(|p| p.level == level)
                    .filter_map(|p| p.ratio())
                    .map(|r| r.ln().abs())
                    .collect();
                (!errors.is_empty())
                    .then(|| (level, errors.iter().sum::<f64>() / errors.len() as f64))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(level, _)| level)
    }

    /// The route for `precision` with the least predicted time for `prompt` tokens of
    /// prefill and `n_gen` of decode, from the level that predicts best (the stage level
    /// when nothing was measured end to end): prefill and decode may land on different
    /// devices.
    pub fn place(&self, precision: &str, prompt: usize, n_gen: usize) -> Option<Placement> {
        let level = self.best_level().unwrap_or(Level::Stage);
        let targets: Vec<&(String, String)> =
            self.targets.iter().filter(|t| t.1 == precision).collect();
        let best = |stage: Stage| {
            targets
                .iter()
                .filter_map(|t| Some((t.0.clone(), self.per_token(level, stage, t)?)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
        };
        let (prefill, prefill_per_token) = best(Stage::Prefill)?;
        let (decode, decode_step) = best(Stage::Decode)?;
        let on = |device: &str| (device.to_string(), precision.to_string());
        let by_level = [Level::Isolated, Level::Operator, Level::Block, Level::Stage]
            .into_iter()
            .map(|level| LevelFigures {
                level,
                prefill_per_token: self.per_token(level, Stage::Prefill, &on(&prefill)),
                decode_step: self.per_token(level, Stage::Decode, &on(&decode)),
            })
            .collect();
        Some(Placement {
            level,
            prefill_per_token,
            decode_step,
            predicted: prefill_per_token * prompt as f64 + decode_step * n_gen as f64,
            prefill,
            decode,
            by_level,
        })
    }

    /// Each layer's seconds per prompt row on `[cpu, device]` at `precision`, for placing a
    /// split prefill's layers ([`crate::split`]): the block level's prefill figures, per
    /// row of the profile's chunk. One measured block stands for every layer. The figures
    /// predict a split best when profiled with the split's own threads (`-t 1` and
    /// `INFERENCE_NUM_THREADS=1` on two cores). Without a valid figure for both, says
    /// what is missing: not profiled, or the cell's problem.
    pub fn split_costs(&self, precision: &str, device: &str) -> Result<Vec<[f64; 2]>, String> {
        let per_row = |d: &str| {
            let target = (d.to_string(), precision.to_string());
            if let Some(c) = self.find(Level::Block, Stage::Prefill, "block", &target) {
                let seconds = c.seconds / self.plan.seq as f64;
                return (seconds > 0.0)
                    .then_some(seconds)
                    .ok_or_else(|| format!("{d}'s block took no time"));
            }
            let problem = self.invalid.iter().find_map(|c| {
                let same =
                    c.level == Level::Block && c.stage == Stage::Prefill && c.unit == "block";
                (same && (&c.device, &c.precision) == (&target.0, &target.1))
                    .then_some(c.problem.as_deref())
                    .flatten()
            });
            Err(match problem {
                Some(problem) => format!("{d}'s block is invalid: {problem}"),
                None => format!("{d}'s block was not profiled"),
            })
        };
        Ok(vec![[per_row("cpu")?, per_row(device)?]; self.n_layer])
    }

    /// Seconds per prompt token (prefill) or per step (decode) by `level`.
    fn per_token(&self, level: Level, stage: Stage, target: &(String, String)) -> Option<f64> {
        let s = self.stage_seconds(level, stage, target)?;
        Some(match stage {
            Stage::Prefill => s / self.plan.seq as f64,
            _ => s,
        })
    }
}

/// A route chosen from a profile, with what it is predicted to cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    /// The level the prediction comes from.
    pub level: Level,
    pub prefill: String,
    pub decode: String,
    /// Predicted seconds per prompt token, and per decode step.
    pub prefill_per_token: f64,
    pub decode_step: f64,
    /// Seconds for the prompt and generation it was asked about.
    pub predicted: f64,
    /// What every level predicts for the chosen devices, to set beside a measured run.
    pub by_level: Vec<LevelFigures>,
}

/// One level's figures for a placement's devices, where its cells were valid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelFigures {
    pub level: Level,
    pub prefill_per_token: Option<f64>,
    pub decode_step: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{AffinityCell, Plan};
    use crate::timing::FitPlan;
    use pyramid_bench::results::{Machine, Provenance};

    fn cell(level: Level, unit: &str, stage: Stage, device: &str, seconds: f64) -> AffinityCell {
        AffinityCell {
            level,
            unit: unit.into(),
            stage,
            device: device.into(),
            precision: "int8".into(),
            executed_on: device.into(),
            seconds,
            spread: 0.0,
            agreement: None,
            tokens_matching: None,
            problem: None,
        }
    }

    /// Device "a" prefills faster, "b" decodes faster; blocks miss a fixed 1 s per run.
    fn report() -> AffinityReport {
        let mut cells = Vec::new();
        for (device, prefill_block, decode_block) in [("a", 1.0, 0.5), ("b", 3.0, 0.25)] {
            let layers = 4.0;
            cells.push(cell(
                Level::Block,
                "block",
                Stage::Prefill,
                device,
                prefill_block,
            ));
            cells.push(cell(
                Level::Block,
                "block",
                Stage::Decode,
                device,
                decode_block,
            ));
            let (prefill, step) = (prefill_block * layers + 1.0, decode_block * layers);
            cells.push(cell(Level::Stage, "stage", Stage::Prefill, device, prefill));
            cells.push(cell(Level::Stage, "stage", Stage::Decode, device, step));
            let end_to_end = prefill + 10.0 * step;
            cells.push(cell(
                Level::Model,
                "e2e",
                Stage::EndToEnd,
                device,
                end_to_end,
            ));
        }
        // Operators in their block on "a": a decode difference within the noise.
        for (unit, prefill, decode) in [("attention", 0.5, -0.1), ("ffn", 0.5, 0.05)] {
            cells.push(cell(Level::Operator, unit, Stage::Prefill, "a", prefill));
            cells.push(cell(Level::Operator, unit, Stage::Decode, "a", decode));
        }
        let plan = Plan {
            seq: 100,
            window: 256,
            n_gen: 10,
            layer: 0,
            stages: vec![Stage::Prefill, Stage::Decode],
            fit: FitPlan {
                k: 1,
                trials: 1,
                min_batch: 0.0,
            },
        };
        let provenance = Provenance {
            machine: Machine::detect("test"),
            commit: "test".into(),
            command: "test".into(),
            date: "2026-12-03T00:00:00Z".into(),
        };
        let targets = vec![("a".into(), "int8".into()), ("b".into(), "int8".into())];
        AffinityReport::new(provenance, "m".into(), 4, plan, targets, cells)
    }

    #[test]
    fn levels_predict_the_whole_model_and_the_nearest_is_chosen() {
        let r = report();
        let p = r.predictions();
        let block_a = p
            .iter()
            .find(|p| p.level == Level::Block && p.device == "a")
            .unwrap();
        assert_eq!(block_a.predicted, 4.0 + 10.0 * 2.0);
        assert_eq!(block_a.measured, Some(5.0 + 20.0));
        let stage_a = p
            .iter()
            .find(|p| p.level == Level::Stage && p.device == "a")
            .unwrap();
        assert_eq!(stage_a.ratio(), Some(1.0));
        // Operators: not measured on "b", and a negative decode sum on "a" predicts
        // nothing.
        assert!(p.iter().all(|p| p.level != Level::Operator));
        assert_eq!(r.best_level(), Some(Level::Stage));
    }

    #[test]
    fn placement_splits_the_route_where_each_stage_is_cheaper() {
        let r = report();
        let placed = r.place("int8", 200, 50).unwrap();
        assert_eq!(
            (placed.prefill.as_str(), placed.decode.as_str()),
            ("a", "b")
        );
        assert_eq!(placed.level, Level::Stage);
        assert_eq!(placed.prefill_per_token, 5.0 / 100.0);
        assert_eq!(placed.decode_step, 1.0);
        assert_eq!(placed.predicted, 200.0 * 0.05 + 50.0);
        // Every level's figures for the chosen devices: blocks scale by the 4 layers.
        let block = placed
            .by_level
            .iter()
            .find(|f| f.level == Level::Block)
            .unwrap();
        assert_eq!(block.prefill_per_token, Some(4.0 / 100.0));
        assert_eq!(block.decode_step, Some(1.0));
        let isolated = placed.by_level.iter().find(|f| f.level == Level::Isolated);
        assert_eq!(isolated.unwrap().prefill_per_token, None, "not measured");
        assert!(
            r.place("f32", 1, 1).is_none(),
            "no f32 targets were profiled"
        );
    }

    #[test]
    fn split_costs_are_each_blocks_seconds_per_row_on_both_executors() {
        let mut r = report();
        assert_eq!(
            r.split_costs("int8", "b"),
            Err("cpu's block was not profiled".to_string())
        );
        for c in &mut r.cells {
            if c.device == "a" {
                c.device = "cpu".into();
            }
        }
        assert_eq!(
            r.split_costs("int8", "b"),
            Ok(vec![[1.0 / 100.0, 3.0 / 100.0]; 4])
        );
        assert!(r.split_costs("f32", "b").is_err());
        let block = r.cells.iter().position(|c| {
            (c.device.as_str(), c.level, c.stage) == ("b", Level::Block, Stage::Prefill)
        });
        let mut invalid = r.cells.remove(block.unwrap());
        invalid.problem = Some("logits differ".into());
        r.invalid.push(invalid);
        assert_eq!(
            r.split_costs("int8", "b"),
            Err("b's block is invalid: logits differ".to_string())
        );
    }
}
