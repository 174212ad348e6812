//! `pyramid bench`: prefill (pp) and decode (tg) throughput in llama-bench's vocabulary.
//!
//! Prompts are random token ids (as llama-bench uses), so the figures measure the engine,
//! not the text. Each test runs once untimed to warm caches, then `-r` timed repetitions.
//! A tg test counts the tokens after the first, from the moment every sequence has its
//! first (as OpenVINO GenAI's time per output token does): the first comes from a
//! one-token prompt, which a static route runs as a whole padded prefill chunk.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use pyramid_affinity::split::SplitPlan;
use pyramid_bench::results::Stat;
use pyramid_engine::{Engine, EngineConfig, Event, Request, RouteAudit, Speculation};
use pyramid_kernels::isa;
use pyramid_runtime::WindowLadder;
use serde::Serialize;

use super::bench_matrix::random_tokens;
use crate::commands::qualify::Qualifier;

/// Greedy tokens per prompt when a bench qualifies its route.
const QUALIFY_TOKENS: usize = 16;
use crate::loader::{Loaded, ModelArgs};
use crate::route::{single_user, RouteArgs, SpeculativeArgs, DEFAULT_PREFILL_CHUNK};

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub action: Option<super::bench_matrix::BenchAction>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths to prefill (pp tests), comma-separated; 0 skips.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Tokens to generate (tg tests), comma-separated; 0 skips.
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Context already in the cache before each test (untimed).
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    pub n_depth: Vec<usize>,
    /// Sequences run together: each pp test prefills this many prompts in one pass, each
    /// tg test decodes this many sequences in lockstep (t/s counts all of them).
    #[arg(short = 'b', long, default_value_t = 1)]
    pub batch: usize,
    /// Timed repetitions per test.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    #[command(flatten)]
    pub route: RouteArgs,
    /// Run compiled static-shape artifacts of this window (positions) instead of the
    /// native growing cache; implied by any route other than cpu, which then picks the
    /// smallest window of the default ladder that holds the test.
    #[arg(long)]
    pub window: Option<usize>,
    /// Tokens per prefill run on the artifact path.
    #[arg(long, default_value_t = DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// Print a JSON list of records instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub speculation: SpeculativeArgs,
}

#[derive(Serialize)]
struct Record {
    model: String,
    test: String,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    batch: usize,
    threads: usize,
    precision: String,
    kv: String,
    /// `exact` or `int8` attention products.
    attention: String,
    isa: &'static str,
    /// `cpu` for the native path, else the route (`ov:CPU`, `cpu->ov:NPU`).
    device: String,
    /// The artifacts' window, on the artifact path.
    window: Option<usize>,
    /// Compiling the test's artifacts, on the artifact path.
    compile_ms: Option<f64>,
    /// Loading the ones the store of compiled artifacts kept, on the artifact path.
    store_load_ms: Option<f64>,
    route: RouteAudit,
    /// Whether the route's greedy tokens at this window equal the native f32 path's on
    /// the first reference prompts (`pyramid qualify`); checked for routes through
    /// OpenVINO, `null` on native routes.
    qualified: Option<bool>,
    /// A random-weight model with a published model's shapes: speed only.
    synthetic: bool,
    /// With a device of `auto`, or a split prefill placed from a profile: the t/s the
    /// profile predicted for this test (one sequence), beside the measured `avg_ts`.
    predicted_ts: Option<f64>,
    /// What each level of the profile predicted, where its figures were valid.
    predicted_ts_by_level: BTreeMap<&'static str, f64>,
    /// A split prefill placed from a profile (`cpu+ov:DEVICE` with `--affinity`): each
    /// layer's executor and the predicted seconds per chunk; `predicted_ts` is its rate.
    split_plan: Option<SplitPlan>,
    /// `ngram` or `off`; with drafts, generated tokens per sampling pass in the timed
    /// repetitions (1 without).
    speculative: &'static str,
    tokens_per_pass: f64,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ts: Vec<f64>,
}

/// One timed run of the test through the engine: prefill `n_prompt` tokens, or decode
/// `n_gen` tokens (timed after the first), in each of `batch` sequences, after `n_depth`
/// untimed tokens each (prefilled first and reused from the prefix cache).
fn run_once(
    engine: &mut Engine,
    loaded: &Loaded,
    batch: usize,
    (n_depth, n_prompt, n_gen): (usize, usize, usize),
    seed: u64,
    speculation: Speculation,
) -> Result<Timed> {
    let n_vocab = loaded.model.config.n_vocab;
    let seq_seed = |b: usize, what: u64| seed * 1_000 + b as u64 * 10 + what;
    let depth: Vec<Vec<u32>> = (0..batch)
        .map(|b| random_tokens(n_depth, n_vocab, seq_seed(b, 0)))
        .collect();
    if n_depth > 0 {
        let requests = depth
            .iter()
            .enumerate()
            .map(|(b, d)| Request::greedy(b as u64, d.clone(), 1));
        run_all(engine, loaded, requests)?;
    }
    let requests = depth.iter().enumerate().map(|(b, d)| {
        let mut prompt = d.clone();
        if n_prompt > 0 {
            prompt.extend(random_tokens(n_prompt, n_vocab, seq_seed(b, 1)));
            Request::greedy(b as u64, prompt, 1)
        } else {
            // One new token, then `n_gen - 1` decodes: `n_gen` passes, `n_gen` samples
            // (fewer passes with accepted drafts).
            prompt.extend(random_tokens(1, n_vocab, seq_seed(b, 2)));
            Request {
                speculation,
                ..Request::greedy(b as u64, prompt, n_gen)
            }
        }
    });
    let start = Instant::now();
    let all_started = run_all(engine, loaded, requests)?;
    let end = Instant::now();
    Ok(match all_started {
        // Decode is timed from the moment every sequence has its first token, as OpenVINO
        // GenAI's time per output token is: the first comes from a one-token prompt pass,
        // on static routes a whole padded prefill chunk.
        Some(first) if n_prompt == 0 && n_gen > 1 => Timed {
            seconds: (end - first).as_secs_f64(),
            tokens: batch * (n_gen - 1),
        },
        _ => Timed {
            seconds: (end - start).as_secs_f64(),
            tokens: batch * (n_prompt + n_gen),
        },
    })
}

/// Tokens a timed run counts, and the seconds they took.
struct Timed {
    seconds: f64,
    tokens: usize,
}

/// Runs `requests` together until all have finished; returns when every one of them had
/// its first token.
fn run_all(
    engine: &mut Engine,
    loaded: &Loaded,
    requests: impl Iterator<Item = Request>,
) -> Result<Option<Instant>> {
    let mut left = 0;
    let mut without_token = std::collections::HashSet::new();
    for request in requests {
        without_token.insert(request.id);
        engine.add_request(request);
        left += 1;
    }
    let mut all_started = None;
    while left > 0 {
        for event in engine.step(&loaded.pool) {
            match event {
                Event::Finished { .. } => left -= 1,
                Event::Failed { error, .. } => return Err(error.into()),
                Event::Token { id, .. } => {
                    if without_token.remove(&id) && without_token.is_empty() {
                        all_started.get_or_insert_with(Instant::now);
                    }
                }
                Event::Started { .. } | Event::Embedding { .. } => {}
            }
        }
    }
    Ok(all_started)
}

pub fn run(mut args: BenchArgs) -> Result<()> {
    if let Some(action) = args.action {
        return super::bench_matrix::run(action);
    }
    if args.repetitions == 0 {
        bail!("-r/--repetitions must be at least 1");
    }
    if args.batch == 0 {
        bail!("-b/--batch must be at least 1");
    }
    let work = (
        args.n_prompt.iter().copied().find(|&p| p > 0).unwrap_or(0),
        args.n_gen.iter().copied().find(|&g| g > 0).unwrap_or(0),
    );
    let placement = args
        .route
        .place(&args.model.model, || args.model.precision(), Some(work))?;
    let native = args.route.is_native()?;
    let loaded = args.model.load_keeping_f32(!native)?;
    let route = args
        .route
        .build(&args.model.model, &loaded, loaded.f32_model.as_ref())?;
    let on_artifacts = !native || args.window.is_some();
    if on_artifacts && args.prefill_chunk == 0 {
        bail!("--prefill-chunk must be at least 1");
    }
    // Random prompts: plain decoding unless asked, as llama-bench measures it.
    let speculation = args.speculation.mode_or(Speculation::Off);
    let speculative = args.speculation.config_on(&route, Speculation::Off)?;
    if args.window.is_some() && speculation == Speculation::Ngram {
        bail!("--speculative ngram runs on the native growing cache, not with --window");
    }
    let n_ctx = loaded.model.config.n_ctx_train;
    let mut tests = Vec::new();
    for &d in &args.n_depth {
        tests.extend(args.n_prompt.iter().filter(|&&p| p > 0).map(|&p| (d, p, 0)));
        tests.extend(args.n_gen.iter().filter(|&&g| g > 0).map(|&g| (d, 0, g)));
    }
    if tests.is_empty() {
        bail!("nothing to measure: give a positive -p or -n");
    }
    // Qualification: three short reference prompts, 16 tokens, per window used.
    let qualifier = if native || loaded.synthetic {
        None
    } else {
        Some(Qualifier::new(
            &loaded,
            &[],
            Some(3),
            QUALIFY_TOKENS,
            n_ctx,
        )?)
    };
    let mut qualified: std::collections::HashMap<usize, bool> = Default::default();
    let mut records = Vec::new();
    if !args.json {
        println!("| model | precision | threads | device | window | batch | test | t/s |");
        println!("|---|---|---|---|---|---|---|---|");
    }
    for (n_depth, n_prompt, n_gen) in tests {
        let needed = [n_depth, n_prompt, n_gen, 1]
            .into_iter()
            .try_fold(0usize, usize::checked_add);
        match needed {
            Some(needed) if needed <= n_ctx => {}
            _ => bail!("test needs {n_depth} + {n_prompt} + {n_gen} positions but the model's context is {n_ctx}"),
        }
        let needed = n_depth + n_prompt + n_gen + 1;
        let window = match (on_artifacts, args.window) {
            (_, Some(w)) if w < needed => {
                bail!("test needs {needed} positions but --window is {w}")
            }
            (_, Some(w)) => Some(w),
            (true, None) => {
                let ladder = WindowLadder::default_for(n_ctx);
                Some(ladder.windows()[ladder.rung_for(needed)?])
            }
            (false, None) => None,
        };
        // The artifact path runs the static artifacts of one window; the native path the
        // engine's mixed passes on the default ladder.
        let config = match window {
            Some(w) => EngineConfig {
                static_shapes: true,
                ..single_user(
                    WindowLadder::new(vec![w], n_ctx)?,
                    args.prefill_chunk.min(w),
                    args.batch,
                    speculative,
                )
            },
            None => single_user(
                WindowLadder::default_for(n_ctx),
                pyramid_model::MAX_PASS_TOKENS.min(n_ctx),
                args.batch,
                speculative,
            ),
        };
        let chunk = config.pyramid.prefill_chunk;
        let mut engine = route.engine(
            &loaded,
            EngineConfig {
                max_sessions: 2 * args.batch,
                ..config
            },
        )?;
        let cell_qualified = match (&qualifier, window) {
            (Some(q), Some(w)) => Some(match qualified.get(&w) {
                Some(&v) => v,
                None => {
                    let v = q.check(&route, &loaded, w)?.valid;
                    qualified.insert(w, v);
                    v
                }
            }),
            _ => None,
        };
        let test = (n_depth, n_prompt, n_gen);
        run_once(&mut engine, &loaded, args.batch, test, 0, speculation)?; // warm-up
                                                                           // Batch sizes the warm-up asked for compile in the background: wait for them.
        engine.pyramid().join_background();
        let drafts_before = engine.stats().speculative;
        let pyramid = engine.stats().pyramid;
        let compile_ms = window.map(|_| pyramid.compile_ms);
        let store_load_ms = window.map(|_| pyramid.store_load_ms);
        let samples_ts: Vec<f64> = (0..args.repetitions)
            .map(|rep| {
                run_once(
                    &mut engine,
                    &loaded,
                    args.batch,
                    test,
                    rep as u64 + 1,
                    speculation,
                )
                .map(|t| t.tokens as f64 / t.seconds)
            })
            .collect::<Result<_>>()?;
        // Every request samples at least once, so the timed repetitions ran passes.
        let tokens_per_pass = engine
            .stats()
            .speculative
            .since(&drafts_before)
            .tokens_per_pass();
        let audit = route.audit_of(&engine);
        let Stat {
            mean: avg_ts,
            sd: stddev_ts,
            ..
        } = Stat::of(&samples_ts);
        let mut test = if n_prompt > 0 {
            format!("pp{n_prompt}")
        } else {
            format!("tg{n_gen}")
        };
        if n_depth > 0 {
            test.push_str(&format!(" @ d{n_depth}"));
        }
        let rate = |prefill_per_token: Option<f64>, decode_step: Option<f64>| {
            let seconds = if n_prompt > 0 {
                prefill_per_token
            } else {
                decode_step
            };
            seconds.map(|s| 1.0 / s)
        };
        let placed = placement.as_ref().filter(|_| args.batch == 1);
        // A split prefill's plan predicts its chunks' layer tasks (a padded last chunk
        // costs a whole one), not the embedding or the output head.
        let split_plan = if n_prompt > 0 && args.batch == 1 {
            route.split_plan(chunk)?
        } else {
            None
        };
        let predicted_ts = match &split_plan {
            Some(plan) => {
                Some(n_prompt as f64 / (n_prompt.div_ceil(chunk) as f64 * plan.predicted))
            }
            None => placed.and_then(|p| rate(Some(p.prefill_per_token), Some(p.decode_step))),
        };
        // The levels' figures are the placed devices', not a split's.
        let predicted_ts_by_level = placed
            .filter(|_| split_plan.is_none())
            .into_iter()
            .flat_map(|p| &p.by_level)
            .filter_map(|f| Some((f.level.title(), rate(f.prefill_per_token, f.decode_step)?)))
            .collect();
        let record = Record {
            predicted_ts,
            predicted_ts_by_level,
            split_plan,
            model: loaded.name.clone(),
            test,
            n_prompt,
            n_gen,
            n_depth,
            batch: args.batch,
            threads: loaded.pool.n_threads(),
            precision: loaded.model.precision.to_string(),
            kv: loaded.kv_type.to_string(),
            attention: loaded.model.attention.to_string(),
            isa: isa::active().name(),
            device: route.name(),
            window,
            compile_ms,
            store_load_ms,
            route: audit,
            qualified: cell_qualified,
            synthetic: loaded.synthetic,
            speculative: speculation.as_str(),
            tokens_per_pass,
            avg_ts,
            stddev_ts,
            samples_ts,
        };
        if !args.json {
            let mut device = if record.route.flagged() {
                format!(
                    "{} (ran elsewhere: {})",
                    record.device,
                    record.route.describe()
                )
            } else {
                record.device.clone()
            };
            if record.synthetic {
                device.push_str(" (synthetic weights)");
            }
            if record.qualified == Some(false) {
                device.push_str(" UNQUALIFIED: wrong tokens, speed not comparable");
            }
            let predicted = record
                .predicted_ts
                .map_or(String::new(), |p| format!(" (predicted {p:.2})"));
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {:.2} ± {:.2}{predicted} |",
                record.model,
                record.precision,
                record.threads,
                device,
                record.window.map_or("-".to_string(), |w| w.to_string()),
                record.batch,
                record.test,
                avg_ts,
                stddev_ts
            );
        }
        records.push(record);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&records)?);
    }
    Ok(())
}
