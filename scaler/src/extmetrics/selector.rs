//! Kubernetes label selectors as the HPA sends them in `?labelSelector=`:
//! `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, comma-separated.

use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector(pub Vec<Term>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad label selector {0:?}: {1}")]
pub struct SelectorError(pub String, pub &'static str);

/// Split on commas that are not inside parentheses.
fn split_terms(s: &str) -> Result<Vec<&str>, SelectorError> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(SelectorError(s.into(), "unbalanced parentheses"));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(SelectorError(s.into(), "unbalanced parentheses"));
    }
    out.push(&s[start..]);
    Ok(out.into_iter().map(str::trim).filter(|t| !t.is_empty()).collect())
}

fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn set(s: &str, whole: &str) -> Result<Vec<String>, SelectorError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or(SelectorError(whole.into(), "expected (a,b) after in/notin"))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

impl Selector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for t in split_terms(s)? {
            let term = if let Some(k) = t.strip_prefix('!') {
                Term::Absent(k.trim().to_string())
            } else if let Some((k, v)) = t.split_once("!=") {
                Term::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once("==") {
                Term::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once('=') {
                Term::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = t.split_once(" notin ") {
                Term::NotIn(k.trim().into(), set(rest, s)?)
            } else if let Some((k, rest)) = t.split_once(" in ") {
                Term::In(k.trim().into(), set(rest, s)?)
            } else {
                Term::Exists(t.to_string())
            };
            let key = match &term {
                Term::Eq(k, _)
                | Term::Ne(k, _)
                | Term::In(k, _)
                | Term::NotIn(k, _)
                | Term::Exists(k)
                | Term::Absent(k) => k,
            };
            if !valid_key(key) {
                return Err(SelectorError(s.into(), "invalid label key"));
            }
            terms.push(term);
        }
        Ok(Self(terms))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|t| match t {
            Term::Eq(k, v) => labels.get(k) == Some(v),
            Term::Ne(k, v) => labels.get(k) != Some(v),
            Term::In(k, vs) => labels.get(k).is_some_and(|x| vs.contains(x)),
            Term::NotIn(k, vs) => labels.get(k).is_none_or(|x| !vs.contains(x)),
            Term::Exists(k) => labels.contains_key(k),
            Term::Absent(k) => !labels.contains_key(k),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(p: &[(&str, &str)]) -> BTreeMap<String, String> {
        p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn parses_and_matches_every_operator() {
        let l = labels(&[("model_name", "llama"), ("scaledobject.keda.sh/name", "so")]);
        for (sel, want) in [
            ("", true),
            ("model_name=llama", true),
            ("model_name==llama", true),
            ("model_name!=llama", false),
            ("model_name in (a, llama)", true),
            ("model_name notin (a,llama)", false),
            ("model_name", true),
            ("!model_name", false),
            ("!absent,scaledobject.keda.sh/name=so", true),
            ("tier", false),
        ] {
            assert_eq!(Selector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
        assert!(Selector::parse("a in (b").is_err());
        assert!(Selector::parse("a b c").is_err());
    }
}
