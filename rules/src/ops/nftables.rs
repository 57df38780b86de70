//! nftables objects of table `kube-proxy` as typed values (WIT
//! `kpx:proxier/nftables`). Set elements travel as columns of 32-bit
//! words, laid out by the set's declared key and data types (see
//! [`KeyType`] and [`DataType`]); [`ElementWriter`] builds them and
//! [`decode_elements`] reads them back as typed values.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::CtStates;
use crate::model::{Cidr, IpFamily, Protocol};

/// The table, in both families.
pub const TABLE: &str = "kube-proxy";

/// Longest name of a plugin's own chain, set or map.
pub const MAX_NAME: usize = 200;

/// The host's base chains: (name, type, hook, priority).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BaseChain {
    pub name: &'static str,
    pub kind: ChainKind,
    pub hook: NfHook,
    pub priority: i32,
}

/// A host-only base chain from a fuzzer's bytes (its name is `'static`).
#[cfg(feature = "arbitrary")]
impl<'a> arbitrary::Arbitrary<'a> for BaseChain {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(BaseChain {
            name: u.choose(&["nat-prerouting", "filter-input", "services"])?,
            kind: u.arbitrary()?,
            hook: u.arbitrary()?,
            priority: u.arbitrary()?,
        })
    }
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChainKind {
    Filter,
    Nat,
}

impl ChainKind {
    pub fn name(self) -> &'static str {
        match self {
            ChainKind::Filter => "filter",
            ChainKind::Nat => "nat",
        }
    }
}

/// Netfilter hooks (`NF_INET_*`).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NfHook {
    Prerouting = 0,
    Input = 1,
    Forward = 2,
    Output = 3,
    Postrouting = 4,
}

impl NfHook {
    pub fn name(self) -> &'static str {
        match self {
            NfHook::Prerouting => "prerouting",
            NfHook::Input => "input",
            NfHook::Forward => "forward",
            NfHook::Output => "output",
            NfHook::Postrouting => "postrouting",
        }
    }

    pub fn from_number(n: u32) -> Option<NfHook> {
        [NfHook::Prerouting, NfHook::Input, NfHook::Forward, NfHook::Output, NfHook::Postrouting]
            .into_iter()
            .find(|h| *h as u32 == n)
    }
}

/// Every set and map the host declares. The plugin fills those for
/// which [`HostSet::plugin_fills`] is true; the host fills the others.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostSet {
    ClusterIps,
    ServiceIps,
    ServiceNodePorts,
    NoEndpointServices,
    NoEndpointNodePorts,
    FirewallIps,
    FirewallAllow,
    Hairpin,
    /// Host only: --nodeport-addresses.
    NodePortIps,
    /// Host only: node ports refused on loopback (KEP-6032), each to its
    /// protocol's counting reject chain.
    LocalhostNodePortRejects,
}

impl HostSet {
    pub const ALL: [HostSet; 10] = [
        HostSet::ClusterIps,
        HostSet::ServiceIps,
        HostSet::ServiceNodePorts,
        HostSet::NoEndpointServices,
        HostSet::NoEndpointNodePorts,
        HostSet::FirewallIps,
        HostSet::FirewallAllow,
        HostSet::Hairpin,
        HostSet::NodePortIps,
        HostSet::LocalhostNodePortRejects,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HostSet::ClusterIps => "cluster-ips",
            HostSet::ServiceIps => "service-ips",
            HostSet::ServiceNodePorts => "service-nodeports",
            HostSet::NoEndpointServices => "no-endpoint-services",
            HostSet::NoEndpointNodePorts => "no-endpoint-nodeports",
            HostSet::FirewallIps => "firewall-ips",
            HostSet::FirewallAllow => "firewall-allow",
            HostSet::Hairpin => "hairpin",
            HostSet::NodePortIps => "nodeport-ips",
            HostSet::LocalhostNodePortRejects => "localhost-nodeport-reject-ports",
        }
    }

    pub fn from_name(name: &str) -> Option<HostSet> {
        HostSet::ALL.into_iter().find(|s| s.name() == name)
    }

    pub fn plugin_fills(self) -> bool {
        !matches!(self, HostSet::NodePortIps | HostSet::LocalhostNodePortRejects)
    }

    /// Its declaration.
    pub fn declaration(self) -> SetDecl {
        use KeyType::*;
        let (key, data, interval, comment): (&[KeyType], Option<DataType>, bool, &str) = match self {
            HostSet::ClusterIps => (&[Address], None, false, "Active ClusterIPs"),
            HostSet::ServiceIps => (
                &[Address, Protocol, Port],
                Some(DataType::Verdict),
                false,
                "ClusterIP, ExternalIP and LoadBalancer IP traffic",
            ),
            HostSet::ServiceNodePorts => (&[Protocol, Port], Some(DataType::Verdict), false, "NodePort traffic"),
            HostSet::NoEndpointServices => (
                &[Address, Protocol, Port],
                Some(DataType::Verdict),
                false,
                "vmap to drop or reject packets to services with no endpoints",
            ),
            HostSet::NoEndpointNodePorts => (
                &[Protocol, Port],
                Some(DataType::Verdict),
                false,
                "vmap to drop or reject packets to service nodeports with no endpoints",
            ),
            HostSet::FirewallIps => {
                (&[Address, Protocol, Port], None, false, "destinations that are subject to LoadBalancerSourceRanges")
            }
            HostSet::FirewallAllow => (
                &[Address, Protocol, Port, Cidr],
                None,
                true,
                "destinations and sources allowed by LoadBalancerSourceRanges",
            ),
            HostSet::Hairpin => {
                (&[Address, Address], None, false, "endpoint . endpoint: traffic an endpoint sends itself")
            }
            HostSet::NodePortIps => (&[Address], None, false, "IPs that accept NodePort traffic"),
            HostSet::LocalhostNodePortRejects => {
                (&[Protocol, Port], Some(DataType::Verdict), false, "localhost NodePorts rejected by kube-proxy")
            }
        };
        SetDecl {
            name: self.name().to_string(),
            key: key.to_vec(),
            data,
            interval,
            timeout_seconds: None,
            comment: Some(comment.to_string()),
        }
    }
}

/// A set or map: one of the host's, or one of the plugin's own.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetRef {
    Host(HostSet),
    Own(String),
}

impl SetRef {
    pub fn name(&self) -> &str {
        match self {
            SetRef::Host(h) => h.name(),
            SetRef::Own(n) => n,
        }
    }
}

/// One field of a set key (see the WIT docs of `key-type`).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyType {
    Address,
    Cidr,
    Protocol,
    Port,
    Integer,
}

impl KeyType {
    /// Words one field takes in `Elements::words`.
    pub fn words(self, family: IpFamily) -> usize {
        let addr = address_words(family);
        match self {
            KeyType::Address => addr,
            KeyType::Cidr => addr + 1,
            KeyType::Protocol | KeyType::Port | KeyType::Integer => 1,
        }
    }
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataType {
    Verdict,
    Endpoint,
}

impl DataType {
    pub fn words(self, family: IpFamily) -> usize {
        match self {
            DataType::Verdict => 2,
            DataType::Endpoint => address_words(family) + 1,
        }
    }
}

pub fn address_words(family: IpFamily) -> usize {
    match family {
        IpFamily::V4 => 1,
        IpFamily::V6 => 4,
    }
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VerdictKind {
    Accept = 0,
    Drop = 1,
    Reject = 2,
    Return = 3,
    Jump = 4,
    Goto = 5,
}

impl VerdictKind {
    pub fn from_word(w: u32) -> Option<VerdictKind> {
        [
            VerdictKind::Accept,
            VerdictKind::Drop,
            VerdictKind::Reject,
            VerdictKind::Return,
            VerdictKind::Jump,
            VerdictKind::Goto,
        ]
        .into_iter()
        .find(|k| *k as u32 == w)
    }
}

/// A set or map declaration (plugin sets and the host's own).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SetDecl {
    pub name: String,
    pub key: Vec<KeyType>,
    pub data: Option<DataType>,
    pub interval: bool,
    /// An affinity set: source addresses the kernel adds and expires.
    pub timeout_seconds: Option<u32>,
    pub comment: Option<String>,
}

impl SetDecl {
    /// Words per element: key then data.
    pub fn stride(&self, family: IpFamily) -> usize {
        self.key.iter().map(|k| k.words(family)).sum::<usize>() + self.data.map_or(0, |d| d.words(family))
    }

    /// An affinity set of this family.
    pub fn affinity(name: &str, timeout_seconds: u32) -> SetDecl {
        SetDecl {
            name: name.to_string(),
            key: vec![KeyType::Address],
            data: None,
            interval: false,
            timeout_seconds: Some(timeout_seconds),
            comment: None,
        }
    }
}

/// Elements of one set (see the WIT docs of `elements`).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Elements {
    pub set: SetRef,
    pub words: Vec<u32>,
    pub chains: Vec<String>,
}

/// One field of an element's key, as a typed value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Address(IpAddr),
    Cidr(Cidr),
    Protocol(Protocol),
    Port(u16),
    Integer(u32),
}

/// An element's data.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Data {
    Verdict(VerdictKind, Option<String>),
    Endpoint(IpAddr, u16),
}

/// One decoded element.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Element {
    pub key: Vec<Value>,
    pub data: Option<Data>,
}

pub fn protocol_number(p: Protocol) -> u32 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

pub fn protocol_from_number(n: u32) -> Option<Protocol> {
    match n {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// Appends an address's words.
pub fn push_address(words: &mut Vec<u32>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => words.push(u32::from(v4)),
        IpAddr::V6(v6) => {
            let w = u128::from(v6);
            words.extend([(w >> 96) as u32, (w >> 64) as u32, (w >> 32) as u32, w as u32]);
        }
    }
}

fn read_address(words: &[u32], family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(words[0])),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(
            (u128::from(words[0]) << 96)
                | (u128::from(words[1]) << 64)
                | (u128::from(words[2]) << 32)
                | u128::from(words[3]),
        )),
    }
}

/// Appends one typed value's words; `false` (and nothing written) when
/// the value is not of the field's type or family.
pub fn push_value(words: &mut Vec<u32>, family: IpFamily, field: KeyType, value: &Value) -> bool {
    match (field, value) {
        (KeyType::Address, Value::Address(ip)) if family.matches(ip) => push_address(words, *ip),
        (KeyType::Cidr, Value::Cidr(c)) if family.matches(&c.addr) => {
            push_address(words, c.addr);
            words.push(u32::from(c.prefix_len));
        }
        (KeyType::Protocol, Value::Protocol(p)) => words.push(protocol_number(*p)),
        (KeyType::Port, Value::Port(p)) => words.push(u32::from(*p)),
        (KeyType::Integer, Value::Integer(n)) => words.push(*n),
        _ => return false,
    }
    true
}

/// Why words do not decode, with the element's index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    pub element: usize,
    pub reason: String,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "element {}: {}", self.element, self.reason)
    }
}

/// Reads one element's key field.
pub fn decode_field(words: &[u32], family: IpFamily, field: KeyType) -> Result<Value, String> {
    match field {
        KeyType::Address => Ok(Value::Address(read_address(words, family))),
        KeyType::Cidr => {
            let n = address_words(family);
            let addr = read_address(words, family);
            let max = if family == IpFamily::V4 { 32 } else { 128 };
            let len = words[n];
            if len > max {
                return Err(format!("prefix length {len} is longer than {max}"));
            }
            let cidr = Cidr { addr, prefix_len: len as u8 };
            if cidr.network() != addr {
                return Err(format!("{cidr} has bits set past its prefix"));
            }
            Ok(Value::Cidr(cidr))
        }
        KeyType::Protocol => protocol_from_number(words[0])
            .map(Value::Protocol)
            .ok_or_else(|| format!("protocol {} is not tcp, udp or sctp", words[0])),
        KeyType::Port => {
            u16::try_from(words[0]).map(Value::Port).map_err(|_| format!("port {} is over 65535", words[0]))
        }
        KeyType::Integer => Ok(Value::Integer(words[0])),
    }
}

/// Reads an element's data.
pub fn decode_data(words: &[u32], family: IpFamily, data: DataType, chains: &[String]) -> Result<Data, String> {
    match data {
        DataType::Verdict => {
            let kind =
                VerdictKind::from_word(words[0]).ok_or_else(|| format!("verdict kind {} is unknown", words[0]))?;
            let chain = match kind {
                VerdictKind::Jump | VerdictKind::Goto => Some(
                    chains
                        .get(words[1] as usize)
                        .cloned()
                        .ok_or_else(|| format!("verdict names chain {} of {}", words[1], chains.len()))?,
                ),
                _ => None,
            };
            Ok(Data::Verdict(kind, chain))
        }
        DataType::Endpoint => {
            let n = address_words(family);
            let port = u16::try_from(words[n]).map_err(|_| format!("port {} is over 65535", words[n]))?;
            Ok(Data::Endpoint(read_address(words, family), port))
        }
    }
}

/// Decodes every element of `elements` by the set's declaration: keys
/// then data for elements to add.
pub fn decode_elements(decl: &SetDecl, family: IpFamily, elements: &Elements) -> Result<Vec<Element>, DecodeError> {
    decode(decl, family, elements, true)
}

/// Decodes elements to delete: keys only.
pub fn decode_keys(decl: &SetDecl, family: IpFamily, elements: &Elements) -> Result<Vec<Element>, DecodeError> {
    decode(decl, family, elements, false)
}

fn decode(decl: &SetDecl, family: IpFamily, elements: &Elements, with_data: bool) -> Result<Vec<Element>, DecodeError> {
    each_element(decl, family, elements, with_data)?.map(|r| r.map(|(element, _)| element)).collect()
}

/// Decodes elements one at a time (nothing is materialised for the whole
/// list), each with the words of its key: the key's canonical form, as
/// decoding refuses every value with another spelling.
pub fn each_element<'a>(
    decl: &'a SetDecl,
    family: IpFamily,
    elements: &'a Elements,
    with_data: bool,
) -> Result<impl Iterator<Item = Result<(Element, &'a [u32]), DecodeError>> + 'a, DecodeError> {
    let data_type = if with_data { decl.data } else { None };
    let key_words = decl.key.iter().map(|k| k.words(family)).sum::<usize>();
    let stride = key_words + data_type.map_or(0, |d| d.words(family));
    if stride == 0 || !elements.words.len().is_multiple_of(stride) {
        return Err(DecodeError {
            element: elements.words.len() / stride.max(1),
            reason: format!("{} words are not a whole number of {stride}-word elements", elements.words.len()),
        });
    }
    Ok(elements.words.chunks_exact(stride).enumerate().map(move |(i, chunk)| {
        let err = |reason| DecodeError { element: i, reason };
        let mut at = 0;
        let mut key = Vec::with_capacity(decl.key.len());
        for &field in &decl.key {
            let n = field.words(family);
            key.push(decode_field(&chunk[at..at + n], family, field).map_err(err)?);
            at += n;
        }
        let data = match data_type {
            Some(d) => Some(decode_data(&chunk[at..], family, d, &elements.chains).map_err(err)?),
            None => None,
        };
        Ok((Element { key, data }, &chunk[..key_words]))
    }))
}

/// Builds the words of elements for one set.
#[derive(Debug)]
pub struct ElementWriter {
    family: IpFamily,
    elements: Elements,
    chain_index: rustc_hash::FxHashMap<String, u32>,
}

impl ElementWriter {
    pub fn new(family: IpFamily, set: SetRef) -> ElementWriter {
        ElementWriter {
            family,
            elements: Elements { set, words: Vec::new(), chains: Vec::new() },
            chain_index: Default::default(),
        }
    }

    /// Appends a key field (the caller follows the set's declared order).
    pub fn value(&mut self, field: KeyType, value: &Value) -> &mut Self {
        let ok = push_value(&mut self.elements.words, self.family, field, value);
        debug_assert!(ok, "{value:?} is not a {field:?} of {:?}", self.family);
        self
    }

    pub fn address(&mut self, ip: IpAddr) -> &mut Self {
        push_address(&mut self.elements.words, ip);
        self
    }

    pub fn word(&mut self, w: u32) -> &mut Self {
        self.elements.words.push(w);
        self
    }

    pub fn protocol(&mut self, p: Protocol) -> &mut Self {
        self.word(protocol_number(p))
    }

    pub fn endpoint(&mut self, ip: IpAddr, port: u16) -> &mut Self {
        self.address(ip).word(u32::from(port))
    }

    /// Verdict data.
    pub fn verdict(&mut self, kind: VerdictKind, chain: Option<&str>) -> &mut Self {
        let index = match chain {
            Some(c) => match self.chain_index.get(c) {
                Some(&i) => i,
                None => {
                    let i = self.elements.chains.len() as u32;
                    self.elements.chains.push(c.to_string());
                    self.chain_index.insert(c.to_string(), i);
                    i
                }
            },
            None => 0,
        };
        self.word(kind as u32).word(index)
    }

    pub fn is_empty(&self) -> bool {
        self.elements.words.is_empty()
    }

    /// Appends words already laid out for this set.
    pub fn words(&mut self, words: &[u32]) -> &mut Self {
        self.elements.words.extend_from_slice(words);
        self
    }

    pub fn finish(self) -> Elements {
        self.elements
    }
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressField {
    Source,
    Destination,
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyExpr {
    Address(AddressField),
    Protocol,
    DestinationPort,
    NumgenRandom(u32),
    NumgenIncrement(u32),
    Jhash { field: AddressField, modulus: u32, seed: u32 },
}

impl KeyExpr {
    /// The set key type this expression fills.
    pub fn key_type(self) -> KeyType {
        match self {
            KeyExpr::Address(_) => KeyType::Address,
            KeyExpr::Protocol => KeyType::Protocol,
            KeyExpr::DestinationPort => KeyType::Port,
            KeyExpr::NumgenRandom(_) | KeyExpr::NumgenIncrement(_) | KeyExpr::Jhash { .. } => KeyType::Integer,
        }
    }

    /// `daddr . l4proto . dport`: a Service destination.
    pub const DESTINATION: [KeyExpr; 3] =
        [KeyExpr::Address(AddressField::Destination), KeyExpr::Protocol, KeyExpr::DestinationPort];
    /// `l4proto . dport`: a node port.
    pub const NODE_PORT: [KeyExpr; 2] = [KeyExpr::Protocol, KeyExpr::DestinationPort];
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Match {
    Address {
        field: AddressField,
        negate: bool,
        cidr: Cidr,
    },
    Protocol {
        negate: bool,
        protocol: Protocol,
    },
    DestinationPort {
        negate: bool,
        port: u16,
    },
    InInterface {
        negate: bool,
        name: String,
        prefix: bool,
    },
    FibLocal {
        field: AddressField,
        negate: bool,
    },
    CtState {
        negate: bool,
        states: CtStates,
    },
    /// Host only: `ct status dnat`, the connection's destination was
    /// rewritten (by a Service's DNAT).
    CtDnat {
        negate: bool,
    },
    Mark {
        negate: bool,
        value: u32,
        mask: u32,
    },
    Lookup {
        keys: Vec<KeyExpr>,
        set: SetRef,
        negate: bool,
    },
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Statement {
    Counter,
    MasqueradeMark,
    AffinityUpdate(String),
    /// Host only: `meta mark set meta mark xor VALUE`.
    MarkXor(u32),
    /// Host only: `counter name "NAME"`, a counter object of the table.
    NamedCounter(String),
    /// Host only: `masquerade [fully-random]` (ends the rule).
    Masquerade {
        fully_random: bool,
    },
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    Continue,
    Accept,
    Drop,
    Reject,
    Return,
    Jump(String),
    Goto(String),
    Dnat(IpAddr, u16),
    DnatMap { keys: Vec<KeyExpr>, map: SetRef },
    Vmap { keys: Vec<KeyExpr>, map: SetRef },
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    pub chain: String,
    pub matches: Vec<Match>,
    pub statements: Vec<Statement>,
    pub verdict: Verdict,
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(chain: &str) -> Rule {
        Rule {
            chain: chain.to_string(),
            matches: Vec::new(),
            statements: Vec::new(),
            verdict: Verdict::Continue,
            comment: None,
        }
    }

    pub fn with(mut self, m: Match) -> Rule {
        self.matches.push(m);
        self
    }

    pub fn statement(mut self, s: Statement) -> Rule {
        self.statements.push(s);
        self
    }

    pub fn verdict(mut self, v: Verdict) -> Rule {
        self.verdict = v;
        self
    }

    pub fn comment(mut self, c: &str) -> Rule {
        self.comment = Some(c.to_string());
        self
    }
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    AddChain(String),
    FlushChain(String),
    DeleteChain(String),
    AddSet(SetDecl),
    FlushSet(String),
    DeleteSet(String),
    AddRule(Rule),
    AddElements(Elements),
    DeleteElements(Elements),
    /// Host only.
    AddBaseChain(BaseChain),
}

/// One sync's transaction (see the WIT docs of `nftables.ruleset`).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Transaction {
    pub ops: Vec<Op>,
}

impl Transaction {
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}
