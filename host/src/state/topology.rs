//! Which endpoints each kind of traffic may use, decided once in the host
//! for every mode: upstream's `CategorizeEndpoints`, with topology hints
//! (PreferSameNode, then PreferSameZone) and the terminating fallback
//! (KEP-1669).

use kpx_rules::model::{Endpoint, ServicePort, TrafficPolicy};

/// An endpoint with the hints its EndpointSlice gave it.
#[derive(Debug, Clone)]
pub struct HintedEndpoint {
    pub endpoint: Endpoint,
    pub zone_hints: Vec<String>,
    pub node_hints: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    None,
    SameNode,
    SameZone,
}

fn externally_accessible(svc: &ServicePort) -> bool {
    svc.node_port != 0 || !svc.load_balancer_ips.is_empty() || !svc.external_ips.is_empty()
}

/// upstream's `UsesClusterEndpoints`: an internal Cluster policy, or any
/// external access at all (even under an external Local policy, whose
/// pod and node traffic is short-circuited to the cluster endpoints).
pub fn uses_cluster_endpoints(svc: &ServicePort) -> bool {
    svc.internal_traffic_policy == TrafficPolicy::Cluster || externally_accessible(svc)
}

/// upstream's `UsesLocalEndpoints`.
pub fn uses_local_endpoints(svc: &ServicePort) -> bool {
    svc.internal_traffic_policy == TrafficPolicy::Local
        || (externally_accessible(svc) && svc.external_traffic_policy == TrafficPolicy::Local)
}

/// Every ready endpoint carries a hint of the kind, and one names us.
fn topology(endpoints: &[HintedEndpoint], node_name: &str, zone: &str) -> Topology {
    let ready: Vec<&HintedEndpoint> = endpoints.iter().filter(|e| e.endpoint.conditions.ready).collect();
    let all_node = ready.iter().all(|e| !e.node_hints.is_empty());
    if !ready.is_empty() && all_node && ready.iter().any(|e| e.node_hints.iter().any(|n| n == node_name)) {
        return Topology::SameNode;
    }
    let all_zone = ready.iter().all(|e| !e.zone_hints.is_empty());
    if !ready.is_empty() && all_zone && !zone.is_empty() && ready.iter().any(|e| e.zone_hints.iter().any(|z| z == zone))
    {
        return Topology::SameZone;
    }
    Topology::None
}

fn available(e: &HintedEndpoint, mode: Topology, node_name: &str, zone: &str) -> bool {
    match mode {
        Topology::None => true,
        Topology::SameNode => e.node_hints.iter().any(|n| n == node_name),
        Topology::SameZone => e.zone_hints.iter().any(|z| z == zone),
    }
}

fn indices(endpoints: &[HintedEndpoint], keep: impl Fn(&HintedEndpoint) -> bool) -> Vec<u32> {
    endpoints.iter().enumerate().filter(|(_, e)| keep(e)).map(|(i, _)| i as u32).collect()
}

/// Fills `svc.endpoints`, `svc.cluster_endpoints` and `svc.local_endpoints`.
pub fn categorize(svc: &mut ServicePort, endpoints: Vec<HintedEndpoint>, node_name: &str, zone: &str) {
    let serving_terminating = |e: &HintedEndpoint| e.endpoint.conditions.serving && e.endpoint.conditions.terminating;
    let mut cluster = Vec::new();
    if uses_cluster_endpoints(svc) {
        let mode = topology(&endpoints, node_name, zone);
        cluster = indices(&endpoints, |e| e.endpoint.conditions.ready && available(e, mode, node_name, zone));
        if cluster.is_empty() {
            cluster = indices(&endpoints, serving_terminating);
        }
    }
    let mut local = Vec::new();
    if uses_local_endpoints(svc) {
        local = indices(&endpoints, |e| e.endpoint.conditions.is_local && e.endpoint.conditions.ready);
        if local.is_empty() {
            local = indices(&endpoints, |e| e.endpoint.conditions.is_local && serving_terminating(e));
        }
    }
    svc.cluster_endpoints = cluster;
    svc.local_endpoints = local;
    // Not `collect()`: collected in place, the Vec would keep the hinted
    // endpoints' larger allocation for as long as the state holds the port.
    svc.endpoints = Vec::with_capacity(endpoints.len());
    svc.endpoints.extend(endpoints.into_iter().map(|e| e.endpoint));
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::{Conditions, Protocol};

    fn ep(
        ip: &str,
        ready: bool,
        serving: bool,
        terminating: bool,
        local: bool,
        zones: &[&str],
        nodes: &[&str],
    ) -> HintedEndpoint {
        HintedEndpoint {
            endpoint: Endpoint {
                ip: ip.parse().unwrap(),
                port: 80,
                conditions: Conditions { ready, serving, terminating, is_local: local },
                zone: None,
                weight: 1,
            },
            zone_hints: zones.iter().map(|s| s.to_string()).collect(),
            node_hints: nodes.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn svc(itp: TrafficPolicy, etp: TrafficPolicy, node_port: u16) -> ServicePort {
        let mut s = ServicePort::new("ns", "s", "", Protocol::Tcp, 80);
        s.cluster_ip = Some("10.96.0.1".parse().unwrap());
        s.node_port = node_port;
        s.internal_traffic_policy = itp;
        s.external_traffic_policy = etp;
        s
    }

    use TrafficPolicy::{Cluster, Local};

    fn run(s: &mut ServicePort, eps: Vec<HintedEndpoint>) -> (Vec<u32>, Vec<u32>) {
        categorize(s, eps, "node-a", "zone-a");
        (s.cluster_endpoints.clone(), s.local_endpoints.clone())
    }

    #[test]
    fn cluster_policy_uses_ready_then_serving_terminating() {
        let mut s = svc(Cluster, Cluster, 0);
        let eps = vec![
            ep("10.0.0.1", true, true, false, false, &[], &[]),
            ep("10.0.0.2", false, true, true, false, &[], &[]),
        ];
        assert_eq!(run(&mut s, eps), (vec![0], vec![]));
        let eps = vec![
            ep("10.0.0.1", false, false, true, false, &[], &[]),
            ep("10.0.0.2", false, true, true, false, &[], &[]),
        ];
        assert_eq!(run(&mut s, eps), (vec![1], vec![]));
    }

    #[test]
    fn local_policies_use_local_endpoints_with_fallback() {
        let mut s = svc(Local, Cluster, 0);
        let eps =
            vec![ep("10.0.0.1", true, true, false, false, &[], &[]), ep("10.0.0.2", false, true, true, true, &[], &[])];
        assert_eq!(run(&mut s, eps), (vec![], vec![1]), "ITP Local only: no cluster set; terminating local fallback");
        let mut s = svc(Cluster, Local, 30080);
        let eps =
            vec![ep("10.0.0.1", true, true, false, true, &[], &[]), ep("10.0.0.2", true, true, false, false, &[], &[])];
        assert_eq!(run(&mut s, eps), (vec![0, 1], vec![0]));
        let mut s = svc(Cluster, Local, 0);
        let eps = vec![ep("10.0.0.1", true, true, false, true, &[], &[])];
        assert_eq!(run(&mut s, eps), (vec![0], vec![]), "ETP Local does not apply without external access");
    }

    #[test]
    fn zone_and_node_hints() {
        let mut s = svc(Cluster, Cluster, 0);
        let eps = vec![
            ep("10.0.0.1", true, true, false, false, &["zone-a"], &[]),
            ep("10.0.0.2", true, true, false, false, &["zone-b"], &[]),
        ];
        assert_eq!(run(&mut s, eps), (vec![0], vec![]));
        // One ready endpoint without hints disables topology.
        let eps = vec![
            ep("10.0.0.1", true, true, false, false, &["zone-a"], &[]),
            ep("10.0.0.2", true, true, false, false, &[], &[]),
        ];
        assert_eq!(run(&mut s, eps), (vec![0, 1], vec![]));
        // No hint for our zone: ignored.
        let eps = vec![ep("10.0.0.1", true, true, false, false, &["zone-c"], &[])];
        assert_eq!(run(&mut s, eps), (vec![0], vec![]));
        // Node hints win over zone hints.
        let eps = vec![
            ep("10.0.0.1", true, true, false, false, &["zone-a"], &["node-b"]),
            ep("10.0.0.2", true, true, false, false, &["zone-b"], &["node-a"]),
        ];
        assert_eq!(run(&mut s, eps), (vec![1], vec![]));
    }
}
