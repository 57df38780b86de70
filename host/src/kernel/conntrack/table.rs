//! The conntrack table over ctnetlink: a dump of a family's entries, the
//! deletion of entries by their original tuple ([`super::stale`]), and
//! live load: connections per endpoint of each Service destination, as
//! IPVS counts its own (established TCP connections are active, every
//! other entry inactive).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpx_rules::model::{IpFamily, ServicePort};

use crate::kernel::netlink::Error;
use crate::kernel::netlink::nfnl::Nfnl;
use crate::kernel::netlink::nla::{Attr, Writer, attrs, find};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_PROTOINFO: u16 = 4;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
/// `CTA_FILTER_F_CTA_PROTO_NUM` (net/netfilter/nf_internals.h, ABI since
/// Linux 5.8): the dump keeps entries of the tuple's protocol.
const CTA_FILTER_F_CTA_PROTO_NUM: u32 = 1 << 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const TCP_CONNTRACK_ESTABLISHED: u8 = 3;

/// One tuple: (protocol, source, source port, destination, destination port).
pub type Tuple = (u8, IpAddr, u16, IpAddr, u16);

fn family_code(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => 2,
        IpFamily::V6 => 10,
    }
}

/// Every entry of `family`'s table in the current network namespace:
/// (original tuple, reply tuple, an established TCP connection). Entries
/// it cannot read are skipped.
pub fn dump_entries(family: IpFamily) -> Result<Vec<(Tuple, Tuple, bool)>, Error> {
    let mut nl = Nfnl::open()?;
    let replies = nl.dump_from(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET, family_code(family), &Writer::new())?;
    Ok(replies.iter().filter_map(|r| parse_entry(r).ok()).collect())
}

/// [`dump_entries`] without the TCP state: (original, reply).
pub fn dump(family: IpFamily) -> Result<Vec<(Tuple, Tuple)>, Error> {
    Ok(dump_entries(family)?.into_iter().map(|(o, r, _)| (o, r)).collect())
}

/// The entries of `family`'s table of `protocols`, the kernel filtering
/// each dump by protocol (`CTA_FILTER`, Linux 5.8 and later): on a node
/// whose table holds mostly TCP, a dump of UDP reads a small part of it.
/// Also whether the kernel did filter: one that refuses the filter
/// (EINVAL, EOPNOTSUPP) is dumped whole, once; one that ignores it (an
/// attribute it does not know) answers with the whole table, which is
/// then used for every protocol. The entries are filtered here either way.
pub fn dump_protocols(family: IpFamily, protocols: &[u8]) -> Result<(Vec<(Tuple, Tuple)>, bool), Error> {
    let keep = |entries: Vec<(Tuple, Tuple, bool)>| -> Vec<(Tuple, Tuple)> {
        entries.into_iter().filter(|(o, _, _)| protocols.contains(&o.0)).map(|(o, r, _)| (o, r)).collect()
    };
    let parse = |replies: Vec<Vec<u8>>| -> Vec<(Tuple, Tuple, bool)> {
        replies.iter().filter_map(|r| parse_entry(r).ok()).collect()
    };
    let mut nl = Nfnl::open()?;
    let mut out = Vec::new();
    for &protocol in protocols {
        let mut w = Writer::new();
        w.nested(CTA_TUPLE_ORIG, |w| {
            w.nested(CTA_TUPLE_PROTO, |w| {
                w.bytes(CTA_PROTO_NUM, &[protocol]);
            });
        });
        w.nested(CTA_FILTER, |w| {
            w.bytes(CTA_FILTER_ORIG_FLAGS, &CTA_FILTER_F_CTA_PROTO_NUM.to_ne_bytes());
        });
        let refused = [nix::errno::Errno::EINVAL as i32, nix::errno::Errno::EOPNOTSUPP as i32];
        let entries = match nl.dump_from(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET, family_code(family), &w) {
            Ok(replies) => parse(replies),
            Err(e) if e.errno().is_some_and(|n| refused.contains(&n)) => {
                tracing::debug!(%family, "the kernel refused a conntrack dump filtered by protocol ({e}): reading it whole");
                let whole =
                    nl.dump_from(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET, family_code(family), &Writer::new())?;
                return Ok((keep(parse(whole)), false));
            }
            Err(e) => return Err(e),
        };
        if entries.iter().any(|(o, _, _)| o.0 != protocol) {
            tracing::debug!(%family, "the kernel ignored a conntrack dump's filter: using the whole table it sent");
            return Ok((keep(entries), false));
        }
        out.extend(keep(entries));
    }
    Ok((out, true))
}

/// Deletes the entries whose original tuples are `tuples`; one already
/// gone (ENOENT) is not an error. The number deleted or gone.
pub fn delete(family: IpFamily, tuples: &[Tuple]) -> Result<usize, Error> {
    if tuples.is_empty() {
        return Ok(0);
    }
    let mut nl = Nfnl::open()?;
    let requests: Vec<Writer> = tuples
        .iter()
        .map(|t| {
            let mut w = Writer::new();
            write_tuple(&mut w, CTA_TUPLE_ORIG, t);
            w
        })
        .collect();
    let gone = [nix::errno::Errno::ENOENT as i32];
    nl.requests(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_DELETE, family_code(family), &requests, &gone)?;
    Ok(tuples.len())
}

/// A tuple as ctnetlink takes it.
fn write_tuple(w: &mut Writer, kind: u16, t: &Tuple) {
    let (proto, src, sport, dst, dport) = *t;
    w.nested(kind, |w| {
        w.nested(CTA_TUPLE_IP, |w| {
            match (src, dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => w.bytes(CTA_IP_V4_SRC, &s.octets()).bytes(CTA_IP_V4_DST, &d.octets()),
                (s, d) => w.bytes(CTA_IP_V6_SRC, &v6(s)).bytes(CTA_IP_V6_DST, &v6(d)),
            };
        })
        .nested(CTA_TUPLE_PROTO, |w| {
            w.bytes(CTA_PROTO_NUM, &[proto])
                .bytes(CTA_PROTO_SRC_PORT, &sport.to_be_bytes())
                .bytes(CTA_PROTO_DST_PORT, &dport.to_be_bytes());
        });
    });
}

fn v6(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    }
}

/// (protocol, endpoint address, endpoint port).
type EndpointKey = (u8, IpAddr, u16);
/// (original destination, its port, active, inactive).
type Through = (IpAddr, u16, u32, u32);

/// The connections to each endpoint, by the destination they were sent to.
#[derive(Debug, Default, Clone)]
pub struct Load {
    by_endpoint: HashMap<EndpointKey, Vec<Through>>,
}

impl Load {
    /// Reads the table of one family in the current network namespace.
    pub fn read(family: IpFamily) -> Result<Load, Error> {
        let mut load = Load::default();
        for (orig, reply, established) in dump_entries(family)? {
            // DNATed: the reply comes from elsewhere than the original
            // destination (the endpoint).
            if (reply.1, reply.2) != (orig.3, orig.4) {
                load.add(orig, reply, established);
            }
        }
        Ok(load)
    }

    /// Counts one connection: DNATed when its reply comes from elsewhere
    /// than its original destination (the endpoint).
    pub fn add(&mut self, orig: Tuple, reply: Tuple, established: bool) {
        let (proto, _, _, dst, dport) = orig;
        let (_, ep, eport, _, _) = reply;
        let entry = self.by_endpoint.entry((proto, ep, eport)).or_default();
        let (a, i) = if established { (1, 0) } else { (0, 1) };
        match entry.iter_mut().find(|e| e.0 == dst && e.1 == dport) {
            Some(e) => {
                e.2 += a;
                e.3 += i;
            }
            None => entry.push((dst, dport, a, i)),
        }
    }

    /// (active, inactive) of one endpoint through one service port's
    /// destinations: its cluster IP, external and load-balancer IPs on the
    /// port, and any address on its node port.
    pub fn of(&self, port: &ServicePort, endpoint: IpAddr, endpoint_port: u16) -> (u32, u32) {
        let proto = protocol_number(port.protocol);
        let Some(entries) = self.by_endpoint.get(&(proto, endpoint, endpoint_port)) else { return (0, 0) };
        let service_ip = |ip: &IpAddr| {
            port.cluster_ip.as_ref() == Some(ip)
                || port.external_ips.contains(ip)
                || port.load_balancer_ips.contains(ip)
        };
        entries
            .iter()
            .filter(|(dst, dport, _, _)| {
                (*dport == port.port && service_ip(dst)) || (port.node_port != 0 && *dport == port.node_port)
            })
            .fold((0, 0), |(a, i), e| (a + e.2, i + e.3))
    }
}

pub fn protocol_number(protocol: kpx_rules::model::Protocol) -> u8 {
    match protocol {
        kpx_rules::model::Protocol::Tcp => 6,
        kpx_rules::model::Protocol::Udp => 17,
        kpx_rules::model::Protocol::Sctp => 132,
    }
}

fn tuple(a: Attr) -> Result<Tuple, String> {
    let t = a.nested()?;
    let ip = find(&t, CTA_TUPLE_IP).ok_or("a tuple without addresses")?.nested()?;
    let proto = find(&t, CTA_TUPLE_PROTO).ok_or("a tuple without a protocol")?.nested()?;
    let addr = |v4: u16, v6: u16| -> Result<IpAddr, String> {
        if let Some(a) = find(&ip, v4) {
            let b: [u8; 4] = a.value.try_into().map_err(|_| "an IPv4 address of the wrong size")?;
            return Ok(IpAddr::V4(Ipv4Addr::from(b)));
        }
        let a = find(&ip, v6).ok_or("a tuple without its address")?;
        let b: [u8; 16] = a.value.try_into().map_err(|_| "an IPv6 address of the wrong size")?;
        Ok(IpAddr::V6(Ipv6Addr::from(b)))
    };
    let port = |kind: u16| -> u16 {
        find(&proto, kind).and_then(|a| a.value.try_into().ok()).map(u16::from_be_bytes).unwrap_or(0)
    };
    let num = find(&proto, CTA_PROTO_NUM)
        .and_then(|a| a.value.first().copied())
        .ok_or("a tuple without a protocol number")?;
    Ok((
        num,
        addr(CTA_IP_V4_SRC, CTA_IP_V6_SRC)?,
        port(CTA_PROTO_SRC_PORT),
        addr(CTA_IP_V4_DST, CTA_IP_V6_DST)?,
        port(CTA_PROTO_DST_PORT),
    ))
}

/// One entry (the attributes after the nfgenmsg header): its tuples and
/// whether it is an established TCP connection.
pub fn parse_entry(payload: &[u8]) -> Result<(Tuple, Tuple, bool), String> {
    let top = attrs(payload)?;
    let orig = tuple(find(&top, CTA_TUPLE_ORIG).ok_or("no original tuple")?)?;
    let reply = tuple(find(&top, CTA_TUPLE_REPLY).ok_or("no reply tuple")?)?;
    let established = orig.0 == 6
        && find(&top, CTA_PROTOINFO)
            .and_then(|p| p.nested().ok())
            .and_then(|p| find(&p, CTA_PROTOINFO_TCP))
            .and_then(|t| t.nested().ok())
            .and_then(|t| find(&t, CTA_PROTOINFO_TCP_STATE))
            .and_then(|s| s.value.first().copied())
            == Some(TCP_CONNTRACK_ESTABLISHED);
    Ok((orig, reply, established))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::{Protocol, ServicePort};

    #[test]
    fn counts_per_endpoint_through_the_service_destinations() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let mut port = ServicePort::new("ns", "web", "", Protocol::Tcp, 80);
        port.cluster_ip = Some(ip("10.96.0.10"));
        port.node_port = 30080;
        let mut load = Load::default();
        let ep = ip("10.244.1.5");
        let client = ip("192.168.0.9");
        load.add((6, client, 40000, ip("10.96.0.10"), 80), (6, ep, 8080, client, 40000), true);
        load.add((6, client, 40001, ip("10.96.0.10"), 80), (6, ep, 8080, client, 40001), false);
        load.add((6, client, 40002, ip("192.168.0.1"), 30080), (6, ep, 8080, client, 40002), true);
        // Another Service's connection to the same endpoint does not count.
        load.add((6, client, 40003, ip("10.96.0.11"), 80), (6, ep, 8080, client, 40003), true);
        assert_eq!(load.of(&port, ep, 8080), (2, 1));
        assert_eq!(load.of(&port, ep, 9090), (0, 0));
    }

    /// Builds an entry as the kernel sends it and reads it back.
    #[test]
    fn parses_a_dnat_entry() {
        let tuple = |w: &mut Writer, kind: u16, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16| {
            w.nested(kind, |w| {
                w.nested(CTA_TUPLE_IP, |w| {
                    w.bytes(CTA_IP_V4_SRC, &src).bytes(CTA_IP_V4_DST, &dst);
                })
                .nested(CTA_TUPLE_PROTO, |w| {
                    w.bytes(CTA_PROTO_NUM, &[6])
                        .bytes(CTA_PROTO_SRC_PORT, &sport.to_be_bytes())
                        .bytes(CTA_PROTO_DST_PORT, &dport.to_be_bytes());
                });
            });
        };
        let mut w = Writer::new();
        tuple(&mut w, CTA_TUPLE_ORIG, [192, 168, 0, 9], 40000, [10, 96, 0, 10], 80);
        tuple(&mut w, CTA_TUPLE_REPLY, [10, 244, 1, 5], 8080, [192, 168, 0, 9], 40000);
        w.nested(CTA_PROTOINFO, |w| {
            w.nested(CTA_PROTOINFO_TCP, |w| {
                w.bytes(CTA_PROTOINFO_TCP_STATE, &[TCP_CONNTRACK_ESTABLISHED]);
            });
        });
        let (orig, reply, established) = parse_entry(&w.buf).unwrap();
        assert_eq!(orig.3, IpAddr::from([10, 96, 0, 10]));
        assert_eq!((reply.1, reply.2), (IpAddr::from([10, 244, 1, 5]), 8080));
        assert!(established);
    }
}
