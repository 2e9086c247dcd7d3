//! Credential redaction: every URL that reaches a log line, an error or `/debug/scalers`
//! goes through [`redact_url`] first.

/// Replace the password (and any user name) of a URL with `***`; also hides query
/// parameters that look like secrets. Non-URLs are returned unchanged unless they
/// contain `user:pass@`, which is masked too.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) if u.has_host() => {
            if !u.username().is_empty() || u.password().is_some() {
                let _ = u.set_username("***");
                let _ = u.set_password(None);
            }
            if u.query().is_some() {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let lk = k.to_ascii_lowercase();
                        let secret =
                            ["password", "token", "secret", "key", "signature", "auth"].iter().any(|s| lk.contains(s));
                        (k.into_owned(), if secret { "***".into() } else { v.into_owned() })
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        _ => mask_userinfo(raw),
    }
}

fn mask_userinfo(raw: &str) -> String {
    // host:port style strings with "user:pass@" but no scheme.
    if let Some(at) = raw.rfind('@') {
        let start = raw.find("://").map(|i| i + 3).unwrap_or(0);
        if at > start {
            return format!("{}***@{}", &raw[..start], &raw[at + 1..]);
        }
    }
    raw.to_string()
}

/// Redact every URL-looking token inside a free-form message (library errors may
/// quote the URL they failed on).
pub fn redact_text(msg: &str) -> String {
    msg.split_inclusive(char::is_whitespace)
        .map(|tok| {
            let trimmed = tok.trim_end();
            let tail = &tok[trimmed.len()..];
            let core = trimmed.trim_matches(|c| matches!(c, '"' | '\'' | '(' | ')' | ':' | ',' | ';'));
            if core.contains("://") && core.contains('@') {
                tok.replace(core, &redact_url(core))
            } else {
                format!("{trimmed}{tail}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_password_in_amqp_and_http_urls() {
        let r = redact_url("amqp://bob:s3cret@rabbit:5672/%2f");
        assert!(!r.contains("s3cret"), "{r}");
        assert!(!r.contains("bob"), "{r}");
        assert!(r.contains("rabbit:5672"), "{r}");
        let r = redact_url("https://u:p4ss@prom.example/api?token=abc&query=up");
        assert!(!r.contains("p4ss") && !r.contains("abc"), "{r}");
        assert!(r.contains("query=up"), "{r}");
    }

    #[test]
    fn leaves_plain_urls_alone() {
        assert_eq!(redact_url("http://prom:9090"), "http://prom:9090/");
        assert_eq!(redact_url("queue-name"), "queue-name");
    }

    #[test]
    fn redacts_urls_inside_messages() {
        let m = redact_text("connect to amqp://a:topsecret@h:5672/vh failed: refused");
        assert!(!m.contains("topsecret"), "{m}");
        assert!(m.ends_with("failed: refused"));
        // Quoted and followed by punctuation, as a parser's reason quotes a bad item.
        let m = redact_text("bad item \"amqp://u:topsecret@h:5672/%2f\": expected ids");
        assert_eq!(m, "bad item \"amqp://***@h:5672/%2f\": expected ids");
    }
}
