//! Serving certificate and client-certificate verification for the external metrics
//! API. The serving pair is re-read when its files change; the acceptor asks for (but
//! does not require) a client certificate chained to the request-header CA or the
//! client CA, and the handler verifies which one signed it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{0}")]
    Config(String),
}

pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| TlsError::Read { path: path.display().to_string(), reason: e.to_string() })?
        .collect();
    let certs = certs.map_err(|e| TlsError::Read { path: path.display().to_string(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Read { path: path.display().to_string(), reason: "no PEM certificate in it".into() });
    }
    Ok(certs)
}

pub fn certs_from_pem(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem.as_bytes()).collect();
    let certs = certs.map_err(|e| TlsError::Read { path: what.into(), reason: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Read { path: what.into(), reason: "no PEM certificate in it".into() });
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A verifier that accepts only chains to `cas`.
pub fn verifier(cas: &[CertificateDer<'static>]) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in cas {
        roots.add(c.clone()).map_err(|e| TlsError::Config(format!("bad CA certificate: {e}")))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| TlsError::Config(format!("client CA: {e}")))
}

/// True when `chain` (leaf first) verifies against `v` now.
pub fn chain_verifies(v: &dyn ClientCertVerifier, chain: &[CertificateDer<'static>]) -> bool {
    match chain.split_first() {
        Some((leaf, rest)) => v.verify_client_cert(leaf, rest, UnixTime::now()).is_ok(),
        None => false,
    }
}

/// Subject CN and O values of a certificate (user and groups for client-CA auth,
/// the allowed-names check for the front proxy).
pub fn subject(cert: &CertificateDer<'_>) -> (Option<String>, Vec<String>) {
    match x509_parser::parse_x509_certificate(cert.as_ref()) {
        Ok((_, x)) => {
            let cn = x.subject().iter_common_name().next().and_then(|a| a.as_str().ok()).map(str::to_string);
            let orgs = x.subject().iter_organization().filter_map(|a| a.as_str().ok()).map(str::to_string).collect();
            (cn, orgs)
        }
        Err(_) => (None, Vec::new()),
    }
}

/// The serving configuration, rebuilt when the certificate/key files or the CAs change.
pub struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<(Arc<ServerConfig>, Option<SystemTime>)>,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

pub fn server_config(
    cert: &Path,
    key: &Path,
    client_cas: &[CertificateDer<'static>],
) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = read_certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError::Read { path: key.display().to_string(), reason: e.to_string() })?;
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
        let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        builder.with_client_cert_verifier(v)
    };
    let mut cfg =
        builder.with_single_cert(certs, key).map_err(|e| TlsError::Config(format!("certificate/key: {e}")))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

impl Reloading {
    pub fn new(cert: PathBuf, key: PathBuf, client_cas: &[CertificateDer<'static>]) -> Result<Self, TlsError> {
        let cfg = server_config(&cert, &key, client_cas)?;
        let stamp = mtime(&cert).max(mtime(&key));
        Ok(Self { cert, key, current: RwLock::new((cfg, stamp)) })
    }

    pub fn get(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// Rebuild when the files changed (or `force`, e.g. the CAs rotated). A broken new
    /// pair is logged and the previous one kept.
    pub fn maybe_reload(&self, client_cas: &[CertificateDer<'static>], force: bool) {
        let stamp = mtime(&self.cert).max(mtime(&self.key));
        let changed = stamp != self.current.read().unwrap_or_else(|e| e.into_inner()).1;
        if !changed && !force {
            return;
        }
        match server_config(&self.cert, &self.key, client_cas) {
            Ok(cfg) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (cfg, stamp);
                tracing::info!(cert = %self.cert.display(), "external metrics: TLS configuration reloaded");
            }
            Err(e) => tracing::error!(error = %e, "external metrics: keeping the previous certificate"),
        }
    }

    pub const POLL: Duration = Duration::from_secs(2);
}
