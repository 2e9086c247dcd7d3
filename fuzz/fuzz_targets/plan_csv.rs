//! A plan CSV as `prescale replay` rescores it: any text gives a plan or a located error,
//! never a panic; a plan that parses has increasing decision times, and scoring it against
//! a trace gives a score in range or says why the plan does not fit the trace.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prescale_forecaster::{parse_plan_csv, scenario_defaults, score_plan, trace_from_rates};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(rows) = parse_plan_csv(text) else { return };
    for w in rows.windows(2) {
        assert!(w[0].0 < w[1].0, "decision times not increasing: {w:?}");
    }
    // Two minutes at 3 req/s, decided every 15 s: eight rows `0, 15, …, 105` fit it.
    let trace = trace_from_rates(1, &[3.0; 120]);
    let sc = scenario_defaults(&trace, 1.0, 60, 5.0, 15, 0, None, None);
    if let Ok(r) = score_plan(&trace, &sc, &rows) {
        assert_eq!(rows.len(), 8);
        assert!((0.0..=1.0).contains(&r.score.slo_attainment), "{:?}", r.score);
    }
});
