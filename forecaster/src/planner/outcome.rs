//! The planner's own outcome: how much of the arrivals its real fleet served late.
//!
//! The counterfactual judges candidate margins on fleets of its own; the fleet the planner
//! actually runs differs from them (the hold, the drain, the blend, the bounds, the fleet it
//! was handed), so a margin whose counterfactual misses little can still be late for real.
//! This reads the real lateness off what `observe` is given: cumulative arrivals A and
//! served S = A − backlog (FIFO, REPLAY.md "Delay"): the mass that arrived in the second
//! ending at `t` is late when S at `t + ⌊slo⌋` has not reached the cumulative arrivals
//! through it.

use std::collections::VecDeque;

/// Arrival samples awaiting their verdict; beyond this, the oldest is judged early (which
/// can only count more of it late).
pub(super) const OUTCOME_PENDING_CAP: usize = 512;

#[derive(Debug, Clone, Default)]
pub(super) struct Outcome {
    arrived: f64,
    served: f64,
    /// `(t_end, cumulative arrivals through the sample, its mass)`, oldest first.
    pending: VecDeque<(f64, f64, f64)>,
    /// Late mass, aged by the `decay` each sample is given (the planner gives the
    /// counterfactual's selection decay, so it compares with the candidates' `late_s`).
    pub(super) late: f64,
}

impl Outcome {
    /// One observed sample: `mass` arrived in the sample ending at `t_end`, `backlog` queued
    /// at its end. `decay` ages the late mass over the sample.
    pub(super) fn observe(&mut self, t_end: f64, mass: f64, backlog: f64, slo: f64, decay: f64) {
        self.arrived += mass;
        // A queue reading is not always consistent with the arrivals (in `serve` both are
        // estimates): served never goes back.
        self.served = self.served.max(self.arrived - backlog);
        self.late *= decay;
        if mass > 0.0 {
            if self.pending.len() >= OUTCOME_PENDING_CAP {
                self.judge_front();
            }
            self.pending.push_back((t_end, self.arrived, mass));
        }
        let wait = slo.floor();
        while self.pending.front().is_some_and(|&(t, _, _)| t + wait <= t_end + 1e-9) {
            self.judge_front();
        }
    }

    fn judge_front(&mut self) {
        if let Some((_, through, mass)) = self.pending.pop_front() {
            // A second's mass is done when all of it is (REPLAY.md: cumulative served reaches
            // the cumulative arrivals through that second, within 1e-9, here relative to the
            // sums' size for the rounding of long ones).
            let tol = 1e-9 * (1.0 + through.abs());
            let late = if through - self.served > tol { mass } else { 0.0 };
            self.late += late;
        }
    }

    pub(super) fn approx_heap_bytes(&self) -> usize {
        self.pending.capacity() * std::mem::size_of::<(f64, f64, f64)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::scenario_defaults;
    use crate::policy::{Observation, Policy};
    use crate::reactive::ReactivePolicy;
    use crate::sim::simulate;
    use crate::trace::{Trace, TraceKind};

    /// Feeds what each decision sees to an `Outcome` (no decay) while a reactive policy runs.
    struct Judged {
        inner: ReactivePolicy,
        outcome: Outcome,
        fed: usize,
        slo: f64,
    }

    impl Policy for Judged {
        fn name(&self) -> &str {
            "judged"
        }
        fn decide(&mut self, obs: &Observation<'_>) -> u32 {
            while self.fed < obs.arrivals.len() {
                let s = self.fed;
                self.outcome.observe(s as f64 + 1.0, obs.arrivals[s], obs.backlog[s], self.slo, 1.0);
                self.fed += 1;
            }
            self.inner.decide(obs)
        }
    }

    #[test]
    fn the_late_mass_read_off_arrivals_and_backlog_is_the_simulators() {
        // Bursts a reactive fleet meets late, then a quiet tail so every arrival is judged
        // before the last decision.
        let mut a = vec![0.0; 4 * 3600];
        for (s, x) in a.iter_mut().enumerate().take(4 * 3600 - 900) {
            *x = if s % 600 < 40 {
                12.0
            } else if s % 7 == 0 {
                1.0
            } else {
                0.0
            };
        }
        let requests = a.iter().sum::<f64>() as u64;
        let trace = Trace { arrivals: a, kind: TraceKind::RequestLog { requests }, t0_label: String::new() };
        for slo in [0.0, 5.0, 30.0] {
            let sc = scenario_defaults(&trace, 1.0, 120, slo, 15, 0, None, None);
            let mut p = Judged { inner: ReactivePolicy::new(&sc), outcome: Outcome::default(), fed: 0, slo };
            let r = simulate(&trace, &sc, &mut p, None);
            let share = p.outcome.late / requests as f64;
            let miss = 1.0 - r.score.slo_attainment;
            assert!(miss > 0.01, "the scenario must have misses to compare (slo {slo}: {miss})");
            assert!((share - miss).abs() < 1e-9, "slo {slo}: outcome {share} vs simulator {miss}");
        }
    }

    #[test]
    fn more_pending_arrivals_than_the_cap_are_judged_early_and_never_lost() {
        // A never-served queue with an SLO longer than the cap: every sample is late, judged
        // as it leaves the bounded pending list.
        let mut o = Outcome::default();
        for s in 0..2000 {
            o.observe(s as f64 + 1.0, 1.0, s as f64 + 1.0, 10_000.0, 1.0);
        }
        assert!(o.pending.len() <= OUTCOME_PENDING_CAP);
        assert_eq!(o.late.round() as usize + o.pending.len(), 2000);
    }
}
