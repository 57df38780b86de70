//! ClientIP affinity needs per-endpoint state, so an affinity Service gets
//! upstream's own objects: a `service-` (cluster endpoints) and a `local-`
//! chain, an `endpoint-` chain and an `affinity-` set (dynamic, with the
//! Service's timeout) per endpoint. The select chains reach them through
//! the `affinity-<purpose>` verdict maps.

use sha2::{Digest, Sha256};

use super::Fam;
use crate::model::{Endpoint, ServicePort};

/// A Service's own chains and sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    pub chains: Vec<String>,
    /// (name, its `add set` command)
    pub sets: Vec<(String, String)>,
    pub rules: Vec<String>,
}

impl Objects {
    /// `add chain` / `add set` commands.
    pub fn declarations(&self, fam: Fam) -> Vec<String> {
        let mut out: Vec<String> = self.chains.iter().map(|c| format!("{} {c}", fam.cmd("add", "chain"))).collect();
        out.extend(self.sets.iter().map(|(_, decl)| decl.clone()));
        out
    }

    /// `flush chain` commands, so a chain can be rewritten or deleted.
    pub fn flushes(&self, fam: Fam) -> Vec<String> {
        self.chains.iter().map(|c| format!("{} {c}", fam.cmd("flush", "chain"))).collect()
    }

    /// Deletes what `self` has and `new` lacks (or declares differently);
    /// chains must have been flushed and their map elements deleted first.
    pub fn stale_against(&self, new: &Objects, fam: Fam) -> Vec<String> {
        let mut out = Vec::new();
        for c in self.chains.iter().filter(|c| !new.chains.contains(c)) {
            out.push(format!("{} {c}", fam.cmd("delete", "chain")));
        }
        for (name, decl) in &self.sets {
            if !new.sets.iter().any(|(n, d)| n == name && d == decl) {
                out.push(format!("{} {name}", fam.cmd("delete", "set")));
            }
        }
        out
    }
}

/// upstream's `hashAndTruncate`: base32(sha256(name))[:8] + "-" + name.
pub fn hashed(prefix: &str, name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut hash = data_encoding::BASE32.encode(&digest);
    hash.truncate(8);
    let mut out = format!("{prefix}{hash}-{name}");
    out.truncate(200);
    out
}

pub struct Chains {
    pub cluster: String,
    pub local: String,
    pub objects: Objects,
}

/// The objects of one affinity Service.
pub fn chains(fam: Fam, svc: &ServicePort, cluster_eps: &[&Endpoint], local_eps: &[&Endpoint]) -> Chains {
    let base = format!("{}/{}/{}/{}", svc.namespace, svc.name, svc.protocol, svc.port_name);
    let cluster = hashed("service-", &base);
    let local = hashed("local-", &base);
    let endpoint_base = |ep: &Endpoint| format!("{base}__{}/{}", ep.ip, ep.port);
    let mut o = Objects::default();
    let family = fam.name();
    let mut endpoints: Vec<&Endpoint> = cluster_eps.iter().chain(local_eps).copied().collect();
    endpoints.sort_by_key(|e| (e.ip, e.port));
    endpoints.dedup_by_key(|e| (e.ip, e.port));
    for ep in &endpoints {
        let chain = hashed("endpoint-", &endpoint_base(ep));
        let set = hashed("affinity-", &endpoint_base(ep));
        o.sets.push((
            set.clone(),
            format!(
                "{} {set} {{ type {} ; flags dynamic,timeout ; timeout {}s ; }}",
                fam.cmd("add", "set"),
                fam.addr_type(),
                svc.affinity_timeout_seconds
            ),
        ));
        o.rules.push(format!("{} {chain} update @{set} {{ {family} saddr }}", fam.cmd("add", "rule")));
        o.rules.push(format!(
            "{} {chain} meta l4proto {} dnat {family} to {}",
            fam.cmd("add", "rule"),
            svc.protocol,
            ep.host_port()
        ));
        o.chains.push(chain);
    }
    for (chain, eps) in [(&cluster, cluster_eps), (&local, local_eps)] {
        if eps.is_empty() {
            continue;
        }
        o.chains.push(chain.clone());
        for ep in eps {
            let set = hashed("affinity-", &endpoint_base(ep));
            let target = hashed("endpoint-", &endpoint_base(ep));
            o.rules.push(format!("{} {chain} {family} saddr @{set} goto {target}", fam.cmd("add", "rule")));
        }
        let slots: Vec<String> = eps
            .iter()
            .enumerate()
            .map(|(i, ep)| format!("{i} : goto {}", hashed("endpoint-", &endpoint_base(ep))))
            .collect();
        o.rules.push(format!(
            "{} {chain} numgen random mod {} vmap {{ {} }}",
            fam.cmd("add", "rule"),
            eps.len(),
            slots.join(", ")
        ));
    }
    Chains { cluster, local, objects: o }
}
