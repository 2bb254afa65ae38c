//! The settings whose `auto` depends on whether an upstream is a first-party API (OpenAI's,
//! Anthropic's), by its host: who serves the context features those APIs offer, and whether
//! summary requests continue the conversation for their prompt caches.

use serde::{Deserialize, Serialize};

/// Who serves a context feature that first-party providers offer themselves: for Responses,
/// the compaction a client asks for (`POST /v1/responses/compact`, an `input` ending in
/// `compaction_trigger`); for Messages, context editing (`context_management`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ServerCompaction {
    /// The provider when it is the first-party API (OpenAI's, Anthropic's), which offers it;
    /// Compactor otherwise.
    #[default]
    Auto,
    /// Always the provider: such requests and `compaction` items pass through.
    Passthrough,
    /// Always Compactor, from its own checkpoints.
    Emulate,
}

impl ServerCompaction {
    /// Whether Compactor serves the feature for `upstream`, whose first-party host is
    /// `first_party`.
    pub(super) fn emulates_for(self, upstream: &str, first_party: &str) -> bool {
        match self {
            ServerCompaction::Emulate => true,
            ServerCompaction::Passthrough => false,
            ServerCompaction::Auto => !is_host(upstream, first_party),
        }
    }
}

/// Whether a summary request is sent as a continuation of the conversation (its instructions,
/// tools and messages as last forwarded, then one user message asking for the summary) rather
/// than as a request of its own with a transcript. A provider that caches prompts then reads
/// the conversation from its cache. Only a conversation's own provider can do this: with a
/// summarizer of its own (`summarizer.upstream`) or another model (`summarizer.model`), every
/// request is standalone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ContinueConversation {
    /// Toward the first-party APIs (OpenAI's, Anthropic's), which bill cached input at a
    /// fraction; standalone toward every other upstream.
    #[default]
    Auto,
    Always,
    Never,
}

impl ContinueConversation {
    /// Whether summary requests to `upstream` (whose first-party host is `first_party`)
    /// continue the conversation.
    pub fn applies_to(self, upstream: &str, first_party: &str) -> bool {
        match self {
            ContinueConversation::Always => true,
            ContinueConversation::Never => false,
            ContinueConversation::Auto => is_host(upstream, first_party),
        }
    }
}

/// Whether `upstream` (a base URL) is on `host`; not when it does not parse.
fn is_host(upstream: &str, host: &str) -> bool {
    url::Url::parse(upstream)
        .ok()
        .is_some_and(|u| u.host_str() == Some(host))
}
