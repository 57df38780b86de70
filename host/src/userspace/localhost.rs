//! nftables mode's localhost node ports (KEP-6032, v1.37; the
//! `KubeProxyNFTablesLocalhostNodePorts` gate, beta and on in v1.38):
//! when --nodeport-addresses names loopback (`localhost`, or a CIDR such as
//! 127.0.0.1/32 or ::1/128), kpx listens on 127.0.0.1 (IPv4) or ::1 (IPv6)
//! at each TCP node port whose Service has endpoints, and relays each
//! connection as userspace mode does. nftables cannot DNAT a packet to
//! loopback out to a pod, and IPv6 has no route_localnet, so a relay is
//! upstream's way too. As upstream's: the endpoints are those of the
//! external traffic policy (a Local policy's local ones), a Service without
//! them gets no listener (a connection is refused), UDP and SCTP are not
//! relayed (the host's rules refuse them: `kernel::nftables::frame`). Unlike
//! upstream's random pick, the relay follows the Service's scheduler, as
//! userspace mode does.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use kpx_rules::model::{IpFamily, Protocol, ServicePort, TrafficPolicy};

use super::Relays;
use super::balancer::{Balancer, Picker, Side, SideChooser};
use super::listeners::{self, Listener};
use crate::state::{Changes, State};

struct Served {
    port: ServicePort,
    balancer: Arc<Balancer>,
    listener: Option<Listener>,
    /// A failure to listen was logged (once, until it listens).
    failed: bool,
}

/// One family's localhost node ports.
pub struct LocalhostNodePorts {
    family: IpFamily,
    relays: Relays,
    picker: Arc<Picker>,
    served: BTreeMap<String, Served>,
    /// Listeners that could not be opened, since the last
    /// [`LocalhostNodePorts::take_failures`].
    failures: u64,
}

/// Whether the relay has endpoints to send a port's connections to.
fn has_endpoints(port: &ServicePort) -> bool {
    match port.external_traffic_policy {
        TrafficPolicy::Local => !port.local_endpoints.is_empty(),
        TrafficPolicy::Cluster => !port.cluster_endpoints.is_empty(),
    }
}

impl LocalhostNodePorts {
    pub fn new(family: IpFamily, relays: Relays, picker: Arc<Picker>) -> LocalhostNodePorts {
        LocalhostNodePorts { family, relays, picker, served: BTreeMap::new(), failures: 0 }
    }

    /// The scheduler components its relays ask.
    pub fn picker(&self) -> &Arc<Picker> {
        &self.picker
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// The loopback address it listens on.
    fn address(&self) -> IpAddr {
        match self.family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpFamily::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
        }
    }

    /// Node ports listened on now.
    pub fn listening(&self) -> usize {
        self.served.values().filter(|s| s.listener.is_some()).count()
    }

    /// Listeners that could not be opened since the last call.
    pub fn take_failures(&mut self) -> u64 {
        std::mem::take(&mut self.failures)
    }

    /// (service port, scheduler name) of every port served that names one.
    pub fn scheduler_users(&self) -> Vec<(String, String)> {
        super::scheduler_users(self.served.values().map(|s| &s.port))
    }

    /// Follows the changed Services (every Service on a full sync); a
    /// port that cannot be taken (something else listens there) is
    /// logged, counted and tried again at the next sync.
    pub fn sync(&mut self, state: &State, changes: &Changes, full: bool) {
        let names: Vec<crate::state::ServiceName> =
            if full { state.service_names().cloned().collect() } else { changes.services.keys().cloned().collect() };
        let prefixes: Vec<String> = names.iter().map(|n| format!("{}/{}", n.namespace, n.name)).collect();
        let mut wanted: BTreeMap<String, ServicePort> = BTreeMap::new();
        for name in &names {
            for port in state.service_ports(self.family, name) {
                if port.protocol == Protocol::Tcp && port.node_port != 0 && has_endpoints(&port) {
                    wanted.insert(port.key.clone(), port);
                }
            }
        }
        // Ports of the Services looked at that are gone or have no
        // endpoints left (all others, on a full sync): their listeners
        // close, and connections to them are refused.
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
                    self.served.insert(key, Served { port, balancer, listener: None, failed: false });
                }
            }
        }
        let address = self.address();
        for s in self.served.values_mut().filter(|s| s.listener.is_none()) {
            let at = SocketAddr::new(address, s.port.node_port);
            let chooser = Arc::new(SideChooser { balancer: Arc::clone(&s.balancer), side: Side::External });
            match listeners::open_at(&self.relays, at, chooser) {
                Ok(l) => {
                    s.listener = Some(l);
                    s.failed = false;
                }
                Err(e) => {
                    self.failures += 1;
                    if !s.failed {
                        tracing::error!(service = %s.port.key, "cannot serve the localhost node port on {at}: {e}");
                        s.failed = true;
                    }
                }
            }
        }
    }
}

/// `namespace/name` of a service port key (`namespace/name:port`).
fn key_of(key: &str) -> &str {
    key.split_once(':').map_or(key, |(service, _)| service)
}
