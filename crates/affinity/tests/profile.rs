//! A profile on a tiny random-weight model with native targets: every level is measured,
//! the f32 target agrees with the reference everywhere, and a target whose block computes
//! something else is kept out of the figures wherever that block enters.

use std::sync::Arc;

use pyramid_affinity::profile::Executor;
use pyramid_affinity::report::AffinityReport;
use pyramid_affinity::timing::{FitPlan, WallClock};
use pyramid_affinity::{measure, Level, Plan, Stage, Target};
use pyramid_bench::results::{Machine, Provenance};
use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, Ffn, GatedFfn, Linear, Model};

fn tiny() -> Model {
    let bytes = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Qwen2))
        .unwrap()
        .to_bytes();
    Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
}

#[test]
fn every_level_is_measured_and_a_wrong_block_is_kept_out() {
    let pool = ThreadPool::new(2).unwrap();
    let reference = Arc::new(tiny());
    let mut broken = tiny();
    match &mut broken.weights.layers[1].ffn {
        Ffn::Dense(GatedFfn {
            down: Linear::F32(m),
            ..
        }) => m.data.fill(0.0),
        _ => unreachable!("the tiny model is dense and loads in f32"),
    }
    let broken = Arc::new(broken);
    let targets = [
        Target {
            device: "cpu".into(),
            precision: "f32".into(),
            executor: Executor::Native {
                model: &reference,
                pool: &pool,
            },
        },
        Target {
            device: "broken".into(),
            precision: "f32".into(),
            executor: Executor::Native {
                model: &broken,
                pool: &pool,
            },
        },
    ];
    let plan = Plan {
        seq: 16,
        window: 32,
        n_gen: 4,
        layer: 1,
        stages: vec![Stage::Prefill, Stage::Decode],
        fit: FitPlan {
            k: 2,
            trials: 2,
            min_batch: 0.001,
        },
    };
    let mut heard = Vec::new();
    let cells = measure(
        &plan,
        &reference,
        &pool,
        &targets,
        &mut WallClock::default(),
        &mut |what| heard.push(what.to_string()),
    )
    .unwrap();
    assert!(!heard.is_empty());
    let of = |device: &str, level: Level, unit: &str, stage: Stage| {
        cells
            .iter()
            .find(|c| c.device == device && c.level == level && c.unit == unit && c.stage == stage)
            .unwrap_or_else(|| panic!("{device} {level:?} {unit} {stage:?}"))
    };
    for stage in [Stage::Prefill, Stage::Decode] {
        for (level, unit) in [
            (Level::Operator, "attention"),
            (Level::Operator, "ffn"),
            (Level::Isolated, "attention core"),
            (Level::Isolated, "wq"),
            (Level::Isolated, "down"),
            (Level::Block, "block"),
            (Level::Block, "block without attention"),
            (Level::Block, "block without ffn"),
            (Level::Stage, "stage"),
        ] {
            let c = of("cpu", level, unit, stage);
            assert!(c.is_valid(), "{c:?}");
            assert!(c.seconds.is_finite() && c.spread.is_finite(), "{c:?}");
            // No assertion on the figures themselves: a shared machine's noise can make
            // even a fit's sign wrong for microsecond calls.
            if level != Level::Operator {
                let a = c.agreement.expect("checked against the reference");
                assert_eq!(a.max_abs_diff, 0.0, "the reference's own kernels: {c:?}");
            }
            assert!(c.executed_on.starts_with("cpu"), "{c:?}");
        }
        // The broken FFN: every cell it enters is invalid, the others are not.
        for unit in ["block", "block without attention"] {
            assert!(!of("broken", Level::Block, unit, stage).is_valid());
        }
        assert!(of("broken", Level::Block, "block without ffn", stage).is_valid());
        assert!(of("broken", Level::Isolated, "attention core", stage).is_valid());
        assert!(!of("broken", Level::Operator, "ffn", stage).is_valid());
        assert!(!of("broken", Level::Operator, "attention", stage).is_valid());
        assert!(!of("broken", Level::Isolated, "down", stage).is_valid());
        assert!(!of("broken", Level::Stage, "stage", stage).is_valid());
    }
    let model = of("cpu", Level::Model, "prompt 16 + 4 tokens", Stage::EndToEnd);
    assert_eq!(model.tokens_matching, Some(4));
    assert!(model.is_valid());

    let provenance = Provenance {
        machine: Machine::detect("test"),
        commit: "test".into(),
        command: "test".into(),
        date: "2026-12-03T00:00:00Z".into(),
    };
    let targets = vec![
        ("cpu".into(), "f32".into()),
        ("broken".into(), "f32".into()),
    ];
    let n_layer = reference.config.n_layer;
    let report = AffinityReport::new(provenance, "tiny".into(), n_layer, plan, targets, cells);
    assert!(report.cells.iter().all(|c| c.is_valid()));
    assert!(report.invalid.iter().all(|c| !c.is_valid()) && !report.invalid.is_empty());
    let md = report.markdown();
    for level in Level::ALL {
        assert!(md.contains(level.title()), "{md}");
    }
    assert!(md.contains("Invalid cells") && md.contains("broken"));
    // An invalid cell gives no figure and no ratio.
    let stage_row = md
        .lines()
        .find(|l| l.starts_with("| prefill | stage |"))
        .unwrap();
    assert!(
        stage_row.contains("invalid") && stage_row.ends_with("– |"),
        "{stage_row}"
    );
    let svg = report.chart();
    assert!(svg.starts_with("<svg") && svg.contains("parity"));
}
