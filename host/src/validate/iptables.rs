//! Confinement of a typed iptables ruleset (docs/SECURITY.md, "iptables").
//!
//! - own chains are named KUBE-SVC-/SVL-/EXT-/FW-/SEP- + [A-Z0-9], at most
//!   28 bytes; the host's chains and the built-in ones are not the
//!   plugin's to declare, fill or delete;
//! - a plugin's rules go in the hooks or in own chains declared by the same
//!   ruleset (so that each chain holds exactly what was checked);
//! - every rule in a hook matches a destination of the state: a Service's
//!   address, protocol and port; a node port; a health-check port;
//! - targets: jumps to own chains of the same table that exist after this
//!   sync, KUBE-MARK-MASQ, DNAT to an endpoint of the state (nat), DROP and
//!   REJECT (filter), ACCEPT only in nat and for health-check ports, hash
//!   marks below the masquerade bit; never SNAT, MASQUERADE, MARK writes;
//! - values: addresses of the instance's family, prefix lengths in range,
//!   interface names from a closed alphabet, at most one comment and 16
//!   matches a rule, recent lists named after own chains;
//! - a chain kept from an earlier sync must not DNAT to an endpoint that
//!   has left the state;
//! - a hook a partial render keeps holds the rules the last write left in
//!   it, checked again against what left the state since (`kept_hooks`,
//!   `check_with_kept`).

use std::collections::{BTreeSet, HashMap};

use kpx_rules::model::{IpFamily, Protocol};
use kpx_rules::ops::iptables::{
    Hook, Match, Rule, Ruleset, Table, Target, interface_name_problem, own_chain_name_problem,
};

use super::{EndpointAddr, Rejected, Scope, shorten};
use crate::syntax::iptables::{Dialect, rule_lines};

/// Most matches in one rule (with one comment, a rule's line stays far
/// below iptables-restore's 10,240-byte line buffer).
pub const MAX_MATCHES: usize = 16;

type ChainId = (Table, String);

/// Own chains by table and name, looked up by `&str`: checking a rule
/// allocates no key. SipHash, as the names are the plugin's to choose.
#[derive(Debug, Clone)]
struct ChainMap<V>([HashMap<String, V>; 2]);

impl<V> Default for ChainMap<V> {
    fn default() -> Self {
        ChainMap([HashMap::new(), HashMap::new()])
    }
}

impl<V> ChainMap<V> {
    fn slot(table: Table) -> usize {
        match table {
            Table::Nat => 0,
            Table::Filter => 1,
        }
    }

    fn get_mut(&mut self, table: Table, name: &str) -> Option<&mut V> {
        self.0[Self::slot(table)].get_mut(name)
    }

    fn contains(&self, table: Table, name: &str) -> bool {
        self.0[Self::slot(table)].contains_key(name)
    }

    fn insert(&mut self, (table, name): ChainId, v: V) -> Option<V> {
        self.0[Self::slot(table)].insert(name, v)
    }

    fn remove(&mut self, table: Table, name: &str) -> Option<V> {
        self.0[Self::slot(table)].remove(name)
    }

    fn clear(&mut self) {
        self.0.iter_mut().for_each(HashMap::clear);
    }

    fn iter(&self) -> impl Iterator<Item = (Table, &String, &V)> {
        [Table::Nat, Table::Filter].into_iter().flat_map(|t| self.0[Self::slot(t)].iter().map(move |(n, v)| (t, n, v)))
    }

    fn into_iter(self) -> impl Iterator<Item = (ChainId, V)> {
        let [nat, filter] = self.0;
        nat.into_iter()
            .map(|(n, v)| ((Table::Nat, n), v))
            .chain(filter.into_iter().map(|(n, v)| ((Table::Filter, n), v)))
    }
}

/// What one own chain does that outlives the sync that wrote it.
#[derive(Debug, Default, Clone)]
struct Facts {
    /// Its rules.
    rules: usize,
    /// Endpoints it DNATs to.
    endpoints: Vec<EndpointAddr>,
    /// Own chains of its table it jumps or goes to.
    jumps: Vec<String>,
}

/// What the host knows of the plugin's own chains in the kernel: their
/// names, the endpoints each DNATs to and the chains each jumps to.
#[derive(Debug, Default, Clone)]
pub struct Model {
    chains: ChainMap<Facts>,
    by_endpoint: HashMap<EndpointAddr, BTreeSet<ChainId>>,
    /// The own chains that jump or go to each own chain: a deletion is
    /// checked against those, not every chain.
    jumped_by: HashMap<ChainId, BTreeSet<ChainId>>,
    /// Rules in the own chains, by table (filter, nat).
    rules: [usize; 2],
}

impl Model {
    /// Own chains the kernel holds (read back at a full sync): their
    /// contents are unknown, so a full sync rewrites or deletes each.
    pub fn reset(&mut self, chains: impl IntoIterator<Item = ChainId>) {
        self.chains.clear();
        for c in chains {
            self.chains.insert(c, Facts::default());
        }
        self.by_endpoint.clear();
        self.jumped_by.clear();
        self.rules = [0; 2];
    }

    /// Rules in the own chains of `table` (those read back at a full sync
    /// count as empty until the sync rewrites or deletes them).
    pub fn rules(&self, table: Table) -> usize {
        self.rules[usize::from(table == Table::Nat)]
    }

    pub fn contains(&self, (table, name): &ChainId) -> bool {
        self.chains.contains(*table, name)
    }

    fn forget(&mut self, (table, name): &ChainId) {
        if let Some(facts) = self.chains.remove(*table, name) {
            self.rules[usize::from(*table == Table::Nat)] -= facts.rules;
            let chain = (*table, name.clone());
            for e in facts.endpoints {
                if let Some(set) = self.by_endpoint.get_mut(&e) {
                    set.remove(&chain);
                    if set.is_empty() {
                        self.by_endpoint.remove(&e);
                    }
                }
            }
            for to in facts.jumps {
                let to = (*table, to);
                if let Some(set) = self.jumped_by.get_mut(&to) {
                    set.remove(&chain);
                    if set.is_empty() {
                        self.jumped_by.remove(&to);
                    }
                }
            }
        }
    }

    /// Records what a written ruleset did.
    pub fn commit(&mut self, checked: Checked) {
        if checked.full {
            self.chains.clear();
            self.by_endpoint.clear();
            self.jumped_by.clear();
            self.rules = [0; 2];
        } else {
            for chain in checked.deleted.iter() {
                self.forget(chain);
            }
            for (t, name, _) in checked.declared.iter() {
                self.forget(&(t, name.clone()));
            }
        }
        for (chain, facts) in checked.declared.into_iter() {
            for e in &facts.endpoints {
                self.by_endpoint.entry(*e).or_default().insert(chain.clone());
            }
            for to in &facts.jumps {
                self.jumped_by.entry((chain.0, to.clone())).or_default().insert(chain.clone());
            }
            self.rules[usize::from(chain.0 == Table::Nat)] += facts.rules;
            self.chains.insert(chain, facts);
        }
    }
}

/// A ruleset that passed, with what it does to the own chains.
#[derive(Debug, Default)]
pub struct Checked {
    full: bool,
    /// Declared chains, the endpoints each DNATs to and its jumps.
    declared: ChainMap<Facts>,
    deleted: Vec<ChainId>,
    /// Own chains the kernel holds that a full ruleset leaves out.
    pub stale: Vec<ChainId>,
}

/// What a ruleset is checked against.
pub struct Context<'a> {
    pub plugin: &'a str,
    pub dialect: Dialect,
    pub scope: &'a Scope,
    pub model: &'a Model,
    /// A full sync: every own chain the ruleset does not declare goes.
    pub full: bool,
}

impl Context<'_> {
    fn reject(&self, at: String, item: String, reason: impl Into<String>) -> Rejected {
        Rejected { plugin: self.plugin.to_string(), at, item: shorten(item), reason: shorten(reason.into()) }
    }

    fn family(&self) -> IpFamily {
        self.dialect.family
    }
}

/// The rules each hook holds after a write: what a partial render's
/// `kept_hooks` keep.
pub type HookRules = std::collections::BTreeMap<Hook, Vec<Rule>>;

/// The hook rules of a ruleset the host writes (moved out of it when
/// owned).
pub fn hook_rules(rs: std::borrow::Cow<'_, Ruleset>) -> HookRules {
    let mut out = HookRules::new();
    let mut add = |hook: Hook, rule: Rule| out.entry(hook).or_default().push(rule);
    match rs {
        std::borrow::Cow::Owned(rs) => {
            for rule in rs.rules {
                if let Some(hook) = Hook::of(rule.table, &rule.chain) {
                    add(hook, rule);
                }
            }
        }
        std::borrow::Cow::Borrowed(rs) => {
            for rule in &rs.rules {
                if let Some(hook) = Hook::of(rule.table, &rule.chain) {
                    add(hook, rule.clone());
                }
            }
        }
    }
    out
}

/// The rules the last write left in the hooks `rs` keeps (moved out of
/// `last`), which the host writes back unchanged. Refused: a kept hook on
/// a full sync, or with no last write to keep from, and a rule in a hook
/// the ruleset keeps.
pub fn kept_hooks(ctx: &Context, rs: &Ruleset, last: Option<HookRules>) -> Result<HookRules, Rejected> {
    let Some(&first) = rs.kept_hooks.first() else {
        return Ok(HookRules::new());
    };
    let hook_item = |h: Hook| format!("{} {}", h.table().name(), h.chain());
    let Some(mut last) = last.filter(|_| !ctx.full) else {
        let why = if ctx.full { "a full sync keeps no hook" } else { "no earlier write to keep it from" };
        return Err(ctx.reject("kept hook 1".into(), hook_item(first), why));
    };
    let kept: BTreeSet<Hook> = rs.kept_hooks.iter().copied().collect();
    if let Some((i, rule)) =
        rs.rules.iter().enumerate().find(|(_, r)| Hook::of(r.table, &r.chain).is_some_and(|h| kept.contains(&h)))
    {
        return Err(ctx.reject(
            format!("rule {}", i + 1),
            rule_lines(rule, ctx.dialect).join(" / "),
            "in a hook the ruleset keeps",
        ));
    }
    Ok(kept.into_iter().map(|hook| (hook, last.remove(&hook).unwrap_or_default())).collect())
}

/// Checks a ruleset; the first violation refuses it whole.
pub fn check(ctx: &Context, rs: &Ruleset) -> Result<Checked, Rejected> {
    check_with_kept(ctx, rs, &HookRules::new())
}

/// [`check`] of a ruleset written with the rules `kept` in the hooks it
/// keeps ([`kept_hooks`]). Each kept rule passed every check when it was
/// written, and what those checks read changes only by leaving: a fact of
/// the state (`Scope`'s removed ones since that write) or a chain this
/// ruleset deletes. So a kept rule is checked again only against what
/// left, and a partial sync's cost does not grow with the rules it keeps.
/// A refusal names such a rule as kept, by its place among them.
pub fn check_with_kept(ctx: &Context, rs: &Ruleset, kept: &HookRules) -> Result<Checked, Rejected> {
    let chain_item = |(t, c): &ChainId| format!("{} {c}", t.name());
    let mut declared: ChainMap<Facts> = ChainMap::default();
    for (i, chain) in rs.chains.iter().enumerate() {
        if let Some(why) = own_chain_name_problem(&chain.1) {
            return Err(ctx.reject(format!("chain {}", i + 1), chain_item(chain), why));
        }
        if declared.insert(chain.clone(), Facts::default()).is_some() {
            return Err(ctx.reject(format!("chain {}", i + 1), chain_item(chain), "declared twice"));
        }
    }
    let (mut deleted, mut gone) = (Vec::new(), ChainMap::<()>::default());
    for (i, chain) in rs.delete_chains.iter().enumerate() {
        let at = format!("deleted chain {}", i + 1);
        if let Some(why) = own_chain_name_problem(&chain.1) {
            return Err(ctx.reject(at, chain_item(chain), why));
        }
        if declared.contains(chain.0, &chain.1) {
            return Err(ctx.reject(at, chain_item(chain), "declared and deleted by the same ruleset"));
        }
        if !ctx.model.contains(chain) {
            return Err(ctx.reject(at, chain_item(chain), "no such chain"));
        }
        if gone.insert(chain.clone(), ()).is_none() {
            deleted.push(chain.clone());
        }
    }
    // Own chains that exist once this ruleset is written.
    let exists = |table: Table, name: &str| {
        declared.contains(table, name)
            || (!ctx.full && ctx.model.chains.contains(table, name) && !gone.contains(table, name))
    };
    for (i, rule) in rs.rules.iter().enumerate() {
        let fail = |why: String| ctx.reject(format!("rule {}", i + 1), rule_lines(rule, ctx.dialect).join(" / "), why);
        let hook = Hook::of(rule.table, &rule.chain);
        if hook.is_none() && !declared.contains(rule.table, &rule.chain) {
            return Err(fail(if own_chain_name_problem(&rule.chain).is_some() {
                "rules go in the host's hooks or in the plugin's own chains".into()
            } else {
                "a rule's chain must be declared by the same ruleset".into()
            }));
        }
        check_matches(ctx, rule).map_err(&fail)?;
        if let Some(hook) = hook {
            check_scope(ctx.scope, hook, rule).map_err(&fail)?;
        }
        check_target(ctx, rule, hook, &exists).map_err(&fail)?;
    }
    check_kept(ctx, kept, &gone)?;
    // What each declared chain does that outlives this sync (the checks
    // above hold `declared` borrowed, so this is a pass of its own).
    for rule in &rs.rules {
        let Some(f) = declared.get_mut(rule.table, &rule.chain) else { continue };
        f.rules += 1;
        match &rule.target {
            Target::Dnat(ip, port) => f.endpoints.push((*ip, *port)),
            Target::Jump(to) | Target::Goto(to) => f.jumps.push(to.clone()),
            _ => {}
        }
    }
    // iptables-restore commits each table on its own: a jump loop or the
    // deletion of a chain that a kept one still jumps to fails in the
    // kernel after the other table was written. Both are refused here.
    if !ctx.full {
        for to in &deleted {
            if let Some(from) = still_kept(ctx.model.jumped_by.get(to), &declared, &gone) {
                return Err(ctx.reject(
                    "kept chain".into(),
                    chain_item(from),
                    format!("kept from an earlier sync, it jumps to {}, which this ruleset deletes", to.1),
                ));
            }
        }
    }
    if let Some(cycle) = jump_loop(&declared, if ctx.full { None } else { Some(&ctx.model.chains) }) {
        return Err(ctx.reject("jumps".into(), cycle.join(" -> "), "the plugin's chains jump in a loop"));
    }
    // Chains kept from an earlier sync must not DNAT to departed endpoints.
    if !ctx.full {
        for e in ctx.scope.endpoints.removed() {
            if let Some(chain) = still_kept(ctx.model.by_endpoint.get(e), &declared, &gone) {
                return Err(ctx.reject(
                    "kept chain".into(),
                    chain_item(chain),
                    format!(
                        "kept from an earlier sync, it DNATs to {}, which is no longer an endpoint of the state",
                        kpx_rules::model::join_host_port(&e.0, e.1)
                    ),
                ));
            }
        }
    }
    let mut stale: Vec<ChainId> = if ctx.full {
        ctx.model.chains.iter().filter(|(t, n, _)| !declared.contains(*t, n)).map(|(t, n, _)| (t, n.clone())).collect()
    } else {
        Vec::new()
    };
    stale.sort();
    Ok(Checked { full: ctx.full, declared, deleted, stale })
}

/// Of the chains a model's index names, one this ruleset neither declares
/// nor deletes: kept from an earlier sync as it was.
fn still_kept<'m>(
    chains: Option<&'m BTreeSet<ChainId>>,
    declared: &ChainMap<Facts>,
    gone: &ChainMap<()>,
) -> Option<&'m ChainId> {
    chains.into_iter().flatten().find(|c| !declared.contains(c.0, &c.1) && !gone.contains(c.0, &c.1))
}

/// The rules of kept hooks against what left since they were written
/// (see [`check_with_kept`]): the destinations, node ports and
/// health-check ports a hook rule matches, the endpoints it DNATs to and
/// the chains it jumps to. Nothing left, nothing to look at.
fn check_kept(ctx: &Context, kept: &HookRules, gone: &ChainMap<()>) -> Result<(), Rejected> {
    let scope = ctx.scope;
    let matched_left = scope.destinations.removed().next().is_some()
        || scope.node_ports.removed().next().is_some()
        || scope.health_check_ports.removed().next().is_some();
    let endpoints_left = scope.endpoints.removed().next().is_some();
    let chains_left = gone.iter().next().is_some();
    if !(matched_left || endpoints_left || chains_left) {
        return Ok(());
    }
    let rules = kept.iter().flat_map(|(hook, rules)| rules.iter().map(move |r| (*hook, r)));
    for (i, (hook, rule)) in rules.enumerate() {
        let left = match &rule.target {
            _ if matched_left && check_scope(scope, hook, rule).is_err() => true,
            Target::Dnat(ip, port) => endpoints_left && !scope.endpoints.contains(&(*ip, *port)),
            Target::Jump(to) | Target::Goto(to) => chains_left && gone.contains(rule.table, to),
            _ => false,
        };
        if left {
            // The full check names what is wrong.
            let exists = |table: Table, name: &str| !gone.contains(table, name);
            let why = check_scope(scope, hook, rule)
                .and_then(|()| check_target(ctx, rule, Some(hook), &exists))
                .err()
                .unwrap_or_default();
            return Err(ctx.reject(
                format!("kept rule {} (from the last write)", i + 1),
                rule_lines(rule, ctx.dialect).join(" / "),
                why,
            ));
        }
    }
    Ok(())
}

/// A loop among the own chains that exist after a sync (declared ones
/// with this ruleset's jumps; on a partial sync, kept ones with the jumps
/// they were written with), as `table chain` names, if there is one.
fn jump_loop(declared: &ChainMap<Facts>, kept: Option<&ChainMap<Facts>>) -> Option<Vec<String>> {
    let jumps = |t: Table, name: &str| -> Option<&[String]> {
        match declared.0[ChainMap::<Facts>::slot(t)].get(name) {
            Some(f) => Some(&f.jumps),
            None => kept.and_then(|k| k.0[ChainMap::<Facts>::slot(t)].get(name)).map(|f| f.jumps.as_slice()),
        }
    };
    // Depth-first, iteratively: 1 = on the current path, 2 = done.
    let mut state: [HashMap<&str, u8>; 2] = [HashMap::new(), HashMap::new()];
    for (table, start, _) in declared.iter() {
        let slot = ChainMap::<Facts>::slot(table);
        if state[slot].contains_key(start.as_str()) {
            continue;
        }
        let mut path: Vec<(&str, usize)> = vec![(start.as_str(), 0)];
        state[slot].insert(start.as_str(), 1);
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            let out = jumps(table, node).unwrap_or(&[]);
            if let Some(to) = out.get(*next) {
                *next += 1;
                match state[slot].get(to.as_str()) {
                    Some(1) => {
                        let from = path.iter().position(|(n, _)| *n == to.as_str()).unwrap_or(0);
                        let mut cycle: Vec<String> =
                            path[from..].iter().map(|(n, _)| format!("{} {n}", table.name())).collect();
                        // The same loop reads the same whatever the maps' order.
                        let first = (0..cycle.len()).min_by_key(|i| &cycle[*i]).unwrap_or(0);
                        cycle.rotate_left(first);
                        cycle.push(cycle[0].clone());
                        return Some(cycle);
                    }
                    Some(_) => {}
                    None => {
                        state[slot].insert(to.as_str(), 1);
                        path.push((to.as_str(), 0));
                    }
                }
            } else {
                state[slot].insert(node, 2);
                path.pop();
            }
        }
    }
    None
}

fn check_matches(ctx: &Context, rule: &Rule) -> Result<(), String> {
    if rule.matches.len() > MAX_MATCHES {
        return Err(format!("a rule has at most {MAX_MATCHES} matches"));
    }
    let family = ctx.family();
    let mut seen = [0usize; 5];
    for m in &rule.matches {
        match m {
            Match::Source(a) | Match::Destination(a) => {
                if !family.matches(&a.cidr.addr) {
                    return Err(format!("{} is not an {family} address", a.cidr.addr));
                }
                if a.cidr.prefix_len > a.cidr.max_len() {
                    return Err(format!("prefix length {} is longer than {}", a.cidr.prefix_len, a.cidr.max_len()));
                }
                if a.negate && a.cidr.prefix_len == 0 {
                    return Err("a negated /0 matches no packet (and iptables refuses it)".into());
                }
                seen[if matches!(m, Match::Source(_)) { 0 } else { 1 }] += 1;
            }
            Match::InInterface(i) => {
                if let Some(why) = interface_name_problem(&i.name) {
                    return Err(why);
                }
                seen[2] += 1;
            }
            Match::Protocol(_) => seen[3] += 1,
            Match::DestinationPort(_) => {
                if rule.protocol().is_none() {
                    return Err("a destination port needs a protocol match".into());
                }
                seen[4] += 1;
            }
            Match::Conntrack { states, .. } if states.is_empty() => {
                return Err("a conntrack match names no state".into());
            }
            Match::StatisticRandom(p) if *p > 1 << 31 => return Err(format!("probability {p} is over 2^31 (1.0)")),
            Match::ClusterHash { total, node, .. } if *total == 0 || *total > 32 || *node == 0 || node > total => {
                return Err(format!("cluster hash node {node} of {total}: 1 to 32 values, a node among them"));
            }
            Match::StatisticNth { every, packet } if *every == 0 || packet >= every => {
                return Err(format!("--every {every} --packet {packet}: the packet must be below every"));
            }
            Match::RecentCheck { name, .. } | Match::RecentSet { name } if own_chain_name_problem(name).is_some() => {
                return Err(format!("recent list {name:?} is not named like one of the plugin's own chains"));
            }
            Match::RecentCheck { seconds, .. } if *seconds == 0 || *seconds > i32::MAX as u32 => {
                return Err(format!(
                    "recent --seconds {seconds}: 1 to {} (iptables refuses 0 and prints larger ones as negative)",
                    i32::MAX
                ));
            }
            Match::Comment(text) => {
                if let Some(why) = kpx_rules::ops::comment_problem(text, crate::syntax::iptables::MAX_COMMENT) {
                    return Err(why);
                }
            }
            Match::Set { .. } | Match::PhysdevIsIn { .. } | Match::IpvsVirtual { .. } => {
                return Err("ipset, physdev and ipvs matches are the host's (ipvs mode)".into());
            }
            Match::Nfacct(_) | Match::ConntrackOriginalDestination(_) => {
                return Err("nfacct and conntrack original-destination matches are the host's".into());
            }
            Match::HashSlot(slot) if *slot >= ctx.dialect.masquerade_mark => {
                return Err(format!(
                    "hash slot {slot} is not below the masquerade mark {:#x}",
                    ctx.dialect.masquerade_mark
                ));
            }
            _ => {}
        }
    }
    if seen.iter().any(|n| *n > 1) {
        return Err("a rule has at most one source, destination, interface, protocol and destination port".into());
    }
    if rule.matches.iter().filter(|m| matches!(m, Match::Comment(_))).count() > 1 {
        return Err("a rule has at most one comment".into());
    }
    Ok(())
}

fn check_target(
    ctx: &Context,
    rule: &Rule,
    hook: Option<Hook>,
    exists: &dyn Fn(Table, &str) -> bool,
) -> Result<(), String> {
    let nat = rule.table == Table::Nat;
    let filter_hook = |h: Hook| hook == Some(h);
    match &rule.target {
        Target::None | Target::Return => Ok(()),
        Target::Jump(chain) | Target::Goto(chain) => {
            if own_chain_name_problem(chain).is_some() {
                return Err(format!("a jump goes to one of the plugin's own chains, not {chain:?}"));
            }
            if !exists(rule.table, chain) {
                return Err(format!("jump to {chain}, which no {} chain of the plugin's is", rule.table.name()));
            }
            Ok(())
        }
        Target::MarkForMasquerade if nat => Ok(()),
        Target::Dnat(ip, port) if nat => {
            if rule.protocol().is_none() {
                return Err("DNAT to a port needs a protocol match".into());
            }
            if !ctx.family().matches(ip) || !ctx.scope.endpoints.contains(&(*ip, *port)) {
                return Err(format!(
                    "DNAT to {}, which is not an endpoint of the state",
                    kpx_rules::model::join_host_port(ip, *port)
                ));
            }
            Ok(())
        }
        Target::HashMark(h) if nat => {
            if h.modulus == 0 || h.modulus > ctx.dialect.masquerade_mark {
                return Err(format!(
                    "a hash mark's modulus is 1 to {} (the slots sit below the masquerade bit)",
                    ctx.dialect.masquerade_mark
                ));
            }
            Ok(())
        }
        Target::Accept if nat || filter_hook(Hook::FilterNodePorts) => Ok(()),
        Target::Drop | Target::Reject if !nat => Ok(()),
        Target::Masquerade { .. } | Target::SetMark { .. } | Target::HostJump(_) | Target::Redirect(_) => {
            Err("that target is written by the host only".into())
        }
        other => Err(format!("{other:?} is not allowed in the {} table here", rule.table.name())),
    }
}

/// The rule's destination, protocol and port, if it names them exactly.
fn destination(rule: &Rule) -> (Option<std::net::IpAddr>, Option<Protocol>, Option<u16>) {
    let mut out = (None, rule.protocol(), None);
    for m in &rule.matches {
        match m {
            Match::Destination(a) if !a.negate && a.cidr.prefix_len == a.cidr.max_len() => out.0 = Some(a.cidr.addr),
            Match::DestinationPort(p) => out.2 = Some(*p),
            _ => {}
        }
    }
    out
}

/// A hook's rule must match traffic to the state's destinations only.
fn check_scope(scope: &Scope, hook: Hook, rule: &Rule) -> Result<(), String> {
    let (dst, proto, port) = destination(rule);
    let local = rule.matches.iter().any(|m| matches!(m, Match::DestinationTypeLocal { negate: false }));
    let service = || match (dst, proto, port) {
        (Some(ip), Some(p), Some(port)) if scope.destinations.contains(&(ip, p, port)) => Ok(()),
        (Some(ip), Some(p), Some(port)) => Err(format!(
            "{} {p} is not the address, protocol and port of a Service port of the state",
            kpx_rules::model::join_host_port(&ip, port)
        )),
        _ => Err(format!("a rule in {} matches one Service's address (/32 or /128), protocol and port", hook.chain())),
    };
    let node_port = || match (proto, port) {
        (Some(p), Some(port)) if scope.node_ports.contains(&(p, port)) => Ok(()),
        (Some(p), Some(port)) => Err(format!("{p} port {port} is not a node port of the state")),
        _ => Err(format!("a rule in {} matches a node port's protocol and port", hook.chain())),
    };
    match hook {
        Hook::NatServices | Hook::FilterServices | Hook::FilterFirewall => service(),
        Hook::FilterExternalServices if local && dst.is_none() => node_port(),
        Hook::FilterExternalServices => service(),
        Hook::NatNodePorts => node_port(),
        Hook::FilterNodePorts => match (proto, port) {
            (Some(Protocol::Tcp), Some(port)) if scope.health_check_ports.contains(&port) => Ok(()),
            _ => Err("a rule in filter KUBE-NODEPORTS matches tcp and a health-check node port of the state".into()),
        },
    }
}

#[cfg(test)]
mod tests;
