//! Compactor: a proxy that speaks the OpenAI and Anthropic APIs and compacts long agent
//! conversations transparently.
//!
//! A request travels one way through these modules, whatever its wire format:
//!
//! 1. [`http`] receives it (the only module that knows axum), reads the body within its limit,
//!    and picks the [`dialect`] of its route: chat completions, Anthropic Messages, Responses.
//! 2. The dialect parses it into a [`dialect::WireRequest`]: the conversation as elements (each
//!    with its role, original bytes, canonical hash, transcript and token count), every field's
//!    original bytes kept. [`request`] is the chat dialect's parser.
//! 3. [`identity`] hashes the elements into a chain seeded with the tenant; [`measure`] counts
//!    tokens (cached per element) and knows each model's window.
//! 4. [`compaction`] applies the newest stored checkpoint whose prefix matches, and when the
//!    request is still too large, plans a cut, asks for a summary (a [`compaction::Summarizer`],
//!    in the provider's own dialect), stores the new checkpoint in the [`store`], and has the
//!    dialect render the body through it. The engine never reads a wire format.
//! 5. [`upstream`] forwards the body to the provider (the only module that knows reqwest);
//!    [`http`] streams the answer back, reading `usage` in the dialect to calibrate counts, and
//!    when the dialect recognises a context-overflow error ([`measure::overflow`]), retries once.
//!
//! [`config`] loads settings, [`metrics`] exports Prometheus counters, [`server`] builds the
//! application and serves it with graceful shutdown, [`cli`] holds the subcommands.
//! [`fidelity`] scores summaries against the span they replaced (the `fidelity` benchmark).

pub mod cli;
pub mod compaction;
pub mod config;
pub mod dialect;
pub mod fidelity;
pub mod http;
pub mod identity;
pub mod measure;
pub mod metrics;
pub mod request;
pub mod server;
pub mod store;
pub mod upstream;
