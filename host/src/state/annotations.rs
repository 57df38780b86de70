//! kpx's annotations:
//! - Service `kpx.dev/scheduler: <name>` and `kpx.dev/scheduler-params:
//!   key=value,...`: the Service's scheduler;
//! - Service `ext.kpx.dev/<extension>.<key>`: an extension's own, handed
//!   to that extension only;
//! - EndpointSlice `kpx.dev/weights: <address>=<weight>,...`: endpoint
//!   weights (0 to 65535; default 1).
//!
//! A malformed annotation is logged against its object and ignored (the
//! Service keeps the default scheduler; an endpoint keeps weight 1).

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpx_rules::model::SchedulerChoice;

pub const SCHEDULER: &str = "kpx.dev/scheduler";
pub const SCHEDULER_PARAMS: &str = "kpx.dev/scheduler-params";
pub const WEIGHTS: &str = "kpx.dev/weights";
/// Extensions' annotations: `ext.kpx.dev/<extension>.<key>`; each
/// extension sees its own only.
pub const EXTENSION_PREFIX: &str = "ext.kpx.dev/";

/// A Service's extension annotations, full keys, sorted.
pub fn extensions(annotations: Option<&BTreeMap<String, String>>) -> Vec<(String, String)> {
    annotations
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with(EXTENSION_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `key=value,...` pairs (annotations, `--extension` parameters); the
/// error names the malformed entry.
pub fn pairs(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| pair(entry).ok_or_else(|| format!("{entry:?} is not key=value")))
        .collect()
}

/// One `key=value` (trimmed; the key not empty, the value may hold `=` and
/// commas): a flag that takes one pair per use.
pub fn pair(entry: &str) -> Option<(String, String)> {
    match entry.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Some((k.trim().to_string(), v.trim().to_string())),
        _ => None,
    }
}

/// The scheduler a Service's annotations select; `object` names it in logs.
pub fn scheduler(annotations: Option<&BTreeMap<String, String>>, object: &str) -> Option<SchedulerChoice> {
    let annotations = annotations?;
    let name = annotations.get(SCHEDULER).map(|n| n.trim()).filter(|n| !n.is_empty());
    let params = annotations.get(SCHEDULER_PARAMS);
    let Some(name) = name else {
        if params.is_some() {
            tracing::warn!(service = object, "{SCHEDULER_PARAMS} without {SCHEDULER} is ignored");
        }
        return None;
    };
    match params.map(|p| pairs(p)).transpose() {
        Ok(parameters) => Some(SchedulerChoice { name: name.to_string(), parameters: parameters.unwrap_or_default() }),
        Err(e) => {
            tracing::warn!(service = object, "{SCHEDULER_PARAMS}: {e}; the Service keeps the default scheduler");
            None
        }
    }
}

/// The weights an EndpointSlice's annotation gives, by address; bad
/// entries are logged and left out.
pub fn weights(annotations: Option<&BTreeMap<String, String>>, object: &str) -> BTreeMap<IpAddr, u16> {
    let mut out = BTreeMap::new();
    let Some(text) = annotations.and_then(|a| a.get(WEIGHTS)) else {
        return out;
    };
    let entries = match pairs(text) {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(endpointslice = object, "{WEIGHTS}: {e}; its weights are ignored");
            return out;
        }
    };
    for (address, weight) in entries {
        match (address.parse::<IpAddr>(), weight.parse::<u16>()) {
            (Ok(ip), Ok(w)) => {
                out.insert(ip, w);
            }
            (Err(_), _) => tracing::warn!(endpointslice = object, "{WEIGHTS}: {address:?} is not an IP address"),
            (_, Err(_)) => {
                tracing::warn!(endpointslice = object, "{WEIGHTS}: weight {weight:?} of {address} is not 0 to 65535")
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn scheduler_and_parameters() {
        let a = map(&[(SCHEDULER, "maglev"), (SCHEDULER_PARAMS, "table-size=31, seed=7")]);
        let s = scheduler(Some(&a), "ns/web").unwrap();
        assert_eq!(s.name, "maglev");
        assert_eq!(s.parameters, vec![("table-size".into(), "31".into()), ("seed".into(), "7".into())]);
        let bad = map(&[(SCHEDULER, "maglev"), (SCHEDULER_PARAMS, "table-size")]);
        assert_eq!(scheduler(Some(&bad), "ns/web"), None);
        assert_eq!(scheduler(Some(&map(&[(SCHEDULER, " ")])), "ns/web"), None);
        assert_eq!(scheduler(None, "ns/web"), None);
    }

    #[test]
    fn weights_by_address() {
        let a = map(&[(WEIGHTS, "10.0.0.1=3, 10.0.0.2=0,fd00::1=7,10.0.0.3=70000,nope=1")]);
        let w = weights(Some(&a), "ns/web-abc");
        assert_eq!(w.len(), 3);
        assert_eq!(w[&"10.0.0.1".parse::<IpAddr>().unwrap()], 3);
        assert_eq!(w[&"10.0.0.2".parse::<IpAddr>().unwrap()], 0);
        assert_eq!(w[&"fd00::1".parse::<IpAddr>().unwrap()], 7);
        assert!(weights(Some(&map(&[(WEIGHTS, "10.0.0.1")])), "x").is_empty());
    }
}
