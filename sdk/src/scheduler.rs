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

/// Live load per candidate (same order as the candidates), as the host
/// measured it: the WIT's `load`, passed through unchanged.
///
/// The host measures it only for a scheduler whose `uses_load(name)` is
/// true, in the iptables and nftables modes: a conntrack dump of the
/// family, taken afresh for each sync that plans such a port and every
/// 2 s (when the port is planned again), counting the connections each
/// candidate was sent through the port's destinations (its cluster,
/// external and load-balancer IPs on the port, any address on its node
/// port). When the conntrack table cannot be read, the host plans as if
/// idle: every count 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Established TCP connections.
    pub active: Vec<u32>,
    /// Every other entry: TCP connections not (or no longer) established,
    /// UDP and SCTP ones.
    pub inactive: Vec<u32>,
}

/// What the host asks a scheduler.
#[derive(Clone, Debug)]
pub struct Request {
    pub name: String,
    pub parameters: Vec<(String, String)>,
    pub mode: ProxyMode,
    pub port: ServicePort,
    /// Indices into `port.endpoints`; a plan names positions in this list.
    pub candidates: Vec<u32>,
    /// None unless `uses_load(name)` is true and the mode is iptables or
    /// nftables (ipvs mode: IPVS measures its own load; userspace mode
    /// asks for picks, not plans). See [`Load`].
    pub load: Option<Load>,
}

/// One new connection to place (userspace mode, where the host relays
/// every connection): the candidates with their exact open connections.
#[derive(Clone, Debug)]
pub struct PickRequest {
    pub name: String,
    pub parameters: Vec<(String, String)>,
    /// The service port's key: what state between picks is kept under.
    pub service: String,
    pub client: std::net::IpAddr,
    pub destination: std::net::IpAddr,
    /// The candidates' addresses; `weights`, `active` and `inactive` have
    /// an entry per candidate, in this order.
    pub endpoints: Vec<(std::net::IpAddr, u16)>,
    /// From `kpx.dev/weights` (default 1); a weight of 0 takes no new
    /// connection (the host refuses a pick of one).
    pub weights: Vec<u32>,
    /// Connections (UDP: sessions) the host's relays hold open to each
    /// candidate now, exact.
    pub active: Vec<u32>,
    /// Always 0 for every candidate: the WIT's `pick` carries no inactive
    /// counts (a relay has no inactive connections). It is here so that a
    /// cost such as IPVS's `active * 256 + inactive` reads the same in
    /// `pick` as over a plan request's [`Load`].
    pub inactive: Vec<u32>,
    /// Candidates that already failed this connection.
    pub failed: Vec<u32>,
    /// A fresh random number from the host.
    pub random: u32,
}

/// A scheduler component. `plan` is a plain function; `pick` may keep
/// state between calls (in the component's own memory), by service.
pub trait Scheduler {
    /// The names it answers to.
    fn names() -> Vec<String>;
    /// Whether `name` plans from live load.
    fn uses_load(name: &str) -> bool;
    /// A plan over `request.candidates`, or why not (naming the parameter).
    fn plan(request: Request) -> Result<Plan, String>;
    /// The candidate for one new connection, None when none may take it.
    /// A scheduler without per-connection picks says so.
    fn pick(request: PickRequest) -> Result<Option<u32>, String> {
        Err(format!("{} has no per-connection pick", request.name))
    }
    /// The host forgot the last picks of `service` (its port left):
    /// state kept for it may go.
    fn forget(_service: &str) {}
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
            wt::ProxyMode::Userspace => ProxyMode::Userspace,
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

    fn prepare_picks(id: u32, setup: wit::PickSetup) -> Result<(), String> {
        let setup = Setup {
            name: setup.name,
            parameters: setup.parameters,
            service: setup.service,
            destination: convert::from_wit_ip(&setup.destination),
            endpoints: setup.endpoints.iter().map(|e| (convert::from_wit_ip(&e.address), e.port)).collect(),
            weights: setup.weights,
        };
        if setup.weights.len() != setup.endpoints.len() {
            return Err(format!("{} candidates but {} weights", setup.endpoints.len(), setup.weights.len()));
        }
        setups().insert(id, setup);
        Ok(())
    }

    fn forget_picks(id: u32) {
        let mut setups = setups();
        if let Some(gone) = setups.remove(&id)
            && !setups.values().any(|s| s.service == gone.service)
        {
            drop(setups);
            S::forget(&gone.service);
        }
    }

    fn pick(
        id: u32,
        client: wt::IpAddress,
        active: Vec<u32>,
        failed: Vec<u32>,
        random: u32,
    ) -> Result<Option<u32>, String> {
        let request = {
            let setups = setups();
            let Some(s) = setups.get(&id) else { return Err(format!("picks {id} were never set up")) };
            if active.len() != s.endpoints.len() {
                return Err(format!("{} candidates but {} counts", s.endpoints.len(), active.len()));
            }
            PickRequest {
                name: s.name.clone(),
                parameters: s.parameters.clone(),
                service: s.service.clone(),
                client: convert::from_wit_ip(&client),
                destination: s.destination,
                endpoints: s.endpoints.clone(),
                weights: s.weights.clone(),
                // The host sends none (see `PickRequest::inactive`).
                inactive: vec![0; active.len()],
                active,
                failed,
                random,
            }
        };
        S::pick(request)
    }
}

/// A side of a service port as `prepare-picks` set it up.
struct Setup {
    name: String,
    parameters: Vec<(String, String)>,
    service: String,
    destination: std::net::IpAddr,
    endpoints: Vec<(std::net::IpAddr, u16)>,
    weights: Vec<u32>,
}

/// The setups by id, in the component's own memory.
fn setups() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<u32, Setup>> {
    static SETUPS: std::sync::Mutex<std::collections::BTreeMap<u32, Setup>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    SETUPS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Exports a [`Scheduler`] implementation as the plugin's `kpx:proxier/scheduler`.
#[macro_export]
macro_rules! export_scheduler {
    ($scheduler:ty) => {
        type __KpxSchedulerExport = $crate::scheduler::SchedulerExport<$scheduler>;
        $crate::scheduler::__bindings::__export_scheduler_plugin!(
            __KpxSchedulerExport with_types_in $crate::scheduler::__bindings
        );

        $crate::__kpx_version_section!($crate::CONTRACT_VERSION);
    };
}
