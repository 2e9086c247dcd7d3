//! Warm start: `serve --history-prometheus` reads back the demand prescale observed for a
//! ScaledObject from a real Prometheus (backfilled with two days of it, as if earlier
//! prescale replicas had exported it) and replays it through the planner before answering.

use crate::harness::*;

const DAY: i64 = 86_400;

/// The level of the daily pattern at unix second `t`: 2 replica-equivalents at night, 12
/// from 09:00 to 17:00 UTC.
fn level(t: i64) -> f64 {
    if (9..17).contains(&(t.rem_euclid(DAY) / 3600)) {
        12.0
    } else {
        2.0
    }
}

/// Two days of the daily pattern at one sample a minute, ending 2 h ago (backfill cannot
/// write into Prometheus's head block), with no sample for the two hours either side of
/// the last 09:00 or 17:00 UTC at least 3 h before the end (as when every replica was down
/// then). Returns the exposition and the time of that change.
fn history(ns: &str, name: &str) -> (String, i64) {
    let (series, change) = history_series(&format!("namespace=\"{ns}\",scaledobject=\"{name}\""), level);
    (format!("{OM_HEAD}{series}# EOF\n"), change)
}

const OM_HEAD: &str =
    "# HELP prescale_observed_demand_replicas Demand.\n# TYPE prescale_observed_demand_replicas gauge\n";

/// The samples of [`history`] for one series (its labels inside the braces), at `level`.
fn history_series(labels: &str, level: fn(i64) -> f64) -> (String, i64) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let end = (now - 2 * 3600) / 60 * 60;
    let change = (0..DAY / 60)
        .map(|k| (end - 3 * 3600) / 60 * 60 - k * 60)
        .find(|t| self::level(*t) != self::level(t - 60))
        .expect("a change every day");
    let mut om = String::new();
    let mut t = end - 2 * DAY;
    while t <= end {
        if !(change - 2 * 3600..change + 2 * 3600).contains(&t) {
            om.push_str(&format!("prescale_observed_demand_replicas{{{labels}}} {} {t}\n", level(t)));
        }
        t += 60;
    }
    (om, change)
}

/// The ScaledObject's debug view once its warm-start note starts with `note` (it reads
/// "warming from …" while the history is replayed).
async fn debug_once(srv: &Server, ns: &str, name: &str, note: &str) -> Option<serde_json::Value> {
    let (code, body) = srv.get(&format!("/debug/scalers/{ns}/{name}")).await;
    let v: serde_json::Value = serde_json::from_str(&body).ok().filter(|_| code == 200)?;
    // One entry per trigger of the ScaledObject; this test's has one.
    let t = v["triggers"].get(0)?.clone();
    t["snapshot"]["history"].as_str()?.starts_with(note).then_some(t)
}

/// Points of the planner's coarse history tier at the daytime level (≥ 11).
fn peak_points(d: &serde_json::Value) -> usize {
    d["planner"]["hourly"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["rate"].as_f64().is_some_and(|r| r >= 11.0))
        .count()
}

/// The live signal: a constant 2 replica-equivalents, from the same Prometheus.
fn live_metadata(prom: &BackfilledPrometheus) -> [(&'static str, &str); 5] {
    [
        ("prometheusServerAddress", prom.url.as_str()),
        ("prometheusQuery", "vector(2)"),
        ("prometheusPerReplica", "1"),
        ("warmupSeconds", "300"),
        ("sampleSeconds", "15"),
    ]
}

type Client = prescale::proto::external_scaler_client::ExternalScalerClient<tonic::transport::Channel>;

/// `serve --history-prometheus` once it answers GetMetrics for `so`: the server, its client,
/// the answer.
async fn warm_server(prom: &BackfilledPrometheus, so: &prescale::proto::ScaledObjectRef) -> (Server, Client, i64) {
    let warm = Server::start(&["--history-prometheus", &prom.url]);
    let c = warm.client().await;
    let v = eventually(90, "GetMetrics answers after the warm start", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { metric(&mut c, &so).await.ok() }
    })
    .await;
    (warm, c, v)
}

#[tokio::test]
async fn a_restarted_serve_warms_its_planner_from_prometheus_and_exports_what_it_observes() {
    if service("PRESCALE_TEST_PROM").is_none() {
        return; // services.sh installs Prometheus (and promtool); skip without it.
    }
    let (ns, name) = ("hist", unique("warm"));
    let query = format!("count_over_time(prescale_observed_demand_replicas{{scaledobject=\"{name}\"}}[3d])");
    let (om, change) = history(ns, &name);
    let prom = BackfilledPrometheus::start(&om, &query).await;
    let md = live_metadata(&prom);
    let so = sref(ns, &name, &md);
    let (warm, c, v) = warm_server(&prom, &so).await;
    assert!(v >= 2, "the plan covers the live demand of 2: {v}");
    let d = eventually(60, "the warm start done", || debug_once(&warm, ns, &name, "warmed from")).await;
    let note = d["snapshot"]["history"].as_str().unwrap_or_default().to_string();
    assert!(note.starts_with("warmed from"), "{d}");
    let fed: usize = note.split(": ").nth(1).and_then(|s| s.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
    // Two days on a 15-s step: 11,521 samples, fed up to the last one (not repeated to now).
    assert!((11_000..=11_600).contains(&fed), "{note}");
    // The daytime peaks of 12 are only in the history read back (the live demand is 2).
    let peak_hours = peak_points(&d);
    assert!(peak_hours >= 40, "two days of daytime peaks in the history tiers, got {peak_hours} points");
    // The gap was filled from a day earlier: after the change inside it the planner learnt the
    // level that followed the change, not the one before the gap held flat.
    assert!(note.contains("steps without a sample, filled from a week or a day earlier"), "{note}");
    let after: Vec<f64> = d["planner"]["hourly"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["t_s"].as_f64().is_some_and(|t| (change as f64 + 600.0..change as f64 + 6_600.0).contains(&t)))
        .filter_map(|p| p["rate"].as_f64())
        .collect();
    assert!(after.len() >= 15, "the 5-minute points of the gap's second half: {after:?}");
    let want = level(change);
    assert!(after.iter().all(|r| (r - want).abs() < 0.5), "{want} after the change at {change}: {after:?}");
    // It exports what it observes, for the next restart to read back.
    let (_, metrics) = warm.get("/metrics").await;
    let line = format!("prescale_observed_demand_replicas{{namespace=\"{ns}\",scaledobject=\"{name}\"}} 2");
    assert!(metrics.lines().any(|l| l.starts_with(&line)), "{line} not in /metrics");

    // A ScaledObject in `mode: reactive` records its observed demand too, so switching it to
    // the planner later starts warm.
    let reactive_name = unique("reactive");
    let mut md_reactive = md.to_vec();
    md_reactive.push(("mode", "reactive"));
    let so_r = sref(ns, &reactive_name, &md_reactive);
    eventually(60, "the reactive ScaledObject answers", || {
        let (mut c, so) = (c.clone(), so_r.clone());
        async move { metric(&mut c, &so).await.ok() }
    })
    .await;
    let line_r = format!("prescale_observed_demand_replicas{{namespace=\"{ns}\",scaledobject=\"{reactive_name}\"}} 2");
    eventually(30, "the reactive ScaledObject's observed demand on /metrics", || {
        let line_r = line_r.clone();
        let warm = &warm;
        async move { warm.get("/metrics").await.1.lines().any(|l| l.starts_with(&line_r)).then_some(()) }
    })
    .await;

    // The same history replayed offline: "what would prescale have done" for this
    // ScaledObject, its query built from the name, in replica-equivalents (capacity 1).
    let summary = std::env::temp_dir().join(format!("{}.json", unique("so-replay")));
    let so_arg = format!("{ns}/{name}");
    let (ok, out, err) = prescale(&[
        "replay",
        "--prometheus",
        &prom.url,
        "--scaled-object",
        &so_arg,
        "--start",
        "now-3d",
        "--end",
        "now",
        "--step",
        "60s",
        "--slo",
        "5",
        "--warmup",
        "300",
        "--policy",
        "prescale",
        "--summary-out",
        summary.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let _ = std::fs::remove_file(&summary);
    assert_eq!(s["scenario"]["capacity"], 1.0, "replica-equivalents: one replica serves 1");
    let secs = s["trace_seconds"].as_u64().unwrap();
    assert!((2 * DAY as u64..2 * DAY as u64 + 3 * 3600).contains(&secs), "two days and the staleness tail: {secs}");
    assert!(s["trace"].as_str().unwrap().contains("scaledobject=\""), "{s}");
    let (ok, _, err) = prescale(&[
        "replay",
        "--prometheus",
        &prom.url,
        "--scaled-object",
        "no-slash",
        "--start",
        "now-1h",
        "--end",
        "now",
        "--slo",
        "5",
    ]);
    assert!(!ok && err.contains("NAMESPACE/NAME"), "{err}");

    // Without history (Prometheus unreachable) the planner starts cold but still answers,
    // and says why.
    let cold = Server::start(&["--history-prometheus", "http://127.0.0.1:1"]);
    let c2 = cold.client().await;
    eventually(60, "GetMetrics answers from a cold start", || {
        let (mut c, so) = (c2.clone(), so.clone());
        async move { metric(&mut c, &so).await.ok() }
    })
    .await;
    let d = eventually(60, "the cold start noted", || debug_once(&cold, ns, &name, "no history")).await;
    let note = d["snapshot"]["history"].as_str().unwrap_or_default();
    assert!(note.contains("cold start"), "{d}");
    assert_eq!(peak_points(&d), 0, "a cold planner has seen no peak");
}

#[tokio::test]
async fn a_warm_start_reads_history_scraped_without_honor_labels() {
    if service("PRESCALE_TEST_PROM").is_none() {
        return;
    }
    // prescale runs in the ScaledObject's namespace. Scraped with `honor_labels: false` (a
    // ServiceMonitor's default), every series carries the target's `namespace` and ours is
    // kept as `exported_namespace`, so `namespace="infer"` matches the ScaledObjects of every
    // namespace that prescale serves.
    let (ns, name) = ("infer", unique("exported"));
    let own = format!("namespace=\"{ns}\",exported_namespace=\"{ns}\",scaledobject=\"{name}\"");
    let (own, _) = history_series(&own, level);
    // A ScaledObject of the same name in another namespace: 40 all day.
    let other = format!("namespace=\"{ns}\",exported_namespace=\"batch\",scaledobject=\"{name}\"");
    let (other, _) = history_series(&other, |_| 40.0);
    let ready = format!("count(count_over_time(prescale_observed_demand_replicas{{scaledobject=\"{name}\"}}[3d]))");
    let prom = BackfilledPrometheus::start(&format!("{OM_HEAD}{own}{other}# EOF\n"), &ready).await;
    let (warm, _, _) = warm_server(&prom, &sref(ns, &name, &live_metadata(&prom))).await;
    let d = eventually(60, "the warm start done", || debug_once(&warm, ns, &name, "warmed from")).await;
    let rates: Vec<f64> =
        d["planner"]["hourly"].as_array().into_iter().flatten().filter_map(|p| p["rate"].as_f64()).collect();
    assert!(peak_points(&d) >= 40, "two days of daytime peaks read back: {rates:?}");
    assert!(rates.iter().all(|r| *r < 13.0), "the other namespace's ScaledObject (40) was read: {rates:?}");

    // That label shape is what a real Prometheus makes of prescale's own /metrics.
    let target = warm.http.trim_start_matches("http://");
    let cfg = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n- job_name: prescale\n  honor_labels: false\n  \
         static_configs:\n  - targets: ['{target}']\n    labels:\n      namespace: {ns}\n"
    );
    let live = format!(
        "prescale_observed_demand_replicas{{namespace=\"{ns}\",exported_namespace=\"{ns}\",scaledobject=\"{name}\"}}"
    );
    let _scraper = BackfilledPrometheus::start_with(None, &cfg, &live).await;
}
