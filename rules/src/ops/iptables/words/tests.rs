use super::*;

const LIMIT: usize = 256 << 20;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn ip(family: IpFamily, n: u8) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0x1234, u16::from(n))),
    }
}

fn host(family: IpFamily) -> u8 {
    if family == IpFamily::V4 { 32 } else { 128 }
}

/// Every match and target the contract has, in a few rules.
fn every_variant(family: IpFamily) -> Ruleset {
    let cidr = |n, prefix_len| Cidr { addr: ip(family, n), prefix_len };
    let mut rs = Ruleset::default();
    rs.declare(Table::Nat, "KUBE-SVC-ABCDEFGHIJKLMNOP");
    rs.declare(Table::Filter, "KUBE-FW-ABCDEFGHIJKLMNOP");
    rs.delete(Table::Nat, "KUBE-SEP-OLDOLDOLDOLDOLDO");
    rs.kept_hooks = vec![Hook::FilterNodePorts, Hook::FilterFirewall];
    rs.push(
        Rule::hook(Hook::NatServices)
            .with(Match::comment("ns/svc:p80 cluster IP"))
            .with(Match::Protocol(Protocol::Tcp))
            .with(Match::Destination(AddressMatch { negate: false, cidr: cidr(1, host(family)) }))
            .with(Match::DestinationPort(80))
            .jump("KUBE-SVC-ABCDEFGHIJKLMNOP"),
    );
    rs.push(
        Rule::chain(Table::Nat, "KUBE-SVC-ABCDEFGHIJKLMNOP")
            .with(Match::Source(AddressMatch { negate: true, cidr: cidr(0, 8) }))
            .with(Match::InInterface(InterfaceMatch { negate: true, name: "cbr0".into(), prefix: true }))
            .with(Match::SourceTypeLocal { negate: false })
            .with(Match::DestinationTypeLocal { negate: true })
            .target(Target::MarkForMasquerade),
    );
    rs.push(
        Rule::chain(Table::Nat, "KUBE-SVC-ABCDEFGHIJKLMNOP")
            .with(Match::StatisticRandom(1 << 30))
            .with(Match::StatisticNth { every: 3, packet: 2 })
            .with(Match::RecentCheck { name: "KUBE-SEP-ABCDEFGHIJKLMNOP".into(), seconds: 10800, reap: true })
            .target(Target::Goto("KUBE-SEP-ABCDEFGHIJKLMNOP".into())),
    );
    rs.push(
        Rule::chain(Table::Nat, "KUBE-SEP-ABCDEFGHIJKLMNOP")
            .with(Match::Protocol(Protocol::Sctp))
            .with(Match::RecentSet { name: "KUBE-SEP-ABCDEFGHIJKLMNOP".into() })
            .target(Target::Dnat(ip(family, 9), 8080)),
    );
    rs.push(
        Rule::chain(Table::Nat, "KUBE-SEP-ABCDEFGHIJKLMNOP")
            .with(Match::ClusterHash { total: 32, node: 7, seed: 0xdead_beef })
            .with(Match::HashSlot(5))
            .target(Target::HashMark(HashMark { tuple: HashTuple::Destination, modulus: 64, seed: 9 })),
    );
    rs.push(
        Rule::chain(Table::Filter, "KUBE-FW-ABCDEFGHIJKLMNOP")
            .with(Match::Conntrack { negate: true, states: CtStates::NEW | CtStates::DNAT })
            .with(Match::Mark { negate: true, value: 0x4000, mask: 0x4000 })
            .with(Match::Protocol(Protocol::Udp))
            .target(Target::Accept),
    );
    for target in [Target::None, Target::Drop, Target::Reject, Target::Return] {
        rs.push(Rule::hook(Hook::FilterServices).target(target));
    }
    rs.push(Rule::hook(Hook::NatNodePorts).jump("KUBE-EXT-ABCDEFGHIJKLMNOP"));
    rs.push(Rule::hook(Hook::FilterExternalServices).target(Target::Drop));
    rs
}

fn canonical(mut rs: Ruleset) -> Ruleset {
    rs.rules = rs.rules.into_iter().map(Rule::canonical).collect();
    rs
}

#[test]
fn words_decode_to_the_ruleset_they_were_encoded_from() {
    for family in [IpFamily::V4, IpFamily::V6] {
        let rs = every_variant(family);
        let w = encode(family, &rs).unwrap();
        assert_eq!(decode(&w, LIMIT).unwrap(), canonical(rs), "{family:?}");
    }
    let empty = encode(IpFamily::V4, &Ruleset::default()).unwrap();
    assert_eq!(decode(&empty, LIMIT).unwrap(), Ruleset::default());
}

#[test]
fn a_chain_is_written_once_for_its_rules() {
    let mut rs = Ruleset::default();
    for _ in 0..3 {
        rs.push(Rule::chain(Table::Nat, "KUBE-SVC-X").target(Target::Return));
    }
    rs.push(Rule::chain(Table::Filter, "KUBE-SVC-X").target(Target::Return));
    let w = encode(IpFamily::V4, &rs).unwrap();
    assert_eq!(w.text, "KUBE-SVC-XKUBE-SVC-X", "one for nat's three rules, one for filter's");
    assert_eq!(decode(&w, LIMIT).unwrap(), rs);
}

#[test]
fn what_the_contract_cannot_say_is_not_encoded() {
    let v4 = |r: Rule| {
        let mut rs = Ruleset::default();
        rs.push(r);
        encode(IpFamily::V4, &rs).unwrap_err().to_string()
    };
    let rule = || Rule::chain(Table::Nat, "KUBE-SEP-X");
    assert!(v4(rule().target(Target::Masquerade { random_fully: true })).contains("host only"));
    assert!(v4(rule().target(Target::HostJump("KUBE-MARK-MASQ".into()))).contains("host only"));
    assert!(v4(rule().with(Match::PhysdevIsIn { negate: false })).contains("host only"));
    let six = ip(IpFamily::V6, 1);
    assert!(v4(rule().target(Target::Dnat(six, 80))).contains("not of the ruleset's family"));
    assert!(v4(rule().with(Match::destination_ip(six))).contains("not of the ruleset's family"));
    assert!(v4(rule().with(Match::comment("x".repeat(MAX_STRING + 1)))).contains("at most 1024"));
    let many = rule().with_all((0..=MAX_MATCHES).map(|i| Match::HashSlot(i as u32)));
    assert!(v4(many).contains("256 matches (at most 255)"));
}

/// The words of one rule in chain KUBE-SEP-X (string 0) of nat, whose
/// words after the chain are `rest`; strings: 0 the chain, 1 "cbr0".
fn one_rule(rest: &[u32]) -> RuleWords {
    let mut words = vec![chain::OWN_NAT, 0];
    words.extend_from_slice(rest);
    RuleWords {
        family: IpFamily::V4,
        text: "KUBE-SEP-Xcbr0".into(),
        text_ends: vec![10, 14],
        chains: vec![],
        delete_chains: vec![],
        kept_hooks: vec![],
        rule_ends: vec![words.len() as u32],
        words,
    }
}

fn refused(w: &RuleWords) -> String {
    decode(w, LIMIT).expect_err("refused").to_string()
}

#[test]
fn malformed_words_are_refused_with_the_rule_and_word_named() {
    use matches::*;
    use target::*;
    let cases: Vec<(Vec<u32>, &str)> = vec![
        (vec![99], "rule 0, word 2: the target 99 (at most 9)"),
        (vec![ACCEPT, 16], "word 3: the match 16 (at most 15)"),
        (vec![ACCEPT, SOURCE_TYPE_LOCAL, 2], "word 4: negate 2 (at most 1)"),
        (vec![ACCEPT, DESTINATION_PORT, 65536], "the port 65536 (at most 65535)"),
        (vec![ACCEPT, PROTOCOL, 3], "the protocol 3 (at most 2)"),
        (vec![ACCEPT, SOURCE, 0, 33, 1], "the prefix length 33 (at most 32)"),
        (vec![ACCEPT, SOURCE, 0, 32], "word 6: the rule ends where the address should be"),
        (vec![ACCEPT, COMMENT], "the rule ends where the comment should be"),
        (vec![ACCEPT, COMMENT, 2], "the comment: no string 2"),
        (vec![JUMP, u32::MAX], "the jump's chain: no string 4294967295"),
        (vec![DNAT, 1], "the rule ends where the DNAT port should be"),
        (vec![DNAT, 1, 70000], "the DNAT port 70000 (at most 65535)"),
        (vec![HASH_MARK, 2, 1, 1], "the hash tuple 2 (at most 1)"),
        (vec![ACCEPT, CONNTRACK, 0, 0x80], "the states 128 (at most 127)"),
        (vec![ACCEPT, CLUSTER_HASH, 256, 1, 1], "the total 256 (at most 255)"),
        (vec![ACCEPT, IN_INTERFACE, 0, 3, 1], "prefix 3 (at most 1)"),
    ];
    for (rest, want) in cases {
        let got = refused(&one_rule(&rest));
        assert!(got.contains(want), "{rest:?}: {got}");
    }

    let mut w = one_rule(&[ACCEPT]);
    w.words[0] = 8;
    assert!(refused(&w).contains("the chain 8 (at most 7)"));
    let mut w = one_rule(&[ACCEPT]);
    w.family = IpFamily::V6;
    w.words.extend([DESTINATION_PORT]);
    w.rule_ends = vec![w.words.len() as u32];
    assert!(refused(&w).contains("the rule ends where the port should be"));
    let mut w = one_rule(&[ACCEPT]);
    w.words.extend([0; 3]);
    assert!(refused(&w).contains("words[3]: 3 words after the last rule"), "{}", refused(&w));
    let mut w = one_rule(&[ACCEPT]);
    w.rule_ends = vec![3, 2];
    assert!(refused(&w).contains("rule-ends[1]: 2 is outside 3..=3"), "{}", refused(&w));
    let mut w = one_rule(&[ACCEPT]);
    w.rule_ends = vec![99];
    assert!(refused(&w).contains("rule-ends[0]: 99 is outside"));
    let many: Vec<u32> = std::iter::once(ACCEPT).chain((0..=MAX_MATCHES).flat_map(|_| [HASH_SLOT, 0])).collect();
    assert!(refused(&one_rule(&many)).contains("more than 255 matches"));

    // The strings.
    let mut w = one_rule(&[ACCEPT]);
    w.text_ends = vec![14, 10];
    assert!(refused(&w).contains("text-ends[1]: 10 is before the previous end 14"));
    let mut w = one_rule(&[ACCEPT]);
    w.text_ends = vec![10, 15];
    assert!(refused(&w).contains("text-ends[1]: 15 is past the text or inside a character"));
    let mut w = one_rule(&[ACCEPT]);
    w.text = "KUBE-SEP-Xcbré".into();
    w.text_ends = vec![10, 14];
    assert!(refused(&w).contains("inside a character"));
    let mut w = one_rule(&[ACCEPT]);
    w.text = "x".repeat(MAX_STRING + 1);
    w.text_ends = vec![MAX_STRING as u32 + 1];
    assert!(refused(&w).contains("a string of 1025 bytes (at most 1024)"));

    // The chains.
    let mut w = one_rule(&[ACCEPT]);
    w.chains = vec![TABLE_NAT];
    assert!(refused(&w).contains("chains[1]: an odd number of words"));
    let mut w = one_rule(&[ACCEPT]);
    w.delete_chains = vec![2, 0];
    assert!(refused(&w).contains("delete-chains[0]: table 2"));
    let mut w = one_rule(&[ACCEPT]);
    w.chains = vec![TABLE_FILTER, 7];
    assert!(refused(&w).contains("chains[0]: no string 7"));
}

#[test]
fn a_string_named_many_times_counts_each_time() {
    // One 1,000-byte comment named by 10,000 matches: 10 MB decoded from
    // 80 kB of words.
    let mut w = one_rule(&[]);
    w.text = "KUBE-SEP-X".to_string() + &"c".repeat(1000);
    w.text_ends = vec![10, 1010];
    let mut words = vec![chain::OWN_NAT, 0, target::ACCEPT];
    words.extend([matches::COMMENT, 1].repeat(250));
    w.rule_ends.clear();
    w.words.clear();
    for _ in 0..40 {
        w.words.extend_from_slice(&words);
        w.rule_ends.push(w.words.len() as u32);
    }
    assert!(decode(&w, 20 << 20).is_ok());
    let got = decode(&w, 5 << 20).unwrap_err().to_string();
    assert!(got.contains("decodes to more than the output limit"), "{got}");
}

/// A random ruleset of contract values (own chains, hooks, every match
/// and target).
fn random_ruleset(rng: &mut Rng, family: IpFamily) -> Ruleset {
    let names = ["KUBE-SVC-A", "KUBE-SEP-B", "KUBE-EXT-C", "KUBE-FW-D"];
    let name = |rng: &mut Rng| names[rng.below(4) as usize].to_string();
    let table = |rng: &mut Rng| if rng.below(2) == 0 { Table::Nat } else { Table::Filter };
    let flag = |rng: &mut Rng| rng.below(2) == 1;
    let mut rs = Ruleset::default();
    for _ in 0..rng.below(4) {
        let t = table(rng);
        rs.declare(t, &name(rng));
    }
    for _ in 0..rng.below(3) {
        let t = table(rng);
        rs.delete(t, &name(rng));
    }
    rs.kept_hooks = Hook::ALL.into_iter().filter(|_| rng.below(3) == 0).collect();
    for _ in 0..rng.below(12) {
        let mut rule = if rng.below(3) == 0 {
            Rule::hook(Hook::ALL[rng.below(6) as usize])
        } else {
            let t = table(rng);
            Rule::chain(t, &name(rng))
        };
        for _ in 0..rng.below(6) {
            let addr = AddressMatch {
                negate: flag(rng),
                cidr: Cidr {
                    addr: ip(family, rng.next() as u8),
                    prefix_len: (rng.below(u64::from(host(family))) + 1) as u8,
                },
            };
            rule = rule.with(match rng.below(16) {
                0 => Match::Source(addr),
                1 => Match::Destination(addr),
                2 => Match::Protocol([Protocol::Tcp, Protocol::Udp, Protocol::Sctp][rng.below(3) as usize]),
                3 => Match::DestinationPort(rng.next() as u16),
                4 => Match::InInterface(InterfaceMatch { negate: flag(rng), name: "eth0".into(), prefix: flag(rng) }),
                5 => Match::SourceTypeLocal { negate: flag(rng) },
                6 => Match::DestinationTypeLocal { negate: flag(rng) },
                7 => Match::Conntrack { negate: flag(rng), states: CtStates::from_bits(rng.next() as u8) },
                8 => Match::Mark { negate: flag(rng), value: rng.next() as u32, mask: rng.next() as u32 },
                9 => Match::StatisticRandom(rng.next() as u32),
                10 => Match::StatisticNth { every: rng.next() as u32, packet: rng.next() as u32 },
                11 => Match::RecentCheck { name: name(rng), seconds: rng.next() as u32, reap: flag(rng) },
                12 => Match::RecentSet { name: name(rng) },
                13 => Match::HashSlot(rng.next() as u32),
                14 => Match::ClusterHash { total: rng.next() as u8, node: rng.next() as u8, seed: rng.next() as u32 },
                _ => Match::comment(format!("comment {}", rng.below(1000))),
            });
        }
        rule = rule.target(match rng.below(10) {
            0 => Target::None,
            1 => Target::Accept,
            2 => Target::Drop,
            3 => Target::Reject,
            4 => Target::Return,
            5 => Target::Jump(name(rng)),
            6 => Target::Goto(name(rng)),
            7 => Target::MarkForMasquerade,
            8 => Target::Dnat(ip(family, rng.next() as u8), rng.next() as u16),
            _ => Target::HashMark(HashMark {
                tuple: if flag(rng) { HashTuple::Source } else { HashTuple::Destination },
                modulus: rng.next() as u32,
                seed: rng.next() as u32,
            }),
        });
        rs.push(rule);
    }
    rs
}

#[test]
fn random_rulesets_survive_the_round_trip() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for i in 0..5_000 {
        let family = if i % 2 == 0 { IpFamily::V4 } else { IpFamily::V6 };
        let rs = random_ruleset(&mut rng, family);
        let w = encode(family, &rs).unwrap();
        assert_eq!(decode(&w, LIMIT).unwrap(), canonical(rs.clone()), "{rs:#?}");
    }
}

#[test]
fn random_damage_never_panics_the_decoder() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for family in [IpFamily::V4, IpFamily::V6] {
        let good = encode(family, &every_variant(family)).unwrap();
        let mut decoded = 0;
        for _ in 0..40_000 {
            let mut w = good.clone();
            let value = match rng.below(4) {
                0 => 0,
                1 => u32::MAX,
                2 => rng.below(20) as u32,
                _ => rng.next() as u32,
            };
            let cut = rng.below(5) == 0;
            let columns: [&mut Vec<u32>; 5] =
                [&mut w.text_ends, &mut w.chains, &mut w.delete_chains, &mut w.rule_ends, &mut w.words];
            // Mostly the words themselves.
            let pick = if rng.below(2) == 0 { 4 } else { rng.below(6) as usize };
            match columns.into_iter().nth(pick) {
                Some(column) if cut => {
                    column.pop();
                }
                Some(column) if !column.is_empty() => {
                    let i = rng.below(column.len() as u64) as usize;
                    column[i] = value;
                }
                Some(_) => {}
                None => {
                    let at = rng.below(w.text.len() as u64 + 1) as usize;
                    w.text.truncate(at);
                }
            }
            if let Ok(rs) = decode(&w, LIMIT) {
                decoded += 1;
                // Whatever decodes encodes again to words that decode to it.
                let again = encode(family, &rs).unwrap();
                assert_eq!(decode(&again, LIMIT).unwrap(), rs);
            }
        }
        // Some damage leaves a valid ruleset (a port changed, say); most not.
        assert!((1000..39_000).contains(&decoded), "{family:?}: {decoded} of 40,000 decoded");
    }
}
