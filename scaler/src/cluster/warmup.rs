//! Measured warm-up (pure): pod creation → Ready, and when the pod waited for a new node,
//! node (or NodeClaim) creation → node Ready. Samples are keyed by uid so re-reading the
//! same objects never counts twice; the distribution is bounded.

use std::collections::{BTreeMap, VecDeque};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::core::DynamicObject;
use serde::Serialize;

/// Samples kept per target and phase.
pub const MAX_SAMPLES: usize = 256;
/// Samples needed before `warmupSeconds: auto` uses the measurement.
pub const MIN_SAMPLES: usize = 3;
/// The quantile `warmupSeconds: auto` plans with.
pub const AUTO_QUANTILE: f64 = 0.9;
/// A node created up to this long before the pod still counts as "new for this pod"
/// (the pod's ReplicaSet and a placeholder's node can race by a few seconds).
const NODE_SLACK_S: f64 = 5.0;

fn ts(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> f64 {
    t.0.as_millisecond() as f64 / 1000.0
}

/// Unix seconds of the `Ready=True` transition among `(type, status, lastTransitionTime)`.
fn ready_transition<'a>(
    mut conditions: impl Iterator<
        Item = (&'a str, &'a str, Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>),
    >,
) -> Option<f64> {
    conditions.find(|(t, s, _)| *t == "Ready" && *s == "True").and_then(|(_, _, at)| at).map(ts)
}

/// Unix seconds of the `Ready=True` transition of a pod, if it is Ready.
pub fn pod_ready_at(pod: &Pod) -> Option<f64> {
    let conds = pod.status.as_ref()?.conditions.as_ref()?;
    ready_transition(conds.iter().map(|c| (c.type_.as_str(), c.status.as_str(), c.last_transition_time.as_ref())))
}

/// Whether a pod's `Ready` condition is `True` now.
pub fn pod_is_ready(pod: &Pod) -> bool {
    let conds = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    conds.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Unix seconds of the `Ready=True` transition of a node, if it is Ready.
pub fn node_ready_at(node: &Node) -> Option<f64> {
    let conds = node.status.as_ref()?.conditions.as_ref()?;
    ready_transition(conds.iter().map(|c| (c.type_.as_str(), c.status.as_str(), c.last_transition_time.as_ref())))
}

/// Pod creation → Ready, seconds.
pub fn pod_warmup(pod: &Pod) -> Option<f64> {
    let created = pod.metadata.creation_timestamp.as_ref().map(ts)?;
    let ready = pod_ready_at(pod)?;
    (ready >= created).then_some(ready - created)
}

/// When the pod waited for a new node: (node-phase seconds, where it was measured from).
/// The start is the NodeClaim's creation when one names this node (Karpenter launches the
/// instance before the Node object exists), else the Node's creation.
pub fn node_warmup(pod: &Pod, node: &Node, claims: &[DynamicObject]) -> Option<(f64, &'static str)> {
    let pod_created = pod.metadata.creation_timestamp.as_ref().map(ts)?;
    let node_created = node.metadata.creation_timestamp.as_ref().map(ts)?;
    let node_name = node.metadata.name.as_deref()?;
    let claim = claims.iter().find(|c| c.data.pointer("/status/nodeName").and_then(|v| v.as_str()) == Some(node_name));
    let claim_created = claim.and_then(|c| c.metadata.creation_timestamp.as_ref()).map(ts);
    let start = claim_created.unwrap_or(node_created);
    // The node is new for this pod when it came after the pod (or the claim did).
    if start + NODE_SLACK_S < pod_created {
        return None;
    }
    let ready = node_ready_at(node)?;
    (ready >= start).then_some((ready - start, if claim_created.is_some() { "nodeclaim" } else { "node" }))
}

/// A bounded set of samples, deduplicated by key (pod or node uid).
#[derive(Debug, Clone, Default)]
pub struct Samples {
    order: VecDeque<String>,
    values: BTreeMap<String, f64>,
}

impl Samples {
    /// Record a sample once per key; returns true when it was new.
    pub fn record(&mut self, key: &str, seconds: f64) -> bool {
        if !seconds.is_finite() || seconds < 0.0 || self.values.contains_key(key) {
            return false;
        }
        if self.order.len() >= MAX_SAMPLES {
            if let Some(old) = self.order.pop_front() {
                self.values.remove(&old);
            }
        }
        self.order.push_back(key.to_string());
        self.values.insert(key.to_string(), seconds);
        true
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn values(&self) -> Vec<f64> {
        self.order.iter().filter_map(|k| self.values.get(k).copied()).collect()
    }

    /// The `q` quantile (nearest rank), or `None` without samples.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let mut v = self.values();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let i = ((v.len() as f64 * q.clamp(0.0, 1.0)).ceil() as usize).clamp(1, v.len()) - 1;
        Some(v[i])
    }

    pub fn summary(&self) -> Summary {
        Summary {
            samples: self.len(),
            p50: self.quantile(0.5),
            p90: self.quantile(0.9),
            p99: self.quantile(0.99),
            max: self.values().into_iter().reduce(f64::max),
            last: self.order.back().and_then(|k| self.values.get(k).copied()),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    pub samples: usize,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
    pub last: Option<f64>,
}

/// Seconds from an answer to the pod's creation that a pod's own creation → Ready leaves
/// out: the HPA reads the metric once per sync period (15 s, Kubernetes' default
/// `--horizontal-pod-autoscaler-sync-period`), then the workload controller creates the pod.
pub const ACTUATION_S: f64 = 15.0;

/// The warm-up `warmupSeconds: auto` plans with: the high quantile of the measured pod
/// warm-ups plus [`ACTUATION_S`] once there are enough samples, else `None` (the caller
/// keeps the configured fallback).
pub fn auto_warmup(samples: &Samples) -> Option<f64> {
    (samples.len() >= MIN_SAMPLES).then(|| samples.quantile(AUTO_QUANTILE)).flatten().map(|w| w + ACTUATION_S)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, created: &str, ready: Option<&str>) -> Pod {
        let conds = match ready {
            Some(r) => json!([{"type": "Ready", "status": "True", "lastTransitionTime": r}]),
            None => json!([{"type": "Ready", "status": "False", "lastTransitionTime": created}]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": uid, "uid": uid, "creationTimestamp": created},
            "spec": {"containers": [], "nodeName": "n1"},
            "status": {"conditions": conds}
        }))
        .unwrap()
    }

    fn node(created: &str, ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "uid": "n1", "creationTimestamp": created},
            "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": ready}]}
        }))
        .unwrap()
    }

    #[test]
    fn pod_warmup_is_creation_to_ready() {
        assert_eq!(pod_warmup(&pod("a", "2026-01-01T00:00:00Z", Some("2026-01-01T00:03:20Z"))), Some(200.0));
        assert_eq!(pod_warmup(&pod("b", "2026-01-01T00:00:00Z", None)), None);
    }

    #[test]
    fn node_warmup_counts_only_nodes_that_came_for_the_pod() {
        let p = pod("a", "2026-01-01T00:00:00Z", Some("2026-01-01T00:08:00Z"));
        // A node created after the pod: node creation → Ready.
        assert_eq!(node_warmup(&p, &node("2026-01-01T00:00:40Z", "2026-01-01T00:02:40Z"), &[]), Some((120.0, "node")));
        // An old node: the pod did not wait for it.
        assert_eq!(node_warmup(&p, &node("2025-12-01T00:00:00Z", "2025-12-01T00:02:00Z"), &[]), None);
        // A NodeClaim naming the node: measured from the claim's creation.
        let claim: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "gpu-abc", "creationTimestamp": "2026-01-01T00:00:05Z"},
            "status": {"nodeName": "n1"}
        }))
        .unwrap();
        assert_eq!(
            node_warmup(&p, &node("2026-01-01T00:00:40Z", "2026-01-01T00:02:40Z"), &[claim]),
            Some((155.0, "nodeclaim"))
        );
    }

    #[test]
    fn samples_dedupe_bound_and_feed_auto_after_enough() {
        let mut s = Samples::default();
        assert!(s.record("a", 100.0));
        assert!(!s.record("a", 999.0), "same uid twice");
        assert_eq!(auto_warmup(&s), None, "one sample is not enough");
        s.record("b", 300.0);
        s.record("c", 200.0);
        assert_eq!(auto_warmup(&s), Some(300.0 + ACTUATION_S), "p90 and the HPA's sync period");
        assert_eq!(s.summary().p50, Some(200.0));
        for i in 0..(MAX_SAMPLES + 10) {
            s.record(&format!("x{i}"), 1.0);
        }
        assert_eq!(s.len(), MAX_SAMPLES);
        assert!(!s.record("nan", f64::NAN));
    }
}
