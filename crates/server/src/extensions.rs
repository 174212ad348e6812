//! The fields every local server accepts beyond OpenAI's API, under llama.cpp's and
//! vLLM's names: sampling (`top_k`, `min_p`, `repetition_penalty` or `repeat_penalty`,
//! `repeat_last_n`), where a reply may end (`ignore_eos`, `min_tokens`,
//! `stop_token_ids`) and, on chat, `chat_template_kwargs`. Load tools and agent
//! frameworks send them to every local server; each is implemented, none ignored.

use pyramid_runtime::SamplerConfig;
use serde_json::{Map, Value};

use crate::api::opt_f64;
use crate::error::ApiError;

/// The extension fields of both endpoints.
pub const FIELDS: &[&str] = &[
    "top_k",
    "min_p",
    "repetition_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
];

/// The extension fields of `/v1/chat/completions` only.
pub const CHAT_FIELDS: &[&str] = &["chat_template_kwargs"];

/// `stop_token_ids` holds at most this many ids.
const MAX_STOP_TOKEN_IDS: usize = 64;

/// Names the chat template gets from the request itself, which a keyword may not replace.
const TEMPLATE_NAMES: &[&str] = &[
    "messages",
    "tools",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
];

/// What the extensions ask beyond the sampler's settings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extensions {
    /// The model's end tokens do not end the reply (vLLM's `ignore_eos`): it runs to
    /// `max_tokens` or the window's end, as load tools want.
    pub ignore_eos: bool,
    /// End tokens cannot be sampled before the reply has this many tokens.
    pub min_tokens: usize,
    /// More tokens that end the reply, their text not sent (as the model's end tokens).
    pub stop_token_ids: Vec<u32>,
    /// Variables for the chat template (`enable_thinking`, …).
    pub template_kwargs: Map<String, Value>,
}

/// Reads the extension fields of a request body into `sampler` and the returned
/// settings; `max_tokens` is the request's own limit, which `min_tokens` may not pass.
pub fn parse(
    obj: &Map<String, Value>,
    sampler: &mut SamplerConfig,
    max_tokens: Option<usize>,
) -> Result<Extensions, ApiError> {
    if let Some(k) = opt_i64(obj, "top_k")? {
        // vLLM disables with -1, llama.cpp with 0.
        sampler.top_k = match k {
            -1 | 0 => 0,
            k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
            _ => {
                return Err(bad(
                    "top_k",
                    "'top_k' must be -1, 0 (both: off) or positive",
                ))
            }
        };
    }
    if let Some(p) = opt_f64(obj, "min_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(bad("min_p", "'min_p' must be between 0 and 1"));
        }
        sampler.min_p = p as f32;
    }
    let penalties = [
        ("repetition_penalty", opt_f64(obj, "repetition_penalty")?),
        ("repeat_penalty", opt_f64(obj, "repeat_penalty")?),
    ];
    if let [(_, Some(a)), (_, Some(b))] = penalties {
        if a != b {
            return Err(bad(
                "repeat_penalty",
                "'repetition_penalty' and 'repeat_penalty' are one setting: give one",
            ));
        }
    }
    for (name, value) in penalties {
        if let Some(v) = value {
            if !(v > 0.0 && v <= 100.0) {
                return Err(bad(name, format!("'{name}' must be in (0, 100] (1: off)")));
            }
            sampler.repeat_penalty = v as f32;
        }
    }
    if let Some(n) = opt_i64(obj, "repeat_last_n")? {
        // llama.cpp: -1 is the whole context, 0 turns the penalty off.
        sampler.repeat_last_n = match n {
            -1 => usize::MAX,
            n if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
            _ => {
                return Err(bad(
                    "repeat_last_n",
                    "'repeat_last_n' must be -1 (the whole context) or at least 0",
                ))
            }
        };
    }
    let ignore_eos = match obj.get("ignore_eos") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("ignore_eos", "'ignore_eos' must be a boolean")),
    };
    let min_tokens = match opt_i64(obj, "min_tokens")? {
        None => 0,
        Some(n) if n < 0 => return Err(bad("min_tokens", "'min_tokens' must not be negative")),
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    if max_tokens.is_some_and(|max| min_tokens > max) {
        return Err(bad(
            "min_tokens",
            "'min_tokens' must not exceed the request's maximum tokens",
        ));
    }
    let stop_token_ids = match obj.get("stop_token_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ids)) if ids.len() <= MAX_STOP_TOKEN_IDS => ids
            .iter()
            .map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("stop_token_ids", "'stop_token_ids' must hold token ids"))?,
        Some(_) => {
            return Err(bad(
                "stop_token_ids",
                format!(
                    "'stop_token_ids' must be an array of up to {MAX_STOP_TOKEN_IDS} token ids"
                ),
            ))
        }
    };
    let template_kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(kwargs)) => {
            if let Some(name) = kwargs.keys().find(|k| TEMPLATE_NAMES.contains(&k.as_str())) {
                return Err(bad(
                    "chat_template_kwargs",
                    format!("'chat_template_kwargs' cannot set '{name}': the request gives it"),
                ));
            }
            kwargs.clone()
        }
        Some(_) => {
            return Err(bad(
                "chat_template_kwargs",
                "'chat_template_kwargs' must be an object",
            ))
        }
    };
    Ok(Extensions {
        ignore_eos,
        min_tokens,
        stop_token_ids,
        template_kwargs,
    })
}

fn bad(param: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, message.into())
}

fn opt_i64(obj: &Map<String, Value>, name: &'static str) -> Result<Option<i64>, ApiError> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|_| i64::MAX))
            .map(Some)
            .ok_or_else(|| bad(name, format!("'{name}' must be an integer"))),
        Some(_) => Err(bad(name, format!("'{name}' must be an integer"))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parsed(
        body: Value,
        max_tokens: Option<usize>,
    ) -> Result<(SamplerConfig, Extensions), ApiError> {
        let mut sampler = SamplerConfig::greedy();
        let Value::Object(obj) = body else { panic!() };
        let ext = parse(&obj, &mut sampler, max_tokens)?;
        Ok((sampler, ext))
    }

    #[test]
    fn every_extension_reaches_the_sampler_or_the_request() {
        let (s, ext) = parsed(
            json!({"top_k": 20, "min_p": 0.1, "repetition_penalty": 1.3, "repeat_last_n": -1,
                   "ignore_eos": true, "min_tokens": 3, "stop_token_ids": [7, 9],
                   "chat_template_kwargs": {"enable_thinking": false}}),
            Some(10),
        )
        .unwrap();
        assert_eq!((s.top_k, s.min_p, s.repeat_penalty), (20, 0.1, 1.3));
        assert_eq!(s.repeat_last_n, usize::MAX);
        assert!(ext.ignore_eos);
        assert_eq!((ext.min_tokens, ext.stop_token_ids), (3, vec![7, 9]));
        assert_eq!(ext.template_kwargs["enable_thinking"], json!(false));
        // Each server's spelling of "off".
        let (s, _) = parsed(json!({"top_k": -1, "repeat_penalty": 1.3}), None).unwrap();
        assert_eq!((s.top_k, s.repeat_penalty), (0, 1.3));
        assert_eq!(parsed(json!({}), None).unwrap().1, Extensions::default());
    }

    #[test]
    fn bad_extensions_name_their_parameter() {
        for (body, param) in [
            (json!({"top_k": -2}), "top_k"),
            (json!({"top_k": 1.5}), "top_k"),
            (json!({"min_p": 2}), "min_p"),
            (json!({"repetition_penalty": 0}), "repetition_penalty"),
            (
                json!({"repetition_penalty": 1.1, "repeat_penalty": 1.2}),
                "repeat_penalty",
            ),
            (json!({"repeat_last_n": -5}), "repeat_last_n"),
            (json!({"ignore_eos": "yes"}), "ignore_eos"),
            (json!({"min_tokens": 11}), "min_tokens"),
            (json!({"stop_token_ids": [-1]}), "stop_token_ids"),
            (json!({"stop_token_ids": 5}), "stop_token_ids"),
            (
                json!({"chat_template_kwargs": {"messages": []}}),
                "chat_template_kwargs",
            ),
            (json!({"chat_template_kwargs": "x"}), "chat_template_kwargs"),
        ] {
            let err = parsed(body.clone(), Some(10)).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
        }
    }
}
