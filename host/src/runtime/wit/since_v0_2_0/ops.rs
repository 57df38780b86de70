//! The contract's typed rules to the rule model ([`kpx_rules::ops`]).
//! Everything here is a move or a widening: the checks against the state
//! are the validator's (host/src/validate). The only refusals are values
//! the rule model has no room for.

use kpx_rules::model::{Cidr, Protocol};
use kpx_rules::ops::{self, CtStates, iptables as ipt, nftables as nft};

use super::exports::kpx::proxier::backend as wb;
use super::kpx::proxier::iptables as wipt;
use super::kpx::proxier::ipvs as wipvs;
use super::kpx::proxier::nftables as wnft;
use super::kpx::proxier::types as wt;
use super::wit_convert::{from_wit_ip, from_wit_slot_table};

pub fn ruleset(r: wb::Ruleset) -> Result<ops::Ruleset, String> {
    Ok(match r {
        wb::Ruleset::Iptables(r) => ops::Ruleset::Iptables(iptables(r)?),
        wb::Ruleset::Nftables(t) => ops::Ruleset::Nftables(nftables(t)),
        wb::Ruleset::Ipvs(r) => ops::Ruleset::Ipvs(ipvs(r)),
    })
}

fn ipvs(r: wipvs::Ruleset) -> ops::ipvs::Ruleset {
    ops::ipvs::Ruleset {
        services: r
            .services
            .into_iter()
            .map(|s| ops::ipvs::VirtualServer {
                address: from_wit_ip(&s.address),
                protocol: protocol(s.protocol),
                port: s.port,
                scheduler: s.scheduler,
                scheduler_flags: s.scheduler_flags,
                persistence_seconds: s.persistence_seconds,
                reals: s
                    .reals
                    .into_iter()
                    .map(|r| ops::ipvs::RealServer {
                        ip: from_wit_ip(&r.endpoint.address),
                        port: r.endpoint.port,
                        weight: r.weight,
                    })
                    .collect(),
                slots: s.slots.map(from_wit_slot_table),
            })
            .collect(),
    }
}

fn protocol(p: wt::Protocol) -> Protocol {
    match p {
        wt::Protocol::Tcp => Protocol::Tcp,
        wt::Protocol::Udp => Protocol::Udp,
        wt::Protocol::Sctp => Protocol::Sctp,
    }
}

fn ct_states(s: wt::CtStates) -> CtStates {
    [
        (wt::CtStates::INVALID, CtStates::INVALID),
        (wt::CtStates::NEW, CtStates::NEW),
        (wt::CtStates::ESTABLISHED, CtStates::ESTABLISHED),
        (wt::CtStates::RELATED, CtStates::RELATED),
        (wt::CtStates::UNTRACKED, CtStates::UNTRACKED),
        (wt::CtStates::SNAT, CtStates::SNAT),
        (wt::CtStates::DNAT, CtStates::DNAT),
    ]
    .into_iter()
    .filter(|(w, _)| s.contains(*w))
    .fold(CtStates::empty(), |acc, (_, o)| acc | o)
}

/// A CIDR as given; a prefix longer than the family's is kept as is for
/// the validator to refuse with the rule in hand.
fn cidr(c: &wt::Cidr) -> Cidr {
    Cidr { addr: from_wit_ip(&c.address), prefix_len: c.prefix_len }
}

fn table(t: wipt::Table) -> ipt::Table {
    match t {
        wipt::Table::Nat => ipt::Table::Nat,
        wipt::Table::Filter => ipt::Table::Filter,
    }
}

fn hook(h: wipt::Hook) -> ipt::Hook {
    match h {
        wipt::Hook::NatServices => ipt::Hook::NatServices,
        wipt::Hook::NatNodeports => ipt::Hook::NatNodePorts,
        wipt::Hook::FilterServices => ipt::Hook::FilterServices,
        wipt::Hook::FilterExternalServices => ipt::Hook::FilterExternalServices,
        wipt::Hook::FilterNodeports => ipt::Hook::FilterNodePorts,
        wipt::Hook::FilterFirewall => ipt::Hook::FilterFirewall,
    }
}

fn own_chain(c: wipt::OwnChain) -> (ipt::Table, String) {
    (table(c.table), c.name)
}

fn ipt_match(m: wipt::Match) -> ipt::Match {
    let address = |a: wipt::AddressMatch| ipt::AddressMatch { negate: a.negate, cidr: cidr(&a.cidr) };
    match m {
        wipt::Match::Source(a) => ipt::Match::Source(address(a)),
        wipt::Match::Destination(a) => ipt::Match::Destination(address(a)),
        wipt::Match::Protocol(p) => ipt::Match::Protocol(protocol(p)),
        wipt::Match::DestinationPort(p) => ipt::Match::DestinationPort(p),
        wipt::Match::InInterface(i) => {
            ipt::Match::InInterface(ipt::InterfaceMatch { negate: i.negate, name: i.name, prefix: i.prefix })
        }
        wipt::Match::SourceTypeLocal(negate) => ipt::Match::SourceTypeLocal { negate },
        wipt::Match::DestinationTypeLocal(negate) => ipt::Match::DestinationTypeLocal { negate },
        wipt::Match::ConntrackState(c) => ipt::Match::Conntrack { negate: c.negate, states: ct_states(c.states) },
        wipt::Match::Mark(m) => ipt::Match::Mark { negate: m.negate, value: m.value, mask: m.mask },
        wipt::Match::StatisticRandom(p) => ipt::Match::StatisticRandom(p),
        wipt::Match::StatisticNth(n) => ipt::Match::StatisticNth { every: n.every, packet: n.packet },
        wipt::Match::ClusterHash(c) => ipt::Match::ClusterHash { total: c.total, node: c.node, seed: c.seed },
        wipt::Match::RecentCheck(r) => ipt::Match::RecentCheck { name: r.list, seconds: r.seconds, reap: r.reap },
        wipt::Match::RecentSet(name) => ipt::Match::RecentSet { name },
        wipt::Match::HashSlot(s) => ipt::Match::HashSlot(s),
        wipt::Match::Comment(c) => ipt::Match::Comment(c),
    }
}

fn ipt_target(t: wipt::Target) -> ipt::Target {
    match t {
        wipt::Target::None => ipt::Target::None,
        wipt::Target::Accept => ipt::Target::Accept,
        wipt::Target::Drop => ipt::Target::Drop,
        wipt::Target::Reject => ipt::Target::Reject,
        wipt::Target::Return => ipt::Target::Return,
        wipt::Target::Jump(c) => ipt::Target::Jump(c),
        wipt::Target::Goto(c) => ipt::Target::Goto(c),
        wipt::Target::MarkForMasquerade => ipt::Target::MarkForMasquerade,
        wipt::Target::Dnat(e) => ipt::Target::Dnat(from_wit_ip(&e.address), e.port),
        wipt::Target::HashMark(h) => ipt::Target::HashMark(ipt::HashMark {
            tuple: match h.tuple {
                wipt::HashTuple::Source => ipt::HashTuple::Source,
                wipt::HashTuple::Destination => ipt::HashTuple::Destination,
            },
            modulus: h.modulus,
            seed: h.seed,
        }),
    }
}

fn iptables(r: wipt::Ruleset) -> Result<ipt::Ruleset, String> {
    let counted: usize = r.rules.iter().map(|rule| usize::from(rule.match_count)).sum();
    if counted != r.matches.len() {
        return Err(format!("the rules count {counted} matches, the ruleset holds {}", r.matches.len()));
    }
    let mut matches = r.matches.into_iter();
    let rules = r
        .rules
        .into_iter()
        .map(|rule| {
            let (table, chain) = match rule.chain {
                wipt::ChainRef::Hook(h) => (hook(h).table(), hook(h).chain().to_string()),
                wipt::ChainRef::Own(c) => own_chain(c),
            };
            ipt::Rule {
                table,
                chain,
                matches: matches.by_ref().take(usize::from(rule.match_count)).map(ipt_match).collect(),
                target: ipt_target(rule.target),
            }
            .canonical()
        })
        .collect();
    Ok(ipt::Ruleset {
        chains: r.chains.into_iter().map(own_chain).collect(),
        rules,
        delete_chains: r.delete_chains.into_iter().map(own_chain).collect(),
        kept_hooks: r.kept_hooks.into_iter().map(hook).collect(),
    })
}

fn host_set(h: wnft::HostSet) -> nft::HostSet {
    match h {
        wnft::HostSet::ClusterIps => nft::HostSet::ClusterIps,
        wnft::HostSet::ServiceIps => nft::HostSet::ServiceIps,
        wnft::HostSet::ServiceNodeports => nft::HostSet::ServiceNodePorts,
        wnft::HostSet::NoEndpointServices => nft::HostSet::NoEndpointServices,
        wnft::HostSet::NoEndpointNodeports => nft::HostSet::NoEndpointNodePorts,
        wnft::HostSet::FirewallIps => nft::HostSet::FirewallIps,
        wnft::HostSet::FirewallAllow => nft::HostSet::FirewallAllow,
        wnft::HostSet::Hairpin => nft::HostSet::Hairpin,
    }
}

fn set_ref(s: wnft::SetRef) -> nft::SetRef {
    match s {
        wnft::SetRef::Host(h) => nft::SetRef::Host(host_set(h)),
        wnft::SetRef::Own(n) => nft::SetRef::Own(n),
    }
}

fn field(f: wnft::AddressField) -> nft::AddressField {
    match f {
        wnft::AddressField::Source => nft::AddressField::Source,
        wnft::AddressField::Destination => nft::AddressField::Destination,
    }
}

fn key_expr(k: wnft::KeyExpr) -> nft::KeyExpr {
    match k {
        wnft::KeyExpr::Address(f) => nft::KeyExpr::Address(field(f)),
        wnft::KeyExpr::Protocol => nft::KeyExpr::Protocol,
        wnft::KeyExpr::DestinationPort => nft::KeyExpr::DestinationPort,
        wnft::KeyExpr::NumgenRandom(n) => nft::KeyExpr::NumgenRandom(n),
        wnft::KeyExpr::NumgenIncrement(n) => nft::KeyExpr::NumgenIncrement(n),
        wnft::KeyExpr::Jhash(j) => nft::KeyExpr::Jhash { field: field(j.field), modulus: j.modulus, seed: j.seed },
    }
}

fn keys(k: Vec<wnft::KeyExpr>) -> Vec<nft::KeyExpr> {
    k.into_iter().map(key_expr).collect()
}

fn key_type(k: wnft::KeyType) -> nft::KeyType {
    match k {
        wnft::KeyType::Address => nft::KeyType::Address,
        wnft::KeyType::Cidr => nft::KeyType::Cidr,
        wnft::KeyType::Protocol => nft::KeyType::Protocol,
        wnft::KeyType::Port => nft::KeyType::Port,
        wnft::KeyType::Integer => nft::KeyType::Integer,
    }
}

fn nft_match(m: wnft::Match) -> nft::Match {
    match m {
        wnft::Match::Address(a) => nft::Match::Address { field: field(a.field), negate: a.negate, cidr: cidr(&a.cidr) },
        wnft::Match::Protocol(p) => nft::Match::Protocol { negate: p.negate, protocol: protocol(p.protocol) },
        wnft::Match::DestinationPort(p) => nft::Match::DestinationPort { negate: p.negate, port: p.port },
        wnft::Match::InInterface(i) => nft::Match::InInterface { negate: i.negate, name: i.name, prefix: i.prefix },
        wnft::Match::FibLocal(f) => nft::Match::FibLocal { field: field(f.field), negate: f.negate },
        wnft::Match::CtState(c) => nft::Match::CtState { negate: c.negate, states: ct_states(c.states) },
        wnft::Match::Mark(m) => nft::Match::Mark { negate: m.negate, value: m.value, mask: m.mask },
        wnft::Match::Lookup(l) => nft::Match::Lookup { keys: keys(l.keys), set: set_ref(l.set), negate: l.negate },
    }
}

fn statement(s: wnft::Statement) -> nft::Statement {
    match s {
        wnft::Statement::Counter => nft::Statement::Counter,
        wnft::Statement::MasqueradeMark => nft::Statement::MasqueradeMark,
        wnft::Statement::AffinityUpdate(set) => nft::Statement::AffinityUpdate(set),
    }
}

fn verdict(v: wnft::Verdict) -> nft::Verdict {
    match v {
        wnft::Verdict::Continue => nft::Verdict::Continue,
        wnft::Verdict::Accept => nft::Verdict::Accept,
        wnft::Verdict::Drop => nft::Verdict::Drop,
        wnft::Verdict::Reject => nft::Verdict::Reject,
        wnft::Verdict::Return => nft::Verdict::Return,
        wnft::Verdict::Jump(c) => nft::Verdict::Jump(c),
        wnft::Verdict::Goto(c) => nft::Verdict::Goto(c),
        wnft::Verdict::Dnat(e) => nft::Verdict::Dnat(from_wit_ip(&e.address), e.port),
        wnft::Verdict::DnatMap(m) => nft::Verdict::DnatMap { keys: keys(m.keys), map: set_ref(m.map) },
        wnft::Verdict::Vmap(m) => nft::Verdict::Vmap { keys: keys(m.keys), map: set_ref(m.map) },
    }
}

fn elements(e: wnft::Elements) -> nft::Elements {
    nft::Elements { set: set_ref(e.set), words: e.words, chains: e.chains }
}

fn nftables(t: wnft::Ruleset) -> nft::Transaction {
    let ops = t
        .operations
        .into_iter()
        .map(|op| match op {
            wnft::Operation::AddChain(c) => nft::Op::AddChain(c),
            wnft::Operation::FlushChain(c) => nft::Op::FlushChain(c),
            wnft::Operation::DeleteChain(c) => nft::Op::DeleteChain(c),
            wnft::Operation::AddSet(d) => nft::Op::AddSet(nft::SetDecl {
                name: d.name,
                key: d.key.into_iter().map(key_type).collect(),
                data: d.data.map(|d| match d {
                    wnft::DataType::Verdict => nft::DataType::Verdict,
                    wnft::DataType::Endpoint => nft::DataType::Endpoint,
                }),
                interval: d.interval,
                timeout_seconds: None,
                comment: d.comment,
            }),
            wnft::Operation::AddAffinitySet(a) => nft::Op::AddSet(nft::SetDecl::affinity(&a.name, a.timeout_seconds)),
            wnft::Operation::FlushSet(s) => nft::Op::FlushSet(s),
            wnft::Operation::DeleteSet(s) => nft::Op::DeleteSet(s),
            wnft::Operation::AddRule(r) => nft::Op::AddRule(nft::Rule {
                chain: r.chain,
                matches: r.matches.into_iter().map(nft_match).collect(),
                statements: r.statements.into_iter().map(statement).collect(),
                verdict: verdict(r.verdict),
                comment: r.comment,
            }),
            wnft::Operation::AddElements(e) => nft::Op::AddElements(elements(e)),
            wnft::Operation::DeleteElements(e) => nft::Op::DeleteElements(elements(e)),
        })
        .collect();
    nft::Transaction { ops }
}

/// An extension's rules: moves only (the checks are validate::extension's).
pub fn extension(r: super::ext::exports::kpx::proxier::extension::Ruleset) -> ops::extension::Ruleset {
    use super::ext::exports::kpx::proxier::extension as we;
    use ops::extension as x;
    let rule = |r: we::Rule| x::Rule {
        attachment: match r.attachment {
            we::Attachment::BeforeDispatch => x::Attachment::BeforeDispatch,
            we::Attachment::Service => x::Attachment::Service,
            we::Attachment::Firewall => x::Attachment::Firewall,
        },
        service: r.service,
        source: r.source.map(|s| x::SourceMatch { negate: s.negate, cidr: cidr(&s.cidr) }),
        over_rate: r.over_rate.map(|o| x::Rate { per_second: o.per_second, burst: o.burst }),
        counter: r.counter,
        action: match r.action {
            we::Action::Continue => x::Action::Continue,
            we::Action::Drop => x::Action::Drop,
            we::Action::Reject => x::Action::Reject,
        },
    };
    x::Ruleset { rules: r.rules.into_iter().map(rule).collect() }
}
