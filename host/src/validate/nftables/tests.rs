use super::*;
use kpx_rules::model::{Endpoint, ServicePort};
use kpx_rules::ops::nftables::{DataType, ElementWriter, KeyExpr, Op, Rule, SetDecl, SetRef, VerdictKind};

/// Service ns/web: 10.96.0.10:80/tcp, node port 30080, endpoint 10.1.0.5:8080.
fn port(ep: &str) -> ServicePort {
    let mut p = ServicePort::new("ns", "web", "", Protocol::Tcp, 80)
        .with_cluster_endpoints(vec![Endpoint::ready(ep.parse().unwrap(), 8080)]);
    p.cluster_ip = Some("10.96.0.10".parse().unwrap());
    p.node_port = 30080;
    p
}

fn scope() -> Scope {
    let mut s = Scope::default();
    s.count(IpFamily::V4, &port("10.1.0.5"), true);
    s
}

fn run(tx: &Transaction, model: &Model, scope: &Scope, full: bool) -> Result<Checked, Rejected> {
    check(&Context { plugin: "test", family: IpFamily::V4, scope, model, full }, tx)
}

fn v4() -> IpFamily {
    IpFamily::V4
}

fn endpoint_map() -> SetDecl {
    SetDecl {
        name: "internal-tcp-1".into(),
        key: vec![KeyType::Address, KeyType::Protocol, KeyType::Port, KeyType::Integer],
        data: Some(DataType::Endpoint),
        interval: false,
        timeout_seconds: None,
        comment: None,
    }
}

fn service_ips(ip: &str, port: u32, verdict: VerdictKind, chain: Option<&str>) -> Op {
    let mut w = ElementWriter::new(v4(), SetRef::Host(HostSet::ServiceIps));
    w.address(ip.parse().unwrap()).protocol(Protocol::Tcp).word(port).verdict(verdict, chain);
    Op::AddElements(w.finish())
}

fn endpoint_element(ep: &str) -> Op {
    let mut w = ElementWriter::new(v4(), SetRef::Own("internal-tcp-1".into()));
    w.address("10.96.0.10".parse().unwrap())
        .protocol(Protocol::Tcp)
        .word(80)
        .word(0)
        .endpoint(ep.parse().unwrap(), 8080);
    Op::AddElements(w.finish())
}

/// The shape kpx's nftables backend writes for the web Service.
fn good() -> Transaction {
    let mut keys = KeyExpr::DESTINATION.to_vec();
    keys.push(KeyExpr::NumgenRandom(1));
    Transaction {
        ops: vec![
            Op::AddChain("cluster-ip".into()),
            Op::AddSet(endpoint_map()),
            Op::AddRule(
                Rule::new("cluster-ip")
                    .with(Match::Protocol { negate: false, protocol: Protocol::Tcp })
                    .verdict(Verdict::DnatMap { keys, map: SetRef::Own("internal-tcp-1".into()) }),
            ),
            service_ips("10.96.0.10", 80, VerdictKind::Goto, Some("cluster-ip")),
            endpoint_element("10.1.0.5"),
        ],
    }
}

fn with(op: Op) -> Transaction {
    let mut t = good();
    t.push(op);
    t
}

fn ok(tx: &Transaction) {
    if let Err(e) = run(tx, &Model::default(), &scope(), true) {
        panic!("refused: {e}");
    }
}

fn refused(tx: &Transaction, why: &str) {
    match run(tx, &Model::default(), &scope(), true) {
        Ok(_) => panic!("accepted: {tx:?}"),
        Err(e) => assert!(e.reason.contains(why), "refused for another reason: {e}"),
    }
}

#[test]
fn the_backends_shape_passes() {
    ok(&good());
    let mut w = ElementWriter::new(v4(), SetRef::Host(HostSet::ServiceNodePorts));
    w.protocol(Protocol::Tcp).word(30080).verdict(VerdictKind::Goto, Some("cluster-ip"));
    ok(&with(Op::AddElements(w.finish())));
    let mut w = ElementWriter::new(v4(), SetRef::Host(HostSet::Hairpin));
    w.address("10.1.0.5".parse().unwrap()).address("10.1.0.5".parse().unwrap());
    ok(&with(Op::AddElements(w.finish())));
}

#[test]
fn dispatch_elements_must_be_destinations_of_the_state() {
    // The node's ssh port sent to the plugin's chain.
    refused(
        &with(service_ips("192.168.0.2", 22, VerdictKind::Goto, Some("cluster-ip"))),
        "not the address, protocol and port",
    );
    refused(
        &with(service_ips("10.96.0.10", 81, VerdictKind::Goto, Some("cluster-ip"))),
        "not the address, protocol and port",
    );
    let mut w = ElementWriter::new(v4(), SetRef::Host(HostSet::ServiceNodePorts));
    w.protocol(Protocol::Tcp).word(22).verdict(VerdictKind::Goto, Some("cluster-ip"));
    refused(&with(Op::AddElements(w.finish())), "not a node port");
    let mut w = ElementWriter::new(v4(), SetRef::Host(HostSet::ClusterIps));
    w.address("192.168.0.2".parse().unwrap());
    refused(&with(Op::AddElements(w.finish())), "not a cluster IP");
    let mut w = ElementWriter::new(v4(), SetRef::Host(HostSet::Hairpin));
    w.address("10.1.0.5".parse().unwrap()).address("192.168.0.2".parse().unwrap());
    refused(&with(Op::AddElements(w.finish())), "one endpoint address, twice");
    let mut w = ElementWriter::new(v4(), SetRef::Host(HostSet::NodePortIps));
    w.address("192.168.0.2".parse().unwrap());
    refused(&with(Op::AddElements(w.finish())), "host only");
}

#[test]
fn dispatch_verdicts_lead_to_the_plugins_chains() {
    refused(&with(service_ips("10.96.0.10", 80, VerdictKind::Accept, None)), "leads to one of the plugin's chains");
    refused(&with(service_ips("10.96.0.10", 80, VerdictKind::Goto, Some("masquerading"))), "is the host's");
    let mut w = ElementWriter::new(v4(), SetRef::Host(HostSet::NoEndpointServices));
    w.address("10.96.0.10".parse().unwrap())
        .protocol(Protocol::Tcp)
        .word(80)
        .verdict(VerdictKind::Jump, Some("cluster-ip"));
    refused(&with(Op::AddElements(w.finish())), "holds drop or reject");
}

#[test]
fn dnat_goes_to_endpoints_of_the_state_only() {
    refused(&with(endpoint_element("192.0.2.66")), "not an endpoint of the state");
    let rule = Rule::new("cluster-ip")
        .with(Match::Protocol { negate: false, protocol: Protocol::Tcp })
        .verdict(Verdict::Dnat("192.0.2.66".parse().unwrap(), 80));
    refused(&with(Op::AddRule(rule)), "not an endpoint of the state");
    let no_proto = Rule::new("cluster-ip").verdict(Verdict::Dnat("10.1.0.5".parse().unwrap(), 8080));
    refused(&with(Op::AddRule(no_proto)), "needs a protocol match");
}

#[test]
fn host_objects_are_not_the_plugins() {
    refused(&with(Op::AddChain("nat-prerouting".into())), "is the host's");
    refused(&with(Op::AddRule(Rule::new("filter-input").verdict(Verdict::Drop))), "is the host's");
    refused(&with(Op::AddRule(Rule::new("cluster-ip").verdict(Verdict::Jump("masquerading".into())))), "is the host's");
    refused(&with(Op::AddChain("kube-proxy".into())), "is the host's");
    let mut decl = endpoint_map();
    decl.name = "service-ips".into();
    refused(&with(Op::AddSet(decl)), "is the host's");
    refused(&with(Op::DeleteSet("service-ips".into())), "is the host's");
    refused(
        &with(Op::AddRule(Rule::new("cluster-ip").statement(Statement::Masquerade { fully_random: true }))),
        "the host's",
    );
    refused(&with(Op::AddRule(Rule::new("cluster-ip").statement(Statement::MarkXor(0x4000)))), "the host's");
}

#[test]
fn names_keys_and_sets_are_checked() {
    refused(&with(Op::AddChain(format!("c{}", "a".repeat(300)))), "names have 1 to");
    refused(&with(Op::AddChain("x;flush ruleset".into())), "names start with a letter");
    refused(&with(Op::AddRule(Rule::new("cluster-ip").comment("a\"b").verdict(Verdict::Accept))), "comment");
    let bad_key = Rule::new("cluster-ip").with(Match::Lookup {
        keys: vec![KeyExpr::Protocol],
        set: SetRef::Host(HostSet::ServiceIps),
        negate: false,
    });
    refused(&with(Op::AddRule(bad_key)), "does not fit");
    let mut decl = endpoint_map();
    decl.name = "other".into();
    decl.key = vec![KeyType::Cidr];
    refused(&with(Op::AddSet(decl)), "interval");
    // Elements into a set that does not exist, or the kernel's affinity set.
    let mut w = ElementWriter::new(v4(), SetRef::Own("nope".into()));
    w.word(1);
    refused(&with(Op::AddElements(w.finish())), "does not exist");
    let mut t = with(Op::AddSet(SetDecl::affinity("sticky", 10)));
    let mut w = ElementWriter::new(v4(), SetRef::Own("sticky".into()));
    w.address("10.0.0.1".parse().unwrap());
    t.push(Op::AddElements(w.finish()));
    refused(&t, "filled by the kernel only");
    refused(
        &with(Op::AddRule(Rule::new("cluster-ip").statement(Statement::AffinityUpdate("internal-tcp-1".into())))),
        "affinity sets",
    );
    refused(&with(Op::AddRule(Rule::new("cluster-ip").verdict(Verdict::Reject))), "reject is the host's");
}

#[test]
fn nothing_kept_may_point_at_what_left_the_state() {
    let mut s = scope();
    let mut model = Model::default();
    model.commit(run(&good(), &model, &s, true).unwrap());
    s.forget_removed();
    // The endpoint is replaced by another; the old element is kept.
    s.count(IpFamily::V4, &port("10.1.0.6"), true);
    s.count(IpFamily::V4, &port("10.1.0.5"), false);
    let nothing = Transaction::default();
    let err = run(&nothing, &model, &s, false).unwrap_err();
    assert!(err.reason.contains("10.1.0.5:8080, which has left the state"), "{err}");
    // Replacing the element passes.
    let mut w = ElementWriter::new(v4(), SetRef::Own("internal-tcp-1".into()));
    w.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80).word(0);
    let replace = Transaction { ops: vec![Op::DeleteElements(w.finish()), endpoint_element("10.1.0.6")] };
    model.commit(run(&replace, &model, &s, false).unwrap());
    s.forget_removed();
    // The Service goes: its dispatch element must go in the same sync.
    s.count(IpFamily::V4, &port("10.1.0.6"), false);
    let mut w = ElementWriter::new(v4(), SetRef::Own("internal-tcp-1".into()));
    w.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80).word(0);
    let half = Transaction { ops: vec![Op::DeleteElements(w.finish())] };
    let err = run(&half, &model, &s, false).unwrap_err();
    assert!(err.reason.contains("10.96.0.10:80 tcp, which has left the state"), "{err}");
}

#[test]
fn an_element_added_twice_or_deleted_when_absent_is_refused() {
    let mut s = scope();
    let mut model = Model::default();
    model.commit(run(&good(), &model, &s, true).unwrap());
    s.forget_removed();
    let again = Transaction { ops: vec![endpoint_element("10.1.0.5")] };
    assert!(run(&again, &model, &s, false).unwrap_err().reason.contains("already"));
    let mut w = ElementWriter::new(v4(), SetRef::Own("internal-tcp-1".into()));
    w.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80).word(7);
    let absent = Transaction { ops: vec![Op::DeleteElements(w.finish())] };
    assert!(run(&absent, &model, &s, false).unwrap_err().reason.contains("is not in"));
}

/// The check's time for `tx(n)` and `tx(8n)`: 8x the work may take about
/// 8x the time, never the 64x of a quadratic check (the red team's
/// finding: DNAT rules in one chain and flushes after many elements were
/// quadratic, a stall a plugin could ask for on every sync).
fn grows_linearly(what: &str, n: usize, tx: impl Fn(usize) -> Transaction) {
    let time = |n: usize| {
        let tx = tx(n);
        crate::cpu_time::of(|| run(&tx, &Model::default(), &scope(), true).expect("accepted")).1
    };
    // This thread's CPU time, the best of five: other tests share the
    // cores (wall time once failed a check like this one in CI).
    let best = |n: usize| (0..5).map(|_| time(n)).min().unwrap_or_default();
    let _warm = time(n / 4);
    let (small, large) = (best(n), best(8 * n));
    let ratio = large.as_secs_f64() / small.as_secs_f64().max(1e-6);
    eprintln!("{what}: {n} -> {small:?}, {} -> {large:?} (x{ratio:.1})", 8 * n);
    // Linear is x8, quadratic x64: the line between them is x20.
    assert!(ratio < 20.0, "{what}: 8x the work took x{ratio:.1} the time ({small:?} -> {large:?})");
}

#[test]
fn dnat_rules_in_one_chain_are_checked_in_linear_time() {
    grows_linearly("dnat rules in one chain", 10_000, |n| {
        let mut tx = Transaction::default();
        tx.push(Op::AddChain("c".into()));
        let rule = Rule::new("c")
            .with(Match::Protocol { negate: false, protocol: Protocol::Tcp })
            .verdict(Verdict::Dnat("10.1.0.5".parse().unwrap(), 8080));
        for _ in 0..n {
            tx.push(Op::AddRule(rule.clone()));
        }
        tx
    });
}

#[test]
fn flushes_after_many_elements_are_checked_in_linear_time() {
    grows_linearly("set flushes after elements", 1_000, |m| {
        let map = SetDecl { name: "m".into(), key: vec![KeyType::Integer], ..endpoint_map() };
        let small = SetDecl { name: "s".into(), data: None, ..map.clone() };
        let mut tx = Transaction::default();
        tx.push(Op::AddSet(map));
        tx.push(Op::AddSet(small));
        let mut w = ElementWriter::new(v4(), SetRef::Own("m".into()));
        for i in 0..(20 * m) as u32 {
            w.word(i).endpoint("10.1.0.5".parse().unwrap(), 8080);
        }
        tx.push(Op::AddElements(w.finish()));
        for _ in 0..m {
            tx.push(Op::FlushSet("s".into()));
        }
        tx
    });
}

#[test]
fn a_refused_huge_operation_is_named_in_a_few_hundred_bytes() {
    let mut w = ElementWriter::new(v4(), SetRef::Host(HostSet::ClusterIps));
    for i in 0..4_000_000u32 {
        w.word(0x0a60_0000 + (i % 1000));
    }
    // (Its memory: tests/memory.)
    let err = run(&with(Op::AddElements(w.finish())), &Model::default(), &scope(), true).unwrap_err();
    assert!(err.item.len() <= 410 && err.to_string().contains("not a cluster IP"), "{err}");
}

#[test]
fn distinct_facts_pack_to_distinct_words_and_counts_add_up() {
    let ips: Vec<IpAddr> =
        ["0.0.0.0", "10.0.0.1", "10.0.0.2", "255.255.255.255"].iter().map(|s| s.parse().unwrap()).collect();
    let protocols = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
    let ports = [0u16, 1, 80, 65535];
    let mut refs = Vec::new();
    for &ip in &ips {
        refs.push(Ref::ClusterIp(ip));
        refs.push(Ref::EndpointIp(ip));
        for &port in &ports {
            refs.push(Ref::Endpoint((ip, port)));
            for &p in &protocols {
                refs.push(Ref::Destination((ip, p, port)));
            }
        }
    }
    for &port in &ports {
        for &p in &protocols {
            refs.push(Ref::NodePort((p, port)));
        }
    }
    let packed: std::collections::HashSet<[u32; 2]> = refs.iter().map(|r| RefCounts::pack(r).unwrap()).collect();
    assert_eq!(packed.len(), refs.len());
    let v6: IpAddr = "fd00::1".parse().unwrap();
    assert_eq!(RefCounts::pack(&Ref::Endpoint((v6, 80))), None);

    // Counts: an overlay's deltas merge into the model's, and a fact whose
    // count comes to 0 is dropped, in both families.
    let mut model = RefCounts::default();
    let mut overlay = RefCounts::default();
    for r in [Ref::Endpoint((ips[1], 80)), Ref::Endpoint((v6, 80))] {
        overlay.add(r, 2, false);
    }
    model.merge(overlay);
    assert_eq!((model.get(&Ref::Endpoint((ips[1], 80))), model.get(&Ref::Endpoint((v6, 80)))), (2, 2));
    let mut overlay = RefCounts::default();
    for r in [Ref::Endpoint((ips[1], 80)), Ref::Endpoint((v6, 80))] {
        overlay.add(r, -1, false);
        overlay.add(r, -1, false);
    }
    overlay.add(Ref::ClusterIp(ips[2]), 1, false);
    model.merge(overlay);
    assert_eq!((model.v4.len(), model.other.len()), (1, 0));
    assert_eq!(model.get(&Ref::ClusterIp(ips[2])), 1);
}

/// Own sets beyond twice the state's endpoint slots (and EXTRA_SETS) are
/// refused: nf_tables' cost of a set grows with every other set in the
/// table.
#[test]
fn own_sets_are_bounded_by_the_state() {
    let s = scope();
    let allowed = 2 * s.endpoint_slots + EXTRA_SETS;
    assert_eq!(s.endpoint_slots, 3, "one port, one endpoint");
    let sets = |n: usize| Transaction {
        ops: (0..n).map(|k| Op::AddSet(SetDecl { name: format!("m{k}"), ..endpoint_map() })).collect(),
    };
    let mut model = Model::default();
    model.commit(run(&sets(allowed), &model, &s, true).expect("within the bound"));
    let err = run(&sets(allowed + 1), &Model::default(), &s, true).unwrap_err();
    assert!(
        err.reason.contains(&format!("leaves {} own sets and maps; the state allows {allowed}", allowed + 1)),
        "{err}"
    );
    // A partial sync counts what the table holds already.
    let one_more = Transaction { ops: vec![Op::AddSet(SetDecl { name: "extra".into(), ..endpoint_map() })] };
    assert!(run(&one_more, &model, &s, false).is_err());
    let swap = Transaction {
        ops: vec![Op::DeleteSet("m0".into()), Op::AddSet(SetDecl { name: "extra".into(), ..endpoint_map() })],
    };
    assert!(run(&swap, &model, &s, false).is_ok(), "one out, one in");
}

/// The built-in nftables backend's full render of `ports`, and their scope.
fn builtin_render(ports: Vec<ServicePort>) -> (Transaction, Scope) {
    use kpx_rules::backend::Backend;
    use kpx_rules::model::{Cluster, Node, ProxyMode, Settings};
    let mut scope = Scope::default();
    for p in &ports {
        scope.count(IpFamily::V4, p, true);
    }
    let mut g = kpx_rules::nftables::NftablesProxier::new(Settings::new(IpFamily::V4, ProxyMode::Nftables));
    g.reset(Node::default(), Cluster::default(), ports);
    let kpx_rules::ops::Ruleset::Nftables(tx) = g.render(true).unwrap() else { panic!("nftables") };
    (tx, scope)
}

/// The built-in backend's own shape stays within the set bound: three
/// ClientIP-affinity Services over the same 70 endpoints (an affinity set
/// per endpoint of each, and their maps), rendered whole, pass.
#[test]
fn the_builtin_backends_affinity_sets_are_within_the_bound() {
    let eps: Vec<Endpoint> =
        (0..70).map(|e| Endpoint::ready(format!("10.1.0.{}", e + 1).parse().unwrap(), 8080)).collect();
    let ports: Vec<ServicePort> = (0..3)
        .map(|k| {
            let mut p =
                ServicePort::new("ns", &format!("a{k}"), "", Protocol::Tcp, 80).with_cluster_endpoints(eps.clone());
            p.cluster_ip = Some(format!("10.96.0.{}", k + 1).parse().unwrap());
            p.affinity_timeout_seconds = 10_800;
            p
        })
        .collect();
    let (tx, scope) = builtin_render(ports);
    let sets = tx.ops.iter().filter(|op| matches!(op, Op::AddSet(_))).count();
    assert!(sets >= 3 * 70, "an affinity set per endpoint of each: {sets}");
    run(&tx, &Model::default(), &scope, true).expect("the built-in shape is within the bound");
}

/// The full-sync check of the nftables backend's own render at 2,500 and
/// 20,000 Services x 10 endpoints, in CPU time: under x20 for x8
/// (quadratic is x64). Measured on 2026-12-07 at larger sizes (by changing
/// them here): debug 5,000 to 40,000 x9.4, 10,000 to 100,000 x13; release
/// 5,000 to 40,000 x14.1 (28 ms to 402 ms), 20,000 to 160,000 x11.1
/// (185 ms to 2.06 s): probes of several hash tables of millions of
/// entries past the caches (the state's facts, the endpoint maps'
/// entries, the fact counts; perf: `Counted::contains` 27 %,
/// `check_elements` 16 %, `RefCounts::add` 10.5 %). Reserving the
/// counts' table, or sorting the counts alone, changed nothing.
#[test]
fn the_full_check_of_the_builtin_render_grows_about_linearly() {
    let time = |n: usize| {
        let ports: Vec<ServicePort> = (0..n)
            .map(|k| {
                let eps = (0..10)
                    .map(|e| {
                        let i = k * 10 + e;
                        let ip = format!("10.{}.{}.{}", 128 + i / 65536, (i / 256) % 256, i % 256);
                        Endpoint::ready(ip.parse().unwrap(), 8080)
                    })
                    .collect();
                let mut p = ServicePort::new("ns", &format!("s{k}"), "", Protocol::Tcp, 80).with_cluster_endpoints(eps);
                p.cluster_ip = Some(format!("10.{}.{}.{}", 96 + k / 65536, (k / 256) % 256, k % 256).parse().unwrap());
                p
            })
            .collect();
        let (tx, scope) = builtin_render(ports);
        (0..3)
            .map(|_| crate::cpu_time::of(|| run(&tx, &Model::default(), &scope, true).expect("accepted")).1)
            .min()
            .unwrap()
    };
    let (small, large) = (time(2_500), time(20_000));
    let ratio = large.as_secs_f64() / small.as_secs_f64();
    eprintln!("full check: 2,500 Services x 10 {small:?}, 20,000 {large:?} (x{ratio:.1})");
    assert!(ratio < 20.0, "8x the Services took x{ratio:.1} the time");
}
