//! The status quo's shadows: KEDA + HPA and the rate rules, each on its own fleet and queue.

use super::*;

/// KEDA's default cooldown and the HPA's scale-down stabilisation, seconds.
pub(super) const REACTIVE_HOLD_S: f64 = 300.0;
/// Warming batches the reactive shadow tracks.
pub(super) const SHADOW_WARMING_CAP: usize = 256;

/// Counterfactual of the status quo: today's KEDA + HPA (utilisation target 80 %, queue
/// trigger, 300-s stabilisation and cooldown; REPLAY.md "Reactive") run on the same
/// arrivals with its own fleet and queue. Its decayed cost is the planner's budget: prescale
/// spends at most what the default autoscaler would have, and buys attainment with it.
#[derive(Debug, Clone)]
pub(super) struct ReactiveShadow {
    /// `None`: KEDA + HPA itself (REPLAY.md's reactive policy); otherwise a rate rule.
    pub(super) rule: Option<RateRule>,
    pub(super) ready: u32,
    pub(super) warming: VecDeque<(f64, u32)>,
    pub(super) backlog: f64,
    pub(super) last_active: f64,
    pub(super) kept: VecDeque<(f64, u32)>,
    pub(super) cost: f64,
    pub(super) late: f64,
    /// Late mass and cost with the counterfactual's selection half-life (the status quo's
    /// recent misses and spend).
    pub(super) late_s: f64,
    pub(super) cost_s: f64,
    pub(super) started: bool,
}

impl ReactiveShadow {
    pub(super) fn new(rule: Option<RateRule>) -> Self {
        ReactiveShadow {
            rule,
            ready: 0,
            // Grows with use: a handful of batches in flight, at most SHADOW_WARMING_CAP.
            warming: VecDeque::new(),
            backlog: 0.0,
            last_active: 0.0,
            kept: VecDeque::new(),
            cost: 0.0,
            late: 0.0,
            late_s: 0.0,
            cost_s: 0.0,
            started: false,
        }
    }

    pub(super) fn n(&self) -> u32 {
        self.warming.iter().fold(self.ready, |n, x| n.saturating_add(x.1))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn decide(
        &mut self,
        t: f64,
        n0: u32,
        rate: f64,
        active_recent: bool,
        mu: f64,
        slo: f64,
        w: f64,
        max_r: u32,
    ) {
        if !self.started {
            self.started = true;
            self.ready = n0;
            self.last_active = t;
        }
        let ready = self.ready as f64;
        let util = if let Some(RateRule { m, z, .. }) = self.rule {
            ((rate * m + z * (rate / slo.max(1e-9)).sqrt()) / mu - 1e-9).ceil().max(0.0)
        } else if rate > ready * mu && self.ready > 0 {
            (ready / 0.8).ceil()
        } else {
            (rate.min(ready * mu) / (0.8 * mu)).ceil()
        };
        let queue = (self.backlog / (mu * slo.max(1e-9))).ceil();
        let raw = util.max(queue).clamp(0.0, max_r as f64) as u32;
        let active = self.backlog > 0.0 || active_recent;
        if active {
            self.last_active = t;
        }
        let cur = self.n();
        let d = if cur == 0 {
            if active {
                raw.max(1)
            } else {
                0
            }
        } else if t - self.last_active >= REACTIVE_HOLD_S {
            self.kept.clear();
            0
        } else {
            let raw = raw.max(1).min(cur.saturating_mul(2).max(cur.saturating_add(4)));
            self.kept.push_back((t, raw));
            while self.kept.front().is_some_and(|&(s, _)| s + REACTIVE_HOLD_S <= t) {
                self.kept.pop_front();
            }
            if self.kept.len() > NEED_CAP {
                self.kept.pop_front();
            }
            if raw >= cur {
                raw
            } else {
                self.kept.iter().map(|x| x.1).max().unwrap_or(raw)
            }
        };
        let d = d.min(max_r);
        if d > cur {
            if self.warming.len() == SHADOW_WARMING_CAP {
                // Merge into the newest batch rather than grow.
                if let Some(b) = self.warming.back_mut() {
                    b.1 += d - cur;
                }
            } else {
                self.warming.push_back((t + w, d - cur));
            }
        } else if d < cur {
            let mut x = cur - d;
            while x > 0 {
                let Some(b) = self.warming.back_mut() else {
                    break;
                };
                if b.1 > x {
                    b.1 -= x;
                    x = 0;
                } else {
                    x -= b.1;
                    self.warming.pop_back();
                }
            }
            self.ready = self.ready.saturating_sub(x);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn observe(&mut self, t0: f64, dt: f64, mass: f64, mu: f64, slo: f64, decay: f64, decay_s: f64) {
        if !self.started {
            return;
        }
        while let Some(&(at, c)) = self.warming.front() {
            if at <= t0 + 1e-9 {
                self.ready = self.ready.saturating_add(c);
                self.warming.pop_front();
            } else {
                break;
            }
        }
        let n = self.n() as f64;
        let c = self.ready as f64 * mu;
        self.backlog = (self.backlog + mass - c * dt).max(0.0);
        let late = if self.backlog > c * slo + 1e-9 { mass } else { 0.0 };
        self.cost = self.cost * decay + n * dt;
        self.late = self.late * decay + late;
        self.late_s = self.late_s * decay_s + late;
        self.cost_s = self.cost_s * decay_s + n * dt;
    }
}
