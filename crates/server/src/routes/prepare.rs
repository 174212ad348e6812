//! Turning a request into engine input: the body read within its limits, the prompt
//! rendered and tokenised within the largest window, the reply's grammar compiled.

use axum::body::Body;
use pyramid_engine::Speculation;
use pyramid_grammar::Constraint;
use pyramid_tokenizer::TokenizerError;

use super::auth::KeyPriority;
use super::AppState;
use crate::api::{GenerationRequest, Prompt};
use crate::error::ApiError;
use crate::listen::Limits;
use crate::reasoning::{with_thought, Thinking};
use crate::tools::{self, ToolSet};

/// The whole body, within the size limit and the body timeout.
pub(super) async fn read_body(limits: &Limits, body: Body) -> Result<Vec<u8>, ApiError> {
    let read = axum::body::to_bytes(body, limits.body_limit);
    match tokio::time::timeout(limits.body_timeout, read).await {
        Err(_) => Err(ApiError::body_timeout(limits.body_timeout)),
        Ok(Ok(bytes)) => Ok(bytes.into()),
        Ok(Err(err)) => {
            let too_large = std::error::Error::source(&err)
                .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
            Err(if too_large {
                ApiError::body_too_large(limits.body_limit)
            } else {
                ApiError::invalid_request(format!("cannot read the request body: {err}"))
            })
        }
    }
}

/// A request parsed, validated and turned into what the engine takes.
pub(super) struct Prepared {
    /// The parsed request; its prompt has moved into `prompt` as ids.
    pub request: GenerationRequest,
    pub prompt: Vec<u32>,
    /// The request field the prompt came in (`messages` or `prompt`).
    pub prompt_param: &'static str,
    /// Each choice's grammar state (one per `n`), all compiled from the one grammar.
    pub constraints: Vec<Option<Constraint>>,
    /// `prediction` as ids (empty without one).
    pub prediction: Vec<u32>,
    pub priority: i32,
    pub speculation: Speculation,
}

/// Checks a parsed `request` against the model, tokenises its prompt and prediction
/// within the largest window and compiles its reply's grammar: CPU work, run on a
/// blocking thread.
pub(super) fn prepare(
    state: &AppState,
    mut request: GenerationRequest,
    key: KeyPriority,
    header_priority: Option<i32>,
) -> Result<Prepared, ApiError> {
    let priority = key.apply(request.priority.or(header_priority));
    if request.model != state.model_id {
        return Err(ApiError::model_not_found(&request.model, &state.model_id));
    }
    request
        .sampler
        .check_vocab(state.tokenizer.n_vocab())
        .map_err(|e| ApiError::bad_param("logit_bias", e.to_string()))?;
    let n_vocab = state.tokenizer.n_vocab();
    if let Some(id) = request
        .extensions
        .stop_token_ids
        .iter()
        .find(|&&id| id as usize >= n_vocab)
    {
        return Err(ApiError::bad_param(
            "stop_token_ids",
            format!("token id {id} is out of range (vocabulary has {n_vocab} tokens)"),
        ));
    }
    let speculation = match (request.speculation, state.engine.speculates()) {
        (Some(Speculation::Ngram), false) => {
            return Err(ApiError::bad_param(
                "speculative",
                "speculative decoding is off on this server: it runs with --speculative off, or on a route whose artifacts return one row of logits per sequence (static OpenVINO shapes)",
            ))
        }
        (Some(asked), _) => asked,
        (None, true) => Speculation::Ngram,
        (None, false) => Speculation::Off,
    };
    if request.prediction.is_some() && speculation == Speculation::Off {
        return Err(ApiError::bad_param(
            "prediction",
            "'prediction' is read by speculative decoding, which is off for this request or server",
        ));
    }
    // The prompt's text is needed only to tokenise it: moved, not copied.
    let prompt_param = request.prompt.param();
    let text = std::mem::replace(&mut request.prompt, Prompt::Text(String::new()));
    let (prompt, thinking) = tokenize(
        state,
        &text,
        request.tools.as_ref(),
        &request.extensions.template_kwargs,
    )?;
    drop(text);
    request.thinking = thinking;
    // One compile; each further choice runs its own copy of it.
    let constraint = constrain(
        state,
        request.tools.as_ref(),
        request.response_format.as_ref(),
        thinking,
    )?;
    let constraints = vec![constraint; request.n];
    let prediction = match request.prediction.take() {
        Some(text) => tokenize_prediction(state, &text)?,
        None => Vec::new(),
    };
    Ok(Prepared {
        request,
        prompt,
        prompt_param,
        constraints,
        prediction,
        priority,
        speculation,
    })
}

/// A prediction's ids, as the reply would be written (no special tokens). A reply never
/// outgrows the largest window, so neither may its prediction: tokenising stops there.
fn tokenize_prediction(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    state
        .tokenizer
        .encode_within(text, false, state.max_context)
        .map_err(|e| match e {
            TokenizerError::TooManyTokens { .. } => ApiError::bad_param(
                "prediction",
                format!(
                    "'prediction' is longer than the largest context ({} tokens)",
                    state.max_context
                ),
            ),
            e => ApiError::bad_param("prediction", e.to_string()),
        })
}

/// The grammar a chat reply must follow, compiled: `None` when nothing constrains it.
fn constrain(
    state: &AppState,
    tools: Option<&ToolSet>,
    format: Option<&pyramid_grammar::Grammar>,
    thinking: Thinking,
) -> Result<Option<Constraint>, ApiError> {
    let Some(grammar) = tools::reply_grammar(tools, format) else {
        return Ok(None);
    };
    let grammar = with_thought(grammar, thinking);
    let vocab = state
        .grammar_vocab()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    // The grammar comes from a forced call's tools, else from the format if there is one.
    let param = match tools {
        Some(t) if t.forces_calls() => "tools",
        _ if format.is_some() => "response_format",
        _ => "tools",
    };
    vocab
        .compile(&grammar)
        .map(Some)
        .map_err(|e| ApiError::bad_param(param, format!("'{param}' cannot be enforced: {e}")))
}

/// The prompt's ids, and where its reply starts with respect to a thought; tokenising
/// stops once the prompt and one generated token no longer fit the largest window, so
/// an oversized prompt costs little.
pub(super) fn tokenize(
    state: &AppState,
    prompt: &Prompt,
    tools: Option<&ToolSet>,
    template_kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<(Vec<u32>, Thinking), ApiError> {
    let limit = state.max_context.saturating_sub(1);
    let param = prompt.param();
    let mut thinking = Thinking::Off;
    let ids = match prompt {
        Prompt::Chat(messages) => {
            let template = state.template.as_ref().ok_or_else(|| {
                ApiError::invalid_request("this model has no chat template: use /v1/completions")
            })?;
            let definitions = tools.map_or(&[][..], ToolSet::prompt_tools);
            let uses_tools = !definitions.is_empty()
                || messages
                    .iter()
                    .any(|m| !m.tool_calls.is_empty() || m.role == "tool");
            let rendered = if uses_tools && !template.takes_tools() {
                let messages = tools::fallback_messages(messages, definitions);
                template.render_with(&messages, &[], template_kwargs, true)
            } else {
                template.render_with(messages, definitions, template_kwargs, true)
            };
            let text = rendered.map_err(|e| {
                ApiError::bad_param(
                    "messages",
                    format!("the chat template rejected the messages: {e}"),
                )
            })?;
            thinking = Thinking::of(state.splits_thoughts(), &text);
            // The template carries its own BOS if it wants one; nothing is added on top.
            state.tokenizer.encode_within(&text, true, limit)
        }
        Prompt::Text(text) => state.tokenizer.encode_prompt_within(text, limit),
        Prompt::Ids(ids) => {
            let n_vocab = state.tokenizer.n_vocab();
            if let Some(id) = ids.iter().find(|&&id| id as usize >= n_vocab) {
                return Err(ApiError::bad_param(
                    "prompt",
                    format!("token id {id} is out of range (vocabulary has {n_vocab} tokens)"),
                ));
            }
            if ids.len() > limit {
                return Err(ApiError::prompt_beyond_context(param, state.max_context));
            }
            Ok(ids.clone())
        }
    }
    .map_err(|e| match e {
        TokenizerError::TooManyTokens { .. } => {
            ApiError::prompt_beyond_context(param, state.max_context)
        }
        e => ApiError::invalid_request(format!("the prompt cannot be tokenized: {e}")),
    })?;
    if ids.is_empty() {
        return Err(ApiError::bad_param(param, "the prompt is empty"));
    }
    Ok((ids, thinking))
}
