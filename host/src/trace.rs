//! `kpx trace`: reads this node's live rules back as typed rules (iptables-
//! save, or the kube-proxy table over netlink) and explains, rule by rule,
//! where a packet goes (kpx_rules::trace does the walking).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use kpx_rules::model::{IpFamily, Protocol, ProxyMode};
use kpx_rules::ops::iptables::{Rule as IptRule, Table};
use kpx_rules::ops::nftables::{self as nft, KeyExpr, Match, Statement, Verdict};
use kpx_rules::trace::{self, Ending, Packet};

use crate::kernel::interfaces;
use crate::kernel::iptables::parse::{Dump, Untraceable};
use crate::kernel::nftables::NftablesKernel;
use crate::syntax::iptables::{Dialect, rule_lines};

/// `kpx trace --from IP --to IP:PORT/PROTO [--mode M]`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The packet's source address (one of the node's own means the node sends it).
    #[arg(long)]
    pub from: std::net::IpAddr,
    /// Destination as IP:PORT/PROTO, e.g. 10.96.0.10:80/tcp or [fd00::10]:53/udp.
    #[arg(long)]
    pub to: String,
    /// The interface the packet arrives on (for interface-based local detection).
    #[arg(long = "in-interface")]
    pub in_interface: Option<String>,
    /// Which mode's rules to read: iptables or nftables.
    #[arg(long, default_value = "iptables")]
    pub mode: String,
    /// The masquerade mark bit kpx runs with (--iptables-masquerade-bit).
    #[arg(long = "iptables-masquerade-bit", default_value_t = 14)]
    pub masquerade_bit: u8,
    /// The iptables kpx runs with (--iptables-backend): auto, nft, legacy or system.
    #[arg(long = "iptables-backend", default_value = "auto", value_parser = ["auto", "nft", "legacy", "system"])]
    pub iptables_backend: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad argument; nothing is read.
    #[error("--{flag}: {reason}")]
    Argument { flag: &'static str, reason: String },
    /// The live rules or addresses cannot be read.
    #[error(transparent)]
    Kernel(#[from] crate::kernel::Error),
    /// The rules hold something the tracer cannot follow.
    #[error("cannot trace these rules: {0}")]
    Untraceable(String),
    /// A rule kpx did not write, in one of kube-proxy's chains.
    #[error(transparent)]
    Foreign(#[from] Untraceable),
}

/// Parses `IP:PORT/PROTO`.
pub fn parse_destination(text: &str) -> Result<(SocketAddr, Protocol), Error> {
    let bad = |reason: &str| Error::Argument { flag: "to", reason: format!("{text:?}: {reason}") };
    let (addr, proto) = text.rsplit_once('/').unwrap_or((text, "tcp"));
    let protocol = match proto.to_ascii_lowercase().as_str() {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        _ => return Err(bad("protocol must be tcp, udp or sctp")),
    };
    let addr: SocketAddr = addr.parse().map_err(|_| bad("want IP:PORT/PROTO, IPv6 as [IP]:PORT/PROTO"))?;
    Ok((addr, protocol))
}

/// Traces against the live kernel; the explanation as text.
pub fn run(args: &Args) -> Result<String, Error> {
    let (to, protocol) = parse_destination(&args.to)?;
    if to.is_ipv4() != args.from.is_ipv4() {
        return Err(Error::Argument {
            flag: "from",
            reason: "source and destination are of different IP families".into(),
        });
    }
    let mode: ProxyMode = args
        .mode
        .parse()
        .map_err(|_| Error::Argument { flag: "mode", reason: format!("{:?}: want iptables or nftables", args.mode) })?;
    let family = IpFamily::of(&to.ip());
    let mark = 1u32 << u32::from(args.masquerade_bit.min(31));
    let node = trace::Node { local_addresses: interfaces::local_addresses()? };
    let packet = packet(&node, args.from, to, protocol, args.in_interface.clone());
    match mode {
        ProxyMode::Iptables => {
            let d = Dialect { family, masquerade_mark: mark };
            use crate::kernel::iptables::backend::{Backend, detect};
            let backend = match args.iptables_backend.as_str() {
                "nft" => Backend::Nft,
                "legacy" => Backend::Legacy,
                "system" => Backend::System,
                _ => detect(&crate::kernel::SystemExec::default()).0,
            };
            let kernel =
                crate::kernel::iptables::IptablesKernel::new(family, Box::new(crate::kernel::SystemExec::default()))
                    .with_backend(backend);
            let dump = crate::kernel::iptables::parse::parse_dump(&kernel.save()?, d);
            explain_iptables(&dump, d, &node, &packet)
        }
        ProxyMode::Nftables => {
            let model = read_nftables(&mut NftablesKernel::new(family), mark)?;
            explain_nftables(&model, &node, &packet)
        }
        ProxyMode::Ipvs => Err(Error::Untraceable(
            "kpx trace follows iptables and nftables rules; in ipvs mode, read the table with ipvsadm -Ln".into(),
        )),
        ProxyMode::Userspace => Err(Error::Untraceable(
            "kpx trace follows iptables and nftables rules; in userspace mode kpx relays each connection itself \
             (its rules: iptables-save -t nat | grep -E 'KUBE-(PORTALS|NODEPORT)'; the choices: kpx's log)"
                .into(),
        )),
    }
}

/// The explanation of one packet through an iptables dump.
pub fn explain_iptables(dump: &Dump, d: Dialect, node: &trace::Node, packet: &Packet) -> Result<String, Error> {
    let tables = dump.tracer_tables(d)?;
    let traced =
        trace::iptables::trace_iptables(&tables, node, packet).map_err(|e| Error::Untraceable(e.to_string()))?;
    let text = |step: &trace::Step| {
        let table = Table::from_name(&step.table).unwrap_or(Table::Filter);
        tables
            .chains
            .get(&(table, step.chain.clone()))
            .and_then(|rules| rules.get(step.index))
            .map(|r: &IptRule| rule_lines(r, d).join(" / "))
            .unwrap_or_default()
    };
    Ok(describe(packet, &traced, &text))
}

/// The kube-proxy table as the tracer's model, read over netlink.
pub fn read_nftables(kernel: &mut NftablesKernel, mark: u32) -> Result<trace::nftables::Model, Error> {
    let family = kernel.family();
    let mut model = trace::nftables::Model::new(family, mark);
    let Some(objects) = kernel.objects()? else { return Ok(model) };
    let frame_base: Vec<nft::BaseChain> = crate::syntax::nftables::BASE_CHAINS.to_vec();
    for c in &objects.chains {
        let base = match &c.base {
            None => None,
            Some(info) => Some(
                *frame_base
                    .iter()
                    .find(|b| b.name == c.name && b.hook as u32 == info.hook && b.priority == info.priority)
                    .ok_or_else(|| Error::Untraceable(format!("base chain {} is not one kpx writes", c.name)))?,
            ),
        };
        model.chains.insert(c.name.clone(), trace::nftables::Chain { base, rules: Vec::new() });
    }
    for (chain, rule) in kernel.rules(mark)? {
        let rule = rule.map_err(|why| Error::Untraceable(format!("a rule in {chain}: {why}")))?;
        model.chains.entry(chain).or_default().rules.push(rule);
    }
    for s in &objects.sets {
        let decl = set_declaration(family, s)?;
        let elements = if decl.timeout_seconds.is_some() { Vec::new() } else { kernel.elements(&decl)? };
        model.sets.insert(s.name.clone(), (decl, elements));
    }
    Ok(model)
}

/// A set's declaration from what the kernel keeps: the host's own are
/// known; a plugin's are read from their types.
fn set_declaration(family: IpFamily, s: &crate::kernel::nftables::decode::SetInfo) -> Result<nft::SetDecl, Error> {
    if let Some(h) = nft::HostSet::from_name(&s.name) {
        return Ok(h.declaration());
    }
    crate::kernel::nftables::decode::declaration(family, s)
        .map_err(|why| Error::Untraceable(format!("set {}: {why}", s.name)))
}

/// The explanation of one packet through the kube-proxy table.
pub fn explain_nftables(model: &trace::nftables::Model, node: &trace::Node, packet: &Packet) -> Result<String, Error> {
    let traced = trace::nftables::trace_nftables(model, node, packet).map_err(|e| Error::Untraceable(e.to_string()))?;
    let text = |step: &trace::Step| {
        model.chains.get(&step.chain).and_then(|c| c.rules.get(step.index)).map(nft_text).unwrap_or_default()
    };
    Ok(describe(packet, &traced, &text))
}

fn keys_text(keys: &[KeyExpr]) -> String {
    keys.iter()
        .map(|k| match k {
            KeyExpr::Address(nft::AddressField::Source) => "saddr".to_string(),
            KeyExpr::Address(nft::AddressField::Destination) => "daddr".to_string(),
            KeyExpr::Protocol => "meta l4proto".to_string(),
            KeyExpr::DestinationPort => "th dport".to_string(),
            KeyExpr::NumgenRandom(n) => format!("numgen random mod {n}"),
            KeyExpr::NumgenIncrement(n) => format!("numgen inc mod {n}"),
            KeyExpr::Jhash { field, modulus, seed } => format!("jhash {field:?} mod {modulus} seed {seed:#x}"),
        })
        .collect::<Vec<_>>()
        .join(" . ")
}

/// An nft-like line for a typed rule, for people (nothing parses it).
pub fn nft_text(rule: &nft::Rule) -> String {
    let not = |n: bool| if n { "!= " } else { "" };
    let mut parts: Vec<String> = rule
        .matches
        .iter()
        .map(|m| match m {
            Match::Address { field, negate, cidr } => {
                format!(
                    "{} {}{cidr}",
                    if *field == nft::AddressField::Source { "saddr" } else { "daddr" },
                    not(*negate)
                )
            }
            Match::Protocol { negate, protocol } => format!("meta l4proto {}{protocol}", not(*negate)),
            Match::DestinationPort { negate, port } => format!("th dport {}{port}", not(*negate)),
            Match::InInterface { negate, name, prefix } => {
                format!("iifname {}\"{name}{}\"", not(*negate), if *prefix { "*" } else { "" })
            }
            Match::FibLocal { field, negate } => format!("fib {field:?} type {}local", not(*negate)),
            Match::CtState { negate, states } => format!("ct state {}{states}", not(*negate)),
            Match::CtDnat { negate } => format!("ct status {}dnat", not(*negate)),
            Match::Mark { negate, value, mask } => format!("meta mark & {mask:#x} {}== {value:#x}", not(*negate)),
            Match::Lookup { keys, set, negate } => format!("{} {}@{}", keys_text(keys), not(*negate), set.name()),
        })
        .collect();
    parts.extend(rule.statements.iter().map(|s| match s {
        Statement::Counter => "counter".to_string(),
        Statement::MasqueradeMark => "meta mark set meta mark | masquerade".to_string(),
        Statement::AffinityUpdate(set) => format!("update @{set} {{ saddr }}"),
        Statement::MarkXor(v) => format!("meta mark set meta mark ^ {v:#x}"),
        Statement::NamedCounter(name) => format!("counter name \"{name}\""),
        Statement::Masquerade { fully_random } => {
            format!("masquerade{}", if *fully_random { " fully-random" } else { "" })
        }
    }));
    parts.push(match &rule.verdict {
        Verdict::Continue => String::new(),
        Verdict::Accept => "accept".into(),
        Verdict::Drop => "drop".into(),
        Verdict::Reject => "reject".into(),
        Verdict::Return => "return".into(),
        Verdict::Jump(c) => format!("jump {c}"),
        Verdict::Goto(c) => format!("goto {c}"),
        Verdict::Dnat(ip, port) => format!("dnat to {}", kpx_rules::model::join_host_port(ip, *port)),
        Verdict::DnatMap { keys, map } => format!("dnat to {} map @{}", keys_text(keys), map.name()),
        Verdict::Vmap { keys, map } => format!("{} vmap @{}", keys_text(keys), map.name()),
    });
    parts.retain(|p| !p.is_empty());
    parts.join(" ")
}

fn packet(
    node: &trace::Node,
    from: IpAddr,
    to: SocketAddr,
    protocol: Protocol,
    in_interface: Option<String>,
) -> Packet {
    Packet { src: from, dst: to.ip(), dport: to.port(), protocol, from_node: node.is_local(&from), in_interface }
}

/// Every path, rule by rule, and the verdict.
fn describe(packet: &Packet, traced: &trace::Trace, text: &dyn Fn(&trace::Step) -> String) -> String {
    let (from, to, protocol) = (packet.src, SocketAddr::new(packet.dst, packet.dport), packet.protocol);
    let family = IpFamily::of(&to.ip());
    let mut out = String::new();
    let origin = if packet.from_node { "sent by this node (OUTPUT)" } else { "arriving (PREROUTING)" };
    let _ = writeln!(out, "packet {from} -> {to}/{protocol} ({family}), {origin}");
    let total = traced.paths.len();
    for (i, (ending, masq, steps)) in traced.paths.iter().enumerate() {
        let end = match ending {
            Ending::Endpoint(ep) => format!("DNAT to {ep}, {}", if *masq { "masqueraded" } else { "source kept" }),
            Ending::Accept => format!("accepted untouched{}", if *masq { ", masqueraded" } else { "" }),
            Ending::Drop => "DROP".into(),
            Ending::Reject => "REJECT".into(),
        };
        let _ = writeln!(out, "\npath {} of {total}: {end}", i + 1);
        for step in steps {
            let _ = writeln!(out, "  {:<10} {:<28} {}", step.table, step.chain, text(step));
        }
    }
    let masq = if traced.verdict.masquerade { " (masqueraded)" } else { "" };
    let _ = writeln!(out, "\nverdict: {}{masq}", traced.verdict);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::iptables::parse::parse_dump;

    const RULES: &str = "*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-SEP-A - [0:0]
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"ns/a cluster IP\" -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SVC-A ! -s 10.0.0.0/8 -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-A -j KUBE-SEP-A
-A KUBE-SEP-A -p tcp -j DNAT --to-destination 10.1.0.5:8080
COMMIT
";

    #[test]
    fn explains_the_path_of_an_iptables_save_dump() {
        let d = Dialect { family: IpFamily::V4, masquerade_mark: 0x4000 };
        let dump = parse_dump(RULES, d);
        let to = "10.96.0.10:80".parse().unwrap();
        let node = trace::Node { local_addresses: vec![] };
        let from_outside = packet(&node, "203.0.113.1".parse().unwrap(), to, Protocol::Tcp, None);
        let out = explain_iptables(&dump, d, &node, &from_outside).unwrap();
        assert!(out.contains("path 1 of 1: DNAT to 10.1.0.5:8080, masqueraded"), "{out}");
        assert!(out.contains("-A KUBE-SVC-A -j KUBE-SEP-A"), "{out}");
        assert!(out.contains("verdict: 10.1.0.5:8080 (masqueraded)"), "{out}");
        let from_cluster = packet(&node, "10.0.0.9".parse().unwrap(), to, Protocol::Tcp, None);
        let out = explain_iptables(&dump, d, &node, &from_cluster).unwrap();
        assert!(out.contains("source kept"), "{out}");
    }

    #[test]
    fn destinations_parse() {
        assert_eq!(parse_destination("10.0.0.1:53/UDP").unwrap().1, Protocol::Udp);
        assert_eq!(parse_destination("[fd00::1]:80/tcp").unwrap().0.port(), 80);
        assert!(parse_destination("10.0.0.1/tcp").is_err());
        assert!(parse_destination("10.0.0.1:80/icmp").is_err());
    }
}
