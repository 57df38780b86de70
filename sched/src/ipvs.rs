//! IPVS's per-connection schedulers, rule for rule (Linux
//! net/netfilter/ipvs/ip_vs_{rr,wrr,lc,wlc,sed,nq,lblc,lblcr}.c). A
//! destination with weight 0 or the overload flag takes no new connection.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::{Connection, Dest, Picker};

/// Round robin: the next available destination after the last one chosen.
#[derive(Default)]
pub struct Rr {
    last: Option<usize>,
}

impl Picker for Rr {
    fn pick(&mut self, dests: &[Dest], _: Connection) -> Option<usize> {
        let n = dests.len();
        let start = self.last.map_or(0, |l| l + 1);
        let found = (0..n).map(|k| (start + k) % n).find(|&i| dests[i].available())?;
        self.last = Some(found);
        Some(found)
    }
}

pub(crate) fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The gcd of the positive weights (IPVS's `ip_vs_wrr_gcd_weight`; 1 when none).
pub fn weight_gcd(dests: &[Dest]) -> u32 {
    dests.iter().map(|d| d.weight).filter(|&w| w > 0).fold(0, gcd).max(1)
}

/// Weighted round robin: the current weight `cw` starts at the largest
/// weight and drops by the weights' gcd after each pass over the list;
/// a pass picks, in list order, every destination whose weight is at
/// least `cw` (ip_vs_wrr.c: `mw`, `cw`, `di`).
#[derive(Default)]
pub struct Wrr {
    /// Position of the last pick (None: the list head).
    cl: Option<usize>,
    cw: i64,
    started: bool,
}

impl Picker for Wrr {
    fn pick(&mut self, dests: &[Dest], _: Connection) -> Option<usize> {
        let di = i64::from(weight_gcd(dests));
        let mw = i64::from(dests.iter().map(|d| d.weight).max().unwrap_or(0)) - (di - 1);
        if mw <= 0 {
            return None;
        }
        if !self.started {
            self.cw = mw;
            self.started = true;
        }
        // Every (position, cw) pair at most once: then every destination
        // was checked at every weight level, and all are overloaded.
        let mut pos = self.cl.map_or(0, |c| c + 1);
        for _ in 0..=(dests.len() as i64 * (mw / di + 1)) {
            if pos >= dests.len() {
                pos = 0;
                self.cw -= di;
                if self.cw <= 0 {
                    self.cw = mw;
                }
            }
            let d = &dests[pos];
            if !d.overloaded && i64::from(d.weight) >= self.cw {
                self.cl = Some(pos);
                return Some(pos);
            }
            pos += 1;
        }
        None
    }
}

/// The least of the available destinations by `better(candidate, least)`,
/// the first one winning ties (list order, as IPVS walks it).
pub fn least(dests: &[Dest], better: impl Fn(&Dest, &Dest) -> bool) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, d) in dests.iter().enumerate().filter(|(_, d)| d.available()) {
        if best.is_none_or(|b| better(d, &dests[b])) {
            best = Some(i);
        }
    }
    best
}

/// Least connection: the smallest overhead (active * 256 + inactive);
/// weights matter only in that 0 excludes.
pub struct Lc;

impl Picker for Lc {
    fn pick(&mut self, dests: &[Dest], _: Connection) -> Option<usize> {
        least(dests, |d, l| Cost::Lc.less(d, l))
    }
}

/// The least-connection schedulers' comparisons, as IPVS writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// overhead (active · 256 + inactive)
    Lc,
    /// overhead / weight
    Wlc,
    /// (active + 1) / weight
    Sed,
}

impl Cost {
    /// Whether `d` costs less than `l`.
    pub fn less(self, d: &Dest, l: &Dest) -> bool {
        match self {
            Cost::Lc => d.overhead() < l.overhead(),
            Cost::Wlc => weighted_less(d.overhead(), d, l.overhead(), l),
            Cost::Sed => weighted_less(sed_overhead(d), d, sed_overhead(l), l),
        }
    }
}

/// `loh / least.weight > doh / dest.weight`, in integers as IPVS writes it.
fn weighted_less(doh: u64, d: &Dest, loh: u64, l: &Dest) -> bool {
    u128::from(loh) * u128::from(d.weight) > u128::from(doh) * u128::from(l.weight)
}

/// Weighted least connection: the smallest overhead / weight.
pub struct Wlc;

impl Picker for Wlc {
    fn pick(&mut self, dests: &[Dest], _: Connection) -> Option<usize> {
        least(dests, |d, l| Cost::Wlc.less(d, l))
    }
}

/// Shortest expected delay: the smallest (active + 1) / weight.
pub struct Sed;

fn sed_overhead(d: &Dest) -> u64 {
    u64::from(d.active) + 1
}

impl Picker for Sed {
    fn pick(&mut self, dests: &[Dest], _: Connection) -> Option<usize> {
        least(dests, |d, l| Cost::Sed.less(d, l))
    }
}

/// Never queue: the first idle destination (no active connection); else
/// shortest expected delay.
pub struct Nq;

impl Picker for Nq {
    fn pick(&mut self, dests: &[Dest], c: Connection) -> Option<usize> {
        dests.iter().position(|d| d.available() && d.active == 0).or_else(|| Sed.pick(dests, c))
    }
}

/// lblc's and lblcr's overload test: more active connections than its
/// weight while some destination runs below half its weight.
fn lblc_overloaded(d: &Dest, dests: &[Dest]) -> bool {
    d.active > d.weight && dests.iter().any(|o| u64::from(o.active) * 2 < u64::from(o.weight))
}

/// Locality-based least connection: each destination address keeps the
/// server wlc gave it while that server is available and not overloaded.
#[derive(Default)]
pub struct Lblc {
    table: HashMap<IpAddr, (IpAddr, u16)>,
}

impl Picker for Lblc {
    fn pick(&mut self, dests: &[Dest], c: Connection) -> Option<usize> {
        if let Some(&(ip, port)) = self.table.get(&c.destination)
            && let Some(i) = dests.iter().position(|d| d.ip == ip && d.port == port)
            && dests[i].available()
            && !lblc_overloaded(&dests[i], dests)
        {
            return Some(i);
        }
        let i = Wlc.pick(dests, c)?;
        self.table.insert(c.destination, (dests[i].ip, dests[i].port));
        Some(i)
    }
}

/// Locality-based least connection with replication: each destination
/// address keeps a set of servers and uses its least loaded; an
/// overloaded choice adds wlc's pick to the set. (IPVS also drops the
/// most loaded member of a set unchanged for `lblcr_expiration`, 24 h by
/// default: `expire` does that on demand.)
#[derive(Default)]
pub struct Lblcr {
    sets: HashMap<IpAddr, Vec<(IpAddr, u16)>>,
}

impl Lblcr {
    /// Drops the most loaded member (overhead / weight, the first in
    /// set order on a tie, weight 0 skipped: `ip_vs_dest_set_max`) of
    /// every set with more than one.
    pub fn expire(&mut self, dests: &[Dest]) {
        for set in self.sets.values_mut().filter(|s| s.len() > 1) {
            let mut most: Option<usize> = None;
            for (k, m) in set.iter().enumerate() {
                let Some(d) = dests.iter().find(|d| (d.ip, d.port) == *m).filter(|d| d.weight > 0) else { continue };
                let more = most.is_none_or(|j| {
                    let o = dests.iter().find(|x| (x.ip, x.port) == set[j]).expect("a member");
                    // moh * dw < doh * mw: this one is more loaded.
                    u128::from(o.overhead()) * u128::from(d.weight) < u128::from(d.overhead()) * u128::from(o.weight)
                });
                if more {
                    most = Some(k);
                }
            }
            if let Some(at) = most {
                set.remove(at);
            }
        }
    }
}

impl Picker for Lblcr {
    fn pick(&mut self, dests: &[Dest], c: Connection) -> Option<usize> {
        let set = self.sets.entry(c.destination).or_default();
        set.retain(|m| dests.iter().any(|d| (d.ip, d.port) == *m));
        // ip_vs_dest_set_min: the least loaded (overhead / weight) member
        // with a positive weight and no overload flag.
        let members: Vec<usize> = set
            .iter()
            .filter_map(|m| dests.iter().position(|d| (d.ip, d.port) == *m))
            .filter(|&i| dests[i].available())
            .collect();
        let mut min: Option<usize> = None;
        for i in members {
            if min.is_none_or(|m| weighted_less(dests[i].overhead(), &dests[i], dests[m].overhead(), &dests[m])) {
                min = Some(i);
            }
        }
        match min {
            Some(i) if !lblc_overloaded(&dests[i], dests) => Some(i),
            _ => {
                let i = Wlc.pick(dests, c)?;
                let member = (dests[i].ip, dests[i].port);
                if !set.contains(&member) {
                    // ip_vs_dest_set_insert adds at the head.
                    set.insert(0, member);
                }
                Some(i)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dests(spec: &[(u32, u32, u32)]) -> Vec<Dest> {
        spec.iter()
            .enumerate()
            .map(|(i, &(weight, active, inactive))| Dest {
                ip: IpAddr::from([10, 0, 0, i as u8 + 1]),
                port: 80,
                weight,
                active,
                inactive,
                overloaded: false,
            })
            .collect()
    }

    fn conn(dst: u8) -> Connection {
        Connection { source: IpAddr::from([192, 168, 0, 1]), destination: IpAddr::from([10, 96, 0, dst]) }
    }

    fn picks(p: &mut dyn Picker, d: &[Dest], n: usize) -> Vec<Option<usize>> {
        (0..n).map(|_| p.pick(d, conn(1))).collect()
    }

    #[test]
    fn rr_rotates_and_skips_weight_zero_and_overloaded() {
        let mut d = dests(&[(1, 0, 0), (0, 0, 0), (1, 0, 0), (1, 0, 0)]);
        d[3].overloaded = true;
        assert_eq!(picks(&mut Rr::default(), &d, 5), [Some(0), Some(2), Some(0), Some(2), Some(0)]);
        let none = dests(&[(0, 0, 0), (0, 0, 0)]);
        assert_eq!(Rr::default().pick(&none, conn(1)), None);
    }

    #[test]
    fn wrr_follows_ipvs_weight_passes() {
        // Weights 4, 3, 2 (gcd 1): passes at cw = 4, 3, 2, 1 pick
        // {0}, {0,1}, {0,1,2}, {0,1,2}: 0 0 1 0 1 2 0 1 2, then again.
        let d = dests(&[(4, 0, 0), (3, 0, 0), (2, 0, 0)]);
        let got: Vec<_> = picks(&mut Wrr::default(), &d, 18).into_iter().map(Option::unwrap).collect();
        assert_eq!(got, [0, 0, 1, 0, 1, 2, 0, 1, 2, 0, 0, 1, 0, 1, 2, 0, 1, 2]);
        // 3:1 is A A A B; gcd 2 in 4:2 gives the same rhythm.
        let d = dests(&[(4, 0, 0), (2, 0, 0)]);
        let got: Vec<_> = picks(&mut Wrr::default(), &d, 6).into_iter().map(Option::unwrap).collect();
        assert_eq!(got, [0, 0, 1, 0, 0, 1]);
        // Weight 0 never; all overloaded: none.
        let d = dests(&[(0, 0, 0), (2, 0, 0)]);
        assert!(picks(&mut Wrr::default(), &d, 4).iter().all(|p| *p == Some(1)));
        let mut d = dests(&[(1, 0, 0), (2, 0, 0)]);
        d.iter_mut().for_each(|d| d.overloaded = true);
        assert_eq!(Wrr::default().pick(&d, conn(1)), None);
    }

    #[test]
    fn lc_counts_active_as_256_inactive() {
        // overheads: 1*256+0 = 256, 0*256+300 = 300, 1*256+10 = 266.
        let d = dests(&[(1, 1, 0), (1, 0, 300), (1, 1, 10)]);
        assert_eq!(Lc.pick(&d, conn(1)), Some(0));
        // Weight does not scale lc, but 0 excludes.
        let d = dests(&[(0, 0, 0), (9, 2, 0), (1, 1, 0)]);
        assert_eq!(Lc.pick(&d, conn(1)), Some(2));
        // Ties: the first in list order.
        let d = dests(&[(1, 1, 0), (1, 1, 0)]);
        assert_eq!(Lc.pick(&d, conn(1)), Some(0));
    }

    #[test]
    fn wlc_divides_overhead_by_weight() {
        // 2 active / weight 1 = 512; 5 active / weight 3 = 426.7: the second.
        let d = dests(&[(1, 2, 0), (3, 5, 0)]);
        assert_eq!(Wlc.pick(&d, conn(1)), Some(1));
        // 6 active / 3 = 512 ties 2 / 1 = 512: the first.
        let d = dests(&[(1, 2, 0), (3, 6, 0)]);
        assert_eq!(Wlc.pick(&d, conn(1)), Some(0));
        let mut d = dests(&[(1, 0, 0), (1, 5, 0)]);
        d[0].overloaded = true;
        assert_eq!(Wlc.pick(&d, conn(1)), Some(1));
    }

    #[test]
    fn sed_and_nq() {
        // sed: (1+1)/1 = 2 vs (4+1)/3 = 1.67: the second; inactive ignored.
        let d = dests(&[(1, 1, 0), (3, 4, 900)]);
        assert_eq!(Sed.pick(&d, conn(1)), Some(1));
        // nq: an idle destination wins whatever its weight.
        let d = dests(&[(5, 1, 0), (1, 0, 0), (9, 3, 0)]);
        assert_eq!(Nq.pick(&d, conn(1)), Some(1));
        assert_eq!(Sed.pick(&d, conn(1)), Some(0));
        // nq without an idle one is sed.
        let d = dests(&[(1, 1, 0), (3, 4, 0)]);
        assert_eq!(Nq.pick(&d, conn(1)), Some(1));
        // An idle one of weight 0 does not count.
        let d = dests(&[(0, 0, 0), (1, 2, 0), (2, 2, 0)]);
        assert_eq!(Nq.pick(&d, conn(1)), Some(2));
    }

    #[test]
    fn lblc_keeps_a_destination_until_overloaded() {
        let mut d = dests(&[(2, 0, 0), (2, 0, 0)]);
        let mut p = Lblc::default();
        assert_eq!(p.pick(&d, conn(1)), Some(0));
        d[0].active = 2; // not above its weight: kept
        assert_eq!(p.pick(&d, conn(1)), Some(0));
        d[0].active = 3; // above its weight, and the other runs below half: wlc again
        assert_eq!(p.pick(&d, conn(1)), Some(1));
        assert_eq!(p.pick(&d, conn(2)), Some(1), "a new destination address gets wlc's pick");
    }

    #[test]
    fn lblcr_grows_the_set_when_overloaded() {
        let mut d = dests(&[(2, 0, 0), (2, 0, 0)]);
        let mut p = Lblcr::default();
        assert_eq!(p.pick(&d, conn(1)), Some(0));
        d[0].active = 3;
        assert_eq!(p.pick(&d, conn(1)), Some(1), "overloaded: wlc's pick joins the set");
        d[1].active = 1;
        // the set's least loaded: 1/2 < 3/2
        assert_eq!(p.pick(&d, conn(1)), Some(1));
        p.expire(&d);
        d[1].active = 4;
        d[0].active = 0;
        // dest 0 was expired from the set; dest 1 is overloaded (4 > 2, dest 0 idle): wlc picks 0.
        assert_eq!(p.pick(&d, conn(1)), Some(0));
    }
}
