//! Opens the real model files the engine is tested with and checks them against spot
//! values from the PyPI `gguf` package (tests/fixtures/real_models.json).
//!
//! The files live in `$PYRAMID_HOME/models` (default `~/.cache/pyramid/models`). CI
//! fetches them before running tests, so a missing file fails here rather than skipping.

use std::path::PathBuf;

use pyramid_gguf::GgufFile;
use serde_json::Value as Json;

fn models_dir() -> PathBuf {
    let home = match std::env::var_os("PYRAMID_HOME") {
        Some(h) if !h.is_empty() => PathBuf::from(h),
        _ => {
            let user_home = std::env::var_os("HOME").expect("neither PYRAMID_HOME nor HOME is set");
            PathBuf::from(user_home).join(".cache/pyramid")
        }
    };
    home.join("models")
}

fn open(file_name: &str) -> GgufFile {
    let path = models_dir().join(file_name);
    assert!(
        path.is_file(),
        "model file {} is missing: fetch it before running tests (CI does), or point \
         PYRAMID_HOME at a directory whose models/ holds it",
        path.display()
    );
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn spot_checks() -> Json {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/real_models.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn f32s(hex: &str) -> Vec<f32> {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("valid hex"))
        .collect();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn check_model(file_name: &str, arch: &str, n_tensors: usize, n_blocks: u64) {
    let file = open(file_name);
    let meta = file.metadata();
    assert_eq!(
        meta.get_str("general.architecture").expect("architecture"),
        arch
    );
    assert_eq!(
        meta.get_u64(&format!("{arch}.block_count"))
            .expect("block count"),
        n_blocks
    );
    assert_eq!(file.tensors().len(), n_tensors, "{file_name} tensor count");

    let all = spot_checks();
    let expected = &all["models"][file_name];
    assert_eq!(expected["architecture"], arch);
    assert_eq!(expected["n_tensors"].as_u64(), Some(n_tensors as u64));
    assert_eq!(
        expected["n_kv"].as_u64(),
        Some(meta.len() as u64),
        "{file_name} metadata count"
    );

    // Every tensor decodes, to finite values.
    for info in file.tensors() {
        let values = file
            .tensor_f32(&info.name)
            .unwrap_or_else(|e| panic!("{file_name}: {}: {e}", info.name));
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            panic!("{file_name}: {} [{i}] = {}", info.name, values[i]);
        }
    }

    // Spot values from gguf-py: the first 64 bit-exact, and the f64 sum of all of them.
    // The sums differ only by summation order (numpy sums pairwise), an error far below
    // 1e-9 of the sum of magnitudes for tensors of this size.
    let checks = expected["tensors"].as_array().expect("tensor checks");
    assert!(!checks.is_empty());
    for c in checks {
        let name = c["tensor"].as_str().expect("name");
        let info = file.tensor_info(name).expect("spot-checked tensor exists");
        assert_eq!(c["type"], info.ggml_type.name(), "{name}");
        let values = file.tensor_f32(name).expect("decodes");
        assert_eq!(
            Some(values.len() as u64),
            c["n_elements"].as_u64(),
            "{name}"
        );
        let first = f32s(c["first_f32le_hex"].as_str().expect("hex"));
        let got: Vec<u32> = values[..first.len()].iter().map(|v| v.to_bits()).collect();
        let want: Vec<u32> = first.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{file_name}: first values of {name}");
        let sum: f64 = values.iter().map(|&v| f64::from(v)).sum();
        let want_sum = c["sum"].as_f64().expect("sum");
        let scale = c["sum_abs"].as_f64().expect("sum_abs");
        assert!(
            (sum - want_sum).abs() <= 1e-9 * scale + 1e-12,
            "{file_name}: sum of {name} is {sum}, gguf-py says {want_sum}"
        );
    }
}

#[test]
fn smollm2_135m_q4_1() {
    check_model("smollm2-135m-instruct-q4_1.gguf", "llama", 272, 30);
}

#[test]
fn qwen2_5_coder_0_5b_q4_k_m() {
    check_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2", 291, 24);
}
