//! The route audit: per stage, the device asked for and the device that really executed
//! it, as every report (`run --json`, `bench`, `replay`, `qualify`, `/metrics`,
//! `/v1/models`) shows it.

use pyramid_runtime::executed_as_requested;
use serde::Serialize;

/// The device asked for and the one that really ran, per stage.
#[derive(Debug, Clone, Serialize)]
pub struct StageAudit {
    pub requested: String,
    pub executed: Option<String>,
    /// False when the executing device is not the requested one (a fallback).
    pub as_requested: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RouteAudit {
    pub prefill: StageAudit,
    pub decode: StageAudit,
}

impl RouteAudit {
    /// Each stage's device asked for and, once one of its artifacts exists, the one that
    /// executed it (as its backend reports it).
    pub fn new(
        prefill_requested: &str,
        decode_requested: &str,
        prefill_executed: Option<String>,
        decode_executed: Option<String>,
    ) -> Self {
        let stage = |requested: &str, executed: Option<String>| StageAudit {
            as_requested: executed
                .as_deref()
                .map(|e| executed_as_requested(requested, e)),
            requested: requested.to_string(),
            executed,
        };
        Self {
            prefill: stage(prefill_requested, prefill_executed),
            decode: stage(decode_requested, decode_executed),
        }
    }

    pub fn flagged(&self) -> bool {
        [&self.prefill, &self.decode]
            .iter()
            .any(|s| s.as_requested == Some(false))
    }

    /// One line for tables: `ov:GPU (ran on GPU.0) -> ov:NPU (ran on NPU)`, with a warning
    /// when a stage ran elsewhere.
    pub fn describe(&self) -> String {
        let stage = |s: &StageAudit| match &s.executed {
            Some(e) => format!("{} (ran on {e})", s.requested),
            None => s.requested.clone(),
        };
        let mut line = format!("{} -> {}", stage(&self.prefill), stage(&self.decode));
        if self.flagged() {
            line.push_str("  WARNING: a stage did not run on the device asked for");
        }
        line
    }
}
