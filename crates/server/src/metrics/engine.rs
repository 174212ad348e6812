//! The engine's figures as Prometheus text: what the core and the window pyramid report
//! after each step.

use std::fmt::Write;

use pyramid_engine::EngineStats;

use super::series::{Label, PriorityLabels};

/// The engine's counters and gauges: the pyramid's compiles, stalls and migrations, the
/// sessions and their KV memory, and the artifacts resident by window.
pub(super) fn render_engine(out: &mut String, stats: &EngineStats, labels: &PriorityLabels) {
    let p = &stats.pyramid;
    let counters: [(&str, &str, f64); 14] = [
        (
            "pyramid_artifact_compiles_total",
            "Artifacts compiled (a window's prefill or decode, a decode batch size, a mixed pass).",
            p.n_compiles as f64,
        ),
        (
            "pyramid_artifact_compile_seconds_total",
            "Time spent compiling artifacts.",
            p.compile_ms / 1e3,
        ),
        (
            "pyramid_artifact_store_loads_total",
            "Artifacts loaded from the store of compiled artifacts kept across starts: compiles avoided.",
            p.n_store_loads as f64,
        ),
        (
            "pyramid_artifact_store_load_seconds_total",
            "Time spent loading artifacts from the store.",
            p.store_load_ms / 1e3,
        ),
        (
            "pyramid_stalls_total",
            "Window crossings that waited for their artifacts.",
            p.n_stalls as f64,
        ),
        (
            "pyramid_stall_seconds_total",
            "Time sequences waited at a crossing.",
            p.stall_ms / 1e3,
        ),
        (
            "pyramid_kv_migrations_total",
            "KV caches moved into a larger window.",
            p.n_migrations as f64,
        ),
        (
            "pyramid_kv_migration_bytes_total",
            "KV bytes migrations copied (none for caches that grow in place).",
            p.migration_bytes as f64,
        ),
        (
            "pyramid_kv_migration_live_bytes_total",
            "Live KV bytes of the sessions that migrated.",
            p.migration_live_bytes as f64,
        ),
        (
            "pyramid_kv_migration_seconds_total",
            "Time spent migrating KV caches.",
            p.migration_ms / 1e3,
        ),
        (
            "pyramid_reprefills_total",
            "Window crossings that prefilled the context again.",
            p.n_reprefills as f64,
        ),
        (
            "pyramid_session_forks_total",
            "New conversations that copied the prefix they share with a cached one.",
            p.n_forks as f64,
        ),
        (
            "pyramid_session_fork_bytes_total",
            "KV bytes copied by session forks.",
            p.fork_bytes as f64,
        ),
        (
            "pyramid_artifacts_evicted_total",
            "Artifacts dropped to stay within the artifact budget.",
            p.n_evicted as f64,
        ),
    ];
    let q = &stats.preemption;
    let preemption: [(&str, &str, usize); 4] = [
        (
            "pyramid_paused_total",
            "Sequences paused for more urgent ones.",
            q.n_paused,
        ),
        (
            "pyramid_resumed_total",
            "Paused sequences that ran again.",
            q.n_resumed,
        ),
        (
            "pyramid_swapped_out_total",
            "Paused sequences whose KV was given up for memory (written to the session store, or dropped).",
            q.n_swapped_out,
        ),
        (
            "pyramid_recomputed_tokens_total",
            "Tokens prefilled again for swapped-out sequences whose sessions were evicted meanwhile.",
            q.recomputed_tokens,
        ),
    ];
    let d = &stats.persisted;
    let persisted: [(&str, &str, f64); 5] = [
        (
            "pyramid_sessions_saved_total",
            "Conversations written to the session directory.",
            d.n_saved as f64,
        ),
        (
            "pyramid_session_saved_bytes_total",
            "Bytes written to the session directory.",
            d.saved_bytes as f64,
        ),
        (
            "pyramid_sessions_resumed_from_disk_total",
            "Conversations read back from the session directory instead of prefilled.",
            d.n_loaded as f64,
        ),
        (
            "pyramid_session_resumed_tokens_total",
            "Tokens whose KV came from the session directory.",
            d.loaded_tokens as f64,
        ),
        (
            "pyramid_session_load_failures_total",
            "Session files skipped when wanted: unreadable, corrupt or another setup's.",
            d.n_load_failed as f64,
        ),
    ];
    let sp = &stats.speculative;
    let speculative: [(&str, &str, usize); 4] = [
        (
            "pyramid_speculative_drafted_tokens_total",
            "Draft tokens looked up in sequences' own tokens and verified.",
            sp.drafted_tokens,
        ),
        (
            "pyramid_speculative_accepted_tokens_total",
            "Draft tokens the model agreed with: each one a pass saved.",
            sp.accepted_tokens,
        ),
        (
            "pyramid_decode_passes_total",
            "Passes that sampled tokens; generated tokens are these plus the accepted drafts.",
            sp.decode_passes,
        ),
        (
            "pyramid_speculative_verify_passes_total",
            "Passes that verified a draft.",
            sp.verify_passes,
        ),
    ];
    let counters = counters
        .into_iter()
        .chain(preemption.map(|(n, h, v)| (n, h, v as f64)))
        .chain(persisted)
        .chain(speculative.map(|(n, h, v)| (n, h, v as f64)));
    for (name, help, value) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    }
    let gauges = [
        (
            "pyramid_speculative_acceptance_ratio",
            "Accepted over drafted tokens since start (0 before any draft).",
            sp.acceptance_rate(),
        ),
        (
            "pyramid_tokens_per_decode_pass",
            "Generated tokens per sampling pass since start (1 without speculation).",
            sp.tokens_per_pass(),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
    let name = "pyramid_queue_depth_by_priority";
    let _ = writeln!(
        out,
        "# HELP {name} Requests queued or paused in the engine, by priority.\n# TYPE {name} gauge"
    );
    if stats.waiting_by_priority.is_empty() {
        let _ = writeln!(out, "{name}{{priority=\"0\"}} 0");
    }
    let mut by_label: Vec<(Label, usize)> = Vec::new();
    for &(p, n) in &stats.waiting_by_priority {
        let label = labels.label(p);
        match by_label.iter_mut().find(|(l, _)| *l == label) {
            Some((_, total)) => *total += n,
            None => by_label.push((label, n)),
        }
    }
    by_label.sort_unstable();
    for (label, n) in by_label {
        let _ = writeln!(out, "{name}{{priority=\"{label}\"}} {n}");
    }
    if let Some(gb_s) = p.migration_gb_per_s() {
        let name = "pyramid_kv_migration_copy_gigabytes_per_second";
        let _ = writeln!(
            out,
            "# HELP {name} Effective copy speed of migrations that copied.\n# TYPE {name} gauge\n{name} {gb_s}"
        );
    }
    let gauges: [(&str, &str, usize); 9] = [
        (
            "pyramid_stored_sessions",
            "Conversations in the session directory.",
            stats.persisted.stored_sessions,
        ),
        (
            "pyramid_sessions_pending_writes",
            "Conversations handed to the session thread and not written yet.",
            stats.persisted.pending_writes,
        ),
        (
            "pyramid_running_sequences",
            "Sequences in the batch.",
            stats.running,
        ),
        (
            "pyramid_paused_sequences",
            "Sequences paused for more urgent ones.",
            stats.paused,
        ),
        (
            "pyramid_cached_sessions",
            "Finished conversations kept for reuse.",
            stats.cached_sessions,
        ),
        (
            "pyramid_kv_bytes",
            "KV cache bytes reserved by running, paused and cached conversations (their windows).",
            stats.kv_bytes_reserved,
        ),
        (
            "pyramid_kv_used_bytes",
            "KV cache bytes of live positions.",
            stats.kv_bytes_used,
        ),
        (
            "pyramid_artifacts_compiling",
            "Artifact compiles in flight.",
            stats.compiling,
        ),
        (
            "pyramid_engine_waiting",
            "Requests the engine holds but has not admitted.",
            stats.waiting,
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
    let _ = writeln!(out, "# HELP pyramid_artifacts_resident Compiled artifacts held, by window.\n# TYPE pyramid_artifacts_resident gauge");
    for &(window, count, _) in &stats.artifacts {
        let _ = writeln!(
            out,
            "pyramid_artifacts_resident{{window=\"{window}\"}} {count}"
        );
    }
    let _ = writeln!(out, "# HELP pyramid_artifact_bytes Memory held by compiled artifacts, by window.\n# TYPE pyramid_artifact_bytes gauge");
    for &(window, _, bytes) in &stats.artifacts {
        let _ = writeln!(out, "pyramid_artifact_bytes{{window=\"{window}\"}} {bytes}");
    }
    let _ = writeln!(out, "# HELP pyramid_artifact_build_seconds How long each shape's latest artifact took to make: compiled, or loaded from the store.\n# TYPE pyramid_artifact_build_seconds gauge");
    for (shape, build) in &stats.builds {
        let how = if build.loaded { "store" } else { "compile" };
        let _ = writeln!(
            out,
            "pyramid_artifact_build_seconds{{shape=\"{shape}\",window=\"{}\",how=\"{how}\"}} {}",
            shape.window(),
            build.took.as_secs_f64()
        );
    }
}
