//! `pyramid affinity`: how fast each device runs the model at every granularity (an
//! operator inside its block, the operator alone, the block, the stage, the whole model),
//! each cell checked against the native f32 computation; tables with device ratios, a
//! chart and a results file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use pyramid_affinity::profile::Executor;
use pyramid_affinity::report::AffinityReport;
use pyramid_affinity::timing::{FitPlan, WallClock};
use pyramid_affinity::{measure, Plan, Stage, Target};
use pyramid_bench::report::png_of_svg;
use pyramid_model::{KvType, Precision};
use pyramid_openvino::{OutlierChannels, OvBackend, OvOptions, WeightFormat};
use pyramid_registry::DEFAULT_MODEL;

use super::bench_matrix::{provenance_here, write_atomically};
use crate::loader::{parse_precision, Loaded, ModelArgs};
use crate::route::{parse_device, Device};

#[derive(Args, Debug)]
pub struct AffinityArgs {
    /// A known model name, a GGUF file or a Hugging Face model directory.
    #[arg(long, short = 'm', default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Native worker threads, and OpenVINO CPU's (default: one per core).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Devices, comma-separated: cpu, ov:CPU, ov:GPU, ov:NPU. Ratios divide the first's
    /// time by each other's (below 1 favours the first).
    #[arg(long, value_delimiter = ',', default_value = "cpu,ov:CPU")]
    pub devices: Vec<String>,
    /// Weight precisions, comma-separated (OpenVINO stores weights in the nearest
    /// format: INT8 and INT4 are weight-only there).
    #[arg(long, value_delimiter = ',', default_value = "f32,int8", value_parser = parse_precision)]
    pub precision: Vec<Precision>,
    /// Stages, comma-separated: prefill (one chunk of --seq rows), decode (one row at
    /// the window); with both, the whole model end to end too.
    #[arg(long, value_delimiter = ',', default_value = "prefill,decode")]
    pub stage: Vec<String>,
    /// Prefill rows, and the end-to-end prompt's length.
    #[arg(long, default_value_t = 512)]
    pub seq: usize,
    /// Positions every cache and graph holds.
    #[arg(long, default_value_t = 1024)]
    pub window: usize,
    /// Greedy tokens of the end-to-end run.
    #[arg(long, default_value_t = 16)]
    pub n_gen: usize,
    /// The decoder block measured (default: the first attending to every position).
    #[arg(long)]
    pub layer: Option<usize>,
    /// Calls in the shorter batch of a fit's trial (the longer has twice as many).
    #[arg(long, default_value_t = 4)]
    pub reps: usize,
    /// Trials per fit: their spread is reported beside each figure.
    #[arg(long, default_value_t = 3)]
    pub trials: usize,
    /// Milliseconds a fit's shorter batch lasts at least (more calls than --reps for
    /// fast ones).
    #[arg(long, default_value_t = 50.0)]
    pub min_batch_ms: f64,
    /// An OpenVINO compile option KEY=VALUE (repeatable).
    #[arg(long = "ov-option", value_name = "KEY=VALUE")]
    pub ov_options: Vec<String>,
    /// Write the results (JSON, invalid cells apart) to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Write the ratio chart to FILE.svg and FILE.png.
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,
    /// Print the results as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: AffinityArgs) -> Result<()> {
    if args.devices.is_empty() || args.precision.is_empty() {
        bail!("--devices and --precision each need at least one entry");
    }
    if args.reps == 0 || args.trials == 0 {
        bail!("--reps and --trials must be at least 1");
    }
    let stages = args
        .stage
        .iter()
        .map(|s| {
            Stage::parse(s)
                .with_context(|| format!("unknown stage '{s}' (expected prefill or decode)"))
        })
        .collect::<Result<Vec<_>>>()?;
    let devices = args
        .devices
        .iter()
        .map(|d| Ok((d.clone(), parse_device(d)?)))
        .collect::<Result<Vec<_>>>()?;
    // One load per precision, each keeping the f32 model the reference and OpenVINO use.
    let loads: Vec<(Precision, Loaded)> = args
        .precision
        .iter()
        .map(|&precision| {
            let model = ModelArgs {
                model: args.model.clone(),
                threads: args.threads,
                precision_arg: Some(precision),
                kv: Some(KvType::F32),
                attention: None,
                chat_template: None,
            };
            Ok((precision, model.load_keeping_f32(true)?))
        })
        .collect::<Result<_>>()?;
    let first = &loads[0].1;
    let reference = first
        .f32_model
        .clone()
        .expect("loaded keeping the f32 model");
    let cfg = &reference.config;
    let layer = match args.layer {
        Some(l) => l,
        None => (0..cfg.n_layer)
            .find(|&l| cfg.layer_window(l).is_none())
            .unwrap_or(0),
    };
    let mut targets = Vec::new();
    for (device, kind) in &devices {
        for (precision, loaded) in &loads {
            let executor = match kind {
                Device::Split(_) => bail!(
                    "{device} is a split prefill, not a device: profile cpu and ov:… apart, and compare the split with `pyramid bench --prefill-device {device}`"
                ),
                Device::Native => Executor::Native {
                    model: &loaded.model,
                    pool: &loaded.pool,
                },
                Device::OpenVino(name) => {
                    let options = OvOptions::for_device(
                        name,
                        Some(first.pool.n_threads()),
                        &args.ov_options,
                    )?
                    .with_outliers(OutlierChannels::of(&loaded.model));
                    let f32_model = loaded.f32_model.as_ref().expect("kept");
                    let format = WeightFormat::for_precision(*precision);
                    Executor::OpenVino(Arc::new(OvBackend::new(
                        Arc::clone(f32_model),
                        name,
                        format,
                        options,
                    )?))
                }
            };
            targets.push(Target {
                device: device.clone(),
                precision: precision.name().to_string(),
                executor,
            });
        }
    }
    let plan = Plan {
        seq: args.seq,
        window: args.window,
        n_gen: args.n_gen,
        layer,
        stages,
        fit: FitPlan {
            k: args.reps,
            trials: args.trials,
            min_batch: args.min_batch_ms.max(0.0) / 1e3,
        },
    };
    let cells = measure(
        &plan,
        &reference,
        &first.pool,
        &targets,
        &mut WallClock::default(),
        &mut |what| eprintln!("measuring {what}"),
    )?;
    let report = AffinityReport::new(
        provenance_here(),
        args.model.clone(),
        cfg.n_layer,
        plan,
        targets
            .iter()
            .map(|t| (t.device.clone(), t.precision.clone()))
            .collect(),
        cells,
    );
    if let Some(path) = &args.out {
        write_atomically(path, serde_json::to_string_pretty(&report)?)?;
    }
    if let Some(path) = &args.chart {
        let svg = report.chart();
        write_atomically(&chart_file(path, "svg"), &svg)?;
        match png_of_svg(&svg) {
            Ok(png) => write_atomically(&chart_file(path, "png"), png)?,
            Err(e) => eprintln!("PNG chart not written: {e}"),
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: block {layer}, prefill {} rows, decode at window {}, end to end {} + {} tokens\n",
            args.model, args.seq, args.window, args.seq, args.n_gen
        );
        print!("{}", report.markdown());
    }
    Ok(())
}

/// `path` with the extension `ext`: appended, so a stem with dots (`affinity-qwen2.5`)
/// keeps them, unless `path` already ends in `.svg` or `.png`.
fn chart_file(path: &Path, ext: &str) -> PathBuf {
    match path.extension().and_then(|e| e.to_str()) {
        Some("svg" | "png") => path.with_extension(ext),
        _ => {
            let mut name = path.as_os_str().to_owned();
            name.push(format!(".{ext}"));
            PathBuf::from(name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_files_keep_dotted_stems() {
        let dotted = Path::new("docs/affinity-qwen2.5-coder-0.5b");
        assert_eq!(
            chart_file(dotted, "svg"),
            Path::new("docs/affinity-qwen2.5-coder-0.5b.svg")
        );
        assert_eq!(chart_file(Path::new("a.svg"), "png"), Path::new("a.png"));
        assert_eq!(chart_file(Path::new("a"), "png"), Path::new("a.png"));
    }
}
