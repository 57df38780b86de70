//! One IP family's path from state to kernel: changes → plugin → validator
//! → iptables-restore or nft. Whatever fails, the kernel keeps the last
//! good rules.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kpx_rules::iptables::{jumps_for, localhost_nodeports};
use kpx_rules::model::{Change, Cluster, IpFamily, Node, Ruleset, ServicePort, Settings};

use crate::config::Config;
use crate::kernel::Dataplane;
use crate::kernel::iptables::{track_chains, with_stale_chains_removed};
use crate::kernel::nftables::with_stale_objects_removed;
use crate::kernel::{interfaces, sysctl::Sysctl};
use crate::runtime::{self, BackendInstance, BackendPlugin};
use crate::settings;
use crate::state::{Changes, ServiceName, State};
use crate::validate::{self, Context, EndpointSet};

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
    /// Service ports as the plugin holds them.
    sent: Sent,
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
            sent: Sent::default(),
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
                if !ports.iter().any(|p| &p.key == key) && self.sent.remove(key) {
                    out.push(Change::Remove(key.clone()));
                }
            }
            if !ports.is_empty() {
                self.keys_of.insert(name.clone(), ports.iter().map(|p| p.key.clone()).collect());
            }
            for port in ports {
                if self.sent.ports.get(&port.key) != Some(&port) {
                    self.sent.insert(port.clone());
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
        let mut full = full;
        if self.instance.is_none() {
            let mut instance = self.plugin.instantiate(&self.settings)?;
            let services: Vec<ServicePort> = self.sent.ports.values().cloned().collect();
            instance.reset(&self.node, &self.cluster, &services)?;
            self.instance = Some(instance);
            full = true;
        } else if !changes.is_empty() {
            self.call(|i| i.apply(changes))?;
        }
        let objects = self.sent.objects;
        let ruleset = self.call(|i| i.render(full, objects))?;
        // The validator borrows the endpoint set for this sync.
        let mut ctx = Context {
            plugin: self.plugin.name().to_string(),
            endpoints: std::mem::take(&mut self.sent.endpoints),
            ..Default::default()
        };
        let written = self.check_and_write(ruleset, full, &mut ctx);
        self.sent.endpoints = ctx.endpoints;
        let payload = written?;
        self.need_full = false;
        Ok(Report { full, changes: n_changes, bytes: payload.len() })
    }

    /// Validates a ruleset and writes it; the payload written.
    fn check_and_write(&mut self, ruleset: Ruleset, full: bool, ctx: &mut Context) -> Result<String, Error> {
        let kernel_err = |source| Error::Kernel { family: self.family, source };
        match (ruleset, &self.dataplane) {
            (Ruleset::Iptables(payload), Dataplane::Iptables(kernel)) => {
                let payload = if full {
                    self.chains = kernel.kube_chains().map_err(kernel_err)?;
                    with_stale_chains_removed(&payload, &self.chains)
                } else {
                    payload
                };
                ctx.existing_chains = std::mem::take(&mut self.chains);
                let checked = validate::check_iptables(&payload, ctx);
                self.chains = std::mem::take(&mut ctx.existing_chains);
                checked?;
                if full {
                    self.ensure_sysctls();
                    kernel.ensure_jumps(&jumps_for(&self.settings)).map_err(kernel_err)?;
                }
                kernel.apply(&payload).map_err(kernel_err)?;
                track_chains(&mut self.chains, &payload);
                Ok(payload)
            }
            (Ruleset::Nftables(payload), Dataplane::Nftables(kernel)) => {
                let payload = if full {
                    let objects = kernel.objects().map_err(kernel_err)?;
                    with_stale_objects_removed(&payload, self.family, &objects)
                } else {
                    payload
                };
                validate::check_nftables(&payload, self.family, ctx)?;
                kernel.apply(&payload).map_err(kernel_err)?;
                Ok(payload)
            }
            _ => Err(Error::WrongMode(self.plugin.name().to_string())),
        }
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

/// The service ports the plugin holds, by key, and what the host derives
/// from them, kept up to date port by port rather than recomputed each sync.
#[derive(Default)]
struct Sent {
    ports: BTreeMap<String, ServicePort>,
    /// Their endpoints: where the validator lets DNAT go.
    endpoints: EndpointSet,
    /// Ports plus endpoints: what the plugin's output limit scales with.
    objects: usize,
}

impl Sent {
    fn insert(&mut self, port: ServicePort) {
        self.count(&port, true);
        if let Some(old) = self.ports.insert(port.key.clone(), port) {
            self.count(&old, false);
        }
    }

    /// Whether the key was held.
    fn remove(&mut self, key: &str) -> bool {
        let Some(old) = self.ports.remove(key) else { return false };
        self.count(&old, false);
        true
    }

    fn count(&mut self, port: &ServicePort, add: bool) {
        let objects = 1 + port.endpoints.len();
        for e in &port.endpoints {
            if add { self.endpoints.add((e.ip, e.port)) } else { self.endpoints.remove(&(e.ip, e.port)) }
        }
        self.objects = if add { self.objects + objects } else { self.objects - objects };
    }
}

#[cfg(test)]
mod tests {
    use super::Sent;
    use kpx_rules::model::{Endpoint, Protocol, ServicePort};

    fn port(name: &str, ips: &[&str]) -> ServicePort {
        let eps = ips.iter().map(|ip| Endpoint::ready(ip.parse().unwrap(), 8080)).collect();
        ServicePort::new("ns", name, "", Protocol::Tcp, 80).with_cluster_endpoints(eps)
    }

    #[test]
    fn sent_keeps_endpoints_and_size_through_updates_and_removals() {
        let ep = |ip: &str| (ip.parse().unwrap(), 8080);
        let mut sent = Sent::default();
        sent.insert(port("a", &["10.1.0.1", "10.1.0.2"]));
        sent.insert(port("b", &["10.1.0.2"]));
        assert_eq!((sent.objects, sent.endpoints.len()), (5, 2));
        // a's update drops 10.1.0.2, which b still has, and adds 10.1.0.3.
        sent.insert(port("a", &["10.1.0.1", "10.1.0.3"]));
        assert_eq!((sent.objects, sent.endpoints.len()), (5, 3));
        assert!(sent.endpoints.contains(&ep("10.1.0.2")));
        assert!(sent.remove("ns/b") && !sent.remove("ns/b"));
        assert!(!sent.endpoints.contains(&ep("10.1.0.2")));
        assert!(sent.remove("ns/a"));
        assert_eq!((sent.objects, sent.endpoints.len()), (0, 0));
    }
}
