//! The warm-up-aware planner.
//!
//! Fed demand samples (`observe`) and asked for a replica count (`plan`), it
//!
//! - turns samples into a per-interval *effective demand* `x` (req/s): the larger of the mean
//!   rate and the burst rate that the SLO lets a queue absorb (`max A(window)/(len + slo)`);
//! - forecasts the peak of `x` over `[now, now + W + I]` with an ensemble (last value, level/
//!   trend smoothing, daily Holt-Winters, daily and weekly seasonal naive) weighted by recent
//!   pinball loss, and calibrates an upper quantile from the realised ratios peak/forecast;
//! - detects piecewise-constant signals whose change points fall on a grid (aggregated rate
//!   series): between change points the demand is known exactly and headroom is only needed
//!   for the next change point, from the last decision whose order is still ready by it
//!   (just in time: earlier orders only pay for replicas that sit ready before the change);
//! - calibrates the forecast's upper quantiles from resolved forecasts weighted by their
//!   share of an independent horizon (consecutive horizons overlap), standardised by the
//!   level's sqrt (a small fleet's relative margin is wider than a large one's) and scaled by
//!   the errors' recent spread (a restless hour widens the margin up to 1.5×); at a change
//!   point, widened after a dip that has come back before, at the minute of the hour where
//!   rises recurred, and after a rise where rises have gone on rising (`calibration.rs`);
//! - keeps an idle-gap histogram plus daily and weekly activity profiles to decide
//!   scale-to-zero and wake-up (hybrid-histogram keep-alive with the ski-rental break-even W);
//! - learns its safety margin from the misses it would have had (Autopilot): a
//!   counterfactual replays ~100 candidate policies on the same arrivals with the fleet rules
//!   of REPLAY.md (ratio quantile of the forecast × wake threshold on P(arrival), or a standing
//!   level: multiple of the slow mean rate or share of a decaying peak of `x`), each with its
//!   own fluid queue, and the planner follows the one with the lowest replica-seconds +
//!   price × late mass ([`MISS_PRICE_SERVICE_TIMES`]) over recent evidence (half-life: half
//!   the planner's age, at most the budget's two days); the price rises while attainment is
//!   below its target and budget is left over (`price_feedback`); where the status quo misses
//!   almost nothing (`STATUS_QUO_NEAR_PERFECT`), only margins no later than it over two days
//!   are followed;
//! - budgets itself by the status quo: a shadow of today's KEDA + HPA (REPLAY.md "Reactive")
//!   runs on the same arrivals, and candidates costing more than it over two days (corrected for the
//!   planner's measured overhead over the bare candidate, with integral feedback on its own
//!   spend) are not eligible; the headroom left between the best eligible candidate and a
//!   better, costlier one of the same kind is spent on a convex mix of their planned demands
//!   (the candidate grid is coarse), once the budget has a few hours of evidence;
//! - without a window grid, may answer with the status quo's own count: the shadow's, or a
//!   rate rule's (`RateRule`: the HPA's shape sized on the mean arrival rate plus its Poisson
//!   noise) that beat it on both cost and misses. After a day of evidence while the status
//!   quo's two-day cost + price × late beats the best candidate's by 1.5× (until it is back
//!   within 1.2×): on noisy low-rate request logs a 1–3-minute mean with a 5-minute hold is
//!   the best margin there is. After an hour (and a replica-hour of the status quo's spend),
//!   whenever no candidate fits the budget (the status quo costs what the budget is; the
//!   cheapest margin misses far more), or the budget is spent and the margin it affords has
//!   recently missed over twice what the status quo did;
//! - drains a backlog sized for when new replicas are ready (today's backlog plus the
//!   shortfall over W; with no replica ready, off a grid, at the last interval's rate if the
//!   lagging 1-minute mean is lower; on a grid finer than W, net of its own replicas still
//!   warming from their ready seconds, `orders.rs`) over max(SLO, W/10), and off a grid over
//!   at least two decision intervals (a faster drain is cancelled, still warming, at the next
//!   decision);
//! - never sheds ready replicas the current demand is using (a standing level does not chase
//!   a burst with new replicas, but keeps the ready ones serving it), and holds a need for W
//!   against a scale-in (ski-rental) where the future is unknown: off a grid or on one finer
//!   than W under a forecast margin, on any grid for W after requests were served
//!   late, whatever the budget, on a coarse grid an order for the next window until its
//!   change point, and on a finer grid every need until the next change point, in each
//!   candidate's counterfactual fleet too (`scale_in_hold`).
//!
//! Pure and deterministic: time is always an argument; memory is bounded (see
//! [`Planner::approx_heap_bytes`]).

use std::collections::VecDeque;
use std::fmt;

use crate::history::{DemandHistory, HistoryPoint};
use crate::idle::IdleTracker;
use crate::models::{Ensemble, HoltWinters, QuantileTracker, SeasonalNaive, Smoothing};

mod calibration;
mod choice;
mod counterfactual;
mod grid;
mod orders;
mod outcome;
mod shadow;
#[cfg(test)]
mod tests;
mod types;

use calibration::*;
pub use choice::MISS_PRICE_SERVICE_TIMES;
use choice::*;
use counterfactual::*;
use grid::*;
use shadow::*;
pub use types::*;

/// Width of the coarse (seasonal) step, seconds.
const SEASON_STEP_S: f64 = 300.0;
const DAY_STEPS: usize = 288;
const WEEK_STEPS: usize = 2016;
/// Latest time (seconds) the planner accepts, ~31,700 years of Unix time: later ones are not
/// a clock's reading, and an interval count past them would overflow `i64`.
const MAX_T_S: f64 = 1e12;
/// Samples kept for the burst computation.
const FINE_CAP: usize = 256;
/// Pending forecasts (one per interval) awaiting their outcome.
const PENDING_CAP: usize = 512;
const MEMBERS: usize = 5;
/// Members are weighted by their pinball loss at this upper quantile: the planner covers
/// peaks, so a member that is late for a peak is penalised more than one that is early.
const ENSEMBLE_Q: f64 = 0.5;
/// Recent needs kept for the scale-in hold (at most W / I of them are used).
const NEED_CAP: usize = 2048;
const MEMBER_NAMES: [&str; MEMBERS] = ["last", "smoothing", "holt-winters", "naive-day", "naive-week"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Regime {
    /// No demand right now: what follows is a wake-up, tracked by the idle model.
    Idle,
    Generic,
    GridChange,
    GridSteady,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    t_made: f64,
    t_end: f64,
    f: [f64; MEMBERS],
    avail: [bool; MEMBERS],
    point: f64,
    regime: Regime,
    peak: f64,
    /// How far the current rate dipped below its level (ln, ≤ 0), the reversion shift (ln)
    /// applied to the quantile for this forecast (see [`Reversion`]), and the current rate.
    dip: f64,
    shift: f64,
    current: f64,
}

/// A backlog is drained over max(SLO, this share of W) once drain capacity is ready.
const DRAIN_W_SHARE: f64 = 0.1;
/// Off a grid, a backlog is drained over at least this many decision intervals. A drain sized
/// to finish sooner cannot be followed: by the next decision the ready fleet has served the
/// burst behind it, and the replicas ordered for it are released still warming, paid for
/// nothing (on the bursty Azure code log at W = 60 s, 569 of 888 starts).
const DRAIN_MIN_INTERVALS: f64 = 2.0;
/// Time constant of the slow mean rate behind the standing levels, seconds.
const LEVEL_TAU_S: f64 = 1800.0;
/// Time constant of the 1-minute mean arrival rate.
const RATE_1M_TAU_S: f64 = 60.0;

/// The ramp floor (`Planner::ramp_floor`): the rise is measured over this window (its second
/// half against its first), projected over this share of W + I (a full share overspent on
/// busy logs at W = 420 s), less this many standard deviations of the two halves' Poisson
/// counts (without it a low-rate log's noise reads as ramps; with one, at SLOs of 2 and 10 s
/// the low-rate logs still overspent by a hair in five more scenarios).
const RAMP_WINDOW_S: f64 = 120.0;
const RAMP_SHARE: f64 = 0.75;
const RAMP_NOISE_Z: f64 = 2.0;

/// The planner of one ScaledObject.
#[derive(Debug, Clone)]
pub struct Planner {
    cfg: PlannerConfig,
    w: f64,
    history: DemandHistory,
    idle: IdleTracker,
    grid: GridDetector,
    /// Recent samples `(t_end, dt, mass)` for the burst computation.
    fine: VecDeque<(f64, f64, f64)>,
    last_t: Option<f64>,
    last_backlog: f64,
    last_rate: f64,
    /// Index of the interval currently accumulating (`floor(t / I)` of its samples).
    cur_interval: Option<i64>,
    x_last: f64,
    last_arrival_interval_end: Option<f64>,
    // Members at interval resolution.
    smooth: Smoothing,
    slow: Smoothing,
    // Members at the seasonal step.
    hw: HoltWinters,
    sn_day: SeasonalNaive,
    sn_week: SeasonalNaive,
    cur_step: Option<i64>,
    step_peak: f64,
    /// Daily activity profile: P(any arrival in this 300-s slot of the day).
    activity: Vec<f32>,
    activity_days: Vec<u16>,
    /// Weekly activity profile: P(any arrival in this 300-s slot of the week).
    activity_week: Vec<f32>,
    activity_weeks: Vec<u8>,
    step_active: bool,
    ensemble: Ensemble,
    pending: VecDeque<Pending>,
    ratio_generic: RatioTracker,
    ratio_grid: RatioTracker,
    reversion: Reversion,
    /// The hourly echo of change-point steps (see [`Echo`]).
    echo: Echo,
    /// The same on the change just before (see [`Echo::momentum`]).
    momentum: Echo,
    /// Demand of the first interval after an idle gap, ln(replicas).
    wake_level: QuantileTracker,
    was_idle: bool,
    cached: Option<ForecastSummary>,
    cached_regime: Regime,
    /// The reversion shift of the cached forecast (ln; 0 off change points).
    cached_shift: f64,
    cached_members: ([f64; MEMBERS], [bool; MEMBERS]),
    intervals_seen: u64,
    recent_need: VecDeque<(f64, u32)>,
    /// The planner's own replicas still warming and when each is expected ready.
    own_orders: orders::OwnOrders,
    /// While the counterfactual is young (`cf_warm` false): each decision's need for the
    /// forecast alone (no backlog drain), over the last W, for the warming guard in `plan`.
    young_rate_need: VecDeque<(f64, u32)>,
    cf: Counterfactual,
    shadow: ReactiveShadow,
    /// What the planner's own fleet served late (see `outcome.rs`).
    outcome: outcome::Outcome,
    /// The rate rules (`RATE_RULES`) on the same arrivals, and the one standing in for the
    /// status quo (it beat KEDA + HPA on both axes), if any.
    rate_rules: Vec<ReactiveShadow>,
    rate_rule: Option<usize>,
    /// Following the status quo because the budget leaves no margin worth following.
    fallback: Option<Fallback>,
    /// Decayed replica-seconds the planner itself asked for, and what the counterfactual
    /// charged the candidates it followed for the same time (their ratio is the overhead of
    /// the hold, the drain and the bounds over the bare candidate).
    own_cost: f64,
    followed_cf_cost: f64,
    /// The planner's and the status quo's replica-seconds over a week's half-life
    /// (`SPEND_ACCOUNT_HALF_LIFE_S`): the long account behind the grid budget's floor.
    week_own_cost: f64,
    week_shadow_cost: f64,
    last_desired: u32,
    /// Share of the shadow's spend the candidates may use (integral feedback, ≤ 1).
    budget_gain: f64,
    /// Multiplier of the miss price (integral feedback on the attainment target, ≥ 1).
    price_gain: f64,
    cand_idx: Option<usize>,
    /// The reactive shadow's count is followed instead of a candidate margin (it beats them
    /// all on the two-day evidence; see `chosen_candidate`).
    follow_shadow: bool,
    /// A costlier candidate with fewer misses the followed one is mixed with, and its share:
    /// the candidates are a coarse grid, so the budget left between the best eligible one and
    /// the next better one is spent on a convex mix of their planned demands.
    blend: Option<(usize, f64)>,
    /// Slow mean arrival rate, time constant `LEVEL_TAU_S`.
    level: RateMean,
    /// Seconds observed: the age the slow means are corrected for.
    level_t: f64,
    /// Until when needs are held against a scale-in after requests were served late on a
    /// window grid (see `scale_in_hold`).
    late_until: f64,
    /// On a coarse grid, the backlog now draining built up while no replica was ready (a cold
    /// start): its needs are held while it lasts, and not for W after (see `scale_in_hold`).
    cold_start_drain: bool,
    /// Slower mean arrival rate, time constant `REVERSION_TAU_S`: the level a change point's
    /// dip is measured from.
    base: RateMean,
    /// Arrival rate smoothed over about a minute (read as it is, uncorrected for its start).
    rate_1m: RateMean,
    /// Fleet size at the first decision.
    first_n: Option<u32>,
    /// Decaying peaks of the per-interval effective demand (half-lives `PEAK_HALF_LIVES_S`).
    peak: [f64; 2],
}

/// A mean arrival rate (req/s): an exponentially weighted moving average over time with time
/// constant `tau_s`, started from 0.
#[derive(Debug, Clone, Copy)]
struct RateMean {
    tau_s: f64,
    value: f64,
}

impl RateMean {
    const fn new(tau_s: f64) -> Self {
        Self { tau_s, value: 0.0 }
    }

    /// Take in `dt` seconds at `rate`.
    fn observe(&mut self, dt: f64, rate: f64) {
        let g = 1.0 - (-dt / self.tau_s).exp();
        self.value += g * (rate - self.value);
    }

    /// The mean `elapsed_s` into its life, corrected for its start from 0 (divided by the
    /// weight its samples carry so far); 0 before any.
    fn debiased(&self, elapsed_s: f64) -> f64 {
        let c = 1.0 - (-elapsed_s / self.tau_s).exp();
        if c > 1e-9 {
            (self.value / c).max(0.0)
        } else {
            0.0
        }
    }
}

/// `ln((a + eps) / (b + eps))`: a log ratio of two rates that stays finite at zero (`eps` is a
/// twentieth of a replica's capacity wherever the planner takes one).
fn ln_ratio(a: f64, b: f64, eps: f64) -> f64 {
    ((a + eps) / (b + eps)).ln()
}

/// Member indices by forecast, largest first.
fn members_descending(f: &[f64; MEMBERS]) -> [usize; MEMBERS] {
    let mut order: [usize; MEMBERS] = std::array::from_fn(|m| m);
    order.sort_by(|x, y| f[*y].total_cmp(&f[*x]));
    order
}

/// Members disagreeing (e.g. a level model and a seasonal one before a recurring peak): read
/// the weights `w` as a mixture and take its upper `q` quantile over the available members
/// credible enough: the forecast of the first member, from the top of `order`, at which the
/// cumulative weight reaches max(1 − q, 0.1). None if no member reaches it.
fn mixture_upper(order: &[usize; MEMBERS], f: &[f64; MEMBERS], a: &[bool; MEMBERS], w: &[f64], q: f64) -> Option<f64> {
    let need_w = (1.0 - q).max(0.1);
    let mut acc = 0.0;
    for &m in order {
        if !a[m] || m >= w.len() {
            continue;
        }
        acc += w[m];
        if acc >= need_w {
            return Some(f[m]);
        }
    }
    None
}

fn finite_or(x: f64, d: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        d
    }
}

impl Planner {
    pub fn new(cfg: PlannerConfig) -> Result<Self, PlannerError> {
        if !(cfg.capacity.is_finite() && cfg.capacity > 0.0) {
            return Err(PlannerError::Capacity(cfg.capacity));
        }
        // A decision at most a day apart: the horizons built on it (W + I) must stay
        // walkable slot by slot.
        if !(1.0..=86400.0).contains(&cfg.interval_s) {
            return Err(PlannerError::Interval(cfg.interval_s));
        }
        if !(cfg.slo_s.is_finite() && cfg.slo_s >= 0.0) {
            return Err(PlannerError::Slo(cfg.slo_s));
        }
        if cfg.min_replicas > cfg.max_replicas {
            return Err(PlannerError::Bounds { min: cfg.min_replicas, max: cfg.max_replicas });
        }
        if !(cfg.quantile.is_finite() && cfg.quantile > 0.5 && cfg.quantile < 1.0) {
            return Err(PlannerError::Quantile(cfg.quantile));
        }
        let w = cfg.warmup.planned();
        if !w.is_finite() {
            return Err(PlannerError::Warmup(w));
        }
        Ok(Planner {
            w,
            history: DemandHistory::default(),
            idle: IdleTracker::default(),
            grid: GridDetector::default(),
            fine: VecDeque::with_capacity(FINE_CAP),
            last_t: None,
            last_backlog: 0.0,
            last_rate: 0.0,
            cur_interval: None,
            x_last: 0.0,
            last_arrival_interval_end: None,
            smooth: Smoothing::new(0.5, 0.05, 0.8),
            slow: Smoothing::new(0.02, 0.0, 1.0),
            hw: HoltWinters::new(DAY_STEPS, 0.2, 0.01, 0.3),
            sn_day: SeasonalNaive::new(DAY_STEPS),
            sn_week: SeasonalNaive::new(WEEK_STEPS),
            cur_step: None,
            step_peak: 0.0,
            activity: vec![0.0; DAY_STEPS],
            activity_days: vec![0; DAY_STEPS],
            activity_week: vec![0.0; WEEK_STEPS],
            activity_weeks: vec![0; WEEK_STEPS],
            step_active: false,
            // Losses remembered over ~6 h, so daily transitions (where level models fail and
            // seasonal ones shine) still count hours later.
            // Loss memory ≈ 1 day: a member that is right once a day (a daily peak) must still
            // be credited for it when the peak comes round again.
            ensemble: Ensemble::new(MEMBERS, (cfg.interval_s / 86_400.0).clamp(5e-5, 0.05), ENSEMBLE_Q),
            pending: VecDeque::with_capacity(PENDING_CAP),
            ratio_generic: RatioTracker::new(cfg.capacity, cfg.max_replicas),
            ratio_grid: RatioTracker::new(cfg.capacity, cfg.max_replicas),
            reversion: Reversion::default(),
            echo: Echo::default(),
            momentum: Echo::momentum(),
            wake_level: QuantileTracker::new(-5.0, 10.0, 150, 256.0),
            was_idle: true,
            cached: None,
            cached_regime: Regime::Generic,
            cached_shift: 0.0,
            cached_members: ([0.0; MEMBERS], [false; MEMBERS]),
            intervals_seen: 0,
            recent_need: VecDeque::new(),
            own_orders: orders::OwnOrders::default(),
            young_rate_need: VecDeque::new(),
            cf: Counterfactual::new(),
            shadow: ReactiveShadow::new(None),
            outcome: outcome::Outcome::default(),
            rate_rules: RATE_RULES.iter().map(|&r| ReactiveShadow::new(Some(r))).collect(),
            rate_rule: None,
            fallback: None,
            own_cost: 0.0,
            week_own_cost: 0.0,
            week_shadow_cost: 0.0,
            followed_cf_cost: 0.0,
            last_desired: 0,
            budget_gain: 1.0,
            price_gain: 1.0,
            cand_idx: None,
            follow_shadow: false,
            blend: None,
            level: RateMean::new(LEVEL_TAU_S),
            base: RateMean::new(REVERSION_TAU_S),
            level_t: 0.0,
            late_until: f64::NEG_INFINITY,
            cold_start_drain: false,
            rate_1m: RateMean::new(RATE_1M_TAU_S),
            first_n: None,
            peak: [0.0; 2],
            cfg,
        })
    }

    pub fn config(&self) -> &PlannerConfig {
        &self.cfg
    }

    /// The warm-up the planner plans with (seconds).
    pub fn warmup_planned(&self) -> f64 {
        self.w
    }

    /// Replace the warm-up (e.g. with a distribution measured from the cluster), keeping
    /// all history. Used by `serve` for `warmupSeconds: auto`.
    pub fn set_warmup(&mut self, warmup: WarmupDist) -> Result<(), PlannerError> {
        let w = warmup.planned();
        if !w.is_finite() {
            return Err(PlannerError::Warmup(w));
        }
        self.w = w;
        self.cfg.warmup = warmup;
        Ok(())
    }

    fn horizon(&self) -> f64 {
        self.w + self.cfg.interval_s
    }

    /// Names of the ensemble members, in weight order.
    pub fn member_names() -> [&'static str; MEMBERS] {
        MEMBER_NAMES
    }

    /// Record `arrivals` (mass in `(t - dt, t]`) and the backlog at `t`. Samples that are not
    /// after the previous one, or with non-finite time, are ignored; NaN/negative masses
    /// count as 0.
    pub fn observe(&mut self, t_s: f64, dt_s: f64, arrivals: f64, backlog: f64) {
        if !(0.0..=MAX_T_S).contains(&t_s) {
            return;
        }
        if let Some(l) = self.last_t {
            if t_s <= l {
                return;
            }
        }
        let mut dt = finite_or(dt_s, 0.0).max(0.0);
        if let Some(l) = self.last_t {
            dt = dt.min(t_s - l);
        }
        if dt <= 0.0 {
            dt = self.last_t.map(|l| t_s - l).unwrap_or(1.0).max(1e-3);
        }
        let mass = finite_or(arrivals, 0.0).clamp(0.0, 1e15);
        self.last_backlog = finite_or(backlog, 0.0).clamp(0.0, 1e15);
        // Close intervals the new sample no longer belongs to.
        self.close_intervals_before(t_s - dt);
        self.history.observe(t_s, dt, mass);
        self.idle.observe(t_s, dt, mass > 0.0);
        let mu = self.cfg.capacity;
        self.cf.observe(t_s - dt, dt, mass, self.w, mu, self.cfg.slo_s);
        let decay = (-dt * std::f64::consts::LN_2 / CF_HALF_LIFE_S).exp();
        let decay_s = self.cf.select_decay(dt);
        self.shadow.observe(t_s - dt, dt, mass, mu, self.cfg.slo_s, decay, decay_s);
        for r in self.rate_rules.iter_mut() {
            r.observe(t_s - dt, dt, mass, mu, self.cfg.slo_s, decay, decay_s);
        }
        self.outcome.observe(t_s, mass, self.last_backlog, self.cfg.slo_s, decay_s);
        if self.shadow.started {
            self.own_cost = self.own_cost * decay + self.last_desired as f64 * dt;
            let week = (-dt * std::f64::consts::LN_2 / SPEND_ACCOUNT_HALF_LIFE_S).exp();
            self.week_own_cost = self.week_own_cost * week + self.last_desired as f64 * dt;
            self.week_shadow_cost = self.week_shadow_cost * week + self.shadow.n() as f64 * dt;
            let mut followed =
                self.cand_idx.and_then(|i| self.cf.reps.get(i).copied()).unwrap_or(self.last_desired) as f64;
            if let Some((k, th)) = self.blend {
                followed += th * (self.cf.reps[k] as f64 - followed);
            }
            if self.follow_shadow {
                followed = self.status_quo().n() as f64;
            }
            self.followed_cf_cost = self.followed_cf_cost * decay + followed * dt;
        }
        let rate = mass / dt;
        self.level.observe(dt, rate);
        self.base.observe(dt, rate);
        self.rate_1m.observe(dt, rate);
        self.level_t += dt;
        let min_period = (4.0 * self.cfg.interval_s).max(60.0);
        // A change on the grid known before this sample feeds the hourly echo and the momentum.
        let period = self.grid.period();
        if self.grid.observe(t_s - dt, rate, min_period) {
            if let Some(period) = period {
                let (prev, eps) = (self.last_rate.max(0.0), 0.05 * mu);
                let z = ln_ratio(rate, prev, eps) * self.ratio_grid.spread_factor(prev);
                self.echo.record(t_s - dt, z, period);
                self.momentum.record(t_s - dt, z, period);
            }
        }
        self.last_rate = rate;
        if self.fine.len() == FINE_CAP {
            self.fine.pop_front();
        }
        self.fine.push_back((t_s, dt, mass));
        let k = self.interval_of(t_s);
        if self.cur_interval.is_none() {
            self.cur_interval = Some(k);
        }
        if mass > 0.0 {
            self.last_arrival_interval_end = Some(t_s);
        }
        self.last_t = Some(t_s);
    }

    fn interval_of(&self, t_end: f64) -> i64 {
        // A sample ending exactly on a boundary belongs to the interval before it.
        let x = t_end / self.cfg.interval_s;
        let c = x.ceil();
        (c as i64) - 1
    }

    /// Close every accumulating interval that ends at or before `t`.
    fn close_intervals_before(&mut self, t: f64) {
        let i = self.cfg.interval_s;
        while let Some(k) = self.cur_interval {
            let end = (k + 1) as f64 * i;
            if end > t + 1e-9 {
                break;
            }
            self.close_interval(k);
            self.cur_interval = Some(k + 1);
            // Long silences: jump ahead, feeding zeros in bulk at most a day's worth.
            if let Some(l) = self.last_t {
                let target = self.interval_of(t.max(l));
                if target > k + 1 + 2 * DAY_STEPS as i64 * 20 {
                    self.cur_interval = Some(target - DAY_STEPS as i64 * 20);
                }
            }
        }
    }

    /// Effective demand of the interval `[k I, (k+1) I)` from the fine samples.
    fn effective_demand(&self, k: i64) -> f64 {
        let i = self.cfg.interval_s;
        let t0 = k as f64 * i;
        let t1 = t0 + i;
        let slo = self.cfg.slo_s;
        // Mean rate over the interval.
        let mut mass = 0.0;
        let mut pts: [(f64, f64); 64] = [(0.0, 0.0); 64];
        let mut n = 0usize;
        for &(te, dt, m) in self.fine.iter().rev() {
            if te <= t0 - i {
                break;
            }
            let ts = te - dt;
            let ov = (te.min(t1) - ts.max(t0)).max(0.0);
            if dt > 0.0 {
                mass += m * ov / dt;
            }
            if te <= t1 + 1e-9 && n < 64 {
                pts[n] = (te, m);
                n += 1;
            }
        }
        let mean = mass / i;
        // Burst rate: max over windows ending in this interval of A / (len + slo).
        let mut burst: f64 = 0.0;
        // pts is newest first; windows [j..=e] with e ending inside the interval.
        for e in 0..n {
            if pts[e].0 <= t0 {
                break;
            }
            let mut a = 0.0;
            for j in e..n {
                a += pts[j].1;
                let start = if j + 1 < n { pts[j + 1].0 } else { pts[j].0 - 1.0 };
                let len = (pts[e].0 - start).max(1e-3);
                burst = burst.max(a / (len + slo));
            }
        }
        mean.max(burst)
    }

    fn close_interval(&mut self, k: i64) {
        let i = self.cfg.interval_s;
        let t_start = k as f64 * i;
        let t_end = t_start + i;
        let x = self.effective_demand(k);
        self.intervals_seen += 1;
        // Wake statistics: first active interval after an idle one.
        let active = x > 0.0;
        if active && self.was_idle {
            self.wake_level.record((x / self.cfg.capacity).max(1e-3).ln());
        }
        self.was_idle = !active;
        // Resolve pending forecasts.
        let scale = self.slow.level() + 0.05 * self.cfg.capacity;
        let eps = 0.05 * self.cfg.capacity;
        // One independent horizon's worth per W + I of decisions (see `RatioTracker`).
        let weight = (i / self.horizon()).min(1.0);
        while let Some(front) = self.pending.front().copied() {
            if front.t_end > t_end + 1e-9 {
                break;
            }
            self.pending.pop_front();
            let p = front;
            let y = p.peak.max(x);
            for m in 0..MEMBERS {
                if p.avail[m] {
                    self.ensemble.score(m, y, p.f[m], scale);
                }
            }
            let r = ln_ratio(y, p.point, eps);
            match p.regime {
                Regime::Generic => self.ratio_generic.record(r, weight, p.point, i),
                Regime::GridChange => {
                    let s = self.ratio_grid.spread_factor(p.point);
                    // The step itself, not the horizon's peak (which the current window censors).
                    let step = ln_ratio(x, p.current, eps);
                    self.reversion.record(p.dip, step, s, weight);
                    self.ratio_grid.record(r - p.shift, weight, p.point, i);
                }
                Regime::GridSteady | Regime::Idle => {}
            }
        }
        for p in self.pending.iter_mut() {
            if t_start >= p.t_made - 1e-9 {
                p.peak = p.peak.max(x);
            }
        }
        self.x_last = x;
        for (p, hl) in self.peak.iter_mut().zip(PEAK_HALF_LIVES_S) {
            *p = (*p * (-i * std::f64::consts::LN_2 / hl).exp()).max(x);
        }
        self.smooth.update(x);
        self.slow.update(x);
        // Seasonal step.
        let step = (t_start / SEASON_STEP_S).floor() as i64;
        match self.cur_step {
            None => {
                self.cur_step = Some(step);
                self.step_peak = x;
                self.step_active = active;
            }
            Some(s) if step > s => {
                self.feed_step(s, self.step_peak, self.step_active);
                // Fill skipped steps (no samples) with zeros, at most a week.
                let gap = (step - s - 1).min(WEEK_STEPS as i64);
                for j in 0..gap {
                    self.feed_step(step - gap + j, 0.0, false);
                }
                self.cur_step = Some(step);
                self.step_peak = x;
                self.step_active = active;
            }
            _ => {
                self.step_peak = self.step_peak.max(x);
                self.step_active |= active;
            }
        }
        // New forecast from t_end.
        self.forecast_from(t_end);
        self.feed_counterfactuals(t_end);
    }

    /// Place the candidates' and the reactive shadow's orders for the decision at `t` (one
    /// per interval, whether or not `plan` is asked then).
    fn feed_counterfactuals(&mut self, t: f64) {
        let Some(fc) = self.cached.clone() else {
            return;
        };
        let mu = self.cfg.capacity;
        let n0 = self.first_n.unwrap_or(0);
        let snap = self.order_snap(t, &fc);
        let spacing = (self.w / (CF_ORDERS_CAP as f64 - 32.0)).max(self.cfg.interval_s);
        let max_r = self.cfg.max_replicas;
        self.cf.push(&snap, spacing, self.w, mu, self.cfg.slo_s, 0.05 * mu, max_r as f64, n0);
        self.shadow_decide(t);
    }

    /// The reactive shadow's decision at `t`, on what the planner has seen before `t`.
    fn shadow_decide(&mut self, t: f64) {
        let n0 = self.first_n.unwrap_or(0);
        let rate60 = self.history.mass_between(t - 60.0, t) / 60.0;
        let active_recent = self.last_arrival_interval_end.map(|l| t - l < self.cfg.interval_s + 1e-9).unwrap_or(false);
        let (mu, slo, max_r) = (self.cfg.capacity, self.cfg.slo_s, self.cfg.max_replicas);
        self.shadow.decide(t, n0, rate60, active_recent, mu, slo, self.w, max_r);
        // Rules share windows (five of the six read the 2-minute mean, both trend rules its
        // rise): each window's mean, and its rise once a trend rule asks, is summed from the
        // history once per decision.
        let mut sums: [(f64, f64, Option<f64>); RATE_RULES.len()] = [(f64::NAN, 0.0, None); RATE_RULES.len()];
        for k in 0..self.rate_rules.len() {
            let (window, trend) = self.rate_rules[k].rule.map_or((60.0, 0.0), |r| (r.window_s, r.trend));
            let j = sums.iter().position(|s| s.0 == window).unwrap_or_else(|| {
                sums[k] = (window, self.history.mass_between(t - window, t) / window, None);
                k
            });
            let mut rate = sums[j].1;
            if trend > 0.0 {
                let slope = *sums[j].2.get_or_insert_with(|| self.rise_slope(t, window, 0.0));
                rate += slope * trend * self.horizon();
            }
            self.rate_rules[k].decide(t, n0, rate, active_recent, mu, slo, self.w, max_r);
        }
    }

    /// The rise of the rate over `window` at `t` (req/s per second): the window's second half
    /// against its first, from their midpoints half a window apart, less `z` standard
    /// deviations of the difference of the two halves' Poisson counts; never negative (a fall
    /// is the scale-down hold's).
    fn rise_slope(&self, t: f64, window: f64, z: f64) -> f64 {
        let half = 0.5 * window;
        let (late, early) = (self.history.mass_between(t - half, t), self.history.mass_between(t - window, t - half));
        let rise = (late - early - z * (late + early).max(0.0).sqrt()) / half;
        (rise / half).max(0.0)
    }

    /// That rise projected over `trend` × (W + I): what a trend rule adds to its window's mean.
    fn projected_rise(&self, t: f64, window: f64, trend: f64, z: f64) -> f64 {
        self.rise_slope(t, window, z) * trend * self.horizon()
    }

    /// The ramp floor every margin keeps off a grid: the last half window's mean rate (the
    /// rate half of it ago) carried forward by the rise that stands above the counts' noise,
    /// over that half and `RAMP_SHARE` of W + I.
    fn ramp_floor(&self, t: f64) -> f64 {
        let half = 0.5 * RAMP_WINDOW_S;
        let recent = self.history.mass_between(t - half, t) / half;
        let over = (0.5 * half + RAMP_SHARE * self.horizon()) / (RAMP_SHARE * self.horizon());
        recent + over * self.projected_rise(t, RAMP_WINDOW_S, RAMP_SHARE, RAMP_NOISE_Z)
    }

    fn feed_step(&mut self, step: i64, peak: f64, active: bool) {
        self.hw.update(peak);
        self.sn_day.update(peak);
        self.sn_week.update(peak);
        let slot = step.rem_euclid(DAY_STEPS as i64) as usize;
        let d = self.activity_days[slot];
        let a = if active { 1.0 } else { 0.0 };
        // Average over the first days, then exponential forgetting (weight 1/3).
        let g = 1.0 / ((d as f32) + 1.0).min(3.0);
        self.activity[slot] = (1.0 - g) * self.activity[slot] + g * a;
        self.activity_days[slot] = d.saturating_add(1);
        // Weekly: the same from the first week on (weight 1/2 after that).
        let slot = step.rem_euclid(WEEK_STEPS as i64) as usize;
        let k = self.activity_weeks[slot];
        let g = 1.0 / ((k as f32) + 1.0).min(2.0);
        self.activity_week[slot] = (1.0 - g) * self.activity_week[slot] + g * a;
        self.activity_weeks[slot] = k.saturating_add(1);
    }

    /// Member forecasts of the peak of `x` over `[t, t + H]`.
    fn member_forecasts(&self, t: f64) -> ([f64; MEMBERS], [bool; MEMBERS]) {
        let h = self.horizon();
        let i = self.cfg.interval_s;
        let steps = (h / i).ceil().max(1.0);
        let mut f = [0.0; MEMBERS];
        let mut a = [false; MEMBERS];
        f[0] = self.x_last;
        a[0] = true;
        // Peak of the smoothing path over the horizon.
        let s_end = self.smooth.forecast(steps);
        f[1] = self.smooth.forecast(1.0).max(s_end);
        a[1] = self.smooth.seen() > 0;
        // Seasonal members: steps after the last fed step covering [t, t + H].
        if let Some(cur) = self.cur_step {
            let last_fed = cur - 1;
            let s0 = (t / SEASON_STEP_S).floor() as i64;
            let s1 = ((t + h) / SEASON_STEP_S).floor() as i64;
            let mut hwp: f64 = 0.0;
            let mut dp: f64 = 0.0;
            let mut wp: f64 = 0.0;
            let mut s = s0.max(last_fed + 1);
            while s <= s1 {
                let ahead = (s - last_fed).max(1) as u64;
                hwp = hwp.max(self.hw.forecast(ahead));
                dp = dp.max(self.sn_day.forecast(ahead).unwrap_or(0.0));
                wp = wp.max(self.sn_week.forecast(ahead).unwrap_or(0.0));
                s += 1;
            }
            f[2] = hwp;
            a[2] = self.hw.ready();
            f[3] = dp;
            a[3] = self.sn_day.ready();
            f[4] = wp;
            a[4] = self.sn_week.ready();
        }
        match self.cfg.model {
            ForecastModel::Auto => {}
            ForecastModel::Smoothing => {
                a = [false, true, false, false, false];
            }
            ForecastModel::HoltWinters => {
                a = [false, false, self.hw.ready(), false, false];
            }
            ForecastModel::SeasonalNaive => {
                a = [false, false, false, self.sn_day.ready(), self.sn_week.ready()];
            }
        }
        if !a.iter().any(|x| *x) {
            a[0] = true;
        }
        (f, a)
    }

    fn forecast_from(&mut self, t: f64) {
        let (f, a) = self.member_forecasts(t);
        let w = self.ensemble.weights(&a);
        let mut point = 0.0;
        for m in 0..MEMBERS {
            point += w[m] * f[m];
        }
        let h = self.horizon();
        let next_change = self.grid.next_change(self.last_t.unwrap_or(t).min(t));
        // The next change point matters to this decision only if it is the last one whose
        // order is ready by then: an order placed now is ready at t + W, one placed at the next
        // decision at t + I + W, so the change at b is this decision's iff b < t + I + W.
        // Earlier decisions leave it to a later one (ordering sooner only pays for replicas
        // that sit ready before the change). A wake from zero keeps one interval of slack
        // (b ≤ t + I + W): with a fleet in place a late decision (serve's ticks are not on
        // the interval grid) costs seconds of a margin; from zero every late second is missed.
        let slack = if self.last_rate > 0.0 { -1e-9 } else { 1e-9 };
        let mut regime = match next_change {
            Some(b) if b < t + h + slack => Regime::GridChange,
            Some(_) => Regime::GridSteady,
            None => Regime::Generic,
        };
        // In grid mode the current rate holds until the change point.
        let current = if regime == Regime::Generic { self.x_last } else { self.last_rate.max(0.0) };
        if current <= 0.0 && regime != Regime::GridSteady {
            regime = Regime::Idle;
        }
        let q = self.cfg.quantile;
        let eps = 0.05 * self.cfg.capacity;
        let tracker = self.tracker(regime);
        let (dip, shift) = if regime == Regime::GridChange {
            let d = self.dip(current, eps);
            let echo = match (next_change, self.grid.period()) {
                (Some(b), Some(period)) => {
                    let sf = self.ratio_grid.spread_factor(point);
                    self.echo.shift(b, period, sf) + self.momentum.shift(b, period, sf)
                }
                _ => 0.0,
            };
            (d, self.reversion.beta() * d + echo)
        } else {
            (0.0, 0.0)
        };
        let mut upper = match regime {
            Regime::GridSteady => current,
            Regime::Idle => point.max(0.0),
            _ => {
                let lr = if tracker.calibrated() {
                    tracker.quantile(q, point).unwrap_or(0.7) + shift
                } else {
                    // Not calibrated yet: a generous margin.
                    0.7
                };
                ((point + eps) * lr.exp() - eps).max(0.0).max(current)
            }
        };
        if regime != Regime::GridSteady {
            if let Some(v) = mixture_upper(&members_descending(&f), &f, &a, &w, q) {
                upper = upper.max(v);
            }
        }
        if self.pending.len() == PENDING_CAP {
            self.pending.pop_front();
        }
        self.pending.push_back(Pending {
            t_made: t,
            t_end: t + h,
            f,
            avail: a,
            point,
            regime,
            peak: 0.0,
            dip,
            shift,
            current,
        });
        self.cached_shift = shift;
        self.cached_regime = regime;
        self.cached_members = (f, a);
        self.cached = Some(ForecastSummary {
            horizon_s: h,
            current,
            point,
            upper,
            quantile: q,
            weights: w,
            next_change_s: next_change.map(|b| b - t),
        });
    }

    /// P(an arrival within `[t, t + H]`) from the idle histogram, the daily and weekly
    /// activity profiles and, for gridded signals, the next change point.
    fn p_arrival(&self, t: f64) -> f64 {
        let h = self.horizon();
        let tau = self.idle.idle_for(t);
        let mut p = self.idle.hist.p_end_within(tau, h, 0.5);
        // Daily profile over the slots the horizon touches (a horizon longer than a week
        // visits every weekly slot once).
        let s0 = (t / SEASON_STEP_S).floor() as i64;
        let s1 = ((t + h) / SEASON_STEP_S).floor().min(s0 as f64 + WEEK_STEPS as f64 - 1.0) as i64;
        let mut ps: f64 = 0.0;
        let mut s = s0;
        while s <= s1 {
            let slot = s.rem_euclid(DAY_STEPS as i64) as usize;
            if self.activity_days[slot] >= 2 {
                ps = ps.max(self.activity[slot] as f64);
            }
            // Weekly profile (a client active on weekdays, a weekly batch job).
            let ws = s.rem_euclid(WEEK_STEPS as i64) as usize;
            if self.activity_weeks[ws] >= 1 {
                ps = ps.max(self.activity_week[ws] as f64);
            }
            s += 1;
        }
        p = p.max(ps);
        if let Some(b) = self.grid.next_change(self.last_t.unwrap_or(t).min(t)) {
            if b > t + h + 1e-9 {
                // Nothing changes before the horizon ends: still idle.
                p = 0.0;
            }
        }
        p.clamp(0.0, 1.0)
    }

    /// The error calibration a forecast in `regime` reads its margin from: change points on a
    /// grid have their own (a window's step), everything else the generic one.
    fn tracker(&self, regime: Regime) -> &RatioTracker {
        match regime {
            Regime::GridChange => &self.ratio_grid,
            _ => &self.ratio_generic,
        }
    }

    /// How far `current` dips below the hour's mean rate: `min(0, ln(current / level))`,
    /// bounded by `DIP_LIMIT` (see [`Reversion`]).
    fn dip(&self, current: f64, eps: f64) -> f64 {
        let base = self.base.debiased(self.level_t);
        let d = ln_ratio(current, base, eps);
        if d.is_finite() {
            d.clamp(-DIP_LIMIT, 0.0)
        } else {
            0.0
        }
    }

    /// Slow mean arrival rate (bias-corrected EWMA).
    fn slow_level(&self) -> f64 {
        self.level.debiased(self.level_t)
    }

    /// Everything a candidate margin needs to turn the current forecast into an order.
    fn order_snap(&self, t: f64, fc: &ForecastSummary) -> OrderSnap {
        let regime = self.cached_regime;
        let tracker = self.tracker(regime);
        let calibrated = tracker.calibrated();
        let (f, a) = self.cached_members;
        let w = &fc.weights;
        let order = members_descending(&f);
        let mut lr = [0.7; CF_QS.len()];
        let mut mix = [0.0; CF_QS.len()];
        if calibrated {
            if let Some(v) = tracker.candidate_quantiles(fc.point) {
                lr = v.map(|l| l + self.cached_shift);
            }
        }
        for (k, &q) in CF_QS.iter().enumerate() {
            mix[k] = mixture_upper(&order, &f, &a, w, q).unwrap_or(0.0);
        }
        let mu = self.cfg.capacity;
        let wake_at = |q: f64| {
            self.wake_level.quantile(q).map(|l| self.replicas_for(l.exp() * mu).max(1) as f64 * mu).unwrap_or(mu)
        };
        OrderSnap {
            t,
            regime,
            current: fc.current,
            point: fc.point,
            lr,
            mix,
            p_arrival: self.p_arrival(t),
            wake_rate: wake_at(0.9),
            wake_rate_lo: wake_at(0.5),
            level: self.slow_level(),
            rate: self.shortfall_rate(),
            peak: self.peak,
            drain_s: self.drain_horizon(),
            ramp: if !self.coarse_grid() { self.ramp_floor(t) } else { 0.0 },
            on_grid: self.grid.period().is_some(),
            rate_cold: self.cold_rate(t),
            window_start: self.fine_window_start(t),
        }
    }

    /// Seconds the planner and every candidate drain a projected backlog over (see
    /// [`DRAIN_MIN_INTERVALS`]; on a grid the rate is known and the SLO's pace holds).
    fn drain_horizon(&self) -> f64 {
        let floor = if self.grid.period().is_some() { 0.0 } else { DRAIN_MIN_INTERVALS * self.cfg.interval_s };
        drain_seconds(self.cfg.slo_s, self.w, floor)
    }

    /// The arrival rate a backlog is projected with: on a grid the current window's rate is
    /// known exactly and holds until the change point (the 1-minute mean lags a step by a
    /// minute); otherwise the 1-minute mean.
    fn shortfall_rate(&self) -> f64 {
        if self.grid.period().is_some() && self.cached_regime != Regime::Generic {
            self.last_rate.max(0.0)
        } else {
            self.rate_1m.value
        }
    }

    /// The arrival rate a backlog is projected with at `t` while no replica is ready (see
    /// `counterfactual::projection_rate`): off a grid, the higher of the 1-minute mean and the
    /// last decision interval's mean; on a grid the window's rate already is the current one.
    fn cold_rate(&self, t: f64) -> f64 {
        let rate = self.shortfall_rate();
        if self.grid.period().is_some() {
            return rate;
        }
        let i = self.cfg.interval_s;
        rate.max(self.history.mass_between(t - i, t) / i)
    }

    /// A window grid whose windows last at least the warm-up: the rate until the next change
    /// is known, and the order for a window, placed within W + I of its change point, is
    /// placed no earlier than the previous change point, so one window's step is all it
    /// forecasts. On a finer grid an order spans several steps and the horizon is as unknown
    /// as off a grid (a ramp of 1-minute windows at W = 180 s). Windows exactly W long are
    /// coarse (before session 37 the bound was W + I: at W = 600 s the 10-minute ServeGen
    /// windows then counted as fine, the spent budget's margin choice cancelled warming
    /// orders within minutes of placing them, and the 14-day trace fell to 93.8 % against
    /// KEDA + HPA's 95.4 %; coarse, 98.1 % for 4 % fewer GPU-hours than the HPA).
    fn coarse_grid(&self) -> bool {
        self.grid.period().is_some_and(|p| p >= self.w)
    }

    /// Seconds a need is held against a scale-in at `t` (the ski-rental hold; see `plan`).
    ///
    /// On a grid the hold also follows a late episode, for W after the last decision that saw
    /// requests served late, on a coarse grid and under a standing level too: a miss there
    /// means the margin in force fell short of a step, and the replicas ordered to catch up,
    /// released as soon as the backlog is gone, are W away when the next step comes (on
    /// bursty clients at W = 420 s the planner shed a caught-up fleet minutes before the next
    /// window stepped up again, where KEDA + HPA's five-minute stabilization kept it; see
    /// ARCHITECTURE.md, session 21). It holds even once the budget is spent: a spent budget
    /// is what leaves a bursty client on a margin that misses its steps, and shedding the
    /// catch-up fleet then repeats the miss at the next step (ARCHITECTURE.md, session 22).
    /// Off a grid the hold is unchanged: on bursty request logs holding a standing level's
    /// needs after each late burst spent the budget that cheaper margins then missed with.
    ///
    /// A cold start's backlog on a coarse grid (one that built up while no replica was ready)
    /// holds the needs while it drains, not for W after: no margin fell short there, the
    /// fleet ordered for it is the drain of everything queued over a warm-up (often the
    /// `maxReplicas` bound), and the next window's step is the forecast's to order. Held for
    /// W, that fleet was most of a sparse client's spend, and the budget, divided by the
    /// overhead over the candidate followed, left the margins too thin for the next steps
    /// (ARCHITECTURE.md, session 40).
    ///
    /// On a coarse grid every need placed within W + I of the next change point (an order for
    /// the next window) is also held until that change point, whatever the budget and the
    /// margin chosen since: between change points the current window's rate is known and
    /// constant, so nothing is learnt about the next window, and a smaller need there is the
    /// margin choice changing its mind, not news. Without it a spent budget's choice flapping
    /// between affordable margins cancelled the replicas warming for the next step a minute
    /// before it came (a held-out ServeGen client at W = 420 s, ARCHITECTURE.md, session 25).
    /// On a grid finer than W every need placed since the current window began is held until
    /// the next change point, for the same reason (see `fine_window_start`).
    fn scale_in_hold(&self, cand: Cand, t: f64) -> f64 {
        let hold = if self.grid.period().is_some() && (t < self.late_until || self.cold_start_drain) {
            self.w
        } else if self.spent() || self.coarse_grid() || cand.level > 0 {
            0.0
        } else {
            self.w
        };
        match self.grid.next_change(t) {
            Some(next) if self.coarse_grid() && t >= next - self.horizon() => hold.max(t - (next - self.horizon())),
            _ => match self.fine_window_start(t) {
                Some(start) => hold.max(t - start),
                None => hold,
            },
        }
    }

    /// On a grid finer than W (an order spans several steps), the start of the window `t` is
    /// in: between change points the current rate is known and nothing is learnt about the
    /// windows ahead, so a smaller need than one placed since the window began is the margin
    /// choice changing its mind, not news. Every need is held until the next change point,
    /// whatever the margin and the budget, and each counterfactual candidate's fleet is held
    /// alike (`Counterfactual::push`), so the budget prices the hold. Without it, at W = 900 s
    /// on 10-minute windows a spent budget's choice ordered and cancelled warming replicas
    /// within minutes, and the 14-day trace got 89.8 % for 4 % more GPU-hours than KEDA + HPA's
    /// 91.2 % (96.5 % for 5 % fewer with it; ARCHITECTURE.md, session 37).
    fn fine_window_start(&self, t: f64) -> Option<f64> {
        if self.coarse_grid() {
            return None;
        }
        let period = self.grid.period()?;
        let next = self.grid.next_change(self.last_t.unwrap_or(t).min(t))?;
        Some(next - period)
    }

    fn replicas_for(&self, rate: f64) -> u32 {
        let r = (rate / self.cfg.capacity - 1e-9).ceil();
        if r.is_finite() {
            r.clamp(0.0, u32::MAX as f64) as u32
        } else {
            u32::MAX
        }
    }

    /// Decide the desired replica count at `t` given the current fleet.
    pub fn plan(&mut self, t_s: f64, ready: u32, warming: u32) -> Decision {
        // A time that is no clock's reading (not finite, negative, past `MAX_T_S`) is read as
        // the last one observed, as `observe` ignores such a sample.
        let t = if (0.0..=MAX_T_S).contains(&t_s) { t_s } else { self.last_t.unwrap_or(0.0) };
        let n = ready.saturating_add(warming);
        self.first_n.get_or_insert(n);
        self.own_orders.reconcile(t, warming, self.w);
        if self.last_t.map(|l| t >= l).unwrap_or(true) {
            self.close_intervals_before(t);
        }
        if !self.shadow.started {
            // The reactive shadow decides from the planner's first decision on, as the
            // reference policy does (REPLAY.md: at s = 0 with no history, a fleet that has
            // seen no arrival is released); starting it one interval later would hand it the
            // fleet the planner was given, and a budget that path never had.
            self.shadow_decide(t);
        }
        if self.cached.is_none() {
            self.forecast_from(t);
        }
        let mut fc = self.cached.clone().unwrap_or(ForecastSummary {
            horizon_s: self.horizon(),
            current: 0.0,
            point: 0.0,
            upper: 0.0,
            quantile: self.cfg.quantile,
            weights: vec![0.0; MEMBERS],
            next_change_s: None,
        });
        let mu = self.cfg.capacity;
        let snap = self.order_snap(t, &fc);
        let cand = self.chosen_candidate();
        fc.upper = cand_upper(&snap, cand, 0.05 * mu);
        if let Some((k, th)) = self.blend {
            if self.cf_warm() {
                let uk = cand_upper(&snap, Cand::from_index(k), 0.05 * mu);
                fc.upper += th * (uk - fc.upper);
            }
        }
        fc.upper = fc.upper.max(in_use(&snap, ready, mu));
        fc.quantile = CF_QS[cand.q];
        let b = self.last_backlog;
        // Backlog drain: replicas started now help only after W, so the backlog to drain is
        // the one there will be then: today's plus what the ready fleet falls short of the
        // arrival rate over W (on a grid, the window's own rate: a step is ordered for at
        // once; with no replica ready, off a grid, at least the last interval's mean rate, see
        // `projection_rate`); it is drained over `drain_horizon` (max(SLO, W/10), off a grid at
        // least two decision intervals) once the replicas are ready.
        // On a grid finer than W the replicas already warming count from their ready seconds
        // (`OwnOrders`): there an order spans more than a window, a step's drain ordered
        // at every decision until the first order is ready piled up replicas that arrived
        // with no backlog left, and at W = 720 s on 10-minute windows that spend (48 replicas,
        // 720 s each, per missed step) took the budget and left the margin too thin for the
        // next step (the 14-day trace 89.3 % for 4,260 GPU-hours against KEDA + HPA's 93.1 %
        // for 4,177; with it 96.2 % for 4,045; ARCHITECTURE.md, session 38). Elsewhere, and
        // in the candidates' replay, the over-order is margin the next window used (counted
        // there too it cost the scored warm-ups; see the same entry).
        let steps = snap.window_start.is_some().then(|| self.own_orders.ready_steps(t, ready)).into_iter().flatten();
        let drain = backlog_at_ready(b, projection_rate(&snap, ready), mu, ready, self.w, steps) / snap.drain_s;
        let recent_arrival =
            self.last_arrival_interval_end.map(|l| t - l < self.cfg.interval_s + 1e-9).unwrap_or(false);
        let busy_floor = if b > 0.0 || recent_arrival { 1 } else { 0 };

        let (mut desired, mut reason);
        if self.intervals_seen < 4 {
            let d = fc.current.max(fc.point) * 1.5 + drain;
            // Never shed the fleet before there is data to judge it by.
            desired = self.replicas_for(d).max(n);
            reason = Reason::Learning { demand: fc.current };
            // The fleet we were handed is, for all we know, needed: it enters the scale-in
            // hold like any other need (released only after W without a larger one).
            if self.recent_need.len() < NEED_CAP {
                self.recent_need.push_back((t, desired));
            }
        } else {
            let need_fc = self.replicas_for(fc.upper);
            let raw = self.replicas_for(fc.upper + drain);
            // Ski-rental break-even: a replica released now and needed again within W costs
            // more than keeping it, so without exact knowledge of the future (no grid, or one
            // finer than W) hold the largest need of the last W seconds. Between the change
            // points of a coarse grid the future is known and no hold is needed; a standing
            // level is its own hold. Nor is there a hold once the budget is spent: the hold is
            // not in the candidates' counterfactual cost (a small fleet at W = 420 pays ~10 %
            // for it), and from here on the planner may spend only what the candidate it
            // follows spends. But on any grid, after requests were served late (the backlog is
            // more than the ready fleet clears within the SLO), the needs of the next W are
            // held whatever the margin and the budget (see `scale_in_hold`).
            // A backlog that builds up while no replica is ready is a cold start's, on a
            // coarse grid, until it is gone: the late hold does not outlast its drain there.
            self.cold_start_drain = self.coarse_grid() && b > 0.0 && (ready == 0 || self.cold_start_drain);
            if served_late(b, ready, mu, self.cfg.slo_s) && !self.cold_start_drain {
                self.late_until = t + self.w;
            }
            let hold_s = self.scale_in_hold(cand, t);
            while let Some(&(tf, _)) = self.recent_need.front() {
                if tf < t - hold_s - 1e-9 || self.recent_need.len() >= NEED_CAP {
                    self.recent_need.pop_front();
                } else {
                    break;
                }
            }
            self.recent_need.push_back((t, raw));
            if !self.cf_warm() {
                while self.young_rate_need.front().is_some_and(|x| x.0 < t - self.w - 1e-9) {
                    self.young_rate_need.pop_front();
                }
                if self.young_rate_need.len() < NEED_CAP {
                    self.young_rate_need.push_back((t, need_fc));
                }
            } else {
                self.young_rate_need.clear();
            }
            let need = self.recent_need.iter().map(|x| x.1).max().unwrap_or(raw);
            desired = need;
            reason = if need > need_fc && need > n {
                Reason::DrainBacklog { backlog: b }
            } else if need > n {
                Reason::PreScale {
                    peak: fc.upper,
                    at_s: fc.next_change_s.unwrap_or(fc.horizon_s).min(fc.horizon_s),
                    margin: cand_margin(&snap, cand),
                }
            } else if need < n {
                Reason::ScaleIn { peak: fc.upper }
            } else if need > raw && need >= n {
                Reason::Hold
            } else {
                Reason::Steady
            };
            // Idle: decide zero / keep-alive / wake (the wake threshold is the candidate's).
            if busy_floor == 0 && (need <= 1 || snap.regime == Regime::Idle) {
                let p = snap.p_arrival;
                let tau = self.idle.idle_for(t);
                let exp_idle = self.idle.hist.expected_remaining(tau).unwrap_or(f64::INFINITY);
                if p >= cand.wake_p() && need >= 1 {
                    desired = need;
                    reason = if n == 0 {
                        Reason::Wake { in_s: fc.next_change_s.unwrap_or(self.w).min(fc.horizon_s), p_arrival: p }
                    } else {
                        Reason::KeepAlive { p_arrival: p, expected_idle_s: exp_idle.min(1e9) }
                    };
                } else if n > 0 && exp_idle <= self.w && p >= 0.1 {
                    // Ski-rental: the idle spell is expected to end before a restart would
                    // pay off.
                    desired = need.max(1);
                    reason = Reason::KeepAlive { p_arrival: p, expected_idle_s: exp_idle };
                } else {
                    desired = need;
                    if need == 0 {
                        let threshold = cand.wake_p();
                        let why = if !threshold.is_finite() {
                            ZeroWhy::NeverWakes
                        } else if p < threshold {
                            ZeroWhy::UnderWake { threshold }
                        } else {
                            ZeroWhy::NoNeed
                        };
                        reason = Reason::ToZero { p_arrival: p, expected_idle_s: exp_idle.min(1e9), why: Some(why) };
                    }
                }
            }
        }
        if n == 0 && desired > 0 && busy_floor == 0 && !matches!(reason, Reason::Learning { .. }) {
            reason = Reason::Wake {
                in_s: fc.next_change_s.unwrap_or(self.w).min(fc.horizon_s),
                p_arrival: self.p_arrival(t),
            };
        }
        if self.follow_shadow {
            desired = self.status_quo().n();
            let rule = self.rate_rule.map(|k| RATE_RULES[k]);
            reason = Reason::StatusQuo { replicas: desired, rule, fallback: self.fallback };
        }
        desired = desired.max(busy_floor);
        // Warming guard, while the counterfactual is young: the margin in force then (a
        // standing peak, with no scale-in hold) sheds a replica as soon as its decaying peak
        // slips under a replica's worth, and that cancels the newest replica still warming,
        // to be re-ordered at the next uptick with its warm-up restarted (on Azure's
        // conversation log with its first 10 minutes dropped, at W = 420 s, a replica was
        // cancelled 270 s into its warm-up and re-ordered 30 s later). So a scale-in that
        // would cancel warming replicas keeps what the forecast alone asked for within the
        // last W. Only the forecast's need: a drain order is meant to be cancelled once the
        // ready fleet has served the burst it was for (holding those cost 3 pp on a bursty
        // code log).
        if !self.cf_warm() && warming > 0 && desired < n {
            let held = self.young_rate_need.iter().map(|x| x.1).max().unwrap_or(0).min(n);
            if held > desired {
                desired = held;
                reason = Reason::Hold;
            }
        }
        // Until the counterfactual has evidence, the fleet we were handed is kept: shedding it
        // on no data is a bet the planner cannot yet price.
        let first_n = self.first_n.unwrap_or(n);
        if !self.cf_warm() {
            desired = desired.max(first_n);
        }
        if !self.cfg.scale_to_zero {
            desired = desired.max(1);
        }
        if desired > self.cfg.max_replicas {
            desired = self.cfg.max_replicas;
            reason = Reason::Bound { limit: self.cfg.max_replicas };
        } else if desired < self.cfg.min_replicas && !(self.cfg.scale_to_zero && desired == 0) {
            desired = self.cfg.min_replicas;
            reason = Reason::Bound { limit: self.cfg.min_replicas };
        }
        if desired > n {
            self.own_orders.push(t + self.w, desired - n);
        }
        self.last_desired = desired;
        Decision { desired, reason, forecast: fc }
    }

    /// The margin the last decision followed, as `/debug` names it (`BudgetStats::margin`):
    /// a candidate with its wake rule, or the status quo and why. Cheaper than `snapshot`.
    pub fn followed_margin(&self) -> Option<String> {
        self.budget_stats().margin
    }

    /// Serializable state for a debug page.
    pub fn snapshot(&self) -> Snapshot {
        let t = self.last_t;
        let tt = t.unwrap_or(0.0);
        let tau = self.idle.idle_for(tt);
        let tr = if self.grid.period().is_some() { &self.ratio_grid } else { &self.ratio_generic };
        let rq = |q: f64| tr.quantile(q, self.cached.as_ref().map(|c| c.point).unwrap_or(0.0)).map(f64::exp);
        Snapshot {
            t_s: t,
            warmup_planned_s: self.w,
            recent: self.history.points(0, 120),
            hourly: self.history.points(2, 288),
            members: MEMBER_NAMES.iter().map(|s| s.to_string()).collect(),
            last_forecast: self.cached.clone(),
            ratio_quantiles: [rq(0.5), rq(0.9), rq(0.99)],
            error_spread_scale: tr.vol_scale(),
            dip_reversion_slope: self.reversion.beta(),
            hourly_echo_slope: self.echo.gamma(),
            step_momentum_slope: self.momentum.gamma(),
            grid_period_s: self.grid.period(),
            idle: IdleStats {
                idle_for_s: tau,
                gaps_seen: self.idle.hist.count(),
                p05_s: self.idle.hist.percentile(0.05),
                p50_s: self.idle.hist.percentile(0.5),
                p99_s: self.idle.hist.percentile(0.99),
                p_arrival_within_w: self.p_arrival(tt),
                expected_idle_s: self.idle.hist.expected_remaining(tau),
            },
            budget: self.budget_stats(),
            heap_bytes: self.approx_heap_bytes(),
        }
    }

    /// The demand this planner observed, as mean rates over `step_s`-second intervals ending
    /// at its last observation (see [`DemandHistory::series`]): what another planner replays
    /// to start where this one is.
    pub fn demand_series(&self, step_s: f64) -> Option<(f64, Vec<f64>)> {
        self.history.series(step_s)
    }

    /// Approximate heap bytes held by the history and models (bounded by construction).
    pub fn approx_heap_bytes(&self) -> usize {
        self.history.approx_heap_bytes()
            + self.idle.hist.approx_heap_bytes()
            + self.fine.capacity() * std::mem::size_of::<(f64, f64, f64)>()
            + self.hw.approx_heap_bytes()
            + self.sn_day.approx_heap_bytes()
            + self.sn_week.approx_heap_bytes()
            + self.activity.capacity() * 4
            + self.activity_days.capacity() * 2
            + self.activity_week.capacity() * 4
            + self.activity_weeks.capacity()
            + self.ensemble.loss.capacity() * 16
            + self.pending.capacity() * std::mem::size_of::<Pending>()
            + self.young_rate_need.capacity() * 16
            + (self.echo.steps.capacity() + self.momentum.steps.capacity()) * 16
            + self.ratio_generic.q.approx_heap_bytes()
            + self.ratio_grid.q.approx_heap_bytes()
            + self.wake_level.approx_heap_bytes()
            + self.recent_need.capacity() * 16
            + self.own_orders.approx_heap_bytes()
            + self.cf.approx_heap_bytes()
            + self.outcome.approx_heap_bytes()
            + self.rate_rules.capacity() * std::mem::size_of::<ReactiveShadow>()
            + std::iter::once(&self.shadow)
                .chain(&self.rate_rules)
                .map(|r| (r.warming.capacity() + r.kept.capacity()) * 16)
                .sum::<usize>()
            + self.cached.as_ref().map(|c| c.weights.capacity() * 8).unwrap_or(0)
    }
}
