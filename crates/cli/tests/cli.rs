//! The `pyramid` binary end to end: tiny random-weight models for plumbing and bad input,
//! the real default model for one golden check through tokenizer, template and decode.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use pyramid_model::synthetic::{retype_tensor, synthetic_gguf, SyntheticSpec};
use pyramid_model::Architecture;
use pyramid_testdata::{models_dir, refs as golden, FAMILY_FIXTURES};
use serde_json::Value;

fn pyramid(args: &[&str], home: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pyramid"))
        .args(args)
        .env("PYRAMID_HOME", home)
        .env_remove("PYRAMID_ISA")
        .stdin(Stdio::null())
        .output()
        .expect("pyramid runs")
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn home(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, name: &str, bytes: &[u8]) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.to_str().unwrap().to_string()
    }

    fn tiny(&self, spec: &SyntheticSpec) -> String {
        self.write("tiny.gguf", &synthetic_gguf(spec).unwrap().to_bytes())
    }

    fn run(&self, args: &[&str]) -> Output {
        pyramid(args, self.home())
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn assert_ok(out: &Output) {
    assert!(out.status.success(), "failed: {}", stderr(out));
}

#[test]
fn run_json_reports_ids_text_and_timings() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec::tiny(Architecture::Qwen2));
    let out = f.run(&[
        "run",
        "-m",
        &model,
        "--prompt",
        "hello there",
        "--temperature",
        "0",
        "-n",
        "8",
        "--ignore-eos",
        "--json",
    ]);
    assert_ok(&out);
    let v: Value = serde_json::from_str(&stdout(&out)).expect("one JSON object");
    // h|e→he twice, Ġ|t→Ġt, Ġt|he→Ġthe: "he l l o Ġthe r e".
    assert_eq!(v["prompt_tokens"].as_array().unwrap().len(), 7);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 8);
    assert_eq!(v["finish_reason"], "length");
    for key in [
        "load_ms",
        "prefill_ms",
        "decode_ms",
        "prefill_tok_s",
        "decode_tok_s",
        "mask_ms",
    ] {
        assert!(v["timings"][key].as_f64().unwrap() >= 0.0, "{key}");
    }
    assert!(v["text"].is_string());
}

#[test]
fn sampling_is_reproducible_by_seed() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec::tiny(Architecture::Llama));
    let tokens = |seed: &str| {
        let out = f.run(&[
            "run",
            "-m",
            &model,
            "--prompt-tokens",
            "72,101,108",
            "--temperature",
            "1.5",
            "--top-k",
            "0",
            "--top-p",
            "1",
            "--min-p",
            "0",
            "--seed",
            seed,
            "-n",
            "24",
            "--ignore-eos",
            "--json",
        ]);
        assert_ok(&out);
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        v["tokens"].clone()
    };
    assert_eq!(tokens("1"), tokens("1"));
    assert_ne!(tokens("1"), tokens("2"));
}

#[test]
fn streaming_chat_tokenize_inspect_and_models_work() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec::tiny(Architecture::Llama));
    assert_ok(&f.run(&["run", "-m", &model, "--prompt", "hi", "--chat", "-n", "4"]));

    let out = f.run(&["tokenize", "-m", &model, "--ids-only", "<|im_start|>hi"]);
    assert_ok(&out);
    assert_eq!(stdout(&out).trim(), "260,104,105");

    let out = f.run(&["inspect", &model]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("architecture:  llama"),
        "{}",
        stdout(&out)
    );

    let out = f.run(&["models"]);
    assert_ok(&out);
    assert!(stdout(&out).contains("smollm2-135m") && stdout(&out).contains("not cached"));

    let (ok, err) = chat_with(
        &f,
        &["-m", &model, "-n", "4", "--stats"],
        "hello\nand again\n\n",
    );
    assert!(ok, "{err}");
    // The second turn reuses the first turn's cached tokens.
    let reused: Vec<&str> = err.lines().filter(|l| l.starts_with("[reused")).collect();
    assert_eq!(reused.len(), 2, "{err}");
    assert!(reused[0].starts_with("[reused 0 "), "{err}");
    assert!(!reused[1].starts_with("[reused 0 "), "{err}");
}

/// `chat` with `lines` typed in; (exit ok, stderr).
fn chat_with(f: &Fixture, args: &[&str], lines: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pyramid"))
        .arg("chat")
        .args(args)
        .env("PYRAMID_HOME", f.home())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.success(), stderr(&out))
}

#[test]
fn chat_session_files_resume_a_conversation_and_refuse_bad_ones() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec::tiny(Architecture::Llama));
    let file = f.home().join("talk.pyrsession");
    let session = file.to_str().unwrap();
    let args = ["-m", &model, "-n", "4", "--stats", "--session", session];
    let (ok, err) = chat_with(&f, &args, "hello\n\n");
    assert!(ok && err.contains("Kept the conversation"), "{err}");
    // A new process resumes the messages and the KV: the next turn prefills only itself.
    let (ok, err) = chat_with(&f, &args, "and again\n\n");
    assert!(ok && err.contains("Resumed 2 messages"), "{err}");
    let reused: Vec<&str> = err.lines().filter(|l| l.starts_with("[reused")).collect();
    assert_eq!(reused.len(), 1, "{err}");
    assert!(!reused[0].starts_with("[reused 0 "), "{err}");

    // Another model (other weights: another file) refuses the file, naming why.
    let other = f.write(
        "other.gguf",
        &synthetic_gguf(&SyntheticSpec {
            seed: 9,
            ..SyntheticSpec::tiny(Architecture::Llama)
        })
        .unwrap()
        .to_bytes(),
    );
    let (ok, err) = chat_with(&f, &["-m", &other, "--session", session], "hi\n\n");
    assert!(!ok && err.contains("another setup"), "{err}");
    // So does a corrupt file.
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let (ok, err) = chat_with(&f, &args, "hi\n\n");
    assert!(!ok && err.contains("corrupt session file"), "{err}");
    assert_eq!(
        err.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{err}"
    );
}

/// Every bad input gives a one-line `error:` naming the problem and a failing exit code.
#[test]
fn bad_input_gives_one_line_errors() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec {
        n_ctx: 16,
        ..SyntheticSpec::tiny(Architecture::Llama)
    });
    let good = std::fs::read(&model).unwrap();
    let garbage = f.write("garbage.gguf", b"this is not a model file at all");
    let truncated = f.write("truncated.gguf", &good[..good.len() / 2]);
    let mut w = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Llama)).unwrap();
    w.add_metadata(
        "general.architecture",
        pyramid_gguf::Value::String("mamba".into()),
    )
    .unwrap();
    let mamba = f.write("mamba.gguf", &w.to_bytes());
    let mut q81 = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Llama))
        .unwrap()
        .to_bytes();
    retype_tensor(
        &mut q81,
        "blk.0.attn_q.weight",
        pyramid_gguf::GgmlType::Q8_1,
    );
    let q81 = f.write("q81.gguf", &q81);
    // Header values a corrupt or hostile file may carry, each given alone.
    let header_cases: Vec<(&str, pyramid_gguf::Value, &str)> = vec![
        (
            "llama.block_count",
            pyramid_gguf::Value::U32(u32::MAX),
            "block_count is 4294967295 but the file holds tensors for 2 blocks",
        ),
        (
            "llama.rope.freq_base",
            pyramid_gguf::Value::F32(f32::NAN),
            "rope.freq_base NaN",
        ),
        (
            "llama.rope.freq_base",
            pyramid_gguf::Value::F32(0.0),
            "rope.freq_base 0",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            pyramid_gguf::Value::F32(f32::NAN),
            "layer_norm_rms_epsilon NaN",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            pyramid_gguf::Value::F32(-1e-5),
            "layer_norm_rms_epsilon -0.00001",
        ),
        (
            "llama.rope.dimension_count",
            pyramid_gguf::Value::U32(0),
            "rope.dimension_count is 0",
        ),
        (
            "tokenizer.ggml.unknown_token_id",
            pyramid_gguf::Value::U32(99_999),
            "99999",
        ),
        (
            "llama.rope.scaling.type",
            pyramid_gguf::Value::String("dynamic".into()),
            "RoPE scaling 'dynamic' (rope.scaling.type) is not implemented",
        ),
        (
            "llama.rope.scaling.type",
            pyramid_gguf::Value::String("yarn".into()),
            "YaRN needs rope.scaling.original_context_length",
        ),
    ];
    let header_files: Vec<(String, &str)> = header_cases
        .into_iter()
        .enumerate()
        .map(|(i, (key, value, expected))| {
            let mut w = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Llama)).unwrap();
            w.add_metadata(key, value).unwrap();
            (f.write(&format!("header{i}.gguf"), &w.to_bytes()), expected)
        })
        .collect();
    let mut w = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Llama)).unwrap();
    w.add_metadata(
        "tokenizer.chat_template",
        pyramid_gguf::Value::String(
            "{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}"
                .into(),
        ),
    )
    .unwrap();
    let looping_template = f.write("looping.gguf", &w.to_bytes());
    // A Llama 3.x file with a broken per-frequency RoPE factor (head_dim 16: 8 of them).
    let mut w = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Llama)).unwrap();
    w.add_tensor_f32(
        "rope_freqs.weight",
        &[8],
        pyramid_gguf::GgmlType::F32,
        &[1.0, 1.0, 1.0, 0.0, 8.0, 8.0, 8.0, 8.0],
    )
    .unwrap();
    let llama3 = f.write("llama3.gguf", &w.to_bytes());
    let missing = f.home().join("nope.gguf").to_str().unwrap().to_string();
    let long_prompt = "x".repeat(40);

    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "-m", &missing, "--prompt", "hi"],
            "does not exist",
        ),
        (
            vec!["run", "-m", &garbage, "--prompt", "hi"],
            "not a GGUF file",
        ),
        (vec!["run", "-m", &truncated, "--prompt", "hi"], "truncated"),
        (
            vec!["run", "-m", &q81, "--prompt", "hi"],
            "tensor 'blk.0.attn_q.weight' has type Q8_1",
        ),
        (
            vec!["run", "-m", &mamba, "--prompt", "hi"],
            "unsupported model architecture 'mamba'",
        ),
        (
            vec!["run", "-m", "no-such-model", "--prompt", "hi"],
            "unknown model",
        ),
        (vec!["run", "-m", &model, "--prompt", ""], "prompt is empty"),
        (
            vec!["run", "-m", &model, "--prompt", &long_prompt],
            "context is 16",
        ),
        (
            vec!["run", "-m", &model, "--prompt", "hi", "--temperature", "-1"],
            "temperature",
        ),
        (
            vec!["run", "-m", &model, "--prompt", "hi", "--top-p", "0"],
            "top_p",
        ),
        (
            vec!["run", "-m", &model, "--prompt", "hi", "--min-p", "2"],
            "min_p",
        ),
        (
            vec![
                "run",
                "-m",
                &model,
                "--prompt",
                "hi",
                "--repeat-penalty",
                "0",
            ],
            "repeat_penalty",
        ),
        (
            vec!["run", "-m", &model, "--prompt", "hi", "--threads", "0"],
            "--threads",
        ),
        (
            vec!["run", "-m", &model, "--prompt", "hi", "--max-tokens", "0"],
            "--max-tokens",
        ),
        (
            vec!["run", "-m", &model, "--prompt-tokens", "1,x"],
            "'x' is not a token id",
        ),
        (
            vec!["run", "-m", &model, "--prompt-tokens", "99999"],
            "token id 99999 is out of range",
        ),
        (
            vec!["run", "-m", &model, "--prompt-file", &missing],
            "reading prompt file",
        ),
        (vec!["inspect", &garbage], "not a GGUF file"),
        (vec!["fetch", "no-such-model"], "unknown model"),
    ];
    cases.push((
        vec!["run", "-m", &looping_template, "--chat", "--prompt", "hi"],
        "template steps",
    ));
    cases.push((
        vec!["run", "-m", &llama3, "--prompt", "hi"],
        "rope_freqs.weight holds 0: RoPE factors must be positive numbers",
    ));
    for (file, expected) in &header_files {
        cases.push((vec!["run", "-m", file, "--prompt", "hi"], expected));
    }
    for (args, expected) in cases {
        let out = f.run(&args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
        assert!(
            err.starts_with("error: ") && err.contains(expected),
            "{args:?}: expected '{expected}' in: {err}"
        );
    }

    // Flag values clap refuses itself: its message (with its usage hint) names them.
    for (value, expected) in [
        ("agents", "'agents' is not KEY=PRIORITY"),
        ("agents=soon", "the priority must be an integer"),
    ] {
        let out = f.run(&["serve", "-m", &model, "--api-key-priority", value]);
        assert!(!out.status.success());
        assert!(stderr(&out).contains(expected), "{}", stderr(&out));
    }

    let out = Command::new(env!("CARGO_BIN_EXE_pyramid"))
        .args(["run", "-m", &model, "--prompt", "hi"])
        .env("PYRAMID_ISA", "sse9")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("PYRAMID_ISA='sse9'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn forced_scalar_isa_gives_the_same_greedy_tokens() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec::tiny(Architecture::Qwen2));
    let run = |isa: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pyramid"));
        cmd.args([
            "run",
            "-m",
            &model,
            "--prompt",
            "hello",
            "--temperature",
            "0",
            "-n",
            "16",
            "--ignore-eos",
            "--json",
        ]);
        cmd.env("PYRAMID_HOME", f.home());
        match isa {
            Some(isa) => cmd.env("PYRAMID_ISA", isa),
            None => cmd.env_remove("PYRAMID_ISA"),
        };
        let out = cmd.output().unwrap();
        assert_ok(&out);
        serde_json::from_str::<Value>(&stdout(&out)).unwrap()["tokens"].clone()
    };
    assert_eq!(run(Some("scalar")), run(None));
}

/// Text in, the reference's ids out: tokenizer, chat template and greedy decode together.
#[test]
fn default_model_reproduces_reference_from_text() {
    let golden = golden("golden-smollm2-135m-public.json");
    let home = models_dir().parent().unwrap().to_path_buf();
    assert!(
        models_dir()
            .join("smollm2-135m-instruct-q4_1.gguf")
            .exists(),
        "run scripts/test.sh (it fetches the models) first"
    );
    for (id, extra) in [("capital", None), ("chat_2plus2", Some("--chat"))] {
        let prompt = golden["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap();
        let text = if extra.is_some() {
            "What is 2+2? Answer briefly."
        } else {
            prompt["prompt_text"].as_str().unwrap()
        };
        let mut args = vec![
            "run",
            "--precision",
            "f32",
            "--prompt",
            text,
            "--temperature",
            "0",
            "-n",
            "32",
            "--ignore-eos",
            "--json",
        ];
        args.extend(extra);
        let out = pyramid(&args, &home);
        assert_ok(&out);
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["model"], "smollm2-135m");
        assert_eq!(v["prompt_tokens"], prompt["prompt_token_ids"], "{id}");
        assert_eq!(v["tokens"], prompt["generated_token_ids"], "{id}");
    }
}

/// `run --prediction FILE`: the reply it predicts is drafted from the first decode step
/// and accepted, and the tokens are the plain ones.
#[test]
fn a_prediction_file_drafts_the_reply_without_changing_it() {
    let home = models_dir().parent().unwrap().to_path_buf();
    let args = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--prompt",
            "The three primary colours are",
            "--temperature",
            "0",
            "-n",
            "24",
            "--ignore-eos",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = pyramid(&args, &home);
        assert_ok(&out);
        serde_json::from_str::<Value>(&stdout(&out)).unwrap()
    };
    let plain = args(&["--speculative", "off"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prediction.txt");
    std::fs::write(&file, plain["text"].as_str().unwrap()).unwrap();
    let predicted = args(&["--prediction", file.to_str().unwrap()]);
    assert_eq!(predicted["tokens"], plain["tokens"]);
    let accepted = predicted["speculative"]["accepted_tokens"]
        .as_u64()
        .unwrap();
    assert!(accepted >= 12, "{}", predicted["speculative"]);
    // A pass of three rows verifies the next token and at most two drafted ones.
    let narrow = args(&[
        "--prediction",
        file.to_str().unwrap(),
        "--draft-pass-rows",
        "3",
    ]);
    assert_eq!(narrow["tokens"], plain["tokens"]);
    let s = &narrow["speculative"];
    let (drafted, verify_passes) = (
        s["drafted_tokens"].as_u64().unwrap(),
        s["verify_passes"].as_u64().unwrap(),
    );
    // Some pass verified two: the room is cut to, not below, three rows.
    assert!(
        drafted > verify_passes && drafted <= 2 * verify_passes,
        "{s}"
    );
    let out = pyramid(
        &[
            "run",
            "--prompt",
            "Hi",
            "--prediction",
            file.to_str().unwrap(),
            "--speculative",
            "off",
        ],
        &home,
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--prediction"), "{}", stderr(&out));
}

#[test]
fn bench_reports_llama_bench_style_records() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec::tiny(Architecture::Llama));
    for precision in ["f32", "bf16", "int8", "int4"] {
        let out = f.run(&[
            "bench",
            "-m",
            &model,
            "--precision",
            precision,
            "-p",
            "16",
            "-n",
            "4",
            "-d",
            "0,8",
            "-r",
            "2",
            "--json",
        ]);
        assert_ok(&out);
        let records: Value = serde_json::from_str(&stdout(&out)).expect("a JSON list");
        let tests: Vec<&str> = records
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["test"].as_str().unwrap())
            .collect();
        assert_eq!(tests, ["pp16", "tg4", "pp16 @ d8", "tg4 @ d8"]);
        for r in records.as_array().unwrap() {
            assert_eq!(r["precision"], precision);
            assert_eq!(r["samples_ts"].as_array().unwrap().len(), 2);
            assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
            for key in [
                "model",
                "n_prompt",
                "n_gen",
                "n_depth",
                "batch",
                "threads",
                "kv",
                "isa",
                "stddev_ts",
            ] {
                assert!(!r[key].is_null(), "{key} missing");
            }
        }
    }
    let out = f.run(&[
        "bench", "-m", &model, "-p", "8", "-n", "4", "-b", "3", "-r", "1", "--json",
    ]);
    assert_ok(&out);
    let records: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(records.as_array().unwrap().iter().all(|r| r["batch"] == 3));
    for kv in ["int8", "f16"] {
        let out = f.run(&[
            "bench", "-m", &model, "--kv", kv, "-p", "8", "-n", "4", "-r", "1", "--json",
        ]);
        assert_ok(&out);
        let records: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert!(records.as_array().unwrap().iter().all(|r| r["kv"] == kv));
    }
    let out = f.run(&["bench", "-m", &model, "--kv", "int3"]);
    assert!(
        !out.status.success() && stderr(&out).contains("unknown KV cache type 'int3'"),
        "{}",
        stderr(&out)
    );
    let out = f.run(&["bench", "-m", &model, "-b", "0"]);
    assert!(
        !out.status.success() && stderr(&out).contains("--batch"),
        "{}",
        stderr(&out)
    );
    let out = f.run(&["bench", "-m", &model, "-r", "0"]);
    assert!(
        !out.status.success() && stderr(&out).contains("--repetitions"),
        "{}",
        stderr(&out)
    );
    let out = f.run(&["bench", "-m", &model, "-p", "300", "-n", "0"]);
    assert!(
        !out.status.success() && stderr(&out).contains("context is 256"),
        "{}",
        stderr(&out)
    );
    let out = f.run(&["run", "-m", &model, "--precision", "int3", "--prompt", "hi"]);
    assert!(
        !out.status.success() && stderr(&out).contains("unknown precision 'int3'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn replay_runs_every_arm_with_identical_tokens_and_rejects_bad_input() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec::tiny(Architecture::Llama));
    let trace = f.write(
        "trace.jsonl",
        br#"{"session": "a", "step": 0, "append_tokens": 40, "generate_tokens": 6}
{"session": "b", "step": 0, "append_text": "hello there", "generate_tokens": 3}
{"session": "a", "step": 1, "append_tokens": 50, "generate_tokens": 6}
{"session": "a", "step": 2, "append_tokens": 60, "generate_tokens": 6}
"#,
    );
    let common = [
        "-m",
        &model,
        "--windows",
        "32,64,128,256",
        "--prefill-chunk",
        "16",
        "--generation-reserve",
        "8",
    ];
    let results = f.home().join("bench/latest.json");
    let results = results.to_str().unwrap();
    let mut args = vec!["replay", "--trace", &trace, "--json", "--record", results];
    args.extend(common);
    let out = f.run(&args);
    assert_ok(&out);
    let v: Value = serde_json::from_str(&stdout(&out)).expect("one JSON object");
    assert_eq!(v["tokens_identical"], true);
    // The recorded run carries its provenance and renders in the report.
    let recorded: Value = serde_json::from_str(&std::fs::read_to_string(results).unwrap()).unwrap();
    let replay = &recorded["replays"][0];
    assert_eq!(replay["tokens_identical"], true);
    assert_eq!(replay["arms"].as_array().unwrap().len(), 4);
    assert!(replay["provenance"]["command"]
        .as_str()
        .unwrap()
        .contains("--record"));
    assert_ok(&f.run(&["bench", "check", "--results", results, "--no-readme"]));
    let charts = f.home().join("charts");
    assert_ok(&f.run(&[
        "bench",
        "report",
        "--results",
        results,
        "--no-readme",
        "--out-dir",
        charts.to_str().unwrap(),
    ]));
    let report = std::fs::read_to_string(charts.join("REPORT.md")).unwrap();
    assert!(report.contains("## Window strategies"), "{report}");
    assert!(charts.join("replay-0.svg").exists() && charts.join("replay-0.png").exists());
    assert_eq!(v["trace"]["sessions"], 2);
    let arms = v["arms"].as_array().unwrap();
    let names: Vec<&str> = arms.iter().map(|a| a["arm"].as_str().unwrap()).collect();
    assert_eq!(names, ["largest", "reprefill", "on-demand", "predictive"]);
    for a in arms {
        for key in [
            "total_ms",
            "ttft_ms_p50",
            "decode_ms_per_token",
            "compile_ms",
            "migration_ms",
            "reprefill_ms",
            "stall_ms",
            "kv_bytes_reserved",
            "kv_bytes_used",
        ] {
            assert!(a[key].is_number(), "{key} missing in {a}");
        }
        assert!(a.get("peak_rss_bytes").is_some());
    }
    assert!(arms[2]["n_migrations"].as_u64().unwrap() >= 2);
    assert!(arms[1]["n_reprefills"].as_u64().unwrap() >= 2);

    let mut args = vec![
        "replay",
        "--synthetic",
        "--sessions",
        "2",
        "--scale",
        "0.01",
    ];
    args.extend(common);
    let out = f.run(&args);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("tokens identical across arms: yes"),
        "{}",
        stdout(&out)
    );

    let bad_trace = f.write(
        "bad.jsonl",
        br#"{"session": "a", "step": 0, "append_tokens": -3, "generate_tokens": 1}"#,
    );
    for (args, msg) in [
        (
            vec!["replay", "-m", &model, "--synthetic", "--windows", "64,32"],
            "windows must increase",
        ),
        (
            vec![
                "replay",
                "-m",
                &model,
                "--synthetic",
                "--windows",
                "128,512",
            ],
            "exceeds the model's context of 256",
        ),
        (
            vec!["replay", "-m", &model, "--trace", &bad_trace],
            "trace line 1: 'append_tokens' must be a non-negative integer, got -3",
        ),
        (
            vec!["replay", "-m", &model, "--synthetic", "--arms", "fastest"],
            "unknown arm 'fastest'",
        ),
        (
            vec![
                "replay",
                "-m",
                &model,
                "--synthetic",
                "--prefill-chunk",
                "0",
            ],
            "--prefill-chunk",
        ),
        (vec!["replay", "-m", &model], "--trace"),
    ] {
        let out = f.run(&args);
        assert!(
            !out.status.success() && stderr(&out).contains(msg),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

/// The INT8 outlier calibration runs once per model file and is then read from
/// `$PYRAMID_HOME/calibration`: the cached load gives the same tokens, and a damaged cache
/// file is recomputed and rewritten, never an error.
#[test]
fn calibration_is_cached_beside_the_models() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec::tiny(Architecture::Llama));
    let args = [
        "run",
        "-m",
        &model,
        "--precision",
        "int8",
        "--prompt",
        "hello",
        "--temperature",
        "0",
        "-n",
        "6",
        "--ignore-eos",
        "--json",
    ];
    let tokens = |out: &Output| {
        assert_ok(out);
        let v: Value = serde_json::from_str(&stdout(out)).expect("one JSON object");
        v["tokens"].clone()
    };
    let cache_files = || -> Vec<PathBuf> {
        std::fs::read_dir(f.home().join("calibration"))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default()
    };
    let first = tokens(&f.run(&args));
    let files = cache_files();
    assert_eq!(files.len(), 1, "one calibration file: {files:?}");
    let cached = std::fs::read(&files[0]).unwrap();
    assert_eq!(tokens(&f.run(&args)), first);
    std::fs::write(&files[0], b"{ not a calibration").unwrap();
    assert_eq!(tokens(&f.run(&args)), first);
    assert_eq!(
        std::fs::read(&files[0]).unwrap(),
        cached,
        "rewritten as computed"
    );
}

#[test]
fn json_schema_and_grammar_constrain_even_a_random_model() {
    let f = Fixture::new();
    let model = f.tiny(&SyntheticSpec::tiny(Architecture::Qwen2));
    let schema = f.write(
        "schema.json",
        br#"{"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["ok", "n"], "additionalProperties": false}"#,
    );
    for seed in ["1", "2", "3"] {
        let out = f.run(&[
            "run",
            "-m",
            &model,
            "-p",
            "hello",
            "--json-schema",
            &schema,
            "--seed",
            seed,
            "--temperature",
            "1",
            "-n",
            "64",
            "--json",
        ]);
        assert_ok(&out);
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["finish_reason"], "stop", "{v}");
        let reply: Value = serde_json::from_str(v["text"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("not JSON ({e}): {v}"));
        assert!(
            reply["ok"].is_boolean() && reply["n"].as_u64().is_some_and(|n| n <= 99),
            "{reply}"
        );
        assert_eq!(reply.as_object().unwrap().len(), 2);
        assert!(v["timings"]["mask_ms"].as_f64().unwrap() > 0.0, "{v}");
    }
    let grammar = f.write("yes_no.lark", br#"start: "yes" | "no""#);
    let out = f.run(&[
        "run",
        "-m",
        &model,
        "-p",
        "hi",
        "--grammar",
        &grammar,
        "--temperature",
        "0",
    ]);
    assert_ok(&out);
    assert!(
        ["yes\n", "no\n"].contains(&stdout(&out).as_str()),
        "{}",
        stdout(&out)
    );
    let unsupported = f.write("not.json", br#"{"type": "string", "not": {"const": "a"}}"#);
    let out = f.run(&[
        "run",
        "-m",
        &model,
        "-p",
        "hi",
        "--json-schema",
        &unsupported,
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.starts_with("error:") && err.contains("not.json") && err.contains("\"not\""),
        "{err}"
    );
    let not_json = f.write("schema.txt", b"{type: object}");
    let out = f.run(&["run", "-m", &model, "-p", "hi", "--json-schema", &not_json]);
    assert!(
        stderr(&out).contains("is not valid JSON"),
        "{}",
        stderr(&out)
    );
    let out = f.run(&["run", "-m", &model, "-p", "hi", "--json-schema", &model]);
    assert!(stderr(&out).contains("cannot read"), "{}", stderr(&out));
}

/// Gemma 3 by name: a text prompt gives the reference's tokens; `--chat` without a template
/// is an error naming `--chat-template`, and with one renders Gemma's turns.
#[test]
fn gemma3_runs_by_name_and_chats_only_with_a_given_template() {
    let golden = golden("golden-gemma3-270m-public.json");
    let home = models_dir().parent().unwrap().to_path_buf();
    let prompt = &golden["prompts"][0];
    let text = prompt["prompt_text"].as_str().unwrap();
    let out = pyramid(
        &[
            "run",
            "-m",
            "gemma3-270m",
            "--precision",
            "f32",
            "--prompt",
            text,
            "--temperature",
            "0",
            "-n",
            "32",
            "--ignore-eos",
            "--json",
        ],
        &home,
    );
    assert_ok(&out);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["prompt_tokens"], prompt["prompt_token_ids"]);
    assert_eq!(v["tokens"], prompt["generated_token_ids"]);

    let chat = [
        "run",
        "-m",
        "gemma3-270m",
        "--chat",
        "--prompt",
        "Hi",
        "-n",
        "2",
        "--json",
    ];
    let out = pyramid(&chat, &home);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--chat-template"), "{}", stderr(&out));

    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/templates/gemma3.jinja");
    let mut with_template = chat.to_vec();
    with_template.extend(["--chat-template", template.to_str().unwrap()]);
    let out = pyramid(&with_template, &home);
    assert_ok(&out);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let ids: Vec<u64> = v["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect();
    // <bos> <start_of_turn> user \n Hi <end_of_turn> \n <start_of_turn> model \n
    assert_eq!(ids, [2, 105, 2364, 107, 10979, 106, 107, 105, 4368, 107]);

    let broken = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(broken.path(), "{% for %}").unwrap();
    let mut bad = chat.to_vec();
    bad.extend(["--chat-template", broken.path().to_str().unwrap()]);
    let out = pyramid(&bad, &home);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("chat template"), "{}", stderr(&out));
}

fn hf_fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/hf")
        .join(name)
        .to_str()
        .unwrap()
        .to_string()
}

/// Each newer family's directory and the GGUF file llama.cpp's converter made of it run
/// transformers' greedy tokens, and chat through the file's template at the default
/// precision.
#[test]
fn newer_families_run_transformers_tokens_and_chat_from_directories_and_gguf() {
    let f = Fixture::new();
    for name in FAMILY_FIXTURES {
        let dir = hf_fixture(name);
        let reference: Value = serde_json::from_str(
            &std::fs::read_to_string(Path::new(&dir).join("reference.json")).unwrap(),
        )
        .unwrap();
        let prompt = &reference["prompts"][1];
        let file = format!("{dir}/{name}.gguf");
        for model in [&dir, &file] {
            let out = f.run(&[
                "run",
                "-m",
                model,
                "--precision",
                "f32",
                "--prompt",
                prompt["text"].as_str().unwrap(),
                "--temperature",
                "0",
                "-n",
                "12",
                "--ignore-eos",
                // The random weights predict the fixture's control tokens.
                "--sample-control-tokens",
                "--json",
            ]);
            assert_ok(&out);
            let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
            assert_eq!(v["prompt_tokens"], prompt["ids"], "{model}");
            assert_eq!(v["tokens"], prompt["greedy"], "{model}");
            let chat = [
                "run", "-m", model, "--chat", "-p", "Hi", "-n", "2", "--json",
            ];
            assert_ok(&f.run(&chat));
            // `inspect` shows what sets the family apart.
            let out = f.run(&["inspect", model]);
            assert_ok(&out);
            let shown = match name {
                "tiny-qwen3" => "rope scaled: 16 frequencies divided by 1..4",
                "tiny-phi3" => "rope rotates 8 of 16 dims per head",
                "tiny-qwen3moe" => "routed experts: 8 of ffn 48, 3 per token, weights renormalised",
                _ => "layers without rope: [3]",
            };
            assert!(stdout(&out).contains(shown), "{model}: {}", stdout(&out));
        }
    }
}

/// `--model DIR` runs a Hugging Face directory: the prompt is transformers' ids and the
/// first greedy token is transformers' argmax; `--chat` uses the directory's template; the
/// default precision (INT8, calibrated) runs; `inspect` reads the directory.
#[test]
fn a_hugging_face_directory_runs_chats_and_inspects() {
    let f = Fixture::new();
    for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3"] {
        let dir = hf_fixture(name);
        let reference: Value = serde_json::from_str(
            &std::fs::read_to_string(Path::new(&dir).join("reference.json")).unwrap(),
        )
        .unwrap();
        let prompt = &reference["prompts"][1];
        let out = f.run(&[
            "run",
            "-m",
            &dir,
            "--precision",
            "f32",
            "--prompt",
            prompt["text"].as_str().unwrap(),
            "--temperature",
            "0",
            "-n",
            "4",
            "--ignore-eos",
            "--json",
        ]);
        assert_ok(&out);
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(v["prompt_tokens"], prompt["ids"], "{name}");
        let last: Vec<f64> = prompt["logits"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let argmax = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(v["tokens"][0], argmax as u64, "{name}");

        let out = f.run(&["run", "-m", &dir, "--chat", "-p", "Hi", "-n", "2", "--json"]);
        assert_ok(&out);
        let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
        let first_turn = &reference["chat"]["ids"];
        let starts_alike = v["prompt_tokens"][0] == first_turn[0];
        assert!(
            starts_alike,
            "{name}: {} vs {first_turn}",
            v["prompt_tokens"]
        );

        let out = f.run(&["inspect", &dir]);
        assert_ok(&out);
        let arch = format!("architecture:  {}", name.trim_start_matches("tiny-"));
        assert!(stdout(&out).contains(&arch), "{}", stdout(&out));
    }
    let out = f.run(&["run", "-m", f.home().to_str().unwrap(), "-p", "x"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no config.json"), "{}", stderr(&out));
}

/// `-m hf:ORG/REPO:QUANT` runs a model another tool left in the Hugging Face cache, here
/// split in three parts, with no request (the endpoint is a closed port): the whole
/// file's greedy tokens, at f32 and at INT8 (calibrated); `pyramid
/// fetch --calibrate` prints its path and calibrates it ahead, and a malformed id is one line.
#[test]
fn a_split_model_in_the_hugging_face_cache_runs_by_id_without_the_network() {
    use pyramid_gguf::{split::split_file_name, GgufFile, GgufWriter};
    let f = Fixture::new();
    let whole = format!("{}/tiny-qwen3.gguf", hf_fixture("tiny-qwen3"));
    let parts = GgufWriter::from_file(&GgufFile::open(&whole).unwrap())
        .unwrap()
        .to_split_bytes(3)
        .unwrap();
    // The layout huggingface_hub writes: blobs, a snapshot of links, the ref.
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = f.home().join("hf/hub/models--test--tiny-qwen3-GGUF");
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    for (idx, bytes) in parts.iter().enumerate() {
        let blob = format!("blob{idx}");
        std::fs::write(repo.join("blobs").join(&blob), bytes).unwrap();
        let link = snapshot.join(split_file_name("tiny-qwen3-Q8_0", idx, 3));
        std::os::unix::fs::symlink(format!("../../blobs/{blob}"), link).unwrap();
    }
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_pyramid"))
            .args(args)
            .env("PYRAMID_HOME", f.home())
            .env("HF_HOME", f.home().join("hf"))
            .env("HF_ENDPOINT", &endpoint)
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_HUB_OFFLINE")
            .env_remove("HF_TOKEN")
            .env_remove("PYRAMID_ISA")
            .stdin(Stdio::null())
            .output()
            .expect("pyramid runs")
    };
    let id = "hf:test/tiny-qwen3-GGUF:q8_0";
    for precision in ["f32", "int8"] {
        let tokens = |model: &str| {
            let out = run(&[
                "run",
                "-m",
                model,
                "--precision",
                precision,
                "-p",
                "The capital",
                "-n",
                "6",
                "--temperature",
                "0",
                "--ignore-eos",
                "--json",
            ]);
            assert_ok(&out);
            let tokens = serde_json::from_str::<Value>(&stdout(&out)).unwrap()["tokens"].clone();
            assert_eq!(tokens.as_array().map(Vec::len), Some(6), "{model}");
            tokens
        };
        assert_eq!(tokens(id), tokens(&whole), "{precision}");
    }
    // `fetch --calibrate` computes int8's calibration ahead; the next int8 load reads it.
    std::fs::remove_dir_all(f.home().join("calibration")).unwrap();
    let out = run(&["fetch", id, "--calibrate"]);
    assert_ok(&out);
    assert_eq!(
        stdout(&out).trim(),
        snapshot
            .join("tiny-qwen3-Q8_0-00001-of-00003.gguf")
            .to_str()
            .unwrap()
    );
    assert!(stderr(&out).contains("calibrating"), "{}", stderr(&out));
    let calibrations = std::fs::read_dir(f.home().join("calibration"))
        .unwrap()
        .count();
    assert_eq!(calibrations, 1);
    let out = run(&["run", "-m", id, "--precision", "int8", "-p", "x", "-n", "1"]);
    assert_ok(&out);
    assert!(!stderr(&out).contains("calibrating"), "{}", stderr(&out));
    let out = run(&["run", "-m", "hf:tiny-qwen3", "-p", "x"]);
    assert!(!out.status.success());
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("ORG/REPO"), "{}", stderr(&out));
}

/// The README's own generating commands (`pyramid run` on the packaged models, and the
/// quick start's chat) write text: no control token's text and not one word or line
/// over and over. Commands needing a device or the network are left out; `prompt.txt`
/// is written for the one that reads it.
#[test]
fn the_readme_commands_write_text() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let commands: Vec<Vec<String>> = readme
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            line.strip_prefix("pyramid run ").or_else(|| {
                line.split_once("-p pyramid-cli -- run ")
                    .map(|(_, rest)| rest)
            })
        })
        .map(shell_words)
        .filter(|args| {
            !args
                .iter()
                .any(|a| a.ends_with("device") || a.starts_with("hf:"))
        })
        .collect();
    assert!(commands.len() >= 5, "{commands:?}");
    let home = models_dir().parent().unwrap().to_path_buf();
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("prompt.txt"), "Three facts about the Moon:").unwrap();
    for args in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_pyramid"))
            .arg("run")
            .args(&args)
            .current_dir(cwd.path())
            .env("PYRAMID_HOME", &home)
            .env_remove("PYRAMID_ISA")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_ok(&out);
        let text = match serde_json::from_str::<Value>(&stdout(&out)) {
            Ok(v) => v["text"].as_str().unwrap().to_string(),
            Err(_) => stdout(&out),
        };
        for marker in [
            "<start_of_",
            "<end_of_",
            "<|",
            "<unused",
            "<pad>",
            "<bos>",
            "<eos>",
        ] {
            assert!(
                !text.contains(marker),
                "run {args:?} wrote {marker}: {text}"
            );
        }
        let words: Vec<&str> = text.split_whitespace().collect();
        assert!(!words.is_empty(), "run {args:?} wrote nothing");
        let most = words
            .iter()
            .map(|w| words.iter().filter(|x| *x == w).count())
            .max()
            .unwrap_or(0);
        assert!(
            words.len() < 8 || most * 3 < words.len(),
            "run {args:?} repeats one word: {text}"
        );
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let same = lines.windows(2).filter(|w| w[0] == w[1]).count();
        assert!(
            lines.len() < 4 || same * 2 < lines.len(),
            "run {args:?} repeats one line: {text}"
        );
    }
}

/// A README line's arguments as a shell splits them: double quotes group, a `#` starting
/// a word begins a comment.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut in_word) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            '#' if !quoted && !in_word => break,
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}
