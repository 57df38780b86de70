//! An EndpointSlice as kpx keeps it: what kube-proxy reads of one and
//! nothing else. k8s-openapi's `Endpoint` is about 350 bytes before its
//! strings (seven optional strings of a target reference, a deprecated
//! topology map, a hostname, every address as text); at 10k Services x 10
//! endpoints those were 35 MiB held for the life of the process, shared
//! by the sources' caches and the state. An endpoint here is its first
//! address parsed (the only one kube-proxy reads), its conditions, node,
//! zone and hints; its metadata is what kube-proxy reads of it (k8s's
//! `ObjectMeta` is about 250 bytes before its labels' map).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointHints, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label upstream skips a headless Service's slices by.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Slice {
    pub meta: SliceMeta,
    /// IPv4, IPv6 or FQDN.
    pub address_type: String,
    pub ports: Option<Vec<EndpointPort>>,
    pub endpoints: Vec<SliceEndpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceEndpoint {
    /// The first address, if it is an IP address; None in an FQDN slice
    /// (kube-proxy reads none of its addresses, even one spelled as an IP).
    pub address: Option<IpAddr>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<Box<str>>,
    pub zone: Option<Box<str>>,
    /// Topology hints; None when the endpoint has none (most have none).
    pub hints: Option<Box<Hints>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hints {
    pub for_zones: Vec<String>,
    pub for_nodes: Vec<String>,
}

/// What kpx reads of a slice's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceMeta {
    pub name: String,
    pub namespace: String,
    pub resource_version: Option<String>,
    /// Its `kubernetes.io/service-name` label.
    pub service_name: Option<String>,
    /// It has the `service.kubernetes.io/headless` label.
    pub headless: bool,
    /// The annotations kpx reads ([`kept_annotations`]); none when empty.
    pub annotations: Option<BTreeMap<String, String>>,
}

impl From<ObjectMeta> for SliceMeta {
    fn from(m: ObjectMeta) -> SliceMeta {
        let labels = m.labels.unwrap_or_default();
        SliceMeta {
            name: m.name.unwrap_or_default(),
            namespace: m.namespace.unwrap_or_default(),
            resource_version: m.resource_version,
            service_name: labels.get(SERVICE_NAME_LABEL).cloned(),
            headless: labels.contains_key(HEADLESS_LABEL),
            annotations: kept_annotations(m.annotations),
        }
    }
}

/// kpx's own annotations (`kpx.dev/`, extensions' `ext.kpx.dev/`) and the
/// endpoint controller's change time: the annotations kpx reads; none
/// when there are none of them.
pub fn kept_annotations(annotations: Option<BTreeMap<String, String>>) -> Option<BTreeMap<String, String>> {
    annotations
        .map(|a| {
            a.into_iter()
                .filter(|(k, _)| {
                    k.starts_with(ANNOTATION_PREFIX)
                        || k.starts_with(crate::state::annotations::EXTENSION_PREFIX)
                        || k == TRIGGER_TIME
                })
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|a| !a.is_empty())
}

/// The prefix of kpx's own annotations.
pub const ANNOTATION_PREFIX: &str = "kpx.dev/";
/// The endpoint controller's change time on a slice.
pub const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

impl From<EndpointSlice> for Slice {
    fn from(s: EndpointSlice) -> Slice {
        // Not `collect()`: collected in place, the new Vec would keep the
        // old one's allocation, 350 bytes per endpoint, which is the point
        // of this type to give back.
        let fqdn = s.address_type == "FQDN";
        let mut endpoints = Vec::with_capacity(s.endpoints.len());
        endpoints.extend(s.endpoints.into_iter().map(|e| {
            SliceEndpoint::new(
                fqdn,
                e.addresses.first().and_then(|a| a.parse().ok()),
                e.conditions,
                e.node_name.map(String::into_boxed_str),
                e.zone.map(String::into_boxed_str),
                e.hints,
            )
        }));
        Slice { meta: s.metadata.into(), address_type: s.address_type, ports: s.ports, endpoints }
    }
}

impl SliceEndpoint {
    /// An endpoint of a slice (`fqdn`: its addresses are names, even one
    /// spelled as an IP, so it has none) from the fields kube-proxy reads:
    /// its first address parsed, conditions, node, zone and hints.
    pub fn new(
        fqdn: bool,
        first_address: Option<IpAddr>,
        conditions: Option<EndpointConditions>,
        node_name: Option<Box<str>>,
        zone: Option<Box<str>>,
        hints: Option<EndpointHints>,
    ) -> SliceEndpoint {
        let conditions = conditions.unwrap_or_default();
        let hints = hints.map(|h| Hints {
            for_zones: h.for_zones.into_iter().flatten().map(|z| z.name).collect(),
            for_nodes: h.for_nodes.into_iter().flatten().map(|n| n.name).collect(),
        });
        // `hints: {}` is no hints, as topology reads them.
        let hints = hints.filter(|h| !h.for_zones.is_empty() || !h.for_nodes.is_empty());
        SliceEndpoint {
            address: if fqdn { None } else { first_address },
            ready: conditions.ready,
            serving: conditions.serving,
            terminating: conditions.terminating,
            node_name,
            zone,
            hints: hints.map(Box::new),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_what_kube_proxy_reads() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [
                {"addresses": ["10.0.0.1", "10.0.0.9"], "conditions": {"ready": false, "terminating": true},
                 "nodeName": "n1", "zone": "a", "hints": {"forZones": [{"name": "a"}], "forNodes": [{"name": "n1"}]},
                 "targetRef": {"kind": "Pod", "name": "web-x", "namespace": "shop", "uid": "u"}, "hostname": "h"},
                {"addresses": ["10.0.0.2"], "hints": {}},
                {"addresses": ["not-an-ip"]}
            ]
        }))
        .unwrap();
        let s = Slice::from(slice);
        assert_eq!(s.address_type, "IPv4");
        // The point of this type: an endpoint in at most 64 bytes.
        assert!(std::mem::size_of::<SliceEndpoint>() <= 64, "{}", std::mem::size_of::<SliceEndpoint>());
        assert_eq!(s.ports.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            s.endpoints[0],
            SliceEndpoint {
                address: Some("10.0.0.1".parse().unwrap()),
                ready: Some(false),
                serving: None,
                terminating: Some(true),
                node_name: Some("n1".into()),
                zone: Some("a".into()),
                hints: Some(Box::new(Hints { for_zones: vec!["a".into()], for_nodes: vec!["n1".into()] })),
            }
        );
        assert_eq!(s.endpoints[1], SliceEndpoint { address: Some("10.0.0.2".parse().unwrap()), ..Default::default() });
        assert_eq!(s.endpoints[2].address, None);
        let fqdn: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "f"}, "addressType": "FQDN", "endpoints": [{"addresses": ["10.0.0.3"]}]
        }))
        .unwrap();
        assert_eq!(Slice::from(fqdn).endpoints[0].address, None);
    }
}
