//! Scheduler components: loaded, sandboxed and called like backends
//! (same engine, limits, fuel and log budget), one Store per instance.
//! kpx runs the 0.4.0 world (schedulers that state their promises) and
//! 0.2.0's (which state none, and are taken to promise `spread`).

use std::sync::atomic::Ordering;

use kpx_rules::plan::Plan;
use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::wit::since_v0_2_0::{self as v0_2_0, PickRequest, PickSetup, ScheduleRequest};
use super::wit::since_v0_4_0::{self as v0_4_0, scheduler as v4};
use super::{PluginBase, PluginState, PluginStats, Result, Sandbox};
use kpx_rules::promise::{Promise, promises_problem};

/// Fuel for one `schedule` call, before the share per endpoint.
const SCHEDULE_FUEL_BASE: u64 = 100_000_000;
const SCHEDULE_FUEL_PER_ENDPOINT: u64 = 200_000;
/// The most a `schedule` call may hand the host (a plan is at most a few
/// thousand numbers).
const SCHEDULE_MAX_OUTPUT: u64 = 16 << 20;
/// Fuel for one `pick` (a connection's choice: a few comparisons per
/// candidate; a hashing scheduler's first pick builds its table, as a
/// `schedule` would).
const PICK_FUEL_BASE: u64 = 10_000_000;
const PICK_FUEL_PER_ENDPOINT: u64 = 200_000;
/// A pick hands back one number.
const PICK_MAX_OUTPUT: u64 = 64 << 10;
/// Fuel for `names`, `uses-load` and `promises`: each a short list.
const QUESTION_FUEL: u64 = SCHEDULE_FUEL_BASE;
/// A `promises` answer is a few bytes per promise: 64 KiB is far past
/// any honest list, and bounds what a hostile one makes the host copy.
const PROMISES_MAX_OUTPUT: u64 = 64 << 10;
/// What kpx requires of `names()` to load a scheduler: 1 to 64 names of
/// 1 to 64 bytes.
pub fn load_problem(names: &[String]) -> Option<String> {
    (names.is_empty() || names.len() > 64 || names.iter().any(|n| n.is_empty() || n.len() > 64))
        .then(|| format!("names() must give 1 to 64 names of 1 to 64 bytes (gave {})", names.len()))
}

/// The contract versions that have a scheduler world, newest first.
pub const VERSIONS: [&str; 2] = [v0_4_0::VERSION, v0_2_0::VERSION];

/// A linked scheduler component of a known contract version.
pub(super) enum SchedulerPre {
    V0_2_0(v0_2_0::SchedulerPre),
    V0_4_0(v4::SchedulerPre),
}

impl SchedulerPre {
    /// The typed pre-instance for a component built for `version`.
    pub(super) fn new(version: &str, pre: InstancePre<PluginState>) -> wasmtime::Result<SchedulerPre> {
        match version {
            v0_2_0::VERSION => Ok(SchedulerPre::V0_2_0(v0_2_0::SchedulerPre::new(pre)?)),
            v0_4_0::VERSION => Ok(SchedulerPre::V0_4_0(v4::SchedulerPre::new(pre)?)),
            other => Err(wasmtime::format_err!("kpx:proxier {other} has no scheduler world")),
        }
    }

    /// The contract version the component was built for.
    fn version(&self) -> &'static str {
        match self {
            SchedulerPre::V0_2_0(_) => v0_2_0::VERSION,
            SchedulerPre::V0_4_0(_) => v0_4_0::VERSION,
        }
    }

    fn instantiate(&self, store: &mut Store<PluginState>) -> wasmtime::Result<Bindings> {
        match self {
            SchedulerPre::V0_2_0(pre) => pre.instantiate(store).map(Bindings::V0_2_0),
            SchedulerPre::V0_4_0(pre) => pre.instantiate(store).map(Bindings::V0_4_0),
        }
    }
}

/// A live instance's bindings, of its contract version.
#[derive(Clone)]
enum Bindings {
    V0_2_0(v0_2_0::SchedulerInstance),
    V0_4_0(v4::SchedulerInstance),
}

impl Bindings {
    fn names(&self, store: &mut Store<PluginState>) -> wasmtime::Result<Vec<String>> {
        match self {
            Bindings::V0_2_0(b) => b.names(store),
            Bindings::V0_4_0(b) => b.names(store),
        }
    }

    /// 0.2.0 states no promises: it is taken to promise `spread`, as
    /// every scheduler was checked for before promises existed.
    fn promises(&self, store: &mut Store<PluginState>, name: &str) -> wasmtime::Result<Vec<Promise>> {
        match self {
            Bindings::V0_2_0(_) => Ok(vec![Promise::Spread]),
            Bindings::V0_4_0(b) => b.promises(store, name),
        }
    }

    fn uses_load(&self, store: &mut Store<PluginState>, name: &str) -> wasmtime::Result<bool> {
        match self {
            Bindings::V0_2_0(b) => b.uses_load(store, name),
            Bindings::V0_4_0(b) => b.uses_load(store, name),
        }
    }

    fn schedule(&self, store: &mut Store<PluginState>, r: &ScheduleRequest) -> wasmtime::Result<Result<Plan, String>> {
        match self {
            Bindings::V0_2_0(b) => b.schedule(store, r),
            Bindings::V0_4_0(b) => b.schedule(store, r),
        }
    }

    fn prepare_picks(
        &self,
        store: &mut Store<PluginState>,
        id: u32,
        s: &PickSetup,
    ) -> wasmtime::Result<Result<(), String>> {
        match self {
            Bindings::V0_2_0(b) => b.prepare_picks(store, id, s),
            Bindings::V0_4_0(b) => b.prepare_picks(store, id, s),
        }
    }

    fn forget_picks(&self, store: &mut Store<PluginState>, id: u32) -> wasmtime::Result<()> {
        match self {
            Bindings::V0_2_0(b) => b.forget_picks(store, id),
            Bindings::V0_4_0(b) => b.forget_picks(store, id),
        }
    }

    fn pick(
        &self,
        store: &mut Store<PluginState>,
        id: u32,
        r: &PickRequest,
    ) -> wasmtime::Result<Result<Option<u32>, String>> {
        match self {
            Bindings::V0_2_0(b) => b.pick(store, id, r),
            Bindings::V0_4_0(b) => b.pick(store, id, r),
        }
    }
}

/// A loaded scheduler component, ready to instantiate.
pub struct SchedulerPlugin {
    pub(super) base: PluginBase,
    pub(super) pre: SchedulerPre,
}

impl SchedulerPlugin {
    pub fn name(&self) -> &str {
        self.base.name()
    }

    pub fn stats(&self) -> &PluginStats {
        self.base.stats()
    }

    /// The kpx:proxier version the component was built for ("0.4.0" or
    /// "0.2.0").
    pub fn version(&self) -> &'static str {
        self.pre.version()
    }

    /// A fresh instance, with the names it answers to.
    pub fn instantiate(&self) -> Result<SchedulerInstance> {
        let mut sandbox = self.base.sandbox();
        let made = self.pre.instantiate(&mut sandbox.store);
        let bindings = self.base.instantiated(&mut sandbox, made)?;
        let mut instance = SchedulerInstance { sandbox, bindings, names: Vec::new(), version: self.version() };
        let max_output = SCHEDULE_MAX_OUTPUT.min(self.base.limits().max_output_bytes);
        instance.sandbox.refuel_with(QUESTION_FUEL, max_output);
        let names = instance.bindings.names(&mut instance.sandbox.store);
        instance.names = instance.sandbox.check("names", names)?;
        Ok(instance)
    }
}

/// One live scheduler instance.
pub struct SchedulerInstance {
    sandbox: Sandbox,
    bindings: Bindings,
    names: Vec<String>,
    version: &'static str,
}

impl SchedulerInstance {
    /// The scheduler names this component implements.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn plugin(&self) -> &str {
        &self.sandbox.plugin
    }

    /// The kpx:proxier version the component was built for.
    pub fn version(&self) -> &'static str {
        self.version
    }

    /// Whether `name` plans from live load.
    pub fn uses_load(&mut self, name: &str) -> Result<bool> {
        let s = &mut self.sandbox;
        s.refuel_with(QUESTION_FUEL, SCHEDULE_MAX_OUTPUT.min(s.limits.max_output_bytes));
        let result = self.bindings.uses_load(&mut s.store, name);
        s.check("uses-load", result)
    }

    /// What `name` promises (`[spread]` for a 0.2.0 component, which
    /// states none). A list of more than `MAX_PROMISES` (promise.rs), or
    /// naming one twice, is refused as the component's failure.
    pub fn promises(&mut self, name: &str) -> Result<Vec<Promise>> {
        let s = &mut self.sandbox;
        s.refuel_with(QUESTION_FUEL, PROMISES_MAX_OUTPUT.min(s.limits.max_output_bytes));
        let result = self.bindings.promises(&mut s.store, name);
        let promises = s.check("promises", result)?;
        match promises_problem(&promises) {
            Some(problem) => Err(s.failed("promises", &problem)),
            None => Ok(promises),
        }
    }

    /// Sets up the picks under `id` (a side of a service port, as its
    /// candidates are now); `Error::Failed` carries the scheduler's reason.
    pub fn prepare_picks(&mut self, id: u32, setup: &PickSetup) -> Result<()> {
        let s = &mut self.sandbox;
        let fuel = PICK_FUEL_BASE.saturating_add(PICK_FUEL_PER_ENDPOINT * setup.endpoints.len() as u64);
        s.refuel_with(fuel.min(s.limits.fuel_base), PICK_MAX_OUTPUT.min(s.limits.max_output_bytes));
        let result = self.bindings.prepare_picks(&mut s.store, id, setup);
        s.check("prepare-picks", result)?.map_err(|message| s.failed("prepare-picks", &message))
    }

    /// The id's service port left.
    pub fn forget_picks(&mut self, id: u32) -> Result<()> {
        let s = &mut self.sandbox;
        s.refuel_with(PICK_FUEL_BASE.min(s.limits.fuel_base), PICK_MAX_OUTPUT.min(s.limits.max_output_bytes));
        let result = self.bindings.forget_picks(&mut s.store, id);
        s.check("forget-picks", result)
    }

    /// The candidate for one new connection under a prepared `id` (None:
    /// no candidate may take it); `Error::Failed` carries the scheduler's
    /// own reason, and a pick outside the candidates, or among those that
    /// failed, is refused.
    pub fn pick(&mut self, id: u32, request: &PickRequest) -> Result<Option<u32>> {
        let s = &mut self.sandbox;
        let n = request.active.len();
        let fuel = PICK_FUEL_BASE.saturating_add(PICK_FUEL_PER_ENDPOINT * n as u64);
        s.refuel_with(fuel.min(s.limits.fuel_base), PICK_MAX_OUTPUT.min(s.limits.max_output_bytes));
        let result = self.bindings.pick(&mut s.store, id, request);
        let picked = s.check("pick", result)?.map_err(|message| s.failed("pick", &message))?;
        match picked {
            Some(i) if i as usize >= n || request.failed.contains(&i) => {
                s.stats.failures.fetch_add(1, Ordering::Relaxed);
                Err(crate::runtime::Error::BadPick {
                    plugin: s.plugin.to_string(),
                    message: format!("picked candidate {i} of {n} (failed ones: {:?})", request.failed),
                })
            }
            other => Ok(other),
        }
    }

    /// A plan for one service port's candidates; `Error::Failed` carries
    /// the scheduler's own reason.
    pub fn schedule(&mut self, request: &ScheduleRequest) -> Result<Plan> {
        let s = &mut self.sandbox;
        // A plan is a little arithmetic per candidate (maglev fills a
        // table of up to 1021 slots): far less fuel than a render.
        let fuel = SCHEDULE_FUEL_BASE.saturating_add(SCHEDULE_FUEL_PER_ENDPOINT * request.port.endpoints.len() as u64);
        s.refuel_with(fuel.min(s.limits.fuel_base), SCHEDULE_MAX_OUTPUT.min(s.limits.max_output_bytes));
        let result = self.bindings.schedule(&mut s.store, request);
        s.check("schedule", result)?.map_err(|message| s.failed("schedule", &message))
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::runtime::{Limits, Runtime, builtin};

    fn instance() -> SchedulerInstance {
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let plugin = runtime.load_scheduler("schedulers", builtin::get("schedulers").unwrap()).unwrap();
        plugin.instantiate().unwrap()
    }

    fn ask(i: &mut SchedulerInstance, name: &str, active: &[u32], failed: &[u32]) -> Option<u32> {
        // One id per scheduler and candidate count, set up as the host does.
        let id = (name.len() * 100 + active.len()) as u32;
        pick(i, id, name, active, failed).unwrap()
    }

    /// A pick under `id` set up for `name` over `active.len()` endpoints
    /// (10.244.k.5:8080), as the host sets it up and asks.
    fn pick(i: &mut SchedulerInstance, id: u32, name: &str, active: &[u32], failed: &[u32]) -> Result<Option<u32>> {
        let endpoints: Vec<(IpAddr, u16)> =
            (1..=active.len()).map(|k| (format!("10.244.{k}.5").parse().unwrap(), 8080)).collect();
        let weights = vec![1; active.len()];
        let setup = PickSetup {
            name,
            parameters: &[],
            service: "ns/web:http",
            destination: "10.96.0.10".parse().unwrap(),
            endpoints: &endpoints,
            weights: &weights,
        };
        i.prepare_picks(id, &setup).unwrap();
        let request = PickRequest { client: "192.0.2.7".parse().unwrap(), active, failed, random: 12345 };
        i.pick(id, &request)
    }

    /// A 0.4.0 component states each name's promises; a 0.2.0 one (the
    /// hot-reload test's version 1, exported with `export_scheduler_v0_2!`)
    /// states none, is taken to promise spread, and picks as before.
    #[test]
    fn promises_are_asked_of_0_4_0_and_spread_for_0_2_0() {
        let mut i = instance();
        assert_eq!(i.version(), "0.4.0");
        assert_eq!(i.promises("rr").unwrap(), [Promise::Spread]);
        let maglev = [Promise::Spread, Promise::Weighted, Promise::Sticky, Promise::MinimalDisruption];
        assert_eq!(i.promises("maglev").unwrap(), maglev);
        assert!(i.promises("lblc").unwrap().is_empty(), "lblc states no promise");
        let bytes = std::fs::read(format!("{}/kpx_plugin_hot_v1.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let plugin = runtime.load_scheduler("hot-v1", &bytes).unwrap();
        assert_eq!(plugin.version(), "0.2.0");
        let mut old = plugin.instantiate().unwrap();
        assert_eq!((old.version(), old.names()), ("0.2.0", &["hot".to_string()][..]));
        assert_eq!(old.promises("hot").unwrap(), [Promise::Spread]);
        assert_eq!(ask(&mut old, "hot", &[0, 0], &[]), Some(0));
    }

    /// What a pick of the WASI probe's scheduler `name` ends in, in a fresh
    /// instance (the probe answers through its error, or traps).
    fn probe(runtime: &Runtime, name: &str) -> crate::runtime::Error {
        let bytes = std::fs::read(format!("{}/kpx_plugin_wasi_probe.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
        let plugin = runtime.load_scheduler("wasi-probe", &bytes).unwrap();
        let mut i = plugin.instantiate().unwrap();
        assert!(i.names().iter().any(|n| n == name), "{:?}", i.names());
        pick(&mut i, 1, name, &[0], &[]).unwrap_err()
    }

    /// A component importing WASI 0.2 (as wasm32-wasip2 toolchains build
    /// them) loads, and gets nothing from outside: no environment, no
    /// directories, random numbers that are the same in every instance,
    /// and a trap naming the call for clocks, sockets, stdout and exit.
    #[test]
    fn a_wasi_component_gets_deny_all_wasi() {
        let bytes = std::fs::read(format!("{}/kpx_plugin_wasi_probe.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let component = wasmtime::component::Component::new(&runtime.engine, &bytes).unwrap();
        assert!(crate::runtime::wasi::imports_wasi(&runtime.engine, &component));
        let own = wasmtime::component::Component::new(&runtime.engine, builtin::get("schedulers").unwrap()).unwrap();
        assert!(!crate::runtime::wasi::imports_wasi(&runtime.engine, &own));

        let seen = probe(&runtime, "probe");
        assert!(matches!(seen, crate::runtime::Error::Failed { .. }), "{seen}");
        let seen = seen.to_string();
        eprintln!("deny-all WASI, as the probe saw it: {seen}");
        assert!(seen.contains("env=0 args=0 cwd=None dirs=0 bytes="), "{seen}");
        assert!(!seen.contains("bytes=[00, 00, 00, 00, 00, 00, 00, 00]"), "{seen}");
        assert_eq!(seen, probe(&runtime, "probe").to_string(), "a fresh instance draws the same numbers");
        let other = Runtime::new(Limits::default(), None).unwrap();
        assert_ne!(seen, probe(&other, "probe").to_string(), "another process draws other numbers");
        for (name, call) in [
            ("clock", "wasi:clocks/monotonic-clock@0.2"),
            ("wall-clock", "wasi:clocks/wall-clock@0.2"),
            ("socket", "wasi:sockets/instance-network@0.2"),
            ("stdout", "wasi:cli/stdout@0.2"),
            ("exit", "wasi:cli/exit@0.2"),
            ("big-random", "at most 4096 per call"),
        ] {
            let err = probe(&runtime, name);
            assert!(err.needs_fresh_instance(), "{name}: {err}");
            let err = err.to_string();
            eprintln!("{name}: {err}");
            assert!(err.contains(call), "{name}: {err}");
        }
        // Host work for WASI answers is paid from the call's fuel.
        let t = std::time::Instant::now();
        let err = probe(&runtime, "random-loop");
        assert!(err.needs_fresh_instance() && err.to_string().contains("fuel"), "{err}");
        eprintln!("random-loop stopped after {:?}", t.elapsed());
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{:?}", t.elapsed());
    }

    /// The built-in component's per-connection picks (userspace mode):
    /// rr keeps its turn between calls, lc reads the exact counts, failed
    /// candidates are skipped; the cost per pick is printed.
    #[test]
    fn the_built_in_component_picks_per_connection() {
        let mut i = instance();
        let rr: Vec<Option<u32>> = (0..4).map(|_| ask(&mut i, "rr", &[0, 0, 0], &[])).collect();
        assert_eq!(rr, [Some(0), Some(1), Some(2), Some(0)]);
        assert_eq!(ask(&mut i, "rr", &[0, 0, 0], &[1]), Some(2), "1 failed this connection");
        assert_eq!(ask(&mut i, "lc", &[5, 2, 9], &[]), Some(1));
        assert_eq!(ask(&mut i, "lc", &[5, 2, 9], &[1]), Some(0));
        assert_eq!(ask(&mut i, "lc", &[0, 0], &[0, 1]), None);
        let err = pick(&mut i, 9, "nope", &[0], &[]).unwrap_err().to_string();
        let never = PickRequest { client: "192.0.2.7".parse().unwrap(), active: &[0], failed: &[], random: 0 };
        assert!(i.pick(77, &never).unwrap_err().to_string().contains("never set up"));
        assert!(err.contains("nope"), "{err}");
        let n = 2000;
        let t = std::time::Instant::now();
        for _ in 0..n {
            ask(&mut i, "lc", &[3, 1, 2, 4], &[]);
        }
        let per = t.elapsed().as_secs_f64() * 1e6 / f64::from(n);
        eprintln!("pick through the component (lc, 4 candidates, this build): {per:.2} µs");
    }
}
