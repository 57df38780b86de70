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
    /// The nat chains each service owned at the last render.
    rendered: BTreeMap<String, Vec<String>>,
    /// Large-cluster mode at the last render; a flip rewrites everything.
    large_cluster: Option<bool>,
    /// Each service port's chain-name hash (of its key and protocol), kept
    /// while the port exists: a render that writes every port's
    /// KUBE-SERVICES rules need not hash them again.
    hashes: FxHashMap<String, (Protocol, String)>,
    /// `probabilities[n]` = `probability_one_in(n)`, grown as needed.
    probabilities: Vec<u32>,
    /// Each service port's rules in the host's hooks at the last render.
    /// A partial render whose changed ports have the same ones keeps
    /// every hook (`kept_hooks`): a one-endpoint change then sends its
    /// own chains, not 10,000 KUBE-SERVICES rules.
    hooked: FxHashMap<String, Vec<Rule>>,
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
        if !full
            && let Some(out) =
                keep_hooks(&ctx, &self.services, &changed, &mut self.hashes, &mut self.hooked, &mut self.rendered)
        {
            return out;
        }
        let mut out = Ruleset::default();
        let before = if flipped { std::mem::take(&mut self.rendered) } else { BTreeMap::new() };
        if full {
            self.rendered.clear();
            self.hashes.retain(|key, _| self.services.contains(key));
            self.hooked.clear();
        }
        for (key, svc) in self.services.iter() {
            let hash = hash_of(&mut self.hashes, key, svc);
            let write = full || changed.contains(key);
            let at = out.rules.len();
            let chains = service::write(&ctx, svc, hash, write, &mut out);
            let hooked: Vec<Rule> = out.rules[at..].iter().filter(|r| is_hooked(r)).cloned().collect();
            self.hooked.insert(key.clone(), hooked);
            if write {
                owns(&mut self.rendered, key, chains, full, &mut out);
            }
        }
        // Services that left: their chains go.
        for key in changed.iter().filter(|k| !self.services.contains(k)) {
            self.hashes.remove(key);
            self.hooked.remove(key);
            if let Some(previous) = self.rendered.remove(key).filter(|_| !full) {
                for chain in &previous {
                    out.delete(Table::Nat, chain);
                }
            }
        }
        let now: BTreeSet<&String> = self.rendered.values().flatten().collect();
        for chain in before.values().flatten().filter(|c| !now.contains(c)) {
            out.delete(Table::Nat, chain);
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
    hashes: &mut FxHashMap<String, (Protocol, String)>,
    hooked: &mut FxHashMap<String, Vec<Rule>>,
    rendered: &mut BTreeMap<String, Vec<String>>,
) -> Option<Ruleset> {
    let mut out = Ruleset::default();
    let mut owned = Vec::new();
    for key in changed {
        let before = hooked.get(key).map_or(&[][..], Vec::as_slice);
        let Some(svc) = services.get(key) else {
            if !before.is_empty() {
                return None;
            }
            continue;
        };
        let hash = hash_of(hashes, key, svc);
        let at = out.rules.len();
        let chains = service::write(ctx, svc, hash, true, &mut out);
        if !out.rules[at..].iter().filter(|r| is_hooked(r)).eq(before.iter()) {
            return None;
        }
        owned.push((key, chains));
    }
    out.rules.retain(|r| !is_hooked(r));
    for (key, chains) in owned {
        owns(rendered, key, chains, false, &mut out);
    }
    // Ports that left with no hook rules (no view in this family) own no
    // chains either; nothing else of theirs is kept.
    for key in changed.iter().filter(|k| !services.contains(k)) {
        hashes.remove(key);
        hooked.remove(key);
        if let Some(previous) = rendered.remove(key) {
            for chain in &previous {
                out.delete(Table::Nat, chain);
            }
        }
    }
    out.kept_hooks = Hook::ALL.to_vec();
    Some(out)
}

/// The chain-name hash of a service port (its key and protocol), kept
/// while the port keeps its protocol.
fn hash_of<'h>(hashes: &'h mut FxHashMap<String, (Protocol, String)>, key: &str, svc: &ServicePort) -> &'h str {
    match hashes.get(key) {
        Some((proto, _)) if *proto == svc.protocol => &hashes[key].1,
        _ => {
            let hash = crate::hash::service_hash(key, svc.protocol.as_str());
            &hashes.entry(key.to_string()).insert_entry((svc.protocol, hash)).into_mut().1
        }
    }
}

fn is_hooked(rule: &Rule) -> bool {
    Hook::of(rule.table, &rule.chain).is_some()
}

/// Records the nat chains a written service port owns; on a partial
/// render, deletes those it no longer owns (on a full one the host
/// deletes every own chain not declared).
fn owns(rendered: &mut BTreeMap<String, Vec<String>>, key: &str, chains: Vec<String>, full: bool, out: &mut Ruleset) {
    let previous = if chains.is_empty() { rendered.remove(key) } else { rendered.insert(key.to_string(), chains) };
    if let Some(previous) = previous.filter(|_| !full) {
        let current: BTreeSet<&String> = rendered.get(key).into_iter().flatten().collect();
        for chain in previous.iter().filter(|c| !current.contains(c)) {
            out.delete(Table::Nat, chain);
        }
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
            hooked: FxHashMap::default(),
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
