//! The binary serving on several runtimes (`workers`): one port, one connection cap over all of
//! them, and a stop that lets every runtime finish what it holds.

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{compactor_command, hold_connections, read_until_quiet, start_mock};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The binary serving on `workers` runtimes, and what it has logged so far.
struct Running {
    child: Child,
    addr: SocketAddr,
    started: Value,
    log: Arc<Mutex<String>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(upstream: &str, workers: usize, env: &[(&str, &str)]) -> Running {
    let mut child = compactor_command()
        .args(["serve", "--listen", "127.0.0.1:0", "--store", "memory"])
        .args(["--log-format", "json", "--upstream", upstream])
        .env("COMPACTOR_LOG", "info")
        .env("COMPACTOR_WORKERS", workers.to_string())
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let written = log.clone();
    // Read to the end, so that the pipe never fills and the log can be checked afterwards.
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            written
                .lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let started = loop {
        let line = log
            .lock()
            .unwrap()
            .lines()
            .find(|l| l.contains("listening"))
            .map(str::to_string);
        if let Some(line) = line {
            break serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        }
        assert!(
            Instant::now() < deadline,
            "not started: {}",
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let addr = started["listen"].as_str().unwrap().parse().unwrap();
    Running {
        child,
        addr,
        started,
        log,
    }
}

/// The names of the process's threads.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect()
}

/// A client that opens a new connection for every request, so that the kernel spreads them
/// over the runtimes' sockets.
fn fresh_connections() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

fn chat(stream: bool) -> Value {
    json!({"model": "gpt-4o", "stream": stream,
           "messages": [{"role": "user", "content": "Say hello."}]})
}

#[tokio::test]
async fn every_worker_serves_the_one_port_within_one_connection_cap() {
    let mock = start_mock().await;
    let proxy = start(&mock.url(), 2, &[("COMPACTOR_MAX_CONNECTIONS", "2")]);
    assert_eq!(proxy.started["workers"], 2, "{}", proxy.started);
    let threads = thread_names(proxy.child.id());
    assert!(threads.iter().any(|t| t == "compactor-rt-1"), "{threads:?}");

    let client = fresh_connections();
    for i in 0..16 {
        let response = client
            .post(format!("http://{}/v1/chat/completions", proxy.addr))
            .header("content-type", "application/json")
            .body(chat(false).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "request {i}");
    }
    assert_eq!(mock.chats().len(), 16);
    // Those connections are closed by the client; their slots come free as each runtime sees
    // its close.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Two connections hold the whole cap. Every later one is refused, whichever runtime's
    // socket the kernel gives it to: with a cap per runtime, about half would be let in.
    let mut held = hold_connections(proxy.addr, 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..8 {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let answer = read_until_quiet(&mut stream, Duration::from_secs(1)).await;
        assert!(
            answer.starts_with("HTTP/1.1 503"),
            "connection {i}: {answer:?}"
        );
    }
    // And the two holding it were let in: they are still waiting for the rest of their headers.
    for stream in &mut held {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buf)).await;
        assert!(read.is_err(), "a held connection was answered: {read:?}");
    }
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let served = client
            .get(format!("http://{}/healthz", proxy.addr))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if served {
            break;
        }
        assert!(Instant::now() < deadline, "the freed slots serve no one");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_port_in_use_is_refused_rather_than_shared() {
    let mock = start_mock().await;
    let first = start(&mock.url(), 2, &[]);
    let output = compactor_command()
        .args([
            "serve",
            "--listen",
            &first.addr.to_string(),
            "--store",
            "memory",
        ])
        .args(["--upstream", &mock.url()])
        .env("COMPACTOR_WORKERS", "2")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot listen on"), "{stderr}");
}

#[tokio::test]
async fn a_stop_lets_every_worker_finish_its_streams() {
    let mock = start_mock().await;
    // Each stream takes a second or more, so all are still open when the stop comes.
    mock.state.chunk_pause_ms.store(200, Ordering::SeqCst);
    let mut proxy = start(&mock.url(), 2, &[("COMPACTOR_SHUTDOWN_GRACE_MS", "20000")]);
    let client = fresh_connections();
    let streams: Vec<_> = (0..8)
        .map(|_| {
            let request = client
                .post(format!("http://{}/v1/chat/completions", proxy.addr))
                .header("content-type", "application/json")
                .body(chat(true).to_string());
            tokio::spawn(async move {
                let response = request.send().await.unwrap();
                (response.status().as_u16(), response.text().await.unwrap())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = proxy.child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    for stream in streams {
        let (status, body) = stream.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = proxy.child.try_wait().unwrap() {
            break exit;
        }
        assert!(Instant::now() < deadline, "still running after the stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit:?}: {}", proxy.log.lock().unwrap());
}
