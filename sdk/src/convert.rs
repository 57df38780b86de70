//! Typed rules ([`kpx_rules::ops`]) to the contract's types. Host-only
//! variants (masquerade, mark writes, base chains, the host's own sets)
//! have no spelling in the contract: a ruleset holding one is refused
//! here, before it leaves the plugin.

use kpx_rules::model::{Cidr, Protocol};
use kpx_rules::ops::{self, CtStates, iptables as ipt, nftables as nft};

use crate::__bindings::exports::kpx::proxier::backend as wit_backend;
use crate::__bindings::kpx::proxier::iptables as wipt;
use crate::__bindings::kpx::proxier::ipvs as wipvs;
use crate::__bindings::kpx::proxier::nftables as wnft;
use crate::__bindings::kpx::proxier::types as wt;
use crate::wit_convert::{to_wit_cidr, to_wit_ip, to_wit_slot_table};

type Result<T> = std::result::Result<T, String>;

pub fn ruleset(r: ops::Ruleset) -> Result<wit_backend::Ruleset> {
    Ok(match r {
        ops::Ruleset::Iptables(r) => wit_backend::Ruleset::Iptables(iptables(r)?),
        ops::Ruleset::Nftables(t) => wit_backend::Ruleset::Nftables(nftables(t)?),
        ops::Ruleset::Ipvs(r) => wit_backend::Ruleset::Ipvs(ipvs(r)),
    })
}

pub fn ipvs(r: ops::ipvs::Ruleset) -> wipvs::Ruleset {
    wipvs::Ruleset {
        services: r
            .services
            .into_iter()
            .map(|s| wipvs::VirtualServer {
                address: to_wit_ip(&s.address),
                protocol: protocol(s.protocol),
                port: s.port,
                scheduler: s.scheduler,
                scheduler_flags: s.scheduler_flags,
                persistence_seconds: s.persistence_seconds,
                reals: s
                    .reals
                    .into_iter()
                    .map(|r| wipvs::RealServer {
                        endpoint: wt::EndpointAddress { address: to_wit_ip(&r.ip), port: r.port },
                        weight: r.weight,
                    })
                    .collect(),
                slots: s.slots.as_ref().map(to_wit_slot_table),
            })
            .collect(),
    }
}

fn protocol(p: Protocol) -> wt::Protocol {
    match p {
        Protocol::Tcp => wt::Protocol::Tcp,
        Protocol::Udp => wt::Protocol::Udp,
        Protocol::Sctp => wt::Protocol::Sctp,
    }
}

fn ct_states(s: CtStates) -> wt::CtStates {
    let mut out = wt::CtStates::empty();
    for (flag, bit) in [
        (CtStates::INVALID, wt::CtStates::INVALID),
        (CtStates::NEW, wt::CtStates::NEW),
        (CtStates::ESTABLISHED, wt::CtStates::ESTABLISHED),
        (CtStates::RELATED, wt::CtStates::RELATED),
        (CtStates::UNTRACKED, wt::CtStates::UNTRACKED),
        (CtStates::SNAT, wt::CtStates::SNAT),
        (CtStates::DNAT, wt::CtStates::DNAT),
    ] {
        if s.contains(flag) {
            out |= bit;
        }
    }
    out
}

fn endpoint(ip: &std::net::IpAddr, port: u16) -> wt::EndpointAddress {
    wt::EndpointAddress { address: to_wit_ip(ip), port }
}

fn cidr(c: &Cidr) -> wt::Cidr {
    to_wit_cidr(c)
}

fn table(t: ipt::Table) -> wipt::Table {
    match t {
        ipt::Table::Nat => wipt::Table::Nat,
        ipt::Table::Filter => wipt::Table::Filter,
    }
}

fn hook(h: ipt::Hook) -> wipt::Hook {
    match h {
        ipt::Hook::NatServices => wipt::Hook::NatServices,
        ipt::Hook::NatNodePorts => wipt::Hook::NatNodeports,
        ipt::Hook::FilterServices => wipt::Hook::FilterServices,
        ipt::Hook::FilterExternalServices => wipt::Hook::FilterExternalServices,
        ipt::Hook::FilterNodePorts => wipt::Hook::FilterNodeports,
        ipt::Hook::FilterFirewall => wipt::Hook::FilterFirewall,
    }
}

fn own_chain((t, name): (ipt::Table, String)) -> wipt::OwnChain {
    wipt::OwnChain { table: table(t), name }
}

fn ipt_match(m: ipt::Match) -> Result<wipt::Match> {
    let address = |a: ipt::AddressMatch| wipt::AddressMatch { negate: a.negate, cidr: cidr(&a.cidr) };
    Ok(match m {
        ipt::Match::Source(a) => wipt::Match::Source(address(a)),
        ipt::Match::Destination(a) => wipt::Match::Destination(address(a)),
        ipt::Match::InInterface(i) => {
            wipt::Match::InInterface(wipt::InterfaceMatch { negate: i.negate, name: i.name, prefix: i.prefix })
        }
        ipt::Match::Protocol(p) => wipt::Match::Protocol(protocol(p)),
        ipt::Match::DestinationPort(p) => wipt::Match::DestinationPort(p),
        ipt::Match::SourceTypeLocal { negate } => wipt::Match::SourceTypeLocal(negate),
        ipt::Match::DestinationTypeLocal { negate } => wipt::Match::DestinationTypeLocal(negate),
        ipt::Match::Conntrack { negate, states } => {
            wipt::Match::ConntrackState(wipt::CtStateMatch { negate, states: ct_states(states) })
        }
        ipt::Match::Mark { negate, value, mask } => wipt::Match::Mark(wipt::MarkMatch { negate, value, mask }),
        ipt::Match::StatisticRandom(p) => wipt::Match::StatisticRandom(p),
        ipt::Match::StatisticNth { every, packet } => wipt::Match::StatisticNth(wipt::Nth { every, packet }),
        ipt::Match::ClusterHash { total, node, seed } => {
            wipt::Match::ClusterHash(wipt::ClusterHash { total, node, seed })
        }
        ipt::Match::RecentCheck { name, seconds, reap } => {
            wipt::Match::RecentCheck(wipt::RecentCheck { list: name, seconds, reap })
        }
        ipt::Match::RecentSet { name } => wipt::Match::RecentSet(name),
        ipt::Match::HashSlot(s) => wipt::Match::HashSlot(s),
        ipt::Match::Comment(c) => wipt::Match::Comment(c),
        host @ (ipt::Match::Set { .. }
        | ipt::Match::PhysdevIsIn { .. }
        | ipt::Match::IpvsVirtual { .. }
        | ipt::Match::Nfacct(_)
        | ipt::Match::ConntrackOriginalDestination(_)) => {
            return Err(format!("{host:?} is written by the host only; the contract has no such match"));
        }
    })
}

fn ipt_target(t: ipt::Target) -> Result<wipt::Target> {
    Ok(match t {
        ipt::Target::None => wipt::Target::None,
        ipt::Target::Accept => wipt::Target::Accept,
        ipt::Target::Drop => wipt::Target::Drop,
        ipt::Target::Reject => wipt::Target::Reject,
        ipt::Target::Return => wipt::Target::Return,
        ipt::Target::Jump(c) => wipt::Target::Jump(c),
        ipt::Target::Goto(c) => wipt::Target::Goto(c),
        ipt::Target::MarkForMasquerade => wipt::Target::MarkForMasquerade,
        ipt::Target::Dnat(ip, port) => wipt::Target::Dnat(endpoint(&ip, port)),
        ipt::Target::HashMark(h) => wipt::Target::HashMark(wipt::HashMark {
            tuple: match h.tuple {
                ipt::HashTuple::Source => wipt::HashTuple::Source,
                ipt::HashTuple::Destination => wipt::HashTuple::Destination,
            },
            modulus: h.modulus,
            seed: h.seed,
        }),
        host @ (ipt::Target::Masquerade { .. }
        | ipt::Target::SetMark { .. }
        | ipt::Target::HostJump(_)
        | ipt::Target::Redirect(_)) => {
            return Err(format!("{host:?} is written by the host only; the contract has no such target"));
        }
    })
}

fn iptables(r: ipt::Ruleset) -> Result<wipt::Ruleset> {
    let mut rules = Vec::with_capacity(r.rules.len());
    let mut matches = Vec::with_capacity(r.rules.iter().map(|x| x.matches.len()).sum());
    for rule in r.rules {
        let chain = match ipt::Hook::of(rule.table, &rule.chain) {
            Some(h) => wipt::ChainRef::Hook(hook(h)),
            None => wipt::ChainRef::Own(own_chain((rule.table, rule.chain))),
        };
        let match_count = u8::try_from(rule.matches.len())
            .map_err(|_| format!("a rule has {} matches; the contract carries at most 255", rule.matches.len()))?;
        for m in rule.matches {
            matches.push(ipt_match(m)?);
        }
        rules.push(wipt::Rule { chain, match_count, target: ipt_target(rule.target)? });
    }
    Ok(wipt::Ruleset {
        chains: r.chains.into_iter().map(own_chain).collect(),
        rules,
        matches,
        delete_chains: r.delete_chains.into_iter().map(own_chain).collect(),
        kept_hooks: r.kept_hooks.into_iter().map(hook).collect(),
    })
}

fn host_set(h: nft::HostSet) -> Result<wnft::HostSet> {
    Ok(match h {
        nft::HostSet::ClusterIps => wnft::HostSet::ClusterIps,
        nft::HostSet::ServiceIps => wnft::HostSet::ServiceIps,
        nft::HostSet::ServiceNodePorts => wnft::HostSet::ServiceNodeports,
        nft::HostSet::NoEndpointServices => wnft::HostSet::NoEndpointServices,
        nft::HostSet::NoEndpointNodePorts => wnft::HostSet::NoEndpointNodeports,
        nft::HostSet::FirewallIps => wnft::HostSet::FirewallIps,
        nft::HostSet::FirewallAllow => wnft::HostSet::FirewallAllow,
        nft::HostSet::Hairpin => wnft::HostSet::Hairpin,
        nft::HostSet::NodePortIps | nft::HostSet::LocalhostNodePortRejects => {
            return Err(format!("set {} is filled by the host only", h.name()));
        }
    })
}

fn set_ref(s: nft::SetRef) -> Result<wnft::SetRef> {
    Ok(match s {
        nft::SetRef::Host(h) => wnft::SetRef::Host(host_set(h)?),
        nft::SetRef::Own(n) => wnft::SetRef::Own(n),
    })
}

fn field(f: nft::AddressField) -> wnft::AddressField {
    match f {
        nft::AddressField::Source => wnft::AddressField::Source,
        nft::AddressField::Destination => wnft::AddressField::Destination,
    }
}

fn key_expr(k: nft::KeyExpr) -> wnft::KeyExpr {
    match k {
        nft::KeyExpr::Address(f) => wnft::KeyExpr::Address(field(f)),
        nft::KeyExpr::Protocol => wnft::KeyExpr::Protocol,
        nft::KeyExpr::DestinationPort => wnft::KeyExpr::DestinationPort,
        nft::KeyExpr::NumgenRandom(n) => wnft::KeyExpr::NumgenRandom(n),
        nft::KeyExpr::NumgenIncrement(n) => wnft::KeyExpr::NumgenIncrement(n),
        nft::KeyExpr::Jhash { field: f, modulus, seed } => {
            wnft::KeyExpr::Jhash(wnft::Jhash { field: field(f), modulus, seed })
        }
    }
}

fn key_type(k: nft::KeyType) -> wnft::KeyType {
    match k {
        nft::KeyType::Address => wnft::KeyType::Address,
        nft::KeyType::Cidr => wnft::KeyType::Cidr,
        nft::KeyType::Protocol => wnft::KeyType::Protocol,
        nft::KeyType::Port => wnft::KeyType::Port,
        nft::KeyType::Integer => wnft::KeyType::Integer,
    }
}

fn nft_match(m: nft::Match) -> Result<wnft::Match> {
    Ok(match m {
        nft::Match::Address { field: f, negate, cidr: c } => {
            wnft::Match::Address(wnft::AddressMatch { field: field(f), negate, cidr: cidr(&c) })
        }
        nft::Match::Protocol { negate, protocol: p } => {
            wnft::Match::Protocol(wnft::ProtocolMatch { negate, protocol: protocol(p) })
        }
        nft::Match::DestinationPort { negate, port } => wnft::Match::DestinationPort(wnft::PortMatch { negate, port }),
        nft::Match::InInterface { negate, name, prefix } => {
            wnft::Match::InInterface(wnft::InterfaceMatch { negate, name, prefix })
        }
        nft::Match::FibLocal { field: f, negate } => wnft::Match::FibLocal(wnft::FibLocal { field: field(f), negate }),
        nft::Match::CtState { negate, states } => {
            wnft::Match::CtState(wnft::CtStateMatch { negate, states: ct_states(states) })
        }
        nft::Match::Mark { negate, value, mask } => wnft::Match::Mark(wnft::MarkMatch { negate, value, mask }),
        host @ nft::Match::CtDnat { .. } => {
            return Err(format!("{host:?} is written by the host only; the contract has no such match"));
        }
        nft::Match::Lookup { keys, set, negate } => wnft::Match::Lookup(wnft::Lookup {
            keys: keys.into_iter().map(key_expr).collect(),
            set: set_ref(set)?,
            negate,
        }),
    })
}

fn statement(s: nft::Statement) -> Result<wnft::Statement> {
    Ok(match s {
        nft::Statement::Counter => wnft::Statement::Counter,
        nft::Statement::MasqueradeMark => wnft::Statement::MasqueradeMark,
        nft::Statement::AffinityUpdate(set) => wnft::Statement::AffinityUpdate(set),
        host @ (nft::Statement::MarkXor(_) | nft::Statement::NamedCounter(_) | nft::Statement::Masquerade { .. }) => {
            return Err(format!("{host:?} is written by the host only; the contract has no such statement"));
        }
    })
}

fn verdict(v: nft::Verdict) -> Result<wnft::Verdict> {
    let lookup = |keys: Vec<nft::KeyExpr>, map| -> Result<wnft::MapLookup> {
        Ok(wnft::MapLookup { keys: keys.into_iter().map(key_expr).collect(), map: set_ref(map)? })
    };
    Ok(match v {
        nft::Verdict::Continue => wnft::Verdict::Continue,
        nft::Verdict::Accept => wnft::Verdict::Accept,
        nft::Verdict::Drop => wnft::Verdict::Drop,
        nft::Verdict::Reject => wnft::Verdict::Reject,
        nft::Verdict::Return => wnft::Verdict::Return,
        nft::Verdict::Jump(c) => wnft::Verdict::Jump(c),
        nft::Verdict::Goto(c) => wnft::Verdict::Goto(c),
        nft::Verdict::Dnat(ip, port) => wnft::Verdict::Dnat(endpoint(&ip, port)),
        nft::Verdict::DnatMap { keys, map } => wnft::Verdict::DnatMap(lookup(keys, map)?),
        nft::Verdict::Vmap { keys, map } => wnft::Verdict::Vmap(lookup(keys, map)?),
    })
}

fn set_declaration(d: nft::SetDecl) -> Result<wnft::Operation> {
    if let Some(timeout_seconds) = d.timeout_seconds {
        return Ok(wnft::Operation::AddAffinitySet(wnft::AffinitySet { name: d.name, timeout_seconds }));
    }
    Ok(wnft::Operation::AddSet(wnft::SetDeclaration {
        name: d.name,
        key: d.key.into_iter().map(key_type).collect(),
        data: d.data.map(|d| match d {
            nft::DataType::Verdict => wnft::DataType::Verdict,
            nft::DataType::Endpoint => wnft::DataType::Endpoint,
        }),
        interval: d.interval,
        comment: d.comment,
    }))
}

fn elements(e: nft::Elements) -> Result<wnft::Elements> {
    Ok(wnft::Elements { set: set_ref(e.set)?, words: e.words, chains: e.chains })
}

pub fn nftables(t: nft::Transaction) -> Result<wnft::Ruleset> {
    let mut operations = Vec::with_capacity(t.ops.len());
    for op in t.ops {
        operations.push(match op {
            nft::Op::AddChain(c) => wnft::Operation::AddChain(c),
            nft::Op::FlushChain(c) => wnft::Operation::FlushChain(c),
            nft::Op::DeleteChain(c) => wnft::Operation::DeleteChain(c),
            nft::Op::AddSet(d) => set_declaration(d)?,
            nft::Op::FlushSet(s) => wnft::Operation::FlushSet(s),
            nft::Op::DeleteSet(s) => wnft::Operation::DeleteSet(s),
            nft::Op::AddRule(r) => wnft::Operation::AddRule(wnft::Rule {
                chain: r.chain,
                matches: r.matches.into_iter().map(nft_match).collect::<Result<_>>()?,
                statements: r.statements.into_iter().map(statement).collect::<Result<_>>()?,
                verdict: verdict(r.verdict)?,
                comment: r.comment,
            }),
            nft::Op::AddElements(e) => wnft::Operation::AddElements(elements(e)?),
            nft::Op::DeleteElements(e) => wnft::Operation::DeleteElements(elements(e)?),
            nft::Op::AddBaseChain(b) => {
                return Err(format!("base chain {} is the host's; the contract has no base chains", b.name));
            }
        });
    }
    Ok(wnft::Ruleset { operations })
}
