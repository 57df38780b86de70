//! What one service port contributes: elements of the host's dispatch
//! maps and check sets, and of this backend's endpoint maps; and, with
//! ClientIP affinity, its own chains (see affinity.rs). The semantics are
//! upstream's (as in the iptables generator), expressed as elements
//! instead of chains.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use super::affinity;
use crate::model::{IpFamily, Node, Plan, Protocol, ServicePort, Settings, TrafficPolicy};
use crate::ops::nftables::{
    DataType, HostSet, KeyExpr, KeyType, Match, Rule, SetDecl, SetRef, Verdict, VerdictKind, protocol_number,
};

/// Text that is cloned often (set and chain names): a reference count.
pub type Text = Arc<str>;

/// A set an element goes to.
#[derive(Debug, Clone, Eq, PartialOrd, Ord)]
pub enum Set {
    Host(HostSet),
    Own(Text),
}

impl std::hash::Hash for Set {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            Set::Host(h) => h.hash(state),
            Set::Own(n) => n.hash(state),
        }
    }
}

impl PartialEq for Set {
    fn eq(&self, other: &Set) -> bool {
        match (self, other) {
            (Set::Host(a), Set::Host(b)) => a == b,
            // Names are interned ([`super::Names`]): mostly the same pointer.
            (Set::Own(a), Set::Own(b)) => Text::ptr_eq(a, b) || a == b,
            _ => false,
        }
    }
}

impl Set {
    pub fn to_ref(&self) -> SetRef {
        match self {
            Set::Host(h) => SetRef::Host(*h),
            Set::Own(n) => SetRef::Own(n.to_string()),
        }
    }
}

/// Up to `N` words: a key (12, enough for an IPv6 firewall-allow key) or
/// an endpoint (5: an IPv6 address and a port) laid out as the contract's
/// element words. Words past `len` are always zero, so equality and
/// hashing need only the used ones (a whole-array compare is a byte loop
/// in WebAssembly).
#[derive(Debug, Clone, Copy, PartialOrd, Ord)]
pub struct Words<const N: usize = 12> {
    len: u8,
    w: [u32; N],
}

impl<const N: usize> PartialEq for Words<N> {
    fn eq(&self, other: &Words<N>) -> bool {
        self.len == other.len && self.as_slice().iter().zip(other.as_slice()).all(|(a, b)| a == b)
    }
}

impl<const N: usize> Eq for Words<N> {}

impl<const N: usize> std::hash::Hash for Words<N> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u8(self.len);
        for &w in self.as_slice() {
            state.write_u32(w);
        }
    }
}

impl<const N: usize> Words<N> {
    pub fn new() -> Words<N> {
        Words { len: 0, w: [0; N] }
    }

    pub fn push(mut self, word: u32) -> Words<N> {
        self.w[self.len as usize] = word;
        self.len += 1;
        self
    }

    /// The address's words, as [`crate::ops::nftables::push_address`] lays them out.
    pub fn address(self, ip: IpAddr) -> Words<N> {
        match ip {
            IpAddr::V4(v4) => self.push(u32::from(v4)),
            IpAddr::V6(v6) => {
                let w = u128::from(v6);
                self.push((w >> 96) as u32).push((w >> 64) as u32).push((w >> 32) as u32).push(w as u32)
            }
        }
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.w[..self.len as usize]
    }

    /// These words (at most `N`).
    pub fn from_slice(words: &[u32]) -> Words<N> {
        words.iter().fold(Words::new(), |k, &w| k.push(w))
    }
}

impl<const N: usize> Default for Words<N> {
    fn default() -> Self {
        Words::new()
    }
}

/// An endpoint's words: its address and port.
pub type EndpointWords = Words<5>;

/// An element's data.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemData {
    Endpoint(EndpointWords),
    Verdict(VerdictKind, Option<Text>),
}

/// One element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Elem {
    pub set: Set,
    pub key: Words,
    pub data: Option<ElemData>,
}

/// What an endpoint map is for; each has one select chain and one map per
/// protocol and endpoint count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Purpose {
    /// Cluster IP traffic (internal traffic policy).
    Internal,
    /// External IPs and load-balancer IPs (external traffic policy).
    External,
    /// External IPs and LB IPs for pod and node traffic under a Local
    /// external policy (all cluster endpoints).
    Shortcut,
    /// Node ports (external traffic policy).
    NodePortExternal,
    /// Node ports for node traffic under a Local external policy.
    NodePortShortcut,
}

impl Purpose {
    pub const ALL: [Purpose; 5] =
        [Purpose::Internal, Purpose::External, Purpose::Shortcut, Purpose::NodePortExternal, Purpose::NodePortShortcut];

    pub fn name(self) -> &'static str {
        match self {
            Purpose::Internal => "internal",
            Purpose::External => "external",
            Purpose::Shortcut => "shortcut",
            Purpose::NodePortExternal => "nodeport-external",
            Purpose::NodePortShortcut => "nodeport-shortcut",
        }
    }

    /// Keyed by destination address (else by protocol and node port only).
    pub fn keyed_by_address(self) -> bool {
        matches!(self, Purpose::Internal | Purpose::External | Purpose::Shortcut)
    }

    pub fn select_chain(self) -> String {
        format!("select-{}", self.name())
    }

    pub fn affinity_map(self) -> String {
        format!("affinity-{}", self.name())
    }

    /// The lookup key, without the slot.
    pub fn key_exprs(self) -> Vec<KeyExpr> {
        if self.keyed_by_address() { KeyExpr::DESTINATION.to_vec() } else { KeyExpr::NODE_PORT.to_vec() }
    }

    /// The key types of its maps, without the slot.
    pub fn key_types(self) -> Vec<KeyType> {
        self.key_exprs().into_iter().map(KeyExpr::key_type).collect()
    }

    /// The affinity map's declaration: key -> goto the Service's chain.
    pub fn affinity_declaration(self) -> SetDecl {
        SetDecl {
            name: self.affinity_map(),
            key: self.key_types(),
            data: Some(DataType::Verdict),
            interval: false,
            timeout_seconds: None,
            comment: None,
        }
    }
}

/// One endpoint map: a purpose, a protocol and an endpoint count.
pub type CountMap = (Purpose, Protocol, usize);

/// The map of endpoints for `proto` services with `n` endpoints.
pub fn count_map((purpose, proto, n): CountMap) -> String {
    format!("{}-{proto}-{n}", purpose.name())
}

/// key . slot -> endpoint address . port.
pub fn count_map_declaration(map: CountMap) -> SetDecl {
    let mut key = map.0.key_types();
    key.push(KeyType::Integer);
    SetDecl {
        name: count_map(map),
        key,
        data: Some(DataType::Endpoint),
        interval: false,
        timeout_seconds: None,
        comment: None,
    }
}

/// The select-chain rule for one endpoint map: pick slot `numgen random
/// mod n`, DNAT to what the map holds for it (a miss falls through).
pub fn count_rule(map: CountMap) -> Rule {
    let (purpose, proto, n) = map;
    let mut keys = purpose.key_exprs();
    keys.push(KeyExpr::NumgenRandom(n as u32));
    Rule::new(&purpose.select_chain())
        .with(Match::Protocol { negate: false, protocol: proto })
        .verdict(Verdict::DnatMap { keys, map: SetRef::Own(count_map(map)) })
}

pub struct Context<'a> {
    pub settings: &'a Settings,
    pub node: &'a Node,
}

/// What one service port puts into the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contribution {
    pub elements: Vec<Elem>,
    /// The endpoint maps it needs.
    pub counts: BTreeSet<CountMap>,
    /// Its own chains, sets and maps (affinity only).
    pub objects: affinity::Objects,
}

/// At least as many elements as [`contribution`] makes for `svc` in
/// nearly every case: a size for the registry's index, not a bound
/// anything relies on (a weighted plan's extra slots are left out). It
/// follows [`contribution`]: the cluster-ips element; the cluster IP's
/// dispatch (or no-endpoint) element and its endpoint map; for each
/// external address and the node port a dispatch element, its map, the
/// shortcut map under a Local external policy and a no-endpoint element
/// when it has no endpoints; the firewall's elements; a hairpin element
/// per endpoint. An estimate of about twice this (before) doubled the
/// index at 30k Services, 5 MB of the plugin's memory. Saturating: a
/// hostile Service's counts must not wrap (usize is 32 bits in the guest).
pub fn estimate(svc: &ServicePort) -> usize {
    let (n, cluster, local) = (svc.endpoints.len(), svc.cluster_endpoints.len(), svc.local_endpoints.len());
    let internal = if svc.internal_traffic_policy == TrafficPolicy::Local { local } else { cluster };
    let etp_local = svc.external_traffic_policy == TrafficPolicy::Local;
    let external_eps = if etp_local { local } else { cluster };
    let per_external = [external_eps, if etp_local { cluster } else { 0 }, usize::from(external_eps == 0)]
        .into_iter()
        .fold(1usize, usize::saturating_add);
    let (ext, lb) = (svc.external_ips.len(), svc.load_balancer_ips.len());
    let external = [ext, lb, usize::from(svc.node_port != 0)].into_iter().fold(0usize, usize::saturating_add);
    let ranges = svc.load_balancer_source_ranges.len();
    let firewall = if ranges == 0 { 0 } else { lb.saturating_mul(ranges.saturating_add(2)) };
    [internal, external.saturating_mul(per_external), firewall, n].into_iter().fold(2usize, usize::saturating_add)
}

/// A goto to one of the table's fixed chains (interned: a few names).
fn goto(names: &super::Names, chain: &str) -> Option<ElemData> {
    Some(ElemData::Verdict(VerdictKind::Goto, Some(names.get(chain))))
}

/// A goto to a Service's own chain (not interned: the interner would keep
/// every Service's name for the life of the instance).
fn goto_own(chain: &str) -> Option<ElemData> {
    Some(ElemData::Verdict(VerdictKind::Goto, Some(Arc::from(chain))))
}

pub fn contribution(ctx: &Context, svc: &ServicePort, names: &super::Names) -> Contribution {
    let family = ctx.settings.family;
    let mut c = Contribution::default();
    let Some(view) = svc.view(family) else {
        return c;
    };
    let proto = protocol_number(svc.protocol);
    let port = u32::from(svc.port);
    let cluster_ip = view.cluster_ip;
    let (cluster_eps, local_eps) = (&view.cluster_endpoints, &view.local_endpoints);
    let (ext_ips, lb_ips) = (&view.external_ips, &view.load_balancer_ips);
    let (has_endpoints, externally_accessible) = (view.has_endpoints, view.externally_accessible);
    let (itp_local, etp_local) = (view.internal_local, view.external_local);
    let (internal_eps, external_eps) = (view.internal_endpoints(), view.external_endpoints());
    let (has_internal, has_external) = (view.has_internal(), view.has_external());
    let filter_verdict =
        Some(ElemData::Verdict(if has_endpoints { VerdictKind::Drop } else { VerdictKind::Reject }, None));
    let tuple = |ip: IpAddr| Words::new().address(ip).push(proto).push(port);
    let host = |set: HostSet, key: Words, data: Option<ElemData>| Elem { set: Set::Host(set), key, data };
    let (cluster_plan, local_plan) = (view.cluster_plan, view.local_plan);
    let own_chains = svc.affinity_timeout_seconds > 0
        || affinity::needs_own_chains(cluster_plan)
        || affinity::needs_own_chains(local_plan);
    let chains =
        own_chains.then(|| affinity::chains(family, svc, (cluster_eps, cluster_plan), (local_eps, local_plan)));

    c.elements.push(host(HostSet::ClusterIps, Words::new().address(cluster_ip), None));

    #[derive(Clone, Copy)]
    enum Which {
        Cluster,
        Local,
    }
    let eps_of = |which: Which| match which {
        Which::Cluster => (cluster_eps, cluster_plan),
        Which::Local => (local_eps, local_plan),
    };
    let endpoints_for = |purpose: Purpose, key: Words, which: Which, c: &mut Contribution| {
        let (eps, plan) = eps_of(which);
        if eps.is_empty() {
            return;
        }
        if let Some(chains) = &chains {
            let chain = match which {
                Which::Cluster => &chains.cluster,
                Which::Local => &chains.local,
            };
            c.elements.push(Elem { set: Set::Own(names.get(&purpose.affinity_map())), key, data: goto_own(chain) });
            return;
        }
        // A weighted plan: candidate i holds w_i of the map's slots.
        let slots = match plan.filter(|p| !p.is_uniform(eps.len()) && p.check(eps.len()).is_ok()) {
            Some(Plan::Weighted(w)) => affinity::weighted_slots(w),
            _ => (0..eps.len()).collect(),
        };
        let map = (purpose, svc.protocol, slots.len());
        c.counts.insert(map);
        let set = Set::Own(names.get(&count_map(map)));
        for (j, &i) in slots.iter().enumerate() {
            let ep = eps[i];
            let data = ElemData::Endpoint(Words::new().address(ep.ip).push(u32::from(ep.port)));
            c.elements.push(Elem { set: set.clone(), key: key.push(j as u32), data: Some(data) });
        }
    };
    let internal_set = if itp_local { Which::Local } else { Which::Cluster };
    let external_set = if etp_local { Which::Local } else { Which::Cluster };

    // Cluster IP.
    if has_internal {
        c.elements.push(host(HostSet::ServiceIps, tuple(cluster_ip), goto(names, "cluster-ip")));
        endpoints_for(Purpose::Internal, tuple(cluster_ip), internal_set, &mut c);
    } else {
        c.elements.push(host(HostSet::NoEndpointServices, tuple(cluster_ip), filter_verdict.clone()));
    }
    let external_chain = if etp_local { "external-local" } else { "external-cluster" };
    // External IPs and load-balancer IPs.
    for &ip in ext_ips.iter().chain(lb_ips) {
        if has_endpoints {
            c.elements.push(host(HostSet::ServiceIps, tuple(ip), goto(names, external_chain)));
            endpoints_for(Purpose::External, tuple(ip), external_set, &mut c);
            if etp_local {
                endpoints_for(Purpose::Shortcut, tuple(ip), Which::Cluster, &mut c);
            }
        }
        if !has_external {
            c.elements.push(host(HostSet::NoEndpointServices, tuple(ip), filter_verdict.clone()));
        }
    }
    // Load-balancer source ranges.
    let ranges: Vec<_> = svc.load_balancer_source_ranges.iter().filter(|r| r.family() == family).collect();
    if has_endpoints && !lb_ips.is_empty() && !ranges.is_empty() {
        let node_ip = ctx.node.addresses.iter().find(|ip| family.matches(ip));
        let from_node = ranges.iter().any(|r| node_ip.is_some_and(|ip| r.contains(ip)));
        let cidr = |w: Words, addr: IpAddr, len: u8| w.address(addr).push(u32::from(len));
        for &ip in lb_ips {
            c.elements.push(host(HostSet::FirewallIps, tuple(ip), None));
            for r in &ranges {
                c.elements.push(host(HostSet::FirewallAllow, cidr(tuple(ip), r.network(), r.prefix_len), None));
            }
            if from_node {
                let full = if family == IpFamily::V4 { 32 } else { 128 };
                c.elements.push(host(HostSet::FirewallAllow, cidr(tuple(ip), ip, full), None));
            }
        }
    }
    // Node port.
    if svc.node_port != 0 {
        let np = Words::new().push(proto).push(u32::from(svc.node_port));
        if has_endpoints {
            let chain = if etp_local { "nodeport-local" } else { "nodeport-cluster" };
            c.elements.push(host(HostSet::ServiceNodePorts, np, goto(names, chain)));
            endpoints_for(Purpose::NodePortExternal, np, external_set, &mut c);
            if etp_local {
                endpoints_for(Purpose::NodePortShortcut, np, Which::Cluster, &mut c);
            }
        }
        if !has_external {
            c.elements.push(host(HostSet::NoEndpointNodePorts, np, filter_verdict));
        }
    }
    // Hairpin: an endpoint reaching itself through the service.
    let mut reachable: BTreeSet<IpAddr> = BTreeSet::new();
    if has_internal {
        reachable.extend(internal_eps.iter().map(|e| e.ip));
    }
    if has_endpoints && externally_accessible {
        reachable.extend(external_eps.iter().map(|e| e.ip));
        if etp_local {
            reachable.extend(cluster_eps.iter().map(|e| e.ip));
        }
    }
    for ip in reachable {
        c.elements.push(host(HostSet::Hairpin, Words::new().address(ip).address(ip), None));
    }
    if let Some(chains) = chains {
        c.objects = chains.objects;
    }
    c
}
