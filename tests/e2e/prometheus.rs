//! A real Prometheus scraping a fixture target → the query value and its activation.

use crate::harness::*;

#[tokio::test]
async fn prometheus_query_value_and_activation() {
    let Some(prom) = service("PRESCALE_TEST_PROM") else { return };
    let tag = unique("t").replace('-', "_");
    let exporter = Exporter::start(
        19101,
        &format!("# TYPE prescale_fixture_queue gauge\nprescale_fixture_queue{{run=\"{tag}\"}} 7\n"),
    )
    .await;
    let srv = Server::start(&[]);
    let mut c = srv.client().await;
    let query = format!("sum(prescale_fixture_queue{{run=\"{tag}\"}})");
    let so = sref(
        "obs",
        &unique("prom"),
        &[
            ("prometheusServerAddress", &prom),
            ("prometheusQuery", &query),
            ("prometheusPerReplica", "2"),
            ("prometheusActivationThreshold", "5"),
            ("sampleSeconds", "1"),
            ("mode", "reactive"),
        ],
    );
    // 7 > 5: active, ceil(7/2) = 4. Prometheus needs a few seconds for the first scrape.
    eventually(40, "GetMetrics = 4 from Prometheus", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { (metric(&mut c, &so).await.ok() == Some(4)).then_some(()) }
    })
    .await;
    assert!(active(&mut c, &so).await.unwrap());

    // 3 ≤ activation threshold 5: inactive, and KEDA's activation wins (0).
    exporter.set(&format!("prescale_fixture_queue{{run=\"{tag}\"}} 3\n"));
    eventually(30, "inactive at 3 ≤ 5", || {
        let (mut c, so) = (c.clone(), so.clone());
        async move { (metric(&mut c, &so).await.ok() == Some(0)).then_some(()) }
    })
    .await;
    assert!(!active(&mut c, &so).await.unwrap());

    // An empty result is an error (UNAVAILABLE), not a zero, unless ignoreNullValues.
    let missing = sref(
        "obs",
        &unique("empty"),
        &[
            ("prometheusServerAddress", &prom),
            ("prometheusQuery", "sum(prescale_no_such_series_xyz)"),
            ("prometheusPerReplica", "1"),
            ("sampleSeconds", "1"),
        ],
    );
    let err = metric(&mut c, &missing).await.expect_err("empty result is not 0");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(err.message().contains("no series"), "{}", err.message());
    let tolerant = sref(
        "obs",
        &unique("empty-ok"),
        &[
            ("prometheusServerAddress", &prom),
            ("prometheusQuery", "prescale_no_such_series_xyz"),
            ("prometheusPerReplica", "1"),
            ("prometheusIgnoreNullValues", "true"),
            ("sampleSeconds", "1"),
            ("mode", "reactive"),
        ],
    );
    let v = eventually(10, "ignoreNullValues reads 0", || {
        let (mut c, so) = (c.clone(), tolerant.clone());
        async move { metric(&mut c, &so).await.ok() }
    })
    .await;
    assert_eq!(v, 0);
    drop(exporter);
}
