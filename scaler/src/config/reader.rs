//! A metadata map being read: typed getters that record which keys were consumed and
//! collect every error with the key, the redacted value and the ScaledObject.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{ConfigError, ConfigErrors, ScalerId};
use crate::redact::{redact_text, redact_url};

pub struct Metadata<'a> {
    id: &'a ScalerId,
    map: &'a BTreeMap<String, String>,
    consumed: BTreeSet<String>,
    errors: Vec<ConfigError>,
}

impl<'a> Metadata<'a> {
    pub fn new(id: &'a ScalerId, map: &'a BTreeMap<String, String>) -> Self {
        Self { id, map, consumed: BTreeSet::new(), errors: Vec::new() }
    }

    pub fn id(&self) -> &ScalerId {
        self.id
    }

    /// Keys read so far (used by the README ↔ parser sync test).
    pub fn consumed(&self) -> &BTreeSet<String> {
        &self.consumed
    }

    pub fn consume(&mut self, key: &str) {
        self.consumed.insert(key.to_string());
    }

    /// True when any key with this prefix is present (a source is configured).
    pub fn has_prefix(&self, prefix: &str) -> bool {
        self.map.keys().any(|k| k.starts_with(prefix))
    }

    pub fn is_set(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    pub fn error(&mut self, key: &str, value: Option<&str>, reason: &str) {
        self.errors.push(ConfigError {
            scaled_object: self.id.to_string(),
            key: key.to_string(),
            value: value.map(redact_url),
            // A reason may quote (part of) the value.
            reason: redact_text(reason),
        });
    }

    /// The raw value (trimmed); `None` when absent. Consumes the key.
    pub fn string(&mut self, key: &str) -> Option<String> {
        self.consume(key);
        self.map.get(key).map(|v| v.trim().to_string())
    }

    pub fn required(&mut self, key: &str, what: &str) -> Option<String> {
        match self.string(key) {
            Some(v) if !v.is_empty() => Some(v),
            Some(v) => {
                self.error(key, Some(&v), &format!("must not be empty ({what})"));
                None
            }
            None => {
                self.error(key, None, &format!("is required ({what})"));
                None
            }
        }
    }

    /// A number in `[min, max]` (or `(min, max]` when `min_exclusive`), default when absent.
    pub fn f64_in(&mut self, key: &str, default: f64, min: f64, max: f64, min_exclusive: bool) -> Option<f64> {
        let Some(raw) = self.string(key) else { return Some(default) };
        self.parse_f64(key, &raw, min, max, min_exclusive)
    }

    /// A number > 0 or absent.
    pub fn opt_positive_f64(&mut self, key: &str) -> Option<Option<f64>> {
        match self.string(key) {
            None => Some(None),
            Some(raw) => self.parse_f64(key, &raw, 0.0, f64::MAX, true).map(Some),
        }
    }

    fn parse_f64(&mut self, key: &str, raw: &str, min: f64, max: f64, min_exclusive: bool) -> Option<f64> {
        match raw.parse::<f64>() {
            Ok(x) if x.is_finite() && (if min_exclusive { x > min } else { x >= min }) && x <= max => Some(x),
            Ok(_) => {
                let lo = if min_exclusive { format!("greater than {min}") } else { format!("at least {min}") };
                let hi = if max < f64::MAX { format!(" and at most {max}") } else { String::new() };
                self.error(key, Some(raw), &format!("must be a number {lo}{hi}"));
                None
            }
            Err(_) => {
                self.error(key, Some(raw), "not a number");
                None
            }
        }
    }

    pub fn u32(&mut self, key: &str, default: u32) -> Option<u32> {
        let Some(raw) = self.string(key) else { return Some(default) };
        match raw.parse::<u32>() {
            Ok(x) => Some(x),
            Err(_) => {
                self.error(key, Some(&raw), "must be a whole number ≥ 0");
                None
            }
        }
    }

    pub fn bool(&mut self, key: &str, default: bool) -> Option<bool> {
        let Some(raw) = self.string(key) else { return Some(default) };
        match raw.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Some(true),
            "false" | "0" | "no" => Some(false),
            _ => {
                self.error(key, Some(&raw), "expected true or false");
                None
            }
        }
    }

    /// One of `options` (case-insensitive), returned in its canonical spelling.
    pub fn choice(&mut self, key: &str, default: &'static str, options: &[&'static str]) -> Option<&'static str> {
        let Some(raw) = self.string(key) else { return Some(default) };
        match options.iter().find(|o| o.eq_ignore_ascii_case(&raw)) {
            Some(o) => Some(o),
            None => {
                self.error(key, Some(&raw), &format!("expected one of {}", options.join(", ")));
                None
            }
        }
    }

    pub fn duration_secs(&mut self, key: &str, default: f64, min: f64, max: f64) -> Option<Duration> {
        self.f64_in(key, default, min, max, false).map(Duration::from_secs_f64)
    }

    /// Reject every key nobody consumed, then return the config or every error.
    pub fn finish<T>(mut self, cfg: Option<T>) -> Result<T, ConfigErrors> {
        let unknown: Vec<String> = self.map.keys().filter(|k| !self.consumed.contains(*k)).cloned().collect();
        for k in unknown {
            let hint = super::keys::closest(&k).map(|c| format!(" (did you mean \"{c}\"?)")).unwrap_or_default();
            self.errors.push(ConfigError {
                scaled_object: self.id.to_string(),
                key: k,
                value: None,
                reason: format!("unknown key{hint}; see the metadata reference in the README"),
            });
        }
        match (cfg, self.errors.is_empty()) {
            (Some(c), true) => Ok(c),
            _ => {
                if self.errors.is_empty() {
                    // A getter returned None without recording why: never happens by
                    // construction, but never answer Ok with a half-parsed config.
                    self.errors.push(ConfigError {
                        scaled_object: self.id.to_string(),
                        key: String::new(),
                        value: None,
                        reason: "invalid metadata".into(),
                    });
                }
                Err(ConfigErrors(self.errors))
            }
        }
    }
}
