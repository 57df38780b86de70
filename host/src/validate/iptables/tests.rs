use super::*;
use kpx_rules::model::{Endpoint, ServicePort};
use kpx_rules::ops::CtStates;
use kpx_rules::ops::iptables::{AddressMatch, HashMark, HashTuple, InterfaceMatch};

fn d4() -> Dialect {
    Dialect { family: IpFamily::V4, masquerade_mark: 0x4000 }
}

/// A state with Service ns/web: 10.96.0.10:80/tcp, node port 30080,
/// health-check port 30000, endpoint 10.1.0.5:8080.
fn scope() -> Scope {
    let mut p = ServicePort::new("ns", "web", "", Protocol::Tcp, 80)
        .with_cluster_endpoints(vec![Endpoint::ready("10.1.0.5".parse().unwrap(), 8080)]);
    p.cluster_ip = Some("10.96.0.10".parse().unwrap());
    p.node_port = 30080;
    p.health_check_node_port = 30000;
    let mut s = Scope::default();
    s.count(IpFamily::V4, &p, true);
    s
}

fn run(rs: &Ruleset, model: &Model, scope: &Scope, full: bool) -> Result<Checked, Rejected> {
    check(&Context { plugin: "test", dialect: d4(), scope, model, full }, rs)
}

fn ok(rs: &Ruleset) {
    if let Err(e) = run(rs, &Model::default(), &scope(), true) {
        panic!("refused: {e}");
    }
}

fn refused(rs: &Ruleset, why: &str) {
    match run(rs, &Model::default(), &scope(), true) {
        Ok(_) => panic!("accepted: {rs:?}"),
        Err(e) => assert!(e.reason.contains(why), "refused for another reason: {e}"),
    }
}

fn web() -> [Match; 3] {
    [Match::destination_ip("10.96.0.10".parse().unwrap()), Match::Protocol(Protocol::Tcp), Match::DestinationPort(80)]
}

/// The web Service's capture and endpoint, as the generator writes them.
fn good() -> Ruleset {
    let mut rs = Ruleset::default();
    rs.declare(Table::Nat, "KUBE-SVC-A");
    rs.declare(Table::Nat, "KUBE-SEP-A");
    rs.push(Rule::hook(Hook::NatServices).with_all(web()).jump("KUBE-SVC-A"));
    rs.push(Rule::chain(Table::Nat, "KUBE-SVC-A").jump("KUBE-SEP-A"));
    rs.push(
        Rule::chain(Table::Nat, "KUBE-SEP-A")
            .with(Match::Protocol(Protocol::Tcp))
            .target(Target::Dnat("10.1.0.5".parse().unwrap(), 8080)),
    );
    rs
}

/// The model once the good ruleset was written by a full sync.
fn after_full_sync(s: &Scope) -> Model {
    let mut model = Model::default();
    model.commit(run(&good(), &model, s, true).unwrap());
    model
}

fn with(rule: Rule) -> Ruleset {
    let mut rs = good();
    rs.push(rule);
    rs
}

#[test]
fn the_generators_shape_passes() {
    ok(&good());
    ok(&with(
        Rule::hook(Hook::NatNodePorts)
            .with(Match::Protocol(Protocol::Tcp))
            .with(Match::DestinationPort(30080))
            .jump("KUBE-SVC-A"),
    ));
    ok(&with(
        Rule::hook(Hook::FilterNodePorts)
            .with(Match::Protocol(Protocol::Tcp))
            .with(Match::DestinationPort(30000))
            .target(Target::Accept),
    ));
    ok(&with(
        Rule::hook(Hook::FilterExternalServices)
            .with(Match::DestinationTypeLocal { negate: false })
            .with(Match::Protocol(Protocol::Tcp))
            .with(Match::DestinationPort(30080))
            .target(Target::Reject),
    ));
    ok(&with(Rule::hook(Hook::FilterServices).with_all(web()).target(Target::Reject)));
}

#[test]
fn hook_rules_must_match_a_destination_of_the_state() {
    // Port 22 of every address: the node's ssh.
    refused(
        &with(
            Rule::hook(Hook::NatServices)
                .with(Match::Protocol(Protocol::Tcp))
                .with(Match::DestinationPort(22))
                .jump("KUBE-SVC-A"),
        ),
        "matches one Service",
    );
    refused(
        &with(
            Rule::hook(Hook::NatNodePorts)
                .with(Match::Protocol(Protocol::Tcp))
                .with(Match::DestinationPort(22))
                .jump("KUBE-SVC-A"),
        ),
        "not a node port",
    );
    refused(
        &with(
            Rule::hook(Hook::FilterNodePorts)
                .with(Match::Protocol(Protocol::Tcp))
                .with(Match::DestinationPort(22))
                .target(Target::Drop),
        ),
        "health-check",
    );
    // Right address, wrong port; a prefix instead of one address; negated.
    let other_port = [
        Match::destination_ip("10.96.0.10".parse().unwrap()),
        Match::Protocol(Protocol::Tcp),
        Match::DestinationPort(81),
    ];
    refused(
        &with(Rule::hook(Hook::NatServices).with_all(other_port).jump("KUBE-SVC-A")),
        "not the address, protocol and port",
    );
    let wide = Match::Destination(AddressMatch { negate: false, cidr: "10.96.0.0/12".parse().unwrap() });
    refused(
        &with(
            Rule::hook(Hook::FilterServices)
                .with(wide)
                .with(Match::Protocol(Protocol::Tcp))
                .with(Match::DestinationPort(80))
                .target(Target::Drop),
        ),
        "matches one Service",
    );
    // Masquerading everything: the host's KUBE-POSTROUTING is not a hook.
    refused(
        &with(Rule::chain(Table::Nat, "KUBE-POSTROUTING").target(Target::MarkForMasquerade)),
        "hooks or in the plugin's own chains",
    );
}

#[test]
fn dnat_goes_to_endpoints_of_the_state_only() {
    let mut rs = good();
    rs.rules[2].target = Target::Dnat("192.0.2.66".parse().unwrap(), 80);
    refused(&rs, "not an endpoint of the state");
    rs.rules[2].target = Target::Dnat("10.1.0.5".parse().unwrap(), 8081);
    refused(&rs, "not an endpoint of the state");
    rs.rules[2] = Rule::chain(Table::Nat, "KUBE-SEP-A").target(Target::Dnat("10.1.0.5".parse().unwrap(), 8080));
    refused(&rs, "needs a protocol match");
}

#[test]
fn host_chains_and_builtins_are_not_the_plugins() {
    let mut rs = good();
    rs.declare(Table::Filter, "INPUT");
    refused(&rs, "starts with one of");
    let mut rs = good();
    rs.declare(Table::Nat, "KUBE-MARK-MASQ");
    refused(&rs, "starts with one of");
    refused(&with(Rule::chain(Table::Filter, "INPUT").target(Target::Accept)), "hooks or in the plugin's own chains");
    refused(&with(Rule::hook(Hook::NatServices).with_all(web()).jump("KUBE-POSTROUTING")), "plugin's own chains");
    refused(
        &with(Rule::hook(Hook::NatServices).with_all(web()).target(Target::Masquerade { random_fully: true })),
        "host only",
    );
    refused(
        &with(Rule::hook(Hook::NatServices).with_all(web()).target(Target::SetMark { value: 1, mask: 1 })),
        "host only",
    );
}

#[test]
fn names_lengths_and_counts_are_bounded() {
    let mut rs = good();
    rs.declare(Table::Nat, &format!("KUBE-SEP-{}", "A".repeat(30)));
    refused(&rs, "at most 28 bytes");
    let mut rs = good();
    rs.declare(Table::Nat, "KUBE-SEP-a;b");
    refused(&rs, "only A-Z and 0-9");
    let many: Vec<Match> = (0..17).map(|_| Match::Mark { negate: false, value: 1, mask: 1 }).collect();
    refused(&with(Rule::chain(Table::Nat, "KUBE-SEP-A").with_all(many)), "at most 16 matches");
    let two_comments = Rule::chain(Table::Nat, "KUBE-SEP-A").with(Match::comment("a")).with(Match::comment("b"));
    refused(&with(two_comments), "one comment");
    let iface = InterfaceMatch { negate: false, name: "eth0\" -j ACCEPT".into(), prefix: false };
    refused(&with(Rule::chain(Table::Nat, "KUBE-SEP-A").with(Match::InInterface(iface))), "interface names");
    refused(&with(Rule::chain(Table::Nat, "KUBE-SEP-A").with(Match::RecentSet { name: "SSH".into() })), "recent list");
    let v6 = Match::Source(AddressMatch { negate: false, cidr: "fd00::/8".parse().unwrap() });
    refused(&with(Rule::chain(Table::Nat, "KUBE-SEP-A").with(v6)), "not an IPv4 address");
    let mut rs = good();
    rs.declare(Table::Nat, "KUBE-SEP-A");
    refused(&rs, "declared twice");
}

#[test]
fn targets_fit_their_table() {
    refused(&with(Rule::chain(Table::Nat, "KUBE-SEP-A").target(Target::Reject)), "not allowed in the nat table");
    refused(&with(Rule::chain(Table::Nat, "KUBE-SEP-A").target(Target::Drop)), "not allowed in the nat table");
    refused(
        &with(Rule::hook(Hook::FilterServices).with_all(web()).target(Target::Accept)),
        "not allowed in the filter table",
    );
    let hash = |modulus| Target::HashMark(HashMark { tuple: HashTuple::Source, modulus, seed: 1 });
    ok(&with(Rule::chain(Table::Nat, "KUBE-SVC-A").target(hash(0x4000))));
    refused(&with(Rule::chain(Table::Nat, "KUBE-SVC-A").target(hash(0x4001))), "modulus");
    refused(
        &with(Rule::chain(Table::Nat, "KUBE-SVC-A").with(Match::HashSlot(0x4000))),
        "not below the masquerade mark",
    );
    refused(
        &with(
            Rule::chain(Table::Nat, "KUBE-SVC-A").with(Match::Conntrack { negate: false, states: CtStates::empty() }),
        ),
        "names no state",
    );
}

#[test]
fn rules_go_only_in_chains_this_ruleset_declares() {
    let s = scope();
    let model = after_full_sync(&s);
    // KUBE-SEP-A exists, but appending to it without declaring it would
    // leave rules the host never saw together.
    let mut rs = Ruleset::default();
    rs.push(Rule::chain(Table::Nat, "KUBE-SEP-A").target(Target::Return));
    let err = run(&rs, &model, &s, false).unwrap_err();
    assert!(err.reason.contains("declared by the same ruleset"), "{err}");
    refused(&with(Rule::hook(Hook::NatServices).with_all(web()).jump("KUBE-SVC-NOPE")), "no nat chain of the plugin's");
}

#[test]
fn a_full_sync_deletes_every_own_chain_it_does_not_declare() {
    let mut model = Model::default();
    model.reset([
        (Table::Nat, "KUBE-SEP-OLD".to_string()),
        (Table::Filter, "KUBE-SVC-FILTERED".to_string()),
        (Table::Nat, "KUBE-SVC-A".to_string()),
    ]);
    let checked = run(&good(), &model, &scope(), true).unwrap();
    assert_eq!(
        checked.stale,
        [(Table::Nat, "KUBE-SEP-OLD".to_string()), (Table::Filter, "KUBE-SVC-FILTERED".to_string())]
    );
}

#[test]
fn a_kept_chain_may_not_dnat_to_a_departed_endpoint() {
    let mut s = scope();
    let model = after_full_sync(&s);
    s.forget_removed();
    // The endpoint is replaced; a partial ruleset keeps the old chains.
    let port = |ip: &str| {
        let mut p = ServicePort::new("ns", "web", "", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![Endpoint::ready(ip.parse().unwrap(), 8080)]);
        p.cluster_ip = Some("10.96.0.10".parse().unwrap());
        p.node_port = 30080;
        p.health_check_node_port = 30000;
        p
    };
    s.count(IpFamily::V4, &port("10.1.0.6"), true);
    s.count(IpFamily::V4, &port("10.1.0.5"), false);
    let mut kept = Ruleset::default();
    kept.push(Rule::hook(Hook::NatServices).with_all(web()).jump("KUBE-SVC-A"));
    let err = run(&kept, &model, &s, false).unwrap_err();
    assert!(err.reason.contains("10.1.0.5:8080, which is no longer an endpoint"), "{err}");
    // Deleting the stale chain (and what uses it) passes.
    let mut cleaned = Ruleset::default();
    cleaned.delete(Table::Nat, "KUBE-SVC-A");
    cleaned.delete(Table::Nat, "KUBE-SEP-A");
    run(&cleaned, &model, &s, false).unwrap();
}

/// iptables-restore commits each table on its own: a loop the kernel
/// refuses in nat would land after filter was written.
#[test]
fn jump_loops_are_refused_before_anything_is_written() {
    let mut rs = good();
    rs.declare(Table::Nat, "KUBE-SVC-B");
    rs.push(Rule::chain(Table::Nat, "KUBE-SVC-A").jump("KUBE-SVC-B"));
    rs.push(Rule::chain(Table::Nat, "KUBE-SVC-B").target(Target::Goto("KUBE-SVC-A".into())));
    let err = run(&rs, &Model::default(), &scope(), true).unwrap_err();
    assert!(err.reason.contains("jump in a loop"), "{err}");
    assert!(err.item.contains("nat KUBE-SVC-A -> nat KUBE-SVC-B -> nat KUBE-SVC-A"), "{err}");
    // A chain that jumps to itself.
    refused(&with(Rule::chain(Table::Nat, "KUBE-SEP-A").jump("KUBE-SEP-A")), "jump in a loop");
    // The same names in two tables are two chains: no loop.
    let mut two = good();
    two.declare(Table::Filter, "KUBE-SVC-A");
    two.declare(Table::Filter, "KUBE-SEP-A");
    two.push(Rule::chain(Table::Filter, "KUBE-SEP-A").jump("KUBE-SVC-A"));
    ok(&two);
}

#[test]
fn a_partial_sync_cannot_close_a_loop_through_a_kept_chain() {
    let s = scope();
    let model = after_full_sync(&s);
    // KUBE-SVC-A (kept) jumps to KUBE-SEP-A; redeclared, KUBE-SEP-A jumps back.
    let mut rs = Ruleset::default();
    rs.declare(Table::Nat, "KUBE-SEP-A");
    rs.push(Rule::chain(Table::Nat, "KUBE-SEP-A").jump("KUBE-SVC-A"));
    let err = run(&rs, &model, &s, false).unwrap_err();
    assert!(err.reason.contains("jump in a loop"), "{err}");
}

#[test]
fn a_partial_sync_cannot_delete_a_chain_a_kept_chain_jumps_to() {
    let s = scope();
    let model = after_full_sync(&s);
    let mut rs = Ruleset::default();
    rs.delete(Table::Nat, "KUBE-SEP-A");
    let err = run(&rs, &model, &s, false).unwrap_err();
    assert!(err.reason.contains("jumps to KUBE-SEP-A, which this ruleset deletes"), "{err}");
    // Deleting both, or rewriting the one that jumps, is fine.
    rs.delete(Table::Nat, "KUBE-SVC-A");
    rs.push(Rule::hook(Hook::NatServices).with_all(web()).target(Target::Return));
    run(&rs, &model, &s, false).unwrap();
}

#[test]
fn kept_hooks_keep_their_rules_and_are_checked_against_what_left() {
    let s = scope();
    let model = after_full_sync(&s);
    let last = hook_rules(std::borrow::Cow::Owned(good()));
    let ctx = |scope, full| Context { plugin: "test", dialect: d4(), scope, model: &model, full };
    let keeps = Ruleset { kept_hooks: vec![Hook::NatServices, Hook::FilterServices], ..Ruleset::default() };
    let kept = kept_hooks(&ctx(&s, false), &keeps, Some(last.clone())).unwrap();
    assert_eq!(kept[&Hook::NatServices], last[&Hook::NatServices]);
    assert!(kept[&Hook::FilterServices].is_empty());
    check_with_kept(&ctx(&s, false), &keeps, &kept).unwrap();

    let refusal =
        |full, rs: &Ruleset, last: Option<HookRules>| kept_hooks(&ctx(&s, full), rs, last).unwrap_err().reason;
    assert!(refusal(true, &keeps, Some(last.clone())).contains("a full sync keeps no hook"));
    assert!(refusal(false, &keeps, None).contains("no earlier write"));
    let mut both = keeps.clone();
    both.push(Rule::hook(Hook::FilterServices).with_all(web()).target(Target::Reject));
    assert!(refusal(false, &both, Some(last.clone())).contains("in a hook the ruleset keeps"));

    // The chain a kept rule jumps to goes.
    let mut deletes = keeps.clone();
    deletes.delete(Table::Nat, "KUBE-SVC-A");
    deletes.delete(Table::Nat, "KUBE-SEP-A");
    let err = check_with_kept(&ctx(&s, false), &deletes, &kept).unwrap_err();
    assert_eq!(err.at, "kept rule 1 (from the last write)", "{err}");
    assert!(err.reason.contains("jump to KUBE-SVC-A"), "{err}");

    // The endpoint a kept rule DNATs to leaves (its Service stays).
    let mut dnat = Ruleset::default();
    dnat.push(Rule::hook(Hook::NatServices).with_all(web()).target(Target::Dnat("10.1.0.5".parse().unwrap(), 8080)));
    let dnat_kept = kept_hooks(&ctx(&s, false), &keeps, Some(hook_rules(std::borrow::Cow::Owned(dnat)))).unwrap();
    check_with_kept(&ctx(&s, false), &keeps, &dnat_kept).unwrap();
    let mut p = ServicePort::new("ns", "web", "", Protocol::Tcp, 80)
        .with_cluster_endpoints(vec![Endpoint::ready("10.1.0.5".parse().unwrap(), 8080)]);
    p.cluster_ip = Some("10.96.0.10".parse().unwrap());
    p.node_port = 30080;
    p.health_check_node_port = 30000;
    let mut no_endpoint = s.clone();
    no_endpoint.forget_removed();
    no_endpoint.count(IpFamily::V4, &p, false);
    no_endpoint.count(IpFamily::V4, &p.clone().with_cluster_endpoints(Vec::new()), true);
    let err = check_with_kept(&ctx(&no_endpoint, false), &keeps, &dnat_kept).unwrap_err();
    assert!(err.reason.contains("DNAT to 10.1.0.5:8080"), "{err}");

    // The Service leaves: the kept rule still captures its address, and
    // the check refuses it like a returned one.
    let mut gone = s.clone();
    gone.forget_removed();
    gone.count(IpFamily::V4, &p, false);
    let err = check_with_kept(&ctx(&gone, false), &keeps, &kept).unwrap_err();
    assert!(err.item.contains("10.96.0.10"), "{err}");

    // Through a sync's preparation, after a full write of `good`: kept
    // chains are not written again, and stay as the full write left them.
    let settings = kpx_rules::model::Settings::new(IpFamily::V4, kpx_rules::model::ProxyMode::Iptables);
    let prepare = crate::kernel::iptables::prepare;
    let previous = |p: &crate::kernel::iptables::Prepared| crate::kernel::iptables::Previous {
        host_chains: p.host_chains.clone(),
        hooks: p.hooks.clone(),
    };
    let first = prepare(&ctx(&s, true), &settings, &good(), 1 << 20, None).unwrap();
    let keeping = prepare(&ctx(&s, false), &settings, &keeps, 1 << 20, Some(previous(&first))).unwrap();
    assert!(!keeping.text.contains("KUBE-SERVICES"), "{}", keeping.text);
    assert_eq!(keeping.host_chains, first.host_chains);
    assert_eq!(keeping.hooks, first.hooks);
    let err = prepare(&ctx(&gone, false), &settings, &keeps, 1 << 20, Some(previous(&first))).err().unwrap();
    assert_eq!(err.at, "kept rule 1 (from the last write)", "{err}");
}
