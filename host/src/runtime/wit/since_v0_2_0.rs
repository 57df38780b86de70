//! Bindings for kpx:proxier@0.2.0 (wit/since_v0.2.0).

mod ops;

use std::sync::Arc;

use kpx_rules::model::{Change, Cluster, Node, ProxyMode, ServicePort, Settings};
use kpx_rules::ops::Ruleset;
use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, ResourceAny};

use crate::runtime::PluginState;

wasmtime::component::bindgen!({
    path: "../wit/since_v0.2.0",
    world: "backend-plugin",
});

kpx_rules::wit_conversions!(crate::runtime::wit::since_v0_2_0::kpx::proxier::types);

/// The contract version these bindings implement.
pub const VERSION: &str = "0.2.0";

/// A backend's output, which 0.3.0 returns in the same variants.
pub use self::exports::kpx::proxier::backend::Ruleset as WireRuleset;
/// The output to the rule model.
pub use ops::ruleset;

impl self::kpx::proxier::types::Host for PluginState {}
impl self::kpx::proxier::iptables::Host for PluginState {}
impl self::kpx::proxier::nftables::Host for PluginState {}
impl self::kpx::proxier::ipvs::Host for PluginState {}

impl self::kpx::proxier::log::Host for PluginState {
    fn log(&mut self, level: self::kpx::proxier::log::Level, message: String) {
        use self::kpx::proxier::log::Level;
        if !self.take_log_budget() {
            return;
        }
        let message = super::super::log_line(&message);
        let plugin = &*self.plugin;
        match level {
            Level::Error => tracing::error!(plugin, "{message}"),
            Level::Warn => tracing::warn!(plugin, "{message}"),
            Level::Info => tracing::info!(plugin, "{message}"),
            Level::Debug => tracing::debug!(plugin, "{message}"),
            Level::Trace => tracing::trace!(plugin, "{message}"),
        }
    }
}

/// The scheduler world's bindings, sharing the backend world's types
/// and log import.
pub mod sched {
    wasmtime::component::bindgen!({
        path: "../wit/since_v0.2.0",
        world: "scheduler-plugin",
        with: {
            "kpx:proxier/types": super::kpx::proxier::types,
            "kpx:proxier/log": super::kpx::proxier::log,
        },
    });
}

/// A linked scheduler component.
pub struct SchedulerPre(sched::SchedulerPluginPre<PluginState>);

impl SchedulerPre {
    pub fn new(pre: InstancePre<PluginState>) -> wasmtime::Result<SchedulerPre> {
        Ok(SchedulerPre(sched::SchedulerPluginPre::new(pre)?))
    }

    pub fn instantiate(&self, store: &mut Store<PluginState>) -> wasmtime::Result<SchedulerInstance> {
        Ok(SchedulerInstance(Arc::new(self.0.instantiate(store)?)))
    }
}

/// What the host asks a scheduler.
pub struct ScheduleRequest<'a> {
    pub name: &'a str,
    pub parameters: &'a [(String, String)],
    pub mode: ProxyMode,
    pub port: &'a ServicePort,
    pub candidates: &'a [u32],
    /// Active and inactive connections per candidate, where measured.
    pub load: Option<(Vec<u32>, Vec<u32>)>,
}

/// One side of a service port's candidates, set up for per-connection picks.
pub struct PickSetup<'a> {
    pub name: &'a str,
    pub parameters: &'a [(String, String)],
    pub service: &'a str,
    pub destination: std::net::IpAddr,
    pub endpoints: &'a [(std::net::IpAddr, u16)],
    pub weights: &'a [u32],
}

/// One new connection, as the host asks a scheduler to place it.
pub struct PickRequest<'a> {
    pub client: std::net::IpAddr,
    /// Each candidate's open connections (the setup's order).
    pub active: &'a [u32],
    pub failed: &'a [u32],
    pub random: u32,
}

#[derive(Clone)]
pub struct SchedulerInstance(Arc<sched::SchedulerPlugin>);

impl SchedulerInstance {
    pub fn names(&self, store: &mut Store<PluginState>) -> wasmtime::Result<Vec<String>> {
        self.0.kpx_proxier_scheduler().call_names(store)
    }

    pub fn uses_load(&self, store: &mut Store<PluginState>, name: &str) -> wasmtime::Result<bool> {
        self.0.kpx_proxier_scheduler().call_uses_load(store, name)
    }

    pub fn schedule(
        &self,
        store: &mut Store<PluginState>,
        r: &ScheduleRequest,
    ) -> wasmtime::Result<Result<kpx_rules::plan::Plan, String>> {
        use sched::exports::kpx::proxier::scheduler::Request;
        let request = Request {
            name: r.name.to_string(),
            parameters: r.parameters.to_vec(),
            mode: match r.mode {
                ProxyMode::Iptables => self::kpx::proxier::types::ProxyMode::Iptables,
                ProxyMode::Nftables => self::kpx::proxier::types::ProxyMode::Nftables,
                ProxyMode::Ipvs => self::kpx::proxier::types::ProxyMode::Ipvs,
                ProxyMode::Userspace => self::kpx::proxier::types::ProxyMode::Userspace,
            },
            port: wit_convert::to_wit_service_port(r.port),
            candidates: r.candidates.to_vec(),
            load: r
                .load
                .clone()
                .map(|(active, inactive)| sched::exports::kpx::proxier::scheduler::Load { active, inactive }),
        };
        let out = self.0.kpx_proxier_scheduler().call_schedule(store, &request)?;
        Ok(out.map(wit_convert::from_wit_plan))
    }

    pub fn prepare_picks(
        &self,
        store: &mut Store<PluginState>,
        id: u32,
        s: &PickSetup,
    ) -> wasmtime::Result<Result<(), String>> {
        use sched::exports::kpx::proxier::scheduler::PickSetup as Wire;
        let setup = Wire {
            name: s.name.to_string(),
            parameters: s.parameters.to_vec(),
            service: s.service.to_string(),
            destination: wit_convert::to_wit_ip(&s.destination),
            endpoints: s
                .endpoints
                .iter()
                .map(|(ip, port)| self::kpx::proxier::types::EndpointAddress {
                    address: wit_convert::to_wit_ip(ip),
                    port: *port,
                })
                .collect(),
            weights: s.weights.to_vec(),
        };
        self.0.kpx_proxier_scheduler().call_prepare_picks(store, id, &setup)
    }

    pub fn forget_picks(&self, store: &mut Store<PluginState>, id: u32) -> wasmtime::Result<()> {
        self.0.kpx_proxier_scheduler().call_forget_picks(store, id)
    }

    pub fn pick(
        &self,
        store: &mut Store<PluginState>,
        id: u32,
        r: &PickRequest,
    ) -> wasmtime::Result<Result<Option<u32>, String>> {
        self.0.kpx_proxier_scheduler().call_pick(
            store,
            id,
            wit_convert::to_wit_ip(&r.client),
            r.active,
            r.failed,
            r.random,
        )
    }
}

pub fn add_to_linker(linker: &mut wasmtime::component::Linker<PluginState>) -> wasmtime::Result<()> {
    BackendPlugin::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
}

pub struct Pre(BackendPluginPre<PluginState>);

impl Pre {
    pub fn new(pre: InstancePre<PluginState>) -> wasmtime::Result<Pre> {
        Ok(Pre(BackendPluginPre::new(pre)?))
    }

    pub fn instantiate(&self, store: &mut Store<PluginState>, settings: &Settings) -> wasmtime::Result<Instance> {
        let bindings = self.0.instantiate(&mut *store)?;
        let resource = bindings
            .kpx_proxier_backend()
            .proxier()
            .call_constructor(&mut *store, &wit_convert::to_wit_settings(settings))?;
        Ok(Instance { bindings: Arc::new(bindings), resource })
    }
}

#[derive(Clone)]
pub struct Instance {
    bindings: Arc<BackendPlugin>,
    resource: ResourceAny,
}

impl Instance {
    pub fn reset(
        &self,
        store: &mut Store<PluginState>,
        node: &Node,
        cluster: &Cluster,
        services: &[&ServicePort],
    ) -> wasmtime::Result<()> {
        let services: Vec<_> = services.iter().map(|p| wit_convert::to_wit_service_port(p)).collect();
        let (node, cluster) = (wit_convert::to_wit_node(node), wit_convert::to_wit_cluster(cluster));
        self.bindings.kpx_proxier_backend().proxier().call_reset(store, self.resource, &node, &cluster, &services)
    }

    pub fn apply(&self, store: &mut Store<PluginState>, changes: &[Change]) -> wasmtime::Result<()> {
        let changes: Vec<_> = changes.iter().map(wit_convert::to_wit_change).collect();
        self.bindings.kpx_proxier_backend().proxier().call_apply(store, self.resource, &changes)
    }

    /// The ruleset, converted to typed rules; `Err` inside for the
    /// plugin's own error or a value the contract allows but the rule
    /// model cannot hold (an address of the wrong family, say).
    pub fn render(&self, store: &mut Store<PluginState>, full: bool) -> wasmtime::Result<Result<Ruleset, String>> {
        let out = self.bindings.kpx_proxier_backend().proxier().call_render(store, self.resource, full)?;
        Ok(out.and_then(ops::ruleset))
    }
}

/// The extension world's bindings, sharing the backend world's types
/// and log import.
pub mod ext {
    wasmtime::component::bindgen!({
        path: "../wit/since_v0.2.0",
        world: "extension-plugin",
        with: {
            "kpx:proxier/types": super::kpx::proxier::types,
            "kpx:proxier/log": super::kpx::proxier::log,
        },
    });
}

/// A linked extension component.
pub struct ExtensionPre(ext::ExtensionPluginPre<PluginState>);

impl ExtensionPre {
    pub fn new(pre: InstancePre<PluginState>) -> wasmtime::Result<ExtensionPre> {
        Ok(ExtensionPre(ext::ExtensionPluginPre::new(pre)?))
    }

    /// Instantiates the component and constructs its extender with the
    /// operator's parameters.
    pub fn instantiate(
        &self,
        store: &mut Store<PluginState>,
        settings: &Settings,
        parameters: &[(String, String)],
    ) -> wasmtime::Result<ExtensionInstance> {
        let bindings = self.0.instantiate(&mut *store)?;
        let resource = bindings.kpx_proxier_extension().extender().call_constructor(
            &mut *store,
            &wit_convert::to_wit_settings(settings),
            parameters,
        )?;
        Ok(ExtensionInstance { bindings: Arc::new(bindings), resource })
    }
}

/// A live extender resource. Every service port it is sent carries the
/// annotations under `prefix` only, the prefix removed.
#[derive(Clone)]
pub struct ExtensionInstance {
    bindings: Arc<ext::ExtensionPlugin>,
    resource: ResourceAny,
}

fn extension_port(s: &ServicePort, prefix: &str) -> self::kpx::proxier::types::ServicePort {
    let own = s.annotations.iter().filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), v.clone())));
    wit_convert::to_wit_service_port_with(s, own.collect())
}

/// The ports an extension is sent (0.2.0's and 0.4.0's alike): each with
/// its annotations under `prefix` only, the prefix removed.
pub fn extension_ports(services: &[&ServicePort], prefix: &str) -> Vec<self::kpx::proxier::types::ServicePort> {
    services.iter().map(|s| extension_port(s, prefix)).collect()
}

/// The changes an extension is sent (0.2.0's and 0.4.0's alike): an
/// upserted port's annotations as [`extension_ports`] has them.
pub fn extension_changes(changes: &[Change], prefix: &str) -> Vec<self::kpx::proxier::types::Change> {
    use self::kpx::proxier::types::Change as Wire;
    changes
        .iter()
        .map(|c| match c {
            Change::Upsert(s) => Wire::Upsert(extension_port(s, prefix)),
            other => wit_convert::to_wit_change(other),
        })
        .collect()
}

impl ExtensionInstance {
    pub fn reset(
        &self,
        store: &mut Store<PluginState>,
        prefix: &str,
        node: &Node,
        cluster: &Cluster,
        services: &[&ServicePort],
    ) -> wasmtime::Result<()> {
        let services = extension_ports(services, prefix);
        let (node, cluster) = (wit_convert::to_wit_node(node), wit_convert::to_wit_cluster(cluster));
        self.bindings.kpx_proxier_extension().extender().call_reset(store, self.resource, &node, &cluster, &services)
    }

    pub fn apply(&self, store: &mut Store<PluginState>, prefix: &str, changes: &[Change]) -> wasmtime::Result<()> {
        let changes = extension_changes(changes, prefix);
        self.bindings.kpx_proxier_extension().extender().call_apply(store, self.resource, &changes)
    }

    /// The rules, converted; `Err` inside for the extension's own error
    /// or an address the rule model cannot hold.
    pub fn render(
        &self,
        store: &mut Store<PluginState>,
    ) -> wasmtime::Result<Result<kpx_rules::ops::extension::Ruleset, String>> {
        let out = self.bindings.kpx_proxier_extension().extender().call_render(store, self.resource)?;
        Ok(out.map(ops::extension))
    }
}
