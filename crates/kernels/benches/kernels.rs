//! Throughput of the hot kernels on Qwen2.5-0.5B's shapes, in multiply-adds per second
//! (criterion's "elements"), so a kernel's figure can be set against the machine's limits:
//! `cargo bench -p pyramid-kernels`. Uses every core, as a forward pass does.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pyramid_kernels::attention::int8::attend_rows_int8;
use pyramid_kernels::attention::{
    attend_group, attend_rows, attend_rows_shared, meeting_len, KvRows, MAX_ROWS,
};
use pyramid_kernels::int4::{gemm_i4, PackedI4};
use pyramid_kernels::int6::{gemm_i6, PackedI6};
use pyramid_kernels::int8::{gemm_i8, quantize_blocks_excluding, PackedI8, QuantizedRows, BLOCK_K};
use pyramid_kernels::isa;
use pyramid_kernels::scales::Scales;
use pyramid_kernels::{SharedSlice, ThreadPool};

/// FFN gate/up of Qwen2.5-0.5B: the largest projection of a layer.
const K: usize = 896;
const N: usize = 4864;

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 2654435761 + seed * 97) % 2001) as f32 / 1000.0) - 1.0)
        .collect()
}

fn integer_gemm(c: &mut Criterion) {
    let pool = ThreadPool::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
        .expect("thread pool");
    let w = values(N * K, 1);
    let (w8, w4) = (PackedI8::quantize(&w, N, K), PackedI4::quantize(&w, N, K));
    let w6 = q6k_like(&w, N, K);
    let mut group = c.benchmark_group("gemm");
    group.sample_size(20);
    for m in [1, 8, 32, 128] {
        let mut a = QuantizedRows::default();
        a.quantize(&values(m * K, 2), m, K, w8.k_pad);
        let mut out = vec![0.0; m * N];
        group.throughput(Throughput::Elements((m * N * K) as u64));
        group.bench_with_input(BenchmarkId::new("int8", m), &m, |b, _| {
            b.iter(|| gemm_i8(&pool, &a.view(), &w8, &mut out))
        });
        group.bench_with_input(BenchmarkId::new("int4", m), &m, |b, _| {
            b.iter(|| gemm_i4(&pool, &a.view(), &w4, &mut out))
        });
        group.bench_with_input(BenchmarkId::new("int6", m), &m, |b, _| {
            b.iter(|| gemm_i6(&pool, &a.view(), &w6, &mut out))
        });
    }
    group.finish();
}

/// `w` in six bits as a Q6_K file holds it: codes around a zero point of 32, an i8 scale
/// per 16 values under an f16 per 256.
fn q6k_like(w: &[f32], n: usize, k: usize) -> PackedI6 {
    let d = vec![half::f16::from_f32(1.0 / 1024.0); n * k.div_ceil(256)];
    let sub = vec![31i8; n * k.div_ceil(16)];
    let codes: Vec<u8> = w.iter().map(|v| ((v + 1.0) * 31.5).round() as u8).collect();
    PackedI6::from_rows(
        n,
        k,
        32,
        Scales::super_block(n, k, 16, &d, &sub),
        |row, out| out.copy_from_slice(&codes[row * k..(row + 1) * k]),
    )
}

/// One decode step's products on SmolLM2-135M's shapes, every layer's weights their own
/// (120 matrices and the output head, 134 M weights): unlike [`integer_gemm`]'s one
/// matrix, which stays in cache between iterations, each weight is read from L3 or
/// memory once per step, as in decoding, so this is where streaming the weights shows.
fn decode_step_gemms(c: &mut Criterion) {
    const LAYERS: usize = 30;
    const EMBD: usize = 576;
    const KV: usize = 192;
    const FF: usize = 1536;
    const VOCAB: usize = 49152;
    let pool = ThreadPool::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
        .expect("thread pool");
    let layer = [
        (EMBD, EMBD + 2 * KV),
        (EMBD, EMBD),
        (EMBD, 2 * FF),
        (FF, EMBD),
    ];
    let shapes: Vec<(usize, usize)> = (0..LAYERS)
        .flat_map(|_| layer)
        .chain([(EMBD, VOCAB)])
        .collect();
    let weights: Vec<(PackedI8, PackedI4)> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(k, n))| {
            let w = values(n * k, i);
            (PackedI8::quantize(&w, n, k), PackedI4::quantize(&w, n, k))
        })
        .collect();
    let multiply_adds: usize = shapes.iter().map(|(k, n)| k * n).sum();
    let mut group = c.benchmark_group("decode_step");
    group.sample_size(10);
    for m in [1, 8, 16] {
        let inputs: Vec<QuantizedRows> = [EMBD, FF]
            .iter()
            .map(|&k| {
                let mut a = QuantizedRows::default();
                a.quantize(&values(m * k, 2), m, k, k);
                a
            })
            .collect();
        let input = |k: usize| inputs[usize::from(k == FF)].view();
        let mut out = vec![0.0; m * VOCAB];
        group.throughput(Throughput::Elements((m * multiply_adds) as u64));
        group.bench_with_input(BenchmarkId::new("int8", m), &m, |b, _| {
            b.iter(|| {
                for (&(k, n), (w8, _)) in shapes.iter().zip(&weights) {
                    gemm_i8(&pool, &input(k), w8, &mut out[..m * n]);
                }
            })
        });
        group.bench_with_input(BenchmarkId::new("int4", m), &m, |b, _| {
            b.iter(|| {
                for (&(k, n), (_, w4)) in shapes.iter().zip(&weights) {
                    gemm_i4(&pool, &input(k), w4, &mut out[..m * n]);
                }
            })
        });
    }
    group.finish();
}

/// One KV head's cached rows of `n_pos` positions, f32 and INT8.
struct BenchCache {
    keys: Vec<f32>,
    values: Vec<f32>,
    keys_i8: Vec<i8>,
    values_i8: Vec<i8>,
    scales: Vec<f32>,
}

impl BenchCache {
    fn new(n_pos: usize, head_dim: usize) -> Self {
        let keys = values(n_pos * head_dim, 4);
        let values_f32 = values(n_pos * head_dim, 5);
        let to_i8 = |v: &[f32]| v.iter().map(|&x| (x * 127.0) as i8).collect::<Vec<_>>();
        Self {
            keys_i8: to_i8(&keys),
            values_i8: to_i8(&values_f32),
            scales: vec![1.0 / 127.0; n_pos],
            keys,
            values: values_f32,
        }
    }

    /// The rows as each storage type a benchmark reports, with its name.
    fn kinds(&self) -> [(&'static str, KvRows<'_>); 2] {
        [
            (
                "f32",
                KvRows::F32 {
                    keys: &self.keys,
                    values: &self.values,
                },
            ),
            (
                "int8",
                KvRows::Int8 {
                    keys: &self.keys_i8,
                    key_scales: &self.scales,
                    values: &self.values_i8,
                    value_scales: &self.scales,
                },
            ),
        ]
    }
}

fn grouped_attention(c: &mut Criterion) {
    // One token's seven query heads over one KV head of 4,096 cached positions.
    let (head_dim, n_q, n_pos) = (64, 7, 4096);
    let q = values(n_q * head_dim, 3);
    let cache = BenchCache::new(n_pos, head_dim);
    let mut group = c.benchmark_group("attention");
    group.throughput(Throughput::Elements((2 * n_q * n_pos * head_dim) as u64));
    let (mut scratch, mut out) = (Vec::new(), vec![0.0; n_q * head_dim]);
    for (name, kv) in cache.kinds() {
        group.bench_function(BenchmarkId::new(name, n_pos), |b| {
            b.iter(|| attend_group(&q, head_dim, kv, 0.125, &mut scratch, &mut out))
        });
    }
    group.finish();
}

/// One token's attention in a decode step on SmolLM2's shapes at depth 4,096: 30 layers ×
/// 3 KV heads, each with its own cache (180 MB in f32), so every row comes from memory as
/// in decoding, unlike [`grouped_attention`]'s one cache that stays in L2. One thread.
fn decode_attention(c: &mut Criterion) {
    const CACHES: usize = 90;
    let (head_dim, n_q, n_pos) = (64, 3, 4096);
    let q = values(n_q * head_dim, 3);
    let caches: Vec<BenchCache> = (0..CACHES)
        .map(|_| BenchCache::new(n_pos, head_dim))
        .collect();
    let mut group = c.benchmark_group("decode_attention");
    group.sample_size(10);
    group.throughput(Throughput::Elements(
        (CACHES * 2 * n_q * n_pos * head_dim) as u64,
    ));
    let (mut scratch, mut out) = (Vec::new(), vec![0.0; n_q * head_dim]);
    let kinds = with_int8_products(caches[0].kinds());
    for (k, (name, _, int8_products)) in kinds.into_iter().enumerate() {
        group.bench_function(BenchmarkId::new(name, n_pos), |b| {
            b.iter(|| {
                for cache in &caches {
                    let kv = cache.kinds()[k.min(1)].1;
                    let mut outs = [out.as_mut_slice()];
                    if int8_products {
                        attend_rows_int8(
                            &[&q],
                            head_dim,
                            kv,
                            n_pos,
                            0.125,
                            &mut scratch,
                            &mut outs,
                        );
                    } else {
                        attend_group(&q, head_dim, kv, 0.125, &mut scratch, outs[0]);
                    }
                }
            })
        });
    }
    group.finish();
}

/// The storage types of [`BenchCache::kinds`] with the exact products, then the INT8 cache
/// with INT8 products ("int8-products").
fn with_int8_products<'a>(
    kinds: [(&'static str, KvRows<'a>); 2],
) -> Vec<(&'static str, KvRows<'a>, bool)> {
    let mut all: Vec<_> = kinds.iter().map(|&(name, kv)| (name, kv, false)).collect();
    all.push(("int8-products", kinds[1].1, true));
    all
}

/// [`decode_attention`]'s 90 caches on a team of two threads, as a SmolLM2 decode step
/// of one sequence reads them: per layer, KV heads 0 and 1 one to each thread and head 2
/// either to the first thread ("dealt", 2:1) or shared by both ("shared"), then a
/// barrier.
fn decode_attention_team(c: &mut Criterion) {
    const LAYERS: usize = 30;
    let (head_dim, n_q, n_pos) = (64, 3, 4096);
    let pool = ThreadPool::new(2).expect("thread pool");
    let q = values(n_q * head_dim, 3);
    let caches: Vec<BenchCache> = (0..LAYERS * 3)
        .map(|_| BenchCache::new(n_pos, head_dim))
        .collect();
    let mut meeting = vec![0.0; meeting_len(n_pos, 1, 2)];
    let meeting = SharedSlice::new(&mut meeting);
    let mut out = vec![0.0; 3 * n_q * head_dim];
    let out = SharedSlice::new(&mut out);
    let mut group = c.benchmark_group("decode_attention_team");
    group.sample_size(10);
    group.throughput(Throughput::Elements(
        (LAYERS * 3 * 2 * n_q * n_pos * head_dim) as u64,
    ));
    for k in 0..2 {
        for share in [false, true] {
            let name = format!(
                "{}/{}",
                ["f32", "int8"][k],
                ["dealt", "shared"][usize::from(share)]
            );
            group.bench_function(BenchmarkId::new(name, n_pos), |b| {
                b.iter(|| {
                    pool.run_team(&|team| {
                        let mut scratch = Vec::new();
                        for layer in caches.chunks_exact(3) {
                            let kv = |head: usize| layer[head].kinds()[k].1;
                            let span =
                                |head: usize| head * n_q * head_dim..(head + 1) * n_q * head_dim;
                            let mine = [team.idx()]
                                .into_iter()
                                .chain((!share && team.idx() == 0).then_some(2));
                            for head in mine {
                                // SAFETY: each head's span of `out` is one thread's.
                                let o = unsafe { out.range_mut(span(head)) };
                                attend_group(&q, head_dim, kv(head), 0.125, &mut scratch, o);
                            }
                            if share {
                                // SAFETY: both threads share head 2; nobody else touches it.
                                unsafe {
                                    attend_rows_shared(
                                        team,
                                        isa::active(),
                                        &[&q],
                                        head_dim,
                                        kv(2),
                                        n_pos,
                                        0.125,
                                        &meeting,
                                        &out,
                                        &[span(2).start],
                                    )
                                };
                            }
                            team.sync();
                        }
                    })
                })
            });
        }
    }
    group.finish();
}

/// One prefill block of [`MAX_ROWS`] consecutive rows at depth 4,096 over one KV head, for
/// SmolLM2's group of three query heads and Qwen2.5's seven: the attention of a long
/// prompt's chunk. One thread, as each block is one thread's work item.
fn prefill_attention(c: &mut Criterion) {
    let (head_dim, first_len) = (64, 4096);
    let n_pos = first_len + MAX_ROWS - 1;
    let cache = BenchCache::new(n_pos, head_dim);
    let mut group = c.benchmark_group("prefill_attention");
    group.sample_size(20);
    for n_q in [3, 7] {
        let q = values(MAX_ROWS * n_q * head_dim, 3);
        let q_rows: Vec<&[f32]> = q.chunks_exact(n_q * head_dim).collect();
        let mut out = vec![0.0; MAX_ROWS * n_q * head_dim];
        let mut scratch = Vec::new();
        // Scores and weighted sums: two multiply-adds per row, head, position and column.
        let seen: usize = (0..MAX_ROWS).map(|r| first_len + r).sum();
        group.throughput(Throughput::Elements((2 * n_q * seen * head_dim) as u64));
        for (name, kv, int8_products) in with_int8_products(cache.kinds()) {
            let attend = if int8_products {
                attend_rows_int8
            } else {
                attend_rows
            };
            group.bench_function(BenchmarkId::new(name, n_q), |b| {
                b.iter(|| {
                    let mut outs: Vec<&mut [f32]> = out.chunks_exact_mut(n_q * head_dim).collect();
                    attend(
                        &q_rows,
                        head_dim,
                        kv,
                        first_len,
                        0.125,
                        &mut scratch,
                        &mut outs,
                    )
                })
            });
        }
    }
    group.finish();
}

/// Quantising a prefill chunk's activations for a projection of Qwen2.5-0.5B's FFN
/// (128 rows of `k` values, a few outlier channels left out), as every projection site
/// does before its product: elements are values quantised.
fn activation_quantisation(c: &mut Criterion) {
    const ROWS: usize = 128;
    let x = values(ROWS * K, 6);
    let excluded = [7, 300, 301, 640];
    let k_pad = K.next_multiple_of(BLOCK_K);
    let (mut q, mut scales) = (vec![0i8; k_pad], vec![0.0f32; k_pad / BLOCK_K]);
    let mut group = c.benchmark_group("quantise");
    group.throughput(Throughput::Elements((ROWS * K) as u64));
    group.bench_function("activations", |b| {
        b.iter(|| {
            for row in x.chunks_exact(K) {
                quantize_blocks_excluding(row, &excluded, &mut q, &mut scales);
            }
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    activation_quantisation,
    integer_gemm,
    decode_step_gemms,
    grouped_attention,
    decode_attention,
    decode_attention_team,
    prefill_attention
);
criterion_main!(benches);
