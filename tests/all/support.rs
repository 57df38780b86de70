//! Helpers shared by the integration tests.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::time::Instant;

use kpx_netlab::node::NodeLab;
use kpx_netlab::{Reply, tcp_request, udp_request};

pub const KPX: &str = env!("CARGO_BIN_EXE_kpx");

/// The lab, or a printed skip reason and `None`.
pub fn lab_or_skip(backends: usize, test: &str) -> Option<NodeLab> {
    match NodeLab::build(backends) {
        Ok(lab) => Some(lab),
        // As root the lab must build: a skip there would hide every
        // real-kernel test behind a green run.
        Err(kpx_netlab::Error::Unavailable(why)) if nix::unistd::geteuid().is_root() => {
            panic!("{test}: running as root, yet the lab cannot be built: {why}")
        }
        Err(kpx_netlab::Error::Unavailable(why)) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
        Err(e) => panic!("building the lab: {e}"),
    }
}

static DIRS: AtomicU32 = AtomicU32::new(0);

/// A fresh directory under the target's temp dir.
/// A fresh run directory and its empty `manifests` folder (kpx's --manifests).
pub fn run_dirs(tag: &str) -> (PathBuf, PathBuf) {
    let dir = temp_dir(tag);
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    (dir, manifests)
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{tag}-{}-{}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Shared compiled-plugin cache for all tests.
pub fn plugin_cache() -> String {
    // The qemu guest's CPU is not this one: it compiles for itself, into
    // a directory of its own (see `ipvs::kpx_where_ipvs_is`).
    let name = if in_guest() { GUEST_PLUGIN_CACHE } else { "plugin-cache" };
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name).display().to_string()
}

/// Whether this runs inside the qemu guest (tests/ipvs-vm/run.sh).
pub fn in_guest() -> bool {
    std::env::var_os("KPX_IN_GUEST").is_some()
}

/// The qemu guest's compiled plugins, kept on the host between boots.
pub const GUEST_PLUGIN_CACHE: &str = "guest-plugin-cache";

/// Writes a file so that the manifest source sees the change at once.
pub fn write_manifest(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The arguments every test starts kpx with (reading --manifests), plus `extra`.
pub fn kpx_args(manifests: &Path, extra: &[&str]) -> Vec<String> {
    node_args(&["--manifests", manifests.to_str().unwrap()], extra)
}

/// kpx as the lab's node, reading objects as `source` says, plus `extra`.
pub fn node_args(source: &[&str], extra: &[&str]) -> Vec<String> {
    let cache = plugin_cache();
    let node: [&str; 6] =
        ["--hostname-override", "node", "--cluster-cidr", kpx_netlab::node::CLUSTER_CIDR, "--plugin-cache-dir", &cache];
    source.iter().chain(node.iter()).chain(extra.iter()).map(|s| s.to_string()).collect()
}

/// Writes `web.yaml`: Service test/web (10.96.0.10) with these endpoints.
pub fn write_web(manifests: &Path, ips: &[&str]) {
    write_manifest(&manifests.join("web.yaml"), &format!("{}---\n{}", service("web", "10.96.0.10"), slice("web", ips)));
}

/// A ClusterIP Service with a TCP and a UDP port named tcp/udp.
pub fn service(name: &str, cluster_ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n  clusterIP: {cluster_ip}\n  ports:\n  - {{name: tcp, port: 80, targetPort: 8080, protocol: TCP}}\n  - {{name: udp, port: 80, targetPort: 8080, protocol: UDP}}\n"
    )
}

/// An EndpointSlice of `service` with these backend IPs on port 8080.
pub fn slice(service: &str, ips: &[&str]) -> String {
    let mut text = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-1\n  namespace: test\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: IPv4\nports:\n- {{name: tcp, port: 8080, protocol: TCP}}\n- {{name: udp, port: 8080, protocol: UDP}}\nendpoints:\n"
    );
    for ip in ips {
        text.push_str(&format!("- addresses: [{ip}]\n  conditions: {{ready: true}}\n"));
    }
    if ips.is_empty() {
        text = text.replace("endpoints:\n", "endpoints: []\n");
    }
    text
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

pub fn request(lab: &NodeLab, proto: Proto, to: &str) -> Reply {
    let timeout = Duration::from_millis(800);
    match proto {
        Proto::Tcp => tcp_request(&lab.client, to, timeout),
        Proto::Udp => udp_request(&lab.client, to, timeout),
    }
}

/// Servers that answered `n` requests (non-answers included by kind).
pub fn servers_seen(lab: &NodeLab, proto: Proto, to: &str, n: usize) -> std::collections::BTreeMap<String, usize> {
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..n {
        let key = match request(lab, proto, to) {
            Reply::Answer { server, .. } => server,
            other => format!("{other:?}"),
        };
        *seen.entry(key).or_insert(0) += 1;
    }
    seen
}

/// The node's ruleset as iptables-save prints it, without comments and counters.
pub fn kernel_rules(lab: &NodeLab) -> String {
    let dump = lab.node.exec(&["iptables-save"]).expect("iptables-save");
    dump.lines().filter(|l| !l.starts_with('#')).map(|l| format!("{l}\n")).collect()
}

/// One connection's outcome: when, and who answered (None: it failed).
/// When a connection started, its source port, and who answered.
pub type Outcome = (Instant, u16, Option<String>);

/// A client opening new TCP connections to the Service until stopped.
pub struct ClientLoop {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    failures: Arc<Mutex<Vec<Failure>>>,
    slow: Arc<Mutex<Vec<Failure>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A failed connection: when it started, and what failed after how long
/// (a refused connect is a reject or a closed port; a timed-out one a
/// dropped packet).
pub type Failure = (Instant, String);

impl ClientLoop {
    pub fn start(lab: &NodeLab, to: &str) -> ClientLoop {
        ClientLoop::start_with(lab, to, Duration::from_secs(1))
    }

    /// [`ClientLoop::start`] with another connect timeout. A connection
    /// that took over a second is recorded as slow (see
    /// [`ClientLoop::slow`]): its first SYN, or the answer, was lost and
    /// sent again.
    pub fn start_with(lab: &NodeLab, to: &str, connect_timeout: Duration) -> ClientLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let slow = Arc::new(Mutex::new(Vec::new()));
        let (s, o, f, ns) = (stop.clone(), outcomes.clone(), failures.clone(), lab.client.clone());
        let sl = slow.clone();
        let to: SocketAddr = to.parse().expect("IP:PORT");
        let thread = std::thread::spawn(move || {
            let _ = ns.enter(move || {
                while !s.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let mut port = 0;
                    let mut attempt = || -> Result<String, String> {
                        let mut c = TcpStream::connect_timeout(&to, connect_timeout)
                            .map_err(|e| format!("connect: {e} after {:?}", t.elapsed()))?;
                        if t.elapsed() > Duration::from_secs(1) {
                            sl.lock().unwrap().push((t, format!("connected after {:?}", t.elapsed())));
                        }
                        port = c.local_addr().map_or(0, |a| a.port());
                        c.set_read_timeout(Some(Duration::from_secs(1))).map_err(|e| e.to_string())?;
                        let _ = c.write_all(b"hi\n");
                        let mut buf = [0u8; 128];
                        let n = c.read(&mut buf).map_err(|e| format!("read: {e} after {:?}", t.elapsed()))?;
                        String::from_utf8_lossy(&buf[..n])
                            .split_whitespace()
                            .next()
                            .map(str::to_string)
                            .ok_or_else(|| format!("no answer (closed) after {:?}", t.elapsed()))
                    };
                    let answer = attempt();
                    if let Err(why) = &answer {
                        f.lock().unwrap().push((t, why.clone()));
                    }
                    o.lock().unwrap().push((t, port, answer.ok()));
                    std::thread::sleep(Duration::from_millis(4));
                }
            });
        });
        ClientLoop { stop, outcomes, failures, slow, thread: Some(thread) }
    }

    pub fn outcomes(&self) -> Vec<Outcome> {
        self.outcomes.lock().unwrap().clone()
    }

    /// Each failed connection, with what failed.
    pub fn failures(&self) -> Vec<Failure> {
        self.failures.lock().unwrap().clone()
    }

    /// Each connection that took over a second to connect (only with a
    /// longer connect timeout than that).
    pub fn slow(&self) -> Vec<Failure> {
        self.slow.lock().unwrap().clone()
    }
}

impl Drop for ClientLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TCP server in each backend's namespace on port 9090 that writes its
/// name and holds every connection open until dropped.
pub struct HoldServers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl HoldServers {
    pub fn start(lab: &NodeLab) -> HoldServers {
        use std::io::Write;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        for b in &lab.backends {
            let listener =
                b.ns.enter(|| std::net::TcpListener::bind("0.0.0.0:9090")).expect("enter").expect("bind 9090");
            listener.set_nonblocking(true).unwrap();
            let (name, stop) = (b.name.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut held = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut s, _)) => {
                            let _ = s.write_all(format!("{name}\n").as_bytes());
                            held.push(s);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
        }
        HoldServers { stop }
    }
}

impl Drop for HoldServers {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Opens a connection from the client and reads the server's name; the
/// connection stays open while the stream lives.
pub fn hold(lab: &NodeLab, to: &str) -> (String, std::net::TcpStream) {
    use std::io::BufRead;
    let to: std::net::SocketAddr = to.parse().unwrap();
    let stream = lab
        .client
        .enter(move || std::net::TcpStream::connect_timeout(&to, Duration::from_secs(2)))
        .expect("enter")
        .expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stream.try_clone().unwrap()).read_line(&mut line).expect("the server's name");
    (line.trim().to_string(), stream)
}

/// A node's ruleset saved and restored as an operator would
/// (`nft list ruleset > saved; nft -f saved`): `listing` loads into a
/// fresh namespace, lists again as the same text, and `nft -j` reads it.
/// A fresh namespace holds the rules `listing` names and nothing else.
pub fn nft_relist(listing: &str) -> Result<(), String> {
    let mut lab = kpx_netlab::Lab::new().map_err(|e| e.to_string())?;
    let ns = lab.add("relist").map_err(|e| e.to_string())?;
    let file = temp_dir("relist").join("saved.nft");
    std::fs::write(&file, listing).map_err(|e| e.to_string())?;
    ns.exec(&["nft", "-f", file.to_str().unwrap()]).map_err(|e| format!("nft -f of the listing: {e}"))?;
    let again = ns.exec(&["nft", "list", "ruleset"]).map_err(|e| e.to_string())?;
    // An affinity element's time left runs on between the two listings.
    let steady = |text: &str| -> String {
        let mut out = String::new();
        let mut words = text.split_inclusive(' ').peekable();
        while let Some(w) = words.next() {
            out.push_str(w);
            if w == "expires " {
                let left = words.next().unwrap_or("");
                out.push_str(left.trim_start_matches(|c: char| c.is_ascii_alphanumeric()));
            }
        }
        out
    };
    let (listing, again) = (steady(listing), steady(&again));
    if again != listing {
        let first = listing.lines().zip(again.lines()).find(|(a, b)| a != b);
        return Err(format!("listed again, the ruleset differs (first at {first:?}):\n{again}"));
    }
    let json = ns.exec(&["nft", "-j", "list", "ruleset"]).map_err(|e| format!("nft -j: {e}"))?;
    serde_json::from_str::<serde_json::Value>(&json).map_err(|e| format!("nft -j printed no JSON: {e}"))?;
    Ok(())
}
