//! A private bqemulator for tests that may leave it in a bad state (connections cut in the
//! middle of appends), started from the virtualenv `make test` installed; killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{eventually, required_env};

pub struct PrivateEmulator {
    child: Child,
    pub rest: String,
    pub grpc: String,
}

impl PrivateEmulator {
    pub async fn start() -> Self {
        let (rest_port, grpc_port) = (super::free_port_for_later_bind(), super::free_port_for_later_bind());
        // Through the launcher `make test` starts the shared emulator with (its thread pool
        // holds one thread per open AppendRows connection).
        let child = Command::new(required_env("FILAMENT_BQEMULATOR_PYTHON"))
            .arg(required_env("FILAMENT_BQEMULATOR_LAUNCH"))
            .args(["start", "--rest-port", &rest_port.to_string(), "--grpc-port", &grpc_port.to_string()])
            .args(["--project", "filament-demo", "--log-level", "warning"])
            .env("HOME", required_env("FILAMENT_BQEMULATOR_HOME"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start bqemulator");
        let emulator = Self { child, rest: format!("127.0.0.1:{rest_port}"), grpc: format!("127.0.0.1:{grpc_port}") };
        for address in [&emulator.rest, &emulator.grpc] {
            eventually(Duration::from_secs(30), &format!("bqemulator to listen on {address}"), || async {
                tokio::net::TcpStream::connect(address).await.ok()
            })
            .await;
        }
        emulator
    }
}

impl Drop for PrivateEmulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
