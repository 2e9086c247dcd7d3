//! `prescale serve`: gRPC (KEDA) + HTTP (health, metrics, debug), graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{Engine, EngineOptions};
use crate::metrics::Metrics;

/// How long in-flight requests may finish after SIGTERM.
const DRAIN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    pub engine: EngineOptions,
    /// The optional HTTPS external metrics API.
    pub external_metrics: Option<crate::extmetrics::ExtOptions>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot bind {what} on {addr}: {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
    #[error(transparent)]
    ExternalMetrics(#[from] crate::extmetrics::ExtError),
}

fn read(path: &PathBuf, what: &str) -> Result<Vec<u8>, ServeError> {
    std::fs::read(path).map_err(|e| ServeError::Tls(format!("cannot read {what} {}: {e}", path.display())))
}

/// Run until `shutdown` resolves (SIGTERM / Ctrl-C in the binary).
pub async fn serve(
    opts: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let metrics = Arc::new(Metrics::new());
    let engine = Engine::new(opts.engine.clone(), metrics.clone());
    // cluster: optional Kubernetes integration; logs which features are on/off, never fails.
    engine.set_cluster(crate::cluster::Cluster::start(crate::cluster::ClusterOptions::from_env(), metrics).await);
    let janitor = engine.spawn_janitor();
    let ready = Arc::new(AtomicBool::new(false));

    let mut builder =
        tonic::transport::Server::builder().http2_keepalive_interval(Some(Duration::from_secs(30))).tcp_nodelay(true);
    match (&opts.tls_cert, &opts.tls_key) {
        (Some(c), Some(k)) => {
            let identity = tonic::transport::Identity::from_pem(read(c, "certificate")?, read(k, "key")?);
            let mut tls = tonic::transport::ServerTlsConfig::new().identity(identity);
            if let Some(ca) = &opts.tls_client_ca {
                tls = tls.client_ca_root(tonic::transport::Certificate::from_pem(read(ca, "client CA")?));
            }
            builder = builder.tls_config(tls)?;
        }
        (None, None) if opts.tls_client_ca.is_some() => {
            return Err(ServeError::Tls("--tls-client-ca needs --tls-cert and --tls-key".into()))
        }
        (None, None) => {}
        _ => return Err(ServeError::Tls("--tls-cert and --tls-key go together".into())),
    }

    let grpc_listener = tokio::net::TcpListener::bind(opts.grpc_addr).await.map_err(|source| ServeError::Bind {
        what: "gRPC",
        addr: opts.grpc_addr,
        source,
    })?;
    let http_listener = tokio::net::TcpListener::bind(opts.http_addr).await.map_err(|source| ServeError::Bind {
        what: "HTTP",
        addr: opts.http_addr,
        source,
    })?;
    let grpc_local = grpc_listener.local_addr().map_err(ServeError::Http)?;
    let http_local = http_listener.local_addr().map_err(ServeError::Http)?;
    tracing::info!(grpc = %grpc_local, http = %http_local, tls = opts.tls_cert.is_some(), mtls = opts.tls_client_ca.is_some(), "prescale serving");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let ext = match opts.external_metrics.clone() {
        Some(ext_opts) => {
            // Validate the config before serving anything: a bad metrics file is a start-up error.
            crate::extmetrics::load(&ext_opts.config)?;
            let (engine, rx) = (engine.clone(), stop_rx.clone());
            Some(tokio::spawn(async move { crate::extmetrics::serve(engine, ext_opts, rx).await }))
        }
        None => None,
    };

    let app = crate::http::router(crate::http::HttpState { engine: engine.clone(), ready: ready.clone() });
    let http_stop = wait_stop(stop_rx.clone());
    let http = tokio::spawn(async move { axum::serve(http_listener, app).with_graceful_shutdown(http_stop).await });

    let service = crate::grpc::Service::new(engine.clone()).into_server();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc_listener);
    ready.store(true, Ordering::Relaxed);
    let ready2 = ready.clone();
    let grpc_stop = {
        let rx = stop_rx.clone();
        async move {
            wait_stop(rx).await;
            ready2.store(false, Ordering::Relaxed);
            tracing::info!("shutting down");
        }
    };
    // Graceful, but bounded: a client that never closes its connection (KEDA holds
    // StreamIsActive open) must not keep a terminating pod alive past the drain time.
    let server = builder.add_service(service).serve_with_incoming_shutdown(incoming, grpc_stop);
    let drain_deadline = {
        let rx = stop_rx.clone();
        async move {
            wait_stop(rx).await;
            tokio::time::sleep(DRAIN).await;
            tracing::warn!("connections still open after {DRAIN:?}: closing them");
        }
    };
    let res = tokio::select! {
        r = server => r,
        _ = drain_deadline => Ok(()),
    };
    janitor.abort();
    if let Some(ext) = ext {
        match tokio::time::timeout(DRAIN, ext).await {
            Ok(Ok(Err(e))) => return Err(e.into()),
            Ok(Err(e)) => tracing::warn!(error = %e, "external metrics task ended abnormally"),
            _ => {}
        }
    }
    match tokio::time::timeout(DRAIN, http).await.unwrap_or(Ok(Ok(()))) {
        Ok(Err(e)) => return Err(ServeError::Http(e)),
        Err(e) => tracing::warn!(error = %e, "HTTP task ended abnormally"),
        Ok(Ok(())) => {}
    }
    res?;
    tracing::info!("stopped");
    Ok(())
}
