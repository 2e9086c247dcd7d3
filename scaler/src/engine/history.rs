//! Warm start: a restarted (or newly scheduled) prescale replica reads back the demand its
//! predecessors observed for a ScaledObject from the Prometheus that scrapes `/metrics`
//! (`prescale_observed_demand_replicas`), and replays it through the planner before the
//! first live tick, so daily and weekly patterns survive a restart instead of being
//! relearned over days.

use std::time::Duration;

use crate::config::ScalerId;
use crate::replay::prom::{fetch_series, RangeQuery, Series};
use crate::sources::exposition::escape_label_value;

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

/// The query for one ScaledObject's observed demand: the max over prescale replicas (all of
/// them plan the same tick from the same readings, so they agree; any one that was up counts).
///
/// The series' `namespace` label is the ScaledObject's. A Prometheus that scrapes prescale
/// with `honor_labels: false` (the Prometheus Operator's default for a ServiceMonitor) gives
/// the target's own `namespace` (prescale's) precedence and keeps ours as
/// `exported_namespace`; such series are read by that label, and the plain `namespace`
/// selector takes only series without one (else, with prescale installed in the
/// ScaledObject's namespace, it would also match same-named ScaledObjects of every other
/// namespace).
pub fn query_for(id: &ScalerId) -> String {
    let (ns, name) = (escape_label_value(&id.namespace), escape_label_value(&id.name));
    format!(
        "max(prescale_observed_demand_replicas{{namespace=\"{ns}\",exported_namespace=\"\",scaledobject=\"{name}\"}} \
         or prescale_observed_demand_replicas{{exported_namespace=\"{ns}\",scaledobject=\"{name}\"}})"
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

/// Fill the steps the history has no sample for (every replica was down, or the scrapes
/// failed) from the same time a week earlier where that was sampled, else a day earlier,
/// instead of with the last value before the gap, which would teach the daily and weekly
/// profiles a flat line there (demand went on while prescale was away). Steps less than a
/// day after the first sample keep the last value. Returns how many steps were filled.
pub fn seasonal_fill(s: &mut Series) -> usize {
    let step = s.step_s.max(1) as usize;
    let day = (86_400 + step / 2) / step;
    let week = 7 * day;
    let mut filled = 0;
    for i in 0..s.values.len().min(s.sampled.len()).min(s.sampled_len) {
        if s.sampled[i] || day == 0 {
            continue;
        }
        let from = if i >= week && s.sampled[i - week] {
            i - week
        } else if i >= day {
            i - day
        } else {
            continue;
        };
        s.values[i] = s.values[from];
        filled += 1;
    }
    filled
}

/// What `/debug/scalers` shows about the warm start.
pub fn describe(r: &Result<(Series, usize), String>, server: &str) -> String {
    match r {
        Ok((s, fed)) => format!(
            "warmed from {server}: {fed} samples every {} s from unix {} to {}{}",
            s.step_s,
            s.first_s,
            s.first_s + (s.sampled_len.max(1) as i64 - 1) * s.step_s as i64,
            match s.gaps {
                0 => String::new(),
                g => format!(
                    " ({g} steps without a sample, filled from a week or a day earlier where the history reaches back that far, else with the value before them)"
                ),
            }
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
        assert_eq!(
            query_for(&id),
            "max(prescale_observed_demand_replicas{namespace=\"ml\",exported_namespace=\"\",scaledobject=\"llama\"} \
             or prescale_observed_demand_replicas{exported_namespace=\"ml\",scaledobject=\"llama\"})"
        );
        let odd = ScalerId { namespace: "a\"b".into(), name: "c\\d".into() };
        assert!(query_for(&odd).contains("namespace=\"a\\\"b\",scaledobject=\"c\\\\d\""), "{}", query_for(&odd));
    }

    #[test]
    fn a_gap_in_the_history_is_filled_from_a_week_or_a_day_earlier_not_flat() {
        // Hourly steps over 9 days: demand = the hour of day, +100 on day 0 of the week.
        let step = 3_600u64;
        let n = 9 * 24;
        let truth = |i: usize| (i % 24) as f64 + if (i / 24).is_multiple_of(7) { 100.0 } else { 0.0 };
        let gap = |i: usize| (10..14).contains(&(i % 24)) && [0, 3, 7].contains(&(i / 24));
        let mut values = Vec::new();
        let mut last = 0.0;
        for i in 0..n {
            if !gap(i) {
                last = truth(i);
            }
            values.push(last);
        }
        let sampled: Vec<bool> = (0..n).map(|i| !gap(i)).collect();
        let gaps = sampled.iter().filter(|s| !**s).count();
        let mut s = Series { first_s: 0, step_s: step, values, gaps, sampled_len: n, sampled };
        assert_eq!(seasonal_fill(&mut s), 8, "day 0 has nothing earlier to fill from");
        // Day 0: the last value before the gap (hour 9, +100) stays.
        assert_eq!(s.values[11], 109.0);
        // Day 3: from day 2, which was sampled (no week before it).
        assert_eq!(s.values[3 * 24 + 12], 12.0);
        // Day 7 (day 0 of the next week): a week earlier was a gap too, so from day 6.
        assert_eq!(s.values[7 * 24 + 12], 12.0);
        // Everything sampled is untouched.
        assert!((0..n).filter(|i| !gap(*i)).all(|i| s.values[i] == truth(i)));
        // A step that does not divide a day, or a series shorter than one, changes nothing.
        let mut short = Series {
            first_s: 0,
            step_s: 7,
            values: vec![1.0, 1.0],
            gaps: 1,
            sampled_len: 2,
            sampled: vec![true, false],
        };
        assert_eq!(seasonal_fill(&mut short), 0);
        let mut huge =
            Series { first_s: 0, step_s: u64::MAX, values: vec![1.0], gaps: 1, sampled_len: 1, sampled: vec![false] };
        assert_eq!(seasonal_fill(&mut huge), 0);
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
