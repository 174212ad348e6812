//! A Messages request read into the request the engine thread serves for chat.
//!
//! Anthropic's shapes map onto the chat request one to one: `system` becomes the first
//! message, `tool_use` blocks an assistant turn's calls, `tool_result` blocks `tool`
//! turns, `tools` with `input_schema` functions with `parameters`, and `tool_choice`
//! `any`/`tool` the forced calls constrained decoding enforces, `output_config.format`
//! the JSON schema it enforces. Every field Anthropic documents for a text model is
//! read; the others are refused by name. Some describe Anthropic's service and mean the
//! same on one machine whatever their value: `cache_control` (the prefix cache is
//! automatic), `service_tier`, `speed`, `inference_geo` and `output_config.effort` are
//! validated and have nothing to choose between. `temperature`, `top_p` and `top_k`,
//! which newer SDKs no longer send, are read as before.

use pyramid_runtime::SamplerConfig;
use pyramid_tokenizer::{ChatMessage, ToolCall};
use serde_json::{json, Map, Value};

use crate::api::{json_object, opt_f64, random_seed, Endpoint, GenerationRequest, Prompt};
use crate::error::ApiError;
use crate::extensions::Extensions;
use crate::tools::ToolSet;

use super::options::{context_management, output_config, service_fields, thinking};

/// Stop sequences a request may give.
const MAX_STOP_SEQUENCES: usize = 16;

/// The fields of a Messages request; `max_tokens` is required outside `count_tokens`.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "stream",
    "tools",
    "tool_choice",
    "metadata",
    "thinking",
    "cache_control",
    "output_config",
    "service_tier",
    "speed",
    "inference_geo",
    "context_management",
];

/// Which request the body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Generate,
    CountTokens,
}

/// Reads a Messages body; `max_tools` caps `tools` as for chat completions.
pub fn parse(
    body: &[u8],
    purpose: Purpose,
    max_tools: usize,
) -> Result<GenerationRequest, ApiError> {
    let obj = json_object(body)?;
    if let Some((field, _)) = obj
        .iter()
        .find(|(k, v)| !v.is_null() && !FIELDS.contains(&k.as_str()))
    {
        return Err(bad(
            field,
            format!("'{field}' is not accepted: it is not a field of this endpoint"),
        ));
    }
    let model = match obj.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(bad("model", "'model' is required, a string")),
    };
    let max_tokens = match (obj.get("max_tokens"), purpose) {
        (None | Some(Value::Null), Purpose::CountTokens) => None,
        (Some(Value::Number(n)), _) => match n.as_u64() {
            Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => {
                return Err(bad(
                    "max_tokens",
                    "'max_tokens' must be an integer of at least 1",
                ))
            }
        },
        _ => return Err(bad("max_tokens", "'max_tokens' is required, an integer")),
    };
    let mut messages = system(obj.get("system"))?;
    messages.extend(turns(&obj)?);
    let temperature = opt_f64(&obj, "temperature")?.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&temperature) {
        return Err(bad("temperature", "'temperature' must be between 0 and 1"));
    }
    let top_p = opt_f64(&obj, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(bad("top_p", "'top_p' must be in (0, 1]"));
    }
    let top_k = match obj.get("top_k") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .and_then(|k| usize::try_from(k).ok())
            .ok_or_else(|| bad("top_k", "'top_k' must be a non-negative integer"))?,
    };
    let sampler = SamplerConfig {
        temperature: temperature as f32,
        top_p: (top_p as f32).max(f32::MIN_POSITIVE),
        top_k,
        seed: random_seed(),
        ..SamplerConfig::greedy()
    };
    let stop = match obj.get("stop_sequences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) if list.len() <= MAX_STOP_SEQUENCES => list
            .iter()
            .map(|s| s.as_str().filter(|s| !s.is_empty()).map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                bad(
                    "stop_sequences",
                    "'stop_sequences' must hold non-empty strings",
                )
            })?,
        Some(_) => {
            return Err(bad(
                "stop_sequences",
                format!("'stop_sequences' must be an array of up to {MAX_STOP_SEQUENCES} strings"),
            ))
        }
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream", "'stream' must be a boolean")),
    };
    match obj.get("metadata") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(_) => return Err(bad("metadata", "'metadata' must be an object")),
    }
    service_fields(&obj)?;
    context_management(obj.get("context_management"))?;
    let response_format = output_config(obj.get("output_config"))?;
    Ok(GenerationRequest {
        endpoint: Endpoint::Chat,
        model,
        prompt: Prompt::Chat(messages),
        max_tokens,
        sampler,
        stop,
        stream,
        include_usage: false,
        logprobs: None,
        tools: tools(&obj, max_tools)?,
        response_format,
        priority: None,
        speculation: None,
        prediction: None,
        extensions: Extensions {
            template_kwargs: thinking(obj.get("thinking"))?,
            ..Extensions::default()
        },
        thinking: crate::reasoning::Thinking::Off,
        n: 1,
    })
}

fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, message)
}

/// `system` as a string or text blocks: the first message.
fn system(value: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let text = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(value) => text_of(value, "system")?
            .ok_or_else(|| bad("system", "'system' must be a string or text blocks"))?,
    };
    Ok(vec![ChatMessage::new("system", text)])
}

/// The text of a string or of an array of text blocks (`at` names it); `None` for
/// anything else.
fn text_of(value: &Value, at: &str) -> Result<Option<String>, ApiError> {
    Ok(match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) => Some(
            blocks
                .iter()
                .enumerate()
                .map(|(i, b)| text_block(b, &format!("{at}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
        ),
        _ => None,
    })
}

/// A `{"type": "text", "text"}` block's text (`cache_control` may ride along: the
/// prefix cache is automatic).
fn text_block(block: &Value, at: &str) -> Result<String, ApiError> {
    match (block.get("type").and_then(Value::as_str), block.get("text")) {
        (Some("text"), Some(Value::String(text))) => Ok(text.clone()),
        _ => Err(bad(
            at,
            format!("{at} must be a text block ({{\"type\": \"text\", \"text\": ...}})"),
        )),
    }
}

/// `messages`: user and assistant turns of text, `tool_use` and `tool_result` blocks
/// (and system turns of text), as chat messages (a user turn's tool results each become a
/// `tool` message, in order, before its text).
fn turns(obj: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match obj.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => list,
        _ => return Err(bad("messages", "'messages' is required, a non-empty array")),
    };
    let mut out = Vec::new();
    for (i, turn) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        // A system turn mid-conversation (Claude Code's notices) is text the template
        // renders in its place.
        let role = match turn.get("role").and_then(Value::as_str) {
            Some(role @ ("user" | "assistant" | "system")) => role,
            _ => {
                return Err(bad(
                    format!("{at}.role"),
                    format!("{at}.role must be \"user\", \"assistant\" or \"system\""),
                ))
            }
        };
        let blocks = match turn.get("content") {
            Some(Value::String(text)) => {
                out.push(ChatMessage::new(role, text.clone()));
                continue;
            }
            Some(Value::Array(blocks)) => blocks,
            _ => {
                return Err(bad(
                    format!("{at}.content"),
                    format!("{at}.content must be a string or an array of blocks"),
                ))
            }
        };
        let mut message = ChatMessage::new(role, "");
        for (j, block) in blocks.iter().enumerate() {
            let at = format!("{at}.content[{j}]");
            match (block.get("type").and_then(Value::as_str), role) {
                (Some("text"), _) => message.content.push_str(&text_block(block, &at)?),
                (Some("tool_use"), "assistant") => message.tool_calls.push(tool_use(block, &at)?),
                (Some("tool_result"), "user") => out.push(tool_result(block, &at)?),
                // A model's earlier thought is not part of what the next turn reads.
                (Some("thinking" | "redacted_thinking"), "assistant") => {}
                (Some(other), _) => {
                    return Err(bad(
                        format!("{at}.type"),
                        format!("{at}.type '{other}' is not accepted in a {role} turn (text, tool_use from the assistant, tool_result from the user; this model reads text only)"),
                    ))
                }
                (None, _) => return Err(bad(format!("{at}.type"), format!("{at}.type is required"))),
            }
        }
        if !message.content.is_empty() || !message.tool_calls.is_empty() || role == "assistant" {
            out.push(message);
        }
    }
    Ok(out)
}

fn tool_use(block: &Value, at: &str) -> Result<ToolCall, ApiError> {
    let field = |name: &str| block.get(name).and_then(Value::as_str).map(str::to_string);
    let name = field("name")
        .ok_or_else(|| bad(format!("{at}.name"), format!("{at}.name must be a string")))?;
    let arguments = match block.get("input") {
        Some(v @ Value::Object(_)) => v.clone(),
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(_) => {
            return Err(bad(
                format!("{at}.input"),
                format!("{at}.input must be an object"),
            ))
        }
    };
    Ok(ToolCall {
        id: field("id").unwrap_or_default(),
        name,
        arguments,
    })
}

/// A tool's answer: its text (a string or text blocks), marked when it is an error.
fn tool_result(block: &Value, at: &str) -> Result<ChatMessage, ApiError> {
    let id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            bad(
                format!("{at}.tool_use_id"),
                format!("{at}.tool_use_id must be a string"),
            )
        })?;
    let mut text = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(content) => text_of(content, &format!("{at}.content"))?.ok_or_else(|| {
            bad(
                format!("{at}.content"),
                format!("{at}.content must be a string or text blocks"),
            )
        })?,
    };
    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        text = format!("Error: {text}");
    }
    let mut message = ChatMessage::new("tool", text);
    message.tool_call_id = Some(id.to_string());
    Ok(message)
}

/// `tools` and `tool_choice` in the chat request's terms, validated as there.
fn tools(obj: &Map<String, Value>, max_tools: usize) -> Result<Option<ToolSet>, ApiError> {
    let mut chat = Map::new();
    let list = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(list),
        Some(_) => return Err(bad("tools", "'tools' must be an array")),
    };
    if let Some(list) = list {
        let functions = list
            .iter()
            .enumerate()
            .map(|(i, tool)| {
                let at = format!("tools[{i}]");
                if let Some(kind) = tool.get("type").and_then(Value::as_str) {
                    if kind != "custom" {
                        return Err(bad(format!("{at}.type"), format!("{at}.type '{kind}': only client tools (with input_schema) are served")));
                    }
                }
                let name = tool.get("name").and_then(Value::as_str);
                let schema = tool.get("input_schema").filter(|s| s.is_object());
                let (Some(name), Some(schema)) = (name, schema) else {
                    return Err(bad(at.clone(), format!("{at} must have a name and an input_schema object")));
                };
                let mut function = json!({"name": name, "parameters": schema});
                if let Some(description) = tool.get("description") {
                    function["description"] = description.clone();
                }
                Ok(json!({"type": "function", "function": function}))
            })
            .collect::<Result<Vec<_>, _>>()?;
        chat.insert("tools".into(), Value::Array(functions));
    }
    match obj.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(choice) => {
            let kind = choice.get("type").and_then(Value::as_str);
            let openai = match kind {
                Some("auto") => json!("auto"),
                Some("any") => json!("required"),
                Some("none") => json!("none"),
                Some("tool") => match choice.get("name").and_then(Value::as_str) {
                    Some(name) => json!({"type": "function", "function": {"name": name}}),
                    None => {
                        return Err(bad(
                            "tool_choice.name",
                            "'tool_choice.name' is required for type \"tool\"",
                        ))
                    }
                },
                _ => {
                    return Err(bad(
                        "tool_choice.type",
                        "'tool_choice.type' must be auto, any, tool or none",
                    ))
                }
            };
            chat.insert("tool_choice".into(), openai);
            if let Some(disable) = choice.get("disable_parallel_tool_use") {
                let disable = disable.as_bool().ok_or_else(|| {
                    bad(
                        "tool_choice.disable_parallel_tool_use",
                        "'tool_choice.disable_parallel_tool_use' must be a boolean",
                    )
                })?;
                chat.insert("parallel_tool_calls".into(), json!(!disable));
            }
        }
    }
    ToolSet::parse(&chat, max_tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DEFAULT_MAX_TOOLS;
    use crate::tools::ToolChoice;

    fn parsed(body: Value) -> Result<GenerationRequest, ApiError> {
        parse(
            body.to_string().as_bytes(),
            Purpose::Generate,
            DEFAULT_MAX_TOOLS,
        )
    }

    #[test]
    fn a_tool_round_trip_reads_as_chat_messages() {
        let r = parsed(json!({
            "model": "m", "max_tokens": 64, "temperature": 0.5, "top_k": 5,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                    {"type": "text", "text": "Thanks"}]}],
            "tools": [{"name": "weather", "description": "Weather now",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"], "metadata": {"user_id": "u"}, "stream": true,
            "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        }))
        .unwrap();
        let Prompt::Chat(m) = &r.prompt else { panic!() };
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(m[0].content, "Be brief.");
        assert_eq!(m[2].tool_calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(
            (m[3].tool_call_id.as_deref(), m[3].content.as_str()),
            (Some("toolu_1"), "18 C")
        );
        let tools = r.tools.unwrap();
        assert_eq!(tools.choice, ToolChoice::Required);
        assert!(!tools.parallel);
        assert_eq!((r.sampler.temperature, r.sampler.top_k), (0.5, 5));
        assert_eq!(
            (r.max_tokens, r.stop, r.stream),
            (Some(64), vec!["END".to_string()], true)
        );
    }

    #[test]
    fn bad_requests_name_their_field() {
        let ok =
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        let with = |field: &str, value: Value| {
            let mut body = ok.clone();
            body[field] = value;
            body
        };
        for (body, param) in [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
                "max_tokens",
            ),
            (with("temperature", json!(1.5)), "temperature"),
            (
                with("tool_choice", json!({"type": "sometimes"})),
                "tool_choice.type",
            ),
            (
                with("messages", json!([{"role": "tool", "content": "x"}])),
                "messages[0].role",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                ),
                "messages[0].content[0].type",
            ),
            (with("container", json!("c")), "container"),
            (with("thinking", json!({"type": "maybe"})), "thinking.type"),
            (
                with("output_config", json!({"format": {"type": "text"}})),
                "output_config.format",
            ),
            (
                with("output_config", json!({"effort": "extreme"})),
                "output_config.effort",
            ),
            (with("speed", json!("warp")), "speed"),
            (
                with(
                    "context_management",
                    json!({"edits": [{"type": "clear_tool_uses_20250919"}]}),
                ),
                "context_management.edits[0].type",
            ),
        ] {
            let err = parsed(body.clone()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
        }
        // count_tokens needs no max_tokens.
        let mut count = ok.clone();
        count.as_object_mut().unwrap().remove("max_tokens");
        parse(
            count.to_string().as_bytes(),
            Purpose::CountTokens,
            DEFAULT_MAX_TOOLS,
        )
        .unwrap();
    }
}
