use pyramid_gguf::GgufError;

/// Everything that can go wrong while loading a vocabulary, tokenizing, or rendering a chat.
///
/// Variants carry the offending value so the message alone names the problem.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required key is missing from the GGUF metadata or has the wrong type.
    #[error("GGUF tokenizer metadata: {0}")]
    Metadata(#[from] GgufError),
    /// `tokenizer.ggml.model` names a vocabulary type this crate does not implement.
    #[error(
        "tokenizer model '{0}' is not supported (supported: 'gpt2', byte-level BPE; \
         'llama', SentencePiece)"
    )]
    Unsupported(String),
    /// A Hugging Face tokenizer file is missing, unreadable or of a kind not supported.
    #[error("{}: {reason}", path.display())]
    HfFile {
        path: std::path::PathBuf,
        reason: String,
    },
    /// A per-token array does not have one entry per token.
    #[error("metadata '{key}' has {len} entries but the vocabulary has {n_vocab} tokens")]
    LengthMismatch {
        key: &'static str,
        len: usize,
        n_vocab: usize,
    },
    /// The vocabulary is empty or too large for `u32` token ids.
    #[error("vocabulary of {0} tokens is empty or too large for u32 token ids")]
    BadVocabSize(usize),
    /// A special-token id from the metadata does not name a token.
    #[error("metadata '{key}' = {id} is not a token id (vocabulary has {n_vocab} tokens)")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: i128,
        n_vocab: usize,
    },
    /// A SentencePiece vocabulary without the scores that order its merges.
    #[error("SentencePiece vocabulary without 'tokenizer.ggml.scores'")]
    MissingScores,
    /// A merge rule is not two space-separated tokens.
    #[error("merge rule #{index} {merge:?} is not two space-separated tokens")]
    BadMerge { index: usize, merge: String },
    /// The `tokenizers` crate rejected the vocabulary, merges or pre-tokenizer regex.
    #[error("cannot build the BPE tokenizer: {0}")]
    Build(String),
    /// The `tokenizers` crate failed on an input text.
    #[error("cannot tokenize {text:?}: {message}")]
    Encode { text: String, message: String },
    /// A text gives more tokens than the caller allows (a prompt beyond the context).
    #[error("the text gives more than {limit} tokens")]
    TooManyTokens { limit: usize },
    /// A token id is not in the vocabulary.
    #[error("token id {id} is out of range (vocabulary has {n_vocab} tokens)")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    /// The model file carries no `tokenizer.chat_template`.
    #[error("the model has no chat template (metadata 'tokenizer.chat_template' is missing)")]
    NoChatTemplate,
    /// The chat template failed to parse or to render (includes `raise_exception` calls).
    #[error("chat template: {0}")]
    Template(String),
}

impl From<minijinja::Error> for TokenizerError {
    fn from(err: minijinja::Error) -> Self {
        // `{:#}` adds the template line and the failing expression, which the plain form omits.
        TokenizerError::Template(format!("{err:#}"))
    }
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
