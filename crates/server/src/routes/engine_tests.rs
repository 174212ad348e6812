//! The engine view's endpoints through the router, on SmolLM2 served from static
//! artifacts on a small ladder with one batch slot, so a short script shows compiles, a
//! migration, a fork and a pause.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use pyramid_engine::{Arm, Engine, EngineConfig, PyramidConfig, SpeculativeConfig};
use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::{KvType, Model};
use pyramid_runtime::{CpuBackend, WindowLadder};
use pyramid_tokenizer::Tokenizer;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::super::{router, ApiKey, AppState};
use crate::metrics::Metrics;
use crate::worker::EngineThread;
use crate::Limits;

const KEY: &str = "engine-view-key";

/// SmolLM2 on static artifacts, windows 64 and 128, one sequence in the batch.
fn server() -> Arc<AppState> {
    let file = GgufFile::open(pyramid_testdata::model_path(
        "smollm2-135m-instruct-q4_1.gguf",
    ))
    .unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf(file.metadata()).unwrap());
    let model = Arc::new(Model::from_gguf(&file).unwrap());
    let config = EngineConfig {
        pyramid: PyramidConfig {
            ladder: WindowLadder::new(vec![64, 128], 8192).unwrap(),
            prefill_chunk: 32,
            arm: Arm::OnDemand,
            generation_reserve: 8,
            artifact_budget: usize::MAX,
            margin: Duration::from_millis(5),
            first_compile_estimate: Duration::from_millis(10),
        },
        max_batch: 1,
        kv_budget: usize::MAX,
        max_sessions: 8,
        static_shapes: true,
        aging: pyramid_engine::DEFAULT_AGING,
        speculative: SpeculativeConfig::default(),
    };
    let core = Engine::new(Arc::new(CpuBackend::new(model, 2)), 1, KvType::F32, config).unwrap();
    let metrics = Arc::new(Metrics::default());
    let engine = EngineThread::start(
        core,
        Arc::clone(&tokenizer),
        ThreadPool::new(2).unwrap(),
        16,
        Arc::clone(&metrics),
    )
    .unwrap();
    let keys = vec![ApiKey {
        key: KEY.to_string(),
        priority: None,
    }];
    Arc::new(AppState::new(
        engine,
        tokenizer,
        None,
        "smollm2".to_string(),
        128,
        keys,
        Limits::default(),
        metrics,
    ))
}

fn get(uri: &str, key: Option<&str>) -> Request<Body> {
    let mut request = Request::builder().method("GET").uri(uri);
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    request.body(Body::empty()).unwrap()
}

async fn snapshot(state: &Arc<AppState>) -> Value {
    let response = router(Arc::clone(state))
        .oneshot(get("/v1/engine/snapshot", Some(KEY)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// A completion of `max_tokens` tokens whatever the model samples.
async fn complete(state: Arc<AppState>, prompt: String, max_tokens: usize, priority: i32) {
    let body = json!({
        "model": "smollm2",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "priority": priority,
    });
    let request = Request::builder()
        .method("POST")
        .uri("/v1/completions")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {KEY}"))
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = router(state).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
}

/// Snapshots until `done` holds for one, within `limit`.
async fn snapshot_until(
    state: &Arc<AppState>,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let s = snapshot(state).await;
        if done(&s) || Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn session<'a>(s: &'a Value, state: &str) -> Option<&'a Value> {
    s["sessions"]
        .as_array()?
        .iter()
        .find(|x| x["state"] == state)
}

const LONG: &str = "The old lighthouse at the top of the hill had watched over the bay for a hundred years, and every night";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_endpoints_need_the_key() {
    let state = server();
    for uri in ["/v1/engine/snapshot", "/v1/engine/events"] {
        for key in [None, Some("wrong")] {
            let response = router(Arc::clone(&state))
                .oneshot(get(uri, key))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{uri} {key:?}");
        }
    }
    let s = snapshot(&state).await;
    assert_eq!(s["model"], "smollm2");
    assert_eq!(s["route"], "cpu");
    assert_eq!(s["sessions"], json!([]));
    let windows: Vec<u64> = s["ladder"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["window"].as_u64().unwrap())
        .collect();
    assert_eq!(windows, [64, 128]);
}

/// One script read through the events stream: a low-urgency request compiles its
/// window and runs; an urgent one sharing its prefix forks it and pauses it (one batch
/// slot); the first resumes, outgrows window 64 and migrates to 128 once that compiles.
/// Snapshots taken meanwhile show both requests at their priorities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_stream_shows_a_fork_a_pause_a_migration_and_compiles() {
    let state = server();
    let started = Instant::now();
    let response = router(Arc::clone(&state))
        .oneshot(get("/v1/engine/events", Some(KEY)))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let frames: Arc<Mutex<Vec<(String, Value, Duration)>>> = Arc::default();
    let reader = {
        let frames = Arc::clone(&frames);
        let mut body = response.into_body();
        tokio::spawn(async move {
            let mut text = String::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                text.push_str(std::str::from_utf8(&data).unwrap());
                while let Some(end) = text.find("\n\n") {
                    let chunk: String = text.drain(..end + 2).collect();
                    let event = chunk.lines().find_map(|l| l.strip_prefix("event: "));
                    let data = chunk.lines().find_map(|l| l.strip_prefix("data: "));
                    if let (Some(event), Some(data)) = (event, data) {
                        let value = serde_json::from_str(data).unwrap();
                        frames
                            .lock()
                            .unwrap()
                            .push((event.to_string(), value, started.elapsed()));
                    }
                }
            }
        })
    };

    let slow = tokio::spawn(complete(Arc::clone(&state), LONG.to_string(), 72, 10));
    let running = snapshot_until(&state, Duration::from_secs(5), |s| {
        session(s, "running").is_some_and(|r| r["generated_tokens"].as_u64() >= Some(2))
    })
    .await;
    assert!(session(&running, "running").is_some(), "{running}");
    let urgent_prompt = format!("{LONG} the keeper climbed");
    let urgent = tokio::spawn(complete(Arc::clone(&state), urgent_prompt, 24, 0));
    let both = snapshot_until(&state, Duration::from_secs(5), |s| {
        session(s, "paused").is_some() && session(s, "running").is_some()
    })
    .await;
    let paused = session(&both, "paused").expect("the less urgent request paused");
    let running = session(&both, "running").expect("the urgent request runs");
    assert_eq!(paused["priority"], 10, "{both}");
    assert_eq!(running["priority"], 0, "{both}");
    for s in [paused, running] {
        assert!(s["id"].as_str().unwrap().starts_with("req-"), "{s}");
        assert!(s["prompt_tokens"].as_u64().unwrap() > 10, "{s}");
        assert!(s["context_tokens"].as_u64().unwrap() > 0, "{s}");
        assert_eq!(s["window"], 64, "{s}");
        assert!(s["age_ms"].is_u64(), "{s}");
        assert!(s["generated_tokens"].is_u64(), "{s}");
    }
    let rung64 = &both["ladder"][0];
    assert_eq!(rung64["window"], 64);
    let kinds: Vec<&str> = rung64["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["prefill", "decode"], "{both}");
    assert!(both["kv"]["used_bytes"].as_u64().unwrap() > 0, "{both}");
    assert!(
        both["artifacts"]["used_bytes"].as_u64().unwrap() > 0,
        "{both}"
    );
    assert!(both["throughput"]["by_priority"].is_array(), "{both}");

    urgent.await.unwrap();
    slow.await.unwrap();
    // The last happenings reach the stream within a publish interval.
    tokio::time::sleep(Duration::from_millis(400)).await;
    reader.abort();
    let frames = frames.lock().unwrap();
    let timeline: Vec<&Value> = frames
        .iter()
        .filter(|f| f.0 == "timeline")
        .map(|f| &f.1)
        .collect();
    let seen = |kind: &str| timeline.iter().find(|e| e["kind"] == kind).copied();
    for kind in [
        "compile_started",
        "compile_finished",
        "admitted",
        "fork",
        "pause",
        "resume",
        "migration",
        "finished",
        "cached",
    ] {
        assert!(seen(kind).is_some(), "no {kind} in {timeline:#?}");
    }
    let migration = seen("migration").unwrap();
    assert_eq!(migration["window"], 128);
    assert_eq!(migration["from_window"], 64);
    let paused_id = &seen("pause").unwrap()["session"];
    assert_eq!(paused_id, &paused["id"]);
    assert_eq!(seen("fork").unwrap()["session"], running["id"]);
    // A snapshot first, then at least two a second.
    assert_eq!(frames[0].0, "snapshot");
    let snapshots: Vec<Duration> = frames
        .iter()
        .filter(|f| f.0 == "snapshot")
        .map(|f| f.2)
        .collect();
    let span = frames.last().unwrap().2;
    assert!(
        snapshots.len() as f64 >= 2.0 * span.as_secs_f64() - 1.0 && snapshots.len() >= 2,
        "{} snapshots in {span:?}",
        snapshots.len()
    );
    let last = &frames.iter().rev().find(|f| f.0 == "snapshot").unwrap().1;
    assert_eq!(last["model"], "smollm2");
    assert!(last["time_ms"].as_u64().unwrap() > 0);
}
