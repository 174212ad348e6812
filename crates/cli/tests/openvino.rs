//! Routes through OpenVINO from the command line: `devices`, `run`, `qualify` and
//! `replay` on `ov:CPU` with a tiny random-weight model, the route audit in their JSON,
//! and the errors for missing or wrong libraries, unknown or absent devices.
//!
//! Needs OpenVINO installed by `scripts/setup-openvino.sh` (the test script runs it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::Architecture;
use serde_json::Value;

/// The OpenVINO libraries the setup script installed (tests run with a private
/// PYRAMID_HOME, so they are named explicitly).
fn openvino_libs() -> PathBuf {
    let home = std::env::var_os("PYRAMID_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/pyramid"));
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(home.join("openvino"))
        .expect("OpenVINO is installed: run scripts/setup-openvino.sh")
        .map(|e| e.unwrap().path().join("libs"))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.pop().expect("an OpenVINO install")
}

struct Fixture {
    dir: tempfile::TempDir,
    model: String,
}

impl Fixture {
    fn new(arch: Architecture) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        std::fs::write(
            &path,
            synthetic_gguf(&SyntheticSpec::tiny(arch))
                .unwrap()
                .to_bytes(),
        )
        .unwrap();
        let model = path.to_str().unwrap().to_string();
        Self { dir, model }
    }

    fn run_with(&self, args: &[&str], library: &Path) -> Output {
        self.run_env(args, library, &[])
    }

    fn run_env(&self, args: &[&str], library: &Path, env: &[(&str, &str)]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_pyramid"))
            .args(args)
            .env("PYRAMID_HOME", self.dir.path())
            .env("PYRAMID_OPENVINO_LIB", library)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("pyramid runs")
    }

    fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, &openvino_libs())
    }
}

fn ok_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

fn error_of(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

#[test]
fn devices_lists_the_native_cpu_and_openvino_cpu() {
    let f = Fixture::new(Architecture::Llama);
    let v = ok_json(&f.run(&["devices", "--json"]));
    let names: Vec<&str> = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"cpu") && names.contains(&"ov:CPU"),
        "{names:?}"
    );
    assert!(
        v["openvino"]["Ok"].as_str().unwrap().starts_with("20"),
        "{v}"
    );

    // Without OpenVINO the native device is still listed, with the reason.
    let out = f.run_with(&["devices"], Path::new("/nonexistent/libopenvino_c.so"));
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("cpu") && text.contains("no OpenVINO devices"),
        "{text}"
    );
}

#[test]
fn every_route_gives_the_native_tokens_and_reports_where_it_ran() {
    for arch in [Architecture::Llama, Architecture::Qwen2] {
        let f = Fixture::new(arch);
        let base = [
            "run",
            "-m",
            &f.model,
            "--precision",
            "f32",
            "-p",
            "hello world",
            "-n",
            "12",
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
        ];
        let native = ok_json(&f.run(&base));
        assert_eq!(
            native["route"]["decode"]["executed"]
                .as_str()
                .unwrap()
                .split(' ')
                .next(),
            Some("cpu")
        );
        for route in [
            vec!["--device", "ov:CPU"],
            vec!["--prefill-device", "cpu", "--decode-device", "ov:CPU"],
            vec!["--prefill-device", "ov:CPU", "--decode-device", "cpu"],
        ] {
            let args: Vec<&str> = base.iter().copied().chain(route.iter().copied()).collect();
            let v = ok_json(&f.run(&args));
            assert_eq!(tokens(&v), tokens(&native), "{arch:?} {route:?}");
            for stage in ["prefill", "decode"] {
                let s = &v["route"][stage];
                assert_eq!(s["as_requested"], true, "{s}");
                let executed = s["executed"].as_str().unwrap();
                match s["requested"].as_str().unwrap() {
                    "ov:CPU" => assert_eq!(executed, "CPU"),
                    _ => assert!(executed.starts_with("cpu"), "{executed}"),
                }
            }
        }
    }
}

#[test]
fn qualify_holds_f32_to_every_prompt_and_lossy_weights_to_their_native_precision() {
    let f = Fixture::new(Architecture::Qwen2);
    let qualify = |precision: &str| {
        ok_json(&f.run(&[
            "qualify",
            "-m",
            &f.model,
            "--precision",
            precision,
            "--device",
            "ov:CPU",
            "--windows",
            "64,128",
            "-n",
            "8",
            "--json",
        ]))
    };
    let v = qualify("f32");
    let windows = v["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 2);
    for w in windows {
        assert_eq!(w["valid"], true, "{w}");
        assert_eq!(w["route"]["decode"]["executed"], "CPU");
        // The longest public prompt does not fit 64 positions and is not counted.
        assert!(w["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["matched"] == true));
    }
    // Lossy weights are held to the native path at their precision: the report says how
    // many prompts that matched, and the verdict follows from it.
    let v = qualify("int4");
    for w in v["windows"].as_array().unwrap() {
        let prompts = w["prompts"].as_array().unwrap();
        let matched = prompts.iter().filter(|p| p["matched"] == true).count() as u64;
        let native = w["native_matched"].as_u64().expect("a lossy route's bar");
        assert_eq!(w["valid"], native > 0 && matched >= native, "{w}");
    }
}

#[test]
fn replay_on_openvino_keeps_tokens_across_arms() {
    let f = Fixture::new(Architecture::Llama);
    let v = ok_json(&f.run(&[
        "replay",
        "-m",
        &f.model,
        "--precision",
        "f32",
        "--device",
        "ov:CPU",
        "--synthetic",
        "--sessions",
        "2",
        "--scale",
        "0.01",
        "--windows",
        "64,128,256",
        "--prefill-chunk",
        "16",
        "--generation-reserve",
        "8",
        "--json",
    ]));
    assert_eq!(v["tokens_identical"], true, "{v}");
    assert_eq!(v["route"]["prefill"]["executed"], "CPU");
    let arms = v["arms"].as_array().unwrap();
    assert_eq!(arms.len(), 4);
    assert!(
        arms.iter().any(|a| a["n_migrations"].as_u64().unwrap() > 0),
        "{v}"
    );
}

/// A second start loads its artifacts from the store under PYRAMID_HOME: nothing
/// compiled, the same tokens. Each architecture's RoPE form and attention (halves with
/// biases, pairs, sliding windows) comes back from OpenVINO's cache right, a blob per
/// artifact beside one weights file; an empty CACHE_DIR turns the store off.
#[test]
fn a_second_start_loads_its_artifacts_from_the_store() {
    for (arch, precision) in [
        (Architecture::Qwen2, "int8"),
        (Architecture::Llama, "f32"),
        (Architecture::Gemma3, "f32"),
    ] {
        let f = Fixture::new(arch);
        let run = |extra: &[&str]| {
            let mut args = vec![
                "run",
                "-m",
                &f.model,
                "--precision",
                precision,
                "--device",
                "ov:CPU",
                "-p",
                "hello world",
                "-n",
                "12",
                "--temperature",
                "0",
                "--ignore-eos",
                "--json",
            ];
            args.extend(extra);
            let v = ok_json(&f.run(&args));
            let a = &v["artifacts"];
            let counts = (
                a["compiled"].as_u64().unwrap(),
                a["loaded_from_store"].as_u64().unwrap(),
            );
            (tokens(&v), counts)
        };
        let (first, (compiled, loaded)) = run(&[]);
        assert!(
            compiled >= 2 && loaded == 0,
            "{arch:?}: {compiled} {loaded}"
        );
        let (second, counts) = run(&[]);
        assert_eq!(
            counts,
            (0, compiled),
            "{arch:?}: the second start compiles nothing"
        );
        assert_eq!(second, first, "{arch:?} {precision}: tokens from the store");

        let store = f.dir.path().join("compiled");
        let models: Vec<PathBuf> = std::fs::read_dir(
            std::fs::read_dir(&store)
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path(),
        )
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
        assert_eq!(
            models.len(),
            1,
            "one directory per model and format: {models:?}"
        );
        assert!(
            std::fs::metadata(models[0].join("weights.bin"))
                .unwrap()
                .len()
                > 0
        );
        let blobs: Vec<u64> = std::fs::read_dir(models[0].join("CPU"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .collect();
        assert_eq!(blobs.len() as u64, compiled, "a blob per artifact");

        let (off, counts) = run(&["--ov-option", "CACHE_DIR="]);
        assert_eq!(counts, (compiled, 0), "{arch:?}: CACHE_DIR= compiles");
        assert_eq!(off, first);
    }

    // A budget of nothing keeps only the blob each compile has just written; a budget
    // that is not a number is refused by name.
    let f = Fixture::new(Architecture::Llama);
    let args = [
        "run",
        "-m",
        &f.model,
        "--precision",
        "f32",
        "--device",
        "ov:CPU",
        "-p",
        "hello",
        "-n",
        "4",
        "--json",
    ];
    ok_json(&f.run_env(&args, &openvino_libs(), &[("PYRAMID_STORE_GB", "0")]));
    let blobs: Vec<PathBuf> = walk(&f.dir.path().join("compiled"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "blob"))
        .collect();
    assert_eq!(blobs.len(), 1, "{blobs:?}");
    let err = error_of(&f.run_env(&args, &openvino_libs(), &[("PYRAMID_STORE_GB", "lots")]));
    assert!(err.contains("PYRAMID_STORE_GB=lots"), "{err}");
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn bad_devices_and_libraries_give_clear_errors() {
    let f = Fixture::new(Architecture::Llama);
    let run = |extra: &[&str]| -> Vec<String> {
        [
            "run",
            "-m",
            f.model.as_str(),
            "--precision",
            "f32",
            "-p",
            "hi",
            "-n",
            "2",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };

    let err = error_of(&f.run(&["run", "-m", "synthetic:gpt-5", "-p", "hi"]));
    assert!(
        err.contains("unknown synthetic shape 'gpt-5'") && err.contains("qwen2.5-1.5b"),
        "{err}"
    );
    let err = error_of(&f.run(&as_args(&run(&["--device", "gpu"]))));
    assert!(err.contains("unknown device 'gpu'"), "{err}");
    let err = error_of(&f.run(&as_args(&run(&["--device", "ov:NPU"]))));
    assert!(
        err.contains("'ov:NPU' is not present") && err.contains("ov:CPU"),
        "{err}"
    );
    let err = error_of(&f.run(&as_args(&run(&["--device", "ov:CPU", "--kv", "int8"]))));
    assert!(err.contains("--kv f32"), "{err}");
    let err = error_of(&f.run(&as_args(&run(&[
        "--device",
        "ov:CPU",
        "--ov-option",
        "INFERENCE_PRECISION_HINT=f7",
    ]))));
    assert!(err.contains("prefill c") && err.contains("f7"), "{err}");

    let err = error_of(&f.run_with(
        &as_args(&run(&["--device", "ov:CPU"])),
        Path::new("/nonexistent/lib"),
    ));
    assert!(
        err.contains("OpenVINO is not installed") && err.contains("setup-openvino.sh"),
        "{err}"
    );
    // Some other shared library where OpenVINO's C API should be.
    let other = openvino_libs().join("libtbb.so.12");
    let err = error_of(&f.run_with(&as_args(&run(&["--device", "ov:CPU"])), &other));
    assert!(
        err.contains("not an OpenVINO C library") && err.contains("ov_get_openvino_version"),
        "{err}"
    );
}

fn as_args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn bench_on_openvino_reports_window_compile_route_and_qualification() {
    let f = Fixture::new(Architecture::Qwen2);
    let bench = |precision: &str| {
        ok_json(&f.run(&[
            "bench",
            "-m",
            &f.model,
            "--precision",
            precision,
            "--device",
            "ov:CPU",
            "--window",
            "64",
            "--prefill-chunk",
            "16",
            "-p",
            "20",
            "-n",
            "4",
            "-r",
            "1",
            "--json",
        ]))
    };
    let records = bench("f32");
    let records = records.as_array().unwrap();
    assert_eq!(records.len(), 2, "a pp and a tg record");
    for r in records {
        assert_eq!(r["device"], "ov:CPU");
        assert_eq!(r["window"], 64);
        // `qualify` compiled the window's artifacts first: the cells may load them.
        let made = r["compile_ms"].as_f64().unwrap() + r["store_load_ms"].as_f64().unwrap();
        assert!(made > 0.0, "{r}");
        assert_eq!(r["route"]["decode"]["executed"], "CPU");
        assert_eq!(r["qualified"], true, "{r}");
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
    }
    let lossy = bench("int4");
    assert!(
        lossy
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["qualified"] == false),
        "{lossy}"
    );

    let native = ok_json(&f.run(&[
        "bench", "-m", &f.model, "-p", "8", "-n", "0", "-r", "1", "--json",
    ]));
    assert_eq!(native[0]["qualified"], Value::Null);
    assert_eq!(native[0]["window"], Value::Null);
}

#[test]
fn bench_matrix_measures_checks_and_reports_with_provenance() {
    let f = Fixture::new(Architecture::Qwen2);
    let dir = f.dir.path();
    let config = dir.join("matrix.toml");
    std::fs::write(
        &config,
        format!(
            "models = [\"{}\"]\nprecisions = [\"f32\", \"int4\"]\nwindows = [64, 128]\nroutes = [\"cpu\", \"cpu->ov:CPU\"]\nn_prompt = 8\nn_gen = 4\nrepetitions = 2\n",
            f.model
        ),
    )
    .unwrap();
    // A fabricated powercap tree whose counters never move: measured, and net of idle.
    let rapl = dir.join("powercap/intel-rapl:0");
    std::fs::create_dir_all(&rapl).unwrap();
    for (file, value) in [
        ("name", "package-0"),
        ("energy_uj", "1000"),
        ("max_energy_range_uj", "262143328850"),
    ] {
        std::fs::write(rapl.join(file), value).unwrap();
    }
    let results = dir.join("out/latest.json");
    let out = f.run(&[
        "bench",
        "matrix",
        "--config",
        config.to_str().unwrap(),
        "--results",
        results.to_str().unwrap(),
        "--powercap-root",
        dir.join("powercap").to_str().unwrap(),
        "--idle-seconds",
        "0.1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&results).unwrap()).unwrap();
    let cells = v["verified"].as_array().unwrap();
    assert_eq!(cells.len(), 8, "2 precisions × 2 windows × 2 routes");
    for c in cells {
        assert_eq!(c["decode_tok_s"]["n"], 2);
        assert!(c["provenance"]["machine"]["cores"].as_u64().unwrap() >= 1);
        assert!(!c["provenance"]["command"].as_str().unwrap().is_empty());
        assert!(c["energy"]["measured"]["package_joules"].is_number(), "{c}");
        let expect_valid = c["precision"] == "f32";
        assert_eq!(c["qualified"], expect_valid, "{c}");
        if c["decode_device"] == "ov:CPU" {
            assert_eq!(c["decode_executed"], "CPU");
        }
    }
    assert!(dir.join("out/history").read_dir().unwrap().count() == 1);

    // Report into a README with the markers, then check it; a hand edit fails the check.
    let readme = dir.join("README.md");
    std::fs::write(
        &readme,
        "# t\n<!-- pyramid bench report: begin -->\n<!-- pyramid bench report: end -->\n",
    )
    .unwrap();
    let report_dir = dir.join("report");
    let out = f.run(&[
        "bench",
        "report",
        "--results",
        results.to_str().unwrap(),
        "--out-dir",
        report_dir.to_str().unwrap(),
        "--readme",
        readme.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(report_dir.join("REPORT.md")).unwrap();
    assert!(
        md.contains("## Failures") && md.contains("decode tok/s"),
        "{md}"
    );
    assert!(report_dir.join("decode-0.svg").exists() && report_dir.join("decode-0.png").exists());
    let check = |readme: &Path| {
        f.run(&[
            "bench",
            "check",
            "--results",
            results.to_str().unwrap(),
            "--readme",
            readme.to_str().unwrap(),
        ])
    };
    assert!(check(&readme).status.success());
    let text = std::fs::read_to_string(&readme).unwrap();
    let edited = dir.join("EDITED.md");
    std::fs::write(&edited, text.replacen("| cpu |", "| cpu (fast!) |", 1)).unwrap();
    let err = error_of(&check(&edited));
    assert!(
        err.contains("differs from what `pyramid bench report` renders"),
        "{err}"
    );

    // Without RAPL the energy says why instead of zero.
    let results2 = dir.join("out2/latest.json");
    let out = f.run(&[
        "bench",
        "matrix",
        "--config",
        config.to_str().unwrap(),
        "--results",
        results2.to_str().unwrap(),
        "--powercap-root",
        "/nonexistent",
    ]);
    assert!(out.status.success());
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&results2).unwrap()).unwrap();
    assert!(v["verified"][0]["energy"]["unavailable"]
        .as_str()
        .unwrap()
        .contains("no powercap interface"));
}

/// Hugging Face directories run on `ov:CPU` with the native tokens: the graph is built
/// from the model as loaded, whatever file it came from.
#[test]
fn hugging_face_directories_run_on_openvino_with_the_native_tokens() {
    // Each family's fixture; the newer ones also as the GGUF files llama.cpp's converter
    // made.
    for name in [
        "tiny-llama",
        "tiny-qwen2",
        "tiny-gemma3",
        "tiny-qwen3",
        "tiny-qwen3/tiny-qwen3.gguf",
        "tiny-smollm3",
        "tiny-smollm3/tiny-smollm3.gguf",
    ] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/hf")
            .join(name);
        let f = Fixture {
            dir: tempfile::tempdir().unwrap(),
            model: dir.to_str().unwrap().to_string(),
        };
        let base = [
            "run",
            "-m",
            &f.model,
            "--precision",
            "f32",
            "-p",
            "The lighthouse keeper wrote the time and the weather.",
            "-n",
            "24",
            "--temperature",
            "0",
            "--ignore-eos",
            "--json",
        ];
        let native = ok_json(&f.run(&base));
        let mut on_ov = base.to_vec();
        on_ov.extend(["--device", "ov:CPU"]);
        let v = ok_json(&f.run(&on_ov));
        assert_eq!(tokens(&v), tokens(&native), "{name}");
        assert_eq!(v["route"]["decode"]["executed"], "CPU", "{name}");
    }
    // Phi-3 rotates part of each head and Qwen3-MoE routes to experts, which the graphs
    // do not: clear refusals.
    for (name, refusal) in [
        ("tiny-phi3", "partial RoPE (8 of 16 dimensions)"),
        ("tiny-qwen3moe", "routed experts (8 experts, 3 per token)"),
    ] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/hf")
            .join(name);
        let f = Fixture {
            dir: tempfile::tempdir().unwrap(),
            model: dir.to_str().unwrap().to_string(),
        };
        let args = [
            "run",
            "-m",
            &f.model,
            "--device",
            "ov:CPU",
            "--precision",
            "f32",
            "-p",
            "Hi",
        ];
        let error = error_of(&f.run(&args));
        assert!(error.contains(refusal), "{name}: {error}");
    }
}

/// `pyramid affinity` on SmolLM2 with `cpu,ov:CPU`, kept short: every level for every
/// device and precision, OpenVINO f32 agreeing with the native f32 everywhere, and the
/// results file and chart written.
#[test]
fn affinity_on_smollm2_measures_every_level_on_cpu_and_openvino_cpu() {
    let model = pyramid_testdata::model_path("smollm2-135m-instruct-q4_1.gguf");
    let fx = Fixture::new(Architecture::Llama);
    let results = fx.dir.path().join("affinity.json");
    let chart = fx.dir.path().join("affinity");
    let out = fx.run(&[
        "affinity",
        "-m",
        model.to_str().unwrap(),
        "--devices",
        "cpu,ov:CPU",
        "--precision",
        "f32,int8",
        "--seq",
        "32",
        "--window",
        "64",
        "--n-gen",
        "4",
        "--reps",
        "1",
        "--trials",
        "2",
        "--min-batch-ms",
        "2",
        "--out",
        results.to_str().unwrap(),
        "--chart",
        chart.to_str().unwrap(),
        "--json",
    ]);
    let v = ok_json(&out);
    assert_eq!(
        v,
        serde_json::from_slice::<Value>(&std::fs::read(&results).unwrap()).unwrap()
    );
    assert!(chart.with_extension("svg").exists() && chart.with_extension("png").exists());
    assert!(v["provenance"]["commit"].is_string() && v["provenance"]["machine"]["cpu"].is_string());
    let cells = v["cells"].as_array().unwrap();
    let invalid = v["invalid"].as_array().unwrap();
    assert!(
        invalid.iter().all(|c| c["precision"] != "f32"),
        "f32 agrees: {invalid:?}"
    );
    for device in ["cpu", "ov:CPU"] {
        for precision in ["f32", "int8"] {
            for level in ["operator", "isolated", "block", "stage", "model"] {
                let n = cells
                    .iter()
                    .chain(invalid)
                    .filter(|c| {
                        c["device"] == device && c["precision"] == precision && c["level"] == level
                    })
                    .count();
                let expected = match level {
                    "operator" => 4,  // attention and FFN, two stages
                    "isolated" => 16, // seven projections and the core, two stages
                    "block" => 6,     // whole and two ablations, two stages
                    "stage" => 2,
                    _ => 1,
                };
                assert_eq!(n, expected, "{device} {precision} {level}");
            }
        }
    }
    for c in cells.iter().filter(|c| c["device"] == "ov:CPU") {
        assert_eq!(c["executed_on"], "CPU", "{c}");
    }
    let end_to_end = cells
        .iter()
        .find(|c| c["level"] == "model" && c["device"] == "ov:CPU" && c["precision"] == "f32")
        .expect("the f32 end-to-end cell is valid");
    assert_eq!(end_to_end["tokens_matching"], 4);

    // A stage that does not exist is one clear error.
    let err = error_of(&fx.run(&["affinity", "-m", &fx.model, "--stage", "verify"]));
    assert!(err.contains("unknown stage 'verify'"), "{err}");

    // `--device auto` places bench's route from the profile and predicts beside measuring.
    let model = model.to_str().unwrap();
    let results = results.to_str().unwrap();
    let bench = fx.run(&[
        "bench",
        "-m",
        model,
        "--precision",
        "int8",
        "--device",
        "auto",
        "--affinity",
        results,
        "-p",
        "32",
        "-n",
        "4",
        "-r",
        "1",
        "--json",
    ]);
    let records = ok_json(&bench);
    let stderr = String::from_utf8_lossy(&bench.stderr);
    assert!(stderr.contains("route auto: prefill on"), "{stderr}");
    for r in records.as_array().unwrap() {
        let predicted = r["predicted_ts"].as_f64().expect("a prediction per test");
        let levels = r["predicted_ts_by_level"].as_object().unwrap();
        assert!(
            levels.contains_key("stage") && levels.contains_key("decoder block"),
            "{r}"
        );
        assert!(
            predicted > 0.0 && r["avg_ts"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        let device = r["device"].as_str().unwrap();
        assert!(
            stderr.contains(&format!(
                "prefill on {}",
                device.split("->").next().unwrap()
            )),
            "{stderr} vs {device}"
        );
    }
    // A split prefill places its layers from the profile's block figures and predicts
    // its chunks beside measuring them.
    let split = fx.run(&[
        "bench",
        "-m",
        model,
        "--precision",
        "int8",
        "--prefill-device",
        "cpu+ov:CPU",
        "--decode-device",
        "cpu",
        "--affinity",
        results,
        "--window",
        "64",
        "--prefill-chunk",
        "32",
        "-p",
        "32",
        "-n",
        "0",
        "-r",
        "1",
        "--json",
    ]);
    let records = ok_json(&split);
    let stderr = String::from_utf8_lossy(&split.stderr);
    assert!(
        stderr.contains("split prefill: ") && stderr.contains("from the block level of"),
        "{stderr}"
    );
    let record = &records[0];
    let plan = &record["split_plan"];
    let assignment = plan["assignment"].as_array().unwrap();
    assert_eq!(assignment.len(), 30, "{plan}");
    assert!(
        assignment
            .iter()
            .all(|a| ["either", "native", "device"].contains(&a.as_str().unwrap())),
        "{plan}"
    );
    let per_chunk = plan["predicted"].as_f64().unwrap();
    assert!(per_chunk > 0.0 && per_chunk <= plan["predicted_either"].as_f64().unwrap());
    let predicted_ts = record["predicted_ts"].as_f64().unwrap();
    assert!(
        (predicted_ts - 32.0 / per_chunk).abs() < 1e-6 * predicted_ts,
        "{record}"
    );
    assert!(record["avg_ts"].as_f64().unwrap() > 0.0);
    let err = error_of(&fx.run(&[
        "run",
        "-m",
        model,
        "--precision",
        "int4",
        "--prefill-device",
        "cpu+ov:CPU",
        "--decode-device",
        "cpu",
        "--affinity",
        results,
        "-n",
        "1",
        "--prompt",
        "Hi",
    ]));
    assert!(
        err.contains("no valid int4 prefill block figures for both cpu and ov:CPU"),
        "{err}"
    );

    // A profile on a route with nothing to place is an error, not ignored.
    let err = error_of(&fx.run(&[
        "run",
        "-m",
        model,
        "--affinity",
        results,
        "-n",
        "1",
        "--prompt",
        "Hi",
    ]));
    assert!(err.contains("this route has neither"), "{err}");
    // Placing needs a profile, of this model, with figures at this precision.
    let err = error_of(&fx.run(&[
        "run", "-m", model, "--device", "auto", "-n", "1", "--prompt", "Hi",
    ]));
    assert!(err.contains("--affinity FILE"), "{err}");
    let err = error_of(&fx.run(&[
        "run",
        "-m",
        &fx.model,
        "--device",
        "auto",
        "--affinity",
        results,
        "-n",
        "1",
        "--prompt-tokens",
        "1",
    ]));
    assert!(err.contains("profiles model"), "{err}");
    let err = error_of(&fx.run(&[
        "run",
        "-m",
        model,
        "--precision",
        "int4",
        "--device",
        "auto",
        "--affinity",
        results,
        "-n",
        "1",
        "--prompt",
        "Hi",
    ]));
    assert!(err.contains("no valid int4 stage figures"), "{err}");
}

/// Prefill split between the native kernels and ov:CPU (`--prefill-device cpu+ov:CPU`)
/// gives SmolLM2's native f32 greedy tokens, and its audit names both executors.
#[test]
fn a_split_prefill_on_cpu_and_openvino_gives_the_native_tokens() {
    let model = pyramid_testdata::model_path("smollm2-135m-instruct-q4_1.gguf");
    let model = model.to_str().unwrap();
    let fx = Fixture::new(Architecture::Llama);
    let prompt = "The old lighthouse keeper climbed the stairs every evening to";
    let args = |route: &[&'static str]| {
        let mut args = vec![
            "run",
            "-m",
            model,
            "--precision",
            "f32",
            "-n",
            "16",
            "--temperature",
            "0",
            "--prompt",
            prompt,
            "--json",
        ];
        args.extend_from_slice(route);
        args
    };
    let native = ok_json(&fx.run(&args(&[])));
    let split = ok_json(&fx.run(&args(&[
        "--prefill-device",
        "cpu+ov:CPU",
        "--decode-device",
        "cpu",
    ])));
    assert_eq!(tokens(&split), tokens(&native));
    let prefill = &split["route"]["prefill"];
    assert_eq!(prefill["requested"], "cpu+ov:CPU");
    assert!(
        prefill["executed"].as_str().unwrap().ends_with("+ CPU"),
        "{prefill}"
    );
    assert_eq!(prefill["as_requested"], true);

    let err = error_of(&fx.run(&[
        "run",
        "-m",
        model,
        "--device",
        "cpu+ov:CPU",
        "-n",
        "1",
        "--prompt",
        "hi",
    ]));
    assert!(err.contains("splits prefill only"), "{err}");
    let err = error_of(&fx.run(&[
        "run",
        "-m",
        model,
        "--prefill-device",
        "cpu+cpu",
        "-n",
        "1",
        "--prompt",
        "hi",
    ]));
    assert!(err.contains("cpu+ov:DEVICE"), "{err}");
}
