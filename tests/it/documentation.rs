//! What the documents name exists: every path under the project's own folders that `docs/` or
//! the README names in backquotes (`src/...`, `tests/...`, `scripts/...`, ...), every Rust file
//! named by its path within `src/` or `tests/it/` (`ingest/geography/wkt_scan.rs`), and every
//! module of `src/` in the code map of `docs/architecture.md`.

use std::path::{Path, PathBuf};

/// Folders of the project whose paths the documents name as they are.
const PROJECT_FOLDERS: [&str; 10] =
    ["src/", "tests/", "scripts/", "deploy/", "benches/", "clients/", "docs/", "examples/", "fuzz/", "migrations/"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn documents() -> Vec<(String, String)> {
    let mut paths = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let path = entry.expect("a docs/ entry").path();
        if path.extension().is_some_and(|extension| extension == "md") {
            paths.push(path);
        }
    }
    paths
        .into_iter()
        .map(|path| {
            let name = path.strip_prefix(root()).expect("within the project").display().to_string();
            (name, std::fs::read_to_string(&path).expect("a readable document"))
        })
        .collect()
}

/// Whether a Rust file named by its path below `src/` or `tests/it/` exists there.
fn rust_file_exists(named: &str) -> bool {
    ["src", "tests/it", "tests"].iter().any(|base| root().join(base).join(named).exists())
}

#[test]
fn every_project_path_the_documents_name_exists() {
    let quoted = regex::Regex::new(r"`([A-Za-z0-9_./-]+)`").expect("a valid pattern");
    let mut missing = Vec::new();
    for (document, text) in documents() {
        for token in quoted.captures_iter(&text).map(|captures| captures[1].to_string()) {
            let exists = if PROJECT_FOLDERS.iter().any(|folder| token.starts_with(folder)) {
                root().join(token.trim_end_matches('/')).exists()
            } else if token.ends_with(".rs") && token.contains('/') && !token.starts_with("arrow-") {
                rust_file_exists(&token)
            } else {
                true
            };
            if !exists {
                missing.push(format!("{document}: {token}"));
            }
        }
    }
    assert!(missing.is_empty(), "paths the documents name that do not exist:\n{}", missing.join("\n"));
}

#[test]
fn every_module_of_src_is_in_the_code_map() {
    let map = std::fs::read_to_string(root().join("docs/architecture.md")).expect("docs/architecture.md");
    let mut absent = Vec::new();
    for entry in std::fs::read_dir(root().join("src")).expect("src/") {
        let path = entry.expect("an src/ entry").path();
        let name = path.file_name().and_then(|name| name.to_str()).expect("a UTF-8 name").to_string();
        let named = if path.is_dir() { format!("src/{name}/") } else { format!("src/{name}") };
        if !map.contains(&named) && !is_snapshot_folder(&path) {
            absent.push(named);
        }
    }
    assert!(absent.is_empty(), "modules missing from the code map of docs/architecture.md: {absent:?}");
}

fn is_snapshot_folder(path: &Path) -> bool {
    path.file_name().is_some_and(|name| name == "snapshots")
}
