//! userspace mode's relay, measured (`kpx-bench --modes userspace`): the
//! per-connection pick through the daemon's own code (the balancer asking
//! the built-in scheduler component, and releasing), then real traffic in
//! namespaces with the real daemon: bulk TCP throughput, per-connection
//! latency (p50/p99) and the connection rate, each through the relay and
//! straight to the endpoint over the same node (kernel forwarding), in one
//! run. The endpoint is on the node (its EndpointSlice names it); bulk
//! throughput is also measured through a second Service whose slice names
//! no node, so the relay treats the same endpoint as another node's (its
//! connection keeps the node's default congestion control).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use kpx::userspace::balancer::{Balancer, Picker, Side, SideChooser};
use kpx::userspace::tcp::Chooser;
use kpx_netlab::Ns;
use kpx_netlab::node::{NODE_IP, NodeLab};
use kpx_rules::model::{Endpoint, Protocol, SchedulerChoice, ServicePort};
use serde_json::json;

use crate::args::Args;

const SERVICE: &str = "10.96.0.10";
/// The same endpoint, its slice naming no node.
const ELSEWHERE: &str = "10.96.0.11";
const BULK_PORT: u16 = 9000;
const PING_PORT: u16 = 9001;
/// Bytes per bulk transfer, and transfers per path: one round (a direct
/// transfer, one through the relay and one through the relay as if the
/// endpoint were elsewhere, the order rotating) after another, so that
/// both sides of each pair's ratio (a path's transfer against the same
/// round's direct one) see the same machine.
/// A single pair's ratio ranges 0.63-1.77 over the committed runs on
/// this 2-vCPU VM (the direct path's own CPU per byte by a fifth from run
/// to run): 21 rounds make the median steadier than the 11 of earlier
/// runs. Only bytes toward the endpoint are timed (the relay's local-hop
/// congestion control applies to that direction alone).
const BULK_BYTES: u64 = 512 << 20;
const BULK_RUNS: usize = 21;
const CONNECTIONS: usize = 2000;
const RATE_THREADS: usize = 4;
const RATE_SECONDS: u64 = 3;

pub struct PickCost {
    pub scheduler: &'static str,
    pub candidates: usize,
    pub micros: f64,
}

#[derive(Default)]
pub struct Relay {
    pub picks: Vec<PickCost>,
    /// MB/s (10^6 bytes), best of the runs: direct, through the relay.
    pub direct_mbps: f64,
    pub relay_mbps: f64,
    /// Each pair's relay / direct, sorted.
    pub pair_ratios: Vec<f64>,
    /// The same through the Service whose slice names no node.
    pub elsewhere_pair_ratios: Vec<f64>,
    /// Every transfer's MB/s, in the order run: direct, through the
    /// relay, through the relay to the endpoint as if elsewhere.
    pub direct_runs: Vec<f64>,
    pub relay_runs: Vec<f64>,
    pub elsewhere_runs: Vec<f64>,
    /// The machine's busy CPU time per GiB moved (all cores, every
    /// process and the kernel), ms: direct, through the relay, as if
    /// elsewhere.
    pub direct_cpu_ms_per_gib: f64,
    pub relay_cpu_ms_per_gib: f64,
    pub elsewhere_cpu_ms_per_gib: f64,
    /// Per-connection time (connect, one byte each way, close), µs.
    pub direct_p50: f64,
    pub direct_p99: f64,
    pub relay_p50: f64,
    pub relay_p99: f64,
    /// Connections per second with RATE_THREADS clients.
    pub direct_rate: f64,
    pub relay_rate: f64,
    /// The node namespace's default congestion control, and the one kpx
    /// gives connections to endpoints on the node.
    pub congestion: (String, String),
}

/// The median of `ratios`, 0 when there are none (a run without traffic).
fn median_or_zero(ratios: &[f64]) -> f64 {
    if ratios.is_empty() { 0.0 } else { median(ratios.to_vec()) }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The daemon's per-connection path: `Chooser::choose` on a service
/// port's balancer (one `pick` into the component, with the live counts),
/// then `release`.
fn pick_cost(scheduler: &'static str, candidates: usize) -> Result<PickCost> {
    let runtime = kpx::runtime::Runtime::new(kpx::runtime::Limits::default(), None)?;
    let picker = Arc::new(Picker::new(kpx::app::load_schedulers(&runtime, &[])?));
    let endpoints =
        (0..candidates).map(|i| Endpoint::ready(format!("10.244.{}.{}", i / 250, 1 + i % 250).parse().unwrap(), 8080));
    let mut port =
        ServicePort::new("bench", "web", "http", Protocol::Tcp, 80).with_cluster_endpoints(endpoints.collect());
    port.cluster_ip = Some(SERVICE.parse()?);
    port.scheduler = Some(Arc::new(SchedulerChoice { name: scheduler.into(), parameters: Vec::new() }));
    let chooser = SideChooser { balancer: Arc::new(Balancer::new(&port, picker)), side: Side::Internal };
    let client: SocketAddr = "192.168.100.2:40000".parse()?;
    let n = 100_000;
    let mut runs = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            let e = chooser.choose(client, 0, &[]).context("no pick")?;
            chooser.release(e);
        }
        runs.push(t.elapsed().as_secs_f64() * 1e6 / f64::from(n));
    }
    Ok(PickCost { scheduler, candidates, micros: median(runs) })
}

/// Servers in the endpoint's namespace: bulk (reads to the end, answers
/// the count) and ping (one byte back for one byte).
fn start_servers(ns: &Ns, stop: Arc<AtomicBool>) -> Result<()> {
    for (port, bulk) in [(BULK_PORT, true), (PING_PORT, false)] {
        let listener = ns.enter(move || TcpListener::bind(("0.0.0.0", port)))??;
        let stop = stop.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut s) = stream else { continue };
                std::thread::spawn(move || {
                    let _ = s.set_nodelay(true);
                    if bulk {
                        let mut buf = vec![0u8; 256 << 10];
                        let mut total = 0u64;
                        while let Ok(n) = s.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            total += n as u64;
                        }
                        let _ = s.write_all(&total.to_be_bytes());
                    } else {
                        let mut b = [0u8; 1];
                        if s.read_exact(&mut b).is_ok() {
                            let _ = s.write_all(&b);
                        }
                    }
                });
            }
        });
    }
    Ok(())
}

/// One bulk transfer from the client: the time until the endpoint has
/// counted every byte.
fn bulk(client: &Ns, to: SocketAddr) -> Result<Duration> {
    client.enter(move || -> Result<Duration> {
        let t = Instant::now();
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
        let chunk = vec![7u8; 256 << 10];
        let mut sent = 0u64;
        while sent < BULK_BYTES {
            s.write_all(&chunk)?;
            sent += chunk.len() as u64;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        let mut count = [0u8; 8];
        s.read_exact(&mut count)?;
        if u64::from_be_bytes(count) != sent {
            bail!("the endpoint counted {} of {sent} bytes", u64::from_be_bytes(count));
        }
        Ok(t.elapsed())
    })?
}

fn ping(to: SocketAddr) -> std::io::Result<Duration> {
    let t = Instant::now();
    let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
    s.set_nodelay(true)?;
    s.write_all(b"x")?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(t.elapsed())
}

/// Per-connection times, sorted (µs).
fn connections(client: &Ns, to: SocketAddr) -> Result<Vec<f64>> {
    client.enter(move || -> Result<Vec<f64>> {
        for _ in 0..100 {
            ping(to)?;
        }
        let mut v: Vec<f64> =
            (0..CONNECTIONS).map(|_| ping(to).map(|d| d.as_secs_f64() * 1e6)).collect::<Result<_, _>>()?;
        v.sort_by(f64::total_cmp);
        Ok(v)
    })?
}

/// Connections per second from RATE_THREADS clients at once.
fn rate(client: &Ns, to: SocketAddr) -> Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(RATE_SECONDS);
    let threads: Vec<_> = (0..RATE_THREADS)
        .map(|_| {
            let (done, failed, client) = (done.clone(), failed.clone(), client.clone());
            std::thread::spawn(move || {
                let _ = client.enter(move || {
                    while Instant::now() < deadline {
                        match ping(to) {
                            Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                            Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                });
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    let failed = failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} connections to {to} failed");
    }
    Ok(done.load(Ordering::Relaxed) as f64 / RATE_SECONDS as f64)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q) as usize]
}

pub fn run(args: &Args) -> Result<Relay> {
    eprintln!("== userspace: the pick path");
    let mut picks = Vec::new();
    for (scheduler, candidates) in [("rr", 4), ("lc", 4), ("lc", 16), ("maglev", 16)] {
        picks.push(pick_cost(scheduler, candidates)?);
    }
    if args.picks_only {
        return Ok(Relay { picks, ..Relay::default() });
    }
    eprintln!("== userspace: traffic through the relay and straight to the endpoint");
    let lab = NodeLab::build(1)?;
    let backend = lab.backends[0].ip.clone();
    // The direct path: the client reaches the endpoint through the node.
    lab.client.ip(&["route", "add", "10.244.0.0/16", "via", NODE_IP])?;
    let stop = Arc::new(AtomicBool::new(false));
    start_servers(&lab.backends[0].ns, stop.clone())?;
    let dir = std::path::PathBuf::from("target/bench/userspace").canonicalize().or_else(|_| {
        std::fs::create_dir_all("target/bench/userspace")?;
        std::path::PathBuf::from("target/bench/userspace").canonicalize()
    })?;
    let manifests = dir.join("manifests");
    let _ = std::fs::remove_dir_all(&manifests);
    std::fs::create_dir_all(&manifests)?;
    // The endpoint's namespace hangs off the node's: a pod on this node
    // (kpx runs with --hostname-override node).
    let service = |name: &str, ip: &str, node: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: bench}}\nspec:\n  clusterIP: {ip}\n  ports:\n  - {{name: bulk, port: {BULK_PORT}}}\n  - {{name: ping, port: {PING_PORT}}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: IPv4\nports:\n- {{name: bulk, port: {BULK_PORT}}}\n- {{name: ping, port: {PING_PORT}}}\nendpoints:\n- addresses: [{backend}]\n{node}"
        )
    };
    std::fs::write(
        manifests.join("bench.yaml"),
        format!("{}---\n{}", service("bench", SERVICE, "  nodeName: node\n"), service("elsewhere", ELSEWHERE, "")),
    )?;
    let cache = dir.join("plugin-cache");
    let kpx_args = [
        "--proxy-mode",
        "userspace",
        "--hostname-override",
        "node",
        "--manifests",
        manifests.to_str().unwrap(),
        "--plugin-cache-dir",
        cache.to_str().unwrap(),
    ];
    let congestion = (
        lab.node.exec(&["cat", "/proc/sys/net/ipv4/tcp_congestion_control"])?.trim().to_string(),
        kpx::userspace::tcp::local_hop_congestion_here().to_string(),
    );
    let mut kpx = lab.start_kpx(&args.kpx, &kpx_args, &dir.join("kpx.log"))?;
    if !kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(60)) {
        bail!("kpx did not sync:\n{}", kpx.log());
    }
    let at = |ip: &str, port: u16| -> SocketAddr { SocketAddr::new(ip.parse().unwrap(), port) };
    let (direct_ping, relay_ping) = (at(&backend, PING_PORT), at(SERVICE, PING_PORT));
    let mbps = |d: Duration| BULK_BYTES as f64 / d.as_secs_f64() / 1e6;
    // Direct, through the relay, through the relay as if elsewhere: each
    // round runs the three once, its order rotated round by round.
    let paths = [at(&backend, BULK_PORT), at(SERVICE, BULK_PORT), at(ELSEWHERE, BULK_PORT)];
    let mut runs: [Vec<f64>; 3] = Default::default();
    let mut ticks = [0u64; 3];
    for i in 0..BULK_RUNS {
        for k in 0..3 {
            let path = (i + k) % 3;
            let before = crate::quiet::busy_ticks()?;
            runs[path].push(mbps(bulk(&lab.client, paths[path])?));
            ticks[path] += crate::quiet::busy_ticks()?.saturating_sub(before);
        }
    }
    // CPU time per GiB moved, every process and the kernel's (ticks of
    // 10 ms).
    let gib = (BULK_RUNS as u64 * BULK_BYTES) as f64 / f64::from(1u32 << 30);
    let per_gib = |ticks: u64| ticks as f64 * 10.0 / gib;
    let [direct, relay, elsewhere] = runs;
    let ratios = |through: &[f64]| {
        let mut v: Vec<f64> = through.iter().zip(&direct).map(|(r, d)| r / d).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let (pair_ratios, elsewhere_pair_ratios) = (ratios(&relay), ratios(&elsewhere));
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let direct_times = connections(&lab.client, direct_ping)?;
    let relay_times = connections(&lab.client, relay_ping)?;
    let direct_rate = rate(&lab.client, direct_ping)?;
    let relay_rate = rate(&lab.client, relay_ping)?;
    stop.store(true, Ordering::Relaxed);
    if !kpx.is_running() {
        bail!("kpx stopped during the run:\n{}", kpx.log());
    }
    Ok(Relay {
        picks,
        direct_mbps: best(&direct),
        relay_mbps: best(&relay),
        pair_ratios,
        elsewhere_pair_ratios,
        direct_cpu_ms_per_gib: per_gib(ticks[0]),
        relay_cpu_ms_per_gib: per_gib(ticks[1]),
        elsewhere_cpu_ms_per_gib: per_gib(ticks[2]),
        direct_runs: direct,
        relay_runs: relay,
        elsewhere_runs: elsewhere,
        direct_p50: percentile(&direct_times, 0.5),
        direct_p99: percentile(&direct_times, 0.99),
        relay_p50: percentile(&relay_times, 0.5),
        relay_p99: percentile(&relay_times, 0.99),
        direct_rate,
        relay_rate,
        congestion,
    })
}

impl Relay {
    /// The median of the pairs' relay / direct (0 without traffic runs).
    fn pair_median(&self) -> f64 {
        median_or_zero(&self.pair_ratios)
    }

    fn elsewhere_median(&self) -> f64 {
        median_or_zero(&self.elsewhere_pair_ratios)
    }

    pub fn table(&self) -> String {
        let mut out = String::from("userspace mode\n  pick path (choose + release, through the component):");
        for p in &self.picks {
            out.push_str(&format!(" {} x{} {:.2} µs;", p.scheduler, p.candidates, p.micros));
        }
        out.push_str(&format!(
            "\n  bulk TCP ({} MiB, {BULK_RUNS} pairs): relay / direct, median of the pairs {:.1}% (pairs {:.1}-{:.1}%); best of each path: direct {:.0} MB/s, relay {:.0} MB/s = {:.1}%\n",
            BULK_BYTES >> 20,
            100.0 * self.pair_median(),
            100.0 * self.pair_ratios.first().copied().unwrap_or(0.0),
            100.0 * self.pair_ratios.last().copied().unwrap_or(0.0),
            self.direct_mbps,
            self.relay_mbps,
            100.0 * self.relay_mbps / self.direct_mbps
        ));
        out.push_str(&format!(
            "  the same endpoint through a Service whose slice names no node (the node's congestion control, {}; on the node: {}): median of the pairs {:.1}% (pairs {:.1}-{:.1}%)\n",
            self.congestion.0,
            self.congestion.1,
            100.0 * self.elsewhere_median(),
            100.0 * self.elsewhere_pair_ratios.first().copied().unwrap_or(0.0),
            100.0 * self.elsewhere_pair_ratios.last().copied().unwrap_or(0.0),
        ));
        out.push_str(&format!(
            "  busy CPU per GiB moved (all cores, kernel included): direct {:.0} ms, relay {:.0} ms = {:.2}x, as if elsewhere {:.0} ms = {:.2}x\n",
            self.direct_cpu_ms_per_gib,
            self.relay_cpu_ms_per_gib,
            self.relay_cpu_ms_per_gib / self.direct_cpu_ms_per_gib,
            self.elsewhere_cpu_ms_per_gib,
            self.elsewhere_cpu_ms_per_gib / self.direct_cpu_ms_per_gib
        ));
        out.push_str(&format!(
            "  per connection ({CONNECTIONS}, connect + 1 byte each way): direct p50 {:.0} µs p99 {:.0} µs; relay p50 {:.0} µs p99 {:.0} µs; added p50 {:.0} µs p99 {:.0} µs\n",
            self.direct_p50,
            self.direct_p99,
            self.relay_p50,
            self.relay_p99,
            self.relay_p50 - self.direct_p50,
            self.relay_p99 - self.direct_p99
        ));
        out.push_str(&format!(
            "  connections/s ({RATE_THREADS} clients, {RATE_SECONDS} s): direct {:.0}, relay {:.0}\n",
            self.direct_rate, self.relay_rate
        ));
        out
    }

    pub fn json(&self) -> serde_json::Value {
        json!({
            "pick_us": self.picks.iter().map(|p| json!({"scheduler": p.scheduler, "candidates": p.candidates, "us": p.micros})).collect::<Vec<_>>(),
            "bulk_mbps": {"direct": self.direct_mbps, "relay": self.relay_mbps, "ratio": self.relay_mbps / self.direct_mbps},
            "bulk_pair_ratios": {"median": self.pair_median(), "sorted": self.pair_ratios},
            "bulk_elsewhere_pair_ratios": {"median": self.elsewhere_median(), "sorted": self.elsewhere_pair_ratios},
            "bulk_cpu_ms_per_gib": {"direct": self.direct_cpu_ms_per_gib, "relay": self.relay_cpu_ms_per_gib, "elsewhere": self.elsewhere_cpu_ms_per_gib},
            "bulk_runs_mbps": {"direct": self.direct_runs, "relay": self.relay_runs, "elsewhere": self.elsewhere_runs},
            "connection_us": {"direct_p50": self.direct_p50, "direct_p99": self.direct_p99, "relay_p50": self.relay_p50, "relay_p99": self.relay_p99},
            "connections_per_s": {"direct": self.direct_rate, "relay": self.relay_rate},
            "congestion_control": {"node_default": self.congestion.0, "local_hop": self.congestion.1},
        })
    }
}
