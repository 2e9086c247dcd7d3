//! `prescale replay`: the dry-run forecaster. Replays a trace (a file, the bundled
//! default, or a range of a real Prometheus) through the planner and the reference
//! policies of REPLAY.md, prints the scorecard, writes the plan CSV, the summary JSON
//! and a chart.

pub mod chart;
pub mod prom;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use prescale_forecaster::{
    oracle_replica_seconds, parse_trace, scenario_defaults, simulate, OraclePolicy, Policy, PrescalePolicy,
    ReactivePolicy, Scenario, SimResult, Trace,
};
use serde::Serialize;

/// The trace replayed when no `--trace`/`--prometheus` is given (see examples/traces/README.md).
pub const BUNDLED_TRACE: &str = include_str!("../../../examples/traces/servegen-m-large-14d.csv");
pub const BUNDLED_NAME: &str = "servegen-m-large-14d (bundled; Alibaba ServeGen, Apache-2.0)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    Prescale,
    Reactive,
    Oracle,
    All,
}

/// Everything a replay needs besides the trace.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub capacity: f64,
    pub warmup: u64,
    pub slo: f64,
    pub interval: u64,
    pub min_replicas: u32,
    pub max_replicas: Option<u32>,
    pub initial_replicas: Option<u32>,
    pub policy: Which,
    pub plan_out: Option<PathBuf>,
    pub summary_out: Option<PathBuf>,
    pub chart: Option<PathBuf>,
    pub progress: bool,
}

/// The variants that wrap an error name the step that failed and leave the detail to the
/// source chain (anyhow prints it as "Caused by"), so no line is printed twice.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("not a valid trace")]
    Trace(#[from] prescale_forecaster::TraceError),
    #[error("scenario: {0}")]
    Scenario(String),
    #[error("invalid planner settings")]
    Planner(#[from] prescale_forecaster::planner::PlannerError),
    #[error("cannot write {path}")]
    Write { path: String, source: std::io::Error },
    #[error("chart: {0}")]
    Chart(String),
    #[error("cannot encode the {what}: {message}")]
    Encode { what: &'static str, message: String },
    #[error("prometheus: {0}")]
    Prometheus(String),
}

/// One policy's row of the scorecard.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyRow {
    pub policy: String,
    pub slo_attainment: f64,
    pub replica_seconds: f64,
    pub gpu_hours: f64,
    /// replica_seconds / oracle_replica_seconds.
    pub cost_vs_oracle: f64,
    #[serde(serialize_with = "finite_or_null")]
    pub p50_delay_s: f64,
    #[serde(serialize_with = "finite_or_null")]
    pub p99_delay_s: f64,
    pub replica_starts: u64,
    /// Share of requests late on a cold start (no replica ready when they arrived); the rest
    /// of the misses, `1 − slo_attainment − cold_start_miss`, came on a running fleet.
    pub cold_start_miss: f64,
    pub wall_seconds: f64,
}

fn finite_or_null<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&v.is_finite().then_some(*v), s)
}

/// The summary JSON: REPLAY.md's keys for the primary policy at top level, plus every row.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub trace: String,
    pub trace_seconds: u64,
    pub scenario: Scenario,
    pub policy: String,
    pub slo_attainment: f64,
    pub replica_seconds: f64,
    #[serde(serialize_with = "finite_or_null")]
    pub p50_delay_s: f64,
    #[serde(serialize_with = "finite_or_null")]
    pub p99_delay_s: f64,
    pub replica_starts: u64,
    pub cold_start_miss: f64,
    pub oracle_replica_seconds: f64,
    pub policies: Vec<PolicyRow>,
}

pub struct Replayed {
    pub summary: Summary,
    pub results: Vec<SimResult>,
    /// prescale's reason for each of its decisions (when it ran), in plan order.
    pub reasons: Option<Vec<String>>,
}

/// Replay `trace` (named `name`) as `opts` says. Pure apart from the optional progress
/// bar; writing files is [`write_outputs`].
pub fn replay(trace: &Trace, name: &str, opts: &ReplayOptions) -> Result<Replayed, ReplayError> {
    if !(opts.capacity.is_finite() && opts.capacity > 0.0) {
        return Err(ReplayError::Scenario(format!("--capacity must be > 0, got {}", opts.capacity)));
    }
    if !(opts.slo.is_finite() && opts.slo >= 0.0) {
        return Err(ReplayError::Scenario(format!("--slo must be ≥ 0, got {}", opts.slo)));
    }
    if opts.interval == 0 {
        return Err(ReplayError::Scenario("--interval must be ≥ 1".into()));
    }
    let sc = scenario_defaults(
        trace,
        opts.capacity,
        opts.warmup,
        opts.slo,
        opts.interval,
        opts.min_replicas,
        opts.max_replicas,
        opts.initial_replicas,
    );
    if sc.max_replicas < sc.min_replicas {
        return Err(ReplayError::Scenario(format!(
            "--max-replicas {} is below --min-replicas {}",
            sc.max_replicas, sc.min_replicas
        )));
    }
    let oracle = OraclePolicy::new(trace, &sc);
    let oracle_rs = oracle_replica_seconds(oracle.plan(), sc.interval, sc.warmup, trace.len() as u64);
    let which: Vec<Which> = match opts.policy {
        Which::All => vec![Which::Prescale, Which::Reactive, Which::Oracle],
        w => vec![w],
    };
    let mut results = Vec::new();
    let mut rows = Vec::new();
    let mut reasons = None;
    for w in which {
        let (res, wall) = match w {
            Which::Prescale => {
                let mut pre = PrescalePolicy::new(&sc)?.record_reasons(true);
                let out = run_policy(trace, &sc, &mut pre, opts.progress);
                reasons = Some(pre.reasons().iter().map(|(_, _, why)| why.clone()).collect());
                out
            }
            Which::Reactive => run_policy(trace, &sc, &mut ReactivePolicy::new(&sc), opts.progress),
            _ => run_policy(trace, &sc, &mut OraclePolicy::new(trace, &sc), opts.progress),
        };
        let s = &res.score;
        // The oracle's cost is REPLAY.md's formula, not its simulation.
        let rs = if w == Which::Oracle { oracle_rs } else { s.replica_seconds };
        rows.push(PolicyRow {
            policy: res.policy.clone(),
            slo_attainment: s.slo_attainment,
            replica_seconds: rs,
            gpu_hours: rs / 3600.0,
            cost_vs_oracle: if oracle_rs > 0.0 { rs / oracle_rs } else { f64::NAN },
            p50_delay_s: s.p50_delay_s,
            p99_delay_s: s.p99_delay_s,
            replica_starts: s.replica_starts,
            cold_start_miss: s.cold_start_miss,
            wall_seconds: wall,
        });
        results.push(res);
    }
    let primary = &rows[0];
    let summary = Summary {
        trace: name.to_string(),
        trace_seconds: trace.len() as u64,
        scenario: sc,
        policy: primary.policy.clone(),
        slo_attainment: primary.slo_attainment,
        replica_seconds: primary.replica_seconds,
        p50_delay_s: primary.p50_delay_s,
        p99_delay_s: primary.p99_delay_s,
        replica_starts: primary.replica_starts,
        cold_start_miss: primary.cold_start_miss,
        oracle_replica_seconds: oracle_rs,
        policies: rows,
    };
    Ok(Replayed { summary, results, reasons })
}

/// Simulate one policy, with a progress bar on stderr once it has taken a second. Returns the
/// result and the wall seconds it took.
fn run_policy(trace: &Trace, sc: &Scenario, policy: &mut dyn Policy, progress: bool) -> (SimResult, f64) {
    let started = Instant::now();
    let bar = progress.then(|| progress_bar(policy.name()));
    let mut tick = |s: u64, total: u64| {
        if let Some(b) = &bar {
            if started.elapsed() > Duration::from_secs(1) && b.is_hidden() {
                b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            }
            b.set_length(total);
            b.set_position(s);
        }
    };
    let res = simulate(trace, sc, policy, Some(&mut tick));
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    (res, started.elapsed().as_secs_f64())
}

fn progress_bar(name: &str) -> indicatif::ProgressBar {
    let b = indicatif::ProgressBar::with_draw_target(Some(0), indicatif::ProgressDrawTarget::hidden());
    if let Ok(style) = indicatif::ProgressStyle::with_template("{prefix:>9} [{bar:40}] {percent:>3}% {msg}") {
        b.set_style(style.progress_chars("=> "));
    }
    b.set_prefix(name.to_string());
    b
}

/// `x` as written on the command line when it is of everyday size, in scientific notation
/// otherwise (`{}` writes 1e-300 as 300 digits).
fn short_num(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-3..1e9).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// The scorecard as a text table.
pub fn scorecard(s: &Summary) -> String {
    let mut out = format!(
        "trace {} ({:.1} h) · capacity {} req/s · warm-up {} s · SLO {} s · interval {} s · replicas {}..{} (initial {})\n",
        s.trace,
        s.trace_seconds as f64 / 3600.0,
        short_num(s.scenario.capacity),
        s.scenario.warmup,
        short_num(s.scenario.slo),
        s.scenario.interval,
        s.scenario.min_replicas,
        s.scenario.max_replicas,
        s.scenario.initial_replicas
    );
    out.push_str(&format!(
        "{:<10} {:>9} {:>11} {:>9} {:>9} {:>9} {:>9} {:>15}\n",
        "policy", "SLO att.", "GPU-hours", "vs oracle", "p50 s", "p99 s", "starts", "late: cold/run"
    ));
    let fmt_delay = |d: f64| if d.is_finite() { format!("{d:.0}") } else { "∞".into() };
    for r in &s.policies {
        out.push_str(&format!(
            "{:<10} {:>8.3}% {:>11.1} {:>8.2}× {:>9} {:>9} {:>9} {:>15}\n",
            r.policy,
            r.slo_attainment * 100.0,
            r.gpu_hours,
            r.cost_vs_oracle,
            fmt_delay(r.p50_delay_s),
            fmt_delay(r.p99_delay_s),
            r.replica_starts,
            format!(
                "{:.2}% / {:.2}%",
                r.cold_start_miss * 100.0,
                ((1.0 - r.slo_attainment - r.cold_start_miss) * 100.0).max(0.0)
            )
        ));
    }
    out.push_str(&format!("oracle GPU-hours (REPLAY.md formula): {:.1}\n", s.oracle_replica_seconds / 3600.0));
    out.push_str(
        "late: cold/run = requests late on a cold start (no replica ready, or queued behind such a wait) / late on a running fleet\n",
    );
    out
}

/// Write the plan CSV (primary policy), the summary JSON and the chart, as asked.
pub fn write_outputs(r: &Replayed, opts: &ReplayOptions) -> Result<(), ReplayError> {
    let write = |p: &PathBuf, text: &str| {
        std::fs::write(p, text).map_err(|source| ReplayError::Write { path: p.display().to_string(), source })
    };
    if let Some(p) = &opts.plan_out {
        let why = r.reasons.as_deref().filter(|_| r.summary.policy == "prescale").unwrap_or(&[]);
        write(p, &plan_csv_detailed(&r.results[0], why)?)?;
    }
    if let Some(p) = &opts.summary_out {
        let json = serde_json::to_string_pretty(&r.summary).map_err(|e| encode_error("summary JSON", e))?;
        write(p, &json)?;
    }
    if let Some(p) = &opts.chart {
        chart::draw(p, &r.summary, &r.results).map_err(ReplayError::Chart)?;
    }
    Ok(())
}

/// The plan CSV: `t_s,desired` (what a scorer reads; REPLAY.md allows extra columns), then
/// prescale's reason for the decision (empty for the reference policies) and what the
/// replay saw in its interval: `ready` and `warming` replicas after the decision, the
/// `backlog` at the interval's end, and the `late` arrival mass (requests that arrived in the
/// interval and waited more than the SLO or were never served). Reasons hold commas, so fields
/// are quoted as RFC 4180 says, by the `csv` crate.
pub fn plan_csv_detailed(res: &SimResult, reasons: &[String]) -> Result<String, ReplayError> {
    let mut w = csv::WriterBuilder::new().terminator(csv::Terminator::Any(b'\n')).from_writer(Vec::new());
    let err = |e: csv::Error| encode_error("plan CSV", e);
    w.write_record(["t_s", "desired", "reason", "ready", "warming", "backlog", "late"]).map_err(err)?;
    let num = |v: Option<&f64>| v.map(|x| short_num(*x)).unwrap_or_default();
    let count = |v: Option<&u32>| v.map(u32::to_string).unwrap_or_default();
    for (i, (t, d)) in res.plan.iter().enumerate() {
        let why = reasons.get(i).map(String::as_str).unwrap_or("");
        w.write_record([
            t.to_string().as_str(),
            d.to_string().as_str(),
            why,
            &count(res.ready.get(i)),
            &count(res.warming.get(i)),
            &num(res.backlog.get(i)),
            &num(res.late.get(i)),
        ])
        .map_err(err)?;
    }
    let bytes = w.into_inner().map_err(|e| encode_error("plan CSV", e))?;
    String::from_utf8(bytes).map_err(|e| encode_error("plan CSV", e))
}

fn encode_error(what: &'static str, e: impl std::fmt::Display) -> ReplayError {
    ReplayError::Encode { what, message: e.to_string() }
}

/// Parse a trace file's text.
pub fn load_trace(text: &str) -> Result<Trace, ReplayError> {
    Ok(parse_trace(text)?)
}

/// Parse a trace from a reader, line by line, without holding the file in memory.
pub fn read_trace_file<R: std::io::BufRead>(reader: R) -> Result<Trace, ReplayError> {
    Ok(prescale_forecaster::trace::read_trace(reader)?)
}

#[cfg(test)]
mod tests {
    use super::short_num;

    #[test]
    fn the_plan_csv_carries_reasons_and_each_intervals_fleet_and_misses_and_scorers_read_two_columns() {
        // A burst from zero, replayed by prescale: some of it is late while the first replicas
        // warm up.
        let trace = super::load_trace("window_start_s,rate_rps\n0,0\n60,3\n120,0\n180,0\n").unwrap();
        let opts = super::ReplayOptions {
            capacity: 1.0,
            warmup: 30,
            slo: 2.0,
            interval: 15,
            min_replicas: 0,
            max_replicas: None,
            initial_replicas: None,
            policy: super::Which::Prescale,
            plan_out: None,
            summary_out: None,
            chart: None,
            progress: false,
        };
        let r = super::replay(&trace, "burst", &opts).unwrap();
        let res = &r.results[0];
        assert!(res.score.slo_attainment < 1.0, "the burst should be late while warming up");
        // Reasons hold commas and quotes; the last decision is given none.
        let mut why = r.reasons.clone().unwrap();
        why[1] = "keep alive: p=0.50, idle \"long\"".to_string();
        why.pop();
        let text = super::plan_csv_detailed(res, &why).unwrap();
        assert!(text.starts_with("t_s,desired,reason,ready,warming,backlog,late\n"), "{text}");
        // What an outside scorer reads: the first two columns, the plan itself.
        assert_eq!(prescale_forecaster::parse_plan_csv(&text).unwrap(), res.plan);
        let rows: Vec<csv::StringRecord> =
            csv::Reader::from_reader(text.as_bytes()).records().collect::<Result<_, _>>().unwrap();
        assert_eq!(rows.len(), res.plan.len());
        assert_eq!(&rows[1][2], why[1].as_str());
        assert_eq!(&rows[rows.len() - 1][2], "");
        let mut late = 0.0;
        for (k, row) in rows.iter().enumerate() {
            assert_eq!(row.len(), 7, "{row:?}");
            assert_eq!(row[3].parse::<u32>().unwrap(), res.ready[k]);
            assert_eq!(row[4].parse::<u32>().unwrap(), res.warming[k]);
            assert_eq!(row[5].parse::<f64>().unwrap(), res.backlog[k]);
            late += row[6].parse::<f64>().unwrap();
        }
        // The late column adds up to the misses of the score.
        let missed = (1.0 - res.score.slo_attainment) * res.score.total_arrivals;
        assert!(missed > 0.0 && (late - missed).abs() < 1e-9, "late {late} vs missed {missed}");
    }

    #[test]
    fn the_scorecard_splits_misses_into_cold_starts_and_a_running_fleet() {
        // From zero, 10 s of 1 req/s that wait for the first replica's warm-up (cold), then
        // after a pause a burst of 6 req/s on the replicas still running (not cold).
        let mut text = String::from("window_start_s,rate_rps\n");
        for s in 0..120 {
            let rate = match s {
                0..10 => 1.0,
                60..90 => 6.0,
                _ => 0.0,
            };
            text.push_str(&format!("{s},{rate}\n"));
        }
        let trace = super::load_trace(&text).unwrap();
        let opts = super::ReplayOptions {
            capacity: 1.0,
            warmup: 5,
            slo: 2.0,
            interval: 1,
            min_replicas: 0,
            max_replicas: None,
            initial_replicas: Some(0),
            policy: super::Which::Reactive,
            plan_out: None,
            summary_out: None,
            chart: None,
            progress: false,
        };
        let r = super::replay(&trace, "t", &opts).unwrap();
        let row = &r.summary.policies[0];
        assert!(row.cold_start_miss > 0.0, "arrivals before the first replica is ready are cold");
        let run = 1.0 - row.slo_attainment - row.cold_start_miss;
        assert!(run > 0.0, "the burst outruns the running fleet");
        assert_eq!(r.summary.cold_start_miss, row.cold_start_miss);
        let table = super::scorecard(&r.summary);
        let want = format!("{:.2}% / {:.2}%", row.cold_start_miss * 100.0, run * 100.0);
        assert!(table.lines().any(|l| l.starts_with("reactive") && l.ends_with(&want)), "{want} in\n{table}");
    }

    #[test]
    fn scorecard_numbers_stay_short() {
        assert_eq!(short_num(25.0), "25");
        assert_eq!(short_num(0.25), "0.25");
        assert_eq!(short_num(0.0), "0");
        assert_eq!(short_num(1e-300), "1e-300");
        assert_eq!(short_num(2.5e12), "2.5e12");
    }
}
