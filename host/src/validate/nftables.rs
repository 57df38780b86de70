//! Confinement of a typed nftables transaction (docs/SECURITY.md,
//! "nftables").
//!
//! - own chains, sets and maps: names from [A-Za-z0-9_./-], starting with a
//!   letter, at most 200 bytes, never a name of the host's; no base chains
//!   (the contract has none), no tables;
//! - own chains are reached only through the host's dispatch maps, whose
//!   keys must be destinations of the state: so an element of service-ips
//!   needs a Service's address, protocol and port; service-nodeports a
//!   node port; cluster-ips a cluster IP; hairpin an endpoint's address
//!   twice; and their verdicts lead to own chains (or drop/reject in the
//!   no-endpoint maps);
//! - DNAT goes to an endpoint of the state, literally or through a map whose
//!   every element is one; the masquerade mark is the only mark written;
//!   affinity sets are the only sets the packet path updates;
//! - lookups name existing sets with keys of their type, within the 16
//!   registers; reject only where the host's filter chains use it;
//! - nothing kept from an earlier sync may point at a destination or
//!   endpoint that has left the state.

// foldhash, seeded at random per process, not SipHash: the checks hash
// every element a plugin returns (SipHash cost a sixth of a 10k-Service
// full sync's checks), and no plugin can observe the seed.
use foldhash::HashMap;
use std::net::IpAddr;

use kpx_rules::model::{IpFamily, Protocol};
use kpx_rules::ops::CtStates;
use kpx_rules::ops::nftables::{
    Data, DataType, Element, Elements, HostSet, KeyExpr, KeyType, MAX_NAME, Match, Op, Rule, SetDecl, SetRef,
    Statement, Transaction, Value, Verdict, VerdictKind, each_element,
};

use super::dense::DenseMap;
use super::scope::Fact;
use super::{Destination, EndpointAddr, Rejected, Scope, shorten, shorten_debug};
use crate::syntax::nftables::{MAX_COMMENT, MAX_KEY_REGISTERS, MAX_TYPEOF_FIELDS, is_host_name, key_registers};

/// Most matches and statements in one rule.
pub const MAX_MATCHES: usize = 16;
pub const MAX_STATEMENTS: usize = 4;

/// Own sets and maps a table may hold beyond twice the state's endpoint
/// slots (each port's endpoints and two, [`Scope::endpoint_slots`]).
/// nf_tables finds a set by walking the table's list of sets, so
/// declaring S sets costs the kernel time in S x S (`nft -f` of 2,000
/// maps: 0.06 s of kernel time; of 16,000: 7.5 s): a plugin gets no more
/// than the state gives reason for. Upstream's own shape (an affinity set
/// per endpoint of each ClientIP port, a map or two per port) stays
/// within, with room for the built-in backend's endpoint maps by count
/// (a map per count a port has had since the last full sync).
pub const EXTRA_SETS: usize = 1024;

/// Why an own object's name is refused, if it is.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Some(format!("names have 1 to {MAX_NAME} bytes"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic())
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_./-".contains(&b))
    {
        return Some("names start with a letter and have only A-Z, a-z, 0-9 and _ . / -".into());
    }
    if is_host_name(name) || name == kpx_rules::ops::nftables::TABLE {
        return Some(format!("{name} is the host's"));
    }
    None
}

/// A reference an object in the kernel makes to the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Ref {
    Destination(Destination),
    NodePort((Protocol, u16)),
    ClusterIp(IpAddr),
    EndpointIp(IpAddr),
    Endpoint(EndpointAddr),
}

/// How often the kernel refers to each fact. An IPv4 fact is packed into
/// two words, with an i32 count: 12 bytes an entry, against 32 for a `Ref`
/// and an i64 (8.7 MB of the host's heap at 10k x 10, in a heaptrack
/// profile, before this). Other facts are held as they are.
#[derive(Debug, Default, Clone)]
struct RefCounts {
    v4: DenseMap<[u32; 2], i32>,
    other: HashMap<Ref, i64>,
}

impl RefCounts {
    /// The words of an IPv4 fact: the scope's packing of the fact
    /// ([`Fact`], which uses at most the low 18 bits of the second word)
    /// with the variant in the second word's top byte. Distinct facts have
    /// distinct words.
    fn pack(r: &Ref) -> Option<[u32; 2]> {
        let (variant, [a, b]) = match r {
            Ref::Destination(d) => (1, d.pack()?),
            Ref::NodePort(n) => (2, n.pack()?),
            Ref::ClusterIp(ip) => (3, ip.pack()?),
            Ref::EndpointIp(ip) => (4, ip.pack()?),
            Ref::Endpoint(e) => (5, e.pack()?),
        };
        Some([a, variant << 24 | b])
    }

    fn get(&self, r: &Ref) -> i64 {
        match Self::pack(r) {
            Some(k) => self.v4.get(&k).map_or(0, i64::from),
            None => self.other.get(r).copied().unwrap_or(0),
        }
    }

    /// Adds `delta` to the fact's count; a count that comes to 0 or below
    /// is dropped when `drop_empty`, kept otherwise (an overlay's deltas).
    fn add(&mut self, r: Ref, delta: i64, drop_empty: bool) {
        match Self::pack(&r) {
            Some(k) => {
                let delta = i32::try_from(delta).unwrap_or(if delta < 0 { i32::MIN } else { i32::MAX });
                let n = self.v4.get_or_insert_with(k, || 0);
                *n = n.saturating_add(delta);
                if drop_empty && *n <= 0 {
                    self.v4.remove(&k);
                }
            }
            None => {
                let n = self.other.entry(r).or_default();
                *n = n.saturating_add(delta);
                if drop_empty && *n <= 0 {
                    self.other.remove(&r);
                }
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.other.is_empty()
    }

    fn reserve(&mut self, family: IpFamily, n: usize) {
        match family {
            IpFamily::V4 => self.v4.reserve(n),
            IpFamily::V6 => self.other.reserve(n),
        }
    }

    /// Adds an overlay's deltas, keeping only the facts still referred to.
    fn merge(&mut self, deltas: RefCounts) {
        if self.is_empty() {
            // A full sync's counts move in whole: no second map of every
            // endpoint and address built beside them.
            *self = deltas;
            self.v4.retain(|_, n| *n > 0);
            self.other.retain(|_, n| *n > 0);
            return;
        }
        for (k, delta) in deltas.v4 {
            let n = self.v4.get(&k).unwrap_or(0).saturating_add(delta);
            if n > 0 {
                self.v4.insert(k, n);
            } else {
                self.v4.remove(&k);
            }
        }
        for (r, delta) in deltas.other {
            self.add(r, delta, true);
        }
    }
}

/// What the host knows of the plugin's objects in the kernel: own chains
/// (and the endpoints each DNATs to), own sets, the data of endpoint-map
/// elements, and how often the kernel refers to each fact of the state.
#[derive(Debug, Default, Clone)]
pub struct Model {
    chains: HashMap<String, Vec<EndpointAddr>>,
    sets: HashMap<String, SetDecl>,
    /// Endpoint maps' elements (values are never None here: the type is
    /// the overlay's, so that a new map's elements move in whole).
    endpoint_data: HashMap<String, Entries>,
    /// How often the kernel refers to each fact (always above 0).
    refs: RefCounts,
}

impl Model {
    pub fn chain_exists(&self, name: &str) -> bool {
        self.chains.contains_key(name)
    }

    pub fn set(&self, name: &str) -> Option<&SetDecl> {
        self.sets.get(name)
    }

    pub fn sets(&self) -> impl Iterator<Item = &SetDecl> {
        self.sets.values()
    }

    pub fn chains(&self) -> impl Iterator<Item = &String> {
        self.chains.keys()
    }

    /// Records what a written transaction did.
    pub fn commit(&mut self, checked: Checked) {
        let o = checked.overlay;
        if checked.full {
            *self = Model::default();
        }
        for (name, chain) in o.chains {
            match chain {
                Some(eps) => {
                    self.chains.insert(name, eps);
                }
                None => {
                    self.chains.remove(&name);
                }
            }
        }
        for (name, mut map) in o.endpoint_data {
            if map.flushed {
                self.endpoint_data.remove(&name);
            }
            if map.entries.is_empty() {
                continue;
            }
            match self.endpoint_data.get_mut(&name) {
                Some(entries) => entries.apply(map.entries),
                None => {
                    // A new (or flushed) map: its elements move in whole.
                    map.entries.retain_present();
                    self.endpoint_data.insert(name, map.entries);
                }
            }
        }
        for (name, set) in o.sets {
            match set {
                Some(d) => {
                    self.sets.insert(name, d);
                }
                None => {
                    self.sets.remove(&name);
                    self.endpoint_data.remove(&name);
                }
            }
        }
        self.refs.merge(o.refs);
    }
}

/// A transaction's changes to the model, kept apart until it is written.
#[derive(Debug, Default)]
struct Overlay {
    /// Some: the chain exists with these DNATs; None: deleted.
    chains: HashMap<String, Option<Vec<EndpointAddr>>>,
    sets: HashMap<String, Option<SetDecl>>,
    /// Endpoint maps this transaction changes.
    endpoint_data: HashMap<String, MapOverlay>,
    refs: RefCounts,
}

/// One endpoint map's elements as a transaction leaves them.
#[derive(Debug, Default)]
struct MapOverlay {
    /// The kernel's elements were flushed (or the map deleted) first.
    flushed: bool,
    /// Some: the element now holds this endpoint; None: deleted.
    entries: Entries,
}

/// A transaction that passed, with what it does to the model.
#[derive(Debug, Default)]
pub struct Checked {
    full: bool,
    overlay: Overlay,
}

impl Checked {
    /// Own sets that exist after the transaction (a full sync keeps these).
    pub fn sets(&self) -> impl Iterator<Item = &SetDecl> {
        self.overlay.sets.values().flatten()
    }

    /// Own chains that exist after the transaction, of those it names.
    pub fn chains(&self) -> impl Iterator<Item = &String> {
        self.overlay.chains.iter().filter(|(_, c)| c.is_some()).map(|(n, _)| n)
    }
}

/// What a transaction is checked against.
pub struct Context<'a> {
    pub plugin: &'a str,
    pub family: IpFamily,
    pub scope: &'a Scope,
    pub model: &'a Model,
    pub full: bool,
}

/// The model as the transaction has changed it so far.
struct Pending<'a> {
    ctx: &'a Context<'a>,
    o: Overlay,
}

impl Pending<'_> {
    fn model(&self) -> Option<&Model> {
        (!self.ctx.full).then_some(self.ctx.model)
    }

    /// A chain's entry in the overlay, copied from the model the first time.
    fn chain_mut(&mut self, name: &str) -> &mut Option<Vec<EndpointAddr>> {
        let model = (!self.ctx.full).then_some(self.ctx.model);
        self.o.chains.entry(name.to_string()).or_insert_with(|| model.and_then(|m| m.chains.get(name).cloned()))
    }

    fn chain_exists(&self, name: &str) -> bool {
        match self.o.chains.get(name) {
            Some(c) => c.is_some(),
            None => self.model().is_some_and(|m| m.chains.contains_key(name)),
        }
    }

    fn set(&self, s: &SetRef) -> Option<SetDecl> {
        match s {
            SetRef::Host(h) => Some(h.declaration()),
            SetRef::Own(name) => match self.o.sets.get(name) {
                Some(d) => d.clone(),
                None => self.model().and_then(|m| m.sets.get(name).cloned()),
            },
        }
    }

    fn reference(&mut self, r: Ref, delta: i64) {
        self.o.refs.add(r, delta, false);
    }

    /// Every element of an endpoint map goes (flush or delete): the cost
    /// is that map's size, once.
    fn empty_endpoint_map(&mut self, set: &str) {
        let model = (!self.ctx.full).then_some(self.ctx.model);
        let map = self.o.endpoint_data.entry(set.to_string()).or_default();
        let mut gone: Vec<EndpointAddr> = Vec::new();
        if !map.flushed
            && let Some(entries) = model.and_then(|m| m.endpoint_data.get(set))
        {
            gone.extend(entries.iter().filter(|(key, _)| !map.entries.contains_key(key)).filter_map(|(_, e)| e));
        }
        gone.extend(map.entries.take_endpoints());
        map.flushed = true;
        for e in gone {
            self.reference(Ref::Endpoint(e), -1);
        }
    }

    /// A chain's rules go (flush or delete): the cost is the chain's
    /// DNATs, read in place (never copied).
    fn empty_chain(&mut self, name: &str) {
        let model = (!self.ctx.full).then_some(self.ctx.model);
        let eps: &[EndpointAddr] = match self.o.chains.get(name) {
            Some(c) => c.as_deref().unwrap_or_default(),
            None => model.and_then(|m| m.chains.get(name)).map(Vec::as_slice).unwrap_or_default(),
        };
        for &e in eps {
            self.o.refs.add(Ref::Endpoint(e), -1, false);
        }
    }
}

fn reject(ctx: &Context, i: usize, op: &Op, reason: impl Into<String>) -> Rejected {
    Rejected {
        plugin: ctx.plugin.to_string(),
        at: format!("operation {}", i + 1),
        item: shorten_debug(op),
        reason: shorten(reason.into()),
    }
}

/// Checks a transaction; the first violation refuses it whole.
pub fn check(ctx: &Context, tx: &Transaction) -> Result<Checked, Rejected> {
    let mut p = Pending { ctx, o: Overlay::default() };
    if ctx.full {
        // A full sync refers to about every fact of the state: room for
        // them at once, not a table rebuilt at every doubling (in the
        // table of the family's facts: IPv4 ones pack, IPv6 ones do not).
        let s = ctx.scope;
        let facts =
            s.destinations.len() + s.node_ports.len() + s.cluster_ips.len() + s.endpoints.len() + s.endpoint_ips.len();
        p.o.refs.reserve(ctx.family, facts);
    }
    for (i, op) in tx.ops.iter().enumerate() {
        check_op(&mut p, op).map_err(|why| reject(ctx, i, op, why))?;
    }
    check_departed(ctx, &p)?;
    check_set_count(ctx, &p)?;
    Ok(Checked { full: ctx.full, overlay: p.o })
}

/// The own sets the table holds after the transaction, within
/// [`EXTRA_SETS`] and twice the state's endpoint slots.
fn check_set_count(ctx: &Context, p: &Pending) -> Result<(), Rejected> {
    let before = if ctx.full { 0 } else { ctx.model.sets.len() };
    let mut after = before;
    for (name, set) in &p.o.sets {
        let existed = !ctx.full && ctx.model.sets.contains_key(name);
        match (existed, set.is_some()) {
            (false, true) => after += 1,
            (true, false) => after -= 1,
            _ => {}
        }
    }
    let allowed = 2 * ctx.scope.endpoint_slots + EXTRA_SETS;
    if after <= allowed {
        return Ok(());
    }
    Err(Rejected {
        plugin: ctx.plugin.to_string(),
        at: "the transaction".into(),
        item: String::new(),
        reason: format!(
            "it leaves {after} own sets and maps; the state allows {allowed} (twice each Service port's endpoints and two, and {EXTRA_SETS}): the kernel's cost of a set grows with every other set in the table"
        ),
    })
}

fn own_chain(p: &Pending, name: &str) -> Result<(), String> {
    if let Some(why) = name_problem(name) {
        return Err(why);
    }
    if !p.chain_exists(name) {
        return Err(format!("chain {name} is not one of the plugin's"));
    }
    Ok(())
}

fn check_op(p: &mut Pending, op: &Op) -> Result<(), String> {
    match op {
        Op::AddChain(name) => {
            if let Some(why) = name_problem(name) {
                return Err(why);
            }
            // `add chain` of an existing chain changes nothing (as in the
            // kernel): its DNATs stay where they are, uncopied, so that
            // redeclaring a long chain again and again costs nothing more.
            if !p.chain_exists(name) {
                p.o.chains.insert(name.clone(), Some(Vec::new()));
            }
        }
        Op::FlushChain(name) => {
            own_chain(p, name)?;
            p.empty_chain(name);
            p.o.chains.insert(name.clone(), Some(Vec::new()));
        }
        Op::DeleteChain(name) => {
            own_chain(p, name)?;
            p.empty_chain(name);
            p.o.chains.insert(name.clone(), None);
        }
        Op::AddSet(d) => {
            if let Some(why) = name_problem(&d.name) {
                return Err(why);
            }
            check_declaration(p.ctx.family, d)?;
            if let Some(old) = p.set(&SetRef::Own(d.name.clone()))
                && old != *d
            {
                return Err(format!("set {} exists with another declaration; delete it first", d.name));
            }
            p.o.sets.insert(d.name.clone(), Some(d.clone()));
        }
        Op::FlushSet(name) | Op::DeleteSet(name) => {
            if let Some(why) = name_problem(name) {
                return Err(why);
            }
            if p.set(&SetRef::Own(name.clone())).is_none() {
                return Err(format!("set {name} is not one of the plugin's"));
            }
            p.empty_endpoint_map(name);
            if matches!(op, Op::DeleteSet(_)) {
                p.o.sets.insert(name.clone(), None);
            }
        }
        Op::AddRule(rule) => {
            own_chain(p, &rule.chain)?;
            check_rule(p, rule)?;
            if let Verdict::Dnat(ip, port) = rule.verdict {
                if let Some(eps) = p.chain_mut(&rule.chain) {
                    eps.push((ip, port));
                }
                p.reference(Ref::Endpoint((ip, port)), 1);
            }
        }
        Op::AddElements(e) => check_elements(p, e, true)?,
        Op::DeleteElements(e) => check_elements(p, e, false)?,
        Op::AddBaseChain(b) => return Err(format!("base chain {} is the host's", b.name)),
    }
    Ok(())
}

fn check_declaration(family: IpFamily, d: &SetDecl) -> Result<(), String> {
    check_comment(&d.comment)?;
    if d.key.is_empty() || d.key.len() > 8 {
        return Err("a set key has 1 to 8 fields".into());
    }
    let regs: usize = d.key.iter().map(|k| k.words(family)).sum();
    if regs > MAX_KEY_REGISTERS as usize {
        return Err("a set key fits 16 registers of 32 bits".into());
    }
    if d.key.contains(&KeyType::Integer) && d.key.len() > MAX_TYPEOF_FIELDS {
        // Its `typeof` would be cut: the node's saved ruleset (`nft list
        // ruleset > f; nft -f f`) would no longer load.
        return Err(format!(
            "a set whose key has an integer field has at most {} fields (nft cannot read a longer one back)",
            MAX_TYPEOF_FIELDS
        ));
    }
    let cidrs = d.key.iter().filter(|k| **k == KeyType::Cidr).count();
    if cidrs > 0 && !d.interval {
        return Err("a cidr key field needs an interval set".into());
    }
    if d.interval && d.key.len() < 2 {
        return Err("an interval set has at least two key fields (kpx writes concatenated ranges only)".into());
    }
    if let Some(t) = d.timeout_seconds {
        if d.key != [KeyType::Address] || d.data.is_some() || d.interval {
            return Err("an affinity set holds source addresses only".into());
        }
        if t == 0 || t > 86400 * 7 {
            return Err("an affinity timeout is 1 s to 7 days".into());
        }
    }
    Ok(())
}

/// Lookup keys must fill the set's key types in order.
fn check_keys(family: IpFamily, keys: &[KeyExpr], decl: &SetDecl) -> Result<(), String> {
    if key_registers(family, keys) > MAX_KEY_REGISTERS {
        return Err("a key fits 16 registers of 32 bits".into());
    }
    let fits = keys.len() == decl.key.len()
        && keys.iter().zip(&decl.key).all(|(k, t)| match (k.key_type(), t) {
            (KeyType::Address, KeyType::Cidr) => decl.interval,
            (a, b) => a == *b,
        });
    for k in keys {
        match k {
            KeyExpr::NumgenRandom(0) | KeyExpr::NumgenIncrement(0) | KeyExpr::Jhash { modulus: 0, .. } => {
                return Err("a modulus is at least 1".into());
            }
            _ => {}
        }
    }
    if !fits {
        return Err(format!("key {keys:?} does not fit set {} of {:?}", decl.name, decl.key));
    }
    Ok(())
}

fn check_comment(comment: &Option<String>) -> Result<(), String> {
    match comment.as_deref().and_then(|c| kpx_rules::ops::comment_problem(c, MAX_COMMENT)) {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

fn check_rule(p: &mut Pending, rule: &Rule) -> Result<(), String> {
    let family = p.ctx.family;
    check_comment(&rule.comment)?;
    if rule.matches.len() > MAX_MATCHES || rule.statements.len() > MAX_STATEMENTS {
        return Err(format!("a rule has at most {MAX_MATCHES} matches and {MAX_STATEMENTS} statements"));
    }
    let protocol = rule.matches.iter().any(|m| matches!(m, Match::Protocol { negate: false, .. }));
    for m in &rule.matches {
        match m {
            Match::Address { cidr, .. } => {
                if !family.matches(&cidr.addr) || cidr.prefix_len > cidr.max_len() {
                    return Err(format!("{cidr} is not an {family} prefix"));
                }
            }
            Match::InInterface { name, .. } => {
                if let Some(why) = kpx_rules::ops::iptables::interface_name_problem(name) {
                    return Err(why);
                }
            }
            Match::CtState { states, .. } => {
                if states.is_empty() || states.intersects(CtStates::SNAT | CtStates::DNAT) {
                    return Err("ct state names states (snat and dnat are not states in nftables)".into());
                }
            }
            Match::Lookup { keys, set, .. } => {
                let decl = p.set(set).ok_or_else(|| format!("set {} does not exist", set.name()))?;
                check_keys(family, keys, &decl)?;
            }
            Match::Protocol { .. } | Match::DestinationPort { .. } | Match::FibLocal { .. } | Match::Mark { .. } => {}
            Match::CtDnat { .. } => return Err("that match is the host's".into()),
        }
    }
    for s in &rule.statements {
        match s {
            Statement::Counter | Statement::MasqueradeMark => {}
            Statement::AffinityUpdate(set) => match p.set(&SetRef::Own(set.clone())) {
                Some(d) if d.timeout_seconds.is_some() => {}
                _ => return Err(format!("{set} is not one of the plugin's affinity sets")),
            },
            Statement::MarkXor(_) | Statement::NamedCounter(_) | Statement::Masquerade { .. } => {
                return Err("that statement is the host's".into());
            }
        }
    }
    match &rule.verdict {
        Verdict::Continue | Verdict::Accept | Verdict::Drop | Verdict::Return => Ok(()),
        Verdict::Reject => {
            Err("reject is the host's (its endpoint checks); the plugin's chains hang from nat hooks".into())
        }
        Verdict::Jump(c) | Verdict::Goto(c) => own_chain(p, c),
        Verdict::Dnat(ip, port) => {
            if !protocol {
                return Err("dnat to a port needs a protocol match".into());
            }
            if !family.matches(ip) || !p.ctx.scope.endpoints.contains(&(*ip, *port)) {
                return Err(format!(
                    "dnat to {}, which is not an endpoint of the state",
                    kpx_rules::model::join_host_port(ip, *port)
                ));
            }
            Ok(())
        }
        Verdict::DnatMap { keys, map } | Verdict::Vmap { keys, map } => {
            let SetRef::Own(_) = map else {
                return Err("maps a rule looks up for a verdict or dnat are the plugin's".into());
            };
            let decl = p.set(map).ok_or_else(|| format!("map {} does not exist", map.name()))?;
            check_keys(family, keys, &decl)?;
            let want =
                if matches!(rule.verdict, Verdict::DnatMap { .. }) { DataType::Endpoint } else { DataType::Verdict };
            if decl.data != Some(want) {
                return Err(format!("{} is not a map of {want:?}", decl.name));
            }
            if want == DataType::Endpoint && !protocol {
                return Err("dnat to a port needs a protocol match".into());
            }
            Ok(())
        }
    }
}

fn check_elements(p: &mut Pending, e: &Elements, add: bool) -> Result<(), String> {
    let family = p.ctx.family;
    let decl = p.set(&e.set).ok_or_else(|| format!("set {} does not exist", e.set.name()))?;
    if decl.timeout_seconds.is_some() {
        return Err("affinity sets are filled by the kernel only".into());
    }
    if let SetRef::Host(h) = e.set
        && !h.plugin_fills()
    {
        return Err(format!("{} is filled by the host only", h.name()));
    }
    if e.chains.len() > e.words.len() {
        return Err("more chain names than words".into());
    }
    let scope = p.ctx.scope;
    let name = e.set.name();
    let elements = each_element(&decl, family, e, add).map_err(|d| d.to_string())?;
    // An endpoint map's overlay, taken out for the list and put back
    // after it: one lookup of the map by name, not two an element.
    let mut map = (decl.data == Some(DataType::Endpoint)).then(|| {
        let mut map = p.o.endpoint_data.remove(name).unwrap_or_default();
        map.entries.reserve(elements.size_hint().0);
        map
    });
    let ctx = p.ctx;
    let model_map = (!ctx.full).then_some(ctx.model).and_then(|m| m.endpoint_data.get(name));
    // One element at a time: nothing is materialised for the whole list.
    for (i, decoded) in elements.enumerate() {
        let at = |why: String| format!("element {}: {why}", i + 1);
        let (el, key) = decoded.map_err(|d| d.to_string())?;
        for v in &el.key {
            if let Value::Address(ip) = v
                && !family.matches(ip)
            {
                return Err(at(format!("{ip} is not an {family} address")));
            }
        }
        // What an element refers to must be in the state when it is added;
        // a deleted one may refer to what just left.
        let refs = element_refs(&e.set, &el, add.then_some(scope)).map_err(at)?;
        if add {
            check_data(p, &e.set, &decl, &el).map_err(at)?;
        }
        let delta = if add { 1 } else { -1 };
        for r in refs {
            p.reference(r, delta);
        }
        if let Some(map) = &mut map {
            let current = match map.entries.get(key) {
                Some(e) => e,
                None if map.flushed => None,
                None => model_map.and_then(|m| m.get(key)).flatten(),
            };
            let change = if add {
                let Some(Data::Endpoint(ip, port)) = el.data else { return Err(at("endpoint data missing".into())) };
                if current.is_some() {
                    return Err(at(format!("{:?} is in {name} already", el.key)));
                }
                p.reference(Ref::Endpoint((ip, port)), 1);
                Some((ip, port))
            } else {
                let Some(old) = current else { return Err(at(format!("{:?} is not in {name}", el.key))) };
                p.reference(Ref::Endpoint(old), -1);
                None
            };
            map.entries.insert(key, change);
        }
    }
    if let Some(map) = map {
        p.o.endpoint_data.insert(name.to_string(), map);
    }
    Ok(())
}

/// The state an element of a host set refers to; with `scope`, an error
/// when that is not in the state.
fn element_refs(set: &SetRef, el: &Element, scope: Option<&Scope>) -> Result<Vec<Ref>, String> {
    let SetRef::Host(h) = set else { return Ok(Vec::new()) };
    let in_scope = |check: &dyn Fn(&Scope) -> bool| scope.is_none_or(check);
    let destination = |k: &[Value]| match k {
        [Value::Address(ip), Value::Protocol(p), Value::Port(port), ..] => {
            let d = (*ip, *p, *port);
            if in_scope(&|s| s.destinations.contains(&d)) {
                Ok(Ref::Destination(d))
            } else {
                Err(format!(
                    "{} {p} is not the address, protocol and port of a Service port of the state",
                    kpx_rules::model::join_host_port(ip, *port)
                ))
            }
        }
        _ => Err("not a destination".into()),
    };
    let node_port = |k: &[Value]| match k {
        [Value::Protocol(p), Value::Port(port)] if in_scope(&|s| s.node_ports.contains(&(*p, *port))) => {
            Ok(Ref::NodePort((*p, *port)))
        }
        [Value::Protocol(p), Value::Port(port)] => Err(format!("{p} port {port} is not a node port of the state")),
        _ => Err("not a node port".into()),
    };
    Ok(match h {
        HostSet::ServiceIps | HostSet::NoEndpointServices | HostSet::FirewallIps | HostSet::FirewallAllow => {
            vec![destination(&el.key)?]
        }
        HostSet::ServiceNodePorts | HostSet::NoEndpointNodePorts => vec![node_port(&el.key)?],
        HostSet::ClusterIps => match el.key.as_slice() {
            [Value::Address(ip)] if in_scope(&|s| s.cluster_ips.contains(ip)) => vec![Ref::ClusterIp(*ip)],
            _ => return Err(format!("{:?} is not a cluster IP of the state", el.key)),
        },
        HostSet::Hairpin => match el.key.as_slice() {
            [Value::Address(a), Value::Address(b)] if a == b && in_scope(&|s| s.endpoint_ips.contains(a)) => {
                vec![Ref::EndpointIp(*a)]
            }
            _ => return Err("a hairpin element is one endpoint address, twice".into()),
        },
        HostSet::NodePortIps | HostSet::LocalhostNodePortRejects => {
            return Err(format!("{} is filled by the host only", h.name()));
        }
    })
}

fn check_data(p: &Pending, set: &SetRef, decl: &SetDecl, el: &Element) -> Result<(), String> {
    let host = match set {
        SetRef::Host(h) => Some(*h),
        SetRef::Own(_) => None,
    };
    match &el.data {
        None => Ok(()),
        Some(Data::Endpoint(ip, port)) => {
            if p.ctx.scope.endpoints.contains(&(*ip, *port)) {
                Ok(())
            } else {
                Err(format!("{} is not an endpoint of the state", kpx_rules::model::join_host_port(ip, *port)))
            }
        }
        Some(Data::Verdict(kind, chain)) => {
            let to_own = || own_chain(p, chain.as_deref().unwrap_or_default());
            match (host, kind) {
                (Some(HostSet::ServiceIps | HostSet::ServiceNodePorts), VerdictKind::Jump | VerdictKind::Goto) => {
                    to_own()
                }
                (Some(HostSet::ServiceIps | HostSet::ServiceNodePorts), _) => {
                    Err(format!("{} leads to one of the plugin's chains", decl.name))
                }
                (Some(_), VerdictKind::Drop | VerdictKind::Reject) => Ok(()),
                (Some(_), _) => Err(format!("{} holds drop or reject", decl.name)),
                (None, VerdictKind::Jump | VerdictKind::Goto) => to_own(),
                (None, VerdictKind::Reject) => {
                    Err("reject is the host's (its endpoint checks); the plugin's maps are looked up from nat hooks"
                        .into())
                }
                (None, _) => Ok(()),
            }
        }
    }
}

/// Nothing may still refer to what left the state since the last sync.
fn check_departed(ctx: &Context, p: &Pending) -> Result<(), Rejected> {
    let left = |r: Ref| {
        let before = p.model().map_or(0, |m| m.refs.get(&r));
        before.saturating_add(p.o.refs.get(&r)) > 0
    };
    let fail = |what: String| Rejected {
        plugin: ctx.plugin.to_string(),
        at: "the kernel's objects after this sync".into(),
        item: what.clone(),
        reason: format!("{what}, which has left the state, would still be referred to"),
    };
    let s = ctx.scope;
    for d in s.destinations.removed() {
        if left(Ref::Destination(*d)) {
            return Err(fail(format!("{} {}", kpx_rules::model::join_host_port(&d.0, d.2), d.1)));
        }
    }
    for n in s.node_ports.removed() {
        if left(Ref::NodePort(*n)) {
            return Err(fail(format!("node port {} {}", n.0, n.1)));
        }
    }
    for ip in s.cluster_ips.removed() {
        if left(Ref::ClusterIp(*ip)) {
            return Err(fail(format!("cluster IP {ip}")));
        }
    }
    for e in s.endpoints.removed() {
        if left(Ref::Endpoint(*e)) {
            return Err(fail(format!("endpoint {}", kpx_rules::model::join_host_port(&e.0, e.1))));
        }
    }
    for ip in s.endpoint_ips.removed() {
        if left(Ref::EndpointIp(*ip)) {
            return Err(fail(format!("endpoint address {ip}")));
        }
    }
    Ok(())
}

mod entries;
#[cfg(test)]
mod tests;

use entries::Entries;
