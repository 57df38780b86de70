//! The settings each family's plugin instance is built with, derived from
//! the configuration, this Node (pod CIDRs, primary address) and the
//! node's own interface addresses (for --nodeport-addresses). When they
//! change, the proxier builds a fresh instance.

use std::net::IpAddr;

use kpx_rules::model::{Cidr, IpFamily, LocalTraffic, Node, NodePortAddresses, ProxyMode, Settings};

use crate::config::{Config, DetectLocalMode};

fn host_cidr(ip: IpAddr) -> Cidr {
    Cidr { addr: ip, prefix_len: if ip.is_ipv4() { 32 } else { 128 } }
}

/// The node's primary address of a family: --bind-address, else the
/// first address of the Node object. Plugins see it as the node's first
/// address (see `node_for_plugins`).
pub fn primary_address(config: &Config, node: &Node, family: IpFamily) -> Option<IpAddr> {
    config
        .bind_address
        .filter(|ip| family.matches(ip))
        .or_else(|| node.addresses.iter().copied().find(|ip| family.matches(ip)))
}

/// Settings for one family. `local_addresses`: the node's interface
/// addresses, which --nodeport-addresses CIDRs select from.
pub fn settings_for(config: &Config, family: IpFamily, node: &Node, local_addresses: &[IpAddr]) -> Settings {
    let mut s = Settings::new(family, config.mode);
    s.masquerade_all = config.masquerade_all;
    s.masquerade_bit = config.masquerade_bit;
    // Localhost node ports are an iptables-mode feature (userspace mode
    // serves them through its OUTPUT redirects).
    s.localhost_nodeports =
        config.localhost_nodeports && matches!(config.mode, ProxyMode::Iptables | ProxyMode::Userspace);
    s.conntrack_tcp_be_liberal = config.node_tcp_be_liberal;
    s.local_traffic = match &config.detect_local_mode {
        DetectLocalMode::None => LocalTraffic::None,
        DetectLocalMode::ClusterCidr => cidrs(config.cluster_cidrs.iter().copied(), family),
        DetectLocalMode::NodeCidr => cidrs(node.pod_cidrs.iter().copied(), family),
        DetectLocalMode::BridgeInterface(name) => LocalTraffic::BridgeInterface(name.clone()),
        DetectLocalMode::InterfaceNamePrefix(prefix) => LocalTraffic::InterfaceNamePrefix(prefix.clone()),
    };
    if config.mode == ProxyMode::Ipvs {
        let scheduler = if config.ipvs.scheduler.is_empty() { "rr" } else { &config.ipvs.scheduler };
        s.extra.push(("ipvs-scheduler".into(), scheduler.to_string()));
    }
    // The operator's parameters of the backend (--backend-param).
    s.extra.extend(config.backend_params.iter().map(|(k, v)| (format!("param.{k}"), v.clone())));
    s.nodeport_addresses = nodeport_addresses(config, family, node, local_addresses);
    s.localhost_nodeport_rejects = config.localhost_rejects(family);
    s.nfacct = config.nfacct && config.mode == ProxyMode::Iptables;
    s
}

/// The node addresses of `family` that accept node ports, as upstream's
/// `NodePortAddresses` selects them: the family's CIDRs (`primary` being
/// the node's primary address of the family, unless loopback) matched
/// against the node's interface addresses; a family with no CIDR, or with
/// a /0, accepts them on every address. ipvs mode with nothing given: every
/// address but loopback, listed (its virtual servers need addresses).
fn nodeport_addresses(config: &Config, family: IpFamily, node: &Node, local: &[IpAddr]) -> NodePortAddresses {
    let npa = &config.nodeport_addresses;
    if config.mode == ProxyMode::Ipvs && npa.is_empty() {
        let mut all: Vec<Cidr> =
            local.iter().filter(|ip| family.matches(ip) && !ip.is_loopback()).map(|ip| host_cidr(*ip)).collect();
        all.sort_by_key(|c| c.addr);
        all.dedup();
        return NodePortAddresses::Only(all);
    }
    // upstream's nftables mode defaults to `primary`.
    let primary = npa.primary || (config.mode == ProxyMode::Nftables && npa.is_empty());
    let mut wanted: Vec<Cidr> = npa.cidrs.iter().filter(|c| c.family() == family).copied().collect();
    if primary && let Some(ip) = primary_address(config, node, family).filter(|ip| !ip.is_loopback()) {
        wanted.push(host_cidr(ip));
    }
    if wanted.is_empty() || wanted.iter().any(|c| c.prefix_len == 0) {
        return NodePortAddresses::All;
    }
    let mut chosen: Vec<Cidr> = local
        .iter()
        .filter(|ip| family.matches(ip) && wanted.iter().any(|c| c.contains(ip)))
        .map(|ip| host_cidr(*ip))
        .collect();
    chosen.sort_by_key(|c| c.addr);
    chosen.dedup();
    NodePortAddresses::Only(chosen)
}

fn cidrs(all: impl Iterator<Item = Cidr>, family: IpFamily) -> LocalTraffic {
    let mine: Vec<Cidr> = all.filter(|c| c.family() == family).collect();
    if mine.is_empty() { LocalTraffic::None } else { LocalTraffic::Cidrs(mine) }
}

/// The node as plugins see it: the primary address first.
pub fn node_for_plugins(config: &Config, mut node: Node, family: IpFamily) -> Node {
    if let Some(primary) = primary_address(config, &node, family) {
        node.addresses.retain(|ip| *ip != primary);
        node.addresses.insert(0, primary);
    }
    node
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Flags;
    use clap::Parser;

    fn config(args: &[&str]) -> Config {
        let mut all = vec!["kpx", "--hostname-override", "node-a"];
        all.extend_from_slice(args);
        Flags::try_parse_from(all).unwrap().validate().unwrap()
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn only(list: &[&str]) -> NodePortAddresses {
        NodePortAddresses::Only(list.iter().map(|a| host_cidr(a.parse().unwrap())).collect())
    }

    /// upstream's `NewNodePortAddresses` per family, with KEP-6032's
    /// keywords: a family without a CIDR accepts every address.
    #[test]
    fn nodeport_addresses_per_family_as_upstream() {
        let node = Node { addresses: ips(&["192.168.0.2", "fd00::2"]), ..Default::default() };
        let local = ips(&["127.0.0.1", "::1", "192.168.0.2", "192.168.1.2", "10.9.0.1", "fd00::2", "fd00:1::2"]);
        let npa = |mode: &str, flag: &str, family: IpFamily| {
            let mut args = vec!["--proxy-mode", mode];
            if !flag.is_empty() {
                args.extend(["--nodeport-addresses", flag]);
            }
            settings_for(&config(&args), family, &node, &local).nodeport_addresses
        };
        use IpFamily::{V4, V6};
        // Nothing given: every address in iptables mode, the primary in nftables mode.
        assert_eq!(npa("iptables", "", V4), NodePortAddresses::All);
        assert_eq!(npa("nftables", "", V4), only(&["192.168.0.2"]));
        assert_eq!(npa("nftables", "", V6), only(&["fd00::2"]));
        // CIDRs of one family leave the other accepting everywhere.
        assert_eq!(npa("iptables", "192.168.0.0/16", V4), only(&["192.168.0.2", "192.168.1.2"]));
        assert_eq!(npa("iptables", "192.168.0.0/16", V6), NodePortAddresses::All);
        // Keywords mixed with CIDRs.
        assert_eq!(npa("nftables", "primary,10.0.0.0/8", V4), only(&["10.9.0.1", "192.168.0.2"]));
        assert_eq!(npa("nftables", "primary,localhost", V4), only(&["127.0.0.1", "192.168.0.2"]));
        assert_eq!(npa("nftables", "primary,localhost", V6), only(&["::1", "fd00::2"]));
        assert_eq!(npa("iptables", "all", V4), NodePortAddresses::All);
        assert_eq!(npa("nftables", "localhost,all", V6), NodePortAddresses::All);
        // A primary address that no interface holds selects nothing.
        let elsewhere = Node { addresses: ips(&["203.0.113.9"]), ..Default::default() };
        let c = config(&["--proxy-mode", "nftables"]);
        assert_eq!(settings_for(&c, V4, &elsewhere, &local).nodeport_addresses, only(&[]));
        // No primary of a family (a single-stack Node): that family accepts everywhere.
        let v4_only = Node { addresses: ips(&["192.168.0.2"]), ..Default::default() };
        assert_eq!(settings_for(&c, V6, &v4_only, &local).nodeport_addresses, NodePortAddresses::All);
    }
}
