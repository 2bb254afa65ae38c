//! Tokens: OpenAI's tokenizers (tiktoken `o200k_base` / `cl100k_base`), kept linear in the
//! text's length, and the per-request accounting every dialect shares.
//!
//! Counting stays linear: tiktoken's merge step is quadratic in the length of one
//! pre-tokenized piece, so a long stretch without a word boundary (a run of one letter, base64,
//! CJK text without spaces) is cut into bounded pieces first. The count is then an upper bound
//! there (a cut can only prevent merges), exact everywhere else. A count can be given up half
//! way ([`Cancel`]) when the request that wants it has gone.
//!
//! This module sits beneath the dialects and the core: it imports nothing of the crate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tiktoken_rs::CoreBPE;

/// Tokens that prime the assistant's reply.
pub const REPLY_PRIMING: u64 = 3;
/// Overhead of the tool definitions block.
pub const TOKENS_FOR_TOOLS: u64 = 12;
/// Longest stretch of text without a word boundary that is encoded as one piece. Tokens are at
/// most a few dozen bytes long, so cutting here costs at most one token per cut, while the
/// quadratic merge step stays cheap on every piece.
const MAX_UNBROKEN_BYTES: usize = 512;

/// Which BPE a model is counted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    O200k,
    Cl100k,
}

impl Encoding {
    /// `cl100k_base` for gpt-4 and gpt-3.5 (but not gpt-4o / gpt-4.1), `o200k_base` for
    /// everything else, including unknown models.
    pub fn for_model(model: &str) -> Encoding {
        let m = model.to_ascii_lowercase();
        let m = m.rsplit('/').next().unwrap_or(&m);
        let is_legacy = m.starts_with("gpt-3.5")
            || m.starts_with("gpt-35")
            || (m.starts_with("gpt-4")
                && !m.starts_with("gpt-4o")
                && !m.starts_with("gpt-4.")
                && !m.starts_with("gpt-4-o"));
        if is_legacy {
            Encoding::Cl100k
        } else {
            Encoding::O200k
        }
    }

    fn bpe(self) -> &'static CoreBPE {
        match self {
            Encoding::O200k => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100k => tiktoken_rs::cl100k_base_singleton(),
        }
    }

    /// Tokens in a piece of text: exact for ordinary text, an upper bound for text with long
    /// stretches between word boundaries.
    pub fn count(self, text: &str) -> u64 {
        self.count_until(text, &Cancel::default()).unwrap_or(0)
    }

    /// Like [`Encoding::count`], giving up (None) once `cancel` is set.
    pub fn count_until(self, text: &str, cancel: &Cancel) -> Option<u64> {
        let bpe = self.bpe();
        let mut tokens = 0;
        for piece in bounded_pieces(text) {
            if cancel.is_set() {
                return None;
            }
            tokens += bpe.encode_ordinary(piece).len() as u64;
        }
        Some(tokens)
    }

    /// A small number per encoding, for cache keys.
    pub fn index(self) -> u8 {
        match self {
            Encoding::O200k => 0,
            Encoding::Cl100k => 1,
        }
    }
}

/// Splits `text` where a stretch without a word boundary grows past [`MAX_UNBROKEN_BYTES`], and
/// nowhere else. A word boundary is a space or tab right after a non-space character: the
/// tokenizers' pre-tokenizer (cl100k and o200k alike) always starts a new piece there, so text
/// whose stretches are all short is encoded exactly as a whole.
fn bounded_pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut since_boundary = 0;
        let mut previous_is_space = true;
        let mut cut = rest.len();
        for (i, c) in rest.char_indices() {
            if (c == ' ' || c == '\t') && !previous_is_space {
                since_boundary = i;
            } else if i - since_boundary >= MAX_UNBROKEN_BYTES {
                cut = i;
                break;
            }
            previous_is_space = c.is_whitespace();
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

/// Set when the request that wants a count has gone: counting stops at the next piece.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// A guard that cancels when dropped, e.g. with the future of a request whose client left.
    pub fn on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(self.clone())
    }
}

/// Cancels its [`Cancel`] when dropped.
pub struct CancelOnDrop(Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_encoding_by_family() {
        assert_eq!(Encoding::for_model("gpt-4"), Encoding::Cl100k);
        assert_eq!(Encoding::for_model("gpt-4-turbo"), Encoding::Cl100k);
        assert_eq!(Encoding::for_model("gpt-3.5-turbo"), Encoding::Cl100k);
        assert_eq!(Encoding::for_model("gpt-4o-mini"), Encoding::O200k);
        assert_eq!(Encoding::for_model("gpt-4.1"), Encoding::O200k);
        assert_eq!(Encoding::for_model("gpt-5"), Encoding::O200k);
        assert_eq!(Encoding::for_model("o3-mini"), Encoding::O200k);
        assert_eq!(Encoding::for_model("some-local-model"), Encoding::O200k);
    }

    #[test]
    fn known_token_counts() {
        // Reference counts from OpenAI's tokenizers.
        assert_eq!(Encoding::Cl100k.count("hello world"), 2);
        assert_eq!(Encoding::O200k.count("hello world"), 2);
        assert_eq!(Encoding::Cl100k.count("tiktoken is great!"), 6);
        assert_eq!(Encoding::O200k.count(""), 0);
    }

    #[test]
    fn text_with_word_boundaries_is_counted_exactly() {
        let words = [
            "parser",
            "naïve",
            "x=1;",
            "\n",
            "résumé",
            "\t",
            "  ",
            "日本語",
            "http://a/b?c",
        ];
        let text: String = (0..5_000)
            .map(|i| words[(i * 7) % words.len()])
            .collect::<Vec<_>>()
            .join(" ");
        for encoding in [Encoding::O200k, Encoding::Cl100k] {
            let exact = encoding.bpe().encode_ordinary(&text).len() as u64;
            assert_eq!(encoding.count(&text), exact, "{encoding:?}");
        }
    }

    #[test]
    fn long_stretches_are_cut_into_bounded_pieces_and_never_undercounted() {
        for text in [
            "a".repeat(300_000),
            "é".repeat(100_000),
            "ab+".repeat(50_000),
            " ".repeat(10_000),
        ] {
            let pieces: Vec<&str> = bounded_pieces(&text).collect();
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().all(|p| p.len() <= MAX_UNBROKEN_BYTES + 4));
        }
        // Where the exact count is affordable, the bounded one is at least as large and close.
        let text = format!("start {} end", "a".repeat(4_000));
        let exact = Encoding::O200k.bpe().encode_ordinary(&text).len() as u64;
        let bounded = Encoding::O200k.count(&text);
        assert!(
            bounded >= exact && bounded <= exact + 10,
            "{bounded} vs {exact}"
        );
    }

    #[test]
    fn a_cancelled_count_gives_up() {
        let cancel = Cancel::default();
        assert_eq!(Encoding::O200k.count_until("hello world", &cancel), Some(2));
        drop(cancel.on_drop());
        assert!(cancel.is_set());
        assert_eq!(Encoding::O200k.count_until("hello world", &cancel), None);
    }
}
