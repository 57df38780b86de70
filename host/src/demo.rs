//! `kpx demo`: kpx on its embedded default — the manifests of
//! examples/demo — programs real rules in a node namespace, and a client
//! namespace sends real TCP and UDP requests to the Services; each reply
//! names the backend that answered and the source address it saw. With
//! `--scheduler-plugin NAME=FILE --scheduler S`, the demo's web Service is
//! annotated `kpx.dev/scheduler: S` and eight clients show where the
//! component sends them. Needs root (network namespaces); never touches
//! the host's own network.

use std::path::Path;
use std::time::{Duration, Instant};

use kpx_netlab::node::{CLUSTER_CIDR, NodeLab};
use kpx_netlab::{Reply, Request, tcp_request, udp_request};

const WEB: &str = "10.96.0.10:80";
const EMPTY: &str = "10.96.0.11:80";
const MANIFESTS: [(&str, &str); 3] = [
    ("web.yaml", include_str!("../../examples/demo/web.yaml")),
    ("empty.yaml", include_str!("../../examples/demo/empty.yaml")),
    ("node.yaml", include_str!("../../examples/demo/node.yaml")),
];
const BE3: &str = "- addresses: [10.244.3.5]\n  conditions: {ready: true}\n  nodeName: other-node\n";

/// `kpx demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// iptables (the default), nftables or userspace.
    #[arg(long = "proxy-mode", default_value = "iptables")]
    pub proxy_mode: String,
    /// A scheduler component to load, as kpx's flag of the same name.
    #[arg(long = "scheduler-plugin")]
    pub scheduler_plugins: Vec<String>,
    /// The scheduler the web Service names (its kpx.dev/scheduler annotation).
    #[arg(long)]
    pub scheduler: Option<String>,
}

type Result<T> = std::result::Result<T, String>;

/// Runs the demo with `kpx` (this binary); the namespaces go when it ends.
pub fn run(args: &Args, kpx: &Path) -> Result<()> {
    if !matches!(args.proxy_mode.as_str(), "iptables" | "nftables" | "userspace") {
        return Err(format!("--proxy-mode {:?}: the demo runs iptables, nftables or userspace", args.proxy_mode));
    }
    if let Some(s) = &args.scheduler
        && (s.is_empty() || !s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    {
        return Err(format!("--scheduler {s:?}: a scheduler's name is a-z, 0-9 and '-'"));
    }
    let lab = NodeLab::build(3).map_err(|e| format!("the demo needs root and network namespaces: {e}"))?;
    let (dir, manifests) = crate::scratch::fresh_dir("demo")?;
    let io = |e: std::io::Error| format!("{}: {e}", dir.display());
    for (file, text) in MANIFESTS {
        let text = match (&args.scheduler, file) {
            (Some(s), "web.yaml") => text.replace(
                "metadata: {name: web, namespace: demo}",
                &format!("metadata: {{name: web, namespace: demo, annotations: {{kpx.dev/scheduler: {s}}}}}"),
            ),
            _ => text.to_string(),
        };
        std::fs::write(manifests.join(file), text).map_err(io)?;
    }
    let mut kpx_args: Vec<String> = [
        "--proxy-mode",
        &args.proxy_mode,
        "--manifests",
        &manifests.display().to_string(),
        "--hostname-override",
        "demo-node",
        "--cluster-cidr",
        CLUSTER_CIDR,
        "--plugin-cache-dir",
        &dir.join("plugin-cache").display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for p in &args.scheduler_plugins {
        let (name, file) = p.split_once('=').ok_or(format!("--scheduler-plugin {p:?}: NAME=FILE"))?;
        let file = std::path::absolute(file).map_err(|e| format!("{file}: {e}"))?;
        kpx_args.extend(["--scheduler-plugin".into(), format!("{name}={}", file.display())]);
    }
    println!("== kpx {}", kpx_args.join(" "));
    println!("   node namespace {}, client {}", lab.node.name, lab.client.name);
    let log = dir.join("kpx.log");
    let mut proc = lab.start_kpx(kpx, &kpx_args, &log).map_err(|e| e.to_string())?;
    if !proc.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)) {
        return Err(format!("kpx did not program the rules:\n{}", proc.log()));
    }
    rules(&lab, &args.proxy_mode);

    println!("\n== requests from the client (192.168.100.2)");
    requests(&lab, "TCP", WEB, 6);
    requests(&lab, "UDP", WEB, 6);
    requests(&lab, "TCP", EMPTY, 1);
    if let Some(s) = &args.scheduler {
        clients(&lab, s, &proc.log())?;
    }

    println!("\n== the web Service's endpoint 10.244.3.5 (be3) removed from its manifest");
    let web = manifests.join("web.yaml");
    let text = std::fs::read_to_string(&web).map_err(io)?;
    if !text.contains(BE3) {
        return Err("examples/demo/web.yaml no longer lists be3 as the demo expects".into());
    }
    let tmp = web.with_extension("tmp");
    std::fs::write(&tmp, text.replace(BE3, "")).map_err(io)?;
    std::fs::rename(&tmp, &web).map_err(io)?;
    let synced = proc.log().matches("synced rules family=IPv4").count();
    let t0 = Instant::now();
    if !proc.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(10)) {
        return Err(format!("kpx did not program the change:\n{}", proc.log()));
    }
    println!("   kpx programmed the change {:?} after the file was replaced", t0.elapsed());
    requests(&lab, "TCP", WEB, 6);
    println!("\n== done; the namespaces are removed (kpx's log: {})", log.display());
    Ok(())
}

fn rules(lab: &NodeLab, mode: &str) {
    match mode {
        "iptables" => {
            println!("\n== rules kpx wrote (iptables-save -t nat, KUBE- service chains)");
            let nat = lab.node.exec(&["iptables-save", "-t", "nat"]).unwrap_or_default();
            for line in nat.lines().filter(|l| l.starts_with("-A KUBE-SERVICES") || l.starts_with("-A KUBE-SVC-")) {
                println!("   {line}");
            }
        }
        "nftables" => {
            println!("\n== rules kpx wrote (nft list map ip kube-proxy service-ips)");
            let map = lab.node.exec(&["nft", "list", "map", "ip", "kube-proxy", "service-ips"]).unwrap_or_default();
            for line in map.lines().filter(|l| l.contains(':')) {
                println!("   {}", line.trim());
            }
        }
        _ => println!("\n== userspace mode: kpx relays each connection itself"),
    }
}

/// Eight more client addresses, three connections each: where the
/// Service's scheduler sends them.
fn clients(lab: &NodeLab, scheduler: &str, log: &str) -> Result<()> {
    println!("\n== the web Service names scheduler {scheduler}: 8 clients, 3 TCP connections each");
    if log.contains(&format!("no scheduler is named \"{scheduler}\"")) {
        println!("   (kpx knows no scheduler {scheduler:?}: the Service keeps the default; see kpx's log)");
    }
    for i in 0..8 {
        let ip = format!("192.168.100.{}", 100 + i);
        lab.client.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]).map_err(|e| e.to_string())?;
        let from = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
        let request =
            Request { to: WEB.parse().expect("an address"), from: Some(from), timeout: Duration::from_secs(1) };
        let answers: Vec<String> = (0..3)
            .map(|_| match request.tcp(&lab.client) {
                Reply::Answer { server, .. } => server,
                other => format!("{other:?}"),
            })
            .collect();
        println!("   client {ip:<16} -> {}", answers.join(", "));
    }
    Ok(())
}

fn requests(lab: &NodeLab, proto: &str, to: &str, n: usize) {
    for _ in 0..n {
        let t0 = Instant::now();
        let reply = match proto {
            "TCP" => tcp_request(&lab.client, to, Duration::from_secs(1)),
            _ => udp_request(&lab.client, to, Duration::from_secs(1)),
        };
        let took = t0.elapsed().as_secs_f64() * 1000.0;
        match reply {
            Reply::Answer { server, seen_from } => {
                println!("   {proto} {to:<15} -> answered by {server} (it saw the client as {seen_from})  {took:.1} ms")
            }
            Reply::Refused => println!("   {proto} {to:<15} -> refused: the Service has no endpoints  {took:.1} ms"),
            other => println!("   {proto} {to:<15} -> {other:?}  {took:.1} ms"),
        }
    }
}
