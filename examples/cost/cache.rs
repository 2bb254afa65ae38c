//! The provider's side of the cost replay: a prompt cache as providers keep one, the `usage`
//! each provider reports for a request through it, and the bill at a provider's list prices.
//!
//! The cache holds every prefix of the conversation's earlier prompts. A request reads from it
//! the longest prefix it shares with any of them; a provider counts that as cached only from
//! 1,024 tokens on. How each provider then reports and bills it:
//!
//! - Anthropic-style: the client marks the end of every request as a cache breakpoint (as
//!   coding agents do), so what is not read is written. `usage` says `input_tokens` (neither
//!   read nor written: a prompt under the minimum), `cache_creation_input_tokens` and
//!   `cache_read_input_tokens`. Writes cost 1.25× fresh input, reads 0.1×.
//! - OpenAI-style: cached tokens come in steps of 128 from 1,024 on, writing is free. `usage`
//!   says `prompt_tokens` (all of them) and `prompt_tokens_details.cached_tokens`. Cached input
//!   costs a quarter of fresh input.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use compactor::tokenizer::Encoding;
use serde_json::{json, Value};

/// The shortest prefix a provider caches.
pub const MIN_CACHED: u64 = 1024;
/// OpenAI counts cached tokens in steps of this many.
pub const OPENAI_STEP: u64 = 128;

/// One element of a prompt: a key that is equal when the element is, and its tokens.
#[derive(Debug, Clone, Copy)]
pub struct Block {
    pub key: u64,
    pub tokens: u64,
}

/// What the cache found for one prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hit {
    pub total: u64,
    /// Tokens of the longest prefix shared with an earlier prompt (before any minimum).
    pub shared: u64,
}

/// The prefixes of a conversation's earlier prompts, by element.
#[derive(Default)]
pub struct PromptCache {
    prefixes: HashSet<u64>,
}

impl PromptCache {
    /// Looks `blocks` up without remembering them: a prompt sent beside another, which neither
    /// reads from the other.
    pub fn peek(&self, blocks: &[Block]) -> Hit {
        let mut chain = DefaultHasher::new();
        let mut hit = Hit::default();
        let mut matching = true;
        for block in blocks {
            block.key.hash(&mut chain);
            matching = matching && self.prefixes.contains(&chain.finish());
            if matching {
                hit.shared += block.tokens;
            }
            hit.total += block.tokens;
        }
        hit
    }

    /// Looks `blocks` up and remembers every prefix of it.
    pub fn send(&mut self, blocks: &[Block]) -> Hit {
        let mut chain = DefaultHasher::new();
        let mut hit = Hit::default();
        let mut matching = true;
        for block in blocks {
            block.key.hash(&mut chain);
            let prefix = chain.finish();
            matching = matching && self.prefixes.contains(&prefix);
            if matching {
                hit.shared += block.tokens;
            }
            self.prefixes.insert(prefix);
            hit.total += block.tokens;
        }
        hit
    }
}

/// The same for prompts that are one text each (the summarizer's): the longest common prefix,
/// in bytes, with any earlier text, counted in tokens.
pub struct TextCache {
    earlier: Vec<String>,
    encoding: Encoding,
}

impl TextCache {
    pub fn new(encoding: Encoding) -> TextCache {
        TextCache {
            earlier: Vec::new(),
            encoding,
        }
    }

    pub fn send(&mut self, text: String) -> Hit {
        let common = self
            .earlier
            .iter()
            .map(|e| common_prefix(e, &text))
            .max()
            .unwrap_or(0);
        let hit = Hit {
            total: self.encoding.count(&text),
            shared: self.encoding.count(&text[..common]),
        };
        self.earlier.push(text);
        hit
    }
}

/// Bytes `a` and `b` share from their start, at a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// A key for a text block.
pub fn key_of(value: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// The two billing styles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    Anthropic,
    OpenAi,
}

/// Whether a prompt marks its end as a cache breakpoint. Only Anthropic-style billing reads
/// it: OpenAI caches every prompt on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakpoint {
    /// The client's requests (coding agents mark the newest message).
    AtEnd,
    /// Compactor's standalone summary requests, which carry no `cache_control`: nothing is
    /// read or written at Anthropic, all is fresh input. (A continuation of the conversation
    /// marks its closing message: [`Breakpoint::AtEnd`].)
    None,
}

/// A provider's `usage` for a prompt the cache found as `hit`, with `output` tokens answered.
pub fn usage(provider: Provider, hit: Hit, breakpoint: Breakpoint, output: u64) -> Value {
    if provider == Provider::Anthropic && breakpoint == Breakpoint::None {
        return json!({
            "input_tokens": hit.total,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output,
        });
    }
    let read = if hit.shared >= MIN_CACHED {
        hit.shared
    } else {
        0
    };
    match provider {
        Provider::Anthropic => {
            let written = if hit.total >= MIN_CACHED {
                hit.total - read
            } else {
                0
            };
            json!({
                "input_tokens": hit.total - read - written,
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read,
                "output_tokens": output,
            })
        }
        Provider::OpenAi => json!({
            "prompt_tokens": hit.total,
            "prompt_tokens_details": {"cached_tokens": read / OPENAI_STEP * OPENAI_STEP},
            "completion_tokens": output,
        }),
    }
}

/// Input tokens as a bill sees them: fresh, read from the cache, written to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub fresh: u64,
    pub read: u64,
    pub written: u64,
    pub output: u64,
}

impl Tokens {
    /// Reads a provider's `usage`.
    pub fn from_usage(provider: Provider, usage: &Value) -> Tokens {
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        match provider {
            Provider::Anthropic => Tokens {
                fresh: n(&usage["input_tokens"]),
                read: n(&usage["cache_read_input_tokens"]),
                written: n(&usage["cache_creation_input_tokens"]),
                output: n(&usage["output_tokens"]),
            },
            Provider::OpenAi => {
                let cached = n(&usage["prompt_tokens_details"]["cached_tokens"]);
                Tokens {
                    fresh: n(&usage["prompt_tokens"]) - cached,
                    read: cached,
                    written: 0,
                    output: n(&usage["completion_tokens"]),
                }
            }
        }
    }

    pub fn add(&mut self, other: Tokens) {
        self.fresh += other.fresh;
        self.read += other.read;
        self.written += other.written;
        self.output += other.output;
    }

    pub fn input(&self) -> u64 {
        self.fresh + self.read + self.written
    }
}

/// List prices in dollars per million tokens.
#[derive(Debug, Clone, Copy)]
pub struct Prices {
    pub name: &'static str,
    pub provider: Provider,
    pub input: f64,
    pub cache_read: f64,
    pub cache_write: f64,
    pub output: f64,
}

/// Claude Sonnet 4.5 (anthropic.com/pricing, 5-minute cache writes) and GPT-4.1
/// (openai.com/api/pricing), as listed in 2025.
pub const PRICES: [Prices; 2] = [
    Prices {
        name: "Claude Sonnet 4.5",
        provider: Provider::Anthropic,
        input: 3.0,
        cache_read: 0.30,
        cache_write: 3.75,
        output: 15.0,
    },
    Prices {
        name: "GPT-4.1",
        provider: Provider::OpenAi,
        input: 2.0,
        cache_read: 0.50,
        cache_write: 0.0,
        output: 8.0,
    },
];

impl Prices {
    pub fn dollars(&self, t: &Tokens) -> f64 {
        (t.fresh as f64 * self.input
            + t.read as f64 * self.cache_read
            + t.written as f64 * self.cache_write
            + t.output as f64 * self.output)
            / 1e6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(spec: &[(u64, u64)]) -> Vec<Block> {
        spec.iter()
            .map(|&(key, tokens)| Block { key, tokens })
            .collect()
    }

    /// A small conversation: a first prompt, one that extends it, one whose middle changed (a
    /// compaction), and one that only repeats a short head.
    #[test]
    fn accounts_a_synthetic_conversation_as_each_provider_reports_it() {
        let mut cache = PromptCache::default();
        let first = cache.send(&blocks(&[(1, 900), (2, 300)]));
        assert_eq!(
            first,
            Hit {
                total: 1200,
                shared: 0
            }
        );
        let grown = cache.send(&blocks(&[(1, 900), (2, 300), (3, 200), (4, 50)]));
        assert_eq!(
            grown,
            Hit {
                total: 1450,
                shared: 1200
            }
        );
        let compacted = cache.send(&blocks(&[(1, 900), (9, 100), (4, 50)]));
        assert_eq!(
            compacted,
            Hit {
                total: 1050,
                shared: 900
            }
        );
        // An older prefix still counts: the first three blocks of `grown`.
        let back = cache.send(&blocks(&[(1, 900), (2, 300), (3, 200), (5, 10)]));
        assert_eq!(
            back,
            Hit {
                total: 1410,
                shared: 1400
            }
        );

        let anthropic: Vec<Tokens> = [first, grown, compacted, back]
            .iter()
            .map(|h| {
                Tokens::from_usage(
                    Provider::Anthropic,
                    &usage(Provider::Anthropic, *h, Breakpoint::AtEnd, 7),
                )
            })
            .collect();
        let t = |fresh, read, written| Tokens {
            fresh,
            read,
            written,
            output: 7,
        };
        // Under 1,024 shared tokens nothing is read; every prompt of 1,024 or more is written.
        assert_eq!(
            anthropic,
            vec![
                t(0, 0, 1200),
                t(0, 1200, 250),
                t(0, 0, 1050),
                t(0, 1400, 10)
            ]
        );
        let openai: Vec<Tokens> = [first, grown, compacted, back]
            .iter()
            .map(|h| {
                Tokens::from_usage(
                    Provider::OpenAi,
                    &usage(Provider::OpenAi, *h, Breakpoint::AtEnd, 7),
                )
            })
            .collect();
        // Steps of 128: 1,200 cached tokens are reported as 1,152; 1,400 as 1,280.
        assert_eq!(
            openai,
            vec![
                t(1200, 0, 0),
                t(1450 - 1152, 1152, 0),
                t(1050, 0, 0),
                t(130, 1280, 0)
            ]
        );
        // A prompt under the minimum is fresh input at Anthropic too.
        let small = Tokens::from_usage(
            Provider::Anthropic,
            &usage(
                Provider::Anthropic,
                Hit {
                    total: 500,
                    shared: 400,
                },
                Breakpoint::AtEnd,
                0,
            ),
        );
        assert_eq!(
            small,
            Tokens {
                fresh: 500,
                ..Tokens::default()
            }
        );

        let mut sum = Tokens::default();
        anthropic.iter().for_each(|x| sum.add(*x));
        let dollars = PRICES[0].dollars(&sum);
        let expected = (2600.0 * 0.30 + 2510.0 * 3.75 + 28.0 * 15.0) / 1e6;
        assert!(
            (dollars - expected).abs() < 1e-12,
            "{dollars} != {expected}"
        );
    }

    #[test]
    fn a_summary_prompt_is_cached_up_to_its_first_changed_byte() {
        let mut cache = TextCache::new(Encoding::O200k);
        let stable = "instructions ".repeat(300);
        let first = cache.send(format!("{stable}transcript one"));
        assert_eq!(first.shared, 0);
        let second = cache.send(format!("{stable}transcript two, with more turns in it"));
        assert_eq!(
            second.shared,
            Encoding::O200k.count(&format!("{stable}transcript "))
        );
        assert!(second.shared < second.total);
    }
}
