use base64::engine::general_purpose::STANDARD;
use serde_json::json;

use super::*;
use crate::dialect::media::*;

/// A PNG of `width` × `height` whose header is real (signature, IHDR), padded to `size` bytes
/// with a chunk of filler: enough for anything that reads the size from the header.
fn png(width: u32, height: u32, size: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.extend(13u32.to_be_bytes());
    bytes.extend(b"IHDR");
    bytes.extend(width.to_be_bytes());
    bytes.extend(height.to_be_bytes());
    bytes.extend([8, 2, 0, 0, 0]);
    bytes.extend([0; 4]);
    let filler = size.saturating_sub(bytes.len() + 12);
    bytes.extend((filler as u32).to_be_bytes());
    bytes.extend(b"IDAT");
    bytes.extend((0..filler).map(|i| (i * 7919 % 251) as u8));
    bytes.extend([0; 4]);
    bytes
}

/// A baseline JPEG whose frame header (SOF0) follows `exif` bytes of an APP1 segment.
fn jpeg(width: u16, height: u16, exif: usize) -> Vec<u8> {
    let mut bytes = vec![0xFF, 0xD8];
    let mut rest = exif;
    while rest > 0 {
        let chunk = rest.min(60_000);
        bytes.extend([0xFF, 0xE1]);
        bytes.extend(((chunk + 2) as u16).to_be_bytes());
        bytes.extend(std::iter::repeat_n(0x11, chunk));
        rest -= chunk;
    }
    bytes.extend([0xFF, 0xC0, 0x00, 0x11, 0x08]);
    bytes.extend(height.to_be_bytes());
    bytes.extend(width.to_be_bytes());
    bytes.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
    bytes.extend([0xFF, 0xD9]);
    bytes
}

/// A PDF with `pages` page objects, uncompressed.
fn pdf(pages: usize) -> Vec<u8> {
    let mut text = String::from("%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n");
    text.push_str(&format!(
        "2 0 obj << /Type /Pages /Count {pages} >> endobj\n"
    ));
    for p in 0..pages {
        text.push_str(&format!(
            "{} 0 obj << /Type/Page /Parent 2 0 R >> endobj\n",
            p + 3
        ));
    }
    text.push_str("%%EOF\n");
    text.into_bytes()
}

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

#[test]
fn image_costs_follow_each_providers_published_rule() {
    // Anthropic: w × h / 750, the long edge first brought to 1568, at most 1,600.
    assert_eq!(image_tokens(Billing::Anthropic, 200, 200, false), 54);
    assert_eq!(image_tokens(Billing::Anthropic, 1000, 1000, false), 1334);
    assert_eq!(image_tokens(Billing::Anthropic, 1920, 1080, false), 1600);
    assert_eq!(image_tokens(Billing::Anthropic, 3136, 200, false), 210);
    // OpenAI's worked examples: 1024² is 4 tiles (765), 2048 × 4096 is 6 (1105), low is 85.
    assert_eq!(image_tokens(Billing::OpenAi, 1024, 1024, false), 765);
    assert_eq!(image_tokens(Billing::OpenAi, 2048, 4096, false), 1105);
    assert_eq!(image_tokens(Billing::OpenAi, 4096, 8192, true), 85);
    assert_eq!(image_tokens(Billing::OpenAi, 100, 100, false), 255);
    assert!(image_tokens(Billing::OpenAi, 768, 20_000, false) <= OPENAI_MAX_IMAGE_TOKENS);
}

#[test]
fn an_inline_image_is_costed_from_its_header_not_its_bytes() {
    let data = b64(&png(1920, 1080, 400_000));
    let part = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}});
    let media = read(&part, Billing::Anthropic);
    assert_eq!(media.kind, MediaKind::Image);
    assert_eq!(media.dimensions, Some((1920, 1080)));
    assert_eq!(media.origin, Origin::Inline { bytes: 400_000 });
    assert_eq!((media.tokens, media.guessed), (1600, false));
    assert_eq!(
        media.describe(),
        "image (image/png, 400000 bytes, 1920x1080)"
    );

    // The same bytes as chat and Responses send them, billed by OpenAI's rule.
    let url = format!("data:image/png;base64,{data}");
    for part in [
        json!({"type": "image_url", "image_url": {"url": url}}),
        json!({"type": "input_image", "image_url": url, "detail": "auto"}),
    ] {
        let media = read(&part, Billing::OpenAi);
        assert_eq!((media.tokens, media.guessed), (1105, false), "{part}");
    }
    let low = json!({"type": "input_image", "image_url": url, "detail": "low"});
    assert_eq!(read(&low, Billing::OpenAi).tokens, 85);
}

#[test]
fn a_jpeg_whose_frame_header_follows_a_long_exif_block_is_still_read() {
    let data = b64(&jpeg(800, 600, 120_000));
    assert!(data.len() > IMAGE_HEADER_CHARS);
    let part = json!({"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{data}")}});
    let media = read(&part, Billing::OpenAi);
    assert_eq!(media.dimensions, Some((800, 600)));
    assert!(!media.guessed);
    // Its type read from the bytes when the part does not say it.
    let bare = json!({"type": "input_image", "image_url": format!("data:;base64,{data}")});
    assert_eq!(
        read(&bare, Billing::OpenAi).media_type.as_deref(),
        Some("image/jpeg")
    );
}

#[test]
fn what_cannot_be_read_costs_a_fixed_guess() {
    for (part, billing, tokens) in [
        (
            json!({"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}),
            Billing::Anthropic,
            ANTHROPIC_MAX_IMAGE_TOKENS,
        ),
        (
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}),
            Billing::OpenAi,
            OPENAI_MAX_IMAGE_TOKENS,
        ),
        (
            json!({"type": "input_image", "file_id": "file-1"}),
            Billing::OpenAi,
            OPENAI_MAX_IMAGE_TOKENS,
        ),
        (
            json!({"type": "document", "source": {"type": "file", "file_id": "file-2"}}),
            Billing::Anthropic,
            DOCUMENT_GUESS_TOKENS,
        ),
    ] {
        let media = read(&part, billing);
        assert_eq!((media.tokens, media.guessed), (tokens, true), "{part}");
    }
    // A URL image at low detail costs 85 whatever it holds: no guess.
    let low =
        json!({"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}});
    assert_eq!(
        (
            read(&low, Billing::OpenAi).tokens,
            read(&low, Billing::OpenAi).guessed
        ),
        (85, false)
    );
}

#[test]
fn a_pdf_is_billed_by_its_pages_in_every_shape() {
    let data = b64(&pdf(3));
    let url = format!("data:application/pdf;base64,{data}");
    for (part, billing) in [
        (
            json!({"type": "document", "title": "Spec", "source": {"type": "base64", "media_type": "application/pdf", "data": data}}),
            Billing::Anthropic,
        ),
        (
            json!({"type": "file", "file": {"filename": "spec.pdf", "file_data": url}}),
            Billing::OpenAi,
        ),
        (
            json!({"type": "input_file", "filename": "spec.pdf", "file_data": url}),
            Billing::OpenAi,
        ),
    ] {
        let media = read(&part, billing);
        assert_eq!(media.kind, MediaKind::Document, "{part}");
        assert_eq!(media.pages, Some(3), "{part}");
        assert_eq!(media.tokens, 3 * PDF_PAGE_TOKENS, "{part}");
        assert!(media.guessed, "what a page holds is unknown");
        assert!(media.describe().contains("application/pdf"), "{part}");
        assert!(media.describe().contains("3 pages"), "{part}");
    }
    // A text document is its text, counted exactly.
    let text = json!({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "hello world"}});
    let media = read(&text, Billing::Anthropic);
    assert_eq!((media.tokens, media.text.as_str()), (0, "hello world"));
    assert!(!media.guessed);
}

#[test]
fn media_are_found_at_any_depth_and_only_as_a_part_type() {
    let data = b64(&png(64, 64, 2_000));
    let nested = json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
        "content": [{"type": "text", "text": "shot"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]});
    let found = find(&nested, Billing::Anthropic);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].dimensions, Some((64, 64)));
    let stripped = without_media(&nested).to_string();
    assert!(!stripped.contains(&data) && stripped.contains("shot"));
    let output = json!({"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": format!("data:image/png;base64,{data}")}]}).to_string();
    assert_eq!(find_in_raw(&output, Billing::OpenAi).len(), 1);
    assert!(holds_media(&output));
    assert!(holds_media(
        r#"{"role":"user","content":[{"type":"\u0069mage","source":{}}]}"#
    ));
    for raw in [
        r#"{"role":"user","content":"an \"image\" of {\"type\":\"image\"}"}"#,
        r#"{"role":"user","content":[{"type":"text","text":"image"}]}"#,
        r#"{"role":"assistant","content":"caf\u00e9"}"#,
    ] {
        assert!(!holds_media(raw), "{raw}");
        assert!(find_in_raw(raw, Billing::OpenAi).is_empty(), "{raw}");
    }
}

#[test]
fn a_tool_results_media_name_the_call_that_returned_them() {
    let media = read(
        &json!({"type": "input_image", "image_url": "https://example.com/a.png"}),
        Billing::OpenAi,
    );
    assert_eq!(
        returned_by(&media, Some("screenshot"), "call_1"),
        "[image (at https://example.com/a.png) returned by the call screenshot (call_1)]\n"
    );
}

#[test]
fn a_cost_read_from_the_bytes_is_a_guess_for_a_model_billed_by_other_rules() {
    let known = read(
        &json!({"type": "input_image", "image_url": format!("data:image/png;base64,{}", b64(&png(640, 480, 3_000)))}),
        Billing::OpenAi,
    );
    let unknown = read(
        &json!({"type": "input_image", "file_id": "file-1"}),
        Billing::OpenAi,
    );
    assert_eq!(MediaCost::of(&[]), MediaCost::None);
    assert_eq!(MediaCost::of(std::slice::from_ref(&known)), MediaCost::Read);
    assert_eq!(MediaCost::of(&[known, unknown]), MediaCost::Guessed);
    assert!(!MediaCost::Read.is_guess(true) && MediaCost::Read.is_guess(false));
    assert!(MediaCost::Guessed.is_guess(true) && !MediaCost::None.is_guess(false));
    assert!(
        Billing::OpenAi.applies_to("gpt-4o-mini") && Billing::OpenAi.applies_to("openai/o4-mini")
    );
    assert!(!Billing::OpenAi.applies_to("qwen2.5-vl-7b"));
    assert!(Billing::Anthropic.applies_to("claude-sonnet-4-5"));
    assert!(!Billing::Anthropic.applies_to("gpt-4o"));
}
