//! The node crate's modules depend on each other in one direction only: this reads every
//! source file, collects the `crate::<module>` paths each top-level module uses (comments
//! aside), and fails on any cycle, naming it; and it checks the layers `src/lib.rs`
//! documents: a module uses only modules of lower layers, and services reach each other
//! only through `handles`, never by importing one another.

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

/// The layer of the services.
const SERVICES: usize = 3;

/// The layers of `src/lib.rs`, lowest first, and each module's group: modules of one
/// service (the observe service's `status` and `http`) share a group.
const LAYERS: &[(&str, usize, &str)] = &[
    ("messages", 1, "messages"),
    ("topics", 1, "topics"),
    ("metrics", 1, "metrics"),
    ("rpc", 1, "rpc"),
    ("schedule", 1, "schedule"),
    ("handles", 1, "handles"),
    ("rules", 2, "rules"),
    ("chain", 3, "chain"),
    ("lifecycle", 2, "lifecycle"),
    ("confirmation", 2, "confirmation"),
    ("orchestration", 3, "consensus"),
    ("pipeline", 3, "miner"),
    ("merge", 3, "merge"),
    ("validator", 3, "validator"),
    ("status", 3, "observe"),
    ("http", 3, "observe"),
    ("router", 4, "router"),
    ("node", 5, "node"),
    ("cli", 5, "cli"),
    ("identity", 5, "identity"),
    ("launcher", 5, "launcher"),
    ("swarm", 5, "swarm"),
    ("fuzzing", 5, "fuzzing"),
    ("export", 5, "export"),
];

#[test]
fn modules_use_only_lower_layers_and_services_meet_through_handles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    files(&src, &mut paths);
    let layer = |m: &str| LAYERS.iter().find(|(name, _, _)| *name == m).copied();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for path in &paths {
        let module = module_of(path.strip_prefix(&src).unwrap());
        if module == "lib" || module == "main" {
            continue;
        }
        let Some((_, level, group)) = layer(&module) else {
            panic!("module `{module}` has no layer here: add it to LAYERS and to src/lib.rs");
        };
        for used in references(&std::fs::read_to_string(path).unwrap()) {
            if used == module {
                continue;
            }
            let Some((_, used_level, used_group)) = layer(&used) else {
                panic!("`{module}` uses `{used}`, which has no layer here");
            };
            checked += 1;
            // Upwards never; sideways only below and above the services, or inside one
            // service's modules.
            let sideways_between_services =
                used_level == level && level == SERVICES && used_group != group;
            if used_level > level || sideways_between_services {
                wrong.push(format!(
                    "{} ({module}, layer {level}) uses {used} (layer {used_level})",
                    path.display()
                ));
            }
        }
    }
    assert!(checked > 20, "read the modules' uses: {checked}");
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}
