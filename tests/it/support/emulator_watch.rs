//! The emulator the suite shares, watched. bqemulator (DuckDB under grpcio) was seen to die
//! natively (a segfault, nothing in its log) during ordinary loads of a long run; every later
//! test then failed for a reason that was not its own. An [`EmulatorWatch`] polls the process
//! from a thread of its own; when it is gone it reports the crash with the tests that were using
//! it (libtest names each test's thread after the test) and the tail of the emulator's log, then
//! starts it again on the same ports. A test that starts while it restarts waits for it.
//!
//! The report goes to the terminal (unbuffered, past libtest's capture) and to the crash log
//! `make test` prints at its end (`FILAMENT_EMULATOR_CRASH_LOG`); the new process id goes to
//! the file `scripts/services.sh stop` kills (`FILAMENT_EMULATOR_PIDFILE`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::required_env;

/// How often the watching thread looks at the process.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How long a restarted emulator may take to listen on both ports.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// Where an emulator listens and how it is started again.
#[derive(Debug, Clone)]
pub struct EmulatorSpec {
    pub rest_port: u16,
    pub grpc_port: u16,
    /// Where its output goes (appended), and where a crash report reads its tail.
    pub log_file: PathBuf,
    /// The file holding its process id, rewritten at each restart.
    pub pid_file: Option<PathBuf>,
    /// Crash reports are appended here too.
    pub crash_log: Option<PathBuf>,
}

/// One crash, as reported.
#[derive(Debug, Clone)]
pub struct CrashReport {
    pub pid: u32,
    /// The tests holding an [`EmulatorUse`] when the crash was seen.
    pub tests_running: Vec<String>,
    pub log_tail: String,
}

enum EmulatorProcess {
    /// Started by `scripts/services.sh`: only its id is known.
    Adopted(u32),
    /// Started by this watch (a restart, or a private emulator).
    Started(Child),
}

impl EmulatorProcess {
    fn id(&self) -> u32 {
        match self {
            Self::Adopted(pid) => *pid,
            Self::Started(child) => child.id(),
        }
    }

    /// False once the process exited (reaped, or a zombie nobody reaped).
    fn is_alive(&mut self) -> bool {
        match self {
            Self::Started(child) => matches!(child.try_wait(), Ok(None)),
            Self::Adopted(pid) => std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().to_string()))
                .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X')),
        }
    }
}

struct WatchState {
    process: EmulatorProcess,
    /// Tests using the emulator now, by name, with how many uses each holds.
    users: BTreeMap<String, usize>,
    crashes: Vec<CrashReport>,
    /// False from the moment a crash is seen until the new process listens.
    serving: bool,
}

/// A watched emulator process; see the module documentation.
pub struct EmulatorWatch {
    spec: EmulatorSpec,
    state: Mutex<WatchState>,
}

/// A test's use of a watched emulator, from its start to its drop.
pub struct EmulatorUse {
    watch: Arc<EmulatorWatch>,
    test: String,
}

impl Drop for EmulatorUse {
    fn drop(&mut self) {
        let mut state = self.watch.lock();
        if let Some(count) = state.users.get_mut(&self.test) {
            *count -= 1;
            if *count == 0 {
                state.users.remove(&self.test);
            }
        }
    }
}

impl EmulatorWatch {
    /// The emulator `make test` started, watched from the first test that uses it on.
    pub fn shared() -> Arc<Self> {
        static SHARED: OnceLock<Arc<EmulatorWatch>> = OnceLock::new();
        let shared = SHARED.get_or_init(|| {
            let port = |name: &str| -> u16 {
                let address = required_env(name);
                address.rsplit_once(':').and_then(|(_, port)| port.parse().ok()).expect("host:port")
            };
            let pid = required_env("FILAMENT_EMULATOR_PID").parse().expect("a process id");
            let spec = EmulatorSpec {
                rest_port: port("BIGQUERY_EMULATOR_HOST"),
                grpc_port: port("BIGQUERY_STORAGE_EMULATOR_HOST"),
                log_file: required_env("FILAMENT_EMULATOR_LOG").into(),
                pid_file: Some(required_env("FILAMENT_EMULATOR_PIDFILE").into()),
                crash_log: Some(required_env("FILAMENT_EMULATOR_CRASH_LOG").into()),
            };
            Self::watch(spec, EmulatorProcess::Adopted(pid))
        });
        Arc::clone(shared)
    }

    /// Starts an emulator of its own on `spec`'s ports and watches it.
    pub fn start_private(spec: EmulatorSpec) -> Arc<Self> {
        let child = start_emulator(&spec);
        wait_until_listening(&spec);
        Self::watch(spec, EmulatorProcess::Started(child))
    }

    fn watch(spec: EmulatorSpec, process: EmulatorProcess) -> Arc<Self> {
        let state = WatchState { process, users: BTreeMap::new(), crashes: Vec::new(), serving: true };
        let watch = Arc::new(Self { spec, state: Mutex::new(state) });
        let watched = Arc::downgrade(&watch);
        std::thread::Builder::new()
            .name("emulator-watch".into())
            .spawn(move || {
                while let Some(watch) = watched.upgrade() {
                    watch.restart_if_dead();
                    drop(watch);
                    std::thread::sleep(POLL_INTERVAL);
                }
            })
            .expect("spawn the emulator watch");
        watch
    }

    /// The crashes seen so far.
    pub fn crashes(&self) -> Vec<CrashReport> {
        self.lock().crashes.clone()
    }

    /// The emulator's process id now.
    pub fn pid(&self) -> u32 {
        self.lock().process.id()
    }

    /// Registers the calling test as a user, waiting (within the start deadline) for a restart
    /// in progress to end.
    pub async fn use_for_test(self: &Arc<Self>) -> EmulatorUse {
        let test = std::thread::current().name().unwrap_or("<unnamed thread>").to_string();
        let deadline = tokio::time::Instant::now() + START_DEADLINE;
        loop {
            {
                let mut state = self.lock();
                if state.serving {
                    *state.users.entry(test.clone()).or_default() += 1;
                    return EmulatorUse { watch: Arc::clone(self), test };
                }
            }
            assert!(tokio::time::Instant::now() < deadline, "the emulator did not come back within {START_DEADLINE:?}");
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn restart_if_dead(&self) {
        let report = {
            let mut state = self.lock();
            if state.process.is_alive() {
                return;
            }
            state.serving = false;
            CrashReport {
                pid: state.process.id(),
                tests_running: state.users.keys().cloned().collect(),
                log_tail: log_tail(&self.spec.log_file, 20),
            }
        };
        self.report(&report);
        let child = start_emulator(&self.spec);
        if let Some(pid_file) = &self.spec.pid_file {
            let _ = std::fs::write(pid_file, child.id().to_string());
        }
        wait_until_listening(&self.spec);
        let mut state = self.lock();
        state.process = EmulatorProcess::Started(child);
        state.crashes.push(report);
        state.serving = true;
    }

    fn report(&self, report: &CrashReport) {
        let text = format!(
            "\n=== bqemulator (pid {}, REST port {}) died; tests using it then: {}; restarting it on the same ports\n\
             --- the last lines of its log:\n{}\n===\n",
            report.pid,
            self.spec.rest_port,
            if report.tests_running.is_empty() { "none".to_string() } else { report.tests_running.join(", ") },
            report.log_tail,
        );
        // Straight to the terminal: libtest captures only the print macros of test threads.
        let _ = std::io::stderr().write_all(text.as_bytes());
        if let Some(path) = &self.spec.crash_log
            && let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path)
        {
            let _ = file.write_all(text.as_bytes());
        }
    }
}

impl Drop for EmulatorWatch {
    /// A private emulator stops with its watch (the shared one lives as long as the run).
    fn drop(&mut self) {
        if let EmulatorProcess::Started(child) = &mut self.lock().process {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts bqemulator the way `scripts/services.sh` does, its output appended to the log.
fn start_emulator(spec: &EmulatorSpec) -> Child {
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(&spec.log_file).expect("open the emulator log");
    Command::new(required_env("FILAMENT_BQEMULATOR_PYTHON"))
        .arg(required_env("FILAMENT_BQEMULATOR_LAUNCH"))
        .args(["start", "--rest-port", &spec.rest_port.to_string(), "--grpc-port", &spec.grpc_port.to_string()])
        .args(["--project", "filament-demo", "--log-level", "warning"])
        .env("HOME", required_env("FILAMENT_BQEMULATOR_HOME"))
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().expect("clone the log handle")))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("start bqemulator")
}

fn wait_until_listening(spec: &EmulatorSpec) {
    let deadline = Instant::now() + START_DEADLINE;
    for port in [spec.rest_port, spec.grpc_port] {
        while TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).is_err() {
            assert!(Instant::now() < deadline, "bqemulator did not listen on port {port} within {START_DEADLINE:?}");
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
