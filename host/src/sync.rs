//! The sync loop: applies source events to the state and runs the family
//! proxiers with upstream's bounded frequency — at least `min_period`
//! between syncs, at least one per `sync_period`, a full render every
//! [`FULL_SYNC_PERIOD`], and a failed sync retried (in full) with backoff.

pub mod bound;
pub mod coverage;
pub mod family;
pub mod planner;

pub use family::FamilyProxier;

use crate::family::{Error, Report};
use crate::userspace::UserspaceProxier;
use crate::userspace::localhost::LocalhostNodePorts;

/// One family's proxier: the rule modes' (a backend plugin's rules), or
/// userspace mode's (the host's relays).
pub enum Proxier {
    /// With, in nftables mode, the relay for localhost node ports
    /// (`--localhost-nodeports-proxy`, IPv4).
    Rules(Box<FamilyProxier>, Option<Box<LocalhostNodePorts>>),
    Userspace(Box<UserspaceProxier>),
}

impl Proxier {
    pub fn family(&self) -> kpx_rules::model::IpFamily {
        match self {
            Proxier::Rules(p, _) => p.family(),
            Proxier::Userspace(p) => p.family(),
        }
    }

    /// Whether it skips the periodic full sync: iptables mode in large
    /// cluster mode (more than 1,000 endpoints), as upstream since v1.37.
    fn skips_periodic_full(&self) -> bool {
        matches!(self, Proxier::Rules(p, _) if p.mode() == ProxyMode::Iptables && p.large_cluster())
    }

    /// Whether its next sync is full whatever the pass asks.
    fn needs_full(&self) -> bool {
        match self {
            Proxier::Rules(p, _) => p.needs_full(),
            Proxier::Userspace(_) => false,
        }
    }

    fn uses_load(&self) -> bool {
        matches!(self, Proxier::Rules(p, _) if p.uses_load())
    }

    fn refresh_load(&mut self) -> bool {
        match self {
            Proxier::Rules(p, _) => p.refresh_load(),
            Proxier::Userspace(_) => false,
        }
    }

    fn sync(&mut self, state: &State, changes: &Changes, full: bool) -> Result<Report, Error> {
        match self {
            Proxier::Rules(p, localhost) => {
                let report = p.sync(state, changes, full)?;
                if let Some(l) = localhost {
                    l.sync(state, changes, report.full);
                }
                Ok(report)
            }
            Proxier::Userspace(p) => p.sync(state, changes, full),
        }
    }

    /// The backend plugin, in the rule modes.
    fn rules(&self) -> Option<&FamilyProxier> {
        match self {
            Proxier::Rules(p, _) => Some(p),
            Proxier::Userspace(_) => None,
        }
    }

    fn rules_mut(&mut self) -> Option<&mut FamilyProxier> {
        match self {
            Proxier::Rules(p, _) => Some(p),
            Proxier::Userspace(_) => None,
        }
    }

    /// (service port, scheduler name) of every port it serves that names one.
    fn scheduler_users(&self) -> Vec<(String, String)> {
        match self {
            Proxier::Rules(p, l) => {
                let mut out = p.scheduler_users();
                out.extend(l.iter().flat_map(|l| l.scheduler_users()));
                out
            }
            Proxier::Userspace(p) => p.scheduler_users(),
        }
    }

    /// The `index`-th scheduler component it runs.
    fn scheduler_plugin(&self, index: usize) -> Option<std::sync::Arc<crate::runtime::SchedulerPlugin>> {
        match self {
            Proxier::Rules(p, _) => p.scheduler_plugin(index),
            Proxier::Userspace(p) => p.picker().plugin(index),
        }
    }

    /// The scheduler components its relays ask (userspace mode, localhost
    /// node ports).
    fn picker(&self) -> Option<&std::sync::Arc<crate::userspace::balancer::Picker>> {
        match self {
            Proxier::Rules(_, l) => l.as_deref().map(LocalhostNodePorts::picker),
            Proxier::Userspace(p) => Some(p.picker()),
        }
    }

    fn mode(&self) -> ProxyMode {
        match self {
            Proxier::Rules(p, _) => p.mode(),
            Proxier::Userspace(_) => ProxyMode::Userspace,
        }
    }

    /// The name the plugin metrics carry.
    fn plugin_name(&self) -> &str {
        match self {
            Proxier::Rules(p, _) => p.plugin_name(),
            Proxier::Userspace(_) => "userspace",
        }
    }
}

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use kpx_rules::model::{IpFamily, ProxyMode};

use crate::kernel::SyncError;
use crate::reload::{Loaded, Replacement, Role, Watcher};
use crate::serve::Telemetry;
use crate::serve::health::Stamp;
use crate::serve::metrics::{
    FamilyLabel, PluginLabel, PolicyLabel, ProtocolLabel, ReloadLabel, TableLabel, family_name,
};
use crate::source::{Event, Kind, Object, ObjectRef};
use crate::state::{Changes, State};

/// The earliest time a failed extension of any family is to be tried again.
fn extension_retry(proxiers: &[Proxier]) -> Option<Instant> {
    proxiers.iter().filter_map(Proxier::rules).filter_map(FamilyProxier::extension_retry).min()
}

/// How often the extensions' counters are read for /metrics.
pub const EXTENSION_COUNTER_INTERVAL: Duration = Duration::from_secs(2);

/// upstream's `proxyutil.FullSyncPeriod`.
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy)]
pub struct Periods {
    pub min: Duration,
    pub max: Duration,
}

/// When the next sync is due.
#[derive(Debug)]
struct Schedule {
    periods: Periods,
    last_end: Option<Instant>,
    last_full: Option<Instant>,
    pending: bool,
    retry_at: Option<Instant>,
    retry_delay: Duration,
}

impl Schedule {
    fn new(periods: Periods) -> Schedule {
        Schedule {
            periods,
            last_end: None,
            last_full: None,
            pending: true,
            retry_at: None,
            retry_delay: Self::first_retry(periods),
        }
    }

    fn first_retry(periods: Periods) -> Duration {
        periods.min.max(Duration::from_secs(1)).min(periods.max)
    }

    fn next(&self, now: Instant) -> Instant {
        let Some(end) = self.last_end else { return now };
        let earliest = end + self.periods.min;
        let mut due = end + self.periods.max;
        if self.pending {
            due = due.min(earliest.max(now));
        }
        if let Some(retry) = self.retry_at {
            due = due.min(retry.max(earliest));
        }
        due
    }

    fn wants_full(&self, now: Instant) -> bool {
        self.last_full.is_none_or(|t| now.duration_since(t) >= FULL_SYNC_PERIOD)
    }

    /// A pass ended; `short_of_descriptors`: it failed for want of file
    /// descriptors (EMFILE, ENFILE), which come back as soon as a relay
    /// or a client lets go: retried at the first delay, not backed off.
    fn done(&mut self, now: Instant, ok: bool, full: bool, short_of_descriptors: bool) {
        self.last_end = Some(now);
        self.pending = false;
        if ok {
            self.retry_at = None;
            self.retry_delay = Self::first_retry(self.periods);
            if full {
                self.last_full = Some(now);
            }
        } else if short_of_descriptors {
            self.retry_at = Some(now + Self::first_retry(self.periods));
        } else {
            self.retry_at = Some(now + self.retry_delay);
            self.retry_delay = (self.retry_delay * 2).min(self.periods.max);
        }
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// What the sources reported since the last good sync, as upstream's
/// change trackers count it: every change in the totals, each object
/// with a pending change once in the pending gauges.
#[derive(Default)]
struct Pending {
    services: std::collections::BTreeSet<ObjectRef>,
    endpoints: std::collections::BTreeSet<ObjectRef>,
    /// When the EndpointSlice controller saw each pending change
    /// (`endpoints.kubernetes.io/last-change-trigger-time`), and the
    /// family of the slice's addresses (that family's proxier programs it).
    triggers: Vec<(IpFamily, std::time::SystemTime)>,
}

/// Change times kept between good syncs at most.
const MAX_TRIGGERS: usize = 10_000;

/// An EndpointSlice's change time, if it carries one, with its family.
fn trigger_time(event: &Event) -> Option<(IpFamily, std::time::SystemTime)> {
    let Event::Apply(Object::EndpointSlice(slice)) = event else { return None };
    let family = match slice.address_type.as_str() {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        _ => return None,
    };
    let text = slice.meta.annotations.as_ref()?.get(crate::wellknown::TRIGGER_TIME)?;
    let time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time =
        serde_json::from_value(serde_json::Value::String(text.clone())).ok()?;
    Some((family, time.0.into()))
}

impl Pending {
    fn note(&mut self, event: &Event, telemetry: &Telemetry, started: std::time::SystemTime) {
        // As upstream: changes from before kpx started (an initial list)
        // say nothing about programming latency. A long failing streak
        // keeps a bounded sample.
        if let Some(t) = trigger_time(event).filter(|(_, t)| *t >= started)
            && self.triggers.len() < MAX_TRIGGERS
        {
            self.triggers.push(t);
        }
        let object = match event {
            Event::Apply(o @ (Object::Service(_) | Object::EndpointSlice(_))) => o.object_ref(),
            Event::Delete(r) => r.clone(),
            _ => return,
        };
        let m = &telemetry.metrics;
        match object.kind {
            Kind::Service => {
                m.service_changes_total.inc();
                self.services.insert(object);
                m.service_changes_pending.set(self.services.len() as i64);
            }
            Kind::EndpointSlice => {
                m.endpoint_changes_total.inc();
                self.endpoints.insert(object);
                m.endpoint_changes_pending.set(self.endpoints.len() as i64);
            }
            _ => {}
        }
    }

    /// A good sync programmed everything pending.
    fn clear(&mut self, telemetry: &Telemetry) {
        let now = std::time::SystemTime::now();
        for (family, t) in self.triggers.drain(..) {
            if let Ok(latency) = now.duration_since(t) {
                let h = telemetry.metrics.network_programming.get_or_create(&FamilyLabel::of(family));
                h.observe(latency.as_secs_f64());
            }
        }
        *self = Pending::default();
        telemetry.metrics.service_changes_pending.set(0);
        telemetry.metrics.endpoint_changes_pending.set(0);
    }
}

/// Service ports with a Local policy and endpoints, none of them on this
/// node, per family and Service (kept for the Services that changed).
#[derive(Default)]
struct NoLocal {
    by_service: std::collections::BTreeMap<(IpFamily, crate::state::ServiceName), (usize, usize)>,
}

impl NoLocal {
    fn update(&mut self, state: &State, changes: &Changes, families: &[IpFamily], telemetry: &Telemetry) {
        for &family in families {
            for name in changes.services.keys() {
                let key = (family, name.clone());
                match state.no_local_endpoints(name, family) {
                    (0, 0) => self.by_service.remove(&key),
                    counts => self.by_service.insert(key, counts),
                };
            }
            let (internal, external) = self
                .by_service
                .iter()
                .filter(|((f, _), _)| *f == family)
                .fold((0, 0), |(i, e), (_, (a, b))| (i + a, e + b));
            let m = &telemetry.metrics.no_local_endpoints;
            let label = |policy: &str| PolicyLabel {
                ip_family: family_name(family).to_string(),
                traffic_policy: policy.to_string(),
            };
            m.get_or_create(&label("internal")).set(internal as i64);
            m.get_or_create(&label("external")).set(external as i64);
        }
    }
}

/// The plugin's call, fuel and trap counters, as read last (the families
/// share one plugin). Traps are counted where they happen: a sync retries
/// a trapped render at once with a fresh instance, and the pass succeeds.
/// A plugin loaded by a hot swap (or a rollback) has counters of its own,
/// starting at 0: the baselines go with the counters they were read from.
#[derive(Default)]
struct PluginCounts {
    /// The counters read (their address), for as long as they are the plugin's.
    of: usize,
    calls: u64,
    fuel: u64,
    traps: u64,
}

impl PluginCounts {
    fn update(&mut self, proxier: &FamilyProxier, telemetry: &Telemetry) {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = proxier.plugin_stats();
        let of = std::ptr::from_ref(stats) as usize;
        if of != self.of {
            *self = PluginCounts { of, ..PluginCounts::default() };
        }
        let (calls, fuel, traps) = (stats.calls.load(Relaxed), stats.fuel.load(Relaxed), stats.traps.load(Relaxed));
        let plugin = PluginLabel { plugin: proxier.plugin_name().to_string() };
        let m = &telemetry.metrics;
        m.plugin_calls.get_or_create(&plugin).inc_by(calls.saturating_sub(self.calls));
        m.plugin_fuel.get_or_create(&plugin).inc_by(fuel.saturating_sub(self.fuel));
        m.plugin_traps.get_or_create(&plugin).inc_by(traps.saturating_sub(self.traps));
        (self.calls, self.fuel, self.traps) = (calls, fuel, traps);
    }
}

/// nftables mode's localhost node ports on /metrics (KEP-6032): the
/// relay's listeners and failures after each pass, and the packets the
/// host's rules refused, read from their counter objects as deltas.
#[derive(Default)]
struct LocalhostSeries {
    rejected: std::collections::BTreeMap<(IpFamily, kpx_rules::model::Protocol), u64>,
}

impl LocalhostSeries {
    fn after_pass(proxiers: &mut [Proxier], telemetry: &Telemetry) {
        let m = &telemetry.metrics;
        for p in proxiers.iter_mut() {
            if let Proxier::Rules(_, Some(l)) = p {
                let family = FamilyLabel::of(l.family());
                m.localhost_nodeport_listeners.get_or_create(&family).set(l.listening() as i64);
                m.localhost_nodeport_listener_failures.get_or_create(&family).inc_by(l.take_failures());
            }
        }
    }

    fn read(&mut self, proxiers: &mut [Proxier], telemetry: &Telemetry) {
        for p in proxiers.iter_mut().filter_map(Proxier::rules_mut) {
            let family = p.family();
            for (protocol, packets) in p.localhost_rejected() {
                let last = self.rejected.insert((family, protocol), packets).unwrap_or(0);
                // A counter made anew starts again from 0.
                let delta = if packets >= last { packets - last } else { packets };
                let label = ProtocolLabel {
                    ip_family: family_name(family).to_string(),
                    protocol: protocol.to_string().to_uppercase(),
                };
                telemetry.metrics.localhost_nodeport_rejected.get_or_create(&label).inc_by(delta);
            }
        }
    }
}

/// upstream's nfacct counters on /metrics (iptables mode), read as deltas.
#[derive(Default)]
struct NfacctSeries {
    last: std::collections::BTreeMap<String, u64>,
}

impl NfacctSeries {
    fn read(&mut self, telemetry: &Telemetry) {
        use crate::kernel::nfacct;
        let packets = match nfacct::packets() {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("cannot read the nfacct counters: {e}");
                return;
            }
        };
        let m = &telemetry.metrics;
        for (name, counter) in [
            (nfacct::CT_STATE_INVALID_DROPPED, &m.ct_state_invalid_dropped),
            (nfacct::LOCALHOST_NODEPORTS_ACCEPTED, &m.localhost_nodeports_accepted),
        ] {
            let Some(&now) = packets.get(name) else { continue };
            let last = self.last.insert(name.to_string(), now).unwrap_or(0);
            counter.inc_by(if now >= last { now - last } else { now });
        }
    }
}

/// Whether a failure came from the process (EMFILE) or the system
/// (ENFILE) running out of file descriptors: an `io::Error` among its
/// causes says so (never the text of a tool's or a plugin's message).
fn is_short_of_descriptors(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>()
            && matches!(io.raw_os_error(), Some(nix::libc::EMFILE | nix::libc::ENFILE))
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A failed sync, counted as upstream (and kpx) count them; `partial`:
/// the sync tried was a partial one.
fn count_failure(telemetry: &Telemetry, proxier: &Proxier, e: &Error, partial: bool) {
    let m = &telemetry.metrics;
    let plugin = PluginLabel { plugin: proxier.plugin_name().to_string() };
    let family = FamilyLabel::of(proxier.family());
    // upstream's iptables proxier: any failed partial sync.
    if partial && matches!(proxier.mode(), ProxyMode::Iptables) {
        m.iptables_partial_restore_failures.get_or_create(&family).inc();
    }
    match e {
        // Traps are counted from the plugin's own counter (PluginCounts).
        Error::Plugin(_) => {}
        Error::Sync { source: SyncError::Kernel(k), .. } => match proxier.mode() {
            ProxyMode::Iptables | ProxyMode::Userspace => {
                m.iptables_restore_failures.get_or_create(&family).inc();
            }
            ProxyMode::Nftables => {
                m.nftables_sync_failures.get_or_create(&family).inc();
            }
            ProxyMode::Ipvs => {
                // upstream's ipvs mode counts its iptables-restore failures.
                // (iptables-restore, iptables-nft-restore, ip6tables-legacy-restore...)
                if k.program().is_some_and(|p| p.contains("tables") && p.ends_with("-restore")) {
                    m.iptables_restore_failures.get_or_create(&family).inc();
                }
                m.ipvs_sync_failures.inc();
            }
        },
        Error::Sync { source: SyncError::Rejected(_) | SyncError::WrongMode { .. }, .. } => {
            m.plugin_refusals.get_or_create(&plugin).inc();
        }
        // Written as a full sync by the proxier; not a failure.
        Error::Sync { source: SyncError::Overfull(_), .. } => {}
    };
}

/// Tries a replaced component file on every proxier, and switches all of
/// them to it or none (the running component keeps serving); the
/// outcome is logged and counted. True when it was applied.
fn replace(proxiers: &mut [Proxier], replacement: Replacement, telemetry: &Telemetry) -> bool {
    let Replacement { role, path, loaded, .. } = replacement;
    let component = role.label();
    // An extension whose file did not load at start has nothing running.
    let running = match &role {
        Role::Extension { index, .. } => proxiers.iter().filter_map(Proxier::rules).any(|p| p.extension_loaded(*index)),
        _ => true,
    };
    let outcome = loaded.and_then(|loaded| match (loaded, &role) {
        (Loaded::Backend(plugin), _) => {
            let trials = proxiers
                .iter()
                .filter_map(Proxier::rules)
                .map(|p| p.try_backend(plugin.clone()).map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, String>>()?;
            if trials.is_empty() {
                return Err("userspace mode runs no backend component".into());
            }
            for (p, trial) in proxiers.iter_mut().filter_map(Proxier::rules_mut).zip(trials) {
                p.commit(trial);
            }
            Ok(())
        }
        (Loaded::Scheduler(plugin), Role::Scheduler { index, .. }) => {
            // A name the state's Services use must not disappear with it;
            // the ports naming either component's schedulers are planned again.
            let names = |p: &crate::runtime::SchedulerPlugin| {
                p.instantiate().map(|i| i.names().to_vec()).map_err(|e| e.to_string())
            };
            let new_names = names(&plugin)?;
            let mut affected = new_names.clone();
            if let Some(old) = proxiers.iter().find_map(|p| p.scheduler_plugin(*index)) {
                let old_names = names(&old)?;
                let users = proxiers.iter().flat_map(Proxier::scheduler_users);
                if let Some((key, name)) =
                    users.into_iter().find(|(_, n)| old_names.contains(n) && !new_names.contains(n))
                {
                    return Err(format!("the replacement no longer exports the scheduler {name:?}, which {key} uses"));
                }
                affected.extend(old_names);
            }
            let mut pickers: Vec<std::sync::Arc<crate::userspace::balancer::Picker>> = Vec::new();
            for p in proxiers.iter().filter_map(Proxier::picker) {
                if !pickers.iter().any(|q| std::sync::Arc::ptr_eq(p, q)) {
                    pickers.push(p.clone());
                }
            }
            let instances = pickers
                .iter()
                .map(|_| crate::userspace::balancer::Picker::try_replacement(&plugin))
                .collect::<Result<Vec<_>, String>>()?;
            let trials = proxiers
                .iter()
                .filter_map(Proxier::rules)
                .map(|p| p.try_scheduler(*index, plugin.clone(), &affected).map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, String>>()?;
            for (picker, instance) in pickers.iter().zip(instances) {
                picker.replace(*index, plugin.clone(), instance);
            }
            for (p, trial) in proxiers.iter_mut().filter_map(Proxier::rules_mut).zip(trials) {
                p.commit(trial);
            }
            Ok(())
        }
        (Loaded::Extension(plugin), Role::Extension { index, .. }) => {
            let trials = proxiers
                .iter()
                .filter_map(Proxier::rules)
                .map(|p| p.try_extension(*index, &plugin).map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, String>>()?;
            for (p, trial) in proxiers.iter_mut().filter_map(Proxier::rules_mut).zip(trials) {
                p.switch_extension(*index, plugin.clone(), trial);
            }
            Ok(())
        }
        (loaded, role) => Err(format!("{} loaded for the file of {}", loaded.kind(), role.label())),
    });
    let label = |outcome: &str| ReloadLabel { component: component.clone(), outcome: outcome.into() };
    match outcome {
        Ok(()) => {
            telemetry.metrics.plugin_reloads.get_or_create(&label("applied")).inc();
            tracing::info!(component = %component, file = %path.display(), "replaced component applied: a full sync follows");
            true
        }
        Err(e) => {
            telemetry.metrics.plugin_reloads.get_or_create(&label("refused")).inc();
            let stays =
                if running { "the running one keeps serving" } else { "nothing runs for it until its file loads" };
            tracing::error!(component = %component, file = %path.display(), "replaced component refused, {stays}: {e}");
            false
        }
    }
}

/// A stage's time for the log: milliseconds, to 10 µs.
fn millis(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

/// Runs until the source's sender is dropped (the source stopped).
/// `watcher`: the component files replaced while kpx runs.
pub fn run(
    mut state: State,
    events: Receiver<Event>,
    mut proxiers: Vec<Proxier>,
    periods: Periods,
    telemetry: &Telemetry,
    mut watcher: Option<Watcher>,
) {
    // A replacement switched to, confirmed once a pass has synced it everywhere.
    let mut switched: Option<(Role, [u8; 32], String)> = None;
    let mut schedule = Schedule::new(periods);
    let mut changes = Changes::default();
    let mut pending = Pending::default();
    let started = std::time::SystemTime::now();
    let mut no_local = NoLocal::default();
    let mut plugin_counts = PluginCounts::default();
    let mut iptables_rules: std::collections::BTreeMap<kpx_rules::model::IpFamily, (usize, usize)> = Default::default();
    let mut next_load = Instant::now() + planner::LOAD_INTERVAL;
    let nfacct = proxiers.iter().filter_map(Proxier::rules).any(FamilyProxier::counts_in_nfacct);
    let counting = nfacct
        || proxiers.iter().filter_map(Proxier::rules).any(|p| p.has_extensions() || p.mode() == ProxyMode::Nftables);
    let mut localhost = LocalhostSeries::default();
    let mut nfacct_series = NfacctSeries::default();
    let mut next_count = Instant::now() + EXTENSION_COUNTER_INTERVAL;
    // The kernel's rules are checked once per sync period (upstream's
    // canary), at most once a second: at most one period after someone
    // deletes or flushes them, a full sync writes them again.
    let canary_period = periods.max.max(Duration::from_secs(1));
    let mut next_canary = Instant::now() + canary_period;
    let mut extension_series = crate::serve::metrics::ExtensionSeries::default();
    let families: Vec<IpFamily> = proxiers.iter().map(Proxier::family).collect();
    loop {
        let received = if state.is_synced() {
            let now = Instant::now();
            let mut wake = schedule.next(now);
            if proxiers.iter().any(Proxier::uses_load) {
                wake = wake.min(next_load);
            }
            if counting {
                wake = wake.min(next_count);
            }
            // A retry already due is a pending sync (set below): waking
            // for it again would spin until the sync may run.
            if let Some(retry) = extension_retry(&proxiers).filter(|t| *t > now) {
                wake = wake.min(retry);
            }
            if let Some(poll) = watcher.as_ref().and_then(Watcher::next_poll) {
                wake = wake.min(poll);
            }
            events.recv_timeout(wake.saturating_duration_since(now))
        } else {
            events.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        match received {
            Ok(event) => {
                let (mut changed, mut node) = (false, false);
                for event in std::iter::once(event).chain(std::iter::from_fn(|| events.try_recv().ok())) {
                    pending.note(&event, telemetry, started);
                    node |= matches!(&event, Event::Apply(Object::Node(_)))
                        || matches!(&event, Event::Delete(r) if r.kind == crate::source::Kind::Node);
                    changed |= state.apply(event);
                }
                // Upstream queues nothing before its initial lists are in:
                // a long first list must not make the proxy unhealthy.
                if changed && state.is_synced() {
                    let now = Stamp::now();
                    for proxier in &proxiers {
                        telemetry.health.queued(proxier.family(), now);
                        let family = FamilyLabel::of(proxier.family());
                        telemetry.metrics.last_queued_timestamp.get_or_create(&family).set(unix_now());
                    }
                }
                if node {
                    match state.node_object() {
                        Some(n) => telemetry.health.sync_node(n),
                        None => telemetry.health.forget_node(),
                    }
                }
                schedule.pending |= changed;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        // Replaced component files: tried on the live state, switched to
        // (all families or none), then written by a full sync.
        let now = Instant::now();
        if let Some(w) = watcher.as_mut() {
            for replacement in w.poll(now) {
                // One switch settles (a sync pass) before the next is tried.
                if switched.is_some() {
                    w.defer(replacement);
                    continue;
                }
                let (role, digest, path) =
                    (replacement.role.clone(), replacement.digest, replacement.path.display().to_string());
                if replace(&mut proxiers, replacement, telemetry) {
                    switched = Some((role, digest, path));
                    schedule.pending = true;
                }
            }
        }
        // Schedulers that plan from live load: measured every interval;
        // a changed plan is a pending change.
        if now >= next_load {
            next_load = now + planner::LOAD_INTERVAL;
            for proxier in &mut proxiers {
                schedule.pending |= proxier.refresh_load();
            }
        }
        // A failed extension's retry is due: a sync tries it (the others
        // have nothing to write).
        // Not while the sync itself backs off: extensions run after a good
        // write, and their retry must not hurry a failing sync.
        if schedule.retry_at.is_none() && extension_retry(&proxiers).is_some_and(|t| t <= now) {
            schedule.pending = true;
        }
        if counting && now >= next_count {
            next_count = now + EXTENSION_COUNTER_INTERVAL;
            let (mut counted, mut failed) = (Vec::new(), Vec::new());
            for p in proxiers.iter_mut().filter_map(Proxier::rules_mut) {
                counted.extend(p.extension_counted());
                failed.extend(p.extension_failures());
            }
            extension_series.update(&telemetry.metrics, counted, failed);
            localhost.read(&mut proxiers, telemetry);
            if nfacct {
                nfacct_series.read(telemetry);
            }
        }
        if schedule.next(now) > now {
            continue;
        }
        let start = Instant::now();
        changes.merge(state.take_changes());
        // The periodic full sync (FULL_SYNC_PERIOD); a loss the canary
        // found makes one required.
        let periodic = schedule.wants_full(start);
        let mut full = false;
        if start >= next_canary {
            next_canary = start + canary_period;
            for p in proxiers.iter_mut().filter_map(Proxier::rules_mut) {
                if let Some(what) = p.lost() {
                    tracing::warn!(family = %p.family(), "the kernel lost kube-proxy's rules ({what}): a full sync writes them again");
                    telemetry.metrics.rules_lost.inc();
                    full = true;
                }
            }
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            let names: Vec<String> = changes.services.keys().map(ToString::to_string).collect();
            tracing::debug!(full, periodic, node = changes.node, cluster = changes.cluster, services = ?names, "sync pass");
        }
        let mut skipped_periodic = false;
        let mut ok = true;
        let mut short_of_descriptors = true;
        let m = &telemetry.metrics;
        for proxier in &mut proxiers {
            let t = Instant::now();
            let family = FamilyLabel::of(proxier.family());
            let (full, skips) = full_this_pass(full, periodic, proxier.skips_periodic_full());
            skipped_periodic |= skips;
            let partial = !full && !proxier.needs_full();
            let result = proxier.sync(&state, &changes, full);
            let took = t.elapsed().as_secs_f64();
            m.sync_duration.get_or_create(&family).observe(took);
            match &result {
                Ok(r) if r.full => m.full_sync_duration.get_or_create(&family).observe(took),
                Ok(_) => m.partial_sync_duration.get_or_create(&family).observe(took),
                Err(_) => {}
            }
            match result {
                Ok(report) => {
                    telemetry.health.updated(proxier.family(), Stamp::now());
                    m.last_sync_timestamp.get_or_create(&family).set(unix_now());
                    if report.cleanup_failed {
                        m.nftables_cleanup_failures.get_or_create(&family).inc();
                    }
                    if let Some((filter, nat)) = report.iptables_written {
                        let table = |t: &str| TableLabel { ip_family: family.ip_family.clone(), table: t.into() };
                        m.iptables_last.get_or_create(&table("filter")).set(filter as i64);
                        m.iptables_last.get_or_create(&table("nat")).set(nat as i64);
                    }
                    m.plugin_render_duration.observe(report.plugin.as_secs_f64());
                    m.validation_duration.observe(report.check.as_secs_f64());
                    if let Some(rules) = report.iptables_rules {
                        iptables_rules.insert(proxier.family(), rules);
                    }
                    tracing::info!(
                        family = %proxier.family(),
                        full = report.full,
                        changes = report.changes,
                        bytes = report.bytes,
                        elapsed_ms = millis(start.elapsed()),
                        host_ms = millis(report.host),
                        plugin_ms = millis(report.plugin),
                        check_ms = millis(report.check),
                        kernel_ms = millis(report.kernel),
                        check_cpu_ms = millis(report.check_cpu),
                        kernel_cpu_ms = millis(report.kernel_cpu),
                        steps = report.steps,
                        extensions_ms = millis(report.extensions),
                        "synced rules"
                    );
                    if let Some(what) = proxier.rules_mut().and_then(FamilyProxier::take_repaired) {
                        tracing::warn!(family = %proxier.family(), "the kernel lost kube-proxy's rules ({what}): this sync wrote them again");
                        m.rules_lost.inc();
                    }
                    reconcile_conntrack(proxier, report.full, telemetry);
                }
                Err(e) => {
                    ok = false;
                    // Every family that failed, for want of descriptors.
                    short_of_descriptors &= is_short_of_descriptors(&e);
                    count_failure(telemetry, proxier, &e, partial);
                    tracing::error!(family = %proxier.family(), "sync failed, keeping the last good rules: {e}");
                }
            }
        }
        let written = Instant::now();
        LocalhostSeries::after_pass(&mut proxiers, telemetry);
        // The rules kube-proxy owns on the node, per family.
        for (family, (filter, nat)) in &iptables_rules {
            let table = |t: &str| TableLabel { ip_family: family_name(*family).to_string(), table: t.into() };
            m.iptables_total.get_or_create(&table("filter")).set(*filter as i64);
            m.iptables_total.get_or_create(&table("nat")).set(*nat as i64);
        }
        // A failed pass keeps its changes (with their earliest `previous`)
        // for the retry; the families that synced apply them again, which
        // changes nothing.
        if ok {
            // Health-check ports and local endpoints change only with the
            // state: the periodic syncs of an idle proxy skip the walk.
            if !changes.is_empty() {
                no_local.update(&state, &changes, &families, telemetry);
                telemetry.set_checks(state.health_checks());
            }
            changes = Changes::default();
            pending.clear(telemetry);
        }
        // A replacement's first pass: kept if it synced in every family,
        // else the replaced component comes back everywhere.
        let rolled_back = proxiers.iter_mut().filter_map(Proxier::rules_mut).fold(false, |b, p| p.settle(ok) | b);
        if let Some((role, digest, path)) = switched.take() {
            // An extension has no rollback: its switch stands whatever the
            // pass did, and the watcher must know the bytes it runs.
            if let (true, Some(w)) = (ok || matches!(role, Role::Extension { .. }), watcher.as_mut()) {
                w.applied(&role, digest);
            }
            if rolled_back {
                let component = role.label();
                let label = ReloadLabel { component: component.clone(), outcome: "rolled-back".into() };
                telemetry.metrics.plugin_reloads.get_or_create(&label).inc();
                tracing::error!(component = %component, file = %path, "the sync after switching to the replaced component failed: the previous component is back");
            }
        }
        if let Some(p) = proxiers.first().and_then(Proxier::rules) {
            plugin_counts.update(p, telemetry);
        }
        let left_out: usize =
            proxiers.iter().filter_map(Proxier::rules).map(FamilyProxier::endpoints_not_programmed).sum();
        m.endpoints_not_programmed.set(left_out as i64);
        // The pass's work after the families' writes (health-check ports,
        // local endpoint counts, dropping the pass's changes, a
        // replacement's settling): a stage of its own. `full` is what the
        // pass asked for; a family's "synced rules" line says what it ran
        // (a family after a failure runs full on a partial pass).
        tracing::info!(
            ok,
            full = full || periodic,
            elapsed_ms = millis(start.elapsed()),
            after_ms = millis(written.elapsed()),
            "sync pass done"
        );
        // A pass due for the periodic full sync starts the next period,
        // whether each family made it or (large cluster mode) skipped it.
        if skipped_periodic {
            tracing::debug!("iptables mode in large cluster mode: no periodic full sync (as kube-proxy since v1.37)");
        }
        schedule.done(Instant::now(), ok, full || periodic, !ok && short_of_descriptors);
    }
}

/// After a family's successful sync: its stale UDP and SCTP conntrack
/// entries deleted, timed and counted (a failure is logged; the rules
/// stand).
fn reconcile_conntrack(proxier: &mut Proxier, full: bool, telemetry: &Telemetry) {
    let family = proxier.family();
    let Some(p) = proxier.rules_mut() else { return };
    let t = Instant::now();
    let Some(result) = p.reconcile_conntrack(full) else { return };
    let m = &telemetry.metrics;
    let label = FamilyLabel::of(family);
    m.conntrack_reconcile_duration.get_or_create(&label).observe(t.elapsed().as_secs_f64());
    match result {
        Ok(r) => {
            m.conntrack_deleted.get_or_create(&label).inc_by(r.deleted as u64);
            if r.deleted > 0 {
                tracing::info!(%family, read = r.read, deleted = r.deleted, elapsed_ms = millis(t.elapsed()), "deleted stale conntrack entries");
            }
        }
        Err(e) => tracing::warn!(%family, "cannot clean stale conntrack entries: {e}"),
    }
}

/// Whether a proxier's sync in this pass is full, and whether it skipped
/// the periodic one: a forced full sync (a loss the canary found) always
/// is; the periodic one unless the proxier skips it (upstream's iptables
/// mode in large cluster mode, kubernetes/kubernetes#138571, v1.37).
fn full_this_pass(forced: bool, periodic: bool, skips_periodic: bool) -> (bool, bool) {
    let skips = periodic && !forced && skips_periodic;
    (forced || (periodic && !skips), skips)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_cluster_mode_skips_only_the_periodic_full_sync() {
        assert_eq!(full_this_pass(false, true, false), (true, false), "the hourly full sync");
        assert_eq!(full_this_pass(false, true, true), (false, true), "skipped in large cluster mode");
        assert_eq!(full_this_pass(true, true, true), (true, false), "a loss still forces one");
        assert_eq!(full_this_pass(false, false, true), (false, false));
    }

    #[test]
    fn schedule_honours_min_and_max_periods_and_backs_off() {
        let periods = Periods { min: Duration::from_secs(1), max: Duration::from_secs(30) };
        let mut s = Schedule::new(periods);
        let t0 = Instant::now();
        assert_eq!(s.next(t0), t0, "first sync at once");
        s.done(t0, true, true, false);
        assert_eq!(s.next(t0), t0 + Duration::from_secs(30), "idle: periodic sync");
        s.pending = true;
        assert_eq!(s.next(t0), t0 + Duration::from_secs(1), "change: not before min period");
        let later = t0 + Duration::from_secs(5);
        assert_eq!(s.next(later), later, "change long after the last sync: at once");
        s.done(later, false, false, false);
        assert_eq!(s.next(later), later + Duration::from_secs(1), "retry");
        s.done(later, false, false, false);
        assert_eq!(s.next(later), later + Duration::from_secs(2), "backoff doubles");
        s.done(later, false, false, false);
        // Short of descriptors: the first delay again, however long the backoff.
        s.done(later, false, false, true);
        assert_eq!(s.next(later), later + Duration::from_secs(1), "descriptors come back: retried at once");
        let emfile = crate::kernel::Error::Spawn {
            program: "iptables-restore".into(),
            source: std::io::Error::from_raw_os_error(nix::libc::EMFILE),
        };
        assert!(is_short_of_descriptors(&emfile), "{emfile}");
        let text = std::io::Error::other("iptables-restore: Too many open files (os error 24)");
        assert!(!is_short_of_descriptors(&text), "a message saying it is not one");
        assert!(!s.wants_full(later));
        assert!(s.wants_full(t0 + FULL_SYNC_PERIOD));
    }
}
