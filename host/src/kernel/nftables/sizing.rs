//! Set sizes. A hash set that fills in one transaction grows while it
//! fills: the kernel's rhashtable resizes in a worker, and an insert into
//! a table over its load spins in `rhashtable_insert_slow` until the
//! worker is done (about half of the kernel's time of a full sync at 10k
//! Services x 10 in a perf profile of kpx). A set declared with a size
//! gets a table for that size up front (the kernel's fixed-size hash), but
//! the size is also its maximum: the kernel refuses an element past it
//! (ENFILE), counting at every element added. So a full sync sizes the
//! large hash sets it fills, with as much room again ([`full_size`]), and
//! a partial sync that would fill a set past its size at any point is
//! written as a full one instead ([`Overfull`]). Small sets, interval sets
//! (whose backends take a size only as a limit) and the kernel-filled
//! affinity sets are not sized.

use std::collections::HashMap;

use kpx_rules::model::IpFamily;
use kpx_rules::ops::nftables::{Op, SetDecl, SetRef};

/// Sets a full sync fills with fewer elements are not sized: a small
/// table grows fast enough, and a sized one costs its buckets up front
/// (a few per-Service maps of 10k Services would hold megabytes of them).
pub const SIZED_FROM: u64 = 4096;
/// Nor are sets that would need a size past this (the kernel allocates the
/// table for the size when the set is made).
pub const MAX_SIZE: u64 = 1 << 24;

/// The size a full sync declares a set with for `n` elements: the one it
/// has (`previous`) while that leaves a quarter of room and is at most four
/// times what is needed, so that a full sync does not replace every set
/// whose count moved; else twice `n`, or none ([`SIZED_FROM`], [`MAX_SIZE`]).
pub fn full_size(n: u64, previous: Option<u32>) -> Option<u32> {
    if let Some(p) = previous.map(u64::from)
        && p >= n.saturating_add(n / 4)
        && p <= n.max(SIZED_FROM).saturating_mul(4)
    {
        return previous;
    }
    let want = n.saturating_mul(2);
    (n >= SIZED_FROM && want <= MAX_SIZE).then_some(want as u32)
}

/// Whether kpx may declare this set with a size.
pub fn sized(d: &SetDecl) -> bool {
    !d.interval && d.timeout_seconds.is_none()
}

/// A partial sync would put more elements in a set than its size allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("set {set} would hold {elements} elements, past its size of {size}: written as a full sync")]
pub struct Overfull {
    pub set: String,
    pub elements: u64,
    pub size: u32,
}

/// Each set's elements, and the most each held at any point of the
/// operations counted since [`Counts::begin`]: the kernel checks its
/// limit at every element added, against what the set holds then.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    held: HashMap<String, u64>,
    peak: HashMap<String, u64>,
}

impl Counts {
    /// A set's elements.
    pub fn held(&self, set: &str) -> u64 {
        self.held.get(set).copied().unwrap_or(0)
    }

    /// The most `set` held since [`Counts::begin`].
    pub fn peak(&self, set: &str) -> u64 {
        self.peak.get(set).copied().unwrap_or_else(|| self.held(set))
    }

    /// Starts a transaction's peaks from what the sets hold.
    pub fn begin(&mut self) {
        self.peak.clear();
    }

    /// Counts `ops` (a set's elements are whole strides of words, as the
    /// checks decode them; a set nobody declares is the checks' to refuse).
    pub fn apply(&mut self, family: IpFamily, ops: &[Op], decls: &dyn Fn(&SetRef) -> Option<SetDecl>) {
        for op in ops {
            let (set, held) = match op {
                Op::AddSet(d) => (d.name.as_str(), self.held(&d.name)),
                Op::FlushSet(s) => (s.as_str(), 0),
                Op::DeleteSet(s) => {
                    self.held.remove(s);
                    self.peak.remove(s);
                    continue;
                }
                Op::AddElements(e) | Op::DeleteElements(e) => {
                    let add = matches!(op, Op::AddElements(_));
                    let Some(decl) = decls(&e.set) else { continue };
                    let key = decl.key.iter().map(|k| k.words(family)).sum::<usize>();
                    let stride = key + if add { decl.data.map_or(0, |d| d.words(family)) } else { 0 };
                    let n = (e.words.len() / stride.max(1)) as u64;
                    let before = self.held(e.set.name());
                    (e.set.name(), if add { before.saturating_add(n) } else { before.saturating_sub(n) })
                }
                _ => continue,
            };
            let peak = self.peak(set).max(held);
            self.held.insert(set.to_string(), held);
            self.peak.insert(set.to_string(), peak);
        }
    }
}

/// The sizes of a full sync: each sized set declared in it, for the
/// elements it will hold ([`full_size`], from the size it has in the
/// kernel, if any).
pub fn full_sizes<'a>(
    decls: impl IntoIterator<Item = &'a SetDecl>,
    counts: &Counts,
    previous: &HashMap<String, u32>,
) -> HashMap<String, u32> {
    decls
        .into_iter()
        .filter(|d| sized(d))
        .filter_map(|d| Some((d.name.clone(), full_size(counts.held(&d.name), previous.get(&d.name).copied())?)))
        .collect()
}

/// The sizes after a partial sync: a set it declares anew sized for its
/// elements (one declared again keeps its size: the kernel keeps it), the
/// ones it deletes gone, the rest as they were; an error when a set would
/// hold more than its size at any point.
pub fn partial_sizes<'a>(
    before: &HashMap<String, u32>,
    ops: impl IntoIterator<Item = &'a Op>,
    counts: &Counts,
) -> Result<HashMap<String, u32>, Overfull> {
    let mut sizes = before.clone();
    for op in ops {
        match op {
            Op::AddSet(d) if sized(d) && !sizes.contains_key(&d.name) => {
                if let Some(size) = full_size(counts.held(&d.name), None) {
                    sizes.insert(d.name.clone(), size);
                }
            }
            Op::DeleteSet(s) => {
                sizes.remove(s);
            }
            _ => {}
        }
    }
    for (set, &size) in &sizes {
        let elements = counts.peak(set);
        if elements > u64::from(size) {
            return Err(Overfull { set: set.clone(), elements, size });
        }
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::ops::nftables::{DataType, ElementWriter, HostSet, KeyType};

    fn decl(name: &str) -> SetDecl {
        SetDecl {
            name: name.into(),
            key: vec![KeyType::Integer],
            data: Some(DataType::Endpoint),
            interval: false,
            timeout_seconds: None,
            comment: None,
        }
    }

    fn adds(name: &str, n: u32) -> Op {
        let mut w = ElementWriter::new(IpFamily::V4, SetRef::Own(name.into()));
        for i in 0..n {
            w.word(i).endpoint("10.1.0.5".parse().unwrap(), 8080);
        }
        Op::AddElements(w.finish())
    }

    fn deletes(name: &str, n: u32) -> Op {
        let mut w = ElementWriter::new(IpFamily::V4, SetRef::Own(name.into()));
        for i in 0..n {
            w.word(i);
        }
        Op::DeleteElements(w.finish())
    }

    #[test]
    fn sizes_leave_room_keep_a_fitting_size_and_skip_small_and_huge_sets() {
        assert_eq!(full_size(100, None), None);
        assert_eq!(full_size(100_000, None), Some(200_000));
        assert_eq!(full_size(MAX_SIZE, None), None);
        // A size with a quarter of room, at most four times the need, stays.
        assert_eq!(full_size(150_000, Some(200_000)), Some(200_000));
        assert_eq!(full_size(170_000, Some(200_000)), Some(340_000));
        assert_eq!(full_size(40_000, Some(200_000)), Some(80_000));
        // A set that shrank below the threshold keeps a size that still fits.
        assert_eq!(full_size(3000, Some(8192)), Some(8192));
        assert_eq!(full_size(10, Some(200_000)), None);
        let mut interval = decl("i");
        interval.interval = true;
        let mut affinity = decl("a");
        affinity.timeout_seconds = Some(10800);
        assert!(sized(&decl("m")) && !sized(&interval) && !sized(&affinity));
    }

    #[test]
    fn counts_follow_adds_deletes_and_flushes_by_stride_with_their_peak() {
        let m = decl("m");
        let decls = |r: &SetRef| (r.name() == "m").then(|| m.clone());
        let mut counts = Counts::default();
        // An element added is a key word and three endpoint words; one
        // deleted is its key word only.
        counts.apply(IpFamily::V4, &[Op::AddSet(m.clone()), adds("m", 3000), deletes("m", 1000)], &decls);
        assert_eq!((counts.held("m"), counts.peak("m")), (2000, 3000));
        counts.begin();
        assert_eq!(counts.peak("m"), 2000);
        counts.apply(IpFamily::V4, &[Op::FlushSet("m".into())], &decls);
        assert_eq!((counts.held("m"), counts.peak("m")), (0, 2000));
        counts.apply(IpFamily::V4, &[Op::DeleteSet("m".into())], &decls);
        assert_eq!(counts, Counts::default());
        // A set nobody declared is not counted (the checks refuse it).
        let host = Op::AddElements(ElementWriter::new(IpFamily::V4, SetRef::Host(HostSet::ClusterIps)).finish());
        counts.apply(IpFamily::V4, &[host], &decls);
        assert_eq!(counts, Counts::default());
    }

    #[test]
    fn a_partial_sync_past_a_size_at_any_point_is_refused_and_a_new_set_is_sized() {
        let m = decl("m");
        let decls = |r: &SetRef| Some(decl(r.name()));
        let mut counts = Counts::default();
        counts.apply(IpFamily::V4, &[Op::AddSet(m.clone()), adds("m", 6000)], &decls);
        let sizes = full_sizes([&m], &counts, &HashMap::new());
        assert_eq!(sizes["m"], 12_000);
        let partial = |ops: &[Op]| {
            let mut c = counts.clone();
            c.begin();
            c.apply(IpFamily::V4, ops, &decls);
            partial_sizes(&sizes, ops, &c)
        };
        // 6000 more fit in 12000; 6001 do not.
        assert_eq!(partial(&[adds("m", 6000)]), Ok(sizes.clone()));
        assert_eq!(partial(&[adds("m", 6001)]), Err(Overfull { set: "m".into(), elements: 12_001, size: 12_000 }));
        // Adds before deletes: the kernel counts the adds first.
        assert!(partial(&[adds("m", 6001), deletes("m", 5000)]).is_err());
        assert!(partial(&[deletes("m", 5000), adds("m", 6001)]).is_ok());
        // Declared again, a set keeps its size (the kernel keeps it).
        let again = [Op::AddSet(m.clone()), adds("m", 6001)];
        assert_eq!(partial(&again).unwrap_err().size, 12_000);
        // A set a partial sync declares is sized for what it adds.
        let new = [Op::AddSet(decl("n")), adds("n", 5000)];
        assert_eq!(partial(&new).unwrap()["n"], 10_000);
    }
}
