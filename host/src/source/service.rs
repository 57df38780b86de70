//! A Service as kpx keeps it: what kube-proxy reads of one and nothing
//! else. k8s-openapi's `Service` is about 840 bytes before its strings
//! (an `ObjectMeta` of seventeen optional fields, a spec of thirty, a
//! status); at 30k Services those were 25 MB held for the life of the
//! process, shared by the sources' caches and the state. Here the fields
//! keep k8s's names, the enumerations are parsed (type, traffic policies,
//! affinity) and the metadata is what kube-proxy reads of it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as k8s;
use kpx_rules::model::TrafficPolicy;
use serde::Deserialize;

use super::{exact, null_as_default};
use crate::wellknown::SERVICE_PROXY_NAME_LABEL;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Service {
    pub metadata: ServiceMeta,
    /// None: the object had no spec (it is skipped).
    pub spec: Option<ServiceSpec>,
    /// `status.loadBalancer.ingress`.
    pub ingress: Vec<Ingress>,
}

/// What kpx reads of a Service's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceMeta {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub resource_version: Option<String>,
    /// It has the `service.kubernetes.io/service-proxy-name` label: it
    /// belongs to another proxy.
    pub other_proxy: bool,
    /// The annotations kpx reads ([`super::slice::kept_annotations`]);
    /// none when empty.
    pub annotations: Option<BTreeMap<String, String>>,
}

/// `spec.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
    ExternalName,
    /// A value Kubernetes does not define (treated as ClusterIP).
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceSpec {
    pub type_: Option<ServiceType>,
    pub cluster_ip: Option<String>,
    pub cluster_ips: Option<Vec<String>>,
    pub ports: Option<Vec<ServicePort>>,
    pub external_ips: Option<Vec<String>>,
    pub load_balancer_source_ranges: Option<Vec<String>>,
    /// Local only when the spec says `Local`.
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    pub health_check_node_port: Option<i32>,
    /// `sessionAffinity: ClientIP`.
    pub client_ip_affinity: bool,
    /// `sessionAffinityConfig.clientIP.timeoutSeconds`.
    pub affinity_timeout_seconds: Option<i32>,
}

/// What kpx reads of one of `spec.ports`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    pub name: Option<String>,
    pub protocol: Option<String>,
    /// 0 when absent or null, as k8s-openapi reads it.
    #[serde(default, deserialize_with = "null_as_default")]
    pub port: i32,
    pub node_port: Option<i32>,
}

/// What kpx reads of one of `status.loadBalancer.ingress`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ingress {
    pub ip: Option<String>,
    pub ip_mode: Option<String>,
}

/// What kpx reads of a spec, as written (k8s's names and strings): the
/// API source reads it straight off the wire, the manifest source makes
/// it from k8s-openapi's (whose checks it runs), and both then parse it
/// into a [`ServiceSpec`] the same way.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WireSpec {
    #[serde(rename = "type")]
    type_: Option<String>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    cluster_ips: Option<Vec<String>>,
    ports: Option<Vec<ServicePort>>,
    #[serde(rename = "externalIPs")]
    external_ips: Option<Vec<String>>,
    load_balancer_source_ranges: Option<Vec<String>>,
    external_traffic_policy: Option<String>,
    internal_traffic_policy: Option<String>,
    health_check_node_port: Option<i32>,
    session_affinity: Option<String>,
    session_affinity_config: Option<AffinityConfig>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct AffinityConfig {
    #[serde(rename = "clientIP")]
    client_ip: Option<ClientIpConfig>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    timeout_seconds: Option<i32>,
}

fn policy(p: Option<&str>) -> TrafficPolicy {
    if p == Some("Local") { TrafficPolicy::Local } else { TrafficPolicy::Cluster }
}

impl From<WireSpec> for ServiceSpec {
    fn from(spec: WireSpec) -> ServiceSpec {
        ServiceSpec {
            type_: spec.type_.as_deref().map(|t| match t {
                "ClusterIP" => ServiceType::ClusterIp,
                "NodePort" => ServiceType::NodePort,
                "LoadBalancer" => ServiceType::LoadBalancer,
                "ExternalName" => ServiceType::ExternalName,
                _ => ServiceType::Other,
            }),
            cluster_ip: spec.cluster_ip,
            cluster_ips: spec.cluster_ips.map(exact),
            ports: spec.ports.map(exact),
            external_ips: spec.external_ips.map(exact),
            load_balancer_source_ranges: spec.load_balancer_source_ranges.map(exact),
            external_traffic_policy: policy(spec.external_traffic_policy.as_deref()),
            internal_traffic_policy: policy(spec.internal_traffic_policy.as_deref()),
            health_check_node_port: spec.health_check_node_port,
            client_ip_affinity: spec.session_affinity.as_deref() == Some("ClientIP"),
            affinity_timeout_seconds: spec
                .session_affinity_config
                .and_then(|c| c.client_ip)
                .and_then(|c| c.timeout_seconds),
        }
    }
}

impl From<k8s::ServiceSpec> for WireSpec {
    fn from(spec: k8s::ServiceSpec) -> WireSpec {
        WireSpec {
            type_: spec.type_,
            cluster_ip: spec.cluster_ip,
            cluster_ips: spec.cluster_ips,
            ports: spec.ports.map(|ports| {
                ports
                    .into_iter()
                    .map(|p| ServicePort { name: p.name, protocol: p.protocol, port: p.port, node_port: p.node_port })
                    .collect()
            }),
            external_ips: spec.external_ips,
            load_balancer_source_ranges: spec.load_balancer_source_ranges,
            external_traffic_policy: spec.external_traffic_policy,
            internal_traffic_policy: spec.internal_traffic_policy,
            health_check_node_port: spec.health_check_node_port,
            session_affinity: spec.session_affinity,
            session_affinity_config: spec.session_affinity_config.map(|c| AffinityConfig {
                client_ip: c.client_ip.map(|ip| ClientIpConfig { timeout_seconds: ip.timeout_seconds }),
            }),
        }
    }
}

impl ServiceMeta {
    /// What kpx reads of an object's metadata.
    pub fn new(m: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ServiceMeta {
        ServiceMeta {
            name: m.name,
            namespace: m.namespace,
            resource_version: m.resource_version,
            other_proxy: m.labels.as_ref().is_some_and(|l| l.contains_key(SERVICE_PROXY_NAME_LABEL)),
            annotations: super::slice::kept_annotations(m.annotations),
        }
    }
}

impl From<k8s::Service> for Service {
    fn from(s: k8s::Service) -> Service {
        let ingress = s
            .status
            .and_then(|st| st.load_balancer)
            .and_then(|lb| lb.ingress)
            .unwrap_or_default()
            .into_iter()
            .map(|i| Ingress { ip: i.ip, ip_mode: i.ip_mode })
            .collect();
        Service {
            metadata: ServiceMeta::new(s.metadata),
            spec: s.spec.map(|spec| WireSpec::from(spec).into()),
            ingress,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_kpx_reads_is_kept() {
        let svc: k8s::Service = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "7",
                         "labels": {"service.kubernetes.io/service-proxy-name": "other", "app": "web"},
                         "annotations": {"kpx.dev/scheduler": "lc", "note": "dropped"}},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "fd00::1"],
                     "ports": [{"name": "http", "protocol": "UDP", "port": 80, "targetPort": 8080, "nodePort": 30080}],
                     "externalIPs": ["192.0.2.1"], "loadBalancerSourceRanges": ["10.0.0.0/8"],
                     "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster",
                     "healthCheckNodePort": 31000, "sessionAffinity": "ClientIP",
                     "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                     "selector": {"app": "web"}},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1", "ipMode": "Proxy"}]}}
        }))
        .unwrap();
        let s = Service::from(svc);
        assert_eq!(s.metadata.name.as_deref(), Some("web"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
        assert!(s.metadata.other_proxy);
        assert_eq!(s.metadata.annotations, Some(BTreeMap::from([("kpx.dev/scheduler".into(), "lc".into())])));
        let spec = s.spec.unwrap();
        assert_eq!(spec.type_, Some(ServiceType::LoadBalancer));
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.1"));
        assert_eq!(spec.cluster_ips, Some(vec!["10.96.0.1".into(), "fd00::1".into()]));
        assert_eq!(
            spec.ports,
            Some(vec![ServicePort {
                name: Some("http".into()),
                protocol: Some("UDP".into()),
                port: 80,
                node_port: Some(30080)
            }])
        );
        assert_eq!(spec.external_ips, Some(vec!["192.0.2.1".into()]));
        assert_eq!(spec.load_balancer_source_ranges, Some(vec!["10.0.0.0/8".into()]));
        assert_eq!(
            (spec.external_traffic_policy, spec.internal_traffic_policy),
            (TrafficPolicy::Local, TrafficPolicy::Cluster)
        );
        assert_eq!(spec.health_check_node_port, Some(31000));
        assert!(spec.client_ip_affinity);
        assert_eq!(spec.affinity_timeout_seconds, Some(60));
        assert_eq!(s.ingress, vec![Ingress { ip: Some("198.51.100.1".into()), ip_mode: Some("Proxy".into()) }]);
    }

    #[test]
    fn defaults_and_unknown_values() {
        let svc: k8s::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"}, "spec": {"type": "Weird", "sessionAffinity": "None", "externalTrafficPolicy": "local"}
        }))
        .unwrap();
        let s = Service::from(svc);
        assert!(!s.metadata.other_proxy && s.metadata.annotations.is_none() && s.ingress.is_empty());
        let spec = s.spec.unwrap();
        assert_eq!(spec.type_, Some(ServiceType::Other));
        assert_eq!(spec.external_traffic_policy, TrafficPolicy::Cluster);
        assert!(!spec.client_ip_affinity);
        let none = Service::from(k8s::Service::default());
        assert_eq!(none.spec, None);
    }
}
