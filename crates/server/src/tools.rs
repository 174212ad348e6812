//! Tool calls: OpenAI's `tools` and `tool_choice` on the model's own chat template, the
//! reply's calls parsed into `message.tool_calls`, and `"required"` or a named function
//! enforced by a grammar.
//!
//! The call format is the one Qwen2.5 (and Hermes-style models) are trained on: each call
//! is `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, several separated by
//! a newline. A template that reads `tools` renders the definitions itself. For one that
//! does not (SmolLM2's), [`fallback_messages`] describes the tools in the system turn,
//! writes earlier calls into the assistant turns in the same format, and passes tool
//! results as user turns wrapped in `<tool_response>` — so any chat model can be asked,
//! and replies parse the same way.
//!
//! `tool_choice`: `"auto"` (the default) lets the model answer or call; `"none"` leaves
//! the tools out of the prompt and the reply unparsed; `"required"` and
//! `{"type": "function", "function": {"name": ...}}` constrain decoding to one or more
//! well-formed calls (one with `parallel_tool_calls: false`) whose arguments validate
//! against the function's `parameters` schema.

use pyramid_grammar::{json_layout, Grammar};
use pyramid_tokenizer::{python_json, ChatMessage, ToolCall};
use std::collections::HashSet;

use serde_json::{json, Map, Value};

use crate::error::ApiError;

mod parse;
mod scan;
pub use parse::{Gathered, ParsedCall, Piece, ReplyReader, ToolCallParser};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Function(String),
}

/// A request's tools, as validated.
#[derive(Debug, Clone)]
pub struct ToolSet {
    /// Each tool as the client sent it (`{"type": "function", "function": {...}}`).
    definitions: Vec<Value>,
    names: Vec<String>,
    /// Each function's `parameters` schema (`{"type": "object"}` when absent), with
    /// `nullable` read as JSON Schema says it ([`pyramid_grammar::honour_nullable`]).
    parameters: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolSet {
    /// `tools`, `tool_choice` and `parallel_tool_calls` from a chat request; `None`
    /// without tools. The legacy `functions`/`function_call` are refused by name.
    /// At most `max_tools` tools (OpenAI allows 128).
    pub fn parse(obj: &Map<String, Value>, max_tools: usize) -> Result<Option<ToolSet>, ApiError> {
        let list = match obj.get("tools") {
            None | Some(Value::Null) => &Vec::new(),
            Some(Value::Array(list)) => list,
            Some(_) => return Err(ApiError::bad_param("tools", "'tools' must be an array")),
        };
        if list.len() > max_tools {
            return Err(ApiError::bad_param(
                "tools",
                format!(
                    "'tools' has {} tools; this server takes at most {max_tools} (--max-tools)",
                    list.len()
                ),
            ));
        }
        let mut seen = HashSet::with_capacity(list.len());
        let mut tools = ToolSet {
            definitions: Vec::new(),
            names: Vec::new(),
            parameters: Vec::new(),
            choice: ToolChoice::Auto,
            parallel: true,
        };
        for (i, tool) in list.iter().enumerate() {
            let at = format!("tools[{i}]");
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::bad_param(
                    format!("{at}.type"),
                    format!("{at}.type must be \"function\""),
                ));
            }
            let function = tool
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    ApiError::bad_param(
                        format!("{at}.function"),
                        format!("{at}.function must be an object"),
                    )
                })?;
            let name = match function.get("name") {
                Some(Value::String(n)) if valid_name(n) => n.clone(),
                _ => {
                    return Err(ApiError::bad_param(
                        format!("{at}.function.name"),
                        format!("{at}.function.name must be 1-64 letters, digits, '_' or '-'"),
                    ))
                }
            };
            if !seen.insert(name.clone()) {
                return Err(ApiError::bad_param(
                    format!("{at}.function.name"),
                    format!("the function name '{name}' is given twice"),
                ));
            }
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(ApiError::bad_param(
                        format!("{at}.function.parameters"),
                        format!("{at}.function.parameters must be a JSON schema object"),
                    ))
                }
            };
            // Bounded before it is compiled into the calls' grammar (see the grammar crate).
            pyramid_grammar::check_schema(&parameters).map_err(|e| {
                ApiError::bad_param(
                    format!("{at}.function.parameters"),
                    format!("{at}.function.parameters: {e}"),
                )
            })?;
            tools.definitions.push(tool.clone());
            tools.names.push(name);
            tools
                .parameters
                .push(pyramid_grammar::honour_nullable(&parameters));
        }
        tools.choice = match obj.get("tool_choice") {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                _ => return Err(ApiError::bad_param(
                    "tool_choice",
                    "'tool_choice' must be \"auto\", \"none\", \"required\" or a named function",
                )),
            },
            Some(Value::Object(o)) => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| o.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        ApiError::bad_param(
                            "tool_choice",
                            "a named 'tool_choice' is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        )
                    })?;
                if !tools.names.iter().any(|n| n == name) {
                    return Err(ApiError::bad_param(
                        "tool_choice.function.name",
                        format!("'tool_choice' names '{name}', which is not among 'tools'"),
                    ));
                }
                ToolChoice::Function(name.to_string())
            }
            Some(_) => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    "'tool_choice' must be a string or an object",
                ))
            }
        };
        // A named function is one call of it, as OpenAI gives (a small model would
        // otherwise repeat it until `max_tokens`).
        let named = matches!(tools.choice, ToolChoice::Function(_));
        let parallel = match obj.get("parallel_tool_calls") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::bad_param(
                    "parallel_tool_calls",
                    "'parallel_tool_calls' must be a boolean",
                ))
            }
        };
        tools.parallel = parallel && !named;
        if tools.names.is_empty() {
            return match (obj.get("tool_choice"), obj.get("parallel_tool_calls")) {
                (Some(v), _) if !v.is_null() => Err(ApiError::bad_param(
                    "tool_choice",
                    "'tool_choice' needs 'tools'",
                )),
                (_, Some(v)) if !v.is_null() => Err(ApiError::bad_param(
                    "parallel_tool_calls",
                    "'parallel_tool_calls' needs 'tools'",
                )),
                _ => Ok(None),
            };
        }
        Ok(Some(tools))
    }

    /// The definitions the prompt shows the model: none with `tool_choice: "none"`.
    pub fn prompt_tools(&self) -> &[Value] {
        match self.choice {
            ToolChoice::None => &[],
            _ => &self.definitions,
        }
    }

    /// Whether the reply is read for calls.
    pub fn parses_calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// Whether the reply must consist of calls.
    pub fn forces_calls(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Function(_))
    }

    /// Indices of the functions a reply may call.
    fn callable(&self) -> Vec<usize> {
        match &self.choice {
            ToolChoice::Function(name) => self
                .names
                .iter()
                .position(|n| n == name)
                .into_iter()
                .collect(),
            _ => (0..self.names.len()).collect(),
        }
    }

    /// The JSON schema of one call `{"name": ..., "arguments": {...}}` of a function it
    /// may call, with arguments valid against that function's schema (`relaxed`: against
    /// what the grammar engine can enforce of it).
    fn call_schema(&self, relaxed: bool) -> Value {
        // Each function's definitions move to the root of the combined schema, where
        // its `$ref`s (renamed apart) still find them.
        let mut defs = Map::new();
        let variants: Vec<Value> = self
            .callable()
            .into_iter()
            .map(|i| {
                let parameters = if relaxed {
                    pyramid_grammar::enforceable(&self.parameters[i])
                } else {
                    self.parameters[i].clone()
                };
                let arguments = hoist_definitions(&parameters, &format!("f{i}_"), &mut defs);
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"const": self.names[i]},
                        "arguments": arguments,
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let mut schema = json!({"anyOf": variants});
        if !defs.is_empty() {
            schema["$defs"] = Value::Object(defs);
        }
        schema["x-guidance"] = json_layout();
        schema
    }

    /// The Lark rule `calls`: one call, or several when parallel calls are allowed.
    fn calls_rule(&self) -> String {
        let repeat = if self.parallel {
            r#" ("\n" call)*"#
        } else {
            ""
        };
        format!(
            "calls: call{repeat}\ncall: {open} %json {schema} {close}\n",
            open = lark_string(&format!("{OPEN}\n")),
            schema = self.call_schema(!self.forces_calls()),
            close = lark_string(&format!("\n{CLOSE}")),
        )
    }

    /// A lazy grammar for `tool_choice: "auto"`: text is free, but a call once begun —
    /// a `<tool_call>` tag, or a JSON object opening a line (in a code fence or not) with
    /// a `"name"` key — must finish as a well-formed call of a declared function with
    /// valid arguments, in the form [`ToolCallParser`] reads. The triggers are lazy
    /// lexemes: each matches as little as it can, so it fires at the first tag, and plain
    /// text costs the matcher next to nothing. JSON with a `"name"` key inside a line
    /// stays free. Schema keywords the grammar engine cannot enforce are left out here
    /// (the client asked for no enforcement), where a forced call refuses them.
    fn lazy_grammar(&self) -> String {
        let mut named = Vec::new();
        let mut rules = String::new();
        for i in self.callable() {
            let mut arguments = pyramid_grammar::enforceable(&self.parameters[i]);
            if let Value::Object(fields) = &mut arguments {
                fields.insert("x-guidance".to_string(), json_layout());
            }
            // Whitespace between the tokens as the model likes it (pretty-printed calls).
            let name = lark_string(&format!("{}\"", self.names[i]));
            rules.push_str(&format!(
                "bare_{i}: {name} /[ \\t\\r\\n]*,[ \\t\\r\\n]*\"arguments\"[ \\t\\r\\n]*:[ \\t\\r\\n]*/ %json {arguments} /[ \\t\\r\\n]*\\}}/\n"
            ));
            named.push(format!("bare_{i}"));
        }
        let segments = if self.parallel {
            "segment*"
        } else {
            "segment?"
        };
        format!(
            "start: reply\nreply: {segments} TEXT\nsegment: tagged | bare\nTEXT: /(.|\\n)*/\n\
             tag_hd[lazy]: TEXT {open}\n\
             tagged: tag_hd \"\\n\" %json {schema} {close}\n\
             bare_hd[lazy]: /((.|\\n)*\\n)?([ \\t]|```[a-zA-Z]*\\n)*\\{{[ \\t\\r\\n]*\"name\"[ \\t\\r\\n]*:[ \\t\\r\\n]*\"/\n\
             bare: bare_hd ({named})\n{rules}",
            open = lark_string(OPEN),
            schema = self.call_schema(true),
            close = lark_string(&format!("\n{CLOSE}")),
            named = named.join(" | "),
        )
    }
}

/// What constrains a chat reply (its top rule `reply`, for [`crate::reasoning::with_thought`]),
/// given its tools and `response_format` schema: calls only
/// (`required`, named), calls or the schema's JSON (`auto` with a format), free text with
/// calls constrained once begun (`auto`), or the JSON alone.
pub fn reply_grammar(tools: Option<&ToolSet>, format: Option<&Grammar>) -> Option<Grammar> {
    let calls = tools.filter(|t| t.parses_calls());
    match (calls, format) {
        (Some(t), _) if t.forces_calls() => Some(Grammar::Lark(format!(
            "start: reply\nreply: calls\n{}",
            t.calls_rule()
        ))),
        (Some(t), None) => Some(Grammar::Lark(t.lazy_grammar())),
        (Some(t), Some(Grammar::JsonSchema(schema))) => {
            let mut schema = schema.clone();
            if let Value::Object(fields) = &mut schema {
                fields.insert("x-guidance".to_string(), json_layout());
            }
            Some(Grammar::Lark(format!(
                "start: reply\nreply: calls | answer\nanswer: %json {schema}\n{}",
                t.calls_rule()
            )))
        }
        (_, format) => format.cloned(),
    }
}

/// `schema` without its `$defs`/`definitions`, which go into `defs` with `prefix` on
/// their names, and with its local `$ref`s (`#/$defs/x`, `#/definitions/x`) renamed to
/// match: a function's parameters keep their meaning inside a combined schema.
fn hoist_definitions(schema: &Value, prefix: &str, defs: &mut Map<String, Value>) -> Value {
    fn rename(value: &mut Value, prefix: &str) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get_mut("$ref") {
                    let name = r
                        .strip_prefix("#/$defs/")
                        .or_else(|| r.strip_prefix("#/definitions/"));
                    if let Some(name) = name {
                        *r = format!("#/$defs/{prefix}{name}");
                    }
                }
                map.values_mut().for_each(|v| rename(v, prefix));
            }
            Value::Array(items) => items.iter_mut().for_each(|v| rename(v, prefix)),
            _ => {}
        }
    }
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(found)) = map.remove(key) {
                for (name, mut def) in found {
                    rename(&mut def, prefix);
                    defs.insert(format!("{prefix}{name}"), def);
                }
            }
        }
    }
    rename(&mut schema, prefix);
    schema
}

/// A Lark string literal for `text`.
pub(crate) fn lark_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// OpenAI's rule for function names.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// For a template without tool support: the tools described in the system turn, earlier
/// calls written into their assistant turns, and tool results as user turns, all in the
/// `<tool_call>` format replies are parsed in.
pub fn fallback_messages(messages: &[ChatMessage], tools: &[Value]) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if !tools.is_empty() {
        let mut system = String::new();
        if let Some(first) = messages.first().filter(|m| m.role == "system") {
            system.push_str(&first.content);
            system.push_str("\n\n");
        }
        system.push_str(
            "# Tools\n\nYou can call these functions, whose JSON signatures follow inside <tools></tools>:\n<tools>",
        );
        for tool in tools {
            system.push('\n');
            system.push_str(&python_json(tool));
        }
        system.push_str(
            "\n</tools>\n\nTo call functions, reply with one block per call, each a JSON object with the function's name and arguments:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        );
        out.push(ChatMessage::new("system", system));
    }
    let skip =
        usize::from(!tools.is_empty() && messages.first().is_some_and(|m| m.role == "system"));
    for message in &messages[skip..] {
        match message.role.as_str() {
            "assistant" if !message.tool_calls.is_empty() => {
                let mut content = message.content.clone();
                for call in &message.tool_calls {
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    content.push_str(&call_text(call));
                }
                out.push(ChatMessage::new("assistant", content));
            }
            "tool" => {
                let response = format!("<tool_response>\n{}\n</tool_response>", message.content);
                // Consecutive results share one user turn.
                match out.last_mut() {
                    Some(last)
                        if last.role == "user" && last.content.ends_with("</tool_response>") =>
                    {
                        last.content.push('\n');
                        last.content.push_str(&response);
                    }
                    _ => out.push(ChatMessage::new("user", response)),
                }
            }
            _ => out.push(message.clone()),
        }
    }
    out
}

/// A call as the model writes it.
fn call_text(call: &ToolCall) -> String {
    format!(
        "{OPEN}\n{{\"name\": {}, \"arguments\": {}}}\n{CLOSE}",
        python_json(&Value::String(call.name.clone())),
        python_json(&call.arguments)
    )
}

#[cfg(test)]
mod tests;
