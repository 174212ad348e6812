//! The transformer as an OpenVINO graph, for one artifact shape.
//!
//! A graph runs `seqs` sequences of `rows` new tokens each (prefill: 1 × chunk; decode:
//! batch × 1) against caches of exactly `window` positions. The KV cache stays in host
//! memory: each layer's past keys and values are one input per KV head, `[seqs, 1,
//! window, head_dim]` (`past_k_{layer}_{head}`), and the new rows are outputs `[seqs,
//! n_head_kv, rows, head_dim]` that the host writes back. A head's positions are one
//! contiguous run of a session's cache whatever its layout, so one sequence binds its
//! cache without copying, and a cache reserving a larger window than the artifact's binds
//! the first `window` rows of each run: moving a session to a larger window copies
//! nothing. Nothing is stateful and every shape is static.
//!
//! Inputs besides the caches: token ids `[seqs, rows]`; RoPE cos/sin for every row's
//! position; an additive mask `[seqs, 1, 1, rows, window + rows]` that hides unused cache
//! positions and future rows (a model with sliding-window layers has a second cos/sin
//! and mask for them, `*_local`, the mask also hiding positions beyond each row's
//! window; when the artifact's window is larger than theirs, those layers' past inputs
//! hold only the rows their window reaches, see [`LocalPast`]); and
//! the rows whose logits are computed `[seqs, outputs]`
//! (`logits`: `[seqs, outputs, n_vocab]`): each sequence's last real row, or, in a packed
//! decode (one sequence whose rows are different sequences over their caches side by
//! side, a block-diagonal mask keeping them apart), every row.
//!
//! Weights are constants in the compressed-weight pattern OpenVINO recognises (integer
//! constant → Convert → Multiply by scale → MatMul), so plugins keep them compressed.

use std::collections::HashMap;

use half::{bf16, f16};
use pyramid_kernels::ops::RopeStyle;
use pyramid_model::{Activation, Linear, Model, ModelConfig, Precision};

use crate::ir::{Blob, Et, Graph, Port};
use crate::{OvError, Result};

/// How weights are stored in the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    F16,
    Bf16,
    /// Asymmetric INT8 in groups of [`INT8_GROUP`] inputs, a scale and a zero point per
    /// group (per row where the inputs do not divide into groups): the compressed-weight
    /// form OpenVINO's own exported models use, which its plugins decompress fused.
    Int8,
    /// Symmetric INT4 in groups of [`INT4_GROUP`] inputs, one scale per group.
    Int4,
}

pub const INT4_GROUP: usize = 32;
/// Measured on the reference prompts (`pyramid qualify`, CPU plugin, 2026.4): groups of
/// 64 keep SmolLM2's and Qwen2.5-0.5B's greedy tokens as often as the native INT8 path
/// (5/6 and 6/6); per-row scales kept 4/6 of each.
pub const INT8_GROUP: usize = 64;

impl WeightFormat {
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::F16 => "f16",
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Int8 => "int8",
            WeightFormat::Int4 => "int4",
        }
    }

    /// The graph format closest to a native precision.
    pub fn for_precision(precision: Precision) -> Self {
        match precision {
            Precision::F32 => WeightFormat::F32,
            Precision::Bf16 => WeightFormat::Bf16,
            Precision::Int8 => WeightFormat::Int8,
            Precision::Int4 => WeightFormat::Int4,
            // The graph has no block formats of its own: the file's blocks of up to 8 bits
            // go to its INT8.
            Precision::File => WeightFormat::Int8,
        }
    }
}

/// The shape of the RoPE angle inputs (`rope_cos`, `rope_sin`) for `rows` rows of
/// `seqs` sequences: NeoX angles written out to the whole head (each frequency twice,
/// see [`Builder::rope`]), interleaved ones once per pair.
pub fn rope_input_shape(style: RopeStyle, seqs: usize, rows: usize, head_dim: usize) -> Vec<usize> {
    match style {
        RopeStyle::Neox => vec![seqs, rows, 1, head_dim],
        RopeStyle::Interleaved => vec![seqs, rows, 1, head_dim / 2, 1],
    }
}

/// Writes one row's RoPE inputs at position `pos`: `cos` and `sin` hold one value per
/// frequency, or (NeoX, twice as long) the values twice over.
pub fn write_rope_row(cos: &mut [f32], sin: &mut [f32], inv_freq: &[f32], pos: usize, scale: f32) {
    let half = inv_freq.len();
    for (i, &f) in inv_freq.iter().enumerate() {
        let (s, c) = (pos as f32 * f).sin_cos();
        cos[i] = c * scale;
        sin[i] = s * scale;
    }
    if cos.len() == 2 * half {
        cos.copy_within(..half, half);
        sin.copy_within(..half, half);
    }
}

/// Additive mask value for hidden positions: finite, and representable in f16 for
/// devices that compute attention in half precision.
pub const MASKED: f32 = -65504.0;

/// How many past rows the sliding-window layers of a graph read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalPast {
    /// All of the past input, as global layers do (the window is no larger than theirs).
    Whole,
    /// `n` rows per graph sequence: the layers' past inputs hold only the rows their
    /// sliding window reaches (for one sequence, a view of its cache from the first row
    /// the window reaches), so attention in these layers costs their window, not the
    /// artifact's.
    Windowed(usize),
}

/// Input channels the projections of a normed input (Q, K and V; gate and up; the head)
/// compute apart in f32, by input (see [`outlier_site`]): the outlier channels the
/// native INT8 model was calibrated with. With activations
/// quantised at run time (the CPU plugin's dynamic quantisation), one such channel in a
/// group's scale leaves the group's other values a handful of levels; kept out of the
/// integer product, they cost a small f32 one.
///
/// The normed inputs only: their outliers are channels the norm's weights make large
/// for every token. The inputs of the output and down projections peak in different
/// channels for different tokens, and moving their calibrated channels apart cost
/// Qwen2.5-0.5B two of thirteen reference prompts (`pyramid qualify`, CPU plugin,
/// groups of 32); at the normed inputs alone both SmolLM2 and Qwen2.5 keep every prompt
/// the native INT8 path keeps.
#[derive(Debug, Clone, Default)]
pub struct OutlierChannels(HashMap<String, Vec<usize>>);

impl OutlierChannels {
    /// The outlier channels of `model`'s integer projections (none for other precisions).
    pub fn of(model: &Model) -> Self {
        let mut map = HashMap::new();
        let mut add = |name: String, lin: &Linear| {
            if let Linear::Quant(q) = lin {
                if !q.outlier_channels.is_empty() {
                    if let Some(site) = outlier_site(&name) {
                        map.insert(site, q.outlier_channels.clone());
                    }
                }
            }
        };
        for (i, l) in model.weights.layers.iter().enumerate() {
            for (name, lin) in [("wq", &l.wq), ("wk", &l.wk), ("wv", &l.wv)] {
                add(format!("blk.{i}.{name}"), lin);
            }
            if let Some(ffn) = l.dense_ffn() {
                for (name, lin) in [("gate", &ffn.gate), ("up", &ffn.up)] {
                    add(format!("blk.{i}.{name}"), lin);
                }
            }
        }
        add("output".into(), &model.weights.output);
        Self(map)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds weight `name`'s outlier columns of `data` (`[rows, cols]`), and its input
    /// site's channels and mask unless another projection of the site added them.
    fn add_to(&self, blob: &mut Blob, name: &str, data: &[f32], rows: usize, cols: usize) {
        let Some((site, channels)) =
            outlier_site(name).and_then(|site| self.0.get(&site).map(|c| (site, c)))
        else {
            return;
        };
        // In f16, as the native model keeps them: within 0.05 % of each weight, far
        // finer than the integer steps beside them, and half the bytes a decode reads.
        let columns: Vec<u8> = data
            .chunks_exact(cols)
            .flat_map(|row| channels.iter().map(|&c| row[c]))
            .flat_map(|v| f16::from_f32(v).to_le_bytes())
            .collect();
        blob.add(
            &format!("{name}.outlier_w"),
            Et::F16,
            &[rows, channels.len()],
            &columns,
        );
        let index = format!("{site}.outlier_idx");
        if !blob.contains(&index) {
            let idx: Vec<i64> = channels.iter().map(|&c| c as i64).collect();
            blob.add_i64(&index, &idx);
            let mut keep = vec![1.0f32; cols];
            channels.iter().for_each(|&c| keep[c] = 0.0);
            blob.add_f32(&format!("{site}.keep"), &[cols], &keep);
        }
    }
}

/// The normed input weight `weight` multiplies, which its outlier channels belong to:
/// projections of one input share them (`blk.3.wk` → `blk.3.attn_in`, `output` →
/// `head`); none for the inputs kept whole.
fn outlier_site(weight: &str) -> Option<String> {
    let Some((layer, name)) = weight.rsplit_once('.') else {
        return (weight == "output").then(|| "head".into());
    };
    let site = match name {
        "wq" | "wk" | "wv" => "attn_in",
        "gate" | "up" => "ffn_in",
        _ => return None,
    };
    Some(format!("{layer}.{site}"))
}

/// A model's constants and what is needed to emit its graphs.
pub struct ModelGraph {
    pub config: ModelConfig,
    pub format: WeightFormat,
    pub blob: Blob,
    tied_output: bool,
}

fn f32_matrix<'a>(lin: &'a Linear, what: &str) -> Result<(&'a [f32], usize, usize)> {
    match lin {
        Linear::F32(m) => Ok((&m.data, m.n_rows, m.n_cols)),
        _ => Err(OvError::Unsupported(format!(
            "{what} is not in f32: the OpenVINO graphs are built from the f32 model \
             (their own weight format is chosen separately)"
        ))),
    }
}

impl ModelGraph {
    /// Builds every constant. `model` must be the f32 model; `format` compresses its
    /// weights for the graph, whose integer products leave out `outliers`.
    pub fn build(model: &Model, format: WeightFormat, outliers: &OutlierChannels) -> Result<Self> {
        let integer = matches!(format, WeightFormat::Int8 | WeightFormat::Int4);
        let cfg = model.config.clone();
        if cfg.n_rot != cfg.head_dim {
            return Err(OvError::Unsupported(format!(
                "partial RoPE ({} of {} dimensions)",
                cfg.n_rot, cfg.head_dim
            )));
        }
        if let Some(x) = &cfg.experts {
            return Err(OvError::Unsupported(format!(
                "routed experts ({} experts, {} per token): the static graphs have dense \
                 feed-forward blocks only",
                x.n_expert, x.n_used
            )));
        }
        let w = &model.weights;
        let mut blob = Blob::default();
        let emb = w.embedding_table().ok_or_else(|| {
            OvError::Unsupported(
                "a model already converted from f32: OpenVINO graphs are built from the f32 model"
                    .into(),
            )
        })?;
        add_weight(
            &mut blob,
            "token_embd",
            &emb.data,
            emb.n_rows,
            emb.n_cols,
            format,
        );
        for (i, l) in w.layers.iter().enumerate() {
            let e = cfg.n_embd;
            blob.add_f32(&format!("blk.{i}.attn_norm"), &[e], &l.attn_norm);
            blob.add_f32(&format!("blk.{i}.ffn_norm"), &[e], &l.ffn_norm);
            for (name, norm) in [
                ("q_norm", &l.q_norm),
                ("k_norm", &l.k_norm),
                ("post_attn_norm", &l.post_attn_norm),
                ("post_ffn_norm", &l.post_ffn_norm),
            ] {
                if let Some(norm) = norm {
                    blob.add_f32(&format!("blk.{i}.{name}"), &[norm.len()], norm);
                }
            }
            let ffn = l
                .dense_ffn()
                .ok_or_else(|| OvError::Unsupported(format!("layer {i}'s routed experts")))?;
            for (name, lin) in [
                ("wq", &l.wq),
                ("wk", &l.wk),
                ("wv", &l.wv),
                ("wo", &l.wo),
                ("gate", &ffn.gate),
                ("up", &ffn.up),
                ("down", &ffn.down),
            ] {
                let name = format!("blk.{i}.{name}");
                let (data, rows, cols) = f32_matrix(lin, &name)?;
                add_weight(&mut blob, &name, data, rows, cols, format);
                if integer {
                    outliers.add_to(&mut blob, &name, data, rows, cols);
                }
            }
            for (name, bias) in [("bq", &l.bq), ("bk", &l.bk), ("bv", &l.bv)] {
                if let Some(b) = bias {
                    blob.add_f32(&format!("blk.{i}.{name}"), &[b.len()], b);
                }
            }
        }
        blob.add_f32("output_norm", &[cfg.n_embd], &w.output_norm);
        let (out, rows, cols) = f32_matrix(&w.output, "output")?;
        let tied_output = std::ptr::eq(out, emb.data.as_slice()) || out == emb.data.as_slice();
        if !tied_output {
            add_weight(&mut blob, "output", out, rows, cols, format);
        }
        if integer {
            outliers.add_to(&mut blob, "output", out, rows, cols);
        }
        add_small_constants(&mut blob, &cfg);
        Ok(Self {
            config: cfg,
            format,
            blob,
            tied_output,
        })
    }

    /// The IR text of the graph for `seqs` × `rows` new tokens over `window` past
    /// positions, returning logits for `outputs` rows of each sequence (named by the
    /// `last_rows` input); sliding-window layers read `local` of the past.
    pub fn emit(
        &self,
        seqs: usize,
        rows: usize,
        window: usize,
        outputs: usize,
        local: LocalPast,
    ) -> String {
        let cfg = &self.config;
        let mut g = Graph::new("pyramid", &self.blob);
        let (hd, kv) = (cfg.head_dim, cfg.n_head_kv);
        let ids = g.parameter("input_ids", Et::I64, &[seqs, rows]);
        let rope_shape = rope_input_shape(cfg.arch.rope_style(), seqs, rows, hd);
        let cos = g.parameter("rope_cos", Et::F32, &rope_shape);
        let sin = g.parameter("rope_sin", Et::F32, &rope_shape);
        let mask = g.parameter(
            "attention_mask",
            Et::F32,
            &[seqs, 1, 1, rows, window + rows],
        );
        let last = g.parameter("last_rows", Et::I64, &[seqs, outputs]);
        let local_width = match local {
            LocalPast::Whole => window,
            LocalPast::Windowed(n) => n,
        };
        let local = cfg.sliding_window.map(|_| {
            (
                g.parameter("rope_cos_local", Et::F32, &rope_shape),
                g.parameter("rope_sin_local", Et::F32, &rope_shape),
                g.parameter(
                    "attention_mask_local",
                    Et::F32,
                    &[seqs, 1, 1, rows, local_width + rows],
                ),
            )
        });

        let table = self.weight(&mut g, "token_embd");
        let axis0 = g.constant("axis0");
        let mut x = g.op(
            "Gather",
            "opset8",
            r#"batch_dims="0""#,
            &[table, ids, axis0],
        );
        let b = Builder {
            cfg,
            format: self.format,
        };
        if cfg.embedding_scale != 1.0 {
            let scale = g.constant("embed_scale");
            x = b.binary(&mut g, "Multiply", x, scale);
        }
        for layer in 0..cfg.n_layer {
            let windowed = cfg.layer_window(layer).is_some();
            let (cos, sin, mask) = match (local, windowed) {
                (Some(local), true) => local,
                _ => (cos, sin, mask),
            };
            // One input per KV head: each head's run of a cache is contiguous in every
            // layout, so a session's cache is bound as it is, on any window.
            let cols = if windowed { local_width } else { window };
            let past_k = past_heads(&mut g, "k", layer, [seqs, 1, cols, hd], kv);
            let past_v = past_heads(&mut g, "v", layer, [seqs, 1, cols, hd], kv);
            let inputs = LayerInputs {
                cos,
                sin,
                mask,
                past: [&past_k, &past_v],
                rows,
            };
            let (o, [k, v]) = b.attention_half(&mut g, x, layer, &inputs);
            g.output(k, &format!("present_k_{layer}"));
            g.output(v, &format!("present_v_{layer}"));
            x = b.binary(&mut g, "Add", x, o);
            let down = b.ffn_half(&mut g, x, layer);
            x = b.binary(&mut g, "Add", x, down);
        }
        let axis1 = g.constant("axis1");
        let x = g.op("Gather", "opset8", r#"batch_dims="1""#, &[x, last, axis1]);
        let x = b.rms_norm(&mut g, x, "output_norm");
        let head = if self.tied_output {
            "token_embd"
        } else {
            "output"
        };
        let logits = b.product(&mut g, x, head, "output");
        g.output(logits, "logits");
        g.to_xml()
    }

    fn weight(&self, g: &mut Graph<'_>, name: &str) -> Port {
        Builder {
            cfg: &self.config,
            format: self.format,
        }
        .weight(g, name)
    }
}

/// What one layer reads besides the residual stream.
pub(crate) struct LayerInputs<'p> {
    pub cos: Port,
    pub sin: Port,
    pub mask: Port,
    /// Past keys and values, one input per KV head.
    pub past: [&'p [Port]; 2],
    pub rows: usize,
}

pub(crate) struct Builder<'a> {
    pub cfg: &'a ModelConfig,
    pub format: WeightFormat,
}

impl Builder<'_> {
    /// Layer `layer`'s attention half on the residual stream `x`: its output (to add to
    /// `x`) and the rows' new keys and values `[seqs, n_head_kv, rows, head_dim]`.
    pub fn attention_half(
        &self,
        g: &mut Graph<'_>,
        x: Port,
        layer: usize,
        inputs: &LayerInputs<'_>,
    ) -> (Port, [Port; 2]) {
        let name = |name: &str| format!("blk.{layer}.{name}");
        let h = self.rms_norm(g, x, &name("attn_norm"));
        let q = self.linear(g, h, &name("wq"), Some("bq"), layer);
        let k = self.linear(g, h, &name("wk"), Some("bk"), layer);
        let v = self.linear(g, h, &name("wv"), Some("bv"), layer);
        let q = self.reshape(g, q, "shape_q_heads");
        let q = self.optional_norm(g, q, &name("q_norm"));
        let k = self.reshape(g, k, "shape_kv_heads");
        let k = self.optional_norm(g, k, &name("k_norm"));
        // SmolLM3's NoPE layers rotate nothing.
        let (q, k) = if self.cfg.layer_rotates(layer) {
            (
                self.rope(g, q, inputs.cos, inputs.sin),
                self.rope(g, k, inputs.cos, inputs.sin),
            )
        } else {
            (q, k)
        };
        let v = self.reshape(g, v, "shape_kv_heads");
        let (ctx, new) = self.attention_core(g, q, k, v, inputs);
        let o = self.linear(g, ctx, &name("wo"), None, layer);
        (self.optional_norm(g, o, &name("post_attn_norm")), new)
    }

    /// Attention from queries `[seqs, rows, n_head, head_dim]` and keys and values
    /// `[seqs, rows, n_head_kv, head_dim]` (projected and rotated): the context `[seqs,
    /// rows, q_dim]` and the keys and values `[seqs, n_head_kv, rows, head_dim]`.
    pub fn attention_core(
        &self,
        g: &mut Graph<'_>,
        q: Port,
        k: Port,
        v: Port,
        inputs: &LayerInputs<'_>,
    ) -> (Port, [Port; 2]) {
        let q = self.reshape(g, q, "shape_q_groups");
        let q = self.transpose(g, q, "perm_q");
        let k = self.transpose(g, k, "perm_kv");
        let v = self.transpose(g, v, "perm_kv");
        let ctx = self.attention(g, q, [k, v], inputs.past, inputs.mask, inputs.rows);
        let ctx = self.transpose(g, ctx, "perm_out");
        (self.reshape(g, ctx, "shape_merge_heads"), [k, v])
    }

    /// Layer `layer`'s FFN half on the residual stream `x`: its output, to add to `x`.
    pub fn ffn_half(&self, g: &mut Graph<'_>, x: Port, layer: usize) -> Port {
        let name = |name: &str| format!("blk.{layer}.{name}");
        let h = self.rms_norm(g, x, &name("ffn_norm"));
        let gate = self.linear(g, h, &name("gate"), None, layer);
        let up = self.linear(g, h, &name("up"), None, layer);
        let act = match self.cfg.activation {
            Activation::Silu => g.op("Swish", "opset4", "", &[gate]),
            Activation::GeluTanh => g.op("Gelu", "opset7", r#"approximation_mode="tanh""#, &[gate]),
        };
        let act = self.binary(g, "Multiply", act, up);
        let down = self.linear(g, act, &name("down"), None, layer);
        self.optional_norm(g, down, &name("post_ffn_norm"))
    }

    pub fn binary(&self, g: &mut Graph<'_>, kind: &'static str, a: Port, b: Port) -> Port {
        g.op(kind, "opset1", r#"auto_broadcast="numpy""#, &[a, b])
    }

    fn reshape(&self, g: &mut Graph<'_>, x: Port, pattern: &str) -> Port {
        let pattern = g.constant(pattern);
        g.op("Reshape", "opset1", r#"special_zero="true""#, &[x, pattern])
    }

    fn transpose(&self, g: &mut Graph<'_>, x: Port, perm: &str) -> Port {
        let perm = g.constant(perm);
        g.op("Transpose", "opset1", "", &[x, perm])
    }

    /// `[out, in]` f32 weights, decompressed in the graph.
    fn weight(&self, g: &mut Graph<'_>, name: &str) -> Port {
        let raw = g.constant(name);
        if self.format == WeightFormat::F32 {
            return raw;
        }
        let f32 = g.op("Convert", "opset1", r#"destination_type="f32""#, &[raw]);
        match self.format {
            WeightFormat::F32 | WeightFormat::F16 | WeightFormat::Bf16 => f32,
            WeightFormat::Int8 | WeightFormat::Int4 => {
                let zero_point = format!("{name}.zero_point");
                let centred = if g.has_constant(&zero_point) {
                    let zp = g.constant(&zero_point);
                    let zp = g.op("Convert", "opset1", r#"destination_type="f32""#, &[zp]);
                    self.binary(g, "Subtract", f32, zp)
                } else {
                    f32
                };
                let scale = g.constant(&format!("{name}.scale"));
                let w = self.binary(g, "Multiply", centred, scale);
                let grouped = format!("{name}.shape");
                if g.has_constant(&grouped) {
                    let shape = g.constant(&grouped);
                    g.op("Reshape", "opset1", r#"special_zero="false""#, &[w, shape])
                } else {
                    w
                }
            }
        }
    }

    pub fn linear(
        &self,
        g: &mut Graph<'_>,
        x: Port,
        name: &str,
        bias: Option<&str>,
        layer: usize,
    ) -> Port {
        let y = self.product(g, x, name, name);
        match bias.map(|b| format!("blk.{layer}.{b}")) {
            Some(b) if g.has_constant(&b) => {
                let b = g.constant(&b);
                self.binary(g, "Add", y, b)
            }
            _ => y,
        }
    }

    /// `x` times weight `name` transposed; the outlier channels of `outliers` (a weight
    /// name), where it has them, multiply their f32 columns apart.
    fn product(&self, g: &mut Graph<'_>, x: Port, name: &str, outliers: &str) -> Port {
        let dot = |g: &mut Graph<'_>, x: Port, w: Port| {
            g.op(
                "MatMul",
                "opset1",
                r#"transpose_a="false" transpose_b="true""#,
                &[x, w],
            )
        };
        let columns = format!("{outliers}.outlier_w");
        let site = outlier_site(outliers).filter(|_| g.has_constant(&columns));
        let Some(site) = site else {
            let w = self.weight(g, name);
            return dot(g, x, w);
        };
        // The site's projections mask and gather the same input: OpenVINO merges the
        // repeated operations when it reads the graph.
        let keep = g.constant(&format!("{site}.keep"));
        let inliers = self.binary(g, "Multiply", x, keep);
        let index = g.constant(&format!("{site}.outlier_idx"));
        let last = g.constant("axis_last");
        let channels = g.op("Gather", "opset8", r#"batch_dims="0""#, &[x, index, last]);
        let w = self.weight(g, name);
        let main = dot(g, inliers, w);
        let columns = g.constant(&columns);
        let columns = g.op("Convert", "opset1", r#"destination_type="f32""#, &[columns]);
        let side = dot(g, channels, columns);
        self.binary(g, "Add", main, side)
    }

    /// Attention of `q` (`[seqs, kv, group, rows, hd]`) over each KV head's past input
    /// followed by its new rows (`new`: keys and values `[seqs, kv, rows, hd]`); returns
    /// the context `[seqs, kv, group, rows, hd]`.
    ///
    /// Joining the past with the new rows copies the window (`2 · hd` values per
    /// column, per KV head) on every run. A decode step (`group · rows < hd`) instead
    /// attends each KV head apart and joins only its scores against the past and the
    /// new rows (`2 · group · rows` values per column with the split back), so it never
    /// copies the window. A prefill chunk, whose scores outweigh the window, joins the
    /// heads' pasts and the new rows and attends all heads at once.
    fn attention(
        &self,
        g: &mut Graph<'_>,
        q: Port,
        new: [Port; 2],
        past: [&[Port]; 2],
        mask: Port,
        rows: usize,
    ) -> Port {
        let n = past[0].len();
        let (group_axis, scale) = (g.constant("axes_group"), g.constant("attn_scale"));
        let dot = |g: &mut Graph<'_>, a: Port, b: Port, transpose_b: bool| {
            let data = format!(r#"transpose_a="false" transpose_b="{transpose_b}""#);
            g.op("MatMul", "opset1", &data, &[a, b])
        };
        // [seqs, heads, 1, columns, hd]: each KV head for its group of queries.
        let group = |g: &mut Graph<'_>, x: Port| g.op("Unsqueeze", "opset1", "", &[x, group_axis]);
        let softmax = |g: &mut Graph<'_>, scores: Port| {
            let scores = self.binary(g, "Multiply", scores, scale);
            let scores = self.binary(g, "Add", scores, mask);
            g.op("Softmax", "opset8", r#"axis="-1""#, &[scores])
        };
        if (self.cfg.n_head / n) * rows >= self.cfg.head_dim {
            let join = |g: &mut Graph<'_>, past: &[Port], new: Port| {
                let past = match past {
                    [one] => *one,
                    heads => g.op("Concat", "opset1", r#"axis="1""#, heads),
                };
                let joined = g.op("Concat", "opset1", r#"axis="2""#, &[past, new]);
                group(g, joined)
            };
            let (k_all, v_all) = (join(g, past[0], new[0]), join(g, past[1], new[1]));
            let scores = dot(g, q, k_all, true);
            let probs = softmax(g, scores);
            return dot(g, probs, v_all, false);
        }
        let qs = split_heads(g, q, n);
        let ks = split_heads(g, new[0], n);
        let vs = split_heads(g, new[1], n);
        let (axis0, last_axis, seq_dim) = (
            g.constant("axis0"),
            g.constant("axis4"),
            g.constant("index_seq"),
        );
        // Past and new columns, from the static shapes (folded when compiled).
        let columns = |g: &mut Graph<'_>, x: Port| {
            let shape = g.op("ShapeOf", "opset3", r#"output_type="i64""#, &[x]);
            g.op(
                "Gather",
                "opset8",
                r#"batch_dims="0""#,
                &[shape, seq_dim, axis0],
            )
        };
        // Every head splits its probabilities at the same column.
        let lengths = [columns(g, past[0][0]), columns(g, ks[0])];
        let lengths = g.op("Concat", "opset1", r#"axis="0""#, &lengths);
        let ctx: Vec<Port> = (0..n)
            .map(|h| {
                let (k_past, k_new) = (group(g, past[0][h]), group(g, ks[h]));
                let (v_past, v_new) = (group(g, past[1][h]), group(g, vs[h]));
                let (s_past, s_new) = (dot(g, qs[h], k_past, true), dot(g, qs[h], k_new, true));
                let scores = g.op("Concat", "opset1", r#"axis="4""#, &[s_past, s_new]);
                let probs = softmax(g, scores);
                let parts = g.op_n(
                    "VariadicSplit",
                    "opset1",
                    "",
                    &[probs, last_axis, lengths],
                    2,
                );
                let (c_past, c_new) = (
                    dot(g, parts[0], v_past, false),
                    dot(g, parts[1], v_new, false),
                );
                self.binary(g, "Add", c_past, c_new)
            })
            .collect();
        match ctx[..] {
            [one] => one,
            _ => g.op("Concat", "opset1", r#"axis="1""#, &ctx),
        }
    }

    /// `x * (1 / sqrt(mean(x²) + eps)) * weight`, as the native kernel computes it.
    fn rms_norm(&self, g: &mut Graph<'_>, x: Port, weight: &str) -> Port {
        let sq = self.binary(g, "Multiply", x, x);
        let axes = g.constant("axes_last");
        let mean = g.op("ReduceMean", "opset1", r#"keep_dims="true""#, &[sq, axes]);
        let eps = g.constant("rms_eps");
        let var = self.binary(g, "Add", mean, eps);
        let root = g.op("Sqrt", "opset1", "", &[var]);
        let one = g.constant("one");
        let inv = self.binary(g, "Divide", one, root);
        let n = self.binary(g, "Multiply", x, inv);
        let w = g.constant(weight);
        self.binary(g, "Multiply", n, w)
    }

    /// [`Builder::rms_norm`] with `weight` where the model has it (Gemma 3's QK- and
    /// post-norms), else `x` unchanged.
    fn optional_norm(&self, g: &mut Graph<'_>, x: Port, weight: &str) -> Port {
        if g.has_constant(weight) {
            self.rms_norm(g, x, weight)
        } else {
            x
        }
    }

    /// Rotates `x` (`[seqs, rows, heads, head_dim]`) by the row positions' angles.
    ///
    /// Halves (NeoX) are rotated as `x · cos + rotate_half(x) · sin`, the halves sliced
    /// off and the second negated by a multiply, over angles written out to the whole
    /// head: the form OpenVINO's CPU plugin fuses into one RoPE node. (Written with the
    /// halves' own products instead, it fuses too, but OpenVINO 2026.4 imports that
    /// node from its cache wrong: the keys come back garbage.)
    fn rope(&self, g: &mut Graph<'_>, x: Port, cos: Port, sin: Port) -> Port {
        if self.cfg.arch.rope_style() == RopeStyle::Neox {
            let slice = |g: &mut Graph<'_>, from: &str, to: &str| {
                let inputs = [
                    x,
                    g.constant(from),
                    g.constant(to),
                    g.constant("step_one"),
                    g.constant("axes_last"),
                ];
                g.op("Slice", "opset8", "", &inputs)
            };
            let first = slice(g, "rope_start", "rope_half");
            let second = slice(g, "rope_half", "rope_end");
            let minus_one = g.constant("minus_one");
            let negated = self.binary(g, "Multiply", second, minus_one);
            let rotated = g.op("Concat", "opset1", r#"axis="-1""#, &[negated, first]);
            let xc = self.binary(g, "Multiply", x, cos);
            let rs = self.binary(g, "Multiply", rotated, sin);
            return self.binary(g, "Add", xc, rs);
        }
        let (x, axis, lengths) = (
            self.reshape(g, x, "shape_rope_pairs"),
            "axis4",
            "split_pairs",
        );
        let axis_port = g.constant(axis);
        let lengths = g.constant(lengths);
        let halves = g.op_n("VariadicSplit", "opset1", "", &[x, axis_port, lengths], 2);
        let (x0, x1) = (halves[0], halves[1]);
        let x0c = self.binary(g, "Multiply", x0, cos);
        let x1s = self.binary(g, "Multiply", x1, sin);
        let a = self.binary(g, "Subtract", x0c, x1s);
        let x0s = self.binary(g, "Multiply", x0, sin);
        let x1c = self.binary(g, "Multiply", x1, cos);
        let b = self.binary(g, "Add", x0s, x1c);
        let y = g.op("Concat", "opset1", r#"axis="4""#, &[a, b]);
        self.reshape(g, y, "shape_rope_unpairs")
    }
}

/// Adds weight `name` (`[rows, cols]` f32) in `format`, with its scales and (INT4) the
/// shape its groups fold back to.
fn add_weight(
    blob: &mut Blob,
    name: &str,
    data: &[f32],
    rows: usize,
    cols: usize,
    format: WeightFormat,
) {
    let format = if format == WeightFormat::Int4 && !cols.is_multiple_of(INT4_GROUP) {
        WeightFormat::Int8
    } else {
        format
    };
    match format {
        WeightFormat::F32 => blob.add_f32(name, &[rows, cols], data),
        WeightFormat::F16 => {
            let bytes: Vec<u8> = data
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect();
            blob.add(name, Et::F16, &[rows, cols], &bytes);
        }
        WeightFormat::Bf16 => {
            let bytes: Vec<u8> = data
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect();
            blob.add(name, Et::Bf16, &[rows, cols], &bytes);
        }
        WeightFormat::Int8 => {
            let group = if cols.is_multiple_of(INT8_GROUP) {
                INT8_GROUP
            } else {
                cols
            };
            let groups = cols / group;
            let (codes, zero_points, scales) = quantize_asymmetric(data, group);
            blob.add(name, Et::U8, &[rows, groups, group], &codes);
            blob.add(
                &format!("{name}.zero_point"),
                Et::U8,
                &[rows, groups, 1],
                &zero_points,
            );
            blob.add_f32(&format!("{name}.scale"), &[rows, groups, 1], &scales);
            blob.add_i64(&format!("{name}.shape"), &[rows as i64, cols as i64]);
        }
        WeightFormat::Int4 => {
            let groups = cols / INT4_GROUP;
            let (q, scales) = quantize_symmetric(data, INT4_GROUP, 7.0);
            // Two values per byte, the first in the low nibble.
            let bytes: Vec<u8> = q
                .chunks_exact(2)
                .map(|p| (p[0] as u8 & 0x0f) | ((p[1] as u8 & 0x0f) << 4))
                .collect();
            blob.add(name, Et::I4, &[rows, groups, INT4_GROUP], &bytes);
            blob.add_f32(&format!("{name}.scale"), &[rows, groups, 1], &scales);
            blob.add_i64(&format!("{name}.shape"), &[rows as i64, cols as i64]);
        }
    }
}

/// Symmetric quantisation of each run of `group` values to `[-levels, levels]`.
pub fn quantize_symmetric(data: &[f32], group: usize, levels: f32) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(data.len());
    let mut scales = Vec::with_capacity(data.len() / group);
    for run in data.chunks_exact(group) {
        let peak = run.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = if peak > 0.0 { peak / levels } else { 1.0 };
        q.extend(
            run.iter()
                .map(|v| (v / scale).round().clamp(-levels, levels) as i8),
        );
        scales.push(scale);
    }
    (q, scales)
}

/// Asymmetric quantisation of each run of `group` values to codes `0..=255`: the codes,
/// each run's zero point (the code of 0.0) and scale, `value ≈ (code − zero) · scale`.
/// The range always holds 0.0, so the zero point is a code.
pub fn quantize_asymmetric(data: &[f32], group: usize) -> (Vec<u8>, Vec<u8>, Vec<f32>) {
    let runs = data.len() / group;
    let (mut codes, mut zeros, mut scales) = (
        Vec::with_capacity(data.len()),
        Vec::with_capacity(runs),
        Vec::with_capacity(runs),
    );
    for run in data.chunks_exact(group) {
        let lo = run.iter().fold(0.0f32, |m, &v| m.min(v));
        let hi = run.iter().fold(0.0f32, |m, &v| m.max(v));
        let scale = if hi > lo { (hi - lo) / 255.0 } else { 1.0 };
        let zero = (-lo / scale).round().clamp(0.0, 255.0);
        codes.extend(
            run.iter()
                .map(|&v| ((v / scale).round() + zero).clamp(0.0, 255.0) as u8),
        );
        zeros.push(zero as u8);
        scales.push(scale);
    }
    (codes, zeros, scales)
}

/// The past keys (`kind` "k") or values ("v") of `layer`, one input per KV head.
fn past_heads(
    g: &mut Graph<'_>,
    kind: &str,
    layer: usize,
    shape: [usize; 4],
    n_head_kv: usize,
) -> Vec<Port> {
    (0..n_head_kv)
        .map(|h| g.parameter(&format!("past_{kind}_{layer}_{h}"), Et::F32, &shape))
        .collect()
}

/// `x` split into its `n` parts along axis 1 (itself when `n` is 1).
fn split_heads(g: &mut Graph<'_>, x: Port, n: usize) -> Vec<Port> {
    if n == 1 {
        return vec![x];
    }
    let axis1 = g.constant("axis1");
    g.op_n(
        "Split",
        "opset1",
        &format!(r#"num_splits="{n}""#),
        &[x, axis1],
        n,
    )
}

/// Axes, shape patterns and scalars: they depend on the model, never on the artifact's
/// shape, so one blob serves every artifact.
fn add_small_constants(blob: &mut Blob, cfg: &ModelConfig) {
    let (h, kv, hd) = (cfg.n_head as i64, cfg.n_head_kv as i64, cfg.head_dim as i64);
    let scalar_i64 =
        |blob: &mut Blob, name: &str, v: i64| blob.add(name, Et::I64, &[], &v.to_le_bytes());
    scalar_i64(blob, "axis0", 0);
    scalar_i64(blob, "axis1", 1);
    scalar_i64(blob, "axis4", 4);
    scalar_i64(blob, "axis_last", -1);
    blob.add_i64("axes_last", &[-1]);
    blob.add_i64("axes_group", &[2]);
    blob.add_i64("index_seq", &[2]);
    blob.add_i64("shape_q_heads", &[0, 0, h, hd]);
    blob.add_i64("shape_kv_heads", &[0, 0, kv, hd]);
    blob.add_i64("shape_q_groups", &[0, 0, kv, h / kv, hd]);
    blob.add_i64("shape_merge_heads", &[0, 0, -1]);
    blob.add_i64("shape_rope_pairs", &[0, 0, 0, hd / 2, 2]);
    blob.add_i64("shape_rope_unpairs", &[0, 0, 0, hd]);
    blob.add_i64("rope_start", &[0]);
    blob.add_i64("rope_half", &[hd / 2]);
    blob.add_i64("rope_end", &[hd]);
    blob.add_i64("step_one", &[1]);
    blob.add_f32("minus_one", &[1], &[-1.0]);
    blob.add_i64("split_pairs", &[1, 1]);
    // [seqs, rows, kv, group, hd] → [seqs, kv, group, rows, hd], and back.
    blob.add_i64("perm_q", &[0, 2, 3, 1, 4]);
    blob.add_i64("perm_out", &[0, 3, 1, 2, 4]);
    // [seqs, rows, kv, hd] → [seqs, kv, rows, hd]
    blob.add_i64("perm_kv", &[0, 2, 1, 3]);
    blob.add_f32("rms_eps", &[1], &[cfg.rms_eps]);
    blob.add_f32("one", &[1], &[1.0]);
    blob.add_f32("attn_scale", &[1], &[cfg.attention_scale]);
    blob.add_f32("embed_scale", &[1], &[cfg.embedding_scale]);
}
