//! The core's edge toward summaries: the engine asks a [`Summarizer`] for one and never knows
//! how it is made. `server.rs` wires the HTTP implementation (`HttpSummarizer`, next to the
//! HTTP client); tests use canned ones.

use http::HeaderMap;

use crate::dialect::{AnswerError, SummaryRequest};

/// Why a summarizer gave no summary. Each variant keeps its cause for the log.
#[derive(Debug, thiserror::Error)]
pub enum SummarizerError {
    #[error("the summarizer did not answer in time")]
    Timeout,
    #[error("the summarizer could not be reached")]
    Unreachable(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the summarizer answered with status {0}")]
    Status(u16),
    /// The summarizer refused the request as longer than its context window.
    #[error("the summarizer refused the summary request as too long for its context window")]
    Overflow(crate::dialect::Overflow),
    #[error("the summarizer's answer cannot be used")]
    Answer(#[from] AnswerError),
}

/// Writes one summary: the answer to `request`, made on behalf of the client whose credential
/// headers are `credentials`.
#[async_trait::async_trait]
pub trait Summarizer: Send + Sync + 'static {
    async fn summarize(
        &self,
        request: &SummaryRequest<'_>,
        credentials: &HeaderMap,
    ) -> Result<String, SummarizerError>;

    /// Whether requests to this summarizer may continue the conversation they summarize
    /// ([`SummaryRequest::conversation`]): it is the conversation's own provider, and that
    /// provider reads a repeated prefix from its cache.
    fn continues_conversations(&self) -> bool {
        false
    }
}

/// An error and its causes, `: `-separated, for a log field.
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
