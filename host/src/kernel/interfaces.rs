//! The node's own interface addresses (for --nodeport-addresses, the
//! health-check node ports and `kpx trace`), read over rtnetlink: one
//! RTM_GETADDR dump, on the same netlink stack as nf_tables
//! (netlink-sys, netlink-packet-core), no `ip` process.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer};
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

use super::netlink::nla;
use super::{Error, Result};

const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
/// `struct ifaddrmsg`: family, prefix length, flags, scope, interface index.
const IFADDRMSG: usize = 8;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const HEADER: usize = 16;

fn unreadable(reason: impl std::fmt::Display) -> Error {
    Error::Unreadable { what: "the node's addresses (rtnetlink)".into(), reason: reason.to_string() }
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
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(unreadable)?;
    socket.bind_auto().map_err(unreadable)?;
    let timeout = nix::sys::time::TimeVal::new(5, 0);
    nix::sys::socket::setsockopt(
        &std::os::fd::AsFd::as_fd(&socket),
        nix::sys::socket::sockopt::ReceiveTimeout,
        &timeout,
    )
    .map_err(unreadable)?;
    let seq = std::process::id();
    let mut request = Vec::with_capacity(HEADER + IFADDRMSG);
    request.extend_from_slice(&((HEADER + IFADDRMSG) as u32).to_ne_bytes());
    request.extend_from_slice(&RTM_GETADDR.to_ne_bytes());
    request.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    request.extend_from_slice(&seq.to_ne_bytes());
    request.extend_from_slice(&0u32.to_ne_bytes());
    request.extend_from_slice(&[0u8; IFADDRMSG]); // AF_UNSPEC: both families
    socket.send(&request, 0).map_err(unreadable)?;
    let mut out = Vec::new();
    loop {
        let mut buf: Vec<u8> = Vec::with_capacity(1 << 16);
        let n = socket.recv(&mut buf, 0).map_err(unreadable)?;
        let mut at = 0;
        while at + HEADER <= n.min(buf.len()) {
            let msg = NetlinkBuffer::new_checked(&buf[at..]).map_err(unreadable)?;
            let len = msg.length() as usize;
            if len < HEADER {
                return Err(unreadable("a message shorter than its header"));
            }
            if msg.sequence_number() == seq {
                match msg.message_type() {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        let code = msg.payload().get(..4).map(|b| i32::from_ne_bytes(b.try_into().unwrap_or([0; 4])));
                        if code.is_some_and(|c| c != 0) {
                            return Err(unreadable(format!("errno {}", -code.unwrap_or(0))));
                        }
                    }
                    RTM_NEWADDR => {
                        let p = msg.payload();
                        let index = p.get(4..8).map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        out.extend(address(p).map_err(unreadable)?.map(|ip| (index, ip)));
                    }
                    _ => {}
                }
            }
            at += (len + 3) & !3;
        }
    }
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
