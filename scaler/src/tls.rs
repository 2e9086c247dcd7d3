//! The serving certificate of prescale's TLS ports: the gRPC port KEDA calls and the external
//! metrics API. The certificate and key are re-read when their files change (a certificate
//! that cert-manager renews reaches new connections without a restart; a pod older than the
//! certificate's lifetime would otherwise serve an expired one, and KEDA's calls, fallback
//! included, would fail the handshake). A broken new pair is logged and the previous one kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{0}")]
    Config(String),
}

/// Every PEM certificate in the file at `path` (at least one).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let what = path.display().to_string();
    match CertificateDer::pem_file_iter(path) {
        Ok(certs) => at_least_one(certs.collect(), &what),
        Err(e) => Err(TlsError::Read { path: what, reason: e.to_string() }),
    }
}

/// Every PEM certificate in `pem` (at least one); `what` names it in an error.
pub fn certs_from_pem(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    at_least_one(CertificateDer::pem_slice_iter(pem.as_bytes()).collect(), what)
}

/// The certificates parsed from the PEM source `what`, which must hold one at least.
fn at_least_one(
    certs: Result<Vec<CertificateDer<'static>>, rustls::pki_types::pem::Error>,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    match certs {
        Ok(certs) if certs.is_empty() => {
            Err(TlsError::Read { path: what.into(), reason: "no PEM certificate in it".into() })
        }
        Ok(certs) => Ok(certs),
        Err(e) => Err(TlsError::Read { path: what.into(), reason: e.to_string() }),
    }
}

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// What a port asks of its clients' certificates when it has client CAs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts {
    /// Asked for, not required: the handler decides (the external metrics API also takes
    /// bearer tokens).
    Optional,
    /// Required, chained to a client CA (mutual TLS on the gRPC port).
    Required,
}

/// One TLS port's serving settings.
#[derive(Debug, Clone)]
pub struct Serving {
    /// Names the port in the log.
    pub what: &'static str,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_certs: ClientCerts,
    /// ALPN protocols offered, most preferred first.
    pub alpn: Vec<Vec<u8>>,
}

/// The rustls configuration of `s` with `client_cas` (none: no client certificates asked for).
pub fn server_config(s: &Serving, client_cas: &[CertificateDer<'static>]) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = read_certs(&s.cert)?;
    let key = PrivateKeyDer::from_pem_file(&s.key)
        .map_err(|e| TlsError::Read { path: s.key.display().to_string(), reason: e.to_string() })?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = if client_cas.is_empty() {
        builder.with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        for c in client_cas {
            roots.add(c.clone()).map_err(|e| TlsError::Config(format!("bad CA certificate: {e}")))?;
        }
        let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
        let v = match s.client_certs {
            ClientCerts::Optional => v.allow_unauthenticated(),
            ClientCerts::Required => v,
        };
        builder.with_client_cert_verifier(v.build().map_err(|e| TlsError::Config(e.to_string()))?)
    };
    let mut cfg =
        builder.with_single_cert(certs, key).map_err(|e| TlsError::Config(format!("certificate/key: {e}")))?;
    cfg.alpn_protocols = s.alpn.clone();
    Ok(Arc::new(cfg))
}

/// The serving configuration, rebuilt when the certificate/key files or the CAs change.
pub struct Reloading {
    serving: Serving,
    current: RwLock<(Arc<ServerConfig>, Option<SystemTime>)>,
}

/// The modification time of the file at `p` (through symlinks: a Secret volume swaps its
/// `..data` link, and the files it points to are new).
pub fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl Reloading {
    /// How often the files are looked at.
    pub const POLL: Duration = Duration::from_secs(2);
    /// The longest a client may take over its TLS handshake.
    pub const HANDSHAKE: Duration = Duration::from_secs(10);

    pub fn new(serving: Serving, client_cas: &[CertificateDer<'static>]) -> Result<Self, TlsError> {
        let cfg = server_config(&serving, client_cas)?;
        let stamp = mtime(&serving.cert).max(mtime(&serving.key));
        Ok(Self { serving, current: RwLock::new((cfg, stamp)) })
    }

    /// The configuration for the next connection.
    pub fn get(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// The TLS handshake of an accepted connection, with the configuration current now and
    /// bounded to [`Self::HANDSHAKE`] (a client that stalls it holds nothing up); None, logged
    /// at debug, when it fails or times out.
    pub async fn accept(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.get());
        match tokio::time::timeout(Self::HANDSHAKE, acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                tracing::debug!(error = %e, port = self.serving.what, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(port = self.serving.what, "TLS handshake timed out");
                None
            }
        }
    }

    /// Rebuild when the files changed (or `force`, e.g. the CAs rotated). A broken new
    /// pair is logged and the previous one kept.
    pub fn maybe_reload(&self, client_cas: &[CertificateDer<'static>], force: bool) {
        let s = &self.serving;
        let stamp = mtime(&s.cert).max(mtime(&s.key));
        let changed = stamp != self.current.read().unwrap_or_else(|e| e.into_inner()).1;
        if !changed && !force {
            return;
        }
        match server_config(s, client_cas) {
            Ok(cfg) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (cfg, stamp);
                tracing::info!(cert = %s.cert.display(), port = s.what, "TLS configuration reloaded");
            }
            Err(e) => tracing::error!(error = %e, port = s.what, "TLS: keeping the previous certificate"),
        }
    }
}
