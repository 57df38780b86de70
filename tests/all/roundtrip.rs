//! Typed rules → the host's renderer → the real kernel → read back →
//! parsed → equal, for every variant of the vocabulary (enumerated) and for
//! random rules (property tests), in both modes and both families. The
//! kernel is the judge of what the host wrote; `nft list ruleset` must also
//! read the table back (operators use it).

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpx::kernel::iptables::frame::frame as ipt_frame;
use kpx::kernel::iptables::parse::{Line, normalize};
use kpx::kernel::iptables::render::payload;
use kpx::kernel::iptables::{IptablesKernel, dialect};
use kpx::kernel::netlink::nfnl::Batch;
use kpx::kernel::nftables::frame::frame as nft_frame;
use kpx::kernel::nftables::{NftablesKernel, decode, encode, messages};
use kpx::kernel::{Exec, SystemExec};
use kpx::syntax::iptables::Dialect;
use kpx_netlab::{Lab, Ns};
use kpx_rules::model::{Cidr, Cluster, IpFamily, Protocol, ProxyMode, Settings};
use kpx_rules::ops::CtStates;
use kpx_rules::ops::iptables::{
    self as ipt, AddressMatch, HashMark, HashTuple, InterfaceMatch, Match as M, Rule as R, Table, Target as T,
};
use kpx_rules::ops::nftables::{
    self as nft, AddressField, DataType, Element, ElementWriter, HostSet, KeyExpr, KeyType, Op, SetDecl, SetRef,
    Statement, Value, Verdict, VerdictKind, decode_elements,
};
use proptest::prelude::*;

/// kpx's executor inside a namespace.
struct NsExec(String);

impl Exec for NsExec {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> kpx::kernel::Result<String> {
        let mut all = vec!["netns", "exec", self.0.as_str(), program];
        all.extend_from_slice(args);
        SystemExec::default().run("ip", &all, stdin)
    }
}

fn lab(test: &str) -> Option<(Lab, Ns)> {
    match Lab::new() {
        Ok(mut lab) => {
            let ns = lab.add("rt").expect("a namespace");
            Some((lab, ns))
        }
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            None
        }
    }
}

fn settings(family: IpFamily, mode: ProxyMode) -> Settings {
    let mut s = Settings::new(family, mode);
    s.local_traffic = kpx_rules::model::LocalTraffic::Cidrs(vec![match family {
        IpFamily::V4 => "10.244.0.0/16".parse().unwrap(),
        IpFamily::V6 => "fd00:10:244::/56".parse().unwrap(),
    }]);
    s
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn cidr(s: &str) -> Cidr {
    s.parse().unwrap()
}

// ---------------------------------------------------------------- iptables

/// Writes the frame and `rs` into a fresh namespace and reads every chain
/// back; the first chain whose rules differ, if any.
fn iptables_roundtrip(ns: &Ns, family: IpFamily, rs: &ipt::Ruleset) -> Result<usize, String> {
    let s = settings(family, ProxyMode::Iptables);
    let d = dialect(&s);
    let frame = ipt_frame(&s);
    let kernel = IptablesKernel::new(family, Box::new(NsExec(ns.name.clone())));
    // Each round starts from a namespace holding nothing of kpx's.
    kernel.cleanup().map_err(|e| e.to_string())?;
    let (text, _) = payload(&frame, rs, &[], d, None);
    kernel.apply(&text).map_err(|e| format!("{e}\n{text}"))?;
    let dump = kernel.dump(d).map_err(|e| e.to_string())?;
    let mut want: BTreeMap<(Table, String), Vec<R>> = BTreeMap::new();
    for (t, c) in frame.chains.iter().map(|(t, c)| (*t, c.to_string())).chain(rs.chains.iter().cloned()) {
        want.entry((t, c)).or_default();
    }
    for r in frame.rules.iter().chain(&rs.rules).chain(&frame.trailing) {
        want.entry((r.table, r.chain.clone())).or_default().push(normalize(r, d));
    }
    let mut checked = 0;
    for ((t, chain), rules) in &want {
        let lines = dump.tables.get(t).and_then(|x| x.rules.get(chain)).cloned().unwrap_or_default();
        if let Some(Line::Foreign { text, reason }) = lines.iter().find(|l| matches!(l, Line::Foreign { .. })) {
            return Err(format!("{} {chain}: read back a rule kpx cannot read: {text}: {reason}", t.name()));
        }
        let got: Vec<R> = dump.rules(*t, chain).cloned().collect();
        if &got != rules {
            let i = got.iter().zip(rules).position(|(a, b)| a != b).unwrap_or(got.len().min(rules.len()));
            return Err(format!(
                "{} {chain}, rule {i} of {} (read back {}):\n want {:?}\n got {:?}\n payload:\n{text}",
                t.name(),
                rules.len(),
                got.len(),
                rules.get(i),
                got.get(i)
            ));
        }
        checked += got.len();
    }
    Ok(checked)
}

/// Every match and target of the vocabulary, in rules a plugin may write.
fn every_iptables_variant(family: IpFamily) -> ipt::Ruleset {
    let v4 = family == IpFamily::V4;
    let (ep, other, net) =
        if v4 { ("10.1.0.5", "192.0.2.7", "10.0.0.0/8") } else { ("fd00:1::5", "2001:db8::7", "fd00::/8") };
    let nat = |c: &str| R::chain(Table::Nat, c);
    let filter = |c: &str| R::chain(Table::Filter, c);
    let mut rs = ipt::Ruleset::default();
    for (t, c) in [
        (Table::Nat, "KUBE-SVC-A"),
        (Table::Nat, "KUBE-SEP-A"),
        (Table::Filter, "KUBE-SVC-F"),
        (Table::Nat, "KUBE-FW-Z9"),
    ] {
        rs.declare(t, c);
    }
    let addr = |negate, c: &str| AddressMatch { negate, cidr: cidr(c) };
    rs.push(
        nat("KUBE-SVC-A")
            .with(M::Source(addr(true, net)))
            .with(M::Destination(addr(false, &format!("{ep}/{}", if v4 { 32 } else { 128 }))))
            .jump("KUBE-SEP-A"),
    );
    rs.push(
        nat("KUBE-SVC-A")
            .with(M::InInterface(InterfaceMatch { negate: false, name: "veth".into(), prefix: true }))
            .target(T::Goto("KUBE-SEP-A".into())),
    );
    rs.push(
        nat("KUBE-SVC-A")
            .with(M::InInterface(InterfaceMatch { negate: true, name: "cni0".into(), prefix: false }))
            .target(T::MarkForMasquerade),
    );
    rs.push(
        nat("KUBE-SVC-A")
            .with(M::Protocol(Protocol::Udp))
            .with(M::DestinationPort(53))
            .with(M::comment("ns/dns:udp cluster IP"))
            .target(T::Return),
    );
    rs.push(
        nat("KUBE-SVC-A")
            .with(M::SourceTypeLocal { negate: false })
            .with(M::DestinationTypeLocal { negate: true })
            .target(T::Accept),
    );
    rs.push(
        nat("KUBE-SVC-A")
            .with(M::Conntrack { negate: false, states: CtStates::NEW })
            .with(M::Conntrack { negate: true, states: CtStates::RELATED | CtStates::ESTABLISHED | CtStates::DNAT }),
    );
    rs.push(nat("KUBE-SVC-A").with(M::Mark { negate: false, value: 0x4000, mask: 0x4000 }).with(M::Mark {
        negate: true,
        value: 7,
        mask: u32::MAX,
    }));
    rs.push(nat("KUBE-SVC-A").with(M::StatisticRandom(kpx_rules::ops::probability_one_in(3))).jump("KUBE-SEP-A"));
    rs.push(nat("KUBE-SVC-A").with(M::StatisticNth { every: 3, packet: 1 }).jump("KUBE-SEP-A"));
    rs.push(nat("KUBE-SVC-A").with(M::ClusterHash { total: 32, node: 32, seed: 0xdead_beef }).jump("KUBE-SEP-A"));
    rs.push(
        nat("KUBE-SVC-A")
            .with(M::ClusterHash { total: 3, node: 1, seed: 7 })
            .with(M::ClusterHash { total: 8, node: 7, seed: 8 })
            .jump("KUBE-SEP-A"),
    );
    rs.push(
        nat("KUBE-SVC-A")
            .with(M::RecentCheck { name: "KUBE-SEP-A".into(), seconds: 10800, reap: true })
            .jump("KUBE-SEP-A"),
    );
    rs.push(
        nat("KUBE-SVC-A")
            .with(M::RecentCheck { name: "KUBE-SEP-A".into(), seconds: 60, reap: false })
            .jump("KUBE-SEP-A"),
    );
    rs.push(nat("KUBE-SVC-A").target(T::HashMark(HashMark { tuple: HashTuple::Source, modulus: 7, seed: 0xdeadbeef })));
    rs.push(nat("KUBE-SVC-A").with(M::Protocol(Protocol::Tcp)).target(T::HashMark(HashMark {
        tuple: HashTuple::Destination,
        modulus: 16384,
        seed: 1,
    })));
    rs.push(nat("KUBE-SVC-A").with(M::HashSlot(3)).jump("KUBE-SEP-A"));
    rs.push(
        nat("KUBE-SEP-A")
            .with(M::RecentSet { name: "KUBE-SEP-A".into() })
            .with(M::Protocol(Protocol::Tcp))
            .target(T::Dnat(ip(ep), 8080)),
    );
    rs.push(
        nat("KUBE-SEP-A")
            .with(M::Protocol(Protocol::Sctp))
            .with(M::DestinationPort(3868))
            .target(T::Dnat(ip(ep), 3868)),
    );
    rs.push(
        nat("KUBE-FW-Z9")
            .with(M::Source(addr(false, &format!("{other}/{}", if v4 { 32 } else { 128 }))))
            .target(T::None),
    );
    rs.push(filter("KUBE-SVC-F").with(M::Protocol(Protocol::Tcp)).with(M::DestinationPort(80)).target(T::Reject));
    rs.push(filter("KUBE-SVC-F").with(M::Protocol(Protocol::Udp)).target(T::Drop));
    rs.push(
        R::hook(ipt::Hook::NatServices)
            .with(M::Destination(addr(false, &format!("{ep}/{}", if v4 { 32 } else { 128 }))))
            .with(M::Protocol(Protocol::Tcp))
            .with(M::DestinationPort(80))
            .jump("KUBE-SVC-A"),
    );
    rs.push(R::hook(ipt::Hook::FilterServices).with(M::Protocol(Protocol::Tcp)).jump("KUBE-SVC-F"));
    rs
}

#[test]
fn every_iptables_variant_reads_back_from_the_kernel() {
    let Some((_lab, ns)) = lab("every_iptables_variant_reads_back_from_the_kernel") else { return };
    for family in [IpFamily::V4, IpFamily::V6] {
        let rs = every_iptables_variant(family);
        let n = iptables_roundtrip(&ns, family, &rs).unwrap_or_else(|e| panic!("{family}: {e}"));
        eprintln!("iptables {family}: {n} rules written and read back equal (frame included)");
    }
}

/// kpx's executor inside a namespace that counts the processes it starts.
struct CountingExec(NsExec, std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Exec for CountingExec {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> kpx::kernel::Result<String> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.0.run(program, args, stdin)
    }
}

/// Each jump from a built-in chain, and how many copies the kernel holds.
fn jump_copies(kernel: &IptablesKernel, jumps: &[R]) -> Vec<(String, usize)> {
    let saved = kernel.save().unwrap();
    jumps
        .iter()
        .map(|j| {
            let T::HostJump(to) = &j.target else { unreachable!("a frame jump is a host jump") };
            let (line, mut table) = (format!("-A {} ", j.chain), "");
            let mut n = 0;
            for l in saved.lines() {
                if let Some(t) = l.strip_prefix('*') {
                    table = t;
                }
                n += usize::from(table == j.table.name() && l.starts_with(&line) && l.ends_with(&format!(" -j {to}")));
            }
            (format!("{} {} -> {to}", j.table.name(), j.chain), n)
        })
        .collect()
}

/// The host's checks of its own rules in few processes: the jumps from
/// built-in chains made in one `iptables-restore` on a first start, found
/// in one when all there, and added one by one (never doubled) when some
/// are missing; the loss check asks about every rule (the frame's and
/// each variant) in one `iptables-restore` of `-C` lines, and names the
/// one rule the kernel lacks, a hash mark's second line included.
#[test]
fn the_hosts_rule_checks_are_one_process_and_exact() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some((_lab, ns)) = lab("the_hosts_rule_checks_are_one_process_and_exact") else { return };
    for family in [IpFamily::V4, IpFamily::V6] {
        let s = settings(family, ProxyMode::Iptables);
        let (d, frame) = (dialect(&s), ipt_frame(&s));
        let runs = std::sync::Arc::new(AtomicUsize::new(0));
        let kernel = IptablesKernel::new(family, Box::new(CountingExec(NsExec(ns.name.clone()), runs.clone())));
        let once = |what: &str| {
            for (jump, n) in jump_copies(&kernel, &frame.jumps) {
                assert_eq!(n, 1, "{family}, {what}: {jump} held {n} times");
            }
        };
        // A first start: nothing of kpx's in the kernel.
        kernel.cleanup().unwrap();
        runs.store(0, Ordering::Relaxed);
        kernel.ensure_jumps(&frame.jumps, d).unwrap();
        assert_eq!(runs.swap(0, Ordering::Relaxed), 2, "{family}: a first start's jumps: check, then one restore");
        once("a first start");
        // Chains there, jumps not (what the roundtrip leaves): one by one.
        let rs = every_iptables_variant(family);
        iptables_roundtrip(&ns, family, &rs).unwrap_or_else(|e| panic!("{family}: {e}"));
        kernel.ensure_jumps(&frame.jumps, d).unwrap();
        once("chains without jumps");
        // One jump gone: put back, the others not doubled.
        let gone = &frame.jumps[frame.jumps.len() / 2];
        let delete = |rule: &R| {
            let mut args: Vec<String> = vec!["-t".into(), rule.table.name().into(), "-D".into(), rule.chain.clone()];
            args.extend(kpx::syntax::iptables::rule_args(rule, d));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            NsExec(ns.name.clone())
                .run(&kpx::kernel::iptables::backend::Backend::System.tool(family, "iptables"), &args, None)
                .unwrap();
        };
        delete(gone);
        kernel.ensure_jumps(&frame.jumps, d).unwrap();
        once("one jump deleted");
        runs.store(0, Ordering::Relaxed);
        kernel.ensure_jumps(&frame.jumps, d).unwrap();
        assert_eq!(runs.swap(0, Ordering::Relaxed), 1, "{family}: jumps all there, yet more than one process");

        let rules: Vec<&R> = frame.jumps.iter().chain(&frame.rules).chain(&rs.rules).chain(&frame.trailing).collect();
        assert!(rules.len() > 20, "{family}: only {} rules", rules.len());
        assert_eq!(kernel.lost_rules(&rules, d).unwrap(), None, "{family}: all written, none lost");
        assert_eq!(
            runs.swap(0, Ordering::Relaxed),
            1,
            "{family}: checking {} rules took more than one process",
            rules.len()
        );
        // One rule from the middle taken out of the kernel.
        let gone = rules[rules.len() / 2];
        delete(gone);
        let lost =
            kernel.lost_rules(&rules, d).unwrap().unwrap_or_else(|| panic!("{family}: a deleted rule not noticed"));
        let spec = kpx::syntax::iptables::rule_args(gone, d).join(" ");
        assert!(
            lost.contains(&gone.chain) && lost.contains(&spec),
            "{family}: {lost}\n want the rule {} {spec}",
            gone.chain
        );
        // A hash mark is two lines: the second alone gone is noticed too.
        iptables_roundtrip(&ns, family, &rs).unwrap_or_else(|e| panic!("{family}: {e}"));
        kernel.ensure_jumps(&frame.jumps, d).unwrap();
        assert_eq!(kernel.lost_rules(&rules, d).unwrap(), None, "{family}: all written again");
        let hash = rs.rules.iter().find(|r| matches!(r.target, T::HashMark(_))).expect("a hash-mark rule");
        let second = kpx::syntax::iptables::rule_lines(hash, d).remove(1);
        let words = kpx::syntax::iptables::split_words(&second);
        let mut args: Vec<&str> = vec!["-t", hash.table.name(), "-D"];
        args.extend(words.iter().skip(1).map(String::as_str));
        NsExec(ns.name.clone())
            .run(&kpx::kernel::iptables::backend::Backend::System.tool(family, "iptables"), &args, None)
            .unwrap();
        let lost = kernel
            .lost_rules(&rules, d)
            .unwrap()
            .unwrap_or_else(|| panic!("{family}: a hash mark's second line not noticed"));
        assert!(lost.contains("--hmark-offset 0"), "{family}: {lost}\n want the hash mark's second line: {second}");
    }
}

/// Random rulesets per property test: 24 in the test command, more with
/// `KPX_PROPTEST_CASES` (the long runs in README.md, "Tests").
fn cases() -> u32 {
    std::env::var("KPX_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24)
}

fn arb_cidr(v4: bool) -> impl Strategy<Value = Cidr> {
    let max = if v4 { 32u8 } else { 128 };
    (any::<u128>(), 0..=max).prop_map(move |(bits, len)| {
        let addr: IpAddr = if v4 {
            IpAddr::from(std::net::Ipv4Addr::from(bits as u32))
        } else {
            IpAddr::from(std::net::Ipv6Addr::from(bits))
        };
        let c = Cidr { addr, prefix_len: len };
        Cidr { addr: c.network(), prefix_len: len }
    })
}

fn arb_protocol() -> impl Strategy<Value = Protocol> {
    prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp), Just(Protocol::Sctp)]
}

fn arb_states() -> impl Strategy<Value = CtStates> {
    (1u8..=0x7f).prop_map(CtStates::from_bits)
}

/// A rule a plugin may write in an own nat chain: one of each header
/// match at most, module matches in any order. `wide`: every value the
/// contract can carry, edge values included (the validator decides).
fn arb_ipt_rule(v4: bool, wide: bool) -> impl Strategy<Value = R> {
    let name = if wide { "[ -~]{0,17}" } else { "[a-z][a-z0-9]{0,10}" };
    let (low_port, low_seconds, low_every, top_modulus): (u16, u32, u32, u32) =
        if wide { (0, 0, 0, u32::MAX) } else { (1, 1, 1, 0x4000) };
    let top_seconds = if wide { u32::MAX } else { i32::MAX as u32 };
    (
        proptest::option::of((any::<bool>(), arb_cidr(v4))),
        proptest::option::of((any::<bool>(), arb_cidr(v4))),
        proptest::option::of((any::<bool>(), name, any::<bool>())),
        proptest::option::of((
            arb_protocol(),
            proptest::option::of(prop_oneof![Just(low_port), Just(u16::MAX), low_port..=u16::MAX]),
        )),
        proptest::collection::vec(
            prop_oneof![
                any::<bool>().prop_map(|n| M::SourceTypeLocal { negate: n }),
                any::<bool>().prop_map(|n| M::DestinationTypeLocal { negate: n }),
                (any::<bool>(), arb_states()).prop_map(|(negate, states)| M::Conntrack { negate, states }),
                (any::<bool>(), any::<u32>(), any::<u32>()).prop_map(|(negate, value, mask)| M::Mark {
                    negate,
                    value: value & mask,
                    mask
                }),
                (0u32..=(1 << 31) + u32::from(wide)).prop_map(M::StatisticRandom),
                (low_every..100)
                    .prop_flat_map(move |every: u32| (Just(every), 0..every.max(1) + u32::from(wide)))
                    .prop_map(|(every, packet)| M::StatisticNth { every, packet }),
                (1u8..=32, any::<u8>(), any::<u32>()).prop_map(|(total, node, seed)| M::ClusterHash {
                    total,
                    node: node % total + 1,
                    seed
                }),
                (prop_oneof![Just(low_seconds), Just(top_seconds), low_seconds..100_000], any::<bool>())
                    .prop_map(|(seconds, reap)| M::RecentCheck { name: "KUBE-SEP-P".into(), seconds, reap }),
                "[ -!#-\\[\\]-~]{0,40}".prop_map(M::Comment),
            ],
            0..4,
        ),
        prop_oneof![
            Just(T::None),
            Just(T::Accept),
            Just(T::Return),
            Just(T::MarkForMasquerade),
            Just(T::Jump("KUBE-SEP-P".into())),
            Just(T::Goto("KUBE-SEP-P".into())),
            (any::<u32>(), (1 - u32::from(wide))..=top_modulus).prop_map(|(seed, modulus)| T::HashMark(HashMark {
                tuple: HashTuple::Source,
                modulus,
                seed
            })),
        ],
    )
        .prop_map(move |(src, dst, iface, proto, modules, target)| {
            let mut r = R::chain(Table::Nat, "KUBE-SVC-P");
            // A negated /0 matches nothing: refused by the validator.
            if let Some((negate, cidr)) = src {
                r = r.with(M::Source(AddressMatch { negate: negate && cidr.prefix_len > 0, cidr }));
            }
            if let Some((negate, cidr)) = dst {
                r = r.with(M::Destination(AddressMatch { negate: negate && cidr.prefix_len > 0, cidr }));
            }
            if let Some((negate, name, prefix)) = iface {
                r = r.with(M::InInterface(InterfaceMatch { negate, name, prefix }));
            }
            if let Some((p, port)) = proto {
                r = r.with(M::Protocol(p));
                if let Some(port) = port {
                    r = r.with(M::DestinationPort(port));
                }
            }
            // One comment per rule.
            let mut comment = false;
            for m in modules {
                if matches!(m, M::Comment(_)) && std::mem::replace(&mut comment, true) {
                    continue;
                }
                r = r.with(m);
            }
            r.target(target)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_iptables_rules_read_back_from_the_kernel(
        v4 in proptest::collection::vec(arb_ipt_rule(true, false), 1..12),
        v6 in proptest::collection::vec(arb_ipt_rule(false, false), 1..12),
    ) {
        let Some((_lab, ns)) = lab("random_iptables_rules_read_back_from_the_kernel") else { return Ok(()) };
        for (family, rules) in [(IpFamily::V4, v4), (IpFamily::V6, v6)] {
            let mut rs = ipt::Ruleset::default();
            rs.declare(Table::Nat, "KUBE-SVC-P");
            rs.declare(Table::Nat, "KUBE-SEP-P");
            rs.rules = rules;
            iptables_roundtrip(&ns, family, &rs).map_err(TestCaseError::fail)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases() * 2, failure_persistence: None, ..ProptestConfig::default() })]

    /// What the validator accepts, iptables-restore accepts: iptables-restore
    /// commits table by table, so a value the kernel refuses after the
    /// validator passed it would leave the first table written (the red
    /// team's `recent --seconds 0`).
    #[test]
    fn what_the_validator_accepts_iptables_restore_accepts(
        v4 in proptest::collection::vec(arb_ipt_rule(true, true), 1..8),
        v6 in proptest::collection::vec(arb_ipt_rule(false, true), 1..8),
    ) {
        let Some((_lab, ns)) = lab("what_the_validator_accepts_iptables_restore_accepts") else { return Ok(()) };
        for (family, rules) in [(IpFamily::V4, v4), (IpFamily::V6, v6)] {
            for rule in rules {
                let mut rs = ipt::Ruleset::default();
                rs.declare(Table::Nat, "KUBE-SVC-P");
                rs.declare(Table::Nat, "KUBE-SEP-P");
                rs.rules = vec![rule];
                let s = settings(family, ProxyMode::Iptables);
                let (scope, model) = (kpx::validate::Scope::default(), kpx::validate::iptables::Model::default());
                let ctx = kpx::validate::iptables::Context {
                    plugin: "proptest",
                    dialect: dialect(&s),
                    scope: &scope,
                    model: &model,
                    full: true,
                };
                if kpx::validate::iptables::check(&ctx, &rs).is_ok() {
                    iptables_roundtrip(&ns, family, &rs).map_err(TestCaseError::fail)?;
                }
            }
        }
    }
}

// ---------------------------------------------------------------- nftables

/// What the kernel gave back of the table.
struct ReadBack {
    sets: BTreeMap<String, decode::SetShape>,
    rules: BTreeMap<String, Vec<nft::Rule>>,
    elements: BTreeMap<String, Vec<Element>>,
    listing: Result<String, String>,
}

/// Declarations of a transaction's sets (the host's and its own).
fn declarations(ops: &[Op]) -> BTreeMap<String, SetDecl> {
    ops.iter()
        .filter_map(|op| match op {
            Op::AddSet(d) => Some((d.name.clone(), d.clone())),
            _ => None,
        })
        .collect()
}

/// Writes the frame and `tx` into a fresh namespace over netlink and reads
/// the table back.
fn nftables_write_and_read(ns: &Ns, s: &Settings, tx: &nft::Transaction) -> Result<ReadBack, String> {
    let frame = nft_frame(s, &Cluster::default());
    let mut ops = frame.clone();
    ops.extend(tx.ops.iter().cloned());
    let decls = declarations(&ops);
    let (family, mark) = (s.family, s.masquerade_mark());
    let lookup = |r: &SetRef| decls.get(r.name()).cloned();
    let mut batch = Batch::from_iter([encode::add_table()]);
    let hints = kpx::kernel::nftables::typeof_udata::hints(&ops);
    let sets = kpx::kernel::nftables::Sets { decls: &lookup, sizes: &Default::default(), hints: &hints };
    messages(&mut batch, family, mark, &ops, &sets, usize::MAX)?;
    let name = ns.name.clone();
    let decls2 = decls.clone();
    let read = ns
        .enter(move || -> Result<ReadBack, String> {
            let mut k = NftablesKernel::new(family);
            let _ = k.delete_table();
            k.apply(&mut batch).map_err(|e| e.to_string())?;
            let objects = k.objects().map_err(|e| e.to_string())?.ok_or("no table after the write")?;
            let mut rules: BTreeMap<String, Vec<nft::Rule>> = BTreeMap::new();
            for (chain, rule) in k.rules(mark).map_err(|e| e.to_string())? {
                rules.entry(chain.clone()).or_default().push(rule.map_err(|e| format!("{chain}: {e}"))?);
            }
            let mut elements = BTreeMap::new();
            for (name, decl) in &decls2 {
                let mut got = if decl.timeout_seconds.is_some() {
                    Vec::new()
                } else {
                    k.elements(decl).map_err(|e| e.to_string())?
                };
                got.sort();
                elements.insert(name.clone(), got);
            }
            let sets = objects.sets.into_iter().map(|s| (s.name, s.shape)).collect();
            Ok(ReadBack { sets, rules, elements, listing: Ok(String::new()) })
        })
        .map_err(|e| e.to_string())??;
    let listing = Ns { name }.exec(&["nft", "list", "ruleset"]).map_err(|e| e.to_string());
    Ok(ReadBack { listing, ..read })
}

/// A rule as the kernel gives it back: prefixes at their network address,
/// comments as the host writes them.
fn nft_normal(r: &nft::Rule) -> nft::Rule {
    let mut r = r.clone();
    for m in &mut r.matches {
        if let nft::Match::Address { cidr, .. } = m {
            *cidr = Cidr { addr: cidr.network(), prefix_len: cidr.prefix_len };
        }
    }
    r.comment = r.comment.map(|c| kpx_rules::ops::sanitize_comment(&c, kpx::syntax::nftables::MAX_COMMENT));
    r
}

fn nftables_roundtrip(ns: &Ns, s: &Settings, tx: &nft::Transaction) -> Result<usize, String> {
    let back = nftables_write_and_read(ns, s, tx)?;
    let frame = nft_frame(s, &Cluster::default());
    let mut ops = frame;
    ops.extend(tx.ops.iter().cloned());
    let decls = declarations(&ops);
    let mut want_rules: BTreeMap<String, Vec<nft::Rule>> = BTreeMap::new();
    let mut want_elements: BTreeMap<String, Vec<Element>> = decls.keys().map(|k| (k.clone(), Vec::new())).collect();
    for op in &ops {
        match op {
            Op::AddRule(r) => want_rules.entry(r.chain.clone()).or_default().push(nft_normal(r)),
            Op::AddElements(e) => {
                let decl = &decls[e.set.name()];
                want_elements
                    .get_mut(e.set.name())
                    .unwrap()
                    .extend(decode_elements(decl, s.family, e).map_err(|d| d.to_string())?);
            }
            _ => {}
        }
    }
    for v in want_elements.values_mut() {
        v.sort();
    }
    for (name, decl) in &decls {
        let want = decode::shape_of(s.family, decl, None)?;
        if !back.sets.get(name).is_some_and(|held| want.held_as(held)) {
            return Err(format!("set {name}: want {want:?}, kernel has {:?}", back.sets.get(name)));
        }
    }
    for (chain, want) in &want_rules {
        let got = back.rules.get(chain).cloned().unwrap_or_default();
        if &got != want {
            return Err(format!("chain {chain}:\n want {want:#?}\n got {got:#?}"));
        }
    }
    if back.elements != want_elements {
        return Err(format!("elements:\n want {want_elements:#?}\n got {:#?}", back.elements));
    }
    back.listing.map_err(|e| format!("nft list ruleset cannot read the table: {e}"))?;
    Ok(want_rules.values().map(Vec::len).sum::<usize>() + want_elements.values().map(Vec::len).sum::<usize>())
}

/// Every operation, match, statement, verdict, key and data type.
fn every_nftables_variant(family: IpFamily) -> nft::Transaction {
    let v4 = family == IpFamily::V4;
    let (ep, svc, net) =
        if v4 { ("10.1.0.5", "10.96.0.10", "10.0.0.0/8") } else { ("fd00:1::5", "fd00:96::10", "fd00::/8") };
    let own = |n: &str| SetRef::Own(n.to_string());
    let decl = |name: &str, key: &[KeyType], data: Option<DataType>, interval: bool| SetDecl {
        name: name.into(),
        key: key.to_vec(),
        data,
        interval,
        timeout_seconds: None,
        comment: Some(format!("{name} set")),
    };
    let mut t = nft::Transaction::default();
    for c in ["a", "b", "c"] {
        t.push(Op::AddChain(c.into()));
    }
    t.push(Op::AddSet(decl("addrs", &[KeyType::Address], None, false)));
    t.push(Op::AddSet(decl("ranges", &[KeyType::Address, KeyType::Cidr], None, true)));
    t.push(Op::AddSet(decl("ports", &[KeyType::Protocol, KeyType::Port], None, false)));
    t.push(Op::AddSet(decl("slots", &[KeyType::Integer], Some(DataType::Verdict), false)));
    t.push(Op::AddSet(decl(
        "dispatch",
        &[KeyType::Address, KeyType::Protocol, KeyType::Port],
        Some(DataType::Verdict),
        false,
    )));
    t.push(Op::AddSet(decl(
        "endpoints",
        &[KeyType::Address, KeyType::Protocol, KeyType::Port, KeyType::Integer],
        Some(DataType::Endpoint),
        false,
    )));
    t.push(Op::AddSet(SetDecl::affinity("sticky", 10800)));
    let rule = |c: &str| nft::Rule::new(c);
    let addr = |field, negate, c: &str| nft::Match::Address { field, negate, cidr: cidr(c) };
    let tcp = || nft::Match::Protocol { negate: false, protocol: Protocol::Tcp };
    let destination = || KeyExpr::DESTINATION.to_vec();
    let rules = vec![
        rule("a")
            .with(addr(AddressField::Source, true, net))
            .with(addr(AddressField::Destination, false, &format!("{svc}/{}", if v4 { 32 } else { 128 })))
            .with(tcp())
            .with(nft::Match::DestinationPort { negate: false, port: 80 })
            .verdict(Verdict::Jump("b".into())),
        rule("a")
            .with(addr(AddressField::Source, false, if v4 { "10.128.0.0/9" } else { "fd00:10::/33" }))
            .with(nft::Match::Protocol { negate: true, protocol: Protocol::Udp })
            .with(nft::Match::DestinationPort { negate: true, port: 53 })
            .verdict(Verdict::Goto("b".into())),
        rule("a")
            .with(nft::Match::InInterface { negate: false, name: "veth".into(), prefix: true })
            .with(nft::Match::InInterface { negate: true, name: "cni0".into(), prefix: false })
            .verdict(Verdict::Accept),
        rule("a")
            .with(nft::Match::FibLocal { field: AddressField::Source, negate: false })
            .with(nft::Match::FibLocal { field: AddressField::Destination, negate: true })
            .verdict(Verdict::Drop),
        rule("a")
            .with(nft::Match::CtState { negate: false, states: CtStates::NEW | CtStates::ESTABLISHED })
            .with(nft::Match::CtState {
                negate: true,
                states: CtStates::INVALID | CtStates::UNTRACKED | CtStates::RELATED,
            })
            .verdict(Verdict::Return),
        // Host only, but written by the same encoder: read back the same.
        rule("a").with(nft::Match::CtDnat { negate: false }).with(nft::Match::CtDnat { negate: true }),
        rule("a").with(nft::Match::Mark { negate: false, value: 0x10, mask: 0xf0 }).with(nft::Match::Mark {
            negate: true,
            value: 1,
            mask: u32::MAX,
        }),
        rule("a")
            .with(nft::Match::Lookup {
                keys: vec![KeyExpr::Address(AddressField::Source)],
                set: own("addrs"),
                negate: false,
            })
            .with(nft::Match::Lookup {
                keys: vec![KeyExpr::Address(AddressField::Destination), KeyExpr::Address(AddressField::Source)],
                set: own("ranges"),
                negate: true,
            })
            .verdict(Verdict::Continue),
        rule("a")
            .with(nft::Match::Lookup { keys: KeyExpr::NODE_PORT.to_vec(), set: own("ports"), negate: false })
            .with(nft::Match::Lookup { keys: destination(), set: SetRef::Host(HostSet::FirewallIps), negate: true }),
        rule("a")
            .statement(Statement::Counter)
            .statement(Statement::MasqueradeMark)
            .statement(Statement::AffinityUpdate("sticky".into()))
            .comment("ns/svc:p80 -> endpoint"),
        rule("a")
            .with(nft::Match::Lookup {
                keys: vec![KeyExpr::Address(AddressField::Source)],
                set: own("sticky"),
                negate: false,
            })
            .verdict(Verdict::Goto("c".into())),
        rule("b").with(tcp()).verdict(Verdict::Dnat(ip(ep), 8080)),
        rule("b").with(tcp()).verdict(Verdict::DnatMap {
            keys: {
                let mut k = destination();
                k.push(KeyExpr::NumgenRandom(3));
                k
            },
            map: own("endpoints"),
        }),
        rule("b").with(tcp()).verdict(Verdict::DnatMap {
            keys: {
                let mut k = destination();
                k.push(KeyExpr::Jhash { field: AddressField::Source, modulus: 5, seed: 0xdeadbeef });
                k
            },
            map: own("endpoints"),
        }),
        rule("b").verdict(Verdict::Vmap { keys: destination(), map: own("dispatch") }),
        rule("b").verdict(Verdict::Vmap { keys: vec![KeyExpr::NumgenIncrement(4)], map: own("slots") }),
        rule("c").verdict(Verdict::Vmap {
            keys: vec![KeyExpr::Jhash { field: AddressField::Destination, modulus: 9, seed: 1 }],
            map: own("slots"),
        }),
    ];
    t.ops.extend(rules.into_iter().map(Op::AddRule));
    let mut w = ElementWriter::new(family, own("addrs"));
    w.address(ip(ep)).address(ip(svc));
    t.push(Op::AddElements(w.finish()));
    let mut w = ElementWriter::new(family, own("ranges"));
    w.address(ip(svc)).value(KeyType::Cidr, &Value::Cidr(cidr(net)));
    w.address(ip(ep)).value(KeyType::Cidr, &Value::Cidr(cidr(&format!("{ep}/{}", if v4 { 32 } else { 128 }))));
    t.push(Op::AddElements(w.finish()));
    let mut w = ElementWriter::new(family, own("ports"));
    w.protocol(Protocol::Tcp).word(80).protocol(Protocol::Sctp).word(3868);
    t.push(Op::AddElements(w.finish()));
    let mut w = ElementWriter::new(family, own("slots"));
    for (i, (kind, chain)) in [
        (VerdictKind::Jump, Some("b")),
        (VerdictKind::Goto, Some("c")),
        (VerdictKind::Accept, None),
        (VerdictKind::Drop, None),
        (VerdictKind::Return, None),
        (VerdictKind::Reject, None),
    ]
    .into_iter()
    .enumerate()
    {
        w.word(i as u32).verdict(kind, chain);
    }
    t.push(Op::AddElements(w.finish()));
    let mut w = ElementWriter::new(family, own("dispatch"));
    w.address(ip(svc)).protocol(Protocol::Tcp).word(80).verdict(VerdictKind::Goto, Some("b"));
    t.push(Op::AddElements(w.finish()));
    let mut w = ElementWriter::new(family, own("endpoints"));
    for slot in 0..3 {
        w.address(ip(svc)).protocol(Protocol::Tcp).word(80).word(slot).endpoint(ip(ep), 8080 + slot as u16);
    }
    t.push(Op::AddElements(w.finish()));
    // Elements of the host's sets, as a plugin fills them.
    let mut w = ElementWriter::new(family, SetRef::Host(HostSet::FirewallAllow));
    w.address(ip(svc)).protocol(Protocol::Tcp).word(80).value(KeyType::Cidr, &Value::Cidr(cidr(net)));
    t.push(Op::AddElements(w.finish()));
    let mut w = ElementWriter::new(family, SetRef::Host(HostSet::Hairpin));
    w.address(ip(ep)).address(ip(ep));
    t.push(Op::AddElements(w.finish()));
    t
}

#[test]
fn every_nftables_variant_reads_back_from_the_kernel() {
    let Some((_lab, ns)) = lab("every_nftables_variant_reads_back_from_the_kernel") else { return };
    for family in [IpFamily::V4, IpFamily::V6] {
        let s = settings(family, ProxyMode::Nftables);
        let tx = every_nftables_variant(family);
        let n = nftables_roundtrip(&ns, &s, &tx).unwrap_or_else(|e| panic!("{family}: {e}"));
        eprintln!(
            "nftables {family}: {n} rules and elements written over netlink and read back equal (frame included)"
        );
    }
}

/// The same table as nft itself reads it: an oracle that shares nothing
/// with kpx's encoder and decoder. Each line below was checked by hand
/// against the typed rule it comes from.
#[test]
fn nft_reads_every_nftables_variant_as_meant() {
    let Some((_lab, ns)) = lab("nft_reads_every_nftables_variant_as_meant") else { return };
    const LINES: &[&str] = &[
        "IP saddr != NET IP daddr SVC tcp dport 80 jump b",
        "IP saddr SRC9 meta l4proto != udp th dport != 53 goto b",
        "iifname \"veth*\" iifname != \"cni0\" accept",
        "fib saddr type local fib daddr type != local drop",
        "ct state established,new ct state ! invalid,related,untracked return",
        "ct status dnat ct status ! dnat",
        "meta mark & 0x000000f0 == 0x00000010 meta mark != 0x00000001",
        "IP saddr @addrs IP daddr . IP saddr != @ranges",
        "meta l4proto . th dport @ports IP daddr . meta l4proto . th dport != @firewall-ips",
        "meta mark set meta mark | 0x00004000 update @sticky { IP saddr } comment \"ns/svc:p80 -> endpoint\"",
        "IP saddr @sticky goto c",
        "meta l4proto tcp dnat to EPPORT",
        "dnat IP to IP daddr . meta l4proto . tcp dport . numgen random mod 3 map @endpoints",
        "dnat IP to IP daddr . meta l4proto . tcp dport . jhash IP saddr mod 5 seed 0xdeadbeef map @endpoints",
        "IP daddr . meta l4proto . th dport vmap @dispatch",
        "numgen inc mod 4 vmap @slots",
        "jhash IP daddr mod 9 seed 0x1 vmap @slots",
        // A set with a number in its key says what fills it (nft's
        // `typeof`, from the rule that looks it up): nft can read it back.
        "typeof numgen inc mod 4 : verdict",
        "typeof IP daddr . meta l4proto . th dport . numgen random mod 3 : IP daddr . tcp dport",
        "elements = { 0 : jump b, 1 : goto c, 2 : accept, 3 : drop, 4 : return,",
        "5 : goto reject-chain }",
        "SVC . tcp . 80 . 1 : EP . 8081",
        "elements = { SVC . tcp . 80 : goto b }",
        "elements = { SVC . tcp . 80 . NET }",
    ];
    for family in [IpFamily::V4, IpFamily::V6] {
        let s = settings(family, ProxyMode::Nftables);
        let back = nftables_write_and_read(&ns, &s, &every_nftables_variant(family)).unwrap();
        let listing = back.listing.unwrap();
        let words: &[(&str, &str)] = match family {
            IpFamily::V4 => &[
                ("IP", "ip"),
                ("SRC9", "10.128.0.0/9"),
                ("NET", "10.0.0.0/8"),
                ("SVC", "10.96.0.10"),
                ("EPPORT", "10.1.0.5:8080"),
                ("EP", "10.1.0.5"),
            ],
            IpFamily::V6 => &[
                ("IP", "ip6"),
                ("SRC9", "fd00:10::/33"),
                ("NET", "fd00::/8"),
                ("SVC", "fd00:96::10"),
                ("EPPORT", "[fd00:1::5]:8080"),
                ("EP", "fd00:1::5"),
            ],
        };
        for line in LINES {
            let want = words.iter().fold(line.to_string(), |l, (k, v)| l.replace(k, v));
            assert!(listing.contains(&want), "{family}: nft does not list {want:?}:\n{listing}");
        }
        // And the listing loads back (an operator's save and restore).
        crate::support::nft_relist(&listing).unwrap_or_else(|e| panic!("{family}: {e}"));
    }
}

fn arb_nft_rule(v4: bool) -> impl Strategy<Value = nft::Rule> {
    let field = prop_oneof![Just(AddressField::Source), Just(AddressField::Destination)];
    (
        proptest::collection::vec(
            prop_oneof![
                (field.clone(), any::<bool>(), arb_cidr(v4)).prop_map(|(field, negate, cidr)| nft::Match::Address {
                    field,
                    negate,
                    cidr
                }),
                (any::<bool>(), arb_protocol())
                    .prop_map(|(negate, protocol)| nft::Match::Protocol { negate, protocol }),
                (any::<bool>(), any::<u16>()).prop_map(|(negate, port)| nft::Match::DestinationPort { negate, port }),
                (any::<bool>(), "[a-z][a-z0-9]{0,14}", any::<bool>())
                    .prop_map(|(negate, name, prefix)| nft::Match::InInterface { negate, name, prefix }),
                (field, any::<bool>()).prop_map(|(field, negate)| nft::Match::FibLocal { field, negate }),
                (any::<bool>(), (1u8..32)).prop_map(|(negate, bits)| {
                    let all = [
                        CtStates::INVALID,
                        CtStates::NEW,
                        CtStates::ESTABLISHED,
                        CtStates::RELATED,
                        CtStates::UNTRACKED,
                    ];
                    let states = all
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| bits & (1 << i) != 0)
                        .fold(CtStates::empty(), |a, (_, s)| a | *s);
                    nft::Match::CtState { negate, states }
                }),
                (any::<bool>(), any::<u32>(), any::<u32>()).prop_map(|(negate, value, mask)| nft::Match::Mark {
                    negate,
                    value: value & mask,
                    mask
                }),
            ],
            0..5,
        ),
        proptest::collection::vec(prop_oneof![Just(Statement::Counter), Just(Statement::MasqueradeMark)], 0..2),
        prop_oneof![
            Just(Verdict::Continue),
            Just(Verdict::Accept),
            Just(Verdict::Drop),
            Just(Verdict::Return),
            Just(Verdict::Jump("q".into())),
            Just(Verdict::Goto("q".into())),
        ],
        proptest::option::of("[ -!#-\\[\\]-~]{1,60}"),
    )
        .prop_map(|(matches, statements, verdict, comment)| nft::Rule {
            chain: "p".into(),
            matches,
            statements,
            verdict,
            comment,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_nftables_rules_read_back_from_the_kernel(
        v4 in proptest::collection::vec(arb_nft_rule(true), 1..12),
        v6 in proptest::collection::vec(arb_nft_rule(false), 1..12),
        ports in proptest::collection::btree_set((arb_protocol(), any::<u16>()), 0..20),
    ) {
        let Some((_lab, ns)) = lab("random_nftables_rules_read_back_from_the_kernel") else { return Ok(()) };
        for (family, rules) in [(IpFamily::V4, v4), (IpFamily::V6, v6)] {
            let s = settings(family, ProxyMode::Nftables);
            let mut tx = nft::Transaction { ops: vec![Op::AddChain("p".into()), Op::AddChain("q".into())] };
            tx.push(Op::AddSet(SetDecl { name: "ports".into(), key: vec![KeyType::Protocol, KeyType::Port], data: None, interval: false, timeout_seconds: None, comment: None }));
            tx.ops.extend(rules.into_iter().map(Op::AddRule));
            let mut w = ElementWriter::new(family, SetRef::Own("ports".into()));
            for (p, port) in &ports {
                w.protocol(*p).word(u32::from(*port));
            }
            if !w.is_empty() {
                tx.push(Op::AddElements(w.finish()));
            }
            nftables_roundtrip(&ns, &s, &tx).map_err(TestCaseError::fail)?;
        }
    }
}

/// The codec without a kernel: each rule's NEWRULE message read back as a
/// dump would give it.
#[test]
fn encoded_rules_decode_to_themselves() {
    for family in [IpFamily::V4, IpFamily::V6] {
        let s = settings(family, ProxyMode::Nftables);
        let mut ops = nft_frame(&s, &Cluster::default());
        ops.extend(every_nftables_variant(family).ops);
        for op in ops {
            let Op::AddRule(rule) = op else { continue };
            let msg = encode::add_rule(family, s.masquerade_mark(), &rule).unwrap();
            let (chain, back) = decode::rule(family, s.masquerade_mark(), &msg.attrs.buf);
            assert_eq!(chain, rule.chain);
            assert_eq!(back.unwrap_or_else(|e| panic!("{rule:?}: {e}")), nft_normal(&rule));
        }
    }
}

/// iptables text without a kernel: the renderer's output reads back.
#[test]
fn rendered_iptables_rules_parse_to_themselves() {
    for family in [IpFamily::V4, IpFamily::V6] {
        let s = settings(family, ProxyMode::Iptables);
        let d: Dialect = dialect(&s);
        let rs = every_iptables_variant(family);
        let (text, _) = payload(&ipt_frame(&s), &rs, &[], d, None);
        let dump = kpx::kernel::iptables::parse::parse_dump(&text, d);
        for r in &rs.rules {
            assert!(dump.rules(r.table, &r.chain).any(|x| *x == normalize(r, d)), "{r:?} not read back from\n{text}");
        }
    }
}
