//! Prometheus metrics. Labels stay low-cardinality: routes, status codes, triggers and results,
//! never a conversation or a credential. The one tenant label is a gateway key's name, from the
//! operator's own key file. Model names are the client's choice: the one model label, on what
//! is learned about a model (its correction and window), is cut to [`MODEL_LABEL_CHARS`] safe
//! characters and given to the first [`MODEL_LABELS`] models learned about only.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: Route,
    pub status: u16,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Route {
    ChatCompletions,
    Messages,
    Responses,
    Passthrough,
    Compactor,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabel {
    pub trigger: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

/// Models shown with their learned facts; later ones are not shown until a restart.
pub const MODEL_LABELS: usize = 32;
/// Longest model label.
pub const MODEL_LABEL_CHARS: usize = 80;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// Every metric the proxy exports.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub upstream_seconds: Histogram,
    pub overhead_seconds: Histogram,
    pub compactions: Family<TriggerLabel, Counter>,
    pub compaction_failures: Counter,
    pub summary_seconds: Histogram,
    pub summaries_in_progress: Gauge,
    pub summary_requests: Counter,
    pub summaries_refused: Family<ResultLabel, Counter>,
    pub summary_continuations: Family<ResultLabel, Counter>,
    pub summary_slot_waits: Counter,
    pub tokens_saved: Counter,
    pub checkpoint_lookups: Family<ResultLabel, Counter>,
    pub ready_checkpoints_used: Counter,
    pub clearings_applied: Counter,
    pub overflow_retries: Counter,
    pub upstream_silences: Counter,
    pub store_errors: Counter,
    pub tenant_requests: Family<TenantLabel, Counter>,
    pub model_correction_factor: Family<ModelLabel, Gauge<f64, AtomicU64>>,
    pub model_correction_overhead: Family<ModelLabel, Gauge>,
    pub model_correction_observations: Family<ModelLabel, Gauge>,
    pub model_window: Family<ModelLabel, Gauge>,
    /// The models given a label so far (at most [`MODEL_LABELS`]).
    labeled_models: Mutex<HashSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("compactor");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests answered, by route and status",
            requests.clone(),
        );
        let upstream_seconds = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "upstream_seconds",
            "Time from sending a request upstream to its response head",
            upstream_seconds.clone(),
        );
        let overhead_seconds = Histogram::new(exponential_buckets(0.00005, 2.0, 16));
        registry.register(
            "overhead_seconds",
            "Time spent inside the proxy per request, upstream and summaries excluded",
            overhead_seconds.clone(),
        );
        let compactions = Family::<TriggerLabel, Counter>::default();
        registry.register(
            "compactions",
            "Summaries written, by trigger",
            compactions.clone(),
        );
        let compaction_failures = Counter::default();
        registry.register(
            "compaction_failures",
            "Compactions that failed; the request was served anyway",
            compaction_failures.clone(),
        );
        let summary_seconds = Histogram::new(exponential_buckets(0.05, 2.0, 14));
        registry.register(
            "summary_seconds",
            "Time to write one summary",
            summary_seconds.clone(),
        );
        let summaries_in_progress = Gauge::default();
        registry.register(
            "summaries_in_progress",
            "Summaries being written now, for requests or ahead of time",
            summaries_in_progress.clone(),
        );
        let summary_requests = Counter::default();
        registry.register(
            "summary_requests",
            "Requests sent to the summarizer (one per chunk of a span)",
            summary_requests.clone(),
        );
        let summaries_refused = Family::<ResultLabel, Counter>::default();
        registry.register(
            "summaries_refused",
            "Summaries not attempted, by reason (span_too_large)",
            summaries_refused.clone(),
        );
        let summary_continuations = Family::<ResultLabel, Counter>::default();
        registry.register(
            "summary_continuations",
            "Summary requests sent as a continuation of the conversation, by result (used, or \
             fell_back to a standalone request)",
            summary_continuations.clone(),
        );
        let summary_slot_waits = Counter::default();
        registry.register(
            "summary_slot_waits",
            "Summaries that waited for a free slot (the proxy's or their tenant's limit)",
            summary_slot_waits.clone(),
        );
        let tokens_saved = Counter::default();
        registry.register(
            "tokens_saved",
            "Prompt tokens removed by new checkpoints",
            tokens_saved.clone(),
        );
        let checkpoint_lookups = Family::<ResultLabel, Counter>::default();
        registry.register(
            "checkpoint_lookups",
            "Checkpoint lookups, by hit or miss",
            checkpoint_lookups.clone(),
        );
        let ready_checkpoints_used = Counter::default();
        registry.register(
            "ready_checkpoints_used",
            "Requests over the limit served by a checkpoint prepared ahead of time",
            ready_checkpoints_used.clone(),
        );
        let clearings_applied = Counter::default();
        registry.register(
            "clearings_applied",
            "Requests kept under their budget by clearing old tool results, with no summary",
            clearings_applied.clone(),
        );
        let overflow_retries = Counter::default();
        registry.register(
            "overflow_retries",
            "Requests retried after a context-overflow error",
            overflow_retries.clone(),
        );
        let upstream_silences = Counter::default();
        registry.register(
            "upstream_silences",
            "Answers ended because the provider sent nothing for stream_idle_timeout_ms",
            upstream_silences.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "store_errors",
            "Checkpoint store operations that failed, those the store absorbed included (a write kept in memory, a fall of Redis to local memory)",
            store_errors.clone(),
        );
        let tenant_requests = Family::<TenantLabel, Counter>::default();
        registry.register(
            "tenant_requests",
            "Requests accepted with a gateway key, by the key's tenant name",
            tenant_requests.clone(),
        );
        let model_correction_factor = Family::<ModelLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "model_correction_factor",
            "Factor applied to our token counts for a model, learned from its provider's usage",
            model_correction_factor.clone(),
        );
        let model_correction_overhead = Family::<ModelLabel, Gauge>::default();
        registry.register(
            "model_correction_overhead_tokens",
            "Tokens a model's provider adds once per prompt (a chat template), learned from usage",
            model_correction_overhead.clone(),
        );
        let model_correction_observations = Family::<ModelLabel, Gauge>::default();
        registry.register(
            "model_correction_observations",
            "Recent accepted prompts a model's correction is estimated from",
            model_correction_observations.clone(),
        );
        let model_window = Family::<ModelLabel, Gauge>::default();
        registry.register(
            "model_window_tokens",
            "Context window the proxy believes for a model",
            model_window.clone(),
        );
        Metrics {
            registry,
            model_correction_factor,
            model_correction_overhead,
            model_correction_observations,
            model_window,
            labeled_models: Mutex::new(HashSet::new()),
            requests,
            upstream_seconds,
            overhead_seconds,
            compactions,
            compaction_failures,
            summary_seconds,
            summaries_in_progress,
            summary_requests,
            summaries_refused,
            summary_continuations,
            summary_slot_waits,
            tokens_saved,
            checkpoint_lookups,
            ready_checkpoints_used,
            clearings_applied,
            overflow_retries,
            upstream_silences,
            store_errors,
            tenant_requests,
        }
    }
}

impl Metrics {
    /// Counts a request of a gateway key's tenant.
    pub fn count_tenant_request(&self, name: &str) {
        self.tenant_requests
            .get_or_create(&TenantLabel {
                tenant: name.to_string(),
            })
            .inc();
    }

    /// The label for `model`'s learned facts: its name cut to safe characters, when it already
    /// has one or fewer than [`MODEL_LABELS`] models do.
    pub fn model_label(&self, model: &str) -> Option<ModelLabel> {
        let safe: String = model
            .chars()
            .take(MODEL_LABEL_CHARS)
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._:/@+-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let mut labeled = self
            .labeled_models
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !labeled.contains(&safe) {
            if labeled.len() >= MODEL_LABELS {
                return None;
            }
            labeled.insert(safe.clone());
        }
        Some(ModelLabel { model: safe })
    }

    /// Shows a model's live correction (`factor`, `overhead`), window and the observations
    /// behind the correction.
    pub fn show_model(
        &self,
        label: &ModelLabel,
        (factor, overhead): (f64, u64),
        window: u64,
        observations: usize,
    ) {
        let gauge = |value: u64| value.min(i64::MAX as u64) as i64;
        self.model_correction_factor
            .get_or_create(label)
            .set(factor);
        self.model_correction_overhead
            .get_or_create(label)
            .set(gauge(overhead));
        self.model_correction_observations
            .get_or_create(label)
            .set(observations as i64);
        self.model_window.get_or_create(label).set(gauge(window));
    }

    /// Adds the counts of conversation elements reused by their bytes, which each wire format
    /// keeps itself: `read` is called at every scrape.
    pub fn reading_seen_elements(mut self, read: fn() -> Vec<(&'static str, SeenCounts)>) -> Self {
        self.registry
            .register_collector(Box::new(SeenElementsCollector(read)));
        self
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "Encoding metrics failed.");
        }
        out
    }
}

/// Counts one unit in a gauge for as long as it lives, however its holder ends (done, failed,
/// timed out or dropped).
pub struct GaugeHeld(Gauge);

impl GaugeHeld {
    pub fn hold(gauge: &Gauge) -> GaugeHeld {
        gauge.inc();
        GaugeHeld(gauge.clone())
    }
}

impl Drop for GaugeHeld {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What one wire format's elements seen before (`dialect::seen`) have done since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeenCounts {
    /// Elements found by their bytes (in bodies split that way): not checked, parsed or counted
    /// again.
    pub found: u64,
    /// Elements new to the lookup (in bodies split that way): checked, parsed and offered to be
    /// kept (one larger than a shard of the cache is not).
    pub parsed: u64,
    /// The weight of what is kept (bytes, roughly).
    pub kept_bytes: u64,
}

#[derive(Debug)]
struct SeenElementsCollector(fn() -> Vec<(&'static str, SeenCounts)>);

impl Collector for SeenElementsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = (self.0)();
        let mut elements = encoder.encode_descriptor(
            "seen_elements",
            "Conversation elements found by their bytes (found) or checked and parsed (parsed), by wire format",
            None,
            MetricType::Counter,
        )?;
        for (dialect, counts) in &rows {
            for (result, count) in [("found", counts.found), ("parsed", counts.parsed)] {
                let labels = [("dialect", *dialect), ("result", result)];
                ConstCounter::new(count).encode(elements.encode_family(&labels)?)?;
            }
        }
        let mut kept = encoder.encode_descriptor(
            "seen_elements_bytes",
            "Bytes of parsed conversation elements kept to be found again, by wire format",
            None,
            MetricType::Gauge,
        )?;
        for (dialect, counts) in &rows {
            let bytes = i64::try_from(counts.kept_bytes).unwrap_or(i64::MAX);
            ConstGauge::new(bytes).encode(kept.encode_family(&[("dialect", *dialect)])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_labels_are_few_short_and_safe() {
        let metrics = Metrics::default();
        let label = metrics.model_label("qwen\"} 1\nfake_metric{a=\"").unwrap();
        assert_eq!(label.model, "qwen___1_fake_metric_a__");
        assert_eq!(
            metrics.model_label(&"m".repeat(1000)).unwrap().model.len(),
            MODEL_LABEL_CHARS
        );
        for i in 0..MODEL_LABELS - 2 {
            assert!(metrics.model_label(&format!("model-{i}")).is_some());
        }
        assert!(metrics.model_label("one-too-many").is_none());
        // A model already shown keeps its label.
        assert!(metrics.model_label("model-0").is_some());
    }
}
