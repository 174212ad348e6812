//! Side-by-side runs of `scripts/peers/bench-peers.sh` (schema `pyramid-peers/1`) into
//! the results file. The script runs pyramid, llama.cpp and OpenVINO GenAI alternately on
//! the same files; a run counts as verified only when it was measured on this machine
//! from a committed tree, so its figures can be traced to the code that produced them.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::results::{Machine, PeerComparison, PeerFigure, Provenance};

pub const SCHEMA: &str = "pyramid-peers/1";

#[derive(Debug, thiserror::Error)]
pub enum PeersError {
    #[error("not a bench-peers.sh result: {0}")]
    Parse(String),
    #[error("schema '{0}', expected '{SCHEMA}'")]
    Schema(String),
    #[error("measured on another machine ({theirs}, {their_cpus} CPUs; this is {ours}, {our_cpus}): keep it under _unverified until re-measured here")]
    OtherMachine {
        theirs: String,
        their_cpus: usize,
        ours: String,
        our_cpus: usize,
    },
    #[error("pyramid was built from uncommitted changes ({0}): the figures name no commit")]
    Uncommitted(String),
    #[error("the run records no pyramid commit")]
    NoCommit,
}

#[derive(Deserialize)]
struct Run {
    schema: String,
    date: String,
    invocation: String,
    settings: Settings,
    machine: RunMachine,
    versions: Versions,
    summary: Vec<SummaryRow>,
}

#[derive(Deserialize)]
struct Settings {
    threads: usize,
    precision: String,
    /// Absent from runs made before the script recorded it, which all used f32.
    #[serde(default = "crate::results::f32_kv")]
    kv: String,
}

#[derive(Deserialize)]
struct RunMachine {
    cpu_model: String,
    logical_cpus: usize,
}

#[derive(Deserialize)]
struct Versions {
    pyramid: PyramidVersion,
}

#[derive(Deserialize)]
struct PyramidVersion {
    git_commit: Option<String>,
    git_describe: Option<String>,
}

#[derive(Deserialize)]
struct SummaryRow {
    model: String,
    test: String,
    engines: BTreeMap<String, EngineFigure>,
}

#[derive(Deserialize)]
struct EngineFigure {
    mean_ts: Option<f64>,
    sd_ts: Option<f64>,
    n: usize,
    error: Option<String>,
}

/// The comparisons of one bench-peers.sh result, with provenance, if it was measured on
/// `here` from a committed tree.
pub fn comparisons(text: &str, here: &Machine) -> Result<Vec<PeerComparison>, PeersError> {
    let run: Run = serde_json::from_str(text).map_err(|e| PeersError::Parse(e.to_string()))?;
    if run.schema != SCHEMA {
        return Err(PeersError::Schema(run.schema));
    }
    if run.machine.cpu_model != here.cpu || run.machine.logical_cpus != here.cores {
        return Err(PeersError::OtherMachine {
            theirs: run.machine.cpu_model,
            their_cpus: run.machine.logical_cpus,
            ours: here.cpu.clone(),
            our_cpus: here.cores,
        });
    }
    let describe = run.versions.pyramid.git_describe.unwrap_or_default();
    if describe.ends_with("-dirty") {
        return Err(PeersError::Uncommitted(describe));
    }
    let commit = run
        .versions
        .pyramid
        .git_commit
        .filter(|c| !c.trim().is_empty())
        .ok_or(PeersError::NoCommit)?;
    let provenance = Provenance {
        machine: here.clone(),
        commit,
        command: run.invocation.trim().to_string(),
        date: run.date,
    };
    Ok(run
        .summary
        .into_iter()
        // A model every engine failed on has no test; its reasons stay in the run file.
        .filter(|row| row.test != "-")
        .map(|row| PeerComparison {
            model: row.model,
            test: row.test,
            precision: run.settings.precision.clone(),
            kv: run.settings.kv.clone(),
            threads: run.settings.threads,
            engines: row
                .engines
                .into_iter()
                .map(|(engine, f)| PeerFigure {
                    engine,
                    mean_ts: f.mean_ts,
                    sd_ts: f.sd_ts,
                    n: f.n,
                    error: f.error,
                })
                .collect(),
            provenance: Some(provenance.clone()),
        })
        .collect())
}
