//! One module per supported WIT version; the host picks the module by the
//! version a plugin declares, and each converts to the rule model.

pub mod since_v0_2_0;
pub mod since_v0_3_0;
pub mod since_v0_4_0;

use kpx_rules::model::{Change, Cluster, Node, ServicePort, Settings};
use kpx_rules::ops::Ruleset;
use wasmtime::Store;
use wasmtime::component::{InstancePre, Linker};

use super::PluginState;

/// Adds every supported version's imports (0.3.0 imports only 0.2.0's
/// log).
pub fn add_to_linker(linker: &mut Linker<PluginState>) -> wasmtime::Result<()> {
    since_v0_2_0::add_to_linker(linker)
}

/// A linked component of a known contract version.
pub enum BackendPre {
    V0_2_0(since_v0_2_0::Pre),
    V0_3_0(since_v0_3_0::Pre),
}

impl BackendPre {
    pub fn new(version: &str, pre: InstancePre<PluginState>) -> wasmtime::Result<BackendPre> {
        match version {
            since_v0_2_0::VERSION => Ok(BackendPre::V0_2_0(since_v0_2_0::Pre::new(pre)?)),
            since_v0_3_0::VERSION => Ok(BackendPre::V0_3_0(since_v0_3_0::Pre::new(pre)?)),
            other => Err(wasmtime::format_err!(
                "kpx:proxier {other} has no backend world (backends are built for {} or {})",
                since_v0_3_0::VERSION,
                since_v0_2_0::VERSION
            )),
        }
    }

    /// Instantiates the component and constructs its proxier resource.
    pub fn instantiate(&self, store: &mut Store<PluginState>, settings: &Settings) -> wasmtime::Result<Backend> {
        match self {
            BackendPre::V0_2_0(pre) => pre.instantiate(store, settings).map(Backend::V0_2_0),
            BackendPre::V0_3_0(pre) => pre.instantiate(store, settings).map(Backend::V0_3_0),
        }
    }
}

/// A live proxier resource of a known contract version.
#[derive(Clone)]
pub enum Backend {
    V0_2_0(since_v0_2_0::Instance),
    V0_3_0(since_v0_3_0::Instance),
}

impl Backend {
    pub fn reset(
        &self,
        store: &mut Store<PluginState>,
        node: &Node,
        cluster: &Cluster,
        services: &[&ServicePort],
    ) -> wasmtime::Result<()> {
        match self {
            Backend::V0_2_0(i) => i.reset(store, node, cluster, services),
            Backend::V0_3_0(i) => i.reset(store, node, cluster, services),
        }
    }

    pub fn apply(&self, store: &mut Store<PluginState>, changes: &[Change]) -> wasmtime::Result<()> {
        match self {
            Backend::V0_2_0(i) => i.apply(store, changes),
            Backend::V0_3_0(i) => i.apply(store, changes),
        }
    }

    /// The ruleset; `max_output` bounds what a 0.3.0 iptables ruleset's
    /// words may decode to (0.2.0's records are bounded as they are
    /// copied out).
    pub fn render(
        &self,
        store: &mut Store<PluginState>,
        full: bool,
        max_output: u64,
    ) -> wasmtime::Result<Result<Ruleset, String>> {
        match self {
            Backend::V0_2_0(i) => i.render(store, full),
            Backend::V0_3_0(i) => i.render(store, full, max_output),
        }
    }
}
