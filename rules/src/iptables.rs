//! The iptables backend: upstream kube-proxy's per-service chains as typed
//! rules ([`crate::ops::iptables`]). The host writes the chains that are
//! not about one Service (its frame) and renders everything as one
//! iptables-restore payload; plugins/iptables/README.md lists which names
//! are public.

mod service;

pub use service::{local_traffic_match, slot_matches};

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::model::{Backend, Change, Cluster, Node, Protocol, ServicePort, Settings};
use crate::ops::Ruleset as AnyRuleset;
use crate::ops::iptables::{Ruleset, Table};
use crate::service_set::ServiceSet;

/// Above this many endpoints, per-endpoint rules carry no comments.
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// The iptables rule generator for one IP family.
#[derive(Debug)]
pub struct IptablesProxier {
    settings: Settings,
    node: Node,
    services: ServiceSet,
    /// The nat chains each service owned at the last render.
    rendered: BTreeMap<String, Vec<String>>,
    /// Large-cluster mode at the last render; a flip rewrites everything.
    large_cluster: Option<bool>,
    /// Each service port's chain-name hash (of its key and protocol), kept
    /// while the port exists: partial renders rewrite every port's
    /// KUBE-SERVICES rules and need not hash them again.
    hashes: FxHashMap<String, (Protocol, String)>,
    /// `probabilities[n]` = `probability_one_in(n)`, grown as needed.
    probabilities: Vec<u32>,
}

impl IptablesProxier {
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    fn render_ruleset(&mut self, full: bool) -> Ruleset {
        let mut total = 0;
        let mut most = 1;
        for s in self.services.values() {
            total += s.endpoints.len();
            most = most.max(s.endpoints.len());
        }
        let large_cluster = total > LARGE_CLUSTER_ENDPOINTS;
        let full = full || self.large_cluster != Some(large_cluster);
        self.large_cluster = Some(large_cluster);
        let changed = self.services.take_changed();
        while self.probabilities.len() <= most {
            self.probabilities.push(crate::ops::probability_one_in(self.probabilities.len()));
        }

        let mut out = Ruleset::default();
        let ctx = service::Context {
            settings: &self.settings,
            node: &self.node,
            large_cluster,
            probabilities: &self.probabilities,
        };
        if full {
            self.rendered.clear();
            self.hashes.retain(|key, _| self.services.contains(key));
        }
        for (key, svc) in self.services.iter() {
            let hash = match self.hashes.get(key) {
                Some((proto, hash)) if *proto == svc.protocol => hash,
                _ => {
                    let hash = crate::hash::service_hash(key, svc.protocol.as_str());
                    &self.hashes.entry(key.clone()).insert_entry((svc.protocol, hash)).into_mut().1
                }
            };
            let write = full || changed.contains(key);
            let chains = service::write(&ctx, svc, hash, write, &mut out);
            if !write {
                continue;
            }
            // Chains the service no longer owns: flush and delete them (on
            // a full render the host deletes every own chain not declared).
            let previous =
                if chains.is_empty() { self.rendered.remove(key) } else { self.rendered.insert(key.clone(), chains) };
            if let Some(previous) = previous.filter(|_| !full) {
                let current: BTreeSet<&String> = self.rendered.get(key).into_iter().flatten().collect();
                for chain in previous.iter().filter(|c| !current.contains(c)) {
                    out.delete(Table::Nat, chain);
                }
            }
        }
        // Services that left: their chains go.
        for key in changed.iter().filter(|k| !self.services.contains(k)) {
            self.hashes.remove(key);
            if let Some(previous) = self.rendered.remove(key).filter(|_| !full) {
                for chain in &previous {
                    out.delete(Table::Nat, chain);
                }
            }
        }
        out
    }
}

impl Backend for IptablesProxier {
    fn new(settings: Settings) -> Self {
        IptablesProxier {
            settings,
            node: Node::default(),
            services: ServiceSet::default(),
            rendered: BTreeMap::new(),
            large_cluster: None,
            hashes: FxHashMap::default(),
            probabilities: Vec::new(),
        }
    }

    fn reset(&mut self, node: Node, _cluster: Cluster, services: Vec<ServicePort>) {
        self.node = node;
        self.services.replace(services);
    }

    fn apply(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Upsert(svc) => self.services.upsert(svc),
                Change::Remove(key) => self.services.remove(key),
                Change::Cluster(_) => {}
                Change::Node(node) => {
                    // The node's address decides KUBE-FW- rules: rewrite all.
                    self.services.mark_all_changed();
                    self.node = node;
                }
            }
        }
    }

    fn render(&mut self, full: bool) -> Result<AnyRuleset, String> {
        Ok(AnyRuleset::Iptables(self.render_ruleset(full)))
    }
}

#[cfg(test)]
mod tests;
