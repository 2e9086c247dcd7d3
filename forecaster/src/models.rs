//! Online forecasting models (no allocation after construction, O(1) per update except
//! where noted), an ensemble weighted by recent pinball loss, and an online quantile
//! tracker used to calibrate upper quantiles of forecast errors.
//!
//! All models are fed a regular series (one value per step) and forecast `h` steps ahead.
//! Inputs are sanitized: non-finite values are ignored, negatives clamp to 0.

use serde::{Deserialize, Serialize};

fn clean(y: f64) -> Option<f64> {
    if y.is_finite() {
        Some(y.max(0.0))
    } else {
        None
    }
}

/// Damped-trend exponential smoothing (Holt). `alpha = 1, beta = 0` is the last value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Smoothing {
    pub alpha: f64,
    pub beta: f64,
    pub phi: f64,
    level: f64,
    trend: f64,
    n: u64,
}

impl Smoothing {
    pub fn new(alpha: f64, beta: f64, phi: f64) -> Self {
        let c = |x: f64, d: f64| if x.is_finite() { x.clamp(0.0, 1.0) } else { d };
        Smoothing { alpha: c(alpha, 0.3).max(1e-3), beta: c(beta, 0.0), phi: c(phi, 0.9), level: 0.0, trend: 0.0, n: 0 }
    }

    pub fn update(&mut self, y: f64) {
        let Some(y) = clean(y) else { return };
        if self.n == 0 {
            self.level = y;
            self.trend = 0.0;
        } else {
            let prev = self.level;
            let pred = self.level + self.phi * self.trend;
            self.level = self.alpha * y + (1.0 - self.alpha) * pred;
            self.trend = self.beta * (self.level - prev) + (1.0 - self.beta) * self.phi * self.trend;
        }
        self.n += 1;
    }

    /// Forecast `h ≥ 0` steps ahead (damped trend), never negative.
    pub fn forecast(&self, h: f64) -> f64 {
        let h = if h.is_finite() { h.clamp(0.0, 1e6) } else { 0.0 };
        // Sum of phi^1..phi^h for the damped trend.
        let damp =
            if (self.phi - 1.0).abs() < 1e-9 { h } else { self.phi * (1.0 - self.phi.powf(h)) / (1.0 - self.phi) };
        (self.level + damp * self.trend).max(0.0)
    }

    pub fn level(&self) -> f64 {
        self.level
    }

    pub fn seen(&self) -> u64 {
        self.n
    }
}

/// Additive seasonal Holt-Winters with a (damped) trend. The season has `period` steps;
/// until one full season has been seen it forecasts the level only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HoltWinters {
    pub alpha: f64,
    pub beta: f64,
    pub gamma: f64,
    pub phi: f64,
    period: usize,
    level: f64,
    trend: f64,
    season: Vec<f64>,
    /// Steps seen so far; the step with index `n` has season slot `n % period`.
    n: u64,
    /// Sum of the first season (for initialisation).
    first_sum: f64,
}

impl HoltWinters {
    pub fn new(period: usize, alpha: f64, beta: f64, gamma: f64) -> Self {
        let c = |x: f64, d: f64| if x.is_finite() { x.clamp(0.0, 1.0) } else { d };
        let period = period.clamp(2, 20_000);
        HoltWinters {
            alpha: c(alpha, 0.2).max(1e-3),
            beta: c(beta, 0.01),
            gamma: c(gamma, 0.2),
            phi: 0.98,
            period,
            level: 0.0,
            trend: 0.0,
            season: vec![0.0; period],
            n: 0,
            first_sum: 0.0,
        }
    }

    pub fn period(&self) -> usize {
        self.period
    }

    /// Feed the value of step `n` (steps are implicit and consecutive).
    pub fn update(&mut self, y: f64) {
        let Some(y) = clean(y) else {
            self.n += 1;
            return;
        };
        let p = self.period as u64;
        let slot = (self.n % p) as usize;
        if self.n < p {
            // First season: store raw values, then initialise.
            self.season[slot] = y;
            self.first_sum += y;
            self.level = self.first_sum / (self.n + 1) as f64;
            if self.n + 1 == p {
                let mean = self.first_sum / p as f64;
                for s in &mut self.season {
                    *s -= mean;
                }
                self.level = mean;
                self.trend = 0.0;
            }
        } else {
            let prev = self.level;
            let s = self.season[slot];
            self.level = self.alpha * (y - s) + (1.0 - self.alpha) * (self.level + self.phi * self.trend);
            self.trend = self.beta * (self.level - prev) + (1.0 - self.beta) * self.phi * self.trend;
            self.season[slot] = self.gamma * (y - self.level) + (1.0 - self.gamma) * s;
        }
        self.n += 1;
    }

    /// Is the seasonal part initialised?
    pub fn ready(&self) -> bool {
        self.n >= self.period as u64
    }

    /// Forecast the value of the step `h ≥ 1` steps after the last one fed.
    pub fn forecast(&self, h: u64) -> f64 {
        let h = h.clamp(1, 1 << 40);
        if !self.ready() {
            return self.level.max(0.0);
        }
        let slot = ((self.n - 1 + h) % self.period as u64) as usize;
        let hh = h.min(10_000) as f64;
        let damp =
            if (self.phi - 1.0).abs() < 1e-9 { hh } else { self.phi * (1.0 - self.phi.powf(hh)) / (1.0 - self.phi) };
        (self.level + damp * self.trend + self.season[slot]).max(0.0)
    }

    pub fn approx_heap_bytes(&self) -> usize {
        self.season.capacity() * std::mem::size_of::<f64>()
    }
}

/// Seasonal naive: the value one period earlier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeasonalNaive {
    period: usize,
    buf: Vec<f32>,
    n: u64,
}

impl SeasonalNaive {
    pub fn new(period: usize) -> Self {
        let period = period.clamp(1, 20_000);
        SeasonalNaive { period, buf: vec![0.0; period], n: 0 }
    }

    pub fn update(&mut self, y: f64) {
        let y = clean(y).unwrap_or(0.0);
        let slot = (self.n % self.period as u64) as usize;
        self.buf[slot] = y as f32;
        self.n += 1;
    }

    /// Has a full period been seen?
    pub fn ready(&self) -> bool {
        self.n >= self.period as u64
    }

    /// The value `h ≥ 1` steps ahead = the value one period before that step
    /// (for `h > period`, the latest period available).
    pub fn forecast(&self, h: u64) -> Option<f64> {
        if !self.ready() {
            return None;
        }
        let p = self.period as u64;
        let h = ((h.max(1) - 1) % p) + 1;
        // Target index n-1+h; one period before: n-1+h-p (≥ n-p since h ≥ 1).
        let idx = self.n - 1 + h - p;
        Some(self.buf[(idx % p) as usize] as f64)
    }

    pub fn approx_heap_bytes(&self) -> usize {
        self.buf.capacity() * std::mem::size_of::<f32>()
    }
}

/// Pinball (quantile) loss of forecast `f` for outcome `y` at quantile `q`.
pub fn pinball(y: f64, f: f64, q: f64) -> f64 {
    let d = y - f;
    if d >= 0.0 {
        q * d
    } else {
        (q - 1.0) * d
    }
}

/// Ensemble weights from exponentially decayed pinball losses: weight ∝ 1 / loss².
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ensemble {
    /// Decayed loss per member.
    pub loss: Vec<f64>,
    /// Number of scored forecasts per member.
    pub scored: Vec<u64>,
    /// Decay per scored forecast (weight of the newest loss).
    pub decay: f64,
    /// Quantile at which members are scored.
    pub q: f64,
}

impl Ensemble {
    pub fn new(members: usize, decay: f64, q: f64) -> Self {
        Ensemble {
            loss: vec![0.0; members],
            scored: vec![0; members],
            decay: if decay.is_finite() { decay.clamp(1e-4, 1.0) } else { 0.05 },
            q: if q.is_finite() { q.clamp(0.01, 0.99) } else { 0.5 },
        }
    }

    /// Score member `i`'s forecast `f` against outcome `y` (scale-free: the loss is divided
    /// by `scale` so members compare on the same footing over time).
    pub fn score(&mut self, i: usize, y: f64, f: f64, scale: f64) {
        if i >= self.loss.len() || !y.is_finite() || !f.is_finite() {
            return;
        }
        let s = if scale.is_finite() && scale > 0.0 { scale } else { 1.0 };
        let l = pinball(y, f, self.q) / s;
        if self.scored[i] == 0 {
            self.loss[i] = l;
        } else {
            self.loss[i] = (1.0 - self.decay) * self.loss[i] + self.decay * l;
        }
        self.scored[i] += 1;
    }

    /// Normalised weights over the members marked `available` (equal weights before any
    /// scoring; unavailable members get 0).
    #[allow(clippy::needless_range_loop)]
    pub fn weights(&self, available: &[bool]) -> Vec<f64> {
        let n = self.loss.len();
        let mut w = vec![0.0; n];
        let mut sum = 0.0;
        for i in 0..n {
            if !available.get(i).copied().unwrap_or(false) {
                continue;
            }
            // Unscored members borrow the worst scored loss (they must earn weight).
            let l = if self.scored[i] == 0 {
                self.loss.iter().zip(&self.scored).filter(|(_, &s)| s > 0).map(|(l, _)| *l).fold(f64::NAN, f64::max)
            } else {
                self.loss[i]
            };
            let wi = if l.is_finite() { 1.0 / (l * l + 1e-12) } else { 1.0 };
            w[i] = wi;
            sum += wi;
        }
        if sum > 0.0 && sum.is_finite() {
            for x in &mut w {
                *x /= sum;
            }
        } else {
            let k = available.iter().filter(|a| **a).count().max(1) as f64;
            for (i, x) in w.iter_mut().enumerate() {
                *x = if available.get(i).copied().unwrap_or(false) { 1.0 / k } else { 0.0 };
            }
        }
        w
    }
}

/// Online quantile tracker of a scalar (e.g. a log ratio of outcome to forecast): a histogram
/// over `[lo, hi]` with fixed bins and exponential forgetting (counts halve when the weight
/// exceeds `max_weight`). Deterministic; O(bins) per query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantileTracker {
    lo: f64,
    hi: f64,
    counts: Vec<f64>,
    total: f64,
    max_weight: f64,
}

impl QuantileTracker {
    pub fn new(lo: f64, hi: f64, bins: usize, max_weight: f64) -> Self {
        let (lo, hi) = if lo.is_finite() && hi.is_finite() && hi > lo { (lo, hi) } else { (-1.0, 1.0) };
        QuantileTracker {
            lo,
            hi,
            counts: vec![0.0; bins.clamp(2, 4096)],
            total: 0.0,
            max_weight: if max_weight.is_finite() && max_weight >= 2.0 { max_weight } else { 256.0 },
        }
    }

    pub fn record(&mut self, x: f64) {
        self.record_weighted(x, 1.0);
    }

    /// Record `x` with weight `w` (e.g. the share of an independent outcome a sample carries
    /// when consecutive samples overlap); ignored unless `x` is finite and `w` finite and > 0.
    pub fn record_weighted(&mut self, x: f64, w: f64) {
        if !(x.is_finite() && w.is_finite() && w > 0.0) {
            return;
        }
        let n = self.counts.len();
        let f = ((x - self.lo) / (self.hi - self.lo) * n as f64).floor();
        let i = (f.max(0.0) as usize).min(n - 1);
        self.counts[i] += w;
        self.total += w;
        if self.total > self.max_weight {
            for c in &mut self.counts {
                *c *= 0.5;
            }
            self.total *= 0.5;
        }
    }

    pub fn count(&self) -> f64 {
        self.total
    }

    /// The `q` quantile (upper edge of the bin reaching it: conservative), None while empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.total <= 0.0 || !q.is_finite() {
            return None;
        }
        let target = q.clamp(0.0, 1.0) * self.total;
        let n = self.counts.len();
        let w = (self.hi - self.lo) / n as f64;
        let mut acc = 0.0;
        for (i, c) in self.counts.iter().enumerate() {
            acc += c;
            if acc >= target - 1e-12 && *c > 0.0 {
                return Some(self.lo + (i + 1) as f64 * w);
            }
        }
        Some(self.hi)
    }

    /// The quantiles at `qs` (ascending) in one pass, each as [`QuantileTracker::quantile`]
    /// gives it; `None` while empty or if `qs` is not ascending and finite.
    pub fn quantiles<const N: usize>(&self, qs: &[f64; N]) -> Option<[f64; N]> {
        if self.total <= 0.0 || qs.iter().any(|q| !q.is_finite()) || qs.windows(2).any(|p| p[1] < p[0]) {
            return None;
        }
        let n = self.counts.len();
        let w = (self.hi - self.lo) / n as f64;
        let mut out = [self.hi; N];
        let mut k = 0;
        let mut acc = 0.0;
        for (i, c) in self.counts.iter().enumerate() {
            acc += c;
            if *c <= 0.0 {
                continue;
            }
            while k < N && acc >= qs[k].clamp(0.0, 1.0) * self.total - 1e-12 {
                out[k] = self.lo + (i + 1) as f64 * w;
                k += 1;
            }
            if k == N {
                break;
            }
        }
        Some(out)
    }

    /// Share of recorded mass strictly above `x`.
    pub fn share_above(&self, x: f64) -> f64 {
        if self.total <= 0.0 {
            return 0.0;
        }
        let n = self.counts.len();
        let w = (self.hi - self.lo) / n as f64;
        let mut s = 0.0;
        for (i, c) in self.counts.iter().enumerate() {
            if self.lo + i as f64 * w >= x {
                s += c;
            }
        }
        s / self.total
    }

    pub fn approx_heap_bytes(&self) -> usize {
        self.counts.capacity() * std::mem::size_of::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holt_winters_recovers_daily_sine() {
        // 5-min steps, daily period 288, rate 100 ± 50 with mild noise.
        let p = 288;
        let mut hw = HoltWinters::new(p, 0.2, 0.01, 0.3);
        let f = |n: u64| 100.0 + 50.0 * (2.0 * std::f64::consts::PI * n as f64 / p as f64).sin();
        let mut n = 0u64;
        for _ in 0..(4 * p) {
            let noise = ((n * 7919) % 13) as f64 - 6.0; // deterministic, ±6
            hw.update(f(n) + noise);
            n += 1;
        }
        let mut worst: f64 = 0.0;
        for h in 1..=p as u64 {
            let y = f(n - 1 + h);
            let e = (hw.forecast(h) - y).abs() / y;
            worst = worst.max(e);
        }
        assert!(worst < 0.10, "worst relative error {worst}");
    }

    #[test]
    fn seasonal_naive_lag() {
        let mut sn = SeasonalNaive::new(4);
        assert!(sn.forecast(1).is_none());
        for y in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0] {
            sn.update(y);
        }
        // Next step (index 6) repeats index 2 = 3.0; two steps ahead repeats index 3 = 4.0.
        assert_eq!(sn.forecast(1), Some(3.0));
        assert_eq!(sn.forecast(2), Some(4.0));
        assert_eq!(sn.forecast(4), Some(6.0));
        assert_eq!(sn.forecast(5), Some(3.0));
    }

    #[test]
    fn smoothing_tracks_level_and_trend() {
        let mut s = Smoothing::new(0.5, 0.3, 1.0);
        for i in 0..200 {
            s.update(10.0 + i as f64);
        }
        let f = s.forecast(5.0);
        assert!((f - 214.0).abs() < 2.0, "{f}");
        s.update(f64::NAN);
        assert!(s.forecast(1.0).is_finite());
    }

    #[test]
    fn ensemble_weights_shift_to_better_model() {
        // Series switches from constant (member 0 = level is right) to alternating
        // (member 1 = lag-2 seasonal naive is right).
        let mut lvl = Smoothing::new(0.3, 0.0, 1.0);
        let mut sn = SeasonalNaive::new(2);
        let mut ens = Ensemble::new(2, 0.05, 0.5);
        let avail = [true, true];
        let y_at = |i: usize| -> f64 {
            if i < 300 {
                10.0
            } else if i.is_multiple_of(2) {
                2.0
            } else {
                18.0
            }
        };
        let mut w_mid = vec![];
        for i in 0..600 {
            let y = y_at(i);
            if sn.ready() {
                ens.score(0, y, lvl.forecast(1.0), 10.0);
                ens.score(1, y, sn.forecast(1).unwrap(), 10.0);
            }
            lvl.update(y);
            sn.update(y);
            if i == 299 {
                w_mid = ens.weights(&avail);
            }
        }
        let w_end = ens.weights(&avail);
        // Both are right in the constant phase; after the switch the seasonal member wins.
        assert!(w_mid[0] > 0.3, "{w_mid:?}");
        assert!(w_end[1] > 0.9, "{w_end:?}");
    }

    #[test]
    fn weighted_records_count_as_shares_and_forget_by_weight() {
        // Ten records of weight 0.1 weigh as much as one of weight 1.
        let mut a = QuantileTracker::new(-1.0, 1.0, 200, 1024.0);
        let mut b = QuantileTracker::new(-1.0, 1.0, 200, 1024.0);
        for i in 0..100 {
            let x = -1.0 + 2.0 * (i as f64 + 0.5) / 100.0;
            for _ in 0..10 {
                a.record_weighted(x, 0.1);
            }
            b.record(x);
        }
        assert!((a.count() - b.count()).abs() < 1e-6, "{} vs {}", a.count(), b.count());
        assert_eq!(a.quantile(0.9), b.quantile(0.9));
        // Forgetting is by weight: 400 records of weight 0.1 (40 < 64) keep every old one,
        // while 400 unit records halve the history several times.
        let mut light = QuantileTracker::new(-1.0, 1.0, 200, 64.0);
        let mut heavy = QuantileTracker::new(-1.0, 1.0, 200, 64.0);
        for _ in 0..200 {
            light.record_weighted(-0.5, 0.1);
            heavy.record(-0.5);
        }
        for _ in 0..200 {
            light.record_weighted(0.5, 0.1);
            heavy.record(0.5);
        }
        assert!((light.share_above(0.0) - 0.5).abs() < 1e-9, "{}", light.share_above(0.0));
        assert!(heavy.share_above(0.0) > 0.9, "{}", heavy.share_above(0.0));
        // Zero, negative and non-finite weights are ignored.
        let before = light.count();
        light.record_weighted(0.0, 0.0);
        light.record_weighted(0.0, -1.0);
        light.record_weighted(0.0, f64::NAN);
        assert_eq!(light.count(), before);
    }

    #[test]
    fn quantile_tracker() {
        let mut q = QuantileTracker::new(-1.0, 1.0, 200, 10_000.0);
        for i in 0..1000 {
            q.record(-1.0 + 2.0 * (i as f64 + 0.5) / 1000.0);
        }
        let q90 = q.quantile(0.9).unwrap();
        assert!((q90 - 0.8).abs() < 0.02, "{q90}");
        assert!((q.share_above(0.8) - 0.1).abs() < 0.02);
        q.record(f64::NAN);
        assert!(q.quantile(f64::NAN).is_none());
    }

    #[test]
    fn one_pass_quantiles_match_single_queries() {
        let mut q = QuantileTracker::new(-3.0, 5.0, 640, 1024.0);
        assert!(q.quantiles(&[0.5, 0.9]).is_none());
        // A skewed, gappy sample with repeated values.
        for i in 0..700u64 {
            let x = ((i * 7919) % 97) as f64 / 40.0 - 1.0 + if i % 13 == 0 { 2.5 } else { 0.0 };
            q.record_weighted(x, 0.05 + (i % 5) as f64 * 0.1);
        }
        let qs = [0.0, 0.5, 0.7, 0.9, 0.9, 0.99, 0.998, 1.0];
        let all = q.quantiles(&qs).unwrap();
        for (k, &p) in qs.iter().enumerate() {
            assert_eq!(all[k], q.quantile(p).unwrap(), "q{p}");
        }
        // Not ascending, or not finite: no answer rather than a wrong one.
        assert!(q.quantiles(&[0.9, 0.5]).is_none());
        assert!(q.quantiles(&[0.5, f64::NAN]).is_none());
    }
}
