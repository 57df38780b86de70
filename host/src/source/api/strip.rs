//! Objects as they arrive, cut to the fields kpx reads, so that tens of
//! thousands of them cost what the proxy needs and no more (managed
//! fields, owner references, Node images and conditions, endpoint target
//! references, …). The manifest source keeps objects whole (EndpointSlices
//! and Services aside, which every source keeps as a [`Slice`] and a
//! [`crate::source::Service`]): they are written for kpx.

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn meta(m: ObjectMeta, keep_labels: bool) -> ObjectMeta {
    let annotations = crate::source::slice::kept_annotations(m.annotations);
    ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        resource_version: m.resource_version,
        labels: if keep_labels { m.labels } else { None },
        annotations,
        deletion_timestamp: m.deletion_timestamp,
        ..Default::default()
    }
}

pub fn node(n: Node) -> Node {
    let spec = n.spec.map(|s| NodeSpec {
        pod_cidr: s.pod_cidr,
        pod_cidrs: s.pod_cidrs,
        taints: s.taints,
        ..Default::default()
    });
    let status = n.status.map(|s| NodeStatus { addresses: s.addresses, ..Default::default() });
    Node { metadata: meta(n.metadata, true), spec, status }
}

pub fn service_cidr(c: ServiceCIDR) -> ServiceCIDR {
    ServiceCIDR { metadata: meta(c.metadata, false), spec: c.spec, status: None }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    use super::*;
    use crate::source::Slice;

    #[test]
    fn node_keeps_what_the_proxy_reads() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n", "resourceVersion": "9", "labels": {"topology.kubernetes.io/zone": "a"},
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kpx.dev/x": "y"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24"], "providerID": "aws:///x",
                     "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.1.1.1"}],
                       "images": [{"names": ["a"], "sizeBytes": 1}], "conditions": [{"type": "Ready", "status": "True"}]}
        });
        let n = node(serde_json::from_value(json).unwrap());
        let back = serde_json::to_value(&n).unwrap();
        assert_eq!(
            back,
            serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n", "resourceVersion": "9", "labels": {"topology.kubernetes.io/zone": "a"},
                             "annotations": {"kpx.dev/x": "y"}},
                "spec": {"podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24"],
                         "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.1.1.1"}]}
            })
        );
    }

    #[test]
    fn slices_and_services_lose_what_the_proxy_never_reads() {
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "s", "namespace": "ns", "labels": {"kubernetes.io/service-name": "web"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u"}]},
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "n", "zone": "a",
                           "targetRef": {"kind": "Pod", "name": "p"}}],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]
        }))
        .unwrap();
        let s = Slice::from(slice);
        // Its metadata is what kpx reads: owner references are not in it.
        assert_eq!((s.meta.name.as_str(), s.meta.namespace.as_str(), s.meta.headless), ("s", "ns", false));
        assert_eq!(s.endpoints[0].address, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(s.endpoints[0].ready(), Some(true));
        assert_eq!(s.endpoints[0].node_name(), Some("n"));
        assert_eq!(s.endpoints[0].zone(), Some("a"));
        assert_eq!(s.meta.service_name.as_deref(), Some("web"));

        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "ns", "annotations": {"kpx.dev/scheduler": "maglev", "kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
            "spec": {"clusterIP": "10.96.0.1", "selector": {"app": "web"}, "ports": [{"port": 80}]}
        }))
        .unwrap();
        // Services are kept as kpx's own type (source::service).
        let svc = crate::source::Service::from(svc);
        assert_eq!(svc.metadata.annotations.unwrap().len(), 1);
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
    }
}
