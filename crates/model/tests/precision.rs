//! bf16, INT8 (W8A8) and INT4 (W4A8) against the f32 reference on the public reference prompts: how long greedy
//! decoding agrees, and the KL divergence of the next-token distributions when both are
//! fed the reference path's tokens (teacher forcing).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use pyramid_gguf::GgufFile;
use pyramid_kernels::{ops::argmax, ThreadPool};
use pyramid_model::linear::{Calibration, CALIBRATION_TEXT};
use pyramid_model::{Embedding, Ffn, KvType, Linear, LogitsFor, Model, Precision, Scratch};
use pyramid_testdata::{model_path, reference_prompts};
use pyramid_tokenizer::Tokenizer;

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    logits.iter().map(|&l| l as f64 - max - sum.ln()).collect()
}

fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

const N_STEPS: usize = 16;

/// The f32 reference on one prompt, teacher-forcing itself: its greedy tokens and the
/// logits before each.
struct Trajectory {
    id: String,
    ids: Vec<u32>,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

/// The f32 reference's trajectories on a model's prompts and its outlier calibration.
struct Reference {
    trajectories: Vec<Trajectory>,
    calibration: Calibration,
}

/// The reference of `file`, computed once and shared by every test of this binary: its
/// f32 forward passes were most of each test's time.
fn reference(file: &str, golden: &str) -> Arc<Reference> {
    static CACHE: Mutex<BTreeMap<String, Arc<Reference>>> = Mutex::new(BTreeMap::new());
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let entry = cache.entry(file.to_string()).or_insert_with(|| {
        let gguf = GgufFile::open(model_path(file)).unwrap();
        let model = Model::from_gguf(&gguf).unwrap();
        let pool = ThreadPool::with_available_parallelism();
        let calibration_tokens = Tokenizer::from_gguf(gguf.metadata())
            .unwrap()
            .encode(CALIBRATION_TEXT, false)
            .unwrap();
        let calibration = model.calibrate(&pool, &calibration_tokens).unwrap();
        let trajectories = reference_prompts(golden)
            .into_iter()
            .map(|(id, ids)| {
                let mut kv = model.new_kv_cache(ids.len() + N_STEPS);
                let mut scratch = Scratch::default();
                let mut logits = vec![model
                    .forward(&pool, &ids, &mut kv, &mut scratch, LogitsFor::Last)
                    .unwrap()];
                let mut tokens = Vec::new();
                loop {
                    let t = argmax(logits.last().unwrap());
                    tokens.push(t);
                    if tokens.len() == N_STEPS {
                        break;
                    }
                    logits.push(
                        model
                            .forward(&pool, &[t], &mut kv, &mut scratch, LogitsFor::Last)
                            .unwrap(),
                    );
                }
                Trajectory {
                    id,
                    ids,
                    tokens,
                    logits,
                }
            })
            .collect();
        Arc::new(Reference {
            trajectories,
            calibration,
        })
    });
    Arc::clone(entry)
}

/// `file`'s model with its per-token outliers left in the INT8 products: what they buy.
fn without_token_outliers(model: &mut Model) {
    let w = &mut model.weights;
    let mut all: Vec<&mut Linear> = vec![&mut w.output];
    if let Embedding::Table(table) = &mut w.token_embd {
        all.push(table.as_mut());
    }
    for l in &mut w.layers {
        all.extend([&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo]);
        let ffns = match &mut l.ffn {
            Ffn::Dense(ffn) => std::slice::from_mut(ffn),
            Ffn::Routed(routed) => routed.experts.as_mut_slice(),
        };
        for ffn in ffns {
            all.extend([&mut ffn.gate, &mut ffn.up, &mut ffn.down]);
        }
    }
    for lin in all {
        if let Linear::Quant(q) = lin {
            q.token_outliers = 0;
        }
    }
}

/// Returns per prompt (agreeing greedy steps, mean KL over the steps).
fn compare(
    file: &str,
    golden: &str,
    precision: Precision,
    calibrate: bool,
) -> Vec<(String, usize, f64)> {
    let reference = reference(file, golden);
    let gguf = GgufFile::open(model_path(file)).unwrap();
    let pool = ThreadPool::with_available_parallelism();
    // `file` reads the file's blocks, which an f32 model no longer has.
    let fast = if precision == Precision::File {
        let mut model = Model::from_gguf_with(&gguf, precision).unwrap();
        if !calibrate {
            without_token_outliers(&mut model);
        }
        model
    } else {
        Model::from_gguf(&gguf)
            .unwrap()
            .into_precision(precision, calibrate.then_some(&reference.calibration))
    };
    let mut results = Vec::new();
    for t in &reference.trajectories {
        let mut kv = fast.new_kv_cache(t.ids.len() + N_STEPS);
        let mut scratch = Scratch::default();
        let mut l_f = fast
            .forward(&pool, &t.ids, &mut kv, &mut scratch, LogitsFor::Last)
            .unwrap();
        let (mut agree, mut diverged, mut kl_sum) = (0, false, 0.0);
        for (step, (&t_r, l_r)) in t.tokens.iter().zip(&t.logits).enumerate() {
            if step > 0 {
                l_f = fast
                    .forward(
                        &pool,
                        &[t.tokens[step - 1]],
                        &mut kv,
                        &mut scratch,
                        LogitsFor::Last,
                    )
                    .unwrap();
            }
            kl_sum += kl(l_r, &l_f);
            diverged |= t_r != argmax(&l_f);
            if !diverged {
                agree += 1;
            }
        }
        results.push((t.id.clone(), agree, kl_sum / N_STEPS as f64));
    }
    results
}

/// What the README claims for a precision, and this test holds.
struct Claim {
    /// Each prompt's mean next-token KL to f32 stays below this.
    max_kl: f64,
    /// At least this share of the prompts gives f32's greedy tokens for all 16 steps.
    min_full_agreement: f64,
    /// Greedy decoding gives f32's tokens for at least this many of the 16 steps, on
    /// average over the prompts, before it first diverges.
    min_mean_prefix: f64,
    /// Quantised precisions must show their outlier channels lowering the mean KL.
    outliers: bool,
}

/// INT8 (the default): f32's greedy tokens for all 16 steps on at least 3 of 4 prompts
/// (5 and 6 of 6 measured), KL < 0.005 on each (at most 0.0021 measured).
const INT8: Claim = Claim {
    max_kl: 0.005,
    min_full_agreement: 0.75,
    min_mean_prefix: 12.0,
    outliers: true,
};

/// INT4: f32's greedy tokens for the first 8 of 16 steps on average (10 and 11 measured),
/// KL < 0.08 on each prompt (at most 0.057 measured).
const INT4: Claim = Claim {
    max_kl: 0.08,
    min_full_agreement: 0.0,
    min_mean_prefix: 8.0,
    outliers: true,
};

/// INT8 on Gemma 3 270M, a base model whose next-token distributions are flatter than
/// the instruct models' above: the KL is as small (at most 0.0014 measured), but greedy
/// near-ties flip sooner (2 of 5 prompts agree for all 16 steps, 11.2 steps on average).
const GEMMA3_INT8: Claim = Claim {
    max_kl: 0.005,
    min_full_agreement: 0.4,
    min_mean_prefix: 10.0,
    outliers: true,
};

/// INT4 on Gemma 3 270M loses much more than on the other models (KL 0.08 to 0.16
/// measured, 0.15 to 0.35 without outlier channels): its file is mostly Q5_0, Q6_K and
/// Q8_0, which a 4-bit re-pack rounds hardest, and the 262k-row head is 4-bit too. Greedy
/// tokens leave f32's within the first steps (1.6 of 16 on average). INT8 is the precision
/// for this model; the README says so.
const GEMMA3_INT4: Claim = Claim {
    max_kl: 0.2,
    min_full_agreement: 0.0,
    min_mean_prefix: 1.0,
    outliers: true,
};

/// `file`: the file's own blocks, activations INT8, no calibration, outlier channels
/// found per token. Measured: SmolLM2's Q4_1 file 6 of 6 prompts agree for all 16 steps
/// (INT8: 5), KL at most 0.0012 (INT8: 0.0021; 0.0037 without the per-token outliers);
/// Qwen2.5's Q4_K_M file 5 of 6 (a near-tie flips "capital" at KL 0.00035, INT8's is
/// 0.00036), KL at most 0.00041 (INT8: 0.00075); Gemma 3's 4 of 5 (INT8: 2), KL at most
/// 0.00061 (INT8: 0.0014).
const FILE: Claim = Claim {
    max_kl: 0.005,
    min_full_agreement: 0.3,
    min_mean_prefix: 10.0,
    outliers: true,
};

/// bf16: f32's greedy tokens for all 16 steps on at least 3 of 4 prompts (all measured),
/// KL < 0.001 on each (at most 0.0001 measured).
const BF16: Claim = Claim {
    max_kl: 0.001,
    min_full_agreement: 0.75,
    min_mean_prefix: 12.0,
    outliers: false,
};

fn check(file: &str, golden: &str, precision: Precision, claim: Claim) {
    let results = compare(file, golden, precision, claim.outliers);
    let plain = if claim.outliers {
        compare(file, golden, precision, false)
    } else {
        results.clone()
    };
    for ((id, agree, kl), (_, agree_plain, kl_plain)) in results.iter().zip(&plain) {
        eprintln!(
            "{file} {precision} {id:<12} greedy agreement {agree:>2}/{N_STEPS} (without outliers {agree_plain:>2})  \
             mean KL {kl:.5} (without outliers {kl_plain:.5})"
        );
    }
    // The outlier channels must buy what they are for: a lower KL over the prompts (a
    // single prompt may already sit at the noise floor either way).
    let mean =
        |r: &[(String, usize, f64)]| r.iter().map(|(_, _, kl)| kl).sum::<f64>() / r.len() as f64;
    let (kl_mean, kl_plain_mean) = (mean(&results), mean(&plain));
    assert!(
        !claim.outliers || kl_mean < kl_plain_mean,
        "{file} {precision}: outlier channels did not reduce the mean KL ({kl_mean} vs {kl_plain_mean})"
    );
    for (id, _, kl) in &results {
        assert!(
            *kl < claim.max_kl,
            "{file} {precision} {id}: mean KL {kl} to the f32 reference is too large"
        );
    }
    // A near-tie of the reference's own may flip one prompt's token: the claims are shares.
    let agreeing = results
        .iter()
        .filter(|(_, agree, _)| *agree == N_STEPS)
        .count();
    eprintln!(
        "{file} {precision}: {agreeing}/{} prompts give f32's greedy tokens for {N_STEPS} steps",
        results.len()
    );
    assert!(
        agreeing as f64 >= claim.min_full_agreement * results.len() as f64,
        "{file} {precision}: only {agreeing}/{} prompts agree over {N_STEPS} tokens",
        results.len()
    );
    let mean_prefix = results
        .iter()
        .map(|(_, agree, _)| *agree as f64)
        .sum::<f64>()
        / results.len() as f64;
    assert!(
        mean_prefix >= claim.min_mean_prefix,
        "{file} {precision}: greedy decoding keeps f32's tokens for {mean_prefix:.1} of \
         {N_STEPS} steps on average"
    );
}

const SMOLLM2: (&str, &str) = (
    "smollm2-135m-instruct-q4_1.gguf",
    "golden-smollm2-135m-public.json",
);
const QWEN2: (&str, &str) = (
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "golden-qwen2.5-coder-0.5b-public.json",
);

const GEMMA3: (&str, &str) = ("gemma-3-270m-q4_k_m.gguf", "golden-gemma3-270m-public.json");

#[test]
fn smollm2_int8_agrees_with_f32() {
    check(SMOLLM2.0, SMOLLM2.1, Precision::Int8, INT8);
}

#[test]
fn qwen2_int8_agrees_with_f32() {
    check(QWEN2.0, QWEN2.1, Precision::Int8, INT8);
}

#[test]
fn gemma3_int8_agrees_with_f32() {
    check(GEMMA3.0, GEMMA3.1, Precision::Int8, GEMMA3_INT8);
}

#[test]
fn gemma3_int4_stays_close_to_f32() {
    check(GEMMA3.0, GEMMA3.1, Precision::Int4, GEMMA3_INT4);
}

#[test]
fn smollm2_file_agrees_with_f32() {
    check(SMOLLM2.0, SMOLLM2.1, Precision::File, FILE);
}

#[test]
fn qwen2_file_agrees_with_f32() {
    check(QWEN2.0, QWEN2.1, Precision::File, FILE);
}

#[test]
fn gemma3_file_agrees_with_f32() {
    check(GEMMA3.0, GEMMA3.1, Precision::File, GEMMA3_INT8);
}

/// Four-bit groups with a minimum re-pack the GGUF's Q4_1 blocks nearly exactly; what is
/// lost is mostly activation quantisation, as in INT8, plus the non-Q4_1 tensors.
#[test]
fn smollm2_int4_stays_close_to_f32() {
    check(SMOLLM2.0, SMOLLM2.1, Precision::Int4, INT4);
}

/// Qwen2.5's Q4_K_M file mixes Q4_K with Q5_0/Q6_K/Q8_0 tensors: those lose more in the
/// 4-bit re-pack than Q4_1 does.
#[test]
fn qwen2_int4_stays_close_to_f32() {
    check(QWEN2.0, QWEN2.1, Precision::Int4, INT4);
}

/// bf16 keeps activations in f32 and rounds only the weights' mantissas.
#[test]
fn smollm2_bf16_is_nearly_f32() {
    check(SMOLLM2.0, SMOLLM2.1, Precision::Bf16, BF16);
}

#[test]
fn qwen2_bf16_is_nearly_f32() {
    check(QWEN2.0, QWEN2.1, Precision::Bf16, BF16);
}

/// The INT8 and f16 KV caches (with f32 weights) against the f32 cache, teacher-forced as
/// above.
#[test]
fn smollm2_int8_and_f16_kv_caches_stay_close_to_f32() {
    let path = model_path("smollm2-135m-instruct-q4_1.gguf");
    let model = Model::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let pool = ThreadPool::with_available_parallelism();
    for (kv_type, max_kl) in [(KvType::Int8, 0.005), (KvType::F16, 0.0001)] {
        check_kv_type(&model, &pool, kv_type, max_kl);
    }
}

fn check_kv_type(model: &Model, pool: &ThreadPool, kv_type: KvType, max_kl: f64) {
    for (id, ids) in reference_prompts("golden-smollm2-135m-public.json") {
        let mut caches =
            [KvType::F32, kv_type].map(|k| model.new_kv_cache_of(ids.len() + N_STEPS, k));
        let mut scratch = Scratch::default();
        let mut logits: Vec<Vec<f32>> = caches
            .iter_mut()
            .map(|kv| {
                model
                    .forward(pool, &ids, kv, &mut scratch, LogitsFor::Last)
                    .unwrap()
            })
            .collect();
        let (mut kl_sum, mut agree, mut diverged) = (0.0, 0, false);
        for _ in 0..N_STEPS {
            kl_sum += kl(&logits[0], &logits[1]);
            let next = argmax(&logits[0]);
            diverged |= next != argmax(&logits[1]);
            agree += usize::from(!diverged);
            logits = caches
                .iter_mut()
                .map(|kv| {
                    model
                        .forward(pool, &[next], kv, &mut scratch, LogitsFor::Last)
                        .unwrap()
                })
                .collect();
        }
        let kl_mean = kl_sum / N_STEPS as f64;
        eprintln!(
            "smollm2 kv {kv_type} {id:<12} greedy agreement {agree:>2}/{N_STEPS}  mean KL {kl_mean:.6}"
        );
        assert!(
            kl_mean < max_kl,
            "{id}: {kv_type} KV cache mean KL {kl_mean}"
        );
    }
}
