//! The node crate's modules depend on each other in one direction only, and each service is
//! reached only through its `api`. This reads every source file, collects the `crate::…`
//! paths each module uses (comments aside), and checks:
//!
//! 1. **No import cycle** between the crate's units (a top-level module, or one service under
//!    `services/`).
//! 2. **Layers**: a unit uses only units of its own layer or lower ones (the layers
//!    `src/lib.rs` documents: formats and bridges, then the pure rules, then the services,
//!    then the router, then the application and the tools).
//! 3. **A service is reached only through its `api`**: outside `services/<name>/`, every path
//!    into that service is `crate::services::<name>::api::…` (what it lets others use: its
//!    handle, messages, views, typed reasons and validation rules). Its state, task and
//!    internals are its own.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The unit a file under `src/` belongs to: its top-level module, or `services::<name>`.
fn unit_of(relative: &Path) -> String {
    let parts: Vec<String> = relative
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    match parts.as_slice() {
        [first, second, ..] if first == "services" => format!("services::{second}"),
        [first, ..] => first.clone(),
        [] => unreachable!("a file has a name"),
    }
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `crate::a::b::…` path in code (not comments), as its lower-case module segments.
fn references(source: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in source.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices("crate::") {
            let rest = &line[at + 7..];
            let mut segments = Vec::new();
            for segment in rest.split("::") {
                let name: String = segment
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let whole = name.len() == segment.len();
                if !name.is_empty() {
                    segments.push(name);
                }
                if !whole {
                    break;
                }
            }
            if !segments.is_empty() {
                out.push(segments);
            }
        }
    }
    out
}

/// The unit a path leads into.
fn unit_used(path: &[String]) -> String {
    match path {
        [first, second, ..] if first == "services" => format!("services::{second}"),
        [first, ..] => first.clone(),
        [] => unreachable!("paths are not empty"),
    }
}

/// What every source file uses: (file, its unit, the paths it names).
fn sources() -> Vec<(PathBuf, String, Vec<Vec<String>>)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    files(&src, &mut paths);
    let mut out = Vec::new();
    for path in paths {
        let relative = path.strip_prefix(&src).unwrap().to_path_buf();
        let unit = unit_of(&relative);
        // The crate root and `services.rs` only declare modules.
        if unit == "lib" || unit == "main" || unit == "services" {
            continue;
        }
        let uses = references(&std::fs::read_to_string(&path).unwrap());
        out.push((relative, unit, uses));
    }
    out
}

#[test]
fn node_modules_have_no_import_cycle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (_, unit, uses) in sources() {
        let targets: BTreeSet<String> = uses.iter().map(|p| unit_used(p)).collect();
        edges
            .entry(unit.clone())
            .or_default()
            .extend(targets.into_iter().filter(|m| *m != unit));
    }
    assert!(edges.len() > 10, "read the modules: {edges:?}");
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

/// The layers of `src/lib.rs`, lowest first.
const LAYERS: &[(&str, usize)] = &[
    ("wire", 1),
    ("metrics", 1),
    ("schedule", 1),
    ("run_spec", 1),
    ("fsio", 1),
    ("services::inbox", 1),
    ("rules", 2),
    ("join", 2),
    ("services::consensus", 3),
    ("services::miner", 3),
    ("services::merge", 3),
    ("services::validator", 3),
    ("services::chain", 3),
    ("services::observe", 3),
    ("services::data", 3),
    // A test of two services together, through their `api`s.
    ("services::spot_check_tests", 3),
    ("router", 4),
    ("app", 5),
    ("cli", 5),
    ("tools", 5),
];

#[test]
fn units_use_only_lower_layers_and_reach_a_service_only_through_its_api() {
    let layer = |unit: &str| {
        LAYERS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, l)| *l)
    };
    let mut checked = 0;
    let mut wrong = Vec::new();
    for (file, unit, uses) in sources() {
        let Some(level) = layer(&unit) else {
            panic!(
                "unit `{unit}` ({}) has no layer here: add it to LAYERS and to src/lib.rs",
                file.display()
            );
        };
        for path in uses {
            let used = unit_used(&path);
            if used == unit {
                continue;
            }
            if used == "services" {
                wrong.push(format!(
                    "{} ({unit}) names `crate::services` without a service: name the service's api",
                    file.display()
                ));
                continue;
            }
            let Some(used_level) = layer(&used) else {
                panic!("{} uses `{used}`, which has no layer here", file.display());
            };
            checked += 1;
            if used_level > level {
                wrong.push(format!(
                    "{} ({unit}, layer {level}) uses {used} (layer {used_level})",
                    file.display()
                ));
            }
            let into_service =
                path.first().is_some_and(|s| s == "services") && used != "services::inbox";
            if into_service && path.get(2).is_none_or(|s| s != "api") {
                wrong.push(format!(
                    "{} ({unit}) reaches into {} past its api",
                    file.display(),
                    path.join("::")
                ));
            }
        }
    }
    assert!(checked > 50, "read the modules' uses: {checked}");
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}
