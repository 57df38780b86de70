//! The packet tracer: where can a packet go through a ruleset? It reads an
//! iptables ruleset (a plugin's payload, or the kernel's `iptables-save`),
//! walks the chains a packet meets, and says which endpoints it can reach
//! (every `statistic` branch is followed), or whether it is dropped,
//! rejected or accepted untouched, and whether it is masqueraded.
//!
//! Like upstream's test tracer it recognises the rule shapes kube-proxy
//! writes and fails loudly on others; rules that depend on history
//! (`recent --rcheck`) never match.

mod iptables;
pub mod nftables;
mod parse;

pub use iptables::trace_iptables;
pub use parse::{ParsedRuleset, TraceError, parse_ruleset};

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use crate::model::{Protocol, join_host_port};

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
    /// Masqueraded on every path that reaches an endpoint or is accepted.
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

/// One rule a packet met on its way, for explanations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub table: String,
    pub chain: String,
    pub line: usize,
    pub text: String,
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
