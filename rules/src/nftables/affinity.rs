//! ClientIP affinity needs per-endpoint state, so an affinity Service gets
//! upstream's own objects: a `service-` (cluster endpoints) and a `local-`
//! chain, an `endpoint-` chain and an `affinity-` set (dynamic, with the
//! Service's timeout) per endpoint, and a `slots-` map per choice chain
//! (upstream uses an anonymous verdict map; the contract has named maps
//! only). The select chains reach them through the `affinity-<purpose>`
//! maps.

use sha2::{Digest, Sha256};

use super::elements::source_key;
use crate::model::{Endpoint, IpFamily, ServicePort};
use crate::ops::nftables::{
    DataType, ElementWriter, Elements, KeyExpr, KeyType, Match, Op, Rule, SetDecl, SetRef, Statement, Verdict,
    VerdictKind,
};

/// A Service's own chains, sets, maps and their contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Objects {
    pub chains: Vec<String>,
    pub sets: Vec<SetDecl>,
    pub rules: Vec<Rule>,
    /// Elements of its slot maps.
    pub elements: Vec<Elements>,
}

impl Objects {
    /// Declarations: chains, then sets and maps.
    pub fn declarations(&self) -> impl Iterator<Item = Op> + '_ {
        self.chains.iter().map(|c| Op::AddChain(c.clone())).chain(self.sets.iter().map(|s| Op::AddSet(s.clone())))
    }

    /// What makes the objects empty, so that they can be rewritten or
    /// deleted: flushed chains and slot maps.
    pub fn flushes(&self) -> impl Iterator<Item = Op> + '_ {
        self.chains
            .iter()
            .map(|c| Op::FlushChain(c.clone()))
            .chain(self.sets.iter().filter(|s| s.timeout_seconds.is_none()).map(|s| Op::FlushSet(s.name.clone())))
    }

    /// Deletes what `self` has and `new` lacks (or declares differently);
    /// the objects must have been flushed and their map elements deleted first.
    pub fn stale_against<'a>(&'a self, new: &'a Objects) -> impl Iterator<Item = Op> + 'a {
        let chains = self.chains.iter().filter(|c| !new.chains.contains(c)).map(|c| Op::DeleteChain(c.clone()));
        let sets = self.sets.iter().filter(|s| !new.sets.contains(s)).map(|s| Op::DeleteSet(s.name.clone()));
        chains.chain(sets)
    }
}

/// upstream's `hashAndTruncate`: base32(sha256(name))[:8] + "-" + name.
pub fn hashed(prefix: &str, name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut hash = data_encoding::BASE32.encode(&digest);
    hash.truncate(8);
    let mut out = format!("{prefix}{hash}-{name}");
    out.truncate(crate::ops::nftables::MAX_NAME);
    out
}

pub struct Chains {
    pub cluster: String,
    pub local: String,
    pub objects: Objects,
}

/// The objects of one affinity Service.
pub fn chains(family: IpFamily, svc: &ServicePort, cluster_eps: &[&Endpoint], local_eps: &[&Endpoint]) -> Chains {
    let base = format!("{}/{}/{}/{}", svc.namespace, svc.name, svc.protocol, svc.port_name);
    let cluster = hashed("service-", &base);
    let local = hashed("local-", &base);
    let endpoint_base = |ep: &Endpoint| format!("{base}__{}/{}", ep.ip, ep.port);
    let endpoint_chain = |ep: &Endpoint| hashed("endpoint-", &endpoint_base(ep));
    let affinity_set = |ep: &Endpoint| hashed("affinity-", &endpoint_base(ep));
    let mut o = Objects::default();
    let mut endpoints: Vec<&Endpoint> = cluster_eps.iter().chain(local_eps).copied().collect();
    endpoints.sort_by_key(|e| (e.ip, e.port));
    endpoints.dedup_by_key(|e| (e.ip, e.port));
    for ep in &endpoints {
        let chain = endpoint_chain(ep);
        let set = affinity_set(ep);
        o.sets.push(SetDecl::affinity(&set, svc.affinity_timeout_seconds));
        o.rules.push(Rule::new(&chain).statement(Statement::AffinityUpdate(set)));
        o.rules.push(
            Rule::new(&chain)
                .with(Match::Protocol { negate: false, protocol: svc.protocol })
                .verdict(Verdict::Dnat(ep.ip, ep.port)),
        );
        o.chains.push(chain);
    }
    for (chain, slots_prefix, eps) in [(&cluster, "slots-", cluster_eps), (&local, "local-slots-", local_eps)] {
        if eps.is_empty() {
            continue;
        }
        o.chains.push(chain.clone());
        for ep in eps {
            o.rules.push(
                Rule::new(chain)
                    .with(Match::Lookup { keys: source_key(), set: SetRef::Own(affinity_set(ep)), negate: false })
                    .verdict(Verdict::Goto(endpoint_chain(ep))),
            );
        }
        let slots = hashed(slots_prefix, &base);
        o.sets.push(SetDecl {
            name: slots.clone(),
            key: vec![KeyType::Integer],
            data: Some(DataType::Verdict),
            interval: false,
            timeout_seconds: None,
            comment: None,
        });
        let mut writer = ElementWriter::new(family, SetRef::Own(slots.clone()));
        for (i, ep) in eps.iter().enumerate() {
            writer.word(i as u32).verdict(VerdictKind::Goto, Some(&endpoint_chain(ep)));
        }
        o.elements.push(writer.finish());
        o.rules.push(
            Rule::new(chain).verdict(Verdict::Vmap {
                keys: vec![KeyExpr::NumgenRandom(eps.len() as u32)],
                map: SetRef::Own(slots),
            }),
        );
    }
    Chains { cluster, local, objects: o }
}
