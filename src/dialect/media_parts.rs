//! Media parts in every dialect's shapes (chat's `image_url`, `input_audio`, `file`; Messages'
//! `image`, `document`; Responses' `input_image`, `input_file`), found at any depth (in a
//! message, a tool result, a `function_call_output`), read into a [`Media`] with its cost by
//! [`super::media`]'s figures: inline base64 decoded only as far as the size needs (an image's
//! header, a PDF's page objects). Part of the seam: it imports nothing of the crate beyond it.

use std::borrow::Cow;
use std::sync::LazyLock;

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use serde_json::Value;

use super::media::{
    image_tokens, Billing, Media, MediaKind, Origin, ANTHROPIC_MAX_IMAGE_TOKENS,
    AUDIO_BYTES_PER_TOKEN, DOCUMENT_GUESS_TOKENS, OPENAI_BASE_IMAGE_TOKENS,
    OPENAI_MAX_IMAGE_TOKENS, PDF_PAGE_TOKENS,
};

/// Largest inline document, decoded, whose pages are counted: Anthropic's request limit (32 MB)
/// holds no larger one, and the scan stays a few milliseconds.
pub const PDF_SCAN_MAX_BYTES: u64 = 32 * 1024 * 1024;
/// Base64 characters decoded first to read an image's header: PNG, GIF and WebP state their
/// size in the first bytes; a JPEG's frame header may follow a long EXIF block, and then the
/// whole image is read (up to [`IMAGE_SCAN_MAX_CHARS`]).
const IMAGE_HEADER_CHARS: usize = 64 * 1024;
/// Most base64 characters decoded to find an image's size.
const IMAGE_SCAN_MAX_CHARS: usize = 16 * 1024 * 1024;

/// Content part types that carry media, in every dialect: chat's `image_url`, `input_audio`
/// and `file`; Messages' `image` and `document`; Responses' `input_image`, `input_file` and
/// `input_audio`.
pub const MEDIA_TYPES: &[&str] = &[
    "image",
    "image_url",
    "input_image",
    "document",
    "file",
    "input_file",
    "audio",
    "input_audio",
];

/// Whether `value` is a media part.
pub fn is_media(value: &Value) -> bool {
    value
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| MEDIA_TYPES.contains(&t))
}

/// Every media part inside `value`, at any depth, in order (a media part's own fields are not
/// searched further, except a document made of content blocks, whose images it counts itself).
pub fn find(value: &Value, billing: Billing) -> Vec<Media> {
    let mut found = Vec::new();
    collect(value, billing, &mut found);
    found
}

fn collect(value: &Value, billing: Billing, found: &mut Vec<Media>) {
    match value {
        Value::Object(_) if is_media(value) => found.push(read(value, billing)),
        Value::Object(fields) => fields.values().for_each(|v| collect(v, billing, found)),
        Value::Array(items) => items.iter().for_each(|v| collect(v, billing, found)),
        _ => {}
    }
}

/// Whether a JSON text may hold a media part: a media type must appear in it as a JSON string,
/// or escaped (`\u…`). Cheap, so that the usual element without media is never parsed for it.
pub fn may_hold_media(raw: &str) -> bool {
    raw.contains("\\u")
        || MEDIA_TYPES
            .iter()
            .any(|kind| raw.contains(&format!("\"{kind}\"")))
}

/// The media parts inside a JSON text ([`find`]), parsing it only when it may hold one.
pub fn find_in_raw(raw: &str, billing: Billing) -> Vec<Media> {
    if !may_hold_media(raw) {
        return Vec::new();
    }
    serde_json::from_str::<Value>(raw)
        .map(|v| find(&v, billing))
        .unwrap_or_default()
}

/// Whether a JSON text holds a media part at any depth (inside a tool result too).
pub fn holds_media(raw: &str) -> bool {
    fn any(value: &Value) -> bool {
        match value {
            _ if is_media(value) => true,
            Value::Object(fields) => fields.values().any(any),
            Value::Array(items) => items.iter().any(any),
            _ => false,
        }
    }
    may_hold_media(raw) && serde_json::from_str::<Value>(raw).is_ok_and(|v| any(&v))
}

/// `value` with each media part in it replaced by `null`: the rest, to count as text.
pub fn without_media(value: &Value) -> Value {
    match value {
        _ if is_media(value) => Value::Null,
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), without_media(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_media).collect()),
        other => other.clone(),
    }
}

/// Reads one media part (an object whose `type` is a media type) of any dialect.
pub fn read(part: &Value, billing: Billing) -> Media {
    let str_of = |v: &Value, field: &str| v.get(field).and_then(Value::as_str).map(str::to_string);
    let low_detail = |v: &Value| str_of(v, "detail").as_deref() == Some("low");
    match part.get("type").and_then(Value::as_str).unwrap_or("") {
        // Chat: `{"image_url": {"url", "detail"}}` (some clients send the URL alone).
        "image_url" => match part.get("image_url") {
            Some(Value::String(url)) => image_at(url, false, billing),
            Some(inner) => match str_of(inner, "url") {
                Some(url) => image_at(&url, low_detail(inner), billing),
                None => image_guess(Origin::Unknown, false, billing),
            },
            None => image_guess(Origin::Unknown, false, billing),
        },
        // Responses: `{"image_url": "data:…" | "https://…", "file_id", "detail"}`.
        "input_image" => match (str_of(part, "image_url"), str_of(part, "file_id")) {
            (Some(url), _) => image_at(&url, low_detail(part), billing),
            (None, Some(id)) => image_guess(Origin::FileId(id), low_detail(part), billing),
            (None, None) => image_guess(Origin::Unknown, low_detail(part), billing),
        },
        // Messages: `{"source": {"type": "base64" | "url" | "file", …}}`.
        "image" => {
            let source = part.get("source").unwrap_or(&Value::Null);
            match source.get("type").and_then(Value::as_str) {
                Some("base64") => match str_of(source, "data") {
                    Some(data) => inline_image(str_of(source, "media_type"), &data, false, billing),
                    None => image_guess(Origin::Unknown, false, billing),
                },
                _ => image_guess(origin_of(source), false, billing),
            }
        }
        "document" => anthropic_document(part, billing),
        // Chat: `{"file": {"file_data": "data:…", "file_id", "filename"}}`.
        "file" => file(part.get("file").unwrap_or(&Value::Null), billing),
        // Responses: `{"file_data", "file_id", "file_url", "filename"}`.
        "input_file" => file(part, billing),
        // Chat and Responses: `{"input_audio": {"data", "format"}}`.
        _ => {
            let inner = part.get("input_audio").unwrap_or(part);
            match str_of(inner, "data") {
                Some(data) => {
                    let bytes = decoded_len(&data);
                    let mut media = Media::new(MediaKind::Audio, Origin::Inline { bytes });
                    media.media_type = str_of(inner, "format").map(|f| format!("audio/{f}"));
                    media.tokens = bytes.div_ceil(AUDIO_BYTES_PER_TOKEN).max(1);
                    media
                }
                None => {
                    let mut media = Media::new(MediaKind::Audio, Origin::Unknown);
                    media.tokens = OPENAI_MAX_IMAGE_TOKENS;
                    media
                }
            }
        }
    }
}

/// Where a Messages `source` (`url`, `file`) points.
fn origin_of(source: &Value) -> Origin {
    let field = |f: &str| source.get(f).and_then(Value::as_str).map(str::to_string);
    match (field("url"), field("file_id")) {
        (Some(url), _) => Origin::Url(url),
        (None, Some(id)) => Origin::FileId(id),
        _ => Origin::Unknown,
    }
}

/// The media type and base64 data of a `data:` URL.
fn data_url(url: &str) -> Option<(Option<String>, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (head, data) = rest.split_once(',')?;
    let media_type = head.split(';').next().filter(|t| !t.is_empty());
    Some((media_type.map(str::to_string), data))
}

/// An image at a URL: inline when it is a `data:` URL.
fn image_at(url: &str, low_detail: bool, billing: Billing) -> Media {
    match data_url(url) {
        Some((media_type, data)) => inline_image(media_type, data, low_detail, billing),
        None => image_guess(Origin::Url(url.to_string()), low_detail, billing),
    }
}

/// An image whose size is not known: the most an image costs. At `detail: low` OpenAI's cost
/// does not depend on the size, so it is no guess.
fn image_guess(origin: Origin, low_detail: bool, billing: Billing) -> Media {
    let mut media = Media::new(MediaKind::Image, origin);
    (media.tokens, media.guessed) = match billing {
        Billing::OpenAi if low_detail => (OPENAI_BASE_IMAGE_TOKENS, false),
        Billing::OpenAi => (OPENAI_MAX_IMAGE_TOKENS, true),
        Billing::Anthropic => (ANTHROPIC_MAX_IMAGE_TOKENS, true),
    };
    media
}

/// An image given as base64: its cost from the size its header states.
fn inline_image(
    media_type: Option<String>,
    data: &str,
    low_detail: bool,
    billing: Billing,
) -> Media {
    let bytes = decoded_len(data);
    let dimensions = image_dimensions(data);
    let mut media = match dimensions {
        Some((w, h)) => {
            let mut media = Media::new(MediaKind::Image, Origin::Inline { bytes });
            media.tokens = image_tokens(billing, w, h, low_detail);
            media.guessed = false;
            media
        }
        None => image_guess(Origin::Inline { bytes }, low_detail, billing),
    };
    media.dimensions = dimensions;
    media.media_type = media_type.or_else(|| {
        let head = decode_prefix(data, 64)?;
        image_media_type(&head).map(str::to_string)
    });
    media
}

/// A Messages `document`: a base64 PDF, plain text, content blocks, or a URL or file.
fn anthropic_document(part: &Value, billing: Billing) -> Media {
    let str_of = |v: &Value, field: &str| v.get(field).and_then(Value::as_str).map(str::to_string);
    let source = part.get("source").unwrap_or(&Value::Null);
    let mut media = match source.get("type").and_then(Value::as_str) {
        Some("base64") => match str_of(source, "data") {
            Some(data) => inline_document(str_of(source, "media_type"), &data, billing),
            None => document_guess(Origin::Unknown),
        },
        Some("text") => {
            let data = str_of(source, "data").unwrap_or_default();
            let mut media = Media::new(
                MediaKind::Document,
                Origin::Inline {
                    bytes: data.len() as u64,
                },
            );
            media.media_type = str_of(source, "media_type").or(Some("text/plain".into()));
            media.text = data;
            media.guessed = false;
            media
        }
        Some("content") => {
            let blocks = source.get("content").and_then(Value::as_array);
            let mut media = Media::new(MediaKind::Document, Origin::Unknown);
            media.guessed = false;
            for block in blocks.into_iter().flatten() {
                if let Some(text) = block.get("text").and_then(Value::as_str) {
                    media.text.push_str(text);
                    media.text.push('\n');
                } else if is_media(block) {
                    let image = read(block, billing);
                    media.tokens += image.tokens;
                    media.guessed |= image.guessed;
                }
            }
            media
        }
        _ => document_guess(origin_of(source)),
    };
    media.name = str_of(part, "title");
    for field in ["title", "context"] {
        if let Some(text) = str_of(part, field) {
            media.text.push_str(&text);
            media.text.push('\n');
        }
    }
    media
}

fn document_guess(origin: Origin) -> Media {
    let mut media = Media::new(MediaKind::Document, origin);
    media.tokens = DOCUMENT_GUESS_TOKENS;
    media
}

/// A chat `file` or a Responses `input_file`: inline data, a file id or a URL.
fn file(part: &Value, billing: Billing) -> Media {
    let str_of = |field: &str| part.get(field).and_then(Value::as_str).map(str::to_string);
    let mut media = match (str_of("file_data"), str_of("file_id"), str_of("file_url")) {
        (Some(data), _, _) => match data_url(&data) {
            Some((media_type, data)) => inline_document(media_type, data, billing),
            None => inline_document(None, &data, billing),
        },
        (None, Some(id), _) => document_guess(Origin::FileId(id)),
        (None, None, Some(url)) => document_guess(Origin::Url(url)),
        (None, None, None) => document_guess(Origin::Unknown),
    };
    if media.kind == MediaKind::Document && media.pages.is_none() {
        media.kind = MediaKind::File;
    }
    media.name = str_of("filename");
    media
}

/// A document given as base64: a PDF's pages counted, an image costed as one, text read.
fn inline_document(media_type: Option<String>, data: &str, billing: Billing) -> Media {
    let bytes = decoded_len(data);
    let decoded = (bytes <= PDF_SCAN_MAX_BYTES)
        .then(|| decode_prefix(data, usize::MAX))
        .flatten();
    let Some(decoded) = decoded else {
        let mut media = document_guess(Origin::Inline { bytes });
        media.media_type = media_type;
        return media;
    };
    if image_media_type(&decoded).is_some() {
        let mut media = inline_image(media_type, data, false, billing);
        media.kind = MediaKind::Image;
        return media;
    }
    let mut media = Media::new(MediaKind::Document, Origin::Inline { bytes });
    if decoded.starts_with(b"%PDF") {
        media.media_type = media_type.or(Some("application/pdf".into()));
        let pages = pdf_pages(&decoded);
        media.pages = (pages > 0).then_some(pages);
        media.tokens = if pages > 0 {
            pages * PDF_PAGE_TOKENS
        } else {
            DOCUMENT_GUESS_TOKENS
        };
    } else if let Ok(text) = String::from_utf8(decoded) {
        // A text file: its text, though how the provider frames it is its own.
        media.media_type = media_type.or(Some("text/plain".into()));
        media.text = text;
    } else {
        media.media_type = media_type;
        media.tokens = DOCUMENT_GUESS_TOKENS;
    }
    media
}

/// Page objects in a PDF (`/Type /Page`, not `/Pages`); 0 when they are compressed out of
/// sight (object streams).
fn pdf_pages(pdf: &[u8]) -> u64 {
    static PAGE: LazyLock<regex::bytes::Regex> = LazyLock::new(|| {
        regex::bytes::Regex::new(r"(?-u)/Type\s*/Page\b").expect("a valid pattern")
    });
    PAGE.find_iter(pdf).count() as u64
}

/// Width and height an image's header states (PNG, JPEG, GIF, WebP).
fn image_dimensions(data: &str) -> Option<(u64, u64)> {
    let size_of = |bytes: &[u8]| {
        imagesize::blob_size(bytes)
            .ok()
            .filter(|s| s.width > 0 && s.height > 0)
            .map(|s| (s.width as u64, s.height as u64))
    };
    let head = decode_prefix(data, IMAGE_HEADER_CHARS)?;
    if let Some(size) = size_of(&head) {
        return Some(size);
    }
    if data.len() <= IMAGE_HEADER_CHARS || image_media_type(&head).is_none() {
        return None;
    }
    size_of(&decode_prefix(data, IMAGE_SCAN_MAX_CHARS)?)
}

/// The media type of image bytes, by their signature.
fn image_media_type(bytes: &[u8]) -> Option<&'static str> {
    match imagesize::image_type(bytes).ok()? {
        imagesize::ImageType::Png => Some("image/png"),
        imagesize::ImageType::Jpeg => Some("image/jpeg"),
        imagesize::ImageType::Gif => Some("image/gif"),
        imagesize::ImageType::Webp => Some("image/webp"),
        _ => None,
    }
}

/// Base64 as clients write it: padded or not, maybe wrapped in lines.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Bytes the base64 `data` decodes to.
fn decoded_len(data: &str) -> u64 {
    let chars = data
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'=')
        .count() as u64;
    chars * 3 / 4
}

/// The first bytes `data` decodes to, from at most `max_chars` of it; None if it is not base64.
fn decode_prefix(data: &str, max_chars: usize) -> Option<Vec<u8>> {
    let clean: Cow<str> = if data.bytes().any(|b| b.is_ascii_whitespace()) {
        Cow::Owned(data.chars().filter(|c| !c.is_ascii_whitespace()).collect())
    } else {
        Cow::Borrowed(data)
    };
    let end = if clean.len() <= max_chars {
        clean.len()
    } else {
        max_chars - max_chars % 4
    };
    BASE64.decode(clean.get(..end)?).ok()
}

#[cfg(test)]
mod tests;
