//! The conformance suite in the real kernel: for each case, kpx runs in a
//! node namespace with the case's flags and manifests; every source
//! address of a flow gets its own namespace, every endpoint address a
//! namespace with echo servers on its ports; real TCP and UDP packets
//! check where each flow ends and whether it was masqueraded.
//!
//! ACCEPT to a node address is shown by a listener on the node answering;
//! ACCEPT elsewhere by a listener behind the destination: the node's
//! default route leads to a sink namespace that owns every such address and
//! answers on its port, so a DROP (no answer) cannot pass for an ACCEPT
//! (the sink's answer). SCTP flows run where the kernel has
//! SCTP; they, and packets to 127.0.0.1 from another host, are otherwise
//! traced only, with the reason printed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use kpx_netlab::routed::{attach, make_router};
use kpx_netlab::{EchoServer, Lab, Ns, Reply, Request};
use kpx_rules::model::{IpFamily, Protocol, join_host_port};

use crate::cases::{Case, Flow};
use crate::support::{KPX, plugin_cache, run_dirs};

const TIMEOUT: Duration = Duration::from_millis(700);
/// For REJECT flows: this kernel's IPv6 TCP acts only on the ICMPv6 error
/// to the retransmitted SYN (one second later; seen with tcpdump: the node
/// answers the first SYN at once), so refusals get room for one retry.
const REJECT_TIMEOUT: Duration = Duration::from_millis(2000);
/// The name the node's own listeners answer with.
const NODE_LISTENER: &str = "node";
/// The name the listeners behind untouched destinations answer with.
const SINK_LISTENER: &str = "sink";

struct CaseLab {
    node: Ns,
    /// Namespace by source address (and arrival interface).
    clients: BTreeMap<(IpAddr, Option<String>), Ns>,
    endpoints: BTreeMap<IpAddr, Ns>,
    _servers: Vec<EchoServer>,
    // Last: the namespaces outlive the servers in them.
    _lab: Lab,
}

fn endpoint_addresses(case: &Case) -> BTreeSet<(IpAddr, u16)> {
    let state = case.state();
    let mut out = BTreeSet::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        for port in case.service_ports(&state, family) {
            out.extend(port.endpoints.iter().map(|e| (e.ip, e.port)));
        }
    }
    out
}

fn build(case: &Case, mode: &str) -> Result<CaseLab, kpx_netlab::Error> {
    let mut lab = Lab::new()?;
    let node = lab.add("node")?;
    make_router(&node)?;
    for addr in &case.node.addresses {
        let len = if addr.is_ipv4() { "32" } else { "128" };
        node.ip(&["addr", "add", &format!("{addr}/{len}"), "dev", "lo"])?;
    }
    // The node's default route leads to a sink that answers nothing.
    let sink = lab.add("sink")?;
    attach(&node, "sink", &sink, &["192.0.2.254".parse().unwrap()])?;
    node.ip(&["route", "add", "default", "via", "192.0.2.254", "dev", "sink"])?;
    node.ip(&["-6", "route", "add", "default", "dev", "sink"])?;

    let mut endpoints = BTreeMap::new();
    let mut servers = Vec::new();
    let wanted = endpoint_addresses(case);
    let ips: BTreeSet<IpAddr> = wanted.iter().map(|(ip, _)| *ip).collect();
    for (i, ip) in ips.iter().enumerate() {
        let ns = lab.add(&format!("ep{i}"))?;
        attach(&node, &format!("ep{i}"), &ns, &[*ip])?;
        for (_, port) in wanted.iter().filter(|(e, _)| e == ip) {
            let name = join_host_port(ip, *port);
            servers.push(EchoServer::start(&ns, &name, &SocketAddr::new(*ip, *port).to_string())?);
        }
        endpoints.insert(*ip, ns);
    }
    // Listeners for flows that the rules leave untouched (ACCEPT) or drop:
    // on the node for its own addresses, else in the sink, which owns the
    // destination. A dropped packet never reaches either.
    let mut behind = BTreeSet::new();
    for flow in case.flows.iter().filter(|f| matches!(f.expected(mode), "ACCEPT" | "DROP")) {
        let (dst, port) = flow.destination();
        if !behind.insert((dst, port)) {
            continue;
        }
        let addr = SocketAddr::new(dst, port).to_string();
        if dst.is_loopback() || case.node.addresses.contains(&dst) {
            if let Ok(server) = EchoServer::start(&node, NODE_LISTENER, &addr) {
                servers.push(server);
            }
            continue;
        }
        let len = if dst.is_ipv4() { "32" } else { "128" };
        let _ = sink.ip(&["addr", "add", &format!("{dst}/{len}"), "dev", "lo"]);
        servers.push(EchoServer::start(&sink, SINK_LISTENER, &addr)?);
    }
    let mut clients = BTreeMap::new();
    for flow in &case.flows {
        let key = (flow.from, flow.iface.clone());
        let from_node = flow.from.is_loopback() || case.node.addresses.contains(&flow.from);
        if from_node || clients.contains_key(&key) || (endpoints.contains_key(&flow.from) && flow.iface.is_none()) {
            continue;
        }
        let n = clients.len();
        let ns = lab.add(&format!("c{n}"))?;
        let iface = flow.iface.clone().unwrap_or_else(|| format!("c{n}"));
        attach(&node, &iface, &ns, &[flow.from])?;
        clients.insert(key, ns);
    }
    Ok(CaseLab { node, clients, endpoints, _servers: servers, _lab: lab })
}

impl CaseLab {
    /// Where a flow starts, and the source address to bind (node flows).
    fn origin(&self, case: &Case, flow: &Flow) -> (&Ns, Option<IpAddr>) {
        if flow.from.is_loopback() || case.node.addresses.contains(&flow.from) {
            return (&self.node, Some(flow.from));
        }
        if let Some(ns) = self.clients.get(&(flow.from, flow.iface.clone())) {
            return (ns, None);
        }
        (&self.endpoints[&flow.from], Some(flow.from))
    }
}

/// Why a flow is left to the tracer.
fn kernel_skip(case: &Case, flow: &Flow) -> Option<String> {
    let from_node = flow.from.is_loopback() || case.node.addresses.contains(&flow.from);
    if flow.protocol() == Protocol::Sctp
        && let Err(why) = kpx_netlab::sctp_supported()
    {
        return Some(format!("this kernel has no SCTP sockets ({why})"));
    }
    if flow.destination().0.is_loopback() && !from_node {
        return Some("another host cannot send to 127.0.0.1".into());
    }
    None
}

fn check_flow(case: &Case, lab: &CaseLab, flow: &Flow, mode: &str) -> Result<String, String> {
    let expect = flow.expected(mode);
    let (ns, from) = lab.origin(case, flow);
    let (dst, port) = flow.destination();
    let timeout = if expect == "REJECT" { REJECT_TIMEOUT } else { TIMEOUT };
    let req = Request { to: SocketAddr::new(dst, port), from, timeout };
    let send = || match flow.protocol() {
        Protocol::Udp => req.udp(ns),
        Protocol::Sctp => req.sctp(ns),
        Protocol::Tcp => req.tcp(ns),
    };
    let expected: BTreeSet<String> = expect.split(", ").map(str::to_string).collect();
    match expect {
        "REJECT" => match send() {
            Reply::Refused => Ok("refused".into()),
            other => Err(format!("want refused, got {other:?}")),
        },
        "ACCEPT" if dst.is_loopback() || case.node.addresses.contains(&dst) => match send() {
            Reply::Answer { server, .. } if server == NODE_LISTENER => Ok("reached the node".into()),
            other => Err(format!("want the node's own listener, got {other:?}")),
        },
        "ACCEPT" => match send() {
            Reply::Answer { server, .. } if server == SINK_LISTENER => Ok("reached the destination untouched".into()),
            other => Err(format!("want the listener behind the destination, got {other:?}")),
        },
        "DROP" => match send() {
            Reply::Timeout => Ok("dropped".into()),
            other => Err(format!("want no answer (dropped), got {other:?}")),
        },
        _ => {
            let mut seen = BTreeSet::new();
            let attempts = if flow.sticky { 12 } else { 8 * expected.len() };
            for _ in 0..attempts {
                match send() {
                    Reply::Answer { server, seen_from } => {
                        if !expected.contains(&server) {
                            return Err(format!("answered by {server}, want one of {expect}"));
                        }
                        let masqueraded = seen_from != flow.from.to_string();
                        if masqueraded != flow.masquerades(mode) {
                            return Err(format!(
                                "{server} saw the client as {seen_from}: masquerade {masqueraded}, want {}",
                                flow.masquerades(mode)
                            ));
                        }
                        seen.insert(server);
                    }
                    other => return Err(format!("want an answer from {expect}, got {other:?}")),
                }
                if !flow.sticky && seen == expected {
                    break;
                }
            }
            if flow.sticky {
                if seen.len() != 1 {
                    return Err(format!("affinity: one client reached {seen:?}"));
                }
                return Ok(format!("sticky to {}", seen.iter().next().unwrap()));
            }
            if seen != expected {
                return Err(format!("reached only {seen:?} of {expect}"));
            }
            Ok(format!("reached {expect}"))
        }
    }
}

#[test]
fn iptables_mode_passes_every_case_in_the_kernel() {
    run("iptables");
}

#[test]
fn nftables_mode_passes_every_case_in_the_kernel() {
    run("nftables");
}

/// userspace mode relays every connection itself: the endpoint sees the
/// node, and where the mode differs by nature the case says so
/// (`expect_userspace`).
#[test]
fn userspace_mode_passes_every_case_in_the_kernel() {
    run("userspace");
}

/// ipvs mode needs a kernel with ip_vs: inside the qemu guest here (the
/// cases, kpx and its compiled plugins copied in).
#[test]
fn ipvs_mode_passes_every_case_in_the_kernel() {
    // Lexically (no `..`, no canonicalize): this also runs in the guest,
    // where only the copied files exist.
    let cases = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").join("tests/cases");
    let name = "conformance_kernel::ipvs_mode_passes_every_case_in_the_kernel";
    crate::ipvs::kpx_where_ipvs_is(name, &[cases], || run("ipvs"));
}

/// The runner itself: with no rules at all, a flow that must be dropped is
/// answered (by the listener behind it) and so fails, and an ACCEPT passes.
#[test]
fn the_kernel_runner_tells_drop_from_accept() {
    if let Err(kpx_netlab::Error::Unavailable(why)) = Lab::new() {
        eprintln!("SKIPPED the_kernel_runner_tells_drop_from_accept: {why}");
        return;
    }
    let case = Case::load_all().into_iter().find(|c| c.label().starts_with("23-")).expect("the ServiceCIDR case");
    let lab = build(&case, "nftables").unwrap();
    let drop = case.flows.iter().find(|f| f.expected("nftables") == "DROP").expect("a DROP flow");
    let err = check_flow(&case, &lab, drop, "nftables").unwrap_err();
    // Answered by the listener behind the destination, which a DROP must not be.
    assert!(err.contains(&format!("server: {SINK_LISTENER:?}")), "{err}");
    let mut accepted = drop.clone();
    accepted.expect = "ACCEPT".into();
    accepted.expect_nftables = None;
    check_flow(&case, &lab, &accepted, "nftables").unwrap();
}

fn run(mode: &str) {
    if let Err(kpx_netlab::Error::Unavailable(why)) = Lab::new() {
        eprintln!("SKIPPED conformance in the kernel ({mode}): {why}");
        return;
    }
    let (mut passed, mut skipped, mut failures) = (0, 0, Vec::new());
    let mut passed_v6 = 0;
    for case in Case::load_all() {
        let lab = build(&case, mode).unwrap_or_else(|e| panic!("{}: building the lab: {e}", case.label()));
        let (dir, manifests) = run_dirs("conformance");
        std::fs::write(manifests.join("case.yaml"), &case.manifests).unwrap();
        std::fs::write(manifests.join("node.yaml"), case.node_manifest()).unwrap();
        let mut args: Vec<String> = vec![
            "--manifests".into(),
            manifests.display().to_string(),
            "--hostname-override".into(),
            case.node.name.clone(),
            "--plugin-cache-dir".into(),
            plugin_cache(),
        ];
        args.extend(case.flags.iter().cloned());
        args.extend(["--proxy-mode".to_string(), mode.to_string()]);
        let log = dir.join("kpx.log");
        let file = std::fs::File::create(&log).unwrap();
        let mut kpx = lab
            .node
            .command(KPX)
            .args(&args)
            .env("NO_COLOR", "1")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        let families: BTreeSet<&str> =
            case.flows.iter().map(|f| if f.family() == IpFamily::V4 { "IPv4" } else { "IPv6" }).collect();
        let t0 = Instant::now();
        let synced = |log: &str| families.iter().all(|f| log.contains(&format!("synced rules family={f}")));
        while !synced(&std::fs::read_to_string(&log).unwrap_or_default()) && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(50));
        }
        for flow in &case.flows {
            if let Some(why) = kernel_skip(&case, flow) {
                skipped += 1;
                eprintln!("  {} / {}: traced only ({why})", case.label(), flow.name);
                continue;
            }
            match check_flow(&case, &lab, flow, mode) {
                Ok(_) => {
                    passed += 1;
                    passed_v6 += usize::from(flow.family() == IpFamily::V6);
                }
                Err(e) => failures.push(format!(
                    "{} / {}: {} -> {} {}: {e}\n    (the case: {})",
                    case.label(),
                    flow.name,
                    flow.from,
                    flow.to,
                    flow.proto,
                    case.about.trim()
                )),
            }
        }
        let _ = kpx.kill();
        let _ = kpx.wait();
        if !synced(&std::fs::read_to_string(&log).unwrap_or_default()) {
            failures.push(format!(
                "{}: kpx never synced:\n{}",
                case.label(),
                std::fs::read_to_string(&log).unwrap_or_default()
            ));
        }
        if !failures.is_empty() && std::env::var_os("KPX_KEEP_LOG").is_some() {
            eprintln!("{}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        drop(lab);
    }
    // "ipvs:" lines of the guest's console are shown by the host.
    eprintln!(
        "{}conformance (kernel, {mode}): {passed} flows passed ({passed_v6} IPv6), {skipped} traced only, {} failed",
        if mode == "ipvs" { "ipvs: " } else { "" },
        failures.len()
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
