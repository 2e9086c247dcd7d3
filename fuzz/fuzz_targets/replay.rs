//! A trace file as `prescale replay` reads it, replayed through all three policies with an
//! arbitrary scenario: any text gives a trace or a located error, both readers agree, and a
//! replay gives scores inside their documented ranges, never a panic.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use prescale_forecaster::sim::check_scenario;
use prescale_forecaster::trace::read_trace;
use prescale_forecaster::{
    parse_trace, scenario_defaults, simulate, OraclePolicy, Policy, PrescalePolicy, ReactivePolicy, Score,
};

/// Longest trace replayed (seconds): longer ones are only parsed, to keep runs fast.
const REPLAY_LIMIT_S: usize = 6 * 3600;

#[derive(Debug, Arbitrary)]
struct Input {
    capacity: f64,
    warmup: u16,
    slo: f32,
    interval: u8,
    min_replicas: u8,
    max_replicas: Option<u16>,
    initial_replicas: Option<u16>,
    /// Last, so that it takes the rest of the input: a seed is a short parameter prefix
    /// followed by a real trace file's text (scripts/fuzz.sh).
    text: String,
}

fn check(score: &Score, who: &str) {
    assert!((0.0..=1.0).contains(&score.slo_attainment), "{who}: attainment {}", score.slo_attainment);
    assert!(score.replica_seconds.is_finite() && score.replica_seconds >= 0.0, "{who}: {score:?}");
    assert!((0.0..=1.0).contains(&score.cold_start_miss), "{who}: cold-start miss {}", score.cold_start_miss);
    assert!(score.p50_delay_s >= 0.0 && score.p99_delay_s >= score.p50_delay_s, "{who}: {score:?}");
}

fuzz_target!(|input: Input| {
    let parsed = parse_trace(&input.text);
    let streamed = read_trace(input.text.as_bytes());
    assert_eq!(parsed.is_ok(), streamed.is_ok(), "{parsed:?} vs {streamed:?}");
    let Ok(trace) = parsed else { return };
    if trace.arrivals.len() > REPLAY_LIMIT_S {
        return;
    }
    let sc = scenario_defaults(
        &trace,
        input.capacity,
        u64::from(input.warmup),
        f64::from(input.slo),
        u64::from(input.interval),
        u32::from(input.min_replicas),
        input.max_replicas.map(u32::from),
        input.initial_replicas.map(u32::from),
    );
    if check_scenario(&sc).is_err() {
        return;
    }
    let mut policies: Vec<Box<dyn Policy>> =
        vec![Box::new(ReactivePolicy::new(&sc)), Box::new(OraclePolicy::new(&trace, &sc))];
    if let Ok(p) = PrescalePolicy::new(&sc) {
        policies.push(Box::new(p));
    }
    for mut p in policies {
        let r = simulate(&trace, &sc, p.as_mut(), None);
        check(&r.score, p.name());
    }
});
