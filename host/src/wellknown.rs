//! The label and annotation keys kpx reads on Kubernetes objects, and the
//! `key=value,...` syntax its annotations and flags share: one home below
//! the sources that read the objects, the state that keeps them, the
//! runtime that hands each extension its own annotations, and the flags.

/// The label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label upstream skips a headless Service's slices by.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// The label of a Service that another proxy serves: kpx leaves it out.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// A Node's topology zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The prefix of kpx's own annotations.
pub const ANNOTATION_PREFIX: &str = "kpx.dev/";
/// Extensions' annotations: `ext.kpx.dev/<extension>.<key>`; each
/// extension sees its own only.
pub const EXTENSION_PREFIX: &str = "ext.kpx.dev/";
/// The endpoint controller's change time on a slice.
pub const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// `key=value,...` pairs (annotations, `--extension` parameters); the
/// error names the malformed entry.
pub fn pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    entries(text)
        .map(|entries| entries.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        .map_err(|entry| format!("{entry:?} is not key=value"))
}

/// One `key=value` (trimmed; the key not empty, the value may hold `=` and
/// commas): a flag that takes one pair per use.
pub fn pair(entry: &str) -> Option<(String, String)> {
    split_pair(entry).map(|(k, v)| (k.to_string(), v.to_string()))
}

fn split_pair(entry: &str) -> Option<(&str, &str)> {
    match entry.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Some((k.trim(), v.trim())),
        _ => None,
    }
}

/// The `key=value` entries of `text` (trimmed, empty ones skipped),
/// borrowed from it; the error is the first entry that is not one.
pub fn entries(text: &str) -> Result<Vec<(&str, &str)>, &str> {
    non_empty(text).map(|entry| split_pair(entry).ok_or(entry)).collect()
}

/// The entries of `text`: split at commas, trimmed, empty ones skipped.
pub fn non_empty(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|e| !e.is_empty())
}
