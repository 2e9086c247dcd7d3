//! Idle-time statistics for scale-to-zero and wake-up (the hybrid-histogram idea):
//! a histogram of the lengths of idle gaps (time from the last arrival to the next one),
//! geometric bins from 1 s to ~16 days, with exponential forgetting so it adapts.

use serde::{Deserialize, Serialize};

const BINS: usize = 64;
const MIN_S: f64 = 1.0;
/// Ratio between consecutive bin edges: 64 bins cover 1 s … ~16 days.
const GROWTH: f64 = 1.2574;
/// When the total weight exceeds this, every count is halved (forgetting).
const MAX_WEIGHT: f64 = 256.0;

/// Histogram of idle-gap lengths.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleHistogram {
    counts: Vec<f64>,
    total: f64,
}

impl Default for IdleHistogram {
    fn default() -> Self {
        IdleHistogram { counts: vec![0.0; BINS], total: 0.0 }
    }
}

fn edge(i: usize) -> f64 {
    MIN_S * GROWTH.powi(i as i32)
}

fn bin_of(gap_s: f64) -> usize {
    if gap_s <= MIN_S {
        return 0;
    }
    let i = ((gap_s / MIN_S).ln() / GROWTH.ln()).floor();
    (i.max(0.0) as usize).min(BINS - 1)
}

impl IdleHistogram {
    /// Record one completed idle gap (ignored unless finite and > 0).
    pub fn record(&mut self, gap_s: f64) {
        if !(gap_s.is_finite() && gap_s > 0.0) {
            return;
        }
        self.counts[bin_of(gap_s)] += 1.0;
        self.total += 1.0;
        if self.total > MAX_WEIGHT {
            for c in &mut self.counts {
                *c *= 0.5;
            }
            self.total *= 0.5;
        }
    }

    /// Weight of recorded gaps (decayed count).
    pub fn count(&self) -> f64 {
        self.total
    }

    /// Survival S(τ) = P(gap > τ), interpolating linearly inside a bin.
    pub fn survival(&self, tau_s: f64) -> f64 {
        if self.total <= 0.0 {
            return 1.0;
        }
        if !tau_s.is_finite() {
            return if tau_s > 0.0 { 0.0 } else { 1.0 };
        }
        if tau_s <= 0.0 {
            return 1.0;
        }
        let mut below = 0.0;
        for i in 0..BINS {
            let lo = if i == 0 { 0.0 } else { edge(i) };
            let hi = edge(i + 1);
            if tau_s >= hi {
                below += self.counts[i];
            } else {
                if tau_s > lo {
                    below += self.counts[i] * (tau_s - lo) / (hi - lo);
                }
                break;
            }
        }
        ((self.total - below) / self.total).clamp(0.0, 1.0)
    }

    /// The `p` percentile of gap length (None while empty).
    pub fn percentile(&self, p: f64) -> Option<f64> {
        if self.total <= 0.0 || !p.is_finite() {
            return None;
        }
        let target = p.clamp(0.0, 1.0) * self.total;
        let mut acc = 0.0;
        for i in 0..BINS {
            let c = self.counts[i];
            if c > 0.0 && acc + c >= target {
                let lo = if i == 0 { 0.0 } else { edge(i) };
                let hi = edge(i + 1);
                let f = ((target - acc) / c).clamp(0.0, 1.0);
                return Some(lo + f * (hi - lo));
            }
            acc += c;
        }
        Some(edge(BINS))
    }

    /// P(the gap ends within `(τ, τ + h]` | it has lasted τ so far). Before any gap was
    /// seen, returns `prior`.
    pub fn p_end_within(&self, tau_s: f64, h_s: f64, prior: f64) -> f64 {
        if self.total < 1.0 {
            return prior.clamp(0.0, 1.0);
        }
        let s0 = self.survival(tau_s.max(0.0));
        if s0 <= 1e-12 {
            // Longer than anything seen: fall back to the prior.
            return prior.clamp(0.0, 1.0);
        }
        let s1 = self.survival(tau_s.max(0.0) + h_s.max(0.0));
        ((s0 - s1) / s0).clamp(0.0, 1.0)
    }

    /// E[remaining gap | lasted τ] from the histogram (bin midpoints); `None` when the
    /// gap already outlasted everything seen.
    pub fn expected_remaining(&self, tau_s: f64) -> Option<f64> {
        if self.total <= 0.0 {
            return None;
        }
        let tau = if tau_s.is_finite() { tau_s.max(0.0) } else { 0.0 };
        let mut w = 0.0;
        let mut sum = 0.0;
        for i in 0..BINS {
            let lo = if i == 0 { 0.0 } else { edge(i) };
            let hi = edge(i + 1);
            if hi <= tau {
                continue;
            }
            let a = lo.max(tau);
            let frac = (hi - a) / (hi - lo);
            let c = self.counts[i] * frac;
            w += c;
            sum += c * ((a + hi) * 0.5 - tau);
        }
        if w <= 1e-12 {
            None
        } else {
            Some(sum / w)
        }
    }

    pub fn approx_heap_bytes(&self) -> usize {
        self.counts.capacity() * std::mem::size_of::<f64>()
    }
}

/// Idle tracking: the open gap plus the histogram of closed ones.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IdleTracker {
    pub hist: IdleHistogram,
    /// End of the last second that carried arrivals.
    pub last_arrival_t: Option<f64>,
    /// Start of the current activity (after the last recorded gap).
    pub busy_since: Option<f64>,
}

impl IdleTracker {
    /// Feed one sample `(t - dt, t]`; `active` = it carried arrivals.
    pub fn observe(&mut self, t_s: f64, dt_s: f64, active: bool) {
        if !t_s.is_finite() || !active {
            return;
        }
        let start = t_s - if dt_s.is_finite() { dt_s.max(0.0) } else { 0.0 };
        if let Some(last) = self.last_arrival_t {
            let gap = start - last;
            // A "gap" shorter than a couple of samples is just sampling noise.
            if gap > dt_s.max(1.0) + 1e-9 {
                self.hist.record(gap);
                self.busy_since = Some(start);
            }
        } else {
            self.busy_since = Some(start);
        }
        self.last_arrival_t = Some(t_s);
    }

    /// Length of the current idle gap at `t` (0 when an arrival just happened).
    pub fn idle_for(&self, t_s: f64) -> f64 {
        match self.last_arrival_t {
            Some(l) if t_s.is_finite() => (t_s - l).max(0.0),
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut h = IdleHistogram::default();
        for i in 1..=100 {
            h.record(i as f64 * 60.0);
        }
        let p50 = h.percentile(0.5).unwrap();
        assert!((p50 - 3000.0).abs() < 500.0, "{p50}");
        let p99 = h.percentile(0.99).unwrap();
        assert!(p99 > 5000.0 && p99 < 7500.0, "{p99}");
        let p05 = h.percentile(0.05).unwrap();
        assert!(p05 > 200.0 && p05 < 400.0, "{p05}");
        assert!(h.percentile(0.1).unwrap() <= h.percentile(0.9).unwrap());
    }

    #[test]
    fn hazard_and_remaining() {
        let mut h = IdleHistogram::default();
        for _ in 0..50 {
            h.record(600.0);
            h.record(36000.0);
        }
        // Just past 600 s, the remaining gaps are the long ones.
        let p = h.p_end_within(800.0, 300.0, 0.5);
        assert!(p < 0.05, "{p}");
        let p = h.p_end_within(450.0, 300.0, 0.5);
        assert!(p > 0.3, "{p}");
        let r = h.expected_remaining(1000.0).unwrap();
        assert!(r > 20000.0, "{r}");
        assert!(h.survival(1e9) < 1e-9);
    }

    #[test]
    fn tracker_records_gaps() {
        let mut t = IdleTracker::default();
        for s in 1..=10 {
            t.observe(s as f64, 1.0, true);
        }
        t.observe(500.0, 1.0, true);
        assert!((t.hist.count() - 1.0).abs() < 1e-12);
        assert!((t.idle_for(600.0) - 100.0).abs() < 1e-9);
        let p = t.hist.percentile(0.5).unwrap();
        assert!(p > 350.0 && p < 600.0, "{p}");
    }
}
