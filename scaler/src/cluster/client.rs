//! The Kubernetes client (in-cluster config or `KUBECONFIG`) and the watched stores:
//! pods (cluster-wide, non-terminal), nodes, Deployments and StatefulSets (the scale
//! targets' live `spec.replicas`), Karpenter NodeClaims and NodePools. Each
//! store is fed by a `kube::runtime` watcher (list, then watch from its resourceVersion,
//! with backoff on errors) whose health is recorded, so a watch that fails turns the
//! features depending on it "off" instead of serving stale numbers as fresh.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::core::DynamicObject;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use serde::Serialize;
use tokio::task::JoinHandle;

use super::target::{nodeclaim_resource, nodepool_resource};
use super::ClusterError;
use crate::engine::clock::now_ms;

/// A client from `KUBECONFIG` / `~/.kube/config` or the in-cluster service account.
pub async fn connect() -> Result<kube::Client, ClusterError> {
    let config = kube::Config::infer().await.map_err(|e| ClusterError::Config(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| ClusterError::Config(e.to_string()))
}

/// `GET /version` within `timeout`.
pub async fn probe(client: &kube::Client, timeout: Duration) -> Result<String, ClusterError> {
    match tokio::time::timeout(timeout, client.apiserver_version()).await {
        Ok(Ok(v)) => Ok(v.git_version),
        Ok(Err(e)) => Err(ClusterError::api("GET /version", e)),
        Err(_) => Err(ClusterError::Unreachable(format!("GET /version: no answer within {timeout:?}"))),
    }
}

/// How one watch is doing.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchHealth {
    /// The initial list completed at least once.
    pub synced: bool,
    pub last_event_ms: Option<u64>,
    /// The last error, cleared by the next successful event.
    pub error: Option<String>,
    pub error_ms: Option<u64>,
}

impl WatchHealth {
    pub fn healthy(&self) -> bool {
        self.synced && self.error.is_none()
    }

    pub fn why_not(&self, what: &str) -> Option<String> {
        match (&self.error, self.synced) {
            (Some(e), _) => Some(format!("{what} watch failing: {e}")),
            (None, false) => Some(format!("{what} not listed yet")),
            (None, true) => None,
        }
    }
}

pub type HealthMap = Arc<Mutex<BTreeMap<&'static str, WatchHealth>>>;

/// The watched stores.
#[derive(Clone)]
pub struct Stores {
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    /// Scale targets, without their pod templates (see [`strip_workload`]).
    pub deployments: Store<Deployment>,
    pub statefulsets: Store<StatefulSet>,
    pub nodeclaims: Store<DynamicObject>,
    pub nodepools: Store<DynamicObject>,
    pub health: HealthMap,
}

fn record<K>(health: &HealthMap, what: &'static str, ev: &Result<watcher::Event<K>, watcher::Error>) {
    let mut h = health.lock().unwrap_or_else(|e| e.into_inner());
    let e = h.entry(what).or_default();
    match ev {
        Ok(event) => {
            if matches!(event, watcher::Event::InitDone) {
                e.synced = true;
            }
            e.last_event_ms = Some(now_ms());
            e.error = None;
        }
        Err(err) => {
            e.error = Some(err.to_string());
            e.error_ms = Some(now_ms());
        }
    }
}

pub(crate) fn spawn_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    writer: reflector::store::Writer<K>,
    health: HealthMap,
    what: &'static str,
    strip: fn(&mut K),
) -> JoinHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    health.lock().unwrap_or_else(|e| e.into_inner()).entry(what).or_default();
    tokio::spawn(async move {
        let stream = reflector::reflector(writer, watcher(api, cfg).default_backoff().modify(strip));
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = &ev {
                tracing::debug!(watch = what, error = %e, "Kubernetes watch error");
            }
            record(&health, what, &ev);
        }
    })
}

/// What no reader needs from any watched object: server-side apply bookkeeping.
pub(crate) fn strip_managed_fields<K: kube::Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

/// A scale target is kept for its `spec.replicas` (and status): its pod template (read
/// once by discovery, `target.rs`) and annotations (`last-applied-configuration` copies
/// the whole object) would be most of the store's memory in a cluster of many Deployments.
fn strip_workload<K: kube::Resource>(o: &mut K, template: impl FnOnce(&mut K)) {
    strip_managed_fields(o);
    o.meta_mut().annotations = None;
    template(o);
}

fn strip_deployment(d: &mut Deployment) {
    strip_workload(d, |d| d.spec.template = Default::default());
}

fn strip_statefulset(d: &mut StatefulSet) {
    strip_workload(d, |d| {
        d.spec.template = Default::default();
        d.spec.volume_claim_templates = None;
    });
}

/// Start the six watches.
pub fn watch_all(client: &kube::Client) -> (Stores, Vec<JoinHandle<()>>) {
    let health: HealthMap = Arc::default();
    let (pods, pods_w) = reflector::store::<Pod>();
    let (nodes, nodes_w) = reflector::store::<Node>();
    let (deployments, deployments_w) = reflector::store::<Deployment>();
    let (statefulsets, statefulsets_w) = reflector::store::<StatefulSet>();
    let claims_w = reflector::store::Writer::<DynamicObject>::new(nodeclaim_resource());
    let pools_w = reflector::store::Writer::<DynamicObject>::new(nodepool_resource());
    let nodeclaims = claims_w.as_reader();
    let nodepools = pools_w.as_reader();
    let tasks = vec![
        spawn_watch(
            Api::<Pod>::all(client.clone()),
            // Terminal pods hold no node resources.
            watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed"),
            pods_w,
            health.clone(),
            "pods",
            strip_managed_fields,
        ),
        spawn_watch(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            nodes_w,
            health.clone(),
            "nodes",
            strip_managed_fields,
        ),
        spawn_watch(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default(),
            deployments_w,
            health.clone(),
            "deployments",
            strip_deployment,
        ),
        spawn_watch(
            Api::<StatefulSet>::all(client.clone()),
            watcher::Config::default(),
            statefulsets_w,
            health.clone(),
            "statefulsets",
            strip_statefulset,
        ),
        // Karpenter's kinds (karpenter.sh/v1) have no k8s-openapi types: read untyped.
        spawn_watch(
            Api::all_with(client.clone(), &nodeclaim_resource()),
            watcher::Config::default(),
            claims_w,
            health.clone(),
            "nodeclaims",
            strip_managed_fields,
        ),
        spawn_watch(
            Api::all_with(client.clone(), &nodepool_resource()),
            watcher::Config::default(),
            pools_w,
            health.clone(),
            "nodepools",
            strip_managed_fields,
        ),
    ];
    (Stores { pods, nodes, deployments, statefulsets, nodeclaims, nodepools, health }, tasks)
}
