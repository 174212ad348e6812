//! Resolves (and fetches if needed) a model with a progress bar, printing its path:
//! `cargo run -p pyramid-registry --example fetch -- [name-or-path]`.
//! Honours PYRAMID_HOME and PYRAMID_PYTHON.

use std::process::ExitCode;

use pyramid_registry::{IndicatifProgress, ModelCache, RegistryError, DEFAULT_MODEL};

fn run(name: &str) -> Result<std::path::PathBuf, RegistryError> {
    ModelCache::from_env()?.resolve(name, &IndicatifProgress::new())
}

fn main() -> ExitCode {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| DEFAULT_MODEL.to_string());
    match run(&name) {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
