//! userspace mode for one IP family: a listener per side of each service
//! port (its cluster IP; its node port, external IPs and load-balancer
//! IPs when it has any), a balancer per service port holding its
//! endpoints, and the host's REDIRECT rules, rewritten whole at each sync
//! (a few rules per service port). New listeners are opened before the
//! rules that send traffic to them, old ones closed after the rules that
//! did are gone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kpx_rules::model::{IpFamily, Protocol, ServicePort};
use kpx_rules::ops::iptables::Table;

use super::balancer::{Balancer, Picker, Side, SideChooser};
use super::listeners::{self, Listener};
use super::rules::{self, NodePorts, Portal};
use crate::config::Config;
use crate::kernel::iptables::IptablesKernel;
use crate::kernel::iptables::render::{Dialect, payload};
use crate::kernel::{SyncError, interfaces};
use crate::state::{Changes, ServiceName, State};
use crate::sync::family::{Error, Report};

struct Served {
    port: ServicePort,
    balancer: Arc<Balancer>,
    internal: Option<Listener>,
    external: Option<Listener>,
}

impl Served {
    fn wants(&self, side: Side) -> bool {
        let p = &self.port;
        match side {
            Side::Internal => p.cluster_ip.is_some(),
            Side::External => p.node_port != 0 || !p.external_ips.is_empty() || !p.load_balancer_ips.is_empty(),
        }
    }
}

pub struct UserspaceProxier {
    family: IpFamily,
    config: Arc<Config>,
    runtime: tokio::runtime::Handle,
    picker: Arc<Picker>,
    kernel: IptablesKernel,
    served: BTreeMap<String, Served>,
    keys_of: BTreeMap<ServiceName, Vec<String>>,
    /// --nodeport-addresses: the node's addresses it selects (read on
    /// full syncs).
    nodeport_addresses: Vec<IpAddr>,
    /// SCTP service ports already logged as not served.
    sctp: BTreeSet<String>,
    need_full: bool,
}

impl UserspaceProxier {
    pub fn new(
        config: Arc<Config>,
        family: IpFamily,
        runtime: tokio::runtime::Handle,
        picker: Arc<Picker>,
        kernel: IptablesKernel,
    ) -> UserspaceProxier {
        UserspaceProxier {
            family,
            config,
            runtime,
            picker,
            kernel,
            served: BTreeMap::new(),
            keys_of: BTreeMap::new(),
            nodeport_addresses: Vec::new(),
            sctp: BTreeSet::new(),
            need_full: true,
        }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// The balancer of a service port (tests, metrics).
    pub fn balancer(&self, key: &str) -> Option<Arc<Balancer>> {
        self.served.get(key).map(|s| Arc::clone(&s.balancer))
    }

    /// Brings one Service's ports up to date; the keys no longer there are
    /// returned (closed after the rules stop sending traffic to them).
    fn update_service(&mut self, state: &State, name: &ServiceName, gone: &mut Vec<Served>) -> usize {
        let ports: Vec<ServicePort> = state
            .service_ports(self.family, name)
            .into_iter()
            .filter(|p| {
                if p.protocol == Protocol::Sctp {
                    if self.sctp.insert(p.key.clone()) {
                        tracing::warn!(service = %p.key, family = %self.family, "userspace mode relays TCP and UDP; this SCTP port is not served");
                    }
                    return false;
                }
                true
            })
            .collect();
        let mut changed = 0;
        for key in self.keys_of.remove(name).unwrap_or_default() {
            if !ports.iter().any(|p| p.key == key)
                && let Some(served) = self.served.remove(&key)
            {
                gone.push(served);
                changed += 1;
            }
        }
        if !ports.is_empty() {
            self.keys_of.insert(name.clone(), ports.iter().map(|p| p.key.clone()).collect());
        }
        for port in ports {
            match self.served.get_mut(&port.key) {
                Some(s) if s.port.protocol == port.protocol => {
                    if s.port != port {
                        s.balancer.update(&port);
                        s.port = port;
                        changed += 1;
                    }
                }
                _ => {
                    let balancer = Arc::new(Balancer::new(&port, Arc::clone(&self.picker)));
                    let served = Served { port, balancer, internal: None, external: None };
                    if let Some(old) = self.served.insert(served.port.key.clone(), served) {
                        gone.push(old);
                    }
                    changed += 1;
                }
            }
        }
        changed
    }

    /// Opens the listeners every served port needs and lacks (a port
    /// whose listener cannot be opened is logged and tried again at the
    /// next sync; its traffic is not redirected meanwhile), and closes
    /// those it no longer needs.
    fn open_listeners(&mut self) {
        let range = self.config.userspace.port_range;
        let udp_timeout = self.config.userspace.udp_timeout;
        for served in self.served.values_mut() {
            for side in [Side::Internal, Side::External] {
                let wanted = served.wants(side);
                let slot = match side {
                    Side::Internal => &mut served.internal,
                    Side::External => &mut served.external,
                };
                if !wanted {
                    *slot = None;
                    continue;
                }
                if slot.is_some() {
                    continue;
                }
                let chooser = Arc::new(SideChooser { balancer: Arc::clone(&served.balancer), side });
                match listeners::open(&self.runtime, self.family, served.port.protocol, range, chooser, udp_timeout) {
                    Ok(listener) => *slot = Some(listener),
                    Err(e) => {
                        tracing::error!(service = %served.port.key, family = %self.family, "cannot open a listener: {e}")
                    }
                }
            }
        }
    }

    fn nodeports(&self) -> NodePorts<'_> {
        if self.config.nodeport_addresses.match_all() {
            NodePorts::All
        } else {
            NodePorts::Only(&self.nodeport_addresses)
        }
    }

    /// One sync: the changed Services (every Service on a full one), the
    /// listeners they need, and the rules, written whole.
    pub fn sync(&mut self, state: &State, changes: &Changes, full: bool) -> Result<Report, Error> {
        let full = full || self.need_full;
        let t = Instant::now();
        let mut gone = Vec::new();
        let mut changed = 0;
        if full {
            let names: Vec<ServiceName> = state
                .service_names()
                .cloned()
                .chain(self.keys_of.keys().cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            for name in &names {
                changed += self.update_service(state, name, &mut gone);
            }
            if !self.config.nodeport_addresses.match_all() {
                match interfaces::local_addresses() {
                    Ok(all) => {
                        self.nodeport_addresses = all
                            .into_iter()
                            .filter(|ip| IpFamily::of(ip) == self.family)
                            .filter(|ip| self.config.nodeport_addresses.cidrs.iter().any(|c| c.contains(ip)))
                            .collect()
                    }
                    Err(e) => tracing::error!(family = %self.family, "cannot read the node's addresses: {e}"),
                }
            }
        } else {
            for name in changes.services.keys() {
                changed += self.update_service(state, name, &mut gone);
            }
        }
        self.open_listeners();
        let portals: Vec<Portal> = self
            .served
            .values()
            .map(|s| {
                let listening = |side: Side, l: &Option<Listener>| {
                    l.as_ref().filter(|_| s.balancer.has_candidates(side)).map(|l| l.port)
                };
                Portal {
                    port: &s.port,
                    internal: listening(Side::Internal, &s.internal),
                    external: listening(Side::External, &s.external),
                }
            })
            .collect();
        let frame = rules::frame(&portals, &self.nodeports());
        let d = Dialect { family: self.family, masquerade_mark: 1 << self.config.masquerade_bit };
        let text = payload(&frame, &Default::default(), &[], d);
        let write = || -> crate::kernel::Result<()> {
            if full {
                self.kernel.ensure_jumps(&frame.jumps, d)?;
            }
            self.kernel.apply(&text)
        };
        if let Err(e) = write() {
            self.need_full = true;
            return Err(Error::Sync { family: self.family, source: SyncError::Kernel(e) });
        }
        // The rules no longer send anything to these.
        drop(gone);
        self.need_full = false;
        let nat = frame.rules.iter().filter(|r| r.table == Table::Nat).count();
        Ok(Report {
            full,
            changes: changed,
            bytes: text.len(),
            plugin: Duration::ZERO,
            write: t.elapsed(),
            iptables_rules: Some((frame.rules.len() - nat, nat)),
        })
    }
}
