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
    /// Print the trigger metadata reference (every key, its default and meaning) as markdown.
    Keys,
    /// A do-nothing ExternalScaler: the floor the load benchmark compares `serve` against.
    #[command(hide = true)]
    Floor {
        #[arg(long, default_value = "127.0.0.1:0")]
        grpc_addr: SocketAddr,
    },
    /// Dry-run the planner on a trace (file, Prometheus range, or the bundled default) and score it.
    Replay(ReplayArgs),
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Trace file (REPLAY.md formats). Without --trace or --prometheus, the bundled
    /// servegen-m-large-14d trace is replayed with capacity 25 and SLO 5.
    #[arg(long, conflicts_with = "prometheus")]
    pub trace: Option<PathBuf>,
    /// Prometheus base URL to pull the demand history from (with --query or --scaled-object,
    /// and --start/--end).
    #[arg(long, requires_all = ["start", "end"])]
    pub prometheus: Option<String>,
    /// PromQL returning one series of demand in requests/s, e.g. 'sum(rate(vllm:request_success_total[1m]))'.
    #[arg(long, requires = "prometheus")]
    pub query: Option<String>,
    /// NAMESPACE/NAME: replay the demand `serve` observed for this ScaledObject
    /// (prescale_observed_demand_replicas, in replica-equivalents: --capacity defaults to 1).
    #[arg(long, requires = "prometheus", conflicts_with = "query")]
    pub scaled_object: Option<String>,
    /// Start: unix seconds, RFC 3339, `now` or `now-7d`.
    #[arg(long, allow_hyphen_values = true)]
    pub start: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    pub end: Option<String>,
    /// Range-query step (e.g. 15s, 1m): the width of one trace window.
    #[arg(long, default_value = "15s")]
    pub step: String,
    /// Requests/s one ready replica completes (μ).
    #[arg(long)]
    pub capacity: Option<f64>,
    /// Warm-up W in seconds (node + image pull + model load).
    #[arg(long, default_value_t = 180)]
    pub warmup: u64,
    /// Seconds of queueing a request may see.
    #[arg(long)]
    pub slo: Option<f64>,
    /// Decision interval in seconds (1 to 86,400).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub interval: u64,
    #[arg(long, default_value_t = 0)]
    pub min_replicas: u32,
    /// Default: max(2 × the oracle's largest count, 2) (REPLAY.md).
    #[arg(long)]
    pub max_replicas: Option<u32>,
    /// Default: the oracle's largest count over the first W/I + 2 intervals (REPLAY.md).
    #[arg(long)]
    pub initial_replicas: Option<u32>,
    #[arg(long, value_enum, default_value = "all")]
    pub policy: crate::replay::Which,
    /// Write the plan (`t_s,desired`) of the first policy listed, then `reason` (prescale's; empty
    /// for the reference policies), `ready`, `warming`, `backlog` and `late` per decision interval.
    #[arg(long)]
    pub plan_out: Option<PathBuf>,
    /// Write the summary JSON.
    #[arg(long)]
    pub summary_out: Option<PathBuf>,
    /// Draw the chart: a PNG if the name ends in .png, else an SVG.
    #[arg(long)]
    pub chart: Option<PathBuf>,
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
    /// Drop a ScaledObject not asked about for this many seconds (or for twice the longest
    /// gap between calls it has seen, up to a day, where KEDA polls it less often).
    #[arg(long, default_value_t = 600.0)]
    pub idle_drop_seconds: f64,
    /// Prometheus that scrapes prescale's /metrics: a new ScaledObject's planner is warmed
    /// from the demand prescale observed for it there (prescale_observed_demand_replicas), so
    /// a restart keeps its daily and weekly patterns.
    #[arg(long, env = "PRESCALE_HISTORY_PROMETHEUS")]
    pub history_prometheus: Option<String>,
    /// How far back the warm start reads (the planner keeps up to 8 days).
    #[arg(long, default_value = "8d", env = "PRESCALE_HISTORY_LOOKBACK", value_parser = humantime::parse_duration)]
    pub history_lookback: Duration,
    /// Serve the Kubernetes external metrics API (HTTPS) on this address, e.g. 0.0.0.0:6443.
    #[arg(long, requires_all = ["external_metrics_config", "external_metrics_cert", "external_metrics_key"])]
    pub external_metrics_addr: Option<SocketAddr>,
    /// YAML naming the metrics: `metrics: [{name, labels?, metadata: {…trigger metadata…}}]`.
    #[arg(long)]
    pub external_metrics_config: Option<PathBuf>,
    /// PEM serving certificate for the external metrics API (re-read when it changes).
    #[arg(long)]
    pub external_metrics_cert: Option<PathBuf>,
    /// PEM private key for the external metrics API (re-read when it changes).
    #[arg(long)]
    pub external_metrics_key: Option<PathBuf>,
    /// Front-proxy (request-header) CA file; default: the kube-system/extension-apiserver-authentication ConfigMap.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Allowed front-proxy certificate CNs (comma-separated); empty allows any CN from the request-header CA.
    #[arg(long, value_delimiter = ',')]
    pub requestheader_allowed_names: Vec<String>,
    /// CA for client-certificate users of the external metrics API.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
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
                        history: a.history_prometheus.clone().map(|server| crate::engine::history::HistoryOptions {
                            server,
                            lookback: a.history_lookback,
                        }),
                        ..EngineOptions::default()
                    },
                    external_metrics: a.external_metrics_addr.map(|addr| crate::extmetrics::ExtOptions {
                        addr,
                        config: a.external_metrics_config.clone().unwrap_or_default(),
                        cert: a.external_metrics_cert.clone().unwrap_or_default(),
                        key: a.external_metrics_key.clone().unwrap_or_default(),
                        requestheader_ca: a.requestheader_client_ca_file.clone(),
                        allowed_names: a.requestheader_allowed_names.clone(),
                        client_ca: a.client_ca_file.clone(),
                    }),
                };
                crate::serve::serve(opts, shutdown_signal()).await
            })?;
            Ok(0)
        }
        Command::Replay(a) => run_replay(a),
        Command::Floor { grpc_addr } => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(crate::floor::serve(grpc_addr))?;
            Ok(0)
        }
        Command::Keys => {
            emit(&crate::config::markdown_table())?;
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
            // A closed pipe (`prescale check f | head`) ends output quietly; any other write
            // error (a full disk) is an error: a report that was not written is not a pass.
            quiet_broken_pipe(print_checked(&checked)).context("writing the check report")?;
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

/// `NAMESPACE/NAME` of `--scaled-object`.
fn scaled_object_id(s: &str) -> anyhow::Result<crate::config::ScalerId> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(crate::config::ScalerId { namespace: ns.to_string(), name: name.to_string() })
        }
        _ => anyhow::bail!("--scaled-object {s:?}: expected NAMESPACE/NAME"),
    }
}

fn run_replay(a: ReplayArgs) -> anyhow::Result<i32> {
    use crate::replay;
    let bundled = a.trace.is_none() && a.prometheus.is_none();
    // A ScaledObject's own observed demand is in replica-equivalents: one replica serves 1.
    let own = a.scaled_object.as_deref().map(scaled_object_id).transpose()?;
    if a.prometheus.is_some() && a.query.is_none() && own.is_none() {
        anyhow::bail!("--prometheus needs --query (PromQL for the demand) or --scaled-object NAMESPACE/NAME");
    }
    if !bundled && ((a.capacity.is_none() && own.is_none()) || a.slo.is_none()) {
        anyhow::bail!(
            "--capacity (requests/s one replica serves) and --slo (seconds of queueing allowed) are required with --trace or --prometheus"
        );
    }
    let (trace, name, default_capacity, default_slo) = if let Some(server) = &a.prometheus {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
        let step = humantime::parse_duration(&a.step).with_context(|| format!("--step {}", a.step))?.as_secs().max(1);
        let q = replay::prom::RangeQuery {
            server: server.clone(),
            query: match &own {
                Some(id) => crate::engine::history::query_for(id),
                None => a.query.clone().unwrap_or_default(),
            },
            start: replay::prom::parse_time(a.start.as_deref().unwrap_or_default(), now).map_err(anyhow::Error::msg)?,
            end: replay::prom::parse_time(a.end.as_deref().unwrap_or_default(), now).map_err(anyhow::Error::msg)?,
            step_s: step,
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (trace, gaps) = rt
            .block_on(replay::prom::fetch(&reqwest::Client::new(), &q))
            .map_err(|e| anyhow::anyhow!("{}: {e}", crate::redact::redact_url(server)))?;
        if gaps > 0 {
            eprintln!("note: {gaps} steps had no sample and repeat the previous value");
        }
        let capacity = own.is_some().then_some(1.0);
        (trace, format!("{} from {}", q.query, crate::redact::redact_url(server)), capacity, None)
    } else if let Some(path) = &a.trace {
        // Streamed line by line: a week of a busy service's request log is hundreds of MB.
        let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
        let trace =
            replay::read_trace_file(std::io::BufReader::new(file)).with_context(|| path.display().to_string())?;
        (trace, path.display().to_string(), None, None)
    } else {
        (replay::load_trace(replay::BUNDLED_TRACE)?, replay::BUNDLED_NAME.to_string(), Some(25.0), Some(5.0))
    };
    let capacity = a
        .capacity
        .or(default_capacity)
        .context("--capacity (requests/s one replica serves) is required with --trace or --prometheus")?;
    let slo = a
        .slo
        .or(default_slo)
        .context("--slo (seconds of queueing allowed) is required with --trace or --prometheus")?;
    let opts = replay::ReplayOptions {
        capacity,
        warmup: a.warmup,
        slo,
        interval: a.interval,
        min_replicas: a.min_replicas,
        max_replicas: a.max_replicas,
        initial_replicas: a.initial_replicas,
        policy: a.policy,
        plan_out: a.plan_out,
        summary_out: a.summary_out,
        chart: a.chart,
        progress: true,
    };
    let r = replay::replay(&trace, &name, &opts)?;
    emit(&replay::scorecard(&r.summary))?;
    replay::write_outputs(&r, &opts)?;
    for (what, p) in [("plan", &opts.plan_out), ("summary", &opts.summary_out), ("chart", &opts.chart)] {
        if let Some(p) = p {
            emit(&format!("wrote {what}: {}\n", p.display()))?;
        }
    }
    Ok(0)
}

/// Writes `text` to stdout. A reader that has gone (`prescale replay | head -3`) is not an
/// error: it has what it wanted, so the rest is dropped quietly, and the files the command
/// writes are still written. (`print!` panics on a closed pipe.)
fn emit(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    quiet_broken_pipe(out.write_all(text.as_bytes()).and_then(|()| out.flush()))
}

fn quiet_broken_pipe(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

fn print_checked(checked: &[crate::check::Checked]) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for c in checked {
        if c.errors.is_empty() {
            writeln!(out, "ok: {} trigger {}", c.scaled_object, c.trigger)?;
        } else {
            writeln!(out, "invalid: {} trigger {}", c.scaled_object, c.trigger)?;
            for e in &c.errors {
                writeln!(out, "  error: {e}")?;
            }
        }
        for n in &c.notes {
            writeln!(out, "  note: {n}")?;
        }
    }
    writeln!(out, "{}", serde_json::to_string_pretty(checked).unwrap_or_default())
}
