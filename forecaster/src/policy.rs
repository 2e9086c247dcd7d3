//! The interface between the replay simulator and the policies it drives.
//!
//! A policy sees, at decision second `now`, only what happened in seconds `< now`
//! (REPLAY.md, "Decision"). The simulator owns the slices; a policy must not assume
//! anything about seconds `>= now`.

/// What a policy may look at when it decides at second `now`.
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    /// The decision second `s` (a multiple of the decision interval).
    pub now: u64,
    /// `arrivals[i]` = arrival mass in second `i`, for `i < now` (len == now).
    pub arrivals: &'a [f64],
    /// `backlog[i]` = backlog at the end of second `i`, for `i < now` (len == now).
    pub backlog: &'a [f64],
    /// Ready replicas at the start of second `now` (before this decision).
    pub ready: u32,
    /// Warming replicas at the start of second `now` (before this decision).
    pub warming: u32,
}

/// A scaling policy replayed by the simulator: returns the desired replica count.
/// The simulator clamps the answer to `[min_replicas, max_replicas]`.
pub trait Policy {
    fn name(&self) -> &str;
    fn decide(&mut self, obs: &Observation<'_>) -> u32;
}

/// The fixed parameters of one replay (REPLAY.md, "Scenario").
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Scenario {
    /// μ: requests per second one ready replica completes.
    pub capacity: f64,
    /// W: whole seconds from a replica's start until it is ready.
    pub warmup: u64,
    /// Seconds of queueing a request may see.
    pub slo: f64,
    /// I: decision interval in seconds (default 15).
    pub interval: u64,
    pub min_replicas: u32,
    pub max_replicas: u32,
    /// Ready at s = 0, no warm-up paid.
    pub initial_replicas: u32,
}
