//! Tracing through kpx's nftables table: a model built by applying nft
//! commands (a plugin's transaction, or a listing converted with
//! [`listing_to_commands`]), walked hook by hook in priority order. Like
//! the iptables tracer it knows the rule shapes kube-proxy writes, in both
//! spellings (ours, and nft's normalised listing), and refuses others.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::{Exit, Flow, Node, Packet, Step, Trace, TraceError, ending};
use crate::model::Cidr;

/// One chain: its hook (kind, hook, priority) if a base chain, and rules.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    pub hook: Option<(String, String, i32)>,
    pub rules: Vec<(usize, String)>,
}

/// One element: its key parts, and the value for maps.
pub type ModelElement = (Vec<String>, Option<String>);

/// The table as the tracer sees it.
#[derive(Debug, Clone, Default)]
pub struct NftModel {
    pub chains: BTreeMap<String, Chain>,
    /// Set and map elements.
    pub sets: BTreeMap<String, Vec<ModelElement>>,
}

fn err(line: usize, text: &str, reason: impl Into<String>) -> TraceError {
    TraceError { line, text: text.to_string(), reason: reason.into() }
}

fn priority(text: &str) -> Option<i32> {
    let named = |w: &str| match w {
        "raw" => Some(-300),
        "mangle" => Some(-150),
        "dstnat" => Some(-100),
        "filter" => Some(0),
        "security" => Some(50),
        "srcnat" => Some(100),
        n => n.parse().ok(),
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        [base] => named(base),
        [base, "-", n] => Some(named(base)? - n.parse::<i32>().ok()?),
        [base, "+", n] => Some(named(base)? + n.parse::<i32>().ok()?),
        _ => None,
    }
}

/// Splits `{ a, b : c, d }` contents into elements.
fn split_elements(body: &str) -> Vec<ModelElement> {
    body.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (key, value) = match e.split_once(" : ") {
                Some((k, v)) => (k, Some(v.trim().to_string())),
                None => (e, None),
            };
            (key.split(" . ").map(|p| p.trim().to_string()).collect(), value)
        })
        .collect()
}

impl NftModel {
    /// Applies nft commands (one per line) in order.
    pub fn apply(&mut self, text: &str) -> Result<(), TraceError> {
        for command in crate::nftables::command_lines(text) {
            let (n, raw, words) = (command.number, command.raw, &command.words);
            let (verb, object) = (command.verb(), command.object());
            let name = words.get(4).copied().unwrap_or("").to_string();
            let rest = words.get(5..).map(|w| w.join(" ")).unwrap_or_default();
            match (verb, object) {
                ("add", "table") => {}
                ("flush", "table") => {
                    self.chains.values_mut().for_each(|c| c.rules.clear());
                    self.sets.values_mut().for_each(Vec::clear);
                }
                ("add", "chain") => {
                    let chain = self.chains.entry(name).or_default();
                    if let Some(body) = rest.strip_prefix('{') {
                        let words: Vec<&str> = body.split_whitespace().collect();
                        let at = |k: &str| words.iter().position(|w| *w == k);
                        if let (Some(t), Some(h), Some(p)) = (at("type"), at("hook"), at("priority")) {
                            let prio_text: String =
                                body.split("priority").nth(1).unwrap_or("").split(';').next().unwrap_or("").to_string();
                            let prio = priority(&prio_text).ok_or_else(|| err(n, raw, "unknown priority"))?;
                            let _ = p;
                            chain.hook = Some((words[t + 1].to_string(), words[h + 1].to_string(), prio));
                        }
                    }
                }
                ("flush", "chain") => self.chains.entry(name).or_default().rules.clear(),
                ("delete", "chain") => {
                    self.chains.remove(&name);
                }
                ("add", "set") | ("add", "map") => {
                    self.sets.entry(name).or_default();
                }
                ("delete", "set") | ("delete", "map") => {
                    self.sets.remove(&name);
                }
                ("add", "rule") => self.chains.entry(name).or_default().rules.push((n, rest)),
                ("add", "element") | ("delete", "element") => {
                    let body = rest.trim().trim_start_matches('{').trim_end_matches('}');
                    let elements = split_elements(body);
                    let set = self.sets.entry(name).or_default();
                    for (key, value) in elements {
                        set.retain(|(k, _)| *k != key);
                        if verb == "add" {
                            set.push((key, value));
                        }
                    }
                }
                _ => return Err(err(n, raw, "not a command the tracer knows")),
            }
        }
        Ok(())
    }
}

/// Converts `nft list table <family> kube-proxy` output to commands.
pub fn listing_to_commands(listing: &str, family: &str) -> String {
    let mut out = String::new();
    let cmd = |verb: &str, what: &str| format!("{verb} {what} {family} kube-proxy");
    let mut lines = listing.lines().map(str::trim).peekable();
    let mut current: Option<(String, String)> = None;
    while let Some(line) = lines.next() {
        if line.starts_with("table ") || line.is_empty() || line.starts_with("comment") {
            continue;
        }
        if let Some(rest) =
            line.strip_prefix("chain ").or_else(|| line.strip_prefix("set ")).or_else(|| line.strip_prefix("map "))
        {
            let kind = line.split_whitespace().next().unwrap_or("");
            let name = rest.trim_end_matches('{').trim().to_string();
            out.push_str(&format!("{} {name}\n", cmd("add", kind)));
            current = Some((kind.to_string(), name));
            continue;
        }
        if line == "}" {
            current = None;
            continue;
        }
        let Some((kind, name)) = &current else { continue };
        if kind == "chain" {
            if line.starts_with("type ") {
                out.push_str(&format!("{} {name} {{ {line} }}\n", cmd("add", "chain")));
            } else {
                out.push_str(&format!("{} {name} {line}\n", cmd("add", "rule")));
            }
        } else if let Some(first) = line.strip_prefix("elements = {") {
            let mut body = first.to_string();
            while !body.trim_end().ends_with('}') {
                match lines.next() {
                    Some(next) => {
                        body.push(' ');
                        body.push_str(next);
                    }
                    None => break,
                }
            }
            let body = body.trim().trim_end_matches('}');
            out.push_str(&format!("{} {name} {{ {body} }}\n", cmd("add", "element")));
        }
    }
    out
}

struct Walker<'a> {
    model: &'a NftModel,
    node: &'a Node,
    packet: &'a Packet,
}

fn parse_u32(text: &str) -> Option<u32> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// A value one key part can take: what the packet has for an expression.
#[derive(Debug, Clone)]
enum Value {
    Ip(IpAddr),
    Text(String),
}

impl Value {
    fn matches(&self, element: &str) -> bool {
        match self {
            Value::Ip(ip) => {
                if let Ok(cidr) = element.parse::<Cidr>() {
                    return cidr.contains(ip);
                }
                element.parse::<IpAddr>().is_ok_and(|e| e == *ip)
            }
            Value::Text(t) => t == element,
        }
    }
}

impl Walker<'_> {
    fn dst(&self, flow: &Flow) -> (IpAddr, u16) {
        flow.dnat.unwrap_or((self.packet.dst, self.packet.dport))
    }

    /// The values of a concatenation's parts (numgen yields each slot).
    fn concat(&self, words: &[&str], flow: &Flow) -> Option<Vec<Vec<Value>>> {
        let mut parts: Vec<Vec<Value>> = vec![Vec::new()];
        let (dst, dport) = self.dst(flow);
        let mut i = 0;
        while i < words.len() {
            let two = (words[i], words.get(i + 1).copied().unwrap_or(""));
            let (values, used): (Vec<Value>, usize) = match two {
                ("ip" | "ip6", "daddr") => (vec![Value::Ip(dst)], 2),
                ("ip" | "ip6", "saddr") => (vec![Value::Ip(self.packet.src)], 2),
                ("meta", "l4proto") => (vec![Value::Text(self.packet.protocol.as_str().into())], 2),
                ("th", "dport") => (vec![Value::Text(dport.to_string())], 2),
                // nft lists `th dport` as `tcp dport` (etc.) when the rule
                // implies the protocol; another protocol matches nothing.
                (proto @ ("tcp" | "udp" | "sctp"), "dport") => {
                    if proto != self.packet.protocol.as_str() {
                        return Some(Vec::new());
                    }
                    (vec![Value::Text(dport.to_string())], 2)
                }
                ("numgen", "random") => {
                    let n: usize = words.get(i + 3)?.parse().ok()?;
                    ((0..n).map(|k| Value::Text(k.to_string())).collect(), 4)
                }
                _ => return None,
            };
            let mut next = Vec::new();
            for prefix in &parts {
                for v in &values {
                    let mut p = prefix.clone();
                    p.push(v.clone());
                    next.push(p);
                }
            }
            parts = next;
            i += used;
            if words.get(i) == Some(&".") {
                i += 1;
            }
        }
        Some(parts)
    }

    fn lookup(&self, set: &str, key: &[Value]) -> Option<Option<String>> {
        let elements = self.model.sets.get(set)?;
        elements
            .iter()
            .find(|(k, _)| k.len() == key.len() && k.iter().zip(key).all(|(e, v)| v.matches(e)))
            .map(|(_, v)| v.clone())
    }

    fn run_chain(&self, name: &str, flow: Flow, depth: usize) -> Result<Vec<(Flow, Exit)>, TraceError> {
        if depth > 32 {
            return Err(err(0, name, "jumps nest too deep"));
        }
        let chain = self.model.chains.get(name).ok_or_else(|| err(0, name, "no such chain"))?;
        self.run_rules(name, &chain.rules, 0, flow, depth)
    }

    fn verdict(
        &self,
        chain: &str,
        rules: &[(usize, String)],
        i: usize,
        verdict: &str,
        flow: Flow,
        depth: usize,
    ) -> Result<Vec<(Flow, Exit)>, TraceError> {
        let words: Vec<&str> = verdict.split_whitespace().collect();
        match words.as_slice() {
            ["drop"] => Ok(vec![(flow, Exit::Drop)]),
            ["accept"] => Ok(vec![(flow, Exit::Accept)]),
            ["return"] => Ok(vec![(flow, Exit::Return)]),
            ["reject", ..] => Ok(vec![(flow, Exit::Reject)]),
            ["jump", to] | ["goto", to] => {
                let mut out = Vec::new();
                for (f, exit) in self.run_chain(to, flow, depth + 1)? {
                    match exit {
                        Exit::Return if words[0] == "jump" => {
                            out.extend(self.run_rules(chain, rules, i + 1, f, depth)?)
                        }
                        other => out.push((f, other)),
                    }
                }
                Ok(out)
            }
            _ => Err(err(0, verdict, "unknown verdict")),
        }
    }

    /// Evaluates rule `i` on; returns the outcomes.
    fn run_rules(
        &self,
        chain: &str,
        rules: &[(usize, String)],
        start: usize,
        flow: Flow,
        depth: usize,
    ) -> Result<Vec<(Flow, Exit)>, TraceError> {
        let Some((line, text)) = rules.get(start) else {
            return Ok(vec![(flow, Exit::Return)]);
        };
        let unknown = || err(*line, text, "rule shape not known to kpx's tracer");
        let words: Vec<&str> = text.split_whitespace().filter(|w| *w != "counter").collect();
        let mut flow = flow;
        let step = Step { table: "kube-proxy".into(), chain: chain.into(), line: *line, text: text.clone() };
        let mut i = 0;
        let next = |f: Flow| self.run_rules(chain, rules, start + 1, f, depth);
        // Matches, left to right; the first failing one skips the rule.
        loop {
            let w = words.get(i).copied().unwrap_or("");
            let rest = &words[i.min(words.len())..];
            match rest {
                ["ct", "state", states, ..] if *states != "!=" => {
                    let hit = states.split(',').any(|s| s == "new");
                    if !hit {
                        return next(flow);
                    }
                    i += 3;
                }
                ["fib", which @ ("daddr" | "saddr"), "type", "local", ..] => {
                    let ip = if *which == "daddr" { self.dst(&flow).0 } else { self.packet.src };
                    if !self.node.is_local(&ip) {
                        return next(flow);
                    }
                    i += 4;
                }
                ["iifname", op, name, ..] if *op == "!=" || op.starts_with('"') => {
                    let (neg, name) = if *op == "!=" { (true, *name) } else { (false, *op) };
                    let name = name.trim_matches('"');
                    let on = match (&self.packet.in_interface, name.strip_suffix('*')) {
                        (Some(iface), Some(prefix)) => iface.starts_with(prefix),
                        (Some(iface), None) => iface == name,
                        (None, _) => false,
                    };
                    if on == neg {
                        return next(flow);
                    }
                    i += if *op == "!=" { 3 } else { 2 };
                }
                ["meta", "mark", "&", mask, "==", value, ..] => {
                    let (m, v) = (parse_u32(mask).ok_or_else(unknown)?, parse_u32(value).ok_or_else(unknown)?);
                    if flow.mark & m != v {
                        return next(flow);
                    }
                    i += 6;
                }
                ["meta", "l4proto", proto, ..] if !matches!(*proto, "." | "vmap") => {
                    if *proto != self.packet.protocol.as_str() {
                        return next(flow);
                    }
                    i += 3;
                }
                ["meta", "mark", "set", "meta", "mark", op, value, ..] => {
                    let v = parse_u32(value).ok_or_else(unknown)?;
                    flow.mark = match *op {
                        "or" | "|" => flow.mark | v,
                        "xor" | "^" => flow.mark ^ v,
                        _ => return Err(unknown()),
                    };
                    flow.path.push(step.clone());
                    i += 7;
                }
                ["update", ..] => {
                    // Affinity bookkeeping; no effect on this packet.
                    let close = rest.iter().position(|w| *w == "}").ok_or_else(unknown)?;
                    i += close + 1;
                }
                ["masquerade", ..] => {
                    flow.masquerade = true;
                    flow.path.push(step);
                    return Ok(vec![(flow, Exit::Accept)]);
                }
                ["dnat", _fam, "to", ..] => {
                    flow.path.push(step);
                    let target = &rest[3..];
                    if let [.., "map", set] = target {
                        let exprs = &target[..target.len() - 2];
                        let keys = self.concat(exprs, &flow).ok_or_else(unknown)?;
                        let mut out = Vec::new();
                        let mut hit = false;
                        for key in keys {
                            if let Some(Some(value)) = self.lookup(set.trim_start_matches('@'), &key) {
                                let (ip, port) = value.split_once(" . ").ok_or_else(unknown)?;
                                let mut f = flow.clone();
                                f.dnat =
                                    Some((ip.parse().map_err(|_| unknown())?, port.parse().map_err(|_| unknown())?));
                                out.push((f, Exit::Accept));
                                hit = true;
                            }
                        }
                        if !hit {
                            flow.path.pop();
                            return next(flow);
                        }
                        return Ok(out);
                    }
                    let dest = target.first().ok_or_else(unknown)?;
                    flow.dnat = Some(crate::model::split_host_port(dest).ok_or_else(unknown)?);
                    return Ok(vec![(flow, Exit::Accept)]);
                }
                [verb @ ("jump" | "goto"), _, ..] | [verb @ ("drop" | "accept" | "return" | "reject"), ..] => {
                    flow.path.push(step);
                    let verdict = if matches!(*verb, "jump" | "goto") { rest[..2].join(" ") } else { verb.to_string() };
                    return self.verdict(chain, rules, start, &verdict, flow, depth);
                }
                ["numgen", "random", "mod", n, "vmap", "{", ..] => {
                    let n: usize = n.parse().map_err(|_| unknown())?;
                    let body = text
                        .split_once('{')
                        .and_then(|(_, b)| b.rsplit_once('}'))
                        .map(|(b, _)| b)
                        .ok_or_else(unknown)?;
                    flow.path.push(step);
                    let mut out = Vec::new();
                    for (key, value) in split_elements(body) {
                        let slot: usize = key.first().and_then(|k| k.parse().ok()).ok_or_else(unknown)?;
                        if slot < n
                            && let Some(v) = value
                        {
                            out.extend(self.verdict(chain, rules, start, &v, flow.clone(), depth)?);
                        }
                    }
                    return Ok(out);
                }
                [] => {
                    // All matches held and no statement: a counter rule.
                    return next(flow);
                }
                _ => {
                    // A concatenation: `expr . expr ... (vmap @m | [!=] @set | [!=] value)`.
                    let end = rest
                        .iter()
                        .position(|w| {
                            *w == "vmap"
                                || *w == "!="
                                || w.starts_with('@')
                                || (!w.contains(|c: char| c.is_ascii_alphabetic()) && *w != ".")
                        })
                        .ok_or_else(unknown)?;
                    let keys = self.concat(&rest[..end], &flow).ok_or_else(unknown)?;
                    let op = rest.get(end).copied().ok_or_else(unknown)?;
                    if op == "vmap" {
                        let set = rest.get(end + 1).ok_or_else(unknown)?.trim_start_matches('@');
                        let hit = keys.iter().find_map(|k| self.lookup(set, k).flatten());
                        let Some(verdict) = hit else { return next(flow) };
                        flow.path.push(step);
                        return self.verdict(chain, rules, start, &verdict, flow, depth);
                    }
                    let (neg, target, used) = if op == "!=" {
                        (true, rest.get(end + 1).copied().ok_or_else(unknown)?, 2)
                    } else {
                        (false, op, 1)
                    };
                    let hit = if let Some(set) = target.strip_prefix('@') {
                        keys.iter().any(|k| self.lookup(set, k).is_some())
                    } else {
                        keys.iter().any(|k| k.len() == 1 && k[0].matches(target))
                    };
                    if hit == neg {
                        return next(flow);
                    }
                    i += end + used;
                }
            }
            let _ = w;
        }
    }

    /// Runs every base chain of a hook, in priority order.
    fn run_hook(&self, hook: &str, flow: Flow) -> Result<Vec<(Flow, Exit)>, TraceError> {
        let mut chains: Vec<(&String, i32)> = self
            .model
            .chains
            .iter()
            .filter_map(|(name, c)| c.hook.as_ref().filter(|(_, h, _)| h == hook).map(|(_, _, p)| (name, *p)))
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
}

/// Traces one packet through the model.
pub fn trace_nftables(model: &NftModel, node: &Node, packet: &Packet) -> Result<Trace, TraceError> {
    let walker = Walker { model, node, packet };
    let start = Flow { dnat: None, mark: 0, masquerade: false, path: Vec::new() };
    let mut trace = Trace::default();
    let hooks: &[&str] = if packet.from_node { &["output"] } else { &["prerouting"] };
    let mut flows = vec![(start, Exit::Accept)];
    for hook in hooks {
        let mut next = Vec::new();
        for (f, exit) in flows {
            if exit == Exit::Accept { next.extend(walker.run_hook(hook, f)?) } else { next.push((f, exit)) }
        }
        flows = next;
    }
    for (flow, exit) in flows {
        if exit != Exit::Accept {
            trace.paths.push((ending(exit, &flow), false, flow.path));
            continue;
        }
        let local = !packet.from_node && node.is_local(&walker.dst(&flow).0);
        let after: &[&str] = if packet.from_node {
            &["postrouting"]
        } else if local {
            &["input"]
        } else {
            &["forward", "postrouting"]
        };
        let mut flows = vec![(flow, Exit::Accept)];
        for hook in after {
            let mut next = Vec::new();
            for (f, exit) in flows {
                if exit == Exit::Accept { next.extend(walker.run_hook(hook, f)?) } else { next.push((f, exit)) }
            }
            flows = next;
        }
        for (flow, exit) in flows {
            let masq = exit == Exit::Accept && flow.masquerade;
            trace.paths.push((ending(exit, &flow), masq, flow.path));
        }
    }
    trace.finish();
    Ok(trace)
}
