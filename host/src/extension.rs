//! Extensions: vendors' additions to the proxy's behaviour, run beside a
//! rule mode's backend. An extension component returns what it wants
//! done to new connections to Service ports (`kpx_rules::ops::extension`);
//! the host checks it ([`crate::validate::extension`]), lays it out
//! ([`layout`]) and writes it in objects of the extension's own
//! ([`iptables`], [`nftables`]), then reads its counters for /metrics.

pub mod iptables;
pub mod layout;
pub mod nftables;
pub mod proxier;

pub use proxier::{Configured, ExtensionProxier};

/// Packets read from the kernel per counting object (an nftables counter
/// object, an iptables counter chain): object to (counter id, packets).
pub type RawCounts = std::collections::BTreeMap<String, (String, u64)>;

/// What each object counted since the last read (`last`, which becomes
/// `now`): a count the kernel started again (an object made anew) adds
/// all it holds. Per counter id.
pub fn advance(last: &mut RawCounts, now: RawCounts) -> std::collections::BTreeMap<String, u64> {
    let mut out: std::collections::BTreeMap<String, u64> = Default::default();
    for (object, (id, packets)) in &now {
        let before = last.get(object).filter(|(i, _)| i == id).map_or(0, |(_, p)| *p);
        let delta = if *packets >= before { packets - before } else { *packets };
        *out.entry(id.clone()).or_default() += delta;
    }
    *last = now;
    out
}

use kpx_rules::model::{IpFamily, ProxyMode};

use crate::kernel::iptables::backend::Backend;
use crate::kernel::{Exec, Result};

/// The extensions whose objects [`remove`] removed, by why they went.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    /// Extensions not configured (any more): all their objects, of either
    /// rule mode.
    pub unconfigured: Vec<String>,
    /// Extensions still configured, each with the mode whose objects of
    /// theirs were removed: left from a run in that mode (kpx now runs in
    /// the other), while their objects of the running mode stay.
    pub other_mode: Vec<(String, ProxyMode)>,
}

impl Removed {
    /// Sorts the extensions whose iptables chains and nftables tables were
    /// removed by whether `keep` configures them.
    fn sort(keep: &[String], iptables: Vec<String>, nftables: Vec<String>) -> Removed {
        let mut out = Removed::default();
        for (mode, names) in [(ProxyMode::Iptables, iptables), (ProxyMode::Nftables, nftables)] {
            for name in names {
                if keep.contains(&name) {
                    out.other_mode.push((name, mode));
                } else if !out.unconfigured.contains(&name) {
                    out.unconfigured.push(name);
                }
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.unconfigured.is_empty() && self.other_mode.is_empty()
    }
}

/// Every extension's objects in `family` but those of `keep` in the
/// running mode (`--cleanup`: none kept), found by the names the host
/// gives them: tables `kpx-<name>`, chains `KUBE-X-<NAME>-*`. A kept
/// extension's objects of the other mode go too (kpx ran in that mode
/// before): [`Removed`] tells them from those of extensions no longer
/// configured.
pub fn remove(family: IpFamily, backend: Backend, mode: ProxyMode, keep: &[String]) -> Result<Removed> {
    let keep_iptables: &[String] = if mode == ProxyMode::Iptables { keep } else { &[] };
    let keep_nftables: &[String] = if mode == ProxyMode::Nftables { keep } else { &[] };
    let exec = || Box::new(crate::kernel::SystemExec::default());
    let mut names = std::collections::BTreeSet::new();
    let tool = backend.tool(family, "iptables-save");
    for table in ["mangle", "filter"] {
        // No iptables at all: nothing of ours there.
        let Ok(text) = exec().run(&tool, &["-t", table], None) else { continue };
        names.extend(text.lines().filter_map(|l| {
            let chain = l.strip_prefix(":KUBE-X-")?.split_whitespace().next()?;
            ["-DISPATCH", "-FIREWALL", "-SERVICE"]
                .iter()
                .find_map(|s| chain.strip_suffix(s))
                .map(str::to_ascii_lowercase)
        }));
    }
    // Only names kpx could have given.
    names.retain(|n| !keep_iptables.contains(n) && crate::runtime::extension::name_problem(n).is_none());
    // One extension's failure does not keep the others' objects.
    let (mut iptables_removed, mut nftables_removed, mut first_error) = (Vec::new(), Vec::new(), None);
    for name in &names {
        match iptables::IptablesWriter::new(name, family, exec()).with_backend(backend).cleanup() {
            Ok(_) => iptables_removed.push(name.clone()),
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    let mut kernel = crate::kernel::nftables::NftablesKernel::new(family);
    if let Ok(tables) = kernel.table_names() {
        for name in tables.iter().filter_map(|t| t.strip_prefix("kpx-")) {
            if keep_nftables.iter().any(|k| k == name) || crate::runtime::extension::name_problem(name).is_some() {
                continue;
            }
            match nftables::NftablesWriter::new(name, family).cleanup() {
                Ok(_) => nftables_removed.push(name.to_string()),
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(Removed::sort(keep, iptables_removed, nftables_removed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mode switch removes the other mode's objects of an extension
    /// still configured: said apart from an extension no longer
    /// configured, whose objects of both modes go (named once).
    #[test]
    fn removed_objects_are_told_apart_by_why_they_went() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let keep = names(&["srcblock", "count"]);
        // Now in nftables mode: srcblock's iptables chains are iptables mode's leftovers.
        let r = Removed::sort(&keep, names(&["old", "srcblock"]), names(&["old", "gone"]));
        assert_eq!(r.unconfigured, ["old", "gone"]);
        assert_eq!(r.other_mode, [("srcblock".to_string(), ProxyMode::Iptables)]);
        // Now in iptables mode: count's nftables table is nftables mode's.
        let r = Removed::sort(&keep, Vec::new(), names(&["count"]));
        assert!(r.unconfigured.is_empty());
        assert_eq!(r.other_mode, [("count".to_string(), ProxyMode::Nftables)]);
        // --cleanup keeps nothing: every extension removed is unconfigured.
        let r = Removed::sort(&[], names(&["srcblock"]), names(&["srcblock"]));
        assert_eq!((r.unconfigured, r.other_mode), (names(&["srcblock"]), Vec::new()));
        assert!(Removed::sort(&keep, Vec::new(), Vec::new()).is_empty());
    }

    fn raw(entries: &[(&str, &str, u64)]) -> RawCounts {
        entries.iter().map(|(o, i, p)| (o.to_string(), (i.to_string(), *p))).collect()
    }

    #[test]
    fn counts_only_grow_whatever_the_kernel_restarts() {
        let mut last = RawCounts::new();
        assert_eq!(advance(&mut last, raw(&[("a", "x", 5), ("b", "x", 3)]))["x"], 8);
        assert_eq!(advance(&mut last, raw(&[("a", "x", 7), ("b", "x", 3)]))["x"], 2);
        // b made anew (an action changed): its 1 counts, a's 0 new.
        assert_eq!(advance(&mut last, raw(&[("a", "x", 7), ("b", "x", 1)]))["x"], 1);
        // b gone (its chain deleted): a alone goes on.
        assert_eq!(advance(&mut last, raw(&[("a", "x", 9)]))["x"], 2);
        // A counter of another id is its own.
        assert_eq!(
            advance(&mut last, raw(&[("a", "x", 9), ("c", "y", 4)])),
            [("x".to_string(), 0), ("y".to_string(), 4)].into()
        );
    }
}
