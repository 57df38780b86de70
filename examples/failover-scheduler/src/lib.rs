//! `failover`: a primary and its standbys, as a kpx scheduler component
//! written against kpx-sdk alone.
//!
//! Every new connection goes to the first candidate that may take it: the
//! first with a weight above 0 (`kpx.dev/weights` drains an endpoint with
//! 0) that has not failed the connection. kpx sends the candidates sorted
//! by address, then port, so the primary is the lowest address; when it
//! leaves the EndpointSlice (not ready, deleted) or is drained, the next
//! one takes the new connections, and the old primary takes them back when
//! it returns. That is IPVS's `fo` in address order rather than by the
//! highest weight, and the opposite of spreading: the scheduler promises
//! `priority` and nothing else, so `kpx conformance` checks that and does
//! not fail it for sending everything to one endpoint.
//!
//! The plans: a rotation of one candidate in the iptables and nftables
//! modes; in ipvs mode, which runs no rotation, a slot table of one slot,
//! which kpx runs with a firewall mark for that endpoint alone. Userspace
//! mode picks per connection and skips a candidate that already failed the
//! connection. It takes no parameters, and refuses any by name.

use kpx_sdk::scheduler::{PickRequest, Request, Scheduler};
use kpx_sdk::{HashField, Plan, Promise, ProxyMode, SlotTable};

const NAME: &str = "failover";

/// The first candidate with a weight that is not in `failed`: the one
/// every new connection goes to.
fn primary(weights: &[u32], failed: &[u32]) -> Option<u32> {
    (0..weights.len() as u32).find(|i| weights[*i as usize] > 0 && !failed.contains(i))
}

/// A plan `mode` runs that sends every new connection to candidate `k`.
fn all_to(k: u32, mode: ProxyMode) -> Plan {
    match mode {
        ProxyMode::Ipvs => {
            Plan::Slots(SlotTable { field: HashField::Source, seed: 0, rows: 1, cols: 1, slots: vec![k] })
        }
        _ => Plan::Sequence(vec![k]),
    }
}

fn no_parameters(parameters: &[(String, String)]) -> Result<(), String> {
    match parameters.first() {
        Some((key, _)) => Err(format!("{NAME} takes no parameters (got {key:?})")),
        None => Ok(()),
    }
}

struct Failover;

impl Scheduler for Failover {
    fn names() -> Vec<String> {
        vec![NAME.to_string()]
    }

    fn promises(_: &str) -> Vec<Promise> {
        vec![Promise::Priority]
    }

    fn uses_load(_: &str) -> bool {
        false
    }

    fn plan(request: Request) -> Result<Plan, String> {
        no_parameters(&request.parameters)?;
        let weights: Vec<u32> = request
            .candidates
            .iter()
            .map(|&i| request.port.endpoints.get(i as usize).map(|e| u32::from(e.weight)))
            .collect::<Option<_>>()
            .ok_or("a candidate is no endpoint")?;
        let k = primary(&weights, &[]).ok_or("no candidate has a weight")?;
        Ok(all_to(k, request.mode))
    }

    fn pick(request: PickRequest) -> Result<Option<u32>, String> {
        no_parameters(&request.parameters)?;
        Ok(primary(&request.weights, &request.failed))
    }
}

kpx_sdk::export_scheduler!(Failover);

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_sdk::testing;

    /// Where every connection goes under `plan`, if it sends all to one.
    fn only(plan: &Plan) -> Option<u32> {
        match plan {
            Plan::Sequence(s) if s.iter().all(|&k| k == s[0]) => s.first().copied(),
            Plan::Slots(t) if t.slots.iter().all(|&k| k == t.slots[0]) => t.slots.first().copied(),
            _ => None,
        }
    }

    #[test]
    fn every_mode_runs_the_plan_and_it_names_the_first_candidate_with_a_weight() {
        let mut port = testing::service_port("shop/db:pg", &[("10.244.1.5", 1), ("10.244.2.5", 1), ("10.244.3.5", 1)]);
        for (drained, want) in [(None, 0), (Some(0), 1), (Some(1), 2)] {
            if let Some(d) = drained {
                port.endpoints[d].weight = 0;
            }
            for mode in [ProxyMode::Iptables, ProxyMode::Nftables, ProxyMode::Ipvs] {
                let plan = Failover::plan(testing::request(NAME, mode, &port)).unwrap();
                testing::check_plan(&plan, 3, mode).unwrap();
                assert_eq!(only(&plan), Some(want), "{mode}: {plan:?}");
            }
        }
        port.endpoints[2].weight = 0;
        assert!(Failover::plan(testing::request(NAME, ProxyMode::Nftables, &port)).is_err());
    }

    #[test]
    fn picks_fail_over_in_candidate_order_whatever_the_load() {
        let port = testing::service_port("shop/db:pg", &[("10.244.1.5", 1), ("10.244.2.5", 1), ("10.244.3.5", 1)]);
        let mut request = testing::pick_request(NAME, &port, "192.0.2.7");
        assert_eq!(Failover::pick(request.clone()).unwrap(), Some(0));
        request.active = vec![50, 0, 0];
        assert_eq!(Failover::pick(request.clone()).unwrap(), Some(0), "however loaded");
        request.failed = vec![0];
        assert_eq!(Failover::pick(request.clone()).unwrap(), Some(1));
        request.failed = vec![0, 1, 2];
        assert_eq!(Failover::pick(request).unwrap(), None);
    }

    #[test]
    fn it_promises_priority_and_refuses_parameters_by_name() {
        assert_eq!(Failover::promises(NAME), [Promise::Priority]);
        let port = testing::service_port("shop/db:pg", &[("10.244.1.5", 1)]);
        let mut request = testing::request(NAME, ProxyMode::Nftables, &port);
        request.parameters = vec![("standby".into(), "2".into())];
        let e = Failover::plan(request).unwrap_err();
        assert!(e.contains("\"standby\""), "{e}");
    }
}
