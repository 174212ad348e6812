//! OpenAI request parsing and validation.
//!
//! Requests are read from a `serde_json::Value` field by field rather than derived: a
//! wrong type or value then becomes a 400 naming the parameter as the client spelled it
//! (`messages[2].content`, `top_p`), where a derived deserialiser would report a line and
//! column. A field pyramid does not implement is refused by name (see [`SHARED_FIELDS`];
//! the local-server extensions are read in [`crate::extensions`]).

use pyramid_engine::Speculation;
use pyramid_grammar::Grammar;
use pyramid_runtime::SamplerConfig;
use pyramid_tokenizer::ChatMessage;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::extensions::{self, Extensions};
use crate::reasoning::Thinking;
use crate::tools::ToolSet;

mod messages;

/// At most this many stop strings, as in OpenAI's API.
const MAX_STOPS: usize = 4;
/// `top_logprobs` is capped here, as in OpenAI's API.
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Tools a chat request may define, by default: OpenAI's limit.
pub const DEFAULT_MAX_TOOLS: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

#[derive(Debug, Clone)]
pub enum Prompt {
    Chat(Vec<ChatMessage>),
    Text(String),
    /// `/v1/completions` with `prompt` as token ids, used as given.
    Ids(Vec<u32>),
}

impl Prompt {
    /// The request field the prompt came in, named by errors about it.
    pub fn param(&self) -> &'static str {
        match self {
            Prompt::Chat(_) => "messages",
            Prompt::Text(_) | Prompt::Ids(_) => "prompt",
        }
    }
}

/// The fields both endpoints implement, then each one's own; any other field in a body is
/// refused with a 400 naming it (as OpenAI answers an unrecognised argument), never
/// silently ignored. A field set to `null` counts as absent.
const SHARED_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "priority",
    "speculative",
];
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "prediction",
];
const COMPLETION_FIELDS: &[&str] = &["prompt"];

/// Fields clients commonly send that pyramid does not implement, with the reason its 400 gives.
fn unsupported(field: &str) -> Option<&'static str> {
    Some(match field {
        "functions" | "function_call" => {
            "the legacy functions API is not supported: use 'tools' and 'tool_choice'"
        }
        "echo" | "suffix" | "best_of" => "it is not supported",
        "logprobs"
        | "tools"
        | "tool_choice"
        | "parallel_tool_calls"
        | "response_format"
        | "prediction"
        | "chat_template_kwargs" => "it is supported on /v1/chat/completions only",
        _ => return None,
    })
}

/// A logit bias must lie within ± this, as in OpenAI's API.
const MAX_LOGIT_BIAS: f64 = 100.0;

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub endpoint: Endpoint,
    pub model: String,
    pub prompt: Prompt,
    /// `None`: until the end-of-generation token or the window runs out.
    pub max_tokens: Option<usize>,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// `Some(k)`: report each token's logprob and its `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Tools the model may call (chat only).
    pub tools: Option<ToolSet>,
    /// `response_format`: the JSON the reply must be (chat only).
    pub response_format: Option<Grammar>,
    /// `priority`: lower is more urgent (vLLM's convention); `None` leaves it to the
    /// `X-Priority` header, else 0.
    pub priority: Option<i32>,
    /// `speculative` (`"ngram"`/`true`, `"off"`/`false`): prompt-lookup speculative
    /// decoding for this request; `None` leaves it to the server's `--speculative`.
    pub speculation: Option<Speculation>,
    /// `prediction` (chat only): text the reply is expected to contain, which
    /// speculative decoding drafts from (OpenAI's predicted outputs).
    pub prediction: Option<String>,
    /// The local-server extensions beyond the sampler's settings.
    pub extensions: Extensions,
    /// Where the reply starts with respect to a thought: set once the prompt is
    /// rendered ([`crate::reasoning`]).
    pub thinking: Thinking,
    /// Choices to generate (`n`): each its own sequence, sampled with its own seed, the
    /// prompt prefilled once and shared (the engine forks it).
    pub n: usize,
}

/// The most choices (`n`) a request may ask for.
pub const MAX_CHOICES: u64 = 16;

/// A request body as the JSON object every endpoint takes.
pub(crate) fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_request(format!("the body is not valid JSON: {e}")))?;
    match value {
        Value::Object(obj) => Ok(obj),
        _ => Err(ApiError::invalid_request("the body must be a JSON object")),
    }
}

/// `max_tools`: the most tools a chat request may define.
pub fn parse(
    endpoint: Endpoint,
    body: &[u8],
    max_tools: usize,
) -> Result<GenerationRequest, ApiError> {
    let obj = json_object(body)?;
    let known = match endpoint {
        Endpoint::Chat => CHAT_FIELDS,
        Endpoint::Completion => COMPLETION_FIELDS,
    };
    let chat_extensions = match endpoint {
        Endpoint::Chat => extensions::CHAT_FIELDS,
        Endpoint::Completion => &[],
    };
    if let Some((field, _)) = obj.iter().find(|(k, v)| {
        let k = k.as_str();
        !v.is_null()
            && ![SHARED_FIELDS, known, extensions::FIELDS, chat_extensions]
                .iter()
                .any(|fields| fields.contains(&k))
    }) {
        let why = unsupported(field).unwrap_or("it is not a field of this endpoint");
        return Err(ApiError::bad_param(
            field.clone(),
            format!("'{field}' is not accepted: {why}"),
        ));
    }
    let model = match obj.get("model") {
        Some(Value::String(m)) => m.clone(),
        None | Some(Value::Null) => {
            return Err(ApiError::bad_param("model", "'model' is required"))
        }
        Some(_) => return Err(ApiError::bad_param("model", "'model' must be a string")),
    };
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(messages::messages(&obj)?),
        Endpoint::Completion => completion_prompt(&obj)?,
    };
    let n = match opt_u64(&obj, "n")?.unwrap_or(1) {
        n @ 1..=MAX_CHOICES => n as usize,
        _ => {
            return Err(ApiError::bad_param(
                "n",
                format!("'n' must be between 1 and {MAX_CHOICES}"),
            ))
        }
    };
    let max_tokens = match endpoint {
        Endpoint::Chat => opt_u64(&obj, "max_completion_tokens")?
            .map(|v| ("max_completion_tokens", v))
            .or(opt_u64(&obj, "max_tokens")?.map(|v| ("max_tokens", v))),
        Endpoint::Completion => opt_u64(&obj, "max_tokens")?.map(|v| ("max_tokens", v)),
    };
    let max_tokens = match max_tokens {
        Some((name, 0)) => {
            return Err(ApiError::bad_param(
                name,
                format!("'{name}' must be at least 1"),
            ))
        }
        Some((_, v)) => Some(usize::try_from(v).unwrap_or(usize::MAX)),
        None => None,
    };
    let (temperature, top_p) = temperature_and_top_p(&obj)?;
    for name in ["presence_penalty", "frequency_penalty"] {
        if let Some(v) = opt_f64(&obj, name)? {
            if !(-2.0..=2.0).contains(&v) {
                return Err(ApiError::bad_param(
                    name,
                    format!("'{name}' must be between -2 and 2"),
                ));
            }
            if v != 0.0 {
                return Err(ApiError::bad_param(
                    name,
                    format!("'{name}' is not supported (only 0)"),
                ));
            }
        }
    }
    let seed = opt_seed(&obj)?;
    let mut sampler = SamplerConfig {
        logit_bias: logit_bias(&obj)?,
        ..openai_sampler(temperature, top_p, seed)
    };
    let extensions = extensions::parse(&obj, &mut sampler, max_tokens)?;
    let stop = stops(&obj)?;
    let stream = opt_bool(&obj, "stream")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(_) if !stream => {
            return Err(ApiError::bad_param(
                "stream_options",
                "'stream_options' is only allowed when 'stream' is true",
            ))
        }
        Some(Value::Object(o)) => opt_bool(o, "include_usage")
            .map_err(|_| {
                ApiError::bad_param(
                    "stream_options.include_usage",
                    "'stream_options.include_usage' must be a boolean",
                )
            })?
            .unwrap_or(false),
        Some(_) => {
            return Err(ApiError::bad_param(
                "stream_options",
                "'stream_options' must be an object",
            ))
        }
    };
    let logprobs = match endpoint {
        Endpoint::Chat => {
            let wanted = opt_bool(&obj, "logprobs")?.unwrap_or(false);
            let top = opt_u64(&obj, "top_logprobs")?;
            if let Some(k) = top {
                if k > MAX_TOP_LOGPROBS as u64 {
                    return Err(ApiError::bad_param(
                        "top_logprobs",
                        format!("'top_logprobs' must be at most {MAX_TOP_LOGPROBS}"),
                    ));
                }
                if !wanted {
                    return Err(ApiError::bad_param(
                        "top_logprobs",
                        "'top_logprobs' needs 'logprobs': true",
                    ));
                }
            }
            wanted.then(|| top.unwrap_or(0) as usize)
        }
        Endpoint::Completion => None,
    };
    let (tools, response_format) = match endpoint {
        Endpoint::Chat => (ToolSet::parse(&obj, max_tools)?, response_format(&obj)?),
        Endpoint::Completion => (None, None),
    };
    Ok(GenerationRequest {
        endpoint,
        model,
        prompt,
        max_tokens,
        sampler,
        stop,
        stream,
        include_usage,
        logprobs,
        tools,
        response_format,
        priority: opt_priority(obj.get("priority"), "priority")?,
        speculation: opt_speculation(obj.get("speculative"))?,
        prediction: match endpoint {
            Endpoint::Chat => prediction(obj.get("prediction"))?,
            Endpoint::Completion => None,
        },
        extensions,
        thinking: Thinking::Off,
        n,
    })
}

/// `prediction`: `{"type": "content", "content": TEXT}`, the content a string or an array
/// of `{"type": "text", "text": ...}` parts (joined).
fn prediction(value: Option<&Value>) -> Result<Option<String>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            "prediction",
            "'prediction' must be {\"type\": \"content\", \"content\": a string or an array of text parts}",
        )
    };
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let obj = value.as_object().ok_or_else(bad)?;
    if obj.get("type").and_then(Value::as_str) != Some("content") {
        return Err(bad());
    }
    match obj.get("content") {
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.as_str()),
                    _ => Err(bad()),
                },
            )
            .collect::<Result<String, _>>()
            .map(Some),
        _ => Err(bad()),
    }
}

/// `speculative`: `"ngram"` or `true` drafts from the request's own tokens, `"off"` or
/// `false` decodes one token per pass.
fn opt_speculation(value: Option<&Value>) -> Result<Option<Speculation>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            "speculative",
            "'speculative' must be \"ngram\", \"off\", true or false",
        )
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(Speculation::Ngram)),
        Some(Value::Bool(false)) => Ok(Some(Speculation::Off)),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|_| bad()),
        Some(_) => Err(bad()),
    }
}

/// A request priority: an integer within ±2^31, from the body's `priority` or (as text)
/// the `X-Priority` header; `name` is what the 400 names.
pub fn opt_priority(value: Option<&Value>, name: &str) -> Result<Option<i32>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            name,
            format!(
                "'{name}' must be an integer from -2147483648 to 2147483647 (lower is more urgent)"
            ),
        )
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .and_then(|v| i32::try_from(v).ok())
            .map(Some)
            .ok_or_else(bad),
        Some(Value::String(s)) => s.trim().parse::<i32>().map(Some).map_err(|_| bad()),
        Some(_) => Err(bad()),
    }
}

/// `{"type": "text"}`, `{"type": "json_object"}`, or
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`.
/// The schema is always enforced, `strict` or not.
fn response_format(obj: &Map<String, Value>) -> Result<Option<Grammar>, ApiError> {
    let format = match obj.get("response_format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(f)) => f,
        Some(_) => {
            return Err(ApiError::bad_param(
                "response_format",
                "'response_format' must be an object",
            ))
        }
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::any_json_object())),
        Some("json_schema") => {
            let at = "response_format.json_schema";
            let spec = format
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| ApiError::bad_param(at, format!("'{at}' must be an object")))?;
            json_schema_format(spec, &[], at).map(Some)
        }
        _ => Err(ApiError::bad_param(
            "response_format.type",
            "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// A JSON schema format's fields (`name`, `schema`, `strict`, `description`, and the
/// `also` fields of the object they sit in), found at `at`, as the grammar it enforces.
/// The schema is always enforced, `strict` or not.
pub(crate) fn json_schema_format(
    spec: &Map<String, Value>,
    also: &[&str],
    at: &str,
) -> Result<Grammar, ApiError> {
    match spec.get("name") {
        Some(Value::String(n)) if !n.is_empty() => {}
        _ => {
            return Err(ApiError::bad_param(
                format!("{at}.name"),
                format!("'{at}.name' is required"),
            ))
        }
    }
    if let Some(field) = spec.keys().find(|k| {
        !["name", "schema", "strict", "description"].contains(&k.as_str())
            && !also.contains(&k.as_str())
    }) {
        return Err(ApiError::bad_param(
            format!("{at}.{field}"),
            format!("'{at}.{field}' is not a field of a JSON schema format"),
        ));
    }
    match spec.get("schema") {
        Some(schema @ Value::Object(_)) => Ok(Grammar::json_schema(schema)),
        // OpenAI takes a missing schema as any JSON object.
        None | Some(Value::Null) => Ok(Grammar::any_json_object()),
        Some(_) => Err(ApiError::bad_param(
            format!("{at}.schema"),
            format!("'{at}.schema' must be a JSON schema object"),
        )),
    }
}

/// `temperature` (0 to 2) and `top_p` ((0, 1]), each 1 when absent, as OpenAI's
/// endpoints take them.
pub(crate) fn temperature_and_top_p(obj: &Map<String, Value>) -> Result<(f64, f64), ApiError> {
    let temperature = opt_f64(obj, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad_param(
            "temperature",
            "'temperature' must be between 0 and 2",
        ));
    }
    let top_p = opt_f64(obj, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_param("top_p", "'top_p' must be in (0, 1]"));
    }
    Ok((temperature, top_p))
}

/// `seed`: an integer (a negative one taken as its bits); `None` when absent.
pub(crate) fn opt_seed(obj: &Map<String, Value>) -> Result<Option<u64>, ApiError> {
    match obj.get("seed") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .or_else(|| n.as_i64().map(|v| v as u64))
            .map(Some)
            .ok_or_else(|| ApiError::bad_param("seed", "'seed' must be an integer")),
        Some(_) => Err(ApiError::bad_param("seed", "'seed' must be an integer")),
    }
}

/// The sampler for OpenAI's settings, the rest greedy's defaults.
pub(crate) fn openai_sampler(temperature: f64, top_p: f64, seed: Option<u64>) -> SamplerConfig {
    SamplerConfig {
        temperature: temperature as f32,
        // A top_p below f32's range keeps only the top token, as the smallest f32 does.
        top_p: (top_p as f32).max(f32::MIN_POSITIVE),
        // Without a seed every request samples differently, as clients expect.
        seed: seed.unwrap_or_else(random_seed),
        ..SamplerConfig::greedy()
    }
}

/// A fresh random number (seeds, call ids).
pub(crate) fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// A string, one string in an array, token ids, or one array of token ids.
fn completion_prompt(obj: &Map<String, Value>) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::bad_param(
            "prompt",
            "'prompt' must be a string or an array of token ids",
        )
    };
    let ids = |list: &[Value]| -> Result<Prompt, ApiError> {
        list.iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(bad)
            })
            .collect::<Result<Vec<u32>, _>>()
            .map(Prompt::Ids)
    };
    match obj.get("prompt") {
        Some(Value::String(p)) => Ok(Prompt::Text(p.clone())),
        Some(Value::Array(list)) => match list.as_slice() {
            [Value::String(p)] => Ok(Prompt::Text(p.clone())),
            [Value::Array(inner)] => ids(inner),
            [Value::Number(_), ..] => ids(list),
            [] => Err(ApiError::bad_param("prompt", "'prompt' must not be empty")),
            _ if list.iter().all(|v| v.is_string() || v.is_array()) => Err(ApiError::bad_param(
                "prompt",
                "only one prompt per request is supported",
            )),
            _ => Err(bad()),
        },
        None | Some(Value::Null) => Err(ApiError::bad_param("prompt", "'prompt' is required")),
        Some(_) => Err(bad()),
    }
}

/// `{"token id": bias}`, each bias in [-100, 100] added to that token's logit.
fn logit_bias(obj: &Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = match obj.get("logit_bias") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(ApiError::bad_param(
                "logit_bias",
                "'logit_bias' must be an object of token ids to numbers",
            ))
        }
    };
    map.iter()
        .map(|(id, bias)| {
            let at = format!("logit_bias.{id}");
            let id = id.parse::<u32>().map_err(|_| {
                ApiError::bad_param(at.clone(), format!("'{id}' is not a token id"))
            })?;
            match bias.as_f64() {
                Some(b) if (-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&b) => Ok((id, b as f32)),
                _ => Err(ApiError::bad_param(
                    at.clone(),
                    format!("'{at}' must be a number between -100 and 100"),
                )),
            }
        })
        .collect()
}

fn stops(obj: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            "stop",
            format!("'stop' must be a non-empty string or an array of up to {MAX_STOPS} of them"),
        )
    };
    let stops = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) if list.len() <= MAX_STOPS => list
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if stops.iter().any(String::is_empty) {
        return Err(bad());
    }
    Ok(stops)
}

fn opt_u64(obj: &Map<String, Value>, name: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(v), _) => Ok(Some(v)),
            (None, Some(_)) => Err(ApiError::bad_param(
                name,
                format!("'{name}' must not be negative"),
            )),
            _ => Err(ApiError::bad_param(
                name,
                format!("'{name}' must be an integer"),
            )),
        },
        Some(_) => Err(ApiError::bad_param(
            name,
            format!("'{name}' must be an integer"),
        )),
    }
}

pub(crate) fn opt_f64(obj: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(ApiError::bad_param(
            name,
            format!("'{name}' must be a number"),
        )),
    }
}

fn opt_bool(obj: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_param(
            name,
            format!("'{name}' must be a boolean"),
        )),
    }
}

#[cfg(test)]
mod tests;
