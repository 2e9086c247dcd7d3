//! Online detection of a time grid of change points (aggregated rate series).

/// Change-point grid detector: are the demand's change points all on a grid of period P?
#[derive(Debug, Clone, Default)]
pub(super) struct GridDetector {
    pub(super) first: Option<i64>,
    pub(super) period: i64,
    pub(super) changes: u64,
    pub(super) broken: bool,
    pub(super) last_rate: Option<f64>,
}

pub(super) fn gcd(mut a: i64, mut b: i64) -> i64 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        let r = a % b;
        a = b;
        b = r;
    }
    a
}

impl GridDetector {
    /// Observe the rate of the sample starting at `t_start`; true when it is a change from the
    /// previous sample's (whether or not it keeps the grid).
    pub(super) fn observe(&mut self, t_start: f64, rate: f64, min_period: f64) -> bool {
        if self.broken {
            return false;
        }
        let Some(prev) = self.last_rate else {
            self.last_rate = Some(rate);
            return false;
        };
        self.last_rate = Some(rate);
        let tol = 1e-9 * prev.abs().max(rate.abs()).max(1.0);
        if (rate - prev).abs() <= tol {
            return false;
        }
        let r = t_start.round();
        if (t_start - r).abs() > 1e-6 {
            self.broken = true;
            return true;
        }
        let c = r as i64;
        match self.first {
            None => self.first = Some(c),
            Some(f) => {
                self.period = gcd(self.period, c - f);
                if self.period > 0 && (self.period as f64) < min_period {
                    self.broken = true;
                }
            }
        }
        self.changes += 1;
        true
    }

    pub(super) fn period(&self) -> Option<f64> {
        if self.broken || self.changes < 4 || self.period <= 0 {
            None
        } else {
            Some(self.period as f64)
        }
    }

    /// The first grid point not yet observed when data up to `known` has been seen
    /// (a change at `b` shows in the sample starting at `b`).
    pub(super) fn next_change(&self, known: f64) -> Option<f64> {
        let p = self.period()?;
        let f = self.first? as f64;
        let k = ((known - f) / p - 1e-9).ceil();
        Some(f + k * p)
    }
}
