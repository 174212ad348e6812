//! [`OvBackend`]: artifacts compiled by OpenVINO for one of its devices.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use pyramid_kernels::ThreadPool;
use pyramid_model::{KvType, Model, Segment};
use pyramid_runtime::artifact::check_fits;
use pyramid_runtime::{ArtifactShape, Backend, Executable, RuntimeError};

use crate::graph::{
    rope_input_shape, write_rope_row, LocalPast, ModelGraph, OutlierChannels, WeightFormat, MASKED,
};
use crate::ov::{CompiledModel, Core, Element, InferRequest, Tensor};
use crate::store::{write_once, ModelStore, StoreKey};
use crate::{OvError, Result};

/// Compile options: device properties passed to every compile.
#[derive(Debug, Clone, Default)]
pub struct OvOptions {
    pub properties: Vec<(String, String)>,
    /// How a decode artifact lays out several sequences.
    pub decode_layout: DecodeLayout,
    /// Where compiled artifacts are kept across starts (see [`crate::store`]); unused
    /// when the properties name their own `CACHE_DIR` (an empty one turns caching off).
    pub store: Option<StoreKey>,
    /// Input channels the integer products leave to f32 ones (see [`OutlierChannels`]).
    pub outliers: OutlierChannels,
}

/// The option key that picks the [`DecodeLayout`]; pyramid's own, never passed to
/// OpenVINO.
pub const DECODE_LAYOUT_KEY: &str = "PYRAMID_DECODE_LAYOUT";

/// How a decode artifact for `batch` sequences holds them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DecodeLayout {
    /// A batch axis: `batch` sequences of one row, each with its own `window` cache.
    #[default]
    Batched,
    /// One sequence of `batch` rows over the `batch` caches side by side (`batch ×
    /// window` positions) with a block-diagonal mask: each row sees only its own cache
    /// and itself. For devices whose compilers reject a batch axis (NPUs); attention
    /// costs `batch` times more.
    Packed,
}

impl DecodeLayout {
    /// What `device` runs best: NPUs take no batch axis.
    fn default_for(device: &str) -> Self {
        if device_base(device) == "NPU" {
            DecodeLayout::Packed
        } else {
            DecodeLayout::Batched
        }
    }

    fn parse(value: &str) -> Result<Self> {
        match value.to_ascii_lowercase().as_str() {
            "batched" => Ok(DecodeLayout::Batched),
            "packed" => Ok(DecodeLayout::Packed),
            _ => Err(OvError::BadOption(format!(
                "{DECODE_LAYOUT_KEY}={value} (expected batched or packed)"
            ))),
        }
    }
}

impl OvOptions {
    /// The defaults for `device`, then `overrides` (`KEY=VALUE`) on top.
    ///
    /// On CPU the inference precision is f32: the plugin's default on CPUs with AVX-512
    /// BF16 is bf16, which would make its tokens differ from the f32 reference for
    /// reasons that have nothing to do with the graph.
    pub fn for_device(
        device: &str,
        n_threads: Option<usize>,
        overrides: &[String],
    ) -> Result<Self> {
        let mut properties = vec![("PERFORMANCE_HINT".to_string(), "LATENCY".to_string())];
        if device_base(device) == "CPU" {
            properties.push(("INFERENCE_PRECISION_HINT".into(), "f32".into()));
            if let Some(n) = n_threads {
                properties.push(("INFERENCE_NUM_THREADS".into(), n.to_string()));
            }
        }
        let mut decode_layout = DecodeLayout::default_for(device);
        for kv in overrides {
            let (k, v) = kv
                .split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .ok_or_else(|| OvError::BadOption(kv.clone()))?;
            let (k, v) = (k.trim().to_string(), v.trim().to_string());
            if k == DECODE_LAYOUT_KEY {
                decode_layout = DecodeLayout::parse(&v)?;
                continue;
            }
            properties.retain(|(key, _)| *key != k);
            properties.push((k, v));
        }
        Ok(Self {
            properties,
            decode_layout,
            store: None,
            outliers: OutlierChannels::default(),
        })
    }

    /// Whether a compile property `key` is set (by default or by the user).
    fn has(&self, key: &str) -> bool {
        self.properties.iter().any(|(k, _)| k == key)
    }

    /// These options with compiled artifacts kept in `key`'s store.
    pub fn with_store(mut self, key: StoreKey) -> Self {
        self.store = Some(key);
        self
    }

    /// These options with `outliers` kept out of integer products.
    pub fn with_outliers(mut self, outliers: OutlierChannels) -> Self {
        self.outliers = outliers;
        self
    }
}

/// Names a directory every compiled artifact's IR is written to, as `<shape>.xml` beside
/// the one `weights.bin` all of them read (to look inside a graph with OpenVINO's own
/// tools, or to benchmark it with `benchmark_app`), and after its first run the nodes the
/// compiled graph executed, `<shape>.executed.txt` (compiled with `PERF_COUNT=YES`).
pub const DUMP_ENV: &str = "PYRAMID_OV_DUMP";

fn dump_ir(dir: &Path, shape: ArtifactShape, xml: &str, weights: &[u8]) -> std::io::Result<()> {
    write_once(&dir.join("weights.bin"), weights)?;
    let name = shape.to_string().replace(' ', "_");
    std::fs::write(dir.join(format!("{name}.xml")), xml)
}

/// Writes `<shape>.executed.txt`: how many nodes one run of the compiled graph executed,
/// and per node type their count and time, most first.
fn write_profile(
    dir: &Path,
    shape: ArtifactShape,
    nodes: &[(String, String, i64)],
) -> std::io::Result<()> {
    let mut by_type: Vec<(String, usize, i64)> = Vec::new();
    for (kind, _, micros) in nodes {
        match by_type.iter_mut().find(|t| &t.0 == kind) {
            Some(t) => {
                t.1 += 1;
                t.2 += micros;
            }
            None => by_type.push((kind.clone(), 1, *micros)),
        }
    }
    by_type.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let total: i64 = nodes.iter().map(|n| n.2).sum();
    let mut text = format!(
        "{shape}: {} nodes executed in {total} µs\nnode type\tcount\tµs\n",
        nodes.len()
    );
    for (kind, count, micros) in by_type {
        text.push_str(&format!("{kind}\t{count}\t{micros}\n"));
    }
    let name = shape.to_string().replace(' ', "_");
    std::fs::write(dir.join(format!("{name}.executed.txt")), text)
}

/// The CPU plugin's property for quantising activations on the fly.
const DYNAMIC_QUANTIZATION: &str = "DYNAMIC_QUANTIZATION_GROUP_SIZE";

/// `GPU.0` → `GPU`.
fn device_base(device: &str) -> &str {
    device.split('.').next().unwrap_or(device)
}

/// What every artifact of one backend shares: the runtime and the model's constants,
/// which OpenVINO reads in place for as long as any compiled model lives.
pub(crate) struct Shared {
    pub core: Core,
    pub graph: ModelGraph,
    /// Views `graph.blob.bytes`; declared after nothing that outlives it.
    pub weights: Tensor,
}

pub struct OvBackend {
    model: Arc<Model>,
    device: String,
    options: OvOptions,
    shared: Arc<Shared>,
    /// Where compiled artifacts are kept across starts, when they are.
    store: Option<ModelStore>,
    /// Why the store asked for could not be used (artifacts are then compiled each start).
    store_problem: Option<OvError>,
}

impl OvBackend {
    /// A backend for OpenVINO device `device` (`CPU`, `GPU`, `NPU`, `GPU.1`, …), building
    /// its graphs from the f32 `model` with weights stored as `format`.
    pub fn new(
        model: Arc<Model>,
        device: &str,
        format: WeightFormat,
        options: OvOptions,
    ) -> Result<Self> {
        let core = Core::new()?;
        let available = core.available_devices()?;
        let present = available
            .iter()
            .any(|d| d == device || (device_base(d) == device && !device.contains('.')));
        if !present {
            return Err(OvError::DeviceNotPresent {
                device: format!("ov:{device}"),
                available: available.iter().map(|d| format!("ov:{d}")).collect(),
            });
        }
        let graph = ModelGraph::build(&model, format, &options.outliers)?;
        let mut options = options;
        // The CPU plugin quantises the activations of compressed-weight products to INT8
        // at run time, in groups. Without the native model's outlier channels kept apart
        // that lost SmolLM2 five of its six reference prompts, so it is off; with them, in
        // groups of 32, both SmolLM2 and Qwen2.5-0.5B keep every prompt the native INT8
        // path keeps, and prefill runs 1.2–1.6× and decode 1.2–1.45× faster
        // (docs/BENCHMARKS.md). A user's own setting wins.
        if device_base(device) == "CPU"
            && format == WeightFormat::Int8
            && !options.has(DYNAMIC_QUANTIZATION)
        {
            let group = if options.outliers.is_empty() {
                "0"
            } else {
                "32"
            };
            options
                .properties
                .push((DYNAMIC_QUANTIZATION.into(), group.into()));
        }
        let (mut store, mut store_problem) = (None, None);
        let own_cache_dir = options.has("CACHE_DIR");
        if let Some(key) = options.store.as_ref().filter(|_| !own_cache_dir) {
            let version = &crate::library::load()?.version;
            match ModelStore::open(key, version, format, &graph.blob.bytes) {
                Ok(opened) => {
                    let properties = opened.properties(&core, device);
                    options.properties.extend(properties);
                    store = Some(opened);
                }
                Err(e) => store_problem = Some(e),
            }
        }
        let bytes = &graph.blob.bytes;
        // SAFETY: the blob is never modified after this and lives in `Shared` beside the
        // tensor (and so beside every model read from it).
        let weights = unsafe {
            Tensor::over(
                Element::U8,
                &[bytes.len()],
                bytes.as_ptr().cast_mut().cast(),
            )?
        };
        Ok(Self {
            model,
            device: device.to_string(),
            options,
            shared: Arc::new(Shared {
                core,
                graph,
                weights,
            }),
            store,
            store_problem,
        })
    }

    /// Why compiled artifacts are not kept across starts although a store was asked for.
    pub fn store_problem(&self) -> Option<&OvError> {
        self.store_problem.as_ref()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The OpenVINO device name (`CPU`, `GPU.0`, …) and the compile options.
    pub(crate) fn device_name(&self) -> &str {
        &self.device
    }

    pub(crate) fn compile_properties(&self) -> &[(String, String)] {
        &self.options.properties
    }

    /// Bytes of the model's constants as the graphs hold them.
    pub fn weight_bytes(&self) -> usize {
        self.shared.graph.blob.bytes.len()
    }

    fn compile_shape(&self, shape: ArtifactShape) -> Result<OvExecutable> {
        let cfg = &self.model.config;
        let packed = matches!(shape, ArtifactShape::Decode { batch, .. } if batch > 1)
            && self.options.decode_layout == DecodeLayout::Packed;
        let (seqs, rows) = match shape {
            ArtifactShape::Prefill { chunk, .. } => (1, chunk),
            ArtifactShape::Decode { batch, .. } if packed => (1, batch),
            ArtifactShape::Decode { batch, .. } => (batch, 1),
            ArtifactShape::Mixed { .. } => {
                return Err(OvError::Compile {
                    shape,
                    device: self.device.clone(),
                    message: "OpenVINO graphs have static shapes: no mixed passes".to_string(),
                })
            }
        };
        let window = shape.window();
        if rows == 0 || window == 0 || window > cfg.n_ctx_train || rows > cfg.n_ctx_train {
            return Err(OvError::Compile {
                shape,
                device: self.device.clone(),
                message: format!("rows and window must be in 1..={}", cfg.n_ctx_train),
            });
        }
        let compile_error = |e: OvError| OvError::Compile {
            shape,
            device: self.device.clone(),
            message: match e {
                OvError::Call { message, .. } => message,
                other => other.to_string(),
            },
        };
        // A sliding-window layer's first row reaches `size - 1` rows back; binding only
        // those pays once the artifact's window is larger.
        let local_past = match cfg.sliding_window {
            Some(w) if w.size.saturating_sub(1).max(1) < window => {
                let per_sequence = w.size.saturating_sub(1).max(1);
                LocalPast::Windowed(if packed {
                    rows * per_sequence
                } else {
                    per_sequence
                })
            }
            _ => LocalPast::Whole,
        };
        let layout = GraphLayout {
            seqs,
            rows,
            // Packed: the sequences' caches side by side; every row keeps its logits.
            past: if packed { rows * window } else { window },
            outputs: if packed { rows } else { 1 },
            packed,
            local_past,
        };
        let resident_before = resident_bytes();
        let xml =
            self.shared
                .graph
                .emit(seqs, rows, layout.past, layout.outputs, layout.local_past);
        let dump = std::env::var_os(DUMP_ENV).map(PathBuf::from);
        let mut properties = self.options.properties.clone();
        if let Some(dir) = &dump {
            dump_ir(dir, shape, &xml, &self.shared.graph.blob.bytes).map_err(|e| {
                OvError::Dump {
                    dir: dir.display().to_string(),
                    message: e.to_string(),
                }
            })?;
            // The first run's executed nodes are written beside the IR.
            properties.push(("PERF_COUNT".into(), "YES".into()));
        }
        let model = self
            .shared
            .core
            .read_model(&xml, &self.shared.weights)
            .map_err(compile_error)?;
        let compiled = self
            .shared
            .core
            .compile(&model, &self.device, &properties)
            .map_err(compile_error)?;
        // Plugins answer `LOADED_FROM_CACHE` once `CACHE_DIR` is set; without it, it is
        // a compile.
        let loaded_from_store = compiled
            .property("LOADED_FROM_CACHE")
            .is_ok_and(|v| matches!(v.trim(), "YES" | "true" | "TRUE" | "1"));
        if let Some(store) = self.store.as_ref().filter(|_| !loaded_from_store) {
            store.trim();
        }
        let executed_on = compiled
            .property("EXECUTION_DEVICES")
            .map(|d| d.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string());
        let request = compiled.infer_request().map_err(compile_error)?;
        let io = Io::new(cfg, &layout);
        let device_bytes = resident_bytes()
            .zip(resident_before)
            .map_or(0, |(after, before)| after.saturating_sub(before));
        Ok(OvExecutable {
            bytes: io.bytes() + device_bytes,
            shape,
            layout,
            window,
            executed_on,
            loaded_from_store,
            inv_freq: cfg.rope_frequencies(false),
            inv_freq_local: cfg.rope_frequencies(true),
            rope_scale: cfg.rope_scale,
            state: Mutex::new(RunState {
                request,
                io,
                profiled: false,
                bound: false,
            }),
            dump,
            _compiled: compiled,
            shared: Arc::clone(&self.shared),
        })
    }
}

impl Backend for OvBackend {
    fn device(&self) -> String {
        format!("ov:{}", self.device)
    }

    fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn compile(&self, shape: ArtifactShape) -> pyramid_runtime::Result<Arc<dyn Executable>> {
        match self.compile_shape(shape) {
            Ok(exe) => Ok(Arc::new(exe)),
            Err(e) => Err(RuntimeError::Device(e.to_string())),
        }
    }
}

/// RoPE angles and the attention mask of one kind of layer.
struct Positional {
    cos: Vec<f32>,
    sin: Vec<f32>,
    mask: Vec<f32>,
    /// Past columns each graph sequence attends to (the mask's width less the new rows).
    past_cols: usize,
    /// The cache row of each graph sequence's first past column (each packed row's)
    /// when the columns are only the rows the window reaches ([`LocalPast::Windowed`]);
    /// empty when they are the whole past.
    view_starts: Vec<usize>,
}

impl Positional {
    /// `rope_columns` values of cos and of sin per row.
    fn new(layout: &GraphLayout, rope_columns: usize, past: LocalPast) -> Self {
        let (seqs, rows) = (layout.seqs, layout.rows);
        let (past_cols, views) = match past {
            LocalPast::Whole => (layout.past, 0),
            LocalPast::Windowed(n) if layout.packed => (n, rows),
            LocalPast::Windowed(n) => (n, seqs),
        };
        Self {
            cos: vec![1.0; seqs * rows * rope_columns],
            sin: vec![0.0; seqs * rows * rope_columns],
            mask: vec![MASKED; seqs * rows * (past_cols + rows)],
            past_cols,
            view_starts: vec![0; views],
        }
    }

    /// Bytes of the buffers.
    fn bytes(&self) -> usize {
        (self.cos.len() + self.sin.len() + self.mask.len()) * 4 + self.view_starts.len() * 8
    }
}

/// Host buffers behind the graph's small inputs, bound once.
struct Io {
    ids: Vec<i64>,
    /// For the layers attending to every position.
    global: Positional,
    /// For sliding-window layers, where the model has them.
    local: Option<Positional>,
    last: Vec<i64>,
    /// Past keys and values when several sequences share a run (one sequence binds its
    /// cache directly): `[n_layer * n_head_kv][seqs, 1, past columns, head_dim]`, one
    /// buffer per (layer, KV head) input.
    staged_k: Vec<Vec<f32>>,
    staged_v: Vec<Vec<f32>>,
    tensors: Vec<(String, Tensor)>,
}

impl Io {
    fn new(cfg: &pyramid_model::ModelConfig, layout: &GraphLayout) -> Self {
        let (seqs, rows) = (layout.seqs, layout.rows);
        let rope_columns = rope_input_shape(cfg.arch.rope_style(), 1, 1, cfg.head_dim)
            .iter()
            .product();
        let staged = || {
            if seqs > 1 || layout.packed {
                (0..cfg.n_layer * cfg.n_head_kv)
                    .map(|i| {
                        let cols = layout.past_cols(cfg, i / cfg.n_head_kv);
                        vec![0.0; seqs * cols * cfg.head_dim]
                    })
                    .collect()
            } else {
                Vec::new()
            }
        };
        Self {
            ids: vec![0; seqs * rows],
            global: Positional::new(layout, rope_columns, LocalPast::Whole),
            local: cfg
                .sliding_window
                .map(|_| Positional::new(layout, rope_columns, layout.local_past)),
            last: vec![0; seqs * layout.outputs],
            staged_k: staged(),
            staged_v: staged(),
            tensors: Vec::new(),
        }
    }

    fn bytes(&self) -> usize {
        let staged: usize = self
            .staged_k
            .iter()
            .chain(&self.staged_v)
            .map(Vec::len)
            .sum();
        let positional = self.global.bytes() + self.local.as_ref().map_or(0, Positional::bytes);
        (self.ids.len() + self.last.len()) * 8 + staged * 4 + positional
    }
}

struct RunState {
    request: InferRequest,
    io: Io,
    /// Whether the executed nodes were written to the dump directory (once, after the
    /// first run).
    profiled: bool,
    /// Whether the `Io` buffers are bound to the request (done on the first run, once
    /// the buffers are in their final place).
    bound: bool,
}

/// How an artifact's graph holds its sequences.
struct GraphLayout {
    /// Sequences on the batch axis, and new rows of each.
    seqs: usize,
    rows: usize,
    /// Past positions each graph sequence attends to: the window, or (packed) the
    /// windows of all its rows' sequences side by side.
    past: usize,
    /// Rows per graph sequence whose logits are returned.
    outputs: usize,
    /// Each row is its own sequence (see [`DecodeLayout::Packed`]).
    packed: bool,
    /// What the sliding-window layers read of the past.
    local_past: LocalPast,
}

impl GraphLayout {
    /// Past columns of `layer`'s inputs per graph sequence.
    fn past_cols(&self, cfg: &pyramid_model::ModelConfig, layer: usize) -> usize {
        match self.local_past {
            LocalPast::Windowed(n) if cfg.layer_window(layer).is_some() => n,
            _ => self.past,
        }
    }
}

pub struct OvExecutable {
    shape: ArtifactShape,
    /// The host buffers plus what compiling added to this process's resident memory:
    /// plugins keep their own (repacked) copy of the constants per compiled model, which
    /// the C API does not report. Approximate when two compiles overlap.
    bytes: usize,
    layout: GraphLayout,
    /// Positions of each sequence's cache.
    window: usize,
    executed_on: String,
    /// Imported from OpenVINO's cache directory rather than compiled.
    loaded_from_store: bool,
    inv_freq: Vec<f32>,
    /// Sliding-window layers' frequencies (empty without such layers).
    inv_freq_local: Vec<f32>,
    /// What cos and sin are multiplied by (see `ModelConfig::rope_scale`).
    rope_scale: f32,
    state: Mutex<RunState>,
    /// `PYRAMID_OV_DUMP`'s directory, where the first run writes what it executed.
    dump: Option<PathBuf>,
    /// Kept for as long as its request runs.
    _compiled: CompiledModel,
    /// Last: the compiled model and request above read its constants.
    shared: Arc<Shared>,
}

impl OvExecutable {
    fn rope_shape(&self) -> Vec<usize> {
        let cfg = &self.shared.graph.config;
        rope_input_shape(
            cfg.arch.rope_style(),
            self.layout.seqs,
            self.layout.rows,
            cfg.head_dim,
        )
    }

    fn bind_io(&self, state: &mut RunState) -> Result<()> {
        let cfg = &self.shared.graph.config;
        let (s, r) = (self.layout.seqs, self.layout.rows);
        let io = &mut state.io;
        // SAFETY: each buffer has exactly the tensor's element count, lives in `io` for
        // the executable's lifetime and is never reallocated.
        unsafe {
            let mut bind =
                |name: String, element, dims: &[usize], ptr: *mut c_void| -> Result<()> {
                    let t = Tensor::over(element, dims, ptr)?;
                    state.request.set_tensor(&name, &t)?;
                    io.tensors.push((name, t));
                    Ok(())
                };
            bind(
                "input_ids".into(),
                Element::I64,
                &[s, r],
                io.ids.as_mut_ptr().cast(),
            )?;
            let rope = self.rope_shape();
            let kinds = [("", Some(&mut io.global)), ("_local", io.local.as_mut())];
            for (suffix, positional) in kinds {
                let Some(p) = positional else { continue };
                bind(
                    format!("rope_cos{suffix}"),
                    Element::F32,
                    &rope,
                    p.cos.as_mut_ptr().cast(),
                )?;
                bind(
                    format!("rope_sin{suffix}"),
                    Element::F32,
                    &rope,
                    p.sin.as_mut_ptr().cast(),
                )?;
                bind(
                    format!("attention_mask{suffix}"),
                    Element::F32,
                    &[s, 1, 1, r, p.past_cols + r],
                    p.mask.as_mut_ptr().cast(),
                )?;
            }
            bind(
                "last_rows".into(),
                Element::I64,
                &[s, self.layout.outputs],
                io.last.as_mut_ptr().cast(),
            )?;
            for (i, (k, v)) in io.staged_k.iter_mut().zip(&mut io.staged_v).enumerate() {
                let (layer, head) = (i / cfg.n_head_kv, i % cfg.n_head_kv);
                let kv_shape = [s, 1, self.layout.past_cols(cfg, layer), cfg.head_dim];
                let (k, v) = (k.as_mut_ptr().cast(), v.as_mut_ptr().cast());
                bind(format!("past_k_{layer}_{head}"), Element::F32, &kv_shape, k)?;
                bind(format!("past_v_{layer}_{head}"), Element::F32, &kv_shape, v)?;
            }
        }
        state.bound = true;
        Ok(())
    }

    /// Fills the small inputs for `segments` (sequence slots beyond them run a dummy
    /// token whose results are dropped).
    fn fill_inputs(&self, io: &mut Io, segments: &[Segment<'_>]) {
        let GraphLayout { seqs, rows, .. } = self.layout;
        if self.layout.packed {
            // Row b is sequence b.
            for b in 0..rows {
                io.ids[b] = segments.get(b).map_or(0, |seg| i64::from(seg.tokens[0]));
                io.last[b] = b as i64;
            }
        } else {
            for s in 0..seqs {
                let n_real = segments.get(s).map_or(1, |seg| seg.n_real());
                for t in 0..rows {
                    io.ids[s * rows + t] =
                        segments.get(s).map_or(0, |seg| i64::from(seg.tokens[t]));
                }
                io.last[s] = (n_real - 1) as i64;
            }
        }
        self.fill_positions(&mut io.global, &self.inv_freq, None, segments);
        if let (Some(local), Some(w)) = (&mut io.local, self.shared.graph.config.sliding_window) {
            self.fill_positions(local, &self.inv_freq_local, Some(w.size), segments);
        }
    }

    /// RoPE angles and the additive mask for `segments`, each row seeing the positions up
    /// to its own, and with `window` only the last `window` of them; where the past
    /// columns are only the rows the window reaches, the cache row they start at.
    fn fill_positions(
        &self,
        io: &mut Positional,
        inv_freq: &[f32],
        window: Option<usize>,
        segments: &[Segment<'_>],
    ) {
        let GraphLayout { seqs, rows, .. } = self.layout;
        let past = io.past_cols;
        let viewed = !io.view_starts.is_empty();
        // Past columns of one sequence: all of a packed row's block, or its viewed rows.
        let block = match (self.layout.packed, viewed) {
            (true, true) => past / rows,
            (true, false) => self.window,
            (false, _) => past,
        };
        let rope_columns = io.cos.len() / (seqs * rows);
        let width = past + rows;
        // The first position a row at `pos` sees.
        let first_seen = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
        io.mask.fill(MASKED);
        let mut rope = |row: usize, pos: usize| {
            let at = row * rope_columns..(row + 1) * rope_columns;
            write_rope_row(
                &mut io.cos[at.clone()],
                &mut io.sin[at],
                inv_freq,
                pos,
                self.rope_scale,
            );
        };
        // A viewed sequence's columns are its cache rows `first..first + block`, which
        // lie inside its window: `first + block` is at most its length, or `block` when
        // the window reaches row 0, and `block` is less than the artifact's window.
        if self.layout.packed {
            // Row b is sequence b: its columns are block b, its own new key column
            // past + b; nothing else is visible to it.
            for b in 0..rows {
                let start = segments.get(b).map_or(0, |seg| seg.kv.len());
                let lo = first_seen(start).min(start);
                let first = if viewed { lo } else { 0 };
                if viewed {
                    io.view_starts[b] = first;
                }
                rope(b, start);
                let mask = &mut io.mask[b * width..(b + 1) * width];
                let own = b * block;
                mask[own + lo - first..own + start - first].fill(0.0);
                mask[past + b] = 0.0;
            }
            return;
        }
        for s in 0..seqs {
            let start = segments.get(s).map_or(0, |seg| seg.kv.len());
            let first = if viewed {
                first_seen(start).min(start)
            } else {
                0
            };
            if viewed {
                io.view_starts[s] = first;
            }
            for t in 0..rows {
                let row = s * rows + t;
                let pos = start + t;
                rope(row, pos);
                let lo = first_seen(pos);
                let mask = &mut io.mask[row * width..(row + 1) * width];
                mask[lo.min(start) - first..start - first].fill(0.0);
                mask[past + lo.saturating_sub(start)..=past + t].fill(0.0);
            }
        }
    }

    /// Past columns of `layer` per sequence (a packed row is a sequence).
    fn block_cols(&self, layer: usize) -> usize {
        let cols = self.layout.past_cols(&self.shared.graph.config, layer);
        cols / if self.layout.packed {
            self.layout.rows
        } else {
            1
        }
    }

    /// The cache row sequence `s`'s columns of `layer` start at: where its window view
    /// starts, or 0 when they are the whole window.
    fn view_start(&self, io: &Io, layer: usize, s: usize) -> usize {
        let windowed = self.shared.graph.config.layer_window(layer).is_some();
        match &io.local {
            Some(p) if windowed && !p.view_starts.is_empty() => p.view_starts[s],
            _ => 0,
        }
    }

    /// Copies the segments' past keys and values into the staging buffers.
    fn stage(&self, io: &mut Io, segments: &[Segment<'_>]) {
        let cfg = &self.shared.graph.config;
        let hd = cfg.head_dim;
        for (s, seg) in segments.iter().enumerate() {
            for layer in 0..cfg.n_layer {
                let (first, block) = (self.view_start(io, layer, s), self.block_cols(layer));
                // Packed, only the live rows of a whole window: the rest is masked.
                let n = if self.layout.packed && block == self.window {
                    seg.kv.len()
                } else {
                    block
                };
                let (src, dst) = (first * hd..(first + n) * hd, s * block * hd);
                for head in 0..cfg.n_head_kv {
                    let (k, v) = seg.kv.head_f32(layer, head).expect("checked f32 above");
                    let i = layer * cfg.n_head_kv + head;
                    io.staged_k[i][dst..dst + n * hd].copy_from_slice(&k[src.clone()]);
                    io.staged_v[i][dst..dst + n * hd].copy_from_slice(&v[src.clone()]);
                }
            }
        }
    }

    fn run_segments(&self, segments: &mut [Segment<'_>], logits: &mut Vec<f32>) -> Result<()> {
        let cfg = &self.shared.graph.config;
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = &mut *guard;
        if !state.bound {
            self.bind_io(state)?;
        }
        self.fill_inputs(&mut state.io, segments);
        // One sequence binds its own cache: no copy of the window per step.
        let mut direct = Vec::new();
        if state.io.staged_k.is_empty() {
            for layer in 0..cfg.n_layer {
                let cols = self.layout.past_cols(cfg, layer);
                let first = self.view_start(&state.io, layer, 0);
                let rows = first * cfg.head_dim..(first + cols) * cfg.head_dim;
                let kv_shape = [1, 1, cols, cfg.head_dim];
                for head in 0..cfg.n_head_kv {
                    let (k, v) = segments[0]
                        .kv
                        .head_f32(layer, head)
                        .expect("checked f32 above");
                    for (kind, data) in [("k", &k[rows.clone()]), ("v", &v[rows.clone()])] {
                        // SAFETY: the cache outlives this run (it is borrowed for the
                        // whole call), the view holds exactly the shape's elements, and
                        // OpenVINO only reads inputs.
                        let t = unsafe {
                            Tensor::over(Element::F32, &kv_shape, data.as_ptr().cast_mut().cast())?
                        };
                        state
                            .request
                            .set_tensor(&format!("past_{kind}_{layer}_{head}"), &t)?;
                        direct.push(t);
                    }
                }
            }
        } else {
            self.stage(&mut state.io, segments);
        }
        state.request.infer()?;
        drop(direct);
        if let Some(dir) = &self.dump {
            if !state.profiled {
                state.profiled = true;
                let nodes = state.request.executed_nodes()?;
                write_profile(dir, self.shape, &nodes).map_err(|e| OvError::Dump {
                    dir: dir.display().to_string(),
                    message: e.to_string(),
                })?;
            }
        }

        let out = state.request.tensor("logits")?;
        let n_vocab = cfg.n_vocab;
        logits.clear();
        logits.extend_from_slice(&out.as_f32()?[..segments.len() * n_vocab]);
        let (hd, r) = (cfg.head_dim, self.layout.rows);
        for layer in 0..cfg.n_layer {
            let k = state.request.tensor(&format!("present_k_{layer}"))?;
            let v = state.request.tensor(&format!("present_v_{layer}"))?;
            let (k, v) = (k.as_f32()?, v.as_f32()?);
            for (s, seg) in segments.iter_mut().enumerate() {
                let (start, n) = (seg.kv.len(), seg.n_real());
                for head in 0..cfg.n_head_kv {
                    // New rows are `[seqs, n_head_kv, rows, head_dim]`; packed, sequence
                    // `s` is row `s` of the one graph sequence.
                    let base = if self.layout.packed {
                        (head * r + s) * hd
                    } else {
                        ((s * cfg.n_head_kv + head) * r) * hd
                    };
                    let rows = base..base + n * hd;
                    seg.kv
                        .write_head_rows(layer, head, start, &k[rows.clone()], &v[rows])
                        .map_err(|e| OvError::Unsupported(e.to_string()))?;
                }
            }
        }
        for seg in segments.iter_mut() {
            let n = seg.n_real();
            seg.kv
                .commit(n)
                .map_err(|e| OvError::Unsupported(e.to_string()))?;
        }
        Ok(())
    }
}

impl Executable for OvExecutable {
    fn shape(&self) -> ArtifactShape {
        self.shape
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn executing_device(&self) -> String {
        self.executed_on.clone()
    }

    fn loaded_from_store(&self) -> bool {
        self.loaded_from_store
    }

    fn run(
        &self,
        _pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        logits: &mut Vec<f32>,
    ) -> pyramid_runtime::Result<()> {
        check_fits(self.shape, segments)?;
        if let Some(seg) = segments.iter().find(|s| s.kv.kind() != KvType::F32) {
            return Err(RuntimeError::BadShape {
                shape: self.shape,
                reason: format!(
                    "the OpenVINO backend binds f32 caches, not {} (use --kv f32)",
                    seg.kv.kind()
                ),
            });
        }
        for seg in segments.iter() {
            seg.kv.check_room(seg.n_real())?;
        }
        self.run_segments(segments, logits).map_err(|e| {
            RuntimeError::Device(format!("{} on {}: {e}", self.shape, self.executed_on))
        })
    }
}

/// This process's resident memory (Linux, 4 KiB pages), for what a compile costs in
/// host memory.
fn resident_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
