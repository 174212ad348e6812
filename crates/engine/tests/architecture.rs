//! The engine's modules import one another in one direction: the scheduler, the
//! executor and the session writer never reach back into the engine that composes them.
//! Checked on the sources: every `crate::module` a module's non-test code names is an
//! edge, and the graph of top-level modules has no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Top-level module → the top-level modules its non-test code names.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(src, f))
        .filter(|m| m != "lib")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = top_module(src, file);
        if module == "lib" || file.ends_with("tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        // Unit tests may reach anywhere; the code they test may not.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (i, _) in code.match_indices("crate::") {
            let name: String = code[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if name != module && modules.contains(&name) {
                graph.entry(module.clone()).or_default().insert(name);
            }
        }
    }
    graph
}

fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// A cycle through `node`, if the graph has one reachable from it.
fn cycle_from(
    graph: &BTreeMap<String, BTreeSet<String>>,
    node: &str,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(at) = path.iter().position(|p| p == node) {
        let mut cycle = path[at..].to_vec();
        cycle.push(node.to_string());
        return Some(cycle);
    }
    if done.contains(node) {
        return None;
    }
    path.push(node.to_string());
    for next in graph.get(node).into_iter().flatten() {
        if let Some(cycle) = cycle_from(graph, next, path, done) {
            return Some(cycle);
        }
    }
    path.pop();
    done.insert(node.to_string());
    None
}

#[test]
fn no_module_of_the_engine_imports_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = imports(&src);
    assert!(
        graph.contains_key("engine"),
        "the scan found the engine's imports"
    );
    assert!(graph["engine"].contains("scheduler"));
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        let cycle = cycle_from(&graph, module, &mut Vec::new(), &mut done);
        assert!(
            cycle.is_none(),
            "an import circle: {}",
            cycle.unwrap().join(" -> ")
        );
    }
    // The parts the engine composes never name it.
    for part in ["scheduler", "executor", "persist", "sequence", "step"] {
        let names = graph.get(part).cloned().unwrap_or_default();
        assert!(
            !names.contains("engine"),
            "{part} imports the engine: {names:?}"
        );
    }
    assert!(!graph["scheduler"].contains("executor"));
    assert!(!graph
        .get("executor")
        .is_some_and(|e| e.contains("scheduler")));
}
