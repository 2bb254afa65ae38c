//! What responses teach: the model's real window from overflow errors, and a correction factor
//! for token counts from the provider's `usage`. Learned facts are cached here and read through
//! to the (possibly shared) store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::measure::calibration;
use crate::measure::overflow::Overflow;
use crate::store::ModelFacts;

use super::Engine;

/// How long learned model facts are trusted before re-reading the (possibly shared) store.
const FACTS_REFRESH: Duration = Duration::from_secs(15);

impl Engine {
    /// Learned facts for `model`, from the local cache or the store.
    pub(super) async fn model_facts(&self, model: &str) -> (ModelFacts, bool) {
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

    async fn save_facts(&self, model: &str, facts: ModelFacts) {
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
    /// the provider counted more tokens than we did.
    pub async fn learn_overflow(&self, model: &str, overflow: Overflow, sent_raw_tokens: u64) {
        let (mut facts, _) = self.model_facts(model).await;
        let (believed, _) = self.windows.window(model, facts.window);
        let factor = facts
            .calibration
            .unwrap_or_else(|| calibration::initial_factor(model));
        facts.window = Some(match overflow.limit {
            Some(limit) => limit,
            // No number given: what we sent was too much, so the window is below it.
            None => believed
                .min(calibration::apply(sent_raw_tokens, factor) * 9 / 10)
                .max(256),
        });
        if let Some(requested) = overflow.requested.filter(|_| sent_raw_tokens > 0) {
            let observed = requested as f64 / sent_raw_tokens as f64;
            if observed > factor {
                facts.calibration = Some(
                    calibration::update(factor, sent_raw_tokens, requested).max(observed * 1.05),
                );
            }
        }
        tracing::info!(
            model,
            window = facts.window,
            "Learned the model's window from an overflow error."
        );
        self.save_facts(model, facts).await;
    }

    /// Records the provider's count of a prompt we counted as `counted_raw`. Runs on the
    /// response path, so the common case (facts cached, factor unchanged) does no I/O and spawns
    /// nothing; a changed factor is saved in the background.
    pub fn observe_usage(self: &Arc<Self>, model: &str, counted_raw: u64, prompt_tokens: u64) {
        let cached = self.facts.get(model).map(|entry| entry.0);
        let Some(mut facts) = cached else {
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
            return;
        }
        facts.calibration = Some(next);
        self.facts
            .insert(model.to_string(), (facts, Instant::now()));
        let engine = self.clone();
        let model = model.to_string();
        tokio::spawn(async move { engine.save_facts(&model, facts).await });
    }
}
