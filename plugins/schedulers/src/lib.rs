//! The built-in schedulers (kpx-sched), exported as one `kpx:proxier`
//! scheduler component: rr, wrr, lc, wlc, sed, nq, dh, sh, lblc, lblcr,
//! mh, random and maglev.
#![forbid(unsafe_code)]

use kpx_sched::{Dest, Plan};
use kpx_sdk::scheduler::{Request, Scheduler};

struct BuiltIn;

impl Scheduler for BuiltIn {
    fn names() -> Vec<String> {
        kpx_sched::NAMES.iter().map(|n| n.to_string()).collect()
    }

    fn uses_load(name: &str) -> bool {
        kpx_sched::uses_load(name)
    }

    fn plan(request: Request) -> Result<Plan, String> {
        let dests: Vec<Dest> = request
            .candidates
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let ep =
                    request.port.endpoints.get(i as usize).ok_or_else(|| format!("candidate {i} is no endpoint"))?;
                let (active, inactive) = request.load.as_ref().map_or((0, 0), |l| {
                    (l.active.get(k).copied().unwrap_or(0), l.inactive.get(k).copied().unwrap_or(0))
                });
                Ok(Dest { ip: ep.ip, port: ep.port, weight: u32::from(ep.weight), active, inactive, overloaded: false })
            })
            .collect::<Result<_, String>>()?;
        kpx_sched::plan::plan_for(request.mode, &request.name, &request.parameters, &dests)
    }
}

kpx_sdk::export_scheduler!(BuiltIn);
