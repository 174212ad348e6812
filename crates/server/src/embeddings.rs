//! OpenAI's embeddings API: the request read and validated, the response written.
//!
//! `input` is a string, a list of strings, a list of token ids or a list of such lists;
//! each becomes one engine request that prefills its tokens and returns their pooled,
//! L2-normalised hidden state. `encoding_format` `base64` sends each vector as its
//! little-endian f32 bytes, as OpenAI's SDKs decode it. `dimensions` is refused unless
//! it is the model's width: shortening a vector is right only for models trained for it
//! (Matryoshka), which a model file does not declare.

use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::api::opt_priority;
use crate::error::ApiError;

/// OpenAI's limit on inputs per request.
pub const MAX_INPUTS: usize = 2048;

const FIELDS: &[&str] = &[
    "input",
    "model",
    "encoding_format",
    "dimensions",
    "user",
    "priority",
];

/// One input: text to tokenise, or ids as given.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Float,
    Base64,
}

#[derive(Debug)]
pub struct EmbeddingRequest {
    pub model: String,
    pub inputs: Vec<Input>,
    pub encoding: Encoding,
    /// The width asked for, if any (checked against the model's by the handler).
    pub dimensions: Option<usize>,
    pub priority: Option<i32>,
}

/// Reads a request body; `max_inputs` is the most inputs the server can queue at once.
pub fn parse(body: &[u8], max_inputs: usize) -> Result<EmbeddingRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_request(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::invalid_request("the body must be a JSON object"));
    };
    if let Some(field) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(ApiError::bad_param(
            field.as_str(),
            format!("unknown field '{field}' for /v1/embeddings"),
        ));
    }
    let model = match obj.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err(ApiError::bad_param("model", "'model' must be a string")),
    };
    let inputs = inputs(&obj)?;
    let limit = max_inputs.min(MAX_INPUTS);
    if inputs.len() > limit {
        return Err(ApiError::bad_param(
            "input",
            format!(
                "{} inputs in one request; this server takes at most {limit}",
                inputs.len()
            ),
        ));
    }
    let encoding = match obj.get("encoding_format") {
        None | Some(Value::Null) => Encoding::Float,
        Some(Value::String(s)) if s == "float" => Encoding::Float,
        Some(Value::String(s)) if s == "base64" => Encoding::Base64,
        Some(_) => {
            return Err(ApiError::bad_param(
                "encoding_format",
                "'encoding_format' must be \"float\" or \"base64\"",
            ))
        }
    };
    let dimensions = match obj.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&d| d > 0)
                .and_then(|d| usize::try_from(d).ok())
                .ok_or_else(|| {
                    ApiError::bad_param("dimensions", "'dimensions' must be a positive integer")
                })?,
        ),
    };
    if !matches!(obj.get("user"), None | Some(Value::Null | Value::String(_))) {
        return Err(ApiError::bad_param("user", "'user' must be a string"));
    }
    Ok(EmbeddingRequest {
        model,
        inputs,
        encoding,
        dimensions,
        priority: opt_priority(obj.get("priority"), "priority")?,
    })
}

/// `input` as a list of inputs, each non-empty.
fn inputs(obj: &Map<String, Value>) -> Result<Vec<Input>, ApiError> {
    let bad = || {
        ApiError::bad_param(
            "input",
            "'input' must be a string, a list of strings, a list of token ids, or a list of \
             lists of token ids",
        )
    };
    let ids = |items: &[Value]| -> Option<Vec<u32>> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
            .collect()
    };
    let inputs = match obj.get("input") {
        None => return Err(ApiError::bad_param("input", "'input' is required")),
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::bad_param("input", "'input' is an empty list"))
        }
        Some(Value::Array(items)) => match &items[0] {
            Value::Number(_) => vec![Input::Ids(ids(items).ok_or_else(bad)?)],
            Value::String(_) => items
                .iter()
                .map(|v| v.as_str().map(|s| Input::Text(s.to_string())))
                .collect::<Option<_>>()
                .ok_or_else(bad)?,
            Value::Array(_) => items
                .iter()
                .map(|v| v.as_array().and_then(|a| ids(a)).map(Input::Ids))
                .collect::<Option<_>>()
                .ok_or_else(bad)?,
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
    };
    for (i, input) in inputs.iter().enumerate() {
        let empty = match input {
            Input::Text(t) => t.is_empty(),
            Input::Ids(ids) => ids.is_empty(),
        };
        if empty {
            return Err(ApiError::bad_param(
                "input",
                format!("input {i} is empty: every input needs at least one token"),
            ));
        }
    }
    Ok(inputs)
}

/// The response body: one embedding per input, in order, and the prompt tokens used.
pub fn response(
    model: &str,
    embeddings: &[Vec<f32>],
    encoding: Encoding,
    prompt_tokens: usize,
) -> Value {
    let data: Vec<Value> = embeddings
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = match encoding {
                Encoding::Float => json!(vector),
                Encoding::Base64 => {
                    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(body: Value) -> Result<EmbeddingRequest, ApiError> {
        parse(body.to_string().as_bytes(), 64)
    }

    #[test]
    fn every_input_shape_is_read() {
        let one = |input: Value| {
            parsed(json!({"model": "m", "input": input}))
                .unwrap()
                .inputs
        };
        assert_eq!(one(json!("hi")), [Input::Text("hi".into())]);
        assert_eq!(
            one(json!(["a", "b"])),
            [Input::Text("a".into()), Input::Text("b".into())]
        );
        assert_eq!(one(json!([1, 2])), [Input::Ids(vec![1, 2])]);
        assert_eq!(
            one(json!([[1], [2, 3]])),
            [Input::Ids(vec![1]), Input::Ids(vec![2, 3])]
        );
    }

    #[test]
    fn bad_requests_name_their_field() {
        for (body, param) in [
            (json!({"model": "m"}), "input"),
            (json!({"model": "m", "input": []}), "input"),
            (json!({"model": "m", "input": ["a", ""]}), "input"),
            (json!({"model": "m", "input": ["a", 1]}), "input"),
            (json!({"model": "m", "input": [-1]}), "input"),
            (json!({"model": "m", "input": [[1], []]}), "input"),
            (json!({"input": "a"}), "model"),
            (
                json!({"model": "m", "input": "a", "encoding_format": "int8"}),
                "encoding_format",
            ),
            (
                json!({"model": "m", "input": "a", "dimensions": 0}),
                "dimensions",
            ),
            (
                json!({"model": "m", "input": "a", "normalize": false}),
                "normalize",
            ),
            (json!({"model": "m", "input": vec!["a"; 65]}), "input"),
        ] {
            let err = parsed(body.clone()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {}", err.message);
        }
    }

    #[test]
    fn base64_is_the_little_endian_floats() {
        let body = response("m", &[vec![1.0, -0.5]], Encoding::Base64, 3);
        let text = body["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap();
        let floats: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(floats, [1.0, -0.5]);
        assert_eq!(body["usage"]["prompt_tokens"], 3);
        let body = response("m", &[vec![0.25]], Encoding::Float, 1);
        assert_eq!(body["data"][0]["embedding"], json!([0.25]));
    }
}
