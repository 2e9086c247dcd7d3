//! The rest of the wire contract and the HTTP side: StreamIsActive transitions,
//! StreamMetricSpec UNIMPLEMENTED, health/metrics/debug endpoints, SIGTERM.

use std::time::Duration;

use lapin::options::QueuePurgeOptions;
use tokio_stream::StreamExt;

use crate::harness::*;

#[tokio::test]
async fn stream_is_active_pushes_only_inactive_to_active_transitions() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    let queue = unique("q-push");
    let (_conn, ch) = rabbit_queue(&amqp, &queue).await;
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let so = sref(
        "ml",
        &unique("push"),
        &[("rabbitmqHost", &amqp), ("rabbitmqQueueName", &queue), ("sampleSeconds", "1"), ("mode", "reactive")],
    );
    let mut stream = c.stream_is_active(so.clone()).await.unwrap().into_inner();
    // Inactive: nothing is pushed.
    assert!(tokio::time::timeout(Duration::from_secs(3), stream.next()).await.is_err(), "no push while inactive");

    let publish = |n: usize| publish_on(&ch, &queue, n);
    publish(5).await;
    let msg = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("a push on activation");
    assert!(msg.unwrap().unwrap().result);
    // Still active: no repeated `true` (each would reset KEDA's cooldown).
    publish(5).await;
    assert!(tokio::time::timeout(Duration::from_secs(3), stream.next()).await.is_err(), "no repeat while active");
    // Going inactive pushes nothing (KEDA ignores false)...
    ch.queue_purge(queue.as_str().into(), QueuePurgeOptions::default()).await.unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(3), stream.next()).await.is_err(), "no push on deactivation");
    // ...and the next activation pushes again.
    publish(1).await;
    let msg = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("a push on re-activation");
    assert!(msg.unwrap().unwrap().result);
}

/// A push `true` scales from zero at once, so it is sent only from readings `IsActive` would
/// answer from: once a signal is stale (`IsActive` is UNAVAILABLE and KEDA's fallback
/// applies), a stream opened then pushes nothing, where it used to push the stale plan.
#[tokio::test]
async fn stream_is_active_pushes_nothing_from_a_stale_reading() {
    let prom = crate::cluster::fake_prometheus(std::sync::Arc::new(std::sync::Mutex::new(6.0))).await;
    let proxy = Proxy::start(prom.trim_start_matches("http://")).await;
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let url = format!("http://127.0.0.1:{}", proxy.port);
    let so = sref(
        "ml",
        &unique("stale-push"),
        &[
            ("prometheusServerAddress", url.as_str()),
            ("prometheusQuery", "sum(vllm:num_requests_waiting)"),
            ("prometheusPerReplica", "2"),
            ("sampleSeconds", "1"),
            ("staleAfterSeconds", "3"),
            ("mode", "reactive"),
        ],
    );
    let mut stream = c.stream_is_active(so.clone()).await.unwrap().into_inner();
    let msg = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("a push while active");
    assert!(msg.unwrap().unwrap().result);
    drop(stream);
    proxy.cut();
    let status = eventually(20, "IsActive UNAVAILABLE once the reading is stale", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { active(&mut c, &so).await.err() }
    })
    .await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let mut stream = c.stream_is_active(so.clone()).await.unwrap().into_inner();
    assert!(tokio::time::timeout(Duration::from_secs(3), stream.next()).await.is_err(), "no push from a stale reading");
}

#[tokio::test]
async fn stream_metric_spec_is_unimplemented_and_spec_is_static() {
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let so = sref(
        "ml",
        "spec",
        &[("rabbitmqHost", "amqp://127.0.0.1:1/%2f"), ("rabbitmqQueueName", "q"), ("metricName", "llama-replicas")],
    );
    let err = c.stream_metric_spec(so.clone()).await.expect_err("unimplemented");
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    // GetMetricSpec never depends on the (dead) source.
    for _ in 0..3 {
        let spec = c.get_metric_spec(so.clone()).await.expect("spec needs no source").into_inner();
        assert_eq!(spec.metric_specs.len(), 1);
        assert_eq!(spec.metric_specs[0].metric_name, "llama-replicas");
        assert_eq!((spec.metric_specs[0].target_size, spec.metric_specs[0].target_size_float), (1, 1.0));
    }
}

#[tokio::test]
async fn http_endpoints_and_graceful_sigterm() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    let mut srv = Server::start(&[]);
    assert_eq!(srv.get("/healthz").await.0, 200);
    assert_eq!(srv.get("/readyz").await.0, 200);
    let c = srv.client().await;
    let queue = unique("q-http-ep");
    let (_conn, _ch) = rabbit_queue(&amqp, &queue).await;
    let so = sref(
        "ml",
        "dbg",
        &[("rabbitmqHost", &amqp), ("rabbitmqQueueName", &queue), ("sampleSeconds", "1"), ("mode", "reactive")],
    );
    eventually(10, "answer", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { metric(&mut c, &so).await.ok() }
    })
    .await;
    let (code, m) = srv.get("/metrics").await;
    assert_eq!(code, 200);
    for want in [
        "prescale_grpc_requests_total{rpc=\"GetMetrics\",code=\"OK\"}",
        "prescale_source_polls_total{kind=\"rabbitmq\"",
        "prescale_source_poll_duration_seconds_bucket",
        "prescale_planned_replicas{namespace=\"ml\",scaledobject=\"dbg\"} 0",
        "prescale_demand_replicas{namespace=\"ml\",scaledobject=\"dbg\"}",
        "prescale_reactive_replicas{namespace=\"ml\",scaledobject=\"dbg\"} 0",
    ] {
        assert!(m.contains(want), "/metrics lacks {want}:\n{m}");
    }
    // `mode: reactive` runs no planner, so it has no planner series (never a made-up 0).
    assert!(!m.contains("prescale_planner_replicas{namespace=\"ml\",scaledobject=\"dbg\"}"), "{m}");
    let (code, d) = srv.get("/debug/scalers").await;
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&d).unwrap();
    let so = &v["scaledObjects"][0];
    assert_eq!(so["scaledObject"], "ml/dbg");
    assert_eq!(so["config"]["sources"][0]["kind"], "rabbitmq");
    assert_eq!(so["config"]["sources"][0]["queue"], queue.as_str());
    assert!(so["snapshot"]["signals"][0]["lastGoodMs"].is_u64(), "{so}");
    assert!(so["snapshot"]["reason"].is_string(), "{so}");
    assert!(so["signalAgesSeconds"][0].as_f64().unwrap() < 5.0, "{so}");
    assert!(!d.contains("guest:guest"), "credentials in /debug/scalers");

    drop(c);
    let status = srv.terminate();
    assert!(status.success(), "SIGTERM is a clean exit: {status:?}");
    let log = srv.log.lock().unwrap().join("\n");
    assert!(log.contains("shutting down") && log.contains("stopped"), "{log}");
}

#[tokio::test]
async fn shadow_mode_answers_reactively_and_exposes_the_planner() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    let queue = unique("q-shadow");
    let (_conn, ch) = rabbit_queue(&amqp, &queue).await;
    publish_on(&ch, &queue, 30).await;
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let shadow = sref(
        "ml",
        "shadow",
        &[
            ("rabbitmqHost", &amqp),
            ("rabbitmqQueueName", &queue),
            ("rabbitmqPerReplica", "10"),
            ("sampleSeconds", "1"),
            ("mode", "shadow"),
            ("warmupSeconds", "120"),
        ],
    );
    // Shadow: KEDA gets the reactive answer, ceil(30/10) = 3.
    eventually(15, "shadow answers reactively", || {
        let (mut c, so) = (c.clone(), shadow.clone());
        async move { (metric(&mut c, &so).await.ok() == Some(3)).then_some(()) }
    })
    .await;
    let predictive = sref(
        "ml",
        "predictive",
        &[
            ("rabbitmqHost", &amqp),
            ("rabbitmqQueueName", &queue),
            ("rabbitmqPerReplica", "10"),
            ("sampleSeconds", "1"),
            ("warmupSeconds", "120"),
        ],
    );
    let v = eventually(15, "predictive answers", || {
        let (mut c, so) = (c.clone(), predictive.clone());
        async move { metric(&mut c, &so).await.ok() }
    })
    .await;
    assert!(v >= 3, "the planner never plans below the current demand of 3 replica-equivalents: {v}");
    assert!(active(&mut c, &predictive).await.unwrap());

    let (_, d) = srv.get("/debug/scalers").await;
    let v: serde_json::Value = serde_json::from_str(&d).unwrap();
    let find = |name: &str| {
        v["scaledObjects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["scaledObject"] == format!("ml/{name}"))
            .cloned()
            .unwrap()
    };
    let sh = find("shadow");
    assert!(sh["snapshot"]["reason"].as_str().unwrap().starts_with("shadow:"), "{sh}");
    assert!(sh["snapshot"]["planner"]["desired"].is_u64(), "shadow exposes what the planner would do: {sh}");
    assert_eq!(sh["snapshot"]["reactiveReplicas"], 3);
    // ...and on /metrics, so a shadow run can be compared with the answers over days: the
    // answer, the reactive rule's count and the planner's, each per ScaledObject.
    let (_, page) = srv.get("/metrics").await;
    let gauge = |name: &str, so: &str| {
        prescale::sources::exposition::parse(&page)
            .unwrap()
            .into_iter()
            .find(|x| x.name == name && x.label("scaledobject") == Some(so) && x.label("namespace") == Some("ml"))
            .map(|x| x.value)
    };
    assert_eq!(gauge("prescale_planned_replicas", "shadow"), Some(3.0), "{page}");
    assert_eq!(gauge("prescale_reactive_replicas", "shadow"), Some(3.0), "{page}");
    let planner = gauge("prescale_planner_replicas", "shadow").unwrap_or_else(|| panic!("no planner gauge: {page}"));
    assert!(planner >= 3.0, "the planner never plans below the current demand: {page}");
    assert!(gauge("prescale_planner_replicas", "predictive").is_some(), "{page}");
    let pr = find("predictive");
    assert!(pr["snapshot"]["reason"].as_str().unwrap().starts_with("planner:"), "{pr}");
    assert_eq!(pr["snapshot"]["planner"]["warmupPlannedSeconds"], 120.0);
    assert!(pr["snapshot"]["planner"]["forecast"].is_object(), "{pr}");
    // Without a cluster the planner plans from the count its answers left the HPA at.
    assert_eq!(pr["snapshot"]["planner"]["fleet"]["from"], "answers", "{pr}");
    // The per-ScaledObject page carries the planner's history.
    let (code, one) = srv.get("/debug/scalers/ml/predictive").await;
    assert_eq!(code, 200);
    let one: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert!(one["triggers"][0]["planner"].is_object(), "{one}");
    // ...and its spend against the KEDA + HPA shadow (the budget that holds it back).
    let budget = &one["triggers"][0]["planner"]["budget"];
    assert!(budget["shadow_replica_seconds"].is_number() && budget["spent"].is_boolean(), "{one}");
    // ...and what its own fleet served late (null until an arrival has been judged).
    let own = budget.get("own_recent_miss_share").unwrap_or_else(|| panic!("no own miss share: {one}"));
    assert!(own.is_null() || own.as_f64().is_some_and(|v| (0.0..=1.0).contains(&v)), "{one}");
    // ...and how much the recent spread of its forecast errors widens its margin now.
    let spread = one["triggers"][0]["planner"]["error_spread_scale"].as_f64();
    assert!(spread.is_some_and(|v| (1.0..=1.5).contains(&v)), "{one}");
    // ...and how strongly a dip below the hour's level widens the next change's margin.
    let slope = one["triggers"][0]["planner"]["dip_reversion_slope"].as_f64();
    assert!(slope.is_some_and(|v| (-1.0..=0.0).contains(&v)), "{one}");
    // ...and how strongly a rise at the same minute of the last hours widens it.
    let echo = one["triggers"][0]["planner"]["hourly_echo_slope"].as_f64();
    assert!(echo.is_some_and(|v| (0.0..=1.0).contains(&v)), "{one}");
    assert_eq!(srv.get("/debug/scalers/ml/nope").await.0, 404);
}

/// The earliest point with demand in the recent history of the trigger of `ml/edited` whose
/// planner mode and first source's per-replica value are these (`/debug/scalers`), with the
/// trigger's warm-start note.
async fn recent_history(srv: &Server, mode: &str, per_replica: f64) -> Option<(f64, String)> {
    let (_, body) = srv.get("/debug/scalers/ml/edited").await;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let t = v["triggers"]
        .as_array()?
        .iter()
        .find(|t| t["config"]["planner"]["mode"] == mode && t["config"]["sources"][0]["perReplica"] == per_replica)?
        .clone();
    // (The ring of the finest tier reads 0 before the first observation: the first demand.)
    let first = t["planner"]["recent"]
        .as_array()?
        .iter()
        .filter(|p| p["rate"].as_f64().is_some_and(|r| r > 0.0))
        .filter_map(|p| p["t_s"].as_f64())
        .reduce(f64::min)?;
    Some((first, t["snapshot"]["history"].as_str().unwrap_or("").to_string()))
}

/// Leaving `mode: shadow` (or any edit of the metadata) is a new trigger to prescale. Its
/// planner used to start cold, so the days a cautious team ran in shadow (or reactively)
/// taught the planner they then switched on nothing; it now replays what the old metadata
/// observed, when the demand is measured in the same units.
#[tokio::test]
async fn an_edit_of_the_metadata_keeps_what_the_planner_learnt_when_the_demand_units_stay() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    let queue = unique("q-edit");
    let (_conn, ch) = rabbit_queue(&amqp, &queue).await;
    publish_on(&ch, &queue, 30).await;
    let srv = Server::start(&[]);
    let c = srv.client().await;
    let md = |extra: &[(&'static str, &'static str)]| {
        let mut v: Vec<(&str, &str)> = vec![
            ("rabbitmqHost", &amqp),
            ("rabbitmqQueueName", &queue),
            ("rabbitmqPerReplica", "10"),
            ("sampleSeconds", "1"),
        ];
        v.extend_from_slice(extra);
        sref("ml", "edited", &v)
    };
    let ask = |r: prescale::proto::ScaledObjectRef, secs: u64| {
        let c = c.clone();
        async move {
            let end = std::time::Instant::now() + Duration::from_secs(secs);
            while std::time::Instant::now() < end {
                let _ = metric(&mut c.clone(), &r).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    let unix = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    // The edited trigger's planner once its warm-up from the old metadata is done: the first
    // point with demand in its history, and how many samples it was fed.
    let warmed = |mode: &'static str| {
        let s = &srv;
        async move {
            eventually(20, "the edited trigger warmed from the old metadata", || async move {
                let (first, note) = recent_history(s, mode, 10.0).await?;
                let fed = note
                    .strip_prefix("warmed from the previous metadata: ")?
                    .split(' ')
                    .next()?
                    .parse::<usize>()
                    .ok()?;
                Some((first, fed))
            })
            .await
        }
    };
    // Reactive first: no planner, but what it observes is kept.
    let started = unix();
    ask(md(&[("mode", "reactive")]), 20).await;
    // Into shadow mode, same sources: the planner starts from the reactive days.
    ask(md(&[("mode", "shadow")]), 1).await;
    let (first, fed) = warmed("shadow").await;
    // (From the first whole 5-s bucket: a cold planner's history would start 20 s later.)
    assert!(first <= started + 6.0, "the reactive history carried over: first demand at {first}, started {started}");
    assert!(fed >= 10, "20 one-second samples, less the partial 5-s buckets at either end: {fed}");
    // Out of shadow mode: from the shadow planner, which holds the reactive days too.
    ask(md(&[("mode", "predictive")]), 1).await;
    let (first, fed) = warmed("predictive").await;
    assert!(first <= started + 6.0, "first demand at {first}, started {started}");
    assert!(fed >= 12, "{fed}");

    // Another edit that changes what one replica absorbs: the old history is in other units,
    // so the planner starts cold.
    let rescaled = md(&[("mode", "predictive"), ("rabbitmqPerReplica", "5")]);
    let edited_at = unix();
    ask(rescaled, 4).await;
    let (first_cold, note) = recent_history(&srv, "predictive", 5.0).await.expect("history");
    assert!(!note.starts_with("warmed"), "{note}");
    // (Its first observation covers the sample period before its first tick, so its first 5-s
    // bucket starts at most 6 s before the edit; the old history began 25 s before.)
    assert!(first_cold >= edited_at - 6.5, "nothing carried over: {first_cold} vs the edit at {edited_at}");
}

/// KEDA's GetMetricSpec, GetMetrics and IsActive share one 3-s deadline. While a new
/// ScaledObject's first read hangs, its calls wait for it once, from its registration: the
/// first call waits, the next ones answer UNAVAILABLE at once instead of waiting again (two
/// waits of 1.4 s left KEDA's adapter no time to retry).
#[tokio::test]
async fn the_first_read_is_waited_for_once_per_scaled_object_not_once_per_call() {
    // A Prometheus that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((sock, _)) = silent.accept().await {
            open.push(sock);
        }
    });
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let url = format!("http://{addr}");
    let so = sref(
        "llm",
        "hanging",
        &[
            ("prometheusServerAddress", url.as_str()),
            ("prometheusQuery", "sum(vllm:num_requests_waiting)"),
            ("prometheusPerReplica", "4"),
            ("sourceTimeoutSeconds", "20"),
        ],
    );
    let t = std::time::Instant::now();
    let first = metric(&mut c, &so).await.expect_err("no reading yet");
    let waited = t.elapsed();
    assert_eq!(first.code(), tonic::Code::Unavailable, "{first:?}");
    assert!(waited >= Duration::from_millis(1_000), "the first call waits for the first read: {waited:?}");
    let t = std::time::Instant::now();
    let second = active(&mut c, &so).await.expect_err("still no reading");
    let third = metric(&mut c, &so).await.expect_err("still no reading");
    let again = t.elapsed();
    assert_eq!((second.code(), third.code()), (tonic::Code::Unavailable, tonic::Code::Unavailable));
    assert!(again < Duration::from_millis(700), "the wait is not paid again: {again:?}");
    held.abort();
}
