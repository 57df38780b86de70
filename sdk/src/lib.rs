//! kpx-sdk: what a kpx plugin author depends on.
//!
//! Implement [`Backend`] (re-exported from kpx-rules' model) and export it:
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
//! candidate endpoints, which every mode executes (docs/ARCHITECTURE.md).
//!
//! An extension implements [`extension::Extension`] and exports it with
//! [`export_extension!`]: it returns rules for new connections to Service
//! ports (count, rate-limit, drop, reject) that the host writes in
//! objects of the extension's own.
//!
//! | kpx-sdk | kpx:proxier | kpx host accepts |
//! |---------|-------------|------------------|
//! | 0.1.x   | 0.2.0 (development) | kpx 0.1.x built from the same tree |

mod convert;
mod mem;

use std::cell::RefCell;

pub use kpx_rules::model::{
    Backend, Change, Cidr, Cluster, Conditions, Endpoint, IpFamily, LocalTraffic, Node, Protocol, ProxyMode,
    ServicePort, Settings, TrafficPolicy,
};
pub use kpx_rules::ops;
pub use kpx_rules::plan::{HashField, Plan, SlotTable};

/// The contract version this SDK builds plugins against.
pub const CONTRACT_VERSION: &str = "0.2.0";

/// The custom section content: [`CONTRACT_VERSION`] as bytes.
#[doc(hidden)]
pub const fn contract_version_bytes() -> [u8; CONTRACT_VERSION.len()] {
    let src = CONTRACT_VERSION.as_bytes();
    let mut out = [0u8; CONTRACT_VERSION.len()];
    let mut i = 0;
    while i < src.len() {
        out[i] = src[i];
        i += 1;
    }
    out
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

pub mod extension;
pub mod names;
pub mod scheduler;
pub mod testing;

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

/// The WIT `proxier` resource around a [`Backend`]. Used by [`export_backend!`].
#[doc(hidden)]
pub struct BackendResource<B>(RefCell<B>);

impl<B: Backend + 'static> __bindings::exports::kpx::proxier::backend::GuestProxier for BackendResource<B> {
    fn new(settings: __bindings::kpx::proxier::types::Settings) -> Self {
        install_panic_hook();
        BackendResource(RefCell::new(B::new(wit_convert::from_wit_settings(settings))))
    }

    fn reset(
        &self,
        node: __bindings::kpx::proxier::types::Node,
        cluster: __bindings::kpx::proxier::types::Cluster,
        services: Vec<__bindings::kpx::proxier::types::ServicePort>,
    ) {
        let services = services.into_iter().map(wit_convert::from_wit_service_port).collect();
        let (node, cluster) = (wit_convert::from_wit_node(node), wit_convert::from_wit_cluster(cluster));
        self.0.borrow_mut().reset(node, cluster, services);
    }

    fn apply(&self, changes: Vec<__bindings::kpx::proxier::types::Change>) {
        let changes = changes.into_iter().map(wit_convert::from_wit_change).collect();
        self.0.borrow_mut().apply(changes);
    }

    fn render(&self, full: bool) -> Result<__bindings::exports::kpx::proxier::backend::Ruleset, String> {
        let ruleset = self.0.borrow_mut().render(full)?;
        convert::ruleset(ruleset)
    }
}

/// Exports a [`Backend`] implementation as the plugin's `kpx:proxier/backend`.
#[macro_export]
macro_rules! export_backend {
    ($backend:ty) => {
        struct __KpxBackendExport;
        impl $crate::__bindings::exports::kpx::proxier::backend::Guest for __KpxBackendExport {
            type Proxier = $crate::BackendResource<$backend>;
        }
        $crate::__bindings::__export_backend_plugin!(__KpxBackendExport with_types_in $crate::__bindings);

        /// The contract version, read by the host before it compiles the plugin.
        #[cfg(target_family = "wasm")]
        #[unsafe(link_section = "kpx:proxier-version")]
        #[used]
        static __KPX_PROXIER_VERSION: [u8; $crate::CONTRACT_VERSION.len()] = $crate::contract_version_bytes();
    };
}
