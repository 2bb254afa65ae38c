//! Single flight across replicas under forced interleavings: two engines (two replicas of the
//! proxy) on one real Redis, each reaching the store through a scripted wrapper that holds a
//! chosen call until the other replica has reached a chosen point, and each summarizing through
//! a recorder that can hold the summary the same way. Every interleaving is fixed by those
//! holds, not by sleeps, so each run takes the same path; what is checked is that no summary
//! request reaches the summarizers twice, and that a replica served by the other's checkpoint
//! writes none of its own.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::redis_server::RedisServer;
use compactor::compaction::{Engine, Parts, Prepared, RequestContext, Summarizer, SummarizerError};
use compactor::config::{CompactionConfig, SummarizerConfig};
use compactor::dialect::chat::request::ChatRequest;
use compactor::dialect::{SummaryRequest, WireRequest};
use compactor::identity;
use compactor::measure::{windows::WindowTable, Meter};
use compactor::metrics::Metrics;
use compactor::store::redis::RedisStore;
use compactor::store::{
    Checkpoint, CheckpointStore, ConversationEntry, ModelFacts, Owner, RequestRow, StoreError,
    TimelineBounds,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

const MODEL: &str = "replica-test-model";
const WINDOW: u64 = 8000;
/// Each interleaving is run this many times, on a new conversation each time.
const ITERATIONS: usize = 10;
/// Longest any hold may last: a hold that is never released is a failed test, not a hang.
const HOLD_LIMIT: Duration = Duration::from_secs(10);

/// What each replica has done so far: `"A.try_lease"` → how many times it has.
#[derive(Default)]
struct Events {
    counts: Mutex<HashMap<String, usize>>,
    changed: Notify,
}

impl Events {
    fn note(&self, event: &str) {
        *self
            .counts
            .lock()
            .unwrap()
            .entry(event.to_string())
            .or_default() += 1;
        self.changed.notify_waiters();
    }

    fn count(&self, event: &str) -> usize {
        self.counts.lock().unwrap().get(event).copied().unwrap_or(0)
    }

    /// Waits until `event` has happened `times` times.
    async fn reached(&self, event: &str, times: usize) {
        let wait = async {
            loop {
                let changed = self.changed.notified();
                if self.count(event) >= times {
                    return;
                }
                changed.await;
            }
        };
        if tokio::time::timeout(HOLD_LIMIT, wait).await.is_err() {
            panic!(
                "held waiting for {event} #{times}; seen: {:?}",
                self.counts.lock().unwrap()
            );
        }
    }
}

/// Holds a replica's `nth` call of `op` until `until` has happened `times` times.
#[derive(Clone)]
struct Hold {
    op: &'static str,
    nth: usize,
    until: String,
    times: usize,
}

fn hold(op: &'static str, nth: usize, until: &str, times: usize) -> Hold {
    Hold {
        op,
        nth,
        until: until.to_string(),
        times,
    }
}

/// One replica's view of the shared store: every call noted as `"{replica}.{op}"` once it has
/// returned, and held first when a [`Hold`] names it.
struct Scripted {
    replica: &'static str,
    inner: Arc<RedisStore>,
    events: Arc<Events>,
    holds: Vec<Hold>,
    started: Mutex<HashMap<&'static str, usize>>,
}

impl Scripted {
    async fn around<T>(&self, op: &'static str, call: impl std::future::Future<Output = T>) -> T {
        let nth = {
            let mut started = self.started.lock().unwrap();
            let n = started.entry(op).or_default();
            *n += 1;
            *n
        };
        for h in self.holds.iter().filter(|h| h.op == op && h.nth == nth) {
            self.events.reached(&h.until, h.times).await;
        }
        let result = call.await;
        self.events.note(&format!("{}.{op}", self.replica));
        result
    }
}

#[async_trait::async_trait]
impl CheckpointStore for Scripted {
    async fn put(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.around("put", self.inner.put(checkpoint)).await
    }
    async fn for_anchor(&self, anchor: &str) -> Result<Arc<Vec<Checkpoint>>, StoreError> {
        self.around("for_anchor", self.inner.for_anchor(anchor))
            .await
    }
    async fn get(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.around("get", self.inner.get(id)).await
    }
    async fn model_facts(&self, model: &str) -> Result<ModelFacts, StoreError> {
        self.inner.model_facts(model).await
    }
    async fn put_model_facts(&self, model: &str, facts: ModelFacts) -> Result<(), StoreError> {
        self.inner.put_model_facts(model, facts).await
    }
    async fn try_lease(&self, key: &str, holder: &str, ttl: Duration) -> Result<bool, StoreError> {
        self.around("try_lease", self.inner.try_lease(key, holder, ttl))
            .await
    }
    async fn release_lease(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        self.around("release_lease", self.inner.release_lease(key, holder))
            .await
    }
    async fn lease_holder(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.around("lease_holder", self.inner.lease_holder(key))
            .await
    }
    async fn record_request(
        &self,
        id: &str,
        owner: &Owner,
        row: &RequestRow,
        bounds: TimelineBounds,
    ) -> Result<(), StoreError> {
        self.inner.record_request(id, owner, row, bounds).await
    }
    async fn shared_secret(&self, name: &str, candidate: &str) -> Result<String, StoreError> {
        self.inner.shared_secret(name, candidate).await
    }
    async fn conversations(&self) -> Result<Vec<ConversationEntry>, StoreError> {
        self.inner.conversations().await
    }
    async fn timeline(
        &self,
        id: &str,
    ) -> Result<Option<(ConversationEntry, Vec<RequestRow>)>, StoreError> {
        self.inner.timeline(id).await
    }
    fn healthy(&self) -> bool {
        self.inner.healthy()
    }
    fn kind(&self) -> &'static str {
        "scripted"
    }
}

/// A replica's summarizer: records every user prompt (in a log both replicas share) and answers
/// once `hold` (if any) has happened.
struct Recorder {
    replica: &'static str,
    prompts: Arc<Mutex<Vec<String>>>,
    events: Arc<Events>,
    hold: Option<(String, usize)>,
}

#[async_trait::async_trait]
impl Summarizer for Recorder {
    async fn summarize(
        &self,
        request: &SummaryRequest<'_>,
        _credentials: &http::HeaderMap,
    ) -> Result<String, SummarizerError> {
        let n = {
            let mut prompts = self.prompts.lock().unwrap();
            prompts.push(request.user.to_string());
            prompts.len()
        };
        self.events.note(&format!("{}.summarize", self.replica));
        if let Some((until, times)) = &self.hold {
            self.events.reached(until, *times).await;
        }
        Ok(format!("## Goal\nsummary number {n} by {}", self.replica))
    }
}

/// Whether a replica's request is blocking (over the window: it waits for its summary) or
/// ahead of time (past the soft threshold, still fitting: the summary is made in the background).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Blocking,
    AheadOfTime,
}

/// Where replica B's reads fall against replica A's summary (A always takes the lease first).
#[derive(Clone, Copy, Debug)]
enum Interleaving {
    /// B reads the store before A stores its checkpoint, and takes the lease after A has
    /// released it.
    LeaseTakenAfterTheOthersRelease,
    /// B finds the lease taken and waits; its poll reads the store before A stores, and asks
    /// who holds the lease after A has released it.
    ReleasedBetweenAWaitersReads,
}

struct Replicas {
    a: Arc<Engine>,
    b: Arc<Engine>,
    prompts: Arc<Mutex<Vec<String>>>,
}

fn replicas(
    stores: &(Arc<RedisStore>, Arc<RedisStore>),
    interleaving: Interleaving,
    b_kind: Kind,
) -> Replicas {
    let events = Arc::new(Events::default());
    let prompts = Arc::new(Mutex::new(Vec::new()));
    // B's reads of the store before it first takes the lease: the request's own, and for a
    // summary ahead of time, the look for one already made.
    let b_reads = if b_kind == Kind::AheadOfTime { 2 } else { 1 };
    let (a_summary_waits_for, b_holds) = match interleaving {
        Interleaving::LeaseTakenAfterTheOthersRelease => (
            ("B.for_anchor", b_reads),
            vec![hold("try_lease", 1, "A.release_lease", 1)],
        ),
        Interleaving::ReleasedBetweenAWaitersReads => (
            ("B.for_anchor", b_reads + 1),
            vec![
                hold("try_lease", 1, "A.try_lease", 1),
                hold("lease_holder", 2, "A.release_lease", 1),
            ],
        ),
    };
    let engine = |replica: &'static str,
                  store: &Arc<RedisStore>,
                  holds: Vec<Hold>,
                  summary_hold: Option<(String, usize)>| {
        let store = Arc::new(Scripted {
            replica,
            inner: store.clone(),
            events: events.clone(),
            holds,
            started: Mutex::default(),
        });
        let recorder = Arc::new(Recorder {
            replica,
            prompts: prompts.clone(),
            events: events.clone(),
            hold: summary_hold,
        });
        let config = CompactionConfig {
            ahead_of_time: true,
            soft_threshold: 0.5,
            summary_timeout_ms: 30_000,
            ..CompactionConfig::default()
        };
        let summarizer = SummarizerConfig {
            window: 1_000_000,
            ..SummarizerConfig::default()
        };
        let windows = BTreeMap::from([(MODEL.to_string(), WINDOW)]);
        let parts = Parts {
            store: store as Arc<dyn CheckpointStore>,
            meter: Meter::new(10_000),
            windows: WindowTable::new(&windows, 128_000),
            summary_writer: recorder,
            metrics: Arc::new(Metrics::default()),
        };
        Arc::new(Engine::new(config, summarizer, parts))
    };
    let (waits_for, times) = a_summary_waits_for;
    Replicas {
        a: engine("A", &stores.0, vec![], Some((waits_for.to_string(), times))),
        b: engine("B", &stores.1, b_holds, None),
        prompts,
    }
}

/// A coding session of `turns` user turns of about 300 tokens, on `topic`.
fn session(topic: &str, turns: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": format!("You work on {topic}.")})];
    for t in 0..turns {
        let words: String = (0..60).map(|w| format!("w{t}x{w} ")).collect();
        messages.push(json!({"role": "user", "content": format!("turn {t}: {words}")}));
        messages.push(json!({"role": "assistant", "content": format!("done with turn {t}")}));
    }
    messages.push(json!({"role": "user", "content": "what next?"}));
    messages
}

/// `messages` with one more exchange of a few words: the next request of an agent whose last
/// step was small, which is cut where the one before it was.
fn one_more_word(messages: &[Value]) -> Vec<Value> {
    let mut messages = messages.to_vec();
    messages.push(json!({"role": "assistant", "content": "ok"}));
    messages.push(json!({"role": "user", "content": "go on"}));
    messages
}

/// `messages` with `turns` more turns, each about 250 tokens.
fn grown(messages: &[Value], turns: usize) -> Vec<Value> {
    let mut messages = messages.to_vec();
    for t in 0..turns {
        messages.push(json!({"role": "assistant", "content": format!("step {t}")}));
        messages
            .push(json!({"role": "user", "content": format!("more {t}: {}", "word ".repeat(250))}));
    }
    messages
}

fn request(messages: &[Value]) -> Arc<dyn WireRequest> {
    let body = json!({"model": MODEL, "messages": messages}).to_string();
    Arc::new(ChatRequest::parse(body.as_bytes()).unwrap())
}

fn context() -> RequestContext {
    RequestContext {
        tenant: identity::tenant("Bearer replicas"),
        ..RequestContext::default()
    }
}

async fn prepare(engine: &Arc<Engine>, messages: &[Value]) -> Prepared {
    engine
        .prepare(&context(), &request(messages))
        .await
        .unwrap()
}

/// The requests of one case: A's, then B's (the same conversation, grown).
fn requests(topic: &str, a: Kind, b: Kind) -> (Vec<Value>, Vec<Value>) {
    let first = match a {
        Kind::Blocking => session(topic, 40),
        Kind::AheadOfTime => session(topic, 14),
    };
    let second = match (a, b) {
        // Past the window, and fitting through a summary A made ahead of time.
        (Kind::AheadOfTime, Kind::Blocking) => grown(&first, 8),
        _ => one_more_word(&first),
    };
    (first, second)
}

/// Runs one case `ITERATIONS` times: A's request and B's at once, in `interleaving`.
async fn run_case(
    stores: &(Arc<RedisStore>, Arc<RedisStore>),
    interleaving: Interleaving,
    a_kind: Kind,
    b_kind: Kind,
) {
    let case = format!("{interleaving:?}, A {a_kind:?}, B {b_kind:?}");
    for iteration in 0..ITERATIONS {
        let topic = format!("{case} #{iteration}");
        let replicas = replicas(stores, interleaving, b_kind);
        let (first, second) = requests(&topic, a_kind, b_kind);
        let (on_a, on_b) =
            tokio::join!(prepare(&replicas.a, &first), prepare(&replicas.b, &second));
        replicas.a.summaries_finished().await;
        replicas.b.summaries_finished().await;
        assert_eq!(on_a.outcome.compacted, a_kind == Kind::Blocking, "{case}");
        assert_eq!(on_b.outcome.compacted, b_kind == Kind::Blocking, "{case}");
        let prompts = replicas.prompts.lock().unwrap().clone();
        let mut seen = std::collections::HashSet::new();
        for prompt in &prompts {
            assert!(
                seen.insert(prompt),
                "{case}, iteration {iteration}: the same summary request reached the summarizers twice"
            );
        }
        assert_eq!(
            prompts.len(),
            1,
            "{case}, iteration {iteration}: B is served by A's checkpoint and writes none"
        );
        assert!(!on_b.outcome.summarized, "{case}");
    }
}

async fn stores(server: &RedisServer) -> (Arc<RedisStore>, Arc<RedisStore>) {
    let open = async || {
        Arc::new(
            RedisStore::open(&server.url(), Duration::ZERO)
                .await
                .unwrap(),
        )
    };
    (open().await, open().await)
}

#[tokio::test]
async fn a_lease_taken_after_the_other_replica_released_it_finds_its_checkpoint() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    for (a, b) in [
        (Kind::Blocking, Kind::Blocking),
        (Kind::AheadOfTime, Kind::AheadOfTime),
        (Kind::AheadOfTime, Kind::Blocking),
    ] {
        run_case(&stores, Interleaving::LeaseTakenAfterTheOthersRelease, a, b).await;
    }
}

#[tokio::test]
async fn a_waiter_that_sees_the_lease_released_between_its_reads_finds_the_checkpoint() {
    let server = RedisServer::start();
    let stores = stores(&server).await;
    for (a, b) in [
        (Kind::Blocking, Kind::Blocking),
        (Kind::AheadOfTime, Kind::AheadOfTime),
        (Kind::AheadOfTime, Kind::Blocking),
    ] {
        run_case(&stores, Interleaving::ReleasedBetweenAWaitersReads, a, b).await;
    }
}
