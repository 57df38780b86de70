//! The built-in schedulers (kpx-sched), exported as one `kpx:proxier`
//! scheduler component: rr, wrr, lc, wlc, sed, nq, dh, sh, lblc, lblcr,
//! mh, random and maglev.
#![forbid(unsafe_code)]

use std::sync::Mutex;

use kpx_sched::pick::Picks;
use kpx_sched::{Connection, Dest, Plan};
use kpx_sdk::Promise;
use kpx_sdk::scheduler::{PickRequest, Request, Scheduler};

struct BuiltIn;

/// The per-connection pickers' state, in the component's own memory.
static PICKS: Mutex<Option<Picks>> = Mutex::new(None);

impl Scheduler for BuiltIn {
    fn names() -> Vec<String> {
        kpx_sched::NAMES.iter().map(|n| n.to_string()).collect()
    }

    fn promises(name: &str) -> Vec<Promise> {
        promises(name)
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

    fn pick(r: PickRequest) -> Result<Option<u32>, String> {
        let n = r.endpoints.len();
        if [r.weights.len(), r.active.len(), r.inactive.len()] != [n, n, n] {
            return Err(format!(
                "{n} candidates but {} weights and {} + {} counts",
                r.weights.len(),
                r.active.len(),
                r.inactive.len()
            ));
        }
        let dests: Vec<Dest> = (0..n)
            .map(|i| {
                let (ip, port) = r.endpoints[i];
                Dest { ip, port, weight: r.weights[i], active: r.active[i], inactive: r.inactive[i], overloaded: false }
            })
            .collect();
        let conn = Connection { source: r.client, destination: r.destination };
        let mut picks = PICKS.lock().map_err(|_| "the pickers' state is poisoned".to_string())?;
        let picks = picks.get_or_insert_with(Picks::default);
        let picked = picks.pick(&r.service, &r.name, &r.parameters, &dests, &r.failed, conn, r.random)?;
        Ok(picked.map(|i| i as u32))
    }

    fn forget(service: &str) {
        if let Ok(mut picks) = PICKS.lock()
            && let Some(picks) = picks.as_mut()
        {
            picks.retain(|s| s != service);
        }
    }
}

/// What each built-in scheduler guarantees, from what kpx-sched does
/// (`kpx conformance builtin:schedulers` checks each):
///
/// - rr rotates over the candidates, weights aside but 0: spread.
/// - wrr rotates by weight (IPVS's passes): spread, weighted.
/// - lc sends a connection to the least overhead, weights aside: spread,
///   least-loaded. wlc divides the overhead by the weight, so shares
///   converge to the weights (and idle candidates share by weight): also
///   weighted. sed sends new connections over idle candidates to the
///   heaviest first, and nq to any idle one first whatever its weight, so
///   their shares follow the weights only under load: spread,
///   least-loaded.
/// - sh gives each candidate as many of its 256 source buckets as its
///   weight: spread, weighted, sticky. mh and maglev fill their tables by
///   weight and hash the source: spread, weighted, sticky; maglev's 1,021
///   entries keep all but about 1/N of the clients when one of N
///   endpoints goes (minimal-disruption), which mh's 251 do not (about
///   1/N + 4 points move).
/// - random draws by weight: spread, weighted.
/// - dh hashes the destination: every client of one Service address goes
///   to one endpoint, so it is sticky and does not spread.
/// - lblc and lblcr keep a destination's endpoint until it is overloaded,
///   then add or move to wlc's choice: none of these (one Service address
///   piles onto one endpoint once every one is loaded).
fn promises(name: &str) -> Vec<Promise> {
    use Promise::{LeastLoaded, MinimalDisruption, Spread, Sticky, Weighted};
    match name {
        "rr" => vec![Spread],
        "wrr" | "random" => vec![Spread, Weighted],
        "lc" | "sed" | "nq" => vec![Spread, LeastLoaded],
        "wlc" => vec![Spread, Weighted, LeastLoaded],
        "sh" | "mh" => vec![Spread, Weighted, Sticky],
        "maglev" => vec![Spread, Weighted, Sticky, MinimalDisruption],
        "dh" => vec![Sticky],
        _ => Vec::new(),
    }
}

kpx_sdk::export_scheduler!(BuiltIn);
