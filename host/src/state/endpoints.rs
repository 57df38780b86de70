//! EndpointSlices to the endpoints of one service port (upstream's
//! EndpointSliceCache): first address of each endpoint, de-duplicated by
//! address:port (a local copy wins), sorted.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ServicePort as K8sPort;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kpx_rules::model::{Conditions, Endpoint, IpFamily};

use super::topology::HintedEndpoint;

pub fn for_port(
    slices: Option<&BTreeMap<String, Arc<EndpointSlice>>>,
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
            slice.metadata.annotations.as_ref(),
            &format!(
                "{}/{}",
                slice.metadata.namespace.as_deref().unwrap_or(""),
                slice.metadata.name.as_deref().unwrap_or("")
            ),
        );
        for ep in &slice.endpoints {
            let Some(ip) = ep.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else {
                continue;
            };
            let cond = ep.conditions.as_ref();
            let is_local = ep.node_name.as_deref() == Some(node_name);
            let endpoint = Endpoint {
                ip,
                port: port_number as u16,
                conditions: Conditions {
                    ready: cond.and_then(|c| c.ready).unwrap_or(true),
                    serving: cond.and_then(|c| c.serving).unwrap_or(true),
                    terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
                    is_local,
                },
                zone: ep.zone.clone(),
                weight: weights.get(&ip).copied().unwrap_or(1),
            };
            let hints = ep.hints.as_ref();
            let endpoint = HintedEndpoint {
                endpoint,
                zone_hints: hints
                    .and_then(|h| h.for_zones.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|z| z.name.clone())
                    .collect(),
                node_hints: hints
                    .and_then(|h| h.for_nodes.as_ref())
                    .into_iter()
                    .flatten()
                    .map(|n| n.name.clone())
                    .collect(),
            };
            let key = (ip, port_number as u16);
            if is_local || !found.contains_key(&key) {
                found.insert(key, endpoint);
            }
        }
    }
    found.into_values().collect()
}
