//! `pyramid models` and `pyramid fetch`.

use anyhow::{Context, Result};
use clap::Args;
use pyramid_registry::{known_models, IndicatifProgress, KnownModel, ModelCache, DEFAULT_MODEL};

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
    Ok(())
}

#[derive(Args, Debug)]
pub struct FetchArgs {
    /// A known model name (see `pyramid models`).
    pub name: String,
}

pub fn fetch(args: FetchArgs) -> Result<()> {
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
    println!("{}", path.display());
    Ok(())
}
