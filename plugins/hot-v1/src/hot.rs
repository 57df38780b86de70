//! The scheduler `hot`, as one version of a plugin implements it: the
//! policy of kpx-sched named `POLICY` under the name `hot`. Versions 1
//! and 2 differ in `POLICY` and in the contract they are exported for
//! (version 1 for kpx:proxier 0.2.0, which states no promises; version 2
//! for 0.4.0); the hot-reload test replaces one file with the other while
//! traffic flows.

use std::sync::Mutex;

use kpx_sched::pick::Picks;
use kpx_sched::{Connection, Dest, Plan};
use kpx_sdk::Promise;
use kpx_sdk::scheduler::{PickRequest, Request, Scheduler};

pub struct Hot;

/// The per-connection picks' state (userspace mode).
static PICKS: Mutex<Option<Picks>> = Mutex::new(None);

impl Scheduler for Hot {
    fn names() -> Vec<String> {
        vec!["hot".into()]
    }

    /// What the policy guarantees (as the built-in component states it
    /// for the same name); a 0.2.0 export never asks.
    fn promises(_: &str) -> Vec<Promise> {
        match super::POLICY {
            "maglev" => vec![Promise::Spread, Promise::Weighted, Promise::Sticky, Promise::MinimalDisruption],
            _ => vec![Promise::Spread],
        }
    }

    fn uses_load(_: &str) -> bool {
        false
    }

    fn plan(request: Request) -> Result<Plan, String> {
        let dests: Vec<Dest> = request
            .candidates
            .iter()
            .map(|&i| {
                let ep = request.port.endpoints.get(i as usize).ok_or(format!("candidate {i} is no endpoint"))?;
                Ok(Dest::new(ep.ip, ep.port, u32::from(ep.weight)))
            })
            .collect::<Result<_, String>>()?;
        kpx_sched::plan::plan_for(request.mode, super::POLICY, &request.parameters, &dests)
    }

    fn pick(r: PickRequest) -> Result<Option<u32>, String> {
        let dests: Vec<Dest> =
            r.endpoints.iter().zip(&r.weights).map(|(&(ip, port), &w)| Dest::new(ip, port, w)).collect();
        let conn = Connection { source: r.client, destination: r.destination };
        let mut picks = PICKS.lock().map_err(|_| "the picks' state is poisoned".to_string())?;
        let picks = picks.get_or_insert_with(Picks::default);
        let picked = picks.pick(&r.service, super::POLICY, &r.parameters, &dests, &r.failed, conn, r.random)?;
        Ok(picked.map(|i| i as u32))
    }
}
