use super::*;
use crate::model::{Endpoint, LocalTraffic, Protocol, TrafficPolicy};

fn ep(ip: &str) -> Endpoint {
    Endpoint::ready(ip.parse().unwrap(), 8080)
}

fn svc(name: &str, ip: &str, eps: Vec<Endpoint>) -> ServicePort {
    let mut s = ServicePort::new("ns", name, "p", Protocol::Tcp, 80).with_cluster_endpoints(eps);
    s.cluster_ip = Some(ip.parse().unwrap());
    s
}

fn proxier() -> NftablesProxier {
    let mut settings = Settings::new(IpFamily::V4, "nftables");
    settings.local_traffic = LocalTraffic::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
    NftablesProxier::new(settings)
}

fn text(p: &mut NftablesProxier, full: bool) -> String {
    p.render(full).unwrap().text().to_string()
}

/// `n` services with 2 endpoints each.
fn services(n: usize) -> Vec<ServicePort> {
    (0..n)
        .map(|i| {
            let ip = format!("172.30.{}.{}", i / 250, 1 + i % 250);
            svc(
                &format!("s{i}"),
                &ip,
                vec![
                    ep(&format!("10.1.{}.{}", i / 250, 1 + i % 250)),
                    ep(&format!("10.2.{}.{}", i / 250, 1 + i % 250)),
                ],
            )
        })
        .collect()
}

#[test]
fn full_render_has_no_chain_per_service() {
    let mut small = proxier();
    small.reset(Node::default(), Cluster::default(), services(10));
    let mut big = proxier();
    big.reset(Node::default(), Cluster::default(), services(1000));
    let chains = |t: &str| t.lines().filter(|l| l.starts_with("add chain")).count();
    let (a, b) = (text(&mut small, true), text(&mut big, true));
    assert_eq!(chains(&a), chains(&b), "chains grow with services");
    assert!(a.contains("add map ip kube-proxy internal-tcp-2 { typeof ip daddr . meta l4proto . th dport . numgen random mod 2 : ip daddr . tcp dport ; }"));
    assert!(a.contains("add rule ip kube-proxy select-internal dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @internal-tcp-2"));
    assert!(a.contains("172.30.0.1 . tcp . 80 . 0 : 10.1.0.1 . 8080"), "{a}");
    assert!(a.contains("add element ip kube-proxy service-ips { 172.30.0.1 . tcp . 80 : goto cluster-ip"));
    assert!(a.lines().all(|l| l.contains(" ip kube-proxy")), "every command names family and table");
}

#[test]
fn one_service_change_is_the_same_transaction_at_any_size() {
    let change = |n: usize| {
        let mut p = proxier();
        p.reset(Node::default(), Cluster::default(), services(n));
        let _ = text(&mut p, true);
        let mut s = services(n).remove(5);
        s.endpoints.push(ep("10.9.9.9"));
        s.cluster_endpoints.push(2);
        p.apply(vec![Change::Upsert(s)]);
        text(&mut p, false)
    };
    let (at_100, at_1000) = (change(100), change(1000));
    assert_eq!(at_100, at_1000, "the transaction depends on the number of services");
    assert!(
        at_100.contains(
            "delete element ip kube-proxy internal-tcp-2 { 172.30.0.6 . tcp . 80 . 0, 172.30.0.6 . tcp . 80 . 1 }"
        ),
        "{at_100}"
    );
    assert!(at_100.contains("add map ip kube-proxy internal-tcp-3"), "a new endpoint count brings its map: {at_100}");
    assert!(at_100.contains("172.30.0.6 . tcp . 80 . 2 : 10.9.9.9 . 8080"));
    assert!(at_100.lines().count() < 12, "{at_100}");
}

#[test]
fn shared_elements_stay_while_one_user_remains() {
    let mut p = proxier();
    // Two services share an endpoint: one hairpin element.
    let a = svc("a", "172.30.0.1", vec![ep("10.1.0.1")]);
    let b = svc("b", "172.30.0.2", vec![ep("10.1.0.1")]);
    p.reset(Node::default(), Cluster::default(), vec![a, b]);
    let full = text(&mut p, true);
    assert_eq!(full.matches("10.1.0.1 . 10.1.0.1").count(), 1, "{full}");
    p.apply(vec![Change::Remove("ns/a:p".into())]);
    let partial = text(&mut p, false);
    assert!(!partial.contains("hairpin"), "the shared hairpin element must stay: {partial}");
    assert!(partial.contains("delete element ip kube-proxy service-ips { 172.30.0.1 . tcp . 80 }"), "{partial}");
    p.apply(vec![Change::Remove("ns/b:p".into())]);
    let partial = text(&mut p, false);
    assert!(partial.contains("delete element ip kube-proxy hairpin { 10.1.0.1 . 10.1.0.1 }"), "{partial}");
}

#[test]
fn affinity_services_get_their_own_chains() {
    let mut p = proxier();
    let mut s = svc("sticky", "172.30.0.9", vec![ep("10.1.0.1"), ep("10.1.0.2")]);
    s.affinity_timeout_seconds = 300;
    p.reset(Node::default(), Cluster::default(), vec![s]);
    let full = text(&mut p, true);
    assert!(full.contains("flags dynamic,timeout ; timeout 300s"), "{full}");
    assert!(full.contains("update @affinity-"), "{full}");
    assert!(full.contains("numgen random mod 2 vmap {"), "{full}");
    assert!(
        full.contains("add element ip kube-proxy affinity-internal { 172.30.0.9 . tcp . 80 : goto service-"),
        "{full}"
    );
    assert!(!full.contains("internal-tcp-2"), "affinity endpoints are not in the shared maps");
    // Removing it deletes its element before its chains.
    p.apply(vec![Change::Remove("ns/sticky:p".into())]);
    let partial = text(&mut p, false);
    let del_el = partial.find("delete element ip kube-proxy affinity-internal").unwrap();
    let del_chain = partial.find("delete chain").unwrap();
    assert!(del_el < del_chain, "{partial}");
}

#[test]
fn no_endpoints_reject_and_local_policy_drop() {
    let mut p = proxier();
    let mut none = svc("none", "172.30.0.3", vec![]);
    none.node_port = 30003;
    let mut local = svc("local", "172.30.0.4", vec![ep("10.1.0.4")]);
    local.node_port = 30004;
    local.external_traffic_policy = TrafficPolicy::Local;
    p.reset(Node::default(), Cluster::default(), vec![none, local]);
    let full = text(&mut p, true);
    assert!(full.contains("172.30.0.3 . tcp . 80 : goto reject-chain"), "{full}");
    assert!(full.contains("tcp . 30003 : goto reject-chain"), "{full}");
    assert!(full.contains("tcp . 30004 : drop"), "{full}");
    assert!(full.contains("tcp . 30004 : goto nodeport-local"), "{full}");
    assert!(full.contains("nodeport-shortcut-tcp-1 { tcp . 30004 . 0 : 10.1.0.4 . 8080"), "{full}");
}
