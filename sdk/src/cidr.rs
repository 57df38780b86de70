//! CIDR arithmetic for extensions' source matches: whether a prefix holds
//! another ([`CidrExt::contains_cidr`]), whether two share an address
//! ([`CidrExt::overlaps`]), and the fewest prefixes that hold every
//! address of a family outside a set ([`complement`]). [`Cidr`] itself
//! tells whether it holds an address (`Cidr::contains(&IpAddr)`).
//!
//! Since kpx:proxier 0.4.0 an allow-list is accept rules for the sources
//! allowed and one drop rule for the rest. An extension built for 0.2.0
//! (`export_extension_v0_2!`), which has no accept, needs the complement:
//! "only these sources" is then a drop rule for each prefix of everything
//! else (docs/plugins.md, "Extension rules"):
//!
//! ```
//! use kpx_sdk::cidr::{CidrExt, complement};
//! use kpx_sdk::{Cidr, IpFamily};
//!
//! let allowed: Vec<Cidr> = vec!["10.1.0.0/16".parse().unwrap(), "10.2.0.0/16".parse().unwrap()];
//! let others = complement(IpFamily::V4, &allowed);
//! let ip = "10.3.0.1".parse().unwrap();
//! assert_eq!(others.iter().filter(|c| c.contains(&ip)).count(), 1);
//! assert!(others.iter().all(|c| allowed.iter().all(|a| !c.overlaps(a))));
//! ```
//!
//! A prefix length past the family's (a `Cidr` built by hand; parsing
//! refuses one) counts as the family's, as `Cidr::contains` reads it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpx_rules::model::{Cidr, IpFamily};

/// Containment and overlap of [`Cidr`]s. Prefixes of different families
/// neither contain nor overlap each other.
pub trait CidrExt {
    /// Whether every address of `other` is in this prefix.
    fn contains_cidr(&self, other: &Cidr) -> bool;
    /// Whether some address is in both prefixes (one of them then holds
    /// the other).
    fn overlaps(&self, other: &Cidr) -> bool;
}

impl CidrExt for Cidr {
    fn contains_cidr(&self, other: &Cidr) -> bool {
        self.family() == other.family() && length(self) <= length(other) && self.contains(&other.addr)
    }

    fn overlaps(&self, other: &Cidr) -> bool {
        self.contains_cidr(other) || other.contains_cidr(self)
    }
}

/// The fewest CIDRs that together hold exactly the addresses of `family`
/// that none of `cidrs` holds, in address order, with their host bits
/// clear. The other family's CIDRs in `cidrs` are ignored: `[0.0.0.0/0]`
/// (or `[::/0]`) when none is of `family`, nothing when one is a /0.
pub fn complement(family: IpFamily, cidrs: &[Cidr]) -> Vec<Cidr> {
    let width = width(family);
    let top = mask(width);
    let mut ranges: Vec<(u128, u128)> =
        cidrs.iter().filter(|c| c.family() == family).map(|c| (number(c.network()), number(c.last()))).collect();
    ranges.sort_unstable();
    let mut out = Vec::new();
    // The first address no range before has covered (None: past the top).
    let mut next = Some(0u128);
    for (start, end) in ranges {
        let Some(from) = next else { break };
        if start > from {
            push_range(&mut out, family, from, start - 1);
        }
        if end >= from {
            next = end.checked_add(1).filter(|n| *n <= top);
        }
    }
    if let Some(from) = next {
        push_range(&mut out, family, from, top);
    }
    out
}

/// The fewest CIDRs that hold exactly `start..=end` (`start <= end`): from
/// `start`, each time the largest aligned block that ends by `end`.
fn push_range(out: &mut Vec<Cidr>, family: IpFamily, mut start: u128, end: u128) {
    let width = width(family);
    loop {
        let mut bits = start.trailing_zeros().min(width);
        while start | mask(bits) > end {
            bits -= 1;
        }
        out.push(Cidr { addr: address(family, start), prefix_len: (width - bits) as u8 });
        match (start | mask(bits)).checked_add(1) {
            Some(n) if n <= end => start = n,
            _ => return,
        }
    }
}

/// The prefix length, at most the family's.
fn length(c: &Cidr) -> u8 {
    c.prefix_len.min(c.max_len())
}

fn width(family: IpFamily) -> u32 {
    match family {
        IpFamily::V4 => 32,
        IpFamily::V6 => 128,
    }
}

/// The low `bits` bits set.
fn mask(bits: u32) -> u128 {
    if bits >= 128 { u128::MAX } else { (1u128 << bits) - 1 }
}

fn number(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn address(family: IpFamily, n: u128) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(text: &str) -> Cidr {
        text.parse().unwrap_or_else(|_| panic!("{text:?} is not a CIDR"))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|_| panic!("{text:?} is not an address"))
    }

    fn texts(cidrs: &[Cidr]) -> Vec<String> {
        cidrs.iter().map(Cidr::to_string).collect()
    }

    #[test]
    fn a_prefix_holds_its_addresses_only() {
        let net = c("10.1.0.0/16");
        for inside in ["10.1.0.0", "10.1.2.3", "10.1.255.255"] {
            assert!(net.contains(&ip(inside)), "{inside}");
        }
        for outside in ["10.0.255.255", "10.2.0.0", "::ffff:10.1.2.3", "::a01:203"] {
            assert!(!net.contains(&ip(outside)), "{outside}");
        }
        // Host bits set in the address: the prefix is what counts.
        assert!(Cidr { addr: ip("10.1.2.3"), prefix_len: 8 }.contains(&ip("10.200.0.1")));
        let all = c("0.0.0.0/0");
        assert!(all.contains(&ip("0.0.0.0")) && all.contains(&ip("255.255.255.255")));
        assert!(!all.contains(&ip("::1")), "no IPv6 address is in an IPv4 /0");
        let one = c("192.0.2.7/32");
        assert!(one.contains(&ip("192.0.2.7")) && !one.contains(&ip("192.0.2.6")) && !one.contains(&ip("192.0.2.8")));
        let v6 = c("2001:db8::/32");
        assert!(v6.contains(&ip("2001:db8:ffff::1")) && !v6.contains(&ip("2001:db9::")));
        let host6 = c("2001:db8::7/128");
        assert!(host6.contains(&ip("2001:db8::7")) && !host6.contains(&ip("2001:db8::6")));
        assert!(c("::/0").contains(&ip("ffff::")) && !c("::/0").contains(&ip("10.0.0.1")));
    }

    #[test]
    fn containment_of_nested_equal_adjacent_and_foreign_prefixes() {
        let (wide, narrow) = (c("10.0.0.0/8"), c("10.1.0.0/16"));
        assert!(wide.contains_cidr(&narrow) && !narrow.contains_cidr(&wide));
        assert!(wide.contains_cidr(&wide), "a prefix holds itself");
        assert!(wide.contains_cidr(&Cidr { addr: ip("10.9.9.9"), prefix_len: 8 }), "host bits do not count");
        assert!(c("0.0.0.0/0").contains_cidr(&c("255.255.255.255/32")));
        assert!(c("192.0.2.0/24").contains_cidr(&c("192.0.2.255/32")));
        assert!(!c("192.0.2.7/32").contains_cidr(&c("192.0.2.6/31")), "a /32 holds no /31");
        assert!(!c("10.0.0.0/24").contains_cidr(&c("10.0.1.0/24")), "adjacent");
        assert!(!c("0.0.0.0/0").contains_cidr(&c("::/128")), "another family");
        assert!(!c("::/0").contains_cidr(&c("10.0.0.0/8")), "another family");
        assert!(c("2001:db8::/32").contains_cidr(&c("2001:db8:1::/48")));
        assert!(!c("2001:db8:1::/48").contains_cidr(&c("2001:db8::/32")));
        assert!(c("2001:db8::1/128").contains_cidr(&c("2001:db8::1/128")));
        // A length past the family's is the family's.
        let long = Cidr { addr: ip("10.0.0.1"), prefix_len: 40 };
        assert!(long.contains_cidr(&c("10.0.0.1/32")) && c("10.0.0.1/32").contains_cidr(&long));
    }

    #[test]
    fn overlap_is_nesting_either_way() {
        let pairs = [
            ("10.0.0.0/8", "10.1.0.0/16", true),
            ("10.1.2.3/32", "10.1.0.0/16", true),
            ("0.0.0.0/0", "203.0.113.9/32", true),
            ("10.0.0.0/24", "10.0.1.0/24", false),
            ("10.0.0.0/25", "10.0.0.128/25", false),
            ("10.0.0.0/8", "::/0", false),
            ("2001:db8::/32", "2001:db8:8000::/33", true),
            ("2001:db8::/33", "2001:db8:8000::/33", false),
            ("::/0", "::1/128", true),
            ("::1/128", "::2/128", false),
        ];
        for (a, b, want) in pairs {
            assert_eq!(c(a).overlaps(&c(b)), want, "{a} {b}");
            assert_eq!(c(b).overlaps(&c(a)), want, "{b} {a}");
        }
    }

    #[test]
    fn the_complement_of_nothing_and_of_everything() {
        assert_eq!(texts(&complement(IpFamily::V4, &[])), ["0.0.0.0/0"]);
        assert_eq!(texts(&complement(IpFamily::V6, &[])), ["::/0"]);
        assert!(complement(IpFamily::V4, &[c("0.0.0.0/0")]).is_empty());
        assert!(complement(IpFamily::V6, &[c("::/0"), c("2001:db8::/32")]).is_empty());
        // The other family's prefixes are not this family's addresses.
        assert_eq!(texts(&complement(IpFamily::V4, &[c("::/0")])), ["0.0.0.0/0"]);
        assert_eq!(texts(&complement(IpFamily::V6, &[c("0.0.0.0/0")])), ["::/0"]);
    }

    #[test]
    fn the_complement_of_one_prefix_has_a_prefix_per_bit() {
        let want = [
            "0.0.0.0/5",
            "8.0.0.0/7",
            "11.0.0.0/8",
            "12.0.0.0/6",
            "16.0.0.0/4",
            "32.0.0.0/3",
            "64.0.0.0/2",
            "128.0.0.0/1",
        ];
        assert_eq!(texts(&complement(IpFamily::V4, &[c("10.0.0.0/8")])), want);
        // Host bits set: the same prefix.
        assert_eq!(texts(&complement(IpFamily::V4, &[Cidr { addr: ip("10.7.7.7"), prefix_len: 8 }])), want);
        // One address at either end of the family: 32 (128) prefixes.
        let first = complement(IpFamily::V4, &[c("0.0.0.0/32")]);
        assert_eq!(first.len(), 32);
        assert_eq!((first[0].to_string(), first[31].to_string()), ("0.0.0.1/32".into(), "128.0.0.0/1".into()));
        let last = complement(IpFamily::V4, &[c("255.255.255.255/32")]);
        assert_eq!(last.len(), 32);
        assert_eq!((last[0].to_string(), last[31].to_string()), ("0.0.0.0/1".into(), "255.255.255.254/32".into()));
        let first6 = complement(IpFamily::V6, &[c("::/128")]);
        assert_eq!(first6.len(), 128);
        assert_eq!((first6[0].to_string(), first6[127].to_string()), ("::1/128".into(), "8000::/1".into()));
        let last6 = complement(IpFamily::V6, &[c("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")]);
        assert_eq!(last6.len(), 128);
        assert_eq!(last6[0].to_string(), "::/1");
        assert_eq!(last6[127].to_string(), "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/128");
        assert_eq!(complement(IpFamily::V6, &[c("2001:db8::/32")]).len(), 32);
        assert_eq!(texts(&complement(IpFamily::V6, &[c("::/1")])), ["8000::/1"]);
    }

    #[test]
    fn adjacent_and_nested_prefixes_merge_in_the_complement() {
        let whole = complement(IpFamily::V4, &[c("10.0.0.0/8")]);
        assert_eq!(complement(IpFamily::V4, &[c("10.128.0.0/9"), c("10.0.0.0/9")]), whole, "adjacent halves");
        assert_eq!(complement(IpFamily::V4, &[c("10.1.0.0/16"), c("10.0.0.0/8"), c("10.1.2.0/24")]), whole, "nested");
        assert_eq!(complement(IpFamily::V4, &[c("10.0.0.0/8"), c("10.0.0.0/8")]), whole, "twice");
        // Two halves of the family: nothing left.
        assert!(complement(IpFamily::V4, &[c("128.0.0.0/1"), c("0.0.0.0/1")]).is_empty());
        assert!(complement(IpFamily::V6, &[c("8000::/1"), c("::/1")]).is_empty());
        // A gap of one address between two prefixes.
        let gap = complement(IpFamily::V4, &[c("0.0.0.0/1"), c("128.0.0.1/32"), c("128.0.0.2/31"), c("128.0.0.4/30")]);
        assert_eq!(texts(&gap[..2]), ["128.0.0.0/32", "128.0.0.8/29"]);
        let gap6 = complement(IpFamily::V6, &[c("::/1"), c("8000::1/128"), c("8000::2/127"), c("8000::4/126")]);
        assert_eq!(texts(&gap6[..2]), ["8000::/128", "8000::8/125"]);
    }

    /// Random sets of prefixes of both families: the complement holds
    /// exactly the addresses no prefix of the set holds, its prefixes are
    /// disjoint, in order and no two of them could be one (two halves of
    /// a prefix), and the complement of the complement's complement is
    /// the complement.
    #[test]
    fn the_complement_holds_exactly_what_the_set_does_not() {
        let mut r = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r
        };
        for round in 0..400 {
            let family = if round % 2 == 0 { IpFamily::V4 } else { IpFamily::V6 };
            let width = width(family);
            let set: Vec<Cidr> = (0..next() % 6)
                .map(|_| {
                    let n = (u128::from(next()) << 64) | u128::from(next());
                    // Long prefixes are most of IPv6's interesting cases:
                    // lengths near both ends.
                    let len = match next() % 3 {
                        0 => next() % 9,
                        1 => u64::from(width) - next() % 9,
                        _ => next() % (u64::from(width) + 1),
                    };
                    Cidr { addr: address(family, n & mask(width)), prefix_len: len as u8 }
                })
                .collect();
            let out = complement(family, &set);
            for pair in out.windows(2) {
                assert!(number(pair[0].last()) < number(pair[1].network()), "{set:?}: {pair:?} overlap or disorder");
                let (a, b) = (&pair[0], &pair[1]);
                let halves = a.prefix_len == b.prefix_len
                    && a.prefix_len > 0
                    && Cidr { addr: a.addr, prefix_len: a.prefix_len - 1 }.contains_cidr(b);
                assert!(!halves, "{set:?}: {a} and {b} are one prefix");
            }
            for c in &out {
                assert_eq!(c.addr, c.network(), "{c}: host bits");
                assert!(set.iter().all(|s| !s.overlaps(c)), "{set:?}: {c} overlaps the set");
            }
            // Addresses at every edge, and random ones.
            let mut probes: Vec<u128> = vec![0, mask(width)];
            for s in &set {
                let (a, b) = (number(s.network()), number(s.last()));
                probes.extend([a, b, a.wrapping_sub(1) & mask(width), b.wrapping_add(1) & mask(width)]);
            }
            probes.extend((0..20).map(|_| ((u128::from(next()) << 64) | u128::from(next())) & mask(width)));
            for p in probes {
                let a = address(family, p);
                let in_set = set.iter().any(|s| s.contains(&a));
                let in_out = out.iter().filter(|c| c.contains(&a)).count();
                assert_eq!(in_out, usize::from(!in_set), "{set:?}: {a}");
            }
            let again = complement(family, &complement(family, &out));
            assert_eq!(again, out, "{set:?}");
        }
    }
}
