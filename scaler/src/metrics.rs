//! The scaler's own Prometheus metrics (served on `/metrics`), via `prometheus-client`.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};

use crate::sources::exposition::escape_label_value;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// A metric's label set. Each value is escaped as the text format requires (a backslash, `"`
/// and a line feed become `\\`, `\"` and `\n`) when the page is encoded: prometheus-client
/// 0.24 writes label values as given, and one `"` in a label (a source's, which names a vLLM
/// model in quotes or quotes a PromQL query; a ScaledObject name from any gRPC client) made the
/// whole page unparseable for Prometheus, which then dropped every prescale series.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Labels(Vec<(&'static str, String)>);

impl Labels {
    /// `namespace` and `scaledobject`: the labels of every per-ScaledObject series.
    pub fn scaled_object(id: &crate::config::ScalerId) -> Self {
        Self(vec![("namespace", id.namespace.clone()), ("scaledobject", id.name.clone())])
    }
}

impl From<Vec<(&'static str, String)>> for Labels {
    fn from(pairs: Vec<(&'static str, String)>) -> Self {
        Self(pairs)
    }
}

impl EncodeLabelSet for Labels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        let escaped: Vec<(&'static str, String)> = self.0.iter().map(|(k, v)| (*k, escape_label_value(v))).collect();
        escaped.encode(encoder)
    }
}

pub struct Metrics {
    registry: Registry,
    pub grpc_requests: Family<Labels, Counter>,
    pub grpc_latency: Family<Labels, Histogram>,
    pub source_polls: Family<Labels, Counter>,
    pub source_errors: Family<Labels, Counter>,
    pub source_latency: Family<Labels, Histogram>,
    pub demand: Family<Labels, Gauge<f64, AtomicU64>>,
    /// What the planner observed (demand, or the arrival rate over `capacityPerReplica` when
    /// larger): the history `serve --history-prometheus` warms a restarted replica from.
    pub observed_demand: Family<Labels, Gauge<f64, AtomicU64>>,
    /// What KEDA or the HPA is answered.
    pub planned: Family<Labels, Gauge<i64>>,
    /// What the planner decided, in any mode where it runs (absent while it does not).
    pub planner: Family<Labels, Gauge<i64>>,
    /// What the reactive rule asks (always computed once the ScaledObject has a reading).
    pub reactive: Family<Labels, Gauge<i64>>,
    /// Share of the requests vLLM scheduled over the last poll after waiting past `sloSeconds`.
    pub queue_late_share: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Requests vLLM scheduled for the ScaledObject's pods, and of them those that had waited
    /// longer than `sloSeconds`: request-weighted lateness over any span with `rate()`.
    pub queue_scheduled: Family<Labels, Counter<f64, AtomicU64>>,
    pub queue_late: Family<Labels, Counter<f64, AtomicU64>>,
    pub scaled_objects: Gauge<i64>,
    pub pollers: Gauge<i64>,
    pub connections: Family<Labels, Gauge<i64>>,
    // --- cluster integration (crate::cluster) ---
    /// Measured warm-up quantiles per target (`quantile` label: 0.5, 0.9, 0.99; `phase`: pod or node).
    pub warmup_seconds: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Number of warm-up samples per target and phase.
    pub warmup_samples: Family<Labels, Gauge<i64>>,
    /// Free GPU/MIG capacity per NodePool and resource.
    pub gpu_free: Family<Labels, Gauge<i64>>,
    /// Replicas of a target that fit on existing nodes now.
    pub fit_replicas: Family<Labels, Gauge<i64>>,
    /// Headroom placeholder pods wanted per target.
    pub headroom_pods: Family<Labels, Gauge<i64>>,
    /// 1 while this replica holds the Lease (the one writer).
    pub leader: Gauge<i64>,
    /// The Lease holder's last read of the other replicas' plans, by result (`ok`, `error`).
    pub peers: Family<Labels, Gauge<i64>>,
    /// ScaledObjects the Lease holder follows from other replicas' plans.
    pub adopted: Gauge<i64>,
}

fn latency_hist() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.5, 14))
}

fn poll_hist() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("prescale");
        let grpc_requests = Family::<Labels, Counter>::default();
        let grpc_latency = Family::<Labels, Histogram>::new_with_constructor(latency_hist as fn() -> Histogram);
        let source_polls = Family::<Labels, Counter>::default();
        let source_errors = Family::<Labels, Counter>::default();
        let source_latency = Family::<Labels, Histogram>::new_with_constructor(poll_hist as fn() -> Histogram);
        let demand = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let observed_demand = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let planned = Family::<Labels, Gauge<i64>>::default();
        let planner = Family::<Labels, Gauge<i64>>::default();
        let reactive = Family::<Labels, Gauge<i64>>::default();
        let queue_late_share = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let queue_scheduled = Family::<Labels, Counter<f64, AtomicU64>>::default();
        let queue_late = Family::<Labels, Counter<f64, AtomicU64>>::default();
        let scaled_objects = Gauge::<i64>::default();
        let pollers = Gauge::<i64>::default();
        let connections = Family::<Labels, Gauge<i64>>::default();
        let warmup_seconds = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let warmup_samples = Family::<Labels, Gauge<i64>>::default();
        let gpu_free = Family::<Labels, Gauge<i64>>::default();
        let fit_replicas = Family::<Labels, Gauge<i64>>::default();
        let headroom_pods = Family::<Labels, Gauge<i64>>::default();
        let leader = Gauge::<i64>::default();
        let peers = Family::<Labels, Gauge<i64>>::default();
        let adopted = Gauge::<i64>::default();
        registry.register("grpc_requests", "gRPC calls by method and status code", grpc_requests.clone());
        registry.register("grpc_request_duration_seconds", "gRPC handler latency by method", grpc_latency.clone());
        registry.register("source_polls", "Source reads by source", source_polls.clone());
        registry.register("source_poll_errors", "Failed source reads by source", source_errors.clone());
        registry.register("source_poll_duration_seconds", "Source read latency by kind", source_latency.clone());
        registry.register("demand_replicas", "Demand in replica-equivalents per ScaledObject", demand.clone());
        registry.register(
            "observed_demand_replicas",
            "Demand the planner observed per ScaledObject, replica-equivalents (its warm-start history)",
            observed_demand.clone(),
        );
        registry.register(
            "planned_replicas",
            "Replicas answered to KEDA or the HPA per ScaledObject (the planner's in mode predictive, else the reactive rule's)",
            planned.clone(),
        );
        registry.register(
            "planner_replicas",
            "Replicas the planner decided per ScaledObject, whichever mode answers (in mode shadow: what it would have answered)",
            planner.clone(),
        );
        registry.register(
            "reactive_replicas",
            "Replicas the reactive rule (ceil of the demand in replica-equivalents) asks per ScaledObject",
            reactive.clone(),
        );
        registry.register(
            "queue_late_share",
            "Share of the requests vLLM scheduled over the last poll that had waited longer than sloSeconds, per ScaledObject",
            queue_late_share.clone(),
        );
        registry.register(
            "queue_scheduled_requests",
            "Requests vLLM scheduled from its queue, per ScaledObject (from vllm:request_queue_time_seconds)",
            queue_scheduled.clone(),
        );
        registry.register(
            "queue_late_requests",
            "Requests vLLM scheduled after they had waited longer than sloSeconds, per ScaledObject",
            queue_late.clone(),
        );
        registry.register("scaled_objects", "ScaledObjects currently tracked", scaled_objects.clone());
        registry.register("pollers", "Distinct source polls currently running", pollers.clone());
        registry.register("source_connections", "Open connections to sources by kind", connections.clone());
        registry.register(
            "warmup_seconds",
            "Measured warm-up quantiles per target (pod: creation to Ready; node: node creation to Ready)",
            warmup_seconds.clone(),
        );
        registry.register("warmup_samples", "Measured warm-up samples per target", warmup_samples.clone());
        registry.register("gpu_free", "Free GPU/MIG capacity per NodePool and resource", gpu_free.clone());
        registry.register(
            "fit_replicas",
            "Replicas of the target that fit on existing nodes now",
            fit_replicas.clone(),
        );
        registry.register("headroom_pods", "Headroom placeholder pods wanted per target", headroom_pods.clone());
        registry.register("leader", "1 while this replica holds the prescale Lease", leader.clone());
        registry.register(
            "peers",
            "Replicas whose plans the Lease holder read (ok) or could not read (error) in its last round",
            peers.clone(),
        );
        registry.register(
            "adopted_scaled_objects",
            "ScaledObjects the Lease holder writes for from other replicas' plans",
            adopted.clone(),
        );
        Self {
            registry,
            grpc_requests,
            grpc_latency,
            source_polls,
            source_errors,
            source_latency,
            demand,
            observed_demand,
            planned,
            planner,
            reactive,
            queue_late_share,
            queue_scheduled,
            queue_late,
            scaled_objects,
            pollers,
            connections,
            warmup_seconds,
            warmup_samples,
            gpu_free,
            fit_replicas,
            headroom_pods,
            leader,
            peers,
            adopted,
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every sample name `/metrics` can carry (a family is encoded once it has a child), and
    /// each histogram's family name.
    fn every_name() -> BTreeSet<String> {
        let m = Metrics::new();
        let l: Labels = vec![("k", "v".to_string())].into();
        for f in [&m.grpc_requests, &m.source_polls, &m.source_errors] {
            f.get_or_create(&l).inc();
        }
        for f in [&m.queue_scheduled, &m.queue_late] {
            f.get_or_create(&l).inc_by(1.0);
        }
        for f in [&m.grpc_latency, &m.source_latency] {
            f.get_or_create(&l).observe(1.0);
        }
        for f in [&m.demand, &m.observed_demand, &m.queue_late_share, &m.warmup_seconds] {
            f.get_or_create(&l).set(1.0);
        }
        for f in [
            &m.planned,
            &m.planner,
            &m.reactive,
            &m.connections,
            &m.warmup_samples,
            &m.gpu_free,
            &m.fit_replicas,
            &m.headroom_pods,
            &m.peers,
        ] {
            f.get_or_create(&l).set(1);
        }
        let samples: BTreeSet<String> = m
            .render()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_string())
            .collect();
        // A histogram is also named by its family (`…_seconds` for `…_seconds_bucket`).
        let families = samples.iter().filter_map(|n| n.strip_suffix("_bucket")).map(String::from).collect::<Vec<_>>();
        samples.into_iter().chain(families).collect()
    }

    /// A label value with quotes, backslashes and a line feed (a source naming a vLLM model
    /// in quotes, a PromQL query) is written escaped, and the page reads back to the value.
    #[test]
    fn label_values_are_escaped_so_the_page_parses() {
        let m = Metrics::new();
        let source = "prometheus sum(rate(x{job=\"a\\b\"}[1m]))\nvllm model \"meta-llama/x\"".to_string();
        let l: Labels = vec![("kind", "prometheus".to_string()), ("source", source.clone())].into();
        m.source_polls.get_or_create(&l).inc();
        let page = m.render();
        let line = page.lines().find(|l| l.starts_with("prescale_source_polls_total")).unwrap();
        assert!(
            line.contains(r#"source="prometheus sum(rate(x{job=\"a\\b\"}[1m]))\nvllm model \"meta-llama/x\"""#),
            "{line}"
        );
        let series = crate::sources::exposition::parse(&page).unwrap();
        let read = series.iter().find(|s| s.name == "prescale_source_polls_total").unwrap();
        assert_eq!(read.labels["source"], source);
        assert_eq!(escape_label_value("plain ascii-_./:"), "plain ascii-_./:");
    }

    /// The `prescale_*` words of a text (metric names, and anything else so spelt).
    fn prescale_words(text: &str) -> BTreeSet<String> {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("prescale_") && w.len() > "prescale_".len())
            .map(String::from)
            .collect()
    }

    #[test]
    fn the_alerts_and_docs_name_only_metrics_that_are_exported() {
        let names = every_name();
        assert!(names.contains("prescale_source_polls_total") && names.contains("prescale_leader"), "{names:?}");
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        for path in [
            "deploy/helm/prescale/templates/prometheusrule.yaml",
            "tests/alerts/prescale.test.yaml",
            "deploy/helm/prescale/dashboards/prescale.json",
            "deploy/helm/prescale/README.md",
            "README.md",
        ] {
            let text = std::fs::read_to_string(format!("{root}/{path}")).unwrap();
            let words = prescale_words(&text);
            let unknown: Vec<_> = words.iter().filter(|w| !names.contains(*w)).collect();
            assert!(unknown.is_empty(), "{path} names metrics prescale does not export: {unknown:?}");
        }
    }
}
