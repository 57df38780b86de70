//! The iptables backend: upstream kube-proxy's per-service chains as typed
//! rules ([`crate::ops::iptables`]). The host writes the chains that are
//! not about one Service (its frame) and renders everything as one
//! iptables-restore payload; plugins/iptables/README.md lists which names
//! are public.

mod service;

pub use service::{local_traffic_match, slot_matches};

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::backend::Backend;
use crate::model::{Change, Cluster, Node, Protocol, ServicePort, Settings};
use crate::ops::Ruleset as AnyRuleset;
use crate::ops::iptables::{Hook, Rule, Ruleset, Table};
use crate::service_set::ServiceSet;

/// Above this many endpoints, per-endpoint rules carry no comments.
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// The iptables rule generator for one IP family.
#[derive(Debug)]
pub struct IptablesProxier {
    settings: Settings,
    node: Node,
    services: ServiceSet,
    /// Large-cluster mode at the last render; a flip rewrites everything.
    large_cluster: Option<bool>,
    /// `probabilities[n]` = `probability_one_in(n)`, grown as needed.
    probabilities: Vec<u32>,
    ports: Remembered,
}

/// What the generator keeps of each service port between renders.
#[derive(Debug, Default)]
struct Remembered {
    /// The nat chains each port owned at the last render.
    chains: BTreeMap<String, Vec<String>>,
    /// Each port's chain-name hash (of its key and protocol), kept while
    /// the port exists: a render that writes every port's KUBE-SERVICES
    /// rules need not hash them again.
    hashes: FxHashMap<String, (Protocol, String)>,
    /// Each port's rules in the host's hooks at the last render. A
    /// partial render whose changed ports have the same ones keeps every
    /// hook (`kept_hooks`): a one-endpoint change then sends its own
    /// chains, not 10,000 KUBE-SERVICES rules.
    hooked: FxHashMap<String, Vec<Rule>>,
}

impl Remembered {
    /// The chain-name hash of a port, kept while it keeps its protocol.
    fn hash_of(&mut self, key: &str, svc: &ServicePort) -> &str {
        match self.hashes.get(key) {
            Some((proto, _)) if *proto == svc.protocol => &self.hashes[key].1,
            _ => {
                let hash = crate::hash::service_hash(key, svc.protocol.as_str());
                &self.hashes.entry(key.to_string()).insert_entry((svc.protocol, hash)).into_mut().1
            }
        }
    }

    /// Records the nat chains a written port owns; on a partial render,
    /// deletes those it no longer owns (on a full one the host deletes
    /// every own chain not declared).
    fn owns(&mut self, key: &str, chains: Vec<String>, full: bool, out: &mut Ruleset) {
        let previous =
            if chains.is_empty() { self.chains.remove(key) } else { self.chains.insert(key.to_string(), chains) };
        if let Some(previous) = previous.filter(|_| !full) {
            let current: BTreeSet<&String> = self.chains.get(key).into_iter().flatten().collect();
            for chain in previous.iter().filter(|c| !current.contains(c)) {
                out.delete(Table::Nat, chain);
            }
        }
    }

    /// Forgets a port that left; on a partial render its chains go.
    fn forget(&mut self, key: &str, full: bool, out: &mut Ruleset) {
        self.hashes.remove(key);
        self.hooked.remove(key);
        if let Some(previous) = self.chains.remove(key).filter(|_| !full) {
            for chain in &previous {
                out.delete(Table::Nat, chain);
            }
        }
    }
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
        // A flip rewrites everything; on the host's partial sync, the
        // chains no port owns any more are deleted by name (the host
        // deletes undeclared chains only on its full syncs).
        let flipped = !full && self.large_cluster.is_some_and(|was| was != large_cluster);
        let full = full || self.large_cluster != Some(large_cluster);
        self.large_cluster = Some(large_cluster);
        let changed = self.services.take_changed();
        while self.probabilities.len() <= most {
            self.probabilities.push(crate::ops::probability_one_in(self.probabilities.len()));
        }

        let ctx = service::Context {
            settings: &self.settings,
            node: &self.node,
            large_cluster,
            probabilities: &self.probabilities,
        };
        if !full && let Some(out) = keep_hooks(&ctx, &self.services, &changed, &mut self.ports) {
            return out;
        }
        let mut out = Ruleset::default();
        let before = if flipped { std::mem::take(&mut self.ports.chains) } else { BTreeMap::new() };
        if full {
            self.ports.chains.clear();
            self.ports.hashes.retain(|key, _| self.services.contains(key));
            self.ports.hooked.clear();
        }
        for (key, svc) in self.services.iter() {
            let hash = self.ports.hash_of(key, svc);
            let write = full || changed.contains(key);
            let at = out.rules.len();
            let chains = service::write(&ctx, svc, hash, write, &mut out);
            let hooked: Vec<Rule> = out.rules[at..].iter().filter(|r| is_hooked(r)).cloned().collect();
            self.ports.hooked.insert(key.clone(), hooked);
            if write {
                self.ports.owns(key, chains, full, &mut out);
            }
        }
        for key in changed.iter().filter(|k| !self.services.contains(k)) {
            self.ports.forget(key, full, &mut out);
        }
        // Only a flip leaves chains behind (`before` is empty otherwise):
        // the set of every chain is not built for nothing (120k names at
        // 10k x 10, sorted).
        if !before.is_empty() {
            let now: BTreeSet<&String> = self.ports.chains.values().flatten().collect();
            for chain in before.values().flatten().filter(|c| !now.contains(c)) {
                out.delete(Table::Nat, chain);
            }
        }
        out
    }
}

/// The partial render that keeps every hook, if the changed service
/// ports' hook rules are all as the last render left them (none left
/// that had some): their own chains and the chains they no longer own.
/// None when a hook changes: the caller renders every hook rule.
fn keep_hooks(
    ctx: &service::Context,
    services: &ServiceSet,
    changed: &BTreeSet<String>,
    ports: &mut Remembered,
) -> Option<Ruleset> {
    let mut out = Ruleset::default();
    let mut owned = Vec::new();
    for key in changed {
        let Some(svc) = services.get(key) else {
            if ports.hooked.get(key).is_some_and(|h| !h.is_empty()) {
                return None;
            }
            continue;
        };
        let at = out.rules.len();
        let chains = service::write(ctx, svc, ports.hash_of(key, svc), true, &mut out);
        let before = ports.hooked.get(key).map_or(&[][..], Vec::as_slice);
        if !out.rules[at..].iter().filter(|r| is_hooked(r)).eq(before.iter()) {
            return None;
        }
        owned.push((key, chains));
    }
    out.rules.retain(|r| !is_hooked(r));
    for (key, chains) in owned {
        ports.owns(key, chains, false, &mut out);
    }
    // Ports that left had no hook rules (no view in this family).
    for key in changed.iter().filter(|k| !services.contains(k)) {
        ports.forget(key, false, &mut out);
    }
    out.kept_hooks = Hook::ALL.to_vec();
    Some(out)
}

fn is_hooked(rule: &Rule) -> bool {
    Hook::of(rule.table, &rule.chain).is_some()
}

impl Backend for IptablesProxier {
    fn new(settings: Settings) -> Self {
        IptablesProxier {
            settings,
            node: Node::default(),
            services: ServiceSet::default(),
            large_cluster: None,
            probabilities: Vec::new(),
            ports: Remembered::default(),
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
