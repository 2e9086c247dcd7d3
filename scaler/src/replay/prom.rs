//! Pull a demand history from a real Prometheus (`/api/v1/query_range`, in chunks
//! under its 11,000-points-per-series limit) and turn it into a rate-series trace.

use std::time::Duration;

use prescale_forecaster::trace::{try_trace_from_rates, MAX_TRACE_SECONDS};
use prescale_forecaster::Trace;

/// Prometheus refuses more than 11,000 points per series; stay well under.
pub const MAX_POINTS_PER_QUERY: u64 = 10_000;

#[derive(Debug, Clone, PartialEq)]
pub struct RangeQuery {
    pub server: String,
    pub query: String,
    /// Unix seconds.
    pub start: i64,
    pub end: i64,
    pub step_s: u64,
}

/// A point in time: unix seconds, RFC 3339, `now`, or `now-<duration>` (`now-7d`).
pub fn parse_time(s: &str, now: i64) -> Result<i64, String> {
    let s = s.trim();
    if s == "now" {
        return Ok(now);
    }
    if let Some(rest) = s.strip_prefix("now-") {
        let d = humantime::parse_duration(rest).map_err(|e| format!("{s}: {e}"))?;
        return Ok(now - d.as_secs() as i64);
    }
    if let Ok(n) = s.parse::<f64>() {
        if n.is_finite() {
            return Ok(n as i64);
        }
    }
    humantime::parse_rfc3339_weak(s)
        .map(|t| t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0))
        .map_err(|e| format!("{s}: not a time (unix seconds, RFC 3339, now, now-7d): {e}"))
}

/// The chunks `[start, end]` of at most MAX_POINTS_PER_QUERY points each, aligned on step.
pub fn chunks(start: i64, end: i64, step: u64) -> Vec<(i64, i64)> {
    let step = step.max(1) as i64;
    let span = (MAX_POINTS_PER_QUERY as i64 - 1) * step;
    let mut out = Vec::new();
    let mut s = start;
    while s <= end {
        let e = (s + span).min(end);
        out.push((s, e));
        s = e + step;
    }
    out
}

/// Fetch the range and build a trace of `step`-wide windows. Gaps (no sample for a
/// step) are filled with the previous value and counted; a non-finite or negative
/// value is an error.
pub async fn fetch(client: &reqwest::Client, q: &RangeQuery) -> Result<(Trace, usize), String> {
    let s = fetch_series(client, q).await?;
    let trace = try_trace_from_rates(q.step_s.max(1), &s.values).map_err(|e| e.to_string())?;
    Ok((trace, s.gaps))
}

/// A range query's one series on its step grid, from its first sample on.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Unix seconds of `values[0]`.
    pub first_s: i64,
    pub step_s: u64,
    pub values: Vec<f64>,
    /// Steps without a sample, filled with the previous value.
    pub gaps: usize,
    /// Steps from the first through the last step that had a sample (the rest of `values`
    /// repeats the last sample up to the end of the range).
    pub sampled_len: usize,
    /// Whether each step of `values` had a sample.
    pub sampled: Vec<bool>,
}

/// Puts the samples of one successful `query_range` answer (`data.result`, at most one
/// series) into `values`, slot `(t − start) / step`; samples outside the slots are dropped.
/// A sample that is not a finite rate ≥ 0, or an answer of the wrong shape, is an error.
pub fn place_samples(
    body: &serde_json::Value,
    start: i64,
    step: u64,
    values: &mut [Option<f64>],
) -> Result<(), String> {
    let result = body["data"]["result"].as_array().ok_or("no data.result in the answer")?;
    match result.len() {
        0 => return Ok(()),
        1 => {}
        k => return Err(format!("the query returned {k} series; it must return one (wrap it in sum(...))")),
    }
    let step = i64::try_from(step.max(1)).unwrap_or(i64::MAX);
    for v in result[0]["values"].as_array().into_iter().flatten() {
        let t = v[0].as_f64().filter(|t| t.is_finite()).ok_or("sample without a timestamp")?;
        let x: f64 = v[1].as_str().and_then(|s| s.parse().ok()).ok_or("sample value is not a number")?;
        if !x.is_finite() || x < 0.0 {
            return Err(format!("sample at {t} is {x}: demand must be a finite rate ≥ 0"));
        }
        // A timestamp before `start` or far outside any slot (a misbehaving server) is dropped.
        let slot = (t as i64).checked_sub(start).filter(|d| *d >= 0).map(|d| d / step);
        if let Some(slot) = slot.and_then(|k| usize::try_from(k).ok()).and_then(|k| values.get_mut(k)) {
            *slot = Some(x);
        }
    }
    Ok(())
}

/// Fetch the range as a [`Series`] (see [`fetch`] for the rules).
pub async fn fetch_series(client: &reqwest::Client, q: &RangeQuery) -> Result<Series, String> {
    if q.end <= q.start {
        return Err(format!("--end ({}) must be after --start ({})", q.end, q.start));
    }
    let span = q.end.abs_diff(q.start);
    if span > MAX_TRACE_SECONDS {
        // Checked before anything is fetched or allocated (one slot per step).
        return Err(format!("--start..--end spans {span} s; a replay covers at most {MAX_TRACE_SECONDS} s (366 days)"));
    }
    let step = q.step_s.max(1);
    let n = (span / step) as usize + 1;
    let mut values: Vec<Option<f64>> = vec![None; n];
    for (s, e) in chunks(q.start, q.end, step) {
        let url = format!("{}/api/v1/query_range", q.server.trim_end_matches('/'));
        let resp = client
            .get(&url)
            .query(&[
                ("query", q.query.as_str()),
                ("start", &s.to_string()),
                ("end", &e.to_string()),
                ("step", &step.to_string()),
            ])
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| crate::redact::redact_text(&e.without_url().to_string()))?;
        let status = resp.status();
        // A proxy in front of Prometheus may answer an error page that is no JSON: its status
        // is the error then, not the decoder's complaint.
        let body: serde_json::Value = match resp.json().await {
            Ok(body) => body,
            Err(_) if !status.is_success() => {
                return Err(format!("Prometheus answered {status} (a body that is no JSON)"))
            }
            Err(e) => return Err(e.without_url().to_string()),
        };
        if !status.is_success() || body["status"] != "success" {
            return Err(format!("Prometheus answered {status}: {}", body["error"].as_str().unwrap_or("no error text")));
        }
        place_samples(&body, q.start, step, &mut values)?;
    }
    let first = values.iter().position(Option::is_some).ok_or("the query returned no samples in the range")?;
    let last_sampled = values.iter().rposition(Option::is_some).unwrap_or(first);
    let mut gaps = 0;
    let mut last = 0.0;
    let rates: Vec<f64> = values[first..]
        .iter()
        .map(|v| match v {
            Some(x) => {
                last = *x;
                *x
            }
            None => {
                gaps += 1;
                last
            }
        })
        .collect();
    Ok(Series {
        first_s: q.start + first as i64 * step as i64,
        step_s: step,
        values: rates,
        gaps,
        sampled_len: last_sampled + 1 - first,
        sampled: values[first..].iter().map(Option::is_some).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_range_under_the_point_limit() {
        let c = chunks(0, 1_000_000, 15);
        assert_eq!(c.first().unwrap().0, 0);
        assert_eq!(c.last().unwrap().1, 1_000_000);
        for w in c.windows(2) {
            assert_eq!(w[1].0, w[0].1 + 15, "contiguous, no overlap");
        }
        for (s, e) in &c {
            assert!((e - s) / 15 < MAX_POINTS_PER_QUERY as i64);
        }
        assert_eq!(chunks(10, 10, 15), vec![(10, 10)]);
    }

    #[tokio::test]
    async fn a_range_longer_than_a_replay_is_refused_before_any_request() {
        // Port 1 refuses connections: reaching it would be a different error.
        let q = RangeQuery {
            server: "http://127.0.0.1:1".into(),
            query: "up".into(),
            start: 0,
            end: 1_700_000_000,
            step_s: 1,
        };
        let err = fetch(&reqwest::Client::new(), &q).await.unwrap_err();
        assert!(err.contains("366 days"), "{err}");
        let q = RangeQuery { end: 3600, ..q };
        let err = fetch(&reqwest::Client::new(), &q).await.unwrap_err();
        assert!(!err.contains("366 days"), "an hour is fine: {err}");
    }

    #[test]
    fn an_answer_is_placed_by_its_timestamps_and_a_misbehaving_one_loses_nothing_else() {
        let answer = |values: &str| -> serde_json::Value {
            serde_json::from_str(&format!(
                r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{{}},"values":{values}}}]}}}}"#
            ))
            .unwrap()
        };
        let mut v = vec![None; 4];
        place_samples(&answer(r#"[[1000,"1.5"],[1030,"2"],[1045.0,"0"]]"#), 1000, 15, &mut v).unwrap();
        assert_eq!(v, vec![Some(1.5), None, Some(2.0), Some(0.0)]);
        // Timestamps before the start (once put in slot 0), past the end or absurd (-1e19
        // once overflowed the subtraction) are dropped; the slots they do not name keep theirs.
        let odd = r#"[[985,"7"],[-1e19,"7"],[9.3e18,"7"],[1e300,"7"],[1060,"7"],[1015,"3"]]"#;
        place_samples(&answer(odd), 1000, 15, &mut v).unwrap();
        assert_eq!(v, vec![Some(1.5), Some(3.0), Some(2.0), Some(0.0)]);
        for (bad, why) in [
            (answer(r#"[[1000,"NaN"]]"#), "finite rate"),
            (answer(r#"[[1000,"-1"]]"#), "finite rate"),
            (answer(r#"[[1000,"x"]]"#), "not a number"),
            (answer(r#"[["t","1"]]"#), "timestamp"),
            (serde_json::json!({"data": {}}), "data.result"),
            (serde_json::json!({"data": {"result": [{}, {}]}}), "2 series"),
        ] {
            let err = place_samples(&bad, 1000, 15, &mut v).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let mut empty = vec![None; 4];
        place_samples(&serde_json::json!({"data": {"result": []}}), 1000, 0, &mut empty).unwrap();
        assert_eq!(empty, vec![None; 4]);
    }

    #[test]
    fn times() {
        assert_eq!(parse_time("now", 1000).unwrap(), 1000);
        assert_eq!(parse_time("now-1h", 10_000).unwrap(), 6400);
        assert_eq!(parse_time("1700000000", 0).unwrap(), 1_700_000_000);
        assert_eq!(parse_time("2023-11-14T22:13:20Z", 0).unwrap(), 1_700_000_000);
        assert!(parse_time("yesterday", 0).is_err());
    }
}
