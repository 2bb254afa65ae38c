//! Serving on every CPU: one single-threaded runtime per worker, each on a thread of its own
//! with a listening socket of its own on the same address (`SO_REUSEPORT`), so that the kernel
//! spreads new connections over them and a connection is served where it was accepted.
//!
//! On a machine of two CPUs this served 35–37 % more requests a second than one multi-threaded
//! runtime with two workers, which wakes the other thread for much of what a request does
//! (benches/results/2026-12-06-workers.md). What the runtimes share is the application's state
//! (the engine and its store, the limits, the metrics); each has its own connection pools to
//! the providers ([`App::for_another_runtime`]).
//!
//! The main runtime keeps the first listener and the shutdown signal; the others are stopped
//! when it is, drain their own connections within the same grace, and are waited for before
//! the process sends its last spans and exits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;

use crate::http::App;

/// Connections waiting to be accepted, per listener (what `TcpListener::bind` asks for).
const BACKLOG: u32 = 1024;

/// How many runtimes serve: `configured`, or one per CPU the process may use when it is 0.
pub fn count(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The listening sockets of `workers` runtimes on `listen`: the main runtime's, listening, and
/// the others' bound, to listen on their own runtimes. One runtime gets a plain listener. With
/// more, the address is first bound without `SO_REUSEPORT`, so that a port another process
/// already serves is refused as it would be with one listener (rather than shared with it),
/// and port 0 becomes the port every socket then binds.
pub async fn bind(listen: &str, workers: usize) -> std::io::Result<(TcpListener, Vec<TcpSocket>)> {
    if workers <= 1 {
        return Ok((TcpListener::bind(listen).await?, Vec::new()));
    }
    let mut last_error = None;
    for addr in tokio::net::lookup_host(listen).await? {
        match bind_all(addr, workers) {
            Ok(bound) => return Ok(bound),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    }))
}

fn bind_all(addr: SocketAddr, workers: usize) -> std::io::Result<(TcpListener, Vec<TcpSocket>)> {
    let addr = std::net::TcpListener::bind(addr)?.local_addr()?;
    let main = shared_socket(addr)?.listen(BACKLOG)?;
    let others = (1..workers)
        .map(|_| shared_socket(addr))
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok((main, others))
}

fn shared_socket(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// The runtimes serving beside the main one.
pub struct Workers {
    threads: Vec<JoinHandle<()>>,
    stop: CancellationToken,
}

/// Starts a runtime on a thread of its own for each of `sockets`, serving `app`'s state.
/// A runtime that cannot start is logged and left out: the others serve.
pub fn start(sockets: Vec<TcpSocket>, app: &App, grace: Duration) -> Workers {
    let stop = CancellationToken::new();
    let mut threads = Vec::with_capacity(sockets.len());
    for (i, socket) in sockets.into_iter().enumerate() {
        let app = Arc::new(app.for_another_runtime());
        let stop = stop.clone();
        let started = std::thread::Builder::new()
            .name(format!("compactor-rt-{}", i + 1))
            .spawn(move || run(socket, app, stop, grace));
        match started {
            Ok(thread) => threads.push(thread),
            Err(e) => tracing::warn!(error = %e, "Could not start a worker thread."),
        }
    }
    Workers { threads, stop }
}

/// One worker: its runtime, its listener, its connections until stopped and drained.
fn run(socket: TcpSocket, app: Arc<App>, stop: CancellationToken, grace: Duration) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::warn!(error = %e, "Could not start a worker's runtime.");
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match socket.listen(BACKLOG) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::warn!(error = %e, "A worker could not listen.");
                return;
            }
        };
        let stopped = stop.cancelled_owned();
        if let Err(e) = crate::server::serve_connections(listener, app, stopped, grace).await {
            tracing::warn!(error = %e, "A worker stopped serving.");
        }
    });
}

impl Workers {
    /// How many runtimes serve beside the main one.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// What stops every worker when cancelled (each then drains as the main runtime does).
    pub fn stopper(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Stops the workers and waits for them to drain. Waited for off the main runtime's
    /// thread, which keeps driving what the workers may still use of it (a Redis connection
    /// the store opened there).
    pub async fn finish(self) {
        self.stop.cancel();
        for thread in self.threads {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}
