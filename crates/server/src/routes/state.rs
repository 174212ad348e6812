//! What every handler shares: the engine thread, the tokenizer and template, limits,
//! metrics, and the grammar vocabulary built in the background.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use pyramid_engine::Pooling;
use pyramid_grammar::GrammarVocab;
use pyramid_tokenizer::{ChatTemplate, Tokenizer};
use tokio::sync::Semaphore;

use super::auth::{ApiKey, Keys};
use super::unix_now;
use crate::listen::Limits;
use crate::metrics::Metrics;
use crate::reasoning::{template_thinks, ReasoningFormat};
use crate::responses::ResponseStore;
use crate::worker::EngineThread;

/// What every handler shares.
pub struct AppState {
    pub engine: EngineThread,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub model_id: String,
    /// Positions of the largest window: prompt plus generation must fit.
    pub max_context: usize,
    /// Keys a request may authenticate with; none: no authentication.
    pub(super) keys: Keys,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub started: u64,
    pub(super) next_id: AtomicU64,
    /// One permit per prompt being tokenised ([`Limits::max_tokenizing`]).
    pub(super) tokenizing: Arc<Semaphore>,
    /// The vocabulary prepared for grammars (half a second for a 150k vocabulary), built
    /// in the background at start; a request needing it earlier waits for it.
    pub(super) grammar_vocab: OnceLock<Result<GrammarVocab, String>>,
    /// Responses kept for `GET /v1/responses/{id}` and `previous_response_id`.
    pub responses: Arc<ResponseStore>,
    /// Whether thoughts are split from answers (`--reasoning-format`).
    pub reasoning: ReasoningFormat,
    /// How `/v1/embeddings` pools, and whether the server does nothing else; `None`:
    /// the server was set up without embeddings.
    pub embedding: Option<EmbeddingSetup>,
}

/// What `/v1/embeddings` gives: vectors of `width` floats pooled by `pooling` (the
/// model's own, or `--pooling`); with `only` (`--embedding`) generation is refused.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddingSetup {
    pub pooling: Pooling,
    pub width: usize,
    pub only: bool,
}

impl AppState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: EngineThread,
        tokenizer: Arc<Tokenizer>,
        template: Option<ChatTemplate>,
        model_id: String,
        max_context: usize,
        api_keys: Vec<ApiKey>,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Self {
        let started = unix_now();
        Self {
            engine,
            tokenizer,
            template,
            model_id,
            max_context,
            keys: Keys::new(&api_keys),
            tokenizing: Arc::new(Semaphore::new(limits.max_tokenizing.max(1))),
            limits,
            metrics,
            started,
            next_id: AtomicU64::new(started << 20),
            grammar_vocab: OnceLock::new(),
            responses: Arc::new(ResponseStore::in_memory()),
            reasoning: ReasoningFormat::default(),
            embedding: None,
        }
    }

    /// How `/v1/embeddings` pools and how wide its vectors are.
    pub fn with_embedding(mut self, setup: EmbeddingSetup) -> Self {
        self.embedding = Some(setup);
        self
    }

    /// Thoughts split from answers, or not (`--reasoning-format none`).
    pub fn with_reasoning_format(mut self, format: ReasoningFormat) -> Self {
        self.reasoning = format;
        self
    }

    /// Whether a chat reply's thought goes apart from its answer: the template thinks,
    /// and the server splits thoughts.
    pub fn splits_thoughts(&self) -> bool {
        self.reasoning == ReasoningFormat::Split
            && self
                .template
                .as_ref()
                .is_some_and(|t| template_thinks(t.source()))
    }

    /// Keeps responses under the session directory, so they outlive a restart as the
    /// conversations' KV does.
    pub fn keep_responses_in(mut self, session_dir: &std::path::Path) -> std::io::Result<Self> {
        self.responses = Arc::new(ResponseStore::in_dir(session_dir)?);
        Ok(self)
    }

    /// The vocabulary prepared for grammars, built on first use.
    pub(super) fn grammar_vocab(&self) -> Result<&GrammarVocab, &str> {
        self.grammar_vocab
            .get_or_init(|| {
                GrammarVocab::new(Arc::clone(&self.tokenizer)).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// Starts preparing the grammar vocabulary on a thread of its own, so the first
    /// constrained request does not pay for it.
    pub fn prepare_grammars(self: &Arc<Self>) {
        let state = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("pyramid-grammar".into())
            .spawn(move || {
                if let Err(e) = state.grammar_vocab() {
                    tracing::warn!("constrained decoding is unavailable: {e}");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot prepare grammars in the background: {e}");
        }
    }
}
