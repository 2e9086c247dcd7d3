//! One writer: leader election with a `coordination.k8s.io/v1` Lease. Only the holder
//! writes (placeholder pods, NodePool annotations and resizes); every replica keeps
//! answering KEDA. Updates use the Lease's resourceVersion, so two candidates racing for
//! an expired Lease cannot both win (the loser gets 409 Conflict).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

use super::ClusterError;

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub duration: Duration,
    /// How often the holder renews / candidates retry.
    pub retry: Duration,
}

/// What to do with the Lease as read.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Create,
    Renew,
    /// The holder stopped renewing (or released it): take it over.
    TakeOver {
        previous: Option<String>,
    },
    Follow {
        holder: String,
    },
}

/// Decide from the Lease's spec (`None`: no Lease yet) at `now_s` (unix seconds).
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now_s: f64) -> Step {
    let Some(spec) = spec else { return Step::Create };
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    if holder.as_deref() == Some(identity) {
        return Step::Renew;
    }
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()).map(|t| t.0.as_millisecond() as f64 / 1000.0);
    let duration = f64::from(spec.lease_duration_seconds.unwrap_or(15).max(1));
    match (holder, renewed) {
        (Some(h), Some(r)) if now_s < r + duration => Step::Follow { holder: h },
        (previous, _) => Step::TakeOver { previous },
    }
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// One election round: returns whether this replica holds the Lease afterwards, and the
/// current holder.
pub async fn round(client: &kube::Client, cfg: &LeaseConfig) -> Result<(bool, Option<String>), ClusterError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let existing = api
        .get_opt(&cfg.name)
        .await
        .map_err(|e| ClusterError::api(format!("get Lease {}/{}", cfg.namespace, cfg.name), e))?;
    let now_s =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let step = decide(existing.as_ref().and_then(|l| l.spec.as_ref()), &cfg.identity, now_s);
    let secs = i32::try_from(cfg.duration.as_secs()).unwrap_or(15).max(1);
    let pp = PostParams { field_manager: Some("prescale".into()), ..Default::default() };
    let conflict = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 409);
    match step {
        Step::Follow { holder } => Ok((false, Some(holder))),
        Step::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(micro_now()),
                    renew_time: Some(micro_now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match api.create(&pp, &lease).await {
                Ok(_) => Ok((true, Some(cfg.identity.clone()))),
                Err(e) if conflict(&e) => Ok((false, None)),
                Err(e) => Err(ClusterError::api(format!("create Lease {}/{}", cfg.namespace, cfg.name), e)),
            }
        }
        Step::Renew | Step::TakeOver { .. } => {
            let Some(mut lease) = existing else { return Ok((false, None)) };
            let mut spec = lease.spec.take().unwrap_or_default();
            if let Step::TakeOver { .. } = step {
                spec.acquire_time = Some(micro_now());
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.holder_identity = Some(cfg.identity.clone());
            spec.lease_duration_seconds = Some(secs);
            spec.renew_time = Some(micro_now());
            lease.spec = Some(spec);
            // `replace` carries metadata.resourceVersion: optimistic concurrency.
            match api.replace(&cfg.name, &pp, &lease).await {
                Ok(_) => Ok((true, Some(cfg.identity.clone()))),
                Err(e) if conflict(&e) => Ok((false, None)),
                Err(e) => Err(ClusterError::api(format!("update Lease {}/{}", cfg.namespace, cfg.name), e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(holder: &str, renew: &str, secs: i32) -> LeaseSpec {
        serde_json::from_value(json!({"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": secs}))
            .unwrap()
    }

    #[test]
    fn election_steps() {
        let t = |s: &str| s.parse::<k8s_openapi::jiff::Timestamp>().unwrap().as_millisecond() as f64 / 1000.0;
        assert_eq!(decide(None, "a", 0.0), Step::Create);
        let s = spec("a", "2026-01-01T00:00:00.000000Z", 15);
        assert_eq!(decide(Some(&s), "a", t("2026-01-01T00:00:30Z")), Step::Renew);
        assert_eq!(decide(Some(&s), "b", t("2026-01-01T00:00:10Z")), Step::Follow { holder: "a".into() });
        assert_eq!(
            decide(Some(&s), "b", t("2026-01-01T00:00:16Z")),
            Step::TakeOver { previous: Some("a".into()) },
            "expired"
        );
        assert_eq!(decide(Some(&LeaseSpec::default()), "b", 0.0), Step::TakeOver { previous: None }, "released");
    }
}
