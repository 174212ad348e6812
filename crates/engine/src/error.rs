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
    #[error("a session on this window needs {bytes} bytes of KV cache, beyond the budget of {budget} bytes")]
    OverBudget { bytes: usize, budget: usize },
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Grammar(#[from] pyramid_grammar::GrammarError),
    #[error("the pass failed: {0}")]
    Pass(String),
    /// A defect in pyramid hit while serving one request (a panic caught at the request's
    /// boundary): that request fails, the engine goes on.
    #[error("internal error: {0}")]
    Internal(String),
    #[error("the artifacts of window {window} are unavailable: {reason}")]
    Unavailable { window: usize, reason: String },
    #[error("trace line {line}: {reason}")]
    BadTrace { line: usize, reason: String },
    #[error("session {session} step {step}: {reason}")]
    BadStep {
        session: String,
        step: u64,
        reason: String,
    },
}

impl EngineError {
    /// A machine-readable code for the error kinds clients act on (OpenAI's vocabulary).
    pub fn code(&self) -> Option<&'static str> {
        match self {
            EngineError::Runtime(
                RuntimeError::BeyondLargestWindow { .. }
                | RuntimeError::ContextLengthExceeded { .. }
                | RuntimeError::Model(ModelError::ContextLengthExceeded { .. }),
            )
            | EngineError::Model(ModelError::ContextLengthExceeded { .. }) => {
                Some("context_length_exceeded")
            }
            _ => None,
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
