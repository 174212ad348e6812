//! `pyramid bench matrix | check | report | peers`: the evidence harness's commands.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use pyramid_bench::energy::{self, EnergyReport, Powercap};
use pyramid_bench::matrix::{read_samples, remaining, stat, MatrixConfig, Sample};
use pyramid_bench::report;
use pyramid_bench::results::{
    check, commit_of, replace_readme_section, utc_now, Agreement, Cell, Machine, Provenance,
    ResultsFile,
};
use pyramid_engine::replay::rss;
use pyramid_kernels::isa;
use pyramid_model::synthetic::SyntheticSpec;
use pyramid_model::{KvCache, KvType, Precision, Segment};
use pyramid_runtime::{argmax, prefill_chunked, ArtifactShape, Executable};

use rand::{Rng, SeedableRng};

use super::qualify::Qualifier;
use crate::loader::{Loaded, ModelArgs};
use crate::route::{Route, RouteArgs};

#[derive(Subcommand, Debug)]
pub enum BenchAction {
    /// Measure every cell of a matrix (models × precisions × windows × routes × batches).
    Matrix(MatrixArgs),
    /// Validate a results file (and that the README quotes only verified figures).
    Check(CheckArgs),
    /// Render Markdown tables and SVG/PNG charts from a results file, and the README section.
    Report(ReportArgs),
    /// Add a side-by-side run of scripts/peers/bench-peers.sh (measured here, from a
    /// committed tree) to a results file.
    Peers(PeersArgs),
}

#[derive(Args, Debug)]
pub struct PeersArgs {
    /// The JSON file bench-peers.sh wrote (--out).
    pub run: PathBuf,
    #[arg(long, default_value = "benchmarks/latest.json")]
    pub results: PathBuf,
}

#[derive(Args, Debug)]
pub struct MatrixArgs {
    /// The matrix, as TOML (see `pyramid_bench::matrix::MatrixConfig`).
    #[arg(long)]
    pub config: PathBuf,
    /// The results file the measured cells join (replacing cells with the same key).
    #[arg(long, default_value = "benchmarks/latest.json")]
    pub results: PathBuf,
    /// Samples measured so far, one JSON line each; a rerun resumes from them.
    #[arg(long)]
    pub samples: Option<PathBuf>,
    /// Powercap root (default: PYRAMID_POWERCAP_ROOT, else /sys/class/powercap).
    #[arg(long)]
    pub powercap_root: Option<PathBuf>,
    /// Seconds of idle measured for the energy baseline.
    #[arg(long, default_value_t = 2.0)]
    pub idle_seconds: f64,
    /// Worker threads (default: one per core).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
}

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[arg(long, default_value = "benchmarks/latest.json")]
    pub results: PathBuf,
    /// The README whose performance section must be the rendered one.
    #[arg(long, default_value = "README.md")]
    pub readme: PathBuf,
    /// Check the results file alone.
    #[arg(long, conflicts_with = "readme")]
    pub no_readme: bool,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    #[arg(long, default_value = "benchmarks/latest.json")]
    pub results: PathBuf,
    /// Where REPORT.md and the charts go.
    #[arg(long, default_value = "docs/bench")]
    pub out_dir: PathBuf,
    /// A README whose generated section is rewritten.
    #[arg(long, default_value = "README.md")]
    pub readme: PathBuf,
    /// Leave every README as it is.
    #[arg(long, conflicts_with = "readme")]
    pub no_readme: bool,
}

pub fn run(action: BenchAction) -> Result<()> {
    match action {
        BenchAction::Matrix(args) => matrix(args),
        BenchAction::Check(args) => check_cmd(args),
        BenchAction::Report(args) => report_cmd(args),
        BenchAction::Peers(args) => peers_cmd(args),
    }
}

fn peers_cmd(args: PeersArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.run)
        .with_context(|| format!("reading {}", args.run.display()))?;
    let here = Machine::detect(isa::active().name());
    let comparisons = pyramid_bench::peers::comparisons(&text, &here)
        .with_context(|| format!("{} cannot be verified", args.run.display()))?;
    if comparisons.is_empty() {
        bail!(
            "{} has no test that any engine completed",
            args.run.display()
        );
    }
    let provenance = comparisons[0]
        .provenance
        .clone()
        .expect("set by comparisons");
    let mut results = read_results(&args.results)?;
    let n = comparisons.len();
    results.merge_peers(comparisons);
    let history = save_results(&args.results, &results, &provenance)?;
    println!(
        "{n} side-by-side tests added to {} (history: {})",
        args.results.display(),
        history.display()
    );
    Ok(())
}

/// This machine, commit and command line, for what this run measures.
pub(crate) fn provenance_here() -> Provenance {
    Provenance {
        machine: Machine::detect(isa::active().name()),
        commit: commit_of(Path::new(".")).unwrap_or_else(|| "unknown".to_string()),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        date: utc_now(),
    }
}

/// Writes the results file and its dated copy under `history/` beside it (one per day
/// and commit, so each engine version's figures stay on record); returns the copy's path.
pub(crate) fn save_results(
    path: &Path,
    results: &ResultsFile,
    provenance: &Provenance,
) -> Result<std::path::PathBuf> {
    let text = serde_json::to_string_pretty(results)?;
    write_atomically(path, &text)?;
    let history = path
        .parent()
        .unwrap_or(Path::new("."))
        .join("history")
        .join(format!(
            "{}-{}.json",
            &provenance.date[..10],
            &provenance.commit[..provenance.commit.len().min(10)]
        ));
    write_atomically(&history, &text)?;
    Ok(history)
}

pub(crate) fn read_results(path: &Path) -> Result<ResultsFile> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .with_context(|| format!("{} is not a results file", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ResultsFile::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Writes `text` to `path` through a temporary file, so a crash never leaves half a file.
pub(crate) fn write_atomically(path: &Path, contents: impl AsRef<[u8]>) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn check_cmd(args: CheckArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.results)
        .with_context(|| format!("reading {}", args.results.display()))?;
    let file = read_results(&args.results)?;
    let readme = if args.no_readme {
        None
    } else {
        Some(
            std::fs::read_to_string(&args.readme)
                .with_context(|| format!("reading {}", args.readme.display()))?,
        )
    };
    let section = report::readme_section(&file);
    let problems = check(&text, readme.as_deref().map(|r| (r, section.as_str())));
    if problems.is_empty() {
        println!(
            "{}: {} verified cells, {} replay runs and {} side-by-side tests with provenance, {} unverified figures kept apart; README consistent",
            args.results.display(),
            file.verified.len(),
            file.replays.len(),
            file.peers.len(),
            file.unverified.len()
        );
        return Ok(());
    }
    for p in &problems {
        eprintln!("{p}");
    }
    bail!(
        "{} problem(s) in {}",
        problems.len(),
        args.results.display()
    )
}

fn report_cmd(args: ReportArgs) -> Result<()> {
    let file = read_results(&args.results)?;
    if file.verified.is_empty() && file.replays.is_empty() && file.peers.is_empty() {
        bail!(
            "{} has no verified figures to report",
            args.results.display()
        );
    }
    let charts = report::charts(&file);
    let mut png_skipped = None;
    for chart in &charts {
        let path = args.out_dir.join(&chart.name);
        write_atomically(&path.with_extension("svg"), &chart.svg)?;
        match report::png_of_svg(&chart.svg) {
            Ok(png) => write_atomically(&path.with_extension("png"), png)?,
            Err(e) => png_skipped = Some(e),
        }
    }
    if let Some(e) = png_skipped {
        eprintln!("PNG charts not written: {e}");
    }
    write_atomically(
        &args.out_dir.join("REPORT.md"),
        report::markdown(&file, Some(".")),
    )?;
    if !args.no_readme {
        let readme = std::fs::read_to_string(&args.readme)
            .with_context(|| format!("reading {}", args.readme.display()))?;
        let updated = replace_readme_section(&readme, &report::readme_section(&file))
            .with_context(|| {
                format!(
                    "{} has no generated section ({} … {})",
                    args.readme.display(),
                    pyramid_bench::results::README_BEGIN,
                    pyramid_bench::results::README_END
                )
            })?;
        write_atomically(&args.readme, &updated)?;
    }
    println!(
        "wrote {} and {} chart(s)",
        args.out_dir.join("REPORT.md").display(),
        charts.len()
    );
    Ok(())
}

/// What a matrix run keeps between cells: loaded models, routes, compiled artifacts and
/// qualification verdicts.
#[derive(Default)]
struct Contexts {
    models: HashMap<(String, String), Loaded>,
    qualifiers: HashMap<(String, String), Qualifier>,
    routes: HashMap<(String, String, String), Route>,
    artifacts: HashMap<(String, String, String, usize, usize), Artifacts>,
    qualified: HashMap<(String, String, String, usize), (bool, Agreement)>,
}

fn matrix(args: MatrixArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let config = MatrixConfig::parse(&text)?;
    let cells = config.cells();
    if cells.is_empty() {
        bail!("no cell fits: every window is smaller than n_prompt + n_gen");
    }
    for key in &cells {
        if Precision::parse(&key.precision).is_none() {
            bail!(
                "unknown precision '{}' in {}",
                key.precision,
                args.config.display()
            );
        }
    }
    let kv =
        KvType::parse(&config.kv).with_context(|| format!("unknown kv type '{}'", config.kv))?;
    let samples_path = args
        .samples
        .clone()
        .unwrap_or_else(|| args.results.with_extension("samples.jsonl"));
    let done = read_samples(&samples_path)?;
    let todo = remaining(&config, &done);

    let powercap = Powercap::open(&energy::root(args.powercap_root.as_deref()));
    let baseline = match &powercap {
        Ok(pc) => {
            let before = pc.read().map_err(anyhow::Error::msg)?;
            std::thread::sleep(Duration::from_secs_f64(args.idle_seconds));
            let after = pc.read().map_err(anyhow::Error::msg)?;
            Some(pc.baseline(&before, &after, args.idle_seconds))
        }
        Err(_) => None,
    };

    let bar = ProgressBar::new(todo.len() as u64).with_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} samples, {elapsed} (eta {eta}) {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    if !done.is_empty() {
        bar.println(format!(
            "resuming: {} samples already in {}",
            done.len(),
            samples_path.display()
        ));
    }
    if let Some(dir) = samples_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut samples_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&samples_path)
        .with_context(|| format!("opening {}", samples_path.display()))?;
    let mut ctx = Contexts::default();
    let mut warmed = std::collections::HashSet::new();
    for (c, repetition) in todo {
        let key = &cells[c];
        bar.set_message(format!(
            "{} {} w{} {}",
            key.model,
            key.precision,
            key.window,
            key.route()
        ));
        let model_key = (key.model.clone(), key.precision.clone());
        if !ctx.models.contains_key(&model_key) {
            let model_args = ModelArgs {
                model: key.model.clone(),
                threads: args.threads,
                precision_arg: Some(Precision::parse(&key.precision).expect("checked above")),
                kv: Some(kv),
                attention: None,
                chat_template: None,
            };
            // The f32 model serves qualification and OpenVINO's graphs; synthetic models
            // need it only for the latter.
            let needs_f32 = !key.model.starts_with(crate::loader::SYNTHETIC_PREFIX)
                || config.routes.iter().any(|r| r.contains("ov:"));
            let loaded = model_args.load_keeping_f32(needs_f32)?;
            if !loaded.synthetic {
                let n_ctx = loaded.model.config.n_ctx_train;
                let q = Qualifier::new(&loaded, &[], Some(3), 16, n_ctx)?;
                ctx.qualifiers.insert(model_key.clone(), q);
            }
            ctx.models.insert(model_key.clone(), loaded);
        }
        let loaded = &ctx.models[&model_key];
        let route_key = (key.model.clone(), key.precision.clone(), key.route());
        if !ctx.routes.contains_key(&route_key) {
            let route_args =
                RouteArgs::for_stages(key.prefill_device.clone(), key.decode_device.clone());
            let route = route_args.build(&key.model, loaded, loaded.f32_model.as_ref())?;
            ctx.routes.insert(route_key.clone(), route);
        }
        let route = &ctx.routes[&route_key];
        let art_key = (
            key.model.clone(),
            key.precision.clone(),
            key.route(),
            key.window,
            key.batch,
        );
        if !ctx.artifacts.contains_key(&art_key) {
            let chunk = crate::route::DEFAULT_PREFILL_CHUNK.min(key.window);
            let a = Artifacts::compile(route, chunk, key.batch, key.window)?;
            ctx.artifacts.insert(art_key.clone(), a);
        }
        let artifacts = &ctx.artifacts[&art_key];
        let q_key = (
            key.model.clone(),
            key.precision.clone(),
            key.route(),
            key.window,
        );
        // Synthetic models have no qualifier: their tokens mean nothing.
        if let (false, Some(qualifier)) = (
            ctx.qualified.contains_key(&q_key),
            ctx.qualifiers.get(&model_key),
        ) {
            let result = qualifier.check(route, loaded, key.window)?;
            let agreement = result.agreement(qualifier.max_tokens());
            ctx.qualified
                .insert(q_key.clone(), (result.valid, agreement));
        }
        if warmed.insert(c) {
            for w in 0..config.warmup {
                run_sample(
                    loaded,
                    artifacts,
                    key.batch,
                    key.n_prompt,
                    key.n_gen,
                    1_000 + w as u64,
                )?;
            }
        }
        rss::reset_peak();
        let before = powercap.as_ref().ok().map(|pc| (pc.read(), Instant::now()));
        let timing = run_sample(
            loaded,
            artifacts,
            key.batch,
            key.n_prompt,
            key.n_gen,
            repetition as u64,
        )?;
        let energy = match (&powercap, before, &baseline) {
            (Ok(pc), Some((Ok(b), t0)), Some(base)) => match pc.read() {
                Ok(a) => {
                    EnergyReport::Measured(pc.energy(&b, &a, t0.elapsed().as_secs_f64(), base))
                }
                Err(reason) => EnergyReport::Unavailable(reason),
            },
            (Err(reason), _, _) => EnergyReport::Unavailable(reason.clone()),
            (Ok(_), Some((Err(reason), _)), _) => EnergyReport::Unavailable(reason),
            _ => EnergyReport::Unavailable("no idle baseline".to_string()),
        };
        let sample = Sample {
            key: key.clone(),
            repetition,
            ttft_ms: timing.ttft_ms,
            prefill_tok_s: timing.prefill_tok_s,
            decode_tok_s: timing.decode_tok_s,
            e2e_ms: timing.e2e_ms,
            compile_ms: artifacts.compile_ms,
            peak_rss_bytes: rss::peak(),
            energy,
            prefill_executed: artifacts.prefill.executing_device(),
            decode_executed: artifacts.decode.executing_device(),
            qualified: ctx.qualified.get(&q_key).map(|q| q.0),
            agreement: ctx.qualified.get(&q_key).map(|q| q.1),
        };
        writeln!(samples_file, "{}", serde_json::to_string(&sample)?)?;
        samples_file.flush()?;
        bar.set_message(format!(
            "{} {} w{} {}: {:.1} tok/s",
            key.model,
            key.precision,
            key.window,
            key.route(),
            sample.decode_tok_s
        ));
        bar.inc(1);
    }
    bar.finish_and_clear();

    let all = read_samples(&samples_path)?;
    let provenance = provenance_here();
    let measured: Vec<Cell> = cells
        .iter()
        .filter_map(|key| {
            let s: Vec<&Sample> = all.iter().filter(|s| &s.key == key).collect();
            (s.len() >= config.repetitions).then(|| aggregate(key, &s, &provenance))
        })
        .collect();
    let mut results = read_results(&args.results)?;
    let n = measured.len();
    results.merge(measured);
    let history = save_results(&args.results, &results, &provenance)?;
    std::fs::remove_file(&samples_path).ok();
    println!(
        "{n} cells measured into {} (history: {})",
        args.results.display(),
        history.display()
    );
    print!("{}", report::markdown(&results, None));
    Ok(())
}

fn aggregate(
    key: &pyramid_bench::results::CellKey,
    s: &[&Sample],
    provenance: &Provenance,
) -> Cell {
    let synthetic = key.model.starts_with(crate::loader::SYNTHETIC_PREFIX);
    let last = s.last().expect("at least one sample");
    let tokens = key.batch * (key.n_prompt + key.n_gen);
    let as_requested =
        pyramid_runtime::executed_as_requested(&key.prefill_device, &last.prefill_executed)
            && pyramid_runtime::executed_as_requested(&key.decode_device, &last.decode_executed);
    Cell {
        key: key.clone(),
        synthetic,
        parameters: key
            .model
            .strip_prefix(crate::loader::SYNTHETIC_PREFIX)
            .and_then(SyntheticSpec::published)
            .map(|spec| spec.n_params() as u64),
        prefill_executed: last.prefill_executed.clone(),
        decode_executed: last.decode_executed.clone(),
        as_requested,
        qualified: last.qualified,
        agreement: last.agreement,
        ttft_ms: stat(s, |x| x.ttft_ms),
        prefill_tok_s: stat(s, |x| x.prefill_tok_s),
        decode_tok_s: stat(s, |x| x.decode_tok_s),
        decode_ms_per_token: stat(s, |x| 1e3 / x.decode_tok_s.max(1e-9) * key.batch as f64),
        e2e_ms: stat(s, |x| x.e2e_ms),
        compile_ms: last.compile_ms,
        peak_rss_bytes: s.iter().filter_map(|x| x.peak_rss_bytes).max(),
        joules_per_token: last.energy.joules_per_token(tokens),
        energy: last.energy.clone(),
        provenance: Some(provenance.clone()),
    }
}

struct Timing {
    ttft_ms: f64,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    e2e_ms: f64,
}

/// One repetition: each sequence's prompt prefilled in chunks, then `n_gen` greedy steps
/// of the whole batch. TTFT is the first sequence's prefill to its first token.
fn run_sample(
    loaded: &Loaded,
    artifacts: &Artifacts,
    batch: usize,
    n_prompt: usize,
    n_gen: usize,
    seed: u64,
) -> Result<Timing> {
    let n_vocab = loaded.model.config.n_vocab;
    let pool = &loaded.pool;
    let mut caches = artifacts.new_caches(loaded, batch);
    let mut logits = Vec::new();
    let mut tokens = Vec::with_capacity(batch);
    let start = Instant::now();
    let mut ttft_ms = 0.0;
    for (b, kv) in caches.iter_mut().enumerate() {
        let prompt = random_tokens(n_prompt, n_vocab, seed * 100 + b as u64);
        prefill_chunked(artifacts.prefill.as_ref(), pool, &prompt, kv, &mut logits)?;
        tokens.push([argmax(&logits)]);
        if b == 0 {
            ttft_ms = start.elapsed().as_secs_f64() * 1e3;
        }
    }
    let prefill_s = start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    artifacts.decode_greedy(loaded, &mut caches, &mut tokens, n_gen, &mut logits)?;
    let decode_s = decode_start.elapsed().as_secs_f64();
    Ok(Timing {
        ttft_ms,
        prefill_tok_s: (batch * n_prompt) as f64 / prefill_s.max(1e-9),
        decode_tok_s: (batch * n_gen) as f64 / decode_s.max(1e-9),
        e2e_ms: (prefill_s + decode_s) * 1e3,
    })
}

/// A test's compiled artifacts: prefill and decode for one window.
pub(crate) struct Artifacts {
    pub window: usize,
    pub prefill: Arc<dyn Executable>,
    pub decode: Arc<dyn Executable>,
    pub compile_ms: f64,
}

impl Artifacts {
    pub fn compile(route: &Route, chunk: usize, batch: usize, window: usize) -> Result<Self> {
        let start = Instant::now();
        let prefill = route
            .backend
            .compile(ArtifactShape::Prefill { chunk, window })?;
        let decode = route
            .backend
            .compile(ArtifactShape::Decode { batch, window })?;
        Ok(Self {
            window,
            prefill,
            decode,
            compile_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// An empty KV cache of the artifacts' window for each of `batch` sequences.
    pub fn new_caches(&self, loaded: &Loaded, batch: usize) -> Vec<KvCache> {
        (0..batch)
            .map(|_| loaded.model.new_kv_cache_of(self.window, loaded.kv_type))
            .collect()
    }

    /// `n_gen` greedy decode steps of the whole batch, each sequence starting from its
    /// token in `tokens` (left holding its last one).
    pub fn decode_greedy(
        &self,
        loaded: &Loaded,
        caches: &mut [KvCache],
        tokens: &mut [[u32; 1]],
        n_gen: usize,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let n_vocab = loaded.model.config.n_vocab;
        for _ in 0..n_gen {
            let mut segments: Vec<Segment<'_>> = caches
                .iter_mut()
                .zip(tokens.iter())
                .map(|(kv, t)| Segment::new(t, kv))
                .collect();
            self.decode.run(&loaded.pool, &mut segments, logits)?;
            drop(segments);
            for (t, row) in tokens.iter_mut().zip(logits.chunks_exact(n_vocab)) {
                t[0] = argmax(row);
            }
        }
        Ok(())
    }
}

/// Random prompt ids, as llama-bench uses: the figures measure the engine, not the text.
pub(crate) fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| rng.random_range(0..n_vocab as u32))
        .collect()
}
