//! The committed results file and README obey the quarantine: every verified cell has its
//! provenance, nothing unverified is quoted, and the README's performance section is
//! exactly what `pyramid bench report` renders.

use std::path::PathBuf;

use pyramid_bench::report;
use pyramid_bench::results::{check, ResultsFile};

#[test]
fn committed_results_and_readme_pass_bench_check() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let results = std::fs::read_to_string(root.join("benchmarks/latest.json"))
        .expect("benchmarks/latest.json");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let file: ResultsFile = serde_json::from_str(&results).expect("a results file");
    assert!(
        !file.verified.is_empty(),
        "the README's figures come from verified cells"
    );
    let section = report::readme_section(&file);
    assert_eq!(
        check(&results, Some((&readme, &section))),
        Vec::<String>::new()
    );
}
