//! vLLM: the engine's own queue, scraped from every pod's `/metrics` (Prometheus text,
//! parsed with `prometheus-parse`; see `exposition.rs` for the colon workaround).
//!
//! - Pods: `vllmEndpoints` (URLs or host:port, scraped as given) or `vllmService` (the
//!   ready endpoints of the Service's EndpointSlices in the ScaledObject's namespace, kept
//!   by one watch per Service (`slices.rs`) through one lazily created, process-wide
//!   `kube::Client`, and listed directly while that watch has not listed yet or is failing
//!   (`slices::trusted`); `detail["slices_from_watch"]` says which).
//! - Value: `waiting + running` summed over pods and engines (`vllm:num_requests_waiting`,
//!   `vllm:num_requests_running`), compared with `vllmPerReplica`. With
//!   `vllmKvCacheTarget`, the KV-cache signal `Σ_pods usage / target` (= mean usage × pods
//!   / target; `vllm:kv_cache_usage_perc`, else the older `vllm:gpu_cache_usage_perc`, a
//!   0–1 fraction) is expressed in the same units: value = max(queue, kv × vllmPerReplica),
//!   so `value / vllmPerReplica` is the larger of the two replica-equivalents.
//! - `detail["arrival_rate"]`: served requests/s, the rate of `vllm:request_success_total`
//!   (all `finished_reason`s) between consecutive polls, summed over pods that were read
//!   at both polls (a counter that went down restarted from 0). Absent on the first poll.
//! - Queue time against the SLO: from the `vllm:request_queue_time_seconds` histogram (time a
//!   request spent WAITING before its first schedule), per poll interval, the requests/s that
//!   left the queue (`queue_started_rate`), those that had waited longer than `sloSeconds`
//!   (`queue_late_rate`) and their share (`queue_late_share`), counted over pods read at both
//!   polls, and their running totals since the source's first poll (`queue_started_total`,
//!   `queue_late_total`). Buckets are read at the largest bound ≤ `sloSeconds` (`queue_slo_bound_seconds`;
//!   vLLM's bounds include 0.3–2.5, 5, 10, 15, 20, 30 … s), so between two bounds the share
//!   counts some requests as late that were not: an upper bound, never an understatement.
//!   This is what the fleet's users saw, measured where it happens; `serve` exports it per
//!   ScaledObject as `prescale_queue_late_share`. A request still waiting is counted when it is
//!   scheduled, so a cold start shows up when it ends.
//! - Pods down: the others are used and `detail["pods_down"]` counts the failed ones; a pod
//!   answering without any `vllm:num_requests_*` series (for `vllmModel`) counts as down.
//!   No pod up: the read fails (never a zero). A Service with no ready endpoint (the
//!   fleet is at zero) reads 0 pods and 0 requests: the API positively said so.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::exposition::{self, Series};
use super::slices::{error_chain, list, SliceWatch, SliceWatches};
use super::{BoxFuture, Reading, Shared, Source, SourceError};
use crate::config::Metadata;
use crate::redact::redact_url;

const WAITING: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const KV: &str = "vllm:kv_cache_usage_perc";
const KV_OLD: &str = "vllm:gpu_cache_usage_perc";
const SUCCESS: &str = "vllm:request_success_total";
const QUEUE_TIME_BUCKET: &str = "vllm:request_queue_time_seconds_bucket";

/// Where the pods are.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "from")]
pub enum Pods {
    /// Scrape URLs as given (`/metrics` appended when no path was given).
    Endpoints {
        #[serde(skip)]
        urls: Vec<String>,
        /// The same, redacted.
        shown: Vec<String>,
    },
    /// Ready endpoints of a Service's EndpointSlices.
    Service { namespace: String, name: String, port: PortRef },
}

/// `vllmPort`: a number, or the name of a port of the EndpointSlices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum PortRef {
    Number(u16),
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VllmConfig {
    pub pods: Pods,
    pub model: Option<String>,
    pub per_replica: f64,
    pub kv_cache_target: Option<f64>,
    pub activation_value: f64,
    /// `sloSeconds`: the queue time the late share is measured against.
    pub slo_s: f64,
    /// Timeout of one pod's scrape (and of the EndpointSlice list): 3/4 of
    /// `sourceTimeoutSeconds`, so one hung pod is "down" instead of failing the read.
    #[serde(skip)]
    pub scrape_timeout: Duration,
}

/// Default `vllmPerReplica`: waiting + running requests one replica should carry.
pub const DEFAULT_PER_REPLICA: f64 = 16.0;
pub const DEFAULT_PORT: u16 = 8000;

impl VllmConfig {
    /// `None` when no `vllm*` key is present.
    pub fn parse(md: &mut Metadata<'_>, common: super::CommonKeys) -> Option<Self> {
        if !md.has_prefix("vllm") {
            return None;
        }
        let endpoints = md.string("vllmEndpoints");
        let service = md.string("vllmService");
        let port_raw = md.string("vllmPort");
        let model = md.string("vllmModel").filter(|m| !m.is_empty());
        let per_replica = md.f64_in("vllmPerReplica", DEFAULT_PER_REPLICA, 0.0, f64::MAX, true);
        let kv_cache_target = match md.string("vllmKvCacheTarget") {
            None => Some(None),
            Some(raw) => match raw.parse::<f64>() {
                Ok(x) if x > 0.0 && x <= 1.0 => Some(Some(x)),
                _ => {
                    md.error(
                        "vllmKvCacheTarget",
                        Some(&raw),
                        "must be a fraction greater than 0 and at most 1 (e.g. 0.8)",
                    );
                    None
                }
            },
        };
        let activation_value = md.f64_in("vllmActivationValue", 0.0, 0.0, f64::MAX, false);
        let scrape_timeout = common.source_timeout.mul_f64(0.75);

        let port = match port_raw.as_deref() {
            None => Some(PortRef::Number(DEFAULT_PORT)),
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Some(PortRef::Number(n)),
                Ok(_) => {
                    md.error("vllmPort", Some(p), "must be a port number 1–65535 or a port name");
                    None
                }
                Err(_) if is_port_name(p) => Some(PortRef::Name(p.to_string())),
                Err(_) => {
                    md.error("vllmPort", Some(p), "must be a port number 1–65535 or a port name");
                    None
                }
            },
        };
        let pods = match (endpoints.filter(|e| !e.is_empty()), service.filter(|s| !s.is_empty())) {
            (Some(_), Some(s)) => {
                md.error("vllmService", Some(&s), "set either vllmEndpoints or vllmService, not both");
                None
            }
            (None, None) => {
                md.error("vllmEndpoints", None, "is required (or vllmService): where the vLLM pods are");
                None
            }
            (Some(list), None) => {
                if port_raw.is_some() {
                    md.error(
                        "vllmPort",
                        port_raw.as_deref(),
                        "only applies with vllmService (vllmEndpoints carry their ports)",
                    );
                    None
                } else {
                    exposition::endpoint_list(md, "vllmEndpoints", &list, DEFAULT_PORT)
                        .map(|urls| Pods::Endpoints { shown: urls.iter().map(|u| redact_url(u)).collect(), urls })
                }
            }
            (None, Some(name)) => {
                if is_dns_label(&name) {
                    port.map(|port| Pods::Service { namespace: md.id().namespace.clone(), name, port })
                } else {
                    md.error("vllmService", Some(&name), "not a Service name (lower-case DNS label)");
                    None
                }
            }
        };
        Some(Self {
            pods: pods?,
            model,
            per_replica: per_replica?,
            kv_cache_target: kv_cache_target?,
            activation_value: activation_value?,
            slo_s: common.slo_s,
            scrape_timeout,
        })
    }

    pub fn label(&self) -> String {
        let model = self.model.as_deref().map(|m| format!(" model \"{m}\"")).unwrap_or_default();
        match &self.pods {
            Pods::Endpoints { shown, .. } => format!("vllm{model} on {} endpoint(s) {}", shown.len(), shown.join(",")),
            Pods::Service { namespace, name, .. } => format!("vllm{model} on service {namespace}/{name}"),
        }
    }

    pub fn per_replica(&self) -> f64 {
        self.per_replica
    }

    pub fn poll_key(&self) -> String {
        let pods = match &self.pods {
            Pods::Endpoints { urls, .. } => format!("endpoints={}", urls.join(",")),
            Pods::Service { namespace, name, port } => format!("service={namespace}/{name}:{port:?}"),
        };
        format!(
            "vllm|{pods}|{:?}|{}|{:?}|{}|{}|{:?}",
            self.model, self.per_replica, self.kv_cache_target, self.activation_value, self.slo_s, self.scrape_timeout
        )
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_port_name(s: &str) -> bool {
    // IANA_SVC_NAME: ≤ 15 chars, lower-case alphanumerics and '-', at least one letter.
    is_dns_label(s) && s.len() <= 15 && s.bytes().any(|b| b.is_ascii_lowercase())
}

/// The process-wide Kubernetes client, created on first use (in-cluster config or
/// KUBECONFIG). A failed creation is retried on the next read.
#[derive(Default)]
pub struct KubeClient {
    cell: tokio::sync::OnceCell<kube::Client>,
}

impl KubeClient {
    pub async fn get(&self) -> Result<kube::Client, SourceError> {
        self.cell
            .get_or_try_init(|| async {
                kube::Client::try_default().await.map_err(|e| {
                    SourceError::connect(format!(
                        "no Kubernetes API (neither in-cluster config nor KUBECONFIG works): {}",
                        error_chain(&e)
                    ))
                })
            })
            .await
            .cloned()
    }
}

/// What one pod's page says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodStats {
    pub waiting: f64,
    pub running: f64,
    /// Mean KV-cache usage (0–1) over the pod's engines, when reported.
    pub kv: Option<f64>,
    /// `vllm:request_success_total` summed over finished_reason and engines, when reported.
    pub success: Option<f64>,
    /// Queue-time counts against the SLO, when the pod reports the histogram.
    pub queue: Option<QueueCounts>,
}

/// Cumulative counts of `vllm:request_queue_time_seconds` (summed over engines).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueCounts {
    /// Requests that left the queue (the `+Inf` bucket).
    pub started: f64,
    /// Of those, the ones over `bound_s` (the `+Inf` bucket less the `bound_s` bucket).
    pub late: f64,
    /// The bucket bound read: the largest ≤ the SLO.
    pub bound_s: f64,
}

/// One bucket series of the queue-time histogram: its labels other than `le` (sorted; they
/// name the engine and model), its bound and its count.
struct Bucket<'a> {
    key: Vec<(&'a str, &'a str)>,
    le: f64,
    count: f64,
}

/// One engine's histogram: the bucket read against the SLO (bound, count) and `+Inf`.
#[derive(Default)]
struct EngineQueue {
    within: Option<(f64, f64)>,
    total: Option<f64>,
}

/// The queue-time counts of one pod's bucket series, read at the largest bound ≤ `slo_s`.
/// None when no engine reports both that bound and `+Inf`.
fn queue_counts(buckets: &[Bucket<'_>], slo_s: f64) -> Option<QueueCounts> {
    let mut engines: BTreeMap<&[(&str, &str)], EngineQueue> = BTreeMap::new();
    for b in buckets {
        let e = engines.entry(b.key.as_slice()).or_default();
        if b.le == f64::INFINITY {
            e.total = Some(b.count);
        } else if b.le <= slo_s * (1.0 + 1e-9) && e.within.is_none_or(|(bound, _)| b.le > bound) {
            e.within = Some((b.le, b.count));
        }
    }
    let mut out: Option<QueueCounts> = None;
    for e in engines.into_values() {
        let (Some((bound, within)), Some(total)) = (e.within, e.total) else { continue };
        let q = out.get_or_insert(QueueCounts { bound_s: bound, ..Default::default() });
        q.started += total;
        q.late += (total - within).max(0.0);
        q.bound_s = q.bound_s.min(bound);
    }
    out
}

/// Read one pod's series (only `model_name == model` when given); the queue time against
/// `slo_s`. `Err` names why the page does not count as a vLLM pod.
pub fn pod_stats(series: &[Series], model: Option<&str>, slo_s: f64) -> Result<PodStats, String> {
    let mut st = PodStats::default();
    let (mut seen_queue, mut kv_new, mut kv_old, mut success) = (false, Vec::new(), Vec::new(), None::<f64>);
    let mut buckets = Vec::new();
    for s in series {
        if model.is_some_and(|m| s.label("model_name") != Some(m)) || !s.value.is_finite() {
            continue;
        }
        let v = s.value.max(0.0);
        match s.name.as_str() {
            WAITING => {
                st.waiting += v;
                seen_queue = true;
            }
            RUNNING => {
                st.running += v;
                seen_queue = true;
            }
            KV => kv_new.push(v.min(1.0)),
            KV_OLD => kv_old.push(v.min(1.0)),
            SUCCESS => *success.get_or_insert(0.0) += v,
            QUEUE_TIME_BUCKET => {
                if let Some(le) = s.label("le").and_then(|l| l.trim().parse::<f64>().ok()).filter(|l| !l.is_nan()) {
                    let mut key: Vec<(&str, &str)> = s
                        .labels
                        .iter()
                        .filter(|(k, _)| k.as_str() != "le")
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    key.sort_unstable();
                    buckets.push(Bucket { key, le, count: v });
                }
            }
            _ => {}
        }
    }
    if !seen_queue {
        return Err(match model {
            Some(m) => format!("no {WAITING} / {RUNNING} series for model_name \"{m}\""),
            None => format!("no {WAITING} / {RUNNING} series (not a vLLM /metrics page?)"),
        });
    }
    let kv = if kv_new.is_empty() { kv_old } else { kv_new };
    st.kv = (!kv.is_empty()).then(|| kv.iter().sum::<f64>() / kv.len() as f64);
    st.success = success;
    st.queue = queue_counts(&buckets, slo_s);
    Ok(st)
}

/// Per-endpoint counter memory for the served-request rate.
#[derive(Debug, Default)]
pub struct RateTracker {
    last: HashMap<String, (Instant, f64)>,
}

impl RateTracker {
    /// Record this poll's counters and return the summed rate over endpoints that have a
    /// previous value (`None` when none has). Endpoints not in `now` are forgotten.
    pub fn update(&mut self, at: Instant, now: &[(String, f64)]) -> Option<f64> {
        self.update_counts(at, now).map(|(rate, _)| rate)
    }

    /// As [`update`](Self::update), with the summed increase of those endpoints' counters.
    pub fn update_counts(&mut self, at: Instant, now: &[(String, f64)]) -> Option<(f64, f64)> {
        let mut sums = None::<(f64, f64)>;
        for (ep, total) in now {
            if let Some((t0, v0)) = self.last.get(ep) {
                let dt = at.saturating_duration_since(*t0).as_secs_f64();
                if dt > 0.0 {
                    // A counter that went down restarted from 0 (pod restart).
                    let delta = if *total >= *v0 { total - v0 } else { *total };
                    let (rate, count) = sums.get_or_insert((0.0, 0.0));
                    *rate += delta / dt;
                    *count += delta;
                }
            }
        }
        let keep: HashSet<&String> = now.iter().map(|(e, _)| e).collect();
        self.last.retain(|k, _| keep.contains(k));
        for (ep, total) in now {
            self.last.insert(ep.clone(), (at, *total));
        }
        sums
    }
}

/// The queue-time rates over one poll interval (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueRates {
    pub started: f64,
    pub late: f64,
    pub bound_s: f64,
    /// Requests started (and of them late) since this source's first poll, counted over
    /// endpoints read at two polls in a row: running totals, so a reader can count the
    /// requests between any two of its reads.
    pub started_total: f64,
    pub late_total: f64,
}

/// Per-endpoint counter memory of the queue-time histogram: requests started and late, and
/// their running totals.
#[derive(Debug, Default)]
pub struct QueueTracker {
    started: RateTracker,
    late: RateTracker,
    started_total: f64,
    late_total: f64,
}

impl QueueTracker {
    /// Record this poll's counts per endpoint; the rates over endpoints read at both polls
    /// (`None` on the first poll, or when no pod reports the histogram).
    pub fn update(&mut self, at: Instant, now: &[(String, QueueCounts)]) -> Option<QueueRates> {
        let started: Vec<(String, f64)> = now.iter().map(|(e, q)| (e.clone(), q.started)).collect();
        let late: Vec<(String, f64)> = now.iter().map(|(e, q)| (e.clone(), q.late)).collect();
        let s = self.started.update_counts(at, &started);
        let l = self.late.update_counts(at, &late);
        let bound_s = now.iter().map(|(_, q)| q.bound_s).reduce(f64::min)?;
        let ((started, n_started), (late, n_late)) = (s?, l?);
        self.started_total += n_started;
        self.late_total += n_late.min(n_started);
        Some(QueueRates {
            started,
            late: late.min(started),
            bound_s,
            started_total: self.started_total,
            late_total: self.late_total,
        })
    }
}

/// Combine the pods read this poll into the reading (`down` failed ones).
pub fn combine(
    cfg: &VllmConfig,
    up: &[PodStats],
    down: usize,
    arrival_rate: Option<f64>,
    queue_rates: Option<QueueRates>,
) -> Result<Reading, SourceError> {
    let waiting: f64 = up.iter().map(|p| p.waiting).sum();
    let running: f64 = up.iter().map(|p| p.running).sum();
    let queue = waiting + running;
    let mut detail = BTreeMap::new();
    detail.insert("waiting", waiting);
    detail.insert("running", running);
    detail.insert("pods_up", up.len() as f64);
    detail.insert("pods_down", down as f64);
    detail.insert("pods_total", (up.len() + down) as f64);
    if let Some(r) = arrival_rate {
        detail.insert("arrival_rate", r);
    }
    if let Some(q) = queue_rates {
        detail.insert("queue_started_rate", q.started);
        detail.insert("queue_late_rate", q.late);
        detail.insert("queue_slo_bound_seconds", q.bound_s);
        detail.insert("queue_started_total", q.started_total);
        detail.insert("queue_late_total", q.late_total);
        if q.started > 0.0 {
            detail.insert("queue_late_share", (q.late / q.started).clamp(0.0, 1.0));
        }
    }
    let kv: Vec<f64> = up.iter().filter_map(|p| p.kv).collect();
    if !kv.is_empty() {
        detail.insert("kv_cache_mean", kv.iter().sum::<f64>() / kv.len() as f64);
    }
    let mut value = queue;
    if let Some(target) = cfg.kv_cache_target {
        if kv.is_empty() {
            return Err(SourceError::NotFound(format!(
                "vllmKvCacheTarget is set but no pod reports {KV} (or {KV_OLD})"
            )));
        }
        let kv_replicas = kv.iter().sum::<f64>() / target;
        detail.insert("kv_replicas", kv_replicas);
        value = value.max(kv_replicas * cfg.per_replica);
    }
    Ok(Reading { value, active: value > cfg.activation_value, detail, pods: None })
}

pub struct VllmSource {
    cfg: VllmConfig,
    http: reqwest::Client,
    kube: Arc<KubeClient>,
    slices: Arc<SliceWatches>,
    /// `vllmService`: the Service's EndpointSlice watch, started at the first poll.
    watch: OnceLock<Arc<SliceWatch>>,
    rates: Mutex<RateTracker>,
    queue: Mutex<QueueTracker>,
}

impl VllmSource {
    pub fn new(cfg: VllmConfig, shared: &Shared) -> Self {
        Self {
            cfg,
            http: shared.http.clone(),
            kube: shared.kube.clone(),
            slices: shared.slices.clone(),
            watch: OnceLock::new(),
            rates: Mutex::new(RateTracker::default()),
            queue: Mutex::new(QueueTracker::default()),
        }
    }

    /// The scrape URLs of the pods this poll, and for `vllmService` whether the Service's
    /// EndpointSlice watch gave them (else they were listed).
    async fn discover(&self) -> Result<(Vec<String>, Option<bool>), SourceError> {
        match &self.cfg.pods {
            Pods::Endpoints { urls, .. } => Ok((urls.clone(), None)),
            Pods::Service { namespace, name, port } => {
                let client = self.kube.get().await?;
                let watch = self.watch.get_or_init(|| self.slices.watch(&client, namespace, name));
                match watch.slices(crate::engine::clock::now_ms()) {
                    Ok(slices) => return Ok((slice_urls(slices.iter().map(AsRef::as_ref), port), Some(true))),
                    Err(why) => {
                        tracing::debug!(service = %format!("{namespace}/{name}"), %why, "listing EndpointSlices")
                    }
                }
                let slices =
                    list(client, namespace, name, self.cfg.scrape_timeout).await.map_err(SourceError::connect)?;
                Ok((slice_urls(&slices, port), Some(false)))
            }
        }
    }

    async fn read_all(&self) -> Result<Reading, SourceError> {
        let (urls, from_watch) = self.discover().await?;
        let mut reading = self.read_pods(&urls).await?;
        if let Some(w) = from_watch {
            reading.detail.insert("slices_from_watch", if w { 1.0 } else { 0.0 });
        }
        Ok(reading)
    }

    async fn read_pods(&self, urls: &[String]) -> Result<Reading, SourceError> {
        if urls.is_empty() {
            return match &self.cfg.pods {
                // The API answered and the Service has no ready pod: the fleet is at zero
                // (or none is ready yet). That is a known 0 in-flight requests at the pods —
                // requests then wait in the gateway or broker, whose own signals drive the
                // wake-up — not missing data.
                Pods::Service { .. } => {
                    let detail =
                        [("pods_total", 0.0), ("pods_up", 0.0), ("pods_down", 0.0), ("waiting", 0.0), ("running", 0.0)]
                            .into_iter()
                            .collect();
                    Ok(Reading { value: 0.0, active: false, detail, pods: None })
                }
                Pods::Endpoints { .. } => Err(SourceError::Connect("no endpoint".into())),
            };
        }
        let timeout = self.cfg.scrape_timeout;
        let model = self.cfg.model.as_deref();
        let slo_s = self.cfg.slo_s;
        let pages = futures::future::join_all(urls.iter().map(|u| async move {
            let url = url::Url::parse(u).map_err(SourceError::parse)?;
            let text = exposition::fetch(&self.http, &url, timeout).await?;
            let series = exposition::parse(&text)?;
            pod_stats(&series, model, slo_s).map_err(|why| SourceError::NotFound(format!("{}: {why}", redact_url(u))))
        }))
        .await;
        let at = Instant::now();
        let mut up = Vec::new();
        let mut counters = Vec::new();
        let mut queue_counts = Vec::new();
        let mut errors = Vec::new();
        for (u, r) in urls.iter().zip(pages) {
            match r {
                Ok(st) => {
                    if let Some(c) = st.success {
                        counters.push((u.clone(), c));
                    }
                    if let Some(q) = st.queue {
                        queue_counts.push((u.clone(), q));
                    }
                    up.push(st);
                }
                Err(e) => errors.push(e),
            }
        }
        let rate = self.rates.lock().unwrap_or_else(|e| e.into_inner()).update(at, &counters);
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner()).update(at, &queue_counts);
        if up.is_empty() {
            let n = urls.len();
            let first = errors.first().map(ToString::to_string).unwrap_or_default();
            return Err(SourceError::Connect(format!("all {n} vLLM pod(s) failed; first: {first}")));
        }
        if !errors.is_empty() {
            tracing::debug!(source = %self.cfg.label(), failed = errors.len(), first = %errors[0], "some vLLM pods are down");
        }
        combine(&self.cfg, &up, errors.len(), rate, queue)
    }
}

/// Scrape URLs of the ready endpoints of these slices (see [`slice_bases`]).
pub fn slice_urls<'a>(
    slices: impl IntoIterator<Item = &'a k8s_openapi::api::discovery::v1::EndpointSlice>,
    port: &PortRef,
) -> Vec<String> {
    slice_bases(slices, port).into_iter().map(|b| format!("{b}/metrics")).collect()
}

/// `http://host:port` of the ready endpoints of these slices. An endpoint listed in several
/// slices (dual-stack: one IPv4 and one IPv6 slice) is listed once, preferring IPv4.
pub fn slice_bases<'a>(
    slices: impl IntoIterator<Item = &'a k8s_openapi::api::discovery::v1::EndpointSlice>,
    port: &PortRef,
) -> Vec<String> {
    let mut by_pod: BTreeMap<String, (bool, String)> = BTreeMap::new();
    for sl in slices {
        let ty = sl.address_type.as_str();
        if !matches!(ty, "IPv4" | "IPv6" | "FQDN") {
            continue;
        }
        let port_no = match port {
            PortRef::Number(n) => Some(*n),
            PortRef::Name(name) => sl
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0),
        };
        let Some(port_no) = port_no else { continue };
        for ep in sl.endpoints.iter().flatten() {
            // `ready` unset means unknown, which consumers read as ready (API docs).
            let cond = ep.conditions.as_ref();
            let ready = cond.and_then(|c| c.ready).unwrap_or(true);
            let terminating = cond.and_then(|c| c.terminating).unwrap_or(false);
            if !ready || terminating {
                continue;
            }
            let Some(addr) = ep.addresses.first().filter(|a| !a.is_empty()) else { continue };
            let host = if ty == "IPv6" { format!("[{addr}]") } else { addr.clone() };
            let url = format!("http://{host}:{port_no}");
            let who = ep
                .target_ref
                .as_ref()
                .and_then(|r| r.uid.clone().or_else(|| r.name.clone()))
                .unwrap_or_else(|| url.clone());
            let v4 = ty != "IPv6";
            match by_pod.get(&who) {
                Some((true, _)) => {}
                Some((false, _)) if !v4 => {}
                _ => {
                    by_pod.insert(who, (v4, url));
                }
            }
        }
    }
    let mut urls: Vec<String> = by_pod.into_values().map(|(_, u)| u).collect();
    urls.sort();
    urls.dedup();
    urls
}

impl Source for VllmSource {
    fn read(&self) -> BoxFuture<'_, Result<Reading, SourceError>> {
        Box::pin(self.read_all())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScalerId;

    const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

    /// The reference sample (section 5.1), every label as vLLM writes it.
    fn page(running: f64, waiting: f64, kv: f64, success: f64) -> String {
        format!(
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
             # TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{engine=\"0\",model_name=\"{MODEL}\"}} {running:.1}\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{engine=\"0\",model_name=\"{MODEL}\"}} {waiting:.1}\n\
             vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"{MODEL}\"}} {kv}\n\
             vllm:generation_tokens_total{{engine=\"0\",model_name=\"{MODEL}\"}} 27453.0\n\
             # TYPE vllm:request_success counter\n\
             vllm:request_success_total{{engine=\"0\",finished_reason=\"length\",model_name=\"{MODEL}\"}} {success:.1}\n\
             vllm:request_success_total{{engine=\"0\",finished_reason=\"stop\",model_name=\"{MODEL}\"}} 0.0\n\
             vllm:request_success_created{{engine=\"0\",finished_reason=\"stop\",model_name=\"{MODEL}\"}} 1.7e9\n\
             # TYPE vllm:time_to_first_token_seconds histogram\n\
             vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"0.1\",model_name=\"{MODEL}\"}} 140.0\n\
             vllm:time_to_first_token_seconds_count{{engine=\"0\",model_name=\"{MODEL}\"}} 140.0\n\
             vllm:time_to_first_token_seconds_sum{{engine=\"0\",model_name=\"{MODEL}\"}} 5.31\n"
        )
    }

    fn stats(text: &str, model: Option<&str>) -> Result<PodStats, String> {
        pod_stats(&exposition::parse(text).unwrap(), model, 5.0)
    }

    /// The vLLM source of a ScaledObject with these keys, parsed as `serve` parses it.
    fn md_parse(pairs: &[(&str, &str)]) -> Result<VllmConfig, crate::config::ConfigErrors> {
        let id = ScalerId { namespace: "llm".into(), name: "so".into() };
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let cfg = crate::config::parse(&id, &map)?;
        match cfg.sources.as_slice() {
            [crate::sources::SourceConfig::Vllm(c)] => Ok(c.clone()),
            other => panic!("one vLLM source expected, got {other:?}"),
        }
    }

    fn cfg(kv: Option<f64>) -> VllmConfig {
        VllmConfig {
            pods: Pods::Endpoints { urls: vec![], shown: vec![] },
            model: None,
            per_replica: 16.0,
            kv_cache_target: kv,
            activation_value: 0.0,
            slo_s: 5.0,
            scrape_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn reads_the_reference_sample() {
        let st = stats(&page(8.0, 6.0, 0.765, 131.0), None).unwrap();
        assert_eq!(st, PodStats { waiting: 6.0, running: 8.0, kv: Some(0.765), success: Some(131.0), queue: None });
    }

    #[test]
    fn older_kv_name_is_the_fallback_and_engines_are_summed_or_averaged() {
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.0\n\
                    vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 3.0\n\
                    vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1.0\n\
                    vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n\
                    vllm:gpu_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.7\n";
        let st = stats(text, None).unwrap();
        assert_eq!((st.running, st.waiting), (5.0, 1.0));
        assert!((st.kv.unwrap() - 0.6).abs() < 1e-12);
        assert_eq!(st.success, None);
        // Both names present: the current one wins.
        let both = format!("{text}vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.1\n");
        assert_eq!(stats(&both, None).unwrap().kv, Some(0.1));
    }

    #[test]
    fn model_filter() {
        let text = format!(
            "{}vllm:num_requests_waiting{{engine=\"0\",model_name=\"other\"}} 100.0\n",
            page(8.0, 6.0, 0.5, 1.0)
        );
        assert_eq!(stats(&text, None).unwrap().waiting, 106.0);
        assert_eq!(stats(&text, Some(MODEL)).unwrap().waiting, 6.0);
        assert_eq!(stats(&text, Some("other")).unwrap().waiting, 100.0);
        let e = stats(&text, Some("missing")).unwrap_err();
        assert!(e.contains("model_name \"missing\""), "{e}");
        assert!(stats("up 1\n", None).unwrap_err().contains("not a vLLM"));
    }

    /// `vllm:request_queue_time_seconds` as vLLM writes it (its request-latency bounds), for
    /// one engine: `counts[i]` requests waited at most `BOUNDS[i]`, `total` in all.
    const BOUNDS: [f64; 21] = [
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
        1920.0, 7680.0,
    ];

    fn queue_histogram(engine: &str, model: &str, under: impl Fn(f64) -> f64, total: f64) -> String {
        let mut out = String::new();
        for b in BOUNDS {
            out.push_str(&format!(
                "vllm:request_queue_time_seconds_bucket{{engine=\"{engine}\",le=\"{b:?}\",model_name=\"{model}\"}} {:.1}\n",
                under(b)
            ));
        }
        out.push_str(&format!(
            "vllm:request_queue_time_seconds_bucket{{engine=\"{engine}\",le=\"+Inf\",model_name=\"{model}\"}} {total:.1}\n\
             vllm:request_queue_time_seconds_count{{engine=\"{engine}\",model_name=\"{model}\"}} {total:.1}\n\
             vllm:request_queue_time_seconds_sum{{engine=\"{engine}\",model_name=\"{model}\"}} 812.5\n"
        ));
        out
    }

    #[test]
    fn queue_time_is_read_at_the_largest_bound_within_the_slo() {
        // Engine 0: 100 requests, 90 within 2.5 s, 95 within 5 s; engine 1: 40, all within 1 s;
        // another model: 1,000 requests, all late.
        let e0 = |b: f64| {
            if b < 2.5 {
                50.0
            } else if b < 5.0 {
                90.0
            } else if b < 10.0 {
                95.0
            } else {
                100.0
            }
        };
        let text = format!(
            "{}# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.\n\
             # TYPE vllm:request_queue_time_seconds histogram\n{}{}{}",
            page(8.0, 6.0, 0.5, 1.0),
            queue_histogram("0", MODEL, e0, 100.0),
            queue_histogram("1", MODEL, |b| if b >= 1.0 { 40.0 } else { 0.0 }, 40.0),
            queue_histogram("0", "other", |_| 0.0, 1000.0),
        );
        let series = exposition::parse(&text).unwrap();
        let q = |slo: f64, model: Option<&str>| pod_stats(&series, model, slo).unwrap().queue;
        assert_eq!(q(5.0, Some(MODEL)), Some(QueueCounts { started: 140.0, late: 5.0, bound_s: 5.0 }));
        // Between two bounds: the lower one (an upper bound on the late count).
        assert_eq!(q(4.0, Some(MODEL)), Some(QueueCounts { started: 140.0, late: 10.0, bound_s: 2.5 }));
        assert_eq!(q(5.0, None), Some(QueueCounts { started: 1140.0, late: 1005.0, bound_s: 5.0 }));
        // An SLO under the first bound cannot be read: no figure rather than a wrong one.
        assert_eq!(q(0.1, Some(MODEL)), None);
        // The same page without the TYPE line (the buckets as plain samples) reads alike.
        let untyped = text.replace("# TYPE vllm:request_queue_time_seconds histogram\n", "");
        let series = exposition::parse(&untyped).unwrap();
        assert_eq!(pod_stats(&series, Some(MODEL), 5.0).unwrap().queue.unwrap().late, 5.0);
        // A pod without the histogram (an older vLLM) has no queue figure.
        assert_eq!(stats(&page(8.0, 6.0, 0.5, 1.0), None).unwrap().queue, None);
    }

    #[test]
    fn queue_rates_over_polls_and_their_detail() {
        let mut tr = QueueTracker::default();
        let t0 = Instant::now();
        let qc = |started: f64, late: f64| QueueCounts { started, late, bound_s: 5.0 };
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(tr.update(t0, &[("a".into(), qc(100.0, 5.0)), ("b".into(), qc(10.0, 0.0))]), None);
        // 2 s later: a started 20 more (4 late), b 4 more (none late).
        let r = tr.update(at(2), &[("a".into(), qc(120.0, 9.0)), ("b".into(), qc(14.0, 0.0))]).unwrap();
        let rates = QueueRates { started: 12.0, late: 2.0, bound_s: 5.0, started_total: 24.0, late_total: 4.0 };
        assert_eq!(r, rates);
        // a restarted (its counters went down): counted from zero.
        let r = tr.update(at(3), &[("a".into(), qc(3.0, 3.0)), ("b".into(), qc(14.0, 0.0))]).unwrap();
        assert_eq!(r, QueueRates { started: 3.0, late: 3.0, bound_s: 5.0, started_total: 27.0, late_total: 7.0 });
        // No pod reports the histogram: no figure.
        assert_eq!(tr.update(at(4), &[]), None);

        let p = PodStats { waiting: 1.0, ..Default::default() };
        let r = combine(
            &cfg(None),
            std::slice::from_ref(&p),
            0,
            None,
            Some(QueueRates { started: 12.0, late: 3.0, bound_s: 5.0, started_total: 60.0, late_total: 15.0 }),
        )
        .unwrap();
        assert_eq!(
            (r.detail["queue_started_rate"], r.detail["queue_late_rate"], r.detail["queue_late_share"]),
            (12.0, 3.0, 0.25)
        );
        assert_eq!(r.detail["queue_slo_bound_seconds"], 5.0);
        assert_eq!((r.detail["queue_started_total"], r.detail["queue_late_total"]), (60.0, 15.0));
        // Nobody left the queue this interval: the rates, but no share (0/0 is not "none late").
        let r = combine(
            &cfg(None),
            &[p],
            0,
            None,
            Some(QueueRates { started: 0.0, late: 0.0, bound_s: 5.0, started_total: 0.0, late_total: 0.0 }),
        )
        .unwrap();
        assert_eq!(r.detail["queue_started_rate"], 0.0);
        assert!(!r.detail.contains_key("queue_late_share"));
    }

    #[test]
    fn the_slo_is_the_planners_slo_seconds_and_splits_the_poll() {
        let a = md_parse(&[("vllmService", "s")]).unwrap();
        let b = md_parse(&[("vllmService", "s"), ("sloSeconds", "10")]).unwrap();
        assert_eq!((a.slo_s, b.slo_s), (5.0, 10.0));
        assert_ne!(a.poll_key(), b.poll_key(), "ScaledObjects with other SLOs share no poll");
    }

    #[test]
    fn counter_rate_and_reset() {
        let mut r = RateTracker::default();
        let t0 = Instant::now();
        let a = |v: f64| ("a".to_string(), v);
        let b = |v: f64| ("b".to_string(), v);
        assert_eq!(r.update(t0, &[a(100.0), b(10.0)]), None, "no rate on the first poll");
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(r.update(t1, &[a(110.0), b(14.0)]), Some(7.0));
        // b restarted (counter went down to 3): counts 3 since the restart.
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(r.update(t2, &[a(110.0), b(3.0)]), Some(3.0));
        // a gone: forgotten; when it comes back it has no previous value.
        let t3 = t2 + Duration::from_secs(1);
        assert_eq!(r.update(t3, &[b(4.0)]), Some(1.0));
        let t4 = t3 + Duration::from_secs(1);
        assert_eq!(r.update(t4, &[a(500.0), b(4.0)]), Some(0.0));
    }

    #[test]
    fn combine_sums_pods_and_marks_degraded() {
        let p1 = PodStats { waiting: 6.0, running: 8.0, kv: Some(0.765), success: None, queue: None };
        let p2 = PodStats { waiting: 10.0, running: 20.0, kv: Some(0.235), success: None, queue: None };
        let r = combine(&cfg(None), &[p1.clone(), p2.clone()], 0, Some(2.5), None).unwrap();
        assert_eq!(r.value, 44.0);
        assert!(r.active);
        assert_eq!(r.detail["pods_up"], 2.0);
        assert_eq!(r.detail["pods_down"], 0.0);
        assert_eq!(r.detail["arrival_rate"], 2.5);
        assert!((r.detail["kv_cache_mean"] - 0.5).abs() < 1e-12);
        let r = combine(&cfg(None), std::slice::from_ref(&p1), 1, None, None).unwrap();
        assert_eq!((r.value, r.detail["pods_down"], r.detail["pods_total"]), (14.0, 1.0, 2.0));
        assert!(!r.detail.contains_key("arrival_rate"));
        // KV: (0.765 + 0.235) / 0.25 = 4 replicas → 64 in per-replica units > queue 44.
        let r = combine(&cfg(Some(0.25)), &[p1.clone(), p2.clone()], 0, None, None).unwrap();
        assert!((r.value - 64.0).abs() < 1e-9, "{}", r.value);
        assert!((r.detail["kv_replicas"] - 4.0).abs() < 1e-9);
        // KV below the queue: the queue drives.
        let r = combine(&cfg(Some(0.9)), &[p1.clone(), p2], 0, None, None).unwrap();
        assert_eq!(r.value, 44.0);
        // KV target without any KV series: an error, not a silent queue-only value.
        let p3 = PodStats { kv: None, ..p1 };
        assert!(matches!(combine(&cfg(Some(0.8)), &[p3], 0, None, None), Err(SourceError::NotFound(_))));
    }

    #[test]
    fn activation() {
        let mut c = cfg(None);
        c.activation_value = 14.0;
        let p = PodStats { waiting: 6.0, running: 8.0, ..Default::default() };
        assert!(!combine(&c, std::slice::from_ref(&p), 0, None, None).unwrap().active);
        c.activation_value = 13.5;
        assert!(combine(&c, &[p], 0, None, None).unwrap().active);
    }

    #[test]
    fn config_endpoints_and_defaults() {
        let c = md_parse(&[("vllmEndpoints", "10.0.0.1:8000, http://u:secret@10.0.0.2:9000/m")]).unwrap();
        assert_eq!(c.per_replica, 16.0);
        let Pods::Endpoints { urls, shown } = &c.pods else { panic!() };
        assert_eq!(urls, &["http://10.0.0.1:8000/metrics", "http://u:secret@10.0.0.2:9000/m"]);
        assert!(!shown.join(",").contains("secret"));
        assert!(!c.label().contains("secret"));
        assert_eq!(c.scrape_timeout, Duration::from_millis(1500));
        let c = md_parse(&[("vllmService", "llama"), ("vllmPort", "http"), ("sourceTimeoutSeconds", "4")]).unwrap();
        assert_eq!(c.scrape_timeout, Duration::from_secs(3));
        assert_eq!(
            c.pods,
            Pods::Service { namespace: "llm".into(), name: "llama".into(), port: PortRef::Name("http".into()) }
        );
    }

    #[test]
    fn config_errors_name_the_key() {
        let e = md_parse(&[("vllmEndpoints", "h:1"), ("vllmService", "s")]).unwrap_err();
        assert!(e.to_string().contains("vllmEndpoints or vllmService"), "{e}");
        let e = md_parse(&[("vllmModel", "m")]).unwrap_err();
        assert_eq!(e.0[0].key, "vllmEndpoints");
        for (k, v) in
            [("vllmKvCacheTarget", "80"), ("vllmKvCacheTarget", "0"), ("vllmPerReplica", "0"), ("vllmPort", "0")]
        {
            let e = md_parse(&[("vllmService", "s"), (k, v)]).unwrap_err();
            assert!(e.0.iter().any(|x| x.key == k), "{k}={v}: {e}");
        }
        let e = md_parse(&[("vllmService", "Bad_Name")]).unwrap_err();
        assert_eq!(e.0[0].key, "vllmService");
        let e = md_parse(&[("vllmEndpoints", "amqp://h:1")]).unwrap_err();
        assert_eq!(e.0[0].key, "vllmEndpoints");
        let e = md_parse(&[("vllmEndpoints", "h:1"), ("vllmPort", "8000")]).unwrap_err();
        assert_eq!(e.0[0].key, "vllmPort");
    }

    fn slice(
        ty: &str,
        port_name: &str,
        port: i32,
        eps: serde_json::Value,
    ) -> k8s_openapi::api::discovery::v1::EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "s", "namespace": "llm", "labels": {"kubernetes.io/service-name": "llama"}},
            "addressType": ty,
            "endpoints": eps,
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]
        }))
        .unwrap()
    }

    #[test]
    fn endpoint_slices_ready_only_and_dual_stack_once() {
        let v4 = slice(
            "IPv4",
            "http",
            8000,
            serde_json::json!([
                {"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false},
                 "targetRef": {"kind": "Pod", "name": "llama-0", "namespace": "llm", "uid": "u0"}},
                {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": false, "terminating": false},
                 "targetRef": {"kind": "Pod", "name": "llama-1", "namespace": "llm", "uid": "u1"}},
                {"addresses": ["10.0.0.3"], "conditions": {},
                 "targetRef": {"kind": "Pod", "name": "llama-2", "namespace": "llm", "uid": "u2"}}
            ]),
        );
        let v6 = slice(
            "IPv6",
            "http",
            8000,
            serde_json::json!([
                {"addresses": ["fd00::1"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "name": "llama-0", "namespace": "llm", "uid": "u0"}}
            ]),
        );
        let urls = slice_urls(&[v6.clone(), v4.clone()], &PortRef::Name("http".into()));
        assert_eq!(urls, ["http://10.0.0.1:8000/metrics", "http://10.0.0.3:8000/metrics"]);
        assert!(slice_urls(std::slice::from_ref(&v4), &PortRef::Name("metrics".into())).is_empty());
        assert_eq!(slice_urls(&[v4], &PortRef::Number(9000))[0], "http://10.0.0.1:9000/metrics");
        assert_eq!(slice_urls(&[v6], &PortRef::Number(8000)), ["http://[fd00::1]:8000/metrics"]);
    }
}
