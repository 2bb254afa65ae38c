//! A chat-completions agent session for tests that drive a conversation past its window: a
//! system prompt and tools, then turns of a user request, parallel tool calls (a read and an
//! edit) and their results, sent whole on every request as agents do.

use serde_json::{json, Value};

use super::{Proxy, Reply};

/// Deterministic filler text of `words` words.
pub fn filler(seed: usize, words: usize) -> String {
    const VOCAB: &[&str] = &[
        "alpha",
        "parser",
        "token",
        "buffer",
        "socket",
        "retry",
        "handler",
        "config",
        "stream",
        "window",
        "checkpoint",
        "summary",
        "vector",
        "index",
    ];
    (0..words)
        .map(|i| VOCAB[(seed * 7 + i * 13) % VOCAB.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

pub struct AgentSession {
    pub messages: Vec<Value>,
    pub model: String,
}

impl AgentSession {
    pub fn new(model: &str, system: &str) -> AgentSession {
        AgentSession {
            messages: vec![json!({"role": "system", "content": system})],
            model: model.into(),
        }
    }

    pub fn body(&self) -> Value {
        json!({
            "model": self.model,
            "messages": self.messages,
            "max_tokens": 256,
            "tools": [
                {"type":"function","function":{"name":"read","description":"Read a file","parameters":{"type":"object","properties":{"path":{"type":"string"}}}}},
                {"type":"function","function":{"name":"edit","description":"Edit a file","parameters":{"type":"object","properties":{"path":{"type":"string"},"oldText":{"type":"string"},"newText":{"type":"string"}}}}}
            ],
        })
    }

    /// One turn: the user's request, then a read and an edit with their results, then the
    /// assistant's answer.
    pub fn turn(&mut self, t: usize) {
        self.messages
            .push(json!({"role": "user", "content": format!("Step {t}: {}", filler(t, 30))}));
        self.messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("r{t}"), "type": "function", "function": {"name": "read", "arguments": json!({"path": format!("src/module_{}.rs", t % 5)}).to_string()}},
            {"id": format!("e{t}"), "type": "function", "function": {"name": "edit", "arguments": json!({"path": format!("src/feature_{t}.rs"), "oldText": "a", "newText": "b"}).to_string()}}
        ]}));
        self.messages.push(
            json!({"role": "tool", "tool_call_id": format!("r{t}"), "content": filler(t, 150)}),
        );
        self.messages
            .push(json!({"role": "tool", "tool_call_id": format!("e{t}"), "content": "ok"}));
    }

    pub fn answered(&mut self, t: usize) {
        self.messages
            .push(json!({"role": "assistant", "content": format!("Done with step {t}.")}));
    }

    /// Sends the session as it stands, with `credential` as `(header, value)`.
    pub async fn send(&self, proxy: &Proxy, credential: (&str, &str)) -> Reply {
        super::post(
            &format!("{}/v1/chat/completions", proxy.url()),
            &[credential, ("content-type", "application/json")],
            self.body().to_string(),
        )
        .await
    }

    /// Sends `turns` turns, one request each, and returns the answers in order.
    pub async fn drive(
        &mut self,
        proxy: &Proxy,
        credential: (&str, &str),
        turns: usize,
    ) -> Vec<Reply> {
        let mut replies = vec![];
        for t in 0..turns {
            self.turn(t);
            let reply = self.send(proxy, credential).await;
            assert_eq!(reply.status, 200, "turn {t}: {}", reply.body);
            replies.push(reply);
            self.answered(t);
        }
        replies
    }
}

/// Where a new checkpoint took effect, by request (0-based): each answer's
/// `x-compactor-checkpoint` that differs from the one before.
pub fn checkpoint_changes(replies: &[Reply]) -> Vec<usize> {
    let mut previous: Option<String> = None;
    let mut changes = vec![];
    for (i, reply) in replies.iter().enumerate() {
        let now = reply.header("x-compactor-checkpoint").map(str::to_string);
        if now.is_some() && now != previous {
            changes.push(i);
        }
        previous = now;
    }
    changes
}
