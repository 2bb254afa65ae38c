//! The shapes of Compactor's context-management answers, held to those of a real run:
//! `tests/fixtures/context-management/` keeps what Compactor answered in front of llama-server
//! when `tests/e2e/scenario_context_management.py` drove it with the official SDKs, which parsed
//! every answer into their own types. Here the same requests go through the proxy to the mock
//! providers, and each answer must have the recorded shape: the same keys at every path, the
//! same JSON type for every value, streams the same events in the same order. Values (ids,
//! signatures, text, token counts) differ from run to run and are not compared.
//!
//! Where the model's own answer shows through (a message Compactor only annotates, the fields a
//! provider adds to a Responses object), the comparison covers what Compactor writes: see
//! [`Compared`].

mod common;

use common::messages_mock::{self, MessagesMock};
use common::responses_mock::{start_responses_mock, ResponsesMock};
use common::{start_proxy, Proxy, Reply};
use serde_json::{json, Map, Value};

const FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/context-management"
);

fn fixture(name: &str) -> Value {
    let path = format!("{FIXTURES}/{name}.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The shape of a JSON value: each scalar replaced by its type's name, objects kept with their
/// keys, arrays as the shapes of their elements with a run of equal ones written once (a model
/// writes its text in as many deltas, a stream in as many events, as it likes).
fn shape(value: &Value) -> Value {
    match value {
        Value::Null => json!("null"),
        Value::Bool(_) => json!("boolean"),
        Value::Number(n) if n.is_u64() || n.is_i64() => json!("integer"),
        Value::Number(_) => json!("number"),
        Value::String(_) => json!("string"),
        Value::Array(items) => {
            let mut shapes: Vec<Value> = Vec::new();
            for item in items.iter().map(shape) {
                if shapes.last() != Some(&item) {
                    shapes.push(item);
                }
            }
            Value::Array(shapes)
        }
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), shape(v)))
                .collect::<Map<_, _>>(),
        ),
    }
}

struct Stack {
    messages: MessagesMock,
    responses: ResponsesMock,
    proxy: Proxy,
}

async fn stack() -> Stack {
    let messages = messages_mock::start().await;
    let responses = start_responses_mock().await;
    let mut config = common::config(&responses.url());
    config.anthropic_upstream = messages.url();
    // Only the clients' own triggers count here, never Compactor's window.
    config.windows.insert("qwen2.5-coder".into(), 1_000_000);
    config.summarizer.window = 100_000;
    let proxy = start_proxy(config).await;
    Stack {
        messages,
        responses,
        proxy,
    }
}

/// Sends the recorded request `name` (its path, body and beta flags) and reads the answer.
async fn replay(stack: &Stack, name: &str) -> Reply {
    let request = fixture(&format!("{name}.request"));
    let path = request["path"].as_str().unwrap();
    let mut headers = vec![
        ("x-api-key", "sk-e2e-context"),
        ("authorization", "Bearer sk-e2e-context"),
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
    ];
    if let Some(betas) = request["anthropic-beta"].as_str() {
        headers.push(("anthropic-beta", betas));
    }
    let url = format!("{}{path}", stack.proxy.url());
    common::post(&url, &headers, request["body"].to_string()).await
}

/// A stream's events, as the fixtures hold them.
fn events(reply: &Reply) -> Value {
    let events: Vec<Value> = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| serde_json::from_str(d.trim()).unwrap())
        .collect();
    Value::Array(events)
}

/// What of an answer is compared with the recording.
enum Compared {
    /// All of it: Compactor writes the whole answer.
    Whole,
    /// All but what the model's provider wrote there (JSON pointers), which Compactor passes on
    /// as it came: llama-server's `usage` is not the mock's.
    Without(&'static [&'static str]),
    /// Only what Compactor puts into a provider's answer (JSON pointers), whose other fields
    /// are the provider's: a Responses object from llama-server has many the mock leaves out.
    At(&'static [&'static str]),
}

/// `value` without what is at `pointers`.
fn without(value: &Value, pointers: &[&str]) -> Value {
    let mut value = value.clone();
    for pointer in pointers {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        match value.pointer_mut(parent) {
            Some(Value::Object(fields)) => {
                fields.remove(key);
            }
            _ => panic!("nothing at {parent}"),
        }
    }
    value
}

fn assert_shape(name: &str, actual: &Value, compared: Compared) {
    let recorded = fixture(name);
    let drifted =
        |at: &str| format!("{name}: the shape {at}drifted from the recording\n{actual:#}");
    match compared {
        Compared::Whole => assert_eq!(shape(actual), shape(&recorded), "{}", drifted("")),
        Compared::Without(pointers) => assert_eq!(
            shape(&without(actual, pointers)),
            shape(&without(&recorded, pointers)),
            "{}",
            drifted("")
        ),
        Compared::At(pointers) => {
            for pointer in pointers {
                let recorded = recorded.pointer(pointer);
                assert!(
                    recorded.is_some(),
                    "{name}: the recording has nothing at {pointer}"
                );
                assert_eq!(
                    actual.pointer(pointer).map(shape),
                    recorded.map(shape),
                    "{}",
                    drifted(&format!("at {pointer} "))
                );
            }
        }
    }
}

/// The event types of a stream, each run of one type written once.
fn kinds(events: &Value) -> Vec<String> {
    let mut kinds: Vec<String> = Vec::new();
    for kind in events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
    {
        if kinds.last().map(String::as_str) != Some(kind) {
            kinds.push(kind.to_string());
        }
    }
    kinds
}

#[test]
fn the_shape_of_a_value_is_its_keys_and_types() {
    let value = json!({"a": [1, 2, {"b": null}], "c": "x", "d": 1.5, "e": true});
    assert_eq!(
        shape(&value),
        json!({"a": ["integer", {"b": "null"}], "c": "string", "d": "number", "e": "boolean"})
    );
    assert_ne!(
        shape(&value),
        shape(&json!({"a": [1], "c": "x", "d": 1.5, "e": true}))
    );
    assert_ne!(shape(&json!({"n": 1})), shape(&json!({"n": "1"})));
    assert_eq!(
        without(&value, &["/a/2/b", "/e"]),
        json!({"a": [1, 2, {}], "c": "x", "d": 1.5})
    );
}

#[tokio::test]
async fn context_edits_answer_in_the_recorded_shape() {
    let stack = stack().await;
    let reply = replay(&stack, "messages-edits").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_shape(
        "messages-edits",
        &reply.json(),
        Compared::Without(&["/usage"]),
    );

    let reply = replay(&stack, "messages-edits-stream").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let streamed = events(&reply);
    assert_eq!(kinds(&streamed), kinds(&fixture("messages-edits-stream")));
    assert_shape(
        "messages-edits-stream",
        &streamed,
        Compared::Without(&["/0/message/usage", "/0/message/stop_sequence"]),
    );
    assert_eq!(stack.messages.forwarded().len(), 2);

    let reply = replay(&stack, "count-tokens").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_shape("count-tokens", &reply.json(), Compared::Whole);
}

#[tokio::test]
async fn compaction_blocks_answer_in_the_recorded_shape() {
    let stack = stack().await;
    for name in [
        "messages-compaction",
        "messages-compact-edit",
        "messages-compaction-stream",
        "messages-compact-edit-stream",
    ] {
        let reply = replay(&stack, name).await;
        assert_eq!(reply.status, 200, "{name}: {}", reply.body);
        let answer = if name.ends_with("-stream") {
            let streamed = events(&reply);
            assert_eq!(kinds(&streamed), kinds(&fixture(name)), "{name}");
            streamed
        } else {
            reply.json()
        };
        assert_shape(name, &answer, Compared::Whole);
    }
    assert!(!stack.messages.summaries().is_empty());
    assert!(
        stack.messages.forwarded().is_empty(),
        "nothing sampled after a block"
    );

    // A block sealed in another run (another secret) does not open here either.
    let reply = replay(&stack, "compaction-refused").await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_shape("compaction-refused", &reply.json(), Compared::Whole);
}

#[tokio::test]
async fn an_answer_after_the_block_opens_in_the_recorded_shape() {
    let stack = stack().await;
    let name = "messages-compact-edit-answer";
    let reply = replay(&stack, name).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // The block and the steps are Compactor's; the model's text and usage are the provider's.
    assert_shape(
        name,
        &reply.json(),
        Compared::At(&["/content/0", "/usage/iterations", "/type", "/role"]),
    );

    let name = "messages-compact-edit-answer-stream";
    let reply = replay(&stack, name).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let streamed = events(&reply);
    let recorded = fixture(name);
    assert_eq!(kinds(&streamed), kinds(&recorded));
    // The block's three events, after `message_start`.
    assert_shape(name, &streamed, Compared::At(&["/1", "/2", "/3"]));
    let steps = |events: &Value| {
        let delta = events
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "message_delta")
            .cloned()
            .expect("a message_delta");
        shape(&delta["usage"]["iterations"])
    };
    assert_eq!(
        steps(&streamed),
        steps(&recorded),
        "{name}: the steps drifted"
    );
    assert_eq!(
        stack.messages.forwarded().len(),
        2,
        "the model answered both"
    );
}

#[tokio::test]
async fn responses_compaction_answers_in_the_recorded_shape() {
    let stack = stack().await;
    let reply = replay(&stack, "responses-compaction").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer = reply.json();
    assert_eq!(answer["output"][0]["type"], "compaction", "{answer:#}");
    assert_shape(
        "responses-compaction",
        &answer,
        Compared::At(&["/output/0", "/object"]),
    );

    let reply = replay(&stack, "responses-compaction-stream").await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let streamed = events(&reply);
    let recorded = fixture("responses-compaction-stream");
    // Compactor's events open the stream; the model's follow, in its provider's own order.
    let opening = |events: &Value| kinds(events)[..4].to_vec();
    assert_eq!(opening(&streamed), opening(&recorded));
    assert_shape(
        "responses-compaction-stream",
        &streamed,
        Compared::At(&["/1", "/2", "/3"]),
    );
    let completed = |events: &Value| {
        let last = events.as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["type"], "response.completed");
        shape(&last["response"]["output"][0])
    };
    assert_eq!(completed(&streamed), completed(&recorded));
    assert_eq!(
        stack.responses.summaries().len(),
        1,
        "the stream reused the checkpoint"
    );
}
