//! The kit for scheduler components: the contract (names, plans every
//! mode can execute, per-connection picks that respect weights and
//! failures, the same answer from a fresh instance, the promises each name
//! states), each promise a name states and no other (`promises`: spread,
//! weighted, sticky, minimal disruption, least loaded, priority; a 0.2.0
//! component states none and is checked as spreading), hostile inputs,
//! and, for the names IPVS defines (rr, wrr, lc, wlc, sed, nq, sh, dh, mh)
//! and maglev, what the name implies where no stated promise checks it
//! already: the distribution checks of kpx's scheduler tests.

mod promises;

use std::net::IpAddr;

use kpx_rules::model::{Endpoint, Protocol, ProxyMode, ServicePort};
use kpx_rules::plan::Plan;

use super::Report;
use crate::runtime::{self, PickRequest, PickSetup, Promise, ScheduleRequest, SchedulerInstance, SchedulerPlugin};

/// What the kit requires of `names()`: what kpx requires to load it, and
/// names an annotation can carry as they are (a-z, 0-9 and -), each once.
pub fn names_problem(names: &[String]) -> Option<String> {
    if let Some(p) = runtime::scheduler::load_problem(names) {
        return Some(p);
    }
    if let Some(n) =
        names.iter().find(|n| !n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    {
        return Some(format!("names() gave {n:?}: a name is 1 to 64 of a-z, 0-9 and -"));
    }
    let mut sorted = names.to_vec();
    sorted.sort();
    sorted.dedup();
    (sorted.len() != names.len()).then(|| "names() gave a name twice".to_string())
}

/// Candidates `10.244.k.5:8080` (or `fd00:244::k` for IPv6), k from 1.
fn endpoints(n: usize, v6: bool) -> Vec<(IpAddr, u16)> {
    (1..=n)
        .map(|k| {
            let ip: IpAddr = if v6 {
                format!("fd00:244::{k:x}").parse().expect("an address")
            } else {
                format!("10.244.{}.{}", k / 250, k % 250 + 1).parse().expect("an address")
            };
            (ip, 8080)
        })
        .collect()
}

/// The `i`-th of many distinct clients.
fn client(i: usize, v6: bool) -> IpAddr {
    if v6 {
        format!("2001:db8::{:x}", i + 1).parse().expect("an address")
    } else {
        format!("198.{}.{}.{}", 18 + (i >> 16) % 2, (i >> 8) & 255, i & 255).parse().expect("an address")
    }
}

/// A well-mixed number for the `i`-th pick (the host's random).
fn random(i: usize) -> u32 {
    let mut s = i as u64;
    (runtime::wasi::splitmix64(&mut s) >> 32) as u32
}

/// One side of a service port set up for picks in an instance.
struct Picks<'a> {
    instance: &'a mut SchedulerInstance,
    id: u32,
    weights: Vec<u32>,
    active: Vec<u32>,
}

impl Picks<'_> {
    fn new<'a>(
        instance: &'a mut SchedulerInstance,
        id: u32,
        name: &str,
        parameters: &[(String, String)],
        destination: IpAddr,
        weights: &[u32],
    ) -> Result<Picks<'a>, Problem> {
        let v6 = destination.is_ipv6();
        let eps = endpoints(weights.len(), v6);
        let setup = PickSetup { name, parameters, service: "conformance/svc:p", destination, endpoints: &eps, weights };
        instance.prepare_picks(id, &setup)?;
        Ok(Picks { instance, id, weights: weights.to_vec(), active: vec![0; weights.len()] })
    }

    /// One connection from `client`; `failed` candidates already failed it.
    /// A pick of a weight-0 candidate is an error.
    fn pick(&mut self, client: IpAddr, failed: &[u32], i: usize) -> Result<Option<u32>, Problem> {
        let request = PickRequest { client, active: &self.active, failed, random: random(i) };
        let picked = self.instance.pick(self.id, &request)?;
        if let Some(k) = picked
            && self.weights[k as usize] == 0
        {
            return Err(Problem::Broken(format!("picked candidate {k}, whose weight is 0")));
        }
        Ok(picked)
    }

    /// A connection that stays open on the candidate picked.
    fn hold(&mut self, client: IpAddr, i: usize) -> Result<u32, Problem> {
        let k = self
            .pick(client, &[], i)?
            .ok_or_else(|| Problem::Broken("no candidate picked while every one may take it".into()))?;
        self.active[k as usize] += 1;
        Ok(k)
    }
}

/// The kit's service port over `eps` with `weights` (one each).
fn port_over(eps: &[(IpAddr, u16)], weights: &[u32]) -> ServicePort {
    let v6 = eps.first().is_some_and(|(ip, _)| ip.is_ipv6());
    let mut p = ServicePort::new("conformance", "svc", "p", Protocol::Tcp, 80);
    p.cluster_ip =
        Some(if v6 { "fd00:96::10".parse().expect("an address") } else { "10.96.0.10".parse().expect("an address") });
    p.endpoints = eps
        .iter()
        .zip(weights)
        .map(|(&(ip, port), &w)| Endpoint { weight: u16::try_from(w).unwrap_or(u16::MAX), ..Endpoint::ready(ip, port) })
        .collect();
    p
}

fn port(weights: &[u32], v6: bool) -> ServicePort {
    port_over(&endpoints(weights.len(), v6), weights)
}

/// Why a plan was not had.
#[derive(Debug, Clone)]
enum Problem {
    /// The scheduler's own refusal, with its reason (the host keeps the
    /// mode's default for the Service).
    Refused(String),
    /// A plan of a kind the mode cannot execute (the host refuses it; the
    /// "plans in M mode" row fails it).
    Unrunnable(String),
    /// A trap, or a plan the host cannot use.
    Broken(String),
}

impl Problem {
    fn text(self) -> String {
        match self {
            Problem::Refused(s) => format!("refused: {s}"),
            Problem::Unrunnable(s) | Problem::Broken(s) => s,
        }
    }
}

impl From<Problem> for String {
    fn from(p: Problem) -> String {
        p.text()
    }
}

impl From<runtime::Error> for Problem {
    fn from(e: runtime::Error) -> Problem {
        match e {
            runtime::Error::Failed { message, .. } => Problem::Refused(message),
            other => Problem::Broken(other.to_string()),
        }
    }
}

/// A plan for candidates with `weights` in `mode`, checked as the host
/// checks it, plus: no share for a weight-0 candidate. A scheduler that
/// plans from load is sent every candidate idle.
fn plan(
    instance: &mut SchedulerInstance,
    name: &str,
    parameters: &[(String, String)],
    mode: ProxyMode,
    weights: &[u32],
    v6: bool,
) -> Result<Plan, Problem> {
    let load = instance.uses_load(name)?.then(|| (vec![0; weights.len()], vec![0; weights.len()]));
    plan_over(instance, name, parameters, mode, &port(weights, v6), load)
}

/// A plan for every endpoint of `port` in `mode` with `load` (active and
/// inactive connections per candidate), checked as [`plan`] checks it.
fn plan_over(
    instance: &mut SchedulerInstance,
    name: &str,
    parameters: &[(String, String)],
    mode: ProxyMode,
    port: &ServicePort,
    load: Option<(Vec<u32>, Vec<u32>)>,
) -> Result<Plan, Problem> {
    let n = port.endpoints.len();
    let candidates: Vec<u32> = (0..n as u32).collect();
    let request = ScheduleRequest { name, parameters, mode, port, candidates: &candidates, load };
    let plan = instance.schedule(&request)?;
    plan.check(n).map_err(|e| Problem::Broken(format!("a plan the host refuses: {e}")))?;
    if !plan.runs_in(mode) {
        let hint = if mode == ProxyMode::Ipvs {
            "return a Kernel plan (an IPVS scheduler) or a slot table, or refuse the mode"
        } else {
            "return a weighted choice, a rotation or a slot table, or refuse the mode"
        };
        return Err(Problem::Unrunnable(format!("a plan {mode} mode cannot execute ({hint}): {plan:?}")));
    }
    let zero = |k: usize| port.endpoints[k].weight == 0;
    if let Some(k) = shares(&plan, n).and_then(|s| (0..n).find(|&k| zero(k) && s[k] > 0.0)) {
        return Err(Problem::Broken(format!("candidate {k} has weight 0, yet the plan gives it connections")));
    }
    Ok(plan)
}

/// Each candidate's share of new connections under a plan (None for
/// IPVS's own schedulers, which the kernel runs).
fn shares(plan: &Plan, n: usize) -> Option<Vec<f64>> {
    let mut counts = vec![0f64; n];
    let mut add = |list: &[u32]| {
        for &i in list {
            counts[i as usize] += 1.0;
        }
    };
    match plan {
        Plan::Weighted(w) => counts = w.iter().map(|&x| f64::from(x)).collect(),
        Plan::Sequence(s) => add(s),
        Plan::Slots(t) => add(&t.slots),
        Plan::Kernel(_) => return None,
    }
    let total: f64 = counts.iter().sum();
    Some(counts.iter().map(|c| c / total.max(1.0)).collect())
}

/// Every check of a scheduler component.
pub fn check(report: &mut Report, plugin: &SchedulerPlugin) {
    let mut instance = match plugin.instantiate() {
        Ok(i) => i,
        Err(e) => {
            report.row("contract: instantiates and names its schedulers").fail(e.to_string());
            return;
        }
    };
    let names = instance.names().to_vec();
    report.row("contract: instantiates and names its schedulers").record(match names_problem(&names) {
        Some(p) => Err(p),
        None => Ok(()),
    });
    let never = PickRequest { client: client(0, false), active: &[0], failed: &[], random: 0 };
    report.row("contract: a pick for an id never set up is refused").record(match instance.pick(u32::MAX, &never) {
        Err(runtime::Error::Failed { .. }) => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(p) => Err(format!("picked {p:?}")),
    });
    for name in names.iter().take(64) {
        per_name(report, plugin, name);
    }
}

/// A fresh instance, or the row's failure.
fn fresh(plugin: &SchedulerPlugin) -> Result<SchedulerInstance, String> {
    plugin.instantiate().map_err(|e| e.to_string())
}

const WEIGHTS: [&[u32]; 6] = [&[1], &[1, 1, 1], &[3, 1], &[1; 10], &[2, 0, 2], &[1; 100]];

fn per_name(report: &mut Report, plugin: &SchedulerPlugin, name: &str) {
    let row = |what: &str| format!("{name}: {what}");
    // Plans, in every mode that runs plans, and the same from a fresh
    // instance. A mode the scheduler refuses as a whole is shown, not
    // failed (the host keeps the mode's default there); a refusal of some
    // candidate sets only, a trap or a plan the host cannot use fails.
    let mut planned_somewhere = false;
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables, ProxyMode::Ipvs] {
        let what = row(&format!("plans in {mode} mode"));
        let mut outcomes = Vec::new();
        for weights in WEIGHTS {
            for v6 in [false, true] {
                let outcome = fresh(plugin).map_err(Problem::Broken).and_then(|mut a| {
                    let first = plan(&mut a, name, &[], mode, weights, v6)?;
                    let again = plan(&mut fresh(plugin).map_err(Problem::Broken)?, name, &[], mode, weights, v6)?;
                    if first != again {
                        return Err(Problem::Broken("a fresh instance planned otherwise".into()));
                    }
                    Ok(())
                });
                outcomes.push((format!("{}{}", weights_label(weights), v6_label(v6)), outcome));
            }
        }
        let refused_all = outcomes.iter().all(|(_, o)| matches!(o, Err(Problem::Refused(_))));
        if refused_all && let Some((_, Err(Problem::Refused(why)))) = outcomes.first() {
            report.row(&what).note(format!("refuses {mode} mode: {why}"));
            continue;
        }
        planned_somewhere = true;
        for (label, outcome) in outcomes {
            report.row(&what).record(outcome.map_err(|p| format!("{label}: {}", p.text())));
        }
    }
    report.row(&row("plans in at least one mode")).record(if planned_somewhere {
        Ok(())
    } else {
        Err("every mode refused".into())
    });
    let stated = promises::stated(report, plugin, name);
    // Per-connection picks (userspace mode).
    let picks_row = row("per-connection picks respect weights and failures");
    let first_pick = fresh(plugin).and_then(|mut i| {
        let mut p = Picks::new(&mut i, 1, name, &[], dest(0, false), &[1, 1])?;
        p.pick(client(0, false), &[], 0).map(|_| ()).map_err(String::from)
    });
    let picks = !matches!(&first_pick, Err(e) if e.contains("has no per-connection pick"));
    if picks {
        report.row(&picks_row).record(fresh(plugin).and_then(|mut i| valid_picks(&mut i, name)));
        report.row(&row("same connections, same picks from a fresh instance")).record(same_picks(plugin, name));
    } else {
        report.row(&picks_row).skip("no per-connection pick: userspace mode places its connections round robin");
    }
    for &promise in &stated {
        promises::check(report, plugin, name, promise, picks);
    }
    if picks {
        named(report, plugin, name, &stated);
    } else {
        named_plans(report, plugin, name, &stated);
    }
    hostile(report, plugin, name, picks);
}

fn v6_label(v6: bool) -> &'static str {
    if v6 { ", IPv6" } else { "" }
}

/// Weights as a row shows them (long equal lists counted).
fn weights_label(weights: &[u32]) -> String {
    match weights {
        [first, ..] if weights.len() > 10 && weights.iter().all(|w| w == first) => {
            format!("{} candidates of weight {first}", weights.len())
        }
        _ => format!("weights {weights:?}"),
    }
}

/// The `i`-th Service destination.
fn dest(i: usize, v6: bool) -> IpAddr {
    if v6 {
        format!("fd00:96::{:x}", i + 16).parse().expect("an address")
    } else {
        format!("10.96.{}.{}", i / 250, i % 250 + 1).parse().expect("an address")
    }
}

/// With every candidate able to take it, a connection is placed; a
/// weight-0 or failed candidate is never picked (a scheduler may leave a
/// connection unplaced then, as IPVS's dh does when its bucket's
/// destination is unavailable); with none able, nothing is picked.
fn valid_picks(instance: &mut SchedulerInstance, name: &str) -> Result<(), String> {
    let mut all = Picks::new(instance, 1, name, &[], dest(0, false), &[1, 1, 1, 1])?;
    for i in 0..200 {
        all.pick(client(i, false), &[], i)?.ok_or("no candidate picked while every one may take it")?;
    }
    let mut p = Picks::new(instance, 2, name, &[], dest(0, false), &[1, 0, 1, 1])?;
    for i in 0..200 {
        p.pick(client(i, false), &[], i)?;
        if let Some(k) = p.pick(client(i, false), &[0, 2], i)?
            && k != 3
        {
            return Err(format!("picked {k} with 0 and 2 failed and 1 at weight 0"));
        }
    }
    match p.pick(client(0, false), &[0, 2, 3], 0)? {
        None => Ok(()),
        Some(k) => Err(format!("picked {k} when every candidate failed or has weight 0")),
    }
}

fn same_picks(plugin: &SchedulerPlugin, name: &str) -> Result<(), String> {
    let run = || -> Result<Vec<u32>, String> {
        let mut instance = fresh(plugin)?;
        let mut p = Picks::new(&mut instance, 7, name, &[], dest(0, false), &[2, 1, 1, 3])?;
        (0..300).map(|i| p.hold(client(i % 37, false), i).map_err(String::from)).collect()
    };
    if run()? == run()? { Ok(()) } else { Err("300 picks differ between two fresh instances".into()) }
}

/// 64 destinations × 16 clients over 4 equal candidates, connections held:
/// each candidate takes at least half its fair share.
fn spread(instance: &mut SchedulerInstance, name: &str) -> Result<(), String> {
    let mut counts = [0usize; 4];
    for d in 0..64 {
        let mut p = Picks::new(instance, 100 + d as u32, name, &[], dest(d, false), &[1, 1, 1, 1])?;
        for c in 0..16 {
            counts[p.hold(client(d * 16 + c, false), d * 16 + c)? as usize] += 1;
        }
        instance.forget_picks(100 + d as u32).map_err(|e| e.to_string())?;
    }
    if counts.iter().any(|&c| c < 1024 / 8) {
        return Err(format!(
            "1,024 connections over 4 equal endpoints went {counts:?} (each should take at least 128)"
        ));
    }
    Ok(())
}

/// Plan-level behaviour of the names kpx knows, for components that only
/// plan, unless a stated promise checks it already (wrr's `weighted`).
fn named_plans(report: &mut Report, plugin: &SchedulerPlugin, name: &str, promises: &[Promise]) {
    if name == "wrr" && !promises.contains(&Promise::Weighted) {
        let outcome = fresh(plugin).and_then(|mut i| {
            let plan = plan(&mut i, name, &[], ProxyMode::Nftables, &[3, 1], false).map_err(Problem::text)?;
            let s = shares(&plan, 2).ok_or("no shares")?;
            within(s[0], 0.75, 0.05, "weight 3 of 3:1")
        });
        report.row("wrr: shares follow the weights (3:1 within ±5 points)").record(outcome);
    }
}

fn within(got: f64, want: f64, tolerance: f64, what: &str) -> Result<(), String> {
    if (got - want).abs() <= tolerance {
        Ok(())
    } else {
        Err(format!("{what}: {:.1} %, want {:.1} ± {:.1} points", got * 100.0, want * 100.0, tolerance * 100.0))
    }
}

/// What the names IPVS defines (and maglev) imply, checked pick by pick,
/// unless a stated promise checks it already (the name's own check would
/// run the same picks twice).
fn named(report: &mut Report, plugin: &SchedulerPlugin, name: &str, promises: &[Promise]) {
    let check = |f: &dyn Fn(&mut SchedulerInstance) -> Result<(), String>| fresh(plugin).and_then(|mut i| f(&mut i));
    let stated = |p: Promise| promises.contains(&p);
    match name {
        "rr" => {
            let outcome = check(&|i| {
                let mut p = Picks::new(i, 1, name, &[], dest(0, false), &[1, 1, 1])?;
                let got: Vec<u32> = (0..9)
                    .map(|k| p.pick(client(k, false), &[], k)?.ok_or("none".to_string()))
                    .collect::<Result<_, String>>()?;
                let first = got[0];
                let want: Vec<u32> = (0..9).map(|k| (first + k) % 3).collect();
                if got == want { Ok(()) } else { Err(format!("picks {got:?}, want a rotation {want:?}")) }
            });
            report.row("rr: rotates exactly").record(outcome);
        }
        "wrr" if !stated(Promise::Weighted) => {
            let outcome = check(&|i| {
                let mut p = Picks::new(i, 1, name, &[], dest(0, false), &[3, 1])?;
                let picks: Vec<u32> = (0..1000)
                    .map(|k| p.pick(client(k, false), &[], k)?.ok_or("none".into()))
                    .collect::<Result<_, String>>()?;
                within(picks.iter().filter(|&&k| k == 0).count() as f64 / 1000.0, 0.75, 0.05, "weight 3 of 3:1")
            });
            report.row("wrr: shares follow the weights (3:1 within ±5 points over 1,000)").record(outcome);
        }
        "lc" | "wlc" | "sed" | "nq" if !stated(Promise::LeastLoaded) => {
            let outcome = check(&|i| least_loaded_picks(i, name));
            report.row(&format!("{name}: new connections go to the least loaded endpoint")).record(outcome);
        }
        "sh" | "mh" | "maglev" | "dh" => {
            if !stated(Promise::Sticky) {
                let key = if name == "dh" { "destination" } else { "client" };
                report.row(&format!("{name}: one {key}, one endpoint")).record(check(&|i| sticky_picks(i, name)));
            }
            if name == "maglev" && !stated(Promise::MinimalDisruption) {
                report
                    .row(&format!("{name}: one of 4 endpoints gone remaps at most 1/4 + 2 points of clients"))
                    .record(check(&|i| remap(i, name)));
            }
        }
        _ => {}
    }
}

/// With 5, 0, 5, 5 connections held the idle candidate takes the next;
/// with 3, 1, 2, 4 the one holding 1.
fn least_loaded_picks(instance: &mut SchedulerInstance, name: &str) -> Result<(), String> {
    let mut p = Picks::new(instance, 1, name, &[], dest(0, false), &[1, 1, 1, 1])?;
    p.active = vec![5, 0, 5, 5];
    match p.pick(client(0, false), &[], 0)? {
        Some(1) => {}
        other => return Err(format!("with 5, 0, 5, 5 connections held, picked {other:?}, want the idle 1")),
    }
    p.active = vec![3, 1, 2, 4];
    match p.pick(client(1, false), &[], 1)? {
        Some(1) => Ok(()),
        other => Err(format!("with 3, 1, 2, 4 connections held, picked {other:?}, want 1")),
    }
}

/// 50 clients to one destination over 5 equal candidates, each picked 5
/// times with other random numbers: the same candidate every time.
fn sticky_picks(instance: &mut SchedulerInstance, name: &str) -> Result<(), String> {
    let mut p = Picks::new(instance, 1, name, &[], dest(0, false), &[1, 1, 1, 1, 1])?;
    for c in 0..50 {
        let first = p.pick(client(c, false), &[], 0)?;
        for k in 1..5 {
            let again = p.pick(client(c, false), &[], k * 7919)?;
            if again != first {
                return Err(format!("client {} went to {first:?}, then {again:?}", client(c, false)));
            }
        }
    }
    Ok(())
}

/// 20,000 clients over 4 endpoints, then over 3 of them, each endpoint
/// going in turn: the share of clients that moves (the scheduler issue's
/// tolerance: at most 1/N + 2 points).
fn remap(instance: &mut SchedulerInstance, name: &str) -> Result<(), String> {
    const CLIENTS: usize = 20_000;
    let four = endpoints(4, false);
    let place = |instance: &mut SchedulerInstance, id: u32, eps: &[(IpAddr, u16)]| -> Result<Vec<IpAddr>, String> {
        let weights = vec![1; eps.len()];
        let setup = PickSetup {
            name,
            parameters: &[],
            service: "conformance/svc:p",
            destination: dest(0, false),
            endpoints: eps,
            weights: &weights,
        };
        instance.prepare_picks(id, &setup).map_err(|e| e.to_string())?;
        let active = vec![0; eps.len()];
        (0..CLIENTS)
            .map(|c| {
                let request = PickRequest { client: client(c, false), active: &active, failed: &[], random: random(c) };
                let k = instance.pick(id, &request).map_err(|e| e.to_string())?.ok_or("none")?;
                Ok(eps[k as usize].0)
            })
            .collect()
    };
    let before = place(instance, 1, &four)?;
    let mut worst = 0f64;
    for gone in 0..4 {
        let rest: Vec<(IpAddr, u16)> = four.iter().enumerate().filter(|(k, _)| *k != gone).map(|(_, e)| *e).collect();
        let after = place(instance, 2 + gone as u32, &rest)?;
        let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count() as f64 / CLIENTS as f64;
        worst = worst.max(moved);
    }
    if worst <= 0.25 + 0.02 {
        Ok(())
    } else {
        Err(format!("{:.1} % of 20,000 clients moved when one endpoint went", worst * 100.0))
    }
}

/// Hostile but valid requests: no trap, and a valid answer or the
/// scheduler's own refusal (shown in the table's notes).
fn hostile(report: &mut Report, plugin: &SchedulerPlugin, name: &str, picks: bool) {
    let attempt = |f: &dyn Fn(&mut SchedulerInstance) -> Result<(), Problem>| {
        fresh(plugin).map_err(Problem::Broken).and_then(|mut i| f(&mut i))
    };
    let big: Vec<u32> = vec![1; 1000];
    let inputs: Vec<(&str, Result<(), Problem>)> = vec![
        (
            "1,000 candidates",
            attempt(&|i| {
                plan(i, name, &[], ProxyMode::Nftables, &big, false)?;
                if picks {
                    let mut p = Picks::new(i, 1, name, &[], dest(0, false), &big)?;
                    p.hold(client(0, false), 0)?;
                }
                Ok(())
            }),
        ),
        (
            "weights at the maximum (65,535)",
            attempt(&|i| {
                plan(i, name, &[], ProxyMode::Iptables, &[65535, 1, 65535], false)?;
                if picks {
                    let mut p = Picks::new(i, 1, name, &[], dest(0, false), &[65535, 1, 65535])?;
                    p.hold(client(0, false), 0)?;
                }
                Ok(())
            }),
        ),
        (
            "IPv6 candidates and clients",
            attempt(&|i| {
                plan(i, name, &[], ProxyMode::Nftables, &[1, 2, 3], true)?;
                if picks {
                    let mut p = Picks::new(i, 1, name, &[], dest(0, true), &[1, 2, 3])?;
                    for c in 0..50 {
                        p.hold(client(c, true), c)?;
                    }
                }
                Ok(())
            }),
        ),
        (
            "every candidate at weight 0",
            attempt(&|i| {
                plan(i, name, &[], ProxyMode::Iptables, &[0, 0, 0], false)?;
                if picks {
                    let mut p = Picks::new(i, 1, name, &[], dest(0, false), &[0, 0, 0])?;
                    if let Some(k) = p.pick(client(0, false), &[], 0)? {
                        return Err(Problem::Broken(format!("picked {k} at weight 0")));
                    }
                }
                Ok(())
            }),
        ),
    ];
    for (what, outcome) in inputs {
        let row = report.row(&format!("hostile input: {name}: {what}"));
        match outcome {
            Ok(()) => row.pass(),
            Err(Problem::Refused(why)) => {
                row.pass();
                row.note(format!("refused: {why}"));
            }
            Err(p @ (Problem::Broken(_) | Problem::Unrunnable(_))) => row.fail(p.text()),
        }
    }
    let params = [("no-such-parameter".to_string(), "1".to_string())];
    let outcome = attempt(&|i| match plan(i, name, &params, ProxyMode::Nftables, &[1, 1], false) {
        Err(Problem::Refused(e)) if e.contains("no-such-parameter") => Ok(()),
        Err(p) => Err(Problem::Broken(format!("not refused by name: {}", p.text()))),
        Ok(p) => Err(Problem::Broken(format!("planned {p:?}"))),
    });
    report
        .row(&format!("hostile input: {name}: an unknown parameter is refused by name"))
        .record(outcome.map_err(Problem::text));
}
