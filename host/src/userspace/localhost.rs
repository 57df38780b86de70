//! `--localhost-nodeports-proxy` (nftables mode): node ports answered on
//! 127.0.0.1 by kpx's TCP relay. nftables cannot DNAT a packet to
//! 127.0.0.1 out to a pod (upstream's nftables mode has no localhost node
//! ports, and its node-port rules leave loopback alone), so kpx listens
//! on 127.0.0.1:NODEPORT itself and relays each connection as userspace
//! mode does. It is the node's own traffic: under a Local external
//! policy it goes to the cluster endpoints, as upstream short-circuits
//! the node's traffic. TCP only.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use kpx_rules::model::{IpFamily, Protocol, ServicePort};

use super::Relays;
use super::balancer::{Balancer, Picker, Side, SideChooser};
use super::listeners::{self, Listener};
use crate::state::{Changes, State};

struct Served {
    port: ServicePort,
    balancer: Arc<Balancer>,
    listener: Option<Listener>,
}

pub struct LocalhostNodePorts {
    relays: Relays,
    picker: Arc<Picker>,
    served: BTreeMap<String, Served>,
}

impl LocalhostNodePorts {
    pub fn new(relays: Relays, picker: Arc<Picker>) -> LocalhostNodePorts {
        LocalhostNodePorts { relays, picker, served: BTreeMap::new() }
    }

    /// The scheduler components its relays ask.
    pub fn picker(&self) -> &Arc<Picker> {
        &self.picker
    }

    /// (service port, scheduler name) of every port served that names one.
    pub fn scheduler_users(&self) -> Vec<(String, String)> {
        super::scheduler_users(self.served.values().map(|s| &s.port))
    }

    /// Follows the changed Services (every Service on a full sync); a
    /// port that cannot be taken (something else listens there) is
    /// logged and tried again at the next sync.
    pub fn sync(&mut self, state: &State, changes: &Changes, full: bool) {
        let names: Vec<crate::state::ServiceName> =
            if full { state.service_names().cloned().collect() } else { changes.services.keys().cloned().collect() };
        let prefixes: Vec<String> = names.iter().map(|n| format!("{}/{}", n.namespace, n.name)).collect();
        let mut wanted: BTreeMap<String, ServicePort> = BTreeMap::new();
        for name in &names {
            for port in state.service_ports(IpFamily::V4, name) {
                if port.protocol == Protocol::Tcp && port.node_port != 0 {
                    wanted.insert(port.key.clone(), port);
                }
            }
        }
        // Ports of the Services looked at that are gone (all others, on a
        // full sync).
        let stale: Vec<String> = self
            .served
            .keys()
            .filter(|k| !wanted.contains_key(*k) && (full || prefixes.iter().any(|p| key_of(k) == p)))
            .cloned()
            .collect();
        for key in stale {
            self.served.remove(&key);
        }
        for (key, port) in wanted {
            match self.served.get_mut(&key) {
                Some(s) if s.port.node_port == port.node_port => {
                    if s.port != port {
                        s.balancer.update(&port);
                        s.port = port;
                    }
                }
                _ => {
                    let balancer = Arc::new(Balancer::new(&port, Arc::clone(&self.picker)));
                    // The old listener goes before the new one takes its port.
                    self.served.remove(&key);
                    self.served.insert(key, Served { port, balancer, listener: None });
                }
            }
        }
        for s in self.served.values_mut().filter(|s| s.listener.is_none()) {
            let at = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), s.port.node_port);
            let chooser = Arc::new(SideChooser { balancer: Arc::clone(&s.balancer), side: Side::Cluster });
            match listeners::open_at(&self.relays, at, chooser) {
                Ok(l) => s.listener = Some(l),
                Err(e) => tracing::error!(service = %s.port.key, "cannot serve the node port on {at}: {e}"),
            }
        }
    }
}

/// `namespace/name` of a service port key (`namespace/name:port`).
fn key_of(key: &str) -> &str {
    key.split_once(':').map_or(key, |(service, _)| service)
}
