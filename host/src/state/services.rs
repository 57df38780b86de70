//! Service objects to rule-model service ports.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kpx_rules::model::{self, Cidr, IpFamily, Protocol};

use super::annotations::{self, Problem, ServiceAnnotations};
use super::topology::HintedEndpoint;
use crate::source::Service;
use crate::source::service::{ServicePort as K8sPort, ServiceType};

/// A Service as the state holds it: the object and what its annotations
/// say, parsed once, when the state stores it; every port of the Service
/// shares the parsed scheduler (one `Arc`) at every pass.
#[derive(Debug)]
pub struct StoredService {
    pub object: Arc<Service>,
    pub annotations: ServiceAnnotations,
    /// `spec.loadBalancerSourceRanges` read (both families), the ones
    /// that are not CIDRs logged once, here, not at every pass.
    source_ranges: Vec<Cidr>,
}

impl StoredService {
    /// The Service, its annotations parsed; what is wrong with them.
    pub fn new(object: Arc<Service>) -> (StoredService, Vec<Problem>) {
        let (annotations, problems) = annotations::service(object.metadata.annotations.as_ref());
        let source_ranges = source_ranges(&object);
        (StoredService { object, annotations, source_ranges }, problems)
    }
}

/// A Service's `loadBalancerSourceRanges`. The API server refuses one
/// that is not a CIDR; an object older than its check may hold one: it
/// is logged and ignored, as upstream's MapCIDRsByIPFamily does.
fn source_ranges(svc: &Service) -> Vec<Cidr> {
    let ranges = svc.spec.iter().flat_map(|spec| spec.load_balancer_source_ranges.iter().flatten());
    ranges
        .filter_map(|r| match Cidr::parse_sloppy(r) {
            Ok(c) => Some(c),
            Err(_) => {
                let namespace = svc.metadata.namespace.as_deref().unwrap_or_default();
                let name = svc.metadata.name.as_deref().unwrap_or_default();
                tracing::warn!(service = %format!("{namespace}/{name}"), "loadBalancerSourceRanges: {r:?} is not a CIDR: ignored");
                None
            }
        })
        .collect()
}

/// Upstream's `ShouldSkipService` plus the service-proxy-name label: kpx
/// has no proxy name, so any Service that names one belongs to another proxy.
pub fn should_skip(svc: &Service) -> bool {
    let Some(spec) = &svc.spec else { return true };
    if spec.type_ == Some(ServiceType::ExternalName) {
        return true;
    }
    let ip = spec.cluster_ip.as_deref().unwrap_or("");
    if ip.is_empty() || ip == "None" {
        return true;
    }
    svc.metadata.other_proxy
}

fn parse_protocol(p: Option<&str>) -> Protocol {
    match p {
        Some("UDP") => Protocol::Udp,
        Some("SCTP") => Protocol::Sctp,
        _ => Protocol::Tcp,
    }
}

fn ips_of(family: IpFamily, list: impl IntoIterator<Item = impl AsRef<str>>) -> Vec<IpAddr> {
    // Kubernetes' ParseIPSloppy: leading zeros of an old object's IPv4
    // address are read as decimal, as upstream's proxy reads them.
    list.into_iter()
        .filter_map(|s| kpx_rules::model::parse_ip_sloppy(s.as_ref()))
        .filter(|ip| family.matches(ip))
        .collect()
}

/// The Service's ports for one family; `endpoints_for` gives each port's
/// endpoints and `categorize` fills the endpoint sets. Nothing is parsed
/// per port: the annotations were parsed when the Service was stored.
pub fn service_ports(
    stored: &StoredService,
    family: IpFamily,
    external_ips_allowed: bool,
    endpoints_for: impl Fn(&K8sPort) -> Vec<HintedEndpoint>,
    categorize: impl Fn(&mut model::ServicePort, Vec<HintedEndpoint>),
) -> Vec<model::ServicePort> {
    let svc = &*stored.object;
    let Some(spec) = &svc.spec else {
        return Vec::new();
    };
    let cluster_ips: Vec<&str> = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        _ => spec.cluster_ip.iter().map(String::as_str).collect(),
    };
    let Some(cluster_ip) = ips_of(family, cluster_ips).into_iter().next() else {
        return Vec::new();
    };
    let namespace = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let is_lb = spec.type_ == Some(ServiceType::LoadBalancer);
    let lb_ips: Vec<IpAddr> = if is_lb {
        let programmed = svc.ingress.iter().filter(|i| i.ip_mode.as_deref() != Some("Proxy"));
        ips_of(family, programmed.filter_map(|i| i.ip.clone()))
    } else {
        Vec::new()
    };
    let source_ranges: Vec<Cidr> = stored.source_ranges.iter().filter(|c| c.family() == family).copied().collect();
    let affinity = if spec.client_ip_affinity {
        spec.affinity_timeout_seconds.map(|t| t.max(1) as u32).unwrap_or(10800)
    } else {
        0
    };
    let external_ips =
        if external_ips_allowed { ips_of(family, spec.external_ips.iter().flatten()) } else { Vec::new() };

    spec.ports
        .iter()
        .flatten()
        .map(|port| {
            let port_name = port.name.clone().unwrap_or_default();
            let mut out = model::ServicePort {
                key: model::ServicePort::key_for(&namespace, &name, &port_name),
                namespace: namespace.clone(),
                name: name.clone(),
                port_name,
                protocol: parse_protocol(port.protocol.as_deref()),
                cluster_ip: Some(cluster_ip),
                port: port.port as u16,
                node_port: port.node_port.unwrap_or(0) as u16,
                external_ips: external_ips.clone(),
                load_balancer_ips: lb_ips.clone(),
                load_balancer_source_ranges: source_ranges.clone(),
                external_traffic_policy: spec.external_traffic_policy,
                internal_traffic_policy: spec.internal_traffic_policy,
                health_check_node_port: spec.health_check_node_port.unwrap_or(0) as u16,
                affinity_timeout_seconds: affinity,
                // The Service's one copy.
                scheduler: stored.annotations.scheduler.clone(),
                endpoints: Vec::new(),
                cluster_endpoints: Vec::new(),
                local_endpoints: Vec::new(),
                cluster_plan: None,
                local_plan: None,
                annotations: stored.annotations.extensions.clone(),
            };
            categorize(&mut out, endpoints_for(port));
            out
        })
        .collect()
}

/// The rule model's view of this node for one family.
pub fn node_model(node: Option<&Node>, node_name: &str, family: IpFamily) -> model::Node {
    let mut out = model::Node { name: node_name.to_string(), ..Default::default() };
    let Some(node) = node else { return out };
    if let Some(addresses) = node.status.as_ref().and_then(|s| s.addresses.as_ref()) {
        for wanted in ["InternalIP", "ExternalIP"] {
            let of_type = addresses.iter().filter(|a| a.type_ == wanted).map(|a| a.address.as_str());
            out.addresses.extend(ips_of(family, of_type));
        }
    }
    if let Some(labels) = &node.metadata.labels {
        out.zone = labels.get("topology.kubernetes.io/zone").cloned().unwrap_or_default();
        out.labels = labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    }
    if let Some(spec) = &node.spec {
        let cidrs = spec.pod_cidrs.iter().flatten().chain(spec.pod_cidr.iter());
        for cidr in cidrs.filter_map(|c| Cidr::parse_sloppy(c).ok()) {
            if cidr.family() == family && !out.pod_cidrs.contains(&cidr) {
                out.pod_cidrs.push(cidr);
            }
        }
    }
    out
}
