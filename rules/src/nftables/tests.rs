use super::*;
use crate::model::{Endpoint, LocalTraffic, Protocol, ProxyMode, TrafficPolicy};
use crate::ops::nftables::{
    Data, Element, HostSet, SetDecl, SetRef, Value, Verdict, VerdictKind, decode_elements, decode_keys,
};

fn ep(ip: &str) -> Endpoint {
    Endpoint::ready(ip.parse().unwrap(), 8080)
}

fn svc(name: &str, ip: &str, eps: Vec<Endpoint>) -> ServicePort {
    let mut s = ServicePort::new("ns", name, "p", Protocol::Tcp, 80).with_cluster_endpoints(eps);
    s.cluster_ip = Some(ip.parse().unwrap());
    s
}

fn proxier() -> NftablesProxier {
    let mut settings = Settings::new(IpFamily::V4, ProxyMode::Nftables);
    settings.local_traffic = LocalTraffic::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
    NftablesProxier::new(settings)
}

fn tx(p: &mut NftablesProxier, full: bool) -> Transaction {
    match p.render(full).unwrap() {
        AnyRuleset::Nftables(t) => t,
        other => panic!("unexpected {other:?}"),
    }
}

/// Declarations known to a transaction (the host's, its own, and earlier ones).
fn decl_of(name: &str, known: &[SetDecl]) -> SetDecl {
    HostSet::from_name(name)
        .map(HostSet::declaration)
        .or_else(|| known.iter().find(|d| d.name == name).cloned())
        .unwrap_or_else(|| panic!("no declaration of {name}"))
}

fn declared_sets(t: &Transaction) -> Vec<SetDecl> {
    t.ops.iter().filter_map(|op| if let Op::AddSet(d) = op { Some(d.clone()) } else { None }).collect()
}

/// (added or deleted, set, elements) in the transaction's order.
fn element_ops(t: &Transaction, known: &[SetDecl]) -> Vec<(bool, String, Vec<Element>)> {
    let mut known = known.to_vec();
    known.extend(declared_sets(t));
    t.ops
        .iter()
        .filter_map(|op| match op {
            Op::AddElements(e) | Op::DeleteElements(e) => {
                let decl = decl_of(e.set.name(), &known);
                let add = matches!(op, Op::AddElements(_));
                let decoded =
                    if add { decode_elements(&decl, IpFamily::V4, e) } else { decode_keys(&decl, IpFamily::V4, e) };
                Some((add, e.set.name().to_string(), decoded.unwrap()))
            }
            _ => None,
        })
        .collect()
}

fn added(t: &Transaction, known: &[SetDecl], set: &str) -> Vec<Element> {
    element_ops(t, known).into_iter().filter(|(add, s, _)| *add && s == set).flat_map(|(_, _, e)| e).collect()
}

fn ip(s: &str) -> Value {
    Value::Address(s.parse().unwrap())
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
    let chains = |t: &Transaction| t.ops.iter().filter(|op| matches!(op, Op::AddChain(_))).count();
    let mut small = proxier();
    small.reset(Node::default(), Cluster::default(), services(10));
    let mut big = proxier();
    big.reset(Node::default(), Cluster::default(), services(1000));
    let (a, b) = (tx(&mut small, true), tx(&mut big, true));
    assert_eq!(chains(&a), chains(&b), "chains grow with services");
    let decls = declared_sets(&a);
    let map = decls.iter().find(|d| d.name == "internal-tcp-2").expect("an endpoint map per count");
    assert_eq!(map.data, Some(crate::ops::nftables::DataType::Endpoint));
    let slots = added(&a, &[], "internal-tcp-2");
    let key = |slot| vec![ip("172.30.0.1"), Value::Protocol(Protocol::Tcp), Value::Port(80), Value::Integer(slot)];
    let first = slots.iter().find(|e| e.key == key(0)).unwrap();
    assert_eq!(first.data, Some(Data::Endpoint("10.1.0.1".parse().unwrap(), 8080)));
    let dispatch = added(&a, &[], "service-ips");
    assert!(
        dispatch.iter().any(|e| e.key[0] == ip("172.30.0.1")
            && e.data == Some(Data::Verdict(VerdictKind::Goto, Some("cluster-ip".into()))))
    );
}

#[test]
fn one_service_change_is_the_same_transaction_at_any_size() {
    let change = |n: usize| {
        let mut p = proxier();
        p.reset(Node::default(), Cluster::default(), services(n));
        let full = tx(&mut p, true);
        let known = declared_sets(&full);
        let mut s = services(n).remove(5);
        s.endpoints.push(ep("10.9.9.9"));
        s.cluster_endpoints.push(2);
        p.apply(vec![Change::Upsert(s)]);
        (tx(&mut p, false), known)
    };
    let ((at_100, known), (at_1000, _)) = (change(100), change(1000));
    assert_eq!(at_100, at_1000, "the transaction depends on the number of services");
    let ops = element_ops(&at_100, &known);
    let (deleted_from, deleted): (Vec<String>, Vec<Vec<Value>>) = ops
        .iter()
        .filter(|(add, _, _)| !add)
        .flat_map(|(_, s, e)| e.iter().map(move |e| (s.clone(), e.key.clone())))
        .unzip();
    assert!(deleted_from.iter().all(|s| s == "internal-tcp-2"), "{ops:?}");
    assert_eq!(deleted.len(), 2);
    // The full render declared the map one size up: growing by one adds
    // elements only, no map and no rule (a new rule costs the kernel a
    // validation of the whole table).
    assert!(known.iter().any(|d| d.name == "internal-tcp-3"), "no headroom map: {known:?}");
    assert!(declared_sets(&at_100).is_empty(), "{at_100:?}");
    assert!(!at_100.ops.iter().any(|op| matches!(op, Op::AddRule(_))), "{at_100:?}");
    let slot2 = added(&at_100, &known, "internal-tcp-3");
    assert!(slot2.iter().any(|e| e.key[3] == Value::Integer(2) && e.data == Some(Data::Endpoint("10.9.9.9".parse().unwrap(), 8080))));
    assert!(at_100.ops.len() < 8, "{at_100:?}");
}

#[test]
fn a_new_endpoint_count_brings_its_map_rule_and_the_next_size_up_once() {
    let mut p = proxier();
    p.reset(Node::default(), Cluster::default(), services(3));
    let full = tx(&mut p, true);
    let mut known = declared_sets(&full);
    let names =
        |d: &[SetDecl]| d.iter().map(|d| d.name.clone()).filter(|n| n.starts_with("internal-")).collect::<Vec<_>>();
    assert_eq!(names(&known), ["internal-tcp-2", "internal-tcp-3"]);
    let count_rules = |t: &Transaction| {
        t.ops.iter().filter(|op| matches!(op, Op::AddRule(r) if r.chain == "select-internal" && matches!(r.verdict, Verdict::DnatMap { .. }))).count()
    };
    assert_eq!(count_rules(&full), 2);
    // s0 jumps from 2 endpoints to 4: maps 4 and 5, with their rules.
    let mut s = services(3).remove(0);
    for i in 0..2 {
        s.endpoints.push(ep(&format!("10.9.9.{i}")));
        s.cluster_endpoints.push(2 + i);
    }
    p.apply(vec![Change::Upsert(s.clone())]);
    let grown = tx(&mut p, false);
    assert_eq!(names(&declared_sets(&grown)), ["internal-tcp-4", "internal-tcp-5"]);
    assert_eq!(count_rules(&grown), 2);
    known.extend(declared_sets(&grown));
    assert_eq!(added(&grown, &known, "internal-tcp-4").len(), 4);
    // s1 then grows to 4 as well, and s0 to 5: elements only.
    let mut s1 = services(3).remove(1);
    for i in 0..2 {
        s1.endpoints.push(ep(&format!("10.8.9.{i}")));
        s1.cluster_endpoints.push(2 + i);
    }
    s.endpoints.push(ep("10.9.9.7"));
    s.cluster_endpoints.push(4);
    p.apply(vec![Change::Upsert(s1), Change::Upsert(s)]);
    let more = tx(&mut p, false);
    assert!(declared_sets(&more).is_empty(), "{more:?}");
    assert_eq!(count_rules(&more), 0);
    assert_eq!(added(&more, &known, "internal-tcp-5").len(), 5);
    // A full render keeps the maps in use and one size up only.
    let again = tx(&mut p, true);
    assert_eq!(
        names(&declared_sets(&again)),
        ["internal-tcp-2", "internal-tcp-3", "internal-tcp-4", "internal-tcp-5", "internal-tcp-6"]
    );
}

#[test]
fn shared_elements_stay_while_one_user_remains() {
    let mut p = proxier();
    // Two services share an endpoint: one hairpin element.
    let a = svc("a", "172.30.0.1", vec![ep("10.1.0.1")]);
    let b = svc("b", "172.30.0.2", vec![ep("10.1.0.1")]);
    p.reset(Node::default(), Cluster::default(), vec![a, b]);
    let full = tx(&mut p, true);
    let known = declared_sets(&full);
    assert_eq!(added(&full, &[], "hairpin").len(), 1);
    p.apply(vec![Change::Remove("ns/a:p".into())]);
    let partial = tx(&mut p, false);
    let ops = element_ops(&partial, &known);
    assert!(!ops.iter().any(|(_, s, _)| s == "hairpin"), "the shared hairpin element must stay: {ops:?}");
    assert!(ops.iter().any(|(add, s, e)| !add && s == "service-ips" && e[0].key[0] == ip("172.30.0.1")));
    p.apply(vec![Change::Remove("ns/b:p".into())]);
    let ops = element_ops(&tx(&mut p, false), &known);
    assert!(ops.iter().any(|(add, s, e)| !add && s == "hairpin" && e[0].key == [ip("10.1.0.1"), ip("10.1.0.1")]));
}

#[test]
fn affinity_services_get_their_own_chains() {
    let mut p = proxier();
    let mut s = svc("sticky", "172.30.0.9", vec![ep("10.1.0.1"), ep("10.1.0.2")]);
    s.affinity_timeout_seconds = 300;
    p.reset(Node::default(), Cluster::default(), vec![s]);
    let full = tx(&mut p, true);
    let decls = declared_sets(&full);
    assert!(decls.iter().any(|d| d.timeout_seconds == Some(300)), "{decls:?}");
    assert!(full.ops.iter().any(|op| matches!(op, Op::AddRule(r) if r.statements.iter().any(|s| matches!(s, crate::ops::nftables::Statement::AffinityUpdate(_))))));
    let aff = added(&full, &[], "affinity-internal");
    assert!(matches!(&aff[0].data, Some(Data::Verdict(VerdictKind::Goto, Some(c))) if c.starts_with("service-")));
    assert!(!decls.iter().any(|d| d.name == "internal-tcp-2"), "affinity endpoints are not in the shared maps");
    // Removing it deletes its element before its chains.
    p.apply(vec![Change::Remove("ns/sticky:p".into())]);
    let partial = tx(&mut p, false);
    let del_el = partial
        .ops
        .iter()
        .position(|op| matches!(op, Op::DeleteElements(e) if e.set == SetRef::Own("affinity-internal".into())))
        .unwrap();
    let del_chain = partial.ops.iter().position(|op| matches!(op, Op::DeleteChain(_))).unwrap();
    assert!(del_el < del_chain, "{partial:?}");
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
    let full = tx(&mut p, true);
    let reject = Some(Data::Verdict(VerdictKind::Reject, None));
    let np = |port| vec![Value::Protocol(Protocol::Tcp), Value::Port(port)];
    assert!(added(&full, &[], "no-endpoint-services").iter().any(|e| e.key[0] == ip("172.30.0.3") && e.data == reject));
    let no_ep = added(&full, &[], "no-endpoint-nodeports");
    assert!(no_ep.iter().any(|e| e.key == np(30003) && e.data == reject));
    assert!(no_ep.iter().any(|e| e.key == np(30004) && e.data == Some(Data::Verdict(VerdictKind::Drop, None))));
    assert!(
        added(&full, &[], "service-nodeports")
            .iter()
            .any(|e| e.key == np(30004)
                && e.data == Some(Data::Verdict(VerdictKind::Goto, Some("nodeport-local".into()))))
    );
    let shortcut = added(&full, &[], "nodeport-shortcut-tcp-1");
    assert_eq!(shortcut[0].data, Some(Data::Endpoint("10.1.0.4".parse().unwrap(), 8080)));
}

/// The index is sized from the estimate: at least each Service's elements
/// (so it does not grow during a full render), and not far past them (an
/// estimate of twice the count doubled the index at 30k Services).
#[test]
fn the_estimate_covers_each_kind_of_service_closely() {
    let settings = Settings::new(IpFamily::V4, ProxyMode::Nftables);
    let node = Node { addresses: vec!["192.168.0.10".parse().unwrap()], ..Default::default() };
    let ctx = elements::Context { settings: &settings, node: &node };
    let names = Names::default();
    let eps = |n: usize, local: usize| -> Vec<Endpoint> {
        (0..n)
            .map(|i| {
                let mut e = ep(&format!("10.1.{}.{}", i / 200, i % 200 + 1));
                e.conditions.is_local = i < local;
                e
            })
            .collect()
    };
    let cluster = svc("cluster", "172.30.0.1", eps(10, 0));
    let mut node_port = svc("np", "172.30.0.2", eps(10, 0));
    node_port.node_port = 30080;
    let mut lb = svc("lb", "172.30.0.3", eps(10, 0));
    lb.node_port = 30081;
    lb.load_balancer_ips = vec!["198.51.100.1".parse().unwrap()];
    lb.external_ips = vec!["192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap()];
    let mut firewalled = lb.clone();
    firewalled.name = "fw".into();
    firewalled.load_balancer_source_ranges = vec!["10.0.0.0/8".parse().unwrap(), "192.168.0.0/16".parse().unwrap()];
    let mut local = svc("local", "172.30.0.4", eps(10, 4));
    local.node_port = 30082;
    local.load_balancer_ips = vec!["198.51.100.2".parse().unwrap()];
    local.external_traffic_policy = TrafficPolicy::Local;
    local.internal_traffic_policy = TrafficPolicy::Local;
    let mut no_local = local.clone();
    no_local.name = "no-local".into();
    local.local_endpoints = vec![0, 1, 2, 3];
    let empty = svc("empty", "172.30.0.5", vec![]);
    let big = svc("big", "172.30.0.6", eps(1000, 0));
    for s in [cluster, node_port, lb, firewalled, local, no_local, empty, big] {
        let made = elements::contribution(&ctx, &s, &names).elements.len();
        let estimate = elements::estimate(&s);
        assert!(
            made <= estimate && estimate <= made + made / 4 + 4,
            "{}: {made} elements, estimate {estimate}",
            s.name
        );
    }
}
