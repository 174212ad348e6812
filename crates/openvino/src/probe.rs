//! One decoder block, a part of it, or one projection as a graph of its own: what
//! `pyramid affinity` times on an OpenVINO device beside the same computation on the
//! native kernels ([`pyramid_model::Model::run_block`]).
//!
//! A probe runs `rows` new positions of one layer after a cache's live positions, every
//! one of them visible (a sliding-window layer sees its window), over past inputs of
//! `window` columns. Its inputs are filled once ([`OvProbe::prepare`]) and bound, so each
//! [`OvProbe::run`] is one inference and nothing else. The weights are the backend's own
//! constants, compressed as its artifacts' are.

use std::ffi::c_void;
use std::sync::Arc;

use pyramid_model::{BlockPart, KvCache, Projection};

use pyramid_runtime::Backend;

use crate::backend::{OvBackend, Shared};
use crate::graph::{rope_input_shape, write_rope_row, Builder, LayerInputs, MASKED};
use crate::ir::{Et, Graph};
use crate::ov::{CompiledModel, Element, InferRequest, Tensor};
use crate::{OvError, Result};

/// What a probe's graph computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeGraph {
    /// A block, or a part of one (inputs and outputs as [`BlockPart`] says).
    Block(BlockPart),
    /// One projection: `[rows, n_in]` in, `[rows, n_out]` out, with its bias if any.
    Projection(Projection),
    /// A whole block that also returns the rows' keys and values ([`OvProbe::new_rows`]):
    /// one layer of a prefill run layer by layer.
    Layer,
}

/// One host buffer bound as a graph input.
struct Input {
    name: String,
    dims: Vec<usize>,
    data: Vec<f32>,
}

pub struct OvProbe {
    /// Values per input row.
    width: usize,
    layer: usize,
    rows: usize,
    window: usize,
    executed_on: String,
    inputs: Vec<Input>,
    /// Tensors over `inputs`' buffers, bound once they are filled.
    bound: Vec<Tensor>,
    request: InferRequest,
    _compiled: CompiledModel,
    shared: Arc<Shared>,
}

impl OvBackend {
    /// Compiles `graph` of layer `layer` for `rows` new positions over `window` past ones.
    pub fn compile_probe(
        &self,
        graph: ProbeGraph,
        layer: usize,
        rows: usize,
        window: usize,
    ) -> Result<OvProbe> {
        let shared = self.shared();
        let cfg = &shared.graph.config;
        if layer >= cfg.n_layer || rows == 0 || window == 0 {
            return Err(OvError::Unsupported(format!(
                "a probe of layer {layer} (of {}) with {rows} rows over {window} positions",
                cfg.n_layer
            )));
        }
        let width = match graph {
            ProbeGraph::Block(part) => part.input_width(cfg),
            ProbeGraph::Layer => cfg.n_embd,
            ProbeGraph::Projection(p) => p
                .weight(&self.model().weights.layers[layer])
                .ok_or_else(|| {
                    OvError::Unsupported(format!(
                        "the {} projection of layer {layer}, which has routed experts",
                        p.name()
                    ))
                })?
                .n_in(),
        };
        let (xml, inputs) = emit(shared, graph, layer, rows, window, width);
        let model = shared.core.read_model(&xml, &shared.weights)?;
        let compiled =
            shared
                .core
                .compile(&model, self.device_name(), self.compile_properties())?;
        let executed_on = compiled
            .property("EXECUTION_DEVICES")
            .map(|d| d.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string());
        Ok(OvProbe {
            width,
            layer,
            rows,
            window,
            executed_on,
            inputs,
            bound: Vec::new(),
            request: compiled.infer_request()?,
            _compiled: compiled,
            shared: Arc::clone(shared),
        })
    }
}

/// The probe's IR and its inputs, zero-filled (`width`: values per input row).
fn emit(
    shared: &Shared,
    probe: ProbeGraph,
    layer: usize,
    rows: usize,
    window: usize,
    width: usize,
) -> (String, Vec<Input>) {
    let cfg = &shared.graph.config;
    let (hd, kv) = (cfg.head_dim, cfg.n_head_kv);
    let mut g = Graph::new("pyramid_probe", &shared.graph.blob);
    let b = Builder {
        cfg,
        format: shared.graph.format,
    };
    let mut inputs = Vec::new();
    let mut input = |g: &mut Graph<'_>, name: String, dims: Vec<usize>| {
        let port = g.parameter(&name, Et::F32, &dims);
        let data = vec![0.0; dims.iter().product()];
        inputs.push(Input { name, dims, data });
        port
    };
    let out = match probe {
        ProbeGraph::Projection(p) => {
            let x = input(&mut g, "x".into(), vec![1, rows, width]);
            let name = format!("blk.{layer}.{}", p.name());
            b.linear(&mut g, x, &name, p.bias_name(), layer)
        }
        ProbeGraph::Block(BlockPart::WithoutAttention) => {
            let x = input(&mut g, "hidden".into(), vec![1, rows, cfg.n_embd]);
            let down = b.ffn_half(&mut g, x, layer);
            b.binary(&mut g, "Add", x, down)
        }
        ProbeGraph::Block(_) | ProbeGraph::Layer => {
            let (part, with_rows) = match probe {
                ProbeGraph::Block(part) => (part, false),
                _ => (BlockPart::Whole, true),
            };
            let rope = rope_input_shape(cfg.arch.rope_style(), 1, rows, hd);
            let x = match part {
                BlockPart::AttentionCore => None,
                _ => Some(input(&mut g, "hidden".into(), vec![1, rows, cfg.n_embd])),
            };
            let cos = input(&mut g, "rope_cos".into(), rope.clone());
            let sin = input(&mut g, "rope_sin".into(), rope);
            let mask = input(
                &mut g,
                "attention_mask".into(),
                vec![1, 1, 1, rows, window + rows],
            );
            let mut past = |kind: &str| -> Vec<_> {
                (0..kv)
                    .map(|h| input(&mut g, format!("past_{kind}_{h}"), vec![1, 1, window, hd]))
                    .collect()
            };
            let (past_k, past_v) = (past("k"), past("v"));
            let layer_inputs = LayerInputs {
                cos,
                sin,
                mask,
                past: [&past_k, &past_v],
                rows,
            };
            match x {
                None => {
                    let q = input(&mut g, "q".into(), vec![1, rows, cfg.n_head, hd]);
                    let k = input(&mut g, "k".into(), vec![1, rows, kv, hd]);
                    let v = input(&mut g, "v".into(), vec![1, rows, kv, hd]);
                    b.attention_core(&mut g, q, k, v, &layer_inputs).0
                }
                Some(x) => {
                    let (o, [k, v]) = b.attention_half(&mut g, x, layer, &layer_inputs);
                    if with_rows {
                        g.output(k, "present_k");
                        g.output(v, "present_v");
                    }
                    let x = b.binary(&mut g, "Add", x, o);
                    if part == BlockPart::WithoutFfn {
                        x
                    } else {
                        let down = b.ffn_half(&mut g, x, layer);
                        b.binary(&mut g, "Add", x, down)
                    }
                }
            }
        }
    };
    g.output(out, "out");
    (g.to_xml(), inputs)
}

impl OvProbe {
    /// Where OpenVINO says the probe runs.
    pub fn executing_device(&self) -> &str {
        &self.executed_on
    }

    /// Fills the inputs: `input` holds the rows as [`Self::input_width`] says, and
    /// the new rows take positions `kv.len()..`, attending to `kv`'s live positions
    /// (at most the probe's window; an f32 cache).
    pub fn prepare(&mut self, input: &[f32], kv: &KvCache) -> Result<()> {
        let cfg = &self.shared.graph.config;
        let (rows, past, hd) = (self.rows, kv.len(), cfg.head_dim);
        let width = self.input_width();
        if input.len() != rows * width || past > self.window {
            return Err(OvError::Unsupported(format!(
                "probe inputs of {} values over {past} positions: the probe takes {rows} rows \
                 of {width} over at most {}",
                input.len(),
                self.window
            )));
        }
        let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
        let window = cfg.layer_window(self.layer);
        let inv_freq = cfg.rope_frequencies(window.is_some());
        let first_seen = |pos: usize| window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for Input { name, data, .. } in &mut self.inputs {
            match name.as_str() {
                "x" | "hidden" => data.copy_from_slice(input),
                "q" | "k" | "v" => {
                    let (start, len) = match name.as_str() {
                        "q" => (0, qd),
                        "k" => (qd, kvd),
                        _ => (qd + kvd, kvd),
                    };
                    for (r, row) in input.chunks_exact(width).enumerate() {
                        data[r * len..(r + 1) * len].copy_from_slice(&row[start..start + len]);
                    }
                }
                "rope_cos" | "rope_sin" => {
                    let columns = data.len() / rows;
                    let (mut cos, mut sin) = (vec![0.0; columns], vec![0.0; columns]);
                    for r in 0..rows {
                        write_rope_row(&mut cos, &mut sin, &inv_freq, past + r, cfg.rope_scale);
                        let row = if name == "rope_cos" { &cos } else { &sin };
                        data[r * columns..(r + 1) * columns].copy_from_slice(row);
                    }
                }
                "attention_mask" => {
                    let cols = self.window + rows;
                    data.fill(MASKED);
                    for r in 0..rows {
                        let first = first_seen(past + r);
                        let row = &mut data[r * cols..(r + 1) * cols];
                        row[first.min(past)..past].fill(0.0);
                        for j in 0..=r {
                            if past + j >= first {
                                row[self.window + j] = 0.0;
                            }
                        }
                    }
                }
                _ => {
                    // past_k_{head} / past_v_{head}: the live rows, zeros after them.
                    let (kind, head) = name["past_".len()..].split_at(1);
                    let head: usize = head[1..].parse().expect("probe input names are ours");
                    let (keys, values) = kv.head_f32(self.layer, head).ok_or_else(|| {
                        OvError::Unsupported("probes read an f32 KV cache".into())
                    })?;
                    let src = if kind == "k" { keys } else { values };
                    data.fill(0.0);
                    data[..past * hd].copy_from_slice(&src[..past * hd]);
                }
            }
        }
        if self.bound.is_empty() {
            for input in &mut self.inputs {
                // SAFETY: the buffer holds the dims' product of f32 values and lives,
                // never reallocated, in `self.inputs` as long as the request.
                let tensor = unsafe {
                    Tensor::over(
                        Element::F32,
                        &input.dims,
                        input.data.as_mut_ptr().cast::<c_void>(),
                    )?
                };
                self.request.set_tensor(&input.name, &tensor)?;
                self.bound.push(tensor);
            }
        }
        Ok(())
    }

    /// Values per input row: the projection's inputs, or as [`BlockPart`] says.
    pub fn input_width(&self) -> usize {
        self.width
    }

    /// One inference on the prepared inputs.
    pub fn run(&mut self) -> Result<()> {
        if self.bound.is_empty() {
            return Err(OvError::Unsupported(
                "a probe runs once its inputs are prepared".into(),
            ));
        }
        self.request.infer()
    }

    /// The last run's output, `[rows, width]`.
    pub fn output(&self) -> Result<Vec<f32>> {
        Ok(self.request.tensor("out")?.as_f32()?.to_vec())
    }

    /// A [`ProbeGraph::Layer`]'s last run's keys and values of its rows, each `[n_head_kv,
    /// rows, head_dim]`.
    pub fn new_rows(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        let read = |name| -> Result<Vec<f32>> { Ok(self.request.tensor(name)?.as_f32()?.to_vec()) };
        Ok((read("present_k")?, read("present_v")?))
    }
}
