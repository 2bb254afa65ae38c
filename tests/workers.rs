//! The binary serving on several runtimes (`workers`): one port, one connection cap over all of
//! them, and a stop that lets every runtime finish what it holds.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::served::Served;
use common::{compactor_command, hold_connections, read_until_quiet, start_mock};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The binary serving on `workers` runtimes, and its listening line.
fn start(upstream: &str, workers: usize, env: &[(&str, &str)]) -> (Served, Value) {
    let workers = workers.to_string();
    let mut env = env.to_vec();
    env.extend([
        ("COMPACTOR_LOG", "info"),
        ("COMPACTOR_WORKERS", workers.as_str()),
    ]);
    let served = Served::start(&["--log-format", "json", "--upstream", upstream], &env);
    let started =
        serde_json::from_str(&served.started).unwrap_or_else(|e| panic!("{e}: {}", served.started));
    (served, started)
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
    let (proxy, started) = start(&mock.url(), 2, &[("COMPACTOR_MAX_CONNECTIONS", "2")]);
    assert_eq!(started["workers"], 2, "{started}");
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
    let (first, _) = start(&mock.url(), 2, &[]);
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
    let (mut proxy, _) = start(&mock.url(), 2, &[("COMPACTOR_SHUTDOWN_GRACE_MS", "20000")]);
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
    proxy.stop();
    for stream in streams {
        let (status, body) = stream.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    }
    let exit = proxy.exit_within(Duration::from_secs(10));
    assert!(exit.success(), "{exit:?}: {}", proxy.log());
}
