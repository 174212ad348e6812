//! Prefill on the native kernels and an OpenVINO device at once: a route's prefill stage
//! whose every chunk is split into sub-chunks run layer by layer on both executors
//! ([`crate::schedule`]), while decode runs on a single device.
//!
//! The native executor works on the session's own cache with its own one-thread pool;
//! the OpenVINO executor on a copy of the session's past, with one compiled layer graph
//! ([`ProbeGraph::Layer`]) per decoder block. Each stores its rows and sends them to the
//! other; at the end the session's cache holds every row, as a single-device prefill
//! leaves it. Given each layer's cost on both executors (from a profile), the layers are
//! placed by [`crate::split::plan_layers`]; without, any layer runs on whichever is free.

use std::sync::{Arc, Mutex};

use pyramid_kernels::ThreadPool;
use pyramid_model::{BlockPart, KvCache, KvType, Model, Scratch, Segment};
use pyramid_openvino::{OvBackend, OvProbe, ProbeGraph};
use pyramid_runtime::{check_fits, ArtifactShape, Backend, Executable, RuntimeError};

use crate::schedule::{run_tasks, Assignment, LayerWorker, Rows, ScheduleStats};
use crate::split::{plan_layers, SplitPlan};
use crate::{AffinityError, Result};

/// Sub-chunks each prefill chunk is cut into: enough for the two executors to overlap
/// (one carries a sub-chunk down the layers while the other starts the next), few enough
/// that each stays a matrix-sized job.
pub const SUB_CHUNKS: usize = 4;

/// Prefill on `cpu` and an OpenVINO device together; no other stage.
pub struct HeteroBackend {
    model: Arc<Model>,
    ov: Arc<OvBackend>,
    /// Seconds per prompt row of each layer on `[native, device]`, when known.
    per_row: Option<Vec<[f64; 2]>>,
}

impl HeteroBackend {
    /// `model` runs on the native kernels (one thread); `ov` should be limited to the
    /// other core(s) (`INFERENCE_NUM_THREADS`). Any layer runs on whichever is free.
    pub fn new(model: Arc<Model>, ov: Arc<OvBackend>) -> Self {
        Self {
            model,
            ov,
            per_row: None,
        }
    }

    /// Places the layers by predicting the schedule from each layer's seconds per prompt
    /// row on `[native, device]` (see [`crate::report::AffinityReport::split_costs`]).
    pub fn with_costs(mut self, per_row: Vec<[f64; 2]>) -> Result<Self> {
        let n_layer = self.model.config.n_layer;
        if per_row.len() != n_layer {
            return Err(AffinityError::Plan(format!(
                "costs for {} layers, but the model has {n_layer}",
                per_row.len()
            )));
        }
        self.per_row = Some(per_row);
        Ok(self)
    }

    /// The layers' placement for prefill chunks of `chunk` tokens, and its predicted time;
    /// `None` without costs.
    pub fn plan_for(&self, chunk: usize) -> Option<Result<SplitPlan>> {
        let per_row = self.per_row.as_ref()?;
        let rows = (chunk / SUB_CHUNKS) as f64;
        let task_seconds: Vec<[f64; 2]> = per_row.iter().map(|c| c.map(|s| s * rows)).collect();
        Some(plan_layers(&task_seconds, SUB_CHUNKS))
    }
}

fn device_error(e: AffinityError) -> RuntimeError {
    RuntimeError::Device(e.to_string())
}

impl Backend for HeteroBackend {
    fn device(&self) -> String {
        format!("cpu+{}", self.ov.device())
    }

    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn compile(&self, shape: ArtifactShape) -> pyramid_runtime::Result<Arc<dyn Executable>> {
        Ok(Arc::new(self.compile_split(shape)?))
    }
}

impl HeteroBackend {
    /// [`Backend::compile`], keeping the executable's type (for its schedule's stats).
    pub fn compile_split(&self, shape: ArtifactShape) -> pyramid_runtime::Result<HeteroExecutable> {
        let ArtifactShape::Prefill { chunk, window } = shape else {
            return Err(RuntimeError::BadShape {
                shape,
                reason: format!(
                    "{} runs prefill only: decode runs on one device (--decode-device)",
                    self.device()
                ),
            });
        };
        if !chunk.is_multiple_of(SUB_CHUNKS) || chunk > window {
            return Err(RuntimeError::BadShape {
                shape,
                reason: format!(
                    "a split prefill cuts each chunk into {SUB_CHUNKS} equal sub-chunks: the chunk must be a multiple of {SUB_CHUNKS} and at most the window"
                ),
            });
        }
        let assignment = match self.plan_for(chunk) {
            Some(plan) => plan.map_err(device_error)?.assignment,
            None => vec![Assignment::Either; self.model.config.n_layer],
        };
        let rows = chunk / SUB_CHUNKS;
        let layers = (0..self.model.config.n_layer)
            .map(|layer| {
                self.ov
                    .compile_probe(ProbeGraph::Layer, layer, rows, window)
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| RuntimeError::Device(e.to_string()))?;
        let executed_on = format!(
            "cpu ({}) + {}",
            pyramid_kernels::isa::active().name(),
            layers[0].executing_device()
        );
        Ok(HeteroExecutable {
            shape,
            model: Arc::clone(&self.model),
            pool: ThreadPool::new(1).map_err(|e| RuntimeError::Device(e.to_string()))?,
            executed_on,
            assignment,
            state: Mutex::new(HeteroState {
                layers,
                last: ScheduleStats::default(),
            }),
        })
    }
}

struct HeteroState {
    /// One graph per decoder block.
    layers: Vec<OvProbe>,
    last: ScheduleStats,
}

pub struct HeteroExecutable {
    shape: ArtifactShape,
    model: Arc<Model>,
    /// The native executor's one thread.
    pool: ThreadPool,
    executed_on: String,
    assignment: Vec<Assignment>,
    state: Mutex<HeteroState>,
}

impl HeteroExecutable {
    /// What the two executors did in the last run.
    pub fn last_schedule(&self) -> ScheduleStats {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last
            .clone()
    }
}

/// Sets a cache's live length to `pos` (rows up to it are written).
fn seek(kv: &mut KvCache, pos: usize) -> Result<()> {
    if kv.len() > pos {
        kv.truncate(pos);
    } else {
        kv.commit(pos - kv.len())?;
    }
    Ok(())
}

/// Each KV head's rows `pos..pos + n` of `layer`, `[n_head_kv, n, head_dim]`.
fn read_rows(
    kv: &KvCache,
    layer: usize,
    pos: usize,
    n: usize,
    hd: usize,
    heads: usize,
) -> Result<Rows> {
    let mut rows = Rows::default();
    for head in 0..heads {
        let (k, v) = kv
            .head_f32(layer, head)
            .ok_or_else(|| AffinityError::Plan("a split prefill needs an f32 KV cache".into()))?;
        rows.keys.extend_from_slice(&k[pos * hd..(pos + n) * hd]);
        rows.values.extend_from_slice(&v[pos * hd..(pos + n) * hd]);
    }
    Ok(rows)
}

fn write_rows(kv: &mut KvCache, layer: usize, pos: usize, rows: &Rows, heads: usize) -> Result<()> {
    let per_head = rows.keys.len() / heads;
    for head in 0..heads {
        let span = head * per_head..(head + 1) * per_head;
        kv.write_head_rows(
            layer,
            head,
            pos,
            &rows.keys[span.clone()],
            &rows.values[span],
        )?;
    }
    Ok(())
}

struct NativeWorker<'a> {
    model: &'a Model,
    pool: &'a ThreadPool,
    kv: &'a mut KvCache,
    scratch: Scratch,
    out: Vec<f32>,
}

impl LayerWorker for NativeWorker<'_> {
    fn run(&mut self, layer: usize, pos: usize, hidden: &mut Vec<f32>) -> Result<Rows> {
        let cfg = &self.model.config;
        seek(self.kv, pos)?;
        self.out.resize(hidden.len(), 0.0);
        self.model.run_block(
            self.pool,
            layer,
            BlockPart::Whole,
            hidden,
            &mut self.out,
            self.kv,
            &mut self.scratch,
        )?;
        std::mem::swap(hidden, &mut self.out);
        let n = hidden.len() / cfg.n_embd;
        read_rows(self.kv, layer, pos, n, cfg.head_dim, cfg.n_head_kv)
    }

    fn apply(&mut self, layer: usize, pos: usize, rows: &Rows) -> Result<()> {
        write_rows(self.kv, layer, pos, rows, self.model.config.n_head_kv)
    }
}

struct OvWorker<'a> {
    layers: &'a mut [OvProbe],
    kv: KvCache,
    heads: usize,
}

impl LayerWorker for OvWorker<'_> {
    fn run(&mut self, layer: usize, pos: usize, hidden: &mut Vec<f32>) -> Result<Rows> {
        seek(&mut self.kv, pos)?;
        let probe = &mut self.layers[layer];
        probe.prepare(hidden, &self.kv)?;
        probe.run()?;
        *hidden = probe.output()?;
        let (keys, values) = probe.new_rows()?;
        let rows = Rows { keys, values };
        write_rows(&mut self.kv, layer, pos, &rows, self.heads)?;
        Ok(rows)
    }

    fn apply(&mut self, layer: usize, pos: usize, rows: &Rows) -> Result<()> {
        write_rows(&mut self.kv, layer, pos, rows, self.heads)
    }
}

impl Executable for HeteroExecutable {
    fn shape(&self) -> ArtifactShape {
        self.shape
    }

    fn bytes(&self) -> usize {
        0
    }

    fn executing_device(&self) -> String {
        self.executed_on.clone()
    }

    fn run(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        logits: &mut Vec<f32>,
    ) -> pyramid_runtime::Result<()> {
        check_fits(self.shape, segments)?;
        let [segment] = segments else {
            return Err(RuntimeError::BadShape {
                shape: self.shape,
                reason: "a prefill artifact runs one sequence".into(),
            });
        };
        let cfg = &self.model.config;
        let e = cfg.n_embd;
        let (p0, n_real) = (segment.kv.len(), segment.n_real());
        let rows = self.shape.rows() / SUB_CHUNKS;
        let mut chunks: Vec<Vec<f32>> = segment
            .tokens
            .chunks(rows)
            .map(|tokens| {
                let mut hidden = vec![0.0; tokens.len() * e];
                for (row, &t) in hidden.chunks_exact_mut(e).zip(tokens) {
                    self.model.weights.embed(t as usize, row);
                    row.iter_mut().for_each(|v| *v *= cfg.embedding_scale);
                }
                hidden
            })
            .collect();
        let positions: Vec<usize> = (0..chunks.len()).map(|c| p0 + c * rows).collect();
        // The OpenVINO executor's cache: the session's past, in a cache of the window.
        let mut ov_kv = KvCache::new(cfg, self.shape.window(), KvType::F32);
        segment.kv.copy_prefix_into(p0, &mut ov_kv)?;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = &mut *state;
        let mut native = NativeWorker {
            model: &self.model,
            pool: &self.pool,
            kv: &mut *segment.kv,
            scratch: Scratch::default(),
            out: Vec::new(),
        };
        let mut ov = OvWorker {
            layers: &mut state.layers,
            kv: ov_kv,
            heads: cfg.n_head_kv,
        };
        let stats = run_tasks(
            &self.assignment,
            &positions,
            &mut chunks,
            [&mut native, &mut ov],
        )
        .map_err(device_error)?;
        state.last = stats;
        seek(segment.kv, p0 + n_real).map_err(device_error)?;
        let last = n_real - 1;
        let (chunk, row) = (last / rows, last % rows);
        *logits = self
            .model
            .logits_of(pool, &chunks[chunk][row * e..(row + 1) * e]);
        Ok(())
    }
}
