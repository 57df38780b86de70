//! userspace mode's iptables rules, written by the host alone (no plugin
//! can express a REDIRECT): upstream's userspace proxier's chains send a
//! Service's cluster IP, external IPs, load-balancer IPs and node ports to
//! the port kpx listens on for it; traffic to a service port without
//! endpoints is refused (kpx's `KPX-PORTALS-REJECT`, as the other modes
//! refuse it); load-balancer source ranges let only their sources through
//! (the others are dropped, as upstream's firewall chains drop them).

use std::net::IpAddr;

use kpx_rules::model::{Protocol, ServicePort};
use kpx_rules::ops::CtStates;
use kpx_rules::ops::iptables::{AddressMatch, Match, Rule, Table, Target, USERSPACE_HOST_CHAINS};

use crate::kernel::iptables::frame::Frame;

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
}

/// Which node addresses node ports answer on.
pub enum NodePorts<'a> {
    /// Every local address (`-m addrtype --dst-type LOCAL`).
    All,
    /// Only these (`--nodeport-addresses`).
    Only(&'a [IpAddr]),
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

fn to(port: &ServicePort, dst: Option<IpAddr>) -> Vec<Match> {
    let mut m = vec![Match::comment(port.key.clone())];
    if let Some(ip) = dst {
        m.push(Match::destination_ip(ip));
    }
    m.push(Match::Protocol(port.protocol));
    m.push(Match::DestinationPort(if dst.is_some() { port.port } else { port.node_port }));
    m
}

/// The rules for these portals: both chains for traffic from elsewhere
/// (PREROUTING) and from the node itself (OUTPUT).
pub fn frame(portals: &[Portal], nodeports: &NodePorts) -> Frame {
    use Table::{Filter, Nat};
    let mut rules = Vec::new();
    let redirect = |rules: &mut Vec<Rule>, matches: Vec<Match>, listener: u16, chains: [&str; 2]| {
        for chain in chains {
            rules.push(Rule::chain(Nat, chain).with_all(matches.clone()).target(Target::Redirect(listener)));
        }
    };
    for p in portals {
        let port = p.port;
        if port.protocol == Protocol::Sctp {
            continue;
        }
        // The cluster IP.
        if let Some(ip) = port.cluster_ip {
            match p.internal {
                Some(listener) => redirect(&mut rules, to(port, Some(ip)), listener, [CONTAINER, HOST]),
                None => rules.push(Rule::chain(Filter, REJECT).with_all(to(port, Some(ip))).target(Target::Reject)),
            }
        }
        // External IPs and load-balancer IPs (with their source ranges).
        let external = port.external_ips.iter().map(|ip| (ip, false));
        let balancers = port.load_balancer_ips.iter().map(|ip| (ip, true));
        for (ip, balancer) in external.chain(balancers) {
            let matches = to(port, Some(*ip));
            match p.external {
                Some(listener) if balancer && !port.load_balancer_source_ranges.is_empty() => {
                    for range in &port.load_balancer_source_ranges {
                        if range.family() != port_family(ip) {
                            continue;
                        }
                        let mut m = matches.clone();
                        m.insert(1, Match::Source(AddressMatch { negate: false, cidr: *range }));
                        redirect(&mut rules, m, listener, [CONTAINER, HOST]);
                    }
                    // The sources outside the ranges were not redirected.
                    rules.push(Rule::chain(Filter, REJECT).with_all(matches).target(Target::Drop));
                }
                Some(listener) => redirect(&mut rules, matches, listener, [CONTAINER, HOST]),
                None => rules.push(Rule::chain(Filter, REJECT).with_all(matches).target(Target::Reject)),
            }
        }
        // The node port, on the node's addresses.
        if port.node_port != 0 {
            let addresses: Vec<Option<IpAddr>> = match nodeports {
                NodePorts::All => vec![None],
                NodePorts::Only(ips) => ips.iter().map(|ip| Some(*ip)).collect(),
            };
            for address in addresses {
                let mut matches = to(port, None);
                if let Some(ip) = address {
                    matches.insert(1, Match::destination_ip(ip));
                }
                match p.external {
                    Some(listener) => redirect(&mut rules, matches, listener, [NODEPORT_CONTAINER, NODEPORT_HOST]),
                    None => {
                        if address.is_none() {
                            matches.push(Match::DestinationTypeLocal { negate: false });
                        }
                        rules.push(Rule::chain(Filter, REJECT).with_all(matches).target(Target::Reject));
                    }
                }
            }
        }
        // The listeners take what was redirected to them.
        for listener in [p.internal, p.external].into_iter().flatten() {
            rules.push(
                Rule::chain(Filter, NON_LOCAL)
                    .with(Match::comment(port.key.clone()))
                    .with(Match::Protocol(port.protocol))
                    .with(Match::Conntrack { negate: false, states: CtStates::DNAT })
                    .with(Match::DestinationPort(listener))
                    .target(Target::Accept),
            );
        }
    }
    Frame { chains: USERSPACE_HOST_CHAINS.to_vec(), rules, trailing: Vec::new(), jumps: jumps() }
}

fn port_family(ip: &IpAddr) -> kpx_rules::model::IpFamily {
    kpx_rules::model::IpFamily::of(ip)
}

#[cfg(test)]
mod tests {
    use kpx_rules::model::{Endpoint, IpFamily};

    use super::*;
    use crate::kernel::iptables::render::{Dialect, payload};

    fn d4() -> Dialect {
        Dialect { family: IpFamily::V4, masquerade_mark: 0x4000 }
    }

    fn lines(portals: &[Portal], nodeports: &NodePorts) -> Vec<String> {
        let text = payload(&frame(portals, nodeports), &Default::default(), &[], d4());
        text.lines().filter(|l| l.starts_with("-A")).map(str::to_string).collect()
    }

    #[test]
    fn cluster_ip_external_ip_and_node_port_go_to_their_listeners() {
        let mut port = ServicePort::new("ns1", "web", "p80", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![Endpoint::ready("10.180.0.1".parse().unwrap(), 8080)]);
        port.cluster_ip = Some("172.30.0.41".parse().unwrap());
        port.external_ips = vec!["192.0.2.10".parse().unwrap()];
        port.node_port = 30080;
        let got = lines(&[Portal { port: &port, internal: Some(36001), external: Some(36002) }], &NodePorts::All);
        let want = [
            "-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment \"ns1/web:p80\" -m conntrack --ctstate DNAT -m tcp --dport 36001 -j ACCEPT",
            "-A KUBE-NODEPORT-NON-LOCAL -p tcp -m comment --comment \"ns1/web:p80\" -m conntrack --ctstate DNAT -m tcp --dport 36002 -j ACCEPT",
            "-A KUBE-PORTALS-CONTAINER -d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 80 -j REDIRECT --to-ports 36001",
            "-A KUBE-PORTALS-HOST -d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 80 -j REDIRECT --to-ports 36001",
            "-A KUBE-PORTALS-CONTAINER -d 192.0.2.10/32 -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 80 -j REDIRECT --to-ports 36002",
            "-A KUBE-PORTALS-HOST -d 192.0.2.10/32 -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 80 -j REDIRECT --to-ports 36002",
            "-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 30080 -j REDIRECT --to-ports 36002",
            "-A KUBE-NODEPORT-HOST -p tcp -m comment --comment \"ns1/web:p80\" -m tcp --dport 30080 -j REDIRECT --to-ports 36002",
        ];
        let mut got_sorted = got.clone();
        got_sorted.sort();
        let mut want_sorted: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want_sorted.sort();
        assert_eq!(got_sorted, want_sorted, "{got:#?}");
    }

    #[test]
    fn ports_without_endpoints_are_refused_and_source_ranges_drop_the_rest() {
        let mut port = ServicePort::new("ns1", "lb", "", Protocol::Udp, 53);
        port.cluster_ip = Some("172.30.0.42".parse().unwrap());
        port.load_balancer_ips = vec!["198.51.100.7".parse().unwrap()];
        port.load_balancer_source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
        port.node_port = 30053;
        let none = lines(&[Portal { port: &port, internal: None, external: None }], &NodePorts::All);
        assert!(
            none.iter().all(|l| l.starts_with("-A KPX-PORTALS-REJECT")
                && l.ends_with("-j REJECT --reject-with icmp-port-unreachable")),
            "{none:#?}"
        );
        assert_eq!(none.len(), 3);
        assert!(none.iter().any(|l| l.contains("-m addrtype --dst-type LOCAL") && l.contains("--dport 30053")));
        let only = ["192.168.0.2".parse().unwrap()];
        let some =
            lines(&[Portal { port: &port, internal: Some(36001), external: Some(36002) }], &NodePorts::Only(&only));
        assert!(some.contains(&"-A KUBE-PORTALS-CONTAINER -s 203.0.113.0/25 -d 198.51.100.7/32 -p udp -m comment --comment \"ns1/lb\" -m udp --dport 53 -j REDIRECT --to-ports 36002".to_string()), "{some:#?}");
        assert!(some.contains(&"-A KPX-PORTALS-REJECT -d 198.51.100.7/32 -p udp -m comment --comment \"ns1/lb\" -m udp --dport 53 -j DROP".to_string()), "{some:#?}");
        assert!(some.contains(&"-A KUBE-NODEPORT-CONTAINER -d 192.168.0.2/32 -p udp -m comment --comment \"ns1/lb\" -m udp --dport 30053 -j REDIRECT --to-ports 36002".to_string()), "{some:#?}");
    }
}
