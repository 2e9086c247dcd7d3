//! Adapter: replays the simulator's observations into a [`Planner`] and answers with its
//! decisions (the `Policy` of REPLAY.md named "prescale").

use crate::planner::{Decision, ForecastModel, Planner, PlannerConfig, PlannerError, WarmupDist};
use crate::policy::{Observation, Policy, Scenario};

/// The prescale planner as a replay policy. Each second the simulator reports becomes one
/// `observe` sample `(s, s + 1]`; each decision is `plan(now, ready, warming)`.
#[derive(Debug, Clone)]
pub struct PrescalePolicy {
    planner: Planner,
    /// Seconds already fed to the planner.
    fed: usize,
    last: Option<Decision>,
    keep_reasons: bool,
    reasons: Vec<(u64, u32, String)>,
    margin_range: Option<(u64, u64)>,
    margins: Vec<(u64, Option<String>)>,
}

impl PrescalePolicy {
    /// A policy for `scenario` with the default planner settings (Auto model, q 0.99).
    pub fn new(scenario: &Scenario) -> Result<Self, PlannerError> {
        Self::with_config(Self::config_for(scenario))
    }

    /// The planner configuration derived from a scenario.
    pub fn config_for(scenario: &Scenario) -> PlannerConfig {
        PlannerConfig {
            capacity: scenario.capacity,
            warmup: WarmupDist::Fixed(scenario.warmup as f64),
            interval_s: scenario.interval.max(1) as f64,
            slo_s: scenario.slo,
            min_replicas: scenario.min_replicas,
            max_replicas: scenario.max_replicas,
            scale_to_zero: scenario.min_replicas == 0,
            model: ForecastModel::Auto,
            quantile: 0.99,
        }
    }

    pub fn with_config(cfg: PlannerConfig) -> Result<Self, PlannerError> {
        Ok(PrescalePolicy {
            planner: Planner::new(cfg)?,
            fed: 0,
            last: None,
            keep_reasons: false,
            reasons: Vec::new(),
            margin_range: None,
            margins: Vec::new(),
        })
    }

    /// Keep `(t, desired, reason)` of every decision (for plan CSVs with a reason column).
    pub fn record_reasons(mut self, on: bool) -> Self {
        self.keep_reasons = on;
        self
    }

    pub fn reasons(&self) -> &[(u64, u32, String)] {
        &self.reasons
    }

    /// Keep the margin each decision in `from..=to` (seconds) followed
    /// ([`Planner::followed_margin`]), for reading a scenario decision by decision.
    pub fn record_margins(mut self, range: Option<(u64, u64)>) -> Self {
        self.margin_range = range;
        self
    }

    /// `(t, margin)` of every decision in the `record_margins` range, in time order.
    pub fn margins(&self) -> &[(u64, Option<String>)] {
        &self.margins
    }

    pub fn planner(&self) -> &Planner {
        &self.planner
    }

    pub fn last_decision(&self) -> Option<&Decision> {
        self.last.as_ref()
    }
}

impl Policy for PrescalePolicy {
    fn name(&self) -> &str {
        "prescale"
    }

    fn decide(&mut self, obs: &Observation<'_>) -> u32 {
        let upto = (obs.now as usize).min(obs.arrivals.len()).min(obs.backlog.len());
        while self.fed < upto {
            let s = self.fed;
            self.planner.observe(s as f64 + 1.0, 1.0, obs.arrivals[s], obs.backlog[s]);
            self.fed += 1;
        }
        let d = self.planner.plan(obs.now as f64, obs.ready, obs.warming);
        let desired = d.desired;
        if self.keep_reasons {
            self.reasons.push((obs.now, desired, d.reason.to_string()));
        }
        if self.margin_range.is_some_and(|(from, to)| (from..=to).contains(&obs.now)) {
            self.margins.push((obs.now, self.planner.followed_margin()));
        }
        self.last = Some(d);
        desired
    }
}
