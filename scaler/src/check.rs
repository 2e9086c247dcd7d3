//! `prescale check FILE`: validate ScaledObject YAML (or a bare metadata map) offline
//! with exactly the parser `serve` uses.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::{self, ConfigError, ScalerConfig, ScalerId};

/// One external trigger found in the input and what parsing it gave.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Checked {
    pub scaled_object: String,
    pub trigger: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<ScalerConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ConfigError>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("not valid YAML: {0}")]
    Yaml(String),
    #[error("no external trigger with scalerAddress found (expected a ScaledObject with triggers of type external or external-push, or a metadata map)")]
    Nothing,
}

/// Check every document of `text`. `env` resolves `*FromEnv` keys (as KEDA would from
/// the scale target's env); unresolved ones get a placeholder and a note.
pub fn check(text: &str, env: &BTreeMap<String, String>) -> Result<Vec<Checked>, CheckError> {
    let mut out = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let v = serde_yaml_ng::Value::deserialize(doc).map_err(|e| CheckError::Yaml(e.to_string()))?;
        if v.is_null() {
            continue;
        }
        if v.get("kind").and_then(|k| k.as_str()).is_some() {
            let kind = v["kind"].as_str().unwrap_or_default();
            if kind != "ScaledObject" && kind != "ScaledJob" {
                continue;
            }
            let ns = v.get("metadata").and_then(|m| m.get("namespace")).and_then(|n| n.as_str()).unwrap_or("default");
            let name = v.get("metadata").and_then(|m| m.get("name")).and_then(|n| n.as_str()).unwrap_or("");
            let triggers = v.get("spec").and_then(|s| s.get("triggers")).and_then(|t| t.as_sequence());
            for (i, t) in triggers.into_iter().flatten().enumerate() {
                let ty = t.get("type").and_then(|x| x.as_str()).unwrap_or("");
                if ty != "external" && ty != "external-push" {
                    continue;
                }
                let md = t.get("metadata").cloned().unwrap_or(serde_yaml_ng::Value::Null);
                out.push(check_map(ns, name, i, &md, env));
            }
        } else if v.is_mapping() {
            out.push(check_map("default", "metadata", 0, &v, env));
        }
    }
    if out.is_empty() {
        return Err(CheckError::Nothing);
    }
    Ok(out)
}

use serde::Deserialize;

fn check_map(
    ns: &str,
    name: &str,
    trigger: usize,
    md: &serde_yaml_ng::Value,
    env: &BTreeMap<String, String>,
) -> Checked {
    let id = ScalerId { namespace: ns.to_string(), name: name.to_string() };
    let mut notes = Vec::new();
    let mut errors = Vec::new();
    let mut map = BTreeMap::new();
    if let Some(m) = md.as_mapping() {
        for (k, v) in m {
            let Some(k) = k.as_str() else { continue };
            // KEDA's metadata is map<string,string>: YAML numbers/bools are quoted strings there.
            let val = match v {
                serde_yaml_ng::Value::String(s) => s.clone(),
                serde_yaml_ng::Value::Number(n) => n.to_string(),
                serde_yaml_ng::Value::Bool(b) => b.to_string(),
                _ => {
                    errors.push(ConfigError {
                        scaled_object: id.to_string(),
                        key: k.to_string(),
                        value: None,
                        reason: "metadata values must be strings".into(),
                    });
                    continue;
                }
            };
            map.insert(k.to_string(), val);
        }
    } else {
        errors.push(ConfigError {
            scaled_object: id.to_string(),
            key: "metadata".into(),
            value: None,
            reason: "trigger has no metadata map".into(),
        });
    }
    // Resolve *FromEnv keys the way KEDA would.
    let from_env: Vec<String> = map.keys().filter(|k| k.ends_with("FromEnv")).cloned().collect();
    for k in from_env {
        let var = map[&k].clone();
        match env.get(&var).cloned().or_else(|| std::env::var(&var).ok()) {
            Some(v) => {
                map.insert(k.clone(), v);
            }
            None => {
                notes.push(format!("{k}: env var {var} is resolved by KEDA at run time; checked with a placeholder"));
                let http = map.get("rabbitmqProtocol").is_some_and(|p| p.eq_ignore_ascii_case("http"));
                let placeholder = match k.as_str() {
                    "rabbitmqHostFromEnv" if http => "http://resolved-by-keda.invalid:15672/",
                    "rabbitmqHostFromEnv" => "amqp://resolved-by-keda.invalid:5672/",
                    _ => "resolved-by-keda",
                };
                map.insert(k, placeholder.to_string());
            }
        }
    }
    let config = match config::parse(&id, &map) {
        Ok(c) if errors.is_empty() => Some(c),
        Ok(_) => None,
        Err(e) => {
            errors.extend(e.0);
            None
        }
    };
    Checked { scaled_object: id.to_string(), trigger, notes, config, errors }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SO: &str = r#"
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: llama, namespace: ml}
spec:
  scaleTargetRef: {name: llama}
  triggers:
  - type: cpu
    metadata: {value: "50"}
  - type: external
    metadata:
      scalerAddress: prescale.prescale.svc:9090
      rabbitmqHostFromEnv: RABBITMQ_URL
      rabbitmqQueueName: q
      rabbitmqPerReplica: 20
      scaleToZero: true
"#;

    #[test]
    fn checks_external_triggers_and_resolves_env_placeholders() {
        let r = check(SO, &BTreeMap::new()).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].scaled_object, "ml/llama");
        assert_eq!(r[0].trigger, 1);
        assert!(r[0].errors.is_empty(), "{:?}", r[0].errors);
        assert!(r[0].notes[0].contains("RABBITMQ_URL"));
    }

    #[test]
    fn reports_every_error_with_its_key() {
        let bad = SO.replace("rabbitmqPerReplica: 20", "rabbitmqPerReplica: lots\n      rabbitmqQueue: typo");
        let r = check(&bad, &BTreeMap::new()).unwrap();
        let keys: Vec<&str> = r[0].errors.iter().map(|e| e.key.as_str()).collect();
        assert!(keys.contains(&"rabbitmqPerReplica"), "{keys:?}");
        assert!(keys.contains(&"rabbitmqQueue"), "{keys:?}");
        assert!(r[0].config.is_none());
    }

    #[test]
    fn bare_metadata_maps_and_garbage() {
        let r = check(
            "prometheusServerAddress: http://p:9090\nprometheusQuery: up\nprometheusPerReplica: '2'\n",
            &BTreeMap::new(),
        )
        .unwrap();
        assert!(r[0].errors.is_empty(), "{:?}", r[0].errors);
        assert!(matches!(check("kind: Deployment\n", &BTreeMap::new()), Err(CheckError::Nothing)));
        assert!(matches!(check(": : :\n  - [", &BTreeMap::new()), Err(CheckError::Yaml(_))));
    }
}
