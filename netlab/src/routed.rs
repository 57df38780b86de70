//! Hosts attached to a router namespace by /32 (/128) routes: each host
//! owns exactly its addresses, and reaches everything through the router's
//! gateway addresses 169.254.0.1 and fe80::1 (the same on every link).

use std::net::IpAddr;

use crate::{Ns, Result};

pub const GATEWAY_V4: &str = "169.254.0.1";
pub const GATEWAY_V6: &str = "fe80::1";

/// Prepares a router namespace: forwarding on, redirects and reverse-path
/// filtering off.
pub fn make_router(router: &Ns) -> Result<()> {
    router.exec(&[
        "sh",
        "-c",
        "echo 1 > /proc/sys/net/ipv4/ip_forward; \
         echo 1 > /proc/sys/net/ipv6/conf/all/forwarding; \
         for f in /proc/sys/net/ipv4/conf/*/send_redirects; do echo 0 > $f; done; \
         for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done",
    ])?;
    Ok(())
}

/// Links `host` to `router`: the router side is `router_if`, the host side
/// `eth0` with `addresses`; routes both ways.
pub fn attach(router: &Ns, router_if: &str, host: &Ns, addresses: &[IpAddr]) -> Result<()> {
    router.ip(&["link", "add", router_if, "type", "veth", "peer", "name", "eth0", "netns", &host.name])?;
    router.ip(&["addr", "add", &format!("{GATEWAY_V4}/32"), "dev", router_if])?;
    router.ip(&["-6", "addr", "add", &format!("{GATEWAY_V6}/64"), "dev", router_if, "nodad"])?;
    router.ip(&["link", "set", router_if, "up"])?;
    router.exec(&["sh", "-c", &format!("echo 0 > /proc/sys/net/ipv4/conf/{router_if}/rp_filter")])?;
    // No duplicate address detection on the host's link: while its
    // link-local address is tentative, the host drops early packets (an
    // ICMPv6 error among them).
    host.exec(&["sh", "-c", "for c in all default eth0; do echo 0 > /proc/sys/net/ipv6/conf/$c/accept_dad; done"])?;
    host.ip(&["link", "set", "eth0", "up"])?;
    host.ip(&["route", "add", GATEWAY_V4, "dev", "eth0"])?;
    host.ip(&["route", "add", "default", "via", GATEWAY_V4, "dev", "eth0"])?;
    host.ip(&["-6", "route", "add", "default", "via", GATEWAY_V6, "dev", "eth0"])?;
    // Permanent neighbour entries: the first packet's ICMP error must not
    // wait for (and be discarded during) neighbour discovery.
    let link = host.ip(&["-o", "link", "show", "eth0"])?;
    let mac = link.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).unwrap_or_default().to_string();
    for addr in addresses {
        let (len, v6) = if addr.is_ipv4() { ("32", false) } else { ("128", true) };
        let cidr = format!("{addr}/{len}");
        if v6 {
            host.ip(&["-6", "addr", "add", &cidr, "dev", "eth0", "nodad"])?;
        } else {
            host.ip(&["addr", "add", &cidr, "dev", "eth0"])?;
        }
        router.ip(&["route", "add", &cidr, "dev", router_if])?;
        if !mac.is_empty() {
            let ip = addr.to_string();
            router.ip(&["neigh", "replace", &ip, "lladdr", &mac, "dev", router_if, "nud", "permanent"])?;
        }
    }
    Ok(())
}
