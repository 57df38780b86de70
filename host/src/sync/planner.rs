//! Plans for service ports: the Service's scheduler (annotation), or the
//! mode's default when endpoints carry weights, asked of the scheduler
//! component that implements it. A Service whose scheduler is unknown,
//! refuses its parameters, traps or returns a plan the mode cannot
//! execute is logged and keeps the default (kube-proxy's uniform random
//! choice); nothing already programmed changes for it.

use std::sync::Arc;

use kpx_rules::model::{ProxyMode, SchedulerChoice, ServicePort};
use kpx_rules::plan::Plan;

use crate::runtime::{ScheduleRequest, SchedulerInstance, SchedulerPlugin};

/// The scheduler used for weighted endpoints when a Service names none:
/// kube-proxy's random choice, with the weights.
pub const DEFAULT_WEIGHTED: &str = "random";

pub struct Planner {
    mode: ProxyMode,
    plugins: Vec<Arc<SchedulerPlugin>>,
    /// One instance per plugin (None until first needed, or after a trap).
    instances: Vec<Option<SchedulerInstance>>,
}

impl Planner {
    pub fn new(mode: ProxyMode, plugins: Vec<Arc<SchedulerPlugin>>) -> Planner {
        let instances = plugins.iter().map(|_| None).collect();
        Planner { mode, plugins, instances }
    }

    /// Fills `port`'s plans.
    pub fn plan(&mut self, port: &mut ServicePort) {
        port.cluster_plan = None;
        port.local_plan = None;
        let weighted = port.endpoints.iter().any(|e| e.weight != 1);
        let choice = match &port.scheduler {
            Some(c) => c.clone(),
            None if weighted => SchedulerChoice { name: DEFAULT_WEIGHTED.into(), parameters: Vec::new() },
            None => return,
        };
        port.cluster_plan = self.plan_for(port, &choice, &port.cluster_endpoints);
        port.local_plan = self.plan_for(port, &choice, &port.local_endpoints);
    }

    fn plan_for(&mut self, port: &ServicePort, choice: &SchedulerChoice, candidates: &[u32]) -> Option<Plan> {
        if candidates.is_empty() {
            return None;
        }
        let key = &port.key;
        let name = choice.name.as_str();
        let mode = self.mode;
        let Some(instance) = self.instance_for(name) else {
            tracing::warn!(service = %key, "no scheduler is named {name:?}; the Service keeps the default");
            return None;
        };
        let request = ScheduleRequest { name, parameters: &choice.parameters, mode, port, candidates };
        match instance.schedule(&request) {
            Ok(plan) => match plan.check(candidates.len()) {
                Ok(()) => Some(plan),
                Err(why) => {
                    tracing::warn!(
                        service = %key,
                        "scheduler {name} ({}) returned a plan {} mode cannot execute: {why}; the Service keeps the default",
                        instance.plugin(),
                        mode
                    );
                    None
                }
            },
            Err(e) => {
                tracing::warn!(service = %key, %mode, "scheduler {name}: {e}; the Service keeps the default");
                if e.needs_fresh_instance() {
                    self.drop_instance_of(name);
                }
                None
            }
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
