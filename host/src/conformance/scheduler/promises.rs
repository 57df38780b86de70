//! The promises a scheduler states for a name (kpx:proxier 0.4.0's
//! `promise`; a 0.2.0 component states none and is checked as promising
//! `spread`), each checked as docs/plugins.md ("Promises") says, and no
//! promise a name does not state: a failover scheduler is not failed for
//! sending everything to one endpoint, and a round robin is not checked
//! for keeping clients.
//!
//! A promise is one row (`rr: spread: ...`), after the row naming what the
//! name promises (`rr: promises spread`): the checks of its plans, one per
//! mode that runs plans (a mode the scheduler refuses, or in which its plan
//! is of a kind the mode cannot run, is skipped: the "plans in M mode" row
//! shows that), and of its per-connection picks when it has them.

use std::net::IpAddr;

use kpx_rules::model::ProxyMode;
use kpx_rules::plan::{Plan, SlotTable};

use super::{
    Picks, Problem, client, dest, endpoints, fresh, least_loaded_picks, plan, plan_over, port_over, remap, shares,
    spread, sticky_picks, within,
};
use crate::conformance::{Report, Row};
use crate::runtime::{self, Promise, SchedulerInstance, SchedulerPlugin};

/// The modes that run plans.
const PLAN_MODES: [ProxyMode; 3] = [ProxyMode::Iptables, ProxyMode::Nftables, ProxyMode::Ipvs];

/// IPVS's schedulers that hash an address of the connection: a client
/// keeps its endpoint under them.
const HASHING: [&str; 3] = ["sh", "dh", "mh"];

/// IPVS's schedulers whose shares follow the weights (rr, lc and dh use a
/// weight only to exclude a server at 0; nq sends to any idle server
/// first, whatever its weight).
const WEIGHING: [&str; 5] = ["wrr", "wlc", "sed", "sh", "mh"];

/// Held connections from distinct clients in the weighted check of picks:
/// enough that a hash of the client lands within the tolerance.
const WEIGHTED_CONNECTIONS: usize = 2000;

/// Addresses hashed through two slot tables laid out differently.
const ADDRESSES: usize = 20_000;

/// Asks a fresh instance what `name` promises, in a row naming them
/// (`rr: promises spread`); a failed answer (a trap, more than 16, one
/// twice) fails the row, and then no promise is checked.
pub(super) fn stated(report: &mut Report, plugin: &SchedulerPlugin, name: &str) -> Vec<Promise> {
    match fresh(plugin).and_then(|mut i| i.promises(name).map_err(|e| e.to_string())) {
        Ok(promises) => {
            let mut feature = format!("{name}: promises {}", label(&promises));
            if plugin.version() == runtime::wit::since_v0_2_0::VERSION {
                feature.push_str(" (kpx:proxier 0.2.0 states none: checked as spreading)");
            }
            report.row(&feature).pass();
            promises
        }
        Err(why) => {
            report.row(&format!("{name}: promises")).fail(why);
            Vec::new()
        }
    }
}

/// "spread, sticky", or "nothing".
fn label(promises: &[Promise]) -> String {
    if promises.is_empty() {
        return "nothing".into();
    }
    promises.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
}

/// What a promise's row says the kit checks.
pub(super) fn claim(promise: Promise) -> &'static str {
    match promise {
        Promise::Spread => "equal endpoints take at least half their fair share",
        Promise::Weighted => "shares follow the weights (3:1 within ±5 points)",
        Promise::Sticky => "one client, one endpoint",
        Promise::MinimalDisruption => "one of 4 endpoints gone moves at most 1/4 + 2 points of clients",
        Promise::LeastLoaded => "new connections go to the least loaded endpoint",
        Promise::Priority => "each connection goes to the first candidate that may take it",
    }
}

/// The row of one promise `name` states, with each of its checks
/// (`picks`: the component has per-connection picks).
pub(super) fn check(report: &mut Report, plugin: &SchedulerPlugin, name: &str, promise: Promise, picks: bool) {
    let row = report.row(&format!("{name}: {promise}: {}", claim(promise)));
    match promise {
        Promise::Spread => spread_kept(row, plugin, name, picks),
        Promise::Weighted => weighted(row, plugin, name, picks),
        Promise::Sticky => sticky(row, plugin, name, picks),
        Promise::MinimalDisruption => minimal_disruption(row, plugin, name, picks),
        Promise::LeastLoaded => least_loaded(row, plugin, name, picks),
        Promise::Priority => priority(row, plugin, name, picks),
    }
}

/// One check of a promise in one mode: `Ok(None)` kept, `Ok(Some(why))`
/// not for the kit to check there (an IPVS scheduler's own behaviour),
/// `Err` the plan's problem, or the promise broken (`Problem::Broken`).
type Checked = Result<Option<String>, Problem>;

/// Records `check` in each of `modes`: a mode the scheduler refuses, or
/// in which it plans what the mode cannot run, is skipped (its "plans in
/// M mode" row shows it; a promise row does not fail it twice).
fn in_modes(row: &mut Row, modes: &[ProxyMode], mut check: impl FnMut(ProxyMode) -> Checked) {
    for &mode in modes {
        match check(mode) {
            Ok(None) => row.pass(),
            Ok(Some(why)) => row.skip(format!("{mode} mode: {why}")),
            Err(Problem::Refused(_)) => row.skip(format!("{mode} mode: the scheduler refuses the request")),
            Err(Problem::Unrunnable(_)) => row.skip(format!("{mode} mode: no plan the mode can run (its plans row)")),
            Err(Problem::Broken(why)) => row.fail(format!("{mode} mode: {why}")),
        }
    }
}

/// A check of the picks of a fresh instance.
fn picked(row: &mut Row, plugin: &SchedulerPlugin, check: impl FnOnce(&mut SchedulerInstance) -> Result<(), String>) {
    row.record(fresh(plugin).and_then(|mut i| check(&mut i)).map_err(|e| format!("picks: {e}")));
}

fn fresh_instance(plugin: &SchedulerPlugin) -> Result<SchedulerInstance, Problem> {
    fresh(plugin).map_err(Problem::Broken)
}

/// A plan's kind, as a failure names it.
fn kind(plan: &Plan) -> String {
    match plan {
        Plan::Weighted(_) => "a weighted choice".into(),
        Plan::Sequence(_) => "a rotation".into(),
        Plan::Slots(_) => "a slot table".into(),
        Plan::Kernel(k) => format!("IPVS's {}", k.scheduler),
    }
}

/// `spread`: in each mode, the plan over 4 equal candidates gives each at
/// least 12.5 % (an IPVS scheduler's plan spreads as the kernel does: not
/// checked); and 1,024 held connections over 4 equal candidates, each
/// taking at least 128 (picks).
fn spread_kept(row: &mut Row, plugin: &SchedulerPlugin, name: &str, picks: bool) {
    in_modes(row, &PLAN_MODES, |mode| {
        let plan = plan(&mut fresh_instance(plugin)?, name, &[], mode, &[1; 4], false)?;
        match shares(&plan, 4) {
            None => Ok(Some(format!("{} places the connections (the kernel's own)", kind(&plan)))),
            Some(s) if s.iter().any(|&x| x < 0.125) => {
                Err(Problem::Broken(format!("shares {s:?} over 4 equal endpoints")))
            }
            Some(_) => Ok(None),
        }
    });
    if picks {
        picked(row, plugin, |i| spread(i, name));
    }
}

/// `weighted`: weights 3:1. The first candidate's share of the plan in
/// each mode (an IPVS scheduler's plan: one that weighs, given 3:1), and
/// of 2,000 held connections from distinct clients: 75 % ± 5 points.
fn weighted(row: &mut Row, plugin: &SchedulerPlugin, name: &str, picks: bool) {
    in_modes(row, &PLAN_MODES, |mode| {
        let plan = plan(&mut fresh_instance(plugin)?, name, &[], mode, &[3, 1], false)?;
        weighted_plan(&plan).map(|()| None).map_err(Problem::Broken)
    });
    if picks {
        picked(row, plugin, |i| weighted_picks(i, name));
    }
}

fn weighted_plan(plan: &Plan) -> Result<(), String> {
    if let Plan::Kernel(k) = plan {
        let w = &k.weights;
        if !WEIGHING.contains(&k.scheduler.as_str()) {
            return Err(format!("IPVS's {} does not share by weight", k.scheduler));
        }
        let three_to_one = w.len() == 2 && w[1] > 0 && u64::from(w[0]) == 3 * u64::from(w[1]);
        return if three_to_one { Ok(()) } else { Err(format!("IPVS's {} given weights {w:?} for 3:1", k.scheduler)) };
    }
    let s = shares(plan, 2).ok_or("no shares")?;
    within(s[0], 0.75, 0.05, "weight 3 of 3:1")
}

fn weighted_picks(instance: &mut SchedulerInstance, name: &str) -> Result<(), String> {
    let mut p = Picks::new(instance, 1, name, &[], dest(0, false), &[3, 1])?;
    let mut first = 0usize;
    for k in 0..WEIGHTED_CONNECTIONS {
        if p.hold(client(k, false), k)? == 0 {
            first += 1;
        }
    }
    within(first as f64 / WEIGHTED_CONNECTIONS as f64, 0.75, 0.05, "weight 3 of 3:1 over 2,000 held connections")
}

/// `sticky`: 50 clients picked 5 times each over 5 candidates, the same
/// candidate every time (picks); a plan over 4 equal candidates in each
/// mode that is a slot table (a hash of the connection's source, or of
/// its destination, which keeps every client of one Service address on
/// one endpoint), or IPVS's sh, dh or mh.
fn sticky(row: &mut Row, plugin: &SchedulerPlugin, name: &str, picks: bool) {
    in_modes(row, &PLAN_MODES, |mode| match plan(&mut fresh_instance(plugin)?, name, &[], mode, &[1; 4], false)? {
        Plan::Slots(_) => Ok(None),
        Plan::Kernel(k) if HASHING.contains(&k.scheduler.as_str()) => Ok(None),
        other => {
            Err(Problem::Broken(format!("{} places each connection afresh: a client reaches several", kind(&other))))
        }
    });
    if picks {
        picked(row, plugin, |i| sticky_picks(i, name));
    }
}

/// `minimal-disruption`: 20,000 clients picked over 4 candidates, then
/// over the 3 left as each goes in turn, at most 1/4 + 2 points moving
/// (picks); in each mode, the plans over the same endpoints compared as
/// [`disruption_of_plans`] says.
fn minimal_disruption(row: &mut Row, plugin: &SchedulerPlugin, name: &str, picks: bool) {
    in_modes(row, &PLAN_MODES, |mode| disruption_of_plans(plugin, name, mode));
    if picks {
        picked(row, plugin, |i| remap(i, name));
    }
}

/// The slot table over 4 equal endpoints and the one over the 3 left when
/// each goes in turn: the share of clients whose endpoint changes (the
/// leaving endpoint's own included), at most 1/4 + 2 points for every
/// endpoint that goes ([`moved`] says how it is counted). A weighted
/// choice or a rotation keeps no client on an endpoint and fails; an IPVS
/// scheduler's plan is the kernel's to keep (not checked).
fn disruption_of_plans(plugin: &SchedulerPlugin, name: &str, mode: ProxyMode) -> Checked {
    let mut i = fresh_instance(plugin)?;
    let four = endpoints(4, false);
    let load = idle(&mut i, name, 4)?;
    let before = match plan_over(&mut i, name, &[], mode, &port_over(&four, &[1; 4]), load)? {
        Plan::Slots(t) => t,
        Plan::Kernel(k) => return Ok(Some(format!("IPVS's {} places the clients (the kernel's own)", k.scheduler))),
        other => return Err(Problem::Broken(format!("{} keeps no client on an endpoint", kind(&other)))),
    };
    let mut worst = 0f64;
    for gone in 0..4 {
        let rest: Vec<(IpAddr, u16)> = four.iter().enumerate().filter(|(k, _)| *k != gone).map(|(_, e)| *e).collect();
        let load = idle(&mut i, name, 3)?;
        let after = match plan_over(&mut i, name, &[], mode, &port_over(&rest, &[1; 3]), load)? {
            Plan::Slots(t) => t,
            other => {
                let what = kind(&other);
                return Err(Problem::Broken(format!("with endpoint {gone} of 4 gone, {what}: no slots to compare")));
            }
        };
        worst = worst.max(moved(&before, &four, &after, &rest));
    }
    if worst <= 0.25 + 0.02 {
        Ok(None)
    } else {
        Err(Problem::Broken(format!("{:.1} % of the clients changed endpoint when one of 4 went", worst * 100.0)))
    }
}

/// Every candidate idle, for a scheduler that plans from load.
/// Active and inactive connections per candidate.
type Load = (Vec<u32>, Vec<u32>);

fn idle(i: &mut SchedulerInstance, name: &str, n: usize) -> Result<Option<Load>, Problem> {
    Ok(i.uses_load(name)?.then(|| (vec![0; n], vec![0; n])))
}

/// The share of clients whose endpoint differs between `before` (over the
/// endpoints `from`) and `after` (over `to`), compared by address, not
/// position: slot by slot when both tables are laid out alike (field,
/// seed, rows, columns: a client takes the same slot in both), else over
/// 20,000 addresses hashed through each.
fn moved(before: &SlotTable, from: &[(IpAddr, u16)], after: &SlotTable, to: &[(IpAddr, u16)]) -> f64 {
    let endpoint = |t: &SlotTable, eps: &[(IpAddr, u16)], slot: usize| {
        t.slots.get(slot).and_then(|&c| eps.get(c as usize)).copied()
    };
    let alike =
        (before.field, before.seed, before.rows, before.cols) == (after.field, after.seed, after.rows, after.cols);
    if alike {
        let n = before.slots.len();
        let changed = (0..n).filter(|&s| endpoint(before, from, s) != endpoint(after, to, s)).count();
        return changed as f64 / n.max(1) as f64;
    }
    let changed = (0..ADDRESSES)
        .filter(|&c| {
            let ip = client(c, false);
            endpoint(before, from, before.slot_of(ip)) != endpoint(after, to, after.slot_of(ip))
        })
        .count();
    changed as f64 / ADDRESSES as f64
}

/// `least-loaded`: with 5, 0, 5, 5 and then 3, 1, 2, 4 connections held,
/// candidate 1 takes the next (picks); for a scheduler that plans from
/// load, the iptables and nftables plans under those loads put every
/// share on candidate 1. One that neither picks nor reads the load cannot
/// know it, and fails.
fn least_loaded(row: &mut Row, plugin: &SchedulerPlugin, name: &str, picks: bool) {
    match fresh(plugin).and_then(|mut i| i.uses_load(name).map_err(|e| e.to_string())) {
        Err(why) => row.fail(why),
        Ok(true) => {
            in_modes(row, &[ProxyMode::Iptables, ProxyMode::Nftables], |mode| least_loaded_plans(plugin, name, mode))
        }
        Ok(false) if !picks => {
            row.fail("uses_load is false and there are no per-connection picks: the scheduler never learns the load")
        }
        // Picks see the load; a plan in a rule mode, without it, cannot
        // follow it: such a plan breaks the promise there (a mode the
        // scheduler refuses is skipped).
        Ok(false) => in_modes(row, &[ProxyMode::Iptables, ProxyMode::Nftables], |mode| {
            let plan = plan(&mut fresh_instance(plugin)?, name, &[], mode, &[1; 4], false)?;
            Err(Problem::Broken(format!("uses_load is false, so {} is planned without the load", kind(&plan))))
        }),
    }
    if picks {
        picked(row, plugin, |i| least_loaded_picks(i, name));
    }
}

fn least_loaded_plans(plugin: &SchedulerPlugin, name: &str, mode: ProxyMode) -> Checked {
    let mut i = fresh_instance(plugin)?;
    let port = port_over(&endpoints(4, false), &[1; 4]);
    for active in [[5, 0, 5, 5], [3, 1, 2, 4]] {
        let plan = plan_over(&mut i, name, &[], mode, &port, Some((active.to_vec(), vec![0; 4])))?;
        all_on(&plan, 4, 1).map_err(|e| Problem::Broken(format!("with {active:?} connections active: {e}")))?;
    }
    Ok(None)
}

/// Every share of `plan` over `n` candidates on candidate `want` (an IPVS
/// scheduler's plan: `want` the only candidate with a weight).
fn all_on(plan: &Plan, n: usize, want: usize) -> Result<(), String> {
    if let Plan::Kernel(k) = plan {
        let only = k.weights.iter().enumerate().all(|(i, &w)| (i == want) == (w > 0));
        return if only { Ok(()) } else { Err(format!("IPVS's {} with weights {:?}", k.scheduler, k.weights)) };
    }
    let s = shares(plan, n).ok_or("no shares")?;
    if s.get(want).is_some_and(|&x| x > 1.0 - 1e-9) {
        Ok(())
    } else {
        Err(format!("shares {s:?}, want every one on candidate {want}"))
    }
}

/// `priority`: plans over weights 1, 1, 1 / 0, 1, 1 / 0, 0, 2, 1 in each
/// mode put every share on the first candidate with a weight (an IPVS
/// scheduler's plan: only it weighted); picks follow [`PRIORITY_PICKS`].
fn priority(row: &mut Row, plugin: &SchedulerPlugin, name: &str, picks: bool) {
    in_modes(row, &PLAN_MODES, |mode| {
        let mut i = fresh_instance(plugin)?;
        let cases: [&[u32]; 3] = [&[1, 1, 1], &[0, 1, 1], &[0, 0, 2, 1]];
        for weights in cases {
            let plan = plan(&mut i, name, &[], mode, weights, false)?;
            let want = weights.iter().position(|&w| w > 0).unwrap_or(0);
            all_on(&plan, weights.len(), want).map_err(|e| Problem::Broken(format!("weights {weights:?}: {e}")))?;
        }
        Ok(None)
    });
    if picks {
        picked(row, plugin, |i| priority_picks(i, name));
    }
}

/// Priority's picks: (weights, connections held, candidates that failed
/// the connection, the pick wanted). The first candidate that may take
/// it, however loaded; None when none may.
#[allow(clippy::type_complexity)]
const PRIORITY_PICKS: [(&[u32], &[u32], &[u32], Option<u32>); 7] = [
    (&[1, 1, 1, 1], &[0, 0, 0, 0], &[], Some(0)),
    (&[1, 1, 1, 1], &[9, 0, 0, 0], &[], Some(0)),
    (&[1, 1, 1, 1], &[0, 0, 0, 0], &[0], Some(1)),
    (&[0, 1, 1], &[0, 0, 0], &[], Some(1)),
    (&[1, 0, 1, 1], &[0, 0, 0, 0], &[0, 2], Some(3)),
    (&[1, 1], &[0, 0], &[0, 1], None),
    (&[0, 0, 0], &[0, 0, 0], &[], None),
];

fn priority_picks(instance: &mut SchedulerInstance, name: &str) -> Result<(), String> {
    for (k, &(weights, active, failed, want)) in PRIORITY_PICKS.iter().enumerate() {
        let mut p = Picks::new(instance, k as u32 + 1, name, &[], dest(0, false), weights)?;
        p.active = active.to_vec();
        let got = p.pick(client(k, false), failed, k)?;
        if got != want {
            return Err(format!(
                "weights {weights:?}, {active:?} held, {failed:?} failed: picked {got:?}, want {want:?}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{Limits, Runtime, builtin};
    use kpx_rules::plan::{HashField, KernelPlan};

    fn eps(n: usize) -> Vec<(IpAddr, u16)> {
        endpoints(n, false)
    }

    fn table(slots: Vec<u32>) -> SlotTable {
        SlotTable { field: HashField::Source, seed: 7, rows: 1, cols: slots.len() as u8, slots }
    }

    /// Clients are compared by the endpoint they reach, not its position:
    /// endpoint 1 of 4 leaving shifts the positions of 2 and 3, and only
    /// its own slot moves.
    #[test]
    fn moved_counts_endpoints_that_change() {
        let (four, mut three) = (eps(4), eps(4));
        three.remove(1);
        let before = table(vec![0, 1, 2, 3]);
        assert_eq!(moved(&before, &four, &table(vec![0, 0, 1, 2]), &three), 0.25);
        assert_eq!(moved(&before, &four, &table(vec![1, 0, 1, 2]), &three), 0.5);
        // Laid out otherwise: compared over hashed addresses.
        let other = SlotTable { seed: 8, ..table(vec![0, 0, 1, 2]) };
        assert!(moved(&before, &four, &other, &three) > 0.25);
    }

    #[test]
    fn all_on_wants_every_share_on_one_candidate() {
        assert!(all_on(&Plan::Weighted(vec![0, 2, 0]), 3, 1).is_ok());
        assert!(all_on(&Plan::Sequence(vec![1, 1]), 3, 1).is_ok());
        assert!(all_on(&Plan::Sequence(vec![1, 0]), 3, 1).is_err());
        let kernel = |weights: Vec<u32>| Plan::Kernel(KernelPlan { scheduler: "wrr".into(), weights, flags: 0 });
        assert!(all_on(&kernel(vec![0, 5, 0]), 3, 1).is_ok());
        assert!(all_on(&kernel(vec![1, 5, 0]), 3, 1).is_err());
        assert!(weighted_plan(&kernel(vec![3, 1])).is_ok());
        let rr = Plan::Kernel(KernelPlan { scheduler: "rr".into(), weights: vec![3, 1], flags: 0 });
        assert!(weighted_plan(&rr).unwrap_err().contains("does not share by weight"));
        assert_eq!(label(&[]), "nothing");
        assert_eq!(label(&[Promise::Spread, Promise::Sticky]), "spread, sticky");
    }

    /// The kit says no: rr keeps none of priority, sticky, minimal
    /// disruption, weighted or least-loaded, and `first` does not spread;
    /// `first` keeps priority (its ipvs plan, which ipvs cannot run, is
    /// skipped here), maglev minimal disruption and wlc weights.
    #[test]
    fn a_promise_not_kept_fails_its_row_and_one_kept_passes() {
        let runtime = Runtime::new(Limits::default(), None).unwrap();
        let built_in = runtime.load_scheduler("schedulers", builtin::get("schedulers").unwrap()).unwrap();
        let bytes = std::fs::read(format!("{}/kpx_plugin_first.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
        let first = runtime.load_scheduler("first", &bytes).unwrap();
        let mut broken = Report::default();
        for promise in
            [Promise::Priority, Promise::Sticky, Promise::MinimalDisruption, Promise::Weighted, Promise::LeastLoaded]
        {
            check(&mut broken, &built_in, "rr", promise, true);
        }
        check(&mut broken, &first, "first", Promise::Spread, true);
        eprintln!("{broken}");
        assert_eq!(broken.rows.len(), 6);
        for row in &broken.rows {
            assert!(!row.failures.is_empty(), "{} passed: {row:?}", row.feature);
        }
        assert!(broken.failure_lines().iter().any(|l| l.contains("went [1024, 0, 0, 0]")), "{broken}");
        let mut kept = Report::default();
        check(&mut kept, &first, "first", Promise::Priority, true);
        check(&mut kept, &built_in, "maglev", Promise::MinimalDisruption, true);
        check(&mut kept, &built_in, "wlc", Promise::Weighted, true);
        eprintln!("{kept}");
        for row in &kept.rows {
            assert!(row.failures.is_empty() && row.passed > 0, "{row:?}");
        }
        assert_eq!(kept.rows[0].skipped.len(), 1, "first's ipvs plan: {:?}", kept.rows[0]);
    }
}
