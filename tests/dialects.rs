//! The dialect battery: the behaviours every wire format must show, as `store::contract::check`
//! is for stores. Each registered dialect (`compactor::dialect::registry::DIALECTS`) runs it
//! through the real proxy in front of one mock provider that serves all three formats
//! (`common::provider_mock`); a fourth format written only for the tests
//! (`common::turns_dialect`) runs it through the engine, since no HTTP route reaches it.
//!
//! Each behaviour is one function taking a [`Fixture`]: how to write a conversation of N turns
//! in the format, where it goes, how to read the forwarded conversation back, and its error
//! shape. It drives a [`Rig`] (the proxy and the mock, or the engine and an in-process provider)
//! and never knows which:
//!
//! - (a) past the window, a conversation is compacted in whole units: no tool result is
//!   separated from its call, the kept tail is the client's own bytes;
//! - (b) the head (instructions, system, tools) and fields the proxy does not know are
//!   forwarded byte for byte, in their place;
//! - (c) an overflow from the provider is retried once (learned, compacted harder, resent) and
//!   the client served;
//! - (d) errors the proxy makes itself (bad JSON, no model, no conversation) come in the
//!   dialect's own error shape, and a conversation that cannot fit is refused in words the
//!   format's clients read as an overflow;
//! - (e) a history the client re-serializes (key order, whitespace, ids, a string for one text
//!   block) keeps its checkpoint;
//! - (f) the summary is rendered so that the next request finds it again: the same checkpoint,
//!   a byte-stable prefix;
//! - (g) the count endpoints count through the checkpoint, for the dialects that have one;
//! - (h) a newest turn larger than the keep budget (a `write` call carrying a whole file) is
//!   forwarded as the client's tail, in its order, the call cut in place: the request ends with
//!   the client's last element, never with the user message that opened the turn.
//!
//! A new dialect gets a fixture here and its own test below;
//! `every_registered_dialect_has_a_fixture` fails until it does.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use common::provider_mock::{self, ProviderMock, Purpose, ANSWER};
use common::turns_dialect::{Provider, Turns};
use common::{start_proxy, Proxy};
use compactor::compaction::{Engine, Parts, RequestContext};
use compactor::config::{CompactionConfig, SummarizerConfig};
use compactor::dialect::registry::DIALECTS;
use compactor::dialect::{ClientError, Dialect, Overflow, WireRequest};
use compactor::measure::{windows::WindowTable, Meter};
use compactor::metrics::Metrics;
use compactor::store::memory::MemoryStore;
use indexmap::IndexMap;
use serde_json::value::RawValue;
use serde_json::{json, Value};

const MODEL: &str = "battery-model";
const CREDENTIAL: &str = "sk-battery";
/// The window the proxy believes in, unless a behaviour says otherwise.
const WINDOW: u64 = 3000;
const RESERVE: u64 = 256;
const MARGIN: u64 = 64;
/// Turns whose conversation is well past [`WINDOW`].
const PAST_THE_WINDOW: usize = 20;

/// A field the proxy does not know, written the way no serializer would write it again: spaced,
/// `1.50`, `2e3`, an escaped `é`. Each fixture puts it first; [`X_AFTER`] goes last.
const X_BATTERY: &str =
    r#"{"zeta": 1.50, "alpha": [2e3, "caf\u00e9"], "nested": {"b": null, "a": true}}"#;
const X_AFTER: &str = r#"[1.0, -0.0, 10E2]"#;

/// One wire format as the battery writes and reads it.
struct Fixture {
    dialect: &'static dyn Dialect,
    route: Route,
    /// The top-level field that holds the conversation.
    conversation: &'static str,
    /// Top-level fields written after `model`, as raw text in order: [`X_BATTERY`], the pinned
    /// head (spaced and ordered the way a re-serializer would not keep them) and whatever else
    /// the format's clients send.
    fields: &'static [(&'static str, &'static str)],
    /// The head among them: never summarized, always forwarded.
    head: &'static [&'static str],
    /// Instruction elements that open the conversation, raw (pinned like the head).
    instructions: &'static [&'static str],
    /// The user message that opens turn `t`.
    user: fn(usize) -> Value,
    /// The rest of turn `t`: the assistant's tool call, its result, the assistant's answer.
    step: fn(usize) -> Vec<Value>,
    /// A step of turn `t` that writes `content` to [`path_of`]`(t)`: the call and its result.
    write: fn(usize, &str) -> Vec<Value>,
    /// An element as a client writes it again on the next request, meaning the same: what the
    /// format allows to differ (ids, statuses, a string for one text block, cache markers).
    /// Key order and whitespace are changed for every format by [`write_json`].
    resend: fn(Value) -> Value,
    /// Tool calls an element makes and the calls whose results it carries, by id.
    links: fn(&Value) -> Links,
    /// The message of an error body in this format's error shape; `None` for any other shape.
    error_message: fn(&Value) -> Option<String>,
}

/// How a fixture's requests reach the proxy.
enum Route {
    /// Over HTTP: where clients post, the token-counting endpoint if the format has one, and
    /// the credential header its clients send.
    Http {
        path: &'static str,
        count: Option<&'static str>,
        credential: (&'static str, &'static str),
    },
    /// Through the engine, with the in-process provider of [`common::turns_dialect`]: no route
    /// reaches the format, so the rig plays the HTTP layer's part (parse, prepare, send, retry
    /// once after an overflow, answer errors in the dialect's shape).
    Engine,
}

/// The tool call ids one element makes or answers.
struct Links {
    calls: Vec<String>,
    results: Vec<String>,
}

/// How the client writes its elements in one request.
#[derive(Clone, Copy)]
enum Style {
    /// Compact, keys in order.
    Sent,
    /// As the client writes the same history again: [`Fixture::resend`], keys in reverse order,
    /// spaced.
    Resent,
}

impl Fixture {
    fn name(&self) -> &'static str {
        self.dialect.name()
    }

    /// The raw elements of a conversation of `turns` whole turns and the next user message.
    fn elements(&self, turns: usize, style: Style) -> Vec<String> {
        let mut values: Vec<Value> = Vec::new();
        for t in 0..turns {
            values.push((self.user)(t));
            values.extend((self.step)(t));
        }
        values.push((self.user)(turns));
        let instructions = self.instructions.iter().map(|raw| match style {
            Style::Sent => raw.to_string(),
            Style::Resent => write_json(&(self.resend)(serde_json::from_str(raw).unwrap()), true),
        });
        let rest = values.into_iter().map(|v| match style {
            Style::Sent => write_json(&v, false),
            Style::Resent => write_json(&(self.resend)(v), true),
        });
        instructions.chain(rest).collect()
    }

    /// A request body carrying `conversation` (raw JSON) as the conversation.
    fn body(&self, conversation: &str, stream: bool) -> String {
        let mut fields = vec![("model", format!("\"{MODEL}\""))];
        fields.extend(self.fields.iter().map(|(k, v)| (*k, v.to_string())));
        fields.push((self.conversation, conversation.to_string()));
        fields.push(("stream", stream.to_string()));
        fields.push(("x_after", X_AFTER.to_string()));
        let written: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}: {v}", json!(k)))
            .collect();
        format!("{{{}}}", written.join(", "))
    }

    /// The body of a conversation of `turns` turns.
    fn request(&self, turns: usize, style: Style, stream: bool) -> (Vec<String>, String) {
        let elements = self.elements(turns, style);
        let body = self.body(&format!("[{}]", elements.join(",")), stream);
        (elements, body)
    }

    /// The conversation of a forwarded body, each element's raw bytes.
    fn conversation_of(&self, body: &[u8]) -> Vec<String> {
        let fields = top_level(body);
        let raw = fields
            .get(self.conversation)
            .unwrap_or_else(|| panic!("{}: no `{}` forwarded", self.name(), self.conversation));
        let elements: Vec<Box<RawValue>> = serde_json::from_str(raw.get()).unwrap();
        elements.iter().map(|e| e.get().to_string()).collect()
    }
}

/// A body's top-level fields in order, each as its raw bytes.
fn top_level(body: &[u8]) -> IndexMap<String, Box<RawValue>> {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not a JSON object ({e}): {}", String::from_utf8_lossy(body)))
}

/// `value` as a client writes it: compact with keys in order, or (`resent`) spaced with keys in
/// reverse order, so that every object's bytes differ from the first writing.
fn write_json(value: &Value, resent: bool) -> String {
    let (comma, colon, open, close) = if resent {
        (" , ", " : ", "{ ", " }")
    } else {
        (",", ":", "{", "}")
    };
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            if resent {
                keys.reverse();
            }
            let inner: Vec<String> = keys
                .iter()
                .map(|k| format!("{}{colon}{}", json!(k), write_json(&map[*k], resent)))
                .collect();
            format!("{open}{}{close}", inner.join(comma))
        }
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(|v| write_json(v, resent)).collect();
            format!("[{}]", inner.join(comma))
        }
        scalar => scalar.to_string(),
    }
}

/// Words that tokenize predictably: `n` of them, different for each `seed`.
fn words(seed: usize, n: usize) -> String {
    (0..n)
        .map(|i| format!("w{}", (seed * 31 + i * 7) % 97))
        .collect::<Vec<_>>()
        .join(" ")
}

fn user_text(t: usize) -> String {
    format!("Turn {t}: {}", words(t, 20))
}

fn result_text(t: usize) -> String {
    words(t * 3 + 1, 80)
}

/// What a `write` tool answers.
fn wrote(t: usize, content: &str) -> String {
    format!(
        "Successfully wrote {} bytes to {}",
        content.len(),
        path_of(t)
    )
}

fn path_of(t: usize) -> String {
    format!("src/f{t}.rs")
}

/// The key paths of a JSON value, values aside: what an error shape is.
fn shape(value: &Value) -> BTreeSet<String> {
    fn walk(value: &Value, at: String, out: &mut BTreeSet<String>) {
        if let Value::Object(map) = value {
            for (key, v) in map {
                let path = format!("{at}/{key}");
                out.insert(path.clone());
                walk(v, path, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(value, String::new(), &mut out);
    out
}

/// `value`'s string content made one text block of `kind`, where it is a string.
fn string_to_block(value: &mut Value, kind: &str) {
    if let Some(Value::String(text)) = value.get("content") {
        value["content"] = json!([{"type": kind, "text": text}]);
    }
}

/// `value`'s content made a plain string, where it is one text block and nothing else.
fn block_to_string(value: &mut Value) {
    let text = match value["content"].as_array().map(Vec::as_slice) {
        Some([block]) if block["text"].is_string() => block["text"].clone(),
        _ => return,
    };
    let only_text = value["content"][0].as_object().is_some_and(|b| {
        b.keys()
            .all(|k| matches!(k.as_str(), "type" | "text" | "annotations"))
    }) && value["content"][0]["annotations"]
        .as_array()
        .is_none_or(Vec::is_empty);
    if only_text {
        value["content"] = text;
    }
}

/// Whether `value` is an object with exactly these keys.
fn has_keys(value: &Value, keys: &[&str]) -> bool {
    value
        .as_object()
        .is_some_and(|map| map.len() == keys.len() && keys.iter().all(|k| map.contains_key(*k)))
}

/// OpenAI's `{"error": {"message", "type", "param", "code"}}`.
fn openai_error_message(body: &Value) -> Option<String> {
    let error = &body["error"];
    let shaped = has_keys(body, &["error"])
        && has_keys(error, &["message", "type", "param", "code"])
        && error["type"].is_string();
    shaped.then(|| error["message"].as_str().map(str::to_string))?
}

fn chat() -> Fixture {
    Fixture {
        dialect: registered("chat"),
        route: Route::Http {
            path: "/v1/chat/completions",
            count: None,
            credential: ("authorization", "Bearer sk-battery"),
        },
        conversation: "messages",
        fields: &[
            ("x_battery", X_BATTERY),
            (
                "tools",
                r#"[ {"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}, "x_rank": 1.50} ]"#,
            ),
            ("temperature", "0.20"),
        ],
        head: &["tools"],
        instructions: &[
            r#"{"role": "system",  "content": "You are a careful engineer.\nCite files.", "x_note": 1.50}"#,
        ],
        user: |t| json!({"role": "user", "content": user_text(t)}),
        step: |t| {
            let call = format!("call_{t}");
            vec![
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": call, "type": "function",
                       "function": {"name": "read", "arguments": json!({"path": path_of(t)}).to_string()}}]}),
                json!({"role": "tool", "tool_call_id": call, "content": result_text(t)}),
                json!({"role": "assistant", "content": format!("done {t}")}),
            ]
        },
        write: |t, content| {
            let call = format!("call_w{t}");
            vec![
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": call, "type": "function",
                       "function": {"name": "write", "arguments": json!({"path": path_of(t), "content": content}).to_string()}}]}),
                json!({"role": "tool", "tool_call_id": call, "content": wrote(t, content)}),
            ]
        },
        resend: |mut v| {
            string_to_block(&mut v, "text");
            v
        },
        links: |v| Links {
            calls: v["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["id"].as_str().map(str::to_string))
                .collect(),
            results: v["tool_call_id"]
                .as_str()
                .map(str::to_string)
                .into_iter()
                .collect(),
        },
        error_message: openai_error_message,
    }
}

fn messages() -> Fixture {
    Fixture {
        dialect: registered("messages"),
        route: Route::Http {
            path: "/v1/messages",
            count: Some("/v1/messages/count_tokens"),
            credential: ("x-api-key", CREDENTIAL),
        },
        conversation: "messages",
        fields: &[
            ("x_battery", X_BATTERY),
            (
                "system",
                r#"[ {"type": "text", "text": "You are Claude Code.\nCite files.", "cache_control": {"type": "ephemeral"}} ]"#,
            ),
            (
                "tools",
                r#"[ {"name": "read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}, "x_rank": 1.50} ]"#,
            ),
            ("max_tokens", "1024"),
        ],
        head: &["system", "tools"],
        instructions: &[],
        user: |t| json!({"role": "user", "content": user_text(t)}),
        step: |t| {
            let call = format!("toolu_{t}");
            vec![
                json!({"role": "assistant", "content": [{"type": "text", "text": "Reading."},
                       {"type": "tool_use", "id": call, "name": "read", "input": {"path": path_of(t)}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": result_text(t)}]}),
                json!({"role": "assistant", "content": [{"type": "text", "text": format!("done {t}")}]}),
            ]
        },
        write: |t, content| {
            let call = format!("toolu_w{t}");
            vec![
                json!({"role": "assistant", "content": [{"type": "text", "text": "Writing."},
                       {"type": "tool_use", "id": call, "name": "write", "input": {"path": path_of(t), "content": content}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": wrote(t, content)}]}),
            ]
        },
        // Claude Code writes a lone text block as a string and moves its cache markers.
        resend: |mut v| {
            if v["content"].is_string() {
                string_to_block(&mut v, "text");
            } else {
                block_to_string(&mut v);
            }
            for block in v["content"].as_array_mut().into_iter().flatten() {
                if block["type"] == "tool_result" {
                    block["cache_control"] = json!({"type": "ephemeral"});
                }
            }
            v
        },
        links: |v| {
            let blocks = |kind: &str, field: &str| -> Vec<String> {
                v["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|b| b["type"] == kind)
                    .filter_map(|b| b[field].as_str().map(str::to_string))
                    .collect()
            };
            Links {
                calls: blocks("tool_use", "id"),
                results: blocks("tool_result", "tool_use_id"),
            }
        },
        // Anthropic's `{"type": "error", "error": {"type", "message"}}`.
        error_message: |body| {
            let error = &body["error"];
            let shaped = has_keys(body, &["type", "error"])
                && body["type"] == "error"
                && has_keys(error, &["type", "message"])
                && error["type"].is_string();
            shaped.then(|| error["message"].as_str().map(str::to_string))?
        },
    }
}

fn responses() -> Fixture {
    Fixture {
        dialect: registered("responses"),
        route: Route::Http {
            path: "/v1/responses",
            count: Some("/v1/responses/input_tokens"),
            credential: ("authorization", "Bearer sk-battery"),
        },
        conversation: "input",
        fields: &[
            ("x_battery", X_BATTERY),
            ("instructions", r#""You are Codex.\nWork  carefully.""#),
            (
                "tools",
                r#"[ {"type": "function", "name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}, "strict": false, "x_rank": 1.50} ]"#,
            ),
            ("store", "false"),
            ("prompt_cache_key", r#""battery-thread""#),
        ],
        head: &["instructions", "tools"],
        instructions: &[
            r#"{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: workspace-write."}]}"#,
        ],
        user: |t| json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": user_text(t)}]}),
        step: |t| {
            let call = format!("call_{t}");
            vec![
                json!({"type": "function_call", "id": format!("fc_{t}"), "status": "completed", "call_id": call,
                       "name": "read", "arguments": json!({"path": path_of(t)}).to_string()}),
                json!({"type": "function_call_output", "call_id": call, "output": result_text(t)}),
                json!({"type": "message", "role": "assistant", "id": format!("msg_{t}"), "status": "completed",
                       "content": [{"type": "output_text", "text": format!("done {t}"), "annotations": []}]}),
            ]
        },
        write: |t, content| {
            let call = format!("call_w{t}");
            vec![
                json!({"type": "function_call", "id": format!("fc_w{t}"), "status": "completed", "call_id": call,
                       "name": "write", "arguments": json!({"path": path_of(t), "content": content}).to_string()}),
                json!({"type": "function_call_output", "call_id": call, "output": wrote(t, content)}),
            ]
        },
        // Codex and the SDKs regenerate item ids, drop statuses and write lone text parts as
        // strings.
        resend: |mut v| {
            if let Some(id) = v["id"].as_str() {
                v["id"] = json!(format!("{id}_again"));
            }
            if let Some(item) = v.as_object_mut() {
                item.remove("status");
            }
            block_to_string(&mut v);
            v
        },
        links: |v| {
            let kind = v["type"].as_str().unwrap_or("");
            let id = v["call_id"].as_str().map(str::to_string);
            Links {
                calls: id
                    .clone()
                    .filter(|_| kind.ends_with("_call"))
                    .into_iter()
                    .collect(),
                results: id
                    .filter(|_| kind.ends_with("_output"))
                    .into_iter()
                    .collect(),
            }
        },
        error_message: openai_error_message,
    }
}

/// The format written only for the tests, through the engine.
fn turns() -> Fixture {
    Fixture {
        dialect: &Turns,
        route: Route::Engine,
        conversation: "turns",
        fields: &[
            ("x_battery", X_BATTERY),
            ("rules", r#""Answer  briefly.\nCite files.""#),
        ],
        head: &["rules"],
        instructions: &[],
        user: |t| json!({"who": "user", "say": user_text(t)}),
        step: |t| {
            let call = format!("call_{t}");
            vec![
                json!({"who": "bot", "say": "Reading.", "call": {"id": call, "tool": "read",
                       "args": json!({"path": path_of(t)}).to_string()}}),
                json!({"who": "tool", "id": call, "say": result_text(t)}),
                json!({"who": "bot", "say": format!("done {t}")}),
            ]
        },
        write: |t, content| {
            let call = format!("call_w{t}");
            vec![
                json!({"who": "bot", "say": "Writing.", "call": {"id": call, "tool": "write",
                       "args": json!({"path": path_of(t), "content": content}).to_string()}}),
                json!({"who": "tool", "id": call, "say": wrote(t, content)}),
            ]
        },
        // Only key order and whitespace can differ in this format.
        resend: |v| v,
        links: |v| Links {
            calls: v["call"]["id"]
                .as_str()
                .map(str::to_string)
                .into_iter()
                .collect(),
            results: (v["who"] == "tool")
                .then(|| v["id"].as_str().map(str::to_string))
                .flatten()
                .into_iter()
                .collect(),
        },
        error_message: |body| {
            let problem = &body["problem"];
            let shaped = has_keys(body, &["problem"])
                && has_keys(problem, &["kind", "status", "what"])
                && problem["status"].is_u64();
            shaped.then(|| problem["what"].as_str().map(str::to_string))?
        },
    }
}

/// The registered dialect named `name`.
fn registered(name: &str) -> &'static dyn Dialect {
    DIALECTS
        .iter()
        .copied()
        .find(|d| d.name() == name)
        .unwrap_or_else(|| panic!("no registered dialect `{name}`"))
}

/// The compaction settings of a rig: small budgets, so that a few dozen turns cross the window;
/// nothing prepared in the background, so what each request does is its own.
fn compaction_config(budgets: Budgets) -> CompactionConfig {
    CompactionConfig {
        keep_recent_tokens: budgets.keep_recent,
        merge_summary_into_user: budgets.merge_summary,
        reserve_output_tokens: RESERVE,
        margin_tokens: MARGIN,
        ahead_of_time: false,
        // The battery measures the summary path; clearing first is tested in
        // tests/clearing_first.rs.
        clear_tool_results_first: false,
        ..CompactionConfig::default()
    }
}

/// The sizes of a rig: the window the proxy believes for [`MODEL`], the one the provider
/// enforces (0: none), and the most the proxy keeps verbatim; and whether the summary joins
/// the next user message (`merge_summary_into_user`, for backends that demand alternation).
#[derive(Clone, Copy)]
struct Budgets {
    window: u64,
    provider_window: u64,
    keep_recent: u64,
    merge_summary: bool,
}

const BELIEVED: Budgets = Budgets {
    window: WINDOW,
    provider_window: 0,
    keep_recent: 600,
    merge_summary: false,
};

/// What one client request came to.
struct Served {
    status: u16,
    /// The body the client got.
    reply: String,
    compacted: bool,
    /// The checkpoint applied, from `x-compactor-checkpoint` (or the engine's outcome).
    checkpoint: Option<String>,
    tokens_before: u64,
    tokens_after: u64,
    /// Every body the provider received for this request, in order (a retry adds one).
    forwarded: Vec<Bytes>,
}

/// What a count request came to.
struct Counted {
    /// The body the provider counted.
    forwarded: Bytes,
    /// The count the client got.
    tokens: u64,
}

/// Where a fixture's requests go: the proxy in front of the mock, or the engine in front of an
/// in-process provider.
enum Rig {
    Http(HttpRig),
    Engine(EngineRig),
}

struct HttpRig {
    mock: ProviderMock,
    proxy: Proxy,
    path: &'static str,
    count: Option<&'static str>,
    credential: (&'static str, &'static str),
}

struct EngineRig {
    dialect: &'static dyn Dialect,
    engine: Arc<Engine>,
    provider: Arc<Provider>,
}

impl Rig {
    async fn start(fixture: &Fixture, budgets: Budgets) -> Rig {
        match fixture.route {
            Route::Http {
                path,
                count,
                credential,
            } => {
                let mock = provider_mock::start().await;
                mock.set_window(budgets.provider_window);
                let mut config = mock.config();
                config.windows.insert(MODEL.into(), budgets.window);
                config.compaction = compaction_config(budgets);
                // One summary request per summary: the span is never folded in chunks.
                config.summarizer.window = 100_000;
                let proxy = start_proxy(config).await;
                Rig::Http(HttpRig {
                    mock,
                    proxy,
                    path,
                    count,
                    credential,
                })
            }
            Route::Engine => Rig::Engine(EngineRig::start(fixture.dialect, budgets)),
        }
    }

    /// Sends one client request.
    async fn send(&self, body: String) -> Served {
        match self {
            Rig::Http(rig) => rig.send(body).await,
            Rig::Engine(rig) => rig.send(body).await,
        }
    }

    /// Sends `body` to the format's count endpoint; `None` when it has none.
    async fn count(&self, body: String) -> Option<Counted> {
        match self {
            Rig::Http(rig) => rig.count(body).await,
            Rig::Engine(rig) => Some(rig.count(body).await),
        }
    }

    /// Summaries the provider wrote.
    fn summaries(&self) -> usize {
        match self {
            Rig::Http(rig) => {
                let paths: Vec<String> = rig
                    .mock
                    .received(Purpose::Summary)
                    .into_iter()
                    .map(|r| r.path)
                    .collect();
                // A conversation is summarized by its own provider, in its own format.
                assert!(
                    paths.iter().all(|p| p == rig.path),
                    "summary requests to {paths:?}, not {}",
                    rig.path
                );
                paths.len()
            }
            Rig::Engine(rig) => rig.provider.summaries(),
        }
    }

    /// Prompts the provider refused as too long.
    fn overflows(&self) -> usize {
        match self {
            Rig::Http(rig) => rig.mock.overflows(),
            Rig::Engine(rig) => rig.provider.overflows(),
        }
    }

    /// The provider's own count of a body.
    fn provider_tokens(&self, body: &[u8]) -> u64 {
        match self {
            Rig::Http(_) => provider_mock::tokens(&serde_json::from_slice(body).unwrap()),
            Rig::Engine(_) => Provider::tokens(body),
        }
    }
}

impl HttpRig {
    async fn post(&self, path: &str, body: String) -> common::Reply {
        let headers = [self.credential, ("content-type", "application/json")];
        common::post(&format!("{}{path}", self.proxy.url()), &headers, body).await
    }

    async fn send(&self, body: String) -> Served {
        let before = self.mock.received(Purpose::Turn).len();
        let reply = self.post(self.path, body).await;
        let number = |name: &str| reply.header(name).and_then(|v| v.parse().ok()).unwrap_or(0);
        Served {
            status: reply.status,
            compacted: reply.header("x-compactor-compacted") == Some("true"),
            checkpoint: reply.header("x-compactor-checkpoint").map(str::to_string),
            tokens_before: number("x-compactor-tokens-before"),
            tokens_after: number("x-compactor-tokens-after"),
            forwarded: self.mock.received(Purpose::Turn)[before..]
                .iter()
                .map(|r| r.body.clone())
                .collect(),
            reply: reply.body,
        }
    }

    async fn count(&self, body: String) -> Option<Counted> {
        let reply = self.post(self.count?, body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let counted = self.mock.received(Purpose::Count).pop()?;
        Some(Counted {
            forwarded: counted.body,
            tokens: reply.json()["input_tokens"].as_u64().unwrap_or(0),
        })
    }
}

impl EngineRig {
    /// The engine as the server builds it, with the format's provider as its summarizer.
    fn start(dialect: &'static dyn Dialect, budgets: Budgets) -> EngineRig {
        let provider = Arc::new(Provider::default());
        provider
            .window
            .store(budgets.provider_window, std::sync::atomic::Ordering::SeqCst);
        let windows = [(MODEL.to_string(), budgets.window)].into_iter().collect();
        let engine = Engine::new(
            compaction_config(budgets),
            SummarizerConfig {
                window: 100_000,
                ..SummarizerConfig::default()
            },
            Parts {
                store: Arc::new(MemoryStore::default()),
                meter: Meter::new(10_000),
                windows: WindowTable::new(&windows, 128_000),
                summary_writer: provider.clone(),
                metrics: Arc::new(Metrics::default()),
            },
        );
        EngineRig {
            dialect,
            engine: Arc::new(engine),
            provider,
        }
    }

    fn context() -> RequestContext {
        RequestContext {
            tenant: compactor::identity::tenant(CREDENTIAL),
            ..RequestContext::default()
        }
    }

    /// A refusal in the dialect's error shape, as the HTTP layer writes one.
    fn refused(
        &self,
        code: Option<&'static str>,
        param: Option<String>,
        message: String,
    ) -> Served {
        let error = ClientError {
            status: 400,
            kind: "invalid_request_error",
            code,
            param,
            message,
        };
        Served {
            status: 400,
            reply: self.dialect.error_body(&error).to_string(),
            compacted: false,
            checkpoint: None,
            tokens_before: 0,
            tokens_after: 0,
            forwarded: vec![],
        }
    }

    /// What the HTTP layer does with a request, on the engine: parse, prepare, send, and after
    /// an overflow the dialect recognises, compact harder and send once more.
    async fn send(&self, body: String) -> Served {
        let request: Arc<dyn WireRequest> = match self.dialect.parse(&Bytes::from(body)) {
            Ok(request) => Arc::from(request),
            Err(e) => return self.refused(None, e.param(), e.to_string()),
        };
        let before = self.provider.received().len();
        let context = Self::context();
        let cannot_fit =
            |message: String| self.refused(Some("context_length_exceeded"), None, message);
        let (prepared, identified) = match self.engine.prepare_identified(&context, &request).await
        {
            Ok(prepared) => prepared,
            Err(e) => return cannot_fit(e.to_string()),
        };
        let mut outcome = prepared.outcome;
        let (mut status, mut reply) = self.provider.answer(&prepared.body);
        // As the HTTP layer: an overflow that only has the words earns a retry only near the
        // window by our own count.
        let worth_a_retry = |o: &Overflow| o.trusted || outcome.tokens_after * 2 >= outcome.window;
        if let Some(overflow) = self.dialect.overflow(status, &reply).filter(worth_a_retry) {
            let sent = outcome.sent_raw_tokens;
            let again = match self
                .engine
                .retry_after_overflow(identified, overflow, sent)
                .await
            {
                Ok(again) => again,
                Err(e) => return cannot_fit(e.to_string()),
            };
            outcome = again.outcome;
            (status, reply) = self.provider.answer(&again.body);
            if let Some(again) = self.dialect.overflow(status, &reply).filter(|o| o.trusted) {
                let needed = again.requested.unwrap_or(outcome.tokens_after);
                let window = again.limit.unwrap_or(outcome.window);
                return cannot_fit(compactor::compaction::CannotFit { needed, window }.to_string());
            }
        }
        Served {
            status,
            reply: String::from_utf8(reply).unwrap(),
            compacted: outcome.compacted,
            checkpoint: outcome.checkpoint_id,
            tokens_before: outcome.tokens_before,
            tokens_after: outcome.tokens_after,
            forwarded: self.provider.received()[before..].to_vec(),
        }
    }

    /// What a count endpoint would count: the body through the conversation's checkpoint.
    async fn count(&self, body: String) -> Counted {
        let request: Arc<dyn WireRequest> =
            Arc::from(self.dialect.parse(&Bytes::from(body)).unwrap());
        let forwarded = self
            .engine
            .through_checkpoint(&Self::context(), &request)
            .await;
        Counted {
            tokens: Provider::tokens(&forwarded),
            forwarded,
        }
    }
}

/// A forwarded conversation compacted in whole units: the instructions as sent, one summary,
/// then the newest elements of `sent` byte for byte, with every tool result next to its call.
fn assert_whole_units(f: &Fixture, sent: &[String], forwarded: &[String]) {
    let name = f.name();
    let k = f.instructions.len();
    assert_eq!(
        forwarded[..k],
        sent[..k],
        "{name}: instructions forwarded byte for byte"
    );
    assert!(
        forwarded[k].contains("SUMMARY-"),
        "{name}: one summary after the instructions: {}",
        forwarded[k]
    );
    let kept = &forwarded[k + 1..];
    assert!(
        !kept.is_empty() && kept.len() < sent.len() - k,
        "{name}: {} of {} elements kept",
        kept.len(),
        sent.len()
    );
    assert_eq!(
        kept,
        &sent[sent.len() - kept.len()..],
        "{name}: the kept tail is the client's newest elements, byte for byte"
    );
    assert_paired(f, forwarded);
}

/// Every tool result forwarded comes after its call, and every call forwarded has its result.
fn assert_paired(f: &Fixture, forwarded: &[String]) {
    let mut open: BTreeSet<String> = BTreeSet::new();
    for (i, raw) in forwarded.iter().enumerate() {
        let links = (f.links)(&serde_json::from_str(raw).unwrap());
        for id in links.results {
            assert!(
                open.remove(&id),
                "{}: element {i} carries the result of `{id}`, whose call was not forwarded",
                f.name()
            );
        }
        open.extend(links.calls);
    }
    assert!(
        open.is_empty(),
        "{}: calls forwarded without their results: {open:?}",
        f.name()
    );
}

/// Every field of `sent` but the conversation reaches the provider in its place and byte for
/// byte, and so do the instruction elements.
fn assert_fields_verbatim(f: &Fixture, sent: &str, forwarded: &[u8]) {
    let name = f.name();
    let (sent_fields, forwarded_fields) = (top_level(sent.as_bytes()), top_level(forwarded));
    let keys =
        |fields: &IndexMap<String, Box<RawValue>>| fields.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(&forwarded_fields),
        keys(&sent_fields),
        "{name}: fields in their order"
    );
    for key in f.head.iter().copied().chain(["x_battery", "x_after"]) {
        assert!(
            sent_fields.contains_key(key),
            "{name}: the fixture sends `{key}`"
        );
    }
    for (key, raw) in sent_fields.iter().filter(|(k, _)| *k != f.conversation) {
        assert_eq!(
            forwarded_fields[key].get(),
            raw.get(),
            "{name}: `{key}` forwarded byte for byte"
        );
    }
    let k = f.instructions.len();
    assert_eq!(
        f.conversation_of(forwarded)[..k],
        f.conversation_of(sent.as_bytes())[..k],
        "{name}: instruction elements forwarded byte for byte"
    );
}

/// The one body forwarded for a request that needed no retry.
fn only(served: &Served) -> &Bytes {
    match served.forwarded.as_slice() {
        [body] => body,
        other => panic!("{} bodies forwarded: {}", other.len(), served.reply),
    }
}

/// (a) Below the window a conversation goes as it came; past it, in whole units, wherever the
/// cut falls and however the summary is placed.
async fn compacts_in_whole_units(f: &Fixture) {
    grows_through_checkpoints(f).await;
    cuts_only_between_units(f).await;
    merges_the_summary_into_the_next_user_message(f).await;
}

/// A growing conversation: as it came while it fits, then through checkpoints, each reused
/// until the conversation outgrows it.
async fn grows_through_checkpoints(f: &Fixture) {
    let name = f.name();
    let rig = Rig::start(f, BELIEVED).await;
    let mut compacted = 0;
    for turns in 1..=24 {
        let (sent, body) = f.request(turns, Style::Sent, false);
        let served = rig.send(body).await;
        assert_eq!(
            served.status, 200,
            "{name}, {turns} turns: {}",
            served.reply
        );
        assert!(served.reply.contains(ANSWER), "{name}: {}", served.reply);
        let forwarded = f.conversation_of(only(&served));
        if served.compacted {
            compacted += 1;
            assert_whole_units(f, &sent, &forwarded);
            assert!(
                served.tokens_after < served.tokens_before
                    && served.tokens_after <= WINDOW - RESERVE,
                "{name}, {turns} turns: {} tokens of {} sent",
                served.tokens_after,
                served.tokens_before
            );
        } else {
            assert_eq!(
                forwarded, sent,
                "{name}: a request that fits goes as it came"
            );
        }
    }
    let summaries = rig.summaries();
    assert!(compacted >= 8, "{name}: {compacted} requests compacted");
    assert!(
        (1..compacted).contains(&summaries),
        "{name}: {summaries} summaries for {compacted} compacted requests"
    );
}

/// A growing conversation is cut only where a summary is written, at the same place of a turn
/// each time. Budgets a fraction of a turn apart move the cut through every element of a turn:
/// a dialect that maps a tool result onto the wrong role is caught wherever the cut meets it.
async fn cuts_only_between_units(f: &Fixture) {
    let name = f.name();
    let mut kept = BTreeSet::new();
    for keep_recent in (250..=900).step_by(25) {
        let budgets = Budgets {
            keep_recent,
            ..BELIEVED
        };
        let rig = Rig::start(f, budgets).await;
        let (sent, body) = f.request(PAST_THE_WINDOW, Style::Sent, false);
        let served = rig.send(body).await;
        assert!(
            served.compacted,
            "{name}, keeping {keep_recent}: {}",
            served.reply
        );
        let forwarded = f.conversation_of(only(&served));
        assert_whole_units(f, &sent, &forwarded);
        kept.insert(forwarded.len());
    }
    assert!(kept.len() >= 3, "{name}: the cut moved: {kept:?}");
}

/// For a backend that demands alternation (`merge_summary_into_user`), the summary opens the
/// first kept user message instead of standing alone; the rest is the client's, byte for byte.
async fn merges_the_summary_into_the_next_user_message(f: &Fixture) {
    let name = f.name();
    let budgets = Budgets {
        merge_summary: true,
        ..BELIEVED
    };
    let rig = Rig::start(f, budgets).await;
    let (sent, body) = f.request(PAST_THE_WINDOW, Style::Sent, false);
    let served = rig.send(body).await;
    assert!(served.compacted, "{name}, merged: {}", served.reply);
    let forwarded = f.conversation_of(only(&served));
    let k = f.instructions.len();
    assert_eq!(forwarded[..k], sent[..k], "{name}, merged: instructions");
    let kept = &forwarded[k..];
    let first = sent.len() - kept.len();
    assert_eq!(
        kept[1..],
        sent[first + 1..],
        "{name}, merged: the rest of the tail, byte for byte"
    );
    // Every fixture's user message says `Turn t: …`.
    let Some(at) = sent[first].find("Turn ") else {
        panic!(
            "{name}, merged: the summary stands alone, not in the next user message: {}",
            kept[0]
        );
    };
    let turn = &sent[first][at..];
    let turn = &turn[..turn.find('"').unwrap()];
    assert!(
        kept[0].contains("SUMMARY-") && kept[0].contains(turn),
        "{name}, merged: the summary opens the user message `{turn}`: {}",
        kept[0]
    );
    assert_paired(f, &forwarded);
}

/// (b) The head and the fields the proxy does not know reach the provider byte for byte,
/// whether the request fits or is compacted.
async fn forwards_the_head_and_unknown_fields_verbatim(f: &Fixture) {
    let rig = Rig::start(f, BELIEVED).await;
    for (turns, compacts) in [(2, false), (PAST_THE_WINDOW, true)] {
        let (sent, body) = f.request(turns, Style::Sent, false);
        let served = rig.send(body.clone()).await;
        assert_eq!(served.status, 200, "{}: {}", f.name(), served.reply);
        assert_eq!(served.compacted, compacts, "{}, {turns} turns", f.name());
        assert_fields_verbatim(f, &body, only(&served));
        if !compacts {
            assert_eq!(f.conversation_of(only(&served)), sent);
        }
    }
}

/// (c) The provider's window is smaller than the proxy believed: its overflow is learned, the
/// conversation compacted harder and sent once more, and the client gets the answer.
async fn retries_an_overflow_once(f: &Fixture) {
    const PROVIDER_WINDOW: u64 = 1200;
    let name = f.name();
    let budgets = Budgets {
        window: 100_000,
        provider_window: PROVIDER_WINDOW,
        ..BELIEVED
    };
    let rig = Rig::start(f, budgets).await;
    let (sent, body) = f.request(16, Style::Sent, true);
    assert!(
        rig.provider_tokens(body.as_bytes()) > PROVIDER_WINDOW,
        "{name}: the conversation must overflow the provider"
    );
    let served = rig.send(body).await;
    assert_eq!(served.status, 200, "{name}: {}", served.reply);
    assert!(served.reply.contains(ANSWER), "{name}: {}", served.reply);
    assert!(served.compacted, "{name}: the retry went compacted");
    assert_eq!(rig.overflows(), 1, "{name}: one overflow");
    let [first, retry] = served.forwarded.as_slice() else {
        panic!(
            "{name}: {} bodies forwarded, not the first and one retry",
            served.forwarded.len()
        );
    };
    assert_eq!(
        f.conversation_of(first),
        sent,
        "{name}: the first attempt as it came"
    );
    assert_whole_units(f, &sent, &f.conversation_of(retry));
    assert!(rig.provider_tokens(retry) <= PROVIDER_WINDOW);
}

/// (d) What the proxy refuses itself is answered in the dialect's error shape, and nothing is
/// forwarded.
async fn answers_its_own_errors_in_its_shape(f: &Fixture) {
    let name = f.name();
    let rig = Rig::start(f, BELIEVED).await;
    let expected = shape(&f.dialect.error_body(&ClientError {
        status: 400,
        kind: "invalid_request_error",
        code: None,
        param: Some("model".into()),
        message: "an example".into(),
    }));
    let (_, body) = f.request(2, Style::Sent, false);
    let mut no_model = top_level(body.as_bytes());
    no_model.shift_remove("model");
    let cases = [
        ("bad JSON", r#"{"model": "#.to_string(), None),
        (
            "no model",
            serde_json::to_string(&no_model).unwrap(),
            Some("model"),
        ),
        ("no conversation", f.body("7", false), Some(f.conversation)),
    ];
    for (case, body, names) in cases {
        let served = rig.send(body).await;
        assert_eq!(served.status, 400, "{name}, {case}: {}", served.reply);
        let reply: Value = serde_json::from_str(&served.reply)
            .unwrap_or_else(|e| panic!("{name}, {case}: not JSON ({e}): {}", served.reply));
        assert_eq!(
            shape(&reply),
            expected,
            "{name}, {case}: its own error shape: {reply}"
        );
        let message = (f.error_message)(&reply)
            .unwrap_or_else(|| panic!("{name}, {case}: not its error shape: {reply}"));
        assert!(!message.is_empty(), "{name}, {case}: says what is wrong");
        if let Some(field) = names {
            assert!(
                message.contains(field),
                "{name}, {case}: names `{field}`: {message}"
            );
        }
        assert!(
            served.forwarded.is_empty(),
            "{name}, {case}: nothing forwarded"
        );
    }
    // Past what any compaction saves, the refusal is one the format's own clients read as an
    // overflow (and so compact or give up on their side).
    let budgets = Budgets {
        window: 100_000,
        provider_window: 20,
        ..BELIEVED
    };
    let rig = Rig::start(f, budgets).await;
    let served = rig.send(f.request(3, Style::Sent, false).1).await;
    assert_eq!(served.status, 400, "{name}, cannot fit: {}", served.reply);
    let reply: Value = serde_json::from_str(&served.reply).unwrap();
    assert_eq!(
        shape(&reply),
        expected,
        "{name}, cannot fit: its own error shape: {reply}"
    );
    assert!(
        (f.error_message)(&reply).is_some(),
        "{name}, cannot fit: {reply}"
    );
    assert!(
        f.dialect.overflow(400, served.reply.as_bytes()).is_some(),
        "{name}, cannot fit: the refusal reads as an overflow in its own format: {reply}"
    );
}

/// (e) The client writes its history again differently, meaning the same: the checkpoint still
/// applies, and no summary is written for it.
async fn keeps_its_checkpoint_when_re_serialized(f: &Fixture) {
    let name = f.name();
    let rig = Rig::start(f, BELIEVED).await;
    let (_, body) = f.request(PAST_THE_WINDOW, Style::Sent, false);
    let first = rig.send(body).await;
    assert!(first.compacted, "{name}: {}", first.reply);
    let checkpoint = first.checkpoint.clone().expect("a checkpoint id");
    let summaries = rig.summaries();
    let (resent, body) = f.request(PAST_THE_WINDOW + 1, Style::Resent, false);
    let (as_sent, _) = f.request(PAST_THE_WINDOW + 1, Style::Sent, false);
    for (i, (a, b)) in resent.iter().zip(&as_sent).enumerate() {
        assert_ne!(a, b, "{name}: element {i} is written differently");
    }
    let served = rig.send(body).await;
    assert_eq!(served.status, 200, "{name}: {}", served.reply);
    assert!(served.compacted, "{name}: compacted through the checkpoint");
    assert_eq!(
        served.checkpoint.as_deref(),
        Some(checkpoint.as_str()),
        "{name}: the re-serialized history keeps its checkpoint"
    );
    assert_eq!(rig.summaries(), summaries, "{name}: no new summary");
    assert_whole_units(f, &resent, &f.conversation_of(only(&served)));
}

/// (f) The next requests of the conversation find the summary again: the same checkpoint,
/// written the same, so the forwarded body is byte-identical up to the kept tail.
async fn renders_a_summary_the_next_request_finds(f: &Fixture) {
    let name = f.name();
    let rig = Rig::start(f, BELIEVED).await;
    let mut checkpoints = BTreeSet::new();
    let mut prefixes = Vec::new();
    for turns in PAST_THE_WINDOW..PAST_THE_WINDOW + 3 {
        let (sent, body) = f.request(turns, Style::Sent, false);
        let served = rig.send(body).await;
        assert!(served.compacted, "{name}, {turns} turns: {}", served.reply);
        checkpoints.insert(served.checkpoint.clone().expect("a checkpoint id"));
        let forwarded = f.conversation_of(only(&served));
        assert_whole_units(f, &sent, &forwarded);
        let summary = &forwarded[f.instructions.len()];
        assert!(
            summary.contains("SUMMARY-1"),
            "{name}: the provider's summary: {summary}"
        );
        // The body up to the end of the summary: the head, the instructions, the summary.
        let body = String::from_utf8(only(&served).to_vec()).unwrap();
        let end = body.find(summary.as_str()).unwrap() + summary.len();
        prefixes.push(body[..end].to_string());
    }
    assert_eq!(
        checkpoints.len(),
        1,
        "{name}: one checkpoint: {checkpoints:?}"
    );
    assert_eq!(rig.summaries(), 1, "{name}: one summary");
    assert!(
        prefixes.windows(2).all(|p| p[0] == p[1]),
        "{name}: the prefix is byte-stable: {prefixes:#?}"
    );
}

/// (g) A count request is counted on the body as it would be sent: through the checkpoint.
async fn counts_through_the_checkpoint(f: &Fixture) {
    let name = f.name();
    let rig = Rig::start(f, BELIEVED).await;
    let (_, body) = f.request(PAST_THE_WINDOW, Style::Sent, false);
    let served = rig.send(body.clone()).await;
    assert!(served.compacted, "{name}: {}", served.reply);
    // Chat completions has no count endpoint.
    let Some(counted) = rig.count(body.clone()).await else {
        return;
    };
    let sent = only(&served);
    assert_eq!(
        f.conversation_of(&counted.forwarded),
        f.conversation_of(sent),
        "{name}: counted as it is sent"
    );
    assert_eq!(
        counted.tokens,
        rig.provider_tokens(sent),
        "{name}: the provider's count"
    );
    assert!(counted.tokens < rig.provider_tokens(body.as_bytes()));
    assert_eq!(rig.summaries(), 1, "{name}: counting writes no summary");
}

/// (h) The newest turn alone is larger than the keep budget and the window: the user's request,
/// then a `write` call carrying a whole file (several times the window), then its short result.
/// The request forwarded must still end with that result, after the user's request and the call
/// (cut in place, its path intact), in the client's order: summarized, the call and its result
/// would stand before the request, which the model would read as unanswered.
async fn keeps_an_oversized_newest_turn_in_order(f: &Fixture) {
    let name = f.name();
    let rig = Rig::start(f, BELIEVED).await;
    let turns = 3;
    let mut sent = f.elements(turns, Style::Sent);
    let content = words(7, 6000);
    sent.extend(
        (f.write)(turns, &content)
            .iter()
            .map(|v| write_json(v, false)),
    );
    let body = f.body(&format!("[{}]", sent.join(",")), false);
    let served = rig.send(body).await;
    assert_eq!(served.status, 200, "{name}: {}", served.reply);
    assert!(served.compacted, "{name}: compacted");
    let forwarded = f.conversation_of(only(&served));
    let n = sent.len();
    // The last three elements of the client's: the request, the call, the result.
    let (request, call, result) = (&sent[n - 3], &sent[n - 2], &sent[n - 1]);
    assert_eq!(
        forwarded.last(),
        Some(result),
        "{name}: the request ends with the client's last element, not {}",
        forwarded
            .last()
            .map_or("nothing", |l| &l[..l.len().min(200)])
    );
    let m = forwarded.len();
    assert!(m >= 3, "{name}: {m} elements forwarded");
    assert_eq!(
        &forwarded[m - 3],
        request,
        "{name}: the user's request stands right before the call, verbatim"
    );
    let forwarded_call = &forwarded[m - 2];
    let links = |raw: &str| (f.links)(&serde_json::from_str(raw).unwrap());
    assert_eq!(
        links(forwarded_call).calls,
        links(call).calls,
        "{name}: the call is the client's"
    );
    assert!(
        forwarded_call.len() < call.len() / 2
            && forwarded_call.contains("cut from the middle")
            && forwarded_call.contains(&path_of(turns)),
        "{name}: the call cut in place, its path intact: {} of {} bytes",
        forwarded_call.len(),
        call.len()
    );
    assert!(
        served.tokens_after <= WINDOW - RESERVE,
        "{name}: {} tokens sent",
        served.tokens_after
    );
    assert_paired(f, &forwarded);
    // The next request, the same conversation with the model's answer: the tail is again the
    // client's, through the same checkpoint or a new one.
    let mut next = sent.clone();
    next.push(write_json(&(f.user)(turns + 1), false));
    let served = rig
        .send(f.body(&format!("[{}]", next.join(",")), false))
        .await;
    assert_eq!(served.status, 200, "{name}: {}", served.reply);
    let forwarded = f.conversation_of(only(&served));
    assert_eq!(
        forwarded.last(),
        next.last(),
        "{name}: the next request ends with its own last element"
    );
    assert_paired(f, &forwarded);
}

/// Every behaviour, in order, each on a rig of its own.
async fn battery(f: &Fixture) {
    compacts_in_whole_units(f).await;
    forwards_the_head_and_unknown_fields_verbatim(f).await;
    retries_an_overflow_once(f).await;
    answers_its_own_errors_in_its_shape(f).await;
    keeps_its_checkpoint_when_re_serialized(f).await;
    renders_a_summary_the_next_request_finds(f).await;
    counts_through_the_checkpoint(f).await;
    keeps_an_oversized_newest_turn_in_order(f).await;
}

#[test]
fn every_registered_dialect_has_a_fixture() {
    let fixtures: BTreeSet<&str> = [chat(), messages(), responses()]
        .iter()
        .map(Fixture::name)
        .collect();
    let registered: BTreeSet<&str> = DIALECTS.iter().map(|d| d.name()).collect();
    assert_eq!(
        fixtures, registered,
        "each registered dialect needs a fixture here and a test below"
    );
}

#[tokio::test]
async fn chat_completions_pass_the_battery() {
    battery(&chat()).await;
}

#[tokio::test]
async fn anthropic_messages_pass_the_battery() {
    battery(&messages()).await;
}

#[tokio::test]
async fn openai_responses_pass_the_battery() {
    battery(&responses()).await;
}

/// Every behaviour holds for the format written only here, through the engine: (d) checks
/// that its parser refuses what it must and that its error body is its own, (g) counts
/// through `Engine::through_checkpoint`, what a count endpoint would forward.
#[tokio::test]
async fn a_format_written_only_for_the_tests_passes_the_battery_through_the_engine() {
    battery(&turns()).await;
}
