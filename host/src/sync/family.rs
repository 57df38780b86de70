//! One IP family's path from state to kernel: changes → plugin → typed
//! ruleset → the mode's dataplane (confinement check, the host's own
//! objects, rendering, write). Whatever fails, the kernel keeps the last
//! good rules.

use std::collections::BTreeMap;
use std::sync::Arc;

use kpx_rules::model::{Change, Cluster, IpFamily, Node, ProxyMode, ServicePort, Settings};

use crate::config::Config;
use crate::kernel::conntrack::stale::{self, Destinations, Reconciled};
use crate::kernel::iptables::frame::localhost_nodeports;
use crate::kernel::{Dataplane, StateView, SyncError, Written, interfaces, sysctl::Sysctl};
use crate::runtime::{self, BackendInstance, BackendPlugin, SchedulerPlugin};
use crate::settings;
use crate::state::{Changes, ServiceName, State};
use crate::sync::bound::{self, LeftOut};
use crate::sync::coverage;
use crate::sync::planner::Planner;
use crate::validate::Scope;
use kpx_rules::ops::Ruleset;

use crate::extension::ExtensionProxier;
use crate::family::{Error, Report};

pub struct FamilyProxier {
    family: IpFamily,
    config: Arc<Config>,
    settings: Settings,
    /// The node's interface addresses, read on full syncs when
    /// --nodeport-addresses needs them.
    local_addresses: Vec<std::net::IpAddr>,
    sysctl: Sysctl,
    plugin: Arc<BackendPlugin>,
    /// Fills each service port's plans from its scheduler.
    planner: Planner,
    /// Keys of the sent ports whose scheduler plans from live load.
    load_ports: std::collections::BTreeSet<String>,
    /// Ports planned again from live load, for the next sync.
    replanned: Vec<Change>,
    instance: Option<BackendInstance>,
    /// Service ports as the plugin holds them.
    sent: Sent,
    /// Keys sent for each Service.
    keys_of: BTreeMap<ServiceName, Vec<String>>,
    node: Node,
    cluster: Cluster,
    dataplane: Dataplane,
    need_full: bool,
    /// What the last commit replaced, kept until the sync pass after it
    /// succeeded in every family (see [`FamilyProxier::settle`]).
    previous: Option<Previous>,
    /// `--extension`s, run after the backend in every sync.
    extensions: Vec<ExtensionProxier>,
    /// The UDP and SCTP Service destinations at the last conntrack
    /// reconcile, with the endpoints they sent to.
    conntrack: Destinations,
    /// Ports over `--iptables-max-endpoints-per-port`: their endpoints
    /// and how many of them are programmed.
    bounded: BTreeMap<String, LeftOut>,
}

/// The component (and, for a scheduler swap, the plans) a commit replaced.
struct Previous {
    plugin: Arc<BackendPlugin>,
    planned: Option<PlannedBefore>,
}

/// A scheduler swap's planner and what it had sent, as they were.
struct PlannedBefore {
    planner: Planner,
    sent: Sent,
    load_ports: std::collections::BTreeSet<String>,
    keys_of: BTreeMap<ServiceName, Vec<String>>,
}

impl FamilyProxier {
    pub fn new(
        config: Arc<Config>,
        family: IpFamily,
        plugin: Arc<BackendPlugin>,
        planner: Planner,
        dataplane: Dataplane,
        sysctl: Sysctl,
    ) -> FamilyProxier {
        let settings = settings::settings_for(&config, family, &Node::default(), &[]);
        FamilyProxier {
            family,
            config,
            settings,
            local_addresses: Vec::new(),
            sysctl,
            plugin,
            planner,
            load_ports: Default::default(),
            replanned: Vec::new(),
            instance: None,
            sent: Sent::default(),
            keys_of: BTreeMap::new(),
            node: Node::default(),
            cluster: Cluster::default(),
            dataplane,
            need_full: true,
            previous: None,
            extensions: Vec::new(),
            conntrack: Destinations::default(),
            bounded: BTreeMap::new(),
        }
    }

    /// Runs these extensions after the backend in every sync.
    pub fn with_extensions(mut self, extensions: Vec<ExtensionProxier>) -> FamilyProxier {
        self.extensions = extensions;
        self
    }

    /// (extension, service port, counter, packets counted since the last
    /// call) of every counter the extensions' rules name.
    pub fn extension_counted(&mut self) -> Vec<(String, String, String, u64)> {
        let mut out = Vec::new();
        // One read of the iptables tables for all of them.
        let mut dumps = None;
        for e in &mut self.extensions {
            let name = e.name().to_string();
            out.extend(e.counted(&mut dumps).into_iter().map(|(s, c, p)| (name.clone(), s, c, p)));
        }
        out
    }

    /// (extension, failed syncs since the last call) of every extension.
    pub fn extension_failures(&mut self) -> Vec<(String, u64)> {
        self.extensions.iter_mut().map(|e| (e.name().to_string(), e.take_failures())).collect()
    }

    /// Tries a replacement for the `index`-th extension on the state this
    /// family holds (a fresh instance, the state replayed, a render, the
    /// host's checks); nothing changes until [`Self::switch_extension`].
    pub fn try_extension(
        &self,
        index: usize,
        plugin: &Arc<crate::runtime::ExtensionPlugin>,
    ) -> Result<crate::runtime::ExtensionInstance, Error> {
        let e = self.extensions.get(index).ok_or_else(|| {
            Error::Plugin(runtime::Error::Load {
                plugin: plugin.name().into(),
                message: format!("no extension {index}"),
            })
        })?;
        e.try_replacement(plugin, &feed(&self.settings, &self.node, &self.cluster, &self.sent))
    }

    /// Switches the `index`-th extension to a tried replacement; the next
    /// sync writes its rules (in full).
    pub fn switch_extension(
        &mut self,
        index: usize,
        plugin: Arc<crate::runtime::ExtensionPlugin>,
        instance: crate::runtime::ExtensionInstance,
    ) {
        if let Some(e) = self.extensions.get_mut(index) {
            e.switch(plugin, instance);
        }
    }

    /// The earliest time a failed extension is to be tried again.
    pub fn extension_retry(&self) -> Option<std::time::Instant> {
        self.extensions.iter().filter_map(ExtensionProxier::retry_at).min()
    }

    /// Whether a component runs for the `index`-th extension.
    pub fn extension_loaded(&self, index: usize) -> bool {
        self.extensions.get(index).is_some_and(ExtensionProxier::is_loaded)
    }

    pub fn has_extensions(&self) -> bool {
        !self.extensions.is_empty()
    }

    pub fn plugin_name(&self) -> &str {
        self.plugin.name()
    }

    pub fn plugin_stats(&self) -> &runtime::PluginStats {
        self.plugin.stats()
    }

    pub fn mode(&self) -> ProxyMode {
        self.config.mode
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Turns the state's changes into plugin changes, updating what was
    /// sent, and how many port changes were left out: with no instance,
    /// the next call is a reset that replays what was sent, so those are
    /// only counted (at 10k Services a kept copy of every port was 13 MB
    /// at the peak).
    fn collect_changes(&mut self, state: &State, changes: &Changes) -> (Vec<Change>, usize) {
        let keep = self.instance.is_some();
        let mut out = Vec::new();
        let mut dropped = 0;
        // Plans from live load measure it afresh (once per sync, when needed).
        self.planner.expire_load();
        for name in changes.services.keys() {
            let ports = state.service_ports(self.family, name);
            let old_keys = self.keys_of.remove(name).unwrap_or_default();
            // A set: a Service of n ports is not n² key comparisons.
            let new_keys: std::collections::HashSet<&str> = ports.iter().map(|p| p.key.as_str()).collect();
            for key in old_keys.iter().filter(|k| !new_keys.contains(k.as_str())) {
                self.bounded.remove(key);
                if self.sent.remove(self.family, key) {
                    self.load_ports.remove(key);
                    if keep {
                        out.push(Change::Remove(key.clone()));
                    } else {
                        dropped += 1;
                    }
                }
            }
            drop(new_keys);
            if !ports.is_empty() {
                self.keys_of.insert(name.clone(), ports.iter().map(|p| p.key.clone()).collect());
            }
            for mut port in ports {
                let key = port.key.clone();
                self.bound(&mut port);
                self.planner.plan(&mut port, self.sent.get(&key));
                if self.planner.uses_load(&port) {
                    self.load_ports.insert(port.key.clone());
                } else {
                    self.load_ports.remove(&port.key);
                }
                if self.sent.get(&port.key) != Some(&port) {
                    if keep {
                        self.sent.insert(self.family, port.clone());
                        out.push(Change::Upsert(port));
                    } else {
                        self.sent.insert(self.family, port);
                        dropped += 1;
                    }
                }
            }
        }
        if changes.cluster {
            let cluster = state.cluster(self.family);
            if cluster != self.cluster {
                self.cluster = cluster.clone();
                // The host's ServiceCIDR drops are part of its own objects.
                self.need_full = true;
                out.push(Change::Cluster(cluster));
            }
        }
        if changes.node {
            let node = settings::node_for_plugins(&self.config, state.node(self.family), self.family);
            if node != self.node {
                self.node = node.clone();
                out.push(Change::Node(node));
            }
        }
        (out, dropped)
    }

    /// Holds `port` to `--iptables-max-endpoints-per-port` (before its
    /// plans, which are over the endpoints kept), and says when a port
    /// goes over the bound or comes back under it.
    fn bound(&mut self, port: &mut ServicePort) {
        let Some(limit) = self.config.max_endpoints_per_port.filter(|_| self.config.mode == ProxyMode::Iptables) else {
            return;
        };
        match bound::endpoints(port, limit, &self.config.node_name) {
            Some(left_out) => {
                let before = self.bounded.insert(port.key.clone(), left_out);
                if before.is_none() {
                    tracing::warn!(
                        family = %self.family,
                        service_port = %port.key,
                        endpoints = left_out.total,
                        programmed = left_out.kept,
                        "service port over --iptables-max-endpoints-per-port: iptables mode programs {} of its {} endpoints on this node (a share chosen by node name, address and port; this node sends the others no new connections)",
                        left_out.kept,
                        left_out.total
                    );
                }
            }
            None => {
                if let Some(was) = self.bounded.remove(&port.key) {
                    tracing::info!(family = %self.family, service_port = %port.key, endpoints_before = was.total, "service port back within --iptables-max-endpoints-per-port: all its endpoints are programmed");
                }
            }
        }
    }

    /// Endpoints left out by `--iptables-max-endpoints-per-port`, over
    /// every port the plugin holds (a port whose removal a rolled-back
    /// pass forgot is not counted).
    pub fn endpoints_not_programmed(&self) -> usize {
        self.bounded.iter().filter(|(key, _)| self.sent.get(key).is_some()).map(|(_, b)| b.total - b.kept).sum()
    }

    /// Whether some sent port's scheduler plans from live load.
    pub fn uses_load(&self) -> bool {
        !self.load_ports.is_empty()
    }

    /// Measures the load and plans those ports again; true when a plan
    /// changed (the next sync writes it).
    pub fn refresh_load(&mut self) -> bool {
        if self.load_ports.is_empty() {
            return false;
        }
        self.planner.expire_load();
        let mut changed = 0;
        for key in self.load_ports.clone() {
            let Some(sent) = self.sent.get(&key) else { continue };
            let mut port = sent.clone();
            self.planner.plan(&mut port, Some(sent));
            if &port != sent {
                self.sent.insert(self.family, port.clone());
                self.replanned.retain(|c| !matches!(c, Change::Upsert(p) if p.key == key));
                self.replanned.push(Change::Upsert(port));
                changed += 1;
            }
        }
        if changed > 0 {
            tracing::info!(family = %self.family, "re-planned {changed} service ports from live load");
        }
        changed > 0
    }

    /// Re-derives the settings; a change means a fresh plugin instance.
    fn refresh_settings(&mut self) {
        let settings = settings::settings_for(&self.config, self.family, &self.node, &self.local_addresses);
        if settings != self.settings {
            tracing::info!(family = %self.family, "settings changed; building a fresh plugin instance");
            self.settings = settings;
            self.instance = None;
        }
    }

    /// Whether --nodeport-addresses names `primary` (nftables mode's
    /// default): the primary address is matched against the node's own.
    fn uses_primary(&self) -> bool {
        let npa = &self.config.nodeport_addresses;
        npa.primary || (self.config.mode == ProxyMode::Nftables && npa.is_empty())
    }

    /// The sysctls these settings need (upstream sets them at start).
    fn ensure_sysctls(&self) {
        let mut wanted = Vec::new();
        if self.settings.mode == ProxyMode::Iptables && localhost_nodeports(&self.settings) {
            wanted.push(("net.ipv4.conf.all.route_localnet", "1"));
        }
        if self.settings.mode == ProxyMode::Ipvs {
            // upstream's ipvs proxier: connections tracked (for the
            // masquerade rules), dead destinations expired, forwarding on.
            wanted.extend([
                ("net.ipv4.vs.conntrack", "1"),
                ("net.ipv4.vs.expire_nodest_conn", "1"),
                ("net.ipv4.vs.expire_quiescent_template", "1"),
                ("net.ipv4.ip_forward", "1"),
            ]);
            if self.config.ipvs.strict_arp {
                wanted.extend([("net.ipv4.conf.all.arp_ignore", "1"), ("net.ipv4.conf.all.arp_announce", "2")]);
            }
        }
        for (name, value) in wanted {
            if let Err(e) = self.sysctl.set(name, value) {
                tracing::error!(family = %self.family, "cannot set {name}={value}: {e}");
            }
        }
    }

    /// upstream's large cluster mode: more than 1,000 endpoints in all
    /// (`largeClusterEndpointsThreshold`).
    pub fn large_cluster(&self) -> bool {
        self.sent.endpoints > kpx_rules::iptables::LARGE_CLUSTER_ENDPOINTS
    }

    /// Whether its rules count in nfacct objects (iptables mode).
    pub fn counts_in_nfacct(&self) -> bool {
        self.settings.nfacct
    }

    /// nftables mode: the packets refused on loopback node ports so far,
    /// by protocol (none in the other modes).
    pub fn localhost_rejected(&mut self) -> Vec<(kpx_rules::model::Protocol, u64)> {
        let Dataplane::Nftables(d) = &mut self.dataplane else { return Vec::new() };
        d.localhost_rejected().unwrap_or_else(|e| {
            tracing::debug!(family = %self.family, "cannot read the localhost node-port counters: {e}");
            Vec::new()
        })
    }

    /// Whether its next sync is full whatever is asked (the first, and
    /// after a failure).
    pub fn needs_full(&self) -> bool {
        self.need_full
    }

    /// One sync. `full` asks for a full render; a failure makes the next
    /// sync full too.
    pub fn sync(&mut self, state: &State, changes: &Changes, full: bool) -> Result<Report, Error> {
        let t = std::time::Instant::now();
        let mut plugin_changes = std::mem::take(&mut self.replanned);
        let (collected, dropped) = self.collect_changes(state, changes);
        plugin_changes.extend(collected);
        let n_changes = plugin_changes.len() + dropped;
        let full = full || self.need_full;
        let ipvs = self.config.mode == ProxyMode::Ipvs;
        // ipvs mode serves node ports on the node's addresses: read at
        // every sync (as upstream), those of kube-ipvs0 and link-local
        // ones left out.
        if ipvs || (full && !self.config.nodeport_addresses.cidrs.is_empty()) || (full && self.uses_primary()) {
            let kube_ipvs0 = if ipvs { crate::kernel::ipvs::link::index_of_kube_ipvs0() } else { None };
            match interfaces::local_addresses_by_interface() {
                Ok(addresses) => {
                    self.local_addresses = addresses
                        .into_iter()
                        .filter(|(index, ip)| Some(*index) != kube_ipvs0 && !(ipvs && interfaces::is_link_local(ip)))
                        .map(|(_, ip)| ip)
                        .collect()
                }
                Err(e) => tracing::error!(family = %self.family, "cannot read the node's addresses: {e}"),
            }
        }
        self.refresh_settings();
        let host = t.elapsed();
        let mut result = self.program(n_changes, plugin_changes, full);
        // A trap (or output over the limit) poisoned the instance: one
        // more try at once, with a fresh one given the whole state (the
        // changes are in it), so that one trap does not hold a change
        // back for a retry period. A second one fails the pass. Not for a
        // hot-swapped replacement on trial: its first pass must succeed
        // whole, or the replaced component comes back (`settle`).
        if let Err(Error::Plugin(e)) = &result
            && e.needs_fresh_instance()
            && self.previous.is_none()
        {
            tracing::warn!(family = %self.family, "{e}; trying again with a fresh instance");
            result = self.program(n_changes, Vec::new(), true);
        }
        let result = result.map(|r| Report { host, ..r });
        if result.is_err() {
            self.need_full = true;
        }
        result
    }

    fn program(&mut self, n_changes: usize, mut changes: Vec<Change>, full: bool) -> Result<Report, Error> {
        let mut full = full;
        let t = std::time::Instant::now();
        if self.instance.is_none() {
            // The reset replays what was sent; the changes are in it.
            changes = Vec::new();
            let mut instance = self.plugin.instantiate(&self.settings)?;
            instance.reset(&self.node, &self.cluster, self.sent.values())?;
            self.instance = Some(instance);
            full = true;
        } else if !changes.is_empty() {
            self.call(|i| i.apply(&changes))?;
        }
        let objects = self.sent.objects;
        let ruleset = self.call(|i| i.render(full, objects))?;
        let mut plugin = t.elapsed();
        if full {
            self.ensure_sysctls();
        }
        let t = std::time::Instant::now();
        let mut written = self.write(&ruleset, full);
        let mut dataplane = t.elapsed();
        if let Err(SyncError::Overfull(why)) = &written {
            // A set outgrew the size of its last full sync: the state is
            // written in full, its sets sized for it.
            tracing::info!(family = %self.family, "{why}");
            full = true;
            let t = std::time::Instant::now();
            let ruleset = self.call(|i| i.render(true, objects))?;
            plugin += t.elapsed();
            self.ensure_sysctls();
            let t = std::time::Instant::now();
            written = self.write(&ruleset, true);
            dataplane += t.elapsed();
        }
        let written = written.map_err(|source| Error::Sync { family: self.family, source })?;
        self.sent.scope.forget_removed();
        let t = std::time::Instant::now();
        // An extension's failure is its own: logged and counted, its last
        // good objects kept, and retried from a replayed state at the next
        // sync; kube-proxy's rules above are written and stay healthy.
        let feed = feed(&self.settings, &self.node, &self.cluster, &self.sent);
        for e in &mut self.extensions {
            if let Err(err) = e.sync(&feed, &changes, full) {
                tracing::error!(extension = e.name(), family = %self.family, "extension failed, keeping its last good rules: {err}");
            }
        }
        self.need_full = false;
        Ok(Report {
            full,
            changes: n_changes,
            bytes: written.bytes,
            host: std::time::Duration::ZERO,
            plugin,
            check: dataplane.saturating_sub(written.kernel),
            kernel: written.kernel,
            check_cpu: written.check,
            kernel_cpu: written.kernel_cpu,
            extensions: t.elapsed(),
            iptables_rules: written.iptables_rules,
            iptables_written: written.iptables_written,
            steps: written.steps,
            cleanup_failed: written.cleanup_failed,
        })
    }

    /// What the kernel lost of the rules this family wrote (see
    /// [`Dataplane::lost`]); None when intact or not synced yet.
    pub fn lost(&mut self) -> Option<String> {
        if self.need_full {
            return None;
        }
        match self.dataplane.lost(&self.settings, &self.cluster) {
            Ok(lost) => lost,
            Err(e) => {
                tracing::warn!(family = %self.family, "cannot check the kernel's rules: {e}");
                None
            }
        }
    }

    /// What this family's last sync found gone of what the one before
    /// left, and wrote again (see [`crate::kernel::Dataplane::take_repaired`]).
    pub fn take_repaired(&mut self) -> Option<String> {
        self.dataplane.take_repaired()
    }

    /// Deletes the conntrack entries the last successful sync made stale
    /// (kernel/conntrack/stale.rs): run after each one in which a UDP or
    /// SCTP destination or the endpoints it sends to changed, and after a
    /// full one. None when there was nothing to look at.
    pub fn reconcile_conntrack(&mut self, full: bool) -> Option<Result<Reconciled, crate::kernel::netlink::Error>> {
        let now = Destinations::of(self.sent.values(), self.family);
        // Unchanged, and not a full sync with something to look at.
        let look = now != self.conntrack || (full && !now.is_empty());
        if !look {
            return None;
        }
        Some(stale::reconcile(self.family, &now, &mut self.conntrack))
    }

    /// Checks and writes a ruleset on the state sent.
    fn write(&mut self, ruleset: &Ruleset, full: bool) -> Result<Written, SyncError> {
        self.dataplane.sync(
            self.plugin.name(),
            &self.settings,
            StateView {
                cluster: &self.cluster,
                scope: &self.sent.scope,
                ports: &self.sent.ports,
                local_addresses: &self.local_addresses,
            },
            ruleset,
            full,
        )
    }

    /// Tries a replacement backend component on the state this family
    /// holds: a fresh instance, the state replayed, a full render, the
    /// host's checks. Nothing is written and nothing changes here until
    /// [`FamilyProxier::commit`].
    pub fn try_backend(&self, plugin: Arc<BackendPlugin>) -> Result<Trial, Error> {
        let (instance, ruleset) = self.rehearse(&plugin, &self.sent)?;
        self.keeps_coverage(&plugin, &self.sent, &ruleset)?;
        Ok(Trial { plugin, instance, planned: None })
    }

    /// Refuses a replacement whose rules no longer send some port's
    /// cluster-IP traffic to its endpoints where the running component's
    /// do (traced on both; the running one only when needed).
    fn keeps_coverage(&self, plugin: &BackendPlugin, sent: &Sent, ruleset: &Ruleset) -> Result<(), Error> {
        let refuse =
            |message: String| Error::Plugin(runtime::Error::Load { plugin: plugin.name().to_string(), message });
        let required = coverage::required(self.family, &sent.ports);
        let covered =
            coverage::covered(&self.settings, &self.cluster, &self.local_addresses, &sent.ports, &required, ruleset)
                .map_err(|e| refuse(format!("its rules cannot be traced: {e}")))?;
        let missing: std::collections::BTreeSet<String> = required.difference(&covered).cloned().collect();
        if missing.is_empty() {
            return Ok(());
        }
        let (_, running) = self.rehearse(&self.plugin, &self.sent)?;
        let before = coverage::covered(
            &self.settings,
            &self.cluster,
            &self.local_addresses,
            &self.sent.ports,
            &missing,
            &running,
        )
        .map_err(|e| refuse(format!("the running component's rules cannot be traced: {e}")))?;
        match before.iter().next() {
            Some(key) => Err(refuse(format!(
                "its rules would no longer send {key}'s cluster-IP traffic to any of its endpoints ({} service ports lost)",
                before.len()
            ))),
            None => Ok(()),
        }
    }

    /// Tries a replacement for the `index`-th scheduler component: the
    /// ports naming one of `names` (the old or the new component's) planned
    /// again with it (a trap or a plan the mode cannot execute refuses it;
    /// the others keep their plans), then the backend's full render of the
    /// new plans through the host's checks.
    pub fn try_scheduler(&self, index: usize, plugin: Arc<SchedulerPlugin>, names: &[String]) -> Result<Trial, Error> {
        let mut planner = self.planner.replaced(index, plugin.clone());
        let mut sent = Sent::default();
        for port in self.sent.values() {
            let mut port = port.clone();
            if port.scheduler.as_ref().is_some_and(|s| names.contains(&s.name)) {
                planner.plan(&mut port, None);
            }
            sent.insert(self.family, port);
        }
        if let Some(fault) = planner.take_fault() {
            return Err(Error::Plugin(runtime::Error::Failed {
                plugin: plugin.name().to_string(),
                call: "schedule",
                message: fault,
            }));
        }
        let (instance, ruleset) = self.rehearse(&self.plugin, &sent)?;
        self.keeps_coverage(&self.plugin, &sent, &ruleset)?;
        Ok(Trial { plugin: self.plugin.clone(), instance, planned: Some((planner, sent)) })
    }

    /// The `index`-th scheduler component.
    pub fn scheduler_plugin(&self, index: usize) -> Option<Arc<SchedulerPlugin>> {
        self.planner.plugin(index).cloned()
    }

    /// (service port, scheduler name) of every port that names one.
    pub fn scheduler_users(&self) -> Vec<(String, String)> {
        crate::userspace::scheduler_users(self.sent.values())
    }

    /// A fresh instance of `plugin` holding `sent`, whose full render the
    /// host accepts.
    fn rehearse(&self, plugin: &BackendPlugin, sent: &Sent) -> Result<(BackendInstance, Ruleset), Error> {
        let mut instance = plugin.instantiate(&self.settings)?;
        instance.reset(&self.node, &self.cluster, sent.values())?;
        let ruleset = instance.render(true, sent.objects)?;
        let view = StateView {
            cluster: &self.cluster,
            scope: &sent.scope,
            ports: &sent.ports,
            local_addresses: &self.local_addresses,
        };
        self.dataplane
            .check(plugin.name(), &self.settings, view, &ruleset)
            .map_err(|source| Error::Sync { family: self.family, source })?;
        Ok((instance, ruleset))
    }

    /// Switches to a tried replacement; the next sync is a full one. The
    /// replaced component is kept until [`FamilyProxier::settle`].
    pub fn commit(&mut self, trial: Trial) {
        let old_plugin = std::mem::replace(&mut self.plugin, trial.plugin);
        self.instance = Some(trial.instance);
        let mut old_planned = None;
        if let Some((mut planner, sent)) = trial.planned {
            let load_ports = sent.values().filter(|p| planner.uses_load(p)).map(|p| p.key.clone()).collect();
            old_planned = Some(PlannedBefore {
                load_ports: std::mem::replace(&mut self.load_ports, load_ports),
                planner: std::mem::replace(&mut self.planner, planner),
                sent: std::mem::replace(&mut self.sent, sent),
                keys_of: self.keys_of.clone(),
            });
            self.replanned.clear();
        }
        self.previous = Some(Previous { plugin: old_plugin, planned: old_planned });
        self.need_full = true;
    }

    /// After a sync pass: a replacement committed before it stays if the
    /// pass succeeded in every family (`ok`), else the replaced component
    /// comes back (a fresh instance replays its state; the next sync is
    /// full). True when it came back.
    pub fn settle(&mut self, ok: bool) -> bool {
        let Some(previous) = self.previous.take() else { return false };
        if ok {
            return false;
        }
        self.plugin = previous.plugin;
        if let Some(before) = previous.planned {
            self.planner = before.planner;
            self.sent = before.sent;
            self.load_ports = before.load_ports;
            // Keys the failed pass dropped are sent again or removed anew
            // (the loop keeps a failed pass's changes).
            self.keys_of = before.keys_of;
            self.replanned.clear();
        }
        self.instance = None;
        self.need_full = true;
        true
    }

    /// Runs a plugin call; a trap drops the poisoned instance.
    fn call<T>(&mut self, f: impl FnOnce(&mut BackendInstance) -> runtime::Result<T>) -> runtime::Result<T> {
        let instance = self.instance.as_mut().expect("instance exists");
        let result = f(instance);
        if let Err(e) = &result
            && e.needs_fresh_instance()
        {
            self.instance = None;
        }
        result
    }
}

/// A replacement component that passed its trial on one family's state.
/// A family's state as its extensions are fed it (a free function: the
/// extensions are borrowed apart from it).
fn feed<'a>(
    settings: &'a Settings,
    node: &'a Node,
    cluster: &'a Cluster,
    sent: &'a Sent,
) -> crate::extension::proxier::Feed<'a> {
    crate::extension::proxier::Feed { settings, node, cluster, ports: &sent.ports, objects: sent.objects }
}

pub struct Trial {
    plugin: Arc<BackendPlugin>,
    /// Holds the state (replayed and rendered once).
    instance: BackendInstance,
    /// A scheduler replacement: the planner with it and the ports it planned.
    planned: Option<(Planner, Sent)>,
}

/// The service ports the plugin holds, by key, and what the host derives
/// from them, kept up to date port by port rather than recomputed each sync.
#[derive(Default)]
struct Sent {
    ports: crate::state::PortMap,
    /// The state's destinations and endpoints: what the plugin's rules may
    /// refer to.
    scope: Scope,
    /// Ports plus endpoints: what the plugin's fuel scales with.
    objects: usize,
    /// Endpoints of every port (upstream's large cluster mode counts them).
    endpoints: usize,
}

impl Sent {
    fn get(&self, key: &str) -> Option<&ServicePort> {
        self.ports.get(key).map(|p| &**p)
    }

    fn values(&self) -> impl Iterator<Item = &ServicePort> {
        crate::state::ports_in(&self.ports)
    }

    fn insert(&mut self, family: IpFamily, port: ServicePort) {
        self.count(family, &port, true);
        if let Some(old) = self.ports.insert(port.key.clone(), Box::new(port)) {
            self.count(family, &old, false);
        }
    }

    /// Whether the key was held.
    fn remove(&mut self, family: IpFamily, key: &str) -> bool {
        let Some(old) = self.ports.remove(key) else { return false };
        self.count(family, &old, false);
        true
    }

    fn count(&mut self, family: IpFamily, port: &ServicePort, add: bool) {
        let objects = port.size();
        self.scope.count(family, port, add);
        self.objects = if add { self.objects + objects } else { self.objects - objects };
        let endpoints = port.endpoints.len();
        self.endpoints = if add { self.endpoints + endpoints } else { self.endpoints - endpoints };
    }
}

#[cfg(test)]
mod tests {
    use super::Sent;
    use kpx_rules::model::{Endpoint, IpFamily, Protocol, ServicePort};

    fn port(name: &str, ips: &[&str]) -> ServicePort {
        let eps = ips.iter().map(|ip| Endpoint::ready(ip.parse().unwrap(), 8080)).collect();
        ServicePort::new("ns", name, "", Protocol::Tcp, 80).with_cluster_endpoints(eps)
    }

    #[test]
    fn sent_keeps_endpoints_and_size_through_updates_and_removals() {
        let v4 = IpFamily::V4;
        let ep = |ip: &str| (ip.parse().unwrap(), 8080);
        let mut sent = Sent::default();
        sent.insert(v4, port("a", &["10.1.0.1", "10.1.0.2"]));
        sent.insert(v4, port("b", &["10.1.0.2"]));
        assert_eq!((sent.objects, sent.scope.endpoints.len()), (5, 2));
        // a's update drops 10.1.0.2, which b still has, and adds 10.1.0.3.
        sent.insert(v4, port("a", &["10.1.0.1", "10.1.0.3"]));
        assert_eq!((sent.objects, sent.scope.endpoints.len()), (5, 3));
        assert!(sent.scope.endpoints.contains(&ep("10.1.0.2")));
        assert!(sent.remove(v4, "ns/b") && !sent.remove(v4, "ns/b"));
        assert!(!sent.scope.endpoints.contains(&ep("10.1.0.2")));
        assert!(sent.remove(v4, "ns/a"));
        assert_eq!((sent.objects, sent.scope.endpoints.len()), (0, 0));
    }

    /// upstream's large cluster mode counts every port's endpoints
    /// (`totalEndpoints > largeClusterEndpointsThreshold`, 1,000): the sum
    /// follows updates and removals.
    #[test]
    fn sent_counts_endpoints_for_large_cluster_mode() {
        let v4 = IpFamily::V4;
        let ips =
            |n: usize, base: u8| (0..n).map(|i| format!("10.{base}.{}.{}", i / 250, i % 250 + 1)).collect::<Vec<_>>();
        let mut sent = Sent::default();
        let a = ips(600, 1);
        let b = ips(401, 2);
        sent.insert(v4, port("a", &a.iter().map(String::as_str).collect::<Vec<_>>()));
        sent.insert(v4, port("b", &b.iter().map(String::as_str).collect::<Vec<_>>()));
        assert_eq!(sent.endpoints, 1001);
        assert!(sent.endpoints > kpx_rules::iptables::LARGE_CLUSTER_ENDPOINTS);
        sent.insert(v4, port("b", &b[..400].iter().map(String::as_str).collect::<Vec<_>>()));
        assert_eq!(sent.endpoints, 1000, "an update replaces the port's count");
        assert!(sent.remove(v4, "ns/a"));
        assert_eq!(sent.endpoints, 400);
    }
}
