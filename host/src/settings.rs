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
    let npa = &config.nodeport_addresses;
    let nftables = config.mode == ProxyMode::Nftables;
    if config.mode == ProxyMode::Ipvs && npa.cidrs.is_empty() && !npa.primary {
        // Upstream's ipvs mode: node ports on every address of the node
        // but loopback (the caller leaves kube-ipvs0's out).
        let mut all: Vec<Cidr> = local_addresses
            .iter()
            .filter(|ip| family.matches(ip) && !ip.is_loopback())
            .map(|ip| host_cidr(*ip))
            .collect();
        all.sort_by_key(|c| c.addr);
        all.dedup();
        s.nodeport_addresses = NodePortAddresses::Only(all);
        return s;
    }
    let everything = npa.cidrs.iter().any(|c| c.family() == family && c.prefix_len == 0);
    if nftables && everything {
        // Upstream's nftables mode: 0.0.0.0/0 or ::/0 means every local address.
        s.nodeport_addresses = NodePortAddresses::All;
    } else if npa.primary || (nftables && npa.cidrs.is_empty()) {
        // Upstream's nftables mode defaults to the primary addresses.
        let primary = primary_address(config, node, family).map(host_cidr);
        s.nodeport_addresses = NodePortAddresses::Only(primary.into_iter().collect());
    } else if !npa.cidrs.is_empty() {
        let mut chosen: Vec<Cidr> = local_addresses
            .iter()
            .filter(|ip| family.matches(ip) && npa.cidrs.iter().any(|c| c.contains(ip)))
            .map(|ip| host_cidr(*ip))
            .collect();
        chosen.dedup();
        s.nodeport_addresses = NodePortAddresses::Only(chosen);
    }
    s
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
