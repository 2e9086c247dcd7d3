//! `vllmService` pod discovery: one EndpointSlice watch per Service (list, then watch from
//! its resourceVersion, through `kube::runtime` as the cluster's own watches), shared by every
//! vLLM poll of that Service and stopped when the last of them is dropped.
//!
//! Listing the slices on every poll put one LIST per Service per tick on the API server
//! (300 ScaledObjects at the default 5-s tick: 60 LISTs a second, which API Priority and
//! Fairness throttles for every other client of the cluster). The watch costs one long-lived
//! request per Service, and so one connection each (kube's client speaks HTTP/1.1): tens to a
//! few hundred for a fleet of model Services, which an API server serving every kubelet's
//! watches does not notice. A cluster-wide watch of every slice would need one connection but
//! hold every Service's slices in memory. While it has not listed yet, or its last event was an error (no
//! `watch` permission, a broken connection) less than two minutes ago, the poll lists the
//! slices itself as before, so a watch that fails never serves an old pod set as the current
//! one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use tokio::task::JoinHandle;

use crate::cluster::client::{spawn_watch, strip_managed_fields, HealthMap, WatchHealth};

const WHAT: &str = "EndpointSlice";

/// The label the EndpointSlice controller puts on every slice of a Service.
pub fn service_selector(service: &str) -> String {
    format!("kubernetes.io/service-name={service}")
}

/// One LIST of the Service's slices within `timeout` (a poll whose watch cannot answer, and
/// the Lease holder's look at its own replicas). The error names the Service and the cause.
pub async fn list(
    client: kube::Client,
    namespace: &str,
    service: &str,
    timeout: Duration,
) -> Result<Vec<EndpointSlice>, String> {
    let api: kube::Api<EndpointSlice> = kube::Api::namespaced(client, namespace);
    let lp = kube::api::ListParams::default().labels(&service_selector(service));
    let what = format!("listing EndpointSlices of service {namespace}/{service}");
    match tokio::time::timeout(timeout, api.list(&lp)).await {
        Err(_) => Err(format!("{what}: Kubernetes API timed out")),
        Ok(Err(e)) => Err(format!("{what}: {}", error_chain(&e))),
        Ok(Ok(list)) => Ok(list.items),
    }
}

/// An error and its causes, `: `-separated (kube's top-level messages are terse).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let m = s.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        src = s.source();
    }
    out
}

/// The watches running, one per (namespace, Service), held by the polls that use them.
#[derive(Default)]
pub struct SliceWatches {
    map: Mutex<HashMap<(String, String), Weak<SliceWatch>>>,
}

impl SliceWatches {
    /// The watch of `namespace/service`, started if no poll holds one. Must be called
    /// inside the tokio runtime.
    pub fn watch(&self, client: &kube::Client, namespace: &str, service: &str) -> Arc<SliceWatch> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        let key = (namespace.to_string(), service.to_string());
        if let Some(w) = map.get(&key).and_then(Weak::upgrade) {
            return w;
        }
        let w = Arc::new(SliceWatch::start(client.clone(), namespace, service));
        map.insert(key, Arc::downgrade(&w));
        w
    }

    /// Each running watch at `now_ms`: its Service, whether polls read it (else they list,
    /// and why), its slices and its health (`/debug/scalers`).
    pub fn status(&self, now_ms: u64) -> Vec<serde_json::Value> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<serde_json::Value> = map
            .iter()
            .filter_map(|((ns, svc), w)| {
                let w = w.upgrade()?;
                let h = w.health();
                Some(serde_json::json!({
                    "service": format!("{ns}/{svc}"),
                    "read": trusted(&h, now_ms).err().map_or_else(|| "from the watch".to_string(), |why| format!("listed each poll: {why}")),
                    "slices": w.store.state().len(),
                    "health": h,
                }))
            })
            .collect();
        out.sort_by(|a, b| a["service"].as_str().cmp(&b["service"].as_str()));
        out
    }

    /// How many watches are running.
    pub fn running(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).values().filter(|w| w.strong_count() > 0).count()
    }
}

/// One Service's EndpointSlices as a watch keeps them.
pub struct SliceWatch {
    store: Store<EndpointSlice>,
    health: HealthMap,
    task: JoinHandle<()>,
}

impl SliceWatch {
    fn start(client: kube::Client, namespace: &str, service: &str) -> Self {
        let (store, writer) = reflector::store();
        let health = HealthMap::default();
        let api = kube::Api::namespaced(client, namespace);
        let cfg = watcher::Config::default().labels(&service_selector(service));
        let task = spawn_watch(api, cfg, writer, health.clone(), WHAT, strip_managed_fields);
        Self { store, health, task }
    }

    /// The Service's slices at `now_ms`, or why the watch cannot give them now (see
    /// [`trusted`]).
    pub fn slices(&self, now_ms: u64) -> Result<Vec<Arc<EndpointSlice>>, String> {
        trusted(&self.health(), now_ms).map(|()| self.store.state())
    }

    fn health(&self) -> WatchHealth {
        self.health.lock().unwrap_or_else(|e| e.into_inner()).get(WHAT).cloned().unwrap_or_default()
    }
}

/// How long a watch whose last event was an error must go without another before its store
/// is read again. The watcher retries with a backoff of at most 30 s (kube's
/// `DefaultBackoff`), and a connection attempt gives up within kube's 30-s connect timeout, so
/// a watch still failing errs again well within this; one that reconnected resumes from its
/// resourceVersion (or relists) and may then see no event for hours on a steady Service.
/// Without this, one blip of the API server would put the poll back on a LIST per tick until
/// the Service next changed, which is the load the watch exists to remove, at the moment
/// the API server is struggling.
pub const QUIET_AFTER_ERROR_MS: u64 = 120_000;

/// Whether a watch's store reads as the Service's slices now: listed at least once, and
/// either no error since the last good event or none for [`QUIET_AFTER_ERROR_MS`].
pub fn trusted(h: &WatchHealth, now_ms: u64) -> Result<(), String> {
    let quiet = h.error_ms.is_some_and(|t| now_ms.saturating_sub(t) >= QUIET_AFTER_ERROR_MS);
    match h.why_not(WHAT) {
        Some(_) if h.synced && quiet => Ok(()),
        Some(why) => Err(why),
        None => Ok(()),
    }
}

impl Drop for SliceWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client for an API that never answers (port 9 is discard; nothing listens on it here).
    fn unreachable_client() -> kube::Client {
        let cfg = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        kube::Client::try_from(cfg).unwrap()
    }

    #[tokio::test]
    async fn one_watch_per_service_shared_by_its_polls_and_stopped_with_the_last() {
        let client = unreachable_client();
        let watches = SliceWatches::default();
        let a1 = watches.watch(&client, "llm", "llama");
        let a2 = watches.watch(&client, "llm", "llama");
        assert!(Arc::ptr_eq(&a1, &a2));
        let b = watches.watch(&client, "other", "llama");
        assert!(!Arc::ptr_eq(&a1, &b), "same name in another namespace is another Service");
        assert_eq!(watches.running(), 2);
        drop(a1);
        assert_eq!(watches.running(), 2, "a poll still holds it");
        drop(a2);
        assert_eq!(watches.running(), 1);
        let a3 = watches.watch(&client, "llm", "llama");
        assert_eq!(watches.running(), 2);
        // Nothing listed from an API that does not answer: the caller is told to list itself,
        // never handed an empty pod set as if the Service had no ready pod.
        let why = a3.slices(crate::engine::clock::now_ms()).unwrap_err();
        assert!(why.contains("EndpointSlice"), "{why}");
        drop((a3, b));
        assert_eq!(watches.running(), 0);
    }

    #[test]
    fn a_watch_is_read_once_listed_and_again_once_quiet_after_an_error() {
        let listed = WatchHealth { synced: true, last_event_ms: Some(1_000), error: None, error_ms: None };
        assert!(trusted(&listed, 5_000).is_ok());
        let unlisted = WatchHealth::default();
        assert!(trusted(&unlisted, 5_000).unwrap_err().contains("not listed yet"));
        // An error at 10 s: not read until 2 minutes without another.
        let failed = WatchHealth { error: Some("connection refused".into()), error_ms: Some(10_000), ..listed };
        let why = trusted(&failed, 10_000 + QUIET_AFTER_ERROR_MS - 1).unwrap_err();
        assert!(why.contains("connection refused"), "{why}");
        assert!(trusted(&failed, 10_000 + QUIET_AFTER_ERROR_MS).is_ok());
        // Never listed: an old error does not make an empty store the Service's slices.
        let never = WatchHealth { synced: false, ..failed };
        assert!(trusted(&never, 10_000 + 10 * QUIET_AFTER_ERROR_MS).is_err());
    }

    #[test]
    fn the_selector_is_the_endpointslice_controllers_service_label() {
        assert_eq!(service_selector("llama3-70b"), "kubernetes.io/service-name=llama3-70b");
    }
}
