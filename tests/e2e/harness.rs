//! Test harness: the real `prescale serve` binary on ephemeral ports, a gRPC client,
//! and helpers to wait for conditions against real services.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prescale::proto::external_scaler_client::ExternalScalerClient;
use prescale::proto::{GetMetricsRequest, ScaledObjectRef};
use tonic::transport::Channel;

/// The service endpoint named by `var`, or `None` to skip. When the test command runs
/// (PRESCALE_REQUIRE_SERVICES=1) a missing service is a failure, not a skip.
pub fn service(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            if std::env::var("PRESCALE_REQUIRE_SERVICES").as_deref() == Ok("1") {
                panic!("{var} is not set but PRESCALE_REQUIRE_SERVICES=1: run scripts/services.sh");
            }
            eprintln!("skipping: {var} not set (run scripts/services.sh for the real services)");
            None
        }
    }
}

pub struct Server {
    child: Child,
    pub grpc: String,
    pub http: String,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn field(line: &str, name: &str) -> Option<String> {
    let start = line.find(&format!("{name}="))? + name.len() + 1;
    Some(line[start..].split_whitespace().next()?.to_string())
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Self::start_with_env(extra, &[])
    }

    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_prescale"));
        cmd.args(["serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn prescale serve");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && line.contains("prescale serving") {
                    let _ = tx.send(line.clone());
                    sent = true;
                }
                log2.lock().unwrap().push(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("prescale serve did not start: {:?}", log.lock().unwrap()));
        let strip = |s: String| s.replace("\u{1b}[3m", "").replace("\u{1b}[0m", "").replace("\u{1b}[2m", "");
        let line = strip(line);
        let grpc = field(&line, "grpc").expect("grpc addr in log");
        let http = field(&line, "http").expect("http addr in log");
        Server { child, grpc: format!("http://{grpc}"), http: format!("http://{http}"), log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn client(&self) -> ExternalScalerClient<Channel> {
        ExternalScalerClient::connect(self.grpc.clone()).await.expect("connect gRPC")
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("{}{}", self.http, path)).await.expect("HTTP get");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    }

    /// Send SIGTERM and wait for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            assert!(Instant::now() < end, "prescale did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

pub fn sref(ns: &str, name: &str, md: &[(&str, &str)]) -> ScaledObjectRef {
    ScaledObjectRef {
        name: name.to_string(),
        namespace: ns.to_string(),
        scaler_metadata: md.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>(),
    }
}

pub fn metrics_req(r: &ScaledObjectRef) -> GetMetricsRequest {
    GetMetricsRequest { scaled_object_ref: Some(r.clone()), metric_name: "prescale-replicas".into() }
}

/// The planned replicas, or the gRPC status.
pub async fn metric(c: &mut ExternalScalerClient<Channel>, r: &ScaledObjectRef) -> Result<i64, tonic::Status> {
    let resp = c.get_metrics(metrics_req(r)).await?.into_inner();
    assert_eq!(resp.metric_values.len(), 1, "exactly one value per request");
    let v = &resp.metric_values[0];
    assert_eq!(v.metric_value_float, v.metric_value as f64, "int and float fields agree");
    Ok(v.metric_value)
}

pub async fn active(c: &mut ExternalScalerClient<Channel>, r: &ScaledObjectRef) -> Result<bool, tonic::Status> {
    Ok(c.is_active(r.clone()).await?.into_inner().result)
}

/// Poll `f` until it returns `Some`, or panic with `what` after `secs`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out after {secs}s waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A unique name per test run (queues, ScaledObjects).
pub fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{}", std::process::id(), n % 1_000_000_000)
}

/// A fixture exporter: serves `body()` as Prometheus text on a fixed loopback port
/// (Prometheus from scripts/services.sh scrapes 127.0.0.1:19101-19104).
pub struct Exporter {
    pub body: Arc<Mutex<String>>,
    /// The bound port (pass 0 to `start` for an ephemeral one).
    pub port: u16,
    /// Scrapes served so far.
    pub hits: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Exporter {
    pub async fn start(port: u16, initial: &str) -> Exporter {
        let body = Arc::new(Mutex::new(initial.to_string()));
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let b = body.clone();
        let h = hits.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let b = b.clone();
                h.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async move {
                    let text = b.lock().unwrap().clone();
                    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
                }
            }),
        );
        let l = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("bind exporter port");
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        Exporter { body, port, hits, task }
    }

    pub fn set(&self, text: &str) {
        *self.body.lock().unwrap() = text.to_string();
    }
}

/// A TCP proxy that can be cut, to make a working source fail.
pub struct Proxy {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    pub async fn start(target: &str) -> Proxy {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let target = target.to_string();
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let c2 = conns.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = l.accept().await {
                let target = target.clone();
                let h = tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                c2.lock().unwrap().push(h.abort_handle());
            }
        });
        Proxy { port, task, conns }
    }

    /// Close the listener and every proxied connection.
    pub fn cut(self) {
        self.task.abort();
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

/// A connection and channel with `queue` declared (publisher confirms on).
pub async fn rabbit_queue(amqp: &str, queue: &str) -> (lapin::Connection, lapin::Channel) {
    let conn = lapin::Connection::connect(amqp, Default::default()).await.expect("connect to RabbitMQ");
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(queue.into(), Default::default(), Default::default()).await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    (conn, ch)
}

/// Publish `n` messages to `queue` and wait for the broker's confirms.
pub async fn publish_on(ch: &lapin::Channel, queue: &str, n: usize) {
    for i in 0..n {
        ch.basic_publish("".into(), queue.into(), Default::default(), format!("m{i}").as_bytes(), Default::default())
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// dcgm-exporter's `DCGM_FI_DEV_GPU_UTIL` page (reference note §4.5 labels, the older
/// `Hostname` spelling): one GPU per `(pod, utilisation %)`, pod-mapped into namespace `ns`.
pub fn dcgm_util_page(ns: &str, pods: &[(&str, f64)]) -> String {
    let mut out =
        String::from("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n");
    for (i, (pod, util)) in pods.iter().enumerate() {
        out.push_str(&format!(
            "DCGM_FI_DEV_GPU_UTIL{{gpu=\"{i}\",UUID=\"GPU-8d1c2b3a-{i:04}-4b17-9c2e-5da9abb51763\",pci_bus_id=\"00000000:{i:02}:00.0\",device=\"nvidia{i}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node-1\",DCGM_FI_DRIVER_VERSION=\"595.58.03\",container=\"vllm\",namespace=\"{ns}\",pod=\"{pod}\"}} {util}\n"
        ));
    }
    out
}

/// A Prometheus of its own over blocks backfilled from OpenMetrics text with
/// `promtool tsdb create-blocks-from openmetrics` (history that is days old, which a scrape
/// cannot make). Killed on drop; its directory is removed.
pub struct BackfilledPrometheus {
    pub url: String,
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for BackfilledPrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl BackfilledPrometheus {
    /// Backfill `openmetrics` (ending in `# EOF`) and serve it; ready once `ready_query`
    /// (an instant query) returns one series.
    pub async fn start(openmetrics: &str, ready_query: &str) -> BackfilledPrometheus {
        Self::start_with(Some(openmetrics), "global:\n  scrape_interval: 1m\n", ready_query).await
    }

    /// A Prometheus with this configuration file (scrape jobs), backfilled first when
    /// `openmetrics` is given; ready once `ready_query` returns one series.
    pub async fn start_with(openmetrics: Option<&str>, config: &str, ready_query: &str) -> BackfilledPrometheus {
        let dir = std::env::temp_dir().join(unique("prescale-backfill"));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        if let Some(om) = openmetrics {
            std::fs::write(dir.join("history.om"), om).unwrap();
            let st = Command::new("promtool")
                .args(["tsdb", "create-blocks-from", "openmetrics"])
                .arg(dir.join("history.om"))
                .arg(dir.join("data"))
                .output()
                .expect("promtool");
            assert!(st.status.success(), "promtool: {}", String::from_utf8_lossy(&st.stderr));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        let prom = BackfilledPrometheus { url: format!("http://127.0.0.1:{port}"), child, dir };
        eventually(60, "backfilled Prometheus ready with data", || {
            let url = format!("{}/api/v1/query", prom.url);
            async move {
                let v = json_of(reqwest::Client::new().get(url).query(&[("query", ready_query)])).await?;
                (v["data"]["result"].as_array()?.len() == 1).then_some(())
            }
        })
        .await;
        prom
    }
}

/// The JSON body of a request's answer, or `None` on any failure (for `eventually`).
pub async fn json_of(req: reqwest::RequestBuilder) -> Option<serde_json::Value> {
    req.send().await.ok()?.json().await.ok()
}

/// Run the `prescale` binary to completion: (success, stdout, stderr).
pub fn prescale(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_prescale")).args(args).output().expect("run prescale");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
