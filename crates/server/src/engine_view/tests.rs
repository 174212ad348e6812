//! Shaping the engine's view and happenings into the endpoints' JSON.

use std::time::{Duration, Instant};

use pyramid_engine::{
    ArtifactState, ArtifactView, EngineView, FinishReason, Happening, RungView, SessionKey,
    SessionState, SessionView, What,
};
use pyramid_runtime::ArtifactShape;
use serde_json::json;

use super::*;

#[test]
fn a_snapshot_names_sessions_and_artifacts_and_counts_from_the_start() {
    let started = Instant::now();
    let now = started + Duration::from_millis(1500);
    let view = EngineView {
        sessions: vec![
            SessionView {
                key: SessionKey::Request(12),
                state: SessionState::Paused,
                priority: 5,
                prompt_len: 30,
                n_generated: 4,
                context_len: 33,
                window: Some(64),
                since: started + Duration::from_millis(500),
            },
            SessionView {
                key: SessionKey::Cached(3),
                state: SessionState::Cached,
                priority: 0,
                prompt_len: 0,
                n_generated: 0,
                context_len: 80,
                window: Some(128),
                since: now,
            },
        ],
        ladder: vec![
            RungView {
                window: 64,
                artifacts: vec![
                    ArtifactView {
                        shape: ArtifactShape::Prefill {
                            chunk: 32,
                            window: 64,
                        },
                        state: ArtifactState::Resident,
                        compiling_for: None,
                        bytes: Some(1000),
                    },
                    ArtifactView {
                        shape: ArtifactShape::Decode {
                            batch: 2,
                            window: 64,
                        },
                        state: ArtifactState::Compiling,
                        compiling_for: Some(Duration::from_millis(42)),
                        bytes: None,
                    },
                ],
            },
            RungView {
                window: 128,
                artifacts: Vec::new(),
            },
        ],
        kv_used_bytes: 10,
        kv_reserved_bytes: 20,
        kv_budget_bytes: 30,
        artifact_bytes: 1000,
        artifact_budget_bytes: 5000,
    };
    let report = Throughput::new(started).report(now);
    let snapshot = EngineSnapshot::new(&view, report, started, now);
    assert_eq!(
        serde_json::to_value(&snapshot).unwrap(),
        json!({
            "time_ms": 1500,
            "sessions": [
                {"id": "req-12", "state": "paused", "priority": 5, "prompt_tokens": 30,
                 "generated_tokens": 4, "context_tokens": 33, "window": 64, "age_ms": 1000},
                {"id": "cache-3", "state": "cached", "priority": 0, "prompt_tokens": 0,
                 "generated_tokens": 0, "context_tokens": 80, "window": 128, "age_ms": 0},
            ],
            "ladder": [
                {"window": 64, "artifacts": [
                    {"kind": "prefill", "rows": 32, "state": "resident", "compiling_ms": null, "bytes": 1000},
                    {"kind": "decode", "rows": 2, "state": "compiling", "compiling_ms": 42, "bytes": null},
                ]},
                {"window": 128, "artifacts": []},
            ],
            "kv": {"used_bytes": 10, "reserved_bytes": 20, "budget_bytes": 30},
            "artifacts": {"used_bytes": 1000, "budget_bytes": 5000},
            "throughput": {"tokens_per_second": 0.0, "by_priority": []},
        })
    );
}

#[test]
fn happenings_become_timeline_events_of_the_documented_kinds() {
    let started = Instant::now();
    let at = started + Duration::from_millis(7);
    let event = |what: What| {
        serde_json::to_value(TimelineEvent::new(&Happening { at, what }, started)).unwrap()
    };
    assert_eq!(
        event(What::Migration {
            id: 4,
            from: Some(64),
            to: 128,
            reprefill: false
        }),
        json!({"time_ms": 7, "kind": "migration", "session": "req-4", "window": 128,
               "from_window": 64, "detail": null})
    );
    let shape = ArtifactShape::Decode {
        batch: 1,
        window: 256,
    };
    let compiled = event(What::CompileFinished {
        shape,
        took: Duration::from_millis(12),
        ok: true,
    });
    assert_eq!(compiled["kind"], "compile_finished");
    assert_eq!(compiled["window"], 256);
    assert_eq!(compiled["detail"], "decode 1 rows in 12 ms");
    assert_eq!(
        event(What::Finished {
            id: 1,
            reason: Some(FinishReason::Length)
        })["detail"],
        "length"
    );
    assert_eq!(
        event(What::Finished {
            id: 1,
            reason: None
        })["detail"],
        "failed"
    );
    let kinds = [
        What::Admitted {
            id: 1,
            cached_tokens: 0,
        },
        What::CompileStarted { shape },
        What::ArtifactEvicted { shape },
        What::SessionEvicted { key: 2, tokens: 9 },
        What::Stall {
            id: 1,
            window: 128,
            waited: Duration::from_millis(3),
        },
        What::Fork { id: 1, shared: 20 },
        What::Pause { id: 1 },
        What::Resume { id: 1 },
        What::SwapOut { id: 1 },
        What::SwapIn { id: 1 },
        What::Cached {
            key: 2,
            tokens: 9,
            window: None,
        },
        What::Restored {
            id: None,
            tokens: 9,
        },
    ]
    .map(|w| event(w)["kind"].as_str().unwrap().to_string());
    assert_eq!(
        kinds,
        [
            "admitted",
            "compile_started",
            "evicted",
            "evicted",
            "stall",
            "fork",
            "pause",
            "resume",
            "swap_out",
            "swap_in",
            "cached",
            "restored"
        ]
    );
}
