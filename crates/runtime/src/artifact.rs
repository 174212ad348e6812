//! Static-shape artifacts: a stage compiled for fixed shapes on one device.
//!
//! Static-shape accelerators (NPUs through OpenVINO or QNN) run graphs compiled for one
//! shape; pyramid treats every backend that way, so the window pyramid above works the
//! same on all of them. A [`Backend`] compiles an [`ArtifactShape`] into an
//! [`Executable`]: prefill runs exactly `chunk` tokens (the last chunk padded) against a
//! cache of exactly `window` positions; decode runs up to `batch` one-token sequences,
//! each with a cache of exactly `window` positions. Compiling prepares everything that
//! depends on the shape, so running an executable allocates nothing.
//!
//! The native CPU backend ([`CpuBackend`]) shares one packed model between all its
//! artifacts; compiling sizes the buffer plan for the shape and fixes the kernel family.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyramid_kernels::{isa, ThreadPool};
use pyramid_model::{KvCache, KvType, LogitsFor, Model, Precision, Scratch, Segment};

use crate::{Result, RuntimeError};

/// The fixed shape a stage is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ArtifactShape {
    /// One sequence, exactly `chunk` tokens per run (padded), over `window` positions.
    Prefill { chunk: usize, window: usize },
    /// Up to `batch` sequences of one token each, every cache `window` positions.
    Decode { batch: usize, window: usize },
    /// Up to `batch` sequences of any lengths, at most `rows` tokens in all, each cache
    /// at most `window` positions: prefill chunks and decode tokens of sequences on
    /// different windows in one pass, returning at most `logits` rows of logits (one per
    /// sequence, more for a sequence verifying a speculative draft). Only backends whose
    /// kernels take any shape compile it ([`Backend::runs_mixed_passes`]); a static device
    /// never sees it.
    Mixed {
        rows: usize,
        batch: usize,
        logits: usize,
        window: usize,
    },
}

impl ArtifactShape {
    pub fn window(self) -> usize {
        match self {
            ArtifactShape::Prefill { window, .. }
            | ArtifactShape::Decode { window, .. }
            | ArtifactShape::Mixed { window, .. } => window,
        }
    }

    /// Rows one run computes.
    pub fn rows(self) -> usize {
        match self {
            ArtifactShape::Prefill { chunk, .. } => chunk,
            ArtifactShape::Decode { batch, .. } => batch,
            ArtifactShape::Mixed { rows, .. } => rows,
        }
    }

    /// Logit rows one run returns at most: one per sequence on static shapes.
    pub fn outputs(self) -> usize {
        match self {
            ArtifactShape::Prefill { .. } => 1,
            ArtifactShape::Decode { batch, .. } => batch,
            ArtifactShape::Mixed { logits, .. } => logits,
        }
    }
}

impl std::fmt::Display for ArtifactShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArtifactShape::Prefill { chunk, window } => write!(f, "prefill c{chunk} w{window}"),
            ArtifactShape::Decode { batch, window } => write!(f, "decode b{batch} w{window}"),
            ArtifactShape::Mixed {
                rows,
                batch,
                logits,
                window,
            } => write!(f, "mixed r{rows} b{batch} l{logits} w{window}"),
        }
    }
}

/// What identifies an artifact: the same key on the same backend gives the same program.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArtifactKey {
    /// Identifies the weights by content (the CLI takes it from `ModelCache::model_identity`).
    pub model_id: u64,
    pub device: String,
    pub precision: Precision,
    pub kv_type: KvType,
    pub shape: ArtifactShape,
}

/// A compiled stage, ready to run.
pub trait Executable: Send + Sync {
    fn shape(&self) -> ArtifactShape;

    /// Memory the artifact holds beyond the shared weights.
    fn bytes(&self) -> usize;

    /// Where it really runs (for the route audit).
    fn executing_device(&self) -> String;

    /// Whether the backend loaded this artifact from its store of compiled artifacts
    /// (kept across starts) instead of compiling it.
    fn loaded_from_store(&self) -> bool {
        false
    }

    /// Runs one step and writes the logits of each segment's last
    /// [`Segment::n_logits`] real tokens to `logits` (`[rows, n_vocab]`, in segment
    /// order). The segments must fit the shape: see [`ArtifactShape`]; only mixed passes
    /// return more than one row per segment.
    fn run(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<()>;
}

/// A device that compiles shapes into executables.
pub trait Backend: Send + Sync {
    /// The device name in artifact keys and reports (`cpu`, `ov:NPU`, …).
    fn device(&self) -> String;

    fn model(&self) -> &Arc<Model>;

    /// Compiles `shape`. Slow on static devices: callers keep it off the decode path.
    fn compile(&self, shape: ArtifactShape) -> Result<Arc<dyn Executable>>;

    /// Whether this backend compiles [`ArtifactShape::Mixed`]: one pass for every
    /// sequence of a step whatever its window, with no artifact per window.
    fn runs_mixed_passes(&self) -> bool {
        false
    }
}

/// An executable with what it cost to make.
#[derive(Clone)]
pub struct Compiled {
    pub executable: Arc<dyn Executable>,
    pub compile_time: Duration,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("shape", &self.executable.shape())
            .field("compile_time", &self.compile_time)
            .finish()
    }
}

/// Compiles and times.
pub fn compile_timed(backend: &dyn Backend, shape: ArtifactShape) -> Result<Compiled> {
    let start = Instant::now();
    let executable = backend.compile(shape)?;
    Ok(Compiled {
        executable,
        compile_time: start.elapsed(),
    })
}

/// Prefill on one backend, decode on another (e.g. prefill on an iGPU, decode on an NPU).
/// Caches live in host memory in one layout for every backend, so handing a session from
/// the prefill artifact to the decode artifact copies nothing.
pub struct RouteBackend {
    prefill: Arc<dyn Backend>,
    decode: Arc<dyn Backend>,
}

impl RouteBackend {
    /// Both backends must run the same model (same shapes).
    pub fn new(prefill: Arc<dyn Backend>, decode: Arc<dyn Backend>) -> Result<Self> {
        if prefill.model().config != decode.model().config {
            return Err(RuntimeError::Device(format!(
                "{} and {} run different models",
                prefill.device(),
                decode.device()
            )));
        }
        Ok(Self { prefill, decode })
    }
}

impl Backend for RouteBackend {
    fn device(&self) -> String {
        format!("{}->{}", self.prefill.device(), self.decode.device())
    }

    fn model(&self) -> &Arc<Model> {
        self.prefill.model()
    }

    fn compile(&self, shape: ArtifactShape) -> Result<Arc<dyn Executable>> {
        match shape {
            ArtifactShape::Prefill { .. } => self.prefill.compile(shape),
            ArtifactShape::Decode { .. } => self.decode.compile(shape),
            // A mixed pass runs both stages at once: no split route can run it.
            ArtifactShape::Mixed { .. } => Err(RuntimeError::BadShape {
                shape,
                reason: "a split route runs prefill and decode on different devices".to_string(),
            }),
        }
    }
}

/// Whether a device that really executed (`executed`, as a backend reports it: `cpu
/// (avx2)`, `CPU`, `GPU.0`, `HETERO:NPU,CPU`) is the one asked for (`cpu`, `ov:GPU`).
/// A fallback to another device, or a split across several, is a mismatch. A split
/// prefill asked for as `cpu+ov:CPU` reports each executor's device, `cpu (avx2) + CPU`.
pub fn executed_as_requested(requested: &str, executed: &str) -> bool {
    if let Some((first, second)) = requested.split_once('+') {
        return executed.split_once(" + ").is_some_and(|(a, b)| {
            executed_as_requested(first, a) && executed_as_requested(second, b)
        });
    }
    match requested.strip_prefix("ov:") {
        None => executed.split_whitespace().next() == Some(requested),
        Some(device) => {
            let base = |d: &str| d.split('.').next().unwrap_or(d).to_string();
            let executed: Vec<&str> = executed
                .split([',', ' '])
                .filter(|d| !d.is_empty())
                .collect();
            !executed.is_empty()
                && executed
                    .iter()
                    .all(|d| *d == device || (!device.contains('.') && base(d) == device))
        }
    }
}

/// The native backend: the engine's own kernels on this CPU.
pub struct CpuBackend {
    model: Arc<Model>,
    n_threads: usize,
}

impl CpuBackend {
    /// Artifacts will run on pools of `n_threads`.
    pub fn new(model: Arc<Model>, n_threads: usize) -> Self {
        Self { model, n_threads }
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> String {
        "cpu".to_string()
    }

    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn compile(&self, shape: ArtifactShape) -> Result<Arc<dyn Executable>> {
        let n_ctx = self.model.config.n_ctx_train;
        let (rows, window) = (shape.rows(), shape.window());
        // A mixed pass holds many sequences' rows; any other shape is one sequence's.
        let max_rows = match shape {
            ArtifactShape::Mixed { .. } => usize::MAX,
            _ => n_ctx,
        };
        if rows == 0 || rows > max_rows || window == 0 || window > n_ctx {
            return Err(RuntimeError::BadShape {
                shape,
                reason: format!("rows and window must be in 1..={n_ctx}"),
            });
        }
        let scratch =
            Scratch::for_shape(&self.model, rows, shape.outputs(), window, self.n_threads);
        Ok(Arc::new(CpuExecutable {
            model: Arc::clone(&self.model),
            shape,
            bytes: scratch.reserved_bytes(),
            isa: isa::active().name(),
            scratch: Mutex::new(scratch),
        }))
    }

    fn runs_mixed_passes(&self) -> bool {
        true
    }
}

struct CpuExecutable {
    model: Arc<Model>,
    shape: ArtifactShape,
    bytes: usize,
    isa: &'static str,
    /// One run at a time per artifact; sessions sharing it take turns.
    scratch: Mutex<Scratch>,
}

impl Executable for CpuExecutable {
    fn shape(&self) -> ArtifactShape {
        self.shape
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn executing_device(&self) -> String {
        format!("cpu ({})", self.isa)
    }

    fn run(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        check_fits(self.shape, segments)?;
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.model
            .forward_into(pool, segments, &mut scratch, LogitsFor::Last)?;
        scratch.swap_logits(logits);
        Ok(())
    }
}

/// Checks that `segments` are what `shape` was compiled for.
pub fn check_fits(shape: ArtifactShape, segments: &[Segment<'_>]) -> Result<()> {
    let bad = |reason: String| Err(RuntimeError::BadShape { shape, reason });
    let window = shape.window();
    if let ArtifactShape::Mixed {
        rows,
        batch,
        logits,
        ..
    } = shape
    {
        let n_rows: usize = segments.iter().map(|s| s.tokens.len()).sum();
        let n_logits: usize = segments.iter().map(|s| s.n_logits).sum();
        if segments.is_empty()
            || segments.len() > batch
            || n_rows > rows
            || n_logits > logits
            || segments.iter().any(|s| s.n_padding > 0)
        {
            return bad(format!(
                "{} segments of {n_rows} tokens asking {n_logits} rows of logits (padding is for static shapes)",
                segments.len()
            ));
        }
        if let Some(seg) = segments.iter().find(|s| s.kv.capacity() > window) {
            return bad(format!("a cache of {} positions", seg.kv.capacity()));
        }
        return Ok(());
    }
    if let Some(seg) = segments.iter().find(|s| s.kv.capacity() != window) {
        return bad(format!("a cache of {} positions", seg.kv.capacity()));
    }
    if segments.iter().any(|s| s.n_logits != 1) {
        return bad("a static shape returns one row of logits per segment".to_string());
    }
    match shape {
        ArtifactShape::Prefill { chunk, .. } => {
            if segments.len() != 1 || segments[0].tokens.len() != chunk {
                return bad(format!(
                    "{} segments of {:?} tokens",
                    segments.len(),
                    segments.iter().map(|s| s.tokens.len()).collect::<Vec<_>>()
                ));
            }
        }
        ArtifactShape::Decode { batch, .. } => {
            if segments.is_empty()
                || segments.len() > batch
                || segments.iter().any(|s| s.tokens.len() != 1)
            {
                return bad(format!("{} segments", segments.len()));
            }
        }
        ArtifactShape::Mixed { .. } => unreachable!("checked above"),
    }
    Ok(())
}

/// Runs `tokens` into `kv` through a prefill artifact, `chunk` tokens at a time, the last
/// chunk padded. Returns the logits after the last token.
pub fn prefill_chunked(
    executable: &dyn Executable,
    pool: &ThreadPool,
    tokens: &[u32],
    kv: &mut KvCache,
    logits: &mut Vec<f32>,
) -> Result<()> {
    prefill_stepping(&[executable], pool, tokens, kv, logits)
}

/// [`prefill_chunked`] over prefill artifacts of one chunk and ascending windows, the
/// last of the cache's own window: each chunk runs on the smallest window that holds the
/// cache after it, so the early chunks of a long prompt attend a small window rather than
/// the whole of the cache's. A reserved cache moves its bound down and back up without
/// copying; a compact one (whose move would copy) runs every chunk on its own window.
pub fn prefill_stepping(
    rungs: &[&dyn Executable],
    pool: &ThreadPool,
    tokens: &[u32],
    kv: &mut KvCache,
    logits: &mut Vec<f32>,
) -> Result<()> {
    let Some(&own) = rungs.last() else {
        return Err(RuntimeError::BadLadder(
            "no prefill artifact to run the prompt on".to_string(),
        ));
    };
    let ArtifactShape::Prefill { chunk, .. } = own.shape() else {
        return Err(RuntimeError::BadShape {
            shape: own.shape(),
            reason: "a decode artifact cannot prefill".to_string(),
        });
    };
    if let Some(other) = rungs.iter().find(|r| {
        !matches!(r.shape(), ArtifactShape::Prefill { chunk: c, window } if c == chunk && window <= own.shape().window())
    }) {
        return Err(RuntimeError::BadShape {
            shape: other.shape(),
            reason: format!("a rung below prefill chunks of {chunk} over {} positions", own.shape().window()),
        });
    }
    if tokens.is_empty() {
        return Err(RuntimeError::EmptyPrompt);
    }
    let (start_len, bound) = (kv.len(), kv.capacity());
    let mut padded = vec![0u32; chunk];
    let mut result = Ok(());
    for piece in tokens.chunks(chunk) {
        let needed = kv.len() + chunk;
        let rung = rungs
            .iter()
            .find(|r| {
                let w = r.shape().window();
                w == bound || (!kv.is_compact() && w >= needed)
            })
            .copied()
            .unwrap_or(own);
        if let Err(e) = kv.grow_to(rung.shape().window()) {
            result = Err(RuntimeError::from(e));
            break;
        }
        padded[..piece.len()].copy_from_slice(piece);
        // Padding repeats the last real token: any valid id works, it is never attended.
        let last = piece[piece.len() - 1];
        padded[piece.len()..].fill(last);
        let mut segments = [Segment {
            tokens: &padded,
            n_padding: chunk - piece.len(),
            kv: &mut *kv,
            n_logits: 1,
            pooled: None,
        }];
        if let Err(e) = rung.run(pool, &mut segments, logits) {
            result = Err(e);
            break;
        }
    }
    // The cache's own window again: a bound moved within the reserve moves back.
    kv.grow_to(bound).map_err(RuntimeError::from)?;
    if result.is_err() {
        // All or nothing: earlier chunks' positions leave with the failure.
        kv.truncate(start_len);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::executed_as_requested;

    #[test]
    fn executed_devices_match_what_was_asked() {
        assert!(executed_as_requested("cpu", "cpu (avx2)"));
        assert!(executed_as_requested("ov:GPU", "GPU.0"));
        assert!(!executed_as_requested("ov:NPU", "CPU"));
        assert!(!executed_as_requested("ov:NPU", "NPU,CPU"));
        assert!(executed_as_requested("cpu+ov:CPU", "cpu (avx2) + CPU"));
        assert!(!executed_as_requested("cpu+ov:NPU", "cpu (avx2) + CPU"));
        assert!(!executed_as_requested("cpu+ov:CPU", "cpu (avx2)"));
    }
}
