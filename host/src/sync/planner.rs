//! Plans for service ports: the Service's scheduler (annotation), or the
//! mode's default when endpoints carry weights, asked of the scheduler
//! component that implements it. A Service whose scheduler is unknown or
//! refuses its parameters is logged and keeps the default (kube-proxy's
//! uniform random choice); one whose scheduler traps or returns a plan the
//! mode cannot execute is logged and keeps its last plan while that fits
//! its candidates.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kpx_rules::model::{IpFamily, ProxyMode, SchedulerChoice, ServicePort};
use kpx_rules::plan::Plan;

use crate::kernel::conntrack::table::Load;
use crate::runtime::{ScheduleRequest, SchedulerInstance, SchedulerPlugin};

/// How often schedulers that plan from live load (lc, wlc, sed, nq,
/// lblc, lblcr) are measured and planned again.
pub const LOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The scheduler used for weighted endpoints when a Service names none:
/// kube-proxy's random choice, with the weights.
pub const DEFAULT_WEIGHTED: &str = "random";

/// What one scheduler call gave.
enum Outcome {
    /// A plan (None: the default).
    Plan(Option<Plan>),
    /// A fault (trap, unexecutable plan): keep the last plan.
    Failed,
}

pub struct Planner {
    mode: ProxyMode,
    family: IpFamily,
    plugins: Vec<Arc<SchedulerPlugin>>,
    /// One instance per plugin (None until first needed, or after a trap).
    instances: Vec<Option<SchedulerInstance>>,
    /// Whether each scheduler name plans from load (asked once).
    uses_load: HashMap<String, bool>,
    /// The last conntrack measurement and when it was taken.
    load: Option<(Instant, Load)>,
    load_failed: bool,
    /// The last warning logged for each service port: the same one is not
    /// repeated at every plan (both endpoint sets, every sync, every
    /// re-plan), a new one is, and a plan that succeeds forgets it.
    warned: HashMap<String, String>,
    /// The port being planned uses the default scheduler (built-in only).
    built_in_only: bool,
    /// The last fault (a trap, a plan the mode cannot execute) since
    /// [`Planner::take_fault`]: what refuses a replacement component.
    fault: Option<String>,
}

impl Planner {
    pub fn new(mode: ProxyMode, family: IpFamily, plugins: Vec<Arc<SchedulerPlugin>>) -> Planner {
        let instances = plugins.iter().map(|_| None).collect();
        Planner {
            mode,
            family,
            plugins,
            instances,
            uses_load: HashMap::new(),
            load: None,
            load_failed: false,
            warned: HashMap::new(),
            built_in_only: false,
            fault: None,
        }
    }

    /// A planner whose `index`-th component is `plugin` (a replacement
    /// being tried): fresh instances, nothing cached.
    pub fn replaced(&self, index: usize, plugin: Arc<SchedulerPlugin>) -> Planner {
        let mut plugins = self.plugins.clone();
        plugins[index] = plugin;
        Planner::new(self.mode, self.family, plugins)
    }

    /// The `index`-th component.
    pub fn plugin(&self, index: usize) -> Option<&Arc<SchedulerPlugin>> {
        self.plugins.get(index)
    }

    /// The last fault since the previous call.
    pub fn take_fault(&mut self) -> Option<String> {
        self.fault.take()
    }

    /// Whether `port`'s scheduler plans from live load.
    pub fn uses_load(&mut self, port: &ServicePort) -> bool {
        // IPVS measures its own.
        if self.mode == ProxyMode::Ipvs {
            return false;
        }
        let Some(choice) = &port.scheduler else { return false };
        self.built_in_only = false;
        if let Some(&known) = self.uses_load.get(&choice.name) {
            return known;
        }
        let name = choice.name.clone();
        let answer = self.instance_for(&name).map(|i| i.uses_load(&name).unwrap_or(false)).unwrap_or(false);
        self.uses_load.insert(name, answer);
        answer
    }

    /// Measures the load again at the next plan that needs it.
    pub fn expire_load(&mut self) {
        self.load = None;
    }

    /// The conntrack table's counts, measured at most [`LOAD_INTERVAL`] ago.
    fn current_load(&mut self) -> Option<&Load> {
        let stale = self.load.as_ref().is_none_or(|(t, _)| t.elapsed() >= LOAD_INTERVAL);
        if stale {
            match Load::read(self.family) {
                Ok(load) => {
                    self.load = Some((Instant::now(), load));
                    self.load_failed = false;
                }
                Err(e) => {
                    if !self.load_failed {
                        tracing::warn!(family = %self.family, "cannot read the conntrack table for live load: {e}; planning as if idle");
                    }
                    self.load_failed = true;
                    // Tried again at the next interval, not at every plan.
                    self.load = Some((Instant::now(), Load::default()));
                }
            }
        }
        self.load.as_ref().map(|(_, l)| l)
    }

    /// Fills `port`'s plans. `previous` is the port as last planned: a
    /// scheduler that fails now (a trap, a bad plan) leaves its plan in
    /// place while it still fits the candidates, so a working slot table
    /// is not dropped for the default by a passing fault.
    pub fn plan(&mut self, port: &mut ServicePort, previous: Option<&ServicePort>) {
        port.cluster_plan = None;
        port.local_plan = None;
        let weighted = port.endpoints.iter().any(|e| e.weight != 1);
        // The Service's one copy (a pointer), not its parameters.
        let choice = match &port.scheduler {
            Some(c) => Arc::clone(c),
            None if weighted && self.mode != ProxyMode::Ipvs => {
                Arc::new(SchedulerChoice { name: DEFAULT_WEIGHTED.into(), parameters: Vec::new() })
            }
            None => return,
        };
        // The default comes from the built-in component, whatever others export.
        self.built_in_only = port.scheduler.is_none();
        let keep = |which: fn(&ServicePort) -> (&Vec<u32>, &Option<Plan>), port: &ServicePort| {
            previous.and_then(|p| {
                let (candidates, plan) = which(p);
                (candidates == which(port).0).then(|| plan.clone()).flatten()
            })
        };
        let cluster = match self.plan_for(port, &choice, &port.cluster_endpoints) {
            Outcome::Plan(p) => p,
            Outcome::Failed => keep(|p| (&p.cluster_endpoints, &p.cluster_plan), port),
        };
        let local = match self.plan_for(port, &choice, &port.local_endpoints) {
            Outcome::Plan(p) => p,
            Outcome::Failed => keep(|p| (&p.local_endpoints, &p.local_plan), port),
        };
        port.cluster_plan = cluster;
        port.local_plan = local;
    }

    fn plan_for(&mut self, port: &ServicePort, choice: &SchedulerChoice, candidates: &[u32]) -> Outcome {
        if candidates.is_empty() {
            return Outcome::Plan(None);
        }
        let key = &port.key;
        let name = choice.name.as_str();
        let mode = self.mode;
        if self.instance_for(name).is_none() {
            self.warn(key, format!("no scheduler is named {name:?}; the Service keeps the default"));
            return Outcome::Plan(None);
        }
        let load = if self.uses_load(port) {
            self.current_load().map(|l| {
                candidates
                    .iter()
                    .map(|&i| port.endpoints.get(i as usize).map_or((0, 0), |e| l.of(port, e.ip, e.port)))
                    .unzip()
            })
        } else {
            None
        };
        let Some(instance) = self.instance_for(name) else { return Outcome::Failed };
        let request = ScheduleRequest { name, parameters: &choice.parameters, mode, port, candidates, load };
        let plugin = instance.plugin().to_string();
        match instance.schedule(&request) {
            Ok(plan) => match plan.check(candidates.len()) {
                Ok(()) => {
                    self.warned.remove(key);
                    Outcome::Plan(plan.normalized(candidates.len()))
                }
                Err(why) => {
                    let message = format!(
                        "scheduler {name} ({plugin}) returned a plan {mode} mode cannot execute: {why}; the Service keeps the default"
                    );
                    self.fault = Some(format!("{key}: {message}"));
                    self.warn(key, message);
                    Outcome::Failed
                }
            },
            Err(e) => {
                let trapped = e.needs_fresh_instance();
                if trapped {
                    self.fault = Some(format!("{key}: {e}"));
                }
                self.warn(key, format!("scheduler {name} in {mode} mode: {e}; the Service keeps the default"));
                if trapped {
                    self.drop_instance_of(name);
                }
                // The scheduler's own refusal (a bad parameter): the
                // default; a fault: the last plan.
                if trapped { Outcome::Failed } else { Outcome::Plan(None) }
            }
        }
    }

    /// Logs `message` against the service port unless it was the last one
    /// logged for it.
    fn warn(&mut self, key: &str, message: String) {
        if self.warned.get(key) != Some(&message) {
            tracing::warn!(service = %key, family = %self.family, "{message}");
            self.warned.insert(key.to_string(), message);
        }
    }

    /// The live instance of the plugin that implements `name`.
    fn instance_for(&mut self, name: &str) -> Option<&mut SchedulerInstance> {
        for i in 0..self.plugins.len() {
            if self.instances[i].is_none() {
                match self.plugins[i].instantiate() {
                    Ok(instance) => self.instances[i] = Some(instance),
                    Err(e) => {
                        tracing::error!("{e}");
                        continue;
                    }
                }
            }
            if self.built_in_only && self.plugins[i].name() != crate::runtime::BUILT_IN_SCHEDULERS {
                continue;
            }
            if self.instances[i].as_ref().is_some_and(|s| s.names().iter().any(|n| n == name)) {
                return self.instances[i].as_mut();
            }
        }
        None
    }

    fn drop_instance_of(&mut self, name: &str) {
        for slot in &mut self.instances {
            if slot.as_ref().is_some_and(|s| s.names().iter().any(|n| n == name)) {
                *slot = None;
            }
        }
    }
}
