//! Typed rules to iptables-restore text: the one place kpx writes iptables
//! syntax. Every value is the host's own rendering of a checked typed
//! value (names from a closed alphabet, comments sanitized and quoted,
//! numbers printed here), in the form iptables-save prints back, so that
//! what the kernel holds reads back as the same typed rule (parse.rs).

use std::fmt::Write;
use std::net::IpAddr;

use kpx_rules::model::{IpFamily, Protocol};
use kpx_rules::ops::iptables::{HashTuple, Match, Rule, Table, Target};
use kpx_rules::ops::push_sanitized_comment;

use super::frame::Frame;

/// The longest comment iptables keeps (XT_MAX_COMMENT_LEN - 1).
pub const MAX_COMMENT: usize = 255;

/// What one family's rendering depends on.
#[derive(Debug, Clone, Copy)]
pub struct Dialect {
    pub family: IpFamily,
    /// The masquerade mark (hash-mark targets keep it; hash slots sit below it).
    pub masquerade_mark: u32,
}

impl Dialect {
    fn slot_mask(&self) -> u32 {
        self.masquerade_mark - 1
    }
}

/// `--probability` as iptables-save prints it (`%.11f` of units / 2^31).
pub fn probability_text(units: u32) -> String {
    format!("{:.11}", f64::from(units) / f64::from(1u32 << 31))
}

fn render_match(out: &mut String, m: &Match, protocol: Option<Protocol>, d: Dialect) {
    let not = |negate: bool| if negate { "! " } else { "" };
    match m {
        Match::Source(a) => {
            let _ = write!(out, " {}-s {}", not(a.negate), a.cidr);
        }
        Match::Destination(a) => {
            let _ = write!(out, " {}-d {}", not(a.negate), a.cidr);
        }
        Match::InInterface(i) => {
            let _ = write!(out, " {}-i {}{}", not(i.negate), i.name, if i.prefix { "+" } else { "" });
        }
        Match::Protocol(p) => {
            let _ = write!(out, " -p {p}");
        }
        Match::DestinationPort(port) => {
            // The validator makes sure the rule has a protocol.
            let p = protocol.map_or("tcp", Protocol::as_str);
            let _ = write!(out, " -m {p} --dport {port}");
        }
        Match::SourceTypeLocal { negate } => {
            let _ = write!(out, " -m addrtype {}--src-type LOCAL", not(*negate));
        }
        Match::DestinationTypeLocal { negate } => {
            let _ = write!(out, " -m addrtype {}--dst-type LOCAL", not(*negate));
        }
        Match::Conntrack { negate, states } => {
            let _ = write!(out, " -m conntrack {}--ctstate {states}", not(*negate));
        }
        Match::Mark { negate, value, mask } => render_mark(out, *negate, *value, *mask),
        Match::HashSlot(slot) => render_mark(out, false, *slot, d.slot_mask()),
        Match::StatisticRandom(p) => {
            let _ = write!(out, " -m statistic --mode random --probability {}", probability_text(*p));
        }
        Match::StatisticNth { every, packet } => {
            let _ = write!(out, " -m statistic --mode nth --every {every} --packet {packet}");
        }
        // iptables-save prints the node as a mask; iptables-restore takes a
        // mask only up to 32, so kpx writes the node.
        Match::ClusterHash { total, node, seed } => {
            let _ = write!(
                out,
                " -m cluster --cluster-local-node {node} --cluster-total-nodes {total} --cluster-hash-seed {seed:#010x}"
            );
        }
        Match::RecentCheck { name, seconds, reap } => {
            let reap = if *reap { " --reap" } else { "" };
            let _ = write!(out, " -m recent --rcheck --seconds {seconds}{reap} --name {name}");
        }
        Match::RecentSet { name } => {
            let _ = write!(out, " -m recent --set --name {name}");
        }
        Match::Comment(text) => {
            out.push_str(" -m comment --comment \"");
            push_sanitized_comment(out, text, MAX_COMMENT);
            out.push('"');
        }
        // Set names are the host's own constants (kernel::ipvs::sets).
        Match::Set { negate, name, dirs } => {
            let _ = write!(out, " -m set {}--match-set {name} ", not(*negate));
            for (i, dir) in dirs.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(dir.as_str());
            }
        }
        Match::PhysdevIsIn { negate } => {
            let _ = write!(out, " -m physdev {}--physdev-is-in", not(*negate));
        }
        // The names are the host's own constants (kernel::nfacct).
        Match::Nfacct(name) => {
            let _ = write!(out, " -m nfacct --nfacct-name {name}");
        }
        Match::ConntrackOriginalDestination(cidr) => {
            let _ = write!(out, " -m conntrack --ctorigdst {cidr}");
        }
        // libxt_ipvs prints the protocol as a number, then the address
        // with its mask, then the port.
        Match::IpvsVirtual { address, protocol, port } => {
            let number = match protocol {
                Protocol::Tcp => 6,
                Protocol::Udp => 17,
                Protocol::Sctp => 132,
            };
            let _ = write!(
                out,
                " -m ipvs --vproto {number} --vaddr {} --vport {port}",
                kpx_rules::model::Cidr::host(*address)
            );
        }
    }
}

fn render_mark(out: &mut String, negate: bool, value: u32, mask: u32) {
    let not = if negate { "! " } else { "" };
    if mask == u32::MAX {
        let _ = write!(out, " -m mark {not}--mark {value:#x}");
    } else {
        let _ = write!(out, " -m mark {not}--mark {value:#x}/{mask:#x}");
    }
}

/// The `-j`/`-g` part of a rule (not for hash-mark, which is two rules).
fn render_target(out: &mut String, target: &Target, d: Dialect) {
    match target {
        Target::None => {}
        Target::Accept => out.push_str(" -j ACCEPT"),
        Target::Drop => out.push_str(" -j DROP"),
        Target::Return => out.push_str(" -j RETURN"),
        Target::Reject => {
            let with = match d.family {
                IpFamily::V4 => "icmp-port-unreachable",
                IpFamily::V6 => "icmp6-port-unreachable",
            };
            let _ = write!(out, " -j REJECT --reject-with {with}");
        }
        Target::Jump(chain) | Target::HostJump(chain) => {
            let _ = write!(out, " -j {chain}");
        }
        Target::Goto(chain) => {
            let _ = write!(out, " -g {chain}");
        }
        Target::MarkForMasquerade => {
            let _ = write!(out, " -j {}", kpx_rules::ops::iptables::MARK_MASQ_CHAIN);
        }
        Target::Dnat(IpAddr::V4(ip), port) => {
            let _ = write!(out, " -j DNAT --to-destination {ip}:{port}");
        }
        Target::Dnat(IpAddr::V6(ip), port) => {
            let _ = write!(out, " -j DNAT --to-destination [{ip}]:{port}");
        }
        Target::Masquerade { random_fully } => {
            out.push_str(if *random_fully { " -j MASQUERADE --random-fully" } else { " -j MASQUERADE" });
        }
        Target::SetMark { value, mask } => {
            let _ = write!(out, " -j MARK --set-xmark {value:#x}/{mask:#x}");
        }
        Target::Redirect(port) => {
            let _ = write!(out, " -j REDIRECT --to-ports {port}");
        }
        Target::HashMark(_) => unreachable!("hash-mark targets are rendered as two rules"),
    }
}

/// The rule's lines (`-A CHAIN ...`), one for every target but hash-mark,
/// which becomes two: one for packets that carry the masquerade mark (the
/// slot is offset by it, so it stays set) and one for the others.
pub fn rule_lines(rule: &Rule, d: Dialect) -> Vec<String> {
    let mut text = String::new();
    write_rule(&mut text, rule, d);
    text.lines().map(str::to_string).collect()
}

/// [`rule_lines`], each line appended to `out` with its newline.
pub fn write_rule(out: &mut String, rule: &Rule, d: Dialect) {
    let protocol = rule.protocol();
    let masq = d.masquerade_mark;
    let Target::HashMark(h) = &rule.target else {
        out.push_str("-A ");
        out.push_str(&rule.chain);
        for m in &rule.matches {
            render_match(out, m, protocol, d);
        }
        render_target(out, &rule.target, d);
        out.push('\n');
        return;
    };
    let prefix = match (h.tuple, d.family) {
        (HashTuple::Source, IpFamily::V4) => "--hmark-src-prefix 32",
        (HashTuple::Source, IpFamily::V6) => "--hmark-src-prefix 128",
        (HashTuple::Destination, IpFamily::V4) => "--hmark-dst-prefix 32",
        (HashTuple::Destination, IpFamily::V6) => "--hmark-dst-prefix 128",
    };
    for (negate, offset) in [(false, masq), (true, 0)] {
        out.push_str("-A ");
        out.push_str(&rule.chain);
        for m in &rule.matches {
            render_match(out, m, protocol, d);
        }
        render_mark(out, negate, masq, masq);
        let _ = writeln!(
            out,
            " -j HMARK {prefix} --hmark-rnd {:#010x} --hmark-mod {} --hmark-offset {offset}",
            h.seed, h.modulus
        );
    }
}

/// The jump rule's arguments for `iptables -C/-I/-D` (after `-A CHAIN`).
pub fn rule_args(rule: &Rule, d: Dialect) -> Vec<String> {
    line_args(&rule_lines(rule, d).remove(0))
}

/// One of [`rule_lines`] as arguments for `iptables -C/-I/-D` (the words
/// after `-A CHAIN`).
pub fn line_args(line: &str) -> Vec<String> {
    super::parse::split_words(line).into_iter().skip(2).collect()
}

/// What the host's chains held after the last write: each one's rule
/// lines as written (`-A CHAIN ...`), by table and chain.
pub type HostChains = std::collections::HashMap<(Table, &'static str), Vec<String>>;

/// The whole iptables-restore payload of a sync: the frame's chains and
/// rules around the plugin's, then deletions (the plugin's, and stale own
/// chains the host found in the kernel), and what the host's chains hold
/// after it.
///
/// With `previous` (what the host's chains held after the last write, on
/// a partial sync), a host chain is not flushed: an unchanged one is left
/// alone, a changed one is edited in place, its differing middle deleted
/// (`-D CHAIN rule`) and inserted by position (`-I CHAIN N rule`). One
/// Service's change then rewrites its own rules, not a 10,000-rule
/// KUBE-SERVICES, and the other rules keep their counters. If the kernel
/// no longer holds what `previous` says, a deletion fails and the whole
/// payload with it (iptables-restore commits all or nothing): the sync
/// fails and the next one is full.
pub fn payload(
    frame: &Frame,
    plugin: &kpx_rules::ops::iptables::Ruleset,
    stale: &[(Table, String)],
    d: Dialect,
    previous: Option<&HostChains>,
) -> (String, HostChains) {
    payload_keeping(frame, &Part::of(plugin), stale, d, previous, HostChains::new())
}

/// What a payload writes of a plugin's ruleset, borrowed from it: the
/// whole ruleset, or the part a sync's main run writes when others create,
/// refill or delete chains (kernel::iptables::split). Borrowed, so that a
/// split costs no copy of the rules it leaves in the main run.
#[derive(Debug, Default)]
pub struct Part<'r> {
    pub chains: Vec<&'r (Table, String)>,
    pub rules: Vec<&'r Rule>,
    pub delete_chains: Vec<&'r (Table, String)>,
}

impl<'r> Part<'r> {
    pub fn of(ruleset: &'r kpx_rules::ops::iptables::Ruleset) -> Part<'r> {
        Part {
            chains: ruleset.chains.iter().collect(),
            rules: ruleset.rules.iter().collect(),
            delete_chains: ruleset.delete_chains.iter().collect(),
        }
    }
}

/// [`payload`] of a partial sync that keeps some hooks: `kept` holds those
/// host chains' lines as the last write left them (moved out of
/// `previous`). They are not rendered, compared or written again, so a
/// kept 10,000-rule chain costs the sync nothing; what the host's chains
/// hold after it has them as they were.
pub fn payload_keeping(
    frame: &Frame,
    plugin: &Part,
    stale: &[(Table, String)],
    d: Dialect,
    previous: Option<&HostChains>,
    mut kept: HostChains,
) -> (String, HostChains) {
    let rules = || frame.rules.iter().chain(plugin.rules.iter().copied()).chain(&frame.trailing);
    // About 100 bytes a rule: one allocation instead of doubling to megabytes.
    let mut out = String::with_capacity(128 * (rules().count() + plugin.chains.len() + 8));
    let kept_chains: Vec<(Table, &'static str)> =
        frame.chains.iter().copied().filter(|key| kept.contains_key(key)).collect();
    let is_kept = |table: Table, chain: &str| kept_chains.iter().any(|&(t, c)| t == table && c == chain);
    let mut host = HostChains::new();
    for &(table, chain) in &frame.chains {
        host.insert((table, chain), kept.remove(&(table, chain)).unwrap_or_default());
    }
    let edited =
        |table: Table, chain: &str| is_kept(table, chain) || previous.is_some_and(|p| p.contains_key(&(table, chain)));
    for table in [Table::Filter, Table::Nat] {
        let _ = writeln!(out, "*{}", table.name());
        let of_table = |(t, _): &&(Table, String)| *t == table;
        let deleted = || plugin.delete_chains.iter().copied().chain(stale).filter(of_table);
        let mut seen = std::collections::HashSet::new();
        let declared = frame.chains.iter().filter(|&&(t, c)| t == table && !edited(t, c)).map(|(_, c)| *c);
        // Deleted chains are flushed by declaring them, then deleted.
        let declared =
            declared.chain(plugin.chains.iter().copied().chain(deleted()).filter(of_table).map(|(_, c)| c.as_str()));
        for chain in declared {
            if seen.insert(chain) {
                let _ = writeln!(out, ":{chain} - [0:0]");
            }
        }
        for rule in rules().filter(|r| r.table == table && !is_kept(table, &r.chain)) {
            let key = frame.chains.iter().copied().find(|&(t, c)| t == table && c == rule.chain);
            let Some(lines) = key.and_then(|k| host.get_mut(&k)) else {
                write_rule(&mut out, rule, d);
                continue;
            };
            let at = out.len();
            write_rule(&mut out, rule, d);
            lines.extend(out[at..].lines().map(str::to_string));
            if edited(table, &rule.chain) {
                out.truncate(at);
            }
        }
        for &(t, chain) in frame.chains.iter().filter(|&&(t, c)| t == table && !is_kept(t, c)) {
            if let Some(old) = previous.and_then(|p| p.get(&(t, chain))) {
                edit(&mut out, chain, old, &host[&(t, chain)]);
            }
        }
        let mut gone = std::collections::HashSet::new();
        for (_, chain) in deleted() {
            if gone.insert(chain.as_str()) {
                let _ = writeln!(out, "-X {chain}");
            }
        }
        out.push_str("COMMIT\n");
    }
    (out, host)
}

/// iptables-restore payloads, one per group of at most `per` chains, each
/// with a section per table that has some: `body` writes a group's lines
/// in a section.
fn grouped<'a, T: 'a>(
    items: &'a [T],
    per: usize,
    table_of: impl Fn(&T) -> Table,
    mut body: impl FnMut(&mut String, &T),
) -> Vec<String> {
    items
        .chunks(per.max(1))
        .map(|group| {
            let mut out = String::new();
            for table in [Table::Filter, Table::Nat] {
                let mut of_table = group.iter().filter(|i| table_of(i) == table).peekable();
                if of_table.peek().is_none() {
                    continue;
                }
                let _ = writeln!(out, "*{}", table.name());
                for item in of_table {
                    body(&mut out, item);
                }
                out.push_str("COMMIT\n");
            }
            out
        })
        .collect()
}

/// Payloads that create `chains` empty (own chains no rule refers to
/// yet), at most `per` a payload.
pub fn declare_payloads(chains: &[(Table, &str)], per: usize) -> Vec<String> {
    grouped(
        chains,
        per,
        |c| c.0,
        |out, (_, chain)| {
            let _ = writeln!(out, ":{chain} - [0:0]");
        },
    )
}

/// Payloads that append each chain's rules (chains that exist, empty):
/// at most `per` chains and `per` rules a payload, a long chain's rules
/// over several (each appends after the last).
pub fn fill_payloads(chains: &[((Table, &str), Vec<&Rule>)], per: usize, d: Dialect) -> Vec<String> {
    let per = per.max(1);
    // Runs of (chain, its rules from..to), within both budgets.
    type Part<'a, 'r> = ((Table, &'a str), &'a [&'r Rule]);
    let mut runs: Vec<Vec<Part>> = Vec::new();
    let (mut chains_in, mut rules_in) = (0, 0);
    for (chain, rules) in chains {
        let mut rest: &[&Rule] = rules;
        loop {
            if runs.is_empty() || chains_in == per || rules_in == per {
                runs.push(Vec::new());
                (chains_in, rules_in) = (0, 0);
            }
            let take = rest.len().min(per - rules_in);
            runs.last_mut().expect("a run").push((*chain, &rest[..take]));
            (chains_in, rules_in) = (chains_in + 1, rules_in + take);
            rest = &rest[take..];
            if rest.is_empty() {
                break;
            }
        }
    }
    runs.iter()
        .flat_map(|run| {
            grouped(
                run,
                usize::MAX,
                |c| c.0.0,
                |out, (_, rules)| {
                    for rule in *rules {
                        write_rule(out, rule, d);
                    }
                },
            )
        })
        .collect()
}

/// A chain and the rules it is filled with.
pub type ChainRules<'a, 'r> = ((Table, &'a str), Vec<&'r Rule>);

/// Payloads that flush each chain and fill it again, whole chains at a
/// time (a chain is never seen empty or half filled between runs): at
/// most `per` chains and, but for a longer chain alone, `per` rules a
/// payload.
pub fn refill_payloads(chains: &[ChainRules], per: usize, d: Dialect) -> Vec<String> {
    let per = per.max(1);
    let mut runs: Vec<&[ChainRules]> = Vec::new();
    let (mut from, mut rules_in) = (0, 0);
    for (i, (_, rules)) in chains.iter().enumerate() {
        if i > from && (i - from == per || rules_in + rules.len() > per) {
            runs.push(&chains[from..i]);
            (from, rules_in) = (i, 0);
        }
        rules_in += rules.len();
    }
    if from < chains.len() {
        runs.push(&chains[from..]);
    }
    runs.into_iter()
        .flat_map(|run| {
            let mut out = Vec::new();
            for table in [Table::Filter, Table::Nat] {
                let of_table: Vec<_> = run.iter().filter(|((t, _), _)| *t == table).collect();
                if of_table.is_empty() {
                    continue;
                }
                let mut text = format!("*{}\n", table.name());
                for ((_, chain), _) in &of_table {
                    let _ = writeln!(text, ":{chain} - [0:0]");
                }
                for (_, rules) in &of_table {
                    for rule in rules {
                        write_rule(&mut text, rule, d);
                    }
                }
                text.push_str("COMMIT\n");
                out.push(text);
            }
            out
        })
        .collect()
}

/// Payloads that delete `chains` (own chains no rule outside them refers
/// to any more): all are flushed first, then deleted, at most `per` a
/// payload, so that a jump between two of them never holds one up.
pub fn delete_payloads(chains: &[(Table, &str)], per: usize) -> Vec<String> {
    let mut out = declare_payloads(chains, per);
    out.extend(grouped(
        chains,
        per,
        |c| c.0,
        |out, (_, chain)| {
            let _ = writeln!(out, "-X {chain}");
        },
    ));
    out
}

/// The most lines an in-place edit of a host chain deletes and inserts;
/// past it the chain is written whole. iptables finds each `-D` rule and
/// `-I` position by walking the chain, so an edit costs about (lines
/// changed) x (chain length), where writing the chain whole costs its
/// length: a 16,000-rule KUBE-SERVICES edited throughout took 4.2 s of
/// kernel time against well under one written whole (issue 40).
pub const MAX_EDIT_LINES: usize = 256;

/// Turns `chain`'s `old` lines into `new` in place: the middle between
/// their common start and end deleted by their whole text (a rule that is
/// not there fails the payload; a number could hit someone else's rule),
/// then the new middle inserted by rule number. When that middle is more
/// than [`MAX_EDIT_LINES`], the chain is flushed and written whole
/// instead (its rules' counters start again, as on a full sync).
fn edit(out: &mut String, chain: &str, old: &[String], new: &[String]) {
    let start = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let end = old[start..].iter().rev().zip(new[start..].iter().rev()).take_while(|(a, b)| a == b).count();
    if (old.len() - start - end) + (new.len() - start - end) > MAX_EDIT_LINES {
        let _ = writeln!(out, "-F {chain}");
        for l in new {
            let _ = writeln!(out, "{l}");
        }
        return;
    }
    let prefix = format!("-A {chain} ");
    for l in &old[start..old.len() - end] {
        let _ = writeln!(out, "-D {chain} {}", l.strip_prefix(&prefix).unwrap_or(l));
    }
    for (i, l) in new[start..new.len() - end].iter().enumerate() {
        let _ = writeln!(out, "-I {chain} {} {}", start + 1 + i, l.strip_prefix(&prefix).unwrap_or(l));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::ops::iptables::{AddressMatch, HashMark, Hook};

    fn d4() -> Dialect {
        Dialect { family: IpFamily::V4, masquerade_mark: 0x4000 }
    }

    #[test]
    fn renders_as_iptables_save_prints() {
        let rule = Rule::hook(Hook::NatServices)
            .with(Match::comment("ns1/svc1:p80 cluster IP"))
            .with(Match::Protocol(Protocol::Tcp))
            .with(Match::destination_ip("172.30.0.41".parse().unwrap()))
            .with(Match::DestinationPort(80))
            .jump("KUBE-SVC-XPGD46QRK7WJZT7O");
        assert_eq!(
            rule_lines(&rule, d4()),
            [
                "-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O"
            ]
        );
    }

    #[test]
    fn comments_cannot_break_out_of_their_quotes() {
        let rule = Rule::chain(Table::Nat, "KUBE-SEP-A")
            .with(Match::comment("x\" -j ACCEPT\n-A INPUT -j DROP\\"))
            .target(Target::Return);
        assert_eq!(
            rule_lines(&rule, d4()),
            ["-A KUBE-SEP-A -m comment --comment \"x_ -j ACCEPT_-A INPUT -j DROP_\" -j RETURN"]
        );
    }

    #[test]
    fn hash_mark_keeps_the_masquerade_bit() {
        let rule = Rule::chain(Table::Nat, "KUBE-SVC-A")
            .with(Match::Source(AddressMatch { negate: false, cidr: "10.0.0.0/8".parse().unwrap() }))
            .target(Target::HashMark(HashMark { tuple: HashTuple::Source, modulus: 7, seed: 0xdeadbeef }));
        assert_eq!(
            rule_lines(&rule, d4()),
            [
                "-A KUBE-SVC-A -s 10.0.0.0/8 -m mark --mark 0x4000/0x4000 -j HMARK --hmark-src-prefix 32 --hmark-rnd 0xdeadbeef --hmark-mod 7 --hmark-offset 16384",
                "-A KUBE-SVC-A -s 10.0.0.0/8 -m mark ! --mark 0x4000/0x4000 -j HMARK --hmark-src-prefix 32 --hmark-rnd 0xdeadbeef --hmark-mod 7 --hmark-offset 0",
            ]
        );
        let slot = Rule::chain(Table::Nat, "KUBE-SVC-A").with(Match::HashSlot(3)).jump("KUBE-SEP-B");
        assert_eq!(rule_lines(&slot, d4()), ["-A KUBE-SVC-A -m mark --mark 0x3/0x3fff -j KUBE-SEP-B"]);
    }

    fn services(ips: &[&str]) -> kpx_rules::ops::iptables::Ruleset {
        let mut rs = kpx_rules::ops::iptables::Ruleset::default();
        for ip in ips {
            rs.push(
                Rule::hook(Hook::NatServices)
                    .with(Match::Protocol(Protocol::Tcp))
                    .with(Match::destination_ip(ip.parse().unwrap()))
                    .with(Match::DestinationPort(80))
                    .jump("KUBE-SVC-A"),
            );
        }
        rs
    }

    #[test]
    fn partial_payloads_edit_the_host_chains_in_place() {
        let frame = Frame {
            chains: vec![(Table::Nat, "KUBE-SERVICES"), (Table::Nat, "KUBE-NODEPORTS")],
            rules: Vec::new(),
            trailing: vec![Rule::hook(Hook::NatServices).jump("KUBE-NODEPORTS")],
            jumps: Vec::new(),
        };
        let (whole, host) = payload(&frame, &services(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]), &[], d4(), None);
        assert!(whole.contains(":KUBE-SERVICES - [0:0]\n") && whole.contains(":KUBE-NODEPORTS - [0:0]\n"), "{whole}");
        assert_eq!(host[&(Table::Nat, "KUBE-SERVICES")].len(), 4);

        // Unchanged: neither flushed nor written.
        let (same, _) = payload(&frame, &services(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]), &[], d4(), Some(&host));
        assert_eq!(same, "*filter\nCOMMIT\n*nat\nCOMMIT\n");

        // The middle rule replaced, one added before the trailing jump.
        let (edit, after) =
            payload(&frame, &services(&["10.0.0.1", "10.0.0.9", "10.0.0.3", "10.0.0.4"]), &[], d4(), Some(&host));
        let nat = edit.split("*nat\n").nth(1).unwrap();
        assert_eq!(
            nat,
            // The common start is one rule, the common end the jump.
            "-D KUBE-SERVICES -d 10.0.0.2/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A\n\
             -D KUBE-SERVICES -d 10.0.0.3/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A\n\
             -I KUBE-SERVICES 2 -d 10.0.0.9/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A\n\
             -I KUBE-SERVICES 3 -d 10.0.0.3/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A\n\
             -I KUBE-SERVICES 4 -d 10.0.0.4/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A\n\
             COMMIT\n"
        );
        let whole_after =
            payload(&frame, &services(&["10.0.0.1", "10.0.0.9", "10.0.0.3", "10.0.0.4"]), &[], d4(), None).1;
        assert_eq!(after, whole_after, "the edit leaves what a whole write would");
    }

    /// A host chain changed throughout is flushed and written whole,
    /// not edited rule by rule (each `-D`/`-I` walks the chain).
    #[test]
    fn a_chain_changed_throughout_is_written_whole() {
        let frame = Frame {
            chains: vec![(Table::Nat, "KUBE-SERVICES"), (Table::Nat, "KUBE-NODEPORTS")],
            rules: Vec::new(),
            trailing: vec![Rule::hook(Hook::NatServices).jump("KUBE-NODEPORTS")],
            jumps: Vec::new(),
        };
        let n = MAX_EDIT_LINES + 1;
        let ips: Vec<String> = (0..n).map(|i| format!("10.0.{}.{}", i / 250, i % 250 + 1)).collect();
        let moved: Vec<String> = (0..n).map(|i| format!("10.1.{}.{}", i / 250, i % 250 + 1)).collect();
        let before: Vec<&str> = ips.iter().map(String::as_str).collect();
        let after: Vec<&str> = moved.iter().map(String::as_str).collect();
        let (_, previous) = payload(&frame, &services(&before), &[], d4(), None);
        let (text, host) = payload(&frame, &services(&after), &[], d4(), Some(&previous));
        let nat = text.split("*nat\n").nth(1).unwrap();
        assert!(nat.starts_with("-F KUBE-SERVICES\n"), "flushed first");
        assert!(!nat.contains("-D ") && !nat.contains("-I "), "not edited");
        // What it writes is the chain whole, as the lines it then holds.
        let written: Vec<&str> = nat.lines().filter(|l| l.starts_with("-A KUBE-SERVICES ")).collect();
        assert_eq!(written, host[&(Table::Nat, "KUBE-SERVICES")].iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(written.len(), n + 1);
        // A few changes are still an edit.
        let mut few = before.clone();
        few[3] = "10.9.9.9";
        let (text, _) = payload(&frame, &services(&few), &[], d4(), Some(&previous));
        assert!(!text.contains("-F KUBE-SERVICES") && text.contains("-D KUBE-SERVICES"), "{text}");
    }

    #[test]
    fn probabilities_print_like_iptables_save() {
        assert_eq!(probability_text(kpx_rules::ops::probability_one_in(3)), "0.33333333349");
        assert_eq!(probability_text(1 << 30), "0.50000000000");
    }
}
