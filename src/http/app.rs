//! What every handler shares: the engine, the upstreams, the limits and the settings the HTTP
//! layer reads, and the one count of answered requests.

use std::sync::Arc;

use axum::response::Response;

use super::gateway_keys::GatewayKeys;
use super::limits::{ConnectionLimits, Limits};
use super::sealing::SealingKeys;
use crate::compaction::Engine;
use crate::metrics::{Metrics, RequestLabels, Route};
use crate::store::TimelineBounds;
use crate::telemetry::Telemetry;
use crate::upstream::Upstream;

/// Everything a handler needs.
pub struct App {
    pub engine: Arc<Engine>,
    pub upstream: Upstream,
    /// Where `/v1/messages…` goes (the Anthropic provider).
    pub anthropic_upstream: Upstream,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub connections: ConnectionLimits,
    pub calibrate_streams: bool,
    pub admin_token: Option<String>,
    /// Accepted client keys; `None`: any client may use the proxy.
    pub gateway_keys: Option<Arc<GatewayKeys>>,
    /// Who answers the compaction Responses clients ask for.
    pub client_compaction: ClientCompaction,
    /// How much of each conversation's history the store keeps; `None`: none is recorded.
    pub timeline: Option<TimelineBounds>,
    /// Where request spans go (nowhere unless an OTLP endpoint is configured).
    pub telemetry: Telemetry,
    /// Whether Compactor serves the context edits Messages clients ask for
    /// (`context_management`) rather than the provider ([`super::context_edits`]).
    pub context_edits: bool,
}

/// Whether Compactor answers the compaction Responses clients ask for
/// ([`super::client_compaction`]), and the keys its items are sealed with.
#[derive(Debug, Clone)]
pub struct ClientCompaction {
    pub emulate: bool,
    pub sealer: Arc<SealingKeys>,
}

impl App {
    /// The same state for another runtime: everything shared (the engine and its store, the
    /// limits, the metrics, the keys), except the connection pools to the providers, which are
    /// its own ([`Upstream::with_own_pool`]).
    pub fn for_another_runtime(&self) -> App {
        App {
            engine: self.engine.clone(),
            upstream: self.upstream.with_own_pool(),
            anthropic_upstream: self.anthropic_upstream.with_own_pool(),
            metrics: self.metrics.clone(),
            limits: self.limits.clone(),
            connections: self.connections.clone(),
            calibrate_streams: self.calibrate_streams,
            admin_token: self.admin_token.clone(),
            gateway_keys: self.gateway_keys.clone(),
            client_compaction: self.client_compaction.clone(),
            timeline: self.timeline,
            telemetry: self.telemetry.clone(),
            context_edits: self.context_edits,
        }
    }

    /// Counts one answered request of `route` by its status.
    pub(super) fn count_request(&self, route: Route, response: &Response) {
        self.metrics
            .requests
            .get_or_create(&RequestLabels {
                route,
                status: response.status().as_u16(),
            })
            .inc();
    }
}
