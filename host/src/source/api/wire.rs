//! The EndpointSlice as the API source reads it off the wire: deserialized
//! straight into what kpx keeps of it ([`Slice`]'s endpoints), never into
//! k8s-openapi's `EndpointSlice`. A list of 10k slices x 10 endpoints was
//! held whole as k8s-openapi objects while it was converted (an `Endpoint`
//! is about 350 bytes before its strings, each address a `String`, the
//! target reference's seven optional strings, `managedFields` in the
//! metadata); each endpoint here is its first address parsed, its
//! conditions, node, zone and hints. Fields kpx does not read are skipped
//! by the deserializer, not stored.
//!
//! Where it reads otherwise than k8s-openapi (which an API server, writing
//! JSON from Go structs, never makes matter): `apiVersion` and `kind` are
//! not checked (the watch asked for EndpointSlices), addresses after the
//! first and skipped fields are not type-checked, and a key given twice in
//! one object is refused (k8s-openapi keeps the last; but the watches read
//! each object through [`Decoded`], whose JSON value keeps the last too).
//!
//! [`Decoded`] is how the watches read every object: one that cannot be
//! decoded is named and refused, not the list or the watch event it came in.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointHints, EndpointPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::source::service::{Ingress, Service, ServiceMeta, WireSpec};
use crate::source::slice::{Placements, Slice, SliceEndpoint};
use crate::source::{exact, null_as_default};

/// An EndpointSlice as listed or watched.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireSlice {
    #[serde(default, deserialize_with = "read_meta")]
    metadata: ObjectMeta,
    #[serde(default, deserialize_with = "null_as_default")]
    address_type: String,
    #[serde(default, deserialize_with = "null_as_default")]
    endpoints: Vec<WireEndpoint>,
    #[serde(default)]
    ports: Option<Vec<EndpointPort>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireEndpoint {
    /// The first address, parsed (None if it is not an IP address).
    #[serde(default, deserialize_with = "first_address")]
    addresses: Option<IpAddr>,
    #[serde(default)]
    conditions: Option<EndpointConditions>,
    #[serde(default)]
    node_name: Option<Box<str>>,
    #[serde(default)]
    zone: Option<Box<str>>,
    #[serde(default)]
    hints: Option<Box<EndpointHints>>,
}

/// A Service as listed or watched: what kpx reads of its spec and status
/// ([`Service`]), never k8s-openapi's `Service` (about 840 bytes before its
/// strings, a list of 30k of them held whole while it was converted).
#[derive(Debug, Clone, Deserialize)]
pub struct WireService {
    #[serde(default, deserialize_with = "read_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<WireSpec>,
    #[serde(default)]
    status: Option<WireServiceStatus>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireServiceStatus {
    load_balancer: Option<WireLoadBalancer>,
}

#[derive(Debug, Clone, Deserialize)]
struct WireLoadBalancer {
    ingress: Option<Vec<Ingress>>,
}

impl From<WireService> for Service {
    fn from(s: WireService) -> Service {
        let ingress = s.status.and_then(|st| st.load_balancer).and_then(|lb| lb.ingress).unwrap_or_default();
        Service { metadata: ServiceMeta::new(s.metadata), spec: s.spec.map(Into::into), ingress }
    }
}

impl kube::Resource for WireService {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Service")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("services")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What kpx reads of an object's metadata (and the watcher: the resource
/// version); `managedFields`, owner references and the rest are skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

fn read_meta<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = Option::<WireMeta>::deserialize(d)?;
    Ok(m.map(|m| ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        resource_version: m.resource_version,
        // The two labels kpx reads of a slice.
        labels: m.labels.map(|l| {
            l.into_iter()
                .filter(|(k, _)| {
                    k == crate::wellknown::SERVICE_NAME_LABEL
                        || k == crate::wellknown::HEADLESS_LABEL
                        || k == crate::wellknown::SERVICE_PROXY_NAME_LABEL
                })
                .collect()
        }),
        annotations: crate::source::slice::kept_annotations(m.annotations),
        ..Default::default()
    })
    .unwrap_or_default())
}

/// The first element of a list of addresses, parsed; the others are read
/// past (kube-proxy reads only the first).
fn first_address<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
    struct First;
    impl<'de> serde::de::Visitor<'de> for First {
        type Value = Option<IpAddr>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of addresses")
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(First)
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let first = seq.next_element::<Address>()?.and_then(|a| a.0);
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(first)
        }
    }
    d.deserialize_option(First)
}

/// One address, parsed where it is read (no string is kept); None if it is
/// not an IP address.
struct Address(Option<IpAddr>);

impl<'de> Deserialize<'de> for Address {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Address, D::Error> {
        struct Parse;
        impl serde::de::Visitor<'_> for Parse {
            type Value = Address;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an address")
            }

            fn visit_str<E: serde::de::Error>(self, a: &str) -> Result<Address, E> {
                Ok(Address(kpx_rules::model::parse_ip_sloppy(a)))
            }
        }
        d.deserialize_str(Parse)
    }
}

/// An object of a list or of a watch event as the watches read it: the
/// type asked for, or why the object could not be decoded as one. Read as
/// the type itself, one object that cannot be decoded fails its whole list
/// (listed again, and failing again, for as long as it stays), and a watch
/// event's is reported by kube as an empty `Status` that names nothing;
/// read through this, that object is refused by name and the others stand.
/// The cost: each object is read as a JSON value first (allocated while it
/// is read, one object at a time), and the type is read from the value.
/// kube's own `DeserializeGuard` does the same but copies each whole
/// object to read its metadata a second time, and fails the list when
/// that metadata cannot be read; here it is three strings, and an object
/// with no readable metadata is refused unnamed.
#[derive(Debug, Clone)]
pub enum Decoded<T> {
    Read(T),
    Undecodable(Box<Undecodable>),
}

/// An object that could not be decoded: what its metadata says of it, as
/// far as that could be read (its name, namespace and resource version,
/// which the watch resumes from), and why.
#[derive(Debug, Clone, Default)]
pub struct Undecodable {
    pub metadata: ObjectMeta,
    pub error: String,
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Decoded<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Decoded<T>, D::Error> {
        // Not valid JSON: the response itself is broken, and fails as before.
        let value = serde_json::Value::deserialize(d)?;
        // Read before the value is consumed by the type's reader.
        let metadata = named(&value);
        Ok(match serde_json::from_value::<T>(value) {
            Ok(o) => Decoded::Read(o),
            Err(e) => Decoded::Undecodable(Box::new(Undecodable { metadata, error: e.to_string() })),
        })
    }
}

/// The name, namespace and resource version an object's JSON value gives,
/// those that are strings.
fn named(value: &serde_json::Value) -> ObjectMeta {
    let field = |key: &str| value.get("metadata")?.get(key)?.as_str().map(str::to_string);
    ObjectMeta {
        name: field("name"),
        namespace: field("namespace"),
        resource_version: field("resourceVersion"),
        ..Default::default()
    }
}

impl<T: kube::Resource<DynamicType = ()>> kube::Resource for Decoded<T> {
    type DynamicType = ();
    type Scope = T::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        T::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        T::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        T::version(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        T::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        T::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Decoded::Read(o) => o.meta(),
            Decoded::Undecodable(u) => &u.metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Decoded::Read(o) => o.meta_mut(),
            Decoded::Undecodable(u) => &mut u.metadata,
        }
    }
}

impl From<WireSlice> for Slice {
    fn from(s: WireSlice) -> Slice {
        s.into_slice(&mut Placements::default())
    }
}

impl WireSlice {
    /// The slice, its endpoints' placements shared through `placements`.
    pub fn into_slice(self, placements: &mut Placements) -> Slice {
        let s = self;
        let fqdn = s.address_type == "FQDN";
        let mut endpoints = Vec::with_capacity(s.endpoints.len());
        endpoints.extend(s.endpoints.into_iter().map(|e| {
            let placement = placements.of(e.node_name, e.zone, e.hints.map(|h| *h));
            SliceEndpoint::new(fqdn, e.addresses, e.conditions, placement)
        }));
        Slice { meta: s.metadata.into(), address_type: s.address_type, ports: s.ports.map(exact), endpoints }
    }
}

impl kube::Resource for WireSlice {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("EndpointSlice")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("discovery.k8s.io")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("endpointslices")
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    use super::*;

    /// The same JSON text through k8s-openapi and [`Slice::from`], and
    /// through the wire type, both read from text as kube's client reads
    /// a response: the same slice.
    fn both(json: serde_json::Value) -> (Slice, Slice) {
        let text = json.to_string();
        let k8s: EndpointSlice = serde_json::from_str(&text).unwrap();
        let wire: WireSlice = serde_json::from_str(&text).unwrap();
        (Slice::from(k8s), Slice::from(wire))
    }

    /// The same Service text through k8s-openapi and through the wire type.
    fn both_services(json: serde_json::Value) -> (Service, Service) {
        let text = json.to_string();
        let k8s: k8s_openapi::api::core::v1::Service = serde_json::from_str(&text).unwrap();
        let wire: WireService = serde_json::from_str(&text).unwrap();
        (Service::from(k8s), Service::from(wire))
    }

    #[test]
    fn a_service_reads_as_through_the_k8s_types() {
        let (k8s, wire) = both_services(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "ns", "resourceVersion": "7",
                         "labels": {"service.kubernetes.io/service-proxy-name": "x", "app": "web"},
                         "annotations": {"kpx.dev/scheduler": "lc", "other": "y"},
                         "managedFields": [{"manager": "m"}]},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "fd00::1"],
                     "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080,
                                "appProtocol": "http"},
                               {"name": "dns", "protocol": "UDP", "port": 53}],
                     "externalIPs": ["192.0.2.1"], "loadBalancerSourceRanges": ["10.0.0.0/8"],
                     "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster", "healthCheckNodePort": 31000,
                     "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                     "selector": {"app": "web"}, "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack"},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1", "ipMode": "VIP", "hostname": "h"}]},
                       "conditions": []}
        }));
        assert_eq!(wire, k8s);
        assert!(wire.metadata.other_proxy);
        assert_eq!(wire.ingress.len(), 1);
        assert_eq!(wire.spec.as_ref().unwrap().ports.as_ref().unwrap().len(), 2);
        let (k8s, wire) = both_services(serde_json::json!({
            "metadata": {"name": "bare", "labels": null},
            "spec": {"ports": null, "clusterIP": null, "sessionAffinityConfig": null},
            "status": {"loadBalancer": {}}
        }));
        assert_eq!(wire, k8s);
        let (k8s, wire) = both_services(serde_json::json!({"metadata": {"name": "nospec"}}));
        assert_eq!((wire.spec.as_ref(), &wire), (None, &k8s));
        // A port without its number, or with a null one, reads as 0
        // through both (the API server never sends one; the manifest
        // source refuses it); a number that is not one is refused by both.
        for port in [serde_json::json!({"name": "a"}), serde_json::json!({"name": "a", "port": null})] {
            let (k8s, wire) = both_services(serde_json::json!({"metadata": {"name": "x"}, "spec": {"ports": [port]}}));
            assert_eq!((wire.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port, &wire), (0, &k8s));
        }
        let text = serde_json::json!({"metadata": {"name": "x"}, "spec": {"ports": [{"port": "80"}]}}).to_string();
        assert!(serde_json::from_str::<k8s_openapi::api::core::v1::Service>(&text).is_err());
        assert!(serde_json::from_str::<WireService>(&text).is_err());
    }

    #[test]
    fn reads_what_the_k8s_types_read_and_skips_the_rest() {
        let (k8s, wire) = both(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "s", "namespace": "ns", "resourceVersion": "42",
                         "labels": {"kubernetes.io/service-name": "web", "service.kubernetes.io/headless": ""},
                         "annotations": {"kpx.dev/weights": "10.0.0.1=3", "other": "x",
                                         "endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"},
                         "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:endpoints": {}}}],
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u"}]},
            "endpoints": [
                {"addresses": ["10.0.0.1", "10.0.0.9"], "conditions": {"ready": true, "serving": true, "terminating": false},
                 "nodeName": "n", "zone": "a", "hostname": "h", "deprecatedTopology": {"k": "v"},
                 "hints": {"forZones": [{"name": "a"}], "forNodes": [{"name": "n"}]},
                 "targetRef": {"kind": "Pod", "name": "p", "namespace": "ns", "uid": "x", "resourceVersion": "1"}},
                {"addresses": ["not-an-ip"], "conditions": {}},
                {"addresses": ["10.0.0.3"], "hints": {}},
                {"addresses": []},
                {"addresses": ["10.0.0.4"], "conditions": {"ready": false, "terminating": true}, "zone": null}
            ],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP", "appProtocol": "dns"}]
        }));
        assert_eq!(wire, k8s);
        assert_eq!(wire.meta.resource_version.as_deref(), Some("42"));
        assert!(wire.meta.headless);
        assert_eq!(wire.meta.annotations.as_ref().map(BTreeMap::len), Some(2));
        assert_eq!(wire.endpoints.len(), 5);
        assert_eq!(wire.endpoints[1].address, None);
        assert!(wire.endpoints[0].hints().is_some() && wire.endpoints[2].hints().is_none());
    }

    #[test]
    fn an_fqdn_slice_has_no_addresses_and_nulls_are_absent_fields() {
        let (k8s, wire) = both(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "FQDN",
            "metadata": {"name": "f", "namespace": "ns", "labels": null, "annotations": null},
            "endpoints": [{"addresses": ["10.0.0.1"], "nodeName": null}],
            "ports": null
        }));
        assert_eq!(wire, k8s);
        assert_eq!(wire.endpoints[0].address, None);
        let (k8s, wire) = both(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv6",
            "metadata": {"name": "six", "namespace": "ns"},
            "endpoints": null
        }));
        assert_eq!(wire, k8s);
        assert!(wire.endpoints.is_empty());
    }

    #[test]
    fn missing_fields_read_as_k8s_reads_them_and_wrong_types_are_refused() {
        let (k8s, wire) = both(serde_json::json!({"metadata": {"name": "x"}}));
        assert_eq!(wire, k8s);
        let (k8s, wire) = both(serde_json::json!({"metadata": {"name": "x"}, "addressType": null,
                                                  "endpoints": [{"addresses": ["10.0.0.1"]}]}));
        assert_eq!(wire, k8s);
        // An escaped address is read as the same address.
        let text = r#"{"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.\u0031"]}]}"#;
        let wire = Slice::from(serde_json::from_str::<WireSlice>(text).unwrap());
        assert_eq!(wire.endpoints[0].address, Some("10.0.0.1".parse().unwrap()));
        // An old object's leading zeros, read as Kubernetes' ParseIPSloppy
        // reads them (both paths agree).
        let (k8s, wire) = both(serde_json::json!({"metadata": {"name": "x"}, "addressType": "IPv4",
                                                  "endpoints": [{"addresses": ["010.180.0.041"]}]}));
        assert_eq!(wire, k8s);
        assert_eq!(wire.endpoints[0].address, Some("10.180.0.41".parse().unwrap()));
        for bad in [
            serde_json::json!({"addressType": "IPv4", "endpoints": 5}),
            serde_json::json!({"addressType": "IPv4", "endpoints": [{"addresses": "10.0.0.1"}]}),
            serde_json::json!({"addressType": "IPv4", "endpoints": [{"addresses": [7]}]}),
            serde_json::json!({"addressType": 4}),
        ] {
            assert!(serde_json::from_str::<EndpointSlice>(&bad.to_string()).is_err(), "k8s: {bad}");
            assert!(serde_json::from_str::<WireSlice>(&bad.to_string()).is_err(), "wire: {bad}");
        }
    }

    #[test]
    fn where_it_reads_otherwise_than_k8s() {
        // Addresses past the first are not read.
        let text = r#"{"addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1", 7]}]}"#;
        assert!(serde_json::from_str::<EndpointSlice>(text).is_err());
        let wire = Slice::from(serde_json::from_str::<WireSlice>(text).unwrap());
        assert_eq!(wire.endpoints[0].address, Some("10.0.0.1".parse().unwrap()));
        // A key given twice: k8s-openapi keeps the last, the wire type refuses.
        let text = r#"{"addressType": "IPv4", "addressType": "IPv6", "endpoints": []}"#;
        assert_eq!(serde_json::from_str::<EndpointSlice>(text).unwrap().address_type, "IPv6");
        assert!(serde_json::from_str::<WireSlice>(text).is_err());
    }
}
