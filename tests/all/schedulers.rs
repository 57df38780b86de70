//! Schedulers with real traffic, in the iptables and nftables modes: kpx
//! reads the annotations, plans through the built-in scheduler component
//! and the mode executes the plan in the kernel. Where a plan is a slot
//! table, the test predicts each client's endpoint from the same plan
//! (kpx-sched, Linux's jhash) and checks the kernel agrees, so the two
//! modes send one client to the same endpoint.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use kpx_netlab::node::NodeLab;
use kpx_netlab::{Reply, Request};
use kpx_sched::{Dest, Plan};

use crate::support::*;

/// A Service `name` (TCP port 80 → 8080) with annotations, and its slice
/// with annotations.
pub fn write_service(
    manifests: &std::path::Path,
    name: &str,
    ip: &str,
    svc_ann: &[(&str, &str)],
    eps: &[&str],
    slice_ann: &[(&str, &str)],
) {
    let ann = |pairs: &[(&str, &str)]| {
        if pairs.is_empty() {
            return String::new();
        }
        let body: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}: \"{v}\"")).collect();
        format!("  annotations: {{{}}}\n", body.join(", "))
    };
    let mut text = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: test\n{}spec:\n  clusterIP: {ip}\n  ports:\n  - {{name: tcp, port: 80, targetPort: 8080, protocol: TCP}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: test\n  labels: {{kubernetes.io/service-name: {name}}}\n{}addressType: IPv4\nports:\n- {{name: tcp, port: 8080, protocol: TCP}}\nendpoints:\n",
        ann(svc_ann),
        ann(slice_ann)
    );
    for ep in eps {
        text.push_str(&format!("- addresses: [{ep}]\n  conditions: {{ready: true}}\n"));
    }
    write_manifest(&manifests.join(format!("{name}.yaml")), &text);
}

pub fn tcp_from(lab: &NodeLab, from: Option<IpAddr>, to: &str) -> String {
    let request = Request { to: to.parse().unwrap(), from, timeout: Duration::from_millis(800) };
    match request.tcp(&lab.client) {
        Reply::Answer { server, .. } => server,
        other => format!("{other:?}"),
    }
}

/// Extra client addresses 192.168.100.100.. on the client's link.
pub fn client_addresses(lab: &NodeLab, n: usize) -> Vec<IpAddr> {
    (0..n)
        .map(|i| {
            let ip = format!("192.168.100.{}", 100 + i);
            lab.client.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]).expect("add a client address");
            ip.parse().unwrap()
        })
        .collect()
}

fn dests(lab: &NodeLab, weights: &[u32]) -> Vec<Dest> {
    lab.backends.iter().zip(weights).map(|(b, &w)| Dest::new(b.ip.parse().unwrap(), 8080, w)).collect()
}

/// The backend name (be1..) the plan's slot table sends `client` to.
fn predicted(lab: &NodeLab, plan: &Plan, client: IpAddr) -> String {
    let Plan::Slots(table) = plan else { panic!("not a slot plan: {plan:?}") };
    lab.backends[table.candidate_of(client) as usize].name.clone()
}

/// maglev (10.96.0.23), mh (.26), sh (.24) and dh (.27) over the four
/// backends: each client stays on one endpoint, clients spread (dh: one
/// endpoint per destination), and maglev's and mh's endpoint is the one
/// the plan predicts, the same computation in every mode.
fn hashing_checks(lab: &NodeLab, mode: &str, clients: &[IpAddr]) {
    let four = dests(lab, &[1, 1, 1, 1]);
    for (vip, name) in
        [("10.96.0.23:80", "maglev"), ("10.96.0.26:80", "mh"), ("10.96.0.24:80", "sh"), ("10.96.0.27:80", "dh")]
    {
        let plan = ["maglev", "mh"].contains(&name).then(|| kpx_sched::plan::plan(name, &[], &four).unwrap());
        let mut per_client: BTreeMap<IpAddr, String> = BTreeMap::new();
        for &c in clients {
            let answers: Vec<String> = (0..3).map(|_| tcp_from(lab, Some(c), vip)).collect();
            assert!(answers.iter().all(|a| a == &answers[0]), "{mode}: {name} sent client {c} to {answers:?}");
            assert!(answers[0].starts_with("be"), "{mode}: {name}: {answers:?}");
            if let Some(plan) = &plan {
                assert_eq!(answers[0], predicted(lab, plan, c), "{mode}: {name} sent {c} elsewhere than the plan");
            }
            per_client.insert(c, answers[0].clone());
        }
        let spread: std::collections::BTreeSet<_> = per_client.values().collect();
        eprintln!("{mode}: {name}: {} clients reached {spread:?}", clients.len());
        if name == "dh" {
            assert_eq!(spread.len(), 1, "{mode}: dh hashes the destination: one endpoint for all: {per_client:?}");
        } else {
            assert!(spread.len() >= 3, "{mode}: {name} does not spread clients: {per_client:?}");
        }
    }
}

fn scenario(mode: &str) {
    let Some(lab) = lab_or_skip(4, &format!("schedulers_with_real_traffic ({mode})")) else {
        return;
    };
    let (dir, manifests) = run_dirs(&format!("schedulers-{mode}"));
    let ips: Vec<String> = lab.backends.iter().map(|b| b.ip.clone()).collect();
    let all: Vec<&str> = ips.iter().map(String::as_str).collect();
    write_service(&manifests, "rr", "10.96.0.20", &[("kpx.dev/scheduler", "rr")], &all[..3], &[]);
    let weights = format!("{}=3,{}=1", ips[0], ips[1]);
    write_service(&manifests, "weighted", "10.96.0.21", &[], &all[..2], &[("kpx.dev/weights", &weights)]);
    write_service(
        &manifests,
        "wrr",
        "10.96.0.22",
        &[("kpx.dev/scheduler", "wrr")],
        &all[..2],
        &[("kpx.dev/weights", &weights)],
    );
    write_service(&manifests, "maglev", "10.96.0.23", &[("kpx.dev/scheduler", "maglev")], &all, &[]);
    write_service(&manifests, "sh", "10.96.0.24", &[("kpx.dev/scheduler", "sh")], &all, &[]);
    write_service(&manifests, "mh", "10.96.0.26", &[("kpx.dev/scheduler", "mh")], &all, &[]);
    write_service(&manifests, "dh", "10.96.0.27", &[("kpx.dev/scheduler", "dh")], &all, &[]);
    write_service(
        &manifests,
        "bad",
        "10.96.0.25",
        &[("kpx.dev/scheduler", "maglev"), ("kpx.dev/scheduler-params", "table-size=1000")],
        &all[..2],
        &[],
    );
    let args = kpx_args(&manifests, &["--proxy-mode", mode]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(
        kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)),
        "{mode}: no sync:\n{}",
        kpx.log()
    );

    // rr: connections rotate exactly through the three endpoints.
    let seen: Vec<String> = (0..12).map(|_| tcp_from(&lab, None, "10.96.0.20:80")).collect();
    for k in 3..12 {
        assert_eq!(seen[k], seen[k - 3], "{mode}: rr does not rotate: {seen:?}");
    }
    let distinct: std::collections::BTreeSet<_> = seen[..3].iter().collect();
    assert_eq!(distinct.len(), 3, "{mode}: rr does not reach every endpoint: {seen:?}");

    // wrr 3:1: exactly three of every four to be1.
    let seen: Vec<String> = (0..40).map(|_| tcp_from(&lab, None, "10.96.0.22:80")).collect();
    let be1 = seen.iter().filter(|s| *s == "be1").count();
    assert_eq!(be1, 30, "{mode}: wrr 3:1 sent {be1} of 40 to be1: {seen:?}");
    for w in seen.chunks(4) {
        assert_eq!(w.iter().filter(|s| *s == "be2").count(), 1, "{mode}: wrr rhythm: {seen:?}");
    }

    // Weights without a scheduler: kube-proxy's random choice, weighted 3:1.
    let n = 1000;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..n {
        *counts.entry(tcp_from(&lab, None, "10.96.0.21:80")).or_default() += 1;
    }
    let share = counts.get("be1").copied().unwrap_or(0) as f64 / n as f64;
    eprintln!("{mode}: weighted 3:1 random over {n} connections: {counts:?} (be1 {:.1}%)", share * 100.0);
    assert!(
        (share - 0.75).abs() <= 0.05,
        "{mode}: weights 3:1 gave be1 {:.1}% (75 ± 5 expected): {counts:?}",
        share * 100.0
    );

    // maglev, mh, sh and dh: one client, one endpoint; clients spread (dh:
    // one endpoint per destination); and maglev's and mh's endpoint is the
    // one the plan predicts (the same in every mode).
    let clients = client_addresses(&lab, 24);
    hashing_checks(&lab, mode, &clients);

    // A bad parameter: logged against the Service, which keeps the default.
    assert!(kpx.log().contains("test/bad:tcp") && kpx.log().contains("table-size=\"1000\""), "{}", kpx.log());
    let reached: std::collections::BTreeSet<String> = (0..30).map(|_| tcp_from(&lab, None, "10.96.0.25:80")).collect();
    assert_eq!(reached.len(), 2, "{mode}: the bad Service should keep kube-proxy's random choice: {reached:?}");

    // maglev when one of four endpoints goes: measured over the whole
    // slot table (client addresses hash into it uniformly), for each
    // endpoint going in turn; then checked against the kernel for the
    // test's clients when the third goes.
    let four = dests(&lab, &[1, 1, 1, 1]);
    let plan = kpx_sched::plan::plan("maglev", &[], &four).unwrap();
    let plan_without = |gone: usize| {
        let rest: Vec<Dest> = four.iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, d)| d.clone()).collect();
        (kpx_sched::plan::plan("maglev", &[], &rest).unwrap(), rest)
    };
    let Plan::Slots(b) = &plan else { unreachable!() };
    let mut fractions = Vec::new();
    for gone in 0..4 {
        let (Plan::Slots(a), rest) = plan_without(gone) else { unreachable!() };
        let moved =
            b.slots.iter().zip(&a.slots).filter(|(x, y)| four[**x as usize].ip != rest[**y as usize].ip).count();
        fractions.push(moved as f64 / b.slots.len() as f64);
    }
    let mean = fractions.iter().sum::<f64>() / 4.0;
    let shown: Vec<String> = fractions.iter().map(|f| format!("{:.1}%", f * 100.0)).collect();
    eprintln!(
        "{mode}: maglev over {} slots, one of 4 endpoints removed: {} of clients remapped (mean {:.1}%; 1/N = 25%)",
        b.slots.len(),
        shown.join(", "),
        mean * 100.0
    );
    // The tolerance, for every endpoint that may go: at most 1/N + 2 points.
    let worst = fractions.iter().cloned().fold(0.0, f64::max);
    assert!(worst <= 0.25 + 0.02, "maglev remapped {:.2}% of clients when one of 4 went", worst * 100.0);
    let (after, survivors) = plan_without(2);
    let name_after = |i: u32| {
        let ip = survivors[i as usize].ip.to_string();
        lab.backends.iter().find(|b| b.ip == ip).unwrap().name.clone()
    };
    let synced = kpx.log().matches("synced rules family=IPv4").count();
    write_service(
        &manifests,
        "maglev",
        "10.96.0.23",
        &[("kpx.dev/scheduler", "maglev")],
        &[all[0], all[1], all[3]],
        &[],
    );
    assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(20)), "{}", kpx.log());
    std::thread::sleep(Duration::from_millis(300));
    for &c in &clients {
        let got = tcp_from(&lab, Some(c), "10.96.0.23:80");
        let Plan::Slots(t) = &after else { unreachable!() };
        assert_eq!(got, name_after(t.candidate_of(c)), "{mode}: after the removal, client {c}");
    }
    assert!(!kpx.log().contains("sync failed"), "{}", kpx.log());
}

#[test]
fn schedulers_with_real_traffic_iptables() {
    scenario("iptables");
}

#[test]
fn schedulers_with_real_traffic_nftables() {
    scenario("nftables");
}

fn write_hold_service(manifests: &std::path::Path, name: &str, ip: &str, scheduler: &str, eps: &[&str], weights: &str) {
    let ann: Vec<(&str, &str)> = if weights.is_empty() { vec![] } else { vec![("kpx.dev/weights", weights)] };
    write_service(manifests, name, ip, &[("kpx.dev/scheduler", scheduler)], eps, &ann);
    // The service above targets 8080; these hold on 9090.
    let path = manifests.join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap().replace("port: 8080", "port: 9090");
    write_manifest(&path, &text);
}

fn counts(names: &[String]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for n in names {
        *out.entry(n.clone()).or_default() += 1;
    }
    out
}

/// lc, sed and nq, each a Service over three backends holding on 9090.
const LOAD_SCHEDULERS: [(&str, &str); 3] = [("lc", "10.96.0.30"), ("sed", "10.96.0.31"), ("nq", "10.96.0.32")];

/// The [`LOAD_SCHEDULERS`] Services, be3 at weight 0.
fn write_load_services(manifests: &std::path::Path, all: &[&str]) {
    let no_be3 = format!("{}=0", all[2]);
    for (s, ip) in LOAD_SCHEDULERS {
        write_hold_service(manifests, s, ip, s, all, &no_be3);
    }
}

/// lc, sed and nq from live load (conntrack, measured every 2 s): with
/// long-lived connections held on some endpoints, new connections go to
/// the idle ones.
fn load_scenario(mode: &str) {
    let Some(lab) = lab_or_skip(3, &format!("least_connection_from_live_load ({mode})")) else {
        return;
    };
    let _servers = HoldServers::start(&lab);
    let (dir, manifests) = run_dirs(&format!("load-{mode}"));
    let ips: Vec<String> = lab.backends.iter().map(|b| b.ip.clone()).collect();
    let all: Vec<&str> = ips.iter().map(String::as_str).collect();
    let schedulers = LOAD_SCHEDULERS;
    write_load_services(&manifests, &all);
    // A bad parameter to a scheduler that plans from load: refused at
    // every re-plan (every 2 s), said once.
    let bad = [("kpx.dev/scheduler", "lc"), ("kpx.dev/scheduler-params", "nope=1")];
    write_service(&manifests, "lcbad", "10.96.0.33", &bad, &all, &[]);
    let args = kpx_args(&manifests, &["--proxy-mode", mode]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)), "{}", kpx.log());
    let started = std::time::Instant::now();
    let mut streams = Vec::new();
    let mut lc_active: BTreeMap<String, usize> = BTreeMap::new();
    for (s, ip) in schedulers {
        let vip = format!("{ip}:80");
        // be3 has weight 0: four held connections land on be1 and be2.
        let held: Vec<String> = (0..4)
            .map(|_| {
                let (name, stream) = hold(&lab, &vip);
                streams.push(stream);
                name
            })
            .collect();
        let held_counts = counts(&held);
        if s == "lc" {
            lc_active = held_counts.clone();
        }
        assert!(!held_counts.contains_key("be3"), "{mode} {s}: a weight-0 endpoint took a connection: {held:?}");
        // be3 takes connections again: it and any endpoint holding none
        // are the idle ones.
        let synced = kpx.log().matches("synced rules family=IPv4").count();
        write_hold_service(&manifests, s, ip, s, &all, "");
        assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(20)), "{}", kpx.log());
        std::thread::sleep(Duration::from_millis(200));
        let idle: Vec<&str> = ["be1", "be2", "be3"].into_iter().filter(|b| !held_counts.contains_key(*b)).collect();
        let fresh: Vec<String> = (0..6).map(|_| hold(&lab, &vip).0).collect();
        eprintln!("{mode}: {s}: held {held_counts:?}; then 6 new connections went to {:?}", counts(&fresh));
        assert!(
            fresh.iter().all(|f| idle.contains(&f.as_str())),
            "{mode} {s}: new connections {fresh:?}, idle {idle:?}"
        );
    }
    // Measured again every 2 s: six more held connections land where the
    // plan pointed (it holds until the next measurement); after the
    // re-plan, new connections go to the least loaded.
    let before = kpx.log().matches("re-planned").count();
    for _ in 0..6 {
        let (name, stream) = hold(&lab, "10.96.0.30:80");
        *lc_active.entry(name).or_default() += 1;
        streams.push(stream);
    }
    let least = ["be1", "be2", "be3"].iter().map(|b| lc_active.get(*b).copied().unwrap_or(0)).min().unwrap();
    let least_loaded: Vec<&str> =
        ["be1", "be2", "be3"].into_iter().filter(|b| lc_active.get(*b).copied().unwrap_or(0) == least).collect();
    // One measurement interval (2 s) and the sync after it.
    std::thread::sleep(Duration::from_millis(3500));
    let replanned = kpx.log().matches("re-planned").count() > before;
    let after: Vec<String> = (0..4)
        .map(|_| {
            let (name, stream) = hold(&lab, "10.96.0.30:80");
            streams.push(stream);
            name
        })
        .collect();
    eprintln!("{mode}: lc, held {lc_active:?} (re-planned: {replanned}): new connections {:?}", counts(&after));
    assert!(
        after.iter().all(|a| least_loaded.contains(&a.as_str())),
        "{mode}: lc after the re-plan sent {after:?}; the least loaded are {least_loaded:?}"
    );
    // lcbad is planned again at every load measurement (every 2 s, whether
    // or not a plan changes) and refused each time: after 6 s, said once.
    if let Some(rest) = Duration::from_secs(6).checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    let said = kpx.log().lines().filter(|l| l.contains("WARN") && l.contains("test/lcbad")).count();
    assert!(said == 1, "{mode}: the bad parameter was logged {said} times in 6 s (once wanted):\n{}", kpx.log());
    assert!(!kpx.log().contains("sync failed"), "{}", kpx.log());
    drop(streams);
}

#[test]
fn least_connection_from_live_load_iptables() {
    load_scenario("iptables");
}

#[test]
fn least_connection_from_live_load_nftables() {
    load_scenario("nftables");
}

/// ipvs mode, where IPVS is (the qemu guest here): maglev and mh run the
/// very slot tables the other modes run (firewall marks the host sets per
/// slot), so each client reaches the endpoint the plan predicts, as in
/// the iptables and nftables scenarios above; the kernel's own sh and dh
/// keep one client on one endpoint.
fn ipvs_scenario() {
    let Some(lab) = lab_or_skip(4, "schedulers_in_ipvs_mode_in_a_real_kernel") else {
        return;
    };
    let (dir, manifests) = run_dirs("schedulers-ipvs");
    let ips: Vec<String> = lab.backends.iter().map(|b| b.ip.clone()).collect();
    let all: Vec<&str> = ips.iter().map(String::as_str).collect();
    write_service(&manifests, "maglev", "10.96.0.23", &[("kpx.dev/scheduler", "maglev")], &all, &[]);
    write_service(&manifests, "mh", "10.96.0.26", &[("kpx.dev/scheduler", "mh")], &all, &[]);
    write_service(&manifests, "sh", "10.96.0.24", &[("kpx.dev/scheduler", "sh")], &all, &[]);
    write_service(&manifests, "dh", "10.96.0.27", &[("kpx.dev/scheduler", "dh")], &all, &[]);
    let args = kpx_args(&manifests, &["--proxy-mode", "ipvs"]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(240)), "no sync:\n{}", kpx.log());
    let clients = client_addresses(&lab, 16);
    hashing_checks(&lab, "ipvs", &clients);
    assert!(!kpx.log().contains("sync failed"), "{}", kpx.log());
}

#[test]
fn schedulers_in_ipvs_mode_in_a_real_kernel() {
    crate::ipvs::kpx_where_ipvs_is("schedulers::schedulers_in_ipvs_mode_in_a_real_kernel", &[], ipvs_scenario);
}

/// ipvs mode (the qemu guest here): lc, sed and nq are the kernel's own,
/// per connection. With connections held open on be1 and be2 (be3 at
/// weight 0), be3 back at weight 1 takes the new ones while it is the
/// least loaded, and every new connection goes to a least-loaded endpoint.
fn ipvs_load_scenario() {
    let Some(lab) = lab_or_skip(3, "least_connection_in_ipvs_mode_in_a_real_kernel") else {
        return;
    };
    let _servers = HoldServers::start(&lab);
    let (dir, manifests) = run_dirs("load-ipvs");
    let ips: Vec<String> = lab.backends.iter().map(|b| b.ip.clone()).collect();
    let all: Vec<&str> = ips.iter().map(String::as_str).collect();
    let schedulers = LOAD_SCHEDULERS;
    write_load_services(&manifests, &all);
    let args = kpx_args(&manifests, &["--proxy-mode", "ipvs"]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(240)), "{}", kpx.log());
    let mut streams = Vec::new();
    for (s, ip) in schedulers {
        let vip = format!("{ip}:80");
        let mut active: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..4 {
            let (name, stream) = hold(&lab, &vip);
            *active.entry(name).or_default() += 1;
            streams.push(stream);
        }
        assert!(!active.contains_key("be3"), "ipvs {s}: a weight-0 endpoint took a connection: {active:?}");
        write_hold_service(&manifests, s, ip, s, &all, "");
        // Until IPVS holds be3 at weight 1 (a sync counted here may have
        // started before the file changed).
        let key = kpx::kernel::ipvs::ServiceKey::new(ip.parse().unwrap(), 6, 80);
        let t = std::time::Instant::now();
        loop {
            let k = key.clone();
            let weights = lab
                .node
                .enter(move || {
                    let mut ipvs = kpx::kernel::ipvs::Ipvs::open().expect("IPVS in the node");
                    ipvs.destinations(&k).map(|d| d.iter().map(|d| d.weight).collect::<Vec<u32>>()).unwrap_or_default()
                })
                .unwrap();
            if weights.len() == 3 && weights.iter().all(|w| *w == 1) {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "ipvs {s}: be3 never got weight 1: {weights:?}\n{}",
                kpx.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut fresh = Vec::new();
        for _ in 0..6 {
            let least = ["be1", "be2", "be3"].iter().map(|b| active.get(*b).copied().unwrap_or(0)).min().unwrap();
            let (name, stream) = hold(&lab, &vip);
            streams.push(stream);
            let had = active.get(&name).copied().unwrap_or(0);
            assert_eq!(
                had, least,
                "ipvs {s}: a new connection went to {name} holding {had}, not to a least-loaded one: {active:?}"
            );
            *active.entry(name.clone()).or_default() += 1;
            fresh.push(name);
        }
        eprintln!("ipvs: {s}: 6 new connections went to {fresh:?}");
        assert_eq!(&fresh[..2], ["be3", "be3"], "ipvs {s}: the idle endpoint first");
    }
    assert!(!kpx.log().contains("sync failed"), "{}", kpx.log());
    drop(streams);
}

#[test]
fn least_connection_in_ipvs_mode_in_a_real_kernel() {
    let name = "schedulers::least_connection_in_ipvs_mode_in_a_real_kernel";
    crate::ipvs::kpx_where_ipvs_is(name, &[], ipvs_load_scenario);
}

/// The test-only scheduler component (`plugins/first`), loaded from its file.
fn first_wasm() -> String {
    format!("{}/kpx_plugin_first.wasm", env!("KPX_TEST_PLUGIN_DIR"))
}

/// A scheduler component named with `--scheduler-plugin NAME=FILE` places
/// the Service's connections (`first`: every one on the first endpoint) in
/// a rule mode (its plan) and in userspace mode (its pick); without it,
/// the Service keeps the default and its connections spread.
#[test]
fn an_external_scheduler_component_places_connections() {
    let Some(lab) = lab_or_skip(3, "an_external_scheduler_component_places_connections") else {
        return;
    };
    let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    let plugin = format!("first={}", first_wasm());
    for (mode, with_plugin) in [("iptables", true), ("userspace", true), ("iptables", false)] {
        let (dir, manifests) = run_dirs(&format!("external-scheduler-{mode}"));
        write_service(&manifests, "web", "10.96.0.10", &[("kpx.dev/scheduler", "first")], &eps, &[]);
        let mut extra = vec!["--proxy-mode", mode];
        if with_plugin {
            extra.extend(["--scheduler-plugin", plugin.as_str()]);
        }
        let args = kpx_args(&manifests, &extra);
        let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
        assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
        let seen = servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 12);
        if with_plugin {
            assert_eq!(seen.len(), 1, "{mode}: every connection on one endpoint: {seen:?}\n{}", kpx.log());
            assert!(seen.keys().all(|k| k.starts_with("be")), "{seen:?}");
            assert!(kpx.log().contains("scheduler component: [\"first\"]"), "{}", kpx.log());
        } else {
            assert!(seen.len() > 1, "without the component the Service keeps the default: {seen:?}");
            assert!(kpx.log().contains("no scheduler is named \"first\""), "{}", kpx.log());
        }
    }
}

/// A component that is not a scheduler (here a backend), or a file that
/// is not there, stops kpx before it touches the kernel, naming what and why.
#[test]
fn a_scheduler_plugin_that_does_not_fit_is_refused() {
    let Some(lab) = lab_or_skip(1, "a_scheduler_plugin_that_does_not_fit_is_refused") else {
        return;
    };
    let hostile_file = format!("{}/kpx_plugin_hostile.wasm", env!("KPX_TEST_PLUGIN_DIR"));
    let hostile = format!("bad={hostile_file}");
    let wrong_kind = format!(
        "--scheduler-plugin {hostile_file} is a backend component; --scheduler-plugin takes a scheduler component"
    );
    for (value, want) in [
        (hostile.as_str(), wrong_kind.as_str()),
        ("gone=/nonexistent/x.wasm", "cannot read plugin /nonexistent/x.wasm"),
        ("NoCaps=/x.wasm", "NAME is 1 to 32 of a-z, 0-9 and '-'"),
    ] {
        let (dir, manifests) = run_dirs("bad-scheduler");
        let args = kpx_args(&manifests, &["--proxy-mode", "iptables", "--scheduler-plugin", value]);
        let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
        let t0 = std::time::Instant::now();
        while kpx.is_running() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!kpx.is_running(), "kpx went on with --scheduler-plugin {value}");
        let log = kpx.log();
        assert!(log.contains(want), "--scheduler-plugin {value}: want {want:?} in:\n{log}");
        assert!(!log.contains("synced rules"), "{log}");
        assert!(!kernel_rules(&lab).contains("KUBE-"), "kpx wrote rules before refusing");
    }
}
