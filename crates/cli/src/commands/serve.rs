//! `pyramid serve`: the OpenAI-compatible HTTP server.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use pyramid_engine::{Arm, EngineConfig, Pooling, PyramidConfig, Speculation};
use pyramid_runtime::WindowLadder;
use pyramid_server::metrics::{Metrics, PriorityLabels};
use pyramid_server::reasoning::ReasoningFormat;
use pyramid_server::ui::WebPage;
use pyramid_server::{ApiKey, AppState, EmbeddingSetup, EngineThread, Limits};

use crate::loader::ModelArgs;
use crate::route::{
    RouteArgs, SpeculativeArgs, DEFAULT_GENERATION_RESERVE, DEFAULT_PREFILL_CHUNK,
    FIRST_COMPILE_ESTIMATE, PREDICTION_MARGIN,
};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on; anything but loopback exposes the server to the network.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free one (printed at start-up).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every request (repeat for several keys).
    #[arg(long)]
    pub api_key: Vec<String>,
    /// Accept the API key KEY, whose requests take priority N when they name none and
    /// never run more urgent than N: a request's `priority` (or X-Priority header) may
    /// make it less urgent, a higher number, but not more. E.g. `background-agents=10`.
    /// Repeatable. /metrics labels latencies by these priorities (and 0); the rest
    /// count as `other`.
    #[arg(long, value_name = "KEY=N", value_parser = parse_key_priority)]
    pub api_key_priority: Vec<ApiKey>,
    /// Seconds a connection may take to send a request's headers, counted from when it
    /// connects or its last response ends (so also how long an idle keep-alive
    /// connection stays open).
    #[arg(long, default_value_t = 10.0, value_parser = parse_seconds)]
    pub header_timeout: f64,
    /// Seconds a client may take to send a request's body.
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    pub body_timeout: f64,
    /// Open connections at once; beyond it new ones get 503 and are closed.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// Prompts tokenised at once (CPU work beside the engine); the rest wait their turn.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tokenizing: u64,
    /// Seconds a response write may wait for the client to read; beyond it the client is
    /// dropped and its request aborted.
    #[arg(long, default_value_t = 30.0, value_parser = parse_seconds)]
    pub write_timeout: f64,
    /// On SIGTERM or Ctrl-C, seconds running requests get to finish before they end with
    /// a shutting-down error (a second signal ends them at once); conversations are saved
    /// either way.
    #[arg(long, default_value_t = 30.0, value_parser = parse_aging)]
    pub shutdown_grace: f64,
    /// Tools a chat request may define (OpenAI's limit is 128); more is a 400.
    #[arg(long, default_value_t = pyramid_server::api::DEFAULT_MAX_TOOLS)]
    pub max_tools: usize,
    /// Conversations held at once, running and cached for reuse.
    #[arg(long, default_value_t = 64)]
    pub max_sessions: usize,
    /// Sequences decoded together in one step (continuous batching).
    #[arg(long, default_value_t = 32)]
    pub max_batch: usize,
    /// Requests waiting for a place in the batch before new ones get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// KV cache memory for running and cached conversations, e.g. 2GiB, 512MiB or bytes.
    /// A request whose window does not fit waits in the queue.
    #[arg(long, default_value = "2GiB", value_parser = parse_bytes)]
    pub kv_budget: usize,
    /// Memory for compiled artifacts (static-shape graphs per window and batch size on
    /// accelerator routes); the least recently used unheld ones are evicted beyond it.
    /// (OpenVINO's CPU plugin keeps a copy of the weights per artifact: about 1.2 GiB
    /// each for SmolLM2 at f32.)
    #[arg(long, default_value = "16GiB", value_parser = parse_bytes)]
    pub artifact_budget: usize,
    /// The window ladder, e.g. 1024,2048,4096 (default: 1K doubling up to the model's context).
    #[arg(long)]
    pub windows: Option<String>,
    /// Prompt tokens prefilled per step, shared by all sequences (on static routes also
    /// the prefill artifacts' chunk, at most the smallest window).
    #[arg(long, default_value_t = DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// When a conversation's next window compiles: `predictive` (ahead of the predicted
    /// crossing) or `on-demand` (when reached: a counted stall).
    #[arg(long, default_value = "predictive", value_parser = parse_window_policy)]
    pub window_policy: Arm,
    /// Seconds a queued or paused request waits before it counts as one priority level
    /// more urgent (requests take `priority`, lower first, or the X-Priority header);
    /// 0 turns aging off, and then a steady stream of urgent requests can starve others.
    #[arg(long, default_value_t = pyramid_engine::DEFAULT_AGING.as_secs_f64(), value_parser = parse_aging)]
    pub priority_aging: f64,
    #[command(flatten)]
    pub speculation: SpeculativeArgs,
    /// Thinking models' thoughts (templates with `<think>`): `auto` returns them apart
    /// from the answer (`reasoning_content`, `thinking` blocks, `reasoning` items);
    /// `none` leaves the raw text, tags and all, in the answer.
    #[arg(long, default_value = "auto", value_parser = parse_reasoning_format)]
    pub reasoning_format: ReasoningFormat,
    /// Keep conversations in this directory: written when they leave memory and at
    /// shutdown (SIGTERM, Ctrl-C), and resumed from there instead of prefilled, also by
    /// a restarted server. Files of other models, precisions or routes are skipped.
    #[arg(long)]
    pub session_dir: Option<std::path::PathBuf>,
    /// Disk space for --session-dir (e.g. 4GiB); the least recently used files go first.
    #[arg(long, value_parser = parse_bytes, requires = "session_dir")]
    pub session_disk_budget: Option<usize>,
    /// Serve an embedding model: /v1/embeddings only (chat, completions, messages and
    /// responses answer 400). Without it, any model answers /v1/embeddings as well.
    /// Embeddings run on the native route.
    #[arg(long)]
    pub embedding: bool,
    /// How /v1/embeddings pools a text's hidden states: `mean`, `cls` (first token) or
    /// `last` (last token). Default: what the model file says (GGUF `pooling_type`,
    /// sentence-transformers' `1_Pooling`), else `mean`.
    #[arg(long, value_parser = parse_pooling)]
    pub pooling: Option<Pooling>,
    /// Do not serve the web page (chat and engine view) at `/`; the API is unchanged.
    #[arg(long)]
    pub no_ui: bool,
    #[command(flatten)]
    pub route: RouteArgs,
}

fn parse_pooling(s: &str) -> Result<Pooling, String> {
    Pooling::from_name(s).ok_or_else(|| format!("'{s}' is not mean, cls or last"))
}

/// `KEY=N`: an API key and its requests' default priority (split at the last `=`, so a
/// key may contain one).
fn parse_key_priority(s: &str) -> Result<ApiKey, String> {
    let (key, priority) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("'{s}' is not KEY=PRIORITY"))?;
    let priority = priority
        .trim()
        .parse::<i32>()
        .map_err(|_| format!("'{s}': the priority must be an integer (lower is more urgent)"))?;
    if key.is_empty() {
        return Err(format!("'{s}': the key is empty"));
    }
    Ok(ApiKey {
        key: key.to_string(),
        priority: Some(priority),
    })
}

/// Zero (no aging) or a positive, finite number of seconds.
fn parse_aging(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(0.0) => Ok(0.0),
        _ => parse_seconds(s),
    }
}

fn parse_reasoning_format(s: &str) -> Result<ReasoningFormat, String> {
    match s {
        "auto" => Ok(ReasoningFormat::Split),
        "none" => Ok(ReasoningFormat::None),
        _ => Err(format!("'{s}' is not a reasoning format: auto or none")),
    }
}

fn parse_window_policy(s: &str) -> Result<Arm, String> {
    match Arm::parse(s) {
        Some(arm @ (Arm::Predictive | Arm::OnDemand)) => Ok(arm),
        _ => Err(format!(
            "'{s}' is not a window policy (predictive or on-demand)"
        )),
    }
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let scale: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" | "k" => 1 << 10,
        "mib" | "m" => 1 << 20,
        "gib" | "g" => 1 << 30,
        other => return Err(format!("unknown unit '{other}' (use B, KiB, MiB or GiB)")),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("'{s}' is not a byte size like 512MiB"))
}

pub fn run(mut args: ServeArgs) -> Result<()> {
    for (name, value) in [
        ("--max-sessions", args.max_sessions),
        ("--max-batch", args.max_batch),
        ("--max-queue", args.max_queue),
        ("--prefill-chunk", args.prefill_chunk),
    ] {
        if value == 0 {
            bail!("{name} must be at least 1");
        }
    }
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("'{}' is not an IP address to listen on", args.host))?;
    args.route
        .place(&args.model.model, || args.model.precision(), None)?;
    let native = args.route.is_native()?;
    let loaded = args.model.load_keeping_f32(!native)?;
    let embedding = EmbeddingSetup {
        pooling: args
            .pooling
            .or(loaded.model.config.pooling)
            .unwrap_or(Pooling::Mean),
        width: loaded.model.config.n_embd,
        only: args.embedding,
    };
    let n_ctx = loaded.model.config.n_ctx_train;
    let ladder = match &args.windows {
        Some(text) => WindowLadder::parse(text, n_ctx)?,
        None => WindowLadder::default_for(n_ctx),
    };
    let max_context = ladder.largest();
    let route = args
        .route
        .build(&args.model.model, &loaded, loaded.f32_model.as_ref())?;
    let prefill_chunk = if route.backend.runs_mixed_passes() {
        args.prefill_chunk.min(ladder.largest())
    } else {
        args.prefill_chunk.min(ladder.windows()[0])
    };
    if args.embedding && !route.backend.runs_mixed_passes() {
        bail!(
            "--embedding needs the native route (--device cpu): static-shape artifacts \
             return logits, not hidden states"
        );
    }
    let mut core = route.engine(
        &loaded,
        EngineConfig {
            pyramid: PyramidConfig {
                ladder,
                prefill_chunk,
                arm: args.window_policy,
                generation_reserve: DEFAULT_GENERATION_RESERVE,
                artifact_budget: args.artifact_budget,
                margin: PREDICTION_MARGIN,
                first_compile_estimate: FIRST_COMPILE_ESTIMATE,
            },
            max_batch: args.max_batch,
            kv_budget: args.kv_budget,
            max_sessions: args.max_sessions,
            static_shapes: false,
            aging: Duration::from_secs_f64(args.priority_aging),
            speculative: args.speculation.config_on(&route, Speculation::Ngram)?,
        },
    )?;
    if let Some(dir) = &args.session_dir {
        let budget = args.session_disk_budget.map(|b| b as u64);
        core.open_session_store(dir, budget)
            .with_context(|| format!("cannot use --session-dir {}", dir.display()))?;
        eprintln!(
            "pyramid serve: {} stored conversations in {}",
            core.stats().persisted.stored_sessions,
            dir.display()
        );
    }
    let template = loaded.tokenizer.chat_template().ok();
    if template.is_none() {
        eprintln!(
            "pyramid serve: the model has no chat template, so /v1/chat/completions answers \
             400; give one with --chat-template FILE"
        );
    }
    let model_id = model_id(&loaded.name);
    let tokenizer = Arc::new(loaded.tokenizer);
    // Latency series get a label per configured key priority; any other is `other`.
    let labels = PriorityLabels::new(args.api_key_priority.iter().filter_map(|k| k.priority));
    let metrics = Arc::new(Metrics::new(labels));
    metrics.set_route(&route.prefill, &route.decode);
    let engine = EngineThread::start(
        core,
        Arc::clone(&tokenizer),
        loaded.pool,
        args.max_queue,
        Arc::clone(&metrics),
    )?;
    let state = AppState::new(
        engine,
        tokenizer,
        template,
        model_id.clone(),
        max_context,
        args.api_key
            .into_iter()
            .map(|key| ApiKey {
                key,
                priority: None,
            })
            .chain(args.api_key_priority)
            .collect(),
        Limits {
            header_timeout: Duration::from_secs_f64(args.header_timeout),
            body_timeout: Duration::from_secs_f64(args.body_timeout),
            max_connections: args.max_connections as usize,
            max_tokenizing: args.max_tokenizing as usize,
            max_tools: args.max_tools,
            write_timeout: Duration::from_secs_f64(args.write_timeout),
            shutdown_grace: Duration::from_secs_f64(args.shutdown_grace),
            ..Limits::default()
        },
        metrics,
    )
    .with_reasoning_format(args.reasoning_format)
    .with_embedding(embedding);
    let state = Arc::new(match &args.session_dir {
        Some(dir) => state
            .keep_responses_in(dir)
            .with_context(|| format!("cannot keep responses in {}", dir.display()))?,
        None => state,
    });
    state.prepare_grammars();
    let route_name = route.name();
    let page = if args.no_ui {
        WebPage::Off
    } else {
        WebPage::Served
    };
    let grace = Duration::from_secs_f64(args.shutdown_grace);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        if page == WebPage::Served {
            // Before stdout's line, so a script that has read that line finds this one.
            let mut shown = local;
            if shown.ip().is_unspecified() {
                shown.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            eprintln!("pyramid serve: web page: http://{shown}/");
        }
        // The first line of stdout is the address, for scripts that start us on port 0.
        println!(
            "pyramid serve: listening on http://{local} (model '{model_id}', route {route_name})"
        );
        std::io::stdout().flush()?;
        let seen = Arc::new(tokio::sync::Notify::new());
        let first_seen = Arc::clone(&seen);
        let first = async move {
            pyramid_server::shutdown_signal().await;
            eprintln!(
                "pyramid serve: shutting down: running requests have {} s to finish (a second signal ends them now)",
                grace.as_secs_f64()
            );
            first_seen.notify_one();
        };
        // A second signal, after the first, cuts the grace short.
        let second = async move {
            seen.notified().await;
            pyramid_server::shutdown_signal().await;
        };
        pyramid_server::serve(listener, Arc::clone(&state), page, first, second).await?;
        // The engine thread finishes and saves every conversation it holds.
        state.engine.shutdown();
        eprintln!("pyramid serve: shut down");
        anyhow::Ok(())
    })
}

/// A known model's name as given, or a file's stem: what clients put in `model`.
fn model_id(name: &str) -> String {
    let path = Path::new(name);
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        if let Some(stem) = path.file_stem() {
            return stem.to_string_lossy().into_owned();
        }
    }
    name.to_string()
}

/// A positive, finite number of seconds.
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1e6 => Ok(v),
        _ => Err(format!("'{s}' is not a number of seconds in (0, 1e6]")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_with_units() {
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1000"), Ok(1000));
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("MiB").is_err());
    }

    #[test]
    fn model_ids_are_names_or_file_stems() {
        assert_eq!(model_id("smollm2-135m"), "smollm2-135m");
        assert_eq!(model_id("/models/qwen.Q4_K_M.gguf"), "qwen.Q4_K_M");
    }
}
