//! The node's own interface addresses (for --nodeport-addresses, the
//! health-check node ports and `kpx trace`), read over rtnetlink: one
//! RTM_GETADDR dump through kpx's netlink socket
//! ([`crate::kernel::netlink`]), no `ip` process.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use netlink_sys::protocols::NETLINK_ROUTE;

use super::netlink::route::{IFA_ADDRESS, IFA_LOCAL, IFADDRMSG, RTM_GETADDR, RTM_NEWADDR};
use super::netlink::{self, NLM_F_DUMP, NLM_F_REQUEST, Socket, nla};
use super::{Error, Result};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// How long the kernel may take to answer the dump's next part.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

fn unreadable(reason: impl std::fmt::Display) -> Error {
    Error::Unreadable { what: "the node's addresses (rtnetlink)".into(), reason: reason.to_string() }
}

/// Why netlink could not read the addresses, as the reason.
fn unreadable_netlink(e: netlink::Error) -> Error {
    match e {
        netlink::Error::Refused { errno, .. } => unreadable(format!("errno {errno}")),
        netlink::Error::Socket { reason, .. } | netlink::Error::Protocol { reason, .. } => unreadable(reason),
        other => unreadable(other),
    }
}

/// A link-local address (169.254/16, fe80::/10): never a node address
/// traffic is sent to.
pub fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    }
}

/// Addresses on this node's interfaces, in the kernel's order.
pub fn local_addresses() -> Result<Vec<IpAddr>> {
    Ok(local_addresses_by_interface()?.into_iter().map(|(_, ip)| ip).collect())
}

/// (interface index, address) for every address on this node's interfaces.
pub fn local_addresses_by_interface() -> Result<Vec<(u32, IpAddr)>> {
    let mut socket = Socket::open(NETLINK_ROUTE, REPLY_TIMEOUT).map_err(unreadable_netlink)?;
    // AF_UNSPEC: both families.
    let body: [&[u8]; 1] = [&[0u8; IFADDRMSG]];
    let op = "listing the node's addresses";
    // The errno the dump's end may carry is not read.
    let (out, _) = socket
        .dump(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, &body, op, |out: &mut Vec<(u32, IpAddr)>, msg_type, p| {
            if msg_type == RTM_NEWADDR {
                let index = p.get(4..8).map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                out.extend(address(p)?.map(|ip| (index, ip)));
            }
            Ok(())
        })
        .map_err(unreadable_netlink)?;
    Ok(out)
}

/// One RTM_NEWADDR's address: IFA_LOCAL where the kernel gives one (the
/// local end of a point-to-point link; IPv4), else IFA_ADDRESS — what
/// `ip addr` shows.
pub fn address(payload: &[u8]) -> std::result::Result<Option<IpAddr>, String> {
    if payload.len() < IFADDRMSG {
        return Err("an address message shorter than ifaddrmsg".into());
    }
    let family = payload[0];
    let attrs = nla::attrs(&payload[IFADDRMSG..])?;
    let Some(a) = nla::find(&attrs, IFA_LOCAL).or_else(|| nla::find(&attrs, IFA_ADDRESS)) else { return Ok(None) };
    Ok(match (family, a.value.len()) {
        (AF_INET, 4) => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(a.value).expect("4 bytes")))),
        (AF_INET6, 16) => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(a.value).expect("16 bytes")))),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a fresh namespace with addresses of both families on a veth,
    /// the dump finds exactly what `ip -o addr show` lists.
    #[test]
    fn reads_what_ip_addr_shows() {
        let mut lab = match kpx_netlab::Lab::new() {
            Ok(lab) => lab,
            Err(kpx_netlab::Error::Unavailable(why)) if !nix::unistd::geteuid().is_root() => {
                return eprintln!("SKIPPED: {why}");
            }
            Err(e) => panic!("{e}"),
        };
        let a = lab.add("addr-a").unwrap();
        let b = lab.add("addr-b").unwrap();
        lab.link(&a, "eth0", "192.0.2.1/24", &b, "eth0", "192.0.2.2/24").unwrap();
        a.ip(&["addr", "add", "fd00:db8::1/64", "dev", "eth0", "nodad"]).unwrap();
        a.ip(&["addr", "add", "198.51.100.7/32", "dev", "lo"]).unwrap();
        a.ip(&["link", "set", "lo", "up"]).unwrap();
        let got = a.enter(local_addresses).unwrap().unwrap();
        let shown = a.ip(&["-o", "addr", "show"]).unwrap();
        let mut want: Vec<IpAddr> = shown
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace().skip_while(|w| *w != "inet" && *w != "inet6");
                w.nth(1).and_then(|a| a.split('/').next()).and_then(|a| a.parse().ok())
            })
            .collect();
        let mut got_sorted = got.clone();
        got_sorted.sort();
        want.sort();
        assert_eq!(got_sorted, want, "ip -o addr show:\n{shown}");
        for ip in ["192.0.2.1", "fd00:db8::1", "198.51.100.7", "127.0.0.1"] {
            assert!(got.contains(&ip.parse().unwrap()), "{ip} missing from {got:?}");
        }
        assert!(!got.contains(&"192.0.2.2".parse().unwrap()), "the other end's address");
    }
}
