//! The generator's typed output. What the kernel receives (the host's
//! rendering around it, upstream's sample lines) is tested in
//! host/src/kernel/iptables/tests.rs.

use super::*;
use crate::hash::{endpoint_chain, service_chain};
use crate::model::{Endpoint, IpFamily, LocalTraffic, Protocol, ProxyMode};
use crate::ops::iptables::{Hook, Match, Rule, Target};

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint::ready(ip.parse().unwrap(), port)
}

fn svc(ns: &str, name: &str, port_name: &str, ip: &str, port: u16, eps: Vec<Endpoint>) -> ServicePort {
    let mut s = ServicePort::new(ns, name, port_name, Protocol::Tcp, port).with_cluster_endpoints(eps);
    s.cluster_ip = Some(ip.parse().unwrap());
    s
}

fn proxier() -> IptablesProxier {
    let mut settings = Settings::new(IpFamily::V4, ProxyMode::Iptables);
    settings.local_traffic = LocalTraffic::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
    IptablesProxier::new(settings)
}

fn ruleset(p: &mut IptablesProxier, full: bool) -> Ruleset {
    match p.render(full).unwrap() {
        AnyRuleset::Iptables(r) => r,
        other => panic!("unexpected {other:?}"),
    }
}

fn declared(r: &Ruleset) -> Vec<&str> {
    r.chains.iter().map(|(_, c)| c.as_str()).collect()
}

fn rules_in<'a>(r: &'a Ruleset, chain: &str) -> Vec<&'a Rule> {
    r.rules.iter().filter(|x| x.chain == chain).collect()
}

#[test]
fn one_endpoint_chain_per_endpoint_and_statistic_choice() {
    let mut p = proxier();
    let eps = (1..=4).map(|i| ep(&format!("10.1.0.{i}"), 8080)).collect();
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "s", "", "172.30.0.1", 80, eps)]);
    let r = ruleset(&mut p, true);
    let svc_chain = service_chain("KUBE-SVC-", "ns/s", "tcp");
    assert_eq!(declared(&r).iter().filter(|c| c.starts_with("KUBE-SEP-")).count(), 4);
    let probs: Vec<u32> = rules_in(&r, &svc_chain)
        .iter()
        .flat_map(|x| &x.matches)
        .filter_map(|m| match m {
            Match::StatisticRandom(p) => Some(*p),
            _ => None,
        })
        .collect();
    use crate::ops::probability_one_in as p1;
    assert_eq!(probs, [p1(4), p1(3), p1(2)], "upstream's 1/(n-i)");
    let dnat = rules_in(&r, &endpoint_chain("ns/s", "tcp", "10.1.0.1:8080"))
        .iter()
        .find_map(|x| match x.target {
            Target::Dnat(ip, port) => Some((ip, port)),
            _ => None,
        })
        .unwrap();
    assert_eq!(dnat, ("10.1.0.1".parse().unwrap(), 8080));
}

#[test]
fn no_endpoints_rejects_in_the_filter_hook() {
    let mut p = proxier();
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "empty", "http", "172.30.0.9", 80, vec![])]);
    let r = ruleset(&mut p, true);
    assert!(r.chains.is_empty());
    let reject = r.rules.iter().find(|x| x.target == Target::Reject).unwrap();
    assert_eq!(Hook::of(reject.table, &reject.chain), Some(Hook::FilterServices));
    assert!(reject.matches.contains(&Match::destination_ip("172.30.0.9".parse().unwrap())));
}

#[test]
fn partial_render_writes_only_changed_chains_and_deletes_stale() {
    let mut p = proxier();
    let a = svc("ns", "a", "", "172.30.0.1", 80, vec![ep("10.1.0.1", 80)]);
    let b = svc("ns", "b", "", "172.30.0.2", 80, vec![ep("10.1.0.2", 80), ep("10.1.0.3", 80)]);
    p.reset(Node::default(), Cluster::default(), vec![a, b]);
    let _ = ruleset(&mut p, true);

    // Nothing changed: nothing declared or written, every hook kept.
    let idle = ruleset(&mut p, false);
    assert!(idle.chains.is_empty() && idle.rules.is_empty(), "{idle:?}");
    assert_eq!(idle.kept_hooks, Hook::ALL);

    // b loses an endpoint: b's chains rewritten, its stale SEP deleted, a untouched.
    let b2 = svc("ns", "b", "", "172.30.0.2", 80, vec![ep("10.1.0.2", 80)]);
    p.apply(vec![Change::Upsert(b2)]);
    let r = ruleset(&mut p, false);
    let a_chain = service_chain("KUBE-SVC-", "ns/a", "tcp");
    let b_chain = service_chain("KUBE-SVC-", "ns/b", "tcp");
    let stale = endpoint_chain("ns/b", "tcp", "10.1.0.3:80");
    assert!(!declared(&r).contains(&a_chain.as_str()));
    assert!(declared(&r).contains(&b_chain.as_str()));
    assert_eq!(r.delete_chains, [(Table::Nat, stale)]);
    assert_eq!(r.kept_hooks, Hook::ALL, "b's jump is as before");

    // a removed: its chains deleted, its jump gone, the hooks written whole.
    p.apply(vec![Change::Remove("ns/a".into())]);
    let r = ruleset(&mut p, false);
    assert!(r.delete_chains.contains(&(Table::Nat, a_chain.clone())));
    assert!(!r.rules.iter().any(|x| x.target == Target::Jump(a_chain.clone())));
    assert!(r.kept_hooks.is_empty());
    assert!(r.rules.iter().any(|x| x.target == Target::Jump(b_chain.clone())), "b's jump written again");
}

/// The rules in the host's hooks, by hook, in order.
fn hook_rules(r: &Ruleset) -> BTreeMap<Hook, Vec<Rule>> {
    let mut out = BTreeMap::<Hook, Vec<Rule>>::new();
    for rule in &r.rules {
        if let Some(h) = Hook::of(rule.table, &rule.chain) {
            out.entry(h).or_default().push(rule.clone());
        }
    }
    out
}

#[test]
fn kept_hooks_hold_what_a_full_render_writes() {
    // Each step's partial render, its kept hooks taken from what the
    // last one left (as the host does), gives every hook the rules a
    // fresh full render of the same state has.
    let mut p = proxier();
    let mut node_port = svc("ns", "np", "", "172.30.0.3", 80, vec![ep("10.1.0.4", 80)]);
    node_port.node_port = 30080;
    node_port.external_ips = vec!["192.168.1.10".parse().unwrap()];
    let start = vec![
        svc("ns", "a", "", "172.30.0.1", 80, vec![ep("10.1.0.1", 80)]),
        svc("ns", "b", "", "172.30.0.2", 80, vec![ep("10.1.0.2", 80)]),
        node_port.clone(),
    ];
    p.reset(Node::default(), Cluster::default(), start.clone());
    let mut held = hook_rules(&ruleset(&mut p, true));
    let mut state: BTreeMap<String, ServicePort> = start.into_iter().map(|s| (s.key.clone(), s)).collect();
    let mut gone_empty = node_port.clone();
    gone_empty.endpoints.clear();
    let steps: Vec<(Change, bool)> = vec![
        // An endpoint more: every hook kept.
        (Change::Upsert(svc("ns", "a", "", "172.30.0.1", 80, vec![ep("10.1.0.1", 80), ep("10.1.0.5", 80)])), true),
        // The last endpoint goes: the jump becomes a REJECT in filter.
        (Change::Upsert(gone_empty), false),
        // It comes back.
        (Change::Upsert(node_port), false),
        // A new Service, then one that leaves.
        (Change::Upsert(svc("ns", "c", "", "172.30.0.4", 80, vec![ep("10.1.0.6", 80)])), false),
        (Change::Remove("ns/b".into()), false),
        // Another endpoint change after all that: kept again.
        (Change::Upsert(svc("ns", "c", "", "172.30.0.4", 80, vec![ep("10.1.0.7", 80)])), true),
    ];
    for (i, (change, keeps)) in steps.into_iter().enumerate() {
        match &change {
            Change::Upsert(s) => {
                state.insert(s.key.clone(), s.clone());
            }
            Change::Remove(k) => {
                state.remove(k);
            }
            _ => {}
        }
        p.apply(vec![change]);
        let r = ruleset(&mut p, false);
        assert_eq!(!r.kept_hooks.is_empty(), keeps, "step {i}: {:?}", r.kept_hooks);
        let mut now = hook_rules(&r);
        for h in &r.kept_hooks {
            assert!(!now.contains_key(h), "step {i}: rules in kept hook {h:?}");
            if let Some(rules) = held.get(h) {
                now.insert(*h, rules.clone());
            }
        }
        let mut fresh = proxier();
        fresh.reset(Node::default(), Cluster::default(), state.values().cloned().collect());
        assert_eq!(now, hook_rules(&ruleset(&mut fresh, true)), "step {i}");
        held = now;
    }
}

#[test]
fn ipv6_only_takes_its_family() {
    let mut settings = Settings::new(IpFamily::V6, ProxyMode::Iptables);
    settings.masquerade_all = true;
    let mut p = IptablesProxier::new(settings);
    p.reset(
        Node::default(),
        Cluster::default(),
        vec![
            svc("ns", "v6", "", "fd00::10", 80, vec![ep("fd00:1::5", 8080)]),
            svc("ns", "v4", "", "172.30.0.1", 80, vec![ep("10.0.0.1", 80)]),
        ],
    );
    let r = ruleset(&mut p, true);
    assert!(r.rules.iter().any(|x| x.target == Target::Dnat("fd00:1::5".parse().unwrap(), 8080)));
    assert!(r.rules.iter().all(|x| !x.matches.contains(&Match::destination_ip("172.30.0.1".parse().unwrap()))));
    assert!(r.rules.iter().any(|x| x.target == Target::MarkForMasquerade), "masquerade-all");
}

#[test]
fn large_cluster_mode_drops_per_endpoint_comments() {
    let mut p = proxier();
    let many: Vec<Endpoint> =
        (0..1001).map(|i| ep(&format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256), 80)).collect();
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "big", "", "172.30.0.9", 80, many)]);
    let r = ruleset(&mut p, true);
    let sep: Vec<&Rule> = r.rules.iter().filter(|x| x.chain.starts_with("KUBE-SEP-")).collect();
    assert_eq!(sep.len(), 2002);
    assert!(sep.iter().all(|x| !x.matches.iter().any(|m| matches!(m, Match::Comment(_)))));
    assert!(
        r.rules.iter().any(|x| x.matches.contains(&Match::comment("ns/big cluster IP"))),
        "service-level comments stay"
    );

    let mut p = proxier();
    let some: Vec<Endpoint> = (0..1000).map(|i| ep(&format!("10.1.{}.{}", i / 256, i % 256), 80)).collect();
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "big", "", "172.30.0.9", 80, some)]);
    let r = ruleset(&mut p, true);
    assert!(
        r.rules
            .iter()
            .filter(|x| x.chain.starts_with("KUBE-SEP-"))
            .all(|x| x.matches.contains(&Match::comment("ns/big")))
    );
}

#[test]
fn health_check_node_ports_are_accepted_in_their_hook() {
    let mut p = proxier();
    let mut s = svc("ns", "local", "p", "172.30.0.9", 80, vec![ep("10.1.0.1", 80)]);
    s.node_port = 30080;
    s.health_check_node_port = 30000;
    s.external_traffic_policy = crate::model::TrafficPolicy::Local;
    p.reset(Node::default(), Cluster::default(), vec![s]);
    let r = ruleset(&mut p, true);
    let hc = r.rules.iter().find(|x| Hook::of(x.table, &x.chain) == Some(Hook::FilterNodePorts)).unwrap();
    assert_eq!(hc.target, Target::Accept);
    assert!(hc.matches.contains(&Match::DestinationPort(30000)));
    let drop = r.rules.iter().find(|x| x.target == Target::Drop).unwrap();
    assert_eq!(Hook::of(drop.table, &drop.chain), Some(Hook::FilterExternalServices));
    assert!(drop.matches.contains(&Match::DestinationTypeLocal { negate: false }));
}

#[test]
fn rules_are_built_in_iptables_save_order() {
    let mut p = proxier();
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "a", "", "172.30.0.1", 80, vec![ep("10.1.0.1", 80)])]);
    let r = ruleset(&mut p, true);
    assert!(r.rules.iter().all(|x| x.clone().canonical() == *x));
}

#[test]
fn a_large_cluster_flip_on_a_partial_render_deletes_what_no_port_owns() {
    // 1000 endpoints and a small Service; the small one leaves and an
    // endpoint joins: past 1000, everything is rewritten without
    // per-endpoint comments, and the departed Service's chains are
    // deleted by name (the host's partial sync deletes nothing else).
    let mut p = proxier();
    let eps = |n: usize| (0..n).map(|i| ep(&format!("10.1.{}.{}", i / 256, i % 256), 80)).collect::<Vec<_>>();
    let small = svc("ns", "small", "", "172.30.0.2", 80, vec![ep("10.2.0.1", 80)]);
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "big", "", "172.30.0.9", 80, eps(999)), small]);
    let _ = ruleset(&mut p, true);
    p.apply(vec![Change::Remove("ns/small".into()), Change::Upsert(svc("ns", "big", "", "172.30.0.9", 80, eps(1001)))]);
    let r = ruleset(&mut p, false);
    let small_chains =
        [service_chain("KUBE-SVC-", "ns/small", "tcp"), endpoint_chain("ns/small", "tcp", "10.2.0.1:80")];
    for chain in &small_chains {
        assert!(r.delete_chains.contains(&(Table::Nat, chain.clone())), "{chain} not deleted: {:?}", r.delete_chains);
    }
    assert!(r.kept_hooks.is_empty());
    assert!(declared(&r).contains(&service_chain("KUBE-SVC-", "ns/big", "tcp").as_str()), "rewritten whole");
}

/// A scheduler that returns the longest rotation allowed for a
/// one-endpoint Service: as returned it is 1,024 rules; as the host hands
/// it over (normalized) it is one, the jump kube-proxy writes.
#[test]
fn a_one_endpoint_service_given_the_longest_rotation_is_programmed_with_one_entry() {
    use crate::plan::{MAX_SEQUENCE, Plan};
    let jumps = |plan: Option<Plan>| {
        let mut p = proxier();
        let mut port = svc("ns", "s", "", "172.30.0.1", 80, vec![ep("10.1.0.1", 8080)]);
        port.cluster_plan = plan;
        p.reset(Node::default(), Cluster::default(), vec![port]);
        let r = ruleset(&mut p, true);
        let chain = service_chain("KUBE-SVC-", "ns/s", "tcp");
        let sep = endpoint_chain("ns/s", "tcp", "10.1.0.1:8080");
        rules_in(&r, &chain).iter().filter(|x| x.target == Target::Jump(sep.clone())).count()
    };
    let longest = Plan::Sequence(vec![0; MAX_SEQUENCE]);
    assert_eq!(jumps(Some(longest.clone())), MAX_SEQUENCE, "as the scheduler returned it");
    assert_eq!(jumps(longest.normalized(1)), 1, "as the host hands it over");
}
