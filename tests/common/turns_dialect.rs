//! A fourth wire format, written only for the tests: everything a new dialect must provide, and
//! proof that the seam (`compactor::dialect`) asks no more. `tests/dialects.rs` runs the battery
//! over it through the engine, since no HTTP route reaches it.
//!
//! A body is `{"model": …, "rules": "…", "turns": [{"who": "user", "say": "…"}, {"who": "bot",
//! "say": "…", "call": {"id": "c1", "tool": "read", "args": "…"}}, {"who": "tool", "id": "c1",
//! "say": "…"}]}`: `rules` is the pinned head, each turn an element, and every other field is
//! kept as it came. Its provider ([`Provider`], in-process) answers `{"reply": {"who": "bot",
//! "say": …}, "usage": {"in": n}}`, refuses a prompt over its window with `{"problem": {"kind":
//! "too_long", "limit": w, "counted": n}}`, and this format's errors are `{"problem": {"kind",
//! "status", "what"}}`.
//!
//! It uses only what the seam offers every dialect: the two traits and their vocabulary,
//! [`splice`] to keep every field's bytes, [`cut_texts`] for truncations, and
//! [`identity::canonical_hash`] for the hash chain.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use compactor::compaction::{Summarizer, SummarizerError};
use compactor::dialect::splice::{self, to_raw};
use compactor::dialect::text::{cut_texts, Arguments};
use compactor::dialect::{
    AnswerError, CallSettings, ClientError, Dialect, MessageView, Overflow, RequestError, Role,
    SummaryRequest, Through, ToolCall, Usage, WireRequest, MAX_OUTPUT_TOKENS,
};
use compactor::identity::{self, Hash};
use compactor::tokenizer::Encoding;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// Tokens a turn costs besides its text.
const TURN_OVERHEAD: u64 = 3;

/// The format.
pub struct Turns;

/// One parsed body.
pub struct TurnsRequest {
    /// Top-level fields in arrival order, values as they came.
    fields: splice::Fields,
    settings: CallSettings,
    turns: Vec<Turn>,
}

/// One element: its original bytes and what is read from them.
struct Turn {
    raw: Box<RawValue>,
    role: Role,
    say: String,
    call: Option<ToolCall>,
    /// The call a tool turn answers.
    answers: Option<String>,
}

#[derive(Deserialize)]
struct TurnShape {
    who: String,
    #[serde(default)]
    say: String,
    call: Option<CallShape>,
    id: Option<String>,
}

#[derive(Deserialize)]
struct CallShape {
    id: String,
    tool: String,
    #[serde(default)]
    args: String,
}

impl Turn {
    fn parse(raw: Box<RawValue>) -> Result<Turn, String> {
        let shape: TurnShape = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
        let role = match shape.who.as_str() {
            "user" => Role::User,
            "bot" => Role::Assistant,
            // A tool turn joins the bot turn that called it: the core never cuts between them.
            "tool" => Role::Tool,
            other => return Err(format!("unknown `who`: {other}")),
        };
        if role == Role::Tool && shape.id.is_none() {
            return Err("a tool turn needs the `id` of its call".into());
        }
        Ok(Turn {
            raw,
            role,
            say: shape.say,
            call: shape.call.map(|c| ToolCall {
                id: c.id,
                name: c.tool,
                arguments: c.args,
            }),
            answers: shape.id,
        })
    }

    fn text(&self) -> String {
        match &self.call {
            Some(call) => format!("{}\n{} {}", self.say, call.name, call.arguments),
            None => self.say.clone(),
        }
    }
}

impl TurnsRequest {
    fn parse(body: &[u8]) -> Result<TurnsRequest, RequestError> {
        let fields = splice::top_level_fields(body)?;
        let model = splice::required_model(&fields)?;
        let raw = fields.get("turns").ok_or(RequestError::Missing("turns"))?;
        let list: Vec<Box<RawValue>> =
            serde_json::from_str(raw.get()).map_err(|_| RequestError::Type {
                field: "turns",
                expected: "an array of turns",
            })?;
        let turns = list
            .into_iter()
            .enumerate()
            .map(|(index, raw)| {
                Turn::parse(raw).map_err(|reason| RequestError::Message { index, reason })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let stream = fields
            .get("stream")
            .is_some_and(|r| r.get().trim() == "true");
        let max_output_tokens = fields
            .get("max_tokens")
            .and_then(|r| serde_json::from_str::<u64>(r.get()).ok())
            .map(|n| n.min(MAX_OUTPUT_TOKENS));
        Ok(TurnsRequest {
            fields,
            settings: CallSettings {
                model,
                stream,
                max_output_tokens,
            },
            turns,
        })
    }

    fn rules(&self) -> Option<&str> {
        self.fields.get("rules").map(|r| r.get())
    }

    /// Turn `index` with its long texts (`say`, the strings in its call's `args`) cut in the
    /// middle to about `keep_tokens` of `tokens`.
    fn truncated(&self, index: usize, tokens: u64, keep_tokens: u64) -> Box<RawValue> {
        let turn = &self.turns[index];
        let Ok(mut value) = serde_json::from_str::<Value>(turn.raw.get()) else {
            return turn.raw.clone();
        };
        let mut say = turn.say.clone();
        let mut args = value["call"]["args"].as_str().map(Arguments::open);
        {
            let mut texts = vec![&mut say];
            texts.extend(args.iter_mut().flat_map(Arguments::strings));
            cut_texts(&mut texts, tokens, keep_tokens);
        }
        value["say"] = Value::String(say);
        if let Some(args) = args {
            value["call"]["args"] = Value::String(args.close());
        }
        to_raw(&value)
    }
}

impl Dialect for Turns {
    fn name(&self) -> &'static str {
        "turns"
    }

    fn parse(&self, body: &Bytes) -> Result<Box<dyn WireRequest>, RequestError> {
        Ok(Box::new(TurnsRequest::parse(body)?))
    }

    /// Its provider states both figures, so the window can be learned exactly.
    fn overflow(&self, status: u16, body: &[u8]) -> Option<Overflow> {
        let value: Value = serde_json::from_slice(body).ok()?;
        let problem = value.get("problem")?;
        (status == 400 && problem["kind"] == "too_long").then(|| Overflow {
            limit: problem["limit"].as_u64(),
            requested: problem["counted"].as_u64(),
            trusted: true,
        })
    }

    fn reported_usage(&self, json: &[u8]) -> Option<Usage> {
        let value: Value = serde_json::from_slice(json).ok()?;
        let count = |pointer: &str| value.pointer(pointer).and_then(Value::as_u64);
        value.get("usage")?;
        Some(Usage {
            input_tokens: count("/usage/in"),
            output_tokens: count("/usage/out"),
            ..Usage::default()
        })
    }

    /// A prompt that cannot fit is refused the way its provider refuses one, so that its
    /// clients know what happened.
    fn error_body(&self, error: &ClientError) -> Value {
        let kind = match error.code {
            Some("context_length_exceeded") => "too_long",
            _ => error.kind,
        };
        json!({"problem": {"kind": kind, "status": error.status, "what": error.message}})
    }

    fn summary_path(&self) -> &'static str {
        "/turns"
    }

    fn summary_request(&self, request: &SummaryRequest<'_>) -> Value {
        json!({"model": request.model, "rules": request.system,
               "turns": [{"who": "user", "say": request.user}], "max_tokens": request.max_tokens})
    }

    fn summary_answer(&self, body: &[u8]) -> Result<String, AnswerError> {
        let value: Value = serde_json::from_slice(body).map_err(|_| AnswerError::Malformed)?;
        let say = value
            .pointer("/reply/say")
            .and_then(Value::as_str)
            .ok_or(AnswerError::Malformed)?;
        match say.trim() {
            "" => Err(AnswerError::Empty),
            text => Ok(text.to_string()),
        }
    }
}

impl WireRequest for TurnsRequest {
    fn dialect(&self) -> &'static str {
        "turns"
    }

    fn settings(&self) -> &CallSettings {
        &self.settings
    }

    fn len(&self) -> usize {
        self.turns.len()
    }

    fn role(&self, index: usize) -> Role {
        self.turns[index].role
    }

    fn raw(&self, index: usize) -> &str {
        self.turns[index].raw.get()
    }

    /// Key order and whitespace never change a turn's identity.
    fn canonical(&self, index: usize) -> Hash {
        identity::canonical_hash(&self.turns[index].raw)
    }

    fn transcript(&self, index: usize) -> String {
        let turn = &self.turns[index];
        let label = match turn.role {
            Role::Tool => "tool result",
            Role::Assistant => "assistant",
            _ => "user",
        };
        format!("[{label}]\n{}\n", turn.text())
    }

    fn tokens(&self, encoding: Encoding, index: usize) -> u64 {
        encoding.count(&self.turns[index].text()) + TURN_OVERHEAD
    }

    fn view(&self, index: usize) -> MessageView {
        let turn = &self.turns[index];
        MessageView {
            text: turn.say.clone(),
            tool_calls: turn.call.iter().cloned().collect(),
            tool_call_id: turn.answers.clone(),
            ..MessageView::default()
        }
    }

    fn head_tokens(&self, encoding: Encoding) -> u64 {
        self.rules()
            .map_or(0, |rules| encoding.count(rules) + TURN_OVERHEAD)
    }

    fn head_parts(&self) -> Vec<&str> {
        self.rules().into_iter().collect()
    }

    fn summary_tokens(&self, encoding: Encoding, text: &str) -> u64 {
        encoding.count(text) + TURN_OVERHEAD
    }

    fn original_body(&self) -> Bytes {
        Bytes::from(splice::object_with_array(
            &self.fields,
            "turns",
            self.turns.iter().map(|t| &*t.raw),
        ))
    }

    /// The summary as a user turn, then the pinned user turn and the kept turns' own bytes
    /// (cut where the checkpoint says); `rules` and every other field untouched.
    fn render(&self, through: &Through<'_>) -> Vec<u8> {
        let checkpoint = through.checkpoint;
        let covered = checkpoint.covered.min(self.turns.len());
        let pinned = checkpoint.pinned_user.filter(|&p| p < covered);
        let mut kept: Vec<Box<RawValue>> = pinned
            .into_iter()
            .chain(covered..self.turns.len())
            .map(|i| {
                let cut = checkpoint.truncations.iter().find(|t| t.index == i);
                match (cut, through.tokens.get(i)) {
                    (Some(t), Some(&tokens)) => self.truncated(i, tokens, t.keep_tokens),
                    _ => self.turns[i].raw.clone(),
                }
            })
            .collect();
        let first_is_user = pinned
            .or((covered < self.turns.len()).then_some(covered))
            .is_some_and(|i| self.turns[i].role == Role::User);
        if through.merge_into_user && first_is_user {
            let mut first: Value = serde_json::from_str(kept[0].get()).unwrap_or(Value::Null);
            let say = first["say"].as_str().unwrap_or("").to_string();
            first["say"] = Value::String(format!("{}\n\n{say}", through.text));
            kept[0] = to_raw(&first);
        } else {
            kept.insert(0, to_raw(&json!({"who": "user", "say": through.text})));
        }
        splice::object_with_array(&self.fields, "turns", kept.iter().map(|r| &**r))
    }
}

/// The format's provider, in-process: it answers conversation bodies, enforces a window by its
/// own count, refuses a longer prompt in its own words, and writes numbered summaries
/// (`SUMMARY-n`) through the dialect's summary request and answer.
#[derive(Default)]
pub struct Provider {
    /// Enforced window (0: none).
    pub window: AtomicU64,
    received: Mutex<Vec<Bytes>>,
    overflows: AtomicUsize,
    summaries: AtomicUsize,
}

impl Provider {
    /// The provider's own count of a body: the text of its rules and turns.
    pub fn tokens(body: &[u8]) -> u64 {
        let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let mut text = value["rules"].as_str().unwrap_or("").to_string();
        for turn in value["turns"].as_array().into_iter().flatten() {
            text.push('\n');
            text.push_str(turn["say"].as_str().unwrap_or(""));
            text.push_str(turn["call"]["args"].as_str().unwrap_or(""));
        }
        Encoding::O200k.count(&text)
    }

    /// Answers a conversation body: its status and body.
    pub fn answer(&self, body: &[u8]) -> (u16, Vec<u8>) {
        self.received
            .lock()
            .unwrap()
            .push(Bytes::copy_from_slice(body));
        let counted = Self::tokens(body);
        let window = self.window.load(Ordering::SeqCst);
        if window > 0 && counted > window {
            self.overflows.fetch_add(1, Ordering::SeqCst);
            let problem =
                json!({"problem": {"kind": "too_long", "limit": window, "counted": counted}});
            return (400, problem.to_string().into_bytes());
        }
        let reply = json!({"reply": {"who": "bot", "say": super::provider_mock::ANSWER},
                           "usage": {"in": counted}});
        (200, reply.to_string().into_bytes())
    }

    /// Every conversation body received, in order.
    pub fn received(&self) -> Vec<Bytes> {
        self.received.lock().unwrap().clone()
    }

    pub fn overflows(&self) -> usize {
        self.overflows.load(Ordering::SeqCst)
    }

    pub fn summaries(&self) -> usize {
        self.summaries.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Summarizer for Provider {
    /// The summary request written by the dialect, answered by the provider, read back by the
    /// dialect: what an HTTP summarizer does, without the socket.
    async fn summarize(
        &self,
        request: &SummaryRequest<'_>,
        _credentials: &http::HeaderMap,
    ) -> Result<String, SummarizerError> {
        let body = Turns.summary_request(request);
        if body["turns"][0]["say"].as_str() != Some(request.user) {
            return Err(SummarizerError::Status(400));
        }
        let n = self.summaries.fetch_add(1, Ordering::SeqCst) + 1;
        let say = format!(
            "## Goal\nSUMMARY-{n}: keep the conversation going.\n## Progress\n### Done\nsteps\n## Next steps\ncontinue"
        );
        let answer = json!({"reply": {"who": "bot", "say": say}});
        Ok(Turns.summary_answer(answer.to_string().as_bytes())?)
    }
}
