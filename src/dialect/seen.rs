//! Elements seen before: a conversation's elements parsed once, and found again by their bytes.
//!
//! Agents send the whole conversation on every request, so a long session's body is almost all
//! elements the proxy parsed one request earlier. Checking every byte of it as JSON again was
//! most of the time the proxy spent on a 200k-token body (a 720 KB chat body: about 0.5 ms of
//! serde's checks, mostly on the escapes of file contents). Here the body is split by skipping
//! over it ([`super::scan`]'s way: strings to their closing quote, structure by brackets), and
//! each element is looked up by a keyed hash of its bytes: an element seen before is the parsed
//! element of last time, shared; only a new one is checked and parsed.
//!
//! The lookup is as strict as the full parse because nothing unchecked gets through: an element
//! found here has exactly the bytes of one that passed the full check (the hash is keyed with a
//! secret drawn at start, so nobody outside the process can make two byte strings share a key),
//! every other value is checked by serde, and the punctuation between them by the split itself.
//! Anything it does not read plainly (bytes that are not UTF-8, a conversation that is not an
//! array, the conversation's key twice, deep nesting, an element that fails its check or its
//! dialect's parse) gives `None`, and the caller takes the full path, which says what is wrong
//! in the words it always used.
//!
//! An element is a pure function of its bytes, so one tenant's parse may serve another's: what
//! is shared is what both sent, never anything of either beyond it. The same holds of what the
//! meter learns of an element (its tokens and canonical hash, per encoding): it is kept with the
//! parsed element ([`Counted`]), so an element seen before is measured without hashing its
//! bytes again.
//!
//! Each dialect keeps [`capacity`] bytes of elements (the `seen_elements_bytes` setting, read
//! once at start; 0 turns the lookup off), and counts what it found and what it parsed
//! ([`SeenElements::counts`]) for the metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use quick_cache::sync::Cache;
use quick_cache::Weighter;
use serde_json::value::RawValue;
use xxhash_rust::xxh3::Xxh3;

use super::media::MediaCost;
use super::scan;
use super::splice::Fields;
use crate::identity::Hash;
pub use crate::metrics::SeenCounts;
use crate::tokenizer::Encoding;

/// How many bytes of elements each dialect keeps parsed unless told otherwise: a few long
/// conversations' worth.
pub const SEEN_BYTES: u64 = 32 * 1024 * 1024;

/// The bytes each dialect's elements may take: [`SEEN_BYTES`] until [`set_capacity`].
static CAPACITY: AtomicU64 = AtomicU64::new(SEEN_BYTES);

/// Sets the bytes of elements each dialect keeps. Each dialect reads it when it first parses a
/// body: set it before the first request (a later call changes nothing already made).
pub fn set_capacity(bytes: u64) {
    CAPACITY.store(bytes, Ordering::Relaxed);
}

/// The bytes of elements each dialect keeps (see [`set_capacity`]).
pub fn capacity() -> u64 {
    CAPACITY.load(Ordering::Relaxed)
}

/// Nesting deeper than this, in a value checked on its own, is left to the full parse: serde
/// counts its limit (128) from the body's top, and a value here sits one or two levels down.
const CHECKED_DEPTH: usize = 100;

/// The size of the keys' secret: XXH3's default secret's.
const KEY_SECRET: usize = 192;

/// What the meter knows of one element of a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementFacts {
    /// Hash of the element's canonical form (see [`super::WireRequest::canonical`]).
    pub canonical: Hash,
    /// Tokens, overhead included.
    pub tokens: u64,
    /// How its media were costed ([`super::WireRequest::media_cost`]).
    pub media: MediaCost,
}

/// An element's [`ElementFacts`] per encoding, kept with the parsed element for as long as it
/// lives (requests and the cache of elements seen share it). A copy starts empty: a copy is
/// made to be rewritten, and its facts would then be another element's.
#[derive(Debug, Default)]
pub struct Counted([OnceLock<ElementFacts>; 2]);

impl Counted {
    pub fn get(&self, encoding: Encoding) -> Option<ElementFacts> {
        self.0.get(usize::from(encoding.index()))?.get().copied()
    }

    pub fn set(&self, encoding: Encoding, facts: ElementFacts) {
        if let Some(slot) = self.0.get(usize::from(encoding.index())) {
            let _ = slot.set(facts);
        }
    }
}

impl Clone for Counted {
    fn clone(&self) -> Counted {
        Counted::default()
    }
}

/// Parsed elements of one dialect, by a keyed hash of their bytes, bounded by bytes.
pub struct SeenElements<T> {
    cache: Cache<u128, (Arc<T>, u32), ByLength>,
    secret: [u8; KEY_SECRET],
    /// Whether anything is kept at all (a capacity of 0: every body takes the exact path).
    enabled: bool,
    found: AtomicU64,
    parsed: AtomicU64,
}

#[derive(Clone)]
struct ByLength;

impl<T> Weighter<u128, (Arc<T>, u32)> for ByLength {
    fn weight(&self, _key: &u128, value: &(Arc<T>, u32)) -> u64 {
        // The element's bytes and its parsed fields, roughly.
        u64::from(value.1) + 128
    }
}

impl<T> SeenElements<T> {
    pub fn new(bytes: u64) -> SeenElements<T> {
        let mut secret = [0u8; KEY_SECRET];
        rand::Rng::fill(&mut rand::thread_rng(), &mut secret[..]);
        SeenElements {
            cache: Cache::with_weighter(4096, bytes.max(1), ByLength),
            secret,
            enabled: bytes > 0,
            found: AtomicU64::new(0),
            parsed: AtomicU64::new(0),
        }
    }

    /// What this dialect's lookup has found and parsed since start, and what it keeps.
    pub fn counts(&self) -> SeenCounts {
        SeenCounts {
            found: self.found.load(Ordering::Relaxed),
            parsed: self.parsed.load(Ordering::Relaxed),
            kept_bytes: self.cache.weight(),
        }
    }

    fn key(&self, raw: &str) -> u128 {
        let mut hasher = Xxh3::with_secret(self.secret);
        hasher.update(raw.as_bytes());
        hasher.digest128()
    }

    /// The element parsed from exactly `raw`, if it was seen.
    fn get(&self, key: u128) -> Option<Arc<T>> {
        self.cache.get(&key).map(|(parsed, _)| parsed)
    }

    fn insert(&self, key: u128, raw: &str, parsed: Arc<T>) {
        let length = u32::try_from(raw.len()).unwrap_or(u32::MAX);
        self.cache.insert(key, (parsed, length));
    }
}

/// A body's top-level fields, with the field `key`'s array split into its elements, each
/// element the one parsed from the same bytes before or parsed now by `parse` (which receives
/// it checked). `None` when the body is anything but plain ([module docs](self)): the caller
/// then reads it with [`super::splice::split_fields`].
pub fn split<T>(
    body: &[u8],
    key: &str,
    seen: &SeenElements<T>,
    parse: impl Fn(Box<RawValue>) -> Result<T, String>,
) -> Option<(Fields, Vec<Arc<T>>)> {
    if !seen.enabled {
        return None;
    }
    let body = std::str::from_utf8(body).ok()?;
    let layout = layout(body, key)?;
    let mut fields = Fields::with_capacity_and_hasher(layout.fields.len(), Default::default());
    for (name, value) in layout.fields {
        let name: String = serde_json::from_str(name).ok()?;
        let value = match value {
            Value::Elements => RawValue::NULL.to_owned(),
            Value::Raw(raw) => checked(raw)?,
        };
        fields.insert(name, value);
    }
    let mut elements = Vec::with_capacity(layout.elements.len());
    let mut found = 0;
    for raw in layout.elements {
        let key = seen.key(raw);
        let element = match seen.get(key) {
            Some(element) => {
                found += 1;
                element
            }
            None => {
                let element = Arc::new(parse(checked(raw)?).ok()?);
                seen.insert(key, raw, element.clone());
                element
            }
        };
        elements.push(element);
    }
    if !layout.has_elements {
        return None;
    }
    // Counted once the body is split here: a body given up on is parsed whole after all.
    seen.found.fetch_add(found, Ordering::Relaxed);
    seen.parsed
        .fetch_add(elements.len() as u64 - found, Ordering::Relaxed);
    Some((fields, elements))
}

/// `raw` as one checked JSON value, unless it nests deeper than a value checked on its own may.
fn checked(raw: &str) -> Option<Box<RawValue>> {
    if scan::depth(raw) > CHECKED_DEPTH {
        return None;
    }
    serde_json::from_str(raw).ok()
}

enum Value<'a> {
    /// The split field: its elements are in [`Layout::elements`].
    Elements,
    Raw(&'a str),
}

/// Where a body's fields and elements are, found by skipping; nothing in them checked yet.
struct Layout<'a> {
    /// Each field's key (a JSON string, quotes included) and value, in order.
    fields: Vec<(&'a str, Value<'a>)>,
    elements: Vec<&'a str>,
    /// Whether the body has the split field (as an array).
    has_elements: bool,
}

fn layout<'a>(body: &'a str, key: &str) -> Option<Layout<'a>> {
    let bytes = body.as_bytes();
    let mut layout = Layout {
        fields: Vec::new(),
        elements: Vec::new(),
        has_elements: false,
    };
    let mut at = scan::skip_whitespace(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = scan::skip_whitespace(bytes, at + 1);
    if bytes.get(at) == Some(&b'}') {
        return end_of_body(bytes, at + 1).then_some(layout);
    }
    loop {
        if bytes.get(at) != Some(&b'"') {
            return None;
        }
        let key_end = scan::skip_string(bytes, at);
        let name = body.get(at..key_end)?;
        at = scan::skip_whitespace(bytes, key_end);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = scan::skip_whitespace(bytes, at + 1);
        // Keys with escapes are compared decoded, by the full path.
        if name.len() == key.len() + 2 && &name[1..name.len() - 1] == key {
            if layout.has_elements {
                return None;
            }
            at = array(body, at, &mut layout.elements)?;
            layout.has_elements = true;
            layout.fields.push((name, Value::Elements));
        } else {
            if name.contains('\\') {
                return None;
            }
            let end = scan::skip_value(bytes, at);
            if end == at {
                return None;
            }
            layout.fields.push((name, Value::Raw(body.get(at..end)?)));
            at = end;
        }
        at = scan::skip_whitespace(bytes, at);
        match bytes.get(at) {
            Some(b',') => at = scan::skip_whitespace(bytes, at + 1),
            Some(b'}') => return end_of_body(bytes, at + 1).then_some(layout),
            _ => return None,
        }
    }
}

/// The elements of the array that opens at `at`, and the index just past it.
fn array<'a>(body: &'a str, mut at: usize, elements: &mut Vec<&'a str>) -> Option<usize> {
    let bytes = body.as_bytes();
    if bytes.get(at) != Some(&b'[') {
        return None;
    }
    at = scan::skip_whitespace(bytes, at + 1);
    if bytes.get(at) == Some(&b']') {
        return Some(at + 1);
    }
    loop {
        let end = scan::skip_value(bytes, at);
        if end == at {
            return None;
        }
        elements.push(body.get(at..end)?);
        at = scan::skip_whitespace(bytes, end);
        match bytes.get(at) {
            Some(b',') => at = scan::skip_whitespace(bytes, at + 1),
            Some(b']') => return Some(at + 1),
            _ => return None,
        }
    }
}

fn end_of_body(bytes: &[u8], at: usize) -> bool {
    scan::skip_whitespace(bytes, at) == bytes.len()
}

#[cfg(test)]
mod tests;
