//! Turning `--model NAME|PATH` into a loaded model and tokenizer.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use pyramid_kernels::ThreadPool;
use pyramid_model::linear::CALIBRATION_TEXT;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Attention, Calibration, Checkpoint, KvType, Model, Precision};
use pyramid_registry::{HfHub, HfModelId, IndicatifProgress, ModelCache, DEFAULT_MODEL, HF_PREFIX};
use pyramid_tokenizer::{ChatTemplate, Tokenizer};

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A known model name (see `pyramid models`), a path to a GGUF file (a split model's
    /// first part) or to a Hugging Face model directory (config.json, *.safetensors,
    /// tokenizer.json), a Hugging Face id `hf:ORG/REPO[:QUANT|/FILE]` (downloaded into
    /// the Hugging Face cache on first use), or `synthetic:SHAPE` (random weights shaped
    /// like qwen2.5-0.5b/1.5b/3b/7b or llama-3.2-1b/3b: for speed scaling only).
    #[arg(long, short = 'm', default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Worker threads (default: one per core).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Weight precision: file (a GGUF's own blocks as stored, the default for GGUF files),
    /// int8 (W8A8, the default for Hugging Face directories), int4 (4-bit weights, INT8
    /// activations), bf16, or f32 (the reference).
    #[arg(long = "precision", value_parser = parse_precision)]
    pub precision_arg: Option<Precision>,
    /// KV cache storage: f16 (the default: half f32's bytes, next-token distributions
    /// within a KL of 1e-5 of it), f32, or int8 (about a quarter; the default with
    /// `--attention int8`). OpenVINO routes bind an f32 cache, their default.
    #[arg(long, value_parser = parse_kv_type)]
    pub kv: Option<KvType>,
    /// Attention products: exact (f32 products over any cache) or int8 (INT8 products
    /// and an online softmax over an INT8 cache, several times faster at depth).
    #[arg(long, value_parser = parse_attention)]
    pub attention: Option<Attention>,
    /// A Jinja chat template (as in Hugging Face's `tokenizer_config.json`) to use
    /// instead of the model's own: for a model whose file has none, such as gemma3-270m.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
}

fn parse_attention(s: &str) -> Result<Attention, String> {
    Attention::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Attention::ALL.iter().map(|a| a.name()).collect();
        format!(
            "unknown attention '{s}' (expected one of: {})",
            names.join(", ")
        )
    })
}

fn parse_kv_type(s: &str) -> Result<KvType, String> {
    KvType::parse(s).ok_or_else(|| {
        let names: Vec<&str> = KvType::ALL.iter().map(|t| t.name()).collect();
        format!(
            "unknown KV cache type '{s}' (expected one of: {})",
            names.join(", ")
        )
    })
}

pub(crate) fn parse_precision(s: &str) -> Result<Precision, String> {
    Precision::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Precision::ALL.iter().map(|p| p.name()).collect();
        format!(
            "unknown precision '{s}' (expected one of: {})",
            names.join(", ")
        )
    })
}

/// What the model at `path` is by content ([`ModelCache::model_identity`]): of its file
/// (every part of a split GGUF), or for a Hugging Face directory of its `config.json`,
/// weight files and `tokenizer.json` together (calibration tokenizes a text). Read only by commands that
/// key sessions, artifacts or calibrations, not on every load; a file is read through
/// once, then its digest is remembered.
pub fn file_model_id(path: &std::path::Path) -> Result<u64> {
    let files = if path.is_dir() {
        let checkpoint = pyramid_model::HfCheckpoint::open(path)?;
        let mut files = checkpoint.files();
        files.push(path.join("tokenizer.json"));
        files
    } else {
        let file = pyramid_gguf::GgufFile::open(path)?;
        match file.split_paths() {
            [] => vec![path.to_path_buf()],
            parts => parts.to_vec(),
        }
    };
    Ok(ModelCache::from_env()?.model_identity(&files)?)
}

/// The outlier calibration of the model at `path`: from the cache beside the models, or
/// from a pass of the f32 model (`f32_model` when loaded, else streamed from the file a
/// layer at a time), then cached. A cache that cannot be read or written only costs that
/// pass.
fn calibration(
    path: &std::path::Path,
    checkpoint: &Checkpoint,
    tokenizer: &Tokenizer,
    pool: &ThreadPool,
    f32_model: Option<&Model>,
) -> Result<Calibration> {
    let cache_path = ModelCache::from_env()?
        .root()
        .join("calibration")
        .join(format!(
            "{:016x}-{:016x}.json",
            file_model_id(path)?,
            text_id(CALIBRATION_TEXT)
        ));
    if let Some(cached) = std::fs::read(&cache_path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Calibration>(&bytes).ok())
    {
        return Ok(cached);
    }
    eprintln!(
        "calibrating {} for int8/int4 once (cached in {}; `pyramid fetch --calibrate` does it ahead)",
        path.display(),
        cache_path.display()
    );
    let tokens = tokenizer.encode(CALIBRATION_TEXT, false)?;
    let calibration = match f32_model {
        Some(model) => model.calibrate(pool, &tokens)?,
        None => Model::calibrate_streamed(checkpoint, pool, &tokens)
            .with_context(|| format!("calibrating {}", path.display()))?,
    };
    let written = cache_path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            let tmp = cache_path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_vec(&calibration)?)?;
            std::fs::rename(&tmp, &cache_path)
        });
    if let Err(err) = written {
        eprintln!(
            "warning: could not cache the calibration at {}: {err}",
            cache_path.display()
        );
    }
    Ok(calibration)
}

/// Computes the int8/int4 outlier calibration of the model at `path` ahead of its first
/// load at those precisions (`pyramid fetch --calibrate`), or finds it cached.
pub fn calibrate_ahead(path: PathBuf) -> Result<()> {
    let (path, checkpoint, tokenizer) = open_path(path)?;
    let pool = ThreadPool::with_available_parallelism();
    calibration(&path, &checkpoint, &tokenizer, &pool, None)?;
    Ok(())
}

/// A stable 64-bit FNV-1a hash: the calibration text's part of its cache key.
fn text_id(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Prefix of model names that stand for random-weight models with a published model's
/// shapes (`synthetic:qwen2.5-1.5b`): speed measurements only, never quality.
pub const SYNTHETIC_PREFIX: &str = "synthetic:";

/// A known name becomes a cached path, fetched first if needed; an `hf:` id the path in
/// the Hugging Face cache, downloaded first if needed; a `synthetic:` name is written once
/// into `$PYRAMID_HOME/synthetic`.
pub fn resolve_model_path(name_or_path: &str) -> Result<PathBuf> {
    if name_or_path.starts_with(HF_PREFIX) {
        let id = HfModelId::parse(name_or_path)?;
        return Ok(HfHub::from_env()?.resolve(&id, &IndicatifProgress::new())?);
    }
    let cache = ModelCache::from_env()?;
    if let Some(shape) = name_or_path.strip_prefix(SYNTHETIC_PREFIX) {
        return synthetic_model_path(&cache, shape);
    }
    Ok(cache.resolve(name_or_path, &IndicatifProgress::new())?)
}

fn synthetic_model_path(cache: &ModelCache, shape: &str) -> Result<PathBuf> {
    let spec = SyntheticSpec::published(shape).with_context(|| {
        format!(
            "unknown synthetic shape '{shape}' (known: {})",
            SyntheticSpec::PUBLISHED.join(", ")
        )
    })?;
    let dir = cache.models_dir().with_file_name("synthetic");
    let path = dir.join(format!("{shape}-q8_0.gguf"));
    if path.exists() {
        return Ok(path);
    }
    // The load stage holds every weight in f32 first.
    let needed = spec.n_params() as u64 * 4;
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024);
    if let Some(available) = available.filter(|&a| a < needed * 3 / 2) {
        bail!(
            "synthetic:{shape} needs about {:.1} GiB to load (its weights in f32) and this machine has {:.1} GiB available",
            needed as f64 / (1u64 << 30) as f64 * 1.5,
            available as f64 / (1u64 << 30) as f64
        );
    }
    eprintln!(
        "writing random-weight synthetic:{shape} to {}",
        path.display()
    );
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bytes = synthetic_gguf(&spec)?.to_bytes();
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The tokenizer alone: the model's architecture need not be one pyramid runs.
pub fn open_tokenizer(model: &str) -> Result<Tokenizer> {
    let path = resolve_model_path(model)?;
    let tokenizer = if path.is_dir() {
        Tokenizer::from_hf_dir(&path)
    } else {
        Tokenizer::from_gguf(pyramid_gguf::GgufFile::open(&path)?.metadata())
    };
    tokenizer.with_context(|| format!("tokenizer of {}", path.display()))
}

/// The checkpoint (a GGUF file or a Hugging Face directory) and its tokenizer.
/// The precision a model loads in without `--precision`: a GGUF file's own blocks, which
/// need no calibration pass and read no more bytes than the file holds, or INT8 for a Hugging
/// Face directory, whose float tensors `file` would keep in float.
fn default_precision(is_directory: bool) -> Precision {
    if is_directory {
        Precision::Int8
    } else {
        Precision::File
    }
}

fn open_path(path: PathBuf) -> Result<(PathBuf, Checkpoint, Tokenizer)> {
    let checkpoint =
        Checkpoint::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let tokenizer = match &checkpoint {
        Checkpoint::Gguf { file, .. } => Tokenizer::from_gguf(file.metadata()),
        Checkpoint::HuggingFace(hf) => Tokenizer::from_hf_dir(hf.dir()),
    }
    .with_context(|| format!("tokenizer of {}", path.display()))?;
    Ok((path, checkpoint, tokenizer))
}

/// The chat template chat prompts are rendered with; a model without one is an error that
/// says how to give one.
pub fn chat_template(tokenizer: &Tokenizer) -> Result<ChatTemplate> {
    if tokenizer.chat_template_source().is_none() {
        bail!(
            "the model has no chat template (its file has no 'tokenizer.chat_template'): \
             give one with --chat-template FILE, or prompt it with plain text"
        );
    }
    Ok(tokenizer.chat_template()?)
}

pub struct Loaded {
    pub name: String,
    /// Random weights with a published model's shapes: speed only, tokens mean nothing.
    pub synthetic: bool,
    /// The GGUF file or Hugging Face directory the model came from.
    pub path: PathBuf,
    pub kv_type: KvType,
    pub model: Arc<Model>,
    /// The f32 model as loaded, when asked for (OpenVINO builds its graphs from it).
    pub f32_model: Option<Arc<Model>>,
    pub tokenizer: Tokenizer,
    pub pool: ThreadPool,
    pub load_ms: f64,
}

impl ModelArgs {
    /// `--attention` and `--kv`, each defaulting to what suits the other: INT8 products
    /// read an INT8 cache, so `--attention int8` with another `--kv` is refused by name.
    /// The cache defaults to f16, or to f32 for `openvino` routes, whose stages bind f32.
    pub fn attention_and_kv(&self, openvino: bool) -> Result<(Attention, KvType)> {
        let attention = self.attention.unwrap_or_default();
        match (attention, self.kv) {
            (Attention::Int8, Some(kv)) if kv != KvType::Int8 => bail!(
                "--attention int8 multiplies an INT8 KV cache, not --kv {kv}: pass --kv int8 \
                 or --attention exact"
            ),
            (Attention::Int8, _) => Ok((attention, KvType::Int8)),
            (Attention::Exact, Some(kv)) => Ok((attention, kv)),
            (Attention::Exact, None) if openvino => Ok((attention, KvType::F32)),
            (Attention::Exact, None) => Ok((attention, KvType::F16)),
        }
    }

    /// `--precision`, or the default for the model: a GGUF file's own blocks (`file`), or
    /// INT8 for a Hugging Face directory's float tensors. Resolves the model (fetching it
    /// if needed) only when no precision was given.
    pub fn precision(&self) -> Result<Precision> {
        match self.precision_arg {
            Some(p) => Ok(p),
            None => Ok(default_precision(resolve_model_path(&self.model)?.is_dir())),
        }
    }

    /// Loads the model in `--precision`, also keeping the f32 model when `keep_f32` (a second copy
    /// of the weights unless `--precision f32`): for an OpenVINO route, whose graphs are
    /// built from it and whose cache is f32.
    pub fn load_keeping_f32(&self, keep_f32: bool) -> Result<Loaded> {
        let (attention, kv_type) = self.attention_and_kv(keep_f32)?;
        let pool = match self.threads {
            Some(0) => anyhow::bail!("--threads must be at least 1"),
            Some(n) => ThreadPool::new(n)?,
            None => ThreadPool::with_available_parallelism(),
        };
        let path = resolve_model_path(&self.model)?;
        let start = Instant::now();
        let (path, checkpoint, mut tokenizer) = open_path(path)?;
        let precision = self
            .precision_arg
            .unwrap_or_else(|| default_precision(matches!(checkpoint, Checkpoint::HuggingFace(_))));
        let model_vocab = checkpoint.config().n_vocab;
        if tokenizer.n_vocab() > model_vocab {
            bail!(
                "{}: the tokenizer has {} tokens but the model only {model_vocab} rows of \
                 embeddings",
                path.display(),
                tokenizer.n_vocab()
            );
        }
        if let Some(template) = &self.chat_template {
            let source = std::fs::read_to_string(template)
                .with_context(|| format!("reading chat template {}", template.display()))?;
            tokenizer
                .set_chat_template(source)
                .with_context(|| format!("chat template {}", template.display()))?;
        }
        let loading = || format!("loading {}", path.display());
        // The weights are dequantised and packed on `rayon`: on as many threads as the
        // forward pass, in a pool that ends with the load. The load itself runs on one of
        // them, with the main thread's stack.
        let converter = rayon::ThreadPoolBuilder::new()
            .num_threads(pool.n_threads())
            .stack_size(8 << 20)
            .build()
            .context("starting the threads that convert the weights")?;
        let (f32_model, model) = converter.install(|| -> Result<_> {
            let f32_model = (keep_f32 && precision != Precision::F32)
                .then(|| Model::from_checkpoint(&checkpoint, Precision::F32, None).map(Arc::new))
                .transpose()
                .with_context(loading)?;
            let calibration = if precision.calibrates() {
                Some(calibration(
                    &path,
                    &checkpoint,
                    &tokenizer,
                    &pool,
                    f32_model.as_deref(),
                )?)
            } else {
                None
            };
            let mut model = Model::from_checkpoint(&checkpoint, precision, calibration.as_ref())
                .with_context(loading)?;
            model.attention = attention;
            Ok((f32_model, model))
        })?;
        let load_ms = start.elapsed().as_secs_f64() * 1e3;
        let model = Arc::new(model);
        let f32_model = f32_model.or_else(|| keep_f32.then(|| Arc::clone(&model)));
        Ok(Loaded {
            name: self.model.clone(),
            synthetic: self.model.starts_with(SYNTHETIC_PREFIX),
            path,
            kv_type,
            f32_model,
            model,
            tokenizer,
            pool,
            load_ms,
        })
    }
}
