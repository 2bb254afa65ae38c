//! Compactor: a proxy that speaks the OpenAI and Anthropic APIs and compacts long agent
//! conversations transparently.
//!
//! A request travels one way through these modules, whatever its wire format:
//!
//! 1. [`http`] receives it (the only module that knows axum), reads the body within its limit,
//!    and picks the [`dialect`] of its route: chat completions, Anthropic Messages, Responses.
//! 2. The dialect parses it into a [`dialect::WireRequest`]: the conversation as elements (each
//!    with its role, original bytes, canonical hash, transcript and token count), every field's
//!    original bytes kept.
//! 3. [`compaction`], the core, identifies the conversation ([`identity`]: a hash chain seeded
//!    with the tenant), measures it ([`measure`]: tokens cached per element, each model's
//!    window), applies the newest stored checkpoint whose prefix matches, and when the request
//!    is still too large, plans a cut, asks for a summary (a [`compaction::Summarizer`], in the
//!    provider's own dialect), stores the new checkpoint in the [`store`], and has the dialect
//!    render the body through it. The core never reads a wire format.
//! 4. [`upstream`] forwards the body to the provider (the only module that knows the HTTP client);
//!    [`http`] streams the answer back, reading `usage` in the dialect to calibrate counts, and
//!    when the dialect recognises a context-overflow error ([`dialect::overflow`]), retries once.
//!
//! [`config`] loads settings, [`metrics`] exports Prometheus counters, [`telemetry`] exports
//! OpenTelemetry traces (each request a span, continuing the client's trace and passed on to the
//! provider), [`server`] builds the application and serves it with graceful shutdown, [`cli`]
//! holds the subcommands, [`workers`] runs a runtime per CPU, [`log_writer`] writes the log.
//!
//! ## Layers
//!
//! Each module imports only from the layers beneath it (`tests/layers.rs` reads `src/` and fails
//! on a cycle or an import against this order):
//!
//! 1. foundations, importing nothing of the crate: [`tokenizer`], [`identity`], [`store`],
//!    [`config`], [`metrics`], [`log_writer`];
//! 2. [`dialect`]: the seam and, each in its own folder, the wire formats; beside it
//!    [`telemetry`], which knows only the configuration;
//! 3. [`measure`], then [`compaction`] (the core: it imports the seam, never a dialect);
//! 4. [`upstream`], then [`http`], then [`server`], [`workers`] and [`cli`].

pub mod cli;
pub mod compaction;
pub mod config;
pub mod dialect;
pub mod http;
pub mod identity;
pub mod log_writer;
pub mod measure;
pub mod metrics;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tokenizer;
pub mod upstream;
pub mod workers;
