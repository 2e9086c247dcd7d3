//! Karpenter headroom: placeholder pods at a negative PriorityClass with a replica's
//! GPU/MIG requests and placement (real replicas preempt them; Karpenter provisions nodes
//! for them while they are Pending), the hint annotated on the NodePool, and the optional
//! resize of static NodePools. The placeholders are owned by prescale's PriorityClass
//! (cluster-scoped, so it can own pods in any namespace): deleting it — or uninstalling
//! prescale — garbage-collects every placeholder.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Serialize;

use super::capacity::{parse_quantity, PoolNodes, HEADROOM_LABEL};
use super::target::TargetInfo;
use crate::config::ScalerId;

pub const PRIORITY_CLASS: &str = "prescale-headroom";
pub const PRIORITY_VALUE: i32 = -10;
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// NodePool annotation with the current hint (JSON, one entry per ScaledObject).
pub const POOL_ANNOTATION: &str = "prescale.io/headroom";
/// NodePool annotation remembering `spec.replicas` before prescale resized it.
pub const POOL_BASE_ANNOTATION: &str = "prescale.io/static-base-replicas";
/// NodePool annotation naming the installation that resized it ([`writer_id`]).
pub const POOL_WRITER_ANNOTATION: &str = "prescale.io/static-resized-by";
/// Placeholder label naming the installation that created it ([`writer_id`]).
pub const WRITER_LABEL: &str = "prescale.io/writer";
pub const DEFAULT_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Never more placeholders than this per target.
pub const MAX_PLACEHOLDERS: u32 = 64;

/// How many placeholders a target should have.
///
/// `missing` = planned − the target's non-terminal pods: replicas the plan will ask for.
/// Those beyond what fits in free capacity now need new nodes → placeholders. Existing
/// placeholders are only removed as real replicas land (missing drops) or the plan drops,
/// never because the nodes they brought make capacity look free.
pub fn headroom_target(desired: u32, current_pods: u32, fits_now: u32, existing: u32, cap: u32) -> u32 {
    let missing = desired.saturating_sub(current_pods);
    let up = missing.saturating_sub(fits_now);
    let n = if up >= existing { up } else { existing.min(missing) };
    n.min(cap).min(MAX_PLACEHOLDERS)
}

/// One target's account of a static NodePool, in nodes: how many more it needs (> 0) or
/// could spare (< 0). A static pool keeps exactly `spec.replicas` nodes whatever is Pending
/// (Karpenter provisions nothing for pods there), so the count must cover every replica the
/// plan wants that has no node yet, not only the headroom a placeholder would stand for:
/// `desired − placed` replicas need room, and the room is the free capacity of the eligible
/// nodes now plus what the nodes still launching (`in_flight`) will bring. Level-triggered:
/// the answer does not change as launched nodes join or as replicas land on them.
pub fn static_pool_need(desired: u32, placed: u32, fits_now: u32, in_flight: u32, per_node: u32) -> i64 {
    let per = i64::from(per_node.max(1));
    let room = i64::from(fits_now) + i64::from(in_flight) * per;
    let short = i64::from(desired) - i64::from(placed) - room;
    if short > 0 {
        (short + per - 1) / per
    } else {
        -(-short / per)
    }
}

/// What one target asks of its static NodePool; the pool's nodes still launching are
/// known only where the pool is read, so the need in nodes is computed there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StaticAsk {
    pub desired: u32,
    pub placed: u32,
    pub fits_now: u32,
    pub per_node: u32,
}

impl StaticAsk {
    /// [`static_pool_need`] with the pool's nodes still launching, and without the room of
    /// the empty nodes already leaving it (beyond `spec.replicas`, not yet removed).
    pub fn need(&self, in_flight: u32, leaving: u32) -> i64 {
        let fits = self.fits_now.saturating_sub(leaving.saturating_mul(self.per_node.max(1)));
        static_pool_need(self.desired, self.placed, fits, in_flight, self.per_node)
    }
}

/// A need for a target that asks nothing of the pool (`karpenterMode: off`).
pub const NEEDS_NOTHING: i64 = -(u32::MAX as i64);

/// The `spec.replicas` a static NodePool gets from its targets' needs: grown by what they
/// need; else shrunk by what every one of them can spare, never below the pool's own `base`
/// and never by more than the `removable` nodes (empty or still launching). Karpenter's
/// static scale-down removes empty nodes first and then random ones, which would evict
/// running replicas. Growth stops at the pool's `limits.nodes` (`limit`), where Karpenter
/// stops provisioning: replicas above it would count as room on its way that never comes.
pub fn static_pool_replicas(current: i64, base: i64, needs: &[i64], removable: u32, limit: Option<i64>) -> i64 {
    let grow = needs.iter().filter(|n| **n > 0).fold(0i64, |a, n| a.saturating_add(*n));
    if grow > 0 {
        let grown = current.saturating_add(grow);
        return limit.map_or(grown, |l| grown.min(l.max(current)));
    }
    let spare = needs.iter().map(|n| -*n).min().unwrap_or(0);
    let shrink = spare.min(current.saturating_sub(base)).min(i64::from(removable)).max(0);
    current - shrink
}

/// A static pool's nodes in motion, from its `spec.replicas` (`current`) and the GPU nodes
/// it has ([`PoolNodes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolMotion {
    /// NodeClaims asked for and not yet a GPU node (`current` above the nodes): their room is
    /// on its way.
    pub launching: u32,
    /// Empty nodes beyond `spec.replicas`: already being removed (Karpenter takes empty ones
    /// first), their room going, and not to be given back twice while the node list still
    /// shows them.
    pub leaving: u32,
    /// What the pool can give back without evicting anything: its other empty nodes and the
    /// launching ones.
    pub removable: u32,
}

pub fn pool_motion(current: i64, nodes: PoolNodes) -> PoolMotion {
    let gpu = i64::from(nodes.gpu_nodes);
    let launching = u32::try_from(current.saturating_sub(gpu).max(0)).unwrap_or(u32::MAX);
    let beyond = u32::try_from(gpu.saturating_sub(current).max(0)).unwrap_or(u32::MAX);
    let leaving = beyond.min(nodes.empty);
    PoolMotion { launching, leaving, removable: (nodes.empty - leaving).saturating_add(launching) }
}

/// How long a static NodePool keeps a size after the need for it went (ms), unless
/// `PRESCALE_STATIC_POOL_STABILIZATION_SECONDS` says otherwise: the HPA's own scale-down
/// stabilization. A plan that steps down and back up by one replica would
/// otherwise remove a node and launch it again, a warm-up each time.
pub const STATIC_POOL_STABILIZATION_MS: u64 = 300_000;

/// Scale-down stabilization of one static NodePool: the largest size computed within the
/// window. Growth applies at once.
#[derive(Debug, Clone)]
pub struct Stabilizer {
    recent: std::collections::VecDeque<(u64, i64)>,
    window_ms: u64,
}

impl Default for Stabilizer {
    fn default() -> Self {
        Self { recent: Default::default(), window_ms: STATIC_POOL_STABILIZATION_MS }
    }
}

impl Stabilizer {
    /// A stabilizer over `window_ms` that has seen `size` at `now_ms`.
    pub fn holding(now_ms: u64, size: i64, window_ms: u64) -> Self {
        Self { recent: std::collections::VecDeque::from([(now_ms, size)]), window_ms }
    }

    /// Record `size` computed at `now_ms` and return the size to apply.
    pub fn apply(&mut self, now_ms: u64, size: i64) -> i64 {
        let since = now_ms.saturating_sub(self.window_ms);
        self.recent.retain(|(at, _)| *at > since && *at <= now_ms);
        self.recent.push_back((now_ms, size));
        self.recent.iter().map(|(_, s)| *s).max().unwrap_or(size)
    }
}

/// A label value naming one installation of prescale: its Lease's namespace and name. Two
/// installations in one cluster each clean up only what they wrote themselves.
pub fn writer_id(lease_namespace: &str, lease_name: &str) -> String {
    target_label(&ScalerId { namespace: lease_namespace.to_string(), name: lease_name.to_string() })
}

/// A label value (≤ 63 chars, [a-z0-9-.]) naming the ScaledObject.
pub fn target_label(id: &ScalerId) -> String {
    let raw = format!("{}.{}", id.namespace, id.name);
    let clean: String =
        raw.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '-' }).collect();
    if clean.len() <= 63 {
        return clean;
    }
    let mut h: u64 = 0xcbf29ce484222325;
    for b in raw.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    format!("{}-{:08x}", &clean[..54], h as u32)
}

/// The placeholder's resources: every request of the template's app containers summed
/// (CPU and memory too, so Karpenter picks an instance type that also fits those), with
/// limits for extended resources (they must equal the requests).
fn placeholder_resources(spec: &PodSpec) -> ResourceRequirements {
    let mut sum: BTreeMap<String, f64> = BTreeMap::new();
    for c in &spec.containers {
        let r = c.resources.as_ref();
        let mut mine: BTreeMap<String, f64> = BTreeMap::new();
        for (k, v) in r.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
            if k.contains('/') {
                mine.insert(k.clone(), parse_quantity(&v.0).unwrap_or(0.0));
            }
        }
        for (k, v) in r.and_then(|r| r.requests.as_ref()).into_iter().flatten() {
            mine.insert(k.clone(), parse_quantity(&v.0).unwrap_or(0.0));
        }
        for (k, v) in mine {
            *sum.entry(k).or_default() += v;
        }
    }
    let fmt = |k: &str, v: f64| {
        if k == "cpu" {
            Quantity(format!("{}m", (v * 1000.0).ceil() as i64))
        } else {
            Quantity(format!("{}", v.ceil() as i64))
        }
    };
    let requests: BTreeMap<String, Quantity> =
        sum.iter().filter(|(_, v)| **v > 0.0).map(|(k, v)| (k.clone(), fmt(k, *v))).collect();
    let limits: BTreeMap<String, Quantity> =
        requests.iter().filter(|(k, _)| k.contains('/')).map(|(k, v)| (k.clone(), v.clone())).collect();
    ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..Default::default()
    }
}

pub fn placeholder_name(id: &ScalerId, index: u32) -> String {
    let base = target_label(id).replace('.', "-").to_ascii_lowercase();
    let base = base.trim_end_matches('-');
    format!("prescale-headroom-{}-{index}", &base[..base.len().min(200)])
}

/// A placeholder pod for `info`'s replicas.
pub fn placeholder_pod(id: &ScalerId, info: &TargetInfo, index: u32, owner_uid: &str, image: &str) -> Pod {
    let spec = &info.pod_spec;
    let labels: BTreeMap<String, String> =
        [(MANAGED_BY.to_string(), "prescale".to_string()), (HEADROOM_LABEL.to_string(), target_label(id))].into();
    let annotations: BTreeMap<String, String> = [
        ("prescale.io/scaled-object".to_string(), id.to_string()),
        ("prescale.io/scale-target".to_string(), format!("{}/{}", info.kind, info.name)),
    ]
    .into();
    Pod {
        metadata: ObjectMeta {
            name: Some(placeholder_name(id, index)),
            namespace: Some(info.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "scheduling.k8s.io/v1".into(),
                kind: "PriorityClass".into(),
                name: PRIORITY_CLASS.into(),
                uid: owner_uid.to_string(),
                controller: Some(false),
                block_owner_deletion: Some(false),
            }]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            priority_class_name: Some(PRIORITY_CLASS.into()),
            termination_grace_period_seconds: Some(0),
            automount_service_account_token: Some(false),
            node_selector: spec.node_selector.clone(),
            affinity: spec.affinity.clone(),
            tolerations: spec.tolerations.clone(),
            runtime_class_name: spec.runtime_class_name.clone(),
            containers: vec![Container {
                name: "pause".into(),
                image: Some(image.to_string()),
                resources: Some(placeholder_resources(spec)),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

pub fn priority_class() -> PriorityClass {
    PriorityClass {
        metadata: ObjectMeta {
            name: Some(PRIORITY_CLASS.into()),
            labels: Some([(MANAGED_BY.to_string(), "prescale".to_string())].into()),
            ..Default::default()
        },
        value: Some(PRIORITY_VALUE),
        global_default: Some(false),
        preemption_policy: Some("Never".into()),
        description: Some(
            "prescale headroom placeholders: preempted by any real pod; owner of every placeholder pod".into(),
        ),
    }
}

/// One ScaledObject's entry in a NodePool's `prescale.io/headroom` annotation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolHint {
    /// Replicas the plan needs at now + warm-up beyond what fits now.
    pub replicas: u32,
    pub desired: u32,
    pub current: u32,
    pub fits_now: u32,
    pub per_replica: BTreeMap<String, i64>,
    pub target: String,
}

/// The annotation value for a pool (stable JSON: BTreeMap keys).
pub fn pool_annotation(hints: &BTreeMap<String, PoolHint>) -> Option<String> {
    (!hints.is_empty()).then(|| serde_json::to_string(hints).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::target::from_template;
    use serde_json::json;

    #[test]
    fn headroom_covers_the_plan_beyond_what_fits_and_drops_only_as_replicas_land() {
        // Plan 5, 1 running, room for 1 more: 3 placeholders.
        assert_eq!(headroom_target(5, 1, 1, 0, 100), 3);
        // Their nodes arrived and they hold them (the old free slot is still free): keep 3.
        assert_eq!(headroom_target(5, 1, 1, 3, 100), 3);
        // One of them took the old free slot instead: a fourth is needed.
        assert_eq!(headroom_target(5, 1, 0, 3, 100), 4);
        // A pending placeholder's new node shows as free for a moment: still keep 3.
        assert_eq!(headroom_target(5, 1, 2, 3, 100), 3);
        // Two real replicas landed: 2 left to come.
        assert_eq!(headroom_target(5, 3, 0, 3, 100), 2);
        // All landed, or the plan dropped.
        assert_eq!(headroom_target(5, 5, 0, 2, 100), 0);
        assert_eq!(headroom_target(1, 1, 0, 3, 100), 0);
        // Capped.
        assert_eq!(headroom_target(500, 0, 0, 0, 10), 10);
    }

    #[test]
    fn the_room_of_a_node_leaving_the_pool_is_not_counted() {
        let ask = StaticAsk { desired: 6, placed: 3, fits_now: 3, per_node: 2 };
        // 3 free slots, one of them on a node that stays: 3 more replicas fit.
        assert_eq!(ask.need(0, 0), 0);
        // The empty node (2 slots) is leaving: one replica has no room, a node is needed.
        assert_eq!(ask.need(0, 1), 1);
        assert_eq!(ask.need(0, u32::MAX), 2);
    }

    #[test]
    fn a_node_already_leaving_the_pool_is_not_removable_twice() {
        let removable = |current, gpu_nodes, empty| pool_motion(current, PoolNodes { gpu_nodes, empty }).removable;
        // 4 nodes, 1 empty, spec 4: that one can go.
        assert_eq!(removable(4, 4, 1), 1);
        // Spec cut to 3 while the empty node is still there: it is the one leaving.
        assert_eq!(removable(3, 4, 1), 0);
        assert_eq!(pool_motion(3, PoolNodes { gpu_nodes: 4, empty: 1 }).leaving, 1);
        // Two NodeClaims launching, nothing empty: both can be cancelled.
        assert_eq!(removable(6, 4, 0), 2);
        assert_eq!(pool_motion(6, PoolNodes { gpu_nodes: 4, empty: 0 }).launching, 2);
        assert_eq!(removable(i64::MIN, u32::MAX, u32::MAX), 0);
        assert_eq!(removable(i64::MAX, 0, u32::MAX), u32::MAX);
    }

    #[test]
    fn static_pools_grow_by_whole_nodes_and_hold_them_while_replicas_land() {
        // Two replicas per node. The plan wants 6, 2 run, the base nodes have no room.
        let need = static_pool_need(6, 2, 0, 0, 2);
        assert_eq!(need, 2);
        let grown = static_pool_replicas(2, 2, &[need], 0, None);
        assert_eq!(grown, 4);
        // The two nodes launch: their room counts before they join, so nothing more is asked.
        assert_eq!(static_pool_need(6, 2, 0, 2, 2), 0);
        assert_eq!(static_pool_replicas(grown, 2, &[0], 2, None), grown);
        // They join with room for 4; the HPA has created the 4 replicas, still Pending.
        assert_eq!(static_pool_need(6, 2, 4, 0, 2), 0);
        // The replicas land: no room left, none needed, the pool keeps its 4 nodes.
        assert_eq!(static_pool_need(6, 6, 0, 0, 2), 0);
        assert_eq!(static_pool_replicas(grown, 2, &[0], 0, None), grown);
        // An odd shortfall takes a whole node; an odd surplus spares only whole nodes.
        assert_eq!(static_pool_need(7, 6, 0, 0, 2), 1);
        assert_eq!(static_pool_need(3, 0, 6, 0, 2), -1);
        // The plan drops to 2: the 4 idle replicas' room is spare, but only empty nodes go.
        let spare = static_pool_need(2, 2, 4, 0, 2);
        assert_eq!(spare, -2);
        assert_eq!(static_pool_replicas(grown, 2, &[spare], 1, None), 3);
        assert_eq!(static_pool_replicas(grown, 2, &[spare], 2, None), 2);
        // Never below the pool's own base, and a per-node count of 0 is read as 1.
        assert_eq!(static_pool_replicas(3, 2, &[NEEDS_NOTHING], 5, None), 2);
        assert_eq!(static_pool_need(1, 0, 0, 0, 0), 1);
    }

    #[test]
    fn a_static_pool_keeps_a_size_for_the_stabilization_window_and_grows_at_once() {
        let mut st = Stabilizer::default();
        assert_eq!(st.apply(1_000, 4), 4);
        assert_eq!(st.apply(4_000, 3), 4, "a one-replica dip in the plan removes no node");
        assert_eq!(st.apply(7_000, 5), 5, "growth applies at once");
        assert_eq!(st.apply(7_000 + STATIC_POOL_STABILIZATION_MS - 1, 2), 5);
        assert_eq!(st.apply(7_000 + STATIC_POOL_STABILIZATION_MS, 2), 2);
        // A clock that steps back forgets what it cannot place.
        assert_eq!(st.apply(1_000, 3), 3);
        // A pool first seen (a new leader) keeps its size for the window before shrinking.
        let mut fresh = Stabilizer::holding(50_000, 6, STATIC_POOL_STABILIZATION_MS);
        assert_eq!(fresh.apply(50_000, 4), 6);
        assert_eq!(fresh.apply(50_000 + STATIC_POOL_STABILIZATION_MS, 4), 4);
    }

    #[test]
    fn a_static_pool_shared_by_targets_grows_for_each_and_shrinks_by_what_all_spare() {
        assert_eq!(static_pool_replicas(4, 2, &[1, 2, -1], 9, None), 7);
        assert_eq!(static_pool_replicas(4, 2, &[-1, -2], 9, None), 3);
        assert_eq!(static_pool_replicas(4, 2, &[0, -2], 9, None), 4);
        assert_eq!(static_pool_replicas(4, 2, &[], 9, None), 4);
        assert_eq!(static_pool_replicas(i64::MAX - 1, 0, &[5], 0, None), i64::MAX);
        // limits.nodes caps the growth, and never shrinks a pool already above it.
        assert_eq!(static_pool_replicas(4, 2, &[1, 2], 9, Some(6)), 6);
        assert_eq!(static_pool_replicas(4, 2, &[1, 2], 9, Some(8)), 7);
        assert_eq!(static_pool_replicas(7, 2, &[1], 9, Some(6)), 7);
        assert_eq!(static_pool_replicas(7, 2, &[-2], 9, Some(6)), 5);
    }

    #[test]
    fn placeholder_carries_requests_placement_priority_and_owner() {
        let t: k8s_openapi::api::core::v1::PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "vllm"}},
            "spec": {
                "containers": [
                    {"name": "vllm", "image": "vllm/vllm-openai", "resources": {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"nvidia.com/mig-3g.40gb": "1"}}},
                    {"name": "proxy", "resources": {"requests": {"cpu": "250m"}}}
                ],
                "nodeSelector": {"karpenter.sh/nodepool": "gpu"},
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
            }
        }))
        .unwrap();
        let info =
            from_template("Deployment", "vllm", "llm", Some([("app".into(), "vllm".into())].into()), &t).unwrap();
        let id = ScalerId { namespace: "llm".into(), name: "llama".into() };
        let p = placeholder_pod(&id, &info, 2, "uid-1", DEFAULT_IMAGE);
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["metadata"]["name"], "prescale-headroom-llm-llama-2");
        assert_eq!(v["metadata"]["labels"][HEADROOM_LABEL], "llm.llama");
        assert!(v["metadata"]["labels"].get("app").is_none(), "must not match the Deployment's selector");
        assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "PriorityClass");
        assert_eq!(v["spec"]["priorityClassName"], PRIORITY_CLASS);
        let res = &v["spec"]["containers"][0]["resources"];
        assert_eq!(res["requests"]["nvidia.com/mig-3g.40gb"], "1");
        assert_eq!(res["limits"]["nvidia.com/mig-3g.40gb"], "1");
        assert_eq!(res["requests"]["cpu"], "4250m");
        assert_eq!(res["requests"]["memory"], (32u64 << 30).to_string());
        assert_eq!(v["spec"]["nodeSelector"]["karpenter.sh/nodepool"], "gpu");
        assert_eq!(v["spec"]["affinity"], json!(t.spec.as_ref().unwrap().affinity));
        assert_eq!(v["spec"]["tolerations"][0]["key"], "nvidia.com/gpu");
    }

    #[test]
    fn long_names_fit_label_limits() {
        let id = ScalerId { namespace: "n".repeat(60), name: "s".repeat(60) };
        assert!(target_label(&id).len() <= 63);
        assert_ne!(target_label(&id), target_label(&ScalerId { namespace: "n".repeat(60), name: "t".repeat(60) }));
    }
}
