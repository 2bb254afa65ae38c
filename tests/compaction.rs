//! Compaction end to end, against the mock provider: long agent conversations, overflow
//! interception, persistence, tenant isolation, single flight, and failure handling.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::agent_session::filler;
use common::{config, start_mock, start_proxy, Mock, OverflowStyle, Proxy, Reply};
use serde_json::{json, Value};

const SYSTEM: &str = "You are a coding agent. Use the tools to read and edit files.";

fn tools() -> Value {
    json!([
        {"type":"function","function":{"name":"read","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}},
        {"type":"function","function":{"name":"edit","description":"Edit a file","parameters":{"type":"object","properties":{"path":{"type":"string"},"oldText":{"type":"string"},"newText":{"type":"string"}}}}}
    ])
}

/// An agent session: the messages a client keeps and resends in full.
struct Session {
    messages: Vec<Value>,
    model: String,
}

impl Session {
    fn new(model: &str) -> Session {
        Session {
            messages: vec![json!({"role":"system","content":SYSTEM})],
            model: model.into(),
        }
    }

    fn body(&self, stream: bool) -> Value {
        json!({"model": self.model, "messages": self.messages, "tools": tools(), "max_tokens": 256, "stream": stream})
    }

    /// Turn `t`: a user request, then (after the reply) parallel tool calls with their results.
    fn user(&mut self, t: usize) {
        self.messages
            .push(json!({"role":"user","content": format!("Step {t}: {}", filler(t, 30))}));
    }

    fn tool_round(&mut self, t: usize) {
        let read = format!("src/module_{}.rs", t % 17);
        let edited = format!("src/feature_{t}.rs");
        self.messages.push(json!({"role":"assistant","content":null,"tool_calls":[
            {"id": format!("r{t}"), "type":"function","function":{"name":"read","arguments": json!({"path": read}).to_string()}},
            {"id": format!("e{t}"), "type":"function","function":{"name":"edit","arguments": json!({"path": edited, "oldText":"a","newText":"b"}).to_string()}}
        ]}));
        self.messages.push(json!({"role":"tool","tool_call_id": format!("r{t}"), "content": filler(t, 120 + (t % 5) * 40)}));
        self.messages
            .push(json!({"role":"tool","tool_call_id": format!("e{t}"), "content": "ok"}));
    }

    fn assistant(&mut self, text: &str) {
        self.messages
            .push(json!({"role":"assistant","content": text}));
    }
}

async fn send(proxy: &Proxy, body: &Value, auth: &str, extra: &[(&str, &str)]) -> Reply {
    let mut headers = vec![
        ("authorization", auth),
        ("content-type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    let url = format!("{}/v1/chat/completions", proxy.url());
    common::post(&url, &headers, body.to_string()).await
}

fn windowed(mock: &Mock, model: &str, window: u64) -> compactor::config::Config {
    let mut c = config(&mock.url());
    c.windows.insert(model.into(), window);
    c.compaction.keep_recent_tokens = 20_000;
    // A summarizer with a large window: one summary request per compaction.
    c.summarizer.window = 200_000;
    c
}

/// The raw `messages` array of a recorded body.
fn raw_messages(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct B<'a> {
        #[serde(borrow)]
        messages: &'a serde_json::value::RawValue,
    }
    serde_json::from_slice::<B>(body)
        .unwrap()
        .messages
        .get()
        .to_string()
}

#[tokio::test]
async fn a_long_agent_session_keeps_working_through_a_small_window() {
    const W: u64 = 6000;
    let mock = start_mock().await;
    mock.set_window(W);
    let proxy = start_proxy(windowed(&mock, "agent-model", W)).await;
    let mut session = Session::new("agent-model");
    let mut compactions = 0;
    for t in 0..150 {
        session.user(t);
        let r = send(&proxy, &session.body(t % 3 == 0), "Bearer k1", &[]).await;
        assert_eq!(r.status, 200, "turn {t}: {}", r.body);
        session.tool_round(t);
        let r = send(&proxy, &session.body(false), "Bearer k1", &[]).await;
        assert_eq!(r.status, 200, "turn {t} after tools: {}", r.body);
        if r.header("x-compactor-summary-ms").is_some() {
            compactions += 1;
        }
        session.assistant(&format!("Done with step {t}."));
    }
    let summaries = mock.summaries();
    assert!(summaries.len() >= 3, "only {} summaries", summaries.len());
    assert!(compactions >= 1);
    assert_eq!(
        mock.state.overflows.load(Ordering::SeqCst),
        0,
        "a request over the window reached the provider"
    );
    for chat in mock.chats() {
        assert!(common::mock_tokens(&chat.json()) <= W);
    }
    // The second summary request carries the first summary (an update, not a fresh start).
    let first = summaries[0].json();
    let first_answer_marker = "SUMMARY-1";
    let second = summaries[1].json();
    assert!(second["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains(first_answer_marker));
    assert!(first["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains("<transcript>"));
    assert!(first.get("tools").is_none());

    // Between compactions the rewritten prefix is byte-identical from request to request.
    let chats = mock.chats();
    let mut compared = 0;
    for pair in chats.windows(2) {
        let (a, b) = (raw_messages(&pair[0].body), raw_messages(&pair[1].body));
        let a_summary = a.contains("<summary>");
        let b_summary = b.contains("<summary>");
        let same_summary = a_summary && b_summary && {
            let pick = |s: &str| s.split("</summary>").next().unwrap().to_string();
            pick(&a) == pick(&b)
        };
        if same_summary {
            assert!(
                b.starts_with(&a[..a.len() - 1]),
                "prefix changed between requests without a compaction"
            );
            compared += 1;
        }
    }
    assert!(
        compared > 50,
        "only {compared} request pairs shared a checkpoint"
    );
    // System message and tools went through byte for byte.
    let last = chats.last().unwrap().json();
    assert_eq!(last["messages"][0]["content"], SYSTEM);
    assert_eq!(last["tools"], tools());
}

#[tokio::test]
async fn overflow_from_a_smaller_real_window_is_retried_once() {
    for style in [OverflowStyle::OpenAi, OverflowStyle::LlamaCpp] {
        for stream in [false, true] {
            let mock = start_mock().await;
            *mock.state.overflow_style.lock().unwrap() = Some(style);
            mock.set_window(3000);
            // The proxy believes the window is much larger than the provider's.
            let proxy = start_proxy(windowed(&mock, "agent-model", 100_000)).await;
            let mut session = Session::new("agent-model");
            for t in 0..12 {
                session.user(t);
                session.tool_round(t);
                session.assistant("ok");
            }
            session.user(99);
            let r = send(&proxy, &session.body(stream), "Bearer k", &[]).await;
            assert_eq!(r.status, 200, "{style:?} stream={stream}: {}", r.body);
            assert_eq!(r.header("x-compactor-compacted"), Some("true"));
            assert_eq!(
                mock.state.overflows.load(Ordering::SeqCst),
                1,
                "exactly one refused attempt"
            );
            assert_eq!(mock.chats().len(), 2, "one retry");
            if stream {
                assert!(r.body.contains("data: [DONE]") && !r.body.contains("\"usage\""));
            }
            // The learned window is used from now on: the next turn needs no retry.
            session.assistant("fine");
            session.user(100);
            let r = send(&proxy, &session.body(false), "Bearer k", &[]).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.header("x-compactor-context-window"), Some("3000"));
            assert_eq!(mock.state.overflows.load(Ordering::SeqCst), 1);
        }
    }
}

fn big_session(turns: usize) -> Session {
    let mut session = Session::new("agent-model");
    for t in 0..turns {
        session.user(t);
        session.tool_round(t);
        session.assistant("ok");
    }
    session.user(turns);
    session
}

#[tokio::test]
async fn checkpoints_survive_a_restart() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = windowed(&mock, "agent-model", 4000);
    cfg.store = dir
        .path()
        .join("state/checkpoints.sqlite3")
        .display()
        .to_string();
    let mut session = big_session(13);
    let first_id = {
        let mut proxy = start_proxy(cfg.clone()).await;
        let r = send(&proxy, &session.body(false), "Bearer k", &[]).await;
        assert_eq!(r.status, 200);
        proxy.stop();
        r.header("x-compactor-checkpoint")
            .expect("compacted")
            .to_string()
    };
    assert_eq!(mock.summaries().len(), 1);
    let proxy = start_proxy(cfg).await;
    session.assistant("next");
    session.user(50);
    let r = send(&proxy, &session.body(false), "Bearer k", &[]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-compactor-checkpoint"), Some(first_id.as_str()));
    assert_eq!(
        mock.summaries().len(),
        1,
        "the stored checkpoint was reused, no new summary"
    );
}

#[tokio::test]
async fn a_degraded_sqlite_store_is_counted_in_the_store_errors() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints.sqlite3");
    let mut cfg = windowed(&mock, "agent-model", 4000);
    cfg.store = path.display().to_string();
    let proxy = start_proxy(cfg).await;
    let body = big_session(1).body(false);
    let r = send(&proxy, &body, "Bearer k", &[]).await;
    assert_eq!(r.header("x-compactor-store"), None);
    // The file is replaced by something that cannot be one: writes fail, the store degrades.
    // The store's writer may still be finishing the request's rows and create the file again
    // between the two calls: replaced until the folder stands.
    for attempt in 0.. {
        let _ = std::fs::remove_file(&path);
        match std::fs::create_dir(&path) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 50 => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    common::eventually("the store to report itself degraded", async || {
        send(&proxy, &body, "Bearer k", &[])
            .await
            .header("x-compactor-store")
            == Some("degraded")
    })
    .await;
    let (_, metrics) = common::get(&format!("{}/metrics", proxy.url()), None).await;
    let errors = common::metric(&metrics, "compactor_store_errors_total")
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(errors >= 1.0, "{metrics}");
}

#[tokio::test]
async fn tenants_never_share_checkpoints() {
    let mock = start_mock().await;
    let proxy = start_proxy(windowed(&mock, "agent-model", 4000)).await;
    // Large enough to stay over the window after the first response calibrates the count.
    let session = big_session(16);
    let a = send(&proxy, &session.body(false), "Bearer alice", &[]).await;
    let b = send(&proxy, &session.body(false), "Bearer bob", &[]).await;
    let (ida, idb) = (
        a.header("x-compactor-checkpoint").unwrap(),
        b.header("x-compactor-checkpoint").unwrap(),
    );
    assert_ne!(ida, idb);
    assert_eq!(mock.summaries().len(), 2, "each tenant got its own summary");
    let url = |id: &str| format!("{}/compactor/v1/checkpoints/{id}", proxy.url());
    let cp = common::checkpoint(&proxy, ida, "Bearer alice").await;
    assert!(cp["summary"].as_str().unwrap().contains("SUMMARY-"));
    assert!(cp["files_modified"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f == "src/feature_0.rs"));
    assert!(
        cp["covered"].as_u64().unwrap() > 0
            && cp["tokens_before"].as_u64() > cp["tokens_after"].as_u64()
    );
    assert_eq!(common::get(&url(ida), Some("Bearer bob")).await.0, 404);
}

#[tokio::test]
async fn concurrent_requests_of_one_conversation_share_one_summary() {
    let mock = start_mock().await;
    mock.state.summary_delay_ms.store(400, Ordering::SeqCst);
    let proxy = start_proxy(windowed(&mock, "agent-model", 4000)).await;
    let session = big_session(13);
    let body = session.body(false);
    let replies =
        futures::future::join_all((0..10).map(|_| send(&proxy, &body, "Bearer k", &[]))).await;
    common::assert_one_shared_checkpoint(&replies);
    assert_eq!(mock.summaries().len(), 1);
}

#[tokio::test]
async fn a_failing_or_hanging_summarizer_never_loses_the_request() {
    for hang in [false, true] {
        let mock = start_mock().await;
        mock.set_window(4000);
        if hang {
            mock.state.summary_hangs.store(true, Ordering::SeqCst);
        } else {
            mock.state.summary_fails.store(true, Ordering::SeqCst);
        }
        let mut cfg = windowed(&mock, "agent-model", 4000);
        cfg.compaction.summary_timeout_ms = 500;
        let proxy = start_proxy(cfg).await;
        let session = big_session(13);
        let started = Instant::now();
        let r = send(&proxy, &session.body(false), "Bearer k", &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(started.elapsed() < Duration::from_secs(10));
        let status = r.header("x-compactor-compaction").unwrap();
        let reason = if hang {
            "summarizer-timeout"
        } else {
            "summarizer-error"
        };
        assert!(
            status.starts_with(&format!("failed; reason={reason}")),
            "{status}"
        );
        assert!(status.ends_with("fallback=dropped-oldest"), "{status}");
        let sent = mock.chats().last().unwrap().json();
        assert!(common::mock_tokens(&sent) <= 4000);
        assert!(sent["messages"][1]["content"]
            .as_str()
            .unwrap()
            .contains("omitted"));
        // The last user message is still there, verbatim.
        assert_eq!(
            sent["messages"].as_array().unwrap().last(),
            session.messages.last()
        );
    }
}

#[tokio::test]
async fn a_request_that_fits_passes_untouched_and_force_compacts() {
    let mock = start_mock().await;
    let proxy = start_proxy(windowed(&mock, "agent-model", 100_000)).await;
    let session = big_session(6);
    let body = session.body(false);
    let r = send(&proxy, &body, "Bearer k", &[]).await;
    assert_eq!(r.header("x-compactor-compacted"), Some("false"));
    assert_eq!(mock.chats()[0].json(), body, "forwarded unchanged");
    let r = send(
        &proxy,
        &body,
        "Bearer k",
        &[
            ("x-compactor-mode", "force"),
            ("x-compactor-instructions", "Mention the parser."),
        ],
    )
    .await;
    assert_eq!(r.header("x-compactor-compacted"), Some("true"));
    let summary = mock.summaries()[0].json();
    assert!(summary["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains("Mention the parser."));
    let r = send(&proxy, &body, "Bearer k", &[("x-compactor-mode", "off")]).await;
    assert_eq!(r.header("x-compactor-compacted"), Some("false"));
}

#[tokio::test]
async fn an_impossible_request_gets_context_length_exceeded() {
    let mock = start_mock().await;
    let proxy = start_proxy(windowed(&mock, "agent-model", 1000)).await;
    let body = json!({"model":"agent-model","messages":[{"role":"system","content":SYSTEM},{"role":"user","content": filler(1, 3000)}]});
    let r = send(&proxy, &body, "Bearer k", &[]).await;
    assert_eq!(r.status, 400);
    let err: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(err["error"]["code"], "context_length_exceeded");
    assert!(err["error"]["message"].as_str().unwrap().contains("1000"));
    assert!(mock.chats().is_empty());
}

/// The real sessions in ../shared/data/conversations, replayed at a 32k window.
#[tokio::test]
async fn real_conversations_fit_a_32k_window() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/conversations");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipped: {} is absent", dir.display());
        return;
    };
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains("_upto_"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for path in files {
        let body: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let model = body["model"].as_str().unwrap().to_string();
        let mock = start_mock().await;
        mock.set_window(32_768);
        let mut cfg = config(&mock.url());
        cfg.windows.insert(model.clone(), 32_768);
        let proxy = start_proxy(cfg).await;
        let started = Instant::now();
        let r = send(&proxy, &body, "Bearer k", &[]).await;
        let elapsed = started.elapsed();
        assert_eq!(r.status, 200, "{}: {}", path.display(), r.body);
        let sent = mock.chats().last().unwrap().json();
        assert!(common::mock_tokens(&sent) <= 32_768);
        let id = r.header("x-compactor-checkpoint").expect("compacted");
        let cp = common::checkpoint(&proxy, id, "Bearer k").await;
        let covered = cp["covered"].as_u64().unwrap() as usize;
        let pinned = cp["pinned_user"].as_u64().map(|p| p as usize);
        let modified: Vec<&str> = cp["files_modified"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let messages = body["messages"].as_array().unwrap();
        for (i, m) in messages[..covered].iter().enumerate() {
            if Some(i) == pinned {
                continue;
            }
            for call in m["tool_calls"].as_array().into_iter().flatten() {
                let name = call["function"]["name"].as_str().unwrap();
                let args: Value =
                    serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
                        .unwrap_or(Value::Null);
                let touched = match name {
                    "edit" | "write" => args["path"].as_str(),
                    "str_replace_editor" if args["command"] != "view" => args["path"].as_str(),
                    _ => None,
                };
                if let Some(p) = touched {
                    assert!(
                        modified.contains(&p),
                        "{}: {p} missing from the modified files",
                        path.display()
                    );
                }
            }
        }
        let summary_ms: u64 = r.header("x-compactor-summary-ms").unwrap().parse().unwrap();
        println!(
            "{}: tokens before {} after {} | summary requests {} | proxy time {:.1} ms (summaries excluded)",
            path.file_name().unwrap().to_string_lossy(),
            r.header("x-compactor-tokens-before").unwrap(),
            r.header("x-compactor-tokens-after").unwrap(),
            mock.summaries().len(),
            (elapsed.as_secs_f64() * 1000.0) - summary_ms as f64,
        );
    }
}

#[tokio::test]
async fn counts_converge_to_the_providers_usage_once_two_tenants_agree() {
    let mock = start_mock().await;
    let proxy = start_proxy(windowed(&mock, "agent-model", 100_000)).await;
    let body = big_session(4).body(false);
    let count = |r: &Reply| {
        r.header("x-compactor-prompt-tokens")
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let observations = async || {
        let facts = proxy.app.engine.store().model_facts("agent-model").await;
        facts.unwrap().observations.len()
    };
    let ours = count(&send(&proxy, &body, "Bearer k", &[]).await);
    common::eventually("one observation", async || observations().await == 1).await;
    // An unknown tokenizer starts neutral, and one tenant's answers do not move it alone.
    assert_eq!(count(&send(&proxy, &body, "Bearer k", &[]).await), ours);
    send(&proxy, &body, "Bearer j", &[]).await;
    common::eventually("two observations", async || observations().await == 2).await;
    let actual = common::mock_tokens(&body);
    assert!(ours > actual * 11 / 10, "{ours} vs {actual}");
    let corrected = count(&send(&proxy, &body, "Bearer third", &[]).await);
    assert!(
        corrected.abs_diff(actual) <= actual / 100,
        "{corrected} vs {actual} (ours {ours})"
    );
}

#[tokio::test]
async fn the_compact_command_runs_the_whole_path_offline() {
    let mock = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("request.json");
    std::fs::write(&file, big_session(13).body(false).to_string()).unwrap();
    let upstream = mock.url();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_compactor"))
            // The summary path: clearing old tool results alone would bring this one under.
            .env("COMPACTOR_COMPACTION__CLEAR_TOOL_RESULTS_FIRST", "false")
            .args([
                "compact",
                file.to_str().unwrap(),
                "--window",
                "4000",
                "--upstream",
                &upstream,
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let rewritten: Value = serde_json::from_slice(&output.stdout).unwrap();
    // The summarizer is the same 4000-token model, so the span is summarized in chunks.
    let summaries = mock.summaries().len();
    assert!(summaries >= 1);
    let summary = rewritten["messages"][1]["content"].as_str().unwrap();
    assert!(
        summary.contains(&format!("SUMMARY-{summaries}")),
        "{summary}"
    );
    assert!(
        stderr.contains("window 4000") && stderr.contains("compacted true"),
        "{stderr}"
    );
}

#[tokio::test]
async fn compactions_that_free_nothing_back_off_after_three() {
    let mock = start_mock().await;
    // Every summary is longer than anything it could replace.
    mock.state
        .summary_padding_words
        .store(20_000, Ordering::SeqCst);
    let proxy = start_proxy(windowed(&mock, "agent-model", 4000)).await;
    let mut session = big_session(16);
    for attempt in 0..5 {
        let r = send(&proxy, &session.body(false), "Bearer k", &[]).await;
        assert_eq!(r.status, 200);
        let status = r
            .header("x-compactor-compaction")
            .unwrap_or_else(|| panic!("attempt {attempt}: {:?}", r.headers));
        if attempt < 3 {
            assert!(
                status.starts_with("failed; reason=no-reduction"),
                "{status}"
            );
            assert_eq!(mock.summaries().len(), attempt + 1);
        } else {
            assert!(
                status.starts_with("skipped; reason=backoff; retry_in_ms=")
                    && status.ends_with("fallback=dropped-oldest"),
                "{status}"
            );
            assert_eq!(mock.summaries().len(), 3, "no more summary requests");
        }
        session.assistant("ok");
        session.user(100 + attempt);
        session.tool_round(100 + attempt);
    }
    // An explicit /compact still tries.
    let r = send(
        &proxy,
        &session.body(false),
        "Bearer k",
        &[("x-compactor-mode", "force")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(mock.summaries().len(), 4);
}

#[tokio::test]
async fn an_admin_token_reads_any_checkpoint_and_a_configured_key_replaces_the_clients() {
    let mock = start_mock().await;
    let mut cfg = windowed(&mock, "agent-model", 4000);
    cfg.admin_token = "admin-secret".into();
    // SAFETY of the test: the variable name is unique to this test.
    std::env::set_var("COMPACTOR_TEST_UPSTREAM_KEY", "sk-configured");
    cfg.upstream_key_env = "COMPACTOR_TEST_UPSTREAM_KEY".into();
    let proxy = start_proxy(cfg).await;
    let r = send(
        &proxy,
        &big_session(13).body(false),
        "Bearer client-key",
        &[],
    )
    .await;
    let id = r.header("x-compactor-checkpoint").unwrap();
    for recorded in mock.chats().iter().chain(mock.summaries().iter()) {
        assert_eq!(recorded.headers["authorization"], "Bearer sk-configured");
    }
    let url = format!("{}/compactor/v1/checkpoints/{id}", proxy.url());
    let get = |auth: &'static str| {
        let url = url.clone();
        async move { common::get(&url, Some(auth)).await.0 }
    };
    assert_eq!(get("Bearer admin-secret").await, 200);
    assert_eq!(get("Bearer client-key").await, 200);
    assert_eq!(get("Bearer someone-else").await, 404);
}

// ---------------------------------------------------------------------------------------------
// Shutdown during a summary
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_client_waiting_for_a_summary_when_the_grace_runs_out_is_answered_503() {
    let mock = start_mock().await;
    mock.set_window(4000);
    mock.state.summary_hangs.store(true, Ordering::SeqCst);
    let app = compactor::server::build(&windowed(&mock, "agent-model", 4000))
        .await
        .unwrap();
    let mut proxy = common::start_app_with_grace(app, Duration::from_secs(1)).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let body = big_session(13).body(false).to_string();
    let waiting = tokio::spawn(async move {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
            .post(url)
            .header("authorization", "Bearer k")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
    });
    common::eventually("the summary to start", async || {
        !mock.summaries().is_empty()
    })
    .await;
    proxy.stopped().await;
    let reply = Reply::read(
        waiting
            .await
            .unwrap()
            .expect("the waiting client got no answer"),
    )
    .await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(
        reply.json()["error"]["code"],
        "overloaded",
        "{}",
        reply.body
    );
    assert!(mock.chats().is_empty(), "nothing was forwarded");
}

#[tokio::test]
async fn a_summary_that_finishes_during_the_drain_is_kept() {
    let mock = start_mock().await;
    mock.set_window(4000);
    mock.state.summary_delay_ms.store(1000, Ordering::SeqCst);
    let mut cfg = windowed(&mock, "agent-model", 4000);
    cfg.compaction.ahead_of_time = true;
    // Half the input's room: a turn never jumps from below the soft threshold to past the
    // window.
    cfg.compaction.soft_threshold = 0.5;
    let app = compactor::server::build(&cfg).await.unwrap();
    let mut proxy = common::start_app_with_grace(app, Duration::from_secs(10)).await;
    // The conversation grows until it passes the soft threshold: its next summary is written
    // in the background, and its client, answered, has nothing open.
    let mut session = Session::new("agent-model");
    for t in 0.. {
        session.user(t);
        let r = send(&proxy, &session.body(false), "Bearer k", &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-compactor-compacted"), Some("false"));
        if !mock.summaries().is_empty() {
            break;
        }
        session.tool_round(t);
        session.assistant("ok");
    }
    proxy.stopped().await;
    let metrics = proxy.app.metrics.render();
    assert!(
        metrics.contains("compactor_compactions_total{trigger=\"ahead_of_time\"} 1"),
        "{metrics}"
    );
}

/// What identifies a chat message whatever a truncation did to its content: its role, the call
/// it answers and the calls it makes, and its content when it has no ids.
fn message_key(m: &Value) -> String {
    let calls: Vec<&str> = m["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["id"].as_str())
        .collect();
    let id = m["tool_call_id"].as_str().unwrap_or("");
    let content = if calls.is_empty() && id.is_empty() {
        m["content"].to_string()
    } else {
        String::new()
    };
    format!("{}|{id}|{}|{content}", m["role"], calls.join(","))
}

/// The shared Pi session replayed request by request at a 16k window, as its client sent it
/// (each request is the history up to an assistant message): every forwarded request ends with
/// the client's last message, and what follows the summary keeps the client's order, however
/// large the newest turn (the session writes files of up to 64 KB in one call).
#[tokio::test]
async fn a_replayed_session_keeps_the_clients_tail_at_16k() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data/conversations/pi_before-compaction_upto_user038.json");
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!("skipped: {} is absent", path.display());
        return;
    };
    let session: Value = serde_json::from_slice(&bytes).unwrap();
    let model = session["model"].as_str().unwrap().to_string();
    let messages = session["messages"].as_array().unwrap();
    let mock = start_mock().await;
    mock.set_window(16_384);
    let mut cfg = config(&mock.url());
    cfg.windows.insert(model.clone(), 16_384);
    let proxy = start_proxy(cfg).await;
    let ends: Vec<usize> = (1..messages.len())
        .filter(|&k| messages[k]["role"] == "assistant")
        .collect();
    let (mut compacted, mut differs, mut cut_last) = (0, vec![], 0);
    let started = Instant::now();
    for &k in &ends {
        let client = &messages[..k];
        let body = json!({"model": model, "messages": client, "tools": session["tools"]});
        let before = mock.chats().len();
        let r = send(&proxy, &body, "Bearer k", &[]).await;
        assert_eq!(r.status, 200, "request of {k} messages: {}", r.body);
        let sent = mock.chats()[before..].last().unwrap().json();
        let forwarded = sent["messages"].as_array().unwrap();
        let Some(summary_at) = forwarded.iter().position(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.contains("<summary>"))
        }) else {
            assert_eq!(forwarded.len(), k, "an uncompacted request goes as it came");
            continue;
        };
        compacted += 1;
        // Each element after the summary is a client element later than the one before it.
        let mut at = 0;
        let mut in_order = true;
        for m in &forwarded[summary_at + 1..] {
            let key = message_key(m);
            match (at..k).find(|&i| message_key(&client[i]) == key) {
                Some(i) => at = i + 1,
                None => in_order = false,
            }
        }
        let last = forwarded.last().unwrap();
        if !in_order || at != k {
            differs.push(k);
        } else if *last != client[k - 1] {
            cut_last += 1;
        }
    }
    println!(
        "{}: {} requests, {compacted} compacted, {} with a forwarded tail other than the client's {differs:?}, {cut_last} ending with the client's last message cut in place; {:.1} s",
        path.file_name().unwrap().to_string_lossy(),
        ends.len(),
        differs.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(compacted > 0);
    assert!(
        differs.is_empty(),
        "requests (by length) whose tail is not the client's: {differs:?}"
    );
}
