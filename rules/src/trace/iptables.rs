//! Walking typed iptables rules: nat PREROUTING (or OUTPUT for the node's
//! own traffic), then filter INPUT / FORWARD / OUTPUT on the rewritten
//! destination, then nat POSTROUTING for masquerade.

use std::collections::BTreeMap;

use super::{Exit, Flow, MAX_DEPTH, Node, Packet, Step, Trace, TraceError, ending, err, interface_matches};
use crate::ops::CtStates;
use crate::ops::iptables::{MARK_MASQ_CHAIN, Match, Rule, Table, Target};

/// The chains of both tables, with their rules in order. Built-in chains
/// the rules do not name accept.
#[derive(Debug, Clone, Default)]
pub struct Tables {
    pub chains: BTreeMap<(Table, String), Vec<Rule>>,
    /// Policies of built-in chains that drop (`:FORWARD DROP`).
    pub dropping: Vec<(Table, String)>,
    /// The masquerade mark (hash-mark targets keep it).
    pub masquerade_mark: u32,
}

impl Tables {
    pub fn new(masquerade_mark: u32) -> Tables {
        Tables { masquerade_mark, ..Default::default() }
    }

    /// Declares a chain (empty if new).
    pub fn declare(&mut self, table: Table, chain: &str) {
        self.chains.entry((table, chain.to_string())).or_default();
    }

    pub fn push(&mut self, rule: Rule) {
        self.chains.entry((rule.table, rule.chain.clone())).or_default().push(rule);
    }

    /// Inserts a rule at the head of its chain (as `iptables -I` does).
    pub fn insert_first(&mut self, rule: Rule) {
        self.chains.entry((rule.table, rule.chain.clone())).or_default().insert(0, rule);
    }
}

struct Walker<'a> {
    tables: &'a Tables,
    node: &'a Node,
    packet: &'a Packet,
}

/// Some(true) matches, Some(false) does not; None: may (the walk forks).
type Hit = Option<bool>;

impl Walker<'_> {
    fn matches(&self, rule: &Rule, flow: &Flow) -> Hit {
        let (dst, dport) = flow.dst(self.packet);
        let p = self.packet;
        let mut maybe = false;
        for m in &rule.matches {
            let hit = match m {
                Match::Source(a) => a.cidr.contains(&p.src) != a.negate,
                Match::Destination(a) => a.cidr.contains(&dst) != a.negate,
                Match::InInterface(i) => interface_matches(p, &i.name, i.prefix) != i.negate,
                Match::Protocol(proto) => *proto == p.protocol,
                Match::DestinationPort(port) => *port == dport,
                Match::SourceTypeLocal { negate } => self.node.is_local(&p.src) != *negate,
                Match::DestinationTypeLocal { negate } => self.node.is_local(&dst) != *negate,
                Match::Conntrack { negate, states } => {
                    let mut now = CtStates::NEW;
                    if flow.dnat.is_some() {
                        now = now | CtStates::DNAT;
                    }
                    states.intersects(now) != *negate
                }
                Match::Mark { negate, value, mask } => ((flow.mark & mask) == *value) != *negate,
                Match::ClusterHash { total, node, seed } => {
                    let value = crate::plan::scale(crate::plan::jhash_address(p.src, *seed), u32::from(*total));
                    value + 1 == u32::from(*node)
                }
                Match::HashSlot(slot) => flow.mark & (self.tables.masquerade_mark - 1) == *slot,
                Match::StatisticRandom(_) | Match::StatisticNth { .. } => {
                    maybe = true;
                    true
                }
                Match::RecentCheck { .. } => false,
                Match::RecentSet { .. } | Match::Comment(_) => true,
                // The traced packets never cross a bridge.
                Match::PhysdevIsIn { negate } => *negate,
                // Only ipvs mode's host rules test ipsets, and the tracer
                // runs iptables mode's rules, where the validator refuses them.
                Match::Set { .. } | Match::IpvsVirtual { .. } => false,
                Match::Nfacct(_) => true,
                // The traced packet is the connection's first: its
                // original destination is the packet's.
                Match::ConntrackOriginalDestination(cidr) => cidr.contains(&p.dst),
            };
            if !hit {
                return Some(false);
            }
        }
        if maybe { None } else { Some(true) }
    }

    fn run(&self, table: Table, chain: &str, flow: Flow, depth: usize) -> Result<Vec<(Flow, Exit)>, TraceError> {
        if depth > MAX_DEPTH {
            return Err(err(chain, "jumps nest too deep (a loop?)"));
        }
        let Some(rules) = self.tables.chains.get(&(table, chain.to_string())) else {
            return Err(err(chain, format!("a jump to a {} chain that does not exist", table.name())));
        };
        self.run_from(table, chain, rules, 0, flow, depth)
    }

    fn run_from(
        &self,
        table: Table,
        chain: &str,
        rules: &[Rule],
        start: usize,
        flow: Flow,
        depth: usize,
    ) -> Result<Vec<(Flow, Exit)>, TraceError> {
        let mut out = Vec::new();
        for (i, rule) in rules.iter().enumerate().skip(start) {
            match self.matches(rule, &flow) {
                Some(false) => continue,
                Some(true) => {}
                // Both: the rest of the chain, and (below) the rule's branch.
                None => out.extend(self.run_from(table, chain, rules, i + 1, flow.clone(), depth)?),
            }
            let mut flow = flow;
            flow.path.push(Step { table: table.name().into(), chain: chain.into(), index: i });
            let jump = |to: &str, goto: bool, flow: Flow, out: &mut Vec<(Flow, Exit)>| -> Result<(), TraceError> {
                for (f, exit) in self.run(table, to, flow, depth + 1)? {
                    match exit {
                        Exit::Return if !goto => out.extend(self.run_from(table, chain, rules, i + 1, f, depth)?),
                        other => out.push((f, other)),
                    }
                }
                Ok(())
            };
            let exit = match &rule.target {
                Target::None => None,
                Target::SetMark { value, mask } => {
                    flow.mark = (flow.mark & !mask) ^ value;
                    None
                }
                Target::HashMark(h) => {
                    // Every slot; the mark is replaced, the masquerade bit kept.
                    let masq = flow.mark & self.tables.masquerade_mark;
                    for slot in 0..h.modulus {
                        let mut f = flow.clone();
                        f.mark = masq | slot;
                        out.extend(self.run_from(table, chain, rules, i + 1, f, depth)?);
                    }
                    return Ok(out);
                }
                Target::Accept => Some(Exit::Accept),
                Target::Drop => Some(Exit::Drop),
                Target::Reject => Some(Exit::Reject),
                Target::Return => Some(Exit::Return),
                Target::Dnat(ip, port) => {
                    flow.dnat = Some((*ip, *port));
                    Some(Exit::Accept)
                }
                Target::Masquerade { .. } => {
                    flow.masquerade = true;
                    Some(Exit::Accept)
                }
                // userspace mode's portals: to the node's own port.
                Target::Redirect(port) => {
                    flow.dnat = Some((flow.dst(self.packet).0, *port));
                    Some(Exit::Accept)
                }
                Target::MarkForMasquerade => {
                    jump(MARK_MASQ_CHAIN, false, flow, &mut out)?;
                    return Ok(out);
                }
                Target::Jump(to) | Target::HostJump(to) => {
                    jump(to, false, flow, &mut out)?;
                    return Ok(out);
                }
                Target::Goto(to) => {
                    jump(to, true, flow, &mut out)?;
                    return Ok(out);
                }
            };
            match exit {
                None => out.extend(self.run_from(table, chain, rules, i + 1, flow, depth)?),
                Some(exit) => out.push((flow, exit)),
            }
            return Ok(out);
        }
        // Fell off the end: a built-in chain's policy, else return.
        out.push((flow, Exit::Return));
        Ok(out)
    }

    /// Runs a built-in chain if the tables have it (absent: accept).
    fn run_builtin(&self, table: Table, chain: &str, flow: Flow) -> Result<Vec<(Flow, Exit)>, TraceError> {
        if !self.tables.chains.contains_key(&(table, chain.to_string())) {
            return Ok(vec![(flow, Exit::Accept)]);
        }
        let dropping = self.tables.dropping.contains(&(table, chain.to_string()));
        let mut out = self.run(table, chain, flow, 0)?;
        for (_, exit) in &mut out {
            if *exit == Exit::Return {
                *exit = if dropping { Exit::Drop } else { Exit::Accept };
            }
        }
        Ok(out)
    }
}

/// Traces one packet.
pub fn trace_iptables(tables: &Tables, node: &Node, packet: &Packet) -> Result<Trace, TraceError> {
    let walker = Walker { tables, node, packet };
    let nat_chain = if packet.from_node { "OUTPUT" } else { "PREROUTING" };
    let mut trace = Trace::default();
    for (flow, exit) in walker.run_builtin(Table::Nat, nat_chain, Flow::new())? {
        if exit != Exit::Accept {
            trace.paths.push((ending(exit, &flow), false, flow.path));
            continue;
        }
        let (dst, _) = flow.dst(packet);
        let filter_chain = if packet.from_node {
            "OUTPUT"
        } else if node.is_local(&dst) {
            "INPUT"
        } else {
            "FORWARD"
        };
        for (flow, exit) in walker.run_builtin(Table::Filter, filter_chain, flow)? {
            if exit != Exit::Accept {
                trace.paths.push((ending(exit, &flow), false, flow.path));
                continue;
            }
            let delivered_here = !packet.from_node && node.is_local(&dst);
            let outcomes = if delivered_here {
                vec![(flow, Exit::Accept)]
            } else {
                walker.run_builtin(Table::Nat, "POSTROUTING", flow)?
            };
            for (flow, _) in outcomes {
                if packet.from_node && node.is_local(&dst) {
                    // The node's packet to itself comes back in through
                    // loopback: filter INPUT sees it.
                    for (flow, exit) in walker.run_builtin(Table::Filter, "INPUT", flow)? {
                        let masq = exit == Exit::Accept && flow.masquerade;
                        trace.paths.push((ending(exit, &flow), masq, flow.path));
                    }
                    continue;
                }
                trace.paths.push((ending(Exit::Accept, &flow), flow.masquerade, flow.path));
            }
        }
    }
    trace.finish();
    Ok(trace)
}
