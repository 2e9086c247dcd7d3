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
    if skip > 0 { trace.arrivals.drain(..skip.min(trace.arrivals.len())); }
    for x in trace.arrivals.iter_mut() { *x *= scale; }
    let sc = scenario_defaults(&trace, cap, w, 5.0, 15, 0, None, None);
    let mut pre = PrescalePolicy::new(&sc).unwrap().record_reasons(true);
    let p = simulate(&trace, &sc, &mut pre, None);
    if std::env::var_os("SHOW").is_some() {
        for (t, d, r) in pre.reasons() { if *t < 3500 { println!("{t} {d} {r}"); } }
        println!("max_replicas {} init {}", sc.max_replicas, sc.initial_replicas);
    }
    let mut rea = ReactivePolicy::new(&sc);
    let r = simulate(&trace, &sc, &mut rea, None);
    println!("W={w} pre att {:.3} gpuh {:.2} | rea att {:.3} gpuh {:.2}", 100.0*p.score.slo_attainment, p.score.gpu_hours, 100.0*r.score.slo_attainment, r.score.gpu_hours);
}
