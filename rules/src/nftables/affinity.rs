//! A Service with ClientIP affinity or a plan of its own (a rotation or a
//! slot table: state or a key no shared map can hold) gets upstream's own
//! objects: a `service-` (cluster endpoints) and a `local-` chain, an
//! `endpoint-` chain per endpoint and, with affinity, an `affinity-` set
//! (dynamic, with the Service's timeout) per endpoint; and a `slots-` map
//! per choice chain (upstream uses an anonymous verdict map; the contract
//! has named maps only). The select chains reach them through the
//! `affinity-<purpose>` maps.
//!
//! The choice rule executes the plan: `numgen random mod N` (uniform, or
//! the weights as slots), `numgen inc mod len` (a rotation: the counter is
//! this rule's own), or `jhash` of the address into the slot table
//! (`jhash . jhash` for a table of several rows).

use sha2::{Digest, Sha256};

use crate::model::{Endpoint, HashField, IpFamily, Plan, ProxyMode, ServicePort};
use crate::ops::nftables::AddressField;
use crate::ops::nftables::{
    DataType, ElementWriter, Elements, KeyExpr, Match, Op, Rule, SetDecl, SetRef, Statement, Verdict, VerdictKind,
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

/// Whether a plan needs the Service's own chains.
pub fn needs_own_chains(plan: Option<&Plan>) -> bool {
    matches!(plan, Some(Plan::Sequence(_) | Plan::Slots(_)))
}

/// The choice rule's key and the slot map's contents (slot key, candidate)
/// for a plan over `n` candidates.
fn choice(plan: Option<&Plan>, n: usize) -> (Vec<KeyExpr>, Vec<(Vec<u32>, usize)>) {
    match plan.filter(|p| !p.is_uniform(n) && p.check(n).is_ok() && p.runs_in(ProxyMode::Nftables)) {
        Some(Plan::Weighted(w)) => {
            let slots = weighted_slots(w);
            (
                vec![KeyExpr::NumgenRandom(slots.len() as u32)],
                slots.into_iter().enumerate().map(|(j, c)| (vec![j as u32], c)).collect(),
            )
        }
        Some(Plan::Sequence(s)) => (
            vec![KeyExpr::NumgenIncrement(s.len() as u32)],
            s.iter().enumerate().map(|(k, &c)| (vec![k as u32], c as usize)).collect(),
        ),
        Some(Plan::Slots(t)) => {
            let field = match t.field {
                HashField::Source => AddressField::Source,
                HashField::Destination => AddressField::Destination,
            };
            let cols = usize::from(t.cols);
            let col = KeyExpr::Jhash { field, modulus: u32::from(t.cols), seed: t.seed };
            if t.rows > 1 {
                let row = KeyExpr::Jhash { field, modulus: u32::from(t.rows), seed: t.row_seed() };
                let entries =
                    t.slots.iter().enumerate().map(|(i, &c)| (vec![(i / cols) as u32, (i % cols) as u32], c as usize));
                (vec![row, col], entries.collect())
            } else {
                (vec![col], t.slots.iter().enumerate().map(|(i, &c)| (vec![i as u32], c as usize)).collect())
            }
        }
        None | Some(Plan::Kernel(_)) => {
            (vec![KeyExpr::NumgenRandom(n as u32)], (0..n).map(|i| (vec![i as u32], i)).collect())
        }
    }
}

/// A weighted choice as slots of one random number: candidate i holds w_i
/// consecutive slots.
pub fn weighted_slots(weights: &[u32]) -> Vec<usize> {
    weights.iter().enumerate().flat_map(|(i, &w)| std::iter::repeat_n(i, w as usize)).collect()
}

/// The objects of one Service with affinity or a plan of its own.
pub fn chains(
    family: IpFamily,
    svc: &ServicePort,
    (cluster_eps, cluster_plan): (&[&Endpoint], Option<&Plan>),
    (local_eps, local_plan): (&[&Endpoint], Option<&Plan>),
) -> Chains {
    let affinity = svc.affinity_timeout_seconds > 0;
    let base = format!("{}/{}/{}/{}", svc.namespace, svc.name, svc.protocol, svc.port_name);
    let cluster = hashed("service-", &base);
    let local = hashed("local-", &base);
    // upstream's servicePortEndpointChainNameBase: an IPv6 address's colons,
    // which nft names cannot hold, become dots.
    let endpoint_base = |ep: &Endpoint| format!("{base}__{}/{}", ep.ip.to_string().replace(':', "."), ep.port);
    let endpoint_chain = |ep: &Endpoint| hashed("endpoint-", &endpoint_base(ep));
    let affinity_set = |ep: &Endpoint| hashed("affinity-", &endpoint_base(ep));
    let mut o = Objects::default();
    let mut endpoints: Vec<&Endpoint> = cluster_eps.iter().chain(local_eps).copied().collect();
    endpoints.sort_by_key(|e| (e.ip, e.port));
    endpoints.dedup_by_key(|e| (e.ip, e.port));
    for ep in &endpoints {
        let chain = endpoint_chain(ep);
        if affinity {
            let set = affinity_set(ep);
            o.sets.push(SetDecl::affinity(&set, svc.affinity_timeout_seconds));
            o.rules.push(Rule::new(&chain).statement(Statement::AffinityUpdate(set)));
        }
        o.rules.push(
            Rule::new(&chain)
                .with(Match::Protocol { negate: false, protocol: svc.protocol })
                .verdict(Verdict::Dnat(ep.ip, ep.port)),
        );
        o.chains.push(chain);
    }
    let choices = [(&cluster, "slots-", cluster_eps, cluster_plan), (&local, "local-slots-", local_eps, local_plan)];
    for (chain, slots_prefix, eps, plan) in choices {
        if eps.is_empty() {
            continue;
        }
        o.chains.push(chain.clone());
        if affinity {
            for ep in eps {
                o.rules.push(
                    Rule::new(chain)
                        .with(Match::Lookup { keys: source_key(), set: SetRef::Own(affinity_set(ep)), negate: false })
                        .verdict(Verdict::Goto(endpoint_chain(ep))),
                );
            }
        }
        let (keys, entries) = choice(plan, eps.len());
        let slots = hashed(slots_prefix, &base);
        o.sets.push(SetDecl {
            name: slots.clone(),
            key: keys.iter().map(|k| k.key_type()).collect(),
            data: Some(DataType::Verdict),
            interval: false,
            timeout_seconds: None,
            comment: None,
        });
        let mut writer = ElementWriter::new(family, SetRef::Own(slots.clone()));
        for (key, c) in entries {
            let w = key.iter().fold(&mut writer, |w, &word| w.word(word));
            w.verdict(VerdictKind::Goto, Some(&endpoint_chain(eps[c])));
        }
        o.elements.push(writer.finish());
        o.rules.push(Rule::new(chain).verdict(Verdict::Vmap { keys, map: SetRef::Own(slots) }));
    }
    Chains { cluster, local, objects: o }
}

/// The source-address key of affinity lookups.
fn source_key() -> Vec<KeyExpr> {
    vec![KeyExpr::Address(AddressField::Source)]
}
