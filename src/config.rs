//! Configuration: one TOML file, overridden by `COMPACTOR_…` environment variables, overridden by
//! command-line flags.
//!
//! The raw file is read into serde structs that reject unknown keys and fill defaults; `Config`
//! is that same structure after validation. `config/compactor.toml` documents every key and is
//! checked by a test to state exactly the defaults written here.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

mod choices;
mod defaults;
mod env;
mod redact;

pub use choices::{ContinueConversation, ServerCompaction};
use env::apply_env;
pub use redact::redact_url;

/// Every way loading configuration can fail; each message names the offending key or file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The whole configuration, after defaults and overrides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub listen: String,
    pub upstream: String,
    pub upstream_key_env: String,
    pub anthropic_upstream: String,
    pub anthropic_upstream_key_env: String,
    pub store: String,
    pub max_body_bytes: usize,
    pub connect_timeout_ms: u64,
    pub first_byte_timeout_ms: u64,
    pub stream_idle_timeout_ms: u64,
    pub shutdown_grace_ms: u64,
    pub log_format: LogFormat,
    pub admin_token: String,
    pub default_window: u64,
    pub header_read_timeout_ms: u64,
    pub body_read_timeout_ms: u64,
    pub max_connections: usize,
    /// Runtimes serving, each on a thread of its own ([`crate::workers`]); 0: one per CPU.
    pub workers: usize,
    pub max_in_flight_body_bytes: usize,
    pub seen_elements_bytes: u64,
    pub gateway_keys_file: String,
    pub gateway_keys_env: String,
    pub windows: BTreeMap<String, u64>,
    pub compaction: CompactionConfig,
    pub summarizer: SummarizerConfig,
    pub responses: ResponsesConfig,
    pub timeline: TimelineConfig,
    pub telemetry: TelemetryConfig,
    pub messages: MessagesConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// When and how conversations are compacted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionConfig {
    pub enabled: bool,
    pub reserve_output_tokens: u64,
    pub margin_tokens: u64,
    pub keep_recent_tokens: u64,
    pub summary_max_tokens: u64,
    pub merge_summary_into_user: bool,
    pub instructions: String,
    pub summary_timeout_ms: u64,
    pub max_unproductive_compactions: u32,
    pub retry_backoff_base_ms: u64,
    pub retry_backoff_max_ms: u64,
    pub ahead_of_time: bool,
    pub soft_threshold: f64,
    pub apply_when_ready: bool,
    pub clear_tool_results_first: bool,
    pub clear_keep_tool_uses: u64,
    pub clear_min_share: f64,
    pub calibrate_streams: bool,
    pub checkpoint_ttl_secs: u64,
    pub model_facts_ttl_secs: u64,
    pub model_facts_cache_size: usize,
    pub max_summary_chunks: usize,
    pub max_concurrent_summaries: usize,
    pub max_concurrent_summaries_per_tenant: usize,
    pub learning_min_tenants: usize,
    pub window_bound_ttl_secs: u64,
}

/// Where summary requests go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct SummarizerConfig {
    pub upstream: String,
    pub model: String,
    pub api_key_env: String,
    pub window: u64,
    /// Whether a summary request continues the conversation it summarizes.
    pub continue_conversation: ContinueConversation,
}

/// The Responses API (`/v1/responses`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct ResponsesConfig {
    pub server_compaction: ServerCompaction,
    /// Variable holding the secret that seals compaction items; empty: one kept in the store.
    pub compaction_secret_env: String,
    /// Variable holding the secret used before a rotation, whose items are still accepted.
    pub compaction_secret_previous_env: String,
}

/// The history of each conversation's requests that the conversation page shows, kept in the
/// store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimelineConfig {
    pub enabled: bool,
    pub requests_per_conversation: usize,
    pub conversations: usize,
    pub conversations_per_tenant: usize,
}

impl Default for TimelineConfig {
    fn default() -> Self {
        TimelineConfig {
            enabled: true,
            requests_per_conversation: 200,
            conversations: 500,
            conversations_per_tenant: 100,
        }
    }
}

/// OpenTelemetry traces (`[telemetry]`): off unless an endpoint is given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP collector traces are exported to (`http://localhost:4318`; `/v1/traces` is
    /// appended unless the URL ends with it). Empty: no traces.
    pub otlp_endpoint: String,
    /// The `service.name` the spans are exported under.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: String::new(),
            service_name: "compactor".into(),
        }
    }
}

/// Anthropic's Messages API (`/v1/messages`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct MessagesConfig {
    /// Who serves the context edits a client asks for (`context_management`).
    pub context_management: ServerCompaction,
}

/// Values given on the command line; `None` leaves the file/env value alone.
#[derive(Debug, Default, Clone)]
pub struct CliOverrides {
    pub listen: Option<String>,
    pub upstream: Option<String>,
    pub store: Option<String>,
    pub log_format: Option<LogFormat>,
}

impl Config {
    /// Loads the file (or the embedded defaults when `path` is `None`), applies the environment
    /// (given as pairs so tests need not touch the process environment), then the CLI overrides.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        cli: &CliOverrides,
    ) -> Result<Config, ConfigError> {
        let text = match path {
            Some(p) => std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                path: p.display().to_string(),
                source,
            })?,
            None => String::new(),
        };
        let mut table: toml::Table = toml::from_str(&text)
            .map_err(|e| ConfigError::Invalid(format!("{}: {}", path_name(path), e.message())))?;
        let env: BTreeMap<String, String> = env.into_iter().collect();
        apply_env(&mut table, env.clone())?;
        let mut config: Config = Config::deserialize(toml::Value::Table(table))
            .map_err(|e| ConfigError::Invalid(e.message().to_string()))?;
        if let Some(v) = &cli.listen {
            config.listen = v.clone();
        }
        if let Some(v) = &cli.upstream {
            config.upstream = v.clone();
        }
        if let Some(v) = &cli.store {
            config.store = v.clone();
        }
        if let Some(v) = cli.log_format {
            config.log_format = v;
        }
        config.validate()?;
        config.check_named_secrets(|name| env.get(name).cloned())?;
        Ok(config)
    }

    /// Refuses a secret variable that is named but unset or empty (`lookup` reads a variable):
    /// falling back to another secret would have replicas, or the next start, refuse the items
    /// this one seals.
    pub fn check_named_secrets(
        &self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        for (key, var) in [
            (
                "responses.compaction_secret_env",
                &self.responses.compaction_secret_env,
            ),
            (
                "responses.compaction_secret_previous_env",
                &self.responses.compaction_secret_previous_env,
            ),
        ] {
            if !var.is_empty() && lookup(var).is_none_or(|v| v.is_empty()) {
                return Err(ConfigError::Invalid(format!(
                    "{key} names `{var}`, which is unset or empty; set it, or leave {key} empty \
                     to seal with the secret kept in the store"
                )));
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |msg: String| Err(ConfigError::Invalid(msg));
        if self.listen.parse::<SocketAddr>().is_err() {
            return bad(format!(
                "listen: `{}` is not an address like 127.0.0.1:8787",
                self.listen
            ));
        }
        for (key, url) in [
            ("upstream", &self.upstream),
            ("anthropic_upstream", &self.anthropic_upstream),
            ("summarizer.upstream", &self.summarizer.upstream),
            ("telemetry.otlp_endpoint", &self.telemetry.otlp_endpoint),
        ] {
            let optional = matches!(key, "summarizer.upstream" | "telemetry.otlp_endpoint");
            if optional && url.is_empty() {
                continue;
            }
            match url::Url::parse(url) {
                Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
                _ => {
                    return bad(format!(
                        "{key}: `{}` is not an http(s) URL",
                        redact_url(url)
                    ))
                }
            }
        }
        if !(0.0..=1.0).contains(&self.compaction.soft_threshold) {
            return bad("compaction.soft_threshold must be between 0 and 1".into());
        }
        if !(0.0..=1.0).contains(&self.compaction.clear_min_share) {
            return bad("compaction.clear_min_share must be between 0 and 1".into());
        }
        if self.default_window < 256 {
            return bad("default_window must be at least 256 tokens".into());
        }
        if self.max_body_bytes == 0 {
            return bad("max_body_bytes must be positive".into());
        }
        // A body is reserved in the in-flight budget in one piece, counted in u32 permits.
        if self.max_body_bytes > self.max_in_flight_body_bytes
            || self.max_body_bytes > u32::MAX as usize
        {
            return bad(
                "max_body_bytes must be at most max_in_flight_body_bytes and below 4 GiB".into(),
            );
        }
        for (key, value) in [
            ("stream_idle_timeout_ms", self.stream_idle_timeout_ms),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
            ("body_read_timeout_ms", self.body_read_timeout_ms),
            ("max_connections", self.max_connections as u64),
            (
                "timeline.requests_per_conversation",
                self.timeline.requests_per_conversation as u64,
            ),
            ("timeline.conversations", self.timeline.conversations as u64),
            (
                "timeline.conversations_per_tenant",
                self.timeline.conversations_per_tenant as u64,
            ),
        ] {
            if value == 0 {
                return bad(format!("{key} must be positive"));
            }
        }
        Ok(())
    }

    /// The effective configuration as TOML, with secrets redacted.
    pub fn redacted_toml(&self) -> String {
        let mut shown = self.clone();
        if !shown.admin_token.is_empty() {
            shown.admin_token = "<redacted>".into();
        }
        for url in [
            &mut shown.store,
            &mut shown.upstream,
            &mut shown.anthropic_upstream,
            &mut shown.summarizer.upstream,
            &mut shown.telemetry.otlp_endpoint,
        ] {
            *url = redact_url(url);
        }
        toml::to_string_pretty(&shown).unwrap_or_else(|e| format!("# cannot render: {e}"))
    }

    /// The key named by `upstream_key_env`, read from the process environment.
    pub fn upstream_key(&self) -> Option<String> {
        read_key(&self.upstream_key_env)
    }

    /// The key named by `anthropic_upstream_key_env`, read from the process environment.
    pub fn anthropic_upstream_key(&self) -> Option<String> {
        read_key(&self.anthropic_upstream_key_env)
    }

    /// The gateway key entries named by `gateway_keys_env`, read from the process environment.
    /// A variable that is named but unset is an error: the gateway must not open by accident.
    pub fn gateway_keys_text(&self) -> Result<Option<String>, String> {
        if self.gateway_keys_env.is_empty() {
            return Ok(None);
        }
        std::env::var(&self.gateway_keys_env)
            .map(Some)
            .map_err(|_| {
                format!(
                    "gateway_keys_env names `{}`, which is not set",
                    self.gateway_keys_env
                )
            })
    }

    /// What `serve` warns about at start when anyone who reaches it could spend the configured
    /// upstream key: a key is set, no gateway keys are, and it listens beyond loopback.
    pub fn open_relay_warning(&self) -> Option<String> {
        let spends_a_key =
            !self.upstream_key_env.is_empty() || !self.anthropic_upstream_key_env.is_empty();
        let has_gateway_keys =
            !self.gateway_keys_file.is_empty() || !self.gateway_keys_env.is_empty();
        let loopback = self
            .listen
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback());
        (spends_a_key && !has_gateway_keys && !loopback).then(|| {
            format!(
                "OPEN RELAY: listening on {} with the upstream key from `{}` and no gateway \
                 keys: anyone who can reach this address spends that key. Set \
                 gateway_keys_file or gateway_keys_env, or listen on 127.0.0.1.",
                self.listen, self.upstream_key_env
            )
        })
    }

    /// The key named by `summarizer.api_key_env`, read from the process environment.
    pub fn summarizer_key(&self) -> Option<String> {
        read_key(&self.summarizer.api_key_env)
    }

    /// The secret named by `responses.compaction_secret_env`, read from the process environment.
    pub fn compaction_secret(&self) -> Option<String> {
        read_key(&self.responses.compaction_secret_env)
    }

    /// The secret named by `responses.compaction_secret_previous_env`, from the process
    /// environment.
    pub fn previous_compaction_secret(&self) -> Option<String> {
        read_key(&self.responses.compaction_secret_previous_env)
    }

    /// Whether Compactor answers client-requested Responses compaction itself: always, never,
    /// or (`auto`) unless the upstream is OpenAI's own API.
    pub fn emulates_responses_compaction(&self) -> bool {
        self.responses
            .server_compaction
            .emulates_for(&self.upstream, "api.openai.com")
    }

    /// Whether Compactor serves Anthropic's context editing itself: always, never, or (`auto`)
    /// unless the Messages upstream is Anthropic's own API.
    pub fn emulates_context_management(&self) -> bool {
        self.messages
            .context_management
            .emulates_for(&self.anthropic_upstream, "api.anthropic.com")
    }

    /// Whether summary requests continue the conversation, for chat and Responses
    /// conversations (`.0`) and Messages ones (`.1`): never with a summarizer upstream of its
    /// own, else as `summarizer.continue_conversation` says for each provider.
    pub fn summaries_continue(&self) -> (bool, bool) {
        if !self.summarizer.upstream.is_empty() {
            return (false, false);
        }
        let mode = self.summarizer.continue_conversation;
        (
            mode.applies_to(&self.upstream, "api.openai.com"),
            mode.applies_to(&self.anthropic_upstream, "api.anthropic.com"),
        )
    }
}

fn read_key(var: &str) -> Option<String> {
    if var.is_empty() {
        return None;
    }
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

fn path_name(path: Option<&Path>) -> String {
    path.map(|p| p.display().to_string())
        .unwrap_or_else(|| "<defaults>".into())
}

#[cfg(test)]
mod tests;
