//! ipvs mode's iptables rules, all the host's: upstream's ipvs proxier
//! writes masquerading, the node-port and load-balancer marks, the
//! LoadBalancer source-range firewall and the access filter for
//! kube-ipvs0's addresses with a fixed set of rules over its ipsets
//! (writeIptablesRules in pkg/proxy/ipvs/proxier.go). No plugin writes
//! iptables rules in this mode.

use kpx_rules::iptables::local_traffic_match;
use kpx_rules::model::{Cidr, IpFamily, Protocol, Settings};
use kpx_rules::ops::CtStates;
use kpx_rules::ops::iptables::{AddressMatch, MARK_MASQ_CHAIN, Match, Rule, SetDir, Table, Target};

use super::sets::{Kind, Sets};
use crate::kernel::iptables::frame::Frame;

const SERVICES: &str = "KUBE-SERVICES";
const POSTROUTING: &str = "KUBE-POSTROUTING";
const NODE_PORT: &str = "KUBE-NODE-PORT";
const LOAD_BALANCER: &str = "KUBE-LOAD-BALANCER";
const FORWARD: &str = "KUBE-FORWARD";
const FIREWALL: &str = "KUBE-PROXY-FIREWALL";
const SOURCE_RANGES: &str = "KUBE-SOURCE-RANGES-FIREWALL";
const IPVS_FILTER: &str = "KUBE-IPVS-FILTER";
const IPVS_OUT_FILTER: &str = "KUBE-IPVS-OUT-FILTER";

/// upstream's `iptablesChains`, the chains each sync declares (flushes)
/// and fills.
const CHAINS: [(Table, &str); 12] = [
    (Table::Nat, SERVICES),
    (Table::Nat, POSTROUTING),
    (Table::Nat, NODE_PORT),
    (Table::Nat, LOAD_BALANCER),
    (Table::Nat, MARK_MASQ_CHAIN),
    (Table::Filter, FORWARD),
    (Table::Filter, NODE_PORT),
    (Table::Filter, FIREWALL),
    (Table::Filter, SOURCE_RANGES),
    (Table::Filter, IPVS_FILTER),
    (Table::Filter, IPVS_OUT_FILTER),
    (Table::Nat, super::slots::CHAIN),
];

use SetDir::{Dst, Src};

fn set(sets: &Sets, kind: Kind, dirs: &[SetDir]) -> Match {
    Match::Set { negate: false, name: kind.name(sets.family), dirs: dirs.to_vec() }
}

fn host_jump(table: Table, from: &str, to: &str, comment: &str) -> Rule {
    Rule::chain(table, from).with(Match::comment(comment)).target(Target::HostJump(to.to_string()))
}

/// upstream's `iptablesJumpChain`: the jumps from built-in chains.
pub fn jumps() -> Vec<Rule> {
    use Table::{Filter, Nat};
    vec![
        host_jump(Nat, "OUTPUT", SERVICES, "kubernetes service portals"),
        host_jump(Nat, "PREROUTING", SERVICES, "kubernetes service portals"),
        host_jump(Nat, "POSTROUTING", POSTROUTING, "kubernetes postrouting rules"),
        host_jump(Filter, "FORWARD", FORWARD, "kubernetes forwarding rules"),
        host_jump(Filter, "INPUT", NODE_PORT, "kubernetes health check rules"),
        host_jump(Filter, "INPUT", FIREWALL, "kube-proxy firewall rules"),
        host_jump(Filter, "FORWARD", FIREWALL, "kube-proxy firewall rules"),
        host_jump(Filter, "INPUT", IPVS_FILTER, "kubernetes ipvs access filter"),
        host_jump(Filter, "OUTPUT", IPVS_OUT_FILTER, "kubernetes ipvs access filter"),
    ]
}

/// The rules of one sync, from the sets it writes: upstream's set rules
/// are written only while their set has entries (KUBE-IPVS-FILTER's and
/// the health-check rule always), as upstream does.
/// `slot_rules`: nat KPX-IPVS-SLOTS, which marks connections for slot
/// plans (slots.rs), jumped to first when it has rules.
pub fn frame(settings: &Settings, sets: &Sets, slot_rules: Vec<Rule>) -> Frame {
    use Table::{Filter, Nat};
    let has = |kind: Kind| !sets.is_empty(kind);
    let mark = settings.masquerade_mark();
    let mut rules = Vec::new();
    let loopback = match settings.family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    };
    let loopback: Cidr = loopback.parse().expect("loopback cidr");
    // Connections to localhost leave the Service chain at once.
    rules.push(
        Rule::chain(Nat, SERVICES)
            .with(Match::Source(AddressMatch { negate: false, cidr: loopback }))
            .target(Target::Return),
    );
    // Only the slotted virtual servers' new connections walk the slot rules.
    if !slot_rules.is_empty() && has(Kind::Slotted) {
        rules.push(
            Rule::chain(Nat, SERVICES)
                .with(set(sets, Kind::Slotted, &[Dst, Dst]))
                .target(Target::HostJump(super::slots::CHAIN.into())),
        );
        rules.extend(slot_rules);
    }

    // upstream's ipsetWithIptablesChain, in its order.
    let with_set = |table: Table, from: &str, protocol: Option<Protocol>, kind: Kind, dirs: &[SetDir], to: Target| {
        let mut rule = Rule::chain(table, from);
        if let Some(p) = protocol {
            rule = rule.with(Match::Protocol(p));
        }
        rule.with(Match::comment(kind.comment())).with(set(sets, kind, dirs)).target(to)
    };
    let masq = || Target::MarkForMasquerade;
    type SetRule<'a> = (Table, &'a str, Option<Protocol>, Kind, &'a [SetDir], Target);
    let table: [SetRule; 12] = [
        (Nat, POSTROUTING, None, Kind::LoopBack, &[Dst, Dst, Src], Target::Masquerade { random_fully: false }),
        (Nat, SERVICES, None, Kind::LoadBalancer, &[Dst, Dst], Target::HostJump(LOAD_BALANCER.into())),
        (Nat, LOAD_BALANCER, None, Kind::LoadBalancerLocal, &[Dst, Dst], Target::Return),
        (Nat, NODE_PORT, Some(Protocol::Tcp), Kind::NodePortLocalTcp, &[Dst], Target::Return),
        (Nat, NODE_PORT, Some(Protocol::Tcp), Kind::NodePortTcp, &[Dst], masq()),
        (Nat, NODE_PORT, Some(Protocol::Udp), Kind::NodePortLocalUdp, &[Dst], Target::Return),
        (Nat, NODE_PORT, Some(Protocol::Udp), Kind::NodePortUdp, &[Dst], masq()),
        (Nat, NODE_PORT, Some(Protocol::Sctp), Kind::NodePortLocalSctp, &[Dst, Dst], Target::Return),
        (Nat, NODE_PORT, Some(Protocol::Sctp), Kind::NodePortSctp, &[Dst, Dst], masq()),
        (Filter, FIREWALL, None, Kind::LoadBalancerFw, &[Dst, Dst], Target::HostJump(SOURCE_RANGES.into())),
        (Filter, SOURCE_RANGES, None, Kind::LoadBalancerSourceCidr, &[Dst, Dst, Src], Target::Return),
        (Filter, SOURCE_RANGES, None, Kind::LoadBalancerSourceIp, &[Dst, Dst, Src], Target::Return),
    ];
    for (table, from, protocol, kind, dirs, to) in table {
        if has(kind) {
            rules.push(with_set(table, from, protocol, kind, dirs, to));
        }
    }

    if has(Kind::ClusterIp) {
        let rule = Rule::chain(Nat, SERVICES).with(Match::comment(Kind::ClusterIp.comment()));
        let not_local = local_traffic_match(settings, true);
        rules.push(if settings.masquerade_all {
            rule.with(set(sets, Kind::ClusterIp, &[Dst, Dst])).target(masq())
        } else if let Some(not_local) = not_local {
            // Off-cluster traffic to a cluster IP (a static route to any
            // node) may leave the node again: masquerade it.
            rule.with(set(sets, Kind::ClusterIp, &[Dst, Dst])).with(not_local).target(masq())
        } else {
            // The node's own connections to a cluster IP get the cluster
            // IP as their source (it is on kube-ipvs0): masquerade those.
            rule.with(set(sets, Kind::ClusterIp, &[Src, Dst])).target(masq())
        });
    }
    // External IPs: accepted from off the node, or when the address is
    // the node's own.
    let external = |kind: Kind, rules: &mut Vec<Rule>| {
        let base =
            || Rule::chain(Nat, SERVICES).with(Match::comment(kind.comment())).with(set(sets, kind, &[Dst, Dst]));
        rules.push(
            base()
                .with(Match::PhysdevIsIn { negate: true })
                .with(Match::SourceTypeLocal { negate: true })
                .target(Target::Accept),
        );
        rules.push(base().with(Match::DestinationTypeLocal { negate: false }).target(Target::Accept));
    };
    if has(Kind::ExternalIp) {
        rules.push(
            Rule::chain(Nat, SERVICES)
                .with(Match::comment(Kind::ExternalIp.comment()))
                .with(set(sets, Kind::ExternalIp, &[Dst, Dst]))
                .target(masq()),
        );
        external(Kind::ExternalIp, &mut rules);
    }
    if has(Kind::ExternalIpLocal) {
        external(Kind::ExternalIpLocal, &mut rules);
    }
    rules.push(
        Rule::chain(Nat, SERVICES)
            .with(Match::DestinationTypeLocal { negate: false })
            .target(Target::HostJump(NODE_PORT.into())),
    );
    rules.push(Rule::chain(Nat, LOAD_BALANCER).target(masq()));
    rules.push(Rule::chain(Filter, SOURCE_RANGES).target(Target::Drop));
    // The node's own connections to a firewalled load-balancer address it
    // is not allowed to reach: IPVS takes them at LOCAL_OUT, so they never
    // pass filter INPUT; their source is the address itself (it is on
    // kube-ipvs0). upstream: kubernetes#119656.
    for (address, protocol, port) in &sets.no_node_access {
        rules.push(
            Rule::chain(Filter, IPVS_OUT_FILTER)
                .with(Match::source_ip(*address))
                .with(Match::IpvsVirtual { address: *address, protocol: *protocol, port: *port })
                .target(Target::Drop),
        );
    }
    // Accept what IPVS serves, whatever other rules in the chain's
    // callers would do; last in KUBE-SERVICES.
    for kind in [Kind::ClusterIp, Kind::LoadBalancer] {
        if has(kind) {
            rules.push(Rule::chain(Nat, SERVICES).with(set(sets, kind, &[Dst, Dst])).target(Target::Accept));
        }
    }
    rules.push(
        Rule::chain(Filter, FORWARD)
            .with(Match::comment("kubernetes forwarding rules"))
            .with(Match::Mark { negate: false, value: mark, mask: mark })
            .target(Target::Accept),
    );
    rules.push(
        Rule::chain(Filter, FORWARD)
            .with(Match::comment("kubernetes forwarding conntrack rule"))
            .with(Match::Conntrack { negate: false, states: CtStates::RELATED | CtStates::ESTABLISHED })
            .target(Target::Accept),
    );
    rules.push(
        Rule::chain(Filter, NODE_PORT)
            .with(Match::comment(Kind::HealthCheckNodePort.comment()))
            .with(set(sets, Kind::HealthCheckNodePort, &[Dst]))
            .target(Target::Accept),
    );
    // kube-ipvs0's addresses answer only on Service ports
    // (kubernetes/kubernetes#72236).
    for (kind, dirs) in [
        (Kind::LoadBalancer, &[Dst, Dst][..]),
        (Kind::ClusterIp, &[Dst, Dst]),
        (Kind::ExternalIp, &[Dst, Dst]),
        (Kind::ExternalIpLocal, &[Dst, Dst]),
        (Kind::HealthCheckNodePort, &[Dst]),
    ] {
        rules.push(Rule::chain(Filter, IPVS_FILTER).with(set(sets, kind, dirs)).target(Target::Return));
    }
    rules.push(
        Rule::chain(Filter, IPVS_FILTER)
            .with(Match::Conntrack { negate: false, states: CtStates::NEW })
            .with(set(sets, Kind::IpvsIps, &[Dst]))
            .target(Target::Reject),
    );
    rules.push(
        Rule::chain(Nat, POSTROUTING)
            .with(Match::Mark { negate: true, value: mark, mask: mark })
            .target(Target::Return),
    );
    rules.push(Rule::chain(Nat, POSTROUTING).target(Target::SetMark { value: mark, mask: 0 }));
    rules.push(
        Rule::chain(Nat, POSTROUTING)
            .with(Match::comment("kubernetes service traffic requiring SNAT"))
            .target(Target::Masquerade { random_fully: settings.masquerade_random_fully }),
    );
    rules.push(Rule::chain(Nat, MARK_MASQ_CHAIN).target(Target::SetMark { value: mark, mask: mark }));
    Frame { chains: CHAINS.to_vec(), rules, trailing: Vec::new(), jumps: jumps() }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use kpx_rules::model::{Endpoint, LocalTraffic, ProxyMode, ServicePort};
    use kpx_rules::ops::iptables::Ruleset;

    use super::super::sets::NodeFacts;
    use super::*;
    use crate::kernel::iptables::parse::{Line, parse_dump};
    use crate::kernel::iptables::render::payload;
    use crate::syntax::iptables::Dialect;

    fn settings() -> Settings {
        let mut s = Settings::new(IpFamily::V4, ProxyMode::Ipvs);
        s.local_traffic = LocalTraffic::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]);
        s.masquerade_random_fully = false;
        s
    }

    fn d() -> Dialect {
        Dialect { family: IpFamily::V4, masquerade_mark: 0x4000 }
    }

    fn sets() -> Sets {
        let mut lb = ServicePort::new("ns", "lb", "", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![Endpoint::ready("10.244.1.5".parse().unwrap(), 80)]);
        lb.cluster_ip = Some("10.96.0.10".parse().unwrap());
        lb.node_port = 30080;
        lb.load_balancer_ips = vec!["198.51.100.1".parse().unwrap()];
        lb.endpoints[0].conditions.is_local = true;
        let bound: BTreeSet<std::net::IpAddr> = ["10.96.0.10".parse().unwrap()].into();
        Sets::desired(IpFamily::V4, [&lb], &NodeFacts { node_addresses: &[], bound: &bound })
    }

    /// The frame's rules of one chain, as iptables-save prints them.
    fn chain(table: Table, name: &str) -> Vec<String> {
        let frame = frame(&settings(), &sets(), Vec::new());
        let (text, _) = payload(&frame, &Ruleset::default(), &[], d(), None);
        text.split("COMMIT\n")
            .find(|t| t.starts_with(&format!("*{}", table.name())))
            .unwrap()
            .lines()
            .filter(|l| l.starts_with(&format!("-A {name} ")))
            .map(str::to_string)
            .collect()
    }

    /// Lines as upstream's tests and a live ipvs node's iptables-save print
    /// them (the CHANGES note where kpx's canonical order differs only
    /// in the order of matches).
    #[test]
    fn the_rules_are_upstreams() {
        assert_eq!(
            chain(Table::Nat, "KUBE-SERVICES"),
            [
                "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN",
                "-A KUBE-SERVICES -m comment --comment \"Kubernetes service lb portal\" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER",
                "-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ",
                "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT",
                "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
                "-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT",
            ]
        );
        assert_eq!(
            chain(Table::Nat, "KUBE-NODE-PORT"),
            [
                "-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ"
            ]
        );
        assert_eq!(
            chain(Table::Nat, "KUBE-POSTROUTING"),
            [
                "-A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE",
                "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
                "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
                "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE",
            ]
        );
        assert_eq!(chain(Table::Nat, "KUBE-LOAD-BALANCER"), ["-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ"]);
        assert_eq!(
            chain(Table::Filter, "KUBE-IPVS-FILTER"),
            [
                "-A KUBE-IPVS-FILTER -m set --match-set KUBE-LOAD-BALANCER dst,dst -j RETURN",
                "-A KUBE-IPVS-FILTER -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN",
                "-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP dst,dst -j RETURN",
                "-A KUBE-IPVS-FILTER -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -j RETURN",
                "-A KUBE-IPVS-FILTER -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j RETURN",
                "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable",
            ]
        );
        assert_eq!(chain(Table::Filter, "KUBE-SOURCE-RANGES-FIREWALL"), ["-A KUBE-SOURCE-RANGES-FIREWALL -j DROP"]);
    }

    #[test]
    fn without_a_local_detector_the_nodes_own_connections_are_masqueraded() {
        let mut s = settings();
        s.local_traffic = LocalTraffic::None;
        let f = frame(&s, &sets(), Vec::new());
        let masq: Vec<&Rule> =
            f.rules.iter().filter(|r| r.chain == "KUBE-SERVICES" && r.target == Target::MarkForMasquerade).collect();
        assert_eq!(masq.len(), 1);
        assert!(masq[0].matches.iter().any(|m| matches!(m, Match::Set { dirs, .. } if dirs == &[Src, Dst])));
    }

    /// What is rendered reads back as the same typed rules (iptables-save's
    /// spelling of the set and physdev matches included).
    #[test]
    fn every_rule_reads_back() {
        let mut all = sets();
        all.entries.entry(Kind::ExternalIp).or_default().insert(super::super::sets::Entry::Port(1));
        all.entries.entry(Kind::Slotted).or_default().insert(super::super::sets::Entry::Port(1));
        all.no_node_access.insert(("198.51.100.1".parse().unwrap(), Protocol::Tcp, 80));
        let slot = Rule::chain(Table::Nat, super::super::slots::CHAIN)
            .with(Match::destination_ip("10.96.0.10".parse().unwrap()))
            .with(Match::Protocol(Protocol::Tcp))
            .with(Match::DestinationPort(80))
            .with(Match::ClusterHash { total: 4, node: 2, seed: 9 })
            .target(Target::SetMark { value: 0x3ffe, mask: 0x3fff });
        let f = frame(&settings(), &all, vec![slot]);
        assert!(f.rules.iter().any(|r| r.matches.contains(&Match::PhysdevIsIn { negate: true })));
        assert!(f.rules.iter().any(|r| r.matches.iter().any(|m| matches!(m, Match::IpvsVirtual { .. }))));
        assert!(f.rules.iter().any(|r| r.target == Target::HostJump(super::super::slots::CHAIN.into())));
        let (text, _) = payload(&f, &Ruleset::default(), &[], d(), None);
        let dump = parse_dump(&text, d());
        let mut back = Vec::new();
        for table in Table::ALL {
            for lines in dump.tables[&table].rules.values() {
                for l in lines {
                    match l {
                        Line::Rule(r) => back.push(r.clone()),
                        Line::Foreign { text, reason } => panic!("{text}: {reason}"),
                    }
                }
            }
        }
        let mut want: Vec<Rule> = f.rules.iter().map(|r| r.clone().canonical()).collect();
        let mut back: Vec<Rule> = back.into_iter().map(Rule::canonical).collect();
        let key = |r: &Rule| format!("{r:?}");
        want.sort_by_key(key);
        back.sort_by_key(key);
        assert_eq!(back, want);
    }
}
