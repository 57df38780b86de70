//! This backend's fixed objects: the chains the host's dispatch maps send
//! Service traffic to, the select chains and the affinity maps. Their
//! number depends on nothing but the settings.

use super::elements::Purpose;
use crate::model::{LocalTraffic, Settings};
use crate::ops::nftables::{AddressField, Match, Op, Rule, SetRef, Statement, Verdict};

/// The chains service-ips and service-nodeports elements lead to.
pub const CHAINS: &[&str] = &["cluster-ip", "external-cluster", "external-local", "nodeport-cluster", "nodeport-local"];

/// Chain and map declarations.
pub fn declarations() -> Vec<Op> {
    let mut out: Vec<Op> = CHAINS
        .iter()
        .map(|c| c.to_string())
        .chain(Purpose::ALL.iter().map(|p| p.select_chain()))
        .map(Op::AddChain)
        .collect();
    out.extend(Purpose::ALL.iter().map(|p| Op::AddSet(p.affinity_declaration())));
    out
}

/// `ip saddr 10.0.0.0/8` / `iifname "x"`: traffic from a local pod (or,
/// with `negate`, not from one).
fn local_match(settings: &Settings, negate: bool) -> Option<Match> {
    match &settings.local_traffic {
        LocalTraffic::None => None,
        LocalTraffic::Cidrs(cidrs) => cidrs.iter().find(|c| c.family() == settings.family).map(|c| Match::Address {
            field: AddressField::Source,
            negate,
            cidr: *c,
        }),
        LocalTraffic::BridgeInterface(name) => Some(Match::InInterface { negate, name: name.clone(), prefix: false }),
        LocalTraffic::InterfaceNamePrefix(prefix) => {
            Some(Match::InInterface { negate, name: prefix.clone(), prefix: true })
        }
    }
}

fn goto(chain: &str, to: &str) -> Rule {
    Rule::new(chain).verdict(Verdict::Goto(to.to_string()))
}

/// The fixed chains' rules.
pub fn rules(settings: &Settings) -> Vec<Op> {
    let mut out = Vec::new();
    // Cluster IPs: masquerade off-cluster sources.
    if settings.masquerade_all {
        out.push(Rule::new("cluster-ip").statement(Statement::MasqueradeMark));
    } else if let Some(not_local) = local_match(settings, true) {
        out.push(Rule::new("cluster-ip").with(not_local).statement(Statement::MasqueradeMark));
    }
    out.push(goto("cluster-ip", "select-internal"));
    // External destinations, Cluster policy: always masquerade.
    for (chain, select) in [("external-cluster", "select-external"), ("nodeport-cluster", "select-nodeport-external")] {
        out.push(Rule::new(chain).statement(Statement::MasqueradeMark));
        out.push(goto(chain, select));
    }
    // Local policy: pod and node traffic short-circuit to all endpoints.
    for (chain, shortcut, select) in [
        ("external-local", "select-shortcut", "select-external"),
        ("nodeport-local", "select-nodeport-shortcut", "select-nodeport-external"),
    ] {
        if let Some(local) = local_match(settings, false) {
            out.push(Rule::new(chain).with(local).verdict(Verdict::Goto(shortcut.to_string())));
        }
        let from_node = Match::FibLocal { field: AddressField::Source, negate: false };
        out.push(Rule::new(chain).with(from_node.clone()).statement(Statement::MasqueradeMark));
        out.push(Rule::new(chain).with(from_node).verdict(Verdict::Goto(shortcut.to_string())));
        out.push(goto(chain, select));
    }
    // Select chains: affinity Services first, then the endpoint maps.
    for p in Purpose::ALL {
        out.push(
            Rule::new(&p.select_chain())
                .verdict(Verdict::Vmap { keys: p.key_exprs(), map: SetRef::Own(p.affinity_map()) }),
        );
    }
    out.into_iter().map(Op::AddRule).collect()
}
