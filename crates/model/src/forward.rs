//! The f32 reference forward pass: the readable definition every fast path is checked
//! against. One function per block of the model, top to bottom.

use pyramid_kernels::ops::{
    add_in_place, attention_scores, attention_scores_f16, attention_scores_i8, rms_norm,
    rope_in_place, silu_mul_in_place, softmax_in_place, weighted_sum, weighted_sum_f16,
    weighted_sum_i8,
};
use std::sync::Mutex;

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
///
/// The last `n_padding` tokens are padding, there to fill a fixed-shape chunk: their rows
/// go through the projections like any other, but they are never stored in the cache nor
/// attended to, so they cannot change any real token's result.
#[derive(Debug)]
pub struct Segment<'a> {
    pub tokens: &'a [u32],
    pub n_padding: usize,
    pub kv: &'a mut KvCache,
}

impl<'a> Segment<'a> {
    pub fn new(tokens: &'a [u32], kv: &'a mut KvCache) -> Self {
        Self {
            tokens,
            n_padding: 0,
            kv,
        }
    }

    /// Tokens that are real, not padding.
    pub fn n_real(&self) -> usize {
        self.tokens.len() - self.n_padding
    }
}

/// Where a row of the batch belongs.
#[derive(Debug, Clone, Copy)]
struct RowPlace {
    segment: usize,
    pos: usize,
    /// Padding rows are computed but neither cached nor attended.
    padding: bool,
}

/// Activations of one forward pass, reused between calls. [`Scratch::for_shape`] sizes
/// every buffer up front, after which passes of at most that shape never allocate.
#[derive(Debug, Default)]
pub struct Scratch {
    places: Vec<RowPlace>,  // [n_tokens]
    logit_rows: Vec<usize>, // [n_rows] rows whose logits are wanted
    normed: Vec<f32>,       // [n_rows, n_embd]
    logits: Vec<f32>,       // [n_rows, n_vocab]
    /// One attention-score buffer per pool thread: `[window]` each.
    scores: Vec<Mutex<Vec<f32>>>,
    x: Vec<f32>,    // [n_tokens, n_embd] residual stream
    h: Vec<f32>,    // [n_tokens, n_embd] normed input of a block
    q: Vec<f32>,    // [n_tokens, q_dim]
    k: Vec<f32>,    // [n_tokens, kv_dim]
    v: Vec<f32>,    // [n_tokens, kv_dim]
    attn: Vec<f32>, // [n_tokens, q_dim]
    o: Vec<f32>,    // [n_tokens, n_embd]
    gate: Vec<f32>, // [n_tokens, n_ff]
    up: Vec<f32>,   // [n_tokens, n_ff]
    linear: LinearScratch,
    /// When set, every projection input's per-channel peaks are recorded here.
    pub calibration: Option<Calibration>,
}

fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

impl Scratch {
    /// Buffers for passes of up to `n_tokens` rows returning logits for up to `n_outputs`
    /// of them, over caches of up to `window` positions on a pool of `n_threads`,
    /// allocated now so that running never allocates.
    pub fn for_shape(
        model: &Model,
        n_tokens: usize,
        n_outputs: usize,
        window: usize,
        n_threads: usize,
    ) -> Self {
        let cfg = &model.config;
        let (e, qd, kvd, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let with = |len: usize| Vec::with_capacity(len);
        Self {
            places: Vec::with_capacity(n_tokens),
            logit_rows: Vec::with_capacity(n_outputs),
            normed: with(n_outputs * e),
            logits: with(n_outputs * cfg.n_vocab),
            scores: (0..n_threads)
                .map(|_| Mutex::new(Vec::with_capacity(window)))
                .collect(),
            x: with(n_tokens * e),
            h: with(n_tokens * e),
            q: with(n_tokens * qd),
            k: with(n_tokens * kvd),
            v: with(n_tokens * kvd),
            attn: with(n_tokens * qd),
            o: with(n_tokens * e),
            gate: with(n_tokens * ff),
            up: with(n_tokens * ff),
            linear: LinearScratch::for_shape(
                n_tokens,
                e.max(qd).max(ff),
                (n_tokens * e.max(qd).max(ff)).max(n_outputs * cfg.n_vocab),
            ),
            calibration: None,
        }
    }

    /// Bytes the buffers hold reserved (their capacity, not their current length).
    pub fn reserved_bytes(&self) -> usize {
        fn cap<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        let floats = [
            &self.normed,
            &self.logits,
            &self.x,
            &self.h,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.o,
            &self.gate,
            &self.up,
        ];
        let scores: usize = self
            .scores
            .iter()
            .map(|s| cap(&s.lock().unwrap_or_else(|p| p.into_inner())))
            .sum();
        cap(&self.places)
            + cap(&self.logit_rows)
            + floats.into_iter().map(cap).sum::<usize>()
            + scores
            + self.linear.reserved_bytes()
    }

    /// The logits of the last [`Model::forward_into`]: `[n_rows, n_vocab]`.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
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
        self.forward_batch(pool, &mut [Segment::new(tokens, kv)], scratch, which)
    }

    /// Runs several sequences in one pass: every projection reads its weights once for all
    /// rows, while each sequence attends only to its own cache. Prefill is one segment of
    /// many tokens; batched decode is many segments of one token; they may be mixed.
    /// Returns logits `[n_rows, n_vocab]`: with [`LogitsFor::Last`] one row per segment
    /// (its last real token), with [`LogitsFor::All`] every row, in segment order.
    pub fn forward_batch(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        scratch: &mut Scratch,
        which: LogitsFor,
    ) -> Result<Vec<f32>> {
        self.forward_into(pool, segments, scratch, which)?;
        Ok(scratch.logits.clone())
    }

    /// As [`Model::forward_batch`], leaving the logits in [`Scratch::logits`]: with a
    /// scratch from [`Scratch::for_shape`] this allocates nothing.
    pub fn forward_into(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        scratch: &mut Scratch,
        which: LogitsFor,
    ) -> Result<()> {
        let cfg = &self.config;
        if segments.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        for seg in segments.iter() {
            if seg.n_padding >= seg.tokens.len() {
                return Err(ModelError::EmptyInput);
            }
            if let Some(&id) = seg.tokens.iter().find(|&&id| id as usize >= cfg.n_vocab) {
                return Err(ModelError::TokenOutOfRange {
                    id,
                    n_vocab: cfg.n_vocab,
                });
            }
            let needed = seg.kv.len() + seg.n_real();
            if needed > cfg.n_ctx_train {
                return Err(ModelError::ContextLengthExceeded {
                    needed,
                    n_ctx: cfg.n_ctx_train,
                });
            }
            seg.kv.check_room(seg.n_real())?;
        }
        if scratch.scores.len() < pool.n_threads() {
            scratch
                .scores
                .resize_with(pool.n_threads(), Default::default);
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
                    padding: t >= seg.n_real(),
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
            seg.kv.advance(seg.n_real());
        }

        let rows = &mut scratch.logit_rows;
        rows.clear();
        match which {
            LogitsFor::All => rows.extend(0..n),
            LogitsFor::Last => {
                let mut start = 0;
                for seg in segments.iter() {
                    rows.push(start + seg.n_real() - 1);
                    start += seg.tokens.len();
                }
            }
        }
        let n_rows = rows.len();
        let normed = sized(&mut scratch.normed, n_rows * e);
        for (out, &r) in normed.chunks_exact_mut(e).zip(rows.iter()) {
            rms_norm(
                out,
                &scratch.x[r * e..(r + 1) * e],
                &self.weights.output_norm,
                cfg.rms_eps,
            );
        }
        if let Some(c) = &mut scratch.calibration {
            c.record(0, Site::Head, normed, e);
        }
        let logits = sized(&mut scratch.logits, n_rows * cfg.n_vocab);
        self.weights
            .output
            .forward(pool, normed, None, logits, n_rows, &mut scratch.linear);
        Ok(())
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
            if !place.padding {
                segments[place.segment]
                    .kv
                    .store(layer_idx, place.pos, &k[k_t], &v[v_t]);
            }
        }

        let attn = sized(&mut s.attn, n * qd);
        let shape = HeadShape {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim: hd,
        };
        let ctx = AttendInputs {
            layer_idx,
            places: &s.places,
            segments,
            scores: &s.scores,
        };
        attend(pool, shape, &ctx, q, attn);

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

/// What attention reads besides the queries.
struct AttendInputs<'s, 'a> {
    layer_idx: usize,
    places: &'s [RowPlace],
    segments: &'s [Segment<'a>],
    /// Per-thread score buffers.
    scores: &'s [Mutex<Vec<f32>>],
}

/// Causal grouped-query attention for every real row, whose keys and values are already in
/// its segment's cache; padding rows get zeros. Threads split the (row, head) pairs.
fn attend(
    pool: &ThreadPool,
    shape: HeadShape,
    ctx: &AttendInputs<'_, '_>,
    q: &[f32],       // [n, n_head * head_dim]
    out: &mut [f32], // [n, n_head * head_dim]
) {
    let HeadShape {
        n_head,
        n_head_kv,
        head_dim,
    } = shape;
    let AttendInputs {
        layer_idx,
        places,
        segments,
        scores,
    } = *ctx;
    let qd = n_head * head_dim;
    let group = n_head / n_head_kv;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let out_ptr = SharedMut::new(out);
    let n_items = places.len() * n_head;
    pool.run(&|thread_idx| {
        // Each thread locks only its own buffer; an error here means a panic poisoned it.
        let mut scores = scores[thread_idx]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let scores = &mut *scores;
        for item in split_range(n_items, pool.n_threads(), thread_idx, 1) {
            let (t, head) = (item / n_head, item % n_head);
            let place = places[t];
            let n_pos = place.pos + 1; // causal: attend to itself and everything before
            let kv_head = head / group;
            let kv: &KvCache = segments[place.segment].kv;
            let q_h = &q[t * qd + head * head_dim..t * qd + (head + 1) * head_dim];
            // SAFETY: (row, head) pairs are split disjointly between threads, so this
            // head_dim-long slice of `out` is written by this thread only.
            let o = unsafe {
                std::slice::from_raw_parts_mut(
                    out_ptr.get().add(t * qd + head * head_dim),
                    head_dim,
                )
            };
            if place.padding {
                o.fill(0.0);
                continue;
            }
            match kv.head(layer_idx, kv_head, n_pos) {
                HeadView::F32 { keys, values } => {
                    attention_scores(q_h, keys, scale, scores);
                    softmax_in_place(scores);
                    weighted_sum(scores, values, o);
                }
                HeadView::F16 { keys, values } => {
                    attention_scores_f16(q_h, keys, scale, scores);
                    softmax_in_place(scores);
                    weighted_sum_f16(scores, values, o);
                }
                HeadView::Int8 {
                    keys,
                    key_scales,
                    values,
                    value_scales,
                } => {
                    attention_scores_i8(q_h, keys, key_scales, scale, scores);
                    softmax_in_place(scores);
                    weighted_sum_i8(scores, values, value_scales, o);
                }
            }
        }
    });
}
