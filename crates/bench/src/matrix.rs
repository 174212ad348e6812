//! The benchmark matrix: its configuration (TOML), its cells, the interleaved order they
//! run in, and the samples file that lets an interrupted run resume.

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::results::{CellKey, Stat};

#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    #[error("matrix config: {0}")]
    Config(String),
    #[error("samples file {path}: {reason}")]
    Samples { path: String, reason: String },
}

/// `pyramid bench matrix --config FILE.toml`:
///
/// ```toml
/// models = ["smollm2-135m", "qwen2.5-coder-0.5b"]
/// precisions = ["f32", "int8"]
/// windows = [1024, 2048, 4096, 8192]
/// routes = ["cpu", "ov:CPU", "cpu->ov:CPU"]   # prefill->decode
/// batches = [1]
/// n_prompt = 512
/// n_gen = 32
/// repetitions = 3
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixConfig {
    pub models: Vec<String>,
    pub precisions: Vec<String>,
    pub windows: Vec<usize>,
    pub routes: Vec<String>,
    #[serde(default = "one")]
    pub batches: Vec<usize>,
    pub n_prompt: usize,
    pub n_gen: usize,
    #[serde(default = "three")]
    pub repetitions: usize,
    #[serde(default = "f32_kv")]
    pub kv: String,
    /// Untimed runs of each cell before its first timed one.
    #[serde(default = "one_usize")]
    pub warmup: usize,
}

fn one() -> Vec<usize> {
    vec![1]
}
fn one_usize() -> usize {
    1
}
fn three() -> usize {
    3
}
fn f32_kv() -> String {
    "f32".to_string()
}

/// `ov:GPU->ov:NPU` → (`ov:GPU`, `ov:NPU`); `cpu` → (`cpu`, `cpu`).
pub fn split_route(route: &str) -> (String, String) {
    match route.split_once("->") {
        Some((p, d)) => (p.trim().to_string(), d.trim().to_string()),
        None => (route.trim().to_string(), route.trim().to_string()),
    }
}

impl MatrixConfig {
    pub fn parse(text: &str) -> Result<Self, MatrixError> {
        let config: Self = toml::from_str(text).map_err(|e| MatrixError::Config(e.to_string()))?;
        for (what, empty) in [
            ("models", config.models.is_empty()),
            ("precisions", config.precisions.is_empty()),
            ("windows", config.windows.is_empty()),
            ("routes", config.routes.is_empty()),
            ("batches", config.batches.is_empty()),
        ] {
            if empty {
                return Err(MatrixError::Config(format!("'{what}' is empty")));
            }
        }
        if config.repetitions == 0 || config.n_gen == 0 || config.n_prompt == 0 {
            return Err(MatrixError::Config(
                "repetitions, n_prompt and n_gen must be at least 1".to_string(),
            ));
        }
        if let Some(b) = config.batches.iter().find(|&&b| b == 0) {
            return Err(MatrixError::Config(format!("batch {b} is not a batch")));
        }
        Ok(config)
    }

    /// Every cell whose prompt and generated tokens fit its window.
    pub fn cells(&self) -> Vec<CellKey> {
        let mut cells = Vec::new();
        for model in &self.models {
            for precision in &self.precisions {
                for &window in &self.windows {
                    for route in &self.routes {
                        for &batch in &self.batches {
                            if self.n_prompt + self.n_gen > window {
                                continue;
                            }
                            let (prefill_device, decode_device) = split_route(route);
                            cells.push(CellKey {
                                model: model.clone(),
                                precision: precision.clone(),
                                kv: self.kv.clone(),
                                window,
                                prefill_device,
                                decode_device,
                                batch,
                                n_prompt: self.n_prompt,
                                n_gen: self.n_gen,
                            });
                        }
                    }
                }
            }
        }
        cells
    }

    /// (cell, repetition) in run order: repetition by repetition, each pass starting one
    /// cell further on, so slow drift of the machine (heat, other load) spreads over
    /// every cell instead of favouring those that ran first.
    pub fn schedule(&self) -> Vec<(usize, usize)> {
        let n = self.cells().len();
        (0..self.repetitions)
            .flat_map(|rep| (0..n).map(move |i| ((i + rep) % n.max(1), rep)))
            .collect()
    }
}

/// One timed run of one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub key: CellKey,
    pub repetition: usize,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub e2e_ms: f64,
    pub compile_ms: f64,
    pub peak_rss_bytes: Option<u64>,
    pub energy: crate::energy::EnergyReport,
    pub prefill_executed: String,
    pub decode_executed: String,
    pub qualified: Option<bool>,
    #[serde(default)]
    pub agreement: Option<crate::results::Agreement>,
}

/// Samples already measured, read from a JSON-lines file (a run appends one line per
/// sample, so an interruption loses at most the sample in flight; a torn last line is
/// ignored).
pub fn read_samples(path: &Path) -> Result<Vec<Sample>, MatrixError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(MatrixError::Samples {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
        }
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut samples = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(s) => samples.push(s),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {}
            Err(e) => {
                return Err(MatrixError::Samples {
                    path: path.display().to_string(),
                    reason: format!("line {}: {e}", i + 1),
                })
            }
        }
    }
    Ok(samples)
}

/// The schedule without what `done` already holds.
pub fn remaining(config: &MatrixConfig, done: &[Sample]) -> Vec<(usize, usize)> {
    let cells = config.cells();
    let have: HashSet<(&CellKey, usize)> = done.iter().map(|s| (&s.key, s.repetition)).collect();
    config
        .schedule()
        .into_iter()
        .filter(|&(c, rep)| !have.contains(&(&cells[c], rep)))
        .collect()
}

/// Mean ± sd of one figure over a cell's samples.
pub fn stat(samples: &[&Sample], figure: impl Fn(&Sample) -> f64) -> Stat {
    Stat::of(&samples.iter().map(|s| figure(s)).collect::<Vec<_>>())
}
