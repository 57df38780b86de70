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

use kpx_rules::model::{IpFamily, ProxyMode};

use crate::kernel::{Exec, Result};

/// Every extension's objects in `family` but those of `keep` in the
/// running mode (`--cleanup`: none kept), found by the names the host
/// gives them: tables `kpx-<name>`, chains `KUBE-X-<NAME>-*`. The
/// extensions removed.
pub fn remove(family: IpFamily, exec: &dyn Exec, mode: ProxyMode, keep: &[String]) -> Result<Vec<String>> {
    let keep_iptables: &[String] = if mode == ProxyMode::Iptables { keep } else { &[] };
    let keep_nftables: &[String] = if mode == ProxyMode::Nftables { keep } else { &[] };
    let mut names = std::collections::BTreeSet::new();
    let tool = if family == IpFamily::V4 { "iptables-save" } else { "ip6tables-save" };
    for table in ["mangle", "filter"] {
        // No iptables at all: nothing of ours there.
        let Ok(text) = exec.run(tool, &["-t", table], None) else { continue };
        names.extend(text.lines().filter_map(|l| {
            let chain = l.strip_prefix(":KUBE-X-")?.split_whitespace().next()?;
            ["-DISPATCH", "-FIREWALL", "-SERVICE"]
                .iter()
                .find_map(|s| chain.strip_suffix(s))
                .map(str::to_ascii_lowercase)
        }));
    }
    let mut removed: Vec<String> = Vec::new();
    names.retain(|n| !keep_iptables.contains(n));
    for name in &names {
        iptables::IptablesWriter::new(name, family, Box::new(crate::kernel::SystemExec::default())).cleanup()?;
        removed.push(name.clone());
    }
    let mut kernel = crate::kernel::nftables::NftablesKernel::new(family);
    if let Ok(tables) = kernel.table_names() {
        for table in tables.iter().filter(|t| t.starts_with("kpx-")) {
            let name = table.trim_start_matches("kpx-");
            if keep_nftables.iter().any(|k| k == name) {
                continue;
            }
            nftables::NftablesWriter::new(name, family).cleanup()?;
            if !removed.iter().any(|n| n == name) {
                removed.push(name.to_string());
            }
        }
    }
    Ok(removed)
}
