//! One IP family's path from state to kernel: changes → plugin → validator
//! → iptables-restore or nft. Whatever fails, the kernel keeps the last
//! good rules.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use kpx_rules::iptables::{jumps_for, localhost_nodeports};
use kpx_rules::model::{Change, Cluster, IpFamily, Node, Ruleset, ServicePort, Settings};

use crate::config::Config;
use crate::kernel::Dataplane;
use crate::kernel::iptables::with_stale_chains_removed;
use crate::kernel::nftables::with_stale_objects_removed;
use crate::kernel::{interfaces, sysctl::Sysctl};
use crate::runtime::{self, BackendInstance, BackendPlugin};
use crate::settings;
use crate::state::{Changes, ServiceName, State};
use crate::validate::{self, Context};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plugin failed; recovered by a full sync (with a fresh instance
    /// if it trapped).
    #[error(transparent)]
    Plugin(#[from] runtime::Error),
    /// The ruleset broke a confinement rule; nothing written; full resync.
    #[error(transparent)]
    Rejected(#[from] validate::Rejected),
    /// The kernel write failed; nothing written; full resync.
    #[error("{family}: {source}")]
    Kernel { family: IpFamily, source: crate::kernel::Error },
    /// The plugin returned a ruleset for another mode; full resync.
    #[error("plugin {0} returned a ruleset for another mode")]
    WrongMode(String),
}

/// What one sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    pub full: bool,
    pub changes: usize,
    pub bytes: usize,
}

pub struct FamilyProxier {
    family: IpFamily,
    config: Arc<Config>,
    settings: Settings,
    /// The node's interface addresses, read on full syncs when
    /// --nodeport-addresses needs them.
    local_addresses: Vec<std::net::IpAddr>,
    sysctl: Sysctl,
    plugin: Arc<BackendPlugin>,
    instance: Option<BackendInstance>,
    /// Service ports as the plugin holds them, by key.
    sent: BTreeMap<String, ServicePort>,
    /// Keys sent for each Service.
    keys_of: BTreeMap<ServiceName, Vec<String>>,
    node: Node,
    cluster: Cluster,
    dataplane: Dataplane,
    /// KUBE- chains in the kernel, by table: read back on full syncs, then
    /// kept up to date from each payload written.
    chains: BTreeMap<String, BTreeSet<String>>,
    need_full: bool,
}

impl FamilyProxier {
    pub fn new(
        config: Arc<Config>,
        family: IpFamily,
        plugin: Arc<BackendPlugin>,
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
            instance: None,
            sent: BTreeMap::new(),
            keys_of: BTreeMap::new(),
            node: Node::default(),
            cluster: Cluster::default(),
            dataplane,
            chains: BTreeMap::new(),
            need_full: true,
        }
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    /// Turns the state's changes into plugin changes, updating what was sent.
    fn collect_changes(&mut self, state: &State, changes: &Changes) -> Vec<Change> {
        let mut out = Vec::new();
        for name in &changes.services {
            let ports = state.service_ports(self.family, name);
            let old_keys = self.keys_of.remove(name).unwrap_or_default();
            for key in &old_keys {
                if !ports.iter().any(|p| &p.key == key) && self.sent.remove(key).is_some() {
                    out.push(Change::Remove(key.clone()));
                }
            }
            if !ports.is_empty() {
                self.keys_of.insert(name.clone(), ports.iter().map(|p| p.key.clone()).collect());
            }
            for port in ports {
                if self.sent.get(&port.key) != Some(&port) {
                    self.sent.insert(port.key.clone(), port.clone());
                    out.push(Change::Upsert(port));
                }
            }
        }
        if changes.cluster {
            let cluster = state.cluster(self.family);
            if cluster != self.cluster {
                self.cluster = cluster.clone();
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
        out
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

    /// The sysctls these settings need (upstream sets them at start).
    fn ensure_sysctls(&self) {
        let mut wanted = Vec::new();
        if localhost_nodeports(&self.settings) {
            wanted.push(("net.ipv4.conf.all.route_localnet", "1"));
        }
        for (name, value) in wanted {
            if let Err(e) = self.sysctl.set(name, value) {
                tracing::error!(family = %self.family, "cannot set {name}={value}: {e}");
            }
        }
    }

    /// One sync. `full` asks for a full render; a failure makes the next
    /// sync full too.
    pub fn sync(&mut self, state: &State, changes: &Changes, full: bool) -> Result<Report, Error> {
        let plugin_changes = self.collect_changes(state, changes);
        let full = full || self.need_full;
        if full && !self.config.nodeport_addresses.cidrs.is_empty() {
            match interfaces::local_addresses(self.dataplane.exec()) {
                Ok(addresses) => self.local_addresses = addresses,
                Err(e) => tracing::error!(family = %self.family, "cannot read the node's addresses: {e}"),
            }
        }
        self.refresh_settings();
        let result = self.program(plugin_changes.len(), &plugin_changes, full);
        if result.is_err() {
            self.need_full = true;
        }
        result
    }

    fn program(&mut self, n_changes: usize, changes: &[Change], full: bool) -> Result<Report, Error> {
        let state_size: usize = self.sent.values().map(|s| 1 + s.endpoints.len()).sum();
        let mut full = full;
        if self.instance.is_none() {
            let mut instance = self.plugin.instantiate(&self.settings)?;
            let services: Vec<ServicePort> = self.sent.values().cloned().collect();
            instance.reset(&self.node, &self.cluster, &services)?;
            self.instance = Some(instance);
            full = true;
        } else if !changes.is_empty() {
            self.call(|i| i.apply(changes))?;
        }
        let ruleset = self.call(|i| i.render(full, state_size))?;
        let kernel_err = |source| Error::Kernel { family: self.family, source };
        let mut ctx =
            Context { plugin: self.plugin.name().to_string(), endpoints: self.endpoints(), ..Default::default() };
        let payload = match (ruleset, &self.dataplane) {
            (Ruleset::Iptables(payload), Dataplane::Iptables(kernel)) => {
                let payload = if full {
                    self.chains = kernel.kube_chains().map_err(kernel_err)?;
                    with_stale_chains_removed(&payload, &self.chains)
                } else {
                    payload
                };
                ctx.existing_chains = std::mem::take(&mut self.chains);
                let checked = validate::check_iptables(&payload, &ctx);
                self.chains = std::mem::take(&mut ctx.existing_chains);
                checked?;
                if full {
                    self.ensure_sysctls();
                    kernel.ensure_jumps(&jumps_for(&self.settings)).map_err(kernel_err)?;
                }
                kernel.apply(&payload).map_err(kernel_err)?;
                track_chains(&mut self.chains, &payload);
                payload
            }
            (Ruleset::Nftables(payload), Dataplane::Nftables(kernel)) => {
                let payload = if full {
                    let objects = kernel.objects().map_err(kernel_err)?;
                    with_stale_objects_removed(&payload, self.family, &objects)
                } else {
                    payload
                };
                validate::check_nftables(&payload, self.family, &ctx)?;
                kernel.apply(&payload).map_err(kernel_err)?;
                payload
            }
            _ => return Err(Error::WrongMode(self.plugin.name().to_string())),
        };
        self.need_full = false;
        Ok(Report { full, changes: n_changes, bytes: payload.len() })
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

    fn endpoints(&self) -> HashSet<(std::net::IpAddr, u16)> {
        self.sent.values().flat_map(|s| s.endpoints.iter().map(|e| (e.ip, e.port))).collect()
    }
}

/// Updates the known chains with what a written payload created and deleted.
fn track_chains(chains: &mut BTreeMap<String, BTreeSet<String>>, payload: &str) {
    let mut table = String::new();
    for line in payload.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_string();
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or_default();
            chains.entry(table.clone()).or_default().insert(chain.to_string());
        } else if let Some(chain) = line.strip_prefix("-X ") {
            chains.entry(table.clone()).or_default().remove(chain.trim());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tracks_created_and_deleted_chains() {
        let mut chains = Default::default();
        super::track_chains(
            &mut chains,
            "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-X KUBE-B\nCOMMIT\n*filter\n:KUBE-C - [0:0]\nCOMMIT\n",
        );
        assert_eq!(chains["nat"].iter().collect::<Vec<_>>(), ["KUBE-A"]);
        assert_eq!(chains["filter"].iter().collect::<Vec<_>>(), ["KUBE-C"]);
    }
}
