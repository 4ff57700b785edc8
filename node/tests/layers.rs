//! The node crate's modules depend on each other in one direction only: this reads every
//! source file, collects the `crate::<module>` paths each top-level module uses (comments
//! aside), and fails on any cycle, naming it.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module of a file under `src/` (`pipeline/hop.rs` → `pipeline`).
fn module_of(relative: &Path) -> String {
    let first = relative.components().next().unwrap();
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `crate::<name>` references in code (not comments).
fn references(source: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in source.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices("crate::") {
            let name: String = line[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn node_modules_have_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    files(&src, &mut paths);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &paths {
        let module = module_of(path.strip_prefix(&src).unwrap());
        if module == "lib" || module == "main" {
            continue;
        }
        let uses = references(&std::fs::read_to_string(path).unwrap());
        edges
            .entry(module.clone())
            .or_default()
            .extend(uses.into_iter().filter(|m| *m != module));
    }
    assert!(edges.len() > 5, "read the modules: {edges:?}");
    for start in edges.keys() {
        // Depth-first search for a path back to `start`.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, path)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    panic!("import cycle: {} -> {start}", path.join(" -> "));
                }
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
}
