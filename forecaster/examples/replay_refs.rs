//! Replays the dev traces through the two reference policies of REPLAY.md and prints a table.
//!
//! ```text
//! cargo run --release -p prescale-forecaster --example replay_refs [TRACES_DIR]
//! ```
//!
//! `TRACES_DIR` defaults to `../shared/traces` (relative to the working directory, i.e. the repo
//! root). Capacities and SLOs are those of `traces/README.md`; interval 15 s; W ∈ {60, 180, 420}.
//! Oracle GPU-hours are the contract's formula; "oracle sim" is the oracle policy replayed
//! through the simulator (for its delays).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use prescale_forecaster::{scenario_defaults, simulate, trace, OraclePolicy, ReactivePolicy};

/// (file, capacity μ, slo) from traces/README.md.
const TRACES: [(&str, f64, f64); 5] = [
    ("azure-llm-2023-code.csv", 0.5, 5.0),
    ("servegen-m-large-14d.csv", 25.0, 5.0),
    ("servegen-m-large-chunk-144.csv", 0.5, 5.0),
    ("servegen-m-large-chunk-32.csv", 0.5, 5.0),
    ("servegen-m-large-chunk-93.csv", 0.25, 5.0),
];
const WARMUPS: [u64; 3] = [60, 180, 420];
const INTERVAL: u64 = 15;

fn main() -> ExitCode {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "../shared/traces".into()));
    println!(
        "{:<31} {:>4} {:>9} | {:>9} {:>9} {:>9} {:>7} | {:>9} {:>9} {:>8} | {:>6} {:>8}",
        "trace",
        "W",
        "T (s)",
        "react att",
        "react GPUh",
        "p50/p99 s",
        "starts",
        "orcl GPUh",
        "orcl sim",
        "sim att",
        "gap",
        "wall ms"
    );
    let all = Instant::now();
    for (file, mu, slo) in TRACES {
        let path = dir.join(file);
        let t_parse = Instant::now();
        let tr = match std::fs::File::open(&path)
            .map_err(|e| e.to_string())
            .and_then(|f| trace::read_trace(std::io::BufReader::new(f)).map_err(|e| e.to_string()))
        {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        };
        let parse_ms = t_parse.elapsed().as_secs_f64() * 1e3;
        for w in WARMUPS {
            let start = Instant::now();
            let sc = scenario_defaults(&tr, mu, w, slo, INTERVAL, 0, None, None);
            let reactive = simulate(&tr, &sc, &mut ReactivePolicy::new(&sc), None);
            let mut oracle = OraclePolicy::new(&tr, &sc);
            let oracle_gpuh = oracle.replica_seconds() / 3600.0;
            let oracle_sim = simulate(&tr, &sc, &mut oracle, None);
            let wall = start.elapsed().as_secs_f64() * 1e3;
            println!(
                "{:<31} {:>4} {:>9} | {:>9.4} {:>10.2} {:>9} {:>7} | {:>9.2} {:>9.2} {:>8.4} | {:>5.0}% {:>8.1}",
                file.trim_end_matches(".csv"),
                w,
                tr.len(),
                reactive.score.slo_attainment,
                reactive.score.gpu_hours,
                format!("{}/{}", fmt_delay(reactive.score.p50_delay_s), fmt_delay(reactive.score.p99_delay_s)),
                reactive.score.replica_starts,
                oracle_gpuh,
                oracle_sim.score.gpu_hours,
                oracle_sim.score.slo_attainment,
                (reactive.score.gpu_hours / oracle_gpuh - 1.0) * 100.0,
                wall
            );
        }
        println!("{:<31} parse {parse_ms:.1} ms", "");
    }
    println!("total {:.2} s", all.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}

fn fmt_delay(d: f64) -> String {
    if d.is_finite() {
        format!("{d:.0}")
    } else {
        "inf".into()
    }
}
