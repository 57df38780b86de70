//! nftables: one `nft -f -` transaction per sync and family; the table's
//! objects read back with `nft -j list table` (after a restart, for stale
//! objects) and deleted with the table on --cleanup.

use std::collections::BTreeSet;

use kpx_rules::model::IpFamily;
use kpx_rules::nftables::{Fam, TABLE};

use super::{Error, Exec, Result};

/// The chains, sets and maps of the kube-proxy table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Objects {
    pub chains: BTreeSet<String>,
    pub sets: BTreeSet<String>,
    pub maps: BTreeSet<String>,
}

pub struct NftablesKernel {
    family: IpFamily,
    exec: Box<dyn Exec>,
}

impl NftablesKernel {
    pub fn new(family: IpFamily, exec: Box<dyn Exec>) -> NftablesKernel {
        NftablesKernel { family, exec }
    }

    pub fn exec(&self) -> &dyn Exec {
        self.exec.as_ref()
    }

    /// Applies a transaction atomically.
    pub fn apply(&self, payload: &str) -> Result<()> {
        self.exec.run("nft", &["-f", "-"], Some(payload.as_bytes()))?;
        Ok(())
    }

    /// The table's objects; empty when the table does not exist.
    pub fn objects(&self) -> Result<Objects> {
        let family = Fam(self.family).name();
        match self.exec.run("nft", &["-j", "list", "table", family, TABLE], None) {
            Ok(json) => Ok(parse_objects(&json)),
            Err(Error::Failed { stderr, .. }) if stderr.contains("No such file") => Ok(Objects::default()),
            Err(e) => Err(e),
        }
    }
}

/// Chains, sets and maps named in `nft -j list table` output.
pub fn parse_objects(json: &str) -> Objects {
    let mut out = Objects::default();
    let Ok(value) = serde_json::from_str::<serde_json::Value>(json) else { return out };
    for item in value.get("nftables").and_then(|v| v.as_array()).into_iter().flatten() {
        for (kind, into) in [("chain", &mut out.chains), ("set", &mut out.sets), ("map", &mut out.maps)] {
            if let Some(name) = item.get(kind).and_then(|o| o.get("name")).and_then(|n| n.as_str()) {
                into.insert(name.to_string());
            }
        }
    }
    out
}

/// Appends deletes for objects the kernel holds and a full payload does
/// not declare (the payload flushes the table first, so they are unused).
pub fn with_stale_objects_removed(payload: &str, family: IpFamily, kernel: &Objects) -> String {
    let fam = Fam(family);
    let declared = |what: &str, name: &str| {
        payload.contains(&format!("{} {name} ", fam.cmd("add", what)))
            || payload.contains(&format!("{} {name}\n", fam.cmd("add", what)))
    };
    let mut out = payload.to_string();
    for (what, names) in [("chain", &kernel.chains), ("set", &kernel.sets), ("map", &kernel.maps)] {
        for name in names.iter().filter(|n| !declared(what, n)) {
            out.push_str(&format!("{} {name}\n", fam.cmd("delete", what)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_objects_and_deletes_stale_ones() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"table": {"family": "ip", "name": "kube-proxy"}},
            {"chain": {"family": "ip", "table": "kube-proxy", "name": "services"}},
            {"chain": {"family": "ip", "table": "kube-proxy", "name": "service-OLD-ns/x/tcp/p"}},
            {"map": {"family": "ip", "table": "kube-proxy", "name": "internal-7"}},
            {"set": {"family": "ip", "table": "kube-proxy", "name": "cluster-ips"}}]}"#;
        let objects = parse_objects(json);
        assert_eq!(objects.chains.len(), 2);
        let payload = "add chain ip kube-proxy services\nadd set ip kube-proxy cluster-ips { type ipv4_addr ; }\n";
        let out = with_stale_objects_removed(payload, IpFamily::V4, &objects);
        assert!(
            out.ends_with("delete chain ip kube-proxy service-OLD-ns/x/tcp/p\ndelete map ip kube-proxy internal-7\n"),
            "{out}"
        );
    }
}
