//! Kubernetes objects as the watches hand them to the cluster loop: Nodes, Pods, Karpenter
//! NodePools and NodeClaims, Leases, a ScaledObject and a workload's pod template, all from one
//! JSON document (`fuzz/seeds/cluster.json` is a real-shaped seed). Free GPU / MIG capacity,
//! the fit of a replica, MIG warnings, the target's pools, placeholder pods and measured
//! warm-ups are computed from them: never a panic, and the counts stay consistent.
#![no_main]

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use kube::core::DynamicObject;
use libfuzzer_sys::fuzz_target;
use prescale::cluster::{capacity, headroom, lease, peers, target, warmup};
use prescale::config::ScalerId;
use prescale::engine::predict::PlannedFleet;
use serde_json::Value;

/// The objects of one kind that deserialize; the rest are skipped, as a watch would
/// fail to decode them.
fn objects<T: serde::de::DeserializeOwned>(doc: &Value, key: &str) -> Vec<T> {
    doc.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| serde_json::from_value(v.clone()).ok())
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = serde_json::from_slice::<Value>(data) else { return };
    let nodes: Vec<Node> = objects(&doc, "nodes");
    let pods: Vec<Pod> = objects(&doc, "pods");
    let nodepools: Vec<DynamicObject> = objects(&doc, "nodepools");
    let claims: Vec<DynamicObject> = objects(&doc, "nodeclaims");

    let caps = capacity::free_per_node(&nodes, &pods);
    assert!(caps.len() <= nodes.len());
    let pools = capacity::free_per_pool(&caps);
    for pool in pools.keys() {
        // Nodes without the Karpenter label are summed under "".
        assert!(
            caps.iter().any(|c| c.schedulable && c.nodepool.as_deref().unwrap_or_default() == pool),
            "pool {pool:?} has no schedulable node"
        );
    }
    for pod in &pods {
        let _ = warmup::pod_warmup(pod).map(|w| assert!(w >= 0.0 && w.is_finite(), "{w}"));
        let _ = warmup::pod_is_ready(pod);
        for node in &nodes {
            if let Some((w, _)) = warmup::node_warmup(pod, node, &claims) {
                assert!(w >= 0.0 && w.is_finite(), "{w}");
            }
        }
    }
    for spec in objects::<LeaseSpec>(&doc, "leases") {
        // The holder renews; a Lease nobody holds is taken over; another holder is
        // followed until its renewal expires, whatever the times in it say.
        let step = lease::decide(Some(&spec), "prescale-0", 1.8e9);
        match spec.holder_identity.as_deref() {
            Some("prescale-0") => assert_eq!(step, lease::Step::Renew),
            None | Some("") => assert!(matches!(step, lease::Step::TakeOver { .. }), "{step:?}"),
            Some(h) => assert!(
                matches!(&step, lease::Step::Follow { holder } if holder == h)
                    || matches!(step, lease::Step::TakeOver { .. }),
                "{step:?}"
            ),
        }
    }
    for so in objects::<DynamicObject>(&doc, "scaledobjects") {
        let _ = target::scale_target_ref(&so);
    }
    // A static NodePool's size from its targets' needs: grown when one needs nodes, else
    // shrunk by no more than the removable nodes and never below the base.
    if let Some(st) = doc.get("staticPool") {
        let int = |k: &str| st.get(k).and_then(Value::as_i64).unwrap_or(0);
        let (current, base) = (int("current"), int("base"));
        let (gpu_nodes, empty) =
            (u32::try_from(int("gpuNodes")).unwrap_or(0), u32::try_from(int("empty")).unwrap_or(0));
        let motion = headroom::pool_motion(current, capacity::PoolNodes { gpu_nodes, empty });
        let removable = motion.removable;
        assert!(motion.leaving <= empty);
        // What is already leaving (nodes beyond spec.replicas) is never removable again.
        let leaving = i64::from(gpu_nodes).saturating_sub(current).max(0);
        let launching = current.saturating_sub(i64::from(gpu_nodes)).max(0);
        assert!(i64::from(removable) <= (i64::from(empty) - leaving).max(0).saturating_add(launching));
        let needs: Vec<i64> = st
            .get("needs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|n| {
                let n = u32::try_from(n.as_u64()?).ok()?;
                let ask = headroom::StaticAsk { desired: n, placed: n / 2, fits_now: n / 3, per_node: n % 7 };
                let need = ask.need(n % 5, empty);
                // Leaving nodes take room away: never a smaller need than with all of it.
                assert!(need >= ask.need(n % 5, 0));
                Some(need)
            })
            .collect();
        let limit = st.get("limit").and_then(Value::as_i64);
        let size = headroom::static_pool_replicas(current, base, &needs, removable, limit);
        if needs.iter().any(|n| *n > 0) {
            assert!(size >= current, "{size} < {current} with a need");
            assert!(limit.is_none_or(|l| size <= l.max(current)), "{size} past limits.nodes {limit:?} from {current}");
        } else {
            assert!(size <= current && size >= current.min(base), "{size} from {current}, base {base}");
            assert!(current - size <= i64::from(removable));
        }
        let mut stab = headroom::Stabilizer::default();
        let held = stab.apply(int("at").unsigned_abs(), size);
        assert_eq!(held, size);
    }
    // The Lease holder's merge of its peers' plans: never its own, the largest plan each.
    if let Some(reports) = doc.get("peers").and_then(|v| serde_json::from_value::<Vec<peers::PeerReport>>(v.clone()).ok()) {
        let merged = peers::merge("prescale-0", &reports);
        for (id, a) in &merged {
            assert_ne!(a.from, "prescale-0");
            let top = reports
                .iter()
                .filter(|r| r.identity != "prescale-0")
                .flat_map(|r| r.plans.iter().take(peers::MAX_PLANS))
                .filter(|p| p.namespace == id.namespace && p.name == id.name)
                .filter(|p| p.age_seconds.is_finite() && p.age_seconds >= 0.0)
                .map(|p| p.desired)
                .max();
            assert_eq!(Some(a.desired), top, "{id}");
        }
    }
    let ready = pods.iter().filter(|p| warmup::pod_is_ready(p)).count();
    let spec_replicas = doc.get("specReplicas").and_then(Value::as_u64).map(|n| n as u32);
    let fleet = PlannedFleet::from_pods(ready, pods.len(), spec_replicas);
    assert!(fleet.ready as usize <= ready);

    let Some(template) = doc.get("template").and_then(|t| serde_json::from_value::<PodTemplateSpec>(t.clone()).ok())
    else {
        return;
    };
    let labels = BTreeMap::from([("app".to_string(), "vllm".to_string())]);
    let Ok(info) = target::from_template("Deployment", "llm", "ns", Some(labels), &template) else { return };
    assert!(info.gpu_requests.values().all(|v| *v > 0));
    let fit = capacity::fit(&info.gpu_requests, &info.placement, &nodes, &caps);
    assert!(fit.eligible_nodes <= nodes.len());
    let _ = capacity::mig_warnings(&info.gpu_requests, &info.placement, &nodes);
    let running: Vec<String> = caps.iter().filter_map(|c| c.nodepool.clone()).collect();
    for p in target::target_pools(&info, &nodepools, &running) {
        assert!(nodepools.iter().any(|n| n.metadata.name.clone().unwrap_or_default() == p.name));
    }
    let id = ScalerId { namespace: "ns".into(), name: "so".into() };
    let pod = headroom::placeholder_pod(&id, &info, 3, "uid-1", "registry.k8s.io/pause:3.10");
    assert!(pod.metadata.name.as_ref().is_some_and(|n| n.len() <= 253));
});
