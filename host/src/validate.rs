//! The host's check of every ruleset before it reaches the kernel. A
//! sandbox stops a plugin from touching the host; this stops it from
//! asking the host to write a harmful rule.

mod iptables;
mod nftables;

pub use iptables::check_iptables;
pub use nftables::check_nftables;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

/// A refused ruleset: nothing of it is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugin {plugin}: ruleset refused at line {line}: {reason}: {text}")]
pub struct Rejected {
    pub plugin: String,
    /// 1-based line number in the payload.
    pub line: usize,
    pub text: String,
    pub reason: String,
}

/// What a ruleset is checked against.
#[derive(Debug, Default)]
pub struct Context {
    pub plugin: String,
    /// Every endpoint (address, port) of the state; DNAT may only go there.
    pub endpoints: HashSet<(IpAddr, u16)>,
    /// Chains the kernel already holds from earlier syncs, by table.
    pub existing_chains: BTreeMap<String, BTreeSet<String>>,
}

impl Context {
    fn reject(&self, line: usize, text: &str, reason: impl Into<String>) -> Rejected {
        Rejected { plugin: self.plugin.clone(), line, text: text.to_string(), reason: reason.into() }
    }
}
