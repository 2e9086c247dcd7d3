//! scratch: per-decision dump prescale vs reactive. env ZZ_TRACE ZZ_MU ZZ_W ZZ_SLO ZZ_DUMP=t0:t1 ZZ_BUCKET
use prescale_forecaster::oracle::scenario_defaults;
use prescale_forecaster::reactive::ReactivePolicy;
use prescale_forecaster::sim::simulate;
use prescale_forecaster::trace::parse_trace;
use prescale_forecaster::PrescalePolicy;
fn env<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}
fn main() {
    let path: String = env("ZZ_TRACE", String::new());
    let mu: f64 = env("ZZ_MU", 0.5);
    let w: u64 = env("ZZ_W", 60);
    let slo: f64 = env("ZZ_SLO", 5.0);
    let bucket: u64 = env("ZZ_BUCKET", 86400);
    let text = std::fs::read_to_string(&path).unwrap();
    let trace = parse_trace(&text).unwrap();
    let sc = scenario_defaults(&trace, mu, w, slo, 15, 0, None, None);
    let mut pre = PrescalePolicy::new(&sc).unwrap().record_reasons(true);
    let p = simulate(&trace, &sc, &mut pre, None);
    let mut rea = ReactivePolicy::new(&sc);
    let r = simulate(&trace, &sc, &mut rea, None);
    println!(
        "prescale att {:.3} gpu {:.2} | reactive att {:.3} gpu {:.2}",
        p.score.slo_attainment * 100.0,
        p.score.gpu_hours,
        r.score.slo_attainment * 100.0,
        r.score.gpu_hours
    );
    let (t0, t1) = std::env::var("ZZ_DUMP")
        .ok()
        .and_then(|s| {
            let mut it = s.split(':');
            Some((it.next()?.parse::<u64>().ok()?, it.next()?.parse::<u64>().ok()?))
        })
        .unwrap_or((1, 0));
    let k = 15u64;
    // bucket stats: arrivals, backlog-sum proxy, gpu (ready+warming) per bucket
    let nb = (trace.arrivals.len() as u64).div_ceil(bucket) as usize;
    let mut pb = vec![(0.0f64, 0.0f64, 0.0f64); nb];
    let mut rb = vec![(0.0f64, 0.0f64, 0.0f64); nb];
    for i in 0..p.plan.len() {
        let b = ((i as u64 * k) / bucket) as usize;
        pb[b].0 += p.arrivals[i];
        pb[b].1 += p.backlog_max[i];
        pb[b].2 += (p.ready[i] + p.warming[i]) as f64 * k as f64 / 3600.0;
        rb[b].0 += r.arrivals[i];
        rb[b].1 += r.backlog_max[i];
        rb[b].2 += (r.ready[i] + r.warming[i]) as f64 * k as f64 / 3600.0;
    }
    if env("ZZ_BUCKETS", 0u32) == 1 {
        for b in 0..nb {
            println!(
                "bucket {b}: arr {:.0} | pre blsum {:.0} gpu {:.1} | rea blsum {:.0} gpu {:.1}",
                pb[b].0, pb[b].1, pb[b].2, rb[b].1, rb[b].2
            );
        }
    }
    if env("ZZ_CHURN", 0u32) == 1 {
        // shed ready replicas at decision i, re-ordered within W
        let win = (w / k) as usize;
        let (mut events, mut reps) = (0usize, 0u64);
        for i in 1..p.plan.len() {
            let prev_ready = p.ready[i - 1];
            let d = p.plan[i].1;
            if d < prev_ready {
                let shed = prev_ready - d;
                let mut mx = d;
                for j in i + 1..(i + win).min(p.plan.len()) {
                    mx = mx.max(p.plan[j].1);
                }
                let back = mx.saturating_sub(d).min(shed);
                if back > 0 {
                    events += 1;
                    reps += back as u64;
                }
            }
        }
        println!("churn: {events} events, {reps} replicas shed and re-ordered within W");
    }
    for i in 0..p.plan.len() {
        let t = i as u64 * k;
        if t < t0 || t > t1 {
            continue;
        }
        println!("{t:>8} arr {:>8.1} | P d {:>4} rdy {:>4} warm {:>4} bl {:>8.1} | R d {:>4} rdy {:>4} warm {:>4} bl {:>8.1} | {}", p.arrivals[i], p.plan[i].1, p.ready[i], p.warming[i], p.backlog_max[i], r.plan[i].1, r.ready[i], r.warming[i], r.backlog_max[i], pre.reasons()[i].2);
    }
}
// appended: churn stats
#[allow(dead_code)]
fn churn() {}
