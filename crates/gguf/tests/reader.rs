//! Reader tests: round trips through `GgufWriter`, and malformed files, each of which
//! must be an `Err` of a fitting kind and never a panic.

use pyramid_gguf::quants::{dequantize, quantize};
use pyramid_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value, GGUF_MAGIC};

// ---------------------------------------------------------------------------------------
// Round trips

fn every_value_type() -> Vec<(&'static str, Value)> {
    let s = |v: &str| Value::String(v.to_string());
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60_000)),
        ("t.i16", Value::I16(-30_000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(-1.5e-7)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.bool.true", Value::Bool(true)),
        ("t.bool.false", Value::Bool(false)),
        ("t.string", s("héllo, wörld ✓")),
        ("t.string.empty", s("")),
        (
            "t.array.strings",
            Value::Array(vec![s("a"), s(""), s("<|im_start|>")]),
        ),
        (
            "t.array.i32",
            Value::Array(vec![Value::I32(-1), Value::I32(0), Value::I32(7)]),
        ),
        (
            "t.array.u8",
            Value::Array(vec![Value::U8(1), Value::U8(255)]),
        ),
        ("t.array.u64", Value::Array(vec![Value::U64(1 << 40)])),
        (
            "t.array.f32",
            Value::Array(vec![Value::F32(0.5), Value::F32(-3.25)]),
        ),
        ("t.array.f64", Value::Array(vec![Value::F64(1e300)])),
        (
            "t.array.bool",
            Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
        ),
        ("t.array.empty", Value::Array(vec![])),
        (
            "t.array.nested",
            Value::Array(vec![
                Value::Array(vec![Value::U16(1), Value::U16(2)]),
                Value::Array(vec![Value::String("x".into())]),
                Value::Array(vec![]),
            ]),
        ),
    ]
}

fn ramp(n: usize, seed: u32) -> Vec<f32> {
    // A cheap deterministic pseudo-random sequence in [-2, 2).
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

/// (name, dims, type) of the tensors the round-trip file holds; sizes are chosen so most
/// tensors need padding.
fn tensor_specs() -> Vec<(&'static str, Vec<u64>, GgmlType)> {
    vec![
        ("f32.vector", vec![5], GgmlType::F32),
        ("f16.matrix", vec![3, 7], GgmlType::F16),
        ("bf16.3d", vec![2, 3, 4], GgmlType::BF16),
        ("q8_0.matrix", vec![64, 3], GgmlType::Q8_0),
        ("q4_0.matrix", vec![32, 5], GgmlType::Q4_0),
        ("q4_1.4d", vec![32, 2, 1, 3], GgmlType::Q4_1),
        ("q5_0.vector", vec![96], GgmlType::Q5_0),
        ("q5_1.vector", vec![32], GgmlType::Q5_1),
    ]
}

fn round_trip(alignment: Option<u32>) {
    let mut w = GgufWriter::new();
    for (k, v) in every_value_type() {
        w.add_metadata(k, v).expect("valid metadata");
    }
    if let Some(a) = alignment {
        w.add_metadata("general.alignment", Value::U32(a))
            .expect("valid alignment");
    }
    let mut expected_bytes = Vec::new();
    for (i, (name, dims, ty)) in tensor_specs().into_iter().enumerate() {
        let n = dims.iter().product::<u64>() as usize;
        let values = ramp(n, i as u32);
        w.add_tensor_f32(name, &dims, ty, &values)
            .expect("adds tensor");
        expected_bytes.push(quantize(ty, &values).expect("quantises"));
    }
    // A k-quant tensor from raw bytes (two random super-blocks with small scales).
    let mut q4k = vec![0u8; 2 * GgmlType::Q4K.block_bytes()];
    for (i, b) in q4k.iter_mut().enumerate() {
        *b = (i * 131 % 251) as u8;
    }
    for block in q4k.chunks_exact_mut(GgmlType::Q4K.block_bytes()) {
        block[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        block[2..4].copy_from_slice(&half::f16::from_f32(0.002).to_le_bytes());
    }
    w.add_tensor("q4_k.matrix", &[256, 2], GgmlType::Q4K, q4k.clone())
        .expect("adds raw tensor");
    expected_bytes.push(q4k);

    let bytes = w.to_bytes();
    let align = alignment.unwrap_or(32) as u64;
    let file = GgufFile::from_bytes(bytes.clone()).expect("parses what the writer wrote");
    assert_eq!(file.version(), 3);

    let meta = file.metadata();
    let mut want = every_value_type();
    if let Some(a) = alignment {
        want.push(("general.alignment", Value::U32(a)));
    }
    assert_eq!(meta.len(), want.len());
    for (k, v) in &want {
        assert_eq!(meta.get(k), Some(v), "metadata {k}");
    }

    let mut specs = tensor_specs();
    specs.push(("q4_k.matrix", vec![256, 2], GgmlType::Q4K));
    assert_eq!(file.tensors().len(), specs.len());
    let mut data_start = None;
    for (((name, dims, ty), info), want_bytes) in
        specs.iter().zip(file.tensors()).zip(&expected_bytes)
    {
        assert_eq!(&info.name, name);
        assert_eq!(&info.dims, dims, "{name}");
        assert_eq!(info.ggml_type, *ty, "{name}");
        assert_eq!(info.offset % align, 0, "{name} offset");
        assert_eq!(info.n_bytes, want_bytes.len() as u64, "{name}");
        let got = file.tensor_bytes(info);
        assert_eq!(got, &want_bytes[..], "{name} bytes");
        // The data section itself starts aligned in the file.
        let start = got.as_ptr() as usize - file.tensor_bytes(&file.tensors()[0]).as_ptr() as usize;
        assert_eq!(start as u64, info.offset, "{name} position");
        if data_start.is_none() {
            data_start = bytes
                .windows(want_bytes.len())
                .position(|w| w == &want_bytes[..]);
        }

        let values = file.tensor_f32(name).expect("dequantises");
        let mut want = vec![0f32; info.n_elements() as usize];
        dequantize(*ty, want_bytes, &mut want).expect("dequantises");
        assert_eq!(values, want, "{name} values");
    }
    let data_start = data_start.expect("first tensor found in file") as u64;
    assert_eq!(data_start % align, 0, "data section alignment");
    assert_eq!(
        bytes.len() as u64 % align,
        0,
        "every tensor is padded, the last one too"
    );
    // F32 survives exactly.
    assert_eq!(file.tensor_f32("f32.vector").expect("reads"), ramp(5, 0));
}

#[test]
fn round_trip_default_alignment() {
    round_trip(None);
}

#[test]
fn round_trip_alignment_32() {
    round_trip(Some(32));
}

#[test]
fn round_trip_alignment_64() {
    round_trip(Some(64));
}

#[test]
fn alignment_changes_layout() {
    let build = |align: u32| {
        let mut w = GgufWriter::new();
        w.add_metadata("general.alignment", Value::U32(align))
            .expect("valid");
        w.add_tensor_f32("a", &[3], GgmlType::F32, &[1.0, 2.0, 3.0])
            .expect("adds");
        w.add_tensor_f32("b", &[1], GgmlType::F32, &[4.0])
            .expect("adds");
        GgufFile::from_bytes(w.to_bytes()).expect("parses")
    };
    assert_eq!(build(32).tensor_info("b").expect("present").offset, 32);
    assert_eq!(build(64).tensor_info("b").expect("present").offset, 64);
    assert_eq!(build(64).tensor_f32("b").expect("reads"), vec![4.0]);
}

#[test]
fn empty_writer_round_trips() {
    let file = GgufFile::from_bytes(GgufWriter::new().to_bytes()).expect("parses");
    assert!(file.metadata().is_empty());
    assert!(file.tensors().is_empty());
}

#[test]
fn write_to_path_round_trips_and_leaves_no_temp_file() {
    let dir = std::env::temp_dir().join(format!("pyramid-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("tiny.gguf");
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()))
        .expect("valid");
    w.add_tensor_f32("w", &[32, 2], GgmlType::Q8_0, &ramp(64, 9))
        .expect("adds");
    w.write_to_path(&path).expect("writes");
    let file = GgufFile::open(&path).expect("opens");
    assert_eq!(
        file.metadata()
            .get_str("general.architecture")
            .expect("present"),
        "llama"
    );
    assert_eq!(std::fs::read(&path).expect("reads"), w.to_bytes());
    let names: Vec<_> = std::fs::read_dir(&dir)
        .expect("lists")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("tiny.gguf")]);

    // A directory that does not exist: an error, and nothing written.
    let missing = dir.join("no/such/dir/x.gguf");
    assert!(matches!(
        w.write_to_path(&missing),
        Err(GgufError::Write(_))
    ));
    std::fs::remove_dir_all(&dir).expect("cleans up");
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    let invalid = |r: pyramid_gguf::Result<()>| matches!(r, Err(GgufError::Invalid(_)));
    assert!(invalid(w.add_tensor(
        "a",
        &[32],
        GgmlType::Q8_0,
        vec![0; 33]
    )));
    assert!(invalid(w.add_tensor(
        "a",
        &[31],
        GgmlType::Q8_0,
        vec![0; 33]
    )));
    assert!(invalid(w.add_tensor("a", &[], GgmlType::F32, vec![])));
    assert!(invalid(w.add_tensor(
        "a",
        &[1, 1, 1, 1, 1],
        GgmlType::F32,
        vec![0; 4]
    )));
    assert!(invalid(w.add_tensor(
        "a",
        &[u64::MAX, 2],
        GgmlType::F32,
        vec![]
    )));
    // Rows of 16 are not whole Q8_0 blocks even though 16 * 2 is one block.
    assert!(invalid(w.add_tensor(
        "a",
        &[16, 2],
        GgmlType::Q8_0,
        vec![0; 34]
    )));
    assert!(invalid(w.add_tensor_f32("a", &[4], GgmlType::F32, &[1.0])));
    assert!(matches!(
        w.add_tensor_f32("a", &[256], GgmlType::Q4K, &[0.0; 256]),
        Err(GgufError::UnsupportedTensorType(GgmlType::Q4K))
    ));
    w.add_tensor("a", &[4], GgmlType::F32, vec![0; 16])
        .expect("valid");
    assert!(invalid(w.add_tensor("a", &[4], GgmlType::F32, vec![0; 16])));

    let mixed = Value::Array(vec![Value::U32(1), Value::I32(1)]);
    assert!(matches!(
        w.add_metadata("k", mixed),
        Err(GgufError::Invalid(_))
    ));
    let mut deep = Value::Array(vec![Value::U8(1)]);
    for _ in 0..4 {
        deep = Value::Array(vec![deep]);
    }
    assert!(matches!(
        w.add_metadata("k", deep),
        Err(GgufError::Invalid(_))
    ));
    for bad in [
        Value::U32(48),
        Value::U32(0),
        Value::I64(-32),
        Value::F32(32.0),
        Value::U64(1 << 21),
    ] {
        assert!(
            matches!(
                w.add_metadata("general.alignment", bad.clone()),
                Err(GgufError::Invalid(_))
            ),
            "{bad:?}"
        );
    }
    // Replacing a key keeps one entry.
    w.add_metadata("k", Value::U8(1)).expect("valid");
    w.add_metadata("k", Value::U8(2)).expect("valid");
    let file = GgufFile::from_bytes(w.to_bytes()).expect("parses");
    assert_eq!(file.metadata().len(), 1);
    assert_eq!(file.metadata().get("k"), Some(&Value::U8(2)));
}

// ---------------------------------------------------------------------------------------
// Malformed input

/// Hand-built GGUF pieces, for files the writer refuses to produce.
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw(GGUF_MAGIC.to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    fn tensor(&mut self, name: &[u8], dims: &[u64], type_id: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(type_id).u64(offset)
    }
    /// Zero padding to the default alignment, then `n` data bytes.
    fn data(&mut self, n: usize) -> &mut Self {
        let pad = self.0.len().div_ceil(32) * 32 - self.0.len();
        self.0.resize(self.0.len() + pad + n, 0);
        self
    }
    fn parse(&self) -> pyramid_gguf::Result<GgufFile> {
        GgufFile::from_bytes(self.0.clone())
    }
}

fn err(r: pyramid_gguf::Result<GgufFile>) -> GgufError {
    match r {
        Ok(f) => panic!("expected an error, parsed {f:?}"),
        Err(e) => {
            // Every error renders a message without panicking.
            assert!(!e.to_string().is_empty());
            e
        }
    }
}

fn is_truncated(e: &GgufError) -> bool {
    matches!(e, GgufError::Truncated { .. })
}

fn is_corrupt(e: &GgufError) -> bool {
    matches!(e, GgufError::Corrupt(_))
}

#[test]
fn raw_builder_makes_valid_files() {
    // Guards the malformed-input tests below: without the one flaw, each file parses.
    let mut r = Raw::header(3, 1, 1);
    r.str(b"key").u32(8).str(b"value");
    r.tensor(b"t", &[4, 2], 0, 0).data(32);
    let f = r.parse().expect("valid");
    assert_eq!(f.metadata().get_str("key").expect("present"), "value");
    assert_eq!(f.tensor_f32("t").expect("reads"), vec![0.0; 8]);
    Raw::header(2, 0, 0).parse().expect("version 2 is accepted");
}

#[test]
fn empty_file() {
    assert!(is_truncated(&err(GgufFile::from_bytes(Vec::new()))));
    let path = std::env::temp_dir().join(format!("pyramid-gguf-empty-{}.gguf", std::process::id()));
    std::fs::write(&path, b"").expect("writes");
    let e = err(GgufFile::open(&path));
    std::fs::remove_file(&path).expect("cleans up");
    assert!(
        is_truncated(&e) || matches!(e, GgufError::Open { .. }),
        "{e}"
    );
}

#[test]
fn missing_file() {
    assert!(matches!(
        err(GgufFile::open("/nonexistent/pyramid/x.gguf")),
        GgufError::Open { .. }
    ));
}

#[test]
fn wrong_magic() {
    let mut bytes = Raw::header(3, 0, 0).0;
    bytes[..4].copy_from_slice(b"GGML");
    assert!(matches!(err(GgufFile::from_bytes(bytes)), GgufError::BadMagic(m) if &m == b"GGML"));
    assert!(matches!(
        err(GgufFile::from_bytes(b"\x00\x01".to_vec())),
        GgufError::Truncated { .. }
    ));
}

#[test]
fn unsupported_versions() {
    for v in [0, 1, 4, u32::MAX] {
        assert!(
            matches!(err(Raw::header(v, 0, 0).parse()), GgufError::UnsupportedVersion(x) if x == v),
            "version {v}"
        );
    }
}

/// A small valid file whose last tensor ends exactly at the end, so that every proper
/// prefix lacks something the header promises.
fn small_valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()))
        .expect("valid");
    w.add_metadata("n", Value::U32(7)).expect("valid");
    w.add_metadata(
        "list",
        Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
    )
    .expect("valid");
    w.add_tensor_f32("q", &[32], GgmlType::Q8_0, &ramp(32, 1))
        .expect("adds");
    w.add_tensor_f32("f", &[8], GgmlType::F32, &ramp(8, 2))
        .expect("adds");
    w.to_bytes()
}

#[test]
fn truncated_at_every_prefix() {
    let full = small_valid_file();
    let file = GgufFile::from_bytes(full.clone()).expect("full file parses");
    let last = file.tensors().last().expect("has tensors");
    assert_eq!(last.n_bytes % 32, 0, "the last tensor needs no padding");
    for len in 0..full.len() {
        let e = err(GgufFile::from_bytes(full[..len].to_vec()));
        assert!(is_truncated(&e), "prefix of {len} bytes: {e}");
    }
}

#[test]
fn single_byte_corruptions_never_panic() {
    let full = small_valid_file();
    for i in 0..full.len() {
        for v in [0x00, 0xff, full[i] ^ 0x80, full[i].wrapping_add(1)] {
            let mut bytes = full.clone();
            bytes[i] = v;
            if let Ok(file) = GgufFile::from_bytes(bytes) {
                for t in file.tensors() {
                    let _ = file.tensor_f32(&t.name);
                }
            }
        }
    }
}

#[test]
fn huge_string_length() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).bytes(b"key");
    assert!(is_truncated(&err(r.parse())));

    let mut r = Raw::header(3, 0, 1);
    r.str(b"key").u32(8).u64(u64::MAX).bytes(b"value");
    assert!(is_truncated(&err(r.parse())));

    let mut r = Raw::header(3, 1, 0);
    r.u64(u64::MAX).bytes(&[0; 64]);
    assert!(is_truncated(&err(r.parse())));
}

#[test]
fn huge_counts() {
    for elem_type in [0u32, 4, 8, 9, 12] {
        let mut r = Raw::header(3, 0, 1);
        r.str(b"key")
            .u32(9)
            .u32(elem_type)
            .u64(1 << 62)
            .bytes(&[0; 64]);
        assert!(is_truncated(&err(r.parse())), "element type {elem_type}");
    }
    assert!(is_truncated(&err(Raw::header(3, 1 << 62, 0).parse())));
    assert!(is_truncated(&err(Raw::header(3, 0, u64::MAX).parse())));
}

#[test]
fn bad_dimension_counts() {
    for dims in [&[][..], &[1, 1, 1, 1, 1][..]] {
        let mut r = Raw::header(3, 1, 0);
        r.tensor(b"t", dims, 0, 0).data(32);
        assert!(is_corrupt(&err(r.parse())), "{} dims", dims.len());
    }
}

#[test]
fn overflowing_dimensions() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor(b"t", &[1 << 32, 1 << 32, 1 << 32], 0, 0).data(32);
    assert!(is_corrupt(&err(r.parse())));
}

#[test]
fn tensor_data_past_end() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor(b"t", &[8], 0, 0).data(16);
    assert!(is_truncated(&err(r.parse())));

    // An offset so large that offset + size overflows.
    let mut r = Raw::header(3, 1, 0);
    r.tensor(b"t", &[8], 0, u64::MAX - 31).data(32);
    assert!(is_truncated(&err(r.parse())));

    // A second tensor past the end of the data.
    let mut r = Raw::header(3, 2, 0);
    r.tensor(b"a", &[8], 0, 0)
        .tensor(b"b", &[8], 0, 32)
        .data(32);
    assert!(is_truncated(&err(r.parse())));
}

#[test]
fn unknown_tensor_type() {
    for id in [4, 5, 99, u32::MAX] {
        let mut r = Raw::header(3, 1, 0);
        r.tensor(b"t", &[32], id, 0).data(256);
        assert!(
            matches!(err(r.parse()), GgufError::UnknownTensorType { id: x, ref tensor } if x == id && tensor == "t"),
            "type {id}"
        );
    }
}

#[test]
fn unaligned_tensor_offset() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor(b"t", &[4], 0, 4).data(64);
    assert!(is_corrupt(&err(r.parse())));
}

#[test]
fn rows_not_whole_blocks() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor(b"t", &[16, 2], GgmlType::Q8_0.id(), 0).data(64);
    assert!(is_corrupt(&err(r.parse())));
    let mut r = Raw::header(3, 1, 0);
    r.tensor(b"t", &[33], GgmlType::Q4_0.id(), 0).data(64);
    assert!(is_corrupt(&err(r.parse())));
}

#[test]
fn duplicate_tensor_names() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor(b"t", &[8], 0, 0)
        .tensor(b"t", &[8], 0, 32)
        .data(64);
    assert!(is_corrupt(&err(r.parse())));
}

#[test]
fn duplicate_metadata_keys() {
    let mut r = Raw::header(3, 0, 2);
    r.str(b"k").u32(4).u32(1).str(b"k").u32(4).u32(2);
    assert!(is_corrupt(&err(r.parse())));
}

#[test]
fn non_utf8_strings() {
    let mut r = Raw::header(3, 0, 1);
    r.str(b"bad\xff\xfekey").u32(4).u32(1);
    assert!(is_corrupt(&err(r.parse())), "key");

    let mut r = Raw::header(3, 0, 1);
    r.str(b"key").u32(8).str(b"\xc3");
    assert!(is_corrupt(&err(r.parse())), "value");

    let mut r = Raw::header(3, 1, 0);
    r.tensor(b"\x80t", &[8], 0, 0).data(32);
    assert!(is_corrupt(&err(r.parse())), "tensor name");
}

#[test]
fn bad_metadata_values() {
    // Unknown value type.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(13).u64(0);
    assert!(is_corrupt(&err(r.parse())));
    // Bool that is neither 0 nor 1.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(7).bytes(&[2]);
    assert!(is_corrupt(&err(r.parse())));
    // Unknown array element type.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(9).u32(77).u64(1).u64(0);
    assert!(is_corrupt(&err(r.parse())));
    // Arrays nested five deep.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(9);
    for _ in 0..5 {
        r.u32(9).u64(1);
    }
    r.bytes(&[0; 64]);
    assert!(is_corrupt(&err(r.parse())));
    // Alignment that is not a power of two.
    for bad in [0u32, 3, 48] {
        let mut r = Raw::header(3, 0, 1);
        r.str(b"general.alignment").u32(4).u32(bad);
        assert!(is_corrupt(&err(r.parse())), "alignment {bad}");
    }
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.alignment").u32(8).str(b"32");
    assert!(is_corrupt(&err(r.parse())), "string alignment");
}

/// A stacked tensor's parts (one expert each) dequantise alone to the whole one's slices;
/// a part the tensor does not split into is an error, not a panic.
#[test]
fn a_tensor_part_is_its_slice_of_the_whole() {
    let values: Vec<f32> = (0..3 * 2 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut w = GgufWriter::new();
    w.add_tensor_f32("exps", &[64, 2, 3], GgmlType::Q8_0, &values)
        .unwrap();
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let whole = file.tensor_f32("exps").unwrap();
    for part in 0..3 {
        let got = file.tensor_part_f32("exps", part, 3).unwrap();
        assert_eq!(got, whole[part * 128..(part + 1) * 128], "part {part}");
    }
    for (part, n_parts) in [(3, 3), (0, 0), (0, 5)] {
        let err = file.tensor_part_f32("exps", part, n_parts).unwrap_err();
        assert!(err.to_string().contains("has no part"), "{err}");
    }
}
