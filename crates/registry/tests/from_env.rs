//! `ModelCache::from_env`. The only test in this binary, because it sets environment variables.

use std::path::PathBuf;

use pyramid_registry::{ModelCache, NoProgress, RegistryError};

#[test]
fn from_env_reads_pyramid_home_then_home() {
    std::env::set_var("PYRAMID_HOME", "/srv/pyramid");
    std::env::set_var("PYRAMID_PYTHON", "/nonexistent/python3.99");
    let cache = ModelCache::from_env().expect("PYRAMID_HOME is set");
    assert_eq!(cache.root(), PathBuf::from("/srv/pyramid"));
    assert_eq!(cache.models_dir(), PathBuf::from("/srv/pyramid/models"));

    // The configured python is the one a fetch runs.
    let dir = tempfile::tempdir().expect("tempdir");
    let err = ModelCache::new(dir.path())
        .with_python("/nonexistent/python3.99")
        .resolve("smollm2-135m", &NoProgress)
        .expect_err("no such python");
    assert!(err.to_string().contains("/nonexistent/python3.99"), "{err}");
    std::env::set_var("PYRAMID_HOME", dir.path());
    let err = ModelCache::from_env()
        .expect("set")
        .resolve("smollm2-135m", &NoProgress)
        .expect_err("no such python");
    assert!(
        matches!(err, RegistryError::PythonNotFound { ref python, .. } if python == "/nonexistent/python3.99"),
        "{err}"
    );

    std::env::remove_var("PYRAMID_HOME");
    std::env::set_var("HOME", "/home/someone");
    let cache = ModelCache::from_env().expect("HOME is set");
    assert_eq!(cache.root(), PathBuf::from("/home/someone/.cache/pyramid"));

    std::env::set_var("PYRAMID_HOME", "");
    std::env::remove_var("HOME");
    assert!(matches!(
        ModelCache::from_env(),
        Err(RegistryError::NoCacheDir)
    ));
}
