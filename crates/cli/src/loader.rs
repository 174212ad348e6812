//! Turning `--model NAME|PATH` into a loaded model and tokenizer.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::linear::CALIBRATION_TEXT;
use pyramid_model::{KvType, Model, Precision};
use pyramid_registry::{IndicatifProgress, ModelCache, DEFAULT_MODEL};
use pyramid_tokenizer::Tokenizer;

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A known model name (see `pyramid models`) or a path to a GGUF file.
    #[arg(long, short = 'm', default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Worker threads (default: one per core).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Weight precision: int8 (W8A8), int4 (4-bit weights, INT8 activations), bf16, or
    /// f32 (the reference).
    #[arg(long, default_value = "int8", value_parser = parse_precision)]
    pub precision: Precision,
    /// KV cache storage: f32, f16 (half the bytes), or int8 (about a quarter).
    #[arg(long, default_value = "f32", value_parser = parse_kv_type)]
    pub kv: KvType,
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

fn parse_precision(s: &str) -> Result<Precision, String> {
    Precision::parse(s).ok_or_else(|| {
        let names: Vec<&str> = Precision::ALL.iter().map(|p| p.name()).collect();
        format!(
            "unknown precision '{s}' (expected one of: {})",
            names.join(", ")
        )
    })
}

/// [`pyramid_runtime::artifact::model_id`] of a file: its length and first and last MiB.
/// Read only by commands that key artifacts, not on every load.
pub fn file_model_id(path: &std::path::Path) -> Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    const SPAN: u64 = 1 << 20;
    let mut file =
        std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let len = file.metadata()?.len();
    let mut head = Vec::new();
    (&mut file).take(SPAN).read_to_end(&mut head)?;
    let mut tail = Vec::new();
    file.seek(SeekFrom::Start(len.saturating_sub(SPAN)))?;
    file.read_to_end(&mut tail)?;
    Ok(pyramid_runtime::artifact::model_id(&head, &tail, len))
}

/// A known name becomes a cached path, fetched first if needed.
pub fn resolve_model_path(name_or_path: &str) -> Result<PathBuf> {
    let cache = ModelCache::from_env()?;
    Ok(cache.resolve(name_or_path, &IndicatifProgress::new())?)
}

pub fn open_tokenizer(model: &str) -> Result<(PathBuf, GgufFile, Tokenizer)> {
    open_path(resolve_model_path(model)?)
}

fn open_path(path: PathBuf) -> Result<(PathBuf, GgufFile, Tokenizer)> {
    let file = GgufFile::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(file.metadata())
        .with_context(|| format!("tokenizer of {}", path.display()))?;
    Ok((path, file, tokenizer))
}

pub struct Loaded {
    pub name: String,
    /// The GGUF file the model came from.
    pub path: PathBuf,
    pub kv_type: KvType,
    pub model: Arc<Model>,
    pub tokenizer: Tokenizer,
    pub pool: ThreadPool,
    pub load_ms: f64,
}

impl ModelArgs {
    pub fn load(&self) -> Result<Loaded> {
        let pool = match self.threads {
            Some(0) => anyhow::bail!("--threads must be at least 1"),
            Some(n) => ThreadPool::new(n)?,
            None => ThreadPool::with_available_parallelism(),
        };
        let path = resolve_model_path(&self.model)?;
        let start = Instant::now();
        let (path, file, tokenizer) = open_path(path)?;
        let model =
            Model::from_gguf(&file).with_context(|| format!("loading {}", path.display()))?;
        let model = match self.precision {
            Precision::F32 => model,
            precision if precision.quantises_activations() => {
                // Outlier channels come from a short calibration pass of the f32 model.
                let tokens = tokenizer.encode(CALIBRATION_TEXT, false)?;
                let calibration = model.calibrate(&pool, &tokens)?;
                model.into_precision(precision, Some(&calibration))
            }
            precision => model.into_precision(precision, None),
        };
        let load_ms = start.elapsed().as_secs_f64() * 1e3;
        Ok(Loaded {
            name: self.model.clone(),
            path,
            kv_type: self.kv,
            model: Arc::new(model),
            tokenizer,
            pool,
            load_ms,
        })
    }
}
