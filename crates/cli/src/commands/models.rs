//! `pyramid models` and `pyramid fetch`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use pyramid_registry::{
    known_models, HfHub, HfModelId, IndicatifProgress, KnownModel, ModelCache, DEFAULT_MODEL,
    HF_PREFIX,
};

use crate::loader::calibrate_ahead;

pub fn list() -> Result<()> {
    let cache = ModelCache::from_env()?;
    println!("{:<22} {:>8}  {:<10} description", "name", "size", "status");
    for model in known_models() {
        let status = if cache.is_cached(model) {
            "cached"
        } else {
            "not cached"
        };
        let default = if model.name == DEFAULT_MODEL {
            " (default)"
        } else {
            ""
        };
        println!(
            "{:<22} {:>5} MB  {:<10} {}{default}",
            model.name,
            model.n_bytes / 1_000_000,
            status,
            model.description
        );
    }
    println!("cache: {}", cache.models_dir().display());
    println!(
        "models by Hugging Face id (hf:ORG/REPO[:QUANT|/FILE]) are kept in {}",
        HfHub::from_env()?.cache_dir().display()
    );
    Ok(())
}

#[derive(Args, Debug)]
pub struct FetchArgs {
    /// A known model name (see `pyramid models`), or a Hugging Face id
    /// `hf:ORG/REPO[:QUANT|/FILE]`.
    pub name: String,
    /// Also compute the outlier calibration `--precision int8` and `int4` need, so their
    /// first load does not (GGUF files load at `file` by default, which needs none).
    #[arg(long)]
    pub calibrate: bool,
}

pub fn fetch(args: FetchArgs) -> Result<()> {
    if args.name.starts_with(HF_PREFIX) {
        let id = HfModelId::parse(&args.name)?;
        let path = HfHub::from_env()?.resolve(&id, &IndicatifProgress::new())?;
        return fetched(path, args.calibrate);
    }
    let model = KnownModel::by_name(&args.name).with_context(|| {
        let names: Vec<&str> = known_models().iter().map(|m| m.name).collect();
        format!(
            "unknown model '{}' (known: {})",
            args.name,
            names.join(", ")
        )
    })?;
    let cache = ModelCache::from_env()?;
    let path = cache.fetch(model, &IndicatifProgress::new())?;
    fetched(path, args.calibrate)
}

/// Prints a fetched model's path, calibrated first when asked.
fn fetched(path: PathBuf, calibrate: bool) -> Result<()> {
    if calibrate {
        calibrate_ahead(path.clone())?;
    }
    println!("{}", path.display());
    Ok(())
}
