//! Tracing through the `kube-proxy` table: a model built by applying
//! typed operations (the host's frame and a plugin's transaction, or what
//! the kernel gives back), walked hook by hook in priority order.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::{Exit, Flow, MAX_DEPTH, Node, Packet, Step, Trace, TraceError, ending, err, interface_matches};
use crate::model::IpFamily;
use crate::ops::CtStates;
use crate::ops::nftables::{
    AddressField, BaseChain, Data, Element, KeyExpr, Match, NfHook, Op, Rule, SetDecl, SetRef, Statement, TABLE,
    Transaction, Value, Verdict, VerdictKind, decode_elements, decode_keys,
};

/// One chain: its hook if a base chain, and its rules.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

/// The table as the tracer sees it.
#[derive(Debug, Clone)]
pub struct Model {
    pub family: IpFamily,
    pub masquerade_mark: u32,
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, (SetDecl, Vec<Element>)>,
}

impl Model {
    pub fn new(family: IpFamily, masquerade_mark: u32) -> Model {
        Model { family, masquerade_mark, chains: BTreeMap::new(), sets: BTreeMap::new() }
    }

    /// Applies a transaction's operations, as the kernel would.
    pub fn apply(&mut self, tx: &Transaction) -> Result<(), TraceError> {
        for op in &tx.ops {
            self.apply_op(op)?;
        }
        Ok(())
    }

    pub fn apply_op(&mut self, op: &Op) -> Result<(), TraceError> {
        match op {
            Op::AddBaseChain(b) => self.chains.entry(b.name.to_string()).or_default().base = Some(*b),
            Op::AddChain(c) => {
                self.chains.entry(c.clone()).or_default();
            }
            Op::FlushChain(c) => self.chains.entry(c.clone()).or_default().rules.clear(),
            Op::DeleteChain(c) => {
                self.chains.remove(c);
            }
            Op::AddSet(d) => {
                self.sets.entry(d.name.clone()).or_insert_with(|| (d.clone(), Vec::new()));
            }
            Op::FlushSet(s) => {
                if let Some((_, elements)) = self.sets.get_mut(s) {
                    elements.clear();
                }
            }
            Op::DeleteSet(s) => {
                self.sets.remove(s);
            }
            Op::AddRule(r) => self.chains.entry(r.chain.clone()).or_default().rules.push(r.clone()),
            Op::AddElements(e) | Op::DeleteElements(e) => {
                let family = self.family;
                let (decl, elements) = self
                    .sets
                    .get_mut(e.set.name())
                    .ok_or_else(|| err(e.set.name(), "elements of a set that does not exist"))?;
                let add = matches!(op, Op::AddElements(_));
                let new = if add { decode_elements(decl, family, e) } else { decode_keys(decl, family, e) }
                    .map_err(|d| err(e.set.name(), d.to_string()))?;
                if add {
                    elements.extend(new);
                } else {
                    elements.retain(|x| !new.iter().any(|n| n.key == x.key));
                }
            }
        }
        Ok(())
    }
}

/// One value of a lookup key while walking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Val {
    Address(IpAddr),
    Protocol(crate::model::Protocol),
    Port(u16),
    Integer(u32),
}

fn value_matches(key: &Value, v: &Val) -> bool {
    match (key, v) {
        (Value::Address(a), Val::Address(b)) => a == b,
        (Value::Cidr(c), Val::Address(b)) => c.contains(b),
        (Value::Protocol(a), Val::Protocol(b)) => a == b,
        (Value::Port(a), Val::Port(b)) => a == b,
        (Value::Integer(a), Val::Integer(b)) => a == b,
        _ => false,
    }
}

/// Where a rule is: its chain, the chain's rules, its index, the depth.
#[derive(Clone, Copy)]
struct At<'a> {
    chain: &'a str,
    rules: &'a [Rule],
    index: usize,
    depth: usize,
}

struct Walker<'a> {
    model: &'a Model,
    node: &'a Node,
    packet: &'a Packet,
}

impl Walker<'_> {
    fn address(&self, field: AddressField, flow: &Flow) -> IpAddr {
        match field {
            AddressField::Source => self.packet.src,
            AddressField::Destination => flow.dst(self.packet).0,
        }
    }

    /// Every value a key can take (numgen and hashes: every slot).
    fn keys(&self, keys: &[KeyExpr], flow: &Flow) -> Vec<Vec<Val>> {
        let mut out: Vec<Vec<Val>> = vec![Vec::new()];
        for k in keys {
            let choices: Vec<Val> = match *k {
                KeyExpr::Address(f) => vec![Val::Address(self.address(f, flow))],
                KeyExpr::Protocol => vec![Val::Protocol(self.packet.protocol)],
                KeyExpr::DestinationPort => vec![Val::Port(flow.dst(self.packet).1)],
                KeyExpr::NumgenRandom(n) | KeyExpr::NumgenIncrement(n) => (0..n).map(Val::Integer).collect(),
                // The kernel's jhash: one slot, as the kernel computes it.
                KeyExpr::Jhash { field, modulus, seed } => {
                    let hash = crate::plan::jhash_address(self.address(field, flow), seed);
                    vec![Val::Integer(crate::plan::scale(hash, modulus))]
                }
            };
            out = out
                .into_iter()
                .flat_map(|prefix| {
                    choices.iter().map(move |c| {
                        let mut k = prefix.clone();
                        k.push(*c);
                        k
                    })
                })
                .collect();
        }
        out
    }

    fn set(&self, s: &SetRef) -> Result<&(SetDecl, Vec<Element>), TraceError> {
        self.model.sets.get(s.name()).ok_or_else(|| err(s.name(), "no such set"))
    }

    fn lookup<'s>(&self, s: &'s (SetDecl, Vec<Element>), key: &[Val]) -> Option<&'s Element> {
        s.1.iter().find(|e| e.key.len() == key.len() && e.key.iter().zip(key).all(|(k, v)| value_matches(k, v)))
    }

    fn run_chain(&self, name: &str, flow: Flow, depth: usize) -> Result<Vec<(Flow, Exit)>, TraceError> {
        if depth > MAX_DEPTH {
            return Err(err(name, "jumps nest too deep"));
        }
        let chain = self.model.chains.get(name).ok_or_else(|| err(name, "no such chain"))?;
        self.run_rules(name, &chain.rules, 0, flow, depth)
    }

    /// A verdict's outcomes (jumps followed); `at` is the rule that gave it.
    fn verdict(
        &self,
        at: At,
        kind: VerdictKind,
        to: Option<&str>,
        flow: Flow,
    ) -> Result<Vec<(Flow, Exit)>, TraceError> {
        let At { chain, rules, index: i, depth } = at;
        Ok(match kind {
            VerdictKind::Drop => vec![(flow, Exit::Drop)],
            VerdictKind::Accept => vec![(flow, Exit::Accept)],
            VerdictKind::Return => vec![(flow, Exit::Return)],
            VerdictKind::Reject => vec![(flow, Exit::Reject)],
            VerdictKind::Jump | VerdictKind::Goto => {
                let to = to.ok_or_else(|| err(chain, "a jump without a chain"))?;
                let mut out = Vec::new();
                for (f, exit) in self.run_chain(to, flow, depth + 1)? {
                    match exit {
                        Exit::Return if kind == VerdictKind::Jump => {
                            out.extend(self.run_rules(chain, rules, i + 1, f, depth)?)
                        }
                        other => out.push((f, other)),
                    }
                }
                out
            }
        })
    }

    fn matches(&self, m: &Match, flow: &Flow) -> Result<bool, TraceError> {
        let p = self.packet;
        let (dst, dport) = flow.dst(p);
        Ok(match m {
            Match::Address { field, negate, cidr } => cidr.contains(&self.address(*field, flow)) != *negate,
            Match::Protocol { negate, protocol } => (*protocol == p.protocol) != *negate,
            Match::DestinationPort { negate, port } => (*port == dport) != *negate,
            Match::InInterface { negate, name, prefix } => interface_matches(p, name, *prefix) != *negate,
            Match::FibLocal { field, negate } => {
                let ip = if *field == AddressField::Source { p.src } else { dst };
                self.node.is_local(&ip) != *negate
            }
            Match::CtState { negate, states } => states.contains(CtStates::NEW) != *negate,
            // The connection was DNATed: the walk rewrote its destination.
            Match::CtDnat { negate } => flow.dnat.is_some() != *negate,
            Match::Mark { negate, value, mask } => ((flow.mark & mask) == *value) != *negate,
            Match::Lookup { keys, set, negate } => {
                let s = self.set(set)?;
                // Affinity sets hold what earlier packets left: nothing here.
                let hit =
                    s.0.timeout_seconds.is_none() && self.keys(keys, flow).iter().any(|k| self.lookup(s, k).is_some());
                hit != *negate
            }
        })
    }

    fn run_rules(
        &self,
        chain: &str,
        rules: &[Rule],
        start: usize,
        flow: Flow,
        depth: usize,
    ) -> Result<Vec<(Flow, Exit)>, TraceError> {
        let Some(rule) = rules.get(start) else {
            return Ok(vec![(flow, Exit::Return)]);
        };
        let next = |f: Flow| self.run_rules(chain, rules, start + 1, f, depth);
        let at = At { chain, rules, index: start, depth };
        for m in &rule.matches {
            if !self.matches(m, &flow)? {
                return next(flow);
            }
        }
        let mut flow = flow;
        flow.path.push(Step { table: TABLE.into(), chain: chain.into(), index: start });
        for s in &rule.statements {
            match s {
                Statement::Counter | Statement::NamedCounter(_) | Statement::AffinityUpdate(_) => {}
                Statement::MasqueradeMark => flow.mark |= self.model.masquerade_mark,
                Statement::MarkXor(v) => flow.mark ^= v,
                Statement::Masquerade { .. } => {
                    flow.masquerade = true;
                    return Ok(vec![(flow, Exit::Accept)]);
                }
            }
        }
        match &rule.verdict {
            Verdict::Continue => next(flow),
            Verdict::Accept => Ok(vec![(flow, Exit::Accept)]),
            Verdict::Drop => Ok(vec![(flow, Exit::Drop)]),
            Verdict::Reject => Ok(vec![(flow, Exit::Reject)]),
            Verdict::Return => Ok(vec![(flow, Exit::Return)]),
            Verdict::Jump(c) => self.verdict(at, VerdictKind::Jump, Some(c), flow),
            Verdict::Goto(c) => self.verdict(at, VerdictKind::Goto, Some(c), flow),
            Verdict::Dnat(ip, port) => {
                flow.dnat = Some((*ip, *port));
                Ok(vec![(flow, Exit::Accept)])
            }
            Verdict::DnatMap { keys, map } => {
                let s = self.set(map)?;
                let mut out = Vec::new();
                for k in self.keys(keys, &flow) {
                    if let Some(Element { data: Some(Data::Endpoint(ip, port)), .. }) = self.lookup(s, &k) {
                        let mut f = flow.clone();
                        f.dnat = Some((*ip, *port));
                        out.push((f, Exit::Accept));
                    }
                }
                if out.is_empty() {
                    // No element: the rule does nothing and the chain goes on.
                    flow.path.pop();
                    return next(flow);
                }
                Ok(out)
            }
            Verdict::Vmap { keys, map } => {
                let s = self.set(map)?;
                let mut out = Vec::new();
                let mut hit = false;
                for k in self.keys(keys, &flow) {
                    if s.0.timeout_seconds.is_some() {
                        continue;
                    }
                    if let Some(Element { data: Some(Data::Verdict(kind, to)), .. }) = self.lookup(s, &k) {
                        hit = true;
                        out.extend(self.verdict(at, *kind, to.as_deref(), flow.clone())?);
                    }
                }
                if !hit {
                    flow.path.pop();
                    return next(flow);
                }
                Ok(out)
            }
        }
    }

    /// Runs every base chain of a hook, in priority order.
    fn run_hook(&self, hook: NfHook, flow: Flow) -> Result<Vec<(Flow, Exit)>, TraceError> {
        let mut chains: Vec<(&String, i32)> = self
            .model
            .chains
            .iter()
            .filter_map(|(name, c)| c.base.filter(|b| b.hook == hook).map(|b| (name, b.priority)))
            .collect();
        chains.sort_by_key(|(_, p)| *p);
        let mut flows = vec![(flow, Exit::Accept)];
        for (name, _) in chains {
            let mut next = Vec::new();
            for (f, exit) in flows {
                if exit != Exit::Accept {
                    next.push((f, exit));
                    continue;
                }
                for (f, exit) in self.run_chain(name, f, 0)? {
                    next.push((f, if exit == Exit::Return { Exit::Accept } else { exit }));
                }
            }
            flows = next;
        }
        Ok(flows)
    }

    fn run_hooks(&self, hooks: &[NfHook], flows: Vec<(Flow, Exit)>) -> Result<Vec<(Flow, Exit)>, TraceError> {
        let mut flows = flows;
        for hook in hooks {
            let mut next = Vec::new();
            for (f, exit) in flows {
                if exit == Exit::Accept { next.extend(self.run_hook(*hook, f)?) } else { next.push((f, exit)) }
            }
            flows = next;
        }
        Ok(flows)
    }
}

/// Traces one packet through the model.
pub fn trace_nftables(model: &Model, node: &Node, packet: &Packet) -> Result<Trace, TraceError> {
    let walker = Walker { model, node, packet };
    let mut trace = Trace::default();
    let first = if packet.from_node { NfHook::Output } else { NfHook::Prerouting };
    for (flow, exit) in walker.run_hooks(&[first], vec![(Flow::new(), Exit::Accept)])? {
        if exit != Exit::Accept {
            trace.paths.push((ending(exit, &flow), false, flow.path));
            continue;
        }
        let local = node.is_local(&flow.dst(packet).0);
        let after: &[NfHook] = if packet.from_node && local {
            // The node's packet to itself comes back in through loopback:
            // filter input sees it (kube-proxy's input checks included).
            &[NfHook::Postrouting, NfHook::Input]
        } else if packet.from_node {
            &[NfHook::Postrouting]
        } else if local {
            &[NfHook::Input]
        } else {
            &[NfHook::Forward, NfHook::Postrouting]
        };
        for (flow, exit) in walker.run_hooks(after, vec![(flow, Exit::Accept)])? {
            let masq = exit == Exit::Accept && flow.masquerade;
            trace.paths.push((ending(exit, &flow), masq, flow.path));
        }
    }
    trace.finish();
    Ok(trace)
}
