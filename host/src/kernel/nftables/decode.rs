//! nf_tables netlink dumps back to typed objects: the kernel's side of the
//! round trip (encode.rs writes, the kernel holds, this reads). It knows
//! the bytecode kpx writes; anything else in a chain is reported as a
//! rule kpx did not write.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpx_rules::model::{Cidr, IpFamily};
use kpx_rules::ops::CtStates;
use kpx_rules::ops::nftables::{
    AddressField, Data, DataType, Element, HostSet, KeyExpr, KeyType, Match, Rule, SetDecl, SetRef, Statement, Value,
    Verdict, VerdictKind, protocol_from_number,
};

use super::sys::*;
use crate::kernel::netlink::nla::{Attr, attrs, find, need};
use crate::syntax::nftables::REJECT_CHAIN;

type Result<T, E = String> = std::result::Result<T, E>;

/// A base chain's hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseInfo {
    pub kind: String,
    pub hook: u32,
    pub priority: i32,
    pub policy: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainInfo {
    pub name: String,
    pub base: Option<BaseInfo>,
}

/// What the kernel keeps of a set's declaration; two declarations encode
/// the same way exactly when these are equal.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetShape {
    pub flags: u32,
    pub key_type: u32,
    pub key_len: u32,
    pub data_type: Option<u32>,
    pub data_len: Option<u32>,
    pub timeout_ms: Option<u64>,
    /// Its declared size (its most elements), if any.
    pub size: Option<u32>,
}

impl SetShape {
    /// Whether a set the kernel holds has this shape, its size included,
    /// but for a set with timeouts declared without one (the kernel gives
    /// sets updated from the packet path a default of its own).
    pub fn held_as(&self, kernel: &SetShape) -> bool {
        let size = self.size == kernel.size || (self.size.is_none() && self.timeout_ms.is_some());
        size && SetShape { size: None, ..self.clone() } == SetShape { size: None, ..kernel.clone() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetInfo {
    pub name: String,
    pub shape: SetShape,
}

fn string(a: &[Attr], kind: u16, what: &str) -> Result<String> {
    need(a, kind, what)?.string()
}

pub fn chain(payload: &[u8]) -> Result<ChainInfo> {
    let a = attrs(payload)?;
    let name = string(&a, NFTA_CHAIN_NAME, "a chain")?;
    let base = match find(&a, NFTA_CHAIN_HOOK) {
        None => None,
        Some(hook) => {
            let h = hook.nested()?;
            Some(BaseInfo {
                kind: find(&a, NFTA_CHAIN_TYPE).map(|t| t.string()).transpose()?.unwrap_or_default(),
                hook: need(&h, NFTA_HOOK_HOOKNUM, "a hook")?.u32_be()?,
                priority: need(&h, NFTA_HOOK_PRIORITY, "a hook")?.u32_be()? as i32,
                policy: find(&a, NFTA_CHAIN_POLICY).map(|p| p.u32_be()).transpose()?.unwrap_or(NF_ACCEPT as u32),
            })
        }
    };
    Ok(ChainInfo { name, base })
}

pub fn set(payload: &[u8]) -> Result<SetInfo> {
    let a = attrs(payload)?;
    let opt = |kind| find(&a, kind).map(|x| x.u32_be()).transpose();
    Ok(SetInfo {
        name: string(&a, NFTA_SET_NAME, "a set")?,
        shape: SetShape {
            flags: opt(NFTA_SET_FLAGS)?.unwrap_or(0),
            key_type: opt(NFTA_SET_KEY_TYPE)?.unwrap_or(0),
            key_len: opt(NFTA_SET_KEY_LEN)?.unwrap_or(0),
            data_type: opt(NFTA_SET_DATA_TYPE)?,
            // The kernel sizes verdict data itself: only a value's length counts.
            data_len: opt(NFTA_SET_DATA_LEN)?
                .filter(|_| opt(NFTA_SET_DATA_TYPE).ok().flatten().is_some_and(|t| t != NFT_DATA_VERDICT)),
            timeout_ms: find(&a, NFTA_SET_TIMEOUT).map(|x| x.u64_be()).transpose()?,
            size: match find(&a, NFTA_SET_DESC) {
                Some(desc) => find(&desc.nested()?, NFTA_SET_DESC_SIZE).map(|s| s.u32_be()).transpose()?,
                None => None,
            },
        },
    })
}

/// The shape a declaration gets in the kernel with `size`.
pub fn shape_of(family: IpFamily, d: &SetDecl, size: Option<u32>) -> Result<SetShape> {
    let msg = super::encode::add_set(family, d, 1, size, None);
    let info = set(&msg.attrs.buf)?;
    Ok(info.shape)
}

fn address(bytes: &[u8]) -> Result<IpAddr> {
    match bytes.len() {
        4 => Ok(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
        16 => {
            let b: [u8; 16] = bytes.try_into().map_err(|_| "address")?;
            Ok(IpAddr::V6(Ipv6Addr::from(b)))
        }
        n => Err(format!("a {n}-byte address")),
    }
}

fn data_value(a: &Attr) -> Result<Vec<u8>> {
    let inner = a.nested()?;
    Ok(need(&inner, NFTA_DATA_VALUE, "data")?.value.to_vec())
}

fn verdict_of(a: &Attr) -> Result<(i32, Option<String>)> {
    let inner = a.nested()?;
    let v = need(&inner, NFTA_DATA_VERDICT, "verdict data")?.nested()?;
    let code = need(&v, NFTA_VERDICT_CODE, "a verdict")?.u32_be()? as i32;
    let chain = find(&v, NFTA_VERDICT_CHAIN).map(|c| c.string()).transpose()?;
    Ok((code, chain))
}

fn verdict_kind(code: i32, chain: Option<String>) -> Result<(VerdictKind, Option<String>)> {
    Ok(match code {
        NF_ACCEPT => (VerdictKind::Accept, None),
        NF_DROP => (VerdictKind::Drop, None),
        NFT_RETURN => (VerdictKind::Return, None),
        NFT_GOTO if chain.as_deref() == Some(REJECT_CHAIN) => (VerdictKind::Reject, None),
        NFT_JUMP => (VerdictKind::Jump, chain),
        NFT_GOTO => (VerdictKind::Goto, chain),
        other => return Err(format!("verdict code {other}")),
    })
}

fn field_len(family: IpFamily, k: KeyType) -> usize {
    match k {
        KeyType::Address | KeyType::Cidr => {
            if family == IpFamily::V4 {
                4
            } else {
                16
            }
        }
        KeyType::Protocol => 1,
        KeyType::Port => 2,
        KeyType::Integer => 4,
    }
}

/// The prefix from `start` to `end`, if they span one exactly.
fn prefix(start: IpAddr, end: IpAddr) -> Result<Cidr> {
    let max = if start.is_ipv4() { 32 } else { 128 };
    for len in 0..=max {
        let c = Cidr { addr: start, prefix_len: len };
        if c.network() == start && c.last() == end {
            return Ok(c);
        }
    }
    Err(format!("{start}-{end} is not one prefix"))
}

/// Elements of a GETSETELEM reply, read by the set's declaration.
pub fn elements(family: IpFamily, decl: &SetDecl, payload: &[u8]) -> Result<Vec<Element>> {
    let a = attrs(payload)?;
    let Some(list) = find(&a, NFTA_SET_ELEM_LIST_ELEMENTS) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for item in list.nested()? {
        let e = item.nested()?;
        let key = data_value(&need(&e, NFTA_SET_ELEM_KEY, "an element")?)?;
        let end = find(&e, NFTA_SET_ELEM_KEY_END).map(|k| data_value(&k)).transpose()?;
        let mut at = 0;
        let mut values = Vec::new();
        for &k in &decl.key {
            let n = field_len(family, k);
            let padded = (n + 3) & !3;
            let field = key.get(at..at + n).ok_or("a key shorter than its type")?;
            let field_end = end.as_ref().and_then(|e| e.get(at..at + n));
            values.push(match k {
                KeyType::Address => Value::Address(address(field)?),
                KeyType::Cidr => {
                    let start = address(field)?;
                    let stop = field_end.map(address).transpose()?.unwrap_or(start);
                    Value::Cidr(prefix(start, stop)?)
                }
                KeyType::Protocol => {
                    Value::Protocol(protocol_from_number(u32::from(field[0])).ok_or("an unknown protocol")?)
                }
                KeyType::Port => Value::Port(u16::from_be_bytes([field[0], field[1]])),
                KeyType::Integer => Value::Integer(u32::from_ne_bytes(field.try_into().map_err(|_| "integer")?)),
            });
            at += padded;
        }
        let data = match (decl.data, find(&e, NFTA_SET_ELEM_DATA)) {
            (Some(DataType::Verdict), Some(d)) => {
                let (code, chain) = verdict_of(&d)?;
                let (kind, chain) = verdict_kind(code, chain)?;
                Some(Data::Verdict(kind, chain))
            }
            (Some(DataType::Endpoint), Some(d)) => {
                let v = data_value(&d)?;
                let n = if family == IpFamily::V4 { 4 } else { 16 };
                let ip = address(v.get(..n).ok_or("endpoint data too short")?)?;
                let port = u16::from_be_bytes([v.get(n).copied().unwrap_or(0), v.get(n + 1).copied().unwrap_or(0)]);
                Some(Data::Endpoint(ip, port))
            }
            (None, None) => None,
            (want, got) => return Err(format!("element data {:?} for a set of data {want:?}", got.map(|g| g.kind))),
        };
        out.push(Element { key: values, data });
    }
    Ok(out)
}

/// What a register holds while a rule is read.
#[derive(Debug, Clone, PartialEq)]
enum Reg {
    Payload {
        base: u32,
        offset: u32,
        len: u32,
    },
    Meta(u32),
    Fib {
        flags: u32,
    },
    CtState,
    CtStatus,
    Numgen {
        modulus: u32,
        random: bool,
    },
    Hash {
        field: AddressField,
        modulus: u32,
        seed: u32,
    },
    /// A value loaded through a mask: (what, mask, xor).
    Masked(Box<Reg>, Vec<u8>, Vec<u8>),
    Immediate(Vec<u8>),
    /// The data a lookup returned.
    LookupData(Vec<KeyExpr>, SetRef),
}

fn set_ref(name: String) -> SetRef {
    match HostSet::from_name(&name) {
        Some(h) => SetRef::Host(h),
        None => SetRef::Own(name),
    }
}

struct Reader {
    family: IpFamily,
    masquerade_mark: u32,
    regs: std::collections::BTreeMap<u32, Reg>,
    /// Registers loaded since the last consumer, in order.
    pending: Vec<u32>,
    rule: Rule,
}

/// The 32-bit register number of a register attribute.
fn reg32(r: u32) -> u32 {
    if (1..=4).contains(&r) { NFT_REG32_00 + (r - 1) * 4 } else { r }
}

impl Reader {
    fn address_field(&self, offset: u32, len: u32) -> Option<(AddressField, u32)> {
        match (self.family, offset) {
            (IpFamily::V4, 12) if len <= 4 => Some((AddressField::Source, len)),
            (IpFamily::V4, 16) if len <= 4 => Some((AddressField::Destination, len)),
            (IpFamily::V6, 8) if len <= 16 => Some((AddressField::Source, len)),
            (IpFamily::V6, 24) if len <= 16 => Some((AddressField::Destination, len)),
            _ => None,
        }
    }

    fn full_address_len(&self) -> u32 {
        if self.family == IpFamily::V4 { 4 } else { 16 }
    }

    fn load(&mut self, reg: u32, what: Reg) {
        let reg = reg32(reg);
        self.regs.insert(reg, what);
        self.pending.retain(|r| *r != reg);
        self.pending.push(reg);
    }

    fn take(&mut self, reg: u32) -> Result<Reg> {
        let reg = reg32(reg);
        self.pending.retain(|r| *r != reg);
        self.regs.get(&reg).cloned().ok_or_else(|| format!("register {reg} read before it was loaded"))
    }

    /// The lookup key in registers from 8: its fields in order.
    fn key(&mut self) -> Result<Vec<KeyExpr>> {
        let mut reg = NFT_REG32_00;
        let mut out = Vec::new();
        let pending = std::mem::take(&mut self.pending);
        for r in pending {
            if r != reg {
                return Err(format!("key field in register {r}, want {reg}"));
            }
            let k = match self.regs.get(&r).cloned() {
                Some(Reg::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, offset, len })
                    if len == self.full_address_len() =>
                {
                    let (f, _) = self.address_field(offset, len).ok_or("a payload kpx does not write")?;
                    KeyExpr::Address(f)
                }
                Some(Reg::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 2, len: 2 }) => {
                    KeyExpr::DestinationPort
                }
                Some(Reg::Meta(NFT_META_L4PROTO)) => KeyExpr::Protocol,
                Some(Reg::Numgen { modulus, random: true }) => KeyExpr::NumgenRandom(modulus),
                Some(Reg::Numgen { modulus, random: false }) => KeyExpr::NumgenIncrement(modulus),
                Some(Reg::Hash { field, modulus, seed }) => KeyExpr::Jhash { field, modulus, seed },
                other => return Err(format!("a key field kpx does not write: {other:?}")),
            };
            reg += match k {
                KeyExpr::Address(_) => self.full_address_len() / 4,
                _ => 1,
            };
            out.push(k);
        }
        if out.is_empty() {
            return Err("a lookup without a key".into());
        }
        Ok(out)
    }

    fn cmp(&mut self, reg: u32, negate: bool, data: &[u8]) -> Result<()> {
        let what = self.take(reg)?;
        let m = match what {
            Reg::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, offset, len } => {
                let (field, len) = self.address_field(offset, len).ok_or("a payload kpx does not write")?;
                let mut bytes = data.to_vec();
                bytes.resize(self.full_address_len() as usize, 0);
                Match::Address { field, negate, cidr: Cidr { addr: address(&bytes)?, prefix_len: (len * 8) as u8 } }
            }
            Reg::Masked(inner, mask, _) if matches!(*inner, Reg::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, .. }) => {
                let Reg::Payload { offset, len, .. } = *inner else { unreachable!() };
                let (field, _) = self.address_field(offset, len).ok_or("a payload kpx does not write")?;
                let prefix: u32 = mask.iter().map(|b| b.leading_ones()).take_while(|_| true).sum();
                Match::Address { field, negate, cidr: Cidr { addr: address(data)?, prefix_len: prefix as u8 } }
            }
            Reg::Payload { base: NFT_PAYLOAD_TRANSPORT_HEADER, offset: 2, len: 2 } if data.len() == 2 => {
                Match::DestinationPort { negate, port: u16::from_be_bytes([data[0], data[1]]) }
            }
            Reg::Meta(NFT_META_L4PROTO) if data.len() == 1 => Match::Protocol {
                negate,
                protocol: protocol_from_number(u32::from(data[0])).ok_or("an unknown protocol")?,
            },
            Reg::Meta(NFT_META_IIFNAME) => {
                let prefix = data.len() < 16;
                let end = data.iter().position(|b| *b == 0).unwrap_or(data.len());
                let name = String::from_utf8(data[..end].to_vec()).map_err(|_| "an interface name")?;
                Match::InInterface { negate, name, prefix }
            }
            Reg::Meta(NFT_META_MARK) => {
                Match::Mark { negate, value: u32::from_ne_bytes(data.try_into().map_err(|_| "mark")?), mask: u32::MAX }
            }
            Reg::Masked(inner, mask, _) if *inner == Reg::Meta(NFT_META_MARK) => Match::Mark {
                negate,
                value: u32::from_ne_bytes(data.try_into().map_err(|_| "mark")?),
                mask: u32::from_ne_bytes(mask.as_slice().try_into().map_err(|_| "mask")?),
            },
            Reg::Fib { flags } if data == RTN_LOCAL.to_ne_bytes() => Match::FibLocal {
                field: if flags == NFTA_FIB_F_SADDR { AddressField::Source } else { AddressField::Destination },
                negate,
            },
            Reg::Masked(inner, mask, _) if *inner == Reg::CtState && data == [0, 0, 0, 0] => {
                let bits = u32::from_ne_bytes(mask.as_slice().try_into().map_err(|_| "ct mask")?);
                let mut states = CtStates::empty();
                for (bit, flag) in [
                    (NF_CT_STATE_INVALID, CtStates::INVALID),
                    (NF_CT_STATE_ESTABLISHED, CtStates::ESTABLISHED),
                    (NF_CT_STATE_RELATED, CtStates::RELATED),
                    (NF_CT_STATE_NEW, CtStates::NEW),
                    (NF_CT_STATE_UNTRACKED, CtStates::UNTRACKED),
                ] {
                    if bits & bit != 0 {
                        states = states | flag;
                    }
                }
                // `!= 0`: in one of the states.
                Match::CtState { negate: !negate, states }
            }
            Reg::Masked(inner, mask, _)
                if *inner == Reg::CtStatus && data == [0, 0, 0, 0] && mask == IPS_DST_NAT.to_ne_bytes() =>
            {
                Match::CtDnat { negate: !negate }
            }
            other => return Err(format!("a comparison kpx does not write: {other:?}")),
        };
        self.rule.matches.push(m);
        Ok(())
    }

    fn expr(&mut self, name: &str, a: &[Attr]) -> Result<()> {
        let u = |kind| need(a, kind, name).and_then(|x| x.u32_be());
        match name {
            "payload" => {
                let what = Reg::Payload {
                    base: u(NFTA_PAYLOAD_BASE)?,
                    offset: u(NFTA_PAYLOAD_OFFSET)?,
                    len: u(NFTA_PAYLOAD_LEN)?,
                };
                self.load(u(NFTA_PAYLOAD_DREG)?, what);
            }
            "meta" => {
                let key = u(NFTA_META_KEY)?;
                if let Some(sreg) = find(a, NFTA_META_SREG) {
                    // meta set mark: mark = (mark & MASK) ^ XOR
                    let what = self.take(sreg.u32_be()?)?;
                    let Reg::Masked(inner, mask, xor) = what else {
                        return Err("meta set of an unmasked value".into());
                    };
                    if *inner != Reg::Meta(NFT_META_MARK) || key != NFT_META_MARK {
                        return Err("a meta set kpx does not write".into());
                    }
                    let mask = u32::from_ne_bytes(mask.as_slice().try_into().map_err(|_| "mask")?);
                    let xor = u32::from_ne_bytes(xor.as_slice().try_into().map_err(|_| "xor")?);
                    let m = self.masquerade_mark;
                    let s = if mask == !m && xor == m {
                        Statement::MasqueradeMark
                    } else if mask == u32::MAX {
                        Statement::MarkXor(xor)
                    } else {
                        return Err(format!("mark set to (mark & {mask:#x}) ^ {xor:#x}"));
                    };
                    self.rule.statements.push(s);
                } else {
                    self.load(u(NFTA_META_DREG)?, Reg::Meta(key));
                }
            }
            "bitwise" => {
                let sreg = u(NFTA_BITWISE_SREG)?;
                let what = self.take(sreg)?;
                let mask = data_value(&need(a, NFTA_BITWISE_MASK, name)?)?;
                let xor = data_value(&need(a, NFTA_BITWISE_XOR, name)?)?;
                self.load(u(NFTA_BITWISE_DREG)?, Reg::Masked(Box::new(what), mask, xor));
            }
            "cmp" => {
                let negate = match u(NFTA_CMP_OP)? {
                    NFT_CMP_EQ => false,
                    NFT_CMP_NEQ => true,
                    other => return Err(format!("comparison operator {other}")),
                };
                let data = data_value(&need(a, NFTA_CMP_DATA, name)?)?;
                self.cmp(u(NFTA_CMP_SREG)?, negate, &data)?;
            }
            "fib" => {
                if u(NFTA_FIB_RESULT)? != NFT_FIB_RESULT_ADDRTYPE {
                    return Err("a fib lookup kpx does not write".into());
                }
                self.load(u(NFTA_FIB_DREG)?, Reg::Fib { flags: u(NFTA_FIB_FLAGS)? });
            }
            "ct" => {
                let reg = match u(NFTA_CT_KEY)? {
                    NFT_CT_STATE => Reg::CtState,
                    NFT_CT_STATUS => Reg::CtStatus,
                    _ => return Err("a ct key kpx does not write".into()),
                };
                self.load(u(NFTA_CT_DREG)?, reg);
            }
            "numgen" => {
                if find(a, NFTA_NG_OFFSET).map(|o| o.u32_be()).transpose()?.unwrap_or(0) != 0 {
                    return Err("numgen with an offset".into());
                }
                let random = u(NFTA_NG_TYPE)? == NFT_NG_RANDOM;
                self.load(u(NFTA_NG_DREG)?, Reg::Numgen { modulus: u(NFTA_NG_MODULUS)?, random });
            }
            "hash" => {
                let input = self.take(u(NFTA_HASH_SREG)?)?;
                let field = match input {
                    Reg::Payload { base: NFT_PAYLOAD_NETWORK_HEADER, offset, len } => {
                        self.address_field(offset, len).ok_or("hash of a payload kpx does not write")?.0
                    }
                    _ => return Err("hash of something kpx does not hash".into()),
                };
                let what = Reg::Hash { field, modulus: u(NFTA_HASH_MODULUS)?, seed: u(NFTA_HASH_SEED)? };
                self.load(u(NFTA_HASH_DREG)?, what);
            }
            "lookup" => {
                let set = set_ref(need(a, NFTA_LOOKUP_SET, name)?.string()?);
                let keys = self.key()?;
                let negate =
                    find(a, NFTA_LOOKUP_FLAGS).map(|f| f.u32_be()).transpose()?.unwrap_or(0) & NFT_LOOKUP_F_INV != 0;
                match find(a, NFTA_LOOKUP_DREG).map(|d| d.u32_be()).transpose()? {
                    None => self.rule.matches.push(Match::Lookup { keys, set, negate }),
                    Some(NFT_REG_VERDICT) => self.rule.verdict = Verdict::Vmap { keys, map: set },
                    Some(d) => {
                        let d = reg32(d);
                        self.regs.insert(d, Reg::LookupData(keys, set));
                    }
                }
            }
            "immediate" => {
                let dreg = u(NFTA_IMMEDIATE_DREG)?;
                let data = need(a, NFTA_IMMEDIATE_DATA, name)?;
                if dreg == NFT_REG_VERDICT {
                    let (code, chain) = verdict_of(&data)?;
                    self.rule.verdict = match code {
                        NF_ACCEPT => Verdict::Accept,
                        NF_DROP => Verdict::Drop,
                        NFT_RETURN => Verdict::Return,
                        NFT_JUMP => Verdict::Jump(chain.ok_or("jump without a chain")?),
                        NFT_GOTO => Verdict::Goto(chain.ok_or("goto without a chain")?),
                        other => return Err(format!("verdict code {other}")),
                    };
                } else {
                    let v = data_value(&data)?;
                    let dreg = reg32(dreg);
                    self.regs.insert(dreg, Reg::Immediate(v));
                }
            }
            "nat" => {
                if u(NFTA_NAT_TYPE)? != NFT_NAT_DNAT {
                    return Err("a NAT kpx does not write (snat)".into());
                }
                let extra = find(a, NFTA_NAT_FLAGS).map(|f| f.u32_be()).transpose()?.unwrap_or(0)
                    & !(NF_NAT_RANGE_MAP_IPS | NF_NAT_RANGE_PROTO_SPECIFIED);
                let addr = reg32(u(NFTA_NAT_REG_ADDR_MIN)?);
                let proto = reg32(u(NFTA_NAT_REG_PROTO_MIN)?);
                // The kernel reports max = min when no range was given.
                let same = |kind: u16, min: u32| {
                    find(a, kind).map(|m| m.u32_be()).transpose().map(|m| m.is_none_or(|m| reg32(m) == min))
                };
                if extra != 0 || !same(NFTA_NAT_REG_ADDR_MAX, addr)? || !same(NFTA_NAT_REG_PROTO_MAX, proto)? {
                    return Err("dnat with ranges or flags kpx does not write".into());
                }
                self.rule.verdict = match (self.regs.get(&addr).cloned(), self.regs.get(&proto).cloned()) {
                    (Some(Reg::Immediate(a)), Some(Reg::Immediate(p))) if p.len() >= 2 => {
                        Verdict::Dnat(address(&a)?, u16::from_be_bytes([p[0], p[1]]))
                    }
                    (Some(Reg::LookupData(keys, map)), _) if proto == addr + self.full_address_len() / 4 => {
                        Verdict::DnatMap { keys, map }
                    }
                    other => return Err(format!("dnat from registers kpx does not fill so: {other:?}")),
                };
            }
            "masq" => {
                let flags = find(a, NFTA_MASQ_FLAGS).map(|f| f.u32_be()).transpose()?.unwrap_or(0);
                self.rule
                    .statements
                    .push(Statement::Masquerade { fully_random: flags & NF_NAT_RANGE_PROTO_RANDOM_FULLY != 0 });
            }
            "reject" => self.rule.verdict = Verdict::Reject,
            "counter" => self.rule.statements.push(Statement::Counter),
            "objref" => {
                if u(NFTA_OBJREF_IMM_TYPE)? != NFT_OBJECT_COUNTER {
                    return Err("an object reference kpx does not write".into());
                }
                self.rule.statements.push(Statement::NamedCounter(need(a, NFTA_OBJREF_IMM_NAME, name)?.string()?));
            }
            "dynset" => {
                if u(NFTA_DYNSET_OP)? != NFT_DYNSET_OP_UPDATE {
                    return Err("a dynset kpx does not write".into());
                }
                let key = self.take(u(NFTA_DYNSET_SREG_KEY)?)?;
                let src = Reg::Payload {
                    base: NFT_PAYLOAD_NETWORK_HEADER,
                    offset: if self.family == IpFamily::V4 { 12 } else { 8 },
                    len: self.full_address_len(),
                };
                if key != src {
                    return Err("a set update with a key kpx does not write".into());
                }
                self.rule.statements.push(Statement::AffinityUpdate(need(a, NFTA_DYNSET_SET_NAME, name)?.string()?));
            }
            other => return Err(format!("expression {other:?} is not one kpx writes")),
        }
        Ok(())
    }
}

/// A GETRULE reply: its chain, and the rule if kpx wrote it.
pub fn rule(family: IpFamily, masquerade_mark: u32, payload: &[u8]) -> (String, Result<Rule>) {
    let a = match attrs(payload) {
        Ok(a) => a,
        Err(e) => return (String::new(), Err(e)),
    };
    let chain = find(&a, NFTA_RULE_CHAIN).and_then(|c| c.string().ok()).unwrap_or_default();
    let mut r =
        Reader { family, masquerade_mark, regs: Default::default(), pending: Vec::new(), rule: Rule::new(&chain) };
    let result = (|| {
        if let Some(list) = find(&a, NFTA_RULE_EXPRESSIONS) {
            for item in list.nested()? {
                let e = item.nested()?;
                let name = need(&e, NFTA_EXPR_NAME, "an expression")?.string()?;
                let data = find(&e, NFTA_EXPR_DATA).map(|d| d.nested()).transpose()?.unwrap_or_default();
                r.expr(&name, &data)?;
            }
        }
        if let Some(u) = find(&a, NFTA_RULE_USERDATA) {
            // type 0 (comment), length, NUL-terminated text
            if u.value.len() > 2 && u.value[0] == NFTNL_UDATA_RULE_COMMENT {
                let text = &u.value[2..2 + (u.value[1] as usize).min(u.value.len() - 2)];
                let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
                r.rule.comment = Some(String::from_utf8_lossy(&text[..end]).into_owned());
            }
        }
        if !r.pending.is_empty() {
            return Err("values loaded and never used".into());
        }
        Ok(r.rule.clone())
    })();
    (chain, result)
}

/// A declaration read back from the kernel's types: interval sets' address
/// fields read as ranges (cidrs), 32-bit numbers as integers. The host's
/// own sets are known by name; this is for the plugin's.
pub fn declaration(family: IpFamily, s: &SetInfo) -> Result<SetDecl> {
    let shape = &s.shape;
    let interval = shape.flags & NFT_SET_INTERVAL != 0;
    let mut ids = Vec::new();
    let mut t = shape.key_type;
    while t != 0 {
        ids.push(t & ((1 << TYPE_BITS) - 1));
        t >>= TYPE_BITS;
    }
    ids.reverse();
    let address = if family == IpFamily::V4 { TYPE_IPADDR } else { TYPE_IP6ADDR };
    let key = ids
        .iter()
        .map(|id| match *id {
            a if a == address && interval => Ok(KeyType::Cidr),
            a if a == address => Ok(KeyType::Address),
            TYPE_INET_PROTOCOL => Ok(KeyType::Protocol),
            TYPE_INET_SERVICE => Ok(KeyType::Port),
            TYPE_MARK | TYPE_INTEGER => Ok(KeyType::Integer),
            other => Err(format!("key type {other} is not one kpx writes")),
        })
        .collect::<Result<Vec<_>>>()?;
    let data = match shape.data_type {
        None => None,
        Some(NFT_DATA_VERDICT) => Some(DataType::Verdict),
        Some(_) => Some(DataType::Endpoint),
    };
    Ok(SetDecl {
        name: s.name.clone(),
        key,
        data,
        interval,
        timeout_seconds: shape.timeout_ms.map(|ms| (ms / 1000) as u32),
        comment: None,
    })
}
