//! The host's check of every ruleset before it reaches the kernel. A
//! sandbox stops a plugin from touching the host; this stops it from
//! asking the host to write a harmful rule.

mod iptables;
mod nftables;

pub use iptables::check_iptables;
pub use nftables::check_nftables;

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    pub endpoints: EndpointSet,
    /// Chains the kernel already holds from earlier syncs, by table.
    pub existing_chains: BTreeMap<String, BTreeSet<String>>,
}

/// The endpoints (address, port) of the state, each counted once per
/// service port that has it, so that the set follows changes without being
/// rebuilt from every port on each sync.
#[derive(Debug, Default, Clone)]
pub struct EndpointSet(HashMap<(IpAddr, u16), u32>);

impl EndpointSet {
    pub fn contains(&self, endpoint: &(IpAddr, u16)) -> bool {
        self.0.contains_key(endpoint)
    }

    pub fn add(&mut self, endpoint: (IpAddr, u16)) {
        *self.0.entry(endpoint).or_default() += 1;
    }

    /// Takes back one [`EndpointSet::add`]; the endpoint leaves with the last.
    pub fn remove(&mut self, endpoint: &(IpAddr, u16)) {
        if let Some(n) = self.0.get_mut(endpoint) {
            *n -= 1;
            if *n == 0 {
                self.0.remove(endpoint);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Extend<(IpAddr, u16)> for EndpointSet {
    fn extend<I: IntoIterator<Item = (IpAddr, u16)>>(&mut self, iter: I) {
        iter.into_iter().for_each(|e| self.add(e));
    }
}

impl FromIterator<(IpAddr, u16)> for EndpointSet {
    fn from_iter<I: IntoIterator<Item = (IpAddr, u16)>>(iter: I) -> Self {
        let mut set = EndpointSet::default();
        set.extend(iter);
        set
    }
}

impl Context {
    fn reject(&self, line: usize, text: &str, reason: impl Into<String>) -> Rejected {
        Rejected { plugin: self.plugin.clone(), line, text: text.to_string(), reason: reason.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::EndpointSet;

    #[test]
    fn an_endpoint_shared_by_two_ports_stays_until_both_let_go() {
        let ep = ("10.1.0.5".parse().unwrap(), 8080);
        let mut set: EndpointSet = [ep, ep].into_iter().collect();
        assert_eq!(set.len(), 1);
        set.remove(&ep);
        assert!(set.contains(&ep));
        set.remove(&ep);
        assert!(!set.contains(&ep) && set.is_empty());
        set.remove(&ep);
        assert!(set.is_empty());
    }
}
