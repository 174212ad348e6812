use pyramid_model::ModelError;

use crate::artifact::ArtifactShape;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("invalid sampling parameter {name} = {value}: {reason}")]
    BadSamplingParameter {
        name: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("prompt is empty: at least one token is needed")]
    EmptyPrompt,
    #[error("context length exceeded: {needed} tokens needed, the model supports {n_ctx}")]
    ContextLengthExceeded { needed: usize, n_ctx: usize },
    #[error("artifact {shape} cannot run this: {reason}")]
    BadShape {
        shape: ArtifactShape,
        reason: String,
    },
    /// A backend's own failure (a device compiler or runtime), its message passed on.
    #[error("{0}")]
    Device(String),
    #[error("invalid window ladder: {0}")]
    BadLadder(String),
    #[error("context length exceeded: {needed} tokens needed, the largest window holds {largest}")]
    BeyondLargestWindow { needed: usize, largest: usize },
    #[error("artifact cache budget of {budget} bytes cannot hold {shape} ({bytes} bytes) beside the artifacts in use")]
    OverBudget {
        shape: ArtifactShape,
        bytes: usize,
        budget: usize,
    },
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
