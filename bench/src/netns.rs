//! Network namespaces the benchmark writes the kernel's rules and runs
//! kpx in, removed when done.

use std::process::{Command, Stdio};

use anyhow::{Result, bail};
use kpx::kernel::{Exec, SystemExec};

/// A network namespace removed on drop.
pub(crate) struct Netns(pub(crate) String);

impl Netns {
    pub(crate) fn new(tag: &str) -> Result<Netns> {
        let name = format!("kpxbench-{}-{tag}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        let ok = Command::new("ip").args(["netns", "add", &name]).status()?.success();
        if !ok {
            bail!("cannot create network namespace {name} (root needed)");
        }
        Ok(Netns(name))
    }

    pub(crate) fn ns(&self) -> kpx_netlab::Ns {
        kpx_netlab::Ns { name: self.0.clone() }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// kpx's own executor, run inside a namespace: the daemon's iptables path.
pub(crate) struct NetnsExec(pub(crate) String);

impl Exec for NetnsExec {
    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> kpx::kernel::Result<String> {
        let mut all = vec!["netns", "exec", self.0.as_str(), program];
        all.extend_from_slice(args);
        SystemExec::default().run("ip", &all, stdin)
    }
}
