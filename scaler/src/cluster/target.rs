//! ScaledObject → scale target (Deployment or StatefulSet) → pod template: GPU/MIG
//! requests, placement, selector; and the Karpenter NodePool the replicas land on.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PodSpec, PodTemplateSpec};
use kube::api::Api;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Serialize;

use super::capacity::{effective_requests, requirement_matches, Placement, Resources, NODEPOOL_LABEL};
use super::ClusterError;

pub fn scaled_object_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject"), "scaledobjects")
}

pub fn nodepool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodePool"), "nodepools")
}

pub fn nodeclaim_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("karpenter.sh", "v1", "NodeClaim"), "nodeclaims")
}

/// What a replica of the scale target looks like.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetInfo {
    /// `Deployment` or `StatefulSet`.
    pub kind: String,
    pub name: String,
    pub namespace: String,
    /// The workload's `spec.selector.matchLabels` (its pods).
    pub selector: BTreeMap<String, String>,
    /// GPU/MIG requests of one replica.
    pub gpu_requests: Resources,
    pub placement: Placement,
    /// The pod template's spec (for placeholder pods).
    #[serde(skip)]
    pub pod_spec: PodSpec,
}

/// `spec.scaleTargetRef` of a ScaledObject: (kind, name). KEDA's default kind is Deployment.
/// KEDA's pause annotations under which no planned scale-out is applied: the whole
/// ScaledObject paused (at its current or a fixed count), or only its scale-out. The
/// annotation as found, or None (`paused-scale-in` alone leaves scale-outs applied).
pub fn paused(so: &DynamicObject) -> Option<String> {
    let annotations = so.metadata.annotations.as_ref()?;
    let on = |k: &str| annotations.get(k).is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    if let Some(n) = annotations.get("autoscaling.keda.sh/paused-replicas") {
        return Some(format!("autoscaling.keda.sh/paused-replicas: {n}"));
    }
    ["autoscaling.keda.sh/paused", "autoscaling.keda.sh/paused-scale-out"]
        .into_iter()
        .find(|k| on(k))
        .map(|k| format!("{k}: true"))
}

pub fn scale_target_ref(so: &DynamicObject) -> Result<(String, String), ClusterError> {
    let r = so
        .data
        .pointer("/spec/scaleTargetRef")
        .ok_or_else(|| ClusterError::Target("ScaledObject has no spec.scaleTargetRef".into()))?;
    let name = r
        .get("name")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ClusterError::Target("spec.scaleTargetRef.name is missing".into()))?;
    let kind = r.get("kind").and_then(|v| v.as_str()).unwrap_or("Deployment");
    match kind {
        "Deployment" | "StatefulSet" => Ok((kind.to_string(), name.to_string())),
        other => {
            Err(ClusterError::Target(format!("scale target kind {other} is not supported (Deployment or StatefulSet)")))
        }
    }
}

/// The shape of a replica from a workload's pod template.
pub fn from_template(
    kind: &str,
    name: &str,
    namespace: &str,
    match_labels: Option<BTreeMap<String, String>>,
    template: &PodTemplateSpec,
) -> Result<TargetInfo, ClusterError> {
    let spec = template
        .spec
        .clone()
        .ok_or_else(|| ClusterError::Target(format!("{kind} {namespace}/{name} has no pod template spec")))?;
    let selector = match_labels
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ClusterError::Target(format!("{kind} {namespace}/{name} has no spec.selector.matchLabels")))?;
    Ok(TargetInfo {
        kind: kind.to_string(),
        name: name.to_string(),
        namespace: namespace.to_string(),
        selector,
        gpu_requests: effective_requests(&spec),
        placement: Placement::from_spec(&spec),
        pod_spec: spec,
    })
}

/// Read the ScaledObject, then its scale target.
pub async fn discover(client: &kube::Client, namespace: &str, name: &str) -> Result<TargetInfo, ClusterError> {
    let sos: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &scaled_object_resource());
    let so = sos.get(name).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 404 => ClusterError::Gone(format!(
            "ScaledObject {namespace}/{name} not found: deleted (KEDA stops asking; prescale drops it after \
             --idle-drop-seconds), or renamed"
        )),
        e => ClusterError::api(format!("get ScaledObject {namespace}/{name}"), e),
    })?;
    if let Some(why) = paused(&so) {
        return Err(ClusterError::Gone(format!(
            "ScaledObject {namespace}/{name} is paused ({why}): KEDA applies no scale-out, so none is prepared for"
        )));
    }
    let (kind, target) = scale_target_ref(&so)?;
    if kind == "StatefulSet" {
        let api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
        let s = api
            .get(&target)
            .await
            .map_err(|e| ClusterError::api(format!("get StatefulSet {namespace}/{target}"), e))?;
        let spec = s.spec;
        from_template(&kind, &target, namespace, spec.selector.match_labels, &spec.template)
    } else {
        let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let d =
            api.get(&target).await.map_err(|e| ClusterError::api(format!("get Deployment {namespace}/{target}"), e))?;
        let spec = d.spec;
        from_template(&kind, &target, namespace, spec.selector.match_labels, &spec.template)
    }
}

/// A NodePool's name, `spec.replicas` (static capacity) and template labels/requirements.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolInfo {
    pub name: String,
    pub static_replicas: Option<i64>,
    pub weight: i64,
}

pub fn pool_info(np: &DynamicObject) -> PoolInfo {
    PoolInfo {
        name: np.metadata.name.clone().unwrap_or_default(),
        static_replicas: np.data.pointer("/spec/replicas").and_then(|v| v.as_i64()),
        weight: np.data.pointer("/spec/weight").and_then(|v| v.as_i64()).unwrap_or(0),
    }
}

/// Could a node of this NodePool satisfy the node selector and required node affinity?
/// Labels the pool does not constrain are assumed satisfiable (Karpenter picks instance
/// types); a pool label or `In` requirement that contradicts the selector excludes it.
fn pool_compatible(np: &DynamicObject, placement: &Placement) -> bool {
    let name = np.metadata.name.clone().unwrap_or_default();
    let mut fixed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    fixed.insert(NODEPOOL_LABEL.to_string(), vec![name]);
    if let Some(l) = np.data.pointer("/spec/template/metadata/labels").and_then(|v| v.as_object()) {
        for (k, v) in l {
            if let Some(v) = v.as_str() {
                fixed.insert(k.clone(), vec![v.to_string()]);
            }
        }
    }
    for r in np.data.pointer("/spec/template/spec/requirements").and_then(|v| v.as_array()).into_iter().flatten() {
        if r.get("operator").and_then(|v| v.as_str()) == Some("In") {
            if let (Some(k), Some(vals)) =
                (r.get("key").and_then(|v| v.as_str()), r.get("values").and_then(|v| v.as_array()))
            {
                fixed
                    .entry(k.to_string())
                    .or_insert_with(|| vals.iter().filter_map(|v| v.as_str().map(String::from)).collect());
            }
        }
    }
    let sel_ok = placement.node_selector.iter().all(|(k, v)| fixed.get(k).is_none_or(|vals| vals.contains(v)));
    let terms = placement
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| na.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    let aff_ok = terms.is_empty()
        || terms.iter().any(|t| {
            t.match_expressions.iter().flatten().all(|e| match fixed.get(&e.key) {
                None => true,
                Some(vals) => vals.iter().any(|v| {
                    let l: BTreeMap<String, String> = [(e.key.clone(), v.clone())].into();
                    requirement_matches(e, &l)
                }),
            })
        });
    sel_ok && aff_ok
}

/// The NodePool(s) the target lands on: the one its node selector names; else the pools of
/// the nodes its pods run on; else the compatible pools, highest weight first.
pub fn target_pools(info: &TargetInfo, nodepools: &[DynamicObject], pools_of_running_pods: &[String]) -> Vec<PoolInfo> {
    if let Some(p) = info.placement.node_selector.get(NODEPOOL_LABEL) {
        return nodepools.iter().filter(|n| n.metadata.name.as_deref() == Some(p.as_str())).map(pool_info).collect();
    }
    let mut out: Vec<PoolInfo> = nodepools
        .iter()
        .filter(|n| n.metadata.name.as_ref().is_some_and(|name| pools_of_running_pods.contains(name)))
        .map(pool_info)
        .collect();
    if out.is_empty() {
        out = nodepools.iter().filter(|n| pool_compatible(n, &info.placement)).map(pool_info).collect();
    }
    out.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.name.cmp(&b.name)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn so(target: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": "llama", "namespace": "llm"},
            "spec": {"scaleTargetRef": target}
        }))
        .unwrap()
    }

    #[test]
    fn keda_pause_annotations_that_stop_scale_outs() {
        let with = |a: serde_json::Value| {
            let mut o = so(json!({"name": "llama"}));
            o.metadata.annotations = serde_json::from_value(a).unwrap();
            paused(&o)
        };
        assert_eq!(paused(&so(json!({"name": "llama"}))), None, "no annotations");
        assert_eq!(
            with(json!({"autoscaling.keda.sh/paused": "true"})).as_deref(),
            Some("autoscaling.keda.sh/paused: true")
        );
        assert_eq!(with(json!({"autoscaling.keda.sh/paused": "false"})), None);
        assert_eq!(
            with(json!({"autoscaling.keda.sh/paused-replicas": "2"})).as_deref(),
            Some("autoscaling.keda.sh/paused-replicas: 2")
        );
        assert!(with(json!({"autoscaling.keda.sh/paused-scale-out": "True"})).is_some());
        assert_eq!(with(json!({"autoscaling.keda.sh/paused-scale-in": "true"})), None, "scale-outs still apply");
    }

    fn pool(name: &str, spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn scale_target_defaults_to_deployment_and_rejects_other_kinds() {
        assert_eq!(scale_target_ref(&so(json!({"name": "vllm"}))).unwrap(), ("Deployment".into(), "vllm".into()));
        assert_eq!(
            scale_target_ref(&so(json!({"name": "vllm", "kind": "StatefulSet"}))).unwrap(),
            ("StatefulSet".into(), "vllm".into())
        );
        let e = scale_target_ref(&so(json!({"name": "x", "kind": "Rollout"}))).unwrap_err();
        assert!(e.to_string().contains("Rollout is not supported"), "{e}");
    }

    #[test]
    fn template_gives_requests_placement_and_pools() {
        let t: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "vllm"}},
            "spec": {
                "containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}],
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
            }
        }))
        .unwrap();
        let info =
            from_template("Deployment", "vllm", "llm", Some([("app".into(), "vllm".into())].into()), &t).unwrap();
        assert_eq!(info.gpu_requests, [("nvidia.com/mig-3g.40gb".to_string(), 1)].into());
        assert_eq!(info.placement.tolerations.len(), 1);
        let pools = [
            pool(
                "cpu",
                json!({"template": {"spec": {"requirements": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["none"]}]}}}),
            ),
            pool(
                "h100",
                json!({"weight": 10, "template": {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}}),
            ),
            pool("static", json!({"replicas": 2})),
        ];
        let names: Vec<String> = target_pools(&info, &pools, &[]).into_iter().map(|p| p.name).collect();
        assert_eq!(names, vec!["h100".to_string(), "static".to_string()]);
        let running: Vec<String> =
            target_pools(&info, &pools, &["static".into()]).into_iter().map(|p| p.name).collect();
        assert_eq!(running, vec!["static".to_string()]);
        assert_eq!(pool_info(&pools[2]).static_replicas, Some(2));
    }
}
