//! A chat request's `messages`: roles, content as a string or text parts, assistant
//! `tool_calls` and `reasoning_content`, and `tool` results, as the chat template reads
//! them.

use pyramid_tokenizer::{ChatMessage, ToolCall};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// The request's `messages`, validated, each error naming the field it is about.
pub(super) fn messages(obj: &Map<String, Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = match obj.get("messages") {
        Some(Value::Array(list)) => list,
        None | Some(Value::Null) => {
            return Err(ApiError::bad_param("messages", "'messages' is required"))
        }
        Some(_) => {
            return Err(ApiError::bad_param(
                "messages",
                "'messages' must be an array",
            ))
        }
    };
    if list.is_empty() {
        return Err(ApiError::bad_param(
            "messages",
            "'messages' must not be empty",
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |field: &str| format!("messages[{i}].{field}");
            let Value::Object(m) = m else {
                return Err(ApiError::bad_param(
                    format!("messages[{i}]"),
                    format!("messages[{i}] must be an object"),
                ));
            };
            let role = match m.get("role") {
                Some(Value::String(r)) => r.as_str(),
                _ => {
                    return Err(ApiError::bad_param(
                        at("role"),
                        format!("{} must be a string", at("role")),
                    ))
                }
            };
            // "developer" is OpenAI's newer name for the system role.
            let role = match role {
                "system" | "developer" => "system",
                "user" | "assistant" | "tool" => role,
                other => {
                    return Err(ApiError::bad_param(
                        at("role"),
                        format!(
                            "{} '{other}' is not one of system, developer, user, assistant, tool",
                            at("role")
                        ),
                    ))
                }
            };
            let content = match m.get("content") {
                Some(Value::String(c)) => c.clone(),
                // An assistant turn that only called tools has no content.
                Some(Value::Null) | None if role == "assistant" => String::new(),
                Some(Value::Array(parts)) => text_parts(parts, &at("content"))?,
                _ => {
                    return Err(ApiError::bad_param(
                        at("content"),
                        format!(
                            "{} must be a string or an array of text parts",
                            at("content")
                        ),
                    ))
                }
            };
            let mut message = ChatMessage::new(role, content);
            match m.get("tool_calls") {
                None | Some(Value::Null) => {}
                Some(Value::Array(calls)) if role == "assistant" => {
                    message.tool_calls = calls
                        .iter()
                        .enumerate()
                        .map(|(j, c)| tool_call(c, &at(&format!("tool_calls[{j}]"))))
                        .collect::<Result<_, _>>()?;
                }
                Some(_) => {
                    return Err(ApiError::bad_param(
                        at("tool_calls"),
                        format!(
                            "{} must be an array, on assistant messages",
                            at("tool_calls")
                        ),
                    ))
                }
            }
            match m.get("tool_call_id") {
                None | Some(Value::Null) => {}
                Some(Value::String(id)) if role == "tool" => {
                    message.tool_call_id = Some(id.clone())
                }
                Some(_) => {
                    return Err(ApiError::bad_param(
                        at("tool_call_id"),
                        format!("{} must be a string, on tool messages", at("tool_call_id")),
                    ))
                }
            }
            // An earlier reply's thought, as this server returns it: templates that think
            // (Qwen3's) print it again within the turn that is still calling tools.
            match m.get("reasoning_content") {
                None | Some(Value::Null) => {}
                Some(Value::String(thought)) if role == "assistant" => {
                    message.reasoning_content = Some(thought.clone())
                }
                Some(_) => {
                    return Err(ApiError::bad_param(
                        at("reasoning_content"),
                        format!(
                            "{} must be a string, on assistant messages",
                            at("reasoning_content")
                        ),
                    ))
                }
            }
            Ok(message)
        })
        .collect()
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}`, the arguments a JSON
/// object in a string as OpenAI sends them (templates print them as JSON).
fn tool_call(call: &Value, at: &str) -> Result<ToolCall, ApiError> {
    let bad = |field: &str, what: &str| {
        ApiError::bad_param(format!("{at}.{field}"), format!("{at}.{field} {what}"))
    };
    let function = call
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("function", "must be an object"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("function.name", "must be a string"))?;
    let arguments = match function.get("arguments") {
        Some(Value::String(text)) => serde_json::from_str(text)
            .map_err(|e| bad("function.arguments", &format!("is not valid JSON: {e}")))?,
        Some(v @ Value::Object(_)) => v.clone(),
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(_) => return Err(bad("function.arguments", "must be a JSON string")),
    };
    Ok(ToolCall {
        id: call
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        name: name.to_string(),
        arguments,
    })
}

fn text_parts(parts: &[Value], at: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        match (part.get("type"), part.get("text")) {
            (Some(Value::String(t)), Some(Value::String(s))) if t == "text" => text.push_str(s),
            _ => {
                return Err(ApiError::bad_param(
                    format!("{at}[{j}]"),
                    format!("{at}[{j}] must be a text part ({{\"type\": \"text\", \"text\": ...}}); this model reads text only"),
                ))
            }
        }
    }
    Ok(text)
}
