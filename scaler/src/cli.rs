//! Command-line interface: argument types and dispatch. `main` only calls [`run`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::engine::EngineOptions;
use crate::serve::ServeOptions;

#[derive(Debug, Parser)]
#[command(name = "prescale", version, about = "Warm-up-aware KEDA external scaler for GPU inference fleets")]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"], env = "PRESCALE_LOG_FORMAT")]
    pub log_format: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve KEDA's external scaler gRPC API and the HTTP endpoints.
    Serve(ServeArgs),
    /// Validate a ScaledObject YAML (or a bare metadata map) offline, as `serve` would parse it.
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "0.0.0.0:9090", env = "PRESCALE_GRPC_ADDR")]
    pub grpc_addr: SocketAddr,
    #[arg(long, default_value = "0.0.0.0:8080", env = "PRESCALE_HTTP_ADDR")]
    pub http_addr: SocketAddr,
    /// PEM certificate for TLS on the gRPC port.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS on the gRPC port.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: require client certificates signed by it (mutual TLS).
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Drop a ScaledObject not asked about for this many seconds.
    #[arg(long, default_value_t = 600.0)]
    pub idle_drop_seconds: f64,
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// ScaledObject YAML file (several documents allowed), or `-` for stdin.
    pub file: PathBuf,
    /// Resolve a `*FromEnv` key's env var, as KEDA would: NAME=VALUE (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub env: Vec<String>,
}

pub fn init_tracing(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,h2=warn,tower=warn,hyper=warn,lapin=warn"));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if format == "json" {
        b.json().init();
    } else {
        b.init();
    }
}

/// Run the parsed command; returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Serve(a) => {
            init_tracing(&cli.log_format);
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(async {
                let opts = ServeOptions {
                    grpc_addr: a.grpc_addr,
                    http_addr: a.http_addr,
                    tls_cert: a.tls_cert,
                    tls_key: a.tls_key,
                    tls_client_ca: a.tls_client_ca,
                    engine: EngineOptions {
                        idle_drop: Duration::from_secs_f64(a.idle_drop_seconds.max(0.1)),
                        ..EngineOptions::default()
                    },
                };
                crate::serve::serve(opts, shutdown_signal()).await
            })?;
            Ok(0)
        }
        Command::Check(a) => {
            let text = if a.file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading stdin")?
            } else {
                std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?
            };
            let mut env = BTreeMap::new();
            for kv in &a.env {
                let (k, v) = kv.split_once('=').with_context(|| format!("--env {kv}: expected NAME=VALUE"))?;
                env.insert(k.to_string(), v.to_string());
            }
            let checked = crate::check::check(&text, &env)?;
            let bad = checked.iter().any(|c| !c.errors.is_empty());
            for c in &checked {
                if c.errors.is_empty() {
                    println!("ok: {} trigger {}", c.scaled_object, c.trigger);
                } else {
                    println!("invalid: {} trigger {}", c.scaled_object, c.trigger);
                    for e in &c.errors {
                        println!("  error: {e}");
                    }
                }
                for n in &c.notes {
                    println!("  note: {n}");
                }
            }
            println!("{}", serde_json::to_string_pretty(&checked)?);
            Ok(if bad { 1 } else { 0 })
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
