//! Cluster awareness, all optional: measured warm-up, GPU/MIG capacity, Karpenter headroom.
//!
//! Everything from Kubernetes is read by background tasks into shared state; the engine
//! and the request path only read that state (no I/O). Without a reachable API every
//! feature reports "off" with the reason, and `serve` keeps answering KEDA.
//!
//! - `client.rs`: client from in-cluster config / `KUBECONFIG`; watched stores (pods,
//!   nodes, NodeClaims, NodePools) with per-watch health.
//! - `target.rs`: ScaledObject → scale target → pod template (GPU/MIG requests,
//!   placement), the NodePool(s) it lands on.
//! - `warmup.rs`: pod creation → Ready and node creation → Ready samples (pure).
//! - `capacity.rs`: free capacity per node / NodePool, fit count, MIG warnings (pure).
//! - `headroom.rs`: placeholder pods, NodePool hint annotation, static pool resize.
//! - `lease.rs`: the one writer (a `coordination.k8s.io` Lease).
//! - `peers.rs`: the plans other replicas serve, which the Lease holder adopts.

pub mod capacity;
pub mod client;
pub mod headroom;
pub mod lease;
pub mod peers;
pub mod target;
pub mod warmup;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::config::{ClusterSettings, KarpenterMode, ScalerId};
use crate::engine::clock::now_ms;
use crate::metrics::Metrics;
use crate::sources::vllm::PortRef;
use capacity::{Fit, NodeCapacity, PoolNodes, Resources, HEADROOM_LABEL};
use client::Stores;
use target::{PoolInfo, TargetInfo};
use warmup::{Samples, Summary};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("no Kubernetes configuration (in-cluster or KUBECONFIG): {0}")]
    Config(String),
    #[error("Kubernetes API unreachable: {0}")]
    Unreachable(String),
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Target(String),
    /// The ScaledObject is not in the API (deleted), or KEDA applies no scale-out for it
    /// (paused): nothing is written for it.
    #[error("{0}")]
    Gone(String),
}

impl ClusterError {
    pub fn api(what: impl Into<String>, source: kube::Error) -> Self {
        ClusterError::Api { what: what.into(), source }
    }
}

/// Process-level options (from the environment; the per-ScaledObject ones are metadata).
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub lease_name: String,
    /// `None`: `POD_NAMESPACE`, the service-account namespace, or the kubeconfig's.
    pub lease_namespace: Option<String>,
    pub lease_duration: Duration,
    pub identity: String,
    pub placeholder_image: String,
    /// Recompute warm-up / capacity from the stores this often.
    pub refresh: Duration,
    /// The leader reconciles headroom this often.
    pub reconcile: Duration,
    /// Re-read each ScaledObject's scale target this often.
    pub rediscover: Duration,
    /// The Service (in the Lease's namespace) whose ready endpoints are the replicas of
    /// prescale: the Lease holder reads their plans (`None`: one replica, nothing to read).
    pub peers_service: Option<String>,
    /// The port of those endpoints that serves HTTP (a name or a number).
    pub peers_port: PortRef,
    /// How long a static NodePool keeps a size after its need went.
    pub static_pool_stabilization: Duration,
}

impl ClusterOptions {
    /// `PRESCALE_LEASE_NAME`, `PRESCALE_LEASE_NAMESPACE` (or `POD_NAMESPACE`),
    /// `PRESCALE_LEASE_SECONDS`, `POD_NAME` (identity), `PRESCALE_HEADROOM_IMAGE`,
    /// `PRESCALE_PEERS_SERVICE`, `PRESCALE_PEERS_PORT` (default `http`),
    /// `PRESCALE_STATIC_POOL_STABILIZATION_SECONDS` (default 300, at most 3,600),
    /// `PRESCALE_REDISCOVER_SECONDS` (default 60, 1–3,600: how often each ScaledObject and its
    /// scale target are re-read, so how soon a deleted ScaledObject's placeholders go).
    pub fn from_env() -> Self {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let host = env("HOSTNAME")
            .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|s| s.trim().to_string()))
            .unwrap_or_else(|| "prescale".into());
        let lease_s = env("PRESCALE_LEASE_SECONDS").and_then(|v| v.parse::<u64>().ok()).unwrap_or(15).clamp(2, 300);
        Self {
            lease_name: env("PRESCALE_LEASE_NAME").unwrap_or_else(|| "prescale-leader".into()),
            lease_namespace: env("PRESCALE_LEASE_NAMESPACE").or_else(|| env("POD_NAMESPACE")),
            lease_duration: Duration::from_secs(lease_s),
            identity: env("POD_NAME")
                .map(|p| format!("{p}_{}", std::process::id()))
                .unwrap_or_else(|| format!("{host}_{}", std::process::id())),
            placeholder_image: env("PRESCALE_HEADROOM_IMAGE").unwrap_or_else(|| headroom::DEFAULT_IMAGE.into()),
            refresh: Duration::from_secs(2),
            reconcile: Duration::from_secs(3),
            rediscover: Duration::from_secs(
                env("PRESCALE_REDISCOVER_SECONDS").and_then(|v| v.parse::<u64>().ok()).unwrap_or(60).clamp(1, 3_600),
            ),
            peers_service: env("PRESCALE_PEERS_SERVICE"),
            peers_port: match env("PRESCALE_PEERS_PORT") {
                Some(p) => p.parse::<u16>().map(PortRef::Number).unwrap_or(PortRef::Name(p)),
                None => PortRef::Name("http".into()),
            },
            static_pool_stabilization: Duration::from_millis(
                env("PRESCALE_STATIC_POOL_STABILIZATION_SECONDS")
                    .and_then(|v| v.parse::<u64>().ok())
                    .map_or(headroom::STATIC_POOL_STABILIZATION_MS, |s| s.min(3_600) * 1_000),
            ),
        }
    }

    /// How long a target adopted from a peer is kept after its plan was last read: four
    /// Lease durations (a minute at the default 15 s), so a missed read or two changes nothing.
    pub fn remote_hold(&self) -> Duration {
        self.lease_duration * 4
    }
}

/// One feature's state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Feature {
    pub on: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Feature {
    fn on() -> Self {
        Self { on: true, reason: None }
    }
    fn off(reason: impl Into<String>) -> Self {
        Self { on: false, reason: Some(reason.into()) }
    }
}

/// Which features are on: `warmup` (measured warm-up), `capacity` (GPU/MIG), `karpenter`
/// (NodePools/NodeClaims readable), `writer` (this replica holds the Lease and writes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Features {
    pub warmup: Feature,
    pub capacity: Feature,
    pub karpenter: Feature,
    pub writer: Feature,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct LeaderState {
    holder: Option<String>,
    error: Option<String>,
    namespace: Option<String>,
    /// Since when this replica holds the Lease (ms).
    #[serde(skip)]
    since_ms: Option<u64>,
}

/// What the refresh loop computed for one target.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct TargetView {
    current_pods: u32,
    /// The target's pods that have a node.
    placed: u32,
    /// The target's pods (name, Ready), for narrowing shared per-pod signals (DCGM).
    #[serde(skip)]
    pods: Vec<(String, bool)>,
    /// Whether a refresh has computed this view since the target was discovered.
    #[serde(skip)]
    refreshed: bool,
    fit: Option<Fit>,
    free_by_pool: BTreeMap<String, Resources>,
    pools: Vec<PoolInfo>,
    warnings: Vec<String>,
    existing_placeholders: u32,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct HeadroomView {
    wanted: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    static_pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_action: Option<String>,
}

struct Target {
    id: ScalerId,
    settings: Mutex<ClusterSettings>,
    info: RwLock<Option<TargetInfo>>,
    discovery_error: RwLock<Option<String>>,
    /// At the last discovery the ScaledObject was not found (deleted) or was paused: its plan
    /// is not followed (placeholders, hints, static pool asks go) while its trigger lingers.
    gone: AtomicBool,
    view: RwLock<TargetView>,
    pod_samples: Mutex<Samples>,
    node_samples: Mutex<Samples>,
    /// (desired replicas at now + warm-up, when reported): the largest of `triggers`' plans,
    /// or a peer's.
    plan: Mutex<Option<(u32, u64)>>,
    /// The last plan of each of this replica's triggers of the ScaledObject, by metric name
    /// (KEDA's HPA follows the largest; one trigger is the usual case).
    triggers: Mutex<BTreeMap<String, (u32, u64)>>,
    headroom: Mutex<HeadroomView>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// KEDA asks this replica about the ScaledObject (its engine plans it).
    local: AtomicBool,
    /// When a peer's plan for it was last adopted (ms; 0: never).
    remote_seen_ms: AtomicU64,
    /// The peer whose plan is followed while not local.
    remote_from: Mutex<Option<String>>,
}

impl Target {
    /// Whether a peer served a plan for it within `hold_ms` of `now`.
    fn peer_plans(&self, now: u64, hold_ms: u64) -> bool {
        let seen = self.remote_seen_ms.load(Ordering::Relaxed);
        seen > 0 && now.saturating_sub(seen) <= hold_ms
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}
fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

struct Inner {
    client: Option<kube::Client>,
    /// Why everything is off (no configuration).
    disabled: Option<String>,
    /// The last connectivity problem seen at start-up (cleared once a watch syncs).
    startup_error: RwLock<Option<String>>,
    opts: ClusterOptions,
    /// The Lease's namespace, resolved once at start-up ([`lease_namespace`]; empty without a
    /// client): the peers' Service and the writer mark live by it too.
    lease_namespace: String,
    metrics: Arc<Metrics>,
    stores: Option<Stores>,
    targets: RwLock<HashMap<ScalerId, Arc<Target>>>,
    leader: AtomicBool,
    leader_state: Mutex<LeaderState>,
    priority_uid: Mutex<Option<String>>,
    /// NodePool → its GPU nodes and the empty ones, as the last refresh saw them.
    pool_nodes: RwLock<BTreeMap<String, PoolNodes>>,
    /// Static NodePool → the sizes reconcile computed lately (scale-down stabilization).
    static_sizes: Mutex<BTreeMap<String, headroom::Stabilizer>>,
    /// Static NodePool → when RBAC last refused its resize (see `RESIZE_REFUSED_RETRY`).
    resize_refused: Mutex<BTreeMap<String, u64>>,
    /// The last read of the peers' plans.
    peers: Mutex<peers::PeersView>,
    http: reqwest::Client,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }
}

/// The cluster handle (cheap to clone).
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl Cluster {
    /// Every feature off, with `reason`.
    pub fn disabled(reason: impl Into<String>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                client: None,
                disabled: Some(reason.into()),
                startup_error: RwLock::new(None),
                opts: ClusterOptions::from_env(),
                lease_namespace: String::new(),
                metrics,
                stores: None,
                targets: RwLock::new(HashMap::new()),
                leader: AtomicBool::new(false),
                leader_state: Mutex::new(LeaderState::default()),
                priority_uid: Mutex::new(None),
                pool_nodes: RwLock::new(BTreeMap::new()),
                static_sizes: Mutex::new(BTreeMap::new()),
                resize_refused: Mutex::new(BTreeMap::new()),
                peers: Mutex::new(peers::PeersView::default()),
                http: reqwest::Client::new(),
                tasks: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Connect (in-cluster or `KUBECONFIG`) and start the watches, the Lease and the loops.
    /// Never fails: without a configuration every feature is off; an unreachable API
    /// leaves them off until it answers (the watches retry with backoff).
    pub async fn start(opts: ClusterOptions, metrics: Arc<Metrics>) -> Self {
        let client = match client::connect().await {
            Ok(c) => c,
            Err(e) => {
                let c = Self::disabled(e.to_string(), metrics);
                c.log_features();
                return c;
            }
        };
        let startup_error = match client::probe(&client, Duration::from_secs(3)).await {
            Ok(v) => {
                tracing::info!(version = %v, "Kubernetes API reachable");
                None
            }
            Err(e) => Some(e.to_string()),
        };
        let (stores, mut tasks) = client::watch_all(&client);
        let cluster = Self {
            inner: Arc::new(Inner {
                lease_namespace: lease_namespace(&opts, &client),
                client: Some(client),
                disabled: None,
                startup_error: RwLock::new(startup_error),
                opts,
                metrics,
                stores: Some(stores),
                targets: RwLock::new(HashMap::new()),
                leader: AtomicBool::new(false),
                leader_state: Mutex::new(LeaderState::default()),
                priority_uid: Mutex::new(None),
                pool_nodes: RwLock::new(BTreeMap::new()),
                static_sizes: Mutex::new(BTreeMap::new()),
                resize_refused: Mutex::new(BTreeMap::new()),
                peers: Mutex::new(peers::PeersView::default()),
                http: reqwest::Client::new(),
                tasks: Mutex::new(Vec::new()),
            }),
        };
        // Give the first lists a moment so the start-up line says what is on.
        let deadline = if read(&cluster.inner.startup_error).is_none() { now_ms() + 2_000 } else { 0 };
        while now_ms() < deadline && !cluster.features().capacity.on {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cluster.log_features();
        let weak = Arc::downgrade(&cluster.inner);
        tasks.push(tokio::spawn(refresh_loop(weak.clone())));
        tasks.push(tokio::spawn(lease_loop(weak.clone())));
        tasks.push(tokio::spawn(reconcile_loop(weak)));
        *lock(&cluster.inner.tasks) = tasks;
        cluster
    }

    fn log_features(&self) {
        let f = self.features();
        let show =
            |x: &Feature| if x.on { "on".to_string() } else { format!("off ({})", x.reason.as_deref().unwrap_or("")) };
        if f.warmup.on && f.capacity.on {
            tracing::info!(warmup = %show(&f.warmup), capacity = %show(&f.capacity), karpenter = %show(&f.karpenter), writer = %show(&f.writer), "cluster features");
        } else {
            tracing::warn!(warmup = %show(&f.warmup), capacity = %show(&f.capacity), karpenter = %show(&f.karpenter), writer = %show(&f.writer), "cluster features off: KEDA is still answered; warmupSeconds: auto uses its fallback");
        }
    }

    /// Which features are on, and why not.
    pub fn features(&self) -> Features {
        let i = &self.inner;
        if let Some(why) = &i.disabled {
            let f = Feature::off(why.clone());
            return Features { warmup: f.clone(), capacity: f.clone(), karpenter: f.clone(), writer: f };
        }
        let Some(stores) = &i.stores else {
            let f = Feature::off("no client");
            return Features { warmup: f.clone(), capacity: f.clone(), karpenter: f.clone(), writer: f };
        };
        let h = lock(&stores.health).clone();
        let why = |names: &[&'static str]| -> Option<String> {
            let reasons: Vec<String> =
                names.iter().filter_map(|n| h.get(n).cloned().unwrap_or_default().why_not(n)).collect();
            (!reasons.is_empty()).then(|| {
                let start = read(&i.startup_error).clone().map(|e| format!("{e}; ")).unwrap_or_default();
                format!("{start}{}", reasons.join("; "))
            })
        };
        let base = why(&["pods", "nodes"]);
        let mk = |w: Option<String>| w.map(Feature::off).unwrap_or_else(Feature::on);
        let ls = lock(&i.leader_state).clone();
        let writer = if let Some(e) = ls.error {
            Feature::off(format!("Lease: {e}"))
        } else if i.leader.load(Ordering::Relaxed) {
            Feature::on()
        } else {
            Feature::off(match ls.holder {
                Some(h) => format!("not the leader (Lease held by {h}); reads only"),
                None => "Lease not acquired yet".to_string(),
            })
        };
        Features {
            warmup: mk(base.clone()),
            capacity: mk(base),
            karpenter: mk(why(&["nodepools", "nodeclaims"])),
            writer,
        }
    }

    pub fn is_leader(&self) -> bool {
        self.inner.leader.load(Ordering::Relaxed)
    }

    /// Start following a ScaledObject KEDA asks this replica about (idempotent; the latest
    /// settings win).
    pub fn track(&self, id: &ScalerId, settings: &ClusterSettings) {
        let mut map = write(&self.inner.targets);
        if let Some(t) = map.get(id) {
            *lock(&t.settings) = settings.clone();
            t.local.store(true, Ordering::Relaxed);
            return;
        }
        map.insert(id.clone(), self.new_target(id, settings, true));
    }

    fn new_target(&self, id: &ScalerId, settings: &ClusterSettings, local: bool) -> Arc<Target> {
        let t = Arc::new(Target {
            id: id.clone(),
            settings: Mutex::new(settings.clone()),
            info: RwLock::new(None),
            discovery_error: RwLock::new(None),
            gone: AtomicBool::new(false),
            view: RwLock::new(TargetView::default()),
            pod_samples: Mutex::new(Samples::default()),
            node_samples: Mutex::new(Samples::default()),
            plan: Mutex::new(None),
            triggers: Mutex::new(BTreeMap::new()),
            headroom: Mutex::new(HeadroomView::default()),
            task: Mutex::new(None),
            local: AtomicBool::new(local),
            remote_seen_ms: AtomicU64::new(0),
            remote_from: Mutex::new(None),
        });
        if let Some(client) = self.inner.client.clone() {
            let handle = tokio::spawn(discovery_loop(Arc::downgrade(&t), client, self.inner.opts.rediscover));
            *lock(&t.task) = Some(handle);
        }
        t
    }

    /// Stop following a ScaledObject KEDA no longer asks this replica about. A plan a peer
    /// still serves for it keeps it followed; otherwise the leader removes its placeholders.
    pub fn untrack(&self, id: &ScalerId) {
        let hold = self.inner.opts.remote_hold().as_millis() as u64;
        {
            let map = read(&self.inner.targets);
            if let Some(t) = map.get(id).filter(|t| t.peer_plans(now_ms(), hold)) {
                t.local.store(false, Ordering::Relaxed);
                return;
            }
        }
        self.forget(id);
    }

    fn forget(&self, id: &ScalerId) {
        let removed = write(&self.inner.targets).remove(id);
        let labels = crate::metrics::Labels::scaled_object(id);
        self.inner.metrics.fit_replicas.remove(&labels);
        self.inner.metrics.headroom_pods.remove(&labels);
        if let (Some(_), Some(client), true) = (removed, self.inner.client.clone(), self.is_leader()) {
            let id = id.clone();
            tokio::spawn(async move {
                if let Err(e) = set_placeholders(&client, &id, None, 0, "", "", "").await {
                    tracing::warn!(scaled_object = %id, error = %e, "could not remove headroom placeholders");
                }
            });
        }
    }

    /// The measured warm-up for `warmupSeconds: auto` (`None`: not enough samples yet).
    pub fn measured_warmup(&self, id: &ScalerId) -> Option<f64> {
        let t = read(&self.inner.targets).get(id).cloned()?;
        let s = lock(&t.pod_samples);
        warmup::auto_warmup(&s)
    }

    /// The scale target's pods as the pod watch sees them, or `None` while the target is
    /// unknown (cluster off, not discovered yet, or not refreshed since).
    pub fn target_pods(&self, id: &ScalerId) -> Option<crate::sources::TargetPods> {
        let t = read(&self.inner.targets).get(id).cloned()?;
        let info = read(&t.info);
        let info = info.as_ref()?;
        let view = read(&t.view);
        view.refreshed
            .then(|| crate::sources::TargetPods { pods: view.pods.clone(), spec_replicas: self.spec_replicas(info) })
    }

    /// The target's `spec.replicas` as the workload watch holds it now (the HPA writes it
    /// every sync, so discovery's copy would be a rediscovery period old). `None` while
    /// that watch is not synced or is failing.
    fn spec_replicas(&self, info: &TargetInfo) -> Option<u32> {
        let stores = self.inner.stores.as_ref()?;
        use kube::runtime::reflector::ObjectRef;
        let (watch, replicas) = if info.kind == "StatefulSet" {
            let key = ObjectRef::new(&info.name).within(&info.namespace);
            ("statefulsets", stores.statefulsets.get(&key).map(|s| s.spec.replicas))
        } else {
            let key = ObjectRef::new(&info.name).within(&info.namespace);
            ("deployments", stores.deployments.get(&key).map(|d| d.spec.replicas))
        };
        if !lock(&stores.health).get(watch).is_some_and(|h| h.healthy()) {
            return None;
        }
        let replicas = replicas?;
        // The API server defaults an absent spec.replicas to 1.
        u32::try_from(replicas.unwrap_or(1)).ok()
    }

    /// The plan at now + warm-up (desired replicas) of the ScaledObject's trigger `metric`,
    /// for the leader's headroom. The ScaledObject's plan is the largest of its triggers'.
    pub fn report_plan(&self, id: &ScalerId, metric: &str, desired: u32) {
        if let Some(t) = read(&self.inner.targets).get(id) {
            t.local.store(true, Ordering::Relaxed);
            let now = now_ms();
            let mut triggers = lock(&t.triggers);
            triggers.insert(metric.to_string(), (desired, now));
            let most = triggers.values().map(|p| p.0).max().unwrap_or(desired);
            *lock(&t.plan) = Some((most, now));
        }
    }

    /// Forget the plan of one trigger of a ScaledObject that another trigger still plans.
    pub fn release(&self, id: &ScalerId, metric: &str) {
        if let Some(t) = read(&self.inner.targets).get(id) {
            let mut triggers = lock(&t.triggers);
            if triggers.remove(metric).is_some() {
                if let Some(most) = triggers.values().copied().max_by_key(|p| p.0) {
                    *lock(&t.plan) = Some(most);
                }
            }
        }
    }

    /// The plans of the ScaledObjects KEDA asks this replica about, served on
    /// [`peers::PATH`] for the Lease holder.
    pub fn peer_report(&self) -> peers::PeerReport {
        let now = now_ms();
        let mut plans: Vec<peers::PeerPlan> = read(&self.inner.targets)
            .values()
            .filter(|t| t.local.load(Ordering::Relaxed))
            .filter_map(|t| {
                let (desired, at) = (*lock(&t.plan))?;
                let s = lock(&t.settings).clone();
                Some(peers::PeerPlan {
                    namespace: t.id.namespace.clone(),
                    name: t.id.name.clone(),
                    karpenter_mode: s.karpenter_mode,
                    resize_static_node_pools: s.resize_static_node_pools,
                    desired,
                    age_seconds: now.saturating_sub(at) as f64 / 1000.0,
                })
            })
            .collect();
        plans.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        peers::PeerReport { identity: self.inner.opts.identity.clone(), plans }
    }

    /// Follow a ScaledObject another replica plans (the Lease holder only). A target KEDA
    /// also asks this replica about keeps its own plan and settings.
    fn adopt(&self, id: &ScalerId, a: &peers::Adopted, now: u64) {
        let mut map = write(&self.inner.targets);
        let t = map.entry(id.clone()).or_insert_with(|| {
            tracing::info!(scaled_object = %id, peer = %a.from, "following a ScaledObject another replica plans");
            self.new_target(id, &a.settings, false)
        });
        t.remote_seen_ms.store(now, Ordering::Relaxed);
        if !t.local.load(Ordering::Relaxed) {
            *lock(&t.settings) = a.settings.clone();
            *lock(&t.plan) = Some((a.desired, now.saturating_sub(a.age_ms)));
            *lock(&t.remote_from) = Some(a.from.clone());
        }
    }

    /// Forget the targets no replica has planned for [`ClusterOptions::remote_hold`].
    fn expire_remote(&self, now: u64) {
        let hold = self.inner.opts.remote_hold().as_millis() as u64;
        let gone: Vec<ScalerId> = read(&self.inner.targets)
            .values()
            .filter(|t| !t.local.load(Ordering::Relaxed) && !t.peer_plans(now, hold))
            .map(|t| t.id.clone())
            .collect();
        for id in gone {
            tracing::info!(scaled_object = %id, "no replica plans this ScaledObject any more: no longer followed");
            self.forget(&id);
        }
    }

    /// Process-level status for `/debug/scalers`.
    pub fn status(&self) -> serde_json::Value {
        let ls = lock(&self.inner.leader_state).clone();
        serde_json::json!({
            "features": self.features(),
            "leader": self.is_leader(),
            "leaseHolder": ls.holder,
            "lease": format!("{}/{}", ls.namespace.unwrap_or_default(), self.inner.opts.lease_name),
            "identity": self.inner.opts.identity,
            "peers": &*lock(&self.inner.peers),
            "watches": self.inner.stores.as_ref().map(|s| lock(&s.health).clone()),
        })
    }

    /// One ScaledObject's cluster view for `/debug/scalers`.
    pub fn debug(&self, id: &ScalerId) -> serde_json::Value {
        let Some(t) = read(&self.inner.targets).get(id).cloned() else {
            return serde_json::json!({"tracked": false});
        };
        let pod: Summary = lock(&t.pod_samples).summary();
        let node: Summary = lock(&t.node_samples).summary();
        let auto = warmup::auto_warmup(&lock(&t.pod_samples));
        let view = read(&t.view).clone();
        let spec_replicas = read(&t.info).as_ref().and_then(|i| self.spec_replicas(i));
        let plan = *lock(&t.plan);
        let over = plan.and_then(|(d, _)| over_capacity(d, &view));
        let origin = if t.local.load(Ordering::Relaxed) {
            "planned here (KEDA asks this replica)".to_string()
        } else {
            format!("adopted from peer {}", lock(&t.remote_from).clone().unwrap_or_default())
        };
        serde_json::json!({
            "origin": origin,
            "target": &*read(&t.info),
            "discoveryError": &*read(&t.discovery_error),
            // Deleted or paused: its plan is not prepared for (`discoveryError` says which).
            "notFollowed": t.gone.load(Ordering::Relaxed),
            "warmup": {
                "pod": pod,
                "node": node,
                "auto": match auto {
                    Some(w) => serde_json::json!({"seconds": w, "from": format!("p{:.0} of {} measured pod warm-ups + {} s for the HPA's sync period", warmup::AUTO_QUANTILE * 100.0, pod.samples, warmup::ACTUATION_S)}),
                    None => serde_json::json!({"seconds": null, "from": format!("configured fallback until {} samples", warmup::MIN_SAMPLES)}),
                },
            },
            "capacity": {
                "currentReplicas": view.current_pods,
                "specReplicas": spec_replicas,
                "fit": view.fit,
                "freeByNodePool": view.free_by_pool,
                "nodePools": view.pools,
            },
            "warnings": view.warnings,
            "plan": plan.map(|(d, at)| serde_json::json!({"desired": d, "reportedSecondsAgo": now_ms().saturating_sub(at) as f64 / 1000.0})),
            "overCapacity": over,
            "headroom": {
                "mode": lock(&t.settings).karpenter_mode,
                "existingPlaceholders": view.existing_placeholders,
                "state": &*lock(&t.headroom),
            },
        })
    }
}

/// "Plan asks for more than fits", with the numbers.
fn over_capacity(desired: u32, v: &TargetView) -> Option<String> {
    let fit = v.fit.as_ref()?;
    let room = v.current_pods.saturating_add(fit.fits_with_placeholders);
    (desired > room).then(|| {
        format!(
            "plan asks for {desired} replicas at now + warm-up; {} exist and {} more fit on current nodes ({} of them held by headroom placeholders); {} need new nodes",
            v.current_pods,
            fit.fits_with_placeholders,
            fit.fits_with_placeholders - fit.fits_now.min(fit.fits_with_placeholders),
            desired - room
        )
    })
}

async fn discovery_loop(weak: std::sync::Weak<Target>, client: kube::Client, every: Duration) {
    loop {
        let Some(t) = weak.upgrade() else { return };
        let id = t.id.clone();
        drop(t);
        let res = target::discover(&client, &id.namespace, &id.name).await;
        let Some(t) = weak.upgrade() else { return };
        let wait = match res {
            Ok(info) => {
                let changed = read(&t.info).as_ref() != Some(&info);
                if changed {
                    tracing::info!(scaled_object = %id, target = %format!("{}/{}", info.kind, info.name), gpu = ?info.gpu_requests, "scale target discovered");
                }
                *write(&t.info) = Some(info);
                *write(&t.discovery_error) = None;
                t.gone.store(false, Ordering::Relaxed);
                every
            }
            Err(e) => {
                let gone = matches!(e, ClusterError::Gone(_));
                if gone && !t.gone.swap(true, Ordering::Relaxed) {
                    tracing::info!(scaled_object = %id, reason = %e, "the ScaledObject's plan is no longer followed");
                }
                let msg = e.to_string();
                if read(&t.discovery_error).as_deref() != Some(msg.as_str()) {
                    tracing::warn!(scaled_object = %id, error = %msg, "cannot read the scale target");
                }
                *write(&t.discovery_error) = Some(msg);
                if gone {
                    every
                } else {
                    every.min(Duration::from_secs(5))
                }
            }
        };
        drop(t);
        tokio::time::sleep(wait).await;
    }
}

fn matches_selector(pod: &Pod, ns: &str, selector: &BTreeMap<String, String>) -> bool {
    pod.metadata.namespace.as_deref() == Some(ns)
        && pod.metadata.labels.as_ref().is_some_and(|l| selector.iter().all(|(k, v)| l.get(k) == Some(v)))
}

fn is_placeholder_of(pod: &Pod, label: &str) -> bool {
    pod.metadata.labels.as_ref().and_then(|l| l.get(HEADROOM_LABEL)).map(String::as_str) == Some(label)
}

/// Recompute warm-up samples, capacity and warnings from the stores.
async fn refresh_loop(weak: std::sync::Weak<Inner>) {
    let mut last_features: Option<Features> = None;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let every = inner.opts.refresh;
        if let Some(stores) = &inner.stores {
            let cluster = Cluster { inner: inner.clone() };
            let f = cluster.features();
            if f.capacity.on {
                *write(&inner.startup_error) = None;
            }
            if last_features
                .as_ref()
                .is_some_and(|l| l.capacity.on != f.capacity.on || l.karpenter.on != f.karpenter.on)
            {
                cluster.log_features();
            }
            last_features = Some(f);
            refresh_once(&inner, stores);
        }
        drop(inner);
        tokio::time::sleep(every).await;
    }
}

fn refresh_once(inner: &Inner, stores: &Stores) {
    let pods: Vec<Pod> = stores.pods.state().iter().map(|p| (**p).clone()).collect();
    let nodes: Vec<Node> = stores.nodes.state().iter().map(|n| (**n).clone()).collect();
    let claims: Vec<DynamicObject> = stores.nodeclaims.state().iter().map(|c| (**c).clone()).collect();
    let pools: Vec<DynamicObject> = stores.nodepools.state().iter().map(|c| (**c).clone()).collect();
    let caps: Vec<NodeCapacity> = capacity::free_per_node(&nodes, &pods);
    let free_by_pool = capacity::free_per_pool(&caps);
    *write(&inner.pool_nodes) = capacity::nodes_per_pool(&caps);
    let m = &inner.metrics;
    for (pool, res) in &free_by_pool {
        for (r, v) in res {
            m.gpu_free.get_or_create(&vec![("nodepool", pool.clone()), ("resource", r.clone())].into()).set(*v);
        }
    }
    let targets: Vec<Arc<Target>> = read(&inner.targets).values().cloned().collect();
    for t in targets {
        let Some(info) = read(&t.info).clone() else { continue };
        let label = headroom::target_label(&t.id);
        let mine: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                matches_selector(p, &info.namespace, &info.selector)
                    && capacity::is_non_terminal(p)
                    && p.metadata.deletion_timestamp.is_none()
                    && !p.metadata.labels.as_ref().is_some_and(|l| l.contains_key(HEADROOM_LABEL))
            })
            .collect();
        {
            let mut ps = lock(&t.pod_samples);
            let mut ns = lock(&t.node_samples);
            for p in &mine {
                let uid = p.metadata.uid.clone().unwrap_or_else(|| p.metadata.name.clone().unwrap_or_default());
                if let Some(w) = warmup::pod_warmup(p) {
                    if ps.record(&uid, w) {
                        tracing::debug!(scaled_object = %t.id, pod = ?p.metadata.name, seconds = w, "pod warm-up measured");
                    }
                    let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                    if let Some(n) = node.and_then(|n| nodes.iter().find(|x| x.metadata.name.as_deref() == Some(n))) {
                        if let Some((w, _)) = warmup::node_warmup(p, n, &claims) {
                            let key =
                                n.metadata.uid.clone().unwrap_or_else(|| n.metadata.name.clone().unwrap_or_default());
                            ns.record(&key, w);
                        }
                    }
                }
            }
            for (phase, s) in [("pod", &*ps), ("node", &*ns)] {
                let base = vec![
                    ("namespace", t.id.namespace.clone()),
                    ("scaledobject", t.id.name.clone()),
                    ("phase", phase.to_string()),
                ];
                m.warmup_samples.get_or_create(&base.clone().into()).set(s.len() as i64);
                for (q, name) in [(0.5, "0.5"), (0.9, "0.9"), (0.99, "0.99")] {
                    if let Some(v) = s.quantile(q) {
                        let mut l = base.clone();
                        l.push(("quantile", name.to_string()));
                        m.warmup_seconds.get_or_create(&l.into()).set(v);
                    }
                }
            }
        }
        let running_pools: Vec<String> = {
            let mut v: Vec<String> = mine
                .iter()
                .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()))
                .filter_map(|n| caps.iter().find(|c| c.name == n).and_then(|c| c.nodepool.clone()))
                .collect();
            v.sort();
            v.dedup();
            v
        };
        let fit = capacity::fit(&info.gpu_requests, &info.placement, &nodes, &caps);
        let labels = crate::metrics::Labels::scaled_object(&t.id);
        m.fit_replicas.get_or_create(&labels).set(i64::from(fit.fits_now));
        let existing =
            pods.iter().filter(|p| is_placeholder_of(p, &label) && p.metadata.deletion_timestamp.is_none()).count()
                as u32;
        let view = TargetView {
            current_pods: mine.len() as u32,
            placed: mine.iter().filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some())).count() as u32,
            pods: mine.iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), warmup::pod_is_ready(p))).collect(),
            refreshed: true,
            fit: (!info.gpu_requests.is_empty()).then_some(fit),
            free_by_pool: free_by_pool.clone(),
            pools: target::target_pools(&info, &pools, &running_pools),
            warnings: capacity::mig_warnings(&info.gpu_requests, &info.placement, &nodes),
            existing_placeholders: existing,
        };
        let new_warnings: Vec<String> =
            view.warnings.iter().filter(|w| !read(&t.view).warnings.contains(w)).cloned().collect();
        for w in new_warnings {
            tracing::warn!(scaled_object = %t.id, warning = %w, "GPU capacity");
        }
        *write(&t.view) = view;
    }
}

async fn lease_loop(weak: std::sync::Weak<Inner>) {
    let mut cfg: Option<lease::LeaseConfig> = None;
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let Some(client) = inner.client.clone() else { return };
        let c = cfg.get_or_insert_with(|| lease::LeaseConfig {
            name: inner.opts.lease_name.clone(),
            namespace: inner.lease_namespace.clone(),
            identity: inner.opts.identity.clone(),
            duration: inner.opts.lease_duration,
            retry: inner.opts.lease_duration / 3,
        });
        let retry = c.retry;
        let was = inner.leader.load(Ordering::Relaxed);
        let res = tokio::time::timeout((c.duration / 2).max(Duration::from_secs(1)), lease::round(&client, c)).await;
        let (leader, holder, error) = match res {
            Ok(Ok((l, h))) => (l, h, None),
            Ok(Err(e)) => (false, None, Some(e.to_string())),
            Err(_) => (false, None, Some("Lease round timed out".to_string())),
        };
        inner.leader.store(leader, Ordering::Relaxed);
        inner.metrics.leader.set(i64::from(leader));
        {
            let mut ls = lock(&inner.leader_state);
            ls.namespace = Some(c.namespace.clone());
            if holder.is_some() || error.is_some() {
                ls.holder = holder.clone();
            }
            ls.error = error.clone();
            if leader != was {
                ls.since_ms = leader.then(now_ms);
            }
        }
        if leader != was {
            if leader {
                tracing::info!(identity = %c.identity, lease = %format!("{}/{}", c.namespace, c.name), "acquired the Lease: this replica writes headroom");
            } else {
                tracing::info!(holder = ?holder, error = ?error, "not the Lease holder: this replica only reads");
            }
        }
        drop(inner);
        tokio::time::sleep(retry).await;
    }
}

/// The Lease's namespace: `PRESCALE_LEASE_NAMESPACE` / `POD_NAMESPACE`, else the service
/// account's, else the kubeconfig's (read once, at start-up, into `Inner::lease_namespace`).
fn lease_namespace(opts: &ClusterOptions, client: &kube::Client) -> String {
    opts.lease_namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| client.default_namespace().to_string())
}

/// How long a static NodePool's resize refused by RBAC (403) waits before it is tried again.
const RESIZE_REFUSED_RETRY: Duration = Duration::from_secs(300);

async fn reconcile_loop(weak: std::sync::Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let every = inner.opts.reconcile;
        let cluster = Cluster { inner: inner.clone() };
        if inner.leader.load(Ordering::Relaxed) {
            if let Some(client) = inner.client.clone() {
                sync_peers(&cluster, &client).await;
                reconcile_once(&inner, &client).await;
            }
        }
        cluster.expire_remote(now_ms());
        drop(cluster);
        drop(inner);
        tokio::time::sleep(every).await;
    }
}

/// Read every replica's plans and adopt those of ScaledObjects KEDA asks another replica about.
async fn sync_peers(cluster: &Cluster, client: &kube::Client) {
    let inner = &cluster.inner;
    let Some(service) = inner.opts.peers_service.clone() else {
        lock(&inner.peers).service = None;
        return;
    };
    let namespace = inner.lease_namespace.clone();
    let timeout = Duration::from_secs(2);
    let mut view = peers::PeersView { service: Some(format!("{namespace}/{service}")), ..Default::default() };
    match peers::discover(client, &namespace, &service, &inner.opts.peers_port, timeout).await {
        Err(e) => {
            if lock(&inner.peers).error.as_deref() != Some(e.as_str()) {
                tracing::warn!(error = %e, "cannot list the other replicas: ScaledObjects KEDA asks them about are not followed");
            }
            // Keep what was adopted; it expires if this persists.
            view.adopted = lock(&inner.peers).adopted.clone();
            view.error = Some(e);
        }
        Ok(bases) => {
            let reads = futures::future::join_all(bases.iter().map(|b| peers::fetch(&inner.http, b, timeout))).await;
            let mut reports = Vec::new();
            for (url, r) in bases.into_iter().zip(reads) {
                match r {
                    Ok(rep) => {
                        view.peers.push(peers::PeerView {
                            url,
                            identity: Some(rep.identity.clone()),
                            plans: rep.plans.len(),
                            error: None,
                        });
                        reports.push(rep);
                    }
                    Err(e) => view.peers.push(peers::PeerView { url, identity: None, plans: 0, error: Some(e) }),
                }
            }
            let now = now_ms();
            for (id, a) in peers::merge(&inner.opts.identity, &reports) {
                cluster.adopt(&id, &a, now);
                view.adopted.push(id.to_string());
            }
        }
    }
    let m = &inner.metrics;
    let failed = view.peers.iter().filter(|p| p.error.is_some()).count();
    // A list that failed is one error: no replica could be read.
    let errors = if view.error.is_some() { 1 } else { failed };
    m.peers.get_or_create(&vec![("result", "ok".to_string())].into()).set((view.peers.len() - failed) as i64);
    m.peers.get_or_create(&vec![("result", "error".to_string())].into()).set(errors as i64);
    m.adopted.set(view.adopted.len() as i64);
    *lock(&inner.peers) = view;
}

async fn priority_class_uid(inner: &Inner, client: &kube::Client) -> Result<String, ClusterError> {
    if let Some(u) = lock(&inner.priority_uid).clone() {
        return Ok(u);
    }
    let api: Api<PriorityClass> = Api::all(client.clone());
    let pc = match api.get_opt(headroom::PRIORITY_CLASS).await.map_err(|e| ClusterError::api("get PriorityClass", e))? {
        Some(pc) => pc,
        None => match api.create(&PostParams::default(), &headroom::priority_class()).await {
            Ok(pc) => pc,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                api.get(headroom::PRIORITY_CLASS).await.map_err(|e| ClusterError::api("get PriorityClass", e))?
            }
            Err(e) => return Err(ClusterError::api("create PriorityClass", e)),
        },
    };
    let uid = pc.metadata.uid.unwrap_or_default();
    *lock(&inner.priority_uid) = Some(uid.clone());
    Ok(uid)
}

/// Delete the placeholders of ScaledObjects that no replica plans any more (deleted, or no
/// longer asked about): created by an earlier leader, or before a restart.
async fn remove_orphan_placeholders(
    stores: &Stores,
    client: &kube::Client,
    owners: &std::collections::HashSet<String>,
    writer: &str,
    min_age_ms: u64,
) {
    let now = now_ms();
    for p in stores.pods.state() {
        let Some(labels) = p.metadata.labels.as_ref() else { continue };
        let Some(owner) = labels.get(HEADROOM_LABEL) else { continue };
        // Only what this installation wrote: another one's placeholders are its own to clean up.
        let ours = labels.get(headroom::MANAGED_BY).map(String::as_str) == Some("prescale")
            && labels.get(headroom::WRITER_LABEL).map(String::as_str) == Some(writer);
        let created_ms = p.metadata.creation_timestamp.as_ref().map(|t| t.0.as_millisecond().max(0) as u64);
        let young = created_ms.is_none_or(|c| now.saturating_sub(c) < min_age_ms);
        if !ours || owners.contains(owner) || young || p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (Some(ns), Some(name)) = (p.metadata.namespace.as_deref(), p.metadata.name.as_deref()) else { continue };
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), owner = %owner, "removed a headroom placeholder no planned ScaledObject owns")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "cannot remove an orphaned headroom placeholder")
            }
        }
    }
}

/// Make the target's placeholder pods exactly `n` (indices 0..n). `info` may be `None`
/// only when `n` is 0.
async fn set_placeholders(
    client: &kube::Client,
    id: &ScalerId,
    info: Option<&TargetInfo>,
    n: u32,
    owner_uid: &str,
    image: &str,
    writer: &str,
) -> Result<Option<String>, ClusterError> {
    let ns = info.map(|i| i.namespace.clone()).unwrap_or_else(|| id.namespace.clone());
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let label = headroom::target_label(id);
    let lp = ListParams::default().labels(&format!("{HEADROOM_LABEL}={label}"));
    let existing = api.list(&lp).await.map_err(|e| ClusterError::api("list placeholder pods", e))?;
    let wanted: Vec<String> = (0..n).map(|i| headroom::placeholder_name(id, i)).collect();
    let mut created = 0;
    let mut deleted = 0;
    for p in &existing.items {
        let name = p.metadata.name.clone().unwrap_or_default();
        if !wanted.contains(&name) && p.metadata.deletion_timestamp.is_none() {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(ClusterError::api(format!("delete placeholder {ns}/{name}"), e)),
            }
        }
    }
    if let Some(info) = info {
        for (i, name) in wanted.iter().enumerate() {
            if existing.items.iter().any(|p| p.metadata.name.as_deref() == Some(name)) {
                continue;
            }
            let mut pod = headroom::placeholder_pod(id, info, i as u32, owner_uid, image);
            pod.metadata.labels.get_or_insert_default().insert(headroom::WRITER_LABEL.into(), writer.into());
            match api.create(&PostParams { field_manager: Some("prescale".into()), ..Default::default() }, &pod).await {
                Ok(_) => created += 1,
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(ClusterError::api(format!("create placeholder {ns}/{name}"), e)),
            }
        }
    }
    Ok((created + deleted > 0).then(|| format!("placeholders: {created} created, {deleted} deleted (now {n})")))
}

async fn reconcile_once(inner: &Inner, client: &kube::Client) {
    let Some(stores) = &inner.stores else { return };
    let targets: Vec<Arc<Target>> = read(&inner.targets).values().cloned().collect();
    // NodePool → (ScaledObject → hint), and static pools to resize: pool → what each of
    // its targets asks (`None`: nothing, `karpenterMode: off`).
    let mut hints: BTreeMap<String, BTreeMap<String, headroom::PoolHint>> = BTreeMap::new();
    let mut static_asks: BTreeMap<String, Vec<Option<headroom::StaticAsk>>> = BTreeMap::new();
    // What every followed ScaledObject may own: its placeholders' label, and the pools it
    // lands on where it resizes static pools (known only once its target is read and refreshed).
    let owners: std::collections::HashSet<String> = targets.iter().map(|t| headroom::target_label(&t.id)).collect();
    let mut referenced: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut all_known = true;
    for t in &targets {
        let v = read(&t.view);
        all_known &= read(&t.info).is_some() && v.refreshed;
        if lock(&t.settings).resize_static_node_pools {
            referenced.extend(v.pools.iter().map(|p| p.name.clone()));
        }
    }
    // Leading for a Lease-hold window: KEDA and the peers have had time to name every
    // ScaledObject still planned, so what no followed one owns was left behind.
    let hold = inner.opts.remote_hold().as_millis() as u64;
    let settled = lock(&inner.leader_state).since_ms.is_some_and(|s| now_ms().saturating_sub(s) >= hold);
    let writer = headroom::writer_id(&inner.lease_namespace, &inner.opts.lease_name);
    if settled {
        remove_orphan_placeholders(stores, client, &owners, &writer, hold).await;
    }
    for t in &targets {
        let settings = lock(&t.settings).clone();
        let info = read(&t.info).clone();
        let view = read(&t.view).clone();
        // A deleted or paused ScaledObject plans nothing, whatever its last plan (KEDA has
        // stopped asking or applies no scale-out; prescale keeps its trigger until
        // --idle-drop-seconds have passed).
        let plan = if t.gone.load(Ordering::Relaxed) { Some((0, now_ms())) } else { *lock(&t.plan) };
        let (Some(info), Some((desired, _)), Some(fit)) = (info, plan, view.fit.clone()) else { continue };
        let n =
            headroom::headroom_target(desired, view.current_pods, fit.fits_now, view.existing_placeholders, desired);
        let pool = view.pools.first().cloned();
        let static_pool = pool.as_ref().filter(|p| p.static_replicas.is_some() && settings.resize_static_node_pools);
        let mut hv = lock(&t.headroom).clone();
        hv.wanted = if settings.karpenter_mode == KarpenterMode::Off { 0 } else { n };
        hv.static_pool = static_pool.map(|p| p.name.clone());
        if settings.karpenter_mode != KarpenterMode::Off {
            if let Some(p) = &pool {
                if n > 0 {
                    hints.entry(p.name.clone()).or_default().insert(
                        t.id.to_string(),
                        headroom::PoolHint {
                            replicas: n,
                            desired,
                            current: view.current_pods,
                            fits_now: fit.fits_now,
                            per_replica: info.gpu_requests.clone(),
                            target: format!("{}/{}", info.kind, info.name),
                        },
                    );
                }
            }
        }
        if let Some(sp) = static_pool {
            let ask = (settings.karpenter_mode != KarpenterMode::Off).then(|| headroom::StaticAsk {
                desired,
                placed: view.placed,
                fits_now: fit.fits_now,
                per_node: fit.per_empty_node.unwrap_or(1),
            });
            static_asks.entry(sp.name.clone()).or_default().push(ask);
        }
        // Placeholders only in headroom mode and not where a static pool is resized instead.
        let placeholders =
            if settings.karpenter_mode == KarpenterMode::Headroom && static_pool.is_none() { n } else { 0 };
        let labels = crate::metrics::Labels::scaled_object(&t.id);
        inner.metrics.headroom_pods.get_or_create(&labels).set(i64::from(placeholders));
        if placeholders != view.existing_placeholders || placeholders > 0 {
            let owner = if placeholders > 0 {
                match priority_class_uid(inner, client).await {
                    Ok(u) => Some(u),
                    Err(e) => {
                        hv.last_error = Some(e.to_string());
                        *lock(&t.headroom) = hv;
                        continue;
                    }
                }
            } else {
                Some(String::new())
            };
            if placeholders != view.existing_placeholders {
                match set_placeholders(
                    client,
                    &t.id,
                    Some(&info),
                    placeholders,
                    owner.as_deref().unwrap_or(""),
                    &inner.opts.placeholder_image,
                    &writer,
                )
                .await
                {
                    Ok(Some(action)) => {
                        tracing::info!(scaled_object = %t.id, desired, current = view.current_pods, fits_now = fit.fits_now, "{action}");
                        hv.last_action = Some(action);
                        hv.last_error = None;
                    }
                    Ok(None) => hv.last_error = None,
                    Err(e) => {
                        tracing::warn!(scaled_object = %t.id, error = %e, "headroom reconcile failed");
                        hv.last_error = Some(e.to_string());
                    }
                }
            }
        }
        *lock(&t.headroom) = hv;
    }
    // NodePool annotations and static resizes.
    let pools: Vec<DynamicObject> = stores.nodepools.state().iter().map(|p| (**p).clone()).collect();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &target::nodepool_resource());
    let pool_nodes = read(&inner.pool_nodes).clone();
    let stabilization_ms = inner.opts.static_pool_stabilization.as_millis() as u64;
    for np in &pools {
        let name = np.metadata.name.clone().unwrap_or_default();
        let annotations = np.metadata.annotations.clone().unwrap_or_default();
        let want = hints.get(&name).and_then(headroom::pool_annotation);
        let have = annotations.get(headroom::POOL_ANNOTATION).cloned();
        let mut ann = serde_json::Map::new();
        let mut resize = None;
        if want != have {
            ann.insert(
                headroom::POOL_ANNOTATION.into(),
                want.clone().map(serde_json::Value::String).unwrap_or(serde_json::Value::Null),
            );
        }
        // A pool prescale grew (it carries its base) that no followed ScaledObject resizes any
        // more (deleted, or `karpenterResizeStaticNodePools` turned off) gives its nodes back:
        // shrunk like a pool whose targets all spare everything.
        let orphan = [None];
        let asks = static_asks.get(&name).map(Vec::as_slice).or_else(|| {
            (settled
                && all_known
                && !referenced.contains(&name)
                && annotations.contains_key(headroom::POOL_BASE_ANNOTATION)
                && annotations.get(headroom::POOL_WRITER_ANNOTATION) == Some(&writer))
            .then_some(&orphan[..])
        });
        if let Some(asks) = asks {
            let current = np.data.pointer("/spec/replicas").and_then(|v| v.as_i64()).unwrap_or(0);
            let base =
                annotations.get(headroom::POOL_BASE_ANNOTATION).and_then(|v| v.parse::<i64>().ok()).unwrap_or(current);
            let m = headroom::pool_motion(current, pool_nodes.get(&name).copied().unwrap_or_default());
            let needs: Vec<i64> = asks
                .iter()
                .map(|ask| ask.map_or(headroom::NEEDS_NOTHING, |a| a.need(m.launching, m.leaving)))
                .collect();
            // `limits.nodes`: a count or a quantity ("8").
            let limit = np.data.pointer("/spec/limits/nodes").and_then(|v| {
                v.as_i64().or_else(|| crate::cluster::capacity::parse_quantity(v.as_str()?).map(|q| q.floor() as i64))
            });
            let sized = headroom::static_pool_replicas(current, base, &needs, m.removable, limit);
            let now = now_ms();
            // A pool first seen (at start-up, or by a new leader) holds the size it has for a
            // window before any shrink: the previous writer's recent sizes are not known here.
            let target_replicas = lock(&inner.static_sizes)
                .entry(name.clone())
                .or_insert_with(|| headroom::Stabilizer::holding(now, current, stabilization_ms))
                .apply(now, sized);
            if target_replicas != current {
                resize = Some(target_replicas);
            }
            let grown = target_replicas > base;
            for (key, value) in [
                (headroom::POOL_BASE_ANNOTATION, grown.then(|| base.to_string())),
                (headroom::POOL_WRITER_ANNOTATION, grown.then(|| writer.clone())),
            ] {
                if value != annotations.get(key).cloned() {
                    ann.insert(key.into(), value.map(serde_json::Value::String).unwrap_or(serde_json::Value::Null));
                }
            }
        }
        // The size through the NodePool's `scale` subresource (as `kubectl scale nodepool`),
        // which the chart grants only with `rbac.karpenter.resizeNodePools`; refused, the pool
        // keeps its size and no base is recorded for a growth that did not happen.
        // A refusal by RBAC is not retried at every reconcile (every 3 s, each a warning) but
        // after `RESIZE_REFUSED_RETRY`; other errors (a conflict, an API server restarting)
        // are retried at the next.
        if let Some(replicas) = resize {
            let now = now_ms();
            let refused_at = lock(&inner.resize_refused).get(&name).copied();
            let resized = if refused_at.is_some_and(|t| now.saturating_sub(t) < RESIZE_REFUSED_RETRY.as_millis() as u64)
            {
                false
            } else {
                let body = serde_json::json!({"spec": {"replicas": replicas}});
                match api.patch_scale(&name, &PatchParams::default(), &Patch::Merge(&body)).await {
                    Ok(_) => {
                        lock(&inner.resize_refused).remove(&name);
                        tracing::info!(nodepool = %name, replicas, "static NodePool resized");
                        true
                    }
                    Err(kube::Error::Api(ae)) if ae.code == 403 => {
                        lock(&inner.resize_refused).insert(name.clone(), now);
                        tracing::warn!(nodepool = %name, replicas, error = %ae, retry_in_s = RESIZE_REFUSED_RETRY.as_secs(), "not allowed to resize the static NodePool through its scale subresource (the chart's rbac.karpenter.resizeNodePools grants it)");
                        false
                    }
                    Err(e) => {
                        tracing::warn!(nodepool = %name, replicas, error = %e, "cannot resize the static NodePool through its scale subresource");
                        false
                    }
                }
            };
            if !resized {
                ann.remove(headroom::POOL_BASE_ANNOTATION);
                ann.remove(headroom::POOL_WRITER_ANNOTATION);
            }
        }
        if ann.is_empty() {
            continue;
        }
        let body = serde_json::json!({"metadata": {"annotations": ann}});
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&body)).await {
            Ok(_) => tracing::info!(nodepool = %name, patch = %body, "NodePool updated"),
            Err(e) => tracing::warn!(nodepool = %name, error = %e, "cannot update NodePool"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scaled_objects_plan_is_its_largest_triggers_and_a_released_trigger_leaves_it() {
        let c = Cluster::disabled("test", Arc::new(Metrics::new()));
        let id = ScalerId { namespace: "llm".into(), name: "llama".into() };
        let plan = |c: &Cluster| c.peer_report().plans.first().map(|p| p.desired);
        c.track(&id, &ClusterSettings::default());
        assert_eq!(plan(&c), None, "nothing reported yet");
        // Two prescale triggers of one ScaledObject: KEDA's HPA follows the larger.
        c.report_plan(&id, "queue", 4);
        c.report_plan(&id, "gpu", 7);
        c.report_plan(&id, "queue", 5);
        assert_eq!(plan(&c), Some(7));
        c.report_plan(&id, "gpu", 3);
        assert_eq!(plan(&c), Some(5), "a trigger's new plan replaces its old one");
        // The queue trigger is dropped while the other still plans: its plan goes with it.
        c.release(&id, "queue");
        assert_eq!(plan(&c), Some(3));
        // Releasing a trigger that never reported changes nothing.
        c.release(&id, "other");
        assert_eq!(plan(&c), Some(3));
    }
}
