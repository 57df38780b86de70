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
        Op::DeleteElements(slots(1, 1)),
        Op::AddSet(map(2)),
        Op::AddRule(count_rule(2)),
        Op::AddElements(slots(2, 2)),
    ];
    let sets = [map(1), map(2)];
    let (first, rest) = split_partial(V4, &ops, &decls(&sets)).expect("two steps");
    assert_eq!(first, ops[1..].to_vec());
    assert_eq!(rest, vec![ops[0].clone()]);
}

/// A key whose data changes in its own set is replaced in one step (an
/// add before its delete would be refused as a duplicate); the other
/// elements of the same op go first.
#[test]
fn a_replaced_key_stays_in_the_second_step() {
    let sets = [map(2)];
    // Slot 0 changes endpoint, slot 1 is new.
    let mut old = ElementWriter::new(V4, SetRef::Own("internal-tcp-2".into()));
    old.address("10.96.0.10".parse().unwrap()).protocol(Protocol::Tcp).word(80).word(0);
    old.endpoint("10.1.0.9".parse().unwrap(), 8080);
    let ops = vec![Op::DeleteElements(old.finish()), Op::AddElements(slots(2, 2))];
    let (first, rest) = split_partial(V4, &ops, &decls(&sets)).expect("two steps");
    let words = slots(2, 2).words;
    let half = words.len() / 2;
    match (&first[..], &rest[..]) {
        ([Op::AddElements(now)], [Op::DeleteElements(_), Op::AddElements(later)]) => {
            assert_eq!(now.words, words[half..], "slot 1 first");
            assert_eq!(later.words, words[..half], "slot 0 replaced after its delete");
        }
        _ => panic!("{first:?} / {rest:?}"),
    }
    // Only a replacement: one step.
    let ops = vec![Op::DeleteElements(slots(2, 1)), Op::AddElements(slots(2, 1))];
    assert_eq!(split_partial(V4, &ops, &decls(&sets)), None);
}

/// Nothing removed: one step. Nothing added beside: one step.
#[test]
fn one_step_when_nothing_moves() {
    let sets = [map(1)];
    assert_eq!(split_partial(V4, &[Op::AddElements(slots(1, 1))], &decls(&sets)), None);
    assert_eq!(split_partial(V4, &[Op::DeleteElements(slots(1, 1))], &decls(&sets)), None);
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
        Op::DeleteElements(slots(1, 1)),
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
    held.record(V4, &[&[Op::DeleteElements(slots(1, 1)), Op::AddElements(slots(2, 2))]], &d, false);
    let first = held.first_of_full(V4, &[&frame, &after], &d, &chains, &kernel_sets, &HashSet::new());
    assert_eq!(first, vec![Op::AddSet(map(3)), Op::AddRule(count_rule(3))]);
    held.forget();
    assert!(held.first_of_full(V4, &[&frame, &after], &d, &chains, &kernel_sets, &HashSet::new()).is_empty());
}
