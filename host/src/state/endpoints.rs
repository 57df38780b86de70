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
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointPort;
use kpx_rules::model::{Conditions, Endpoint, IpFamily};

use super::annotations::{self, Problem, Weights};
use super::topology::HintedEndpoint;
use crate::source::Slice;
use crate::source::service::ServicePort as K8sPort;

/// An EndpointSlice as the state holds it: the object, its weights
/// (`kpx.dev/weights`, parsed once, when the state stores the slice) and
/// its ports in lookup order, so that each port of a Service finds its
/// own without parsing or scanning anything again (a Service of n ports
/// whose slice weighs n entries cost n² at every pass when each port
/// parsed the annotation and scanned the slice's ports).
#[derive(Debug)]
pub struct StoredSlice {
    pub object: Arc<Slice>,
    weights: Weights,
    ports: PortIndex,
}

impl StoredSlice {
    /// The slice, its annotation parsed and its ports indexed; what is
    /// wrong with its annotation.
    pub fn new(object: Arc<Slice>) -> (StoredSlice, Vec<Problem>) {
        let (weights, problems) = annotations::weights(object.meta.annotations.as_ref());
        let ports = PortIndex::new(object.ports.as_deref().unwrap_or_default());
        (StoredSlice { object, weights, ports }, problems)
    }

    /// The weights its annotation gives, by address.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Its port of this name and protocol: the first one in the slice's
    /// order, as a scan would find it.
    fn port(&self, name: &str, protocol: &str) -> Option<&EndpointPort> {
        self.ports.find(self.object.ports.as_deref().unwrap_or_default(), (name, protocol))
    }
}

/// Positions in a slice's ports, sorted by (name, protocol), each run of
/// equal keys in the slice's order.
#[derive(Debug, Default)]
struct PortIndex(Box<[u32]>);

/// A port's name and protocol, with upstream's defaults.
fn port_key(p: &EndpointPort) -> (&str, &str) {
    (p.name.as_deref().unwrap_or(""), p.protocol.as_deref().unwrap_or("TCP"))
}

impl PortIndex {
    fn new(ports: &[EndpointPort]) -> PortIndex {
        let mut order: Vec<u32> = (0..ports.len() as u32).collect();
        // Stable: of equal keys, the first in the slice comes first.
        order.sort_by_key(|&i| port_key(&ports[i as usize]));
        PortIndex(order.into_boxed_slice())
    }

    fn find<'a>(&self, ports: &'a [EndpointPort], key: (&str, &str)) -> Option<&'a EndpointPort> {
        let at = self.0.partition_point(|&i| ports.get(i as usize).is_some_and(|p| port_key(p) < key));
        let port = ports.get(*self.0.get(at)? as usize)?;
        (port_key(port) == key).then_some(port)
    }
}

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
    for stored in slices.into_iter().flat_map(|s| s.values()) {
        let slice = &stored.object;
        if slice.address_type != want_type {
            continue;
        }
        let Some(port_number) = stored.port(want_name, want_protocol).and_then(|p| p.port) else {
            continue;
        };
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
                weight: stored.weights().get(&ip).unwrap_or(1),
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
