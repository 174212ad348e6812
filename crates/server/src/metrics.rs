//! Counters, gauges and histograms, rendered in Prometheus' text format for `/metrics`.
//! Written out by hand: a dozen series do not justify a metrics framework.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pyramid_engine::{EngineStats, RouteAudit, Usage, WindowPyramid};

/// Latency buckets in seconds: from a fast decode step to a long prefill.
const SECONDS_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0,
];
const BATCH_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        for (c, &b) in self.counts.iter_mut().zip(self.bounds) {
            if v <= b {
                *c += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, "");
    }

    /// The samples alone, each with `labels` (`key="value",` pairs) before `le`.
    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
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

    fn label(&self, priority: i32) -> Label {
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
enum Label {
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
struct ByPriority(Vec<(Label, Histogram)>);

impl ByPriority {
    fn observe(&mut self, label: Label, v: f64) {
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
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        if self.0.is_empty() {
            Histogram::new(&SECONDS_BUCKETS).render_series(out, name, "priority=\"0\",");
        }
        for (label, h) in &self.0 {
            h.render_series(out, name, &format!("priority=\"{label}\","));
        }
    }
}

#[derive(Debug)]
pub struct Metrics {
    /// Responses by status code.
    requests: Mutex<Vec<(u16, u64)>>,
    pub prompt_tokens: AtomicU64,
    pub cached_prompt_tokens: AtomicU64,
    pub prefilled_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    pub queue_depth: AtomicU64,
    /// The engine's state after its latest step.
    engine: Mutex<Option<EngineStats>>,
    /// The artifact side, read live: compiles finish while the engine waits for work.
    pyramid: OnceLock<Arc<WindowPyramid>>,
    /// The devices asked for: (prefill, decode).
    route: Mutex<(String, String)>,
    /// Which priorities the latency and queue series label on their own.
    labels: PriorityLabels,
    ttft: Mutex<ByPriority>,
    inter_token: Mutex<ByPriority>,
    batch: Mutex<Histogram>,
    migration_seconds: Mutex<Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(PriorityLabels::default())
    }
}

impl Metrics {
    /// Metrics whose per-priority series label `labels` and count the rest as `other`.
    pub fn new(labels: PriorityLabels) -> Self {
        Self {
            requests: Mutex::default(),
            prompt_tokens: AtomicU64::default(),
            cached_prompt_tokens: AtomicU64::default(),
            prefilled_tokens: AtomicU64::default(),
            generated_tokens: AtomicU64::default(),
            cancelled: AtomicU64::default(),
            queue_depth: AtomicU64::default(),
            engine: Mutex::default(),
            pyramid: OnceLock::new(),
            route: Mutex::new(("cpu".to_string(), "cpu".to_string())),
            labels,
            ttft: Mutex::default(),
            inter_token: Mutex::default(),
            batch: Mutex::new(Histogram::new(&BATCH_BUCKETS)),
            migration_seconds: Mutex::new(Histogram::new(&SECONDS_BUCKETS)),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Metrics {
    pub fn record_request(&self, status: u16) {
        let mut requests = lock(&self.requests);
        match requests.iter_mut().find(|(s, _)| *s == status) {
            Some((_, n)) => *n += 1,
            None => requests.push((status, 1)),
        }
    }

    pub fn record_finished(&self, usage: &Usage) {
        self.prompt_tokens
            .fetch_add(usage.prompt_tokens as u64, Ordering::Relaxed);
        self.cached_prompt_tokens
            .fetch_add(usage.cached_tokens as u64, Ordering::Relaxed);
    }

    pub fn record_migration(&self, took: Duration) {
        lock(&self.migration_seconds).observe(took.as_secs_f64());
    }

    /// The devices the route asked for, for the audit series.
    pub fn set_route(&self, prefill: &str, decode: &str) {
        *lock(&self.route) = (prefill.to_string(), decode.to_string());
    }

    /// The engine's state after a step.
    pub fn publish_engine(&self, stats: EngineStats) {
        *lock(&self.engine) = Some(stats);
    }

    /// Where compiles, stalls, migrations and resident artifacts are read from.
    pub fn watch_pyramid(&self, pyramid: Arc<WindowPyramid>) {
        let _ = self.pyramid.set(pyramid);
    }

    /// The engine's latest state with the artifact side as it is now.
    fn engine_now(&self) -> Option<EngineStats> {
        let mut stats = lock(&self.engine).clone()?;
        if let Some(p) = self.pyramid.get() {
            stats.pyramid = p.stats();
            stats.artifacts = p.resident();
            stats.compiling = p.n_compiling();
        }
        Some(stats)
    }

    /// The route audit: per stage, the device asked for, the one that really ran (once
    /// an artifact of the stage exists), and whether they agree.
    pub fn route_audit(&self) -> RouteAudit {
        let (prefill, decode) = lock(&self.route).clone();
        let pyramid = self.engine_now().map(|s| s.pyramid).unwrap_or_default();
        RouteAudit::new(
            &prefill,
            &decode,
            pyramid.prefill_executed_on,
            pyramid.decode_executed_on,
        )
    }

    pub fn observe_ttft(&self, priority: i32, d: Duration) {
        lock(&self.ttft).observe(self.labels.label(priority), d.as_secs_f64());
    }

    pub fn observe_inter_token(&self, priority: i32, d: Duration) {
        let label = self.labels.label(priority);
        lock(&self.inter_token).observe(label, d.as_secs_f64());
    }

    pub fn observe_batch(&self, n: usize) {
        lock(&self.batch).observe(n as f64);
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP pyramid_requests_total HTTP responses by status.\n# TYPE pyramid_requests_total counter"
        );
        let mut requests = lock(&self.requests).clone();
        requests.sort_unstable();
        for (status, n) in requests {
            let _ = writeln!(out, "pyramid_requests_total{{status=\"{status}\"}} {n}");
        }
        let counters = [
            (
                "pyramid_prompt_tokens_total",
                "Prompt tokens of finished requests.",
                &self.prompt_tokens,
            ),
            (
                "pyramid_cached_prompt_tokens_total",
                "Prompt tokens reused from cached conversations instead of prefilled.",
                &self.cached_prompt_tokens,
            ),
            (
                "pyramid_prefilled_tokens_total",
                "Prompt tokens run through the model.",
                &self.prefilled_tokens,
            ),
            (
                "pyramid_generated_tokens_total",
                "Tokens sampled.",
                &self.generated_tokens,
            ),
            (
                "pyramid_cancelled_total",
                "Sequences cancelled because their client went away.",
                &self.cancelled,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP pyramid_queue_depth Requests waiting for a place in the batch.\n# TYPE pyramid_queue_depth gauge\npyramid_queue_depth {}",
            self.queue_depth.load(Ordering::Relaxed)
        );
        if let Some(stats) = self.engine_now() {
            render_engine(&mut out, &stats, &self.labels);
        }
        let _ = writeln!(
            out,
            "# HELP pyramid_route_info Devices per stage: asked for, and really executing (EXECUTION_DEVICES).\n# TYPE pyramid_route_info gauge"
        );
        let audit = self.route_audit();
        for (stage, s) in [("prefill", &audit.prefill), ("decode", &audit.decode)] {
            let executed = s
                .executed
                .clone()
                .unwrap_or_default()
                .replace(['"', '\\', '\n'], " ");
            let agree = s
                .as_requested
                .map_or("unknown", |a| if a { "true" } else { "false" });
            let _ = writeln!(
                out,
                "pyramid_route_info{{stage=\"{stage}\",requested=\"{}\",executed=\"{executed}\",as_requested=\"{agree}\"}} 1",
                s.requested
            );
        }
        lock(&self.ttft).render(
            &mut out,
            "pyramid_ttft_seconds",
            "Time from request to first token, by request priority.",
        );
        lock(&self.inter_token).render(
            &mut out,
            "pyramid_inter_token_seconds",
            "Time between consecutive tokens of a sequence, by request priority.",
        );
        lock(&self.batch).render(
            &mut out,
            "pyramid_batch_size",
            "Sequences decoded per step.",
        );
        lock(&self.migration_seconds).render(
            &mut out,
            "pyramid_kv_migration_seconds",
            "Time to move a KV cache into a larger window.",
        );
        out
    }
}

/// The engine's counters and gauges: the pyramid's compiles, stalls and migrations, the
/// sessions and their KV memory, and the artifacts resident by window.
fn render_engine(out: &mut String, stats: &EngineStats, labels: &PriorityLabels) {
    let p = &stats.pyramid;
    let counters: [(&str, &str, f64); 12] = [
        (
            "pyramid_artifact_compiles_total",
            "Artifacts compiled (a window's prefill or decode, a decode batch size, a mixed pass).",
            p.n_compiles as f64,
        ),
        (
            "pyramid_artifact_compile_seconds_total",
            "Time spent compiling artifacts.",
            p.compile_ms / 1e3,
        ),
        (
            "pyramid_stalls_total",
            "Window crossings that waited for their artifacts.",
            p.n_stalls as f64,
        ),
        (
            "pyramid_stall_seconds_total",
            "Time sequences waited at a crossing.",
            p.stall_ms / 1e3,
        ),
        (
            "pyramid_kv_migrations_total",
            "KV caches moved into a larger window.",
            p.n_migrations as f64,
        ),
        (
            "pyramid_kv_migration_bytes_total",
            "KV bytes migrations copied (none for caches that grow in place).",
            p.migration_bytes as f64,
        ),
        (
            "pyramid_kv_migration_live_bytes_total",
            "Live KV bytes of the sessions that migrated.",
            p.migration_live_bytes as f64,
        ),
        (
            "pyramid_kv_migration_seconds_total",
            "Time spent migrating KV caches.",
            p.migration_ms / 1e3,
        ),
        (
            "pyramid_reprefills_total",
            "Window crossings that prefilled the context again.",
            p.n_reprefills as f64,
        ),
        (
            "pyramid_session_forks_total",
            "New conversations that copied the prefix they share with a cached one.",
            p.n_forks as f64,
        ),
        (
            "pyramid_session_fork_bytes_total",
            "KV bytes copied by session forks.",
            p.fork_bytes as f64,
        ),
        (
            "pyramid_artifacts_evicted_total",
            "Artifacts dropped to stay within the artifact budget.",
            p.n_evicted as f64,
        ),
    ];
    let q = &stats.preemption;
    let preemption: [(&str, &str, usize); 4] = [
        (
            "pyramid_paused_total",
            "Sequences paused for more urgent ones.",
            q.n_paused,
        ),
        (
            "pyramid_resumed_total",
            "Paused sequences that ran again.",
            q.n_resumed,
        ),
        (
            "pyramid_swapped_out_total",
            "Paused sequences whose KV was given up for memory (written to the session store, or dropped).",
            q.n_swapped_out,
        ),
        (
            "pyramid_recomputed_tokens_total",
            "Tokens prefilled again for swapped-out sequences whose sessions were evicted meanwhile.",
            q.recomputed_tokens,
        ),
    ];
    let d = &stats.persisted;
    let persisted: [(&str, &str, f64); 5] = [
        (
            "pyramid_sessions_saved_total",
            "Conversations written to the session directory.",
            d.n_saved as f64,
        ),
        (
            "pyramid_session_saved_bytes_total",
            "Bytes written to the session directory.",
            d.saved_bytes as f64,
        ),
        (
            "pyramid_sessions_resumed_from_disk_total",
            "Conversations read back from the session directory instead of prefilled.",
            d.n_loaded as f64,
        ),
        (
            "pyramid_session_resumed_tokens_total",
            "Tokens whose KV came from the session directory.",
            d.loaded_tokens as f64,
        ),
        (
            "pyramid_session_load_failures_total",
            "Session files skipped when wanted: unreadable, corrupt or another setup's.",
            d.n_load_failed as f64,
        ),
    ];
    let sp = &stats.speculative;
    let speculative: [(&str, &str, usize); 4] = [
        (
            "pyramid_speculative_drafted_tokens_total",
            "Draft tokens looked up in sequences' own tokens and verified.",
            sp.drafted_tokens,
        ),
        (
            "pyramid_speculative_accepted_tokens_total",
            "Draft tokens the model agreed with: each one a pass saved.",
            sp.accepted_tokens,
        ),
        (
            "pyramid_decode_passes_total",
            "Passes that sampled tokens; generated tokens are these plus the accepted drafts.",
            sp.decode_passes,
        ),
        (
            "pyramid_speculative_verify_passes_total",
            "Passes that verified a draft.",
            sp.verify_passes,
        ),
    ];
    let counters = counters
        .into_iter()
        .chain(preemption.map(|(n, h, v)| (n, h, v as f64)))
        .chain(persisted)
        .chain(speculative.map(|(n, h, v)| (n, h, v as f64)));
    for (name, help, value) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    }
    let gauges = [
        (
            "pyramid_speculative_acceptance_ratio",
            "Accepted over drafted tokens since start (0 before any draft).",
            sp.acceptance_rate(),
        ),
        (
            "pyramid_tokens_per_decode_pass",
            "Generated tokens per sampling pass since start (1 without speculation).",
            sp.tokens_per_pass(),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
    let name = "pyramid_queue_depth_by_priority";
    let _ = writeln!(
        out,
        "# HELP {name} Requests queued or paused in the engine, by priority.\n# TYPE {name} gauge"
    );
    if stats.waiting_by_priority.is_empty() {
        let _ = writeln!(out, "{name}{{priority=\"0\"}} 0");
    }
    let mut by_label: Vec<(Label, usize)> = Vec::new();
    for &(p, n) in &stats.waiting_by_priority {
        let label = labels.label(p);
        match by_label.iter_mut().find(|(l, _)| *l == label) {
            Some((_, total)) => *total += n,
            None => by_label.push((label, n)),
        }
    }
    by_label.sort_unstable();
    for (label, n) in by_label {
        let _ = writeln!(out, "{name}{{priority=\"{label}\"}} {n}");
    }
    if let Some(gb_s) = p.migration_gb_per_s() {
        let name = "pyramid_kv_migration_copy_gigabytes_per_second";
        let _ = writeln!(
            out,
            "# HELP {name} Effective copy speed of migrations that copied.\n# TYPE {name} gauge\n{name} {gb_s}"
        );
    }
    let gauges: [(&str, &str, usize); 8] = [
        (
            "pyramid_stored_sessions",
            "Conversations in the session directory.",
            stats.persisted.stored_sessions,
        ),
        (
            "pyramid_running_sequences",
            "Sequences in the batch.",
            stats.running,
        ),
        (
            "pyramid_paused_sequences",
            "Sequences paused for more urgent ones.",
            stats.paused,
        ),
        (
            "pyramid_cached_sessions",
            "Finished conversations kept for reuse.",
            stats.cached_sessions,
        ),
        (
            "pyramid_kv_bytes",
            "KV cache bytes reserved by running, paused and cached conversations (their windows).",
            stats.kv_bytes_reserved,
        ),
        (
            "pyramid_kv_used_bytes",
            "KV cache bytes of live positions.",
            stats.kv_bytes_used,
        ),
        (
            "pyramid_artifacts_compiling",
            "Artifact compiles in flight.",
            stats.compiling,
        ),
        (
            "pyramid_engine_waiting",
            "Requests the engine holds but has not admitted.",
            stats.waiting,
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
    let _ = writeln!(out, "# HELP pyramid_artifacts_resident Compiled artifacts held, by window.\n# TYPE pyramid_artifacts_resident gauge");
    for &(window, count, _) in &stats.artifacts {
        let _ = writeln!(
            out,
            "pyramid_artifacts_resident{{window=\"{window}\"}} {count}"
        );
    }
    let _ = writeln!(out, "# HELP pyramid_artifact_bytes Memory held by compiled artifacts, by window.\n# TYPE pyramid_artifact_bytes gauge");
    for &(window, _, bytes) in &stats.artifacts {
        let _ = writeln!(out, "pyramid_artifact_bytes{{window=\"{window}\"}} {bytes}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_render_every_series() {
        let m = Metrics::default();
        m.observe_batch(3);
        m.observe_batch(8);
        m.record_request(200);
        m.record_request(200);
        m.record_request(429);
        let text = m.render();
        assert!(
            text.contains("pyramid_batch_size_bucket{le=\"4\"} 1"),
            "{text}"
        );
        assert!(text.contains("pyramid_batch_size_bucket{le=\"8\"} 2"));
        assert!(text.contains("pyramid_batch_size_bucket{le=\"+Inf\"} 2"));
        assert!(text.contains("pyramid_batch_size_sum 11"));
        assert!(text.contains("pyramid_requests_total{status=\"200\"} 2"));
        assert!(text.contains("pyramid_requests_total{status=\"429\"} 1"));
        // Latencies by priority: priority 0 is reported empty before any request.
        assert!(text.contains("pyramid_ttft_seconds_count{priority=\"0\"} 0"));
        let m = Metrics::new(PriorityLabels::new([-1, 4]));
        m.observe_ttft(-1, Duration::from_millis(30));
        m.observe_ttft(4, Duration::from_millis(300));
        let text = m.render();
        assert!(text.contains("pyramid_ttft_seconds_bucket{priority=\"-1\",le=\"0.05\"} 1"));
        assert!(text.contains("pyramid_ttft_seconds_bucket{priority=\"4\",le=\"0.05\"} 0"));
        assert!(text.contains("pyramid_ttft_seconds_count{priority=\"4\"} 1"));
        assert!(!text.contains("pyramid_ttft_seconds_bucket{priority=\"0\""));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "not a sample: {line}");
        }
    }

    #[test]
    fn priorities_nobody_configured_share_one_other_series() {
        let m = Metrics::new(PriorityLabels::new([10]));
        for p in 1000..3000 {
            m.observe_ttft(p, Duration::from_millis(30));
            m.observe_inter_token(-p, Duration::from_millis(3));
        }
        m.observe_ttft(10, Duration::from_millis(30));
        m.observe_ttft(0, Duration::from_millis(30));
        m.publish_engine(EngineStats {
            waiting_by_priority: vec![(-7, 2), (0, 1), (10, 4), (99, 3)],
            ..EngineStats::default()
        });
        let text = m.render();
        assert!(text.contains("pyramid_ttft_seconds_count{priority=\"other\"} 2000"));
        assert!(text.contains("pyramid_ttft_seconds_count{priority=\"10\"} 1"));
        assert!(text.contains("pyramid_ttft_seconds_count{priority=\"0\"} 1"));
        assert!(text.contains("pyramid_inter_token_seconds_count{priority=\"other\"} 2000"));
        assert!(text.contains("pyramid_queue_depth_by_priority{priority=\"other\"} 5"));
        assert!(text.contains("pyramid_queue_depth_by_priority{priority=\"10\"} 4"));
        assert!(text.contains("pyramid_queue_depth_by_priority{priority=\"0\"} 1"));
        // Three labels per latency series, whatever the clients chose.
        let ttft_series = text
            .lines()
            .filter(|l| l.starts_with("pyramid_ttft_seconds_count"))
            .count();
        assert_eq!(ttft_series, 3, "{text}");
    }
}
