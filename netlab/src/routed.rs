//! Hosts attached to a router namespace by /32 (/128) routes: each host
//! owns exactly its addresses, and reaches everything through the router's
//! gateway addresses 169.254.0.1 and fe80::1 (the same on every link).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{Ns, Result};

pub const GATEWAY_V4: &str = "169.254.0.1";
pub const GATEWAY_V6: &str = "fe80::1";

/// Prepares a router namespace: forwarding on, redirects and reverse-path
/// filtering off.
pub fn make_router(router: &Ns) -> Result<()> {
    let mut settings = vec![("ipv4/ip_forward".to_string(), "1"), ("ipv6/conf/all/forwarding".to_string(), "1")];
    for name in router.ipv4_conf_names()? {
        settings.push((format!("ipv4/conf/{name}/send_redirects"), "0"));
        settings.push((format!("ipv4/conf/{name}/rp_filter"), "0"));
    }
    router.net_sysctls(&settings)
}

/// A locally administered MAC address of its own for each link this
/// process makes (the router's neighbour entries name it).
fn next_mac() -> String {
    static LINKS: AtomicU32 = AtomicU32::new(0);
    let n = LINKS.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    format!("02:6b:{:02x}:{:02x}:{:02x}:{:02x}", (pid >> 8) & 0xff, pid & 0xff, (n >> 8) & 0xff, n & 0xff)
}

/// Links `host` to `router`: the router side is `router_if`, the host side
/// `eth0` with `addresses`; routes both ways. Two `ip -batch` runs and no
/// other process (a lab of ten hosts took some 130 `ip` runs before,
/// seconds in the emulated ipvs guest).
pub fn attach(router: &Ns, router_if: &str, host: &Ns, addresses: &[IpAddr]) -> Result<()> {
    let mac = next_mac();
    let mut on_router = vec![
        format!("link add {router_if} type veth peer name eth0 address {mac} netns {}", host.name),
        format!("addr add {GATEWAY_V4}/32 dev {router_if}"),
        format!("addr add {GATEWAY_V6}/64 dev {router_if} nodad"),
        format!("link set {router_if} up"),
    ];
    // Permanent neighbour entries: the first packet's ICMP error must not
    // wait for (and be discarded during) neighbour discovery. Made before
    // the host's end is up: a route needs only this end up, and a
    // permanent entry outlives carrier changes.
    for addr in addresses {
        let len = if addr.is_ipv4() { 32 } else { 128 };
        on_router.push(format!("route add {addr}/{len} dev {router_if}"));
        on_router.push(format!("neigh replace {addr} lladdr {mac} dev {router_if} nud permanent"));
    }
    router.ip_batch(&on_router)?;
    router.net_sysctls(&[(format!("ipv4/conf/{router_if}/rp_filter"), "0")])?;
    // No duplicate address detection on the host's link: while its
    // link-local address is tentative, the host drops early packets (an
    // ICMPv6 error among them).
    let dad: Vec<(String, &'static str)> =
        ["all", "default", "eth0"].iter().map(|c| (format!("ipv6/conf/{c}/accept_dad"), "0")).collect();
    host.net_sysctls(&dad)?;
    let mut on_host = vec![
        "link set eth0 up".to_string(),
        format!("route add {GATEWAY_V4} dev eth0"),
        format!("route add default via {GATEWAY_V4} dev eth0"),
        // The family follows the gateway's address.
        format!("route add default via {GATEWAY_V6} dev eth0"),
    ];
    for addr in addresses {
        on_host.push(match addr {
            IpAddr::V4(_) => format!("addr add {addr}/32 dev eth0"),
            IpAddr::V6(_) => format!("addr add {addr}/128 dev eth0 nodad"),
        });
    }
    host.ip_batch(&on_host)
}
