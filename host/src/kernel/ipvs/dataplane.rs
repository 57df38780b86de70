//! ipvs mode's kernel side: checks the backend's virtual servers against
//! the state, writes the host's ipsets and iptables rules (from the state,
//! as upstream's ipvs proxier does), binds the Service addresses to
//! kube-ipvs0 and reconciles the kernel's IPVS table to the ruleset.
//! Real servers that leave are
//! drained, not cut: TCP and SCTP ones keep weight 0 until their
//! connections are gone (checked at every sync), UDP ones go at once
//! (upstream's graceful termination).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kpx_rules::model::{Cidr, IpFamily, NodePortAddresses, Protocol, Settings};
use kpx_rules::ops::ipvs::{Ruleset, VirtualServer};
use kpx_rules::plan::IPVS_SCHEDULERS;

use super::msg::{SVC_F_PERSISTENT, SVC_F_SCHED1};
use super::sets::{NodeFacts, Sets};
use super::{Destination, Ipvs, Service, ServiceKey, link, slots};
use crate::kernel::iptables::IptablesKernel;
use crate::kernel::iptables::render::payload;
use crate::kernel::{Error, SyncError, Written};
use crate::validate::{Rejected, Scope};

/// IPVS timeouts to set once (seconds; 0 keeps the kernel's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp: u32,
    pub tcp_fin: u32,
    pub udp: u32,
}

/// The longest persistence: Kubernetes' largest ClientIP timeout (a
/// day); the kernel keeps it in jiffies.
pub const MAX_PERSISTENCE: u32 = 86_400;

pub struct IpvsDataplane {
    family: IpFamily,
    /// The family's iptables tools (and the executor for `ipset`).
    iptables: IptablesKernel,
    /// `--ipvs-exclude-cidrs`: virtual servers there are not kube-proxy's.
    exclude: Vec<Cidr>,
    timeouts: Timeouts,
    timeouts_set: bool,
    /// The firewall marks of slot plans' real servers.
    marks: slots::Marks,
    /// Slotted virtual servers last left on their own scheduler (warned
    /// about when the number changes).
    unslotted: usize,
    /// What the last successful sync left in the kernel (see `lost`).
    held: Option<Held>,
    /// The ipset script and the iptables payload written last: a partial
    /// sync whose own are the same writes neither (endpoint churn changes
    /// neither, and each is a process; a full sync always writes both).
    written_sets: Option<String>,
    written_rules: Option<String>,
    /// What a partial sync found gone of what the last one left, and put
    /// back (see `take_repaired`).
    repaired: Option<String>,
}

/// The kernel objects a sync left, looked up once per sync period: the
/// jumps from built-in chains and each of the host's chains' first rule,
/// the virtual servers, kube-ipvs0's addresses and the ipsets.
struct Held {
    rules: Vec<kpx_rules::ops::iptables::Rule>,
    services: BTreeSet<ServiceKey>,
    addresses: BTreeSet<IpAddr>,
    sets: Vec<String>,
}

impl Held {
    /// The virtual servers written that the kernel no longer holds.
    fn services_gone(&self, holds: impl Fn(&ServiceKey) -> bool) -> Option<String> {
        let first = self.services.iter().find(|k| !holds(k))?;
        let missing = self.services.iter().filter(|k| !holds(k)).count();
        Some(format!("{missing} virtual servers are gone, the first {first}"))
    }

    /// kube-ipvs0, or one of the family's addresses on it, gone (`bound`:
    /// its addresses; None: no kube-ipvs0). kube-ipvs0 is both families':
    /// a family with no address on it does not look.
    fn addresses_gone(&self, bound: Option<&BTreeSet<IpAddr>>) -> Option<String> {
        match bound {
            _ if self.addresses.is_empty() => None,
            None => Some(format!("{} is gone", link::KUBE_IPVS0)),
            Some(bound) => {
                self.addresses.difference(bound).next().map(|ip| format!("{ip} is no longer on {}", link::KUBE_IPVS0))
            }
        }
    }
}

fn kernel_error(e: super::Error) -> SyncError {
    SyncError::Kernel(Error::Netlink(e))
}

fn protocol_number(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// Refuses virtual servers outside the state: an address, protocol
/// and port that are not a Service destination (or a node address on
/// one of its node ports), a real server that is not an endpoint of
/// the state, a scheduler IPVS lacks, a duplicate.
pub fn check(plugin: &str, settings: &Settings, ruleset: &Ruleset, scope: &Scope) -> Result<(), Rejected> {
    let family = settings.family;
    let mut seen = BTreeSet::new();
    for (i, vs) in ruleset.services.iter().enumerate() {
        let refuse = |reason: String| Rejected {
            plugin: plugin.to_string(),
            at: format!("virtual server {i}"),
            item: format!("{vs:?}"),
            reason,
        };
        if !family.matches(&vs.address) {
            return Err(refuse(format!("an address outside the {} family", family)));
        }
        let destination = scope.destinations.contains(&(vs.address, vs.protocol, vs.port));
        // Node ports only on the addresses the host chose for them.
        let node_port = scope.node_ports.contains(&(vs.protocol, vs.port))
            && match &settings.nodeport_addresses {
                NodePortAddresses::Only(cidrs) => cidrs.iter().any(|c| c.is_host() && c.addr == vs.address),
                NodePortAddresses::All => false,
            };
        if !destination && !node_port {
            return Err(refuse("neither a Service destination nor a node port on a node address".into()));
        }
        if !seen.insert((vs.address, vs.protocol, vs.port)) {
            return Err(refuse("a second virtual server for the same address, protocol and port".into()));
        }
        if !IPVS_SCHEDULERS.contains(&vs.scheduler.as_str()) {
            return Err(refuse(format!("IPVS has no scheduler {:?}", vs.scheduler)));
        }
        if vs.scheduler_flags > 0b111 || vs.persistence_seconds > MAX_PERSISTENCE {
            return Err(refuse(format!("scheduler flags past bit 2, or a persistence past {MAX_PERSISTENCE} s")));
        }
        if let Some(table) = &vs.slots {
            if table.field != kpx_rules::model::HashField::Source {
                return Err(refuse(
                    "a slot table over the destination: return the one real server it names instead".into(),
                ));
            }
            if let Err(why) = kpx_rules::model::Plan::Slots(table.clone()).check(vs.reals.len()) {
                return Err(refuse(format!("its slot table: {why}")));
            }
        }
        let mut reals = BTreeSet::new();
        for r in &vs.reals {
            if !family.matches(&r.ip) || !scope.endpoints.contains(&(r.ip, r.port)) {
                return Err(refuse(format!("real server {} is no endpoint of the state", r.ip)));
            }
            if !reals.insert((r.ip, r.port)) || r.weight > i32::MAX as u32 {
                return Err(refuse(format!("real server {} twice, or a weight past 2^31-1", r.ip)));
            }
        }
    }
    Ok(())
}

impl IpvsDataplane {
    pub fn new(family: IpFamily, iptables: IptablesKernel, exclude: Vec<Cidr>, timeouts: Timeouts) -> IpvsDataplane {
        IpvsDataplane {
            family,
            iptables,
            exclude,
            timeouts,
            timeouts_set: false,
            marks: slots::Marks::default(),
            unslotted: 0,
            held: None,
            written_sets: None,
            written_rules: None,
            repaired: None,
        }
    }

    /// What the kernel lost of what the last sync wrote, if anything
    /// (someone ran `ipvsadm -C`, flushed a chain, deleted kube-ipvs0 or
    /// an address on it, or destroyed an ipset): checked once per sync
    /// period, and a loss makes the next sync full (the jumps from
    /// built-in chains are only written by full syncs). Upstream's ipvs
    /// proxier has no canary; it writes everything again at every sync.
    /// Each call also makes the next sync write the ipsets and the
    /// iptables rules again, so that once per sync period they are put
    /// back as upstream puts them back (a set's entries or a rule past a
    /// chain's first are not looked at here). A partial sync puts back
    /// virtual servers, real servers, kube-ipvs0 and its addresses
    /// itself, and says so (`take_repaired`).
    pub fn lost(&mut self, settings: &Settings) -> Result<Option<String>, Error> {
        self.written_sets = None;
        self.written_rules = None;
        let Some(held) = &self.held else { return Ok(None) };
        let d = crate::kernel::iptables::dialect(settings);
        let rules: Vec<&kpx_rules::ops::iptables::Rule> = held.rules.iter().collect();
        if let Some(what) = self.iptables.lost_rules(&rules, d)? {
            return Ok(Some(what));
        }
        let mut ipvs = Ipvs::open()?;
        let have: BTreeSet<ServiceKey> = ipvs.services()?.into_iter().map(|s| s.key).collect();
        let mut bound = None;
        if !held.addresses.is_empty() {
            let mut rtnl = link::Rtnl::open()?;
            if let Some((index, _)) = rtnl.link(link::KUBE_IPVS0)? {
                bound = Some(rtnl.addresses(index)?.into_iter().collect::<BTreeSet<IpAddr>>());
            }
        }
        if let Some(gone) = held.services_gone(|k| have.contains(k)).or_else(|| held.addresses_gone(bound.as_ref())) {
            return Ok(Some(gone));
        }
        let names = self.iptables.exec().run("ipset", &["list", "-n"], None)?;
        let present: BTreeSet<&str> = names.lines().map(str::trim).collect();
        if let Some(gone) = held.sets.iter().find(|s| !present.contains(s.as_str())) {
            return Ok(Some(format!("the ipset {gone} is gone")));
        }
        Ok(None)
    }

    /// What the last partial sync found gone of what the sync before left,
    /// and wrote again (someone cleared IPVS or deleted kube-ipvs0 between
    /// two periodic checks), once.
    pub fn take_repaired(&mut self) -> Option<String> {
        self.repaired.take()
    }

    /// Refuses virtual servers outside the state: an address, protocol
    /// and port that are not a Service destination (or a node address on
    /// one of its node ports), a real server that is not an endpoint of
    /// the state, a scheduler IPVS lacks, a duplicate.
    pub fn check(&self, plugin: &str, settings: &Settings, ruleset: &Ruleset, scope: &Scope) -> Result<(), Rejected> {
        check(plugin, settings, ruleset, scope)
    }

    fn excluded(&self, ip: &IpAddr) -> bool {
        self.exclude.iter().any(|c| c.contains(ip))
    }

    /// One sync. `ports`: the state's service ports, which the host's
    /// ipsets are computed from; `full`: the jumps from built-in chains
    /// are checked too.
    pub fn sync(
        &mut self,
        plugin: &str,
        settings: &Settings,
        ruleset: &Ruleset,
        state: crate::kernel::StateView<'_>,
        full: bool,
    ) -> Result<Written, SyncError> {
        let crate::kernel::StateView { scope, ports, local_addresses, .. } = state;
        let ports = crate::state::ports_in(ports);
        let (checked, check_time) = crate::cpu_time::of(|| self.check(plugin, settings, ruleset, scope));
        checked?;
        // The rest is the kernel's: IPVS, ipset, iptables and rtnetlink
        // reads and writes, the host's bookkeeping between them small.
        let t = crate::cpu_time::Span::start();
        let mut ipvs = Ipvs::open().map_err(kernel_error)?;
        let masquerade_mark = settings.masquerade_mark();
        // Every service of the family, so that one in an excluded range
        // is found (and left alone) rather than added again.
        let mut current: BTreeMap<ServiceKey, Service> = ipvs
            .services()
            .map_err(kernel_error)?
            .into_iter()
            .filter(|s| self.family.matches(&s.key.address))
            .map(|s| (s.key.clone(), s))
            .collect();
        // What the last sync left and is gone now (someone cleared IPVS
        // or deleted kube-ipvs0 since): this sync puts it back, and a
        // partial one says so (a full one was asked for by the check).
        let services_gone =
            self.held.as_ref().filter(|_| !full).and_then(|h| h.services_gone(|k| current.contains_key(k)));
        // After a restart, kpx's firewall-mark services tell which real
        // server had which mark: kept, established connections go on.
        if !self.marks.adopted() {
            let mut found = Vec::new();
            for s in
                current.values().filter(|s| s.key.fwmark & masquerade_mark == 0 && slots::is_own(s, masquerade_mark))
            {
                if let [d] = ipvs.destinations(&s.key).map_err(kernel_error)?.as_slice() {
                    found.push((s.key.fwmark, d.address, d.port));
                }
            }
            self.marks.adopt(found);
        }
        // Every firewall mark in the kernel is taken, kpx's or not.
        let held: BTreeSet<u32> = current.keys().map(|k| k.fwmark).filter(|m| *m != 0).collect();
        let work = self.marks.plan(ruleset, masquerade_mark, &held);
        if work.unslotted.len() != self.unslotted {
            self.unslotted = work.unslotted.len();
            if let Some(first) = work.unslotted.first() {
                tracing::warn!(
                    family = %self.family,
                    "{} virtual servers with slot plans (first {}) run their own IPVS scheduler instead: no \
                     firewall mark was free (kpx gives out {} below the masquerade bit) or their rules would pass {}",
                    work.unslotted.len(),
                    first,
                    slots::MAX_MARKS,
                    slots::MAX_RULES
                );
            }
        }
        // The firewall-mark services first: they take nothing until the
        // rules below mark connections for them.
        let mut writes = 0;
        let mut failures = Vec::new();
        for (service, real) in &work.services {
            match reconcile_one(&mut ipvs, service, std::slice::from_ref(real), false, current.get(&service.key)) {
                Ok(n) => {
                    writes += n;
                    current.insert(service.key.clone(), service.clone());
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
        // The node's own addresses are never bound to kube-ipvs0 (an
        // external IP may be one): KUBE-IPVS-FILTER would close the node's
        // other ports on them.
        let node_own: BTreeSet<IpAddr> = local_addresses.iter().copied().collect();
        let wanted: BTreeSet<IpAddr> = scope
            .destinations
            .iter()
            .map(|d| d.0)
            .filter(|ip| self.family.matches(ip) && !node_own.contains(ip))
            .collect();
        // The sets and rules first: a virtual server is never reachable
        // before its masquerading and its firewall are in place.
        let node_addresses: Vec<IpAddr> = match &settings.nodeport_addresses {
            NodePortAddresses::Only(cidrs) => cidrs.iter().filter(|c| c.is_host()).map(|c| c.addr).collect(),
            NodePortAddresses::All => Vec::new(),
        };
        let mut sets =
            Sets::desired(self.family, ports, &NodeFacts { node_addresses: &node_addresses, bound: &wanted });
        for (address, protocol, port) in &work.slotted {
            sets.add(super::sets::Kind::Slotted, super::sets::Entry::IpPort(*address, *protocol, *port));
        }
        let script = sets.restore_script();
        let mut tool_bytes = 0;
        if full || self.written_sets.as_deref() != Some(script.as_str()) {
            self.written_sets = None;
            self.iptables.exec().run("ipset", &["restore"], Some(script.as_bytes()))?;
            tool_bytes += script.len();
            self.written_sets = Some(script);
        }
        let d = crate::kernel::iptables::dialect(settings);
        let frame = super::iptables::frame(settings, &sets, work.rules);
        if full {
            self.iptables.ensure_jumps(&frame.jumps, d)?;
        }
        let (text, _) = payload(&frame, &Default::default(), &[], d, None);
        if full || self.written_rules.as_deref() != Some(text.as_str()) {
            self.written_rules = None;
            self.iptables.apply(&text)?;
            tool_bytes += text.len();
            self.written_rules = Some(text);
        }
        if !self.timeouts_set && self.timeouts != Timeouts::default() {
            let t = self.timeouts;
            // The kernel's refusal here must not stop the table's sync.
            match ipvs.set_timeouts(t.tcp, t.tcp_fin, t.udp) {
                Ok(()) => self.timeouts_set = true,
                Err(e) => tracing::error!(family = %self.family, "cannot set the IPVS timeouts: {e}"),
            }
        }
        let marked: BTreeSet<&ServiceKey> = work.services.iter().map(|(s, _)| &s.key).collect();
        let (more, more_failures) =
            self.reconcile(&mut ipvs, ruleset, &marked, &current, masquerade_mark).map_err(kernel_error)?;
        writes += more;
        failures.extend(more_failures);
        // Every Service address on kube-ipvs0, bound once its virtual
        // servers exist: traffic to it is local, so IPVS sees it (a port
        // without a virtual server is the node's own).
        let mut rtnl = link::Rtnl::open().map_err(kernel_error)?;
        let (index, created) = rtnl.ensure().map_err(kernel_error)?;
        let bound: BTreeSet<IpAddr> =
            rtnl.addresses(index).map_err(kernel_error)?.into_iter().filter(|ip| self.family.matches(ip)).collect();
        let addresses_gone =
            self.held.as_ref().filter(|_| !full).and_then(|h| h.addresses_gone((!created).then_some(&bound)));
        for ip in wanted.difference(&bound) {
            rtnl.add_address(index, *ip).map_err(kernel_error)?;
            writes += 1;
        }
        for ip in bound.difference(&wanted) {
            rtnl.delete_address(index, *ip).map_err(kernel_error)?;
            writes += 1;
        }
        let gone: Vec<String> = services_gone.into_iter().chain(addresses_gone).collect();
        self.repaired = (!gone.is_empty()).then(|| gone.join("; "));
        if let Some(first) = failures.first() {
            // What could be written was; the rest is retried in full.
            return Err(SyncError::Kernel(Error::IpvsRefused { count: failures.len(), first: first.clone() }));
        }
        // What the periodic check looks for: the jumps, and each chain's
        // first rule (a flushed chain loses it).
        let mut firsts: Vec<kpx_rules::ops::iptables::Rule> = frame.jumps.clone();
        let mut seen = BTreeSet::new();
        for r in frame.rules.iter().chain(&frame.trailing) {
            if seen.insert((r.table, r.chain.clone())) {
                firsts.push(r.clone());
            }
        }
        let mut services: BTreeSet<ServiceKey> = marked.iter().map(|k| (*k).clone()).collect();
        services.extend(ruleset.services.iter().map(|vs| service_of(vs).key));
        self.held = Some(Held {
            rules: firsts,
            services,
            addresses: wanted,
            sets: super::sets::Kind::ALL.iter().map(|k| k.name(self.family)).collect(),
        });
        let rules = frame.rules.iter().filter(|r| r.table == kpx_rules::ops::iptables::Table::Nat).count();
        // The ipset and iptables payloads, and one for each IPVS and
        // rtnetlink write.
        let spent = t.elapsed();
        Ok(Written {
            bytes: writes + tool_bytes,
            kernel: spent.wall,
            check: check_time,
            kernel_cpu: spent.cpu,
            iptables_rules: Some((frame.rules.len() - rules, rules)),
            iptables_written: None,
            steps: 1,
            cleanup_failed: false,
        })
    }

    /// Brings the kernel's table (`current`) to `ruleset` (the slot plans'
    /// firewall-mark services, `marked`, were written first), service by
    /// service: one the kernel
    /// refuses (a scheduler module it lacks, say) is reported and the
    /// others are still written. kpx's firewall-mark services that are no
    /// longer wanted drain like real servers. The number of writes and the
    /// refusals.
    fn reconcile(
        &mut self,
        ipvs: &mut Ipvs,
        ruleset: &Ruleset,
        marked: &BTreeSet<&ServiceKey>,
        current: &BTreeMap<ServiceKey, Service>,
        masquerade_mark: u32,
    ) -> Result<(usize, Vec<String>), super::Error> {
        let mut writes = 0;
        let mut failures = Vec::new();
        // The firewall-mark services were reconciled first (sync): wanted,
        // not written again.
        let mut wanted_keys: BTreeSet<ServiceKey> = marked.iter().map(|k| (*k).clone()).collect();
        for vs in &ruleset.services {
            let reals: Vec<Destination> = vs.reals.iter().map(|r| Destination::new(r.ip, r.port, r.weight)).collect();
            // Upstream drains TCP only: UDP and SCTP real servers go at once.
            let (service, at_once) = (service_of(vs), vs.protocol != Protocol::Tcp);
            wanted_keys.insert(service.key.clone());
            match reconcile_one(ipvs, &service, &reals, at_once, current.get(&service.key)) {
                Ok(n) => writes += n,
                Err(e) => failures.push(e.to_string()),
            }
        }
        for (key, service) in current.iter().filter(|(k, _)| !wanted_keys.contains(*k)) {
            let result = if key.fwmark != 0 {
                if !slots::is_own(service, masquerade_mark) {
                    continue;
                }
                if self.marks.drains(key.fwmark, masquerade_mark) {
                    drain_service(ipvs, key)
                } else {
                    ipvs.delete_service(key).map(|()| 1)
                }
            } else if self.excluded(&key.address) {
                continue;
            } else {
                ipvs.delete_service(key).map(|()| 1)
            };
            match result {
                Ok(n) => writes += n,
                Err(e) => failures.push(e.to_string()),
            }
        }
        Ok((writes, failures))
    }
}

/// One virtual service and its real servers.
fn reconcile_one(
    ipvs: &mut Ipvs,
    service: &Service,
    reals: &[Destination],
    at_once: bool,
    have: Option<&Service>,
) -> Result<usize, super::Error> {
    let mut writes = 0;
    let key = &service.key;
    match have {
        None => {
            ipvs.add_service(service)?;
            writes += 1;
        }
        Some(have) if have != service => {
            ipvs.update_service(service)?;
            writes += 1;
        }
        Some(_) => {}
    }
    let dests: BTreeMap<(IpAddr, u16), Destination> = if have.is_some() {
        ipvs.destinations(key)?.into_iter().map(|d| ((d.address, d.port), d)).collect()
    } else {
        BTreeMap::new()
    };
    for d in reals {
        match dests.get(&(d.address, d.port)) {
            None => {
                tracing::debug!(service = ?key, real = %d.address, port = d.port, weight = d.weight, "adding a real server");
                ipvs.add_destination(key, d)?;
                writes += 1;
            }
            Some(h) if h.weight != d.weight => {
                tracing::debug!(service = ?key, real = %d.address, port = d.port, from = h.weight, to = d.weight, "setting a real server's weight");
                ipvs.update_destination(key, d)?;
                writes += 1;
            }
            Some(_) => {}
        }
    }
    let kept: BTreeSet<(IpAddr, u16)> = reals.iter().map(|d| (d.address, d.port)).collect();
    for (_, d) in dests.iter().filter(|(a, _)| !kept.contains(a)) {
        writes += drain(ipvs, key, d, at_once)?;
    }
    Ok(writes)
}

/// A firewall-mark service no slot plan needs: its real servers drain
/// (weight 0 while they hold connections), then it goes.
fn drain_service(ipvs: &mut Ipvs, key: &ServiceKey) -> Result<usize, super::Error> {
    let dests = ipvs.destinations(key)?;
    if dests.iter().all(|d| d.active + d.inactive == 0) {
        ipvs.delete_service(key)?;
        return Ok(1);
    }
    let mut writes = 0;
    for d in dests.iter().filter(|d| d.weight != 0) {
        ipvs.update_destination(key, &Destination::new(d.address, d.port, 0))?;
        writes += 1;
    }
    Ok(writes)
}

/// A real server that left: at once (UDP, SCTP), else weight 0 until its
/// connections are gone. The kernel holds the state: a real server that
/// is in the table and not in the ruleset is draining.
fn drain(ipvs: &mut Ipvs, key: &ServiceKey, d: &Destination, at_once: bool) -> Result<usize, super::Error> {
    if at_once || d.active + d.inactive == 0 {
        tracing::debug!(service = ?key, real = %d.address, port = d.port, "removing a real server");
        ipvs.delete_destination(key, d)?;
        return Ok(1);
    }
    if d.weight != 0 {
        tracing::debug!(service = ?key, real = %d.address, port = d.port, connections = d.active + d.inactive, "draining a real server at weight 0");
        ipvs.update_destination(key, &Destination::new(d.address, d.port, 0))?;
        return Ok(1);
    }
    Ok(0)
}

fn service_of(vs: &VirtualServer) -> Service {
    let mut flags = u32::from(vs.scheduler_flags) * SVC_F_SCHED1;
    if vs.persistence_seconds > 0 {
        flags |= SVC_F_PERSISTENT;
    }
    Service {
        key: ServiceKey::new(vs.address, protocol_number(vs.protocol), vs.port),
        scheduler: vs.scheduler.clone(),
        flags,
        timeout: vs.persistence_seconds,
    }
}

/// `--cleanup`: every virtual server outside `exclude` (and kpx's
/// firewall-mark ones), and kube-ipvs0.
/// A node whose kernel has not loaded ip_vs has none (and asking would
/// load it).
pub fn cleanup(exclude: &[Cidr], masquerade_mark: u32) -> Result<usize, super::Error> {
    if !std::path::Path::new("/proc/net/ip_vs").exists() {
        return Ok(0);
    }
    let mut ipvs = match Ipvs::open() {
        Ok(i) => i,
        Err(super::Error::NoFamily(_)) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for s in ipvs.services()? {
        let ours = match s.key.fwmark {
            0 => !exclude.iter().any(|c| c.contains(&s.key.address)),
            _ => slots::is_own(&s, masquerade_mark),
        };
        if ours {
            ipvs.delete_service(&s.key)?;
            removed += 1;
        }
    }
    link::Rtnl::open()?.delete()?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::{Endpoint, ProxyMode, ServicePort};
    use kpx_rules::ops::ipvs::RealServer;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn state() -> (Settings, Scope) {
        let mut svc = ServicePort::new("ns", "web", "", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![Endpoint::ready(ip("10.244.1.5"), 8080)]);
        svc.cluster_ip = Some(ip("10.96.0.10"));
        svc.node_port = 30080;
        let mut scope = Scope::default();
        scope.count(IpFamily::V4, &svc, true);
        let mut settings = Settings::new(IpFamily::V4, ProxyMode::Ipvs);
        settings.nodeport_addresses = NodePortAddresses::Only(vec!["192.168.1.10/32".parse().unwrap()]);
        (settings, scope)
    }

    fn vs(address: &str, port: u16, real: &str) -> VirtualServer {
        VirtualServer {
            address: ip(address),
            protocol: Protocol::Tcp,
            port,
            scheduler: "rr".into(),
            scheduler_flags: 0,
            persistence_seconds: 0,
            reals: vec![RealServer { ip: ip(real), port: 8080, weight: 1 }],
            slots: None,
        }
    }

    fn check(services: Vec<VirtualServer>) -> Result<(), String> {
        let (settings, scope) = state();
        let iptables = IptablesKernel::new(IpFamily::V4, Box::new(crate::kernel::SystemExec::default()));
        let d = IpvsDataplane::new(IpFamily::V4, iptables, Vec::new(), Timeouts::default());
        d.check("hostile", &settings, &Ruleset { services }, &scope).map_err(|e| e.reason)
    }

    #[test]
    fn virtual_servers_stay_within_the_state() {
        assert_eq!(check(vec![vs("10.96.0.10", 80, "10.244.1.5"), vs("192.168.1.10", 30080, "10.244.1.5")]), Ok(()));
        // Outside the state: another address, another port, a node port on
        // an address that is not the node's, a foreign real server.
        assert!(check(vec![vs("8.8.8.8", 53, "10.244.1.5")]).unwrap_err().contains("neither a Service destination"));
        assert!(check(vec![vs("10.96.0.10", 81, "10.244.1.5")]).is_err());
        assert!(check(vec![vs("10.96.0.99", 30080, "10.244.1.5")]).is_err());
        assert!(check(vec![vs("10.96.0.10", 80, "1.1.1.1")]).unwrap_err().contains("no endpoint"));
        let mut evil = vs("10.96.0.10", 80, "10.244.1.5");
        evil.scheduler = "evil".into();
        assert!(check(vec![evil]).unwrap_err().contains("no scheduler"));
        let twice = vec![vs("10.96.0.10", 80, "10.244.1.5"), vs("10.96.0.10", 80, "10.244.1.5")];
        assert!(check(twice).unwrap_err().contains("second virtual server"));
        let mut v6 = vs("10.96.0.10", 80, "10.244.1.5");
        v6.address = ip("fd00::10");
        assert!(check(vec![v6]).unwrap_err().contains("family"));
        let mut long = vs("10.96.0.10", 80, "10.244.1.5");
        long.persistence_seconds = 86_401;
        assert!(check(vec![long]).is_err());
        // Slot tables: over the source, naming real servers that are there.
        use kpx_rules::model::{HashField, SlotTable};
        let table = |field, slots: Vec<u32>| SlotTable { field, seed: 1, rows: 1, cols: slots.len() as u8, slots };
        let mut slotted = vs("10.96.0.10", 80, "10.244.1.5");
        slotted.slots = Some(table(HashField::Source, vec![0, 0]));
        assert_eq!(check(vec![slotted.clone()]), Ok(()));
        slotted.slots = Some(table(HashField::Source, vec![0, 1]));
        assert!(check(vec![slotted.clone()]).unwrap_err().contains("slot table"));
        slotted.slots = Some(table(HashField::Destination, vec![0, 0]));
        assert!(check(vec![slotted]).unwrap_err().contains("over the destination"));
    }
}
