//! The judge of the Arrow project's files: `tests/data/arrow-testing/judge.py`, run with the
//! tools venv's pyarrow (`FILAMENT_TOOLS_PYTHON`). pyarrow reads each file and the script
//! applies `docs/type-mapping.md`'s rules: what the gateway must answer, and whether the rows
//! BigQuery holds (or the gateway staged) are the file's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::support::required_env;

/// Where the files are (a copy of apache/arrow-testing's, see its README).
pub(super) const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/arrow-testing");

/// What one file must do.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Plan {
    /// The file's path in the data (`cpp-21.0.0/generated_map.stream`), or what a clean
    /// variant was made of.
    pub(super) name: String,
    pub(super) file: String,
    /// Rows, as pyarrow reads them.
    pub(super) rows: u64,
    pub(super) expect: Expect,
    /// Who judges the loaded rows: `emulator` (read back with `select`) or `staged` (a type the
    /// emulator cannot store: the rows the gateway appended, from the Storage Write fake).
    #[serde(default)]
    pub(super) judge: Option<String>,
    #[serde(default)]
    pub(super) select: Option<String>,
    /// For a file refused on values: the file without the refused columns and rows, written
    /// by pyarrow (its values must load).
    #[serde(default)]
    pub(super) clean: Option<Box<Plan>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum Expect {
    Load {
        #[allow(dead_code)]
        load: bool,
    },
    /// Refused at `schema` with one of `answers` (`[code, column]`, the column null for a
    /// refusal of the whole stream) or at a `batch` (`[code, column, row]`).
    Refused { refused_at: String, answers: Vec<Vec<Value>> },
}

impl Plan {
    pub(super) fn judged_staged(&self) -> bool {
        self.judge.as_deref() == Some("staged")
    }
}

async fn run(args: &[&str], stdin: Option<Vec<u8>>) -> Vec<u8> {
    use tokio::io::AsyncWriteExt as _;
    let script = format!("{DATA}/judge.py");
    let mut command = tokio::process::Command::new(required_env("FILAMENT_TOOLS_PYTHON"));
    command.arg(&script).args(args).stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
    let mut child = command.stderr(std::process::Stdio::piped()).spawn().expect("run the judge");
    let mut input = child.stdin.take().unwrap();
    input.write_all(&stdin.unwrap_or_default()).await.unwrap();
    drop(input);
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the judge answers within 2 minutes")
        .unwrap();
    assert!(output.status.success(), "judge.py {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// The plan of every file; clean variants are written to `out_dir`.
pub(super) async fn plan(files: &[PathBuf], out_dir: &Path) -> Vec<Plan> {
    let mut args = vec!["plan".to_string(), out_dir.display().to_string()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    serde_json::from_slice(&run(&args, None).await).expect("the judge's plan")
}

/// The differences between the rows BigQuery returned for the plan's `select` and the file's
/// (null: none).
pub(super) async fn check_query(plan: &Plan, rows: &[Vec<Value>]) -> Value {
    let rows = serde_json::to_vec(rows).unwrap();
    serde_json::from_slice(&run(&["check-query", &plan.file], Some(rows)).await).unwrap()
}

/// The differences between the rows staged (an IPC stream at `staged`) and the file's.
pub(super) async fn check_staged(plan: &Plan, staged: &Path) -> Value {
    serde_json::from_slice(&run(&["check-staged", &plan.file, &staged.display().to_string()], None).await).unwrap()
}

/// The byte order the stream's schema declares and its rows, as pyarrow reads them.
pub(super) async fn dump(stream: &Path) -> Value {
    serde_json::from_slice(&run(&["dump", &stream.display().to_string()], None).await).unwrap()
}
