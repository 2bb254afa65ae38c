//! The measured path, the same for every dialect: read and parse the body, measure it, let the
//! engine prepare what goes upstream, send it, and when the provider says the window is full
//! (as an error status, or at the start of a stream that failed before any output) learn the
//! window, compact harder and send once more. The answer goes back with the `x-compactor-*`
//! headers and its `usage` watched for calibration. Errors the proxy makes itself are written
//! in the dialect's own shape.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use http::{HeaderMap, Method};

use super::client_compaction::{self, Intercepted};
use super::counting::{measure, measure_on_blocking_pool};
use super::log::Escaped;
use super::request_headers::{instructions, refuse_encoded_body};
use super::{
    credential_headers, forwarded_headers, header_str, set, stream, tenant, ApiError, App,
};
use crate::compaction::{Mode, Outcome, Prepared, RequestContext};
use crate::dialect::Overflow;
use crate::dialect::{Dialect, WireRequest};
use crate::metrics::{RequestLabels, Route};
use crate::upstream::{self, Upstream, UpstreamResponse};

/// Largest error body read from the provider (to recognise an overflow in it).
const ERROR_BODY_LIMIT: usize = 4 * 1024 * 1024;
/// Largest head of a stream held back while looking for a failure before any output.
const STREAM_HEAD_LIMIT: usize = 64 * 1024;

/// Where one measured route's requests go.
pub(super) struct Target<'a> {
    pub dialect: &'static dyn Dialect,
    /// The route as clients call it, for metrics and logs.
    pub route: Route,
    pub path: &'static str,
    pub upstream: &'a Upstream,
    /// Path (and query) on the upstream, relative to its base.
    pub upstream_path: String,
    /// Whether a body relies on history the provider holds (Responses' `previous_response_id`):
    /// such a request is forwarded untouched, since the proxy cannot see what it would compact.
    pub holds_server_state: Option<fn(&[u8]) -> bool>,
    /// Whether Compactor answers the compaction the client asks for (Responses'
    /// `compaction_trigger`) and expands the items it minted ([`client_compaction`]).
    pub client_compaction: bool,
}

/// Serves one request of `target`'s dialect on the measured path.
pub(super) async fn serve(
    app: &Arc<App>,
    tenant: &tenant::Tenant,
    headers: &HeaderMap,
    body: Body,
    target: Target<'_>,
) -> Response {
    let started = Instant::now();
    let response = match serve_inner(app, tenant, headers, body, &target, started).await {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(method = "POST", path = target.path, status = e.status().as_u16(), error = %Escaped(&e), "Refused a {} request.", target.dialect.name());
            e.into_response_in(target.dialect)
        }
    };
    count_request(app, target.route, &response);
    response
}

/// Counts one answered request of `route` by its status.
pub(super) fn count_request(app: &App, route: Route, response: &Response) {
    app.metrics
        .requests
        .get_or_create(&RequestLabels {
            route,
            status: response.status().as_u16(),
        })
        .inc();
}

async fn serve_inner(
    app: &Arc<App>,
    tenant: &tenant::Tenant,
    headers: &HeaderMap,
    body: Body,
    target: &Target<'_>,
    started: Instant,
) -> Result<Response, ApiError> {
    refuse_encoded_body(headers)?;
    let instructions = instructions(headers)?;
    let (bytes, _budget) = app.limits.read_body(headers, body).await?;
    if target.holds_server_state.is_some_and(|holds| holds(&bytes)) {
        return forward_untouched(target, headers, bytes).await;
    }
    let (bytes, expanded) = match intercept(app, tenant, headers, bytes, target, true).await? {
        Intercepted::Answer(response) => return Ok(response),
        Intercepted::Forward(bytes, expanded) => (bytes, expanded),
    };
    let request: Arc<dyn WireRequest> = Arc::from(target.dialect.parse(&bytes)?);
    let measured = measure(app, &request, bytes.len()).await?;
    let mode = match header_str(headers, "x-compactor-mode") {
        None => Mode::Auto,
        Some(v) => Mode::parse(&v).ok_or_else(|| ApiError::BadRequest {
            message: format!("invalid x-compactor-mode `{v}`: expected auto, force or off"),
            param: Some("x-compactor-mode".into()),
            code: None,
        })?,
    };
    let context = RequestContext {
        tenant: tenant.seed,
        credentials: credential_headers(headers),
        mode,
        instructions,
        force_usage: app.calibrate_streams && request.usage_needs_asking(),
    };
    let outgoing = || {
        let mut out = forwarded_headers(headers);
        // Bodies come back uncompressed so usage can be read from them.
        out.remove(http::header::ACCEPT_ENCODING);
        out
    };
    let prepared = app
        .engine
        .prepare_measured(&context, &request, measured, None)
        .await
        .map_err(|e| ApiError::ContextLength(e.to_string()))?;
    let mut upstream_time = Duration::ZERO;
    let (mut prepared, mut response) =
        send_timed(app, target, outgoing(), prepared, &mut upstream_time).await?;
    // The wait for a stream's first bytes is the provider's time, not the proxy's.
    let probing = Instant::now();
    let mut probe = probe(target.dialect, &mut response, &bytes).await?;
    upstream_time += probing.elapsed();
    if let Some(overflow) = probe.overflow.filter(|_| mode != Mode::Off) {
        // The provider's window is smaller than we thought: learn it, compact harder, retry once.
        app.metrics.overflow_retries.inc();
        app.engine
            .learn_overflow(request.model(), overflow, prepared.outcome.sent_raw_tokens)
            .await;
        let again = app
            .engine
            .prepare(&context, &request, Some(overflow))
            .await
            .map_err(|e| ApiError::ContextLength(e.to_string()))?;
        let summary_before = prepared.outcome.summary_time;
        (prepared, response) =
            send_timed(app, target, outgoing(), again, &mut upstream_time).await?;
        prepared.outcome.summary_time += summary_before;
        let probing = Instant::now();
        probe = self::probe(target.dialect, &mut response, &bytes).await?;
        upstream_time += probing.elapsed();
        if let Some(again) = probe.overflow.filter(|o| o.trusted) {
            // Compaction did not make it fit: say so in the client's own words, which agents
            // recognise (a provider's own wording, such as llama.cpp's, often is not). An error
            // that only looks like an overflow goes to the client as the provider wrote it.
            return Err(ApiError::ContextLength(cannot_fit_message(
                again,
                prepared.outcome.tokens_after,
                prepared.outcome.window,
            )));
        }
    }
    let mut response = finish(
        app,
        target,
        request.as_ref(),
        prepared.outcome,
        response,
        probe.error_body,
        Timing {
            started,
            upstream: upstream_time,
        },
        &context,
    );
    // A summary the client brought back (an expanded compaction item) names its checkpoint,
    // unless the engine applied a newer one.
    if let Some(id) = expanded {
        if !response.headers().contains_key("x-compactor-checkpoint") {
            set(response.headers_mut(), "x-compactor-checkpoint", id);
        }
    }
    Ok(response)
}

/// The body with the compaction items Compactor minted expanded, or the answer to the
/// compaction the client asked for, where `target` emulates it ([`client_compaction`]).
async fn intercept(
    app: &Arc<App>,
    tenant: &tenant::Tenant,
    headers: &HeaderMap,
    bytes: Bytes,
    target: &Target<'_>,
    answer_trigger: bool,
) -> Result<Intercepted, ApiError> {
    if !target.client_compaction {
        return Ok(Intercepted::Forward(bytes, None));
    }
    client_compaction::intercept(app, tenant, headers, bytes, answer_trigger).await
}

/// A request the proxy cannot compact, sent as it came and marked so.
async fn forward_untouched(
    target: &Target<'_>,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Response, ApiError> {
    let mut out = forward(target, headers, bytes).await?;
    set(
        out.headers_mut(),
        "x-compactor-compaction",
        "skipped; reason=server-state",
    );
    Ok(out)
}

/// Sends `body` to `target` with the client's headers and relays the answer as it comes.
async fn forward(
    target: &Target<'_>,
    headers: &HeaderMap,
    body: impl Into<Bytes>,
) -> Result<Response, ApiError> {
    let response = target
        .upstream
        .send(
            Method::POST,
            &target.upstream_path,
            forwarded_headers(headers),
            upstream::body_from(body.into()),
        )
        .await?;
    let mut out = Response::new(Body::from_stream(response.body));
    *out.status_mut() = response.status;
    *out.headers_mut() = response.headers;
    Ok(out)
}

/// The refusal of a request the provider still found too long after compaction: the numbers are
/// the provider's where it gave them, the proxy's otherwise.
fn cannot_fit_message(overflow: Overflow, sent: u64, window: u64) -> String {
    crate::compaction::CannotFit {
        needed: overflow.requested.unwrap_or(sent),
        window: overflow.limit.unwrap_or(window),
    }
    .to_string()
}

/// What the start of the provider's answer says.
struct Probe {
    /// It refused the prompt as too long.
    overflow: Option<Overflow>,
    /// The whole body of an error answer, read to look for an overflow in it.
    error_body: Option<Bytes>,
}

/// Reads an error answer whole, or holds back the head of a stream until it shows output or a
/// failure; a stream's head is put back in front of the rest, so nothing is lost.
///
/// An overflow whose words appear in what the client sent (`sent`) is not trusted to teach a
/// window: the provider may be quoting the client's input back.
async fn probe(
    dialect: &dyn Dialect,
    response: &mut UpstreamResponse,
    sent: &[u8],
) -> Result<Probe, ApiError> {
    if !response.status.is_success() {
        let body = response.read_body(ERROR_BODY_LIMIT).await?;
        return Ok(Probe {
            overflow: dialect
                .overflow(response.status.as_u16(), &body)
                .map(|o| o.unless_echoed(&body, sent)),
            error_body: Some(body),
        });
    }
    if !is_sse(&response.headers) {
        return Ok(Probe {
            overflow: None,
            error_body: None,
        });
    }
    let mut head = BytesMut::new();
    let mut ended = None;
    loop {
        match response.body.next().await {
            Some(Ok(chunk)) => head.extend_from_slice(&chunk),
            Some(Err(e)) => {
                ended = Some(e);
                break;
            }
            None => break,
        }
        if head.len() >= STREAM_HEAD_LIMIT || !dialect.stream_head_undecided(&head) {
            break;
        }
    }
    let head = head.freeze();
    let overflow = dialect
        .overflow_in_stream(&head)
        .map(|o| o.unless_echoed(&head, sent));
    let rest = std::mem::replace(&mut response.body, Box::pin(futures::stream::empty()));
    let tail: upstream::ByteStream = match ended {
        Some(e) => Box::pin(futures::stream::once(async move { Err(e) })),
        None => rest,
    };
    response.body = Box::pin(futures::stream::once(async move { Ok(head) }).chain(tail));
    Ok(Probe {
        overflow,
        error_body: None,
    })
}

fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

async fn send_timed(
    app: &App,
    target: &Target<'_>,
    headers: HeaderMap,
    mut prepared: Prepared,
    upstream_time: &mut Duration,
) -> Result<(Prepared, UpstreamResponse), ApiError> {
    let sent = Instant::now();
    let body = upstream::body_from(std::mem::take(&mut prepared.body));
    let response = target
        .upstream
        .send(Method::POST, &target.upstream_path, headers, body)
        .await;
    let elapsed = sent.elapsed();
    *upstream_time += elapsed;
    app.metrics.upstream_seconds.observe(elapsed.as_secs_f64());
    Ok((prepared, response?))
}

struct Timing {
    started: Instant,
    /// Time spent waiting for the provider.
    upstream: Duration,
}

#[allow(clippy::too_many_arguments)]
fn finish(
    app: &Arc<App>,
    target: &Target<'_>,
    request: &dyn WireRequest,
    outcome: Outcome,
    response: UpstreamResponse,
    error_body: Option<Bytes>,
    timing: Timing,
    context: &RequestContext,
) -> Response {
    let UpstreamResponse {
        status,
        mut headers,
        body,
    } = response;
    let overhead = timing
        .started
        .elapsed()
        .saturating_sub(timing.upstream)
        .saturating_sub(outcome.summary_time);
    app.metrics.overhead_seconds.observe(overhead.as_secs_f64());
    outcome_headers(app, &mut headers, &outcome, overhead);
    tracing::info!(
        method = "POST",
        path = target.path,
        status = status.as_u16(),
        model = %Escaped(&request.model()),
        prompt_tokens = outcome.prompt_tokens,
        tokens_sent = outcome.tokens_after,
        compacted = outcome.compacted,
        upstream_ms = timing.upstream.as_millis() as u64,
        summary_ms = outcome.summary_time.as_millis() as u64,
        overhead_ms = overhead.as_secs_f64() * 1000.0,
        "Served a {} request.",
        target.dialect.name()
    );
    let body = match error_body {
        Some(bytes) => Body::from(bytes),
        None => {
            let engine = app.engine.clone();
            let model = request.model().to_string();
            let counted = outcome.sent_raw_tokens;
            let sink: stream::UsageSink =
                Box::new(move |prompt_tokens| engine.observe_usage(&model, counted, prompt_tokens));
            let dialect = target.dialect;
            if is_sse(&headers) {
                if context.force_usage {
                    headers.remove(http::header::CONTENT_LENGTH);
                }
                Body::from_stream(stream::Observed::sse(
                    body,
                    context.force_usage,
                    dialect,
                    sink,
                ))
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

/// The `x-compactor-*` headers that say what happened to a request.
fn outcome_headers(app: &App, headers: &mut HeaderMap, outcome: &Outcome, overhead: Duration) {
    set(headers, "x-compactor-prompt-tokens", outcome.prompt_tokens);
    set(headers, "x-compactor-context-window", outcome.window);
    set(
        headers,
        "x-compactor-overhead-ms",
        format!("{:.3}", overhead.as_secs_f64() * 1000.0),
    );
    set(headers, "x-compactor-compacted", outcome.compacted);
    set(headers, "x-compactor-tokens-before", outcome.tokens_before);
    set(headers, "x-compactor-tokens-after", outcome.tokens_after);
    if let Some(id) = &outcome.checkpoint_id {
        set(headers, "x-compactor-checkpoint", id);
    }
    if !outcome.summary_time.is_zero() {
        set(
            headers,
            "x-compactor-summary-ms",
            outcome.summary_time.as_millis(),
        );
    }
    if let Some(status) = &outcome.status {
        set(headers, "x-compactor-compaction", status.header_value());
    }
    if outcome.ready_checkpoint_used {
        set(headers, "x-compactor-ready-checkpoint", "true");
    }
    // Checked again now: the store may have noticed an outage while serving this request.
    if outcome.store_degraded || !app.engine.store().healthy() {
        set(headers, "x-compactor-store", "degraded");
    }
}

/// A token-counting request (`/v1/messages/count_tokens`, `/v1/responses/input_tokens`):
/// counted by the provider on the body as it would be sent now, through the conversation's
/// checkpoint (no summary is made here).
pub(super) async fn count_through_checkpoint(
    app: &Arc<App>,
    tenant: &tenant::Tenant,
    headers: &HeaderMap,
    body: Body,
    target: Target<'_>,
) -> Response {
    let result = async {
        refuse_encoded_body(headers)?;
        let (bytes, _budget) = app.limits.read_body(headers, body).await?;
        let bytes = match intercept(app, tenant, headers, bytes, &target, false).await? {
            Intercepted::Answer(response) => return Ok(response),
            Intercepted::Forward(bytes, _) => bytes,
        };
        let request: Arc<dyn WireRequest> = Arc::from(target.dialect.parse(&bytes)?);
        // Counted off the async workers, once: the engine takes the count.
        let measured = measure_on_blocking_pool(app, &request).await?;
        let context = RequestContext {
            tenant: tenant.seed,
            credentials: credential_headers(headers),
            ..RequestContext::default()
        };
        let rewritten = app
            .engine
            .through_checkpoint(&context, &request, measured)
            .await;
        forward(&target, headers, rewritten).await
    }
    .await;
    let response = result.unwrap_or_else(|e| e.into_response_in(target.dialect));
    count_request(app, target.route, &response);
    response
}
