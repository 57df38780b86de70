//! kpx-netlab: network-namespace test beds with real traffic.
//!
//! A [`Lab`] creates uniquely named namespaces joined by veth pairs, runs
//! echo servers that report who they are and whom they saw, and sends
//! TCP/UDP requests from inside a namespace. Everything is made inside the
//! lab's own namespaces (`ip -n`), so the host's network is never changed;
//! dropping the lab (also when a test panics) deletes them, and a new lab
//! first removes namespaces left by dead processes.

mod echo;
pub mod node;
pub mod routed;

pub use echo::{EchoServer, Reply, Request, sctp_supported, tcp_request, udp_request};

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Why the lab cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not root, or no `ip` / netns support: callers skip with this reason.
    #[error("network namespaces unavailable: {0}")]
    Unavailable(String),
    /// A command failed while building the lab.
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

const PREFIX: &str = "kpxlab";
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Runs a command; its stdout, or an error with its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program).args(args).stdin(Stdio::null()).output()?;
    if !out.status.success() {
        return Err(Error::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One network namespace of a lab.
#[derive(Debug, Clone)]
pub struct Ns {
    pub name: String,
}

impl Ns {
    /// Runs a command inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["netns", "exec", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `ip -n <ns> ...`
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// `ip -n <ns> -batch -`: many commands, one process (each line is
    /// what would follow `ip`); the error names the failing line.
    pub fn ip_batch(&self, lines: &[String]) -> Result<()> {
        use std::io::Write;
        let mut child = Command::new("ip")
            .args(["-n", &self.name, "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut script = lines.join("\n");
        script.push('\n');
        // Written whole, then closed; an `ip` that exited early (a bad
        // namespace) says why on stderr, which beats the broken pipe.
        match child.stdin.take().expect("piped stdin").write_all(script.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
            _ => {}
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err(Error::Command {
                command: format!("ip -n {} -batch -, with:\n{script}", self.name),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }

    /// Writes sysctls of this namespace (`net.ipv4.ip_forward` written as
    /// `ipv4/ip_forward`, under /proc/sys/net/) from a thread inside it,
    /// with no process started.
    pub fn net_sysctls(&self, settings: &[(String, &'static str)]) -> Result<()> {
        let settings = settings.to_vec();
        self.enter(move || -> std::io::Result<()> {
            for (path, value) in settings {
                let path = format!("/proc/sys/net/{path}");
                std::fs::write(&path, value).map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}")))?;
            }
            Ok(())
        })??;
        Ok(())
    }

    /// The interfaces of this namespace (their names, from
    /// /proc/sys/net/ipv4/conf/ as seen inside it, `all` and `default`
    /// included).
    pub fn ipv4_conf_names(&self) -> Result<Vec<String>> {
        let names = self.enter(|| -> std::io::Result<Vec<String>> {
            std::fs::read_dir("/proc/sys/net/ipv4/conf")?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })??;
        Ok(names)
    }

    /// A command to start inside the namespace (for long-running processes).
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `f` on a thread that has entered this namespace; sockets it
    /// creates live there.
    pub fn enter<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || -> Result<T> {
            let file = std::fs::File::open(&path)?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| Error::Unavailable(format!("setns {path}: {e}")))?;
            Ok(f())
        })
        .join()
        .map_err(|_| Error::Unavailable("namespace thread panicked".into()))?
    }
}

/// A set of namespaces deleted together.
#[derive(Debug)]
pub struct Lab {
    id: String,
    namespaces: Vec<Ns>,
}

impl Lab {
    /// A new, empty lab. Fails with [`Error::Unavailable`] where namespaces
    /// cannot be made (not root, no iproute2).
    pub fn new() -> Result<Lab> {
        if !nix::unistd::geteuid().is_root() {
            return Err(Error::Unavailable("not running as root".into()));
        }
        run("ip", &["netns", "list"]).map_err(|e| Error::Unavailable(format!("iproute2: {e}")))?;
        remove_orphans();
        let id = format!("{}-{}-{}", PREFIX, std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        Ok(Lab { id, namespaces: Vec::new() })
    }

    /// Adds a namespace with loopback up; `role` is part of its name.
    pub fn add(&mut self, role: &str) -> Result<Ns> {
        let ns = Ns { name: format!("{}-{role}", self.id) };
        run("ip", &["netns", "add", &ns.name]).map_err(|e| Error::Unavailable(e.to_string()))?;
        self.namespaces.push(ns.clone());
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Joins two namespaces with a veth pair: `a_if` in `a` with
    /// `a_addr` (CIDR form), `b_if` in `b` with `b_addr`.
    pub fn link(&self, a: &Ns, a_if: &str, a_addr: &str, b: &Ns, b_if: &str, b_addr: &str) -> Result<()> {
        a.ip(&["link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &b.name])?;
        a.ip(&["addr", "add", a_addr, "dev", a_if])?;
        b.ip(&["addr", "add", b_addr, "dev", b_if])?;
        a.ip(&["link", "set", a_if, "up"])?;
        b.ip(&["link", "set", b_if, "up"])?;
        Ok(())
    }

    pub fn namespaces(&self) -> &[Ns] {
        &self.namespaces
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.namespaces.drain(..).rev() {
            let _ = run("ip", &["netns", "del", &ns.name]);
        }
    }
}

/// Deletes namespaces of labs whose process has died.
fn remove_orphans() {
    let Ok(list) = run("ip", &["netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix(PREFIX).and_then(|r| r.strip_prefix('-')) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", name]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_removed_when_the_owner_panics() {
        let names = std::sync::Mutex::new(Vec::new());
        let result = std::panic::catch_unwind(|| {
            let mut lab = match Lab::new() {
                Ok(lab) => lab,
                Err(Error::Unavailable(why)) => {
                    eprintln!("SKIPPED namespaces_are_removed_when_the_owner_panics: {why}");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
            let a = lab.add("a").unwrap();
            let b = lab.add("b").unwrap();
            lab.link(&a, "x", "10.9.0.1/24", &b, "y", "10.9.0.2/24").unwrap();
            names.lock().unwrap().extend([a.name, b.name]);
            panic!("a test failing half-way");
        });
        let names = names.into_inner().unwrap();
        if names.is_empty() {
            return;
        }
        assert!(result.is_err());
        let left = run("ip", &["netns", "list"]).unwrap();
        for name in names {
            assert!(!left.contains(&name), "{name} left behind after a panic");
        }
    }
}
