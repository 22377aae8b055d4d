//! Thin entry point: parse the configuration, initialise telemetry, run. `anyhow` lives here only.

use anyhow::Context as _;
use filament_bigquery::config::{Cli, Command, LogFormat};

/// See Cargo.toml: fewer page faults and less fragmentation on batch-sized buffers.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How long a stopping gateway waits for its last spans to be exported.
const TRACE_FLUSH_AT_MOST: std::time::Duration = std::time::Duration::from_secs(5);

#[tokio::main]
async fn main() -> anyhow::Result<std::process::ExitCode> {
    // Renamed settings are still read under their old names (for one release), with a warning.
    let (cli, old_names): (Cli, _) = filament_bigquery::config::renamed::parse();
    // rustls is compiled with two crypto providers (through dependencies); pick one for the
    // process so TLS to Google never depends on which crate asks first.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    // Decoder panics on malformed bodies are contained and answered as invalid_arrow_ipc;
    // keep them out of the logs. Every other panic is reported as usual.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !filament_bigquery::ingest::decode::panic_is_contained() {
            default_hook(info);
        }
    }));
    match cli.command {
        Command::Serve(config) => {
            let traces = filament_bigquery::traces::configured()
                .then(filament_bigquery::traces::export)
                .transpose()
                .context("OTLP trace export (OTEL_EXPORTER_OTLP_*)")?;
            let trace_provider = traces.as_ref().map(filament_bigquery::traces::TraceExport::provider);
            filament_bigquery::telemetry::init_logging(config.infrastructure.log_format, trace_provider);
            old_names.iter().for_each(filament_bigquery::config::renamed::OldName::warn);
            config.validate()?;
            let served = filament_bigquery::app::serve(*config).await;
            if let Some(traces) = &traces {
                // The last requests' spans are still queued: send them before the process ends.
                traces.flush(TRACE_FLUSH_AT_MOST).await;
            }
            served?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Migrate(database) => {
            filament_bigquery::telemetry::init_logging(LogFormat::Text, None);
            filament_bigquery::app::migrate(database).await?;
            tracing::info!("migrations applied");
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Openapi => {
            println!("{}", filament_bigquery::api::openapi_json());
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Token(filament_bigquery::config::TokenCommand::New { principal }) => {
            print!("{}", filament_bigquery::app::new_token(&principal).map_err(anyhow::Error::msg)?);
            Ok(std::process::ExitCode::SUCCESS)
        }
        Command::Runs(command) => match filament_bigquery::cli::run(warn_of_a_token_in_argv(command)).await {
            Ok(filament_bigquery::cli::Outcome::Succeeded) => Ok(std::process::ExitCode::SUCCESS),
            Ok(filament_bigquery::cli::Outcome::Failed) => Ok(std::process::ExitCode::from(1)),
            Err(error) => {
                eprintln!("error: {error}");
                Ok(std::process::ExitCode::from(2))
            }
        },
    }
}

/// A token given as `--token` shows in `ps` and in shell history: it works, with a warning.
fn warn_of_a_token_in_argv(command: filament_bigquery::config::RunsCommand) -> filament_bigquery::config::RunsCommand {
    if std::env::args().any(|arg| arg == "--token" || arg.starts_with("--token=")) {
        eprintln!(
            "warning: a token on the command line shows in `ps` and shell history; set FILAMENT_TOKEN or pass --token-file"
        );
    }
    command
}
