//! The bound on the endpoints one service port programs in iptables mode
//! (`--iptables-max-endpoints-per-port`).
//!
//! Every nf_tables commit that adds a rule with a jump or a NAT target
//! makes the kernel validate every rule reachable from the table's base
//! chains (`nft_table_validate`), and iptables-nft writes nat rules into
//! one table. So each rule a Service's endpoints add to the nat table is
//! paid again by every later change of any Service: with 100,000
//! endpoints behind one port (300,000 rules), a one-endpoint change of
//! another Service took 121 ms against 22.5 ms (docs/RELIABILITY.md,
//! "Bounds"). The same table shape without the base-chain jumps costs
//! nothing extra (docs/repro/iptables-validate.sh). kube-proxy has no
//! bound; Kubernetes' tested envelope is 250 endpoints per Service.
//!
//! Over the bound, a port keeps the endpoints its Local policy uses first
//! (a node has at most a few hundred pods), then the others with the
//! smallest stable hash of address and port: one endpoint more or less
//! changes at most one endpoint of the kept set, so churn does not
//! reshuffle the Service. The rest are left out of what the plugin sees:
//! this node sends them no new connections.

use std::collections::HashSet;
use std::net::IpAddr;

use kpx_rules::model::{Endpoint, ServicePort};

/// A port over the bound: how many endpoints it has and how many it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftOut {
    pub total: usize,
    pub kept: usize,
}

/// Keeps at most `limit` of the endpoints `port`'s traffic may use (its
/// cluster and local endpoints; the others are never programmed) and
/// drops every other endpoint from `port.endpoints`. None when the port
/// is within the bound (it is left as it was).
pub fn endpoints(port: &mut ServicePort, limit: usize) -> Option<LeftOut> {
    let local: HashSet<u32> = port.local_endpoints.iter().copied().collect();
    let mut used: Vec<u32> = port.local_endpoints.clone();
    used.extend(port.cluster_endpoints.iter().filter(|i| !local.contains(i)));
    if used.len() <= limit {
        return None;
    }
    let total = used.len();
    let rank = |&i: &u32| {
        let e = &port.endpoints[i as usize];
        (!local.contains(&i), stable_hash(e), e.ip, e.port)
    };
    if limit > 0 {
        used.select_nth_unstable_by_key(limit - 1, rank);
    }
    used.truncate(limit);
    // The kept endpoints in their first order, and where each one went.
    used.sort_unstable();
    let mut moved = vec![u32::MAX; port.endpoints.len()];
    for (to, &from) in used.iter().enumerate() {
        moved[from as usize] = to as u32;
    }
    let renumber =
        |list: &[u32]| -> Vec<u32> { list.iter().map(|&i| moved[i as usize]).filter(|&i| i != u32::MAX).collect() };
    port.cluster_endpoints = renumber(&port.cluster_endpoints);
    port.local_endpoints = renumber(&port.local_endpoints);
    let all = std::mem::take(&mut port.endpoints);
    port.endpoints = used.iter().map(|&i| all[i as usize].clone()).collect();
    Some(LeftOut { total, kept: limit })
}

/// FNV-1a over the address and port: the same on every node and run (a
/// std hasher is seeded per process).
fn stable_hash(e: &Endpoint) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let octets = match e.ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    for b in octets.into_iter().chain(e.port.to_be_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::{Conditions, Protocol, TrafficPolicy};

    fn ep(i: u32, local: bool) -> Endpoint {
        let mut e = Endpoint::ready(IpAddr::from([10, 1, (i >> 8) as u8, i as u8]), 8080);
        e.conditions.is_local = local;
        e
    }

    /// `n` ready endpoints, the first `locals` on this node; cluster
    /// endpoints all, local ones the local ones (an external Local policy).
    fn port(n: u32, locals: u32) -> ServicePort {
        let endpoints: Vec<Endpoint> = (0..n).map(|i| ep(i, i < locals)).collect();
        let mut p = ServicePort::new("ns", "big", "tcp", Protocol::Tcp, 80).with_cluster_endpoints(endpoints);
        p.cluster_ip = Some(IpAddr::from([10, 96, 0, 1]));
        p.node_port = 30080;
        p.external_traffic_policy = TrafficPolicy::Local;
        p.local_endpoints = (0..locals).collect();
        p
    }

    fn kept_ips(p: &ServicePort, list: &[u32]) -> Vec<IpAddr> {
        list.iter().map(|&i| p.endpoints[i as usize].ip).collect()
    }

    #[test]
    fn within_the_bound_nothing_changes() {
        let mut p = port(10, 2);
        let before = p.clone();
        assert_eq!(endpoints(&mut p, 10), None);
        assert_eq!(p, before);
    }

    #[test]
    fn over_the_bound_local_endpoints_stay_and_indices_follow_the_endpoints() {
        let mut p = port(1000, 3);
        let before = p.clone();
        assert_eq!(endpoints(&mut p, 100), Some(LeftOut { total: 1000, kept: 100 }));
        assert_eq!(p.endpoints.len(), 100);
        assert_eq!(p.cluster_endpoints.len(), 100);
        // Every index points into the kept endpoints, and to the endpoint
        // it meant before.
        assert_eq!(kept_ips(&p, &p.local_endpoints), kept_ips(&before, &before.local_endpoints));
        let kept: HashSet<IpAddr> = kept_ips(&p, &p.cluster_endpoints).into_iter().collect();
        assert_eq!(kept.len(), 100);
        assert!(kept.iter().all(|ip| before.endpoints.iter().any(|e| e.ip == *ip)));
        // The first order stays.
        let order: Vec<usize> =
            p.endpoints.iter().map(|e| before.endpoints.iter().position(|b| b == e).unwrap()).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    }

    #[test]
    fn one_endpoint_more_or_less_changes_at_most_one_kept_endpoint() {
        let kept = |n: u32| {
            let mut p = port(n, 0);
            endpoints(&mut p, 50);
            p.endpoints.iter().map(|e| e.ip).collect::<HashSet<IpAddr>>()
        };
        let (a, b) = (kept(500), kept(501));
        assert_eq!(a.difference(&b).count(), b.difference(&a).count());
        assert!(a.difference(&b).count() <= 1);
        // The same input keeps the same endpoints: nothing random.
        assert_eq!(kept(500), a);
    }

    #[test]
    fn endpoints_no_traffic_uses_do_not_count() {
        // Internal Local policy, not externally reachable, no local
        // endpoints: nothing is programmed per endpoint, whatever the count.
        let mut p = port(1000, 0);
        p.node_port = 0;
        p.internal_traffic_policy = TrafficPolicy::Local;
        p.cluster_endpoints.clear();
        let before = p.clone();
        assert_eq!(endpoints(&mut p, 10), None);
        assert_eq!(p, before);
    }

    #[test]
    fn the_kept_endpoints_keep_the_service_served() {
        let mut p = port(20, 0);
        endpoints(&mut p, 1);
        let view = p.view(kpx_rules::model::IpFamily::V4).expect("a v4 view");
        assert!(view.has_endpoints);
        assert_eq!(view.cluster_endpoints.len(), 1);
        assert_eq!(
            p.endpoints[0].conditions,
            Conditions { ready: true, serving: true, terminating: false, is_local: false }
        );
    }
}
