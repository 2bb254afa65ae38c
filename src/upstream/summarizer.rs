//! Summaries over HTTP: a summary request written in a dialect, sent to the summarizer's
//! provider with the client's credentials (or the configured key).

use std::sync::Arc;

use http::HeaderMap;

use super::{body_from, Upstream, UpstreamError};
use crate::compaction::summarizer::{Summarizer, SummarizerError};
use crate::dialect::{Dialect, SummaryRequest};

/// Largest summary answer read.
const ANSWER_LIMIT: usize = 8 * 1024 * 1024;

/// Asks a provider for summaries in its own format.
pub struct HttpSummarizer {
    upstream: Upstream,
    dialect: Arc<dyn Dialect>,
    continues: bool,
}

impl HttpSummarizer {
    pub fn new(upstream: Upstream, dialect: Arc<dyn Dialect>) -> HttpSummarizer {
        HttpSummarizer {
            upstream,
            dialect,
            continues: false,
        }
    }

    /// Lets summary requests continue the conversation they summarize (the upstream is the
    /// conversation's own provider).
    pub fn continuing(mut self, continues: bool) -> HttpSummarizer {
        self.continues = continues;
        self
    }
}

fn unreachable(e: UpstreamError) -> SummarizerError {
    match e {
        UpstreamError::Timeout(_) => SummarizerError::Timeout,
        other => SummarizerError::Unreachable(Box::new(other)),
    }
}

#[async_trait::async_trait]
impl Summarizer for HttpSummarizer {
    async fn summarize(
        &self,
        request: &SummaryRequest<'_>,
        credentials: &HeaderMap,
    ) -> Result<String, SummarizerError> {
        let mut headers = credentials.clone();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        headers.insert(
            "x-compactor-purpose",
            http::HeaderValue::from_static("summary"),
        );
        let body = self.dialect.summary_request(request).to_string();
        let mut response = self
            .upstream
            .send(
                http::Method::POST,
                self.dialect.summary_path(),
                headers,
                body_from(body),
            )
            .await
            .map_err(unreachable)?;
        let body = response
            .read_body(ANSWER_LIMIT)
            .await
            .map_err(unreachable)?;
        if !response.status.is_success() {
            let status = response.status.as_u16();
            return Err(match self.dialect.overflow(status, &body) {
                Some(overflow) => SummarizerError::Overflow(overflow),
                None => SummarizerError::Status(status),
            });
        }
        Ok(self.dialect.summary_answer(&body)?)
    }

    fn continues_conversations(&self) -> bool {
        self.continues
    }
}
