//! The Kubernetes external metrics API (`external.metrics.k8s.io/v1beta1`) over HTTPS,
//! so a plain HPA can use prescale without KEDA. Metrics are named in a config file,
//! each with the same metadata a ScaledObject trigger would carry; `<name>` is the
//! planned replicas and `<name>-raw` the raw value of the signal driving the demand,
//! both read from the same engine snapshot as the gRPC answers (no I/O per request).

pub mod auth;
pub mod quantity;
pub mod selector;
pub mod tls;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::CertificateDer;
use serde::Deserialize;
use serde_json::json;

use crate::config::ScalerId;
use crate::engine::clock::now_ms;
use crate::engine::Engine;
use auth::{Access, AuthError, AuthSettings, Authenticator};

const GROUP: &str = "external.metrics.k8s.io";
const GV: &str = "external.metrics.k8s.io/v1beta1";

/// One metric of the config file.
#[derive(Debug, Clone, Deserialize)]
pub struct MetricDef {
    pub name: String,
    /// Labels reported as `metricLabels` (and matched by `labelSelector`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, serde_yaml_ng::Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MetricsFile {
    pub metrics: Vec<MetricDef>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExtError {
    #[error("external metrics config {path}: {reason}")]
    Config { path: String, reason: String },
    #[error("external metrics TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("cannot bind the external metrics API on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// A parsed, validated metric: lowercase name and string metadata.
#[derive(Debug, Clone)]
pub struct Metric {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub metadata: HashMap<String, String>,
}

/// Read and validate the config: names are lowercase `[a-z0-9-_.]` and unique (the HPA
/// lowercases the path), and every metadata map parses (errors name the key).
pub fn load(path: &std::path::Path) -> Result<Vec<Metric>, ExtError> {
    let err = |reason: String| ExtError::Config { path: path.display().to_string(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let file: MetricsFile = serde_yaml_ng::from_str(&text).map_err(|e| err(e.to_string()))?;
    let mut out: Vec<Metric> = Vec::new();
    for m in file.metrics {
        let name = m.name.trim().to_string();
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
        {
            return Err(err(format!(
                "metric name {name:?} must be lowercase [a-z0-9-_.] (the HPA lowercases metric names)"
            )));
        }
        if name.ends_with("-raw") {
            return Err(err(format!("metric name {name:?} must not end in -raw (prescale serves <name>-raw itself)")));
        }
        if out.iter().any(|o| o.name == name) {
            return Err(err(format!("metric {name:?} is defined twice")));
        }
        let mut md = HashMap::new();
        for (k, v) in m.metadata {
            let v = match v {
                serde_yaml_ng::Value::String(s) => s,
                serde_yaml_ng::Value::Number(n) => n.to_string(),
                serde_yaml_ng::Value::Bool(b) => b.to_string(),
                _ => return Err(err(format!("metric {name}: metadata {k} must be a string"))),
            };
            md.insert(k, v);
        }
        let id = ScalerId { namespace: "<request namespace>".into(), name: name.clone() };
        let map: BTreeMap<String, String> = md.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        crate::config::parse(&id, &map).map_err(|e| err(e.to_string()))?;
        out.push(Metric { name, labels: m.labels, metadata: md });
    }
    Ok(out)
}

#[derive(Debug, Clone)]
pub struct ExtOptions {
    pub addr: SocketAddr,
    pub config: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Request-header (front proxy) CA file; else the ConfigMap is used.
    pub requestheader_ca: Option<PathBuf>,
    pub allowed_names: Vec<String>,
    /// Client CA file for client-certificate users; else the ConfigMap's, if any.
    pub client_ca: Option<PathBuf>,
}

impl ExtOptions {
    /// Whether the CAs come from the ConfigMap `kube-system/extension-apiserver-authentication`
    /// (neither CA file was given).
    fn cas_from_configmap(&self) -> bool {
        self.requestheader_ca.is_none() && self.client_ca.is_none()
    }
}

#[derive(Clone)]
struct AppState {
    engine: Engine,
    metrics: Arc<Vec<Metric>>,
    auth: Arc<Authenticator>,
}

/// The client certificate chain of the connection a request came in on.
#[derive(Clone, Default)]
struct PeerChain(Option<Arc<Vec<CertificateDer<'static>>>>);

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    (
        code,
        Json(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code.as_u16()})),
    )
        .into_response()
}

fn auth_error(e: AuthError) -> Response {
    match e {
        AuthError::Unauthenticated(m) => status(StatusCode::UNAUTHORIZED, "Unauthorized", m),
        AuthError::Forbidden(m) => status(StatusCode::FORBIDDEN, "Forbidden", m),
        AuthError::Unavailable(m) => status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", m),
    }
}

async fn check(s: &AppState, peer: &PeerChain, headers: &HeaderMap, access: Access) -> Result<(), Response> {
    let user = s.auth.authenticate(peer.0.as_deref().map(|v| v.as_slice()), headers).await.map_err(auth_error)?;
    s.auth.authorize(&user, &access).await.map_err(auth_error)
}

pub fn router(engine: Engine, metrics: Vec<Metric>, auth: Arc<Authenticator>) -> Router {
    let state = AppState { engine, metrics: Arc::new(metrics), auth };
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route("/apis", get(apis))
        .route("/apis/external.metrics.k8s.io", get(group))
        .route("/apis/external.metrics.k8s.io/v1beta1", get(resources))
        .route("/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}", get(value))
        .route("/openapi/v2", get(openapi_v2))
        .route("/openapi/v3", get(openapi_v3))
        .with_state(state)
}

fn api_group() -> serde_json::Value {
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
           "versions": [{"groupVersion": GV, "version": "v1beta1"}],
           "preferredVersion": {"groupVersion": GV, "version": "v1beta1"}})
}

/// `/apis`: the aggregator asks for aggregated discovery first and falls back to the
/// legacy documents only on 406, which is what we answer to it.
async fn apis(State(s): State<AppState>, Extension(peer): Extension<PeerChain>, headers: HeaderMap) -> Response {
    if let Err(r) = check(&s, &peer, &headers, Access::Path("/apis".into())).await {
        return r;
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    if accept.contains("as=APIGroupDiscoveryList")
        && !accept.split(',').any(|a| {
            let a = a.trim();
            a.starts_with("application/json") && !a.contains("as=") || a.starts_with("*/*")
        })
    {
        return status(
            StatusCode::NOT_ACCEPTABLE,
            "NotAcceptable",
            "aggregated discovery is not served; use the legacy documents".into(),
        );
    }
    Json(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]})).into_response()
}

async fn group(State(s): State<AppState>, Extension(peer): Extension<PeerChain>, headers: HeaderMap) -> Response {
    if let Err(r) = check(&s, &peer, &headers, Access::Path("/apis/external.metrics.k8s.io".into())).await {
        return r;
    }
    Json(api_group()).into_response()
}

async fn resources(State(s): State<AppState>, Extension(peer): Extension<PeerChain>, headers: HeaderMap) -> Response {
    if let Err(r) = check(&s, &peer, &headers, Access::Path(format!("/apis/{GV}"))).await {
        return r;
    }
    let mut list = Vec::new();
    for m in s.metrics.iter() {
        for name in [m.name.clone(), format!("{}-raw", m.name)] {
            list.push(json!({"name": name, "singularName": "", "namespaced": true, "kind": "ExternalMetricValueList", "verbs": ["get"]}));
        }
    }
    Json(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GV, "resources": list})).into_response()
}

async fn openapi_v2() -> Response {
    Json(json!({"swagger": "2.0", "info": {"title": "prescale external metrics", "version": "v1beta1"}, "paths": {}, "definitions": {}})).into_response()
}

async fn openapi_v3() -> Response {
    Json(json!({"paths": {}})).into_response()
}

#[derive(Deserialize)]
struct ValueQuery {
    #[serde(rename = "labelSelector")]
    label_selector: Option<String>,
}

async fn value(
    State(s): State<AppState>,
    Extension(peer): Extension<PeerChain>,
    Path((ns, metric)): Path<(String, String)>,
    Query(q): Query<ValueQuery>,
    headers: HeaderMap,
) -> Response {
    let metric = metric.to_ascii_lowercase();
    if let Err(r) = check(&s, &peer, &headers, Access::Metric { namespace: ns.clone(), metric: metric.clone() }).await {
        return r;
    }
    let (base, raw) = match metric.strip_suffix("-raw") {
        Some(b) => (b.to_string(), true),
        None => (metric.clone(), false),
    };
    let Some(def) = s.metrics.iter().find(|m| m.name == base) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the server could not find the metric {metric} for namespace {ns}"),
        );
    };
    let selector = match selector::Selector::parse(q.label_selector.as_deref().unwrap_or("")) {
        Ok(sel) => sel,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let entry = match s.engine.resolve(&ns, &def.name, &def.metadata) {
        Ok(e) => e,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()),
    };
    entry.wait_first_read().await;
    let now = now_ms();
    let answer = match entry.answer(now) {
        Ok(a) => a,
        // Stale or failing signal: 503, never a zero.
        Err(u) => return status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", u.0),
    };
    let v = if raw {
        let snap = entry.snapshot();
        let driver = snap.as_ref().and_then(|sn| {
            let label = sn.driver.as_ref()?;
            sn.signals.iter().find(|g| &g.label == label).and_then(|g| g.value)
        });
        match driver {
            Some(v) => v,
            None => {
                return status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    format!("{ns}/{}: no signal value yet", def.name),
                )
            }
        }
    } else {
        f64::from(answer.replicas)
    };
    let items = if selector.matches(&def.labels) {
        let ts = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_millis(now))
            .to_string();
        vec![json!({"metricName": metric, "metricLabels": def.labels, "timestamp": ts, "value": quantity::quantity(v)})]
    } else {
        Vec::new()
    };
    Json(json!({"kind": "ExternalMetricValueList", "apiVersion": GV, "metadata": {}, "items": items})).into_response()
}

/// The data of the ConfigMap `kube-system/extension-apiserver-authentication`: None when
/// the CAs come from files or flags, or there is no Kubernetes API.
async fn read_auth_configmap(
    opts: &ExtOptions,
    kube: Option<&kube::Client>,
) -> Result<Option<BTreeMap<String, String>>, kube::Error> {
    let Some(k) = kube.filter(|_| opts.cas_from_configmap()) else {
        return Ok(None);
    };
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(k.clone(), "kube-system");
    Ok(Some(api.get("extension-apiserver-authentication").await?.data.unwrap_or_default()))
}

/// Authentication settings from files/flags, else from the ConfigMap's data (see
/// [`read_auth_configmap`]).
fn auth_settings(opts: &ExtOptions, configmap: Option<&BTreeMap<String, String>>) -> Result<AuthSettings, ExtError> {
    let mut s = match configmap {
        Some(data) => AuthSettings::from_configmap(data)?,
        None => AuthSettings::default(),
    };
    if let Some(p) = &opts.requestheader_ca {
        s.requestheader_ca = crate::tls::read_certs(p)?;
    }
    if let Some(p) = &opts.client_ca {
        s.client_ca = crate::tls::read_certs(p)?;
    }
    if !opts.allowed_names.is_empty() {
        s.allowed_names = opts.allowed_names.clone();
    }
    s.fill_default_headers();
    Ok(s)
}

/// The settings a reload of the ConfigMap gives, or None when they are to stay as they are:
/// a failed read (an API server restart, throttling, a timeout) is no news about the CAs.
/// Trusting none until the next read would answer every proxied request 401 for a minute.
fn reloaded_settings(
    opts: &ExtOptions,
    read: Result<Option<BTreeMap<String, String>>, kube::Error>,
) -> Option<AuthSettings> {
    match read {
        Ok(data) => auth_settings(opts, data.as_ref()).ok(),
        Err(e) => {
            tracing::warn!(error = %e, "external metrics: cannot re-read kube-system/extension-apiserver-authentication; keeping the CAs read before");
            None
        }
    }
}

/// Serve until `stop` fires. Certificates are re-read when their files change; the
/// ConfigMap-sourced CAs are re-read every 60 s.
pub async fn serve(
    engine: Engine,
    opts: ExtOptions,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), ExtError> {
    let metrics = load(&opts.config)?;
    let kube = match kube::Client::try_default().await {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, "external metrics: no Kubernetes API: bearer tokens and SubjectAccessReview are off (only system:masters front-proxy users are authorized)");
            None
        }
    };
    let configmap = read_auth_configmap(&opts, kube.as_ref()).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "external metrics: cannot read kube-system/extension-apiserver-authentication");
        None
    });
    let settings = auth_settings(&opts, configmap.as_ref())?;
    let auth = Arc::new(Authenticator::new(settings.clone(), kube.clone())?);
    let serving = crate::tls::Serving {
        what: "external metrics",
        cert: opts.cert.clone(),
        key: opts.key.clone(),
        client_certs: crate::tls::ClientCerts::Optional,
        alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    };
    let reloading = Arc::new(crate::tls::Reloading::new(serving, &settings.all_cas())?);
    let listener =
        tokio::net::TcpListener::bind(opts.addr).await.map_err(|source| ExtError::Bind { addr: opts.addr, source })?;
    let local = listener.local_addr().map_err(|source| ExtError::Bind { addr: opts.addr, source })?;
    tracing::info!(external_metrics = %local, metrics = metrics.len(), "external metrics API serving");
    let app = router(engine, metrics, auth.clone());

    // Reload loop: files every 2 s, ConfigMap every 60 s.
    {
        let (reloading, auth, opts, kube) = (reloading.clone(), auth.clone(), opts.clone(), kube.clone());
        tokio::spawn(async move {
            let mut n: u64 = 0;
            loop {
                tokio::time::sleep(crate::tls::Reloading::POLL).await;
                n += 1;
                let mut force = false;
                if opts.cas_from_configmap() && kube.is_some() && n.is_multiple_of(30) {
                    if let Some(s) = reloaded_settings(&opts, read_auth_configmap(&opts, kube.as_ref()).await) {
                        if s.all_cas() != auth.settings().all_cas() {
                            if let Err(e) = auth.update(s) {
                                tracing::error!(error = %e, "external metrics: bad CA in the ConfigMap; keeping the previous one");
                            } else {
                                force = true;
                            }
                        }
                    }
                }
                reloading.maybe_reload(&auth.settings().all_cas(), force);
            }
        });
    }

    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => { tracing::warn!(error = %e, "external metrics: accept failed"); continue; }
            },
            _ = stop.wait_for(|s| *s) => return Ok(()),
        };
        let (reloading, app) = (reloading.clone(), app.clone());
        tokio::spawn(async move {
            let Some(tls) = reloading.accept(tcp).await else { return };
            let chain = tls
                .get_ref()
                .1
                .peer_certificates()
                .map(|c| Arc::new(c.iter().map(|c| c.clone().into_owned()).collect::<Vec<_>>()));
            let peer = PeerChain(chain);
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(peer.clone());
                let app = app.clone();
                async move { tower::ServiceExt::oneshot(app, req).await }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_names_the_problem() {
        let dir = std::env::temp_dir().join(format!("prescale-ext-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.yaml");
        std::fs::write(&p, "metrics:\n- name: Llama\n  metadata: {rabbitmqHost: 'amqp://h', rabbitmqQueueName: q}\n")
            .unwrap();
        assert!(load(&p).unwrap_err().to_string().contains("lowercase"));
        std::fs::write(&p, "metrics:\n- name: llama\n  metadata: {rabbitmqHost: 'amqp://h', rabbitmqPerReplica: x, rabbitmqQueueName: q}\n").unwrap();
        assert!(load(&p).unwrap_err().to_string().contains("rabbitmqPerReplica"));
        std::fs::write(&p, "metrics:\n- name: llama\n  labels: {model_name: m}\n  metadata: {rabbitmqHost: 'amqp://h', rabbitmqQueueName: q, rabbitmqPerReplica: 5}\n").unwrap();
        let m = load(&p).unwrap();
        assert_eq!(m[0].metadata["rabbitmqPerReplica"], "5");
        assert_eq!(m[0].labels["model_name"], "m");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failed_configmap_reload_keeps_the_cas_and_a_read_one_replaces_them() {
        let opts = ExtOptions {
            addr: "127.0.0.1:0".parse().unwrap(),
            config: PathBuf::new(),
            cert: PathBuf::new(),
            key: PathBuf::new(),
            requestheader_ca: None,
            allowed_names: Vec::new(),
            client_ca: None,
        };
        let failed = kube::Error::Service(Box::new(std::io::Error::other("the API server restarts")));
        assert!(reloaded_settings(&opts, Err(failed)).is_none(), "a failed read must not replace the CAs");
        let data =
            BTreeMap::from([("requestheader-allowed-names".to_string(), r#"["front-proxy-client"]"#.to_string())]);
        let s = reloaded_settings(&opts, Ok(Some(data))).expect("a read ConfigMap gives settings");
        assert_eq!(s.allowed_names, vec!["front-proxy-client".to_string()]);
        assert!(!s.username_headers.is_empty(), "default headers are filled");
    }
}
