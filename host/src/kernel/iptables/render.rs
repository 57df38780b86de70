//! Typed rules to iptables-restore payloads: the frame's chains and rules
//! around the plugin's, the host's chains edited in place, and the
//! payloads that declare, fill, refill and delete chains in runs. Each
//! rule's text is [`crate::syntax::iptables`]'s, so that what the kernel
//! holds reads back as the same typed rule (parse.rs).

use std::fmt::Write;

use kpx_rules::ops::iptables::{Rule, Table};

use super::frame::Frame;
use crate::syntax::iptables::{Dialect, write_rule};

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
    use kpx_rules::model::{IpFamily, Protocol};
    use kpx_rules::ops::iptables::{Hook, Match};

    fn d4() -> Dialect {
        Dialect { family: IpFamily::V4, masquerade_mark: 0x4000 }
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
}
