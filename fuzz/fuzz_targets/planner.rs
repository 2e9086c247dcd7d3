//! The planner as `serve` drives it: arbitrary configuration and observations (NaN, ∞,
//! negative, huge, time going backwards, decisions at any moment). Every decision stays in
//! `[min, max]`, or is 0 with scale-to-zero (`minReplicas` then floors a woken fleet only),
//! with a reason, and the /debug snapshot serialises, never a panic.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use prescale_forecaster::{ForecastModel, Planner, PlannerConfig, WarmupDist};

/// A real number the way the planner meets them: mostly an ordinary value of the field's
/// scale, sometimes one of the values that break arithmetic. (Raw `f64` bits would be NaN,
/// negative or astronomically large nearly always, and never reach the planner's logic.)
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Real {
    /// `n / 16` for `n` in 0..65536: 0 to 4096 in sixteenths.
    Plain(u16),
    /// A scaled value: `n × 10^e` for `e` in −8..=12.
    Scaled(u8, i8),
    Special(u8),
}

impl Real {
    fn get(self) -> f64 {
        match self {
            Real::Plain(n) => f64::from(n) / 16.0,
            Real::Scaled(n, e) => f64::from(n) * 10f64.powi(i32::from(e.clamp(-8, 12))),
            Real::Special(k) => {
                [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, 0.0, -0.0, f64::MAX, f64::MIN_POSITIVE, 1e-300, -1e9]
                    [usize::from(k) % 10]
            }
        }
    }
}

#[derive(Debug, Arbitrary)]
enum Warmup {
    Fixed(Real),
    Samples(Vec<Real>, Real),
}

#[derive(Debug, Arbitrary)]
struct Step {
    dt: Real,
    arrivals: Real,
    backlog: Real,
    /// `(ready, warming)` when the planner decides after this observation.
    decide: Option<(u8, u8)>,
}

#[derive(Debug, Arbitrary)]
struct Input {
    capacity: Real,
    warmup: Warmup,
    interval_s: Real,
    slo_s: Real,
    min_replicas: u8,
    extra: u16,
    scale_to_zero: bool,
    model: u8,
    quantile: Real,
    /// A run of steps repeated `repeat` times: long, regular traffic (a grid, a daily
    /// cycle's worth of decisions) from a short input.
    repeat: u8,
    steps: Vec<Step>,
}

fuzz_target!(|input: Input| {
    let warmup = match input.warmup {
        Warmup::Fixed(w) => WarmupDist::Fixed(w.get()),
        Warmup::Samples(samples, quantile) => {
            WarmupDist::Samples { samples: samples.iter().map(|r| r.get()).collect(), quantile: quantile.get() }
        }
    };
    let mut cfg = PlannerConfig::new(input.capacity.get(), warmup, input.interval_s.get(), input.slo_s.get());
    cfg.min_replicas = u32::from(input.min_replicas);
    cfg.max_replicas = cfg.min_replicas + u32::from(input.extra);
    cfg.scale_to_zero = input.scale_to_zero;
    cfg.quantile = 0.5 + input.quantile.get() / 8192.0;
    cfg.model = match input.model % 4 {
        0 => ForecastModel::Auto,
        1 => ForecastModel::Smoothing,
        2 => ForecastModel::HoltWinters,
        _ => ForecastModel::SeasonalNaive,
    };
    let (min, max, interval, to_zero) = (cfg.min_replicas, cfg.max_replicas, cfg.interval_s, cfg.scale_to_zero);
    let Ok(mut p) = Planner::new(cfg) else { return };
    let mut t = 0.0f64;
    let rounds = usize::from(input.repeat).max(1);
    // Each elapsed interval costs the planner ~10 µs (more under the fuzzer's
    // instrumentation); an input stops after the step that takes it past 10,000 of them (a
    // gap of any length still gets its observation and decision), which keeps runs short.
    for s in std::iter::repeat_n(&input.steps, rounds).flatten().take(5_000) {
        let dt = s.dt.get();
        t += dt;
        p.observe(t, dt, s.arrivals.get(), s.backlog.get());
        if let Some((ready, warming)) = s.decide {
            let d = p.plan(t, u32::from(ready), u32::from(warming));
            let idle = to_zero && d.desired == 0;
            assert!(idle || (d.desired >= min && d.desired <= max), "{} outside [{min}, {max}]", d.desired);
            assert!(!d.reason.to_string().is_empty());
        }
        if t.is_nan() || t / interval >= 10_000.0 {
            break;
        }
    }
    let _ = format!("{:?}", p.snapshot());
});
