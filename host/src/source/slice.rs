//! An EndpointSlice as kpx keeps it: what kube-proxy reads of one and
//! nothing else. k8s-openapi's `Endpoint` is about 350 bytes before its
//! strings (seven optional strings of a target reference, a deprecated
//! topology map, a hostname, every address as text); at 10k Services x 10
//! endpoints those were 35 MiB held for the life of the process, shared
//! by the sources' caches and the state. An endpoint here is its first
//! address parsed (the only one kube-proxy reads), its conditions, node,
//! zone and hints; its metadata is what kube-proxy reads of it (k8s's
//! `ObjectMeta` is about 250 bytes before its labels' map).

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointHints, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::wellknown::{ANNOTATION_PREFIX, EXTENSION_PREFIX, HEADLESS_LABEL, SERVICE_NAME_LABEL, TRIGGER_TIME};

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Slice {
    pub meta: SliceMeta,
    /// IPv4, IPv6 or FQDN.
    pub address_type: String,
    pub ports: Option<Vec<EndpointPort>>,
    pub endpoints: Vec<SliceEndpoint>,
}

/// One endpoint in 32 bytes: its address, its three conditions packed in
/// a byte, and where it runs (node, zone, hints), which the endpoints of
/// a slice on one node share (at 30k Services x 10, 64-byte endpoints
/// were 19 MB held; and a node name and a zone allocated for each
/// endpoint cost another 64 bytes apiece in a real cluster).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceEndpoint {
    /// The first address, if it is an IP address; None in an FQDN slice
    /// (kube-proxy reads none of its addresses, even one spelled as an IP).
    pub address: Option<IpAddr>,
    conditions: Conditions,
    placement: Option<Arc<Placement>>,
}

/// Ready, serving and terminating, each unset, false or true, two bits
/// apiece.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Conditions(u8);

impl Conditions {
    const READY: u32 = 0;
    const SERVING: u32 = 2;
    const TERMINATING: u32 = 4;

    fn new(c: &EndpointConditions) -> Conditions {
        let bits = |v: Option<bool>, at: u32| match v {
            None => 0,
            Some(false) => 1 << at,
            Some(true) => 2 << at,
        };
        Conditions(bits(c.ready, Self::READY) | bits(c.serving, Self::SERVING) | bits(c.terminating, Self::TERMINATING))
    }

    fn get(self, at: u32) -> Option<bool> {
        match (self.0 >> at) & 3 {
            0 => None,
            1 => Some(false),
            _ => Some(true),
        }
    }
}

/// Where an endpoint runs, as its slice says: 40 bytes, shared by every
/// endpoint of a list (or of a file) that runs there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Placement {
    pub node_name: Option<Box<str>>,
    pub zone: Option<Box<str>>,
    /// Topology hints; None when the endpoint has none (most have none).
    pub hints: Option<Box<Hints>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
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
                    k.starts_with(ANNOTATION_PREFIX) || k.starts_with(EXTENSION_PREFIX) || k == TRIGGER_TIME
                })
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|a| !a.is_empty())
}

impl From<EndpointSlice> for Slice {
    fn from(s: EndpointSlice) -> Slice {
        Slice::new(s, &mut Placements::default())
    }
}

impl Slice {
    /// The slice, its endpoints' placements shared through `placements`.
    pub fn new(s: EndpointSlice, placements: &mut Placements) -> Slice {
        // Not `collect()`: collected in place, the new Vec would keep the
        // old one's allocation, 350 bytes per endpoint, which is the point
        // of this type to give back.
        let fqdn = s.address_type == "FQDN";
        // `endpoints` is optional since v1.36 (kubernetes/kubernetes#136111).
        let listed = s.endpoints.unwrap_or_default();
        let mut endpoints = Vec::with_capacity(listed.len());
        endpoints.extend(listed.into_iter().map(|e| {
            SliceEndpoint::new(
                fqdn,
                e.addresses.first().and_then(|a| kpx_rules::model::parse_ip_sloppy(a)),
                e.conditions,
                placements.of(e.node_name.map(String::into_boxed_str), e.zone.map(String::into_boxed_str), e.hints),
            )
        }));
        Slice { meta: s.metadata.into(), address_type: s.address_type, ports: s.ports, endpoints }
    }
}

impl SliceEndpoint {
    /// An endpoint of a slice (`fqdn`: its addresses are names, even one
    /// spelled as an IP, so it has none) from the fields kube-proxy reads:
    /// its first address parsed, conditions, and where it runs.
    pub fn new(
        fqdn: bool,
        first_address: Option<IpAddr>,
        conditions: Option<EndpointConditions>,
        placement: Option<Arc<Placement>>,
    ) -> SliceEndpoint {
        SliceEndpoint {
            address: if fqdn { None } else { first_address },
            conditions: Conditions::new(&conditions.unwrap_or_default()),
            placement,
        }
    }

    pub fn ready(&self) -> Option<bool> {
        self.conditions.get(Conditions::READY)
    }

    pub fn serving(&self) -> Option<bool> {
        self.conditions.get(Conditions::SERVING)
    }

    pub fn terminating(&self) -> Option<bool> {
        self.conditions.get(Conditions::TERMINATING)
    }

    pub fn node_name(&self) -> Option<&str> {
        self.placement.as_ref().and_then(|p| p.node_name.as_deref())
    }

    pub fn zone(&self) -> Option<&str> {
        self.placement.as_ref().and_then(|p| p.zone.as_deref())
    }

    pub fn hints(&self) -> Option<&Hints> {
        self.placement.as_ref().and_then(|p| p.hints.as_deref())
    }
}

/// The placements read so far, each distinct one allocated once. The
/// manifest source keeps one for each run of documents it parses, the API
/// source one for each list; a watched slice has its own. A cluster's
/// endpoints run on its nodes, in fewer zones: at 1,000 nodes a list of
/// any size holds about 1,000 placements.
#[derive(Default)]
pub struct Placements {
    seen: HashSet<Arc<Placement>>,
}

impl Placements {
    /// The shared placement of these fields; None when all are unset
    /// (and `hints: {}` is no hints, as topology reads them).
    pub fn of(
        &mut self,
        node_name: Option<Box<str>>,
        zone: Option<Box<str>>,
        hints: Option<EndpointHints>,
    ) -> Option<Arc<Placement>> {
        let hints = hints
            .map(|h| Hints {
                for_zones: h.for_zones.into_iter().flatten().map(|z| z.name).collect(),
                for_nodes: h.for_nodes.into_iter().flatten().map(|n| n.name).collect(),
            })
            .filter(|h| !h.for_zones.is_empty() || !h.for_nodes.is_empty());
        if node_name.is_none() && zone.is_none() && hints.is_none() {
            return None;
        }
        let placement = Placement { node_name, zone, hints: hints.map(Box::new) };
        if let Some(seen) = self.seen.get(&placement) {
            return Some(seen.clone());
        }
        let shared = Arc::new(placement);
        self.seen.insert(shared.clone());
        Some(shared)
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
        // The point of this type: an endpoint in at most 32 bytes.
        assert!(std::mem::size_of::<SliceEndpoint>() <= 32, "{}", std::mem::size_of::<SliceEndpoint>());
        assert_eq!(s.ports.as_ref().map(Vec::len), Some(1));
        let e = &s.endpoints[0];
        assert_eq!(e.address, Some("10.0.0.1".parse().unwrap()));
        assert_eq!((e.ready(), e.serving(), e.terminating()), (Some(false), None, Some(true)));
        assert_eq!((e.node_name(), e.zone()), (Some("n1"), Some("a")));
        assert_eq!(e.hints(), Some(&Hints { for_zones: vec!["a".into()], for_nodes: vec!["n1".into()] }));
        assert_eq!(s.endpoints[1], SliceEndpoint::new(false, Some("10.0.0.2".parse().unwrap()), None, None));
        assert_eq!((s.endpoints[1].ready(), s.endpoints[1].hints()), (None, None));
        assert_eq!(s.endpoints[2].address, None);
        let fqdn: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "f"}, "addressType": "FQDN", "endpoints": [{"addresses": ["10.0.0.3"]}]
        }))
        .unwrap();
        assert_eq!(Slice::from(fqdn).endpoints[0].address, None);
    }

    #[test]
    fn endpoints_on_one_node_share_its_placement() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1"}, "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.0.0.1"], "nodeName": "n1", "zone": "a", "conditions": {"ready": true}},
                {"addresses": ["10.0.0.2"], "nodeName": "n2", "zone": "a"},
                {"addresses": ["10.0.0.3"], "nodeName": "n1", "zone": "a", "conditions": {"serving": false}},
                {"addresses": ["10.0.0.4"], "nodeName": "n1", "zone": "b"}
            ]
        }))
        .unwrap();
        let s = Slice::from(slice);
        let placement = |i: usize| s.endpoints[i].placement.clone().unwrap();
        assert!(Arc::ptr_eq(&placement(0), &placement(2)));
        assert!(!Arc::ptr_eq(&placement(0), &placement(1)) && !Arc::ptr_eq(&placement(0), &placement(3)));
        assert_eq!((s.endpoints[3].node_name(), s.endpoints[3].zone()), (Some("n1"), Some("b")));
        assert_eq!(
            (s.endpoints[0].ready(), s.endpoints[2].ready(), s.endpoints[2].serving()),
            (Some(true), None, Some(false))
        );
    }

    #[test]
    fn conditions_keep_unset_apart_from_false() {
        for ready in [None, Some(false), Some(true)] {
            for serving in [None, Some(false), Some(true)] {
                for terminating in [None, Some(false), Some(true)] {
                    let c = EndpointConditions { ready, serving, terminating };
                    let e = SliceEndpoint::new(false, None, Some(c), None);
                    assert_eq!((e.ready(), e.serving(), e.terminating()), (ready, serving, terminating));
                }
            }
        }
    }

    #[test]
    fn slices_read_together_share_placements() {
        let slice = |name: &str, node: &str| -> EndpointSlice {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name}, "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": node, "zone": "a", "hints": {}}]
            }))
            .unwrap()
        };
        let mut placements = Placements::default();
        let a = Slice::new(slice("a", "n1"), &mut placements);
        let b = Slice::new(slice("b", "n1"), &mut placements);
        let c = Slice::new(slice("c", "n2"), &mut placements);
        let placement = |s: &Slice| s.endpoints[0].placement.clone().unwrap();
        assert!(Arc::ptr_eq(&placement(&a), &placement(&b)));
        assert!(!Arc::ptr_eq(&placement(&a), &placement(&c)));
        // `hints: {}` is none.
        assert_eq!(a.endpoints[0].hints(), None);
        // Read apart, equal slices are still equal.
        assert_eq!(a, Slice::from(slice("a", "n1")));
        assert!(std::mem::size_of::<Placement>() <= 40, "{}", std::mem::size_of::<Placement>());
    }
}
