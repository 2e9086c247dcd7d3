//! The metadata reference: every key prescale reads, with its default and meaning.
//! The README's metadata table is generated from / checked against this list by a test,
//! and another test checks that the parsers read exactly these keys.

/// One documented metadata key.
#[derive(Debug, Clone, Copy)]
pub struct KeyDoc {
    pub key: &'static str,
    /// `general`, `planner`, or the source (`rabbitmq`, `prometheus`, …).
    pub group: &'static str,
    /// Default, or `required` / `—` (optional, no default).
    pub default: &'static str,
    pub meaning: &'static str,
    /// A valid example value (used by tests to exercise the key).
    pub example: &'static str,
}

/// Keys KEDA itself puts into an external trigger's metadata (or that its docs tell
/// users to put there); accepted and ignored.
pub const KEDA_KEYS: &[&str] = &[
    "scalerAddress",
    "enableTLS",
    "unsafeSsl",
    "caCert",
    "tlsCertFile",
    "tlsClientCert",
    "tlsClientKey",
    "metricType",
];

const fn k(
    key: &'static str,
    group: &'static str,
    default: &'static str,
    meaning: &'static str,
    example: &'static str,
) -> KeyDoc {
    KeyDoc { key, group, default, meaning, example }
}

pub const KEYS: &[KeyDoc] = &[
    // general
    k("metricName", "general", "prescale-replicas", "Name of the one metric returned by GetMetricSpec ([a-z0-9-], unique within the ScaledObject).", "llama-replicas"),
    k("sampleSeconds", "general", "5", "Poll period of every source, on wall-clock-aligned ticks (all prescale replicas sample at the same instants).", "5"),
    k("staleAfterSeconds", "general", "30", "A signal whose last good read is older than this makes GetMetrics/IsActive fail with UNAVAILABLE (KEDA's fallback applies).", "30"),
    k("sourceTimeoutSeconds", "general", "2", "Timeout of one source read (retried with jittered backoff within the sample period).", "2"),
    // planner
    k("mode", "planner", "predictive", "`predictive`: answer the planner's replicas; `shadow`: answer reactively and expose what the planner would do (`prescale_planner_replicas`), acting on the cluster only for the answer; `reactive`: reactive only.", "shadow"),
    k("warmupSeconds", "planner", "180", "Seconds from a replica's start until it serves (node + image pull + model load), or `auto` to measure it from the cluster.", "240"),
    k("capacityPerReplica", "planner", "—", "Requests/s one replica serves at SLO; when set, demand is planned as an arrival rate.", "1.5"),
    k("sloSeconds", "planner", "5", "Queueing delay a request may see; the planner drains backlog within it, and a vLLM signal measures against it the share of requests that waited longer (`prescale_queue_late_share`).", "5"),
    k("scaleToZero", "planner", "false", "Allow the planner to go to 0 when no arrival is expected within the warm-up (then `minReplicas` floors a woken fleet only: the plan is 0 or at least `minReplicas`, as KEDA's `idleReplicaCount: 0` beside `minReplicaCount`).", "true"),
    k("forecastModel", "planner", "auto", "`auto` (loss-weighted ensemble), `smoothing`, `holtWinters`, `seasonalNaive`.", "auto"),
    k("minReplicas", "planner", "0", "Lower bound of the plan, of a woken one with `scaleToZero` (keep KEDA's minReplicaCount consistent).", "0"),
    k("maxReplicas", "planner", "100", "Upper bound of the plan (keep KEDA's maxReplicaCount consistent).", "8"),
    k("hpaTolerance", "planner", "0.1", "The HPA's tolerance (Kubernetes' default 0.1; 0 when the ScaledObject sets `behavior.scaleUp/scaleDown.tolerance: 0`). A planned scale-up the HPA would drop as within it is answered as the smallest count it applies.", "0"),
    // cluster (prescale's Kubernetes integration; see scaler/src/cluster/)
    k("karpenterMode", "cluster", "annotate", "`off`: no Karpenter writes; `annotate`: write the headroom hint on the target's NodePool; `headroom`: also keep placeholder pods (negative priority, the target's GPU/MIG requests) so Karpenter provisions nodes one warm-up ahead.", "headroom"),
    k("karpenterResizeStaticNodePools", "cluster", "false", "When the target lands on a static NodePool (`spec.replicas`), size it for every planned replica that has no node, instead of placeholder pods: grown at once, never below its own count, and shrunk only by empty nodes once the need has been gone for 5 minutes.", "true"),
    // rabbitmq
    k("rabbitmqHost", "rabbitmq", "—", "AMQP (`amqp://`, `amqps://`) or management (`http://`, `https://`) URL with credentials and vhost.", "amqp://guest:guest@127.0.0.1:5672/%2f"),
    k("rabbitmqHostFromEnv", "rabbitmq", "—", "Same, resolved by KEDA from the scale target's env (KEDA keeps the key name and sends the value).", "amqp://guest:guest@127.0.0.1:5672/%2f"),
    k("rabbitmqQueueName", "rabbitmq", "required", "Queue to read.", "inference-requests"),
    k("rabbitmqMode", "rabbitmq", "QueueLength", "`QueueLength` (messages) or `MessageRate` (publish rate, management API only).", "QueueLength"),
    k("rabbitmqPerReplica", "rabbitmq", "20", "Messages (or messages/s) one replica should absorb; demand = value / this.", "20"),
    k("rabbitmqActivationValue", "rabbitmq", "0", "Active iff the value is greater than this (MessageRate: or the backlog is).", "0"),
    k("rabbitmqProtocol", "rabbitmq", "auto", "`auto` (from the URL scheme), `amqp` or `http`.", "auto"),
    k("rabbitmqVhostName", "rabbitmq", "—", "Overrides the vhost of the URL.", "/"),
    k("rabbitmqExcludeUnacknowledged", "rabbitmq", "false", "Management API only: count ready messages, not ready + unacked.", "false"),
    k("rabbitmqUsernameFromEnv", "rabbitmq", "—", "User name (resolved by KEDA from env), overrides the URL's.", "guest"),
    k("rabbitmqPasswordFromEnv", "rabbitmq", "—", "Password (resolved by KEDA from env), overrides the URL's.", "guest"),
    // prometheus
    k("prometheusServerAddress", "prometheus", "required", "Prometheus base URL.", "http://127.0.0.1:9090"),
    k("prometheusQuery", "prometheus", "required", "Instant query returning one series.", "sum(vllm:num_requests_waiting)"),
    k("prometheusPerReplica", "prometheus", "required", "Query value one replica absorbs; demand = value / this (KEDA's `threshold`).", "10"),
    k("prometheusActivationThreshold", "prometheus", "0", "Active iff the value is greater than this.", "0"),
    k("prometheusIgnoreNullValues", "prometheus", "false", "When true an empty result reads 0; by default it is an error (never a silent zero).", "false"),
    k("prometheusNamespace", "prometheus", "—", "Added as `namespace=` (Thanos tenancy).", "team-a"),
    k("prometheusCustomHeaders", "prometheus", "—", "Comma-separated `Name=value` request headers.", "X-Scope-OrgID=team-a"),
    k("prometheusQueryParameters", "prometheus", "—", "Comma-separated `k=v` query parameters appended to the request.", "dedup=true"),
    k("prometheusBearerTokenFromEnv", "prometheus", "—", "Bearer token (resolved by KEDA from env).", "token"),
    // kafka
    k("kafkaBootstrapServers", "kafka", "required", "Comma-separated host:port list.", "kafka-0.kafka:9092"),
    k("kafkaConsumerGroup", "kafka", "required", "Consumer group whose lag is read (prescale never joins it).", "llm-workers"),
    k("kafkaTopic", "kafka", "—", "Topic; empty means every topic the group has committed offsets for.", "prompts"),
    k("kafkaLagThreshold", "kafka", "10", "Lag one replica absorbs (KEDA's lagThreshold); demand = lag / this.", "10"),
    k("kafkaActivationLagThreshold", "kafka", "0", "Active iff total lag (persistent lag included) is greater than this.", "0"),
    k("kafkaOffsetResetPolicy", "kafka", "latest", "Partitions without a committed offset: `latest` counts 1, `earliest` counts the high watermark.", "latest"),
    k("kafkaAllowIdleConsumers", "kafka", "false", "Do not cap the metric at partitions × lagThreshold.", "false"),
    k("kafkaLimitToPartitionsWithLag", "kafka", "false", "Cap at the number of partitions with lag instead of all partitions.", "false"),
    k("kafkaExcludePersistentLag", "kafka", "false", "A partition whose committed offset did not move since the last poll adds nothing to the metric (still to activation).", "false"),
    k("kafkaScaleToZeroOnInvalidOffset", "kafka", "false", "Partitions without a committed offset count 0.", "false"),
    k("kafkaPartitionLimitation", "kafka", "—", "Only these partitions, e.g. `1,2,10-20` (with kafkaTopic).", "0-2"),
    k("kafkaSasl", "kafka", "none", "`none`, `plaintext`, `scram_sha256`, `scram_sha512`.", "none"),
    k("kafkaUsernameFromEnv", "kafka", "—", "SASL user (resolved by KEDA from env).", "user"),
    k("kafkaPasswordFromEnv", "kafka", "—", "SASL password (resolved by KEDA from env).", "secret"),
    k("kafkaTls", "kafka", "disable", "`enable` for TLS to the brokers.", "disable"),
    k("kafkaUnsafeSsl", "kafka", "false", "Skip broker certificate verification.", "false"),
    k("kafkaCaFile", "kafka", "—", "CA bundle file mounted into prescale's pod.", "/etc/kafka/ca.pem"),
    // sqs
    k("sqsQueueURL", "sqs", "required", "Queue URL (`https://sqs.<region>.amazonaws.com/<account>/<queue>`).", "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs"),
    k("sqsQueueURLFromEnv", "sqs", "—", "Same, resolved by KEDA from the workload's env.", "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs"),
    k("sqsAwsRegion", "sqs", "required", "AWS region of the queue.", "eu-west-1"),
    k("sqsAwsEndpoint", "sqs", "—", "Endpoint override (SQS-compatible servers, VPC endpoints).", "http://127.0.0.1:4566"),
    k("sqsQueueLength", "sqs", "5", "Messages one replica absorbs (KEDA's queueLength); demand = messages / this.", "5"),
    k("sqsActivationQueueLength", "sqs", "0", "Active iff messages are greater than this.", "0"),
    k("sqsScaleOnInFlight", "sqs", "true", "Add ApproximateNumberOfMessagesNotVisible (in flight).", "true"),
    k("sqsScaleOnDelayed", "sqs", "false", "Add ApproximateNumberOfMessagesDelayed.", "false"),
    // (vllm and dcgm keys follow)
    // vllm
    k("vllmEndpoints", "vllm", "—", "Comma-separated vLLM pod URLs or host:port (`/metrics` appended unless a path is given). Exactly one of vllmEndpoints / vllmService.", "10.0.0.5:8000,10.0.0.6:8000"),
    k("vllmService", "vllm", "—", "A Service in the ScaledObject's namespace: its ready EndpointSlice endpoints are scraped, followed by one watch per Service (needs list and watch on `discovery.k8s.io` endpointslices; without watch every poll lists them).", "llama3-70b"),
    k("vllmPort", "vllm", "8000", "With vllmService: the pod port number, or the name of a port of the EndpointSlices.", "http"),
    k("vllmModel", "vllm", "—", "Only series whose `model_name` is this (the served model name).", "meta-llama/Llama-3.1-8B-Instruct"),
    k("vllmPerReplica", "vllm", "16", "Waiting + running requests one replica should carry; demand = Σ pods (waiting + running) / this.", "16"),
    k("vllmKvCacheTarget", "vllm", "—", "KV-cache usage (0–1) one replica should run at; when set, demand is also Σ pods usage / this, and the value is the larger of the two (in vllmPerReplica units).", "0.8"),
    k("vllmActivationValue", "vllm", "0", "Active iff the value (waiting + running, or its KV-cache equivalent) is greater than this.", "0"),
    // dcgm
    k("dcgmEndpoints", "dcgm", "—", "Comma-separated dcgm-exporter URLs or host[:port] (default port 9400, path /metrics). Exactly one of dcgmEndpoints / dcgmPrometheus.", "gpu-node-1:9400,gpu-node-2:9400"),
    k("dcgmPrometheus", "dcgm", "—", "Prometheus base URL that scrapes dcgm-exporter (instant query of the namespace's rows; `exported_namespace`/`exported_pod` honoured).", "http://prometheus.monitoring:9090"),
    k("dcgmMetric", "dcgm", "gpuUtil", "`gpuUtil` (DCGM_FI_DEV_GPU_UTIL, %) or `engineActive` (DCGM_FI_PROF_GR_ENGINE_ACTIVE, 0–1). MIG instances always use engineActive.", "engineActive"),
    k("dcgmPodPrefix", "dcgm", "—", "Only GPUs of pods whose name starts with this; without it every pod of the namespace holding a GPU counts. When prescale can read the Kubernetes API it narrows further to exactly the scale target's pods (its Deployment/StatefulSet selector); a Ready target pod set with no GPU row at all is then an error, not a 0.", "llama3-70b-"),
    k("dcgmUtilizationTarget", "dcgm", "80", "Percent utilisation one replica should run at; demand = pods × mean utilisation / this.", "80"),
    k("dcgmActivationUtilization", "dcgm", "0", "Active iff the mean utilisation (percent) is greater than this.", "5"),
    k("dcgmPrometheusCustomHeaders", "dcgm", "—", "With dcgmPrometheus: comma-separated `Name=value` request headers (multi-tenant Prometheus, e.g. Mimir's X-Scope-OrgID).", "X-Scope-OrgID=gpu"),
    k("dcgmPrometheusBearerTokenFromEnv", "dcgm", "—", "With dcgmPrometheus: bearer token (resolved by KEDA from env).", "token"),
    k("dcgmIgnoreNoGpus", "dcgm", "false", "When true, no GPU row for the pods reads 0 (needed with scale-to-zero); by default it is an error.", "true"),
];

/// The documented key closest to `unknown` (edit distance ≤ 3), for "did you mean".
pub fn closest(unknown: &str) -> Option<&'static str> {
    KEYS.iter()
        .map(|d| (levenshtein(&unknown.to_ascii_lowercase(), &d.key.to_ascii_lowercase()), d.key))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The metadata reference as the README's markdown table (`prescale keys` prints it;
/// a test keeps the README identical).
pub fn markdown_table() -> String {
    let mut out = String::from("| key | group | default | meaning |\n|---|---|---|---|\n");
    for d in KEYS {
        out.push_str(&format!("| `{}` | {} | {} | {} |\n", d.key, d.group, d.default, d.meaning.replace('|', "\\|")));
    }
    out.push_str(&format!(
        "\nKEDA's own keys are accepted and ignored: {}. Any other key is an error that names it.\n",
        KEDA_KEYS.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
    ));
    out
}
