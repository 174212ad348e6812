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
//!
//! - this file: the pass API (`forward`, `forward_batch`, `forward_into`), the segments a
//!   pass runs and their validation;
//! - `scratch`: the buffers a pass reuses ([`Scratch`]) and its per-pass plan and views;
//! - `layer`: the steps of a layer, each one parallel step between barriers;
//! - `experts`: the steps of a feed-forward block of routed experts;
//! - `attention`: how a layer's attention is dealt out to the threads.

mod attention;
mod experts;
mod layer;
mod scratch;

use std::ops::Range;
use std::sync::Mutex;

use pyramid_kernels::attention::{meeting_len, MAX_ROWS};
use pyramid_kernels::ops::add_in_place;
use pyramid_kernels::{SharedSlice, ThreadPool};

use crate::block::BlockPart;
use crate::kv_cache::KvCache;
use crate::weights::LayerWeights;
use crate::{Model, ModelError, Result};
pub use scratch::Scratch;
use scratch::{at_least, sized, Buffers, Pass, RowPlace, Segments, Widths};

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
    /// generate, a draft's length plus one to verify it in one pass; 0 for a pooled
    /// segment, which returns none.
    pub n_logits: usize,
    /// For an embedding: where the pass adds the hidden states of rows it pools.
    pub pooled: Option<Pooled<'a>>,
}

/// Rows of a segment whose final-normed hidden states a pass adds to `sum`, one row after
/// another in order (so chunks of a text sum what one pass would).
#[derive(Debug)]
pub struct Pooled<'a> {
    /// Relative to the segment's tokens; real tokens only.
    pub rows: Range<usize>,
    /// `[n_embd]`.
    pub sum: &'a mut [f32],
}

impl<'a> Segment<'a> {
    pub fn new(tokens: &'a [u32], kv: &'a mut KvCache) -> Self {
        Self {
            tokens,
            n_padding: 0,
            kv,
            n_logits: 1,
            pooled: None,
        }
    }

    /// A segment of an embedding: no logits, the hidden states of `rows` added to `sum`.
    pub fn pooled(
        tokens: &'a [u32],
        kv: &'a mut KvCache,
        rows: Range<usize>,
        sum: &'a mut [f32],
    ) -> Self {
        Self {
            n_logits: 0,
            pooled: Some(Pooled { rows, sum }),
            ..Self::new(tokens, kv)
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
                    let chunk = match s.pooled.as_mut() {
                        Some(p) => {
                            let from = p.rows.start.clamp(done, end) - done;
                            let to = p.rows.end.clamp(done, end) - done;
                            Segment::pooled(tokens, &mut *s.kv, from..to.max(from), p.sum)
                        }
                        None => Segment::with_logits(tokens, &mut *s.kv, wanted.max(1)),
                    };
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
        scratch.pooled_rows.clear();
        let mut start = 0;
        for seg in segments.iter() {
            let end = start + seg.n_real();
            match (&seg.pooled, which) {
                (Some(p), _) => scratch
                    .pooled_rows
                    .extend(p.rows.clone().map(|r| start + r)),
                (None, LogitsFor::All) => rows.extend(start..start + seg.tokens.len()),
                (None, LogitsFor::Last) => rows.extend(end - seg.n_logits..end),
            }
            start += seg.tokens.len();
        }
        let n_rows = rows.len();
        let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
        let widths = Widths::of(self, n);
        let routes = n * widths.n_used;
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
            gate: SharedSlice::new(sized(&mut s.gate, n * widths.ffn)),
            up: SharedSlice::new(sized(&mut s.up, n * widths.ffn)),
            router: SharedSlice::new(sized(&mut s.router, n * widths.n_expert)),
            route_experts: SharedSlice::new(sized(&mut s.route_experts, routes)),
            route_weights: SharedSlice::new(sized(&mut s.route_weights, routes)),
            grouped: SharedSlice::new(sized(&mut s.grouped, routes)),
            expert_starts: SharedSlice::new(sized(
                &mut s.expert_starts,
                widths.n_expert + usize::from(widths.n_expert > 0),
            )),
            route_slots: SharedSlice::new(sized(&mut s.route_slots, routes)),
            expert_in: SharedSlice::new(sized(&mut s.expert_in, routes * e)),
            expert_out: SharedSlice::new(sized(&mut s.expert_out, routes * e)),
            normed: SharedSlice::new(sized(&mut s.normed, n_rows * e)),
            logits: SharedSlice::new(sized(&mut s.logits, n_rows * cfg.n_vocab)),
            prepared: s.linear.shared(n.max(routes), widths.max_in),
        };
        let pass = Pass {
            places: &s.places,
            blocks: &s.blocks,
            single_rows: &s.single_rows,
            logit_rows: &s.logit_rows,
            pooled_rows: &s.pooled_rows,
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
        let mut pooled = s.pooled_rows.iter();
        for seg in segments.iter_mut() {
            seg.kv.advance(seg.n_real());
            if let Some(p) = seg.pooled.as_mut() {
                // In row order, as the chunks of a longer text continue the same sum.
                for &r in pooled.by_ref().take(p.rows.len()) {
                    add_in_place(p.sum, &s.h[r * e..(r + 1) * e]);
                }
            }
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
            match &seg.pooled {
                Some(p)
                    if seg.n_logits != 0
                        || p.rows.end > seg.n_real()
                        || p.sum.len() != cfg.n_embd =>
                {
                    return Err(ModelError::BadPooling {
                        rows: p.rows.clone(),
                        n_real: seg.n_real(),
                        width: p.sum.len(),
                        n_embd: cfg.n_embd,
                    });
                }
                None if !(1..=seg.n_real()).contains(&seg.n_logits) => {
                    return Err(ModelError::BadLogitRows {
                        n_logits: seg.n_logits,
                        n_real: seg.n_real(),
                    });
                }
                _ => {}
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
}
