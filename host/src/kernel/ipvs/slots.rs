//! Slot plans (mh, maglev) executed in ipvs mode, so that a client reaches
//! the endpoint the plan names, as in the iptables and nftables modes.
//!
//! IPVS schedules a connection on its first packet, looking up a
//! firewall-mark service first. The host gives every real server of a
//! slotted virtual server a mark (below the masquerade bit) and two
//! firewall-mark services holding that real server alone: one for the
//! mark, one for the mark with the masquerade bit (which nat KUBE-SERVICES
//! may set before IPVS sees the packet). Rules in nat KPX-IPVS-SLOTS
//! test the virtual server's address, protocol and port and the slot
//! (xt_cluster: the jhash of the connection's source, as the plan
//! computes it) and set the slot's real server's mark; the slot tests
//! cover every hash value, so exactly one rule of a table matches (MARK
//! does not end the chain: a catch-all rule would overwrite the mark).
//! nat sees only a connection's first packet, which is the one IPVS
//! schedules; later packets follow IPVS's connection entry. A connection
//! left unmarked would take the virtual server's own scheduler.
//!
//! Marks are kept for as long as their real server is in some slot plan
//! or its services still hold connections (they drain at weight 0), and
//! are never reused while the kernel holds a service for them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kpx_rules::iptables::slot_matches;
use kpx_rules::model::{HashField, Protocol};
use kpx_rules::ops::iptables::{Match, Rule, Table, Target};
use kpx_rules::ops::ipvs::{RealServer, Ruleset};

use super::{Destination, Service, ServiceKey};

/// kpx's own chain (upstream has no slot plans), in nat.
pub const CHAIN: &str = "KPX-IPVS-SLOTS";

/// The most marks kpx gives out: the top of the values below the
/// masquerade bit (0x3000-0x3fff with the default bit 14), away from the
/// small marks other software tends to use (keepalived's `fwmark 1`).
pub const MAX_MARKS: u32 = 4096;

/// The most slot rules one sync writes (a 1021-entry table is up to 1024
/// rules): the virtual servers past it use their own IPVS scheduler.
pub const MAX_RULES: usize = 16 * 1024;

/// The marks kpx gives out, lowest and highest, for a masquerade mark.
fn range(masquerade_mark: u32) -> (u32, u32) {
    let high = masquerade_mark - 1;
    (high.saturating_sub(MAX_MARKS - 1).max(1), high)
}

/// Whether a firewall-mark service looks like one of kpx's: a mark in
/// kpx's range (with or without the masquerade bit), scheduler rr, no
/// flags, no persistence. Another program's service there is taken for
/// kpx's only if it has that very shape.
pub fn is_own(service: &Service, masquerade_mark: u32) -> bool {
    let mark = service.key.fwmark;
    let (low, high) = range(masquerade_mark);
    let value = mark & !masquerade_mark;
    mark & !(masquerade_mark | high) == 0
        && (low..=high).contains(&value)
        && service.scheduler == "rr"
        && service.flags == 0
        && service.timeout == 0
}

/// The marks of the real servers in slot plans.
#[derive(Debug, Default)]
pub struct Marks {
    by_real: BTreeMap<(IpAddr, u16), u32>,
    /// Whether the kernel's marks were read back (the first sync).
    adopted: bool,
    /// Whether only TCP virtual servers used a mark: a mark no plan needs
    /// any more drains then (weight 0 while connections remain); else its
    /// services go at once (UDP flows would keep a weight-0 one alive).
    /// Kept while the kernel holds the mark's services.
    tcp_only: BTreeMap<u32, bool>,
}

/// What one sync writes for the slot plans.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SlotWork {
    /// nat KPX-IPVS-SLOTS.
    pub rules: Vec<Rule>,
    /// The slotted virtual servers (address, protocol, port): only their
    /// new connections walk KPX-IPVS-SLOTS.
    pub slotted: Vec<(IpAddr, Protocol, u16)>,
    /// The firewall-mark services, each with its one real server.
    pub services: Vec<(Service, Destination)>,
    /// Virtual servers left on their own IPVS scheduler (as `address
    /// protocol port`): no mark was free for a real server, or the rules
    /// would pass [`MAX_RULES`].
    pub unslotted: Vec<String>,
}

impl Marks {
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    /// The marks the kernel's own firewall-mark services show (mark, real
    /// server), read once at start: a restart keeps them, so established
    /// connections are not cut. Their protocols are unknown: if no plan
    /// needs them any more, they go at once.
    pub fn adopt(&mut self, found: impl IntoIterator<Item = (u32, IpAddr, u16)>) {
        for (mark, ip, port) in found {
            self.by_real.entry((ip, port)).or_insert(mark);
        }
        self.adopted = true;
    }

    /// Marks for the ruleset's slotted real servers (kept for those that
    /// had one; the highest free one for a new one, never one in `held`:
    /// marks of kpx's services the kernel holds), the rules that set them
    /// and the services that take them.
    pub fn plan(&mut self, ruleset: &Ruleset, masquerade_mark: u32, held: &BTreeSet<u32>) -> SlotWork {
        let (low, high) = range(masquerade_mark);
        let slot_mask = masquerade_mark - 1;
        let held: BTreeSet<u32> = held.iter().map(|m| m & slot_mask).collect();
        self.tcp_only.retain(|mark, _| held.contains(mark));
        let slotted =
            || ruleset.services.iter().filter(|vs| vs.slots.as_ref().is_some_and(|t| t.field == HashField::Source));
        let mut wanted: BTreeMap<(IpAddr, u16), bool> = BTreeMap::new();
        for vs in slotted() {
            for r in &vs.reals {
                *wanted.entry((r.ip, r.port)).or_insert(true) &= vs.protocol == Protocol::Tcp;
            }
        }
        self.by_real.retain(|real, _| wanted.contains_key(real));
        let mut taken: BTreeSet<u32> = self.by_real.values().copied().collect();
        taken.extend(&held);
        let mut next = high;
        for real in wanted.keys() {
            if self.by_real.contains_key(real) {
                continue;
            }
            while next >= low && taken.contains(&next) {
                next -= 1;
            }
            if next < low {
                break;
            }
            taken.insert(next);
            self.by_real.insert(*real, next);
        }
        for (real, mark) in &self.by_real {
            let tcp = wanted[real];
            self.tcp_only.entry(*mark).and_modify(|t| *t &= tcp).or_insert(tcp);
        }
        let mut work = SlotWork::default();
        for vs in slotted() {
            let table = vs.slots.as_ref().expect("slotted");
            let mark_of = |r: &RealServer| self.by_real.get(&(r.ip, r.port)).copied();
            // MARK does not end the chain: no catch-all rule, or it would
            // overwrite every mark before it.
            let matches = slot_matches(table, false);
            if vs.reals.iter().any(|r| mark_of(r).is_none()) || work.rules.len() + matches.len() > MAX_RULES {
                let address = kpx_rules::model::join_host_port(&vs.address, vs.port);
                work.unslotted.push(format!("{} {address}", vs.protocol.as_str()));
                continue;
            }
            work.slotted.push((vs.address, vs.protocol, vs.port));
            let base =
                [Match::destination_ip(vs.address), Match::Protocol(vs.protocol), Match::DestinationPort(vs.port)];
            for (candidate, matches) in matches {
                let mark = mark_of(&vs.reals[candidate as usize]).expect("every real server has a mark");
                work.rules.push(
                    Rule::chain(Table::Nat, CHAIN)
                        .with_all(base.iter().cloned())
                        .with_all(matches)
                        .target(Target::SetMark { value: mark, mask: slot_mask }),
                );
            }
        }
        for ((ip, port), mark) in &self.by_real {
            for fwmark in [*mark, mark | masquerade_mark] {
                let service =
                    Service { key: ServiceKey::fwmark(ip, fwmark), scheduler: "rr".into(), flags: 0, timeout: 0 };
                work.services.push((service, Destination::new(*ip, *port, 1)));
            }
        }
        work
    }

    /// Whether a mark no plan needs may drain (only TCP used it, as far as
    /// this process knows; after a restart nobody knows: at once).
    pub fn drains(&self, mark: u32, masquerade_mark: u32) -> bool {
        self.tcp_only.get(&(mark & (masquerade_mark - 1))) == Some(&true)
    }
}

#[cfg(test)]
mod tests {
    use kpx_rules::model::{Protocol, SlotTable};
    use kpx_rules::ops::ipvs::VirtualServer;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn vs(address: &str, reals: &[&str], slots: Option<SlotTable>) -> VirtualServer {
        VirtualServer {
            address: ip(address),
            protocol: Protocol::Tcp,
            port: 80,
            scheduler: "rr".into(),
            scheduler_flags: 0,
            persistence_seconds: 0,
            reals: reals.iter().map(|r| RealServer { ip: ip(r), port: 8080, weight: 1 }).collect(),
            slots,
        }
    }

    fn table(slots: Vec<u32>) -> SlotTable {
        SlotTable { field: HashField::Source, seed: 7, rows: 1, cols: slots.len() as u8, slots }
    }

    #[test]
    fn every_slot_marks_its_real_server() {
        let rs = Ruleset {
            services: vec![
                vs("10.96.0.10", &["10.244.1.5", "10.244.2.5"], Some(table(vec![1, 0, 1]))),
                vs("10.96.0.11", &["10.244.3.5"], None),
            ],
        };
        let mut marks = Marks::default();
        let work = marks.plan(&rs, 0x4000, &BTreeSet::new());
        // Marks from the top, by real server in address order: .1.5 ->
        // 0x3fff, .2.5 -> 0x3ffe.
        let set: Vec<u32> = work
            .rules
            .iter()
            .map(|r| match r.target {
                Target::SetMark { value, mask } => {
                    assert_eq!(mask, 0x3fff, "the masquerade bit is left alone");
                    value
                }
                ref t => panic!("{t:?}"),
            })
            .collect();
        assert_eq!(set, [0x3ffe, 0x3fff, 0x3ffe]);
        // Exactly one rule matches a packet: the last one tests its slot too.
        assert!(work.rules.iter().all(|r| r.matches.iter().any(|m| matches!(m, Match::ClusterHash { .. }))));
        assert!(work.rules.iter().all(|r| r.matches.contains(&Match::destination_ip(ip("10.96.0.10")))));
        assert_eq!(work.slotted, [(ip("10.96.0.10"), Protocol::Tcp, 80)]);
        let keys: Vec<u32> = work.services.iter().map(|(s, _)| s.key.fwmark).collect();
        assert_eq!(keys, [0x3fff, 0x7fff, 0x3ffe, 0x7ffe]);
        assert_eq!(work.services[2].1.address, ip("10.244.2.5"));
        assert!(work.services.iter().all(|(s, _)| is_own(s, 0x4000)));
        assert!(work.unslotted.is_empty());
    }

    #[test]
    fn marks_are_kept_and_never_taken_from_the_kernels_services() {
        let two = Ruleset { services: vec![vs("10.96.0.10", &["10.244.1.5", "10.244.2.5"], Some(table(vec![0, 1])))] };
        let mut marks = Marks::default();
        marks.plan(&two, 0x4000, &BTreeSet::new());
        // .1.5 leaves; its services (0x3fff) still drain in the kernel.
        let one = Ruleset { services: vec![vs("10.96.0.10", &["10.244.2.5", "10.244.3.5"], Some(table(vec![0, 1])))] };
        let work = marks.plan(&one, 0x4000, &[0x3fff, 0x7fff, 0x3ffe, 0x7ffe].into());
        let by: BTreeMap<IpAddr, u32> = work.services.iter().map(|(s, d)| (d.address, s.key.fwmark & 0x3fff)).collect();
        assert_eq!(by[&ip("10.244.2.5")], 0x3ffe, "kept");
        assert_eq!(by[&ip("10.244.3.5")], 0x3ffd, "not the draining 0x3fff");
        assert!(marks.drains(0x7fff, 0x4000), "only TCP used it: it drains");
        let mut udp = one.clone();
        udp.services[0].protocol = Protocol::Udp;
        marks.plan(&udp, 0x4000, &[0x3fff, 0x3ffe, 0x3ffd].into());
        assert!(!marks.drains(0x3ffd, 0x4000), "UDP used it: at once");
        assert!(!Marks::default().drains(0x3ffe, 0x4000), "unknown (a restart): at once");
    }

    #[test]
    fn a_restart_keeps_the_kernels_marks() {
        let rs = Ruleset { services: vec![vs("10.96.0.10", &["10.244.1.5", "10.244.2.5"], Some(table(vec![0, 1])))] };
        let mut marks = Marks::default();
        marks.adopt([(0x3001, ip("10.244.2.5"), 8080), (0x3002, ip("10.244.9.5"), 8080)]);
        let work = marks.plan(&rs, 0x4000, &[0x3001, 0x7001, 0x3002, 0x7002].into());
        let by: BTreeMap<IpAddr, u32> = work.services.iter().map(|(s, d)| (d.address, s.key.fwmark & 0x3fff)).collect();
        assert_eq!(by[&ip("10.244.2.5")], 0x3001, "the kernel's mark kept");
        assert_eq!(by[&ip("10.244.1.5")], 0x3fff);
        assert!(marks.drains(0x3001, 0x4000), "a TCP plan uses it now");
        assert!(!marks.drains(0x3002, 0x4000), "no plan needs it and its protocols are unknown: at once");
    }

    #[test]
    fn only_kpxs_shape_and_range_are_its_own() {
        let svc = |mark: u32, scheduler: &str| Service {
            key: ServiceKey::fwmark(&ip("10.0.0.1"), mark),
            scheduler: scheduler.into(),
            flags: 0,
            timeout: 0,
        };
        assert!(is_own(&svc(0x3fff, "rr"), 0x4000) && is_own(&svc(0x7000, "rr"), 0x4000));
        // keepalived's fwmark 1, the masquerade bit alone, above it, another shape.
        for foreign in [svc(1, "rr"), svc(0x2fff, "rr"), svc(0x4000, "rr"), svc(0x8fff, "rr"), svc(0x3fff, "wlc")] {
            assert!(!is_own(&foreign, 0x4000), "{foreign:?}");
        }
        let mut persistent = svc(0x3fff, "rr");
        persistent.flags = 1;
        assert!(!is_own(&persistent, 0x4000));
    }

    #[test]
    fn past_the_marks_or_the_rules_a_virtual_server_keeps_its_scheduler() {
        let rs = Ruleset { services: vec![vs("10.96.0.10", &["10.244.1.5", "10.244.2.5"], Some(table(vec![0, 1])))] };
        // Masquerade bit 1: one mark (1), held by the kernel.
        let work = Marks::default().plan(&rs, 0b10, &[1].into());
        assert_eq!(
            (work.unslotted, work.rules.len(), work.slotted.len()),
            (vec!["tcp 10.96.0.10:80".to_string()], 0, 0)
        );
        let big = SlotTable {
            field: HashField::Source,
            seed: 7,
            rows: 32,
            cols: 32,
            slots: (0..1024).map(|i| i % 2).collect(),
        };
        let many: Vec<VirtualServer> =
            (0..20).map(|i| vs(&format!("10.96.1.{i}"), &["10.244.1.5", "10.244.2.5"], Some(big.clone()))).collect();
        let work = Marks::default().plan(&Ruleset { services: many }, 0x4000, &BTreeSet::new());
        assert!(work.rules.len() <= MAX_RULES, "{}", work.rules.len());
        assert_eq!((work.slotted.len(), work.unslotted.len()), (16, 4));
    }
}
