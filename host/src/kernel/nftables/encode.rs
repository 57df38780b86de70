//! Typed objects to nf_tables netlink messages: the one place kpx writes
//! nftables. Expressions follow the bytecode `nft` itself generates for
//! the same rule (checked with `nft --debug=netlink`), so `nft list
//! ruleset` shows kpx's table as nft would have written it, and decode.rs
//! reads it back exactly.

use std::net::IpAddr;

use kpx_rules::model::{Cidr, IpFamily};
use kpx_rules::ops::nftables::{
    AddressField, BaseChain, Data, DataType, Element, KeyExpr, KeyType, Match, Rule, SetDecl, Statement, TABLE, Value,
    Verdict, VerdictKind, protocol_number,
};
use kpx_rules::ops::{CtStates, sanitize_comment};

use super::sys::*;
use super::typeof_udata::Typeof;
use crate::kernel::netlink::nfnl::Message;
use crate::kernel::netlink::nla::Writer;
use crate::kernel::netlink::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL};
use crate::syntax::nftables::{MAX_COMMENT, REJECT_CHAIN};

/// Largest element list in one message: a nested attribute's length is 16 bits.
const MAX_ELEMENTS_BYTES: usize = 60_000;

pub fn nfproto(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    }
}

fn address_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn pad4(mut v: Vec<u8>) -> Vec<u8> {
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
    v
}

/// libnftnl's userdata: type, length, value.
fn udata(kind: u8, text: &str) -> Vec<u8> {
    let mut v = text.as_bytes().to_vec();
    v.push(0);
    let mut out = vec![kind, v.len() as u8];
    out.extend(v);
    out
}

fn message(msg_type: u16, flags: u16, what: String, attrs: Writer) -> Message {
    Message { msg_type, flags, attrs, what }
}

fn table_attr(w: &mut Writer, kind: u16) {
    w.str(kind, TABLE);
}

pub fn add_table() -> Message {
    add_table_in(TABLE, "rules for kube-proxy")
}

/// A table of the batch's family (kube-proxy's, or an extension's).
pub fn add_table_in(table: &str, comment: &str) -> Message {
    let mut w = Writer::new();
    w.str(NFTA_TABLE_NAME, table);
    w.u32_be(NFTA_TABLE_FLAGS, 0);
    w.bytes(NFTA_TABLE_USERDATA, &udata(NFTNL_UDATA_TABLE_COMMENT, comment));
    message(NFT_MSG_NEWTABLE, NLM_F_CREATE, format!("add table {table}"), w)
}

pub fn delete_table() -> Message {
    delete_table_in(TABLE)
}

pub fn delete_table_in(table: &str) -> Message {
    let mut w = Writer::new();
    w.str(NFTA_TABLE_NAME, table);
    message(NFT_MSG_DELTABLE, 0, format!("delete table {table}"), w)
}

pub fn add_chain(name: &str) -> Message {
    add_chain_in(TABLE, name)
}

pub fn add_chain_in(table: &str, name: &str) -> Message {
    let mut w = Writer::new();
    w.str(NFTA_CHAIN_TABLE, table);
    w.str(NFTA_CHAIN_NAME, name);
    message(NFT_MSG_NEWCHAIN, NLM_F_CREATE, format!("add chain {name}"), w)
}

pub fn add_base_chain(b: &BaseChain) -> Message {
    add_base_chain_in(TABLE, b)
}

pub fn add_base_chain_in(table: &str, b: &BaseChain) -> Message {
    let mut w = Writer::new();
    w.str(NFTA_CHAIN_TABLE, table);
    w.str(NFTA_CHAIN_NAME, b.name);
    w.str(NFTA_CHAIN_TYPE, b.kind.name());
    w.nested(NFTA_CHAIN_HOOK, |w| {
        w.u32_be(NFTA_HOOK_HOOKNUM, b.hook as u32).u32_be(NFTA_HOOK_PRIORITY, b.priority as u32);
    });
    w.u32_be(NFTA_CHAIN_POLICY, NF_ACCEPT as u32);
    message(NFT_MSG_NEWCHAIN, NLM_F_CREATE, format!("add base chain {}", b.name), w)
}

/// Deletes every rule of a chain.
pub fn flush_chain(name: &str) -> Message {
    flush_chain_in(TABLE, name)
}

pub fn flush_chain_in(table: &str, name: &str) -> Message {
    let mut w = Writer::new();
    w.str(NFTA_RULE_TABLE, table);
    w.str(NFTA_RULE_CHAIN, name);
    message(NFT_MSG_DELRULE, 0, format!("flush chain {name}"), w)
}

pub fn delete_chain(name: &str) -> Message {
    delete_chain_in(TABLE, name)
}

pub fn delete_chain_in(table: &str, name: &str) -> Message {
    let mut w = Writer::new();
    w.str(NFTA_CHAIN_TABLE, table);
    w.str(NFTA_CHAIN_NAME, name);
    message(NFT_MSG_DELCHAIN, 0, format!("delete chain {name}"), w)
}

/// A stateful object an extension's rules share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Object {
    /// Packets and bytes.
    Counter,
    /// `limit rate over PER_SECOND/second burst BURST packets`: true for
    /// packets beyond the bucket.
    LimitOver { per_second: u32, burst: u32 },
}

impl Object {
    pub fn kind(self) -> u32 {
        match self {
            Object::Counter => NFT_OBJECT_COUNTER,
            Object::LimitOver { .. } => NFT_OBJECT_LIMIT,
        }
    }
}

/// Adds a named object; an existing one of that name is kept as it is
/// (a counter keeps its count), so a name must say everything it holds.
pub fn add_object(table: &str, name: &str, object: Object) -> Message {
    let mut w = Writer::new();
    w.str(NFTA_OBJ_TABLE, table).str(NFTA_OBJ_NAME, name).u32_be(NFTA_OBJ_TYPE, object.kind());
    w.nested(NFTA_OBJ_DATA, |w| match object {
        Object::Counter => {
            w.u64_be(NFTA_COUNTER_BYTES, 0).u64_be(NFTA_COUNTER_PACKETS, 0);
        }
        Object::LimitOver { per_second, burst } => {
            w.u64_be(NFTA_LIMIT_RATE, u64::from(per_second))
                .u64_be(NFTA_LIMIT_UNIT, 1)
                .u32_be(NFTA_LIMIT_BURST, burst)
                .u32_be(NFTA_LIMIT_TYPE, NFT_LIMIT_PKTS)
                .u32_be(NFTA_LIMIT_FLAGS, NFT_LIMIT_F_INV);
        }
    });
    message(NFT_MSG_NEWOBJ, NLM_F_CREATE, format!("add object {name}"), w)
}

pub fn delete_object(table: &str, name: &str, kind: u32) -> Message {
    let mut w = Writer::new();
    w.str(NFTA_OBJ_TABLE, table).str(NFTA_OBJ_NAME, name).u32_be(NFTA_OBJ_TYPE, kind);
    message(NFT_MSG_DELOBJ, 0, format!("delete object {name}"), w)
}

/// nft's datatype id of a key field, and its length in bytes.
fn key_type(family: IpFamily, k: KeyType) -> (u32, usize) {
    let (addr, len) = match family {
        IpFamily::V4 => (TYPE_IPADDR, 4),
        IpFamily::V6 => (TYPE_IP6ADDR, 16),
    };
    match k {
        KeyType::Address | KeyType::Cidr => (addr, len),
        KeyType::Protocol => (TYPE_INET_PROTOCOL, 1),
        KeyType::Port => (TYPE_INET_SERVICE, 2),
        // A 32-bit number in host order: nft's `integer`, which only a
        // `typeof` (the set's user data) lets it read back.
        KeyType::Integer => (TYPE_INTEGER, 4),
    }
}

/// nft's concatenated type id: each field's id shifted in, 6 bits apiece.
fn concat_type(ids: impl IntoIterator<Item = u32>) -> u32 {
    ids.into_iter().fold(0, |acc, id| (acc << TYPE_BITS) | id)
}

/// `id` names the set within its batch (the kernel requires one); `size`
/// is its table's size and its most elements ([`super::sizing`]); `hint`
/// what fills its key, for nft's `typeof` ([`super::typeof_udata`]).
pub fn add_set(family: IpFamily, d: &SetDecl, id: u32, size: Option<u32>, hint: Option<&Typeof>) -> Message {
    let mut w = Writer::new();
    table_attr(&mut w, NFTA_SET_TABLE);
    w.str(NFTA_SET_NAME, &d.name);
    let mut flags = 0;
    if d.data.is_some() {
        flags |= NFT_SET_MAP;
    }
    if d.interval {
        flags |= NFT_SET_INTERVAL | NFT_SET_CONCAT;
    }
    if d.timeout_seconds.is_some() {
        flags |= NFT_SET_TIMEOUT | NFT_SET_EVAL;
    }
    w.u32_be(NFTA_SET_FLAGS, flags);
    let fields: Vec<(u32, usize)> = d.key.iter().map(|k| key_type(family, *k)).collect();
    w.u32_be(NFTA_SET_KEY_TYPE, concat_type(fields.iter().map(|f| f.0)));
    w.u32_be(NFTA_SET_KEY_LEN, fields.iter().map(|f| (f.1 + 3) & !3).sum::<usize>() as u32);
    match d.data {
        Some(DataType::Verdict) => {
            w.u32_be(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
            w.u32_be(NFTA_SET_DATA_LEN, 0);
        }
        Some(DataType::Endpoint) => {
            let (addr, len) = key_type(family, KeyType::Address);
            w.u32_be(NFTA_SET_DATA_TYPE, concat_type([addr, TYPE_INET_SERVICE]));
            w.u32_be(NFTA_SET_DATA_LEN, (len + 4) as u32);
        }
        None => {}
    }
    w.u32_be(NFTA_SET_ID, id);
    if let Some(t) = d.timeout_seconds {
        w.u64_be(NFTA_SET_TIMEOUT, u64::from(t) * 1000);
    }
    if d.interval || size.is_some() {
        w.nested(NFTA_SET_DESC, |w| {
            if let Some(size) = size {
                w.u32_be(NFTA_SET_DESC_SIZE, size);
            }
            if d.interval {
                w.nested(NFTA_SET_DESC_CONCAT, |w| {
                    for (_, len) in &fields {
                        w.nested(NFTA_LIST_ELEM, |w| {
                            w.u32_be(NFTA_SET_FIELD_LEN, *len as u32);
                        });
                    }
                });
            }
        });
    }
    let comment = d.comment.as_deref().map(|c| sanitize_comment(c, MAX_COMMENT));
    let userdata = super::typeof_udata::userdata(family, d, hint, comment.as_deref());
    if !userdata.is_empty() {
        w.bytes(NFTA_SET_USERDATA, &userdata);
    }
    let kind = if d.data.is_some() { "map" } else { "set" };
    message(NFT_MSG_NEWSET, NLM_F_CREATE, format!("add {kind} {}", d.name), w)
}

/// Deletes every element of a set.
pub fn flush_set(name: &str) -> Message {
    let mut w = Writer::new();
    table_attr(&mut w, NFTA_SET_ELEM_LIST_TABLE);
    w.str(NFTA_SET_ELEM_LIST_SET, name);
    message(NFT_MSG_DELSETELEM, 0, format!("flush set {name}"), w)
}

pub fn delete_set(name: &str) -> Message {
    let mut w = Writer::new();
    table_attr(&mut w, NFTA_SET_TABLE);
    w.str(NFTA_SET_NAME, name);
    message(NFT_MSG_DELSET, 0, format!("delete set {name}"), w)
}

/// A key field's bytes (padded to 4): the start, and for an interval
/// field, the end.
fn field_bytes(v: &Value) -> (Vec<u8>, Option<Vec<u8>>) {
    match v {
        Value::Address(ip) => (address_bytes(ip), None),
        Value::Cidr(c) => (address_bytes(&c.network()), Some(address_bytes(&c.last()))),
        Value::Protocol(p) => (pad4(vec![protocol_number(*p) as u8]), None),
        Value::Port(p) => (pad4(p.to_be_bytes().to_vec()), None),
        Value::Integer(n) => (n.to_ne_bytes().to_vec(), None),
    }
}

fn verdict_data(w: &mut Writer, kind: VerdictKind, chain: Option<&str>) {
    let (code, chain) = match kind {
        VerdictKind::Accept => (NF_ACCEPT, None),
        VerdictKind::Drop => (NF_DROP, None),
        VerdictKind::Return => (NFT_RETURN, None),
        VerdictKind::Jump => (NFT_JUMP, chain),
        VerdictKind::Goto => (NFT_GOTO, chain),
        VerdictKind::Reject => (NFT_GOTO, Some(REJECT_CHAIN)),
    };
    w.nested(NFTA_DATA_VERDICT, |w| {
        w.u32_be(NFTA_VERDICT_CODE, code as u32);
        if let Some(c) = chain {
            w.str(NFTA_VERDICT_CHAIN, c);
        }
    });
}

/// Element messages for one set, each under the 64 KiB attribute limit.
/// Messages adding (or deleting) elements, each under 64 KiB; elements are
/// encoded one at a time as they come.
pub fn elements<E: std::borrow::Borrow<Element>>(
    set: &str,
    interval: bool,
    elements: impl IntoIterator<Item = E>,
    add: bool,
) -> Vec<Message> {
    let mut out = Vec::new();
    let mut batch = Writer::new();
    let mut count = 0;
    let flush = |batch: &mut Writer, count: &mut usize, out: &mut Vec<Message>| {
        if *count == 0 {
            return;
        }
        let mut w = Writer::new();
        table_attr(&mut w, NFTA_SET_ELEM_LIST_TABLE);
        w.str(NFTA_SET_ELEM_LIST_SET, set);
        let list = std::mem::take(&mut batch.buf);
        w.nested(NFTA_SET_ELEM_LIST_ELEMENTS, |w| w.buf.extend_from_slice(&list));
        let (msg_type, flags, verb) = if add {
            (NFT_MSG_NEWSETELEM, NLM_F_CREATE | NLM_F_EXCL, "add")
        } else {
            (NFT_MSG_DELSETELEM, 0, "delete")
        };
        out.push(message(msg_type, flags, format!("{verb} {count} elements of {set}"), w));
        *count = 0;
    };
    for e in elements {
        let e: &Element = e.borrow();
        let mut key = Vec::new();
        let mut end = Vec::new();
        for v in &e.key {
            let (start, stop) = field_bytes(v);
            end.extend_from_slice(stop.as_ref().unwrap_or(&start));
            key.extend(start);
        }
        batch.nested(NFTA_LIST_ELEM, |w| {
            w.nested(NFTA_SET_ELEM_KEY, |w| {
                w.bytes(NFTA_DATA_VALUE, &key);
            });
            if interval {
                w.nested(NFTA_SET_ELEM_KEY_END, |w| {
                    w.bytes(NFTA_DATA_VALUE, &end);
                });
            }
            if add {
                match &e.data {
                    Some(Data::Verdict(kind, chain)) => {
                        w.nested(NFTA_SET_ELEM_DATA, |w| verdict_data(w, *kind, chain.as_deref()));
                    }
                    Some(Data::Endpoint(ip, port)) => {
                        let mut v = address_bytes(ip);
                        v.extend(pad4(port.to_be_bytes().to_vec()));
                        w.nested(NFTA_SET_ELEM_DATA, |w| {
                            w.bytes(NFTA_DATA_VALUE, &v);
                        });
                    }
                    None => {}
                }
            }
        });
        count += 1;
        if batch.buf.len() > MAX_ELEMENTS_BYTES {
            flush(&mut batch, &mut count, &mut out);
        }
    }
    flush(&mut batch, &mut count, &mut out);
    out
}

/// A prefix's netmask bytes.
fn prefix_mask(cidr: &Cidr) -> Vec<u8> {
    let prefix = u32::from(cidr.prefix_len);
    let mut mask = vec![0u8; if cidr.addr.is_ipv4() { 4 } else { 16 }];
    for (i, b) in mask.iter_mut().enumerate() {
        let bits = prefix.saturating_sub(8 * i as u32).min(8);
        *b = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
    }
    mask
}

/// A rule's expressions, written one after another.
struct Exprs {
    family: IpFamily,
    list: Writer,
}

impl Exprs {
    fn expr(&mut self, name: &str, f: impl FnOnce(&mut Writer)) {
        self.list.nested(NFTA_LIST_ELEM, |w| {
            w.str(NFTA_EXPR_NAME, name);
            w.nested(NFTA_EXPR_DATA, f);
        });
    }

    fn payload(&mut self, reg: u32, base: u32, offset: u32, len: u32) {
        self.expr("payload", |w| {
            w.u32_be(NFTA_PAYLOAD_DREG, reg)
                .u32_be(NFTA_PAYLOAD_BASE, base)
                .u32_be(NFTA_PAYLOAD_OFFSET, offset)
                .u32_be(NFTA_PAYLOAD_LEN, len);
        });
    }

    fn meta(&mut self, reg: u32, key: u32) {
        self.expr("meta", |w| {
            w.u32_be(NFTA_META_KEY, key).u32_be(NFTA_META_DREG, reg);
        });
    }

    fn cmp(&mut self, reg: u32, negate: bool, data: &[u8]) {
        self.expr("cmp", |w| {
            w.u32_be(NFTA_CMP_SREG, reg).u32_be(NFTA_CMP_OP, if negate { NFT_CMP_NEQ } else { NFT_CMP_EQ });
            w.nested(NFTA_CMP_DATA, |w| {
                w.bytes(NFTA_DATA_VALUE, data);
            });
        });
    }

    fn bitwise(&mut self, reg: u32, mask: &[u8], xor: &[u8]) {
        self.expr("bitwise", |w| {
            w.u32_be(NFTA_BITWISE_SREG, reg).u32_be(NFTA_BITWISE_DREG, reg).u32_be(NFTA_BITWISE_LEN, mask.len() as u32);
            w.nested(NFTA_BITWISE_MASK, |w| {
                w.bytes(NFTA_DATA_VALUE, mask);
            });
            w.nested(NFTA_BITWISE_XOR, |w| {
                w.bytes(NFTA_DATA_VALUE, xor);
            });
        });
    }

    fn address_offset(&self, field: AddressField) -> (u32, u32) {
        match (self.family, field) {
            (IpFamily::V4, AddressField::Source) => (12, 4),
            (IpFamily::V4, AddressField::Destination) => (16, 4),
            (IpFamily::V6, AddressField::Source) => (8, 16),
            (IpFamily::V6, AddressField::Destination) => (24, 16),
        }
    }

    fn address(&mut self, reg: u32, field: AddressField) {
        let (offset, len) = self.address_offset(field);
        self.payload(reg, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
    }

    /// `saddr|daddr [!=] CIDR`, as nft writes it: whole bytes of the
    /// prefix compared, a mask for the rest.
    fn address_match(&mut self, field: AddressField, negate: bool, cidr: &Cidr) {
        let (offset, len) = self.address_offset(field);
        let bytes = address_bytes(&cidr.network());
        let prefix = u32::from(cidr.prefix_len);
        let reg = NFT_REG32_00;
        if prefix % 8 == 0 && prefix > 0 {
            let n = prefix / 8;
            self.payload(reg, NFT_PAYLOAD_NETWORK_HEADER, offset, n);
            self.cmp(reg, negate, &bytes[..n as usize]);
        } else {
            self.payload(reg, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
            let mask = prefix_mask(cidr);
            self.bitwise(reg, &mask, &vec![0u8; len as usize]);
            self.cmp(reg, negate, &bytes);
        }
    }

    /// Loads a lookup key into consecutive 32-bit registers from 8; the
    /// number of registers used.
    fn key(&mut self, keys: &[KeyExpr]) -> u32 {
        let mut reg = NFT_REG32_00;
        let addr_regs = if self.family == IpFamily::V4 { 1 } else { 4 };
        for k in keys {
            match *k {
                KeyExpr::Address(f) => {
                    self.address(reg, f);
                    reg += addr_regs;
                }
                KeyExpr::Protocol => {
                    self.meta(reg, NFT_META_L4PROTO);
                    reg += 1;
                }
                KeyExpr::DestinationPort => {
                    self.payload(reg, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
                    reg += 1;
                }
                KeyExpr::NumgenRandom(m) | KeyExpr::NumgenIncrement(m) => {
                    let kind = if matches!(k, KeyExpr::NumgenRandom(_)) { NFT_NG_RANDOM } else { NFT_NG_INCREMENTAL };
                    self.expr("numgen", |w| {
                        w.u32_be(NFTA_NG_DREG, reg)
                            .u32_be(NFTA_NG_MODULUS, m)
                            .u32_be(NFTA_NG_TYPE, kind)
                            .u32_be(NFTA_NG_OFFSET, 0);
                    });
                    reg += 1;
                }
                KeyExpr::Jhash { field, modulus, seed } => {
                    // The hashed address is loaded where the hash goes: the
                    // registers from here on hold nothing yet (fields are
                    // loaded in order), and the hash leaves one word.
                    let scratch = reg;
                    self.address(scratch, field);
                    let len = self.address_offset(field).1;
                    self.expr("hash", |w| {
                        w.u32_be(NFTA_HASH_SREG, scratch)
                            .u32_be(NFTA_HASH_DREG, reg)
                            .u32_be(NFTA_HASH_LEN, len)
                            .u32_be(NFTA_HASH_MODULUS, modulus)
                            .u32_be(NFTA_HASH_SEED, seed)
                            .u32_be(NFTA_HASH_OFFSET, 0)
                            .u32_be(NFTA_HASH_TYPE, NFT_HASH_JENKINS);
                    });
                    reg += 1;
                }
            }
        }
        reg - NFT_REG32_00
    }

    fn lookup(&mut self, set: &str, dreg: Option<u32>, negate: bool) {
        self.expr("lookup", |w| {
            w.str(NFTA_LOOKUP_SET, set).u32_be(NFTA_LOOKUP_SREG, NFT_REG32_00);
            if let Some(d) = dreg {
                w.u32_be(NFTA_LOOKUP_DREG, d);
            }
            if negate {
                w.u32_be(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
            }
        });
    }

    fn verdict(&mut self, code: i32, chain: Option<&str>) {
        self.expr("immediate", |w| {
            w.u32_be(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
            w.nested(NFTA_IMMEDIATE_DATA, |w| {
                w.nested(NFTA_DATA_VERDICT, |w| {
                    w.u32_be(NFTA_VERDICT_CODE, code as u32);
                    if let Some(c) = chain {
                        w.str(NFTA_VERDICT_CHAIN, c);
                    }
                });
            });
        });
    }

    fn mark_set(&mut self, mask: u32, xor: u32) {
        let reg = NFT_REG32_00;
        self.meta(reg, NFT_META_MARK);
        self.bitwise(reg, &mask.to_ne_bytes(), &xor.to_ne_bytes());
        self.expr("meta", |w| {
            w.u32_be(NFTA_META_KEY, NFT_META_MARK).u32_be(NFTA_META_SREG, reg);
        });
    }

    fn dnat(&mut self, addr_reg: u32, proto_reg: u32, flags: Option<u32>) {
        let family = nfproto(self.family);
        self.expr("nat", |w| {
            w.u32_be(NFTA_NAT_TYPE, NFT_NAT_DNAT)
                .u32_be(NFTA_NAT_FAMILY, u32::from(family))
                .u32_be(NFTA_NAT_REG_ADDR_MIN, addr_reg)
                .u32_be(NFTA_NAT_REG_PROTO_MIN, proto_reg);
            if let Some(f) = flags {
                w.u32_be(NFTA_NAT_FLAGS, f);
            }
        });
    }
}

fn ct_bits(states: CtStates) -> Result<u32, String> {
    let mut bits = 0;
    for (flag, bit) in [
        (CtStates::INVALID, NF_CT_STATE_INVALID),
        (CtStates::ESTABLISHED, NF_CT_STATE_ESTABLISHED),
        (CtStates::RELATED, NF_CT_STATE_RELATED),
        (CtStates::NEW, NF_CT_STATE_NEW),
        (CtStates::UNTRACKED, NF_CT_STATE_UNTRACKED),
    ] {
        if states.contains(flag) {
            bits |= bit;
        }
    }
    if states.intersects(CtStates::SNAT | CtStates::DNAT) {
        return Err("ct state has no snat or dnat in nftables (they are ct status)".into());
    }
    Ok(bits)
}

/// A rule's NEWRULE message (appended to its chain); `masquerade_mark`
/// is the bit the masquerade-mark statement sets.
pub fn add_rule(family: IpFamily, masquerade_mark: u32, rule: &Rule) -> Result<Message, String> {
    let mut e = Exprs { family, list: Writer::new() };
    let reg = NFT_REG32_00;
    for m in &rule.matches {
        match m {
            Match::Address { field, negate, cidr } => e.address_match(*field, *negate, cidr),
            Match::Protocol { negate, protocol } => {
                e.meta(reg, NFT_META_L4PROTO);
                e.cmp(reg, *negate, &[protocol_number(*protocol) as u8]);
            }
            Match::DestinationPort { negate, port } => {
                e.payload(reg, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
                e.cmp(reg, *negate, &port.to_be_bytes());
            }
            Match::InInterface { negate, name, prefix } => {
                e.meta(reg, NFT_META_IIFNAME);
                let mut bytes = name.as_bytes().to_vec();
                if !prefix {
                    bytes.resize(16, 0);
                }
                e.cmp(reg, *negate, &bytes);
            }
            Match::FibLocal { field, negate } => {
                let flag = match field {
                    AddressField::Source => NFTA_FIB_F_SADDR,
                    AddressField::Destination => NFTA_FIB_F_DADDR,
                };
                e.expr("fib", |w| {
                    w.u32_be(NFTA_FIB_DREG, reg)
                        .u32_be(NFTA_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE)
                        .u32_be(NFTA_FIB_FLAGS, flag);
                });
                e.cmp(reg, *negate, &RTN_LOCAL.to_ne_bytes());
            }
            Match::CtState { negate, states } => {
                let bits = ct_bits(*states)?;
                e.expr("ct", |w| {
                    w.u32_be(NFTA_CT_KEY, NFT_CT_STATE).u32_be(NFTA_CT_DREG, reg);
                });
                e.bitwise(reg, &bits.to_ne_bytes(), &0u32.to_ne_bytes());
                // In any of the states: the masked bits are not all zero.
                e.cmp(reg, !*negate, &0u32.to_ne_bytes());
            }
            Match::CtDnat { negate } => {
                e.expr("ct", |w| {
                    w.u32_be(NFTA_CT_KEY, NFT_CT_STATUS).u32_be(NFTA_CT_DREG, reg);
                });
                e.bitwise(reg, &IPS_DST_NAT.to_ne_bytes(), &0u32.to_ne_bytes());
                e.cmp(reg, !*negate, &0u32.to_ne_bytes());
            }
            Match::Mark { negate, value, mask } => {
                e.meta(reg, NFT_META_MARK);
                if *mask != u32::MAX {
                    e.bitwise(reg, &mask.to_ne_bytes(), &0u32.to_ne_bytes());
                }
                e.cmp(reg, *negate, &value.to_ne_bytes());
            }
            Match::Lookup { keys, set, negate } => {
                e.key(keys);
                e.lookup(set.name(), None, *negate);
            }
        }
    }
    for s in &rule.statements {
        match s {
            Statement::Counter => e.expr("counter", |w| {
                w.u64_be(NFTA_COUNTER_BYTES, 0).u64_be(NFTA_COUNTER_PACKETS, 0);
            }),
            Statement::MasqueradeMark => e.mark_set(!masquerade_mark, masquerade_mark),
            Statement::AffinityUpdate(set) => {
                e.address(reg, AddressField::Source);
                e.expr("dynset", |w| {
                    w.str(NFTA_DYNSET_SET_NAME, set)
                        .u32_be(NFTA_DYNSET_OP, NFT_DYNSET_OP_UPDATE)
                        .u32_be(NFTA_DYNSET_SREG_KEY, reg);
                });
            }
            Statement::MarkXor(v) => e.mark_set(u32::MAX, *v),
            Statement::NamedCounter(name) => e.expr("objref", |w| {
                w.u32_be(NFTA_OBJREF_IMM_TYPE, NFT_OBJECT_COUNTER).str(NFTA_OBJREF_IMM_NAME, name);
            }),
            Statement::Masquerade { fully_random } => {
                let flags = if *fully_random { NF_NAT_RANGE_PROTO_RANDOM_FULLY } else { 0 };
                e.expr("masq", |w| {
                    if flags != 0 {
                        w.u32_be(NFTA_MASQ_FLAGS, flags);
                    }
                });
            }
        }
    }
    match &rule.verdict {
        Verdict::Continue => {}
        Verdict::Accept => e.verdict(NF_ACCEPT, None),
        Verdict::Drop => e.verdict(NF_DROP, None),
        Verdict::Return => e.verdict(NFT_RETURN, None),
        Verdict::Jump(c) => e.verdict(NFT_JUMP, Some(c)),
        Verdict::Goto(c) => e.verdict(NFT_GOTO, Some(c)),
        Verdict::Reject => {
            let code = if family == IpFamily::V4 { ICMP_PORT_UNREACH } else { ICMPV6_PORT_UNREACH };
            e.expr("reject", |w| {
                w.u32_be(NFTA_REJECT_TYPE, NFT_REJECT_ICMP_UNREACH).bytes(NFTA_REJECT_ICMP_CODE, &[code]);
            });
        }
        Verdict::Dnat(ip, port) => {
            let addr = address_bytes(ip);
            let port_reg = reg + (addr.len() as u32) / 4;
            e.expr("immediate", |w| {
                w.u32_be(NFTA_IMMEDIATE_DREG, reg);
                w.nested(NFTA_IMMEDIATE_DATA, |w| {
                    w.bytes(NFTA_DATA_VALUE, &addr);
                });
            });
            e.expr("immediate", |w| {
                w.u32_be(NFTA_IMMEDIATE_DREG, port_reg);
                w.nested(NFTA_IMMEDIATE_DATA, |w| {
                    w.bytes(NFTA_DATA_VALUE, &port.to_be_bytes());
                });
            });
            e.dnat(reg, port_reg, Some(NF_NAT_RANGE_PROTO_SPECIFIED));
        }
        Verdict::DnatMap { keys, map } => {
            e.key(keys);
            e.lookup(map.name(), Some(reg), false);
            let addr_regs = if family == IpFamily::V4 { 1 } else { 4 };
            e.dnat(reg, reg + addr_regs, None);
        }
        Verdict::Vmap { keys, map } => {
            e.key(keys);
            e.lookup(map.name(), Some(NFT_REG_VERDICT), false);
        }
    }
    let mut w = Writer::new();
    table_attr(&mut w, NFTA_RULE_TABLE);
    w.str(NFTA_RULE_CHAIN, &rule.chain);
    let list = e.list.buf;
    w.nested(NFTA_RULE_EXPRESSIONS, |w| w.buf.extend_from_slice(&list));
    if let Some(c) = &rule.comment {
        w.bytes(NFTA_RULE_USERDATA, &udata(NFTNL_UDATA_RULE_COMMENT, &sanitize_comment(c, MAX_COMMENT)));
    }
    Ok(message(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, format!("add rule to chain {}", rule.chain), w))
}

/// A condition of a rule the host writes in an extension's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// `ct state new`
    New,
    /// `ct status dnat`
    Dnat,
    /// `ip daddr [!=] CIDR` (ip6 in IPv6 tables)
    Destination { negate: bool, cidr: Cidr },
    /// `ip saddr [!=] CIDR`
    Source { negate: bool, cidr: Cidr },
    /// `fib daddr type local`
    LocalDestination,
    /// `meta l4proto P`
    Protocol(kpx_rules::model::Protocol),
    /// `th dport N`
    Port(u16),
    /// `ct original ip daddr CIDR`
    OriginalDestination(Cidr),
    /// `ct original proto-dst N`
    OriginalPort(u16),
    /// `iifname != "lo"`
    NotFromLoopback,
}

/// What a rule in an extension's table ends with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableVerdict {
    Continue,
    Drop,
    /// ICMP port unreachable (ICMPv6 in an ip6 table).
    Reject,
    /// A TCP reset: for rules whose packets are TCP.
    RejectTcpReset,
    Return,
    Jump(String),
    Goto(String),
}

/// A host-written rule of an extension's table: conditions, then the
/// named objects it uses (a limit object ends the rule's match for
/// packets within the bucket), then its verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRule {
    pub chain: String,
    pub conditions: Vec<Condition>,
    /// (object type, name), in order.
    pub objects: Vec<(u32, String)>,
    pub verdict: TableVerdict,
    pub comment: Option<String>,
}

/// A [`TableRule`]'s NEWRULE message in `table`.
pub fn add_table_rule(table: &str, family: IpFamily, rule: &TableRule) -> Message {
    let mut e = Exprs { family, list: Writer::new() };
    let reg = NFT_REG32_00;
    for c in &rule.conditions {
        match c {
            Condition::New => {
                e.expr("ct", |w| {
                    w.u32_be(NFTA_CT_KEY, NFT_CT_STATE).u32_be(NFTA_CT_DREG, reg);
                });
                e.bitwise(reg, &NF_CT_STATE_NEW.to_ne_bytes(), &0u32.to_ne_bytes());
                e.cmp(reg, true, &0u32.to_ne_bytes());
            }
            Condition::Dnat => {
                e.expr("ct", |w| {
                    w.u32_be(NFTA_CT_KEY, NFT_CT_STATUS).u32_be(NFTA_CT_DREG, reg);
                });
                e.bitwise(reg, &IPS_DST_NAT.to_ne_bytes(), &0u32.to_ne_bytes());
                e.cmp(reg, true, &0u32.to_ne_bytes());
            }
            Condition::Destination { negate, cidr } => e.address_match(AddressField::Destination, *negate, cidr),
            Condition::Source { negate, cidr } => e.address_match(AddressField::Source, *negate, cidr),
            Condition::LocalDestination => {
                e.expr("fib", |w| {
                    w.u32_be(NFTA_FIB_DREG, reg)
                        .u32_be(NFTA_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE)
                        .u32_be(NFTA_FIB_FLAGS, NFTA_FIB_F_DADDR);
                });
                e.cmp(reg, false, &RTN_LOCAL.to_ne_bytes());
            }
            Condition::Protocol(p) => {
                e.meta(reg, NFT_META_L4PROTO);
                e.cmp(reg, false, &[protocol_number(*p) as u8]);
            }
            Condition::Port(port) => {
                e.payload(reg, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
                e.cmp(reg, false, &port.to_be_bytes());
            }
            Condition::OriginalDestination(cidr) => {
                let key = if cidr.addr.is_ipv4() { NFT_CT_DST_IP } else { NFT_CT_DST_IP6 };
                e.expr("ct", |w| {
                    w.u32_be(NFTA_CT_KEY, key)
                        .u32_be(NFTA_CT_DREG, reg)
                        .bytes(NFTA_CT_DIRECTION, &[IP_CT_DIR_ORIGINAL]);
                });
                if !cidr.is_host() {
                    let mask = prefix_mask(cidr);
                    e.bitwise(reg, &mask, &vec![0u8; mask.len()]);
                }
                e.cmp(reg, false, &address_bytes(&cidr.network()));
            }
            Condition::NotFromLoopback => {
                e.meta(reg, NFT_META_IIFNAME);
                let mut lo = b"lo".to_vec();
                lo.resize(16, 0);
                e.cmp(reg, true, &lo);
            }
            Condition::OriginalPort(port) => {
                e.expr("ct", |w| {
                    w.u32_be(NFTA_CT_KEY, NFT_CT_PROTO_DST)
                        .u32_be(NFTA_CT_DREG, reg)
                        .bytes(NFTA_CT_DIRECTION, &[IP_CT_DIR_ORIGINAL]);
                });
                e.cmp(reg, false, &port.to_be_bytes());
            }
        }
    }
    for (kind, name) in &rule.objects {
        e.expr("objref", |w| {
            w.u32_be(NFTA_OBJREF_IMM_TYPE, *kind).str(NFTA_OBJREF_IMM_NAME, name);
        });
    }
    match &rule.verdict {
        TableVerdict::Continue => {}
        TableVerdict::Drop => e.verdict(NF_DROP, None),
        TableVerdict::Jump(c) => e.verdict(NFT_JUMP, Some(c)),
        TableVerdict::Goto(c) => e.verdict(NFT_GOTO, Some(c)),
        TableVerdict::Return => e.verdict(NFT_RETURN, None),
        TableVerdict::Reject => {
            let code = if family == IpFamily::V4 { ICMP_PORT_UNREACH } else { ICMPV6_PORT_UNREACH };
            e.expr("reject", |w| {
                w.u32_be(NFTA_REJECT_TYPE, NFT_REJECT_ICMP_UNREACH).bytes(NFTA_REJECT_ICMP_CODE, &[code]);
            });
        }
        // `reject with tcp reset`: the rule's packets are TCP (a
        // non-TCP packet gets no answer and is dropped).
        TableVerdict::RejectTcpReset => e.expr("reject", |w| {
            w.u32_be(NFTA_REJECT_TYPE, NFT_REJECT_TCP_RST);
        }),
    }
    let mut w = Writer::new();
    w.str(NFTA_RULE_TABLE, table);
    w.str(NFTA_RULE_CHAIN, &rule.chain);
    let list = e.list.buf;
    w.nested(NFTA_RULE_EXPRESSIONS, |w| w.buf.extend_from_slice(&list));
    if let Some(c) = &rule.comment {
        w.bytes(NFTA_RULE_USERDATA, &udata(NFTNL_UDATA_RULE_COMMENT, &sanitize_comment(c, MAX_COMMENT)));
    }
    message(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, format!("add rule to chain {}", rule.chain), w)
}
