//! Bad metadata: INVALID_ARGUMENT naming the key, the value and namespace/name.

use crate::harness::*;

#[tokio::test]
async fn bad_metadata_is_invalid_argument_naming_key_and_scaled_object() {
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let base = [("rabbitmqHost", "amqp://guest:guest@127.0.0.1:5672/%2f"), ("rabbitmqQueueName", "q")];
    type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, Option<&'a str>);
    let cases: Vec<Case> = vec![
        // unknown key (with a "did you mean")
        ([&base[..], &[("rabbitmqQueuName", "q")]].concat(), "rabbitmqQueuName", None),
        // bad number
        ([&base[..], &[("rabbitmqPerReplica", "twenty")]].concat(), "rabbitmqPerReplica", Some("twenty")),
        // missing queue name
        (vec![("rabbitmqHost", "amqp://guest:guest@127.0.0.1:5672/%2f")], "rabbitmqQueueName", None),
        // planner keys
        ([&base[..], &[("warmupSeconds", "soon")]].concat(), "warmupSeconds", Some("soon")),
        ([&base[..], &[("mode", "yolo")]].concat(), "mode", Some("yolo")),
        // nothing to read
        (vec![("scalerAddress", "x:9090")], "rabbitmqQueueName", None),
    ];
    for (md, key, value) in cases {
        let so = sref("team-a", "broken", &md);
        for call in ["spec", "metrics", "active"] {
            let err = match call {
                "spec" => c.get_metric_spec(so.clone()).await.map(|_| ()),
                "metrics" => metric(&mut c, &so).await.map(|_| ()),
                _ => active(&mut c, &so).await.map(|_| ()),
            }
            .expect_err("bad metadata must be rejected");
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{call} {key}: {err:?}");
            let msg = err.message();
            assert!(msg.contains(key), "{call}: names the key {key}: {msg}");
            assert!(msg.contains("team-a/broken"), "{call}: names the ScaledObject: {msg}");
            if let Some(v) = value {
                assert!(msg.contains(v), "{call}: names the value {v}: {msg}");
            }
            assert!(!msg.contains("guest:guest"), "credentials redacted: {msg}");
        }
    }
    // A good ScaledObject on the same server still works (nothing lost).
    let ok = sref("team-a", "fine", &base);
    c.get_metric_spec(ok).await.expect("valid metadata is accepted");
}
