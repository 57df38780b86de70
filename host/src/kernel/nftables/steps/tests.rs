use super::*;
use kpx_rules::model::Protocol;
use kpx_rules::ops::nftables::{
    AddressField, BaseChain, ChainKind, DataType, ElementWriter, HostSet, KeyExpr, KeyType, NfHook, VerdictKind,
};

const V4: IpFamily = IpFamily::V4;

/// `internal-tcp-N`: destination . numgen slot -> endpoint.
fn map(n: u32) -> SetDecl {
    SetDecl {
        name: format!("internal-tcp-{n}"),
        key: vec![KeyType::Address, KeyType::Protocol, KeyType::Port, KeyType::Integer],
        data: Some(DataType::Endpoint),
        interval: false,
        timeout_seconds: None,
        comment: None,
    }
}

fn decls(extra: &[SetDecl]) -> impl Fn(&SetRef) -> Option<SetDecl> + '_ {
    move |s: &SetRef| match s {
        SetRef::Host(h) => Some(h.declaration()),
        SetRef::Own(n) => extra.iter().find(|d| &d.name == n).cloned(),
    }
}

/// The web Service's elements in `internal-tcp-N`, one per endpoint
/// (10.1.0.1.., port 8080).
fn slots(n: u32, endpoints: u32) -> Elements {
    let mut w = ElementWriter::new(V4, SetRef::Own(format!("internal-tcp-{n}")));
    for slot in 0..endpoints {
        w.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80).word(slot);
        w.endpoint(std::net::IpAddr::from([10, 1, 0, 1 + slot as u8]), 8080);
    }
    w.finish()
}

/// The keys only of the web Service's slots in `internal-tcp-N`: what a
/// delete carries.
fn slot_keys(n: u32, from: u32, to: u32) -> Elements {
    let mut w = ElementWriter::new(V4, SetRef::Own(format!("internal-tcp-{n}")));
    for slot in from..to {
        w.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80).word(slot);
    }
    w.finish()
}

fn count_rule(n: u32) -> Rule {
    let mut keys = KeyExpr::DESTINATION.to_vec();
    keys.push(KeyExpr::NumgenRandom(n));
    Rule::new("select-internal").verdict(Verdict::DnatMap { keys, map: SetRef::Own(format!("internal-tcp-{n}")) })
}

fn service_ips(chain: &str) -> Elements {
    let mut w = ElementWriter::new(V4, SetRef::Host(HostSet::ServiceIps));
    w.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80).verdict(VerdictKind::Goto, Some(chain));
    w.finish()
}

/// A Service going from one endpoint to two, its second map new: the new
/// map, its rule and the new elements first; the old elements after.
#[test]
fn a_move_to_a_new_map_adds_first_and_deletes_after() {
    let ops = vec![
        Op::DeleteElements(slot_keys(1, 0, 1)),
        Op::AddSet(map(2)),
        Op::AddRule(count_rule(2)),
        Op::AddElements(slots(2, 2)),
    ];
    let sets = [map(1), map(2)];
    let (first, rest) = split_partial(V4, &ops, &decls(&sets)).expect("two steps");
    assert_eq!(first, ops[1..].to_vec());
    assert_eq!(rest, vec![ops[0].clone()]);
}

/// Keys whose data change in their own set are replaced in one step (an
/// add before its delete would be refused as a duplicate); the other
/// elements of the same op go first. Three replaced at once (a rolling
/// update's sync), read as keys without data.
#[test]
fn a_replaced_key_stays_in_the_second_step() {
    let sets = [map(4)];
    let ops = vec![Op::DeleteElements(slot_keys(4, 0, 3)), Op::AddElements(slots(4, 4))];
    let (first, rest) = split_partial(V4, &ops, &decls(&sets)).expect("two steps");
    let words = slots(4, 4).words;
    let per = words.len() / 4;
    match (&first[..], &rest[..]) {
        ([Op::AddElements(now)], [Op::DeleteElements(_), Op::AddElements(later)]) => {
            assert_eq!(now.words, words[3 * per..], "slot 3 first");
            assert_eq!(later.words, words[..3 * per], "slots 0-2 replaced after their delete");
        }
        _ => panic!("{first:?} / {rest:?}"),
    }
    // Only replacements: one step.
    let ops = vec![Op::DeleteElements(slot_keys(4, 0, 2)), Op::AddElements(slots(4, 2))];
    assert_eq!(split_partial(V4, &ops, &decls(&sets)), None);
}

/// Nothing removed: one step. Nothing added beside: one step.
#[test]
fn one_step_when_nothing_moves() {
    let sets = [map(1)];
    assert_eq!(split_partial(V4, &[Op::AddElements(slots(1, 1))], &decls(&sets)), None);
    assert_eq!(split_partial(V4, &[Op::DeleteElements(slot_keys(1, 0, 1))], &decls(&sets)), None);
}

/// What names a flushed or deleted chain or set waits for the second
/// step, and so do interval and affinity sets' elements.
#[test]
fn what_names_a_flushed_object_goes_second() {
    let affinity = SetDecl::affinity("affinity-web", 10800);
    let sets = [map(1), affinity.clone()];
    let mut allow = ElementWriter::new(V4, SetRef::Host(HostSet::FirewallAllow));
    allow.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80);
    allow.value(KeyType::Cidr, &kpx_rules::ops::nftables::Value::Cidr("192.0.2.0/24".parse().unwrap()));
    let mut sticky = ElementWriter::new(V4, SetRef::Own("affinity-web".into()));
    sticky.address("10.0.0.1".parse().unwrap());
    let ops = vec![
        Op::FlushChain("svc-web".into()),
        Op::DeleteElements(slot_keys(1, 0, 1)),
        Op::AddRule(Rule::new("svc-web").verdict(Verdict::Accept)),
        Op::AddRule(Rule::new("other").verdict(Verdict::Goto("svc-web".into()))),
        Op::AddElements(service_ips("svc-web")),
        Op::AddElements(allow.finish()),
        Op::AddElements(sticky.finish()),
        Op::AddChain("new".into()),
        Op::AddRule(Rule::new("new").with(Match::Lookup {
            keys: vec![KeyExpr::Address(AddressField::Source)],
            set: SetRef::Own("affinity-web".into()),
            negate: false,
        })),
    ];
    let (first, rest) = split_partial(V4, &ops, &decls(&sets)).expect("two steps");
    assert_eq!(first, ops[7..].to_vec(), "only the new chain and its rule go first");
    assert_eq!(rest, ops[..7].to_vec());
}

fn frame() -> Vec<Op> {
    let base = BaseChain { name: "nat-prerouting", kind: ChainKind::Nat, hook: NfHook::Prerouting, priority: -100 };
    vec![
        Op::AddBaseChain(base),
        Op::AddRule(Rule::new("nat-prerouting").verdict(Verdict::Jump("services".into()))),
        Op::AddChain("services".into()),
        Op::AddRule(
            Rule::new("services")
                .verdict(Verdict::Vmap { keys: KeyExpr::DESTINATION.to_vec(), map: SetRef::Host(HostSet::ServiceIps) }),
        ),
    ]
}

/// A full sync: the first step is what the table does not hold, beside
/// what it holds, from the record of the last write.
#[test]
fn a_full_sync_adds_first_what_the_table_lacks() {
    let sets = [map(1), map(2), map(3)];
    let d = decls(&sets);
    let frame = frame();
    // Written: web with one endpoint, maps 1 and 2 (headroom).
    let before = vec![
        Op::AddChain("cluster-ip".into()),
        Op::AddChain("select-internal".into()),
        Op::AddSet(map(1)),
        Op::AddSet(map(2)),
        Op::AddRule(count_rule(1)),
        Op::AddRule(count_rule(2)),
        Op::AddElements(service_ips("cluster-ip")),
        Op::AddElements(slots(1, 1)),
    ];
    let mut held = Held::default();
    assert!(
        held.first_of_full(V4, &[&frame, &before], &d, &HashSet::new(), &HashSet::new(), &HashSet::new()).is_empty(),
        "unknown: nothing first"
    );
    held.record(V4, &[&frame, &before], &d, true);
    let chains: HashSet<&str> = ["nat-prerouting", "services", "cluster-ip", "select-internal"].into();
    let kernel_sets: HashSet<&str> = ["service-ips", "internal-tcp-1", "internal-tcp-2"].into();
    // The same again: nothing first.
    assert!(held.first_of_full(V4, &[&frame, &before], &d, &chains, &kernel_sets, &HashSet::new()).is_empty());
    // A fresh render with two endpoints: maps 2 and 3. Map 3 and its rule
    // are new, map 2's elements are not held: all first; map 1 goes in the
    // second step (not declared), and so does everything held.
    let after = vec![
        Op::AddChain("cluster-ip".into()),
        Op::AddChain("select-internal".into()),
        Op::AddSet(map(2)),
        Op::AddSet(map(3)),
        Op::AddRule(count_rule(2)),
        Op::AddRule(count_rule(3)),
        Op::AddElements(service_ips("cluster-ip")),
        Op::AddElements(slots(2, 2)),
    ];
    let first = held.first_of_full(V4, &[&frame, &after], &d, &chains, &kernel_sets, &HashSet::new());
    assert_eq!(first, vec![Op::AddSet(map(3)), Op::AddRule(count_rule(3)), Op::AddElements(slots(2, 2))]);
    // Map 2 held with another shape: declared again by the second step,
    // so neither its rule nor its elements go first.
    let replaced: HashSet<&str> = ["internal-tcp-2"].into();
    let first = held.first_of_full(V4, &[&frame, &after], &d, &chains, &kernel_sets, &replaced);
    assert_eq!(first, vec![Op::AddSet(map(3)), Op::AddRule(count_rule(3))]);
    // A rule of a base chain is never appended first.
    let mut changed = frame.clone();
    changed.push(Op::AddRule(Rule::new("nat-prerouting").verdict(Verdict::Accept)));
    assert!(held.first_of_full(V4, &[&changed, &before], &d, &chains, &kernel_sets, &HashSet::new()).is_empty());
    // A partial write recorded on top: its keys are held.
    held.record(V4, &[&[Op::DeleteElements(slot_keys(1, 0, 1)), Op::AddElements(slots(2, 2))]], &d, false);
    // The deleted key is no longer held: map 1 declared again gets it first.
    let back = vec![Op::AddSet(map(1)), Op::AddElements(slots(1, 1))];
    let first = held.first_of_full(V4, &[&frame, &back], &d, &chains, &kernel_sets, &HashSet::new());
    assert_eq!(first, vec![Op::AddElements(slots(1, 1))]);
    let first = held.first_of_full(V4, &[&frame, &after], &d, &chains, &kernel_sets, &HashSet::new());
    assert_eq!(first, vec![Op::AddSet(map(3)), Op::AddRule(count_rule(3))]);
    held.forget();
    assert!(held.first_of_full(V4, &[&frame, &after], &d, &chains, &kernel_sets, &HashSet::new()).is_empty());
}

/// Rules are appended: once one of a chain's waits, the later ones wait
/// too, or the chain would end in another order than in one step.
#[test]
fn a_chains_rules_keep_their_order() {
    let sets = [map(1)];
    let ops =
        vec![
            Op::FlushSet("internal-tcp-1".into()),
            Op::AddElements(slots(1, 1)),
            Op::AddRule(count_rule(1).verdict(Verdict::Vmap {
                keys: KeyExpr::DESTINATION.to_vec(),
                map: SetRef::Own("internal-tcp-1".into()),
            })),
            Op::AddRule(Rule::new("select-internal").verdict(Verdict::Drop)),
            Op::AddRule(Rule::new("other").verdict(Verdict::Accept)),
        ];
    let (first, rest) = split_partial(V4, &ops, &decls(&sets)).expect("two steps");
    assert_eq!(first, vec![ops[4].clone()]);
    assert_eq!(rest, ops[..4].to_vec());
}

/// A new chain reachable before all its rules are in would drop what the
/// missing ones serve: it waits whole, with what names it; so does a new
/// map whose elements wait, and `firewall-ips` (its ranges are an
/// interval set's, written second).
#[test]
fn nothing_new_is_reachable_half_made() {
    let sets = [map(1), map(2)];
    let ops =
        vec![
            Op::FlushChain("old".into()),
            Op::AddChain("svc".into()),
            Op::AddRule(Rule::new("svc").verdict(Verdict::Accept)),
            Op::AddRule(Rule::new("svc").verdict(Verdict::Goto("old".into()))),
            Op::AddElements(service_ips("svc")),
            Op::AddRule(Rule::new("entry").verdict(Verdict::Jump("svc".into()))),
            // A new map whose elements name the flushed chain...
            Op::AddSet(SetDecl { data: Some(DataType::Verdict), ..map(2) }),
            Op::AddElements({
                let mut w = ElementWriter::new(V4, SetRef::Own("internal-tcp-2".into()));
                w.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80).word(0);
                w.verdict(VerdictKind::Goto, Some("old"));
                w.finish()
            }),
            // ...and the rule that looks it up.
            Op::AddRule(Rule::new("select").verdict(Verdict::Vmap {
                keys: KeyExpr::DESTINATION.to_vec(),
                map: SetRef::Own("internal-tcp-2".into()),
            })),
            Op::AddElements({
                let mut w = ElementWriter::new(V4, SetRef::Host(HostSet::FirewallIps));
                w.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80);
                w.finish()
            }),
            Op::AddChain("fine".into()),
            Op::AddRule(Rule::new("fine").verdict(Verdict::Accept)),
        ];
    let sets = [sets[0].clone(), SetDecl { data: Some(DataType::Verdict), ..map(2) }];
    let (first, rest) = split_partial(V4, &ops, &decls(&sets)).expect("two steps");
    assert_eq!(first, ops[10..].to_vec(), "only the whole new chain goes first");
    assert_eq!(rest, ops[..10].to_vec());
}
