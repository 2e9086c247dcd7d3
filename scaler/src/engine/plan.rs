//! Signals → demand → plan. Pure functions of the latest readings (no I/O, no clock):
//! the per-ScaledObject task calls them once per tick.

use serde::Serialize;

use crate::config::{Mode, PlannerSettings};

/// One signal as it stood at a tick.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalView {
    pub kind: &'static str,
    pub label: String,
    pub per_replica: f64,
    /// Last good value and its replica-equivalents (`value / perReplica`).
    pub value: Option<f64>,
    pub replicas: Option<f64>,
    pub active: bool,
    pub last_good_ms: Option<u64>,
    pub last_error: Option<String>,
    pub last_error_ms: Option<u64>,
    pub failures: u32,
    pub detail: std::collections::BTreeMap<&'static str, f64>,
}

impl SignalView {
    /// A good reading of `kind` with only these detail figures (tests of what reads them).
    #[cfg(test)]
    pub(crate) fn with_detail(kind: &'static str, detail: &[(&'static str, f64)]) -> Self {
        SignalView {
            kind,
            label: kind.into(),
            per_replica: 1.0,
            value: Some(0.0),
            replicas: Some(0.0),
            active: true,
            last_good_ms: Some(1),
            last_error: None,
            last_error_ms: None,
            failures: 0,
            detail: detail.iter().copied().collect(),
        }
    }
}

/// The combined demand: the max over signals of replica-equivalents (the HPA's rule).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Demand {
    pub replicas: f64,
    /// Index of the signal that drove the max.
    pub driver: Option<usize>,
    /// KEDA activation: any signal active.
    pub active: bool,
}

/// Combine the signals that have a good reading. `None` when none has one yet.
pub fn combine(signals: &[SignalView]) -> Option<Demand> {
    let mut out: Option<Demand> = None;
    for (i, s) in signals.iter().enumerate() {
        let Some(r) = s.replicas else { continue };
        let d = out.get_or_insert(Demand { replicas: 0.0, driver: Some(i), active: false });
        if r > d.replicas || d.driver.is_none() {
            d.replicas = r;
            d.driver = Some(i);
        }
        d.active |= s.active;
    }
    out
}

/// `ceil(x)` forgiving float noise (20/20·(1+ε) is 1 replica, not 2).
pub fn ceil_replicas(x: f64) -> u32 {
    if !x.is_finite() || x <= 0.0 {
        return 0;
    }
    let c = (x - 1e-9).ceil();
    if c >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        c.max(0.0) as u32
    }
}

/// The reactive answer: `ceil(max value/perReplica)` while active (at least 1),
/// 0 when no signal is active; clamped to `[minReplicas, maxReplicas]`, except that with
/// `scaleToZero` an idle 0 stays 0 (`minReplicas` is then the floor of a woken fleet, as
/// KEDA's `minReplicaCount` is beside `idleReplicaCount: 0`).
pub fn reactive(d: &Demand, s: &PlannerSettings) -> (u32, String) {
    let raw = if d.active { ceil_replicas(d.replicas).max(1) } else { 0 };
    let plan = if raw == 0 && s.scale_to_zero { 0 } else { raw.clamp(s.min_replicas, s.max_replicas) };
    let reason = if !d.active {
        "reactive: no signal above its activation threshold".to_string()
    } else {
        format!("reactive: ceil({:.3}) replica-equivalents", d.replicas)
    };
    (plan, if plan != raw { format!("{reason}, clamped to [{}, {}]", s.min_replicas, s.max_replicas) } else { reason })
}

/// Whether the answer to KEDA is the planner's (otherwise the reactive one).
pub fn planner_answers(mode: Mode) -> bool {
    mode == Mode::Predictive
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ForecastModel, Warmup};

    fn sig(replicas: Option<f64>, active: bool) -> SignalView {
        SignalView {
            kind: "rabbitmq",
            label: "x".into(),
            per_replica: 1.0,
            value: replicas,
            replicas,
            active,
            last_good_ms: replicas.map(|_| 1),
            last_error: None,
            last_error_ms: None,
            failures: 0,
            detail: Default::default(),
        }
    }

    fn settings() -> PlannerSettings {
        PlannerSettings {
            mode: Mode::Reactive,
            warmup: Warmup::Seconds(60.0),
            capacity_per_replica: None,
            slo_seconds: 5.0,
            scale_to_zero: true,
            forecast_model: ForecastModel::Auto,
            min_replicas: 0,
            max_replicas: 10,
            hpa_tolerance: 0.1,
        }
    }

    #[test]
    fn max_of_signals_drives_and_names_the_driver() {
        let d = combine(&[sig(Some(1.5), true), sig(Some(3.2), false), sig(None, false)]).unwrap();
        assert_eq!(d.replicas, 3.2);
        assert_eq!(d.driver, Some(1));
        assert!(d.active);
        assert_eq!(reactive(&d, &settings()).0, 4);
        assert!(combine(&[sig(None, false)]).is_none());
    }

    #[test]
    fn inactive_means_zero_and_clamps_apply() {
        let d = Demand { replicas: 0.4, driver: Some(0), active: false };
        assert_eq!(reactive(&d, &settings()).0, 0);
        let d = Demand { replicas: 0.4, driver: Some(0), active: true };
        assert_eq!(reactive(&d, &settings()).0, 1);
        let d = Demand { replicas: 55.0, driver: Some(0), active: true };
        let (p, why) = reactive(&d, &settings());
        assert_eq!(p, 10);
        assert!(why.contains("clamped"));
    }

    #[test]
    fn with_scale_to_zero_min_replicas_floors_a_woken_fleet_and_idle_stays_zero() {
        // KEDA's idleReplicaCount: 0 beside minReplicaCount: 3.
        let s = PlannerSettings { min_replicas: 3, ..settings() };
        let idle = Demand { replicas: 0.0, driver: Some(0), active: false };
        assert_eq!(reactive(&idle, &s).0, 0, "an idle fleet must answer 0, or IsActive never turns false");
        let woken = Demand { replicas: 0.4, driver: Some(0), active: true };
        assert_eq!(reactive(&woken, &s).0, 3);
        // Without scaleToZero minReplicas is a floor at all times.
        let s = PlannerSettings { scale_to_zero: false, ..s };
        assert_eq!(reactive(&idle, &s).0, 3);
    }

    #[test]
    fn ceil_forgives_float_noise() {
        assert_eq!(ceil_replicas(1.0 + 1e-12), 1);
        assert_eq!(ceil_replicas(1.01), 2);
        assert_eq!(ceil_replicas(f64::NAN), 0);
        assert_eq!(ceil_replicas(-3.0), 0);
        assert_eq!(ceil_replicas(1e30), u32::MAX);
    }
}
