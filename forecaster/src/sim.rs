//! The fleet simulator of REPLAY.md ("Each second s = 0 … T−1, in this order") and its scores.
//!
//! One pass over the trace, O(T) time plus the policy's own cost; the FIFO delay of every
//! second's arrival mass is found afterwards with two pointers, also O(T).
//!
//! Interpretation notes (each is the reading of REPLAY.md this module implements):
//! - **Observation.** At decision second `s` the policy sees `arrivals[..s]`, the end-of-second
//!   backlogs `backlog[..s]`, and the ready/warming counts at the *start* of second `s`, i.e. after
//!   step 2 of second `s − 1`. A replica whose ready second is exactly `s` is therefore still
//!   counted (and, if removed at this decision, removed) as warming: readiness is step 2, after
//!   the decision.
//! - **Clamp.** `d = min(max(answer, min_replicas), max_replicas)`; should a scenario have
//!   `min_replicas > max_replicas`, `max_replicas` wins ([`check_scenario`] rejects such a
//!   scenario; [`simulate`] itself never fails).
//! - **Interval 0** is treated as 1 (a decision every second).
//! - **Replica starts** count replicas started by decisions; `initial_replicas` are not starts.
//! - **Delay rule.** "Cumulative served through `t`" is evaluated as `A(t) − backlog(t)` (with
//!   `A` = cumulative arrivals), which equals the running sum of `served` in exact arithmetic by
//!   the backlog update of step 4. So mass of second `s0` is done at the first `t ≥ s0` with
//!   `backlog(t) ≤ A(t) − A(s0) + 1e-9`. This form is exact where it matters: whenever the
//!   simulated backlog is 0, all mass that arrived so far is done. The literal comparison is
//!   ill-conditioned in floating point: on the 14-day ServeGen trace (A ≈ 2.4e8) a running `f64`
//!   sum of `served` drifts ~6e-5 from A − backlog, and even an *exact* sum of the `f64` served
//!   values is off by ~2e-9 (the `f64` backlog update is not exactly mass-conserving), so the
//!   literal rule, read naively, gives the mass of most seconds a delay of 1 s (or ∞ at the end)
//!   on a fleet whose queue is empty.
//! - **Quantiles.** The p-quantile of delay is the smallest delay `d` (whole seconds) such that
//!   the arrival mass with delay `≤ d` is `≥ p · total` (compared with a relative tolerance of
//!   1e-12 of the total, so exact ties are not lost to rounding). If the finite delays never reach
//!   `p · total`, the quantile is `+∞`; it is serialized as JSON `null`. With no arrival mass at
//!   all, attainment is 1 and both quantiles are 0.
//! - **SLO attainment** = mass with delay `≤ slo` / total mass.
//! - **Ties.** REPLAY.md's arithmetic is exact; `f64` is not, and its rounding would decide
//!   ties the text decides otherwise: `0.1 + 0.2 − 0.3` leaves a backlog of `5.6e-17` (a queue
//!   the reactive policy then counts as active, and the oracle as a carried backlog that costs
//!   a replica), a backlog that reaches `r·μ·slo` exactly reads as over it, and `(0.1 + 0.2) / 0.1`
//!   rounds above 3 and ceils to 4. So a backlog within `tie` of 0 is 0, and the reference
//!   policies compare and round within `tie` (`ceil_tie`). Then an exact-arithmetic
//!   scorer (`scripts/rescore.py`) reproduces every figure, and so does any `f64` scorer,
//!   whatever its order of summation, except at ties. Without it the oracle's replica-seconds
//!   differed from exact ones by up to 0.04 % and reactive's attainment by up to 0.13 pp on the
//!   dev traces.

use std::collections::VecDeque;

use crate::policy::{Observation, Policy, Scenario};
use crate::trace::Trace;

/// Tolerance of the FIFO delay comparison (REPLAY.md step 5).
pub const DELAY_TOLERANCE: f64 = 1e-9;

/// Relative tolerance within which two fleet quantities are a tie (see the module notes).
const TIE_REL: f64 = 1e-9;

/// The rounding slack of a fleet quantity of magnitude `x`: `1e-9 · max(1, |x|)`.
pub(crate) fn tie(x: f64) -> f64 {
    TIE_REL * x.abs().max(1.0)
}

/// `ceil(x)`, with an `x` within [`tie`] above an integer read as that integer.
pub(crate) fn ceil_tie(x: f64) -> f64 {
    (x - tie(x)).ceil()
}

/// A backlog after one second's service: within `tie` of 0 is 0.
pub(crate) fn settle_backlog(b: f64) -> f64 {
    if b <= tie(b) {
        0.0
    } else {
        b
    }
}

/// Relative tolerance of the quantile comparison `mass(≤ d) ≥ p · total`.
const QUANTILE_REL_TOLERANCE: f64 = 1e-12;

/// Upper bound on progress callbacks per simulation (plus one final call with `(T, T)`).
const PROGRESS_CALLS: u64 = 200;

/// The scorecard of one replay (REPLAY.md "Outputs").
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Score {
    /// Share of arrival mass whose delay is `≤ slo`, in `[0, 1]` (1 when there are no arrivals).
    pub slo_attainment: f64,
    /// Σ over seconds of `ready + warming`.
    pub replica_seconds: f64,
    /// `replica_seconds / 3600`.
    pub gpu_hours: f64,
    /// Mass-weighted median delay in seconds; `+∞` (JSON `null`) if over half the mass is never
    /// served.
    #[serde(serialize_with = "finite_or_null")]
    pub p50_delay_s: f64,
    /// Mass-weighted 99th-percentile delay in seconds; `+∞` (JSON `null`) when more than 1 % of
    /// the mass is still queued at the end.
    #[serde(serialize_with = "finite_or_null")]
    pub p99_delay_s: f64,
    /// Replicas started by decisions (initial replicas are not counted).
    pub replica_starts: u64,
    /// Share of arrival mass that missed the SLO on a cold start: it arrived in a second with
    /// no ready replica (the fleet at zero, or waking from zero), or queued behind such a
    /// second's backlog before the queue had emptied since. The misses scale-to-zero and
    /// wake-up timing account for; `1 − slo_attainment − cold_start_miss` is the share late
    /// for want of capacity on a running fleet. Not one of REPLAY.md's outputs: an extra key.
    pub cold_start_miss: f64,
    /// Σ a(s).
    pub total_arrivals: f64,
    /// Backlog at the end of the last second: mass with infinite delay.
    pub queued_at_end: f64,
}

/// `Some(v)` for a finite `v`, else `None` (what a non-finite quantile serializes as).
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

fn finite_or_null<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&finite(*v), s)
}

/// A replay's plan, chart series and score.
///
/// All vectors except `score` are indexed by decision `k` (second `t_k = k · I`), so a chart of a
/// 14-day trace needs ~80 000 points, not 1.2 M.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SimResult {
    /// [`Policy::name`] of the simulated policy.
    pub policy: String,
    /// `(t_s, desired)` per decision, `desired` after the clamp. This is the plan CSV.
    pub plan: Vec<(u64, u32)>,
    /// Ready replicas in second `t_k`, after the decision and the readiness step (what serves).
    pub ready: Vec<u32>,
    /// Warming replicas in second `t_k`, after the decision and the readiness step.
    pub warming: Vec<u32>,
    /// Backlog at the end of the interval's last second.
    pub backlog: Vec<f64>,
    /// Largest end-of-second backlog within the interval.
    pub backlog_max: Vec<f64>,
    /// Arrival mass within the interval.
    pub arrivals: Vec<f64>,
    /// Arrival mass within the interval that waited more than the SLO or was never served:
    /// where the misses of `score` fall, so two policies can be compared window by window
    /// (`examples/compare.rs`). Sums to `(1 − slo_attainment) · total_arrivals`.
    pub late: Vec<f64>,
    pub score: Score,
}

/// Why a scenario or a plan cannot be scored.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    #[error("invalid scenario: {0}")]
    Scenario(String),
    #[error("plan row {row}: expected decision time t_s = {expected}, got {got}")]
    PlanTime { row: usize, expected: u64, got: u64 },
    #[error("plan has {got} rows but the trace has {expected} decision times (one per interval, from 0)")]
    PlanLength { got: usize, expected: u64 },
}

/// Why a plan CSV could not be read. Line and column numbers are 1-based.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("plan CSV is empty: no header line")]
    Empty,
    #[error("line {line}: unknown plan header {found:?}; expected `t_s,desired` (extra columns allowed)")]
    UnknownHeader { line: usize, found: String },
    #[error("line {line}: column {column} `{name}` is missing")]
    MissingField { line: usize, column: usize, name: &'static str },
    #[error("line {line}, column {column} `{name}`: bad value {value:?}; expected a non-negative integer")]
    BadNumber { line: usize, column: usize, name: &'static str, value: String },
    #[error("line {line}: t_s = {t} is not after the previous row's {previous}")]
    NotIncreasing { line: usize, t: u64, previous: u64 },
}

/// Checks what [`simulate`] silently tolerates: capacity finite and `> 0`, slo finite and
/// `≥ 0`, interval `≥ 1`, `min_replicas ≤ max_replicas`.
pub fn check_scenario(sc: &Scenario) -> Result<(), SimError> {
    if !(sc.capacity.is_finite() && sc.capacity > 0.0) {
        return Err(SimError::Scenario(format!("capacity must be a finite number > 0, got {}", sc.capacity)));
    }
    if !(sc.slo.is_finite() && sc.slo >= 0.0) {
        return Err(SimError::Scenario(format!("slo must be a finite number ≥ 0, got {}", sc.slo)));
    }
    if sc.interval == 0 {
        return Err(SimError::Scenario("interval must be at least 1 s".into()));
    }
    if sc.min_replicas > sc.max_replicas {
        return Err(SimError::Scenario(format!(
            "min_replicas {} is above max_replicas {}",
            sc.min_replicas, sc.max_replicas
        )));
    }
    Ok(())
}

/// Number of decision times of a trace of `trace_len` seconds: `ceil(T / I)` (I = 0 read as 1).
pub fn decision_count(trace_len: u64, interval: u64) -> u64 {
    trace_len.div_ceil(interval.max(1))
}

/// Replays `trace` through the fleet model of REPLAY.md, asking `policy` at every decision time.
///
/// `progress`, when given, is called with `(s, T)` at most ~200 times during the run and once
/// more with `(T, T)` at the end.
pub fn simulate(
    trace: &Trace,
    sc: &Scenario,
    policy: &mut dyn Policy,
    mut progress: Option<&mut dyn FnMut(u64, u64)>,
) -> SimResult {
    let a = &trace.arrivals;
    let t_len = a.len();
    let total_s = t_len as u64;
    let interval = sc.interval.max(1);
    let mu = sc.capacity;
    let decisions = usize::try_from(decision_count(total_s, interval)).unwrap_or(0);
    let progress_every = total_s.div_ceil(PROGRESS_CALLS).max(1);

    let mut backlog_hist: Vec<f64> = Vec::with_capacity(t_len);
    // Per second: whether its arrivals meet a cold start (no replica ready, or a queue that a
    // second without one began and that has not emptied since), for `Score::cold_start_miss`.
    let mut cold: Vec<bool> = Vec::with_capacity(t_len);
    let mut ready: u32 = sc.initial_replicas;
    // (ready second, count), oldest start at the front; ready seconds are non-decreasing since
    // W is fixed and starts happen in time order.
    let mut warming: VecDeque<(u64, u32)> = VecDeque::new();
    let mut warming_n: u32 = 0;
    let mut backlog = 0.0f64;
    let mut replica_seconds: u128 = 0;
    let mut starts: u64 = 0;

    let mut res = SimResult {
        policy: policy.name().to_string(),
        plan: Vec::with_capacity(decisions),
        ready: Vec::with_capacity(decisions),
        warming: Vec::with_capacity(decisions),
        backlog: Vec::with_capacity(decisions),
        backlog_max: Vec::with_capacity(decisions),
        arrivals: Vec::with_capacity(decisions),
        late: Vec::new(),
        score: Score {
            slo_attainment: 1.0,
            replica_seconds: 0.0,
            gpu_hours: 0.0,
            p50_delay_s: 0.0,
            p99_delay_s: 0.0,
            replica_starts: 0,
            cold_start_miss: 0.0,
            total_arrivals: 0.0,
            queued_at_end: 0.0,
        },
    };

    let mut next_decision = 0u64;
    let mut next_progress = 0u64;
    for (s, &arrival) in a.iter().enumerate() {
        let now = s as u64;
        if now == next_progress {
            next_progress = next_progress.saturating_add(progress_every);
            if let Some(cb) = progress.as_mut() {
                cb(now, total_s);
            }
        }
        // `s mod I = 0`, kept as a counter.
        let decision = now == next_decision;
        if decision {
            next_decision = next_decision.saturating_add(interval);
        }

        // 1. Decision.
        if decision {
            let obs = Observation { now, arrivals: &a[..s], backlog: &backlog_hist[..s], ready, warming: warming_n };
            let want = policy.decide(&obs);
            let d = want.max(sc.min_replicas).min(sc.max_replicas);
            let n = u64::from(ready) + u64::from(warming_n);
            let d64 = u64::from(d);
            if d64 > n {
                // d ≤ u32::MAX, so the difference fits.
                let add = (d64 - n) as u32;
                warming.push_back((now.saturating_add(sc.warmup), add));
                warming_n += add;
                starts += u64::from(add);
            } else if d64 < n {
                let mut remove = n - d64;
                while remove > 0 {
                    let Some(back) = warming.back_mut() else {
                        break;
                    };
                    let take = u64::from(back.1).min(remove) as u32;
                    back.1 -= take;
                    warming_n -= take;
                    remove -= u64::from(take);
                    if back.1 == 0 {
                        warming.pop_back();
                    }
                }
                // Whatever is left comes out of the ready ones; remove ≤ ready here since
                // n − d ≤ ready + warming.
                ready -= remove as u32;
            }
            res.plan.push((now, d));
        }

        // 2. Readiness.
        while let Some(&(at, count)) = warming.front() {
            if at > now {
                break;
            }
            ready += count;
            warming_n -= count;
            warming.pop_front();
        }

        // 3. Cost.
        replica_seconds += u128::from(ready) + u128::from(warming_n);

        // 4. Service.
        let cold_now = ready == 0 || (backlog > 0.0 && cold.last().copied().unwrap_or(false));
        let avail = backlog + arrival;
        let served = avail.min(f64::from(ready) * mu);
        backlog = settle_backlog(avail - served);
        backlog_hist.push(backlog);
        cold.push(cold_now);

        // Chart series.
        if decision {
            res.ready.push(ready);
            res.warming.push(warming_n);
            res.backlog.push(backlog);
            res.backlog_max.push(backlog);
            res.arrivals.push(arrival);
        } else if let (Some(b), Some(bm), Some(ar)) =
            (res.backlog.last_mut(), res.backlog_max.last_mut(), res.arrivals.last_mut())
        {
            *b = backlog;
            *bm = bm.max(backlog);
            *ar += arrival;
        }
    }

    // 5. Delay.
    let delays = fifo_delays(a, &backlog_hist);
    let rs = replica_seconds as f64;
    res.score = score_delays(a, &delays, &cold, sc.slo);
    res.late = late_by_interval(a, &delays, sc.slo, interval, res.plan.len());
    res.score.replica_seconds = rs;
    res.score.gpu_hours = rs / 3600.0;
    res.score.replica_starts = starts;
    res.score.queued_at_end = backlog_hist.last().copied().unwrap_or(0.0);

    if let Some(cb) = progress.as_mut() {
        cb(total_s, total_s);
    }
    res
}

/// FIFO delay of the mass of every second: `Some(t − s0)` for the first `t ≥ s0` with
/// `backlog[t] ≤ A(t) − A(s0) + 1e-9`, `None` if there is none (still queued at the end).
/// Two pointers: the finishing second is non-decreasing in `s0`, so this is O(T).
pub(crate) fn fifo_delays(arrivals: &[f64], backlog: &[f64]) -> Vec<Option<u64>> {
    let n = arrivals.len().min(backlog.len());
    let mut prefix = Vec::with_capacity(n);
    let mut acc = 0.0f64;
    for &x in &arrivals[..n] {
        acc += x;
        prefix.push(acc);
    }
    let mut out = Vec::with_capacity(n);
    let mut t = 0usize;
    for s0 in 0..n {
        t = t.max(s0);
        while t < n && !is_done(backlog[t], prefix[t] - prefix[s0]) {
            t += 1;
        }
        if t == n {
            // Every later second finishes no earlier: all still queued.
            out.resize(n, None);
            break;
        }
        out.push(Some((t - s0) as u64));
    }
    out
}

/// The mass of `s0` is done at `t` when the backlog at the end of `t` is no more than what
/// arrived after `s0` (`A(t) − A(s0)`), with the contract's tolerance. `NaN` is never done.
fn is_done(backlog: f64, arrived_since: f64) -> bool {
    backlog <= arrived_since + DELAY_TOLERANCE
}

/// A second's mass is late when its delay is over the SLO or it is never served.
fn is_late(delay: Option<u64>, slo: f64) -> bool {
    delay.is_none_or(|d| d as f64 > slo)
}

/// Late arrival mass ([`is_late`]) summed by decision interval.
fn late_by_interval(arrivals: &[f64], delays: &[Option<u64>], slo: f64, interval: u64, n: usize) -> Vec<f64> {
    let mut late = vec![0.0; n];
    for (s, (&m, d)) in arrivals.iter().zip(delays).enumerate() {
        if m.is_nan() || m <= 0.0 || !is_late(*d, slo) {
            continue;
        }
        if let Some(slot) = usize::try_from(s as u64 / interval.max(1)).ok().and_then(|k| late.get_mut(k)) {
            *slot += m;
        }
    }
    late
}

/// Attainment and mass-weighted quantiles from per-second delays (see the module notes).
fn score_delays(arrivals: &[f64], delays: &[Option<u64>], cold: &[bool], slo: f64) -> Score {
    let mut hist: Vec<f64> = Vec::new();
    let mut infinite = 0.0f64;
    let mut total_arrivals = 0.0f64;
    let mut cold_late = 0.0f64;
    for (s, (&m, d)) in arrivals.iter().zip(delays).enumerate() {
        total_arrivals += m;
        if m.is_nan() || m <= 0.0 {
            continue;
        }
        let late = is_late(*d, slo);
        if late && cold.get(s).copied().unwrap_or(false) {
            cold_late += m;
        }
        match *d {
            Some(d) => {
                let d = d as usize;
                if hist.len() <= d {
                    hist.resize(d + 1, 0.0);
                }
                hist[d] += m;
            }
            None => infinite += m,
        }
    }
    let finite: f64 = hist.iter().sum();
    let total = finite + infinite;
    let (attainment, p50, p99, cold_start_miss) = if total > 0.0 {
        let within: f64 = hist.iter().enumerate().take_while(|(d, _)| (*d as f64) <= slo).map(|(_, m)| m).sum();
        // `+ 0.0`: an empty float sum is −0.0, which would print as "-0.000%" and "-0.0".
        let attainment = (within / total).clamp(0.0, 1.0) + 0.0;
        // Never more than the misses themselves (the two sums round apart).
        let cold_start_miss = (cold_late / total).clamp(0.0, 1.0 - attainment) + 0.0;
        (attainment, quantile(&hist, total, 0.50), quantile(&hist, total, 0.99), cold_start_miss)
    } else {
        (1.0, 0.0, 0.0, 0.0)
    };
    Score {
        slo_attainment: attainment,
        replica_seconds: 0.0,
        gpu_hours: 0.0,
        p50_delay_s: p50,
        p99_delay_s: p99,
        replica_starts: 0,
        cold_start_miss,
        total_arrivals,
        queued_at_end: 0.0,
    }
}

/// Smallest `d` with `mass(delay ≤ d) ≥ q · total`, or `+∞`.
fn quantile(hist: &[f64], total: f64, q: f64) -> f64 {
    let target = q * total - QUANTILE_REL_TOLERANCE * total;
    let mut cum = 0.0;
    for (d, &m) in hist.iter().enumerate() {
        cum += m;
        if m > 0.0 && cum >= target {
            return d as f64;
        }
    }
    f64::INFINITY
}

/// A policy that replays a fixed plan: decision `k` answers `desired[k]` (0 past the end).
#[derive(Debug, Clone)]
pub struct PlanPolicy {
    interval: u64,
    desired: Vec<u32>,
}

impl PlanPolicy {
    /// `desired[k]` is the answer at second `k · interval`.
    pub fn new(interval: u64, desired: Vec<u32>) -> Self {
        PlanPolicy { interval: interval.max(1), desired }
    }
}

impl Policy for PlanPolicy {
    fn name(&self) -> &str {
        "plan"
    }

    fn decide(&mut self, obs: &Observation<'_>) -> u32 {
        usize::try_from(obs.now / self.interval).ok().and_then(|k| self.desired.get(k)).copied().unwrap_or(0)
    }
}

/// Rescores an existing plan: it must have exactly one row per decision time `0, I, 2I, …`
/// (`ceil(T / I)` rows, in order). Rows are clamped to `[min, max]` like any policy answer.
pub fn score_plan(trace: &Trace, sc: &Scenario, plan: &[(u64, u32)]) -> Result<SimResult, SimError> {
    check_scenario(sc)?;
    let expected = decision_count(trace.len() as u64, sc.interval);
    if plan.len() as u64 != expected {
        return Err(SimError::PlanLength { got: plan.len(), expected });
    }
    for (row, &(t, _)) in plan.iter().enumerate() {
        let want = row as u64 * sc.interval;
        if t != want {
            return Err(SimError::PlanTime { row: row + 1, expected: want, got: t });
        }
    }
    let mut policy = PlanPolicy::new(sc.interval, plan.iter().map(|&(_, d)| d).collect());
    Ok(simulate(trace, sc, &mut policy, None))
}

/// The plan CSV of REPLAY.md: header `t_s,desired`, one row per decision.
pub fn plan_csv(plan: &[(u64, u32)]) -> String {
    let mut out = String::with_capacity(16 + plan.len() * 12);
    out.push_str("t_s,desired\n");
    for &(t, d) in plan {
        out.push_str(&format!("{t},{d}\n"));
    }
    out
}

/// Reads a plan CSV: header starting `t_s,desired` (extra columns are allowed and ignored),
/// then rows of non-negative integers (an integral float such as `3.0` is accepted), `t_s`
/// strictly increasing. Blank lines are skipped; `\r\n` is accepted.
pub fn parse_plan_csv(text: &str) -> Result<Vec<(u64, u32)>, PlanError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, if i == 0 { l.trim_start_matches('\u{feff}') } else { l }))
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((hline, header)) = lines.next() else {
        return Err(PlanError::Empty);
    };
    let h: Vec<&str> = header.split(',').map(str::trim).collect();
    if h.len() < 2 || h[0] != "t_s" || h[1] != "desired" {
        return Err(PlanError::UnknownHeader { line: hline, found: header.trim().chars().take(120).collect() });
    }
    let mut plan: Vec<(u64, u32)> = Vec::new();
    for (line, l) in lines {
        let mut f = l.split(',').map(str::trim);
        let t_raw = f.next().unwrap_or("");
        let Some(d_raw) = f.next() else {
            return Err(PlanError::MissingField { line, column: 2, name: "desired" });
        };
        let t = parse_count(t_raw, u64::MAX).ok_or_else(|| PlanError::BadNumber {
            line,
            column: 1,
            name: "t_s",
            value: t_raw.to_string(),
        })?;
        let d = parse_count(d_raw, u64::from(u32::MAX)).ok_or_else(|| PlanError::BadNumber {
            line,
            column: 2,
            name: "desired",
            value: d_raw.to_string(),
        })? as u32;
        if let Some(&(previous, _)) = plan.last() {
            if t <= previous {
                return Err(PlanError::NotIncreasing { line, t, previous });
            }
        }
        plan.push((t, d));
    }
    Ok(plan)
}

fn parse_count(s: &str, max: u64) -> Option<u64> {
    let v = match s.parse::<u64>() {
        Ok(v) => v,
        Err(_) => {
            let f = s.parse::<f64>().ok()?;
            if !(f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= 9_007_199_254_740_992.0) {
                return None;
            }
            f as u64
        }
    };
    (v <= max).then_some(v)
}

#[cfg(test)]
// `u64::is_multiple_of` is newer than the workspace's rust-version (1.85).
#[allow(clippy::manual_is_multiple_of)]
mod tests {
    use super::*;
    use crate::trace::trace_from_rates;
    use proptest::prelude::*;

    fn scenario(mu: f64, w: u64, i: u64, initial: u32, max: u32, slo: f64) -> Scenario {
        Scenario {
            capacity: mu,
            warmup: w,
            slo,
            interval: i,
            min_replicas: 0,
            max_replicas: max,
            initial_replicas: initial,
        }
    }

    fn arrivals(a: &[f64]) -> Trace {
        trace_from_rates(1, a)
    }

    /// Records every observation it is given, answers from a script.
    struct Scripted {
        answers: Vec<u32>,
        seen: Vec<(u64, usize, usize, u32, u32)>,
    }

    impl Policy for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }
        fn decide(&mut self, obs: &Observation<'_>) -> u32 {
            self.seen.push((obs.now, obs.arrivals.len(), obs.backlog.len(), obs.ready, obs.warming));
            self.answers[self.seen.len() - 1]
        }
    }

    #[test]
    fn rounding_is_neither_a_queue_nor_an_extra_replica() {
        // f64 leaves 0.1 + 0.2 − 0.3 = 5.6e-17 and (0.1 + 0.2) / 0.1 = 3.0000000000000004:
        // exact arithmetic (REPLAY.md's) says 0 and 3.
        assert_eq!(settle_backlog(0.1 + 0.2 - 0.3), 0.0);
        assert_eq!(((0.1 + 0.2) / 0.1f64).ceil(), 4.0);
        assert_eq!(ceil_tie((0.1 + 0.2) / 0.1), 3.0);
        // Real excesses are kept.
        assert_eq!(settle_backlog(1e-6), 1e-6);
        assert_eq!(ceil_tie(3.0 + 1e-6), 4.0);
        assert_eq!(ceil_tie(0.0), 0.0);
        // Relative at scale: a backlog of 1e6 is not rounding.
        assert_eq!(settle_backlog(1e6), 1e6);
        // In the fleet: 0.4 and 0.2 requests in two seconds on a replica of μ = 0.3 end with
        // an empty queue, not with f64's residue.
        let t = trace_from_rates(1, &[0.4, 0.2]);
        let sc = Scenario {
            capacity: 0.3,
            warmup: 0,
            slo: 5.0,
            interval: 15,
            min_replicas: 0,
            max_replicas: 1,
            initial_replicas: 1,
        };
        let r = score_plan(&t, &sc, &[(0, 1)]).unwrap();
        assert_eq!(r.score.queued_at_end, 0.0);
    }

    #[test]
    fn hand_computed_tiny_trace() {
        // μ=1, W=2, I=1, no initial replicas, slo 2.
        let t = arrivals(&[3.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
        let sc = scenario(1.0, 2, 1, 0, 10, 2.0);
        let mut p = Scripted { answers: vec![2, 2, 2, 1, 1, 0], seen: vec![] };
        let r = simulate(&t, &sc, &mut p, None);
        // s0: start 2 (ready at 2), served 0, b=3 | s1: b=3 | s2: 2 ready, served 2, b=1
        // s3: remove 1 ready, a=1, served 1, b=1 | s4: served 1, b=0 | s5: remove 1.
        assert_eq!(r.backlog, vec![3.0, 3.0, 1.0, 1.0, 0.0, 0.0]);
        assert_eq!(r.ready, vec![0, 0, 2, 1, 1, 0]);
        assert_eq!(r.warming, vec![2, 2, 0, 0, 0, 0]);
        assert_eq!(r.score.replica_seconds, 8.0);
        assert_eq!(r.score.gpu_hours, 8.0 / 3600.0);
        assert_eq!(r.score.replica_starts, 2);
        // A = 3,3,3,4,4,4; S = 0,0,2,3,4,4 → second 0 (mass 3) done at 3, second 3 (mass 1) at 4.
        assert_eq!(
            fifo_delays(&t.arrivals, &[3.0, 3.0, 1.0, 1.0, 0.0, 0.0])[..4],
            [Some(3), Some(2), Some(1), Some(1)]
        );
        assert_eq!(r.score.slo_attainment, 0.25);
        assert_eq!(r.late, vec![3.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        // Second 0's mass (3 of 4) is late and came while no replica was ready; second 3's
        // (1), queued behind it, met the SLO.
        assert_eq!(r.score.cold_start_miss, 0.75);
        assert_eq!(r.score.p50_delay_s, 3.0);
        assert_eq!(r.score.p99_delay_s, 3.0);
        assert_eq!(r.score.total_arrivals, 4.0);
        assert_eq!(r.score.queued_at_end, 0.0);
        assert_eq!(r.plan, vec![(0, 2), (1, 2), (2, 2), (3, 1), (4, 1), (5, 0)]);
        // The policy saw exactly the past, and the counts at the start of each second.
        assert_eq!(
            p.seen,
            vec![(0, 0, 0, 0, 0), (1, 1, 1, 0, 2), (2, 2, 2, 0, 2), (3, 3, 3, 2, 0), (4, 4, 4, 1, 0), (5, 5, 5, 1, 0)]
        );
    }

    #[test]
    fn late_mass_falls_in_the_interval_it_arrived_in_and_adds_up_to_the_misses() {
        // μ = 1, I = 3, SLO 1 s: one ready replica under 2 req/s for 6 s, then nothing; the
        // fleet is released at s = 6 with a queue still there (never served: late too).
        let t = arrivals(&[2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 1.0]);
        let sc = scenario(1.0, 5, 3, 1, 10, 1.0);
        let r = simulate(&t, &sc, &mut PlanPolicy::new(3, vec![1, 1, 0]), None);
        assert_eq!(r.late.len(), r.plan.len());
        // Second 0's mass waits 1 s (served at s = 1): on time; from second 1 on, the queue
        // is past the SLO. The last interval's arrival is never served.
        assert_eq!(r.late[0], 4.0);
        assert_eq!(r.late[1], 6.0);
        assert_eq!(r.late[2], 1.0);
        let total: f64 = r.late.iter().sum();
        assert!((total - (1.0 - r.score.slo_attainment) * r.score.total_arrivals).abs() < 1e-9);
        // A fleet that keeps up is never late.
        let sc = scenario(1.0, 5, 3, 2, 10, 1.0);
        let r = simulate(&t, &sc, &mut PlanPolicy::new(3, vec![2, 2, 2]), None);
        assert!(r.late.iter().all(|&m| m == 0.0), "{:?}", r.late);
    }

    #[test]
    fn misses_on_a_running_fleet_are_not_cold_starts() {
        // One ready replica of μ = 1 under 3 req/s: the queue grows, requests miss the SLO of
        // 2 s, and none of them arrived without a ready replica.
        let t = arrivals(&[3.0; 8]);
        let sc = scenario(1.0, 5, 1, 1, 10, 2.0);
        let r = simulate(&t, &sc, &mut PlanPolicy::new(1, vec![1; 8]), None);
        assert!(r.score.slo_attainment < 0.5, "{}", r.score.slo_attainment);
        assert_eq!(r.score.cold_start_miss, 0.0);
        // The same demand on a fleet released to zero and woken again two seconds later: the
        // mass of the seconds without a ready replica is late, and counted as cold.
        let sc = scenario(1.0, 2, 1, 1, 10, 2.0);
        let plan = [1, 0, 4, 4, 4, 4, 4, 4];
        let r = simulate(&t, &sc, &mut PlanPolicy::new(1, plan.to_vec()), None);
        assert_eq!(r.ready, vec![1, 0, 0, 0, 4, 4, 4, 4]);
        assert!(r.score.cold_start_miss > 0.0);
        assert!(r.score.cold_start_miss <= 1.0 - r.score.slo_attainment);
    }

    #[test]
    fn removal_takes_warming_newest_first_then_ready() {
        // μ=1, W=3, I=1, 1 initial replica, no arrivals.
        let t = arrivals(&[0.0; 7]);
        let sc = scenario(1.0, 3, 1, 1, 10, 5.0);
        let mut p = Scripted {
            // s0: +1 (ready at 3); s1: +2 (ready at 4); s2: → 2 removes both s1 replicas;
            // s3: hold; s4: hold; s5: → 0 removes the two ready ones.
            answers: vec![2, 4, 2, 2, 2, 0, 0],
            seen: vec![],
        };
        let r = simulate(&t, &sc, &mut p, None);
        assert_eq!(r.ready, vec![1, 1, 1, 2, 2, 0, 0]);
        assert_eq!(r.warming, vec![1, 3, 1, 0, 0, 0, 0]);
        // Oldest-first removal would leave a replica that becomes ready at 4, not 3.
        assert_eq!(p.seen[3], (3, 3, 3, 1, 1), "ready second 3 still warming at the decision");
        assert_eq!(p.seen[4], (4, 4, 4, 2, 0));
        assert_eq!(r.score.replica_starts, 3);
        assert_eq!(r.score.replica_seconds, (2 + 4 + 2 + 2 + 2) as f64);
    }

    #[test]
    fn removal_at_the_ready_second_removes_it_as_warming() {
        // 1 initial ready; start 1 at s0 (ready at 2); at s2 ask for 1: the warming one goes.
        let t = arrivals(&[0.0; 4]);
        let sc = scenario(1.0, 2, 1, 1, 10, 5.0);
        let mut p = Scripted { answers: vec![2, 2, 1, 1], seen: vec![] };
        let r = simulate(&t, &sc, &mut p, None);
        assert_eq!(r.ready, vec![1, 1, 1, 1]);
        assert_eq!(r.warming, vec![1, 1, 0, 0]);
    }

    #[test]
    fn clamp_and_interval() {
        let t = arrivals(&[1.0; 10]);
        let mut sc = scenario(1.0, 0, 4, 0, 3, 5.0);
        sc.min_replicas = 1;
        let mut p = Scripted { answers: vec![100, 0, 2], seen: vec![] };
        let r = simulate(&t, &sc, &mut p, None);
        assert_eq!(r.plan, vec![(0, 3), (4, 1), (8, 2)]);
        assert_eq!(p.seen.len(), 3);
        // W = 0: started replicas serve in the same second.
        assert_eq!(r.ready, vec![3, 1, 2]);
        assert_eq!(r.score.replica_seconds, (3 * 4 + 4 + 2 * 2) as f64);
        assert_eq!(r.score.slo_attainment, 1.0);
        assert_eq!(r.arrivals, vec![4.0, 4.0, 2.0]);
    }

    #[test]
    fn unserved_mass_has_infinite_delay_and_serializes_as_null() {
        let t = arrivals(&[1.0, 1.0, 0.0]);
        let sc = scenario(1.0, 5, 1, 0, 10, 5.0);
        let mut p = PlanPolicy::new(1, vec![1, 1, 1]);
        let r = simulate(&t, &sc, &mut p, None);
        assert_eq!(r.score.slo_attainment, 0.0);
        assert!(r.score.slo_attainment.is_sign_positive(), "prints as -0.000%");
        assert_eq!(r.score.p50_delay_s, f64::INFINITY);
        assert_eq!(r.score.queued_at_end, 2.0);
        assert_eq!(finite(r.score.p99_delay_s), None);
        assert_eq!(finite(3.0), Some(3.0));
    }

    #[test]
    fn no_arrivals_means_full_attainment() {
        let t = arrivals(&[0.0; 5]);
        let sc = scenario(1.0, 1, 1, 2, 10, 5.0);
        let r = simulate(&t, &sc, &mut PlanPolicy::new(1, vec![2; 5]), None);
        assert_eq!(r.score.slo_attainment, 1.0);
        assert_eq!(r.score.p99_delay_s, 0.0);
        assert_eq!(r.score.replica_seconds, 10.0);
        assert_eq!(r.score.replica_starts, 0);
        let empty = arrivals(&[]);
        let r = simulate(&empty, &sc, &mut PlanPolicy::new(1, vec![]), None);
        assert!(r.plan.is_empty());
        assert_eq!(r.score.replica_seconds, 0.0);
    }

    #[test]
    fn delays_are_exact_on_large_cumulative_totals() {
        // ~200 rps for 200 000 s (A reaches 4e7) on a capacity that alternates between too
        // little and enough: the backlog builds and drains again and again.
        let mut x: u64 = 88_172_645_463_325_252;
        let a: Vec<f64> = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                150.0 + (x % 100_000) as f64 / 1000.0
            })
            .collect();
        let (mut b, mut backlog, mut served) = (0.0f64, vec![], vec![]);
        for (s, &ai) in a.iter().enumerate() {
            let cap = if (s / 500) % 2 == 0 { 190.0 } else { 260.0 };
            let avail = b + ai;
            let sv = avail.min(cap);
            b = avail - sv;
            backlog.push(b);
            served.push(sv);
        }
        let delays = fifo_delays(&a, &backlog);
        let drained: Vec<usize> = (0..a.len()).filter(|&s| backlog[s] == 0.0).collect();
        assert!(drained.len() > 50_000);
        // An empty queue at the end of s0 means the mass of s0 is done in s0.
        assert!(drained.iter().all(|&s| delays[s] == Some(0)));
        assert!(delays.iter().all(Option::is_some));
        // The naive running sum of `served` would get many of these wrong (this is why the
        // module evaluates cumulative served as A(t) − backlog(t)).
        let (mut ca, mut cs, mut wrong) = (0.0f64, 0.0f64, 0usize);
        for s in 0..a.len() {
            ca += a[s];
            cs += served[s];
            if backlog[s] == 0.0 && cs < ca - DELAY_TOLERANCE {
                wrong += 1;
            }
        }
        assert!(wrong > 1000, "naive sums wrong on {wrong} drained seconds");
    }

    #[test]
    fn quantile_definition() {
        // mass 99 at delay 0, 1 at delay 7: p99 = 0 (mass ≤ 0 is exactly 99 %), p50 = 0.
        let hist = [99.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0];
        assert_eq!(quantile(&hist, 100.0, 0.99), 0.0);
        assert_eq!(quantile(&hist, 100.0, 0.995), 7.0);
        // A share over 1 % with infinite delay: p99 = ∞.
        assert_eq!(quantile(&[98.0], 100.0, 0.99), f64::INFINITY);
        // Ties with awkward decimals: 297 of 300 at delay 0.
        assert_eq!(quantile(&[297.0, 3.0], 300.0, 0.99), 0.0);
    }

    #[test]
    fn progress_is_bounded_and_ends_at_t() {
        let t = arrivals(&vec![0.5; 100_003]);
        let sc = scenario(1.0, 0, 15, 1, 2, 5.0);
        let mut calls = Vec::new();
        let mut cb = |s: u64, total: u64| calls.push((s, total));
        let _ = simulate(&t, &sc, &mut PlanPolicy::new(15, vec![1; 6667]), Some(&mut cb));
        assert!(calls.len() <= 202, "{} calls", calls.len());
        assert!(calls.len() >= 100);
        assert_eq!(calls.last(), Some(&(100_003, 100_003)));
        assert!(calls.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn plan_csv_round_trip_and_rescoring() {
        let t = arrivals(&[3.0, 0.0, 0.0, 1.0, 0.0, 0.0, 2.0]);
        let sc = scenario(1.0, 2, 2, 0, 10, 2.0);
        let mut p = PlanPolicy::new(2, vec![2, 1, 0, 3]);
        let r = simulate(&t, &sc, &mut p, None);
        let csv = plan_csv(&r.plan);
        assert_eq!(csv, "t_s,desired\n0,2\n2,1\n4,0\n6,3\n");
        let back = parse_plan_csv(&csv).unwrap();
        assert_eq!(back, r.plan);
        let again = score_plan(&t, &sc, &back).unwrap();
        assert_eq!(again.score, r.score);
        // Extra columns, CRLF, integral floats are fine.
        assert_eq!(parse_plan_csv("t_s,desired,reason\r\n0,2.0,x\r\n\r\n2,1,y\r\n").unwrap(), vec![(0, 2), (2, 1)]);
    }

    #[test]
    fn plan_errors() {
        assert_eq!(parse_plan_csv(""), Err(PlanError::Empty));
        assert!(matches!(parse_plan_csv("t,d\n"), Err(PlanError::UnknownHeader { line: 1, .. })));
        assert!(matches!(
            parse_plan_csv("t_s,desired\n0,1\n15,-1\n"),
            Err(PlanError::BadNumber { line: 3, column: 2, .. })
        ));
        assert!(matches!(parse_plan_csv("t_s,desired\n0,1\n15\n"), Err(PlanError::MissingField { line: 3, .. })));
        assert!(matches!(parse_plan_csv("t_s,desired\n0,1\n0,1\n"), Err(PlanError::NotIncreasing { line: 3, .. })));
        assert!(matches!(parse_plan_csv("t_s,desired\n0,99999999999\n"), Err(PlanError::BadNumber { .. })));
        let t = arrivals(&[1.0; 30]);
        let sc = scenario(1.0, 0, 15, 0, 3, 5.0);
        assert_eq!(score_plan(&t, &sc, &[(0, 1)]).unwrap_err(), SimError::PlanLength { got: 1, expected: 2 });
        assert!(matches!(
            score_plan(&t, &sc, &[(0, 1), (10, 1)]),
            Err(SimError::PlanTime { row: 2, expected: 15, got: 10 })
        ));
        let bad = Scenario { min_replicas: 5, ..sc };
        assert!(matches!(score_plan(&t, &bad, &[(0, 1), (15, 1)]), Err(SimError::Scenario(_))));
    }

    #[test]
    fn degenerate_scenarios_do_not_panic() {
        let t = arrivals(&[1.0, f64::NAN, 2.0, 0.0]);
        for sc in [
            scenario(0.0, 0, 0, 1, 1, 5.0),
            scenario(-1.0, u64::MAX, 1, u32::MAX, u32::MAX, -1.0),
            Scenario { min_replicas: 9, ..scenario(f64::NAN, 0, 1, 0, 1, f64::NAN) },
        ] {
            let mut p = PlanPolicy::new(1, vec![u32::MAX, 0, 7, 1]);
            let r = simulate(&t, &sc, &mut p, None);
            assert!(r.score.slo_attainment >= 0.0 && r.score.slo_attainment <= 1.0);
        }
    }

    // ---- Naive reference: one record per replica, O(T²) delays straight from the text. ----

    struct Naive {
        cost: u64,
        starts: u64,
        backlog: Vec<f64>,
        delays: Vec<Option<u64>>,
        plan: Vec<u32>,
        /// Whether each second's arrivals met a cold start.
        cold: Vec<bool>,
    }

    fn naive(a: &[f64], sc: &Scenario, answers: &[u32]) -> Naive {
        // (ready second or None when ready, start sequence number)
        let mut reps: Vec<(Option<u64>, u64)> = (0..sc.initial_replicas).map(|i| (None, i as u64)).collect();
        let mut seq = sc.initial_replicas as u64;
        let (mut cost, mut starts, mut b) = (0u64, 0u64, 0.0f64);
        let mut backlog = vec![];
        let mut served = vec![];
        let mut plan = vec![];
        let mut cold = vec![];
        for (s, &x) in a.iter().enumerate() {
            let s = s as u64;
            if s % sc.interval == 0 {
                let want = answers[(s / sc.interval) as usize];
                let d = want.max(sc.min_replicas).min(sc.max_replicas) as usize;
                plan.push(d as u32);
                while reps.len() < d {
                    reps.push((Some(s + sc.warmup), seq));
                    seq += 1;
                    starts += 1;
                }
                while reps.len() > d {
                    // newest warming first, else any ready one
                    let victim = reps
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.0.is_some())
                        .max_by_key(|(_, r)| r.1)
                        .map(|(i, _)| i)
                        .unwrap_or(0);
                    reps.remove(victim);
                }
            }
            for r in reps.iter_mut() {
                if matches!(r.0, Some(at) if at <= s) {
                    r.0 = None;
                }
            }
            cost += reps.len() as u64;
            let ready = reps.iter().filter(|r| r.0.is_none()).count() as f64;
            // Cold: no ready replica, or still the queue a cold second began.
            let prev_cold = cold.last().copied().unwrap_or(false);
            cold.push(ready == 0.0 || (b > 0.0 && prev_cold));
            let sv = (b + x).min(ready * sc.capacity);
            b = b + x - sv;
            backlog.push(b);
            served.push(sv);
        }
        let n = a.len();
        let delays = (0..n)
            .map(|s0| {
                let cum_a: f64 = a[..=s0].iter().sum();
                (s0..n).find(|&t| served[..=t].iter().sum::<f64>() >= cum_a - 1e-9).map(|t| (t - s0) as u64)
            })
            .collect();
        Naive { cost, starts, backlog, delays, plan, cold }
    }

    fn naive_quantile(a: &[f64], delays: &[Option<u64>], q: f64) -> f64 {
        let total: f64 = a.iter().sum();
        let mut pairs: Vec<(f64, f64)> = a
            .iter()
            .zip(delays)
            .filter(|(m, _)| **m > 0.0)
            .map(|(m, d)| (d.map_or(f64::INFINITY, |d| d as f64), *m))
            .collect();
        pairs.sort_by(|x, y| x.0.total_cmp(&y.0));
        let mut cum = 0.0;
        for (d, m) in pairs {
            cum += m;
            if cum >= q * total - 1e-12 * total {
                return d;
            }
        }
        f64::INFINITY
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn matches_naive_reference(
            eighths in proptest::collection::vec(prop_oneof![3 => Just(0u32), 5 => 0u32..40], 0..60),
            answers in proptest::collection::vec(0u32..7, 60),
            mu2 in 1u32..5,
            warmup in 0u64..6,
            interval in 1u64..5,
            initial in 0u32..4,
            min in 0u32..2,
            slo in 0u32..6,
        ) {
            // Binary fractions keep all sums exact, so the literal O(T²) rule and ours must agree.
            let a: Vec<f64> = eighths.iter().map(|&e| e as f64 / 8.0).collect();
            let sc = Scenario {
                capacity: mu2 as f64 / 2.0,
                warmup,
                slo: slo as f64,
                interval,
                min_replicas: min,
                max_replicas: 5,
                initial_replicas: initial,
            };
            let t = arrivals(&a);
            let r = simulate(&t, &sc, &mut PlanPolicy::new(interval, answers.clone()), None);
            let n = naive(&a, &sc, &answers);
            prop_assert!((0.0..=1.0).contains(&r.score.slo_attainment));
            prop_assert_eq!(r.score.replica_seconds, n.cost as f64);
            prop_assert_eq!(r.score.replica_starts, n.starts);
            prop_assert_eq!(r.plan.iter().map(|p| p.1).collect::<Vec<_>>(), n.plan);
            prop_assert_eq!(fifo_delays(&a, &n.backlog), n.delays.clone());
            let total: f64 = a.iter().sum();
            let within: f64 = a.iter().zip(&n.delays)
                .filter(|(_, d)| matches!(d, Some(d) if (*d as f64) <= sc.slo))
                .map(|(m, _)| m).sum();
            let want = if total > 0.0 { within / total } else { 1.0 };
            prop_assert!((r.score.slo_attainment - want).abs() < 1e-12);
            // Cold-start misses: the late mass of seconds with no ready replica.
            let cold: f64 = a.iter().zip(&n.delays).zip(&n.cold)
                .filter(|((_, d), &c)| c && !matches!(d, Some(d) if (*d as f64) <= sc.slo))
                .map(|((m, _), _)| m).sum();
            let want_cold = if total > 0.0 { cold / total } else { 0.0 };
            prop_assert!((r.score.cold_start_miss - want_cold).abs() < 1e-12);
            prop_assert!(r.score.cold_start_miss <= 1.0 - r.score.slo_attainment + 1e-15);
            if total > 0.0 {
                prop_assert_eq!(r.score.p50_delay_s, naive_quantile(&a, &n.delays, 0.5));
                prop_assert_eq!(r.score.p99_delay_s, naive_quantile(&a, &n.delays, 0.99));
            }
            // The per-decision series agree with the per-second state.
            let ends: Vec<f64> = (0..r.plan.len())
                .map(|k| n.backlog[((k as u64 + 1) * interval).min(a.len() as u64) as usize - 1])
                .collect();
            prop_assert_eq!(&r.backlog, &ends);
        }

        #[test]
        fn attainment_in_unit_interval_for_any_fractions(
            a in proptest::collection::vec(0.0f64..50.0, 0..80),
            answers in proptest::collection::vec(0u32..30, 80),
            mu in 0.05f64..10.0,
            warmup in 0u64..20,
            interval in 1u64..20,
        ) {
            let sc = scenario(mu, warmup, interval, 1, 20, 5.0);
            let t = arrivals(&a);
            let r = simulate(&t, &sc, &mut PlanPolicy::new(interval, answers.clone()), None);
            prop_assert!((0.0..=1.0).contains(&r.score.slo_attainment));
            prop_assert!(r.score.p50_delay_s <= r.score.p99_delay_s);
            let n = naive(&a, &sc, &answers);
            prop_assert_eq!(r.score.replica_seconds, n.cost as f64);
        }
    }
}
