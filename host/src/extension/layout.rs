//! What the host writes for an extension, mode-independent: per
//! attachment, the Service port destinations that lead to the port's own
//! chain; per port chain, its rules; and the counters and rate limits
//! they share. Names are hashes of what they hold, so a name says
//! everything about its object: a counter keeps its count and a rate
//! limit its bucket for as long as the same rule asks for them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpx_rules::model::{Cidr, IpFamily, NodePortAddresses, Protocol, ProxyMode, ServicePort, Settings};
use kpx_rules::ops::extension::{Action, Attachment, Rate, Ruleset, SourceMatch};

/// Characters of a hash in a name: 10 base32 characters, 50 bits (a
/// collision, about 1 in 10^7 at 10,000 ports, is salted away).
pub const HASH_CHARS: usize = 10;

/// Where a Service port's connections are told apart.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Destination {
    /// An address of the port (cluster IP, external IP, load-balancer IP).
    Address(IpAddr),
    /// The node port on this node's node-port addresses, as kube-proxy's
    /// own capture has them in the mode: `only` None is every local
    /// address but `except` (loopback, where the mode serves no node port
    /// there); else these CIDRs.
    NodePort { only: Option<Vec<Cidr>>, except: Option<Cidr> },
}

/// One way into a port chain: connections to `destination`, `protocol`,
/// `port` (the node port for [`Destination::NodePort`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    pub destination: Destination,
    pub protocol: Protocol,
    pub port: u16,
    /// The port chain's id.
    pub chain: String,
}

/// What one kernel rule of an entry tests, besides the protocol and the
/// port (the packet's before DNAT, the original one after).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// The packet's destination is (`negate`: is not) in the CIDR.
    Destination { negate: bool, cidr: Cidr },
    /// The packet's destination is a local address.
    Local,
    /// The connection's original destination is in the CIDR.
    OriginalDestination(Cidr),
}

impl Entry {
    /// The kernel rules this entry becomes at `attachment`, each as what
    /// it tests: before DNAT the packet's destination, after it (the
    /// `service` attachment) the connection's original one.
    pub fn tests(&self, attachment: Attachment) -> Vec<Vec<Test>> {
        let after_dnat = attachment == Attachment::Service;
        let is = |cidr| Test::Destination { negate: false, cidr };
        match (&self.destination, after_dnat) {
            (Destination::Address(ip), false) => vec![vec![is(Cidr::host(*ip))]],
            (Destination::Address(ip), true) => vec![vec![Test::OriginalDestination(Cidr::host(*ip))]],
            (Destination::NodePort { only: None, except }, false) => {
                let mut tests = vec![Test::Local];
                tests.extend(except.map(|cidr| Test::Destination { negate: true, cidr }));
                vec![tests]
            }
            (Destination::NodePort { only: Some(cidrs), .. }, false) => {
                cidrs.iter().map(|c| vec![is(*c), Test::Local]).collect()
            }
            // `destinations` leaves these out: nothing tells them apart.
            (Destination::NodePort { only: None, .. }, true) => vec![],
            (Destination::NodePort { only: Some(cidrs), .. }, true) => {
                cidrs.iter().map(|c| vec![Test::OriginalDestination(*c)]).collect()
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainRule {
    pub source: Option<SourceMatch>,
    /// A rate limit's id.
    pub limit: Option<String>,
    /// A counter's id.
    pub counter: Option<String>,
    /// With a counter: the id of iptables' chain that counts and acts
    /// (one per counter, table and verdict; an accept's is entered by a
    /// goto, see extension/iptables.rs).
    pub counter_chain: Option<String>,
    pub action: Action,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortChain {
    pub service: String,
    pub attachment: Attachment,
    /// The service port's protocol: only its packets enter the chain, so
    /// a reject of a TCP port's connection can answer with a reset.
    pub protocol: Protocol,
    pub rules: Vec<ChainRule>,
}

/// A named counter: its service port and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Counter {
    pub service: String,
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Per attachment with rules: the ways into the port chains.
    pub entries: BTreeMap<Attachment, Vec<Entry>>,
    /// Port chains by id.
    pub chains: BTreeMap<String, PortChain>,
    /// Counters by id.
    pub counters: BTreeMap<String, Counter>,
    /// Rate limits by id.
    pub limits: BTreeMap<String, Rate>,
    /// Per attachment before DNAT: addresses of the state's Service ports
    /// (any port's, with rules or not) whose protocol and port a node-port
    /// entry has. They are another Service's traffic if the address is the
    /// node's: they return before the node-port entries see them.
    pub exempt: BTreeMap<Attachment, Vec<(IpAddr, Protocol, u16)>>,
}

/// A name's hash: base32 of SHA-256 over the parts, `HASH_CHARS` long.
pub fn hash(parts: &[&str]) -> String {
    kpx_rules::hash::name_hash(parts, HASH_CHARS)
}

/// The destinations of `port` at `attachment`.
fn destinations(port: &ServicePort, attachment: Attachment, settings: &Settings) -> Vec<(Destination, u16)> {
    let mut out = Vec::new();
    if attachment == Attachment::Firewall {
        out.extend(port.load_balancer_ips.iter().map(|ip| (Destination::Address(*ip), port.port)));
        return out;
    }
    out.extend(port.addresses().map(|ip| (Destination::Address(*ip), port.port)));
    // After DNAT only the original destination tells a node port's
    // connections apart: at `service`, only when --nodeport-addresses
    // names CIDRs to match it with.
    if port.node_port != 0
        && let Some(d) = node_port_destination(settings)
        && !(attachment == Attachment::Service && matches!(d, Destination::NodePort { only: None, .. }))
    {
        out.push((d, port.node_port));
    }
    out.sort();
    out.dedup();
    out
}

/// Where the mode serves node ports, as kube-proxy's own capture does:
/// loopback only in iptables mode with localhost node ports (IPv4).
fn node_port_destination(settings: &Settings) -> Option<Destination> {
    let localhost =
        settings.mode == ProxyMode::Iptables && crate::kernel::iptables::frame::localhost_nodeports(settings);
    let loopback: Cidr = match settings.family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    }
    .parse()
    .expect("loopback");
    match &settings.nodeport_addresses {
        NodePortAddresses::All => Some(Destination::NodePort { only: None, except: (!localhost).then_some(loopback) }),
        NodePortAddresses::Only(c) => {
            let c: Vec<Cidr> = c
                .iter()
                .filter(|c| c.family() == settings.family && (localhost || !c.addr.is_loopback()))
                .copied()
                .collect();
            (!c.is_empty()).then_some(Destination::NodePort { only: Some(c), except: None })
        }
    }
}

/// An id for the object `parts` describe, unique among `used` (its owner
/// recorded there): the hash, salted in the unlikely case another object
/// has it.
fn unique_id(used: &mut BTreeMap<String, String>, parts: &[&str]) -> String {
    let owner = parts.join("\0");
    for salt in 0u32.. {
        let id = if salt == 0 {
            hash(parts)
        } else {
            let salt = salt.to_string();
            let mut salted = parts.to_vec();
            salted.push(&salt);
            hash(&salted)
        };
        match used.get(&id) {
            Some(o) if *o != owner => continue,
            _ => {
                used.insert(id.clone(), owner);
                return id;
            }
        }
    }
    unreachable!("some salt is free")
}

/// The layout of a checked ruleset (validate::extension) for the ports
/// the extension was sent.
pub fn build(
    extension: &str,
    settings: &Settings,
    ruleset: &Ruleset,
    ports: &crate::state::PortMap,
    skipped: &crate::validate::extension::Skipped,
) -> Layout {
    let mut out = Layout::default();
    // Every id of the extension in one namespace: iptables names port and
    // counter chains alike.
    let mut used: BTreeMap<String, String> = BTreeMap::new();
    // A rule's position among its port's rules at its attachment: a limit
    // keeps its bucket while other ports' rules come and go.
    let mut position: BTreeMap<(&str, Attachment), usize> = BTreeMap::new();
    for rule in &ruleset.rules {
        let Some(port) = ports.get(&rule.service).filter(|_| !skipped.contains_key(&rule.service)) else { continue };
        let chain = unique_id(&mut used, &[extension, "port", rule.attachment.name(), &rule.service]);
        let n = position.entry((rule.service.as_str(), rule.attachment)).or_default();
        let index = *n;
        *n += 1;
        let limit = rule.over_rate.map(|r| {
            let id = unique_id(
                &mut used,
                &[
                    extension,
                    "limit",
                    rule.attachment.name(),
                    &rule.service,
                    &index.to_string(),
                    &r.per_second.to_string(),
                    &r.burst.to_string(),
                ],
            );
            out.limits.insert(id.clone(), r);
            id
        });
        let counter = rule.counter.as_ref().map(|name| {
            let id = unique_id(&mut used, &[extension, "counter", &rule.service, name]);
            out.counters.insert(id.clone(), Counter { service: rule.service.clone(), name: name.clone() });
            id
        });
        let counter_chain = counter.as_ref().map(|c| {
            let table = if rule.attachment == Attachment::Service { "filter" } else { "mangle" };
            // Named by what the chain does, its verdict whole: a kept chain
            // is never written again, so a port whose protocol changed (a
            // TCP reject is a reset, any other an ICMP error) gets a chain
            // of its own rather than the old verdict.
            let verdict = match (rule.action, port.protocol) {
                (Action::Reject, Protocol::Tcp) => "reject with tcp reset".to_string(),
                (action, _) => format!("{action:?}"),
            };
            unique_id(&mut used, &[extension, "counter-chain", table, c, &verdict])
        });
        let new_chain = !out.chains.contains_key(&chain);
        out.chains
            .entry(chain.clone())
            .or_insert_with(|| PortChain {
                service: rule.service.clone(),
                attachment: rule.attachment,
                protocol: port.protocol,
                rules: vec![],
            })
            .rules
            .push(ChainRule { source: rule.source, limit, counter_chain, counter, action: rule.action });
        if new_chain {
            let entries = out.entries.entry(rule.attachment).or_default();
            for (destination, number) in destinations(port, rule.attachment, settings) {
                entries.push(Entry { destination, protocol: port.protocol, port: number, chain: chain.clone() });
            }
        }
    }
    for entries in out.entries.values_mut() {
        entries.sort();
    }
    // After DNAT (`service`) no node-port entry reads the address.
    for (attachment, entries) in out.entries.iter().filter(|(a, _)| **a != Attachment::Service) {
        let node_ports: std::collections::BTreeSet<(Protocol, u16)> = entries
            .iter()
            .filter(|e| matches!(e.destination, Destination::NodePort { .. }))
            .map(|e| (e.protocol, e.port))
            .collect();
        if node_ports.is_empty() {
            continue;
        }
        let mut exempt: Vec<(IpAddr, Protocol, u16)> = ports
            .values()
            .filter(|p| node_ports.contains(&(p.protocol, p.port)))
            .flat_map(|p| p.addresses().map(move |ip| (*ip, p.protocol, p.port)))
            .collect();
        exempt.sort();
        exempt.dedup();
        if !exempt.is_empty() {
            out.exempt.insert(*attachment, exempt);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::ops::extension::Rule;

    fn port() -> ServicePort {
        let mut p = ServicePort::new("ns", "web", "http", Protocol::Tcp, 80);
        p.cluster_ip = Some("10.96.0.10".parse().unwrap());
        p.load_balancer_ips = vec!["192.0.2.1".parse().unwrap()];
        p.node_port = 30080;
        p
    }

    fn rule(attachment: Attachment, counter: Option<&str>, rate: Option<u32>) -> Rule {
        Rule {
            attachment,
            service: "ns/web:http".into(),
            source: None,
            over_rate: rate.map(|r| Rate { per_second: r, burst: r }),
            counter: counter.map(str::to_string),
            action: if rate.is_some() { Action::Drop } else { Action::Continue },
        }
    }

    #[test]
    fn every_destination_leads_to_one_port_chain_per_attachment() {
        let ports = BTreeMap::from([("ns/web:http".to_string(), Box::new(port()))]);
        let rules = vec![
            rule(Attachment::BeforeDispatch, Some("all"), None),
            rule(Attachment::BeforeDispatch, Some("dropped"), Some(5)),
            rule(Attachment::Firewall, Some("all"), None),
        ];
        let layout = build(
            "x",
            &Settings::new(kpx_rules::model::IpFamily::V4, kpx_rules::model::ProxyMode::Nftables),
            &Ruleset { rules },
            &ports,
            &Default::default(),
        );
        assert_eq!(layout.chains.len(), 2);
        let dispatch = &layout.entries[&Attachment::BeforeDispatch];
        let kinds: Vec<_> = dispatch.iter().map(|e| (&e.destination, e.port)).collect();
        assert_eq!(kinds.len(), 3, "{kinds:?}");
        let loopback = "127.0.0.0/8".parse().unwrap();
        let node_port = Destination::NodePort { only: None, except: Some(loopback) };
        assert!(dispatch.iter().any(|e| e.destination == node_port && e.port == 30080), "{dispatch:?}");
        let firewall = &layout.entries[&Attachment::Firewall];
        assert_eq!(firewall.len(), 1);
        assert_eq!(firewall[0].destination, Destination::Address("192.0.2.1".parse().unwrap()));
        assert!(layout.exempt.is_empty(), "no other port has the node port's number");
        // One counter named twice is one object; the rate limit is its own.
        assert_eq!(layout.counters.len(), 2);
        assert_eq!(layout.limits.len(), 1);
    }

    #[test]
    fn names_change_with_what_they_hold() {
        let ports = BTreeMap::from([("ns/web:http".to_string(), Box::new(port()))]);
        let a = build(
            "x",
            &Settings::new(kpx_rules::model::IpFamily::V4, kpx_rules::model::ProxyMode::Nftables),
            &Ruleset { rules: vec![rule(Attachment::Service, None, Some(5))] },
            &ports,
            &Default::default(),
        );
        let b = build(
            "x",
            &Settings::new(kpx_rules::model::IpFamily::V4, kpx_rules::model::ProxyMode::Nftables),
            &Ruleset { rules: vec![rule(Attachment::Service, None, Some(6))] },
            &ports,
            &Default::default(),
        );
        assert_eq!(a.chains.keys().collect::<Vec<_>>(), b.chains.keys().collect::<Vec<_>>());
        assert_ne!(a.limits.keys().collect::<Vec<_>>(), b.limits.keys().collect::<Vec<_>>());
        let c = build(
            "y",
            &Settings::new(kpx_rules::model::IpFamily::V4, kpx_rules::model::ProxyMode::Nftables),
            &Ruleset { rules: vec![rule(Attachment::Service, None, Some(5))] },
            &ports,
            &Default::default(),
        );
        assert_ne!(a.chains.keys().collect::<Vec<_>>(), c.chains.keys().collect::<Vec<_>>());
    }

    #[test]
    fn another_services_address_on_the_node_ports_number_returns_first() {
        let mut other = ServicePort::new("ns", "other", "", Protocol::Tcp, 30080);
        other.external_ips = vec!["192.168.100.1".parse().unwrap()];
        let ports =
            BTreeMap::from([("ns/web:http".to_string(), Box::new(port())), ("ns/other".to_string(), Box::new(other))]);
        let settings = Settings::new(kpx_rules::model::IpFamily::V4, kpx_rules::model::ProxyMode::Nftables);
        let rules =
            vec![rule(Attachment::BeforeDispatch, Some("all"), None), rule(Attachment::Service, Some("n"), None)];
        let layout = build("x", &settings, &Ruleset { rules }, &ports, &Default::default());
        let want = vec![("192.168.100.1".parse().unwrap(), Protocol::Tcp, 30080)];
        assert_eq!(layout.exempt.get(&Attachment::BeforeDispatch), Some(&want));
        assert!(!layout.exempt.contains_key(&Attachment::Service), "after DNAT no node-port entry reads the address");
    }
}
