//! The limits of nf_tables' syntax and the names the host keeps for its
//! own objects: what the encoder writes (kernel::nftables) and what the
//! wall refuses (validate::nftables).

use kpx_rules::model::{IpFamily, Protocol};
use kpx_rules::ops::nftables::{BaseChain, ChainKind, HostSet, KeyExpr, NfHook};

/// nft's longest comment.
pub const MAX_COMMENT: usize = 128;
/// The host's chain behind every `reject` verdict in a map.
pub const REJECT_CHAIN: &str = "reject-chain";
/// The most fields nft reads back from a concatenated `typeof`
/// (`NFTNL_UDATA_SET_KEY_CONCAT_NEST_MAX`, in every release so far).
pub const MAX_TYPEOF_FIELDS: usize = 4;
/// The registers of 32 bits a lookup key may take: nf_tables has 16
/// (`NFT_REG32_00` to `NFT_REG32_15`).
pub const MAX_KEY_REGISTERS: u32 = 16;

/// Base chains: nft accepts `dstnat` / `srcnat` only on some hooks, so
/// priorities are numeric (dstnat = -100, filter = 0, srcnat = 100).
pub const BASE_CHAINS: [BaseChain; 8] = [
    base("filter-prerouting-pre-dnat", ChainKind::Filter, NfHook::Prerouting, -110),
    base("filter-output-pre-dnat", ChainKind::Filter, NfHook::Output, -110),
    base("filter-input", ChainKind::Filter, NfHook::Input, 0),
    base("filter-forward", ChainKind::Filter, NfHook::Forward, 0),
    base("filter-output", ChainKind::Filter, NfHook::Output, 0),
    base("nat-prerouting", ChainKind::Nat, NfHook::Prerouting, -100),
    base("nat-output", ChainKind::Nat, NfHook::Output, -100),
    base("nat-postrouting", ChainKind::Nat, NfHook::Postrouting, 100),
];

const fn base(name: &'static str, kind: ChainKind, hook: NfHook, priority: i32) -> BaseChain {
    BaseChain { name, kind, hook, priority }
}

/// The host's regular chains.
pub const CHAINS: [&str; 8] = [
    "services",
    "service-endpoints-check",
    "nodeport-endpoints-check",
    REJECT_CHAIN,
    "firewall-check",
    "cluster-ips-check",
    "mark-for-masquerade",
    "masquerading",
];

/// The chains that refuse node ports on loopback, by protocol (KEP-6032);
/// each counts in the counter object of its own name.
pub const LOCALHOST_REJECT_CHAINS: [(Protocol, &str); 3] = [
    (Protocol::Tcp, "localhost-nodeport-reject-tcp"),
    (Protocol::Udp, "localhost-nodeport-reject-udp"),
    (Protocol::Sctp, "localhost-nodeport-reject-sctp"),
];

/// The reject chain (and counter) of a protocol.
pub fn localhost_reject_chain(p: Protocol) -> &'static str {
    LOCALHOST_REJECT_CHAINS.iter().find(|(q, _)| *q == p).map(|(_, c)| *c).expect("every protocol has one")
}

/// Whether a chain or set name is the host's.
pub fn is_host_name(name: &str) -> bool {
    BASE_CHAINS.iter().any(|b| b.name == name)
        || CHAINS.contains(&name)
        || LOCALHOST_REJECT_CHAINS.iter().any(|(_, c)| *c == name)
        || HostSet::from_name(name).is_some()
}

/// Registers a lookup key takes (the validator keeps keys within
/// [`MAX_KEY_REGISTERS`]).
pub fn key_registers(family: IpFamily, keys: &[KeyExpr]) -> u32 {
    let address = if family == IpFamily::V4 { 1 } else { 4 };
    let (mut at, mut peak) = (0, 0);
    for k in keys {
        let (width, used) = match k {
            KeyExpr::Address(_) => (address, address),
            // The hashed address is loaded at the hash's place first.
            KeyExpr::Jhash { .. } => (1, address),
            _ => (1, 1),
        };
        peak = peak.max(at + used);
        at += width;
    }
    peak
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::ops::nftables::AddressField;

    #[test]
    fn a_jhash_counts_the_registers_its_input_takes() {
        use AddressField::{Destination as D, Source as S};
        let jhash = KeyExpr::Jhash { field: S, modulus: 4, seed: 1 };
        let a = KeyExpr::Address;
        // The red team's key: its protocol sat in register 12, where the
        // hashed address used to be loaded. Now the hash's input needs 13..17.
        let clobbering = [a(D), a(S), a(D), KeyExpr::Protocol, jhash];
        assert_eq!(key_registers(IpFamily::V6, &clobbering), 17, "over 16: the validator refuses it");
        assert_eq!(key_registers(IpFamily::V6, &[a(D), a(S), jhash]), 12);
        assert_eq!(key_registers(IpFamily::V6, &[jhash, KeyExpr::Protocol]), 4);
        assert_eq!(key_registers(IpFamily::V4, &[a(D), KeyExpr::Protocol, KeyExpr::DestinationPort, jhash]), 4);
    }
}
