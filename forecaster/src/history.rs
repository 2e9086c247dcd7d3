//! Bounded, tiered demand history.
//!
//! Arrival mass is accumulated into fixed-width buckets held in ring buffers, one ring per
//! tier: fine buckets for the recent hours, coarser ones for up to 8 days, so that daily and
//! weekly cycles stay visible while memory stays constant however long the history runs.
//! Samples may arrive at irregular spacing: the mass of a sample covering `(t - dt, t]` is
//! spread uniformly over the buckets that interval overlaps.

use serde::{Deserialize, Serialize};

/// One tier: `len` buckets of `width_s` seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TierSpec {
    pub width_s: f64,
    pub len: usize,
}

/// The default tiers: 5 s for 3 h, 60 s for 24 h, 300 s for 8 days.
pub const DEFAULT_TIERS: [TierSpec; 3] = [
    TierSpec { width_s: 5.0, len: 2160 },
    TierSpec { width_s: 60.0, len: 1440 },
    TierSpec { width_s: 300.0, len: 2304 },
];

#[derive(Debug, Clone)]
struct Tier {
    spec: TierSpec,
    /// Arrival mass per bucket; bucket with absolute index `k` lives at `k % len`.
    mass: Vec<f32>,
    /// Absolute index of the newest bucket that has been opened (`None` before any sample).
    newest: Option<i64>,
}

impl Tier {
    fn new(spec: TierSpec) -> Self {
        Tier { spec, mass: vec![0.0; spec.len], newest: None }
    }

    fn slot(&self, k: i64) -> usize {
        k.rem_euclid(self.spec.len as i64) as usize
    }

    /// Open every bucket up to absolute index `k` (clearing recycled slots).
    fn advance_to(&mut self, k: i64) {
        match self.newest {
            None => {
                self.newest = Some(k);
                let s = self.slot(k);
                self.mass[s] = 0.0;
            }
            Some(n) if k > n => {
                let steps = (k - n).min(self.spec.len as i64);
                for j in 0..steps {
                    let s = self.slot(k - j);
                    self.mass[s] = 0.0;
                }
                self.newest = Some(k);
            }
            _ => {}
        }
    }

    fn add(&mut self, t0: f64, t1: f64, mass: f64) {
        let w = self.spec.width_s;
        let k_end = bucket_of(t1, w);
        self.advance_to(k_end);
        let newest = self.newest.unwrap_or(k_end);
        let oldest = newest - self.spec.len as i64 + 1;
        let span = t1 - t0;
        if span <= 0.0 {
            if k_end >= oldest && k_end <= newest {
                let s = self.slot(k_end);
                self.mass[s] += mass as f32;
            }
            return;
        }
        let k_start = bucket_of(t0, w).max(oldest);
        let mut k = k_start;
        while k <= k_end {
            let b0 = (k as f64 * w).max(t0);
            let b1 = ((k + 1) as f64 * w).min(t1);
            if b1 > b0 && k >= oldest && k <= newest {
                let s = self.slot(k);
                self.mass[s] += (mass * (b1 - b0) / span) as f32;
            }
            k += 1;
        }
    }

    fn mass_at(&self, k: i64) -> Option<f64> {
        let n = self.newest?;
        if k > n || k <= n - self.spec.len as i64 {
            return None;
        }
        Some(self.mass[self.slot(k)] as f64)
    }
}

/// Index of the bucket holding the end of a sample ending at `t` (a sample ending exactly on
/// a boundary belongs to the bucket before it).
fn bucket_of(t: f64, w: f64) -> i64 {
    let x = t / w;
    let f = x.floor();
    let k = if (x - f).abs() < 1e-9 && t > 0.0 { f as i64 - 1 } else { f as i64 };
    k.max(i64::MIN / 4)
}

/// A point of the history for display: bucket start and mean rate over the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HistoryPoint {
    pub t_s: f64,
    pub rate: f64,
}

/// Tiered demand history with a constant memory bound.
#[derive(Debug, Clone)]
pub struct DemandHistory {
    tiers: Vec<Tier>,
    last_t: Option<f64>,
    /// Start of the first sample's interval.
    first_t: Option<f64>,
}

impl Default for DemandHistory {
    fn default() -> Self {
        Self::new(&DEFAULT_TIERS)
    }
}

impl DemandHistory {
    /// A history with the given tiers (widths and lengths are sanitized: width ≥ 1 s,
    /// 1 ≤ len ≤ 100 000).
    pub fn new(specs: &[TierSpec]) -> Self {
        let tiers = specs
            .iter()
            .map(|s| {
                let width_s = if s.width_s.is_finite() && s.width_s >= 1.0 { s.width_s } else { 1.0 };
                Tier::new(TierSpec { width_s, len: s.len.clamp(1, 100_000) })
            })
            .collect();
        DemandHistory { tiers, last_t: None, first_t: None }
    }

    /// Record arrival mass observed over `(t - dt, t]`. Non-finite or negative inputs are
    /// ignored (mass) or clamped (dt); samples older than the newest one are clipped to it.
    pub fn observe(&mut self, t_s: f64, dt_s: f64, mass: f64) {
        if !(0.0..=1e12).contains(&t_s) {
            return;
        }
        let mass = if mass.is_finite() && mass > 0.0 { mass } else { 0.0 };
        let dt = if dt_s.is_finite() && dt_s > 0.0 { dt_s } else { 0.0 };
        let mut t0 = (t_s - dt).max(0.0);
        if let Some(last) = self.last_t {
            if t_s < last {
                return;
            }
            t0 = t0.max(last.min(t_s));
        }
        for tier in &mut self.tiers {
            tier.add(t0, t_s, mass);
        }
        self.first_t.get_or_insert(t0);
        self.last_t = Some(t_s);
    }

    /// Time of the newest sample.
    pub fn last_t(&self) -> Option<f64> {
        self.last_t
    }

    /// The mean rate over consecutive `step_s`-second intervals that end at the newest
    /// sample (at the start of the finest tier's bucket it falls in), back to the first sample
    /// (from the first whole bucket after it) or as far as the coarsest tier retains,
    /// whichever is later: the first interval's start and the rates (each from the finest tier that still
    /// covers it). None before a sample, for a step under 1 s, or when less than one step is
    /// known. It hands one history to another planner (`serve`, after an edit of a
    /// ScaledObject's metadata).
    pub fn series(&self, step_s: f64) -> Option<(f64, Vec<f64>)> {
        let (first, last) = (self.first_t?, self.last_t?);
        if !(step_s.is_finite() && step_s >= 1.0) {
            return None;
        }
        let coarsest = self.tiers.last()?;
        let retained_from = (coarsest.newest? - coarsest.spec.len as i64 + 1) as f64 * coarsest.spec.width_s;
        // From the first whole bucket of the finest tier that holds the first sample: a bucket
        // the first sample cut would read its mass spread over the part before it too.
        let w = self
            .tiers
            .iter()
            .find(|t| t.newest.is_some_and(|n| (first / t.spec.width_s).floor() as i64 > n - t.spec.len as i64))
            .map_or(coarsest.spec.width_s, |t| t.spec.width_s);
        let whole = (first / w).ceil() * w;
        // ...up to the last whole bucket of the finest tier, for the same reason.
        let fine = self.tiers.first()?.spec.width_s;
        let end = (last / fine).floor() * fine;
        let count = ((end - whole.max(retained_from)) / step_s).floor();
        if count.is_nan() || count < 1.0 {
            return None;
        }
        let t0 = end - count * step_s;
        let rates = (0..count as usize)
            .map(|i| {
                let a = t0 + i as f64 * step_s;
                self.mass_between(a, a + step_s) / step_s
            })
            .collect();
        Some((t0, rates))
    }

    /// Tier specs in order (finest first).
    pub fn tiers(&self) -> Vec<TierSpec> {
        self.tiers.iter().map(|t| t.spec).collect()
    }

    /// Mean rate of the bucket of tier `tier` holding time `t` (None if not retained).
    pub fn rate_at(&self, tier: usize, t: f64) -> Option<f64> {
        let tr = self.tiers.get(tier)?;
        if !t.is_finite() {
            return None;
        }
        let k = (t / tr.spec.width_s).floor() as i64;
        tr.mass_at(k).map(|m| m / tr.spec.width_s)
    }

    /// Arrival mass over `[t0, t1)` from the finest tier that still covers `t0`
    /// (buckets partially covered contribute pro rata).
    pub fn mass_between(&self, t0: f64, t1: f64) -> f64 {
        if !(t0.is_finite() && t1.is_finite()) || t1 <= t0 {
            return 0.0;
        }
        for tr in &self.tiers {
            let Some(n) = tr.newest else { return 0.0 };
            let w = tr.spec.width_s;
            let oldest = n - tr.spec.len as i64 + 1;
            if (t0 / w).floor() as i64 >= oldest {
                let mut sum = 0.0;
                let k0 = (t0 / w).floor() as i64;
                let k1 = ((t1 / w).ceil() as i64 - 1).min(n);
                let mut k = k0;
                while k <= k1 {
                    let b0 = (k as f64 * w).max(t0);
                    let b1 = ((k + 1) as f64 * w).min(t1);
                    if b1 > b0 {
                        sum += tr.mass_at(k).unwrap_or(0.0) * (b1 - b0) / w;
                    }
                    k += 1;
                }
                return sum;
            }
        }
        0.0
    }

    /// The retained points of one tier, oldest first (at most `max_points`, newest kept).
    pub fn points(&self, tier: usize, max_points: usize) -> Vec<HistoryPoint> {
        let Some(tr) = self.tiers.get(tier) else {
            return Vec::new();
        };
        let Some(n) = tr.newest else {
            return Vec::new();
        };
        let count = (tr.spec.len).min(max_points) as i64;
        let first = (n - count + 1).max(0);
        (first..=n)
            .filter_map(|k| {
                tr.mass_at(k).map(|m| HistoryPoint { t_s: k as f64 * tr.spec.width_s, rate: m / tr.spec.width_s })
            })
            .collect()
    }

    /// Heap bytes held (constant after construction).
    pub fn approx_heap_bytes(&self) -> usize {
        self.tiers.capacity() * std::mem::size_of::<Tier>()
            + self.tiers.iter().map(|t| t.mass.capacity() * std::mem::size_of::<f32>()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_and_downsampling() {
        let mut h = DemandHistory::default();
        // 10 days of 1 req/s, sampled every 5 s.
        let mut t = 0.0;
        while t < 10.0 * 86400.0 {
            t += 5.0;
            h.observe(t, 5.0, 5.0);
        }
        // Fine tier: only the last 3 h remain.
        assert!(h.rate_at(0, t - 3600.0).is_some());
        assert!(h.rate_at(0, t - 4.0 * 3600.0).is_none());
        // Coarse tier keeps 8 days, not 9.
        assert!(h.rate_at(2, t - 7.5 * 86400.0).is_some());
        assert!(h.rate_at(2, t - 9.0 * 86400.0).is_none());
        // Downsampled rates are preserved.
        let r = h.rate_at(2, t - 86400.0).unwrap();
        assert!((r - 1.0).abs() < 1e-6, "{r}");
        let r = h.rate_at(1, t - 3600.0).unwrap();
        assert!((r - 1.0).abs() < 1e-6, "{r}");
        let m = h.mass_between(t - 600.0, t);
        assert!((m - 600.0).abs() < 1e-3, "{m}");
    }

    #[test]
    fn a_series_hands_over_what_is_known_at_each_tiers_resolution() {
        let mut h = DemandHistory::default();
        assert_eq!(h.series(5.0), None, "nothing observed");
        // Two days from t = 1000 s: 2 req/s by day, 0 by night, sampled every 5 s.
        let day = 86400.0;
        let rate = |t: f64| if (t % day) < day / 2.0 { 2.0 } else { 0.0 };
        let mut t = 1000.0;
        while t < 1000.0 + 2.0 * day {
            t += 5.0;
            h.observe(t, 5.0, 5.0 * rate(t - 5.0));
        }
        let (t0, rates) = h.series(5.0).unwrap();
        // From the first sample (not the zeros of the coarse tier's earlier buckets).
        assert!((1000.0..=1205.0).contains(&t0), "from the first whole 300-s bucket: {t0}");
        assert!((t0 + rates.len() as f64 * 5.0 - t).abs() <= 5.0, "ends at the newest sample");
        let total: f64 = rates.iter().map(|r| r * 5.0).sum();
        let end = t0 + rates.len() as f64 * 5.0;
        // (mass_between reads the whole span from the coarse tier, pro rata at its ends.)
        assert!((total - h.mass_between(t0, end)).abs() < 1e-3 * total.max(1.0), "{total}");
        // Recent hours at 5 s, the day before at 300 s: the day/night edges stay within a bucket.
        for (i, &r) in rates.iter().enumerate() {
            let a = t0 + i as f64 * 5.0;
            let edge = (a % (day / 2.0)).min(day / 2.0 - a % (day / 2.0)) < 300.0;
            if !edge {
                assert!((r - rate(a)).abs() < 1e-3, "at {a}: {r} vs {}", rate(a));
            }
        }
        assert_eq!(h.series(0.5), None, "a step under a second");
        // A few seconds of history: from the first whole 5-s bucket, at 1-s steps.
        let mut short = DemandHistory::default();
        for i in 1..=12 {
            short.observe(1000.0 + i as f64, 1.0, 3.0);
        }
        let (t0, rates) = short.series(1.0).unwrap();
        assert!((1000.0..=1005.0).contains(&t0), "{t0}");
        assert!(rates.len() >= 5 && rates.iter().all(|r| (r - 3.0).abs() < 1e-9), "{rates:?}");
        assert_eq!(h.series(f64::NAN), None);
        // Ten days: the series goes back as far as the coarsest tier, 8 days.
        let mut long = DemandHistory::default();
        let mut t = 0.0;
        while t < 10.0 * day {
            t += 60.0;
            long.observe(t, 60.0, 60.0);
        }
        let (t0, rates) = long.series(60.0).unwrap();
        assert!((t - t0 - 8.0 * day).abs() <= 300.0, "{}", (t - t0) / day);
        assert!(rates.iter().all(|r| (r - 1.0).abs() < 1e-6));
    }

    proptest::proptest! {
        /// Whatever was observed (gaps, irregular spacing, bursts), a series is finite, never
        /// negative, no longer than the coarsest tier retains, and carries the mass the history
        /// holds over its span.
        #[test]
        fn a_series_is_bounded_and_keeps_the_mass(
            samples in proptest::collection::vec((0.5f64..4000.0, 0.0f64..50.0), 1..200),
            start in 0.0f64..1e9,
            step in 1.0f64..900.0,
        ) {
            let mut h = DemandHistory::default();
            let mut t = start;
            for (gap, rate) in samples {
                t += gap;
                h.observe(t, gap, rate * gap);
            }
            if let Some((t0, rates)) = h.series(step) {
                proptest::prop_assert!(!rates.is_empty());
                proptest::prop_assert!(rates.len() as f64 * step <= 8.0 * 86400.0 + 300.0 + step);
                proptest::prop_assert!(t0 + 1e-6 >= start && t0 + rates.len() as f64 * step <= t + 1e-6);
                proptest::prop_assert!(rates.iter().all(|r| r.is_finite() && *r >= 0.0));
                let total: f64 = rates.iter().map(|r| r * step).sum();
                let held = h.mass_between(t0, t0 + rates.len() as f64 * step);
                // (mass_between reads the whole span from one tier, pro rata at its ends.)
                let slack = 2.0 * 300.0 * 50.0;
                proptest::prop_assert!((total - held).abs() <= slack, "{total} vs {held}");
            }
        }
    }

    #[test]
    fn irregular_samples_spread_mass() {
        let mut h = DemandHistory::new(&[TierSpec { width_s: 10.0, len: 10 }]);
        h.observe(3.0, 3.0, 3.0);
        h.observe(17.0, 14.0, 14.0); // 7 in [3,10), 7 in [10,17)
        assert!((h.rate_at(0, 5.0).unwrap() - 1.0).abs() < 1e-6);
        assert!((h.rate_at(0, 12.0).unwrap() - 0.7).abs() < 1e-6);
        // Garbage is ignored.
        h.observe(f64::NAN, 1.0, 5.0);
        h.observe(18.0, f64::INFINITY, -4.0);
        h.observe(19.0, 1.0, f64::NAN);
        assert!((h.rate_at(0, 12.0).unwrap() - 0.7).abs() < 1e-6);
    }

    #[test]
    fn memory_is_bounded() {
        let mut h = DemandHistory::default();
        let before = h.approx_heap_bytes();
        let mut t = 0.0;
        for i in 0..(30 * 86400 / 5) {
            t += 5.0;
            h.observe(t, 5.0, (i % 7) as f64);
        }
        assert_eq!(before, h.approx_heap_bytes());
        assert!(before < 64 * 1024, "{before}");
        assert_eq!(h.points(0, 100).len(), 100);
    }
}
