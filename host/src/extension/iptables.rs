//! An extension's iptables objects: chains `KUBE-X-<NAME>-*` that the host
//! declares and jumps to (mangle PREROUTING and OUTPUT for the firewall
//! and dispatch attachments, before kube-proxy's DNAT; filter INPUT,
//! FORWARD and OUTPUT for connections kube-proxy destination-NATed),
//! written by the host as one `iptables-restore --noflush` payload.
//!
//! A counter is a chain of one rule (`-j RETURN`, `-j DROP` or `-j
//! REJECT`) that the port chains jump to: it is declared once, so its
//! packet count survives the rewrites of the chains around it. A rate
//! limit is a `hashlimit` named by what it holds, so its bucket survives
//! too.
//!
//! Accept is `RETURN`, never `ACCEPT` (which would end the built-in
//! chain, and with it kube-proxy's own rules there and the other
//! extensions' jumps). The built-in chain jumps (`-j`) to the entry
//! chain, which goes (`-g`) to the port chain: the port chain replaces
//! the entry chain on the call stack, so a `RETURN` in it goes back to
//! the built-in chain, past the port's later rules and the rest of the
//! entry chain, and nothing else is skipped. A counted accept goes (`-g`)
//! to its counter chain (`-j RETURN`) for the same reason: a jump would
//! return to the port chain, and its next rule.

use std::collections::{BTreeMap, BTreeSet};

use kpx_rules::model::IpFamily;
use kpx_rules::ops::extension::{Action, Attachment};

use super::layout::{Destination, Layout, Test};
use crate::kernel::iptables::WAIT;
use crate::kernel::iptables::backend::Backend;
use crate::kernel::{Cause, Exec, Result};

/// Where an attachment's chains live, and the built-in chains that jump
/// to its entry chain.
fn placement(a: Attachment) -> (&'static str, &'static str, &'static [&'static str]) {
    match a {
        Attachment::Firewall => ("mangle", "FIREWALL", &["PREROUTING", "OUTPUT"]),
        Attachment::BeforeDispatch => ("mangle", "DISPATCH", &["PREROUTING", "OUTPUT"]),
        Attachment::Service => ("filter", "SERVICE", &["INPUT", "FORWARD", "OUTPUT"]),
    }
}

const TABLES: [&str; 2] = ["mangle", "filter"];

/// `iptables-save -c -t TABLE` of the tables extensions use.
pub type Dumps = BTreeMap<&'static str, String>;

/// The chain-name prefix of extension `name`.
pub fn prefix(name: &str) -> String {
    format!("KUBE-X-{}-", name.to_ascii_uppercase())
}

/// What a payload left in the kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Written {
    pub layout: Layout,
    /// Chains per table.
    chains: BTreeMap<&'static str, BTreeSet<String>>,
    /// Counter chains: (table, chain) to the counter's id.
    counter_chains: BTreeMap<(&'static str, String), String>,
    /// Read from the kernel: chains it holds without a rule.
    empty: BTreeSet<(&'static str, String)>,
}

/// The jump from `builtin` to an attachment's entry chain.
fn jump_args(a: Attachment, builtin: &str, name: &str) -> Vec<String> {
    let (_, entry, _) = placement(a);
    let mut args: Vec<String> = Vec::new();
    // The node's own connections are seen on OUTPUT; looped back to it
    // they would be seen (and counted) again.
    if matches!(builtin, "PREROUTING" | "INPUT") {
        args.extend(["!".into(), "-i".into(), "lo".into()]);
    }
    args.extend(["-m".into(), "conntrack".into(), "--ctstate".into(), "NEW".into()]);
    if a == Attachment::Service {
        // DNAT is a virtual state: a second match, or it would be "NEW or DNAT".
        args.extend(["-m".into(), "conntrack".into(), "--ctstate".into(), "DNAT".into()]);
    }
    args.extend([
        "-m".into(),
        "comment".into(),
        "--comment".into(),
        format!("kpx extension {name} {}", a.name()),
        "-j".into(),
        format!("{}{entry}", prefix(name)),
    ]);
    args
}

/// How a port chain's rule enters its counter chain: a jump, whose
/// `RETURN` comes back to the port chain's next rule (continue), except
/// for an accept, which goes to it (`-g`): its `RETURN` then leaves the
/// extension's chains, as an accept without a counter does.
fn counter_call(action: Action) -> &'static str {
    match action {
        Action::Accept => "-g",
        Action::Continue | Action::Drop | Action::Reject => "-j",
    }
}

/// The payload that takes the kernel from `previous` to `layout`.
pub fn payload(name: &str, layout: &Layout, previous: &Written) -> (String, Written) {
    let pre = prefix(name);
    let mut written = Written { layout: layout.clone(), ..Default::default() };
    let mut lines: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut declare: BTreeMap<&'static str, BTreeSet<String>> = BTreeMap::new();
    for a in Attachment::ALL {
        let (table, entry, _) = placement(a);
        let entry = format!("{pre}{entry}");
        declare.entry(table).or_default().insert(entry.clone());
        let rules = lines.entry(table).or_default();
        let mut exempted = false;
        for e in layout.entries.get(&a).into_iter().flatten() {
            // Entries are sorted: addresses first, then node ports, before
            // which another Service's address on the node port's number
            // returns.
            if !exempted && matches!(e.destination, Destination::NodePort { .. }) {
                exempted = true;
                for (ip, proto, port) in layout.exempt.get(&a).into_iter().flatten() {
                    let len = if ip.is_ipv4() { 32 } else { 128 };
                    let p = proto.as_str();
                    rules.push(format!("-A {entry} -d {ip}/{len} -p {p} -m {p} --dport {port} -j RETURN"));
                }
            }
            // The key comes from the objects (a manifest need not hold a
            // valid name): written as a comment, never as syntax.
            let service = kpx_rules::ops::sanitize_comment(&layout.chains[&e.chain].service, 255);
            // A goto: one port chain per connection, even where two ports
            // share a destination.
            let to = format!("-m comment --comment \"{service}\" -g {pre}{}", e.chain);
            let p = e.protocol.as_str();
            for tests in e.tests(a) {
                let mut line = format!("-A {entry}");
                let mut original = String::new();
                for t in tests {
                    match t {
                        Test::Destination { negate, cidr } => {
                            let not = if negate { "! " } else { "" };
                            line.push_str(&format!(" {not}-d {}/{}", cidr.network(), cidr.prefix_len));
                        }
                        Test::Local => line.push_str(" -m addrtype --dst-type LOCAL"),
                        Test::OriginalDestination(c) => {
                            original = format!(" --ctorigdst {}/{}", c.network(), c.prefix_len)
                        }
                    }
                }
                if a == Attachment::Service {
                    line.push_str(&format!(" -m conntrack --ctproto {p}{original} --ctorigdstport {}", e.port));
                } else {
                    line.push_str(&format!(" -p {p} -m {p} --dport {}", e.port));
                }
                rules.push(format!("{line} {to}"));
            }
        }
    }
    for (id, chain) in &layout.chains {
        let (table, _, _) = placement(chain.attachment);
        let chain_name = format!("{pre}{id}");
        declare.entry(table).or_default().insert(chain_name.clone());
        for r in &chain.rules {
            let mut line = format!("-A {chain_name}");
            if let Some(s) = r.source {
                let not = if s.negate { "! " } else { "" };
                line.push_str(&format!(" {not}-s {}/{}", s.cidr.network(), s.cidr.prefix_len));
            }
            if let Some(l) = &r.limit {
                let rate = layout.limits[l];
                line.push_str(&format!(
                    // No mode: one bucket, so a table of one entry (the
                    // kernel's default is 8,192 buckets per name).
                    " -m hashlimit --hashlimit-above {}/sec --hashlimit-burst {} --hashlimit-htable-size 1 --hashlimit-htable-max 1 --hashlimit-name kx{}",
                    rate.per_second,
                    rate.burst,
                    l.to_ascii_lowercase()
                ));
            }
            let verdict = match r.action {
                // A counter chain's only rule for these; an accept's own
                // rule too (the module's doc says why RETURN accepts).
                Action::Continue | Action::Accept => "RETURN",
                Action::Drop => "DROP",
                // A TCP connection refused with a reset, as kube-proxy's
                // own rejects of TCP do not: an ICMP error is rate limited
                // by the kernel (after a few a second each refusal waits),
                // a reset is not. Only the port's packets enter its chain,
                // so the protocol match holds for all of them.
                Action::Reject if chain.protocol == kpx_rules::model::Protocol::Tcp => "REJECT --reject-with tcp-reset",
                Action::Reject => "REJECT",
            };
            // iptables takes a TCP reset only in a rule that matches TCP.
            let verdict =
                if verdict.contains("tcp-reset") { format!("-p tcp -j {verdict}") } else { format!("-j {verdict}") };
            match (&r.counter, &r.counter_chain) {
                (Some(c), Some(id)) => {
                    let counter_chain = format!("{pre}{id}");
                    line.push_str(&format!(" {} {counter_chain}", counter_call(r.action)));
                    let key = (table, counter_chain.clone());
                    // Declared only when the kernel does not hold it: a
                    // declaration flushes the chain, and its count with it.
                    let held = previous.chains.get(table).is_some_and(|c| c.contains(&counter_chain))
                        && !previous.empty.contains(&key);
                    if !held && !written.counter_chains.contains_key(&key) {
                        declare.entry(table).or_default().insert(counter_chain.clone());
                        lines.entry(table).or_default().push(format!("-A {counter_chain} {verdict}"));
                    }
                    written.counter_chains.insert(key, c.clone());
                }
                _ if r.action == Action::Continue => {}
                _ => line.push_str(&format!(" {verdict}")),
            }
            lines.entry(table).or_default().push(line);
        }
    }
    for (table, names) in &declare {
        written.chains.entry(table).or_default().extend(names.iter().cloned());
    }
    for (table, chain) in written.counter_chains.keys() {
        written.chains.entry(table).or_default().insert(chain.clone());
    }
    let mut out = String::new();
    for table in TABLES {
        let stale: Vec<&String> = previous
            .chains
            .get(table)
            .into_iter()
            .flatten()
            .filter(|c| !written.chains.get(table).is_some_and(|w| w.contains(*c)))
            .collect();
        let declared = declare.get(table);
        if declared.is_none() && stale.is_empty() {
            continue;
        }
        out.push_str(&format!("*{table}\n"));
        for c in declared.into_iter().flatten().chain(stale.iter().copied()) {
            out.push_str(&format!(":{c} - [0:0]\n"));
        }
        for l in lines.get(table).into_iter().flatten() {
            out.push_str(l);
            out.push('\n');
        }
        for c in &stale {
            out.push_str(&format!("-X {c}\n"));
        }
        out.push_str("COMMIT\n");
    }
    (out, written)
}

/// One extension's chains in one family.
pub struct IptablesWriter {
    name: String,
    family: IpFamily,
    backend: Backend,
    exec: Box<dyn Exec>,
    written: Option<Written>,
}

impl IptablesWriter {
    /// The tools on PATH ([`Backend::System`]).
    pub fn new(name: &str, family: IpFamily, exec: Box<dyn Exec>) -> IptablesWriter {
        IptablesWriter { name: name.to_string(), family, backend: Backend::System, exec, written: None }
    }

    /// The tools of `backend` instead.
    pub fn with_backend(mut self, backend: Backend) -> IptablesWriter {
        self.backend = backend;
        self
    }

    fn tool(&self, base: &str) -> String {
        self.backend.tool(self.family, base)
    }

    /// The extension's chains the kernel holds, per table, as a previous
    /// write: chains without a rule (someone flushed them) count as not
    /// held, so a counter chain among them is written again.
    fn existing(&self) -> Result<Written> {
        let pre = prefix(&self.name);
        let mut out = Written::default();
        for table in TABLES {
            let text = self.exec.run(&self.tool("iptables-save"), &["-t", table], None)?;
            let mut with_rules = BTreeSet::new();
            for line in text.lines() {
                if let Some(chain) = line.strip_prefix(':').and_then(|l| l.split_whitespace().next())
                    && chain.starts_with(&pre)
                {
                    out.chains.entry(table).or_default().insert(chain.to_string());
                }
                if let Some(chain) = line.strip_prefix("-A ").and_then(|l| l.split_whitespace().next()) {
                    with_rules.insert(chain.to_string());
                }
            }
            for chain in out.chains.get(&table).into_iter().flatten().filter(|c| !with_rules.contains(*c)) {
                out.empty.insert((table, chain.clone()));
            }
        }
        Ok(out)
    }

    /// Writes `layout` unless the kernel holds it already; `full` reads
    /// what an earlier process left and rewrites everything.
    pub fn write(&mut self, layout: &Layout, full: bool) -> Result<bool> {
        if !full && self.written.as_ref().is_some_and(|w| &w.layout == layout) {
            return Ok(false);
        }
        let previous = match (&self.written, full) {
            (Some(w), false) => w.clone(),
            // What the kernel holds: its counter chains are kept.
            _ => self.existing()?,
        };
        let (text, written) = payload(&self.name, layout, &previous);
        let mut args = WAIT.to_vec();
        args.push("--noflush");
        // A failed restore keeps what was written (its counters are read);
        // the next write (a full one) reads the kernel again.
        self.exec.run(&self.tool("iptables-restore"), &args, Some(text.as_bytes()))?;
        self.written = Some(written);
        self.ensure_jumps()?;
        Ok(true)
    }

    /// The jumps from the built-in chains, where missing (the entry
    /// chains exist: every payload declares them).
    /// `iptables -t TABLE OP BUILTIN <the jump to a's entry chain>`.
    fn jump(&self, op: &str, table: &str, builtin: &str, a: Attachment) -> Result<String> {
        let spec = jump_args(a, builtin, &self.name);
        let mut args: Vec<&str> = vec![WAIT[0], WAIT[1], "-t", table, op, builtin];
        args.extend(spec.iter().map(String::as_str));
        self.exec.run(&self.tool("iptables"), &args, None)
    }

    /// Deletes every copy of a jump (stops at the first "no such rule").
    fn unlink(&self, table: &str, builtin: &str, a: Attachment) {
        for _ in 0..16 {
            if self.jump("-D", table, builtin, a).is_err() {
                break;
            }
        }
    }

    fn ensure_jumps(&self) -> Result<()> {
        // Per built-in chain, the jumps in the order they must run (the
        // firewall's before dispatch). One missing: all taken out and
        // inserted again at the top, last first, so the order holds.
        for (table, builtin, order) in [
            ("mangle", "PREROUTING", &[Attachment::Firewall, Attachment::BeforeDispatch][..]),
            ("mangle", "OUTPUT", &[Attachment::Firewall, Attachment::BeforeDispatch][..]),
            ("filter", "INPUT", &[Attachment::Service][..]),
            ("filter", "FORWARD", &[Attachment::Service][..]),
            ("filter", "OUTPUT", &[Attachment::Service][..]),
        ] {
            let mut missing = false;
            for a in order {
                if let Err(e) = self.jump("-C", table, builtin, *a) {
                    if e.cause() == Cause::Locked {
                        return Err(e);
                    }
                    missing = true;
                }
            }
            if !missing {
                continue;
            }
            for a in order {
                self.unlink(table, builtin, *a);
            }
            for a in order.iter().rev() {
                self.jump("-I", table, builtin, *a)?;
            }
        }
        Ok(())
    }

    /// Packets per counter chain: `table/chain` to (counter id, packets).
    /// `dumps`: `iptables-save -c` of mangle and filter, read once per
    /// family for every extension ([`IptablesWriter::save_counts`]).
    pub fn counters(&self, dumps: &Dumps) -> super::RawCounts {
        let Some(written) = &self.written else { return Default::default() };
        let mut out = super::RawCounts::new();
        for (table, text) in dumps {
            for line in text.lines() {
                let Some((counts, rest)) = line.strip_prefix('[').and_then(|l| l.split_once("] -A ")) else {
                    continue;
                };
                let chain = rest.split_whitespace().next().unwrap_or_default();
                let Some(id) = written.counter_chains.get(&(*table, chain.to_string())) else { continue };
                let packets = counts.split(':').next().and_then(|p| p.parse::<u64>().ok()).unwrap_or(0);
                out.insert(format!("{table}/{chain}"), (id.clone(), packets));
            }
        }
        out
    }

    /// The tables extensions' counters live in, with their counts.
    pub fn save_counts(&self) -> Result<Dumps> {
        TABLES
            .iter()
            .map(|table| Ok((*table, self.exec.run(&self.tool("iptables-save"), &["-c", "-t", table], None)?)))
            .collect()
    }

    /// Unlinks the jumps and deletes every chain of the extension
    /// (`--cleanup`); the chains removed.
    pub fn cleanup(&mut self) -> Result<usize> {
        self.written = None;
        let existing = self.existing()?.chains;
        if existing.is_empty() {
            return Ok(0);
        }
        for a in Attachment::ALL {
            let (table, _, builtins) = placement(a);
            for builtin in builtins {
                self.unlink(table, builtin, a);
            }
        }
        let mut text = String::new();
        let mut removed = 0;
        for (table, chains) in &existing {
            removed += chains.len();
            text.push_str(&format!("*{table}\n"));
            for c in chains {
                text.push_str(&format!(":{c} - [0:0]\n"));
            }
            for c in chains {
                text.push_str(&format!("-X {c}\n"));
            }
            text.push_str("COMMIT\n");
        }
        let mut args = WAIT.to_vec();
        args.push("--noflush");
        self.exec.run(&self.tool("iptables-restore"), &args, Some(text.as_bytes()))?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extension::layout::build;
    use kpx_rules::model::{Protocol, ProxyMode, ServicePort, Settings};
    use kpx_rules::ops::extension::{Rate, Rule, Ruleset, SourceMatch};

    fn ports() -> crate::state::PortMap {
        let mut p = ServicePort::new("ns", "web", "", Protocol::Tcp, 80);
        p.cluster_ip = Some("10.96.0.10".parse().unwrap());
        p.node_port = 30080;
        BTreeMap::from([(p.key.clone(), Box::new(p))])
    }

    fn layout(rate: u32) -> Layout {
        let rule = Rule {
            attachment: Attachment::BeforeDispatch,
            service: "ns/web".into(),
            source: None,
            over_rate: Some(Rate { per_second: rate, burst: rate }),
            counter: Some("dropped".into()),
            action: Action::Drop,
        };
        build(
            "lim",
            &Settings::new(IpFamily::V4, ProxyMode::Iptables),
            &Ruleset { rules: vec![rule] },
            &ports(),
            &Default::default(),
        )
    }

    #[test]
    fn every_destination_jumps_to_the_port_chain_and_counters_are_declared_once() {
        let (text, written) = payload("lim", &layout(5), &Written::default());
        let lines: Vec<&str> = text.lines().collect();
        let dispatch: Vec<&&str> = lines.iter().filter(|l| l.starts_with("-A KUBE-X-LIM-DISPATCH ")).collect();
        assert_eq!(dispatch.len(), 2, "{text}");
        assert!(dispatch[0].contains("-d 10.96.0.10/32 -p tcp -m tcp --dport 80"), "{text}");
        // iptables mode serves 127.0.0.1 node ports (--iptables-localhost-nodeports).
        assert!(dispatch[1].contains("-m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30080"), "{text}");
        assert!(text.contains("--hashlimit-above 5/sec --hashlimit-burst 5 --hashlimit-htable-size 1"), "{text}");
        assert!(text.starts_with("*mangle\n") && text.contains("*filter\n:KUBE-X-LIM-SERVICE - [0:0]\nCOMMIT\n"));
        let counter_chain = written.counter_chains.keys().next().unwrap().1.clone();
        assert!(
            text.contains(&format!(":{counter_chain} - [0:0]\n"))
                && text.contains(&format!("-A {counter_chain} -j DROP\n"))
        );

        // The same counter in the next payload: neither declared (which
        // would flush its count) nor written again.
        let (next, _) = payload("lim", &layout(6), &written);
        assert!(!next.contains(&format!(":{counter_chain} ")), "{next}");
        assert!(!next.contains(&format!("-A {counter_chain} ")), "{next}");
        assert!(next.contains("--hashlimit-above 6/sec"), "{next}");

        // Nothing left: every chain of the extension flushed and deleted,
        // the entry chains kept (the built-in chains jump to them).
        let (gone, _) = payload("lim", &Layout::default(), &written);
        assert!(gone.contains(&format!("-X {counter_chain}\n")), "{gone}");
        assert!(!gone.contains("-X KUBE-X-LIM-DISPATCH"), "{gone}");
    }

    /// A counted reject of a TCP port answers with a reset, in the counter
    /// chain as in the port chain; the same port turned UDP gets a counter
    /// chain of its own with ICMP's reject (a kept chain is never written
    /// again, so a changed verdict needs a new one), and the old one goes.
    #[test]
    fn a_tcp_reject_is_a_reset_and_a_changed_verdict_a_new_counter_chain() {
        let reject = |protocol: Protocol, counter: Option<&str>| {
            let mut p = ServicePort::new("ns", "web", "", protocol, 80);
            p.cluster_ip = Some("10.96.0.10".parse().unwrap());
            let rule = Rule {
                attachment: Attachment::Service,
                service: p.key.clone(),
                source: None,
                over_rate: None,
                counter: counter.map(String::from),
                action: Action::Reject,
            };
            let ports = BTreeMap::from([(p.key.clone(), Box::new(p))]);
            let settings = Settings::new(IpFamily::V4, ProxyMode::Iptables);
            build("rj", &settings, &Ruleset { rules: vec![rule] }, &ports, &Default::default())
        };
        let (plain, _) = payload("rj", &reject(Protocol::Tcp, None), &Written::default());
        assert!(plain.contains(" -p tcp -j REJECT --reject-with tcp-reset\n"), "{plain}");
        let (udp, _) = payload("rj", &reject(Protocol::Udp, None), &Written::default());
        assert!(udp.contains(" -j REJECT\n") && !udp.contains("tcp-reset"), "{udp}");

        let (tcp, written) = payload("rj", &reject(Protocol::Tcp, Some("refused")), &Written::default());
        let tcp_chain = written.counter_chains.keys().next().unwrap().1.clone();
        assert!(tcp.contains(&format!("-A {tcp_chain} -p tcp -j REJECT --reject-with tcp-reset\n")), "{tcp}");
        let (now_udp, after) = payload("rj", &reject(Protocol::Udp, Some("refused")), &written);
        let udp_chain = after.counter_chains.keys().next().unwrap().1.clone();
        assert_ne!(udp_chain, tcp_chain, "a new verdict, a new chain");
        assert!(now_udp.contains(&format!("-A {udp_chain} -j REJECT\n")), "{now_udp}");
        assert!(now_udp.contains(&format!("-X {tcp_chain}\n")), "{now_udp}");
    }

    /// An accept is RETURN in the port chain, which the entry chain went
    /// to (`-g`): it leaves the extension's chains, and never is ACCEPT.
    /// Counted, the port chain goes (`-g`) to a counter chain whose
    /// RETURN leaves them too, while a counted continue jumps (`-j`) to
    /// its own and comes back.
    #[test]
    fn an_accept_returns_from_the_extensions_chains() {
        let source = SourceMatch { negate: false, cidr: "192.0.2.0/24".parse().unwrap() };
        let rule = |counter: Option<&str>, action: Action| Rule {
            attachment: Attachment::BeforeDispatch,
            service: "ns/web".into(),
            source: Some(source),
            over_rate: None,
            counter: counter.map(String::from),
            action,
        };
        let rules = vec![
            rule(None, Action::Accept),
            rule(Some("accepted"), Action::Accept),
            rule(Some("seen"), Action::Continue),
            rule(None, Action::Drop),
        ];
        let settings = Settings::new(IpFamily::V4, ProxyMode::Iptables);
        let layout = build("acc", &settings, &Ruleset { rules }, &ports(), &Default::default());
        let (text, _) = payload("acc", &layout, &Written::default());
        assert!(!text.contains("ACCEPT"), "{text}");
        let port_chain = format!("KUBE-X-ACC-{}", layout.chains.keys().next().unwrap());
        assert!(text.contains(&format!("-g {port_chain}\n")), "the entry chain goes to the port chain: {text}");
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("-A {port_chain} "))).collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].ends_with(" -s 192.0.2.0/24 -j RETURN"), "{text}");
        let called = |line: &str, how: &str| {
            let (before, chain) = line.rsplit_once(' ').unwrap();
            assert!(before.ends_with(how) && chain.starts_with("KUBE-X-ACC-"), "{how} a counter chain: {line}");
            assert!(text.contains(&format!("-A {chain} -j RETURN\n")), "{chain} returns: {text}");
            chain.to_string()
        };
        let accepted = called(lines[1], " -g");
        let seen = called(lines[2], " -j");
        assert_ne!(accepted, seen, "an accept's counter chain is its own");
        assert!(lines[3].ends_with(" -j DROP"), "{text}");
    }
}
