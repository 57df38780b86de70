//! Scheduler components: loaded, sandboxed and called like backends
//! (same engine, limits, fuel and log budget), one Store per instance.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kpx_rules::plan::Plan;
use wasmtime::Engine;

use super::wit::since_v0_2_0::{self as v0_2_0, ScheduleRequest};
use super::{Limits, PluginStats, Result, Sandbox};

/// Fuel for one `schedule` call, before the share per endpoint.
const SCHEDULE_FUEL_BASE: u64 = 100_000_000;
const SCHEDULE_FUEL_PER_ENDPOINT: u64 = 200_000;
/// The most a `schedule` call may hand the host (a plan is at most a few
/// thousand numbers).
const SCHEDULE_MAX_OUTPUT: u64 = 16 << 20;

/// A loaded scheduler component, ready to instantiate.
pub struct SchedulerPlugin {
    pub(super) name: Arc<str>,
    pub(super) engine: Engine,
    pub(super) pre: v0_2_0::SchedulerPre,
    pub(super) limits: Limits,
    pub(super) stats: Arc<PluginStats>,
}

impl SchedulerPlugin {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn stats(&self) -> &PluginStats {
        &self.stats
    }

    /// A fresh instance, with the names it answers to.
    pub fn instantiate(&self) -> Result<SchedulerInstance> {
        let mut sandbox = Sandbox::new(&self.engine, &self.name, self.limits, &self.stats);
        sandbox.refuel(0);
        let bindings = self.pre.instantiate(&mut sandbox.store);
        let bindings = sandbox.check("instantiate", bindings)?;
        self.stats.instances.fetch_add(1, Ordering::Relaxed);
        let mut instance = SchedulerInstance { sandbox, bindings, names: Vec::new() };
        instance.sandbox.refuel_with(SCHEDULE_FUEL_BASE, SCHEDULE_MAX_OUTPUT.min(self.limits.max_output_bytes));
        let names = instance.bindings.names(&mut instance.sandbox.store);
        instance.names = instance.sandbox.check("names", names)?;
        Ok(instance)
    }
}

/// One live scheduler instance.
pub struct SchedulerInstance {
    sandbox: Sandbox,
    bindings: v0_2_0::SchedulerInstance,
    names: Vec<String>,
}

impl SchedulerInstance {
    /// The scheduler names this component implements.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn plugin(&self) -> &str {
        &self.sandbox.plugin
    }

    /// Whether `name` plans from live load.
    pub fn uses_load(&mut self, name: &str) -> Result<bool> {
        let s = &mut self.sandbox;
        s.refuel_with(SCHEDULE_FUEL_BASE, SCHEDULE_MAX_OUTPUT.min(s.limits.max_output_bytes));
        let result = self.bindings.uses_load(&mut s.store, name);
        s.check("uses-load", result)
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
