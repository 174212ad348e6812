//! `pyramid chat --server URL`: the same terminal chat against a running `pyramid serve`
//! (or any OpenAI-compatible server), streamed over HTTP. The server keeps the
//! conversation's cache between turns, so each turn prefills only what is new.

use std::io::{BufRead, BufReader, Write};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use pyramid_grammar::Grammar;

use super::run::SamplingArgs;

/// What one streamed reply brought.
struct Reply {
    text: String,
    finish_reason: Option<String>,
    usage: Option<Value>,
}

pub fn run(
    server: &str,
    api_key: Option<&str>,
    system: Option<&str>,
    sampling: &SamplingArgs,
    stats: bool,
) -> Result<()> {
    if sampling.grammar.is_some() {
        bail!(
            "--grammar needs a local model: a server takes --json-schema only (as response_format)"
        );
    }
    let schema: Option<Value> = match sampling.read_grammar()? {
        Some((Grammar::JsonSchema(schema), ..)) => Some(schema),
        Some((Grammar::Lark(_), ..)) | None => None,
    };
    let base = server.trim_end_matches('/').trim_end_matches("/v1");
    let model = first_model(base, api_key)?;
    let mut messages: Vec<Value> = system
        .map(|s| json!({"role": "system", "content": s}))
        .into_iter()
        .collect();
    eprintln!("Chatting with {model} at {base} — an empty line or Ctrl-D ends the chat.");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        let Some(line) = next_user_turn(&mut lines)? else {
            break;
        };
        messages.push(json!({"role": "user", "content": line}));
        let mut body = json!({
            "model": model,
            "messages": messages,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            // The local-server extensions pyramid serve (and llama.cpp, vLLM) read.
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
            "repeat_penalty": sampling.repeat_penalty,
            "ignore_eos": sampling.ignore_eos,
            "seed": sampling.seed,
            "logit_bias": sampling
                .logit_bias
                .iter()
                .map(|(id, bias)| (id.to_string(), json!(bias)))
                .collect::<serde_json::Map<_, _>>(),
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(mode) = sampling.speculation.speculative {
            body["speculative"] = json!(mode.as_str());
        }
        if let Some(schema) = &schema {
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": schema, "strict": true},
            });
        }
        let reply = match stream_reply(base, api_key, &body) {
            Ok(reply) => reply,
            Err(err) => {
                // Say why and keep the chat usable, as the local chat does.
                messages.pop();
                eprintln!("\nerror: {err:#}");
                continue;
            }
        };
        println!();
        if reply.finish_reason.as_deref() == Some("length") {
            eprintln!("[reply cut at the token limit or the end of the context]");
        }
        if let (true, Some(u)) = (stats, &reply.usage) {
            eprintln!(
                "[prompt {} tokens, {} reused from the server's cache; generated {}]",
                u["prompt_tokens"],
                u["prompt_tokens_details"]["cached_tokens"],
                u["completion_tokens"]
            );
        }
        messages.push(json!({"role": "assistant", "content": reply.text}));
    }
    Ok(())
}

fn request(method: &str, url: &str, api_key: Option<&str>) -> ureq::Request {
    let req = ureq::request(method, url);
    match api_key {
        Some(key) => req.set("Authorization", &format!("Bearer {key}")),
        None => req,
    }
}

/// The server's answer to an error, as its message if it sent an OpenAI error body.
fn explain(err: ureq::Error) -> anyhow::Error {
    match err {
        ureq::Error::Status(code, response) => {
            let text = response.into_string().unwrap_or_default();
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or(text);
            anyhow::anyhow!("the server answered {code}: {message}")
        }
        other => anyhow::anyhow!("cannot reach the server: {other}"),
    }
}

fn first_model(base: &str, api_key: Option<&str>) -> Result<String> {
    let models: Value = request("GET", &format!("{base}/v1/models"), api_key)
        .call()
        .map_err(explain)?
        .into_json()
        .context("the server's model list is not JSON")?;
    match models["data"][0]["id"].as_str() {
        Some(id) => Ok(id.to_string()),
        None => bail!("the server lists no models"),
    }
}

fn stream_reply(base: &str, api_key: Option<&str>, body: &Value) -> Result<Reply> {
    let response = request("POST", &format!("{base}/v1/chat/completions"), api_key)
        .send_json(body)
        .map_err(explain)?;
    let mut reply = Reply {
        text: String::new(),
        finish_reason: None,
        usage: None,
    };
    let mut stdout = std::io::stdout();
    for line in BufReader::new(response.into_reader()).lines() {
        let line = line.context("the stream broke off")?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            return Ok(reply);
        }
        let chunk: Value = serde_json::from_str(data).context("a stream chunk is not JSON")?;
        if let Some(message) = chunk["error"]["message"].as_str() {
            bail!("the server failed mid-reply: {message}");
        }
        if let Some(choice) = chunk["choices"].get(0) {
            if let Some(text) = choice["delta"]["content"].as_str() {
                stdout.write_all(text.as_bytes())?;
                stdout.flush()?;
                reply.text.push_str(text);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                reply.finish_reason = Some(reason.to_string());
            }
        }
        if chunk["usage"].is_object() {
            reply.usage = Some(chunk["usage"].clone());
        }
    }
    bail!("the stream ended without [DONE]")
}

/// Prompts for and reads the user's next message; `None` on an empty line or end of input,
/// which end the chat.
pub(super) fn next_user_turn(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> Result<Option<String>> {
    eprint!("> ");
    std::io::stderr().flush()?;
    let Some(line) = lines.next().transpose()? else {
        return Ok(None);
    };
    let line = line.trim_end();
    Ok((!line.is_empty()).then(|| line.to_string()))
}
