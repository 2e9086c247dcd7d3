//! Kafka consumer-group lag, with KEDA's kafka scaler semantics: per partition
//! `high watermark − committed offset`; `kafkaOffsetResetPolicy` for partitions with no
//! committed offset; `kafkaExcludePersistentLag`, `kafkaLimitToPartitionsWithLag`,
//! `kafkaAllowIdleConsumers`; the replica cap at the partition count.
//!
//! Sharing: one metadata/watermark client per bootstrap-server set (+ security), and one
//! committed-offset handle per consumer group on it (librdkafka's OffsetFetch is scoped
//! to the handle's `group.id`). The handle never subscribes, so it never joins the group.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::Serialize;

use super::{BoxFuture, Reading, Shared, Source, SourceError};
use crate::config::Metadata;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResetPolicy {
    Latest,
    Earliest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Security {
    pub sasl: String,
    #[serde(skip)]
    pub username: Option<String>,
    #[serde(skip)]
    pub password: Option<String>,
    pub tls: bool,
    pub unsafe_ssl: bool,
    pub ca_file: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KafkaConfig {
    pub bootstrap_servers: String,
    pub consumer_group: String,
    /// `None`: every topic the group has committed offsets for.
    pub topic: Option<String>,
    pub lag_threshold: f64,
    pub activation_lag_threshold: f64,
    pub offset_reset_policy: ResetPolicy,
    pub allow_idle_consumers: bool,
    pub limit_to_partitions_with_lag: bool,
    pub exclude_persistent_lag: bool,
    pub scale_to_zero_on_invalid_offset: bool,
    pub partition_limitation: Option<Vec<i32>>,
    pub security: Security,
}

/// "1,2,10-20" → [1, 2, 10, …, 20].
fn parse_partitions(s: &str) -> Result<Vec<i32>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (i32, i32) =
                    (a.trim().parse().map_err(|_| part.to_string())?, b.trim().parse().map_err(|_| part.to_string())?);
                if a > b || a < 0 || b - a > 100_000 {
                    return Err(part.to_string());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| part.to_string())?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl KafkaConfig {
    pub fn parse(md: &mut Metadata<'_>) -> Option<Self> {
        if !md.has_prefix("kafka") {
            return None;
        }
        let bootstrap = md.required("kafkaBootstrapServers", "host:port[,host:port]");
        let group = md.required("kafkaConsumerGroup", "the consumer group whose lag is read");
        let topic = md.string("kafkaTopic").filter(|t| !t.is_empty());
        let lag_threshold = md.f64_in("kafkaLagThreshold", 10.0, 0.0, f64::MAX, true);
        let activation = md.f64_in("kafkaActivationLagThreshold", 0.0, 0.0, f64::MAX, false);
        let reset = md.choice("kafkaOffsetResetPolicy", "latest", &["latest", "earliest"]);
        let allow_idle = md.bool("kafkaAllowIdleConsumers", false);
        let limit_lag = md.bool("kafkaLimitToPartitionsWithLag", false);
        let exclude_persistent = md.bool("kafkaExcludePersistentLag", false);
        let zero_invalid = md.bool("kafkaScaleToZeroOnInvalidOffset", false);
        let partitions = md.string("kafkaPartitionLimitation").filter(|s| !s.is_empty());
        let sasl = md.choice("kafkaSasl", "none", &["none", "plaintext", "scram_sha256", "scram_sha512"]);
        let username = md.string("kafkaUsernameFromEnv").filter(|s| !s.is_empty());
        let password = md.string("kafkaPasswordFromEnv").filter(|s| !s.is_empty());
        let tls = md.choice("kafkaTls", "disable", &["enable", "disable"]);
        let unsafe_ssl = md.bool("kafkaUnsafeSsl", false);
        let ca_file = md.string("kafkaCaFile").filter(|s| !s.is_empty());

        let partition_limitation = match partitions {
            None => None,
            Some(p) => match parse_partitions(&p) {
                Ok(v) if topic.is_some() => Some(v),
                Ok(_) => {
                    md.error("kafkaPartitionLimitation", Some(&p), "only applies together with kafkaTopic");
                    return None;
                }
                Err(bad) => {
                    md.error(
                        "kafkaPartitionLimitation",
                        Some(&p),
                        &format!("bad item \"{bad}\": expected ids and ranges like 1,2,10-20"),
                    );
                    return None;
                }
            },
        };
        if allow_idle == Some(true) && limit_lag == Some(true) {
            md.error(
                "kafkaLimitToPartitionsWithLag",
                Some("true"),
                "cannot be combined with kafkaAllowIdleConsumers (as in KEDA)",
            );
            return None;
        }
        let sasl = sasl?;
        if sasl != "none" && (username.is_none() || password.is_none()) {
            md.error(
                if username.is_none() { "kafkaUsernameFromEnv" } else { "kafkaPasswordFromEnv" },
                None,
                &format!("is required with kafkaSasl: {sasl}"),
            );
            return None;
        }
        if let Some(b) = &bootstrap {
            if b.split(',').any(|h| h.trim().rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_none()) {
                md.error("kafkaBootstrapServers", Some(b), "expected host:port[,host:port]");
                return None;
            }
        }
        Some(Self {
            bootstrap_servers: bootstrap?,
            consumer_group: group?,
            topic,
            lag_threshold: lag_threshold?,
            activation_lag_threshold: activation?,
            offset_reset_policy: if reset? == "earliest" { ResetPolicy::Earliest } else { ResetPolicy::Latest },
            allow_idle_consumers: allow_idle?,
            limit_to_partitions_with_lag: limit_lag?,
            exclude_persistent_lag: exclude_persistent?,
            scale_to_zero_on_invalid_offset: zero_invalid?,
            partition_limitation,
            security: Security {
                sasl: sasl.to_string(),
                username,
                password,
                tls: tls? == "enable",
                unsafe_ssl: unsafe_ssl?,
                ca_file,
            },
        })
    }

    pub fn label(&self) -> String {
        match &self.topic {
            Some(t) => {
                format!("kafka group \"{}\" on topic \"{t}\" at {}", self.consumer_group, self.bootstrap_servers)
            }
            None => format!("kafka group \"{}\" (all its topics) at {}", self.consumer_group, self.bootstrap_servers),
        }
    }

    pub fn per_replica(&self) -> f64 {
        self.lag_threshold
    }

    pub fn poll_key(&self) -> String {
        format!("kafka|{self:?}|{:?}|{:?}", self.security.username, self.security.password)
    }

    fn client_config(&self, group: Option<&str>) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers)
            .set("enable.auto.commit", "false")
            .set("socket.timeout.ms", "5000")
            .set("client.id", "prescale")
            .set("log_level", "3");
        if let Some(g) = group {
            c.set("group.id", g);
        }
        let s = &self.security;
        let proto = match (s.sasl.as_str(), s.tls) {
            ("none", false) => "plaintext",
            ("none", true) => "ssl",
            (_, false) => "sasl_plaintext",
            (_, true) => "sasl_ssl",
        };
        c.set("security.protocol", proto);
        match s.sasl.as_str() {
            "plaintext" => {
                c.set("sasl.mechanisms", "PLAIN");
            }
            "scram_sha256" => {
                c.set("sasl.mechanisms", "SCRAM-SHA-256");
            }
            "scram_sha512" => {
                c.set("sasl.mechanisms", "SCRAM-SHA-512");
            }
            _ => {}
        }
        if let (Some(u), Some(p)) = (&s.username, &s.password) {
            c.set("sasl.username", u).set("sasl.password", p);
        }
        if s.unsafe_ssl {
            c.set("enable.ssl.certificate.verification", "false");
        }
        if let Some(ca) = &s.ca_file {
            c.set("ssl.ca.location", ca);
        }
        c
    }

    fn connection_key(&self) -> String {
        format!("{}|{:?}", self.bootstrap_servers, self.security)
    }
}

/// Shared Kafka handles: per bootstrap set, one metadata client and one per group.
#[derive(Default)]
pub struct KafkaPool {
    clients: Mutex<HashMap<String, Arc<BaseConsumer>>>,
}

impl KafkaPool {
    fn get(
        &self,
        key: String,
        make: impl FnOnce() -> Result<BaseConsumer, SourceError>,
    ) -> Result<Arc<BaseConsumer>, SourceError> {
        let mut m = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = m.get(&key) {
            return Ok(c.clone());
        }
        let c = Arc::new(make()?);
        m.insert(key, c.clone());
        Ok(c)
    }

    /// Number of distinct Kafka client handles (the connections gauge).
    pub fn clients(&self) -> usize {
        self.clients.lock().unwrap_or_else(|e| e.into_inner()).values().filter(|c| Arc::strong_count(c) > 1).count()
    }

    /// Forget handles no source uses any more.
    pub fn gc(&self) {
        self.clients.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, c| Arc::strong_count(c) > 1);
    }
}

pub struct KafkaSource {
    cfg: KafkaConfig,
    pool: Arc<KafkaPool>,
    /// Handles, resolved lazily (creating one does no I/O, but keep construction cheap).
    handles: Mutex<Option<(Arc<BaseConsumer>, Arc<BaseConsumer>)>>,
    /// Committed offsets at the previous poll (for kafkaExcludePersistentLag).
    previous: Mutex<HashMap<(String, i32), i64>>,
}

/// Lag figures of one poll.
#[derive(Debug, Clone, PartialEq)]
pub struct Lag {
    /// The metric (after the persistent-lag exclusion and the partition cap).
    pub metric: f64,
    /// Total lag including persistent lag (activation).
    pub with_persistent: f64,
    pub partitions: usize,
    pub partitions_with_lag: usize,
}

/// One partition's offsets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartitionOffsets {
    pub high: i64,
    /// `None` when the group never committed on this partition.
    pub committed: Option<i64>,
    /// The committed offset did not move since the previous poll.
    pub unchanged: bool,
}

/// KEDA's lag maths over one poll's partitions.
pub fn compute_lag(cfg: &KafkaConfig, parts: &[PartitionOffsets]) -> Lag {
    let mut metric = 0.0;
    let mut with_persistent = 0.0;
    let mut with_lag = 0;
    for p in parts {
        let lag = match p.committed {
            None => match (cfg.offset_reset_policy, cfg.scale_to_zero_on_invalid_offset) {
                (_, true) => 0,
                (ResetPolicy::Latest, false) => 1,
                (ResetPolicy::Earliest, false) => p.high.max(0),
            },
            Some(c) => (p.high - c).max(0),
        } as f64;
        with_persistent += lag;
        if lag > 0.0 {
            with_lag += 1;
        }
        if cfg.exclude_persistent_lag && p.unchanged && p.committed.is_some() {
            continue;
        }
        metric += lag;
    }
    if !cfg.allow_idle_consumers {
        let upper = if cfg.limit_to_partitions_with_lag { with_lag } else { parts.len() } as f64;
        if (metric / cfg.lag_threshold).floor() > upper {
            metric = upper * cfg.lag_threshold;
        }
    }
    Lag { metric, with_persistent, partitions: parts.len(), partitions_with_lag: with_lag }
}

impl KafkaSource {
    pub fn new(cfg: KafkaConfig, shared: &Shared) -> Self {
        Self { cfg, pool: shared.kafka.clone(), handles: Mutex::new(None), previous: Mutex::new(HashMap::new()) }
    }

    fn handles(&self) -> Result<(Arc<BaseConsumer>, Arc<BaseConsumer>), SourceError> {
        let mut h = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = h.as_ref() {
            return Ok(h.clone());
        }
        let key = self.cfg.connection_key();
        let meta = self.pool.get(format!("meta|{key}"), || {
            self.cfg.client_config(Some("prescale-metadata")).create().map_err(SourceError::connect)
        })?;
        let group = self.pool.get(format!("group|{}|{key}", self.cfg.consumer_group), || {
            self.cfg.client_config(Some(&self.cfg.consumer_group)).create().map_err(SourceError::connect)
        })?;
        *h = Some((meta.clone(), group.clone()));
        Ok((meta, group))
    }

    /// Blocking: metadata, committed offsets, watermarks.
    fn read_blocking(&self, timeout: Duration) -> Result<Reading, SourceError> {
        let (meta, group) = self.handles()?;
        let md = meta.fetch_metadata(self.cfg.topic.as_deref(), timeout).map_err(SourceError::connect)?;
        let mut tpl = TopicPartitionList::new();
        for t in md.topics() {
            if t.name().starts_with("__") || t.error().is_some() {
                if let (Some(want), Some(e)) = (&self.cfg.topic, t.error()) {
                    if t.name() == want {
                        return Err(SourceError::NotFound(format!("topic \"{want}\": {e:?}")));
                    }
                }
                continue;
            }
            for p in t.partitions() {
                if let Some(lim) = &self.cfg.partition_limitation {
                    if !lim.contains(&p.id()) {
                        continue;
                    }
                }
                tpl.add_partition(t.name(), p.id());
            }
        }
        if tpl.count() == 0 {
            return Err(match &self.cfg.topic {
                Some(t) => SourceError::NotFound(format!("topic \"{t}\" has no partitions")),
                None => SourceError::NotFound("no topics in the cluster".into()),
            });
        }
        let committed = group.committed_offsets(tpl, timeout).map_err(SourceError::query)?;
        let mut by_topic: BTreeMap<String, Vec<(i32, Option<i64>)>> = BTreeMap::new();
        for e in committed.elements() {
            let c = match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            };
            by_topic.entry(e.topic().to_string()).or_default().push((e.partition(), c));
        }
        // Without kafkaTopic: only the topics the group has committed offsets for.
        if self.cfg.topic.is_none() {
            by_topic.retain(|_, ps| ps.iter().any(|(_, c)| c.is_some()));
            if by_topic.is_empty() {
                return Err(SourceError::NotFound(format!(
                    "group \"{}\" has no committed offsets on any topic",
                    self.cfg.consumer_group
                )));
            }
        }
        let mut parts = Vec::new();
        let mut prev = self.previous.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = HashMap::new();
        for (topic, ps) in &by_topic {
            for (p, c) in ps {
                let (_, high) = meta.fetch_watermarks(topic, *p, timeout).map_err(SourceError::query)?;
                let key = (topic.clone(), *p);
                let unchanged = match (c, prev.get(&key)) {
                    (Some(c), Some(old)) => c == old,
                    _ => false,
                };
                if let Some(c) = c {
                    next.insert(key, *c);
                }
                parts.push(PartitionOffsets { high, committed: *c, unchanged });
            }
        }
        *prev = next;
        let lag = compute_lag(&self.cfg, &parts);
        let mut detail = BTreeMap::new();
        detail.insert("lag", lag.with_persistent);
        detail.insert("partitions", lag.partitions as f64);
        detail.insert("partitions_with_lag", lag.partitions_with_lag as f64);
        Ok(Reading {
            value: lag.metric,
            active: lag.with_persistent > self.cfg.activation_lag_threshold,
            detail,
            pods: None,
        })
    }
}

impl Source for Arc<KafkaSource> {
    fn read(&self) -> BoxFuture<'_, Result<Reading, SourceError>> {
        let me = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || me.read_blocking(Duration::from_secs(5)))
                .await
                .map_err(|e| SourceError::Query(format!("kafka read task: {e}")))?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScalerId;

    fn cfg(pairs: &[(&str, &str)]) -> Result<KafkaConfig, Vec<String>> {
        let id = ScalerId { namespace: "ns".into(), name: "so".into() };
        let map = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut md = Metadata::new(&id, &map);
        let c = KafkaConfig::parse(&mut md);
        md.finish(c).map_err(|e| e.0.iter().map(|e| e.to_string()).collect())
    }

    fn base() -> Vec<(&'static str, &'static str)> {
        vec![("kafkaBootstrapServers", "127.0.0.1:9092"), ("kafkaConsumerGroup", "g"), ("kafkaTopic", "t")]
    }

    fn p(high: i64, committed: Option<i64>) -> PartitionOffsets {
        PartitionOffsets { high, committed, unchanged: false }
    }

    #[test]
    fn keda_defaults_and_lag_with_invalid_offsets() {
        let c = cfg(&base()).unwrap();
        assert_eq!(c.lag_threshold, 10.0);
        assert_eq!(c.offset_reset_policy, ResetPolicy::Latest);
        // latest: a never-committed partition counts 1
        let l = compute_lag(&c, &[p(10, Some(4)), p(20, Some(15)), p(30, None)]);
        assert_eq!(l.metric, 6.0 + 5.0 + 1.0);
        let mut e = c.clone();
        e.offset_reset_policy = ResetPolicy::Earliest;
        // 41 > 3 partitions × 10: capped at 30 unless idle consumers are allowed.
        assert_eq!(compute_lag(&e, &[p(10, Some(4)), p(20, Some(15)), p(30, None)]).metric, 30.0);
        e.allow_idle_consumers = true;
        assert_eq!(compute_lag(&e, &[p(10, Some(4)), p(20, Some(15)), p(30, None)]).metric, 41.0);
        e.scale_to_zero_on_invalid_offset = true;
        assert_eq!(compute_lag(&e, &[p(30, None)]).metric, 0.0);
    }

    #[test]
    fn cap_at_partition_count_unless_idle_consumers_allowed() {
        let c = cfg(&base()).unwrap();
        // 3 partitions, 1000 lag, threshold 10: 100 replicas > 3 partitions → capped to 30.
        let parts = [p(500, Some(0)), p(500, Some(0)), p(0, Some(0))];
        assert_eq!(compute_lag(&c, &parts).metric, 30.0);
        let mut lim = c.clone();
        lim.limit_to_partitions_with_lag = true;
        assert_eq!(compute_lag(&lim, &parts).metric, 20.0);
        let mut idle = c.clone();
        idle.allow_idle_consumers = true;
        assert_eq!(compute_lag(&idle, &parts).metric, 1000.0);
    }

    #[test]
    fn persistent_lag_excluded_from_metric_not_activation() {
        let mut c = cfg(&base()).unwrap();
        c.exclude_persistent_lag = true;
        let parts = [PartitionOffsets { high: 50, committed: Some(10), unchanged: true }, p(5, Some(0))];
        let l = compute_lag(&c, &parts);
        assert_eq!(l.metric, 5.0);
        assert_eq!(l.with_persistent, 45.0);
    }

    #[test]
    fn config_errors_name_keys() {
        let e = cfg(&[("kafkaBootstrapServers", "nohost"), ("kafkaConsumerGroup", "g")]).unwrap_err();
        assert!(e.iter().any(|e| e.contains("kafkaBootstrapServers")), "{e:?}");
        let mut b = base();
        b.push(("kafkaLagThreshold", "0"));
        assert!(cfg(&b).unwrap_err().iter().any(|e| e.contains("kafkaLagThreshold")));
        let mut b = base();
        b.extend([("kafkaAllowIdleConsumers", "true"), ("kafkaLimitToPartitionsWithLag", "true")]);
        assert!(cfg(&b).unwrap_err().iter().any(|e| e.contains("kafkaLimitToPartitionsWithLag")));
        let mut b = base();
        b.push(("kafkaSasl", "scram_sha512"));
        assert!(cfg(&b).unwrap_err().iter().any(|e| e.contains("kafkaUsernameFromEnv")));
        let e =
            cfg(&[("kafkaBootstrapServers", "h:1"), ("kafkaConsumerGroup", "g"), ("kafkaPartitionLimitation", "1")])
                .unwrap_err();
        assert!(e.iter().any(|e| e.contains("kafkaPartitionLimitation")), "{e:?}");
        assert_eq!(parse_partitions("1, 2,10-12").unwrap(), vec![1, 2, 10, 11, 12]);
        assert!(parse_partitions("5-2").is_err());
    }
}
