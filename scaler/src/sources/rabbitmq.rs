//! RabbitMQ, mirroring KEDA's rabbitmq scaler: `QueueLength` over AMQP (passive
//! declare: ready messages), or `QueueLength` / `MessageRate` over the management API
//! (`rabbitmqProtocol: http`, `messages` or `messages_ready` with
//! `rabbitmqExcludeUnacknowledged`, `message_stats.publish_details.rate`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::{BoxFuture, Reading, Shared, Source, SourceError};
use crate::config::Metadata;
use crate::redact::redact_url;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Protocol {
    Amqp,
    Http,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Mode {
    QueueLength,
    MessageRate,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RabbitmqConfig {
    /// Full URL with credentials and vhost; never serialized.
    #[serde(skip)]
    pub url: String,
    /// The same URL, redacted, for display.
    pub host: String,
    pub queue: String,
    pub mode: Mode,
    pub protocol: Protocol,
    pub per_replica: f64,
    pub activation_value: f64,
    pub exclude_unacknowledged: bool,
    /// The vhost, decoded (`/` is the default vhost).
    pub vhost: String,
}

impl RabbitmqConfig {
    /// `None` when no `rabbitmq*` key is present.
    pub fn parse(md: &mut Metadata<'_>) -> Option<Self> {
        if !md.has_prefix("rabbitmq") {
            return None;
        }
        let host = md.string("rabbitmqHost");
        let from_env = md.string("rabbitmqHostFromEnv");
        let raw_url = match (host, from_env) {
            (Some(_), Some(v)) => {
                md.error("rabbitmqHostFromEnv", Some(&v), "set either rabbitmqHost or rabbitmqHostFromEnv, not both");
                None
            }
            (Some(v), None) => Some(("rabbitmqHost", v)),
            (None, Some(v)) => Some(("rabbitmqHostFromEnv", v)),
            (None, None) => {
                md.error("rabbitmqHost", None, "is required (or rabbitmqHostFromEnv)");
                None
            }
        };
        let queue = md.required("rabbitmqQueueName", "the queue to read");
        let mode = md.choice("rabbitmqMode", "QueueLength", &["QueueLength", "MessageRate"]).map(|m| {
            if m == "MessageRate" {
                Mode::MessageRate
            } else {
                Mode::QueueLength
            }
        });
        let per_replica = md.f64_in("rabbitmqPerReplica", 20.0, 0.0, f64::MAX, true);
        let activation_value = md.f64_in("rabbitmqActivationValue", 0.0, 0.0, f64::MAX, false);
        let protocol = md.choice("rabbitmqProtocol", "auto", &["auto", "amqp", "http"]);
        let vhost_override = md.string("rabbitmqVhostName");
        let exclude_unacked = md.bool("rabbitmqExcludeUnacknowledged", false);
        let user = md.string("rabbitmqUsernameFromEnv");
        let pass = md.string("rabbitmqPasswordFromEnv");

        let (url_key, raw) = raw_url?;
        let mut url = match url::Url::parse(&raw) {
            Ok(u) if u.has_host() => u,
            _ => {
                md.error(url_key, Some(&raw), "not a URL (expected amqp://, amqps://, http:// or https://)");
                return None;
            }
        };
        let scheme_proto = match url.scheme() {
            "amqp" | "amqps" => Protocol::Amqp,
            "http" | "https" => Protocol::Http,
            other => {
                md.error(url_key, Some(&raw), &format!("unsupported scheme \"{other}\" (amqp, amqps, http, https)"));
                return None;
            }
        };
        let protocol = match protocol? {
            "amqp" => Protocol::Amqp,
            "http" => Protocol::Http,
            _ => scheme_proto,
        };
        if protocol != scheme_proto {
            md.error(
                "rabbitmqProtocol",
                Some(if protocol == Protocol::Http { "http" } else { "amqp" }),
                &format!("does not match the scheme of {url_key} ({})", url.scheme()),
            );
            return None;
        }
        if let Some(u) = user.filter(|u| !u.is_empty()) {
            let _ = url.set_username(&u);
        }
        if let Some(p) = pass.filter(|p| !p.is_empty()) {
            let _ = url.set_password(Some(&p));
        }
        // vhost: the last path segment (decoded); empty means the default vhost "/".
        let path_vhost = url
            .path_segments()
            .and_then(|mut s| s.next_back().map(str::to_string))
            .map(|s| percent_decode(&s))
            .filter(|s| !s.is_empty());
        let vhost = match vhost_override.filter(|v| !v.is_empty()) {
            Some(v) => {
                if protocol == Protocol::Amqp {
                    url.set_path(&format!("/{}", percent_encode(&v)));
                }
                v
            }
            None => {
                if protocol == Protocol::Amqp && path_vhost.is_none() {
                    // lapin reads an empty path as the vhost "" — KEDA means "/".
                    url.set_path("/%2f");
                }
                path_vhost.unwrap_or_else(|| "/".to_string())
            }
        };
        let mode = mode?;
        let exclude_unacknowledged = exclude_unacked?;
        if protocol == Protocol::Amqp && mode == Mode::MessageRate {
            md.error("rabbitmqMode", Some("MessageRate"), "needs the management API: use an http(s) rabbitmqHost");
            return None;
        }
        if protocol == Protocol::Amqp && exclude_unacknowledged {
            md.error(
                "rabbitmqExcludeUnacknowledged",
                Some("true"),
                "only applies to the management API (AMQP already counts ready messages only)",
            );
            return None;
        }
        Some(Self {
            host: redact_url(url.as_str()),
            url: url.to_string(),
            queue: queue?,
            mode,
            protocol,
            per_replica: per_replica?,
            activation_value: activation_value?,
            exclude_unacknowledged,
            vhost,
        })
    }

    pub fn label(&self) -> String {
        format!("rabbitmq queue \"{}\" on {}", self.queue, self.host)
    }

    pub fn per_replica(&self) -> f64 {
        self.per_replica
    }

    pub fn poll_key(&self) -> String {
        format!(
            "rabbitmq|{}|{}|{:?}|{:?}|{}|{}|{}",
            self.url,
            self.queue,
            self.mode,
            self.protocol,
            self.exclude_unacknowledged,
            self.vhost,
            self.activation_value
        )
    }

    /// The management API URL of the queue.
    fn api_url(&self) -> Result<url::Url, SourceError> {
        let mut u = url::Url::parse(&self.url).map_err(SourceError::parse)?;
        let mut segs: Vec<String> = u.path_segments().map(|s| s.map(str::to_string).collect()).unwrap_or_default();
        // Everything before the vhost segment is a path prefix (reverse proxies).
        if segs.last().is_some_and(|s| !s.is_empty()) {
            segs.pop();
        }
        segs.retain(|s| !s.is_empty());
        let prefix: String = segs.iter().map(|s| format!("/{s}")).collect();
        u.set_path(&format!("{prefix}/api/queues/{}/{}", percent_encode(&self.vhost), percent_encode(&self.queue)));
        let _ = u.set_username("");
        let _ = u.set_password(None);
        Ok(u)
    }
}

fn percent_encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>().replace('+', "%20")
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| s.to_string())
}

/// One AMQP connection per URL (credentials + vhost), shared by every queue polled on it.
#[derive(Default)]
pub struct AmqpPool {
    conns: Mutex<HashMap<String, Arc<AmqpConn>>>,
}

pub struct AmqpConn {
    url: String,
    conn: tokio::sync::Mutex<Option<lapin::Connection>>,
}

impl AmqpPool {
    pub fn get(&self, url: &str) -> Arc<AmqpConn> {
        let mut m = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(url.to_string())
            .or_insert_with(|| Arc::new(AmqpConn { url: url.to_string(), conn: tokio::sync::Mutex::new(None) }))
            .clone()
    }

    /// Connections currently open (the `prescale_source_connections` gauge).
    pub fn open_connections(&self) -> usize {
        let m = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        m.values()
            .filter(|c| c.conn.try_lock().map(|g| g.as_ref().is_some_and(|c| c.status().connected())).unwrap_or(true))
            .count()
    }

    /// Close and forget connections no source uses any more.
    pub async fn gc(&self) {
        let unused: Vec<Arc<AmqpConn>> = {
            let mut m = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<String> =
                m.iter().filter(|(_, c)| Arc::strong_count(c) == 1).map(|(k, _)| k.clone()).collect();
            keys.iter().filter_map(|k| m.remove(k)).collect()
        };
        for c in unused {
            if let Some(conn) = c.conn.lock().await.take() {
                let _ = conn.close(200, "unused".into()).await;
            }
        }
    }
}

impl AmqpConn {
    async fn channel(&self) -> Result<lapin::Channel, SourceError> {
        let mut guard = self.conn.lock().await;
        if guard.as_ref().is_none_or(|c| !c.status().connected()) {
            let props = lapin::ConnectionProperties::default()
                .with_connection_name(format!("prescale/{}", std::process::id()).into());
            let c = lapin::Connection::connect(&self.url, props).await.map_err(SourceError::connect)?;
            *guard = Some(c);
        }
        let conn = guard.as_ref().ok_or_else(|| SourceError::Connect("no connection".into()))?;
        match conn.create_channel().await {
            Ok(ch) => Ok(ch),
            Err(e) => {
                *guard = None; // reconnect on the next read
                Err(SourceError::connect(e))
            }
        }
    }
}

pub struct RabbitmqSource {
    cfg: RabbitmqConfig,
    http: reqwest::Client,
    amqp: Option<Arc<AmqpConn>>,
}

impl RabbitmqSource {
    pub fn new(cfg: RabbitmqConfig, shared: &Shared) -> Self {
        let amqp = (cfg.protocol == Protocol::Amqp).then(|| shared.amqp.get(&cfg.url));
        Self { cfg, http: shared.http.clone(), amqp }
    }

    async fn read_amqp(&self, conn: &AmqpConn) -> Result<Reading, SourceError> {
        // A passive declare of a missing queue closes its channel: one throwaway channel per read.
        let ch = conn.channel().await?;
        let opts = lapin::options::QueueDeclareOptions { passive: true, ..Default::default() };
        let res = ch.queue_declare(self.cfg.queue.as_str().into(), opts, Default::default()).await;
        let _ = ch.close(200, "done".into()).await;
        let q = res.map_err(|e| {
            let msg = e.to_string();
            if msg.contains("NOT_FOUND") {
                SourceError::NotFound(format!("queue \"{}\" in vhost \"{}\"", self.cfg.queue, self.cfg.vhost))
            } else {
                SourceError::query(msg)
            }
        })?;
        let messages = f64::from(q.message_count());
        let mut detail = BTreeMap::new();
        detail.insert("messages", messages);
        detail.insert("consumers", f64::from(q.consumer_count()));
        Ok(Reading { value: messages, active: messages > self.cfg.activation_value, detail, pods: None })
    }

    async fn read_http(&self) -> Result<Reading, SourceError> {
        let api = self.api_url_with_auth()?;
        let (url, user, pass) = api;
        let mut req = self.http.get(url);
        if let Some(u) = user {
            req = req.basic_auth(u, pass);
        }
        let resp = req.send().await.map_err(|e| SourceError::connect(e.without_url()))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Err(SourceError::NotFound(format!("queue \"{}\" in vhost \"{}\"", self.cfg.queue, self.cfg.vhost)));
        }
        if !status.is_success() {
            return Err(SourceError::Query(format!("management API answered {status}")));
        }
        let body: serde_json::Value = resp.json().await.map_err(|e| SourceError::parse(e.without_url()))?;
        let num = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        let messages =
            if self.cfg.exclude_unacknowledged { num(body.get("messages_ready")) } else { num(body.get("messages")) };
        let publish_rate = num(body.pointer("/message_stats/publish_details/rate"));
        let mut detail = BTreeMap::new();
        detail.insert("messages", messages);
        detail.insert("publish_rate", publish_rate);
        detail.insert("consumers", num(body.get("consumers")));
        let act = self.cfg.activation_value;
        Ok(match self.cfg.mode {
            Mode::QueueLength => Reading { value: messages, active: messages > act, detail, pods: None },
            Mode::MessageRate => {
                Reading { value: publish_rate, active: publish_rate > act || messages > act, detail, pods: None }
            }
        })
    }

    fn api_url_with_auth(&self) -> Result<(url::Url, Option<String>, Option<String>), SourceError> {
        let orig = url::Url::parse(&self.cfg.url).map_err(SourceError::parse)?;
        let user = (!orig.username().is_empty()).then(|| percent_decode(orig.username()));
        let pass = orig.password().map(percent_decode);
        Ok((self.cfg.api_url()?, user, pass))
    }
}

impl Source for RabbitmqSource {
    fn read(&self) -> BoxFuture<'_, Result<Reading, SourceError>> {
        Box::pin(async move {
            match &self.amqp {
                Some(conn) => self.read_amqp(conn).await,
                None => self.read_http().await,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScalerId;

    fn parse(pairs: &[(&str, &str)]) -> (Option<RabbitmqConfig>, Vec<String>) {
        let id = ScalerId { namespace: "ns".into(), name: "so".into() };
        let map = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut md = Metadata::new(&id, &map);
        let c = RabbitmqConfig::parse(&mut md);
        let errs = md.finish(Some(())).err().map(|e| e.0.iter().map(|e| e.to_string()).collect()).unwrap_or_default();
        (c, errs)
    }

    #[test]
    fn defaults_follow_keda() {
        let (c, errs) = parse(&[("rabbitmqHost", "amqp://u:p@h:5672/%2f"), ("rabbitmqQueueName", "q")]);
        assert!(errs.is_empty(), "{errs:?}");
        let c = c.unwrap();
        assert_eq!(c.per_replica, 20.0);
        assert_eq!(c.mode, Mode::QueueLength);
        assert_eq!(c.protocol, Protocol::Amqp);
        assert_eq!(c.vhost, "/");
        assert!(!c.host.contains(":p@"), "{}", c.host);
    }

    #[test]
    fn empty_vhost_means_default_vhost() {
        let (c, _) = parse(&[("rabbitmqHost", "amqp://h:5672"), ("rabbitmqQueueName", "q")]);
        let c = c.unwrap();
        assert_eq!(c.vhost, "/");
        assert!(c.url.ends_with("/%2f"), "{}", c.url);
    }

    #[test]
    fn management_api_url_keeps_prefix_and_encodes_vhost() {
        let (c, errs) = parse(&[
            ("rabbitmqHost", "http://u:p@h:15672/proxy/vh1"),
            ("rabbitmqQueueName", "my q"),
            ("rabbitmqMode", "MessageRate"),
        ]);
        assert!(errs.is_empty(), "{errs:?}");
        let c = c.unwrap();
        assert_eq!(c.protocol, Protocol::Http);
        assert_eq!(c.api_url().unwrap().as_str(), "http://h:15672/proxy/api/queues/vh1/my%20q");
        let (c, _) = parse(&[("rabbitmqHost", "http://h:15672"), ("rabbitmqQueueName", "q")]);
        assert_eq!(c.unwrap().api_url().unwrap().as_str(), "http://h:15672/api/queues/%2F/q");
    }

    #[test]
    fn errors_name_the_key_and_redact_the_value() {
        let (_, errs) = parse(&[("rabbitmqHost", "ftp://u:secret@h"), ("rabbitmqQueueName", "q")]);
        assert!(errs.iter().any(|e| e.contains("rabbitmqHost") && e.contains("ns/so")), "{errs:?}");
        assert!(errs.iter().all(|e| !e.contains("secret")), "{errs:?}");
        let (_, errs) = parse(&[("rabbitmqHost", "amqp://h"), ("rabbitmqPerReplica", "ten")]);
        assert!(errs.iter().any(|e| e.contains("rabbitmqPerReplica") && e.contains("ten")), "{errs:?}");
        assert!(errs.iter().any(|e| e.contains("rabbitmqQueueName")), "{errs:?}");
        let (_, errs) =
            parse(&[("rabbitmqHost", "amqp://h"), ("rabbitmqQueueName", "q"), ("rabbitmqMode", "MessageRate")]);
        assert!(errs.iter().any(|e| e.contains("rabbitmqMode")), "{errs:?}");
        let (_, errs) = parse(&[("rabbitmqHost", "amqp://h"), ("rabbitmqQueueName", "q"), ("rabbitmqPerReplica", "0")]);
        assert!(errs.iter().any(|e| e.contains("rabbitmqPerReplica")), "{errs:?}");
    }

    #[test]
    fn credentials_from_env_keys_override_the_url() {
        let (c, _) = parse(&[
            ("rabbitmqHostFromEnv", "amqp://h:5672/vh"),
            ("rabbitmqQueueName", "q"),
            ("rabbitmqUsernameFromEnv", "alice"),
            ("rabbitmqPasswordFromEnv", "pw"),
        ]);
        let c = c.unwrap();
        assert!(c.url.starts_with("amqp://alice:pw@h:5672/vh"), "{}", c.url);
        assert!(!c.host.contains("pw"));
        assert_eq!(c.vhost, "vh");
    }
}
