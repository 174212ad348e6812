//! The results file, `benchmarks/latest.json`.
//!
//! `verified` holds cells the harness measured, each with its provenance (machine
//! fingerprint, commit, command, date). `_unverified` holds figures from elsewhere
//! (papers, peers' documentation, runs on other machines) that have not been re-measured
//! here; they are kept for reference and never quoted as results. A figure moves to
//! `verified` only by being measured again.

use serde::{Deserialize, Serialize};

use crate::energy::EnergyReport;

pub const SCHEMA: u32 = 1;

/// What a figure was measured on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub cpu: String,
    /// The kernel family that ran (`avx2`, `avx512`, `scalar`).
    pub isa: String,
    pub cores: usize,
    pub memory_bytes: u64,
    pub os: String,
}

impl Machine {
    /// This machine, from `/proc` where available.
    pub fn detect(isa: &str) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map_or_else(
                || std::env::consts::ARCH.to_string(),
                |(_, v)| v.trim().to_string(),
            );
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_bytes = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        Self {
            cpu,
            isa: isa.to_string(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_bytes,
            os: std::env::consts::OS.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub machine: Machine,
    pub commit: String,
    /// The command line that produced the cell.
    pub command: String,
    /// UTC, RFC 3339.
    pub date: String,
}

/// What identifies a cell: the same key measured again replaces the old figures.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CellKey {
    pub model: String,
    pub precision: String,
    pub kv: String,
    pub window: usize,
    pub prefill_device: String,
    pub decode_device: String,
    pub batch: usize,
    pub n_prompt: usize,
    pub n_gen: usize,
}

impl CellKey {
    /// `cpu`, or `ov:GPU->ov:NPU` when the stages differ.
    pub fn route(&self) -> String {
        if self.prefill_device == self.decode_device {
            self.prefill_device.clone()
        } else {
            format!("{}->{}", self.prefill_device, self.decode_device)
        }
    }
}

/// Mean and sample standard deviation of the repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub mean: f64,
    pub sd: f64,
    pub n: usize,
}

impl Stat {
    pub fn of(samples: &[f64]) -> Self {
        let n = samples.len();
        let mean = samples.iter().sum::<f64>() / n.max(1) as f64;
        let sd = if n > 1 {
            (samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Self { mean, sd, n }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    #[serde(flatten)]
    pub key: CellKey,
    /// A random-weight model with a published model's shapes: speed only, never quality.
    pub synthetic: bool,
    /// Weight-matrix parameters of a synthetic shape, which orders the scaling table.
    #[serde(default)]
    pub parameters: Option<u64>,
    /// Devices that really executed prefill and decode.
    pub prefill_executed: String,
    pub decode_executed: String,
    /// Both stages ran where they were asked to.
    pub as_requested: bool,
    /// Greedy tokens equal the native f32 path's on the reference prompts (`None`: not
    /// checked, as for synthetic models, whose tokens mean nothing).
    pub qualified: Option<bool>,
    /// How close the tokens came, so a failure shows how far it is from passing.
    #[serde(default)]
    pub agreement: Option<Agreement>,
    /// Time to first token after the artifacts are compiled.
    pub ttft_ms: Stat,
    pub prefill_tok_s: Stat,
    pub decode_tok_s: Stat,
    pub decode_ms_per_token: Stat,
    pub e2e_ms: Stat,
    pub compile_ms: f64,
    pub peak_rss_bytes: Option<u64>,
    /// From the last repetition.
    pub energy: EnergyReport,
    pub joules_per_token: Option<f64>,
    pub provenance: Option<Provenance>,
}

impl Cell {
    /// Whether the cell may appear in headline tables and plots.
    pub fn is_headline(&self) -> bool {
        self.as_requested && self.qualified != Some(false)
    }
}

/// Greedy agreement with the native f32 path over the reference prompts that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Agreement {
    pub prompts_matched: usize,
    pub prompts_checked: usize,
    pub tokens_per_prompt: usize,
    /// The earliest generated position at which any prompt's tokens differ.
    pub first_difference: Option<usize>,
}

impl std::fmt::Display for Agreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} prompts × {} tokens",
            self.prompts_matched, self.prompts_checked, self.tokens_per_prompt
        )?;
        if let Some(i) = self.first_difference {
            write!(f, ", first differs at {i}")?;
        }
        Ok(())
    }
}

/// A figure from elsewhere, kept apart until re-measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unverified {
    /// What it is, e.g. "llama.cpp tg128 on Snapdragon X Elite".
    pub figure: String,
    /// As it would be quoted ("42.1 tok/s"); `bench check` rejects a README quoting it.
    pub quote: String,
    pub source: String,
}

/// One strategy of a `pyramid replay` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayArm {
    /// `largest`, `reprefill`, `on-demand` or `predictive`.
    pub arm: String,
    pub total_ms: f64,
    pub ttft_ms_p50: f64,
    pub decode_ms_per_token: f64,
    pub n_compiles: usize,
    pub compile_ms: f64,
    /// Artifacts loaded from the store of compiled artifacts instead of compiled, and
    /// the time it took; absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_store_loads: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_load_ms: Option<f64>,
    pub n_migrations: usize,
    pub migration_ms: f64,
    /// Bytes migrations copied (0 when caches grow in place); absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_bytes: Option<usize>,
    /// Live KV bytes of the migrated sessions; absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_live_bytes: Option<usize>,
    pub n_reprefills: usize,
    pub reprefill_ms: f64,
    pub n_stalls: usize,
    pub stall_ms: f64,
    pub peak_rss_bytes: Option<u64>,
    pub failed_sessions: usize,
}

/// A `pyramid replay --record` run: the same agent trace under every window strategy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayRecord {
    pub model: String,
    pub precision: String,
    pub kv: String,
    pub route: String,
    /// Devices that really ran prefill and decode.
    pub executed: String,
    pub as_requested: bool,
    pub windows: Vec<usize>,
    /// The trace's description (file, or synthetic seed and scale).
    pub trace: String,
    pub steps: usize,
    pub appended_tokens: usize,
    pub generate_tokens: usize,
    /// Every arm generated the same tokens (`None`: fewer than two arms ran).
    pub tokens_identical: Option<bool>,
    pub arms: Vec<ReplayArm>,
    pub provenance: Option<Provenance>,
}

impl ReplayRecord {
    /// Whether the run may appear in headline tables and plots: arms that lost sessions
    /// did not do the same work, so their times do not compare.
    pub fn is_headline(&self) -> bool {
        self.as_requested
            && self.tokens_identical != Some(false)
            && self.arms.iter().all(|a| a.failed_sessions == 0)
    }

    fn same_setup(&self, other: &Self) -> bool {
        (
            &self.model,
            &self.precision,
            &self.kv,
            &self.route,
            &self.trace,
            &self.windows,
        ) == (
            &other.model,
            &other.precision,
            &other.kv,
            &other.route,
            &other.trace,
            &other.windows,
        )
    }
}

/// One engine's throughput in a side-by-side run (`None` with the reason when it failed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerFigure {
    /// `pyramid`, `llama-q8_0`, `llama-own` (the file's own quantisation) or `ov-genai`.
    pub engine: String,
    pub mean_ts: Option<f64>,
    pub sd_ts: Option<f64>,
    pub n: usize,
    pub error: Option<String>,
}

/// One test (`pp512`, `tg128`) of `scripts/peers/bench-peers.sh`: pyramid and its peers
/// run alternately in one run, on the same GGUF file, threads and lengths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerComparison {
    pub model: String,
    pub test: String,
    /// pyramid's weight precision in the run.
    pub precision: String,
    /// pyramid's KV cache storage in the run (runs from before it was recorded used f32).
    #[serde(default = "f32_kv")]
    pub kv: String,
    pub threads: usize,
    pub engines: Vec<PeerFigure>,
    pub provenance: Option<Provenance>,
}

/// The KV type of results recorded before the KV type was.
pub(crate) fn f32_kv() -> String {
    "f32".to_string()
}

impl PeerComparison {
    pub fn figure(&self, engine: &str) -> Option<&PeerFigure> {
        self.engines.iter().find(|e| e.engine == engine)
    }

    /// pyramid's throughput over `peer`'s, when both ran.
    pub fn ratio(&self, peer: &str) -> Option<f64> {
        let ours = self.figure("pyramid")?.mean_ts?;
        let theirs = self.figure(peer)?.mean_ts?;
        (theirs > 0.0).then(|| ours / theirs)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultsFile {
    pub schema: u32,
    pub verified: Vec<Cell>,
    /// Replay runs, verified like cells: measured here, with provenance.
    #[serde(default)]
    pub replays: Vec<ReplayRecord>,
    /// Side-by-side runs against llama.cpp and OpenVINO GenAI, measured here.
    #[serde(default)]
    pub peers: Vec<PeerComparison>,
    #[serde(rename = "_unverified", default)]
    pub unverified: Vec<Unverified>,
}

impl Default for ResultsFile {
    fn default() -> Self {
        Self {
            schema: SCHEMA,
            verified: Vec::new(),
            replays: Vec::new(),
            peers: Vec::new(),
            unverified: Vec::new(),
        }
    }
}

impl ResultsFile {
    /// Adds `cells`, replacing any earlier cell with the same key.
    pub fn merge(&mut self, cells: Vec<Cell>) {
        for cell in cells {
            self.verified.retain(|c| c.key != cell.key);
            self.verified.push(cell);
        }
        self.verified.sort_by(|a, b| a.key.cmp(&b.key));
    }

    /// Adds side-by-side figures, replacing earlier ones of the same model, test,
    /// precision and threads.
    pub fn merge_peers(&mut self, comparisons: Vec<PeerComparison>) {
        for c in comparisons {
            self.peers.retain(|p| {
                (&p.model, &p.test, &p.precision, &p.kv, p.threads)
                    != (&c.model, &c.test, &c.precision, &c.kv, c.threads)
            });
            self.peers.push(c);
        }
    }

    /// Adds a replay run, replacing an earlier one of the same model, route and trace.
    pub fn merge_replay(&mut self, record: ReplayRecord) {
        self.replays.retain(|r| !r.same_setup(&record));
        self.replays.push(record);
    }
}

fn check_provenance(name: &str, provenance: Option<&Provenance>, problems: &mut Vec<String>) {
    let Some(p) = provenance else {
        problems.push(format!("{name} has no provenance"));
        return;
    };
    for (what, value) in [
        ("commit", &p.commit),
        ("command", &p.command),
        ("date", &p.date),
        ("machine cpu", &p.machine.cpu),
        ("machine isa", &p.machine.isa),
    ] {
        if value.trim().is_empty() {
            problems.push(format!("{name}: provenance lacks its {what}"));
        }
    }
    if p.machine.cores == 0 {
        problems.push(format!("{name}: provenance lacks the machine's cores"));
    }
}

/// Markers around the README's generated performance section.
pub const README_BEGIN: &str = "<!-- pyramid bench report: begin -->";
pub const README_END: &str = "<!-- pyramid bench report: end -->";

/// Everything wrong with a results file (and the README quoting it); empty when sound.
pub fn check(results_text: &str, readme: Option<(&str, &str)>) -> Vec<String> {
    let file: ResultsFile = match serde_json::from_str(results_text) {
        Ok(f) => f,
        Err(e) => return vec![format!("not a results file: {e}")],
    };
    let mut problems = Vec::new();
    if file.schema != SCHEMA {
        problems.push(format!(
            "schema {} (this pyramid writes {SCHEMA})",
            file.schema
        ));
    }
    for cell in &file.verified {
        let name = format!(
            "verified cell {} {} w{} {} b{}",
            cell.key.model,
            cell.key.precision,
            cell.key.window,
            cell.key.route(),
            cell.key.batch
        );
        check_provenance(&name, cell.provenance.as_ref(), &mut problems);
    }
    for r in &file.replays {
        let name = format!(
            "replay {} {} {} on {}",
            r.model, r.precision, r.route, r.trace
        );
        check_provenance(&name, r.provenance.as_ref(), &mut problems);
    }
    for p in &file.peers {
        let name = format!("side-by-side {} {} ({})", p.model, p.test, p.precision);
        check_provenance(&name, p.provenance.as_ref(), &mut problems);
    }
    for u in &file.unverified {
        if u.source.trim().is_empty() {
            problems.push(format!("unverified figure '{}' has no source", u.figure));
        }
    }
    if let Some((readme, rendered_section)) = readme {
        for u in &file.unverified {
            if !u.quote.trim().is_empty() && readme.contains(u.quote.trim()) {
                problems.push(format!(
                    "the README quotes unverified figure '{}' ({}): re-measure it or remove it",
                    u.figure, u.quote
                ));
            }
        }
        match readme_section(readme) {
            None => problems.push(format!(
                "the README has no generated performance section ({README_BEGIN} … {README_END})"
            )),
            Some(section) if section.trim() != rendered_section.trim() => problems.push(
                "the README's performance section differs from what `pyramid bench report` renders from the verified cells: run it again rather than editing by hand".to_string(),
            ),
            Some(_) => {}
        }
    }
    problems
}

/// The text between the README markers.
pub fn readme_section(readme: &str) -> Option<&str> {
    let start = readme.find(README_BEGIN)? + README_BEGIN.len();
    let end = start + readme[start..].find(README_END)?;
    Some(&readme[start..end])
}

/// `readme` with its generated section replaced by `section`.
pub fn replace_readme_section(readme: &str, section: &str) -> Option<String> {
    let start = readme.find(README_BEGIN)? + README_BEGIN.len();
    let end = start + readme[start..].find(README_END)?;
    Some(format!(
        "{}\n{}\n{}",
        &readme[..start],
        section.trim(),
        &readme[end..]
    ))
}

/// The commit checked out in the repository holding `dir` (read from `.git`, so no git
/// binary is needed), with `-dirty` unknown: callers name uncommitted work themselves.
pub fn commit_of(dir: &std::path::Path) -> Option<String> {
    let git = dir
        .ancestors()
        .map(|d| d.join(".git"))
        .find(|g| g.is_dir())?;
    let head = std::fs::read_to_string(git.join("HEAD")).ok()?;
    let head = head.trim();
    let Some(reference) = head.strip_prefix("ref: ") else {
        return Some(head.to_string());
    };
    if let Ok(id) = std::fs::read_to_string(git.join(reference)) {
        return Some(id.trim().to_string());
    }
    std::fs::read_to_string(git.join("packed-refs"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_suffix(reference).map(|id| id.trim().to_string()))
}

/// Now, UTC, as RFC 3339 (`2026-11-30T23:05:57Z`).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
