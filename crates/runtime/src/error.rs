use pyramid_model::ModelError;

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
    #[error("a batch must run sessions of one model")]
    MixedModels,
    #[error("prompt is empty: at least one token is needed")]
    EmptyPrompt,
    #[error("context length exceeded: {needed} tokens needed, the model supports {n_ctx}")]
    ContextLengthExceeded { needed: usize, n_ctx: usize },
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
