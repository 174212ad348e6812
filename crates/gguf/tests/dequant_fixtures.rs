//! Checks `quants::dequantize` and `quants::quantize` against fixtures produced by the
//! PyPI `gguf` package (see tests/fixtures/README.md), an implementation independent of
//! this crate.
//!
//! Comparison is bit-exact: both sides read the same f16 scales and apply the same f32
//! operations in the same order (scale products first, then code times scale, then the
//! min), and neither fuses multiply-adds, so no tolerance is needed. Any difference would
//! be a layout or arithmetic-order bug worth seeing.

use std::path::{Path, PathBuf};

use pyramid_gguf::quants::{dequantize, quantize};
use pyramid_gguf::GgmlType;
use serde_json::Value as Json;

const TYPES: [(GgmlType, &str); 13] = [
    (GgmlType::F32, "f32"),
    (GgmlType::F16, "f16"),
    (GgmlType::BF16, "bf16"),
    (GgmlType::Q4_0, "q4_0"),
    (GgmlType::Q4_1, "q4_1"),
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q5_1, "q5_1"),
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q2K, "q2_k"),
    (GgmlType::Q3K, "q3_k"),
    (GgmlType::Q4K, "q4_k"),
    (GgmlType::Q5K, "q5_k"),
    (GgmlType::Q6K, "q6_k"),
];

struct Fixture {
    path: PathBuf,
    bytes: Vec<u8>,
    expected: Vec<f32>,
    input: Option<Vec<f32>>,
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd-length hex");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("valid hex"))
        .collect()
}

fn f32s(s: &str) -> Vec<f32> {
    hex(s)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn load(ty: GgmlType, file: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{file}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: Json =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(json["type"], ty.name(), "{}", path.display());
    let field = |k: &str| json[k].as_str().map(str::to_string);
    let bytes = hex(&field("bytes_hex").expect("bytes_hex"));
    let expected = f32s(&field("expected_f32le_hex").expect("expected_f32le_hex"));
    assert_eq!(json["n_elements"].as_u64(), Some(expected.len() as u64));
    let input = field("input_f32le_hex").map(|h| f32s(&h));
    Fixture {
        path,
        bytes,
        expected,
        input,
    }
}

/// Equal as bit patterns, except that any NaN matches any NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn dequantize_matches_python_gguf() {
    for (ty, file) in TYPES {
        let f = load(ty, file);
        assert!(!f.expected.is_empty());
        let mut out = vec![f32::NAN; f.expected.len()];
        dequantize(ty, &f.bytes, &mut out).unwrap_or_else(|e| panic!("{ty}: {e}"));
        for (i, (&got, &want)) in out.iter().zip(&f.expected).enumerate() {
            assert!(
                same(got, want),
                "{ty} element {i} (block {}): got {got:e}, gguf-py gives {want:e} [{}]",
                i / ty.block_len(),
                f.path.display()
            );
        }
    }
}

#[test]
fn dequantize_rejects_fixture_bytes_with_wrong_count() {
    for (ty, file) in TYPES {
        let f = load(ty, file);
        let mut out = vec![0f32; f.expected.len()];
        assert!(dequantize(ty, &f.bytes[1..], &mut out).is_err(), "{ty}");
        let mut out = vec![0f32; f.expected.len() - ty.block_len()];
        assert!(dequantize(ty, &f.bytes, &mut out).is_err(), "{ty}");
    }
}

/// GGML's reference quantisers round the same way in f32 (truncate after adding 0.5 or
/// 8.5/16.5; `roundf` for Q8_0; round-to-nearest-even for f16/bf16), and the Python
/// package reproduces them, so the bytes must match exactly.
#[test]
fn quantize_matches_python_gguf() {
    let mut checked = 0;
    for (ty, file) in TYPES {
        let f = load(ty, file);
        let Some(input) = f.input else {
            continue;
        };
        let bytes = quantize(ty, &input).unwrap_or_else(|e| panic!("{ty}: {e}"));
        assert_eq!(bytes.len(), f.bytes.len(), "{ty}");
        if let Some(i) = bytes.iter().zip(&f.bytes).position(|(a, b)| a != b) {
            panic!(
                "{ty}: byte {i} (block {}) is {:#04x}, gguf-py wrote {:#04x}",
                i / ty.block_bytes(),
                bytes[i],
                f.bytes[i]
            );
        }
        // And back: our own quantised bytes decode to the Python floats.
        let mut out = vec![0f32; input.len()];
        dequantize(ty, &bytes, &mut out).expect("dequantises");
        assert!(
            out.iter().zip(&f.expected).all(|(&a, &b)| same(a, b)),
            "{ty}"
        );
        checked += 1;
    }
    assert_eq!(
        checked, 8,
        "every quantisable type has a Python-quantised fixture"
    );
}
