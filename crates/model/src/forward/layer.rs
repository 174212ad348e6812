//! The steps of one layer as the region's threads run them: embedding, the attention and
//! feed-forward halves with their norms and residual adds, and the final norm and output
//! projection. Each step splits its work statically and ends at a barrier.

use pyramid_kernels::ops::{
    add_in_place, gelu_tanh_mul_in_place, rms_norm, rms_norm_in_place, rope_in_place,
    silu_mul_in_place,
};
use pyramid_kernels::{SharedSlice, Team, COLUMN_ALIGN};

use super::scratch::{Buffers, Pass};
use crate::block::BlockPart;
use crate::config::Activation;
use crate::linear::{Linear, PreparedInput, Site};
use crate::weights::{Ffn, GatedFfn, LayerWeights};
use crate::Model;

impl Model {
    /// One thread's part of the whole pass.
    pub(super) fn region(&self, team: &Team, pass: &Pass<'_, '_>) {
        self.embed_rows(team, pass);
        for (li, layer) in self.weights.layers.iter().enumerate() {
            self.layer(team, pass, li, layer);
        }
        self.finish(team, pass);
    }

    /// One thread's part of a block run alone: `input`'s rows into the block's buffers,
    /// the block's part, and its result into `output`.
    pub(super) fn block_region(
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
    pub(super) fn embed_rows(&self, team: &Team, pass: &Pass<'_, '_>) {
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
    pub(super) fn layer(&self, team: &Team, pass: &Pass<'_, '_>, li: usize, layer: &LayerWeights) {
        match pass.part {
            BlockPart::AttentionCore => self.attention_core(team, pass, li),
            part => {
                if part != BlockPart::WithoutAttention {
                    self.attention_half(team, pass, li, layer);
                }
                if part != BlockPart::WithoutFfn {
                    let add_attention = part != BlockPart::WithoutAttention;
                    match &layer.ffn {
                        Ffn::Dense(ffn) => self.ffn_half(team, pass, li, layer, ffn, add_attention),
                        Ffn::Routed(routed) => {
                            self.routed_ffn_half(team, pass, li, layer, routed, add_attention)
                        }
                    }
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
        let rotates = cfg.layer_rotates(li);
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
                if rotates {
                    rope_in_place(q_r, hd, pos, inv_freq, style, cfg.rope_scale);
                    rope_in_place(k_r, hd, pos, inv_freq, style, cfg.rope_scale);
                }
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
        ffn: &GatedFfn,
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
                &ffn.gate,
            )
        };
        team.sync();
        unsafe {
            pass.record(team, li, Site::FfnIn, b.h.as_slice(), e);
            let my_cols = team.split(cfg.n_ff, COLUMN_ALIGN);
            gated_cols(
                ffn,
                cfg.activation,
                b.h.as_slice(),
                &b.prepared,
                (&b.gate, &b.up),
                n,
                my_cols,
            );
        }
        team.sync();
        unsafe {
            pass.record(team, li, Site::FfnDown, b.gate.as_slice(), cfg.n_ff);
        }
        self.prepared_project(team, &ffn.down, &b.gate, &b.o, n, pass);
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
    /// whose logits are wanted; pooled rows are normed into `h`, where nothing reads them
    /// until the pass is over.
    pub(super) fn finish(&self, team: &Team, pass: &Pass<'_, '_>) {
        let (cfg, w, b) = (&self.config, &self.weights, &pass.bufs);
        let e = cfg.n_embd;
        let n_rows = pass.logit_rows.len();
        let my_logit_rows = team.split(n_rows, 1);
        // SAFETY: the last layer's barrier completed `x` and `o`; each thread norms only
        // its own split of the logit rows and of the pooled rows (a pooled row is never a
        // logit row), and nothing reads `h` again in this pass.
        unsafe {
            // Row `r`'s last residual, then the final norm into `out`.
            let final_norm = |r: usize, out: &mut [f32]| {
                let x = b.x.range_mut(r * e..(r + 1) * e);
                add_in_place(x, b.o.range(r * e..(r + 1) * e));
                rms_norm(out, x, &w.output_norm, cfg.rms_eps);
            };
            for &r in &pass.pooled_rows[team.split(pass.pooled_rows.len(), 1)] {
                final_norm(r, b.h.range_mut(r * e..(r + 1) * e));
            }
            for i in my_logit_rows.clone() {
                final_norm(pass.logit_rows[i], b.normed.range_mut(i * e..(i + 1) * e));
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
    pub(super) unsafe fn residual_norm(
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
}

/// This thread's columns `cols` of a gated FFN's hidden rows, `gate = act(gate(x)) · up(x)`
/// for the `n` rows of `input` (`out`: the `gate` and `up` buffers, `[n, n_ff]`), the
/// activation applied to the columns just produced: no extra pass over memory.
///
/// # Safety
/// As [`Linear::forward_cols`] for both outputs, with columns split by the team.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gated_cols(
    ffn: &GatedFfn,
    activation: Activation,
    input: &[f32],
    prepared: &PreparedInput<'_>,
    (gate, up): (&SharedSlice<'_, f32>, &SharedSlice<'_, f32>),
    n: usize,
    cols: std::ops::Range<usize>,
) {
    ffn.gate
        .forward_cols(input, prepared, None, gate, n, cols.clone());
    ffn.up
        .forward_cols(input, prepared, None, up, n, cols.clone());
    let n_ff = ffn.gate.n_out();
    for r in 0..n {
        let row = r * n_ff + cols.start..r * n_ff + cols.end;
        let (g, u) = (gate.range_mut(row.clone()), up.range(row));
        match activation {
            Activation::Silu => silu_mul_in_place(g, u),
            Activation::GeluTanh => gelu_tanh_mul_in_place(g, u),
        }
    }
}

/// This thread's columns of `out = lin(input) (+ bias)`.
///
/// # Safety
/// As [`Linear::forward_cols`], with columns split by the team.
pub(super) unsafe fn project(
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
