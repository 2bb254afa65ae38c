//! The closing phase of an exchange: what the client gets (the provider's answer with the
//! `x-compactor-*` headers, the context edits' report and a threshold compaction's block or
//! item put in it, or the proxy's own answer or refusal), the request's log line, its count
//! and its conversation's timeline entry; the answer's `usage` watched as it streams by.

use axum::body::Body;
use axum::response::Response;

use super::super::context_edits;
use super::super::conversations;
use super::super::headers::{outcome_headers, rounded_micros, set};
use super::super::log::Escaped;
use super::super::probe::is_sse;
use super::super::served_line::{self, ServedLine};
use super::super::spans;
use super::super::stream;
use super::super::threshold_compaction;
use super::{Ending, Exchange, Served};
use crate::telemetry::Span;
use crate::upstream::UpstreamResponse;

impl Exchange<'_> {
    /// The closing phase: what the client gets, the request's log line and its count.
    pub(super) fn close(mut self, ending: Ending) -> Response {
        let mut span = std::mem::take(&mut self.span);
        let response = match ending {
            Ending::Served(served) => self.respond(*served, span),
            Ending::Answered(response) => {
                spans::status(&mut span, response.status().as_u16());
                spans::open_until_sent(response, vec![span])
            }
            Ending::Refused(e) => {
                spans::status(&mut span, e.status().as_u16());
                drop(span);
                tracing::info!(
                    method = "POST",
                    path = self.target.path,
                    status = e.status().as_u16(),
                    error = %Escaped(&e),
                    "Refused a {} request.",
                    self.target.dialect.name()
                );
                e.into_response_in(self.target.dialect)
            }
        };
        self.app.count_request(self.target.route, &response);
        response
    }

    /// The provider's answer with the `x-compactor-*` headers, logged, its `usage` watched;
    /// `span` (the request's) and the call's end with it.
    fn respond(&self, served: Served, mut span: Span) -> Response {
        let Served {
            request,
            outcome,
            response,
            error_body,
            asked_usage,
            expanded,
            call,
            applied_edits,
            first_in_answer,
        } = served;
        let UpstreamResponse {
            status,
            mut headers,
            body,
        } = response;
        let overhead = self
            .started
            .elapsed()
            .saturating_sub(self.upstream_time)
            .saturating_sub(outcome.summary_time);
        let app = self.app;
        app.metrics.overhead_seconds.observe(overhead.as_secs_f64());
        outcome_headers(app, &mut headers, &outcome, overhead);
        // A summary the client brought back (an expanded compaction item) names its
        // checkpoint, unless the engine applied a newer one.
        let checkpoint = outcome.checkpoint_id.clone().or(expanded);
        if let (Some(id), None) = (&checkpoint, &outcome.checkpoint_id) {
            set(&mut headers, "x-compactor-checkpoint", id);
        }
        spans::outcome(&mut span, &outcome, checkpoint.as_deref());
        spans::status(&mut span, status.as_u16());
        served_line::log(&ServedLine {
            dialect: self.target.dialect.name(),
            path: self.target.path,
            status: status.as_u16(),
            model: request.model(),
            prompt_tokens: outcome.prompt_tokens,
            tokens_sent: outcome.tokens_after,
            compacted: outcome.compacted,
            conversation: outcome
                .anchor
                .as_deref()
                .map_or("-", |a| a.get(..16).unwrap_or(a)),
            checkpoint: outcome.checkpoint_id.as_deref().unwrap_or("-"),
            upstream_ms: self.upstream_time.as_millis() as u64,
            summary_ms: outcome.summary_time.as_millis() as u64,
            overhead_us: rounded_micros(overhead),
        });
        conversations::record(
            app,
            self.tenant,
            conversations::Served {
                path: self.target.path,
                model: request.model(),
                status: status.as_u16(),
                outcome: &outcome,
                upstream_time: self.upstream_time,
            },
        );
        let body = match error_body {
            // Read whole already: the spans end here.
            Some(bytes) => Body::from(bytes),
            None => {
                let body = match applied_edits.filter(|_| status.is_success()) {
                    Some(applied) => {
                        headers.remove(http::header::CONTENT_LENGTH);
                        let object = crate::dialect::anthropic::edits::applied_edits(&applied);
                        if is_sse(&headers) {
                            context_edits::annotate_stream(body, object)
                        } else {
                            context_edits::annotate_message(body, object)
                        }
                    }
                    None => body,
                };
                let body = match first_in_answer.filter(|_| status.is_success()) {
                    Some(first) => {
                        headers.remove(http::header::CONTENT_LENGTH);
                        threshold_compaction::answer_with(body, is_sse(&headers), first)
                    }
                    None => body,
                };
                let engine = app.engine.clone();
                let model = request.model().to_string();
                let counted = outcome.sent_raw_tokens;
                let sink: stream::UsageSink = Box::new(move |usage| {
                    if let Some(prompt_tokens) = usage.input_tokens {
                        engine.observe_usage(&model, counted, prompt_tokens);
                    }
                    spans::usage(&mut span, &usage);
                    // The call ends before the request it serves.
                    call.end();
                    span.end();
                });
                let dialect = self.target.dialect;
                if is_sse(&headers) {
                    if asked_usage {
                        headers.remove(http::header::CONTENT_LENGTH);
                    }
                    Body::from_stream(stream::Observed::sse(body, asked_usage, dialect, sink))
                } else {
                    Body::from_stream(stream::Observed::json(body, dialect, sink))
                }
            }
        };
        let mut out = Response::new(body);
        *out.status_mut() = status;
        *out.headers_mut() = headers;
        out
    }
}
