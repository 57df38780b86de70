//! The packet tracer: where can a packet go through typed rules? It walks
//! the chains a packet meets — the host's frame and a plugin's rules, or
//! what the kernel gives back read as typed rules — and says which
//! endpoints it can reach (every random and hash branch is followed), or
//! whether it is dropped, rejected or accepted untouched, and whether it is
//! masqueraded. Rules that depend on history (`recent --rcheck`, affinity
//! sets) never match.

pub mod iptables;
pub mod nftables;

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use crate::model::{Protocol, join_host_port};

/// A ruleset the tracer cannot walk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    pub chain: String,
    pub reason: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chain {}: {}", self.chain, self.reason)
    }
}

impl std::error::Error for TraceError {}

fn err(chain: &str, reason: impl Into<String>) -> TraceError {
    TraceError { chain: chain.to_string(), reason: reason.into() }
}

/// The packet to trace: the first packet of a new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dport: u16,
    pub protocol: Protocol,
    /// Sent by a process on the node itself (walks OUTPUT, not PREROUTING).
    pub from_node: bool,
    /// The interface it arrives on, for interface-based local detection.
    pub in_interface: Option<String>,
}

/// What the node knows about itself.
#[derive(Debug, Clone, Default)]
pub struct Node {
    /// Addresses of the node (loopback is always local).
    pub local_addresses: Vec<IpAddr>,
}

impl Node {
    pub fn is_local(&self, ip: &IpAddr) -> bool {
        ip.is_loopback() || self.local_addresses.contains(ip)
    }
}

/// Where a packet ends.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ending {
    /// DNATed to this `ip:port` (`[ip]:port` for IPv6) and let through.
    Endpoint(String),
    Drop,
    Reject,
    /// Let through without DNAT.
    Accept,
}

/// The union of a packet's possible endings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verdict {
    pub endings: BTreeSet<Ending>,
    /// Masqueraded on some path that reaches an endpoint or is accepted.
    pub masquerade: bool,
}

impl fmt::Display for Verdict {
    /// upstream's `packetFlowTest.output` form: "10.0.0.1:80, 10.0.0.2:80",
    /// "DROP", "REJECT" or "ACCEPT".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .endings
            .iter()
            .map(|e| match e {
                Ending::Endpoint(ep) => ep.clone(),
                Ending::Drop => "DROP".into(),
                Ending::Reject => "REJECT".into(),
                Ending::Accept => "ACCEPT".into(),
            })
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// One rule a packet met on its way: where it is (its position in its
/// chain, from 0), for explanations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// "nat", "filter" (iptables) or "kube-proxy" (nftables).
    pub table: String,
    pub chain: String,
    pub index: usize,
}

/// The verdict, and for each possible ending whether it was masqueraded
/// and the rules that led there.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    pub verdict: Verdict,
    pub paths: Vec<(Ending, bool, Vec<Step>)>,
}

impl Trace {
    /// Sums the paths up into the verdict.
    fn finish(&mut self) {
        for (ending, masq, _) in &self.paths {
            self.verdict.endings.insert(ending.clone());
            self.verdict.masquerade |= *masq;
        }
    }
}

/// One way a packet can go, while it is being walked.
#[derive(Debug, Clone)]
struct Flow {
    dnat: Option<(IpAddr, u16)>,
    mark: u32,
    masquerade: bool,
    path: Vec<Step>,
}

impl Flow {
    fn new() -> Flow {
        Flow { dnat: None, mark: 0, masquerade: false, path: Vec::new() }
    }

    /// The destination after any DNAT.
    fn dst(&self, packet: &Packet) -> (IpAddr, u16) {
        self.dnat.unwrap_or((packet.dst, packet.dport))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Fell off the chain's end, or RETURN.
    Return,
    Accept,
    Drop,
    Reject,
}

fn ending(exit: Exit, flow: &Flow) -> Ending {
    match exit {
        Exit::Drop => Ending::Drop,
        Exit::Reject => Ending::Reject,
        Exit::Accept | Exit::Return => match flow.dnat {
            Some((ip, port)) => Ending::Endpoint(join_host_port(&ip, port)),
            None => Ending::Accept,
        },
    }
}

/// Whether an interface name matches a name or prefix.
fn interface_matches(packet: &Packet, name: &str, prefix: bool) -> bool {
    match &packet.in_interface {
        Some(iface) if prefix => iface.starts_with(name),
        Some(iface) => iface == name,
        None => false,
    }
}

/// How deep jumps may nest before the tracer calls it a loop.
const MAX_DEPTH: usize = 32;
