//! Client-certificate verification for the external metrics API: its acceptor asks for (but
//! does not require, [`crate::tls::ClientCerts::Optional`]) a client certificate chained to
//! the request-header CA or the client CA, and the handler verifies which one signed it.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

use crate::tls::{provider, TlsError};

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
