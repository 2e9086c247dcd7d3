//! The planner as `serve` runs it: one pure step per tick, time as an argument, so
//! tests drive it with recorded demand and a paused clock.
//!
//! Units: the planner sees demand in replica-equivalents (capacity 1 per replica) — the
//! max over signals of `value / perReplica`, the HPA's view. With `capacityPerReplica`,
//! a signal that reports an arrival rate (RabbitMQ `publish_rate`) contributes
//! `rate / capacityPerReplica` replica-equivalents too, so a rising arrival rate is seen
//! before the backlog builds.

use prescale_forecaster::planner::PlannerError;
use prescale_forecaster::{Decision, ForecastModel as FM, Planner, PlannerConfig, WarmupDist};

use super::plan::{Demand, SignalView};
use crate::config::{ForecastModel, PlannerSettings, Warmup};

pub struct Predictor {
    planner: Planner,
    settings: PlannerSettings,
    last_t: Option<f64>,
    /// The count the HPA holds after our answers (see [`super::hpa`]); 0 before the first.
    hpa_count: u32,
    /// The scale target's pods as the cluster sees them for the next step. Taken by
    /// [`Predictor::step`]; without it the fleet is `hpa_count`, all ready.
    fleet: Option<PlannedFleet>,
    /// The fleet the last step planned from.
    pub planned_from: PlannedFleet,
    /// Set when the last answer differs from the plan because of the HPA's tolerance.
    pub tolerance_note: Option<String>,
}

/// The fleet one planning step started from, and where its counts came from.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PlannedFleet {
    pub ready: u32,
    pub warming: u32,
    pub source: FleetSource,
}

/// Where a [`PlannedFleet`]'s counts came from.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum FleetSource {
    /// Modelled from our own answers (no cluster view).
    #[default]
    Answers,
    /// The scale target's pods (the cluster's pod watch), every pod counted.
    Pods,
    /// The target's pods, counted up to its live `spec.replicas`.
    PodsAndSpec,
}

impl PlannedFleet {
    /// The fleet from the target's pods: `ready` of `pods` are Ready. With the target's live
    /// `spec.replicas` (what the HPA holds and counts from) the fleet is that many replicas,
    /// of which at most `ready` serve: during a rolling update the surge pods replace old ones
    /// rather than add capacity, so they are not warming capacity to plan on; after a
    /// scale-up the replicas not created yet are warming; after a scale-down the pods still
    /// terminating are gone. Without it, every pod counts (Ready or warming).
    pub fn from_pods(ready: usize, pods: usize, spec_replicas: Option<u32>) -> Self {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let (ready, pods) = (count(ready.min(pods)), count(pods));
        match spec_replicas {
            Some(n) => {
                let ready = ready.min(n);
                PlannedFleet { ready, warming: n - ready, source: FleetSource::PodsAndSpec }
            }
            None => PlannedFleet { ready, warming: pods - ready, source: FleetSource::Pods },
        }
    }

    /// Where the counts came from, as `/debug/scalers` shows it.
    pub fn source(&self) -> &'static str {
        match self.source {
            FleetSource::Answers => "answers",
            FleetSource::Pods => "pods",
            FleetSource::PodsAndSpec => "pods up to spec.replicas",
        }
    }
}

/// Backlog figures of the queue signals, summed: what is waiting right now.
fn backlog_total(signals: &[SignalView]) -> Option<f64> {
    let mut total = None;
    for s in signals {
        let b = match s.kind {
            "rabbitmq" => s.detail.get("messages").copied(),
            "sqs" => Some(
                s.detail.get("visible").copied().unwrap_or(0.0) + s.detail.get("in_flight").copied().unwrap_or(0.0),
            ),
            "kafka" => s.detail.get("lag").copied(),
            _ => None,
        };
        if let Some(b) = b.filter(|b| b.is_finite()) {
            *total.get_or_insert(0.0) += b;
        }
    }
    total
}

/// Arrival rate (requests/s) from queue deltas plus served throughput:
/// λ ≈ Δbacklog/Δt + completions/s. Rates reported directly by a source
/// (RabbitMQ's `publish_rate`) are taken as they are; the largest estimate wins.
#[derive(Debug, Default, Clone)]
pub struct ArrivalEstimator {
    prev: Option<(f64, f64)>,
}

impl ArrivalEstimator {
    pub fn update(&mut self, t_s: f64, signals: &[SignalView]) -> Option<f64> {
        let served: Option<f64> =
            signals.iter().filter_map(|s| s.detail.get("arrival_rate").copied()).reduce(|a, b| a + b);
        let published = signals.iter().filter_map(|s| s.detail.get("publish_rate").copied()).reduce(f64::max);
        let backlog = backlog_total(signals);
        let from_delta = match (backlog, self.prev) {
            (Some(b), Some((t0, b0))) if t_s > t0 => Some(((b - b0) / (t_s - t0) + served.unwrap_or(0.0)).max(0.0)),
            _ => served,
        };
        if let Some(b) = backlog {
            self.prev = Some((t_s, b));
        }
        [from_delta, published].into_iter().flatten().filter(|x| x.is_finite()).reduce(f64::max)
    }
}

/// The replica-equivalents the planner observes at one tick: the combined demand, or
/// the arrival rate over `capacityPerReplica` when that is larger. None while no signal is
/// above its activation threshold: KEDA's activation wins over the value, as in the reactive
/// answer, so a queue or a GPU idling under its `*Activation*` key neither holds a replica
/// nor keeps a fleet with `scaleToZero` from reaching zero.
pub fn observed_demand(d: &Demand, arrival_rate: Option<f64>, capacity_per_replica: Option<f64>) -> f64 {
    if !d.active {
        return 0.0;
    }
    let mut x = d.replicas;
    if let (Some(mu), Some(rate)) = (capacity_per_replica, arrival_rate) {
        x = x.max(rate / mu);
    }
    if x.is_finite() {
        x.max(0.0)
    } else {
        0.0
    }
}

impl Predictor {
    /// `warmup_s`: the configured warm-up, or the fallback when `warmupSeconds: auto`
    /// has no measurements yet. `interval_s`: the tick (sampleSeconds).
    pub fn new(settings: &PlannerSettings, warmup_s: f64, interval_s: f64) -> Result<Self, PlannerError> {
        let warmup = match settings.warmup {
            Warmup::Seconds(w) => w,
            Warmup::Auto => warmup_s,
        };
        let min = if settings.scale_to_zero { settings.min_replicas } else { settings.min_replicas.max(1) };
        let mut cfg = PlannerConfig::new(1.0, WarmupDist::Fixed(warmup), interval_s.max(1.0), settings.slo_seconds);
        cfg.min_replicas = min;
        cfg.max_replicas = settings.max_replicas.max(min).max(1);
        cfg.scale_to_zero = settings.scale_to_zero;
        cfg.model = match settings.forecast_model {
            ForecastModel::Auto => FM::Auto,
            ForecastModel::Smoothing => FM::Smoothing,
            ForecastModel::HoltWinters => FM::HoltWinters,
            ForecastModel::SeasonalNaive => FM::SeasonalNaive,
        };
        Ok(Self {
            planner: Planner::new(cfg)?,
            settings: settings.clone(),
            last_t: None,
            hpa_count: 0,
            fleet: None,
            planned_from: PlannedFleet::default(),
            tolerance_note: None,
        })
    }

    /// Observe the tick's demand and plan. `t_s` is wall-clock seconds (unix).
    pub fn step(&mut self, t_s: f64, demand: f64) -> Decision {
        let dt = match self.last_t {
            Some(prev) if t_s > prev => t_s - prev,
            Some(_) => 0.0,
            None => self.planner.config().interval_s,
        };
        if dt > 0.0 {
            // Demand in replica-equivalents held over (t - dt, t], fed in one-second steps
            // (the planner's native resolution, as in replay); a long gap (restart, missed
            // ticks) is fed as its last hour only.
            let steps = dt.min(3600.0).ceil().max(1.0) as u32;
            let step = dt.min(3600.0) / f64::from(steps);
            for i in 0..steps {
                let end = t_s - step * f64::from(steps - 1 - i);
                self.planner.observe(end, step, demand * step, 0.0);
            }
            self.last_t = Some(t_s);
        }
        // The fleet is the target's pods where the cluster shows them (the HPA's own rate
        // limits, KEDA's fallback and a manual `kubectl scale` are in them, and pods still
        // starting are warming, not serving), else what the HPA holds after our answers, which
        // a dropped answer leaves unchanged.
        let fleet = self.fleet.take().unwrap_or(PlannedFleet {
            ready: self.hpa_count,
            warming: 0,
            source: FleetSource::Answers,
        });
        self.planned_from = fleet;
        let current = fleet.ready.saturating_add(fleet.warming);
        let mut d = self.planner.plan(t_s, fleet.ready, fleet.warming);
        // Invariant: never plan below what the demand needs right now (a forecast may
        // only add capacity ahead of time, never take away what is needed now).
        let max = self.planner.config().max_replicas;
        let floor = super::plan::ceil_replicas(demand).min(max);
        if d.desired < floor {
            d.reason = prescale_forecaster::Reason::Bound { limit: floor };
            d.desired = floor;
        }
        // A scale-up the HPA would drop is answered past its tolerance.
        let tol = self.settings.hpa_tolerance;
        let answer = super::hpa::answer_through_tolerance(d.desired, current, tol, max);
        self.tolerance_note = (answer != d.desired).then(|| {
            format!(
                "answered {answer} for a plan of {}: the HPA drops a change within its tolerance {tol} of {current}",
                d.desired
            )
        });
        d.desired = answer;
        self.hpa_count = super::hpa::applied(current, answer, tol);
        d
    }

    /// Replay a recorded demand history (`values[i]`, replica-equivalents, at `first_s + i ·
    /// step_s` unix seconds) through the planner as ticks before the first live one, so the
    /// daily and weekly profiles, the forecast calibration and the margin choice carry over a
    /// restart instead of being relearned. Samples at or before the last tick, and values that
    /// are not finite, are skipped. Returns how many were fed.
    pub fn warm(&mut self, first_s: f64, step_s: f64, values: &[f64]) -> usize {
        let mut fed = 0;
        for (i, &v) in values.iter().enumerate() {
            let t = first_s + step_s * i as f64;
            if !v.is_finite() || !t.is_finite() || self.last_t.is_some_and(|l| t <= l) {
                continue;
            }
            self.step(t, v.max(0.0));
            fed += 1;
        }
        self.tolerance_note = None;
        fed
    }

    /// The scale target's fleet for the next step, from the cluster's pod and workload
    /// watches ([`PlannedFleet::from_pods`]; see `crate::cluster::Cluster::target_pods`).
    pub fn observe_fleet(&mut self, fleet: PlannedFleet) {
        self.fleet = Some(fleet);
    }

    pub fn settings(&self) -> &PlannerSettings {
        &self.settings
    }

    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    // --- cluster integration: `warmupSeconds: auto` (see crate::cluster) ---
    /// Plan with a measured warm-up from now on (history is kept).
    pub fn set_warmup(&mut self, warmup_s: f64) -> Result<(), PlannerError> {
        self.planner.set_warmup(WarmupDist::Fixed(warmup_s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Mode;

    fn settings(scale_to_zero: bool, warmup: f64) -> PlannerSettings {
        PlannerSettings {
            mode: Mode::Predictive,
            warmup: Warmup::Seconds(warmup),
            capacity_per_replica: None,
            slo_seconds: 5.0,
            scale_to_zero,
            forecast_model: ForecastModel::Auto,
            min_replicas: 0,
            max_replicas: 50,
            hpa_tolerance: 0.1,
        }
    }

    const DAY: f64 = 86_400.0;
    const T0: f64 = 1_790_000_000.0 - 1_790_000_000.0 % DAY; // a UTC midnight

    /// A recorded daily pattern: 2 replica-equivalents at night, 12 from 09:00 to 17:00.
    fn daily(t: f64) -> f64 {
        let h = (t - T0).rem_euclid(DAY) / 3600.0;
        if (9.0..17.0).contains(&h) {
            12.0
        } else {
            2.0
        }
    }

    #[test]
    fn a_scale_up_the_hpa_would_drop_is_answered_past_its_tolerance() {
        // A fleet of about 11 whose demand creeps up by a replica: with Kubernetes' default
        // tolerance the HPA would drop 11 → 12, so the answer must be one it applies, and the
        // planner must plan from the count the HPA holds. With tolerance 0 the plan is the answer.
        for tol in [0.1, 0.0] {
            let mut s = settings(false, 120.0);
            s.hpa_tolerance = tol;
            let mut p = Predictor::new(&s, 120.0, 15.0).unwrap();
            let mut held = 0u32;
            let mut noted = 0;
            for i in 0..400 {
                let t = T0 + 15.0 * f64::from(i);
                let demand = if i < 200 { 10.6 } else { 11.4 };
                let d = p.step(t, demand);
                if tol > 0.0 && d.desired > held && held > 0 {
                    assert_eq!(
                        super::super::hpa::applied(held, d.desired, tol),
                        d.desired,
                        "tick {i}: answered {} from {held}, which the HPA drops",
                        d.desired
                    );
                }
                if let Some(n) = &p.tolerance_note {
                    assert!(n.contains("tolerance"), "{n}");
                    noted += 1;
                }
                held = super::super::hpa::applied(held, d.desired, tol);
                assert!(held >= demand.ceil() as u32, "tick {i}: the HPA holds {held} for a demand of {demand}");
            }
            if tol > 0.0 {
                assert!(noted > 0, "the creep from 11 to 12 replicas was never answered past the tolerance");
            } else {
                assert_eq!(noted, 0);
            }
        }
    }

    #[test]
    fn plans_from_the_fleet_the_cluster_shows() {
        // The planner's answers left the HPA at 10, but someone scaled the target to 11 by
        // hand and the pod watch shows 11 Ready pods. A plan of 12 is then a move the HPA
        // drops from 11 (12/11 is within 0.1): the answer must be one it applies from 11, not
        // the 12 that would do from the 10 of the model.
        let s = settings(false, 120.0);
        let mut p = Predictor::new(&s, 120.0, 15.0).unwrap();
        let mut t = T0;
        for _ in 0..200 {
            p.step(t, 9.5);
            t += 15.0;
        }
        assert_eq!(p.hpa_count, 10);
        p.observe_fleet(PlannedFleet::from_pods(11, 11, Some(11)));
        let d = p.step(t, 11.4);
        assert!(d.desired >= 13, "answered {} from 11 pods", d.desired);
        assert_eq!(super::super::hpa::applied(11, d.desired, 0.1), d.desired, "answered {}", d.desired);
        assert!(p.tolerance_note.as_deref().is_some_and(|n| n.contains("of 11")), "{:?}", p.tolerance_note);
        // The observation is used once; without a newer one the model continues from what the
        // HPA applied.
        assert_eq!(p.hpa_count, d.desired);
        assert!(p.fleet.is_none());
    }

    #[test]
    fn the_fleet_is_counted_up_to_the_targets_spec_replicas() {
        // Without spec.replicas every pod counts: Ready ones serve, the rest are warming.
        let f = PlannedFleet::from_pods(3, 5, None);
        assert_eq!((f.ready, f.warming, f.source()), (3, 2, "pods"));
        // A rollout of 4 replicas with maxSurge 1: 4 old Ready pods and a new one starting.
        // The new one replaces an old one: no capacity is on its way.
        let f = PlannedFleet::from_pods(4, 5, Some(4));
        assert_eq!((f.ready, f.warming), (4, 0));
        // Later in the rollout: 3 Ready (one old one gone), 2 new starting.
        assert_eq!(PlannedFleet::from_pods(3, 5, Some(4)), PlannedFleet { ready: 3, warming: 1, ..f });
        // Just scaled 4 → 6: the two pods not created yet are warming already.
        assert_eq!(PlannedFleet::from_pods(4, 4, Some(6)), PlannedFleet { ready: 4, warming: 2, ..f });
        // Just scaled 4 → 2: the two pods still terminating (and Ready) are gone.
        assert_eq!(PlannedFleet::from_pods(4, 4, Some(2)), PlannedFleet { ready: 2, warming: 0, ..f });
        assert_eq!(PlannedFleet::from_pods(0, 0, Some(0)), PlannedFleet { ready: 0, warming: 0, ..f });
        // Counts that disagree (a watch between events) are clamped, not wrapped.
        assert_eq!(
            PlannedFleet::from_pods(7, 5, None),
            PlannedFleet { ready: 5, warming: 0, source: FleetSource::Pods }
        );
    }

    #[test]
    fn a_rollouts_surge_pods_do_not_move_the_tolerance_arithmetic() {
        // The HPA holds 10 replicas; a rolling update has 2 surge pods starting beside the 10
        // Ready ones. Demand creeps to 10.6 replica-equivalents: a plan of 11 is a change the
        // HPA (counting spec.replicas = 10) drops within its tolerance, so the answer must be
        // one it applies from 10. Counting the surge pods as a fleet of 12 would answer 11
        // and be dropped.
        let s = settings(false, 120.0);
        let mut p = Predictor::new(&s, 120.0, 15.0).unwrap();
        let mut t = T0;
        for _ in 0..200 {
            p.observe_fleet(PlannedFleet::from_pods(10, 10, Some(10)));
            p.step(t, 9.0);
            t += 15.0;
        }
        let mut answered_past = false;
        for _ in 0..40 {
            p.observe_fleet(PlannedFleet::from_pods(10, 12, Some(10)));
            let d = p.step(t, 10.6);
            assert_eq!(p.planned_from, PlannedFleet { ready: 10, warming: 0, source: FleetSource::PodsAndSpec });
            if d.desired > 10 {
                assert_eq!(super::super::hpa::applied(10, d.desired, 0.1), d.desired, "answered {}", d.desired);
                answered_past = true;
            }
            t += 15.0;
        }
        assert!(answered_past, "demand above the fleet was never answered with a scale-up");
    }

    #[test]
    fn pre_scales_before_a_recurring_daily_peak() {
        let warmup = 300.0;
        let mut p = Predictor::new(&settings(true, warmup), warmup, 60.0).unwrap();
        // Three days of history at one tick a minute (a paused clock: time is the argument).
        let mut t = T0;
        while t < T0 + 3.0 * DAY + 8.0 * 3600.0 {
            p.step(t, daily(t));
            t += 60.0;
        }
        // Day 4, 08:55: demand is still at night level, but the peak starts at 09:00 and
        // a replica started now is ready at 09:00 — the plan must already cover it.
        let before_peak = T0 + 3.0 * DAY + 9.0 * 3600.0 - warmup;
        let mut last = None;
        while t <= before_peak {
            last = Some(p.step(t, daily(t)));
            t += 60.0;
        }
        let d = last.unwrap();
        assert_eq!(daily(before_peak), 2.0, "demand now is at night level");
        assert!(d.desired >= 12, "plan {} at 08:55 must cover the 09:00 peak of 12 (reason: {})", d.desired, d.reason);
        // Well before the peak (03:00) it does not hold peak capacity.
        let mut q = Predictor::new(&settings(true, warmup), warmup, 60.0).unwrap();
        let mut t = T0;
        let mut at3 = None;
        while t <= T0 + 3.0 * DAY + 3.0 * 3600.0 {
            at3 = Some(q.step(t, daily(t)));
            t += 60.0;
        }
        assert!(at3.unwrap().desired < 12, "no peak capacity at 03:00");
    }

    #[test]
    fn a_restarted_planner_warmed_from_history_pre_scales_where_a_cold_one_cannot() {
        // The replica that ran for three days is gone; its successor starts at 08:50 on day 4
        // and reads back the demand it observed (one sample a minute, as Prometheus answers a
        // range query). Warmed, the first plans cover the 09:00 peak; cold, they do not.
        let warmup = 300.0;
        let restart = T0 + 3.0 * DAY + 8.0 * 3600.0 + 50.0 * 60.0;
        let first = T0;
        let history: Vec<f64> =
            (0..((restart - first) / 60.0) as usize).map(|i| daily(first + 60.0 * i as f64)).collect();
        let mut warmed = Predictor::new(&settings(true, warmup), warmup, 15.0).unwrap();
        assert_eq!(warmed.warm(first, 60.0, &history), history.len());
        // Samples at or before what it has seen are skipped: a second read changes nothing.
        assert_eq!(warmed.warm(first, 60.0, &history), 0);
        let mut cold = Predictor::new(&settings(true, warmup), warmup, 15.0).unwrap();
        let before_peak = T0 + 3.0 * DAY + 9.0 * 3600.0 - warmup;
        let (mut w, mut c) = (None, None);
        let mut t = restart;
        while t <= before_peak {
            w = Some(warmed.step(t, daily(t)));
            c = Some(cold.step(t, daily(t)));
            t += 15.0;
        }
        let (w, c) = (w.unwrap(), c.unwrap());
        assert_eq!(daily(before_peak), 2.0, "demand now is at night level");
        assert!(
            w.desired >= 12,
            "warmed: plan {} at 08:55 must cover the 09:00 peak (reason: {})",
            w.desired,
            w.reason
        );
        assert!(c.desired < 12, "cold: plan {} at 08:55 has no history to see the peak by", c.desired);
    }

    #[test]
    fn wakes_from_zero_before_a_predicted_arrival() {
        let warmup = 240.0;
        let mut p = Predictor::new(&settings(true, warmup), warmup, 60.0).unwrap();
        // A daily batch: 4 replica-equivalents from 02:00 to 02:30, nothing otherwise.
        let batch = |t: f64| {
            let m = (t - T0).rem_euclid(DAY) / 60.0;
            if (120.0..150.0).contains(&m) {
                4.0
            } else {
                0.0
            }
        };
        let mut t = T0;
        let mut went_to_zero = false;
        while t < T0 + 4.0 * DAY + 100.0 * 60.0 {
            let d = p.step(t, batch(t));
            if t > T0 + 3.0 * DAY && d.desired == 0 {
                went_to_zero = true;
            }
            t += 60.0;
        }
        assert!(went_to_zero, "idle for most of the day: the plan reaches zero");
        // Day 5, 01:56: still idle, the batch starts at 02:00, warm-up 4 min.
        let mut d = None;
        while t <= T0 + 4.0 * DAY + 116.0 * 60.0 {
            d = Some(p.step(t, batch(t)));
            t += 60.0;
        }
        let d = d.unwrap();
        assert!(d.desired >= 1, "wake before the predicted arrival (reason: {})", d.reason);
    }

    fn sig(kind: &'static str, detail: &[(&'static str, f64)]) -> SignalView {
        SignalView::with_detail(kind, detail)
    }

    #[test]
    fn arrival_rate_is_queue_delta_plus_served_throughput() {
        let mut a = ArrivalEstimator::default();
        // First tick: only the served throughput is known.
        let r = a.update(0.0, &[sig("rabbitmq", &[("messages", 100.0)]), sig("vllm", &[("arrival_rate", 4.0)])]);
        assert_eq!(r, Some(4.0));
        // 10 s later the queue grew by 30 while 4 req/s were served: λ = 3 + 4.
        let r = a.update(10.0, &[sig("rabbitmq", &[("messages", 130.0)]), sig("vllm", &[("arrival_rate", 4.0)])]);
        assert!((r.unwrap() - 7.0).abs() < 1e-9);
        // Draining faster than served is clamped at 0, and a published rate counts too.
        let r = a.update(20.0, &[sig("rabbitmq", &[("messages", 0.0), ("publish_rate", 2.5)])]);
        assert_eq!(r, Some(2.5));
        let d = Demand { replicas: 1.0, driver: Some(0), active: true };
        assert_eq!(observed_demand(&d, Some(7.0), Some(2.0)), 3.5);
        assert_eq!(observed_demand(&d, Some(7.0), None), 1.0);
        // Under every activation threshold: no demand, whatever the values say.
        let idle = Demand { active: false, ..d };
        assert_eq!(observed_demand(&idle, Some(7.0), Some(2.0)), 0.0);
    }

    /// A signal under its activation threshold (a GPU idling at 2 % against
    /// `dcgmActivationUtilization: 10`) neither holds a replica nor keeps the fleet from zero.
    #[test]
    fn an_inactive_signal_lets_the_fleet_reach_zero() {
        let mut p = Predictor::new(&settings(true, 60.0), 60.0, 5.0).unwrap();
        let idle = Demand { replicas: 0.025, driver: Some(0), active: false };
        let mut last = u32::MAX;
        for i in 0..2_000 {
            last = p.step(T0 + 5.0 * f64::from(i), observed_demand(&idle, None, None)).desired;
        }
        assert_eq!(last, 0);
    }

    #[test]
    fn never_below_current_demand() {
        let mut p = Predictor::new(&settings(true, 300.0), 300.0, 5.0).unwrap();
        let mut t = T0;
        for i in 0..500 {
            let demand = if i % 50 < 5 { 9.3 } else { 0.5 };
            let d = p.step(t, demand);
            assert!(d.desired >= super::super::plan::ceil_replicas(demand), "tick {i}: {} < {demand}", d.desired);
            t += 5.0;
        }
    }

    #[test]
    fn scale_to_zero_off_keeps_one() {
        let mut p = Predictor::new(&settings(false, 60.0), 60.0, 5.0).unwrap();
        let mut t = T0;
        for _ in 0..2000 {
            let d = p.step(t, 0.0);
            assert!(d.desired >= 1);
            t += 5.0;
        }
    }
}
