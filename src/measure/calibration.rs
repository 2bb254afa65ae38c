//! Per-model correction of token counts, learned from the provider's `usage.prompt_tokens`.
//!
//! OpenAI models are counted exactly, so their factor starts at 1. Other families use other
//! tokenizers; their factor starts above 1 (over-counting is safe, under-counting overflows) and
//! moves toward the observed ratio, always keeping a small safety margin above it.

/// Starting factor for models whose tokenizer we do not have.
pub const UNKNOWN_FAMILY_START: f64 = 1.25;
/// Headroom kept above the observed ratio.
const SAFETY: f64 = 1.03;
/// Weight of a new observation.
const LEARNING_RATE: f64 = 0.5;

/// Whether `model` is counted with its own tokenizer.
pub fn is_exact_family(model: &str) -> bool {
    let m = model.to_ascii_lowercase();
    let m = m.rsplit('/').next().unwrap_or(&m);
    m.starts_with("gpt-")
        || m.starts_with("chatgpt")
        || m.starts_with("o1")
        || m.starts_with("o3")
        || m.starts_with("o4")
        || m.starts_with("codex")
}

/// The factor to use before anything was observed.
pub fn initial_factor(model: &str) -> f64 {
    if is_exact_family(model) {
        1.0
    } else {
        UNKNOWN_FAMILY_START
    }
}

/// The factor after observing that `counted` tokens were billed as `actual`.
pub fn update(previous: f64, counted: u64, actual: u64) -> f64 {
    if counted == 0 || actual == 0 {
        return previous;
    }
    let target = (actual as f64 / counted as f64) * SAFETY;
    let next = previous + (target - previous) * LEARNING_RATE;
    // Never below the observed ratio itself, and within sane bounds.
    next.max(actual as f64 / counted as f64).clamp(0.5, 4.0)
}

/// Applies a factor to a raw count, rounding up.
pub fn apply(count: u64, factor: f64) -> u64 {
    (count as f64 * factor).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_from_above() {
        let mut f = initial_factor("qwen2.5-coder");
        assert!(f > 1.0);
        assert_eq!(initial_factor("gpt-4o"), 1.0);
        for _ in 0..20 {
            f = update(f, 1000, 1100);
            assert!(f >= 1.1);
        }
        assert!((f - 1.1 * SAFETY).abs() < 0.01, "{f}");
        assert_eq!(apply(1000, 1.1), 1100);
    }
}
