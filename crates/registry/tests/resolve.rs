//! `ModelCache::resolve` and `is_cached`, without fetching anything.
#![cfg(unix)]

mod common;

use std::fs;

use common::Fixture;
use pyramid_registry::{
    known_models, KnownModel, ModelCache, NoProgress, RegistryError, DEFAULT_MODEL,
};

/// A cache whose python does not exist: any attempt to fetch fails loudly.
fn offline_cache(fx: &Fixture) -> ModelCache {
    fx.cache.clone().with_python("/nonexistent/python3")
}

#[test]
fn an_existing_path_is_returned_as_is() {
    let fx = Fixture::new();
    let file = fx.dir.path().join("my model.gguf");
    fs::write(&file, b"GGUF").expect("write");
    let arg = file.to_str().expect("utf-8 temp path");

    let path = offline_cache(&fx)
        .resolve(arg, &NoProgress)
        .expect("resolves");

    assert_eq!(path, file);
}

#[test]
fn an_unknown_name_lists_the_known_ones() {
    let fx = Fixture::new();
    let err = offline_cache(&fx)
        .resolve("llama-7b", &NoProgress)
        .expect_err("unknown");
    assert!(
        matches!(&err, RegistryError::UnknownModel { name, .. } if name == "llama-7b"),
        "{err}"
    );
    let msg = err.to_string();
    for model in known_models() {
        assert!(msg.contains(model.name), "{msg}");
    }
    assert!(msg.contains("path to a GGUF file"), "{msg}");
}

#[test]
fn a_missing_path_says_it_does_not_exist() {
    let fx = Fixture::new();
    let err = offline_cache(&fx)
        .resolve("models/missing.gguf", &NoProgress)
        .expect_err("no such file");
    assert!(
        matches!(err, RegistryError::ModelFileNotFound { .. }),
        "{err}"
    );
    assert!(err.to_string().contains(DEFAULT_MODEL), "{err}");
}

#[test]
fn a_cached_known_name_resolves_without_fetching() {
    let fx = Fixture::new();
    let model = KnownModel::by_name(DEFAULT_MODEL).expect("default is known");
    fs::create_dir_all(fx.cache.models_dir()).expect("mkdir");
    // Sparse: the right size without writing 98 MB.
    let file = fs::File::create(fx.cache.path_of(model)).expect("create");
    file.set_len(model.n_bytes).expect("set_len");

    let path = offline_cache(&fx)
        .resolve(DEFAULT_MODEL, &NoProgress)
        .expect("cached");

    assert_eq!(
        path,
        fx.cache
            .root()
            .join("models/smollm2-135m-instruct-q4_1.gguf")
    );
}

#[test]
fn an_uncached_known_name_is_fetched() {
    let fx = Fixture::new();
    // The fetch is attempted (and fails here, with no python), rather than "unknown model".
    let err = offline_cache(&fx)
        .resolve(DEFAULT_MODEL, &NoProgress)
        .expect_err("fetch fails");
    assert!(matches!(err, RegistryError::PythonNotFound { .. }), "{err}");
}

#[test]
fn is_cached_checks_the_size() {
    let fx = Fixture::new();
    let model = common::model("sized", &"0".repeat(64), 1000, &[]);
    let path = fx.cache.path_of(&model);
    assert!(!fx.cache.is_cached(&model), "missing");

    fs::create_dir_all(fx.cache.models_dir()).expect("mkdir");
    fs::write(&path, vec![0u8; 999]).expect("write");
    assert!(!fx.cache.is_cached(&model), "too short");

    fs::write(&path, vec![0u8; 1000]).expect("write");
    assert!(fx.cache.is_cached(&model), "right size");

    fs::remove_file(&path).expect("rm");
    fs::create_dir(&path).expect("mkdir");
    assert!(!fx.cache.is_cached(&model), "a directory is not a model");
}
