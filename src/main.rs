//! `compactor`: parse the command line, load configuration, start logging, run.

use std::io::BufWriter;
use std::process::ExitCode;

use clap::Parser;
use compactor::cli::{self, Cli, Command};
use compactor::config::{CliOverrides, LogFormat};
use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;

/// jemalloc rather than the system allocator: after a burst of large bodies, glibc's malloc keeps
/// most of the freed memory resident; jemalloc's background threads return it within seconds.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Starts logging. Lines are formatted on the thread that logs them and written to stderr by a
/// thread of their own, in batches (a buffered writer flushed whenever the queue runs dry), so
/// that a request never waits for a `write` to stderr. Not lossy: when the queue is full, the
/// logging thread waits, rather than the request log missing lines. The returned guard flushes
/// what is queued when it is dropped.
fn init_logs(format: LogFormat) -> WorkerGuard {
    let filter =
        EnvFilter::try_from_env("COMPACTOR_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("compactor-log")
        .finish(BufWriter::with_capacity(64 * 1024, std::io::stderr()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    compactor::http::log::set_json_format(format == LogFormat::Json);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
    guard
}

/// On one CPU, a single-threaded runtime: a multi-threaded one would have one worker there
/// anyway, and pay for waking it across threads (benches/results/2026-12-01-speed.md). Blocking
/// work (token counting, SQLite) still runs on the blocking pool either way.
fn main() -> ExitCode {
    let one_cpu = std::thread::available_parallelism().is_ok_and(|n| n.get() == 1);
    let mut runtime = if one_cpu {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(serve()),
        Err(e) => cli::fail(&format!("cannot start the runtime: {e}")),
    }
}

async fn serve() -> ExitCode {
    let cli = Cli::parse();
    let mut log_guard = None;
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
            cli::run_serve(common, overrides, |format| {
                log_guard = Some(init_logs(format))
            })
            .await
        }
        other => cli::run_tool(other).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => cli::fail(&message),
    }
}
