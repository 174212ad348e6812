//! The series' building blocks: histograms, and the priority labels that bound how many
//! series per-priority figures make.

use std::fmt::Write;

/// Latency buckets in seconds: from a fast decode step to a long prefill.
pub(super) const SECONDS_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0,
];
pub(super) const BATCH_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

#[derive(Debug)]
pub(super) struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub(super) fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub(super) fn observe(&mut self, v: f64) {
        for (c, &b) in self.counts.iter_mut().zip(self.bounds) {
            if v <= b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    pub(super) fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, "");
    }

    /// The samples alone, each with `labels` (`key="value",` pairs) before `le`.
    pub(super) fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        for (c, b) in self.counts.iter().zip(self.bounds) {
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {}", self.count);
        let labels = match labels.trim_end_matches(',') {
            "" => String::new(),
            l => format!("{{{l}}}"),
        };
        let _ = writeln!(
            out,
            "{name}_sum{labels} {}\n{name}_count{labels} {}",
            self.sum, self.count
        );
    }
}

/// The priorities that get a label of their own in `/metrics`; every other priority a
/// client chooses is counted under `other`, so that clients cannot grow the series
/// without bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityLabels(Vec<i32>);

impl PriorityLabels {
    /// The default priority (0) and `priorities` (the API keys' configured ones).
    pub fn new(priorities: impl IntoIterator<Item = i32>) -> Self {
        let mut labelled: Vec<i32> = std::iter::once(0).chain(priorities).collect();
        labelled.sort_unstable();
        labelled.dedup();
        Self(labelled)
    }

    pub(super) fn label(&self, priority: i32) -> Label {
        if self.0.binary_search(&priority).is_ok() {
            Label::Priority(priority)
        } else {
            Label::Other
        }
    }
}

impl Default for PriorityLabels {
    fn default() -> Self {
        Self::new([])
    }
}

/// A priority series' label: a labelled priority, or every other one (sorted last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Label {
    Priority(i32),
    Other,
}

impl std::fmt::Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Label::Priority(p) => write!(f, "{p}"),
            Label::Other => f.write_str("other"),
        }
    }
}

/// One histogram per priority label.
#[derive(Debug, Default)]
pub(super) struct ByPriority(Vec<(Label, Histogram)>);

impl ByPriority {
    pub(super) fn observe(&mut self, label: Label, v: f64) {
        let i = match self.0.binary_search_by_key(&label, |(l, _)| *l) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (label, Histogram::new(&SECONDS_BUCKETS)));
                i
            }
        };
        self.0[i].1.observe(v);
    }

    /// Every label seen, or priority 0 empty before any request.
    pub(super) fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        if self.0.is_empty() {
            Histogram::new(&SECONDS_BUCKETS).render_series(out, name, "priority=\"0\",");
        }
        for (label, h) in &self.0 {
            h.render_series(out, name, &format!("priority=\"{label}\","));
        }
    }
}
