//! A Responses request read into the request the engine thread serves for chat.
//!
//! `instructions` become the system turn (this turn's only: they are not carried to a
//! continued one), the conversation's items the turns after it ([`super::items`]),
//! function `tools` and `tool_choice` the chat request's, `text.format` the JSON schema
//! constrained decoding enforces, `reasoning.effort` the template's `enable_thinking`.
//! Tools of the hosted kinds (`web_search`, `file_search`, Codex's `namespace` and
//! `custom` tools, …) are not offered to the model — a server on one machine runs none —
//! and the response says so in the `x-pyramid-skipped-tools` header. Fields about
//! OpenAI's service (`prompt_cache_key`, `service_tier`, `safety_identifier`,
//! `client_metadata`) are validated and have nothing to choose between; every other
//! field is read or refused by name.

use serde_json::{json, Map, Value};

use crate::api::{
    json_object, json_schema_format, openai_sampler, opt_seed, temperature_and_top_p,
};
use crate::api::{Endpoint, GenerationRequest, Prompt};
use crate::error::ApiError;
use crate::extensions;
use crate::tools::ToolSet;

use super::items::{input_items, messages};
use super::store::ResponseStore;
use pyramid_tokenizer::ChatMessage;

const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "stream",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "store",
    "include",
    "text",
    "temperature",
    "top_p",
    "max_output_tokens",
    "previous_response_id",
    "metadata",
    "user",
    "truncation",
    "seed",
    "prompt_cache_key",
    "client_metadata",
    "service_tier",
    "safety_identifier",
];

/// The settings a response object repeats from its request.
const ECHOED: &[&str] = &[
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "store",
    "text",
    "temperature",
    "top_p",
    "max_output_tokens",
    "previous_response_id",
    "metadata",
    "user",
    "truncation",
    "service_tier",
];

/// A Responses request, read.
#[derive(Debug)]
pub struct ResponsesRequest {
    pub generation: GenerationRequest,
    /// The conversation through this turn's input: earlier turns' items first.
    pub conversation: Vec<Value>,
    /// The request's settings as the response repeats them.
    pub echo: Map<String, Value>,
    /// Whether the response is kept (`store`, default true).
    pub store: bool,
    /// Tools of kinds this server does not run, left out of the prompt.
    pub skipped_tools: Vec<String>,
}

fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, message)
}

/// Reads a Responses body; `previous_response_id` is looked up in `store`.
pub fn parse(
    body: &[u8],
    max_tools: usize,
    store: &ResponseStore,
) -> Result<ResponsesRequest, ApiError> {
    let obj = json_object(body)?;
    for (field, value) in &obj {
        let known = [FIELDS, extensions::FIELDS, extensions::CHAT_FIELDS]
            .iter()
            .any(|f| f.contains(&field.as_str()));
        if !known && !value.is_null() {
            let why = match field.as_str() {
                "conversation" => "conversations are continued with 'previous_response_id'",
                "background" => "responses are answered in the foreground",
                "prompt" => "stored prompt templates are not kept here",
                "top_logprobs" | "max_tool_calls" => "it is not implemented",
                _ => "it is not a field of this endpoint",
            };
            return Err(bad(field, format!("'{field}' is not accepted: {why}")));
        }
    }
    let model = match obj.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(bad("model", "'model' is required, a string")),
    };
    let mut conversation = match obj.get("previous_response_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(id)) => {
            let previous = store.get(id).ok_or_else(|| {
                bad(
                    "previous_response_id",
                    format!("previous response '{id}' is not stored here (it was made with store: false, deleted, or never made)"),
                )
            })?;
            let made_by = previous.response["model"].as_str().unwrap_or_default();
            if made_by != model {
                return Err(bad(
                    "previous_response_id",
                    format!(
                        "previous response '{id}' was made by model '{made_by}', not '{model}'"
                    ),
                ));
            }
            previous.conversation.clone()
        }
        Some(_) => {
            return Err(bad(
                "previous_response_id",
                "'previous_response_id' must be a string",
            ))
        }
    };
    conversation.extend(input_items(obj.get("input"))?);
    let mut chat = match obj.get("instructions") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(text)) => vec![ChatMessage::new("system", text.clone())],
        Some(_) => return Err(bad("instructions", "'instructions' must be a string")),
    };
    chat.extend(messages(&conversation, "input")?);

    let max_tokens = match obj.get("max_output_tokens") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => {
                return Err(bad(
                    "max_output_tokens",
                    "'max_output_tokens' must be an integer of at least 1",
                ))
            }
        },
    };
    let (temperature, top_p) = temperature_and_top_p(&obj)?;
    let mut sampler = openai_sampler(temperature, top_p, opt_seed(&obj)?);
    let mut extensions = extensions::parse(&obj, &mut sampler, max_tokens)?;
    if let Some(thinking) = reasoning_effort(obj.get("reasoning"))? {
        extensions
            .template_kwargs
            .entry("enable_thinking")
            .or_insert(json!(thinking));
    }
    let stream = flag(&obj, "stream")?.unwrap_or(false);
    let keep = flag(&obj, "store")?.unwrap_or(true);
    let (tools, skipped_tools) = tools(&obj, max_tools)?;
    let response_format = text_format(obj.get("text"))?;
    service_fields(&obj)?;

    let mut echo: Map<String, Value> = ECHOED
        .iter()
        .map(|k| (k.to_string(), obj.get(*k).cloned().unwrap_or(Value::Null)))
        .collect();
    echo.insert("store".into(), json!(keep));
    echo.insert("temperature".into(), json!(temperature));
    echo.insert("top_p".into(), json!(top_p));
    for (field, default) in [
        ("tools", json!([])),
        ("tool_choice", json!("auto")),
        ("parallel_tool_calls", json!(true)),
        ("metadata", json!({})),
        ("truncation", json!("disabled")),
        ("text", json!({"format": {"type": "text"}})),
        ("reasoning", json!({"effort": null, "summary": null})),
    ] {
        if echo[field].is_null() {
            echo.insert(field.into(), default);
        }
    }
    Ok(ResponsesRequest {
        generation: GenerationRequest {
            endpoint: Endpoint::Chat,
            model,
            prompt: Prompt::Chat(chat),
            max_tokens,
            sampler,
            stop: Vec::new(),
            stream,
            include_usage: false,
            logprobs: None,
            tools,
            response_format,
            priority: None,
            speculation: None,
            prediction: None,
            extensions,
            thinking: crate::reasoning::Thinking::Off,
            n: 1,
        },
        conversation,
        echo,
        store: keep,
        skipped_tools,
    })
}

fn flag(obj: &Map<String, Value>, name: &'static str) -> Result<Option<bool>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(name, format!("'{name}' must be a boolean"))),
    }
}

/// `reasoning.effort` as whether a thinking template thinks: not at `none` or
/// `minimal`, at every other level.
fn reasoning_effort(value: Option<&Value>) -> Result<Option<bool>, ApiError> {
    let Some(Value::Object(reasoning)) = value else {
        return match value {
            None | Some(Value::Null) => Ok(None),
            Some(_) => Err(bad("reasoning", "'reasoning' must be an object")),
        };
    };
    if let Some(field) = reasoning
        .keys()
        .find(|k| !["effort", "summary", "generate_summary"].contains(&k.as_str()))
    {
        return Err(bad(
            format!("reasoning.{field}"),
            format!("'reasoning.{field}' is not a field of 'reasoning'"),
        ));
    }
    for name in ["summary", "generate_summary"] {
        match reasoning.get(name) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if ["auto", "concise", "detailed"].contains(&s.as_str()) => {}
            Some(_) => {
                return Err(bad(
                    format!("reasoning.{name}"),
                    format!("'reasoning.{name}' must be auto, concise or detailed"),
                ))
            }
        }
    }
    match reasoning.get("effort") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) => match e.as_str() {
            "none" | "minimal" => Ok(Some(false)),
            "low" | "medium" | "high" | "xhigh" => Ok(Some(true)),
            _ => Err(bad(
                "reasoning.effort",
                "'reasoning.effort' must be none, minimal, low, medium, high or xhigh",
            )),
        },
        Some(_) => Err(bad(
            "reasoning.effort",
            "'reasoning.effort' must be a string",
        )),
    }
}

/// Function `tools` and `tool_choice` in the chat request's terms, validated there; the
/// kinds of tool left out, named.
fn tools(
    obj: &Map<String, Value>,
    max_tools: usize,
) -> Result<(Option<ToolSet>, Vec<String>), ApiError> {
    let list = match obj.get("tools") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(bad("tools", "'tools' must be an array")),
    };
    let mut functions = Vec::new();
    let mut skipped = Vec::new();
    for (i, tool) in list.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut function = Map::new();
                for field in ["name", "description", "parameters", "strict"] {
                    if let Some(v) = tool.get(field).filter(|v| !v.is_null()) {
                        function.insert(field.into(), v.clone());
                    }
                }
                functions.push(json!({"type": "function", "function": function}));
            }
            Some(kind) => {
                let name = tool.get("name").and_then(Value::as_str);
                skipped.push(name.map_or(kind.to_string(), |n| format!("{kind}:{n}")));
            }
            None => {
                return Err(bad(
                    format!("tools[{i}].type"),
                    format!("tools[{i}].type is required"),
                ))
            }
        }
    }
    let mut chat = Map::new();
    if !functions.is_empty() {
        chat.insert("tools".into(), Value::Array(functions));
    }
    match obj.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(choice @ Value::String(_)) if !chat.is_empty() => {
            chat.insert("tool_choice".into(), choice.clone());
        }
        // Without function tools, only choices that ask for none mean anything.
        Some(Value::String(s)) if s == "auto" || s == "none" => {}
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").cloned().unwrap_or(Value::Null);
            chat.insert(
                "tool_choice".into(),
                json!({"type": "function", "function": {"name": name}}),
            );
        }
        Some(_) => {
            return Err(bad(
                "tool_choice",
                "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...} naming a function tool",
            ))
        }
    }
    if let Some(p) = obj.get("parallel_tool_calls").filter(|_| !chat.is_empty()) {
        chat.insert("parallel_tool_calls".into(), p.clone());
    }
    Ok((ToolSet::parse(&chat, max_tools)?, skipped))
}

/// `text.format` (`text`, `json_object`, or `json_schema` with its fields beside the
/// type) as the grammar it enforces; `text.verbosity` is validated.
fn text_format(value: Option<&Value>) -> Result<Option<pyramid_grammar::Grammar>, ApiError> {
    let text = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(text)) => text,
        Some(_) => return Err(bad("text", "'text' must be an object")),
    };
    if let Some(field) = text
        .keys()
        .find(|k| !["format", "verbosity"].contains(&k.as_str()))
    {
        return Err(bad(
            format!("text.{field}"),
            format!("'text.{field}' is not a field of 'text'"),
        ));
    }
    match text.get("verbosity") {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) if ["low", "medium", "high"].contains(&v.as_str()) => {}
        Some(_) => {
            return Err(bad(
                "text.verbosity",
                "'text.verbosity' must be low, medium or high",
            ))
        }
    }
    let format = match text.get("format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(f)) => f,
        Some(_) => return Err(bad("text.format", "'text.format' must be an object")),
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(pyramid_grammar::Grammar::any_json_object())),
        Some("json_schema") => json_schema_format(format, &["type"], "text.format").map(Some),
        _ => Err(bad(
            "text.format.type",
            "'text.format.type' must be text, json_object or json_schema",
        )),
    }
}

/// The fields about OpenAI's service, validated: one machine caches every prefix by
/// itself, has one tier, and keeps no per-user safety records.
fn service_fields(obj: &Map<String, Value>) -> Result<(), ApiError> {
    for name in [
        "prompt_cache_key",
        "safety_identifier",
        "user",
        "service_tier",
    ] {
        match obj.get(name) {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(_) => return Err(bad(name, format!("'{name}' must be a string"))),
        }
    }
    for name in ["metadata", "client_metadata"] {
        match obj.get(name) {
            None | Some(Value::Null | Value::Object(_)) => {}
            Some(_) => return Err(bad(name, format!("'{name}' must be an object"))),
        }
    }
    match obj.get("truncation") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "disabled" => {}
        Some(_) => {
            return Err(bad(
                "truncation",
                "'truncation' must be \"disabled\": a conversation over the context is an error, not cut",
            ))
        }
    }
    match obj.get("include") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Array(list)) => {
            for item in list {
                match item.as_str() {
                    // Reasoning is returned in the clear, so there is nothing to encrypt.
                    Some("reasoning.encrypted_content") => {}
                    Some(other) => {
                        return Err(bad(
                            "include",
                            format!("'include' value '{other}' is not available here"),
                        ))
                    }
                    None => return Err(bad("include", "'include' must hold strings")),
                }
            }
            Ok(())
        }
        Some(_) => Err(bad("include", "'include' must be an array")),
    }
}
