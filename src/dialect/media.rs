//! Media in a prompt (images, documents, audio, files) in every dialect's shapes: what each costs
//! as its provider bills it, whether that cost is a guess, and a placeholder that names it for
//! the summarizer's transcript. Part of the seam: it imports nothing of the crate.
//!
//! A media part is an object whose `type` is one of [`MEDIA_TYPES`], wherever it stands (in a
//! message's content, in a tool result, in a `function_call_output`'s output). Its inline data
//! is base64 that the provider decodes: billed by what the bytes show (an image's width and
//! height, a PDF's pages), never as text. The figures are all in this file's constants, each
//! with where it comes from. A cost from a fixed figure (an image behind a URL or a file id, a
//! format whose size cannot be read, a document's pages, audio) is a guess, and so is any cost
//! for a model whose provider does not publish these rules ([`Billing::applies_to`]): nothing is
//! learned from a prompt that holds one.

use std::borrow::Cow;
use std::sync::LazyLock;

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use serde_json::Value;

// Anthropic, "Vision" (docs.anthropic.com, build-with-claude/vision): an image costs about
// width × height / 750 tokens; one whose long edge exceeds 1568 px is first scaled down to it,
// and one over about 1,600 tokens (some 1.15 megapixels) is scaled down until it is within.
/// Pixels per token of an image on Anthropic's models.
pub const ANTHROPIC_PIXELS_PER_TOKEN: u64 = 750;
/// Longest edge, in pixels, an Anthropic model sees an image at.
pub const ANTHROPIC_MAX_LONG_EDGE: u64 = 1568;
/// Most tokens one image costs on Anthropic's models (after their resizing); also the cost of
/// one whose size cannot be read, since no image costs more.
pub const ANTHROPIC_MAX_IMAGE_TOKENS: u64 = 1600;

// OpenAI, "Images and vision" (platform.openai.com, guides/images-vision, "Calculating costs"):
// at high detail an image is scaled to fit 2048 × 2048, then its short side to 768 px, and
// costs 170 tokens per 512 px tile plus 85; at `detail: low` it costs 85 whatever its size.
/// Side of one OpenAI image tile, in pixels.
pub const OPENAI_TILE_EDGE: u64 = 512;
/// Tokens per tile at high detail.
pub const OPENAI_TOKENS_PER_TILE: u64 = 170;
/// Tokens every image costs, and all a `detail: low` image costs.
pub const OPENAI_BASE_IMAGE_TOKENS: u64 = 85;
/// The square an image is first scaled to fit, in pixels.
pub const OPENAI_MAX_EDGE: u64 = 2048;
/// The short side an image is then scaled down to, in pixels.
pub const OPENAI_SHORT_EDGE: u64 = 768;
/// The cost of an image whose size cannot be read: the most any image costs at high detail
/// (768 × 2048 after scaling: 8 tiles).
pub const OPENAI_MAX_IMAGE_TOKENS: u64 = OPENAI_BASE_IMAGE_TOKENS + 8 * OPENAI_TOKENS_PER_TILE;

// Documents: both providers put a PDF's extracted text and an image of each page in the prompt
// (Anthropic, "PDF support": 1,500 to 3,000 tokens of text per page, plus the page's image;
// OpenAI, "File inputs": text and an image of each page). The text a page holds is unknown
// here, so every document's cost is a guess, at the top of that range.
/// Tokens charged per PDF page.
pub const PDF_PAGE_TOKENS: u64 = 3000;
/// Tokens charged for a document whose pages cannot be counted (a URL, a file id, a PDF whose
/// page objects are compressed): five pages.
pub const DOCUMENT_GUESS_TOKENS: u64 = 5 * PDF_PAGE_TOKENS;
/// Largest inline document, decoded, whose pages are counted: Anthropic's request limit (32 MB)
/// holds no larger one, and the scan stays a few milliseconds.
pub const PDF_SCAN_MAX_BYTES: u64 = 32 * 1024 * 1024;
/// Base64 characters decoded first to read an image's header: PNG, GIF and WebP state their
/// size in the first bytes; a JPEG's frame header may follow a long EXIF block, and then the
/// whole image is read (up to [`IMAGE_SCAN_MAX_CHARS`]).
const IMAGE_HEADER_CHARS: usize = 64 * 1024;
/// Most base64 characters decoded to find an image's size.
const IMAGE_SCAN_MAX_CHARS: usize = 16 * 1024 * 1024;

// Audio: OpenAI bills audio input by its length, at about 10 tokens a second (gpt-4o audio); a
// compressed stream at 128 kbit/s is 16,000 bytes a second. The length is not read from the
// bytes here, so the cost is a guess from the size.
/// Bytes of encoded audio per token.
pub const AUDIO_BYTES_PER_TOKEN: u64 = 1600;

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

/// Whose rules a prompt's media are billed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Billing {
    Anthropic,
    OpenAi,
}

impl Billing {
    /// Whether `model` is one whose provider publishes these rules (Claude models for
    /// Anthropic's, GPT and o-series models for OpenAI's). Another model served in the same
    /// format (a local vision model behind llama.cpp, a gateway's) bills images its own way:
    /// the cost of its images is a guess, even when their size is known.
    pub fn applies_to(self, model: &str) -> bool {
        let m = model.to_ascii_lowercase();
        let m = m.rsplit('/').next().unwrap_or(&m);
        match self {
            Billing::Anthropic => m.starts_with("claude"),
            Billing::OpenAi => ["gpt-", "chatgpt", "o1", "o3", "o4", "codex"]
                .iter()
                .any(|p| m.starts_with(p)),
        }
    }
}

/// How an element's media were costed, whatever the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MediaCost {
    /// It has none.
    #[default]
    None,
    /// By the provider's rule applied to what their bytes say (an image's size).
    Read,
    /// At least one at a fixed figure.
    Guessed,
}

impl MediaCost {
    /// How `media` (one element's) were costed.
    pub fn of(media: &[Media]) -> MediaCost {
        if media.iter().any(|m| m.guessed) {
            MediaCost::Guessed
        } else if media.is_empty() {
            MediaCost::None
        } else {
            MediaCost::Read
        }
    }

    /// Whether the cost is a guess for a request whose model is billed by the rules applied
    /// (`rules_apply`, see [`Billing::applies_to`]) or not.
    pub fn is_guess(self, rules_apply: bool) -> bool {
        match self {
            MediaCost::None => false,
            MediaCost::Read => !rules_apply,
            MediaCost::Guessed => true,
        }
    }
}

/// What a media part is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    Image,
    Document,
    Audio,
    File,
}

impl MediaKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Document => "document",
            MediaKind::Audio => "audio",
            MediaKind::File => "file",
        }
    }
}

/// Where a media part's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// In the request, base64: `bytes` once decoded.
    Inline {
        bytes: u64,
    },
    Url(String),
    FileId(String),
    Unknown,
}

/// One media part, read.
#[derive(Debug, Clone, PartialEq)]
pub struct Media {
    pub kind: MediaKind,
    /// `image/png`, `application/pdf`, … when the part or its bytes say.
    pub media_type: Option<String>,
    pub origin: Origin,
    /// Width and height in pixels, when read from the bytes.
    pub dimensions: Option<(u64, u64)>,
    /// Pages of a PDF, when counted.
    pub pages: Option<u64>,
    /// A file name or document title the client gave.
    pub name: Option<String>,
    /// Tokens billed for it besides `text`.
    pub tokens: u64,
    /// Text the provider reads from it (a text document's content, its title and context),
    /// counted with the dialect's tokenizer.
    pub text: String,
    /// Whether `tokens` comes from a fixed figure rather than the provider's rule applied to
    /// what the bytes say.
    pub guessed: bool,
}

impl Media {
    fn new(kind: MediaKind, origin: Origin) -> Media {
        Media {
            kind,
            media_type: None,
            origin,
            dimensions: None,
            pages: None,
            name: None,
            tokens: 0,
            text: String::new(),
            guessed: true,
        }
    }

    /// Tokens it costs, `count` counting its text.
    pub fn cost(&self, count: impl Fn(&str) -> u64) -> u64 {
        let text = if self.text.is_empty() {
            0
        } else {
            count(&self.text)
        };
        self.tokens + text
    }

    /// What it is, in a few words and never its bytes: kind, media type, size, dimensions or
    /// pages, name, or where it lives (`image (image/png, 412345 bytes, 1920x1080)`).
    pub fn describe(&self) -> String {
        let mut facts: Vec<String> = Vec::new();
        facts.extend(self.media_type.clone());
        match &self.origin {
            Origin::Inline { bytes } => facts.push(format!("{bytes} bytes")),
            Origin::Url(url) => facts.push(format!("at {}", shorten(url, 120))),
            Origin::FileId(id) => facts.push(format!("file id {}", shorten(id, 80))),
            Origin::Unknown => {}
        }
        if let Some((w, h)) = self.dimensions {
            facts.push(format!("{w}x{h}"));
        }
        if let Some(pages) = self.pages {
            facts.push(format!("{pages} page{}", if pages == 1 { "" } else { "s" }));
        }
        if let Some(name) = &self.name {
            facts.push(format!("\"{}\"", shorten(name, 120)));
        }
        if facts.is_empty() {
            self.kind.as_str().to_string()
        } else {
            format!("{} ({})", self.kind.as_str(), facts.join(", "))
        }
    }
}

/// The transcript's line for media a tool returned: what it is and which call produced it
/// (`name`, when known, and the call's `id`).
pub fn returned_by(media: &Media, name: Option<&str>, id: &str) -> String {
    let call = match (name, id) {
        (Some(name), "") => name.to_string(),
        (Some(name), id) => format!("{name} ({id})"),
        (None, "") => "a tool".to_string(),
        (None, id) => id.to_string(),
    };
    format!("[{} returned by the call {call}]\n", media.describe())
}

fn shorten(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_string();
    }
    let head: String = text.chars().take(limit).collect();
    format!("{head}…")
}

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

/// Tokens an image of `width` × `height` pixels costs under `billing`'s rules.
pub fn image_tokens(billing: Billing, width: u64, height: u64, low_detail: bool) -> u64 {
    let (w, h) = (width.max(1) as f64, height.max(1) as f64);
    match billing {
        Billing::Anthropic => {
            let scale = (ANTHROPIC_MAX_LONG_EDGE as f64 / w.max(h)).min(1.0);
            let pixels = (w * scale).round() * (h * scale).round();
            ((pixels / ANTHROPIC_PIXELS_PER_TOKEN as f64).ceil() as u64)
                .clamp(1, ANTHROPIC_MAX_IMAGE_TOKENS)
        }
        Billing::OpenAi if low_detail => OPENAI_BASE_IMAGE_TOKENS,
        Billing::OpenAi => {
            let fit = (OPENAI_MAX_EDGE as f64 / w.max(h)).min(1.0);
            let (w, h) = (w * fit, h * fit);
            let short = (OPENAI_SHORT_EDGE as f64 / w.min(h)).min(1.0);
            let (w, h) = ((w * short).floor(), (h * short).floor());
            let tile = OPENAI_TILE_EDGE as f64;
            let tiles = (w / tile).ceil().max(1.0) * (h / tile).ceil().max(1.0);
            OPENAI_BASE_IMAGE_TOKENS + tiles as u64 * OPENAI_TOKENS_PER_TILE
        }
    }
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
