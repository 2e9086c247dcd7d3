//! prescale's forecaster: pure (no I/O, no async, time is always an argument).
//!
//! - `policy`: the simulator ↔ policy interface and the replay scenario.
//! - `trace`: the two trace formats of REPLAY.md.
//! - `sim`: the REPLAY.md fleet simulator and its scores.
//! - `oracle`, `reactive`: the two reference policies of REPLAY.md.
//! - `history`, `models`, `idle`, `planner`: prescale's own forecaster and planner.
pub mod policy;

pub use policy::{Observation, Policy, Scenario};
pub mod history;
pub mod idle;
pub mod models;
pub mod planner;
pub mod prescale_policy;
pub use planner::{Decision, Fallback, ForecastModel, Margin, Planner, PlannerConfig, RateRule, Reason, WarmupDist};
pub use prescale_policy::PrescalePolicy;
pub mod oracle;
pub mod reactive;
pub mod sim;
pub mod trace;
pub use oracle::{oracle_plan, oracle_replica_seconds, scenario_defaults, OraclePolicy};
pub use reactive::ReactivePolicy;
pub use sim::{parse_plan_csv, plan_csv, score_plan, simulate, Score, SimError, SimResult};
pub use trace::{parse_trace, trace_from_rates, Trace, TraceError, TraceKind};
