//! Bindings for kpx:proxier@0.3.0 (wit/since_v0.3.0): the backend world,
//! whose state crosses as a `port-table`. Its other interfaces are
//! 0.2.0's (the package uses them), bound to 0.2.0's Rust types; the one
//! import, 0.2.0's log, is linked with 0.2.0's.

use std::collections::BTreeMap;
use std::sync::Arc;

use kpx_rules::model::{Change, Cluster, IpFamily, Node, ServicePort, Settings};
use kpx_rules::ops::Ruleset;
use kpx_rules::ops::iptables::words;
use kpx_rules::table;
use wasmtime::Store;
use wasmtime::component::{InstancePre, ResourceAny};

use super::since_v0_2_0 as v2;
use super::since_v0_2_0::wit_convert;
use crate::runtime::PluginState;

wasmtime::component::bindgen!({
    path: "../wit/since_v0.3.0",
    world: "backend-plugin-tables",
    with: {
        "kpx:proxier/types@0.2.0": super::since_v0_2_0::kpx::proxier::types,
        "kpx:proxier/iptables@0.2.0": super::since_v0_2_0::kpx::proxier::iptables,
        "kpx:proxier/nftables@0.2.0": super::since_v0_2_0::kpx::proxier::nftables,
        "kpx:proxier/ipvs@0.2.0": super::since_v0_2_0::kpx::proxier::ipvs,
        "kpx:proxier/log@0.2.0": super::since_v0_2_0::kpx::proxier::log,
    },
});

/// The contract version these bindings implement.
pub const VERSION: &str = "0.3.0";

kpx_rules::table_conversions!(
    crate::runtime::wit::since_v0_3_0::kpx::proxier0_3_0::tables,
    crate::runtime::wit::since_v0_2_0::kpx::proxier::types
);

kpx_rules::words_conversions!(
    crate::runtime::wit::since_v0_3_0::kpx::proxier0_3_0::words,
    crate::runtime::wit::since_v0_2_0::kpx::proxier::types,
    crate::runtime::wit::since_v0_2_0::kpx::proxier::iptables
);

use self::exports::kpx::proxier0_3_0::backend as wb;
use self::kpx::proxier0_3_0::tables as wtab;

pub struct Pre(BackendPluginTablesPre<PluginState>);

impl Pre {
    pub fn new(pre: InstancePre<PluginState>) -> wasmtime::Result<Pre> {
        Ok(Pre(BackendPluginTablesPre::new(pre)?))
    }

    pub fn instantiate(&self, store: &mut Store<PluginState>, settings: &Settings) -> wasmtime::Result<Instance> {
        let bindings = self.0.instantiate(&mut *store)?;
        let resource = bindings
            .kpx_proxier0_3_0_backend()
            .proxier()
            .call_constructor(&mut *store, &wit_convert::to_wit_settings(settings))?;
        Ok(Instance { bindings: Arc::new(bindings), resource, family: settings.family })
    }
}

#[derive(Clone)]
pub struct Instance {
    bindings: Arc<BackendPluginTables>,
    resource: ResourceAny,
    family: IpFamily,
}

fn encode<'a>(family: IpFamily, ports: impl IntoIterator<Item = &'a ServicePort>) -> wasmtime::Result<wtab::PortTable> {
    table::encode(family, ports)
        .map(wit_table::to_wit_table)
        .map_err(|e| wasmtime::format_err!("cannot send the state: {e}"))
}

/// A plugin's refusal of what it was sent, as the call's error (one line,
/// cut as a log line is: the message is the plugin's).
fn refused(call: &str, r: wasmtime::Result<Result<(), String>>) -> wasmtime::Result<()> {
    r?.map_err(|message| wasmtime::format_err!("the plugin refused {call}: {}", crate::runtime::log_line(&message)))
}

impl Instance {
    pub fn reset(
        &self,
        store: &mut Store<PluginState>,
        node: &Node,
        cluster: &Cluster,
        services: &[&ServicePort],
    ) -> wasmtime::Result<()> {
        let table = encode(self.family, services.iter().copied())?;
        let (node, cluster) = (wit_convert::to_wit_node(node), wit_convert::to_wit_cluster(cluster));
        refused(
            "reset",
            self.bindings.kpx_proxier0_3_0_backend().proxier().call_reset(
                store,
                self.resource,
                &node,
                &cluster,
                &table,
            ),
        )
    }

    /// Sends the net change of each port (what applying `changes` in
    /// order comes to), the last node and cluster.
    pub fn apply(&self, store: &mut Store<PluginState>, changes: &[Change]) -> wasmtime::Result<()> {
        let (mut ports, mut node, mut cluster) = (BTreeMap::new(), None, None);
        for change in changes {
            match change {
                Change::Upsert(p) => {
                    ports.insert(p.key.as_str(), Some(p));
                }
                Change::Remove(key) => {
                    ports.insert(key.as_str(), None);
                }
                Change::Node(n) => node = Some(n),
                Change::Cluster(c) => cluster = Some(c),
            }
        }
        let removes = ports.iter().filter(|(_, p)| p.is_none()).map(|(k, _)| k.to_string()).collect();
        let batch = wtab::ChangeBatch {
            removes,
            upserts: encode(self.family, ports.values().flatten().copied())?,
            node: node.map(wit_convert::to_wit_node),
            cluster: cluster.map(wit_convert::to_wit_cluster),
        };
        refused("apply", self.bindings.kpx_proxier0_3_0_backend().proxier().call_apply(store, self.resource, &batch))
    }

    /// The ruleset: an iptables one decoded from its words (the words and
    /// the rules together at most `max_output` bytes), the others as
    /// 0.2.0's.
    pub fn render(
        &self,
        store: &mut Store<PluginState>,
        full: bool,
        max_output: u64,
    ) -> wasmtime::Result<Result<Ruleset, String>> {
        let out = self.bindings.kpx_proxier0_3_0_backend().proxier().call_render(store, self.resource, full)?;
        Ok(out.and_then(|r| match r {
            wb::Ruleset::Iptables(w) => {
                // The words and the rules they decode to share the limit.
                let w = wit_words::from_wit_words(w);
                let budget = usize::try_from(max_output).unwrap_or(usize::MAX).saturating_sub(w.bytes());
                words::decode(&w, budget).map(Ruleset::Iptables).map_err(|e| e.to_string())
            }
            wb::Ruleset::Nftables(r) => v2::ruleset(v2::WireRuleset::Nftables(r)),
            wb::Ruleset::Ipvs(r) => v2::ruleset(v2::WireRuleset::Ipvs(r)),
        }))
    }
}
