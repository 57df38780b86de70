//! Slot plans (mh, maglev) executed in ipvs mode, so that a client reaches
//! the endpoint the plan names, as in the iptables and nftables modes.
//!
//! IPVS schedules a connection on its first packet, looking up a
//! firewall-mark service first. The host gives every real server of a
//! slotted virtual server a mark (below the masquerade bit) and two
//! firewall-mark services holding that real server alone: one for the
//! mark, one for the mark with the masquerade bit (which nat KUBE-SERVICES
//! may set before IPVS sees the packet). Rules in nat KUBE-IPVS-SLOTS
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
use kpx_rules::model::HashField;
use kpx_rules::ops::iptables::{Match, Rule, Table, Target};
use kpx_rules::ops::ipvs::{RealServer, Ruleset};

use super::{Destination, Service, ServiceKey};

pub const CHAIN: &str = "KUBE-IPVS-SLOTS";

/// Whether a firewall-mark service is one of kpx's: a mark below the
/// masquerade bit, with or without that bit.
pub fn is_own_mark(mark: u32, masquerade_mark: u32) -> bool {
    let low = mark & !masquerade_mark;
    low != 0 && low < masquerade_mark && mark & !(masquerade_mark | (masquerade_mark - 1)) == 0
}

/// The marks of the real servers in slot plans.
#[derive(Debug, Default)]
pub struct Marks {
    by_real: BTreeMap<(IpAddr, u16), u32>,
}

/// What one sync writes for the slot plans.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SlotWork {
    /// nat KUBE-IPVS-SLOTS.
    pub rules: Vec<Rule>,
    /// The firewall-mark services, each with its one real server.
    pub services: Vec<(Service, Destination)>,
    /// Real servers left on their virtual server's own scheduler: no mark
    /// was free.
    pub unmarked: usize,
}

impl Marks {
    /// Marks for the ruleset's slotted real servers (kept for those that
    /// had one; the smallest free one for a new one, never one in `held`:
    /// the kernel's own firewall-mark services), the rules that set them
    /// and the services that take them.
    pub fn plan(&mut self, ruleset: &Ruleset, masquerade_mark: u32, held: &BTreeSet<u32>) -> SlotWork {
        let slot_mask = masquerade_mark - 1;
        let wanted: BTreeSet<(IpAddr, u16)> = ruleset
            .services
            .iter()
            .filter(|vs| vs.slots.as_ref().is_some_and(|t| t.field == HashField::Source))
            .flat_map(|vs| vs.reals.iter().map(|r| (r.ip, r.port)))
            .collect();
        self.by_real.retain(|real, _| wanted.contains(real));
        let mut taken: BTreeSet<u32> = self.by_real.values().copied().collect();
        taken.extend(held.iter().map(|m| m & slot_mask));
        let mut next = 1;
        let mut work = SlotWork::default();
        for real in &wanted {
            if self.by_real.contains_key(real) {
                continue;
            }
            while taken.contains(&next) {
                next += 1;
            }
            if next > slot_mask {
                work.unmarked += 1;
                continue;
            }
            taken.insert(next);
            self.by_real.insert(*real, next);
        }
        for vs in &ruleset.services {
            let Some(table) = vs.slots.as_ref().filter(|t| t.field == HashField::Source) else { continue };
            let mark_of = |r: &RealServer| self.by_real.get(&(r.ip, r.port)).copied();
            if vs.reals.iter().any(|r| mark_of(r).is_none()) {
                continue;
            }
            let base =
                [Match::destination_ip(vs.address), Match::Protocol(vs.protocol), Match::DestinationPort(vs.port)];
            // MARK does not end the chain: no catch-all rule, or it would
            // overwrite every mark before it.
            for (candidate, matches) in slot_matches(table, false) {
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
        // Marks by real server, in address order: .1.5 -> 1, .2.5 -> 2.
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
        assert_eq!(set, [2, 1, 2]);
        // Exactly one rule matches a packet: the last one tests its slot too.
        assert!(work.rules.iter().all(|r| r.matches.iter().any(|m| matches!(m, Match::ClusterHash { .. }))));
        assert!(work.rules.iter().all(|r| r.matches.contains(&Match::destination_ip(ip("10.96.0.10")))));
        let keys: Vec<u32> = work.services.iter().map(|(s, _)| s.key.fwmark).collect();
        assert_eq!(keys, [1, 0x4001, 2, 0x4002]);
        assert_eq!(work.services[2].1.address, ip("10.244.2.5"));
        assert_eq!(work.unmarked, 0);
    }

    #[test]
    fn marks_are_kept_and_never_taken_from_the_kernels_services() {
        let two = Ruleset { services: vec![vs("10.96.0.10", &["10.244.1.5", "10.244.2.5"], Some(table(vec![0, 1])))] };
        let mut marks = Marks::default();
        marks.plan(&two, 0x4000, &BTreeSet::new());
        // .1.5 leaves; its service (mark 1) still drains in the kernel.
        let one = Ruleset { services: vec![vs("10.96.0.10", &["10.244.2.5", "10.244.3.5"], Some(table(vec![0, 1])))] };
        let work = marks.plan(&one, 0x4000, &[1, 0x4001, 2, 0x4002].into());
        let by: BTreeMap<IpAddr, u32> = work.services.iter().map(|(s, d)| (d.address, s.key.fwmark)).collect();
        assert_eq!(by[&ip("10.244.2.5")] & 0x3fff, 2, "kept");
        assert_eq!(by[&ip("10.244.3.5")] & 0x3fff, 3, "not the draining mark 1");
    }

    #[test]
    fn own_marks_are_below_the_masquerade_bit() {
        assert!(is_own_mark(1, 0x4000) && is_own_mark(0x4001, 0x4000) && is_own_mark(0x3fff, 0x4000));
        assert!(!is_own_mark(0x4000, 0x4000) && !is_own_mark(0x8001, 0x4000) && !is_own_mark(0x10000, 0x4000));
    }

    #[test]
    fn no_free_mark_leaves_the_virtual_servers_scheduler() {
        let rs = Ruleset { services: vec![vs("10.96.0.10", &["10.244.1.5", "10.244.2.5"], Some(table(vec![0, 1])))] };
        let mut marks = Marks::default();
        // Masquerade bit 1: one mark (1), held by the kernel.
        let work = marks.plan(&rs, 0b10, &[1].into());
        assert_eq!((work.unmarked, work.rules.len()), (2, 0));
    }
}
