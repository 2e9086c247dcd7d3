//! Text that reaches the scaler from outside: ScaledObject YAML and metadata maps (`check`,
//! the same parser as the gRPC path), Prometheus answers (instant, vector, range), scraped
//! exposition text (vLLM), label selectors, Kubernetes quantities and times from the external metrics API and the
//! replay CLI. Every one gives a value or an error, never a panic; a metadata error names
//! its key and the ScaledObject.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use prescale::cluster::capacity::parse_quantity;
use prescale::config::{self, ScalerId};
use prescale::extmetrics::selector::Selector;
use prescale::replay::prom::{parse_time, place_samples};
use prescale::sources::{dcgm, exposition, prometheus, vllm};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    match which % 9 {
        0 => {
            let _ = prescale::check::check(text, &BTreeMap::new());
        }
        1 => {
            // `key=value` lines: a metadata map as KEDA sends it.
            let md: BTreeMap<String, String> = text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let id = ScalerId { namespace: "ns".into(), name: "so".into() };
            if let Err(errs) = config::parse(&id, &md) {
                assert!(!errs.0.is_empty());
                for e in &errs.0 {
                    assert_eq!(e.scaled_object, "ns/so", "{e}");
                }
            }
        }
        2 => {
            let _ = prometheus::parse_instant(text, which & 8 != 0);
        }
        3 => {
            let _ = dcgm::parse_vector(text);
        }
        4 => {
            if let Ok(series) = exposition::parse(text) {
                // The SLO from the input too: 0, a bound, between bounds, huge.
                let slo = [0.0, 5.0, 4.0, 1e6][usize::from(which >> 4) % 4];
                let _ = vllm::pod_stats(&series, None, slo);
                let _ = vllm::pod_stats(&series, Some("m"), slo);
            }
        }
        5 => {
            if let Ok(sel) = Selector::parse(text) {
                let labels = BTreeMap::from([("app".to_string(), "vllm".to_string())]);
                let _ = sel.matches(&labels);
            }
        }
        6 => {
            let _ = parse_time(text, 1_800_000_000);
        }
        7 => {
            if let Some(v) = parse_quantity(text) {
                assert!(v.is_finite(), "{text:?} -> {v}");
            }
        }
        _ => {
            if let Ok(body) = serde_json::from_str::<serde_json::Value>(text) {
                let mut slots = vec![None; 64];
                let _ = place_samples(&body, 1_800_000_000, 15, &mut slots);
            }
        }
    }
});
