//! Prometheus text exposition, shared by the sources that scrape `/metrics` themselves
//! (vLLM, dcgm-exporter): a bounded HTTP GET and a parse with the `prometheus-parse` crate.
//!
//! `prometheus-parse` 0.2 matches metric names with `\w+`, so a name with colons
//! (`vllm:num_requests_waiting`, legal in the text format) would be skipped. Before parsing,
//! the colons of the *name* of each sample / `# HELP` / `# TYPE` line are replaced by
//! U+02D0 `ː` (a Unicode letter, so `\w` matches it, and never valid in a metric name, so
//! decoding is unambiguous).
//!
//! It also splits the label block on every `,` and `=` and stops at the first `}`, so a
//! label value holding one of those (`model_name="a,b"`, a LoRA path with `=`), an escaped
//! quote, or a space after a comma would be cut or dropped. The label block is therefore
//! tokenised here first (quoted values with the format's `\\`, `\"` and `\n` escapes) and
//! written back canonically — `k="v",k2="v2"` — with the characters the crate would
//! split on replaced by private-use stand-ins, which [`parse`] maps back.

use std::collections::HashMap;
use std::time::Duration;

use super::SourceError;
use crate::redact::redact_url;

/// Stand-in for `:` inside metric names while `prometheus-parse` reads them.
const COLON: char = 'ː';

/// Largest body read from one endpoint (a vLLM or 8-GPU dcgm-exporter page is ~100 KiB).
const MAX_BODY: usize = 32 << 20;

/// One sample line: name, labels, value. A histogram's buckets are `<name>_bucket` series
/// with an `le` label, whether or not the page declared the histogram's `# TYPE` (the crate
/// folds a typed histogram's bucket lines into one sample; they are unfolded here); summary
/// quantiles are dropped (no source uses them).
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub value: f64,
}

impl Series {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

fn encode_name(name: &str) -> String {
    name.replace(':', &COLON.to_string())
}

/// Characters of a label value that `prometheus-parse` splits on or trims, and their
/// stand-ins (Unicode private use area: never produced by an exporter on purpose).
const VALUE_STAND_INS: [(char, char); 5] =
    [(',', '\u{E000}'), ('=', '\u{E001}'), ('}', '\u{E002}'), ('"', '\u{E003}'), ('\n', '\u{E004}')];

fn encode_value(raw: &str) -> String {
    raw.chars().map(|c| VALUE_STAND_INS.iter().find(|(from, _)| *from == c).map_or(c, |(_, to)| *to)).collect()
}

fn decode_value(v: &str) -> String {
    v.chars().map(|c| VALUE_STAND_INS.iter().find(|(_, to)| *to == c).map_or(c, |(from, _)| *from)).collect()
}

/// Tokenise a label block starting right after `{`: the labels (values unescaped) and the
/// rest of the line after the closing `}`. `None` when it is malformed (left to the crate).
fn label_block(s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = s.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = rest.find('=')?;
        let key = rest[..eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let body = rest[eq + 1..].trim_start();
        let mut chars = body.char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => {
                    end = Some(i + 1);
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((key.to_string(), value));
        rest = body[end?..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after.trim_start();
        } else if !rest.starts_with('}') {
            return None;
        }
    }
}

/// Rewrite the metric name of one line (sample, `# HELP`, `# TYPE`) so that colons parse.
fn encode_line(line: &str) -> String {
    let trimmed = line.trim_start();
    if let Some(rest) = trimmed.strip_prefix('#') {
        let rest = rest.trim_start();
        for kw in ["HELP", "TYPE"] {
            if let Some(after) = rest.strip_prefix(kw) {
                let after = after.trim_start();
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                return format!("# {kw} {}{}", encode_name(&after[..end]), &after[end..]);
            }
        }
        return trimmed.to_string();
    }
    let end = trimmed.find(|c: char| c == '{' || c.is_whitespace()).unwrap_or(trimmed.len());
    let name = encode_name(&trimmed[..end]);
    let rest = &trimmed[end..];
    match rest.strip_prefix('{').and_then(label_block) {
        // No label left: drop the empty braces (the crate's pattern wants at least one).
        Some((labels, after)) if labels.is_empty() => format!("{name}{after}"),
        Some((labels, after)) => {
            let block: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", encode_value(v))).collect();
            format!("{name}{{{}}}{after}", block.join(","))
        }
        None => format!("{name}{rest}"),
    }
}

/// A label value as the Prometheus text format writes it between its quotes (a backslash,
/// `"` and a line feed escaped), which is also how a PromQL string literal spells it.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Parse exposition text into its plain samples (counter, gauge, untyped).
pub fn parse(text: &str) -> Result<Vec<Series>, SourceError> {
    let lines = text.lines().map(|l| Ok(encode_line(l)));
    let scrape = prometheus_parse::Scrape::parse(lines).map_err(SourceError::parse)?;
    let mut out = Vec::with_capacity(scrape.samples.len());
    for s in scrape.samples {
        let labels: HashMap<String, String> = s.labels.iter().map(|(k, v)| (k.clone(), decode_value(v))).collect();
        let name = s.metric.replace(COLON, ":");
        let value = match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(buckets) => {
                for b in buckets {
                    let mut labels = labels.clone();
                    labels.insert("le".to_string(), le_label(b.less_than));
                    out.push(Series { name: format!("{name}_bucket"), labels, value: b.count });
                }
                continue;
            }
            _ => continue,
        };
        out.push(Series { name, labels, value });
    }
    Ok(out)
}

/// A bucket bound as the text format writes it (`+Inf` for the last).
fn le_label(bound: f64) -> String {
    if bound == f64::INFINITY {
        "+Inf".to_string()
    } else {
        bound.to_string()
    }
}

/// `host:port`, `host`, `http(s)://host[:port][/path]` → a scrape URL: `http://` and
/// `default_port` when no scheme is given, `/metrics` when no path is given.
pub fn endpoint_url(raw: &str, default_port: u16) -> Result<url::Url, String> {
    let raw = raw.trim();
    let with_scheme = if raw.contains("://") { raw.to_string() } else { format!("http://{raw}") };
    let mut u = url::Url::parse(&with_scheme).map_err(|e| format!("not a URL or host:port ({e})"))?;
    if !matches!(u.scheme(), "http" | "https") || !u.has_host() {
        return Err("expected http(s)://host[:port][/path] or host:port".into());
    }
    if !raw.contains("://") && u.port().is_none() {
        let _ = u.set_port(Some(default_port));
    }
    if u.path().is_empty() || u.path() == "/" {
        u.set_path("/metrics");
    }
    Ok(u)
}

/// GET one `/metrics` page: status checked, size bounded, errors redacted and naming the
/// endpoint.
pub async fn fetch(http: &reqwest::Client, url: &url::Url, timeout: Duration) -> Result<String, SourceError> {
    let shown = redact_url(url.as_str());
    let mut resp = http
        .get(url.clone())
        .header(reqwest::header::ACCEPT, "text/plain;version=0.0.4;q=1,*/*;q=0.1")
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| SourceError::connect(format!("{shown}: {}", describe(&e))))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(SourceError::Query(format!("{shown} answered {status}")));
    }
    let mut body: Vec<u8> = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if body.len() + c.len() > MAX_BODY {
                    return Err(SourceError::Parse(format!("{shown}: body larger than {} MiB", MAX_BODY >> 20)));
                }
                body.extend_from_slice(&c);
            }
            Ok(None) => break,
            Err(e) => return Err(SourceError::connect(format!("{shown}: {}", describe(&e)))),
        }
    }
    String::from_utf8(body).map_err(|_| SourceError::Parse(format!("{shown}: body is not UTF-8")))
}

/// A reqwest error without its URL (the caller names the redacted endpoint), with its cause.
fn describe(e: &reqwest::Error) -> String {
    use std::error::Error as _;
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    let mut cause = String::new();
    let mut src = e.source();
    while let Some(s) = src {
        cause = s.to_string();
        src = s.source();
    }
    if cause.is_empty() {
        kind.to_string()
    } else {
        format!("{kind} ({})", crate::redact::redact_text(&cause))
    }
}

/// A comma-separated endpoint list read from metadata key `key`: every bad item is an
/// error naming it; an empty list is an error too. `None` when any error was recorded.
pub fn endpoint_list(
    md: &mut crate::config::Metadata<'_>,
    key: &str,
    list: &str,
    default_port: u16,
) -> Option<Vec<String>> {
    let mut urls = Vec::new();
    let mut bad = false;
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match endpoint_url(item, default_port) {
            Ok(u) => urls.push(u.to_string()),
            Err(why) => {
                md.error(key, Some(item), &why);
                bad = true;
            }
        }
    }
    urls.dedup();
    if urls.is_empty() && !bad {
        md.error(key, Some(list), "lists no endpoint");
    }
    (!bad && !urls.is_empty()).then_some(urls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_colons_parse_and_label_values_are_untouched() {
        let text = "# HELP vllm:num_requests_running Number of requests.\n\
                    # TYPE vllm:num_requests_running gauge\n\
                    vllm:num_requests_running{engine=\"0\",model_name=\"org/m:v1\"} 8.0\n\
                    plain_metric 3\n\
                    :leading:colon 1\n";
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "vllm:num_requests_running");
        assert_eq!(s[0].label("model_name"), Some("org/m:v1"));
        assert_eq!(s[0].value, 8.0);
        assert_eq!(s[1].name, "plain_metric");
        assert_eq!(s[2].name, ":leading:colon");
    }

    #[test]
    fn label_values_with_separators_escapes_and_spaces() {
        let text = "# TYPE vllm:num_requests_waiting gauge\n\
                    vllm:num_requests_waiting{model_name=\"a,b=c}d\", engine = \"0\" ,path=\"C:\\\\x\\\"q\\\"\\nz\",} 4\n\
                    DCGM_FI_DEV_GPU_UTIL{} 7 1700000000000\n";
        let s = parse(text).unwrap();
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].label("model_name"), Some("a,b=c}d"));
        assert_eq!(s[0].label("engine"), Some("0"));
        assert_eq!(s[0].label("path"), Some("C:\\x\"q\"\nz"));
        assert_eq!(s[0].labels.len(), 3);
        assert_eq!(s[0].value, 4.0);
        assert_eq!((s[1].name.as_str(), s[1].value, s[1].labels.len()), ("DCGM_FI_DEV_GPU_UTIL", 7.0, 0));
        // Malformed blocks are left to the crate and never panic.
        for bad in ["m{a=\"x} 1", "m{a=x} 1", "m{=\"x\"} 1", "m{a=\"x\\", "m{a=\"x\" b=\"y\"} 1", "m{é=\"x\"} 1"] {
            let _ = parse(bad);
        }
    }

    proptest::proptest! {
        /// Any text parses or errors without panicking, and a label value of any
        /// characters, written with the format's escapes, reads back unchanged.
        #[test]
        fn never_panics_and_label_values_round_trip(garbage in "\\PC{0,80}", value in "\\PC{0,24}") {
            let _ = parse(&garbage);
            let _ = parse(&format!("m{{{garbage} 1\n"));
            let escaped = escape_label_value(&value);
            let s = parse(&format!("vllm:x{{a=\"{escaped}\",b=\"1\"}} 2\n")).unwrap();
            proptest::prop_assert_eq!(s.len(), 1);
            proptest::prop_assert_eq!(s[0].label("a"), Some(value.as_str()));
            proptest::prop_assert_eq!(s[0].label("b"), Some("1"));
        }
    }

    #[test]
    fn histogram_buckets_read_alike_typed_or_not_and_garbage_does_not_panic() {
        let typed = "# TYPE vllm:h histogram\nvllm:h_bucket{engine=\"0\",le=\"0.1\"} 1\nvllm:h_bucket{engine=\"0\",le=\"+Inf\"} 3\n\
                     vllm:h_count{engine=\"0\"} 3\nvllm:h_sum{engine=\"0\"} 0.2\n{{{ }}} \n\u{0}\nx{a=\"b\"} notanumber\n";
        let untyped = typed.replacen("# TYPE vllm:h histogram\n", "", 1);
        for text in [typed, &untyped] {
            let s = parse(text).unwrap();
            let mut buckets: Vec<(String, f64, Option<&str>)> = s
                .iter()
                .filter(|s| s.name == "vllm:h_bucket")
                .map(|s| (s.label("le").unwrap().to_string(), s.value, s.label("engine")))
                .collect();
            buckets.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(buckets, [("+Inf".to_string(), 3.0, Some("0")), ("0.1".to_string(), 1.0, Some("0"))], "{text}");
            assert!(s.iter().any(|s| s.name == "vllm:h_count"));
        }
    }

    #[test]
    fn endpoint_urls() {
        assert_eq!(endpoint_url("10.0.0.1:8000", 9).unwrap().as_str(), "http://10.0.0.1:8000/metrics");
        assert_eq!(endpoint_url("gpu-node", 9400).unwrap().as_str(), "http://gpu-node:9400/metrics");
        assert_eq!(endpoint_url("https://h/custom", 1).unwrap().as_str(), "https://h/custom");
        assert_eq!(endpoint_url("http://h:81", 1).unwrap().as_str(), "http://h:81/metrics");
        assert!(endpoint_url("amqp://h", 1).is_err());
        assert!(endpoint_url("", 1).is_err());
        assert!(endpoint_url("http://", 1).is_err());
    }
}
