//! EndpointSlices to the endpoints of one service port (upstream's
//! EndpointSliceCache): first address of each endpoint, de-duplicated by
//! address:port, sorted. Of two endpoints with one address:port, one that
//! is not terminating replaces one that is, whichever slice or node each
//! comes from: a pod network may give a new pod the address of one still
//! terminating (upstream's `endpointslicecache.go` since v1.36,
//! kubernetes/kubernetes#135593; before, the first copy or the node-local
//! one won). Otherwise the later copy in slice order wins when it is not
//! terminating, and the first one stays when both are.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::source::service::ServicePort as K8sPort;
use kpx_rules::model::{Conditions, Endpoint, IpFamily};

use super::topology::HintedEndpoint;

pub fn for_port(
    slices: Option<&super::SliceSet>,
    family: IpFamily,
    port: &K8sPort,
    node_name: &str,
) -> Vec<HintedEndpoint> {
    let want_type = match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    };
    let want_name = port.name.as_deref().unwrap_or("");
    let want_protocol = port.protocol.as_deref().unwrap_or("TCP");
    let mut found: BTreeMap<(IpAddr, u16), HintedEndpoint> = BTreeMap::new();
    for slice in slices.into_iter().flat_map(|s| s.values()) {
        if slice.address_type != want_type {
            continue;
        }
        let slice_port = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == want_name && p.protocol.as_deref().unwrap_or("TCP") == want_protocol
        });
        let Some(port_number) = slice_port.and_then(|p| p.port) else {
            continue;
        };
        let weights = super::annotations::weights(
            slice.meta.annotations.as_ref(),
            &format!("{}/{}", slice.meta.namespace, slice.meta.name),
        );
        for ep in &slice.endpoints {
            // An IPv4-mapped IPv6 address in an IPv4 slice (the API
            // server accepts one) is the IPv4 address, as upstream reads
            // it; an address of the other family is left out.
            let Some(ip) = ep.address.map(|a| a.to_canonical()) else {
                continue;
            };
            if IpFamily::of(&ip) != family {
                continue;
            }
            let is_local = ep.node_name() == Some(node_name);
            let endpoint = Endpoint {
                ip,
                port: port_number as u16,
                conditions: Conditions {
                    ready: ep.ready().unwrap_or(true),
                    serving: ep.serving().unwrap_or(true),
                    terminating: ep.terminating().unwrap_or(false),
                    is_local,
                },
                // No node's zone label (63 bytes at most) is longer than
                // what a port table carries.
                zone: ep.zone().filter(|z| z.len() <= kpx_rules::table::MAX_STRING).map(Box::from),
                weight: weights.get(&ip).copied().unwrap_or(1),
            };
            let hints = ep.hints();
            let endpoint = HintedEndpoint {
                endpoint,
                zone_hints: hints.map(|h| h.for_zones.clone()).unwrap_or_default(),
                node_hints: hints.map(|h| h.for_nodes.clone()).unwrap_or_default(),
            };
            let key = (ip, port_number as u16);
            if !endpoint.endpoint.conditions.terminating || !found.contains_key(&key) {
                found.insert(key, endpoint);
            }
        }
    }
    found.into_values().collect()
}
