//! Label and field selectors as the API server reads them
//! (`k8s.io/apimachinery/pkg/labels` and `.../fields`): comma-separated
//! requirements, all of which must hold.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

/// A selector the server cannot read: answered with 400 Bad Request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSelector(pub String);

/// Splits at commas outside parentheses (`a in (x,y),b`).
fn split_top(text: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

fn key(text: &str, whole: &str) -> Result<String, BadSelector> {
    let k = text.trim();
    let ok = !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if ok { Ok(k.to_string()) } else { Err(BadSelector(format!("invalid key {k:?} in selector {whole:?}"))) }
}

fn values(text: &str, whole: &str) -> Result<Vec<String>, BadSelector> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| BadSelector(format!("set needs parentheses in selector {whole:?}")))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

impl Selector {
    /// Parses a label selector (`=`, `==`, `!=`, `in`, `notin`, `KEY`, `!KEY`).
    pub fn labels(text: &str) -> Result<Selector, BadSelector> {
        let mut out = Vec::new();
        if text.trim().is_empty() {
            return Ok(Selector(out));
        }
        for part in split_top(text) {
            let part = part.trim();
            let req = if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(key(k, text)?, v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::Equals(key(k, text)?, v.trim().to_string())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Requirement::NotIn(key(k, text)?, values(v, text)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Requirement::In(key(k, text)?, values(v, text)?)
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::NotExists(key(k, text)?)
            } else {
                Requirement::Exists(key(part, text)?)
            };
            out.push(req);
        }
        Ok(Selector(out))
    }

    /// Parses a field selector (`=`, `==`, `!=` on the fields [`field`] knows).
    pub fn fields(text: &str) -> Result<Selector, BadSelector> {
        let parsed = Selector::labels(text)?;
        for r in &parsed.0 {
            let k = match r {
                Requirement::Equals(k, _) | Requirement::NotEquals(k, _) => k,
                _ => return Err(BadSelector(format!("field selectors take = and != only: {text:?}"))),
            };
            if !FIELDS.contains(&k.as_str()) {
                return Err(BadSelector(format!("field label not supported: {k}")));
            }
        }
        Ok(parsed)
    }

    /// True when every requirement holds for `get(key)`.
    fn matches_with(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k).as_deref() == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k).as_deref() != Some(v.as_str()),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
        })
    }

    pub fn matches_labels(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        self.matches_with(|k| labels.and_then(|l| l.get(k)).and_then(Value::as_str).map(str::to_string))
    }

    pub fn matches_fields(&self, object: &Value) -> bool {
        self.matches_with(|k| field(object, k))
    }
}

/// The fields every kind may be selected by.
const FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

fn field(object: &Value, key: &str) -> Option<String> {
    let pointer = match key {
        "metadata.name" => "/metadata/name",
        "metadata.namespace" => "/metadata/namespace",
        _ => return None,
    };
    // A cluster-scoped object's namespace reads as "".
    Some(object.pointer(pointer).and_then(Value::as_str).unwrap_or("").to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn kube_proxy_selector() {
        let s = Selector::labels("!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless").unwrap();
        assert!(s.matches_labels(&obj(json!({"app": "x"}))));
        assert!(s.matches_labels(&json!({"metadata": {"name": "a"}})));
        assert!(!s.matches_labels(&obj(json!({"service.kubernetes.io/headless": ""}))));
        assert!(!s.matches_labels(&obj(json!({"service.kubernetes.io/service-proxy-name": "other"}))));
    }

    #[test]
    fn every_operator() {
        let o = obj(json!({"a": "1", "b": "2"}));
        for (sel, want) in [
            ("a=1", true),
            ("a==1", true),
            ("a=2", false),
            ("a!=2", true),
            ("c!=2", true),
            ("a in (1, 3)", true),
            ("a notin (1,3)", false),
            ("c notin (1)", true),
            ("a,b", true),
            ("a,c", false),
            ("a in (3),b=2", false),
            ("", true),
        ] {
            assert_eq!(Selector::labels(sel).unwrap().matches_labels(&o), want, "{sel}");
        }
        assert!(Selector::labels("a in 1").is_err());
        assert!(Selector::labels("a b=1").is_err());
    }

    #[test]
    fn fields() {
        let o = obj(json!({}));
        assert!(Selector::fields("metadata.name=a").unwrap().matches_fields(&o));
        assert!(!Selector::fields("metadata.name=b").unwrap().matches_fields(&o));
        assert!(Selector::fields("metadata.namespace!=x").unwrap().matches_fields(&o));
        assert!(Selector::fields("spec.nodeName=a").is_err());
        assert!(Selector::fields("metadata.name").is_err());
    }
}
