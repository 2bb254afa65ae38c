//! What responses teach: the model's real window from overflow errors, and a correction factor
//! for token counts from the provider's `usage`. Learned facts are cached here and read through
//! to the (possibly shared) store.
//!
//! A learned window is shared by every tenant of the model, so it is learned only from what the
//! provider itself says: a [trusted](Overflow::trusted) overflow whose figures agree with ours
//! and with what the provider accepted before. It never only shrinks: a larger prompt that the
//! provider accepts raises it, and it is forgotten after `model_facts_ttl_secs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dialect::Overflow;
use crate::measure::calibration;
use crate::store::{now_ms, ModelFacts};

use super::Engine;

/// How long learned model facts are trusted before re-reading the (possibly shared) store.
const FACTS_REFRESH: Duration = Duration::from_secs(15);
/// How far the provider's count of a prompt may be from ours (either way) and still be believed:
/// beyond the widest correction factor, the figure is not about what we sent.
const MAX_COUNT_RATIO: f64 = 4.0;
/// A larger accepted prompt is recorded once it exceeds the recorded one by 1/this.
const ACCEPTED_STEP: u64 = 10;

impl Engine {
    fn facts_ttl(&self) -> Duration {
        Duration::from_secs(self.config.model_facts_ttl_secs)
    }

    /// Learned facts for `model`, from the local cache or the store, without what has expired.
    pub(super) async fn model_facts(&self, model: &str) -> (ModelFacts, bool) {
        let (facts, degraded) = self.cached_or_stored_facts(model).await;
        (facts.current(now_ms(), self.facts_ttl()), degraded)
    }

    async fn cached_or_stored_facts(&self, model: &str) -> (ModelFacts, bool) {
        if let Some(entry) = self.facts.get(model) {
            if entry.1.elapsed() < FACTS_REFRESH {
                return (entry.0, false);
            }
        }
        match self.store.model_facts(model).await {
            Ok(facts) => {
                self.facts
                    .insert(model.to_string(), (facts, Instant::now()));
                (facts, false)
            }
            Err(e) => {
                self.metrics.store_errors.inc();
                tracing::warn!(error = %e, "Reading model facts failed.");
                let cached = self.facts.get(model).map(|e| e.0).unwrap_or_default();
                (cached, true)
            }
        }
    }

    /// Models whose facts are in memory now (at most `model_facts_cache_size`).
    pub fn cached_models(&self) -> usize {
        self.facts.len()
    }

    async fn save_facts(&self, model: &str, mut facts: ModelFacts) {
        let ttl = self.facts_ttl();
        facts.expires_ms = (!ttl.is_zero())
            .then(|| now_ms().saturating_add(ttl.as_millis().min(u64::MAX as u128) as u64));
        self.facts
            .insert(model.to_string(), (facts, Instant::now()));
        if let Err(e) = self.store.put_model_facts(model, facts).await {
            self.metrics.store_errors.inc();
            tracing::warn!(error = %e, "Saving model facts failed.");
        }
    }

    /// The window the proxy currently believes for `model`.
    pub async fn window_for(&self, model: &str) -> u64 {
        let (facts, _) = self.model_facts(model).await;
        self.windows.window(model, facts.window).0
    }

    /// Records an overflow error: the real window if stated, and a higher correction factor if
    /// the provider counted more tokens than we did. Nothing is learned from an overflow that is
    /// not the provider's own or whose figures contradict what we know.
    pub async fn learn_overflow(&self, model: &str, overflow: Overflow, sent_raw_tokens: u64) {
        let (mut facts, _) = self.model_facts(model).await;
        if let Some(doubt) = doubt(&overflow, &facts, sent_raw_tokens) {
            tracing::info!(
                reason = doubt,
                "Not learning a window from an overflow error."
            );
            return;
        }
        let (believed, _) = self.windows.window(model, facts.window);
        let factor = facts
            .calibration
            .unwrap_or_else(|| calibration::initial_factor(model));
        let window = match overflow.limit {
            Some(limit) => limit,
            // No number given: what we sent was too much, so the window is below it (and at
            // least what the provider accepted before).
            None => believed
                .min(calibration::apply(sent_raw_tokens, factor) * 9 / 10)
                .max(facts.accepted_prompt.unwrap_or(0))
                .max(256),
        };
        facts.window = Some(window);
        facts.window_learned_ms = Some(now_ms());
        if let Some(requested) = overflow.requested.filter(|_| sent_raw_tokens > 0) {
            let observed = requested as f64 / sent_raw_tokens as f64;
            if observed > factor {
                facts.calibration = Some(
                    calibration::update(factor, sent_raw_tokens, requested).max(observed * 1.05),
                );
            }
        }
        tracing::info!(window, "Learned the model's window from an overflow error.");
        self.save_facts(model, facts).await;
    }

    /// Records the provider's count of a prompt we counted as `counted_raw`, which it accepted.
    /// Runs on the response path, so the common case (facts cached, nothing new) does no I/O
    /// and spawns nothing; changed facts are saved in the background.
    pub fn observe_usage(self: &Arc<Self>, model: &str, counted_raw: u64, prompt_tokens: u64) {
        let cached = self.facts.get(model).map(|entry| entry.0);
        let Some(stored) = cached else {
            // Not cached yet (the first response of a model): read through the store first.
            let engine = self.clone();
            let model = model.to_string();
            tokio::spawn(async move {
                engine.model_facts(&model).await;
                if engine.facts.contains_key(&model) {
                    engine.observe_usage(&model, counted_raw, prompt_tokens);
                }
            });
            return;
        };
        let now = now_ms();
        let mut facts = stored.current(now, self.facts_ttl());
        let mut changed = self.recalibrate(model, &mut facts, counted_raw, prompt_tokens);
        // Recorded in steps, not on every turn of a growing conversation (each is a write).
        if facts
            .accepted_prompt
            .is_none_or(|a| prompt_tokens > a + a / ACCEPTED_STEP)
        {
            facts.accepted_prompt = Some(prompt_tokens);
            facts.accepted_ms = Some(now);
            changed = true;
        }
        if let Some(window) = facts.window.filter(|w| prompt_tokens > *w) {
            // The provider took more than the learned window: that window was wrong. The table's
            // figure stands again if it holds this prompt; otherwise the prompt is the best bound.
            let table = self.windows.window(model, None).0;
            facts.window = (table < prompt_tokens).then_some(prompt_tokens);
            facts.window_learned_ms = facts.window.map(|_| now);
            tracing::info!(
                learned = window,
                accepted = prompt_tokens,
                "Raised a learned window: the provider accepted a larger prompt."
            );
        }
        if !changed && facts == stored {
            return;
        }
        self.facts
            .insert(model.to_string(), (facts, Instant::now()));
        let engine = self.clone();
        let model = model.to_string();
        tokio::spawn(async move { engine.save_facts(&model, facts).await });
    }

    /// Moves the correction factor toward the provider's count; whether it changed noticeably.
    fn recalibrate(
        &self,
        model: &str,
        facts: &mut ModelFacts,
        counted_raw: u64,
        prompt_tokens: u64,
    ) -> bool {
        let previous = facts
            .calibration
            .unwrap_or_else(|| calibration::initial_factor(model));
        let mut next = calibration::update(previous, counted_raw, prompt_tokens);
        if calibration::is_exact_family(model) {
            // Counted with the model's own tokenizer: a lower figure from the provider means
            // it counts differently (cached prefixes, gateways), not that we over-count.
            next = next.max(1.0);
        }
        if (next - previous).abs() <= 0.005 {
            return false;
        }
        facts.calibration = Some(next);
        true
    }
}

/// Why an overflow's figures are not to be learned, if they are not.
fn doubt(overflow: &Overflow, facts: &ModelFacts, sent_raw_tokens: u64) -> Option<&'static str> {
    if !overflow.trusted {
        return Some("not-the-providers-overflow-error");
    }
    if let (Some(requested), true) = (overflow.requested, sent_raw_tokens > 0) {
        let ratio = requested as f64 / sent_raw_tokens as f64;
        if !(1.0 / MAX_COUNT_RATIO..=MAX_COUNT_RATIO).contains(&ratio) {
            return Some("stated-prompt-size-contradicts-our-count");
        }
    }
    if let (Some(limit), Some(accepted)) = (overflow.limit, facts.accepted_prompt) {
        if limit < accepted {
            return Some("stated-window-below-an-accepted-prompt");
        }
    }
    None
}
