//! Plans: how a mode chooses among a service port's candidate endpoints.
//!
//! A scheduler component returns a [`Plan`]; the host checks it
//! ([`Plan::check`]) and hands it to the backend beside the service port;
//! each mode executes it in its own vocabulary (docs/CONTRACT.md,
//! "Schedulers"). Plans index *candidates*: positions in the service
//! port's `cluster_endpoints` or `local_endpoints` list.

use std::net::IpAddr;

/// The largest weight sum a weighted plan may have (nftables executes it
/// as that many map slots).
pub const MAX_WEIGHT_SUM: u32 = 4096;
/// The longest rotation (iptables executes it as that many rules).
pub const MAX_SEQUENCE: usize = 1024;
/// The most rows or columns of a slot table (xt_cluster hashes into at
/// most 32 values).
pub const MAX_SLOT_DIM: u8 = 32;

/// Which address of the connection a slot table hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashField {
    Source,
    Destination,
}

/// `rows` x `cols` slots over Linux's `jhash` of one address (see
/// [`SlotTable::slot_of`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlotTable {
    pub field: HashField,
    pub seed: u32,
    pub rows: u8,
    pub cols: u8,
    /// `rows * cols` candidate positions, row by row.
    pub slots: Vec<u32>,
}

/// A choice among candidates.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Plan {
    /// Candidate i with probability w_i / sum(w).
    Weighted(Vec<u32>),
    /// The k-th new connection goes to `sequence[k mod len]`.
    Sequence(Vec<u32>),
    Slots(SlotTable),
    /// IPVS's own scheduler with a weight per candidate (ipvs mode).
    Kernel(KernelPlan),
}

/// The schedulers IPVS has (net/netfilter/ipvs/ip_vs_*.c).
pub const IPVS_SCHEDULERS: [&str; 13] =
    ["rr", "wrr", "lc", "wlc", "sed", "nq", "dh", "sh", "lblc", "lblcr", "mh", "fo", "ovf"];

/// An IPVS scheduler, the weights and IP_VS_SVC_F_SCHED1..3 (bits 0..2).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelPlan {
    pub scheduler: String,
    pub weights: Vec<u32>,
    pub flags: u8,
}

impl Plan {
    /// Whether this plan is kube-proxy's uniform random choice over `n`.
    pub fn is_uniform(&self, n: usize) -> bool {
        matches!(self, Plan::Weighted(w) if w.len() == n && w.iter().all(|&x| x == w[0] && x > 0))
    }

    /// The same choice in its smallest form: weights over their gcd; a
    /// rotation no longer than its shares need ([`shortest_rotation`]); a
    /// slot table without repeated rows or columns
    /// ([`SlotTable::smallest`]); None when it is the uniform choice over
    /// all `n` (the mode's default), as weights, a rotation or a slot
    /// table over one candidate are. The host hands backends only
    /// normalized plans: a plan's size follows from its endpoints and
    /// their shares, not from how long a scheduler made it (a 1,024-entry
    /// rotation for every one-endpoint Service turned 100 Services into
    /// 102,708 nat rules).
    pub fn normalized(self, n: usize) -> Option<Plan> {
        let plan = match self {
            Plan::Weighted(w) => {
                let gcd = w.iter().copied().filter(|&x| x > 0).fold(0, gcd).max(1);
                let plan = Plan::Weighted(w.into_iter().map(|x| x / gcd).collect());
                return (!plan.is_uniform(n)).then_some(plan);
            }
            Plan::Sequence(s) => Plan::Sequence(shortest_rotation(s)),
            Plan::Slots(t) => Plan::Slots(t.smallest()),
            other => other,
        };
        (!plan.is_only_candidate(n)).then_some(plan)
    }

    /// A rotation or slot table that names candidate 0 of one, once: the
    /// only choice there is.
    fn is_only_candidate(&self, n: usize) -> bool {
        let only = |list: &[u32]| n == 1 && list == [0];
        match self {
            Plan::Sequence(s) => only(s),
            Plan::Slots(t) => only(&t.slots),
            Plan::Weighted(_) | Plan::Kernel(_) => false,
        }
    }

    /// Refuses a plan a mode could not execute over `n` candidates, with
    /// the reason.
    pub fn check(&self, n: usize) -> Result<(), String> {
        let in_range = |what: &str, list: &[u32]| match list.iter().find(|&&i| i as usize >= n) {
            Some(i) => Err(format!("{what} names candidate {i}, but there are {n}")),
            None => Ok(()),
        };
        match self {
            Plan::Weighted(w) => {
                if w.len() != n {
                    return Err(format!("{} weights for {n} candidates", w.len()));
                }
                let sum: u64 = w.iter().map(|&x| u64::from(x)).sum();
                if sum == 0 {
                    return Err("every weight is 0".into());
                }
                // Equal positive weights (some endpoints left out): a
                // uniform choice among the others, for any number of them.
                let positive_equal = w.iter().filter(|&&x| x > 0).all(|&x| w.iter().find(|&&y| y > 0) == Some(&x));
                if sum > u64::from(MAX_WEIGHT_SUM) && !(positive_equal && w.iter().all(|&x| x <= 1)) {
                    return Err(format!("the weights sum to {sum}, more than {MAX_WEIGHT_SUM}"));
                }
                Ok(())
            }
            Plan::Sequence(s) => {
                if s.is_empty() || s.len() > MAX_SEQUENCE {
                    return Err(format!("a rotation of {} entries (1 to {MAX_SEQUENCE})", s.len()));
                }
                in_range("the rotation", s)
            }
            Plan::Kernel(k) => {
                if !IPVS_SCHEDULERS.contains(&k.scheduler.as_str()) {
                    return Err(format!("IPVS has no scheduler {:?}", k.scheduler));
                }
                if k.weights.len() != n {
                    return Err(format!("{} weights for {n} candidates", k.weights.len()));
                }
                if k.flags > 0b111 || k.weights.iter().any(|&w| w > i32::MAX as u32) {
                    return Err("scheduler flags past bit 2, or a weight past 2^31-1".into());
                }
                Ok(())
            }
            Plan::Slots(t) => {
                for (what, d) in [("rows", t.rows), ("cols", t.cols)] {
                    if d == 0 || d > MAX_SLOT_DIM {
                        return Err(format!("a slot table with {d} {what} (1 to {MAX_SLOT_DIM})"));
                    }
                }
                let want = usize::from(t.rows) * usize::from(t.cols);
                if t.slots.len() != want {
                    return Err(format!("{} slots in a {}x{} table", t.slots.len(), t.rows, t.cols));
                }
                in_range("the slot table", &t.slots)
            }
        }
    }

    /// The entries a mode writes for it: slots, rotation steps, weight
    /// units (nftables holds w_i slots per candidate).
    pub fn size(&self) -> usize {
        match self {
            Plan::Weighted(w) => w.iter().map(|&x| x as usize).sum::<usize>().min(MAX_WEIGHT_SUM as usize).max(w.len()),
            Plan::Sequence(s) => s.len(),
            Plan::Slots(t) => t.slots.len(),
            Plan::Kernel(k) => k.weights.len(),
        }
    }

    /// Whether `mode` executes this kind of plan.
    pub fn runs_in(&self, mode: crate::mode::ProxyMode) -> bool {
        use crate::mode::ProxyMode;
        match self {
            Plan::Kernel(_) => mode == ProxyMode::Ipvs,
            // ipvs mode: the host marks each connection with its slot's
            // endpoint (firewall-mark virtual servers).
            Plan::Slots(_) => true,
            Plan::Weighted(_) | Plan::Sequence(_) => mode != ProxyMode::Ipvs,
        }
    }
}

impl SlotTable {
    /// The same table with runs of equal rows, and of equal columns,
    /// merged: every connection goes to the candidate it went to before.
    /// A row (or column) is `scale(hash, rows)`, and `scale(h, k * r) / k`
    /// is `scale(h, r)`, so when each run of `k` rows is one row repeated
    /// the table of `rows / k` rows makes the same choice (the row hash is
    /// not computed at all once one row is left).
    pub fn smallest(self) -> SlotTable {
        let (rows, cols) = (usize::from(self.rows), usize::from(self.cols));
        if self.slots.len() != rows * cols || rows == 0 || cols == 0 {
            return self;
        }
        // Columns: each run of k in every row is one candidate.
        let k = largest_run(cols, |k| self.slots.chunks(k).all(|run| run.iter().all(|&c| c == run[0])));
        let slots: Vec<u32> = self.slots.iter().copied().step_by(k).collect();
        let cols = cols / k;
        // Rows: each run of k rows is one row repeated.
        let k =
            largest_run(rows, |k| slots.chunks(k * cols).all(|run| run.chunks(cols).all(|row| row == &run[..cols])));
        let slots = slots.chunks(k * cols).flat_map(|run| run[..cols].iter().copied()).collect();
        SlotTable { rows: (rows / k) as u8, cols: cols as u8, slots, ..self }
    }

    /// The slot a connection whose hashed address is `ip` takes.
    pub fn slot_of(&self, ip: IpAddr) -> usize {
        let col = scale(jhash_address(ip, self.seed), u32::from(self.cols)) as usize;
        let row =
            if self.rows > 1 { scale(jhash_address(ip, self.seed.wrapping_add(1)), u32::from(self.rows)) } else { 0 };
        row as usize * usize::from(self.cols) + col
    }

    /// The candidate a connection whose hashed address is `ip` goes to.
    pub fn candidate_of(&self, ip: IpAddr) -> u32 {
        self.slots[self.slot_of(ip)]
    }

    /// The seed of the row hash.
    pub fn row_seed(&self) -> u32 {
        self.seed.wrapping_add(1)
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The largest divisor `k` of `len` for which `runs_of(k)` holds (1 if
/// none larger does).
fn largest_run(len: usize, runs_of: impl Fn(usize) -> bool) -> usize {
    (2..=len).rev().filter(|k| len.is_multiple_of(*k)).find(|&k| runs_of(k)).unwrap_or(1)
}

/// A rotation no longer than the shares it gives need: first its period
/// (the same turns in the same order, once), then, when every
/// candidate's count still shares a factor g, every g-th turn of each
/// candidate (the same shares, the order nearly kept). A rotation of one
/// candidate is one turn; `[0, 0, 1, 1]` is `[0, 1]`; `[0, 0, 0, 1]`
/// needs its four turns.
pub fn shortest_rotation(s: Vec<u32>) -> Vec<u32> {
    let s = period(s);
    let mut counts: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
    for &c in &s {
        *counts.entry(c).or_default() += 1;
    }
    let g = counts.values().copied().fold(0, gcd);
    if g <= 1 {
        return s;
    }
    let mut turns: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
    s.into_iter()
        .filter(|&c| {
            let turn = turns.entry(c).or_default();
            *turn += 1;
            (*turn - 1).is_multiple_of(g)
        })
        .collect()
}

/// The shortest prefix that, repeated, is the whole rotation.
fn period(mut s: Vec<u32>) -> Vec<u32> {
    let len = s.len();
    let p = (1..len).filter(|p| len.is_multiple_of(*p)).find(|&p| s[p..] == s[..len - p]).unwrap_or(len);
    s.truncate(p);
    s
}

/// The kernel's `reciprocal_scale`: `val` scaled into `0..n`.
pub fn scale(val: u32, n: u32) -> u32 {
    ((u64::from(val) * u64::from(n)) >> 32) as u32
}

const JHASH_INITVAL: u32 = 0xdeadbeef;

fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

fn finish(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// Linux's `jhash(key, len, initval)` (include/linux/jhash.h) on a little-
/// endian machine: what nftables' `jhash` expression and xt_cluster compute.
pub fn jhash(key: &[u8], initval: u32) -> u32 {
    let word = |b: &[u8]| b.iter().rev().fold(0u32, |w, &x| (w << 8) | u32::from(x));
    let init = JHASH_INITVAL.wrapping_add(key.len() as u32).wrapping_add(initval);
    let (mut a, mut b, mut c) = (init, init, init);
    let mut k = key;
    while k.len() > 12 {
        a = a.wrapping_add(word(&k[0..4]));
        b = b.wrapping_add(word(&k[4..8]));
        c = c.wrapping_add(word(&k[8..12]));
        mix(&mut a, &mut b, &mut c);
        k = &k[12..];
    }
    if k.is_empty() {
        return c;
    }
    a = a.wrapping_add(word(&k[..k.len().min(4)]));
    if k.len() > 4 {
        b = b.wrapping_add(word(&k[4..k.len().min(8)]));
    }
    if k.len() > 8 {
        c = c.wrapping_add(word(&k[8..]));
    }
    finish(&mut a, &mut b, &mut c);
    c
}

/// `jhash` of an address's bytes in network order.
pub fn jhash_address(ip: IpAddr, seed: u32) -> u32 {
    match ip {
        IpAddr::V4(v4) => jhash(&v4.octets(), seed),
        IpAddr::V6(v6) => jhash(&v6.octets(), seed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// jhash_1word(a, seed) as xt_cluster computes it, written from the
    /// kernel's __jhash_nwords: an independent path to the same value.
    fn jhash_1word(a: u32, seed: u32) -> u32 {
        let init = JHASH_INITVAL.wrapping_add(4).wrapping_add(seed);
        let (mut a, mut b, mut c) = (a.wrapping_add(init), init, init);
        finish(&mut a, &mut b, &mut c);
        c
    }

    #[test]
    fn jhash_of_an_ipv4_address_is_xt_clusters_jhash_1word() {
        for (ip, seed) in [("10.0.1.2", 0xdeadbeef), ("192.168.7.200", 0), ("1.2.3.4", 7)] {
            let v4: std::net::Ipv4Addr = ip.parse().unwrap();
            // xt_cluster reads the big-endian address as a native (little-endian) u32.
            let native = u32::from_le_bytes(v4.octets());
            assert_eq!(jhash_address(IpAddr::V4(v4), seed), jhash_1word(native, seed), "{ip}");
        }
    }

    #[test]
    fn known_vectors() {
        // Bob Jenkins' lookup3 hashlittle, which Linux's jhash equals on
        // little-endian machines: hashlittle("", 0) = 0xdeadbeef and
        // hashlittle("Four score and seven years ago", 0) = 0x17770551.
        assert_eq!(jhash(b"", 0), 0xdeadbeef);
        assert_eq!(jhash(b"Four score and seven years ago", 0), 0x17770551);
        assert_eq!(jhash(b"Four score and seven years ago", 1), 0xcd628161);
    }

    #[test]
    fn slot_table_checks_and_lookups() {
        let t = SlotTable { field: HashField::Source, seed: 5, rows: 2, cols: 3, slots: vec![0, 1, 0, 1, 1, 1] };
        assert!(Plan::Slots(t.clone()).check(2).is_ok());
        assert!(Plan::Slots(t.clone()).check(1).unwrap_err().contains("candidate 1"));
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let col = scale(jhash_address(ip, 5), 3) as usize;
        let row = scale(jhash_address(ip, 6), 2) as usize;
        assert_eq!(t.slot_of(ip), row * 3 + col);
    }

    #[test]
    fn plan_checks() {
        assert!(Plan::Weighted(vec![0, 0]).check(2).unwrap_err().contains("every weight"));
        assert!(Plan::Weighted(vec![1]).check(2).is_err());
        assert!(Plan::Weighted(vec![4096, 1]).check(2).unwrap_err().contains("4097"));
        assert!(Plan::Sequence(vec![]).check(2).is_err());
        assert!(Plan::Sequence(vec![0, 2]).check(2).is_err());
        assert!(Plan::Weighted(vec![1; 3]).is_uniform(3));
        // Huge equal weights are the uniform choice: no plan.
        assert_eq!(Plan::Weighted(vec![u32::MAX; 3]).normalized(3), None);
        assert_eq!(Plan::Weighted(vec![6, 3]).normalized(2), Some(Plan::Weighted(vec![2, 1])));
        // Draining one endpoint of 5000: equal ones over 4096 are fine.
        let mut drain = vec![1; 5000];
        drain[7] = 0;
        assert!(Plan::Weighted(drain).check(5000).is_ok());
        let mut uneven = vec![1; 5000];
        uneven[7] = 2;
        assert!(Plan::Weighted(uneven).check(5000).is_err());
        assert!(!Plan::Weighted(vec![3, 1]).is_uniform(2));
    }

    /// A scheduler that returns the longest rotation allowed for a
    /// one-endpoint Service: the host hands the backend the only choice
    /// there is, the mode's default (one DNAT), not 1,024 turns.
    #[test]
    fn a_one_endpoint_rotation_of_1024_entries_is_one_entry() {
        let longest = Plan::Sequence(vec![0; MAX_SEQUENCE]);
        assert!(longest.check(1).is_ok(), "within the check");
        assert_eq!(longest.size(), MAX_SEQUENCE);
        assert_eq!(shortest_rotation(vec![0; MAX_SEQUENCE]), [0]);
        assert_eq!(longest.normalized(1), None);
        // The same for the largest slot table, and a rotation of one.
        let table = SlotTable { field: HashField::Source, seed: 9, rows: 32, cols: 32, slots: vec![0; 1024] };
        assert_eq!(Plan::Slots(table).normalized(1), None);
        assert_eq!(Plan::Sequence(vec![0]).normalized(1), None);
        // Over two candidates a rotation of one of them is a choice (the
        // other drained): one turn.
        assert_eq!(Plan::Sequence(vec![1; MAX_SEQUENCE]).normalized(2), Some(Plan::Sequence(vec![1])));
    }

    #[test]
    fn a_rotation_is_no_longer_than_its_shares_need() {
        let alternate: Vec<u32> = (0..MAX_SEQUENCE as u32).map(|i| i % 2).collect();
        assert_eq!(Plan::Sequence(alternate).normalized(2), Some(Plan::Sequence(vec![0, 1])));
        assert_eq!(shortest_rotation(vec![0, 0, 1, 1]), [0, 1]);
        assert_eq!(shortest_rotation(vec![0, 0, 0, 1, 1, 1]), [0, 1]);
        assert_eq!(shortest_rotation(vec![0, 0, 1, 0, 0, 1]), [0, 0, 1], "the period, in its order");
        assert_eq!(shortest_rotation(vec![2, 0, 2, 0, 2, 2]), [2, 0, 2], "4:2 is 2:1");
        assert_eq!(shortest_rotation(vec![0, 0, 0, 1]), [0, 0, 0, 1], "3:1 needs its four turns");
        assert_eq!(shortest_rotation(vec![0, 1, 2]), [0, 1, 2]);
        assert_eq!(shortest_rotation(vec![]), Vec::<u32>::new());
        let mut tail = vec![0; MAX_SEQUENCE - 1];
        tail.push(1);
        assert_eq!(shortest_rotation(tail.clone()), tail, "1023:1 needs 1,024 turns");

        // Random rotations, some repeated: the same shares in the fewest
        // turns (the counts share no factor).
        let mut r = 0x9e37_79b9u32;
        let mut next = |m: u32| {
            r ^= r << 13;
            r ^= r >> 17;
            r ^= r << 5;
            r % m
        };
        for _ in 0..500 {
            let candidates = 1 + next(4);
            let base: Vec<u32> = (0..1 + next(24)).map(|_| next(candidates)).collect();
            let times = 1 + next(5) as usize;
            let s: Vec<u32> = base.iter().copied().cycle().take(base.len() * times).collect();
            let short = shortest_rotation(s.clone());
            let count = |list: &[u32], c: u32| list.iter().filter(|&&x| x == c).count();
            for c in 0..candidates {
                assert_eq!(count(&s, c) * short.len(), count(&short, c) * s.len(), "{s:?} -> {short:?}");
            }
            let g = (0..candidates).map(|c| count(&short, c) as u32).fold(0, gcd);
            assert_eq!(g, 1, "{s:?} -> {short:?}");
            assert!(short.len() <= base.len(), "{s:?} -> {short:?}");
        }
    }

    #[test]
    fn a_slot_table_of_repeated_rows_and_columns_makes_the_same_choices_smaller() {
        #[rustfmt::skip]
        let t = SlotTable {
            field: HashField::Source,
            seed: 5,
            rows: 4,
            cols: 6,
            slots: vec![
                0, 0, 0, 1, 1, 1,
                0, 0, 0, 1, 1, 1,
                2, 2, 2, 0, 0, 0,
                2, 2, 2, 0, 0, 0,
            ],
        };
        let small = t.clone().smallest();
        assert_eq!((small.rows, small.cols, small.slots.clone()), (2, 2, vec![0, 1, 2, 0]));
        let one_row = SlotTable { rows: 2, slots: t.slots[..12].to_vec(), ..t.clone() }.smallest();
        assert_eq!((one_row.rows, one_row.cols, one_row.slots.clone()), (1, 2, vec![0, 1]));
        // No runs: as it was.
        let maglev = SlotTable { field: HashField::Source, seed: 1, rows: 1, cols: 5, slots: vec![0, 1, 0, 1, 1] };
        assert_eq!(maglev.clone().smallest(), maglev);

        // Random tables with runs: every address goes where it went.
        let mut r = 0x2545_f491u32;
        let mut next = |m: u32| {
            r ^= r << 13;
            r ^= r >> 17;
            r ^= r << 5;
            r % m
        };
        for _ in 0..200 {
            let (rows, cols) = (1 + next(4) as usize, 1 + next(4) as usize);
            let (kr, kc) = (1 + next(8) as usize, 1 + next(8) as usize);
            let base: Vec<u32> = (0..rows * cols).map(|_| next(3)).collect();
            let slots = (0..rows * kr)
                .flat_map(|row| (0..cols * kc).map(move |col| (row / kr) * cols + col / kc))
                .map(|i| base[i])
                .collect();
            let (seed, big_rows, big_cols) = (next(1000), (rows * kr) as u8, (cols * kc) as u8);
            let big = SlotTable { field: HashField::Source, seed, rows: big_rows, cols: big_cols, slots };
            let small = big.clone().smallest();
            assert!(usize::from(small.rows) <= rows && usize::from(small.cols) <= cols, "{big:?} -> {small:?}");
            assert!(Plan::Slots(small.clone()).check(3).is_ok());
            for i in 0..500u32 {
                let ip = IpAddr::from(i.wrapping_mul(2_654_435_761).to_be_bytes());
                assert_eq!(small.candidate_of(ip), big.candidate_of(ip), "{ip}: {big:?} -> {small:?}");
            }
        }
    }
}
