//! Measuring: how many tokens a request costs, and how large the model's window is.
//!
//! Counts are exact for OpenAI's tokenizers (tiktoken `o200k_base` / `cl100k_base`); each
//! dialect adds its format's overhead ([`WireRequest::tokens`]; chat follows OpenAI's accounting,
//! [`count_message`]). Each element is counted once: the count and the element's canonical hash
//! are cached under a hash of its dialect and raw bytes, so a conversation that grows by one turn
//! costs only that turn. Other model families are corrected by a learned factor
//! (see [`calibration`]). When the provider says the window is full, [`overflow`] reads what
//! it said: the real window and its own count of the prompt.
//!
//! Counting stays linear in the text's length: tiktoken's merge step is quadratic in the length
//! of one pre-tokenized piece, so a long stretch without a word boundary (a run of one letter,
//! base64, CJK text without spaces) is cut into bounded pieces first. The count is then an
//! upper bound there (a cut can only prevent merges), exact everywhere else. Requests are counted
//! on the blocking pool ([`Meter::measure_cancellable`]), stopping when the client has gone.

pub mod calibration;
pub mod overflow;
pub mod windows;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use quick_cache::sync::Cache;
use tiktoken_rs::CoreBPE;

use crate::dialect::WireRequest;
use crate::identity::Hash;
use crate::request::Message;

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
/// Longest stretch of text without a word boundary that is encoded as one piece. Tokens are at
/// most a few dozen bytes long, so cutting here costs at most one token per cut, while the
/// quadratic merge step stays cheap on every piece.
const MAX_UNBROKEN_BYTES: usize = 512;

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

    /// Tokens in a piece of text: exact for ordinary text, an upper bound for text with long
    /// stretches between word boundaries.
    pub fn count(self, text: &str) -> u64 {
        self.count_until(text, &Cancel::default()).unwrap_or(0)
    }

    /// Like [`Encoding::count`], giving up (None) once `cancel` is set.
    pub(crate) fn count_until(self, text: &str, cancel: &Cancel) -> Option<u64> {
        let bpe = self.bpe();
        let mut tokens = 0;
        for piece in bounded_pieces(text) {
            if cancel.is_set() {
                return None;
            }
            tokens += bpe.encode_ordinary(piece).len() as u64;
        }
        Some(tokens)
    }

    fn index(self) -> u8 {
        match self {
            Encoding::O200k => 0,
            Encoding::Cl100k => 1,
        }
    }
}

/// Splits `text` where a stretch without a word boundary grows past [`MAX_UNBROKEN_BYTES`], and
/// nowhere else. A word boundary is a space or tab right after a non-space character: the
/// tokenizers' pre-tokenizer (cl100k and o200k alike) always starts a new piece there, so text
/// whose stretches are all short is encoded exactly as a whole.
fn bounded_pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut since_boundary = 0;
        let mut previous_is_space = true;
        let mut cut = rest.len();
        for (i, c) in rest.char_indices() {
            if (c == ' ' || c == '\t') && !previous_is_space {
                since_boundary = i;
            } else if i - since_boundary >= MAX_UNBROKEN_BYTES {
                cut = i;
                break;
            }
            previous_is_space = c.is_whitespace();
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

/// Set when the request that wants a count has gone: counting stops at the next piece.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// A guard that cancels when dropped, e.g. with the future of a request whose client left.
    pub fn on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }
}

/// Cancels its [`Cancel`] when dropped.
pub struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// What the cache knows of one element of a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementFacts {
    /// Hash of the element's canonical form (see [`WireRequest::canonical`]).
    pub canonical: Hash,
    /// Tokens, overhead included.
    pub tokens: u64,
}

/// The measurement of a whole request.
#[derive(Debug, Clone)]
pub struct Measured {
    pub encoding: Encoding,
    /// The conversation's elements, in order.
    pub elements: Vec<ElementFacts>,
    /// The pinned head that is not an element (chat: `tools`).
    pub head_tokens: u64,
}

impl Measured {
    /// The prompt's total: elements, head, reply priming.
    pub fn total(&self) -> u64 {
        self.elements.iter().map(|m| m.tokens).sum::<u64>() + self.head_tokens + REPLY_PRIMING
    }
}

/// Counts tokens, with a bounded per-message cache shared by all requests.
#[derive(Clone)]
pub struct Meter {
    cache: Arc<Cache<(u8, Hash), ElementFacts>>,
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

    pub fn measure(&self, request: &dyn WireRequest) -> Measured {
        self.measure_cancellable(request, &Cancel::default())
            .expect("an uncancelled count completes")
    }

    /// Measures `request`, giving up (None) once `cancel` is set. Counts finished before that
    /// stay cached, so nothing is counted twice when the measurement is run again.
    pub fn measure_cancellable(
        &self,
        request: &dyn WireRequest,
        cancel: &Cancel,
    ) -> Option<Measured> {
        let encoding = Encoding::for_model(request.model());
        let elements = (0..request.len())
            .map(|i| self.element_until(encoding, request, i, cancel))
            .collect::<Option<Vec<_>>>()?;
        Some(Measured {
            encoding,
            elements,
            head_tokens: self.head(encoding, request, cancel)?,
        })
    }

    /// Facts about one element, from the cache when its exact bytes were seen before in the
    /// same dialect.
    fn element_until(
        &self,
        encoding: Encoding,
        request: &dyn WireRequest,
        index: usize,
        cancel: &Cancel,
    ) -> Option<ElementFacts> {
        let key = cache_key(encoding.index(), request.dialect(), [request.raw(index)]);
        if let Some(found) = self.cache.get(&key) {
            return Some(found);
        }
        let facts = ElementFacts {
            canonical: request.canonical(index),
            tokens: request.tokens_until(encoding, index, cancel)?,
        };
        self.cache.insert(key, facts);
        Some(facts)
    }

    /// Tokens of the pinned head; agents resend the same tools and system prompt with every
    /// request, so it is cached like an element.
    fn head(&self, encoding: Encoding, request: &dyn WireRequest, cancel: &Cancel) -> Option<u64> {
        if cancel.is_set() {
            return None;
        }
        let parts = request.head_parts();
        if parts.is_empty() {
            return Some(request.head_tokens(encoding));
        }
        let key = cache_key(encoding.index() | 0x80, request.dialect(), parts);
        if let Some(found) = self.cache.get(&key) {
            return Some(found.tokens);
        }
        let tokens = request.head_tokens(encoding);
        let facts = ElementFacts {
            canonical: key.1,
            tokens,
        };
        self.cache.insert(key, facts);
        Some(tokens)
    }

    /// Number of entries currently cached (messages and tool blocks; for tests and metrics).
    pub fn cached(&self) -> usize {
        self.cache.len()
    }
}

/// The cache key of some bytes of one dialect: elements that are byte-identical in two formats
/// (`{"role":"user","content":"hi"}`) may count differently.
fn cache_key<'a>(kind: u8, dialect: &str, parts: impl IntoIterator<Item = &'a str>) -> (u8, Hash) {
    let mut hasher = blake3::Hasher::new();
    hasher.update(dialect.as_bytes());
    for part in parts {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part.as_bytes());
    }
    (kind, *hasher.finalize().as_bytes())
}

/// Tokens of one message, without the cache.
pub fn count_message(encoding: Encoding, message: &Message) -> u64 {
    count_message_until(encoding, message, &Cancel::default()).unwrap_or(0)
}

pub(crate) fn count_message_until(
    encoding: Encoding,
    message: &Message,
    cancel: &Cancel,
) -> Option<u64> {
    let view = message.view();
    let count = |text: &str| encoding.count_until(text, cancel);
    let mut tokens = TOKENS_PER_MESSAGE + count(message.role.as_str())? + count(&view.text)?;
    if let Some(name) = &view.name {
        tokens += TOKENS_PER_NAME + count(name)?;
    }
    for call in &view.tool_calls {
        tokens += TOKENS_PER_TOOL_CALL + count(&call.name)? + count(&call.arguments)?;
    }
    if let Some(id) = &view.tool_call_id {
        tokens += count(id)?;
    }
    Some(tokens + view.media_parts as u64 * TOKENS_PER_MEDIA_PART)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::ChatRequest;

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
        assert_eq!(a.elements[..], b.elements[..2]);
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

    #[test]
    fn text_with_word_boundaries_is_counted_exactly() {
        let words = [
            "parser",
            "naïve",
            "x=1;",
            "\n",
            "résumé",
            "\t",
            "  ",
            "日本語",
            "http://a/b?c",
        ];
        let text: String = (0..5_000)
            .map(|i| words[(i * 7) % words.len()])
            .collect::<Vec<_>>()
            .join(" ");
        for encoding in [Encoding::O200k, Encoding::Cl100k] {
            let exact = encoding.bpe().encode_ordinary(&text).len() as u64;
            assert_eq!(encoding.count(&text), exact, "{encoding:?}");
        }
    }

    #[test]
    fn long_stretches_are_cut_into_bounded_pieces_and_never_undercounted() {
        for text in [
            "a".repeat(300_000),
            "é".repeat(100_000),
            "ab+".repeat(50_000),
            " ".repeat(10_000),
        ] {
            let pieces: Vec<&str> = bounded_pieces(&text).collect();
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().all(|p| p.len() <= MAX_UNBROKEN_BYTES + 4));
        }
        // Where the exact count is affordable, the bounded one is at least as large and close.
        let text = format!("start {} end", "a".repeat(4_000));
        let exact = Encoding::O200k.bpe().encode_ordinary(&text).len() as u64;
        let bounded = Encoding::O200k.count(&text);
        assert!(
            bounded >= exact && bounded <= exact + 10,
            "{bounded} vs {exact}"
        );
    }

    #[test]
    fn a_cancelled_measurement_stops_and_caches_nothing() {
        let meter = Meter::new(100);
        let request = ChatRequest::parse(
            br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}"#,
        )
        .unwrap();
        let cancel = Cancel::default();
        drop(cancel.on_drop());
        assert!(cancel.is_set());
        assert!(meter.measure_cancellable(&request, &cancel).is_none());
        assert_eq!(meter.cached(), 0);
        assert!(meter
            .measure_cancellable(&request, &Cancel::default())
            .is_some());
        assert_eq!(meter.cached(), 1);
    }

    #[test]
    fn a_message_of_unexpected_shape_is_counted_with_all_its_text() {
        let text = "the quick brown fox jumps over the lazy dog ".repeat(20);
        let plain = format!(r#"{{"role":"user","content":"{text}"}}"#);
        let odd = [
            format!(r#"{{"role":"user","name":5,"content":"{text}"}}"#),
            format!(r#"{{"role":"tool","tool_call_id":5,"content":"{text}"}}"#),
            format!(r#"{{"role":"user","content":"x","content":"{text}"}}"#),
            format!(
                r#"{{"role":"user","content":[{{"type":"text","text":1}},{{"type":"text","text":"{text}"}}]}}"#
            ),
        ];
        let count = |json: &str| {
            let raw = serde_json::value::RawValue::from_string(json.to_string()).unwrap();
            count_message(Encoding::O200k, &Message::parse(raw).unwrap())
        };
        let baseline = count(&plain);
        assert!(baseline > 100);
        for message in odd {
            assert!(count(&message) >= baseline, "{message}");
        }
    }
}
