//! Google's GoogleSQL analyzer (ZetaSQL's local service, which `make test` starts) as a judge of
//! the statements the gateway generates: one `scripts/zetasql_analyze.py` process per
//! [`Analyzer`], spoken to in JSON Lines (one request and one answer per line), given the tables
//! of each statement as the `tables.insert` bodies the gateway would send.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use filament_bigquery::conformance::TableBody;
use serde_json::{Value, json};

use super::required_env;

/// What the analyzer said of one statement (or script).
#[derive(Debug, Clone)]
pub struct Verdict {
    pub ok: bool,
    /// Statements analyzed (a script's statements one by one).
    pub statements: usize,
    pub errors: Vec<String>,
}

/// One analyzer client process; ended on drop (its stdin closed, so it unregisters the
/// catalogs it registered with the server).
pub struct Analyzer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Analyzer {
    /// A client of the analyzer at `$FILAMENT_ZETASQL_ADDR`, run with the tools virtualenv.
    pub fn start() -> Self {
        let python = required_env("FILAMENT_TOOLS_PYTHON");
        let checker = required_env("FILAMENT_ZETASQL_CHECKER");
        let address = required_env("FILAMENT_ZETASQL_ADDR");
        let mut child = Command::new(python)
            .arg(checker)
            .arg("--addr")
            .arg(address)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start scripts/zetasql_analyze.py");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self { child, stdin: Some(stdin), stdout, next_id: 0 }
    }

    /// Analyzes `sql` (a script of several statements when `script`) against `tables`.
    pub fn analyze(&mut self, tables: &[&TableBody], sql: &str, script: bool) -> Verdict {
        self.next_id += 1;
        let tables: Vec<Value> = tables
            .iter()
            .map(|t| {
                json!({
                    "project": t.project,
                    "dataset": t.dataset,
                    "table": t.table,
                    "fields": t.body["schema"]["fields"],
                    "default_collation": t.body["defaultCollation"],
                })
            })
            .collect();
        let request = json!({
            "id": self.next_id.to_string(),
            "tables": tables,
            "sql": sql,
            "mode": if script { "script" } else { "statement" },
        });
        let stdin = self.stdin.as_mut().expect("open until dropped");
        writeln!(stdin, "{request}").expect("write to the analyzer");
        stdin.flush().expect("flush to the analyzer");
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line).expect("read from the analyzer");
        assert!(read > 0, "the analyzer client exited (is the ZetaSQL server running? make test starts it)");
        let answer: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("analyzer answer {line:?}: {e}"));
        assert_eq!(answer["id"], json!(self.next_id.to_string()), "answers come in request order");
        Verdict {
            ok: answer["ok"].as_bool().unwrap_or(false),
            statements: answer["statements"].as_u64().unwrap_or(0) as usize,
            errors: answer["errors"]
                .as_array()
                .map(|errors| errors.iter().map(|e| e.as_str().unwrap_or_default().to_string()).collect())
                .unwrap_or_default(),
        }
    }
}

impl Drop for Analyzer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
