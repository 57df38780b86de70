//! The demo: kpx on the embedded default — the manifests in examples/demo
//! — programs real iptables rules in a node namespace, and a client
//! namespace sends real TCP and UDP requests to the Services. Each reply
//! names the backend that answered and the source address it saw.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kpx_netlab::node::{CLUSTER_CIDR, NodeLab};
use kpx_netlab::{Reply, tcp_request, udp_request};

use crate::{cargo, setup};

const WEB: &str = "10.96.0.10:80";
const EMPTY: &str = "10.96.0.11:80";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn run() -> Result<()> {
    setup::prerequisites()?;
    cargo(&["build", "-p", "kpx-host"])?;
    let kpx = workspace().join("target/debug/kpx");

    let lab = match NodeLab::build(3) {
        Ok(lab) => lab,
        Err(kpx_netlab::Error::Unavailable(why)) => {
            bail!("the demo needs root and network namespaces: {why}")
        }
        Err(e) => return Err(e).context("building the demo namespaces"),
    };
    let dir = workspace().join("target/demo");
    let manifests = dir.join("manifests");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&manifests)?;
    for entry in std::fs::read_dir(workspace().join("examples/demo"))? {
        let path = entry?.path();
        std::fs::copy(&path, manifests.join(path.file_name().unwrap()))?;
    }
    let cache = dir.join("plugin-cache");
    let args = [
        "--manifests",
        manifests.to_str().unwrap(),
        "--hostname-override",
        "demo-node",
        "--cluster-cidr",
        CLUSTER_CIDR,
        "--plugin-cache-dir",
        cache.to_str().unwrap(),
    ];
    println!("== kpx --proxy-mode iptables {}", args.join(" "));
    println!("   node namespace {}, client {}", lab.node.name, lab.client.name);
    let mut proc = lab.start_kpx(&kpx, &args, &dir.join("kpx.log"))?;
    if !proc.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)) {
        bail!("kpx did not program the rules:\n{}", proc.log());
    }
    println!("\n== rules kpx wrote (iptables-save -t nat, KUBE- service chains)");
    let nat = lab.node.exec(&["iptables-save", "-t", "nat"])?;
    for line in nat.lines().filter(|l| l.starts_with("-A KUBE-SERVICES") || l.starts_with("-A KUBE-SVC-")) {
        println!("   {line}");
    }

    println!("\n== requests from the client (192.168.100.2)");
    requests(&lab, "TCP", WEB, 6);
    requests(&lab, "UDP", WEB, 6);
    requests(&lab, "TCP", EMPTY, 1);

    println!("\n== editing examples/demo/web.yaml: endpoint 10.244.3.5 (be3) removed");
    let web = manifests.join("web.yaml");
    let text = std::fs::read_to_string(&web)?;
    let be3 = "- addresses: [10.244.3.5]\n  conditions: {ready: true}\n  nodeName: other-node\n";
    anyhow::ensure!(text.contains(be3), "examples/demo/web.yaml no longer lists be3 as the demo expects");
    std::fs::write(&web, text.replace(be3, ""))?;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let nat = lab.node.exec(&["iptables-save", "-t", "nat"])?;
        if !nat.contains("10.244.3.5") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("   rules updated after {:?}", t0.elapsed());
    requests(&lab, "TCP", WEB, 6);
    println!("\n== done; the namespaces are removed (kpx's log: {})", dir.join("kpx.log").display());
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
