//! The nftables backend, on the host's table `kube-proxy` (ip and ip6),
//! designed so that the number of chains does not grow with endpoints, nor
//! (affinity aside) with services: the host's dispatch maps send Service
//! traffic to a few shared chains, and endpoint choice goes through
//! endpoint maps whose elements are the endpoints.
//! plugins/nftables/README.md documents the layout.
//!
//! Output is a typed transaction ([`crate::ops::nftables`]). A full render
//! declares everything (the host empties the table first); a partial
//! render is element adds and deletes (plus, rarely, a map for a new
//! endpoint count or a changed affinity Service's objects), so its size
//! does not depend on how many Services there are.

mod affinity;
mod elements;
mod layout;
mod registry;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

// FxHash for the names and the per-set element batches (and the
// registry's index): these are hashed per element, and SipHash
// costs several times more in WebAssembly (its keys come from the host).
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

use crate::backend::Backend;
use crate::model::{Change, Cluster, IpFamily, Node, ServicePort, Settings};
use crate::ops::Ruleset as AnyRuleset;
use crate::ops::nftables::{ElementWriter, Op, Transaction};
use crate::service_set::ServiceSet;

pub use affinity::hashed;
pub use elements::{CountMap, Elem, ElemData, EndpointWords, Purpose, Set, Text, Words, count_map};
pub use layout::CHAINS;

/// Set and chain names, shared: each name is allocated once.
#[derive(Debug, Default)]
pub struct Names(RefCell<FxHashSet<Text>>);

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

use elements::Contribution;
use registry::Registry;

/// What the generator keeps of a service's last contribution: the slots
/// of its elements in the registry (sorted, each once), the endpoint maps
/// it needs and its own objects.
#[derive(Debug, Default)]
struct Kept {
    slots: Vec<u32>,
    counts: Box<[CountMap]>,
    objects: affinity::Objects,
}

/// Element operations, one batch per set, the batches in set order.
struct ElementOps {
    family: IpFamily,
    sets: Vec<(Set, ElementWriter)>,
    index: FxHashMap<Set, usize>,
    /// The batch of the last push: runs of elements share a set.
    last: usize,
}

impl ElementOps {
    fn new(family: IpFamily) -> ElementOps {
        ElementOps { family, sets: Vec::new(), index: FxHashMap::default(), last: 0 }
    }

    fn push(&mut self, set: &Set, key: &Words, data: Option<&ElemData>) {
        let at = match self.sets.get(self.last) {
            Some((s, _)) if s == set => self.last,
            _ => match self.index.get(set) {
                Some(&i) => i,
                None => {
                    self.sets.push((set.clone(), ElementWriter::new(self.family, set.to_ref())));
                    self.index.insert(set.clone(), self.sets.len() - 1);
                    self.sets.len() - 1
                }
            },
        };
        self.last = at;
        let w = &mut self.sets[at].1;
        w.words(key.as_slice());
        match data {
            Some(ElemData::Endpoint(words)) => {
                w.words(words.as_slice());
            }
            Some(ElemData::Verdict(kind, chain)) => {
                w.verdict(*kind, chain.as_deref());
            }
            None => {}
        }
    }

    fn finish(mut self, delete: bool) -> impl Iterator<Item = Op> {
        self.sets.sort_by(|a, b| a.0.cmp(&b.0));
        self.sets
            .into_iter()
            .map(move |(_, w)| if delete { Op::DeleteElements(w.finish()) } else { Op::AddElements(w.finish()) })
    }
}

/// The nftables rule generator for one IP family.
#[derive(Debug)]
pub struct NftablesProxier {
    settings: Settings,
    node: Node,
    services: ServiceSet,
    /// What each service contributed at the last render.
    contributed: BTreeMap<String, Kept>,
    /// Which services contribute each element; the first contributor's
    /// element is the one in the kernel.
    registry: Registry,
    /// Endpoint maps the kernel has.
    counts: BTreeSet<CountMap>,
    /// Node facts changed: the next render is full.
    layout_changed: bool,
    names: Names,
}

impl Kept {
    fn new(mut slots: Vec<u32>, c: Contribution) -> Kept {
        // A service may name one element twice (an external IP listed
        // twice): one slot, withdrawn once.
        slots.sort_unstable();
        slots.dedup();
        slots.shrink_to_fit();
        Kept { slots, counts: c.counts.into_iter().collect(), objects: c.objects }
    }
}

/// The endpoint maps to declare for the maps `in_use`: each one and the
/// next size up. A new map needs a new rule in its select chain, and the
/// kernel validates the whole table on a transaction that adds a NAT rule
/// (3-4 ms at 10k Services x 10 in kpx's log of short runs, against
/// 0.1-0.2 ms for adding elements); with the next size already there, a Service gaining one
/// endpoint (a rolling update's surge pod, a scale-up by one) only moves
/// elements. A map with no elements costs a packet one lookup that misses.
fn with_headroom(in_use: impl Iterator<Item = CountMap>) -> BTreeSet<CountMap> {
    in_use.flat_map(|(purpose, proto, n)| [(purpose, proto, n), (purpose, proto, n + 1)]).collect()
}

/// The most elements a full render sizes the registry's index for up front.
const MAX_RESERVED_ELEMENTS: usize = 1 << 22;

impl NftablesProxier {
    fn full(&mut self) -> Transaction {
        // The index sized once, from a generous count of each service's
        // elements (a clear keeps its capacity for the next full render):
        // growing it rehashes every element again, which costs most in a
        // fresh instance. The slots grow a chunk at a time.
        self.contributed.clear();
        self.registry.clear();
        // Capped: past a few million elements the index may as well grow
        // (and an estimate of a hostile Service's must not fail the
        // reservation before any real work is done).
        let estimate = self.services.iter().map(|(_, svc)| elements::estimate(svc)).fold(0, usize::saturating_add);
        self.registry.reserve(estimate.min(MAX_RESERVED_ELEMENTS));
        let ctx = elements::Context { settings: &self.settings, node: &self.node };
        // Every element once, from its first contributor, in service order:
        // services come in key order, so a service that is first for an
        // element when it contributes it stays first. One service's
        // contribution at a time: the registry is what is kept.
        let mut adds = ElementOps::new(self.settings.family);
        for (key, svc) in self.services.iter() {
            let c = elements::contribution(&ctx, svc, &self.names);
            let service: Text = Arc::from(key.as_str());
            let mut slots = Vec::with_capacity(c.elements.len());
            for e in &c.elements {
                let (slot, first) = self.registry.contribute(e, &service);
                slots.push(slot);
                if first {
                    adds.push(&e.set, &e.key, e.data.as_ref());
                }
            }
            self.contributed.insert(key.clone(), Kept::new(slots, c));
        }
        self.counts = with_headroom(self.contributed.values().flat_map(|c| c.counts.iter().copied()));

        let mut out = Transaction::default();
        out.ops.extend(layout::declarations());
        for &map in &self.counts {
            out.push(Op::AddSet(elements::count_map_declaration(map)));
        }
        for c in self.contributed.values() {
            out.ops.extend(c.objects.declarations());
        }
        out.ops.extend(layout::rules(&self.settings));
        for &map in &self.counts {
            out.push(Op::AddRule(elements::count_rule(map)));
        }
        for c in self.contributed.values() {
            out.ops.extend(c.objects.rules.iter().cloned().map(Op::AddRule));
            out.ops.extend(c.objects.elements.iter().cloned().map(Op::AddElements));
        }
        out.ops.extend(adds.finish(false));
        out
    }

    fn partial(&mut self) -> Transaction {
        let family = self.settings.family;
        let ctx = elements::Context { settings: &self.settings, node: &self.node };
        let mut touched: BTreeSet<(Set, Words)> = BTreeSet::new();
        let mut before: BTreeMap<(Set, Words), Option<Option<ElemData>>> = BTreeMap::new();
        let mut flushes = Vec::new();
        let mut stale_objects = Vec::new();
        let mut new_objects = Vec::new();
        let mut changed_counts: BTreeSet<CountMap> = BTreeSet::new();
        for key in self.services.take_changed() {
            let service: Text = Arc::from(key.as_str());
            let old = self.contributed.remove(&key).unwrap_or_default();
            let new =
                self.services.get(&key).map(|svc| elements::contribution(&ctx, svc, &self.names)).unwrap_or_default();
            let old_ids = old.slots.iter().filter_map(|&slot| self.registry.element(slot));
            let new_ids = new.elements.iter().map(|e| (&e.set, e.key));
            for (set, words) in old_ids.chain(new_ids) {
                let id = (set.clone(), words);
                if !touched.contains(&id) {
                    before.insert(id.clone(), self.registry.effective(set, &words));
                    touched.insert(id);
                }
            }
            for &slot in &old.slots {
                self.registry.withdraw(slot, &service);
            }
            let slots = new.elements.iter().map(|e| self.registry.contribute(e, &service).0).collect();
            if old.objects != new.objects {
                flushes.extend(old.objects.flushes());
                stale_objects.extend(old.objects.stale_against(&new.objects));
                new_objects.push(new.objects.clone());
            }
            if self.services.contains(&key) {
                changed_counts.extend(new.counts.iter().copied());
                self.contributed.insert(key, Kept::new(slots, new));
            }
        }
        let mut deletes = ElementOps::new(family);
        let mut adds = ElementOps::new(family);
        for id in touched {
            let old = before.remove(&id).flatten();
            let new = self.registry.effective(&id.0, &id.1);
            if old == new {
                continue;
            }
            if old.is_some() {
                deletes.push(&id.0, &id.1, None);
            }
            if let Some(data) = new {
                adds.push(&id.0, &id.1, data.as_ref());
            }
        }
        let mut out = Transaction::default();
        // Deletes first: an element must go before the chain it names.
        out.ops.extend(deletes.finish(true));
        out.ops.extend(flushes);
        out.ops.extend(stale_objects);
        // Every service's maps are in `counts` once it has contributed
        // (a full render declares them all, a partial one what its changed
        // services add, each with its next size up; maps are never
        // dropped), so only the changed ones can need new maps: no walk
        // over every service.
        let new_counts: Vec<CountMap> =
            with_headroom(changed_counts.difference(&self.counts).copied()).difference(&self.counts).copied().collect();
        for &map in &new_counts {
            out.push(Op::AddSet(elements::count_map_declaration(map)));
        }
        for objects in &new_objects {
            out.ops.extend(objects.declarations());
        }
        for &map in &new_counts {
            out.push(Op::AddRule(elements::count_rule(map)));
        }
        for objects in &new_objects {
            out.ops.extend(objects.rules.iter().cloned().map(Op::AddRule));
            out.ops.extend(objects.elements.iter().cloned().map(Op::AddElements));
        }
        self.counts.extend(new_counts);
        out.ops.extend(adds.finish(false));
        out
    }
}

impl Backend for NftablesProxier {
    fn new(settings: Settings) -> Self {
        NftablesProxier {
            settings,
            node: Node::default(),
            services: ServiceSet::default(),
            contributed: BTreeMap::new(),
            registry: Registry::default(),
            counts: BTreeSet::new(),
            layout_changed: true,
            names: Names::default(),
        }
    }

    fn reset(&mut self, node: Node, _cluster: Cluster, services: Vec<ServicePort>) {
        self.node = node;
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
                // ServiceCIDRs are the host's (its cluster-ips-check chain).
                Change::Cluster(_) => {}
            }
        }
    }

    fn render(&mut self, full: bool) -> Result<AnyRuleset, String> {
        let tx = if full || self.layout_changed {
            self.layout_changed = false;
            self.services.clear_changed();
            self.full()
        } else {
            self.partial()
        };
        Ok(AnyRuleset::Nftables(tx))
    }
}

#[cfg(test)]
mod tests;
