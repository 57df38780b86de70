//! `kpx trace`: reads this node's live rules and explains, rule by rule,
//! where a packet goes (kpx_rules::trace does the walking).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use kpx_rules::model::{IpFamily, Protocol};
use kpx_rules::trace::{self, Ending, Packet, parse_ruleset, trace_iptables};

use crate::config::TraceArgs;
use crate::kernel::{Exec, interfaces};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A bad argument; nothing is read.
    #[error("--{flag}: {reason}")]
    Argument { flag: &'static str, reason: String },
    /// The live rules or addresses cannot be read.
    #[error(transparent)]
    Kernel(#[from] crate::kernel::Error),
    /// The rules hold a shape the tracer does not know.
    #[error("cannot trace these rules: {0}")]
    Unreadable(#[from] trace::TraceError),
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
pub fn run(args: &TraceArgs, exec: &dyn Exec) -> Result<String, Error> {
    let (to, protocol) = parse_destination(&args.to)?;
    if to.is_ipv4() != args.from.is_ipv4() {
        return Err(Error::Argument {
            flag: "from",
            reason: "source and destination are of different IP families".into(),
        });
    }
    let node = trace::Node { local_addresses: interfaces::local_addresses(exec)? };
    let packet = packet(&node, args.from, to, protocol, args.in_interface.clone());
    match args.mode.as_str() {
        "iptables" => {
            let save = if to.is_ipv4() { "iptables-save" } else { "ip6tables-save" };
            let rules = exec.run(save, &[], None)?;
            explain(&rules, &node, &packet)
        }
        "nftables" => {
            let family = if to.is_ipv4() { "ip" } else { "ip6" };
            let listing = exec.run("nft", &["list", "table", family, kpx_rules::nftables::TABLE], None)?;
            explain_nftables(&listing, family, &node, &packet)
        }
        other => Err(Error::Argument { flag: "mode", reason: format!("{other:?}: want iptables or nftables") }),
    }
}

/// The explanation of one packet through an `iptables-save` dump.
pub fn explain(rules: &str, node: &trace::Node, packet: &Packet) -> Result<String, Error> {
    let traced = trace_iptables(&parse_ruleset(rules)?, &[], node, packet)?;
    Ok(describe(packet, &traced))
}

/// The explanation of one packet through an `nft list table` listing.
pub fn explain_nftables(listing: &str, family: &str, node: &trace::Node, packet: &Packet) -> Result<String, Error> {
    let mut model = trace::nftables::NftModel::default();
    model.apply(&trace::nftables::listing_to_commands(listing, family))?;
    let traced = trace::nftables::trace_nftables(&model, node, packet)?;
    Ok(describe(packet, &traced))
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
fn describe(packet: &Packet, traced: &trace::Trace) -> String {
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
            let _ = writeln!(out, "  {:<6} {:<28} {}", step.table, step.chain, step.text);
        }
    }
    let masq = if traced.verdict.masquerade { " (masqueraded)" } else { "" };
    let _ = writeln!(out, "\nverdict: {}{masq}", traced.verdict);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.1.0.5:8080
COMMIT
";

    #[test]
    fn explains_the_path_of_an_iptables_save_dump() {
        let to = "10.96.0.10:80".parse().unwrap();
        let node = trace::Node { local_addresses: vec![] };
        let from_outside = packet(&node, "203.0.113.1".parse().unwrap(), to, Protocol::Tcp, None);
        let out = explain(RULES, &node, &from_outside).unwrap();
        assert!(out.contains("path 1 of 1: DNAT to 10.1.0.5:8080, masqueraded"), "{out}");
        assert!(out.contains("KUBE-SVC-A"), "{out}");
        assert!(out.contains("verdict: 10.1.0.5:8080 (masqueraded)"), "{out}");
        let from_cluster = packet(&node, "10.0.0.9".parse().unwrap(), to, Protocol::Tcp, None);
        let out = explain(RULES, &node, &from_cluster).unwrap();
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
