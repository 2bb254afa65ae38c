//! The compacting path, the same for every dialect, as one value per request: an [`Exchange`]
//! reads and parses the body ([`parse`]), lets the engine prepare what goes upstream, sends it, and when the
//! provider says the window is full (as an error status, or at the start of a stream that failed
//! before any output) has the engine compact harder and sends once more. One closing phase
//! ([`closing`]) writes the `x-compactor-*` headers, the request's log line and its
//! count, and watches the answer's `usage` for calibration and for the request's span, which
//! ends with the answer ([`spans`]). Errors the proxy makes itself are written in the dialect's
//! own shape.

mod closing;
mod parse;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http::{HeaderMap, Method};

use super::app::App;
use super::context_edits;
use super::error::ApiError;
use super::headers::{
    credential_headers, forwarded_headers, instructions, mode, refuse_encoded_body, set,
};
use super::limits::BodyBudget;
use super::probe::{probe, Probe};
use super::spans;
use super::tenant::Tenant;
use super::threshold_compaction::{AtThreshold, FirstInAnswer};
use crate::compaction::{Mode, Outcome, RequestContext};
use crate::dialect::{AppliedEdit, Dialect, Overflow, WireRequest};
use crate::metrics::Route;
use crate::telemetry::Span;
use crate::upstream::{self, Upstream, UpstreamResponse};

/// Where one compacting route's requests go.
pub(super) struct Target<'a> {
    pub dialect: &'static dyn Dialect,
    /// The route as clients call it, for metrics and logs.
    pub route: Route,
    pub path: &'static str,
    pub upstream: &'a Upstream,
    /// Path (and query) on the upstream, relative to its base.
    pub upstream_path: String,
    /// Whether a body the dialect cannot parse still relies on history the provider holds:
    /// forwarded untouched, as a parsed one that [`WireRequest::uses_server_state`] is.
    pub holds_server_state: Option<fn(&[u8]) -> bool>,
    /// Whether Compactor answers the compaction the client asks for (Responses'
    /// `compaction_trigger`) and expands the items it minted ([`client_compaction`]).
    pub client_compaction: bool,
    /// Whether Compactor serves the context edits the client asks for (Messages'
    /// `context_management`) rather than the provider ([`context_edits`]).
    pub context_edits: bool,
}

/// One request on the compacting path, from its arrival to its closing phase.
struct Exchange<'a> {
    app: &'a Arc<App>,
    tenant: &'a Tenant,
    headers: &'a HeaderMap,
    target: Target<'a>,
    started: Instant,
    /// Time spent waiting for the provider (excluded from the proxy's overhead).
    upstream_time: Duration,
    /// The body as the client sent it, once read: an overflow error quoting it is not trusted.
    sent: Bytes,
    /// The request's span (empty on the token-counting path, or with traces off).
    span: Span,
    /// Calls made upstream so far.
    attempts: u32,
    /// The in-flight budget the body and its parsed form hold, returned with the exchange.
    budget: Option<BodyBudget>,
}

/// What a body became once read.
enum Parsed {
    /// A request to serve, the id of the checkpoint whose summary stands in it when the
    /// client brought a compaction item back, and what its threshold compaction made.
    Request(Box<dyn WireRequest>, Option<String>, AtThreshold),
    /// Answered without the provider (a compaction the client asked for).
    Answered(Response),
    /// It relies on state the provider holds: forwarded as it came.
    ServerState(Bytes),
}

/// A request that reached the provider, as the closing phase sees it.
struct Served {
    request: Arc<dyn WireRequest>,
    outcome: Outcome,
    response: UpstreamResponse,
    /// The whole body of an error answer, already read.
    error_body: Option<Bytes>,
    /// Whether the proxy asked a stream for the `usage` the client did not ask for.
    asked_usage: bool,
    /// The checkpoint of an expanded compaction item, named unless a newer one was applied.
    expanded: Option<String>,
    /// The span of the call that answered, ended with the answer.
    call: Span,
    /// What the context edits Compactor served cleared, reported in the answer.
    applied_edits: Option<Vec<AppliedEdit>>,
    /// What a compaction made at the request's threshold puts first in the answer.
    first_in_answer: Option<FirstInAnswer>,
}

/// How an exchange ends.
enum Ending {
    Served(Box<Served>),
    /// Answered without compaction or before the provider (client compaction, server state).
    Answered(Response),
    Refused(ApiError),
}

/// Serves one request of `target`'s dialect on the compacting path.
pub(super) async fn serve(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    body: Body,
    target: Target<'_>,
) -> Response {
    let mut exchange = Exchange::new(app, tenant, headers, target);
    let target = &exchange.target;
    exchange.span = spans::request(
        &app.telemetry,
        headers,
        target.route,
        target.dialect.name(),
        target.upstream,
    );
    let ending = match exchange.run(body).await {
        Ok(ending) => ending,
        Err(e) => Ending::Refused(e),
    };
    exchange.close(ending)
}

/// A token-counting request (`/v1/messages/count_tokens`, `/v1/responses/input_tokens`):
/// counted by the provider on the body as it would be sent now, through the conversation's
/// checkpoint (no summary is made here).
pub(super) async fn count_through_checkpoint(
    app: &Arc<App>,
    tenant: &Tenant,
    headers: &HeaderMap,
    body: Body,
    target: Target<'_>,
) -> Response {
    let mut exchange = Exchange::new(app, tenant, headers, target);
    let response = match exchange.count(body).await {
        Ok(response) => response,
        Err(e) => e.into_response_in(exchange.target.dialect),
    };
    app.count_request(exchange.target.route, &response);
    response
}

impl<'a> Exchange<'a> {
    fn new(
        app: &'a Arc<App>,
        tenant: &'a Tenant,
        headers: &'a HeaderMap,
        target: Target<'a>,
    ) -> Exchange<'a> {
        Exchange {
            app,
            tenant,
            headers,
            target,
            started: Instant::now(),
            upstream_time: Duration::ZERO,
            sent: Bytes::new(),
            span: Span::default(),
            attempts: 0,
            budget: None,
        }
    }

    async fn run(&mut self, body: Body) -> Result<Ending, ApiError> {
        refuse_encoded_body(self.headers)?;
        let instructions = instructions(self.headers)?;
        let mode = mode(self.headers)?;
        let bytes = self.read(body).await?;
        let (mut request, expanded, at_threshold) = match self.parse(bytes, true).await? {
            Parsed::Request(request, expanded, at_threshold) => (request, expanded, at_threshold),
            Parsed::Answered(response) => return Ok(Ending::Answered(response)),
            Parsed::ServerState(bytes) => return self.forward_untouched(bytes).await,
        };
        // A compaction made at the client's threshold names the checkpoint the answer stands on.
        let expanded = match &at_threshold {
            AtThreshold::Compacted(_, checkpoint) => Some(checkpoint.clone()),
            _ => expanded,
        };
        spans::model_asked(&mut self.span, request.model());
        let applied_edits = self.clear_context(request.as_mut())?;
        let asked_usage = self.app.calibrate_streams && request.ask_for_usage();
        let request: Arc<dyn WireRequest> = Arc::from(request);
        let context = RequestContext {
            tenant: self.tenant.seed,
            credentials: credential_headers(self.headers),
            mode,
            instructions,
            edits_served: applied_edits.is_some(),
        };
        let engine = &self.app.engine;
        let (prepared, identified) = engine
            .prepare_identified(&context, &request)
            .await
            .map_err(|e| ApiError::ContextLength(e.to_string()))?;
        let mut outcome = prepared.outcome;
        if let Some(report) = &outcome.summary {
            spans::summary(&self.span, report);
        }
        let first_in_answer = match at_threshold {
            AtThreshold::Compacted(first, _) => Some(first),
            AtThreshold::Failed => {
                outcome.status = Some(crate::compaction::Status::Failed {
                    reason: "compact-threshold".into(),
                    fallback: "original",
                });
                None
            }
            AtThreshold::Under => None,
        };
        let (mut response, mut probe, mut call) = self.send(prepared.body).await?;
        let worth_a_retry = |overflow: &Overflow| {
            // An overflow in the provider's own shape is believed; one that only has the words
            // (an error quoting the client's input back) earns a retry only when our own count
            // says the request is near the window, else the error goes to the client as it is.
            mode != Mode::Off && (overflow.trusted || outcome.tokens_after * 2 >= outcome.window)
        };
        if let Some(overflow) = probe.overflow.filter(worth_a_retry) {
            // The provider's window is smaller than we thought: learn it, compact harder, retry
            // once, on the conversation already identified.
            self.app.metrics.overflow_retries.inc();
            std::mem::take(&mut call).end();
            // The retry's state is boxed: it is rare, and every request's future would
            // otherwise carry room for it.
            let again = Box::pin(engine.retry_after_overflow(
                identified,
                overflow,
                outcome.sent_raw_tokens,
            ))
            .await
            .map_err(|e| ApiError::ContextLength(e.to_string()))?;
            let summary_before = outcome.summary_time;
            outcome = again.outcome;
            outcome.summary_time += summary_before;
            if let Some(report) = &outcome.summary {
                spans::summary(&self.span, report);
            }
            (response, probe, call) = Box::pin(self.send(again.body)).await?;
            if let Some(again) = probe.overflow.filter(|o| o.trusted) {
                // Compaction did not make it fit: say so in the client's own words, which agents
                // recognise (a provider's own wording, such as llama.cpp's, often is not). An
                // error that only looks like an overflow goes to the client as the provider
                // wrote it.
                return Err(ApiError::ContextLength(cannot_fit_message(
                    again,
                    outcome.tokens_after,
                    outcome.window,
                )));
            }
        }
        Ok(Ending::Served(Box::new(Served {
            request,
            outcome,
            response,
            error_body: probe.error_body,
            asked_usage,
            expanded,
            call,
            applied_edits,
            first_in_answer,
        })))
    }

    /// Serves the context edits the client asks for, where Compactor serves them: applied to
    /// the request in place, with what they cleared (`None`: the request asks for none, or the
    /// provider serves them).
    fn clear_context(
        &self,
        request: &mut dyn WireRequest,
    ) -> Result<Option<Vec<AppliedEdit>>, ApiError> {
        if !self.target.context_edits {
            return Ok(None);
        }
        let Some(edits) = request.context_edits()? else {
            return Ok(None);
        };
        Ok(Some(self.app.engine.clear_context(request, &edits)))
    }

    /// The client's headers as they go to the provider.
    fn upstream_headers(&self) -> HeaderMap {
        let mut headers = forwarded_headers(self.headers);
        if self.target.context_edits {
            context_edits::strip_served_betas(&mut headers);
        }
        headers
    }

    /// The token-counting path: parsed like any request (compaction items expanded, a trigger
    /// left alone), then counted by the provider through the stored checkpoint.
    async fn count(&mut self, body: Body) -> Result<Response, ApiError> {
        refuse_encoded_body(self.headers)?;
        let bytes = self.read(body).await?;
        let mut request = match self.parse(bytes, false).await? {
            Parsed::Request(request, _, _) => request,
            Parsed::Answered(response) => return Ok(response),
            Parsed::ServerState(bytes) => return self.forward(bytes).await,
        };
        let applied_edits = self.clear_context(request.as_mut())?;
        let request: Arc<dyn WireRequest> = Arc::from(request);
        // Counted as it would be sent: through its checkpoint, a stored clearing included.
        let context = RequestContext {
            tenant: self.tenant.seed,
            credentials: credential_headers(self.headers),
            edits_served: applied_edits.is_some(),
            ..RequestContext::default()
        };
        let rewritten = self.app.engine.through_checkpoint(&context, &request).await;
        let response = self.forward(rewritten).await?;
        let Some(applied) = applied_edits.filter(|_| response.status().is_success()) else {
            return Ok(response);
        };
        let (mut parts, body) = response.into_parts();
        parts.headers.remove(http::header::CONTENT_LENGTH);
        let body = context_edits::annotate_count(
            body.into_data_stream()
                .map_err(std::io::Error::other)
                .boxed(),
            applied,
        );
        Ok(Response::from_parts(parts, Body::from_stream(body)))
    }

    async fn read(&mut self, body: Body) -> Result<Bytes, ApiError> {
        let (bytes, budget) = self.app.limits.read_body(self.headers, body).await?;
        self.budget = Some(budget);
        self.sent = bytes.clone();
        Ok(bytes)
    }

    /// A request the proxy cannot compact, sent as it came and marked so.
    async fn forward_untouched(&mut self, bytes: Bytes) -> Result<Ending, ApiError> {
        let mut out = self.forward(bytes).await?;
        set(
            out.headers_mut(),
            "x-compactor-compaction",
            "skipped; reason=server-state",
        );
        Ok(Ending::Answered(out))
    }

    /// Sends `body` to the target with the client's headers and relays the answer as it comes.
    async fn forward(&mut self, body: impl Into<Bytes>) -> Result<Response, ApiError> {
        let mut headers = self.upstream_headers();
        let mut call = self.call_span();
        call.propagate_into(&mut headers);
        let response = self
            .target
            .upstream
            .send(
                Method::POST,
                &self.target.upstream_path,
                headers,
                upstream::body_from(body.into()),
            )
            .await;
        spans::call_answered(&mut call, &response);
        let response = response?;
        let mut out = Response::new(Body::from_stream(response.body));
        *out.status_mut() = response.status;
        *out.headers_mut() = response.headers;
        Ok(spans::open_until_sent(out, vec![call]))
    }

    /// The span of the next call upstream, a child of the request's.
    fn call_span(&mut self) -> Span {
        self.attempts += 1;
        spans::upstream_call(
            &self.span,
            self.target.upstream,
            &self.target.upstream_path,
            self.attempts,
        )
    }

    /// Sends a prepared body and reads the start of the answer ([`probe`]), timing both as the
    /// provider's; the call's span is returned open, to end with the answer.
    async fn send(&mut self, body: Bytes) -> Result<(UpstreamResponse, Probe, Span), ApiError> {
        let mut headers = self.upstream_headers();
        // Bodies come back uncompressed so usage can be read from them.
        headers.remove(http::header::ACCEPT_ENCODING);
        let mut call = self.call_span();
        call.propagate_into(&mut headers);
        let sent = Instant::now();
        let mut response = self
            .target
            .upstream
            .send(
                Method::POST,
                &self.target.upstream_path,
                headers,
                upstream::body_from(body),
            )
            .await;
        self.app
            .metrics
            .upstream_seconds
            .observe(sent.elapsed().as_secs_f64());
        spans::call_answered(&mut call, &response);
        let probe = match &mut response {
            // The wait for a stream's first bytes is the provider's time, not the proxy's.
            Ok(response) => {
                // The start of the answer ends when its headers' time would have.
                let deadline = sent + self.target.upstream.first_byte_timeout();
                probe(self.target.dialect, response, &self.sent, deadline).await
            }
            Err(_) => Ok(Probe::default()),
        };
        self.upstream_time += sent.elapsed();
        Ok((response?, probe?, call))
    }
}

/// The refusal of a request the provider still found too long after compaction, saying what
/// was measured: the whole compacted prompt, by the provider's count where it gave one (ours
/// otherwise), against the window it stated (or the one we assumed). The first two numbers are
/// the prompt and the window, as clients that read them expect.
fn cannot_fit_message(overflow: Overflow, sent: u64, window: u64) -> String {
    let counted = match overflow.requested {
        Some(requested) => format!("{requested} tokens by the provider's count"),
        None => format!("{sent} tokens by Compactor's count"),
    };
    let window = overflow.limit.unwrap_or(window);
    format!(
        "the provider refused this conversation as too long even after compaction: the compacted \
         prompt takes {counted}, and the model's context window is {window} tokens; shorten the \
         system prompt, tools or last message, or start a new conversation"
    )
}
