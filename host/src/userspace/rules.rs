//! userspace mode's iptables rules, written by the host alone (no plugin
//! can express a REDIRECT, nor a DNAT to a node address): upstream's
//! userspace proxier's chains send a
//! Service's cluster IP, external IPs, load-balancer IPs and node ports to
//! the port kpx listens on for it; traffic to a service port without
//! endpoints is refused (kpx's `KPX-PORTALS-REJECT`, as the other modes
//! refuse it); load-balancer source ranges let only their sources through
//! (the others are dropped, as upstream's firewall chains drop them).

use std::net::IpAddr;

use kpx_rules::iptables::local_traffic_match;
use kpx_rules::model::{Cidr, IpFamily, NodePortAddresses, Protocol, ServicePort, Settings};
use kpx_rules::ops::CtStates;
use kpx_rules::ops::iptables::{AddressMatch, Match, Rule, Table, Target, USERSPACE_HOST_CHAINS};

use std::collections::HashMap;

use super::balancer::Side;
use crate::kernel::iptables::frame::{Frame, localhost_nodeports};
use crate::kernel::iptables::parse::Dump;

const CONTAINER: &str = "KUBE-PORTALS-CONTAINER";
const HOST: &str = "KUBE-PORTALS-HOST";
const NODEPORT_CONTAINER: &str = "KUBE-NODEPORT-CONTAINER";
const NODEPORT_HOST: &str = "KUBE-NODEPORT-HOST";
const NON_LOCAL: &str = "KUBE-NODEPORT-NON-LOCAL";
const REJECT: &str = "KPX-PORTALS-REJECT";

/// One service port as the rules see it: where its listeners are (None:
/// no endpoint to send that side's traffic to, or no listener yet).
pub struct Portal<'a> {
    pub port: &'a ServicePort,
    pub internal: Option<u16>,
    pub external: Option<u16>,
    /// Local external policy: the node's and local pods' traffic to the
    /// external addresses (upstream's short-circuit to cluster endpoints).
    pub cluster: Option<u16>,
}

fn jump(table: Table, from: &str, to: &str, comment: &str, matches: Vec<Match>) -> Rule {
    Rule::chain(table, from).with(Match::comment(comment)).with_all(matches).target(Target::HostJump(to.into()))
}

/// upstream's `iptablesInit` for the userspace proxier, and kpx's refusal
/// chain. `iptables -I` puts the last one first: node ports come after
/// the portals.
pub fn jumps() -> Vec<Rule> {
    use Table::{Filter, Nat};
    let local = || vec![Match::DestinationTypeLocal { negate: false }];
    let new = || vec![Match::Conntrack { negate: false, states: CtStates::NEW }];
    let nodeports = "handle service NodePorts; NOTE: this must be the last rule in the chain";
    let portals = "handle ClusterIPs; NOTE: this must be before the NodePort rules";
    vec![
        jump(Nat, "PREROUTING", NODEPORT_CONTAINER, nodeports, local()),
        jump(Nat, "OUTPUT", NODEPORT_HOST, nodeports, local()),
        jump(Nat, "PREROUTING", CONTAINER, portals, vec![]),
        jump(Nat, "OUTPUT", HOST, portals, vec![]),
        jump(Filter, "INPUT", NON_LOCAL, "Ensure that non-local NodePort traffic can flow", vec![]),
        jump(Filter, "INPUT", REJECT, "kpx: service ports without endpoints", new()),
        jump(Filter, "FORWARD", REJECT, "kpx: service ports without endpoints", new()),
        jump(Filter, "OUTPUT", REJECT, "kpx: service ports without endpoints", new()),
    ]
}

/// The comment on a side's rules: the key, and the side unless it is the
/// cluster IP's (a restarted kpx reads the ports back by it).
pub fn comment(port: &ServicePort, side: Side) -> String {
    match side {
        Side::Internal => port.key.clone(),
        Side::External => format!("{} external", port.key),
        Side::Cluster => format!("{} cluster", port.key),
    }
}

/// The listener ports the kernel's rules redirect to, by comment and
/// protocol: what a restarted kpx listens on again, so that connections
/// conntrack already redirects (UDP flows) keep reaching a listener.
pub fn redirected_ports(dump: &Dump) -> HashMap<(String, Protocol), u16> {
    let mut out = HashMap::new();
    for chain in [CONTAINER, HOST, NODEPORT_CONTAINER, NODEPORT_HOST] {
        for rule in dump.rules(Table::Nat, chain) {
            let Target::Redirect(listener) = rule.target else { continue };
            let comment =
                rule.matches.iter().find_map(|m| if let Match::Comment(c) = m { Some(c.clone()) } else { None });
            let protocol = rule.matches.iter().find_map(|m| if let Match::Protocol(p) = m { Some(*p) } else { None });
            if let (Some(c), Some(p)) = (comment, protocol) {
                out.insert((c, p), listener);
            }
        }
    }
    out
}

fn to(port: &ServicePort, dst: Option<IpAddr>, side: Side) -> Vec<Match> {
    let mut m = vec![Match::comment(comment(port, side))];
    if let Some(ip) = dst {
        m.push(Match::destination_ip(ip));
    }
    m.push(Match::Protocol(port.protocol));
    m.push(Match::DestinationPort(if dst.is_some() { port.port } else { port.node_port }));
    m
}

/// What a side with no listener to send to does: a port with endpoints
/// elsewhere (a Local policy without local ones) drops, as upstream's
/// KUBE-EXT and KUBE-SVL chains do; one with none at all is refused.
fn refusal(port: &ServicePort) -> Target {
    // upstream's hasEndpoints: some endpoint ready, or serving and terminating.
    let has_endpoints =
        port.endpoints.iter().any(|e| e.conditions.ready || (e.conditions.serving && e.conditions.terminating));
    if has_endpoints { Target::Drop } else { Target::Reject }
}

/// The node ports' destinations: every local address (addrtype in the
/// jump, and no loopback unless localhost node ports are on), or the
/// selected addresses.
fn nodeport_destinations(settings: &Settings) -> Vec<Vec<Match>> {
    match &settings.nodeport_addresses {
        NodePortAddresses::All if localhost_nodeports(settings) => vec![vec![]],
        NodePortAddresses::All => {
            let loopback: Cidr =
                if settings.family == IpFamily::V4 { "127.0.0.0/8" } else { "::1/128" }.parse().expect("cidr");
            vec![vec![Match::Destination(AddressMatch { negate: true, cidr: loopback })]]
        }
        NodePortAddresses::Only(cidrs) => cidrs
            .iter()
            .filter(|c| c.family() == settings.family)
            .filter(|c| !c.addr.is_loopback() || localhost_nodeports(settings))
            .map(|c| vec![Match::Destination(AddressMatch { negate: false, cidr: *c })])
            .collect(),
    }
}

/// The rules for these portals: both chains for traffic from elsewhere
/// (PREROUTING) and from the node itself (OUTPUT). TCP from elsewhere is
/// sent to `node:listener` when the node has an address (`node`), as
/// REDIRECT needs an address on the interface a packet came in through
/// (a CNI's host-side veths may have none); the node's own traffic, and
/// UDP (whose replies leave from the address routing picks, which must
/// be the one the datagram was sent to), are redirected.
pub fn frame(portals: &[Portal], settings: &Settings, node: Option<IpAddr>) -> Frame {
    use Table::{Filter, Nat};
    let mut rules = Vec::new();
    let nat = |chain: &str, matches: &[Match], listener: u16| {
        let tcp = matches.contains(&Match::Protocol(Protocol::Tcp));
        let target = match node {
            Some(ip) if tcp && (chain == CONTAINER || chain == NODEPORT_CONTAINER) => Target::Dnat(ip, listener),
            _ => Target::Redirect(listener),
        };
        Rule::chain(Nat, chain).with_all(matches.to_vec()).target(target)
    };
    let local_pods = local_traffic_match(settings, false);
    for p in portals {
        let port = p.port;
        if port.protocol == Protocol::Sctp {
            continue;
        }
        // The cluster IP.
        if let Some(ip) = port.cluster_ip {
            match p.internal {
                Some(listener) => {
                    rules.push(nat(CONTAINER, &to(port, Some(ip), Side::Internal), listener));
                    rules.push(nat(HOST, &to(port, Some(ip), Side::Internal), listener));
                }
                None => rules.push(
                    Rule::chain(Filter, REJECT).with_all(to(port, Some(ip), Side::Internal)).target(refusal(port)),
                ),
            }
        }
        // The external addresses: external IPs and load-balancer IPs (with
        // their source ranges), and the node port on the node's addresses.
        // (what to match, the chains for others' and the node's traffic,
        // the source ranges: None for any source)
        type Destination<'c> = (Vec<Match>, [&'c str; 2], Vec<Option<Cidr>>);
        let mut external: Vec<Destination> = Vec::new();
        for ip in &port.external_ips {
            external.push((to(port, Some(*ip), Side::External), [CONTAINER, HOST], vec![None]));
        }
        for ip in &port.load_balancer_ips {
            let ranges: Vec<Option<Cidr>> = if port.load_balancer_source_ranges.is_empty() {
                vec![None]
            } else {
                let mine = port.load_balancer_source_ranges.iter().filter(|r| r.family() == IpFamily::of(ip));
                mine.map(|r| Some(*r)).collect()
            };
            external.push((to(port, Some(*ip), Side::External), [CONTAINER, HOST], ranges));
        }
        if port.node_port != 0 {
            for destination in nodeport_destinations(settings) {
                let mut matches = to(port, None, Side::External);
                matches.splice(1..1, destination);
                external.push((matches, [NODEPORT_CONTAINER, NODEPORT_HOST], vec![None]));
            }
        }
        for (matches, [container, host], ranges) in external {
            // Source ranges of the other family only: nobody is let through.
            let restricted = ranges.iter().any(Option::is_some) || ranges.is_empty();
            for range in &ranges {
                let mut m = matches.clone();
                if let Some(cidr) = range {
                    m.insert(1, Match::Source(AddressMatch { negate: false, cidr: *cidr }));
                }
                // Local policy: the node's own and local pods' traffic goes
                // to the cluster endpoints.
                if let Some(listener) = p.cluster {
                    let mut m = m.clone();
                    m[0] = Match::comment(comment(port, Side::Cluster));
                    if let Some(local) = &local_pods {
                        let mut pods = m.clone();
                        pods.insert(1, local.clone());
                        rules.push(nat(container, &pods, listener));
                    }
                    rules.push(nat(host, &m, listener));
                }
                if let Some(listener) = p.external {
                    rules.push(nat(container, &m, listener));
                    rules.push(nat(host, &m, listener));
                }
            }
            // What was not redirected: refused, dropped, or outside the
            // source ranges (dropped, as upstream's firewall chains do).
            let mut m = matches;
            if container == NODEPORT_CONTAINER && !m.iter().any(|x| matches!(x, Match::Destination(a) if !a.negate)) {
                m.push(Match::DestinationTypeLocal { negate: false });
            }
            let target = if p.external.is_some() && restricted { Target::Drop } else { refusal(port) };
            if p.external.is_none() || restricted {
                rules.push(Rule::chain(Filter, REJECT).with_all(m).target(target));
            }
        }
        // The listeners take what was redirected to them, and nothing else:
        // reached directly, a listener would serve a ClusterIP-only
        // Service from outside, past source ranges and Local policies.
        for (side, listener) in [(Side::Internal, p.internal), (Side::External, p.external), (Side::Cluster, p.cluster)]
        {
            let Some(listener) = listener else { continue };
            for (negate, target) in [(false, Target::Accept), (true, Target::Drop)] {
                rules.push(
                    Rule::chain(Filter, NON_LOCAL)
                        .with(Match::comment(comment(port, side)))
                        .with(Match::Protocol(port.protocol))
                        .with(Match::Conntrack { negate, states: CtStates::DNAT })
                        .with(Match::DestinationPort(listener))
                        .target(target),
                );
            }
        }
    }
    Frame { chains: USERSPACE_HOST_CHAINS.to_vec(), rules, trailing: Vec::new(), jumps: jumps() }
}

#[cfg(test)]
mod tests {
    use kpx_rules::model::{Endpoint, LocalTraffic, ProxyMode};

    use super::*;
    use crate::kernel::iptables::render::payload;
    use crate::syntax::iptables::Dialect;

    fn d4() -> Dialect {
        Dialect { family: IpFamily::V4, masquerade_mark: 0x4000 }
    }

    fn settings() -> Settings {
        let mut s = Settings::new(IpFamily::V4, ProxyMode::Userspace);
        s.localhost_nodeports = false;
        s
    }

    fn lines(portals: &[Portal], settings: &Settings) -> Vec<String> {
        let (text, _) = payload(&frame(portals, settings, None), &Default::default(), &[], d4(), None);
        text.lines().filter(|l| l.starts_with("-A")).map(str::to_string).collect()
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    #[test]
    fn cluster_ip_external_ip_and_node_port_go_to_their_listeners() {
        let mut port = ServicePort::new("ns1", "web", "p80", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![Endpoint::ready("10.180.0.1".parse().unwrap(), 8080)]);
        port.cluster_ip = Some("172.30.0.41".parse().unwrap());
        port.external_ips = vec!["192.0.2.10".parse().unwrap()];
        port.node_port = 30080;
        let portal = Portal { port: &port, internal: Some(36001), external: Some(36002), cluster: None };
        let got = lines(&[portal], &settings());
        let want = [
            "-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment \"ns1/web:p80\" -m conntrack --ctstate DNAT -m tcp --dport 36001 -j ACCEPT",
            "-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment \"ns1/web:p80 external\" -m conntrack --ctstate DNAT -m tcp --dport 36002 -j ACCEPT",
            // Reached directly (not redirected), a listener takes nothing.
            "-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment \"ns1/web:p80\" -m conntrack ! --ctstate DNAT -m tcp --dport 36001 -j DROP",
            "-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment \"ns1/web:p80 external\" -m conntrack ! --ctstate DNAT -m tcp --dport 36002 -j DROP",
            "-A KUBE-PORTALS-CONTAINER -d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 80 -j REDIRECT --to-ports 36001",
            "-A KUBE-PORTALS-HOST -d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 80 -j REDIRECT --to-ports 36001",
            "-A KUBE-PORTALS-CONTAINER -d 192.0.2.10/32 -p tcp -m comment --comment \"ns1/web:p80 external\" -m tcp --dport 80 -j REDIRECT --to-ports 36002",
            "-A KUBE-PORTALS-HOST -d 192.0.2.10/32 -p tcp -m comment --comment \"ns1/web:p80 external\" -m tcp --dport 80 -j REDIRECT --to-ports 36002",
            // No localhost node ports unless asked for (iptables mode's flag).
            "-A KUBE-NODEPORT-CONTAINER ! -d 127.0.0.0/8 -p tcp -m comment --comment \"ns1/web:p80 external\" -m tcp --dport 30080 -j REDIRECT --to-ports 36002",
            "-A KUBE-NODEPORT-HOST ! -d 127.0.0.0/8 -p tcp -m comment --comment \"ns1/web:p80 external\" -m tcp --dport 30080 -j REDIRECT --to-ports 36002",
        ];
        assert_eq!(sorted(got.clone()), sorted(want.iter().map(|s| s.to_string()).collect()), "{got:#?}");
        let mut localhost = settings();
        localhost.localhost_nodeports = true;
        let got =
            lines(&[Portal { port: &port, internal: Some(36001), external: Some(36002), cluster: None }], &localhost);
        assert!(got.contains(&"-A KUBE-NODEPORT-HOST -p tcp -m comment --comment \"ns1/web:p80 external\" -m tcp --dport 30080 -j REDIRECT --to-ports 36002".to_string()), "{got:#?}");
    }

    #[test]
    fn ports_without_endpoints_are_refused_and_source_ranges_drop_the_rest() {
        let mut port = ServicePort::new("ns1", "lb", "", Protocol::Udp, 53);
        port.cluster_ip = Some("172.30.0.42".parse().unwrap());
        port.load_balancer_ips = vec!["198.51.100.7".parse().unwrap()];
        port.load_balancer_source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
        port.node_port = 30053;
        let none = lines(&[Portal { port: &port, internal: None, external: None, cluster: None }], &settings());
        assert!(
            none.iter().all(|l| l.starts_with("-A KPX-PORTALS-REJECT")
                && l.ends_with("-j REJECT --reject-with icmp-port-unreachable")),
            "{none:#?}"
        );
        assert_eq!(none.len(), 3);
        assert!(none.iter().any(|l| l.contains("-m addrtype --dst-type LOCAL") && l.contains("--dport 30053")));
        let mut only = settings();
        only.nodeport_addresses = NodePortAddresses::Only(vec!["192.168.0.2/32".parse().unwrap()]);
        let some = lines(&[Portal { port: &port, internal: Some(36001), external: Some(36002), cluster: None }], &only);
        for want in [
            "-A KUBE-PORTALS-CONTAINER -s 203.0.113.0/25 -d 198.51.100.7/32 -p udp -m comment --comment \"ns1/lb external\" -m udp --dport 53 -j REDIRECT --to-ports 36002",
            "-A KPX-PORTALS-REJECT -d 198.51.100.7/32 -p udp -m comment --comment \"ns1/lb external\" -m udp --dport 53 -j DROP",
            "-A KUBE-NODEPORT-CONTAINER -d 192.168.0.2/32 -p udp -m comment --comment \"ns1/lb external\" -m udp --dport 30053 -j REDIRECT --to-ports 36002",
        ] {
            assert!(some.contains(&want.to_string()), "{want}\n{some:#?}");
        }
    }

    #[test]
    fn local_policy_short_circuits_the_node_and_local_pods_and_drops_the_rest() {
        let mut port = ServicePort::new("ns1", "loc", "", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![Endpoint::ready("10.180.0.1".parse().unwrap(), 8080)]);
        port.external_ips = vec!["192.0.2.10".parse().unwrap()];
        port.external_traffic_policy = kpx_rules::model::TrafficPolicy::Local;
        let mut s = settings();
        s.local_traffic = LocalTraffic::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
        // No local endpoint: only the node and local pods are redirected
        // (to the cluster endpoints); everyone else is dropped.
        let got = lines(&[Portal { port: &port, internal: None, external: None, cluster: Some(36003) }], &s);
        for want in [
            "-A KUBE-PORTALS-CONTAINER -s 10.0.0.0/8 -d 192.0.2.10/32 -p tcp -m comment --comment \"ns1/loc cluster\" -m tcp --dport 80 -j REDIRECT --to-ports 36003",
            "-A KUBE-PORTALS-HOST -d 192.0.2.10/32 -p tcp -m comment --comment \"ns1/loc cluster\" -m tcp --dport 80 -j REDIRECT --to-ports 36003",
            "-A KPX-PORTALS-REJECT -d 192.0.2.10/32 -p tcp -m comment --comment \"ns1/loc external\" -m tcp --dport 80 -j DROP",
        ] {
            assert!(got.contains(&want.to_string()), "{want}\n{got:#?}");
        }
        assert_eq!(got.iter().filter(|l| l.contains("REDIRECT")).count(), 2, "{got:#?}");
    }

    #[test]
    fn traffic_from_elsewhere_goes_to_the_node_address_when_there_is_one() {
        let mut port = ServicePort::new("ns1", "web", "p80", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![Endpoint::ready("10.180.0.1".parse().unwrap(), 8080)]);
        port.cluster_ip = Some("172.30.0.41".parse().unwrap());
        port.node_port = 30080;
        let portal = Portal { port: &port, internal: Some(36001), external: Some(36002), cluster: None };
        let frame = frame(&[portal], &settings(), Some("192.168.0.2".parse().unwrap()));
        let (text, _) = payload(&frame, &Default::default(), &[], d4(), None);
        for want in [
            "-A KUBE-PORTALS-CONTAINER -d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 80 -j DNAT --to-destination 192.168.0.2:36001",
            "-A KUBE-PORTALS-HOST -d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 80 -j REDIRECT --to-ports 36001",
            "-A KUBE-NODEPORT-CONTAINER ! -d 127.0.0.0/8 -p tcp -m comment --comment \"ns1/web:p80 external\" -m tcp --dport 30080 -j DNAT --to-destination 192.168.0.2:36002",
        ] {
            assert!(text.lines().any(|l| l == want), "{want}\n{text}");
        }
    }

    #[test]
    fn source_ranges_of_the_other_family_only_let_nobody_through() {
        let mut port = ServicePort::new("ns1", "lb", "", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![Endpoint::ready("10.180.0.1".parse().unwrap(), 8080)]);
        port.load_balancer_ips = vec!["198.51.100.7".parse().unwrap()];
        port.load_balancer_source_ranges = vec!["2001:db8::/64".parse().unwrap()];
        let got = lines(&[Portal { port: &port, internal: None, external: Some(36002), cluster: None }], &settings());
        assert!(!got.iter().any(|l| l.contains("REDIRECT")), "{got:#?}");
        assert!(got.contains(&"-A KPX-PORTALS-REJECT -d 198.51.100.7/32 -p tcp -m comment --comment \"ns1/lb external\" -m tcp --dport 80 -j DROP".to_string()), "{got:#?}");
    }
}
