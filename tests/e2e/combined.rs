//! One ScaledObject combining RabbitMQ + SQS + Kafka + vLLM + DCGM on a live `serve`:
//! the plan follows whichever signal is largest, and losing a signal holds the plan
//! until staleAfterSeconds, then UNAVAILABLE — never a smaller plan. And 300
//! ScaledObjects over 3 shared endpoints use one connection / poll per endpoint.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use lapin::options::QueuePurgeOptions;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::harness::*;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

fn vllm_text(waiting: f64, running: f64) -> String {
    format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"{MODEL}\"}} {running:.1}\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"{MODEL}\"}} {waiting:.1}\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"{MODEL}\"}} 0.765\n\
         # HELP vllm:request_success_total Count of successfully processed requests.\n\
         # TYPE vllm:request_success_total counter\n\
         vllm:request_success_total{{engine=\"0\",finished_reason=\"length\",model_name=\"{MODEL}\"}} 131.0\n"
    )
}

async fn kafka_lag(bs: &str, topic: &str, group: &str, produced: usize, committed: i64) {
    let producer: FutureProducer = ClientConfig::new().set("bootstrap.servers", bs).create().unwrap();
    for i in 0..produced {
        let k = format!("{i}");
        producer
            .send(FutureRecord::to(topic).partition(0).key(&k).payload("x"), Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let (bs, topic, group) = (bs.to_string(), topic.to_string(), group.to_string());
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer =
            ClientConfig::new().set("bootstrap.servers", &bs).set("group.id", &group).create().unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Offset(committed)).unwrap();
        c.commit(&tpl, CommitMode::Sync).unwrap();
    })
    .await
    .unwrap();
}

async fn sqs_queue(endpoint: &str, n: usize) -> String {
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(aws_sdk_sqs::config::Credentials::new("test", "test", None, None, "static"))
        .load()
        .await;
    let sqs = aws_sdk_sqs::Client::new(&conf);
    let url = sqs.create_queue().queue_name(unique("combined")).send().await.unwrap().queue_url.unwrap();
    for i in 0..n {
        sqs.send_message().queue_url(&url).message_body(format!("{i}")).send().await.unwrap();
    }
    url
}

const AWS_ENV: [(&str, &str); 3] =
    [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_EC2_METADATA_DISABLED", "true")];

#[tokio::test(flavor = "multi_thread")]
async fn five_signals_plan_follows_the_largest_and_never_drops_on_loss() {
    let (Some(amqp), Some(sqs_ep)) = (service("PRESCALE_TEST_AMQP"), service("PRESCALE_TEST_SQS")) else { return };
    let ns = "llm";
    // RabbitMQ: 45 messages / 10 per replica = 4.5
    let queue = unique("q-combined");
    let (_conn, ch) = rabbit_queue(&amqp, &queue).await;
    publish_on(&ch, &queue, 45).await;
    // SQS: 12 / 5 = 2.4
    let sqs_url = sqs_queue(&sqs_ep, 12).await;
    // Kafka: lag 12 / 10 = 1.2
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("prompts", 1, 1).unwrap();
    let bs = cluster.bootstrap_servers();
    kafka_lag(&bs, "prompts", "workers", 20, 8).await;
    // vLLM: (6 + 8) / 16 = 0.875
    let vllm = Exporter::start(0, &vllm_text(6.0, 8.0)).await;
    // DCGM: 2 pods × 90 % / 80 = 2.25
    let dcgm = Exporter::start(0, &dcgm_util_page(ns, &[("vllm-0", 90.0), ("vllm-1", 90.0)])).await;

    let srv = Server::start_with_env(&[], &AWS_ENV);
    let c = srv.client().await;
    let vllm_ep = format!("http://127.0.0.1:{}", vllm.port);
    let dcgm_ep = format!("http://127.0.0.1:{}", dcgm.port);
    let so = sref(
        ns,
        "llama",
        &[
            ("rabbitmqHost", &amqp),
            ("rabbitmqQueueName", &queue),
            ("rabbitmqPerReplica", "10"),
            ("sqsQueueURL", &sqs_url),
            ("sqsAwsRegion", "us-east-1"),
            ("sqsAwsEndpoint", &sqs_ep),
            ("kafkaBootstrapServers", &bs),
            ("kafkaConsumerGroup", "workers"),
            ("kafkaTopic", "prompts"),
            ("kafkaAllowIdleConsumers", "true"),
            ("vllmEndpoints", &vllm_ep),
            ("vllmPerReplica", "16"),
            ("dcgmEndpoints", &dcgm_ep),
            ("dcgmUtilizationTarget", "80"),
            ("sampleSeconds", "1"),
            ("staleAfterSeconds", "5"),
            ("sourceTimeoutSeconds", "0.5"),
            ("mode", "reactive"),
        ],
    );
    let want = |n: i64, what: &'static str| {
        let (c, so) = (c.clone(), so.clone());
        async move {
            eventually(25, what, || {
                let (mut c, so) = (c.clone(), so.clone());
                async move { (metric(&mut c, &so).await.ok() == Some(n)).then_some(()) }
            })
            .await
        }
    };
    let driver = |srv: &Server| {
        let http = srv.http.clone();
        async move {
            let d: serde_json::Value =
                reqwest::get(format!("{http}/debug/scalers")).await.unwrap().json().await.unwrap();
            d["scaledObjects"][0]["snapshot"]["driver"].as_str().unwrap_or_default().to_string()
        }
    };
    want(5, "RabbitMQ drives: ceil(4.5) = 5").await;
    assert!(driver(&srv).await.starts_with("rabbitmq"), "{}", driver(&srv).await);
    // Each other signal in turn becomes the largest.
    dcgm.set(&dcgm_util_page(
        ns,
        &[("vllm-0", 100.0), ("vllm-1", 100.0), ("vllm-2", 100.0), ("vllm-3", 100.0), ("vllm-4", 100.0)],
    ));
    want(7, "DCGM drives: 5 pods × 100 / 80 = 6.25 → 7").await;
    assert!(driver(&srv).await.starts_with("dcgm"), "{}", driver(&srv).await);
    vllm.set(&vllm_text(120.0, 8.0));
    want(8, "vLLM drives: 128 / 16 = 8").await;
    assert!(driver(&srv).await.starts_with("vllm"), "{}", driver(&srv).await);
    kafka_lag(&bs, "prompts", "workers", 100, 8).await; // lag 112 / 10
    want(12, "Kafka drives: 11.2 → 12").await;
    assert!(driver(&srv).await.starts_with("kafka"), "{}", driver(&srv).await);
    let _ = sqs_queue(&sqs_ep, 0).await;
    ch.queue_purge(queue.as_str().into(), QueuePurgeOptions::default()).await.unwrap();

    // Lose the driving signal (Kafka): the plan holds at 12 — never smaller — until
    // staleAfterSeconds, then UNAVAILABLE.
    drop(cluster);
    let lost = Instant::now();
    let mut c2 = c.clone();
    loop {
        match metric(&mut c2, &so).await {
            Ok(v) => {
                assert!(v >= 12, "plan dropped to {v} after losing a signal ({:?} after loss)", lost.elapsed());
                assert!(
                    lost.elapsed() < Duration::from_secs(12),
                    "still answering {:?} after the loss",
                    lost.elapsed()
                );
            }
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable);
                assert!(s.message().contains("kafka"), "{}", s.message());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(lost.elapsed() >= Duration::from_secs(3), "UNAVAILABLE before staleAfterSeconds: {:?}", lost.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn three_hundred_scaled_objects_over_three_endpoints_share_polls() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    let queue = unique("q-300");
    let (_conn, _ch) = rabbit_queue(&amqp, &queue).await;
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("t", 1, 1).unwrap();
    let bs = cluster.bootstrap_servers();
    kafka_lag(&bs, "t", "g", 5, 0).await;
    let vllm = Exporter::start(0, &vllm_text(3.0, 1.0)).await;
    let vllm_ep = format!("http://127.0.0.1:{}", vllm.port);

    let srv = Server::start(&[]);
    let c = srv.client().await;
    let mut refs = Vec::new();
    for i in 0..300 {
        let md: Vec<(&str, &str)> = match i % 3 {
            0 => vec![("rabbitmqHost", &amqp), ("rabbitmqQueueName", &queue)],
            1 => vec![("kafkaBootstrapServers", &bs), ("kafkaConsumerGroup", "g"), ("kafkaTopic", "t")],
            _ => vec![("vllmEndpoints", &vllm_ep)],
        };
        let mut md = md;
        md.extend([("sampleSeconds", "1"), ("mode", "reactive")]);
        let r = sref(&format!("team-{}", i % 10), &format!("so-{i}"), &md);
        let mut cc = c.clone();
        cc.get_metric_spec(r.clone()).await.unwrap();
        refs.push(r);
    }
    for r in refs.iter().take(3) {
        eventually(20, "answers", || {
            let (mut c, r) = (c.clone(), r.clone());
            async move { metric(&mut c, &r).await.ok() }
        })
        .await;
    }
    let (_, m) = srv.get("/metrics").await;
    let grep = |pat: &str| m.lines().filter(|l| l.contains(pat)).collect::<Vec<_>>().join("\n");
    assert!(m.contains("prescale_scaled_objects 300"), "{}", grep("scaled_objects"));
    assert!(m.contains("prescale_pollers 3"), "one poll per endpoint: {}", grep("pollers"));
    assert!(m.contains("prescale_source_connections{kind=\"amqp\"} 1"), "{}", grep("connections"));
    // The vLLM endpoint is scraped once per tick, not once per ScaledObject.
    let before = vllm.hits.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let scrapes = vllm.hits.load(Ordering::Relaxed) - before;
    assert!((2..=8).contains(&scrapes), "100 ScaledObjects on one vLLM endpoint: {scrapes} scrapes in 4 s (want ~4)");
    drop(cluster);
}
