//! AWS SQS queue depth, with KEDA's aws-sqs-queue semantics: one `GetQueueAttributes`
//! call; `ApproximateNumberOfMessages`, + `…NotVisible` when `sqsScaleOnInFlight`
//! (default true), + `…Delayed` when `sqsScaleOnDelayed`. A requested attribute that is
//! missing is an error. Credentials come from the standard AWS chain (env, web identity,
//! profile, IMDS) of prescale's own pod — KEDA does not forward TriggerAuthentication.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use aws_sdk_sqs::types::QueueAttributeName;
use serde::Serialize;
use tokio::sync::Mutex as AsyncMutex;

use super::{BoxFuture, Reading, Shared, Source, SourceError};
use crate::config::Metadata;
use crate::redact::redact_url;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SqsConfig {
    pub queue_url: String,
    pub queue_name: String,
    pub region: String,
    pub endpoint: Option<String>,
    pub queue_length: f64,
    pub activation_queue_length: f64,
    pub scale_on_in_flight: bool,
    pub scale_on_delayed: bool,
}

impl SqsConfig {
    pub fn parse(md: &mut Metadata<'_>) -> Option<Self> {
        if !md.has_prefix("sqs") {
            return None;
        }
        let url = match (md.string("sqsQueueURL"), md.string("sqsQueueURLFromEnv")) {
            (Some(_), Some(v)) => {
                md.error("sqsQueueURLFromEnv", Some(&v), "set either sqsQueueURL or sqsQueueURLFromEnv, not both");
                None
            }
            (Some(v), None) | (None, Some(v)) if !v.is_empty() => Some(v),
            _ => {
                md.error("sqsQueueURL", None, "is required (or sqsQueueURLFromEnv)");
                None
            }
        };
        let region = md.required("sqsAwsRegion", "the queue's AWS region");
        let endpoint = md.string("sqsAwsEndpoint").filter(|s| !s.is_empty());
        let queue_length = md.f64_in("sqsQueueLength", 5.0, 0.0, f64::MAX, true);
        let activation = md.f64_in("sqsActivationQueueLength", 0.0, 0.0, f64::MAX, false);
        let in_flight = md.bool("sqsScaleOnInFlight", true);
        let delayed = md.bool("sqsScaleOnDelayed", false);
        if let Some(e) = &endpoint {
            if !url::Url::parse(e).is_ok_and(|u| matches!(u.scheme(), "http" | "https")) {
                md.error("sqsAwsEndpoint", Some(e), "expected an http(s) URL");
                return None;
            }
        }
        let url = url?;
        // KEDA: the queue name is the 3rd path segment of the URL; a non-URL is the name.
        let queue_name = match url::Url::parse(&url) {
            Ok(u) => match u.path_segments().and_then(|mut s| s.nth(1)).filter(|s| !s.is_empty()) {
                Some(n) => n.to_string(),
                None => {
                    md.error(
                        "sqsQueueURL",
                        Some(&url),
                        "expected https://sqs.<region>.amazonaws.com/<account>/<queue>",
                    );
                    return None;
                }
            },
            Err(_) => url.clone(),
        };
        Some(Self {
            queue_url: url,
            queue_name,
            region: region?,
            endpoint,
            queue_length: queue_length?,
            activation_queue_length: activation?,
            scale_on_in_flight: in_flight?,
            scale_on_delayed: delayed?,
        })
    }

    pub fn label(&self) -> String {
        format!("sqs queue \"{}\" in {}", self.queue_name, self.region)
    }

    pub fn per_replica(&self) -> f64 {
        self.queue_length
    }

    pub fn poll_key(&self) -> String {
        format!("sqs|{self:?}")
    }

    fn client_key(&self) -> String {
        format!("{}|{:?}", self.region, self.endpoint)
    }
}

/// One SQS client per (region, endpoint).
#[derive(Default)]
pub struct SqsPool {
    clients: AsyncMutex<HashMap<String, aws_sdk_sqs::Client>>,
}

impl SqsPool {
    async fn get(&self, cfg: &SqsConfig) -> aws_sdk_sqs::Client {
        let mut m = self.clients.lock().await;
        if let Some(c) = m.get(&cfg.client_key()) {
            return c.clone();
        }
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(cfg.region.clone()));
        if let Some(e) = &cfg.endpoint {
            loader = loader.endpoint_url(e);
        }
        let client = aws_sdk_sqs::Client::new(&loader.load().await);
        m.insert(cfg.client_key(), client.clone());
        client
    }
}

pub struct SqsSource {
    cfg: SqsConfig,
    pool: Arc<SqsPool>,
}

impl SqsSource {
    pub fn new(cfg: SqsConfig, shared: &Shared) -> Self {
        Self { cfg, pool: shared.sqs.clone() }
    }

    async fn query(&self) -> Result<Reading, SourceError> {
        let client = self.pool.get(&self.cfg).await;
        let mut wanted = vec![QueueAttributeName::ApproximateNumberOfMessages];
        if self.cfg.scale_on_in_flight {
            wanted.push(QueueAttributeName::ApproximateNumberOfMessagesNotVisible);
        }
        if self.cfg.scale_on_delayed {
            wanted.push(QueueAttributeName::ApproximateNumberOfMessagesDelayed);
        }
        let mut req = client.get_queue_attributes().queue_url(&self.cfg.queue_url);
        for a in &wanted {
            req = req.attribute_names(a.clone());
        }
        let out = req.send().await.map_err(|e| {
            let msg = aws_sdk_sqs::error::DisplayErrorContext(&e).to_string();
            if msg.contains("NonExistentQueue") || msg.contains("QueueDoesNotExist") {
                SourceError::NotFound(format!("queue {}", redact_url(&self.cfg.queue_url)))
            } else if matches!(
                e,
                aws_sdk_sqs::error::SdkError::DispatchFailure(_) | aws_sdk_sqs::error::SdkError::TimeoutError(_)
            ) {
                SourceError::connect(msg)
            } else {
                SourceError::query(msg)
            }
        })?;
        let attrs = out.attributes().cloned().unwrap_or_default();
        let mut detail = BTreeMap::new();
        let mut total = 0.0;
        for a in &wanted {
            let v = attrs
                .get(a)
                .ok_or_else(|| SourceError::Parse(format!("attribute {} missing from the answer", a.as_str())))?
                .parse::<f64>()
                .map_err(|e| SourceError::parse(format!("attribute {}: {e}", a.as_str())))?;
            total += v;
            let name = match a {
                QueueAttributeName::ApproximateNumberOfMessages => "visible",
                QueueAttributeName::ApproximateNumberOfMessagesNotVisible => "in_flight",
                _ => "delayed",
            };
            detail.insert(name, v);
        }
        Ok(Reading { value: total, active: total > self.cfg.activation_queue_length, detail, pods: None })
    }
}

impl Source for SqsSource {
    fn read(&self) -> BoxFuture<'_, Result<Reading, SourceError>> {
        Box::pin(self.query())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScalerId;

    fn cfg(pairs: &[(&str, &str)]) -> Result<SqsConfig, Vec<String>> {
        let id = ScalerId { namespace: "ns".into(), name: "so".into() };
        let map = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut md = Metadata::new(&id, &map);
        let c = SqsConfig::parse(&mut md);
        md.finish(c).map_err(|e| e.0.iter().map(|e| e.to_string()).collect())
    }

    #[test]
    fn keda_defaults_and_queue_name_from_url() {
        let c = cfg(&[
            ("sqsQueueURL", "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs"),
            ("sqsAwsRegion", "eu-west-1"),
        ])
        .unwrap();
        assert_eq!(c.queue_name, "jobs");
        assert_eq!(c.queue_length, 5.0);
        assert!(c.scale_on_in_flight);
        assert!(!c.scale_on_delayed);
    }

    #[test]
    fn errors_name_keys() {
        let e = cfg(&[("sqsQueueURL", "https://x/1/q")]).unwrap_err();
        assert!(e.iter().any(|e| e.contains("sqsAwsRegion")), "{e:?}");
        let e = cfg(&[("sqsQueueURL", "https://x/1/q"), ("sqsAwsRegion", "r"), ("sqsQueueLength", "-2")]).unwrap_err();
        assert!(e.iter().any(|e| e.contains("sqsQueueLength")), "{e:?}");
        let e = cfg(&[("sqsAwsRegion", "r")]).unwrap_err();
        assert!(e.iter().any(|e| e.contains("sqsQueueURL")), "{e:?}");
        let e = cfg(&[("sqsQueueURL", "https://x/1/q"), ("sqsAwsRegion", "r"), ("sqsAwsEndpoint", "localhost")])
            .unwrap_err();
        assert!(e.iter().any(|e| e.contains("sqsAwsEndpoint")), "{e:?}");
    }
}
