//! The compacting path, the same for every dialect, as one value per request: an [`Exchange`]
//! reads and parses the body, lets the engine prepare what goes upstream, sends it, and when the
//! provider says the window is full (as an error status, or at the start of a stream that failed
//! before any output) has the engine compact harder and sends once more. One closing phase
//! ([`Exchange::close`]) writes the `x-compactor-*` headers, the request's log line and its
//! count, and watches the answer's `usage` for calibration and for the request's span, which
//! ends with the answer ([`spans`]). Errors the proxy makes itself are written in the dialect's
//! own shape.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http::{HeaderMap, Method};

use super::app::App;
use super::client_compaction::{self, Intercepted};
use super::context_edits;
use super::conversations;
use super::error::ApiError;
use super::headers::{
    credential_headers, forwarded_headers, instructions, mode, outcome_headers,
    refuse_encoded_body, set,
};
use super::limits::{check_model_name, BodyBudget};
use super::log::Escaped;
use super::messages_compaction;
use super::probe::{is_sse, probe, Probe};
use super::spans;
use super::stream;
use super::tenant::Tenant;
use super::threshold_compaction::{self, AtThreshold};
use crate::compaction::{Mode, Outcome, RequestContext};
use crate::dialect::responses::request::ResponsesRequest;
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
    /// The compaction item made at the request's `compact_threshold`, first in the answer.
    compaction_item: Option<serde_json::Value>,
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
        spans::model_asked(&mut self.span, request.model());
        let applied_edits = self.clear_context(request.as_mut())?;
        if applied_edits.is_none() {
            self.app
                .engine
                .clear_first(request.as_mut(), mode, &self.tenant.seed)
                .await;
        }
        let asked_usage = self.app.calibrate_streams && request.ask_for_usage();
        let request: Arc<dyn WireRequest> = Arc::from(request);
        let context = RequestContext {
            tenant: self.tenant.seed,
            credentials: credential_headers(self.headers),
            mode,
            instructions,
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
        let compaction_item = match at_threshold {
            AtThreshold::Compacted(item) => Some(item),
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
            let again = engine
                .retry_after_overflow(identified, overflow, outcome.sent_raw_tokens)
                .await
                .map_err(|e| ApiError::ContextLength(e.to_string()))?;
            let summary_before = outcome.summary_time;
            outcome = again.outcome;
            outcome.summary_time += summary_before;
            if let Some(report) = &outcome.summary {
                spans::summary(&self.span, report);
            }
            (response, probe, call) = self.send(again.body).await?;
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
            compaction_item,
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
        if applied_edits.is_none() {
            // Counted as it would be sent: cleared as the request itself would be.
            self.app
                .engine
                .clear_first(request.as_mut(), Mode::Auto, &self.tenant.seed)
                .await;
        }
        let request: Arc<dyn WireRequest> = Arc::from(request);
        let context = RequestContext {
            tenant: self.tenant.seed,
            credentials: credential_headers(self.headers),
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

    /// Parses the body once in the target's dialect. Where the target emulates client
    /// compaction, the compaction items Compactor minted are expanded in the parsed request
    /// and, with `answer_trigger`, an input ending in a compaction trigger is answered. A model
    /// name beyond its bound is refused here, before the request is counted or forwarded.
    async fn parse(&self, bytes: Bytes, answer_trigger: bool) -> Result<Parsed, ApiError> {
        if self.target.context_edits {
            let read = messages_compaction::read(
                self.app,
                self.tenant,
                self.headers,
                &bytes,
                answer_trigger,
            )
            .await?;
            return Ok(match read {
                messages_compaction::Read::Request(request, expanded) => {
                    Parsed::Request(Box::new(request), expanded, AtThreshold::Under)
                }
                messages_compaction::Read::Answered(response) => Parsed::Answered(response),
            });
        }
        if !self.target.client_compaction {
            let parsed = self.target.dialect.parse(&bytes);
            return Ok(
                match self.server_state(parsed, |r| r.uses_server_state(), &bytes)? {
                    Ok(request) => {
                        check_model_name(request.model())?;
                        Parsed::Request(request, None, AtThreshold::Under)
                    }
                    Err(bytes) => Parsed::ServerState(bytes),
                },
            );
        }
        let mut request = match ResponsesRequest::parse(&bytes) {
            Ok(request) => request,
            Err(e) => {
                let holds = self.target.holds_server_state;
                if holds.is_some_and(|holds| holds(&bytes))
                    && !client_compaction::carries_minted_item(&bytes)
                {
                    return Ok(Parsed::ServerState(bytes));
                }
                return Err(e.into());
            }
        };
        if request.uses_server_state() {
            // Forwarded as it came, except for the items Compactor minted: those are expanded,
            // never sent to the provider.
            if client_compaction::expand(self.app, self.tenant, &mut request)
                .await?
                .is_some()
            {
                return Ok(Parsed::ServerState(Bytes::from(request.original_body())));
            }
            return Ok(Parsed::ServerState(bytes));
        }
        check_model_name(request.model())?;
        let last_minted = request.minted_compactions().last().map(|(index, _)| *index);
        let intercepted = client_compaction::intercept(self.app, self.tenant, request).await?;
        Ok(match intercepted {
            Intercepted::Trigger(request) if answer_trigger => Parsed::Answered(
                client_compaction::answer_trigger(self.app, self.tenant, self.headers, request)
                    .await?,
            ),
            Intercepted::Trigger(mut request) => {
                request.remove_context_management();
                Parsed::Request(Box::new(request), None, AtThreshold::Under)
            }
            Intercepted::Forward(mut request, expanded) if answer_trigger => {
                let at_threshold = threshold_compaction::serve(
                    self.app,
                    self.tenant,
                    self.headers,
                    &mut request,
                    last_minted,
                )
                .await?;
                Parsed::Request(Box::new(request), expanded, at_threshold)
            }
            Intercepted::Forward(mut request, expanded) => {
                request.compact_threshold()?;
                request.remove_context_management();
                Parsed::Request(Box::new(request), expanded, AtThreshold::Under)
            }
        })
    }

    /// A parsed request, or the body back (`Err`) when it relies on history the provider holds;
    /// a body that does not parse is still forwarded if the target can tell it does.
    fn server_state<R>(
        &self,
        parsed: Result<R, crate::dialect::RequestError>,
        uses_server_state: impl Fn(&R) -> bool,
        bytes: &Bytes,
    ) -> Result<Result<R, Bytes>, ApiError> {
        match parsed {
            Ok(request) if uses_server_state(&request) => Ok(Err(bytes.clone())),
            Ok(request) => Ok(Ok(request)),
            Err(_)
                if self
                    .target
                    .holds_server_state
                    .is_some_and(|holds| holds(bytes)) =>
            {
                Ok(Err(bytes.clone()))
            }
            Err(e) => Err(e.into()),
        }
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
    async fn send(&mut self, body: Vec<u8>) -> Result<(UpstreamResponse, Probe, Span), ApiError> {
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
                upstream::body_from(Bytes::from(body)),
            )
            .await;
        self.app
            .metrics
            .upstream_seconds
            .observe(sent.elapsed().as_secs_f64());
        spans::call_answered(&mut call, &response);
        let probe = match &mut response {
            // The wait for a stream's first bytes is the provider's time, not the proxy's.
            Ok(response) => probe(self.target.dialect, response, &self.sent).await,
            Err(_) => Ok(Probe::default()),
        };
        self.upstream_time += sent.elapsed();
        Ok((response?, probe?, call))
    }

    /// The closing phase: what the client gets, the request's log line and its count.
    fn close(mut self, ending: Ending) -> Response {
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
            compaction_item,
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
        tracing::info!(
            method = "POST",
            path = self.target.path,
            status = status.as_u16(),
            model = %Escaped(&request.model()),
            prompt_tokens = outcome.prompt_tokens,
            tokens_sent = outcome.tokens_after,
            compacted = outcome.compacted,
            conversation = outcome.anchor.as_deref().map_or("-", |a| a.get(..16).unwrap_or(a)),
            checkpoint = outcome.checkpoint_id.as_deref().unwrap_or("-"),
            upstream_ms = self.upstream_time.as_millis() as u64,
            summary_ms = outcome.summary_time.as_millis() as u64,
            overhead_ms = overhead.as_secs_f64() * 1000.0,
            "Served a {} request.",
            self.target.dialect.name()
        );
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
                let body = match compaction_item.filter(|_| status.is_success()) {
                    Some(item) => {
                        headers.remove(http::header::CONTENT_LENGTH);
                        threshold_compaction::answer_with_item(body, is_sse(&headers), item)
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
