//! The forward pass on tiny random-weight models written by our own GGUF writer:
//! loader plumbing, invariances of the KV cache, and bad-input errors.

use pyramid_gguf::{GgmlType, GgufFile, Value};
use pyramid_kernels::attention::SHARE_MIN_BYTES;
use pyramid_kernels::ThreadPool;
use pyramid_model::linear::Site;
use pyramid_model::synthetic::{retype_tensor, synthetic_gguf, SyntheticSpec};
use pyramid_model::{
    Architecture, Calibration, Checkpoint, KvType, LogitsFor, Model, ModelError, Pooling,
    Precision, Scratch, Segment,
};

fn build(spec: &SyntheticSpec) -> Model {
    let bytes = synthetic_gguf(spec).expect("synthetic gguf").to_bytes();
    Model::from_gguf(&GgufFile::from_bytes(bytes).expect("parses")).expect("loads")
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

const PROMPT: [u32; 12] = [72, 101, 108, 108, 111, 32, 116, 104, 101, 114, 101, 33];

#[test]
fn prefill_equals_token_by_token_decode_for_every_architecture() {
    let pool = ThreadPool::new(2).unwrap();
    for arch in [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Gemma3,
    ] {
        let model = build(&SyntheticSpec::tiny(arch));
        let n_vocab = model.config.n_vocab;

        let mut kv = model.new_kv_cache(64);
        let all = model
            .forward(
                &pool,
                &PROMPT,
                &mut kv,
                &mut Scratch::default(),
                LogitsFor::All,
            )
            .unwrap();
        assert_eq!(kv.len(), PROMPT.len());

        let mut kv = model.new_kv_cache(64);
        let mut scratch = Scratch::default();
        for (t, &tok) in PROMPT.iter().enumerate() {
            let step = model
                .forward(&pool, &[tok], &mut kv, &mut scratch, LogitsFor::Last)
                .unwrap();
            let d = max_abs_diff(&step, &all[t * n_vocab..(t + 1) * n_vocab]);
            assert!(
                d < 1e-4,
                "{arch:?} position {t}: prefill and decode differ by {d}"
            );
        }
    }
}

/// The loader calibrates a first INT8 load by streaming the f32 layers from the file one
/// at a time; its peaks must be the resident f32 model's, tied output or not.
#[test]
fn streamed_calibration_equals_the_resident_models() {
    let pool = ThreadPool::new(2).unwrap();
    for (arch, untied_output) in [(Architecture::Llama, false), (Architecture::Qwen2, true)] {
        let spec = SyntheticSpec {
            untied_output,
            ..SyntheticSpec::tiny(arch)
        };
        let file = GgufFile::from_bytes(synthetic_gguf(&spec).unwrap().to_bytes()).unwrap();
        let resident = Model::from_gguf(&file)
            .unwrap()
            .calibrate(&pool, &PROMPT)
            .unwrap();
        let checkpoint = Checkpoint::from_gguf(file).unwrap();
        let streamed = Model::calibrate_streamed(&checkpoint, &pool, &PROMPT).unwrap();
        assert!(streamed == resident, "{arch:?}: calibrations differ");
        assert!(
            streamed != Calibration::new(spec.n_layer),
            "{arch:?}: nothing recorded"
        );
    }
}

/// The forward pass is one parallel region whose steps are split between threads and
/// joined by barriers; a missing barrier or an overlapping split shows up as a result that
/// depends on the number of threads. Every element is computed the same way whatever the
/// split, so the results must be identical, not merely close.
#[test]
fn results_are_bit_identical_for_any_number_of_threads() {
    for arch in [Architecture::Qwen2, Architecture::Gemma3] {
        thread_invariance(arch);
    }
}

fn thread_invariance(arch: Architecture) {
    let f32_model = build(&SyntheticSpec::tiny(arch));
    let calibration = f32_model
        .calibrate(&ThreadPool::new(1).unwrap(), &PROMPT)
        .unwrap();
    for precision in Precision::ALL {
        let model = f32_model
            .clone()
            .into_precision(precision, Some(&calibration));
        for kv_type in [KvType::F32, KvType::Int8] {
            let run = |n_threads: usize| {
                let pool = ThreadPool::new(n_threads).unwrap();
                let mut scratch = Scratch::default();
                let mut caches: Vec<_> =
                    (0..3).map(|_| model.new_kv_cache_of(32, kv_type)).collect();
                let mut logits = Vec::new();
                // A padded prefill beside two shorter prompts, then a batched decode step
                // of all three at different positions.
                let mut segments: Vec<Segment> = caches
                    .iter_mut()
                    .zip([&PROMPT[..], &PROMPT[..5], &PROMPT[3..4]])
                    .map(|(kv, tokens)| Segment::new(tokens, kv))
                    .collect();
                segments[0].n_padding = 2;
                logits.extend(
                    model
                        .forward_batch(&pool, &mut segments, &mut scratch, LogitsFor::All)
                        .unwrap(),
                );
                let mut segments: Vec<Segment> = caches
                    .iter_mut()
                    .zip([&[7u32][..], &[8], &[9]])
                    .map(|(kv, tokens)| Segment::new(tokens, kv))
                    .collect();
                logits.extend(
                    model
                        .forward_batch(&pool, &mut segments, &mut scratch, LogitsFor::Last)
                        .unwrap(),
                );
                logits
            };
            let one = run(1);
            for n_threads in [2, 3] {
                assert!(
                    run(n_threads) == one,
                    "{precision} with {kv_type:?} KV: {n_threads} threads differ from 1"
                );
            }
        }
    }
}

/// A decoding row over at least `SHARE_MIN_BYTES` of cache whose KV heads do not divide
/// among the threads is shared by the team: it must give what one thread gives, and
/// what the same tokens give as rows of one pass (a verified draft), bit for bit. Three
/// KV heads (SmolLM2's split on two threads) and one (Gemma 3's); an f32 cache, as an
/// INT8 one would need four times the positions (the kernel's own test covers it).
#[test]
fn long_decoding_rows_shared_by_threads_change_no_bit() {
    const HEAD_DIM: usize = 64;
    // Past SHARE_MIN_BYTES of f32 keys and values a head.
    let n_prompt = (SHARE_MIN_BYTES / (2 * 4 * HEAD_DIM)) as u32 + 8;
    let prompt: Vec<u32> = (0..n_prompt).map(|i| (i * 37 + 11) % 100).collect();
    let drafts = [17u32, 42, 5];
    for (n_head, n_head_kv) in [(6, 3), (4, 1)] {
        let model = build(&SyntheticSpec {
            n_embd: HEAD_DIM * n_head,
            n_head,
            n_head_kv,
            n_ctx: 1024,
            ..SyntheticSpec::tiny(Architecture::Llama)
        });
        let prefilled = |pool: &ThreadPool, scratch: &mut Scratch| {
            let mut kv = model.new_kv_cache(1024);
            model
                .forward(pool, &prompt, &mut kv, scratch, LogitsFor::Last)
                .unwrap();
            kv
        };
        let decoded = |n_threads: usize| {
            let (pool, mut scratch) = (ThreadPool::new(n_threads).unwrap(), Scratch::default());
            let mut kv = prefilled(&pool, &mut scratch);
            drafts
                .iter()
                .flat_map(|&t| {
                    model
                        .forward(&pool, &[t], &mut kv, &mut scratch, LogitsFor::Last)
                        .unwrap()
                })
                .collect::<Vec<f32>>()
        };
        let one = decoded(1);
        let what = format!("{n_head_kv} KV heads");
        for n_threads in [2, 3] {
            assert!(
                decoded(n_threads) == one,
                "{what}: {n_threads} threads differ from 1"
            );
        }
        let (pool, mut scratch) = (ThreadPool::new(2).unwrap(), Scratch::default());
        let mut kv = prefilled(&pool, &mut scratch);
        let verified = model
            .forward(&pool, &drafts, &mut kv, &mut scratch, LogitsFor::All)
            .unwrap();
        assert!(
            verified == one,
            "{what}: verified rows differ from decoded ones"
        );
    }
}

#[test]
fn prefill_in_pieces_equals_whole_and_cache_growth_keeps_results() {
    let pool = ThreadPool::new(2).unwrap();
    let model = build(&SyntheticSpec::tiny(Architecture::Qwen2));
    let mut kv = model.new_kv_cache(64);
    let whole = model
        .forward(
            &pool,
            &PROMPT,
            &mut kv,
            &mut Scratch::default(),
            LogitsFor::Last,
        )
        .unwrap();

    let mut kv = model.new_kv_cache(5);
    let mut scratch = Scratch::default();
    model
        .forward(&pool, &PROMPT[..5], &mut kv, &mut scratch, LogitsFor::Last)
        .unwrap();
    kv.reserve(PROMPT.len());
    assert!(kv.capacity() >= PROMPT.len());
    let pieces = model
        .forward(&pool, &PROMPT[5..], &mut kv, &mut scratch, LogitsFor::Last)
        .unwrap();
    assert!(max_abs_diff(&whole, &pieces) < 1e-4);
}

#[test]
fn quantised_weight_types_load_and_stay_close_to_f32() {
    let pool = ThreadPool::new(1).unwrap();
    let reference = build(&SyntheticSpec::tiny(Architecture::Llama));
    let mut kv = reference.new_kv_cache(16);
    let want = reference
        .forward(
            &pool,
            &PROMPT,
            &mut kv,
            &mut Scratch::default(),
            LogitsFor::Last,
        )
        .unwrap();
    let spread = want.iter().map(|v| v.abs()).fold(0.0, f32::max);
    for (ty, tolerance) in [
        (GgmlType::F16, 0.01),
        (GgmlType::Q8_0, 0.05),
        (GgmlType::Q4_1, 0.3),
        (GgmlType::Q4_0, 0.3),
    ] {
        let spec = SyntheticSpec {
            weight_type: ty,
            untied_output: true,
            ..SyntheticSpec::tiny(Architecture::Llama)
        };
        let spec_f32 = SyntheticSpec {
            untied_output: true,
            ..SyntheticSpec::tiny(Architecture::Llama)
        };
        let (model, model_f32) = (build(&spec), build(&spec_f32));
        let run = |m: &Model| {
            let mut kv = m.new_kv_cache(16);
            m.forward(
                &pool,
                &PROMPT,
                &mut kv,
                &mut Scratch::default(),
                LogitsFor::Last,
            )
            .unwrap()
        };
        let d = max_abs_diff(&run(&model), &run(&model_f32));
        assert!(
            d < tolerance * spread.max(1.0),
            "{ty}: logits differ from f32 by {d}"
        );
    }
}

#[test]
fn bad_inputs_are_errors() {
    let pool = ThreadPool::new(1).unwrap();
    let spec = SyntheticSpec {
        n_ctx: 8,
        ..SyntheticSpec::tiny(Architecture::Llama)
    };
    let model = build(&spec);
    let mut scratch = Scratch::default();
    let mut kv = model.new_kv_cache(100);
    assert_eq!(kv.capacity(), 8, "cache is clamped to the model's context");
    assert!(matches!(
        model.forward(&pool, &[], &mut kv, &mut scratch, LogitsFor::Last),
        Err(ModelError::EmptyInput)
    ));
    assert!(matches!(
        model.forward(&pool, &[100_000], &mut kv, &mut scratch, LogitsFor::Last),
        Err(ModelError::TokenOutOfRange { id: 100_000, .. })
    ));
    assert!(matches!(
        model.forward(&pool, &[1; 9], &mut kv, &mut scratch, LogitsFor::Last),
        Err(ModelError::ContextLengthExceeded {
            needed: 9,
            n_ctx: 8
        })
    ));
    assert_eq!(kv.len(), 0, "a failed forward leaves the cache untouched");
    let mut small = model.new_kv_cache(2);
    small.reserve(1_000);
    assert_eq!(small.capacity(), 8, "growth stops at the model's context");
}

fn load_with(edit: impl FnOnce(&mut pyramid_gguf::GgufWriter)) -> Result<Model, ModelError> {
    let mut w = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Llama)).unwrap();
    edit(&mut w);
    Model::from_gguf(&GgufFile::from_bytes(w.to_bytes())?)
}

#[test]
fn gguf_pooling_type_is_read_and_a_ranking_head_refused() {
    let pooling = |value: u32| {
        load_with(|w| {
            w.add_metadata("llama.pooling_type", Value::U32(value))
                .unwrap();
        })
        .map(|m| m.config.pooling)
    };
    assert_eq!(load_with(|_| {}).unwrap().config.pooling, None);
    assert_eq!(pooling(0).unwrap(), None);
    assert_eq!(pooling(1).unwrap(), Some(Pooling::Mean));
    assert_eq!(pooling(3).unwrap(), Some(Pooling::Last));
    let err = pooling(4).unwrap_err().to_string();
    assert!(err.contains("rank"), "{err}");
}

#[test]
fn unsupported_or_inconsistent_models_are_rejected_by_name() {
    let err = load_with(|w| {
        w.add_metadata("general.architecture", Value::String("mamba".into()))
            .unwrap();
    })
    .unwrap_err();
    assert!(
        matches!(&err, ModelError::UnsupportedArchitecture(a) if a == "mamba"),
        "{err}"
    );

    let err = load_with(|w| {
        w.add_metadata("llama.attention.head_count_kv", Value::U32(3))
            .unwrap();
    })
    .unwrap_err();
    assert!(matches!(err, ModelError::BadConfig(_)), "{err}");

    let err = load_with(|w| {
        w.add_metadata("llama.embedding_length", Value::U32(128))
            .unwrap();
    })
    .unwrap_err();
    assert!(matches!(err, ModelError::TensorShape { .. }), "{err}");

    // A zero width, and shapes whose buffers could not be addressed, are corrupt files.
    let err = load_with(|w| {
        w.add_metadata("llama.embedding_length", Value::U32(0))
            .unwrap();
    })
    .unwrap_err();
    assert!(matches!(err, ModelError::BadConfig(_)), "{err}");
    let err = load_with(|w| {
        w.add_metadata("llama.context_length", Value::U64(u64::MAX / 4))
            .unwrap();
        w.add_metadata("llama.block_count", Value::U64(1 << 40))
            .unwrap();
    })
    .unwrap_err();
    assert!(matches!(err, ModelError::BadConfig(_)), "{err}");
}

#[test]
fn a_weight_of_a_type_without_dequantisation_is_an_error_naming_it() {
    let mut bytes = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Llama))
        .unwrap()
        .to_bytes();
    // Q8_1 (id 9) is an activation-only type: smaller than F32, so the file stays in bounds.
    retype_tensor(&mut bytes, "blk.1.ffn_up.weight", GgmlType::Q8_1);
    let err = Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("blk.1.ffn_up.weight") && msg.contains("Q8_1"),
        "{msg}"
    );
}

/// Several sequences in one pass give exactly what each gives alone: every projection
/// treats rows independently, and each row attends only to its own cache.
/// A calibration under which every projection input has outlier channels (random weights
/// have none), so the float side product of integer projections is exercised.
fn forced_outliers(spec: &SyntheticSpec) -> Calibration {
    let mut calibration = Calibration::new(spec.n_layer);
    let peaks = |width: usize| -> Vec<f32> {
        (0..width)
            .map(|c| if c % 13 == 5 { 100.0 } else { 1.0 })
            .collect()
    };
    let (e, ff) = (spec.n_embd, spec.n_ff);
    for layer in 0..spec.n_layer {
        for (site, width) in [
            (Site::AttnIn, e),
            (Site::AttnOut, e),
            (Site::FfnIn, e),
            (Site::FfnDown, ff),
        ] {
            calibration.record(layer, site, &peaks(width), width);
        }
    }
    calibration.record(0, Site::Head, &peaks(e), e);
    calibration
}

/// Batched with others or alone, prefilled or decoded: a token's logits are the same bits,
/// which is what lets a server batch requests and reuse cached prefixes without changing
/// anyone's output.
#[test]
fn batched_forward_equals_each_sequence_alone() {
    for arch in [Architecture::Qwen2, Architecture::Gemma3] {
        batch_independence(arch);
    }
}

fn batch_independence(arch: Architecture) {
    use pyramid_model::Segment;
    let pool = ThreadPool::new(2).unwrap();
    for ty in [GgmlType::F32, GgmlType::Q8_0] {
        for precision in Precision::ALL {
            let spec = SyntheticSpec {
                weight_type: ty,
                ..SyntheticSpec::tiny(arch)
            };
            let model = build(&spec).into_precision(precision, Some(&forced_outliers(&spec)));
            let n_vocab = model.config.n_vocab;
            let prompts: [&[u32]; 3] = [&PROMPT[..3], &PROMPT, &PROMPT[4..9]];
            let next: [u32; 3] = [7, 99, 260];

            // Alone: prefill, then one decode step.
            let mut alone = Vec::new();
            for (p, &t) in prompts.iter().zip(&next) {
                let mut kv = model.new_kv_cache(32);
                let mut s = Scratch::default();
                model
                    .forward(&pool, p, &mut kv, &mut s, LogitsFor::Last)
                    .unwrap();
                alone.push(
                    model
                        .forward(&pool, &[t], &mut kv, &mut s, LogitsFor::Last)
                        .unwrap(),
                );
            }

            // Together: one batched prefill of all three, then one batched decode step.
            let mut caches: Vec<_> = (0..3).map(|_| model.new_kv_cache(32)).collect();
            let mut s = Scratch::default();
            let mut segments: Vec<Segment> = caches
                .iter_mut()
                .zip(prompts)
                .map(|(kv, tokens)| Segment::new(tokens, kv))
                .collect();
            model
                .forward_batch(&pool, &mut segments, &mut s, LogitsFor::Last)
                .unwrap();
            let singles: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
            let mut segments: Vec<Segment> = caches
                .iter_mut()
                .zip(&singles)
                .map(|(kv, t)| Segment::new(t, kv))
                .collect();
            let together = model
                .forward_batch(&pool, &mut segments, &mut s, LogitsFor::Last)
                .unwrap();
            for (b, want) in alone.iter().enumerate() {
                assert_eq!(
                    &together[b * n_vocab..(b + 1) * n_vocab],
                    &want[..],
                    "{ty} {precision}: sequence {b}"
                );
            }
        }
    }
}

/// An INT8 cache stays close to the f32 one, and growing it keeps results exactly.
#[test]
fn int8_kv_cache_tracks_f32_and_survives_growth() {
    use pyramid_model::KvType;
    let pool = ThreadPool::new(2).unwrap();
    let model = build(&SyntheticSpec::tiny(Architecture::Llama));
    let run = |kind: KvType, capacity: usize| {
        let mut kv = model.new_kv_cache_of(capacity, kind);
        let mut s = Scratch::default();
        let mut out = Vec::new();
        for chunk in PROMPT.chunks(4) {
            kv.reserve(kv.len() + chunk.len());
            out.push(
                model
                    .forward(&pool, chunk, &mut kv, &mut s, LogitsFor::Last)
                    .unwrap(),
            );
        }
        (out, kv)
    };
    let (f32_logits, f32_kv) = run(KvType::F32, 64);
    let (i8_logits, i8_kv) = run(KvType::Int8, 64);
    let (grown_logits, _) = run(KvType::Int8, 1);
    assert_eq!(
        i8_logits, grown_logits,
        "growth must not change an INT8 cache"
    );
    assert!(
        i8_kv.bytes() * 3 < f32_kv.bytes(),
        "{} vs {}",
        i8_kv.bytes(),
        f32_kv.bytes()
    );
    for (a, b) in f32_logits.iter().zip(&i8_logits) {
        let spread = a.iter().map(|v| v.abs()).fold(0.0, f32::max);
        assert!(
            max_abs_diff(a, b) < 0.05 * spread.max(1.0),
            "INT8 cache drifts: {}",
            max_abs_diff(a, b)
        );
    }
}

/// Padding rows fill a fixed-shape chunk without touching any real token: the logits of
/// the real rows and everything decoded afterwards are bit-identical to an unpadded run.
#[test]
fn padded_chunks_equal_unpadded() {
    use pyramid_model::Segment;
    let pool = ThreadPool::new(2).unwrap();
    for precision in Precision::ALL {
        let model =
            build(&SyntheticSpec::tiny(Architecture::Qwen2)).into_precision(precision, None);
        let mut scratch = Scratch::default();
        let run =
            |tokens: &[u32], n_padding: usize, kv: &mut pyramid_model::KvCache, s: &mut Scratch| {
                let mut seg = [Segment {
                    tokens,
                    n_padding,
                    kv,
                    n_logits: 1,
                    pooled: None,
                }];
                model
                    .forward_batch(&pool, &mut seg, s, LogitsFor::Last)
                    .unwrap()
            };
        let mut plain_kv = model.new_kv_cache(16);
        let plain = run(&PROMPT[..9], 0, &mut plain_kv, &mut scratch);
        // Two chunks of 8: the second holds one real token and seven pads, and the
        // window has no room for the pads' positions.
        let mut padded_kv = model.new_kv_cache(16);
        run(&PROMPT[..8], 0, &mut padded_kv, &mut scratch);
        let mut chunk = [0u32; 8];
        chunk[0] = PROMPT[8];
        chunk[1..].fill(PROMPT[0]);
        let padded = run(&chunk, 7, &mut padded_kv, &mut scratch);
        assert_eq!(padded_kv.len(), 9, "{precision}: padding is not cached");
        assert_eq!(padded, plain, "{precision}");
        let next = [PROMPT[9]];
        assert_eq!(
            run(&next, 0, &mut padded_kv, &mut scratch),
            run(&next, 0, &mut plain_kv, &mut scratch),
            "{precision}: decode after a padded chunk"
        );
    }
}

#[test]
fn published_shapes_pad_the_vocabulary_and_keep_special_tokens_last() {
    let spec = SyntheticSpec {
        min_vocab: 1000,
        ..SyntheticSpec::tiny(Architecture::Qwen2)
    };
    let file = GgufFile::from_bytes(synthetic_gguf(&spec).unwrap().to_bytes()).unwrap();
    let model = Model::from_gguf(&file).unwrap();
    assert_eq!(model.config.n_vocab, 1000);
    let tokens = file.metadata().get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 1000);
    let eos = file
        .metadata()
        .get_usize("tokenizer.ggml.eos_token_id")
        .unwrap();
    assert_eq!(eos, 999, "<|im_end|> stays the last token");

    let qwen = SyntheticSpec::published("qwen2.5-1.5b").unwrap();
    assert_eq!(
        (qwen.n_embd, qwen.n_layer, qwen.min_vocab),
        (1536, 28, 151_936)
    );
    // About 1.5 billion weights, as the name says.
    let n = qwen.n_params() as f64;
    assert!((1.3e9..1.8e9).contains(&n), "{n}");
    assert!(SyntheticSpec::published("gpt-5").is_none());
}

/// Segments longer than one pass run in fixed-size chunks: the logits of every position,
/// and of the last, are those of the same tokens fed in small pieces, for one sequence
/// and for a batch whose segments end in different chunks.
#[test]
fn long_prompts_run_in_chunks_with_the_results_of_pieces() {
    use pyramid_model::MAX_PASS_TOKENS;
    let pool = ThreadPool::new(2).unwrap();
    let spec = SyntheticSpec {
        n_ctx: 2 * MAX_PASS_TOKENS + 64,
        ..SyntheticSpec::tiny(Architecture::Qwen2)
    };
    let model = build(&spec);
    let n_vocab = model.config.n_vocab;
    let long: Vec<u32> = (0..MAX_PASS_TOKENS + 37)
        .map(|i| (i * 7 % 200) as u32 + 3)
        .collect();
    let mut kv = model.new_kv_cache(long.len());
    let chunked = model
        .forward(
            &pool,
            &long,
            &mut kv,
            &mut Scratch::default(),
            LogitsFor::All,
        )
        .unwrap();
    assert_eq!(kv.len(), long.len());
    assert_eq!(chunked.len(), long.len() * n_vocab);
    let mut kv = model.new_kv_cache(long.len());
    let mut scratch = Scratch::default();
    let mut pieces = Vec::new();
    for piece in long.chunks(100) {
        pieces.extend(
            model
                .forward(&pool, piece, &mut kv, &mut scratch, LogitsFor::All)
                .unwrap(),
        );
    }
    assert!(max_abs_diff(&chunked, &pieces) < 1e-4);

    // A batch: one long segment and one short, last-token logits in segment order.
    let short = &long[..9];
    let (mut kv_long, mut kv_short) = (model.new_kv_cache(long.len()), model.new_kv_cache(9));
    let batch = model
        .forward_batch(
            &pool,
            &mut [
                Segment::new(short, &mut kv_short),
                Segment::new(&long, &mut kv_long),
            ],
            &mut Scratch::default(),
            LogitsFor::Last,
        )
        .unwrap();
    assert_eq!((kv_short.len(), kv_long.len()), (9, long.len()));
    let last = |t: usize| &pieces[t * n_vocab..(t + 1) * n_vocab];
    assert!(max_abs_diff(&batch[..n_vocab], last(8)) < 1e-4);
    assert!(max_abs_diff(&batch[n_vocab..], last(long.len() - 1)) < 1e-4);

    // A bad token in a later chunk is found before the first chunk touches the cache.
    let mut bad = long.clone();
    bad[MAX_PASS_TOKENS + 5] = n_vocab as u32;
    let mut kv = model.new_kv_cache(bad.len());
    let err = model
        .forward(
            &pool,
            &bad,
            &mut kv,
            &mut Scratch::default(),
            LogitsFor::Last,
        )
        .unwrap_err();
    assert!(matches!(err, ModelError::TokenOutOfRange { .. }), "{err}");
    assert_eq!(kv.len(), 0);
}

/// An integer model never keeps an f32 copy of the vocabulary: a tied model reads its
/// embeddings from the quantised output projection, an untied one keeps its table in INT8;
/// either way the embeddings are the f32 ones to within INT8 rounding, and the model
/// loaded straight into INT8 is the f32 model converted.
#[test]
fn integer_models_keep_no_f32_vocabulary() {
    use pyramid_model::Embedding;
    let pool = ThreadPool::new(2).unwrap();
    for untied_output in [false, true] {
        let spec = SyntheticSpec {
            untied_output,
            ..SyntheticSpec::tiny(Architecture::Llama)
        };
        let bytes = synthetic_gguf(&spec).unwrap().to_bytes();
        let file = GgufFile::from_bytes(bytes).unwrap();
        let reference = Model::from_gguf(&file).unwrap();
        for precision in [Precision::Int8, Precision::Int4] {
            let model = Model::from_gguf_as(&file, precision, None).unwrap();
            match (&model.weights.token_embd, untied_output) {
                (Embedding::Output, false) => {}
                (Embedding::Table(table), true) => {
                    assert!(
                        matches!(table.as_ref(), pyramid_model::Linear::Quant(_)),
                        "{precision}"
                    )
                }
                (other, _) => panic!("{precision} untied={untied_output}: {other:?}"),
            }
            assert!(model.weights.embedding_table().is_none());
            let e = model.config.n_embd;
            let (mut got, mut want) = (vec![0.0; e], vec![0.0; e]);
            for token in [0, 7, model.config.n_vocab - 1] {
                model.weights.embed(token, &mut got);
                reference.weights.embed(token, &mut want);
                let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                // Half a step: 4-bit groups span min..max in 15 steps, INT8 blocks ±max in 254.
                let steps = if precision == Precision::Int4 && !untied_output {
                    15.0
                } else {
                    254.0
                };
                let bound = scale / steps * 1.01 + 1e-6;
                assert!(
                    max_abs_diff(&got, &want) <= bound,
                    "{precision} token {token}"
                );
            }
            let converted = Model::from_gguf(&file)
                .unwrap()
                .into_precision(precision, None);
            let run = |m: &Model| {
                m.forward(
                    &pool,
                    &PROMPT,
                    &mut m.new_kv_cache(16),
                    &mut Scratch::default(),
                    LogitsFor::Last,
                )
                .unwrap()
            };
            assert_eq!(
                run(&model),
                run(&converted),
                "{precision} untied={untied_output}"
            );
        }
    }
}

/// A reserved cache grown across three windows copies nothing and gives, bit for bit, the
/// logits of a compact cache started on the largest window; a compact cache grown the same
/// way copies its live positions and agrees too. For every KV type.
#[test]
fn reserved_caches_grow_across_windows_without_a_copy() {
    let pool = ThreadPool::new(2).unwrap();
    let model = build(&SyntheticSpec::tiny(Architecture::Llama));
    let tokens: Vec<u32> = (0..120).map(|i| (i * 37 + 11) % 250).collect();
    let pieces = [(0, 20), (20, 33), (33, 70), (70, 120)];
    let windows = [32, 64, 128];
    for kind in KvType::ALL {
        let mut scratch = Scratch::default();
        let mut run = |kv: &mut pyramid_model::KvCache, from: usize, to: usize| {
            model
                .forward(&pool, &tokens[from..to], kv, &mut scratch, LogitsFor::All)
                .unwrap()
        };
        let mut large = model.new_kv_cache_of(128, kind);
        let want: Vec<Vec<f32>> = pieces.iter().map(|&(a, b)| run(&mut large, a, b)).collect();
        let cfg = &model.config;
        let mut reserved = pyramid_model::KvCache::with_reserve(cfg, 32, 128, kind);
        let mut compact = pyramid_model::KvCache::new(cfg, 32, kind);
        assert!(!reserved.is_compact() && compact.is_compact());
        assert_eq!(
            reserved.bytes(),
            compact.bytes(),
            "budgets count the window"
        );
        let (mut copied_reserved, mut copied_compact) = (0, 0);
        for (i, &(a, b)) in pieces.iter().enumerate() {
            // Move up to the smallest window holding this piece, as the engine does.
            let window = *windows.iter().find(|&&w| w >= b).unwrap();
            if window > reserved.capacity() {
                copied_reserved += reserved.grow_to(window).unwrap();
                copied_compact += compact.grow_to(window).unwrap();
            }
            assert_eq!(reserved.capacity(), window);
            // Each head's view is the window, whatever the run behind it.
            assert_eq!(
                reserved.head_f32(1, 0).map(|(k, v)| (k.len(), v.len())),
                (kind == KvType::F32).then_some((window * cfg.head_dim, window * cfg.head_dim))
            );
            assert_eq!(
                run(&mut reserved, a, b),
                want[i],
                "{kind}: reserved, piece {i}"
            );
            assert_eq!(
                run(&mut compact, a, b),
                want[i],
                "{kind}: compact, piece {i}"
            );
        }
        assert_eq!(copied_reserved, 0, "{kind}: a reserved cache never copies");
        assert!(
            copied_compact > 0,
            "{kind}: a compact cache copies its live rows"
        );
        // Beyond the reserve (or the context) is an error that changes nothing.
        assert!(reserved.grow_to(100).is_err(), "below the live positions");
        assert!(reserved.grow_to(cfg.n_ctx_train + 1).is_err());
        assert_eq!(reserved.capacity(), 128);
    }
}

#[test]
fn a_reserve_the_allocator_refuses_gives_a_compact_cache() {
    // A context of 2^40 positions: its reserve is beyond any address space (and memory
    // and swap), which the allocator refuses; the cache must still work.
    let mut cfg = build(&SyntheticSpec::tiny(Architecture::Llama))
        .config
        .clone();
    cfg.n_ctx_train = 1 << 40;
    for kind in KvType::ALL {
        let mut kv = pyramid_model::KvCache::with_reserve(&cfg, 32, cfg.n_ctx_train, kind);
        assert!(kv.is_compact(), "{kind}");
        assert_eq!(kv.capacity(), 32);
        kv.grow_to(64).unwrap();
        assert_eq!(kv.capacity(), 64);
    }
}

/// Gemma 3's local layers see only their window: with local layers alone, a token more than
/// `layers × (window − 1)` positions back cannot change the last position's logits, while
/// one global layer lets it.
#[test]
fn sliding_window_layers_see_only_their_window() {
    let pool = ThreadPool::new(2).unwrap();
    let last_logits = |spec: &SyntheticSpec, first: u32| {
        let model = build(spec);
        let prompt: Vec<u32> = std::iter::once(first)
            .chain((1..30).map(|i| 40 + i % 50))
            .collect();
        let mut kv = model.new_kv_cache(64);
        model
            .forward(
                &pool,
                &prompt,
                &mut kv,
                &mut Scratch::default(),
                LogitsFor::Last,
            )
            .unwrap()
    };
    let local_only = SyntheticSpec {
        n_layer: 2,
        ..SyntheticSpec::tiny(Architecture::Gemma3)
    };
    assert_eq!(last_logits(&local_only, 65), last_logits(&local_only, 66));
    // Within reach of the window, the first token matters.
    let wide = SyntheticSpec {
        sliding_window: 16,
        ..local_only.clone()
    };
    assert_ne!(last_logits(&wide, 65), last_logits(&wide, 66));
    let with_global = SyntheticSpec::tiny(Architecture::Gemma3);
    assert_ne!(last_logits(&with_global, 65), last_logits(&with_global, 66));
}

/// A text's mean-pooled hidden states, summed through `chunks` passes of `chunk` tokens,
/// each beside a decoding sequence when `beside` holds one.
fn pooled_sum(
    model: &Model,
    pool: &ThreadPool,
    tokens: &[u32],
    chunk: usize,
    mut beside: Option<&mut pyramid_model::KvCache>,
) -> Vec<f32> {
    let mut sum = vec![0.0f32; model.config.n_embd];
    let mut kv = model.new_kv_cache(64);
    let mut scratch = Scratch::default();
    for (i, piece) in tokens.chunks(chunk).enumerate() {
        let rows = Pooling::Mean.rows(i * chunk, piece.len(), tokens.len());
        let mut segments = vec![Segment::pooled(piece, &mut kv, rows, &mut sum)];
        if let Some(other) = beside.as_deref_mut() {
            segments.push(Segment::new(&[5], other));
        }
        let logits = model
            .forward_batch(pool, &mut segments, &mut scratch, LogitsFor::Last)
            .unwrap();
        assert_eq!(logits.len(), (segments.len() - 1) * model.config.n_vocab);
    }
    assert_eq!(kv.len(), tokens.len());
    sum
}

#[test]
fn pooled_hidden_states_are_the_same_in_chunks_batches_and_thread_counts() {
    let model = build(&SyntheticSpec::tiny(Architecture::Qwen2));
    let one = ThreadPool::new(1).unwrap();
    let two = ThreadPool::new(2).unwrap();
    let whole = pooled_sum(&model, &one, &PROMPT, PROMPT.len(), None);
    assert!(whole.iter().any(|&x| x != 0.0));
    assert_eq!(pooled_sum(&model, &two, &PROMPT, 5, None), whole);
    let mut other = model.new_kv_cache(64);
    let mut scratch = Scratch::default();
    model
        .forward(&two, &[7, 8, 9], &mut other, &mut scratch, LogitsFor::Last)
        .unwrap();
    assert_eq!(
        pooled_sum(&model, &two, &PROMPT, 4, Some(&mut other)),
        whole
    );

    // The last token's state pooled alone, against the mean of one token.
    let last = pooled_sum(&model, &one, &PROMPT[11..], 1, None);
    let mut sum = vec![0.0f32; model.config.n_embd];
    let mut kv = model.new_kv_cache(64);
    model
        .forward_batch(
            &one,
            &mut [Segment::pooled(&PROMPT, &mut kv, 11..12, &mut sum)],
            &mut scratch,
            LogitsFor::Last,
        )
        .unwrap();
    assert_ne!(sum, last, "the last token attends to the whole text");
    assert_eq!(Pooling::Last.rows(0, 12, 12), 11..12);

    // Rows beyond the segment, a sum of the wrong width, or logits asked too: errors.
    let mut kv = model.new_kv_cache(64);
    let mut short = vec![0.0f32; 3];
    for (rows, sum) in [(0..13, &mut sum), (0..1, &mut short)] {
        let err = model
            .forward_batch(
                &one,
                &mut [Segment::pooled(&PROMPT, &mut kv, rows, sum)],
                &mut scratch,
                LogitsFor::Last,
            )
            .unwrap_err();
        assert!(matches!(err, ModelError::BadPooling { .. }), "{err}");
    }
    assert_eq!(kv.len(), 0);
}
