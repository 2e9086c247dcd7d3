//! Where prescale wins and loses against the reactive reference on one scenario: both
//! replayed by REPLAY.md's fleet model, their late arrival mass and their spend compared window
//! by window, and optionally every decision in a time range with the planner's reason.
//!
//! ```text
//! cargo run --release -p prescale-forecaster --example compare -- \
//!     TRACE CAPACITY SLO WARMUP [--window 600] [--top 10] [--from T --to T]
//! ```
//!
//! This is how a planner change is looked for: a scorecard says that a scenario loses, this
//! says in which windows and on which decisions (ARCHITECTURE.md's "Tried" entries were found
//! this way). Windows are `--window` seconds (default 600, a ServeGen window), rounded to whole
//! decision intervals; late mass is `SimResult::late`, so the windows add up to the scores.

use std::process::ExitCode;

use prescale_forecaster::{scenario_defaults, simulate, trace, PrescalePolicy, ReactivePolicy, SimResult};

const INTERVAL: u64 = 15;

struct Args {
    trace: String,
    capacity: f64,
    slo: f64,
    warmup: u64,
    window: u64,
    top: usize,
    range: Option<(u64, u64)>,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut pos = Vec::new();
    let (mut window, mut top, mut from, mut to) = (600u64, 10usize, None, None);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--window" => window = num(&value("--window")?, "--window")?,
            "--top" => top = num(&value("--top")?, "--top")?,
            "--from" => from = Some(num(&value("--from")?, "--from")?),
            "--to" => to = Some(num(&value("--to")?, "--to")?),
            _ if a.starts_with("--") => return Err(format!("unknown option {a}")),
            _ => pos.push(a),
        }
    }
    let [trace, capacity, slo, warmup] = <[String; 4]>::try_from(pos)
        .map_err(|p| format!("expected TRACE CAPACITY SLO WARMUP, got {} positional arguments", p.len()))?;
    let capacity: f64 = num(&capacity, "CAPACITY")?;
    let slo: f64 = num(&slo, "SLO")?;
    if !(capacity.is_finite() && capacity > 0.0 && slo.is_finite() && slo >= 0.0) {
        return Err("CAPACITY must be > 0 and SLO ≥ 0".into());
    }
    let range = match (from, to) {
        (Some(f), Some(t)) if f <= t => Some((f, t)),
        (None, None) => None,
        _ => return Err("--from and --to go together, --from ≤ --to".into()),
    };
    Ok(Args { trace, capacity, slo, warmup: num(&warmup, "WARMUP")?, window: window.max(1), top, range })
}

fn num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("{what}: not a number: {s:?}"))
}

/// Per window: (late mass, replica-seconds, arrival mass).
fn by_window(r: &SimResult, per: usize) -> Vec<(f64, f64, f64)> {
    let mut out = Vec::new();
    for k in (0..r.plan.len()).step_by(per) {
        let end = (k + per).min(r.plan.len());
        let late: f64 = r.late[k..end].iter().sum();
        // Exact but for a trace's last, possibly shorter, interval (counted whole): replicas
        // are started and removed only at decisions, and readiness within an interval moves
        // one from warming to ready, which costs the same.
        let rs: f64 = (k..end).map(|j| f64::from(r.ready[j] + r.warming[j]) * INTERVAL as f64).sum();
        let arr: f64 = r.arrivals[k..end].iter().sum();
        out.push((late, rs, arr));
    }
    out
}

fn main() -> ExitCode {
    let a = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "compare: {e}\nusage: compare TRACE CAPACITY SLO WARMUP [--window S] [--top N] [--from T --to T]"
            );
            return ExitCode::from(2);
        }
    };
    let tr = match std::fs::read_to_string(&a.trace)
        .map_err(|e| e.to_string())
        .and_then(|t| trace::parse_trace(&t).map_err(|e| e.to_string()))
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("compare: {}: {e}", a.trace);
            return ExitCode::FAILURE;
        }
    };
    let sc = scenario_defaults(&tr, a.capacity, a.warmup, a.slo, INTERVAL, 0, None, None);
    let mut pre = match PrescalePolicy::new(&sc) {
        Ok(p) => p.record_reasons(a.range.is_some()).record_margins(a.range),
        Err(e) => {
            eprintln!("compare: {e}");
            return ExitCode::FAILURE;
        }
    };
    let p = simulate(&tr, &sc, &mut pre, None);
    let r = simulate(&tr, &sc, &mut ReactivePolicy::new(&sc), None);
    println!(
        "{} μ={} SLO={} W={} (initial {}, max {} replicas)",
        a.trace, a.capacity, a.slo, a.warmup, sc.initial_replicas, sc.max_replicas
    );
    for (name, s) in [("prescale", &p), ("reactive", &r)] {
        println!(
            "  {name:<8} attainment {:>8.4}%  {:>10.2} GPU-hours  {:>7} starts  late mass {:.1}",
            s.score.slo_attainment * 100.0,
            s.score.gpu_hours,
            s.score.replica_starts,
            s.late.iter().sum::<f64>()
        );
    }

    let per = usize::try_from(a.window.div_ceil(INTERVAL)).unwrap_or(usize::MAX).max(1);
    let (wp, wr) = (by_window(&p, per), by_window(&r, per));
    let mut rows: Vec<(usize, f64)> = wp.iter().zip(&wr).enumerate().map(|(k, (x, y))| (k, x.0 - y.0)).collect();
    let win_s = per as u64 * INTERVAL;
    let show = |title: &str, rows: &[(usize, f64)]| {
        println!("\n{title} ({win_s}-s windows)");
        println!(
            "  {:>9} {:>10} | {:>10} {:>8} | {:>10} {:>8} | {:>10}",
            "t_s", "arrivals", "pre late", "pre GPUh", "rea late", "rea GPUh", "pre − rea"
        );
        for &(k, d) in rows.iter().filter(|x| x.1 != 0.0) {
            let (x, y) = (wp[k], wr[k]);
            println!(
                "  {:>9} {:>10.1} | {:>10.1} {:>8.2} | {:>10.1} {:>8.2} | {:>+10.1}",
                k as u64 * win_s,
                x.2,
                x.0,
                x.1 / 3600.0,
                y.0,
                y.1 / 3600.0,
                d
            );
        }
    };
    rows.sort_by(|x, y| y.1.total_cmp(&x.1));
    let worse: Vec<_> = rows.iter().take(a.top).copied().filter(|x| x.1 > 0.0).collect();
    show("windows where prescale is later than reactive", &worse);
    let better: Vec<_> = rows.iter().rev().take(a.top).copied().filter(|x| x.1 < 0.0).collect();
    show("windows where prescale is on time more than reactive", &better);
    let spend: Vec<f64> = wp.iter().zip(&wr).map(|(x, y)| x.1 - y.1).collect();
    println!(
        "\nspend: prescale over reactive in {} windows ({:+.2} GPU-hours there), under in {} ({:+.2})",
        spend.iter().filter(|&&d| d > 0.0).count(),
        spend.iter().filter(|&&d| d > 0.0).sum::<f64>() / 3600.0,
        spend.iter().filter(|&&d| d < 0.0).count(),
        spend.iter().filter(|&&d| d < 0.0).sum::<f64>() / 3600.0,
    );

    if let Some((from, to)) = a.range {
        println!("\ndecisions {from}..={to} s (ready / warming after the decision; backlog at the interval's end;");
        println!("a `follows` line whenever the margin the planner follows changes)");
        let margins: std::collections::HashMap<u64, Option<&str>> =
            pre.margins().iter().map(|(t, m)| (*t, m.as_deref())).collect();
        let mut followed: Option<Option<&str>> = None;
        for (k, &(t, d)) in p.plan.iter().enumerate().filter(|(_, x)| (from..=to).contains(&x.0)) {
            let why = pre.reasons().get(k).map(|x| x.2.as_str()).unwrap_or("");
            if let Some(&m) = margins.get(&t) {
                if followed != Some(m) {
                    println!("  {t:>9} follows: {}", m.unwrap_or("(no margin yet: the young planner's default)"));
                    followed = Some(m);
                }
            }
            println!(
                "  {t:>9} arr {:>8.2} late {:>7.1} | pre {d:>5} = {:>5} + {:>5} b {:>9.1} | rea {:>5} = {:>5} + {:>5} b {:>9.1} | {why}",
                p.arrivals[k],
                p.late[k],
                p.ready[k],
                p.warming[k],
                p.backlog[k],
                r.plan[k].1,
                r.ready[k],
                r.warming[k],
                r.backlog[k],
            );
        }
    }
    ExitCode::SUCCESS
}
