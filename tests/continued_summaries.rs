//! Summary requests that continue the conversation (`summarizer.continue_conversation`): the
//! engine asks its summarizer with the request as it was last forwarded, cut where the summary
//! ends, so a provider that caches prompts reads that prefix instead of a fresh transcript; a
//! continuation that fails gives way to a standalone request, and a summarizer that is not the
//! conversation's own provider or model is always asked standalone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use compactor::compaction::{Engine, Parts, Prepared, RequestContext, Summarizer, SummarizerError};
use compactor::config::{CompactionConfig, Config, ContinueConversation, SummarizerConfig};
use compactor::dialect::chat::request::ChatRequest;
use compactor::dialect::chat::Chat;
use compactor::dialect::{Dialect, SummaryRequest, WireRequest};
use compactor::identity;
use compactor::measure::{windows::WindowTable, Meter};
use compactor::metrics::Metrics;
use compactor::store::{memory::MemoryStore, CheckpointStore};
use serde_json::{json, Value};

const MODEL: &str = "continued-test-model";
const WINDOW: u64 = 8000;

/// One summary request as received: its user message, and the conversation it continues.
#[derive(Debug, Clone)]
struct Received {
    user: String,
    conversation: Option<Value>,
    /// The body the chat dialect writes for it.
    written: Value,
}

#[derive(Clone, Copy, PartialEq)]
enum Answer {
    Summary,
    /// Refused, as a provider that rejects the request would.
    Refused,
    /// Its own instructions echoed back, as small models do.
    Echo,
}

struct Recording {
    continues: bool,
    /// What a continuation is answered with.
    continuations: Answer,
    received: Mutex<Vec<Received>>,
}

#[async_trait::async_trait]
impl Summarizer for Recording {
    async fn summarize(
        &self,
        request: &SummaryRequest<'_>,
        _credentials: &http::HeaderMap,
    ) -> Result<String, SummarizerError> {
        let received = Received {
            user: request.user.to_string(),
            conversation: request
                .conversation
                .map(|body| serde_json::from_slice(body).unwrap()),
            written: Chat.summary_request(request),
        };
        let n = {
            let mut all = self.received.lock().unwrap();
            all.push(received);
            all.len()
        };
        if request.conversation.is_some() {
            match self.continuations {
                Answer::Refused => return Err(SummarizerError::Status(400)),
                Answer::Echo => return Ok(request.user.to_string()),
                Answer::Summary => {}
            }
        }
        Ok(format!("## Goal\nsummary number {n}"))
    }

    fn continues_conversations(&self) -> bool {
        self.continues
    }
}

struct Setup {
    engine: Arc<Engine>,
    summarizer: Arc<Recording>,
    metrics: Arc<Metrics>,
}

fn setup(continues: bool, continuations: Answer, summary_model: &str) -> Setup {
    let config = CompactionConfig {
        ahead_of_time: false,
        clear_tool_results_first: false,
        ..CompactionConfig::default()
    };
    let summarizer_config = SummarizerConfig {
        model: summary_model.to_string(),
        ..SummarizerConfig::default()
    };
    let summarizer = Arc::new(Recording {
        continues,
        continuations,
        received: Mutex::new(Vec::new()),
    });
    let metrics = Arc::new(Metrics::default());
    let windows = BTreeMap::from([(MODEL.to_string(), WINDOW)]);
    let parts = Parts {
        store: Arc::new(MemoryStore::default()) as Arc<dyn CheckpointStore>,
        meter: Meter::new(10_000),
        windows: WindowTable::new(&windows, 128_000),
        summary_writer: summarizer.clone(),
        metrics: metrics.clone(),
    };
    Setup {
        engine: Arc::new(Engine::new(config, summarizer_config, parts)),
        summarizer,
        metrics,
    }
}

/// A session of `turns` user turns of about 300 tokens each, with tools and a system prompt.
fn session(turns: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "You are a careful engineer."})];
    for t in 0..turns {
        let words: String = (0..60).map(|w| format!("w{t}x{w} ")).collect();
        messages.push(json!({"role": "user", "content": format!("turn {t}: {words}")}));
        messages.push(json!({"role": "assistant", "content": format!("done with turn {t}")}));
    }
    messages.push(json!({"role": "user", "content": "what next?"}));
    messages
}

fn body(messages: &[Value]) -> Value {
    json!({
        "model": MODEL,
        "stream": true,
        "max_tokens": 1000,
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {}}}],
        "messages": messages,
    })
}

async fn prepare(setup: &Setup, messages: &[Value]) -> Prepared {
    let request: Arc<dyn WireRequest> =
        Arc::new(ChatRequest::parse(body(messages).to_string().as_bytes()).unwrap());
    let context = RequestContext {
        tenant: identity::tenant("Bearer continued"),
        ..RequestContext::default()
    };
    setup.engine.prepare(&context, &request).await.unwrap()
}

fn sent(prepared: &Prepared) -> Value {
    serde_json::from_slice(&prepared.body).unwrap()
}

fn continuations(setup: &Setup, result: &str) -> u64 {
    let line = format!("compactor_summary_continuations_total{{result=\"{result}\"}} ");
    setup
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&line)?.trim().parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

#[tokio::test]
async fn each_summary_continues_the_prompt_forwarded_before_it() {
    let setup = setup(true, Answer::Summary, "");
    // Grown past the window: the first compaction continues the conversation as the client
    // sent it so far.
    let first = session(30);
    let through_first = prepare(&setup, &first).await;
    assert!(through_first.outcome.compacted);
    let received = setup.summarizer.received.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "one summary request");
    let continued = received[0].conversation.clone().expect("a continuation");
    let prefix = continued["messages"].as_array().unwrap();
    assert!(prefix.len() >= 3, "the older turns: {}", prefix.len());
    assert_eq!(
        &first[..prefix.len()],
        &prefix[..],
        "the client's own messages"
    );
    assert_eq!(continued["tools"], body(&first)["tools"], "tools as sent");
    // The request written for the provider: that conversation, then the instructions; asked
    // whole, within the summary's budget.
    let written = &received[0].written;
    let messages = written["messages"].as_array().unwrap();
    assert_eq!(&messages[..prefix.len()], &prefix[..]);
    assert_eq!(messages.len(), prefix.len() + 1);
    assert_eq!(messages.last().unwrap()["role"], "user");
    assert_eq!(
        messages.last().unwrap()["content"],
        received[0].user.as_str()
    );
    assert!(received[0].user.contains("do not call any tool"));
    assert!(received[0].user.contains("## Critical context"));
    assert_eq!(written["stream"], false);
    assert!(written["max_tokens"].as_u64().unwrap() < 1000);
    assert_eq!(written["tools"], body(&first)["tools"]);

    // Grown on, request by request: each later summary continues the request forwarded just
    // before it (through the checkpoint before), summary message included, byte for byte up to
    // where it cuts.
    let longer = session(90);
    let mut forwarded = sent(&through_first);
    let mut continued_after_a_summary = 0;
    for end in (first.len() + 2..=longer.len()).step_by(2) {
        let asked = setup.summarizer.received.lock().unwrap().len();
        let prepared = prepare(&setup, &longer[..end]).await;
        let received = setup.summarizer.received.lock().unwrap().clone();
        if received.len() > asked {
            let latest = received.last().unwrap();
            let continued = latest.conversation.clone().expect("a continuation");
            let prefix = continued["messages"].as_array().unwrap();
            let before = forwarded["messages"].as_array().unwrap();
            assert!(prefix.len() > 2 && prefix.len() <= before.len());
            assert_eq!(
                &before[..prefix.len()],
                &prefix[..],
                "the prefix already forwarded"
            );
            let opening = prefix[1]["content"].as_str().unwrap();
            assert!(
                opening.contains(&format!("summary number {asked}")),
                "the previous summary is part of it: {opening}"
            );
            assert!(latest.user.contains("opens with a summary"));
            // The new summary replaces the old one in what is forwarded.
            let now = sent(&prepared);
            let summary = now["messages"][1]["content"].as_str().unwrap();
            assert!(summary.contains(&format!("summary number {}", asked + 1)));
            continued_after_a_summary += 1;
        }
        forwarded = sent(&prepared);
    }
    assert!(
        continued_after_a_summary >= 2,
        "summaries after the first: {continued_after_a_summary}"
    );
    let all = setup.summarizer.received.lock().unwrap().len() as u64;
    assert_eq!(continuations(&setup, "used"), all);
    assert_eq!(continuations(&setup, "fell_back"), 0);
}

#[tokio::test]
async fn a_continuation_refused_gives_way_to_a_standalone_request() {
    let setup = setup(true, Answer::Refused, "");
    let prepared = prepare(&setup, &session(30)).await;
    assert!(prepared.outcome.compacted, "the compaction still happens");
    let received = setup.summarizer.received.lock().unwrap().clone();
    assert_eq!(
        received.len(),
        2,
        "the continuation, then a request of its own"
    );
    assert!(received[0].conversation.is_some());
    assert!(received[1].conversation.is_none());
    assert!(received[1].user.contains("<transcript>"));
    let written = &received[1].written;
    assert_eq!(written["messages"][0]["role"], "system");
    assert!(
        written.get("tools").is_none(),
        "no tools in a standalone request"
    );
    assert!(sent(&prepared)["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains("summary number 2"));
    assert_eq!(continuations(&setup, "fell_back"), 1);
    assert_eq!(continuations(&setup, "used"), 0);
}

#[tokio::test]
async fn a_continuation_answered_with_its_own_instructions_gives_way_too() {
    let setup = setup(true, Answer::Echo, "");
    let prepared = prepare(&setup, &session(30)).await;
    let received = setup.summarizer.received.lock().unwrap().clone();
    assert_eq!(received.len(), 2);
    assert!(
        received[1].conversation.is_none(),
        "then a request of its own"
    );
    let summary = sent(&prepared)["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(summary.contains("summary number 2"), "{summary}");
    assert!(!summary.contains("do not call any tool"), "no echo stored");
    assert_eq!(continuations(&setup, "fell_back"), 1);
}

#[tokio::test]
async fn only_the_conversations_own_provider_and_model_are_asked_to_continue() {
    // A summarizer that is not the conversation's provider.
    let other_provider = setup(false, Answer::Summary, "");
    assert!(
        prepare(&other_provider, &session(30))
            .await
            .outcome
            .compacted
    );
    // The conversation's provider, but another model.
    let other_model = setup(true, Answer::Summary, "a-cheaper-model");
    assert!(prepare(&other_model, &session(30)).await.outcome.compacted);
    for setup in [other_provider, other_model] {
        let received = setup.summarizer.received.lock().unwrap().clone();
        assert_eq!(received.len(), 1);
        assert!(received[0].conversation.is_none(), "standalone");
        assert!(received[0].user.contains("<transcript>"));
        assert_eq!(continuations(&setup, "used"), 0);
    }
}

#[test]
fn auto_continues_toward_first_party_apis_only() {
    let config = |upstream: &str, anthropic: &str, summarizer: &str, mode| Config {
        upstream: upstream.into(),
        anthropic_upstream: anthropic.into(),
        summarizer: SummarizerConfig {
            upstream: summarizer.into(),
            continue_conversation: mode,
            ..SummarizerConfig::default()
        },
        ..Config::default()
    };
    let openai = "https://api.openai.com/v1";
    let anthropic = "https://api.anthropic.com";
    let local = "http://127.0.0.1:8080/v1";
    use ContinueConversation::*;
    assert_eq!(
        config(openai, anthropic, "", Auto).summaries_continue(),
        (true, true)
    );
    assert_eq!(
        config(local, "http://127.0.0.1:8080", "", Auto).summaries_continue(),
        (false, false)
    );
    assert_eq!(
        config(local, anthropic, "", Auto).summaries_continue(),
        (false, true)
    );
    assert_eq!(
        config(local, local, "", Always).summaries_continue(),
        (true, true)
    );
    assert_eq!(
        config(openai, anthropic, "", Never).summaries_continue(),
        (false, false)
    );
    // A summarizer of its own is another provider: never.
    assert_eq!(
        config(openai, anthropic, openai, Always).summaries_continue(),
        (false, false)
    );
}
