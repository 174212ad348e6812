//! The router in process on SmolLM2 (the packaged model), with the test hooks that only
//! a unit test can reach.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use pyramid_engine::{Arm, Engine, EngineConfig, Pooling, PyramidConfig, SpeculativeConfig};
use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::{KvType, Model};
use pyramid_runtime::{CpuBackend, WindowLadder};
use pyramid_tokenizer::{ChatTemplate, Tokenizer};
use serde_json::{json, Value};
use tower::ServiceExt;

use super::{router, AppState, EmbeddingSetup};
use crate::metrics::{Metrics, PriorityLabels};
use crate::worker::{inject, EngineThread};
use crate::Limits;

/// SmolLM2 served on the CPU from two windows.
fn smollm2() -> Arc<AppState> {
    smollm2_with(None)
}

/// SmolLM2 served with `template` instead of its own.
fn smollm2_with(template: Option<ChatTemplate>) -> Arc<AppState> {
    let file = GgufFile::open(pyramid_testdata::model_path(
        "smollm2-135m-instruct-q4_1.gguf",
    ))
    .unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf(file.metadata()).unwrap());
    let template = template.or_else(|| tokenizer.chat_template().ok());
    let model = Arc::new(Model::from_gguf(&file).unwrap());
    let config = EngineConfig {
        pyramid: PyramidConfig {
            ladder: WindowLadder::new(vec![256, 512], 8192).unwrap(),
            prefill_chunk: 128,
            arm: Arm::OnDemand,
            generation_reserve: 64,
            artifact_budget: usize::MAX,
            margin: Duration::from_millis(5),
            first_compile_estimate: Duration::from_millis(10),
        },
        max_batch: 4,
        kv_budget: usize::MAX,
        max_sessions: 8,
        static_shapes: false,
        aging: pyramid_engine::DEFAULT_AGING,
        speculative: SpeculativeConfig::default(),
    };
    let core = Engine::new(Arc::new(CpuBackend::new(model, 2)), 1, KvType::F32, config).unwrap();
    let metrics = Arc::new(Metrics::new(PriorityLabels::default()));
    let engine = EngineThread::start(
        core,
        Arc::clone(&tokenizer),
        ThreadPool::new(2).unwrap(),
        16,
        Arc::clone(&metrics),
    )
    .unwrap();
    let limits = Limits::default();
    Arc::new(AppState::new(
        engine,
        tokenizer,
        template,
        "smollm2".to_string(),
        512,
        Vec::new(),
        limits,
        metrics,
    ))
}

async fn call(state: &Arc<AppState>, method: &str, uri: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(match method {
            "GET" => Body::empty(),
            _ => Body::from(body.to_string()),
        })
        .unwrap();
    let response = router(Arc::clone(state)).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_one_requests_text_fails_it_alone_with_a_500_and_the_server_stays_healthy() {
    let state = smollm2();
    // The third request panics on its first token (the hook picks it by its priority);
    // all four are in flight together.
    inject::panic_in_text_at(77);
    let ask = |k: usize| {
        let state = Arc::clone(&state);
        async move {
            let body = json!({
                "model": "smollm2",
                "prompt": format!("Count from {k}:"),
                "max_tokens": 8,
                "temperature": 0,
                "priority": if k == 2 { 77 } else { 0 },
            });
            call(&state, "POST", "/v1/completions", body).await
        }
    };
    let replies = tokio::join!(ask(0), ask(1), ask(2), ask(3));
    let replies = [replies.0, replies.1, replies.2, replies.3];
    let failed: Vec<&Value> = replies
        .iter()
        .filter(|(status, _)| *status == StatusCode::INTERNAL_SERVER_ERROR)
        .map(|(_, body)| body)
        .collect();
    assert_eq!(failed.len(), 1, "{replies:?}");
    assert_eq!(replies[2].0, StatusCode::INTERNAL_SERVER_ERROR);
    let message = failed[0]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("internal error: injected panic"),
        "{message}"
    );
    for (status, body) in replies
        .iter()
        .filter(|r| r.0 != StatusCode::INTERNAL_SERVER_ERROR)
    {
        assert_eq!(*status, StatusCode::OK, "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 8, "{body}");
    }
    let (status, health) = call(&state, "GET", "/health", Value::Null).await;
    assert_eq!((status, health), (StatusCode::OK, json!({"status": "ok"})));
    // And the engine goes on serving.
    let body = json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 4, "temperature": 0});
    let (status, reply) = call(&state, "POST", "/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
}

/// A request's body with `extra` fields on top.
fn with(mut body: Value, extra: Value) -> Value {
    let fields = body.as_object_mut().unwrap();
    fields.extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_server_extensions_shape_the_reply() {
    let state = smollm2();
    let text_of = |reply: &Value| reply["choices"][0]["text"].as_str().unwrap().to_string();
    let completion = json!({"model": "smollm2", "prompt": "The capital of France is",
                            "max_tokens": 16, "temperature": 0});
    let (status, plain) = call(&state, "POST", "/v1/completions", completion.clone()).await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    let text = text_of(&plain);
    // Keeping only the most likely token is greedy at any temperature.
    for extra in [json!({"top_k": 1}), json!({"min_p": 1.0})] {
        let body = with(
            completion.clone(),
            with(extra, json!({"temperature": 1.5, "seed": 3})),
        );
        let (_, reply) = call(&state, "POST", "/v1/completions", body.clone()).await;
        assert_eq!(text_of(&reply), text, "{body}");
    }
    // A stop token id ends the reply before its text.
    let ids = state.tokenizer.encode(&text, false).unwrap();
    let stop = ids[3];
    let body = with(completion.clone(), json!({"stop_token_ids": [stop]}));
    let (_, reply) = call(&state, "POST", "/v1/completions", body).await;
    let cut = text_of(&reply);
    assert_eq!(reply["choices"][0]["finish_reason"], "stop", "{reply}");
    assert!(
        text.starts_with(&cut) && cut.len() < text.len(),
        "{cut:?} of {text:?}"
    );
    let first = ids.iter().position(|&t| t == stop).unwrap();
    assert_eq!(cut, state.tokenizer.decode(&ids[..first]).unwrap());

    // A chat reply that ends early: ignore_eos runs it to max_tokens, min_tokens holds
    // its end back that long.
    let chat = json!({"model": "smollm2", "max_tokens": 40, "temperature": 0,
                      "messages": [{"role": "user", "content": "What is the capital of France?"}]});
    let tokens = |reply: &Value| reply["usage"]["completion_tokens"].as_u64().unwrap();
    let (_, short) = call(&state, "POST", "/v1/chat/completions", chat.clone()).await;
    assert_eq!(short["choices"][0]["finish_reason"], "stop", "{short}");
    assert!(tokens(&short) < 20, "{short}");
    let body = with(chat.clone(), json!({"ignore_eos": true}));
    let (_, long) = call(&state, "POST", "/v1/chat/completions", body).await;
    assert_eq!(
        (tokens(&long), long["choices"][0]["finish_reason"].clone()),
        (40, json!("length")),
        "{long}"
    );
    let body = with(chat.clone(), json!({"min_tokens": 20}));
    let (_, held) = call(&state, "POST", "/v1/chat/completions", body).await;
    assert!(tokens(&held) >= 20, "{held}");
    // Template variables reach the template; the request's own names are not theirs.
    let body = with(
        chat.clone(),
        json!({"chat_template_kwargs": {"enable_thinking": false}}),
    );
    let (_, same) = call(&state, "POST", "/v1/chat/completions", body).await;
    assert_eq!(same["choices"], short["choices"]);
    let body = with(chat, json!({"chat_template_kwargs": {"messages": []}}));
    let (status, refused) = call(&state, "POST", "/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refused["error"]["param"], "chat_template_kwargs");
}

/// A template that opens the thought in the prompt, as DeepSeek-R1's does: SmolLM2's
/// reply is then all thought (it never closes it in 8 tokens).
const THINKING_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_templates_thought_stays_out_of_the_answer_in_every_protocol() {
    let template = ChatTemplate::new(THINKING_TEMPLATE, "", "<|im_end|>").unwrap();
    let state = smollm2_with(Some(template));
    let ask = json!({"model": "smollm2", "max_tokens": 8, "temperature": 0,
                     "messages": [{"role": "user", "content": "What is 17 times 3?"}]});
    let (status, chat) = call(&state, "POST", "/v1/chat/completions", ask.clone()).await;
    assert_eq!(status, StatusCode::OK, "{chat}");
    let message = &chat["choices"][0]["message"];
    let thought = message["reasoning_content"].as_str().unwrap();
    assert!(!thought.is_empty() && message["content"] == "", "{message}");

    let (status, anthropic) = call(&state, "POST", "/v1/messages", ask.clone()).await;
    assert_eq!(status, StatusCode::OK, "{anthropic}");
    assert_eq!(
        anthropic["content"].as_array().unwrap().len(),
        1,
        "{anthropic}"
    );
    assert_eq!(anthropic["content"][0]["type"], "thinking");
    assert_eq!(anthropic["content"][0]["thinking"], thought);

    let responses = json!({"model": "smollm2", "max_output_tokens": 8, "temperature": 0,
                           "input": "What is 17 times 3?"});
    let (status, response) = call(&state, "POST", "/v1/responses", responses).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{response}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["content"][0]["text"], thought);
    assert!(response["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64() > Some(0));

    // --reasoning-format none: the raw text is the answer.
    let raw = Arc::new(
        Arc::try_unwrap(smollm2_with(Some(
            ChatTemplate::new(THINKING_TEMPLATE, "", "<|im_end|>").unwrap(),
        )))
        .ok()
        .unwrap()
        .with_reasoning_format(crate::reasoning::ReasoningFormat::None),
    );
    let (_, chat) = call(&raw, "POST", "/v1/chat/completions", ask).await;
    let message = &chat["choices"][0]["message"];
    assert!(message.get("reasoning_content").is_none(), "{message}");
    assert_eq!(message["content"].as_str().map(str::trim), Some(thought));
}

/// A counter's value in `/metrics`.
async fn counter(state: &Arc<AppState>, name: &str) -> f64 {
    let request = Request::builder()
        .uri("/metrics")
        .body(Body::empty())
        .unwrap();
    let response = router(Arc::clone(state)).oneshot(request).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_share_one_prefill_and_count_the_prompt_once() {
    let state = smollm2();
    let ask = |stream: bool| {
        json!({"model": "smollm2", "max_tokens": 6, "temperature": 1.0, "seed": 7, "n": 3,
               "stream": stream, "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
               "messages": [{"role": "user", "content": "Write one sentence about the sea and the sky above it, please."}]})
    };
    let before = counter(&state, "pyramid_prefilled_tokens_total").await;
    let (status, whole) = call(&state, "POST", "/v1/chat/completions", ask(false)).await;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert!(
            c["message"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty()),
            "{c}"
        );
    }
    let usage = &whole["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert!(
        usage["completion_tokens"].as_u64().unwrap() > 6,
        "every choice's tokens: {usage}"
    );
    let prefilled = counter(&state, "pyramid_prefilled_tokens_total").await - before;
    assert!(
        prefilled < 2.0 * prompt as f64,
        "the prompt ({prompt} tokens) was prefilled once, not per choice: {prefilled}"
    );
    // One seed repeats every choice, streamed too, each under its index.
    let request = Request::builder()
        .method("POST")
        .uri("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from(ask(true).to_string()))
        .unwrap();
    let response = router(Arc::clone(&state)).oneshot(request).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let mut streamed = vec![String::new(); 3];
    let mut last_usage = Value::Null;
    let body = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    for line in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(chunk) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        for c in chunk["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            streamed[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
        }
        if !chunk["usage"].is_null() {
            last_usage = chunk["usage"].clone();
        }
    }
    for (i, text) in streamed.iter().enumerate() {
        assert_eq!(
            Some(text.as_str()),
            choices[i]["message"]["content"].as_str(),
            "choice {i}"
        );
    }
    assert_eq!(last_usage["completion_tokens"], usage["completion_tokens"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_server_embeds_batches_in_order_and_refuses_generation() {
    let state = Arc::try_unwrap(smollm2())
        .ok()
        .unwrap()
        .with_embedding(EmbeddingSetup {
            pooling: Pooling::Last,
            width: 576,
            only: true,
        });
    let state = Arc::new(state);
    let body = json!({"model": "smollm2", "prompt": "Hello", "max_tokens": 4});
    let (status, reply) = call(&state, "POST", "/v1/completions", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{reply}");
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--embedding"));

    let texts = [
        "The cat sat.",
        "A different sentence entirely",
        "The cat sat.",
    ];
    let body = json!({"model": "smollm2", "input": texts});
    let (status, batch) = call(&state, "POST", "/v1/embeddings", body).await;
    assert_eq!(status, StatusCode::OK, "{batch}");
    let vectors: Vec<Vec<f64>> = batch["data"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            serde_json::from_value(d["embedding"].clone()).unwrap()
        })
        .collect();
    assert_eq!(vectors.len(), 3);
    assert_eq!(vectors[0].len(), 576);
    assert_eq!(vectors[0], vectors[2], "the same text, the same vector");
    assert_ne!(vectors[0], vectors[1]);
    // Each alone equals its place in the batch.
    let body = json!({"model": "smollm2", "input": texts[1]});
    let (_, alone) = call(&state, "POST", "/v1/embeddings", body).await;
    assert_eq!(alone["data"][0]["embedding"], batch["data"][1]["embedding"]);
    assert_eq!(
        alone["usage"]["prompt_tokens"],
        alone["usage"]["total_tokens"]
    );

    // Only what the server can queue at once (16 here), and only the model's width.
    let body = json!({"model": "smollm2", "input": vec!["a"; 17]});
    let (status, reply) = call(&state, "POST", "/v1/embeddings", body).await;
    assert_eq!(
        (status, &reply["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("input"))
    );
    let body = json!({"model": "smollm2", "input": "a", "dimensions": 64});
    let (status, reply) = call(&state, "POST", "/v1/embeddings", body).await;
    assert_eq!(
        (status, &reply["error"]["param"]),
        (StatusCode::BAD_REQUEST, &json!("dimensions"))
    );
    let (_, card) = call(&state, "GET", "/v1/models/smollm2", Value::Null).await;
    assert_eq!(
        card["embedding"],
        json!({"pooling": "last", "dimensions": 576, "only": true})
    );
}
