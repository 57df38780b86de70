//! Typed iptables rules as iptables-restore text: the one place kpx
//! writes iptables syntax, shared by the writers (kernel::iptables) and by
//! the wall, which quotes a rule it refuses (validate::iptables). Every
//! value is the host's own rendering of a checked typed value (names from
//! a closed alphabet, comments sanitized and quoted, numbers printed
//! here), in the form iptables-save prints back, so that what the kernel
//! holds reads back as the same typed rule (kernel::iptables::parse).

use std::fmt::Write;
use std::net::IpAddr;

use kpx_rules::model::{IpFamily, Protocol};
use kpx_rules::ops::iptables::{HashTuple, Match, Rule, Target};
use kpx_rules::ops::push_sanitized_comment;

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
    split_words(line).into_iter().skip(2).collect()
}

/// The words of an iptables-restore line: whitespace separates, double
/// quotes group (a backslash inside them escapes the next character), as
/// iptables-restore reads them.
pub fn split_words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let (mut quoted, mut has) = (false, false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                has = true;
            }
            '\\' if quoted => current.extend(chars.next()),
            c if c.is_whitespace() && !quoted => {
                if has {
                    out.push(std::mem::take(&mut current));
                    has = false;
                }
            }
            c => {
                current.push(c);
                has = true;
            }
        }
    }
    if has {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::ops::iptables::{AddressMatch, HashMark, Hook, Table};

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

    #[test]
    fn probabilities_print_like_iptables_save() {
        assert_eq!(probability_text(kpx_rules::ops::probability_one_in(3)), "0.33333333349");
        assert_eq!(probability_text(1 << 30), "0.50000000000");
    }

    #[test]
    fn splits_like_iptables_restore() {
        assert_eq!(
            split_words(r#"-A X -m comment --comment "a b" -j Y"#),
            ["-A", "X", "-m", "comment", "--comment", "a b", "-j", "Y"]
        );
        assert_eq!(split_words(r#"--comment "a\"b""#), ["--comment", "a\"b"]);
    }
}
