//! `pyramid bench`: prefill (pp) and decode (tg) throughput in llama-bench's vocabulary.
//!
//! Prompts are random token ids (as llama-bench uses), so the figures measure the engine,
//! not the text. Each test runs once untimed to warm caches, then `-r` timed repetitions.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use pyramid_kernels::isa;
use pyramid_runtime::{step_batch, Sampler, SamplerConfig, Scratch, Session};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::loader::{Loaded, ModelArgs};

#[derive(Args, Debug)]
pub struct BenchArgs {
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
    /// Print a JSON list of records instead of a table.
    #[arg(long)]
    pub json: bool,
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
    isa: &'static str,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ts: Vec<f64>,
}

fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.random_range(0..n_vocab as u32))
        .collect()
}

/// Seconds for one run of the test: prefill `n_prompt` tokens, or decode `n_gen` tokens,
/// in each of `batch` sequences, after `n_depth` untimed tokens each.
fn run_once(
    loaded: &Loaded,
    batch: usize,
    n_depth: usize,
    n_prompt: usize,
    n_gen: usize,
    seed: u64,
) -> Result<f64> {
    let n_vocab = loaded.model.config.n_vocab;
    let pool = &loaded.pool;
    let mut sessions: Vec<Session> = (0..batch)
        .map(|_| {
            Session::with_kv_type(
                loaded.model.clone(),
                n_depth + n_prompt + n_gen + 1,
                loaded.kv_type,
            )
        })
        .collect();
    let mut scratch = Scratch::default();
    let seq_seed = |b: usize, what: u64| seed * 1_000 + b as u64 * 10 + what;
    let mut step = |sessions: &mut [Session], tokens: &[Vec<u32>]| -> Result<Vec<Vec<f32>>> {
        let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
        let slices: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
        Ok(step_batch(pool, &mut refs, &slices, &mut scratch)?)
    };
    if n_depth > 0 {
        let depth: Vec<Vec<u32>> = (0..batch)
            .map(|b| random_tokens(n_depth, n_vocab, seq_seed(b, 0)))
            .collect();
        step(&mut sessions, &depth)?;
    }
    if n_prompt > 0 {
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|b| random_tokens(n_prompt, n_vocab, seq_seed(b, 1)))
            .collect();
        let start = Instant::now();
        step(&mut sessions, &prompts)?;
        return Ok(start.elapsed().as_secs_f64());
    }
    let mut sampler = Sampler::new(SamplerConfig::greedy())?;
    let mut tokens: Vec<Vec<u32>> = (0..batch)
        .map(|b| random_tokens(1, n_vocab, seq_seed(b, 2)))
        .collect();
    let start = Instant::now();
    for _ in 0..n_gen {
        let logits = step(&mut sessions, &tokens)?;
        for (t, mut l) in tokens.iter_mut().zip(logits) {
            t[0] = sampler.sample(&mut l, &[]);
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (xs.len() - 1) as f64
    } else {
        0.0
    };
    (mean, var.sqrt())
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.repetitions == 0 {
        bail!("-r/--repetitions must be at least 1");
    }
    if args.batch == 0 {
        bail!("-b/--batch must be at least 1");
    }
    let loaded = args.model.load()?;
    let n_ctx = loaded.model.config.n_ctx_train;
    let mut tests = Vec::new();
    for &d in &args.n_depth {
        tests.extend(args.n_prompt.iter().filter(|&&p| p > 0).map(|&p| (d, p, 0)));
        tests.extend(args.n_gen.iter().filter(|&&g| g > 0).map(|&g| (d, 0, g)));
    }
    if tests.is_empty() {
        bail!("nothing to measure: give a positive -p or -n");
    }
    let mut records = Vec::new();
    if !args.json {
        println!("| model | precision | threads | isa | batch | test | t/s |");
        println!("|---|---|---|---|---|---|---|");
    }
    for (n_depth, n_prompt, n_gen) in tests {
        let needed = [n_depth, n_prompt, n_gen, 1]
            .into_iter()
            .try_fold(0usize, usize::checked_add);
        match needed {
            Some(needed) if needed <= n_ctx => {}
            _ => bail!("test needs {n_depth} + {n_prompt} + {n_gen} positions but the model's context is {n_ctx}"),
        }
        let n_tokens = (n_prompt + n_gen) * args.batch;
        run_once(&loaded, args.batch, n_depth, n_prompt, n_gen, 0)?; // warm-up
        let samples_ts: Vec<f64> = (0..args.repetitions)
            .map(|rep| {
                run_once(
                    &loaded,
                    args.batch,
                    n_depth,
                    n_prompt,
                    n_gen,
                    rep as u64 + 1,
                )
                .map(|s| n_tokens as f64 / s)
            })
            .collect::<Result<_>>()?;
        let (avg_ts, stddev_ts) = mean_sd(&samples_ts);
        let mut test = if n_prompt > 0 {
            format!("pp{n_prompt}")
        } else {
            format!("tg{n_gen}")
        };
        if n_depth > 0 {
            test.push_str(&format!(" @ d{n_depth}"));
        }
        let record = Record {
            model: loaded.name.clone(),
            test,
            n_prompt,
            n_gen,
            n_depth,
            batch: args.batch,
            threads: loaded.pool.n_threads(),
            precision: loaded.model.precision.to_string(),
            kv: loaded.kv_type.to_string(),
            isa: isa::active().name(),
            avg_ts,
            stddev_ts,
            samples_ts,
        };
        if !args.json {
            println!(
                "| {} | {} | {} | {} | {} | {} | {:.2} ± {:.2} |",
                record.model,
                record.precision,
                record.threads,
                record.isa,
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
