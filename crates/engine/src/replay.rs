//! Agent sessions replayed step by step under each [`Arm`], with the figures that compare
//! them.
//!
//! A trace is a list of steps, each appending context to a session (a screenshot's and an
//! action's tokens) and generating a reply. Every arm runs the same steps greedily; the
//! generated tokens must come out identical across arms, since arms differ only in how
//! windows are compiled and changed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use pyramid_kernels::ThreadPool;
use pyramid_model::KvType;
use pyramid_runtime::Backend;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::Value;

use crate::config::EngineConfig;
use crate::engine::Engine;
use crate::pyramid::{Arm, PyramidConfig, PyramidStats};
use crate::request::Request;
use crate::{EngineError, Result};

/// Median tokens a step appends: a screenshot plus an action.
pub const MEDIAN_APPEND_TOKENS: f64 = 2227.0;
/// Median steps per session; the tail reaches [`MAX_STEPS`].
pub const MEDIAN_STEPS: f64 = 8.0;
pub const MAX_STEPS: usize = 100;
/// Median tokens an agent generates per step (an action).
pub const MEDIAN_GENERATE_TOKENS: f64 = 48.0;
/// No step appends or generates more than this (far beyond any model's context), so a
/// typo in a trace is an error rather than an allocation that brings the process down.
pub const MAX_STEP_TOKENS: u64 = 1 << 24;
/// Nor does a whole trace append more: a short file of many maximal steps would otherwise
/// ask for gigabytes of ids before the first step runs.
pub const MAX_TRACE_TOKENS: usize = 1 << 24;

/// What a step appends.
#[derive(Debug, Clone, PartialEq)]
pub enum Append {
    /// This many context tokens (content drawn deterministically per session and step).
    Tokens(usize),
    Text(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TraceStep {
    pub session: String,
    pub step: u64,
    pub append: Append,
    pub generate: usize,
}

/// Parses a JSONL trace: `{"session", "step", "append_tokens" | "append_text",
/// "generate_tokens"}` per line; blank lines are skipped.
pub fn parse_trace(text: &str) -> Result<Vec<TraceStep>> {
    let mut steps = Vec::new();
    for (idx, line) in text.lines().enumerate() {
        let line_no = idx + 1;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| EngineError::BadTrace {
            line: line_no,
            reason,
        };
        let v: Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| bad("expected a JSON object".to_string()))?;
        let count = |field: &str| -> Result<Option<u64>> {
            match obj.get(field) {
                None => Ok(None),
                Some(Value::Number(n)) => match n.as_u64() {
                    Some(v) if v <= MAX_STEP_TOKENS => Ok(Some(v)),
                    Some(v) => Err(bad(format!(
                        "'{field}' is {v}, beyond the limit of {MAX_STEP_TOKENS}"
                    ))),
                    None => Err(bad(format!(
                        "'{field}' must be a non-negative integer, got {n}"
                    ))),
                },
                Some(other) => Err(bad(format!(
                    "'{field}' must be a non-negative integer, got {other}"
                ))),
            }
        };
        let session = match obj.get("session") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => return Err(bad("'session' (a string or number) is missing".to_string())),
        };
        let step = count("step")?.ok_or_else(|| bad("'step' is missing".to_string()))?;
        let append = match (count("append_tokens")?, obj.get("append_text")) {
            (Some(n), None) => Append::Tokens(n as usize),
            (None, Some(Value::String(t))) => Append::Text(t.clone()),
            (None, Some(_)) => return Err(bad("'append_text' must be a string".to_string())),
            (Some(_), Some(_)) => {
                return Err(bad(
                    "give either 'append_tokens' or 'append_text', not both".to_string(),
                ))
            }
            (None, None) => {
                return Err(bad(
                    "'append_tokens' or 'append_text' is missing".to_string()
                ))
            }
        };
        let generate = count("generate_tokens")?
            .ok_or_else(|| bad("'generate_tokens' is missing".to_string()))?;
        steps.push(TraceStep {
            session,
            step,
            append,
            generate: generate as usize,
        });
    }
    Ok(steps)
}

/// A seeded synthetic trace: `n_sessions` sessions whose lengths are log-normal around
/// [`MEDIAN_STEPS`] (capped at [`MAX_STEPS`]), each step appending a log-normal amount
/// around [`MEDIAN_APPEND_TOKENS`]; `scale` multiplies every token count. Sessions'
/// steps interleave round-robin, as concurrent agents' would.
pub fn synthetic_trace(seed: u64, n_sessions: usize, scale: f64) -> Vec<TraceStep> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut normal = move || {
        // Box–Muller.
        let (u1, u2): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random_range(0.0..1.0));
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    };
    // σ = 1.08 puts the 99th percentile of session length near 100 steps.
    let lengths: Vec<usize> = (0..n_sessions)
        .map(|_| ((MEDIAN_STEPS * (1.08 * normal()).exp()).round() as usize).clamp(1, MAX_STEPS))
        .collect();
    let mut steps = Vec::new();
    for step in 0..lengths.iter().copied().max().unwrap_or(0) {
        for (s, &len) in lengths.iter().enumerate() {
            if step < len {
                let max = MAX_STEP_TOKENS as f64;
                let append = (MEDIAN_APPEND_TOKENS * scale * (0.3 * normal()).exp())
                    .round()
                    .min(max);
                let generate = (MEDIAN_GENERATE_TOKENS * scale * (0.3 * normal()).exp())
                    .round()
                    .min(max);
                steps.push(TraceStep {
                    session: format!("s{s}"),
                    step: step as u64,
                    append: Append::Tokens((append as usize).max(1)),
                    generate: (generate as usize).max(1),
                });
            }
        }
    }
    steps
}

/// A step with its appended context as token ids.
#[derive(Debug, Clone)]
pub struct ResolvedStep {
    pub session: String,
    /// The trace's step number.
    pub step: u64,
    pub tokens: Vec<u32>,
    pub generate: usize,
}

/// Turns a trace into token ids: text through `tokenize`; a token count into ids drawn
/// from `0..n_vocab` seeded by session and step, so every arm sees the same context.
pub fn resolve(
    steps: &[TraceStep],
    n_vocab: usize,
    tokenize: &dyn Fn(&str) -> Result<Vec<u32>>,
) -> Result<Vec<ResolvedStep>> {
    let mut total = 0usize;
    steps
        .iter()
        .map(|s| {
            total = total.saturating_add(match &s.append {
                Append::Tokens(n) => *n,
                Append::Text(t) => t.len(),
            });
            if total > MAX_TRACE_TOKENS {
                return Err(EngineError::BadStep {
                    session: s.session.clone(),
                    step: s.step,
                    reason: format!("the trace appends more than {MAX_TRACE_TOKENS} tokens in all"),
                });
            }
            let tokens = match &s.append {
                Append::Text(t) => tokenize(t).map_err(|e| EngineError::BadStep {
                    session: s.session.clone(),
                    step: s.step,
                    reason: e.to_string(),
                })?,
                Append::Tokens(n) => {
                    let seed = s
                        .session
                        .bytes()
                        .fold(s.step, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                    (0..*n)
                        .map(|_| rng.random_range(0..n_vocab as u32))
                        .collect()
                }
            };
            Ok(ResolvedStep {
                session: s.session.clone(),
                step: s.step,
                tokens,
                generate: s.generate,
            })
        })
        .collect()
}

/// One arm's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ArmReport {
    pub arm: Arm,
    pub total_ms: f64,
    pub ttft_ms_p50: f64,
    pub ttft_ms_max: f64,
    pub decode_ms_per_token: f64,
    /// Compiles, migrations, re-prefills and stalls.
    #[serde(flatten)]
    pub stats: PyramidStats,
    /// Effective copy speed of the migrations; `null` when they copied nothing.
    pub migration_gb_s: Option<f64>,
    /// Peak resident memory while the arm ran (Linux; `None` elsewhere).
    pub peak_rss_bytes: Option<u64>,
    /// The most KV cache memory reserved (windows) and used (live positions) at once.
    pub kv_bytes_reserved: usize,
    pub kv_bytes_used: usize,
    /// Sessions that stopped with an error (e.g. beyond the largest window).
    pub failed_sessions: Vec<FailedSession>,
    /// Greedy tokens generated, per session in trace order of first appearance.
    #[serde(skip)]
    pub generated: Vec<(String, Vec<u32>)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailedSession {
    pub session: String,
    /// The trace's step number where it stopped.
    pub step: u64,
    /// `context_length_exceeded` when the session outgrew the largest window.
    pub code: Option<&'static str>,
    pub error: String,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Everything an arm run needs besides the arm.
pub struct ReplaySetup<'a> {
    pub backend: Arc<dyn Backend>,
    pub model_id: u64,
    pub kv_type: KvType,
    pub config: PyramidConfig,
    pub pool: &'a ThreadPool,
}

/// Runs `steps` under `arm` through the engine, one request per step (the session's
/// whole context, greedy), calling `on_step` with the number of steps done after each.
/// A session that fails (say, it outgrows the largest window) is recorded and stops; the
/// others go on.
pub fn run_arm(
    setup: &ReplaySetup<'_>,
    arm: Arm,
    steps: &[ResolvedStep],
    on_step: &dyn Fn(usize),
) -> Result<ArmReport> {
    let config = EngineConfig {
        pyramid: PyramidConfig {
            arm,
            ..setup.config.clone()
        },
        max_batch: 1,
        kv_budget: usize::MAX,
        max_sessions: usize::MAX,
        // The pyramid is measured as a static device sees it, whatever the backend.
        static_shapes: true,
        aging: crate::DEFAULT_AGING,
        speculative: crate::SpeculativeConfig::off(),
    };
    let mut engine = Engine::new(
        Arc::clone(&setup.backend),
        setup.model_id,
        setup.kv_type,
        config,
    )?;
    rss::reset_peak();
    let start = Instant::now();
    // Each session's context as the agent re-sends it: everything appended and generated.
    let mut contexts: HashMap<&str, Vec<u32>> = HashMap::new();
    let mut generated: Vec<(String, Vec<u32>)> = Vec::new();
    let mut failed: Vec<FailedSession> = Vec::new();
    let (mut ttfts, mut decode_ms, mut n_decoded) = (Vec::new(), 0.0, 0usize);
    let (mut kv_reserved, mut kv_used) = (0usize, 0usize);
    for (n_done, step) in steps.iter().enumerate() {
        on_step(n_done);
        if failed.iter().any(|f| f.session == step.session) {
            continue;
        }
        let out_idx = match generated.iter().position(|(s, _)| *s == step.session) {
            Some(i) => i,
            None => {
                generated.push((step.session.clone(), Vec::new()));
                generated.len() - 1
            }
        };
        let context = contexts.entry(&step.session).or_default();
        context.extend_from_slice(&step.tokens);
        // A step that generates nothing still samples once; that token is not kept.
        let request = Request::greedy(n_done as u64, context.clone(), step.generate.max(1));
        match engine.generate(setup.pool, request, &mut |_| true) {
            Ok(done) => {
                let t = done.timings;
                ttfts.push(t.queue_ms + t.prefill_ms);
                decode_ms += t.decode_ms;
                n_decoded += t.n_decode;
                let kept = &done.tokens[..step.generate.min(done.tokens.len())];
                context.extend_from_slice(kept);
                generated[out_idx].1.extend_from_slice(kept);
            }
            Err(e) => {
                failed.push(FailedSession {
                    session: step.session.clone(),
                    step: step.step,
                    code: e.code(),
                    error: e.to_string(),
                });
                contexts.remove(step.session.as_str());
                continue;
            }
        }
        let stats = engine.stats();
        kv_reserved = kv_reserved.max(stats.kv_bytes_reserved);
        kv_used = kv_used.max(stats.kv_bytes_used);
    }
    on_step(steps.len());
    let total_ms = start.elapsed().as_secs_f64() * 1e3;
    let peak_rss_bytes = rss::peak();
    let pyramid = Arc::clone(engine.pyramid());
    drop(engine);
    // Compiles still in flight would otherwise run into the next arm's measurement.
    pyramid.join_background();
    let stats = pyramid.stats();
    ttfts.sort_by(f64::total_cmp);
    Ok(ArmReport {
        arm,
        total_ms,
        ttft_ms_p50: percentile(&ttfts, 0.5),
        ttft_ms_max: ttfts.last().copied().unwrap_or(0.0),
        decode_ms_per_token: if n_decoded == 0 {
            0.0
        } else {
            decode_ms / n_decoded as f64
        },
        migration_gb_s: stats.migration_gb_per_s(),
        stats,
        peak_rss_bytes,
        kv_bytes_reserved: kv_reserved,
        kv_bytes_used: kv_used,
        failed_sessions: failed,
        generated,
    })
}

/// Whether every arm generated the same tokens for every session (`None` with fewer
/// than two arms: nothing was compared).
pub fn tokens_identical(arms: &[ArmReport]) -> Option<bool> {
    (arms.len() >= 2).then(|| arms.windows(2).all(|w| w[0].generated == w[1].generated))
}

/// Peak resident set size of this process, resettable between arms (Linux).
pub mod rss {
    /// Resets the kernel's high-water mark (`VmHWM`) to the current RSS.
    pub fn reset_peak() {
        // Ignored where unsupported: the figure is then reported as absent.
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }

    pub fn peak() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_trace_and_names_bad_lines() {
        let text = r#"{"session": "a", "step": 0, "append_tokens": 100, "generate_tokens": 8}

{"session": 2, "step": 1, "append_text": "click OK", "generate_tokens": 0}"#;
        let steps = parse_trace(text).unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].append, Append::Tokens(100));
        assert_eq!(steps[1].session, "2");
        assert_eq!(steps[1].append, Append::Text("click OK".to_string()));
        for (line, msg) in [
            (
                r#"{"session": "a", "step": 0, "append_tokens": -5, "generate_tokens": 1}"#,
                "'append_tokens' must be a non-negative integer, got -5",
            ),
            (
                r#"{"session": "a", "step": 0, "append_tokens": "many", "generate_tokens": 1}"#,
                "'append_tokens' must be a non-negative integer",
            ),
            (
                r#"{"session": "a", "step": 1.5, "append_tokens": 3, "generate_tokens": 1}"#,
                "'step' must be",
            ),
            (
                r#"{"session": "a", "step": 0, "generate_tokens": 1}"#,
                "missing",
            ),
            (
                r#"{"session": "a", "step": 0, "append_tokens": 1}"#,
                "'generate_tokens' is missing",
            ),
            (
                r#"{"step": 0, "append_tokens": 1, "generate_tokens": 1}"#,
                "'session'",
            ),
            ("[1, 2]", "expected a JSON object"),
            ("{oops", "not JSON"),
        ] {
            let text = format!("{{\"session\": \"ok\", \"step\": 0, \"append_tokens\": 1, \"generate_tokens\": 1}}\n{line}");
            let err = parse_trace(&text).unwrap_err().to_string();
            assert!(
                err.starts_with("trace line 2:") && err.contains(msg),
                "{err}"
            );
        }
    }

    #[test]
    fn synthetic_traces_are_seeded_and_shaped_like_agents() {
        let a = synthetic_trace(7, 200, 1.0);
        assert_eq!(a, synthetic_trace(7, 200, 1.0));
        assert_ne!(a, synthetic_trace(8, 200, 1.0));
        let mut lengths: HashMap<&str, usize> = HashMap::new();
        let mut appends: Vec<usize> = Vec::new();
        for s in &a {
            *lengths.entry(&s.session).or_default() += 1;
            if let Append::Tokens(n) = s.append {
                appends.push(n);
            }
        }
        let mut lengths: Vec<usize> = lengths.into_values().collect();
        lengths.sort_unstable();
        appends.sort_unstable();
        let median_len = lengths[lengths.len() / 2];
        assert!((5..=12).contains(&median_len), "median steps {median_len}");
        assert!(*lengths.last().unwrap() <= MAX_STEPS);
        let median_append = appends[appends.len() / 2] as f64;
        assert!(
            (median_append / MEDIAN_APPEND_TOKENS - 1.0).abs() < 0.1,
            "{median_append}"
        );
        let small = synthetic_trace(7, 200, 0.1);
        assert!(small
            .iter()
            .all(|s| matches!(s.append, Append::Tokens(n) if n < 1000)));
    }
}
