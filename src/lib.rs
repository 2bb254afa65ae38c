//! Compactor: an OpenAI-compatible proxy that compacts long agent conversations transparently.
//!
//! A chat request travels one way through these modules:
//!
//! 1. [`http`] receives it (the only module that knows axum) and reads the body within its limit.
//! 2. [`request`] parses it, keeping every field's original bytes and a typed view of messages.
//! 3. [`identity`] hashes the messages into a chain seeded with the tenant; [`measure`] counts
//!    tokens (cached per message) and knows each model's window.
//! 4. [`compaction`] applies the newest stored checkpoint whose prefix matches, and when the
//!    request is still too large, plans a cut, asks for a summary, stores the new checkpoint
//!    in the [`store`], and rewrites the messages.
//! 5. [`upstream`] forwards the body to the provider (the only module that knows reqwest);
//!    [`http`] streams the answer back, reading `usage` to calibrate counts, and when
//!    [`measure::overflow`] recognises a context-overflow error, retries once.
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
