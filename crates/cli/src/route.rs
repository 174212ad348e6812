//! `--device`, `--prefill-device`, `--decode-device`: which backend runs each stage.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use pyramid_affinity::hetero::HeteroBackend;
use pyramid_affinity::predict::Placement;
use pyramid_affinity::report::AffinityReport;
use pyramid_affinity::split::SplitPlan;
use pyramid_engine::{
    Arm, Engine, EngineConfig, PyramidConfig, RouteAudit, Speculation, SpeculativeConfig,
};
use pyramid_model::{KvType, Model, Precision};
use pyramid_openvino::{
    OutlierChannels, OvBackend, OvOptions, StoreKey, WeightFormat, DEFAULT_BUDGET_BYTES,
};
use pyramid_registry::ModelCache;
use pyramid_runtime::{Backend, CpuBackend, RouteBackend, WindowLadder};

use crate::loader::Loaded;

#[derive(Args, Debug, Clone)]
pub struct RouteArgs {
    /// Device for prefill and decode: cpu (the native kernels), or an OpenVINO device:
    /// ov:CPU, ov:GPU, ov:NPU (`pyramid devices` lists what is present).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Device for prefill only (overrides --device).
    #[arg(long)]
    pub prefill_device: Option<String>,
    /// Device for decode only (overrides --device).
    #[arg(long)]
    pub decode_device: Option<String>,
    /// An OpenVINO compile option KEY=VALUE (repeatable), e.g. CACHE_DIR=DIR,
    /// INFERENCE_PRECISION_HINT=f16, INFERENCE_NUM_THREADS=4.
    #[arg(long = "ov-option", value_name = "KEY=VALUE")]
    pub ov_options: Vec<String>,
    /// The profile (`pyramid affinity --out FILE`) a route of `auto` devices is placed
    /// from: each stage on the device the best-predicting level says is fastest. With
    /// `--prefill-device cpu+ov:DEVICE`, it also places the split's layers from the block
    /// figures (profile with the split's threads: `-t 1 --ov-option INFERENCE_NUM_THREADS=1`).
    #[arg(long, value_name = "FILE")]
    pub affinity: Option<PathBuf>,
    /// The `--affinity` file once read: placing an `auto` stage and a split's layers
    /// both read it.
    #[arg(skip)]
    profile: OnceLock<AffinityReport>,
}

/// `--speculative`, `--draft-tokens`, `--draft-pass-rows`: prompt-lookup speculative
/// decoding.
#[derive(Args, Debug, Clone)]
pub struct SpeculativeArgs {
    /// Decoding with drafts looked up in the conversation's own tokens (ngram), verified
    /// in one pass: the same tokens, fewer passes when the reply repeats its context.
    /// Native route only (static artifacts verify no drafts). Default: ngram, except for
    /// `bench`, whose random prompts measure plain decoding.
    #[arg(long, value_name = "ngram|off")]
    pub speculative: Option<Speculation>,
    /// Draft tokens verified per pass at most.
    #[arg(long, default_value_t = SpeculativeConfig::default().max_draft, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub draft_tokens: usize,
    /// Rows (prompt, next and draft tokens) a pass may reach with drafts: beyond it
    /// drafts are cut, the best-accepted sequences' kept first. A pass of many sequences
    /// is bound by its products, where a draft costs a row accepted or not.
    #[arg(long, default_value_t = SpeculativeConfig::default().pass_rows, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub draft_pass_rows: usize,
}

impl SpeculativeArgs {
    /// The mode asked for, or `default`.
    pub fn mode_or(&self, default: Speculation) -> Speculation {
        self.speculative.unwrap_or(default)
    }

    /// The engine's drafts for `mode`: none when off.
    pub fn config(&self, mode: Speculation) -> SpeculativeConfig {
        match mode {
            Speculation::Off => SpeculativeConfig::off(),
            Speculation::Ngram => SpeculativeConfig {
                max_draft: self.draft_tokens,
                pass_rows: self.draft_pass_rows,
                ..SpeculativeConfig::default()
            },
        }
    }

    /// The engine's drafts on `route` (`default` unless `--speculative` says): none on a
    /// route that runs static artifacts, where asking for them is an error.
    pub fn config_on(&self, route: &Route, default: Speculation) -> Result<SpeculativeConfig> {
        if route.backend.runs_mixed_passes() {
            return Ok(self.config(self.mode_or(default)));
        }
        if self.speculative == Some(Speculation::Ngram) {
            bail!(
                "--speculative ngram needs the native route (--device cpu): static artifacts return one row of logits per sequence and cannot verify a draft"
            );
        }
        Ok(SpeculativeConfig::off())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Device {
    Native,
    OpenVino(String),
    /// `cpu+ov:X`: prefill split between the native kernels (one thread) and an OpenVINO
    /// device, (chunk, layer) tasks out of order on both.
    Split(String),
}

pub(crate) fn parse_device(name: &str) -> Result<Device> {
    if let Some(ov) = name.strip_prefix("cpu+") {
        return match parse_device(ov)? {
            Device::OpenVino(device) => Ok(Device::Split(device)),
            _ => {
                bail!("unknown device '{name}': a split prefill is cpu+ov:DEVICE, e.g. cpu+ov:CPU")
            }
        };
    }
    match name {
        "cpu" => Ok(Device::Native),
        _ => match name.strip_prefix("ov:") {
            Some(d) if !d.is_empty() && !d.contains(char::is_whitespace) => {
                Ok(Device::OpenVino(d.to_string()))
            }
            _ => bail!(
                "unknown device '{name}' (expected cpu, ov:CPU, ov:GPU, ov:NPU, or auto with --affinity on run, chat, serve, bench, replay and qualify; `pyramid devices` lists those present)"
            ),
        },
    }
}

/// The backends of a route, built from the loaded model.
pub struct Route {
    pub backend: Arc<dyn Backend>,
    pub prefill: String,
    pub decode: String,
    split: Option<Split>,
}

/// A split prefill's backend, the profile its layers were placed from, and the chunk sizes
/// whose placement has been printed.
struct Split {
    backend: Arc<HeteroBackend>,
    /// The OpenVINO device beside the native kernels, e.g. `CPU`.
    device: String,
    profile: Option<PathBuf>,
    announced: Mutex<Vec<usize>>,
}

/// The `pyramid affinity` results file at `path`, which must profile `model`.
fn read_profile(path: &Path, model: &str) -> Result<AffinityReport> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the affinity profile {}", path.display()))?;
    let profile: AffinityReport = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a `pyramid affinity` results file",
            path.display()
        )
    })?;
    if profile.model != model {
        bail!(
            "{} profiles model '{}', not '{model}': run `pyramid affinity -m {model} --out FILE` first",
            path.display(),
            profile.model
        );
    }
    Ok(profile)
}

impl Route {
    pub fn audit(
        &self,
        prefill_executed: Option<String>,
        decode_executed: Option<String>,
    ) -> RouteAudit {
        RouteAudit::new(
            &self.prefill,
            &self.decode,
            prefill_executed,
            decode_executed,
        )
    }

    /// `cpu`, `ov:CPU`, or `ov:GPU->ov:NPU`.
    pub fn name(&self) -> String {
        if self.prefill == self.decode {
            self.prefill.clone()
        } else {
            format!("{}->{}", self.prefill, self.decode)
        }
    }
}

impl RouteArgs {
    /// Replaces `auto` in `--device`, `--prefill-device` or `--decode-device` by the
    /// device the `--affinity` profile of `model` places that stage on at `precision`,
    /// for `work` (prompt and generated tokens; the profile's own when not known), and
    /// says so on stderr. `None` when no stage is `auto`; an error when `--affinity` is given
    /// to a route with neither an `auto` stage nor a split prefill to place.
    pub fn place(
        &mut self,
        model: &str,
        precision: impl FnOnce() -> Result<Precision>,
        work: Option<(usize, usize)>,
    ) -> Result<Option<Placement>> {
        let auto = |d: Option<&String>| d.is_some_and(|d| d == "auto");
        let device_auto = self.device == "auto";
        let prefill_auto =
            auto(self.prefill_device.as_ref()) || (device_auto && self.prefill_device.is_none());
        let decode_auto =
            auto(self.decode_device.as_ref()) || (device_auto && self.decode_device.is_none());
        if !prefill_auto && !decode_auto {
            let prefill = self.prefill_device.as_ref().unwrap_or(&self.device);
            let splits = matches!(parse_device(prefill), Ok(Device::Split(_)));
            if self.affinity.is_some() && !splits {
                bail!("--affinity places a device of 'auto' or the layers of a split prefill (--prefill-device cpu+ov:DEVICE); this route has neither");
            }
            return Ok(None);
        }
        let Some(path) = &self.affinity else {
            bail!("a device of 'auto' is placed from a profile: give --affinity FILE (written by `pyramid affinity --out FILE`)");
        };
        let profile = self.profile(path, model)?;
        let precision = precision()?;
        let (prompt, n_gen) = work.unwrap_or((profile.plan.seq, profile.plan.n_gen));
        let Some(placement) = profile.place(precision.name(), prompt, n_gen) else {
            bail!(
                "{} has no valid {} stage figures to place the route from (profiled: {})",
                path.display(),
                precision.name(),
                profile
                    .targets
                    .iter()
                    .map(|(d, p)| format!("{d} {p}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        if prefill_auto {
            self.prefill_device = Some(placement.prefill.clone());
        }
        if decode_auto {
            self.decode_device = Some(placement.decode.clone());
        }
        if device_auto {
            // Stages not given explicitly are placed; `device` itself is no longer read.
            self.device = placement.prefill.clone();
        }
        let mut placed = Vec::new();
        if prefill_auto {
            placed.push(format!(
                "prefill on {} ({:.3} ms per prompt token)",
                placement.prefill,
                placement.prefill_per_token * 1e3
            ));
        }
        if decode_auto {
            placed.push(format!(
                "decode on {} ({:.2} ms per step)",
                placement.decode,
                placement.decode_step * 1e3
            ));
        }
        if prefill_auto && decode_auto {
            placed.push(format!(
                "{prompt} + {n_gen} tokens predicted at {:.0} ms",
                placement.predicted * 1e3
            ));
        }
        eprintln!(
            "route auto: {}; from the {} level of {}",
            placed.join(", "),
            placement.level.title(),
            path.display()
        );
        Ok(Some(placement))
    }

    /// Prefill on `prefill` and decode on `decode`, with no OpenVINO options or profile.
    pub fn for_stages(prefill: String, decode: String) -> Self {
        Self {
            device: prefill.clone(),
            prefill_device: Some(prefill),
            decode_device: Some(decode),
            ov_options: Vec::new(),
            affinity: None,
            profile: OnceLock::new(),
        }
    }

    /// The `--affinity` profile at `path`, which must profile `model`; read once (every
    /// caller passes the model named on the command line).
    fn profile(&self, path: &Path, model: &str) -> Result<&AffinityReport> {
        if let Some(profile) = self.profile.get() {
            return Ok(profile);
        }
        let profile = read_profile(path, model)?;
        Ok(self.profile.get_or_init(|| profile))
    }

    fn stages(&self) -> Result<(String, String)> {
        let prefill = self
            .prefill_device
            .clone()
            .unwrap_or_else(|| self.device.clone());
        let decode = self
            .decode_device
            .clone()
            .unwrap_or_else(|| self.device.clone());
        parse_device(&prefill)?;
        parse_device(&decode)?;
        Ok((prefill, decode))
    }

    /// Whether every stage runs on the native backend.
    pub fn is_native(&self) -> Result<bool> {
        let (p, d) = self.stages()?;
        Ok(parse_device(&p)? == Device::Native && parse_device(&d)? == Device::Native)
    }

    /// Builds the route's backend. OpenVINO stages build their graphs from the f32 model
    /// (`f32_model`) with weights stored as `--precision` asks; native stages run the
    /// loaded model. A split prefill with `--affinity` places its layers from the profile
    /// of `model` (as named on the command line).
    pub fn build(
        &self,
        model: &str,
        loaded: &Loaded,
        f32_model: Option<&Arc<Model>>,
    ) -> Result<Route> {
        let (prefill, decode) = self.stages()?;
        if let Device::Split(_) = parse_device(&decode)? {
            bail!("{decode} splits prefill only: give it as --prefill-device, with --decode-device cpu or ov:DEVICE");
        }
        // An OpenVINO backend on `device` (named `name` on the command line).
        let openvino = |device: &str,
                        name: &str,
                        threads: usize,
                        ov_options: &[String]|
         -> Result<OvBackend> {
            if loaded.kv_type != KvType::F32 {
                bail!("OpenVINO stages bind the KV cache in f32: pass --kv f32 with {name}");
            }
            let model = f32_model.expect("an OpenVINO route loads the f32 model");
            // Compiled artifacts are kept across starts, per model, in the pyramid cache.
            let store = StoreKey {
                root: ModelCache::from_env()?.root().join("compiled"),
                model_id: crate::loader::file_model_id(&loaded.path)?,
                budget_bytes: store_budget()?,
            };
            let options = OvOptions::for_device(device, Some(threads), ov_options)?
                .with_store(store)
                .with_outliers(OutlierChannels::of(&loaded.model));
            let format = WeightFormat::for_precision(loaded.model.precision);
            let backend = OvBackend::new(Arc::clone(model), device, format, options)?;
            if let Some(problem) = backend.store_problem() {
                eprintln!("warning: {problem}; {name} compiles its artifacts on every start");
            }
            Ok(backend)
        };
        let mut split = None;
        let mut make = |name: &str| -> Result<Arc<dyn Backend>> {
            Ok(match parse_device(name)? {
                Device::Native => Arc::new(CpuBackend::new(
                    Arc::clone(&loaded.model),
                    loaded.pool.n_threads(),
                )),
                Device::OpenVino(device) => Arc::new(openvino(
                    &device,
                    name,
                    loaded.pool.n_threads(),
                    &self.ov_options,
                )?),
                Device::Split(device) => {
                    // Layers placed from a profile's block figures, or run where free.
                    let costs = match &self.affinity {
                        Some(path) => {
                            let precision = loaded.model.precision.name();
                            let costs = self
                                .profile(path, model)?
                                .split_costs(precision, &format!("ov:{device}"));
                            let costs = costs.map_err(|why| {
                                anyhow!(
                                    "{} has no valid {precision} prefill block figures for both cpu and ov:{device} ({why}): profile them with `pyramid affinity -m {model} --devices cpu,ov:{device} --precision {precision} --stage prefill -t 1 --ov-option INFERENCE_NUM_THREADS=1`",
                                    path.display()
                                )
                            })?;
                            Some(costs)
                        }
                        None => None,
                    };
                    // The native executor takes one core, OpenVINO the others.
                    let threads = loaded.pool.n_threads().saturating_sub(1).max(1);
                    let mut options = vec!["ENABLE_CPU_PINNING=YES".to_string()];
                    if !device.starts_with("CPU") {
                        options.clear();
                    }
                    options.extend(self.ov_options.iter().cloned());
                    let ov = openvino(&device, name, threads, &options)?;
                    let mut hetero = HeteroBackend::new(Arc::clone(&loaded.model), Arc::new(ov));
                    if let Some(costs) = costs {
                        hetero = hetero.with_costs(costs)?;
                    }
                    let hetero = Arc::new(hetero);
                    split = Some(Split {
                        backend: Arc::clone(&hetero),
                        device,
                        profile: self.affinity.clone(),
                        announced: Mutex::default(),
                    });
                    hetero
                }
            })
        };
        let prefill_backend = make(&prefill)?;
        let backend = if prefill == decode {
            prefill_backend
        } else {
            Arc::new(RouteBackend::new(prefill_backend, make(&decode)?)?)
        };
        Ok(Route {
            backend,
            prefill,
            decode,
            split,
        })
    }
}

/// `PYRAMID_STORE_GB`: how much the store of compiled OpenVINO artifacts may hold.
pub const STORE_BUDGET_ENV: &str = "PYRAMID_STORE_GB";

fn store_budget() -> Result<u64> {
    match std::env::var(STORE_BUDGET_ENV) {
        Err(_) => Ok(DEFAULT_BUDGET_BYTES),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(gb) if gb.is_finite() && gb >= 0.0 => Ok((gb * (1u64 << 30) as f64) as u64),
            _ => bail!("{STORE_BUDGET_ENV}={v}: expected a number of GiB, e.g. 20"),
        },
    }
}

/// Prompt tokens per step on a route: a native pass takes the model's whole pass
/// ([`pyramid_model::MAX_PASS_TOKENS`], at most the largest window); static artifacts
/// take `static_chunk`, at most the smallest window.
pub fn prefill_chunk_for(route: &Route, ladder: &WindowLadder, static_chunk: usize) -> usize {
    if route.backend.runs_mixed_passes() {
        pyramid_model::MAX_PASS_TOKENS.min(ladder.largest())
    } else {
        static_chunk.min(ladder.windows()[0])
    }
}

/// The engine settings for one conversation at a time (`run`, `chat`, `qualify`, `bench`):
/// no memory limits beyond the windows, predictive compiles with `pyramid replay`'s
/// margins, drafts as `speculative` says.
pub fn single_user(
    ladder: WindowLadder,
    prefill_chunk: usize,
    max_batch: usize,
    speculative: SpeculativeConfig,
) -> EngineConfig {
    EngineConfig {
        pyramid: PyramidConfig {
            ladder,
            prefill_chunk,
            arm: Arm::Predictive,
            generation_reserve: DEFAULT_GENERATION_RESERVE,
            artifact_budget: usize::MAX,
            margin: PREDICTION_MARGIN,
            first_compile_estimate: FIRST_COMPILE_ESTIMATE,
        },
        max_batch,
        kv_budget: usize::MAX,
        max_sessions: 4,
        static_shapes: false,
        aging: pyramid_engine::DEFAULT_AGING,
        speculative,
    }
}

/// Prefill chunk of static artifacts (and the server's per-step prompt budget) when none is
/// given: on this project's reference machine (2 Zen 4 cores,
/// AVX2 kernels) throughput rises steeply up to 128-token chunks and is within a few
/// percent of whole-prompt prefill beyond; see docs/PYRAMID.md for the measurement.
pub const DEFAULT_PREFILL_CHUNK: usize = 128;

/// Positions a new session's first window keeps free for generation (capped by the
/// request's own `max_tokens`).
pub const DEFAULT_GENERATION_RESERVE: usize = 256;
/// Lead time added to a predicted compile.
pub const PREDICTION_MARGIN: Duration = Duration::from_millis(20);
/// What a compile is assumed to take before one has been measured.
pub const FIRST_COMPILE_ESTIMATE: Duration = Duration::from_millis(50);

impl Route {
    /// The engine core on this route's backend. A split prefill placed from a profile
    /// says on stderr (once per chunk size) where its layers run and what it predicts.
    pub fn engine(&self, loaded: &Loaded, config: EngineConfig) -> Result<Engine> {
        let chunk = config.pyramid.prefill_chunk;
        if let (Some(split), Some(plan)) = (&self.split, self.split_plan(chunk)?) {
            let mut announced = split.announced.lock().unwrap_or_else(|e| e.into_inner());
            if !announced.contains(&chunk) {
                announced.push(chunk);
                let profile = split.profile.as_deref().unwrap_or(Path::new("?"));
                eprintln!(
                    "split prefill: {}; predicted {:.1} ms per {chunk}-token chunk ({:.1} ms with any layer on either), from the block level of {}",
                    plan.describe("cpu", &format!("ov:{}", split.device)),
                    plan.predicted * 1e3,
                    plan.predicted_either * 1e3,
                    profile.display()
                );
            }
        }
        Ok(Engine::new(
            Arc::clone(&self.backend),
            crate::loader::file_model_id(&loaded.path)?,
            loaded.kv_type,
            config,
        )?)
    }

    /// Where a split prefill's layers run for `chunk`-token chunks and what that is
    /// predicted to take; `None` unless the route splits prefill by a profile.
    pub fn split_plan(&self, chunk: usize) -> Result<Option<SplitPlan>> {
        let Some(split) = &self.split else {
            return Ok(None);
        };
        Ok(split.backend.plan_for(chunk).transpose()?)
    }

    /// The route audit of what `engine` ran.
    pub fn audit_of(&self, engine: &Engine) -> RouteAudit {
        let stats = engine.pyramid().stats();
        self.audit(stats.prefill_executed_on, stats.decode_executed_on)
    }
}
