//! The external metrics API over HTTPS with real clients: front-proxy certificates and
//! headers, client-CA users, bearer tokens (TokenReview), SubjectAccessReview denials,
//! a wrong CA, no credentials, discovery, quantities, 404/503, and certificate reload.
//! The Kubernetes API (TokenReview, SubjectAccessReview) is a fake served by the test.

use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

use crate::harness::*;

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let pem = p.self_signed(&key).unwrap().pem();
    Ca { pem, issuer: Issuer::new(p, key) }
}

/// (cert PEM, key PEM) for `cn` (O = `org`), with SAN `localhost`.
fn leaf(ca: &Ca, cn: &str, org: Option<&str>) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    if let Some(o) = org {
        p.distinguished_name.push(DnType::OrganizationName, o);
    }
    (p.signed_by(&key, &ca.issuer).unwrap().pem(), key.serialize_pem())
}

/// A fake kube-apiserver answering TokenReview and SubjectAccessReview.
async fn fake_kube(front_ca_pem: String) -> (u16, tokio::task::JoinHandle<()>) {
    use axum::routing::{get, post};
    // kube-apiserver publishes the aggregation-layer settings in this ConfigMap.
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system", "resourceVersion": "42"},
        "data": {
            "requestheader-client-ca-file": front_ca_pem,
            "requestheader-allowed-names": "[\"front-proxy-client\"]",
            "requestheader-username-headers": "[\"X-Remote-User\"]",
            "requestheader-group-headers": "[\"X-Remote-Group\"]",
            "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]"
        }
    });
    let app = axum::Router::new()
        .route(
            "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
            get(move || {
                let cm = cm.clone();
                async move { axum::Json(cm) }
            }),
        )
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(|axum::Json(tr): axum::Json<serde_json::Value>| async move {
                let ok = tr["spec"]["token"] == "good-token";
                let mut out = tr.clone();
                out["status"] = if ok {
                    serde_json::json!({"authenticated": true, "user": {"username": "bob", "uid": "1", "groups": ["devs", "system:authenticated"]}})
                } else {
                    serde_json::json!({"authenticated": false, "error": "token not recognised"})
                };
                (axum::http::StatusCode::CREATED, axum::Json(out))
            }),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(|axum::Json(sar): axum::Json<serde_json::Value>| async move {
                let user = sar["spec"]["user"].as_str().unwrap_or_default().to_string();
                let ra = &sar["spec"]["resourceAttributes"];
                let metric_ok = ra.is_null()
                    || (ra["group"] == "external.metrics.k8s.io" && ra["verb"] == "list" && ra["version"] == "v1beta1");
                let allowed = user != "mallory" && metric_ok;
                let mut out = sar.clone();
                out["status"] = serde_json::json!({"allowed": allowed, "reason": if allowed {"RBAC: allowed"} else {"no rule"}});
                (axum::http::StatusCode::CREATED, axum::Json(out))
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (
        port,
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        }),
    )
}

/// The HPA controller's identity, as kube-apiserver's front proxy asserts it.
const HPA_SERVICE_ACCOUNT: &str = "system:serviceaccount:kube-system:horizontal-pod-autoscaler";

/// The front proxy's identity headers for `user` (a service account).
fn hpa_headers(rb: reqwest::RequestBuilder, user: &str) -> reqwest::RequestBuilder {
    rb.header("X-Remote-User", user)
        .header("X-Remote-Group", "system:serviceaccounts")
        .header("X-Remote-Group", "system:authenticated")
}

fn client(trust: &str, identity: Option<(&str, &str)>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(trust.as_bytes()).unwrap()])
        .timeout(Duration::from_secs(10));
    if let Some((c, k)) = identity {
        b = b.identity(reqwest::Identity::from_pem(format!("{c}{k}").as_bytes()).unwrap());
    }
    b.build().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn external_metrics_api_with_delegated_auth() {
    let Some(amqp) = service("PRESCALE_TEST_AMQP") else { return };
    // A queue with 30 messages → 3 replicas at 10 per replica.
    let queue = unique("q-ext");
    let (_conn, ch) = rabbit_queue(&amqp, &queue).await;
    publish_on(&ch, &queue, 30).await;

    let dir = std::env::temp_dir().join(unique("prescale-ext"));
    std::fs::create_dir_all(&dir).unwrap();
    let serving = ca("serving CA");
    let front = ca("front-proxy CA");
    let users = ca("client CA");
    let rogue = ca("rogue CA");
    let (srv_cert, srv_key) = leaf(&serving, "prescale", None);
    let proxy = leaf(&front, "front-proxy-client", None);
    let other_proxy = leaf(&front, "someone-else", None);
    let alice = leaf(&users, "alice", Some("team-a"));
    let evil = leaf(&rogue, "front-proxy-client", None);
    std::fs::write(dir.join("tls.crt"), &srv_cert).unwrap();
    std::fs::write(dir.join("tls.key"), &srv_key).unwrap();
    std::fs::write(dir.join("front-ca.pem"), &front.pem).unwrap();
    std::fs::write(dir.join("client-ca.pem"), &users.pem).unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::fs::write(
        dir.join("metrics.yaml"),
        format!(
            "metrics:\n- name: llama-queue\n  labels: {{model_name: llama}}\n  metadata:\n    rabbitmqHost: '{amqp}'\n    rabbitmqQueueName: '{queue}'\n    rabbitmqPerReplica: '10'\n    sampleSeconds: '1'\n    mode: reactive\n- name: broken\n  metadata:\n    rabbitmqHost: 'amqp://127.0.0.1:{closed}/%2f'\n    rabbitmqQueueName: q\n    sampleSeconds: '1'\n"
        ),
    )
    .unwrap();
    let (kport, _kube) = fake_kube(front.pem.clone()).await;
    std::fs::write(
        dir.join("kubeconfig"),
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: 'http://127.0.0.1:{kport}'}}\nusers:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: c\n  context: {{cluster: fake, user: u}}\ncurrent-context: c\n"),
    )
    .unwrap();
    let ext_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let addr = format!("127.0.0.1:{ext_port}");
    let kubeconfig = p("kubeconfig");
    let srv = Server::start_with_env(
        &[
            "--external-metrics-addr",
            &addr,
            "--external-metrics-config",
            &p("metrics.yaml"),
            "--external-metrics-cert",
            &p("tls.crt"),
            "--external-metrics-key",
            &p("tls.key"),
            "--requestheader-client-ca-file",
            &p("front-ca.pem"),
            "--requestheader-allowed-names",
            "front-proxy-client",
            "--client-ca-file",
            &p("client-ca.pem"),
        ],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    let base = format!("https://localhost:{ext_port}");
    let as_proxy = client(&serving.pem, Some((&proxy.0, &proxy.1)));
    let metric_url = format!(
        "{base}/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/LLAMA-QUEUE?labelSelector=model_name%3Dllama"
    );

    // Wait until the listener is up.
    eventually(20, "external metrics API up", || {
        let (c, u) = (as_proxy.clone(), format!("{base}/healthz"));
        async move { c.get(u).send().await.ok().filter(|r| r.status() == 200).map(|_| ()) }
    })
    .await;

    // The HPA through the front proxy: the planned replicas as a quantity; name lowercased.
    let body = eventually(20, "HPA reads 3 replicas", || {
        let (c, u) = (as_proxy.clone(), metric_url.clone());
        async move {
            let r = hpa_headers(c.get(u), HPA_SERVICE_ACCOUNT).send().await.ok()?;
            let v: serde_json::Value = r.json().await.ok()?;
            (v["items"][0]["value"] == "3").then_some(v)
        }
    })
    .await;
    assert_eq!(body["kind"], "ExternalMetricValueList");
    assert_eq!(body["apiVersion"], "external.metrics.k8s.io/v1beta1");
    assert_eq!(body["items"].as_array().unwrap().len(), 1, "one item per metric");
    assert_eq!(body["items"][0]["metricName"], "llama-queue");
    assert_eq!(body["items"][0]["metricLabels"]["model_name"], "llama");
    assert!(body["items"][0]["timestamp"].as_str().unwrap().ends_with('Z'));
    // The raw signal.
    let raw: serde_json::Value = hpa_headers(
        as_proxy.get(format!("{base}/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/llama-queue-raw")),
        "hpa",
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(raw["items"][0]["value"], "30", "{raw}");
    // A selector that does not match: no items (the HPA reports that as an error itself).
    let none: serde_json::Value = hpa_headers(
        as_proxy.get(format!(
            "{base}/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/llama-queue?labelSelector=model_name%3Dother"
        )),
        "hpa",
    )
    .send()
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(none["items"].as_array().unwrap().len(), 0);

    // Unknown metric: 404 Status. Broken source: 503, never a zero.
    let r = hpa_headers(as_proxy.get(format!("{base}/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/nope")), "hpa")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let st: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (st["kind"].as_str(), st["reason"].as_str(), st["code"].as_u64()),
        (Some("Status"), Some("NotFound"), Some(404))
    );
    let r =
        hpa_headers(as_proxy.get(format!("{base}/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/broken")), "hpa")
            .send()
            .await
            .unwrap();
    assert_eq!(r.status(), 503);
    let st: serde_json::Value = r.json().await.unwrap();
    assert_eq!(st["reason"], "ServiceUnavailable");

    // Discovery: aggregated Accept → 406 (the aggregator then falls back); legacy works.
    let r = hpa_headers(as_proxy.get(format!("{base}/apis")), "system:kube-aggregator")
        .header("Accept", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 406);
    let groups: serde_json::Value =
        hpa_headers(as_proxy.get(format!("{base}/apis")), "x").send().await.unwrap().json().await.unwrap();
    assert_eq!(groups["kind"], "APIGroupList");
    let res: serde_json::Value = as_proxy
        .get(format!("{base}/apis/external.metrics.k8s.io/v1beta1"))
        .header("X-Remote-User", "system:kube-aggregator")
        .header("X-Remote-Group", "system:masters")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(res["kind"], "APIResourceList");
    let names: Vec<&str> = res["resources"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(names, vec!["llama-queue", "llama-queue-raw", "broken", "broken-raw"]);

    // No certificate, no token: 401. A SubjectAccessReview denial: 403.
    let anon = client(&serving.pem, None);
    let r = anon.get(&metric_url).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = hpa_headers(as_proxy.get(&metric_url), "mallory").send().await.unwrap();
    assert_eq!(r.status(), 403);
    let st: serde_json::Value = r.json().await.unwrap();
    assert!(st["message"].as_str().unwrap().contains("mallory"), "{st}");
    // A front-proxy CN not in the allowed names: 401.
    let r = hpa_headers(client(&serving.pem, Some((&other_proxy.0, &other_proxy.1))).get(&metric_url), "hpa")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // A certificate from a CA prescale does not trust: refused (handshake or 401).
    if let Ok(r) = hpa_headers(client(&serving.pem, Some((&evil.0, &evil.1))).get(&metric_url), "hpa").send().await {
        assert_eq!(r.status(), 401);
    }
    // Bearer tokens through TokenReview.
    let r = anon.get(&metric_url).bearer_auth("good-token").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = anon.get(&metric_url).bearer_auth("bad-token").send().await.unwrap();
    assert_eq!(r.status(), 401);
    // Client-CA users (CN = user, O = groups).
    let r = client(&serving.pem, Some((&alice.0, &alice.1))).get(&metric_url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Probes are open.
    assert_eq!(anon.get(format!("{base}/healthz")).send().await.unwrap().status(), 200);

    // Certificate reload: swap in a pair from another CA; new connections get it.
    let serving2 = ca("serving CA 2");
    let (c2, k2) = leaf(&serving2, "prescale", None);
    std::fs::write(dir.join("tls.key.new"), &k2).unwrap();
    std::fs::write(dir.join("tls.crt.new"), &c2).unwrap();
    std::fs::rename(dir.join("tls.key.new"), dir.join("tls.key")).unwrap();
    std::fs::rename(dir.join("tls.crt.new"), dir.join("tls.crt")).unwrap();
    eventually(15, "the new certificate is served", || {
        let u = format!("{base}/healthz");
        let trust = serving2.pem.clone();
        async move { client(&trust, None).get(u).send().await.ok().filter(|r| r.status() == 200).map(|_| ()) }
    })
    .await;
    drop(srv);

    // Without CA flags, the front-proxy settings come from the
    // kube-system/extension-apiserver-authentication ConfigMap, as in a real cluster.
    let ext_port2 = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr2 = format!("127.0.0.1:{ext_port2}");
    let srv2 = Server::start_with_env(
        &[
            "--external-metrics-addr",
            &addr2,
            "--external-metrics-config",
            &p("metrics.yaml"),
            "--external-metrics-cert",
            &p("tls.crt"),
            "--external-metrics-key",
            &p("tls.key"),
        ],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    let base2 = format!("https://localhost:{ext_port2}");
    let url2 = format!("{base2}/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/llama-queue");
    let proxy2 = client(&serving2.pem, Some((&proxy.0, &proxy.1)));
    let v = eventually(20, "front proxy authenticated from the ConfigMap's CA", || {
        let (c, u) = (proxy2.clone(), url2.clone());
        async move {
            let r = hpa_headers(c.get(u), HPA_SERVICE_ACCOUNT).send().await.ok()?;
            (r.status() == 200).then_some(())?;
            r.json::<serde_json::Value>().await.ok()
        }
    })
    .await;
    assert_eq!(v["items"][0]["value"], "3", "{v}");
    // The ConfigMap's allowed names apply: another CN from the same CA is refused.
    let r = hpa_headers(client(&serving2.pem, Some((&other_proxy.0, &other_proxy.1))).get(&url2), "hpa")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    drop(srv2);
    let _ = std::fs::remove_dir_all(&dir);
}
