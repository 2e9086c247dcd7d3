//! Calibration of the forecast's upper quantiles: the standardised, volatility-scaled ratio
//! tracker and the dip-reversion shift at change points.

use super::*;

/// Calibration of the forecast's upper quantile: ln(outcome / point forecast) of resolved
/// forecasts. The horizons of consecutive decisions overlap (each is W + I long, decisions are
/// I apart), so consecutive outcomes are nearly the same event: each is recorded with weight
/// I / (W + I), one independent horizon's worth in total. The tracker's memory (its forgetting
/// is by weight) and the evidence behind a high quantile are thereby counted in independent
/// horizons, not in decisions: unweighted, a W = 420 s planner would read its q0.99 off ~1024
/// decisions that are only ~35 independent outcomes, and forget within hours.
///
/// The log ratio's spread shrinks as the demand grows: demand is a sum of requests from
/// many clients, so its relative noise falls like 1/sqrt(level) (a count process) and a
/// fleet of 2 sees doublings that a fleet of 40 never does. Ratios are therefore recorded
/// standardised, `z = ln ratio × sqrt(point/μ + 1)`, and a quantile is read back at the
/// current point's scale: a small fleet gets a wide relative margin, a large one a narrow
/// one, from the same evidence. (Unscaled, one quantile over all levels over-provisions the
/// busy hours and under-provisions the quiet ones.)
///
/// Errors cluster: a restless hour is followed by more restless ones (volatility clustering).
/// Outcomes are therefore also recorded relative to the recent spread, `z / v` with `v` = the
/// RMS of standardised outcomes over the last hour against the last two days, clamped to
/// `VOL_SCALE_RANGE`, and a quantile is read back times the `v` of now: the same tail
/// probability buys a wider margin after a restless hour (filtered historical simulation).
/// `v` never goes below 1: calm hours do not narrow the margin below its long-run calibration
/// (narrowing to 0.5 gave cheaper plans but lost to reactive on a 1-replica-per-req/s client at
/// W = 420 s, where a calm hour ends in a jump), and the upper clamp keeps a restless hour
/// from being recorded as calm evidence.
#[derive(Debug, Clone)]
pub(super) struct RatioTracker {
    pub(super) q: QuantileTracker,
    /// Outcomes recorded (unweighted): the quantiles are used once there are enough.
    pub(super) samples: u64,
    pub(super) mu: f64,
    /// Exponentially weighted mean squares of the standardised outcomes, short and long memory.
    pub(super) ms_short: f64,
    pub(super) ms_long: f64,
}

/// Half-lives (seconds of outcomes) of the recent and the reference spread of [`RatioTracker`].
pub(super) const VOL_SHORT_HALF_LIFE_S: f64 = 3600.0;
pub(super) const VOL_LONG_HALF_LIFE_S: f64 = 2.0 * 86_400.0;
/// Bounds of the volatility scale `v` (recent RMS / reference RMS).
pub(super) const VOL_SCALE_RANGE: (f64, f64) = (1.0, 1.5);

/// The standardised ratios span this many times the log-ratio range [-3, 5]: sqrt of the
/// largest fleet (≤ 1024 replicas) the tracker resolves finely. The bins (1280 over the
/// range) widen with it, and a quantile is read at a bin's upper edge, so a large
/// `max_replicas` rounds a small fleet's margin up (by ≤ 0.2 in log ratio at 1024). Finer
/// (asinh-scaled) bins scored worse on the dev traces: that rounding acts as margin the
/// candidate grid would otherwise lack.
pub(super) fn ratio_range_scale(max_replicas: u32) -> f64 {
    (f64::from(max_replicas.min(1023)) + 1.0).sqrt()
}

impl RatioTracker {
    pub(super) fn new(mu: f64, max_replicas: u32) -> Self {
        let k = ratio_range_scale(max_replicas);
        RatioTracker {
            q: QuantileTracker::new(-3.0 * k, 5.0 * k, 1280, 1024.0),
            samples: 0,
            mu,
            ms_short: 0.0,
            ms_long: 0.0,
        }
    }

    /// The volatility scale now: recent RMS over reference RMS, clamped (1 before any spread,
    /// and if either mean square has overflowed).
    pub(super) fn vol_scale(&self) -> f64 {
        let v = (self.ms_short / self.ms_long).sqrt();
        if self.ms_long > 0.0 && v.is_finite() {
            v.clamp(VOL_SCALE_RANGE.0, VOL_SCALE_RANGE.1)
        } else {
            1.0
        }
    }

    /// sqrt(point/μ + 1): the standardisation factor at a point forecast (req/s).
    pub(super) fn spread_factor(&self, point: f64) -> f64 {
        (point.max(0.0) / self.mu + 1.0).sqrt()
    }

    /// Record outcome `r` (ln ratio) of a forecast of `point`, `dt_s` seconds of outcomes after
    /// the previous record.
    pub(super) fn record(&mut self, r: f64, weight: f64, point: f64, dt_s: f64) {
        let z = r * self.spread_factor(point);
        if !(z.is_finite() && weight.is_finite() && weight > 0.0) {
            return;
        }
        self.q.record_weighted(z / self.vol_scale(), weight);
        self.samples += 1;
        let dt = if dt_s.is_finite() { dt_s.max(0.0) } else { 0.0 };
        let mix = |hl: f64| 1.0 - (-dt * std::f64::consts::LN_2 / hl).exp();
        let z2 = z * z;
        if !z2.is_finite() {
            // An outcome beyond any scale (the quantile clamps it to its top bin) says nothing
            // about the spread of the others.
        } else if self.samples == 1 {
            (self.ms_short, self.ms_long) = (z2, z2);
        } else {
            self.ms_short += mix(VOL_SHORT_HALF_LIFE_S) * (z2 - self.ms_short);
            self.ms_long += mix(VOL_LONG_HALF_LIFE_S) * (z2 - self.ms_long);
        }
    }

    pub(super) fn calibrated(&self) -> bool {
        self.samples >= 20
    }

    /// The `q` quantile of ln(outcome / point) for a forecast of `point`.
    pub(super) fn quantile(&self, q: f64, point: f64) -> Option<f64> {
        self.q.quantile(q).map(|z| z * self.vol_scale() / self.spread_factor(point))
    }

    /// [`RatioTracker::quantile`] at every candidate quantile, in one pass.
    pub(super) fn candidate_quantiles(&self, point: f64) -> Option<[f64; CF_NQ]> {
        let f = self.vol_scale() / self.spread_factor(point);
        self.q.quantiles(&CF_QS).map(|z| z.map(|z| z * f))
    }
}

/// Mean reversion at change points: a rate that dips below its level tends to come back at
/// the next change (a dip refills; aggregated demand at a low relative to its last hour rises
/// more often and further than elsewhere). The step at a change, `ln(next / current)`, is
/// regressed on how far the current rate dips below its level, `d = min(0, ln(current /
/// level))` (both standardised as in [`RatioTracker`], weighted by independent outcomes and
/// forgotten with a half-life of `REVERSION_HALF_LIFE` outcomes). The slope `β`, clamped to
/// [−1, 0] (reversion only, never a chase), shifts the quantile read at a change point by
/// `β·d ≥ 0`, and the ratio tracker records each outcome net of the shift it was forecast with:
/// the margin widens after a dip and the dips' large steps no longer widen every other
/// window's. Demand without reversion keeps `β` near 0, and nothing changes.
///
/// Only dips shift: a symmetric stretch (spikes narrowing the margin) bought more on the
/// 14-day aggregate but lost to reactive on a sparse client at W = 420 s, whose rises go on.
#[derive(Debug, Clone, Default)]
pub(super) struct Reversion {
    pub(super) sxx: f64,
    pub(super) sxy: f64,
    pub(super) weight: f64,
}

/// Half-life of the reversion fit, in independent outcomes (about two days of 10-min windows).
pub(super) const REVERSION_HALF_LIFE: f64 = 288.0;
/// Time constant of the level a dip is measured from, seconds (the slow level behind the
/// standing levels, `LEVEL_TAU_S`, follows a dip within a 10-min window; an hour keeps the
/// level it reverts to: 30 min and 2 h both bought less on the 14-day aggregate).
pub(super) const REVERSION_TAU_S: f64 = 3600.0;
/// Deepest dip (ln) a shift is read at: a client falling silent stands far below any level,
/// and its margin must not grow without bound with it.
pub(super) const DIP_LIMIT: f64 = 1.5;
/// Independent outcomes before the reversion slope is used.
pub(super) const REVERSION_MIN_WEIGHT: f64 = 50.0;

impl Reversion {
    pub(super) fn record(&mut self, d: f64, r: f64, s: f64, weight: f64) {
        let (x, y) = (d * s, r * s);
        if !(x.is_finite() && y.is_finite() && weight.is_finite() && weight > 0.0) || x.abs() > 1e6 || y.abs() > 1e6 {
            return;
        }
        let g = 0.5f64.powf(weight / REVERSION_HALF_LIFE);
        self.sxx = g * self.sxx + weight * x * x;
        self.sxy = g * self.sxy + weight * x * y;
        self.weight += weight;
    }

    /// The fitted slope (0 until there is enough evidence).
    pub(super) fn beta(&self) -> f64 {
        if self.weight < REVERSION_MIN_WEIGHT || self.sxx <= 0.0 {
            return 0.0;
        }
        let b = self.sxy / self.sxx;
        if b.is_finite() {
            b.clamp(-1.0, 0.0)
        } else {
            0.0
        }
    }
}

/// The hourly echo at change points: a step that recurs at the same minute of every hour (a
/// job started by cron at half past, a batch client polling hourly) is ordered for before it
/// shows again. Each change point's step, `ln(next / current)` standardised as in
/// [`RatioTracker`], is kept for `ECHO_HOURS` hours; the *echo* at a change `b` is the mean of
/// the steps at `b − 1 h`, `b − 2 h`, … (those found within half a window), counted only when
/// it rises (`max(0, mean)`). The step at each change is regressed on its echo (with an
/// intercept: through the origin, a positive echo would read a rising day's mean step as a
/// rhythm; forgotten like [`Reversion`]), and a change point's quantile is shifted by
/// `γ·echo`, with `γ` the slope clamped to [0, 1] and used only once it is significantly
/// positive (t ≥ `ECHO_MIN_T`): demand with no hourly rhythm keeps `γ` at 0, and nothing
/// changes. The ratio tracker records outcomes net of the shift, as for the dip.
///
/// [`Echo::momentum`] is the same regression on the step at the change just before: a ramp
/// sampled on a grid finer than its rise (5-minute windows of a daily cycle) keeps stepping
/// the same way, while noisy windows revert (on the dev traces' 10-minute aggregate the
/// lag-one correlation of the steps is −0.15) and keep its slope at 0.
#[derive(Debug, Clone)]
pub(super) struct Echo {
    /// Seconds between the past steps the echo reads (0: the grid's period, i.e. the changes
    /// just before), and how many of them it averages.
    pub(super) lag_s: f64,
    pub(super) lags: usize,
    /// (change time, standardised step) of the last `lags` lags, oldest first.
    pub(super) steps: VecDeque<(f64, f64)>,
    /// Forgotten sums of 1, x, y, x², xy, y² (x the echo, y the step).
    pub(super) s0: f64,
    pub(super) sx: f64,
    pub(super) sy: f64,
    pub(super) sxx: f64,
    pub(super) sxy: f64,
    pub(super) syy: f64,
    pub(super) weight: f64,
}

/// Period of the echo, seconds.
pub(super) const ECHO_PERIOD_S: f64 = 3600.0;
/// Hours of past steps an echo averages.
pub(super) const ECHO_HOURS: usize = 3;
/// Most steps kept (a 60-s grid has 180 changes in 3 hours).
pub(super) const ECHO_CAP: usize = 256;
/// Change points (weight) before the echo slope is used, and the t statistic it must reach.
pub(super) const ECHO_MIN_WEIGHT: f64 = 50.0;
pub(super) const ECHO_MIN_T: f64 = 3.0;

impl Default for Echo {
    /// The hourly echo.
    fn default() -> Self {
        Echo::with_lag(ECHO_PERIOD_S, ECHO_HOURS)
    }
}

impl Echo {
    fn with_lag(lag_s: f64, lags: usize) -> Self {
        Echo {
            lag_s,
            lags,
            steps: VecDeque::new(),
            s0: 0.0,
            sx: 0.0,
            sy: 0.0,
            sxx: 0.0,
            sxy: 0.0,
            syy: 0.0,
            weight: 0.0,
        }
    }

    /// The same regression on the step just before (momentum: a ramp sampled on a grid finer
    /// than its rise keeps stepping the same way; noisy windows revert, and the slope stays 0).
    pub(super) fn momentum() -> Self {
        Echo::with_lag(0.0, 1)
    }

    fn lag(&self, period: f64) -> f64 {
        if self.lag_s > 0.0 {
            self.lag_s
        } else {
            period
        }
    }

    /// The echo at a change at `b` on a grid of `period` seconds (None without any past step).
    pub(super) fn feature(&self, b: f64, period: f64) -> Option<f64> {
        let lag = self.lag(period);
        let tol = 0.5 * period.min(lag);
        let (mut sum, mut n) = (0.0, 0u32);
        for j in 1..=self.lags {
            let at = b - j as f64 * lag;
            if let Some(&(_, z)) = self.steps.iter().find(|(tb, _)| (tb - at).abs() < tol) {
                sum += z;
                n += 1;
            }
        }
        (n > 0).then(|| (sum / f64::from(n)).max(0.0))
    }

    /// Record the standardised step `z` at the change at `b`.
    pub(super) fn record(&mut self, b: f64, z: f64, period: f64) {
        if !(b.is_finite() && z.is_finite()) || z.abs() > 1e6 {
            return;
        }
        if let Some(x) = self.feature(b, period) {
            let g = 0.5f64.powf(1.0 / REVERSION_HALF_LIFE);
            self.s0 = g * self.s0 + 1.0;
            self.sx = g * self.sx + x;
            self.sy = g * self.sy + z;
            self.sxx = g * self.sxx + x * x;
            self.sxy = g * self.sxy + x * z;
            self.syy = g * self.syy + z * z;
            self.weight += 1.0;
        }
        let keep_s = (self.lags as f64 + 0.5) * self.lag(period);
        while self.steps.front().is_some_and(|&(tb, _)| tb < b - keep_s) || self.steps.len() >= ECHO_CAP {
            self.steps.pop_front();
        }
        self.steps.push_back((b, z));
    }

    /// The fitted slope, 0 until it is significantly positive.
    pub(super) fn gamma(&self) -> f64 {
        if self.weight < ECHO_MIN_WEIGHT || self.s0 <= 2.0 {
            return 0.0;
        }
        let cxx = self.sxx - self.sx * self.sx / self.s0;
        let cxy = self.sxy - self.sx * self.sy / self.s0;
        let cyy = self.syy - self.sy * self.sy / self.s0;
        if cxx <= 1e-12 * self.sxx {
            return 0.0;
        }
        let g = cxy / cxx;
        // The forgotten count is the sample size.
        let resid = ((cyy - g * cxy) / (self.s0 - 2.0)).max(0.0);
        let se = (resid / cxx).sqrt();
        if !(g.is_finite() && g > 0.0) || g < ECHO_MIN_T * se {
            return 0.0;
        }
        g.min(1.0)
    }

    /// The shift (ln) of a change point's quantile at `b` for a forecast standardised by `s`.
    pub(super) fn shift(&self, b: f64, period: f64, s: f64) -> f64 {
        let g = self.gamma();
        if g <= 0.0 || s <= 0.0 {
            return 0.0;
        }
        self.feature(b, period).map_or(0.0, |x| g * x / s)
    }
}
