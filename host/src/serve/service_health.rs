//! Health-check node ports: for each Service with `externalTrafficPolicy:
//! Local` and a `healthCheckNodePort`, an HTTP listener that tells load
//! balancers whether this node has a ready endpoint of it (upstream's
//! `ServiceHealthServer`: 200 with local endpoints and a healthy proxy,
//! else 503, and the same JSON body).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
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

/// Where the listeners bind: every address (one dual-stack socket, or
/// IPv4 alone where the node has no IPv6), or the node's addresses that
/// --nodeport-addresses selects.
#[derive(Debug, Clone)]
pub enum Bind {
    All,
    Addresses(Vec<IpAddr>),
}

fn bind(addresses: &Bind, port: u16) -> std::io::Result<Vec<tokio::net::TcpListener>> {
    let std_listen = |ip: IpAddr| -> std::io::Result<tokio::net::TcpListener> {
        let l = std::net::TcpListener::bind(SocketAddr::new(ip, port))?;
        l.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(l)
    };
    match addresses {
        Bind::All => match std_listen(IpAddr::V6(Ipv6Addr::UNSPECIFIED)) {
            Ok(l) => Ok(vec![l]),
            Err(_) => Ok(vec![std_listen(IpAddr::V4(Ipv4Addr::UNSPECIFIED))?]),
        },
        Bind::Addresses(ips) => ips.iter().map(|ip| std_listen(*ip)).collect(),
    }
}

/// Keeps one listener set per Service as `checks` changes.
pub async fn run(telemetry: Arc<Telemetry>, mut checks: watch::Receiver<Checks>, addresses: Bind) {
    let mut open: BTreeMap<ServiceName, (u16, watch::Sender<bool>)> = BTreeMap::new();
    loop {
        let desired = checks.borrow_and_update().clone();
        open.retain(|name, (port, stop)| {
            let keep = desired.get(name).is_some_and(|(p, _)| p == port);
            if !keep {
                tracing::info!(service = %name, port = *port, "closing health check");
                let _ = stop.send(true);
            }
            keep
        });
        for (name, (port, _)) in &desired {
            if open.contains_key(name) {
                continue;
            }
            match bind(&addresses, *port) {
                Ok(listeners) => {
                    tracing::info!(service = %name, port = *port, "opening health check");
                    let (stop, stopped) = watch::channel(false);
                    for l in listeners {
                        let (t, c, n) = (telemetry.clone(), checks.clone(), name.clone());
                        let handler: http::Handler = Arc::new(move |_path: &str| {
                            let count = c.borrow().get(&n).map_or(0, |(_, e)| *e);
                            let healthy = t.health.is_healthy(Stamp::now());
                            let status = if count > 0 && healthy { 200 } else { 503 };
                            Answer::json(status, body(&n, count, healthy))
                        });
                        tokio::spawn(http::serve(l, handler, stopped.clone()));
                    }
                    open.insert(name.clone(), (*port, stop));
                }
                // Retried on the next change, as upstream does.
                Err(e) => tracing::error!(service = %name, port = *port, "cannot open the health check: {e}"),
            }
        }
        if checks.changed().await.is_err() {
            return;
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
