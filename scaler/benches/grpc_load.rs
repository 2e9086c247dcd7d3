//! Load benchmark: `GetMetrics` over loopback for 1,000 ScaledObjects against the real
//! `prescale serve` binary, beside `prescale floor` (an ExternalScaler answering constants, in its own process)
//! measured in the same run. Prints calls/s, p50/p99 latency and the server's RSS.
//!
//!   cargo bench -p prescale --bench grpc_load            (needs RabbitMQ on 127.0.0.1:5672,
//!   or PRESCALE_TEST_AMQP; scripts/services.sh starts it)

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prescale::proto::external_scaler_client::ExternalScalerClient;
use prescale::proto::*;

const SCALED_OBJECTS: usize = 1000;
const CONCURRENCY: usize = 32;
const CHANNELS: usize = 4;
const SECONDS: f64 = 6.0;

fn refs(amqp: &str, mode: &str) -> Vec<ScaledObjectRef> {
    (0..SCALED_OBJECTS)
        .map(|i| {
            let md: HashMap<String, String> = [
                ("scalerAddress", "prescale.prescale.svc:9090".to_string()),
                ("rabbitmqHost", amqp.to_string()),
                ("rabbitmqQueueName", format!("bench-q{}", i % 10)),
                ("rabbitmqPerReplica", "20".to_string()),
                ("warmupSeconds", "180".to_string()),
                ("sloSeconds", "5".to_string()),
                ("mode", mode.to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            ScaledObjectRef { name: format!("so-{i}"), namespace: format!("ns-{}", i % 20), scaler_metadata: md }
        })
        .collect()
}

struct Figures {
    calls_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    errors: usize,
}

async fn load(addr: &str, refs: Arc<Vec<ScaledObjectRef>>) -> Figures {
    let mut chans = Vec::new();
    for _ in 0..CHANNELS {
        chans.push(ExternalScalerClient::connect(addr.to_string()).await.expect("connect"));
    }
    // Warm up: every ScaledObject once.
    for (i, r) in refs.iter().enumerate() {
        let mut c = chans[i % CHANNELS].clone();
        let _ = c
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(r.clone()),
                metric_name: "prescale-replicas".into(),
            })
            .await;
    }
    let end = Instant::now() + Duration::from_secs_f64(SECONDS);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..CONCURRENCY {
        let mut c = chans[w % CHANNELS].clone();
        let refs = refs.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(100_000);
            let mut errors = 0;
            let mut i = w;
            while Instant::now() < end {
                let r = &refs[i % refs.len()];
                i += CONCURRENCY;
                let t = Instant::now();
                let res = c
                    .get_metrics(GetMetricsRequest {
                        scaled_object_ref: Some(r.clone()),
                        metric_name: "prescale-replicas".into(),
                    })
                    .await;
                lat.push(t.elapsed().as_nanos() as u64);
                if res.is_err() {
                    errors += 1;
                }
            }
            (lat, errors)
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await.unwrap();
        all.extend(l);
        errors += e;
    }
    let secs = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let q = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)] as f64 / 1000.0;
    Figures { calls_per_s: all.len() as f64 / secs, p50_us: q(0.50), p99_us: q(0.99), errors }
}

fn rss_mib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Start `prescale ARGS` with `envs`, wait for the `grpc=ADDR` it logs once bound, and keep
/// draining its stderr (a full pipe would block the server). Returns the child and ADDR.
fn spawn_prescale(args: &[&str], envs: &[(&str, &str)]) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_prescale"))
        .args(args)
        .envs(envs.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn prescale {}: {e}", args[0]));
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let l = lines.next().unwrap_or_else(|| panic!("prescale {} exited", args[0])).unwrap();
        if let Some(i) = l.find("grpc=") {
            break l[i + 5..].split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

fn main() {
    // `cargo test --benches` runs bench targets with --bench absent; only run when benchmarking.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let amqp = std::env::var("PRESCALE_TEST_AMQP").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // The queues the ScaledObjects read must exist (a missing queue is UNAVAILABLE).
        let conn = lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default()).await.expect("RabbitMQ");
        let ch = conn.create_channel().await.unwrap();
        for q in 0..10 {
            ch.queue_declare(format!("bench-q{q}").as_str().into(), Default::default(), Default::default()).await.unwrap();
        }
        // The floor: `prescale floor`, an ExternalScaler answering constants, in its own
        // process like the real server, so both pay the same process and scheduling costs.
        let (mut floor_child, floor_addr) = spawn_prescale(&["floor", "--grpc-addr", "127.0.0.1:0"], &[]);
        println!(
            "grpc_load: {SCALED_OBJECTS} ScaledObjects, {CONCURRENCY} concurrent callers on {CHANNELS} HTTP/2 connections, {SECONDS} s each, loopback, {} cores",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
        );
        println!("{:<34} {:>10} {:>9} {:>9} {:>7} {:>9} {:>9}", "server", "calls/s", "p50 µs", "p99 µs", "errors", "p99/floor", "RSS MiB");
        for mode in ["reactive", "predictive"] {
            // The real server, as a separate process, fresh for each mode.
            let (mut child, grpc) = spawn_prescale(
                &["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
                &[("RUST_LOG", "warn,prescale=info"), ("NO_COLOR", "1")],
            );
            let refs = Arc::new(refs(&amqp, mode));
            // Let every ScaledObject get its first reading before measuring.
            let mut c = ExternalScalerClient::connect(format!("http://{grpc}")).await.unwrap();
            for r in refs.iter() {
                c.get_metric_spec(r.clone()).await.expect("spec");
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            // Floor and prescale back to back, so both see the same machine load.
            let floor = load(&format!("http://{floor_addr}"), refs.clone()).await;
            let real = load(&format!("http://{grpc}"), refs.clone()).await;
            let rss = rss_mib(child.id());
            println!(
                "{:<34} {:>10.0} {:>9.0} {:>9.0} {:>7} {:>9} {:>9}",
                "floor: constant answers, own process", floor.calls_per_s, floor.p50_us, floor.p99_us, floor.errors, "", ""
            );
            println!(
                "{:<34} {:>10.0} {:>9.0} {:>9.0} {:>7} {:>8.2}× {:>9.1}",
                format!("prescale GetMetrics, mode {mode}"),
                real.calls_per_s,
                real.p50_us,
                real.p99_us,
                real.errors,
                real.p99_us / floor.p99_us,
                rss
            );
            if real.errors > 0 {
                println!("note: errors are UNAVAILABLE answers (is RabbitMQ reachable at {}?)", prescale::redact::redact_url(&amqp));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = floor_child.kill();
        let _ = floor_child.wait();
    });
}
