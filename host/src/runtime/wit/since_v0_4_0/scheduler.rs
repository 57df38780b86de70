//! The 0.4.0 scheduler world: 0.2.0's scheduler plus `promises(name)`.
//!
//! Its types are 0.2.0's: `types` and `log` are bound to 0.2.0's Rust
//! types; 0.2.0's `scheduler` interface, whose `request` and `pick-setup`
//! the 0.4.0 interface uses, is generated here (as the import the world
//! implies: a component imports its types only, which needs nothing from
//! the linker), so the request conversions are written again below.

use std::sync::Arc;

use kpx_rules::model::ProxyMode;
use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::super::since_v0_2_0::kpx::proxier::types as wt;
use super::super::since_v0_2_0::wit_convert;
use super::super::since_v0_2_0::{PickRequest, PickSetup, ScheduleRequest};
use crate::runtime::PluginState;
use kpx_rules::promise::Promise;

// `with` paths are relative to this module (the generated code prefixes
// them with its own way back here).
wasmtime::component::bindgen!({
    path: "../wit/since_v0.4.0",
    world: "scheduler-plugin",
    with: {
        "kpx:proxier/types@0.2.0": super::super::since_v0_2_0::kpx::proxier::types,
        "kpx:proxier/log@0.2.0": super::super::since_v0_2_0::kpx::proxier::log,
    },
});

use self::exports::kpx::proxier0_4_0::scheduler as ws;
use self::kpx::proxier0_2_0::scheduler as w2;

/// A linked 0.4.0 scheduler component.
pub struct SchedulerPre(SchedulerPluginPre<PluginState>);

impl SchedulerPre {
    pub fn new(pre: InstancePre<PluginState>) -> wasmtime::Result<SchedulerPre> {
        Ok(SchedulerPre(SchedulerPluginPre::new(pre)?))
    }

    pub fn instantiate(&self, store: &mut Store<PluginState>) -> wasmtime::Result<SchedulerInstance> {
        Ok(SchedulerInstance(Arc::new(self.0.instantiate(store)?)))
    }
}

/// A live 0.4.0 scheduler instance: 0.2.0's calls, and `promises`.
#[derive(Clone)]
pub struct SchedulerInstance(Arc<SchedulerPlugin>);

/// The WIT's promise as the host's.
fn promise(p: ws::Promise) -> Promise {
    match p {
        ws::Promise::Spread => Promise::Spread,
        ws::Promise::Weighted => Promise::Weighted,
        ws::Promise::Sticky => Promise::Sticky,
        ws::Promise::MinimalDisruption => Promise::MinimalDisruption,
        ws::Promise::LeastLoaded => Promise::LeastLoaded,
        ws::Promise::Priority => Promise::Priority,
    }
}

fn wire_mode(mode: ProxyMode) -> wt::ProxyMode {
    match mode {
        ProxyMode::Iptables => wt::ProxyMode::Iptables,
        ProxyMode::Nftables => wt::ProxyMode::Nftables,
        ProxyMode::Ipvs => wt::ProxyMode::Ipvs,
        ProxyMode::Userspace => wt::ProxyMode::Userspace,
    }
}

impl SchedulerInstance {
    pub fn names(&self, store: &mut Store<PluginState>) -> wasmtime::Result<Vec<String>> {
        self.0.kpx_proxier0_4_0_scheduler().call_names(store)
    }

    /// What `name` promises, as the component lists them (the caller
    /// checks the list: its length, duplicates).
    pub fn promises(&self, store: &mut Store<PluginState>, name: &str) -> wasmtime::Result<Vec<Promise>> {
        let promises = self.0.kpx_proxier0_4_0_scheduler().call_promises(store, name)?;
        Ok(promises.into_iter().map(promise).collect())
    }

    pub fn uses_load(&self, store: &mut Store<PluginState>, name: &str) -> wasmtime::Result<bool> {
        self.0.kpx_proxier0_4_0_scheduler().call_uses_load(store, name)
    }

    pub fn schedule(
        &self,
        store: &mut Store<PluginState>,
        r: &ScheduleRequest,
    ) -> wasmtime::Result<Result<kpx_rules::plan::Plan, String>> {
        let request = w2::Request {
            name: r.name.to_string(),
            parameters: r.parameters.to_vec(),
            mode: wire_mode(r.mode),
            port: wit_convert::to_wit_service_port(r.port),
            candidates: r.candidates.to_vec(),
            load: r.load.clone().map(|(active, inactive)| w2::Load { active, inactive }),
        };
        let out = self.0.kpx_proxier0_4_0_scheduler().call_schedule(store, &request)?;
        Ok(out.map(wit_convert::from_wit_plan))
    }

    pub fn prepare_picks(
        &self,
        store: &mut Store<PluginState>,
        id: u32,
        s: &PickSetup,
    ) -> wasmtime::Result<Result<(), String>> {
        let setup = w2::PickSetup {
            name: s.name.to_string(),
            parameters: s.parameters.to_vec(),
            service: s.service.to_string(),
            destination: wit_convert::to_wit_ip(&s.destination),
            endpoints: s
                .endpoints
                .iter()
                .map(|(ip, port)| wt::EndpointAddress { address: wit_convert::to_wit_ip(ip), port: *port })
                .collect(),
            weights: s.weights.to_vec(),
        };
        self.0.kpx_proxier0_4_0_scheduler().call_prepare_picks(store, id, &setup)
    }

    pub fn forget_picks(&self, store: &mut Store<PluginState>, id: u32) -> wasmtime::Result<()> {
        self.0.kpx_proxier0_4_0_scheduler().call_forget_picks(store, id)
    }

    pub fn pick(
        &self,
        store: &mut Store<PluginState>,
        id: u32,
        r: &PickRequest,
    ) -> wasmtime::Result<Result<Option<u32>, String>> {
        self.0.kpx_proxier0_4_0_scheduler().call_pick(
            store,
            id,
            wit_convert::to_wit_ip(&r.client),
            r.active,
            r.failed,
            r.random,
        )
    }
}
