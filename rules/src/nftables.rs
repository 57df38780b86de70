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
mod command_line;
mod elements;
mod layout;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use crate::model::{Backend, Change, Cluster, IpFamily, Node, Ruleset, ServicePort, Settings};
use crate::service_set::ServiceSet;

pub use command_line::{CommandLine, command_lines};
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

/// Text that is cloned often (set names, keys, values): a reference count.
pub type Text = Arc<str>;

/// One element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    pub set: Text,
    pub key: Text,
    pub value: Option<Text>,
}

/// Set and map names, shared: each name is allocated once.
#[derive(Debug, Default)]
pub struct Names(RefCell<HashSet<Text>>);

impl Names {
    pub fn get(&self, name: &str) -> Text {
        let mut names = self.0.borrow_mut();
        if let Some(known) = names.get(name) {
            return known.clone();
        }
        let text: Text = Arc::from(name);
        names.insert(text.clone());
        text
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

/// (set, key) → the services contributing it, sorted by key, with their
/// values; the first one's element is in the kernel.
type Registry = HashMap<(Text, Text), Contributors>;
type Contributors = Vec<(Text, Option<Text>)>;

fn contribute(registry: &mut Registry, e: &Element, service: &Text) {
    let list = registry.entry((e.set.clone(), e.key.clone())).or_default();
    match list.binary_search_by(|(k, _)| k.cmp(service)) {
        Ok(i) => list[i].1 = e.value.clone(),
        Err(i) => list.insert(i, (service.clone(), e.value.clone())),
    }
}

fn withdraw(registry: &mut Registry, e: &Element, service: &Text) {
    let id = (e.set.clone(), e.key.clone());
    if let Some(list) = registry.get_mut(&id) {
        list.retain(|(k, _)| k != service);
        if list.is_empty() {
            registry.remove(&id);
        }
    }
}

/// The value in the kernel for (set, key): None if absent.
fn effective(registry: &Registry, id: &(Text, Text)) -> Option<Option<Text>> {
    registry.get(id).and_then(|l| l.first()).map(|(_, v)| v.clone())
}

/// The nftables rule generator for one IP family.
#[derive(Debug)]
pub struct NftablesProxier {
    settings: Settings,
    node: Node,
    cluster: Cluster,
    services: ServiceSet,
    /// Each service's contribution at the last render.
    contributed: BTreeMap<String, Contribution>,
    /// Which services contribute each element; the first contributor's
    /// element is the one in the kernel.
    registry: Registry,
    /// Endpoint maps the kernel has.
    counts: BTreeSet<CountMap>,
    /// Node or cluster facts changed: the next render is full.
    layout_changed: bool,
    names: Names,
}

impl NftablesProxier {
    fn fam(&self) -> Fam {
        Fam(self.settings.family)
    }

    fn full(&mut self) -> String {
        let fam = self.fam();
        self.contributed.clear();
        self.registry.clear();
        let ctx = elements::Context { settings: &self.settings, node: &self.node, names: &self.names };
        for (key, svc) in self.services.iter() {
            let c = elements::contribution(&ctx, svc);
            let service: Text = Arc::from(key.as_str());
            for e in &c.elements {
                contribute(&mut self.registry, e, &service);
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
        // Every element once, from its first contributor, in service order.
        let mut writer = ElementWriter::new(fam, "add");
        for (key, c) in &self.contributed {
            for e in &c.elements {
                let first = self.registry.get(&(e.set.clone(), e.key.clone())).and_then(|l| l.first());
                if first.is_some_and(|(k, _)| &**k == key.as_str()) {
                    writer.push(e);
                }
            }
        }
        out.extend(writer.finish());
        out.extend(layout.static_elements(&self.names));
        join(out)
    }

    fn partial(&mut self) -> String {
        let fam = self.fam();
        let ctx = elements::Context { settings: &self.settings, node: &self.node, names: &self.names };
        let mut touched: BTreeSet<(Text, Text)> = BTreeSet::new();
        let mut before: BTreeMap<(Text, Text), Option<Option<Text>>> = BTreeMap::new();
        let mut flushes = Vec::new();
        let mut stale_objects = Vec::new();
        let mut new_objects = Vec::new();
        for key in self.services.take_changed() {
            let service: Text = Arc::from(key.as_str());
            let old = self.contributed.remove(&key).unwrap_or_default();
            let new = self.services.get(&key).map(|svc| elements::contribution(&ctx, svc)).unwrap_or_default();
            for e in old.elements.iter().chain(&new.elements) {
                let id = (e.set.clone(), e.key.clone());
                if touched.insert(id.clone()) {
                    before.insert(id.clone(), effective(&self.registry, &id));
                }
            }
            for e in &old.elements {
                withdraw(&mut self.registry, e, &service);
            }
            for e in &new.elements {
                contribute(&mut self.registry, e, &service);
            }
            if old.objects != new.objects {
                flushes.extend(old.objects.flushes(fam));
                stale_objects.extend(old.objects.stale_against(&new.objects, fam));
                new_objects.push(new.objects.clone());
            }
            if self.services.contains(&key) {
                self.contributed.insert(key, new);
            }
        }
        let mut deletes = Vec::new();
        let mut adds = Vec::new();
        for id in touched {
            let old = before.remove(&id).flatten();
            let new = effective(&self.registry, &id);
            if old == new {
                continue;
            }
            if let Some(v) = old {
                deletes.push(Element { set: id.0.clone(), key: id.1.clone(), value: v });
            }
            if let Some(v) = new {
                adds.push(Element { set: id.0, key: id.1, value: v });
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

/// Writes `add|delete element <fam> kube-proxy <set> { e, e, ... }`
/// commands, batched per set, straight into their text.
pub struct ElementWriter {
    prefix: String,
    delete: bool,
    open: BTreeMap<Text, (String, usize)>,
    done: Vec<String>,
}

impl ElementWriter {
    pub fn new(fam: Fam, verb: &str) -> ElementWriter {
        ElementWriter {
            prefix: fam.cmd(verb, "element"),
            delete: verb == "delete",
            open: BTreeMap::new(),
            done: Vec::new(),
        }
    }

    pub fn push(&mut self, e: &Element) {
        let (body, n) = self.open.entry(e.set.clone()).or_default();
        if *n > 0 {
            body.push_str(", ");
        }
        body.push_str(&e.key);
        // Deletes name keys only.
        if let (false, Some(value)) = (self.delete, &e.value) {
            body.push_str(" : ");
            body.push_str(value);
        }
        *n += 1;
        if *n == ELEMENTS_PER_COMMAND {
            self.done.push(format!("{} {} {{ {body} }}", self.prefix, e.set));
            body.clear();
            *n = 0;
        }
    }

    pub fn finish(mut self) -> Vec<String> {
        for (set, (body, n)) in std::mem::take(&mut self.open) {
            if n > 0 {
                self.done.push(format!("{} {set} {{ {body} }}", self.prefix));
            }
        }
        self.done
    }
}

/// The commands for a list of elements.
pub fn element_commands(fam: Fam, verb: &str, elements: &[Element]) -> Vec<String> {
    let mut writer = ElementWriter::new(fam, verb);
    for e in elements {
        writer.push(e);
    }
    writer.finish()
}

impl Backend for NftablesProxier {
    fn new(settings: Settings) -> Self {
        NftablesProxier {
            settings,
            node: Node::default(),
            cluster: Cluster::default(),
            services: ServiceSet::default(),
            contributed: BTreeMap::new(),
            registry: HashMap::new(),
            counts: BTreeSet::new(),
            layout_changed: true,
            names: Names::default(),
        }
    }

    fn reset(&mut self, node: Node, cluster: Cluster, services: Vec<ServicePort>) {
        self.node = node;
        self.cluster = cluster;
        self.services.replace(services);
        self.layout_changed = true;
    }

    fn apply(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Upsert(svc) => self.services.upsert(svc),
                Change::Remove(key) => self.services.remove(key),
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
            self.services.take_changed();
            self.full()
        } else {
            self.partial()
        };
        Ok(Ruleset::Nftables(text))
    }
}

#[cfg(test)]
mod tests;
