//! Synthetic clusters as ordinary Kubernetes manifests: a realistic mix of
//! ClusterIP (70%), NodePort (20%) and LoadBalancer (10%) Services, each
//! with one EndpointSlice.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

/// The node the synthetic cluster's Services are proxied on.
pub(crate) const NODE: &str = "bench-node";

/// Service i's cluster IP: 10.96.0.0/12 upwards (skipping .0 and .255).
pub fn cluster_ip(i: usize) -> Ipv4Addr {
    let n = 0x0A60_0000u32 + 1 + (i as u32 / 254) * 256 + (i as u32 % 254);
    Ipv4Addr::from(n)
}

/// Endpoint j of service i: inside 10.128.0.0/9.
pub fn endpoint_ip(i: usize, j: usize) -> Ipv4Addr {
    let n = 0x0A80_0000u32 + (i as u32) * 128 + j as u32;
    Ipv4Addr::from(n)
}

/// The manifests of `services` Services with `endpoints` endpoints each.
/// `probe_backend`: also a Service zzz-probe (10.95.0.10:80, sorted last,
/// so iptables reaches it after every other Service) whose endpoint is
/// `probe_backend:8080`, for latency measurements.
pub fn manifests(services: usize, endpoints: usize, probe_backend: Option<&str>) -> String {
    let mut out = String::with_capacity(services * (400 + endpoints * 40));
    for i in 0..services {
        let (kind, extra) = match i % 10 {
            0 => ("LoadBalancer", format!("\nstatus: {{loadBalancer: {{ingress: [{{ip: {}}}]}}}}", lb_ip(i))),
            1 | 2 => ("NodePort", String::new()),
            _ => ("ClusterIP", String::new()),
        };
        let node_port = if kind == "ClusterIP" { String::new() } else { format!(", nodePort: {}", 20000 + i % 45000) };
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: bench}}\nspec: {{type: {kind}, clusterIP: {}, ports: [{{name: http, port: 80, targetPort: 8080{node_port}}}]}}{extra}\n",
            cluster_ip(i)
        );
        let _ = write!(
            out,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: svc-{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: svc-{i}}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n"
        );
        for j in 0..endpoints {
            let _ = writeln!(out, "- addresses: [{}]", endpoint_ip(i, j));
        }
    }
    if let Some(backend) = probe_backend {
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: zzz-probe, namespace: bench}}\nspec: {{clusterIP: 10.95.0.10, ports: [{{name: http, port: 80, targetPort: 8080}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: zzz-probe-1, namespace: bench, labels: {{kubernetes.io/service-name: zzz-probe}}}}\naddressType: IPv4\nports: [{{name: http, port: 8080}}]\nendpoints:\n- addresses: [{backend}]\n"
        );
    }
    out
}

/// Service i's load-balancer IP (every tenth Service is a LoadBalancer).
pub fn lb_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0xC633_6400u32 + i as u32) // 198.51.100.0 upwards
}
