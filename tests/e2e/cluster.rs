//! Cluster awareness end to end: the real `prescale serve` against a fake Kubernetes API
//! server (axum on 127.0.0.1:0) serving real-shaped objects — Nodes with GFD labels and
//! MIG / time-sliced allocatable, Pods, a Deployment, ScaledObjects, a Karpenter NodePool
//! and NodeClaim, Leases — with list/get/create/replace/merge-patch/delete and the watch
//! protocol (`?watch=true`, newline-delimited WatchEvents after a resourceVersion).
//! prescale finds it through a kubeconfig file in `KUBECONFIG`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::harness::{dcgm_util_page, eventually, metric, sref, unique, Proxy, Server};

// === the fake API server ===

#[derive(Default)]
struct State {
    rv: u64,
    /// collection ("api/v1/pods", "apis/apps/v1/deployments") → (namespace, name) → object.
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    /// (rv, collection, namespace, event type, object)
    log: Vec<(u64, String, String, &'static str, Value)>,
    /// "METHOD path" of every write.
    writes: Vec<String>,
    /// "path?labelSelector" of every LIST (a collection GET that is not a watch).
    lists: Vec<String>,
    /// Path suffixes whose writes RBAC forbids (403), as a ServiceAccount without the grant.
    forbidden: Vec<String>,
}

#[derive(Clone)]
pub(crate) struct FakeApi {
    state: Arc<Mutex<State>>,
    notify: Arc<tokio::sync::watch::Sender<u64>>,
    port: u16,
}

fn kind_of(collection: &str) -> (&'static str, &'static str) {
    match collection {
        "api/v1/pods" => ("v1", "Pod"),
        "api/v1/nodes" => ("v1", "Node"),
        "apis/apps/v1/deployments" => ("apps/v1", "Deployment"),
        "apis/apps/v1/statefulsets" => ("apps/v1", "StatefulSet"),
        "apis/keda.sh/v1alpha1/scaledobjects" => ("keda.sh/v1alpha1", "ScaledObject"),
        "apis/karpenter.sh/v1/nodepools" => ("karpenter.sh/v1", "NodePool"),
        "apis/karpenter.sh/v1/nodeclaims" => ("karpenter.sh/v1", "NodeClaim"),
        "apis/coordination.k8s.io/v1/leases" => ("coordination.k8s.io/v1", "Lease"),
        "apis/scheduling.k8s.io/v1/priorityclasses" => ("scheduling.k8s.io/v1", "PriorityClass"),
        "apis/discovery.k8s.io/v1/endpointslices" => ("discovery.k8s.io/v1", "EndpointSlice"),
        _ => ("v1", "Unknown"),
    }
}

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap(), axum::Json(body)).into_response()
}

fn merge_patch(target: &mut Value, patch: &Value) {
    if let Value::Object(p) = patch {
        if !target.is_object() {
            *target = json!({});
        }
        let t = target.as_object_mut().unwrap();
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    } else {
        *target = patch.clone();
    }
}

fn selector_matches(sel: &str, obj: &Value) -> bool {
    let labels = obj.pointer("/metadata/labels").cloned().unwrap_or(json!({}));
    sel.split(',').filter(|s| !s.is_empty()).all(|req| {
        let get = |k: &str| labels.get(k.trim()).and_then(|v| v.as_str()).map(String::from);
        if let Some((k, v)) = req.split_once("!=") {
            get(k).as_deref() != Some(v.trim())
        } else if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
            get(k).as_deref() == Some(v.trim())
        } else if let Some(k) = req.strip_prefix('!') {
            get(k).is_none()
        } else {
            get(req).is_some()
        }
    })
}

/// (collection, namespace, name) from a request path.
fn parse_path(path: &str) -> Option<(String, Option<String>, Option<String>)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest) = match *segs.first()? {
        "api" => (format!("api/{}", segs.get(1)?), &segs[2..]),
        "apis" => (format!("apis/{}/{}", segs.get(1)?, segs.get(2)?), &segs[3..]),
        _ => return None,
    };
    let (ns, rest) = if rest.first() == Some(&"namespaces") && rest.len() >= 3 {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let plural = rest.first()?;
    Some((format!("{prefix}/{plural}"), ns, rest.get(1).map(|s| s.to_string())))
}

impl FakeApi {
    pub(crate) async fn start() -> FakeApi {
        let (tx, _) = tokio::sync::watch::channel(0u64);
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let api = FakeApi { state: Arc::default(), notify: Arc::new(tx), port };
        let a2 = api.clone();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
            let api = a2.clone();
            async move { api.handle(method, uri, body).await }
        });
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        api
    }

    /// Refuse every write to a path ending in `suffix` with 403 Forbidden from now on.
    pub(crate) fn forbid(&self, suffix: &str) {
        self.state.lock().unwrap().forbidden.push(suffix.to_string());
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Store (create or replace) an object, as a controller would, emitting its watch event.
    pub(crate) fn put(&self, collection: &str, mut obj: Value) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv;
        let (av, kind) = kind_of(collection);
        obj["apiVersion"] = json!(av);
        obj["kind"] = json!(kind);
        let ns = obj.pointer("/metadata/namespace").and_then(|v| v.as_str()).unwrap_or("").to_string();
        let name = obj.pointer("/metadata/name").and_then(|v| v.as_str()).unwrap().to_string();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        if obj.pointer("/metadata/uid").is_none() {
            obj["metadata"]["uid"] = json!(format!("uid-{collection}-{ns}-{name}").replace('/', "-"));
        }
        if obj.pointer("/metadata/creationTimestamp").is_none() {
            obj["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        let existed = s.objects.entry(collection.to_string()).or_default().insert((ns.clone(), name), obj.clone());
        let ty = if existed.is_some() { "MODIFIED" } else { "ADDED" };
        s.log.push((rv, collection.to_string(), ns, ty, obj));
        drop(s);
        self.notify.send_replace(rv);
    }

    pub(crate) fn remove(&self, collection: &str, ns: &str, name: &str) -> Option<Value> {
        let mut s = self.state.lock().unwrap();
        let obj = s.objects.get_mut(collection)?.remove(&(ns.to_string(), name.to_string()))?;
        s.rv += 1;
        let rv = s.rv;
        let mut gone = obj.clone();
        gone["metadata"]["resourceVersion"] = json!(rv.to_string());
        s.log.push((rv, collection.to_string(), ns.to_string(), "DELETED", gone.clone()));
        drop(s);
        self.notify.send_replace(rv);
        Some(gone)
    }

    fn list(&self, collection: &str, ns: Option<&str>, selector: &str) -> Vec<Value> {
        let s = self.state.lock().unwrap();
        s.objects
            .get(collection)
            .map(|m| {
                m.iter()
                    .filter(|((n, _), o)| ns.is_none_or(|x| x == n) && selector_matches(selector, o))
                    .map(|(_, o)| o.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn get(&self, collection: &str, ns: &str, name: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(collection)?.get(&(ns.to_string(), name.to_string())).cloned()
    }

    fn writes(&self) -> Vec<String> {
        self.state.lock().unwrap().writes.clone()
    }

    /// The LISTs served so far, as "path?labelSelector".
    pub(crate) fn lists(&self) -> Vec<String> {
        self.state.lock().unwrap().lists.clone()
    }

    async fn handle(&self, method: Method, uri: Uri, body: Bytes) -> Response {
        let path = uri.path().to_string();
        let q: BTreeMap<String, String> =
            url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect();
        if path == "/version" {
            return axum::Json(json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "gitCommit": "0",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
                "platform": "linux/amd64"}))
            .into_response();
        }
        let Some((coll, ns, name)) = parse_path(&path) else {
            return status(404, "NotFound", format!("no route {path}"));
        };
        if method != Method::GET {
            let mut s = self.state.lock().unwrap();
            s.writes.push(format!("{method} {path}"));
            if s.forbidden.iter().any(|f| path.ends_with(f.as_str())) {
                return status(403, "Forbidden", format!("{method} {path} is forbidden: RBAC: no grant"));
            }
        }
        let nsv = ns.clone().unwrap_or_default();
        if path.ends_with("/scale") {
            return self.scale(method, &coll, &nsv, name.as_deref().unwrap_or(""), &body);
        }
        match (method.clone(), name) {
            (Method::GET, None) if q.get("watch").map(String::as_str) == Some("true") => {
                let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
                let timeout = q.get("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(290u64);
                self.watch(coll, ns, q.get("labelSelector").cloned().unwrap_or_default(), from, timeout)
            }
            (Method::GET, None) => {
                let sel = q.get("labelSelector").cloned().unwrap_or_default();
                self.state.lock().unwrap().lists.push(format!("{path}?{sel}"));
                let items = self.list(&coll, ns.as_deref(), q.get("labelSelector").map(String::as_str).unwrap_or(""));
                let rv = self.state.lock().unwrap().rv;
                let (av, kind) = kind_of(&coll);
                axum::Json(json!({"apiVersion": av, "kind": format!("{kind}List"),
                    "metadata": {"resourceVersion": rv.to_string()}, "items": items}))
                .into_response()
            }
            (Method::GET, Some(n)) => match self.get(&coll, &nsv, &n) {
                Some(o) => axum::Json(o).into_response(),
                None => status(404, "NotFound", format!("{coll} \"{n}\" not found")),
            },
            (Method::POST, None) => {
                let mut obj: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
                let n = obj.pointer("/metadata/name").and_then(|v| v.as_str()).unwrap_or("").to_string();
                if self.get(&coll, &nsv, &n).is_some() {
                    return status(409, "AlreadyExists", format!("{coll} \"{n}\" already exists"));
                }
                if ns.is_some() {
                    obj["metadata"]["namespace"] = json!(nsv);
                }
                obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
                self.put(&coll, obj);
                (StatusCode::CREATED, axum::Json(self.get(&coll, &nsv, &n).unwrap())).into_response()
            }
            (Method::PUT, Some(n)) => {
                let Some(old) = self.get(&coll, &nsv, &n) else {
                    return status(404, "NotFound", format!("{coll} \"{n}\" not found"));
                };
                let mut obj: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
                let sent = obj.pointer("/metadata/resourceVersion").cloned();
                if sent.is_some() && sent != old.pointer("/metadata/resourceVersion").cloned() {
                    return status(409, "Conflict", format!("{coll} \"{n}\": the object has been modified"));
                }
                obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
                obj["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
                self.put(&coll, obj);
                axum::Json(self.get(&coll, &nsv, &n).unwrap()).into_response()
            }
            (Method::PATCH, Some(n)) => {
                let Some(mut obj) = self.get(&coll, &nsv, &n) else {
                    return status(404, "NotFound", format!("{coll} \"{n}\" not found"));
                };
                let patch: Value = serde_json::from_slice(&body).unwrap_or(json!({}));
                merge_patch(&mut obj, &patch);
                self.put(&coll, obj);
                axum::Json(self.get(&coll, &nsv, &n).unwrap()).into_response()
            }
            (Method::DELETE, Some(n)) => match self.remove(&coll, &nsv, &n) {
                Some(o) => axum::Json(o).into_response(),
                None => status(404, "NotFound", format!("{coll} \"{n}\" not found")),
            },
            _ => status(405, "MethodNotAllowed", format!("{method} {path}")),
        }
    }

    /// The `scale` subresource (autoscaling/v1 Scale) of an object whose `spec.replicas` it
    /// scales and whose `status.nodes` (a NodePool's statuspath) it reports: GET, and a merge
    /// PATCH of `spec.replicas`.
    fn scale(&self, method: Method, coll: &str, ns: &str, name: &str, body: &[u8]) -> Response {
        let Some(mut obj) = self.get(coll, ns, name) else {
            return status(404, "NotFound", format!("{coll} \"{name}\" not found"));
        };
        if method == Method::PATCH {
            let patch: Value = serde_json::from_slice(body).unwrap_or(json!({}));
            let Some(replicas) = patch.pointer("/spec/replicas").and_then(Value::as_i64) else {
                return status(422, "Invalid", "a Scale patch sets spec.replicas".to_string());
            };
            obj["spec"]["replicas"] = json!(replicas);
            self.put(coll, obj);
            obj = self.get(coll, ns, name).unwrap_or_default();
        } else if method != Method::GET {
            return status(405, "MethodNotAllowed", format!("{method} {coll}/{name}/scale"));
        }
        let meta = &obj["metadata"];
        axum::Json(json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": meta["name"], "uid": meta["uid"], "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"]},
            "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(0))},
            "status": {"replicas": obj.pointer("/status/nodes").cloned().unwrap_or(json!(0))}}))
        .into_response()
    }

    fn watch(&self, coll: String, ns: Option<String>, selector: String, from: u64, timeout_s: u64) -> Response {
        let state = self.state.clone();
        let rx = self.notify.subscribe();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout_s);
        let stream = futures::stream::unfold((from, rx), move |(mut last, mut rx)| {
            let state = state.clone();
            let (coll, ns, selector) = (coll.clone(), ns.clone(), selector.clone());
            async move {
                loop {
                    let mut out = String::new();
                    {
                        let s = state.lock().unwrap();
                        let since = last;
                        for (rv, c, n, ty, obj) in s.log.iter().filter(|e| e.0 > since) {
                            last = *rv;
                            if *c == coll && ns.as_ref().is_none_or(|x| x == n) && selector_matches(&selector, obj) {
                                out.push_str(&json!({"type": ty, "object": obj}).to_string());
                                out.push('\n');
                            }
                        }
                    }
                    if !out.is_empty() {
                        return Some((Ok::<Bytes, std::io::Error>(Bytes::from(out)), (last, rx)));
                    }
                    tokio::select! {
                        r = rx.changed() => if r.is_err() { return None },
                        _ = tokio::time::sleep_until(deadline) => return None,
                    }
                }
            }
        });
        Response::builder().header("content-type", "application/json").body(Body::from_stream(stream)).unwrap()
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

fn kubeconfig(server: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}.kubeconfig", unique("prescale")));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\nusers:\n- name: fake\n  user: {{}}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: prescale\ncurrent-context: fake\n"
    );
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().to_string()
}

/// A fake Prometheus answering every instant query with `value`.
pub(crate) async fn fake_prometheus(value: Arc<Mutex<f64>>) -> String {
    let app = axum::Router::new().route(
        "/api/v1/query",
        axum::routing::get(move || {
            let v = *value.lock().unwrap();
            async move {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
                axum::Json(json!({"status": "success", "data": {"resultType": "vector",
                    "result": [{"metric": {}, "value": [now, v.to_string()]}]}}))
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    format!("http://127.0.0.1:{port}")
}

// === real-shaped fixtures ===

const PODS: &str = "api/v1/pods";
const NODES: &str = "api/v1/nodes";
const DEPLOYMENTS: &str = "apis/apps/v1/deployments";
const SCALEDOBJECTS: &str = "apis/keda.sh/v1alpha1/scaledobjects";
const NODEPOOLS: &str = "apis/karpenter.sh/v1/nodepools";
const NODECLAIMS: &str = "apis/karpenter.sh/v1/nodeclaims";
const LEASES: &str = "apis/coordination.k8s.io/v1/leases";
pub(crate) const ENDPOINTSLICES: &str = "apis/discovery.k8s.io/v1/endpointslices";

fn h100_node(name: &str, created: &str, ready: &str, mig_3g: u32) -> Value {
    json!({
        "metadata": {"name": name, "creationTimestamp": created, "labels": {
            "karpenter.sh/nodepool": "gpu-mig",
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config": "custom-4x1g.10gb-1x3g.40gb",
            "nvidia.com/mig.config.state": "success",
            "nvidia.com/mig-1g.10gb.count": "4",
            "nvidia.com/mig-3g.40gb.count": mig_3g.to_string()
        }},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "190", "memory": "2000Gi", "pods": "110",
                "nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-3g.40gb": mig_3g.to_string()},
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ready}]
        }
    })
}

fn time_sliced_node() -> Value {
    json!({
        "metadata": {"name": "a10g-ts", "labels": {
            "karpenter.sh/nodepool": "shared",
            "nvidia.com/gpu.product": "NVIDIA-A10G",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
            "nvidia.com/gpu.replicas": "4"
        }},
        "status": {"allocatable": {"cpu": "15", "nvidia.com/gpu.shared": "4"},
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2025-12-01T00:02:00Z"}]}
    })
}

fn vllm_pod(name: &str, app: &str, node: &str, created: &str, ready: Option<&str>, resource: &str) -> Value {
    let conditions = match ready {
        Some(r) => json!([{"type": "Ready", "status": "True", "lastTransitionTime": r}]),
        None => json!([{"type": "Ready", "status": "False", "lastTransitionTime": created}]),
    };
    json!({
        "metadata": {"name": name, "namespace": "llm", "uid": format!("uid-{name}"), "creationTimestamp": created,
            "labels": {"app": app, "pod-template-hash": "abc"}},
        "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.9",
            "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {resource: "1"}}}]},
        "status": {"phase": "Running", "conditions": conditions}
    })
}

/// Someone else's Ready workload (namespace `other`) on `node`.
fn embed_pod(name: &str, node: &str, created: &str, ready: &str, resource: &str) -> Value {
    let mut p = vllm_pod(name, "embed", node, created, Some(ready), resource);
    p["metadata"]["namespace"] = json!("other");
    p
}

fn deployment(name: &str, resource: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "llm"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.9",
                        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {resource: "1"}}}],
                    "nodeSelector": {"karpenter.sh/nodepool": "gpu-mig"},
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}
                    ]}}},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
                }
            }
        }
    })
}

fn scaled_object(name: &str, target: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "llm"},
        "spec": {"scaleTargetRef": {"name": target}, "minReplicaCount": 1, "maxReplicaCount": 10,
            "triggers": [{"type": "external", "metadata": {"scalerAddress": "prescale.keda:9090"}}]}
    })
}

/// The scene: an old H100 with one free 3g.40gb slice, a new H100 (launched by a NodeClaim
/// for the pods) full, a time-sliced A10G; three Ready replicas with known warm-ups.
fn seed(api: &FakeApi) {
    api.put(NODES, h100_node("h100-old", "2025-12-01T00:00:00Z", "2025-12-01T00:02:00Z", 2));
    // Launched for p2: claim at +5 s, node object at +40 s, Ready at +150 s.
    api.put(NODES, h100_node("h100-new", "2026-01-01T00:00:40Z", "2026-01-01T00:02:30Z", 2));
    api.put(NODES, time_sliced_node());
    api.put(
        NODECLAIMS,
        json!({"metadata": {"name": "gpu-mig-x7k2p", "creationTimestamp": "2026-01-01T00:00:05Z",
            "labels": {"karpenter.sh/nodepool": "gpu-mig"}},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge"]}]},
            "status": {"nodeName": "h100-new", "providerID": "aws:///us-east-1a/i-0abc",
                "conditions": [{"type": "Initialized", "status": "True", "lastTransitionTime": "2026-01-01T00:02:40Z"}]}}),
    );
    api.put(
        NODEPOOLS,
        json!({"metadata": {"name": "gpu-mig"}, "spec": {
            "template": {"metadata": {"labels": {"nvidia.com/mig.config": "custom-4x1g.10gb-1x3g.40gb"}},
                "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                    "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["p5"]}],
                    "taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]}},
            "limits": {"nvidia.com/gpu": "64"}}}),
    );
    api.put(DEPLOYMENTS, deployment("vllm", "nvidia.com/mig-3g.40gb"));
    api.put(SCALEDOBJECTS, scaled_object("llama", "vllm"));
    // Warm-ups: 200 s, 400 s (waited for h100-new), 300 s.
    api.put(
        PODS,
        vllm_pod(
            "vllm-1",
            "vllm",
            "h100-old",
            "2025-12-02T00:00:00Z",
            Some("2025-12-02T00:03:20Z"),
            "nvidia.com/mig-3g.40gb",
        ),
    );
    api.put(
        PODS,
        vllm_pod(
            "vllm-2",
            "vllm",
            "h100-new",
            "2026-01-01T00:00:00Z",
            Some("2026-01-01T00:06:40Z"),
            "nvidia.com/mig-3g.40gb",
        ),
    );
    api.put(
        PODS,
        vllm_pod(
            "vllm-3",
            "vllm",
            "h100-new",
            "2026-01-01T01:00:00Z",
            Some("2026-01-01T01:05:00Z"),
            "nvidia.com/mig-3g.40gb",
        ),
    );
    // Something else on the time-sliced node.
    api.put(
        PODS,
        embed_pod("embed-1", "a10g-ts", "2025-12-02T00:00:00Z", "2025-12-02T00:01:00Z", "nvidia.com/gpu.shared"),
    );
    // A second ScaledObject whose Deployment asks for a MIG profile nobody offers.
    api.put(DEPLOYMENTS, deployment("phi", "nvidia.com/mig-2g.20gb"));
    api.put(SCALEDOBJECTS, scaled_object("phi", "phi"));
}

fn md<'a>(prom: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut v = vec![
        ("prometheusServerAddress", prom),
        ("prometheusQuery", "sum(vllm:num_requests_waiting)"),
        ("prometheusPerReplica", "1"),
        ("sampleSeconds", "1"),
        ("staleAfterSeconds", "30"),
        ("scaleToZero", "false"),
        ("maxReplicas", "10"),
    ];
    v.extend_from_slice(extra);
    v
}

async fn debug_of(s: &Server, name: &str) -> Value {
    let (_, body) = s.get("/debug/scalers").await;
    let v: Value = serde_json::from_str(&body).unwrap_or(json!({}));
    v["scaledObjects"]
        .as_array()
        .and_then(|a| a.iter().find(|x| x["scaledObject"] == format!("llm/{name}")).cloned())
        .unwrap_or(json!({}))
}

async fn cluster_status(s: &Server) -> Value {
    let (_, body) = s.get("/debug/scalers").await;
    serde_json::from_str::<Value>(&body).map(|v| v["cluster"].clone()).unwrap_or(json!({}))
}

fn placeholders(api: &FakeApi) -> Vec<Value> {
    api.list(PODS, Some("llm"), "prescale.io/headroom-for=llm.llama")
}

fn env_for(kc: &str) -> Vec<(&str, &str)> {
    vec![("KUBECONFIG", kc), ("PRESCALE_LEASE_SECONDS", "3"), ("PRESCALE_LEASE_NAMESPACE", "prescale")]
}

/// The seeded fake API, a fake Prometheus answering `demand` (which the test may move) and a
/// prescale server on both, started with `args` and `env` beside the fake API's.
async fn seeded_with_demand(
    demand: f64,
    args: &[&str],
    env: &[(&str, &str)],
) -> (FakeApi, Arc<Mutex<f64>>, String, Server) {
    let api = FakeApi::start().await;
    seed(&api);
    let demand = Arc::new(Mutex::new(demand));
    let prom = fake_prometheus(demand.clone()).await;
    let kc = kubeconfig(&api.url());
    let mut all = env_for(&kc);
    all.extend_from_slice(env);
    let server = Server::start_with_env(args, &all);
    (api, demand, prom, server)
}

// === tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_warmup_capacity_and_headroom_placeholders_that_leave_when_replicas_land() {
    let (api, _demand, prom, server) = seeded_with_demand(6.0, &[], &[]).await;
    let mut c = server.client().await;
    let llama = sref("llm", "llama", &md(&prom, &[("warmupSeconds", "auto"), ("karpenterMode", "headroom")]));
    let phi = sref("llm", "phi", &md(&prom, &[("karpenterMode", "off")]));
    eventually(20, "first answer", || {
        let (mut c, r) = (c.clone(), llama.clone());
        async move { metric(&mut c, &r).await.ok() }
    })
    .await;
    assert!(metric(&mut c, &phi).await.is_ok());

    // Warm-up measured from pod and node timestamps: pods 200/400/300 s; the node that
    // came for vllm-2 from its NodeClaim (+5 s) to Ready (+150 s) = 145 s.
    let d = eventually(20, "three warm-up samples", || {
        let s = &server;
        async move {
            let d = debug_of(s, "llama").await;
            (d["cluster"]["warmup"]["pod"]["samples"] == 3).then_some(d)
        }
    })
    .await;
    let w = &d["cluster"]["warmup"];
    assert_eq!(w["pod"]["p50"], 300.0, "{w}");
    assert_eq!(w["pod"]["max"], 400.0, "{w}");
    assert_eq!(w["node"]["samples"], 1, "{w}");
    assert_eq!(w["node"]["last"], 145.0, "{w}");
    assert_eq!(w["auto"]["seconds"], 415.0, "p90 of 3 samples + the HPA's 15-s sync period: {w}");
    // warmupSeconds: auto plans with it.
    let d = eventually(15, "planner uses the measured warm-up", || {
        let s = &server;
        async move {
            let d = debug_of(s, "llama").await;
            (d["snapshot"]["planner"]["warmupPlannedSeconds"] == 415.0).then_some(d)
        }
    })
    .await;
    // ...and plans from the target's three pods as the pod watch shows them.
    let fleet = &d["snapshot"]["planner"]["fleet"];
    assert_eq!(fleet["from"], "pods up to spec.replicas", "{fleet}");
    assert_eq!(fleet["ready"].as_u64().unwrap() + fleet["warming"].as_u64().unwrap(), 3, "{fleet}");

    // Capacity: h100-old has one free 3g.40gb; h100-new is full; the tainted nodes are
    // tolerated; the time-sliced node shows 3 free shared GPUs in its pool.
    let cap = &d["cluster"]["capacity"];
    assert_eq!(cap["currentReplicas"], 3, "{cap}");
    assert_eq!(cap["fit"]["fitsNow"], 1, "{cap}");
    assert_eq!(cap["fit"]["eligibleNodes"], 2, "{cap}");
    assert_eq!(cap["freeByNodePool"]["gpu-mig"]["nvidia.com/mig-3g.40gb"], 1, "{cap}");
    assert_eq!(cap["freeByNodePool"]["gpu-mig"]["nvidia.com/mig-1g.10gb"], 8, "{cap}");
    assert_eq!(cap["freeByNodePool"]["shared"]["nvidia.com/gpu.shared"], 3, "{cap}");
    assert_eq!(cap["nodePools"][0]["name"], "gpu-mig", "{cap}");

    // The MIG profile nobody offers is named, with the nodes' labels (once phi's own view of
    // the capacity is computed: its target is followed on its own refresh, not llama's).
    let p = eventually(20, "phi's capacity view", || {
        let s = &server;
        async move {
            let p = debug_of(s, "phi").await;
            p["cluster"]["warnings"][0].is_string().then_some(p)
        }
    })
    .await;
    let warn = p["cluster"]["warnings"][0].as_str().unwrap_or_default().to_string();
    assert!(warn.contains("MIG profile 2g.20gb (nvidia.com/mig-2g.20gb) is requested but no node offers it"), "{p}");
    assert!(warn.contains("nvidia.com/mig.config=custom-4x1g.10gb-1x3g.40gb"), "{warn}");
    assert!(warn.contains("h100-old ["), "{warn}");

    // The plan (≥ 6) is above what fits (3 running + 1 free): flagged, and placeholders
    // for the rest are created with the replica's requests and placement.
    let desired = d["cluster"]["plan"]["desired"].as_u64().unwrap_or(0) as usize;
    assert!(desired >= 6, "{d}");
    assert!(d["cluster"]["overCapacity"].as_str().unwrap_or("").contains("3 exist and 1 more fit"), "{d}");
    // (Re-read the plan each time: the forecast may still move it by one.)
    let (pods, desired) = eventually(20, "headroom placeholders for the plan beyond what fits", || {
        let (api, s) = (api.clone(), &server);
        async move {
            let desired = debug_of(s, "llama").await["cluster"]["plan"]["desired"].as_u64()? as usize;
            let p = placeholders(&api);
            (p.len() == desired - 3 - 1).then_some((p, desired))
        }
    })
    .await;
    let want = desired - 3 - 1;
    let ph = &pods[0];
    let spec = &ph["spec"];
    assert_eq!(spec["priorityClassName"], "prescale-headroom");
    let res = &spec["containers"][0]["resources"];
    assert_eq!(res["limits"]["nvidia.com/mig-3g.40gb"], "1", "{res}");
    assert_eq!(res["requests"]["nvidia.com/mig-3g.40gb"], "1", "{res}");
    assert_eq!(res["requests"]["cpu"], "8000m", "{res}");
    assert_eq!(spec["nodeSelector"]["karpenter.sh/nodepool"], "gpu-mig");
    assert_eq!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0]["values"][0],
        "NVIDIA-H100-80GB-HBM3"
    );
    assert_eq!(spec["tolerations"][0]["key"], "nvidia.com/gpu");
    assert!(ph["metadata"]["labels"].get("app").is_none(), "placeholders must not match the Deployment");
    assert_eq!(ph["metadata"]["ownerReferences"][0]["kind"], "PriorityClass");
    let pc = api.get("apis/scheduling.k8s.io/v1/priorityclasses", "", "prescale-headroom").expect("PriorityClass");
    assert_eq!(pc["value"], -10);
    assert_eq!(pc["preemptionPolicy"], "Never");
    assert_eq!(ph["metadata"]["ownerReferences"][0]["uid"], pc["metadata"]["uid"]);
    // The hint is annotated on the NodePool.
    let pool = eventually(10, "NodePool hint", || {
        let api = api.clone();
        async move {
            let p = api.get(NODEPOOLS, "", "gpu-mig")?;
            p.pointer("/metadata/annotations/prescale.io~1headroom").is_some().then_some(p)
        }
    })
    .await;
    let hint: Value =
        serde_json::from_str(pool["metadata"]["annotations"]["prescale.io/headroom"].as_str().unwrap()).unwrap();
    let hinted = hint["llm/llama"]["replicas"].as_u64().unwrap_or(0) as usize;
    assert!(hinted + 1 >= want && hinted <= want + 1, "hint {hint} vs {want} placeholders (the plan may move by one)");
    assert_eq!(hint["llm/llama"]["perReplica"]["nvidia.com/mig-3g.40gb"], 1, "{hint}");
    // /metrics carries warm-up quantiles, free GPU capacity and headroom pods.
    let (_, m) = server.get("/metrics").await;
    assert!(
        m.contains(
            "prescale_warmup_seconds{namespace=\"llm\",scaledobject=\"llama\",phase=\"pod\",quantile=\"0.9\"} 400"
        ),
        "{m}"
    );
    assert!(m.contains("prescale_gpu_free{nodepool=\"shared\",resource=\"nvidia.com/gpu.shared\"} 3"), "{m}");
    assert!(m.contains("prescale_headroom_pods{namespace=\"llm\",scaledobject=\"llama\"} "), "{m}");

    // Real replicas land (KEDA scaled the Deployment; Karpenter brought a node): the
    // placeholders go, and so does the hint.
    api.put(NODES, h100_node("h100-third", "2026-01-02T00:00:00Z", "2026-01-02T00:02:00Z", 2));
    let now = now_rfc3339();
    // Up to maxReplicas (10), so a plan that moved up meanwhile is covered too.
    for i in 0..7 {
        let node = if i == 0 { "h100-old" } else { "h100-third" };
        api.put(PODS, vllm_pod(&format!("vllm-new-{i}"), "vllm", node, &now, None, "nvidia.com/mig-3g.40gb"));
    }
    eventually(20, "placeholders removed once replicas landed", || {
        let api = api.clone();
        async move { placeholders(&api).is_empty().then_some(()) }
    })
    .await;
    eventually(10, "NodePool hint cleared", || {
        let api = api.clone();
        async move {
            let p = api.get(NODEPOOLS, "", "gpu-mig")?;
            p.pointer("/metadata/annotations/prescale.io~1headroom").is_none().then_some(())
        }
    })
    .await;
    // karpenterMode: off never wrote for phi.
    assert!(api.list(PODS, Some("llm"), "prescale.io/headroom-for=llm.phi").is_empty());
    assert!(metric(&mut c, &llama).await.is_ok());
}

/// A ScaledObject's gauges on `/metrics` by name (`prescale_planned_replicas` → answered,
/// `prescale_planner_replicas`, `prescale_reactive_replicas`), for `llm/{name}`.
async fn replica_gauges(s: &Server, name: &str) -> BTreeMap<String, f64> {
    let (_, page) = s.get("/metrics").await;
    prescale::sources::exposition::parse(&page)
        .unwrap_or_default()
        .into_iter()
        .filter(|x| {
            x.name.ends_with("_replicas")
                && x.label("namespace") == Some("llm")
                && x.label("scaledobject") == Some(name)
        })
        .map(|x| (x.name, x.value))
        .collect()
}

/// `mode: shadow` answers KEDA reactively and must not act on the plan it only shows: the
/// cluster is told the answer, so no GPU node is launched for replicas KEDA will not create.
/// Until session 34 the planner's count went to the headroom writer in every mode; here,
/// after demand falls from 6 to 1, the planner holds its fleet for the warm-up while the
/// reactive answer drops, and the placeholders sized from the planner's count stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_writes_headroom_for_the_reactive_answer_and_exports_the_planner_beside_it() {
    let (api, demand, prom, server) = seeded_with_demand(6.0, &[], &[]).await;
    let c = server.client().await;
    let llama = sref(
        "llm",
        "llama",
        &md(&prom, &[("karpenterMode", "headroom"), ("mode", "shadow"), ("warmupSeconds", "600")]),
    );
    eventually(20, "the reactive answer for 6", || {
        let (mut c, r) = (c.clone(), llama.clone());
        async move { (metric(&mut c, &r).await.ok()? == 6).then_some(()) }
    })
    .await;
    // 6 answered, 3 replicas exist and 1 more fits: 2 placeholders.
    eventually(20, "placeholders for the answer", || {
        let api = api.clone();
        async move { (placeholders(&api).len() == 2).then_some(()) }
    })
    .await;

    *demand.lock().unwrap() = 1.0;
    // The planner holds (it scales in only once the forecast over the warm-up stays low);
    // KEDA is answered 1, and that is what the cluster plans for.
    let (d, gauges) = eventually(20, "the answer falls to 1 while the planner holds", || {
        let s = &server;
        async move {
            let d = debug_of(s, "llama").await;
            let planner = d["snapshot"]["planner"]["desired"].as_u64()?;
            let g = replica_gauges(s, "llama").await;
            let exported = g.get("prescale_planner_replicas").copied()?;
            (d["snapshot"]["replicas"] == 1 && planner > 1 && exported > 1.0).then_some((d, g))
        }
    })
    .await;
    assert_eq!(d["snapshot"]["reactiveReplicas"], 1, "{d}");
    assert!(d["snapshot"]["reason"].as_str().unwrap_or("").starts_with("shadow:"), "{d}");
    assert_eq!(d["cluster"]["plan"]["desired"], 1, "the cluster follows the answer, not the shadow plan: {d}");
    assert_eq!(gauges.get("prescale_planned_replicas"), Some(&1.0), "{gauges:?}");
    assert_eq!(gauges.get("prescale_reactive_replicas"), Some(&1.0), "{gauges:?}");
    eventually(20, "placeholders gone with the answer", || {
        let api = api.clone();
        async move { placeholders(&api).is_empty().then_some(()) }
    })
    .await;
    // Still held on the planner's side: the placeholders went because of the mode.
    let d = debug_of(&server, "llama").await;
    assert!(d["snapshot"]["planner"]["desired"].as_u64().unwrap_or(0) > 1, "{d}");
    assert!(placeholders(&api).is_empty());
}

/// Editing a ScaledObject's metadata gives prescale a new trigger identity, and the old one
/// lingers until `--idle-drop-seconds` without a call. Dropping it untracked the
/// ScaledObject in the cluster although the edited trigger still planned it: its placeholders
/// were deleted, and warm-up measurement, pod-based fleet counts and DCGM narrowing stopped
/// for it until prescale restarted. Meanwhile the stale trigger's plan and gauges alternated
/// with the edited one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_scaled_object_keeps_its_cluster_features_after_the_old_metadata_is_dropped() {
    let (api, _demand, prom, server) = seeded_with_demand(6.0, &["--idle-drop-seconds", "5"], &[]).await;
    let c = server.client().await;
    let before = sref("llm", "llama", &md(&prom, &[("karpenterMode", "headroom"), ("mode", "reactive")]));
    // KEDA: asks the ScaledObject's current trigger every 300 ms.
    let current = Arc::new(Mutex::new(before));
    let keda = {
        let (c, current) = (c.clone(), current.clone());
        tokio::spawn(async move {
            loop {
                let r = current.lock().unwrap().clone();
                let _ = metric(&mut c.clone(), &r).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    // 6 answered, 3 replicas exist and 1 more fits: 2 placeholders.
    eventually(20, "placeholders for the first trigger", || {
        let api = api.clone();
        async move { (placeholders(&api).len() == 2).then_some(()) }
    })
    .await;
    // The edit: maxReplicas 10 → 5, so the plan is 5. KEDA asks only the edited trigger from
    // now on; the old one still ticks until it is dropped.
    *current.lock().unwrap() =
        sref("llm", "llama", &md(&prom, &[("karpenterMode", "headroom"), ("mode", "reactive"), ("maxReplicas", "5")]));
    eventually(10, "the edited trigger's plan", || {
        let s = &server;
        async move { (debug_of(s, "llama").await["cluster"]["plan"]["desired"] == 5).then_some(()) }
    })
    .await;
    // Until the old trigger is dropped, its plan (6) and gauges must not come back.
    let mut seen = Vec::new();
    while !server.log.lock().unwrap().iter().any(|l| l.contains("dropping ScaledObject not asked about")) {
        let plan = debug_of(&server, "llama").await["cluster"]["plan"]["desired"].as_u64();
        let answered = replica_gauges(&server, "llama").await.get("prescale_planned_replicas").copied();
        seen.push((plan, answered));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(seen.len() >= 5, "{seen:?}");
    assert!(seen.iter().all(|&(p, g)| p == Some(5) && g == Some(5.0)), "the stale trigger's plan came back: {seen:?}");
    // Several reconciles and ticks after the drop, the edited trigger is still followed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let d = debug_of(&server, "llama").await;
    assert_ne!(d["cluster"]["tracked"], false, "the edited trigger's ScaledObject is still tracked: {d}");
    assert_eq!(d["cluster"]["plan"]["desired"], 5, "{d}");
    // 5 planned, 3 exist: 2 missing, which the 2 placeholders stand for (a placeholder goes
    // as a replica lands or the plan drops below them, not for the room it brought).
    assert_eq!(placeholders(&api).len(), 2, "the edited trigger's placeholders were deleted with the old trigger");
    let gauges = replica_gauges(&server, "llama").await;
    assert_eq!(gauges.get("prescale_planned_replicas"), Some(&5.0), "{gauges:?}");
    keda.abort();
}

/// Two prescale triggers on one ScaledObject (distinct `metricName`s): KEDA's HPA follows the
/// larger answer, so the cluster plans for the larger; the ScaledObject's gauges come from one
/// trigger (the first registered) instead of alternating between the two every tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_triggers_of_one_scaled_object_plan_the_cluster_for_the_larger_and_export_one_series() {
    let (api, _demand, prom, server) = seeded_with_demand(6.0, &[], &[]).await;
    let mut c = server.client().await;
    let queue = sref("llm", "llama", &md(&prom, &[("karpenterMode", "headroom"), ("mode", "reactive")]));
    let gpu = sref(
        "llm",
        "llama",
        &md(
            &prom,
            &[
                ("karpenterMode", "headroom"),
                ("mode", "reactive"),
                ("metricName", "gpu"),
                ("prometheusPerReplica", "0.75"),
            ],
        ),
    );
    eventually(20, "the first trigger's answer", || {
        let (mut c, r) = (c.clone(), queue.clone());
        async move { (metric(&mut c, &r).await.ok()? == 6).then_some(()) }
    })
    .await;
    assert_eq!(metric(&mut c, &gpu).await.ok(), Some(8), "6 / 0.75");
    // 8 planned, 3 exist, 1 more fits: 4 placeholders.
    eventually(20, "placeholders for the larger plan", || {
        let api = api.clone();
        async move { (placeholders(&api).len() == 4).then_some(()) }
    })
    .await;
    let mut seen = Vec::new();
    for _ in 0..12 {
        let _ = (metric(&mut c, &queue).await, metric(&mut c, &gpu).await);
        let plan = debug_of(&server, "llama").await["cluster"]["plan"]["desired"].as_u64();
        let answered = replica_gauges(&server, "llama").await.get("prescale_planned_replicas").copied();
        seen.push((plan, answered));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(seen.iter().all(|&(p, g)| p == Some(8) && g == Some(6.0)), "{seen:?}");
    // /debug/scalers says which trigger sets the gauges.
    let (_, body) = server.get("/debug/scalers").await;
    let v: Value = serde_json::from_str(&body).unwrap();
    let mut roles: Vec<(String, bool, bool)> = v["scaledObjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let name = x["config"]["metricName"].as_str().unwrap_or("").to_string();
            (name, x["exportsGauges"] == true, x["superseded"] == true)
        })
        .collect();
    roles.sort();
    assert_eq!(roles, vec![("gpu".into(), false, false), ("prescale-replicas".into(), true, false)]);
}

/// KEDA stops asking about a deleted ScaledObject, but prescale keeps its trigger for
/// `--idle-drop-seconds` (10 minutes by default), and its placeholders held GPU nodes for
/// that long. The scale target's rediscovery now sees the ScaledObject gone, or paused by
/// KEDA's annotations, and plans nothing for it; a ScaledObject created again under the name,
/// or resumed, is followed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_scaled_objects_placeholders_go_before_its_trigger_is_dropped() {
    let (api, _demand, prom, server) = seeded_with_demand(6.0, &[], &[("PRESCALE_REDISCOVER_SECONDS", "1")]).await;
    let mut c = server.client().await;
    let llama = sref("llm", "llama", &md(&prom, &[("karpenterMode", "headroom"), ("mode", "reactive")]));
    eventually(20, "answer", || {
        let (mut c, r) = (c.clone(), llama.clone());
        async move { (metric(&mut c, &r).await.ok()? == 6).then_some(()) }
    })
    .await;
    eventually(20, "placeholders for the plan", || {
        let api = api.clone();
        async move { (placeholders(&api).len() == 2).then_some(()) }
    })
    .await;
    let so = api.remove(SCALEDOBJECTS, "llm", "llama").expect("the ScaledObject");
    eventually(20, "placeholders gone with the ScaledObject", || {
        let api = api.clone();
        async move { placeholders(&api).is_empty().then_some(()) }
    })
    .await;
    let d = debug_of(&server, "llama").await;
    assert_eq!(d["cluster"]["notFollowed"], true, "{d}");
    assert!(d["cluster"]["discoveryError"].as_str().unwrap_or("").contains("not found"), "{d}");
    // The trigger itself still answers (KEDA may have one call in flight).
    assert_eq!(metric(&mut c, &llama).await.ok(), Some(6));
    // Created again: followed again.
    api.put(SCALEDOBJECTS, so.clone());
    eventually(20, "placeholders back with the ScaledObject", || {
        let api = api.clone();
        async move { (placeholders(&api).len() == 2).then_some(()) }
    })
    .await;
    assert_eq!(debug_of(&server, "llama").await["cluster"]["notFollowed"], false);
    // Paused by KEDA's annotation: no scale-out is applied, so none is prepared for.
    let mut paused = so.clone();
    paused["metadata"]["annotations"] = json!({"autoscaling.keda.sh/paused": "true"});
    api.put(SCALEDOBJECTS, paused);
    eventually(20, "placeholders gone while paused", || {
        let api = api.clone();
        async move { placeholders(&api).is_empty().then_some(()) }
    })
    .await;
    let d = debug_of(&server, "llama").await;
    assert!(d["cluster"]["discoveryError"].as_str().unwrap_or("").contains("autoscaling.keda.sh/paused: true"), "{d}");
    // Scale-in paused only: scale-outs still apply, so the plan is followed.
    let mut scale_in = so.clone();
    scale_in["metadata"]["annotations"] = json!({"autoscaling.keda.sh/paused-scale-in": "true"});
    api.put(SCALEDOBJECTS, scale_in);
    eventually(20, "placeholders back with only scale-in paused", || {
        let api = api.clone();
        async move { (placeholders(&api).len() == 2).then_some(()) }
    })
    .await;
}

/// The write that resizes the static pool `gpu-mig` through its `scale` subresource.
const SCALE_PATCH: &str = "PATCH /apis/karpenter.sh/v1/nodepools/gpu-mig/scale";

/// `spec.replicas` of the static `gpu-mig` pool, when it has one.
fn pool_replicas(api: &FakeApi) -> Option<i64> {
    api.get(NODEPOOLS, "", "gpu-mig")?.pointer("/spec/replicas")?.as_i64()
}

/// The static pool `gpu-mig` in `api` (the two H100s of [`seed`] are its two static nodes:
/// 2 3g.40gb slices each, 3 of 4 in use; `limits.nodes` 8) and a server planning `llm/llama`
/// at a flat demand of 6 replicas with `karpenterResizeStaticNodePools`, once it has answered.
async fn static_pool_planned(api: &FakeApi) -> Server {
    seed(api);
    api.put(
        NODEPOOLS,
        json!({"metadata": {"name": "gpu-mig"}, "spec": {"replicas": 2,
            "template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["p5"]}]}},
            "limits": {"nodes": "8"}}}),
    );
    let prom = fake_prometheus(Arc::new(Mutex::new(6.0))).await;
    let kc = kubeconfig(&api.url());
    let server = Server::start_with_env(&[], &env_for(&kc));
    let c = server.client().await;
    let llama =
        sref("llm", "llama", &md(&prom, &[("karpenterMode", "headroom"), ("karpenterResizeStaticNodePools", "true")]));
    eventually(20, "first answer", || {
        let (mut c, r) = (c.clone(), llama.clone());
        async move { metric(&mut c, &r).await.ok() }
    })
    .await;
    server
}

/// Without the chart's `rbac.karpenter.resizeNodePools` the `scale` subresource answers 403:
/// the static pool keeps its size, prescale records no base for a growth that did not happen,
/// and it never falls back to patching the NodePool's spec (which the plain grant allows);
/// nor is the refusal retried at every reconcile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_scale_grant_a_static_pool_keeps_its_size_and_no_base_is_recorded() {
    let api = FakeApi::start().await;
    api.forbid("/scale");
    let server = static_pool_planned(&api).await;
    // The plan needs more nodes: the resize is tried through the subresource, and refused.
    eventually(30, "a resize tried through the scale subresource", || {
        let api = api.clone();
        async move { api.writes().iter().any(|w| w == SCALE_PATCH).then_some(()) }
    })
    .await;
    // Reconciles come every 3 s; a refusal is not retried at each (a warning every 3 s per
    // pool) but after five minutes.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let tries = api.writes().iter().filter(|w| *w == SCALE_PATCH).count();
    assert_eq!(tries, 1, "{:?}", api.writes());
    let pool = api.get(NODEPOOLS, "", "gpu-mig").unwrap();
    assert_eq!(pool_replicas(&api), Some(2), "{pool}");
    assert!(pool.pointer("/metadata/annotations/prescale.io~1static-base-replicas").is_none(), "{pool}");
    // (A patch of the NodePool itself would have merged into spec.replicas: it is still 2.)
    let d = debug_of(&server, "llama").await;
    assert!(d["cluster"]["plan"]["desired"].as_i64().unwrap_or(0) >= 6, "{d}");
}

/// A static NodePool keeps exactly `spec.replicas` nodes and provisions nothing for Pending
/// pods, so prescale sizes it for every planned replica that has no node, and keeps the
/// nodes as they join and as the replicas land on them (Karpenter's static scale-down
/// would remove them, empty ones first and then random ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_node_pool_grows_for_the_plan_and_keeps_its_nodes_as_replicas_land() {
    let api = FakeApi::start().await;
    let server = static_pool_planned(&api).await;
    // The plan (≥ 6) needs desired − 3 placed − 1 free replicas more, 2 per new node.
    let (desired, grown) = eventually(30, "the static pool grown for the plan", || {
        let (api, s) = (api.clone(), &server);
        async move {
            let desired = debug_of(s, "llama").await["cluster"]["plan"]["desired"].as_i64()?;
            let want = 2 + (desired - 4 + 1) / 2;
            (desired >= 6 && pool_replicas(&api) == Some(want)).then_some((desired, want))
        }
    })
    .await;
    let pool = api.get(NODEPOOLS, "", "gpu-mig").unwrap();
    assert_eq!(pool["metadata"]["annotations"]["prescale.io/static-base-replicas"], "2", "{pool}");
    assert_eq!(pool["metadata"]["annotations"]["prescale.io/static-resized-by"], "prescale.prescale-leader", "{pool}");
    assert!(placeholders(&api).is_empty(), "a resized static pool takes no placeholders");
    // Resized through the scale subresource (what rbac.karpenter.resizeNodePools grants),
    // never by a patch of the NodePool's spec.
    let writes = api.writes();
    assert!(writes.iter().any(|w| w == SCALE_PATCH), "{writes:?}");

    // Karpenter launches the nodes: they join with their room free. The pool keeps them.
    for i in 0..(grown - 2) {
        api.put(NODES, h100_node(&format!("h100-static-{i}"), "2026-01-02T00:00:00Z", "2026-01-02T00:02:00Z", 2));
    }
    let free = 1 + 2 * (grown - 2);
    eventually(20, "the joined nodes' room seen", || {
        let s = &server;
        async move {
            (debug_of(s, "llama").await["cluster"]["capacity"]["fit"]["fitsNow"].as_i64() == Some(free)).then_some(())
        }
    })
    .await;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = pool_replicas(&api).unwrap_or(0);
        assert!(r >= grown, "the pool shrank to {r} as its new nodes joined: {:?}", api.writes());
    }
    // KEDA scales the Deployment and the replicas land on the new nodes: still kept.
    let now = now_rfc3339();
    for i in 0..(desired - 3) {
        let node = if i == 0 { "h100-old".to_string() } else { format!("h100-static-{}", (i - 1) / 2) };
        api.put(PODS, vllm_pod(&format!("vllm-new-{i}"), "vllm", &node, &now, None, "nvidia.com/mig-3g.40gb"));
    }
    eventually(20, "the landed replicas seen", || {
        let s = &server;
        async move {
            (debug_of(s, "llama").await["cluster"]["capacity"]["currentReplicas"].as_i64() == Some(desired))
                .then_some(())
        }
    })
    .await;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = pool_replicas(&api).unwrap_or(0);
        assert!(r >= grown, "the pool shrank to {r} under its replicas: {:?}", api.writes());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pool_grown_for_a_scaled_object_nobody_plans_goes_back_by_its_empty_nodes() {
    let api = FakeApi::start().await;
    seed(&api);
    // prescale grew the pool from 2 to 4 for a ScaledObject since deleted (an earlier leader's
    // work): two more nodes joined, one still empty, one running someone else's pod.
    api.put(
        NODEPOOLS,
        json!({"metadata": {"name": "gpu-mig", "annotations": {"prescale.io/static-base-replicas": "2",
                "prescale.io/static-resized-by": "prescale.prescale-leader"}},
            "spec": {"replicas": 4,
            "template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"},
                "requirements": [{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["p5"]}]}},
            "limits": {"nodes": "8"}}}),
    );
    for i in 0..2 {
        api.put(NODES, h100_node(&format!("h100-static-{i}"), "2026-01-02T00:00:00Z", "2026-01-02T00:02:00Z", 2));
    }
    // A pool another installation of prescale grew: not this one's to give back.
    api.put(
        NODEPOOLS,
        json!({"metadata": {"name": "gpu-staging", "annotations": {"prescale.io/static-base-replicas": "1",
                "prescale.io/static-resized-by": "staging.prescale-leader"}},
            "spec": {"replicas": 3, "template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}}}}}),
    );
    api.put(
        PODS,
        embed_pod("embed-2", "h100-static-1", "2026-01-02T00:03:00Z", "2026-01-02T00:04:00Z", "nvidia.com/mig-3g.40gb"),
    );
    let kc = kubeconfig(&api.url());
    let mut env = env_for(&kc);
    env.push(("PRESCALE_STATIC_POOL_STABILIZATION_SECONDS", "2"));
    let server = Server::start_with_env(&[], &env);
    eventually(20, "the Lease held", || {
        let s = &server;
        async move { (cluster_status(s).await["leader"] == true).then_some(()) }
    })
    .await;
    // No ScaledObject is planned. Once the leader has led for four Lease durations (12 s
    // here), the pool gives back its empty node, and only that one: the other runs a pod.
    assert_eq!(pool_replicas(&api), Some(4), "shrunk before the leader had led for the hold");
    eventually(40, "the orphaned pool shrunk by its empty node", || {
        let api = api.clone();
        async move { (pool_replicas(&api) == Some(3)).then_some(()) }
    })
    .await;
    let pool = api.get(NODEPOOLS, "", "gpu-mig").unwrap();
    assert_eq!(
        pool["metadata"]["annotations"]["prescale.io/static-base-replicas"], "2",
        "still above its base: {pool}"
    );
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(pool_replicas(&api), Some(3), "a node with a pod on it is never given back: {:?}", api.writes());
    }
    // The pod goes: the pool returns to its base and forgets it.
    api.remove(PODS, "other", "embed-2");
    eventually(20, "the orphaned pool back at its base", || {
        let api = api.clone();
        async move {
            let p = api.get(NODEPOOLS, "", "gpu-mig")?;
            (p.pointer("/spec/replicas")?.as_i64() == Some(2)
                && p.pointer("/metadata/annotations/prescale.io~1static-base-replicas").is_none()
                && p.pointer("/metadata/annotations/prescale.io~1static-resized-by").is_none())
            .then_some(())
        }
    })
    .await;
    let staging = api.get(NODEPOOLS, "", "gpu-staging").unwrap();
    assert_eq!(staging["spec"]["replicas"], 3, "{staging}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_one_lease_one_writer() {
    let api = FakeApi::start().await;
    seed(&api);
    let kc = kubeconfig(&api.url());
    let a = Server::start_with_env(&[], &env_for(&kc));
    let b = Server::start_with_env(&[], &env_for(&kc));
    let holder = eventually(20, "a Lease holder", || {
        let api = api.clone();
        async move {
            api.get(LEASES, "prescale", "prescale-leader")?
                .pointer("/spec/holderIdentity")
                .and_then(|v| v.as_str())
                .map(String::from)
        }
    })
    .await;
    // Both have done a round since both started (the other sees the holder).
    eventually(10, "both see the Lease", || {
        let (a, b) = (&a, &b);
        async move {
            let (sa, sb) = (cluster_status(a).await, cluster_status(b).await);
            (sa["leaseHolder"].is_string() && sb["leaseHolder"].is_string()).then_some(())
        }
    })
    .await;
    // Over several renewals exactly one of them is the leader, and it is the holder.
    for _ in 0..5 {
        let (sa, sb) = (cluster_status(&a).await, cluster_status(&b).await);
        let leaders = [&sa, &sb].iter().filter(|s| s["leader"] == true).count();
        assert_eq!(
            leaders,
            1,
            "a: {sa}\nb: {sb}\nlogs a: {}\nlogs b: {}\nwrites: {:?}",
            a.log.lock().unwrap().join("\n"),
            b.log.lock().unwrap().join("\n"),
            api.writes()
        );
        let l = if sa["leader"] == true { &sa } else { &sb };
        let f = if sa["leader"] == true { &sb } else { &sa };
        assert_eq!(l["identity"], holder.as_str());
        assert_eq!(l["features"]["writer"]["on"], true);
        assert_eq!(f["features"]["writer"]["on"], false);
        assert!(f["features"]["writer"]["reason"].as_str().unwrap_or("").contains("not the leader"), "{f}");
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    // The leader goes away: the other takes over once the Lease expires.
    let (mut leader, follower) = if cluster_status(&a).await["leader"] == true { (a, b) } else { (b, a) };
    leader.terminate();
    eventually(20, "the follower takes over", || {
        let f = &follower;
        async move { (cluster_status(f).await["leader"] == true).then_some(()) }
    })
    .await;
    let lease = api.get(LEASES, "prescale", "prescale-leader").unwrap();
    assert_eq!(lease["spec"]["leaseTransitions"], 1, "{lease}");
    assert!(api.writes().iter().any(|w| w.starts_with("PUT /apis/coordination.k8s.io/v1/namespaces/prescale/leases/")));
}

/// The EndpointSlice the EndpointSlice controller keeps for one prescale pod of the
/// Service `prescale` (one slice each: the two test servers listen on different ports).
fn prescale_slice(pod: &str, http_url: &str) -> Value {
    let port: u16 = http_url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port in the HTTP URL");
    json!({
        "metadata": {"name": format!("prescale-{pod}"), "namespace": "prescale",
            "labels": {"kubernetes.io/service-name": "prescale",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": 1, "protocol": "TCP"}, {"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false},
            "targetRef": {"kind": "Pod", "namespace": "prescale", "name": pod}}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_holder_writes_headroom_for_a_scaled_object_keda_asks_another_replica_about() {
    let api = FakeApi::start().await;
    seed(&api);
    let prom = fake_prometheus(Arc::new(Mutex::new(6.0))).await;
    let kc = kubeconfig(&api.url());
    let mut env = env_for(&kc);
    env.push(("PRESCALE_PEERS_SERVICE", "prescale"));
    // A placeholder an earlier leader left for a ScaledObject since deleted, one another
    // installation of prescale (another Lease) wrote, and a pod that carries the label but is
    // not prescale's.
    let left = |name: &str, managed: Option<&str>, writer: &str| {
        let mut labels = json!({"prescale.io/headroom-for": "llm.gone", "prescale.io/writer": writer});
        if let Some(m) = managed {
            labels["app.kubernetes.io/managed-by"] = json!(m);
        }
        json!({"metadata": {"name": name, "namespace": "llm", "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": labels}, "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]},
            "status": {"phase": "Pending"}})
    };
    api.put(PODS, left("prescale-headroom-llm-gone-0", Some("prescale"), "prescale.prescale-leader"));
    api.put(PODS, left("another-installs", Some("prescale"), "staging.prescale-leader"));
    api.put(PODS, left("someone-elses", Some("helm"), "prescale.prescale-leader"));
    let a = Server::start_with_env(&[], &env);
    let b = Server::start_with_env(&[], &env);
    api.put(ENDPOINTSLICES, prescale_slice("prescale-a", &a.http));
    api.put(ENDPOINTSLICES, prescale_slice("prescale-b", &b.http));
    eventually(20, "a leader", || {
        let (a, b) = (&a, &b);
        async move { (cluster_status(a).await["leader"] == true || cluster_status(b).await["leader"] == true).then_some(()) }
    })
    .await;
    let (leader, mut follower) = if cluster_status(&a).await["leader"] == true { (a, b) } else { (b, a) };
    // KEDA's one pooled connection reaches the replica that does not hold the Lease.
    let c = follower.client().await;
    let llama = sref("llm", "llama", &md(&prom, &[("karpenterMode", "headroom")]));
    eventually(20, "the follower answers", || {
        let (mut c, r) = (c.clone(), llama.clone());
        async move { metric(&mut c, &r).await.ok() }
    })
    .await;
    let (_, report) = follower.get("/peers/plans").await;
    let report: Value = serde_json::from_str(&report).expect("a peer report");
    assert_eq!(report["plans"][0]["name"], "llama", "{report}");
    assert_eq!(report["plans"][0]["karpenterMode"], "headroom", "{report}");
    // The leader is never asked, yet follows llama's plan: placeholders for what does not
    // fit (3 running + 1 free slot), written by the leader alone.
    let pods = eventually(30, "placeholders written by the Lease holder", || {
        let (api, f) = (api.clone(), &follower);
        async move {
            let desired = debug_of(f, "llama").await["cluster"]["plan"]["desired"].as_u64()? as usize;
            let p = placeholders(&api);
            (desired > 4 && p.len() == desired - 4).then_some(p)
        }
    })
    .await;
    assert_eq!(pods[0]["spec"]["priorityClassName"], "prescale-headroom");
    assert_eq!(pods[0]["metadata"]["labels"]["prescale.io/writer"], "prescale.prescale-leader", "{}", pods[0]);
    // The leftover goes once the leader has led for four Lease durations; the other stays.
    eventually(30, "the orphaned placeholder removed", || {
        let api = api.clone();
        async move { api.get(PODS, "llm", "prescale-headroom-llm-gone-0").is_none().then_some(()) }
    })
    .await;
    assert!(api.get(PODS, "llm", "someone-elses").is_some());
    assert!(api.get(PODS, "llm", "another-installs").is_some());
    let st = cluster_status(&leader).await;
    assert_eq!(st["peers"]["service"], "prescale/prescale", "{st}");
    assert_eq!(st["peers"]["adopted"], json!(["llm/llama"]), "{st}");
    assert_eq!(st["peers"]["peers"].as_array().map(Vec::len), Some(2), "{st}");
    let (_, m) = leader.get("/metrics").await;
    assert!(m.lines().any(|l| l == "prescale_adopted_scaled_objects 1"), "{m}");
    assert!(m.lines().any(|l| l == "prescale_peers{result=\"ok\"} 2"), "{m}");
    let (_, mine) = leader.get("/peers/plans").await;
    assert!(serde_json::from_str::<Value>(&mine).unwrap()["plans"].as_array().is_some_and(Vec::is_empty), "{mine}");
    assert_eq!(debug_of(&leader, "llama").await, json!({}), "the leader's engine does not plan llama itself");
    assert_eq!(cluster_status(&follower).await["leader"], false);
    // The follower goes (its ScaledObject is now asked of nobody): once no replica has
    // planned it for four Lease durations, the leader forgets it and removes what it wrote.
    follower.terminate();
    eventually(40, "placeholders removed once no replica plans the ScaledObject", || {
        let api = api.clone();
        async move { placeholders(&api).is_empty().then_some(()) }
    })
    .await;
    let st = cluster_status(&leader).await;
    assert_eq!(st["peers"]["adopted"], json!([]), "{st}");
    assert!(st["peers"]["peers"].as_array().is_some_and(|p| p.iter().any(|x| x["error"].is_string())), "{st}");
    // Alertable: a replica whose plans cannot be read.
    let (_, m) = leader.get("/metrics").await;
    assert!(m.lines().any(|l| l == "prescale_peers{result=\"error\"} 1"), "{m}");
    assert!(m.lines().any(|l| l == "prescale_adopted_scaled_objects 0"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_planned_fleet_follows_the_live_spec_replicas_not_a_rollouts_surge_pods() {
    let api = FakeApi::start().await;
    seed(&api);
    // A rolling update of the 3-replica Deployment: a new pod is starting beside the three
    // Ready ones (maxSurge 1). It replaces one of them; no capacity is on its way.
    api.put(PODS, vllm_pod("vllm-4", "vllm", "h100-old", "2026-01-02T00:00:00Z", None, "nvidia.com/mig-3g.40gb"));
    let prom = fake_prometheus(Arc::new(Mutex::new(2.0))).await;
    let kc = kubeconfig(&api.url());
    let server = Server::start_with_env(&[], &env_for(&kc));
    let c = server.client().await;
    let r = sref("llm", "llama", &md(&prom, &[("karpenterMode", "off")]));
    let fleet_is = |ready: u64, warming: u64| {
        let (s, c, r) = (&server, c.clone(), r.clone());
        async move {
            // Each GetMetrics runs a planning step; /debug shows the fleet it started from.
            metric(&mut c.clone(), &r).await.ok()?;
            let d = debug_of(s, "llama").await;
            let f = d["snapshot"]["planner"]["fleet"].clone();
            (f["from"] == "pods up to spec.replicas" && f["ready"] == ready && f["warming"] == warming).then_some(f)
        }
    };
    eventually(30, "fleet of 3 Ready, the surge pod not counted", || fleet_is(3, 0)).await;
    // The HPA scales the Deployment to 5: two replicas are coming, counted from the
    // Deployment watch before any pod for them exists.
    let mut d = deployment("vllm", "nvidia.com/mig-3g.40gb");
    d["spec"]["replicas"] = json!(5);
    api.put(DEPLOYMENTS, d);
    eventually(30, "fleet of 3 Ready + 2 warming after spec.replicas = 5", || fleet_is(3, 2)).await;
    // ...and scaled back in to 2: the pods still terminating serve nothing to plan on.
    let mut d = deployment("vllm", "nvidia.com/mig-3g.40gb");
    d["spec"]["replicas"] = json!(2);
    api.put(DEPLOYMENTS, d);
    eventually(30, "fleet of 2 after spec.replicas = 2", || fleet_is(2, 0)).await;
    let d = debug_of(&server, "llama").await;
    assert_eq!(d["cluster"]["capacity"]["specReplicas"], 2, "{d}");
    assert_eq!(d["cluster"]["capacity"]["currentReplicas"], 4, "pods still there: {d}");
    let st = cluster_status(&server).await;
    assert_eq!(st["watches"]["deployments"]["synced"], true, "{st}");
    assert_eq!(st["watches"]["statefulsets"]["synced"], true, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_going_away_degrades_to_off_without_failing_keda() {
    let api = FakeApi::start().await;
    seed(&api);
    let proxy = Proxy::start(&format!("127.0.0.1:{}", api.port)).await;
    let kc = kubeconfig(&format!("http://127.0.0.1:{}", proxy.port));
    let prom = fake_prometheus(Arc::new(Mutex::new(2.0))).await;
    let server = Server::start_with_env(&[], &env_for(&kc));
    let mut c = server.client().await;
    let r = sref("llm", "llama", &md(&prom, &[("warmupSeconds", "auto"), ("mode", "reactive")]));
    eventually(20, "first answer", || {
        let (mut c, r) = (c.clone(), r.clone());
        async move { metric(&mut c, &r).await.ok() }
    })
    .await;
    eventually(20, "capacity on", || {
        let s = &server;
        async move { (cluster_status(s).await["features"]["capacity"]["on"] == true).then_some(()) }
    })
    .await;
    eventually(20, "warm-up measured", || {
        let s = &server;
        async move { (debug_of(s, "llama").await["cluster"]["warmup"]["pod"]["samples"] == 3).then_some(()) }
    })
    .await;
    proxy.cut();
    let st = eventually(30, "features off after the API went away", || {
        let s = &server;
        async move {
            let st = cluster_status(s).await;
            (st["features"]["capacity"]["on"] == false && st["features"]["warmup"]["on"] == false).then_some(st)
        }
    })
    .await;
    assert!(st["features"]["capacity"]["reason"].as_str().unwrap_or("").contains("watch failing"), "{st}");
    // KEDA's calls keep working, measured warm-up is kept.
    for _ in 0..3 {
        assert_eq!(metric(&mut c, &r).await.expect("GetMetrics still answers"), 2);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let d = debug_of(&server, "llama").await;
    assert_eq!(d["cluster"]["warmup"]["pod"]["samples"], 3, "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_kubernetes_every_feature_says_off_at_start_and_in_debug() {
    let prom = fake_prometheus(Arc::new(Mutex::new(1.0))).await;
    let missing = std::env::temp_dir().join(format!("{}.kubeconfig", unique("missing")));
    let server = Server::start_with_env(&[], &[("KUBECONFIG", missing.to_str().unwrap())]);
    let c = server.client().await;
    let r = sref(
        "llm",
        "llama",
        &md(&prom, &[("warmupSeconds", "auto"), ("karpenterMode", "headroom"), ("mode", "shadow")]),
    );
    let v = eventually(20, "answer", || {
        let (mut c, r) = (c.clone(), r.clone());
        async move { metric(&mut c, &r).await.ok() }
    })
    .await;
    assert_eq!(v, 1);
    let st = cluster_status(&server).await;
    for f in ["warmup", "capacity", "karpenter", "writer"] {
        assert_eq!(st["features"][f]["on"], false, "{st}");
        assert!(st["features"][f]["reason"].as_str().unwrap_or("").contains("no Kubernetes configuration"), "{st}");
    }
    let logs = server.log.lock().unwrap().join("\n");
    assert!(logs.contains("cluster features off"), "{logs}");
    let d = debug_of(&server, "llama").await;
    assert_eq!(d["cluster"]["warmup"]["auto"]["seconds"], Value::Null, "{d}");
    assert_eq!(d["snapshot"]["planner"]["warmupPlannedSeconds"], 180.0, "fallback: {d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcgm_counts_only_the_scale_targets_own_pods() {
    let api = FakeApi::start().await;
    seed(&api);
    // Same namespace, same name prefix, another Deployment: its GPU must not count.
    let mut canary = vllm_pod(
        "vllm-canary-1",
        "vllm-canary",
        "h100-old",
        "2025-12-02T00:00:00Z",
        Some("2025-12-02T00:01:00Z"),
        "nvidia.com/mig-3g.40gb",
    );
    canary["metadata"]["labels"]["app"] = json!("vllm-canary");
    api.put(PODS, canary);
    // The target's pods vllm-1..3 at 60 %; the canary and an embedder at 100 %.
    let rows = [("vllm-1", 60.0), ("vllm-2", 60.0), ("vllm-3", 60.0), ("vllm-canary-1", 100.0), ("embedder-0", 100.0)];
    let exporter = crate::harness::Exporter::start(0, &dcgm_util_page("llm", &rows)).await;
    let ep = format!("127.0.0.1:{}", exporter.port);
    let kc = kubeconfig(&api.url());
    let server = Server::start_with_env(&[], &env_for(&kc));
    let c = server.client().await;
    let md = [
        ("dcgmEndpoints", ep.as_str()),
        ("dcgmUtilizationTarget", "50"),
        ("sampleSeconds", "1"),
        ("staleAfterSeconds", "6"),
        ("mode", "reactive"),
        ("maxReplicas", "20"),
    ];
    let llama = sref("llm", "llama", &md);
    // Namespace-wide the rows say 5 pods × 76 % / 50 % = 7.6 → 8 replicas; the target's own
    // three pods say 3 × 60 % / 50 % = 3.6 → 4.
    eventually(30, "DCGM narrowed to the target's pods", || {
        let (mut c, r) = (c.clone(), llama.clone());
        async move { (metric(&mut c, &r).await.ok()? == 4).then_some(()) }
    })
    .await;
    let d = debug_of(&server, "llama").await;
    let detail = &d["snapshot"]["signals"][0]["detail"];
    assert_eq!(detail["target_pods"], 3.0, "{d}");
    assert_eq!(detail["pods"], 3.0, "{d}");
    assert_eq!(detail["mean_util"], 60.0, "{d}");

    // A new Ready replica with no GPU row, and the old ones gone from the exporter: the
    // signal keeps its last value until staleAfterSeconds, then KEDA gets UNAVAILABLE —
    // never a 0 because the exporter lost track of the target's GPUs.
    api.put(
        PODS,
        vllm_pod(
            "vllm-4",
            "vllm",
            "h100-old",
            "2026-01-02T00:00:00Z",
            Some("2026-01-02T00:04:00Z"),
            "nvidia.com/mig-3g.40gb",
        ),
    );
    exporter.set(&dcgm_util_page("llm", &[("vllm-canary-1", 100.0), ("embedder-0", 100.0)]));
    let held_since = std::time::Instant::now();
    let err = eventually(20, "UNAVAILABLE once the narrowed reading is stale", || {
        let (mut c, r) = (c.clone(), llama.clone());
        async move {
            match metric(&mut c, &r).await {
                Ok(v) => {
                    assert_eq!(v, 4, "held at the last narrowed value while fresh");
                    None
                }
                Err(e) => Some(e),
            }
        }
    })
    .await;
    assert!(held_since.elapsed() >= Duration::from_secs(3), "held for a while before going stale");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("none of the 4 Ready pods of the scale target"), "{}", err.message());

    // The replicas come back on the exporter: the answer follows again (4 pods × 60 %).
    exporter.set(&dcgm_util_page(
        "llm",
        &[("vllm-1", 60.0), ("vllm-2", 60.0), ("vllm-3", 60.0), ("vllm-4", 60.0), ("embedder-0", 100.0)],
    ));
    eventually(20, "answers again once the target's GPUs are back", || {
        let (mut c, r) = (c.clone(), llama.clone());
        async move { (metric(&mut c, &r).await.ok()? == 5).then_some(()) }
    })
    .await;
}
