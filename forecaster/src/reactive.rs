//! The reactive reference policy of REPLAY.md ("Reactive"): today's KEDA + HPA with default
//! behaviour, on a queue trigger and a utilisation trigger.
//!
//! Readings of the text implemented here (each one literal where the text is explicit):
//! - `rate` = arrivals in seconds `s−60 … s−1`, divided by 60 even when fewer than 60 seconds
//!   exist yet (at the start of a trace the rate therefore reads low, as a fresh 60 s rate
//!   window would).
//! - `q` = backlog at the end of second `s−1`, 0 at `s = 0`.
//! - "any arrival in the last I seconds" = some `a(i) > 0` for `i` in `s−I … s−1`.
//! - The last active second starts at 0: a policy that has never been active counts its
//!   inactivity from the start of the trace, so a fleet started with initial replicas and no
//!   traffic is scaled to zero at the first decision `≥ 300 s`.
//! - The `ready + warming = 0` branch returns before the history is touched (the text orders it
//!   before "keep (s, raw)"); it uses the unlimited `raw`.
//! - "Keep `(s, raw)` for the last 300 s": the current `(s, raw)` is kept first, and entries with
//!   `s' > s − 300` survive (the HPA stabilisation window is "after now − 300 s"), so the largest
//!   kept raw is never below the current raw.
//! - Arithmetic is IEEE `f64` in the order written: `ceil(min(rate, ready·μ) / (0.8·μ))`,
//!   `ceil(ready / 0.8)`, `ceil(q / (μ·slo))`, with ties read as exact arithmetic reads them
//!   (a ceil within rounding of an integer is that integer, `rate > ready·μ` must exceed it by
//!   more than rounding; see `sim`'s notes); results saturate at `u32::MAX`.

use std::collections::VecDeque;

use crate::policy::{Observation, Policy, Scenario};
use crate::sim::{ceil_tie, tie};

/// KEDA's default `cooldownPeriod` and the HPA's default scale-down stabilisation, seconds.
pub const COOLDOWN_S: u64 = 300;
/// Seconds of history behind `rate`.
pub const RATE_WINDOW_S: u64 = 60;
/// The utilisation target.
pub const UTIL_TARGET: f64 = 0.8;

/// KEDA + HPA, queue and utilisation triggers, default behaviour.
#[derive(Debug, Clone)]
pub struct ReactivePolicy {
    capacity: f64,
    slo: f64,
    interval: u64,
    last_active: u64,
    /// `(s, raw)` of recent decisions, oldest first.
    kept: VecDeque<(u64, u64)>,
}

impl ReactivePolicy {
    pub fn new(sc: &Scenario) -> Self {
        ReactivePolicy {
            capacity: sc.capacity,
            slo: sc.slo,
            interval: sc.interval.max(1),
            last_active: 0,
            kept: VecDeque::new(),
        }
    }
}

/// `ceil` within rounding ([`ceil_tie`]: `(0.1 + 0.2) / 0.1` is 3, as written), as a count.
fn ceil_count(x: f64) -> u64 {
    // `as` saturates and maps NaN to 0.
    ceil_tie(x) as u64
}

impl Policy for ReactivePolicy {
    fn name(&self) -> &str {
        "reactive"
    }

    fn decide(&mut self, obs: &Observation<'_>) -> u32 {
        let s = obs.now;
        let a = obs.arrivals;
        let mu = self.capacity;
        let from = a.len().saturating_sub(RATE_WINDOW_S as usize);
        let rate = a[from..].iter().sum::<f64>() / RATE_WINDOW_S as f64;
        let q = obs.backlog.last().copied().unwrap_or(0.0);
        let ready = f64::from(obs.ready);

        let util = if rate > ready * mu + tie(ready * mu) && obs.ready > 0 {
            ceil_count(ready / UTIL_TARGET)
        } else {
            ceil_count(rate.min(ready * mu) / (UTIL_TARGET * mu))
        };
        let queue = ceil_count(q / (mu * self.slo));
        let raw = util.max(queue);

        let recent = a.len().saturating_sub(usize::try_from(self.interval).unwrap_or(usize::MAX));
        let active = q > 0.0 || a[recent..].iter().any(|&x| x > 0.0);
        if active {
            self.last_active = s;
        }

        let current = u64::from(obs.ready) + u64::from(obs.warming);
        if current == 0 {
            return if active { to_u32(raw.max(1)) } else { 0 };
        }
        if s.saturating_sub(self.last_active) >= COOLDOWN_S {
            self.kept.clear();
            return 0;
        }
        let raw = raw.max(1).min((2 * current).max(current + 4));
        self.kept.push_back((s, raw));
        while self.kept.front().is_some_and(|&(t, _)| t + COOLDOWN_S <= s) {
            self.kept.pop_front();
        }
        if raw >= current {
            to_u32(raw)
        } else {
            to_u32(self.kept.iter().map(|&(_, r)| r).max().unwrap_or(raw))
        }
    }
}

fn to_u32(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

#[cfg(test)]
// `u64::is_multiple_of` is newer than the workspace's rust-version (1.85).
#[allow(clippy::manual_is_multiple_of)]
mod tests {
    use super::*;
    use crate::sim::simulate;
    use crate::trace::{trace_from_rates, Trace};

    fn sc(mu: f64, w: u64, initial: u32, max: u32) -> Scenario {
        Scenario {
            capacity: mu,
            warmup: w,
            slo: 5.0,
            interval: 15,
            min_replicas: 0,
            max_replicas: max,
            initial_replicas: initial,
        }
    }

    fn obs<'a>(now: u64, a: &'a [f64], b: &'a [f64], ready: u32, warming: u32) -> Observation<'a> {
        Observation { now, arrivals: a, backlog: b, ready, warming }
    }

    #[test]
    fn utilisation_and_queue_triggers() {
        let s = sc(1.0, 60, 1, 100);
        let mut p = ReactivePolicy::new(&s);
        // 60 s at 1.5 rps with 4 ready: util = ceil(1.5 / 0.8) = 2; no queue → raw 2 < 4, and
        // the kept max is 2 → 2.
        let a = vec![1.5; 60];
        let b = vec![0.0; 60];
        assert_eq!(p.decide(&obs(60, &a, &b, 4, 0)), 2);
        // Saturated fleet: rate 10 > 2·1 → ceil(2 / 0.8) = 3; queue 20 → ceil(20/5) = 4.
        let a = vec![10.0; 60];
        let mut b = vec![0.0; 60];
        b[59] = 20.0;
        let mut p = ReactivePolicy::new(&s);
        assert_eq!(p.decide(&obs(60, &a, &b, 2, 0)), 4);
        // Fewer than 60 s of history still divides by 60: 15 s at 4 rps → rate 1 → ceil(1/0.8) = 2.
        let mut p = ReactivePolicy::new(&s);
        assert_eq!(p.decide(&obs(15, &[4.0; 15], &[0.0; 15], 3, 0)), 2);
    }

    #[test]
    fn scale_up_is_limited_to_double_or_plus_four() {
        let s = sc(1.0, 60, 1, 1000);
        let mut b = vec![0.0; 60];
        b[59] = 1000.0; // queue = 200
        let a = vec![0.0; 60];
        // current 1 → max(2, 5) = 5
        assert_eq!(ReactivePolicy::new(&s).decide(&obs(60, &a, &b, 1, 0)), 5);
        // current 10 (3 ready + 7 warming) → max(20, 14) = 20
        assert_eq!(ReactivePolicy::new(&s).decide(&obs(60, &a, &b, 3, 7)), 20);
        // From zero there is no limit: max(1, raw).
        assert_eq!(ReactivePolicy::new(&s).decide(&obs(60, &a, &b, 0, 0)), 200);
    }

    #[test]
    fn scale_down_waits_for_the_300_s_stabilisation_window() {
        let s = sc(1.0, 0, 1, 100);
        let mut p = ReactivePolicy::new(&s);
        let mut a = vec![0.0; 2000];
        let b = vec![0.0; 2000];
        // High load until 600: 7.6 rps → util ceil(9.5) = 10.
        for x in a.iter_mut().take(600) {
            *x = 7.6;
        }
        for x in a.iter_mut().skip(600) {
            *x = 0.6; // keeps the fleet active, util ceil(0.75) = 1
        }
        assert_eq!(p.decide(&obs(600, &a[..600], &b[..600], 10, 0)), 10);
        // Load dropped at 600; by 660 util reads 1, but 10 was kept at s=600.
        assert_eq!(p.decide(&obs(660, &a[..660], &b[..660], 10, 0)), 10);
        assert_eq!(p.decide(&obs(885, &a[..885], &b[..885], 10, 0)), 10);
        // 600 + 300 = 900: the entry at 600 is out of the window; the one at 660 (raw 1) rules.
        assert_eq!(p.decide(&obs(900, &a[..900], &b[..900], 10, 0)), 1);
    }

    #[test]
    fn cooldown_to_zero_and_wake_from_zero() {
        let s = sc(1.0, 0, 2, 100);
        let mut p = ReactivePolicy::new(&s);
        let mut a = vec![0.0; 1000];
        a[100] = 1.0;
        let b = vec![0.0; 1000];
        // Active at 105 (arrival at 100 is within the last 15 s); util ceil(1/60/0.8) = 1.
        assert_eq!(p.decide(&obs(105, &a[..105], &b[..105], 2, 0)), 1);
        // Last active 105: at 390 (285 s) still held, at 405 (300 s) → 0.
        assert!(p.decide(&obs(390, &a[..390], &b[..390], 2, 0)) >= 1);
        assert_eq!(p.decide(&obs(405, &a[..405], &b[..405], 2, 0)), 0);
        // At zero and idle: stays 0.
        assert_eq!(p.decide(&obs(420, &a[..420], &b[..420], 0, 0)), 0);
        // A new arrival wakes it: max(1, raw) = 1.
        a[430] = 1.0;
        assert_eq!(p.decide(&obs(435, &a[..435], &b[..435], 0, 0)), 1);
    }

    #[test]
    fn never_active_counts_from_second_zero() {
        let s = sc(1.0, 0, 3, 100);
        let mut p = ReactivePolicy::new(&s);
        let a = vec![0.0; 400];
        // Idle but within the cooldown: raw = max(0, 1) = 1.
        assert_eq!(p.decide(&obs(0, &a[..0], &a[..0], 3, 0)), 1);
        assert_eq!(p.decide(&obs(285, &a[..285], &a[..285], 1, 0)), 1);
        assert_eq!(p.decide(&obs(300, &a[..300], &a[..300], 3, 0)), 0);
    }

    /// A deterministic bursty trace: quiet baseline, bursts, idle gaps (xorshift noise).
    fn bursty(seconds: usize) -> Trace {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut a = vec![0.0; seconds];
        for (s, v) in a.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let phase = (s / 900) % 4;
            let base = match phase {
                0 => 0.3,
                1 => 2.0,
                2 => 0.0,
                _ => 6.0,
            };
            let burst = if phase != 2 && x % 97 == 0 { (x % 40) as f64 } else { 0.0 };
            *v = (base * ((x >> 8) % 100) as f64 / 50.0).round() + burst;
        }
        trace_from_rates(1, &a)
    }

    #[test]
    fn plan_is_causal_under_truncation() {
        let full = bursty(4 * 3600);
        let s = sc(0.5, 180, 2, 200);
        let whole = simulate(&full, &s, &mut ReactivePolicy::new(&s), None);
        assert!(whole.plan.iter().any(|p| p.1 == 0), "reaches zero");
        assert!(whole.plan.iter().any(|p| p.1 > 10), "scales up");
        for t in [1usize, 14, 15, 16, 900, 1801, 2700, 7777, 12_000] {
            let cut = simulate(&full.truncated(t), &s, &mut ReactivePolicy::new(&s), None);
            let prefix: Vec<_> = whole.plan.iter().take_while(|p| p.0 < t as u64).collect();
            assert_eq!(cut.plan.iter().collect::<Vec<_>>(), prefix, "t = {t}");
        }
    }
}
