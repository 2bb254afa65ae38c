//! The crate's layering, read from its own source: every `crate::…` and `super::…` path in
//! `src/` (test code aside) is an import from one file to another. The test fails on a cycle
//! between files or between top-level modules, and on an import against the order the crate
//! docs give (`src/lib.rs`, "Layers"; `src/dialect/mod.rs`, "The floor"), so that a later change
//! cannot quietly undo it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use regex::Regex;

/// Each top-level module's layer: a module may import only from lower layers (and itself).
const LAYERS: &[(&str, u8)] = &[
    ("tokenizer", 0),
    ("identity", 0),
    ("store", 0),
    ("config", 0),
    ("metrics", 0),
    ("log_writer", 0),
    ("dialect", 1),
    ("telemetry", 1),
    ("measure", 2),
    ("compaction", 3),
    ("upstream", 4),
    ("http", 5),
    ("server", 6),
    ("workers", 7),
    ("cli", 8),
];

/// The files of the seam inside `src/dialect/`: they import no dialect folder.
const SEAM: &[&str] = &[
    "dialect/mod.rs",
    "dialect/vocabulary.rs",
    "dialect/edits.rs",
    "dialect/splice.rs",
    "dialect/text.rs",
    "dialect/media.rs",
    "dialect/media_parts.rs",
    "dialect/overflow.rs",
];

/// The one file that names every dialect.
const REGISTRY: &str = "dialect/registry.rs";

/// `src/`-relative path → source, test code left out.
fn sources(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let relative = path
                .strip_prefix(src)
                .expect("under src/")
                .to_string_lossy()
                .replace('\\', "/");
            if relative.ends_with("tests.rs") || relative.contains("/tests/") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            out.insert(relative, without_tests_and_comments(&text));
        }
    }
    out
}

/// The source up to its `#[cfg(test)] mod …` block, without `//` comments (doc links are not
/// imports).
fn without_tests_and_comments(text: &str) -> String {
    let tests = Regex::new(r"#\[cfg\(test\)\]\s*\n\s*(pub\s+)?mod\s+\w+\s*[{;]").unwrap();
    let code = match tests.find(text) {
        Some(m) => &text[..m.start()],
        None => text,
    };
    let comment = Regex::new(r"//[^\n]*").unwrap();
    comment.replace_all(code, "").into_owned()
}

/// A file's module path (`dialect/chat/mod.rs` → `[dialect, chat]`).
fn module_of(path: &str) -> Vec<String> {
    let mut parts: Vec<String> = path
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The import graph: file → files it imports.
fn imports(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeMap<Vec<String>, String> =
        files.keys().map(|p| (module_of(p), p.clone())).collect();
    let resolve = |segments: &[String]| -> Option<String> {
        (1..=segments.len())
            .rev()
            .find_map(|k| modules.get(&segments[..k]).cloned())
    };
    let path = Regex::new(r"\b(crate|super)((?:::\w+)+)").unwrap();
    let group = Regex::new(r"\b(crate|super)((?:::\w+)*)::\{([^}]*)\}").unwrap();
    let mut graph = BTreeMap::new();
    for (file, text) in files {
        let me = module_of(file);
        let base = |root: &str| -> Vec<String> {
            if root == "crate" {
                vec![]
            } else {
                // `super` of `a/b.rs` (module a::b) and of `a/b/mod.rs` (also a::b) is `a`.
                me[..me.len().saturating_sub(1)].to_vec()
            }
        };
        let mut here = BTreeSet::new();
        for m in path.captures_iter(text) {
            let mut full = base(&m[1]);
            full.extend(
                m[2].trim_start_matches("::")
                    .split("::")
                    .map(str::to_string),
            );
            here.extend(resolve(&full));
        }
        for m in group.captures_iter(text) {
            let mut prefix = base(&m[1]);
            prefix.extend(
                m[2].trim_start_matches("::")
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            );
            for item in m[3].split(',') {
                let name = item.trim().split("::").next().unwrap_or("").trim();
                let name = name.split_whitespace().next().unwrap_or("");
                if name.is_empty() || name == "self" {
                    continue;
                }
                let mut full = prefix.clone();
                full.push(name.to_string());
                here.extend(resolve(&full));
            }
        }
        here.remove(file);
        graph.insert(file.clone(), here);
    }
    graph
}

/// A cycle in `graph`, if there is one, as the nodes along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

fn top(file: &str) -> String {
    module_of(file)
        .first()
        .cloned()
        .unwrap_or_else(|| "(root)".into())
}

/// The dialect folder a file belongs to (`dialect/chat/request.rs` → `chat`), if any.
fn dialect_folder(file: &str) -> Option<&str> {
    let rest = file.strip_prefix("dialect/")?;
    let (folder, _) = rest.split_once('/')?;
    Some(folder)
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    imports(&sources(&src))
}

#[test]
fn no_file_imports_itself_round_a_cycle() {
    let graph = graph();
    assert!(graph.len() > 40, "src/ read: {} files", graph.len());
    assert_eq!(find_cycle(&graph), None, "a cycle between files of src/");
}

#[test]
fn no_top_level_module_imports_round_a_cycle() {
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, imported) in graph() {
        let from = top(&file);
        modules.entry(from.clone()).or_default();
        for to in imported.iter().map(|f| top(f)) {
            if to != from && from != "(root)" {
                modules.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    assert_eq!(
        find_cycle(&modules),
        None,
        "a cycle between modules of src/"
    );
}

#[test]
fn each_module_imports_only_from_the_layers_beneath_it() {
    let layer: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut wrong = Vec::new();
    for (file, imported) in graph() {
        let from = top(&file);
        if from == "(root)" {
            continue;
        }
        let Some(&from_layer) = layer.get(from.as_str()) else {
            wrong.push(format!("{file}: module `{from}` has no layer in this test"));
            continue;
        };
        for to_file in imported {
            let to = top(&to_file);
            if to == from {
                continue;
            }
            match layer.get(to.as_str()) {
                Some(&to_layer) if to_layer < from_layer => {}
                _ => wrong.push(format!("{file} imports {to_file}")),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_seam_and_the_core_import_no_dialect_and_no_dialect_another() {
    let mut wrong = Vec::new();
    for (file, imported) in graph() {
        let mine = dialect_folder(&file);
        for to_file in &imported {
            let Some(theirs) = dialect_folder(to_file) else {
                continue;
            };
            // Only the registry and the application's edges (routes, wiring, subcommands) name
            // a dialect.
            let edge = matches!(top(&file).as_str(), "http" | "server" | "cli");
            let allowed = file == REGISTRY || mine == Some(theirs) || edge;
            if !allowed {
                wrong.push(format!("{file} imports the dialect `{theirs}` ({to_file})"));
            }
        }
        if SEAM.contains(&file.as_str()) {
            for to_file in &imported {
                let inside_seam = SEAM.contains(&to_file.as_str());
                let beneath = matches!(top(to_file).as_str(), "tokenizer" | "identity" | "store");
                if !inside_seam && !beneath {
                    wrong.push(format!("the seam's {file} imports {to_file}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports across the seam:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checks_catch_what_they_are_for() {
    // A small crate with a cycle through `super`, an upward import and a seam importing a
    // dialect: each rule must see its own fault.
    let files: BTreeMap<String, String> = [
        ("dialect/mod.rs", "use crate::dialect::chat::Chat;"),
        (
            "dialect/chat/mod.rs",
            "use super::Role; use crate::compaction::Engine;",
        ),
        (
            "compaction/mod.rs",
            "use crate::dialect::{chat::Chat, Role};",
        ),
    ]
    .into_iter()
    .map(|(p, t)| (p.to_string(), without_tests_and_comments(t)))
    .collect();
    let graph = imports(&files);
    assert!(graph["dialect/chat/mod.rs"].contains("dialect/mod.rs"));
    assert!(graph["dialect/chat/mod.rs"].contains("compaction/mod.rs"));
    assert!(graph["compaction/mod.rs"].contains("dialect/chat/mod.rs"));
    assert!(find_cycle(&graph).is_some());
    let acyclic: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), BTreeSet::new()),
    ]
    .into();
    assert_eq!(find_cycle(&acyclic), None);
    assert_eq!(
        without_tests_and_comments(
            "use crate::a; // crate::b\n#[cfg(test)]\nmod tests {\n use crate::c;\n}"
        ),
        "use crate::a; \n"
    );
}
