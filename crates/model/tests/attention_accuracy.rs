//! The gate a cache type or attention must pass to be a default: against exact attention
//! over an f32 cache, with the same f32 weights (attention is the only difference),
//! teacher-forced on the exact path's greedy tokens, each prompt's mean next-token KL
//! stays within [`MAX_KL`] and greedy decoding keeps the exact path's tokens as often as
//! INT8 weights keep f32's (`precision.rs`'s INT8 claim). The f16 cache passes it on every
//! model and is the default; the INT8 cache, with exact or INT8 products, does not
//! (Qwen2.5's and Gemma 3's keys have outlier channels one scale per row cannot hold), so
//! `--attention int8` is a choice, held here to what it measured.
//!
//! The public reference prompts are short; a long context is what the INT8 products are
//! for, so each model also reads the opening of a public-domain book (`testdata/texts`):
//! 1,024 tokens here, `PYRAMID_LONG_CONTEXT=2048` (the figures below), `8192` or `16384`
//! for those in docs/BENCHMARKS.md.

use pyramid_gguf::GgufFile;
use pyramid_kernels::{ops::argmax, ThreadPool};
use pyramid_model::{Attention, KvType, LogitsFor, Model, Scratch};
use pyramid_testdata::{long_text, model_path, reference_prompts};
use pyramid_tokenizer::Tokenizer;

/// The largest mean next-token KL a prompt may show.
const MAX_KL: f64 = 0.002;

/// Greedy steps compared per prompt.
const N_STEPS: usize = 16;

fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let log_softmax = |logits: &[f32]| {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        logits
            .iter()
            .map(|&l| l as f64 - max - sum.ln())
            .collect::<Vec<_>>()
    };
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

/// The logits before each of `N_STEPS` tokens: after the prompt, then after each of
/// `forced` (or of its own greedy tokens when `forced` is empty), and those tokens.
fn trajectory(
    model: &Model,
    pool: &ThreadPool,
    kv_type: KvType,
    ids: &[u32],
    forced: &[u32],
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut kv = model.new_kv_cache_of(ids.len() + N_STEPS, kv_type);
    let mut scratch = Scratch::default();
    let mut logits = vec![model
        .forward(pool, ids, &mut kv, &mut scratch, LogitsFor::Last)
        .unwrap()];
    let mut tokens = Vec::new();
    while tokens.len() < N_STEPS {
        let next = forced
            .get(tokens.len())
            .copied()
            .unwrap_or_else(|| argmax(logits.last().unwrap()));
        tokens.push(next);
        if tokens.len() < N_STEPS {
            let step = model.forward(pool, &[next], &mut kv, &mut scratch, LogitsFor::Last);
            logits.push(step.unwrap());
        }
    }
    (tokens, logits)
}

/// One arm's figures on one prompt: greedy steps that keep the exact path's tokens, and
/// the mean next-token KL to it.
struct Figures {
    agree: usize,
    kl: f64,
}

/// Per prompt, each of `arms` (cache type and attention) against exact attention over an
/// f32 cache, all with `file`'s f32 weights: attention is the only difference.
fn compare(
    file: &str,
    prompts: &[(String, Vec<u32>)],
    arms: &[(KvType, Attention)],
) -> Vec<Vec<Figures>> {
    let gguf = GgufFile::open(model_path(file)).unwrap();
    let mut model = Model::from_gguf(&gguf).unwrap();
    let pool = ThreadPool::with_available_parallelism();
    let mut results = Vec::new();
    for (id, ids) in prompts {
        model.attention = Attention::Exact;
        let (tokens, exact) = trajectory(&model, &pool, KvType::F32, ids, &[]);
        let mut figures = Vec::new();
        for &(kv_type, attention) in arms {
            model.attention = attention;
            let (_, logits) = trajectory(&model, &pool, kv_type, ids, &tokens);
            let agree = tokens
                .iter()
                .zip(&logits)
                .take_while(|(&t, l)| argmax(l) == t)
                .count();
            let kl = exact
                .iter()
                .zip(&logits)
                .map(|(a, b)| kl(a, b))
                .sum::<f64>()
                / N_STEPS as f64;
            eprintln!(
                "{file} {id:<14} {:>6} tokens  {kv_type} cache, {attention} attention: greedy \
                 agreement {agree:>2}/{N_STEPS}  mean KL {kl:.6}",
                ids.len()
            );
            figures.push(Figures { agree, kl });
        }
        results.push(figures);
    }
    results
}

/// The reference prompts and the long context, tokenised by the model's own tokenizer.
fn prompts(file: &str, golden: &str) -> Vec<(String, Vec<u32>)> {
    let gguf = GgufFile::open(model_path(file)).unwrap();
    let tokenizer = Tokenizer::from_gguf(gguf.metadata()).unwrap();
    let long_len = std::env::var("PYRAMID_LONG_CONTEXT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let mut book = tokenizer.encode(&long_text(), false).unwrap();
    assert!(
        book.len() >= long_len,
        "the book has {} tokens, fewer than {long_len}",
        book.len()
    );
    book.truncate(long_len);
    let mut prompts = reference_prompts(golden);
    prompts.push((format!("book-{long_len}"), book));
    prompts
}

/// What an arm must hold on every prompt of a model.
struct Gate {
    max_kl: f64,
    /// Share of the prompts that keep all 16 greedy tokens, and the mean steps kept.
    min_full_agreement: f64,
    min_mean_prefix: f64,
}

/// The gate, with precision.rs's INT8 claim for greedy agreement.
const GATE: Gate = Gate {
    max_kl: MAX_KL,
    min_full_agreement: 0.75,
    min_mean_prefix: 12.0,
};

fn holds(gate: &Gate, figures: &[&Figures]) -> bool {
    let full = figures.iter().filter(|f| f.agree == N_STEPS).count();
    let mean = figures.iter().map(|f| f.agree as f64).sum::<f64>() / figures.len() as f64;
    figures.iter().all(|f| f.kl <= gate.max_kl)
        && full as f64 >= gate.min_full_agreement * figures.len() as f64
        && mean >= gate.min_mean_prefix
}

/// The f16 cache (the default) must hold the gate; INT8 attention's figures are
/// reported, and held to `int8`, what it measured with a margin.
fn check(file: &str, golden: &str, int8: Gate) {
    let arms = [
        (KvType::F16, Attention::Exact),
        (KvType::Int8, Attention::Int8),
    ];
    let results = compare(file, &prompts(file, golden), &arms);
    let arm = |a: usize| results.iter().map(|r| &r[a]).collect::<Vec<_>>();
    for (a, (kv_type, attention)) in arms.iter().enumerate() {
        eprintln!(
            "{file}: {kv_type} cache, {attention} attention {} the gate",
            if holds(&GATE, &arm(a)) {
                "holds"
            } else {
                "fails"
            }
        );
    }
    assert!(
        holds(&GATE, &arm(0)),
        "{file}: the f16 cache fails the gate"
    );
    assert!(
        holds(&int8, &arm(1)),
        "{file}: INT8 attention lost more than it measured"
    );
}

#[test]
fn smollm2_int8_attention_stays_close_to_exact() {
    check(
        "smollm2-135m-instruct-q4_1.gguf",
        "golden-smollm2-135m-public.json",
        // Measured: KL at most 0.0026 (fibonacci; 0.0014 elsewhere, 0.0010 for the INT8
        // cache alone), 6 of 7 prompts keep all 16 tokens.
        Gate {
            max_kl: 0.004,
            min_full_agreement: 0.75,
            min_mean_prefix: 12.0,
        },
    );
}

#[test]
fn qwen2_int8_attention_stays_close_to_exact() {
    check(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "golden-qwen2.5-coder-0.5b-public.json",
        // Measured: KL 0.0024 to 0.027, as the INT8 cache alone (0.0024 to 0.025: its
        // keys' outlier channels), 4 of 7 prompts keep all 16 tokens, 12.6 on average.
        Gate {
            max_kl: 0.04,
            min_full_agreement: 0.5,
            min_mean_prefix: 10.0,
        },
    );
}

#[test]
fn gemma3_int8_attention_stays_close_to_exact() {
    // Measured: KL 0.0035 to 0.0077 (the INT8 cache alone 0.0023 to 0.0046), 4 of 6
    // prompts keep all 16 tokens, 13.3 on average.
    check(
        "gemma-3-270m-q4_k_m.gguf",
        "golden-gemma3-270m-public.json",
        Gate {
            max_kl: 0.012,
            min_full_agreement: 0.5,
            min_mean_prefix: 10.0,
        },
    );
}
