//! Free GPU / MIG capacity (pure): allocatable − requests of non-terminal pods, per node
//! and per Karpenter NodePool; how many more replicas of a pod shape fit; MIG-profile
//! warnings. The accounting follows kubernetes-interfaces.md §3.6:
//!
//! ```text
//! free[r] = allocatable[r] − Σ_{pods on the node, phase ∉ {Succeeded, Failed}} effReq(pod, r)
//! effReq  = max(Σ app + Σ sidecar(restartable init) requests, max plain-init requests) + overhead
//! ```
//!
//! Only `nvidia.com/*` resources are accounted (`nvidia.com/gpu`, `nvidia.com/mig-<profile>`,
//! time-sliced `nvidia.com/gpu.shared`): GPUs are the binding constraint of an inference
//! replica; CPU and memory are left to the scheduler.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Node, NodeSelectorRequirement, Pod, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Serialize;

/// Resource name → whole units (GPU-like resources are integers).
pub type Resources = BTreeMap<String, i64>;

pub const NODEPOOL_LABEL: &str = "karpenter.sh/nodepool";
/// Label on prescale's placeholder pods; their capacity counts as free for real replicas.
pub const HEADROOM_LABEL: &str = "prescale.io/headroom-for";

/// True for resources this module accounts.
pub fn is_gpu_resource(name: &str) -> bool {
    name.starts_with("nvidia.com/")
}

/// The MIG profile of a mixed-strategy resource name (`nvidia.com/mig-1g.10gb` → `1g.10gb`).
pub fn mig_profile(resource: &str) -> Option<&str> {
    resource.strip_prefix("nvidia.com/mig-")
}

/// A Kubernetes quantity as a float in base units (`500m` → 0.5, `2Ki` → 2048, `1e3` → 1000,
/// `2E` → 2·10¹⁸): apimachinery's grammar, a signed decimal and one SI, binary or exponent
/// suffix. `None` for anything else, and for values out of `f64`'s range.
pub fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let idx = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (num, suffix) = q.split_at(idx);
    // A decimal exponent (`1e3`, `5E-1`); `E` alone is exa and `Ei` exbi.
    let exponent = suffix
        .strip_prefix(['e', 'E'])
        .is_some_and(|e| e.starts_with(|c: char| c.is_ascii_digit() || c == '+' || c == '-'));
    if exponent {
        return q.parse::<f64>().ok().filter(|x| x.is_finite());
    }
    let x: f64 = num.parse().ok()?;
    let mul = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => return None,
    };
    Some(x * mul).filter(|v| v.is_finite())
}

/// Whole units of an extended resource (rounded up: `1500m` of a GPU is 2).
fn units(q: &Quantity) -> i64 {
    parse_quantity(&q.0).map(|x| x.ceil().max(0.0) as i64).unwrap_or(0)
}

fn gpu_resources(list: Option<&BTreeMap<String, Quantity>>) -> Resources {
    list.map(|m| m.iter().filter(|(k, _)| is_gpu_resource(k)).map(|(k, v)| (k.clone(), units(v))).collect())
        .unwrap_or_default()
}

fn container_requests(c: &k8s_openapi::api::core::v1::Container) -> Resources {
    let res = c.resources.as_ref();
    // For extended resources a request equals its limit; the request defaults to the limit.
    let mut r = gpu_resources(res.and_then(|r| r.limits.as_ref()));
    for (k, v) in gpu_resources(res.and_then(|r| r.requests.as_ref())) {
        r.insert(k, v);
    }
    r
}

fn add(into: &mut Resources, from: &Resources) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_default();
        *e = e.saturating_add(*v);
    }
}

/// The effective GPU requests of a pod spec (init containers, sidecars and overhead included).
pub fn effective_requests(spec: &PodSpec) -> Resources {
    let mut app = Resources::new();
    for c in &spec.containers {
        add(&mut app, &container_requests(c));
    }
    let mut init_max = Resources::new();
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c);
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut app, &r); // sidecar: runs alongside the app containers
        } else {
            for (k, v) in r {
                let e = init_max.entry(k).or_default();
                *e = (*e).max(v);
            }
        }
    }
    for (k, v) in init_max {
        let e = app.entry(k).or_default();
        *e = (*e).max(v);
    }
    add(&mut app, &gpu_resources(spec.overhead.as_ref()));
    app.retain(|_, v| *v > 0);
    app
}

/// True when the pod still holds its node's resources.
pub fn is_non_terminal(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded") | Some("Failed"))
}

/// Free capacity of one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCapacity {
    pub name: String,
    pub nodepool: Option<String>,
    pub allocatable: Resources,
    /// Requested by pods other than prescale's placeholders.
    pub used: Resources,
    /// Requested by prescale's placeholders (free for real replicas: they preempt them).
    pub placeholders: Resources,
    /// allocatable − used − placeholders.
    pub free: Resources,
    /// False when the node takes no new pods (unschedulable, being disrupted by Karpenter,
    /// MIG reconfiguration not at `success`).
    pub schedulable: bool,
}

/// Per-node free capacity of every GPU node (nodes without `nvidia.com/*` allocatable are skipped).
pub fn free_per_node(nodes: &[Node], pods: &[Pod]) -> Vec<NodeCapacity> {
    let mut by_node: BTreeMap<&str, (Resources, Resources)> = BTreeMap::new();
    for p in pods.iter().filter(|p| is_non_terminal(p)) {
        let Some(spec) = p.spec.as_ref() else { continue };
        let Some(node) = spec.node_name.as_deref() else { continue };
        let req = effective_requests(spec);
        if req.is_empty() {
            continue;
        }
        let placeholder = p.metadata.labels.as_ref().is_some_and(|l| l.contains_key(HEADROOM_LABEL));
        let e = by_node.entry(node).or_default();
        add(if placeholder { &mut e.1 } else { &mut e.0 }, &req);
    }
    let mut out = Vec::new();
    for n in nodes {
        let name = n.metadata.name.clone().unwrap_or_default();
        let allocatable = gpu_resources(n.status.as_ref().and_then(|s| s.allocatable.as_ref()));
        if allocatable.is_empty() {
            continue;
        }
        let (used, placeholders) = by_node.get(name.as_str()).cloned().unwrap_or_default();
        let free = allocatable
            .iter()
            .map(|(k, a)| {
                let held = used.get(k).copied().unwrap_or(0).saturating_add(placeholders.get(k).copied().unwrap_or(0));
                (k.clone(), a.saturating_sub(held))
            })
            .collect();
        out.push(NodeCapacity {
            nodepool: labels(n).get(NODEPOOL_LABEL).cloned(),
            schedulable: node_schedulable(n),
            name,
            allocatable,
            used,
            placeholders,
            free,
        });
    }
    out
}

fn labels(n: &Node) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

fn node_schedulable(n: &Node) -> bool {
    if n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
        return false;
    }
    if n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "karpenter.sh/disrupted"))
    {
        return false;
    }
    let l = labels(n);
    !matches!(l.get("nvidia.com/mig.config.state").map(String::as_str), Some(s) if s != "success")
}

/// Free capacity summed per NodePool (nodes without the Karpenter label under `""`).
pub fn free_per_pool(nodes: &[NodeCapacity]) -> BTreeMap<String, Resources> {
    let mut out: BTreeMap<String, Resources> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.schedulable) {
        let e = out.entry(n.nodepool.clone().unwrap_or_default()).or_default();
        for (k, v) in &n.free {
            let sum = e.entry(k.clone()).or_default();
            *sum = sum.saturating_add((*v).max(0));
        }
    }
    out
}

/// A NodePool's GPU nodes: those whose GPU allocatable is visible, and how many of them
/// hold no GPU pod and no placeholder (what a static pool's scale-down removes first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolNodes {
    pub gpu_nodes: u32,
    pub empty: u32,
}

/// [`PoolNodes`] per NodePool (nodes without the Karpenter label under `""`).
pub fn nodes_per_pool(nodes: &[NodeCapacity]) -> BTreeMap<String, PoolNodes> {
    let mut out: BTreeMap<String, PoolNodes> = BTreeMap::new();
    for n in nodes {
        let e = out.entry(n.nodepool.clone().unwrap_or_default()).or_default();
        e.gpu_nodes += 1;
        if n.used.values().chain(n.placeholders.values()).all(|v| *v <= 0) {
            e.empty += 1;
        }
    }
    out
}

/// Where a replica may land: what the pod template says about nodes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    pub node_selector: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

impl Placement {
    pub fn from_spec(spec: &PodSpec) -> Self {
        Self {
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            affinity: spec.affinity.clone(),
            tolerations: spec.tolerations.clone().unwrap_or_default(),
        }
    }

    /// Node selector, required node affinity and taints/tolerations (not pod (anti-)affinity).
    pub fn admits(&self, node: &Node) -> bool {
        let l = labels(node);
        self.matches_labels(&l) && self.tolerates(node)
    }

    pub fn matches_labels(&self, l: &BTreeMap<String, String>) -> bool {
        if !self.node_selector.iter().all(|(k, v)| l.get(k) == Some(v)) {
            return false;
        }
        let terms = self
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref())
            .map(|r| r.node_selector_terms.as_slice())
            .unwrap_or_default();
        terms.is_empty()
            || terms.iter().any(|t| t.match_expressions.iter().flatten().all(|e| requirement_matches(e, l)))
    }

    fn tolerates(&self, node: &Node) -> bool {
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        taints.iter().filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute").all(|t| {
            self.tolerations.iter().any(|tol| {
                let effect_ok = tol.effect.as_deref().is_none_or(|e| e.is_empty() || e == t.effect);
                let key_ok = match tol.key.as_deref() {
                    None | Some("") => tol.operator.as_deref() == Some("Exists"),
                    Some(k) => k == t.key,
                };
                let value_ok = match tol.operator.as_deref() {
                    Some("Exists") => true,
                    _ => tol.value.as_deref().unwrap_or("") == t.value.as_deref().unwrap_or(""),
                };
                effect_ok && key_ok && value_ok
            })
        })
    }
}

/// One `matchExpressions` entry against node labels.
pub fn requirement_matches(e: &NodeSelectorRequirement, l: &BTreeMap<String, String>) -> bool {
    let v = l.get(&e.key);
    let values = e.values.clone().unwrap_or_default();
    let num = |s: &str| s.parse::<i64>().ok();
    match e.operator.as_str() {
        "In" => v.is_some_and(|v| values.contains(v)),
        "NotIn" => v.is_none_or(|v| !values.contains(v)),
        "Exists" => v.is_some(),
        "DoesNotExist" => v.is_none(),
        "Gt" => matches!((v.and_then(|v| num(v)), values.first().and_then(|x| num(x))), (Some(a), Some(b)) if a > b),
        "Lt" => matches!((v.and_then(|v| num(v)), values.first().and_then(|x| num(x))), (Some(a), Some(b)) if a < b),
        _ => false,
    }
}

/// How many replicas of a shape fit, and where.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fit {
    /// More replicas that fit now in capacity nobody holds.
    pub fits_now: u32,
    /// … plus the capacity prescale's placeholders hold (real replicas preempt them).
    pub fits_with_placeholders: u32,
    /// Per eligible node: replicas that fit in its free capacity.
    pub per_node: BTreeMap<String, u32>,
    pub eligible_nodes: usize,
    /// Replicas one empty eligible node takes (the largest), for NodePool resizing.
    pub per_empty_node: Option<u32>,
}

fn fit_in(avail: &Resources, req: &Resources) -> u32 {
    req.iter()
        .filter(|(_, r)| **r > 0)
        .map(|(k, r)| u32::try_from(avail.get(k).copied().unwrap_or(0).max(0) / r).unwrap_or(u32::MAX))
        .min()
        .unwrap_or(0)
}

/// Replicas of `req` (GPU requests of one replica) that fit on the nodes `placement` admits.
/// A shape without GPU requests is not bounded here (`fits_now` = `u32::MAX` is avoided:
/// it reports 0 eligible nodes and the caller treats the fit as unknown).
pub fn fit(req: &Resources, placement: &Placement, nodes: &[Node], caps: &[NodeCapacity]) -> Fit {
    let mut out = Fit::default();
    if req.values().all(|v| *v <= 0) {
        return out;
    }
    for cap in caps.iter().filter(|c| c.schedulable) {
        let Some(node) = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(cap.name.as_str())) else {
            continue;
        };
        if !placement.admits(node) {
            continue;
        }
        out.eligible_nodes += 1;
        let now = fit_in(&cap.free, req);
        let mut with: Resources = cap.free.clone();
        add(&mut with, &cap.placeholders);
        let with_ph = fit_in(&with, req);
        let empty = fit_in(&cap.allocatable, req);
        out.fits_now = out.fits_now.saturating_add(now);
        out.fits_with_placeholders = out.fits_with_placeholders.saturating_add(with_ph);
        out.per_empty_node = Some(out.per_empty_node.unwrap_or(0).max(empty));
        out.per_node.insert(cap.name.clone(), now);
    }
    out
}

/// Labels that describe a node's GPU geometry, for warnings.
fn gpu_labels(n: &Node) -> Vec<String> {
    let mut out: Vec<String> = labels(n)
        .into_iter()
        .filter(|(k, _)| {
            k == "nvidia.com/gpu.product"
                || k == "nvidia.com/mig.strategy"
                || k == "nvidia.com/mig.config"
                || k == "nvidia.com/mig.config.state"
                || k == "nvidia.com/gpu.sharing-strategy"
                || k == NODEPOOL_LABEL
                || (k.starts_with("nvidia.com/mig-") && k.ends_with(".count"))
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let offers: Vec<String> = gpu_resources(n.status.as_ref().and_then(|s| s.allocatable.as_ref()))
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    if !offers.is_empty() {
        out.push(format!("allocatable {{{}}}", offers.join(", ")));
    }
    out
}

fn describe(nodes: &[&Node]) -> String {
    if nodes.is_empty() {
        return "no GPU nodes".to_string();
    }
    nodes
        .iter()
        .map(|n| format!("{} [{}]", n.metadata.name.as_deref().unwrap_or("?"), gpu_labels(n).join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Warnings for MIG profiles the target requests that no (admissible) node offers.
pub fn mig_warnings(req: &Resources, placement: &Placement, nodes: &[Node]) -> Vec<String> {
    let gpu_nodes: Vec<&Node> = nodes
        .iter()
        .filter(|n| {
            !gpu_resources(n.status.as_ref().and_then(|s| s.allocatable.as_ref())).is_empty() || is_gpu_labelled(n)
        })
        .collect();
    let mut out = Vec::new();
    for (r, _) in req.iter().filter(|(_, v)| **v > 0) {
        let Some(profile) = mig_profile(r) else { continue };
        let offers = |n: &&Node| {
            n.status.as_ref().and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get(r)).is_some_and(|q| units(q) > 0)
        };
        let offering: Vec<&Node> = gpu_nodes.iter().copied().filter(offers).collect();
        let admitted: Vec<&Node> = gpu_nodes.iter().copied().filter(|n| placement.admits(n)).collect();
        let single =
            gpu_nodes.iter().any(|n| labels(n).get("nvidia.com/mig.strategy").map(String::as_str) == Some("single"));
        let hint = if single {
            " (nodes with nvidia.com/mig.strategy=single advertise MIG devices as nvidia.com/gpu, not nvidia.com/mig-*)"
        } else {
            ""
        };
        if offering.is_empty() {
            out.push(format!(
                "MIG profile {profile} ({r}) is requested but no node offers it{hint}; GPU nodes: {}",
                describe(&gpu_nodes)
            ));
        } else if !offering.iter().any(|n| placement.admits(n)) {
            out.push(format!(
                "MIG profile {profile} ({r}) is offered only by nodes the pod template cannot land on ({}); nodes it can land on have another geometry: {}",
                offering.iter().map(|n| n.metadata.name.as_deref().unwrap_or("?")).collect::<Vec<_>>().join(", "),
                describe(&admitted)
            ));
        }
    }
    out
}

fn is_gpu_labelled(n: &Node) -> bool {
    labels(n).keys().any(|k| k.starts_with("nvidia.com/gpu.") || k.starts_with("nvidia.com/mig"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value, alloc: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc}
        }))
        .unwrap()
    }

    fn pod(name: &str, node: &str, phase: &str, limits: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "llm"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    /// An H100 in a `1g.10gb` ×4 + `3g.40gb` ×1 layout (mixed strategy), as GFD labels it.
    fn h100_mixed() -> Node {
        node(
            "h100-mixed",
            json!({
                "karpenter.sh/nodepool": "gpu-mig",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/mig.config": "custom-4x1g-1x3g",
                "nvidia.com/mig.config.state": "success",
                "nvidia.com/mig-1g.10gb.count": "4",
                "nvidia.com/mig-3g.40gb.count": "1"
            }),
            json!({"cpu": "190", "memory": "2000Gi", "nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-3g.40gb": "1"}),
        )
    }

    fn a10g_time_sliced() -> Node {
        node(
            "a10g-ts",
            json!({
                "karpenter.sh/nodepool": "gpu-shared",
                "nvidia.com/gpu.product": "NVIDIA-A10G",
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
                "nvidia.com/gpu.replicas": "4"
            }),
            json!({"cpu": "15", "nvidia.com/gpu.shared": "4"}),
        )
    }

    fn req(pairs: &[(&str, i64)]) -> Resources {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn quantities_parse_in_base_units() {
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("2Ki"), Some(2048.0));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("1.5Gi"), Some(1.5 * 1024f64.powi(3)));
        assert_eq!(parse_quantity("2E"), Some(2e18)); // exa, not an exponent
        assert_eq!(parse_quantity("1Ei"), Some(1024f64.powi(6)));
        assert_eq!(parse_quantity(".5"), Some(0.5));
        assert_eq!(parse_quantity("-1"), Some(-1.0));
        assert_eq!(parse_quantity(" 4 "), Some(4.0)); // YAML values may carry spaces
        assert_eq!(parse_quantity("5E-1"), Some(0.5));
        for bad in ["3x", "", "Gi", "1Gix", "1 Gi", "nan", "inf", "1e400", "0x10", "1e3m", "1e"] {
            assert_eq!(parse_quantity(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn nodes_per_pool_counts_gpu_nodes_and_the_empty_ones() {
        let nodes = vec![
            h100_mixed(),
            a10g_time_sliced(),
            node("cpu", json!({"karpenter.sh/nodepool": "gpu-mig"}), json!({"cpu": "8"})),
        ];
        let pods = vec![
            pod("a", "h100-mixed", "Running", json!({"nvidia.com/mig-1g.10gb": "1"})),
            pod("done", "a10g-ts", "Succeeded", json!({"nvidia.com/gpu.shared": "1"})),
        ];
        let pools = nodes_per_pool(&free_per_node(&nodes, &pods));
        assert_eq!(pools["gpu-mig"], PoolNodes { gpu_nodes: 1, empty: 0 });
        assert_eq!(pools["gpu-shared"], PoolNodes { gpu_nodes: 1, empty: 1 });
        assert_eq!(pools.len(), 2);
    }

    /// Quantities are user text: absurd ones saturate the counts instead of overflowing
    /// (a panic with overflow checks, a wrapped count without).
    #[test]
    fn absurd_quantities_saturate_the_counts() {
        let nodes = vec![
            node("huge-a", json!({}), json!({"nvidia.com/gpu": "1e30"})),
            node("huge-b", json!({}), json!({"nvidia.com/gpu": "9E"})),
        ];
        let pods = vec![
            pod("p", "huge-a", "Running", json!({"nvidia.com/gpu": "1e30"})),
            pod("q", "huge-a", "Running", json!({"nvidia.com/gpu": "1e30"})),
        ];
        let caps = free_per_node(&nodes, &pods);
        assert_eq!(caps[0].used["nvidia.com/gpu"], i64::MAX);
        assert_eq!(caps[0].free["nvidia.com/gpu"], 0);
        assert_eq!(caps[1].free["nvidia.com/gpu"], 9_000_000_000_000_000_000);
        assert_eq!(free_per_pool(&caps)[""]["nvidia.com/gpu"], 9_000_000_000_000_000_000);
        let fit = fit(&req(&[("nvidia.com/gpu", 1)]), &Placement::default(), &nodes, &caps);
        assert_eq!((fit.fits_now, fit.fits_with_placeholders), (u32::MAX, u32::MAX));
        assert_eq!(fit.per_node["huge-a"], 0);
    }

    #[test]
    fn free_capacity_on_a_mixed_mig_h100_subtracts_non_terminal_pods_only() {
        let nodes = vec![h100_mixed()];
        let pods = vec![
            pod("a", "h100-mixed", "Running", json!({"nvidia.com/mig-1g.10gb": "1"})),
            pod("b", "h100-mixed", "Pending", json!({"nvidia.com/mig-1g.10gb": "2"})),
            pod("done", "h100-mixed", "Succeeded", json!({"nvidia.com/mig-3g.40gb": "1"})),
            pod("elsewhere", "other", "Running", json!({"nvidia.com/mig-3g.40gb": "1"})),
        ];
        let caps = free_per_node(&nodes, &pods);
        assert_eq!(caps.len(), 1);
        assert_eq!(caps[0].free, req(&[("nvidia.com/mig-1g.10gb", 1), ("nvidia.com/mig-3g.40gb", 1)]));
        assert_eq!(caps[0].nodepool.as_deref(), Some("gpu-mig"));
        let pools = free_per_pool(&caps);
        assert_eq!(pools["gpu-mig"], req(&[("nvidia.com/mig-1g.10gb", 1), ("nvidia.com/mig-3g.40gb", 1)]));

        let p = Placement::default();
        assert_eq!(fit(&req(&[("nvidia.com/mig-1g.10gb", 1)]), &p, &nodes, &caps).fits_now, 1);
        assert_eq!(fit(&req(&[("nvidia.com/mig-3g.40gb", 1)]), &p, &nodes, &caps).fits_now, 1);
        let f = fit(&req(&[("nvidia.com/mig-1g.10gb", 1)]), &p, &nodes, &caps);
        assert_eq!(f.per_empty_node, Some(4));
        // A whole GPU is not offered by a MIG-partitioned node.
        assert_eq!(fit(&req(&[("nvidia.com/gpu", 1)]), &p, &nodes, &caps).fits_now, 0);
    }

    #[test]
    fn time_sliced_shared_resource_counts_replicas() {
        let nodes = vec![a10g_time_sliced()];
        let pods = vec![pod("a", "a10g-ts", "Running", json!({"nvidia.com/gpu.shared": "1"}))];
        let caps = free_per_node(&nodes, &pods);
        assert_eq!(caps[0].free, req(&[("nvidia.com/gpu.shared", 3)]));
        let f = fit(&req(&[("nvidia.com/gpu.shared", 1)]), &Placement::default(), &nodes, &caps);
        assert_eq!(f.fits_now, 3);
        assert_eq!(f.eligible_nodes, 1);
    }

    #[test]
    fn effective_requests_follow_init_sidecar_and_overhead_rules() {
        let spec: PodSpec = serde_json::from_value(json!({
            "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}}],
            "initContainers": [
                {"name": "warm", "resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}},
                {"name": "side", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
            "overhead": {"nvidia.com/gpu": "0"}
        }))
        .unwrap();
        // max(app 1 + sidecar 1, init 2) = 2; cpu is not accounted.
        assert_eq!(effective_requests(&spec), req(&[("nvidia.com/gpu", 2)]));
    }

    #[test]
    fn placeholders_count_as_free_for_real_replicas_and_unschedulable_nodes_do_not_count() {
        let mut ph = pod("ph", "a10g-ts", "Running", json!({"nvidia.com/gpu.shared": "2"}));
        ph.metadata.labels = Some([(HEADROOM_LABEL.to_string(), "x".to_string())].into());
        let nodes = vec![a10g_time_sliced()];
        let caps = free_per_node(&nodes, &[ph]);
        let f = fit(&req(&[("nvidia.com/gpu.shared", 1)]), &Placement::default(), &nodes, &caps);
        assert_eq!((f.fits_now, f.fits_with_placeholders), (2, 4));

        let mut cordoned = a10g_time_sliced();
        cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
        let caps = free_per_node(std::slice::from_ref(&cordoned), &[]);
        assert_eq!(fit(&req(&[("nvidia.com/gpu.shared", 1)]), &Placement::default(), &[cordoned], &caps).fits_now, 0);
    }

    #[test]
    fn node_selector_affinity_and_taints_restrict_the_fit() {
        let mut tainted = h100_mixed();
        tainted.spec = Some(
            serde_json::from_value(
                json!({"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]}),
            )
            .unwrap(),
        );
        let nodes = vec![tainted, a10g_time_sliced()];
        let caps = free_per_node(&nodes, &[]);
        let r = req(&[("nvidia.com/mig-1g.10gb", 1)]);
        assert_eq!(fit(&r, &Placement::default(), &nodes, &caps).fits_now, 0, "taint not tolerated");
        let tol: Toleration =
            serde_json::from_value(json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}))
                .unwrap();
        let mut p = Placement { tolerations: vec![tol], ..Default::default() };
        assert_eq!(fit(&r, &p, &nodes, &caps).fits_now, 4);
        p.affinity = Some(
            serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}]}]
            }}}))
            .unwrap(),
        );
        assert_eq!(fit(&r, &p, &nodes, &caps).fits_now, 0, "affinity excludes the H100");
        p.affinity = None;
        p.node_selector = [("karpenter.sh/nodepool".to_string(), "gpu-mig".to_string())].into();
        assert_eq!(fit(&r, &p, &nodes, &caps).eligible_nodes, 1);
    }

    #[test]
    fn a_mig_profile_no_node_offers_is_named_with_the_nodes_labels() {
        let nodes = vec![h100_mixed(), a10g_time_sliced()];
        let w = mig_warnings(&req(&[("nvidia.com/mig-2g.20gb", 1)]), &Placement::default(), &nodes);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("MIG profile 2g.20gb (nvidia.com/mig-2g.20gb) is requested but no node offers it"),
            "{}",
            w[0]
        );
        assert!(w[0].contains("h100-mixed [karpenter.sh/nodepool=gpu-mig"), "{}", w[0]);
        assert!(w[0].contains("nvidia.com/mig-1g.10gb.count=4"), "{}", w[0]);
        assert!(w[0].contains("nvidia.com/mig.config=custom-4x1g-1x3g"), "{}", w[0]);
        // Offered, but only where the template cannot land.
        let p = Placement {
            node_selector: [("karpenter.sh/nodepool".to_string(), "gpu-shared".to_string())].into(),
            ..Default::default()
        };
        let w = mig_warnings(&req(&[("nvidia.com/mig-3g.40gb", 1)]), &p, &nodes);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("offered only by nodes the pod template cannot land on (h100-mixed)"), "{}", w[0]);
        assert!(w[0].contains("a10g-ts ["), "{}", w[0]);
        // Offered where it can land: no warning; whole GPUs are not MIG profiles.
        assert!(mig_warnings(&req(&[("nvidia.com/mig-3g.40gb", 1)]), &Placement::default(), &nodes).is_empty());
        assert!(mig_warnings(&req(&[("nvidia.com/gpu", 1)]), &Placement::default(), &nodes).is_empty());
    }

    #[test]
    fn single_strategy_nodes_get_a_hint() {
        let single = node(
            "a100-single",
            json!({"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"}),
            json!({"nvidia.com/gpu": "28"}),
        );
        let w = mig_warnings(&req(&[("nvidia.com/mig-1g.5gb", 1)]), &Placement::default(), &[single]);
        assert!(w[0].contains("mig.strategy=single advertise MIG devices as nvidia.com/gpu"), "{}", w[0]);
    }
}
