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

/// The gRPC port's TLS: the reloading serving configuration and the client CA file of
/// mutual TLS, with the CAs read from it at start-up and that file's modification time.
struct GrpcTls {
    serving: Arc<crate::tls::Reloading>,
    client_ca: Option<PathBuf>,
    cas: Vec<rustls::pki_types::CertificateDer<'static>>,
    ca_stamp: Option<std::time::SystemTime>,
}

/// The gRPC port's TLS, when configured.
fn grpc_tls(opts: &ServeOptions) -> Result<Option<GrpcTls>, ServeError> {
    let tls_err = |e: crate::tls::TlsError| ServeError::Tls(e.to_string());
    match (&opts.tls_cert, &opts.tls_key) {
        (Some(cert), Some(key)) => {
            let ca_stamp = opts.tls_client_ca.as_deref().and_then(crate::tls::mtime);
            let cas = match &opts.tls_client_ca {
                Some(ca) => crate::tls::read_certs(ca).map_err(tls_err)?,
                None => Vec::new(),
            };
            let serving = crate::tls::Serving {
                what: "gRPC",
                cert: cert.clone(),
                key: key.clone(),
                client_certs: crate::tls::ClientCerts::Required,
                alpn: vec![b"h2".to_vec()],
            };
            let reloading = crate::tls::Reloading::new(serving, &cas).map_err(tls_err)?;
            Ok(Some(GrpcTls { serving: Arc::new(reloading), client_ca: opts.tls_client_ca.clone(), cas, ca_stamp }))
        }
        (None, None) if opts.tls_client_ca.is_some() => {
            Err(ServeError::Tls("--tls-client-ca needs --tls-cert and --tls-key".into()))
        }
        (None, None) => Ok(None),
        _ => Err(ServeError::Tls("--tls-cert and --tls-key go together".into())),
    }
}

/// Re-read the gRPC port's certificate, key and client CA when their files change, until
/// `stop`, starting from what start-up read. A client CA file that no longer reads is logged
/// and the previous CAs kept (an empty list would rebuild the port without client auth).
async fn reload_grpc_tls(tls: GrpcTls, mut stop: tokio::sync::watch::Receiver<bool>) {
    let GrpcTls { serving: tls, client_ca, mut cas, mut ca_stamp } = tls;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(crate::tls::Reloading::POLL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let mut force = false;
        if let Some(p) = &client_ca {
            let stamp = crate::tls::mtime(p);
            if stamp != ca_stamp {
                match crate::tls::read_certs(p) {
                    Ok(read) => {
                        (cas, ca_stamp, force) = (read, stamp, true);
                    }
                    Err(e) => tracing::error!(error = %e, "gRPC TLS: keeping the previous client CA"),
                }
            }
        }
        tls.maybe_reload(&cas, force);
    }
}

/// The gRPC port's connections over TLS: each accepted connection's handshake
/// ([`crate::tls::Reloading::accept`]) runs on its own task.
fn tls_incoming(
    listener: tokio::net::TcpListener,
    tls: Arc<crate::tls::Reloading>,
) -> tokio_stream::wrappers::ReceiverStream<
    Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>, std::io::Error>,
> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                r = listener.accept() => match r {
                    Ok((tcp, _)) => tcp,
                    Err(e) => {
                        tracing::warn!(error = %e, "gRPC: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                if let Some(stream) = tls.accept(tcp).await {
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
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
    // TLS is terminated here rather than by tonic's own TLS settings, which read the
    // certificate once: the serving pair is re-read when cert-manager renews it.
    let tls = grpc_tls(&opts)?;

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
    let router = builder.add_service(service);
    let server: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>> =
        match tls {
            Some(tls) => {
                let serving = tls.serving.clone();
                tokio::spawn(reload_grpc_tls(tls, stop_rx.clone()));
                Box::pin(router.serve_with_incoming_shutdown(tls_incoming(grpc_listener, serving), grpc_stop))
            }
            None => Box::pin(router.serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(grpc_listener),
                grpc_stop,
            )),
        };
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
