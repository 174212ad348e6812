//! Counters, gauges and histograms, rendered in Prometheus' text format for `/metrics`.
//! Written out by hand: a dozen series do not justify a metrics framework.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pyramid_engine::{EngineStats, RouteAudit, Usage, WindowPyramid};

mod engine;
mod series;

use self::engine::render_engine;
pub use self::series::PriorityLabels;
use self::series::{ByPriority, Histogram, BATCH_BUCKETS, SECONDS_BUCKETS};

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

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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

    /// The route as one name: the device, or `prefill→decode` when they differ.
    pub fn route_name(&self) -> String {
        let (prefill, decode) = &*lock(&self.route);
        if prefill == decode {
            prefill.clone()
        } else {
            format!("{prefill}→{decode}")
        }
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
            stats.builds = p.builds();
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
