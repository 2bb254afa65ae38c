//! Measuring: how many tokens a request costs, and how large the model's window is.
//!
//! Counts are exact for OpenAI's tokenizers ([`crate::tokenizer`]); each dialect adds its
//! format's overhead ([`WireRequest::tokens`]). Each element is counted once: the count and the
//! element's canonical hash are cached under a keyed hash of its dialect and raw bytes, so a
//! conversation that grows by one turn costs only that turn. Other model families are corrected
//! by a learned factor (see [`calibration`]); [`windows`] knows each model's window. Requests are
//! counted on the blocking pool when large ([`Meter::measure_cancellable`]), stopping when the
//! client has gone.

pub mod calibration;
pub mod windows;

use std::sync::Arc;

use quick_cache::sync::Cache;
use xxhash_rust::xxh3::Xxh3;

use crate::dialect::media::MediaCost;
use crate::dialect::WireRequest;
use crate::identity::Hash;
use crate::tokenizer::{Cancel, Encoding, REPLY_PRIMING};

pub use crate::dialect::seen::ElementFacts;

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
///
/// The cache's keys are XXH3-128 hashes under a secret drawn when the meter is made. Every
/// request hashes all of its bytes to find what it has seen before, so the hash is the warm
/// path's largest cost after parsing, and most elements are a few kilobytes, too short for
/// BLAKE3's parallel chunks: XXH3 hashed a 720 KB conversation's elements in 40 µs where BLAKE3
/// took 600 µs. The secret keeps anyone outside the process from making two elements that share
/// a key. Even such a pair could only give an element another's count and canonical hash, never
/// another tenant's checkpoint: every identity chain is seeded with its tenant.
#[derive(Clone)]
pub struct Meter {
    cache: Arc<Cache<(u8, u128), ElementFacts>>,
    secret: Arc<[u8; KEY_SECRET]>,
}

/// The size of the cache keys' secret: XXH3's default secret's.
const KEY_SECRET: usize = 192;

impl Meter {
    /// A meter whose cache holds up to `capacity` messages.
    pub fn new(capacity: usize) -> Meter {
        Meter {
            cache: Arc::new(Cache::new(capacity.max(16))),
            secret: Arc::new({
                let mut secret = [0u8; KEY_SECRET];
                rand::Rng::fill(&mut rand::thread_rng(), &mut secret[..]);
                secret
            }),
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

    /// Facts about one element: kept with the element when it was measured before (a parsed
    /// element seen before), else from the cache when its exact bytes were seen before in the
    /// same dialect.
    fn element_until(
        &self,
        encoding: Encoding,
        request: &dyn WireRequest,
        index: usize,
        cancel: &Cancel,
    ) -> Option<ElementFacts> {
        let counted = request.counted(index);
        if let Some(facts) = counted.and_then(|c| c.get(encoding)) {
            return Some(facts);
        }
        let key = self.cache_key(encoding.index(), request.dialect(), [request.raw(index)]);
        let facts = match self.cache.get(&key) {
            Some(found) => found,
            None => {
                let facts = ElementFacts {
                    canonical: request.canonical(index),
                    tokens: request.tokens_until(encoding, index, cancel)?,
                    media: request.media_cost(index),
                };
                self.cache.insert(key, facts);
                facts
            }
        };
        if let Some(counted) = counted {
            counted.set(encoding, facts);
        }
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
        let key = self.cache_key(encoding.index() | 0x80, request.dialect(), parts);
        if let Some(found) = self.cache.get(&key) {
            return Some(found.tokens);
        }
        let tokens = request.head_tokens(encoding);
        let facts = ElementFacts {
            // The head takes no part in identity.
            canonical: Hash::default(),
            tokens,
            media: MediaCost::None,
        };
        self.cache.insert(key, facts);
        Some(tokens)
    }

    /// Number of entries currently cached (messages and tool blocks; for tests and metrics).
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// The cache key of some bytes of one dialect: elements that are byte-identical in two
    /// formats (`{"role":"user","content":"hi"}`) may count differently.
    fn cache_key<'a>(
        &self,
        kind: u8,
        dialect: &str,
        parts: impl IntoIterator<Item = &'a str>,
    ) -> (u8, u128) {
        let mut hasher = Xxh3::with_secret(*self.secret);
        hasher.update(dialect.as_bytes());
        for part in parts {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        (kind, hasher.digest128())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::chat::request::ChatRequest;
    use crate::tokenizer::TOKENS_FOR_TOOLS;

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
        // Messages no other test parses: one parsed before in this process brings its count
        // with it, and the meter's own cache would not fill.
        let meter = Meter::new(100);
        let first = ChatRequest::parse(
            br#"{"model":"gpt-4o","messages":[{"role":"system","content":"be brief, cache"},{"role":"user","content":"hi, cache"}]}"#,
        )
        .unwrap();
        let a = meter.measure(&first);
        assert_eq!(meter.cached(), 2);
        let next = ChatRequest::parse(br#"{"model":"gpt-4o","messages":[{"role":"system","content":"be brief, cache"},{"role":"user","content":"hi, cache"},{"role":"assistant","content":"hello, cache"}]}"#).unwrap();
        let b = meter.measure(&next);
        // Only the new message was tokenized and added.
        assert_eq!(meter.cached(), 3);
        assert_eq!(a.elements[..], b.elements[..2]);
    }

    #[test]
    fn an_element_parsed_before_brings_its_count() {
        let body = br#"{"model":"gpt-4o","messages":[{"role":"user","content":"counted once, kept with the message"}]}"#;
        let first = ChatRequest::parse(body).unwrap();
        let measured = Meter::new(100).measure(&first);
        // The same bytes again are the same parsed message, its facts with it: a meter that has
        // never seen it measures it alike without counting or caching anything.
        let again = ChatRequest::parse(body).unwrap();
        let fresh = Meter::new(100);
        assert_eq!(
            fresh.measure(&again).elements,
            measured.elements,
            "facts carried by the element"
        );
        assert_eq!(fresh.cached(), 0);
    }

    #[test]
    fn a_cleared_message_is_counted_again() {
        use crate::dialect::anthropic::parse::MessagesRequest;
        use crate::dialect::edits::{ClearedResult, Clearing};
        use crate::dialect::WireRequest;
        let result = "a long tool result ".repeat(200);
        let body = format!(
            r#"{{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[{{"role":"user","content":"read it"}},{{"role":"assistant","content":[{{"type":"tool_use","id":"t1","name":"read","input":{{}}}}]}},{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t1","content":"{result}"}}]}}]}}"#
        );
        let meter = Meter::new(100);
        let before = meter.measure(&MessagesRequest::parse(body.as_bytes()).unwrap());
        let mut cleared = MessagesRequest::parse(body.as_bytes()).unwrap();
        cleared.apply_clearing(&Clearing {
            results: vec![ClearedResult {
                call_id: "t1".into(),
                stub: "[cleared]".into(),
            }],
            ..Clearing::default()
        });
        let after = meter.measure(&cleared);
        assert!(
            after.elements[2].tokens * 10 < before.elements[2].tokens,
            "{} then {}",
            before.elements[2].tokens,
            after.elements[2].tokens
        );
        // The shared message keeps the facts of its own bytes.
        let untouched = meter.measure(&MessagesRequest::parse(body.as_bytes()).unwrap());
        assert_eq!(untouched.elements, before.elements);
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
        assert!(
            b > a + crate::dialect::media::OPENAI_MAX_IMAGE_TOKENS + TOKENS_FOR_TOOLS,
            "{a} {b}"
        );
    }

    #[test]
    fn a_cancelled_measurement_stops_and_caches_nothing() {
        let meter = Meter::new(100);
        let request = ChatRequest::parse(
            br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello, cancelled"}]}"#,
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
}
