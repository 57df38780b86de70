//! Stale UDP and SCTP conntrack entries, found in a dump of the table and
//! deleted after a sync, as upstream's conntrack reconciler does
//! (pkg/proxy/conntrack/cleanup.go, kube-proxy 1.32 and later).
//!
//! A UDP "connection" lives as long as datagrams keep coming: a DNS
//! client sending from one port keeps hitting the endpoint conntrack
//! chose first, even after that endpoint left the Service, because the
//! rules are only consulted for a connection's first packet. So after
//! each sync, an entry is deleted when
//!
//! - its original destination is a Service destination (a cluster,
//!   external or load-balancer IP and the port, or any address on the
//!   node port) and its reply comes from none of the port's serving
//!   endpoints (all of them, whatever the traffic policies and topology
//!   pick): the endpoint it was sent to left or is no longer serving, or
//!   the entry was made before the Service had an endpoint (no DNAT: the
//!   reply "comes from" the Service's own address). A Service without
//!   serving endpoints loses every entry to its addresses
//!   (kubernetes/kubernetes#139629), not those to its node port (a node
//!   port's entries are told apart by the port alone);
//! - or its original destination was a Service address at the last
//!   reconcile and is none now: the Service left, or its cluster IP,
//!   external IPs or load-balancer IPs changed (#141371, v1.38). A node
//!   port that is gone loses the entries kpx DNATed there (kpx's: upstream
//!   leaves them to expire).
//!
//! TCP is left alone: a TCP connection to a departed endpoint fails on
//! its own and its client reconnects through the rules.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use kpx_rules::model::{IpFamily, Protocol, ServicePort};

use super::table::{Tuple, dump_protocols, protocol_number};
use crate::kernel::netlink::Error;

/// A Service destination: protocol number, address (None: any address,
/// a node port), port.
type Destination = (u8, Option<IpAddr>, u16);

/// The UDP and SCTP destinations of a family's service ports, each with
/// the endpoints its rules send to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Destinations {
    serving: HashMap<Destination, HashSet<(IpAddr, u16)>>,
}

impl Destinations {
    /// The destinations of `ports` (of one family).
    pub fn of<'a>(ports: impl IntoIterator<Item = &'a ServicePort>, family: IpFamily) -> Destinations {
        let mut d = Destinations::default();
        for port in ports {
            if port.protocol == Protocol::Tcp {
                continue;
            }
            let Some(view) = port.view(family) else { continue };
            let proto = protocol_number(port.protocol);
            let endpoints: HashSet<(IpAddr, u16)> =
                port.endpoints.iter().filter(|e| e.conditions.serving).map(|e| (e.ip, e.port)).collect();
            let addresses = std::iter::once(view.cluster_ip).chain(view.external_ips.iter().copied());
            let addresses = addresses.chain(view.load_balancer_ips.iter().copied());
            let mut add = |dest: Destination| d.serving.entry(dest).or_default().extend(endpoints.iter().copied());
            for ip in addresses {
                add((proto, Some(ip), port.port));
            }
            if port.node_port != 0 {
                add((proto, None, port.node_port));
            }
        }
        d
    }

    pub fn is_empty(&self) -> bool {
        self.serving.is_empty()
    }

    /// The serving endpoints of `orig`'s destination, if it is a Service
    /// destination, and whether it is one as a node port.
    fn serving(&self, orig: &Tuple) -> Option<(bool, &HashSet<(IpAddr, u16)>)> {
        let (proto, _, _, dst, dport) = *orig;
        match self.serving.get(&(proto, Some(dst), dport)) {
            Some(e) => Some((false, e)),
            None => self.serving.get(&(proto, None, dport)).map(|e| (true, e)),
        }
    }
}

/// The entries of `entries` (original tuple, reply tuple) to delete,
/// given the destinations now and at the last reconcile.
pub fn stale<'a>(
    entries: impl IntoIterator<Item = &'a (Tuple, Tuple)>,
    now: &Destinations,
    before: &Destinations,
) -> Vec<Tuple> {
    let mut out = Vec::new();
    for (orig, reply) in entries {
        if !matches!(orig.0, 17 | 132) {
            continue;
        }
        let from = (reply.1, reply.2);
        let dnat = from != (orig.3, orig.4);
        let delete = match now.serving(orig) {
            // A node port with no endpoints keeps its entries (upstream
            // clears only service IPs then); otherwise an entry not to a
            // serving endpoint goes.
            Some((true, endpoints)) if endpoints.is_empty() => false,
            Some((_, endpoints)) => !endpoints.contains(&from),
            None => match before.serving(orig) {
                Some((false, _)) => true,
                Some((true, _)) => dnat,
                None => false,
            },
        };
        if delete {
            out.push(*orig);
        }
    }
    out
}

/// What one reconcile did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    /// Entries of the family's table read.
    pub read: usize,
    /// Entries deleted (gone by the time of the delete counts too).
    pub deleted: usize,
}

/// Deletes the stale entries of `family`'s table in the current network
/// namespace; `before` becomes `now` when the reconcile ran.
pub fn reconcile(family: IpFamily, now: &Destinations, before: &mut Destinations) -> Result<Reconciled, Error> {
    if now.is_empty() && before.is_empty() {
        return Ok(Reconciled::default());
    }
    // Only the protocols of the destinations (UDP, SCTP): the kernel
    // filters the dump, so a table of TCP connections is not read.
    let protocols: std::collections::BTreeSet<u8> =
        now.serving.keys().chain(before.serving.keys()).map(|(proto, _, _)| *proto).collect();
    let protocols: Vec<u8> = protocols.into_iter().collect();
    let (entries, _) = dump_protocols(family, &protocols)?;
    let doomed = stale(&entries, now, before);
    let deleted = super::table::delete(family, &doomed)?;
    *before = now.clone();
    Ok(Reconciled { read: entries.len(), deleted })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::Endpoint;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const UDP: u8 = 17;

    fn dns(endpoints: &[&str]) -> ServicePort {
        let mut p = ServicePort::new("kube-system", "dns", "dns", Protocol::Udp, 53);
        p.cluster_ip = Some(ip("10.96.0.10"));
        p.external_ips = vec![ip("192.0.2.10")];
        p.node_port = 30053;
        p.endpoints = endpoints.iter().map(|e| Endpoint::ready(ip(e), 5353)).collect();
        p.cluster_endpoints = (0..endpoints.len() as u32).collect();
        p
    }

    /// A flow from the client's port `sport` to `dst:dport`, answered by `from`.
    fn flow(proto: u8, sport: u16, dst: &str, dport: u16, from: (&str, u16)) -> (Tuple, Tuple) {
        let client = ip("192.168.100.2");
        ((proto, client, sport, ip(dst), dport), (proto, ip(from.0), from.1, client, sport))
    }

    #[test]
    fn entries_to_endpoints_that_left_go_and_the_rest_stay() {
        let before = Destinations::of(&[dns(&["10.244.1.5", "10.244.2.5"])], IpFamily::V4);
        let now = Destinations::of(&[dns(&["10.244.2.5"])], IpFamily::V4);
        let entries = [
            // To the endpoint that left, through each destination: deleted.
            flow(UDP, 1000, "10.96.0.10", 53, ("10.244.1.5", 5353)),
            flow(UDP, 1001, "192.0.2.10", 53, ("10.244.1.5", 5353)),
            flow(UDP, 1002, "192.168.0.2", 30053, ("10.244.1.5", 5353)),
            // To the one that stays: kept.
            flow(UDP, 1003, "10.96.0.10", 53, ("10.244.2.5", 5353)),
            // Made before the Service had an endpoint (no DNAT): deleted.
            flow(UDP, 1004, "10.96.0.10", 53, ("10.96.0.10", 53)),
            // TCP, and another destination: kept.
            flow(6, 1005, "10.96.0.10", 53, ("10.244.1.5", 5353)),
            flow(UDP, 1006, "10.96.0.11", 53, ("10.244.1.5", 5353)),
            flow(UDP, 1007, "10.96.0.10", 54, ("10.244.1.5", 5353)),
        ];
        let doomed: Vec<u16> = stale(&entries, &now, &before).iter().map(|t| t.2).collect();
        assert_eq!(doomed, [1000, 1001, 1002, 1004]);
    }

    /// kubernetes/kubernetes#139629: a UDP Service without serving
    /// endpoints loses every entry to its addresses, not to its node port.
    #[test]
    fn a_service_without_endpoints_loses_its_addresses_entries() {
        let now = Destinations::of(&[dns(&[])], IpFamily::V4);
        let entries = [
            flow(UDP, 1000, "10.96.0.10", 53, ("10.96.0.10", 53)),
            flow(UDP, 1001, "10.96.0.10", 53, ("10.244.1.5", 5353)),
            flow(UDP, 1002, "192.168.0.2", 30053, ("10.244.1.5", 5353)),
        ];
        let doomed: Vec<u16> = stale(&entries, &now, &now).iter().map(|t| t.2).collect();
        assert_eq!(doomed, [1000, 1001]);
    }

    /// Upstream's reconciler counts every serving endpoint, whichever the
    /// rules pick (topology, traffic policies): a terminating one still
    /// serving keeps its entries; one no longer serving loses them.
    #[test]
    fn every_serving_endpoint_keeps_its_entries() {
        let mut p = dns(&["10.244.1.5", "10.244.2.5", "10.244.3.5"]);
        p.cluster_endpoints = vec![0];
        p.endpoints[1].conditions.ready = false;
        p.endpoints[1].conditions.terminating = true;
        p.endpoints[2].conditions.ready = false;
        p.endpoints[2].conditions.serving = false;
        p.endpoints[2].conditions.terminating = true;
        let now = Destinations::of(&[p], IpFamily::V4);
        let entries = [
            flow(UDP, 1000, "10.96.0.10", 53, ("10.244.2.5", 5353)),
            flow(UDP, 1001, "10.96.0.10", 53, ("10.244.3.5", 5353)),
        ];
        let doomed: Vec<u16> = stale(&entries, &now, &now).iter().map(|t| t.2).collect();
        assert_eq!(doomed, [1001]);
    }

    /// A deleted (or moved) UDP Service's addresses lose every entry
    /// (kubernetes/kubernetes#141371); a node port that is gone, the
    /// entries kpx DNATed there.
    #[test]
    fn entries_to_a_destination_that_is_gone_go() {
        let before = Destinations::of(&[dns(&["10.244.1.5"])], IpFamily::V4);
        let mut moved = dns(&["10.244.1.5"]);
        moved.cluster_ip = Some(ip("10.96.0.20"));
        moved.node_port = 0;
        let now = Destinations::of(&[moved], IpFamily::V4);
        let entries = [
            flow(UDP, 1000, "10.96.0.10", 53, ("10.244.1.5", 5353)),
            flow(UDP, 1001, "192.168.0.2", 30053, ("10.244.1.5", 5353)),
            // The old address's entries go, DNATed or not.
            flow(UDP, 1002, "10.96.0.10", 53, ("10.96.0.10", 53)),
            flow(UDP, 1003, "10.96.0.20", 53, ("10.244.1.5", 5353)),
            // On the old node port, never DNATed: someone else's, kept.
            flow(UDP, 1004, "192.168.0.2", 30053, ("192.168.0.2", 30053)),
        ];
        let doomed: Vec<u16> = stale(&entries, &now, &before).iter().map(|t| t.2).collect();
        assert_eq!(doomed, [1000, 1001, 1002]);
    }

    #[test]
    fn sctp_counts_and_local_endpoints_serve_too() {
        let mut p = dns(&["10.244.1.5", "10.244.2.5"]);
        p.protocol = Protocol::Sctp;
        p.cluster_endpoints = vec![0];
        p.local_endpoints = vec![1];
        let now = Destinations::of(&[p], IpFamily::V4);
        let entries = [
            flow(132, 1000, "10.96.0.10", 53, ("10.244.2.5", 5353)),
            flow(132, 1001, "10.96.0.10", 53, ("10.244.3.5", 5353)),
        ];
        let doomed: Vec<u16> = stale(&entries, &now, &now).iter().map(|t| t.2).collect();
        assert_eq!(doomed, [1001]);
    }
}
