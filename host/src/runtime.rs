//! The plugin runtime: one wasmtime [`Engine`], components compiled once
//! (cached on disk), an `InstancePre` per component and a `Store` per
//! instance with a memory limit, a fuel budget per call and an output cap.
//! kpx's own components import nothing but `kpx:proxier/log`; components
//! built for wasm32-wasip2 by other toolchains get a deny-all WASI
//! ([`wasi`]) on a copy of the linker, and nothing else.
//!
//! A trap (including running out of fuel or memory) poisons a Store, so
//! the caller drops the [`BackendInstance`] and builds a fresh one, to
//! which it replays the full state.

mod cache;
pub mod extension;
mod kind;
pub mod load;
pub mod scheduler;
mod version;
pub mod wasi;
pub mod wit;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kpx_rules::model::{Change, Cluster, Node, ServicePort, Settings};
use kpx_rules::ops::Ruleset;
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store, StoreLimits, StoreLimitsBuilder, Trap};

pub use extension::{ExtensionInstance, ExtensionPlugin};
pub use kind::Kind;
pub use kpx_rules::promise::Promise;
pub use scheduler::{SchedulerInstance, SchedulerPlugin};

/// The built-in scheduler component's name (its schedulers are the
/// defaults a Service that names none gets).
pub const BUILT_IN_SCHEDULERS: &str = "schedulers";
pub use version::{SUPPORTED, read_contract_version};
pub use wit::since_v0_2_0::{PickRequest, PickSetup, ScheduleRequest};

/// Built-in plugin components, embedded at build time.
pub mod builtin {
    include!(concat!(env!("OUT_DIR"), "/builtin_plugins.rs"));

    /// The component of a built-in plugin.
    pub fn get(name: &str) -> Option<&'static [u8]> {
        BUILT_IN.iter().find(|(n, _)| *n == name).map(|(_, bytes)| *bytes)
    }
}

/// Resource bounds of every plugin instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Linear memory an instance may grow to.
    pub memory_bytes: u64,
    /// Fuel for one call, before the share for the state's size.
    pub fuel_base: u64,
    /// Extra fuel per service port and endpoint in the call's state.
    pub fuel_per_object: u64,
    /// Most bytes the host allocates for one call's output (a ruleset, a
    /// log line): enforced while the output is copied out of the plugin,
    /// before anything larger is allocated.
    pub max_output_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 1 << 30,
            fuel_base: 2_000_000_000,
            fuel_per_object: 200_000,
            max_output_bytes: 256 << 20,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The component carries no `kpx:proxier-version` section; not loaded.
    #[error("plugin {plugin}: no kpx:proxier version marker (build it with kpx-sdk's export macro)")]
    MissingVersion { plugin: String },
    /// Built against a contract this host does not support; not loaded.
    #[error("plugin {plugin}: built for kpx:proxier {found}, this kpx supports {}{}", SUPPORTED.join(", "), version::why_not(found))]
    IncompatibleVersion { plugin: String, found: String },
    /// Not a valid component, or it imports something kpx does not offer; not loaded.
    #[error("plugin {plugin}: cannot load: {message}")]
    Load { plugin: String, message: String },
    /// A component of another kind than the one asked for (a scheduler
    /// loaded as an extension), read from its exports; not loaded.
    #[error("plugin {plugin} is {} component, not {} component", found.with_article(), expected.with_article())]
    WrongKind { plugin: String, found: Kind, expected: Kind },
    /// The plugin trapped (or ran out of fuel or memory): drop the instance,
    /// build a fresh one and replay the full state.
    #[error("plugin {plugin}: {call} trapped: {message}")]
    Trapped { plugin: String, call: &'static str, message: String },
    /// The plugin returned an error: keep the instance, render in full next time.
    #[error("plugin {plugin}: {call} failed: {message}")]
    Failed { plugin: String, call: &'static str, message: String },
    /// An extension refused the operator's parameters when it was loaded
    /// (`check-parameters`): kpx stops at start with the reason; a
    /// replaced file that refuses them is refused.
    #[error("plugin {plugin} refuses its parameters: {message}")]
    ParametersRefused { plugin: String, message: String },
    /// A scheduler picked what the host refuses (outside the candidates,
    /// or one that failed the connection): a fault, not its own refusal.
    #[error("plugin {plugin}: pick refused: {message}")]
    BadPick { plugin: String, message: String },
    /// The output is larger than allowed (found while copying it out, so
    /// nothing larger was allocated): the instance is left mid-call, so it
    /// is dropped, a fresh one built and the full state replayed.
    #[error("plugin {plugin}: {call} returned more than the limit of {limit} bytes")]
    OutputTooLarge { plugin: String, call: &'static str, limit: u64 },
}

impl Error {
    /// True when the instance is poisoned and must be replaced.
    pub fn needs_fresh_instance(&self) -> bool {
        matches!(self, Error::Trapped { .. } | Error::OutputTooLarge { .. })
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors per plugin, for logs and metrics.
#[derive(Debug, Default)]
pub struct PluginStats {
    pub traps: AtomicU64,
    pub failures: AtomicU64,
    pub instances: AtomicU64,
    /// Calls into the plugin (instantiate, reset, apply, render), whatever their outcome.
    pub calls: AtomicU64,
    /// Fuel those calls used.
    pub fuel: AtomicU64,
}

/// What a Store holds for its instance.
pub struct PluginState {
    plugin: Arc<str>,
    limits: StoreLimits,
    /// Log lines the plugin may still write during the current call.
    log_budget: u32,
    /// Whether the current call already said that it drops log lines.
    log_dropping: bool,
    /// The deny-all WASI's random numbers (seeded alike in every instance).
    random: u64,
}

/// Log lines a plugin may write per call; the rest are dropped.
const LOG_LINES_PER_CALL: u32 = 200;

impl PluginState {
    /// Whether one more log line may be written in this call.
    fn take_log_budget(&mut self) -> bool {
        if self.log_budget > 0 {
            self.log_budget -= 1;
            return true;
        }
        if !self.log_dropping {
            self.log_dropping = true;
            tracing::warn!(plugin = %self.plugin, "plugin logs too much; dropping its log lines until the next call");
        }
        false
    }

    fn next_random(&mut self) -> u64 {
        wasi::splitmix64(&mut self.random)
    }

    /// A new call: the budget is full again.
    fn refill_log_budget(&mut self) {
        self.log_budget = LOG_LINES_PER_CALL;
        self.log_dropping = false;
    }
}

/// Longest log line kept from a plugin; the rest is cut.
const MAX_LOG_LINE: usize = 4096;

/// A plugin's log message as the host logs it.
pub(crate) fn log_line(message: &str) -> String {
    one_line(message, MAX_LOG_LINE)
}

/// Text from a plugin, fit for kpx's log: cut to about `max` bytes (`...`
/// marks a cut), control characters escaped, so that a plugin cannot start
/// a line of its own.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 3);
    for c in text.chars() {
        if out.len() >= max {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The engine and linker every plugin shares.
pub struct Runtime {
    engine: Engine,
    linker: Linker<PluginState>,
    limits: Limits,
    cache_dir: Option<PathBuf>,
    /// The deny-all WASI's random seed: drawn once per process, the same
    /// for every instance (replays render alike; another process, another
    /// seed, so hashing plugins' tables cannot be flooded by names chosen
    /// in advance).
    wasi_seed: u64,
}

impl Runtime {
    /// `cache_dir`: where compiled components are kept (None: compile in memory).
    pub fn new(limits: Limits, cache_dir: Option<PathBuf>) -> Result<Runtime> {
        let mut config = Config::new();
        config.consume_fuel(true);
        config.concurrency_support(false);
        let engine =
            Engine::new(&config).map_err(|e| Error::Load { plugin: "(engine)".into(), message: e.to_string() })?;
        let mut linker = Linker::new(&engine);
        wit::add_to_linker(&mut linker)
            .map_err(|e| Error::Load { plugin: "(linker)".into(), message: e.to_string() })?;
        let wasi_seed = {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new().hash_one(wasi::RANDOM_SEED)
        };
        Ok(Runtime { engine, linker, limits, cache_dir, wasi_seed })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Checks the contract version, compiles (or loads from cache) and
    /// links a component of the `expected` kind: its version and its
    /// pre-instance. One that exports another kind's interface is refused
    /// as such ([`Error::WrongKind`]).
    fn link(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Kind,
    ) -> Result<(String, wasmtime::component::InstancePre<PluginState>)> {
        let load_err = |message: String| Error::Load { plugin: name.to_string(), message };
        let found = read_contract_version(bytes).map_err(load_err)?;
        let found = found.ok_or_else(|| Error::MissingVersion { plugin: name.to_string() })?;
        if !SUPPORTED.contains(&found.as_str()) {
            return Err(Error::IncompatibleVersion { plugin: name.to_string(), found });
        }
        let component = match &self.cache_dir {
            Some(dir) => cache::load_or_compile(&self.engine, dir, name, bytes),
            None => Component::new(&self.engine, bytes),
        }
        .map_err(|e| load_err(format!("{e:#}")))?;
        let ty = component.component_type();
        if let Err(kind) = Kind::check(expected, ty.exports(&self.engine).map(|(export, _)| export)) {
            return Err(Error::WrongKind { plugin: name.to_string(), found: kind, expected });
        }
        let pre = if wasi::imports_wasi(&self.engine, &component) {
            tracing::info!(plugin = name, "the component imports WASI: it gets kpx's deny-all WASI");
            let mut linker = self.linker.clone();
            wasi::deny_all(&mut linker, &self.engine, &component).map_err(|e| load_err(format!("{e:#}")))?;
            linker.instantiate_pre(&component)
        } else {
            self.linker.instantiate_pre(&component)
        };
        let pre = pre.map_err(|e| load_err(format!("{e:#}")))?;
        Ok((found, pre))
    }

    /// What a component loaded as `name` keeps besides its pre-instance.
    fn base(&self, name: &str) -> PluginBase {
        PluginBase {
            name: Arc::from(name),
            engine: self.engine.clone(),
            limits: self.limits,
            stats: Arc::new(PluginStats::default()),
            wasi_seed: self.wasi_seed,
        }
    }

    /// Loads a scheduler component (the `scheduler-plugin` world of
    /// 0.4.0, or of 0.2.0), bound by the version it declares.
    pub fn load_scheduler(&self, name: &str, bytes: &[u8]) -> Result<SchedulerPlugin> {
        let (found, linked) = self.link(name, bytes, Kind::Scheduler)?;
        let load_err = |message: String| Error::Load { plugin: name.to_string(), message };
        if !scheduler::VERSIONS.contains(&found.as_str()) {
            return Err(load_err(format!(
                "not a scheduler component: it is built for kpx:proxier {found}, whose only world is the backend's \
                 (schedulers are built for {})",
                scheduler::VERSIONS.join(" or ")
            )));
        }
        let pre = scheduler::SchedulerPre::new(&found, linked).map_err(|e| {
            load_err(format!(
                "not a scheduler component (the scheduler-plugin world exports kpx:proxier/scheduler@{found}): {e:#}"
            ))
        })?;
        Ok(SchedulerPlugin { base: self.base(name), pre })
    }

    /// Loads an extension component (the `extension-plugin` world of
    /// 0.2.0 or 0.4.0, as the component declares).
    pub fn load_extension(&self, name: &str, bytes: &[u8]) -> Result<ExtensionPlugin> {
        let (found, linked) = self.link(name, bytes, Kind::Extension)?;
        let pre = extension::ExtensionPre::new(&found, linked)
            .map_err(|message| Error::Load { plugin: name.to_string(), message })?;
        Ok(ExtensionPlugin { base: self.base(name), pre })
    }

    /// Checks the contract version, compiles (or loads from cache) and
    /// links a backend component.
    pub fn load_backend(&self, name: &str, bytes: &[u8]) -> Result<BackendPlugin> {
        let (found, pre) = self.link(name, bytes, Kind::Backend)?;
        let load_err = |message: String| Error::Load { plugin: name.to_string(), message };
        let pre = wit::BackendPre::new(&found, pre).map_err(|e| load_err(format!("{e:#}")))?;
        Ok(BackendPlugin { base: self.base(name), pre })
    }
}

/// What every loaded component keeps besides its typed pre-instance, and
/// the Store its instances start in.
pub(crate) struct PluginBase {
    name: Arc<str>,
    engine: Engine,
    limits: Limits,
    stats: Arc<PluginStats>,
    wasi_seed: u64,
}

impl PluginBase {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    pub(crate) fn stats(&self) -> &PluginStats {
        &self.stats
    }

    /// A fresh Store, fuelled for instantiation.
    fn sandbox(&self) -> Sandbox {
        let mut sandbox = Sandbox::new(&self.engine, &self.name, self.limits, &self.stats, self.wasi_seed);
        sandbox.refuel(0);
        sandbox
    }

    /// Checks an instantiation made in `sandbox` and counts it.
    fn instantiated<T>(&self, sandbox: &mut Sandbox, made: wasmtime::Result<T>) -> Result<T> {
        let made = sandbox.check("instantiate", made)?;
        self.stats.instances.fetch_add(1, Ordering::Relaxed);
        Ok(made)
    }
}

/// A loaded backend component, ready to instantiate.
pub struct BackendPlugin {
    base: PluginBase,
    pre: wit::BackendPre,
}

impl BackendPlugin {
    pub fn name(&self) -> &str {
        self.base.name()
    }

    pub fn stats(&self) -> &PluginStats {
        self.base.stats()
    }

    /// A fresh instance holding a new proxier for `settings`.
    pub fn instantiate(&self, settings: &Settings) -> Result<BackendInstance> {
        let mut sandbox = self.base.sandbox();
        let made = self.pre.instantiate(&mut sandbox.store, settings);
        let bindings = self.base.instantiated(&mut sandbox, made)?;
        Ok(BackendInstance { sandbox, bindings })
    }
}

/// A Store with its limits, fuel and log budget, and the bookkeeping
/// of the calls made into it.
struct Sandbox {
    plugin: Arc<str>,
    store: Store<PluginState>,
    limits: Limits,
    stats: Arc<PluginStats>,
    /// The fuel the current call started with.
    fueled: u64,
}

impl Sandbox {
    fn new(engine: &Engine, plugin: &Arc<str>, limits: Limits, stats: &Arc<PluginStats>, wasi_seed: u64) -> Sandbox {
        let store_limits = StoreLimitsBuilder::new()
            .memory_size(usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX))
            .instances(4)
            .tables(8)
            .memories(2)
            .trap_on_grow_failure(true)
            .build();
        let mut store = Store::new(
            engine,
            PluginState {
                plugin: plugin.clone(),
                limits: store_limits,
                log_budget: LOG_LINES_PER_CALL,
                log_dropping: false,
                random: wasi_seed,
            },
        );
        store.limiter(|s| &mut s.limits);
        Sandbox { plugin: plugin.clone(), store, limits, stats: stats.clone(), fueled: 0 }
    }

    fn fuel_left(&self) -> u64 {
        self.store.get_fuel().unwrap_or(0)
    }

    fn refuel(&mut self, objects: usize) {
        let fuel = self.limits.fuel_base.saturating_add(self.limits.fuel_per_object.saturating_mul(objects as u64));
        self.refuel_with(fuel, self.limits.max_output_bytes);
    }

    /// Fuels a reset for the whole state `services`, returned as the
    /// borrowed list the bindings take (the state is not copied).
    fn refuel_for_reset<'a>(&mut self, services: impl IntoIterator<Item = &'a ServicePort>) -> Vec<&'a ServicePort> {
        let services: Vec<&ServicePort> = services.into_iter().collect();
        self.refuel(objects(services.iter().copied()));
        services
    }

    /// Sets the next call's fuel and the most it may hand the host.
    fn refuel_with(&mut self, fuel: u64, max_output_bytes: u64) {
        // Fuel is enabled on the engine, so this cannot fail.
        let _ = self.store.set_fuel(fuel);
        self.fueled = fuel;
        // What the host may allocate copying one call's data out of the
        // plugin (the result, a log line): checked before each copy.
        self.store.set_hostcall_fuel(usize::try_from(max_output_bytes).unwrap_or(usize::MAX));
        self.store.data_mut().refill_log_budget();
    }

    /// Classifies a call's outcome, counting it, its fuel and its errors.
    fn check<T>(&mut self, call: &'static str, result: wasmtime::Result<T>) -> Result<T> {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        self.stats.fuel.fetch_add(self.fueled.saturating_sub(self.fuel_left()), Ordering::Relaxed);
        result.map_err(|e| {
            if e.downcast_ref::<Trap>().is_none() && is_output_limit(&e) {
                // It ends the instance as a trap does, and counts as one
                // (kpx_plugin_traps_total) as well as a failure.
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                self.stats.traps.fetch_add(1, Ordering::Relaxed);
                let err = Error::OutputTooLarge {
                    plugin: self.plugin.to_string(),
                    call,
                    limit: self.limits.max_output_bytes,
                };
                tracing::error!(plugin = %self.plugin, "{err}");
                return err;
            }
            self.stats.traps.fetch_add(1, Ordering::Relaxed);
            // One line: the trap's own description, not the wasm backtrace.
            let message = match e.downcast_ref::<Trap>() {
                Some(Trap::OutOfFuel) => "ran out of fuel (endless loop or too much work)".to_string(),
                Some(trap) => trap.to_string(),
                None => e.root_cause().to_string().lines().next().unwrap_or("unknown error").to_string(),
            };
            let err = Error::Trapped { plugin: self.plugin.to_string(), call, message: log_line(&message) };
            tracing::error!(plugin = %self.plugin, "{err}");
            err
        })
    }

    /// A plugin's own error from a call that returns `result<_, string>`.
    fn failed(&self, call: &'static str, message: &str) -> Error {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        Error::Failed { plugin: self.plugin.to_string(), call, message: log_line(message) }
    }
}

/// One live backend instance with its proxier resource.
pub struct BackendInstance {
    sandbox: Sandbox,
    bindings: wit::Backend,
}

impl BackendInstance {
    /// Replaces the plugin's whole state. The ports are borrowed: the
    /// first sync's state is not copied on the host's side before it
    /// crosses.
    pub fn reset<'a>(
        &mut self,
        node: &Node,
        cluster: &Cluster,
        services: impl IntoIterator<Item = &'a ServicePort>,
    ) -> Result<()> {
        let s = &mut self.sandbox;
        let services = s.refuel_for_reset(services);
        let result = self.bindings.reset(&mut s.store, node, cluster, &services);
        s.check("reset", result)
    }

    /// Sends changes since the last call.
    pub fn apply(&mut self, changes: &[Change]) -> Result<()> {
        let s = &mut self.sandbox;
        s.refuel(changes_size(changes));
        let result = self.bindings.apply(&mut s.store, changes);
        s.check("apply", result)
    }

    /// Asks for the ruleset; `state_size` scales the fuel budget.
    pub fn render(&mut self, full: bool, state_size: usize) -> Result<Ruleset> {
        let s = &mut self.sandbox;
        s.refuel(state_size);
        let result = self.bindings.render(&mut s.store, full, s.limits.max_output_bytes);
        s.check("render", result)?.map_err(|message| s.failed("render", &message))
    }

    /// Fuel left after the last call (for tests and benchmarks).
    pub fn fuel_left(&self) -> u64 {
        self.sandbox.fuel_left()
    }
}

/// wasmtime's refusal to copy more than the store's hostcall fuel out of
/// a plugin (its error type is private; its message is the one place this
/// is read).
fn is_output_limit(e: &wasmtime::Error) -> bool {
    e.chain().any(|cause| cause.to_string().contains("too much data is being copied between the host and the guest"))
}

/// Service ports plus endpoints: the size that scales a call's fuel.
pub fn objects<'a>(services: impl IntoIterator<Item = &'a ServicePort>) -> usize {
    services.into_iter().map(ServicePort::size).sum()
}

/// The size of a batch of changes, as [`objects`] counts a state.
pub fn changes_size(changes: &[Change]) -> usize {
    changes
        .iter()
        .map(|c| match c {
            Change::Upsert(s) => s.size(),
            _ => 1,
        })
        .sum()
}

#[cfg(test)]
mod tests;
