//! Warm start: a restarted (or newly scheduled) prescale replica reads back the demand its
//! predecessors observed for a ScaledObject from the Prometheus that scrapes `/metrics`
//! (`prescale_observed_demand_replicas`), and replays it through the planner before the
//! first live tick, so daily and weekly patterns survive a restart instead of being
//! relearned over days.

use std::time::Duration;

use crate::config::ScalerId;
use crate::replay::prom::{fetch_series, RangeQuery, Series};

/// Where the history lives and how far back it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryOptions {
    /// Base URL of the Prometheus that scrapes prescale's `/metrics`.
    pub server: String,
    /// How far back to read (the planner keeps up to 8 days).
    pub lookback: Duration,
}

/// The longest fetch a ScaledObject's first tick waits for (KEDA's fallback covers the wait).
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(20);

/// A label value inside double quotes in PromQL.
fn quote(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The query for one ScaledObject's observed demand: the max over prescale replicas (all of
/// them plan the same tick from the same readings, so they agree; any one that was up counts).
pub fn query_for(id: &ScalerId) -> String {
    format!(
        "max(prescale_observed_demand_replicas{{namespace=\"{}\",scaledobject=\"{}\"}})",
        quote(&id.namespace),
        quote(&id.name)
    )
}

/// Fetch `[now − lookback, now]` on the ScaledObject's tick (`step_s`).
pub async fn fetch(
    client: &reqwest::Client,
    opts: &HistoryOptions,
    id: &ScalerId,
    step_s: u64,
    now_s: i64,
) -> Result<Series, String> {
    let step = step_s.max(1);
    let lookback = i64::try_from(opts.lookback.as_secs()).unwrap_or(i64::MAX).max(step as i64);
    let end = now_s - now_s.rem_euclid(step as i64);
    let q = RangeQuery {
        server: opts.server.clone(),
        query: query_for(id),
        start: end.saturating_sub(lookback),
        end,
        step_s: step,
    };
    match tokio::time::timeout(FETCH_TIMEOUT, fetch_series(client, &q)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} s", FETCH_TIMEOUT.as_secs())),
    }
}

/// What `/debug/scalers` shows about the warm start.
pub fn describe(r: &Result<(Series, usize), String>, server: &str) -> String {
    match r {
        Ok((s, fed)) => format!(
            "warmed from {server}: {fed} samples every {} s from unix {} to {}",
            s.step_s,
            s.first_s,
            s.first_s + (s.sampled_len.max(1) as i64 - 1) * s.step_s as i64
        ),
        Err(e) => format!("no history from {server}: {e}; planning from a cold start"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_selects_one_scaled_object_and_escapes_its_labels() {
        let id = ScalerId { namespace: "ml".into(), name: "llama".into() };
        assert_eq!(query_for(&id), "max(prescale_observed_demand_replicas{namespace=\"ml\",scaledobject=\"llama\"})");
        let odd = ScalerId { namespace: "a\"b".into(), name: "c\\d".into() };
        assert!(query_for(&odd).contains("namespace=\"a\\\"b\",scaledobject=\"c\\\\d\""), "{}", query_for(&odd));
    }

    #[tokio::test]
    async fn an_unreachable_prometheus_is_an_error_not_an_empty_history() {
        // Port 1 refuses connections.
        let opts = HistoryOptions { server: "http://127.0.0.1:1".into(), lookback: Duration::from_secs(3600) };
        let id = ScalerId { namespace: "ml".into(), name: "llama".into() };
        let r = fetch(&reqwest::Client::new(), &opts, &id, 15, 1_800_000_000).await;
        let err = r.expect_err("a refused connection is an error");
        let note = describe(&Err(err), &opts.server);
        assert!(note.contains("cold start"), "{note}");
    }
}
