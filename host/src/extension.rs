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

/// Every extension's objects in `family` but those of `keep` in the
/// running mode (`--cleanup`: none kept), found by the names the host
/// gives them: tables `kpx-<name>`, chains `KUBE-X-<NAME>-*`. The
/// extensions removed.
pub fn remove(family: IpFamily, backend: Backend, mode: ProxyMode, keep: &[String]) -> Result<Vec<String>> {
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
    let (mut removed, mut first_error) = (Vec::new(), None);
    for name in &names {
        match iptables::IptablesWriter::new(name, family, exec()).with_backend(backend).cleanup() {
            Ok(_) => removed.push(name.clone()),
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
                Ok(_) if !removed.iter().any(|n| n == name) => removed.push(name.to_string()),
                Ok(_) => {}
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(removed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
