//! A test-only scheduler component loaded with `--scheduler-plugin`: its
//! one scheduler, `first`, sends every connection to the first candidate
//! with a weight (a rotation of one in the iptables and nftables modes,
//! which ipvs mode cannot run; a pick in userspace mode, which skips a
//! candidate that failed the connection). It promises priority, and not
//! spread: the conformance kit passes its priority and fails its ipvs
//! plans.
#![forbid(unsafe_code)]

use kpx_rules::plan::Plan;
use kpx_sdk::Promise;
use kpx_sdk::scheduler::{PickRequest, Request, Scheduler};

struct First;

impl Scheduler for First {
    fn names() -> Vec<String> {
        vec!["first".into()]
    }

    fn promises(_: &str) -> Vec<Promise> {
        vec![Promise::Priority]
    }

    fn uses_load(_: &str) -> bool {
        false
    }

    fn plan(request: Request) -> Result<Plan, String> {
        if let Some((k, _)) = request.parameters.first() {
            return Err(format!("first takes no parameters (got {k:?})"));
        }
        let first = request
            .candidates
            .iter()
            .position(|&i| request.port.endpoints.get(i as usize).is_some_and(|e| e.weight > 0))
            .ok_or("no candidate has a weight")?;
        Ok(Plan::Sequence(vec![first as u32]))
    }

    fn pick(r: PickRequest) -> Result<Option<u32>, String> {
        Ok((0..r.endpoints.len() as u32).find(|i| !r.failed.contains(i) && r.weights[*i as usize] > 0))
    }
}

kpx_sdk::export_scheduler!(First);
