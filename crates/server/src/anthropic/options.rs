//! The fields of a Messages request about how to answer rather than what: thinking,
//! the output format and effort, context edits, and Anthropic's service options, which
//! on one machine have nothing to choose between and are validated as such.

use pyramid_grammar::Grammar;
use serde_json::{json, Map, Value};

use crate::error::ApiError;

fn bad(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, message)
}

/// `thinking` (`enabled`, `adaptive` or `between_tools`; `disabled`) as the template
/// variable thinking models read (`enable_thinking`).
pub(super) fn thinking(value: Option<&Value>) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = Map::new();
    match value.map(|v| v.get("type").and_then(Value::as_str)) {
        None => {}
        Some(Some("enabled" | "adaptive" | "between_tools")) => {
            kwargs.insert("enable_thinking".into(), json!(true));
        }
        Some(Some("disabled")) => {
            kwargs.insert("enable_thinking".into(), json!(false));
        }
        Some(_) => {
            return Err(bad(
                "thinking.type",
                "'thinking.type' must be enabled, adaptive, between_tools or disabled",
            ))
        }
    }
    Ok(kwargs)
}

/// The fields about Anthropic's service, validated: one machine has one tier, one speed
/// and one place, and caches every prefix by itself.
pub(super) fn service_fields(obj: &Map<String, Value>) -> Result<(), ApiError> {
    let one_of = |name: &'static str, allowed: &[&str]| match obj.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(v)) if allowed.is_empty() || allowed.contains(&v.as_str()) => Ok(()),
        Some(_) if allowed.is_empty() => Err(bad(name, format!("'{name}' must be a string"))),
        Some(_) => Err(bad(
            name,
            format!("'{name}' must be one of {}", allowed.join(", ")),
        )),
    };
    one_of("service_tier", &["auto", "standard_only"])?;
    one_of("speed", &["standard", "fast"])?;
    one_of("inference_geo", &[])?;
    match obj.get("cache_control") {
        None | Some(Value::Null) => Ok(()),
        Some(c) if c.get("type").and_then(Value::as_str) == Some("ephemeral") => Ok(()),
        Some(_) => Err(bad(
            "cache_control",
            "'cache_control' must be {\"type\": \"ephemeral\"}",
        )),
    }
}

/// `context_management` (Claude Code sends it): `clear_thinking_*` edits are met as
/// they stand, since a turn's thinking never enters a later prompt here (the thinking
/// blocks are dropped, as thinking templates drop them); other edits are refused by name.
pub(super) fn context_management(value: Option<&Value>) -> Result<(), ApiError> {
    let at = "context_management.edits";
    let edits = match value {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(c)) => match c.get("edits") {
            None | Some(Value::Null) => return Ok(()),
            Some(Value::Array(edits)) => edits,
            Some(_) => return Err(bad(at, format!("'{at}' must be an array"))),
        },
        Some(_) => {
            return Err(bad(
                "context_management",
                "'context_management' must be an object",
            ))
        }
    };
    for (i, edit) in edits.iter().enumerate() {
        match edit.get("type").and_then(Value::as_str) {
            Some(kind) if kind.starts_with("clear_thinking_") => {}
            Some(kind) => {
                return Err(bad(
                    format!("{at}[{i}].type"),
                    format!("'{at}[{i}].type' {kind} is not supported (clear_thinking edits are)"),
                ))
            }
            None => {
                return Err(bad(
                    format!("{at}[{i}].type"),
                    format!("'{at}[{i}].type' is required"),
                ))
            }
        }
    }
    Ok(())
}

/// `output_config`: the `format` a reply must follow (a JSON schema, enforced by
/// constrained decoding); its `effort` is validated (one effort level here).
pub(super) fn output_config(value: Option<&Value>) -> Result<Option<Grammar>, ApiError> {
    let config = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(config)) => config,
        Some(_) => return Err(bad("output_config", "'output_config' must be an object")),
    };
    if let Some(field) = config
        .keys()
        .find(|k| !["format", "effort"].contains(&k.as_str()))
    {
        return Err(bad(
            format!("output_config.{field}"),
            format!("'output_config.{field}' is not accepted"),
        ));
    }
    match config.get("effort") {
        None | Some(Value::Null) => {}
        Some(Value::String(e))
            if ["low", "medium", "high", "xhigh", "max"].contains(&e.as_str()) => {}
        Some(_) => {
            return Err(bad(
                "output_config.effort",
                "'output_config.effort' must be low, medium, high, xhigh or max",
            ))
        }
    }
    match config.get("format") {
        None | Some(Value::Null) => Ok(None),
        Some(format) => match (
            format.get("type").and_then(Value::as_str),
            format.get("schema"),
        ) {
            (Some("json_schema"), Some(schema @ Value::Object(_))) => {
                Ok(Some(Grammar::json_schema(schema)))
            }
            _ => Err(bad(
                "output_config.format",
                "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}",
            )),
        },
    }
}
