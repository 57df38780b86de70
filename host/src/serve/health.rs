//! The proxy's health, as upstream's `ProxyHealthServer` keeps it: a
//! family is unhealthy when a change has waited for its rules longer than
//! the health timeout (2 × the sync period); `/healthz` also fails while
//! the Node is being deleted or carries the cluster autoscaler's
//! `ToBeDeletedByClusterAutoscaler` taint, and (kpx) until every family
//! has programmed its first full sync after the initial lists.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Node;
use kpx_rules::model::IpFamily;

/// The autoscaler's taint on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// A point in time as both clocks saw it (Go prints both).
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
    node_eligible: bool,
}

#[derive(Debug)]
pub struct ProxyHealth {
    timeout: Duration,
    families: Vec<IpFamily>,
    /// Go's monotonic readings count from the process's start.
    started: Instant,
    inner: Mutex<Inner>,
}

impl ProxyHealth {
    pub fn new(timeout: Duration, families: Vec<IpFamily>) -> ProxyHealth {
        ProxyHealth {
            timeout,
            families,
            started: Instant::now(),
            inner: Mutex::new(Inner {
                last_updated: BTreeMap::new(),
                oldest_pending: BTreeMap::new(),
                node_eligible: true,
            }),
        }
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
        self.inner.lock().expect("health lock").node_eligible = !deleting && !tainted;
    }

    pub fn node_eligible(&self) -> bool {
        self.inner.lock().expect("health lock").node_eligible
    }

    /// Upstream's `isHealthy`: (healthy, the last update time it reports).
    fn health(&self, now: Stamp) -> (bool, Option<Stamp>) {
        let inner = self.inner.lock().expect("health lock");
        let mut last: Option<Stamp> = None;
        for (family, updated) in &inner.last_updated {
            if last.is_none_or(|l| updated.wall > l.wall) {
                last = Some(*updated);
            }
            match inner.oldest_pending.get(family) {
                Some(pending) if now.mono.saturating_duration_since(pending.mono) >= self.timeout => {
                    return (false, Some(*updated));
                }
                _ => {}
            }
        }
        // A family that never synced, with a change waiting too long.
        for (family, pending) in &inner.oldest_pending {
            if !inner.last_updated.contains_key(family)
                && now.mono.saturating_duration_since(pending.mono) >= self.timeout
            {
                return (false, last);
            }
        }
        (true, last)
    }

    /// Whether the rules are up to date (what health-check node ports
    /// report as `serviceProxyHealthy`).
    pub fn is_healthy(&self, now: Stamp) -> bool {
        self.health(now).0
    }

    /// Every family has programmed its first sync.
    pub fn ready(&self) -> bool {
        let inner = self.inner.lock().expect("health lock");
        self.families.iter().all(|f| inner.last_updated.contains_key(f))
    }

    /// `/healthz`: status and upstream's body.
    pub fn healthz(&self, now: Stamp) -> (u16, String) {
        let eligible = self.node_eligible();
        let (healthy, last) = self.health(now);
        let healthy = healthy && eligible && self.ready();
        let last = if healthy { Some(now) } else { last };
        let body = format!(
            "{{\"lastUpdated\": {:?},\"currentTime\": {:?}, \"nodeEligible\": {eligible}}}",
            self.go_time(last),
            self.go_time(Some(now))
        );
        (if healthy { 200 } else { 503 }, body)
    }

    /// `/livez`: as /healthz without the node's state (and without the
    /// first-sync wait: a proxy still reading its initial lists is alive).
    pub fn livez(&self, now: Stamp) -> (u16, String) {
        let (healthy, last) = self.health(now);
        let last = if healthy { Some(now) } else { last };
        let body =
            format!("{{\"lastUpdated\": {:?},\"currentTime\": {:?}}}", self.go_time(last), self.go_time(Some(now)));
        (if healthy { 200 } else { 503 }, body)
    }

    /// Go's `time.Time.String()` of a reading taken by `time.Now()`.
    fn go_time(&self, t: Option<Stamp>) -> String {
        match t {
            None => "0001-01-01 00:00:00 +0000 UTC".into(),
            Some(t) => {
                let mono = t.mono.saturating_duration_since(self.started);
                format!("{} m=+{}.{:09}", go_wall(t.wall), mono.as_secs(), mono.subsec_nanos())
            }
        }
    }
}

/// `2006-01-02 15:04:05.999999999 -0700 MST` in UTC (trailing zeros of the
/// fraction dropped, as Go does).
pub fn go_wall(t: SystemTime) -> String {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let mut out = format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60);
    let nanos = since.subsec_nanos();
    if nanos != 0 {
        let frac = format!("{nanos:09}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push_str(" +0000 UTC");
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

    #[test]
    fn go_time_format() {
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_795_456_740, 120_000_000);
        assert_eq!(go_wall(t), "2026-11-23 17:59:00.12 +0000 UTC");
        assert_eq!(go_wall(SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29 00:00:00 +0000 UTC");
    }

    #[test]
    fn unhealthy_when_a_change_waits_past_the_timeout() {
        let h = ProxyHealth::new(Duration::from_secs(60), vec![IpFamily::V4]);
        let t0 = Stamp::now();
        assert_eq!(h.healthz(t0).0, 503, "not ready before the first sync");
        assert_eq!(h.livez(t0).0, 200, "alive while starting");
        h.queued(IpFamily::V4, t0);
        assert_eq!(h.livez(at(t0, 59)).0, 200);
        assert_eq!(h.livez(at(t0, 61)).0, 503, "first sync overdue");
        h.updated(IpFamily::V4, at(t0, 61));
        let (code, body) = h.healthz(at(t0, 62));
        assert_eq!(code, 200, "{body}");
        assert!(body.starts_with("{\"lastUpdated\": \"") && body.ends_with("\", \"nodeEligible\": true}"), "{body}");
        h.queued(IpFamily::V4, at(t0, 100));
        h.queued(IpFamily::V4, at(t0, 150));
        assert_eq!(h.healthz(at(t0, 159)).0, 200, "the oldest pending change counts");
        assert_eq!(h.healthz(at(t0, 160)).0, 503);
        let (_, body) = h.livez(at(t0, 160));
        assert!(body.contains(&go_wall(at(t0, 61).wall)), "unhealthy: reports the last update: {body}");
        h.updated(IpFamily::V4, at(t0, 161));
        assert_eq!(h.healthz(at(t0, 162)).0, 200);
    }

    #[test]
    fn a_node_being_deleted_fails_healthz_only() {
        let h = ProxyHealth::new(Duration::from_secs(60), vec![IpFamily::V4]);
        let t0 = Stamp::now();
        h.updated(IpFamily::V4, t0);
        let tainted: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"taints": [{"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}]}
        }))
        .unwrap();
        h.sync_node(&tainted);
        let (code, body) = h.healthz(t0);
        assert_eq!(code, 503);
        assert!(body.ends_with("\"nodeEligible\": false}"), "{body}");
        assert_eq!(h.livez(t0).0, 200);
        let deleting: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "deletionTimestamp": "2026-11-23T00:00:00Z"}
        }))
        .unwrap();
        h.sync_node(&deleting);
        assert_eq!(h.healthz(t0).0, 503);
        h.sync_node(&Node::default());
        assert_eq!(h.healthz(t0).0, 200);
    }
}
