//! What the host writes itself in nftables mode: the base chains and
//! their hooks, the dispatch chains, the sets and maps they look up, and
//! every rule that is not about one Service (masquerading, the firewall
//! and endpoint checks, ServiceCIDR drops). A plugin fills the host's
//! sets and maps and adds chains of its own that the dispatch maps lead to.

use kpx_rules::model::{Cidr, Cluster, IpFamily, NodePortAddresses, Protocol, Settings};
use kpx_rules::ops::CtStates;
use kpx_rules::ops::nftables::{
    AddressField, Element, HostSet, KeyExpr, Match, Op, Rule, SetRef, Statement, Value, Verdict, VerdictKind,
};

use crate::syntax::nftables::{BASE_CHAINS, CHAINS, REJECT_CHAIN, localhost_reject_chain};

/// The reject map's elements for these node ports (those of the
/// protocols `settings` refuses on loopback), added or deleted; None
/// when there are none.
pub fn localhost_reject_elements(
    settings: &Settings,
    node_ports: impl IntoIterator<Item = (Protocol, u16)>,
    add: bool,
) -> Option<Op> {
    let mut w =
        kpx_rules::ops::nftables::ElementWriter::new(settings.family, SetRef::Host(HostSet::LocalhostNodePortRejects));
    for (p, port) in node_ports.into_iter().filter(|(p, _)| settings.localhost_nodeport_rejects.contains(p)) {
        w.protocol(p).word(u32::from(port)).verdict(VerdictKind::Goto, Some(localhost_reject_chain(p)));
    }
    if w.is_empty() {
        return None;
    }
    Some(if add { Op::AddElements(w.finish()) } else { Op::DeleteElements(w.finish()) })
}

/// The host's objects for these settings and ServiceCIDRs, as operations.
pub fn frame(settings: &Settings, cluster: &Cluster) -> Vec<Op> {
    let mut out: Vec<Op> = BASE_CHAINS.iter().map(|b| Op::AddBaseChain(*b)).collect();
    out.extend(CHAINS.iter().map(|c| Op::AddChain(c.to_string())));
    out.extend(
        settings.localhost_nodeport_rejects.iter().map(|p| Op::AddChain(localhost_reject_chain(*p).to_string())),
    );
    // The loopback reject map only while something is refused (as upstream
    // deletes it): with the gate off, nothing of it is in the table.
    let wanted =
        |s: &&HostSet| **s != HostSet::LocalhostNodePortRejects || !settings.localhost_nodeport_rejects.is_empty();
    out.extend(HostSet::ALL.iter().filter(wanted).map(|s| Op::AddSet(s.declaration())));
    out.extend(rules(settings, cluster).into_iter().map(Op::AddRule));
    let only: Vec<Element> = match &settings.nodeport_addresses {
        NodePortAddresses::All => Vec::new(),
        // Never loopback: nftables cannot DNAT it (upstream's nodeport-ips
        // leaves it out too); localhost node ports are the relay's.
        NodePortAddresses::Only(cidrs) => cidrs
            .iter()
            .filter(|c| c.family() == settings.family && !c.addr.is_loopback())
            .map(|c| Element { key: vec![Value::Address(c.addr)], data: None })
            .collect(),
    };
    if !only.is_empty() {
        let mut w = kpx_rules::ops::nftables::ElementWriter::new(settings.family, SetRef::Host(HostSet::NodePortIps));
        for e in &only {
            for v in &e.key {
                w.value(kpx_rules::ops::nftables::KeyType::Address, v);
            }
        }
        out.push(Op::AddElements(w.finish()));
    }
    out
}

fn new_state() -> Match {
    Match::CtState { negate: false, states: CtStates::NEW }
}

fn jump(chain: &str, to: &str) -> Rule {
    Rule::new(chain).verdict(Verdict::Jump(to.to_string()))
}

/// The family's loopback range.
fn loopback(family: IpFamily) -> Cidr {
    match family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    }
    .parse()
    .expect("loopback")
}

/// Packets to node-port addresses: every local address but loopback, or
/// --nodeport-addresses.
fn node_port_capture(settings: &Settings) -> Vec<Match> {
    match settings.nodeport_addresses {
        NodePortAddresses::All => vec![
            Match::FibLocal { field: AddressField::Destination, negate: false },
            Match::Address { field: AddressField::Destination, negate: true, cidr: loopback(settings.family) },
        ],
        NodePortAddresses::Only(_) => vec![Match::Lookup {
            keys: vec![KeyExpr::Address(AddressField::Destination)],
            set: SetRef::Host(HostSet::NodePortIps),
            negate: false,
        }],
    }
}

fn rules(settings: &Settings, cluster: &Cluster) -> Vec<Rule> {
    let destination = KeyExpr::DESTINATION.to_vec();
    let node_port = KeyExpr::NODE_PORT.to_vec();
    let host = |s: HostSet| SetRef::Host(s);
    let mut out = vec![
        jump("filter-prerouting-pre-dnat", "firewall-check").with(new_state()),
        jump("filter-output-pre-dnat", "firewall-check").with(new_state()),
        jump("filter-input", "nodeport-endpoints-check").with(new_state()),
        jump("filter-input", "service-endpoints-check").with(new_state()),
    ];
    // No `ct state invalid drop`: upstream's nftables mode leaves INVALID
    // packets alone (kubernetes/kubernetes#122663: the workaround "caused
    // other problems in some clusters"; --conntrack-tcp-be-liberal is the
    // fix it points to). iptables mode keeps it (kernel::iptables::frame).
    out.extend([
        jump("filter-forward", "service-endpoints-check").with(new_state()),
        jump("filter-forward", "cluster-ips-check").with(new_state()),
        jump("filter-output", "service-endpoints-check").with(new_state()),
        jump("filter-output", "cluster-ips-check").with(new_state()),
        jump("nat-prerouting", "services"),
        jump("nat-output", "services"),
        jump("nat-postrouting", "masquerading"),
        Rule::new("services").verdict(Verdict::Vmap { keys: destination.clone(), map: host(HostSet::ServiceIps) }),
    ]);
    let mut nodeports = Rule::new("services");
    nodeports.matches = node_port_capture(settings);
    out.push(nodeports.verdict(Verdict::Vmap { keys: node_port.clone(), map: host(HostSet::ServiceNodePorts) }));
    out.push(
        Rule::new("service-endpoints-check")
            .verdict(Verdict::Vmap { keys: destination.clone(), map: host(HostSet::NoEndpointServices) }),
    );
    let mut check = Rule::new("nodeport-endpoints-check");
    check.matches = node_port_capture(settings);
    out.push(check.verdict(Verdict::Vmap { keys: node_port.clone(), map: host(HostSet::NoEndpointNodePorts) }));
    // Node ports on loopback, which nothing DNATs (KEP-6032): refused and
    // counted by protocol, unless kpx's relay listens there (TCP).
    if !settings.localhost_nodeport_rejects.is_empty() {
        out.push(
            Rule::new("nodeport-endpoints-check")
                .with(Match::Address {
                    field: AddressField::Destination,
                    negate: false,
                    cidr: loopback(settings.family),
                })
                .verdict(Verdict::Vmap { keys: node_port, map: host(HostSet::LocalhostNodePortRejects) }),
        );
    }
    for p in &settings.localhost_nodeport_rejects {
        let chain = localhost_reject_chain(*p);
        out.push(Rule::new(chain).statement(Statement::NamedCounter(chain.to_string())).verdict(Verdict::Reject));
    }
    out.push(Rule::new(REJECT_CHAIN).verdict(Verdict::Reject));
    let mut allowed = destination.clone();
    allowed.push(KeyExpr::Address(AddressField::Source));
    out.push(
        Rule::new("firewall-check")
            .with(Match::Lookup { keys: destination, set: host(HostSet::FirewallIps), negate: false })
            .with(Match::Lookup { keys: allowed, set: host(HostSet::FirewallAllow), negate: true })
            .verdict(Verdict::Drop),
    );
    out.push(
        Rule::new("cluster-ips-check")
            .with(Match::Lookup {
                keys: vec![KeyExpr::Address(AddressField::Destination)],
                set: host(HostSet::ClusterIps),
                negate: false,
            })
            .verdict(Verdict::Reject),
    );
    // Unallocated addresses of the ServiceCIDRs: dropped.
    for cidr in cluster.service_cidrs.iter().filter(|c| c.family() == settings.family) {
        out.push(
            Rule::new("cluster-ips-check")
                .with(Match::Address { field: AddressField::Destination, negate: false, cidr: *cidr })
                .verdict(Verdict::Drop),
        );
    }
    let mark = settings.masquerade_mark();
    out.extend([
        Rule::new("mark-for-masquerade").statement(Statement::MasqueradeMark),
        // Hairpin: an endpoint reaching itself through a Service. Only
        // DNATed connections: an endpoint on a node address talking to
        // itself on any other port is not Service traffic.
        Rule::new("masquerading")
            .with(Match::CtDnat { negate: false })
            .with(Match::Lookup {
                keys: vec![KeyExpr::Address(AddressField::Source), KeyExpr::Address(AddressField::Destination)],
                set: host(HostSet::Hairpin),
                negate: false,
            })
            .verdict(Verdict::Jump("mark-for-masquerade".into())),
        Rule::new("masquerading").with(Match::Mark { negate: false, value: 0, mask: mark }).verdict(Verdict::Return),
        Rule::new("masquerading").statement(Statement::MarkXor(mark)),
        Rule::new("masquerading").statement(Statement::Masquerade { fully_random: settings.masquerade_random_fully }),
    ]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// upstream's nftables mode installs no `ct state invalid drop`
    /// (kubernetes/kubernetes#122663), whatever the conntrack settings.
    #[test]
    fn no_rule_drops_invalid_packets() {
        for liberal in [false, true] {
            let mut settings = Settings::new(IpFamily::V4, kpx_rules::model::ProxyMode::Nftables);
            settings.conntrack_tcp_be_liberal = liberal;
            for rule in rules(&settings, &Cluster::default()) {
                let invalid = rule
                    .matches
                    .iter()
                    .any(|m| matches!(m, Match::CtState { states, .. } if states.contains(CtStates::INVALID)));
                assert!(!invalid, "{rule:?}");
            }
        }
    }
}
