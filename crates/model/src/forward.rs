//! The forward pass, as one parallel region per call.
//!
//! The pool's threads enter once ([`ThreadPool::run_team`]) and stay for every layer (a
//! calibration pass that streams its f32 layers from the file enters once per layer). Each
//! layer is a fixed list of steps; a step splits its work statically (rows of the batch,
//! output columns of a projection, or (row, KV head) items of attention) and ends at a
//! barrier, after which its results are visible to every thread. Nothing is spawned or
//! allocated inside, and the serial glue of a layer (norms, RoPE, activation quantisation,
//! residual adds) is split across the threads like the products are.
//!
//! Every element is computed the same way whatever the number of threads, so the f32
//! precision stays the reference the other precisions and the tests compare against.

use std::sync::Mutex;

use pyramid_kernels::attention::{
    attend_rows, attend_rows_shared, can_share, meeting_len, scratch_len, worth_sharing, MAX_GROUP,
    MAX_ROWS,
};
use pyramid_kernels::isa;
use pyramid_kernels::ops::{
    add_in_place, gelu_tanh_mul_in_place, rms_norm, rms_norm_in_place, rope_in_place,
    silu_mul_in_place,
};
use pyramid_kernels::{SharedSlice, Team, ThreadPool, COLUMN_ALIGN};

use crate::block::BlockPart;
use crate::config::Activation;
use crate::kv_cache::KvCache;
use crate::linear::{Calibration, Linear, LinearScratch, PreparedInput, Site};
use crate::weights::LayerWeights;
use crate::{Model, ModelError, Result};

/// Tokens per pass beyond which a segment's tokens are split into passes.
pub const MAX_PASS_TOKENS: usize = 512;

/// Which positions of a forward pass need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsFor {
    /// Each segment's last [`Segment::n_logits`] real tokens: the last one for
    /// generation, more to verify a speculative draft.
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
    /// Real tokens, ending with the last, whose logits [`LogitsFor::Last`] returns: 1 to
    /// generate, a draft's length plus one to verify it in one pass.
    pub n_logits: usize,
}

impl<'a> Segment<'a> {
    pub fn new(tokens: &'a [u32], kv: &'a mut KvCache) -> Self {
        Self {
            tokens,
            n_padding: 0,
            kv,
            n_logits: 1,
        }
    }

    /// A segment returning the logits of its last `n_logits` tokens.
    pub fn with_logits(tokens: &'a [u32], kv: &'a mut KvCache, n_logits: usize) -> Self {
        Self {
            n_logits,
            ..Self::new(tokens, kv)
        }
    }

    /// Tokens that are real, not padding.
    pub fn n_real(&self) -> usize {
        self.tokens.len() - self.n_padding
    }
}

/// Where a pass finds its layers' weights.
#[derive(Clone, Copy)]
pub(crate) enum Layers<'a> {
    /// The model's own.
    Resident,
    /// Loaded by this function one at a time, each dropped once its layer has run.
    Loaded(&'a dyn Fn(usize) -> Result<LayerWeights>),
    /// Part of one resident layer alone ([`Model::run_block`]).
    Block {
        layer: usize,
        part: BlockPart,
        input: &'a [f32],
        output: &'a SharedSlice<'a, f32>,
    },
}

/// Where a row of the batch belongs.
#[derive(Debug, Clone, Copy)]
struct RowPlace {
    token: u32,
    segment: usize,
    pos: usize,
    /// Padding rows are computed but neither cached nor attended.
    padding: bool,
}

/// Activations of one forward pass, reused between calls. [`Scratch::for_shape`] sizes
/// every buffer up front, after which passes of at most that shape never allocate.
#[derive(Debug, Default)]
pub struct Scratch {
    places: Vec<RowPlace>, // [n_tokens]
    /// Runs of consecutive rows of one segment, all real or all padding, at most
    /// `MAX_ROWS` each: `(first row, rows)`. Attention takes a run at a time.
    blocks: Vec<(usize, usize)>,
    /// Every row as a block of its own: what sliding-window layers attend by, since each
    /// row's window starts at a different position.
    single_rows: Vec<(usize, usize)>,
    logit_rows: Vec<usize>, // [n_rows] rows whose logits are wanted
    normed: Vec<f32>,       // [n_rows, n_embd]
    logits: Vec<f32>,       // [n_rows, n_vocab]
    /// One attention-score buffer per pool thread: `[rows of a block, window, MAX_GROUP]`
    /// each (a block is at most `MAX_ROWS` rows of one segment).
    scores: Vec<Mutex<Vec<f32>>>,
    /// Where a team sharing a block's attention meets (`meeting_len` floats).
    meeting: Vec<f32>,
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

/// `buf` grown to `len` floats if shorter, never shrunk: a buffer whose length follows
/// the longest sequence is not cleared again each time a shorter pass comes between.
fn at_least(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    buf
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
            blocks: Vec::with_capacity(n_tokens),
            single_rows: Vec::with_capacity(n_tokens),
            logit_rows: Vec::with_capacity(n_outputs),
            normed: with(n_outputs * e),
            logits: with(n_outputs * cfg.n_vocab),
            scores: (0..n_threads)
                .map(|_| Mutex::new(Vec::with_capacity(scratch_len(window, n_tokens))))
                .collect(),
            meeting: with(if n_threads > 1 {
                meeting_len(window, n_tokens.min(MAX_ROWS), n_threads)
            } else {
                0
            }),
            x: with(n_tokens * e),
            h: with(n_tokens * e),
            q: with(n_tokens * qd),
            k: with(n_tokens * kvd),
            v: with(n_tokens * kvd),
            attn: with(n_tokens * qd),
            o: with(n_tokens * e),
            gate: with(n_tokens * ff),
            up: with(n_tokens * ff),
            linear: LinearScratch::for_shape(n_tokens, e.max(qd).max(ff)),
            calibration: None,
        }
    }

    /// Bytes the buffers hold reserved (their capacity, not their current length).
    pub fn reserved_bytes(&self) -> usize {
        fn cap<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        let floats = [
            &self.meeting,
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
            + cap(&self.blocks)
            + cap(&self.single_rows)
            + cap(&self.logit_rows)
            + floats.into_iter().map(cap).sum::<usize>()
            + scores
            + self.linear.reserved_bytes()
    }

    /// Hands the logits of the last [`Model::forward_into`] (`[n_rows, n_vocab]`) to `out`
    /// and keeps `out`'s buffer for the next pass: an exchange, not a copy of rows that are
    /// a whole vocabulary each (6 MB for 32 SmolLM2 rows). A caller that passes back the
    /// buffer it was handed last time keeps both warm, so steps of one size neither
    /// allocate nor zero anything.
    pub fn swap_logits(&mut self, out: &mut Vec<f32>) {
        std::mem::swap(&mut self.logits, out);
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
    ///
    /// Segments longer than [`MAX_PASS_TOKENS`] run in passes of that many tokens each
    /// (fixed-size chunked prefill): a long prompt then needs buffers for one chunk, not
    /// for the whole prompt, and gives the same results, since every row's arithmetic is
    /// its own.
    pub fn forward_batch(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        scratch: &mut Scratch,
        which: LogitsFor,
    ) -> Result<Vec<f32>> {
        // Padded segments are fixed-shape artifact passes, run as given.
        let chunked = segments.iter().all(|s| s.n_padding == 0)
            && segments.iter().any(|s| s.tokens.len() > MAX_PASS_TOKENS);
        if !chunked {
            self.forward_into(pool, segments, scratch, which)?;
            return Ok(scratch.logits.clone());
        }
        // Every chunk is checked before the first runs, so an error leaves no cache changed.
        self.validate(segments)?;
        let n_vocab = self.config.n_vocab;
        let mut per_segment: Vec<Vec<f32>> = vec![Vec::new(); segments.len()];
        let mut done = 0;
        loop {
            // A chunk returns the rows of its segment's last `n_logits` it holds, and
            // otherwise one row, which is dropped.
            let (owners, mut chunks): (Vec<(usize, usize)>, Vec<Segment<'_>>) = segments
                .iter_mut()
                .enumerate()
                .filter(|(_, s)| done < s.tokens.len())
                .map(|(i, s)| {
                    let len = s.tokens.len();
                    let end = (done + MAX_PASS_TOKENS).min(len);
                    let wanted = end.saturating_sub(len - s.n_logits).min(end - done);
                    let tokens = &s.tokens[done..end];
                    let chunk = Segment::with_logits(tokens, &mut *s.kv, wanted.max(1));
                    ((i, wanted), chunk)
                })
                .unzip();
            if chunks.is_empty() {
                break;
            }
            self.forward_into(pool, &mut chunks, scratch, which)?;
            let mut rows = scratch.logits.chunks_exact(n_vocab);
            for ((owner, wanted), chunk) in owners.into_iter().zip(&chunks) {
                let (n_rows, kept) = match which {
                    LogitsFor::All => (chunk.tokens.len(), chunk.tokens.len()),
                    LogitsFor::Last => (chunk.n_logits, wanted),
                };
                for row in rows.by_ref().take(n_rows).skip(n_rows - kept) {
                    per_segment[owner].extend_from_slice(row);
                }
            }
            done += MAX_PASS_TOKENS;
        }
        Ok(per_segment.concat())
    }

    /// As [`Model::forward_batch`], leaving the logits in the scratch (see
    /// [`Scratch::swap_logits`]): with a scratch from [`Scratch::for_shape`] this allocates
    /// nothing.
    pub fn forward_into(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        scratch: &mut Scratch,
        which: LogitsFor,
    ) -> Result<()> {
        self.run_pass(pool, segments, scratch, which, Layers::Resident)
    }

    /// As [`Model::forward_into`], with the layers' weights from `layers`.
    pub(crate) fn run_pass(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        scratch: &mut Scratch,
        which: LogitsFor,
        layers: Layers<'_>,
    ) -> Result<()> {
        let cfg = &self.config;
        self.validate(segments)?;
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
                .extend(seg.tokens.iter().enumerate().map(|(t, &token)| RowPlace {
                    token,
                    segment,
                    pos: pos0 + t,
                    padding: t >= seg.n_real(),
                }));
        }
        let n = scratch.places.len();
        scratch.blocks.clear();
        for (i, place) in scratch.places.iter().enumerate() {
            match scratch.blocks.last_mut() {
                Some((first, len))
                    if *len < MAX_ROWS
                        && scratch.places[*first].segment == place.segment
                        && scratch.places[*first].padding == place.padding =>
                {
                    *len += 1
                }
                _ => scratch.blocks.push((i, 1)),
            }
        }
        scratch.single_rows.clear();
        if cfg.sliding_window.is_some() {
            scratch.single_rows.extend((0..n).map(|r| (r, 1)));
        }
        let rows = &mut scratch.logit_rows;
        rows.clear();
        match which {
            LogitsFor::All => rows.extend(0..n),
            LogitsFor::Last => {
                let mut start = 0;
                for seg in segments.iter() {
                    let end = start + seg.n_real();
                    rows.extend(end - seg.n_logits..end);
                    start += seg.tokens.len();
                }
            }
        }
        let n_rows = rows.len();
        let (qd, kvd, ff) = (cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let meeting = match pool.n_threads() {
            1 => 0,
            n_threads => {
                let longest = scratch.places.iter().map(|p| p.pos + 1).max();
                let rows = scratch.blocks.iter().map(|b| b.1).max();
                meeting_len(longest.unwrap_or(0), rows.unwrap_or(0), n_threads)
            }
        };
        let s = scratch;
        let bufs = Buffers {
            meeting: SharedSlice::new(at_least(&mut s.meeting, meeting)),
            x: SharedSlice::new(sized(&mut s.x, n * e)),
            h: SharedSlice::new(sized(&mut s.h, n * e)),
            q: SharedSlice::new(sized(&mut s.q, n * qd)),
            k: SharedSlice::new(sized(&mut s.k, n * kvd)),
            v: SharedSlice::new(sized(&mut s.v, n * kvd)),
            attn: SharedSlice::new(sized(&mut s.attn, n * qd)),
            o: SharedSlice::new(sized(&mut s.o, n * e)),
            gate: SharedSlice::new(sized(&mut s.gate, n * ff)),
            up: SharedSlice::new(sized(&mut s.up, n * ff)),
            normed: SharedSlice::new(sized(&mut s.normed, n_rows * e)),
            logits: SharedSlice::new(sized(&mut s.logits, n_rows * cfg.n_vocab)),
            prepared: s.linear.shared(n, e.max(qd).max(ff)),
        };
        let pass = Pass {
            places: &s.places,
            blocks: &s.blocks,
            single_rows: &s.single_rows,
            logit_rows: &s.logit_rows,
            segments: Segments::new(segments),
            scores: &s.scores,
            calibration: Mutex::new(s.calibration.as_mut()),
            part: match layers {
                Layers::Block { part, .. } => part,
                _ => BlockPart::Whole,
            },
            chained: !matches!(layers, Layers::Block { .. }),
            bufs,
        };
        match layers {
            Layers::Resident => pool.run_team(&|team| self.region(team, &pass)),
            Layers::Block {
                layer,
                input,
                output,
                ..
            } => pool.run_team(&|team| self.block_region(team, &pass, layer, input, output)),
            Layers::Loaded(load) => {
                // One region per layer: its weights exist only while it runs.
                pool.run_team(&|team| self.embed_rows(team, &pass));
                for li in 0..cfg.n_layer {
                    let layer = load(li)?;
                    pool.run_team(&|team| self.layer(team, &pass, li, &layer));
                }
                pool.run_team(&|team| self.finish(team, &pass));
            }
        }
        for seg in segments.iter_mut() {
            seg.kv.advance(seg.n_real());
        }
        Ok(())
    }

    /// Checks that every segment can run: real tokens in the vocabulary, room in its cache
    /// and in the model's context.
    fn validate(&self, segments: &[Segment<'_>]) -> Result<()> {
        let cfg = &self.config;
        if segments.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        for seg in segments.iter() {
            if seg.n_padding >= seg.tokens.len() {
                return Err(ModelError::EmptyInput);
            }
            if !(1..=seg.n_real()).contains(&seg.n_logits) {
                return Err(ModelError::BadLogitRows {
                    n_logits: seg.n_logits,
                    n_real: seg.n_real(),
                });
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
        Ok(())
    }

    /// One thread's part of the whole pass.
    fn region(&self, team: &Team, pass: &Pass<'_, '_>) {
        self.embed_rows(team, pass);
        for (li, layer) in self.weights.layers.iter().enumerate() {
            self.layer(team, pass, li, layer);
        }
        self.finish(team, pass);
    }

    /// One thread's part of a block run alone: `input`'s rows into the block's buffers,
    /// the block's part, and its result into `output`.
    fn block_region(
        &self,
        team: &Team,
        pass: &Pass<'_, '_>,
        li: usize,
        input: &[f32],
        output: &SharedSlice<'_, f32>,
    ) {
        let cfg = &self.config;
        let b = &pass.bufs;
        let my_rows = team.split(pass.places.len(), 1);
        let core = pass.part == BlockPart::AttentionCore;
        let (in_w, out_w) = (pass.part.input_width(cfg), pass.part.output_width(cfg));
        let (e, qd, kvd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim());
        // SAFETY: rows are this thread's alone between the barriers; `input` and
        // `output` hold `rows · width` values ([`Model::run_block`] checks).
        unsafe {
            for r in my_rows.clone() {
                let row = &input[r * in_w..(r + 1) * in_w];
                if core {
                    b.q.range_mut(r * qd..(r + 1) * qd)
                        .copy_from_slice(&row[..qd]);
                    b.k.range_mut(r * kvd..(r + 1) * kvd)
                        .copy_from_slice(&row[qd..qd + kvd]);
                    b.v.range_mut(r * kvd..(r + 1) * kvd)
                        .copy_from_slice(&row[qd + kvd..]);
                } else {
                    b.x.range_mut(r * e..(r + 1) * e).copy_from_slice(row);
                }
            }
        }
        team.sync();
        self.layer(team, pass, li, &self.weights.layers[li]);
        team.sync();
        unsafe {
            for r in my_rows {
                let out = output.range_mut(r * out_w..(r + 1) * out_w);
                if core {
                    out.copy_from_slice(b.attn.range(r * qd..(r + 1) * qd));
                } else {
                    out.copy_from_slice(b.x.range(r * e..(r + 1) * e));
                    add_in_place(out, b.o.range(r * e..(r + 1) * e));
                }
            }
        }
    }

    // SAFETY (every block of the steps below): between two barriers each thread writes
    // only its own rows, columns, (row, head) pairs or segments of a buffer, and reads only
    // buffers completed before the last barrier (or before the region began).

    /// This thread's rows of the residual stream, set to their tokens' embeddings.
    fn embed_rows(&self, team: &Team, pass: &Pass<'_, '_>) {
        let e = self.config.n_embd;
        let scale = self.config.embedding_scale;
        for r in team.split(pass.places.len(), 1) {
            let x = unsafe { pass.bufs.x.range_mut(r * e..(r + 1) * e) };
            self.weights.embed(pass.places[r].token as usize, x);
            if scale != 1.0 {
                x.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }

    /// Layer `li` of the pass, ending at a barrier: attention then the FFN, or the part
    /// of them a block measured alone runs.
    fn layer(&self, team: &Team, pass: &Pass<'_, '_>, li: usize, layer: &LayerWeights) {
        match pass.part {
            BlockPart::AttentionCore => self.attention_core(team, pass, li),
            part => {
                if part != BlockPart::WithoutAttention {
                    self.attention_half(team, pass, li, layer);
                }
                if part != BlockPart::WithoutFfn {
                    self.ffn_half(team, pass, li, layer, part != BlockPart::WithoutAttention);
                }
            }
        }
    }

    /// Norm, projections, RoPE, attention and output projection of layer `li`, leaving
    /// the attention's output in `o`; the last step is per row, with no barrier after it.
    fn attention_half(&self, team: &Team, pass: &Pass<'_, '_>, li: usize, layer: &LayerWeights) {
        let cfg = &self.config;
        let (e, qd, kvd, hd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
        let b = &pass.bufs;
        let n = pass.places.len();
        let my_rows = team.split(n, 1);
        // Residual of the previous layer's FFN, then the attention norm.
        let add_previous = li > 0 && pass.chained;
        unsafe {
            self.residual_norm(
                b,
                my_rows.clone(),
                add_previous,
                &layer.attn_norm,
                &layer.wq,
            )
        };
        team.sync();
        unsafe {
            pass.record(team, li, Site::AttnIn, b.h.as_slice(), e);
            for (lin, bias, out) in [
                (&layer.wq, &layer.bq, &b.q),
                (&layer.wk, &layer.bk, &b.k),
                (&layer.wv, &layer.bv, &b.v),
            ] {
                project(
                    team,
                    lin,
                    b.h.as_slice(),
                    &b.prepared,
                    bias.as_deref(),
                    out,
                    n,
                );
            }
        }
        team.sync();
        let style = cfg.arch.rope_style();
        let inv_freq = self.layer_inv_freq(li);
        unsafe {
            for r in my_rows.clone() {
                let pos = pass.places[r].pos;
                let (q_r, k_r) = (
                    b.q.range_mut(r * qd..(r + 1) * qd),
                    b.k.range_mut(r * kvd..(r + 1) * kvd),
                );
                // QK-norm (Gemma 3): each head normalised before it rotates.
                if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                    rms_norm_in_place(q_r, qn, cfg.rms_eps);
                    rms_norm_in_place(k_r, kn, cfg.rms_eps);
                }
                rope_in_place(q_r, hd, pos, inv_freq, style);
                rope_in_place(k_r, hd, pos, inv_freq, style);
            }
        }
        team.sync();
        self.attention_core(team, pass, li);
        unsafe {
            pass.record(team, li, Site::AttnOut, b.attn.as_slice(), qd);
        }
        self.prepared_project(team, &layer.wo, &b.attn, &b.o, n, pass);
        team.sync();
        // The post-attention norm's rows are the ones this thread adds next: no barrier.
        unsafe { self.post_norm(b, my_rows, layer.post_attn_norm.as_deref()) };
    }

    /// The rows' keys and values stored in their caches, then attention, ending at a
    /// barrier with the context in `attn`.
    fn attention_core(&self, team: &Team, pass: &Pass<'_, '_>, li: usize) {
        let kvd = self.config.kv_dim();
        let b = &pass.bufs;
        // Each segment's cache is written by the one thread that owns the segment.
        unsafe {
            let (k, v) = (b.k.as_slice(), b.v.as_slice());
            for seg in team.split(pass.segments.len, 1) {
                let kv = &mut pass.segments.get_mut(seg).kv;
                for (r, place) in pass.places.iter().enumerate() {
                    if place.segment == seg && !place.padding {
                        kv.store(
                            li,
                            place.pos,
                            &k[r * kvd..(r + 1) * kvd],
                            &v[r * kvd..(r + 1) * kvd],
                        );
                    }
                }
            }
        }
        team.sync();
        unsafe { self.attend(team, pass, li) };
        team.sync();
    }

    /// Norm, gated FFN and down projection of layer `li` (its input the residual plus
    /// the attention's output in `o` when `add_attention`), ending at a barrier with the
    /// FFN's output in `o`.
    fn ffn_half(
        &self,
        team: &Team,
        pass: &Pass<'_, '_>,
        li: usize,
        layer: &LayerWeights,
        add_attention: bool,
    ) {
        let cfg = &self.config;
        let e = cfg.n_embd;
        let b = &pass.bufs;
        let n = pass.places.len();
        let my_rows = team.split(n, 1);
        unsafe {
            self.residual_norm(
                b,
                my_rows.clone(),
                add_attention,
                &layer.ffn_norm,
                &layer.w_gate,
            )
        };
        team.sync();
        unsafe {
            pass.record(team, li, Site::FfnIn, b.h.as_slice(), e);
            let h = b.h.as_slice();
            let my_cols = team.split(cfg.n_ff, COLUMN_ALIGN);
            layer
                .w_gate
                .forward_cols(h, &b.prepared, None, &b.gate, n, my_cols.clone());
            layer
                .w_up
                .forward_cols(h, &b.prepared, None, &b.up, n, my_cols.clone());
            // The gated activation on the columns this thread just produced: no extra pass
            // over memory.
            for r in 0..n {
                let cols = r * cfg.n_ff + my_cols.start..r * cfg.n_ff + my_cols.end;
                let (gate, up) = (b.gate.range_mut(cols.clone()), b.up.range(cols));
                match cfg.activation {
                    Activation::Silu => silu_mul_in_place(gate, up),
                    Activation::GeluTanh => gelu_tanh_mul_in_place(gate, up),
                }
            }
        }
        team.sync();
        unsafe {
            pass.record(team, li, Site::FfnDown, b.gate.as_slice(), cfg.n_ff);
        }
        self.prepared_project(team, &layer.w_down, &b.gate, &b.o, n, pass);
        team.sync();
        if let Some(norm) = layer.post_ffn_norm.as_deref() {
            // The next reader of `o` (the next layer, or `finish`) may split rows otherwise.
            unsafe { self.post_norm(b, my_rows, Some(norm)) };
            team.sync();
        }
    }

    /// For this thread's rows: `o = norm(o)` when the block has a post-norm (Gemma 3).
    ///
    /// # Safety
    /// `o` was completed before the last barrier; these rows are this thread's alone.
    unsafe fn post_norm(
        &self,
        b: &Buffers<'_>,
        rows: std::ops::Range<usize>,
        norm: Option<&[f32]>,
    ) {
        let Some(norm) = norm else {
            return;
        };
        let e = self.config.n_embd;
        for r in rows {
            rms_norm_in_place(b.o.range_mut(r * e..(r + 1) * e), norm, self.config.rms_eps);
        }
    }

    /// The RoPE frequencies of layer `li`: sliding-window layers have their own base.
    fn layer_inv_freq(&self, li: usize) -> &[f32] {
        if self.config.layer_window(li).is_some() {
            &self.rope_inv_freq_local
        } else {
            &self.rope_inv_freq
        }
    }

    /// The last residual, the final norm and the output projection, only for the rows
    /// whose logits are wanted.
    fn finish(&self, team: &Team, pass: &Pass<'_, '_>) {
        let (cfg, w, b) = (&self.config, &self.weights, &pass.bufs);
        let e = cfg.n_embd;
        let n_rows = pass.logit_rows.len();
        let my_logit_rows = team.split(n_rows, 1);
        unsafe {
            for i in my_logit_rows.clone() {
                let r = pass.logit_rows[i];
                let x = b.x.range_mut(r * e..(r + 1) * e);
                add_in_place(x, b.o.range(r * e..(r + 1) * e));
                rms_norm(
                    b.normed.range_mut(i * e..(i + 1) * e),
                    x,
                    &w.output_norm,
                    cfg.rms_eps,
                );
            }
            let mine = b
                .normed
                .range(my_logit_rows.start * e..my_logit_rows.end * e);
            w.output.prepare_rows(mine, my_logit_rows, &b.prepared);
        }
        team.sync();
        unsafe {
            pass.record(team, 0, Site::Head, b.normed.as_slice(), e);
            project(
                team,
                &w.output,
                b.normed.as_slice(),
                &b.prepared,
                None,
                &b.logits,
                n_rows,
            );
        }
    }

    /// For this thread's rows: `x += o` (the last block's output) when `add_block_output`,
    /// `h = norm(x)`, and `h` prepared for `first`, the block's first projection.
    ///
    /// # Safety
    /// `o` was completed before the last barrier; these rows are this thread's alone.
    unsafe fn residual_norm(
        &self,
        b: &Buffers<'_>,
        rows: std::ops::Range<usize>,
        add_block_output: bool,
        norm: &[f32],
        first: &Linear,
    ) {
        let e = self.config.n_embd;
        for r in rows.clone() {
            let x = b.x.range_mut(r * e..(r + 1) * e);
            if add_block_output {
                add_in_place(x, b.o.range(r * e..(r + 1) * e));
            }
            rms_norm(
                b.h.range_mut(r * e..(r + 1) * e),
                x,
                norm,
                self.config.rms_eps,
            );
        }
        let mine = b.h.range(rows.start * e..rows.end * e);
        first.prepare_rows(mine, rows, &b.prepared);
    }

    /// `out = lin(input)` as two steps: this thread's rows prepared, a barrier, its columns.
    fn prepared_project(
        &self,
        team: &Team,
        lin: &Linear,
        input: &SharedSlice<'_, f32>,
        out: &SharedSlice<'_, f32>,
        n: usize,
        pass: &Pass<'_, '_>,
    ) {
        // SAFETY: `input` was completed before the caller's last barrier; rows and then
        // columns are split disjointly between the threads.
        unsafe {
            let rows = team.split(n, 1);
            let k = lin.n_in();
            let mine = input.range(rows.start * k..rows.end * k);
            lin.prepare_rows(mine, rows, &pass.bufs.prepared);
            team.sync();
            project(
                team,
                lin,
                input.as_slice(),
                &pass.bufs.prepared,
                None,
                out,
                n,
            );
        }
    }

    /// Causal grouped-query attention for every real row, whose keys and values are already
    /// in its segment's cache; padding rows get zeros.
    ///
    /// # Safety
    /// `q` and the caches are complete and unwritten until the next barrier.
    unsafe fn attend(&self, team: &Team, pass: &Pass<'_, '_>, layer_idx: usize) {
        let cfg = &self.config;
        let (n_head, head_dim) = (cfg.n_head, cfg.head_dim);
        let qd = n_head * head_dim;
        let group = n_head / cfg.n_head_kv;
        let scale = cfg.attention_scale;
        let window = cfg.layer_window(layer_idx);
        let blocks = if window.is_some() {
            pass.single_rows
        } else {
            pass.blocks
        };
        let q = pass.bufs.q.as_slice();
        // Each thread locks only its own buffer; an error here means a panic poisoned it.
        let mut scores = pass.scores[team.idx()]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let scores = &mut *scores;
        // Work items are (block of rows, KV head, run of that head's query heads), dealt
        // round-robin rather than in contiguous runs: a causal row's work grows with its
        // position, so contiguous runs would leave the last rows' thread with most of it.
        // A block's rows and a KV head's query heads go together so its cache is read
        // once for all of them. Items left over after the last whole round over a long
        // cache (a decoding sequence or verified draft whose heads do not divide among
        // the threads) are shared by the whole team instead, each thread reading part of
        // the cache; otherwise heads split into more runs where there would be fewer
        // items than threads.
        let n_threads = team.n_threads();
        let n_kv = cfg.n_head_kv;
        // The cached rows of `kv_head` block `b` attends to, and how many of them its first
        // row sees: causal, back to the layer's window (a windowed block is one row).
        let cached = |b: usize, kv_head: usize| {
            let (t0, n_rows) = blocks[b];
            let place = pass.places[t0];
            let last_pos = place.pos + n_rows;
            let start = window.map_or(0, |w| last_pos.saturating_sub(w));
            let kv: &KvCache = pass.segments.get(place.segment).kv;
            let rows = kv.head(layer_idx, kv_head, last_pos).skip(start, head_dim);
            (rows, place.pos + 1 - start)
        };
        let shareable = n_threads > 1 && can_share(isa::active(), head_dim);
        let shared = |b: usize| {
            shareable && !pass.places[blocks[b].0].padding && worth_sharing(cached(b, 0).0)
        };
        let min_runs = group.div_ceil(MAX_GROUP);
        let wanted = if (0..blocks.len()).all(shared) {
            min_runs
        } else {
            n_threads.div_ceil((blocks.len() * n_kv).max(1))
        };
        let runs = wanted.clamp(min_runs, group);
        let heads_per_run = group.div_ceil(runs);
        let runs = group.div_ceil(heads_per_run);
        let n_items = blocks.len() * n_kv * runs;
        let whole_rounds = n_items - n_items % n_threads;
        // Block, KV head and query heads of an item.
        let item_at = |item: usize| {
            let (b, rest) = (item / (n_kv * runs), item % (n_kv * runs));
            let (kv_head, run) = (rest / runs, rest % runs);
            let first = kv_head * group + run * heads_per_run;
            let last = (first + heads_per_run).min((kv_head + 1) * group);
            (b, kv_head, first..last)
        };
        let mut q_rows: [&[f32]; MAX_ROWS] = Default::default();
        let mut o_rows: [&mut [f32]; MAX_ROWS] = Default::default();
        for item in (team.idx()..n_items).step_by(n_threads) {
            let (b, kv_head, heads) = item_at(item);
            if item >= whole_rounds && shared(b) {
                continue;
            }
            let (t0, n_rows) = blocks[b];
            let place = pass.places[t0];
            for r in 0..n_rows {
                let t = t0 + r;
                let span = t * qd + heads.start * head_dim..t * qd + heads.end * head_dim;
                q_rows[r] = &q[span.clone()];
                o_rows[r] = pass.bufs.attn.range_mut(span);
            }
            let outs = &mut o_rows[..n_rows];
            if place.padding {
                outs.iter_mut().for_each(|o| o.fill(0.0));
                continue;
            }
            let (rows, first_len) = cached(b, kv_head);
            attend_rows(
                &q_rows[..n_rows],
                head_dim,
                rows,
                first_len,
                scale,
                scores,
                outs,
            );
        }
        for item in whole_rounds..n_items {
            let (b, kv_head, heads) = item_at(item);
            if !shared(b) {
                continue;
            }
            let (t0, n_rows) = blocks[b];
            let mut out_at = [0; MAX_ROWS];
            for (r, at) in out_at.iter_mut().enumerate().take(n_rows) {
                *at = (t0 + r) * qd + heads.start * head_dim;
                q_rows[r] = &q[*at..*at + heads.len() * head_dim];
            }
            let (rows, first_len) = cached(b, kv_head);
            // Every thread takes every shared item, in the same order; the call returns
            // at a barrier, with its outputs complete.
            attend_rows_shared(
                team,
                isa::active(),
                &q_rows[..n_rows],
                head_dim,
                rows,
                first_len,
                scale,
                &pass.bufs.meeting,
                &pass.bufs.attn,
                &out_at[..n_rows],
            );
        }
    }
}

/// This thread's columns of `out = lin(input) (+ bias)`.
///
/// # Safety
/// As [`Linear::forward_cols`], with columns split by the team.
unsafe fn project(
    team: &Team,
    lin: &Linear,
    input: &[f32],
    prepared: &PreparedInput<'_>,
    bias: Option<&[f32]>,
    out: &SharedSlice<'_, f32>,
    n: usize,
) {
    let cols = team.split(lin.n_out(), COLUMN_ALIGN);
    lin.forward_cols(input, prepared, bias, out, n, cols);
}

/// The activations of one pass, shared by the region's threads.
struct Buffers<'s> {
    x: SharedSlice<'s, f32>,      // [n, n_embd] residual stream
    h: SharedSlice<'s, f32>,      // [n, n_embd] normed input of a block
    q: SharedSlice<'s, f32>,      // [n, q_dim]
    k: SharedSlice<'s, f32>,      // [n, kv_dim]
    v: SharedSlice<'s, f32>,      // [n, kv_dim]
    attn: SharedSlice<'s, f32>,   // [n, q_dim]
    o: SharedSlice<'s, f32>,      // [n, n_embd] output of a block, added to `x` next step
    gate: SharedSlice<'s, f32>,   // [n, n_ff]
    up: SharedSlice<'s, f32>,     // [n, n_ff]
    normed: SharedSlice<'s, f32>, // [n_rows, n_embd]
    logits: SharedSlice<'s, f32>, // [n_rows, n_vocab]
    prepared: PreparedInput<'s>,
    meeting: SharedSlice<'s, f32>, // where a team sharing a block's attention meets
}

/// Everything a region reads besides the weights.
struct Pass<'s, 'a> {
    places: &'s [RowPlace],
    blocks: &'s [(usize, usize)],
    single_rows: &'s [(usize, usize)],
    logit_rows: &'s [usize],
    segments: Segments<'s, 'a>,
    /// Per-thread attention-score buffers.
    scores: &'s [Mutex<Vec<f32>>],
    /// Only thread 0 records, after the barrier that completes the recorded buffer.
    calibration: Mutex<Option<&'s mut Calibration>>,
    /// What of each block runs: all of it except in a block measured alone.
    part: BlockPart,
    /// Whether a block's input is the previous block's (the residual still to add):
    /// false when a block runs alone on a given input.
    chained: bool,
    bufs: Buffers<'s>,
}

impl Pass<'_, '_> {
    fn record(&self, team: &Team, layer: usize, site: Site, x: &[f32], width: usize) {
        if team.idx() != 0 {
            return;
        }
        let mut calibration = self
            .calibration
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(c) = calibration.as_mut() {
            c.record(layer, site, x, width);
        }
    }
}

/// The pass's segments: written (cache stores) by the thread that owns each, read by all
/// after a barrier.
struct Segments<'s, 'a> {
    ptr: *mut Segment<'a>,
    len: usize,
    _borrow: std::marker::PhantomData<&'s mut [Segment<'a>]>,
}

// SAFETY: access follows the barrier discipline documented on the accessors.
unsafe impl Sync for Segments<'_, '_> {}

impl<'s, 'a> Segments<'s, 'a> {
    fn new(segments: &'s mut [Segment<'a>]) -> Self {
        Self {
            ptr: segments.as_mut_ptr(),
            len: segments.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// # Safety
    /// No other thread accesses segment `idx` until the next barrier.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get_mut(&self, idx: usize) -> &mut Segment<'a> {
        assert!(idx < self.len);
        &mut *self.ptr.add(idx)
    }

    /// # Safety
    /// No thread writes segment `idx` until the next barrier.
    unsafe fn get(&self, idx: usize) -> &Segment<'a> {
        assert!(idx < self.len);
        &*self.ptr.add(idx)
    }
}
