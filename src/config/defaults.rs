//! The embedded defaults: the configuration the proxy runs on with no file at all, which
//! `config/compactor.toml` states key by key (a test holds the two equal).

use std::collections::BTreeMap;

use super::{
    CompactionConfig, Config, LogFormat, MessagesConfig, ResponsesConfig, SummarizerConfig,
    TelemetryConfig, TimelineConfig,
};

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8787".into(),
            upstream: "https://api.openai.com/v1".into(),
            upstream_key_env: String::new(),
            anthropic_upstream: "https://api.anthropic.com".into(),
            anthropic_upstream_key_env: String::new(),
            store: "compactor.sqlite3".into(),
            max_body_bytes: 32 * 1024 * 1024,
            connect_timeout_ms: 10_000,
            first_byte_timeout_ms: 600_000,
            stream_idle_timeout_ms: 300_000,
            shutdown_grace_ms: 30_000,
            log_format: LogFormat::Text,
            admin_token: String::new(),
            default_window: 128_000,
            windows: BTreeMap::new(),
            header_read_timeout_ms: 30_000,
            body_read_timeout_ms: 60_000,
            max_connections: 1024,
            workers: 0,
            max_in_flight_body_bytes: 256 * 1024 * 1024,
            seen_elements_bytes: 32 * 1024 * 1024,
            gateway_keys_file: String::new(),
            gateway_keys_env: String::new(),
            compaction: CompactionConfig::default(),
            summarizer: SummarizerConfig::default(),
            responses: ResponsesConfig::default(),
            timeline: TimelineConfig::default(),
            telemetry: TelemetryConfig::default(),
            messages: MessagesConfig::default(),
        }
    }
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            enabled: true,
            reserve_output_tokens: 16_384,
            margin_tokens: 1024,
            keep_recent_tokens: 20_000,
            summary_max_tokens: 4096,
            merge_summary_into_user: false,
            instructions: String::new(),
            summary_timeout_ms: 120_000,
            max_unproductive_compactions: 3,
            retry_backoff_base_ms: 30_000,
            retry_backoff_max_ms: 900_000,
            ahead_of_time: true,
            soft_threshold: 0.75,
            apply_when_ready: true,
            clear_tool_results_first: true,
            clear_keep_tool_uses: 3,
            clear_min_share: 0.5,
            calibrate_streams: true,
            checkpoint_ttl_secs: 30 * 24 * 3600,
            model_facts_ttl_secs: 24 * 3600,
            model_facts_cache_size: 4096,
            max_summary_chunks: 12,
            max_concurrent_summaries: 8,
            max_concurrent_summaries_per_tenant: 2,
            learning_min_tenants: 2,
            window_bound_ttl_secs: 3600,
        }
    }
}
