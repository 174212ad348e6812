//! A Responses conversation's items as the chat messages the template renders: messages
//! (`user`, `assistant`, `system`, `developer`), `function_call` and
//! `function_call_output`, and `reasoning`, whose thought is not part of what the next
//! turn reads. Items are stored as given and read again on every continued turn, so one
//! reader serves a request's `input` and a stored conversation alike.

use pyramid_tokenizer::{ChatMessage, ToolCall};
use serde_json::{Map, Value};

use crate::error::ApiError;

fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, message)
}

/// `input` as items: a string is one user message.
pub(super) fn input_items(value: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    match value {
        Some(Value::String(text)) => Ok(vec![serde_json::json!({
            "type": "message", "role": "user", "content": text,
        })]),
        Some(Value::Array(items)) if !items.is_empty() => Ok(items.clone()),
        _ => Err(bad(
            "input",
            "'input' is required, a string or a non-empty array of items",
        )),
    }
}

/// The chat messages of `items`; `at` names the field they came in (`input`, or the
/// stored conversation).
pub(super) fn messages(items: &[Value], at: &str) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let Some(item) = item.as_object() else {
            return Err(bad(&at, format!("{at} must be an object")));
        };
        // An item without a type is a message (the SDK's short form).
        match item.get("type").and_then(Value::as_str).unwrap_or("message") {
            "message" => out.push(message(item, &at)?),
            "function_call" => {
                let call = function_call(item, &at)?;
                // Calls after an assistant turn belong to it.
                match out.last_mut() {
                    Some(last) if last.role == "assistant" => last.tool_calls.push(call),
                    _ => {
                        let mut turn = ChatMessage::new("assistant", "");
                        turn.tool_calls.push(call);
                        out.push(turn);
                    }
                }
            }
            "function_call_output" => out.push(function_call_output(item, &at)?),
            "reasoning" => {}
            other => {
                return Err(bad(
                    format!("{at}.type"),
                    format!("{at}.type '{other}' is not accepted: items are message, function_call, function_call_output or reasoning (this server runs no hosted tools)"),
                ))
            }
        }
    }
    Ok(out)
}

fn message(item: &Map<String, Value>, at: &str) -> Result<ChatMessage, ApiError> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some(role @ ("user" | "assistant" | "system")) => role,
        // The templates know the developer's instructions as the system turn.
        Some("developer") => "system",
        _ => {
            return Err(bad(
                format!("{at}.role"),
                format!("{at}.role must be user, assistant, system or developer"),
            ))
        }
    };
    let text = text_of(item.get("content"), &format!("{at}.content"))?;
    Ok(ChatMessage::new(role, text))
}

/// A string, or content parts of text (`input_text`, `output_text`, `refusal`).
fn text_of(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match content {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{at}[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                let field = if kind == Some("refusal") {
                    "refusal"
                } else {
                    "text"
                };
                match (kind, part.get(field)) {
                    (Some("input_text" | "output_text" | "text" | "refusal"), Some(Value::String(t))) => {
                        text.push_str(t)
                    }
                    (Some(kind @ ("input_image" | "input_file" | "input_audio")), _) => {
                        return Err(bad(
                            format!("{at}.type"),
                            format!("{at} is {kind}: this model reads text only"),
                        ))
                    }
                    _ => {
                        return Err(bad(
                            &at,
                            format!("{at} must be a text part ({{\"type\": \"input_text\", \"text\": ...}})"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(bad(at, format!("{at} must be a string or content parts"))),
    }
}

fn string_field<'a>(
    item: &'a Map<String, Value>,
    name: &str,
    at: &str,
) -> Result<&'a str, ApiError> {
    item.get(name).and_then(Value::as_str).ok_or_else(|| {
        bad(
            format!("{at}.{name}"),
            format!("{at}.{name} must be a string"),
        )
    })
}

fn function_call(item: &Map<String, Value>, at: &str) -> Result<ToolCall, ApiError> {
    let arguments = string_field(item, "arguments", at)?;
    Ok(ToolCall {
        id: string_field(item, "call_id", at)?.to_string(),
        name: string_field(item, "name", at)?.to_string(),
        // A call cut off mid-arguments is shown to the template as the text it was.
        arguments: serde_json::from_str(arguments)
            .unwrap_or_else(|_| Value::String(arguments.to_string())),
    })
}

fn function_call_output(item: &Map<String, Value>, at: &str) -> Result<ChatMessage, ApiError> {
    let id = string_field(item, "call_id", at)?;
    let text = text_of(item.get("output"), &format!("{at}.output"))?;
    let mut message = ChatMessage::new("tool", text);
    message.tool_call_id = Some(id.to_string());
    Ok(message)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn items_become_the_turns_a_template_renders() {
        let items = vec![
            json!({"role": "developer", "content": "Be brief."}),
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}),
            json!({"type": "reasoning", "id": "rs_1", "summary": [], "content": null}),
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]}),
            json!({"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}),
            json!({"type": "function_call_output", "call_id": "call_1", "output": "sunny"}),
        ];
        let out = messages(&items, "input").unwrap();
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(out[2].content, "Checking.");
        assert_eq!(out[2].tool_calls[0].arguments, json!({"city": "Oslo"}));
        assert_eq!(out[3].tool_call_id.as_deref(), Some("call_1"));
    }

    #[test]
    fn what_cannot_be_read_is_named() {
        for (item, param) in [
            (
                json!({"type": "web_search_call", "id": "ws"}),
                "input[0].type",
            ),
            (
                json!({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}),
                "input[0].content[0].type",
            ),
            (json!({"role": "robot", "content": "hi"}), "input[0].role"),
            (
                json!({"type": "function_call", "name": "f", "arguments": "{}"}),
                "input[0].call_id",
            ),
        ] {
            let err = messages(std::slice::from_ref(&item), "input").unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{item}");
        }
    }
}
