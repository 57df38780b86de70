//! The hashing schedulers' tables: IPVS's dh and sh (256 buckets), IPVS's
//! mh (maglev hashing with weights as turns) and maglev (NSDI'16), and
//! the pickers that use them.

use std::net::IpAddr;

use kpx_rules::plan::jhash;

use crate::{Connection, Dest, Picker};

/// IPVS's dh and sh tables: 2^8 buckets.
pub const BUCKETS: usize = 256;

/// A table of destination indices (None: no destination with a weight).
pub type Table = Vec<Option<usize>>;

/// IPVS folds an IPv6 address into one word by xor.
fn fold(ip: IpAddr) -> u32 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            (0..4)
                .map(|i| u32::from_be_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]]))
                .fold(0, |a, w| a ^ w)
        }
    }
}

/// `ip_vs_dh_hashkey`: (address * 2654435761) mod 256.
pub fn dh_bucket(ip: IpAddr) -> usize {
    (fold(ip).wrapping_mul(2_654_435_761) as usize) & (BUCKETS - 1)
}

/// `ip_vs_sh_hashkey` without the port: `hash_32(address, 8)` (+ offset).
pub fn sh_bucket(ip: IpAddr, offset: usize) -> usize {
    let hash = (fold(ip).wrapping_mul(0x61C8_8647) >> (32 - 8)) as usize;
    (offset + hash) % BUCKETS
}

/// `ip_vs_dh_reassign`: bucket i holds destination i mod n, weights aside.
pub fn dh_table(dests: &[Dest]) -> Table {
    (0..BUCKETS).map(|i| (!dests.is_empty()).then(|| i % dests.len())).collect()
}

/// `ip_vs_sh_reassign`: buckets go to the destinations in list order, each
/// taking as many consecutive buckets as its weight (at least one).
pub fn sh_table(dests: &[Dest]) -> Table {
    let mut out = Vec::with_capacity(BUCKETS);
    let (mut at, mut count) = (0usize, 0u32);
    for _ in 0..BUCKETS {
        if dests.is_empty() {
            out.push(None);
            continue;
        }
        out.push(Some(at));
        count += 1;
        if count >= dests[at].weight {
            at = (at + 1) % dests.len();
            count = 0;
        }
    }
    out
}

/// Destination hashing: the destination address's bucket; none when its
/// destination is unavailable.
pub struct Dh {
    pub table: Table,
}

impl Picker for Dh {
    fn pick(&mut self, dests: &[Dest], c: Connection) -> Option<usize> {
        self.table[dh_bucket(c.destination)].filter(|&i| dests[i].available())
    }
}

/// Source hashing; with `fallback` (IPVS's sh-fallback flag), an
/// unavailable bucket tries the next offsets.
pub struct Sh {
    pub table: Table,
    pub fallback: bool,
}

impl Picker for Sh {
    fn pick(&mut self, dests: &[Dest], c: Connection) -> Option<usize> {
        let first = self.table[sh_bucket(c.source, 0)]?;
        if dests[first].available() {
            return Some(first);
        }
        if !self.fallback {
            return None;
        }
        let ihash = sh_bucket(c.source, 0);
        (0..BUCKETS)
            .map(|off| self.table[sh_bucket(c.source, (off + ihash) % BUCKETS)])
            .find_map(|d| d.filter(|&i| dests[i].available()))
    }
}

/// Maglev population: each destination with a positive weight walks its
/// own permutation of the `size` slots (`offset`, `offset + skip`, ... mod
/// `size`) and, in round r, takes `turns(k, r)` free slots, until all are
/// taken. `size` must be prime (every skip then visits every slot).
fn populate(size: usize, perms: &[(usize, usize, usize)], turns: impl Fn(usize, u64) -> u64) -> Table {
    let mut table: Table = vec![None; size];
    if perms.is_empty() {
        return table;
    }
    let mut next: Vec<usize> = perms.iter().map(|p| p.0).collect();
    let mut filled = 0;
    let mut round = 0u64;
    while filled < size {
        for (k, &(_, skip, dest)) in perms.iter().enumerate() {
            for _ in 0..turns(k, round) {
                while table[next[k]].is_some() {
                    next[k] = (next[k] + skip) % size;
                }
                table[next[k]] = Some(dest);
                filled += 1;
                if filled == size {
                    return table;
                }
            }
        }
        round += 1;
    }
    table
}

fn name_hash(d: &Dest, seed: u32) -> u32 {
    jhash(d.name().as_bytes(), seed)
}

/// IPVS's `IP_VS_MH_TAB_BITS` for a table size: its index in IPVS's
/// prime list (251 is index 8) halved.
fn mh_tab_bits(size: usize) -> u32 {
    match size {
        251 | 509 => 4,
        1021 | 2039 => 5,
        _ => 6,
    }
}

/// IPVS's mh (`ip_vs_mh_permutate` / `ip_vs_mh_populate`): weight 0 is
/// left out; each round a destination takes `(weight / gcd) >> shift`
/// turns (at least one), the shift keeping the largest within
/// `IP_VS_MH_TAB_BITS` bits. IPVS keys the permutations with siphash and
/// fixed keys; kpx keys them with `jhash(ip:port, seed)`, so its tables
/// are its own, the same on every node and in every mode.
pub fn mh_table(dests: &[Dest], size: usize, seed: u32) -> Table {
    let gcd = crate::ipvs::weight_gcd(dests);
    let max = dests.iter().map(|d| d.weight / gcd).max().unwrap_or(0);
    let shift = (u32::BITS - max.leading_zeros()).saturating_sub(mh_tab_bits(size));
    let live: Vec<&Dest> = dests.iter().filter(|d| d.weight > 0).collect();
    let perms = permutations(dests, size, seed, seed.wrapping_add(0x9e37_79b9));
    let turns: Vec<u64> = live.iter().map(|d| u64::from(((d.weight / gcd) >> shift).max(1))).collect();
    populate(size, &perms, |k, _| turns[k])
}

/// (offset, skip, destination index) of every destination with a weight.
fn permutations(dests: &[Dest], size: usize, seed1: u32, seed2: u32) -> Vec<(usize, usize, usize)> {
    dests
        .iter()
        .enumerate()
        .filter(|(_, d)| d.weight > 0)
        .map(|(i, d)| {
            let offset = name_hash(d, seed1) as usize % size;
            let skip = name_hash(d, seed2) as usize % (size - 1) + 1;
            (offset, skip, i)
        })
        .collect()
}

/// Maglev (Eisenbud et al., NSDI'16, pseudocode 1): offset = h1(name) mod
/// M, skip = h2(name) mod (M - 1) + 1, round-robin population. Weights
/// interleave: in round r a destination takes floor((r+1)·w/max) −
/// floor(r·w/max) turns, so the heaviest takes one per round and the
/// others their share, never a run that starves the rest.
pub fn maglev_table(dests: &[Dest], size: usize, seed: u32) -> Table {
    let live: Vec<u64> = dests.iter().filter(|d| d.weight > 0).map(|d| u64::from(d.weight)).collect();
    let max = live.iter().copied().max().unwrap_or(1);
    let perms = permutations(dests, size, seed, !seed);
    populate(size, &perms, |k, r| (r + 1) * live[k] / max - r * live[k] / max)
}

/// Whether `n` is prime.
pub fn is_prime(n: u32) -> bool {
    n >= 2 && (2..).take_while(|d| d * d <= n).all(|d| !n.is_multiple_of(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dests(weights: &[u32]) -> Vec<Dest> {
        weights.iter().enumerate().map(|(i, &w)| Dest::new(IpAddr::from([10, 0, 0, i as u8 + 1]), 80, w)).collect()
    }

    #[test]
    fn dh_hash_and_table_are_ipvs() {
        // 10.0.0.10 = 0x0a00000a; * 2654435761 mod 2^32 = 0x...; low byte:
        // 0x0a00000a * 0x9e3779b1: low byte of 0x0a * 0xb1 = 0x6ea → 0xea.
        assert_eq!(dh_bucket(IpAddr::from([10, 0, 0, 10])), 0xea);
        let t = dh_table(&dests(&[5, 1, 0]));
        assert_eq!(&t[..4], &[Some(0), Some(1), Some(2), Some(0)]);
        // A weight-0 destination holds buckets but takes nothing.
        let d = dests(&[1, 1, 0]);
        let mut p = Dh { table: dh_table(&d) };
        let to =
            |b: usize| (1..=255u8).map(|x| IpAddr::from([10, 9, 0, x])).find(|&ip| dh_bucket(ip) % 3 == b).unwrap();
        let conn = |dst| Connection { source: IpAddr::from([1, 1, 1, 1]), destination: dst };
        assert_eq!(p.pick(&d, conn(to(0))), Some(0));
        assert_eq!(p.pick(&d, conn(to(2))), None);
    }

    #[test]
    fn sh_table_gives_weight_many_consecutive_buckets() {
        let t = sh_table(&dests(&[3, 1, 0]));
        // 0 0 0 1 2 0 0 0 1 2 ... (weight 0 still takes one bucket)
        assert_eq!(
            &t[..10],
            &[Some(0), Some(0), Some(0), Some(1), Some(2), Some(0), Some(0), Some(0), Some(1), Some(2)]
        );
        // hash_32(0x0a000001, 8) = (0x0a000001 * 0x61c88647) >> 24
        let expect = ((0x0a00_0001u32).wrapping_mul(0x61c8_8647) >> 24) as usize;
        assert_eq!(sh_bucket(IpAddr::from([10, 0, 0, 1]), 0), expect);
    }

    #[test]
    fn sh_fallback_skips_unavailable() {
        let mut d = dests(&[1, 1]);
        let table = sh_table(&d);
        let src = IpAddr::from([10, 1, 1, 1]);
        let conn = Connection { source: src, destination: IpAddr::from([10, 96, 0, 1]) };
        let home = table[sh_bucket(src, 0)].unwrap();
        d[home].weight = 0;
        assert_eq!(Sh { table: table.clone(), fallback: false }.pick(&d, conn), None);
        assert_eq!(Sh { table, fallback: true }.pick(&d, conn), Some(1 - home));
    }

    #[test]
    fn maglev_fills_evenly_and_moves_little() {
        let d = dests(&[1, 1, 1, 1, 1]);
        let t = maglev_table(&d, 1021, 7);
        let mut count = [0usize; 5];
        t.iter().for_each(|s| count[s.unwrap()] += 1);
        assert!(count.iter().all(|&c| (203..=206).contains(&c)), "{count:?}");
        // Remove the third destination: its slots move; few others do.
        let mut less = d.clone();
        less.remove(2);
        let t2 = maglev_table(&less, 1021, 7);
        let moved = t.iter().zip(&t2).filter(|(a, b)| {
            let before = &d[a.unwrap()];
            let after = &less[b.unwrap()];
            before.name() != after.name() && before.name() != d[2].name()
        });
        assert!(moved.count() < 1021 / 20, "maglev moved too many slots that were not the removed endpoint's");
    }

    #[test]
    fn mh_and_maglev_honour_weights() {
        let d = dests(&[3, 1, 0]);
        for t in [mh_table(&d, 251, 0), maglev_table(&d, 251, 0)] {
            let a = t.iter().filter(|s| **s == Some(0)).count();
            let b = t.iter().filter(|s| **s == Some(1)).count();
            assert_eq!(a + b, 251);
            assert!((185..=192).contains(&a), "weight 3 of 4 should hold ~188 of 251 slots, holds {a}");
            assert!(t.iter().all(|s| *s != Some(2)));
        }
    }

    #[test]
    fn large_and_close_weights_share_the_table() {
        for (weights, size) in
            [(vec![1000u32, 999], 1021usize), (vec![3001, 2000, 1000], 1021), (vec![127, 126, 125], 251)]
        {
            let d = dests(&weights);
            let total: u32 = weights.iter().sum();
            for (name, t) in [("maglev", maglev_table(&d, size, 1)), ("mh", mh_table(&d, size, 1))] {
                for (i, &w) in weights.iter().enumerate() {
                    let got = t.iter().filter(|s| **s == Some(i)).count() as f64 / size as f64;
                    let want = f64::from(w) / f64::from(total);
                    assert!(
                        (got - want).abs() < 0.05,
                        "{name} {weights:?}: endpoint {i} holds {got:.3}, its weight says {want:.3}"
                    );
                }
            }
        }
    }

    #[test]
    fn primes() {
        assert!(is_prime(251) && is_prime(1021) && !is_prime(1024) && !is_prime(1));
    }
}
