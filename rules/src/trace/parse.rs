//! Reading iptables-restore / iptables-save text into rules the tracer
//! understands.

use std::collections::BTreeMap;
use std::net::IpAddr;

use crate::model::Cidr;

/// A ruleset the tracer cannot read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    pub line: usize,
    pub text: String,
    pub reason: String,
}

impl std::fmt::Display for TraceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}: {}", self.line, self.reason, self.text)
    }
}

impl std::error::Error for TraceError {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    Src {
        neg: bool,
        cidr: Cidr,
    },
    Dst {
        neg: bool,
        cidr: Cidr,
    },
    Protocol {
        neg: bool,
        name: String,
    },
    DPort {
        neg: bool,
        port: u16,
    },
    InInterface {
        neg: bool,
        name: String,
    },
    SrcType {
        neg: bool,
        local: bool,
    },
    DstType {
        neg: bool,
        local: bool,
    },
    /// `-m statistic`: may or may not match; the walk follows both.
    Statistic,
    /// `-m recent --rcheck`: needs history, never matches.
    RecentCheck,
    Mark {
        neg: bool,
        value: u32,
        mask: u32,
    },
    CtState {
        neg: bool,
        states: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// No `-j`: the rule only counts (or, with `recent --set`, records).
    None,
    Jump(String),
    Goto(String),
    Accept,
    Drop,
    Reject,
    Return,
    Dnat {
        ip: IpAddr,
        port: u16,
    },
    Masquerade,
    /// mark = (mark & !mask) ^ value
    SetMark {
        value: u32,
        mask: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub line: usize,
    pub text: String,
    pub matches: Vec<Match>,
    pub target: Target,
}

/// Tables → chains → rules, in order.
#[derive(Debug, Clone, Default)]
pub struct ParsedRuleset {
    pub tables: BTreeMap<String, BTreeMap<String, Vec<Rule>>>,
    /// Policies of built-in chains, as declared (`:FORWARD DROP [0:0]`).
    pub policies: BTreeMap<(String, String), String>,
}

impl ParsedRuleset {
    /// The policy of a built-in chain, or None for a user chain.
    pub fn policy(&self, table: &str, chain: &str) -> Option<&str> {
        self.policies.get(&(table.to_string(), chain.to_string())).map(String::as_str)
    }

    pub fn chain(&self, table: &str, chain: &str) -> Option<&[Rule]> {
        self.tables.get(table)?.get(chain).map(Vec::as_slice)
    }

    /// Adds a rule to a chain, creating both as needed (for the host's
    /// jumps when tracing a plugin's payload).
    pub fn push(&mut self, table: &str, chain: &str, rule: Rule) {
        self.tables.entry(table.into()).or_default().entry(chain.into()).or_default().push(rule);
    }
}

fn parse_u32(text: &str) -> Option<u32> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

fn parse_cidr(text: &str) -> Option<Cidr> {
    if text.contains('/') {
        return text.parse().ok();
    }
    let addr: IpAddr = text.parse().ok()?;
    Some(Cidr { addr, prefix_len: if addr.is_ipv4() { 32 } else { 128 } })
}

fn parse_value_mask(text: &str) -> Option<(u32, u32)> {
    match text.split_once('/') {
        Some((v, m)) => Some((parse_u32(v)?, parse_u32(m)?)),
        None => Some((parse_u32(text)?, u32::MAX)),
    }
}

/// Parses one `-A CHAIN ...` rule (arguments after the chain).
pub fn parse_rule(line: usize, text: &str, args: &[String]) -> Result<Rule, TraceError> {
    let err = |reason: String| TraceError { line, text: text.to_string(), reason };
    let mut matches = Vec::new();
    let mut target = Target::None;
    let mut neg = false;
    let mut module = String::new();
    let mut i = 0;
    let value =
        |i: usize| args.get(i + 1).map(String::as_str).ok_or_else(|| err(format!("{} without a value", args[i])));
    while i < args.len() {
        let arg = args[i].as_str();
        match arg {
            "!" => {
                neg = true;
                i += 1;
                continue;
            }
            "-s" | "--source" | "-d" | "--destination" => {
                let v = value(i)?;
                let cidr = parse_cidr(v).ok_or_else(|| err(format!("bad address {v:?}")))?;
                matches.push(if arg.starts_with("-s") || arg == "--source" {
                    Match::Src { neg, cidr }
                } else {
                    Match::Dst { neg, cidr }
                });
                i += 2;
            }
            "-p" | "--protocol" => {
                matches.push(Match::Protocol { neg, name: value(i)?.to_lowercase() });
                i += 2;
            }
            "-i" | "--in-interface" => {
                matches.push(Match::InInterface { neg, name: value(i)?.to_string() });
                i += 2;
            }
            "-m" | "--match" => {
                module = value(i)?.to_string();
                match module.as_str() {
                    "comment" | "tcp" | "udp" | "sctp" | "addrtype" | "recent" | "mark" | "conntrack" => {}
                    "statistic" => matches.push(Match::Statistic),
                    other => return Err(err(format!("match module {other:?} is not one kpx's tracer knows"))),
                }
                i += 2;
            }
            "--comment" => i += 2,
            "--dport" | "--destination-port" => {
                let v = value(i)?;
                let port = v.parse().map_err(|_| err(format!("bad port {v:?}")))?;
                matches.push(Match::DPort { neg, port });
                i += 2;
            }
            "--src-type" | "--dst-type" => {
                let local = value(i)? == "LOCAL";
                matches.push(if arg == "--src-type" {
                    Match::SrcType { neg, local }
                } else {
                    Match::DstType { neg, local }
                });
                i += 2;
            }
            "--mode" | "--probability" | "--every" | "--packet" | "--name" | "--seconds" => i += 2,
            "--reap" | "--set" | "--random-fully" => i += 1,
            "--rcheck" => {
                matches.push(Match::RecentCheck);
                i += 1;
            }
            "--mark" if module == "mark" => {
                let v = value(i)?;
                let (value, mask) = parse_value_mask(v).ok_or_else(|| err(format!("bad mark {v:?}")))?;
                matches.push(Match::Mark { neg, value, mask });
                i += 2;
            }
            "--ctstate" => {
                let states = value(i)?.split(',').map(str::to_string).collect();
                matches.push(Match::CtState { neg, states });
                i += 2;
            }
            "-j" | "--jump" | "-g" | "--goto" => {
                let to = value(i)?;
                target = match to {
                    "ACCEPT" => Target::Accept,
                    "DROP" => Target::Drop,
                    "REJECT" => Target::Reject,
                    "RETURN" => Target::Return,
                    "MASQUERADE" => Target::Masquerade,
                    "DNAT" | "MARK" => Target::None,
                    chain if arg == "-g" || arg == "--goto" => Target::Goto(chain.to_string()),
                    chain => Target::Jump(chain.to_string()),
                };
                if to == "MARK" {
                    target = Target::SetMark { value: 0, mask: 0 };
                }
                i += 2;
            }
            "--to-destination" => {
                let v = value(i)?;
                let (ip, port) =
                    crate::model::split_host_port(v).ok_or_else(|| err(format!("bad DNAT destination {v:?}")))?;
                target = Target::Dnat { ip, port };
                i += 2;
            }
            "--or-mark" | "--xor-mark" | "--set-xmark" | "--set-mark" | "--and-mark" => {
                let v = value(i)?;
                let (val, mask) = parse_value_mask(v).ok_or_else(|| err(format!("bad mark {v:?}")))?;
                target = match arg {
                    "--or-mark" => Target::SetMark { value: val, mask: val },
                    "--xor-mark" => Target::SetMark { value: val, mask: 0 },
                    "--and-mark" => Target::SetMark { value: 0, mask: !val },
                    "--set-mark" => Target::SetMark { value: val, mask: if v.contains('/') { mask } else { u32::MAX } },
                    _ => Target::SetMark { value: val, mask },
                };
                i += 2;
            }
            "--reject-with" => i += 2,
            other => return Err(err(format!("option {other:?} is not one kpx's tracer knows"))),
        }
        neg = false;
    }
    Ok(Rule { line, text: text.to_string(), matches, target })
}

/// Parses a whole ruleset. Rules of chains other than KUBE- ones that the
/// tracer cannot read are skipped (foreign software shares the built-in
/// chains); unreadable KUBE- rules are errors.
pub fn parse_ruleset(text: &str) -> Result<ParsedRuleset, TraceError> {
    let mut out = ParsedRuleset::default();
    let mut table = String::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed == "COMMIT" {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix('*') {
            table = name.to_string();
            out.tables.entry(table.clone()).or_default();
            continue;
        }
        if let Some(decl) = trimmed.strip_prefix(':') {
            let mut parts = decl.split_whitespace();
            let chain = parts.next().unwrap_or_default();
            if let Some(policy) = parts.next().filter(|p| *p != "-") {
                out.policies.insert((table.clone(), chain.to_string()), policy.to_string());
            }
            out.tables.entry(table.clone()).or_default().entry(chain.to_string()).or_default().clear();
            continue;
        }
        let args = crate::iptables::split_args(trimmed).ok_or_else(|| TraceError {
            line,
            text: raw.into(),
            reason: "unbalanced quotes".into(),
        })?;
        match args.first().map(String::as_str) {
            Some("-A") => {
                let chain = args.get(1).cloned().unwrap_or_default();
                match parse_rule(line, trimmed, &args[2..]) {
                    Ok(rule) => out.push(&table, &chain, rule),
                    Err(e) if !chain.starts_with("KUBE-") && !rule_targets_kube(&args) => {
                        let _ = e;
                    }
                    Err(e) => return Err(e),
                }
            }
            Some("-X") => {
                if let (Some(t), Some(chain)) = (out.tables.get_mut(&table), args.get(1)) {
                    t.remove(chain);
                }
            }
            _ => {
                return Err(TraceError { line, text: raw.into(), reason: "not an iptables-restore line".into() });
            }
        }
    }
    Ok(out)
}

fn rule_targets_kube(args: &[String]) -> bool {
    args.windows(2).any(|w| (w[0] == "-j" || w[0] == "-g") && w[1].starts_with("KUBE-"))
}
