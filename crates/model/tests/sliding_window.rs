//! Sliding-window layers give back the cache rows older than their window: a tiny Gemma 3
//! (windows of 8 positions) decodes bit for bit as with every row kept, through copies,
//! window moves and a round trip to disk, and refuses to go on from where rows are gone.

use pyramid_gguf::GgufFile;
use pyramid_kernels::attention::KvRows;
use pyramid_kernels::{ops::argmax, ThreadPool};
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{
    Architecture, KvCache, KvFootprint, KvType, LogitsFor, Model, ModelError, Scratch,
};

const PROMPT: usize = 1400;
const STEPS: usize = 12;

fn gemma() -> Model {
    let spec = SyntheticSpec {
        n_ctx: 2048,
        ..SyntheticSpec::tiny(Architecture::Gemma3)
    };
    let bytes = synthetic_gguf(&spec).unwrap().to_bytes();
    Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
}

fn prompt() -> Vec<u32> {
    (0..PROMPT as u32).map(|i| (i * 53 + 7) % 250).collect()
}

/// Greedy decode from `kv` for `STEPS` tokens, `release` after every pass; the logits of
/// each step.
fn decode(model: &Model, kv: &mut KvCache, first: u32, release: bool) -> Vec<Vec<f32>> {
    let pool = ThreadPool::new(2).unwrap();
    let mut scratch = Scratch::default();
    let mut token = first;
    let mut out = Vec::new();
    for _ in 0..STEPS {
        let logits = model
            .forward(&pool, &[token], kv, &mut scratch, LogitsFor::Last)
            .unwrap();
        if release {
            kv.release_out_of_window();
        }
        token = argmax(&logits);
        out.push(logits);
    }
    out
}

fn prefilled(model: &Model, kv: &mut KvCache) {
    let pool = ThreadPool::new(2).unwrap();
    model
        .forward(
            &pool,
            &prompt(),
            kv,
            &mut Scratch::default(),
            LogitsFor::Last,
        )
        .unwrap();
}

/// The key row of layer 0 (a local layer) at position 512, well inside the rows a release
/// gives back (the partial pages at a run's ends stay).
fn old_key(kv: &KvCache, hd: usize) -> Vec<f32> {
    match kv.head(0, 0, 513) {
        KvRows::F32 { keys, .. } => keys[512 * hd..].to_vec(),
        _ => unreachable!("f32 caches here"),
    }
}

#[test]
fn released_rows_change_no_logit_and_bound_what_a_cache_holds() {
    let model = gemma();
    let cfg = &model.config;
    let mut kept = KvCache::with_reserve(cfg, 2048, 2048, KvType::F32);
    prefilled(&model, &mut kept);
    let want = decode(&model, &mut kept, 7, false);

    let mut kv = KvCache::with_reserve(cfg, 2048, 2048, KvType::F32);
    prefilled(&model, &mut kv);
    assert_ne!(old_key(&kv, cfg.head_dim), vec![0.0; cfg.head_dim]);
    let full = kv.used_bytes();
    let released = kv.release_out_of_window();
    assert!(released > 0);
    assert_eq!(kv.used_bytes(), full - released);
    // The pages were given back: the row reads as the zeros they now hold.
    assert_eq!(old_key(&kv, cfg.head_dim), vec![0.0; cfg.head_dim]);
    assert_eq!(decode(&model, &mut kv, 7, true), want);

    // Five local layers in six hold at most their window and what is kept behind it.
    let footprint = KvFootprint::of(cfg, KvType::F32);
    assert_eq!(footprint.bytes(2048), kv.bytes());
    let all_layers = KvFootprint::of(
        &pyramid_model::ModelConfig {
            sliding_window: None,
            ..cfg.clone()
        },
        KvType::F32,
    );
    assert!(kv.bytes() < all_layers.bytes(2048) / 2);
    assert_eq!(footprint.bytes(64), all_layers.bytes(64));

    // Going on from far back would read rows that are gone.
    assert!(kv.resumable_at(kv.len()));
    assert!(kv.resumable_at(kv.len() - 200));
    assert!(!kv.resumable_at(100));
    let mut dst = KvCache::new(cfg, 2048, KvType::F32);
    assert!(matches!(
        kv.copy_prefix_into(100, &mut dst),
        Err(ModelError::BadConfig(_))
    ));
}

#[test]
fn copies_moves_and_disk_keep_the_tokens_after_a_release() {
    let model = gemma();
    let cfg = &model.config;
    let mut kept = KvCache::new(cfg, 1536, KvType::F32);
    prefilled(&model, &mut kept);
    let want = decode(&model, &mut kept, 9, false);

    let mut kv = KvCache::new(cfg, 1536, KvType::F32);
    prefilled(&model, &mut kv);
    kv.release_out_of_window();

    // A fork of every live position copies only what is held.
    let mut fork = KvCache::new(cfg, 1536, KvType::F32);
    let copied = kv.copy_prefix_into(kv.len(), &mut fork).unwrap();
    assert_eq!(copied, kv.used_bytes());
    assert_eq!(decode(&model, &mut fork, 9, true), want);

    // A compact cache moving to a larger window copies the same.
    let mut moved = kv.clone();
    assert_eq!(moved.grow_to(2048).unwrap(), kv.used_bytes());
    assert_eq!(decode(&model, &mut moved, 9, true), want);

    // To disk and back: the rows given back travel as zeros, and count as given back.
    let mut bytes = Vec::new();
    kv.write_live(&mut bytes).unwrap();
    let mut read = KvCache::with_reserve(cfg, 1536, 2048, KvType::F32);
    read.read_live(kv.len(), &mut bytes.as_slice()).unwrap();
    assert!(!read.resumable_at(100));
    assert_eq!(read.used_bytes(), kv.used_bytes());
    assert_eq!(decode(&model, &mut read, 9, true), want);
}
