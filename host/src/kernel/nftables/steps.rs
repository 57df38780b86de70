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
//! wrote ([`Held`]). Interval sets and the kernel-filled affinity sets
//! are left to the second step (an interval may not overlap the one it
//! replaces), and so is anything that names a chain or set the sync
//! flushes, deletes or declares again with another shape.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use kpx_rules::model::IpFamily;
use kpx_rules::ops::nftables::{Elements, Match, Op, Rule, SetDecl, SetRef, Statement, Verdict};

/// What the kernel holds as far as a full sync's first step needs it: the
/// hashes of each chain's rules and of each exact-key set's keys, as the
/// host wrote them. Unknown after a write that failed (the next full sync
/// writes in one step, and records it).
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

/// Sets whose elements the first step may add: exact keys, no timeouts.
fn exact(d: &SetDecl) -> bool {
    !d.interval && d.timeout_seconds.is_none()
}

/// Each element's key words of `e` (the first words of each element).
fn keys<'a>(family: IpFamily, decl: &SetDecl, e: &'a Elements) -> Option<impl Iterator<Item = &'a [u32]> + 'a> {
    let stride = decl.stride(family);
    let key_words: usize = decl.key.iter().map(|k| k.words(family)).sum();
    if stride == 0 || !e.words.len().is_multiple_of(stride) {
        return None;
    }
    Some(e.words.chunks_exact(stride).map(move |c| &c[..key_words]))
}

/// The chains and sets a rule names.
fn rule_refs(rule: &Rule) -> impl Iterator<Item = &str> {
    let matches = rule.matches.iter().filter_map(|m| match m {
        Match::Lookup { set, .. } => Some(set.name()),
        _ => None,
    });
    let statements = rule.statements.iter().filter_map(|s| match s {
        Statement::AffinityUpdate(set) => Some(set.as_str()),
        _ => None,
    });
    let verdict = match &rule.verdict {
        Verdict::Jump(c) | Verdict::Goto(c) => Some(c.as_str()),
        Verdict::DnatMap { map, .. } | Verdict::Vmap { map, .. } => Some(map.name()),
        _ => None,
    };
    matches.chain(statements).chain(verdict)
}

/// The elements of `e` whose key `keep` accepts, as an op of their own
/// (None if none is).
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
        let base: HashSet<&str> = ops
            .iter()
            .flat_map(|o| o.iter())
            .filter_map(|op| match op {
                Op::AddBaseChain(b) => Some(b.name),
                _ => None,
            })
            .collect();
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
                    if exact(d) {
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
                    let name = e.set.name();
                    let (Some(held), Some(decl)) = (self.sets.get_mut(name), decls(&e.set)) else { continue };
                    let Some(keys) = keys(family, &decl, e) else { continue };
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
        let mut out = Vec::new();
        if !self.known {
            return out;
        }
        let ops = || ops.iter().flat_map(|o| o.iter());
        let base: HashSet<&str> = ops()
            .filter_map(|op| match op {
                Op::AddBaseChain(b) => Some(b.name),
                _ => None,
            })
            .collect();
        // Chains and sets the first step may name: held ones (but base
        // chains and replaced sets) and those it declares.
        let mut usable: HashSet<&str> = kernel_chains
            .iter()
            .chain(kernel_sets)
            .copied()
            .filter(|n| !base.contains(n) && !replaced.contains(n))
            .collect();
        for op in ops() {
            match op {
                Op::AddChain(c) if !base.contains(c.as_str()) && !kernel_chains.contains(c.as_str()) => {
                    usable.insert(c);
                    out.push(op.clone());
                }
                Op::AddSet(d) if exact(d) && !kernel_sets.contains(d.name.as_str()) => {
                    usable.insert(&d.name);
                    out.push(op.clone());
                }
                Op::AddRule(r) => {
                    let new_chain = !kernel_chains.contains(r.chain.as_str());
                    let appendable = new_chain || self.chains.get(&r.chain).is_some_and(|h| !h.contains(&hash_of(r)));
                    if appendable && usable.contains(r.chain.as_str()) && rule_refs(r).all(|n| usable.contains(n)) {
                        out.push(op.clone());
                    }
                }
                Op::AddElements(e) => {
                    let name = e.set.name();
                    let Some(decl) = decls(&e.set).filter(exact) else { continue };
                    if !usable.contains(name) || !e.chains.iter().all(|c| usable.contains(c.as_str())) {
                        continue;
                    }
                    let held = if kernel_sets.contains(name) {
                        // Held: only keys it does not hold; unknown keys, none.
                        match self.sets.get(name) {
                            Some(h) => Some(h),
                            None => continue,
                        }
                    } else {
                        None
                    };
                    if let Some(e) = elements_where(family, &decl, e, |k| held.is_none_or(|h| !h.contains(&hash_of(k))))
                    {
                        out.push(Op::AddElements(e));
                    }
                }
                _ => {}
            }
        }
        out
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
    let mut broken: HashSet<&str> = HashSet::new();
    let mut deleted: HashMap<&str, HashSet<&[u32]>> = HashMap::new();
    for op in ops {
        match op {
            Op::FlushChain(n) | Op::DeleteChain(n) | Op::FlushSet(n) | Op::DeleteSet(n) => {
                broken.insert(n);
            }
            Op::DeleteElements(e) => {
                let Some(decl) = decls(&e.set) else { continue };
                let Some(keys) = keys(family, &decl, e) else { continue };
                deleted.entry(e.set.name()).or_default().extend(keys);
            }
            _ => {}
        }
    }
    if broken.is_empty() && deleted.is_empty() {
        return None;
    }
    let mut first = Vec::new();
    let mut rest = Vec::new();
    for op in ops {
        match op {
            Op::AddChain(c) if !broken.contains(c.as_str()) => first.push(op.clone()),
            Op::AddSet(d) if !broken.contains(d.name.as_str()) => first.push(op.clone()),
            Op::AddRule(r) if !broken.contains(r.chain.as_str()) && rule_refs(r).all(|n| !broken.contains(n)) => {
                first.push(op.clone())
            }
            Op::AddElements(e) => {
                let name = e.set.name();
                let decl = decls(&e.set).filter(exact);
                match decl {
                    Some(decl) if !broken.contains(name) && e.chains.iter().all(|c| !broken.contains(c.as_str())) => {
                        let gone = deleted.get(name);
                        let is_gone = |k: &[u32]| gone.is_some_and(|g| g.contains(k));
                        if let Some(now) = elements_where(family, &decl, e, |k| !is_gone(k)) {
                            first.push(Op::AddElements(now));
                        }
                        if let Some(later) = elements_where(family, &decl, e, is_gone) {
                            rest.push(Op::AddElements(later));
                        }
                    }
                    _ => rest.push(op.clone()),
                }
            }
            _ => rest.push(op.clone()),
        }
    }
    (!first.is_empty()).then_some((first, rest))
}

#[cfg(test)]
mod tests;
