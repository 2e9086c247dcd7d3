//! GPU-fleet signals against the real `prescale serve`: vLLM pods (fixture exporters
//! serving vLLM's exposition text, found by URL or through a fake Kubernetes API's
//! EndpointSlices) and dcgm-exporter (scraped directly, and through the real Prometheus of
//! scripts/services.sh, which scrapes 127.0.0.1:19102 and :19103 every second).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::*;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A vLLM V1 `/metrics` page as vLLM writes it (reference note §5.1; HELP/TYPE lines,
/// `engine` and `model_name` on every series, counters with `_total` and `_created`,
/// histograms, another model served by the same pod).
fn vllm_page(running: f64, waiting: f64, kv: f64, success: f64) -> String {
    vllm_page_queued(running, waiting, kv, success, success, 0.0)
}

/// The same, with `started` requests scheduled so far of which `late` had waited 5–10 s in
/// the queue and the rest under 0.3 s (`vllm:request_queue_time_seconds`, vLLM's bounds).
fn vllm_page_queued(running: f64, waiting: f64, kv: f64, success: f64, started: f64, late: f64) -> String {
    let m = MODEL;
    let mut queue = String::from(
        "# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.\n\
         # TYPE vllm:request_queue_time_seconds histogram\n",
    );
    for le in ["0.3", "0.5", "0.8", "1.0", "1.5", "2.0", "2.5", "5.0", "10.0", "15.0", "20.0", "30.0", "+Inf"] {
        let within_slo = le.parse::<f64>().is_ok_and(|b| b <= 5.0);
        let n = if within_slo { started - late } else { started };
        queue.push_str(&format!(
            "vllm:request_queue_time_seconds_bucket{{engine=\"0\",le=\"{le}\",model_name=\"{m}\"}} {n:.1}\n"
        ));
    }
    queue.push_str(&format!(
        "vllm:request_queue_time_seconds_count{{engine=\"0\",model_name=\"{m}\"}} {started:.1}\n\
         vllm:request_queue_time_seconds_sum{{engine=\"0\",model_name=\"{m}\"}} {:.1}\n",
        0.1 * (started - late) + 7.0 * late
    ));
    queue
        + &format!(
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"{m}\"}} {running:.1}\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"other/model\"}} 100.0\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"{m}\"}} {waiting:.1}\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"other/model\"}} 100.0\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"{m}\"}} {kv}\n\
         # HELP vllm:generation_tokens_total Number of generation tokens processed.\n\
         # TYPE vllm:generation_tokens_total counter\n\
         vllm:generation_tokens_total{{engine=\"0\",model_name=\"{m}\"}} 27453.0\n\
         # HELP vllm:request_success_total Count of successfully processed requests.\n\
         # TYPE vllm:request_success_total counter\n\
         vllm:request_success_total{{engine=\"0\",finished_reason=\"length\",model_name=\"{m}\"}} {success:.1}\n\
         vllm:request_success_total{{engine=\"0\",finished_reason=\"stop\",model_name=\"{m}\"}} 0.0\n\
         vllm:request_success_total{{engine=\"0\",finished_reason=\"abort\",model_name=\"{m}\"}} 0.0\n\
         # HELP vllm:request_success_created Count of successfully processed requests.\n\
         # TYPE vllm:request_success_created gauge\n\
         vllm:request_success_created{{engine=\"0\",finished_reason=\"length\",model_name=\"{m}\"}} 1.7e+09\n\
         # HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.\n\
         # TYPE vllm:time_to_first_token_seconds histogram\n\
         vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"0.1\",model_name=\"{m}\"}} 140.0\n\
         vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"+Inf\",model_name=\"{m}\"}} 140.0\n\
         vllm:time_to_first_token_seconds_count{{engine=\"0\",model_name=\"{m}\"}} 140.0\n\
         vllm:time_to_first_token_seconds_sum{{engine=\"0\",model_name=\"{m}\"}} 5.31\n"
        )
}

/// dcgm-exporter rows (reference note §4.5 label order; the `Hostname` spelling of
/// 4.5.3-4.8.2 and the newer `hostname`), pod-mapped into namespace `ns`.
fn dcgm_page(ns: &str, util_vllm1: u32) -> String {
    format!(
        r#"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43",pci_bus_id="00000000:00:07.0",device="nvidia0",modelName="NVIDIA L40S",Hostname="gpu1-wl8sg",DCGM_FI_DRIVER_VERSION="595.58.03",container="vllm",namespace="{ns}",pod="vllm-0"}} 87
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc44",pci_bus_id="00000000:00:08.0",device="nvidia1",modelName="NVIDIA L40S",Hostname="gpu1-wl8sg",DCGM_FI_DRIVER_VERSION="595.58.03",container="vllm",namespace="{ns}",pod="vllm-0"}} 73
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-8d1c2b3a-0000-4b17-9c2e-5da9abb51763",pci_bus_id="00000000:1B:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",DCGM_FI_DRIVER_VERSION="595.58.03",container="vllm",namespace="{ns}",pod="vllm-1"}} {util_vllm1}
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-8d1c2b3a-0001-4b17-9c2e-5da9abb51763",pci_bus_id="00000000:2B:00.0",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",DCGM_FI_DRIVER_VERSION="595.58.03",container="",namespace="",pod=""}} 99
DCGM_FI_DEV_GPU_UTIL{{gpu="2",UUID="GPU-8d1c2b3a-0002-4b17-9c2e-5da9abb51763",pci_bus_id="00000000:3B:00.0",device="nvidia2",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",DCGM_FI_DRIVER_VERSION="595.58.03",container="embed",namespace="{ns}",pod="embedder-0"}} 100
DCGM_FI_DEV_GPU_UTIL{{gpu="3",UUID="GPU-8d1c2b3a-0003-4b17-9c2e-5da9abb51763",pci_bus_id="00000000:4B:00.0",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",DCGM_FI_DRIVER_VERSION="595.58.03",container="vllm",namespace="{ns}-other",pod="vllm-0"}} 100
# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-8d1c2b3a-0000-4b17-9c2e-5da9abb51763",pci_bus_id="00000000:1B:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",hostname="node-a",DCGM_FI_DRIVER_VERSION="595.58.03",container="vllm",namespace="{ns}",pod="vllm-1"}} 74211
"#
    )
}

/// MIG rows (reference note §4.5): GR engine activity per GPU instance, no GPU_UTIL.
fn mig_page(ns: &str) -> String {
    format!(
        r#"# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418",device="nvidia0",modelName="NVIDIA A800-SXM4-80GB",GPU_I_PROFILE="2g.20gb",GPU_I_ID="3",Hostname="msxf-hpc-64-35-ai",DCGM_FI_DRIVER_VERSION="535.129.03",container="vllm",namespace="{ns}",pod="mig-1"}} 0.000000
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763",pci_bus_id="00000000:1B:00.0",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",hostname="gpu-a100",DCGM_FI_DRIVER_VERSION="535.129.03",container="vllm",namespace="{ns}",pod="mig-0"}} 0.81
# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="GPU-265c9814-6156-355b-e589-ff2064894f16",device="nvidia0",modelName="NVIDIA A30",GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",Hostname="yg-a30-0003",DCGM_FI_DRIVER_VERSION="535.129.03",container="vllm",namespace="{ns}",pod="mig-2"}} 6012
"#
    )
}

/// The detail map of the first signal of one ScaledObject in `/debug/scalers/{ns}/{name}`.
async fn detail(srv: &Server, ns: &str, name: &str) -> Option<serde_json::Value> {
    let (code, body) = srv.get(&format!("/debug/scalers/{ns}/{name}")).await;
    if code != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let d = v.pointer("/triggers/0/snapshot/signals/0/detail")?.clone();
    d.is_object().then_some(d)
}

fn num(d: &serde_json::Value, key: &str) -> Option<f64> {
    d.get(key).and_then(serde_json::Value::as_f64)
}

type Client = prescale::proto::external_scaler_client::ExternalScalerClient<tonic::transport::Channel>;

/// Wait until GetMetrics answers `want` (panics with the last answer after `secs`).
async fn wait_metric(c: &Client, so: &prescale::proto::ScaledObjectRef, want: i64, secs: u64) {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let r = metric(&mut c.clone(), so).await;
        if r.as_ref().ok() == Some(&want) {
            return;
        }
        assert!(Instant::now() < end, "GetMetrics for {} is not {want} after {secs}s; last: {r:?}", so.name);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn vllm_endpoints_sum_degrade_and_go_unavailable() {
    let pod_a = Exporter::start(19102, &vllm_page(8.0, 6.0, 0.765, 131.0)).await;
    let pod_b = Exporter::start(0, &vllm_page(20.0, 10.0, 0.4, 50.0)).await;
    // prescale reaches each pod through a proxy that can be cut (a pod going away).
    let proxy_a = Proxy::start("127.0.0.1:19102").await;
    let proxy_b = Proxy::start(&format!("127.0.0.1:{}", pod_b.port)).await;
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let name = unique("vllm");
    let endpoints = format!("127.0.0.1:{},http://127.0.0.1:{}/metrics", proxy_a.port, proxy_b.port);
    let so = sref(
        "llm",
        &name,
        &[
            ("vllmEndpoints", &endpoints),
            ("vllmModel", MODEL),
            ("vllmPerReplica", "16"),
            ("sampleSeconds", "1"),
            ("staleAfterSeconds", "4"),
            ("mode", "reactive"),
        ],
    );
    // (8 + 6) + (20 + 10) = 44 waiting + running of the model (the other model's 200 is
    // filtered out) → ceil(44 / 16) = 3.
    wait_metric(&c, &so, 3, 20).await;
    assert!(active(&mut c, &so).await.unwrap());
    // The same fixture page (pod A) through the real Prometheus, which scrapes :19102 every
    // second: 8 running + 6 waiting of the model, at 4 per replica → 4.
    if let Some(prom) = service("PRESCALE_TEST_PROM") {
        let q = format!(
            "sum(vllm:num_requests_waiting{{model_name=\"{MODEL}\"}} + vllm:num_requests_running{{model_name=\"{MODEL}\"}})"
        );
        let via = sref(
            "llm",
            &unique("vllm-prom"),
            &[
                ("prometheusServerAddress", &prom),
                ("prometheusQuery", &q),
                ("prometheusPerReplica", "4"),
                ("sampleSeconds", "1"),
                ("mode", "reactive"),
            ],
        );
        wait_metric(&c, &via, 4, 30).await;
    }

    // Served throughput: pod B finishes 10 requests/s.
    let done = Arc::new(AtomicUsize::new(0));
    let body_b = pod_b.body.clone();
    let d2 = done.clone();
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let n = d2.fetch_add(1, Ordering::Relaxed) + 1;
            // Of each 4 requests scheduled, 1 had waited past the 5-s SLO.
            let n = n as f64;
            *body_b.lock().unwrap() = vllm_page_queued(20.0, 10.0, 0.4, 50.0 + n, 50.0 + 4.0 * n, n);
        }
    });
    let d = eventually(20, "detail with an arrival_rate near 10/s", || {
        let (srv, name) = (&srv, name.clone());
        async move {
            let d = detail(srv, "llm", &name).await?;
            num(&d, "arrival_rate").filter(|r| (5.0..=15.0).contains(r)).map(|_| d)
        }
    })
    .await;
    // The queue time against the SLO (sloSeconds defaults to 5 s): 1 in 4 scheduled late,
    // pooled over both pods (pod A's page is static), per ScaledObject on /metrics too.
    assert!(num(&d, "queue_late_share").is_some_and(|x| (x - 0.25).abs() < 1e-9), "{d}");
    assert_eq!(num(&d, "queue_slo_bound_seconds"), Some(5.0), "{d}");
    assert!(num(&d, "queue_started_rate").is_some_and(|r| (20.0..=60.0).contains(&r)), "{d}");
    let series = format!("prescale_queue_late_share{{namespace=\"llm\",scaledobject=\"{name}\"}} ");
    eventually(10, "prescale_queue_late_share 0.25 on /metrics", || {
        let (srv, series) = (&srv, series.clone());
        async move {
            let (_, m) = srv.get("/metrics").await;
            let v = m.lines().find_map(|l| l.strip_prefix(series.as_str()))?.trim().parse::<f64>().ok()?;
            ((v - 0.25).abs() < 1e-9).then_some(())
        }
    })
    .await;
    // And as request counts, for request-weighted lateness over any span: 1 in 4 late.
    let labels = format!("{{namespace=\"llm\",scaledobject=\"{name}\"}} ");
    eventually(10, "scheduled and late request counters, 1 in 4 late", || {
        let (srv, labels) = (&srv, labels.clone());
        async move {
            let (_, m) = srv.get("/metrics").await;
            let read = |metric: &str| {
                let prefix = format!("{metric}{labels}");
                m.lines().find_map(|l| l.strip_prefix(prefix.as_str()))?.trim().parse::<f64>().ok()
            };
            let scheduled = read("prescale_queue_scheduled_requests_total")?;
            let late = read("prescale_queue_late_requests_total")?;
            (scheduled >= 40.0 && late * 4.0 == scheduled).then_some(())
        }
    })
    .await;
    ticker.abort();
    assert_eq!(num(&d, "waiting"), Some(16.0), "{d}");
    assert_eq!(num(&d, "running"), Some(28.0), "{d}");
    assert_eq!(num(&d, "pods_up"), Some(2.0), "{d}");
    assert_eq!(num(&d, "pods_down"), Some(0.0), "{d}");
    let kv = num(&d, "kv_cache_mean").unwrap();
    assert!((kv - (0.765 + 0.4) / 2.0).abs() < 1e-9, "{d}");

    // Pod B goes away: pod A alone (14 → 1 replica), and the reading says it is degraded.
    proxy_b.cut();
    wait_metric(&c, &so, 1, 20).await;
    let d = eventually(10, "pods_down = 1 in /debug/scalers", || {
        let (srv, name) = (&srv, name.clone());
        async move { detail(srv, "llm", &name).await.filter(|d| num(d, "pods_down") == Some(1.0)) }
    })
    .await;
    assert_eq!(num(&d, "pods_total"), Some(2.0), "{d}");

    // Every pod down: no number any more, UNAVAILABLE once the last read is stale (4 s).
    proxy_a.cut();
    let cut_at = Instant::now();
    let err = eventually(15, "UNAVAILABLE with every vLLM pod down", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { metric(&mut c, &so).await.err() }
    })
    .await;
    assert!(cut_at.elapsed() < Duration::from_secs(9), "went stale after {:?}", cut_at.elapsed());
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("vllm") && err.message().contains("all 2 vLLM pod(s) failed"), "{}", err.message());
    assert!(active(&mut c, &so).await.is_err(), "IsActive fails too");

    // The page parses as Prometheus reads it, although this source's label quotes the model
    // name (services.sh installs promtool; its lint remarks are not parse errors).
    let (_, m) = srv.get("/metrics").await;
    if let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(m.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!said.contains("parsing error"), "promtool cannot parse /metrics: {said}\n{m}");
    }
    // The chart's alert tests (tests/alerts) feed promtool series in the names and label names
    // this server exports, besides the scrape's own `job` and `instance`.
    // Read with the scaler's own exposition parser (the one its vLLM and DCGM sources use).
    let names = |s: prescale::sources::exposition::Series| {
        (s.name, s.labels.into_keys().collect::<std::collections::BTreeSet<String>>())
    };
    let mut exported: HashMap<String, Vec<std::collections::BTreeSet<String>>> = HashMap::new();
    for (name, labels) in prescale::sources::exposition::parse(&m).unwrap().into_iter().map(names) {
        exported.entry(name).or_default().push(labels);
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/alerts/prescale.test.yaml");
    let tests: serde_yaml_ng::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = std::collections::BTreeSet::new();
    for s in tests["tests"][0]["input_series"].as_sequence().unwrap() {
        // A series selector with a value is an exposition line.
        let line = format!("{} 0", s["series"].as_str().unwrap());
        let (name, mut labels) = names(prescale::sources::exposition::parse(&line).unwrap().remove(0));
        labels.remove("job");
        labels.remove("instance");
        let Some(sets) = exported.get(&name) else { continue };
        assert!(sets.contains(&labels), "{name}: the alert tests use labels {labels:?}, /metrics has {sets:?}");
        checked.insert(name);
    }
    for name in [
        "prescale_source_polls_total",
        "prescale_source_poll_errors_total",
        "prescale_grpc_requests_total",
        "prescale_queue_scheduled_requests_total",
        "prescale_queue_late_requests_total",
        "prescale_leader",
    ] {
        assert!(checked.contains(name), "{name} not compared: {checked:?}");
    }
    drop((pod_a, pod_b));
}

#[tokio::test]
async fn dcgm_direct_scrape_and_through_prometheus() {
    let ns = unique("gpu");
    let exporter = Exporter::start(19103, &dcgm_page(&ns, 40)).await;
    let srv = Server::start(&[]);
    let c = srv.client().await;
    let common =
        [("dcgmPodPrefix", "vllm-"), ("dcgmUtilizationTarget", "50"), ("sampleSeconds", "1"), ("mode", "reactive")];
    let direct_name = unique("dcgm-direct");
    let mut md = vec![("dcgmEndpoints", "127.0.0.1:19103")];
    md.extend(common);
    let direct = sref(&ns, &direct_name, &md);
    // vllm-0: (87 + 73) / 2 = 80 %, vllm-1: 40 % → 2 pods × 60 % / 50 % = 2.4 → 3.
    // (The unassigned GPU, the embedder pod and the other namespace do not count.)
    wait_metric(&c, &direct, 3, 20).await;
    let d = detail(&srv, &ns, &direct_name).await.expect("detail");
    assert_eq!((num(&d, "gpus"), num(&d, "pods"), num(&d, "mean_util")), (Some(3.0), Some(2.0), Some(60.0)), "{d}");
    assert_eq!(num(&d, "exporters_down"), Some(0.0), "{d}");

    let prom = service("PRESCALE_TEST_PROM");
    let via_name = unique("dcgm-prom");
    let via = prom.as_ref().map(|p| {
        let mut md = vec![("dcgmPrometheus", p.as_str())];
        md.extend(common);
        sref(&ns, &via_name, &md)
    });
    if let Some(via) = &via {
        wait_metric(&c, via, 3, 40).await;
    }

    // vllm-1 busier: (80 + 100) / 2 = 90 % → 2 × 90 / 50 = 3.6 → 4, on both paths.
    exporter.set(&dcgm_page(&ns, 100));
    wait_metric(&c, &direct, 4, 20).await;
    if let Some(via) = &via {
        wait_metric(&c, via, 4, 40).await;
        let d = detail(&srv, &ns, &via_name).await.expect("detail");
        assert_eq!(num(&d, "mean_util"), Some(90.0), "{d}");
    }

    // A multi-tenant gateway in front of the same Prometheus (as Mimir or a Thanos proxy
    // would be): 401 without the tenant header and the bearer token.
    if let Some(p) = &prom {
        let gateway = tenant_gateway(p, "gpu-team", "t0ken").await;
        let bare = sref(
            &ns,
            &unique("dcgm-tenant-bare"),
            &[("dcgmPrometheus", gateway.as_str()), common[0], common[1], common[2], common[3]],
        );
        let mut md = vec![
            ("dcgmPrometheus", gateway.as_str()),
            ("dcgmPrometheusCustomHeaders", "X-Scope-OrgID=gpu-team"),
            ("dcgmPrometheusBearerTokenFromEnv", "t0ken"),
        ];
        md.extend(common);
        let tenant = sref(&ns, &unique("dcgm-tenant"), &md);
        wait_metric(&c, &tenant, 4, 40).await;
        let err = eventually(20, "the gateway's 401 surfaces as UNAVAILABLE", || {
            let (mut c, so) = (c.clone(), bare.clone());
            async move { metric(&mut c, &so).await.err() }
        })
        .await;
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        assert!(err.message().contains("401"), "{}", err.message());
    }
}

/// A reverse proxy to `upstream`'s `/api/v1/query` that answers 401 unless the request
/// carries `X-Scope-OrgID: tenant` and `Authorization: Bearer token`.
async fn tenant_gateway(upstream: &str, tenant: &'static str, token: &'static str) -> String {
    let upstream = upstream.trim_end_matches('/').to_string();
    let http = reqwest::Client::new();
    let app = axum::Router::new().route(
        "/api/v1/query",
        axum::routing::get(move |headers: axum::http::HeaderMap, uri: axum::http::Uri| {
            let (upstream, http) = (upstream.clone(), http.clone());
            async move {
                let ok = headers.get("x-scope-orgid").is_some_and(|v| v == tenant)
                    && headers.get("authorization").is_some_and(|v| *v == format!("Bearer {token}"));
                if !ok {
                    return (axum::http::StatusCode::UNAUTHORIZED, "no tenant".to_string());
                }
                let q = uri.query().unwrap_or_default();
                let body = http.get(format!("{upstream}/api/v1/query?{q}")).send().await.unwrap().text().await.unwrap();
                (axum::http::StatusCode::OK, body)
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    format!("http://127.0.0.1:{port}")
}

#[tokio::test]
async fn dcgm_mig_engine_activity_and_missing_gpus() {
    let ns = unique("mig");
    let exporter = Exporter::start(0, &mig_page(&ns)).await;
    let ep = format!("127.0.0.1:{}", exporter.port);
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let name = unique("mig");
    let so = sref(
        &ns,
        &name,
        &[
            ("dcgmEndpoints", &ep),
            ("dcgmMetric", "engineActive"),
            ("dcgmUtilizationTarget", "30"),
            ("sampleSeconds", "1"),
            ("mode", "reactive"),
        ],
    );
    // mig-0 81 %, mig-1 0 % → 2 × 40.5 / 30 = 2.7 → 3.
    wait_metric(&c, &so, 3, 20).await;
    let d = detail(&srv, &ns, &name).await.expect("detail");
    assert_eq!((num(&d, "gpus"), num(&d, "pods")), (Some(2.0), Some(2.0)), "{d}");
    // The default metric reads MIG instances from GR_ENGINE_ACTIVE too.
    let auto = sref(
        &ns,
        &unique("mig-auto"),
        &[("dcgmEndpoints", &ep), ("dcgmUtilizationTarget", "30"), ("sampleSeconds", "1"), ("mode", "reactive")],
    );
    wait_metric(&c, &auto, 3, 20).await;

    // No GPU row for the pods: an error (UNAVAILABLE), never 0 — unless asked for.
    let none =
        sref(&ns, &unique("nogpu"), &[("dcgmEndpoints", &ep), ("dcgmPodPrefix", "absent-"), ("sampleSeconds", "1")]);
    let err = eventually(15, "UNAVAILABLE without GPU rows", || {
        let (mut c, so) = (c.clone(), none.clone());
        async move { metric(&mut c, &so).await.err().filter(|e| e.message().contains("no ")) }
    })
    .await;
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("absent-"), "{}", err.message());
    let zero = sref(
        &ns,
        &unique("nogpu-ok"),
        &[
            ("dcgmEndpoints", &ep),
            ("dcgmPodPrefix", "absent-"),
            ("dcgmIgnoreNoGpus", "true"),
            ("sampleSeconds", "1"),
            ("mode", "reactive"),
        ],
    );
    wait_metric(&c, &zero, 0, 15).await;
    assert!(!active(&mut c, &zero).await.unwrap());
}

/// A fake Kubernetes API server: the EndpointSlices of one Service, as the EndpointSlice
/// controller writes them (one slice per port set).
struct FakeApi {
    port: u16,
    queries: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn slice(ns: &str, svc: &str, suffix: &str, port: u16, endpoints: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "name": format!("{svc}-{suffix}"),
            "generateName": format!("{svc}-"),
            "namespace": ns,
            "uid": format!("0f6d1c1e-7c1b-4b52-9d43-{suffix:0>12}"),
            "resourceVersion": "48213",
            "generation": 3,
            "creationTimestamp": "2026-01-12T09:30:00Z",
            "labels": {
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "kubernetes.io/service-name": svc
            },
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-12T09:31:02Z"},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Service", "name": svc,
                "uid": "5b0d2c55-2f4e-4a8e-b3c2-1d2f3a4b5c6d", "controller": true, "blockOwnerDeletion": true
            }]
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "protocol": "TCP", "port": port, "appProtocol": "http"}]
    })
}

fn endpoint(ns: &str, pod: &str, ip: &str, ready: bool) -> serde_json::Value {
    serde_json::json!({
        "addresses": [ip],
        "conditions": {"ready": ready, "serving": ready, "terminating": false},
        "targetRef": {"kind": "Pod", "namespace": ns, "name": pod, "uid": format!("uid-{pod}")},
        "nodeName": "gpu-node-1",
        "zone": "eu-west-1a"
    })
}

impl FakeApi {
    async fn start(ns: &str, svc: &str, port_a: u16, port_b: u16) -> FakeApi {
        let list = serde_json::json!({
            "kind": "EndpointSliceList",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"resourceVersion": "48290"},
            "items": [
                slice(ns, svc, "7x2kq", port_a, serde_json::json!([endpoint(ns, "llama-0", "127.0.0.1", true)])),
                slice(ns, svc, "9vbnm", port_b, serde_json::json!([
                    endpoint(ns, "llama-1", "127.0.0.1", true),
                    // Starting up: not ready, so never scraped (the address does not answer).
                    endpoint(ns, "llama-2", "192.0.2.10", false)
                ]))
            ]
        });
        let queries: Arc<Mutex<Vec<String>>> = Arc::default();
        let q = queries.clone();
        let path = format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices");
        let app = axum::Router::new().route(
            &path,
            axum::routing::get(move |axum::extract::Query(p): axum::extract::Query<HashMap<String, String>>| {
                let list = list.clone();
                let q = q.clone();
                async move {
                    let sel = p.get("labelSelector").cloned().unwrap_or_default();
                    q.lock().unwrap().push(sel);
                    axum::Json(list)
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        FakeApi { port, queries, task }
    }
}

fn kubeconfig(server: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("{}.kubeconfig", unique("prescale")));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
         current-context: fake\nusers:\n- name: fake\n  user:\n    token: fake-token\n"
    );
    std::fs::write(&path, text).expect("write kubeconfig");
    path
}

/// A ScaledObject in `llm` reading the Service `llama`'s pods, answering reactively each second.
fn llama_service(name: &str) -> prescale::proto::ScaledObjectRef {
    let md = [
        ("vllmService", "llama"),
        ("vllmPort", "http"),
        ("vllmModel", MODEL),
        ("sampleSeconds", "1"),
        ("mode", "reactive"),
    ];
    sref("llm", name, &md)
}

#[tokio::test]
async fn vllm_service_endpoints_from_the_kubernetes_api() {
    let pod_a = Exporter::start(0, &vllm_page(8.0, 6.0, 0.765, 131.0)).await;
    let pod_b = Exporter::start(0, &vllm_page(20.0, 10.0, 0.4, 50.0)).await;
    let api = FakeApi::start("llm", "llama", pod_a.port, pod_b.port).await;
    let cfg = kubeconfig(&format!("http://127.0.0.1:{}", api.port));
    let srv = Server::start_with_env(&[], &[("KUBECONFIG", cfg.to_str().unwrap())]);
    let c = srv.client().await;
    let name = unique("svc");
    let so = llama_service(&name);
    // Two ready pods: 44 / 16 (the default vllmPerReplica) → 3; llama-2 is not ready.
    wait_metric(&c, &so, 3, 20).await;
    let d = detail(&srv, "llm", &name).await.expect("detail");
    assert_eq!((num(&d, "pods_up"), num(&d, "pods_total")), (Some(2.0), Some(2.0)), "{d}");
    let q = api.queries.lock().unwrap().clone();
    assert!(!q.is_empty() && q.iter().all(|s| s == "kubernetes.io/service-name=llama"), "{q:?}");
    // This API answers a watch with a list, which is no watch stream: the watch fails, the
    // polls list the slices themselves (above), and /debug/scalers says so.
    let why = eventually(15, "the failing watch shown", || async {
        let (_, all) = srv.get("/debug/scalers").await;
        let all: serde_json::Value = serde_json::from_str(&all).ok()?;
        let read = all["endpointSliceWatches"][0]["read"].as_str()?.to_string();
        read.starts_with("listed each poll").then_some(read)
    })
    .await;
    assert!(why.contains("watch failing"), "{why}");
    assert!(pod_a.hits.load(Ordering::Relaxed) > 0 && pod_b.hits.load(Ordering::Relaxed) > 0);
    let _ = std::fs::remove_file(&cfg);

    // No reachable Kubernetes API: the read fails with a clear error (UNAVAILABLE), not 0.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cfg2 = kubeconfig(&format!("https://127.0.0.1:{closed}"));
    let srv2 = Server::start_with_env(&[], &[("KUBECONFIG", cfg2.to_str().unwrap())]);
    let c2 = srv2.client().await;
    let err = eventually(15, "UNAVAILABLE without a Kubernetes API", || {
        let (mut c, so) = (c2.clone(), so.clone());
        async move { metric(&mut c, &so).await.err().filter(|e| e.message().contains("EndpointSlices")) }
    })
    .await;
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("llm/llama"), "{}", err.message());
    let _ = std::fs::remove_file(&cfg2);

    // No configuration at all (no KUBECONFIG file, not in a cluster): a clear error too.
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        let missing = std::env::temp_dir().join(unique("no-such-kubeconfig"));
        let srv3 = Server::start_with_env(&[], &[("KUBECONFIG", missing.to_str().unwrap())]);
        let c3 = srv3.client().await;
        let err = eventually(15, "UNAVAILABLE without any Kubernetes config", || {
            let (mut c, so) = (c3.clone(), so.clone());
            async move { metric(&mut c, &so).await.err().filter(|e| e.message().contains("no Kubernetes API")) }
        })
        .await;
        assert_eq!(err.code(), tonic::Code::Unavailable);
    }
}

#[tokio::test]
async fn vllm_service_pods_follow_an_endpointslice_watch_not_a_list_per_poll() {
    use crate::cluster::{FakeApi, ENDPOINTSLICES};
    let pod_a = Exporter::start(0, &vllm_page(8.0, 6.0, 0.765, 131.0)).await;
    let pod_b = Exporter::start(0, &vllm_page(20.0, 10.0, 0.4, 50.0)).await;
    let pod_c = Exporter::start(0, &vllm_page(30.0, 10.0, 0.4, 50.0)).await;
    let api = FakeApi::start().await;
    let ready = |pod: &str| serde_json::json!([endpoint("llm", pod, "127.0.0.1", true)]);
    api.put(ENDPOINTSLICES, slice("llm", "llama", "7x2kq", pod_a.port, ready("llama-0")));
    api.put(ENDPOINTSLICES, slice("llm", "llama", "9vbnm", pod_b.port, ready("llama-1")));
    // Another Service's slice in the same namespace: never scraped.
    api.put(ENDPOINTSLICES, slice("llm", "mistral", "q4r5s", pod_c.port, ready("mistral-0")));
    let cfg = kubeconfig(&api.url());
    let srv = Server::start_with_env(&[], &[("KUBECONFIG", cfg.to_str().unwrap())]);
    let c = srv.client().await;
    let name = unique("watched");
    let so = llama_service(&name);
    // 14 + 30 requests at the two pods, 16 per replica (the default) → 3.
    wait_metric(&c, &so, 3, 20).await;
    eventually(15, "pods read from the EndpointSlice watch", || {
        let srv = &srv;
        let name = name.clone();
        async move { detail(srv, "llm", &name).await.filter(|d| num(d, "slices_from_watch") == Some(1.0)) }
    })
    .await;
    // (serve's cluster features list pods, nodes and the rest of their own.)
    let slice_lists = || -> Vec<String> { api.lists().into_iter().filter(|l| l.contains("endpointslices")).collect() };
    let lists = slice_lists();
    assert!(!lists.is_empty() && lists.iter().all(|l| l.ends_with("?kubernetes.io/service-name=llama")), "{lists:?}");
    // Polls go on (each scrapes pod A) without another LIST: the watch holds the slices.
    let hits = pod_a.hits.load(Ordering::Relaxed);
    eventually(20, "three more polls", || {
        let h = pod_a.hits.load(Ordering::Relaxed);
        async move { (h >= hits + 3).then_some(()) }
    })
    .await;
    assert_eq!(slice_lists(), lists, "a poll listed the EndpointSlices although the watch was synced");
    assert_eq!(pod_c.hits.load(Ordering::Relaxed), 0, "another Service's pod was scraped");

    // A third pod becomes ready (a new slice of the Service): followed from the watch event.
    api.put(ENDPOINTSLICES, slice("llm", "llama", "c3p0x", pod_c.port, ready("llama-2")));
    wait_metric(&c, &so, 6, 20).await; // (44 + 40) / 16 = 5.25
                                       // The first pod's slice is deleted (scale-in): it stops counting at once.
    assert!(api.remove(ENDPOINTSLICES, "llm", "llama-7x2kq").is_some());
    wait_metric(&c, &so, 5, 20).await; // (30 + 40) / 16 = 4.375
    let d = detail(&srv, "llm", &name).await.expect("detail");
    assert_eq!((num(&d, "pods_up"), num(&d, "slices_from_watch")), (Some(2.0), Some(1.0)), "{d}");
    assert_eq!(slice_lists(), lists, "the changes came from a LIST, not the watch");
    let (_, m) = srv.get("/metrics").await;
    assert!(m.lines().any(|l| l == r#"prescale_source_connections{kind="endpointslice_watch"} 1"#), "{m}");
    let (_, all) = srv.get("/debug/scalers").await;
    let all: serde_json::Value = serde_json::from_str(&all).unwrap();
    let w = &all["endpointSliceWatches"][0];
    assert_eq!(
        (w["service"].as_str(), w["read"].as_str(), w["slices"].as_u64()),
        (Some("llm/llama"), Some("from the watch"), Some(2)),
        "{all}"
    );
    let _ = std::fs::remove_file(&cfg);
}

#[tokio::test]
async fn vllm_service_at_zero_replicas_reads_a_known_zero() {
    // The fleet is at zero: the Service's slices hold only a pod that is not ready yet.
    let list = serde_json::json!({
        "kind": "EndpointSliceList",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"resourceVersion": "7"},
        "items": [slice("llm", "idle", "a1b2c", 8000, serde_json::json!([endpoint("llm", "idle-0", "192.0.2.20", false)]))]
    });
    let app = axum::Router::new().route(
        "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices",
        axum::routing::get(move || {
            let list = list.clone();
            async move { axum::Json(list) }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let _api = tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    let cfg = kubeconfig(&format!("http://127.0.0.1:{port}"));
    let srv = Server::start_with_env(&[], &[("KUBECONFIG", cfg.to_str().unwrap())]);
    let c = srv.client().await;
    let name = unique("idle");
    let so = sref("llm", &name, &[("vllmService", "idle"), ("sampleSeconds", "1"), ("mode", "reactive")]);
    // The API positively says there is no ready pod: 0 requests at the pods, inactive —
    // not UNAVAILABLE (which would pin the fleet at KEDA's fallback size forever).
    wait_metric(&c, &so, 0, 20).await;
    let mut cc = c.clone();
    assert!(!active(&mut cc, &so).await.unwrap());
    let d = detail(&srv, "llm", &name).await.expect("detail");
    assert_eq!(num(&d, "pods_total"), Some(0.0), "{d}");
    let _ = std::fs::remove_file(&cfg);
}
