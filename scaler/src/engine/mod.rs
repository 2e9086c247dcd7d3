//! The engine: registry of ScaledObjects (parsed once per distinct metadata), shared
//! pollers, one planning task per ScaledObject on aligned ticks, and the snapshot that
//! the request path reads without I/O.

pub mod clock;
pub mod history;
pub mod hpa;
pub mod plan;
pub mod poller;
pub mod predict;

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{self, ConfigErrors, ScalerConfig, ScalerId};
use crate::metrics::Metrics;
use crate::sources::Shared;
use clock::{now_ms, sleep_until_ms};
use plan::SignalView;
use poller::{next_tick, Poller};

#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// A ScaledObject not asked about for this long is dropped (or for twice the longest gap
    /// between KEDA's calls it has seen, up to [`MAX_CALL_GAP_KEPT`]: see `ScalerEntry::touch`).
    pub idle_drop: Duration,
    /// How long after a new ScaledObject is registered its calls wait for the first reading
    /// before answering UNAVAILABLE: one wait from registration, shared by every call (see
    /// `ScalerEntry::wait_first_read`). Under half of KEDA's metrics-adapter budget: one 3-s
    /// gRPC deadline covers GetMetricSpec, GetMetrics and IsActive in turn, and the adapter
    /// retries on UNAVAILABLE, so a wait of the whole 3 s turned a slow first read into a
    /// deadline exceeded with no time left for the retry.
    pub first_read_wait: Duration,
    /// Warm each new ScaledObject's planner from the demand history in this Prometheus.
    pub history: Option<history::HistoryOptions>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self { idle_drop: Duration::from_secs(600), first_read_wait: Duration::from_millis(1_400), history: None }
    }
}

/// The longest gap between KEDA's calls that keeps a trigger (and its planner's history)
/// past `idle_drop`: a trigger polled every `g` seconds is kept for `2 g` without a call, up to
/// this. KEDA asks an `external` trigger every `pollingInterval`, which may exceed the
/// 10-minute default drop; dropped at each poll, its planner restarted cold every time.
pub const MAX_CALL_GAP_KEPT: Duration = Duration::from_secs(86_400);

/// What the request path answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub replicas: u32,
    pub active: bool,
}

/// Why there is no answer (KEDA's fallback applies): maps to gRPC UNAVAILABLE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// The state of one ScaledObject at its latest tick.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub tick_ms: u64,
    pub signals: Vec<SignalView>,
    pub demand_replicas: Option<f64>,
    pub driver: Option<String>,
    pub active: bool,
    /// What KEDA is answered.
    pub replicas: u32,
    pub reason: String,
    /// The reactive answer (always computed, for comparison and shadow mode).
    pub reactive_replicas: u32,
    /// What the planner decided this tick, whichever mode answers (None while it does not
    /// run: `mode: reactive`, warming from its history, disabled, or restarting after a
    /// failure). Exported as `prescale_planner_replicas`, so `mode: shadow` can be compared
    /// with the answers over days rather than one `/debug/scalers` page at a time.
    pub planner_replicas: Option<u32>,
    /// The planner's view (forecast, plan, reason) when it runs.
    pub planner: Option<serde_json::Value>,
    /// The demand the planner observed this tick (replica-equivalents), exported as
    /// `prescale_observed_demand_replicas`: the history a restarted replica warms from.
    pub observed_demand: Option<f64>,
    /// How the planner's history was warmed at start (with `--history-prometheus`).
    pub history: Option<String>,
    /// Share of the requests that left vLLM's queue over the last poll interval after
    /// waiting longer than `sloSeconds` (`sources::vllm`; exported as
    /// `prescale_queue_late_share`): what the fleet's users saw, whichever mode answers.
    /// None without a vLLM signal reporting `vllm:request_queue_time_seconds`, or when no
    /// request left the queue.
    pub queue_late_share: Option<f64>,
    /// Requests vLLM scheduled since the previous tick, and of them late (the increments of
    /// `prescale_queue_scheduled_requests_total` / `prescale_queue_late_requests_total`).
    #[serde(skip)]
    pub queue_counted: Option<(f64, f64)>,
}

/// The late share over every vLLM signal: late requests over started ones, summed.
fn queue_late_share(signals: &[SignalView]) -> Option<f64> {
    let (mut late, mut started, mut any) = (0.0, 0.0, false);
    for s in signals {
        if let (Some(l), Some(n)) = (s.detail.get("queue_late_rate"), s.detail.get("queue_started_rate")) {
            late += l;
            started += n;
            any = true;
        }
    }
    (any && started > 0.0).then(|| (late / started).clamp(0.0, 1.0))
}

/// Per signal, its running totals of requests scheduled and late (vLLM signals only).
fn queue_totals(signals: &[SignalView]) -> Vec<Option<(f64, f64)>> {
    signals.iter().map(|s| Some((*s.detail.get("queue_started_total")?, *s.detail.get("queue_late_total")?))).collect()
}

/// What the signals' running totals add since those `seen` at earlier ticks, summed, and
/// `seen` brought up to date. A signal's first totals are a baseline (a poll shared with other
/// ScaledObjects counted requests before this one existed), as are totals that went down (its
/// poll started again); a signal without totals this tick keeps its last ones. `None` when no
/// signal has totals to count from.
fn queue_increments(seen: &mut Vec<Option<(f64, f64)>>, now: &[Option<(f64, f64)>]) -> Option<(f64, f64)> {
    seen.resize(now.len(), None);
    let mut sum = None::<(f64, f64)>;
    for (was, is) in seen.iter_mut().zip(now) {
        let Some((s, l)) = *is else { continue };
        if let Some((s0, l0)) = *was {
            if s >= s0 && l >= l0 {
                let acc = sum.get_or_insert((0.0, 0.0));
                acc.0 += s - s0;
                acc.1 += l - l0;
            }
        }
        *was = Some((s, l));
    }
    sum
}

type Identity = (String, String, BTreeMap<String, String>);

pub struct ScalerEntry {
    identity: Identity,
    pub config: Arc<ScalerConfig>,
    pollers: Vec<Arc<Poller>>,
    snapshot: RwLock<Option<Arc<Snapshot>>>,
    /// The planner (predictive and shadow modes). Its task steps it once per tick; the
    /// debug page locks it briefly to serialize its full view on demand.
    predictor: Mutex<Option<predict::Predictor>>,
    /// `mode: reactive` runs no planner but keeps what it observes, so that an edit to a
    /// planner mode starts from it (`inherited_history`).
    observed: Mutex<Option<prescale_forecaster::history::DemandHistory>>,
    ready: watch::Sender<bool>,
    active: watch::Sender<bool>,
    last_asked_ms: AtomicU64,
    /// Kept this long without a call when that is longer than `idle_drop`: twice the longest
    /// gap between calls seen (see `touch`), milliseconds.
    keep_ms: AtomicU64,
    /// Calls wait for the first reading until then at most (ms; see `wait_first_read`).
    first_read_by_ms: u64,
    task: Mutex<Option<JoinHandle<()>>>,
    /// Registration order (the newest trigger of a ScaledObject and metric name is current).
    serial: u64,
    /// A newer trigger with the same ScaledObject and metric name exists: the ScaledObject was
    /// edited and KEDA asks the new metadata now (see [`Engine::make_current`]). This one still
    /// answers whoever asks it until it is dropped, but does not tell the cluster its plan,
    /// which would alternate with the current one's (nor export gauges: see `exports`).
    superseded: AtomicBool,
    /// This trigger's tick sets its ScaledObject's gauges: the oldest current trigger of the
    /// ScaledObject (one per ScaledObject, so two prescale triggers' values do not alternate
    /// in one series; see [`Engine::assign_roles`]).
    exports: AtomicBool,
}

impl Drop for ScalerEntry {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            t.abort();
        }
    }
}

impl ScalerEntry {
    /// A call from KEDA (or the HPA) at the wall clock's now.
    pub fn touch(&self) {
        self.touch_at(now_ms());
    }

    /// A call at `now` (ms): it is kept without calls for at least twice the gap since the
    /// previous one, so a long `pollingInterval` does not drop it between polls.
    fn touch_at(&self, now: u64) {
        let prev = self.last_asked_ms.swap(now, Ordering::Relaxed);
        self.keep_for_gap(now.saturating_sub(prev));
    }

    fn keep_for_gap(&self, gap_ms: u64) {
        let cap = MAX_CALL_GAP_KEPT.as_millis() as u64;
        self.keep_ms.fetch_max(gap_ms.saturating_mul(2).min(cap), Ordering::Relaxed);
    }

    /// How long this trigger is kept without a call: `idle_drop` or more (see `touch_at`).
    fn kept_without_calls_ms(&self, idle_drop_ms: u64) -> u64 {
        idle_drop_ms.max(self.keep_ms.load(Ordering::Relaxed))
    }

    pub fn snapshot(&self) -> Option<Arc<Snapshot>> {
        self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Receives `true` on every inactive→active transition (StreamIsActive).
    pub fn watch_active(&self) -> watch::Receiver<bool> {
        self.active.subscribe()
    }

    /// The answer at `now_ms`, or why there is none (never a 0 for missing data).
    pub fn answer(&self, now: u64) -> Result<Answer, Unavailable> {
        let snap =
            self.snapshot().ok_or_else(|| Unavailable(format!("{}: no source has been read yet", self.config.id)))?;
        self.readable(&snap, now)?;
        Ok(Answer { replicas: snap.replicas, active: snap.replicas > 0 })
    }

    /// Whether `snap` may be answered from at `now`: every signal read, none stale.
    fn readable(&self, snap: &Snapshot, now: u64) -> Result<(), Unavailable> {
        let stale_ms = self.config.stale_after.as_millis() as u64;
        for s in &snap.signals {
            let err = s.last_error.as_deref().unwrap_or("no error recorded");
            match s.last_good_ms {
                None => {
                    return Err(Unavailable(format!(
                        "{}: {} has not been read successfully yet; last error: {err}",
                        self.config.id, s.label
                    )))
                }
                Some(t) if now.saturating_sub(t) > stale_ms => {
                    return Err(Unavailable(format!(
                        "{}: {} is stale (last good read {:.0}s ago, staleAfterSeconds {}); last error: {err}",
                        self.config.id,
                        s.label,
                        now.saturating_sub(t) as f64 / 1000.0,
                        self.config.stale_after.as_secs_f64()
                    )))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Wait until the first snapshot exists, at most until `first_read_wait` after the
    /// registration: KEDA's GetMetrics and IsActive share one deadline, and a wait paid again
    /// by each call of a ScaledObject whose first read hangs spent it all (2.8 of 3 s).
    pub async fn wait_first_read(&self) {
        if self.snapshot().is_some() {
            return;
        }
        let left = self.first_read_by_ms.saturating_sub(now_ms());
        if left == 0 {
            return;
        }
        let mut rx = self.ready.subscribe();
        let _ = tokio::time::timeout(Duration::from_millis(left), rx.wait_for(|r| *r)).await;
    }
}

struct Inner {
    opts: EngineOptions,
    shared: Shared,
    metrics: Arc<Metrics>,
    scalers: RwLock<HashMap<u64, Vec<Arc<ScalerEntry>>>>,
    /// Configs that failed to parse, so a bad ScaledObject is parsed once too.
    rejected: Mutex<HashMap<u64, (Identity, ConfigErrors)>>,
    pollers: Mutex<HashMap<String, Weak<Poller>>>,
    /// Cluster integration (crate::cluster), set once by `serve`.
    cluster: std::sync::OnceLock<crate::cluster::Cluster>,
    next_serial: AtomicU64,
    /// When each dropped trigger (ScaledObject, metric name) was last asked about, for up to
    /// `MAX_CALL_GAP_KEPT`: asked again, it learns the gap it was dropped across.
    dropped: Mutex<HashMap<(String, String), u64>>,
}

/// Tombstones of dropped triggers kept at most (each is two short strings).
const DROPPED_CAP: usize = 10_000;

type Scalers = HashMap<u64, Vec<Arc<ScalerEntry>>>;

/// Whether `a` and `b` configure triggers of one ScaledObject with one metric name: the same
/// trigger before and after an edit of its metadata (two triggers of a ScaledObject have
/// different metric names, which KEDA's HPA needs).
fn same_trigger(a: &ScalerConfig, b: &ScalerConfig) -> bool {
    a.id == b.id && a.metric_name == b.metric_name
}

/// The engine handle (cheap to clone).
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

fn identity_hash(namespace: &str, name: &str, md: &HashMap<String, String>) -> u64 {
    // Order-independent over the map: sum of per-entry hashes.
    let mut h = DefaultHasher::new();
    (namespace, name).hash(&mut h);
    let mut acc = h.finish();
    for (k, v) in md {
        let mut h = DefaultHasher::new();
        (k, v).hash(&mut h);
        acc = acc.wrapping_add(h.finish());
    }
    acc
}

fn same_identity(id: &Identity, namespace: &str, name: &str, md: &HashMap<String, String>) -> bool {
    id.0 == namespace && id.1 == name && id.2.len() == md.len() && md.iter().all(|(k, v)| id.2.get(k) == Some(v))
}

impl Engine {
    pub fn new(opts: EngineOptions, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Arc::new(Inner {
                opts,
                shared: Shared::new(),
                metrics,
                scalers: RwLock::new(HashMap::new()),
                rejected: Mutex::new(HashMap::new()),
                pollers: Mutex::new(HashMap::new()),
                cluster: std::sync::OnceLock::new(),
                next_serial: AtomicU64::new(0),
                dropped: Mutex::new(HashMap::new()),
            }),
        }
    }

    // --- cluster integration (crate::cluster) ---
    /// Attach the cluster handle (once, before serving).
    pub fn set_cluster(&self, cluster: crate::cluster::Cluster) {
        let _ = self.inner.cluster.set(cluster);
    }

    pub fn cluster(&self) -> Option<&crate::cluster::Cluster> {
        self.inner.cluster.get()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    pub fn options(&self) -> &EngineOptions {
        &self.inner.opts
    }

    /// The entry for this ScaledObject trigger, registering it on first sight. The
    /// metadata is parsed once per distinct (namespace, name, metadata).
    pub fn resolve(
        &self,
        namespace: &str,
        name: &str,
        md: &HashMap<String, String>,
    ) -> Result<Arc<ScalerEntry>, ConfigErrors> {
        self.resolve_at(namespace, name, md, now_ms())
    }

    /// `resolve` for a call at `now` (ms).
    fn resolve_at(
        &self,
        namespace: &str,
        name: &str,
        md: &HashMap<String, String>,
        now: u64,
    ) -> Result<Arc<ScalerEntry>, ConfigErrors> {
        let h = identity_hash(namespace, name, md);
        {
            let map = self.inner.scalers.read().unwrap_or_else(|e| e.into_inner());
            if let Some(e) =
                map.get(&h).and_then(|v| v.iter().find(|e| same_identity(&e.identity, namespace, name, md)))
            {
                e.touch_at(now);
                let e = e.clone();
                drop(map);
                if e.superseded.load(Ordering::Relaxed) {
                    // KEDA went back to metadata it had left (an edit undone).
                    self.make_current(&self.inner.scalers.write().unwrap_or_else(|e| e.into_inner()), &e);
                }
                return Ok(e);
            }
        }
        {
            let rej = self.inner.rejected.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((id, errs)) = rej.get(&h) {
                if same_identity(id, namespace, name, md) {
                    return Err(errs.clone());
                }
            }
        }
        let identity: Identity =
            (namespace.to_string(), name.to_string(), md.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
        let id = ScalerId { namespace: namespace.to_string(), name: name.to_string() };
        match config::parse(&id, &identity.2) {
            Err(errs) => {
                tracing::warn!(scaled_object = %id, error = %errs, "rejected ScaledObject metadata");
                let mut rej = self.inner.rejected.lock().unwrap_or_else(|e| e.into_inner());
                if rej.len() > 10_000 {
                    rej.clear();
                }
                rej.insert(h, (identity, errs.clone()));
                Err(errs)
            }
            Ok(cfg) => {
                let mut map = self.inner.scalers.write().unwrap_or_else(|e| e.into_inner());
                // Another request may have registered it meanwhile.
                if let Some(e) =
                    map.get(&h).and_then(|v| v.iter().find(|e| same_identity(&e.identity, namespace, name, md)))
                {
                    e.touch_at(now);
                    return Ok(e.clone());
                }
                // The trigger this metadata replaces, if it was edited: its planner's history
                // carries over (see `inherited_history`).
                let predecessor = map
                    .values()
                    .flatten()
                    .filter(|o| same_trigger(&o.config, &cfg))
                    .max_by_key(|o| o.serial)
                    .map(Arc::downgrade);
                let returned = self.returned_after(&cfg, now);
                let entry = self.register(identity, cfg, predecessor, now);
                if let Some(gap) = returned {
                    entry.keep_for_gap(gap);
                }
                map.entry(h).or_default().push(entry.clone());
                self.make_current(&map, &entry);
                self.inner.metrics.scaled_objects.set(map.values().map(Vec::len).sum::<usize>() as i64);
                Ok(entry)
            }
        }
    }

    /// If trigger `cfg` was dropped for want of calls and is asked about again within
    /// `MAX_CALL_GAP_KEPT`, the gap (ms) since its last call before the drop.
    fn returned_after(&self, cfg: &ScalerConfig, now: u64) -> Option<u64> {
        let key = (cfg.id.to_string(), cfg.metric_name.clone());
        let last = self.inner.dropped.lock().unwrap_or_else(|e| e.into_inner()).remove(&key)?;
        let gap = now.saturating_sub(last);
        (gap <= MAX_CALL_GAP_KEPT.as_millis() as u64).then(|| {
            tracing::info!(
                scaled_object = %cfg.id,
                gap_s = gap / 1000,
                "asked again after it was dropped for want of calls: its trigger is kept for twice that gap between calls from now on"
            );
            gap
        })
    }

    fn register(
        &self,
        identity: Identity,
        cfg: ScalerConfig,
        predecessor: Option<Weak<ScalerEntry>>,
        now: u64,
    ) -> Arc<ScalerEntry> {
        tracing::info!(scaled_object = %cfg.id, sources = cfg.sources.len(), mode = ?cfg.planner.mode, "tracking ScaledObject");
        let pollers = cfg.sources.iter().map(|s| self.poller_for(s, &cfg)).collect();
        let reactive = cfg.planner.mode == crate::config::Mode::Reactive;
        let (ready, _) = watch::channel(false);
        let (active, _) = watch::channel(false);
        let entry = Arc::new(ScalerEntry {
            identity,
            config: Arc::new(cfg),
            pollers,
            snapshot: RwLock::new(None),
            predictor: Mutex::new(None),
            observed: Mutex::new(reactive.then(prescale_forecaster::history::DemandHistory::default)),
            ready,
            active,
            last_asked_ms: AtomicU64::new(now),
            keep_ms: AtomicU64::new(0),
            first_read_by_ms: now.saturating_add(self.inner.opts.first_read_wait.as_millis() as u64),
            task: Mutex::new(None),
            serial: self.inner.next_serial.fetch_add(1, Ordering::Relaxed),
            superseded: AtomicBool::new(false),
            exports: AtomicBool::new(false),
        });
        let cluster = self.inner.cluster.get().cloned();
        let history = self.inner.opts.history.clone();
        let handle =
            tokio::spawn(run_scaler(Arc::downgrade(&entry), self.inner.metrics.clone(), cluster, history, predecessor));
        *entry.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        entry
    }

    /// Make `e` the current trigger of its ScaledObject and metric name: the others (older
    /// metadata) are superseded, and the cluster follows `e`'s settings. Runs on registration
    /// and when KEDA returns to a superseded trigger, never on an ordinary call.
    fn make_current(&self, map: &Scalers, e: &Arc<ScalerEntry>) {
        for other in map.values().flatten() {
            if !Arc::ptr_eq(other, e) && same_trigger(&other.config, &e.config) {
                other.superseded.store(true, Ordering::Relaxed);
            }
        }
        e.superseded.store(false, Ordering::Relaxed);
        Self::assign_roles(map, &e.config.id);
        if let Some(c) = self.inner.cluster.get() {
            c.track(&e.config.id, &e.config.cluster);
        }
    }

    /// Which trigger of ScaledObject `id` exports its gauges: the oldest current one.
    fn assign_roles(map: &Scalers, id: &ScalerId) {
        let same: Vec<&Arc<ScalerEntry>> = map.values().flatten().filter(|o| &o.config.id == id).collect();
        let exporter =
            same.iter().filter(|o| !o.superseded.load(Ordering::Relaxed)).min_by_key(|o| o.serial).map(|o| o.serial);
        for o in same {
            o.exports.store(Some(o.serial) == exporter, Ordering::Relaxed);
        }
    }

    fn poller_for(&self, src: &crate::sources::SourceConfig, cfg: &ScalerConfig) -> Arc<Poller> {
        let key = format!("{}|{}|{}", src.poll_key(), cfg.sample.as_millis(), cfg.source_timeout.as_millis());
        let mut map = self.inner.pollers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(&key).and_then(Weak::upgrade) {
            return p;
        }
        let p = Poller::spawn(
            src.kind(),
            src.label(),
            src.build(&self.inner.shared),
            cfg.sample,
            cfg.source_timeout,
            self.inner.metrics.clone(),
        );
        map.insert(key, Arc::downgrade(&p));
        p
    }

    /// Drop ScaledObjects not asked about for `idle_drop` (or the longer time their calls'
    /// cadence asks for, see `ScalerEntry::touch_at`), and what only they used.
    pub async fn sweep(&self, now: u64) -> usize {
        let idle = self.inner.opts.idle_drop.as_millis() as u64;
        let removed: Vec<Arc<ScalerEntry>> = {
            let mut map = self.inner.scalers.write().unwrap_or_else(|e| e.into_inner());
            let mut removed = Vec::new();
            for v in map.values_mut() {
                let (keep, drop): (Vec<_>, Vec<_>) = v.drain(..).partition(|e| {
                    now.saturating_sub(e.last_asked_ms.load(Ordering::Relaxed)) <= e.kept_without_calls_ms(idle)
                });
                *v = keep;
                removed.extend(drop);
            }
            map.retain(|_, v| !v.is_empty());
            let mut dropped = self.inner.dropped.lock().unwrap_or_else(|e| e.into_inner());
            let cap = MAX_CALL_GAP_KEPT.as_millis() as u64;
            dropped.retain(|_, last| now.saturating_sub(*last) <= cap);
            for e in &removed {
                let still = map.values().flatten().any(|o| same_trigger(&o.config, &e.config));
                if !still && dropped.len() < DROPPED_CAP {
                    let last = e.last_asked_ms.load(Ordering::Relaxed);
                    dropped.insert((e.config.id.to_string(), e.config.metric_name.clone()), last);
                }
            }
            drop(dropped);
            self.inner.metrics.scaled_objects.set(map.values().map(Vec::len).sum::<usize>() as i64);
            removed
        };
        for e in &removed {
            tracing::info!(scaled_object = %e.config.id, "dropping ScaledObject not asked about");
            // Another trigger of the same ScaledObject (its edited metadata, or a second
            // prescale trigger) keeps what the ScaledObject shares: the cluster's following of
            // it and its gauges. Only this trigger's own plan goes.
            let map = self.inner.scalers.write().unwrap_or_else(|e| e.into_inner());
            let same_so: Vec<Arc<ScalerEntry>> =
                map.values().flatten().filter(|o| o.config.id == e.config.id).cloned().collect();
            if !same_so.is_empty() {
                let same: Vec<&Arc<ScalerEntry>> =
                    same_so.iter().filter(|o| same_trigger(&o.config, &e.config)).collect();
                match same.iter().max_by_key(|o| o.serial) {
                    // Only older metadata is left: the newest of it is current again (this
                    // also reassigns who exports the gauges).
                    Some(newest) if same.iter().all(|o| o.superseded.load(Ordering::Relaxed)) => {
                        self.make_current(&map, newest);
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        if let Some(c) = self.inner.cluster.get() {
                            c.release(&e.config.id, &e.config.metric_name);
                        }
                    }
                }
                Self::assign_roles(&map, &e.config.id);
                continue;
            }
            drop(map);
            if let Some(c) = self.inner.cluster.get() {
                c.untrack(&e.config.id);
            }
            let labels = crate::metrics::Labels::scaled_object(&e.config.id);
            self.inner.metrics.demand.remove(&labels);
            self.inner.metrics.observed_demand.remove(&labels);
            self.inner.metrics.planned.remove(&labels);
            self.inner.metrics.planner.remove(&labels);
            self.inner.metrics.reactive.remove(&labels);
            self.inner.metrics.queue_late_share.remove(&labels);
            self.inner.metrics.queue_scheduled.remove(&labels);
            self.inner.metrics.queue_late.remove(&labels);
        }
        let n = removed.len();
        drop(removed);
        self.inner.pollers.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, w| w.strong_count() > 0);
        self.inner.shared.amqp.gc().await;
        self.inner.shared.kafka.gc();
        self.refresh_gauges();
        n
    }

    /// Update the gauges that are computed rather than counted.
    pub fn refresh_gauges(&self) {
        let m = &self.inner.metrics;
        let pollers = self.inner.pollers.lock().unwrap_or_else(|e| e.into_inner());
        m.pollers.set(pollers.values().filter(|w| w.strong_count() > 0).count() as i64);
        m.connections
            .get_or_create(&vec![("kind", "amqp".to_string())].into())
            .set(self.inner.shared.amqp.open_connections() as i64);
        m.connections
            .get_or_create(&vec![("kind", "kafka".to_string())].into())
            .set(self.inner.shared.kafka.clients() as i64);
        m.connections
            .get_or_create(&vec![("kind", "endpointslice_watch".to_string())].into())
            .set(self.inner.shared.slices.running() as i64);
    }

    /// Every tracked ScaledObject: config, signals, plan, reason.
    pub fn debug_view(&self) -> serde_json::Value {
        let map = self.inner.scalers.read().unwrap_or_else(|e| e.into_inner());
        let now = now_ms();
        let mut items: Vec<serde_json::Value> = map
            .values()
            .flatten()
            .map(|e| {
                let snap = e.snapshot();
                let answer = e.answer(now);
                serde_json::json!({
                    "scaledObject": e.config.id.to_string(),
                    "config": &*e.config,
                    "lastAskedSecondsAgo": now.saturating_sub(e.last_asked_ms.load(Ordering::Relaxed)) as f64 / 1000.0,
                    // Dropped after this long without a call (--idle-drop-seconds, or twice
                    // the longest gap between calls seen).
                    "keptWithoutCallsSeconds": e.kept_without_calls_ms(self.inner.opts.idle_drop.as_millis() as u64) as f64 / 1000.0,
                    // Older metadata of an edited ScaledObject (reports nothing to the cluster).
                    "superseded": e.superseded.load(Ordering::Relaxed),
                    // Whether this trigger's ticks set the ScaledObject's gauges.
                    "exportsGauges": e.exports.load(Ordering::Relaxed),
                    "answer": match &answer {
                        Ok(a) => serde_json::json!({"replicas": a.replicas, "active": a.active}),
                        Err(u) => serde_json::json!({"unavailable": u.0}),
                    },
                    "signalAgesSeconds": snap.as_ref().map(|s| s.signals.iter().map(|g| g.last_good_ms.map(|t| now.saturating_sub(t) as f64 / 1000.0)).collect::<Vec<_>>()),
                    "snapshot": snap.as_deref(),
                    "cluster": self.inner.cluster.get().map(|c| c.debug(&e.config.id)),
                })
            })
            .collect();
        items.sort_by(|a, b| a["scaledObject"].as_str().cmp(&b["scaledObject"].as_str()));
        let cluster = match self.inner.cluster.get() {
            Some(c) => c.status(),
            None => serde_json::json!({"features": "off (not started)"}),
        };
        let watches = self.inner.shared.slices.status(now);
        serde_json::json!({ "scaledObjects": items, "cluster": cluster, "endpointSliceWatches": watches })
    }

    /// One ScaledObject in full, planner history included (`/debug/scalers/{ns}/{name}`).
    pub fn debug_one(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        let map = self.inner.scalers.read().unwrap_or_else(|e| e.into_inner());
        let now = now_ms();
        let items: Vec<serde_json::Value> = map
            .values()
            .flatten()
            .filter(|e| e.config.id.namespace == namespace && e.config.id.name == name)
            .map(|e| {
                serde_json::json!({
                    "scaledObject": e.config.id.to_string(),
                    "config": &*e.config,
                    "answer": match e.answer(now) {
                        Ok(a) => serde_json::json!({"replicas": a.replicas, "active": a.active}),
                        Err(u) => serde_json::json!({"unavailable": u.0}),
                    },
                    "snapshot": e.snapshot().as_deref(),
                    "planner": e.predictor.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|p| serde_json::to_value(p.planner().snapshot()).ok()),
                    "cluster": self.inner.cluster.get().map(|c| c.debug(&e.config.id)),
                })
            })
            .collect();
        (!items.is_empty()).then(|| serde_json::json!({ "triggers": items }))
    }

    /// Periodic sweep of idle ScaledObjects.
    pub fn spawn_janitor(&self) -> JoinHandle<()> {
        let engine = self.clone();
        tokio::spawn(async move {
            let every = (engine.inner.opts.idle_drop / 20).clamp(Duration::from_millis(200), Duration::from_secs(30));
            loop {
                tokio::time::sleep(every).await;
                engine.sweep(now_ms()).await;
            }
        })
    }
}

/// The per-ScaledObject loop: at each aligned tick, wait for its pollers' reads of
/// that tick (bounded), then plan and publish a snapshot.
async fn run_scaler(
    weak: Weak<ScalerEntry>,
    metrics: Arc<Metrics>,
    cluster: Option<crate::cluster::Cluster>,
    history: Option<history::HistoryOptions>,
    predecessor: Option<Weak<ScalerEntry>>,
) {
    let (sample_ms, timeout_ms) = match weak.upgrade() {
        Some(e) => (e.config.sample.as_millis().max(1) as u64, e.config.source_timeout.as_millis() as u64),
        None => return,
    };
    let (mut state, spread) = match weak.upgrade() {
        Some(e) => {
            let mut h = DefaultHasher::new();
            e.config.id.hash(&mut h);
            let window = (sample_ms / 4).clamp(1, 1000);
            (ScalerState::new(&e, cluster), h.finish() % window)
        }
        None => return,
    };
    // After an edit of the ScaledObject's metadata, the planner starts from what the old
    // metadata's planner observed (in memory, so without `--history-prometheus` too): an edit
    // such as leaving `mode: shadow` does not throw away the days it learnt.
    let inherited = predecessor.as_ref().and_then(Weak::upgrade).and_then(|old| {
        let e = weak.upgrade()?;
        inherited_history(&old, &e.config)
    });
    if let Some((first_s, step_s, values)) = inherited {
        state.warm = spawn_warm(&weak, move |config, p| warm_from_predecessor(config, p, first_s, step_s, values));
        if state.warm.is_some() {
            state.history = Some("warming from the previous metadata's history".to_string());
        }
    }
    // Warm start: the planner is taken out now (before any live tick could move it past the
    // history) and replayed from Prometheus in the background; until it is back, the ticks
    // find no planner and answer reactively, so a restart never leaves KEDA without answers.
    if let (None, Some(h)) = (&state.warm, history) {
        let note = format!("warming from {}", crate::redact::redact_url(&h.server));
        state.warm = spawn_warm(&weak, move |config, p| warm_from_history(config, p, h));
        if state.warm.is_some() {
            state.history = Some(note);
        }
    }
    // First round: whatever each poller has, as soon as each has finished one read.
    let mut tick = now_ms();
    let mut first = true;
    loop {
        let Some(e) = weak.upgrade() else { return };
        let deadline =
            if first { tick + timeout_ms * 4 + 1000 } else { tick + (sample_ms * 9 / 10).max(timeout_ms + 200) };
        let want = if first { 1 } else { tick };
        let rxs: Vec<_> = e.pollers.iter().map(|p| p.subscribe()).collect();
        drop(e);
        for mut rx in rxs {
            let left = deadline.saturating_sub(now_ms());
            let _ = tokio::time::timeout(Duration::from_millis(left), rx.wait_for(|t| *t >= want)).await;
        }
        if !first {
            // Spread the planning of many ScaledObjects over the tick instead of running
            // all of them the instant the shared polls finish (a CPU burst that shows in the
            // request path's tail). The offset is a hash of the ScaledObject, so every
            // prescale replica still plans the same tick from the same readings.
            tokio::time::sleep(Duration::from_millis(spread)).await;
        }
        let Some(e) = weak.upgrade() else { return };
        let snap = state.step(&e, if first { now_ms() } else { tick });
        publish(&e, snap, &metrics);

        drop(e);
        first = false;
        tick = next_tick(now_ms() + 1, sample_ms);
        sleep_until_ms(tick).await;
    }
}

fn publish(e: &ScalerEntry, snap: Snapshot, metrics: &Metrics) {
    if e.exports.load(Ordering::Relaxed) {
        export(e, &snap, metrics);
    }
    let was_active = *e.active.borrow();
    // A push `true` scales from zero at once: only from readings `IsActive` would answer from.
    let now_active = snap.replicas > 0 && e.readable(&snap, now_ms()).is_ok();
    *e.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(snap));
    if now_active != was_active {
        e.active.send_replace(now_active);
    }
    e.ready.send_replace(true);
}

/// The ScaledObject's gauges and counters from its current trigger's tick.
fn export(e: &ScalerEntry, snap: &Snapshot, metrics: &Metrics) {
    let labels = crate::metrics::Labels::scaled_object(&e.config.id);
    if let Some(d) = snap.demand_replicas {
        metrics.demand.get_or_create(&labels).set(d);
    }
    if let Some(d) = snap.observed_demand {
        metrics.observed_demand.get_or_create(&labels).set(d);
    }
    metrics.planned.get_or_create(&labels).set(i64::from(snap.replicas));
    if snap.demand_replicas.is_some() {
        metrics.reactive.get_or_create(&labels).set(i64::from(snap.reactive_replicas));
    }
    // Removed only where the last tick set them: most ScaledObjects have no vLLM signal, a
    // `mode: reactive` one no planner, and a removal takes the family's write lock.
    let (had_late_share, had_planner) = e
        .snapshot
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or((false, false), |s| (s.queue_late_share.is_some(), s.planner_replicas.is_some()));
    match snap.queue_late_share {
        Some(x) => {
            metrics.queue_late_share.get_or_create(&labels).set(x);
        }
        None if had_late_share => {
            metrics.queue_late_share.remove(&labels);
        }
        None => {}
    }
    match snap.planner_replicas {
        Some(n) => {
            metrics.planner.get_or_create(&labels).set(i64::from(n));
        }
        None if had_planner => {
            metrics.planner.remove(&labels);
        }
        None => {}
    }
    if let Some((scheduled, late)) = snap.queue_counted {
        metrics.queue_scheduled.get_or_create(&labels).inc_by(scheduled);
        metrics.queue_late.get_or_create(&labels).inc_by(late);
    }
}

/// Replace a shared poll's state by its narrowing to this ScaledObject (see [`Narrowed`]):
/// a narrowing that fails keeps the last good narrowed value, which goes stale like any
/// reading, and shows the error.
fn narrow_to_target(
    st: &mut poller::PollState,
    n: &mut Narrowed,
    f: impl Fn(&crate::sources::Reading) -> Result<crate::sources::Reading, crate::sources::SourceError>,
    tick_ms: u64,
) {
    if let Some((at, r)) = &st.last_good {
        match f(r) {
            Ok(x) => n.last_good = Some((*at, x)),
            Err(err) => {
                if n.last_error.as_ref().is_none_or(|(_, m)| *m != err.to_string()) {
                    tracing::warn!(error = %err, "cannot narrow a shared reading to the scale target's pods");
                }
                n.last_error = Some((tick_ms, err.to_string()));
            }
        }
    }
    st.last_good = n.last_good.clone();
    if let Some((at, msg)) = &n.last_error {
        if st.last_error.as_ref().is_none_or(|(t, _)| t <= at) {
            st.last_error = Some((*at, msg.clone()));
        }
    }
}

/// Warm-up planned with `warmupSeconds: auto` until the cluster has measured one.
pub const AUTO_WARMUP_FALLBACK_S: f64 = 180.0;

/// Per-ScaledObject planning state, touched only by its task (the planner itself
/// lives in the entry so the debug page can read it).
struct ScalerState {
    config: Arc<ScalerConfig>,
    predictor_error: Option<String>,
    cluster: Option<crate::cluster::Cluster>,
    /// Per source: the shared reading narrowed to this ScaledObject's own pods (DCGM).
    narrowed: Vec<Narrowed>,
    /// How the planner's history was warmed at start ([`history`]).
    history: Option<String>,
    /// While the planner is out being warmed: the warm-up's note, when it is done.
    warm: Option<tokio::sync::oneshot::Receiver<String>>,
    /// Arrival-rate estimate from queue deltas and served throughput (`capacityPerReplica`).
    arrivals: predict::ArrivalEstimator,
    /// Per signal, the running totals of scheduled and late requests last seen.
    queue_seen: Vec<Option<(f64, f64)>>,
}

/// A shared per-pod reading narrowed to the scale target's pods: its last good value and
/// the poll time it came from (so staleness works as for any reading), and the last
/// narrowing error.
#[derive(Default)]
struct Narrowed {
    last_good: Option<(u64, crate::sources::Reading)>,
    last_error: Option<(u64, String)>,
}

impl ScalerState {
    fn new(e: &ScalerEntry, cluster: Option<crate::cluster::Cluster>) -> Self {
        let config = &e.config;
        let mut predictor_error = None;
        if config.planner.mode != crate::config::Mode::Reactive {
            match new_predictor(config) {
                Ok(p) => *e.predictor.lock().unwrap_or_else(|e| e.into_inner()) = Some(p),
                Err(err) => {
                    tracing::error!(scaled_object = %config.id, error = %err, "planner disabled; answering reactively");
                    predictor_error = Some(err.to_string());
                }
            }
        }
        let narrowed = config.sources.iter().map(|_| Narrowed::default()).collect();
        Self {
            config: config.clone(),
            predictor_error,
            cluster,
            narrowed,
            history: None,
            warm: None,
            arrivals: predict::ArrivalEstimator::default(),
            queue_seen: Vec::new(),
        }
    }

    /// Whether the planner is still out warming; takes the warm-up's note once it is back.
    fn warming(&mut self) -> bool {
        let Some(rx) = self.warm.as_mut() else { return false };
        match rx.try_recv() {
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return true,
            Ok(note) => self.history = Some(note),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {}
        }
        self.warm = None;
        false
    }

    fn step(&mut self, e: &ScalerEntry, tick_ms: u64) -> Snapshot {
        let warming = self.warming();
        let signals: Vec<SignalView> = e
            .pollers
            .iter()
            .zip(&self.config.sources)
            .zip(&mut self.narrowed)
            .map(|((p, src), narrowed)| {
                let mut st = p.state();
                if let (true, Some(c)) = (src.narrows_to_pods(), &self.cluster) {
                    if let Some(target) = c.target_pods(&self.config.id) {
                        narrow_to_target(&mut st, narrowed, |r| src.narrow(r, &target), tick_ms);
                    }
                }
                let per = src.per_replica();
                SignalView {
                    kind: src.kind(),
                    label: p.label.clone(),
                    per_replica: per,
                    value: st.last_good.as_ref().map(|(_, r)| r.value),
                    replicas: st.last_good.as_ref().map(|(_, r)| r.value.max(0.0) / per),
                    active: st.last_good.as_ref().is_some_and(|(_, r)| r.active),
                    last_good_ms: st.last_good.as_ref().map(|(t, _)| *t),
                    last_error: st.last_error.as_ref().map(|(_, m)| m.clone()),
                    last_error_ms: st.last_error.as_ref().map(|(t, _)| *t),
                    failures: st.failures,
                    detail: st.last_good.map(|(_, r)| r.detail).unwrap_or_default(),
                }
            })
            .collect();
        let demand = plan::combine(&signals);
        let (reactive, reactive_reason) = match &demand {
            Some(d) => plan::reactive(d, &self.config.planner),
            None => (0, "no reading yet".to_string()),
        };
        let mut answer = (reactive, reactive_reason.clone());
        let mut planner = None;
        // What the planner observes, computed (and exported) whatever the mode: a ScaledObject
        // in `mode: reactive`, or one whose planner is out warming, still records the history a
        // later warm start reads.
        let arrival_rate = self.arrivals.update(tick_ms as f64 / 1000.0, &signals);
        let observed_demand = demand
            .as_ref()
            .map(|d| predict::observed_demand(d, arrival_rate, self.config.planner.capacity_per_replica));
        if let (Some(h), Some(x)) = (e.observed.lock().unwrap_or_else(|e| e.into_inner()).as_mut(), observed_demand) {
            let t = tick_ms as f64 / 1000.0;
            let dt = h.last_t().map_or(self.config.sample.as_secs_f64(), |l| t - l);
            h.observe(t, dt, x * dt);
        }
        let mut guard = e.predictor.lock().unwrap_or_else(|e| e.into_inner());
        let mut planner_failed = false;
        let mut planner_replicas = None;
        if let (Some(p), Some(observed)) = (guard.as_mut(), observed_demand) {
            // cluster: `warmupSeconds: auto` plans with the measured warm-up once there is one.
            if let (crate::config::Warmup::Auto, Some(c)) = (self.config.planner.warmup, &self.cluster) {
                if let Some(w) = c.measured_warmup(&self.config.id) {
                    if (w - p.planner().warmup_planned()).abs() > 1e-6 {
                        if let Err(err) = p.set_warmup(w) {
                            tracing::warn!(scaled_object = %self.config.id, error = %err, "measured warm-up rejected");
                        } else {
                            tracing::info!(scaled_object = %self.config.id, warmup_s = w, "planning with the measured warm-up");
                        }
                    }
                }
            }
            // cluster: plan from the target's pods as they are (Ready or still starting).
            if let Some(pods) = self.cluster.as_ref().and_then(|c| c.target_pods(&self.config.id)) {
                let ready = pods.pods.iter().filter(|(_, r)| *r).count();
                p.observe_fleet(predict::PlannedFleet::from_pods(ready, pods.pods.len(), pods.spec_replicas));
            }
            match guarded(&self.config.id, || p.step(tick_ms as f64 / 1000.0, observed)) {
                None => planner_failed = true,
                Some(dec) => {
                    planner_replicas = Some(dec.desired);
                    let why = match &p.tolerance_note {
                        Some(note) => format!("{}; {note}", dec.reason),
                        None => dec.reason.to_string(),
                    };
                    if plan::planner_answers(self.config.planner.mode) {
                        answer = (dec.desired, format!("planner: {why}"));
                    } else {
                        answer.1 = format!(
                            "shadow: answered reactively ({reactive_reason}); the planner would answer {}: {why}",
                            dec.desired
                        );
                        if dec.desired != reactive {
                            tracing::info!(scaled_object = %self.config.id, reactive, planner = dec.desired, reason = %why, "shadow: planner differs");
                        }
                    }
                    planner = Some(serde_json::json!({
                        "desired": dec.desired,
                        "reason": why,
                        "observedDemand": observed,
                        "arrivalRate": arrival_rate,
                        "warmupPlannedSeconds": p.planner().warmup_planned(),
                        "forecast": dec.forecast,
                        "fleet": {
                            "ready": p.planned_from.ready,
                            "warming": p.planned_from.warming,
                            "from": p.planned_from.source(),
                        },
                    }));
                }
            }
        } else if let Some(err) = &self.predictor_error {
            answer.1 = format!("{reactive_reason} (planner disabled: {err})");
        } else if warming {
            answer.1 = format!("{reactive_reason} (the planner is warming from its history)");
        }
        if planner_failed {
            // A fresh planner from the next tick (cold, as after a restart); this one answers
            // reactively.
            *guard = new_predictor(&self.config).ok();
            answer.1 = format!("{reactive_reason} (the planner failed on this tick and restarts cold; see the log)");
        }
        // The cluster (headroom placeholders, NodePool hints, static pool sizes, the peers'
        // reports) acts on what KEDA is answered: in `mode: shadow` that is the reactive
        // count, not the planner's, which would otherwise launch GPU nodes for a plan nobody
        // follows. Not before a first reading, nor for a ScaledObject whose demand is unknown.
        if let (Some(c), Some(_), false) = (&self.cluster, demand.as_ref(), e.superseded.load(Ordering::Relaxed)) {
            c.report_plan(&self.config.id, &self.config.metric_name, answer.0);
        }
        drop(guard);
        let late_share = queue_late_share(&signals);
        let queue_counted = queue_increments(&mut self.queue_seen, &queue_totals(&signals));
        Snapshot {
            tick_ms,
            driver: demand.as_ref().and_then(|d| d.driver).map(|i| signals[i].label.clone()),
            demand_replicas: demand.as_ref().map(|d| d.replicas),
            active: demand.as_ref().is_some_and(|d| d.active),
            replicas: answer.0,
            reason: answer.1,
            reactive_replicas: reactive,
            planner_replicas,
            planner,
            signals,
            observed_demand,
            history: self.history.clone(),
            queue_late_share: late_share,
            queue_counted,
        }
    }
}

/// `f()`, a planner step or a warm start's replay, with a panic in it caught: a planner bug
/// must not take the ScaledObject's task down (every later tick would go unanswered until
/// prescale restarts). Logged against the ScaledObject `id`, and None: the caller answers
/// reactively and puts a fresh planner in place. The fuzzed inputs (`scripts/fuzz.sh`) give
/// no panic; this is the guard for the ones nobody found.
fn guarded<T>(id: &ScalerId, f: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(scaled_object = %id, panic = %what, "the planner panicked; answering reactively and restarting it cold");
            None
        }
    }
}

/// A ScaledObject's planner as configured, with the fallback warm-up until `warmupSeconds:
/// auto` has a measurement.
fn new_predictor(config: &ScalerConfig) -> Result<predict::Predictor, prescale_forecaster::planner::PlannerError> {
    predict::Predictor::new(&config.planner, AUTO_WARMUP_FALLBACK_S, config.sample.as_secs_f64())
}

/// Warm-ups replay days of history on the blocking pool; after a restart with hundreds of
/// ScaledObjects they run one at a time, so live planning keeps the CPU.
fn warm_permits() -> &'static tokio::sync::Semaphore {
    static PERMITS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    PERMITS.get_or_init(|| tokio::sync::Semaphore::new(1))
}

/// Take the planner out of `weak`'s entry (before any live tick could move it past the
/// history), warm it in the background with `warm`, and put back what that returns (the
/// warmed planner, or a cold one); the receiver gets the note for `/debug/scalers`. None when
/// the entry has no planner to warm.
fn spawn_warm<F, Fut>(weak: &Weak<ScalerEntry>, warm: F) -> Option<tokio::sync::oneshot::Receiver<String>>
where
    F: FnOnce(Arc<ScalerConfig>, predict::Predictor) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = (Option<predict::Predictor>, String)> + Send + 'static,
{
    let e = weak.upgrade()?;
    let p = e.predictor.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    let config = e.config.clone();
    drop(e);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let w = weak.clone();
    tokio::spawn(async move {
        let (p, note) = warm(config, p).await;
        if let (Some(p), Some(e)) = (p, w.upgrade()) {
            *e.predictor.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
        }
        let _ = tx.send(note);
    });
    Some(rx)
}

/// Replay `values` (the demand over the step ending at `first_s + i · step_s`) through `p`
/// under the warm permit, off the runtime's threads: the warmed planner and how many samples
/// it was fed, or, when the replay panicked, a fresh planner and None.
async fn replay_into(
    config: &ScalerConfig,
    mut p: predict::Predictor,
    first_s: f64,
    step_s: f64,
    values: Vec<f64>,
) -> (Option<predict::Predictor>, Option<usize>) {
    let _permit = warm_permits().acquire().await;
    let id = config.id.clone();
    let joined =
        tokio::task::spawn_blocking(move || guarded(&id, || p.warm(first_s, step_s, &values)).map(|fed| (p, fed)))
            .await;
    match joined {
        Ok(Some((p, fed))) => (Some(p), Some(fed)),
        _ => (new_predictor(config).ok(), None),
    }
}

/// The demand history of `old`, the trigger an edit of the ScaledObject's metadata replaced,
/// for a planner configured by `new`: when both measure demand in the same units (the same
/// sources as `/debug/scalers` shows them, which leaves out credentials, and the same
/// `capacityPerReplica`), the old planner's observations at `new`'s sample period, as
/// [`predict::Predictor::warm`] takes them (first sample's time, step, values), from its planner
/// or, in `mode: reactive`, from what it recorded. None when the units differ, the old
/// trigger's planner is out warming, or it observed less than one sample period.
fn inherited_history(old: &ScalerEntry, new: &ScalerConfig) -> Option<(f64, f64, Vec<f64>)> {
    let same_units = old.config.planner.capacity_per_replica == new.planner.capacity_per_replica
        && serde_json::to_value(&old.config.sources).ok() == serde_json::to_value(&new.sources).ok();
    if !same_units {
        return None;
    }
    let step_s = new.sample.as_secs_f64().max(1.0);
    let (t0, values) = match old.predictor.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(p) => p.planner().demand_series(step_s)?,
        // `mode: reactive`: what it recorded.
        None => old.observed.lock().unwrap_or_else(|e| e.into_inner()).as_ref()?.series(step_s)?,
    };
    // Each value is the demand over the step that ends at its time.
    Some((t0 + step_s, step_s, values))
}

/// Replay the previous metadata's history (see [`inherited_history`]) into the new trigger's
/// planner `p`: the planner to put back and the note for `/debug/scalers`.
async fn warm_from_predecessor(
    config: Arc<ScalerConfig>,
    p: predict::Predictor,
    first_s: f64,
    step_s: f64,
    values: Vec<f64>,
) -> (Option<predict::Predictor>, String) {
    let hours = values.len() as f64 * step_s / 3600.0;
    let (p, fed) = replay_into(&config, p, first_s, step_s, values).await;
    let note = match fed {
        Some(fed) => format!("warmed from the previous metadata: {fed} samples over {hours:.1} h"),
        None => "replaying the previous metadata's history failed; planning from a cold start".to_string(),
    };
    tracing::info!(scaled_object = %config.id, "{note}");
    (p, note)
}

/// Fetch a new ScaledObject's demand history from Prometheus ([`history`]) and replay it
/// through its planner `p`: the planner to put back and the note `/debug/scalers` shows. A
/// failed fetch gives the planner back cold; a panic while replaying gives a fresh one.
async fn warm_from_history(
    config: Arc<ScalerConfig>,
    p: predict::Predictor,
    h: history::HistoryOptions,
) -> (Option<predict::Predictor>, String) {
    let id = &config.id;
    let step_s = config.sample.as_secs().max(1);
    let now_s = i64::try_from(now_ms() / 1000).unwrap_or(i64::MAX);
    let server = crate::redact::redact_url(&h.server);
    let (p, r) = match history::fetch(&reqwest::Client::new(), &h, id, step_s, now_s).await {
        Ok(mut series) => {
            history::seasonal_fill(&mut series);
            // Up to the last sample only: after it the history is unknown (the replicas were
            // down), not the last value repeated. (`describe` reads the series' other fields.)
            let mut values = std::mem::take(&mut series.values);
            values.truncate(series.sampled_len);
            let (first_s, step) = (series.first_s as f64, series.step_s as f64);
            match replay_into(&config, p, first_s, step, values).await {
                (p, Some(fed)) => (p, Ok((series, fed))),
                (p, None) => (p, Err("replaying it failed".to_string())),
            }
        }
        Err(err) => (Some(p), Err(err)),
    };
    let note = history::describe(&r, &server);
    if r.is_ok() {
        tracing::info!(scaled_object = %id, "{note}");
    } else {
        tracing::warn!(scaled_object = %id, "{note}");
    }
    (p, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KEDA asks a polled `external` trigger every `pollingInterval`; past `--idle-drop-seconds`
    /// it was dropped between polls and its planner restarted cold at every one.
    #[tokio::test]
    async fn a_trigger_polled_less_often_than_the_idle_drop_is_kept_once_its_gap_is_seen() {
        let engine = Engine::new(EngineOptions::default(), Arc::new(Metrics::new()));
        let md: HashMap<String, String> = [
            ("prometheusServerAddress", "http://127.0.0.1:9"),
            ("prometheusQuery", "up"),
            ("prometheusPerReplica", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let s = 1000;
        let t0 = 1_800_000_000_000;
        let first = engine.resolve_at("ml", "llama", &md, t0).expect("valid metadata");
        // Asked every 15 s: the 10-minute drop applies.
        engine.resolve_at("ml", "llama", &md, t0 + 15 * s).unwrap();
        assert_eq!(first.kept_without_calls_ms(600 * s), 600 * s);
        assert_eq!(engine.sweep(t0 + 615 * s).await, 0, "asked 600 s ago: kept");
        assert_eq!(engine.sweep(t0 + 616 * s).await, 1, "601 s without a call: dropped");
        drop(first);
        // Polled every 15 minutes: asked again 885 s after the last call, it learns the gap
        // and is not dropped before the next poll, nor the one after.
        let again = engine.resolve_at("ml", "llama", &md, t0 + 900 * s).unwrap();
        assert_eq!(again.kept_without_calls_ms(600 * s), 2 * 885 * s);
        assert_eq!(engine.sweep(t0 + 1_790 * s).await, 0);
        let same = engine.resolve_at("ml", "llama", &md, t0 + 1_800 * s).unwrap();
        assert!(Arc::ptr_eq(&again, &same), "the same trigger, its planner kept");
        assert_eq!(engine.sweep(t0 + 2_700 * s).await, 0);
        // A deleted ScaledObject still goes, at twice its cadence.
        assert_eq!(engine.sweep(t0 + 1_800 * s + 1_800 * s).await, 0);
        assert_eq!(engine.sweep(t0 + 1_800 * s + 1_800 * s + 1).await, 1);
        drop((again, same));
        // After more than a day away it is new again.
        let later = engine.resolve_at("ml", "llama", &md, t0 + 3_600 * s + 86_401 * s).unwrap();
        assert_eq!(later.kept_without_calls_ms(600 * s), 600 * s);
        // An ordinary trigger keeps the ordinary drop, however often it is asked.
        let other = engine.resolve_at("ml", "mistral", &md, t0).unwrap();
        for k in 1..=40 {
            other.touch_at(t0 + k * 15 * s);
        }
        assert_eq!(other.kept_without_calls_ms(600 * s), 600 * s);
    }

    #[test]
    fn a_panic_in_a_planner_step_is_caught_not_passed_on() {
        let id = ScalerId { namespace: "ml".into(), name: "llama".into() };
        assert_eq!(guarded(&id, || 7), Some(7));
        assert_eq!(guarded(&id, || -> u32 { panic!("index out of bounds") }), None);
        let owned = String::from("formatted panic");
        assert_eq!(guarded(&id, move || -> u32 { panic!("{owned}") }), None);
        // A real planner steps through it unchanged.
        let md: BTreeMap<String, String> =
            [("prometheusServerAddress", "http://p:9090"), ("prometheusQuery", "up"), ("prometheusPerReplica", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let config = config::parse(&id, &md).expect("a minimal ScaledObject");
        let mut p = new_predictor(&config).unwrap();
        let mut q = new_predictor(&config).unwrap();
        for k in 1..=20 {
            let t = 1_800_000_000.0 + f64::from(k) * 5.0;
            let stepped = guarded(&id, || p.step(t, 3.0)).expect("no panic");
            assert_eq!(stepped, q.step(t, 3.0));
        }
    }

    #[test]
    fn the_late_share_pools_every_vllm_signal_and_is_none_without_requests() {
        let sig = |detail: &[(&'static str, f64)]| SignalView::with_detail("vllm", detail);
        let a = sig(&[("queue_started_rate", 10.0), ("queue_late_rate", 1.0)]);
        let b = sig(&[("queue_started_rate", 30.0), ("queue_late_rate", 9.0)]);
        // (1 + 9) / (10 + 30), not the mean of the two shares (0.1 and 0.3).
        assert_eq!(queue_late_share(&[a.clone(), b, sig(&[("waiting", 3.0)])]), Some(0.25));
        assert_eq!(queue_late_share(&[sig(&[("waiting", 3.0)])]), None, "no histogram: no figure");
        let idle = sig(&[("queue_started_rate", 0.0), ("queue_late_rate", 0.0)]);
        assert_eq!(queue_late_share(&[idle]), None, "nobody scheduled: no figure, not 0");
        assert_eq!(queue_late_share(&[a]), Some(0.1));
    }

    #[test]
    fn scheduled_and_late_requests_are_counted_from_the_running_totals_between_ticks() {
        let sig =
            |s: f64, l: f64| SignalView::with_detail("vllm", &[("queue_started_total", s), ("queue_late_total", l)]);
        let other = SignalView::with_detail("rabbitmq", &[("waiting", 3.0)]);
        let now = queue_totals(&[sig(100.0, 5.0), other.clone(), sig(40.0, 1.0)]);
        assert_eq!(now, [Some((100.0, 5.0)), None, Some((40.0, 1.0))]);
        let mut seen = Vec::new();
        // The first totals seen are a baseline: a shared poll counted them before this
        // ScaledObject existed.
        assert_eq!(queue_increments(&mut seen, &now), None);
        let next = [Some((110.0, 6.0)), None, Some((42.0, 3.0))];
        assert_eq!(queue_increments(&mut seen, &next), Some((12.0, 3.0)));
        // The same readings at the next tick add nothing.
        assert_eq!(queue_increments(&mut seen, &next), Some((0.0, 0.0)));
        // The second vLLM poll started again (its totals went down): a new baseline, while
        // the first still counts; a signal without totals this tick keeps its last ones.
        assert_eq!(queue_increments(&mut seen, &[Some((115.0, 6.0)), None, Some((1.0, 0.0))]), Some((5.0, 0.0)));
        assert_eq!(queue_increments(&mut seen, &[None, None, Some((3.0, 1.0))]), Some((2.0, 1.0)));
        assert_eq!(queue_increments(&mut seen, &[Some((120.0, 6.0)), None, Some((3.0, 1.0))]), Some((5.0, 0.0)));
        assert_eq!(queue_increments(&mut seen, &[None, None, None]), None);
        assert_eq!(queue_increments(&mut Vec::new(), &queue_totals(&[other])), None);
    }
}
