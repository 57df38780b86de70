//! kpx-sdk: what a kpx plugin author depends on.
//!
//! Implement [`Backend`] (re-exported from kpx-rules) and export it:
//!
//! ```text
//! struct MyBackend { /* ... */ }
//! impl kpx_sdk::Backend for MyBackend { /* new, reset, apply, render */ }
//! kpx_sdk::export_backend!(MyBackend);
//! ```
//!
//! `render` returns typed rules ([`ops`]): iptables rules as records, or an
//! nftables transaction of chains, sets, maps, rules and elements. The host
//! checks them against the state and writes the kernel syntax itself; a
//! plugin cannot express anything outside kube-proxy's objects (see
//! docs/SECURITY.md).
//!
//! Build the crate for `wasm32-unknown-unknown` with the toolchain's
//! `wasm-component-ld` as linker; the result imports nothing but
//! `kpx:proxier/log`. The export macro also embeds the contract version the
//! plugin was built against, which the host reads before compiling it.
//!
//! A scheduler plugin implements [`scheduler::Scheduler`] and exports it
//! with [`export_scheduler!`]: it returns a [`Plan`] for a service port's
//! candidate endpoints, which the modes execute (docs/plugins.md, "Plans",
//! says which mode runs which), and states each name's [`Promise`]s
//! (spread, weighted, sticky, minimal disruption, least loaded,
//! priority), which `kpx conformance` checks. Everything a plan is built
//! from is here:
//!
//! ```
//! use kpx_sdk::{HashField, KernelPlan, Plan, ProxyMode, SlotTable, testing};
//!
//! // Over two candidates: positions in the request's `candidates`.
//! let plans = [
//!     Plan::Weighted(vec![3, 1]),
//!     Plan::Sequence(vec![0, 0, 0, 1]),
//!     Plan::Slots(SlotTable { field: HashField::Source, seed: 7, rows: 1, cols: 4, slots: vec![0, 0, 0, 1] }),
//!     Plan::Kernel(KernelPlan { scheduler: "wrr".into(), weights: vec![3, 1], flags: 0 }),
//! ];
//! let in_ipvs: Vec<bool> = plans.iter().map(|p| testing::check_plan(p, 2, ProxyMode::Ipvs).is_ok()).collect();
//! assert_eq!(in_ipvs, [false, false, true, true]);
//! assert_eq!((kpx_sdk::MAX_WEIGHT_SUM, kpx_sdk::MAX_SEQUENCE, kpx_sdk::MAX_SLOT_DIM), (4096, 1024, 32));
//! assert!(kpx_sdk::IPVS_SCHEDULERS.contains(&"wrr"));
//! ```
//!
//! An extension implements [`extension::Extension`] and exports it with
//! [`export_extension!`] (kpx:proxier 0.4.0; [`export_extension_v0_2!`]
//! builds 0.2.0): it returns rules for new connections to Service ports
//! (count, rate-limit, drop, reject, accept) that the host writes in
//! objects of the extension's own, and may refuse its parameters when kpx
//! loads it.
//!
//! | kpx-sdk | kpx:proxier | kpx host accepts |
//! |---------|-------------|------------------|
//! | 0.1.x   | backends 0.3.0 ([`export_backend!`]) or 0.2.0 ([`export_backend_v0_2!`]); schedulers 0.4.0 ([`export_scheduler!`]) or 0.2.0 ([`export_scheduler_v0_2!`]); extensions 0.4.0 ([`export_extension!`]) or 0.2.0 ([`export_extension_v0_2!`]) | kpx 0.1.x built from the same tree: 0.2.0, 0.3.0 and 0.4.0 |

mod convert;
mod mem;

use std::cell::RefCell;

pub use kpx_rules::backend::Backend;
pub use kpx_rules::model::{
    Change, Cidr, Cluster, Conditions, Endpoint, IpFamily, LocalTraffic, Node, Protocol, ProxyMode, ServicePort,
    Settings, TrafficPolicy,
};
pub use kpx_rules::ops;
// Every plan variant and the bounds the host checks plans against
// (docs/plugins.md, "Plans").
pub use kpx_rules::plan::{
    HashField, IPVS_SCHEDULERS, KernelPlan, MAX_SEQUENCE, MAX_SLOT_DIM, MAX_WEIGHT_SUM, Plan, SlotTable,
};

/// The contract version of [`export_backend_v0_2!`] and of the 0.2.0
/// scheduler and extension macros, which kpx still runs.
pub const CONTRACT_VERSION: &str = "0.2.0";

/// The contract version [`export_scheduler!`] and [`export_extension!`]
/// build schedulers and extensions against.
pub const PLUGIN_CONTRACT_VERSION: &str = "0.4.0";

/// The contract version [`export_backend!`] builds backends against.
pub const BACKEND_CONTRACT_VERSION: &str = "0.3.0";

/// A version's custom section content: its bytes.
#[doc(hidden)]
pub const fn version_bytes<const N: usize>(version: &str) -> [u8; N] {
    let src = version.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < src.len() && i < N {
        out[i] = src[i];
        i += 1;
    }
    out
}

/// The contract version's custom section, read by the host before it
/// compiles the plugin; every export macro writes one.
#[doc(hidden)]
#[macro_export]
macro_rules! __kpx_version_section {
    ($version:expr) => {
        #[cfg(target_family = "wasm")]
        #[unsafe(link_section = "kpx:proxier-version")]
        #[used]
        static __KPX_PROXIER_VERSION: [u8; $version.len()] = $crate::version_bytes($version);
    };
}

#[doc(hidden)]
pub mod __bindings {
    wit_bindgen::generate!({
        path: "../wit/since_v0.2.0",
        world: "backend-plugin",
        pub_export_macro: true,
        export_macro_name: "__export_backend_plugin",
        default_bindings_module: "::kpx_sdk::__bindings",
    });
}

kpx_rules::wit_conversions!(crate::__bindings::kpx::proxier::types);

/// The 0.3.0 backend world: its own `tables` and `backend`, and 0.2.0's
/// interfaces (types, rulesets, log) bound to [`__bindings`]' types.
#[doc(hidden)]
pub mod __bindings_v0_3 {
    wit_bindgen::generate!({
        path: "../wit/since_v0.3.0",
        world: "backend-plugin-tables",
        pub_export_macro: true,
        export_macro_name: "__export_backend_plugin_v0_3",
        default_bindings_module: "::kpx_sdk::__bindings_v0_3",
        with: {
            "kpx:proxier/types@0.2.0": crate::__bindings::kpx::proxier::types,
            "kpx:proxier/iptables@0.2.0": crate::__bindings::kpx::proxier::iptables,
            "kpx:proxier/nftables@0.2.0": crate::__bindings::kpx::proxier::nftables,
            "kpx:proxier/ipvs@0.2.0": crate::__bindings::kpx::proxier::ipvs,
            "kpx:proxier/log@0.2.0": crate::__bindings::kpx::proxier::log,
        },
    });
}

kpx_rules::table_conversions!(
    crate::__bindings_v0_3::kpx::proxier0_3_0::tables,
    crate::__bindings::kpx::proxier::types
);

kpx_rules::words_conversions!(
    crate::__bindings_v0_3::kpx::proxier0_3_0::words,
    crate::__bindings::kpx::proxier::types,
    crate::__bindings::kpx::proxier::iptables
);

pub mod cidr;
pub mod extension;
pub mod names;
pub mod scheduler;
pub mod testing;

pub use scheduler::Promise;

/// Log through the host, which prefixes the plugin's name. Outside a
/// component (a plugin's native unit tests) the lines go to stderr.
pub mod log {
    use crate::__bindings::kpx::proxier::log as host;

    fn log(level: host::Level, message: &str) {
        #[cfg(target_family = "wasm")]
        host::log(level, message);
        #[cfg(not(target_family = "wasm"))]
        eprintln!("{level:?}: {message}");
    }

    pub fn error(message: &str) {
        log(host::Level::Error, message);
    }
    pub fn warn(message: &str) {
        log(host::Level::Warn, message);
    }
    pub fn info(message: &str) {
        log(host::Level::Info, message);
    }
    pub fn debug(message: &str) {
        log(host::Level::Debug, message);
    }
}

/// Sends panic messages to the host log: a wasm32-unknown-unknown guest
/// has no stderr, and without this a panic is only "unreachable".
pub(crate) fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        log::error(&format!("plugin panicked: {info}"));
    }));
}

/// The WIT `proxier` resource around a [`Backend`]. Used by [`export_backend!`]
/// (contract 0.3.0) and [`export_backend_v0_2!`].
#[doc(hidden)]
pub struct BackendResource<B> {
    backend: RefCell<B>,
    /// The instance's family: an iptables ruleset's words are of it.
    family: IpFamily,
}

impl<B: Backend + 'static> BackendResource<B> {
    fn create(settings: __bindings::kpx::proxier::types::Settings) -> Self {
        install_panic_hook();
        let settings = wit_convert::from_wit_settings(settings);
        BackendResource { family: settings.family, backend: RefCell::new(B::new(settings)) }
    }
}

impl<B: Backend + 'static> __bindings_v0_3::exports::kpx::proxier0_3_0::backend::GuestProxier for BackendResource<B> {
    fn new(settings: __bindings::kpx::proxier::types::Settings) -> Self {
        Self::create(settings)
    }

    fn reset(
        &self,
        node: __bindings::kpx::proxier::types::Node,
        cluster: __bindings::kpx::proxier::types::Cluster,
        services: __bindings_v0_3::kpx::proxier0_3_0::tables::PortTable,
    ) -> Result<(), String> {
        let services = kpx_rules::table::decode(&wit_table::from_wit_table(services)).map_err(|e| e.to_string())?;
        let mut keys = std::collections::HashSet::with_capacity(services.len());
        if let Some(p) = services.iter().find(|p| !keys.insert(p.key.as_str())) {
            return Err(format!("port-table: {} twice", p.key));
        }
        drop(keys);
        let (node, cluster) = (wit_convert::from_wit_node(node), wit_convert::from_wit_cluster(cluster));
        self.backend.borrow_mut().reset(node, cluster, services);
        Ok(())
    }

    fn apply(&self, batch: __bindings_v0_3::kpx::proxier0_3_0::tables::ChangeBatch) -> Result<(), String> {
        let changes = batch_changes(batch)?;
        self.backend.borrow_mut().apply(changes);
        Ok(())
    }

    /// iptables rules as words; nftables and ipvs as 0.2.0's records.
    fn render(&self, full: bool) -> Result<__bindings_v0_3::exports::kpx::proxier0_3_0::backend::Ruleset, String> {
        use __bindings_v0_3::exports::kpx::proxier0_3_0::backend::Ruleset as V3;
        Ok(match self.backend.borrow_mut().render(full)? {
            ops::Ruleset::Iptables(r) => {
                let words = ops::iptables::words::encode(self.family, &r).map_err(|e| e.to_string())?;
                drop(r);
                V3::Iptables(wit_words::to_wit_words(words))
            }
            ops::Ruleset::Nftables(t) => V3::Nftables(convert::nftables(t)?),
            ops::Ruleset::Ipvs(r) => V3::Ipvs(convert::ipvs(r)),
        })
    }
}

/// A 0.3.0 change batch as the [`Backend`]'s changes: the removes, the
/// upserts, the cluster, then the node (the order 0.2.0's host sent
/// them in). A key removed and upserted, or upserted twice, is refused:
/// the host sends each port's net change.
fn batch_changes(batch: __bindings_v0_3::kpx::proxier0_3_0::tables::ChangeBatch) -> Result<Vec<Change>, String> {
    let upserts = kpx_rules::table::decode(&wit_table::from_wit_table(batch.upserts)).map_err(|e| e.to_string())?;
    let mut keys: std::collections::HashSet<&str> = batch.removes.iter().map(String::as_str).collect();
    if keys.len() != batch.removes.len() {
        return Err("change-batch: a key removed twice".into());
    }
    if let Some(p) = upserts.iter().find(|p| !keys.insert(&p.key)) {
        return Err(format!("change-batch: {} is both removed and upserted, or upserted twice", p.key));
    }
    let mut changes = Vec::with_capacity(2 + batch.removes.len() + upserts.len());
    changes.extend(batch.removes.into_iter().map(Change::Remove));
    changes.extend(upserts.into_iter().map(Change::Upsert));
    changes.extend(batch.cluster.map(|c| Change::Cluster(wit_convert::from_wit_cluster(c))));
    changes.extend(batch.node.map(|n| Change::Node(wit_convert::from_wit_node(n))));
    Ok(changes)
}

impl<B: Backend + 'static> __bindings::exports::kpx::proxier::backend::GuestProxier for BackendResource<B> {
    fn new(settings: __bindings::kpx::proxier::types::Settings) -> Self {
        Self::create(settings)
    }

    fn reset(
        &self,
        node: __bindings::kpx::proxier::types::Node,
        cluster: __bindings::kpx::proxier::types::Cluster,
        services: Vec<__bindings::kpx::proxier::types::ServicePort>,
    ) {
        let services = services.into_iter().map(wit_convert::from_wit_service_port).collect();
        let (node, cluster) = (wit_convert::from_wit_node(node), wit_convert::from_wit_cluster(cluster));
        self.backend.borrow_mut().reset(node, cluster, services);
    }

    fn apply(&self, changes: Vec<__bindings::kpx::proxier::types::Change>) {
        let changes = changes.into_iter().map(wit_convert::from_wit_change).collect();
        self.backend.borrow_mut().apply(changes);
    }

    fn render(&self, full: bool) -> Result<__bindings::exports::kpx::proxier::backend::Ruleset, String> {
        convert::ruleset(self.backend.borrow_mut().render(full)?)
    }
}

/// Exports a [`Backend`] implementation as the plugin's
/// `kpx:proxier/backend@0.3.0`.
#[macro_export]
macro_rules! export_backend {
    ($backend:ty) => {
        struct __KpxBackendExport;
        impl $crate::__bindings_v0_3::exports::kpx::proxier0_3_0::backend::Guest for __KpxBackendExport {
            type Proxier = $crate::BackendResource<$backend>;
        }
        $crate::__bindings_v0_3::__export_backend_plugin_v0_3!(__KpxBackendExport with_types_in $crate::__bindings_v0_3);

        $crate::__kpx_version_section!($crate::BACKEND_CONTRACT_VERSION);
    };
}

/// Exports a [`Backend`] implementation as `kpx:proxier/backend@0.2.0`,
/// for hosts older than contract 0.3.0 (kpx still runs these).
#[macro_export]
macro_rules! export_backend_v0_2 {
    ($backend:ty) => {
        struct __KpxBackendExport;
        impl $crate::__bindings::exports::kpx::proxier::backend::Guest for __KpxBackendExport {
            type Proxier = $crate::BackendResource<$backend>;
        }
        $crate::__bindings::__export_backend_plugin!(__KpxBackendExport with_types_in $crate::__bindings);

        $crate::__kpx_version_section!($crate::CONTRACT_VERSION);
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::table::encode;

    fn port(name: &str) -> ServicePort {
        ServicePort::new("ns", name, "", Protocol::Tcp, 80)
    }

    fn batch(removes: &[&str], upserts: &[ServicePort]) -> __bindings_v0_3::kpx::proxier0_3_0::tables::ChangeBatch {
        __bindings_v0_3::kpx::proxier0_3_0::tables::ChangeBatch {
            removes: removes.iter().map(|k| k.to_string()).collect(),
            upserts: wit_table::to_wit_table(encode(IpFamily::V4, upserts).unwrap()),
            node: Some(wit_convert::to_wit_node(&Node::default())),
            cluster: Some(wit_convert::to_wit_cluster(&Cluster::default())),
        }
    }

    #[test]
    fn a_batch_applies_removes_upserts_cluster_then_node() {
        let changes = batch_changes(batch(&["ns/gone"], &[port("a"), port("b")])).unwrap();
        let kinds: Vec<String> = changes
            .iter()
            .map(|c| match c {
                Change::Remove(k) => format!("remove {k}"),
                Change::Upsert(p) => format!("upsert {}", p.key),
                Change::Cluster(_) => "cluster".into(),
                Change::Node(_) => "node".into(),
            })
            .collect();
        assert_eq!(kinds, ["remove ns/gone", "upsert ns/a", "upsert ns/b", "cluster", "node"]);
    }

    /// Ports of every shape, both families: 0.2.0's records and 0.3.0's
    /// table carry them to the same model.
    #[test]
    fn both_contract_versions_deliver_the_same_ports() {
        use kpx_rules::plan::{HashField, KernelPlan, SlotTable};
        let ep = |ip: &str, port: u16| Endpoint::ready(ip.parse().unwrap(), port);
        let mut a = ServicePort::new("shop", "web", "http", Protocol::Tcp, 80);
        a.cluster_ip = Some("10.96.0.10".parse().unwrap());
        a.node_port = 30080;
        a.external_ips = vec!["192.0.2.1".parse().unwrap()];
        a.load_balancer_ips = vec!["198.51.100.7".parse().unwrap(), "198.51.100.8".parse().unwrap()];
        a.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
        a.external_traffic_policy = TrafficPolicy::Local;
        a.internal_traffic_policy = TrafficPolicy::Local;
        a.health_check_node_port = 31000;
        a.affinity_timeout_seconds = 60;
        let mut odd = ep("10.244.2.9", 8080);
        odd.conditions = Conditions { ready: false, serving: true, terminating: true, is_local: true };
        odd.zone = Some("zone-b".into());
        odd.weight = 0;
        let mut heavy = ep("10.244.1.5", 8080);
        heavy.weight = 9;
        heavy.zone = Some("zone-a".into());
        a = a.with_cluster_endpoints(vec![heavy, odd, ep("10.244.3.1", 8443)]);
        a.cluster_endpoints = vec![2, 0];
        a.local_endpoints = vec![1];
        a.cluster_plan = Some(Plan::Weighted(vec![1, 3]));
        a.local_plan =
            Some(Plan::Slots(SlotTable { field: HashField::Destination, seed: 1, rows: 1, cols: 1, slots: vec![0] }));
        let mut b = ServicePort::new("shop", "db", "", Protocol::Sctp, 5432)
            .with_cluster_endpoints(vec![ep("10.244.9.9", 5432)]);
        b.cluster_plan = Some(Plan::Kernel(KernelPlan { scheduler: "sh".into(), weights: vec![1], flags: 3 }));
        let c = ServicePort::new("other", "empty", "udp", Protocol::Udp, 53);
        let mut v6 = ServicePort::new("ns", "v6", "", Protocol::Udp, 53);
        v6.cluster_ip = Some("fd00:96::a".parse().unwrap());
        v6.external_ips = vec!["2001:db8::1".parse().unwrap()];
        v6.load_balancer_source_ranges = vec!["2001:db8::/48".parse().unwrap()];
        v6 = v6.with_cluster_endpoints(vec![ep("fd00:244::1", 53), ep("fd00:244::ffff:a00:1", 53)]);
        v6.cluster_plan = Some(Plan::Sequence(vec![1, 0, 0]));
        for (family, ports) in [(IpFamily::V4, vec![a, b, c]), (IpFamily::V6, vec![v6])] {
            let v2: Vec<ServicePort> =
                ports.iter().map(|p| wit_convert::from_wit_service_port(wit_convert::to_wit_service_port(p))).collect();
            let table = wit_table::to_wit_table(encode(family, &ports).unwrap());
            let v3 = kpx_rules::table::decode(&wit_table::from_wit_table(table)).unwrap();
            assert_eq!(v2, ports, "{family:?}: 0.2.0");
            assert_eq!(v3, ports, "{family:?}: 0.3.0");
        }
    }

    #[test]
    fn a_batch_with_a_key_twice_is_refused() {
        let e = batch_changes(batch(&["ns/a"], &[port("a")])).unwrap_err();
        assert!(e.contains("ns/a is both removed and upserted"), "{e}");
        assert!(batch_changes(batch(&[], &[port("a"), port("a")])).is_err());
        assert!(batch_changes(batch(&["ns/a", "ns/a"], &[])).is_err());
    }
}
