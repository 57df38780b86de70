//! Targets for what kpx reads from files, the API server and the kernel.
//! Each must end, bounded, with a value or a named error; none may panic.

use std::net::IpAddr;
use std::sync::Arc;

use kpx::config::Flags;
use kpx::kernel::iptables::parse::{Line, normalize, parse_dump};
use kpx::kernel::nftables::decode;
use kpx::kernel::{conntrack, interfaces, ipvs, netlink};
use kpx::source::api::wire::{WireService, WireSlice};
use kpx::source::slice::Placements;
use kpx::source::{Event, Object};
use kpx::state::State;
use kpx::syntax::iptables::Dialect;
use kpx_rules::model::{IpFamily, Protocol};
use kpx_rules::ops::iptables::Match;
use kpx_rules::trace::{Node as TraceNode, Packet};

/// A manifest file: its documents, then the state they make, every
/// derived view of it, and the state again after each object is deleted.
pub fn manifests(data: &[u8]) {
    // The manifest source reads files as UTF-8 and refuses the others.
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (objects, _errors) = kpx::source::manifests::parse_documents(text);
    replay(objects);
}

/// Services and EndpointSlices as the API source decodes them (a JSON
/// object a line, as watch events carry them), into the state.
pub fn api_objects(data: &[u8]) {
    let mut placements = Placements::default();
    let mut objects = Vec::new();
    for line in data.split(|b| *b == b'\n') {
        if let Ok(s) = serde_json::from_slice::<WireService>(line) {
            objects.push(Object::Service(Arc::new(s.into())));
        }
        if let Ok(s) = serde_json::from_slice::<WireSlice>(line) {
            objects.push(Object::EndpointSlice(Arc::new(s.into_slice(&mut placements))));
        }
    }
    replay(objects);
}

/// Applies objects to a state, reads every view a proxier reads, then
/// deletes them one by one: the state must end empty.
fn replay(objects: Vec<Object>) {
    let mut state = State::new("node");
    for o in &objects {
        state.apply(Event::Apply(o.clone()));
    }
    state.apply(Event::Synced);
    views(&mut state);
    for o in &objects {
        state.apply(Event::Delete(o.object_ref()));
    }
    views(&mut state);
    let left: Vec<_> = state.service_names().collect();
    assert!(left.is_empty(), "Services left after every object was deleted: {left:?}");
}

fn views(state: &mut State) {
    let _ = state.take_changes();
    let names: Vec<_> = state.service_names().cloned().collect();
    for name in &names {
        for family in [IpFamily::V4, IpFamily::V6] {
            let _ = state.service_ports(family, name);
            let _ = state.no_local_endpoints(name, family);
        }
        let _ = state.endpoints_map(name);
    }
    let _ = state.health_checks();
    for family in [IpFamily::V4, IpFamily::V6] {
        let _ = state.cluster(family);
        let _ = state.node(family);
    }
}

/// A `--config` file: parsed, applied over the defaults and validated as
/// `kpx --config` does.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(parsed) = kpx::config::file::parse("fuzz.yaml", text) else { return };
    let _ = parsed.unknown_fields();
    let mut flags = Flags::defaults();
    parsed.apply(&mut flags);
    if let Ok(config) = flags.validate() {
        let _ = config.configz();
    }
}

/// One datagram from the kernel: split into messages as the nf_tables
/// socket does, then each payload through every decoder kpx has (nf_tables
/// chains, sets and rules, conntrack entries, IPVS services and
/// destinations after the genetlink header, addresses, errors). A set's
/// declaration is kept for the messages after it, whose elements are
/// decoded by it, as kpx reads a set and then its elements.
pub fn netlink(data: &[u8]) {
    let Ok(messages) = netlink::split_replies(data) else { return };
    // nfgenmsg and genlmsghdr are both 4 bytes.
    const SUBHEADER: usize = 4;
    let mut sets = Vec::new();
    for (_, flags, _, payload) in &messages {
        let _ = netlink::parse_error(payload, *flags);
        let _ = interfaces::address(payload);
        let Some(attrs) = payload.get(SUBHEADER..) else { continue };
        let _ = ipvs::msg::parse_service(attrs);
        for family in [2, 10] {
            let _ = ipvs::msg::parse_destination(attrs, family);
        }
        let _ = conntrack::table::parse_entry(attrs);
        let _ = decode::chain(attrs);
        for family in [IpFamily::V4, IpFamily::V6] {
            let _ = decode::rule(family, 0x4000, attrs);
            for decl in &sets {
                let _ = decode::elements(family, decl, attrs);
            }
        }
        if let Ok(info) = decode::set(attrs) {
            sets.clear();
            sets.extend([IpFamily::V4, IpFamily::V6].iter().filter_map(|f| decode::declaration(*f, &info).ok()));
        }
    }
}

/// `iptables-save` text: the reconciler's parser, each rule normalized,
/// then `kpx trace`'s tracer walking packets to every destination the
/// rules match on.
pub fn iptables_save(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    for (family, mark) in [(IpFamily::V4, 0x4000), (IpFamily::V6, 1 << 31)] {
        let d = Dialect { family, masquerade_mark: mark };
        let dump = parse_dump(text, d);
        let mut destinations: Vec<IpAddr> = Vec::new();
        for table in dump.tables.values() {
            for line in table.rules.values().flatten() {
                let Line::Rule(rule) = line else { continue };
                let _ = normalize(rule, d);
                for m in &rule.matches {
                    if let Match::Destination(a) = m
                        && destinations.len() < 4
                    {
                        destinations.push(a.cidr.addr);
                    }
                }
            }
        }
        let Ok(tables) = dump.tracer_tables(d) else { continue };
        let node = TraceNode { local_addresses: destinations.iter().take(1).copied().collect() };
        for dst in destinations {
            let outside = if dst.is_ipv4() {
                IpAddr::from([203, 0, 113, 1])
            } else {
                IpAddr::from(std::net::Ipv6Addr::from(0x2001_0db8u128 << 96))
            };
            for (src, from_node) in [(dst, true), (outside, false)] {
                let packet = Packet { src, dst, dport: 80, protocol: Protocol::Tcp, from_node, in_interface: None };
                let _ = kpx_rules::trace::iptables::trace_iptables(&tables, &node, &packet);
            }
        }
    }
}
