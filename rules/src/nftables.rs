//! The nftables backend: table `kube-proxy` in the ip and ip6 families,
//! designed so that the number of chains does not grow with endpoints, nor
//! (affinity aside) with services: service dispatch and endpoint choice go
//! through verdict maps and endpoint maps whose elements are the services
//! and endpoints. plugins/nftables/README.md documents the layout.
//!
//! Output is nft commands, one per line, each naming family and table,
//! applied with `nft -f -` as one transaction. A full render flushes the
//! table and writes everything; a partial render writes only element adds
//! and deletes (plus, rarely, a map for a new endpoint count or a changed
//! affinity Service's chains), so its size does not depend on how many
//! Services there are.

mod affinity;
mod elements;
mod layout;

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Backend, Change, Cluster, IpFamily, Node, Ruleset, ServicePort, Settings};

pub use elements::{CountMap, Purpose};

/// The table, in both families.
pub const TABLE: &str = "kube-proxy";

/// Elements per `add element` command.
const ELEMENTS_PER_COMMAND: usize = 1000;

/// Family-dependent spellings.
#[derive(Debug, Clone, Copy)]
pub struct Fam(pub IpFamily);

impl Fam {
    pub fn name(self) -> &'static str {
        match self.0 {
            IpFamily::V4 => "ip",
            IpFamily::V6 => "ip6",
        }
    }
    pub fn addr_type(self) -> &'static str {
        match self.0 {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        }
    }
    pub fn loopback(self) -> &'static str {
        match self.0 {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1",
        }
    }
    /// `add <what> <family> kube-proxy`
    pub fn cmd(self, verb: &str, what: &str) -> String {
        format!("{verb} {what} {} {TABLE}", self.name())
    }
}

/// One element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    pub set: String,
    pub key: String,
    pub value: Option<String>,
}

impl Element {
    fn text(&self) -> String {
        match &self.value {
            Some(v) => format!("{} : {v}", self.key),
            None => self.key.clone(),
        }
    }
}

/// What one service port puts into the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contribution {
    pub elements: Vec<Element>,
    /// The endpoint maps it needs.
    pub counts: BTreeSet<CountMap>,
    /// Its own chains and sets (affinity only).
    pub objects: affinity::Objects,
}

/// (set, key) → contributing service → value.
type Registry = BTreeMap<(String, String), Contributors>;
type Contributors = BTreeMap<String, Option<String>>;

/// The nftables rule generator for one IP family.
#[derive(Debug)]
pub struct NftablesProxier {
    settings: Settings,
    node: Node,
    cluster: Cluster,
    services: BTreeMap<String, ServicePort>,
    changed: BTreeSet<String>,
    /// Each service's contribution at the last render.
    contributed: BTreeMap<String, Contribution>,
    /// Which services contribute each element; the first contributor's
    /// element is the one in the kernel.
    registry: Registry,
    /// Endpoint maps the kernel has.
    counts: BTreeSet<CountMap>,
    /// Node or cluster facts changed: the next render is full.
    layout_changed: bool,
}

impl NftablesProxier {
    fn fam(&self) -> Fam {
        Fam(self.settings.family)
    }

    fn effective(entry: &Contributors) -> Option<&Option<String>> {
        entry.values().next()
    }

    fn full(&mut self) -> String {
        let fam = self.fam();
        self.contributed.clear();
        self.registry.clear();
        let ctx = elements::Context { settings: &self.settings, node: &self.node };
        for (key, svc) in &self.services {
            let c = elements::contribution(&ctx, svc);
            for e in &c.elements {
                self.registry.entry((e.set.clone(), e.key.clone())).or_default().insert(key.clone(), e.value.clone());
            }
            self.contributed.insert(key.clone(), c);
        }
        self.counts = self.contributed.values().flat_map(|c| c.counts.iter().copied()).collect();

        let mut out = Vec::new();
        out.push(format!("{} {{ comment \"rules for kube-proxy\" ; }}", fam.cmd("add", "table")));
        out.push(fam.cmd("flush", "table"));
        let layout = layout::Layout { fam, settings: &self.settings, cluster: &self.cluster };
        out.extend(layout.declarations());
        for &map in &self.counts {
            out.push(elements::count_map_declaration(fam, map));
        }
        for c in self.contributed.values() {
            out.extend(c.objects.declarations(fam));
        }
        out.extend(layout.rules());
        for &map in &self.counts {
            out.push(elements::count_rule(fam, map));
        }
        for c in self.contributed.values() {
            out.extend(c.objects.rules.iter().cloned());
        }
        let effective: Vec<Element> = self
            .registry
            .iter()
            .filter_map(|((set, key), entry)| {
                Self::effective(entry).map(|v| Element { set: set.clone(), key: key.clone(), value: v.clone() })
            })
            .collect();
        out.extend(element_commands(fam, "add", &effective));
        out.extend(layout.static_elements());
        join(out)
    }

    fn partial(&mut self) -> String {
        let fam = self.fam();
        let ctx = elements::Context { settings: &self.settings, node: &self.node };
        let mut touched: BTreeSet<(String, String)> = BTreeSet::new();
        let mut before: BTreeMap<(String, String), Option<Option<String>>> = BTreeMap::new();
        let mut flushes = Vec::new();
        let mut stale_objects = Vec::new();
        let mut new_objects = Vec::new();
        for key in std::mem::take(&mut self.changed) {
            let old = self.contributed.remove(&key).unwrap_or_default();
            let new = self.services.get(&key).map(|svc| elements::contribution(&ctx, svc)).unwrap_or_default();
            for e in old.elements.iter().chain(&new.elements) {
                let k = (e.set.clone(), e.key.clone());
                if touched.insert(k.clone()) {
                    before.insert(k.clone(), self.registry.get(&k).and_then(Self::effective).cloned());
                }
            }
            for e in &old.elements {
                let k = (e.set.clone(), e.key.clone());
                if let Some(entry) = self.registry.get_mut(&k) {
                    entry.remove(&key);
                    if entry.is_empty() {
                        self.registry.remove(&k);
                    }
                }
            }
            for e in &new.elements {
                self.registry.entry((e.set.clone(), e.key.clone())).or_default().insert(key.clone(), e.value.clone());
            }
            if old.objects != new.objects {
                flushes.extend(old.objects.flushes(fam));
                stale_objects.extend(old.objects.stale_against(&new.objects, fam));
                new_objects.push(new.objects.clone());
            }
            if self.services.contains_key(&key) {
                self.contributed.insert(key, new);
            }
        }
        let mut deletes = Vec::new();
        let mut adds = Vec::new();
        for k in touched {
            let old = before.remove(&k).flatten();
            let new = self.registry.get(&k).and_then(Self::effective).cloned();
            if old == new {
                continue;
            }
            if let Some(v) = old {
                deletes.push(Element { set: k.0.clone(), key: k.1.clone(), value: v });
            }
            if let Some(v) = new {
                adds.push(Element { set: k.0, key: k.1, value: v });
            }
        }
        let mut out = vec![format!("{} {{ comment \"rules for kube-proxy\" ; }}", fam.cmd("add", "table"))];
        // Deletes first: an element must go before the chain it names.
        out.extend(element_commands(fam, "delete", &deletes));
        out.extend(flushes);
        out.extend(stale_objects);
        let needed: BTreeSet<CountMap> = self.contributed.values().flat_map(|c| c.counts.iter().copied()).collect();
        let new_counts: Vec<CountMap> = needed.difference(&self.counts).copied().collect();
        for &map in &new_counts {
            out.push(elements::count_map_declaration(fam, map));
        }
        for objects in &new_objects {
            out.extend(objects.declarations(fam));
        }
        for &map in &new_counts {
            out.push(elements::count_rule(fam, map));
        }
        for objects in &new_objects {
            out.extend(objects.rules.iter().cloned());
        }
        self.counts.extend(new_counts);
        out.extend(element_commands(fam, "add", &adds));
        join(out)
    }
}

fn join(lines: Vec<String>) -> String {
    let mut out = String::with_capacity(lines.iter().map(|l| l.len() + 1).sum());
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// `add|delete element <fam> kube-proxy <set> { e, e, ... }`, batched.
pub fn element_commands(fam: Fam, verb: &str, elements: &[Element]) -> Vec<String> {
    let mut by_set: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for e in elements {
        // Deletes name keys only.
        let text = if verb == "delete" { e.key.clone() } else { e.text() };
        by_set.entry(&e.set).or_default().push(text);
    }
    let mut out = Vec::new();
    for (set, items) in by_set {
        for chunk in items.chunks(ELEMENTS_PER_COMMAND) {
            out.push(format!("{} {set} {{ {} }}", fam.cmd(verb, "element"), chunk.join(", ")));
        }
    }
    out
}

impl Backend for NftablesProxier {
    fn new(settings: Settings) -> Self {
        NftablesProxier {
            settings,
            node: Node::default(),
            cluster: Cluster::default(),
            services: BTreeMap::new(),
            changed: BTreeSet::new(),
            contributed: BTreeMap::new(),
            registry: BTreeMap::new(),
            counts: BTreeSet::new(),
            layout_changed: true,
        }
    }

    fn reset(&mut self, node: Node, cluster: Cluster, services: Vec<ServicePort>) {
        self.node = node;
        self.cluster = cluster;
        self.services = services.into_iter().map(|s| (s.key.clone(), s)).collect();
        self.layout_changed = true;
    }

    fn apply(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Upsert(svc) => {
                    self.changed.insert(svc.key.clone());
                    self.services.insert(svc.key.clone(), svc);
                }
                Change::Remove(key) => {
                    self.services.remove(&key);
                    self.changed.insert(key);
                }
                Change::Node(node) => {
                    self.node = node;
                    self.layout_changed = true;
                }
                Change::Cluster(cluster) => {
                    self.cluster = cluster;
                    self.layout_changed = true;
                }
            }
        }
    }

    fn render(&mut self, full: bool) -> Result<Ruleset, String> {
        let text = if full || self.layout_changed {
            self.layout_changed = false;
            self.changed.clear();
            self.full()
        } else {
            self.partial()
        };
        Ok(Ruleset::Nftables(text))
    }
}

#[cfg(test)]
mod tests;
