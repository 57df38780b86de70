//! Which service ports a full ruleset sends to one of their endpoints:
//! what keeps a replacement component from taking Services away. The host's
//! checks confine what a component writes; they do not require it to write
//! anything, so a replacement is also traced: a packet from outside to
//! each port's cluster IP must end at one of the port's endpoints wherever
//! the running component's rules send it to one.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpx_rules::model::{Cluster, IpFamily, Settings};
use kpx_rules::ops::Ruleset;
use kpx_rules::trace::{self, Ending, Packet};

use crate::kernel::{iptables, nftables};

/// The ports whose cluster IP has endpoints for its traffic.
pub fn required(family: IpFamily, ports: &crate::state::PortMap) -> BTreeSet<String> {
    ports.values().filter(|p| p.view(family).is_some_and(|v| v.has_internal())).map(|p| p.key.clone()).collect()
}

/// The keys among `keys` whose cluster-IP traffic `ruleset` sends to one
/// of the port's endpoints.
pub fn covered(
    settings: &Settings,
    cluster: &Cluster,
    local_addresses: &[IpAddr],
    ports: &crate::state::PortMap,
    keys: &BTreeSet<String>,
    ruleset: &Ruleset,
) -> Result<BTreeSet<String>, String> {
    let family = settings.family;
    let node = trace::Node { local_addresses: local_addresses.to_vec() };
    let source: IpAddr = match family {
        IpFamily::V4 => "203.0.113.1".parse().expect("an address"),
        IpFamily::V6 => "2001:db8::1".parse().expect("an address"),
    };
    type Walk<'a> = Box<dyn Fn(&Packet) -> Result<trace::Trace, String> + 'a>;
    let walk: Walk = match ruleset {
        Ruleset::Iptables(rs) => {
            let tables = iptables::trace_tables(settings, rs)?;
            Box::new(move |p| trace::iptables::trace_iptables(&tables, &node, p).map_err(|e| e.to_string()))
        }
        Ruleset::Nftables(tx) => {
            let model = nftables::trace_model(settings, cluster, crate::state::ports_in(ports), tx)
                .map_err(|e| e.to_string())?;
            Box::new(move |p| trace::nftables::trace_nftables(&model, &node, p).map_err(|e| e.to_string()))
        }
        Ruleset::Ipvs(rs) => {
            return Ok(keys
                .iter()
                .filter(|k| {
                    let Some(view) = ports.get(*k).and_then(|p| p.view(family).map(|v| (p, v))) else { return false };
                    let (port, view) = view;
                    rs.services.iter().any(|vs| {
                        vs.address == view.cluster_ip
                            && vs.port == port.port
                            && vs.protocol == port.protocol
                            && vs
                                .reals
                                .iter()
                                .any(|r| view.internal_endpoints().iter().any(|e| e.ip == r.ip && e.port == r.port))
                    })
                })
                .cloned()
                .collect());
        }
    };
    let mut out = BTreeSet::new();
    for key in keys {
        let Some(port) = ports.get(key) else { continue };
        let Some(view) = port.view(family) else { continue };
        let packet = Packet {
            src: source,
            dst: view.cluster_ip,
            dport: port.port,
            protocol: port.protocol,
            from_node: false,
            in_interface: None,
        };
        let endpoints: BTreeSet<String> = view.internal_endpoints().iter().map(|e| e.host_port()).collect();
        let verdict = walk(&packet)?.verdict;
        if verdict.endings.iter().any(|e| matches!(e, Ending::Endpoint(ep) if endpoints.contains(ep))) {
            out.insert(key.clone());
        }
    }
    Ok(out)
}
