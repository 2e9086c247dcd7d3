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
pub const KEDA_KEYS: &[&str] =
    &["scalerAddress", "enableTLS", "unsafeSsl", "caCert", "tlsClientCert", "tlsClientKey", "metricType"];

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
    k("mode", "planner", "predictive", "`predictive`: answer the planner's replicas; `shadow`: answer reactively and expose what the planner would do; `reactive`: reactive only.", "shadow"),
    k("warmupSeconds", "planner", "180", "Seconds from a replica's start until it serves (node + image pull + model load), or `auto` to measure it from the cluster.", "240"),
    k("capacityPerReplica", "planner", "—", "Requests/s one replica serves at SLO; when set, demand is planned as an arrival rate.", "1.5"),
    k("sloSeconds", "planner", "5", "Queueing delay a request may see; the planner drains backlog within it.", "5"),
    k("scaleToZero", "planner", "false", "Allow the planner to go to 0 when no arrival is expected within the warm-up.", "true"),
    k("forecastModel", "planner", "auto", "`auto` (loss-weighted ensemble), `smoothing`, `holtWinters`, `seasonalNaive`.", "auto"),
    k("minReplicas", "planner", "0", "Lower bound of the plan (keep KEDA's minReplicaCount consistent).", "0"),
    k("maxReplicas", "planner", "100", "Upper bound of the plan (keep KEDA's maxReplicaCount consistent).", "8"),
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
