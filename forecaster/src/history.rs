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
        DemandHistory { tiers, last_t: None }
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
        self.last_t = Some(t_s);
    }

    /// Time of the newest sample.
    pub fn last_t(&self) -> Option<f64> {
        self.last_t
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
