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
            let mut first = true;
            // Metric names of the prescale triggers so far, with their trigger index.
            let mut names: Vec<(String, usize)> = Vec::new();
            for (i, t) in triggers.into_iter().flatten().enumerate() {
                let ty = t.get("type").and_then(|x| x.as_str()).unwrap_or("");
                if ty != "external" && ty != "external-push" {
                    continue;
                }
                let md = t.get("metadata").cloned().unwrap_or(serde_yaml_ng::Value::Null);
                let mut c = check_map(ns, name, i, &md, env);
                // The trigger's own `metricType` (beside `metadata`, so `serve` never sees it):
                // prescale answers a replica count for the HPA's AverageValue rule; with
                // `Value` the HPA multiplies the answer by the current replica count.
                if let Some(mt) = t.get("metricType").map(|m| m.as_str().unwrap_or("")) {
                    if mt != "AverageValue" {
                        c.errors.push(ConfigError {
                            scaled_object: c.scaled_object.clone(),
                            key: "metricType".into(),
                            value: Some(mt.to_string()),
                            reason: "must be AverageValue (the default): prescale answers the replica count, and \
                                     with Value the HPA would scale to that count times the current replicas"
                                .into(),
                        });
                        c.config = None;
                    }
                }
                if let Some(cfg) = &c.config {
                    c.notes.extend(bounds_notes(v.get("spec"), cfg.planner.min_replicas, cfg.planner.max_replicas));
                    c.notes.extend(zero_note(v.get("spec"), cfg.planner.scale_to_zero));
                    if cfg.planner.scale_to_zero {
                        c.notes.extend(cooldown_note(v.get("spec")));
                        if ty == "external" {
                            c.notes.extend(wake_poll_note(v.get("spec")));
                        }
                    }
                }
                // prescale tells a ScaledObject's triggers apart by metric name (an edit of one
                // trigger's metadata supersedes the old metadata of the same name).
                if let Some(cfg) = &c.config {
                    match names.iter().find(|(n, _)| *n == cfg.metric_name) {
                        Some((n, j)) => {
                            c.errors.push(ConfigError {
                                scaled_object: c.scaled_object.clone(),
                                key: "metricName".into(),
                                value: Some(n.clone()),
                                reason: format!(
                                    "trigger {j} of this ScaledObject uses it too: give each prescale trigger its own \
                                     metricName (or put all signals in one trigger, which combines them by max)"
                                ),
                            });
                            c.config = None;
                        }
                        None => names.push((cfg.metric_name.clone(), i)),
                    }
                }
                if std::mem::take(&mut first) {
                    // The HPA's behaviour is the ScaledObject's: said once, on its first trigger.
                    let answered_for = c.config.as_ref().map(|cfg| cfg.planner.hpa_tolerance);
                    c.notes.extend(hpa_behavior_notes(v.get("spec"), answered_for));
                }
                out.push(c);
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

/// KEDA's `minReplicaCount`/`maxReplicaCount` against the trigger's `minReplicas`/`maxReplicas`:
/// the planner plans within its own bounds and KEDA clamps to its, so a planner bound outside
/// KEDA's is a plan that is never applied (and a fleet the planner does not know it has).
fn bounds_notes(spec: Option<&serde_yaml_ng::Value>, min: u32, max: u32) -> Vec<String> {
    let keda_min = yaml_int(spec.and_then(|s| s.get("minReplicaCount"))).unwrap_or(0);
    let keda_max = keda_max_replicas(spec);
    [("minReplicas", min, "minReplicaCount", keda_min), ("maxReplicas", max, "maxReplicaCount", keda_max)]
        .into_iter()
        .filter(|&(_, ours, _, keda)| i64::from(ours) != keda)
        .map(|(key, ours, keda_key, keda)| {
            format!(
                "{key} is {ours} but the ScaledObject's {keda_key} is {keda}: KEDA clamps the answer to its own \
                 bounds, so keep them equal"
            )
        })
        .collect()
}

/// Kubernetes' HPA defaults (autoscaling/v2): scale-down stabilization and tolerance.
const HPA_DEFAULT_SCALE_DOWN_STABILIZATION_S: i64 = 300;
const HPA_DEFAULT_TOLERANCE: f64 = 0.1;
/// KEDA's default `maxReplicaCount`.
const KEDA_DEFAULT_MAX_REPLICAS: i64 = 100;

/// An integer field of the YAML, written as a number or as a string of one.
fn yaml_int(v: Option<&serde_yaml_ng::Value>) -> Option<i64> {
    v.and_then(|x| x.as_i64().or_else(|| x.as_str()?.trim().parse().ok()))
}

/// The ScaledObject's `maxReplicaCount`, or KEDA's default.
fn keda_max_replicas(spec: Option<&serde_yaml_ng::Value>) -> i64 {
    yaml_int(spec.and_then(|s| s.get("maxReplicaCount"))).unwrap_or(KEDA_DEFAULT_MAX_REPLICAS)
}

/// KEDA's default `cooldownPeriod`, seconds, and `pollingInterval`.
const KEDA_DEFAULT_COOLDOWN_S: i64 = 300;
const KEDA_DEFAULT_POLLING_S: i64 = 30;

/// With `scaleToZero`, KEDA's `cooldownPeriod` on top of the planner's own decision: KEDA goes
/// to zero only that long after prescale's plan (IsActive) reaches zero, while the planner
/// goes to zero only when no arrival is expected within the warm-up and holds the fleet
/// through shorter gaps, so the cooldown is paid again on every idle spell. A note where it
/// is longer than one poll (with `minReplicaCount` 0, where it applies).
fn cooldown_note(spec: Option<&serde_yaml_ng::Value>) -> Option<String> {
    if !keda_may_idle_at_zero(spec) {
        return None;
    }
    let given = yaml_int(spec.and_then(|s| s.get("cooldownPeriod")));
    let cooldown = given.unwrap_or(KEDA_DEFAULT_COOLDOWN_S);
    let poll = yaml_int(spec.and_then(|s| s.get("pollingInterval"))).unwrap_or(KEDA_DEFAULT_POLLING_S);
    (cooldown > poll).then(|| {
        let default = if given.is_none() { " (KEDA's default)" } else { "" };
        format!(
            "cooldownPeriod is {cooldown} s{default}: KEDA scales to zero only {cooldown} s after prescale's plan reaches \
             zero, and the planner goes to zero only when no request is expected within the warm-up (it keeps the \
             fleet through shorter gaps), so every idle spell pays {cooldown} s of the last replica on top: set \
             spec.cooldownPeriod to about pollingInterval ({poll})"
        )
    })
}

/// Whether KEDA takes this ScaledObject's fleet to zero once every trigger is inactive:
/// `minReplicaCount` 0 (the default) or `idleReplicaCount: 0`.
fn keda_may_idle_at_zero(spec: Option<&serde_yaml_ng::Value>) -> bool {
    let count = |key: &str| yaml_int(spec.and_then(|s| s.get(key)));
    count("minReplicaCount").unwrap_or(0) == 0 || count("idleReplicaCount") == Some(0)
}

/// Without `scaleToZero` the planner's answer is at least 1, so `IsActive` stays true and a
/// ScaledObject that KEDA would take to zero (see [`keda_may_idle_at_zero`]) never gets there
/// once the planner answers (`mode: predictive`; shadow mode answers reactively, which does
/// reach zero, and the switch would change that).
fn zero_note(spec: Option<&serde_yaml_ng::Value>, scale_to_zero: bool) -> Option<String> {
    (!scale_to_zero && keda_may_idle_at_zero(spec)).then(|| {
        "KEDA would take this fleet to zero when idle (minReplicaCount 0 or idleReplicaCount 0), but scaleToZero is \
         false: the planner keeps at least one replica, so IsActive stays true and the fleet never reaches zero (in \
         mode shadow or reactive the answer is KEDA's own and does): set scaleToZero: \"true\" to let the planner \
         take it to zero when no request is expected within the warm-up, or minReplicaCount 1 to say you keep one"
            .to_string()
    })
}

/// The longest KEDA poll that a wake from zero may wait for unnoted, seconds.
const WAKE_POLL_MAX_S: i64 = 15;

/// With `scaleToZero` on a polled `external` trigger, KEDA sees the planner's wake from zero
/// (IsActive turning true) only at its next poll, up to `pollingInterval` after it was decided
/// a warm-up ahead; `external-push` (StreamIsActive) is told at once.
fn wake_poll_note(spec: Option<&serde_yaml_ng::Value>) -> Option<String> {
    let given = yaml_int(spec.and_then(|s| s.get("pollingInterval")));
    let poll = given.unwrap_or(KEDA_DEFAULT_POLLING_S);
    (poll > WAKE_POLL_MAX_S).then(|| {
        let default = if given.is_none() { " (KEDA's default)" } else { "" };
        format!(
            "pollingInterval is {poll} s{default}: at zero replicas KEDA sees a wake-up prescale plans a warm-up ahead \
             only at its next poll, up to {poll} s late; use type external-push (prescale streams the wake-up at once) \
             or pollingInterval {WAKE_POLL_MAX_S} or less"
        )
    })
}

/// What the HPA that KEDA creates for this ScaledObject would do to prescale's answers: the
/// replay (and the plan) assume the answered count is applied at once, in both directions.
/// Notes, not errors: these are choices, and `tolerance` needs a feature gate.
/// `answered_for`: the trigger's `hpaTolerance` (the tolerance prescale rounds scale-ups for).
fn hpa_behavior_notes(spec: Option<&serde_yaml_ng::Value>, answered_for: Option<f64>) -> Vec<String> {
    let behavior = spec
        .and_then(|s| s.get("advanced"))
        .and_then(|a| a.get("horizontalPodAutoscalerConfig"))
        .and_then(|h| h.get("behavior"));
    let rules = |dir: &str| behavior.and_then(|b| b.get(dir));
    // A tolerance is a Kubernetes quantity: `0.05` or `50m`.
    let num = |v: Option<&serde_yaml_ng::Value>| {
        v.and_then(|x| x.as_f64().or_else(|| crate::cluster::capacity::parse_quantity(x.as_str()?)))
    };
    let path = "spec.advanced.horizontalPodAutoscalerConfig.behavior";
    let mut notes = Vec::new();
    let down = yaml_int(rules("scaleDown").and_then(|r| r.get("stabilizationWindowSeconds")));
    let down_s = down.unwrap_or(HPA_DEFAULT_SCALE_DOWN_STABILIZATION_S);
    if down_s > 0 {
        let default = if down.is_none() { " (Kubernetes' default)" } else { "" };
        notes.push(format!(
            "the HPA's scale-down stabilization is {down_s} s{default}: it keeps the largest count prescale answered \
             over the last {down_s} s, so every scale-in the planner decides (including the margin it releases right \
             after a change point) lands {down_s} s late and costs more than planned; the planner already holds \
             capacity through a warm-up: set {path}.scaleDown.stabilizationWindowSeconds: 0"
        ));
    }
    if let Some(up) = yaml_int(rules("scaleUp").and_then(|r| r.get("stabilizationWindowSeconds"))).filter(|&s| s > 0) {
        notes.push(format!(
            "the HPA's scale-up stabilization is {up} s: every pre-scale order reaches the fleet up to {up} s late, \
             on top of the warm-up it was planned for: set {path}.scaleUp.stabilizationWindowSeconds: 0"
        ));
    }
    let max = keda_max_replicas(spec);
    let tol = |dir: &str| num(rules(dir).and_then(|r| r.get("tolerance"))).unwrap_or(HPA_DEFAULT_TOLERANCE);
    let (tol_up, tol_down) = (tol("scaleUp"), tol("scaleDown"));
    // The smallest fleet from which the HPA drops a one-replica move (n → n + 1 or n → n − 1),
    // by the HPA's own float ratio (`hpa::applied`, as `serve` models it): near 1/tolerance.
    let blind_from = |t: f64, step: i64| {
        if t.is_nan() || t <= 0.0 {
            return i64::MAX;
        }
        let near = (1.0 / t).floor().clamp(1.0, 1e9) as i64;
        let dropped = |n: i64| match (u32::try_from(n), u32::try_from(n + step)) {
            (Ok(cur), Ok(ans)) => crate::engine::hpa::applied(cur, ans, t) == cur,
            _ => false,
        };
        (near.saturating_sub(2).max(1)..near + 4).find(|&n| dropped(n)).unwrap_or(near)
    };
    let from = blind_from(tol_up, 1).min(blind_from(tol_down, -1));
    if from <= max {
        notes.push(format!(
            "the HPA ignores an answer within its tolerance (scale-up {tol_up}, scale-down {tol_down}) of the current \
             count: from {from} replicas on (maxReplicaCount {max}) a plan one replica away is not applied as such \
             (prescale answers a scale-up past the tolerance, a few replicas more than planned; a scale-down is \
             dropped); set {path}.scaleUp.tolerance: 0 and scaleDown.tolerance: 0 and hpaTolerance: \"0\" (KEDA 2.18 \
             or later on Kubernetes 1.34 or later; 1.33 needs the HPAConfigurableTolerance feature gate)"
        ));
    }
    if let Some(t) = answered_for.filter(|t| (t - tol_up).abs() > 1e-9) {
        notes.push(format!(
            "hpaTolerance is {t} but the HPA's scale-up tolerance is {tol_up}: prescale rounds scale-ups for the wrong \
             tolerance; set hpaTolerance: \"{tol_up}\""
        ));
    }
    notes
}

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
    fn the_hpa_behaviour_that_would_distort_the_plan_is_noted_once_per_scaled_object() {
        // SO has no behaviour: Kubernetes' defaults (300-s scale-down stabilization,
        // tolerance 0.1) under KEDA's default maxReplicaCount of 100.
        let r = check(SO, &BTreeMap::new()).unwrap();
        let notes = r[0].notes.join("\n");
        assert!(notes.contains("scale-down stabilization is 300 s (Kubernetes' default)"), "{notes}");
        assert!(notes.contains("from 10 replicas on (maxReplicaCount 100)"), "{notes}");
        assert!(!notes.contains("scale-up stabilization"), "{notes}");
        // Set as the notes say: nothing left to say about the HPA.
        let tuned = SO.replace(
            "  scaleTargetRef: {name: llama}\n",
            "  scaleTargetRef: {name: llama}\n  advanced:\n    horizontalPodAutoscalerConfig:\n      behavior:\n        \
             scaleUp: {stabilizationWindowSeconds: 0, tolerance: 0}\n        \
             scaleDown: {stabilizationWindowSeconds: 0, tolerance: 0m}\n",
        );
        let r = check(&tuned, &BTreeMap::new()).unwrap();
        let notes = r[0].notes.join("\n");
        assert!(notes.contains("hpaTolerance is 0.1 but the HPA's scale-up tolerance is 0"), "{notes}");
        let tuned = tuned.replace("scaleToZero: true", "scaleToZero: true\n      hpaTolerance: 0");
        let r = check(&tuned, &BTreeMap::new()).unwrap();
        assert!(r[0].notes.iter().all(|n| !n.contains("HPA")), "{:?}", r[0].notes);
        // A 5 % tolerance (as a quantity): 21/20 is 1.05 in f64, the edge itself, which
        // Kubernetes 1.33+ keeps within its band (`hpa::applied`), so one-replica moves are
        // dropped from 20 replicas on (before 1.33, from 21: |1 − 21/20| is just past 0.05).
        let loose = tuned.replace("tolerance: 0}", "tolerance: 50m}").replace("hpaTolerance: 0", "hpaTolerance: 0.05");
        let r = check(&loose, &BTreeMap::new()).unwrap();
        assert!(
            r[0].notes.iter().any(|n| n.contains("scale-up 0.05") && n.contains("from 20 replicas")),
            "{:?}",
            r[0].notes
        );
        // A slow scale-up and the default tolerance on a fleet that never reaches 10 replicas.
        let slow = SO.replace(
            "  scaleTargetRef: {name: llama}\n",
            "  scaleTargetRef: {name: llama}\n  maxReplicaCount: 8\n  advanced:\n    horizontalPodAutoscalerConfig:\n      \
             behavior:\n        scaleUp: {stabilizationWindowSeconds: 60}\n        \
             scaleDown: {stabilizationWindowSeconds: 0}\n",
        );
        let r = check(&slow, &BTreeMap::new()).unwrap();
        let notes = r[0].notes.join("\n");
        assert!(notes.contains("scale-up stabilization is 60 s"), "{notes}");
        assert!(!notes.contains("tolerance") && !notes.contains("scale-down stabilization"), "{notes}");
        // Two prescale triggers on one ScaledObject: the HPA is noted once.
        let two = format!(
            "{SO}  - type: external\n    metadata: {{scalerAddress: p:9090, rabbitmqHost: amqp://h/, rabbitmqQueueName: q2, \
             metricName: q2}}\n"
        );
        let r = check(&two, &BTreeMap::new()).unwrap();
        assert_eq!(r.len(), 2);
        assert!(r[1].errors.is_empty(), "{:?}", r[1].errors);
        assert!(r[1].notes.iter().all(|n| !n.contains("HPA")), "{:?}", r[1].notes);
        // ...which need their own metric names.
        let same = two.replace(", metricName: q2", "");
        let r = check(&same, &BTreeMap::new()).unwrap();
        assert!(r[0].errors.is_empty(), "{:?}", r[0].errors);
        let e = r[1].errors.iter().find(|e| e.key == "metricName").unwrap_or_else(|| panic!("{:?}", r[1].errors));
        assert!(e.to_string().contains("trigger 1 of this ScaledObject uses it too"), "{e}");
        assert_eq!(e.value.as_deref(), Some("prescale-replicas"));
    }

    #[test]
    fn a_cooldown_longer_than_a_poll_is_noted_where_the_planner_goes_to_zero() {
        // SO: scaleToZero, minReplicaCount unset (0), no cooldownPeriod: KEDA's 300 s.
        let r = check(SO, &BTreeMap::new()).unwrap();
        let note =
            r[0].notes.iter().find(|n| n.contains("cooldownPeriod")).unwrap_or_else(|| panic!("{:?}", r[0].notes));
        assert!(note.contains("cooldownPeriod is 300 s (KEDA's default)"), "{note}");
        assert!(note.contains("about pollingInterval (30)"), "{note}");
        let spec = |extra: &str| {
            SO.replace("  scaleTargetRef: {name: llama}\n", &format!("  scaleTargetRef: {{name: llama}}\n{extra}"))
        };
        let cooled =
            |so: &str| check(so, &BTreeMap::new()).unwrap()[0].notes.iter().any(|n| n.contains("cooldownPeriod"));
        assert!(!cooled(&spec("  pollingInterval: 15\n  cooldownPeriod: 15\n")));
        assert!(cooled(&spec("  pollingInterval: 15\n  cooldownPeriod: 60\n")));
        // Not where KEDA never goes to zero, nor where the planner does not.
        assert!(!cooled(&spec("  minReplicaCount: 1\n")));
        assert!(!cooled(&SO.replace("scaleToZero: true", "scaleToZero: false")));
        // idleReplicaCount 0 goes to zero too, after the same cooldown.
        assert!(cooled(&spec("  minReplicaCount: 1\n  idleReplicaCount: 0\n")));
    }

    #[test]
    fn a_fleet_keda_would_idle_at_zero_without_scale_to_zero_is_noted() {
        let spec = |extra: &str| {
            SO.replace("scaleToZero: true", "scaleToZero: false")
                .replace("  scaleTargetRef: {name: llama}\n", &format!("  scaleTargetRef: {{name: llama}}\n{extra}"))
        };
        let noted = |so: &str| {
            let r = check(so, &BTreeMap::new()).unwrap();
            r[0].notes.iter().find(|n| n.contains("never reaches zero")).cloned()
        };
        let note = noted(&spec("")).expect("minReplicaCount 0 without scaleToZero");
        assert!(note.contains("scaleToZero: \"true\""), "{note}");
        assert!(noted(&spec("  minReplicaCount: 2\n  idleReplicaCount: 0\n")).is_some());
        assert!(noted(&spec("  minReplicaCount: 1\n")).is_none(), "KEDA keeps one anyway");
        assert!(noted(SO).is_none(), "scaleToZero is on");
    }

    #[test]
    fn a_slow_poll_of_a_polled_trigger_that_wakes_from_zero_is_noted() {
        // SO: a polled external trigger with scaleToZero and KEDA's 30-s pollingInterval.
        let woke = |so: &str| check(so, &BTreeMap::new()).unwrap()[0].notes.iter().any(|n| n.contains("wake-up"));
        let r = check(SO, &BTreeMap::new()).unwrap();
        let note = r[0].notes.iter().find(|n| n.contains("wake-up")).unwrap_or_else(|| panic!("{:?}", r[0].notes));
        assert!(note.contains("pollingInterval is 30 s (KEDA's default)") && note.contains("external-push"), "{note}");
        assert!(!woke(
            &SO.replace(
                "  scaleTargetRef: {name: llama}\n",
                "  scaleTargetRef: {name: llama}\n  pollingInterval: 15\n"
            )
        ));
        assert!(!woke(&SO.replace("type: external\n", "type: external-push\n")), "pushed at once");
        assert!(!woke(&SO.replace("scaleToZero: true", "scaleToZero: false")), "never at zero");
    }

    #[test]
    fn planner_bounds_that_differ_from_kedas_are_noted() {
        // SO sets neither: KEDA's defaults (0, 100) equal the planner's (0, 100).
        let r = check(SO, &BTreeMap::new()).unwrap();
        assert!(r[0].notes.iter().all(|n| !n.contains("Replicas is")), "{:?}", r[0].notes);
        let so = SO
            .replace(
                "  scaleTargetRef: {name: llama}\n",
                "  scaleTargetRef: {name: llama}\n  minReplicaCount: 1\n  maxReplicaCount: 8\n",
            )
            .replace("scaleToZero: true", "scaleToZero: true\n      maxReplicas: 12");
        let r = check(&so, &BTreeMap::new()).unwrap();
        let notes = r[0].notes.join("\n");
        assert!(notes.contains("minReplicas is 0 but the ScaledObject's minReplicaCount is 1"), "{notes}");
        assert!(notes.contains("maxReplicas is 12 but the ScaledObject's maxReplicaCount is 8"), "{notes}");
    }

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
    fn a_trigger_metric_type_other_than_average_value_is_an_error_naming_it() {
        let value = SO.replace("  - type: external\n", "  - type: external\n    metricType: Value\n");
        let r = check(&value, &BTreeMap::new()).unwrap();
        let e = &r[0].errors;
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!((e[0].key.as_str(), e[0].value.as_deref()), ("metricType", Some("Value")));
        assert_eq!(e[0].scaled_object, "ml/llama");
        assert!(r[0].config.is_none());
        let average = SO.replace("  - type: external\n", "  - type: external\n    metricType: AverageValue\n");
        assert!(check(&average, &BTreeMap::new()).unwrap()[0].errors.is_empty());
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
