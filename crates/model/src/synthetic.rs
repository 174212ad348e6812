//! Random-weight models with real structure, written as GGUF.
//!
//! Tests use tiny ones to exercise the loader, the tokenizer and the forward pass in
//! milliseconds; the same builder can give any published model's shapes when measuring
//! how cost grows with size. Weights are random, so outputs are meaningless text: these
//! models are for plumbing and invariance tests, never for quality.

use pyramid_gguf::{GgmlType, GgufWriter, Result, Value};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Architecture;

/// Shapes and storage of a synthetic model.
#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    pub arch: Architecture,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub n_ctx: usize,
    /// Storage type of the 2-D weight matrices (norms and biases stay f32).
    pub weight_type: GgmlType,
    /// A separate output matrix instead of reusing the token embeddings.
    pub untied_output: bool,
    /// The vocabulary is padded with filler tokens up to this size (a published model's
    /// vocabulary makes its embedding and output projection cost what they really do).
    pub min_vocab: usize,
    /// Positions a sliding-window layer attends to (Gemma 3 only).
    pub sliding_window: usize,
    pub seed: u64,
}

impl SyntheticSpec {
    /// A model small enough to load and run in milliseconds. A tiny Gemma 3 has six layers,
    /// so that the last is a global one, and windows of 8 positions, so that short prompts
    /// already cross them.
    pub fn tiny(arch: Architecture) -> Self {
        let gemma = arch == Architecture::Gemma3;
        Self {
            arch,
            n_embd: 64,
            n_layer: if gemma { 6 } else { 2 },
            n_head: 4,
            n_head_kv: 2,
            n_ff: 96,
            n_ctx: 256,
            weight_type: GgmlType::F32,
            untied_output: false,
            min_vocab: 0,
            sliding_window: 8,
            seed: 0,
        }
    }

    /// A random-weight model with the shapes of a published one, for measuring how cost
    /// grows with size where real weights are not at hand: `qwen2.5-0.5b`, `-1.5b`, `-3b`,
    /// `-7b`, `llama-3.2-1b`, `-3b`. Weights are stored as Q8_0 to keep the file small.
    pub fn published(name: &str) -> Option<Self> {
        // (arch, n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx, untied)
        let (arch, e, l, h, kv, ff, vocab, ctx, untied) = match name {
            "qwen2.5-0.5b" => (
                Architecture::Qwen2,
                896,
                24,
                14,
                2,
                4864,
                151_936,
                32_768,
                false,
            ),
            "qwen2.5-1.5b" => (
                Architecture::Qwen2,
                1536,
                28,
                12,
                2,
                8960,
                151_936,
                32_768,
                false,
            ),
            "qwen2.5-3b" => (
                Architecture::Qwen2,
                2048,
                36,
                16,
                2,
                11_008,
                151_936,
                32_768,
                false,
            ),
            "qwen2.5-7b" => (
                Architecture::Qwen2,
                3584,
                28,
                28,
                4,
                18_944,
                152_064,
                32_768,
                true,
            ),
            "llama-3.2-1b" => (
                Architecture::Llama,
                2048,
                16,
                32,
                8,
                8192,
                128_256,
                131_072,
                false,
            ),
            "llama-3.2-3b" => (
                Architecture::Llama,
                3072,
                28,
                24,
                8,
                8192,
                128_256,
                131_072,
                false,
            ),
            _ => return None,
        };
        Some(Self {
            arch,
            n_embd: e,
            n_layer: l,
            n_head: h,
            n_head_kv: kv,
            n_ff: ff,
            n_ctx: ctx,
            weight_type: GgmlType::Q8_0,
            untied_output: untied,
            min_vocab: vocab,
            sliding_window: 0,
            seed: 0,
        })
    }

    /// The names [`SyntheticSpec::published`] knows.
    pub const PUBLISHED: [&'static str; 6] = [
        "qwen2.5-0.5b",
        "qwen2.5-1.5b",
        "qwen2.5-3b",
        "qwen2.5-7b",
        "llama-3.2-1b",
        "llama-3.2-3b",
    ];

    /// Parameters in the weight matrices (what the f32 load stage holds, 4 bytes each).
    pub fn n_params(&self) -> usize {
        let hd = self.n_embd / self.n_head;
        let (q, kv) = (self.n_head * hd, self.n_head_kv * hd);
        let vocab = self.min_vocab.max(262);
        let per_layer = self.n_embd * (q + 2 * kv) + q * self.n_embd + 3 * self.n_embd * self.n_ff;
        vocab * self.n_embd * (1 + usize::from(self.untied_output)) + self.n_layer * per_layer
    }
}

/// Special tokens appended after the 256 byte tokens and the merge results.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// ChatML, as Qwen2 and SmolLM2 use it.
const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte-to-character table: printable bytes stand for themselves, the rest are
/// shifted above U+0100 so every token is a printable string. Written here apart from the
/// tokenizer's, so vocabularies built for tests do not depend on the code under test.
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    if printable(b) {
        return char::from(b);
    }
    let shift = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + shift).expect("256 + shift < 512 is a valid char")
}

/// A byte-level BPE vocabulary: 256 byte tokens, a few merges, then the special tokens.
fn vocabulary() -> (Vec<String>, Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let space = byte_char(b' ');
    let merges: Vec<String> = [
        ("h", "e"),
        (&format!("{space}t"), "he"),
        (&space.to_string(), "t"),
    ]
    .iter()
    .map(|(a, b)| format!("{a} {b}"))
    .collect();
    // Merges must apply in rank order; their results become tokens.
    let merges = vec![merges[2].clone(), merges[0].clone(), merges[1].clone()];
    for m in &merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut types = vec![1; tokens.len()];
    for s in SPECIAL_TOKENS {
        tokens.push(s.to_string());
        types.push(3);
    }
    (tokens, merges, types)
}

/// Builds the GGUF of a synthetic model.
pub fn synthetic_gguf(spec: &SyntheticSpec) -> Result<GgufWriter> {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let (mut tokens, merges, mut types) = vocabulary();
    // Filler tokens go before the special ones, which stay last (BOS/EOS ids below).
    let n_filler = spec.min_vocab.saturating_sub(tokens.len());
    let first_special = tokens.len() - SPECIAL_TOKENS.len();
    tokens.splice(
        first_special..first_special,
        (0..n_filler).map(|i| format!("<|filler_{i}|>")),
    );
    types.splice(
        first_special..first_special,
        std::iter::repeat_n(1, n_filler),
    );
    let n_vocab = tokens.len();
    let arch = spec.arch.name();
    let head_dim = spec.n_embd / spec.n_head;
    let (q_dim, kv_dim) = (spec.n_head * head_dim, spec.n_head_kv * head_dim);

    let mut w = GgufWriter::new();
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let bos = (n_vocab - SPECIAL_TOKENS.len()) as u32; // <|endoftext|>
    let eos = (n_vocab - 1) as u32; // <|im_end|>
    w.add_metadata("general.architecture", Value::String(arch.into()))?
        .add_metadata("general.name", Value::String(format!("synthetic-{arch}")))?
        .add_metadata(
            format!("{arch}.context_length"),
            Value::U32(spec.n_ctx as u32),
        )?
        .add_metadata(
            format!("{arch}.embedding_length"),
            Value::U32(spec.n_embd as u32),
        )?
        .add_metadata(
            format!("{arch}.block_count"),
            Value::U32(spec.n_layer as u32),
        )?
        .add_metadata(
            format!("{arch}.feed_forward_length"),
            Value::U32(spec.n_ff as u32),
        )?
        .add_metadata(
            format!("{arch}.attention.head_count"),
            Value::U32(spec.n_head as u32),
        )?
        .add_metadata(
            format!("{arch}.attention.head_count_kv"),
            Value::U32(spec.n_head_kv as u32),
        )?
        .add_metadata(
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        )?
        .add_metadata(format!("{arch}.rope.freq_base"), Value::F32(10_000.0))?
        .add_metadata("tokenizer.ggml.model", Value::String("gpt2".into()))?
        .add_metadata("tokenizer.ggml.pre", Value::String("gpt2".into()))?
        .add_metadata("tokenizer.ggml.tokens", strings(tokens))?
        .add_metadata("tokenizer.ggml.merges", strings(merges))?
        .add_metadata(
            "tokenizer.ggml.token_type",
            Value::Array(types.into_iter().map(Value::I32).collect()),
        )?
        .add_metadata("tokenizer.ggml.bos_token_id", Value::U32(bos))?
        .add_metadata("tokenizer.ggml.eos_token_id", Value::U32(eos))?
        .add_metadata("tokenizer.ggml.add_bos_token", Value::Bool(false))?
        .add_metadata(
            "tokenizer.chat_template",
            Value::String(CHATML_TEMPLATE.into()),
        )?;

    if spec.arch == Architecture::Gemma3 {
        w.add_metadata(
            format!("{arch}.attention.sliding_window"),
            Value::U32(spec.sliding_window as u32),
        )?;
    }

    let mut random = |n: usize, scale: f32| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(-scale..scale)).collect()
    };
    let mut matrix =
        |w: &mut GgufWriter, name: &str, n_out: usize, n_in: usize, ty: GgmlType| -> Result<()> {
            // Scaled so activations keep unit size through the residual stream.
            let scale = 1.0 / (n_in as f32).sqrt();
            w.add_tensor_f32(
                name,
                &[n_in as u64, n_out as u64],
                ty,
                &random(n_out * n_in, scale),
            )
        };
    let ty = spec.weight_type;
    matrix(&mut w, "token_embd.weight", n_vocab, spec.n_embd, ty)?;
    let ones = |n: usize| vec![1.0f32; n];
    for i in 0..spec.n_layer {
        let name = |t: &str| format!("blk.{i}.{t}");
        let e = spec.n_embd as u64;
        w.add_tensor_f32(
            name("attn_norm.weight"),
            &[e],
            GgmlType::F32,
            &ones(spec.n_embd),
        )?;
        matrix(&mut w, &name("attn_q.weight"), q_dim, spec.n_embd, ty)?;
        matrix(&mut w, &name("attn_k.weight"), kv_dim, spec.n_embd, ty)?;
        matrix(&mut w, &name("attn_v.weight"), kv_dim, spec.n_embd, ty)?;
        if spec.arch == Architecture::Qwen2 {
            for (t, n) in [
                ("attn_q.bias", q_dim),
                ("attn_k.bias", kv_dim),
                ("attn_v.bias", kv_dim),
            ] {
                let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.01).collect();
                w.add_tensor_f32(name(t), &[n as u64], GgmlType::F32, &bias)?;
            }
        }
        matrix(&mut w, &name("attn_output.weight"), spec.n_embd, q_dim, ty)?;
        if spec.arch == Architecture::Gemma3 {
            // Norm weights away from 1, so a norm applied twice or not at all shows.
            for (t, n) in [
                ("attn_q_norm.weight", head_dim),
                ("attn_k_norm.weight", head_dim),
                ("post_attention_norm.weight", spec.n_embd),
                ("post_ffw_norm.weight", spec.n_embd),
            ] {
                let norm: Vec<f32> = (0..n).map(|j| 0.6 + (j % 5) as f32 * 0.2).collect();
                w.add_tensor_f32(name(t), &[n as u64], GgmlType::F32, &norm)?;
            }
        }
        w.add_tensor_f32(
            name("ffn_norm.weight"),
            &[e],
            GgmlType::F32,
            &ones(spec.n_embd),
        )?;
        matrix(&mut w, &name("ffn_gate.weight"), spec.n_ff, spec.n_embd, ty)?;
        matrix(&mut w, &name("ffn_up.weight"), spec.n_ff, spec.n_embd, ty)?;
        matrix(&mut w, &name("ffn_down.weight"), spec.n_embd, spec.n_ff, ty)?;
    }
    w.add_tensor_f32(
        "output_norm.weight",
        &[spec.n_embd as u64],
        GgmlType::F32,
        &ones(spec.n_embd),
    )?;
    if spec.untied_output {
        matrix(&mut w, "output.weight", n_vocab, spec.n_embd, ty)?;
    }
    Ok(w)
}

/// Rewrites the type of tensor `name` in a serialised GGUF, leaving its bytes alone: the
/// writer refuses to produce such files, which is exactly why loaders must be tested on
/// them. Panics if the tensor is absent (a test-construction error).
pub fn retype_tensor(gguf: &mut [u8], name: &str, ty: GgmlType) {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let at = gguf
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor name present")
        + needle.len();
    let n_dims = u32::from_le_bytes(gguf[at..at + 4].try_into().expect("4 bytes")) as usize;
    let type_at = at + 4 + 8 * n_dims;
    gguf[type_at..type_at + 4].copy_from_slice(&ty.id().to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2_landmarks() {
        assert_eq!(byte_char(b'A'), 'A');
        assert_eq!(byte_char(b' '), '\u{120}');
        assert_eq!(byte_char(b'\n'), '\u{10A}');
        assert_eq!(byte_char(0), '\u{100}');
        assert_eq!(byte_char(0xAD), '\u{143}');
        assert_eq!(byte_char(b'\t'), '\u{109}');
        assert_eq!(byte_char(0xFF), '\u{FF}');
    }
}
