//! `HfHub::from_env`. The only test in this binary, because it sets environment variables.

use pyramid_registry::{HfHub, HfModelId, NoProgress, RegistryError, DEFAULT_ENDPOINT};

#[test]
fn the_hugging_face_variables_configure_the_hub() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN"] {
        std::env::remove_var(name);
    }
    std::env::set_var("HF_HOME", dir.path());
    let hub = HfHub::from_env().unwrap();
    assert_eq!(hub.cache_dir(), dir.path().join("hub"));
    assert_eq!(hub.endpoint(), DEFAULT_ENDPOINT);

    std::env::set_var("HF_HUB_CACHE", dir.path().join("elsewhere"));
    std::env::set_var("HF_ENDPOINT", "http://127.0.0.1:9/");
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let hub = HfHub::from_env().unwrap();
    assert_eq!(hub.cache_dir(), dir.path().join("elsewhere"));
    assert_eq!(hub.endpoint(), "http://127.0.0.1:9");
    let id = HfModelId::parse("hf:org/repo:Q8_0").unwrap();
    match hub.resolve(&id, &NoProgress) {
        Err(RegistryError::HfNotCached { id, .. }) => assert_eq!(id, "hf:org/repo:Q8_0"),
        other => panic!("offline, expected HfNotCached, got {other:?}"),
    }
}
