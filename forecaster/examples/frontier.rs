//! How far a rate series can be planned at all: a hindsight frontier for rule 3.
//!
//! ```text
//! cargo run --release -p prescale-forecaster --example frontier -- [TRACE] [CAPACITY] [SLO]
//! ```
//!
//! Defaults: `../shared/traces/servegen-m-large-14d.csv`, capacity 25, SLO 5 s (the dev
//! trace of rule 3). The trace must be a rate series: its window grid is what the policies
//! below are told for free.
//!
//! A rate series changes only at window boundaries, so a causal planner decides each window's
//! capacity W before it starts, from the windows before it. The family replayed here does just
//! that, with everything a planner would have to learn handed to it: the grid, and a margin
//! picked in hindsight from a sweep over the whole trace. At the last decision from which a
//! start is ready by the next boundary it orders enough replicas for `base` times a margin,
//! where `base` is the largest rate of the current window and the `K − 1` windows before it;
//! once the new window's rate has been seen for one interval it sheds down to that window's
//! need (rate plus the drain of the backlog over the SLO). Two margin families are swept:
//!
//! - `flat`: `base · m`, one relative margin at every level;
//! - `scaled`: the planner's own two refinements, `base'· exp(3 (m − 1) / sqrt(base'/μ + 1))`
//!   (a margin that narrows as the fleet grows, as a count process's relative noise does),
//!   where `base'` is `base` moved 30 % of the way up towards the 1-hour mean of the window
//!   rates when it dips below it (a dip refills).
//!
//! Every point is a real replay through the simulator of REPLAY.md, next to the planner's own
//! and the oracle's cost.
//!
//! It prints, per warm-up, the best attainment this family reaches within 1.2× the oracle's
//! GPU-hours and within the planner's own, and the least cost at which it reaches 99.5 %:
//! the two halves of rule 3.

use std::path::PathBuf;
use std::process::ExitCode;

use prescale_forecaster::{
    oracle_plan, oracle_replica_seconds, parse_trace, scenario_defaults, simulate, Observation, Policy, PrescalePolicy,
    Score, Trace, TraceKind,
};

const INTERVAL: u64 = 15;
const WARMUPS: [u64; 3] = [60, 180, 420];
/// Margins swept: 1.00, 1.02, …, 1.60.
const MARGINS: std::ops::RangeInclusive<u32> = 50..=80;
const HISTORIES: [usize; 3] = [1, 2, 3];
/// How far a dip below the 1-hour level is moved back up in the `scaled` family.
const DIP_REFILL: f64 = 0.3;
/// Span of the level a dip is measured from, seconds.
const LEVEL_S: f64 = 3600.0;

/// Orders each window's capacity W ahead of its boundary from the largest of the last `k`
/// window rates times `m`; sheds to the window's own need once its rate is seen.
struct WindowStep {
    mu: f64,
    slo: f64,
    /// Last position in a window (seconds after its start) from which a start is ready by the
    /// next boundary; negative when W exceeds the window.
    order_from: i64,
    window: u64,
    k: usize,
    m: f64,
    /// The `scaled` family (level-scaled margin, dip refill) rather than `flat`.
    scaled: bool,
    /// Mean rate of every completed window, in order.
    rates: Vec<f64>,
}

impl WindowStep {
    fn new(mu: f64, slo: f64, warmup: u64, window: u64, k: usize, m: f64, scaled: bool) -> Self {
        let w = i64::try_from(warmup).unwrap_or(i64::MAX);
        let win = i64::try_from(window).unwrap_or(i64::MAX);
        let i = i64::try_from(INTERVAL).unwrap_or(1);
        let order_from = (win - w).div_euclid(i) * i;
        Self { mu, slo, order_from, window, k, m, scaled, rates: Vec::new() }
    }

    /// The rate ordered for the next window from `base`.
    fn target(&self, base: f64) -> f64 {
        if !self.scaled {
            return self.m * base;
        }
        // Exponential mean of ln(window rate) over about an hour of windows.
        let alpha = (self.window as f64 / LEVEL_S).min(1.0);
        let ln = |r: f64| r.max(1e-3).ln();
        let level = self
            .rates
            .iter()
            .skip(1)
            .fold(self.rates.first().map_or(ln(base), |&r| ln(r)), |e, &r| e + alpha * (ln(r) - e));
        let lb = ln(base);
        let refilled = (lb + DIP_REFILL * (level - lb).max(0.0)).exp();
        refilled * (3.0 * (self.m - 1.0) / (refilled / self.mu + 1.0).sqrt()).exp()
    }

    fn replicas(&self, rate: f64) -> f64 {
        (rate / self.mu - 1e-9).ceil().max(0.0)
    }
}

fn mean(a: &[f64]) -> f64 {
    if a.is_empty() {
        0.0
    } else {
        a.iter().sum::<f64>() / a.len() as f64
    }
}

impl Policy for WindowStep {
    fn name(&self) -> &str {
        "window-step"
    }

    fn decide(&mut self, obs: &Observation<'_>) -> u32 {
        let s = obs.now;
        if s == 0 {
            return obs.ready;
        }
        let win = self.window as usize;
        let idx = (s / self.window) as usize;
        while self.rates.len() < idx {
            let j = self.rates.len();
            self.rates.push(mean(&obs.arrivals[j * win..(j + 1) * win]));
        }
        let pos = s % self.window;
        let cur = if pos == 0 {
            self.rates.last().copied().unwrap_or(0.0)
        } else {
            mean(&obs.arrivals[idx * win..s as usize])
        };
        let backlog = obs.backlog.last().copied().unwrap_or(0.0);
        let mut d = self.replicas(cur + backlog / self.slo);
        if pos == 0 {
            // The new window's rate is not known yet: keep what was ordered for it.
            d = d.max(f64::from(obs.ready + obs.warming));
        }
        if i64::try_from(pos).unwrap_or(i64::MAX) >= self.order_from {
            let base = self.rates.iter().rev().take(self.k - 1).fold(cur, |a, &r| a.max(r));
            d = d.max(self.replicas(self.target(base)));
        }
        d.min(f64::from(u32::MAX)) as u32
    }
}

fn run(tr: &Trace, capacity: f64, slo: f64) -> Result<(), String> {
    let TraceKind::RateSeries { window_s } = tr.kind else {
        return Err("the frontier needs a rate series (a request log has no window grid)".into());
    };
    let r = oracle_plan(tr, capacity, slo, INTERVAL, 0);
    for w in WARMUPS {
        let sc = scenario_defaults(tr, capacity, w, slo, INTERVAL, 0, None, None);
        let orc = oracle_replica_seconds(&r, INTERVAL, w, tr.len() as u64);
        let mut pre = PrescalePolicy::new(&sc).map_err(|e| e.to_string())?;
        let p = simulate(tr, &sc, &mut pre, None).score;
        println!(
            "W = {w} s: oracle {:.1} GPU-h; prescale {:.3} % at {:.3}×",
            orc / 3600.0,
            100.0 * p.slo_attainment,
            p.replica_seconds / orc
        );
        for (k, scaled) in HISTORIES.iter().flat_map(|&k| [(k, false), (k, true)]) {
            let mut points: Vec<(f64, Score)> = Vec::new();
            for m in MARGINS {
                let m = f64::from(m) / 50.0;
                let mut pol = WindowStep::new(capacity, slo, w, window_s, k, m, scaled);
                points.push((m, simulate(tr, &sc, &mut pol, None).score));
            }
            let best_within = |cap: f64| {
                points
                    .iter()
                    .filter(|(_, s)| s.replica_seconds <= cap)
                    .max_by(|a, b| a.1.slo_attainment.total_cmp(&b.1.slo_attainment))
            };
            let reaching = points
                .iter()
                .filter(|(_, s)| s.slo_attainment >= 0.995)
                .min_by(|a, b| a.1.replica_seconds.total_cmp(&b.1.replica_seconds));
            let show = |x: Option<&(f64, Score)>| match x {
                Some((m, s)) => {
                    format!("{:.3} % at {:.3}× (m = {m:.2})", 100.0 * s.slo_attainment, s.replica_seconds / orc)
                }
                None => "none in the sweep".to_string(),
            };
            println!(
                "  {} K = {k}: best within 1.2×: {}; within prescale's cost: {}; cheapest reaching 99.5 %: {}",
                if scaled { "scaled" } else { "flat  " },
                show(best_within(1.2 * orc)),
                show(best_within(p.replica_seconds)),
                show(reaching)
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().unwrap_or_else(|| "../shared/traces/servegen-m-large-14d.csv".into()));
    let capacity: f64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(25.0);
    let slo: f64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(5.0);
    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string());
    let tr = match text.and_then(|t| parse_trace(&t).map_err(|e| e.to_string())) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    if !(capacity > 0.0 && capacity.is_finite() && slo > 0.0 && slo.is_finite()) {
        eprintln!("capacity and SLO must be positive numbers");
        return ExitCode::FAILURE;
    }
    println!("{} (capacity {capacity}, SLO {slo} s, interval {INTERVAL} s)", path.display());
    match run(&tr, capacity, slo) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
