//! Reading and writing bodies without re-serializing what the client sent: a body's top-level
//! fields kept as their original bytes in order, and written back with one field replaced.
//! Every dialect splices its rewritten conversation this way, so unknown fields, number
//! formats and key order reach the provider as they came. Part of the seam: it imports nothing
//! of the crate beyond the vocabulary.

use indexmap::IndexMap;
use serde_json::value::RawValue;
use serde_json::Value;

use super::vocabulary::RequestError;

/// A body's top-level fields, in order, each as its original bytes.
pub type Fields = IndexMap<String, Box<RawValue>>;

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

/// `fields` written back with the value of `key` replaced by an array of `items`.
pub fn object_with_array<'a>(
    fields: &Fields,
    key: &str,
    items: impl IntoIterator<Item = &'a RawValue>,
) -> Vec<u8> {
    let capacity = fields
        .iter()
        .map(|(k, v)| k.len() + v.get().len() + 4)
        .sum();
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
