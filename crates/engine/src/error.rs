use pyramid_model::ModelError;
use pyramid_runtime::{ArtifactShape, RuntimeError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("compiling {shape} failed: {reason}")]
    Compile {
        shape: ArtifactShape,
        reason: String,
    },
    #[error("invalid pyramid configuration: {0}")]
    BadConfig(String),
    #[error("prompt is empty: at least one token is needed")]
    EmptyPrompt,
    #[error("trace line {line}: {reason}")]
    BadTrace { line: usize, reason: String },
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
