//! Kafka lag end to end: librdkafka's in-process mock cluster (a real Kafka-protocol
//! listener on loopback), a group that commits some offsets, the real `prescale serve`;
//! and the same against a real Kafka-protocol broker (tansu, built by `scripts/test.sh`'s
//! slow tier) when `PRESCALE_TEST_KAFKA` names one.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::harness::*;

async fn produce(bs: &str, topic: &str, counts: &[usize]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bs)
        .set("message.timeout.ms", "10000")
        // One record per batch: tansu 0.6 miscounts the end offset of multi-record batches.
        .set("linger.ms", "0")
        .create()
        .unwrap();
    for (p, n) in counts.iter().enumerate() {
        for i in 0..*n {
            let key = format!("k{i}");
            producer
                .send(FutureRecord::to(topic).partition(p as i32).key(&key).payload("x"), Duration::from_secs(10))
                .await
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
}

async fn commit(bs: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let (bs, group, topic, offsets) = (bs.to_string(), group.to_string(), topic.to_string(), offsets.to_vec());
    tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bs)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for (p, o) in offsets {
            tpl.add_partition_offset(&topic, p, Offset::Offset(o)).unwrap();
        }
        c.commit(&tpl, CommitMode::Sync).unwrap();
    })
    .await
    .unwrap();
}

fn so(bs: &str, group: &str, topic: Option<&str>, extra: &[(&str, &str)]) -> prescale::proto::ScaledObjectRef {
    let mut md = vec![
        ("kafkaBootstrapServers", bs),
        ("kafkaConsumerGroup", group),
        ("kafkaLagThreshold", "5"),
        ("sampleSeconds", "1"),
        ("mode", "reactive"),
    ];
    if let Some(t) = topic {
        md.push(("kafkaTopic", t));
    }
    md.extend_from_slice(extra);
    sref("stream", &unique("kafka"), &md)
}

async fn expect(
    c: &prescale::proto::external_scaler_client::ExternalScalerClient<tonic::transport::Channel>,
    so: &prescale::proto::ScaledObjectRef,
    want: i64,
    what: &str,
) {
    eventually(20, what, || {
        let (mut c, so) = (c.clone(), so.clone());
        async move {
            let v = metric(&mut c, &so).await;
            (v.as_ref().ok() == Some(&want)).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn consumer_group_lag_with_keda_semantics() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("orders", 3, 1).unwrap();
    let bs = cluster.bootstrap_servers();
    lag_scenario(&bs, "orders", "workers").await;
    drop(cluster);
}

/// A real Kafka-protocol broker (not librdkafka's mock): `PRESCALE_TEST_KAFKA` is its
/// bootstrap address. Skipped when unset, unless `PRESCALE_REQUIRE_KAFKA=1`.
#[tokio::test(flavor = "multi_thread")]
async fn real_kafka_broker_consumer_group_lag() {
    let bs = match std::env::var("PRESCALE_TEST_KAFKA") {
        Ok(v) if !v.is_empty() => v,
        _ => {
            assert!(
                std::env::var("PRESCALE_REQUIRE_KAFKA").as_deref() != Ok("1"),
                "PRESCALE_TEST_KAFKA is not set but PRESCALE_REQUIRE_KAFKA=1"
            );
            eprintln!("skipping: PRESCALE_TEST_KAFKA not set (scripts/test.sh starts tansu for this)");
            return;
        }
    };
    let topic = unique("orders");
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &bs).create().expect("admin client");
    let created = admin
        .create_topics(
            &[rdkafka::admin::NewTopic::new(&topic, 3, rdkafka::admin::TopicReplication::Fixed(1))],
            &rdkafka::admin::AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("CreateTopics");
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    lag_scenario(&bs, &topic, &unique("workers")).await;
}

/// Produce 10/20/30 records on partitions 0/1/2, commit 4 and 15 (partition 2 never), and
/// check KEDA's lag maths through the real `prescale serve`.
async fn lag_scenario(bs: &str, topic: &str, group: &str) {
    let bs = bs.to_string();
    produce(&bs, topic, &[10, 20, 30]).await;
    commit(&bs, group, topic, &[(0, 4), (1, 15)]).await; // partition 2: never committed

    let srv = Server::start(&[]);
    let c = srv.client().await;
    // latest: 6 + 5 + 1 = 12 → ceil(12 / 5) = 3
    let latest = so(&bs, group, Some(topic), &[]);
    expect(&c, &latest, 3, "latest: lag 12 → 3").await;
    // earliest + allowIdleConsumers: 6 + 5 + 30 = 41 → 9
    let idle =
        so(&bs, group, Some(topic), &[("kafkaOffsetResetPolicy", "earliest"), ("kafkaAllowIdleConsumers", "true")]);
    expect(&c, &idle, 9, "earliest, idle consumers allowed: 41 → 9").await;
    // earliest capped at the partition count: 3 partitions → 3 replicas
    let capped = so(&bs, group, Some(topic), &[("kafkaOffsetResetPolicy", "earliest")]);
    expect(&c, &capped, 3, "capped at 3 partitions").await;
    // No topic: every topic the group commits on.
    let all = so(&bs, group, None, &[]);
    expect(&c, &all, 3, "all topics of the group").await;

    // The group catches up: lag 0 on committed partitions, 1 on the never-committed one.
    commit(&bs, group, topic, &[(0, 10), (1, 20), (2, 30)]).await;
    expect(&c, &latest, 0, "caught up → 0 and inactive").await;
    let mut cc = c.clone();
    assert!(!active(&mut cc, &latest).await.unwrap());

    // Unknown group on an existing topic: every partition "latest" → 1 each → 3 partitions = 3 → 1 replica.
    let fresh = so(&bs, &unique("nobody"), Some(topic), &[]);
    expect(&c, &fresh, 1, "group without offsets").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scaled_objects_on_one_cluster_share_one_client() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    cluster.create_topic("a", 2, 1).unwrap();
    let bs = cluster.bootstrap_servers();
    produce(&bs, "a", &[7, 7]).await;
    commit(&bs, "g", "a", &[(0, 0), (1, 0)]).await;
    let srv = Server::start(&[]);
    let c = srv.client().await;
    let mut refs = Vec::new();
    for i in 0..50 {
        let r = so(&bs, "g", Some("a"), &[("kafkaLagThreshold", if i % 2 == 0 { "5" } else { "7" })]);
        refs.push(r);
    }
    for r in &refs {
        let mut cc = c.clone();
        cc.get_metric_spec(r.clone()).await.unwrap();
    }
    expect(&c, &refs[0], 3, "14 / 5").await;
    expect(&c, &refs[1], 2, "14 / 7").await;
    let (_, m) = srv.get("/metrics").await;
    // Two distinct polls (two thresholds), one metadata client + one group client.
    assert!(
        m.contains("prescale_pollers 2"),
        "{}",
        m.lines().filter(|l| l.contains("pollers")).collect::<Vec<_>>().join("\n")
    );
    assert!(
        m.contains("prescale_source_connections{kind=\"kafka\"} 2"),
        "{}",
        m.lines().filter(|l| l.contains("connections")).collect::<Vec<_>>().join("\n")
    );
    drop(cluster);
}
