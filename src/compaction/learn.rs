//! What responses teach: the model's real window from overflow errors, and the correction of
//! token counts from the provider's `usage`. Learned facts are cached here and read through to
//! the (possibly shared) store.
//!
//! A learned window is shared by every tenant of the model, so it is learned only from what the
//! provider itself says: a [trusted](Overflow::trusted) overflow whose figures agree with ours
//! and with what the provider accepted before. It never only shrinks: a larger prompt that the
//! provider accepts raises it, and it is forgotten after `model_facts_ttl_secs`. Nothing is
//! learned from an overflow of a prompt whose media cost is a guess (an image behind a URL, a
//! document: [`crate::dialect::media`]). An overflow that states no window teaches only an
//! upper bound: the provider's likely count of the prompt plus the output budget asked for. It
//! is kept per tenant and
//! shared only once `learning_min_tenants` tenants have met one ([`windows::bound_for`]), ages
//! after `window_bound_ttl_secs`, and gives way to any larger prompt the provider accepts.
//!
//! The correction is shared too, so it is learned only from prompts we counted (no guessed
//! media), from a bounded window of observations in which each tenant has one vote
//! ([`calibration`]). An
//! overflow's own count of the prompt does not feed it: providers may count the output budget
//! in it ("you requested N tokens (P in the messages, C in the completion)").

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dialect::Overflow;
use crate::identity::Hash;
use crate::measure::calibration::{self, Correction, Observation};
use crate::measure::windows::{self, WindowBound};
use crate::store::{now_ms, ModelFacts};

use super::Engine;

/// Our count of what was sent upstream, and what decides whether its answer may teach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SentCount {
    /// Raw (uncorrected) tokens of what was sent.
    pub raw: u64,
    /// Whose request it was ([`tenant_tag`]).
    pub tenant: u64,
    /// Whether all of it was counted: no media whose cost we could only guess (see
    /// [`crate::dialect::media`]).
    pub countable: bool,
    /// The output budget the client asked for (0: none), which a provider may count against
    /// the window with the prompt.
    pub output_budget: u64,
}

/// A tenant as the learned facts name it: a tag derived from the tenant's hash, never the hash
/// itself, only ever compared for equality.
pub fn tenant_tag(tenant: &Hash) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"compactor learned facts tenant");
    hasher.update(tenant);
    let bytes = hasher.finalize();
    u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// A model's facts as the cache holds them: as stored, and their live view (what has not
/// expired) with the correction it supports, worked out once and reused by every request until
/// a part of it expires.
pub(super) struct CachedFacts {
    stored: ModelFacts,
    live: Arc<LiveFacts>,
    /// When the first part of `live` expires (ms since the Unix epoch; `u64::MAX`: never).
    live_until_ms: u64,
}

/// What a request is planned with: the facts not expired, and the correction they support.
#[derive(Debug)]
pub struct LiveFacts {
    pub facts: ModelFacts,
    pub correction: Correction,
}

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

    /// How long a window bound from an overflow that stated no window is believed (ms; 0:
    /// forever).
    fn bound_ttl_ms(&self) -> u64 {
        let secs = match self.config.window_bound_ttl_secs {
            0 => self.config.model_facts_ttl_secs,
            secs => secs,
        };
        secs.saturating_mul(1000)
    }

    /// The window to plan a request of `tenant` (`None`: of nobody in particular) with: the
    /// learned or known one, or lower where overflows that stated none bound it.
    pub(super) fn window_of(&self, model: &str, facts: &ModelFacts, tenant: Option<u64>) -> u64 {
        let (window, _) = self.windows.window(model, facts.window);
        let bound = windows::bound_for(
            &facts.window_bounds,
            tenant,
            self.config.learning_min_tenants,
            now_ms(),
            self.bound_ttl_ms(),
        );
        bound.map_or(window, |b| window.min(b))
    }

    /// Learned facts for `model`, from the local cache or the store, without what has expired,
    /// and the correction they support.
    pub(super) async fn model_facts(&self, model: &str) -> (Arc<LiveFacts>, bool) {
        let now = now_ms();
        if let Some((cached, read_at)) = self.facts.get(model) {
            if read_at.elapsed() < FACTS_REFRESH {
                if now < cached.live_until_ms {
                    return (cached.live.clone(), false);
                }
                // A part of the live view expired: worked out again, kept until the next does.
                let entry = self.cache_entry(model, cached.stored.clone());
                let live = entry.live.clone();
                self.facts.insert(model.to_string(), (entry, read_at));
                return (live, false);
            }
        }
        match self.store.model_facts(model).await {
            Ok(facts) => {
                self.show_facts(model, &facts);
                let entry = self.cache_entry(model, facts);
                let live = entry.live.clone();
                self.facts
                    .insert(model.to_string(), (entry, Instant::now()));
                (live, false)
            }
            Err(e) => {
                self.metrics.store_errors.inc();
                tracing::warn!(error = %e, "Reading model facts failed.");
                let cached = self
                    .facts
                    .get(model)
                    .map(|(entry, _)| entry.stored.clone())
                    .unwrap_or_default();
                (self.cache_entry(model, cached).live.clone(), true)
            }
        }
    }

    /// The cache's entry for `stored`: its live view and correction, worked out now.
    fn cache_entry(&self, model: &str, stored: ModelFacts) -> Arc<CachedFacts> {
        let ttl = self.facts_ttl();
        let facts = stored.clone().current(now_ms(), ttl);
        let live_until_ms = if ttl.is_zero() {
            u64::MAX
        } else {
            let ttl_ms = ttl.as_millis().min(u64::MAX as u128) as u64;
            facts
                .window_learned_ms
                .into_iter()
                .chain(facts.accepted_ms)
                .chain(facts.observations.iter().map(|o| o.at_ms))
                .map(|at| at.saturating_add(ttl_ms))
                .min()
                .unwrap_or(u64::MAX)
        };
        let correction = self.correction(model, &facts);
        Arc::new(CachedFacts {
            stored,
            live: Arc::new(LiveFacts { facts, correction }),
            live_until_ms,
        })
    }

    /// Models whose facts are in memory now (at most `model_facts_cache_size`).
    pub fn cached_models(&self) -> usize {
        self.facts.len()
    }

    async fn save_facts(&self, model: &str, mut facts: ModelFacts) {
        let ttl = self.facts_ttl();
        facts.expires_ms = (!ttl.is_zero())
            .then(|| now_ms().saturating_add(ttl.as_millis().min(u64::MAX as u128) as u64));
        self.facts.insert(
            model.to_string(),
            (self.cache_entry(model, facts.clone()), Instant::now()),
        );
        self.show_facts(model, &facts);
        if let Err(e) = self.store.put_model_facts(model, facts).await {
            self.metrics.store_errors.inc();
            tracing::warn!(error = %e, "Saving model facts failed.");
        }
    }

    /// The window the proxy currently believes for `model`, for every tenant.
    pub async fn window_for(&self, model: &str) -> u64 {
        let (live, _) = self.model_facts(model).await;
        self.window_of(model, &live.facts, None)
    }

    /// The window the proxy currently believes for `model` for requests of `tenant`.
    pub async fn window_for_tenant(&self, model: &str, tenant: &Hash) -> u64 {
        let (live, _) = self.model_facts(model).await;
        self.window_of(model, &live.facts, Some(tenant_tag(tenant)))
    }

    /// The correction of our counts for `model` that `facts` support.
    pub(super) fn correction(&self, model: &str, facts: &ModelFacts) -> Correction {
        calibration::estimate(
            &facts.observations,
            calibration::is_exact_family(model),
            self.config.learning_min_tenants,
        )
    }

    /// The correction of our counts the proxy currently applies for `model`.
    pub async fn correction_for(&self, model: &str) -> Correction {
        self.model_facts(model).await.0.correction
    }

    /// Shows `model`'s live correction and window in the metrics (for a bounded set of models).
    fn show_facts(&self, model: &str, facts: &ModelFacts) {
        let facts = facts.clone().current(now_ms(), self.facts_ttl());
        let Some(label) = self.metrics.model_label(model) else {
            return;
        };
        let correction = self.correction(model, &facts);
        self.metrics.show_model(
            &label,
            (correction.factor, correction.overhead),
            self.window_of(model, &facts, None),
            facts.observations.len(),
        );
    }

    /// Records an overflow error: the real window if stated, or a bound below what was sent
    /// if not. Nothing is learned from an overflow that is not the provider's own or whose
    /// figures contradict what we know, nor from a prompt whose media cost we only guessed:
    /// our count of it can neither bound the window nor check the figures the provider states.
    pub async fn learn_overflow(&self, model: &str, overflow: Overflow, sent: SentCount) {
        if !sent.countable {
            tracing::info!(
                reason = "media-cost-guessed",
                "Not learning a window from an overflow error."
            );
            return;
        }
        let mut facts = self.model_facts(model).await.0.facts.clone();
        if let Some(doubt) = doubt(&overflow, &facts, sent.raw) {
            tracing::info!(
                reason = doubt,
                "Not learning a window from an overflow error."
            );
            return;
        }
        let now = now_ms();
        match overflow.limit {
            Some(limit) => {
                facts.window = Some(limit);
                facts.window_learned_ms = Some(now);
                tracing::info!(
                    window = limit,
                    "Learned the model's window from an overflow error."
                );
            }
            None if sent.raw == 0 => {
                tracing::info!(
                    reason = "prompt-not-counted",
                    "Not learning a window bound from an overflow error that states no window."
                );
                return;
            }
            None => {
                // What was sent (with the budget the provider may count with it) did not fit:
                // the window is below that, and at least what the provider accepted before.
                let tokens = self
                    .correction(model, &facts)
                    .apply(sent.raw)
                    .saturating_add(sent.output_budget)
                    .max(facts.accepted_prompt.unwrap_or(0).saturating_add(1))
                    .max(256);
                if tokens >= self.window_of(model, &facts, Some(sent.tenant)) {
                    return;
                }
                windows::record_bound(
                    &mut facts.window_bounds,
                    WindowBound {
                        tenant: sent.tenant,
                        tokens,
                        at_ms: now,
                    },
                    self.bound_ttl_ms(),
                );
                tracing::info!(
                    bound = tokens,
                    "Learned a bound on the model's window from an overflow error."
                );
            }
        }
        self.save_facts(model, facts).await;
    }

    /// Records the provider's count of a prompt it accepted, which we counted as `sent`.
    /// Runs on the response path, so the common case (facts cached, nothing new) does no I/O
    /// and spawns nothing; changed facts are saved in the background.
    pub fn observe_usage(self: &Arc<Self>, model: &str, sent: SentCount, prompt_tokens: u64) {
        let cached = self.facts.get(model).map(|(entry, _)| entry);
        let Some(cached) = cached else {
            // Not cached yet (the first response of a model): read through the store first.
            let engine = self.clone();
            let model = model.to_string();
            tokio::spawn(async move {
                engine.model_facts(&model).await;
                if engine.facts.contains_key(&model) {
                    engine.observe_usage(&model, sent, prompt_tokens);
                }
            });
            return;
        };
        let stored = &cached.stored;
        let now = now_ms();
        let ttl = self.facts_ttl();
        let mut facts = stored.clone().current(now, ttl);
        // A prompt whose media cost we guessed says nothing of how we count.
        let mut changed = sent.countable
            && calibration::record(
                &mut facts.observations,
                Observation {
                    counted: sent.raw,
                    reported: prompt_tokens,
                    tenant: sent.tenant,
                    at_ms: now,
                },
                ttl.as_millis().min(u64::MAX as u128) as u64,
            );
        // Recorded in steps, not on every turn of a growing conversation (each is a write).
        if facts
            .accepted_prompt
            .is_none_or(|a| prompt_tokens > a.saturating_add(a / ACCEPTED_STEP))
        {
            facts.accepted_prompt = Some(prompt_tokens);
            facts.accepted_ms = Some(now);
            changed = true;
        }
        let bounds = facts.window_bounds.len();
        facts.window_bounds.retain(|b| b.tokens > prompt_tokens);
        if facts.window_bounds.len() < bounds {
            tracing::info!(
                accepted = prompt_tokens,
                "Dropped window bounds: the provider accepted a larger prompt."
            );
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
        if !changed && facts == *stored {
            return;
        }
        self.facts.insert(
            model.to_string(),
            (self.cache_entry(model, facts.clone()), Instant::now()),
        );
        let engine = self.clone();
        let model = model.to_string();
        tokio::spawn(async move { engine.save_facts(&model, facts).await });
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
