//! Contract 0.3.0's `iptables-rules`: a backend's iptables ruleset as
//! words. A ruleset of 0.2.0's records crosses the component boundary as
//! one allocation and one UTF-8 check per string on the host's side (each
//! rule's chain, jump target and comment), and a record per rule and per
//! match: at 10k Services x 10 endpoints the crossing cost more than the
//! generator itself. Here the whole ruleset is a few lists of scalars and
//! one string.
//!
//! [`RuleWords`] is the plain Rust shape of the WIT record, shared by
//! kpx-sdk, which [`encode`]s a plugin's [`Ruleset`], and the host, which
//! [`decode`]s it. The words are a plugin's output, so the decoder is the
//! attack surface: it is the only parser of them, it checks every tag,
//! operand, index and string end and refuses anything else with the rule
//! and the word named, and it writes typed values (the host's validator
//! then checks those against the state, as for 0.2.0's records).
//!
//! Layout. `text` holds every string end to end; string i runs from
//! `text_ends[i - 1]` (0 for the first) to `text_ends[i]`. `chains` and
//! `delete_chains` are pairs of words: a [table](TABLE_NAT) and a string
//! index. Rule i's words run from `rule_ends[i - 1]` (0) to `rule_ends[i]`
//! in `words`: its chain, its target, then its matches, each a tag word
//! followed by the tag's operands (see [`chain`], [`target`] and
//! [`matches`] for the tags). An address is one word for IPv4, four for
//! IPv6 (most significant first), as `family` says; a boolean is 0 or 1.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{AddressMatch, HashMark, HashTuple, Hook, InterfaceMatch, Match, Rule, Ruleset, Table, Target};
use crate::model::{Cidr, IpFamily, Protocol};
use crate::ops::CtStates;

/// `chains` and `delete_chains`: the table word of a pair.
pub const TABLE_NAT: u32 = 0;
pub const TABLE_FILTER: u32 = 1;

/// A rule's first word: 0-5 are the hooks in [`Hook::ALL`]'s order (the
/// WIT enum's), then an own chain of the nat or filter table, followed by
/// its name's string index.
pub mod chain {
    pub const OWN_NAT: u32 = 6;
    pub const OWN_FILTER: u32 = 7;
}

/// Target tags, each followed by its operands.
pub mod target {
    pub const NONE: u32 = 0;
    pub const ACCEPT: u32 = 1;
    pub const DROP: u32 = 2;
    pub const REJECT: u32 = 3;
    pub const RETURN: u32 = 4;
    /// Operands: the chain's string index.
    pub const JUMP: u32 = 5;
    /// Operands: the chain's string index.
    pub const GOTO: u32 = 6;
    pub const MARK_FOR_MASQUERADE: u32 = 7;
    /// Operands: the address, the port.
    pub const DNAT: u32 = 8;
    /// Operands: the tuple (0 source, 1 destination), the modulus, the seed.
    pub const HASH_MARK: u32 = 9;
}

/// Match tags, each followed by its operands.
pub mod matches {
    /// Operands: negate, the prefix length, the address.
    pub const SOURCE: u32 = 0;
    /// Operands: negate, the prefix length, the address.
    pub const DESTINATION: u32 = 1;
    /// Operands: 0 TCP, 1 UDP, 2 SCTP.
    pub const PROTOCOL: u32 = 2;
    /// Operands: the port.
    pub const DESTINATION_PORT: u32 = 3;
    /// Operands: negate, prefix (`NAME+`), the name's string index.
    pub const IN_INTERFACE: u32 = 4;
    /// Operands: negate.
    pub const SOURCE_TYPE_LOCAL: u32 = 5;
    /// Operands: negate.
    pub const DESTINATION_TYPE_LOCAL: u32 = 6;
    /// Operands: negate, the states: bits 0-6 invalid, new, established,
    /// related, untracked, snat, dnat.
    pub const CONNTRACK: u32 = 7;
    /// Operands: negate, the value, the mask.
    pub const MARK: u32 = 8;
    /// Operands: the probability in units of 2^-31.
    pub const STATISTIC_RANDOM: u32 = 9;
    /// Operands: every, packet.
    pub const STATISTIC_NTH: u32 = 10;
    /// Operands: the list's string index, seconds, reap.
    pub const RECENT_CHECK: u32 = 11;
    /// Operands: the list's string index.
    pub const RECENT_SET: u32 = 12;
    /// Operands: the slot.
    pub const HASH_SLOT: u32 = 13;
    /// Operands: total, node, seed.
    pub const CLUSTER_HASH: u32 = 14;
    /// Operands: the comment's string index.
    pub const COMMENT: u32 = 15;
}

/// Every conntrack state bit.
const CT_STATES: u32 = 0x7f;

/// The longest string the words hold, in bytes (a comment is at most
/// 255, a chain name 28; the validator checks each use).
pub const MAX_STRING: usize = 1024;

/// The most matches one rule has (0.2.0's `match-count` is a u8).
pub const MAX_MATCHES: usize = 255;

/// An iptables ruleset as words.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleWords {
    pub family: IpFamily,
    pub text: String,
    pub text_ends: Vec<u32>,
    pub chains: Vec<u32>,
    pub delete_chains: Vec<u32>,
    pub kept_hooks: Vec<Hook>,
    pub rule_ends: Vec<u32>,
    pub words: Vec<u32>,
}

impl RuleWords {
    /// The bytes the words take: what crossed the component boundary.
    pub fn bytes(&self) -> usize {
        let lists = [&self.text_ends, &self.chains, &self.delete_chains, &self.rule_ends, &self.words];
        self.text.len() + self.kept_hooks.len() + 4 * lists.iter().map(|l| l.len()).sum::<usize>()
    }
}

/// Where in the words a refusal is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// Entry `index` of a field other than the rules' words.
    Field(&'static str, usize),
    /// Rule `rule`, at its word `word` (counted from the rule's start).
    Rule { rule: usize, word: usize },
}

/// Why a ruleset could not be encoded, or its words were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WordsError {
    pub place: Place,
    pub why: String,
}

impl std::fmt::Display for WordsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.place {
            Place::Field(field, index) => write!(f, "iptables-rules {field}[{index}]: {}", self.why),
            Place::Rule { rule, word } => write!(f, "iptables-rules rule {rule}, word {word}: {}", self.why),
        }
    }
}

impl std::error::Error for WordsError {}

fn field_err(field: &'static str, index: usize, why: impl Into<String>) -> WordsError {
    WordsError { place: Place::Field(field, index), why: why.into() }
}

fn hook_code(h: Hook) -> u32 {
    Hook::ALL.iter().position(|x| *x == h).unwrap_or(0) as u32
}

fn table_code(t: Table) -> u32 {
    match t {
        Table::Nat => TABLE_NAT,
        Table::Filter => TABLE_FILTER,
    }
}

fn protocol_code(p: Protocol) -> u32 {
    match p {
        Protocol::Tcp => 0,
        Protocol::Udp => 1,
        Protocol::Sctp => 2,
    }
}

/// The ruleset under construction.
struct Encoder {
    w: RuleWords,
    /// The last rule's chain (table and string index): rules of a chain
    /// are neighbours, so its name is written once.
    last_chain: Option<(Table, u32)>,
}

impl Encoder {
    fn string(&mut self, s: &str, field: &'static str) -> Result<u32, WordsError> {
        let index = self.w.text_ends.len();
        if s.len() > MAX_STRING {
            return Err(field_err(field, index, format!("a string of {} bytes (at most {MAX_STRING})", s.len())));
        }
        self.w.text.push_str(s);
        let end = u32::try_from(self.w.text.len()).map_err(|_| field_err("text", index, "over 4 GiB"))?;
        self.w.text_ends.push(end);
        u32::try_from(index).map_err(|_| field_err("text-ends", index, "more than 2^32 - 1 strings"))
    }

    fn string_at(&self, i: u32) -> &str {
        let end = self.w.text_ends[i as usize] as usize;
        let start = if i == 0 { 0 } else { self.w.text_ends[i as usize - 1] as usize };
        &self.w.text[start..end]
    }

    fn address(&mut self, ip: &IpAddr, rule: usize) -> Result<(), WordsError> {
        match (self.w.family, ip) {
            (IpFamily::V4, IpAddr::V4(a)) => self.w.words.push(u32::from(*a)),
            (IpFamily::V6, IpAddr::V6(a)) => {
                let o = a.octets();
                for c in o.chunks_exact(4) {
                    self.w.words.push(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                }
            }
            _ => {
                return Err(WordsError {
                    place: Place::Rule { rule, word: 0 },
                    why: format!("{ip} is not of the ruleset's family"),
                });
            }
        }
        Ok(())
    }

    fn own_chains(&mut self, chains: &[(Table, String)], field: &'static str) -> Result<Vec<u32>, WordsError> {
        let mut out = Vec::with_capacity(2 * chains.len());
        for (t, name) in chains {
            out.push(table_code(*t));
            out.push(self.string(name, field)?);
        }
        Ok(out)
    }

    fn chain(&mut self, rule: &Rule) -> Result<(), WordsError> {
        if let Some(h) = Hook::of(rule.table, &rule.chain) {
            self.w.words.push(hook_code(h));
            return Ok(());
        }
        let index = match self.last_chain {
            Some((t, i)) if t == rule.table && self.string_at(i) == rule.chain => i,
            _ => self.string(&rule.chain, "text")?,
        };
        self.last_chain = Some((rule.table, index));
        self.w.words.push(match rule.table {
            Table::Nat => chain::OWN_NAT,
            Table::Filter => chain::OWN_FILTER,
        });
        self.w.words.push(index);
        Ok(())
    }

    fn target(&mut self, t: &Target, rule: usize) -> Result<(), WordsError> {
        use target::*;
        match t {
            Target::None => self.w.words.push(NONE),
            Target::Accept => self.w.words.push(ACCEPT),
            Target::Drop => self.w.words.push(DROP),
            Target::Reject => self.w.words.push(REJECT),
            Target::Return => self.w.words.push(RETURN),
            Target::Jump(c) | Target::Goto(c) => {
                let s = self.string(c, "text")?;
                self.w.words.extend([if matches!(t, Target::Jump(_)) { JUMP } else { GOTO }, s]);
            }
            Target::MarkForMasquerade => self.w.words.push(MARK_FOR_MASQUERADE),
            Target::Dnat(ip, port) => {
                self.w.words.push(DNAT);
                self.address(ip, rule)?;
                self.w.words.push(u32::from(*port));
            }
            Target::HashMark(h) => {
                let tuple = match h.tuple {
                    HashTuple::Source => 0,
                    HashTuple::Destination => 1,
                };
                self.w.words.extend([HASH_MARK, tuple, h.modulus, h.seed]);
            }
            host @ (Target::Masquerade { .. } | Target::SetMark { .. } | Target::HostJump(_) | Target::Redirect(_)) => {
                return Err(WordsError {
                    place: Place::Rule { rule, word: 0 },
                    why: format!("{host:?} is written by the host only; the contract has no such target"),
                });
            }
        }
        Ok(())
    }

    fn one_match(&mut self, m: &Match, rule: usize) -> Result<(), WordsError> {
        use matches::*;
        let b = u32::from;
        match m {
            Match::Source(a) | Match::Destination(a) => {
                let tag = if matches!(m, Match::Source(_)) { SOURCE } else { DESTINATION };
                self.w.words.extend([tag, b(a.negate), u32::from(a.cidr.prefix_len)]);
                self.address(&a.cidr.addr, rule)?;
            }
            Match::Protocol(p) => self.w.words.extend([PROTOCOL, protocol_code(*p)]),
            Match::DestinationPort(p) => self.w.words.extend([DESTINATION_PORT, u32::from(*p)]),
            Match::InInterface(i) => {
                let s = self.string(&i.name, "text")?;
                self.w.words.extend([IN_INTERFACE, b(i.negate), b(i.prefix), s]);
            }
            Match::SourceTypeLocal { negate } => self.w.words.extend([SOURCE_TYPE_LOCAL, b(*negate)]),
            Match::DestinationTypeLocal { negate } => self.w.words.extend([DESTINATION_TYPE_LOCAL, b(*negate)]),
            Match::Conntrack { negate, states } => {
                self.w.words.extend([CONNTRACK, b(*negate), u32::from(states.bits())]);
            }
            Match::Mark { negate, value, mask } => self.w.words.extend([MARK, b(*negate), *value, *mask]),
            Match::StatisticRandom(p) => self.w.words.extend([STATISTIC_RANDOM, *p]),
            Match::StatisticNth { every, packet } => self.w.words.extend([STATISTIC_NTH, *every, *packet]),
            Match::RecentCheck { name, seconds, reap } => {
                let s = self.string(name, "text")?;
                self.w.words.extend([RECENT_CHECK, s, *seconds, b(*reap)]);
            }
            Match::RecentSet { name } => {
                let s = self.string(name, "text")?;
                self.w.words.extend([RECENT_SET, s]);
            }
            Match::HashSlot(s) => self.w.words.extend([HASH_SLOT, *s]),
            Match::ClusterHash { total, node, seed } => {
                self.w.words.extend([CLUSTER_HASH, u32::from(*total), u32::from(*node), *seed]);
            }
            Match::Comment(c) => {
                let s = self.string(c, "text")?;
                self.w.words.extend([COMMENT, s]);
            }
            host @ (Match::Set { .. }
            | Match::PhysdevIsIn { .. }
            | Match::IpvsVirtual { .. }
            | Match::Nfacct(_)
            | Match::ConntrackOriginalDestination(_)) => {
                return Err(WordsError {
                    place: Place::Rule { rule, word: 0 },
                    why: format!("{host:?} is written by the host only; the contract has no such match"),
                });
            }
        }
        Ok(())
    }
}

/// The words of `ruleset`, for an instance of `family`. Refuses what the
/// contract cannot say: the host's own matches and targets, an address of
/// the other family, a string over [`MAX_STRING`] bytes, a rule with more
/// than [`MAX_MATCHES`] matches.
pub fn encode(family: IpFamily, ruleset: &Ruleset) -> Result<RuleWords, WordsError> {
    let rules = &ruleset.rules;
    let mut e = Encoder {
        w: RuleWords {
            family,
            rule_ends: Vec::with_capacity(rules.len()),
            words: Vec::with_capacity(rules.iter().map(|r| 4 + 3 * r.matches.len()).sum()),
            kept_hooks: ruleset.kept_hooks.clone(),
            text: String::new(),
            text_ends: Vec::new(),
            chains: Vec::new(),
            delete_chains: Vec::new(),
        },
        last_chain: None,
    };
    e.w.chains = e.own_chains(&ruleset.chains, "chains")?;
    e.w.delete_chains = e.own_chains(&ruleset.delete_chains, "delete-chains")?;
    for (i, rule) in rules.iter().enumerate() {
        if rule.matches.len() > MAX_MATCHES {
            return Err(WordsError {
                place: Place::Rule { rule: i, word: 0 },
                why: format!("{} matches (at most {MAX_MATCHES})", rule.matches.len()),
            });
        }
        e.chain(rule)?;
        e.target(&rule.target, i)?;
        for m in &rule.matches {
            e.one_match(m, i)?;
        }
        let end = u32::try_from(e.w.words.len()).map_err(|_| field_err("words", i, "more than 2^32 - 1 words"))?;
        e.w.rule_ends.push(end);
    }
    Ok(e.w)
}

/// The checked strings of a ruleset's words.
struct Strings<'a> {
    text: &'a str,
    ends: &'a [u32],
}

impl<'a> Strings<'a> {
    /// Checks every end once: none decreasing, none past the text or
    /// inside a character, no string over [`MAX_STRING`] bytes.
    fn new(text: &'a str, ends: &'a [u32]) -> Result<Strings<'a>, WordsError> {
        let mut last = 0usize;
        for (i, &end) in ends.iter().enumerate() {
            let end = end as usize;
            if end < last {
                return Err(field_err("text-ends", i, format!("{end} is before the previous end {last}")));
            }
            if !text.is_char_boundary(end) {
                return Err(field_err("text-ends", i, format!("{end} is past the text or inside a character")));
            }
            if end - last > MAX_STRING {
                return Err(field_err(
                    "text-ends",
                    i,
                    format!("a string of {} bytes (at most {MAX_STRING})", end - last),
                ));
            }
            last = end;
        }
        Ok(Strings { text, ends })
    }

    fn get(&self, index: u32) -> Option<&'a str> {
        let i = index as usize;
        let end = *self.ends.get(i)? as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        // Checked in `new`: ends in order, on character boundaries.
        self.text.get(start..end)
    }
}

/// The rule being decoded: its words and where the reader is.
struct Reader<'a> {
    words: &'a [u32],
    at: usize,
    rule: usize,
    family: IpFamily,
    strings: &'a Strings<'a>,
    /// Bytes the decoded rules may still take.
    budget: &'a mut usize,
}

impl<'a> Reader<'a> {
    fn err(&self, why: impl Into<String>) -> WordsError {
        WordsError { place: Place::Rule { rule: self.rule, word: self.at.saturating_sub(1) }, why: why.into() }
    }

    fn more(&self) -> bool {
        self.at < self.words.len()
    }

    fn word(&mut self, what: &str) -> Result<u32, WordsError> {
        let w = *self.words.get(self.at).ok_or_else(|| WordsError {
            place: Place::Rule { rule: self.rule, word: self.at },
            why: format!("the rule ends where {what} should be"),
        })?;
        self.at += 1;
        Ok(w)
    }

    fn at_most(&mut self, what: &str, max: u32) -> Result<u32, WordsError> {
        let w = self.word(what)?;
        if w > max {
            return Err(self.err(format!("{what} {w} (at most {max})")));
        }
        Ok(w)
    }

    fn flag(&mut self, what: &str) -> Result<bool, WordsError> {
        Ok(self.at_most(what, 1)? == 1)
    }

    fn charge(&mut self, bytes: usize) -> Result<(), WordsError> {
        match self.budget.checked_sub(bytes) {
            Some(left) => {
                *self.budget = left;
                Ok(())
            }
            None => Err(self.err("the ruleset decodes to more than the output limit")),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, WordsError> {
        let index = self.word(what)?;
        let s = self.strings.get(index).ok_or_else(|| self.err(format!("{what}: no string {index}")))?;
        self.charge(s.len())?;
        Ok(s.to_string())
    }

    fn address(&mut self, what: &str) -> Result<IpAddr, WordsError> {
        Ok(match self.family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(self.word(what)?)),
            IpFamily::V6 => {
                let mut octets = [0u8; 16];
                for chunk in octets.chunks_exact_mut(4) {
                    chunk.copy_from_slice(&self.word(what)?.to_be_bytes());
                }
                IpAddr::V6(Ipv6Addr::from(octets))
            }
        })
    }

    fn protocol(&mut self) -> Result<Protocol, WordsError> {
        Ok(match self.at_most("the protocol", 2)? {
            0 => Protocol::Tcp,
            1 => Protocol::Udp,
            _ => Protocol::Sctp,
        })
    }

    fn chain(&mut self) -> Result<(Table, String), WordsError> {
        let tag = self.at_most("the chain", chain::OWN_FILTER)?;
        if let Some(h) = Hook::ALL.get(tag as usize) {
            self.charge(h.chain().len())?;
            return Ok((h.table(), h.chain().to_string()));
        }
        let table = if tag == chain::OWN_NAT { Table::Nat } else { Table::Filter };
        Ok((table, self.string("the chain's name")?))
    }

    fn target(&mut self) -> Result<Target, WordsError> {
        use target::*;
        Ok(match self.at_most("the target", HASH_MARK)? {
            NONE => Target::None,
            ACCEPT => Target::Accept,
            DROP => Target::Drop,
            REJECT => Target::Reject,
            RETURN => Target::Return,
            JUMP => Target::Jump(self.string("the jump's chain")?),
            GOTO => Target::Goto(self.string("the goto's chain")?),
            MARK_FOR_MASQUERADE => Target::MarkForMasquerade,
            DNAT => {
                let ip = self.address("the DNAT address")?;
                Target::Dnat(ip, self.at_most("the DNAT port", u32::from(u16::MAX))? as u16)
            }
            _ => {
                let tuple = if self.flag("the hash tuple")? { HashTuple::Destination } else { HashTuple::Source };
                Target::HashMark(HashMark { tuple, modulus: self.word("the modulus")?, seed: self.word("the seed")? })
            }
        })
    }

    fn one_match(&mut self) -> Result<Match, WordsError> {
        use matches::*;
        let address = |r: &mut Reader| -> Result<AddressMatch, WordsError> {
            let negate = r.flag("negate")?;
            let prefix_len = r.at_most("the prefix length", if r.family == IpFamily::V4 { 32 } else { 128 })? as u8;
            Ok(AddressMatch { negate, cidr: Cidr { addr: r.address("the address")?, prefix_len } })
        };
        Ok(match self.at_most("the match", COMMENT)? {
            SOURCE => Match::Source(address(self)?),
            DESTINATION => Match::Destination(address(self)?),
            PROTOCOL => Match::Protocol(self.protocol()?),
            DESTINATION_PORT => Match::DestinationPort(self.at_most("the port", u32::from(u16::MAX))? as u16),
            IN_INTERFACE => {
                let (negate, prefix) = (self.flag("negate")?, self.flag("prefix")?);
                Match::InInterface(InterfaceMatch { negate, prefix, name: self.string("the interface")? })
            }
            SOURCE_TYPE_LOCAL => Match::SourceTypeLocal { negate: self.flag("negate")? },
            DESTINATION_TYPE_LOCAL => Match::DestinationTypeLocal { negate: self.flag("negate")? },
            CONNTRACK => {
                let negate = self.flag("negate")?;
                let bits = self.at_most("the states", CT_STATES)? as u8;
                Match::Conntrack { negate, states: CtStates::from_bits(bits) }
            }
            MARK => Match::Mark {
                negate: self.flag("negate")?,
                value: self.word("the value")?,
                mask: self.word("the mask")?,
            },
            STATISTIC_RANDOM => Match::StatisticRandom(self.word("the probability")?),
            STATISTIC_NTH => Match::StatisticNth { every: self.word("every")?, packet: self.word("packet")? },
            RECENT_CHECK => Match::RecentCheck {
                name: self.string("the list")?,
                seconds: self.word("the seconds")?,
                reap: self.flag("reap")?,
            },
            RECENT_SET => Match::RecentSet { name: self.string("the list")? },
            HASH_SLOT => Match::HashSlot(self.word("the slot")?),
            CLUSTER_HASH => Match::ClusterHash {
                total: self.at_most("the total", 255)? as u8,
                node: self.at_most("the node", 255)? as u8,
                seed: self.word("the seed")?,
            },
            _ => Match::Comment(self.string("the comment")?),
        })
    }
}

/// The own chains of `chains` or `delete-chains`.
fn own_chains(
    pairs: &[u32],
    field: &'static str,
    strings: &Strings,
    budget: &mut usize,
) -> Result<Vec<(Table, String)>, WordsError> {
    if !pairs.len().is_multiple_of(2) {
        return Err(field_err(field, pairs.len(), "an odd number of words (a table and a name each)"));
    }
    // No more room than the budget allows: the list's length is the plugin's.
    let mut out = Vec::with_capacity((pairs.len() / 2).min(*budget / size_of::<(Table, String)>()));
    for (i, pair) in pairs.chunks_exact(2).enumerate() {
        let table = match pair[0] {
            TABLE_NAT => Table::Nat,
            TABLE_FILTER => Table::Filter,
            t => return Err(field_err(field, i, format!("table {t} (0 nat, 1 filter)"))),
        };
        let name = strings.get(pair[1]).ok_or_else(|| field_err(field, i, format!("no string {}", pair[1])))?;
        *budget = budget
            .checked_sub(name.len() + size_of::<(Table, String)>())
            .ok_or_else(|| field_err(field, i, "the ruleset decodes to more than the output limit"))?;
        out.push((table, name.to_string()));
    }
    Ok(out)
}

/// The ruleset `w` holds. `budget` bounds the bytes the decoded rules
/// take (what is left of the plugin's output limit): a string referred to
/// many times is counted each time, so a few words cannot decode to
/// gigabytes, and no list is reserved from a length the plugin chose
/// beyond what the budget allows.
pub fn decode(w: &RuleWords, budget: usize) -> Result<Ruleset, WordsError> {
    let mut budget = budget;
    let strings = Strings::new(&w.text, &w.text_ends)?;
    let chains = own_chains(&w.chains, "chains", &strings, &mut budget)?;
    let delete_chains = own_chains(&w.delete_chains, "delete-chains", &strings, &mut budget)?;
    // Each rule is charged its size below, so the list never grows past this.
    let mut rules = Vec::with_capacity(w.rule_ends.len().min(budget / size_of::<Rule>()));
    // A rule's matches are gathered here and moved into a list of their
    // exact length: what a rule holds is what it was charged.
    let mut gathered = Vec::new();
    let mut start = 0usize;
    for (i, &end) in w.rule_ends.iter().enumerate() {
        let end = end as usize;
        if end < start || end > w.words.len() {
            return Err(field_err("rule-ends", i, format!("{end} is outside {start}..={}", w.words.len())));
        }
        let words = &w.words[start..end];
        start = end;
        budget = budget
            .checked_sub(size_of::<Rule>())
            .ok_or_else(|| field_err("rule-ends", i, "the ruleset decodes to more than the output limit"))?;
        let mut r = Reader { words, at: 0, rule: i, family: w.family, strings: &strings, budget: &mut budget };
        let (table, chain) = r.chain()?;
        let target = r.target()?;
        while r.more() {
            if gathered.len() == MAX_MATCHES {
                return Err(r.err(format!("more than {MAX_MATCHES} matches")));
            }
            r.charge(size_of::<Match>())?;
            gathered.push(r.one_match()?);
        }
        let mut matches = Vec::with_capacity(gathered.len());
        matches.append(&mut gathered);
        rules.push(Rule { table, chain, matches, target }.canonical());
    }
    if start != w.words.len() {
        return Err(field_err("words", start, format!("{} words after the last rule", w.words.len() - start)));
    }
    Ok(Ruleset { chains, rules, delete_chains, kept_hooks: w.kept_hooks.clone() })
}

/// Moves a [`RuleWords`] to and from a side's generated WIT record
/// (`iptables-rules` of `kpx:proxier/words@0.3.0`): the first path is the
/// `words` interface's module, the second 0.2.0's `types` (for the
/// family) and the third 0.2.0's `iptables` (for hooks). Invoked once by
/// kpx-sdk and once by the host, each on its own bindings.
#[macro_export]
macro_rules! words_conversions {
    ($($words:ident)::+, $($types:ident)::+, $($ipt:ident)::+) => {
        #[allow(dead_code)]
        pub(crate) mod wit_words {
            use $($words)::+ as wit;
            use $($types)::+ as wt;
            use $($ipt)::+ as wipt;
            use $crate::model::IpFamily;
            use $crate::ops::iptables::Hook;
            use $crate::ops::iptables::words::RuleWords;

            fn hook_to(h: Hook) -> wipt::Hook {
                match h {
                    Hook::NatServices => wipt::Hook::NatServices,
                    Hook::NatNodePorts => wipt::Hook::NatNodeports,
                    Hook::FilterServices => wipt::Hook::FilterServices,
                    Hook::FilterExternalServices => wipt::Hook::FilterExternalServices,
                    Hook::FilterNodePorts => wipt::Hook::FilterNodeports,
                    Hook::FilterFirewall => wipt::Hook::FilterFirewall,
                }
            }

            fn hook_from(h: wipt::Hook) -> Hook {
                match h {
                    wipt::Hook::NatServices => Hook::NatServices,
                    wipt::Hook::NatNodeports => Hook::NatNodePorts,
                    wipt::Hook::FilterServices => Hook::FilterServices,
                    wipt::Hook::FilterExternalServices => Hook::FilterExternalServices,
                    wipt::Hook::FilterNodeports => Hook::FilterNodePorts,
                    wipt::Hook::FilterFirewall => Hook::FilterFirewall,
                }
            }

            pub fn to_wit_words(w: RuleWords) -> wit::IptablesRules {
                wit::IptablesRules {
                    family: match w.family {
                        IpFamily::V4 => wt::IpFamily::Ipv4,
                        IpFamily::V6 => wt::IpFamily::Ipv6,
                    },
                    text: w.text,
                    text_ends: w.text_ends,
                    chains: w.chains,
                    delete_chains: w.delete_chains,
                    kept_hooks: w.kept_hooks.into_iter().map(hook_to).collect(),
                    rule_ends: w.rule_ends,
                    words: w.words,
                }
            }

            pub fn from_wit_words(w: wit::IptablesRules) -> RuleWords {
                RuleWords {
                    family: match w.family {
                        wt::IpFamily::Ipv4 => IpFamily::V4,
                        wt::IpFamily::Ipv6 => IpFamily::V6,
                    },
                    text: w.text,
                    text_ends: w.text_ends,
                    chains: w.chains,
                    delete_chains: w.delete_chains,
                    kept_hooks: w.kept_hooks.into_iter().map(hook_from).collect(),
                    rule_ends: w.rule_ends,
                    words: w.words,
                }
            }
        }
    };
}

#[cfg(test)]
mod tests;
