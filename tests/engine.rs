//! The compaction engine driven directly, without sockets: a canned summarizer, the memory
//! store and paused time, so waiting for summaries and timeouts costs no real time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use compactor::compaction::{
    Engine, Mode, Parts, Prepared, Refusal, RequestContext, Status, Summarizer, SummarizerError,
    SummaryError,
};
use compactor::config::{CompactionConfig, SummarizerConfig};
use compactor::dialect::chat::request::ChatRequest;
use compactor::dialect::{SummaryRequest, WireRequest};
use compactor::identity;
use compactor::measure::{windows::WindowTable, Meter};
use compactor::metrics::Metrics;
use compactor::store::{memory::MemoryStore, Checkpoint, CheckpointStore};
use serde_json::{json, Value};

const MODEL: &str = "engine-test-model";
const WINDOW: u64 = 8000;

/// What the canned summarizer does.
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    /// Answers a short summary after `delay`.
    Answer {
        delay: Duration,
    },
    /// Answers a short summary wrapped in the summary request's own markup, as small models do.
    Echoing,
    /// Answers a summary longer than anything it replaces.
    Bloated,
    Fail,
    /// Fails after `delay`.
    FailAfter {
        delay: Duration,
    },
    Hang,
    /// Refuses, as a provider does, any request whose user prompt is longer than `limit`
    /// tokens: its context window; answers the others.
    OverflowAbove {
        limit: u64,
    },
}

struct Canned {
    behaviour: Mutex<Behaviour>,
    calls: AtomicUsize,
    /// Summaries being written now, and the most at once.
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// The user prompts received, in order.
    prompts: Mutex<Vec<String>>,
}

impl Canned {
    fn new(behaviour: Behaviour) -> Arc<Canned> {
        Arc::new(Canned {
            behaviour: Mutex::new(behaviour),
            calls: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            prompts: Mutex::new(Vec::new()),
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Summarizer for Canned {
    async fn summarize(
        &self,
        request: &SummaryRequest<'_>,
        _credentials: &http::HeaderMap,
    ) -> Result<String, SummarizerError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.prompts.lock().unwrap().push(request.user.to_string());
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let _done = InFlight(&self.in_flight);
        let behaviour = *self.behaviour.lock().unwrap();
        match behaviour {
            Behaviour::Answer { delay } => {
                tokio::time::sleep(delay).await;
                Ok(format!("## Goal\nsummary number {n}"))
            }
            Behaviour::Echoing => Ok(format!(
                "<previous-summary>\n## Goal\nsummary number {n}\n</previous-summary>\n\
                 <transcript>\n## Next steps\n</transcript>\nHeadings:\n## Goal\n## Done"
            )),
            Behaviour::Bloated => Ok(format!("## Goal\n{}", "padding ".repeat(40_000))),
            Behaviour::Fail => Err(SummarizerError::Status(500)),
            Behaviour::FailAfter { delay } => {
                tokio::time::sleep(delay).await;
                Err(SummarizerError::Status(503))
            }
            Behaviour::Hang => std::future::pending().await,
            Behaviour::OverflowAbove { limit } => {
                let tokens = compactor::tokenizer::Encoding::O200k.count(request.user);
                if tokens > limit {
                    return Err(SummarizerError::Overflow(compactor::dialect::Overflow {
                        limit: Some(limit),
                        requested: Some(tokens),
                        trusted: true,
                    }));
                }
                Ok(format!("## Goal\nsummary number {n}"))
            }
        }
    }
}

/// Counts a summary as finished when dropped (also when its future is cancelled).
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Setup {
    engine: Arc<Engine>,
    summarizer: Arc<Canned>,
    store: Arc<MemoryStore>,
    metrics: Arc<Metrics>,
}

fn setup(
    behaviour: Behaviour,
    tune: impl FnOnce(&mut CompactionConfig, &mut SummarizerConfig),
) -> Setup {
    let mut config = CompactionConfig {
        ahead_of_time: false,
        summary_timeout_ms: 30_000,
        ..CompactionConfig::default()
    };
    // One summary call per span unless a test narrows the summarizer's window.
    let mut summarizer_config = SummarizerConfig {
        window: 1_000_000,
        ..SummarizerConfig::default()
    };
    tune(&mut config, &mut summarizer_config);
    let summarizer = Canned::new(behaviour);
    let store = Arc::new(MemoryStore::default());
    let windows = BTreeMap::from([(MODEL.to_string(), WINDOW)]);
    let metrics = Arc::new(Metrics::default());
    let parts = Parts {
        store: store.clone() as Arc<dyn CheckpointStore>,
        meter: Meter::new(10_000),
        windows: WindowTable::new(&windows, 128_000),
        summary_writer: summarizer.clone(),
        metrics: metrics.clone(),
    };
    let engine = Arc::new(Engine::new(config, summarizer_config, parts));
    Setup {
        engine,
        summarizer,
        store,
        metrics,
    }
}

/// A coding session of `turns` user turns, each about 300 tokens.
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

fn chat_request(messages: &[Value]) -> ChatRequest {
    ChatRequest::parse(
        json!({"model": MODEL, "messages": messages})
            .to_string()
            .as_bytes(),
    )
    .unwrap()
}

fn request(messages: &[Value]) -> Arc<dyn WireRequest> {
    Arc::new(chat_request(messages))
}

fn context() -> RequestContext {
    RequestContext {
        tenant: identity::tenant("Bearer engine"),
        ..RequestContext::default()
    }
}

async fn prepare(setup: &Setup, messages: &[Value]) -> Prepared {
    prepare_as(setup, &context(), &request(messages))
        .await
        .unwrap()
}

/// The compaction a client asks for, of all of `messages`.
async fn compact_whole(setup: &Setup, messages: &[Value]) -> Result<Checkpoint, SummaryError> {
    let request = request(messages);
    setup.engine.compact_whole(&context(), &request).await
}

/// Every call to the engine goes through here.
async fn prepare_as(
    setup: &Setup,
    context: &RequestContext,
    request: &Arc<dyn WireRequest>,
) -> Result<Prepared, Refusal> {
    setup.engine.prepare(context, request).await
}

fn sent_messages(prepared: &Prepared) -> Vec<Value> {
    let body: Value = serde_json::from_slice(&prepared.body).unwrap();
    body["messages"].as_array().unwrap().clone()
}

async fn checkpoints(setup: &Setup) -> usize {
    stored(setup).await.len()
}

/// The checkpoints stored for the conversation [`session`] starts.
async fn stored(setup: &Setup) -> Arc<Vec<Checkpoint>> {
    let anchor = {
        let req = request(&session(1));
        let meter = Meter::new(16);
        let measured = meter.measure(req.as_ref());
        let chain = identity::chain(
            &context().tenant,
            measured.elements.iter().map(|m| m.canonical),
        );
        identity::hex(&chain[1])
    };
    setup.store.for_anchor(&anchor).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_request_that_fits_is_sent_as_it_came() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::ZERO,
        },
        |_, _| {},
    );
    let messages = session(3);
    let prepared = prepare(&setup, &messages).await;
    assert!(!prepared.outcome.compacted);
    assert_eq!(sent_messages(&prepared), messages);
    assert_eq!(setup.summarizer.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_of_one_conversation_share_one_summary() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::from_secs(5),
        },
        |_, _| {},
    );
    let messages = session(40);
    let started = tokio::time::Instant::now();
    let all = futures::future::join_all((0..8).map(|_| prepare(&setup, &messages))).await;
    assert_eq!(setup.summarizer.calls(), 1, "single flight");
    assert!(all
        .iter()
        .all(|p| p.outcome.compacted && p.outcome.status.is_none()));
    assert_eq!(all.iter().filter(|p| p.outcome.summarized).count(), 1);
    let ids: Vec<_> = all
        .iter()
        .map(|p| p.outcome.checkpoint_id.clone())
        .collect();
    assert!(ids.iter().all(|id| id.is_some() && *id == ids[0]));
    // The waiters were served as soon as the one summary was ready.
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_stored_checkpoint_serves_the_next_turns_without_a_new_summary() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::ZERO,
        },
        |_, _| {},
    );
    let mut messages = session(40);
    let first = prepare(&setup, &messages).await;
    assert!(first.outcome.summarized);
    messages.push(json!({"role": "assistant", "content": "on it"}));
    messages.push(json!({"role": "user", "content": "and then?"}));
    let second = prepare(&setup, &messages).await;
    assert_eq!(setup.summarizer.calls(), 1);
    assert!(second.outcome.compacted && !second.outcome.summarized);
    assert_eq!(second.outcome.checkpoint_id, first.outcome.checkpoint_id);
    let sent = sent_messages(&second);
    assert_eq!(sent[0], messages[0], "the system message stays first");
    assert!(sent[1]["content"]
        .as_str()
        .unwrap()
        .contains("summary number 1"));
    assert_eq!(sent.last().unwrap(), messages.last().unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_failing_summarizer_never_loses_the_request() {
    let setup = setup(Behaviour::Fail, |_, _| {});
    let messages = session(40);
    let prepared = prepare(&setup, &messages).await;
    assert_eq!(
        prepared.outcome.status,
        Some(Status::Failed {
            reason: "summarizer-error".into(),
            fallback: "dropped-oldest",
        })
    );
    let sent = sent_messages(&prepared);
    assert_eq!(sent[0], messages[0]);
    assert_eq!(sent.last().unwrap(), messages.last().unwrap());
    assert!(sent[1]["content"]
        .as_str()
        .unwrap()
        .contains("[Context trimmed]"));
    assert_eq!(
        checkpoints(&setup).await,
        0,
        "a failed summary is never stored"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_summarizer_times_out_and_the_request_is_served() {
    let setup = setup(Behaviour::Hang, |c, _| c.summary_timeout_ms = 20_000);
    let started = tokio::time::Instant::now();
    let prepared = prepare(&setup, &session(40)).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(20) && waited < Duration::from_secs(21),
        "{waited:?}"
    );
    assert!(matches!(
        prepared.outcome.status,
        Some(Status::Failed { ref reason, .. }) if reason == "summarizer-timeout"
    ));
    assert!(
        prepared.outcome.compacted,
        "served with its oldest turns dropped"
    );
    assert_eq!(
        setup.metrics.summaries_in_progress.get(),
        0,
        "a summary that timed out is no longer counted as in progress"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_waiting_for_another_summary_is_served_within_the_timeout() {
    let setup = setup(Behaviour::Hang, |c, _| c.summary_timeout_ms = 3_000);
    let messages = session(40);
    let first = {
        let engine = setup.engine.clone();
        let messages = messages.clone();
        tokio::spawn(async move {
            engine
                .prepare(&context(), &request(&messages))
                .await
                .unwrap()
        })
    };
    // The second request arrives while the first one's summary is being written, and waits
    // for it; that summary times out, and the wait must not start a fresh timeout.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = tokio::time::Instant::now();
    let second = prepare(&setup, &messages).await;
    let waited = started.elapsed();
    assert!(waited <= Duration::from_secs(3), "{waited:?}");
    for prepared in [&second, &first.await.unwrap()] {
        assert!(matches!(
            prepared.outcome.status,
            Some(Status::Failed { ref reason, .. }) if reason == "summarizer-timeout"
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn draining_starts_no_summary_but_lets_a_running_one_finish_and_serve() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::from_secs(5),
        },
        |c, _| {
            c.ahead_of_time = true;
            c.soft_threshold = 0.5;
        },
    );
    let messages = session(40);
    let first = {
        let engine = setup.engine.clone();
        let messages = messages.clone();
        tokio::spawn(async move {
            engine
                .prepare(&context(), &request(&messages))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(setup.summarizer.calls(), 1);
    setup.engine.drain();
    // A request of the same conversation waits for the summary being written.
    let waiting = prepare(&setup, &messages).await;
    assert!(waiting.outcome.compacted && waiting.outcome.status.is_none());
    assert!(first.await.unwrap().outcome.summarized);
    setup.engine.summaries_finished().await;
    assert_eq!(checkpoints(&setup).await, 1, "the summary was stored");
    // Another conversation over the limit is served without a new summary, and one past the
    // soft threshold starts none in the background.
    let other = |turns| -> Vec<Value> {
        session(turns)
            .into_iter()
            .map(|mut m| {
                m["content"] = json!(format!("other {}", m["content"].as_str().unwrap()));
                m
            })
            .collect()
    };
    let refused = prepare(&setup, &other(40)).await;
    assert_eq!(
        refused.outcome.status,
        Some(Status::Failed {
            reason: "draining".into(),
            fallback: "dropped-oldest",
        })
    );
    let below = prepare(&setup, &other(14)).await;
    assert!(!below.outcome.compacted);
    setup.engine.summaries_finished().await;
    assert_eq!(setup.summarizer.calls(), 1);
    assert_eq!(setup.metrics.compaction_failures.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn compactions_that_free_nothing_stop_being_tried() {
    let setup = setup(Behaviour::Bloated, |c, _| {
        c.max_unproductive_compactions = 3
    });
    let messages = session(40);
    for _ in 0..3 {
        let prepared = prepare(&setup, &messages).await;
        assert!(
            matches!(
                prepared.outcome.status,
                Some(Status::Failed { ref reason, .. }) if reason == "no-reduction"
            ),
            "{:?}",
            prepared.outcome.status
        );
    }
    assert_eq!(setup.summarizer.calls(), 3);
    let prepared = prepare(&setup, &messages).await;
    assert!(
        matches!(
            prepared.outcome.status,
            Some(Status::BackingOff {
                fallback: "dropped-oldest",
                ..
            })
        ),
        "{:?}",
        prepared.outcome.status
    );
    assert_eq!(
        setup.summarizer.calls(),
        3,
        "the guard stops calling the summarizer"
    );
    // Asking explicitly still compacts.
    let forced = RequestContext {
        mode: Mode::Force,
        ..context()
    };
    *setup.summarizer.behaviour.lock().unwrap() = Behaviour::Answer {
        delay: Duration::ZERO,
    };
    let prepared = prepare_as(&setup, &forced, &request(&messages))
        .await
        .unwrap();
    assert!(prepared.outcome.summarized);
}

#[tokio::test(start_paused = true)]
async fn a_summary_prepared_ahead_of_time_serves_the_crossing_request() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::from_secs(3),
        },
        |c, _| {
            c.ahead_of_time = true;
            c.soft_threshold = 0.5;
        },
    );
    // Past the soft threshold, still fitting: sent as is, a summary starts in the background.
    let mut messages = session(14);
    let early = prepare(&setup, &messages).await;
    assert!(!early.outcome.compacted);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(setup.summarizer.calls(), 1);
    assert_eq!(checkpoints(&setup).await, 1);
    // Grown past the window: the ready checkpoint is applied without waiting for a summary.
    for t in 0..8 {
        messages.push(json!({"role": "assistant", "content": format!("step {t}")}));
        messages
            .push(json!({"role": "user", "content": format!("more {t}: {}", "word ".repeat(250))}));
    }
    let started = tokio::time::Instant::now();
    let crossing = prepare(&setup, &messages).await;
    assert!(crossing.outcome.compacted && crossing.outcome.ready_checkpoint_used);
    assert!(!crossing.outcome.summarized);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn the_soft_threshold_is_a_share_of_the_room_left_to_input() {
    // WINDOW 8,000: a margin of 500 and an output reserve of 2,000 (a quarter of the window)
    // leave 5,500 tokens to input. At 0.5 a summary starts past 2,000 + 2,750 with the reserve,
    // that is past 2,750 tokens of input; a share of the whole limit would start it past 1,750.
    let starts_at = 2_750;
    let mut below_old_start = 0;
    let mut seen = (false, false);
    for turns in 2..16 {
        let setup = setup(
            Behaviour::Answer {
                delay: Duration::ZERO,
            },
            |c, _| {
                c.ahead_of_time = true;
                c.soft_threshold = 0.5;
            },
        );
        let prepared = prepare(&setup, &session(turns)).await;
        assert!(!prepared.outcome.compacted);
        setup.engine.summaries_finished().await;
        let input = prepared.outcome.prompt_tokens;
        let started = setup.summarizer.calls() > 0;
        assert_eq!(started, input > starts_at, "{turns} turns, {input} tokens");
        if input > 1_750 && !started {
            below_old_start += 1;
        }
        if started {
            seen.1 = true;
        } else {
            seen.0 = true;
        }
    }
    assert!(below_old_start > 0 && seen == (true, true));
}

#[tokio::test(start_paused = true)]
async fn a_span_larger_than_the_summarizer_is_folded_in_chunks_oldest_first() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::ZERO,
        },
        |_, s| s.window = 3000,
    );
    let prepared = prepare(&setup, &session(40)).await;
    assert!(prepared.outcome.summarized);
    let prompts = setup.summarizer.prompts.lock().unwrap().clone();
    assert!(prompts.len() > 2, "{} chunks", prompts.len());
    assert!(prompts[0].contains("turn 0:"));
    // Each chunk is summarized alone, oldest first; the answers are joined in that order.
    let first_turn = |prompt: &str| (0..40).find(|t| prompt.contains(&format!("turn {t}:")));
    for (i, prompt) in prompts.iter().enumerate() {
        assert!(
            !prompt.contains("<previous-summary>"),
            "chunk {i} stands alone"
        );
        if i > 0 {
            assert!(
                first_turn(prompt) > first_turn(&prompts[i - 1]),
                "chunk {i} is newer"
            );
        }
    }
    let sent = sent_messages(&prepared);
    let summary = sent[1]["content"].as_str().unwrap();
    let last = prompts.len();
    let oldest = summary
        .find("summary number 1\n")
        .expect("the oldest chunk's answer");
    let newest = summary
        .find(&format!("summary number {last}"))
        .expect("the newest chunk's answer");
    assert!(oldest < newest);
}

fn backing_off_for(prepared: &Prepared) -> Option<Duration> {
    match prepared.outcome.status {
        Some(Status::BackingOff { retry_in, .. }) => Some(retry_in),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn summaries_resume_after_an_outage_once_the_backoff_has_passed() {
    let setup = setup(Behaviour::Fail, |c, _| {
        c.max_unproductive_compactions = 3;
        c.retry_backoff_base_ms = 60_000;
        c.retry_backoff_max_ms = 100_000;
    });
    let messages = session(40);
    for _ in 0..3 {
        let failed = prepare(&setup, &messages).await;
        assert!(
            matches!(failed.outcome.status, Some(Status::Failed { .. })),
            "{:?}",
            failed.outcome.status
        );
    }
    assert_eq!(setup.summarizer.calls(), 3);

    // Backing off: every request is served without asking the summarizer, and says so.
    let waiting = prepare(&setup, &messages).await;
    assert_eq!(backing_off_for(&waiting), Some(Duration::from_secs(60)));
    assert_eq!(
        waiting.outcome.status.as_ref().unwrap().header_value(),
        "skipped; reason=backoff; retry_in_ms=60000; fallback=dropped-oldest"
    );
    assert_eq!(sent_messages(&waiting).last(), messages.last());
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(backing_off_for(&prepare(&setup, &messages).await).is_some());
    }
    assert_eq!(setup.summarizer.calls(), 3, "no calls while backing off");

    // Once it has passed, one request tries again; it fails, so the next wait doubles, capped.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let retried = prepare(&setup, &messages).await;
    assert!(matches!(
        retried.outcome.status,
        Some(Status::Failed { .. })
    ));
    assert_eq!(setup.summarizer.calls(), 4);
    let waiting = prepare(&setup, &messages).await;
    assert_eq!(backing_off_for(&waiting), Some(Duration::from_secs(100)));
    assert_eq!(setup.summarizer.calls(), 4);

    // The summarizer works again: after the backoff the conversation is summarized again.
    *setup.summarizer.behaviour.lock().unwrap() = Behaviour::Answer {
        delay: Duration::ZERO,
    };
    tokio::time::sleep(Duration::from_secs(100)).await;
    let summarized = prepare(&setup, &messages).await;
    assert!(
        summarized.outcome.summarized && summarized.outcome.status.is_none(),
        "{:?}",
        summarized.outcome.status
    );
    assert_eq!(setup.summarizer.calls(), 5);
    assert_eq!(checkpoints(&setup).await, 1);
}

#[tokio::test(start_paused = true)]
async fn requests_arriving_while_a_retry_runs_do_not_call_the_summarizer_too() {
    let setup = setup(Behaviour::Fail, |c, _| {
        c.max_unproductive_compactions = 1;
        c.retry_backoff_base_ms = 60_000;
    });
    let messages = session(40);
    prepare(&setup, &messages).await;
    assert_eq!(setup.summarizer.calls(), 1);
    for (outage, summarizer_calls) in [(true, 2), (false, 3)] {
        tokio::time::sleep(Duration::from_secs(120)).await;
        *setup.summarizer.behaviour.lock().unwrap() = if outage {
            Behaviour::FailAfter {
                delay: Duration::from_secs(5),
            }
        } else {
            Behaviour::Answer {
                delay: Duration::from_secs(5),
            }
        };
        // The first request after the backoff tries again; those arriving while it does are
        // served as they are, whether the retry then fails or works.
        let retry = prepare(&setup, &messages);
        let others = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            futures::future::join_all((0..4).map(|_| prepare(&setup, &messages))).await
        };
        let (retried, others) = tokio::join!(retry, others);
        assert_eq!(retried.outcome.summarized, !outage);
        assert!(others.iter().all(|p| backing_off_for(p).is_some()));
        assert_eq!(setup.summarizer.calls(), summarizer_calls);
    }
    // The next request uses the new checkpoint.
    let next = prepare(&setup, &messages).await;
    assert!(next.outcome.compacted && next.outcome.status.is_none());
    assert_eq!(setup.summarizer.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_gives_up_mid_summary_does_not_stall_its_conversation() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::from_secs(10),
        },
        |c, _| c.summary_timeout_ms = 120_000,
    );
    let messages = session(40);
    // The first client gives up (drops its request) 2 s into the summary.
    let gave_up = tokio::time::timeout(Duration::from_secs(2), prepare(&setup, &messages)).await;
    assert!(gave_up.is_err());
    assert_eq!(setup.summarizer.calls(), 1);
    assert_eq!(
        setup.metrics.summaries_in_progress.get(),
        1,
        "the summary goes on without its client"
    );
    // The next request of the conversation gets that summary once it is written, 8 s later.
    let started = tokio::time::Instant::now();
    let next = prepare(&setup, &messages).await;
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(9), "{waited:?}");
    assert!(
        next.outcome.compacted && next.outcome.status.is_none(),
        "{:?}",
        next.outcome.status
    );
    assert!(
        !next.outcome.summarized,
        "it used the first request's summary"
    );
    assert!(sent_messages(&next)[1]["content"]
        .as_str()
        .unwrap()
        .contains("summary number 1"));
    assert_eq!(setup.summarizer.calls(), 1);
    assert_eq!(checkpoints(&setup).await, 1);
    assert_eq!(setup.metrics.summaries_in_progress.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_largest_output_budget_is_capped_without_wrapping() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::ZERO,
        },
        |_, _| {},
    );
    // A short conversation and one over the window; each asks for u64::MAX output tokens.
    for (messages, compacted) in [(session(3), false), (session(40), true)] {
        let mut chat = chat_request(&messages);
        chat.settings.max_output_tokens = Some(u64::MAX);
        let request: Arc<dyn WireRequest> = Arc::new(chat);
        let prepared = prepare_as(&setup, &context(), &request).await.unwrap();
        assert_eq!(prepared.outcome.compacted, compacted);
    }
    assert_eq!(setup.summarizer.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_output_budget_that_cannot_fit_beside_the_last_message_is_named() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::ZERO,
        },
        |_, _| {},
    );
    // The last user message alone takes most of the window; the reserve (capped at a quarter
    // of the window) does not fit beside it.
    let mut messages = session(3);
    let long: String = (0..2_400).map(|w| format!("x{w} ")).collect();
    messages.push(json!({"role": "user", "content": long}));
    let mut chat = chat_request(&messages);
    chat.settings.max_output_tokens = Some(32_768);
    let request: Arc<dyn WireRequest> = Arc::new(chat);
    match prepare_as(&setup, &context(), &request).await {
        Err(Refusal::OutputBudget {
            needed,
            window,
            prompt,
            reserved,
            asked,
        }) => {
            assert_eq!((window, reserved, asked), (WINDOW, WINDOW / 4, 32_768));
            assert_eq!(needed, prompt + reserved);
            assert!(prompt < WINDOW && needed > WINDOW - 500, "{prompt}");
        }
        other => panic!("{:?}", other.map(|p| p.outcome)),
    }
    assert_eq!(setup.summarizer.calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_fold_cut_short_keeps_its_progress_for_the_next_request() {
    // Chunks of a 3,000-token summarizer at 10 s each: the 25 s timeout ends the fold early.
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::from_secs(10),
        },
        |c, s| {
            s.window = 3000;
            c.summary_timeout_ms = 25_000;
        },
    );
    let messages = session(40);
    let first = prepare(&setup, &messages).await;
    assert!(
        matches!(first.outcome.status, Some(Status::Failed { ref reason, .. }) if reason == "summarizer-timeout"),
        "{:?}",
        first.outcome.status
    );
    let folded_before_timeout = setup.summarizer.calls();
    assert!(folded_before_timeout >= 2);
    assert!(
        checkpoints(&setup).await >= 1,
        "the chunks folded before the timeout were kept"
    );
    // Each later request (past any backoff after a failure) goes on from the progress kept,
    // never from the first turn, until a checkpoint serves the conversation.
    let mut served = first;
    let mut attempts = 1;
    while served.outcome.checkpoint_id.is_none() {
        assert!(attempts < 6, "the fold never finished");
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let calls_before = setup.summarizer.calls();
        served = prepare(&setup, &messages).await;
        attempts += 1;
        let prompts = setup.summarizer.prompts.lock().unwrap().clone();
        if let Some(next) = prompts.get(calls_before) {
            assert!(
                next.contains("<previous-summary>") && !next.contains("turn 0:"),
                "attempt {attempts} starts from the kept progress"
            );
        }
    }
    assert!(attempts >= 2, "one request could not have folded it all");
}

#[tokio::test(start_paused = true)]
async fn a_whole_compaction_covers_everything_extends_the_last_checkpoint_and_is_reused() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::from_secs(2),
        },
        |_, _| {},
    );
    // Past the window: an ordinary compaction keeps the newest turns verbatim.
    let messages = session(40);
    let prepared = prepare(&setup, &messages).await;
    assert!(prepared.outcome.compacted);
    let kept = sent_messages(&prepared).len();
    assert!(kept > 3, "the newest turns stay verbatim: {kept}");
    let ordinary = prepared.outcome.checkpoint_id.unwrap();

    // The client asks for a compaction of all of it.
    let whole = compact_whole(&setup, &messages).await.unwrap();
    assert_eq!(whole.covered, messages.len(), "nothing left verbatim");
    assert_ne!(whole.id, ordinary);
    assert_eq!(setup.summarizer.calls(), 2);
    let prompt = setup.summarizer.prompts.lock().unwrap()[1].clone();
    assert!(
        prompt.contains("what next?"),
        "the last message is summarized"
    );
    assert!(
        !prompt.contains("turn 0:"),
        "the span already summarized is not read again"
    );

    // Asked again for the same input: the same checkpoint, no new summary.
    let again = compact_whole(&setup, &messages).await.unwrap();
    assert_eq!(again.id, whole.id);
    assert_eq!(setup.summarizer.calls(), 2);

    // Nothing but instructions: nothing to compact.
    let only_system = &messages[..1];
    assert!(compact_whole(&setup, only_system).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn a_span_no_summary_could_cover_is_not_sent_to_the_summarizer() {
    // A summarizer whose window takes a few hundred tokens per chunk, and a conversation of
    // about 50,000: well over `max_summary_chunks` requests.
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::ZERO,
        },
        |_, summarizer| summarizer.window = 2_000,
    );
    let prepared = prepare(&setup, &session(200)).await;
    assert_eq!(setup.summarizer.calls(), 0, "no summary request at all");
    match &prepared.outcome.status {
        Some(Status::Failed { reason, fallback }) => {
            assert_eq!(reason, "span-too-large");
            assert_eq!(*fallback, "dropped-oldest");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        prepared.outcome.tokens_after <= WINDOW,
        "still served, within the window"
    );
    let text = setup.metrics.render();
    assert!(
        text.contains("summaries_refused_total{result=\"span_too_large\"} 1"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn summaries_at_once_are_bounded_per_tenant_and_overall() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::from_secs(2),
        },
        |config, _| {
            config.max_concurrent_summaries = 3;
            config.max_concurrent_summaries_per_tenant = 2;
        },
    );
    // Six conversations of one tenant: at most two summaries at once.
    let conversations: Vec<Vec<Value>> = (0..6)
        .map(|c| {
            let mut messages = session(40);
            messages[1]["content"] = json!(format!("conversation {c}"));
            messages
        })
        .collect();
    let all = futures::future::join_all(conversations.iter().map(|m| prepare(&setup, m))).await;
    assert!(all
        .iter()
        .all(|p| p.outcome.compacted && p.outcome.status.is_none()));
    assert_eq!(setup.summarizer.calls(), 6);
    assert_eq!(setup.summarizer.most_in_flight.load(Ordering::SeqCst), 2);
    // Six tenants at once: three at most, the proxy's bound.
    let setup = setup_bounded();
    let tenants: Vec<RequestContext> = (0..6)
        .map(|t| RequestContext {
            tenant: identity::tenant(&format!("Bearer tenant-{t}")),
            ..RequestContext::default()
        })
        .collect();
    let request = request(&session(40));
    let all = futures::future::join_all(
        tenants
            .iter()
            .map(|context| prepare_as(&setup, context, &request)),
    )
    .await;
    assert!(all.iter().all(|p| p.as_ref().unwrap().outcome.compacted));
    assert_eq!(setup.summarizer.most_in_flight.load(Ordering::SeqCst), 3);
    let text = setup.metrics.render();
    assert!(text.contains("summary_slot_waits_total 3"), "{text}");
}

fn setup_bounded() -> Setup {
    setup(
        Behaviour::Answer {
            delay: Duration::from_secs(2),
        },
        |config, _| {
            config.max_concurrent_summaries = 3;
            config.max_concurrent_summaries_per_tenant = 2;
        },
    )
}

#[tokio::test(start_paused = true)]
async fn a_summarizer_that_overflows_teaches_its_window_and_gets_smaller_chunks() {
    // The engine believes the summarizer's window is the model's 8,000 tokens; the summarizer
    // takes 2,500. The first chunked attempt overflows, the window is learned, the span is
    // summarized again in chunks that fit.
    let setup = setup(
        Behaviour::OverflowAbove { limit: 2_500 },
        |_, summarizer| {
            summarizer.window = 0;
        },
    );
    let prepared = prepare(&setup, &session(40)).await;
    assert!(
        prepared.outcome.compacted && prepared.outcome.status.is_none(),
        "{:?}",
        prepared.outcome.status
    );
    assert_eq!(setup.engine.window_for(MODEL).await, 2_500);
    let prompts = setup.summarizer.prompts.lock().unwrap().clone();
    assert!(
        prompts.len() >= 2,
        "a second, smaller attempt: {}",
        prompts.len()
    );
    let last = prompts.last().unwrap();
    assert!(compactor::tokenizer::Encoding::O200k.count(last) <= 2_500);
    // A summarizer too small for any chunk: the cause is named, not hidden as a broken upstream.
    let setup = setup_with(Behaviour::OverflowAbove { limit: 10 });
    let whole = compact_whole(&setup, &session(3)).await;
    assert!(
        matches!(whole, Err(SummaryError::SummarizerOverflow)),
        "{whole:?}"
    );
}

fn setup_with(behaviour: Behaviour) -> Setup {
    setup(behaviour, |_, summarizer| summarizer.window = 0)
}

#[tokio::test(start_paused = true)]
async fn the_summarizers_markup_never_reaches_a_stored_summary() {
    let setup = setup(Behaviour::Echoing, |_, _| {});
    let mut messages = session(40);
    let first = prepare(&setup, &messages).await;
    assert!(first.outcome.summarized);
    // Forty more turns: a second summary, which updates the first.
    messages.pop();
    messages.extend(session(40).into_iter().skip(1));
    let second = prepare(&setup, &messages).await;
    assert!(second.outcome.summarized);
    assert_eq!(setup.summarizer.calls(), 2);
    let stored = stored(&setup).await;
    assert_eq!(stored.len(), 2);
    for checkpoint in stored.iter() {
        let summary = &checkpoint.summary;
        assert!(summary.starts_with("## Goal\nsummary number"), "{summary}");
        for markup in [
            "<previous-summary>",
            "</previous-summary>",
            "<transcript>",
            "</transcript>",
            "Headings:",
            "## Next steps",
            "## Done",
        ] {
            assert!(!summary.contains(markup), "{markup} in {summary}");
        }
    }
}

/// The text of every message sent, joined.
fn sent_text(prepared: &Prepared) -> String {
    sent_messages(prepared)
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts the engine's count of what it sent is a count of the body it sent.
fn assert_counted_as_sent(prepared: &Prepared) {
    let sent = chat_request(&sent_messages(prepared));
    let counted = Meter::new(16).measure(&sent).total();
    assert_eq!(prepared.outcome.sent_raw_tokens.raw, counted);
}

/// The limit (window less its margin) less the output reserve, as the engine sizes
/// [`WINDOW`] for a request without `max_tokens`.
const PROMPT_ROOM: u64 = WINDOW - WINDOW / 16 - WINDOW / 4;

#[tokio::test(start_paused = true)]
async fn a_failed_summary_keeps_the_previous_one_and_drops_the_oldest_turns_after_it() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::ZERO,
        },
        |_, _| {},
    );
    assert!(prepare(&setup, &session(40)).await.outcome.summarized);
    *setup.summarizer.behaviour.lock().unwrap() = Behaviour::Fail;

    // Forty turns more: through the checkpoint it is over the window, and no new summary comes.
    let messages = session(80);
    let prepared = prepare(&setup, &messages).await;
    assert!(
        matches!(
            prepared.outcome.status,
            Some(Status::Failed {
                fallback: "dropped-oldest",
                ..
            })
        ),
        "{:?}",
        prepared.outcome.status
    );
    let text = sent_text(&prepared);
    assert!(text.contains("summary number 1"), "the summary is kept");
    assert!(
        text.contains("messages after this summary were omitted"),
        "and says what it dropped"
    );
    assert!(!text.contains("could not be summarized"));
    assert_eq!(sent_messages(&prepared).last(), messages.last());
    assert!(
        prepared.outcome.tokens_after <= PROMPT_ROOM,
        "{} tokens sent",
        prepared.outcome.tokens_after
    );
    // Only the oldest verbatim turns went: the newest ones are all there.
    for t in 70..80 {
        assert!(text.contains(&format!("turn {t}: ")), "turn {t} kept");
    }
    assert_counted_as_sent(&prepared);
    // A longer one drops more, and is counted as what it is, not as the first one was.
    let longer = prepare(&setup, &session(100)).await;
    assert!(sent_text(&longer).contains("summary number 1"));
    assert_counted_as_sent(&longer);
}

#[tokio::test(start_paused = true)]
async fn a_summary_too_large_beside_the_last_turn_is_shortened_to_fit_rather_than_dropped() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::ZERO,
        },
        |_, _| {},
    );
    let mut messages = session(40);
    assert!(prepare(&setup, &messages).await.outcome.summarized);
    let whole = stored(&setup).await[0].summary.clone();
    *setup.summarizer.behaviour.lock().unwrap() = Behaviour::Fail;

    // A last turn so large that the summary no longer fits whole beside it.
    messages.push(json!({"role": "assistant", "content": "send me the log"}));
    let log: String = (0..2_000).map(|i| format!("l{i} ")).collect();
    messages.push(json!({"role": "user", "content": log}));
    let prepared = prepare(&setup, &messages).await;
    let text = sent_text(&prepared);
    assert!(
        text.contains("This summary was shortened"),
        "{:?}",
        prepared.outcome.status
    );
    assert!(text.contains("summary number 1"));
    assert!(!text.contains(&whole), "the summary is not sent whole");
    assert!(text.contains(record_heading()), "the record is kept");
    assert_counted_as_sent(&prepared);
    assert_eq!(sent_messages(&prepared).last(), messages.last());
    assert!(
        prepared.outcome.tokens_after <= PROMPT_ROOM,
        "{} tokens sent",
        prepared.outcome.tokens_after
    );
}

fn record_heading() -> &'static str {
    compactor::compaction::record::HEADING
}

#[tokio::test(start_paused = true)]
async fn a_new_summary_that_leaves_the_request_over_is_shortened_to_fit() {
    let setup = setup(
        Behaviour::Answer {
            delay: Duration::ZERO,
        },
        |_, _| {},
    );
    // Instructions that take most of the room, and a last request too long to cut: the
    // summary planned beside them does not fit whole.
    let mut messages = session(30);
    messages[0] = json!({"role": "system", "content": "rule ".repeat(4_200)});
    let request: String = (0..260).map(|i| format!("r{i} ")).collect();
    *messages.last_mut().unwrap() = json!({"role": "user", "content": request});
    let prepared = prepare(&setup, &messages).await;
    assert!(prepared.outcome.summarized);
    let text = sent_text(&prepared);
    assert!(text.contains("summary number 1"), "the new summary is sent");
    assert!(text.contains("This summary was shortened"));
    assert_eq!(sent_messages(&prepared).last(), messages.last());
    assert!(
        prepared.outcome.tokens_after <= PROMPT_ROOM,
        "{} tokens sent",
        prepared.outcome.tokens_after
    );
    assert_counted_as_sent(&prepared);
}
