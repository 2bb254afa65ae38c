//! What media in a prompt (images, documents, audio, files) cost as their providers bill them:
//! the figures, each with where it comes from, all in this file; whether a cost is a guess; and
//! the words that name a media part in the summarizer's transcript. Reading the parts themselves,
//! in every dialect's shapes, is [`super::media_parts`]. Part of the seam: it imports nothing of
//! the crate.
//!
//! Inline data is base64 that the provider decodes: it is billed by what the bytes show (an
//! image's width and height, a PDF's pages), never as text. A cost from a fixed figure (an image
//! behind a URL or a file id, a format whose size cannot be read, a document's pages, audio) is a
//! guess, and so is any cost for a model whose provider does not publish these rules
//! ([`Billing::applies_to`]): nothing is learned from a prompt that holds one.

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
// Audio: OpenAI bills audio input by its length, at about 10 tokens a second (gpt-4o audio); a
// compressed stream at 128 kbit/s is 16,000 bytes a second. The length is not read from the
// bytes here, so the cost is a guess from the size.
/// Bytes of encoded audio per token.
pub const AUDIO_BYTES_PER_TOKEN: u64 = 1600;

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
    /// A media part of no known cost yet: a guess until its reader says otherwise.
    pub fn new(kind: MediaKind, origin: Origin) -> Media {
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
