//! The clairvoyant oracle of REPLAY.md ("Oracle"), its cost formula, a simulable oracle policy,
//! and the scenario defaults of REPLAY.md ("Scenarios").
//!
//! - [`oracle_plan`]: `r_k` per decision interval, exactly as written (interval `k` covers
//!   seconds `kI … min(kI + I, T) − 1`; the last one may be short).
//! - [`oracle_replica_seconds`]: the slot-run cost. Computed in O(K) instead of per slot: for
//!   one slot `j`, "runs merged across gaps `≤ W`, each merged run paying its length plus W
//!   unless it starts at 0" equals `on-time + Σ_gaps min(gap, W) + (W if its first run starts
//!   after second 0)`. Summed over slots: `Σ r_k · len_k + (max r − r_0) · W + Σ_valleys
//!   depth · min(gap, W)`, where the valleys (maximal stretches below a slot, bounded on both
//!   sides) are enumerated once each with a monotonic stack. The test module checks it against
//!   the literal per-slot procedure.
//! - [`OraclePolicy`]: the oracle as a policy, for charts and delays (see its docs). The
//!   scorecard's oracle cost is the formula's, never this policy's simulated cost.

use std::collections::VecDeque;

use crate::policy::{Observation, Policy, Scenario};
use crate::sim::{settle_backlog, tie};
use crate::trace::Trace;

/// `r_k` for every decision interval of `trace` (`ceil(T / I)` values).
///
/// For interval `k`, carrying the oracle's own backlog `B`: if `B` and every arrival in the
/// interval are 0, `r_k = min_replicas`; otherwise `r_k` is the smallest `r ≥ max(1, min)` such
/// that running the interval's seconds with `b ← max(0, b + a − r·μ)` from `B` keeps every
/// end-of-second backlog `≤ r·μ·slo`; then `B` = the backlog after the interval under `r_k`.
///
/// Feasibility is monotone in `r`, so `r` is found by trying `max(1, min)` and then bisecting up
/// to `ceil((B + Σ a) / μ) + 1`, which drains everything each second. Always terminates in
/// O(I · log r) per interval: if even that bound is infeasible (it exceeds `u32::MAX`, or the
/// capacity is not finite and `> 0`, or the slo is negative or `NaN`), `r_k` is the bound, capped
/// at `u32::MAX` — finite but meaningless for such degenerate input. `interval` 0 is read as 1.
pub fn oracle_plan(trace: &Trace, capacity: f64, slo: f64, interval: u64, min_replicas: u32) -> Vec<u32> {
    let interval = usize::try_from(interval.max(1)).unwrap_or(usize::MAX);
    let floor = u64::from(min_replicas.max(1));
    let mut b = 0.0f64;
    let mut out = Vec::with_capacity(trace.arrivals.len().div_ceil(interval));
    for chunk in trace.arrivals.chunks(interval) {
        if b == 0.0 && chunk.iter().all(|&a| a == 0.0) {
            out.push(min_replicas);
            continue;
        }
        let (r, after) = smallest_feasible(b, chunk, capacity, slo, floor);
        out.push(r);
        b = after;
    }
    out
}

/// Runs one interval with `r` ready replicas from backlog `b0`: `(feasible, backlog after)`.
fn run_interval(b0: f64, arrivals: &[f64], r: u64, mu: f64, slo: f64) -> (bool, f64) {
    let cap = r as f64 * mu;
    let bound = cap * slo;
    let mut b = b0;
    let mut ok = true;
    for &a in arrivals {
        b = settle_backlog((b + a - cap).max(0.0));
        // `NaN` (from a degenerate μ or slo) counts as over the bound; a backlog at the bound
        // within rounding is at it.
        if b.is_nan() || bound.is_nan() || b > bound + tie(bound) {
            ok = false;
        }
    }
    (ok, b)
}

fn smallest_feasible(b0: f64, arrivals: &[f64], mu: f64, slo: f64, floor: u64) -> (u32, f64) {
    let cap_r = u64::from(u32::MAX);
    let (ok, after) = run_interval(b0, arrivals, floor, mu, slo);
    if ok {
        return (floor as u32, after);
    }
    let need = (b0 + arrivals.iter().sum::<f64>()) / mu;
    // `as` saturates (NaN → 0); +1 absorbs rounding in the product r·μ.
    let hi = ((need.ceil() as u64).saturating_add(1)).clamp(floor + 1, cap_r.max(floor + 1));
    let (ok_hi, after_hi) = run_interval(b0, arrivals, hi, mu, slo);
    if !ok_hi {
        return (hi.min(cap_r) as u32, after_hi);
    }
    // Invariant: `bad` infeasible, `good` feasible.
    let (mut bad, mut good, mut good_after) = (floor, hi, after_hi);
    while good - bad > 1 {
        let mid = bad + (good - bad) / 2;
        let (ok, after) = run_interval(b0, arrivals, mid, mu, slo);
        if ok {
            good = mid;
            good_after = after;
        } else {
            bad = mid;
        }
    }
    (good.min(cap_r) as u32, good_after)
}

/// Oracle replica-seconds: for each replica slot `j = 1 … max r_k`, the maximal runs of
/// intervals with `r_k ≥ j`, merged when the gap between them is `≤ warmup` seconds, each merged
/// run charged its length plus `warmup` (no warm-up for a run starting at second 0); interval
/// `k` spans `[kI, (k+1)I)` except the last, which ends at `trace_len`.
pub fn oracle_replica_seconds(r: &[u32], interval: u64, warmup: u64, trace_len: u64) -> f64 {
    let Some(&r0) = r.first() else {
        return 0.0;
    };
    let interval = u128::from(interval.max(1));
    let w = u128::from(warmup);
    let k_last = r.len() - 1;
    let len_of = |k: usize| -> u128 {
        let start = k as u128 * interval;
        let end = if k == k_last { u128::from(trace_len) } else { start + interval };
        end.saturating_sub(start)
    };
    let mut total: u128 = 0;
    let mut max_r = 0u32;
    // Indices with non-increasing r from bottom to top.
    let mut stack: Vec<usize> = Vec::new();
    for (k, &rk) in r.iter().enumerate() {
        total += u128::from(rk) * len_of(k);
        max_r = max_r.max(rk);
        while let Some(&bottom) = stack.last() {
            if r[bottom] >= rk {
                break;
            }
            stack.pop();
            let Some(&left) = stack.last() else { break };
            // Slots (r[bottom], min(r[left], rk)] are off between `left` and `k`, on at both.
            let depth = u128::from(r[left].min(rk) - r[bottom]);
            let gap = (k - left - 1) as u128 * interval;
            total += depth * gap.min(w);
        }
        stack.push(k);
    }
    // Slots above r_0 start their first run after second 0 and pay a warm-up.
    total += u128::from(max_r - r0) * w;
    total as f64
}

/// The oracle as a simulable policy: at decision `k` it asks for `max(r_k, …, r_{k+L})` with
/// `L = ceil(W / I)`, i.e. the current interval's need and that of every interval up to the
/// first one a replica started now can still serve (`(k+L)·I ≥ kI + W`).
///
/// Asking only for `max(r_k, r_{k+L})` would remove, at decision `k`, replicas started earlier
/// for intervals `k+1 … k+L−1` that are still warming (removal takes warming ones first); the
/// window maximum keeps them, and as a side effect keeps a slot across any gap of at most `W`,
/// mirroring the merge rule of the cost formula. With `W` a multiple of `I` and
/// `initial_replicas` from [`scenario_defaults`], every replica the oracle needs is ready on
/// time. The simulated cost of this policy is for charts and delays only; the scorecard's
/// `oracle_replica_seconds` is [`oracle_replica_seconds`].
#[derive(Debug, Clone)]
pub struct OraclePolicy {
    interval: u64,
    r: Vec<u32>,
    desired: Vec<u32>,
    replica_seconds: f64,
}

impl OraclePolicy {
    /// Builds the oracle from the whole trace (it is clairvoyant by definition).
    pub fn new(trace: &Trace, sc: &Scenario) -> Self {
        let interval = sc.interval.max(1);
        let r = oracle_plan(trace, sc.capacity, sc.slo, interval, sc.min_replicas);
        let lookahead = usize::try_from(sc.warmup.div_ceil(interval)).unwrap_or(usize::MAX);
        let desired = window_max(&r, lookahead);
        let replica_seconds = oracle_replica_seconds(&r, interval, sc.warmup, trace.arrivals.len() as u64);
        OraclePolicy { interval, r, desired, replica_seconds }
    }

    /// `r_k` per interval ([`oracle_plan`]).
    pub fn plan(&self) -> &[u32] {
        &self.r
    }

    /// What the policy answers at each decision (the windowed maximum of `r`).
    pub fn desired(&self) -> &[u32] {
        &self.desired
    }

    /// [`oracle_replica_seconds`] of the plan: the oracle's cost on the scorecard.
    pub fn replica_seconds(&self) -> f64 {
        self.replica_seconds
    }
}

impl Policy for OraclePolicy {
    fn name(&self) -> &str {
        "oracle"
    }

    fn decide(&mut self, obs: &Observation<'_>) -> u32 {
        usize::try_from(obs.now / self.interval).ok().and_then(|k| self.desired.get(k)).copied().unwrap_or(0)
    }
}

/// `out[k] = max(r[k ..= k + lookahead])` (clipped at the end), O(K) with a monotonic deque.
fn window_max(r: &[u32], lookahead: usize) -> Vec<u32> {
    let mut out = vec![0; r.len()];
    let mut dq: VecDeque<usize> = VecDeque::new();
    for k in (0..r.len()).rev() {
        while dq.back().is_some_and(|&b| r[b] <= r[k]) {
            dq.pop_back();
        }
        dq.push_back(k);
        while dq.front().is_some_and(|&f| f - k > lookahead) {
            dq.pop_front();
        }
        out[k] = dq.front().map_or(0, |&f| r[f]);
    }
    out
}

/// The replay scenario of REPLAY.md ("Scenarios") for one trace.
///
/// `initial_replicas` = the largest oracle `r_k` over the first `W/I + 2` intervals (integer
/// division, so W = 60, I = 15 looks at 6 intervals; fewer if the trace is shorter; 0 for an
/// empty trace); `max_replicas` = `max(2 · max r_k, 2)`. Either can be overridden. The oracle
/// here is [`oracle_plan`] with the same capacity, slo, interval and `min_replicas`.
#[allow(clippy::too_many_arguments)]
pub fn scenario_defaults(
    trace: &Trace,
    capacity: f64,
    warmup: u64,
    slo: f64,
    interval: u64,
    min_replicas: u32,
    max_override: Option<u32>,
    initial_override: Option<u32>,
) -> Scenario {
    let r = oracle_plan(trace, capacity, slo, interval, min_replicas);
    let first = usize::try_from(warmup / interval.max(1)).unwrap_or(usize::MAX).saturating_add(2);
    let initial = r.iter().take(first).copied().max().unwrap_or(0);
    let max_r = r.iter().copied().max().unwrap_or(0);
    Scenario {
        capacity,
        warmup,
        slo,
        interval,
        min_replicas,
        max_replicas: max_override.unwrap_or(max_r.saturating_mul(2).max(2)),
        initial_replicas: initial_override.unwrap_or(initial),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::simulate;
    use crate::trace::trace_from_rates;
    use proptest::prelude::*;

    fn tr(a: &[f64]) -> Trace {
        trace_from_rates(1, a)
    }

    #[test]
    fn oracle_r_k_on_a_tiny_trace() {
        // μ=1, slo=1, I=2.
        // k0 [0,0]: idle → min (0). k1 [3,0]: r=1: b=2 > 1; r=2: b=1 ≤ 2, then 0 → 2, B=0.
        // k2 [0,5]: r=2: b=3 ≤ 2? no; r=3: b=2 ≤ 3 ok → 3, B=2.
        // k3 [0,0]: B=2 > 0 so not idle: r=1: b=1 ≤ 1, then 0 → 1, B=0. k4 [0]: idle → 0.
        let t = tr(&[0.0, 0.0, 3.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0]);
        assert_eq!(oracle_plan(&t, 1.0, 1.0, 2, 0), vec![0, 2, 3, 1, 0]);
        // min_replicas applies to idle intervals and as the floor.
        assert_eq!(oracle_plan(&t, 1.0, 1.0, 2, 2), vec![2, 2, 3, 2, 2]);
        // slo 0: must drain every second.
        assert_eq!(oracle_plan(&t, 1.0, 0.0, 2, 0), vec![0, 3, 5, 0, 0]);
        assert!(oracle_plan(&tr(&[]), 1.0, 1.0, 2, 0).is_empty());
    }

    #[test]
    fn oracle_reads_a_backlog_at_its_bound_as_exact_arithmetic_does() {
        // 1.7 req/s (not an f64), μ = 0.5, slo = 5, I = 15: 3 replicas fall behind by 0.2 req/s.
        // k0: B 0 → 3; k1: 3 → 6; k2: 6 would pass 7.5 = 3·0.5·5, so 4 replicas: 6 → 1.5;
        // k3: 1.5 → 4.5; k4: 4.5 → exactly 7.5 at its last second: at the bound, so 3 suffice
        // (f64's 7.500000000000001 read literally asked for 4 and shifted the rest).
        let t = trace_from_rates(150, &[1.7]);
        assert_eq!(oracle_plan(&t, 0.5, 5.0, 15, 0), vec![3, 3, 4, 3, 3, 4, 3, 4, 3, 3]);
    }

    #[test]
    fn oracle_terminates_on_hopeless_input() {
        let t = tr(&[1e300, 1.0]);
        assert_eq!(oracle_plan(&t, 1.0, 5.0, 1, 0)[0], u32::MAX);
        for (mu, slo) in [(0.0, 5.0), (-1.0, 5.0), (f64::NAN, 5.0), (1.0, -1.0), (1.0, f64::NAN)] {
            let r = oracle_plan(&tr(&[1.0, 0.0, 2.0]), mu, slo, 1, 0);
            assert_eq!(r.len(), 3);
        }
    }

    #[test]
    fn slot_runs_merge_gaps_up_to_w() {
        // I = 10, W = 20, T = 60. Slot 1 on in k0, k3..: gap k1,k2 = 20 s ≤ W → merged.
        // Run from 0 (no W) to 60 → 60.
        assert_eq!(oracle_replica_seconds(&[1, 0, 0, 1, 1, 1], 10, 20, 60), 60.0);
        // Gap of 30 s > W: two runs: [0,10) no W → 10; [40,60) → 20 + 20 = 40. Total 50.
        assert_eq!(oracle_replica_seconds(&[1, 0, 0, 0, 1, 1], 10, 20, 60), 50.0);
        // A run not starting at 0 pays W: [10,20) → 10 + 20.
        assert_eq!(oracle_replica_seconds(&[0, 1, 0], 10, 20, 30), 30.0);
        // Two slots: slot 1 always on (60), slot 2 on at k1 and k4: gap 20 ≤ W → merged
        // [10,50) = 40 + W 20 = 60. Total 120.
        assert_eq!(oracle_replica_seconds(&[1, 2, 1, 1, 2, 1], 10, 20, 60), 120.0);
        // The last interval ends at T: [0,10),[10,13) with r=1 → 13.
        assert_eq!(oracle_replica_seconds(&[1, 1], 10, 20, 13), 13.0);
        assert_eq!(oracle_replica_seconds(&[], 10, 20, 0), 0.0);
        assert_eq!(oracle_replica_seconds(&[0, 0], 10, 20, 20), 0.0);
    }

    /// The literal procedure of REPLAY.md, slot by slot.
    fn literal_cost(r: &[u32], i: u64, w: u64, t: u64) -> f64 {
        let k_n = r.len();
        let start = |k: usize| k as u64 * i;
        let end = |k: usize| if k + 1 == k_n { t } else { (k as u64 + 1) * i };
        let mut total = 0u64;
        for j in 1..=r.iter().copied().max().unwrap_or(0) {
            let mut runs: Vec<(u64, u64)> = vec![];
            for (k, &rk) in r.iter().enumerate() {
                if rk >= j {
                    match runs.last_mut() {
                        Some(last) if last.1 == start(k) => last.1 = end(k),
                        _ => runs.push((start(k), end(k))),
                    }
                }
            }
            let mut merged: Vec<(u64, u64)> = vec![];
            for run in runs {
                match merged.last_mut() {
                    Some(last) if run.0 - last.1 <= w => last.1 = run.1,
                    _ => merged.push(run),
                }
            }
            for (s, e) in merged {
                total += e - s + if s == 0 { 0 } else { w };
            }
        }
        total as f64
    }

    proptest! {
        #[test]
        fn stack_cost_equals_literal_slot_runs(
            r in proptest::collection::vec(0u32..6, 1..40),
            i in 1u64..20,
            w in 0u64..80,
            short in 0u64..20,
        ) {
            let t = (r.len() as u64 - 1) * i + 1 + short % i;
            prop_assert_eq!(oracle_replica_seconds(&r, i, w, t), literal_cost(&r, i, w, t));
        }

        #[test]
        fn oracle_r_k_is_the_smallest_feasible(
            a in proptest::collection::vec(prop_oneof![Just(0.0), 0.0f64..20.0], 1..60),
            mu in 0.1f64..5.0,
            slo in 0.0f64..8.0,
            i in 1u64..10,
            min in 0u32..3,
        ) {
            let r = oracle_plan(&tr(&a), mu, slo, i, min);
            let mut b = 0.0;
            for (k, chunk) in a.chunks(i as usize).enumerate() {
                if b == 0.0 && chunk.iter().all(|&x| x == 0.0) {
                    prop_assert_eq!(r[k], min);
                    continue;
                }
                let floor = min.max(1);
                prop_assert!(r[k] >= floor);
                prop_assert!(run_interval(b, chunk, u64::from(r[k]), mu, slo).0);
                if r[k] > floor {
                    prop_assert!(!run_interval(b, chunk, u64::from(r[k] - 1), mu, slo).0);
                }
                b = run_interval(b, chunk, u64::from(r[k]), mu, slo).1;
            }
        }
    }

    #[test]
    fn window_max_looks_ahead() {
        assert_eq!(window_max(&[1, 0, 0, 5, 0, 2], 2), vec![1, 5, 5, 5, 2, 2]);
        assert_eq!(window_max(&[3, 1, 2], 0), vec![3, 1, 2]);
        assert!(window_max(&[], 3).is_empty());
    }

    #[test]
    fn scenario_defaults_follow_the_text() {
        // I=2, W=2 → first W/I + 2 = 3 intervals: r = [0,2,3,1,0] → initial 3, max 2·3 = 6.
        let t = tr(&[0.0, 0.0, 3.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0]);
        let sc = scenario_defaults(&t, 1.0, 2, 1.0, 2, 0, None, None);
        assert_eq!((sc.initial_replicas, sc.max_replicas), (3, 6));
        // W=1 → W/I = 0 → 2 intervals → initial 2.
        let sc = scenario_defaults(&t, 1.0, 1, 1.0, 2, 0, None, None);
        assert_eq!(sc.initial_replicas, 2);
        let sc = scenario_defaults(&t, 1.0, 1, 1.0, 2, 0, Some(9), Some(1));
        assert_eq!((sc.initial_replicas, sc.max_replicas), (1, 9));
        let idle = scenario_defaults(&tr(&[0.0; 4]), 1.0, 1, 1.0, 2, 0, None, None);
        assert_eq!((idle.initial_replicas, idle.max_replicas), (0, 2));
    }

    #[test]
    fn simulated_oracle_keeps_replicas_started_for_later_intervals() {
        // I=1, W=2: a burst at second 5 needs r=2 there; the oracle starts at 3 and holds.
        let t = tr(&[1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 1.0, 1.0]);
        let sc = scenario_defaults(&t, 1.0, 2, 0.0, 1, 0, None, None);
        let mut p = OraclePolicy::new(&t, &sc);
        assert_eq!(p.plan(), &[1, 1, 1, 1, 1, 2, 1, 1]);
        let r = simulate(&t, &sc, &mut p, None);
        assert_eq!(r.score.slo_attainment, 1.0);
        assert_eq!(r.ready[5], 2);
        assert_eq!(r.score.replica_starts, 1);
        // Formula: slot 1 whole trace (8), slot 2 [5,6) + W = 3.
        assert_eq!(p.replica_seconds(), 11.0);
        assert_eq!(r.score.replica_seconds, 11.0);
    }
}
