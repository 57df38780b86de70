//! Installs what kpx's build and tests need, when it is missing: the
//! wasm32-unknown-unknown target (rustup) and, as root, the Debian
//! packages for iptables, nftables and iproute2 (and g++ for `cargo xtask
//! fuzz`).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

const TARGET: &str = "wasm32-unknown-unknown";
/// (command that must exist, Debian package providing it)
const TOOLS: &[(&str, &str)] = &[
    ("iptables-restore", "iptables"),
    ("ip6tables-restore", "iptables"),
    ("nft", "nftables"),
    ("ip", "iproute2"),
    ("ipset", "ipset"),
];

fn have(command: &str) -> bool {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"]
        .iter()
        .any(|dir| Path::new(dir).join(command).exists())
}

pub fn prerequisites() -> Result<()> {
    let installed = Command::new("rustup").args(["target", "list", "--installed"]).output();
    match installed {
        Ok(out) if String::from_utf8_lossy(&out.stdout).lines().any(|l| l.trim() == TARGET) => {}
        Ok(_) => {
            eprintln!("+ rustup target add {TARGET}");
            let ok = Command::new("rustup").args(["target", "add", TARGET]).status()?.success();
            if !ok {
                bail!("rustup target add {TARGET} failed");
            }
        }
        Err(e) => eprintln!("rustup not found ({e}); assuming the {TARGET} target is installed"),
    }

    let mut packages: Vec<&str> = TOOLS.iter().filter(|(cmd, _)| !have(cmd)).map(|(_, pkg)| *pkg).collect();
    packages.dedup();
    apt_install(&packages)
}

/// What `cargo xtask fuzz` needs besides: a C++ compiler for libFuzzer
/// (the libfuzzer-sys crate builds it).
pub fn compiler() -> Result<()> {
    prerequisites()?;
    if have("c++") || have("g++") {
        return Ok(());
    }
    apt_install(&["g++"])?;
    if !have("c++") && !have("g++") {
        bail!("cargo xtask fuzz needs a C++ compiler for libFuzzer: install g++");
    }
    Ok(())
}

/// Installs Debian packages as root; without root or apt-get, says what
/// is missing and goes on.
fn apt_install(packages: &[&str]) -> Result<()> {
    if packages.is_empty() {
        return Ok(());
    }
    let is_root = Command::new("id").arg("-u").output().map(|o| o.stdout == b"0\n").unwrap_or(false);
    if !is_root || !have("apt-get") {
        eprintln!(
            "missing packages {packages:?}: real-kernel tests will be skipped (install them as root to run those)"
        );
        return Ok(());
    }
    eprintln!("+ apt-get install {}", packages.join(" "));
    let update = Command::new("apt-get").args(["update", "-qq"]).status().context("apt-get update")?;
    if !update.success() {
        bail!("apt-get update failed");
    }
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("apt-get install")?
        .success();
    if !ok {
        bail!("apt-get install {} failed", packages.join(" "));
    }
    Ok(())
}
