//! The proxy's health, as upstream's `ProxyHealthServer` keeps it
//! (pkg/proxy/healthcheck/proxy_health.go at 81810de6): a family is
//! unhealthy when a change has waited for its rules longer than the health
//! timeout (2 × the sync period); a family that has not synced yet is
//! healthy ("while it's starting up"). `/healthz` also fails while the Node
//! is unknown, being deleted or carries the cluster autoscaler's
//! `ToBeDeletedByClusterAutoscaler` taint. The bodies are upstream's JSON
//! (`ProxyHealth`, times in RFC 3339 with nanoseconds).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Node;
use kpx_rules::model::IpFamily;

/// The autoscaler's taint on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// A point in time on the wall clock and the monotonic one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub wall: SystemTime,
    pub mono: Instant,
}

impl Stamp {
    pub fn now() -> Stamp {
        Stamp { wall: SystemTime::now(), mono: Instant::now() }
    }
}

#[derive(Debug)]
struct Inner {
    last_updated: BTreeMap<IpFamily, Stamp>,
    oldest_pending: BTreeMap<IpFamily, Stamp>,
    /// None until the Node is seen (upstream: not eligible then).
    node_eligible: Option<bool>,
}

#[derive(Debug)]
pub struct ProxyHealth {
    timeout: Duration,
    /// Whether an unknown Node makes /healthz fail: upstream's (its
    /// node manager waits for the Node before the proxy starts), and kpx's
    /// with the API. A `--manifests` source may hold no Node at all: then
    /// the node is eligible until a Node document says otherwise.
    node_required: bool,
    inner: Mutex<Inner>,
}

/// upstream's `ProxyHealth` as a probe reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Health {
    healthy: bool,
    last_updated: Option<SystemTime>,
    /// (family, last update, healthy) of each family that synced.
    status: Vec<(IpFamily, SystemTime, bool)>,
}

impl ProxyHealth {
    /// The families are those kpx proxies (kept for the caller's sake:
    /// upstream's health knows a family once it has synced).
    pub fn new(timeout: Duration, _families: Vec<IpFamily>) -> ProxyHealth {
        ProxyHealth {
            timeout,
            node_required: true,
            inner: Mutex::new(Inner {
                last_updated: BTreeMap::new(),
                oldest_pending: BTreeMap::new(),
                node_eligible: None,
            }),
        }
    }

    /// An unknown Node does not fail /healthz (a `--manifests` source).
    pub fn node_optional(mut self) -> ProxyHealth {
        self.node_required = false;
        self
    }

    /// The Node is gone (deleted, or left out of the manifests).
    pub fn forget_node(&self) {
        self.inner.lock().expect("health lock").node_eligible = None;
    }

    /// A change for `family` waits to be programmed (the oldest one counts).
    pub fn queued(&self, family: IpFamily, now: Stamp) {
        self.inner.lock().expect("health lock").oldest_pending.entry(family).or_insert(now);
    }

    /// `family`'s rules hold everything queued so far.
    pub fn updated(&self, family: IpFamily, now: Stamp) {
        let mut inner = self.inner.lock().expect("health lock");
        inner.oldest_pending.remove(&family);
        inner.last_updated.insert(family, now);
    }

    /// Eligible: not being deleted and not tainted for deletion.
    pub fn sync_node(&self, node: &Node) {
        let deleting = node.metadata.deletion_timestamp.is_some();
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
        self.inner.lock().expect("health lock").node_eligible = Some(!deleting && !tainted);
    }

    /// upstream's `NodeEligible`: known, not being deleted, not tainted
    /// (unknown counts as eligible where the Node is optional).
    pub fn node_eligible(&self) -> bool {
        self.inner.lock().expect("health lock").node_eligible.unwrap_or(!self.node_required)
    }

    /// upstream's `Health`.
    fn health(&self, now: Stamp) -> Health {
        let inner = self.inner.lock().expect("health lock");
        let mut out = Health { healthy: true, last_updated: None, status: Vec::new() };
        for (family, updated) in &inner.last_updated {
            if out.last_updated.is_none_or(|l| updated.wall > l) {
                out.last_updated = Some(updated.wall);
            }
            let late = inner
                .oldest_pending
                .get(family)
                .is_some_and(|pending| now.mono.saturating_duration_since(pending.mono) >= self.timeout);
            if late {
                out.healthy = false;
            }
            out.status.push((*family, updated.wall, !late));
        }
        out
    }

    /// Whether the rules are up to date (what health-check node ports
    /// report as `serviceProxyHealthy`).
    pub fn is_healthy(&self, now: Stamp) -> bool {
        self.health(now).healthy
    }

    /// `/healthz`: status and upstream's body.
    pub fn healthz(&self, now: Stamp) -> (u16, String) {
        let eligible = self.node_eligible();
        let health = self.health(now);
        let healthy = health.healthy && eligible;
        (if healthy { 200 } else { 503 }, body(&health, healthy, Some(eligible), now))
    }

    /// `/livez`: as /healthz without the node's state.
    pub fn livez(&self, now: Stamp) -> (u16, String) {
        let health = self.health(now);
        let healthy = health.healthy;
        (if healthy { 200 } else { 503 }, body(&health, healthy, None, now))
    }
}

/// upstream's `json.Marshal(ProxyHealth)`: lastUpdated (now when
/// healthy), currentTime, nodeEligible (/healthz only), healthy, and the
/// families' status (left out before any has synced).
fn body(h: &Health, healthy: bool, eligible: Option<bool>, now: Stamp) -> String {
    let last = if healthy { Some(now.wall) } else { h.last_updated };
    let mut out = format!("{{\"lastUpdated\":\"{}\",\"currentTime\":\"{}\"", rfc3339(last), rfc3339(Some(now.wall)));
    if let Some(e) = eligible {
        out.push_str(&format!(",\"nodeEligible\":{e}"));
    }
    out.push_str(&format!(",\"healthy\":{}", h.healthy));
    if !h.status.is_empty() {
        let families: Vec<String> = h
            .status
            .iter()
            .map(|(f, at, ok)| {
                let name = crate::serve::metrics::family_name(*f);
                format!("\"{name}\":{{\"lastUpdated\":\"{}\",\"healthy\":{ok}}}", rfc3339(Some(*at)))
            })
            .collect();
        out.push_str(&format!(",\"status\":{{{}}}", families.join(",")));
    }
    out.push('}');
    out
}

/// Go's RFC 3339 with nanoseconds (`time.RFC3339Nano`, as JSON writes a
/// `time.Time`) in UTC; the zero time when there is none.
pub fn rfc3339(t: Option<SystemTime>) -> String {
    let Some(t) = t else { return "0001-01-01T00:00:00Z".into() };
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let mut out = format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60);
    let nanos = since.subsec_nanos();
    if nanos != 0 {
        let frac = format!("{nanos:09}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Stamp, secs: u64) -> Stamp {
        Stamp { wall: base.wall + Duration::from_secs(secs), mono: base.mono + Duration::from_secs(secs) }
    }

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn rfc3339_as_go_writes_json_times() {
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_795_456_740, 120_000_000);
        assert_eq!(rfc3339(Some(t)), "2026-11-23T17:59:00.12Z");
        assert_eq!(rfc3339(Some(SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400))), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(None), "0001-01-01T00:00:00Z");
    }

    /// upstream's proxy_health.go at 81810de6: healthy while starting up
    /// (no family synced yet), unhealthy when a synced family's oldest
    /// change waited past the timeout; the body is its ProxyHealth JSON.
    #[test]
    fn unhealthy_when_a_change_waits_past_the_timeout() {
        let h = ProxyHealth::new(Duration::from_secs(60), vec![IpFamily::V4]);
        let t0 = Stamp::now();
        assert_eq!(h.healthz(t0).0, 503, "the Node is not known yet");
        h.sync_node(&node(serde_json::json!({"metadata": {"name": "n"}})));
        let (code, body) = h.healthz(t0);
        assert_eq!(code, 200, "healthy while starting up: {body}");
        assert_eq!(
            body,
            format!(
                "{{\"lastUpdated\":\"{0}\",\"currentTime\":\"{0}\",\"nodeEligible\":true,\"healthy\":true}}",
                rfc3339(Some(t0.wall))
            )
        );
        h.queued(IpFamily::V4, t0);
        assert_eq!(h.livez(at(t0, 61)).0, 200, "a family that never synced is starting up");
        h.updated(IpFamily::V4, at(t0, 61));
        let (code, body) = h.healthz(at(t0, 62));
        assert_eq!(code, 200, "{body}");
        let synced = rfc3339(Some(at(t0, 61).wall));
        assert!(
            body.ends_with(&format!(
                ",\"healthy\":true,\"status\":{{\"IPv4\":{{\"lastUpdated\":\"{synced}\",\"healthy\":true}}}}}}"
            )),
            "{body}"
        );
        h.queued(IpFamily::V4, at(t0, 100));
        h.queued(IpFamily::V4, at(t0, 150));
        assert_eq!(h.healthz(at(t0, 159)).0, 200, "the oldest pending change counts");
        assert_eq!(h.healthz(at(t0, 160)).0, 503);
        let (_, body) = h.livez(at(t0, 160));
        assert!(
            body.starts_with(&format!("{{\"lastUpdated\":\"{synced}\"")),
            "unhealthy: reports the last update: {body}"
        );
        assert!(!body.contains("nodeEligible"), "{body}");
        assert!(body.contains("\"IPv4\":{\"lastUpdated\"") && body.contains("\"healthy\":false}"), "{body}");
        h.updated(IpFamily::V4, at(t0, 161));
        assert_eq!(h.healthz(at(t0, 162)).0, 200);
    }

    #[test]
    fn a_node_being_deleted_fails_healthz_only() {
        let h = ProxyHealth::new(Duration::from_secs(60), vec![IpFamily::V4]);
        let t0 = Stamp::now();
        h.updated(IpFamily::V4, t0);
        h.sync_node(&node(serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"taints": [{"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}]}
        })));
        let (code, body) = h.healthz(t0);
        assert_eq!(code, 503);
        assert!(body.contains("\"nodeEligible\":false,\"healthy\":true"), "{body}");
        assert_eq!(h.livez(t0).0, 200);
        h.sync_node(&node(serde_json::json!({"metadata": {"name": "n", "deletionTimestamp": "2026-11-23T00:00:00Z"}})));
        assert_eq!(h.healthz(t0).0, 503);
        h.sync_node(&Node::default());
        assert_eq!(h.healthz(t0).0, 200);
        // A Node deleted outright: unknown again, so not eligible.
        h.forget_node();
        assert_eq!(h.healthz(t0).0, 503);
    }

    /// A `--manifests` source may hold no Node: eligible until a Node
    /// document says otherwise (and again once it is gone).
    #[test]
    fn without_a_required_node_an_unknown_one_is_eligible() {
        let h = ProxyHealth::new(Duration::from_secs(60), vec![IpFamily::V4]).node_optional();
        let t0 = Stamp::now();
        h.updated(IpFamily::V4, t0);
        assert_eq!(h.healthz(t0).0, 200);
        h.sync_node(&node(serde_json::json!({"metadata": {"name": "n", "deletionTimestamp": "2026-11-23T00:00:00Z"}})));
        assert_eq!(h.healthz(t0).0, 503);
        h.forget_node();
        assert_eq!(h.healthz(t0).0, 200);
    }
}
