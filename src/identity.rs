//! Conversation identity: a hash chain over canonical message JSON, seeded with the tenant.
//!
//! `h[0] = H(tenant, c[0])`, `h[i] = H(h[i-1], c[i])` where `c[i]` is the hash of element `i`'s
//! canonical JSON. Two requests share `h[k]` exactly when they come from the same tenant and
//! their first `k+1` elements are canonically equal, so a checkpoint keyed by `h[k]` can never
//! be applied to another tenant's conversation, and a client that edits its history simply
//! stops matching.
//!
//! The canonical form ignores what clients re-serialize differently from one request to the
//! next while meaning the same: object key order and whitespace; `cache_control` markers (which
//! Claude Code moves to the newest turn) at any depth; an element's own `id` and `status`
//! (which Responses clients regenerate; ids nested deeper, such as tool call ids, are kept
//! because results refer to them); and a `content` that is a single text block, which equals
//! the same text as a plain string.

use serde_json::value::RawValue;
use serde_json::Value;

/// A 32-byte BLAKE3 digest.
pub type Hash = [u8; 32];

/// Hex form of a hash, as stored and shown: lower case, two digits a byte. Copied out of
/// BLAKE3's own hex text rather than formatted through `Display`, which cost four times as
/// many instructions (it runs a few times per request).
pub fn hex(hash: &Hash) -> String {
    blake3::Hash::from(*hash).to_hex().as_str().to_owned()
}

/// The tenant seed: a hash of the client's credential (empty for anonymous clients).
pub fn tenant(credential: &str) -> Hash {
    let mut seed = TenantSeed::new();
    seed.update(credential.as_bytes());
    seed.finish()
}

/// A tenant seed hashed from its credential's pieces as they come, without joining them first:
/// the same seed as [`tenant`] of the pieces' concatenation.
pub struct TenantSeed(blake3::Hasher);

impl TenantSeed {
    pub fn new() -> TenantSeed {
        // Deriving the key hashes the context string: done once, the hasher cloned after.
        static START: std::sync::OnceLock<blake3::Hasher> = std::sync::OnceLock::new();
        TenantSeed(
            START
                .get_or_init(|| blake3::Hasher::new_derive_key("compactor tenant v1"))
                .clone(),
        )
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    pub fn finish(self) -> Hash {
        *self.0.finalize().as_bytes()
    }
}

impl Default for TenantSeed {
    fn default() -> Self {
        TenantSeed::new()
    }
}

/// Hash of an element's canonical JSON.
pub fn canonical_hash(raw: &RawValue) -> Hash {
    let mut hasher = blake3::Hasher::new();
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(value) => write_canonical(&value, true, &mut hasher),
        // Unparseable values never reach here (requests are validated); hash the bytes anyway.
        Err(_) => {
            hasher.update(raw.get().as_bytes());
        }
    }
    *hasher.finalize().as_bytes()
}

/// Keys that never take part in identity, at any depth.
const IGNORED_KEYS: &[&str] = &["cache_control"];
/// Keys of the element itself (not nested values) that never take part in identity.
const IGNORED_ELEMENT_KEYS: &[&str] = &["id", "status"];
/// Block types whose single occurrence as a `content` equals its text as a string.
const TEXT_BLOCKS: &[&str] = &["text", "input_text", "output_text"];

fn write_canonical(value: &Value, element: bool, out: &mut blake3::Hasher) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map
                .keys()
                .filter(|k| !IGNORED_KEYS.contains(&k.as_str()))
                .filter(|k| !(element && IGNORED_ELEMENT_KEYS.contains(&k.as_str())))
                .collect();
            keys.sort();
            out.update(b"{");
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                out.update(Value::String(key.clone()).to_string().as_bytes());
                out.update(b":");
                let value = &map[key];
                match single_text_block(key, value) {
                    Some(text) => {
                        out.update(Value::String(text.to_string()).to_string().as_bytes());
                    }
                    None => write_canonical(value, false, out),
                }
            }
            out.update(b"}");
        }
        Value::Array(items) => {
            out.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                write_canonical(item, false, out);
            }
            out.update(b"]");
        }
        scalar => {
            out.update(scalar.to_string().as_bytes());
        }
    }
}

/// The text of a `content` that is exactly one text block (ignoring ignored keys).
fn single_text_block<'v>(key: &str, value: &'v Value) -> Option<&'v str> {
    if key != "content" {
        return None;
    }
    let [Value::Object(block)] = value.as_array()?.as_slice() else {
        return None;
    };
    let kind = block.get("type")?.as_str()?;
    let text = block.get("text")?.as_str()?;
    let only_type_and_text = block
        .keys()
        .all(|k| k == "type" || k == "text" || IGNORED_KEYS.contains(&k.as_str()));
    (TEXT_BLOCKS.contains(&kind) && only_type_and_text).then_some(text)
}

/// The chain `h[0..n)` for a conversation of canonical message hashes.
pub fn chain(tenant: &Hash, canonical: impl IntoIterator<Item = Hash>) -> Vec<Hash> {
    let mut previous = *tenant;
    canonical
        .into_iter()
        .map(|c| {
            let mut h = blake3::Hasher::new();
            h.update(&previous);
            h.update(&c);
            previous = *h.finalize().as_bytes();
            previous
        })
        .collect()
}

/// The conversation's anchor: the chain up to and including the first non-instruction message
/// (all leading system/developer messages plus the first user turn).
pub fn anchor(chain: &[Hash], first_non_instruction: Option<usize>) -> Option<Hash> {
    first_non_instruction.and_then(|i| chain.get(i).copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_two_lower_case_digits_a_byte() {
        let mut hash: Hash = [0xab; 32];
        hash[0] = 0x01;
        hash[1] = 0xf0;
        hash[31] = 0x09;
        let text = hex(&hash);
        assert_eq!(text.len(), 64);
        assert!(text.starts_with("01f0abab"));
        assert!(text.ends_with("abab09"));
        assert_eq!(hex(&[0; 32]), "0".repeat(64));
    }

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    #[test]
    fn canonical_ignores_key_order_and_whitespace() {
        let a = canonical_hash(&raw(r#"{"role":"user","content":"hi","x":{"b":1,"a":2}}"#));
        let b = canonical_hash(&raw(
            r#"{ "x": {"a":2, "b":1}, "content":"hi", "role":"user" }"#,
        ));
        let c = canonical_hash(&raw(r#"{"role":"user","content":"hi!"}"#));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn canonical_ignores_what_clients_reserialize() {
        let plain = canonical_hash(&raw(r#"{"role":"user","content":"hi"}"#));
        for same in [
            r#"{"role":"user","content":[{"type":"text","text":"hi"}]}"#,
            r#"{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}"#,
            r#"{"role":"user","content":"hi","id":"msg_1","status":"completed"}"#,
            r#"{"role":"user","cache_control":{"type":"ephemeral"},"content":"hi"}"#,
        ] {
            assert_eq!(canonical_hash(&raw(same)), plain, "{same}");
        }
        for different in [
            r#"{"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"hi"}]}"#,
            r#"{"role":"user","content":[{"type":"image","source":"x"}]}"#,
            r#"{"role":"assistant","content":"hi"}"#,
        ] {
            assert_ne!(canonical_hash(&raw(different)), plain, "{different}");
        }
        // Ids below the element are kept: tool results refer to them.
        let call = |id: &str| {
            canonical_hash(&raw(&format!(
                r#"{{"role":"assistant","tool_calls":[{{"id":"{id}","type":"function"}}]}}"#
            )))
        };
        assert_ne!(call("c1"), call("c2"));
    }

    #[test]
    fn chain_is_seeded_by_tenant_and_prefix_stable() {
        let msgs = [[1u8; 32], [2u8; 32], [3u8; 32]];
        let alice = chain(&tenant("Bearer alice"), msgs);
        let bob = chain(&tenant("Bearer bob"), msgs);
        assert!(alice.iter().zip(&bob).all(|(a, b)| a != b));
        let shorter = chain(&tenant("Bearer alice"), msgs[..2].iter().copied());
        assert_eq!(&alice[..2], &shorter[..]);
        let edited = chain(&tenant("Bearer alice"), [[9u8; 32], [2u8; 32], [3u8; 32]]);
        assert!(alice.iter().zip(&edited).all(|(a, b)| a != b));
    }
}
