//! Real media bytes for the tests: a PNG whose header states a chosen size, padded to a chosen
//! length with image data, and a PDF with a chosen number of pages; base64 as clients send it.
#![allow(dead_code)]

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

/// A PNG of `width` × `height` (signature and IHDR as the format has them) that is `size`
/// bytes long: its IDAT chunk holds bytes that look like compressed pixels.
pub fn png(width: u32, height: u32, size: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut bytes, b"IHDR", &{
        let mut ihdr = width.to_be_bytes().to_vec();
        ihdr.extend(height.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]);
        ihdr
    });
    let filler = size.saturating_sub(bytes.len() + 12 + 12);
    chunk(&mut bytes, b"IDAT", &noise(filler, width));
    chunk(&mut bytes, b"IEND", &[]);
    bytes
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend((data.len() as u32).to_be_bytes());
    out.extend(kind);
    out.extend(data);
    // The CRC is not checked by anything that reads a size; zeros keep the builder short.
    out.extend([0; 4]);
}

/// `len` bytes without a short period (as compressed data looks), different for each `seed`.
fn noise(len: usize, seed: u32) -> Vec<u8> {
    let mut state = u64::from(seed) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A PDF of `pages` pages, about `size` bytes long (the rest one binary stream).
pub fn pdf(pages: usize, size: usize) -> Vec<u8> {
    let mut out = b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n".to_vec();
    let kids: Vec<String> = (0..pages).map(|p| format!("{} 0 R", p + 3)).collect();
    out.extend(
        format!(
            "2 0 obj\n<< /Type /Pages /Kids [{}] /Count {pages} >>\nendobj\n",
            kids.join(" ")
        )
        .bytes(),
    );
    for p in 0..pages {
        out.extend(
            format!(
                "{} 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>\nendobj\n",
                p + 3
            )
            .bytes(),
        );
    }
    let stream = noise(size.saturating_sub(out.len() + 64), 7);
    out.extend(format!("99 0 obj\n<< /Length {} >>\nstream\n", stream.len()).bytes());
    out.extend(stream);
    out.extend(b"\nendstream\nendobj\n%%EOF\n");
    out
}

pub fn base64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// Whether `text` holds a run of `len` base64 characters: what media bytes would leave behind.
pub fn has_base64_run(text: &str, len: usize) -> bool {
    let mut run = 0;
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '+' || c == '/' {
            run += 1;
            if run >= len {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}
