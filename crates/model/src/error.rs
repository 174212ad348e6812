use std::path::PathBuf;

use pyramid_gguf::{GgmlType, GgufError};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(
        "unsupported model architecture '{0}' (supported: llama, qwen2, qwen3, smollm3, phi3, gemma3)"
    )]
    UnsupportedArchitecture(String),
    /// A Hugging Face checkpoint directory or one of its files is unusable.
    #[error("{}: {reason}", path.display())]
    Checkpoint { path: PathBuf, reason: String },
    #[error("the model has no tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    /// `--precision file` met a block type no kernel runs exactly yet.
    #[error("--precision file does not run {ty} yet ({name}); use --precision int8 or int4")]
    FileType { name: String, ty: GgmlType },
    /// `--precision file` cannot run this tensor's blocks exactly.
    #[error("--precision file cannot run {name} exactly: {reason}; use --precision int8 or int4")]
    FileBlocks { name: String, reason: String },
    #[error("invalid model hyper-parameter: {0}")]
    BadConfig(String),
    #[error("token id {id} is out of range (vocabulary has {n_vocab} tokens)")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("context length exceeded: {needed} tokens needed, the model supports {n_ctx}")]
    ContextLengthExceeded { needed: usize, n_ctx: usize },
    #[error("empty input: at least one token is needed")]
    EmptyInput,
    #[error("logits of {n_logits} rows asked of a segment of {n_real} real tokens (1..={n_real} allowed)")]
    BadLogitRows { n_logits: usize, n_real: usize },
    #[error("pooled rows {rows:?} of a segment of {n_real} real tokens into a sum of {width} (the model's width is {n_embd}; a pooled segment returns no logits)")]
    BadPooling {
        rows: std::ops::Range<usize>,
        n_real: usize,
        width: usize,
        n_embd: usize,
    },
    /// Reading a cache's rows back (`KvCache::read_live`) failed or ran out of input.
    #[error("reading KV cache rows: {0}")]
    KvIo(#[source] std::io::Error),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
