//! One decoder block run alone, whole or with a part taken out.
//!
//! `pyramid affinity` prices attention and the FFN inside their block by ablation (the
//! whole block's time less the time of the block without the part) and checks a device's
//! block graph against these runs, which compute with the same kernels, threads and
//! barriers as a forward pass's layer.

use pyramid_kernels::ops::rms_norm;
use pyramid_kernels::{SharedSlice, ThreadPool};

use crate::linear::LinearScratch;

use crate::forward::Layers;
use crate::{
    KvCache, LayerWeights, Linear, LogitsFor, Model, ModelConfig, ModelError, Result, Scratch,
    Segment,
};

/// What of a decoder block a run computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockPart {
    /// Both halves with their residual adds: `y = x + attn(x); y + ffn(y)`.
    Whole,
    /// The FFN half alone: `x + ffn(x)` (norm, gate and up, activation, down).
    WithoutAttention,
    /// The attention half alone: `x + attn(x)` (norm, projections, RoPE, attention,
    /// output projection).
    WithoutFfn,
    /// Attention's core alone, from queries, keys and values already projected and
    /// rotated: the rows' keys and values stored in the cache, and every query attended
    /// over it.
    AttentionCore,
}

impl BlockPart {
    pub const ALL: [BlockPart; 4] = [
        BlockPart::Whole,
        BlockPart::WithoutAttention,
        BlockPart::WithoutFfn,
        BlockPart::AttentionCore,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BlockPart::Whole => "block",
            BlockPart::WithoutAttention => "block without attention",
            BlockPart::WithoutFfn => "block without ffn",
            BlockPart::AttentionCore => "attention core",
        }
    }

    /// Values per input row: the residual stream, or (the core) a row's query, keys and
    /// values side by side.
    pub fn input_width(self, cfg: &ModelConfig) -> usize {
        match self {
            BlockPart::AttentionCore => cfg.q_dim() + 2 * cfg.kv_dim(),
            _ => cfg.n_embd,
        }
    }

    /// Values per output row: the residual stream, or (the core) the attention context.
    pub fn output_width(self, cfg: &ModelConfig) -> usize {
        match self {
            BlockPart::AttentionCore => cfg.q_dim(),
            _ => cfg.n_embd,
        }
    }
}

/// One of a decoder block's weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Projection {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Projection {
    pub const ALL: [Projection; 7] = [
        Projection::Q,
        Projection::K,
        Projection::V,
        Projection::O,
        Projection::Gate,
        Projection::Up,
        Projection::Down,
    ];

    /// Its name in a layer's tensors (`blk.N.wq`, …) as the OpenVINO graphs call them.
    pub fn name(self) -> &'static str {
        match self {
            Projection::Q => "wq",
            Projection::K => "wk",
            Projection::V => "wv",
            Projection::O => "wo",
            Projection::Gate => "gate",
            Projection::Up => "up",
            Projection::Down => "down",
        }
    }

    /// Its weights; `None` for an FFN projection of a layer of routed experts, which has
    /// one per expert.
    pub fn weight(self, layer: &LayerWeights) -> Option<&Linear> {
        let ffn = layer.dense_ffn();
        match self {
            Projection::Q => Some(&layer.wq),
            Projection::K => Some(&layer.wk),
            Projection::V => Some(&layer.wv),
            Projection::O => Some(&layer.wo),
            Projection::Gate => ffn.map(|f| &f.gate),
            Projection::Up => ffn.map(|f| &f.up),
            Projection::Down => ffn.map(|f| &f.down),
        }
    }

    /// Its bias, where the model has one (Qwen2's query, key and value projections).
    pub fn bias(self, layer: &LayerWeights) -> Option<&[f32]> {
        match self {
            Projection::Q => layer.bq.as_deref(),
            Projection::K => layer.bk.as_deref(),
            Projection::V => layer.bv.as_deref(),
            _ => None,
        }
    }

    /// The bias's name in a layer's tensors, for the projections that may have one.
    pub fn bias_name(self) -> Option<&'static str> {
        match self {
            Projection::Q => Some("bq"),
            Projection::K => Some("bk"),
            Projection::V => Some("bv"),
            _ => None,
        }
    }
}

impl Model {
    /// Runs `part` of layer `layer` on the rows of `input` (`[rows, input_width]`) at
    /// positions `kv.len()..`, attending to `kv`'s live positions, and writes `output`
    /// (`[rows, output_width]`). `kv` is left as it was: the rows' keys and values are
    /// written past its length and not kept, so every call measures the same block.
    #[allow(clippy::too_many_arguments)]
    pub fn run_block(
        &self,
        pool: &ThreadPool,
        layer: usize,
        part: BlockPart,
        input: &[f32],
        output: &mut [f32],
        kv: &mut KvCache,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let cfg = &self.config;
        let (in_w, out_w) = (part.input_width(cfg), part.output_width(cfg));
        let rows = input.len() / in_w;
        if layer >= cfg.n_layer {
            return Err(ModelError::BadConfig(format!(
                "layer {layer} of a model with {} layers",
                cfg.n_layer
            )));
        }
        if rows == 0 || input.len() != rows * in_w || output.len() != rows * out_w {
            return Err(ModelError::BadConfig(format!(
                "a {} run takes rows of {in_w} values and gives rows of {out_w}: got {} in, {} out",
                part.name(),
                input.len(),
                output.len()
            )));
        }
        let len = kv.len();
        let tokens = vec![0; rows];
        let output = SharedSlice::new(output);
        let result = self.run_pass(
            pool,
            &mut [Segment::new(&tokens, kv)],
            scratch,
            LogitsFor::Last,
            Layers::Block {
                layer,
                part,
                input,
                output: &output,
            },
        );
        kv.truncate(len);
        result
    }
}

impl Model {
    /// Logits `[rows, n_vocab]` of residual-stream rows that have passed the last block:
    /// the final norm and the output projection, as a forward pass ends.
    pub fn logits_of(&self, pool: &ThreadPool, hidden: &[f32]) -> Vec<f32> {
        let (e, w) = (self.config.n_embd, &self.weights);
        let rows = hidden.len() / e;
        let mut normed = vec![0.0; rows * e];
        rms_norm(
            &mut normed,
            &hidden[..rows * e],
            &w.output_norm,
            self.config.rms_eps,
        );
        let mut logits = vec![0.0; rows * w.output.n_out()];
        let mut scratch = LinearScratch::for_shape(rows, e);
        w.output
            .forward(pool, &normed, None, &mut logits, rows, &mut scratch);
        logits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{synthetic_gguf, SyntheticSpec};
    use crate::Architecture;
    use pyramid_gguf::GgufFile;

    /// Qwen2: biased projections and two query heads per KV head.
    fn tiny() -> Model {
        let bytes = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Qwen2))
            .unwrap()
            .to_bytes();
        Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0
                    - 1.0
            })
            .collect()
    }

    /// A cache holding `n` positions of every layer, written from `values`.
    fn cache(model: &Model, n: usize) -> KvCache {
        let cfg = &model.config;
        let mut kv = model.new_kv_cache(n + 64);
        for layer in 0..cfg.n_layer {
            for head in 0..cfg.n_head_kv {
                let (k, v) = (
                    written(cfg, layer, head, n, false),
                    written(cfg, layer, head, n, true),
                );
                kv.write_head_rows(layer, head, 0, &k, &v).unwrap();
            }
        }
        kv.commit(n).unwrap();
        kv
    }

    fn run(model: &Model, threads: usize, part: BlockPart, rows: usize, past: usize) -> Vec<f32> {
        let cfg = &model.config;
        let pool = ThreadPool::new(threads).unwrap();
        let mut kv = cache(model, past);
        let input = values(rows * part.input_width(cfg), 3);
        let mut out = vec![0.0; rows * part.output_width(cfg)];
        let mut scratch = Scratch::default();
        model
            .run_block(&pool, 1, part, &input, &mut out, &mut kv, &mut scratch)
            .unwrap();
        assert_eq!(kv.len(), past, "a block run leaves the cache as it was");
        out
    }

    fn zeroed(lin: &mut Linear) {
        match lin {
            Linear::F32(m) => m.data.fill(0.0),
            _ => unreachable!("the tiny model loads in f32"),
        }
    }

    #[test]
    fn ablated_blocks_equal_the_whole_block_with_the_part_zeroed() {
        let model = tiny();
        for (rows, past) in [(1, 40), (9, 0), (5, 17)] {
            let mut no_ffn = tiny();
            match &mut no_ffn.weights.layers[1].ffn {
                crate::Ffn::Dense(ffn) => zeroed(&mut ffn.down),
                crate::Ffn::Routed(_) => unreachable!("the tiny model is dense"),
            }
            assert_eq!(
                run(&model, 2, BlockPart::WithoutFfn, rows, past),
                run(&no_ffn, 2, BlockPart::Whole, rows, past),
                "{rows} rows over {past}"
            );
            let mut no_attention = tiny();
            zeroed(&mut no_attention.weights.layers[1].wo);
            assert_eq!(
                run(&model, 2, BlockPart::WithoutAttention, rows, past),
                run(&no_attention, 2, BlockPart::Whole, rows, past),
                "{rows} rows over {past}"
            );
            // Each part changes the block's output.
            let whole = run(&model, 2, BlockPart::Whole, rows, past);
            assert_ne!(whole, run(&model, 2, BlockPart::WithoutFfn, rows, past));
            assert_ne!(
                whole,
                run(&model, 2, BlockPart::WithoutAttention, rows, past)
            );
        }
    }

    #[test]
    fn attention_core_is_the_softmax_average_of_the_values() {
        let model = tiny();
        let cfg = &model.config;
        let (rows, past) = (3, 6);
        let out = run(&model, 2, BlockPart::AttentionCore, rows, past);
        let input = values(rows * BlockPart::AttentionCore.input_width(cfg), 3);
        let (qd, kvd, hd) = (cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let group = cfg.n_head / cfg.n_head_kv;
        // Position `pos` of a KV head in layer 1: from the cache, or from a new row.
        let key_or_value = |pos: usize, head: usize, value: bool| -> Vec<f32> {
            if pos < past {
                written(cfg, 1, head, past, value)[pos * hd..(pos + 1) * hd].to_vec()
            } else {
                let at = (pos - past) * (qd + 2 * kvd) + qd + usize::from(value) * kvd;
                input[at + head * hd..at + (head + 1) * hd].to_vec()
            }
        };
        for r in 0..rows {
            for h in 0..cfg.n_head {
                let q = &input[r * (qd + 2 * kvd) + h * hd..][..hd];
                let n = past + r + 1;
                let scores: Vec<f64> = (0..n)
                    .map(|p| {
                        let k = key_or_value(p, h / group, false);
                        q.iter().zip(&k).map(|(a, b)| (a * b) as f64).sum::<f64>()
                            * cfg.attention_scale as f64
                    })
                    .collect();
                let top = scores.iter().cloned().fold(f64::MIN, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                for d in 0..hd {
                    let expected: f64 = (0..n)
                        .map(|p| weights[p] / total * key_or_value(p, h / group, true)[d] as f64)
                        .sum();
                    let got = out[r * qd + h * hd + d] as f64;
                    assert!((got - expected).abs() < 1e-4, "row {r} head {h} dim {d}");
                }
            }
        }
    }

    /// The keys (or values) [`cache`] writes for one (layer, head).
    fn written(cfg: &ModelConfig, layer: usize, head: usize, n: usize, value: bool) -> Vec<f32> {
        let seed = if value {
            layer * 37 + head + 5
        } else {
            layer * 31 + head
        };
        values(n * cfg.head_dim, seed as u32)
    }

    #[test]
    fn block_runs_are_the_same_on_any_thread_count() {
        let model = tiny();
        for part in BlockPart::ALL {
            for (rows, past) in [(1, 33), (7, 5)] {
                assert_eq!(
                    run(&model, 1, part, rows, past),
                    run(&model, 3, part, rows, past),
                    "{part:?}"
                );
            }
        }
    }

    #[test]
    fn blocks_in_sequence_then_the_head_are_the_forward_pass() {
        let model = tiny();
        let cfg = &model.config;
        let pool = ThreadPool::new(2).unwrap();
        let tokens = [5u32, 17, 3, 99, 42, 7];
        let mut kv = model.new_kv_cache(16);
        let expected = model
            .forward(
                &pool,
                &tokens,
                &mut kv,
                &mut Scratch::default(),
                LogitsFor::All,
            )
            .unwrap();
        let mut blocks_kv = model.new_kv_cache(16);
        let mut hidden = vec![0.0; tokens.len() * cfg.n_embd];
        for (row, &t) in hidden.chunks_exact_mut(cfg.n_embd).zip(&tokens) {
            model.weights.embed(t as usize, row);
        }
        let mut out = vec![0.0; hidden.len()];
        for layer in 0..cfg.n_layer {
            model
                .run_block(
                    &pool,
                    layer,
                    BlockPart::Whole,
                    &hidden,
                    &mut out,
                    &mut blocks_kv,
                    &mut Scratch::default(),
                )
                .unwrap();
            std::mem::swap(&mut hidden, &mut out);
        }
        assert_eq!(model.logits_of(&pool, &hidden), expected);
    }

    #[test]
    fn bad_shapes_are_errors() {
        let model = tiny();
        let pool = ThreadPool::new(1).unwrap();
        let mut kv = model.new_kv_cache(8);
        let e = model.config.n_embd;
        let mut scratch = Scratch::default();
        let mut out = vec![0.0; e];
        let bad_layer = model.run_block(
            &pool,
            99,
            BlockPart::Whole,
            &vec![0.0; e],
            &mut out,
            &mut kv,
            &mut scratch,
        );
        assert!(bad_layer.unwrap_err().to_string().contains("layer 99"));
        let ragged = model.run_block(
            &pool,
            0,
            BlockPart::Whole,
            &vec![0.0; e + 1],
            &mut out,
            &mut kv,
            &mut scratch,
        );
        assert!(ragged.is_err());
    }
}
