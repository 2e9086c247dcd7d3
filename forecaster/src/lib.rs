//! prescale's forecaster: pure (no I/O, no async, time is always an argument).
//!
//! - `policy`: the simulator ↔ policy interface and the replay scenario.
//! - `trace`: the two trace formats of REPLAY.md.
//! - `sim`: the REPLAY.md fleet simulator and its scores.
//! - `oracle`, `reactive`: the two reference policies of REPLAY.md.
//! - `history`, `models`, `idle`, `planner`: prescale's own forecaster and planner.
pub mod policy;

pub use policy::{Observation, Policy, Scenario};
