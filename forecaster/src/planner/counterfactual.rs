//! The counterfactual replay of every candidate margin, and the miss price's feedback.

use super::*;

/// Candidate upper quantiles of the forecast-error ratio.
pub(super) const CF_QS: [f64; 9] = [0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.998];
/// Margin candidates.
pub(super) const CF_NQ: usize = CF_QS.len();

/// Candidate wake thresholds on P(arrival within W + I) (∞ = never wake ahead).
pub(super) const CF_WAKES: [f64; 11] = [0.05, 0.15, 0.3, 0.5, 0.8, 0.05, 0.15, 0.3, 0.5, 0.8, f64::INFINITY];
/// Wake candidates from this index on wake with the high (q0.9) first-interval demand, the
/// others with the median one.
pub(super) const CF_WAKE_HI_FROM: usize = 5;
/// Candidate standing levels, multiples of the slow mean rate (bursty traffic whose bursts
/// are shorter than W can only be served by capacity that is already there).
pub(super) const CF_LEVELS: [f64; 8] = [0.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0];
/// Forecast-margin candidates (every q × wake pair), then one per standing level > 0.
/// Candidate standing levels from a decaying peak of the effective demand: (share of the
/// peak, half-life index into `PEAK_HALF_LIVES_S`) — Autopilot's peak recommender.
pub(super) const CF_PEAKS: [(f64, usize); 6] = [(0.5, 0), (0.75, 0), (1.0, 0), (0.5, 1), (0.75, 1), (1.0, 1)];
pub(super) const PEAK_HALF_LIVES_S: [f64; 2] = [900.0, 3600.0];
/// Standing levels (> 0) of each kind: the multiples of the slow mean rate, then the peaks.
pub(super) const CF_NL: usize = CF_LEVELS.len() - 1 + CF_PEAKS.len();
/// Every standing level comes twice: waking a fleet at zero whenever the level stands, and,
/// on a window grid, only when an arrival within W + I is at least this likely. After a burst
/// on a sparse grid client, a peak level otherwise ordered its fleet ahead of every window
/// boundary for hours and cancelled it unready at each empty window (a held-out ServeGen
/// client at W = 420 s: 30 replicas × 435 s per window at P(arrival) = 0.07). Which of the
/// two a client needs is the counterfactual's to find (see ARCHITECTURE.md, session 23).
pub(super) const LEVEL_WAKE_P: f64 = 0.3;
/// `Cand::wake` of a standing level that wakes from zero only at `LEVEL_WAKE_P` on a grid.
pub(super) const LEVEL_GATED: usize = 1;
/// Forecast margins (every q × wake pair), then the gated and the plain standing levels.
pub(super) const CF_N: usize = CF_NQ * CF_WAKES.len() + 2 * CF_NL;
/// Orders kept for the counterfactual replay (spaced so that W is always covered).
pub(super) const CF_ORDERS_CAP: usize = 128;
/// Half-life of the counterfactual evidence behind the budget (the candidates' and the
/// shadow's decayed spend), seconds: two days, so a daily cycle is paid for as a whole.
pub(super) const CF_HALF_LIFE_S: f64 = 2.0 * 86400.0;
/// Cap on the half-life of the evidence that picks the margin to follow (cost + price ×
/// late) and of every "recent" share (the miss price's feedback, the status quo's recent
/// misses), seconds: the budget's two days. The events that decide a margin (a morning
/// wake-up, the day's first ramp, a burst) come once a day or less; judged on the last few
/// hours, the choice forgot yesterday's by the time the next one came and switched after
/// each one to the margin that would have caught it (a 6-hour cap missed more on the dev
/// set and on five of the eight held-out sets this changes; see ARCHITECTURE.md, session 17).
pub(super) const CF_SELECT_HALF_LIFE_S: f64 = CF_HALF_LIFE_S;
/// The selection half-life is this share of the counterfactual's age, up to
/// `CF_SELECT_HALF_LIFE_S` and at least `CF_SELECT_MIN_HALF_LIFE_S`.
pub(super) const CF_SELECT_AGE_SHARE: f64 = 0.5;
pub(super) const CF_SELECT_MIN_HALF_LIFE_S: f64 = 300.0;

/// What the planner knew at one decision: enough to recompute the capacity every candidate
/// margin would have ordered.
#[derive(Debug, Clone, Copy)]
pub(super) struct OrderSnap {
    pub(super) t: f64,
    pub(super) regime: Regime,
    pub(super) current: f64,
    pub(super) point: f64,
    /// ln(upper/point) ratio quantile per candidate quantile.
    pub(super) lr: [f64; CF_QS.len()],
    /// Upper of the member mixture per candidate quantile.
    pub(super) mix: [f64; CF_QS.len()],
    pub(super) p_arrival: f64,
    pub(super) wake_rate: f64,
    pub(super) wake_rate_lo: f64,
    pub(super) level: f64,
    /// Arrival rate over the last minute.
    pub(super) rate: f64,
    /// Decaying peaks of the effective demand, per half-life.
    pub(super) peak: [f64; 2],
    /// Seconds a projected backlog is drained over once the replicas ordered for it are ready.
    pub(super) drain_s: f64,
    /// Off a grid (or on one finer than W): the last minute's rate carried forward by
    /// its recent rise over part of W + I (see `Planner::ramp_floor`); 0 on a coarse grid.
    pub(super) ramp: f64,
    /// The demand follows a window grid (see `Planner::grid`).
    pub(super) on_grid: bool,
    /// The rate a backlog is projected with while no replica is ready (see `projection_rate`).
    pub(super) rate_cold: f64,
    /// On a grid finer than W, the current window's start: until the next change point
    /// nothing is learnt, so every need placed since is held (see `Planner::fine_window_start`).
    pub(super) window_start: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cand {
    pub(super) q: usize,
    /// A forecast margin's wake rule (index into `CF_WAKES`); for a standing level, 0 or
    /// `LEVEL_GATED`.
    pub(super) wake: usize,
    pub(super) level: usize,
}

impl Cand {
    pub(super) fn from_index(i: usize) -> Cand {
        let nw = CF_WAKES.len();
        let nf = CF_NQ * nw;
        if i < nf {
            Cand { q: i / nw, wake: i % nw, level: 0 }
        } else {
            // The gated levels first: on a tie (the gate never closed) the choice keeps the
            // smaller index, and the plain level stays last (the young planner's default).
            let j = (i - nf).min(2 * CF_NL - 1);
            let (wake, j) = if j < CF_NL { (LEVEL_GATED, j) } else { (0, j - CF_NL) };
            Cand { q: 0, wake, level: j + 1 }
        }
    }

    /// A standing level that wakes a fleet at zero on a grid only at `LEVEL_WAKE_P`.
    pub(super) fn level_gated(&self) -> bool {
        self.level > 0 && self.wake == LEVEL_GATED
    }

    /// P(arrival within W + I) at which the planner's idle rule wakes (or keeps) the fleet this
    /// candidate asks for: a forecast margin's wake threshold; for a standing level the lowest
    /// one, gated or not (a gated level's gate acts on what it asks for, in `cand_upper`).
    pub(super) fn wake_p(&self) -> f64 {
        CF_WAKES[if self.level > 0 { 0 } else { self.wake.min(CF_WAKES.len() - 1) }]
    }

    /// The margin this candidate plans with, as a decision's reason names it.
    pub(super) fn margin(&self) -> Margin {
        if self.level == 0 {
            Margin::Forecast { q: CF_QS[self.q.min(CF_NQ - 1)] }
        } else if self.level < CF_LEVELS.len() {
            Margin::MeanLevel { share: CF_LEVELS[self.level] }
        } else {
            let (share, h) = CF_PEAKS[(self.level - CF_LEVELS.len()).min(CF_PEAKS.len() - 1)];
            Margin::PeakLevel { share, half_life_s: PEAK_HALF_LIVES_S[h] }
        }
    }
}

impl fmt::Display for Cand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.level == 0 {
            write!(f, "forecast q{}", CF_QS[self.q])?;
            match CF_WAKES[self.wake] {
                p if p.is_finite() => {
                    let at = if self.wake >= CF_WAKE_HI_FROM { "q0.9" } else { "median" };
                    write!(f, ", wake at p≥{p} with the {at} wake-up demand")
                }
                _ => write!(f, ", no wake ahead of arrivals"),
            }
        } else {
            write!(f, "{}", self.margin())?;
            if self.level_gated() {
                write!(f, ", waking from zero on a grid at p≥{LEVEL_WAKE_P}")?;
            }
            Ok(())
        }
    }
}

/// Upper demand (req/s) a candidate margin plans for, given a decision's snapshot.
pub(super) fn cand_upper(s: &OrderSnap, c: Cand, eps: f64) -> f64 {
    if c.level > 0 && s.regime != Regime::GridSteady {
        // A standing level replaces the forecast: chasing bursts shorter than W only pays
        // warm-ups for capacity that arrives after the burst.
        let v = if c.level < CF_LEVELS.len() {
            CF_LEVELS[c.level] * s.level
        } else {
            let (k, h) = CF_PEAKS[c.level - CF_LEVELS.len()];
            k * s.peak[h]
        };
        // A level decayed to crumbs is no reason to keep a replica; nor, for a gated level on
        // a grid, an unlikely arrival a reason to wake a fleet at zero.
        let unlikely = c.level_gated() && s.on_grid && s.current <= 0.0 && s.p_arrival < LEVEL_WAKE_P;
        let v = if v < eps || unlikely { 0.0 } else { v };
        // On a grid the current window's rate holds until its change point: a level below it
        // would shed ready replicas that are short from now until then.
        return if s.regime == Regime::GridChange { v.max(s.current) } else { v };
    }
    match s.regime {
        Regime::GridSteady => s.current,
        Regime::Idle => {
            if s.p_arrival >= CF_WAKES[c.wake] {
                let wake = if c.wake >= CF_WAKE_HI_FROM { s.wake_rate } else { s.wake_rate_lo };
                s.point.max(wake)
            } else {
                0.0
            }
        }
        Regime::Generic | Regime::GridChange => {
            ((s.point + eps) * s.lr[c.q].exp() - eps).max(0.0).max(s.current).max(s.mix[c.q]).max(s.ramp)
        }
    }
}

/// The margin behind `cand_upper(s, c, _)`, as a pre-scale's reason names it: between a
/// grid's change points every candidate plans the window's known rate; with no demand right
/// now a forecast margin plans a wake-up's demand.
pub(super) fn cand_margin(s: &OrderSnap, c: Cand) -> Margin {
    match s.regime {
        Regime::GridSteady => Margin::WindowRate,
        Regime::Idle if c.level == 0 => Margin::WakeDemand { q: if c.wake >= CF_WAKE_HI_FROM { 0.9 } else { 0.5 } },
        _ => c.margin(),
    }
}

/// The backlog an order placed now has to drain when it is ready, W from now: today's `b`
/// plus what the fleet falls short of the arrival `rate` over W, with `ready` replicas of
/// capacity `mu` now and the ready count rising at `steps` (seconds from now, replicas ready
/// from then on; in time order). The real planner and every counterfactual candidate size
/// their drain with it; only the real planner, on a grid finer than W, passes steps (its own
/// replicas still warming, see `OwnOrders`).
pub(super) fn backlog_at_ready(
    b: f64,
    rate: f64,
    mu: f64,
    ready: u32,
    w: f64,
    steps: impl IntoIterator<Item = (f64, u32)>,
) -> f64 {
    if b > 0.0 {
        let (mut short, mut from, mut n) = (0.0, 0.0, ready);
        for (at, ready_then) in steps {
            let at = at.max(from).min(w.max(from));
            short += (rate - f64::from(n) * mu).max(0.0) * (at - from);
            from = at;
            n = n.max(ready_then);
        }
        b + short + (rate - f64::from(n) * mu).max(0.0) * (w - from)
    } else {
        0.0
    }
}

/// The arrival rate a backlog is projected with by a fleet with `ready` replicas serving. With
/// none ready nothing is served and the backlog grows at the arrival rate itself, which off a
/// grid the 1-minute mean lags by up to a minute: a burst that meets a fleet at zero 15 s in
/// shows a quarter of its rate there, and the first order, the one that decides how long the
/// cold start's queue lasts, would be sized for that quarter.
pub(super) fn projection_rate(s: &OrderSnap, ready: u32) -> f64 {
    if ready == 0 {
        s.rate_cold
    } else {
        s.rate
    }
}

/// Whether a decision sees requests served late: a backlog more than `ready` replicas of
/// capacity `mu` clear within the SLO. It starts the late hold, in the real planner and in
/// every candidate's replay alike (`Planner::scale_in_hold`, `Counterfactual::push`).
pub(super) fn served_late(backlog: f64, ready: u32, mu: f64, slo: f64) -> bool {
    backlog > f64::from(ready) * mu * slo
}

/// Seconds a backlog is drained over once the replicas ordered for it are ready: the SLO, a
/// tenth of W if longer, and at least `min_s`.
pub(super) fn drain_seconds(slo: f64, w: f64, min_s: f64) -> f64 {
    slo.max(DRAIN_W_SHARE * w).max(min_s).max(1.0)
}

/// The demand the ready fleet is serving now: a standing level that does not chase a burst
/// with new replicas (they would be ready after it) still keeps the ready ones the current
/// demand uses, which are paid for already; shedding them turns a served burst into a late one.
pub(super) fn in_use(s: &OrderSnap, ready: u32, mu: f64) -> f64 {
    s.current.max(0.0).min(f64::from(ready) * mu)
}

/// Counterfactual replay of every candidate margin: each candidate's fleet follows the
/// orders it would have placed, with the fleet rules of the real one (a replica ordered at
/// `d` serves from `d + W`, is paid from `d`, and a smaller order removes replicas at once,
/// warming ones first; on a grid finer than W no order goes below an earlier one of the same
/// window, as the planner holds its needs); its own fluid queue is fed the real arrivals,
/// and its replica-seconds and late mass are accumulated with exponential decay. The planner
/// then follows the candidate with the lowest cost + price × late mass, i.e. it learns its
/// safety margin from the misses it would have had (Autopilot's recommender).
#[derive(Debug, Clone)]
pub(super) struct Counterfactual {
    /// Orders not yet ready: time and each candidate's replica count, clipped by later
    /// smaller orders (replicas removed while warming never become ready).
    pub(super) orders: VecDeque<(f64, [u32; CF_N])>,
    /// Replicas paid (the newest order) and ready, per candidate.
    pub(super) reps: Vec<u32>,
    pub(super) ready: Vec<u32>,
    pub(super) backlog: Vec<f64>,
    pub(super) late: Vec<f64>,
    pub(super) cost: Vec<f64>,
    /// The same with the shorter selection half-life (which margin is best now).
    pub(super) late_s: Vec<f64>,
    pub(super) cost_s: Vec<f64>,
    pub(super) seen_s: f64,
    /// Arrival mass with the selection half-life (the denominator of the recent miss share).
    pub(super) mass_s: f64,
    pub(super) started: bool,
    /// On a grid finer than W: each candidate's largest order since `held_window` began (the
    /// window's start), which its later orders in that window do not go below.
    pub(super) held: Vec<u32>,
    pub(super) held_window: f64,
    /// On a grid finer than W: each candidate's largest order of about the last W (the
    /// order and when it was placed; it lapses W later, to the order of that decision), and
    /// until when its late hold lasts (W after its last decision that saw requests served
    /// late), as the real planner's late hold (`Planner::scale_in_hold`).
    pub(super) recent_top: Vec<(u32, f64)>,
    pub(super) late_until: Vec<f64>,
}

impl Counterfactual {
    pub(super) fn new() -> Self {
        Counterfactual {
            orders: VecDeque::with_capacity(CF_ORDERS_CAP),
            reps: vec![0; CF_N],
            ready: vec![0; CF_N],
            backlog: vec![0.0; CF_N],
            late: vec![0.0; CF_N],
            cost: vec![0.0; CF_N],
            late_s: vec![0.0; CF_N],
            cost_s: vec![0.0; CF_N],
            seen_s: 0.0,
            mass_s: 0.0,
            started: false,
            held: vec![0; CF_N],
            held_window: f64::NAN,
            recent_top: vec![(0, f64::NEG_INFINITY); CF_N],
            late_until: vec![f64::NEG_INFINITY; CF_N],
        }
    }

    /// Place every candidate's order for decision snapshot `s`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn push(
        &mut self,
        s: &OrderSnap,
        min_spacing: f64,
        w: f64,
        mu: f64,
        slo: f64,
        eps: f64,
        max_r: f64,
        n0: u32,
    ) {
        if !self.started {
            // Every candidate starts from the fleet the planner was handed.
            self.started = true;
            self.reps.iter_mut().for_each(|r| *r = n0);
            self.ready.iter_mut().for_each(|r| *r = n0);
        }
        if let Some(b) = self.orders.back() {
            if s.t < b.0 + min_spacing - 1e-9 {
                return;
            }
        }
        match s.window_start {
            Some(ws) if ws != self.held_window => {
                self.held.iter_mut().for_each(|h| *h = 0);
                self.held_window = ws;
            }
            Some(_) => {}
            None => self.held_window = f64::NAN,
        }
        let mut ord = [0u32; CF_N];
        for (i, o) in ord.iter_mut().enumerate() {
            // As the real planner does: drain the backlog the candidate will have when this
            // order is ready (today's plus its shortfall over W).
            let proj = backlog_at_ready(self.backlog[i], projection_rate(s, self.ready[i]), mu, self.ready[i], w, []);
            let u = cand_upper(s, Cand::from_index(i), eps).max(in_use(s, self.ready[i], mu)) + proj / s.drain_s;
            let mut r = (u / mu - 1e-9).ceil().clamp(0.0, max_r) as u32;
            // As the real planner holds them (`Planner::scale_in_hold`), so that the budget
            // prices the hold.
            if s.window_start.is_some() {
                r = r.max(self.held[i]);
                self.held[i] = r;
                // And its late hold: after a decision that sees its own requests served late,
                // its largest order of the last W holds for W. Unpriced, the real planner's
                // late hold on a fine grid was spend its followed candidate never showed, and
                // the budget divided by that overhead left the margins too thin for the next
                // step (ARCHITECTURE.md, session 39).
                let (top, at) = self.recent_top[i];
                if r >= top || s.t - at > w + 1e-9 {
                    self.recent_top[i] = (r, s.t);
                }
                if served_late(self.backlog[i], self.ready[i], mu, slo) {
                    self.late_until[i] = s.t + w;
                }
                if s.t < self.late_until[i] {
                    r = r.max(self.recent_top[i].0);
                }
            }
            *o = r;
            self.reps[i] = r;
            // Fewer than ready: ready replicas are removed at once.
            if r < self.ready[i] {
                self.ready[i] = r;
            }
        }
        // A smaller order removes replicas still warming.
        for (_, pend) in self.orders.iter_mut() {
            for i in 0..CF_N {
                if ord[i] < pend[i] {
                    pend[i] = ord[i];
                }
            }
        }
        if self.orders.len() == CF_ORDERS_CAP {
            // Out of room (very long W): the oldest order is made ready early.
            if let Some((_, o)) = self.orders.pop_front() {
                for (r, &x) in self.ready.iter_mut().zip(o.iter()) {
                    *r = (*r).max(x);
                }
            }
        }
        self.orders.push_back((s.t, ord));
    }

    pub(super) fn observe(&mut self, t0: f64, dt: f64, mass: f64, w: f64, mu: f64, slo: f64) {
        if !self.started {
            return;
        }
        while let Some(&(t, r)) = self.orders.front() {
            if t + w <= t0 + 1e-9 {
                self.orders.pop_front();
                for ((rd, &x), &paid) in self.ready.iter_mut().zip(r.iter()).zip(self.reps.iter()) {
                    *rd = (*rd).max(x).min(paid);
                }
            } else {
                break;
            }
        }
        self.seen_s += dt;
        let decay = (-dt * std::f64::consts::LN_2 / CF_HALF_LIFE_S).exp();
        // The selection's half-life grows with the evidence: half the counterfactual's age,
        // from 5 minutes to its cap, so a young planner soon stops judging margins by the
        // misses of its own learning phase (when no burst of the current size had been seen)
        // and an old one judges them on the last hours.
        let decay_s = self.select_decay(dt);
        self.mass_s = self.mass_s * decay_s + mass;
        for i in 0..CF_N {
            let c = self.ready[i] as f64 * mu;
            let b = (self.backlog[i] + mass - c * dt).max(0.0);
            self.backlog[i] = b;
            let late = if b > c * slo + 1e-9 { mass } else { 0.0 };
            self.late[i] = self.late[i] * decay + late;
            self.cost[i] = self.cost[i] * decay + self.reps[i] as f64 * dt;
            self.late_s[i] = self.late_s[i] * decay_s + late;
            self.cost_s[i] = self.cost_s[i] * decay_s + self.reps[i] as f64 * dt;
        }
    }

    /// `late` (late mass with the selection half-life: a candidate's or the shadow's) as a
    /// share of the arrivals over the same evidence; `None` before any arrival.
    pub(super) fn recent_share(&self, late: f64) -> Option<f64> {
        (self.mass_s > 0.0).then(|| late / self.mass_s)
    }

    /// Decay over `dt` of the selection evidence (half-life: half the counterfactual's age,
    /// within `CF_SELECT_MIN_HALF_LIFE_S ..= CF_SELECT_HALF_LIFE_S`).
    pub(super) fn select_decay(&self, dt: f64) -> f64 {
        let hl_s = (CF_SELECT_AGE_SHARE * self.seen_s).clamp(CF_SELECT_MIN_HALF_LIFE_S, CF_SELECT_HALF_LIFE_S);
        (-dt * std::f64::consts::LN_2 / hl_s).exp()
    }

    /// The candidate with the lowest cost + `price` × late mass among those whose cost is
    /// within `budget` (the cheapest if none is); ties go to the smaller margin; the
    /// incumbent `cur` is kept unless another is better by more than 2 % (switching margins
    /// churns the fleet).
    ///
    /// `brake` (the status quo's recent spend, when the planner has already spent its budget):
    /// a candidate must then also not outspend the status quo on the mean of its recent and
    /// two-day spend ratios. The two-day cost alone says what the candidate would have spent
    /// had it been followed all along, not what following it from now on adds to what the
    /// planner has actually spent; the recent ratio alone is myopic, as the status quo spends
    /// in panics (a burst doubles its fleet for 5 minutes).
    /// With `late_cap`, only among the candidates whose two-day late mass is at most that
    /// (the status quo's), when any within the budget is; else among all.
    pub(super) fn best(
        &self,
        price: f64,
        cur: Option<usize>,
        budget: f64,
        brake: Option<f64>,
        late_cap: Option<f64>,
    ) -> usize {
        let unaffordable = |i: usize| {
            self.cost[i] > budget
                || brake.is_some_and(|recent| self.cost_s[i] / recent.max(1e-9) + self.cost[i] / budget.max(1e-9) > 2.0)
        };
        let late_cap = late_cap.filter(|&cap| (0..CF_N).any(|i| !unaffordable(i) && self.late[i] <= cap));
        let over = |i: usize| unaffordable(i) || late_cap.is_some_and(|cap| self.late[i] > cap);
        let mut best = None;
        let mut bj = f64::INFINITY;
        let mut cheapest = 0;
        for i in 0..CF_N {
            if self.cost[i] < self.cost[cheapest] {
                cheapest = i;
            }
            if over(i) {
                continue;
            }
            let j = self.cost_s[i] + price * self.late_s[i];
            if j < bj {
                bj = j;
                best = Some(i);
            }
        }
        let Some(best) = best else {
            return cheapest;
        };
        if let Some(c) = cur {
            if c < CF_N && !over(c) && self.cost_s[c] + price * self.late_s[c] <= bj * 1.02 {
                return c;
            }
        }
        best
    }

    /// A candidate better than `i` (lower cost + `price` × late) but over `budget`, with the
    /// most objective gained per replica-second, and the share of it the budget affords.
    pub(super) fn partner(&self, i: usize, price: f64, budget: f64) -> Option<(usize, f64)> {
        let ci = self.cost[i];
        let ji = self.cost_s[i] + price * self.late_s[i];
        if budget <= ci {
            return None;
        }
        let ca = Cand::from_index(i);
        let mut best: Option<(usize, f64)> = None;
        for k in 0..CF_N {
            let ck = self.cost[k];
            let jk = self.cost_s[k] + price * self.late_s[k];
            // Only a costlier margin of the same kind (same wake rule, forecast or standing
            // level) mixes into a margin between the two.
            let cb = Cand::from_index(k);
            if cb.wake != ca.wake || (cb.level == 0) != (ca.level == 0) {
                continue;
            }
            if ck <= budget || jk >= ji {
                continue;
            }
            let gain = (ji - jk) / (self.cost_s[k] - self.cost_s[i]).max(1e-9);
            if best.is_none_or(|(_, g)| gain > g) {
                best = Some((k, gain));
            }
        }
        // The budget's integral feedback trims the share if the mix overspends.
        best.map(|(k, _)| (k, (BLEND_HEADROOM_SHARE * (budget - ci) / (self.cost[k] - ci)).clamp(0.0, 1.0)))
    }

    pub(super) fn approx_heap_bytes(&self) -> usize {
        self.orders.capacity() * std::mem::size_of::<(f64, [u32; CF_N])>()
            + (self.backlog.capacity()
                + self.late.capacity()
                + self.cost.capacity()
                + self.late_s.capacity()
                + self.cost_s.capacity())
                * 8
            + (self.reps.capacity() + self.ready.capacity() + self.held.capacity()) * 4
            + self.recent_top.capacity() * std::mem::size_of::<(u32, f64)>()
            + self.late_until.capacity() * 8
    }
}

/// The recent miss share the planner aims for, given the reactive shadow's recent miss share:
/// `1 − ATTAINMENT_TARGET`, or a third of the shadow's where that is lower.
pub(super) fn miss_target(shadow_miss_share: f64) -> f64 {
    let s = if shadow_miss_share.is_finite() { shadow_miss_share.max(0.0) } else { 1.0 };
    (1.0 - ATTAINMENT_TARGET).min(SHADOW_MISS_SHARE * s).max(MISS_TARGET_FLOOR)
}

/// One step of the miss price's integral feedback: the gain grows while the recent miss share
/// is above `target` (see [`miss_target`]) and there is spare budget, and shrinks back towards 1
/// otherwise. Only spare budget is spent this way: near the budget the price returns to its
/// base, because there the budget decides, and a dearer miss would only tip the choice to
/// candidates that the planner's own overhead pushes over it.
pub(super) fn price_feedback(gain: f64, miss_share: f64, target: f64, spare_budget: bool) -> f64 {
    let r = if spare_budget && miss_share.is_finite() {
        (miss_share.max(0.0) + 0.01 * MISS_TARGET_FLOOR) / target.max(MISS_TARGET_FLOOR)
    } else {
        0.1
    };
    let g = if gain.is_finite() { gain } else { 1.0 };
    (g * r.clamp(0.1, 10.0).powf(PRICE_GAIN_RATE)).clamp(1.0, PRICE_GAIN_MAX)
}
