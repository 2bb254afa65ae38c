//! `compactor`: parse the command line, load configuration, start logging, run.

use std::process::ExitCode;

use clap::Parser;
use compactor::cli::{self, Cli, Command};
use compactor::config::{CliOverrides, LogFormat};
use tracing_subscriber::EnvFilter;

/// jemalloc rather than the system allocator: after a burst of large bodies, glibc's malloc keeps
/// most of the freed memory resident; jemalloc's background threads return it within seconds.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn init_logs(format: LogFormat) {
    let filter =
        EnvFilter::try_from_env("COMPACTOR_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    compactor::http::log::set_json_format(format == LogFormat::Json);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve {
            common,
            listen,
            upstream,
            store,
            log_format,
        } => {
            let overrides = CliOverrides {
                listen,
                upstream,
                store,
                log_format: log_format.map(Into::into),
            };
            cli::run_serve(common, overrides, init_logs).await
        }
        other => cli::run_tool(other).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => cli::fail(&message),
    }
}
