//! The standard test bed: one node running kpx, a client outside the
//! cluster, and backends, each on its own veth link to the node.
//!
//! ```text
//!  client 192.168.100.2 ── 192.168.100.1 node 10.244.i.1 ── 10.244.i.5 backend i
//! ```
//! The client routes the service range 10.96.0.0/12 (and its node-port
//! address) through the node; backends route everything through it.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::{EchoServer, Lab, Ns, Result};

/// The port every backend serves on.
pub const BACKEND_PORT: u16 = 8080;
pub const CLIENT_IP: &str = "192.168.100.2";
pub const NODE_IP: &str = "192.168.100.1";
pub const SERVICE_RANGE: &str = "10.96.0.0/12";
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

pub struct Backend {
    pub ns: Ns,
    pub name: String,
    pub ip: String,
    _server: EchoServer,
}

pub struct NodeLab {
    pub node: Ns,
    pub client: Ns,
    pub backends: Vec<Backend>,
    // Last, so servers stop before namespaces go.
    pub lab: Lab,
}

impl NodeLab {
    /// Builds the bed with `n` backends named be1..beN, echo servers running.
    pub fn build(n: usize) -> Result<NodeLab> {
        let mut lab = Lab::new()?;
        let node = lab.add("node")?;
        let client = lab.add("client")?;
        lab.link(&node, "eth-client", &format!("{NODE_IP}/24"), &client, "eth0", &format!("{CLIENT_IP}/24"))?;
        client.ip(&["route", "add", SERVICE_RANGE, "via", NODE_IP])?;
        // Forwarding on; redirects off: the node sends unhandled traffic back
        // out the client's link, and a redirect would use up the per-host
        // ICMP rate limit that a REJECT's port-unreachable needs.
        node.exec(&[
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/ip_forward; for f in /proc/sys/net/ipv4/conf/*/send_redirects; do echo 0 > $f; done",
        ])?;
        // Like a real node, a default route: unhandled service traffic is
        // forwarded (through the filter table's REJECTs) instead of being
        // refused by routing. The client does not forward, so it drops it.
        node.ip(&["route", "add", "default", "via", CLIENT_IP])?;
        let mut backends = Vec::new();
        for i in 1..=n {
            let ns = lab.add(&format!("be{i}"))?;
            let ip = format!("10.244.{i}.5");
            lab.link(&node, &format!("eth-be{i}"), &format!("10.244.{i}.1/24"), &ns, "eth0", &format!("{ip}/24"))?;
            ns.ip(&["route", "add", "default", "via", &format!("10.244.{i}.1")])?;
            let name = format!("be{i}");
            let server = EchoServer::start(&ns, &name, &format!("0.0.0.0:{BACKEND_PORT}"))?;
            backends.push(Backend { ns, name, ip, _server: server });
        }
        Ok(NodeLab { node, client, backends, lab })
    }

    /// Starts kpx in the node namespace; its log goes to `log`.
    pub fn start_kpx<S: AsRef<std::ffi::OsStr>>(&self, kpx: &Path, args: &[S], log: &Path) -> Result<Kpx> {
        self.start_kpx_with_env(kpx, args, log, &[])
    }

    /// [`NodeLab::start_kpx`] with these environment variables set.
    pub fn start_kpx_with_env<S: AsRef<std::ffi::OsStr>>(
        &self,
        kpx: &Path,
        args: &[S],
        log: &Path,
        env: &[(&str, &str)],
    ) -> Result<Kpx> {
        let file = std::fs::File::create(log)?;
        let child = self
            .node
            .command(kpx.to_str().unwrap_or("kpx"))
            .args(args)
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()?;
        Ok(Kpx { child, log: log.to_path_buf() })
    }
}

/// A running kpx, killed when dropped.
pub struct Kpx {
    child: Child,
    log: PathBuf,
}

impl Kpx {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle` `count` times.
    pub fn wait_for_log(&mut self, needle: &str, count: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log().matches(needle).count() >= count {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Its process id (`ip netns exec` becomes kpx).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Kpx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
