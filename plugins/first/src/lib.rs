//! A test-only scheduler component loaded with `--scheduler-plugin`: its
//! one scheduler, `first`, sends every connection to the first candidate
//! (in every mode: a rotation of one in the rule modes, a pick in
//! userspace mode), the next one when that one failed the connection.
#![forbid(unsafe_code)]

use kpx_rules::plan::Plan;
use kpx_sdk::scheduler::{PickRequest, Request, Scheduler};

struct First;

impl Scheduler for First {
    fn names() -> Vec<String> {
        vec!["first".into()]
    }

    fn uses_load(_: &str) -> bool {
        false
    }

    fn plan(request: Request) -> Result<Plan, String> {
        if let Some((k, _)) = request.parameters.first() {
            return Err(format!("first takes no parameters (got {k:?})"));
        }
        Ok(Plan::Sequence(vec![0]))
    }

    fn pick(r: PickRequest) -> Result<Option<u32>, String> {
        Ok((0..r.endpoints.len() as u32).find(|i| !r.failed.contains(i) && r.weights[*i as usize] > 0))
    }
}

kpx_sdk::export_scheduler!(First);
