//! The iptables backend: upstream kube-proxy's per-service chains as typed
//! rules ([`crate::ops::iptables`]). The host writes the chains that are
//! not about one Service (its frame) and renders everything as one
//! iptables-restore payload; plugins/iptables/README.md lists which names
//! are public.

mod service;

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Backend, Change, Cluster, Node, ServicePort, Settings};
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
}

impl IptablesProxier {
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    fn render_ruleset(&mut self, full: bool) -> Ruleset {
        let total: usize = self.services.values().map(|s| s.endpoints.len()).sum();
        let large_cluster = total > LARGE_CLUSTER_ENDPOINTS;
        let full = full || self.large_cluster != Some(large_cluster);
        self.large_cluster = Some(large_cluster);
        let changed = self.services.take_changed();

        let mut out = Ruleset::default();
        let ctx = service::Context { settings: &self.settings, node: &self.node, large_cluster };
        let mut rendered = BTreeMap::new();
        for (key, svc) in self.services.iter() {
            let write = full || changed.contains(key);
            let chains = service::write(&ctx, svc, write, &mut out);
            let chains = if write { chains } else { self.rendered.get(key).cloned().unwrap_or_default() };
            if !chains.is_empty() {
                rendered.insert(key.clone(), chains);
            }
        }
        // Chains a service no longer owns: flush and delete them. On a full
        // render the host deletes every own chain not declared anyway.
        if !full {
            let empty = Vec::new();
            for (key, old) in &self.rendered {
                if !changed.contains(key) {
                    continue;
                }
                let current: BTreeSet<&String> = rendered.get(key).unwrap_or(&empty).iter().collect();
                for chain in old.iter().filter(|c| !current.contains(c)) {
                    out.delete(Table::Nat, chain);
                }
            }
        }
        self.rendered = rendered;
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
