//! Set sizes. A hash set that fills in one transaction grows while it
//! fills: the kernel's rhashtable resizes in a worker, and an insert into
//! a table over its load spins in `rhashtable_insert_slow` until the
//! worker is done (about half of the kernel's time of a full sync at 10k
//! Services x 10 in a perf profile of kpx). A set declared with a size
//! gets its table for that size up front, but the size is also its
//! maximum: the kernel refuses an element past it (ENFILE). So kpx sizes
//! the hash sets at each full sync from the elements it writes, with as
//! much room again, and a partial sync that would fill a set past its size
//! is written as a full one instead ([`Overfull`]). Interval sets (whose
//! backends take a size only as a limit) and the kernel-filled affinity
//! sets are not sized.

use std::collections::HashMap;

use kpx_rules::model::IpFamily;
use kpx_rules::ops::nftables::{Op, SetDecl, SetRef};

/// The smallest size declared: a set that starts empty takes some
/// partial syncs' worth of elements before it needs a full sync.
pub const MIN_SIZE: u32 = 1024;
/// The largest: far past any cluster (the kernel allocates the table for it).
pub const MAX_SIZE: u32 = 1 << 26;

/// The size a set is declared with to hold `n` elements: room for as
/// many again, at least [`MIN_SIZE`].
pub fn size_for(n: u64) -> u32 {
    n.saturating_mul(2).clamp(u64::from(MIN_SIZE), u64::from(MAX_SIZE)) as u32
}

/// Whether kpx declares this set with a size.
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

/// Each set's elements after `ops`, from `counts` before them (a set's
/// elements are whole strides of words, as the checks decode them).
pub fn count(
    counts: &mut HashMap<String, u64>,
    family: IpFamily,
    ops: &[Op],
    decls: &dyn Fn(&SetRef) -> Option<SetDecl>,
) {
    for op in ops {
        match op {
            Op::AddSet(d) => {
                counts.entry(d.name.clone()).or_insert(0);
            }
            Op::FlushSet(s) => {
                counts.insert(s.clone(), 0);
            }
            Op::DeleteSet(s) => {
                counts.remove(s);
            }
            Op::AddElements(e) | Op::DeleteElements(e) => {
                let add = matches!(op, Op::AddElements(_));
                let Some(decl) = decls(&e.set) else { continue };
                let key = decl.key.iter().map(|k| k.words(family)).sum::<usize>();
                let stride = key + if add { decl.data.map_or(0, |d| d.words(family)) } else { 0 };
                let n = (e.words.len() / stride.max(1)) as u64;
                let held = counts.entry(e.set.name().to_string()).or_insert(0);
                *held = if add { held.saturating_add(n) } else { held.saturating_sub(n) };
            }
            _ => {}
        }
    }
}

/// The sizes of a full sync: each sized set declared in `ops` for the
/// elements it will hold.
pub fn full_sizes<'a>(
    decls: impl IntoIterator<Item = &'a SetDecl>,
    counts: &HashMap<String, u64>,
) -> HashMap<String, u32> {
    decls
        .into_iter()
        .filter(|d| sized(d))
        .map(|d| (d.name.clone(), size_for(counts.get(&d.name).copied().unwrap_or(0))))
        .collect()
}

/// The sizes after a partial sync: the sets it declares sized for their
/// elements, the ones it deletes gone, the rest as they were; an error
/// when a set would hold more than its size.
pub fn partial_sizes(
    before: &HashMap<String, u32>,
    ops: &[Op],
    counts: &HashMap<String, u64>,
) -> Result<HashMap<String, u32>, Overfull> {
    let mut sizes = before.clone();
    for op in ops {
        match op {
            Op::AddSet(d) if sized(d) => {
                sizes.insert(d.name.clone(), size_for(counts.get(&d.name).copied().unwrap_or(0)));
            }
            Op::DeleteSet(s) => {
                sizes.remove(s);
            }
            _ => {}
        }
    }
    for (set, &size) in &sizes {
        let elements = counts.get(set).copied().unwrap_or(0);
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
    fn sizes_leave_room_for_as_many_again_within_bounds() {
        assert_eq!(size_for(0), MIN_SIZE);
        assert_eq!(size_for(100_000), 200_000);
        assert_eq!(size_for(u64::MAX), MAX_SIZE);
        let mut interval = decl("i");
        interval.interval = true;
        let mut affinity = decl("a");
        affinity.timeout_seconds = Some(10800);
        assert!(sized(&decl("m")) && !sized(&interval) && !sized(&affinity));
    }

    #[test]
    fn counts_follow_adds_deletes_and_flushes_by_stride() {
        let m = decl("m");
        let decls = |r: &SetRef| (r.name() == "m").then(|| m.clone());
        let mut counts = HashMap::new();
        // An element added is a key word and three endpoint words; one
        // deleted is its key word only.
        count(&mut counts, IpFamily::V4, &[Op::AddSet(m.clone()), adds("m", 3000), deletes("m", 1000)], &decls);
        assert_eq!(counts["m"], 2000);
        count(&mut counts, IpFamily::V4, &[Op::FlushSet("m".into())], &decls);
        assert_eq!(counts["m"], 0);
        count(&mut counts, IpFamily::V4, &[Op::DeleteSet("m".into())], &decls);
        assert!(counts.is_empty());
        // A set nobody declared is not counted (the checks refuse it).
        let host = Op::AddElements(ElementWriter::new(IpFamily::V4, SetRef::Host(HostSet::ClusterIps)).finish());
        count(&mut counts, IpFamily::V4, &[host], &decls);
        assert!(counts.is_empty());
    }

    #[test]
    fn a_partial_sync_past_a_size_is_refused_and_a_new_set_is_sized() {
        let m = decl("m");
        let decls = |r: &SetRef| (r.name() == "m" || r.name() == "n").then(|| decl(r.name()));
        let mut counts = HashMap::new();
        let full = [Op::AddSet(m.clone()), adds("m", 600)];
        count(&mut counts, IpFamily::V4, &full, &decls);
        let sizes = full_sizes([&m], &counts);
        assert_eq!(sizes["m"], 1200);
        // 600 more fit in 1200; 601 do not.
        let mut fits = counts.clone();
        count(&mut fits, IpFamily::V4, &[adds("m", 600)], &decls);
        assert_eq!(partial_sizes(&sizes, &[], &fits), Ok(sizes.clone()));
        let mut over = counts.clone();
        count(&mut over, IpFamily::V4, &[adds("m", 601)], &decls);
        assert_eq!(partial_sizes(&sizes, &[], &over), Err(Overfull { set: "m".into(), elements: 1201, size: 1200 }));
        // A set a partial sync declares is sized for what it adds.
        let new = [Op::AddSet(decl("n")), adds("n", 5000)];
        let mut grown = counts.clone();
        count(&mut grown, IpFamily::V4, &new, &decls);
        assert_eq!(partial_sizes(&sizes, &new, &grown).unwrap()["n"], 10_000);
    }
}
