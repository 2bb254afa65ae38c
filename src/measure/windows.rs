//! Context windows by model: a built-in table for the common families, overridden by config,
//! overridden in turn by what providers' overflow errors taught us.
//!
//! An overflow error that states the window teaches it outright. One that states none only
//! says that the prompt sent did not fit: an upper bound ([`WindowBound`]), learned only from a
//! prompt the proxy could count (no guessed media) and kept per tenant. It applies at once to the
//! tenant whose request overflowed, and to everyone else only once `min_tenants` tenants have
//! each met one ([`bound_for`]); it is forgotten after its own, shorter age, or as soon as the
//! provider accepts a larger prompt.

use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::store::WindowBound;

/// Window bounds kept per model (the newest, one per tenant).
pub const BOUNDS: usize = 16;

/// Records `new` in `bounds`: the tenant's bound becomes the lower of its old one and `new`;
/// bounds older than `max_age_ms` (0: none) and the oldest beyond [`BOUNDS`] are dropped.
pub fn record_bound(bounds: &mut Vec<WindowBound>, new: WindowBound, max_age_ms: u64) {
    forget_old_bounds(bounds, new.at_ms, max_age_ms);
    let tokens = bounds
        .iter()
        .filter(|b| b.tenant == new.tenant)
        .map(|b| b.tokens)
        .fold(new.tokens, u64::min);
    bounds.retain(|b| b.tenant != new.tenant);
    bounds.push(WindowBound { tokens, ..new });
    bounds.sort_by_key(|b| b.at_ms);
    if bounds.len() > BOUNDS {
        bounds.drain(..bounds.len() - BOUNDS);
    }
}

/// Drops the bounds older than `max_age_ms` at `now_ms` (0: none).
pub fn forget_old_bounds(bounds: &mut Vec<WindowBound>, now_ms: u64, max_age_ms: u64) {
    if max_age_ms > 0 {
        bounds.retain(|b| now_ms.saturating_sub(b.at_ms) < max_age_ms);
    }
}

/// The bound that applies to a request of `tenant` (`None`: of nobody in particular) at
/// `now_ms`: the tenant's own, or the `min_tenants`-th lowest of all (a figure at least that
/// many tenants have each seen refused), whichever is lower.
pub fn bound_for(
    bounds: &[WindowBound],
    tenant: Option<u64>,
    min_tenants: usize,
    now_ms: u64,
    max_age_ms: u64,
) -> Option<u64> {
    let alive = |b: &&WindowBound| max_age_ms == 0 || now_ms.saturating_sub(b.at_ms) < max_age_ms;
    let own = bounds
        .iter()
        .filter(alive)
        .filter(|b| Some(b.tenant) == tenant)
        .map(|b| b.tokens)
        .min();
    let mut all: Vec<u64> = bounds.iter().filter(alive).map(|b| b.tokens).collect();
    all.sort_unstable();
    let shared = all.get(min_tenants.max(1) - 1).copied();
    own.into_iter().chain(shared).min()
}

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
    /// The table's answer by model name as sent. Each lookup reads every entry of both tables,
    /// which costs a small request about 2 % of its instructions; the tables never change once
    /// built, and a deployment sees a few models.
    answers: Arc<quick_cache::sync::Cache<String, (u64, WindowSource)>>,
}

/// Model names whose table answer is kept.
const ANSWERS_KEPT: usize = 256;

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
            answers: Arc::new(quick_cache::sync::Cache::new(ANSWERS_KEPT)),
        }
    }

    /// The window for `model`, given what was learned for it (if anything).
    pub fn window(&self, model: &str, learned: Option<u64>) -> (u64, WindowSource) {
        if let Some(w) = learned {
            return (w, WindowSource::Learned);
        }
        if let Some(answer) = self.answers.get(model) {
            return answer;
        }
        let answer = self.look_up(model);
        self.answers.insert(model.to_string(), answer);
        answer
    }

    /// The configured or built-in window for `model`: the longest name it contains.
    fn look_up(&self, model: &str) -> (u64, WindowSource) {
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

    #[test]
    fn a_remembered_answer_is_the_first_one_and_learning_still_overrides_it() {
        let mut cfg = BTreeMap::new();
        cfg.insert("local".to_string(), 4096);
        let t = WindowTable::new(&cfg, 100_000);
        let names = ["gpt-4o", "GPT-4o", "my-local-model", "unknown"];
        let first: Vec<_> = names.iter().map(|m| t.window(m, None)).collect();
        assert_eq!(first[0], (128_000, WindowSource::BuiltIn));
        assert_eq!(first[1], first[0]);
        assert_eq!(first[2], (4096, WindowSource::Configured));
        assert_eq!(first[3], (100_000, WindowSource::Default));
        // A clone shares what the first one remembered.
        let again = t.clone();
        for (name, want) in names.iter().zip(&first) {
            assert_eq!(again.window(name, None), *want);
            assert_eq!(
                again.window(name, Some(1000)),
                (1000, WindowSource::Learned)
            );
        }
        // More names than are kept: each still gets its own answer.
        for n in 0..2 * ANSWERS_KEPT {
            assert_eq!(t.window(&format!("gpt-4o-{n}"), None).0, 128_000);
            assert_eq!(t.window(&format!("custom-{n}"), None).0, 100_000);
        }
    }

    fn bound(tenant: u64, tokens: u64, at_ms: u64) -> WindowBound {
        WindowBound {
            tenant,
            tokens,
            at_ms,
        }
    }

    #[test]
    fn one_tenants_bound_applies_to_it_alone_until_others_meet_one() {
        let mut bounds = Vec::new();
        record_bound(&mut bounds, bound(1, 256, 0), 0);
        assert_eq!(bound_for(&bounds, Some(1), 2, 0, 0), Some(256));
        assert_eq!(bound_for(&bounds, Some(2), 2, 0, 0), None);
        assert_eq!(bound_for(&bounds, None, 2, 0, 0), None);
        // With one tenant enough, it is everyone's.
        assert_eq!(bound_for(&bounds, Some(2), 1, 0, 0), Some(256));
        // A second tenant's overflow: the higher of the two is what both have seen refused.
        record_bound(&mut bounds, bound(2, 7_000, 1), 0);
        assert_eq!(bound_for(&bounds, Some(3), 2, 1, 0), Some(7_000));
        assert_eq!(bound_for(&bounds, Some(1), 2, 1, 0), Some(256));
        // A tenant keeps its lowest bound; many tenants are kept to a bounded list.
        record_bound(&mut bounds, bound(1, 9_000, 2), 0);
        assert_eq!(bound_for(&bounds, Some(1), 2, 2, 0), Some(256));
        for t in 10..100 {
            record_bound(&mut bounds, bound(t, 5_000 + t, 3 + t), 0);
        }
        assert_eq!(bounds.len(), BOUNDS);
    }

    #[test]
    fn bounds_age() {
        let mut bounds = Vec::new();
        record_bound(&mut bounds, bound(1, 256, 1_000), 10_000);
        assert_eq!(bound_for(&bounds, Some(1), 1, 10_999, 10_000), Some(256));
        assert_eq!(bound_for(&bounds, Some(1), 1, 11_000, 10_000), None);
        record_bound(&mut bounds, bound(2, 4_000, 20_000), 10_000);
        assert_eq!(bounds, [bound(2, 4_000, 20_000)]);
    }
}
