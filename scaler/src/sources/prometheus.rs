//! Prometheus instant query, mirroring KEDA's prometheus scaler
//! (`GET {server}/api/v1/query?query=…`), except that an empty result is an error
//! unless `prometheusIgnoreNullValues: true` (prescale never reads missing data as 0).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{BoxFuture, Reading, Shared, Source, SourceError};
use crate::config::Metadata;
use crate::redact::redact_url;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusConfig {
    #[serde(skip)]
    pub server: String,
    /// Redacted server address, for display.
    pub server_address: String,
    pub query: String,
    pub per_replica: f64,
    pub activation_threshold: f64,
    pub ignore_null_values: bool,
    pub namespace: Option<String>,
    /// Header names only are shown; values may be secrets.
    #[serde(serialize_with = "header_names")]
    pub custom_headers: Vec<(String, String)>,
    pub query_parameters: Vec<(String, String)>,
    #[serde(skip)]
    pub bearer_token: Option<String>,
}

pub(crate) fn header_names<S: serde::Serializer>(h: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(h.iter().map(|(k, _)| k))
}

impl PrometheusConfig {
    pub fn parse(md: &mut Metadata<'_>) -> Option<Self> {
        if !md.has_prefix("prometheus") {
            return None;
        }
        let server =
            md.required("prometheusServerAddress", "Prometheus base URL").and_then(|s| match url::Url::parse(&s) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => {
                    Some(s.trim_end_matches('/').to_string())
                }
                _ => {
                    md.error("prometheusServerAddress", Some(&s), "expected an http:// or https:// URL");
                    None
                }
            });
        let query = md.required("prometheusQuery", "a PromQL instant query");
        let per_replica = match md.opt_positive_f64("prometheusPerReplica") {
            Some(Some(v)) => Some(v),
            Some(None) => {
                md.error("prometheusPerReplica", None, "is required (the query value one replica absorbs)");
                None
            }
            None => None,
        };
        let activation_threshold = md.f64_in("prometheusActivationThreshold", 0.0, f64::MIN, f64::MAX, false);
        let ignore_null_values = md.bool("prometheusIgnoreNullValues", false);
        let namespace = md.string("prometheusNamespace").filter(|s| !s.is_empty());
        let custom_headers = header_pairs(md, "prometheusCustomHeaders");
        let query_parameters = pairs(md, "prometheusQueryParameters");
        let bearer_token = md.string("prometheusBearerTokenFromEnv").filter(|s| !s.is_empty());
        let server = server?;
        Some(Self {
            server_address: redact_url(&server),
            server,
            query: query?,
            per_replica: per_replica?,
            activation_threshold: activation_threshold?,
            ignore_null_values: ignore_null_values?,
            namespace,
            custom_headers: custom_headers?,
            query_parameters: query_parameters?,
            bearer_token,
        })
    }

    pub fn label(&self) -> String {
        format!("prometheus query on {}", self.server_address)
    }

    pub fn per_replica(&self) -> f64 {
        self.per_replica
    }

    pub fn poll_key(&self) -> String {
        format!(
            "prometheus|{}|{}|{:?}|{:?}|{:?}|{:?}|{}|{}",
            self.server,
            self.query,
            self.namespace,
            self.custom_headers,
            self.query_parameters,
            self.bearer_token,
            self.ignore_null_values,
            self.activation_threshold
        )
    }
}

/// [`pairs`] that must also be valid HTTP header names and values (checked here, so a bad
/// one is a metadata error naming the key rather than a failing request at every poll).
pub(crate) fn header_pairs(md: &mut Metadata<'_>, key: &str) -> Option<Vec<(String, String)>> {
    let out = pairs(md, key)?;
    for (k, v) in &out {
        if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
            || reqwest::header::HeaderValue::from_str(v).is_err()
        {
            md.error(key, Some(k), "is not a valid HTTP header name=value");
            return None;
        }
    }
    Some(out)
}

/// `a=b,c=d` → pairs; every item must have a non-empty name and a `=`.
pub(crate) fn pairs(md: &mut Metadata<'_>, key: &str) -> Option<Vec<(String, String)>> {
    let Some(raw) = md.string(key) else { return Some(Vec::new()) };
    let mut out = Vec::new();
    for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match item.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => out.push((k.trim().to_string(), v.trim().to_string())),
            _ => {
                md.error(key, Some(item), "expected comma-separated name=value pairs");
                return None;
            }
        }
    }
    Some(out)
}

pub struct PrometheusSource {
    cfg: PrometheusConfig,
    http: reqwest::Client,
}

impl PrometheusSource {
    pub fn new(cfg: PrometheusConfig, shared: &Shared) -> Self {
        Self { cfg, http: shared.http.clone() }
    }

    async fn query(&self) -> Result<Reading, SourceError> {
        let mut params: Vec<(String, String)> = vec![("query".into(), self.cfg.query.clone())];
        if let Some(ns) = &self.cfg.namespace {
            params.push(("namespace".into(), ns.clone()));
        }
        params.extend(self.cfg.query_parameters.iter().cloned());
        let req = QueryRequest {
            server: &self.cfg.server,
            params: &params,
            headers: &self.cfg.custom_headers,
            bearer_token: self.cfg.bearer_token.as_deref(),
            timeout: None,
            shown: None,
        };
        let body = req.send(&self.http).await?;
        let value = parse_instant(&body, self.cfg.ignore_null_values)?;
        let mut detail = BTreeMap::new();
        detail.insert("value", value);
        Ok(Reading { value, active: value > self.cfg.activation_threshold, detail, pods: None })
    }
}

/// One `GET {server}/api/v1/query`, with the request headers and bearer token the
/// Prometheus needs (shared by the `prometheus*` source and `dcgmPrometheus`).
pub(crate) struct QueryRequest<'a> {
    pub server: &'a str,
    pub params: &'a [(String, String)],
    pub headers: &'a [(String, String)],
    pub bearer_token: Option<&'a str>,
    /// Per-request timeout (otherwise the poller's bounds the read).
    pub timeout: Option<std::time::Duration>,
    /// The redacted server, named in errors when set.
    pub shown: Option<&'a str>,
}

impl QueryRequest<'_> {
    /// The answer's body on a 2xx; a connect or query error otherwise (at most 200
    /// characters of the body), never a value.
    pub async fn send(&self, http: &reqwest::Client) -> Result<String, SourceError> {
        let mut req = http.get(format!("{}/api/v1/query", self.server)).query(self.params);
        for (k, v) in self.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        if let Some(t) = self.bearer_token {
            req = req.bearer_auth(t);
        }
        if let Some(t) = self.timeout {
            req = req.timeout(t);
        }
        let resp = req.send().await.map_err(|e| match self.shown {
            Some(s) => SourceError::connect(format!("Prometheus {s}: {}", e.without_url())),
            None => SourceError::connect(e.without_url()),
        })?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| SourceError::query(e.without_url()))?;
        if !status.is_success() {
            let msg: String = body.chars().take(200).collect();
            let who = self.shown.map(|s| format!("Prometheus {s}")).unwrap_or_else(|| "Prometheus".into());
            return Err(SourceError::Query(format!("{who} answered {status}: {msg}")));
        }
        Ok(body)
    }
}

/// The single value of an instant-query answer (vector of one sample, or scalar).
pub fn parse_instant(body: &str, ignore_null: bool) -> Result<f64, SourceError> {
    let v: serde_json::Value = serde_json::from_str(body).map_err(SourceError::parse)?;
    if v.get("status").and_then(|s| s.as_str()) != Some("success") {
        let err = v.get("error").and_then(|e| e.as_str()).unwrap_or("status is not success");
        return Err(SourceError::Query(err.to_string()));
    }
    let data = v.get("data").ok_or_else(|| SourceError::Parse("no data".into()))?;
    let sample = match data.get("resultType").and_then(|t| t.as_str()) {
        Some("vector") => {
            let res =
                data.get("result").and_then(|r| r.as_array()).ok_or_else(|| SourceError::Parse("no result".into()))?;
            match res.len() {
                0 if ignore_null => return Ok(0.0),
                0 => {
                    return Err(SourceError::Query(
                        "the query returned no series (set prometheusIgnoreNullValues: true to read that as 0)".into(),
                    ))
                }
                1 => res[0].get("value").cloned(),
                n => {
                    return Err(SourceError::Query(format!(
                        "the query returned {n} series; it must return one (use sum/max)"
                    )))
                }
            }
        }
        Some("scalar") => data.get("result").cloned(),
        other => return Err(SourceError::Parse(format!("unsupported resultType {other:?}"))),
    };
    let raw = sample
        .as_ref()
        .and_then(|s| s.get(1))
        .and_then(|s| s.as_str())
        .ok_or_else(|| SourceError::Parse("sample has no value".into()))?;
    match raw.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        Ok(_) if ignore_null => Ok(0.0),
        Ok(x) => Err(SourceError::Query(format!("the query value is {x}"))),
        Err(e) => Err(SourceError::parse(format!("value {raw:?}: {e}"))),
    }
}

impl Source for PrometheusSource {
    fn read(&self) -> BoxFuture<'_, Result<Reading, SourceError>> {
        Box::pin(self.query())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vector_and_scalar() {
        let b = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"49"]}]}}"#;
        assert_eq!(parse_instant(b, false).unwrap(), 49.0);
        let b = r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2.5"]}}"#;
        assert_eq!(parse_instant(b, false).unwrap(), 2.5);
    }

    #[test]
    fn empty_result_is_an_error_unless_ignored() {
        let b = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert!(matches!(parse_instant(b, false), Err(SourceError::Query(_))));
        assert_eq!(parse_instant(b, true).unwrap(), 0.0);
    }

    #[test]
    fn rejects_many_series_nan_and_garbage() {
        let b = r#"{"status":"success","data":{"resultType":"vector","result":[{"value":[1,"1"]},{"value":[1,"2"]}]}}"#;
        assert!(parse_instant(b, true).is_err());
        let b = r#"{"status":"success","data":{"resultType":"vector","result":[{"value":[1,"NaN"]}]}}"#;
        assert!(parse_instant(b, false).is_err());
        assert_eq!(parse_instant(b, true).unwrap(), 0.0);
        assert!(parse_instant("<html>", false).is_err());
        assert!(parse_instant(r#"{"status":"error","error":"bad query"}"#, false).is_err());
    }
}
