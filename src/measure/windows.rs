//! Context windows by model: a built-in table for the common families, overridden by config,
//! overridden in turn by what providers' overflow errors taught us.

use std::collections::BTreeMap;

/// Built-in windows, matched as substrings of the lowercased model name; the longest match wins.
/// Figures are the providers' published context lengths.
const BUILT_IN: &[(&str, u64)] = &[
    // OpenAI
    ("gpt-5", 400_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4-1106", 128_000),
    ("gpt-4-0125", 128_000),
    ("gpt-4-32k", 32_768),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    ("codex", 400_000),
    // Anthropic
    ("claude", 200_000),
    // Google
    ("gemini-1.5-pro", 2_097_152),
    ("gemini", 1_048_576),
    ("gemma", 8_192),
    ("gemma-3", 131_072),
    // Meta
    ("llama-3.1", 131_072),
    ("llama-3.2", 131_072),
    ("llama-3.3", 131_072),
    ("llama-4", 1_048_576),
    ("llama3", 8_192),
    ("llama-3", 8_192),
    // Alibaba
    ("qwen", 32_768),
    ("qwen2.5", 32_768),
    ("qwen3", 131_072),
    ("qwen3-coder", 262_144),
    // Mistral
    ("mistral", 32_768),
    ("mistral-large", 131_072),
    ("mistral-small", 131_072),
    ("codestral", 262_144),
    ("devstral", 131_072),
    // DeepSeek
    ("deepseek", 131_072),
    // xAI
    ("grok", 131_072),
    ("grok-4", 256_000),
];

/// Looks up windows: learned > configured > built-in > default.
#[derive(Debug, Clone)]
pub struct WindowTable {
    configured: BTreeMap<String, u64>,
    default: u64,
}

/// Where a window figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowSource {
    Learned,
    Configured,
    BuiltIn,
    Default,
}

impl WindowTable {
    pub fn new(configured: &BTreeMap<String, u64>, default: u64) -> WindowTable {
        WindowTable {
            configured: configured
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), *v))
                .collect(),
            default,
        }
    }

    /// The window for `model`, given what was learned for it (if anything).
    pub fn window(&self, model: &str, learned: Option<u64>) -> (u64, WindowSource) {
        if let Some(w) = learned {
            return (w, WindowSource::Learned);
        }
        let m = model.to_ascii_lowercase();
        let configured = self
            .configured
            .iter()
            .filter(|(k, _)| m.contains(k.as_str()))
            .max_by_key(|(k, _)| k.len());
        if let Some((_, w)) = configured {
            return (*w, WindowSource::Configured);
        }
        match BUILT_IN
            .iter()
            .filter(|(k, _)| m.contains(k))
            .max_by_key(|(k, _)| k.len())
        {
            Some((_, w)) => (*w, WindowSource::BuiltIn),
            None => (self.default, WindowSource::Default),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_longest_match() {
        let mut cfg = BTreeMap::new();
        cfg.insert("Qwen2.5-Coder".to_string(), 4096);
        let t = WindowTable::new(&cfg, 100_000);
        assert_eq!(
            t.window("gpt-4o-mini", None),
            (128_000, WindowSource::BuiltIn)
        );
        assert_eq!(t.window("gpt-4", None).0, 8_192);
        assert_eq!(t.window("openai/gpt-4.1-mini", None).0, 1_047_576);
        assert_eq!(t.window("claude-sonnet-4-5", None).0, 200_000);
        assert_eq!(
            t.window("qwen2.5-coder-0.5b-instruct", None),
            (4096, WindowSource::Configured)
        );
        assert_eq!(
            t.window("qwen2.5-coder-0.5b-instruct", Some(2048)),
            (2048, WindowSource::Learned)
        );
        assert_eq!(t.window("my-model", None), (100_000, WindowSource::Default));
    }
}
