//! Walking an iptables ruleset: nat PREROUTING (or OUTPUT for the node's
//! own traffic), then filter INPUT / FORWARD / OUTPUT on the rewritten
//! destination, then nat POSTROUTING for masquerade.

use std::net::IpAddr;

use super::parse::{Match, ParsedRuleset, Rule, Target, TraceError, parse_rule};
use super::{Exit, Flow, Node, Packet, Step, Trace, ending};
use crate::iptables::Jump;

/// How deep jumps may nest before the tracer calls it a loop.
const MAX_DEPTH: usize = 32;

struct Walker<'a> {
    rules: &'a ParsedRuleset,
    node: &'a Node,
    packet: &'a Packet,
}

impl Walker<'_> {
    fn dst(&self, flow: &Flow) -> (IpAddr, u16) {
        flow.dnat.unwrap_or((self.packet.dst, self.packet.dport))
    }

    /// Some(true) matches, Some(false) does not, None may (statistic).
    fn matches(&self, rule: &Rule, flow: &Flow) -> Option<bool> {
        let (dst, dport) = self.dst(flow);
        let p = self.packet;
        let mut maybe = false;
        for m in &rule.matches {
            let hit = match m {
                Match::Src { neg, cidr } => cidr.contains(&p.src) != *neg,
                Match::Dst { neg, cidr } => cidr.contains(&dst) != *neg,
                Match::Protocol { neg, name } => (name == p.protocol.as_str() || name == "all") != *neg,
                Match::DPort { neg, port } => (*port == dport) != *neg,
                Match::InInterface { neg, name } => {
                    let on = match (&p.in_interface, name.strip_suffix('+')) {
                        (Some(iface), Some(prefix)) => iface.starts_with(prefix),
                        (Some(iface), None) => iface == name,
                        (None, _) => false,
                    };
                    on != *neg
                }
                Match::SrcType { neg, local } => (self.node.is_local(&p.src) == *local) != *neg,
                Match::DstType { neg, local } => (self.node.is_local(&dst) == *local) != *neg,
                Match::Statistic => {
                    maybe = true;
                    true
                }
                Match::RecentCheck => false,
                Match::Mark { neg, value, mask } => ((flow.mark & mask) == *value) != *neg,
                Match::CtState { neg, states } => {
                    let has = |s: &str| match s {
                        "NEW" => true,
                        "DNAT" => flow.dnat.is_some(),
                        _ => false,
                    };
                    states.iter().any(|s| has(s)) != *neg
                }
            };
            if !hit {
                return Some(false);
            }
        }
        if maybe { None } else { Some(true) }
    }

    fn run(&self, table: &str, chain: &str, flow: Flow, depth: usize) -> Result<Vec<(Flow, Exit)>, TraceError> {
        if depth > MAX_DEPTH {
            return Err(TraceError { line: 0, text: chain.into(), reason: "jumps nest too deep (a loop?)".into() });
        }
        let Some(rules) = self.rules.chain(table, chain) else {
            return Err(TraceError {
                line: 0,
                text: format!("{table} {chain}"),
                reason: "jump to a chain that does not exist".into(),
            });
        };
        self.run_from(table, chain, rules, 0, flow, depth)
    }

    fn run_from(
        &self,
        table: &str,
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
            flow.path.push(Step { table: table.into(), chain: chain.into(), line: rule.line, text: rule.text.clone() });
            let exit = match &rule.target {
                Target::None => None,
                Target::SetMark { value, mask } => {
                    flow.mark = (flow.mark & !mask) ^ value;
                    None
                }
                Target::Accept => Some(Exit::Accept),
                Target::Drop => Some(Exit::Drop),
                Target::Reject => Some(Exit::Reject),
                Target::Return => Some(Exit::Return),
                Target::Dnat { ip, port } => {
                    flow.dnat = Some((*ip, *port));
                    Some(Exit::Accept)
                }
                Target::Masquerade => {
                    flow.masquerade = true;
                    Some(Exit::Accept)
                }
                Target::Jump(to) | Target::Goto(to) => {
                    let goto = matches!(rule.target, Target::Goto(_));
                    for (f, exit) in self.run(table, to, flow, depth + 1)? {
                        match exit {
                            Exit::Return if !goto => out.extend(self.run_from(table, chain, rules, i + 1, f, depth)?),
                            other => out.push((f, other)),
                        }
                    }
                    return Ok(out);
                }
            };
            match exit {
                None => {
                    out.extend(self.run_from(table, chain, rules, i + 1, flow, depth)?);
                    return Ok(out);
                }
                Some(exit) => {
                    out.push((flow, exit));
                    return Ok(out);
                }
            }
        }
        // Fell off the end: a built-in chain's policy, else return.
        let exit = match self.rules.policy(table, chain) {
            Some("DROP") => Exit::Drop,
            Some(_) => Exit::Accept,
            None => Exit::Return,
        };
        out.push((flow, exit));
        Ok(out)
    }

    /// Runs a built-in chain if the ruleset has it (absent: accept).
    fn run_builtin(&self, table: &str, chain: &str, flow: Flow) -> Result<Vec<(Flow, Exit)>, TraceError> {
        if self.rules.chain(table, chain).is_none() {
            return Ok(vec![(flow, Exit::Accept)]);
        }
        let mut out = self.run(table, chain, flow, 0)?;
        for (_, exit) in &mut out {
            if *exit == Exit::Return {
                *exit = Exit::Accept;
            }
        }
        Ok(out)
    }
}

/// Traces one packet. `jumps`: the host's jumps from built-in chains, added
/// when the ruleset is a plugin's payload without built-in chains.
pub fn trace_iptables(
    rules: &ParsedRuleset,
    jumps: &[Jump],
    node: &Node,
    packet: &Packet,
) -> Result<Trace, TraceError> {
    let mut rules = rules.clone();
    add_host_jumps(&mut rules, jumps)?;
    let walker = Walker { rules: &rules, node, packet };
    let start = Flow { dnat: None, mark: 0, masquerade: false, path: Vec::new() };
    let nat_chain = if packet.from_node { "OUTPUT" } else { "PREROUTING" };
    let mut trace = Trace::default();
    for (flow, exit) in walker.run_builtin("nat", nat_chain, start)? {
        if exit != Exit::Accept {
            trace.paths.push((ending(exit, &flow), false, flow.path));
            continue;
        }
        let (dst, _) = walker.dst(&flow);
        let filter_chain = if packet.from_node {
            "OUTPUT"
        } else if node.is_local(&dst) {
            "INPUT"
        } else {
            "FORWARD"
        };
        for (flow, exit) in walker.run_builtin("filter", filter_chain, flow)? {
            if exit != Exit::Accept {
                trace.paths.push((ending(exit, &flow), false, flow.path));
                continue;
            }
            let delivered_here = !packet.from_node && node.is_local(&dst);
            let mut outcomes = vec![(flow, Exit::Accept)];
            if !delivered_here {
                outcomes = walker.run_builtin("nat", "POSTROUTING", outcomes.remove(0).0)?;
            }
            for (flow, _) in outcomes {
                trace.paths.push((ending(Exit::Accept, &flow), flow.masquerade, flow.path));
            }
        }
    }
    trace.finish();
    Ok(trace)
}

/// Adds each jump whose built-in chain the ruleset does not define, in
/// the order the host's `iptables -I` leaves them (the last one first).
fn add_host_jumps(rules: &mut ParsedRuleset, jumps: &[Jump]) -> Result<(), TraceError> {
    for jump in jumps {
        let defined = rules.tables.get(jump.table).is_some_and(|t| t.contains_key(jump.from))
            && rules.policy(jump.table, jump.from).is_some();
        if defined {
            continue;
        }
        let mut args: Vec<String> = jump.matches.iter().map(|s| s.to_string()).collect();
        args.extend(["-j".to_string(), jump.to.to_string()]);
        let text = format!("-A {} {}", jump.from, args.join(" "));
        let rule = parse_rule(0, &text, &args)?;
        rules.tables.entry(jump.table.into()).or_default().entry(jump.from.into()).or_default().insert(0, rule);
    }
    Ok(())
}
