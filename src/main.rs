//! `compactor`: parse the command line, load configuration, start logging, run.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use compactor::cli::{self, Cli, Command};
use compactor::config::{CliOverrides, LogFormat};
use compactor::log_writer::{self, Batching, FlushOnDrop};
use tracing_subscriber::EnvFilter;

/// jemalloc rather than the system allocator: after a burst of large bodies, glibc's malloc keeps
/// most of the freed memory resident; jemalloc's background threads return it within seconds.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Starts logging. Lines are formatted on the thread that logs them and written to stderr in
/// batches by a thread of their own ([`log_writer`]), so that a request never waits for a
/// `write` to stderr nor wakes a thread for its line. Not lossy: when too much is waiting, the
/// logging thread waits rather than the request log missing lines. The returned guard writes
/// what is waiting when it is dropped. Colors only on a terminal: a log file or a container's
/// log is read by tools, and escape codes there are noise (and a third of each line's bytes).
fn init_logs(format: LogFormat) -> FlushOnDrop {
    let filter =
        EnvFilter::try_from_env("COMPACTOR_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, guard) = log_writer::start(std::io::stderr(), Batching::default());
    let colours = colours();
    if format == LogFormat::Text && !colours {
        // The served-request line, the one every request writes, is written without the
        // formatter where that gives the same text.
        compactor::http::served_line::write_plain_lines_to(writer.clone());
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colours)
        .with_writer(writer);
    compactor::http::log::set_json_format(format == LogFormat::Json);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
    guard
}

/// Colours on a terminal, unless `NO_COLOR` is set (to anything but empty).
fn colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The proxy serves on single-threaded runtimes, one per worker ([`compactor::workers`]): this
/// one and as many more as it starts. The other commands run on one multi-threaded runtime,
/// single-threaded on one CPU, where a multi-threaded one would have one worker anyway and pay
/// for waking it across threads (benches/results/2026-12-01-speed.md). Blocking work (token
/// counting, SQLite) runs on the runtime's blocking pool either way.
fn main() -> ExitCode {
    let cli = Cli::parse();
    let one_cpu = std::thread::available_parallelism().is_ok_and(|n| n.get() == 1);
    let mut runtime = if one_cpu || matches!(cli.command, Command::Serve { .. }) {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(serve(cli)),
        Err(e) => cli::fail(&format!("cannot start the runtime: {e}")),
    }
}

async fn serve(cli: Cli) -> ExitCode {
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
