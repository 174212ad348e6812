//! Prompt-lookup speculative decoding on tiny random-weight models: the same tokens as
//! plain decoding (greedy and sampled, alone and in a batch beside plain sequences,
//! across window crossings, stop tokens and length limits), drafts really verified, and
//! the counts adding up.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::tiny_as as tiny;
use pyramid_engine::{
    Arm, Engine, EngineConfig, Event, FinishReason, Request, RequestId, Speculation,
    SpeculativeConfig, Usage,
};
use pyramid_kernels::ThreadPool;
use pyramid_model::{KvType, Model, Precision};
use pyramid_runtime::{CpuBackend, SamplerConfig, WindowLadder};

fn engine(model: &Arc<Model>, windows: &[usize], max_batch: usize, pool: &ThreadPool) -> Engine {
    engine_with_pass_rows(model, windows, max_batch, usize::MAX, pool)
}

fn engine_with_pass_rows(
    model: &Arc<Model>,
    windows: &[usize],
    max_batch: usize,
    pass_rows: usize,
    pool: &ThreadPool,
) -> Engine {
    let config = EngineConfig {
        aging: Duration::ZERO,
        speculative: SpeculativeConfig {
            max_draft: 6,
            min_ngram: 1,
            max_ngram: 3,
            pass_rows,
        },
        ..common::config(Arm::OnDemand, windows, 16, max_batch)
    };
    let backend = Arc::new(CpuBackend::new(Arc::clone(model), pool.n_threads()));
    Engine::new(backend, 7, KvType::F32, config).unwrap()
}

/// A prompt that repeats itself, so lookups find drafts from the start.
fn looping_prompt(seed: u32, len: usize) -> Vec<u32> {
    let phrase: Vec<u32> = (0..7).map(|i| (seed * 31 + i * 17 + 5) % 250 + 1).collect();
    phrase.iter().copied().cycle().take(len).collect()
}

struct Outcome {
    tokens: Vec<u32>,
    reason: FinishReason,
    usage: Usage,
}

/// Runs `requests` together to their ends.
fn run_all(
    engine: &mut Engine,
    pool: &ThreadPool,
    requests: Vec<Request>,
) -> HashMap<RequestId, Outcome> {
    for r in requests {
        engine.add_request(r);
    }
    let mut tokens: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut done = HashMap::new();
    while engine.has_work() {
        for event in engine.step(pool) {
            match event {
                Event::Token { id, token, .. } => tokens.entry(id).or_default().push(token),
                Event::Finished {
                    id, reason, usage, ..
                } => {
                    let outcome = Outcome {
                        tokens: tokens.remove(&id).unwrap_or_default(),
                        reason,
                        usage,
                    };
                    done.insert(id, outcome);
                }
                Event::Failed { id, error } => panic!("request {id} failed: {error}"),
                Event::Started { .. } | Event::Embedding { .. } => {}
            }
        }
    }
    done
}

fn request(
    id: RequestId,
    prompt: Vec<u32>,
    max_tokens: usize,
    speculation: Speculation,
) -> Request {
    Request {
        speculation,
        ..Request::greedy(id, prompt, max_tokens)
    }
}

fn alone(model: &Arc<Model>, pool: &ThreadPool, r: Request) -> Outcome {
    let id = r.id;
    let mut e = engine(model, &[32, 64, 128, 256], 1, pool);
    run_all(&mut e, pool, vec![r]).remove(&id).unwrap()
}

#[test]
fn speculative_greedy_equals_plain_greedy_and_verifies_drafts() {
    let pool = ThreadPool::new(2).unwrap();
    let mut rejected = 0;
    for precision in [Precision::F32, Precision::Int8, Precision::Int4] {
        let model = tiny(precision);
        let (mut drafted, mut accepted) = (0, 0);
        for seed in 0..4 {
            let prompt = looping_prompt(seed, 40);
            let plain = alone(
                &model,
                &pool,
                request(0, prompt.clone(), 60, Speculation::Off),
            );
            let spec = alone(&model, &pool, request(0, prompt, 60, Speculation::Ngram));
            assert_eq!(spec.tokens, plain.tokens, "{precision} seed {seed}");
            assert_eq!(spec.reason, plain.reason);
            let s = spec.usage.speculative;
            assert_eq!(
                s.decode_passes + s.accepted_tokens,
                spec.usage.completion_tokens
            );
            assert!(s.accepted_tokens <= s.drafted_tokens);
            assert_eq!(plain.usage.speculative.drafted_tokens, 0);
            assert_eq!(plain.usage.speculative.decode_passes, 60);
            drafted += s.drafted_tokens;
            accepted += s.accepted_tokens;
        }
        assert!(
            drafted > 0 && accepted > 0,
            "{precision}: {accepted}/{drafted}"
        );
        rejected += drafted - accepted;
    }
    assert!(rejected > 0, "some drafts should be rejected");
}

#[test]
fn speculative_sampling_gives_the_plain_tokens_for_every_seed() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Precision::F32);
    let settings = [
        (1.0, 0, 1.0, 1.0),
        (0.7, 40, 0.9, 1.0),
        (1.3, 0, 0.95, 1.15),
    ];
    let mut accepted = 0;
    for (temperature, top_k, top_p, repeat_penalty) in settings {
        for seed in 0..12 {
            let sampler = SamplerConfig {
                temperature,
                top_k,
                top_p,
                repeat_penalty,
                seed,
                ..SamplerConfig::greedy()
            };
            let prompt = looping_prompt(seed as u32, 30);
            let mut plain = request(0, prompt.clone(), 40, Speculation::Off);
            plain.sampler = sampler.clone();
            let mut spec = request(0, prompt, 40, Speculation::Ngram);
            spec.sampler = sampler;
            let (plain, spec) = (alone(&model, &pool, plain), alone(&model, &pool, spec));
            assert_eq!(spec.tokens, plain.tokens, "t={temperature} seed {seed}");
            accepted += spec.usage.speculative.accepted_tokens;
        }
    }
    assert!(accepted > 0, "no sampled draft was ever accepted");
}

#[test]
fn a_batch_mixing_speculative_and_plain_sequences_gives_each_its_own_tokens() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Precision::Int8);
    let modes = [
        Speculation::Ngram,
        Speculation::Off,
        Speculation::Ngram,
        Speculation::Off,
    ];
    let requests: Vec<Request> = modes
        .iter()
        .enumerate()
        .map(|(i, &m)| request(i as u64, looping_prompt(i as u32 + 10, 20 + 9 * i), 50, m))
        .collect();
    let want: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| {
            let plain = Request {
                speculation: Speculation::Off,
                ..r.clone()
            };
            alone(&model, &pool, plain).tokens
        })
        .collect();
    let mut e = engine(&model, &[32, 64, 128, 256], 4, &pool);
    let got = run_all(&mut e, &pool, requests);
    for (i, want) in want.iter().enumerate() {
        assert_eq!(&got[&(i as u64)].tokens, want, "request {i}");
    }
    let stats = e.stats().speculative;
    assert!(stats.verify_passes > 0 && stats.accepted_tokens > 0);
    assert_eq!(got[&1].usage.speculative.drafted_tokens, 0);
}

/// A pass takes drafts only up to its row budget (prompt, next and draft tokens
/// together), so a busy batch is not slowed by drafts; the tokens stay the plain ones.
#[test]
fn drafts_stay_within_the_rows_a_pass_has_room_for() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Precision::Int8);
    let requests: Vec<Request> = (0..4)
        .map(|i| {
            request(
                i,
                looping_prompt(i as u32 + 20, 12 + 5 * i as usize),
                40,
                Speculation::Ngram,
            )
        })
        .collect();
    let want: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| {
            let plain = Request {
                speculation: Speculation::Off,
                ..r.clone()
            };
            alone(&model, &pool, plain).tokens
        })
        .collect();
    let pass_rows = 7;
    let mut e = engine_with_pass_rows(&model, &[32, 64, 128, 256], 4, pass_rows, &pool);
    for r in requests {
        e.add_request(r);
    }
    let mut tokens: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let (mut steps_with_drafts, mut filled_by_drafts, mut busy_steps) = (0, 0, 0);
    while e.has_work() {
        for event in e.step(&pool) {
            match event {
                Event::Token { id, token, .. } => tokens.entry(id).or_default().push(token),
                Event::Failed { id, error } => panic!("request {id} failed: {error}"),
                _ => {}
            }
        }
        let step = e.last_step();
        let rows = step.n_prefilled + step.n_decoded;
        if step.n_drafted > 0 {
            steps_with_drafts += 1;
            assert!(
                rows + step.n_drafted <= pass_rows,
                "{rows} rows and {} draft tokens in a pass of at most {pass_rows}",
                step.n_drafted
            );
            if rows + step.n_drafted == pass_rows {
                filled_by_drafts += 1;
            }
        }
        if rows >= pass_rows {
            busy_steps += 1;
        }
    }
    for (i, want) in want.iter().enumerate() {
        assert_eq!(&tokens[&(i as u64)], want, "request {i}");
    }
    assert!(steps_with_drafts > 0, "no pass had room for a draft");
    assert!(
        filled_by_drafts > 0,
        "drafts never filled a pass's room (cut, not dropped)"
    );
    assert!(
        busy_steps > 0,
        "no pass filled its rows (the prefills should)"
    );
}

#[test]
fn drafts_respect_windows_stop_tokens_and_length_limits() {
    let pool = ThreadPool::new(1).unwrap();
    let model = tiny(Precision::F32);
    for seed in 0..6 {
        // Crossing 32 -> 64 -> 128 while drafting.
        let prompt = looping_prompt(seed, 25);
        let plain = alone(
            &model,
            &pool,
            request(0, prompt.clone(), 90, Speculation::Off),
        );
        let spec = alone(
            &model,
            &pool,
            request(0, prompt.clone(), 90, Speculation::Ngram),
        );
        assert_eq!(spec.tokens, plain.tokens);
        assert_eq!(spec.usage.completion_tokens, 90);
        // A stop token the plain run samples part way: both end on it.
        let stop = plain.tokens[plain.tokens.len() / 2];
        let with_stop = |speculation| Request {
            stop_tokens: vec![stop],
            ..request(0, prompt.clone(), 90, speculation)
        };
        let plain = alone(&model, &pool, with_stop(Speculation::Off));
        let spec = alone(&model, &pool, with_stop(Speculation::Ngram));
        assert_eq!(spec.tokens, plain.tokens);
        assert_eq!(
            (spec.reason, plain.reason),
            (FinishReason::Stop, FinishReason::Stop)
        );
        assert_eq!(spec.tokens.last(), Some(&stop));
    }
    // The largest window ends generation at the same token.
    let mut e = engine(&model, &[32, 64], 1, &pool);
    let prompt = looping_prompt(3, 30);
    let spec = run_all(
        &mut e,
        &pool,
        vec![request(1, prompt.clone(), 200, Speculation::Ngram)],
    );
    let mut e = engine(&model, &[32, 64], 1, &pool);
    let plain = run_all(
        &mut e,
        &pool,
        vec![request(1, prompt, 200, Speculation::Off)],
    );
    assert_eq!(spec[&1].tokens, plain[&1].tokens);
    assert_eq!(spec[&1].reason, FinishReason::Length);
    // The last token sampled fills the window; it is never fed.
    assert_eq!(spec[&1].tokens.len(), 64 - 30 + 1);
}

#[test]
fn a_conversation_continued_after_speculation_reuses_exactly_its_tokens() {
    // Rejected draft positions must leave the cache: the next turn reuses the session.
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Precision::F32);
    let prompt = looping_prompt(5, 30);
    let mut e = engine(&model, &[32, 64, 128, 256], 1, &pool);
    let mut sampled = request(1, prompt.clone(), 30, Speculation::Ngram);
    sampled.sampler = SamplerConfig {
        temperature: 1.0,
        seed: 3,
        ..SamplerConfig::greedy()
    };
    let first = run_all(&mut e, &pool, vec![sampled]);
    let s = first[&1].usage.speculative;
    assert!(
        s.drafted_tokens > s.accepted_tokens,
        "no draft was rejected"
    );
    let mut next = prompt;
    next.extend(&first[&1].tokens);
    next.extend([9, 8, 7]);
    let second = run_all(
        &mut e,
        &pool,
        vec![request(2, next.clone(), 30, Speculation::Ngram)],
    );
    // Everything but the reply's last token (sampled, never fed) is reused.
    assert_eq!(second[&2].usage.cached_tokens, 30 + 30 - 1);
    let fresh = alone(&model, &pool, request(2, next, 30, Speculation::Off));
    assert_eq!(second[&2].tokens, fresh.tokens);
}

/// The acceptance rule keeps the sampling distribution: with independent seeds, the
/// tokens a speculative run samples at several positions follow the plain run's
/// distribution (two-sample chi-square tests at p = 0.001), and its tokens continue the
/// context's earlier occurrences as often as plain tokens do (a two-proportion z-test):
/// accepting drafts more often than the model's own probability (say, always) would make
/// them continue their lookups far more often.
#[test]
fn speculative_sampling_keeps_the_distribution_with_independent_seeds() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Precision::F32);
    let prompt = looping_prompt(2, 24);
    let n = 300u64;
    let runs = |speculation, seeds: std::ops::Range<u64>| {
        let requests = seeds
            .map(|seed| Request {
                sampler: SamplerConfig {
                    temperature: 1.5,
                    top_k: 6,
                    seed,
                    ..SamplerConfig::greedy()
                },
                ..request(seed, prompt.clone(), 8, speculation)
            })
            .collect();
        let mut e = engine(&model, &[64], 8, &pool);
        let done = run_all(&mut e, &pool, requests);
        (e.stats().speculative, done)
    };
    let (drafts, spec) = runs(Speculation::Ngram, 0..n);
    let (_, plain) = runs(Speculation::Off, n..2 * n);
    assert!(drafts.accepted_tokens > 100 && drafts.drafted_tokens > drafts.accepted_tokens);
    for position in [1, 3, 5, 7] {
        let mut counts: HashMap<u32, (f64, f64)> = HashMap::new();
        for o in spec.values() {
            counts.entry(o.tokens[position]).or_default().0 += 1.0;
        }
        for o in plain.values() {
            counts.entry(o.tokens[position]).or_default().1 += 1.0;
        }
        // Equal sample sizes: sum of (a - b)^2 / (a + b) is chi-square with k - 1 df.
        let statistic: f64 = counts
            .values()
            .map(|(a, b)| (a - b).powi(2) / (a + b))
            .sum();
        let df = (counts.len().max(2) - 1) as f64;
        // Wilson-Hilferty: the 0.999 quantile of chi-square with `df` degrees of freedom.
        let z = 3.09;
        let critical = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
        assert!(
            statistic < critical,
            "position {position}: chi-square {statistic:.1} >= {critical:.1} ({counts:?})"
        );
    }
    // How often a token is what followed the last earlier occurrence of the token before.
    let continuation_rate = |runs: &HashMap<RequestId, Outcome>| {
        let (mut followed, mut total) = (0.0, 0.0);
        for o in runs.values() {
            let full: Vec<u32> = prompt.iter().chain(&o.tokens).copied().collect();
            for j in prompt.len()..full.len() {
                let last = full[j - 1];
                if let Some(i) = (0..j - 1).rev().find(|&i| full[i] == last) {
                    total += 1.0;
                    followed += f64::from(u8::from(full[j] == full[i + 1]));
                }
            }
        }
        (followed / total, total)
    };
    let ((a, n_a), (b, n_b)) = (continuation_rate(&spec), continuation_rate(&plain));
    let pooled = (a * n_a + b * n_b) / (n_a + n_b);
    let z = (a - b) / (pooled * (1.0 - pooled) * (1.0 / n_a + 1.0 / n_b)).sqrt();
    assert!(
        z.abs() < 3.3,
        "continuations: speculative {a:.3}, plain {b:.3}, z = {z:.1}"
    );
}

/// A client's prediction of the reply (OpenAI's predicted outputs) drafts from the first
/// decode step; right, nearly every token is accepted; wrong, the tokens are still plain.
#[test]
fn a_prediction_of_the_reply_is_verified_and_never_changes_a_token() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Precision::F32);
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 250 + 1).collect();
    let plain = alone(
        &model,
        &pool,
        request(0, prompt.clone(), 40, Speculation::Off),
    );
    let with = |prediction: Vec<u32>| Request {
        prediction,
        ..request(0, prompt.clone(), 40, Speculation::Ngram)
    };
    let right = alone(&model, &pool, with(plain.tokens.clone()));
    assert_eq!(right.tokens, plain.tokens);
    let s = right.usage.speculative;
    assert_eq!(
        s.drafted_tokens, s.accepted_tokens,
        "a right prediction is all accepted"
    );
    assert!(s.accepted_tokens >= 30, "{s:?}");
    let wrong: Vec<u32> = (0..40).map(|i| (i * 13 + 7) % 250 + 1).collect();
    assert_eq!(alone(&model, &pool, with(wrong)).tokens, plain.tokens);
}

/// On every reference prompt of SmolLM2 and Qwen2.5 at INT8 (the default precision, whose
/// multi-row verify pass must give each row what a one-row pass gives), greedy decoding with
/// drafts equals greedy decoding without, and drafts are accepted somewhere. Each model is
/// loaded once: this was 24 CLI runs, each loading and quantising its model again.
#[test]
fn speculative_greedy_gives_the_plain_tokens_on_the_reference_prompts_of_real_models() {
    let pool = ThreadPool::with_available_parallelism();
    let mut accepted = 0;
    for (file, golden) in [
        (
            "smollm2-135m-instruct-q4_1.gguf",
            "golden-smollm2-135m-public.json",
        ),
        (
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "golden-qwen2.5-coder-0.5b-public.json",
        ),
    ] {
        let model = Arc::new(reference_model(file).into_precision(Precision::Int8, None));
        let run = |prompt: &[u32], speculation| {
            let mut config = EngineConfig {
                speculative: SpeculativeConfig::default(),
                ..common::config(Arm::OnDemand, &[256], 256, 1)
            };
            config.pyramid.ladder = WindowLadder::new(vec![512], 8192).unwrap();
            let backend = Arc::new(CpuBackend::new(Arc::clone(&model), pool.n_threads()));
            let mut e = Engine::new(backend, 7, KvType::F32, config).unwrap();
            let r = request(0, prompt.to_vec(), 32, speculation);
            run_all(&mut e, &pool, vec![r]).remove(&0).unwrap()
        };
        for (id, prompt) in pyramid_testdata::reference_prompts(golden) {
            let (plain, spec) = (
                run(&prompt, Speculation::Off),
                run(&prompt, Speculation::Ngram),
            );
            assert_eq!(spec.tokens, plain.tokens, "{file} {id}");
            assert_eq!(plain.tokens.len(), 32, "{file} {id}");
            assert_eq!(plain.usage.speculative.drafted_tokens, 0);
            let s = spec.usage.speculative;
            assert_eq!(
                s.decode_passes + s.accepted_tokens,
                32,
                "{file} {id}: {s:?}"
            );
            accepted += s.accepted_tokens;
        }
    }
    assert!(
        accepted > 0,
        "no draft was accepted on any reference prompt"
    );
}

/// A cached model file at f32.
fn reference_model(file: &str) -> Model {
    Model::load(pyramid_testdata::model_path(file)).unwrap()
}
