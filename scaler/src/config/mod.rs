//! Trigger metadata → typed configuration, parsed once per distinct
//! (namespace, name, metadata). Every error names the key, the (redacted) value and
//! the ScaledObject.

mod keys;
mod reader;

pub use keys::{markdown_table, KeyDoc, KEDA_KEYS, KEYS};
pub use reader::Metadata;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::sources::SourceConfig;

/// `namespace/name` of a ScaledObject (all KEDA tells us about it besides metadata).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ScalerId {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ScalerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One bad key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("ScaledObject {scaled_object}: {}{reason}", value_part(.key, .value))]
pub struct ConfigError {
    pub scaled_object: String,
    pub key: String,
    /// The offending value, already redacted; `None` when the key is missing.
    pub value: Option<String>,
    pub reason: String,
}

fn value_part(key: &str, value: &Option<String>) -> String {
    match value {
        Some(v) => format!("key \"{key}\" = \"{v}\": "),
        None => format!("key \"{key}\": "),
    }
}

/// Every error found in one metadata map (a parse reports all of them, not the first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
pub struct ConfigErrors(pub Vec<ConfigError>);

/// How the answer to KEDA is produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The warm-up-aware planner's replicas (default).
    Predictive,
    /// Answer reactively; compute and expose what the planner would have done.
    Shadow,
    /// Answer reactively only: `ceil(max(value / perReplica))`.
    Reactive,
}

/// Warm-up: a fixed number of seconds, or measured from the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Warmup {
    Seconds(f64),
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ForecastModel {
    Auto,
    Smoothing,
    HoltWinters,
    SeasonalNaive,
}

/// Planner settings shared by every source of one ScaledObject.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannerSettings {
    pub mode: Mode,
    pub warmup: Warmup,
    /// Requests/s one replica serves at SLO; when absent, demand is planned in
    /// replica-equivalents of the signals.
    pub capacity_per_replica: Option<f64>,
    pub slo_seconds: f64,
    pub scale_to_zero: bool,
    pub forecast_model: ForecastModel,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// The HPA's tolerance: a change within it of the current count is dropped by the HPA.
    pub hpa_tolerance: f64,
}

/// The typed configuration of one ScaledObject trigger.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScalerConfig {
    pub id: ScalerId,
    pub metric_name: String,
    #[serde(with = "secs")]
    pub sample: Duration,
    #[serde(with = "secs")]
    pub stale_after: Duration,
    #[serde(with = "secs")]
    pub source_timeout: Duration,
    pub sources: Vec<SourceConfig>,
    pub planner: PlannerSettings,
    /// Cluster integration (Karpenter headroom); see `crate::cluster`.
    pub cluster: ClusterSettings,
}

/// What prescale may write for Karpenter (`karpenterMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KarpenterMode {
    Off,
    Annotate,
    Headroom,
}

/// Per-ScaledObject settings of the cluster integration (group "cluster").
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSettings {
    pub karpenter_mode: KarpenterMode,
    pub resize_static_node_pools: bool,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self { karpenter_mode: KarpenterMode::Annotate, resize_static_node_pools: false }
    }
}

fn parse_cluster(md: &mut Metadata<'_>) -> Option<ClusterSettings> {
    let karpenter_mode = md.choice("karpenterMode", "annotate", &["off", "annotate", "headroom"]).map(|m| match m {
        "off" => KarpenterMode::Off,
        "headroom" => KarpenterMode::Headroom,
        _ => KarpenterMode::Annotate,
    });
    let resize_static_node_pools = md.bool("karpenterResizeStaticNodePools", false);
    Some(ClusterSettings { karpenter_mode: karpenter_mode?, resize_static_node_pools: resize_static_node_pools? })
}

mod secs {
    pub fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// Parse a trigger's metadata. `id` is the ScaledObject the metadata came from.
pub fn parse(id: &ScalerId, metadata: &BTreeMap<String, String>) -> Result<ScalerConfig, ConfigErrors> {
    let mut md = Metadata::new(id, metadata);
    let cfg = parse_with(&mut md);
    md.finish(cfg)
}

fn parse_with(md: &mut Metadata<'_>) -> Option<ScalerConfig> {
    // KEDA's own keys are accepted and ignored.
    for k in KEDA_KEYS {
        md.consume(k);
    }
    let metric_name = match md.string("metricName") {
        Some(v) => {
            let ok = !v.is_empty()
                && v.len() <= 63
                && v.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !ok {
                md.error(
                    "metricName",
                    Some(&v),
                    "must be 1-63 characters of [a-z0-9-] (the HPA lowercases metric names)",
                );
            }
            v
        }
        None => "prescale-replicas".to_string(),
    };
    let sample = md.duration_secs("sampleSeconds", 5.0, 1.0, 3600.0);
    let stale_after = md.duration_secs("staleAfterSeconds", 30.0, 1.0, 86_400.0);
    let source_timeout = md.duration_secs("sourceTimeoutSeconds", 2.0, 0.1, 60.0);
    if let (Some(s), Some(st)) = (sample, stale_after) {
        if st < s {
            md.error(
                "staleAfterSeconds",
                Some(&format!("{}", st.as_secs_f64())),
                &format!(
                    "must be at least sampleSeconds ({}), or every signal is stale between polls",
                    s.as_secs_f64()
                ),
            );
        }
    }

    let planner = parse_planner(md);
    // What the sources read of the keys above and the planner's (when one of them does not
    // parse, the ScaledObject is rejected and these stand-ins are never used).
    let common = crate::sources::CommonKeys {
        source_timeout: source_timeout.unwrap_or_default(),
        slo_s: planner.as_ref().map_or(0.0, |p| p.slo_seconds),
    };
    let sources = crate::sources::parse_all(md, common);
    let cluster = parse_cluster(md);
    Some(ScalerConfig {
        id: md.id().clone(),
        metric_name,
        sample: sample?,
        stale_after: stale_after?,
        source_timeout: source_timeout?,
        sources,
        planner: planner?,
        cluster: cluster?,
    })
}

fn parse_planner(md: &mut Metadata<'_>) -> Option<PlannerSettings> {
    let mode = md.choice("mode", "predictive", &["predictive", "shadow", "reactive"]).map(|m| match m {
        "shadow" => Mode::Shadow,
        "reactive" => Mode::Reactive,
        _ => Mode::Predictive,
    });
    let warmup = match md.string("warmupSeconds") {
        None => Some(Warmup::Seconds(180.0)),
        Some(v) if v.trim().eq_ignore_ascii_case("auto") => Some(Warmup::Auto),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && (0.0..=7200.0).contains(&x) => Some(Warmup::Seconds(x)),
            _ => {
                md.error("warmupSeconds", Some(&v), "expected a number of seconds in [0, 7200] or \"auto\"");
                None
            }
        },
    };
    let capacity_per_replica = md.opt_positive_f64("capacityPerReplica");
    let slo_seconds = md.f64_in("sloSeconds", 5.0, 0.0, 86_400.0, false);
    let scale_to_zero = md.bool("scaleToZero", false);
    let forecast_model =
        md.choice("forecastModel", "auto", &["auto", "smoothing", "holtWinters", "seasonalNaive"]).map(|m| match m {
            "smoothing" => ForecastModel::Smoothing,
            "holtWinters" => ForecastModel::HoltWinters,
            "seasonalNaive" => ForecastModel::SeasonalNaive,
            _ => ForecastModel::Auto,
        });
    let min_replicas = md.u32("minReplicas", 0);
    let max_replicas = md.u32("maxReplicas", 100);
    let hpa_tolerance = md.f64_in("hpaTolerance", 0.1, 0.0, 0.99, false);
    if let (Some(lo), Some(hi)) = (min_replicas, max_replicas) {
        if hi == 0 || lo > hi {
            md.error(
                "maxReplicas",
                Some(&hi.to_string()),
                &format!("must be at least 1 and at least minReplicas ({lo})"),
            );
        }
    }
    Some(PlannerSettings {
        mode: mode?,
        warmup: warmup?,
        capacity_per_replica: capacity_per_replica?,
        slo_seconds: slo_seconds?,
        scale_to_zero: scale_to_zero?,
        forecast_model: forecast_model?,
        min_replicas: min_replicas?,
        max_replicas: max_replicas?,
        hpa_tolerance: hpa_tolerance?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> ScalerId {
        ScalerId { namespace: "ns".into(), name: "so".into() }
    }

    #[test]
    fn parsers_read_exactly_the_documented_keys() {
        // Every documented key at its example value: the parsers must read each of them,
        // and read nothing undocumented.
        let map: BTreeMap<String, String> = KEYS.iter().map(|d| (d.key.to_string(), d.example.to_string())).collect();
        let so = id();
        let mut md = Metadata::new(&so, &map);
        let _ = parse_with(&mut md);
        let consumed = md.consumed().clone();
        for d in KEYS {
            assert!(consumed.contains(d.key), "documented key {} is never read by a parser", d.key);
        }
        for k in &consumed {
            assert!(
                KEYS.iter().any(|d| d.key == k) || KEDA_KEYS.contains(&k.as_str()),
                "parser reads undocumented key {k}"
            );
        }
    }

    #[test]
    fn every_example_value_is_valid_on_its_own() {
        // Each key's example parses in a minimal valid config of its group.
        let base_rabbit = [("rabbitmqHost", "amqp://h:5672/%2f"), ("rabbitmqQueueName", "q")];
        let base_kafka = [("kafkaBootstrapServers", "k:9092"), ("kafkaConsumerGroup", "g"), ("kafkaTopic", "t")];
        let base_sqs = [("sqsQueueURL", "https://sqs.r.amazonaws.com/1/q"), ("sqsAwsRegion", "r")];
        let base_prom =
            [("prometheusServerAddress", "http://p:9090"), ("prometheusQuery", "up"), ("prometheusPerReplica", "1")];
        let base_vllm = [("vllmEndpoints", "127.0.0.1:8000")];
        let base_dcgm = [("dcgmEndpoints", "127.0.0.1:9400")];
        for d in KEYS {
            let base: &[(&str, &str)] = match d.group {
                "prometheus" => &base_prom,
                "kafka" => &base_kafka,
                "sqs" => &base_sqs,
                "vllm" => &base_vllm,
                "dcgm" => &base_dcgm,
                _ => &base_rabbit,
            };
            let mut map: BTreeMap<String, String> = base.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            match d.key {
                "rabbitmqHostFromEnv" => {
                    map.remove("rabbitmqHost");
                }
                "sqsQueueURLFromEnv" => {
                    map.remove("sqsQueueURL");
                }
                "kafkaUsernameFromEnv" | "kafkaPasswordFromEnv" => {
                    map.insert("kafkaSasl".into(), "plaintext".into());
                    map.insert("kafkaUsernameFromEnv".into(), "u".into());
                    map.insert("kafkaPasswordFromEnv".into(), "p".into());
                }
                "vllmService" | "vllmPort" => {
                    map.remove("vllmEndpoints");
                    map.insert("vllmService".into(), "llama".into());
                }
                "dcgmPrometheus" | "dcgmPrometheusCustomHeaders" | "dcgmPrometheusBearerTokenFromEnv" => {
                    map.remove("dcgmEndpoints");
                    map.insert("dcgmPrometheus".into(), "http://prometheus:9090".into());
                }
                _ => {}
            }
            map.insert(d.key.to_string(), d.example.to_string());
            if let Err(e) = parse(&id(), &map) {
                panic!("example of {} ({:?}) does not parse: {e}", d.key, d.example);
            }
        }
    }

    #[test]
    fn readme_table_matches_the_parser() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
        let start =
            readme.find("<!-- keys:start -->").expect("README has <!-- keys:start -->") + "<!-- keys:start -->".len();
        let end = readme.find("<!-- keys:end -->").expect("README has <!-- keys:end -->");
        let block = readme[start..end].trim();
        assert_eq!(
            block,
            markdown_table().trim(),
            "README metadata table is out of date: run `prescale keys` and paste it"
        );
    }

    #[test]
    fn unknown_keys_are_all_reported_with_a_hint() {
        let map: BTreeMap<String, String> = [
            ("rabbitmqHost", "amqp://h"),
            ("rabbitmqQueueName", "q"),
            ("rabitmqPerReplica", "3"),
            ("totallyUnknown", "x"),
            ("scalerAddress", "prescale:9090"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let errs = parse(&id(), &map).unwrap_err().0;
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].reason.contains("did you mean \"rabbitmqPerReplica\""), "{errs:?}");
        assert!(errs.iter().all(|e| e.scaled_object == "ns/so"));
    }

    /// Values that have broken parsers elsewhere: empty, padded, non-finite, out of range,
    /// overflowing, non-ASCII, credentials in URLs, lists with holes.
    const TRICKY: &[&str] = &[
        "",
        " ",
        "0",
        "-1",
        "1e308",
        "-0",
        "NaN",
        "inf",
        "-inf",
        "1e-320",
        "4294967296",
        "18446744073709551616",
        "0.0000001",
        "auto",
        "true",
        "TRUE",
        "yes",
        "shadow",
        "é",
        "\u{0}",
        "a,b,,c",
        ",",
        "host:99999",
        "amqp://u:secret@h:5672/%2f",
        "http://u:secret@p:9090",
        "[::1]:9092",
        "k:9092,k2:9092",
        "https://sqs.r.amazonaws.com/1/q",
        "sum(rate(x[1m]))",
        "{\"a\":1}",
        "X-A=1,X-B",
        "1h",
        "300",
        "0.5",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn any_metadata_parses_or_names_its_bad_keys(
            picks in proptest::collection::vec((0..KEYS.len() + 3, 0..TRICKY.len() + 1), 0..12),
        ) {
            // Documented keys (and three unknown ones) at tricky values or their examples:
            // never a panic; every error names the ScaledObject and a key that is in the map
            // or documented (a missing required key), and says why.
            let unknown = ["rabbitmqHostt", "", "prometheusQuery "];
            let map: BTreeMap<String, String> = picks
                .iter()
                .map(|&(k, v)| {
                    let key = KEYS.get(k).map(|d| d.key).unwrap_or_else(|| unknown[k - KEYS.len()]);
                    let value = TRICKY.get(v).copied().unwrap_or_else(|| KEYS.get(k).map(|d| d.example).unwrap_or("x"));
                    (key.to_string(), value.to_string())
                })
                .collect();
            if let Err(errs) = parse(&id(), &map) {
                proptest::prop_assert!(!errs.0.is_empty());
                for e in &errs.0 {
                    proptest::prop_assert_eq!(&e.scaled_object, "ns/so");
                    proptest::prop_assert!(
                        map.contains_key(&e.key) || KEYS.iter().any(|d| d.key == e.key),
                        "error names key {:?}, neither given nor documented: {}", e.key, e
                    );
                    proptest::prop_assert!(!e.reason.trim().is_empty(), "{}", e);
                    proptest::prop_assert!(!e.to_string().contains("secret"), "credentials in {}", e);
                }
            }
        }
    }

    #[test]
    fn stale_after_must_cover_the_sample_period() {
        let map: BTreeMap<String, String> = [
            ("rabbitmqHost", "amqp://h"),
            ("rabbitmqQueueName", "q"),
            ("sampleSeconds", "30"),
            ("staleAfterSeconds", "10"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let errs = parse(&id(), &map).unwrap_err().0;
        assert_eq!(errs[0].key, "staleAfterSeconds");
    }
}
