//! A forward pass through a scratch sized by [`Scratch::for_shape`] allocates nothing: the
//! property static-shape artifacts promise ("running one never allocates").
//! Its own test binary, because it installs a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, KvType, LogitsFor, Model, Precision, Scratch, Segment};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn passes_within_the_prepared_shape_do_not_allocate() {
    let pool = ThreadPool::new(2).unwrap();
    let bytes = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Qwen2))
        .unwrap()
        .to_bytes();
    let f32_model = Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap();
    let calibration = f32_model.calibrate(&pool, &[1, 2, 3, 4]).unwrap();
    // Loading and quantising start rayon's global pool, whose threads each allocate as
    // they start, whenever the OS runs them: wait until every one has, or a late one
    // allocates inside a counted pass (one run in 50 did).
    rayon::broadcast(|_| ());
    for precision in Precision::ALL {
        let model = f32_model
            .clone()
            .into_precision(precision, Some(&calibration));
        for kv_type in KvType::ALL {
            let (chunk, window) = (8, 64);
            let mut scratch = Scratch::for_shape(&model, chunk, 1, window, pool.n_threads());
            let mut kv = model.new_kv_cache_of(window, kv_type);
            let prompt: Vec<u32> = (1..=chunk as u32).collect();
            let reserved = scratch.reserved_bytes();
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            for step in 0..4 {
                let tokens = if step == 0 { &prompt[..] } else { &prompt[..1] };
                let mut segments = [Segment::new(tokens, &mut kv)];
                model
                    .forward_into(&pool, &mut segments, &mut scratch, LogitsFor::Last)
                    .unwrap();
            }
            let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
            assert_eq!(allocations, 0, "{precision} kv {kv_type}");
            assert_eq!(
                scratch.reserved_bytes(),
                reserved,
                "{precision} kv {kv_type}"
            );
        }
    }
}
