//! Signal sources. Each module holds one source: its typed config (parsed from the
//! metadata keys of its prefix, with errors that name the key), its [`Source`] impl,
//! and its tests against the real service.
//!
//! Sources are shared: [`SourceConfig::poll_key`] identifies one poll (endpoint + query)
//! and [`Shared`] holds the per-endpoint connections, so 500 ScaledObjects reading
//! one RabbitMQ use one AMQP connection and each distinct queue is polled once.

pub mod dcgm;
pub mod exposition;
pub mod kafka;
pub mod prometheus;
pub mod rabbitmq;
pub mod slices;
pub mod sqs;
pub mod vllm;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Serialize;

use crate::config::Metadata;

/// Keys of a ScaledObject that sources read but the general parser owns (`config`): parsed
/// and checked once there, and handed to the source parsers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommonKeys {
    /// `sourceTimeoutSeconds`.
    pub source_timeout: std::time::Duration,
    /// `sloSeconds` (the planner's): what vLLM's queue time is measured against.
    pub slo_s: f64,
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One successful read of a source.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reading {
    /// The metric compared with the per-replica target (messages, query value, …).
    pub value: f64,
    /// KEDA's activation semantics for this source (value > activation threshold, or
    /// the source's own rule).
    pub active: bool,
    /// Raw figures kept for the planner and `/debug/scalers` (e.g. `messages`,
    /// `publish_rate`).
    pub detail: BTreeMap<&'static str, f64>,
    /// Per-pod figures behind `value`, for sources whose shared poll a ScaledObject
    /// narrows to its own scale target's pods (DCGM). `None` for the others.
    #[serde(skip)]
    pub pods: Option<Arc<Vec<dcgm::PodUtil>>>,
}

/// The scale target's pods as the cluster's pod watch sees them: name and whether it is
/// Ready (only a Ready pod is expected to show up in per-pod figures such as GPU rows).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetPods {
    pub pods: Vec<(String, bool)>,
    /// The target's live `spec.replicas` (the Deployment / StatefulSet watch): the count
    /// the HPA holds. `None` while that watch is not healthy.
    pub spec_replicas: Option<u32>,
}

/// Why a read failed. Messages are redacted before they are stored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SourceError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("query failed: {0}")]
    Query(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("unexpected answer: {0}")]
    Parse(String),
    #[error("timed out after {0:.1}s")]
    Timeout(f64),
}

impl SourceError {
    pub fn connect(e: impl std::fmt::Display) -> Self {
        Self::Connect(crate::redact::redact_text(&e.to_string()))
    }
    pub fn query(e: impl std::fmt::Display) -> Self {
        Self::Query(crate::redact::redact_text(&e.to_string()))
    }
    pub fn parse(e: impl std::fmt::Display) -> Self {
        Self::Parse(crate::redact::redact_text(&e.to_string()))
    }
}

/// A signal source: one read, no retries (the poller retries and times out).
pub trait Source: Send + Sync {
    fn read(&self) -> BoxFuture<'_, Result<Reading, SourceError>>;
}

/// The typed configuration of one source of a ScaledObject.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum SourceConfig {
    Rabbitmq(rabbitmq::RabbitmqConfig),
    Prometheus(prometheus::PrometheusConfig),
    Kafka(kafka::KafkaConfig),
    Sqs(sqs::SqsConfig),
    Vllm(vllm::VllmConfig),
    Dcgm(dcgm::DcgmConfig),
}

/// Dispatch one expression over every variant (each config has the same methods).
macro_rules! each {
    ($self:expr, $c:ident => $e:expr) => {
        match $self {
            SourceConfig::Rabbitmq($c) => $e,
            SourceConfig::Prometheus($c) => $e,
            SourceConfig::Kafka($c) => $e,
            SourceConfig::Sqs($c) => $e,
            SourceConfig::Vllm($c) => $e,
            SourceConfig::Dcgm($c) => $e,
        }
    };
}

impl SourceConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Rabbitmq(_) => "rabbitmq",
            Self::Prometheus(_) => "prometheus",
            Self::Kafka(_) => "kafka",
            Self::Sqs(_) => "sqs",
            Self::Vllm(_) => "vllm",
            Self::Dcgm(_) => "dcgm",
        }
    }

    /// A short, redacted, human label (`rabbitmq queue "q" on amqp://***@host/`).
    pub fn label(&self) -> String {
        each!(self, c => c.label())
    }

    /// What one replica absorbs: demand in replicas = value / per_replica.
    pub fn per_replica(&self) -> f64 {
        each!(self, c => c.per_replica())
    }

    /// Identity of one poll: ScaledObjects whose sources have the same key share it.
    /// Contains credentials; never logged or shown.
    pub fn poll_key(&self) -> String {
        each!(self, c => c.poll_key())
    }

    /// Whether a ScaledObject narrows this source's shared reading to its own scale target's
    /// pods ([`SourceConfig::narrow`]); the other sources read the same for everyone.
    pub fn narrows_to_pods(&self) -> bool {
        matches!(self, Self::Dcgm(_))
    }

    /// The shared reading cut down to the target's pods (unchanged for sources that do not
    /// [`narrows_to_pods`](SourceConfig::narrows_to_pods)).
    pub fn narrow(&self, r: &Reading, target: &TargetPods) -> Result<Reading, SourceError> {
        match self {
            Self::Dcgm(c) => dcgm::narrow(c, r, target),
            _ => Ok(r.clone()),
        }
    }

    pub fn build(&self, shared: &Shared) -> Arc<dyn Source> {
        match self {
            Self::Rabbitmq(c) => Arc::new(rabbitmq::RabbitmqSource::new(c.clone(), shared)),
            Self::Prometheus(c) => Arc::new(prometheus::PrometheusSource::new(c.clone(), shared)),
            Self::Kafka(c) => Arc::new(Arc::new(kafka::KafkaSource::new(c.clone(), shared))),
            Self::Sqs(c) => Arc::new(sqs::SqsSource::new(c.clone(), shared)),
            Self::Vllm(c) => Arc::new(vllm::VllmSource::new(c.clone(), shared)),
            Self::Dcgm(c) => Arc::new(dcgm::DcgmSource::new(c.clone(), shared)),
        }
    }
}

/// Parse every configured source (a source is configured when any key of its prefix
/// is present); at least one is required.
pub fn parse_all(md: &mut Metadata<'_>, common: CommonKeys) -> Vec<SourceConfig> {
    let mut out = Vec::new();
    if let Some(c) = rabbitmq::RabbitmqConfig::parse(md) {
        out.push(SourceConfig::Rabbitmq(c));
    }
    if let Some(c) = prometheus::PrometheusConfig::parse(md) {
        out.push(SourceConfig::Prometheus(c));
    }
    if let Some(c) = kafka::KafkaConfig::parse(md) {
        out.push(SourceConfig::Kafka(c));
    }
    if let Some(c) = sqs::SqsConfig::parse(md) {
        out.push(SourceConfig::Sqs(c));
    }
    if let Some(c) = vllm::VllmConfig::parse(md, common) {
        out.push(SourceConfig::Vllm(c));
    }
    if let Some(c) = dcgm::DcgmConfig::parse(md, common) {
        out.push(SourceConfig::Dcgm(c));
    }
    let prefixes = ["rabbitmq", "prometheus", "kafka", "sqs", "vllm", "dcgm"];
    if out.is_empty() && !prefixes.iter().any(|p| md.has_prefix(p)) {
        md.error(
            "rabbitmqQueueName",
            None,
            "no signal configured: set at least one source (rabbitmq*, prometheus*, kafka*, sqs*, vllm*, dcgm*)",
        );
    }
    out
}

/// Connections shared by every source of the process.
#[derive(Clone)]
pub struct Shared {
    pub http: reqwest::Client,
    pub amqp: Arc<rabbitmq::AmqpPool>,
    pub kafka: Arc<kafka::KafkaPool>,
    pub sqs: Arc<sqs::SqsPool>,
    /// The Kubernetes client (vllmService), created on first use.
    pub kube: Arc<vllm::KubeClient>,
    /// The EndpointSlice watches of `vllmService` Services, one per Service.
    pub slices: Arc<slices::SliceWatches>,
}

impl Shared {
    pub fn new() -> Self {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(8)
            .user_agent(concat!("prescale/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Self {
            http,
            amqp: Arc::new(rabbitmq::AmqpPool::default()),
            kafka: Arc::new(kafka::KafkaPool::default()),
            sqs: Arc::new(sqs::SqsPool::default()),
            kube: Arc::new(vllm::KubeClient::default()),
            slices: Arc::new(slices::SliceWatches::default()),
        }
    }
}

impl Default for Shared {
    fn default() -> Self {
        Self::new()
    }
}
