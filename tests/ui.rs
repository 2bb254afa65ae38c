//! The conversation page in a real browser: a conversation driven past its window through the
//! mock provider, then `/compactor/ui` opened in headless Chromium (driven by Playwright,
//! `tests/ui/page.mjs`) as a person would: the key typed in, the conversation picked from the
//! list, the chart's points and compaction marks counted against the requests made, a
//! compaction opened from its mark and its summary read. A screenshot is kept under the target
//! directory (`tmp/ui/conversation.png`).
//!
//! Needs `/usr/bin/chromium` (Debian's `chromium`) and `npm ci` in `tests/ui` (`.ci/run` does
//! both). Without them the test says so loudly and passes, except under CI (`CI` set), where
//! it fails.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::agent_session::{checkpoint_changes, AgentSession};
use common::{config, get_json, start_mock, start_proxy};
use serde_json::Value;

const CHROMIUM: &str = "/usr/bin/chromium";
const WINDOW: u64 = 4000;
const KEY: &str = "sk-ui-test";

/// What the browser test needs and is missing, if anything.
fn missing(ui: &Path) -> Option<String> {
    if !Path::new(CHROMIUM).exists() {
        return Some(format!("{CHROMIUM} (apt-get install chromium)"));
    }
    if std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_err()
    {
        return Some("node (apt-get install nodejs npm)".into());
    }
    if !ui.join("node_modules/playwright-core").exists() {
        return Some(format!(
            "playwright-core (npm ci --prefix {})",
            ui.display()
        ));
    }
    None
}

#[tokio::test]
async fn the_page_charts_a_conversation_past_its_window_and_opens_its_compactions() {
    let ui = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui");
    if let Some(what) = missing(&ui) {
        let message = format!("the browser test of /compactor/ui cannot run: missing {what}");
        assert!(std::env::var_os("CI").is_none(), "{message}");
        eprintln!("\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
        eprintln!("!!! SKIPPED: {message}");
        eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n");
        return;
    }

    let mock = start_mock().await;
    mock.set_window(WINDOW);
    let mut c = config(&mock.url());
    c.windows.insert("agent-model".into(), WINDOW);
    c.summarizer.window = 200_000;
    let proxy = start_proxy(c).await;
    let auth = format!("Bearer {KEY}");
    let mut session = AgentSession::new("agent-model", "You are a coding agent.");
    let replies = session.drive(&proxy, ("authorization", &auth), 30).await;
    let id = replies[0]
        .header("x-compactor-conversation")
        .unwrap()
        .to_string();
    let changes = checkpoint_changes(&replies);
    assert!(
        changes.len() >= 2,
        "the conversation compacted only at {changes:?}"
    );
    let url = format!("{}/compactor/v1/conversations/{id}", proxy.url());
    common::eventually("every request recorded", async || {
        get_json(&url, Some(&auth)).await["requests"]
            .as_array()
            .map_or(0, Vec::len)
            == replies.len()
    })
    .await;

    let screenshot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui/conversation.png");
    std::fs::create_dir_all(screenshot.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&screenshot);
    let run = tokio::process::Command::new("node")
        .arg(ui.join("page.mjs"))
        .env("UI_BASE", proxy.url())
        .env("UI_KEY", KEY)
        .env("UI_CONVERSATION", &id)
        .env("UI_SCREENSHOT", &screenshot)
        .env("CHROMIUM", CHROMIUM)
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the browser finished within 2 minutes")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the page script failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    eprintln!("the browser saw: {seen}");
    eprintln!("screenshot: {}", screenshot.display());

    assert_eq!(seen["listed"], 1, "the key's one conversation is listed");
    assert_eq!(seen["sent_points"], replies.len());
    assert_eq!(seen["forwarded_points"], replies.len());
    assert_eq!(seen["request_rows"], replies.len());
    assert_eq!(seen["window_lines"], 1);
    assert_eq!(seen["marks"], changes.len());
    let marked: Vec<usize> = seen["mark_requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap() as usize - 1)
        .collect();
    assert_eq!(marked, changes, "each compaction is marked at its request");
    // The newest compaction, opened from its mark, shows the summary the provider wrote for it.
    let newest = replies.last().unwrap().header("x-compactor-checkpoint");
    assert_eq!(seen["opened"].as_str(), newest);
    assert_eq!(seen["opened_is_open"], true);
    let stored = common::checkpoint(&proxy, newest.unwrap(), &auth).await;
    let summary = seen["summary"].as_str().unwrap();
    assert!(summary.contains("SUMMARY-"), "{summary}");
    assert!(
        stored["summary"]
            .as_str()
            .unwrap()
            .starts_with(summary.trim()),
        "the page shows the stored summary's own text"
    );
    assert!(seen["code_sections"].as_u64().unwrap() >= 1);
    assert!(seen["files_listed"].as_u64().unwrap() >= 2);
    assert_eq!(seen["requests_to_other_hosts"], serde_json::json!([]));
    assert_eq!(seen["console_errors"], serde_json::json!([]));
    let png = std::fs::read(&screenshot).expect("the screenshot was saved");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
}
