//! Reading one Messages message without building it, keeping only what every request needs:
//! the role, and each block's type and the ids it names. The blocks themselves are built from
//! the bytes on first use ([`super::parse::Message::blocks`]); most requests never need them for
//! messages seen before.
//!
//! A message is read as strictly as reading it into a [`serde_json::Value`] would (the same
//! syntax, number range and nesting depth errors, at the same places). Most messages are
//! [plain](scan::is_plain): the body's split has already checked all a value would, so their
//! heads are found by skipping over their bytes. The rest are read in one exact pass.
//!
//! Repeated keys are read as a map reads them: the last value wins.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::dialect::scan;

/// What a block is and which tool call it names, read when the request arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockHead {
    /// `type`, when it is a string.
    pub kind: Option<String>,
    /// `id`, when it is a string (the id of a `tool_use`).
    pub id: Option<String>,
    /// `tool_use_id`, when it is a string (the call a `tool_result` answers).
    pub tool_use_id: Option<String>,
    /// Which of the fields the block's type requires to be strings are strings.
    strings: Strings,
    /// Whether the block is a JSON object.
    object: bool,
}

/// The string fields of a block whose type is checked ([`BlockHead::missing_string`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Strings {
    text: bool,
    name: bool,
    thinking: bool,
}

impl BlockHead {
    /// A `text` block (what a string content is).
    pub fn text() -> BlockHead {
        BlockHead {
            kind: Some("text".into()),
            id: None,
            tool_use_id: None,
            strings: Strings {
                text: true,
                ..Strings::default()
            },
            object: true,
        }
    }

    /// The head of a block already read.
    pub fn of(block: &serde_json::Value) -> BlockHead {
        let string = |field: &str| block.get(field).and_then(|v| v.as_str()).map(String::from);
        let is_string = |field: &str| block.get(field).is_some_and(|v| v.is_string());
        BlockHead {
            kind: string("type"),
            id: string("id"),
            tool_use_id: string("tool_use_id"),
            strings: Strings {
                text: is_string("text"),
                name: is_string("name"),
                thinking: is_string("thinking"),
            },
            object: block.is_object(),
        }
    }

    /// The type of an object block with a string `type`.
    pub fn object_kind(&self) -> Option<&str> {
        self.kind.as_deref().filter(|_| self.object)
    }

    /// Whether `field` (`text`, `id`, `name`, `tool_use_id` or `thinking`) is a string.
    pub fn has_string(&self, field: &str) -> bool {
        match field {
            "text" => self.strings.text,
            "id" => self.id.is_some(),
            "name" => self.strings.name,
            "tool_use_id" => self.tool_use_id.is_some(),
            "thinking" => self.strings.thinking,
            _ => false,
        }
    }
}

/// A message's role, as far as it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleField {
    Missing,
    NotString,
    Is(String),
}

/// A message's content, as far as it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentField {
    Missing,
    /// Neither a string nor an array.
    Other,
    /// A string: one text block.
    Text,
    Blocks(Vec<BlockHead>),
}

/// What the pass keeps of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageHead {
    /// Whether the message is a JSON object (if not, role and content stay missing).
    pub object: bool,
    pub role: RoleField,
    pub content: ContentField,
}

/// Reads `raw` (one message's bytes, as the body's split checked them): skipping over it
/// ([`message_head_plain`]) where that is as strict as reading it into a value, else in one
/// exact pass whose error is serde_json's, worded as reading the message into a value words it.
pub fn message_head(raw: &RawValue) -> Result<MessageHead, String> {
    if let Some(head) = message_head_plain(raw.get()) {
        return Ok(head);
    }
    message_head_exact(raw.get())
}

fn message_head_exact(raw: &str) -> Result<MessageHead, String> {
    let mut reader = serde_json::Deserializer::from_str(raw);
    let head = MessageSeed
        .deserialize(&mut reader)
        .and_then(|head| reader.end().map(|()| head))
        .map_err(|e| e.to_string())?;
    Ok(head)
}

/// The head of a message found by skipping over its bytes, when nothing in it needs the exact
/// pass: it is [plain](scan::is_plain) and repeats none of the keys read (the exact pass lets
/// the last one win).
fn message_head_plain(raw: &str) -> Option<MessageHead> {
    if !scan::is_plain(raw) {
        return None;
    }
    let [role, content] = match scan::top_level(raw, ["role", "content"]) {
        Ok(fields) => fields,
        Err(scan::Unreadable::NotObject) => return Some(MessageSeed.not_object()),
        Err(scan::Unreadable::Repeated(_)) => return None,
    };
    let role = match role.map(scan::text) {
        None => RoleField::Missing,
        Some(Ok(Some(text))) => RoleField::Is(text.into_owned()),
        Some(_) => RoleField::NotString,
    };
    let content = match content {
        None => ContentField::Missing,
        Some(content) => match content.as_bytes().first() {
            Some(b'"') => ContentField::Text,
            Some(b'[') => {
                let blocks = scan::elements(content);
                let mut heads = Vec::with_capacity(blocks.len());
                for block in blocks {
                    heads.push(block_head_plain(block)?);
                }
                ContentField::Blocks(heads)
            }
            _ => ContentField::Other,
        },
    };
    Some(MessageHead {
        object: true,
        role,
        content,
    })
}

fn block_head_plain(raw: &str) -> Option<BlockHead> {
    const READ: [&str; 6] = ["type", "id", "tool_use_id", "text", "name", "thinking"];
    let [kind, id, tool_use_id, text, name, thinking] = match scan::top_level(raw, READ) {
        Ok(fields) => fields,
        Err(scan::Unreadable::NotObject) => return Some(BlockSeed.not_object()),
        Err(scan::Unreadable::Repeated(_)) => return None,
    };
    let string = |value: Option<&str>| {
        value
            .and_then(|v| scan::text(v).ok().flatten())
            .map(Cow::into_owned)
    };
    let is_string = |value: Option<&str>| value.is_some_and(|v| v.starts_with('"'));
    Some(BlockHead {
        kind: string(kind),
        id: string(id),
        tool_use_id: string(tool_use_id),
        strings: Strings {
            text: is_string(text),
            name: is_string(name),
            thinking: is_string(thinking),
        },
        object: true,
    })
}

/// A key as read, borrowed when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_string())))
            }
            fn visit_string<E>(self, key: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// Any JSON value, checked as reading it into a value checks it, and thrown away. Strings are
/// kept when `keep` (for the few fields whose text is needed).
#[derive(Default)]
struct Checked {
    string: Option<String>,
    is_string: bool,
}

struct CheckedSeed {
    keep: bool,
}

impl<'de> DeserializeSeed<'de> for CheckedSeed {
    type Value = Checked;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Checked, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CheckedSeed {
    type Value = Checked;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked::default())
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked::default())
    }
    fn visit_str<E>(self, text: &str) -> Result<Checked, E> {
        Ok(Checked {
            string: self.keep.then(|| text.to_string()),
            is_string: true,
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq
            .next_element_seed(CheckedSeed { keep: false })?
            .is_some()
        {}
        Ok(Checked::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_key::<Key>()?.is_some() {
            map.next_value_seed(CheckedSeed { keep: false })?;
        }
        Ok(Checked::default())
    }
}

struct MessageSeed;

impl<'de> DeserializeSeed<'de> for MessageSeed {
    type Value = MessageHead;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<MessageHead, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl MessageSeed {
    fn not_object(self) -> MessageHead {
        MessageHead {
            object: false,
            role: RoleField::Missing,
            content: ContentField::Missing,
        }
    }
}

impl<'de> Visitor<'de> for MessageSeed {
    type Value = MessageHead;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a message")
    }
    fn visit_bool<E>(self, _: bool) -> Result<MessageHead, E> {
        Ok(self.not_object())
    }
    fn visit_i64<E>(self, _: i64) -> Result<MessageHead, E> {
        Ok(self.not_object())
    }
    fn visit_u64<E>(self, _: u64) -> Result<MessageHead, E> {
        Ok(self.not_object())
    }
    fn visit_f64<E>(self, _: f64) -> Result<MessageHead, E> {
        Ok(self.not_object())
    }
    fn visit_unit<E>(self) -> Result<MessageHead, E> {
        Ok(self.not_object())
    }
    fn visit_str<E>(self, _: &str) -> Result<MessageHead, E> {
        Ok(self.not_object())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<MessageHead, A::Error> {
        CheckedSeed { keep: false }.visit_seq(seq)?;
        Ok(self.not_object())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MessageHead, A::Error> {
        let mut role = RoleField::Missing;
        let mut content = ContentField::Missing;
        while let Some(Key(key)) = map.next_key::<Key>()? {
            match &*key {
                "role" => {
                    let value = map.next_value_seed(CheckedSeed { keep: true })?;
                    role = match value.string {
                        Some(text) => RoleField::Is(text),
                        None => RoleField::NotString,
                    };
                }
                "content" => content = map.next_value_seed(ContentSeed)?,
                _ => {
                    map.next_value_seed(CheckedSeed { keep: false })?;
                }
            }
        }
        Ok(MessageHead {
            object: true,
            role,
            content,
        })
    }
}

struct ContentSeed;

impl<'de> DeserializeSeed<'de> for ContentSeed {
    type Value = ContentField;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<ContentField, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ContentSeed {
    type Value = ContentField;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a content")
    }
    fn visit_bool<E>(self, _: bool) -> Result<ContentField, E> {
        Ok(ContentField::Other)
    }
    fn visit_i64<E>(self, _: i64) -> Result<ContentField, E> {
        Ok(ContentField::Other)
    }
    fn visit_u64<E>(self, _: u64) -> Result<ContentField, E> {
        Ok(ContentField::Other)
    }
    fn visit_f64<E>(self, _: f64) -> Result<ContentField, E> {
        Ok(ContentField::Other)
    }
    fn visit_unit<E>(self) -> Result<ContentField, E> {
        Ok(ContentField::Other)
    }
    fn visit_str<E>(self, _: &str) -> Result<ContentField, E> {
        Ok(ContentField::Text)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ContentField, A::Error> {
        CheckedSeed { keep: false }.visit_map(map)?;
        Ok(ContentField::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ContentField, A::Error> {
        let mut blocks = Vec::with_capacity(seq.size_hint().unwrap_or(4));
        while let Some(block) = seq.next_element_seed(BlockSeed)? {
            blocks.push(block);
        }
        Ok(ContentField::Blocks(blocks))
    }
}

struct BlockSeed;

impl BlockSeed {
    fn not_object(self) -> BlockHead {
        BlockHead {
            kind: None,
            id: None,
            tool_use_id: None,
            strings: Strings::default(),
            object: false,
        }
    }
}

impl<'de> DeserializeSeed<'de> for BlockSeed {
    type Value = BlockHead;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<BlockHead, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BlockSeed {
    type Value = BlockHead;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a content block")
    }
    fn visit_bool<E>(self, _: bool) -> Result<BlockHead, E> {
        Ok(self.not_object())
    }
    fn visit_i64<E>(self, _: i64) -> Result<BlockHead, E> {
        Ok(self.not_object())
    }
    fn visit_u64<E>(self, _: u64) -> Result<BlockHead, E> {
        Ok(self.not_object())
    }
    fn visit_f64<E>(self, _: f64) -> Result<BlockHead, E> {
        Ok(self.not_object())
    }
    fn visit_unit<E>(self) -> Result<BlockHead, E> {
        Ok(self.not_object())
    }
    fn visit_str<E>(self, _: &str) -> Result<BlockHead, E> {
        Ok(self.not_object())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<BlockHead, A::Error> {
        CheckedSeed { keep: false }.visit_seq(seq)?;
        Ok(self.not_object())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BlockHead, A::Error> {
        let mut head = BlockHead {
            object: true,
            ..self.not_object()
        };
        while let Some(Key(key)) = map.next_key::<Key>()? {
            let keep = matches!(&*key, "type" | "id" | "tool_use_id");
            let value = map.next_value_seed(CheckedSeed { keep })?;
            match &*key {
                "type" => head.kind = value.string,
                "id" => head.id = value.string,
                "tool_use_id" => head.tool_use_id = value.string,
                "text" => head.strings.text = value.is_string,
                "name" => head.strings.name = value.is_string,
                "thinking" => head.strings.thinking = value.is_string,
                _ => {}
            }
        }
        Ok(head)
    }
}

#[cfg(test)]
mod tests;
