//! A set's `typeof` user data, as nft itself writes it (libnftnl's udata
//! TLVs; nftables' `set_make_key` reads it back), so that `nft list
//! ruleset > saved; nft -f saved` loads kpx's table, with nft 1.0.6 and
//! later. A key field kpx fills with a number (`numgen`, `jhash`) has no
//! datatype nft can name: declared as `type … . mark` (what kpx wrote
//! before), the listing's rules no longer type-check (`map expects …
//! packet mark, mapping expression has type … integer`); declared as
//! nft's `integer`, it cannot be read back without `typeof`. So a set or
//! map whose key holds such a field carries the expressions that fill it,
//! read from the rule that looks it up; the others keep plain `type`
//! declarations, as upstream's table has them.
//!
//! Formats (nftables 1.0.6 `src/expression.c`, `payload.c`, `meta.c`,
//! `numgen.c`; checked byte for byte against what nft 1.0.6 writes):
//! each record is `type: u8, len: u8, value`, u32 values in host order, a
//! nest is a record of records. Never a `jhash` typeof: nft 1.0.6 stores it
//! and then crashes listing it (its udata has no hashed input); a
//! `numgen random` of the same modulus stands in (nft checks only that
//! both are 32-bit integers).

use std::collections::HashMap;

use kpx_rules::model::{IpFamily, Protocol};
use kpx_rules::ops::nftables::{AddressField, DataType, KeyExpr, KeyType, Match, Op, SetDecl, SetRef, Verdict};

use crate::syntax::nftables::MAX_TYPEOF_FIELDS;

/// The kernel's limit on a set's user data (`NFT_USERDATA_MAXLEN`).
pub const MAX_USERDATA: usize = 256;

// libnftnl's set udata types.
const KEYBYTEORDER: u8 = 0;
const DATABYTEORDER: u8 = 1;
const KEY_TYPEOF: u8 = 3;
const DATA_TYPEOF: u8 = 4;
const DATA_INTERVAL: u8 = 6;
const COMMENT: u8 = 7;
// A typeof record's two parts, and a concatenation's.
const TYPEOF_EXPR: u8 = 0;
const TYPEOF_DATA: u8 = 1;
const CONCAT_SUB_TYPE: u8 = 0;
const CONCAT_SUB_DATA: u8 = 1;
// nft's `enum expr_types` (the same from 0.9.4 to today for these).
const EXPR_VERDICT: u32 = 1;
const EXPR_PAYLOAD: u32 = 7;
const EXPR_META: u32 = 9;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;
// Payload records and `enum proto_desc_id`.
const PAYLOAD_DESC: u8 = 0;
const PAYLOAD_TYPE: u8 = 1;
const DESC_UDP: u32 = 6;
const DESC_TCP: u32 = 8;
const DESC_SCTP: u32 = 10;
const DESC_TH: u32 = 11;
const DESC_IP: u32 = 12;
const DESC_IP6: u32 = 13;
// The header fields' template indices.
const IP_SADDR: u32 = 11;
const IP_DADDR: u32 = 12;
const IP6_SADDR: u32 = 8;
const IP6_DADDR: u32 = 9;
const DPORT: u32 = 2;
const META_KEY: u8 = 0;
const META_L4PROTO: u32 = 16;
const NG_TYPE: u8 = 0;
const NG_MODULUS: u8 = 1;
const NG_OFFSET: u8 = 2;
const NG_INCREMENTAL: u32 = 0;
const NG_RANDOM: u32 = 1;
// nft's `enum byteorder`.
const BYTEORDER_INVALID: u32 = 0;
const BYTEORDER_HOST: u32 = 1;

/// What fills a set's key (the expressions a rule looks it up with) and,
/// for an endpoint map, the protocol whose port its data holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Typeof {
    pub keys: Vec<KeyExpr>,
    pub protocol: Option<Protocol>,
}

/// The first lookup of each own set in `ops`, with the protocol the rule
/// matches: what nft's `typeof` would say of it.
pub fn hints(ops: &[Op]) -> HashMap<String, Typeof> {
    let mut out: HashMap<String, Typeof> = HashMap::new();
    for op in ops {
        let Op::AddRule(r) = op else { continue };
        let protocol = r.matches.iter().find_map(|m| match m {
            Match::Protocol { negate: false, protocol } => Some(*protocol),
            _ => None,
        });
        let mut note = |keys: &[KeyExpr], set: &SetRef| {
            if let SetRef::Own(name) = set {
                out.entry(name.clone()).or_insert_with(|| Typeof { keys: keys.to_vec(), protocol });
            }
        };
        for m in &r.matches {
            if let Match::Lookup { keys, set, .. } = m {
                note(keys, set);
            }
        }
        if let Verdict::Vmap { keys, map } | Verdict::DnatMap { keys, map } = &r.verdict {
            note(keys, map);
        }
    }
    out
}

/// A record: type, length, value.
fn record(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

fn u32_record(out: &mut Vec<u8>, kind: u8, v: u32) {
    record(out, kind, &v.to_ne_bytes());
}

/// A payload field: header and field.
fn payload(desc: u32, field: u32) -> (u32, Vec<u8>) {
    let mut d = Vec::new();
    u32_record(&mut d, PAYLOAD_DESC, desc);
    u32_record(&mut d, PAYLOAD_TYPE, field);
    (EXPR_PAYLOAD, d)
}

fn numgen(kind: u32, modulus: u32) -> (u32, Vec<u8>) {
    let mut d = Vec::new();
    u32_record(&mut d, NG_TYPE, kind);
    u32_record(&mut d, NG_MODULUS, modulus);
    u32_record(&mut d, NG_OFFSET, 0);
    (EXPR_NUMGEN, d)
}

fn address(family: IpFamily, field: AddressField) -> (u32, Vec<u8>) {
    match (family, field) {
        (IpFamily::V4, AddressField::Source) => payload(DESC_IP, IP_SADDR),
        (IpFamily::V4, AddressField::Destination) => payload(DESC_IP, IP_DADDR),
        (IpFamily::V6, AddressField::Source) => payload(DESC_IP6, IP6_SADDR),
        (IpFamily::V6, AddressField::Destination) => payload(DESC_IP6, IP6_DADDR),
    }
}

/// The expression a key field is filled with: the rule's, else what a
/// field of its type is in kpx's own tables.
fn field(family: IpFamily, declared: KeyType, hint: Option<&KeyExpr>) -> (u32, Vec<u8>) {
    match (hint.filter(|h| h.key_type() == declared || declared == KeyType::Cidr), declared) {
        (Some(KeyExpr::Address(f)), _) => address(family, *f),
        (Some(KeyExpr::NumgenRandom(m)), _) => numgen(NG_RANDOM, *m),
        (Some(KeyExpr::NumgenIncrement(m)), _) => numgen(NG_INCREMENTAL, *m),
        (Some(KeyExpr::Jhash { modulus, .. }), _) => numgen(NG_RANDOM, *modulus),
        (_, KeyType::Address) => address(family, AddressField::Destination),
        (_, KeyType::Cidr) => address(family, AddressField::Source),
        (_, KeyType::Protocol) => {
            let mut d = Vec::new();
            u32_record(&mut d, META_KEY, META_L4PROTO);
            (EXPR_META, d)
        }
        (_, KeyType::Port) => payload(DESC_TH, DPORT),
        (_, KeyType::Integer) => numgen(NG_RANDOM, 1),
    }
}

/// A typeof record's value: one expression, or their concatenation.
fn expression(parts: Vec<(u32, Vec<u8>)>) -> Vec<u8> {
    let mut out = Vec::new();
    if let [(kind, data)] = parts.as_slice() {
        u32_record(&mut out, TYPEOF_EXPR, *kind);
        record(&mut out, TYPEOF_DATA, data);
        return out;
    }
    let mut nests = Vec::new();
    for (i, (kind, data)) in parts.iter().enumerate() {
        let mut nest = Vec::new();
        u32_record(&mut nest, CONCAT_SUB_TYPE, *kind);
        record(&mut nest, CONCAT_SUB_DATA, data);
        record(&mut nests, i as u8, &nest);
    }
    u32_record(&mut out, TYPEOF_EXPR, EXPR_CONCAT);
    record(&mut out, TYPEOF_DATA, &nests);
    out
}

/// Whether a set needs `typeof`: a key field filled with a number.
pub fn needed(d: &SetDecl) -> bool {
    d.key.contains(&KeyType::Integer) && d.key.len() <= MAX_TYPEOF_FIELDS
}

/// The set's user data: `typeof` where [`needed`], and its comment
/// (shortened to keep the whole within [`MAX_USERDATA`]).
pub fn userdata(family: IpFamily, d: &SetDecl, hint: Option<&Typeof>, comment: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    if needed(d) {
        let order = if d.key.len() == 1 { BYTEORDER_HOST } else { BYTEORDER_INVALID };
        u32_record(&mut out, KEYBYTEORDER, order);
        if d.data.is_some() {
            u32_record(&mut out, DATABYTEORDER, BYTEORDER_INVALID);
        }
        let hinted = hint.filter(|h| h.keys.len() == d.key.len());
        let parts: Vec<(u32, Vec<u8>)> =
            d.key.iter().enumerate().map(|(i, t)| field(family, *t, hinted.map(|h| &h.keys[i]))).collect();
        record(&mut out, KEY_TYPEOF, &expression(parts));
        match d.data {
            Some(DataType::Verdict) => record(&mut out, DATA_TYPEOF, &expression(vec![(EXPR_VERDICT, Vec::new())])),
            Some(DataType::Endpoint) => {
                // The port of the protocol the rule DNATs (nft adds that
                // protocol's match; `th dport` would conflict with it).
                let port = match hint.and_then(|h| h.protocol) {
                    Some(Protocol::Tcp) => payload(DESC_TCP, DPORT),
                    Some(Protocol::Udp) => payload(DESC_UDP, DPORT),
                    Some(Protocol::Sctp) => payload(DESC_SCTP, DPORT),
                    None => payload(DESC_TH, DPORT),
                };
                record(&mut out, DATA_TYPEOF, &expression(vec![address(family, AddressField::Destination), port]));
            }
            None => {}
        }
        if d.data.is_some() {
            u32_record(&mut out, DATA_INTERVAL, 0);
        }
    } else if d.key == [KeyType::Integer] {
        // (Unreachable while MAX_TYPEOF_FIELDS >= 1; kept with needed().)
        u32_record(&mut out, KEYBYTEORDER, BYTEORDER_HOST);
    }
    if let Some(c) = comment {
        // A record holds the comment and its NUL.
        let room = MAX_USERDATA.saturating_sub(out.len() + 3).min(255);
        let mut text = c.as_bytes().to_vec();
        if text.len() > room {
            text.truncate(room);
            while std::str::from_utf8(&text).is_err() {
                text.pop();
            }
        }
        text.push(0);
        record(&mut out, COMMENT, &text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        s.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()).collect()
    }

    fn decl(key: Vec<KeyType>, data: Option<DataType>) -> SetDecl {
        SetDecl { name: "m".into(), key, data, interval: false, timeout_seconds: None, comment: None }
    }

    /// The bytes nft 1.0.6 writes for
    /// `typeof ip daddr . meta l4proto . th dport . numgen random mod 3 : ip daddr . tcp dport`
    /// (dumped from the kernel after `nft -f`), which kpx's count maps are.
    #[test]
    fn a_count_map_as_nft_writes_it() {
        let want = hex(
            "00 04 00 00 00 00 01 04 00 00 00 00 03 60 00 04 0d 00 00 00 01 58 00 14 00 04 07 00 00 00 01 0c 00 04 0c 00 00 00 01 04 0c 00 00 00 01 0e 00 04 09 00 00 00 01 06 00 04 10 00 00 00 02 14 00 04 07 00 00 00 01 0c 00 04 0b 00 00 00 01 04 02 00 00 00 03 1a 00 04 17 00 00 00 01 12 00 04 01 00 00 00 01 04 03 00 00 00 02 04 00 00 00 00 04 34 00 04 0d 00 00 00 01 2c 00 14 00 04 07 00 00 00 01 0c 00 04 0c 00 00 00 01 04 0c 00 00 00 01 14 00 04 07 00 00 00 01 0c 00 04 08 00 00 00 01 04 02 00 00 00 06 04 00 00 00 00",
        );
        let d =
            decl(vec![KeyType::Address, KeyType::Protocol, KeyType::Port, KeyType::Integer], Some(DataType::Endpoint));
        let mut keys = KeyExpr::DESTINATION.to_vec();
        keys.push(KeyExpr::NumgenRandom(3));
        let hint = Typeof { keys, protocol: Some(Protocol::Tcp) };
        assert_eq!(userdata(IpFamily::V4, &d, Some(&hint), None), want);
        assert_eq!(want.len(), 170);
    }

    /// `typeof numgen random mod 3 : verdict` and `typeof numgen inc mod 2`,
    /// as nft 1.0.6 writes them; a jhash field is written as numgen.
    #[test]
    fn slot_maps_as_nft_writes_them() {
        let vmap = hex(
            "00 04 01 00 00 00 01 04 00 00 00 00 03 1a 00 04 17 00 00 00 01 12 00 04 01 00 00 00 01 04 03 00 00 00 02 04 00 00 00 00 04 08 00 04 01 00 00 00 01 00 06 04 00 00 00 00",
        );
        let d = decl(vec![KeyType::Integer], Some(DataType::Verdict));
        let hint = |k: KeyExpr| Typeof { keys: vec![k], protocol: None };
        assert_eq!(userdata(IpFamily::V4, &d, Some(&hint(KeyExpr::NumgenRandom(3))), None), vmap);
        let jhash = KeyExpr::Jhash { field: AddressField::Source, modulus: 3, seed: 5 };
        assert_eq!(userdata(IpFamily::V4, &d, Some(&hint(jhash)), None), vmap, "never a jhash typeof");
        let set = hex(
            "00 04 01 00 00 00 03 1a 00 04 17 00 00 00 01 12 00 04 00 00 00 00 01 04 02 00 00 00 02 04 00 00 00 00",
        );
        let d = decl(vec![KeyType::Integer], None);
        assert_eq!(userdata(IpFamily::V4, &d, Some(&hint(KeyExpr::NumgenIncrement(2))), None), set);
    }

    #[test]
    fn sets_without_numbers_keep_type_and_comments_fit() {
        let d = decl(vec![KeyType::Address, KeyType::Protocol, KeyType::Port], Some(DataType::Verdict));
        assert_eq!(userdata(IpFamily::V4, &d, None, Some("hi")), hex("07 03 68 69 00"));
        let d =
            decl(vec![KeyType::Address, KeyType::Protocol, KeyType::Port, KeyType::Integer], Some(DataType::Endpoint));
        let long = "x".repeat(200);
        let u = userdata(IpFamily::V6, &d, None, Some(&long));
        assert_eq!(u.len(), MAX_USERDATA, "the comment shortened to fit");
        assert!(u.ends_with(&[0]));
    }

    #[test]
    fn hints_come_from_the_rule_that_looks_the_set_up() {
        let mut keys = KeyExpr::NODE_PORT.to_vec();
        keys.push(KeyExpr::NumgenRandom(2));
        let rule = kpx_rules::ops::nftables::Rule::new("select")
            .with(Match::Protocol { negate: false, protocol: Protocol::Udp })
            .verdict(Verdict::DnatMap { keys: keys.clone(), map: SetRef::Own("np-udp-2".into()) });
        let h = hints(&[Op::AddRule(rule)]);
        assert_eq!(h["np-udp-2"], Typeof { keys, protocol: Some(Protocol::Udp) });
    }
}
