//! userspace mode for one IP family: a listener per side of each service
//! port (its cluster IP; its node port, external IPs and load-balancer
//! IPs when it has any), a balancer per service port holding its
//! endpoints, and the host's REDIRECT/DNAT rules, rewritten whole at each sync
//! (a few rules per service port). New listeners are opened before the
//! rules that send traffic to them, old ones closed after the rules that
//! did are gone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kpx_rules::model::{IpFamily, Node, Protocol, ServicePort, Settings, TrafficPolicy};
use kpx_rules::ops::iptables::Table;

use super::Relays;
use super::balancer::{Balancer, Picker, Side, SideChooser};
use super::listeners::{self, Listener};
use super::rules::{self, Portal};
use crate::config::Config;
use crate::family::{Error, Report};
use crate::kernel::iptables::IptablesKernel;
use crate::kernel::iptables::render::payload;
use crate::kernel::{SyncError, interfaces};
use crate::settings;
use crate::state::{Changes, ServiceName, State};
use crate::syntax::iptables::Dialect;

struct Served {
    port: ServicePort,
    balancer: Arc<Balancer>,
    /// A listener per side (`Side::ALL`'s order).
    listeners: [Option<Listener>; 3],
}

impl Served {
    fn wants(&self, side: Side) -> bool {
        let p = &self.port;
        let external = p.node_port != 0 || !p.external_ips.is_empty() || !p.load_balancer_ips.is_empty();
        match side {
            Side::Internal => p.cluster_ip.is_some(),
            Side::External => external,
            Side::Cluster => external && p.external_traffic_policy == TrafficPolicy::Local,
        }
    }

    /// The port traffic of `side` is redirected to: its listener's, when
    /// it has one and the side has endpoints.
    fn portal(&self, side: Side) -> Option<u16> {
        let listener = self.listeners[side as usize].as_ref()?;
        self.balancer.has_candidates(side).then_some(listener.port)
    }
}

pub struct UserspaceProxier {
    family: IpFamily,
    config: Arc<Config>,
    relays: Relays,
    picker: Arc<Picker>,
    kernel: IptablesKernel,
    served: BTreeMap<String, Served>,
    keys_of: BTreeMap<ServiceName, Vec<String>>,
    /// The node's interface addresses, read at every sync (the DNAT target
    /// and --nodeport-addresses choose among them).
    local_addresses: Vec<IpAddr>,
    node: Node,
    /// What the rules read of the node's settings: local traffic
    /// detection, node port addresses, localhost node ports.
    settings: Settings,
    /// The node address traffic from elsewhere is sent to (DNAT), if any.
    node_address: Option<IpAddr>,
    /// SCTP service ports already logged as not served.
    sctp: BTreeSet<String>,
    /// Listeners the rules may still send traffic to: closed once a write
    /// without them has succeeded.
    closing: Vec<Listener>,
    /// The ports the kernel's rules redirected to when kpx started, by
    /// comment and protocol: taken again where free, so that flows
    /// conntrack already redirects (UDP) keep reaching a listener.
    previous: Option<std::collections::HashMap<(String, Protocol), u16>>,
    need_full: bool,
}

impl UserspaceProxier {
    /// The scheduler components its relays ask.
    pub fn picker(&self) -> &Arc<Picker> {
        &self.picker
    }

    /// (service port, scheduler name) of every port served that names one.
    pub fn scheduler_users(&self) -> Vec<(String, String)> {
        super::scheduler_users(self.served.values().map(|s| &s.port))
    }

    pub fn new(
        config: Arc<Config>,
        family: IpFamily,
        relays: Relays,
        picker: Arc<Picker>,
        kernel: IptablesKernel,
    ) -> UserspaceProxier {
        UserspaceProxier {
            family,
            config,
            relays,
            picker,
            kernel,
            served: BTreeMap::new(),
            keys_of: BTreeMap::new(),
            local_addresses: Vec::new(),
            node: Node::default(),
            settings: Settings::new(family, kpx_rules::model::ProxyMode::Userspace),
            node_address: None,
            sctp: BTreeSet::new(),
            closing: Vec::new(),
            previous: None,
            need_full: true,
        }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Brings one Service's ports up to date; the keys no longer there are
    /// returned (closed after the rules stop sending traffic to them).
    fn update_service(&mut self, state: &State, name: &ServiceName) -> usize {
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
                self.closing.extend(served.listeners.into_iter().flatten());
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
                    let served = Served { port, balancer, listeners: [None, None, None] };
                    if let Some(old) = self.served.insert(served.port.key.clone(), served) {
                        self.closing.extend(old.listeners.into_iter().flatten());
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
        if self.previous.is_none() {
            let d = Dialect { family: self.family, masquerade_mark: 1 << self.config.masquerade_bit };
            match self.kernel.dump(d) {
                Ok(dump) => self.previous = Some(rules::redirected_ports(&dump)),
                // Listeners then take new ports (UDP flows conntrack
                // redirects elsewhere go unanswered until they expire).
                Err(e) => tracing::warn!(family = %self.family, "cannot read the ports the rules redirect to: {e}"),
            }
        }
        let mut previous = self.previous.take().unwrap_or_default();
        // First the sides that take their port back, then the others,
        // which leave the ports still to be taken back alone.
        for reclaiming in [true, false] {
            for served in self.served.values_mut() {
                for side in Side::ALL {
                    let wanted = served.wants(side);
                    let slot = &mut served.listeners[side as usize];
                    if !wanted {
                        self.closing.extend(slot.take());
                        continue;
                    }
                    let protocol = served.port.protocol;
                    let key = (rules::comment(&served.port, side), protocol);
                    if slot.is_some() || reclaiming != previous.contains_key(&key) {
                        continue;
                    }
                    let preferred = previous.remove(&key);
                    let reserved = |p: u16| previous.iter().any(|((_, proto), port)| *proto == protocol && *port == p);
                    let chooser = Arc::new(SideChooser { balancer: Arc::clone(&served.balancer), side });
                    match listeners::open(&self.relays, self.family, protocol, range, preferred, &reserved, chooser) {
                        Ok(listener) => *slot = Some(listener),
                        Err(e) => tracing::error!(
                            service = %served.port.key, family = %self.family, "cannot open a listener: {e}"
                        ),
                    }
                }
            }
        }
        // The ports of sides that did not come back are free again.
        self.previous = Some(std::collections::HashMap::new());
    }

    /// One sync: the changed Services (every Service on a full one), the
    /// listeners they need, and the rules, written whole.
    pub fn sync(&mut self, state: &State, changes: &Changes, full: bool) -> Result<Report, Error> {
        let full = full || self.need_full;
        let t = Instant::now();
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
                changed += self.update_service(state, name);
            }
        } else {
            for name in changes.services.keys() {
                changed += self.update_service(state, name);
            }
        }
        if full || changes.node {
            self.node = settings::node_for_plugins(&self.config, state.node(self.family), self.family);
        }
        // Every sync (one netlink dump): the DNAT target must be the
        // node's now.
        match interfaces::local_addresses() {
            Ok(all) => {
                // The node's own clients (host-network pods, the kubelet)
                // all come from its addresses: no share of their own.
                self.relays.budget.unshared(self.family, &all);
                self.local_addresses = all;
            }
            Err(e) => tracing::error!(family = %self.family, "cannot read the node's addresses: {e}"),
        }
        self.settings = settings::settings_for(&self.config, self.family, &self.node, &self.local_addresses);
        // Where traffic from elsewhere is sent: the node's primary address,
        // else one of its own (not loopback or link-local), else REDIRECT.
        let usable =
            |ip: &IpAddr| IpFamily::of(ip) == self.family && !ip.is_loopback() && !interfaces::is_link_local(ip);
        self.node_address = settings::primary_address(&self.config, &self.node, self.family)
            .filter(|ip| self.local_addresses.contains(ip))
            .or_else(|| self.local_addresses.iter().copied().find(usable));
        self.open_listeners();
        let portals: Vec<Portal> = self
            .served
            .values()
            .map(|s| Portal {
                port: &s.port,
                internal: s.portal(Side::Internal),
                external: s.portal(Side::External),
                cluster: s.portal(Side::Cluster),
            })
            .collect();
        let host = t.elapsed();
        let t = Instant::now();
        let frame = rules::frame(&portals, &self.settings, self.node_address);
        let d = Dialect { family: self.family, masquerade_mark: 1 << self.config.masquerade_bit };
        let (text, _) = payload(&frame, &Default::default(), &[], d, None);
        let check = t.elapsed();
        let t = Instant::now();
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
        self.closing.clear();
        self.need_full = false;
        let nat = frame.rules.iter().filter(|r| r.table == Table::Nat).count();
        Ok(Report {
            full,
            changes: changed,
            bytes: text.len(),
            host,
            plugin: Duration::ZERO,
            check,
            kernel: t.elapsed(),
            // No plugin ruleset to check; the kernel's work is the tool's.
            check_cpu: Duration::ZERO,
            kernel_cpu: Duration::ZERO,
            extensions: Duration::ZERO,
            iptables_rules: Some((frame.rules.len() - nat, nat)),
            iptables_written: Some(crate::kernel::iptables::rules_in(&text)),
            steps: 1,
            cleanup_failed: false,
        })
    }
}
