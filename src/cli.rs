//! The command line: `serve`, `check-config`, `count`, `compact`.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};

use crate::compaction::{Mode, RequestContext};
use crate::config::{redact_url, CliOverrides, Config, LogFormat};
use crate::dialect::chat::request::ChatRequest;
use crate::measure::{windows::WindowTable, Meter};

#[derive(Debug, Parser)]
#[command(
    name = "compactor",
    version,
    about = "An OpenAI-compatible proxy that compacts long conversations"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct Common {
    /// Configuration file (TOML). Without it, the embedded defaults apply.
    #[arg(long, short = 'c', env = "COMPACTOR_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy.
    Serve {
        #[command(flatten)]
        common: Common,
        /// Address to listen on (default 127.0.0.1:8787).
        #[arg(long)]
        listen: Option<String>,
        /// Base URL of the provider (default https://api.openai.com/v1).
        #[arg(long)]
        upstream: Option<String>,
        /// Checkpoint store: a SQLite file path, `memory`, or `redis://…`.
        #[arg(long)]
        store: Option<String>,
        #[arg(long, value_enum)]
        log_format: Option<LogFormatArg>,
    },
    /// Validate the configuration and print it, secrets redacted.
    CheckConfig {
        #[command(flatten)]
        common: Common,
    },
    /// Read a gateway key from stdin and print the hash to list in the gateway keys file.
    HashKey,
    /// Count the tokens of a chat request body (a file, or `-` for stdin).
    Count {
        #[command(flatten)]
        common: Common,
        #[arg(default_value = "-")]
        file: String,
    },
    /// Run the compaction path on a request body and print the rewritten request.
    Compact {
        #[command(flatten)]
        common: Common,
        file: String,
        /// The model's context window, in tokens.
        #[arg(long)]
        window: Option<u64>,
        /// Compact even when the request fits.
        #[arg(long)]
        force: bool,
        /// Provider for the summary request (default: the configured upstream).
        #[arg(long)]
        upstream: Option<String>,
    },
}

fn load(common: &Common, overrides: &CliOverrides) -> Result<Config, String> {
    Config::load(common.config.as_deref(), std::env::vars(), overrides).map_err(|e| e.to_string())
}

fn read_input(file: &str) -> Result<Vec<u8>, String> {
    if file == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| format!("stdin: {e}"))?;
        Ok(buf)
    } else {
        std::fs::read(file).map_err(|e| format!("{file}: {e}"))
    }
}

/// Runs a subcommand other than `serve`.
pub async fn run_tool(command: Command) -> Result<(), String> {
    match command {
        Command::CheckConfig { common } => {
            let config = load(&common, &CliOverrides::default())?;
            print!("{}", config.redacted_toml());
            Ok(())
        }
        Command::HashKey => {
            let mut key = String::new();
            std::io::stdin()
                .read_to_string(&mut key)
                .map_err(|e| format!("stdin: {e}"))?;
            let key = key.trim();
            if key.is_empty() {
                return Err("no key on stdin".into());
            }
            println!("{}", crate::http::gateway_keys::hash_key(key));
            Ok(())
        }
        Command::Count { common, file } => {
            let config = load(&common, &CliOverrides::default())?;
            let body = read_input(&file)?;
            let request = ChatRequest::parse(&body).map_err(|e| e.to_string())?;
            let measured = Meter::new(1024).measure(&request);
            for (i, (message, facts)) in request.messages.iter().zip(&measured.elements).enumerate()
            {
                println!("{i:>5}  {:<10} {:>8}", message.role.as_str(), facts.tokens);
            }
            if measured.head_tokens > 0 {
                println!("{:>5}  {:<10} {:>8}", "", "tools", measured.head_tokens);
            }
            let total = measured.total();
            let (window, _) = WindowTable::new(&config.windows, config.default_window)
                .window(&request.settings.model, None);
            // No correction is applied here: it is learned from a provider's answers.
            println!(
                "total {total} tokens ({:?} encoding), model {}",
                measured.encoding, request.settings.model
            );
            println!(
                "window {window} tokens, {:.1}% used",
                total as f64 * 100.0 / window as f64
            );
            Ok(())
        }
        Command::Compact {
            common,
            file,
            window,
            force,
            upstream,
        } => {
            let mut config = load(
                &common,
                &CliOverrides {
                    upstream,
                    store: Some("memory".into()),
                    ..Default::default()
                },
            )?;
            let body = read_input(&file)?;
            let request = ChatRequest::parse(&body).map_err(|e| e.to_string())?;
            if let Some(w) = window {
                config
                    .windows
                    .insert(request.settings.model.to_ascii_lowercase(), w);
            }
            config.compaction.ahead_of_time = false;
            let app = crate::server::build(&config).await?;
            let credential = std::env::var("OPENAI_API_KEY").unwrap_or_default();
            let mut credentials = http::HeaderMap::new();
            if !credential.is_empty() {
                let value = http::HeaderValue::from_str(&format!("Bearer {credential}"))
                    .map_err(|e| e.to_string())?;
                credentials.insert(http::header::AUTHORIZATION, value);
            }
            let context = RequestContext {
                tenant: crate::identity::tenant(""),
                credentials: Arc::new(credentials),
                mode: if force { Mode::Force } else { Mode::Auto },
                instructions: None,
                edits_served: false,
            };
            let started = std::time::Instant::now();
            let request: Arc<dyn crate::dialect::WireRequest> = Arc::new(request);
            let prepared = Arc::clone(&app.engine)
                .prepare(&context, &request)
                .await
                .map_err(|e| e.to_string())?;
            let o = &prepared.outcome;
            println!("{}", String::from_utf8_lossy(&prepared.body));
            eprintln!(
                "window {} | tokens before {} | after {} | compacted {} | summary {} ms | proxy {} ms{}",
                o.window,
                o.tokens_before,
                o.tokens_after,
                o.compacted,
                o.summary_time.as_millis(),
                started.elapsed().saturating_sub(o.summary_time).as_millis(),
                o.status.as_ref().map(|s| format!(" | {}", s.header_value())).unwrap_or_default()
            );
            Ok(())
        }
        Command::Serve { .. } => Err("serve is not a tool command".into()),
    }
}

/// Runs `serve`.
pub async fn run_serve(
    common: Common,
    overrides: CliOverrides,
    init_logs: impl FnOnce(LogFormat),
) -> Result<(), String> {
    let config = load(&common, &overrides)?;
    init_logs(config.log_format);
    Meter::warm_up();
    let workers = crate::workers::count(config.workers);
    let (listener, more_listeners) = crate::workers::bind(&config.listen, workers)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let app = crate::server::build(&config).await?;
    let listen = listener
        .local_addr()
        .map_or_else(|_| config.listen.clone(), |a| a.to_string());
    if let Some(warning) = config.open_relay_warning() {
        tracing::warn!("{warning}");
    }
    if let Some(keys) = &app.gateway_keys {
        tracing::info!(keys = keys.len(), "Gateway keys required.");
    }
    let grace = std::time::Duration::from_millis(config.shutdown_grace_ms);
    let others = crate::workers::start(more_listeners, &app, grace);
    tracing::info!(listen = %listen, upstream = %redact_url(&config.upstream), store = app.engine.store().kind(), workers = others.len() + 1, "Compactor is listening.");
    let stop_others = others.stopper();
    let shutdown = async move {
        crate::server::shutdown_signal().await;
        stop_others.cancel();
    };
    let served = crate::server::serve_connections(listener, app.clone(), shutdown, grace).await;
    others.finish().await;
    // The spans of the requests just drained are still queued: sent before the process ends.
    app.telemetry.shutdown().await;
    served.map_err(|e| e.to_string())
}

impl From<LogFormatArg> for LogFormat {
    fn from(v: LogFormatArg) -> LogFormat {
        match v {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        }
    }
}

/// Exit code for a failed command.
pub fn fail(message: &str) -> ExitCode {
    eprintln!("compactor: {message}");
    ExitCode::FAILURE
}
