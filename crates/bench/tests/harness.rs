//! The harness's accounting on fabricated inputs: a powercap tree with scripted
//! counters, results files with and without provenance, a README quoting what it must
//! not, and a samples file cut short by an interruption.

use std::path::Path;

use pyramid_bench::energy::{EnergyReport, Powercap};
use pyramid_bench::matrix::{read_samples, remaining, MatrixConfig, Sample};
use pyramid_bench::report;
use pyramid_bench::results::{
    check, replace_readme_section, Cell, CellKey, Machine, Provenance, ReplayArm, ReplayRecord,
    ResultsFile, Stat,
};

fn domain(root: &Path, dir: &str, name: &str, energy_uj: u64, max_uj: u64) {
    let d = root.join(dir);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("name"), format!("{name}\n")).unwrap();
    std::fs::write(d.join("energy_uj"), format!("{energy_uj}\n")).unwrap();
    std::fs::write(d.join("max_energy_range_uj"), format!("{max_uj}\n")).unwrap();
}

fn set(root: &Path, dir: &str, energy_uj: u64) {
    std::fs::write(root.join(dir).join("energy_uj"), format!("{energy_uj}\n")).unwrap();
}

const MAX: u64 = 262_143_328_850;

#[test]
fn energy_is_net_of_the_idle_baseline_and_survives_wraparound() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // A control-type directory without counters is not a domain.
    std::fs::create_dir_all(root.join("intel-rapl")).unwrap();
    domain(root, "intel-rapl:0", "package-0", 1_000_000, MAX);
    domain(root, "intel-rapl:0:0", "core", 500_000, MAX);
    domain(root, "intel-rapl:0:1", "uncore", 100_000, MAX);
    domain(root, "intel-rapl:0:2", "dram", MAX - 1_000_000, MAX);
    let pc = Powercap::open(root).unwrap();
    assert_eq!(pc.domain_names(), ["package-0", "core", "uncore", "dram"]);

    // Idle: 2 W package, 1 W core, 0 uncore, 0.5 W dram over 2 s.
    let idle0 = pc.read().unwrap();
    set(root, "intel-rapl:0", 5_000_000);
    set(root, "intel-rapl:0:0", 2_500_000);
    set(root, "intel-rapl:0:2", MAX);
    let idle1 = pc.read().unwrap();
    let baseline = pc.baseline(&idle0, &idle1, 2.0);

    // Work for 1 s: package +12 J, core +6 J, uncore +1 J, dram wraps (+3 J).
    let before = idle1.clone();
    set(root, "intel-rapl:0", 17_000_000);
    set(root, "intel-rapl:0:0", 8_500_000);
    set(root, "intel-rapl:0:1", 1_100_000);
    set(root, "intel-rapl:0:2", 3_000_000);
    let after = pc.read().unwrap();
    let e = pc.energy(&before, &after, 1.0, &baseline);
    let net = |name: &str| {
        e.domains
            .iter()
            .find(|d| d.name == name)
            .unwrap()
            .net_joules
    };
    assert!((net("package-0") - 10.0).abs() < 1e-9);
    assert!((net("core") - 5.0).abs() < 1e-9);
    assert!((net("uncore") - 1.0).abs() < 1e-9);
    assert!(
        (net("dram") - 2.5).abs() < 1e-9,
        "wrapped counter: {}",
        net("dram")
    );
    assert_eq!(e.package_joules, Some(10.0));
    // No NPU domain: its energy is what the package used beyond core, uncore and dram.
    assert!((e.npu_residual_joules.unwrap() - 1.5).abs() < 1e-9);
    let report = EnergyReport::Measured(e);
    assert_eq!(report.joules_per_token(4), Some(2.5));
}

#[test]
fn missing_or_unreadable_rapl_is_a_reason_never_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let err = Powercap::open(&tmp.path().join("absent")).unwrap_err();
    assert!(err.contains("no powercap interface"), "{err}");
    let err = Powercap::open(tmp.path()).unwrap_err();
    assert!(err.contains("no RAPL domains"), "{err}");

    domain(tmp.path(), "intel-rapl:0", "package-0", 10, MAX);
    std::fs::write(tmp.path().join("intel-rapl:0/energy_uj"), "garbage").unwrap();
    let err = Powercap::open(tmp.path()).unwrap_err();
    assert!(err.contains("not a counter"), "{err}");

    // A platform with an NPU domain reports it and no residual; one without core has none.
    let tmp = tempfile::tempdir().unwrap();
    domain(tmp.path(), "intel-rapl:0", "package-0", 0, MAX);
    domain(tmp.path(), "intel-rapl:0:5", "npu", 0, MAX);
    let pc = Powercap::open(tmp.path()).unwrap();
    let c = pc.read().unwrap();
    let zero = pc.baseline(&c, &c, 1.0);
    assert_eq!(pc.energy(&c, &c, 1.0, &zero).npu_residual_joules, None);
    assert_eq!(
        EnergyReport::Unavailable("why".into()).joules_per_token(10),
        None
    );
}

fn key(window: usize, route: &str) -> CellKey {
    CellKey {
        model: "m".into(),
        precision: "f32".into(),
        kv: "f32".into(),
        window,
        prefill_device: route.into(),
        decode_device: route.into(),
        batch: 1,
        n_prompt: 8,
        n_gen: 4,
    }
}

fn cell(window: usize, route: &str, qualified: Option<bool>, provenance: bool) -> Cell {
    let s = Stat::of(&[10.0, 12.0]);
    Cell {
        key: key(window, route),
        synthetic: false,
        parameters: None,
        prefill_executed: "CPU".into(),
        decode_executed: "CPU".into(),
        as_requested: true,
        qualified,
        agreement: None,
        ttft_ms: s,
        prefill_tok_s: s,
        decode_tok_s: Stat::of(&[window as f64 / 100.0]),
        decode_ms_per_token: s,
        e2e_ms: s,
        compile_ms: 5.0,
        peak_rss_bytes: Some(1 << 20),
        energy: EnergyReport::Unavailable("no RAPL domains under /sys/class/powercap".into()),
        joules_per_token: None,
        provenance: provenance.then(provenance_of_matrix),
    }
}

fn provenance_of_matrix() -> Provenance {
    Provenance {
        command: "pyramid bench matrix --config m.toml".into(),
        ..provenance()
    }
}

fn provenance() -> Provenance {
    Provenance {
        machine: Machine::detect("avx2"),
        commit: "abc123".into(),
        command: "pyramid replay --synthetic --record latest.json".into(),
        date: "2026-11-30T23:00:00Z".into(),
    }
}

fn replay(route: &str, tokens_identical: bool) -> ReplayRecord {
    let arm = |name: &str, total_ms: f64, reprefill_ms: f64| ReplayArm {
        arm: name.into(),
        total_ms,
        ttft_ms_p50: 100.0,
        decode_ms_per_token: 20.0,
        n_compiles: 2,
        compile_ms: 10.0,
        n_store_loads: Some(0),
        store_load_ms: Some(0.0),
        n_migrations: 0,
        migration_ms: 0.0,
        migration_bytes: Some(0),
        migration_live_bytes: Some(0),
        n_reprefills: usize::from(reprefill_ms > 0.0),
        reprefill_ms,
        n_stalls: 0,
        stall_ms: 0.0,
        peak_rss_bytes: Some(1 << 30),
        failed_sessions: 0,
    };
    ReplayRecord {
        model: "m".into(),
        precision: "f32".into(),
        kv: "f32".into(),
        route: route.into(),
        executed: "CPU -> CPU".into(),
        as_requested: true,
        windows: vec![1024, 2048],
        trace: "synthetic (seed 0)".into(),
        steps: 10,
        appended_tokens: 5000,
        generate_tokens: 50,
        tokens_identical: Some(tokens_identical),
        arms: vec![
            arm("largest", 8000.0, 0.0),
            arm("reprefill", 9000.0, 4000.0),
        ],
        provenance: Some(provenance()),
    }
}

#[test]
fn replay_runs_report_with_provenance_and_only_when_their_arms_agree() {
    let mut file = ResultsFile::default();
    file.merge_replay(replay("cpu", true));
    file.merge_replay(replay("ov:CPU", false));
    // The same setup measured again replaces the earlier run.
    file.merge_replay(replay("cpu", true));
    assert_eq!(file.replays.len(), 2);
    let md = report::markdown(&file, Some("charts"));
    assert!(md.contains("| reprefill | 9000 |"), "{md}");
    assert!(md.contains("![total time per strategy](charts/replay-0.svg)"));
    assert!(md.contains("kept out of the tables (arms generated different tokens)"));
    let mut lost = replay("cpu", true);
    lost.trace = "another trace".into();
    lost.arms[1].failed_sessions = 2;
    file.merge_replay(lost);
    let md = report::markdown(&file, Some("charts"));
    assert!(
        md.contains("kept out of the tables (sessions failed)"),
        "{md}"
    );
    let section = report::readme_section(&file);
    assert!(
        section.contains("| reprefill | 9.0 | 20.0 | 4.0 | 0 |"),
        "{section}"
    );
    assert!(!section.contains("ov:CPU"), "{section}");
    let charts = report::charts(&file);
    assert_eq!(charts.len(), 1);
    assert_eq!(charts[0].name, "replay-0");

    file.replays[0].provenance = None;
    let problems = check(&serde_json::to_string(&file).unwrap(), None);
    assert!(
        problems.len() == 1
            && problems[0].contains("replay m f32")
            && problems[0].contains("no provenance"),
        "{problems:?}"
    );
}

#[test]
fn charts_render_to_png_with_the_svgs_size() {
    let mut file = ResultsFile::default();
    file.merge(vec![
        cell(1024, "cpu", Some(true), true),
        cell(2048, "cpu", Some(true), true),
    ]);
    let charts = report::charts(&file);
    let png = report::png_of_svg(&charts[0].svg).expect("a system font (fonts-dejavu-core)");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (640, 380));
    assert!(matches!(
        report::png_of_svg("<svg"),
        Err(report::PngError::Svg(_))
    ));
}

#[test]
fn check_rejects_missing_provenance_and_readme_figures_not_from_verified_cells() {
    let mut file = ResultsFile::default();
    file.merge(vec![
        cell(1024, "cpu", Some(true), true),
        cell(2048, "cpu", Some(true), true),
    ]);
    file.unverified.push(pyramid_bench::results::Unverified {
        figure: "peer decode on another laptop".into(),
        quote: "123.4 tok/s".into(),
        source: "a blog post".into(),
    });
    let text = serde_json::to_string(&file).unwrap();
    let section = report::readme_section(&file);
    let readme = replace_readme_section(
        "# x\n<!-- pyramid bench report: begin -->\n<!-- pyramid bench report: end -->\n",
        &section,
    )
    .unwrap();
    assert_eq!(
        check(&text, Some((&readme, &section))),
        Vec::<String>::new()
    );

    // A hand-edited section, an unverified quote, a cell without provenance.
    let edited = readme.replace("10.2", "99.9");
    assert!(edited != readme);
    assert_eq!(check(&text, Some((&edited, &section))).len(), 1);
    let quoting = format!("{readme}\nPeers reach 123.4 tok/s.\n");
    let problems = check(&text, Some((&quoting, &section)));
    assert!(problems[0].contains("unverified figure"), "{problems:?}");
    file.merge(vec![cell(4096, "cpu", Some(true), false)]);
    let problems = check(&serde_json::to_string(&file).unwrap(), None);
    assert!(
        problems.len() == 1 && problems[0].contains("no provenance"),
        "{problems:?}"
    );
    assert!(check("{", None)[0].contains("not a results file"));
}

#[test]
fn invalid_cells_stay_out_of_headline_tables_and_charts() {
    let mut file = ResultsFile::default();
    file.merge(vec![
        cell(1024, "cpu", Some(true), true),
        cell(1024, "ov:NPU", Some(false), true),
    ]);
    let md = report::markdown(&file, Some("charts"));
    let headline = &md[..md.find("## Failures").expect("a failures table")];
    assert!(!headline.contains("ov:NPU"), "{md}");
    assert!(
        md[md.find("## Failures").unwrap()..].contains("| ov:NPU | CPU -> CPU | wrong |"),
        "{md}"
    );
    let charts = report::charts(&file);
    assert_eq!(charts.len(), 1);
    assert!(charts[0].svg.starts_with("<svg") && !charts[0].svg.contains("ov:NPU"));
    assert!(md.contains("Energy unavailable: no RAPL domains"));
}

#[test]
fn an_interrupted_run_resumes_with_what_it_has() {
    let config = MatrixConfig::parse(
        "models = [\"m\"]\nprecisions = [\"f32\"]\nwindows = [16, 1024, 2048]\nroutes = [\"cpu\", \"cpu->ov:CPU\"]\nn_prompt = 8\nn_gen = 16\nrepetitions = 2\n",
    )
    .unwrap();
    // Window 16 cannot hold 8 + 16 tokens.
    let cells = config.cells();
    assert_eq!(cells.len(), 4);
    assert_eq!(cells[1].decode_device, "ov:CPU");
    let schedule = config.schedule();
    assert_eq!(schedule.len(), 8);
    // Interleaved: every cell once before any twice, the second pass rotated.
    assert_eq!(&schedule[..4], &[(0, 0), (1, 0), (2, 0), (3, 0)]);
    assert_eq!(schedule[4], (1, 1));

    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("samples.jsonl");
    let sample = |c: usize, rep: usize| Sample {
        key: cells[c].clone(),
        repetition: rep,
        ttft_ms: 1.0,
        prefill_tok_s: 1.0,
        decode_tok_s: 1.0,
        e2e_ms: 1.0,
        compile_ms: 1.0,
        peak_rss_bytes: None,
        energy: EnergyReport::Unavailable("test".into()),
        prefill_executed: "cpu".into(),
        decode_executed: "cpu".into(),
        qualified: Some(true),
        agreement: None,
    };
    let mut text = String::new();
    for (c, rep) in &schedule[..3] {
        text.push_str(&serde_json::to_string(&sample(*c, *rep)).unwrap());
        text.push('\n');
    }
    // Killed while writing the fourth.
    text.push_str("{\"key\": {\"model\"");
    std::fs::write(&path, &text).unwrap();
    let done = read_samples(&path).unwrap();
    assert_eq!(done.len(), 3);
    assert_eq!(remaining(&config, &done), schedule[3..].to_vec());

    for bad in [
        "models = []\nprecisions = [\"f32\"]\nwindows = [1]\nroutes = [\"cpu\"]\nn_prompt = 1\nn_gen = 1\n",
        "models = [\"m\"]\nprecisions = [\"f32\"]\nwindows = [1]\nroutes = [\"cpu\"]\nn_prompt = 1\nn_gen = 1\nbogus = 1\n",
    ] {
        assert!(MatrixConfig::parse(bad).is_err());
    }
}

fn peers_run(cpu: &str, cpus: usize, describe: &str) -> String {
    serde_json::json!({
        "schema": "pyramid-peers/1",
        "date": "2026-12-01T03:00:00+00:00",
        "invocation": "scripts/peers/bench-peers.sh -r 3 --out peers.json",
        "settings": {"threads": 2, "precision": "int8"},
        "machine": {"cpu_model": cpu, "logical_cpus": cpus},
        "versions": {"pyramid": {"git_commit": "abc123", "git_describe": describe}},
        "summary": [
            {"model": "m", "test": "tg128", "engines": {
                "pyramid": {"mean_ts": 90.0, "sd_ts": 2.0, "n": 3},
                "llama-q8_0": {"mean_ts": 60.0, "sd_ts": 1.0, "n": 3},
                "ov-genai": {"mean_ts": null, "sd_ts": null, "n": 0, "error": "cannot load the model"}
            }, "ratios": {}},
            {"model": "broken", "test": "-", "engines": {}, "ratios": {}}
        ]
    })
    .to_string()
}

#[test]
fn side_by_side_runs_are_admitted_only_from_this_machine_and_a_committed_tree() {
    use pyramid_bench::peers::{comparisons, PeersError};
    let here = Machine::detect("avx2");
    let peers = comparisons(&peers_run(&here.cpu, here.cores, "abc123"), &here).unwrap();
    assert_eq!(peers.len(), 1, "the all-failed model has no test to report");
    assert_eq!(peers[0].ratio("llama-q8_0"), Some(1.5));
    assert_eq!(peers[0].ratio("ov-genai"), None);
    assert_eq!(peers[0].provenance.as_ref().unwrap().commit, "abc123");

    let mut file = ResultsFile::default();
    file.merge_peers(peers.clone());
    file.merge_peers(peers);
    assert_eq!(
        file.peers.len(),
        1,
        "the same test measured again replaces it"
    );
    let md = report::markdown(&file, None);
    assert!(
        md.contains(
            "| m | tg128 | 2 | 90.0 ± 2.0 (int8) | 60.0 ± 1.0 | — | failed | 1.50× | — | — |"
        ),
        "{md}"
    );
    assert!(
        md.contains("- m tg128 ov-genai: cannot load the model"),
        "{md}"
    );
    assert!(report::charts(&file)
        .iter()
        .any(|c| c.name == "peers" && c.svg.contains("1.50×")));
    assert!(check(&serde_json::to_string(&file).unwrap(), None).is_empty());

    assert!(matches!(
        comparisons(&peers_run(&here.cpu, here.cores, "abc123-dirty"), &here),
        Err(PeersError::Uncommitted(_))
    ));
    assert!(matches!(
        comparisons(&peers_run("Snapdragon X Elite", 12, "abc123"), &here),
        Err(PeersError::OtherMachine { .. })
    ));
    assert!(matches!(
        comparisons("{}", &here),
        Err(PeersError::Parse(_))
    ));
}

#[test]
fn synthetic_cells_form_the_scaling_table_never_a_quality_group() {
    let mut small = cell(1024, "cpu", None, true);
    small.key.model = "synthetic:qwen2.5-0.5b".into();
    small.synthetic = true;
    small.parameters = Some(494_000_000);
    let mut large = small.clone();
    large.key.model = "synthetic:qwen2.5-3b".into();
    large.parameters = Some(3_090_000_000);
    let mut file = ResultsFile::default();
    file.merge(vec![large, small, cell(1024, "cpu", Some(true), true)]);
    let md = report::markdown(&file, None);
    let scaling = &md[md
        .find("## Scaling with model size")
        .expect("a scaling section")..];
    let (a, b) = (
        scaling.find("| qwen2.5-0.5b | 0.49 B |").unwrap(),
        scaling.find("| qwen2.5-3b | 3.09 B |").unwrap(),
    );
    assert!(a < b, "smallest first: {scaling}");
    assert!(!md.contains("## synthetic:"), "{md}");
    assert!(report::readme_section(&file).contains("**Scaling with model size**"));
    // One decode chart, for the real model only.
    assert_eq!(report::charts(&file).len(), 1);
}
