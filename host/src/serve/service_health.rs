//! Health-check node ports: for each Service with `externalTrafficPolicy:
//! Local` and a `healthCheckNodePort`, an HTTP listener that tells load
//! balancers whether this node has a ready endpoint of it (upstream's
//! `ServiceHealthServer`: 200 with local endpoints and a healthy proxy,
//! else 503, and the same JSON body).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::sync::watch;

use super::Telemetry;
use super::health::Stamp;
use super::http::{self, Answer};
use crate::state::ServiceName;

/// Each Service's health-check node port and its local ready endpoints
/// (distinct addresses, as upstream counts them).
pub type Checks = BTreeMap<ServiceName, (u16, usize)>;

/// Upstream's body (Go's dedented template, tabs and all).
pub fn body(name: &ServiceName, endpoints: usize, healthy: bool) -> String {
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {endpoints},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
        name.namespace, name.name
    )
}

/// Where the listeners bind: every address (one dual-stack socket, as Go
/// binds 0.0.0.0, or IPv4 alone where the node has no IPv6), or the node's
/// addresses that --nodeport-addresses selects.
#[derive(Debug, Clone)]
pub enum Bind {
    All,
    Addresses(Vec<IpAddr>),
}

fn bind(addresses: &Bind, port: u16) -> std::io::Result<Vec<tokio::net::TcpListener>> {
    let listen = |ip: IpAddr| tokio::net::TcpListener::from_std(http::bind(SocketAddr::new(ip, port))?);
    match addresses {
        Bind::All => Ok(vec![listen(IpAddr::V4(Ipv4Addr::UNSPECIFIED))?]),
        Bind::Addresses(ips) => ips.iter().map(|ip| listen(*ip)).collect(),
    }
}

/// How often a health check that could not open is tried again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// One Service's open listeners.
struct Open {
    port: u16,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Open {
    /// Closes the listeners, and returns once their sockets are gone (so
    /// that another Service can take the port in the same pass).
    async fn close(self) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Keeps one listener set per Service as `checks` changes; one that could
/// not open is tried again every [`RETRY`].
pub async fn run(telemetry: Arc<Telemetry>, mut checks: watch::Receiver<Checks>, addresses: Bind) {
    let mut open: BTreeMap<ServiceName, Open> = BTreeMap::new();
    let (_keep, never) = watch::channel(false);
    loop {
        let desired = checks.borrow_and_update().clone();
        let stale: Vec<ServiceName> = open
            .iter()
            .filter(|(name, o)| desired.get(*name).is_none_or(|(p, _)| *p != o.port))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            let o = open.remove(&name).expect("listed");
            tracing::info!(service = %name, port = o.port, "closing health check");
            o.close().await;
        }
        let mut failed = false;
        for (name, (port, _)) in &desired {
            if open.contains_key(name) {
                continue;
            }
            match bind(&addresses, *port) {
                Ok(listeners) => {
                    tracing::info!(service = %name, port = *port, "opening health check");
                    let mut tasks = Vec::new();
                    for l in listeners {
                        let (t, c, n) = (telemetry.clone(), checks.clone(), name.clone());
                        let handler: http::Handler = Arc::new(move |_asked: &http::Asked| {
                            let count = c.borrow().get(&n).map_or(0, |(_, e)| *e);
                            let healthy = t.health.is_healthy(Stamp::now());
                            let status = if count > 0 && healthy { 200 } else { 503 };
                            Answer::json(status, body(&n, count, healthy))
                        });
                        tasks.push(tokio::spawn(http::serve(l, handler, never.clone())));
                    }
                    open.insert(name.clone(), Open { port: *port, tasks });
                }
                Err(e) => {
                    failed = true;
                    tracing::error!(service = %name, port = *port, "cannot open the health check, retrying in {RETRY:?}: {e}");
                }
            }
        }
        tokio::select! {
            changed = checks.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RETRY), if failed => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_body() {
        let name = ServiceName { namespace: "ns".into(), name: "web".into() };
        assert_eq!(
            body(&name, 2, true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }
}
