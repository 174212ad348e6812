//! Writes the seed corpora under `fuzz/seeds/<target>/`.
//!
//! GGUF seeds come from the project's own writer; chat-template seeds include the templates
//! of the models in the pyramid cache when they are there (Qwen2.5's and SmolLM2's). The
//! output is committed, so this only needs running again when a seed should change:
//!
//!     cargo run --manifest-path fuzz/Cargo.toml -p pyramid-fuzz-common --bin fuzz-seeds

use std::fs;
use std::path::Path;

use pyramid_fuzz_common::{model_files, toy_metadata, CHATML};
use pyramid_gguf::{GgmlType, GgufFile, GgufWriter, Metadata, Value};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("common/ is inside fuzz/")
        .join("seeds");
    gguf_seeds(&root.join("gguf_reader"));
    tokenizer_seeds(&root.join("tokenizer_roundtrip"));
    chat_template_seeds(&root.join("chat_template"));
    openai_seeds(&root.join("openai_request"));
    replay_seeds(&root.join("replay_trace"));
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).expect("create the seed directory");
    fs::write(dir.join(name), bytes).expect("write a seed");
    println!("{:>6} B  {}", bytes.len(), dir.join(name).display());
}

/// Deterministic filler bytes (a 64-bit LCG), so quantised blocks hold varied scales.
fn filler(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 56) as u8
        })
        .collect()
}

fn put_metadata(w: &mut GgufWriter, md: &Metadata) {
    for (key, value) in md.iter() {
        w.add_metadata(key, value.clone())
            .expect("toy metadata is encodable");
    }
}

/// Llama/Qwen2 hyper-parameters that `ModelConfig::from_metadata` accepts.
fn put_hparams(w: &mut GgufWriter, arch: &str) {
    let k = |s: &str| format!("{arch}.{s}");
    w.add_metadata("general.architecture", Value::String(arch.into()))
        .and_then(|w| w.add_metadata("general.name", Value::String(format!("fuzz-{arch}"))))
        .and_then(|w| w.add_metadata(k("context_length"), Value::U32(256)))
        .and_then(|w| w.add_metadata(k("embedding_length"), Value::U32(64)))
        .and_then(|w| w.add_metadata(k("block_count"), Value::U32(2)))
        .and_then(|w| w.add_metadata(k("feed_forward_length"), Value::U32(96)))
        .and_then(|w| w.add_metadata(k("attention.head_count"), Value::U32(4)))
        .and_then(|w| w.add_metadata(k("attention.head_count_kv"), Value::U32(2)))
        .and_then(|w| w.add_metadata(k("rope.freq_base"), Value::F32(10_000.0)))
        .and_then(|w| w.add_metadata(k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)))
        .expect("hyper-parameters are encodable");
}

fn gguf_seeds(dir: &Path) {
    // A toy tokenizer, llama hyper-parameters and one block of every type the reader knows.
    let mut w = GgufWriter::new();
    put_hparams(&mut w, "llama");
    put_metadata(&mut w, &toy_metadata("smollm"));
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::I8,
    ];
    for (i, ty) in types.into_iter().enumerate() {
        let n = ty.block_len() as u64;
        let bytes = filler(ty.block_bytes(), i as u64);
        w.add_tensor(format!("t.{}", ty.name()), &[n, 1], ty, bytes)
            .expect("one whole block");
    }
    write(dir, "toy-llama.gguf", &w.to_bytes());

    // Every metadata value type, nested arrays, a wider alignment and a 2-D f32 tensor.
    let mut w = GgufWriter::new();
    let values = [
        ("u8", Value::U8(7)),
        ("i8", Value::I8(-7)),
        ("u16", Value::U16(700)),
        ("i16", Value::I16(-700)),
        ("u32", Value::U32(70_000)),
        ("i32", Value::I32(-70_000)),
        ("u64", Value::U64(1 << 40)),
        ("i64", Value::I64(-(1 << 40))),
        ("f32", Value::F32(0.5)),
        ("f64", Value::F64(-0.25)),
        ("bool", Value::Bool(true)),
        ("string", Value::String("héllo 🚀".into())),
        ("array.empty", Value::Array(Vec::new())),
        (
            "array.f32",
            Value::Array(vec![Value::F32(1.0), Value::F32(f32::NAN)]),
        ),
        (
            "array.nested",
            Value::Array(vec![
                Value::Array(vec![Value::Array(vec![Value::I16(1), Value::I16(2)])]),
                Value::Array(vec![Value::Array(vec![Value::I16(3)])]),
            ]),
        ),
        ("general.alignment", Value::U32(64)),
    ];
    for (key, value) in values {
        w.add_metadata(key, value).expect("encodable");
    }
    let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    w.add_tensor_f32("m", &[4, 3, 2], GgmlType::F32, &values)
        .expect("24 elements");
    write(dir, "value-kinds.gguf", &w.to_bytes());

    // Qwen2 hyper-parameters and a vocabulary under its pre-tokenizer; the header says v2.
    let mut w = GgufWriter::new();
    put_hparams(&mut w, "qwen2");
    let mut md = Metadata::new();
    let pieces = ["a", "b", "ab", "Ġ", "Ġab", "<|im_end|>"];
    md.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.insert("tokenizer.ggml.pre", Value::String("qwen2".into()));
    md.insert(
        "tokenizer.ggml.tokens",
        Value::Array(pieces.iter().map(|p| Value::String((*p).into())).collect()),
    );
    md.insert(
        "tokenizer.ggml.token_type",
        Value::Array([1, 1, 1, 1, 1, 3].into_iter().map(Value::I32).collect()),
    );
    md.insert(
        "tokenizer.ggml.merges",
        Value::Array(vec![
            Value::String("a b".into()),
            Value::String("Ġ ab".into()),
        ]),
    );
    md.insert("tokenizer.ggml.eos_token_id", Value::I32(5));
    md.insert("tokenizer.ggml.bos_token_id", Value::I32(-1));
    md.insert("tokenizer.chat_template", Value::String(CHATML.into()));
    put_metadata(&mut w, &md);
    w.add_tensor_f32("token_embd.weight", &[32, 2], GgmlType::Q8_0, &[0.25; 64])
        .expect("two Q8_0 rows");
    let mut bytes = w.to_bytes();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    write(dir, "qwen2-v2.gguf", &bytes);

    // Just a header: no metadata, no tensors.
    write(dir, "empty.gguf", &GgufWriter::new().to_bytes());
    for name in [
        "toy-llama.gguf",
        "value-kinds.gguf",
        "qwen2-v2.gguf",
        "empty.gguf",
    ] {
        let bytes = fs::read(dir.join(name)).expect("just written");
        GgufFile::from_bytes(bytes).expect("every GGUF seed is valid");
    }
}

fn tokenizer_seeds(dir: &Path) {
    // Selector byte: bit 0 parse_special, the rest picks the tokenizer (see the target).
    let texts: [(u8, &str); 8] = [
        (0, "The quick brown fox jumps over the lazy dog."),
        (
            3,
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            2,
            "<|im_start|> is text here; <tool> and → are always tokens",
        ),
        (4, "list:\n\n1. first\n\n  2. second\t\tend   \n"),
        (
            6,
            "fn main() {\n    println!(\"{}\", 12345 + 3.14159);\n}\n",
        ),
        (8, "Café, naïve, e\u{301} composed and decomposed; Ω≈ç√∫"),
        (7, "日本語のテキスト、中文，한국어 🚀👩‍💻 emoji"),
        (9, "it's don't we'll I'M   spaces\u{a0}nbsp\r\nCRLF"),
    ];
    for (i, (selector, text)) in texts.iter().enumerate() {
        let mut bytes = vec![*selector];
        bytes.extend_from_slice(text.as_bytes());
        write(dir, &format!("text-{i}.txt"), &bytes);
    }
}

fn chat_seed(flags: u8, template: &str, messages: &[(&str, &str)]) -> Vec<u8> {
    let mut bytes = vec![flags];
    bytes.extend_from_slice(template.as_bytes());
    for (role, content) in messages {
        bytes.push(0);
        bytes.extend_from_slice(role.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(content.as_bytes());
    }
    bytes
}

fn chat_template_seeds(dir: &Path) {
    let conversation = [
        ("system", "You are a helpful assistant."),
        ("user", "Hello!"),
        ("assistant", "Hi, how can I help?"),
        ("user", "Write a haiku."),
    ];
    write(dir, "chatml.txt", &chat_seed(1, CHATML, &conversation));
    // Constructs templates use beyond ChatML: loop variables, namespace, macros, filters,
    // Python string methods, raise_exception.
    let features = "{%- set ns = namespace(found=false) -%}\
{%- macro turn(m) -%}<{{ m.role | upper }}>{{ m.content | trim }}{%- endmacro -%}\
{{ bos_token }}{%- for message in messages -%}\
{%- if message.role == 'system' and not loop.first -%}{{ raise_exception('system must come first') }}{%- endif -%}\
{%- if message.content.startswith('/') -%}{%- set ns.found = true -%}{%- endif -%}\
{{ turn(message) }}{% if not loop.last %}\n{% endif %}\
{%- endfor -%}{{ messages | length }}{{ ns.found | tojson }}\
{%- if add_generation_prompt %}<ASSISTANT>{% else %}{{ eos_token }}{% endif %}";
    write(
        dir,
        "features.txt",
        &chat_seed(
            0,
            features,
            &[("system", "  be brief "), ("user", "/cmd x")],
        ),
    );
    let mut n_models = 0;
    for path in model_files() {
        let Ok(file) = GgufFile::open(&path) else {
            continue;
        };
        let Some(source) = file
            .metadata()
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
        let name = stem.split('-').next().unwrap_or(stem);
        write(
            dir,
            &format!("{name}.txt"),
            &chat_seed(1, source, &conversation),
        );
        n_models += 1;
    }
    if n_models == 0 {
        eprintln!("no models in the pyramid cache: model templates not refreshed");
    }
}

fn openai_seeds(dir: &Path) {
    let bodies = [
        (
            "chat-minimal.json",
            r#"{"model": "m", "messages": [{"role": "user", "content": "Hello"}]}"#,
        ),
        (
            "chat-full.json",
            r#"{"model": "smollm2-135m", "messages": [{"role": "developer", "content": "be brief"},
 {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": " there"}]},
 {"role": "assistant", "content": null}, {"role": "tool", "content": "42"}],
 "max_completion_tokens": 5, "temperature": 0.7, "top_p": 0.9, "stop": ["\n", "END"], "seed": 7,
 "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
 "presence_penalty": 0, "frequency_penalty": 0.0, "n": 1, "user": "ignored"}"#,
        ),
        (
            "completion.json",
            r#"{"model": "m", "prompt": ["Once upon a time"], "max_tokens": 16, "temperature": 0, "stop": "\n\n", "seed": -1, "stream": false}"#,
        ),
        (
            "completion-edge.json",
            r#"{"model": "m", "prompt": "<|im_start|>x", "max_tokens": 18446744073709551615, "temperature": 2, "top_p": 1e-30, "logprobs": null, "stream_options": null}"#,
        ),
        (
            "chat-bad.json",
            r#"{"model": "m", "messages": [{"role": "wizard", "content": "x"}], "top_logprobs": 21, "n": 2}"#,
        ),
    ];
    for (name, body) in bodies {
        write(dir, name, body.as_bytes());
    }
}

fn replay_seeds(dir: &Path) {
    let traces = [
        (
            "cli-test.jsonl",
            "{\"session\": \"a\", \"step\": 0, \"append_tokens\": 40, \"generate_tokens\": 6}\n\
{\"session\": \"b\", \"step\": 0, \"append_text\": \"hello there\", \"generate_tokens\": 3}\n\
{\"session\": \"a\", \"step\": 1, \"append_tokens\": 50, \"generate_tokens\": 6}\n\
{\"session\": \"a\", \"step\": 2, \"append_tokens\": 60, \"generate_tokens\": 6}\n",
        ),
        (
            "mixed.jsonl",
            "\n{\"session\": 7, \"step\": 0, \"append_text\": \"<|im_start|>user\\n🚀\\u0000\", \"generate_tokens\": 0}\r\n  \n\
{\"session\": \"7\", \"step\": 16777216, \"append_tokens\": 0, \"generate_tokens\": 1, \"extra\": [1, {}]}\n",
        ),
        (
            "bad-line.jsonl",
            "{\"session\": \"a\", \"step\": 0, \"append_tokens\": 1, \"generate_tokens\": 1}\n\
{\"session\": \"a\", \"step\": 1, \"append_tokens\": -3, \"append_text\": \"x\", \"generate_tokens\": 1.5}\n",
        ),
    ];
    for (name, text) in traces {
        write(dir, name, text.as_bytes());
    }
}
