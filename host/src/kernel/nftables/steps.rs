//! Make before break: a sync written as two nf_tables transactions when
//! one would let a packet miss both the old and the new place of what it
//! looks up.
//!
//! A packet reads the ruleset's generation once, when it enters a base
//! chain, and walks that generation's rules; each set lookup reads the
//! generation again. So a packet that enters just before a commit walks
//! the old rules against the new sets: if the transaction moved a key from
//! one map to another (a Service going from one endpoint to two moves its
//! elements from `internal-tcp-1` to `internal-tcp-2`) and the old rules
//! have no lookup of the new map, the packet finds nothing. And on the
//! kernels measured here (6.18), a key moved between two maps that both
//! have their rules misses in both now and then, around the commit.
//! Measured with `nft -f` in a scratch namespace, UDP at about 200k
//! packets a second through a chain that drops what misses
//! (docs/RELIABILITY.md, "A plugin that traps"): a move that also replaces
//! the rules, 100 drops in 300 transactions; a move between two maps whose
//! rules stay, 14 and 5 in 1,500 (adds before deletes in the same
//! transaction, 10); a key's data replaced in its own map, 0 in 1,500; the
//! new place added in one transaction and the old one deleted in the next,
//! 0 in 1,500.
//!
//! So the host writes first what can stand beside what the kernel holds:
//! new chains and sets, rules appended to chains the sync does not flush,
//! and elements under keys the sync does not delete, into sets it does not
//! flush (`first`); then everything else, in the sync's order. Between the
//! two, the table holds the union of old and new, and each lookup finds
//! the old element or the new one. A full sync's second step is the whole
//! sync as before (every rule flushed, every set emptied, everything
//! written again, a key's data replaced in its own set); its first step is
//! what the table does not hold yet, from the host's record of what it
//! wrote ([`Held`]). Left to the second step: interval sets' and the
//! kernel-filled affinity sets' elements (an interval may not overlap the
//! one it replaces); `firewall-ips` (its lookup pairs with the interval
//! set `firewall-allow`: a destination there before its ranges would drop
//! everything); anything that names a chain or set the sync flushes,
//! deletes or declares again with another shape; a new chain or set
//! unless all of it goes first (one reachable half-filled would drop what
//! its missing rules serve), and what names it; and a chain's rules after
//! one that waits (rules are appended: the order must stay).
//!
//! Between the steps a chain the sync does not flush keeps its old rules
//! with the new ones after them: a plugin that gives a chain other work
//! flushes it (a partial render) or names it anew. A second step that
//! fails leaves the first written (checked additions only); the next sync
//! is full, and [`Held`] unknown until it succeeds.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use kpx_rules::model::IpFamily;
use kpx_rules::ops::nftables::{Elements, HostSet, Match, Op, Rule, SetDecl, SetRef, Statement, Verdict};

/// What the kernel holds as far as a full sync's first step needs it: the
/// hashes of each chain's rules and of each exact-key set's keys, as the
/// host wrote them. Unknown after a write that failed, or once someone
/// else changed the table (the next full sync writes in one step, and
/// records it). Hashes of what a plugin chose may collide: that only
/// leaves something to the second step.
#[derive(Debug, Default)]
pub struct Held {
    known: bool,
    /// Regular chains (not base chains) and their rules' hashes.
    chains: HashMap<String, HashSet<u64>>,
    /// Exact-key sets and their keys' hashes.
    sets: HashMap<String, HashSet<u64>>,
}

fn hash_of<T: Hash + ?Sized>(t: &T) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    t.hash(&mut h);
    h.finish()
}

/// Sets whose elements the first step may add: exact keys, no timeouts,
/// and not `firewall-ips` (see the module doc).
fn first_elements(set: &SetRef, d: &SetDecl) -> bool {
    !d.interval && d.timeout_seconds.is_none() && *set != SetRef::Host(HostSet::FirewallIps)
}

/// Each element's key words of `e`: an add carries key and data words, a
/// delete the key's only.
fn keys<'a>(
    family: IpFamily,
    decl: &SetDecl,
    e: &'a Elements,
    with_data: bool,
) -> Option<impl Iterator<Item = &'a [u32]> + 'a> {
    let key_words: usize = decl.key.iter().map(|k| k.words(family)).sum();
    let stride = if with_data { decl.stride(family) } else { key_words };
    if stride == 0 || !e.words.len().is_multiple_of(stride) {
        return None;
    }
    Some(e.words.chunks_exact(stride).map(move |c| &c[..key_words]))
}

/// The chains a rule jumps or goes to.
fn chain_refs(rule: &Rule) -> impl Iterator<Item = &str> {
    match &rule.verdict {
        Verdict::Jump(c) | Verdict::Goto(c) => Some(c.as_str()),
        _ => None,
    }
    .into_iter()
}

/// The sets and maps a rule looks up or updates.
fn set_refs(rule: &Rule) -> impl Iterator<Item = &str> {
    let matches = rule.matches.iter().filter_map(|m| match m {
        Match::Lookup { set, .. } => Some(set.name()),
        _ => None,
    });
    let statements = rule.statements.iter().filter_map(|s| match s {
        Statement::AffinityUpdate(set) => Some(set.as_str()),
        _ => None,
    });
    let verdict = match &rule.verdict {
        Verdict::DnatMap { map, .. } | Verdict::Vmap { map, .. } => Some(map.name()),
        _ => None,
    };
    matches.chain(statements).chain(verdict)
}

/// The elements of an add `e` whose key `keep` accepts, as an op of their
/// own (None if none is).
fn elements_where(
    family: IpFamily,
    decl: &SetDecl,
    e: &Elements,
    mut keep: impl FnMut(&[u32]) -> bool,
) -> Option<Elements> {
    let stride = decl.stride(family);
    let key_words: usize = decl.key.iter().map(|k| k.words(family)).sum();
    let mut words = Vec::new();
    for chunk in e.words.chunks_exact(stride.max(1)) {
        if keep(&chunk[..key_words]) {
            words.extend_from_slice(chunk);
        }
    }
    (!words.is_empty()).then(|| Elements { set: e.set.clone(), words, chains: e.chains.clone() })
}

/// Chains and sets the first step may not name, grown until every new one
/// it creates is whole.
#[derive(Default)]
struct Waiting<'a> {
    chains: HashSet<&'a str>,
    sets: HashSet<&'a str>,
}

impl<'a> Waiting<'a> {
    fn names(&self, rule: &Rule) -> bool {
        self.chains.contains(rule.chain.as_str())
            || chain_refs(rule).any(|c| self.chains.contains(c))
            || set_refs(rule).any(|s| self.sets.contains(s))
    }

    fn names_chains(&self, e: &Elements) -> bool {
        e.chains.iter().any(|c| self.chains.contains(c.as_str()))
    }
}

fn base_chains(ops: &[&[Op]]) -> HashSet<&'static str> {
    ops.iter()
        .flat_map(|o| o.iter())
        .filter_map(|op| match op {
            Op::AddBaseChain(b) => Some(b.name),
            _ => None,
        })
        .collect()
}

impl Held {
    /// The kernel's contents are not known (a write failed, or someone
    /// else changed the table).
    pub fn forget(&mut self) {
        *self = Held::default();
    }

    /// Records a written sync: a full one's `ops` (the frame's and the
    /// plugin's) replace everything, a partial one's change it.
    pub fn record(&mut self, family: IpFamily, ops: &[&[Op]], decls: &dyn Fn(&SetRef) -> Option<SetDecl>, full: bool) {
        if full {
            *self = Held { known: true, ..Held::default() };
        }
        let base = base_chains(ops);
        for op in ops.iter().flat_map(|o| o.iter()) {
            match op {
                Op::AddChain(c) if !base.contains(c.as_str()) => {
                    self.chains.entry(c.clone()).or_default();
                }
                Op::FlushChain(c) => {
                    if let Some(rules) = self.chains.get_mut(c) {
                        rules.clear();
                    }
                }
                Op::DeleteChain(c) => {
                    self.chains.remove(c);
                }
                Op::AddRule(r) => {
                    if let Some(rules) = self.chains.get_mut(&r.chain) {
                        rules.insert(hash_of(r));
                    }
                }
                Op::AddSet(d) => {
                    if !d.interval && d.timeout_seconds.is_none() {
                        self.sets.entry(d.name.clone()).or_default();
                    } else {
                        self.sets.remove(&d.name);
                    }
                }
                Op::FlushSet(s) => {
                    if let Some(k) = self.sets.get_mut(s) {
                        k.clear();
                    }
                }
                Op::DeleteSet(s) => {
                    self.sets.remove(s);
                }
                Op::AddElements(e) | Op::DeleteElements(e) => {
                    let add = matches!(op, Op::AddElements(_));
                    let (Some(held), Some(decl)) = (self.sets.get_mut(e.set.name()), decls(&e.set)) else { continue };
                    let Some(keys) = keys(family, &decl, e, add) else {
                        // Not as declared (the checks refuse that): unknown.
                        self.sets.remove(e.set.name());
                        continue;
                    };
                    for k in keys {
                        if add {
                            held.insert(hash_of(k));
                        } else {
                            held.remove(&hash_of(k));
                        }
                    }
                }
                Op::AddChain(_) | Op::AddBaseChain(_) => {}
            }
        }
    }

    /// A full sync's first step: what `ops` (the frame's and the plugin's,
    /// every object declared) add that the table does not hold, where it
    /// can stand beside what it holds. `kernel_chains` and `kernel_sets`
    /// are the table's objects as read before the sync; `replaced` the
    /// sets it holds with another shape (deleted and declared again by the
    /// second step).
    pub fn first_of_full(
        &self,
        family: IpFamily,
        ops: &[&[Op]],
        decls: &dyn Fn(&SetRef) -> Option<SetDecl>,
        kernel_chains: &HashSet<&str>,
        kernel_sets: &HashSet<&str>,
        replaced: &HashSet<&str>,
    ) -> Vec<Op> {
        if !self.known {
            return Vec::new();
        }
        let base = base_chains(ops);
        let mut waiting = Waiting { chains: base.iter().copied().collect(), sets: replaced.iter().copied().collect() };
        loop {
            let mut first = Vec::new();
            // Chains with a rule left to the second step: their later
            // rules wait too.
            let mut late: HashSet<&str> = HashSet::new();
            let mut grew = false;
            for op in ops.iter().flat_map(|o| o.iter()) {
                match op {
                    Op::AddChain(c) if !kernel_chains.contains(c.as_str()) && !waiting.chains.contains(c.as_str()) => {
                        first.push(op.clone())
                    }
                    Op::AddSet(d) if !kernel_sets.contains(d.name.as_str()) => {
                        if !d.interval && d.timeout_seconds.is_none() && !waiting.sets.contains(d.name.as_str()) {
                            first.push(op.clone());
                        } else {
                            grew |= waiting.sets.insert(&d.name);
                        }
                    }
                    Op::AddRule(r) => {
                        let chain = r.chain.as_str();
                        let new = !kernel_chains.contains(chain);
                        let held = self.chains.get(chain);
                        if !new && held.is_some_and(|h| h.contains(&hash_of(r))) {
                            // There already.
                            continue;
                        }
                        if waiting.names(r) || late.contains(chain) {
                            late.insert(chain);
                            grew |= new && waiting.chains.insert(chain);
                        } else if new {
                            first.push(op.clone());
                        } else if held.is_some() {
                            // Appended after the rules the chain holds.
                            first.push(op.clone());
                        }
                    }
                    Op::AddElements(e) => {
                        let name = e.set.name();
                        let new = !kernel_sets.contains(name);
                        let decl = decls(&e.set).filter(|d| first_elements(&e.set, d));
                        let decl = match decl {
                            Some(d) if !waiting.sets.contains(name) && !waiting.names_chains(e) => d,
                            _ => {
                                grew |= new && waiting.sets.insert(name);
                                continue;
                            }
                        };
                        if new {
                            first.push(op.clone());
                        } else if let Some(held) = self.sets.get(name) {
                            // Held: only the keys it does not hold.
                            if let Some(e) = elements_where(family, &decl, e, |k| !held.contains(&hash_of(k))) {
                                first.push(Op::AddElements(e));
                            }
                        }
                    }
                    _ => {}
                }
            }
            if !grew {
                return first;
            }
        }
    }
}

/// A partial sync's two steps, from its operations alone: the first adds
/// what stands beside what the kernel holds, the second is the rest in
/// the sync's order. None when one step does (nothing to add first, or
/// nothing removed after).
pub fn split_partial(
    family: IpFamily,
    ops: &[Op],
    decls: &dyn Fn(&SetRef) -> Option<SetDecl>,
) -> Option<(Vec<Op>, Vec<Op>)> {
    // What the sync flushes or deletes: nothing in the first step names it.
    let mut waiting = Waiting::default();
    let mut deleted: HashMap<&str, HashSet<&[u32]>> = HashMap::new();
    let (mut new_chains, mut new_sets) = (HashSet::new(), HashSet::new());
    for op in ops {
        match op {
            Op::FlushChain(n) | Op::DeleteChain(n) => {
                waiting.chains.insert(n.as_str());
            }
            Op::FlushSet(n) | Op::DeleteSet(n) => {
                waiting.sets.insert(n.as_str());
            }
            Op::DeleteElements(e) => {
                let keys = decls(&e.set).and_then(|decl| Some(keys(family, &decl, e, false)?.collect::<Vec<_>>()));
                match keys {
                    Some(keys) => deleted.entry(e.set.name()).or_default().extend(keys),
                    // Not as declared (the checks refuse that): the set waits.
                    None => {
                        waiting.sets.insert(e.set.name());
                    }
                }
            }
            Op::AddChain(c) => {
                new_chains.insert(c.as_str());
            }
            Op::AddSet(d) => {
                new_sets.insert(d.name.as_str());
            }
            _ => {}
        }
    }
    if waiting.chains.is_empty() && waiting.sets.is_empty() && deleted.is_empty() {
        return None;
    }
    loop {
        let (mut first, mut rest) = (Vec::new(), Vec::new());
        let mut late: HashSet<&str> = HashSet::new();
        let mut grew = false;
        for op in ops {
            match op {
                Op::AddChain(c) if !waiting.chains.contains(c.as_str()) => first.push(op.clone()),
                Op::AddSet(d) if !waiting.sets.contains(d.name.as_str()) => first.push(op.clone()),
                Op::AddRule(r) => {
                    let chain = r.chain.as_str();
                    if waiting.names(r) || late.contains(chain) {
                        late.insert(chain);
                        grew |= new_chains.contains(chain) && waiting.chains.insert(chain);
                        rest.push(op.clone());
                    } else {
                        first.push(op.clone());
                    }
                }
                Op::AddElements(e) => {
                    let name = e.set.name();
                    let decl = decls(&e.set).filter(|d| first_elements(&e.set, d));
                    let mut waits = false;
                    match decl {
                        Some(decl) if !waiting.sets.contains(name) && !waiting.names_chains(e) => {
                            let gone = deleted.get(name);
                            let is_gone = |k: &[u32]| gone.is_some_and(|g| g.contains(k));
                            if let Some(now) = elements_where(family, &decl, e, |k| !is_gone(k)) {
                                first.push(Op::AddElements(now));
                            }
                            if let Some(later) = elements_where(family, &decl, e, is_gone) {
                                rest.push(Op::AddElements(later));
                                waits = true;
                            }
                        }
                        _ => {
                            rest.push(op.clone());
                            waits = !e.words.is_empty();
                        }
                    }
                    grew |= waits && new_sets.contains(name) && waiting.sets.insert(name);
                }
                _ => rest.push(op.clone()),
            }
        }
        if !grew {
            return (!first.is_empty()).then_some((first, rest));
        }
    }
}

#[cfg(test)]
mod tests;
