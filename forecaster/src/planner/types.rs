//! The planner's public types: its configuration, its decisions and their reasons, and the
//! snapshot `/debug` shows.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::*;

/// Warm-up time W: fixed, or a sample of measured warm-ups planned at `quantile`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WarmupDist {
    Fixed(f64),
    Samples { samples: Vec<f64>, quantile: f64 },
}

impl WarmupDist {
    /// The warm-up the planner plans with (seconds, ≥ 0).
    pub fn planned(&self) -> f64 {
        match self {
            WarmupDist::Fixed(w) => {
                if w.is_finite() {
                    w.clamp(0.0, 86400.0)
                } else {
                    0.0
                }
            }
            WarmupDist::Samples { samples, quantile } => {
                let mut v: Vec<f64> =
                    samples.iter().copied().filter(|x| x.is_finite() && *x >= 0.0).map(|x| x.min(86400.0)).collect();
                if v.is_empty() {
                    return 0.0;
                }
                v.sort_by(f64::total_cmp);
                let q = if quantile.is_finite() { quantile.clamp(0.0, 1.0) } else { 0.9 };
                let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
                v[i]
            }
        }
    }
}

/// Which forecast model drives the planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ForecastModel {
    /// Ensemble of all members weighted by recent pinball loss.
    Auto,
    Smoothing,
    HoltWinters,
    SeasonalNaive,
}

/// Planner configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannerConfig {
    /// μ: requests per second one ready replica completes (same unit as the arrival rate).
    pub capacity: f64,
    pub warmup: WarmupDist,
    /// Decision interval I, seconds (1 to 86,400).
    pub interval_s: f64,
    /// Queueing delay a request may see, seconds.
    pub slo_s: f64,
    /// The floor of a fleet that serves. With `scale_to_zero` the plan is 0 or at least this
    /// (KEDA's `idleReplicaCount: 0` beside `minReplicaCount: N`: idle at zero, N or more once
    /// woken); without it, at least `max(min_replicas, 1)`.
    pub min_replicas: u32,
    pub max_replicas: u32,
    pub scale_to_zero: bool,
    pub model: ForecastModel,
    /// Upper quantile of the forecast reported in the summary of the raw forecast (the
    /// margin actually planned is learned by the counterfactual; see the module docs).
    pub quantile: f64,
}

impl PlannerConfig {
    /// A configuration with the defaults: min 0, max 1000, scale-to-zero on, Auto, q 0.99.
    pub fn new(capacity: f64, warmup: WarmupDist, interval_s: f64, slo_s: f64) -> Self {
        PlannerConfig {
            capacity,
            warmup,
            interval_s,
            slo_s,
            min_replicas: 0,
            max_replicas: 1000,
            scale_to_zero: true,
            model: ForecastModel::Auto,
            quantile: 0.99,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum PlannerError {
    #[error("capacity must be a finite number > 0, got {0}")]
    Capacity(f64),
    #[error("interval_s must be a number of seconds in [1, 86400], got {0}")]
    Interval(f64),
    #[error("slo_s must be a finite number ≥ 0, got {0}")]
    Slo(f64),
    #[error("warm-up must be finite and ≥ 0 (planned value {0})")]
    Warmup(f64),
    #[error("min_replicas {min} > max_replicas {max}")]
    Bounds { min: u32, max: u32 },
    #[error("quantile must be in (0.5, 1), got {0}")]
    Quantile(f64),
}

/// The margin a pre-scale order follows (the candidate the counterfactual choice picked).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Margin {
    /// An upper quantile of the demand forecast.
    Forecast { q: f64 },
    /// A standing level: `share` × the 30-minute mean arrival rate.
    MeanLevel { share: f64 },
    /// A standing level: `share` × a decaying peak of the effective demand.
    PeakLevel { share: f64, half_life_s: f64 },
    /// On a window grid between change points: the current window's rate, known until the
    /// next change point (no margin applies there).
    WindowRate,
    /// No demand right now: the `q` quantile (0.5 or 0.9) of the first interval's demand
    /// after past idle spells, the wake-up a forecast margin orders for once an arrival
    /// within W + I is likely enough.
    WakeDemand { q: f64 },
}

impl fmt::Display for Margin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Margin::Forecast { q } => write!(f, "q{q:.2}"),
            Margin::MeanLevel { share } => write!(f, "standing level {share}× the 30-min mean rate"),
            Margin::PeakLevel { share, half_life_s } => {
                write!(f, "standing level {share}× the peak demand, half-life {:.0} min", half_life_s / 60.0)
            }
            Margin::WindowRate => write!(f, "the current window's rate, known until its change point"),
            Margin::WakeDemand { q } => write!(f, "the q{q:.2} demand of a wake-up after idle time"),
        }
    }
}

/// Why the planner chose its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reason {
    /// Not enough history yet: follow current demand with a fixed margin.
    Learning {
        demand: f64,
    },
    /// Capacity ordered ahead of demand for `peak` (req/s) `at_s` from now, by the margin the
    /// planner follows.
    PreScale {
        peak: f64,
        at_s: f64,
        margin: Margin,
    },
    DrainBacklog {
        backlog: f64,
    },
    Hold,
    ScaleIn {
        peak: f64,
    },
    Steady,
    KeepAlive {
        p_arrival: f64,
        expected_idle_s: f64,
    },
    /// To (or staying at) zero, no keep-alive paying off; `why` says what the margin followed
    /// made of `p_arrival` (absent in reasons serialized before it was added).
    ToZero {
        p_arrival: f64,
        expected_idle_s: f64,
        #[serde(default)]
        why: Option<ZeroWhy>,
    },
    Wake {
        in_s: f64,
        p_arrival: f64,
    },
    /// Following the status quo's own count: the KEDA + HPA shadow's, or (`rule`) a rate
    /// rule of the same shape that beat it on both cost and misses over the evidence. Either
    /// because over the last two days it beats every candidate margin (cost + price × late)
    /// by 1.5×, e.g. on noisy low-rate request logs, where a 1–3-minute mean with a 5-minute
    /// scale-in hold is the best margin there is; or (`fallback`) because the budget leaves
    /// no margin worth following (see [`Fallback`]).
    StatusQuo {
        replicas: u32,
        rule: Option<RateRule>,
        fallback: Option<Fallback>,
    },
    /// Clamped to the configured bounds.
    Bound {
        limit: u32,
    },
}

/// Why a fleet goes to (or stays at) zero whatever the arrival probability: what the margin
/// followed makes of it. A likely arrival and a fleet at zero otherwise read as a fault on
/// `/debug`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum ZeroWhy {
    /// The arrival probability is under the margin's wake threshold.
    UnderWake { threshold: f64 },
    /// The margin never wakes a fleet ahead of arrivals (it is woken by them).
    NeverWakes,
    /// The margin wakes at this probability but asks for nothing (a standing level decayed
    /// to nothing, or gated off on a grid).
    NoNeed,
}

/// An expected idle time in a reason: seconds, or unknown when no idle spell as long as the
/// current one has ended yet (none at all, or this one has outlasted every one seen; carried
/// as ≥ 1e9 s so that the JSON views stay finite).
struct Idle(f64);

impl fmt::Display for Idle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_finite() && self.0 < 1e9 {
            write!(f, "{:.0}s", self.0)
        } else {
            write!(f, "unknown (no idle spell this long seen yet)")
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Learning { demand } => {
                write!(f, "learning: follow demand {demand:.3} rps with margin")
            }
            Reason::PreScale { peak, at_s, margin: m @ Margin::Forecast { .. } } => {
                write!(f, "pre-scale for forecast peak {peak:.3} rps at +{at_s:.0}s ({m})")
            }
            Reason::PreScale { peak, margin: Margin::WindowRate, .. } => {
                write!(f, "scale up to {peak:.3} rps: {}", Margin::WindowRate)
            }
            Reason::PreScale { peak, at_s, margin } => {
                write!(f, "pre-scale to {peak:.3} rps ahead of +{at_s:.0}s ({margin})")
            }
            Reason::DrainBacklog { backlog } => write!(f, "drain backlog {backlog:.1}"),
            Reason::Hold => write!(f, "hold: forecast over W not below"),
            Reason::ScaleIn { peak } => {
                write!(f, "scale in: forecast peak over W {peak:.3} rps")
            }
            Reason::Steady => write!(f, "steady: capacity matches forecast"),
            Reason::KeepAlive { p_arrival, expected_idle_s } => {
                write!(f, "keep alive: P(arrival within W)={p_arrival:.2}, expected idle {}", Idle(*expected_idle_s))
            }
            Reason::ToZero { p_arrival, expected_idle_s, why } => {
                write!(f, "to zero: P(arrival within W)={p_arrival:.2}")?;
                match why {
                    Some(ZeroWhy::UnderWake { threshold }) => {
                        write!(f, " under the followed margin's wake threshold {threshold:.2}")?
                    }
                    Some(ZeroWhy::NeverWakes) => write!(f, "; the followed margin does not wake ahead of arrivals")?,
                    Some(ZeroWhy::NoNeed) => write!(f, "; the followed margin asks for no replica")?,
                    None => {}
                }
                write!(f, ", expected idle {}", Idle(*expected_idle_s))
            }
            Reason::Wake { in_s, p_arrival } => write!(f, "wake: predicted arrival in {in_s:.0}s (p={p_arrival:.2})"),
            Reason::StatusQuo { replicas, rule, fallback } => {
                write!(f, "status quo: {replicas} replicas by ")?;
                match rule {
                    Some(r) => write!(f, "{r} (beat KEDA + HPA on cost and misses)")?,
                    None => write!(f, "KEDA + HPA's own count")?,
                }
                match fallback {
                    Some(why) => write!(f, "; {}", why.text()),
                    None => write!(f, "; it beats every margin over the last two days"),
                }
            }
            Reason::Bound { limit } => write!(f, "clamped to bound {limit}"),
        }
    }
}

/// A reactive rule of KEDA + HPA's shape (scale-up limit, queue trigger, 300-s scale-down
/// hold and cooldown) sized on the arrival rate rather than on utilisation: `m` × the mean
/// rate over the last `window_s` seconds plus `z` standard deviations of a Poisson count
/// over the SLO (`z · sqrt(rate / SLO)`), so its headroom is the queueing noise of the
/// traffic it sees rather than a fixed 25 %.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RateRule {
    pub m: f64,
    pub z: f64,
    pub window_s: f64,
    /// Share of W + I over which the rate's rise (the window's second half against its
    /// first) is projected ahead; 0 for a rule on the rate alone.
    pub trend: f64,
}

impl fmt::Display for RateRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}× the {:.0}-s mean rate + {}σ of its noise", self.m, self.window_s, self.z)?;
        if self.trend > 0.0 {
            write!(f, ", its rise projected over {}× W + I", self.trend)?;
        }
        Ok(())
    }
}

/// Forecast summary attached to a decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForecastSummary {
    /// Horizon end, seconds after now (W + I).
    pub horizon_s: f64,
    /// Current effective demand (req/s).
    pub current: f64,
    /// Ensemble point forecast of the peak over the horizon (req/s).
    pub point: f64,
    /// Planned upper quantile of the peak (req/s).
    pub upper: f64,
    pub quantile: f64,
    /// Ensemble weights per member, in `member_names()` order.
    pub weights: Vec<f64>,
    /// Next change point of a piecewise-constant signal, seconds from now (if one is known).
    pub next_change_s: Option<f64>,
}

/// One planning decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub desired: u32,
    pub reason: Reason,
    pub forecast: ForecastSummary,
}

/// Idle statistics for the snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleStats {
    pub idle_for_s: f64,
    pub gaps_seen: f64,
    pub p05_s: Option<f64>,
    pub p50_s: Option<f64>,
    pub p99_s: Option<f64>,
    pub p_arrival_within_w: f64,
    pub expected_idle_s: Option<f64>,
}

/// The planner's spend against its budget, the KEDA + HPA shadow (for a /debug page: why the
/// planner holds back, or why it spends).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetStats {
    /// Replica-seconds the planner's own answers cost (two-day half-life).
    pub own_replica_seconds: f64,
    /// Replica-seconds today's KEDA + HPA would have cost on the same arrivals (same decay).
    pub shadow_replica_seconds: f64,
    /// Recent share of requests the shadow served late, and the margin the planner follows.
    pub shadow_recent_miss_share: Option<f64>,
    pub followed_recent_miss_share: Option<f64>,
    /// Recent share the planner's own fleet served late (what its answers actually did).
    pub own_recent_miss_share: Option<f64>,
    /// The budget's integral feedback (1 = the full shadow spend) and the miss price's
    /// multiple of its base.
    pub budget_gain: f64,
    pub miss_price_gain: f64,
    /// The budget is spent: margins that would outspend the shadow from now on are ruled out
    /// and the scale-in hold is off.
    pub spent: bool,
    /// The safety margin followed, e.g. `forecast q0.99, wake at p≥0.3 with the median
    /// wake-up demand` or `standing level 0.75× the peak demand, half-life 60 min`.
    pub margin: Option<String>,
}

/// Serializable state for a /debug page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub t_s: Option<f64>,
    pub warmup_planned_s: f64,
    pub recent: Vec<HistoryPoint>,
    pub hourly: Vec<HistoryPoint>,
    pub members: Vec<String>,
    pub last_forecast: Option<ForecastSummary>,
    /// Upper quantiles of the calibrated ratio peak/forecast at q 0.5/0.9/0.99.
    pub ratio_quantiles: [Option<f64>; 3],
    /// How much the recent spread of the forecast errors widens those quantiles now (1 to
    /// 1.5; see `RatioTracker`).
    pub error_spread_scale: f64,
    /// Slope of the step at a change point on how far the rate dipped below its hour's level
    /// (−1 to 0; its negative times the dip widens the margin after a dip; see `Reversion`).
    pub dip_reversion_slope: f64,
    /// Slope of the step at a change point on the rise at the same minute of the last hours
    /// (0 to 1, 0 until significant; times that rise it widens the margin; see `Echo`).
    pub hourly_echo_slope: f64,
    /// Slope of the step at a change point on the rise at the change just before (0 to 1, 0
    /// until significant: a ramp sampled on a grid finer than its rise; see `Echo::momentum`).
    pub step_momentum_slope: f64,
    pub grid_period_s: Option<f64>,
    pub idle: IdleStats,
    pub budget: BudgetStats,
    pub heap_bytes: usize,
}

/// Why a budget-bound planner follows the status quo rather than a margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fallback {
    /// No margin fits the budget any more, which the status quo defines.
    Starved,
    /// The budget is spent and the margin it affords has recently missed over
    /// `OUTMISSED_FACTOR` times what the status quo did.
    Outmissed,
}

impl Fallback {
    /// How a decision's reason and `/debug` say so.
    pub fn text(self) -> &'static str {
        match self {
            Fallback::Starved => "no margin fits the budget",
            Fallback::Outmissed => "the margin the budget affords misses over twice as much",
        }
    }
}
