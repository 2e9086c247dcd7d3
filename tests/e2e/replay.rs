//! `prescale replay` end to end: a trace file with every output, and a real Prometheus
//! whose history was backfilled with `promtool tsdb create-blocks-from openmetrics`.

use std::process::Command;

use crate::harness::*;

/// A bursty request log: quiet, a burst, quiet, a second burst (Azure format).
fn request_log() -> String {
    let mut s = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    let mut t = 0u32;
    let push = |sec: u32, n: u32, s: &mut String| {
        for i in 0..n {
            s.push_str(&format!("2023-11-16 18:{:02}:{:02}.{:07},100,20\n", sec / 60, sec % 60, i * 997 % 10_000_000));
        }
    };
    while t < 3000 {
        let n = if (600..900).contains(&t) || (2000..2100).contains(&t) { 3 } else { u32::from(t.is_multiple_of(7)) };
        push(t, n, &mut s);
        t += 1;
    }
    s
}

/// A fresh directory holding [`request_log`] as `trace.csv`: (directory, trace path).
fn scratch_request_log(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(unique(tag));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.csv");
    std::fs::write(&trace, request_log()).unwrap();
    (dir, trace)
}

#[test]
fn replay_a_trace_file_writes_plan_summary_and_chart() {
    let (dir, trace) = scratch_request_log("prescale-replay");
    let (plan, summary, chart) = (dir.join("plan.csv"), dir.join("summary.json"), dir.join("chart.svg"));
    let (ok, out, err) = prescale(&[
        "replay",
        "--trace",
        trace.to_str().unwrap(),
        "--capacity",
        "0.5",
        "--warmup",
        "60",
        "--slo",
        "5",
        "--plan-out",
        plan.to_str().unwrap(),
        "--summary-out",
        summary.to_str().unwrap(),
        "--chart",
        chart.to_str().unwrap(),
    ]);
    assert!(ok, "{out}\n{err}");
    for p in ["prescale", "reactive", "oracle"] {
        assert!(out.lines().any(|l| l.starts_with(p)), "scorecard row for {p}:\n{out}");
    }
    // Summary: REPLAY.md's keys.
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    for k in
        ["slo_attainment", "replica_seconds", "p50_delay_s", "p99_delay_s", "replica_starts", "oracle_replica_seconds"]
    {
        assert!(s.get(k).is_some(), "summary lacks {k}: {s}");
    }
    let att = s["slo_attainment"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&att));
    assert_eq!(s["policies"].as_array().unwrap().len(), 3);
    // Plan CSV: header, one row per decision time from 0 in steps of 15.
    let text = std::fs::read_to_string(&plan).unwrap();
    let mut lines = text.lines();
    // prescale's plan carries its reason for every decision as a third column.
    assert_eq!(lines.next(), Some("t_s,desired,reason,ready,warming,backlog,late"));
    assert!(lines.all(|l| l.split(',').nth(2).is_some_and(|why| !why.is_empty())), "a decision without a reason");
    let rows = prescale_forecaster::parse_plan_csv(&text).unwrap();
    let t_len = s["trace_seconds"].as_u64().unwrap();
    assert_eq!(rows.len() as u64, t_len.div_ceil(15));
    assert!(rows.iter().enumerate().all(|(i, (t, _))| *t == i as u64 * 15));
    // An outside scorer re-scoring the written plan gets the summary's numbers.
    let tr = prescale_forecaster::parse_trace(&request_log()).unwrap();
    let sc: prescale_forecaster::Scenario = serde_json::from_value(s["scenario"].clone()).unwrap();
    let plan = prescale_forecaster::parse_plan_csv(&text).unwrap();
    let rescored = prescale_forecaster::score_plan(&tr, &sc, &plan).unwrap();
    assert!((rescored.score.slo_attainment - att).abs() < 1e-12, "{} vs {att}", rescored.score.slo_attainment);
    assert_eq!(rescored.score.replica_seconds, s["replica_seconds"].as_f64().unwrap());
    // The misses split into cold starts and a running fleet's, for every policy.
    assert_eq!(rescored.score.cold_start_miss, s["cold_start_miss"].as_f64().unwrap());
    for row in s["policies"].as_array().unwrap() {
        let (att, cold) = (row["slo_attainment"].as_f64().unwrap(), row["cold_start_miss"].as_f64().unwrap());
        assert!((0.0..=1.0 - att + 1e-12).contains(&cold), "{row}");
    }
    assert!(out.contains("late: cold/run"), "{out}");
    // Chart: an SVG with one panel per policy.
    let svg = std::fs::read_to_string(&chart).unwrap();
    assert!(svg.starts_with("<svg") || svg.contains("<svg"), "not an SVG");
    for p in ["prescale —", "reactive —", "oracle —"] {
        assert!(svg.contains(p), "chart lacks the {p} panel");
    }
    // The same chart as a PNG (by the extension), with its text: the font is embedded.
    let png_path = dir.join("chart.png");
    let args = ["replay", "--trace", trace.to_str().unwrap(), "--capacity", "0.5", "--warmup", "60", "--slo", "5"];
    let (ok, out, err) = prescale(&[&args[..], &["--chart", png_path.to_str().unwrap()]].concat());
    assert!(ok, "{out}\n{err}");
    let decoder = png::Decoder::new(std::fs::File::open(&png_path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1400, 3 * 330), "one 330-px panel per policy");
    let px = |x: u32, y: u32| {
        let i = ((y * info.width + x) * 3) as usize;
        (buf[i], buf[i + 1], buf[i + 2])
    };
    for panel in 0..3 {
        let (top, bottom) = (panel * 330, panel * 330 + 330);
        // The plan's orange line, and dark caption text in the panel's top 30 px.
        let orange = (0..info.width)
            .flat_map(|x| (top..bottom).map(move |y| (x, y)))
            .filter(|&(x, y)| px(x, y) == (255, 127, 14))
            .count();
        assert!(orange > 100, "panel {panel}: the plan line is missing ({orange} px)");
        let text = (0..info.width)
            .flat_map(|x| (top..top + 30).map(move |y| (x, y)))
            .filter(|&(x, y)| px(x, y).0 < 80)
            .count();
        assert!(text > 200, "panel {panel}: the caption has no text ({text} dark px)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_into_a_closed_pipe_exits_quietly_and_still_writes_its_files() {
    // `prescale replay ... | head -3`: the reader goes before the scorecard is printed.
    let (dir, trace) = scratch_request_log("prescale-replay-pipe");
    let summary = dir.join("summary.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_prescale"))
        .args(["replay", "--trace", trace.to_str().unwrap(), "--capacity", "0.5", "--warmup", "60", "--slo", "5"])
        .args(["--summary-out", summary.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run prescale");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for prescale");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert!(json["slo_attainment"].as_f64().is_some(), "{json}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Replay `trace` with every policy, then score the written plan with `scripts/rescore.py`,
/// an outside scorer written from REPLAY.md alone (Python, exact arithmetic, no code shared),
/// and check that it reproduces the summary: the scenario's defaults, the oracle's cost, the
/// plan's score and the reactive policy's (which it runs itself).
fn rescored_by_an_outside_scorer(dir: &std::path::Path, trace: &std::path::Path, args: &[&str]) {
    let (plan, summary) = (dir.join("plan.csv"), dir.join("summary.json"));
    let mut all = vec!["replay", "--trace", trace.to_str().unwrap(), "--policy", "all"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--plan-out", plan.to_str().unwrap(), "--summary-out", summary.to_str().unwrap()]);
    let (ok, _, err) = prescale(&all);
    assert!(ok, "{err}");
    let ours: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/rescore.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--trace", trace.to_str().unwrap(), "--plan", plan.to_str().unwrap()])
        .args(args)
        .output()
        .expect("python3 runs the outside scorer");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sc = &ours["scenario"];
    assert_eq!(sc["initial_replicas"], theirs["initial_replicas"], "{ours}\n{theirs}");
    assert_eq!(sc["max_replicas"], theirs["max_replicas"]);
    assert_eq!(ours["trace_seconds"], theirs["trace_seconds"]);
    assert_eq!(ours["oracle_replica_seconds"].as_f64(), theirs["oracle_replica_seconds"].as_f64(), "oracle");
    let row = |name: &str| ours["policies"].as_array().unwrap().iter().find(|r| r["policy"] == name).unwrap().clone();
    for (mine, outside) in [(row("prescale"), &theirs["plan"]), (row("reactive"), &theirs["reactive"])] {
        let what = mine["policy"].as_str().unwrap().to_string();
        let att = (mine["slo_attainment"].as_f64().unwrap(), outside["slo_attainment"].as_f64().unwrap());
        assert!((att.0 - att.1).abs() < 1e-9, "{what}: attainment {} vs {}", att.0, att.1);
        assert_eq!(mine["replica_seconds"].as_f64(), outside["replica_seconds"].as_f64(), "{what}: replica-seconds");
        assert_eq!(mine["replica_starts"], outside["replica_starts"], "{what}: starts");
        for q in ["p50_delay_s", "p99_delay_s"] {
            assert_eq!(mine[q].as_f64(), outside[q].as_f64(), "{what}: {q}");
        }
    }
    // The plan's row is the summary's headline.
    assert_eq!(ours["replica_seconds"], row("prescale")["replica_seconds"]);
}

#[test]
fn an_outside_scorer_written_from_replay_md_reproduces_the_summary() {
    let dir = std::env::temp_dir().join(unique("prescale-rescore"));
    std::fs::create_dir_all(&dir).unwrap();
    // A request log with bursts (W = 60 s), and the first two days of the bundled real rate
    // series at W = 420 s (fractional rates, daily swings, a change every 10 minutes).
    let log = dir.join("log.csv");
    std::fs::write(&log, request_log()).unwrap();
    rescored_by_an_outside_scorer(&dir, &log, &["--capacity", "0.5", "--warmup", "60", "--slo", "5"]);
    let bundled = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/traces/servegen-m-large-14d.csv");
    let text = std::fs::read_to_string(bundled).unwrap();
    let two_days: Vec<&str> = text.lines().take(1 + 2 * 144).collect();
    let series = dir.join("two-days.csv");
    std::fs::write(&series, two_days.join("\n") + "\n").unwrap();
    rescored_by_an_outside_scorer(&dir, &series, &["--capacity", "25", "--warmup", "420", "--slo", "5"]);
    // A sparse client: idle windows (scale to zero, the cooldown, wake-ups) between bursts.
    // Its rates are tenths, which f64 cannot hold: backlogs that reach the oracle's bound
    // exactly and residues of 1e-17 are ties that exact arithmetic decides (`sim::tie`).
    let sparse: String = std::iter::once("window_start_s,rate_rps".to_string())
        .chain((0..144).map(|k| {
            let rate = if k % 5 < 2 || k % 11 == 3 { 0.0 } else { f64::from(k * 37 % 23) / 10.0 };
            format!("{},{rate:.4}", k * 600)
        }))
        .collect::<Vec<_>>()
        .join("\n");
    let sparse_path = dir.join("sparse.csv");
    std::fs::write(&sparse_path, sparse + "\n").unwrap();
    rescored_by_an_outside_scorer(&dir, &sparse_path, &["--capacity", "0.5", "--warmup", "180", "--slo", "5"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_rejects_bad_input_clearly() {
    let dir = std::env::temp_dir().join(unique("prescale-replay-bad"));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bad.csv");
    std::fs::write(&f, "window_start_s,rate_rps\n0,1.0\n600,abc\n").unwrap();
    let (ok, _, err) = prescale(&["replay", "--trace", f.to_str().unwrap(), "--capacity", "1", "--slo", "5"]);
    assert!(!ok);
    assert!(err.contains("line 3"), "names the line: {err}");
    let (ok, _, err) = prescale(&["replay", "--trace", f.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("--capacity"), "{err}");
    // The file is streamed: bytes that are not UTF-8 are a read error on their line.
    std::fs::write(&f, b"window_start_s,rate_rps\n0,1.0\n600,\xff\xfe\n").unwrap();
    let (ok, _, err) = prescale(&["replay", "--trace", f.to_str().unwrap(), "--capacity", "1", "--slo", "5"]);
    assert!(!ok);
    assert!(err.contains("line 3") && err.contains("bad.csv"), "names the file and the line: {err}");
    // A decision interval no planner can walk (above a day, or zero) is refused by the flag's
    // name before the trace is read.
    for bad in ["0", "86401"] {
        let (ok, _, err) = prescale(&["replay", "--interval", bad, "--capacity", "1", "--slo", "5"]);
        assert!(!ok);
        assert!(err.contains("--interval") && err.contains("1..=86400"), "{bad}: {err}");
    }
    let missing = dir.join("missing.csv");
    let (ok, _, err) = prescale(&["replay", "--trace", missing.to_str().unwrap(), "--capacity", "1", "--slo", "5"]);
    assert!(!ok);
    assert!(err.contains("missing.csv"), "names the file: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn replay_from_a_backfilled_prometheus_matches_the_same_csv() {
    if service("PRESCALE_TEST_PROM").is_none() {
        return; // services.sh installs Prometheus (and promtool); skip without it.
    }
    let dir = std::env::temp_dir().join(unique("prescale-backfill"));
    std::fs::create_dir_all(dir.join("data")).unwrap();
    // 16 h of a 5-s demand series ending 2 h ago: 11,520 points, more than one
    // Prometheus range query may return, so the replay must chunk.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let end = (now - 2 * 3600) / 5 * 5;
    let n = 16 * 720;
    let start = end - (n as i64 - 1) * 5;
    let rate = |i: usize| {
        let h = i as f64 * 5.0 / 3600.0;
        let base = 3.0 + 2.0 * (h * std::f64::consts::PI / 8.0).sin().abs();
        let burst = if i % 900 < 60 { 4.0 } else { 0.0 };
        ((base + burst) * 1000.0).round() / 1000.0
    };
    let mut om = String::from("# HELP prescale_demand_rps Demand.\n# TYPE prescale_demand_rps gauge\n");
    let mut csv = String::from("window_start_s,rate_rps\n");
    for i in 0..n {
        om.push_str(&format!("prescale_demand_rps {} {}\n", rate(i), start + i as i64 * 5));
        csv.push_str(&format!("{},{}\n", i * 5, rate(i)));
    }
    om.push_str("# EOF\n");
    std::fs::write(dir.join("demand.csv"), &csv).unwrap();
    let prom = BackfilledPrometheus::start(&om, "count_over_time(prescale_demand_rps[1d])").await;
    let url = prom.url.clone();

    let common = ["--capacity", "1", "--warmup", "60", "--slo", "5", "--policy", "all"];
    let s_prom = dir.join("prom.json");
    let (s, e) = (start.to_string(), end.to_string());
    let mut args = vec![
        "replay",
        "--prometheus",
        &url,
        "--query",
        "prescale_demand_rps",
        "--start",
        &s,
        "--end",
        &e,
        "--step",
        "5s",
    ];
    args.extend(common);
    args.extend(["--summary-out", s_prom.to_str().unwrap()]);
    let (ok, out, err) = prescale(&args);
    drop(prom);
    assert!(ok, "{out}\n{err}");
    let s_csv = dir.join("csv.json");
    let csv_path = dir.join("demand.csv");
    let mut args = vec!["replay", "--trace", csv_path.to_str().unwrap()];
    args.extend(common);
    args.extend(["--summary-out", s_csv.to_str().unwrap()]);
    let (ok, out2, err2) = prescale(&args);
    assert!(ok, "{out2}\n{err2}");
    let a: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&s_prom).unwrap()).unwrap();
    let b: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&s_csv).unwrap()).unwrap();
    assert_eq!(a["trace_seconds"], b["trace_seconds"], "same length");
    assert_eq!(a["policies"].as_array().unwrap().len(), 3);
    for (pa, pb) in a["policies"].as_array().unwrap().iter().zip(b["policies"].as_array().unwrap()) {
        for k in ["slo_attainment", "replica_seconds", "replica_starts"] {
            assert_eq!(pa[k], pb[k], "{} {k}: Prometheus {} vs CSV {}", pa["policy"], pa[k], pb[k]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
