//! Peers: the plans other prescale replicas make, so the Lease holder acts for all of them.
//!
//! KEDA keeps one pooled gRPC connection per scaler address, and behind a ClusterIP Service
//! that connection reaches one prescale pod, which need not hold the Lease. Only the holder
//! writes to the cluster, so without this the headroom, the NodePool hints and the static
//! pool sizes of every ScaledObject KEDA asks another replica about would never be written.
//! Each replica serves the plans of the ScaledObjects it is asked about on [`PATH`]; the
//! holder reads every ready endpoint of its own Service (`PRESCALE_PEERS_SERVICE`) on each
//! reconcile and adopts the targets it is not asked about itself. Peers are only read: the
//! one writer stays the Lease holder.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{ClusterSettings, KarpenterMode, ScalerId};
use crate::sources::vllm::{slice_bases, PortRef};

/// Where a replica serves its plans.
pub const PATH: &str = "/peers/plans";
/// At most this many plans are read from one peer.
pub const MAX_PLANS: usize = 10_000;

/// One ScaledObject's plan as the replica KEDA asks serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerPlan {
    pub namespace: String,
    pub name: String,
    pub karpenter_mode: KarpenterMode,
    pub resize_static_node_pools: bool,
    /// Desired replicas at now + warm-up.
    pub desired: u32,
    /// How long ago the replica made this plan.
    pub age_seconds: f64,
}

/// What one replica serves on [`PATH`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    /// The replica's Lease identity.
    pub identity: String,
    pub plans: Vec<PeerPlan>,
}

/// A target another replica plans, as the holder adopts it.
#[derive(Debug, Clone, PartialEq)]
pub struct Adopted {
    pub settings: ClusterSettings,
    pub desired: u32,
    /// Age of the plan (ms) when it was read.
    pub age_ms: u64,
    /// The identity of the replica whose plan is followed.
    pub from: String,
}

/// The plans to adopt from these reports: the holder's own report, nameless plans and ages
/// that are no duration are skipped. An old plan is adopted as it stands, as the holder's own
/// would be (a replica whose signal broke keeps its last plan until KEDA stops asking).
/// Where several replicas plan one ScaledObject (KEDA reached each in turn) the largest plan
/// is followed, with the settings of the youngest.
pub fn merge(own_identity: &str, reports: &[PeerReport]) -> BTreeMap<ScalerId, Adopted> {
    let mut out: BTreeMap<ScalerId, Adopted> = BTreeMap::new();
    for r in reports.iter().filter(|r| r.identity != own_identity) {
        for p in r.plans.iter().take(MAX_PLANS) {
            let aged = p.age_seconds.is_finite() && p.age_seconds >= 0.0;
            if !aged || p.namespace.is_empty() || p.name.is_empty() {
                continue;
            }
            let id = ScalerId { namespace: p.namespace.clone(), name: p.name.clone() };
            let a = Adopted {
                settings: ClusterSettings {
                    karpenter_mode: p.karpenter_mode,
                    resize_static_node_pools: p.resize_static_node_pools,
                },
                desired: p.desired,
                age_ms: (p.age_seconds * 1000.0) as u64,
                from: r.identity.clone(),
            };
            match out.get_mut(&id) {
                None => {
                    out.insert(id, a);
                }
                Some(have) => {
                    if a.age_ms < have.age_ms {
                        have.settings = a.settings;
                        have.age_ms = a.age_ms;
                    }
                    if a.desired > have.desired {
                        have.desired = a.desired;
                        have.from = a.from;
                    }
                }
            }
        }
    }
    out
}

/// The base URLs (`http://host:port`) of the ready endpoints of the replicas' Service.
pub async fn discover(
    client: &kube::Client,
    namespace: &str,
    service: &str,
    port: &PortRef,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let slices = crate::sources::slices::list(client.clone(), namespace, service, timeout).await?;
    Ok(slice_bases(&slices, port))
}

/// One replica's report.
pub async fn fetch(http: &reqwest::Client, base: &str, timeout: Duration) -> Result<PeerReport, String> {
    let url = format!("{base}{PATH}");
    let resp = http.get(&url).timeout(timeout).send().await.map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("GET {url}: HTTP {status}"));
    }
    resp.json::<PeerReport>().await.map_err(|e| format!("GET {url}: not a peer report: {e}"))
}

/// What the last round of reading the peers found, for `/debug/scalers`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeersView {
    /// `namespace/service` whose endpoints are read, or why none is.
    pub service: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub peers: Vec<PeerView>,
    /// ScaledObjects adopted from peers.
    pub adopted: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeerView {
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    pub plans: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(ns: &str, name: &str, desired: u32, age: f64, mode: KarpenterMode) -> PeerPlan {
        PeerPlan {
            namespace: ns.into(),
            name: name.into(),
            karpenter_mode: mode,
            resize_static_node_pools: false,
            desired,
            age_seconds: age,
        }
    }

    #[test]
    fn the_holder_adopts_the_plans_of_other_replicas_and_the_largest_where_two_plan_one() {
        let reports = vec![
            PeerReport { identity: "me".into(), plans: vec![plan("llm", "mine", 9, 1.0, KarpenterMode::Headroom)] },
            PeerReport {
                identity: "a".into(),
                plans: vec![
                    plan("llm", "llama", 4, 2.0, KarpenterMode::Headroom),
                    plan("llm", "inf", 4, f64::INFINITY, KarpenterMode::Headroom),
                    plan("llm", "nan", 4, f64::NAN, KarpenterMode::Headroom),
                    plan("llm", "future", 4, -1.0, KarpenterMode::Headroom),
                    plan("", "nameless", 4, 1.0, KarpenterMode::Headroom),
                ],
            },
            PeerReport {
                identity: "b".into(),
                plans: vec![
                    plan("llm", "llama", 6, 5.0, KarpenterMode::Annotate),
                    plan("llm", "old", 2, 3_600.0, KarpenterMode::Annotate),
                ],
            },
        ];
        let m = merge("me", &reports);
        let ids: Vec<String> = m.keys().map(ToString::to_string).collect();
        assert_eq!(ids, vec!["llm/llama", "llm/old"], "{m:?}");
        assert_eq!(m[&ScalerId { namespace: "llm".into(), name: "old".into() }].age_ms, 3_600_000);
        let a = &m[&ScalerId { namespace: "llm".into(), name: "llama".into() }];
        assert_eq!(a.desired, 6, "the larger plan");
        assert_eq!(a.from, "b");
        assert_eq!(a.settings.karpenter_mode, KarpenterMode::Headroom, "settings of the younger plan");
        assert_eq!(a.age_ms, 2_000);
    }

    #[test]
    fn a_report_reads_back_from_its_json() {
        let r = PeerReport { identity: "p_1".into(), plans: vec![plan("ns", "so", 3, 0.5, KarpenterMode::Off)] };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"karpenterMode\":\"off\""), "{text}");
        assert_eq!(serde_json::from_str::<PeerReport>(&text).unwrap(), r);
        assert!(serde_json::from_str::<PeerReport>("{\"identity\":\"x\"}").is_err());
    }
}
