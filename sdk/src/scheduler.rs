//! The scheduler world: [`Scheduler`], [`Promise`],
//! [`export_scheduler!`](crate::export_scheduler) (kpx:proxier 0.4.0) and
//! [`export_scheduler_v0_2!`](crate::export_scheduler_v0_2) (0.2.0, which
//! states no promises).

use kpx_rules::model::{ProxyMode, ServicePort};
use kpx_rules::plan::Plan;

/// The 0.2.0 scheduler world, whose types the 0.4.0 one reuses.
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

/// The 0.4.0 scheduler world: its own `scheduler` interface (0.2.0's plus
/// `promises`); 0.2.0's types, log and request records bound to
/// [`__bindings`]' types, so that both worlds share one implementation.
/// The world is included under a name of its own: wit-bindgen names the
/// crate-level export macro after the world, and 0.2.0's world has this
/// one's name.
#[doc(hidden)]
pub mod __bindings_v0_4 {
    wit_bindgen::generate!({
        path: "../wit/since_v0.4.0",
        inline: "package kpx:sdk; world scheduler-plugin-promises { include kpx:proxier/scheduler-plugin@0.4.0; }",
        world: "scheduler-plugin-promises",
        pub_export_macro: true,
        export_macro_name: "__export_scheduler_plugin_v0_4",
        default_bindings_module: "::kpx_sdk::scheduler::__bindings_v0_4",
        with: {
            "kpx:proxier/types@0.2.0": crate::scheduler::__bindings::kpx::proxier::types,
            "kpx:proxier/log@0.2.0": crate::scheduler::__bindings::kpx::proxier::log,
            "kpx:proxier/scheduler@0.2.0": crate::scheduler::__bindings::exports::kpx::proxier::scheduler,
        },
    });
}

mod convert {
    kpx_rules::wit_conversions!(crate::scheduler::__bindings::kpx::proxier::types);
    pub use wit_convert::*;
}

use __bindings::exports::kpx::proxier::scheduler as wit;
use __bindings::kpx::proxier::types as wt;
use __bindings_v0_4::exports::kpx::proxier0_4_0::scheduler as wit4;

pub use kpx_rules::promise::Promise;

/// The WIT's promise.
fn to_wit(p: Promise) -> wit4::Promise {
    match p {
        Promise::Spread => wit4::Promise::Spread,
        Promise::Weighted => wit4::Promise::Weighted,
        Promise::Sticky => wit4::Promise::Sticky,
        Promise::MinimalDisruption => wit4::Promise::MinimalDisruption,
        Promise::LeastLoaded => wit4::Promise::LeastLoaded,
        Promise::Priority => wit4::Promise::Priority,
    }
}

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
    /// What `name` guarantees: `kpx conformance` checks exactly these (at
    /// most 16, each once; kpx refuses another list). The default,
    /// `[Spread]`, is what every scheduler was checked for before
    /// schedulers stated promises; a scheduler that does not spread (a
    /// failover, a hash of the destination) says what it does instead,
    /// and an empty list promises nothing beyond the contract.
    /// [`export_scheduler_v0_2!`](crate::export_scheduler_v0_2) ignores
    /// it: a 0.2.0 component states none and is checked as spreading.
    fn promises(_name: &str) -> Vec<Promise> {
        vec![Promise::Spread]
    }
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

/// The 0.4.0 interface: 0.2.0's calls, and `promises`.
impl<S: Scheduler> wit4::Guest for SchedulerExport<S> {
    fn names() -> Vec<String> {
        S::names()
    }

    fn promises(name: String) -> Vec<wit4::Promise> {
        S::promises(&name).into_iter().map(to_wit).collect()
    }

    fn uses_load(name: String) -> bool {
        S::uses_load(&name)
    }

    fn schedule(request: wit::Request) -> Result<wt::Plan, String> {
        <Self as wit::Guest>::schedule(request)
    }

    fn prepare_picks(id: u32, setup: wit::PickSetup) -> Result<(), String> {
        <Self as wit::Guest>::prepare_picks(id, setup)
    }

    fn forget_picks(id: u32) {
        <Self as wit::Guest>::forget_picks(id)
    }

    fn pick(
        id: u32,
        client: wt::IpAddress,
        active: Vec<u32>,
        failed: Vec<u32>,
        random: u32,
    ) -> Result<Option<u32>, String> {
        <Self as wit::Guest>::pick(id, client, active, failed, random)
    }
}

/// Exports a [`Scheduler`] implementation as the plugin's
/// `kpx:proxier/scheduler@0.4.0`: its names state their promises.
#[macro_export]
macro_rules! export_scheduler {
    ($scheduler:ty) => {
        type __KpxSchedulerExport = $crate::scheduler::SchedulerExport<$scheduler>;
        $crate::scheduler::__bindings_v0_4::__export_scheduler_plugin_v0_4!(
            __KpxSchedulerExport with_types_in $crate::scheduler::__bindings_v0_4
        );

        $crate::__kpx_version_section!($crate::PLUGIN_CONTRACT_VERSION);
    };
}

/// Exports a [`Scheduler`] implementation as `kpx:proxier/scheduler@0.2.0`,
/// for hosts older than contract 0.4.0 (kpx still runs these): the
/// component states no promises ([`Scheduler::promises`] is not called),
/// and kpx checks it as promising `spread`.
#[macro_export]
macro_rules! export_scheduler_v0_2 {
    ($scheduler:ty) => {
        type __KpxSchedulerExport = $crate::scheduler::SchedulerExport<$scheduler>;
        $crate::scheduler::__bindings::__export_scheduler_plugin!(
            __KpxSchedulerExport with_types_in $crate::scheduler::__bindings
        );

        $crate::__kpx_version_section!($crate::CONTRACT_VERSION);
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Plain;

    impl Scheduler for Plain {
        fn names() -> Vec<String> {
            vec!["d".into()]
        }
        fn uses_load(_: &str) -> bool {
            false
        }
        fn plan(_: Request) -> Result<Plan, String> {
            Ok(Plan::Weighted(vec![1]))
        }
    }

    struct Failover;

    impl Scheduler for Failover {
        fn names() -> Vec<String> {
            vec!["f".into()]
        }
        fn promises(_: &str) -> Vec<Promise> {
            vec![Promise::Priority, Promise::MinimalDisruption]
        }
        fn uses_load(_: &str) -> bool {
            false
        }
        fn plan(_: Request) -> Result<Plan, String> {
            Ok(Plan::Sequence(vec![0]))
        }
    }

    /// A scheduler that states nothing promises `spread`; one that states
    /// its promises crosses the 0.4.0 interface with them, in order.
    #[test]
    fn promises_default_to_spread_and_cross_in_order() {
        use wit4::Guest;
        assert_eq!(<SchedulerExport<Plain> as Guest>::promises("d".into()), [wit4::Promise::Spread]);
        let stated = <SchedulerExport<Failover> as Guest>::promises("f".into());
        assert_eq!(stated, [wit4::Promise::Priority, wit4::Promise::MinimalDisruption]);
    }
}
