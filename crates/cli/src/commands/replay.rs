//! `pyramid replay`: agent sessions step by step under each window strategy, side by side.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use pyramid_engine::replay::{
    parse_trace, resolve, run_arm, synthetic_trace, tokens_identical, ArmReport, ReplaySetup,
};
use pyramid_engine::{Arm, EngineError, PyramidConfig, RouteAudit};
use pyramid_kernels::isa;
use pyramid_runtime::WindowLadder;
use serde::Serialize;

use pyramid_bench::results::{Provenance, ReplayArm, ReplayRecord};

use crate::commands::bench_matrix;
use crate::loader::{file_model_id, ModelArgs};
use crate::route::RouteArgs;
use crate::route::DEFAULT_PREFILL_CHUNK;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub route: RouteArgs,
    /// A JSONL trace: {"session", "step", "append_tokens" or "append_text", "generate_tokens"}
    /// per line.
    #[arg(
        long,
        conflicts_with = "synthetic",
        required_unless_present = "synthetic"
    )]
    pub trace: Option<std::path::PathBuf>,
    /// A seeded synthetic trace instead: ~2,227 appended tokens a step, sessions of 8 steps
    /// at the median and up to 100.
    #[arg(long)]
    pub synthetic: bool,
    /// Sessions in the synthetic trace.
    #[arg(long, default_value_t = 4)]
    pub sessions: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Multiplies every token count of the synthetic trace (small models, CI).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// The window ladder, e.g. 1024,2048,4096 (default: 1K doubling up to the model's context).
    #[arg(long)]
    pub windows: Option<String>,
    /// Tokens per prefill run.
    #[arg(long, default_value_t = DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Positions kept free for generation when a session picks its first window.
    #[arg(long, default_value_t = 256)]
    pub generation_reserve: usize,
    /// Memory the artifact cache may hold, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub artifact_budget_mib: usize,
    /// Arms to run, comma-separated: largest, reprefill, on-demand, predictive.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "largest,reprefill,on-demand,predictive"
    )]
    pub arms: Vec<String>,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also merge the run, with its provenance, into this results file (e.g.
    /// benchmarks/latest.json), for `pyramid bench report`.
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
}

#[derive(Serialize)]
struct TraceSummary {
    source: String,
    sessions: usize,
    steps: usize,
    appended_tokens: usize,
    generate_tokens: usize,
}

#[derive(Serialize)]
struct Report<'a> {
    model: &'a str,
    precision: String,
    kv: String,
    threads: usize,
    isa: &'static str,
    /// Devices asked for and devices that really ran each stage (from the first arm
    /// that compiled them).
    route: RouteAudit,
    windows: Vec<usize>,
    prefill_chunk: usize,
    trace: TraceSummary,
    arms: &'a [ArmReport],
    /// `null` when fewer than two arms ran.
    tokens_identical: Option<bool>,
}

pub fn run(mut args: ReplayArgs) -> Result<()> {
    if args.prefill_chunk == 0 {
        bail!("--prefill-chunk must be at least 1");
    }
    if !(args.scale > 0.0 && args.scale <= 100.0) {
        bail!("--scale must be in (0, 100], got {}", args.scale);
    }
    if args.synthetic && !(1..=100_000).contains(&args.sessions) {
        bail!("--sessions must be in 1..=100000, got {}", args.sessions);
    }
    let arms: Vec<Arm> = args
        .arms
        .iter()
        .map(|a| {
            Arm::parse(a).with_context(|| {
                format!("unknown arm '{a}' (expected largest, reprefill, on-demand, predictive)")
            })
        })
        .collect::<Result<_>>()?;
    let (steps, source) = match &args.trace {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading trace {}", path.display()))?;
            let steps = parse_trace(&text).with_context(|| format!("in {}", path.display()))?;
            (steps, path.display().to_string())
        }
        None => (
            synthetic_trace(args.seed, args.sessions, args.scale),
            format!(
                "synthetic (seed {}, {} sessions, scale {})",
                args.seed, args.sessions, args.scale
            ),
        ),
    };
    if steps.is_empty() {
        bail!("the trace has no steps");
    }
    args.route
        .place(&args.model.model, || args.model.precision(), None)?;
    let native = args.route.is_native()?;
    let loaded = args.model.load_keeping_f32(!native)?;
    let route = args
        .route
        .build(&args.model.model, &loaded, loaded.f32_model.as_ref())?;
    let n_ctx = loaded.model.config.n_ctx_train;
    let ladder = match &args.windows {
        Some(text) => WindowLadder::parse(text, n_ctx)?,
        None => WindowLadder::default_for(n_ctx),
    };
    let tokenizer = &loaded.tokenizer;
    let tokenize = |text: &str| -> pyramid_engine::Result<Vec<u32>> {
        tokenizer
            .encode(text, false)
            .map_err(|e| EngineError::BadConfig(format!("cannot tokenize append_text: {e}")))
    };
    let resolved = resolve(&steps, loaded.model.config.n_vocab, &tokenize)?;
    let setup = ReplaySetup {
        backend: Arc::clone(&route.backend),
        model_id: file_model_id(&loaded.path)?,
        kv_type: loaded.kv_type,
        config: PyramidConfig {
            ladder: ladder.clone(),
            prefill_chunk: args.prefill_chunk,
            arm: Arm::Predictive,
            generation_reserve: args.generation_reserve,
            artifact_budget: args.artifact_budget_mib.saturating_mul(1 << 20),
            margin: Duration::from_millis(20),
            first_compile_estimate: Duration::from_millis(50),
        },
        pool: &loaded.pool,
    };
    let mut reports = Vec::new();
    for arm in arms {
        // Drawn on stderr only when it is a terminal.
        let bar = ProgressBar::new(resolved.len() as u64).with_style(
            ProgressStyle::with_template(
                "{prefix:>10} [{bar:30}] {pos}/{len} steps, {elapsed} (eta {eta})",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(arm.name());
        let report = run_arm(&setup, arm, &resolved, &|done| {
            bar.set_position(done as u64)
        })?;
        bar.finish_and_clear();
        reports.push(report);
    }
    let sessions: std::collections::HashSet<&str> =
        steps.iter().map(|s| s.session.as_str()).collect();
    let report = Report {
        model: &loaded.name,
        precision: loaded.model.precision.to_string(),
        kv: loaded.kv_type.to_string(),
        threads: loaded.pool.n_threads(),
        isa: isa::active().name(),
        route: route.audit(
            reports
                .iter()
                .find_map(|a| a.stats.prefill_executed_on.clone()),
            reports
                .iter()
                .find_map(|a| a.stats.decode_executed_on.clone()),
        ),
        windows: ladder.windows().to_vec(),
        prefill_chunk: args.prefill_chunk,
        trace: TraceSummary {
            source,
            sessions: sessions.len(),
            steps: steps.len(),
            appended_tokens: resolved.iter().map(|s| s.tokens.len()).sum(),
            generate_tokens: resolved.iter().map(|s| s.generate).sum(),
        },
        tokens_identical: tokens_identical(&reports),
        arms: &reports,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    if let Some(path) = &args.record {
        let provenance = bench_matrix::provenance_here();
        let mut results = bench_matrix::read_results(path)?;
        results.merge_replay(record_of(&report, provenance.clone()));
        let history = bench_matrix::save_results(path, &results, &provenance)?;
        eprintln!(
            "recorded in {} (history: {})",
            path.display(),
            history.display()
        );
    }
    Ok(())
}

fn record_of(r: &Report<'_>, provenance: Provenance) -> ReplayRecord {
    ReplayRecord {
        model: r.model.to_string(),
        precision: r.precision.clone(),
        kv: r.kv.clone(),
        route: if r.route.prefill.requested == r.route.decode.requested {
            r.route.prefill.requested.clone()
        } else {
            format!(
                "{}->{}",
                r.route.prefill.requested, r.route.decode.requested
            )
        },
        executed: [&r.route.prefill, &r.route.decode]
            .map(|s| s.executed.as_deref().unwrap_or("unknown"))
            .join(" -> "),
        as_requested: !r.route.flagged(),
        windows: r.windows.clone(),
        trace: r.trace.source.clone(),
        steps: r.trace.steps,
        appended_tokens: r.trace.appended_tokens,
        generate_tokens: r.trace.generate_tokens,
        tokens_identical: r.tokens_identical,
        arms: r
            .arms
            .iter()
            .map(|a| ReplayArm {
                arm: a.arm.name().to_string(),
                total_ms: a.total_ms,
                ttft_ms_p50: a.ttft_ms_p50,
                decode_ms_per_token: a.decode_ms_per_token,
                n_compiles: a.stats.n_compiles,
                compile_ms: a.stats.compile_ms,
                n_store_loads: Some(a.stats.n_store_loads),
                store_load_ms: Some(a.stats.store_load_ms),
                n_migrations: a.stats.n_migrations,
                migration_ms: a.stats.migration_ms,
                migration_bytes: Some(a.stats.migration_bytes),
                migration_live_bytes: Some(a.stats.migration_live_bytes),
                n_reprefills: a.stats.n_reprefills,
                reprefill_ms: a.stats.reprefill_ms,
                n_stalls: a.stats.n_stalls,
                stall_ms: a.stats.stall_ms,
                peak_rss_bytes: a.peak_rss_bytes,
                failed_sessions: a.failed_sessions.len(),
            })
            .collect(),
        provenance: Some(provenance),
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn print_table(r: &Report<'_>) {
    println!(
        "{} {} kv {} | {} threads {} | windows {:?} | chunk {} | {}: {} sessions, {} steps, {} appended + {} generated tokens",
        r.model, r.precision, r.kv, r.threads, r.isa, r.windows, r.prefill_chunk,
        r.trace.source, r.trace.sessions, r.trace.steps, r.trace.appended_tokens, r.trace.generate_tokens
    );
    println!(
        "| arm | total ms | TTFT p50 ms | decode ms/tok | compile ms (n) | store load ms (n) | migration ms (n) | migrated MiB live / copied | copy GB/s | re-prefill ms (n) | stall ms (n) | peak RSS MiB | KV reserved MiB | KV used MiB | failed sessions |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for a in r.arms {
        println!(
            "| {} | {:.0} | {:.1} | {:.2} | {:.1} ({}) | {:.1} ({}) | {:.2} ({}) | {:.1} / {:.1} | {} | {:.1} ({}) | {:.1} ({}) | {} | {:.1} | {:.1} | {} |",
            a.arm.name(),
            a.total_ms,
            a.ttft_ms_p50,
            a.decode_ms_per_token,
            a.stats.compile_ms,
            a.stats.n_compiles,
            a.stats.store_load_ms,
            a.stats.n_store_loads,
            a.stats.migration_ms,
            a.stats.n_migrations,
            mib(a.stats.migration_live_bytes),
            mib(a.stats.migration_bytes),
            a.stats
                .migration_gb_per_s()
                .map_or("-".to_string(), |g| format!("{g:.1}")),
            a.stats.reprefill_ms,
            a.stats.n_reprefills,
            a.stats.stall_ms,
            a.stats.n_stalls,
            a.peak_rss_bytes
                .map_or("n/a".to_string(), |b| format!("{:.0}", mib(b as usize))),
            mib(a.kv_bytes_reserved),
            mib(a.kv_bytes_used),
            a.failed_sessions.len(),
        );
    }
    for a in r.arms {
        for f in &a.failed_sessions {
            println!(
                "{}: session {} stopped at step {}: {}",
                a.arm.name(),
                f.session,
                f.step,
                f.error
            );
        }
    }
    println!(
        "tokens identical across arms: {}",
        match r.tokens_identical {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "n/a (one arm)",
        }
    );
    println!("route: {}", r.route.describe());
}
