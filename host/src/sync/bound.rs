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
//! "Bounds"). The same table without the base-chain jumps costs nothing
//! extra (docs/repro/iptables-validate.sh). kube-proxy has no bound;
//! Kubernetes' tested envelope is 250 endpoints per Service.
//!
//! The bound is per port: it keeps one object from slowing the node, not
//! many (twenty ports of 5,000 endpoints each cost what one of 100,000
//! does).
//!
//! Over the bound, a port keeps `limit` of its cluster endpoints and
//! `limit` of its local ones (the endpoints a Local policy uses, a few
//! hundred at most on a node; both lists are programmed, so at most
//! 2 x `limit` endpoints), each the ones with the smallest hash of node
//! name, address and port. Seeded by the node, each node keeps its own
//! share, so across the cluster every endpoint still gets traffic; on a
//! node, one endpoint more or less changes at most one kept endpoint of a
//! list, so churn does not reshuffle the Service. The rest are left out
//! of what the plugin (and the extensions) see: this node sends them no
//! new connections, and their UDP conntrack entries are cleaned as for
//! an endpoint that left. Weights (`kpx.dev/weights`) do not change which
//! endpoints are kept.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpx_rules::model::{Endpoint, ServicePort};

/// A port over the bound: how many endpoints its traffic may use, and how
/// many of them are programmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftOut {
    pub total: usize,
    pub kept: usize,
}

/// Keeps at most `limit` of `port`'s cluster endpoints and at most
/// `limit` of its local endpoints (by the hash of `node`, address and
/// port), and drops every endpoint neither list keeps from
/// `port.endpoints`. None when both lists are within the bound (the port
/// is left as it was) or `limit` is 0 (no bound).
pub fn endpoints(port: &mut ServicePort, limit: usize, node: &str) -> Option<LeftOut> {
    if limit == 0 || (port.cluster_endpoints.len() <= limit && port.local_endpoints.len() <= limit) {
        return None;
    }
    let seed = fnv(FNV_OFFSET, node.as_bytes());
    let rank: Vec<(u64, IpAddr, u16)> = port.endpoints.iter().map(|e| (hash(seed, e), e.ip, e.port)).collect();
    let keep = |list: &[u32]| -> BTreeSet<u32> {
        let mut list = list.to_vec();
        if list.len() > limit {
            list.select_nth_unstable_by_key(limit - 1, |&i| rank[i as usize]);
            list.truncate(limit);
        }
        list.into_iter().collect()
    };
    let (cluster, local) = (keep(&port.cluster_endpoints), keep(&port.local_endpoints));
    let used: BTreeSet<u32> = port.cluster_endpoints.iter().chain(&port.local_endpoints).copied().collect();
    let kept: BTreeSet<u32> = cluster.union(&local).copied().collect();
    // The kept endpoints in their first order, and where each one went.
    let mut moved = vec![u32::MAX; port.endpoints.len()];
    for (to, &from) in kept.iter().enumerate() {
        moved[from as usize] = to as u32;
    }
    let renumber = |list: &[u32], keep: &BTreeSet<u32>| -> Vec<u32> {
        list.iter().filter(|i| keep.contains(i)).map(|&i| moved[i as usize]).collect()
    };
    port.cluster_endpoints = renumber(&port.cluster_endpoints, &cluster);
    port.local_endpoints = renumber(&port.local_endpoints, &local);
    let all = std::mem::take(&mut port.endpoints);
    port.endpoints = kept.iter().map(|&i| all[i as usize].clone()).collect();
    Some(LeftOut { total: used.len(), kept: kept.len() })
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a: the same on every run and every machine (a std hasher is
/// seeded per process).
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn hash(seed: u64, e: &Endpoint) -> u64 {
    let h = match e.ip {
        IpAddr::V4(v4) => fnv(seed, &v4.octets()),
        IpAddr::V6(v6) => fnv(seed, &v6.octets()),
    };
    fnv(h, &e.port.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::{IpFamily, Protocol, TrafficPolicy};
    use std::collections::HashSet;

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

    fn ips(p: &ServicePort, list: &[u32]) -> Vec<IpAddr> {
        list.iter().map(|&i| p.endpoints[i as usize].ip).collect()
    }

    fn set(v: Vec<IpAddr>) -> HashSet<IpAddr> {
        v.into_iter().collect()
    }

    #[test]
    fn within_the_bound_nothing_changes_and_0_is_no_bound() {
        let mut p = port(10, 2);
        let before = p.clone();
        assert_eq!(endpoints(&mut p, 10, "node"), None);
        assert_eq!(endpoints(&mut p, 0, "node"), None);
        assert_eq!(p, before);
    }

    #[test]
    fn over_the_bound_each_list_keeps_its_share_and_indices_follow_the_endpoints() {
        let mut p = port(1000, 3);
        let before = p.clone();
        let left_out = endpoints(&mut p, 100, "node").expect("over the bound");
        assert_eq!(left_out, LeftOut { total: 1000, kept: p.endpoints.len() });
        // The cluster list: 100 of the cluster endpoints, each the
        // endpoint it was (the fixture's endpoints differ by address).
        let cluster = set(ips(&p, &p.cluster_endpoints));
        assert_eq!(cluster.len(), 100);
        assert!(cluster.is_subset(&set(ips(&before, &before.cluster_endpoints))));
        // The local list whole, and nothing programmed beyond the lists.
        assert_eq!(ips(&p, &p.local_endpoints), ips(&before, &before.local_endpoints));
        let union: HashSet<IpAddr> = cluster.union(&set(ips(&p, &p.local_endpoints))).copied().collect();
        assert_eq!(p.endpoints.len(), union.len());
        // The first order stays.
        let order: Vec<usize> =
            p.endpoints.iter().map(|e| before.endpoints.iter().position(|b| b == e).unwrap()).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
        // The local endpoints are not favoured in the cluster list: at
        // most what their share of the hash gives them.
        let local_in_cluster = cluster.iter().filter(|ip| before.endpoints[..3].iter().any(|e| e.ip == **ip)).count();
        assert!(local_in_cluster <= 3);
    }

    #[test]
    fn a_local_list_over_the_bound_is_bounded_too_and_cluster_traffic_still_leaves_the_node() {
        let mut p = port(300, 50);
        assert!(endpoints(&mut p, 10, "node").is_some());
        assert_eq!(p.local_endpoints.len(), 10);
        assert_eq!(p.cluster_endpoints.len(), 10);
        assert!(p.local_endpoints.iter().all(|&i| p.endpoints[i as usize].conditions.is_local));
        // Not a local-only cluster list: 50 of 300 are local.
        assert!(p.cluster_endpoints.iter().any(|&i| !p.endpoints[i as usize].conditions.is_local));
        assert!(p.endpoints.len() <= 20);
    }

    #[test]
    fn local_endpoints_outside_the_cluster_list_are_kept_and_renumbered() {
        // An internal Local policy: the cluster list is empty for internal
        // traffic's sake but external traffic uses it; here the local list
        // holds endpoints the cluster list lacks.
        let mut p = port(100, 0);
        p.cluster_endpoints = (0..90).collect();
        p.local_endpoints = (90..100).collect();
        for i in 90..100 {
            p.endpoints[i].conditions.is_local = true;
        }
        let before = p.clone();
        assert_eq!(endpoints(&mut p, 20, "node"), Some(LeftOut { total: 100, kept: 30 }));
        assert_eq!(ips(&p, &p.local_endpoints), ips(&before, &before.local_endpoints));
        assert!(set(ips(&p, &p.cluster_endpoints)).is_subset(&set(ips(&before, &before.cluster_endpoints))));
    }

    #[test]
    fn one_endpoint_more_or_less_changes_at_most_one_kept_endpoint_and_nodes_differ() {
        let kept = |n: u32, node: &str| {
            let mut p = port(n, 0);
            endpoints(&mut p, 50, node);
            p.endpoints.iter().map(|e| e.ip).collect::<HashSet<IpAddr>>()
        };
        let (a, b) = (kept(500, "node-a"), kept(501, "node-a"));
        assert_eq!(a.difference(&b).count(), b.difference(&a).count());
        assert!(a.difference(&b).count() <= 1);
        // The same input on the same node keeps the same endpoints.
        assert_eq!(kept(500, "node-a"), a);
        // Another node keeps another share: across 20 nodes nearly every
        // endpoint is kept somewhere.
        assert_ne!(kept(500, "node-b"), a);
        let covered: HashSet<IpAddr> = (0..20).flat_map(|i| kept(500, &format!("node-{i}"))).collect();
        assert!(covered.len() > 400, "{} of 500 kept on some node", covered.len());
    }

    #[test]
    fn ipv6_endpoints_are_bounded_alike() {
        let endpoints_v6: Vec<Endpoint> =
            (0..40u16).map(|i| Endpoint::ready(IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, i]), 8080)).collect();
        let mut p = ServicePort::new("ns", "v6", "tcp", Protocol::Tcp, 80).with_cluster_endpoints(endpoints_v6);
        p.cluster_ip = Some("fd00::96:1".parse().unwrap());
        assert_eq!(endpoints(&mut p, 7, "node"), Some(LeftOut { total: 40, kept: 7 }));
        let view = p.view(IpFamily::V6).expect("a v6 view");
        assert!(view.has_endpoints);
        assert_eq!(view.cluster_endpoints.len(), 7);
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
        assert_eq!(endpoints(&mut p, 10, "node"), None);
        assert_eq!(p, before);
    }
}
