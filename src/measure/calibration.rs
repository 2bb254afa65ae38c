//! Per-model correction of token counts, learned from the provider's `usage.prompt_tokens` for
//! prompts the proxy could count itself.
//!
//! Our counts use OpenAI's tokenizers. Other families tokenize differently, and a server's chat
//! template adds a fixed number of tokens to every prompt (llama-server: about 20), so a prompt
//! we count as `raw` costs about `factor × raw + overhead` ([`Correction`]). A fixed overhead
//! taken as a factor would multiply every later count (two "Say hi." requests, 9 tokens by our
//! count and 29 by the server's, would make it 3.25), so the two are learned apart.
//!
//! The correction is shared by every tenant of a model, so no one request and no one tenant can
//! move it far:
//!
//! - only prompts whose cost we count are observed (no images, documents or audio, whose cost is
//!   the provider's own and our figure a guess); the caller sees to that;
//! - each observation is clamped to what a tokenizer and a template can explain
//!   ([`FACTOR_RANGE`], [`MAX_OVERHEAD`]);
//! - a bounded window of recent observations is kept, at most [`PER_TENANT`] per tenant and
//!   [`WINDOW`] in all, each forgotten after the model facts' TTL, and a tenant adds at most one
//!   every [`SPACING_MS`] (each is a store write);
//! - each tenant's observations make one vote, a line fitted robustly (Theil–Sen: the median of
//!   the slopes between observations of clearly different sizes, then the median residual as
//!   the overhead); the correction is the median of the votes, and neutral votes stand in for
//!   absent tenants until `min_tenants` have voted, so one tenant alone cannot move it.
//!
//! It starts neutral (factor 1, no overhead): a correction is never a reason to refuse a
//! request, only to compact it sooner.

use std::collections::BTreeMap;

pub use crate::store::Observation;

/// Observations kept per tenant (its newest).
pub const PER_TENANT: usize = 4;
/// Observations kept per model.
pub const WINDOW: usize = 32;
/// Largest fixed overhead a chat template is believed to add to a prompt.
pub const MAX_OVERHEAD: u64 = 512;
/// What a chat template usually adds: the overhead assumed when prompts of one size cannot tell
/// it from a factor.
pub const USUAL_OVERHEAD: u64 = 64;
/// A tenant's observations are at least this far apart (ms), unless it has none yet.
pub const SPACING_MS: u64 = 60_000;
/// The factors a tokenizer difference can explain.
const FACTOR_RANGE: (f64, f64) = (0.5, 4.0);
/// Float error tolerated when rounding a corrected count.
const ROUNDING: f64 = 1e-6;
/// Two observations tell a factor from an overhead when one prompt is this many times the other.
const DISTINCT_SIZES: f64 = 2.0;

/// How our count of a prompt maps onto the provider's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Correction {
    pub factor: f64,
    /// Tokens the provider adds once per prompt.
    pub overhead: u64,
}

impl Correction {
    pub const NEUTRAL: Correction = Correction {
        factor: 1.0,
        overhead: 0,
    };

    /// The provider's likely count of a whole prompt we count as `raw`.
    pub fn apply(&self, raw: u64) -> u64 {
        self.scale(raw).saturating_add(self.overhead)
    }

    /// The provider's likely count of a part of a prompt (no per-prompt overhead), rounded up
    /// (and not up past a whole number that float arithmetic only just missed).
    pub fn scale(&self, raw: u64) -> u64 {
        (raw as f64 * self.factor - ROUNDING).ceil().max(0.0) as u64
    }

    /// Our count of what the provider counts as `tokens` of a part of a prompt, rounded down.
    pub fn unscale(&self, tokens: u64) -> u64 {
        (tokens as f64 / self.factor + ROUNDING).floor() as u64
    }

    /// Whether it differs from neutral.
    pub fn is_neutral(&self) -> bool {
        *self == Correction::NEUTRAL
    }
}

impl Default for Correction {
    fn default() -> Self {
        Correction::NEUTRAL
    }
}

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

/// The factors believable for `model`: counted with its own tokenizer, a lower figure from the
/// provider means it counts differently (cached prefixes, gateways), not that we over-count.
fn factor_range(exact: bool) -> (f64, f64) {
    if exact {
        (1.0, FACTOR_RANGE.1)
    } else {
        FACTOR_RANGE
    }
}

/// Adds `new` to `window` unless its tenant added one less than [`SPACING_MS`] before; drops
/// what is older than `max_age_ms` (0: nothing), the tenant's oldest beyond [`PER_TENANT`] and
/// the oldest beyond [`WINDOW`]. Whether `new` was added.
pub fn record(window: &mut Vec<Observation>, new: Observation, max_age_ms: u64) -> bool {
    forget_old(window, new.at_ms, max_age_ms);
    if new.counted == 0 || new.reported == 0 {
        return false;
    }
    let newest_of_tenant = window
        .iter()
        .filter(|o| o.tenant == new.tenant)
        .map(|o| o.at_ms)
        .max();
    if newest_of_tenant.is_some_and(|at| new.at_ms.saturating_sub(at) < SPACING_MS) {
        return false;
    }
    window.push(new);
    window.sort_by_key(|o| o.at_ms);
    let of_tenant = window.iter().filter(|o| o.tenant == new.tenant).count();
    if of_tenant > PER_TENANT {
        let oldest = window
            .iter()
            .position(|o| o.tenant == new.tenant)
            .expect("the tenant has observations");
        window.remove(oldest);
    }
    if window.len() > WINDOW {
        window.drain(..window.len() - WINDOW);
    }
    true
}

/// Drops the observations older than `max_age_ms` at `now_ms` (0: none).
pub fn forget_old(window: &mut Vec<Observation>, now_ms: u64, max_age_ms: u64) {
    if max_age_ms > 0 {
        window.retain(|o| now_ms.saturating_sub(o.at_ms) < max_age_ms);
    }
}

/// The correction the observations in `window` support: the median of one vote per tenant,
/// padded with neutral votes up to `2 × min_tenants − 1`, so that it moves only when at least
/// `min_tenants` tenants agree.
pub fn estimate(window: &[Observation], exact: bool, min_tenants: usize) -> Correction {
    let mut by_tenant: BTreeMap<u64, Vec<Observation>> = BTreeMap::new();
    for o in window {
        by_tenant.entry(o.tenant).or_default().push(*o);
    }
    let range = factor_range(exact);
    let mut votes: Vec<Correction> = by_tenant.values().map(|obs| fit(obs, range)).collect();
    let needed = (2 * min_tenants.max(1)).saturating_sub(1);
    votes.resize(votes.len().max(needed), Correction::NEUTRAL);
    let factor = median(votes.iter().map(|v| v.factor).collect()).unwrap_or(1.0);
    let overhead = median(votes.iter().map(|v| v.overhead as f64).collect()).unwrap_or(0.0);
    Correction {
        factor,
        overhead: overhead.round() as u64,
    }
}

/// One tenant's vote: of the lines through two of its observations of clearly different sizes,
/// and through each one with as much of the difference as a template usually adds taken as
/// overhead, the line that fits the most of them best (least median of relative residuals), so that
/// one odd prompt among a few ordinary ones does not move it.
fn fit(observations: &[Observation], range: (f64, f64)) -> Correction {
    let max_overhead = MAX_OVERHEAD as f64;
    // Each observation clamped to what a factor and an overhead in range can explain.
    let points: Vec<(f64, f64)> = observations
        .iter()
        .filter(|o| o.counted > 0)
        .map(|o| {
            let x = o.counted as f64;
            (
                x,
                (o.reported as f64).clamp(range.0 * x, range.1 * x + max_overhead),
            )
        })
        .collect();
    let line = |factor: f64, overhead: f64| {
        (
            factor.clamp(range.0, range.1),
            overhead.clamp(0.0, max_overhead).round(),
        )
    };
    let mut candidates = Vec::new();
    for &(x, y) in &points {
        // One prompt alone cannot tell a factor from an overhead: as much of the difference as
        // a chat template usually adds is taken as overhead (all of it for a "Say hi."), the
        // rest as a factor, which over-counts larger prompts rather than under-counting them.
        let overhead = (y - x).clamp(0.0, USUAL_OVERHEAD as f64);
        candidates.push(line((y - overhead) / x, overhead));
    }
    for (i, &(xi, yi)) in points.iter().enumerate() {
        for &(xj, yj) in &points[i + 1..] {
            let ((xs, ys), (xl, yl)) = if xi <= xj {
                ((xi, yi), (xj, yj))
            } else {
                ((xj, yj), (xi, yi))
            };
            if xl >= DISTINCT_SIZES * xs {
                let factor = ((yl - ys) / (xl - xs)).clamp(range.0, range.1);
                candidates.push(line(factor, ys - factor * xs));
            }
        }
    }
    // The residual that at least half of the observations are within.
    let rank = points.len() / 2;
    let score = |&(factor, overhead): &(f64, f64)| {
        let mut residuals: Vec<f64> = points
            .iter()
            .map(|(x, y)| (y - (factor * x + overhead)).abs() / y.max(1.0))
            .collect();
        residuals.sort_by(f64::total_cmp);
        residuals[rank]
    };
    let best = candidates.iter().min_by(|a, b| {
        score(a)
            .total_cmp(&score(b))
            // Equally good: the smaller correction (a factor nearer 1, then less overhead).
            .then((a.0 - 1.0).abs().total_cmp(&(b.0 - 1.0).abs()))
            .then(a.1.total_cmp(&b.1))
    });
    match best {
        Some(&(factor, overhead)) => Correction {
            factor,
            overhead: overhead as u64,
        },
        None => Correction::NEUTRAL,
    }
}

/// The median (the mean of the two middle values of an even count).
fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(counted: u64, reported: u64, tenant: u64, at_ms: u64) -> Observation {
        Observation {
            counted,
            reported,
            tenant,
            at_ms,
        }
    }

    #[test]
    fn starts_neutral_and_applies_factor_and_overhead() {
        assert_eq!(estimate(&[], false, 1), Correction::NEUTRAL);
        assert_eq!(estimate(&[], true, 2), Correction::NEUTRAL);
        let c = Correction {
            factor: 1.1,
            overhead: 20,
        };
        assert_eq!(c.apply(1000), 1120);
        assert_eq!(c.scale(1000), 1100);
        assert_eq!(c.unscale(1100), 1000);
    }

    #[test]
    fn a_templates_fixed_overhead_is_additive_not_a_factor() {
        // Two "Say hi." requests to llama-server: 9 tokens by our count, 29 by its own.
        let window = [seen(9, 29, 1, 0), seen(9, 29, 1, SPACING_MS)];
        let c = estimate(&window, false, 1);
        assert_eq!(c.factor, 1.0);
        assert_eq!(c.overhead, 20);
        // Qwen Code's 1,863-token first turn is then 1,883, not 6,428.
        assert_eq!(c.apply(1863), 1883);
    }

    #[test]
    fn factor_and_overhead_are_told_apart_by_prompts_of_different_sizes() {
        let window: Vec<Observation> = [100u64, 1_000, 10_000, 40_000]
            .iter()
            .enumerate()
            .map(|(i, &x)| seen(x, x * 12 / 10 + 30, 1, i as u64 * SPACING_MS))
            .collect();
        let c = estimate(&window, false, 1);
        assert!((c.factor - 1.2).abs() < 1e-9, "{c:?}");
        assert_eq!(c.overhead, 30);
    }

    #[test]
    fn one_outlier_among_a_tenants_observations_does_not_move_its_vote() {
        // 150 KB of spaces: we count 1,180, the provider 25,002.
        let mut window: Vec<Observation> = (0..3)
            .map(|i| seen(2_000 * (i + 1), 2_200 * (i + 1), 1, i * SPACING_MS))
            .collect();
        window.push(seen(1_180, 25_002, 1, 3 * SPACING_MS));
        let c = estimate(&window, false, 1);
        assert!((c.factor - 1.1).abs() < 0.05, "{c:?}");
    }

    #[test]
    fn one_tenant_alone_cannot_move_a_shared_correction() {
        let attacker: Vec<Observation> = (0..PER_TENANT as u64)
            .map(|i| seen(1_180 * (i + 1), 25_002 * (i + 1), 7, i * SPACING_MS))
            .collect();
        assert_eq!(estimate(&attacker, false, 2), Correction::NEUTRAL);
        // With one honest tenant beside it, the honest vote is the median.
        let mut both = attacker.clone();
        both.extend((0..3).map(|i| seen(5_000 * (i + 1), 5_500 * (i + 1), 8, i * SPACING_MS)));
        let c = estimate(&both, false, 2);
        assert!((c.factor - 1.1).abs() < 0.01, "{c:?}");
        // Two tenants that agree move it.
        let agreeing: Vec<Observation> = (0..2)
            .flat_map(|t| (1..3).map(move |i| seen(4_000 * i, 4_800 * i, t, i * SPACING_MS)))
            .collect();
        assert!((estimate(&agreeing, false, 2).factor - 1.2).abs() < 0.01);
    }

    #[test]
    fn each_observation_is_clamped_to_what_a_tokenizer_can_explain() {
        let c = estimate(&[seen(1_000, 1_000_000, 1, 0)], false, 1);
        assert!(
            c.factor <= FACTOR_RANGE.1 && c.overhead <= MAX_OVERHEAD,
            "{c:?}"
        );
        let c = estimate(&[seen(1_000, 1, 1, 0)], false, 1);
        assert_eq!(c.factor, FACTOR_RANGE.0);
        // An exact tokenizer is never corrected below its own count.
        assert_eq!(estimate(&[seen(1_000, 600, 1, 0)], true, 1).factor, 1.0);
    }

    #[test]
    fn the_window_is_bounded_per_tenant_and_in_all_spaced_and_ages() {
        let mut window = Vec::new();
        assert!(record(&mut window, seen(10, 12, 1, 0), 0));
        // Too soon after the tenant's last one.
        assert!(!record(&mut window, seen(10, 12, 1, SPACING_MS - 1), 0));
        for i in 1..10 {
            assert!(record(&mut window, seen(10, 12, 1, i * SPACING_MS), 0));
        }
        assert_eq!(window.len(), PER_TENANT);
        assert_eq!(
            window[0].at_ms,
            6 * SPACING_MS,
            "the tenant's newest are kept"
        );
        for t in 2..100 {
            record(&mut window, seen(10, 12, t, 10 * SPACING_MS + t), 0);
        }
        assert_eq!(window.len(), WINDOW);
        // Observations older than the age limit are forgotten.
        let now = 20 * SPACING_MS;
        record(&mut window, seen(10, 12, 500, now), 5 * SPACING_MS);
        assert_eq!(window.len(), 1);
    }
}
