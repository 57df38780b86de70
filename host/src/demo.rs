//! `kpx demo`: kpx on its embedded default — the manifests of
//! examples/demo — programs real rules in a node namespace, and a client
//! namespace sends real TCP and UDP requests to the Services; each reply
//! names the backend that answered and the source address it saw. With
//! `--scheduler-plugin NAME=FILE --scheduler S`, the demo's web Service is
//! annotated `kpx.dev/scheduler: S` and eight clients show where the
//! component sends them. With `--extension NAME=FILE[,KEY=VALUE...]` (and
//! `--annotation KEY=VALUE` for the web Service, e.g. the extension's
//! `ext.kpx.dev/NAME.*`), the same eight clients show what the extension
//! lets through, and its counters follow. Needs root (network
//! namespaces); never touches the host's own network.

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
    /// An extension component to load, as kpx's flag of the same name
    /// (NAME=FILE[,KEY=VALUE...]).
    #[arg(long = "extension")]
    pub extensions: Vec<String>,
    /// An annotation of the web Service (KEY=VALUE), e.g. an extension's
    /// `ext.kpx.dev/NAME.KEY`.
    #[arg(long = "annotation")]
    pub annotations: Vec<String>,
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
    let mut annotations: Vec<(String, String)> = Vec::new();
    if let Some(s) = &args.scheduler {
        annotations.push(("kpx.dev/scheduler".into(), s.clone()));
    }
    for a in &args.annotations {
        let (k, v) = a.split_once('=').ok_or(format!("--annotation {a:?}: KEY=VALUE"))?;
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b"./-_".contains(&b)) {
            return Err(format!("--annotation {a:?}: a key is letters, digits and . / - _"));
        }
        annotations.push((k.to_string(), v.to_string()));
    }
    let lab = NodeLab::build(3).map_err(|e| format!("the demo needs root and network namespaces: {e}"))?;
    let (dir, manifests) = crate::scratch::fresh_dir("demo")?;
    let io = |e: std::io::Error| format!("{}: {e}", dir.display());
    for (file, text) in MANIFESTS {
        let text = match file {
            "web.yaml" if !annotations.is_empty() => {
                // Keys and values as JSON strings: YAML reads them as they are.
                let quote = |t: &str| serde_json::to_string(t).expect("a string");
                let map: Vec<String> = annotations.iter().map(|(k, v)| format!("{}: {}", quote(k), quote(v))).collect();
                let web = "metadata: {name: web, namespace: demo}";
                if !text.contains(web) {
                    return Err("examples/demo/web.yaml no longer has the metadata the demo annotates".into());
                }
                text.replace(
                    web,
                    &format!("metadata: {{name: web, namespace: demo, annotations: {{{}}}}}", map.join(", ")),
                )
            }
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
    for e in &args.extensions {
        let (name, rest) = e.split_once('=').ok_or(format!("--extension {e:?}: NAME=FILE[,KEY=VALUE...]"))?;
        let (file, params) = rest.split_once(',').map_or((rest, None), |(f, p)| (f, Some(p)));
        let file = std::path::absolute(file).map_err(|e| format!("{file}: {e}"))?;
        let params = params.map(|p| format!(",{p}")).unwrap_or_default();
        kpx_args.extend(["--extension".into(), format!("{name}={}{params}", file.display())]);
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
    if args.scheduler.is_some() || !args.extensions.is_empty() {
        clients(&lab, args.scheduler.as_deref(), &proc.log())?;
    }
    if !args.extensions.is_empty() {
        counters(&lab);
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
/// Service's scheduler sends them, and what its extensions let through.
fn clients(lab: &NodeLab, scheduler: Option<&str>, log: &str) -> Result<()> {
    match scheduler {
        Some(s) => {
            println!("\n== the web Service names scheduler {s}: 8 clients, 3 TCP connections each");
            if log.contains(&format!("no scheduler is named \"{s}\"")) {
                println!("   (kpx knows no scheduler {s:?}: the Service keeps the default; see kpx's log)");
            }
        }
        None => println!("\n== 8 clients, 3 TCP connections each, through the extensions"),
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

/// The extensions' counters, as kpx's /metrics has them once it read them
/// from the kernel (every 2 s).
fn counters(lab: &NodeLab) {
    std::thread::sleep(Duration::from_millis(2500));
    println!("\n== the extensions' counters (kpx_extension_counter_total on /metrics)");
    let metrics = lab.node.enter(|| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(
            &"127.0.0.1:10249".parse().expect("an address"),
            Duration::from_secs(2),
        )?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: demo\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok::<String, std::io::Error>(body)
    });
    match metrics {
        Ok(Ok(text)) => {
            let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("kpx_extension_counter_total{")).collect();
            if lines.is_empty() {
                println!("   (none yet)");
            }
            for l in lines {
                println!("   {l}");
            }
        }
        Ok(Err(e)) => println!("   (cannot read kpx's /metrics: {e})"),
        Err(e) => println!("   (cannot enter the node namespace: {e})"),
    }
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
