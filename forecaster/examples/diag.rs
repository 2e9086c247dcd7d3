use prescale_forecaster::oracle::scenario_defaults;
use prescale_forecaster::reactive::ReactivePolicy;
use prescale_forecaster::sim::simulate;
use prescale_forecaster::trace::parse_trace;
use prescale_forecaster::PrescalePolicy;
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let text = std::fs::read_to_string(&a[1]).unwrap();
    let cap: f64 = a[2].parse().unwrap();
    let w: u64 = a[3].parse().unwrap();
    let scale: f64 = a.get(4).map(|x| x.parse().unwrap()).unwrap_or(1.0);
    let skip: usize = a.get(5).map(|x| x.parse().unwrap()).unwrap_or(0);
    let mut trace = parse_trace(&text).unwrap();
    if skip > 0 {
        trace.arrivals.drain(..skip.min(trace.arrivals.len()));
    }
    for x in trace.arrivals.iter_mut() {
        *x *= scale;
    }
    let sc = scenario_defaults(&trace, cap, w, 5.0, 15, 0, None, None);
    let mut pre = PrescalePolicy::new(&sc).unwrap().record_reasons(true);
    let p = simulate(&trace, &sc, &mut pre, None);
    if std::env::var_os("SHOW").is_some() {
        for (t, d, r) in pre.reasons() {
            if *t < 3500 {
                println!("{t} {d} {r}");
            }
        }
        println!("max_replicas {} init {}", sc.max_replicas, sc.initial_replicas);
    }
    let mut rea = ReactivePolicy::new(&sc);
    let r = simulate(&trace, &sc, &mut rea, None);
    if std::env::var_os("CLASSIFY").is_some() {
        for (name, res) in [("pre", &p), ("rea", &r)] {
            let a = &trace.arrivals;
            let mut late = [0.0f64; 3];
            let mut mass = [0.0f64; 3];
            for s in 0..a.len() {
                let k = s / 600;
                let cur = a[k * 600];
                let prev = if k > 0 { a[(k - 1) * 600] } else { cur };
                let c = if prev == 0.0 && cur > 0.0 {
                    0
                } else if (cur / cap - 1e-9).ceil() > (prev / cap - 1e-9).ceil() {
                    1
                } else {
                    2
                };
                mass[c] += a[s];
                if res.backlog_max[s / 15] > res.ready[s / 15] as f64 * cap * 5.0 + 1e-9 {
                    late[c] += a[s];
                }
            }
            let tot: f64 = a.iter().sum();
            println!(
                "{name} late% of total: wake {:.3} up {:.3} other {:.3}  (mass share wake {:.3} up {:.3})",
                100.0 * late[0] / tot,
                100.0 * late[1] / tot,
                100.0 * late[2] / tot,
                mass[0] / tot,
                mass[1] / tot
            );
        }
    }
    if std::env::var_os("PERMIN").is_some() {
        let a = &trace.arrivals;
        for m in 0..(a.len() / 60 + 1) {
            let mut line = format!("min {m:3} arr {:4.0}", a[m * 60..((m + 1) * 60).min(a.len())].iter().sum::<f64>());
            for res in [&p, &r] {
                let mut late = 0.0;
                let mut reps = 0u32;
                for s in m * 60..((m + 1) * 60).min(a.len()) {
                    if res.backlog_max[s / 15] > res.ready[s / 15] as f64 * cap * 5.0 + 1e-9 {
                        late += a[s];
                    }
                    reps = reps.max(res.ready[s / 15] + res.warming[s / 15]);
                }
                line += &format!(" | late {late:4.0} maxn {reps:3}");
            }
            println!("{line}");
        }
    }
    println!(
        "W={w} pre att {:.3} gpuh {:.2} | rea att {:.3} gpuh {:.2}",
        100.0 * p.score.slo_attainment,
        p.score.gpu_hours,
        100.0 * r.score.slo_attainment,
        r.score.gpu_hours
    );
}
