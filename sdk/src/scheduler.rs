//! The scheduler world: [`Scheduler`] and [`export_scheduler!`](crate::export_scheduler).

use kpx_rules::model::{ProxyMode, ServicePort};
use kpx_rules::plan::Plan;

#[doc(hidden)]
pub mod __bindings {
    wit_bindgen::generate!({
        path: "../wit/since_v0.2.0",
        world: "scheduler-plugin",
        pub_export_macro: true,
        export_macro_name: "__export_scheduler_plugin",
        default_bindings_module: "::kpx_sdk::scheduler::__bindings",
    });
}

mod convert {
    kpx_rules::wit_conversions!(crate::scheduler::__bindings::kpx::proxier::types);
    pub use wit_convert::*;
}

use __bindings::exports::kpx::proxier::scheduler as wit;
use __bindings::kpx::proxier::types as wt;

/// Live load per candidate (same order as the candidates).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Load {
    pub active: Vec<u32>,
    pub inactive: Vec<u32>,
}

/// What the host asks a scheduler.
#[derive(Clone, Debug)]
pub struct Request {
    pub name: String,
    pub parameters: Vec<(String, String)>,
    pub mode: ProxyMode,
    pub port: ServicePort,
    /// Indices into `port.endpoints`.
    pub candidates: Vec<u32>,
    pub load: Option<Load>,
}

/// A scheduler component: plain functions, no state between calls.
pub trait Scheduler {
    /// The names it answers to.
    fn names() -> Vec<String>;
    /// Whether `name` plans from live load.
    fn uses_load(name: &str) -> bool;
    /// A plan over `request.candidates`, or why not (naming the parameter).
    fn plan(request: Request) -> Result<Plan, String>;
}

#[doc(hidden)]
pub struct SchedulerExport<S>(std::marker::PhantomData<S>);

impl<S: Scheduler> wit::Guest for SchedulerExport<S> {
    fn names() -> Vec<String> {
        S::names()
    }

    fn uses_load(name: String) -> bool {
        S::uses_load(&name)
    }

    fn schedule(request: wit::Request) -> Result<wt::Plan, String> {
        let mode = match request.mode {
            wt::ProxyMode::Iptables => ProxyMode::Iptables,
            wt::ProxyMode::Nftables => ProxyMode::Nftables,
            wt::ProxyMode::Ipvs => ProxyMode::Ipvs,
        };
        let request = Request {
            name: request.name,
            parameters: request.parameters,
            mode,
            port: convert::from_wit_service_port(request.port),
            candidates: request.candidates,
            load: request.load.map(|l| Load { active: l.active, inactive: l.inactive }),
        };
        S::plan(request).map(|p| convert::to_wit_plan(&p))
    }
}

/// Exports a [`Scheduler`] implementation as the plugin's `kpx:proxier/scheduler`.
#[macro_export]
macro_rules! export_scheduler {
    ($scheduler:ty) => {
        type __KpxSchedulerExport = $crate::scheduler::SchedulerExport<$scheduler>;
        $crate::scheduler::__bindings::__export_scheduler_plugin!(
            __KpxSchedulerExport with_types_in $crate::scheduler::__bindings
        );

        /// The contract version, read by the host before it compiles the plugin.
        #[cfg(target_family = "wasm")]
        #[unsafe(link_section = "kpx:proxier-version")]
        #[used]
        static __KPX_PROXIER_VERSION: [u8; $crate::CONTRACT_VERSION.len()] = $crate::contract_version_bytes();
    };
}
