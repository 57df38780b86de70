//! Plans for service ports: the Service's scheduler (annotation), or the
//! mode's default when endpoints carry weights, asked of the scheduler
//! component that implements it. A Service whose scheduler is unknown or
//! refuses its parameters is logged and planned as one that names no
//! scheduler: the weighted default when its endpoints carry weights
//! (`kpx.dev/weights`), else none (kube-proxy's uniform random choice).
//! One whose scheduler traps or returns a plan the mode cannot execute is
//! logged and keeps its last plan while that fits its candidates, else is
//! planned the same way.

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

/// What a Service whose scheduler gives no plan gets, as the logs say it:
/// what a Service that names no scheduler gets.
const AS_IF_NONE: &str =
    "the Service is planned as one that names no scheduler (weighted random with kpx.dev/weights, else uniform)";

/// What one scheduler call gave.
enum Outcome {
    /// The scheduler's plan (None: it asks for none, a uniform choice).
    Plan(Option<Plan>),
    /// No plan from the Service's scheduler (not found, or it refused
    /// the Service's parameters): the Service is planned as one that
    /// names none.
    Default,
    /// A fault (trap, unexecutable plan): keep the last plan while it fits,
    /// else as [`Outcome::Default`].
    Failed,
}

/// The scheduler a Service that names none gets in `mode`: the weighted
/// default when its endpoints carry weights (outside ipvs mode, whose
/// kernel weighs them itself), else none (a uniform choice).
fn default_choice(mode: ProxyMode, port: &ServicePort) -> Option<Arc<SchedulerChoice>> {
    let weighted = port.endpoints.iter().any(|e| e.weight != 1);
    (weighted && mode != ProxyMode::Ipvs)
        .then(|| Arc::new(SchedulerChoice { name: DEFAULT_WEIGHTED.into(), parameters: Vec::new() }))
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
    /// is not dropped for the default by a passing fault. A Service whose
    /// scheduler gives no plan is planned as one that names none.
    pub fn plan(&mut self, port: &mut ServicePort, previous: Option<&ServicePort>) {
        port.cluster_plan = None;
        port.local_plan = None;
        // The Service's one copy (a pointer), not its parameters.
        let choice = match &port.scheduler {
            Some(c) => Arc::clone(c),
            None => match default_choice(self.mode, port) {
                Some(default) => default,
                None => return,
            },
        };
        let keep = |which: fn(&ServicePort) -> (&Vec<u32>, &Option<Plan>), port: &ServicePort| {
            previous.and_then(|p| {
                let (candidates, plan) = which(p);
                (candidates == which(port).0).then(|| plan.clone()).flatten()
            })
        };
        // The default comes from the built-in component, whatever others export.
        self.built_in_only = port.scheduler.is_none();
        let cluster = self.plan_for(port, &choice, &port.cluster_endpoints);
        let local = self.plan_for(port, &choice, &port.local_endpoints);
        // A warning is logged once until the Service's own plans succeed.
        if matches!((&cluster, &local), (Outcome::Plan(_), Outcome::Plan(_))) {
            self.warned.remove(&port.key);
        }
        let cluster = match cluster {
            Outcome::Plan(p) => p,
            Outcome::Default => self.fallback(port, &port.cluster_endpoints),
            Outcome::Failed => match keep(|p| (&p.cluster_endpoints, &p.cluster_plan), port) {
                Some(last) => Some(last),
                None => self.fallback(port, &port.cluster_endpoints),
            },
        };
        let local = match local {
            Outcome::Plan(p) => p,
            Outcome::Default => self.fallback(port, &port.local_endpoints),
            Outcome::Failed => match keep(|p| (&p.local_endpoints, &p.local_plan), port) {
                Some(last) => Some(last),
                None => self.fallback(port, &port.local_endpoints),
            },
        };
        port.cluster_plan = cluster;
        port.local_plan = local;
    }

    /// The plan of a Service whose own scheduler gave none: what a Service
    /// that names no scheduler gets (the weighted default from the
    /// built-in component when its endpoints carry weights, else none). A
    /// Service that names none already had it.
    fn fallback(&mut self, port: &ServicePort, candidates: &[u32]) -> Option<Plan> {
        port.scheduler.as_ref()?;
        let choice = default_choice(self.mode, port)?;
        self.built_in_only = true;
        let outcome = self.plan_for(port, &choice, candidates);
        self.built_in_only = false;
        match outcome {
            Outcome::Plan(plan) => plan,
            Outcome::Default | Outcome::Failed => None,
        }
    }

    fn plan_for(&mut self, port: &ServicePort, choice: &SchedulerChoice, candidates: &[u32]) -> Outcome {
        if candidates.is_empty() {
            return Outcome::Plan(None);
        }
        let key = &port.key;
        let name = choice.name.as_str();
        let mode = self.mode;
        if self.instance_for(name).is_none() {
            self.warn(key, format!("no scheduler is named {name:?}; {AS_IF_NONE}"));
            return Outcome::Default;
        }
        // The default (weighted random) does not plan from load.
        let load = if !self.built_in_only && self.uses_load(port) {
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
            // A kind the mode has no way to run (a rotation in ipvs mode,
            // a kernel scheduler in the rule modes): the scheduler's way of
            // refusing the mode, so the Service gets the default.
            Ok(plan) if !plan.runs_in(mode) => {
                let kind = match plan {
                    Plan::Weighted(_) => "weighted",
                    Plan::Sequence(_) => "sequence",
                    Plan::Slots(_) => "slots",
                    Plan::Kernel(_) => "kernel",
                };
                self.warn(key, format!("scheduler {name} ({plugin}) returned a {kind} plan, which {mode} mode does not run; {AS_IF_NONE}"));
                Outcome::Default
            }
            Ok(plan) => match plan.check(candidates.len()) {
                Ok(()) => Outcome::Plan(plan.normalized(candidates.len())),
                Err(why) => {
                    let message = format!(
                        "scheduler {name} ({plugin}) returned a plan {mode} mode cannot execute: {why}; the Service keeps its last plan while its endpoints are the same, else {AS_IF_NONE}"
                    );
                    self.fault = Some(format!("{key}: {message}"));
                    self.warn(key, message);
                    Outcome::Failed
                }
            },
            Err(e) => {
                let trapped = e.needs_fresh_instance();
                // The scheduler's own refusal (a bad parameter): planned
                // as if it named none; a fault: the last plan first.
                let then = if trapped {
                    format!("the Service keeps its last plan while its endpoints are the same, else {AS_IF_NONE}")
                } else {
                    AS_IF_NONE.to_string()
                };
                if trapped {
                    self.fault = Some(format!("{key}: {e}"));
                }
                self.warn(key, format!("scheduler {name} in {mode} mode: {e}; {then}"));
                if trapped {
                    self.drop_instance_of(name);
                }
                if trapped { Outcome::Failed } else { Outcome::Default }
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

#[cfg(test)]
mod tests {
    use kpx_rules::model::{Endpoint, Protocol};

    use super::*;
    use crate::runtime::{BUILT_IN_SCHEDULERS, Limits, Runtime, builtin};

    /// The scheduler components as kpx loads them with `--scheduler-plugin`
    /// giving wasi-probe (whose every plan is an error), then the built-in
    /// ones.
    fn planner(mode: ProxyMode) -> Planner {
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let probe = std::fs::read(format!("{}/kpx_plugin_wasi_probe.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
        let probe = runtime.load_scheduler("wasi-probe", &probe).unwrap();
        let built_in = runtime.load_scheduler(BUILT_IN_SCHEDULERS, builtin::get("schedulers").unwrap()).unwrap();
        Planner::new(mode, IpFamily::V4, vec![Arc::new(probe), Arc::new(built_in)])
    }

    /// Service test/web over two endpoints of these weights
    /// (`kpx.dev/weights`), naming `scheduler`.
    fn port(weights: [u16; 2], scheduler: Option<&str>) -> ServicePort {
        let endpoints = ["10.0.0.1", "10.0.0.2"]
            .iter()
            .zip(weights)
            .map(|(ip, weight)| {
                let mut e = Endpoint::ready(ip.parse().unwrap(), 8080);
                e.weight = weight;
                e
            })
            .collect();
        let mut p = ServicePort::new("test", "web", "http", Protocol::Tcp, 80).with_cluster_endpoints(endpoints);
        p.scheduler = scheduler.map(|name| Arc::new(SchedulerChoice { name: name.into(), parameters: Vec::new() }));
        p
    }

    /// A Service whose scheduler errs (wasi-probe's `probe`), or names none
    /// kpx has, gets what a Service naming no scheduler gets: with weights
    /// 3:1 the weighted default, not a uniform choice; without weights,
    /// no plan (uniform) as before.
    #[test]
    fn a_failing_scheduler_falls_back_to_the_weighted_default() {
        let mut planner = planner(ProxyMode::Nftables);
        let mut unnamed = port([3, 1], None);
        planner.plan(&mut unnamed, None);
        let weighted = unnamed.cluster_plan.expect("weights give a Service that names no scheduler a plan");
        assert!(!weighted.is_uniform(2), "{weighted:?}");
        for name in ["probe", "nope"] {
            let mut failing = port([3, 1], Some(name));
            planner.plan(&mut failing, None);
            assert_eq!(failing.cluster_plan.as_ref(), Some(&weighted), "{name}");
            assert_eq!(failing.local_plan, None, "{name}: no local endpoints");
            let mut even = port([1, 1], Some(name));
            planner.plan(&mut even, None);
            assert_eq!(even.cluster_plan, None, "{name}: without weights, the uniform choice");
        }
        // A working scheduler's own plan is not replaced.
        let mut maglev = port([3, 1], Some("maglev"));
        planner.plan(&mut maglev, None);
        assert!(matches!(maglev.cluster_plan, Some(Plan::Slots(_))), "{:?}", maglev.cluster_plan);
    }

    /// A plan of a kind the mode does not run (`first`'s rotation, in
    /// ipvs mode) never reaches the backend: the Service gets the default,
    /// as if it named no scheduler, and the reason is logged once.
    #[test]
    fn a_plan_the_mode_does_not_run_gives_the_default() {
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let first = std::fs::read(format!("{}/kpx_plugin_first.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
        let first = runtime.load_scheduler("first", &first).unwrap();
        let built_in = runtime.load_scheduler(BUILT_IN_SCHEDULERS, builtin::get("schedulers").unwrap()).unwrap();
        let mut ipvs = Planner::new(ProxyMode::Ipvs, IpFamily::V4, vec![Arc::new(first), Arc::new(built_in)]);
        let (mut unnamed, mut named) = (port([3, 1], None), port([3, 1], Some("first")));
        ipvs.plan(&mut unnamed, None);
        ipvs.plan(&mut named, None);
        assert!(!matches!(named.cluster_plan, Some(Plan::Sequence(_))), "{:?}", named.cluster_plan);
        assert_eq!(named.cluster_plan, unnamed.cluster_plan, "the default, as for a Service naming no scheduler");
        // In the rule modes the same rotation runs and is kept.
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let first = std::fs::read(format!("{}/kpx_plugin_first.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
        let first = runtime.load_scheduler("first", &first).unwrap();
        let mut nft = Planner::new(ProxyMode::Nftables, IpFamily::V4, vec![Arc::new(first)]);
        let mut named = port([3, 1], Some("first"));
        nft.plan(&mut named, None);
        assert_eq!(named.cluster_plan, Some(Plan::Sequence(vec![0])));
    }
}
