//! The f32 reference forward pass: the readable definition every fast path is checked
//! against. One function per block of the model, top to bottom.

use pyramid_kernels::ops::{
    add_in_place, attention_scores, attention_scores_i8, rms_norm, rope_in_place,
    silu_mul_in_place, softmax_in_place, weighted_sum, weighted_sum_i8,
};
use pyramid_kernels::{split_range, SharedMut, ThreadPool};

use crate::kv_cache::{HeadView, KvCache};
use crate::linear::{Calibration, LinearScratch, Site};
use crate::weights::LayerWeights;
use crate::{Model, ModelError, Result};

/// Which positions of a forward pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last token: what generation needs.
    Last,
    /// Every token: what tests comparing prefill strategies need.
    All,
}

/// One sequence's share of a forward pass: its new tokens and its cache. The tokens take
/// positions `kv.len()..` and attend to the cache and, causally, to each other.
#[derive(Debug)]
pub struct Segment<'a> {
    pub tokens: &'a [u32],
    pub kv: &'a mut KvCache,
}

/// Where a row of the batch belongs.
#[derive(Debug, Clone, Copy)]
struct RowPlace {
    segment: usize,
    pos: usize,
}

/// Activations of one forward pass, reused between calls to avoid reallocating per token.
#[derive(Debug, Default)]
pub struct Scratch {
    places: Vec<RowPlace>, // [n_tokens]
    x: Vec<f32>,           // [n_tokens, n_embd] residual stream
    h: Vec<f32>,           // [n_tokens, n_embd] normed input of a block
    q: Vec<f32>,           // [n_tokens, q_dim]
    k: Vec<f32>,           // [n_tokens, kv_dim]
    v: Vec<f32>,           // [n_tokens, kv_dim]
    attn: Vec<f32>,        // [n_tokens, q_dim]
    o: Vec<f32>,           // [n_tokens, n_embd]
    gate: Vec<f32>,        // [n_tokens, n_ff]
    up: Vec<f32>,          // [n_tokens, n_ff]
    linear: LinearScratch,
    /// When set, every projection input's per-channel peaks are recorded here.
    pub calibration: Option<Calibration>,
}

fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

impl Model {
    /// Runs `tokens` at positions `kv.len()..` and appends their keys and values to `kv`.
    /// Returns logits `[n_rows, n_vocab]` for the rows `which` selects.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        tokens: &[u32],
        kv: &mut KvCache,
        scratch: &mut Scratch,
        which: LogitsFor,
    ) -> Result<Vec<f32>> {
        self.forward_batch(pool, &mut [Segment { tokens, kv }], scratch, which)
    }

    /// Runs several sequences in one pass: every projection reads its weights once for all
    /// rows, while each sequence attends only to its own cache. Prefill is one segment of
    /// many tokens; batched decode is many segments of one token; they may be mixed.
    /// Returns logits `[n_rows, n_vocab]`: with [`LogitsFor::Last`] one row per segment,
    /// with [`LogitsFor::All`] every row, in segment order.
    pub fn forward_batch(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        scratch: &mut Scratch,
        which: LogitsFor,
    ) -> Result<Vec<f32>> {
        let cfg = &self.config;
        if segments.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        for seg in segments.iter() {
            if seg.tokens.is_empty() {
                return Err(ModelError::EmptyInput);
            }
            if let Some(&id) = seg.tokens.iter().find(|&&id| id as usize >= cfg.n_vocab) {
                return Err(ModelError::TokenOutOfRange {
                    id,
                    n_vocab: cfg.n_vocab,
                });
            }
            let needed = seg.kv.len() + seg.tokens.len();
            if needed > cfg.n_ctx_train {
                return Err(ModelError::ContextLengthExceeded {
                    needed,
                    n_ctx: cfg.n_ctx_train,
                });
            }
            seg.kv.check_room(seg.tokens.len())?;
        }

        let e = cfg.n_embd;
        scratch.places.clear();
        for (segment, seg) in segments.iter().enumerate() {
            let pos0 = seg.kv.len();
            scratch
                .places
                .extend((0..seg.tokens.len()).map(|t| RowPlace {
                    segment,
                    pos: pos0 + t,
                }));
        }
        let n = scratch.places.len();
        let x = sized(&mut scratch.x, n * e);
        let all_tokens = segments.iter().flat_map(|seg| seg.tokens.iter());
        for (row, &id) in x.chunks_exact_mut(e).zip(all_tokens) {
            row.copy_from_slice(self.weights.token_embd.row(id as usize));
        }
        for (layer_idx, layer) in self.weights.layers.iter().enumerate() {
            self.attention_block(pool, layer_idx, layer, n, segments, scratch);
            self.ffn_block(pool, layer_idx, layer, n, scratch);
        }
        for seg in segments.iter_mut() {
            seg.kv.advance(seg.tokens.len());
        }

        let rows: Vec<usize> = match which {
            LogitsFor::All => (0..n).collect(),
            LogitsFor::Last => segments
                .iter()
                .scan(0, |end, seg| {
                    *end += seg.tokens.len();
                    Some(*end - 1)
                })
                .collect(),
        };
        let n_rows = rows.len();
        let mut normed = vec![0.0; n_rows * e];
        for (out, &r) in normed.chunks_exact_mut(e).zip(&rows) {
            rms_norm(
                out,
                &scratch.x[r * e..(r + 1) * e],
                &self.weights.output_norm,
                cfg.rms_eps,
            );
        }
        if let Some(c) = &mut scratch.calibration {
            c.record(0, Site::Head, &normed, e);
        }
        let mut logits = vec![0.0; n_rows * cfg.n_vocab];
        self.weights.output.forward(
            pool,
            &normed,
            None,
            &mut logits,
            n_rows,
            &mut scratch.linear,
        );
        Ok(logits)
    }

    fn attention_block(
        &self,
        pool: &ThreadPool,
        layer_idx: usize,
        layer: &LayerWeights,
        n: usize,
        segments: &mut [Segment<'_>],
        s: &mut Scratch,
    ) {
        let cfg = &self.config;
        let (e, qd, kvd, hd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let h = sized(&mut s.h, n * e);
        rms_norm(h, &s.x[..n * e], &layer.attn_norm, cfg.rms_eps);
        if let Some(c) = &mut s.calibration {
            c.record(layer_idx, Site::AttnIn, h, e);
        }
        let q = sized(&mut s.q, n * qd);
        let k = sized(&mut s.k, n * kvd);
        let v = sized(&mut s.v, n * kvd);
        layer
            .wq
            .forward(pool, h, layer.bq.as_deref(), q, n, &mut s.linear);
        layer
            .wk
            .forward(pool, h, layer.bk.as_deref(), k, n, &mut s.linear);
        layer
            .wv
            .forward(pool, h, layer.bv.as_deref(), v, n, &mut s.linear);

        let style = cfg.arch.rope_style();
        for (t, place) in s.places.iter().enumerate() {
            let (q_t, k_t, v_t) = (
                t * qd..(t + 1) * qd,
                t * kvd..(t + 1) * kvd,
                t * kvd..(t + 1) * kvd,
            );
            rope_in_place(&mut q[q_t], hd, place.pos, &self.rope_inv_freq, style);
            rope_in_place(
                &mut k[k_t.clone()],
                hd,
                place.pos,
                &self.rope_inv_freq,
                style,
            );
            segments[place.segment]
                .kv
                .store(layer_idx, place.pos, &k[k_t], &v[v_t]);
        }

        let attn = sized(&mut s.attn, n * qd);
        let caches: Vec<&KvCache> = segments.iter().map(|seg| &*seg.kv).collect();
        let shape = HeadShape {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: hd,
        };
        attend(pool, shape, layer_idx, &s.places, q, &caches, attn);

        let o = sized(&mut s.o, n * e);
        if let Some(c) = &mut s.calibration {
            c.record(layer_idx, Site::AttnOut, attn, qd);
        }
        layer.wo.forward(pool, attn, None, o, n, &mut s.linear);
        add_in_place(&mut s.x[..n * e], o);
    }

    fn ffn_block(
        &self,
        pool: &ThreadPool,
        layer_idx: usize,
        layer: &LayerWeights,
        n: usize,
        s: &mut Scratch,
    ) {
        let cfg = &self.config;
        let (e, ff) = (cfg.n_embd, cfg.n_ff);
        let h = sized(&mut s.h, n * e);
        rms_norm(h, &s.x[..n * e], &layer.ffn_norm, cfg.rms_eps);
        if let Some(c) = &mut s.calibration {
            c.record(layer_idx, Site::FfnIn, h, e);
        }
        let gate = sized(&mut s.gate, n * ff);
        let up = sized(&mut s.up, n * ff);
        layer.w_gate.forward(pool, h, None, gate, n, &mut s.linear);
        layer.w_up.forward(pool, h, None, up, n, &mut s.linear);
        silu_mul_in_place(gate, up);
        if let Some(c) = &mut s.calibration {
            c.record(layer_idx, Site::FfnDown, gate, ff);
        }
        let o = sized(&mut s.o, n * e);
        layer.w_down.forward(pool, gate, None, o, n, &mut s.linear);
        add_in_place(&mut s.x[..n * e], o);
    }
}

#[derive(Debug, Clone, Copy)]
struct HeadShape {
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
}

/// Causal grouped-query attention for every row, whose keys and values are already in
/// its segment's cache. Threads split the (row, head) pairs.
fn attend(
    pool: &ThreadPool,
    shape: HeadShape,
    layer_idx: usize,
    places: &[RowPlace],
    q: &[f32], // [n, n_head * head_dim]
    caches: &[&KvCache],
    out: &mut [f32], // [n, n_head * head_dim]
) {
    let HeadShape {
        n_head,
        n_head_kv,
        head_dim,
    } = shape;
    let qd = n_head * head_dim;
    let group = n_head / n_head_kv;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let out_ptr = SharedMut::new(out);
    let n_items = places.len() * n_head;
    pool.run(&|thread_idx| {
        let mut scores = Vec::new();
        for item in split_range(n_items, pool.n_threads(), thread_idx, 1) {
            let (t, head) = (item / n_head, item % n_head);
            let place = places[t];
            let n_pos = place.pos + 1; // causal: attend to itself and everything before
            let kv_head = head / group;
            let kv = caches[place.segment];
            let q_h = &q[t * qd + head * head_dim..t * qd + (head + 1) * head_dim];
            // SAFETY: (row, head) pairs are split disjointly between threads, so this
            // head_dim-long slice of `out` is written by this thread only.
            let o = unsafe {
                std::slice::from_raw_parts_mut(
                    out_ptr.get().add(t * qd + head * head_dim),
                    head_dim,
                )
            };
            match kv.head(layer_idx, kv_head, n_pos) {
                HeadView::F32 { keys, values } => {
                    attention_scores(q_h, keys, scale, &mut scores);
                    softmax_in_place(&mut scores);
                    weighted_sum(&scores, values, o);
                }
                HeadView::Int8 {
                    keys,
                    key_scales,
                    values,
                    value_scales,
                } => {
                    attention_scores_i8(q_h, keys, key_scales, scale, &mut scores);
                    softmax_in_place(&mut scores);
                    weighted_sum_i8(&scores, values, value_scales, o);
                }
            }
        }
    });
}
