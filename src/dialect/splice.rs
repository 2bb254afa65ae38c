//! Reading and writing bodies without re-serializing what the client sent: a body's top-level
//! fields kept as their original bytes in order, and written back with one field replaced.
//! Every dialect splices its rewritten conversation this way, so unknown fields, number
//! formats and key order reach the provider as they came. Part of the seam: it imports nothing
//! of the crate beyond the vocabulary.

use indexmap::IndexMap;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::vocabulary::RequestError;

/// A body's top-level fields, in order, each as its original bytes. Hashed with aHash (keyed at
/// random per process, as std's SipHash is): every request looks its fields up a dozen times,
/// and SipHash made that some 2 % of a small request's instructions.
pub type Fields = IndexMap<String, Box<RawValue>, ahash::RandomState>;

/// A request body's top-level fields. A body that is valid JSON but not an object is refused as
/// such, not as a syntax error.
pub fn top_level_fields(body: &[u8]) -> Result<Fields, RequestError> {
    match serde_json::from_slice(body) {
        Ok(fields) => Ok(fields),
        Err(e) if e.is_data() => {
            serde_json::from_slice::<serde::de::IgnoredAny>(body)
                .map_err(RequestError::from_json)?;
            Err(RequestError::NotObject)
        }
        Err(e) => Err(RequestError::from_json(e)),
    }
}

/// A body's top-level fields with the conversation's field split into its elements in the same
/// pass: the body is read once and each element copied out once, where reading the fields and
/// then the field's value again would read the conversation twice. `fields` keeps a `null` in
/// the field's place (its value is always written anew).
#[derive(Debug)]
pub struct Split {
    pub fields: Fields,
    /// The split field's value; `None` when the body has no such field.
    pub elements: Option<Elements>,
}

/// What the split field holds.
#[derive(Debug)]
pub enum Elements {
    /// An array: its elements' original bytes.
    Array(Vec<Box<RawValue>>),
    /// A string: its text.
    Text(String),
    /// Any other JSON value.
    Other,
}

/// [`top_level_fields`], with the field `key` split into its elements ([`Split`]).
pub fn split_fields(body: &[u8], key: &str) -> Result<Split, RequestError> {
    let mut reader = serde_json::Deserializer::from_slice(body);
    let read = SplitSeed(key)
        .deserialize(&mut reader)
        .and_then(|split| reader.end().map(|()| split));
    match read {
        Ok(split) => Ok(split),
        Err(e) if e.is_data() => {
            serde_json::from_slice::<serde::de::IgnoredAny>(body)
                .map_err(RequestError::from_json)?;
            Err(RequestError::NotObject)
        }
        Err(e) => Err(RequestError::from_json(e)),
    }
}

struct SplitSeed<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for SplitSeed<'_> {
    type Value = Split;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Split, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for SplitSeed<'_> {
    type Value = Split;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Split, A::Error> {
        let mut fields = Fields::default();
        let mut elements = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == self.0 {
                // A repeated key keeps its first place and its last value, as an object read
                // into a map does.
                elements = Some(map.next_value::<Elements>()?);
                fields.insert(key, RawValue::NULL.to_owned());
            } else {
                fields.insert(key, map.next_value::<Box<RawValue>>()?);
            }
        }
        Ok(Split { fields, elements })
    }
}

impl<'de> Deserialize<'de> for Elements {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ElementsVisitor)
    }
}

struct ElementsVisitor;

impl<'de> Visitor<'de> for ElementsVisitor {
    type Value = Elements;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Elements, A::Error> {
        let mut list = Vec::with_capacity(seq.size_hint().unwrap_or(16));
        while let Some(element) = seq.next_element::<Box<RawValue>>()? {
            list.push(element);
        }
        Ok(Elements::Array(list))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Elements, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Elements::Other)
    }

    fn visit_str<E>(self, text: &str) -> Result<Elements, E> {
        Ok(Elements::Text(text.to_string()))
    }

    fn visit_string<E>(self, text: String) -> Result<Elements, E> {
        Ok(Elements::Text(text))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Elements, E> {
        Ok(Elements::Other)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Elements, E> {
        Ok(Elements::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Elements, E> {
        Ok(Elements::Other)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Elements, E> {
        Ok(Elements::Other)
    }

    fn visit_unit<E>(self) -> Result<Elements, E> {
        Ok(Elements::Other)
    }
}

/// The `model` field every dialect requires, as a string.
pub fn required_model(fields: &Fields) -> Result<String, RequestError> {
    let raw = fields.get("model").ok_or(RequestError::Missing("model"))?;
    serde_json::from_str::<String>(raw.get()).map_err(|_| RequestError::Type {
        field: "model",
        expected: "a string",
    })
}

/// A JSON value as raw JSON.
pub fn to_raw(value: &Value) -> Box<RawValue> {
    // Serializing a Value cannot produce invalid JSON.
    RawValue::from_string(value.to_string()).expect("serde_json output is valid JSON")
}

/// Writes `fields` back as an object, in order, each value through `write_value` (given the key,
/// the original value and the output); `finish` may append more fields before the closing brace.
pub fn write_object(
    fields: &Fields,
    capacity: usize,
    mut write_value: impl FnMut(&str, &RawValue, &mut Vec<u8>),
    finish: impl FnOnce(&mut Vec<u8>),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    out.push(b'{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Keys came from valid JSON; re-escaping through serde keeps any escapes valid.
        out.extend_from_slice(serde_json::to_string(key).unwrap_or_default().as_bytes());
        out.push(b':');
        write_value(key, value, &mut out);
    }
    finish(&mut out);
    out.push(b'}');
    out
}

/// Bytes a body of `fields` with an array of `items` in place of one of them takes, about: a
/// body is sized once for all of it, since a large one grown by doubling is copied again at
/// every step.
pub fn body_capacity(fields: &Fields, items: &[&RawValue]) -> usize {
    let fields: usize = fields
        .iter()
        .map(|(k, v)| k.len() + v.get().len() + 4)
        .sum();
    fields + items.iter().map(|item| item.get().len() + 1).sum::<usize>()
}

/// `fields` written back with the value of `key` replaced by an array of `items`.
pub fn object_with_array<'a>(
    fields: &Fields,
    key: &str,
    items: impl IntoIterator<Item = &'a RawValue>,
) -> Vec<u8> {
    let items: Vec<&RawValue> = items.into_iter().collect();
    let capacity = body_capacity(fields, &items);
    let mut items = Some(items);
    write_object(
        fields,
        capacity,
        |name, value, out| {
            if name == key {
                write_array(out, items.take().into_iter().flatten());
            } else {
                out.extend_from_slice(value.get().as_bytes());
            }
        },
        |_| {},
    )
}

/// Writes `items` as a JSON array.
pub fn write_array<'a>(out: &mut Vec<u8>, items: impl IntoIterator<Item = &'a RawValue>) {
    out.push(b'[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.get().as_bytes());
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_field_is_replaced_and_every_other_keeps_its_bytes_and_place() {
        let body = br#"{"z":{"b":1,"a":[1.50,2]},"input":[1],"m\u0041":"x"}"#;
        let fields = top_level_fields(body).unwrap();
        let items = [to_raw(&serde_json::json!({"k": 2})), to_raw(&Value::Null)];
        let out = object_with_array(&fields, "input", items.iter().map(|b| &**b));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"z":{"b":1,"a":[1.50,2]},"input":[{"k":2},null],"mA":"x"}"#
        );
        assert_eq!(
            top_level_fields(b"[1]").unwrap_err(),
            RequestError::NotObject
        );
        assert!(matches!(
            top_level_fields(b"{").unwrap_err(),
            RequestError::Json { .. }
        ));
        assert_eq!(
            required_model(&top_level_fields(br#"{"model":1}"#).unwrap()).unwrap_err(),
            RequestError::Type {
                field: "model",
                expected: "a string"
            }
        );
    }
}
