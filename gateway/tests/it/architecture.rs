//! The rules of ARCHITECTURE.md that a machine can check, checked on the workspace's source:
//! no import cycles between the modules (files) of a crate, HTTP only in the gateway's HTTP
//! layer, sandbox and run states changed only by their lifecycle modules, internal API paths
//! written only in the api crate, and no source file over 700 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const CRATES: &[&str] = &[
    "agent", "api", "billing", "cli", "egress", "gateway", "harness", "mcp", "vault", "worker",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
}

/// A crate's source files by module path (`["sandboxes", "lifecycle"]`).
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap().with_extension("");
        let mut path: Vec<String> = relative
            .iter()
            .map(|part| part.to_string_lossy().into_owned())
            .collect();
        if matches!(
            path.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            path.pop();
        }
        // Binaries of their own (src/bin/…) are crates of their own.
        if path.first().is_some_and(|first| first == "bin") {
            continue;
        }
        modules.insert(path, file);
    }
    modules
}

/// The code of a file that counts: up to its test module, without `mod` declarations and
/// re-exports (a parent declaring its children is not a use of them) and comments.
fn code_lines(text: &str) -> Vec<&str> {
    // A re-export may span lines (`pub use a::{\n b,\n c,\n};`): all of it is skipped.
    let mut in_reexport = false;
    text.lines()
        .take_while(|line| !line.trim_start().starts_with("#[cfg(test)]"))
        .filter(|line| {
            let line = line.trim_start();
            if in_reexport {
                in_reexport = !line.contains(';');
                return false;
            }
            if line.starts_with("pub use ") || line.starts_with("pub(crate) use ") {
                in_reexport = !line.contains(';');
                return false;
            }
            !(line.starts_with("//")
                || line.starts_with("mod ")
                || line.starts_with("pub mod ")
                || line.starts_with("pub(crate) mod "))
        })
        .collect()
}

/// The module paths a file refers to: `crate::a::b`, `super::a`, and `child::…` for the
/// modules it declares.
fn references(module: &[String], text: &str) -> Vec<Vec<String>> {
    let children: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("mod "))?;
            rest.strip_suffix(';').map(str::to_owned)
        })
        .collect();
    let mut found = Vec::new();
    for line in code_lines(text) {
        let bytes = line.as_bytes();
        let mut start = 0;
        while start < line.len() {
            // The next identifier that starts a path.
            let Some(offset) = line[start..].find(|c: char| c.is_ascii_alphabetic() || c == '_')
            else {
                break;
            };
            let begin = start + offset;
            if begin > 0
                && (bytes[begin - 1].is_ascii_alphanumeric()
                    || bytes[begin - 1] == b'_'
                    || bytes[begin - 1] == b':')
            {
                start = begin + 1;
                continue;
            }
            let end = line[begin..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(line.len(), |length| begin + length);
            let segments: Vec<&str> = line[begin..end]
                .split("::")
                .filter(|s| !s.is_empty())
                .collect();
            start = end.max(begin + 1);
            if segments.len() < 2 {
                continue;
            }
            let resolved: Vec<String> = match segments[0] {
                "crate" => segments[1..].iter().map(|s| (*s).to_owned()).collect(),
                "super" => {
                    let mut base = module.to_vec();
                    let mut rest = &segments[..];
                    while rest.first() == Some(&"super") {
                        base.pop();
                        rest = &rest[1..];
                    }
                    base.extend(rest.iter().map(|s| (*s).to_owned()));
                    base
                }
                first if children.iter().any(|child| child == first) => {
                    let mut base = module.to_vec();
                    base.extend(segments.iter().map(|s| (*s).to_owned()));
                    base
                }
                _ => continue,
            };
            found.push(resolved);
        }
    }
    found
}

/// The longest prefix of `path` that is a module of the crate; an item of the crate root
/// (`crate::Cli`) resolves to the root itself (the empty path), so loops through `main.rs` or
/// `lib.rs` count too.
fn resolve(path: &[String], modules: &BTreeMap<Vec<String>, PathBuf>) -> Option<Vec<String>> {
    (0..=path.len())
        .rev()
        .map(|length| path[..length].to_vec())
        .find(|prefix| modules.contains_key(prefix))
}

/// Every cycle's modules (strongly connected components of more than one module).
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    // Kosaraju: order by finish time, then components on the reversed graph.
    fn visit(
        node: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        seen: &mut BTreeSet<Vec<String>>,
        order: &mut Vec<Vec<String>>,
    ) {
        if !seen.insert(node.clone()) {
            return;
        }
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, seen, order);
        }
        order.push(node.clone());
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for node in graph.keys() {
        visit(node, graph, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (from, targets) in graph {
        for to in targets {
            reversed.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut found = Vec::new();
    for node in order.iter().rev() {
        let mut component = Vec::new();
        let mut stack = vec![node.clone()];
        while let Some(current) = stack.pop() {
            if !assigned.insert(current.clone()) {
                continue;
            }
            component.push(current.join("::"));
            stack.extend(reversed.get(&current).into_iter().flatten().cloned());
        }
        if component.len() > 1 {
            component.sort();
            found.push(component);
        }
    }
    found
}

#[test]
fn no_module_of_a_crate_imports_another_that_imports_it_back() {
    let mut all = Vec::new();
    for name in CRATES {
        let src = workspace().join(name).join("src");
        let modules = modules(&src);
        let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (module, file) in &modules {
            let text = std::fs::read_to_string(file).unwrap();
            let targets = graph.entry(module.clone()).or_default();
            for reference in references(module, &text) {
                if let Some(target) = resolve(&reference, &modules)
                    && &target != module
                {
                    targets.insert(target);
                }
            }
        }
        for cycle in cycles(&graph) {
            all.push(format!("{name}: {}", cycle.join(" ↔ ")));
        }
    }
    assert!(all.is_empty(), "import cycles:\n{}", all.join("\n"));
}

#[test]
fn the_checker_finds_a_cycle_and_a_clean_tree() {
    let module = |path: &str| -> Vec<String> {
        path.split("::")
            .map(str::to_owned)
            .filter(|s| !s.is_empty())
            .collect()
    };
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    graph.insert(module("a"), [module("b")].into());
    graph.insert(module("b"), [module("c")].into());
    graph.insert(module("c"), [module("a")].into());
    graph.insert(module("d"), [module("a")].into());
    assert_eq!(cycles(&graph), vec![vec!["a", "b", "c"]]);
    graph.insert(module("c"), BTreeSet::new());
    assert!(cycles(&graph).is_empty());
    let found = references(
        &module("sandboxes::placement"),
        "use super::row::Owner;\nuse crate::state::AppState;\n// crate::not::this\n",
    );
    assert_eq!(
        found,
        vec![module("sandboxes::row::Owner"), module("state::AppState")]
    );
}

#[test]
fn an_item_of_the_crate_root_resolves_to_the_root_and_a_reexport_is_not_a_use() {
    let modules: BTreeMap<Vec<String>, PathBuf> = [
        (Vec::new(), PathBuf::from("main.rs")),
        (vec!["args".to_owned()], PathBuf::from("args.rs")),
    ]
    .into();
    assert_eq!(resolve(&["Cli".to_owned()], &modules), Some(Vec::new()));
    assert_eq!(
        resolve(&["args".to_owned(), "GlobalArgs".to_owned()], &modules),
        Some(vec!["args".to_owned()])
    );
    let facade = "mod startup;\npub use startup::{\n    Application,\n    migrate,\n};\n";
    assert!(references(&[], facade).is_empty());
    assert_eq!(
        references(&["serve".to_owned()], "use crate::Cli;\n"),
        vec![vec!["Cli".to_owned()]]
    );
}

/// `(path relative to the workspace, text)` of every source file of `crate_name`.
fn sources(crate_name: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&workspace().join(crate_name).join("src"), &mut files);
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).unwrap();
            let relative = file
                .strip_prefix(workspace())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (relative, text)
        })
        .collect()
}

#[test]
fn only_the_gateways_http_layer_knows_axum() {
    let offenders: Vec<String> = sources("gateway")
        .into_iter()
        .filter(|(path, text)| {
            !path.starts_with("gateway/src/http/")
                && path != "gateway/src/startup.rs"
                && code_lines(text)
                    .iter()
                    .any(|line| line.contains("axum") || line.contains("hyper"))
        })
        .map(|(path, _)| path)
        .collect();
    assert!(
        offenders.is_empty(),
        "axum or hyper outside gateway/src/http: {offenders:?}"
    );
}

#[test]
fn sandbox_and_run_states_change_only_in_their_lifecycle_modules() {
    let written_states = ["state = '", "state <> '", "SET state", "stop_reason = '"];
    let offenders: Vec<String> = sources("gateway")
        .into_iter()
        .filter(|(path, text)| {
            !path.ends_with("sandboxes/lifecycle.rs")
                && !path.ends_with("runs/lifecycle.rs")
                && written_states.iter().any(|literal| text.contains(literal))
        })
        .map(|(path, _)| path)
        .collect();
    assert!(
        offenders.is_empty(),
        "states written outside a lifecycle module: {offenders:?}"
    );
}

#[test]
fn agent_run_statuses_change_only_in_the_harness_lifecycle_module() {
    let written = ["SET status", "status = '", "status = CASE"];
    let offenders: Vec<String> = sources("gateway")
        .into_iter()
        .filter(|(path, text)| {
            path.starts_with("gateway/src/harness/")
                && !path.ends_with("harness/lifecycle.rs")
                && written.iter().any(|literal| text.contains(literal))
        })
        .map(|(path, _)| path)
        .collect();
    assert!(
        offenders.is_empty(),
        "agent run statuses written outside harness/lifecycle.rs: {offenders:?}"
    );
    // The lifecycle module is where they are written.
    let lifecycle =
        std::fs::read_to_string(workspace().join("gateway/src/harness/lifecycle.rs")).unwrap();
    assert!(lifecycle.contains("SET status") && lifecycle.contains("pub enum Status"));
}

#[test]
fn internal_api_paths_are_written_only_in_the_api_crate() {
    let offenders: Vec<String> = CRATES
        .iter()
        .flat_map(|name| sources(name))
        .filter(|(path, text)| path != "api/src/internal.rs" && text.contains("/internal/v1"))
        .map(|(path, _)| path)
        .collect();
    assert!(
        offenders.is_empty(),
        "internal paths formatted outside api/src/internal.rs: {offenders:?}"
    );
    // In the gateway, only the worker client (with its port connections) and the router of the
    // internal routes use them.
    let mut users: Vec<String> = sources("gateway")
        .into_iter()
        .filter(|(_, text)| text.contains("paths::"))
        .map(|(path, _)| path)
        .collect();
    users.sort();
    assert_eq!(
        users,
        [
            "gateway/src/http/internal/mod.rs",
            "gateway/src/workers/client.rs",
            "gateway/src/workers/ports.rs"
        ]
        .map(str::to_owned),
        "internal paths used outside the worker client and the internal router"
    );
}
/// A source file cut into its functions (each from its `fn` line to the next one's).
fn functions(text: &str) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for line in code_lines(text) {
        let trimmed = line.trim_start();
        let starts = [
            "fn ",
            "async fn ",
            "pub fn ",
            "pub async fn ",
            "pub(crate) async fn ",
        ]
        .iter()
        .any(|prefix| trimmed.starts_with(prefix));
        if starts || found.is_empty() {
            found.push(String::new());
        }
        if let Some(function) = found.last_mut() {
            function.push_str(line);
            function.push('\n');
        }
    }
    found
}

/// The transactions a function begins, by variable name (`let mut tx = db.begin()`).
fn transactions_begun(function: &str) -> Vec<String> {
    function
        .lines()
        .filter(|line| line.contains(".begin()"))
        .filter_map(|line| {
            let rest = line.trim_start().strip_prefix("let mut ")?;
            Some(rest.split([' ', ':']).next()?.to_owned())
        })
        .collect()
}

#[test]
fn a_change_and_its_audit_row_commit_together() {
    // A function that begins a transaction and records an audit row in it makes the change
    // in the same transaction: the transaction goes to something besides the audit row.
    // Exceptions, whose change is a worker's and has no row to commit with: a terminal session
    // opened or closed on the sandbox's worker (the audit row follows the worker's answer).
    let worker_changes = [
        "gateway/src/http/api/terminals.rs: async fn open_terminal(",
        "gateway/src/http/api/terminals.rs: async fn close_terminal(",
    ];
    let mut offenders = Vec::new();
    for (path, text) in sources("gateway") {
        for function in functions(&text) {
            if !function.contains(".record(") {
                continue;
            }
            for name in transactions_begun(&function) {
                let uses = function.matches(&format!("&mut {name}")).count()
                    + function.matches(&format!("&mut *{name}")).count();
                let head = function.lines().next().unwrap_or_default().trim();
                let place = format!("{path}: {head}");
                if uses < 2 && !worker_changes.contains(&place.as_str()) {
                    offenders.push(place);
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "audit rows written in a transaction of their own, apart from their change: {offenders:?}"
    );
    // The checker sees the mistake it is for.
    let apart = "async fn close() {\n    close_it(&state).await?;\n    let mut transaction = state.db.begin().await?;\n    audit.record(&mut transaction, &principal).await?;\n}\n";
    let together = "async fn close() {\n    let mut tx = state.db.begin().await?;\n    close_it(&mut tx).await?;\n    audit.record(&mut tx, &principal).await?;\n}\n";
    for (text, expected) in [(apart, 1), (together, 2)] {
        let function = &functions(text)[0];
        let name = &transactions_begun(function)[0];
        assert_eq!(function.matches(&format!("&mut {name}")).count(), expected);
    }
}

#[test]
fn no_source_file_is_longer_than_700_lines() {
    let offenders: Vec<String> = CRATES
        .iter()
        .flat_map(|name| {
            // Every Rust file of the crate: its source, tests and benchmarks.
            let mut files = Vec::new();
            rust_files(&workspace().join(name), &mut files);
            files.into_iter().map(|file| {
                let text = std::fs::read_to_string(&file).unwrap();
                (
                    file.strip_prefix(workspace())
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                    text,
                )
            })
        })
        .filter(|(_, text)| text.lines().count() > MAX_FILE_LINES)
        .map(|(path, text)| format!("{path}: {} lines", text.lines().count()))
        .collect();
    assert!(
        offenders.is_empty(),
        "files to split along their seams: {offenders:?}"
    );
}
