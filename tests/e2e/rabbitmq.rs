//! RabbitMQ end to end: real broker, real `prescale serve`, gRPC client.

use std::time::Duration;

use lapin::options::QueuePurgeOptions;
use lapin::Connection;

use crate::harness::*;

async fn publish(amqp: &str, queue: &str, n: usize) -> Connection {
    let (conn, ch) = rabbit_queue(amqp, queue).await;
    publish_on(&ch, queue, n).await;
    conn
}

async fn purge(conn: &Connection, queue: &str) {
    let ch = conn.create_channel().await.unwrap();
    ch.queue_purge(queue.into(), QueuePurgeOptions::default()).await.unwrap();
}

#[tokio::test]
async fn queue_length_over_amqp_scales_up_and_back_to_zero() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    let queue = unique("q-amqp");
    let conn = publish(&amqp, &queue, 45).await;
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let so = sref(
        "ml",
        &unique("llama"),
        &[
            ("scalerAddress", "prescale:9090"),
            ("rabbitmqHost", &amqp),
            ("rabbitmqQueueName", &queue),
            ("rabbitmqPerReplica", "20"),
            ("sampleSeconds", "1"),
            ("mode", "reactive"),
        ],
    );
    let spec = c.get_metric_spec(so.clone()).await.unwrap().into_inner();
    assert_eq!(spec.metric_specs.len(), 1);
    assert_eq!(spec.metric_specs[0].target_size, 1);
    assert_eq!(spec.metric_specs[0].target_size_float, 1.0);

    // ceil(45 / 20) = 3
    eventually(15, "GetMetrics = 3", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { (metric(&mut c, &so).await.ok() == Some(3)).then_some(()) }
    })
    .await;
    assert!(active(&mut c, &so).await.unwrap());

    purge(&conn, &queue).await;
    eventually(15, "GetMetrics = 0 after drain", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { (metric(&mut c, &so).await.ok() == Some(0)).then_some(()) }
    })
    .await;
    assert!(!active(&mut c, &so).await.unwrap());
}

#[tokio::test]
async fn management_api_queue_length_and_message_rate() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    let Some(http) = service("PRESCALE_TEST_RABBIT_HTTP") else { return };
    let queue = unique("q-http");
    let _conn = publish(&amqp, &queue, 30).await;
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let so = sref(
        "ml",
        &unique("http"),
        &[
            ("rabbitmqHost", &http),
            ("rabbitmqProtocol", "http"),
            ("rabbitmqQueueName", &queue),
            ("rabbitmqPerReplica", "7"),
            ("sampleSeconds", "1"),
            ("mode", "reactive"),
        ],
    );
    // The management API's counters are sampled (every 5 s by default): poll.
    eventually(30, "GetMetrics = ceil(30/7) = 5 over the management API", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { (metric(&mut c, &so).await.ok() == Some(5)).then_some(()) }
    })
    .await;

    // MessageRate: nothing is being published now, but the backlog keeps it active.
    let rate = sref(
        "ml",
        &unique("rate"),
        &[
            ("rabbitmqHost", &http),
            ("rabbitmqQueueName", &queue),
            ("rabbitmqMode", "MessageRate"),
            ("rabbitmqPerReplica", "100"),
            ("sampleSeconds", "1"),
            ("mode", "reactive"),
        ],
    );
    let v = eventually(15, "MessageRate answer", || {
        let (mut c, rate) = (c.clone(), rate.clone());
        async move { metric(&mut c, &rate).await.ok() }
    })
    .await;
    assert!(v >= 1, "MessageRate with a backlog is active, so at least 1 replica: {v}");
    assert!(active(&mut c, &rate).await.unwrap());
    let (_, dbg) = srv.get("/debug/scalers").await;
    assert!(dbg.contains("publish_rate"), "{dbg}");
    assert!(!dbg.contains("guest:guest"), "credentials leaked into /debug/scalers");
}

#[tokio::test]
async fn closed_port_is_unavailable_never_zero() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let so = sref(
        "ml",
        &unique("down"),
        &[
            ("rabbitmqHost", &format!("amqp://user:hunter2@127.0.0.1:{port}/%2f")),
            ("rabbitmqQueueName", "q"),
            ("sampleSeconds", "1"),
            ("staleAfterSeconds", "3"),
        ],
    );
    let started = std::time::Instant::now();
    for _ in 0..8 {
        let err = metric(&mut c, &so).await.expect_err("a source that never answered must not give a number");
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        assert!(err.message().contains("rabbitmq"), "names the source: {}", err.message());
        assert!(err.message().contains("ml/"), "names the ScaledObject: {}", err.message());
        assert!(!err.message().contains("hunter2"), "redacted: {}", err.message());
        let err = active(&mut c, &so).await.expect_err("IsActive fails too");
        assert_eq!(err.code(), tonic::Code::Unavailable);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn losing_a_working_source_holds_then_goes_unavailable() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    let queue = unique("q-cut");
    let _conn = publish(&amqp, &queue, 25).await;
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let so = sref(
        "ml",
        &unique("cut"),
        &[
            ("rabbitmqHost", &format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port)),
            ("rabbitmqQueueName", &queue),
            ("rabbitmqPerReplica", "10"),
            ("sampleSeconds", "1"),
            ("staleAfterSeconds", "4"),
            ("sourceTimeoutSeconds", "0.5"),
            ("mode", "reactive"),
        ],
    );
    eventually(15, "GetMetrics = 3 through the proxy", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { (metric(&mut c, &so).await.ok() == Some(3)).then_some(()) }
    })
    .await;
    proxy.cut();
    let cut_at = std::time::Instant::now();
    // Until staleAfterSeconds, the last good value holds; never a smaller plan.
    let mut saw_unavailable = false;
    while cut_at.elapsed() < Duration::from_secs(12) {
        match metric(&mut c, &so).await {
            Ok(v) => {
                assert!(!saw_unavailable || v == 3, "answered again after going unavailable?");
                assert_eq!(v, 3, "held at its last value while fresh");
                assert!(
                    cut_at.elapsed() < Duration::from_secs(7),
                    "still answering {:?} after the cut",
                    cut_at.elapsed()
                );
            }
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable);
                assert!(s.message().contains("stale"), "{}", s.message());
                saw_unavailable = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(saw_unavailable, "must go UNAVAILABLE once the last good read is older than staleAfterSeconds");
    assert!(
        cut_at.elapsed() >= Duration::from_secs(2),
        "went unavailable before staleAfterSeconds: {:?}",
        cut_at.elapsed()
    );
}

#[tokio::test]
async fn five_hundred_scaled_objects_share_one_amqp_connection() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    let Some(http) = service("PRESCALE_TEST_RABBIT_HTTP") else { return };
    let queues: Vec<String> = (0..5).map(|i| unique(&format!("q-share{i}"))).collect();
    for q in &queues {
        drop(publish(&amqp, q, 3).await);
    }
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let mut refs = Vec::new();
    for i in 0..500 {
        let q = &queues[i % queues.len()];
        let so = sref(
            &format!("ns{}", i % 7),
            &format!("so-{i}"),
            &[("rabbitmqHost", &amqp), ("rabbitmqQueueName", q), ("rabbitmqPerReplica", "1"), ("mode", "reactive")],
        );
        c.get_metric_spec(so.clone()).await.unwrap();
        refs.push(so);
    }
    for so in refs.iter().step_by(25) {
        let v = eventually(15, "every ScaledObject answers", || {
            let (mut c, so) = (c.clone(), so.clone());
            async move { metric(&mut c, &so).await.ok() }
        })
        .await;
        assert_eq!(v, 3);
    }
    let (_, m) = srv.get("/metrics").await;
    assert!(
        m.contains("prescale_source_connections{kind=\"amqp\"} 1"),
        "one AMQP connection:\n{}",
        grep(&m, "connections")
    );
    assert!(m.contains("prescale_pollers 5"), "one poll per queue:\n{}", grep(&m, "pollers"));
    assert!(m.contains("prescale_scaled_objects 500"), "{}", grep(&m, "scaled_objects"));

    // And the broker agrees: count its connections from this process.
    let pid = srv.pid().to_string();
    let base = url::Url::parse(&http).unwrap();
    let api = format!("http://{}:{}/api/connections", base.host_str().unwrap(), base.port().unwrap_or(15672));
    let n = eventually(20, "broker lists prescale's connection", || {
        let (api, pid) = (api.clone(), pid.clone());
        async move {
            let conns = json_of(reqwest::Client::new().get(&api).basic_auth("guest", Some("guest"))).await?;
            let n = conns
                .as_array()?
                .iter()
                .filter(|c| c["client_properties"]["connection_name"].as_str() == Some(&format!("prescale/{pid}")))
                .count();
            (n > 0).then_some(n)
        }
    })
    .await;
    assert_eq!(n, 1, "RabbitMQ sees exactly one connection from prescale");
}

fn grep(text: &str, pat: &str) -> String {
    text.lines().filter(|l| l.contains(pat)).collect::<Vec<_>>().join("\n")
}
