//! Authentication and authorization as aggregated API servers do it: the front proxy
//! (kube-apiserver) presents a client certificate signed by the request-header CA and
//! passes the user in headers; other clients authenticate with a certificate from the
//! client CA or a bearer token (TokenReview); the user is then authorized with a
//! SubjectAccessReview (cached 10 s). `/healthz`, `/readyz`, `/livez` are open.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use rustls::pki_types::CertificateDer;
use rustls::server::danger::ClientCertVerifier;

use super::tls::{chain_verifies, subject, verifier};
use crate::tls::TlsError;

/// The authentication settings (from files/flags or the
/// `kube-system/extension-apiserver-authentication` ConfigMap).
#[derive(Clone, Default)]
pub struct AuthSettings {
    pub requestheader_ca: Vec<CertificateDer<'static>>,
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_prefixes: Vec<String>,
    pub client_ca: Vec<CertificateDer<'static>>,
}

impl AuthSettings {
    /// Every CA a client certificate may chain to (for the TLS acceptor).
    pub fn all_cas(&self) -> Vec<CertificateDer<'static>> {
        self.requestheader_ca.iter().chain(&self.client_ca).cloned().collect()
    }

    /// From the ConfigMap's data (list values are JSON arrays).
    pub fn from_configmap(data: &BTreeMap<String, String>) -> Result<Self, TlsError> {
        let list = |k: &str| -> Vec<String> {
            data.get(k).and_then(|v| serde_json::from_str::<Vec<String>>(v).ok()).unwrap_or_default()
        };
        let cas = |k: &str| -> Result<Vec<CertificateDer<'static>>, TlsError> {
            match data.get(k) {
                Some(pem) if !pem.trim().is_empty() => crate::tls::certs_from_pem(pem, k),
                _ => Ok(Vec::new()),
            }
        };
        let mut s = Self {
            requestheader_ca: cas("requestheader-client-ca-file")?,
            allowed_names: list("requestheader-allowed-names"),
            username_headers: list("requestheader-username-headers"),
            group_headers: list("requestheader-group-headers"),
            extra_prefixes: list("requestheader-extra-headers-prefix"),
            client_ca: cas("client-ca-file")?,
        };
        s.fill_default_headers();
        Ok(s)
    }

    pub fn fill_default_headers(&mut self) {
        if self.username_headers.is_empty() {
            self.username_headers = vec!["X-Remote-User".into()];
        }
        if self.group_headers.is_empty() {
            self.group_headers = vec!["X-Remote-Group".into()];
        }
        if self.extra_prefixes.is_empty() {
            self.extra_prefixes = vec!["X-Remote-Extra-".into()];
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("Unauthorized: {0}")]
    Unauthenticated(String),
    #[error("Forbidden: {0}")]
    Forbidden(String),
    #[error("authorization unavailable: {0}")]
    Unavailable(String),
}

/// What is being asked for (SubjectAccessReview attributes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Access {
    Metric { namespace: String, metric: String },
    Path(String),
}

struct Verifiers {
    settings: AuthSettings,
    front_proxy: Option<Arc<dyn ClientCertVerifier>>,
    client: Option<Arc<dyn ClientCertVerifier>>,
}

pub struct Authenticator {
    verifiers: RwLock<Verifiers>,
    kube: Option<kube::Client>,
    cache: Mutex<HashMap<CacheKey, (bool, Instant)>>,
}

const CACHE_TTL: Duration = Duration::from_secs(10);

/// (user, groups, what): one SubjectAccessReview answer.
type CacheKey = (String, Vec<String>, Access);

impl Authenticator {
    pub fn new(settings: AuthSettings, kube: Option<kube::Client>) -> Result<Self, TlsError> {
        Ok(Self { verifiers: RwLock::new(Self::build(settings)?), kube, cache: Mutex::new(HashMap::new()) })
    }

    fn build(settings: AuthSettings) -> Result<Verifiers, TlsError> {
        let front_proxy =
            (!settings.requestheader_ca.is_empty()).then(|| verifier(&settings.requestheader_ca)).transpose()?;
        let client = (!settings.client_ca.is_empty()).then(|| verifier(&settings.client_ca)).transpose()?;
        Ok(Verifiers { settings, front_proxy, client })
    }

    pub fn update(&self, settings: AuthSettings) -> Result<(), TlsError> {
        let v = Self::build(settings)?;
        *self.verifiers.write().unwrap_or_else(|e| e.into_inner()) = v;
        Ok(())
    }

    pub fn settings(&self) -> AuthSettings {
        self.verifiers.read().unwrap_or_else(|e| e.into_inner()).settings.clone()
    }

    /// Who is calling.
    pub async fn authenticate(
        &self,
        chain: Option<&[CertificateDer<'static>]>,
        headers: &HeaderMap,
    ) -> Result<User, AuthError> {
        if let Some(chain) = chain.filter(|c| !c.is_empty()) {
            let v = self.verifiers.read().unwrap_or_else(|e| e.into_inner());
            if let Some(fp) = &v.front_proxy {
                if chain_verifies(fp.as_ref(), chain) {
                    let (cn, _) = subject(&chain[0]);
                    let cn = cn.unwrap_or_default();
                    if !v.settings.allowed_names.is_empty() && !v.settings.allowed_names.contains(&cn) {
                        return Err(AuthError::Unauthenticated(format!(
                            "front-proxy certificate CN \"{cn}\" is not in requestheader-allowed-names"
                        )));
                    }
                    return user_from_headers(&v.settings, headers);
                }
            }
            if let Some(c) = &v.client {
                if chain_verifies(c.as_ref(), chain) {
                    let (cn, orgs) = subject(&chain[0]);
                    let name = cn.ok_or_else(|| AuthError::Unauthenticated("client certificate has no CN".into()))?;
                    return Ok(User { name, uid: None, groups: orgs, extra: BTreeMap::new() });
                }
            }
            return Err(AuthError::Unauthenticated("client certificate is not signed by a trusted CA".into()));
        }
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty());
        match token {
            Some(t) => self.token_review(t).await,
            None => Err(AuthError::Unauthenticated("no client certificate and no bearer token".into())),
        }
    }

    async fn token_review(&self, token: &str) -> Result<User, AuthError> {
        let client = self.kube.clone().ok_or_else(|| {
            AuthError::Unauthenticated(
                "bearer tokens need the Kubernetes API (TokenReview), which is not configured".into(),
            )
        })?;
        let api: kube::Api<TokenReview> = kube::Api::all(client);
        let tr = TokenReview {
            spec: TokenReviewSpec { token: token.to_string(), ..Default::default() },
            ..Default::default()
        };
        let res = api
            .create(&Default::default(), &tr)
            .await
            .map_err(|e| AuthError::Unauthenticated(format!("TokenReview failed: {e}")))?;
        let st = res.status.unwrap_or_default();
        if st.authenticated != Some(true) {
            return Err(AuthError::Unauthenticated(st.error.unwrap_or_else(|| "token not authenticated".into())));
        }
        let u = st.user.unwrap_or_default();
        Ok(User {
            name: u.username.unwrap_or_default(),
            uid: u.uid,
            groups: u.groups.unwrap_or_default(),
            extra: u.extra.unwrap_or_default().into_iter().collect(),
        })
    }

    /// May `user` do `access`? `system:masters` always may (the aggregator's probe).
    pub async fn authorize(&self, user: &User, access: &Access) -> Result<(), AuthError> {
        if user.groups.iter().any(|g| g == "system:masters") {
            return Ok(());
        }
        let key = (user.name.clone(), user.groups.clone(), access.clone());
        if let Some((allowed, at)) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            if at.elapsed() < CACHE_TTL {
                return if *allowed { Ok(()) } else { Err(AuthError::Forbidden(describe(user, access))) };
            }
        }
        let client = self.kube.clone().ok_or_else(|| {
            AuthError::Unavailable("SubjectAccessReview needs the Kubernetes API, which is not configured".into())
        })?;
        let mut spec = SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: user.uid.clone(),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
            ..Default::default()
        };
        match access {
            Access::Metric { namespace, metric } => {
                spec.resource_attributes = Some(ResourceAttributes {
                    namespace: Some(namespace.clone()),
                    verb: Some("list".into()),
                    group: Some("external.metrics.k8s.io".into()),
                    version: Some("v1beta1".into()),
                    resource: Some(metric.clone()),
                    ..Default::default()
                })
            }
            Access::Path(p) => {
                spec.non_resource_attributes =
                    Some(NonResourceAttributes { path: Some(p.clone()), verb: Some("get".into()) })
            }
        }
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(client);
        let sar = SubjectAccessReview { spec, ..Default::default() };
        let res = tokio::time::timeout(Duration::from_secs(10), api.create(&Default::default(), &sar))
            .await
            .map_err(|_| AuthError::Unavailable("SubjectAccessReview timed out".into()))?
            .map_err(|e| AuthError::Unavailable(format!("SubjectAccessReview failed: {e}")))?;
        let allowed = res.status.map(|s| s.allowed).unwrap_or(false);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(key, (allowed, Instant::now()));
        if allowed {
            Ok(())
        } else {
            Err(AuthError::Forbidden(describe(user, access)))
        }
    }
}

fn describe(user: &User, access: &Access) -> String {
    match access {
        Access::Metric { namespace, metric } => format!(
            "user \"{}\" cannot list resource \"{metric}\" in API group \"external.metrics.k8s.io\" in the namespace \"{namespace}\"",
            user.name
        ),
        Access::Path(p) => format!("user \"{}\" cannot get path \"{p}\"", user.name),
    }
}

fn user_from_headers(s: &AuthSettings, headers: &HeaderMap) -> Result<User, AuthError> {
    let name = s
        .username_headers
        .iter()
        .find_map(|h| headers.get(h.as_str()).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty()))
        .ok_or_else(|| AuthError::Unauthenticated("front proxy sent no user header".into()))?
        .to_string();
    let mut groups = Vec::new();
    for h in &s.group_headers {
        for v in headers.get_all(h.as_str()) {
            // One group per header value, as the API server's request-header authenticator
            // takes them: a group may hold a comma (an LDAP DN), so values are not split.
            if let Ok(v) = v.to_str().map(str::trim) {
                if !v.is_empty() {
                    groups.push(v.to_string());
                }
            }
        }
    }
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in headers {
        for p in &s.extra_prefixes {
            if k.as_str().len() > p.len() && k.as_str()[..p.len()].eq_ignore_ascii_case(p) {
                if let Ok(v) = v.to_str() {
                    extra.entry(extra_key(&k.as_str()[p.len()..])).or_default().push(v.to_string());
                }
            }
        }
    }
    Ok(User { name, uid: None, groups, extra })
}

/// An extra's key from its header name: lowercased, then percent-decoded (header names
/// cannot hold `/`, so the front proxy escapes keys such as
/// `authentication.kubernetes.io/credential-id`); kept as sent when it decodes to no UTF-8.
fn extra_key(header_suffix: &str) -> String {
    let lower = header_suffix.to_ascii_lowercase();
    match percent_encoding::percent_decode_str(&lower).decode_utf8() {
        Ok(k) => k.into_owned(),
        Err(_) => lower,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_proxy_headers_give_user_groups_and_extra() {
        let mut s = AuthSettings::default();
        s.fill_default_headers();
        let mut h = HeaderMap::new();
        h.insert("X-Remote-User", "system:serviceaccount:kube-system:horizontal-pod-autoscaler".parse().unwrap());
        h.append("X-Remote-Group", "system:serviceaccounts".parse().unwrap());
        h.append("X-Remote-Group", "system:authenticated".parse().unwrap());
        h.insert("X-Remote-Extra-Scopes", "a".parse().unwrap());
        let u = user_from_headers(&s, &h).unwrap();
        assert_eq!(u.name, "system:serviceaccount:kube-system:horizontal-pod-autoscaler");
        assert_eq!(u.groups, vec!["system:serviceaccounts", "system:authenticated"]);
        assert_eq!(u.extra["scopes"], vec!["a"]);
        assert!(user_from_headers(&s, &HeaderMap::new()).is_err());
        // A DN is one group, and an escaped extra key reaches the SubjectAccessReview decoded.
        h.append("X-Remote-Group", "cn=ml,ou=platform".parse().unwrap());
        h.insert("X-Remote-Extra-Authentication.kubernetes.io%2fCredential-Id", "JTI=1".parse().unwrap());
        let u = user_from_headers(&s, &h).unwrap();
        assert_eq!(u.groups, vec!["system:serviceaccounts", "system:authenticated", "cn=ml,ou=platform"]);
        assert_eq!(u.extra["authentication.kubernetes.io/credential-id"], vec!["JTI=1"]);
    }

    #[test]
    fn configmap_lists_are_json_arrays() {
        let mut d = BTreeMap::new();
        d.insert("requestheader-allowed-names".to_string(), "[\"front-proxy-client\"]".to_string());
        d.insert("requestheader-username-headers".to_string(), "[\"X-Remote-User\"]".to_string());
        let s = AuthSettings::from_configmap(&d).unwrap();
        assert_eq!(s.allowed_names, vec!["front-proxy-client"]);
        assert_eq!(s.group_headers, vec!["X-Remote-Group"]);
        assert!(s.requestheader_ca.is_empty());
    }
}
