//! DCGM GPU utilisation of the scale target's pods, from dcgm-exporter's `/metrics`
//! (`dcgmEndpoints`, scraped directly and parsed with `prometheus-parse`) or from a
//! Prometheus that scrapes it (`dcgmPrometheus`, one instant query).
//!
//! - Metric: `DCGM_FI_DEV_GPU_UTIL` (%, default `dcgmMetric: gpuUtil`), or
//!   `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (0–1, read as %) with `dcgmMetric: engineActive`. MIG
//!   rows (with `GPU_I_PROFILE` / `GPU_I_ID`) never carry GPU_UTIL, so a MIG instance is
//!   always read from GR_ENGINE_ACTIVE.
//! - Rows: `namespace` = the ScaledObject's namespace, `pod` non-empty and starting with
//!   `dcgmPodPrefix` when set (without it: every pod of the namespace that holds a GPU).
//!   The poll is shared by every ScaledObject with the same endpoints and filters; when the
//!   cluster integration knows the scale target's pods, each ScaledObject then narrows the
//!   shared reading to exactly those pods with [`narrow`] (the reading keeps its per-pod
//!   figures for that). Through a Prometheus that
//!   scraped the exporter without `honor_labels`, the exporter's labels are
//!   `exported_namespace` / `exported_pod`; those win when present. A device is
//!   (`hostname` or the old `Hostname`, `UUID`/`uuid`, `gpu`, `GPU_I_ID`); duplicate rows
//!   of one device (several scrapers) count once, at their max.
//! - Demand: ready replicas × mean utilisation / `dcgmUtilizationTarget`, where ready
//!   replicas = pods with a GPU row and the mean is over pods of each pod's mean over its
//!   GPUs. The reading's value is `pods × mean_util` with per_replica = the target, so
//!   `value / per_replica` is that demand.
//! - No matching row: an error (dcgm-exporter has no row for a pod that is not running),
//!   unless `dcgmIgnoreNoGpus: true` reads it as 0 — needed with scale-to-zero.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use super::exposition::{self, Series};
use super::{BoxFuture, Reading, Shared, Source, SourceError, TargetPods};
use crate::config::Metadata;
use crate::redact::redact_url;

pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
pub const ENGINE_ACTIVE: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE";
pub const DEFAULT_PORT: u16 = 9400;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Metric {
    GpuUtil,
    EngineActive,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "from")]
pub enum Origin {
    /// dcgm-exporter endpoints scraped directly.
    Endpoints {
        #[serde(skip)]
        urls: Vec<String>,
        shown: Vec<String>,
    },
    /// A Prometheus base URL, with the request headers and bearer token it needs.
    Prometheus {
        #[serde(skip)]
        server: String,
        shown: String,
        /// Header names only are shown; values may be secrets.
        #[serde(serialize_with = "super::prometheus::header_names")]
        headers: Vec<(String, String)>,
        #[serde(skip)]
        bearer_token: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DcgmConfig {
    pub from: Origin,
    pub namespace: String,
    pub pod_prefix: Option<String>,
    pub metric: Metric,
    /// Percent one replica should run at.
    pub utilization_target: f64,
    /// Active iff the mean utilisation (percent) is greater than this.
    pub activation_utilization: f64,
    pub ignore_no_gpus: bool,
    #[serde(skip)]
    pub scrape_timeout: Duration,
}

impl DcgmConfig {
    /// `None` when no `dcgm*` key is present.
    pub fn parse(md: &mut Metadata<'_>, common: super::CommonKeys) -> Option<Self> {
        if !md.has_prefix("dcgm") {
            return None;
        }
        let endpoints = md.string("dcgmEndpoints").filter(|s| !s.is_empty());
        let prometheus = md.string("dcgmPrometheus").filter(|s| !s.is_empty());
        let metric = md.choice("dcgmMetric", "gpuUtil", &["gpuUtil", "engineActive"]).map(|m| {
            if m == "engineActive" {
                Metric::EngineActive
            } else {
                Metric::GpuUtil
            }
        });
        let pod_prefix = md.string("dcgmPodPrefix").filter(|s| !s.is_empty());
        let target = md.f64_in("dcgmUtilizationTarget", 80.0, 0.0, 100.0, true);
        let activation = md.f64_in("dcgmActivationUtilization", 0.0, 0.0, 100.0, false);
        let ignore_no_gpus = md.bool("dcgmIgnoreNoGpus", false);
        let scrape_timeout = common.source_timeout.mul_f64(0.75);
        let headers = super::prometheus::header_pairs(md, "dcgmPrometheusCustomHeaders");
        let bearer_token = md.string("dcgmPrometheusBearerTokenFromEnv").filter(|s| !s.is_empty());

        let from = match (endpoints, prometheus) {
            (Some(_), Some(p)) => {
                md.error("dcgmPrometheus", Some(&p), "set either dcgmEndpoints or dcgmPrometheus, not both");
                None
            }
            (None, None) => {
                md.error("dcgmEndpoints", None, "is required (or dcgmPrometheus): where to read DCGM metrics");
                None
            }
            (Some(list), None) => {
                for key in ["dcgmPrometheusCustomHeaders", "dcgmPrometheusBearerTokenFromEnv"] {
                    if md.string(key).is_some_and(|v| !v.is_empty()) {
                        md.error(key, None, "only applies with dcgmPrometheus (dcgmEndpoints are scraped directly)");
                    }
                }
                exposition::endpoint_list(md, "dcgmEndpoints", &list, DEFAULT_PORT)
                    .map(|urls| Origin::Endpoints { shown: urls.iter().map(|u| redact_url(u)).collect(), urls })
            }
            (None, Some(p)) => match url::Url::parse(&p) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.has_host() => {
                    let server = p.trim_end_matches('/').to_string();
                    headers.map(|headers| Origin::Prometheus {
                        shown: redact_url(&server),
                        server,
                        headers,
                        bearer_token,
                    })
                }
                _ => {
                    md.error("dcgmPrometheus", Some(&p), "expected an http:// or https:// URL");
                    None
                }
            },
        };
        Some(Self {
            from: from?,
            namespace: md.id().namespace.clone(),
            pod_prefix,
            metric: metric?,
            utilization_target: target?,
            activation_utilization: activation?,
            ignore_no_gpus: ignore_no_gpus?,
            scrape_timeout,
        })
    }

    pub fn label(&self) -> String {
        let pods = match &self.pod_prefix {
            Some(p) => format!("pods {}/{p}*", self.namespace),
            None => format!("pods in {}", self.namespace),
        };
        let metric = match self.metric {
            Metric::GpuUtil => "GPU utilisation",
            Metric::EngineActive => "GR engine activity",
        };
        match &self.from {
            Origin::Endpoints { shown, .. } => format!("dcgm {metric} of {pods} from {}", shown.join(",")),
            Origin::Prometheus { shown, .. } => format!("dcgm {metric} of {pods} via Prometheus {shown}"),
        }
    }

    pub fn per_replica(&self) -> f64 {
        self.utilization_target
    }

    pub fn poll_key(&self) -> String {
        let from = match &self.from {
            Origin::Endpoints { urls, .. } => format!("endpoints={}", urls.join(",")),
            Origin::Prometheus { server, headers, bearer_token, .. } => {
                format!("prometheus={server}|{headers:?}|{bearer_token:?}")
            }
        };
        format!(
            "dcgm|{from}|{}|{:?}|{:?}|{}|{}|{:?}",
            self.namespace,
            self.pod_prefix,
            self.metric,
            self.activation_utilization,
            self.ignore_no_gpus,
            self.scrape_timeout
        )
    }

    /// The instant query that returns the candidate rows of the namespace (filtered again
    /// here, like scraped rows).
    pub fn promql(&self) -> String {
        let names = match self.metric {
            Metric::GpuUtil => format!("{GPU_UTIL}|{ENGINE_ACTIVE}"),
            Metric::EngineActive => ENGINE_ACTIVE.to_string(),
        };
        // A PromQL string literal escapes as a label value in the exposition format does.
        let ns = super::exposition::escape_label_value(&self.namespace);
        format!("{{__name__=~\"{names}\",namespace=\"{ns}\"}} or {{__name__=~\"{names}\",exported_namespace=\"{ns}\"}}")
    }
}

/// The result of one read, before it becomes a [`Reading`].
#[derive(Debug, Clone, PartialEq)]
pub struct Utilization {
    pub gpus: usize,
    pub pods: usize,
    /// Mean over pods of each pod's mean GPU utilisation, percent.
    pub mean_util: f64,
    /// The pods behind the figures, by name.
    pub per_pod: Vec<PodUtil>,
}

/// One pod's GPUs in a reading.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PodUtil {
    pub pod: String,
    pub gpus: usize,
    /// Mean utilisation over the pod's GPUs, percent.
    pub util: f64,
}

impl Utilization {
    fn of(per_pod: Vec<PodUtil>) -> Option<Self> {
        if per_pod.is_empty() {
            return None;
        }
        let mean_util = per_pod.iter().map(|p| p.util).sum::<f64>() / per_pod.len() as f64;
        Some(Self { gpus: per_pod.iter().map(|p| p.gpus).sum(), pods: per_pod.len(), mean_util, per_pod })
    }
}

/// Narrow a shared reading to the scale target's pods. No row for any of them is a known
/// 0 when none of them is Ready (scaled to zero, or every replica still starting) or with
/// `dcgmIgnoreNoGpus`; with Ready pods and no row it is an error (the exporter is not
/// attributing GPUs to pods, or reads another namespace), never a silent 0.
pub fn narrow(cfg: &DcgmConfig, r: &Reading, target: &TargetPods) -> Result<Reading, SourceError> {
    let rows = r.pods.as_deref().map(Vec::as_slice).unwrap_or_default();
    let mine: Vec<PodUtil> =
        rows.iter().filter(|p| target.pods.iter().any(|(name, _)| *name == p.pod)).cloned().collect();
    let mut detail = r.detail.clone();
    detail.insert("target_pods", target.pods.len() as f64);
    let ready: Vec<&str> = target.pods.iter().filter(|(_, ready)| *ready).map(|(n, _)| n.as_str()).collect();
    if mine.is_empty() && !ready.is_empty() && !cfg.ignore_no_gpus {
        let mut names = ready.iter().take(5).copied().collect::<Vec<_>>().join(", ");
        if ready.len() > 5 {
            names.push_str(", ...");
        }
        return Err(SourceError::NotFound(format!(
            "none of the {} Ready pods of the scale target ({names}) has a GPU row in {}; \
             {} other pod(s) of namespace {} have one",
            ready.len(),
            cfg.label(),
            rows.len(),
            cfg.namespace
        )));
    }
    Ok(reading(cfg, Utilization::of(mine), detail))
}

/// The workload's label `name`: `exported_<name>` when Prometheus renamed it on a clash.
fn workload_label<'a>(s: &'a Series, name: &str) -> Option<&'a str> {
    s.label(&format!("exported_{name}")).or_else(|| s.label(name))
}

fn is_mig(s: &Series) -> bool {
    s.label("GPU_I_PROFILE").is_some_and(|v| !v.is_empty()) || s.label("GPU_I_ID").is_some_and(|v| !v.is_empty())
}

/// Select the rows of the scale target's GPUs and average them.
pub fn utilization(cfg: &DcgmConfig, rows: &[Series]) -> Result<Option<Utilization>, SourceError> {
    // (namespace/pod) → device → utilisation %
    let mut pods: BTreeMap<&str, HashMap<String, f64>> = BTreeMap::new();
    let mut other_metric_rows = 0usize;
    for s in rows {
        let scale = match (s.name.as_str(), cfg.metric, is_mig(s)) {
            (GPU_UTIL, Metric::GpuUtil, false) => 1.0,
            (ENGINE_ACTIVE, Metric::EngineActive, _) | (ENGINE_ACTIVE, Metric::GpuUtil, true) => 100.0,
            (ENGINE_ACTIVE, Metric::GpuUtil, false) => {
                other_metric_rows += 1;
                continue;
            }
            _ => continue,
        };
        if workload_label(s, "namespace") != Some(cfg.namespace.as_str()) {
            continue;
        }
        let Some(pod) = workload_label(s, "pod").filter(|p| !p.is_empty()) else { continue };
        if cfg.pod_prefix.as_deref().is_some_and(|p| !pod.starts_with(p)) {
            continue;
        }
        if !s.value.is_finite() {
            continue;
        }
        let util = (s.value * scale).clamp(0.0, 100.0);
        let host = s.label("hostname").or_else(|| s.label("Hostname")).unwrap_or("");
        let uuid = s.label("UUID").or_else(|| s.label("uuid")).unwrap_or("");
        let device = format!("{host}|{uuid}|{}|{}", s.label("gpu").unwrap_or(""), s.label("GPU_I_ID").unwrap_or(""));
        let d = pods.entry(pod).or_default().entry(device).or_insert(util);
        *d = d.max(util);
    }
    if pods.is_empty() {
        if cfg.ignore_no_gpus {
            return Ok(None);
        }
        let who = match &cfg.pod_prefix {
            Some(p) => format!("pods \"{p}*\" in namespace {}", cfg.namespace),
            None => format!("pods in namespace {}", cfg.namespace),
        };
        let what = match cfg.metric {
            Metric::GpuUtil => format!("{GPU_UTIL} (or, for MIG, {ENGINE_ACTIVE})"),
            Metric::EngineActive => ENGINE_ACTIVE.to_string(),
        };
        let hint = if other_metric_rows > 0 {
            format!(" ({other_metric_rows} {ENGINE_ACTIVE} rows exist: try dcgmMetric: engineActive)")
        } else {
            " (set dcgmIgnoreNoGpus: true to read no GPU as 0)".to_string()
        };
        return Err(SourceError::NotFound(format!("no {what} row for {who}{hint}")));
    }
    let per_pod = pods
        .into_iter()
        .map(|(pod, d)| PodUtil { pod: pod.to_string(), gpus: d.len(), util: d.values().sum::<f64>() / d.len() as f64 })
        .collect();
    Ok(Utilization::of(per_pod))
}

fn reading(cfg: &DcgmConfig, u: Option<Utilization>, mut detail: BTreeMap<&'static str, f64>) -> Reading {
    match u {
        Some(u) => {
            detail.insert("gpus", u.gpus as f64);
            detail.insert("pods", u.pods as f64);
            detail.insert("mean_util", u.mean_util);
            let value = u.pods as f64 * u.mean_util;
            let active = u.mean_util > cfg.activation_utilization;
            Reading { value, active, detail, pods: Some(std::sync::Arc::new(u.per_pod)) }
        }
        None => {
            detail.insert("gpus", 0.0);
            detail.insert("pods", 0.0);
            Reading { value: 0.0, active: false, detail, pods: Some(Default::default()) }
        }
    }
}

/// The rows of a Prometheus instant-query answer (a vector).
pub fn parse_vector(body: &str) -> Result<Vec<Series>, SourceError> {
    let v: serde_json::Value = serde_json::from_str(body).map_err(SourceError::parse)?;
    if v.get("status").and_then(|s| s.as_str()) != Some("success") {
        let err = v.get("error").and_then(|e| e.as_str()).unwrap_or("status is not success");
        return Err(SourceError::Query(err.to_string()));
    }
    let data = v.get("data").ok_or_else(|| SourceError::Parse("no data".into()))?;
    if data.get("resultType").and_then(|t| t.as_str()) != Some("vector") {
        return Err(SourceError::Parse("expected a vector result".into()));
    }
    let result = data.get("result").and_then(|r| r.as_array()).ok_or_else(|| SourceError::Parse("no result".into()))?;
    let mut out = Vec::with_capacity(result.len());
    for r in result {
        let labels: HashMap<String, String> = r
            .get("metric")
            .and_then(|m| m.as_object())
            .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
            .unwrap_or_default();
        let value = r
            .get("value")
            .and_then(|v| v.get(1))
            .and_then(|v| v.as_str())
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| SourceError::Parse("a sample has no value".into()))?;
        let name = labels.get("__name__").cloned().unwrap_or_default();
        out.push(Series { name, labels, value });
    }
    Ok(out)
}

pub struct DcgmSource {
    cfg: DcgmConfig,
    http: reqwest::Client,
}

impl DcgmSource {
    pub fn new(cfg: DcgmConfig, shared: &Shared) -> Self {
        Self { cfg, http: shared.http.clone() }
    }

    async fn read_all(&self) -> Result<Reading, SourceError> {
        match &self.cfg.from {
            Origin::Endpoints { urls, .. } => {
                let timeout = self.cfg.scrape_timeout;
                let pages = futures::future::join_all(urls.iter().map(|u| async move {
                    let url = url::Url::parse(u).map_err(SourceError::parse)?;
                    exposition::parse(&exposition::fetch(&self.http, &url, timeout).await?)
                }))
                .await;
                let mut rows = Vec::new();
                let mut errors = Vec::new();
                for p in pages {
                    match p {
                        Ok(r) => rows.extend(r),
                        Err(e) => errors.push(e),
                    }
                }
                if errors.len() == urls.len() {
                    let first = errors.first().map(ToString::to_string).unwrap_or_default();
                    return Err(SourceError::Connect(format!(
                        "all {} dcgm-exporter endpoint(s) failed; first: {first}",
                        urls.len()
                    )));
                }
                let mut detail = BTreeMap::new();
                detail.insert("exporters_total", urls.len() as f64);
                detail.insert("exporters_down", errors.len() as f64);
                Ok(reading(&self.cfg, utilization(&self.cfg, &rows)?, detail))
            }
            Origin::Prometheus { server, shown, headers, bearer_token } => {
                let req = super::prometheus::QueryRequest {
                    server,
                    params: &[("query".into(), self.cfg.promql())],
                    headers,
                    bearer_token: bearer_token.as_deref(),
                    timeout: Some(self.cfg.scrape_timeout),
                    shown: Some(shown),
                };
                let body = req.send(&self.http).await?;
                let rows = parse_vector(&body)?;
                Ok(reading(&self.cfg, utilization(&self.cfg, &rows)?, BTreeMap::new()))
            }
        }
    }
}

impl Source for DcgmSource {
    fn read(&self) -> BoxFuture<'_, Result<Reading, SourceError>> {
        Box::pin(self.read_all())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScalerId;

    fn cfg(prefix: Option<&str>, metric: Metric) -> DcgmConfig {
        DcgmConfig {
            from: Origin::Endpoints { urls: vec![], shown: vec![] },
            namespace: "llm".into(),
            pod_prefix: prefix.map(str::to_string),
            metric,
            utilization_target: 80.0,
            activation_utilization: 0.0,
            ignore_no_gpus: false,
            scrape_timeout: Duration::from_secs(1),
        }
    }

    fn rows(text: &str) -> Vec<Series> {
        exposition::parse(text).unwrap()
    }

    /// Reference sample lines (section 4.5) plus rows of the same shape for more GPUs.
    const WHOLE: &str = r#"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43",pci_bus_id="00000000:00:07.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="gpu1-wl8sg",DCGM_FI_DRIVER_VERSION="595.58.03",container="vllm",namespace="llm",pod="vllm-0"} 87
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc44",pci_bus_id="00000000:00:08.0",device="nvidia1",modelName="NVIDIA L40S",Hostname="gpu1-wl8sg",DCGM_FI_DRIVER_VERSION="595.58.03",container="vllm",namespace="llm",pod="vllm-0"} 73
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaa",pci_bus_id="00000000:1B:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",container="vllm",namespace="llm",pod="vllm-1"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-bbb",pci_bus_id="00000000:2B:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",container="",namespace="",pod=""} 99
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-ccc",pci_bus_id="00000000:3B:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",container="train",namespace="research",pod="vllm-9"} 100
DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-ddd",pci_bus_id="00000000:4B:00.0",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",container="x",namespace="llm",pod="embedder-0"} 100
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaa",pci_bus_id="00000000:1B:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",container="",namespace="",pod=""} 74211
"#;

    const MIG: &str = r#"DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418",device="nvidia0",modelName="NVIDIA A800-SXM4-80GB",GPU_I_PROFILE="2g.20gb",GPU_I_ID="3",Hostname="msxf-hpc-64-35-ai",DCGM_FI_DRIVER_VERSION="535.129.03",container="vllm",namespace="llm",pod="mig-1"} 0.000000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763",pci_bus_id="00000000:1B:00.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",hostname="gpu-a100",container="vllm",namespace="llm",pod="mig-0"} 0.81
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-265c9814-6156-355b-e589-ff2064894f16",device="nvidia0",modelName="NVIDIA A30",GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",Hostname="yg-a30-0003",container="vllm",namespace="llm",pod="mig-2"} 6012
"#;

    #[test]
    fn whole_gpus_by_pod_with_both_hostname_spellings() {
        // Every pod of llm holding a GPU: vllm-0 (87, 73 → 80), vllm-1 (40), embedder-0 (100).
        let u = utilization(&cfg(None, Metric::GpuUtil), &rows(WHOLE)).unwrap().unwrap();
        assert_eq!((u.gpus, u.pods), (4, 3));
        assert!((u.mean_util - (80.0 + 40.0 + 100.0) / 3.0).abs() < 1e-9);
        // The prefix keeps the vllm pods only; unassigned GPUs and other namespaces never count.
        let c = cfg(Some("vllm-"), Metric::GpuUtil);
        let u = utilization(&c, &rows(WHOLE)).unwrap().unwrap();
        assert_eq!((u.gpus, u.pods, u.mean_util), (3, 2, 60.0));
        let r = reading(&c, Some(u), BTreeMap::new());
        // 2 ready replicas × 60 % / 80 % = 1.5 replica-equivalents.
        assert_eq!(r.value / c.per_replica(), 1.5);
        assert!(r.active);
        assert_eq!(r.detail["mean_util"], 60.0);
    }

    #[test]
    fn narrowed_to_the_scale_target_pods() {
        // The shared read counts every GPU pod of llm: vllm-0 (80), vllm-1 (40), embedder-0 (100).
        let c = cfg(None, Metric::GpuUtil);
        let shared = reading(&c, utilization(&c, &rows(WHOLE)).unwrap(), BTreeMap::new());
        assert!((shared.value - 220.0).abs() < 1e-9);
        let target = |pods: &[(&str, bool)]| TargetPods {
            pods: pods.iter().map(|(n, r)| (n.to_string(), *r)).collect(),
            spec_replicas: None,
        };
        // The target is vllm-0 and vllm-1 (vllm-2 still starting): 2 × 60 %.
        let r = narrow(&c, &shared, &target(&[("vllm-0", true), ("vllm-1", true), ("vllm-2", false)])).unwrap();
        assert_eq!((r.value, r.detail["pods"], r.detail["gpus"], r.detail["target_pods"]), (120.0, 2.0, 3.0, 3.0));
        assert!(r.active);
        // Scaled to zero, or every replica still starting: a known 0.
        for t in [target(&[]), target(&[("vllm-7", false)])] {
            let r = narrow(&c, &shared, &t).unwrap();
            assert_eq!((r.value, r.active), (0.0, false));
        }
        // Ready replicas and no row for any of them: an error naming them, not a 0...
        let e = narrow(&c, &shared, &target(&[("vllm-7", true), ("vllm-8", true)])).unwrap_err();
        assert!(matches!(e, SourceError::NotFound(_)));
        assert!(e.to_string().contains("none of the 2 Ready pods of the scale target (vllm-7, vllm-8)"), "{e}");
        // ...unless dcgmIgnoreNoGpus says so.
        let mut ignore = c.clone();
        ignore.ignore_no_gpus = true;
        assert_eq!(narrow(&ignore, &shared, &target(&[("vllm-7", true)])).unwrap().value, 0.0);
    }

    #[test]
    fn mig_rows_use_engine_activity_even_in_gpu_util_mode() {
        let all = format!("{WHOLE}{MIG}");
        for metric in [Metric::GpuUtil, Metric::EngineActive] {
            let u = utilization(&cfg(Some("mig-"), metric), &rows(&all)).unwrap().unwrap();
            // mig-0 81 %, mig-1 0 % (FB_FREE of mig-2 is not a utilisation).
            assert_eq!((u.gpus, u.pods), (2, 2), "{metric:?}");
            assert!((u.mean_util - 40.5).abs() < 1e-9);
        }
        // engineActive ignores GPU_UTIL rows entirely.
        let e = utilization(&cfg(Some("vllm-"), Metric::EngineActive), &rows(WHOLE)).unwrap_err();
        assert!(e.to_string().contains(ENGINE_ACTIVE), "{e}");
    }

    #[test]
    fn whole_gpu_engine_activity_hint_and_ignore() {
        let text = "DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu=\"0\",UUID=\"GPU-x\",device=\"nvidia0\",hostname=\"n\",namespace=\"llm\",pod=\"vllm-0\"} 0.5\n";
        let e = utilization(&cfg(None, Metric::GpuUtil), &rows(text)).unwrap_err();
        assert!(e.to_string().contains("try dcgmMetric: engineActive"), "{e}");
        let u = utilization(&cfg(None, Metric::EngineActive), &rows(text)).unwrap().unwrap();
        assert_eq!(u.mean_util, 50.0);
        let mut c = cfg(Some("nope-"), Metric::GpuUtil);
        assert!(matches!(utilization(&c, &rows(WHOLE)), Err(SourceError::NotFound(_))));
        c.ignore_no_gpus = true;
        assert_eq!(utilization(&c, &rows(WHOLE)).unwrap(), None);
        let r = reading(&c, None, BTreeMap::new());
        assert_eq!((r.value, r.active), (0.0, false));
    }

    #[test]
    fn prometheus_vector_with_renamed_labels_and_duplicates() {
        // Scraped by a ServiceMonitor without honorLabels: namespace/pod are the exporter's.
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
          {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"0","UUID":"GPU-a","Hostname":"n1","namespace":"gpu-operator","pod":"dcgm-exporter-x","exported_namespace":"llm","exported_pod":"vllm-0","instance":"10.0.0.1:9400"},"value":[1,"70"]},
          {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"0","UUID":"GPU-a","Hostname":"n1","namespace":"gpu-operator","pod":"dcgm-exporter-x","exported_namespace":"llm","exported_pod":"vllm-0","instance":"10.0.0.9:9400"},"value":[1,"72"]},
          {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"1","UUID":"GPU-b","hostname":"n1","namespace":"llm","pod":"vllm-1"},"value":[1,"30"]},
          {"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"2","UUID":"GPU-c","hostname":"n1","namespace":"llm","pod":"dcgm-exporter-y","exported_namespace":"","exported_pod":""},"value":[1,"90"]}
        ]}}"#;
        let r = parse_vector(body).unwrap();
        assert_eq!(r.len(), 4);
        let u = utilization(&cfg(None, Metric::GpuUtil), &r).unwrap().unwrap();
        assert_eq!((u.gpus, u.pods, u.mean_util), (2, 2, 51.0));
        assert!(parse_vector(r#"{"status":"error","error":"bad"}"#).is_err());
        assert!(parse_vector("nope").is_err());
        assert!(parse_vector(r#"{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}"#).is_err());
    }

    /// The DCGM source of a ScaledObject with these keys, parsed as `serve` parses it.
    fn md_parse(pairs: &[(&str, &str)]) -> Result<DcgmConfig, crate::config::ConfigErrors> {
        let id = ScalerId { namespace: "llm".into(), name: "so".into() };
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let cfg = crate::config::parse(&id, &map)?;
        match cfg.sources.as_slice() {
            [crate::sources::SourceConfig::Dcgm(c)] => Ok(c.clone()),
            other => panic!("one DCGM source expected, got {other:?}"),
        }
    }

    #[test]
    fn config() {
        let c = md_parse(&[("dcgmEndpoints", "node-a, 10.0.0.2:9500")]).unwrap();
        let Origin::Endpoints { urls, .. } = &c.from else { panic!() };
        assert_eq!(urls, &["http://node-a:9400/metrics", "http://10.0.0.2:9500/metrics"]);
        assert_eq!((c.utilization_target, c.metric, c.namespace.as_str()), (80.0, Metric::GpuUtil, "llm"));
        let c = md_parse(&[("dcgmPrometheus", "http://u:pw@prom:9090/"), ("dcgmMetric", "engineActive")]).unwrap();
        assert!(!c.label().contains("pw"));
        assert_eq!(
            c.promql(),
            "{__name__=~\"DCGM_FI_PROF_GR_ENGINE_ACTIVE\",namespace=\"llm\"} or \
             {__name__=~\"DCGM_FI_PROF_GR_ENGINE_ACTIVE\",exported_namespace=\"llm\"}"
        );
        let e = md_parse(&[("dcgmEndpoints", "a"), ("dcgmPrometheus", "http://p")]).unwrap_err();
        assert!(e.to_string().contains("dcgmEndpoints or dcgmPrometheus"), "{e}");
        let e = md_parse(&[("dcgmUtilizationTarget", "80")]).unwrap_err();
        assert_eq!(e.0[0].key, "dcgmEndpoints");
        let c = md_parse(&[
            ("dcgmPrometheus", "http://prom:9090"),
            ("dcgmPrometheusCustomHeaders", "X-Scope-OrgID=gpu, X-Other = 1"),
            ("dcgmPrometheusBearerTokenFromEnv", "s3cret"),
        ])
        .unwrap();
        let Origin::Prometheus { headers, bearer_token, .. } = &c.from else { panic!() };
        assert_eq!(headers, &[("X-Scope-OrgID".to_string(), "gpu".to_string()), ("X-Other".into(), "1".into())]);
        assert_eq!(bearer_token.as_deref(), Some("s3cret"));
        let shown = serde_json::to_string(&c).unwrap();
        assert!(shown.contains("X-Scope-OrgID") && !shown.contains("s3cret") && !shown.contains("gpu\""), "{shown}");
        assert_ne!(c.poll_key(), md_parse(&[("dcgmPrometheus", "http://prom:9090")]).unwrap().poll_key());
        for (k, v) in [
            ("dcgmPrometheusCustomHeaders", "Bad Name=x"),
            ("dcgmPrometheusCustomHeaders", "novalue"),
            ("dcgmPrometheusBearerTokenFromEnv", "t"),
            ("dcgmUtilizationTarget", "0"),
            ("dcgmUtilizationTarget", "120"),
            ("dcgmMetric", "sm"),
            ("dcgmPrometheus", "prom:9090"),
            ("dcgmIgnoreNoGpus", "maybe"),
        ] {
            let mut pairs = vec![(k, v)];
            if k != "dcgmPrometheus" {
                pairs.push(("dcgmEndpoints", "a"));
            }
            let e = md_parse(&pairs).unwrap_err();
            assert!(e.0.iter().any(|x| x.key == k), "{k}={v}: {e}");
        }
    }
}
