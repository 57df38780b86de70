//! The conformance flows in the real kernel (`kpx conformance --kernel`,
//! and the integration tests): for each case, kpx runs in a node namespace
//! with the case's flags and manifests; every source address of a flow gets
//! its own namespace, every endpoint address a namespace with echo servers
//! on its ports; real TCP, UDP and SCTP packets check where each flow ends
//! and whether it was masqueraded.
//!
//! ACCEPT to a node address is shown by a listener on the node answering;
//! ACCEPT elsewhere by a listener behind the destination: the node's
//! default route leads to a sink namespace that owns every such address and
//! answers on its port, so a DROP (no answer) cannot pass for an ACCEPT
//! (the sink's answer). SCTP flows run where the kernel has SCTP; they,
//! and packets to 127.0.0.1 from another host, are otherwise left to the
//! tracer, with the reason.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use kpx_netlab::routed::{attach, make_router};
use kpx_netlab::{EchoServer, Lab, Ns, Reply, Request};
use kpx_rules::model::{IpFamily, Protocol, join_host_port};

use super::Report;
use super::cases::{Case, Flow};
use super::tracer::flows_row;

/// How long a connection waits for an answer (or a refusal) before it
/// counts as dropped: under a TCP SYN's first retransmission (1 s), so a
/// dropped connection sends one packet.
pub const TIMEOUT: Duration = Duration::from_millis(700);
/// How long a case waits for kpx's first sync: the first case compiles the
/// component (into the cache the others use), which took over 20 s in the
/// ipvs tests' 2-vCPU qemu guest.
const FIRST_SYNC: Duration = Duration::from_secs(90);
/// For REJECT flows: this kernel's IPv6 TCP acts only on the ICMPv6 error
/// to the retransmitted SYN (one second later; seen with tcpdump: the node
/// answers the first SYN at once), so refusals get room for one retry.
pub const REJECT_TIMEOUT: Duration = Duration::from_millis(2000);
/// The name the node's own listeners answer with.
pub const NODE_LISTENER: &str = "node";
/// The name the listeners behind untouched destinations answer with.
pub const SINK_LISTENER: &str = "sink";
/// The sink's addresses (IPv4, IPv6), on its link to the node: no client
/// may have them.
pub const SINK_ADDRESSES: [&str; 2] = ["192.0.2.254", "2001:db8:ffff:ffff::fe"];

pub struct CaseLab {
    node: Ns,
    /// Namespace by source address (and arrival interface).
    clients: BTreeMap<(IpAddr, Option<String>), Ns>,
    endpoints: BTreeMap<IpAddr, Ns>,
    _servers: Vec<EchoServer>,
    // Last: the namespaces outlive the servers in them.
    _lab: Lab,
}

/// Every endpoint (address, port) of the case's state, both families: each
/// address gets a namespace with echo servers on its ports.
pub fn endpoint_addresses(case: &Case) -> BTreeSet<(IpAddr, u16)> {
    let Ok(state) = case.state() else { return BTreeSet::new() };
    let mut out = BTreeSet::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        for port in case.service_ports(&state, family) {
            out.extend(port.endpoints.iter().map(|e| (e.ip, e.port)));
        }
    }
    out
}

pub fn build(case: &Case, mode: &str) -> Result<CaseLab, kpx_netlab::Error> {
    let mut lab = Lab::new()?;
    let node = lab.add("node")?;
    make_router(&node)?;
    for addr in &case.node.addresses {
        let len = if addr.is_ipv4() { "32" } else { "128" };
        node.ip(&["addr", "add", &format!("{addr}/{len}"), "dev", "lo"])?;
    }
    // The node's default routes lead to a sink that answers nothing but
    // the listeners below. Both go via an address of the sink's link: a
    // route on the link alone would need the sink to answer neighbour
    // discovery for the addresses it holds on lo, which IPv6 does not.
    let sink = lab.add("sink")?;
    let [sink_v4, sink_v6] = SINK_ADDRESSES;
    attach(&node, "sink", &sink, &[sink_v4.parse().unwrap(), sink_v6.parse().unwrap()])?;
    node.ip(&["route", "add", "default", "via", sink_v4, "dev", "sink"])?;
    node.ip(&["-6", "route", "add", "default", "via", sink_v6, "dev", "sink"])?;

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
        if flow.from_node(case)
            || clients.contains_key(&key)
            || (endpoints.contains_key(&flow.from) && flow.iface.is_none())
        {
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
    /// The node's namespace, where kpx runs.
    pub fn node(&self) -> &Ns {
        &self.node
    }

    /// Where a flow starts, and the source address to bind (node flows).
    pub fn origin(&self, case: &Case, flow: &Flow) -> (&Ns, Option<IpAddr>) {
        if flow.from_node(case) {
            return (&self.node, Some(flow.from));
        }
        if let Some(ns) = self.clients.get(&(flow.from, flow.iface.clone())) {
            return (ns, None);
        }
        (&self.endpoints[&flow.from], Some(flow.from))
    }
}

/// Why a flow is left to the tracer.
pub fn kernel_skip(case: &Case, flow: &Flow) -> Option<String> {
    let from_node = flow.from_node(case);
    if let Some(why) = &flow.traced_only {
        return Some(why.clone());
    }
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

pub fn check_flow(case: &Case, lab: &CaseLab, flow: &Flow, mode: &str) -> Result<String, String> {
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
            // Random choice: n endpoints all seen within 16n tries but
            // for a chance of n(1-1/n)^16n (2^-31 for two): a few hundred
            // such flows a run must not fail by chance. Tries stop once
            // every endpoint answered.
            let attempts = if flow.sticky { 12 } else { 16 * expected.len() };
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

/// `kpx conformance --kernel`: every case's flows with kpx running the
/// component (`builtin:NAME` or a file) in `mode`.
pub fn check(
    report: &mut Report,
    component: &str,
    mode: kpx_rules::model::ProxyMode,
    kpx: &Path,
    cache: Option<&Path>,
    params: &[String],
) {
    if let Err(e) = Lab::new() {
        report.row("flows (kernel)").fail(format!("cannot build network namespaces: {e}"));
        return;
    }
    let mut extra = Vec::new();
    if !component.starts_with("builtin:") {
        let file = std::path::absolute(component).unwrap_or_else(|_| component.into());
        extra.extend(["--backend-plugin".to_string(), file.display().to_string()]);
    }
    if let Some(dir) = cache {
        extra.extend(["--plugin-cache-dir".to_string(), dir.display().to_string()]);
    }
    for p in params {
        extra.extend(["--backend-param".to_string(), p.clone()]);
    }
    flows(report, kpx, mode.as_str(), &extra);
}

/// Every case's flows through `kpx` (the binary) in the real kernel, in
/// `mode`, with `extra` arguments: a row per case, a check per flow.
pub fn flows(report: &mut Report, kpx: &Path, mode: &str, extra: &[String]) {
    for (i, case) in Case::all().into_iter().enumerate() {
        let row = flows_row(&case, "kernel");
        if let Err(e) = one_case(report, &row, &case, i, kpx, mode, extra) {
            report.row(&row).fail(e);
        }
    }
}

fn one_case(
    report: &mut Report,
    row: &str,
    case: &Case,
    index: usize,
    kpx: &Path,
    mode: &str,
    extra: &[String],
) -> Result<(), String> {
    let lab = build(case, mode).map_err(|e| format!("building the namespaces: {e}"))?;
    with_kpx(case, &lab, &format!("conformance-{mode}-{index}"), kpx, mode, extra, |_| {
        for flow in &case.flows {
            if let Some(why) = kernel_skip(case, flow) {
                report.row(row).skip(format!("{}: traced only ({why})", flow.name));
                continue;
            }
            let outcome = check_flow(case, &lab, flow, mode)
                .map(|_| ())
                .map_err(|e| format!("{}: {} -> {} {}: {e}", flow.name, flow.from, flow.to, flow.proto));
            report.row(row).record(outcome);
        }
    })
}

/// Runs `body` while kpx runs `case` in `lab`'s node namespace (in
/// `mode`, with `extra` arguments), once kpx synced every family of the
/// case's flows; `body` gets kpx's log file. kpx is stopped and its
/// scratch directory (named from `scratch`) removed afterwards. The error
/// says why `body` did not run: kpx did not sync (the end of its log), or
/// its files could not be written.
pub fn with_kpx<T>(
    case: &Case,
    lab: &CaseLab,
    scratch: &str,
    kpx: &Path,
    mode: &str,
    extra: &[String],
    body: impl FnOnce(&Path) -> T,
) -> Result<T, String> {
    let (dir, manifests) = crate::scratch::fresh_dir(scratch)?;
    let io = |e: std::io::Error| format!("{}: {e}", dir.display());
    std::fs::write(manifests.join("case.yaml"), &case.manifests).map_err(io)?;
    std::fs::write(manifests.join("node.yaml"), case.node_manifest()).map_err(io)?;
    let mut args = case.args(&manifests, &["--proxy-mode", mode]);
    args.extend(extra.iter().cloned());
    let log = dir.join("kpx.log");
    let file = std::fs::File::create(&log).map_err(io)?;
    let mut child = lab
        .node
        .command(&kpx.display().to_string())
        .args(&args)
        .env("NO_COLOR", "1")
        .stdout(file.try_clone().map_err(io)?)
        .stderr(file)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", kpx.display()))?;
    let families: BTreeSet<&str> =
        case.flows.iter().map(|f| if f.family() == IpFamily::V4 { "IPv4" } else { "IPv6" }).collect();
    let t0 = Instant::now();
    // kpx's own line (a plugin's log lines carry the runtime's target).
    let synced = |log: &str| families.iter().all(|f| log.contains(&format!("kpx::sync: synced rules family={f}")));
    // A kpx that exited (a component it refused) will not sync: no wait.
    while !synced(&std::fs::read_to_string(&log).unwrap_or_default())
        && t0.elapsed() < FIRST_SYNC
        && matches!(child.try_wait(), Ok(None))
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Flows sent before the first sync would only time out (a slow first
    // compile of the component, in a small VM): the case fails as unsynced.
    let ready = synced(&std::fs::read_to_string(&log).unwrap_or_default());
    let exited = !matches!(child.try_wait(), Ok(None));
    let out = ready.then(|| body(log.as_path()));
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    out.ok_or_else(|| {
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        let why = if exited {
            "kpx exited before it synced".to_string()
        } else {
            format!("kpx did not sync within {} s", FIRST_SYNC.as_secs())
        };
        format!("{why}; the end of its log:\n      {}", tail.join("\n      "))
    })
}
