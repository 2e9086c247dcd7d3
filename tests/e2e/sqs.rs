//! SQS end to end against moto (an SQS-compatible server from PyPI).

use aws_sdk_sqs::config::Credentials;

use crate::harness::*;

async fn client(endpoint: &str) -> aws_sdk_sqs::Client {
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("test", "test", None, None, "static"))
        .load()
        .await;
    aws_sdk_sqs::Client::new(&conf)
}

#[tokio::test]
async fn sqs_visible_in_flight_and_delayed() {
    let Some(endpoint) = service("PRESCALE_TEST_SQS") else { return };
    let sqs = client(&endpoint).await;
    let name = unique("jobs");
    let url = sqs.create_queue().queue_name(&name).send().await.unwrap().queue_url.unwrap();
    for i in 0..12 {
        sqs.send_message().queue_url(&url).message_body(format!("m{i}")).send().await.unwrap();
    }
    sqs.send_message().queue_url(&url).message_body("later").delay_seconds(600).send().await.unwrap();
    // 3 in flight
    sqs.receive_message().queue_url(&url).max_number_of_messages(3).visibility_timeout(600).send().await.unwrap();

    let env = [("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_EC2_METADATA_DISABLED", "true")];
    let srv = Server::start_with_env(&[], &env);
    let c = srv.client().await;
    let mk = |extra: &[(&str, &str)]| {
        let mut md = vec![
            ("sqsQueueURL", url.as_str()),
            ("sqsAwsRegion", "us-east-1"),
            ("sqsAwsEndpoint", endpoint.as_str()),
            ("sampleSeconds", "1"),
            ("mode", "reactive"),
        ];
        md.extend_from_slice(extra);
        sref("jobs", &unique("sqs"), &md)
    };
    let cases = [
        (mk(&[]), 3, "9 visible + 3 in flight = 12 → ceil(12/5)"),
        (mk(&[("sqsScaleOnInFlight", "false")]), 2, "9 visible → 2"),
        (mk(&[("sqsScaleOnDelayed", "true"), ("sqsQueueLength", "1")]), 13, "9 + 3 + 1 delayed = 13"),
    ];
    for (so, want, what) in cases {
        let v = eventually(20, what, || {
            let (mut c, so) = (c.clone(), so.clone());
            async move { metric(&mut c, &so).await.ok() }
        })
        .await;
        assert_eq!(v, want, "{what}");
    }
    // A queue that does not exist: UNAVAILABLE naming it, never 0.
    let missing = sref(
        "jobs",
        &unique("sqs-missing"),
        &[
            ("sqsQueueURL", &format!("{endpoint}/123456789012/{}", unique("nope"))),
            ("sqsAwsRegion", "us-east-1"),
            ("sqsAwsEndpoint", endpoint.as_str()),
            ("sampleSeconds", "1"),
        ],
    );
    let mut cc = c.clone();
    let err = metric(&mut cc, &missing).await.expect_err("missing queue is not 0");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("sqs"), "{}", err.message());
}
