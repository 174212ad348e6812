//! A profile's tables (one per level, with device ratios), its chart and its results file.
//!
//! Ratios are A ÷ B of seconds per call, A the first device asked for: below 1 favours A.
//! Cells whose arithmetic did not match the reference are listed apart, with the reason,
//! and never enter a figure or a ratio.

use std::collections::BTreeSet;
use std::fmt::Write;

use pyramid_bench::report::escape;
use pyramid_bench::results::Provenance;
use serde::{Deserialize, Serialize};

use crate::profile::{AffinityCell, Level, Plan, Stage};

/// What `pyramid affinity` writes: the valid cells and, apart, the invalid ones.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AffinityReport {
    pub provenance: Provenance,
    pub model: String,
    /// Decoder blocks in the model: what block and operator figures are scaled by.
    pub n_layer: usize,
    pub plan: Plan,
    /// `device precision` in the order asked for: ratios divide by the others the first.
    pub targets: Vec<(String, String)>,
    pub cells: Vec<AffinityCell>,
    /// Measured, but not the reference's arithmetic: never a figure.
    pub invalid: Vec<AffinityCell>,
}

impl AffinityReport {
    pub fn new(
        provenance: Provenance,
        model: String,
        n_layer: usize,
        plan: Plan,
        targets: Vec<(String, String)>,
        cells: Vec<AffinityCell>,
    ) -> Self {
        let (cells, invalid) = cells.into_iter().partition(AffinityCell::is_valid);
        Self {
            provenance,
            model,
            n_layer,
            plan,
            targets,
            cells,
            invalid,
        }
    }

    pub(crate) fn find(
        &self,
        level: Level,
        stage: Stage,
        unit: &str,
        target: &(String, String),
    ) -> Option<&AffinityCell> {
        self.cells.iter().find(|c| {
            c.level == level
                && c.stage == stage
                && c.unit == unit
                && (&c.device, &c.precision) == (&target.0, &target.1)
        })
    }

    /// (stage, unit) rows of a level, in measured order.
    fn rows(&self, level: Level) -> Vec<(Stage, String)> {
        let mut seen = BTreeSet::new();
        self.cells
            .iter()
            .chain(&self.invalid)
            .filter(|c| c.level == level)
            .filter(|c| seen.insert((c.stage, c.unit.clone())))
            .map(|c| (c.stage, c.unit.clone()))
            .collect()
    }

    /// The ratio pairs: per precision, the first device asked for over each other one.
    fn ratio_pairs(&self) -> Vec<((String, String), (String, String))> {
        let mut pairs = Vec::new();
        for a in &self.targets {
            for b in &self.targets {
                let first = self.targets.iter().find(|t| t.1 == a.1);
                if first == Some(a) && b.1 == a.1 && b != a {
                    pairs.push((a.clone(), b.clone()));
                }
            }
        }
        pairs
    }

    /// A ÷ B for one row, when both cells are valid and positive.
    fn ratio(
        &self,
        level: Level,
        stage: Stage,
        unit: &str,
        a: &(String, String),
        b: &(String, String),
    ) -> Option<f64> {
        let (a, b) = (
            self.find(level, stage, unit, a)?,
            self.find(level, stage, unit, b)?,
        );
        (a.seconds > 0.0 && b.seconds > 0.0).then(|| a.seconds / b.seconds)
    }

    /// One Markdown table per level, then the invalid cells.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let pairs = self.ratio_pairs();
        for level in Level::ALL {
            let rows = self.rows(level);
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(out, "#### {}\n", level.title());
            let mut header = String::from("| stage | unit |");
            let mut rule = String::from("|---|---|");
            for (device, precision) in &self.targets {
                let _ = write!(header, " {device} {precision} ms |");
                rule.push_str("---:|");
            }
            for (a, b) in &pairs {
                let _ = write!(header, " {} ÷ {} ({}) |", a.0, b.0, a.1);
                rule.push_str("---:|");
            }
            let _ = writeln!(out, "{header}\n{rule}");
            for (stage, unit) in rows {
                let _ = write!(out, "| {} | {unit} |", stage.name());
                for target in &self.targets {
                    match self.find(level, stage, &unit, target) {
                        Some(c) => {
                            let _ = write!(
                                out,
                                " {:.3} ({:.0} %) |",
                                c.seconds * 1e3,
                                c.spread * 100.0
                            );
                        }
                        None => out.push_str(" invalid |"),
                    }
                }
                for (a, b) in &pairs {
                    match self.ratio(level, stage, &unit, a, b) {
                        Some(r) => {
                            let _ = write!(out, " {r:.2} |");
                        }
                        None => out.push_str(" – |"),
                    }
                }
                out.push('\n');
            }
            out.push('\n');
        }
        out.push_str("ms per call by a reps-slope fit (in brackets: the trials' spread, (max − min) ÷ median).\n");
        self.predictions_table(&mut out);
        if !self.invalid.is_empty() {
            out.push_str("\nInvalid cells (kept out of every figure):\n\n");
            for c in &self.invalid {
                let _ = writeln!(
                    out,
                    "- {} {} / {} / {} {}: {}",
                    c.level.title(),
                    c.unit,
                    c.stage.name(),
                    c.device,
                    c.precision,
                    c.problem.as_deref().unwrap_or("")
                );
            }
        }
        out
    }

    /// Each level's prediction of the end-to-end run beside the measured one.
    fn predictions_table(&self, out: &mut String) {
        let predictions = self.predictions();
        if predictions.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n#### whole model predicted from each level (prompt {} + {} tokens)\n",
            self.plan.seq, self.plan.n_gen
        );
        out.push_str("| level | device | precision | prefill ms | decode ms/step | predicted ms | measured ms | predicted ÷ measured |\n|---|---|---|---:|---:|---:|---:|---:|\n");
        for p in &predictions {
            let measured = p
                .measured
                .map_or("–".to_string(), |m| format!("{:.1}", m * 1e3));
            let ratio = p.ratio().map_or("–".to_string(), |r| format!("{r:.2}"));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.1} | {:.2} | {:.1} | {measured} | {ratio} |",
                p.level.title(),
                p.device,
                p.precision,
                p.prefill * 1e3,
                p.decode_step * 1e3,
                p.predicted * 1e3
            );
        }
        if let Some(level) = self.best_level() {
            let _ = writeln!(out, "\nNearest the measured runs: {}.", level.title());
        }
    }

    /// Bars of every valid ratio on a log scale around parity, grouped by level.
    pub fn chart(&self) -> String {
        let pairs = self.ratio_pairs();
        let divisors: BTreeSet<&str> = pairs.iter().map(|(_, b)| b.0.as_str()).collect();
        let mut bars = Vec::new();
        for level in Level::ALL {
            for (stage, unit) in self.rows(level) {
                for (a, b) in &pairs {
                    if let Some(r) = self.ratio(level, stage, &unit, a, b) {
                        let mut label = format!(
                            "{} · {} {} · {}",
                            level_short(level),
                            stage.name(),
                            unit,
                            a.1
                        );
                        if divisors.len() > 1 {
                            label.push_str(&format!(" · ÷ {}", b.0));
                        }
                        bars.push((label, r, level));
                    }
                }
            }
        }
        let (w, left, right, top, row_h) = (760.0, 330.0, 60.0, 56.0, 18.0);
        let h = top + bars.len().max(1) as f64 * row_h + 50.0;
        let span = bars
            .iter()
            .map(|(_, r, _)| r.log2().abs())
            .fold(1.0, f64::max)
            * 1.1;
        let mid = left + (w - left - right) / 2.0;
        let x = |r: f64| mid + r.log2() / span * (w - left - right) / 2.0;
        let title = match (pairs.first(), divisors.len()) {
            (None, _) => "one device: no ratios".to_string(),
            (Some((a, b)), 1) => format!(
                "seconds on {0} ÷ seconds on {1} (log scale; left of 1 favours {0})",
                a.0, b.0
            ),
            (Some((a, _)), _) => format!(
                "seconds on {0} ÷ seconds on the device named (log scale; left of 1 favours {0})",
                a.0
            ),
        };
        let mut svg = format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11"><text x="10" y="20" font-size="13">{} — {}</text>"#,
            escape(&self.model),
            escape(&title)
        );
        let colors = ["#1f77b4", "#9467bd", "#2ca02c", "#ff7f0e", "#d62728"];
        for (i, (label, r, level)) in bars.iter().enumerate() {
            let y = top + i as f64 * row_h;
            let color = colors[Level::ALL.iter().position(|l| l == level).unwrap_or(0)];
            let (x0, x1) = (x(1.0).min(x(*r)), x(1.0).max(x(*r)));
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"/><text x="{:.1}" y="{:.1}">{r:.2}</text>"#,
                left - 6.0,
                y + row_h * 0.75,
                escape(label),
                y + 2.0,
                (x1 - x0).max(1.0),
                row_h - 4.0,
                x1 + 4.0,
                y + row_h * 0.75
            );
        }
        let bottom = top + bars.len().max(1) as f64 * row_h;
        let _ = write!(
            svg,
            r#"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{bottom}" stroke="black" stroke-dasharray="4 3"/><text x="{0:.1}" y="{2}" text-anchor="middle">1 (parity)</text>"#,
            x(1.0),
            top - 4.0,
            bottom + 16.0
        );
        svg.push_str("</svg>\n");
        svg
    }
}

fn level_short(level: Level) -> &'static str {
    match level {
        Level::Operator => "in block",
        Level::Isolated => "alone",
        Level::Block => "block",
        Level::Stage => "stage",
        Level::Model => "model",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::FitPlan;
    use pyramid_bench::results::Machine;

    fn report(devices: &[&str]) -> AffinityReport {
        let cells = devices
            .iter()
            .enumerate()
            .map(|(i, d)| AffinityCell {
                level: Level::Block,
                unit: "block".into(),
                stage: Stage::Prefill,
                device: d.to_string(),
                precision: "f32".into(),
                executed_on: d.to_string(),
                seconds: 1.0 + i as f64,
                spread: 0.0,
                agreement: None,
                tokens_matching: None,
                problem: None,
            })
            .collect();
        let plan = Plan {
            seq: 8,
            window: 16,
            n_gen: 2,
            layer: 0,
            stages: vec![Stage::Prefill],
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
        let targets = devices
            .iter()
            .map(|d| (d.to_string(), "f32".to_string()))
            .collect();
        AffinityReport::new(provenance, "m".into(), 2, plan, targets, cells)
    }

    #[test]
    fn every_other_device_gets_its_ratio_named() {
        let r = report(&["a", "b", "c"]);
        let md = r.markdown();
        assert!(
            md.contains("a ÷ b (f32)") && md.contains("a ÷ c (f32)"),
            "{md}"
        );
        assert!(
            md.contains(
                "| prefill | block | 1000.000 (0 %) | 2000.000 (0 %) | 3000.000 (0 %) | 0.50 | 0.33 |"
            ),
            "{md}"
        );
        let svg = r.chart();
        assert!(svg.contains("÷ b") && svg.contains("÷ c") && svg.contains("the device named"));
        let two = report(&["a", "b"]).chart();
        assert!(two.contains("seconds on a ÷ seconds on b") && !two.contains("· ÷ b"));
        assert!(report(&["a"]).chart().contains("one device: no ratios"));
    }
}
