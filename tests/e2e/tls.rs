//! TLS and mutual TLS on the gRPC port, as KEDA can be configured to use
//! (`enableTLS`, `caCert`, `tlsClientCert`/`tlsClientKey` in a TriggerAuthentication).

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use prescale::proto::external_scaler_client::ExternalScalerClient;

use crate::harness::*;

struct Pki {
    dir: std::path::PathBuf,
    ca_pem: String,
    client_cert: String,
    client_key: String,
    rogue_cert: String,
    rogue_key: String,
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    let pem = p.self_signed(&key).unwrap().pem();
    (p, key, pem)
}

fn leaf(issuer: &Issuer<'_, KeyPair>, san: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let p = CertificateParams::new(vec![san.to_string()]).unwrap();
    (p.signed_by(&key, issuer).unwrap().pem(), key.serialize_pem())
}

fn pki() -> Pki {
    let dir = std::env::temp_dir().join(unique("prescale-tls"));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca_params, ca_key, ca_pem) = ca("prescale test CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let (srv_cert, srv_key) = leaf(&issuer, "localhost");
    let (client_cert, client_key) = leaf(&issuer, "keda-operator");
    let (rogue_params, rogue_ca_key, _) = ca("rogue CA");
    let rogue_issuer = Issuer::new(rogue_params, rogue_ca_key);
    let (rogue_cert, rogue_key) = leaf(&rogue_issuer, "keda-operator");
    std::fs::write(dir.join("ca.pem"), &ca_pem).unwrap();
    std::fs::write(dir.join("tls.crt"), srv_cert).unwrap();
    std::fs::write(dir.join("tls.key"), srv_key).unwrap();
    Pki { dir, ca_pem, client_cert, client_key, rogue_cert, rogue_key }
}

async fn connect(
    srv: &Server,
    ca: &str,
    identity: Option<(&str, &str)>,
) -> Result<ExternalScalerClient<Channel>, String> {
    let port = srv.grpc.rsplit(':').next().unwrap();
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("localhost");
    if let Some((c, k)) = identity {
        tls = tls.identity(Identity::from_pem(c, k));
    }
    let ch = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(ExternalScalerClient::new(ch))
}

fn spec_ref() -> prescale::proto::ScaledObjectRef {
    sref("ml", "tls", &[("rabbitmqHost", "amqp://127.0.0.1:1/%2f"), ("rabbitmqQueueName", "q")])
}

#[tokio::test]
async fn tls_and_mutual_tls_on_the_grpc_port() {
    let p = pki();
    let cert = p.dir.join("tls.crt");
    let key = p.dir.join("tls.key");
    let ca = p.dir.join("ca.pem");

    // TLS: a client trusting the CA is served; plaintext is not.
    let srv = Server::start(&["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()]);
    let mut c = connect(&srv, &p.ca_pem, None).await.expect("TLS client connects");
    c.get_metric_spec(spec_ref()).await.expect("call over TLS");
    let mut plain = ExternalScalerClient::connect(srv.grpc.clone()).await.expect("tcp connect");
    assert!(plain.get_metric_spec(spec_ref()).await.is_err(), "plaintext h2c must fail on a TLS port");
    // Renewal (cert-manager rewrites the Secret): a pair from another CA is written over the
    // files; new connections get it without a restart, and the old CA no longer verifies it.
    let first_pair = (std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
    let (renewed_params, renewed_key, renewed_ca) = self::ca("renewed CA");
    let (srv_cert, srv_key) = leaf(&Issuer::new(renewed_params, renewed_key), "localhost");
    std::fs::write(&key, srv_key).unwrap();
    std::fs::write(&cert, srv_cert).unwrap();
    let mut c = eventually(15, "the renewed certificate served without a restart", || {
        let (srv, ca) = (&srv, &renewed_ca);
        async move { connect(srv, ca, None).await.ok() }
    })
    .await;
    c.get_metric_spec(spec_ref()).await.expect("call over the renewed certificate");
    assert!(connect(&srv, &p.ca_pem, None).await.is_err(), "the replaced certificate is still served");
    drop(srv);
    std::fs::write(&cert, first_pair.0).unwrap();
    std::fs::write(&key, first_pair.1).unwrap();

    // mTLS: only clients with a certificate from the client CA.
    let srv = Server::start(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-client-ca",
        ca.to_str().unwrap(),
    ]);
    let mut c = connect(&srv, &p.ca_pem, Some((&p.client_cert, &p.client_key))).await.expect("mTLS client connects");
    c.get_metric_spec(spec_ref()).await.expect("call with a client certificate");
    let denied = match connect(&srv, &p.ca_pem, None).await {
        Err(_) => true,
        Ok(mut c) => c.get_metric_spec(spec_ref()).await.is_err(),
    };
    assert!(denied, "no client certificate must be refused");
    let denied = match connect(&srv, &p.ca_pem, Some((&p.rogue_cert, &p.rogue_key))).await {
        Err(_) => true,
        Ok(mut c) => c.get_metric_spec(spec_ref()).await.is_err(),
    };
    assert!(denied, "a client certificate from another CA must be refused");
    let _ = std::fs::remove_dir_all(&p.dir);
}
