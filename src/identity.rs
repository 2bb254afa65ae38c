//! Conversation identity: a hash chain over canonical message JSON, seeded with the tenant.
//!
//! `h[0] = H(tenant, c[0])`, `h[i] = H(h[i-1], c[i])` where `c[i]` is the hash of message `i`'s
//! canonical JSON (object keys sorted, no whitespace). Two requests share `h[k]` exactly when
//! they come from the same tenant and their first `k+1` messages are equal as JSON values, so a
//! checkpoint keyed by `h[k]` can never be applied to another tenant's conversation, and a
//! client that edits its history simply stops matching.

use serde_json::value::RawValue;
use serde_json::Value;

/// A 32-byte BLAKE3 digest.
pub type Hash = [u8; 32];

/// Hex form of a hash, as stored and shown.
pub fn hex(hash: &Hash) -> String {
    blake3::Hash::from(*hash).to_hex().to_string()
}

/// The tenant seed: a hash of the client's credential (empty for anonymous clients).
pub fn tenant(credential: &str) -> Hash {
    let mut h = blake3::Hasher::new_derive_key("compactor tenant v1");
    h.update(credential.as_bytes());
    *h.finalize().as_bytes()
}

/// Hash of a message's canonical JSON.
pub fn canonical_hash(raw: &RawValue) -> Hash {
    let mut hasher = blake3::Hasher::new();
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(value) => write_canonical(&value, &mut hasher),
        // Unparseable values never reach here (requests are validated); hash the bytes anyway.
        Err(_) => {
            hasher.update(raw.get().as_bytes());
        }
    }
    *hasher.finalize().as_bytes()
}

fn write_canonical(value: &Value, out: &mut blake3::Hasher) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.update(b"{");
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                out.update(Value::String(key.clone()).to_string().as_bytes());
                out.update(b":");
                write_canonical(&map[key], out);
            }
            out.update(b"}");
        }
        Value::Array(items) => {
            out.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                write_canonical(item, out);
            }
            out.update(b"]");
        }
        scalar => {
            out.update(scalar.to_string().as_bytes());
        }
    }
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
