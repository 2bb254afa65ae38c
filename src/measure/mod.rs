//! Measuring: how many tokens a chat request costs, and how large the model's window is.
//!
//! Counts are exact for OpenAI's tokenizers (tiktoken `o200k_base` / `cl100k_base`) and follow
//! OpenAI's accounting of chat overhead. Each message is counted once: the count and the
//! message's canonical hash are cached under a hash of its raw bytes, so a conversation that grows
//! by one turn costs only that turn. Other model families are corrected by a learned factor
//! (see [`calibration`]). When the provider says the window is full, [`overflow`] reads what
//! it said: the real window and its own count of the prompt.

pub mod calibration;
pub mod overflow;
pub mod windows;

use std::sync::Arc;

use quick_cache::sync::Cache;
use tiktoken_rs::CoreBPE;

use crate::identity::{canonical_hash, Hash};
use crate::request::{ChatRequest, Message};

/// Tokens every message costs beyond its content (role and delimiters).
pub const TOKENS_PER_MESSAGE: u64 = 3;
/// Extra cost of a `name` field.
pub const TOKENS_PER_NAME: u64 = 1;
/// Tokens that prime the assistant's reply.
pub const REPLY_PRIMING: u64 = 3;
/// Fixed cost charged per image or other media part (a 1024×1024 image at high detail).
pub const TOKENS_PER_MEDIA_PART: u64 = 765;
/// Overhead of each tool call inside an assistant message.
pub const TOKENS_PER_TOOL_CALL: u64 = 8;
/// Overhead of the tool definitions block.
pub const TOKENS_FOR_TOOLS: u64 = 12;

/// Which BPE a model is counted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    O200k,
    Cl100k,
}

impl Encoding {
    /// `cl100k_base` for gpt-4 and gpt-3.5 (but not gpt-4o / gpt-4.1), `o200k_base` for
    /// everything else, including unknown models.
    pub fn for_model(model: &str) -> Encoding {
        let m = model.to_ascii_lowercase();
        let m = m.rsplit('/').next().unwrap_or(&m);
        let is_legacy = m.starts_with("gpt-3.5")
            || m.starts_with("gpt-35")
            || (m.starts_with("gpt-4")
                && !m.starts_with("gpt-4o")
                && !m.starts_with("gpt-4.")
                && !m.starts_with("gpt-4-o"));
        if is_legacy {
            Encoding::Cl100k
        } else {
            Encoding::O200k
        }
    }

    fn bpe(self) -> &'static CoreBPE {
        match self {
            Encoding::O200k => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100k => tiktoken_rs::cl100k_base_singleton(),
        }
    }

    /// Tokens in a piece of text.
    pub fn count(self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        self.bpe().encode_ordinary(text).len() as u64
    }

    fn index(self) -> u8 {
        match self {
            Encoding::O200k => 0,
            Encoding::Cl100k => 1,
        }
    }
}

/// What the cache knows of one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageFacts {
    /// Hash of the message's canonical JSON (key order and whitespace do not matter).
    pub canonical: Hash,
    /// Tokens, overhead included.
    pub tokens: u64,
}

/// The measurement of a whole request.
#[derive(Debug, Clone)]
pub struct Measured {
    pub encoding: Encoding,
    pub messages: Vec<MessageFacts>,
    pub tools_tokens: u64,
}

impl Measured {
    /// The prompt's total: messages, tools, reply priming.
    pub fn total(&self) -> u64 {
        self.messages.iter().map(|m| m.tokens).sum::<u64>() + self.tools_tokens + REPLY_PRIMING
    }
}

/// Counts tokens, with a bounded per-message cache shared by all requests.
#[derive(Clone)]
pub struct Meter {
    cache: Arc<Cache<(u8, Hash), MessageFacts>>,
}

impl Meter {
    /// A meter whose cache holds up to `capacity` messages.
    pub fn new(capacity: usize) -> Meter {
        Meter {
            cache: Arc::new(Cache::new(capacity.max(16))),
        }
    }

    /// Loads the tokenizer most requests use now rather than on the first request. The legacy
    /// one loads on first use: each costs tens of megabytes.
    pub fn warm_up() {
        Encoding::O200k.count("warm");
    }

    pub fn measure(&self, request: &ChatRequest) -> Measured {
        let encoding = Encoding::for_model(&request.model);
        let messages = request
            .messages
            .iter()
            .map(|m| self.message(encoding, m))
            .collect();
        let tools_tokens = request
            .tools_raw()
            .map(|raw| self.tools(encoding, raw))
            .sum();
        Measured {
            encoding,
            messages,
            tools_tokens,
        }
    }

    /// Facts about one message, from the cache when its exact bytes were seen before.
    pub fn message(&self, encoding: Encoding, message: &Message) -> MessageFacts {
        let key = (
            encoding.index(),
            *blake3::hash(message.raw.get().as_bytes()).as_bytes(),
        );
        if let Some(found) = self.cache.get(&key) {
            return found;
        }
        let facts = MessageFacts {
            canonical: canonical_hash(&message.raw),
            tokens: count_message(encoding, message),
        };
        self.cache.insert(key, facts);
        facts
    }

    /// Tokens of a tool definitions block; agents resend the same block with every request, so
    /// it is cached like a message.
    fn tools(&self, encoding: Encoding, raw: &str) -> u64 {
        let key = (
            encoding.index() | 0x80,
            *blake3::hash(raw.as_bytes()).as_bytes(),
        );
        if let Some(found) = self.cache.get(&key) {
            return found.tokens;
        }
        let tokens = encoding.count(raw) + TOKENS_FOR_TOOLS;
        let facts = MessageFacts {
            canonical: key.1,
            tokens,
        };
        self.cache.insert(key, facts);
        tokens
    }

    /// Number of entries currently cached (messages and tool blocks; for tests and metrics).
    pub fn cached(&self) -> usize {
        self.cache.len()
    }
}

/// Tokens of one message, without the cache.
pub fn count_message(encoding: Encoding, message: &Message) -> u64 {
    let view = message.view();
    let mut tokens =
        TOKENS_PER_MESSAGE + encoding.count(message.role.as_str()) + encoding.count(&view.text);
    if let Some(name) = &view.name {
        tokens += TOKENS_PER_NAME + encoding.count(name);
    }
    for call in &view.tool_calls {
        tokens +=
            TOKENS_PER_TOOL_CALL + encoding.count(&call.name) + encoding.count(&call.arguments);
    }
    if let Some(id) = &view.tool_call_id {
        tokens += encoding.count(id);
    }
    tokens + view.media_parts as u64 * TOKENS_PER_MEDIA_PART
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_encoding_by_family() {
        assert_eq!(Encoding::for_model("gpt-4"), Encoding::Cl100k);
        assert_eq!(Encoding::for_model("gpt-4-turbo"), Encoding::Cl100k);
        assert_eq!(Encoding::for_model("gpt-3.5-turbo"), Encoding::Cl100k);
        assert_eq!(Encoding::for_model("gpt-4o-mini"), Encoding::O200k);
        assert_eq!(Encoding::for_model("gpt-4.1"), Encoding::O200k);
        assert_eq!(Encoding::for_model("gpt-5"), Encoding::O200k);
        assert_eq!(Encoding::for_model("o3-mini"), Encoding::O200k);
        assert_eq!(Encoding::for_model("some-local-model"), Encoding::O200k);
    }

    #[test]
    fn known_token_counts() {
        // Reference counts from OpenAI's tokenizers.
        assert_eq!(Encoding::Cl100k.count("hello world"), 2);
        assert_eq!(Encoding::O200k.count("hello world"), 2);
        assert_eq!(Encoding::Cl100k.count("tiktoken is great!"), 6);
        assert_eq!(Encoding::O200k.count(""), 0);
    }

    #[test]
    fn chat_overhead_matches_openai_accounting() {
        // OpenAI's cookbook: each message costs 3 + role + content, plus 3 to prime the reply.
        let req = ChatRequest::parse(
            br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}"#,
        )
        .unwrap();
        let measured = Meter::new(100).measure(&req);
        assert_eq!(measured.total(), 3 + 1 + 2 + 3);
    }

    #[test]
    fn repeated_conversation_hits_the_cache() {
        let meter = Meter::new(100);
        let first = ChatRequest::parse(
            br#"{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        let a = meter.measure(&first);
        assert_eq!(meter.cached(), 2);
        let next = ChatRequest::parse(br#"{"model":"gpt-4o","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]}"#).unwrap();
        let b = meter.measure(&next);
        // Only the new message was tokenized and added.
        assert_eq!(meter.cached(), 3);
        assert_eq!(a.messages[..], b.messages[..2]);
    }

    #[test]
    fn tools_and_images_are_charged() {
        let meter = Meter::new(100);
        let plain =
            ChatRequest::parse(br#"{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}"#)
                .unwrap();
        let with_tools = ChatRequest::parse(br#"{"model":"gpt-4o","tools":[{"type":"function","function":{"name":"read_file","parameters":{}}}],"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"data:"}}]}]}"#).unwrap();
        let a = meter.measure(&plain).total();
        let b = meter.measure(&with_tools).total();
        assert!(b > a + TOKENS_PER_MEDIA_PART + TOKENS_FOR_TOOLS, "{a} {b}");
    }
}
