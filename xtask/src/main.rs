//! `cargo xtask demo` and `cargo xtask test`: the two commands the README
//! opens with. Each installs what it needs when it is missing.

mod demo;
mod fuzz;
mod setup;

use std::process::Command;

use anyhow::{Context, Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("demo") => demo::run(&args[1..]),
        Some("test") => test(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask demo [kpx demo args] | cargo xtask test [-- <cargo test args>] | cargo xtask bench [kpx-bench args] | cargo xtask fuzz [--time SECONDS] [--parallel N] [TARGET...]"
            );
            std::process::exit(2);
        }
    }
}

/// Formatting, lints, then every test of the workspace (real-kernel tests
/// included when run as root).
fn test(extra: &[String]) -> Result<()> {
    setup::prerequisites()?;
    cargo(&["fmt", "--all", "--check"]).context("cargo fmt --check: run `cargo fmt --all`")?;
    cargo(&["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    // Plugins are cdylibs for wasm32 only (their export names cannot be
    // linked natively); host/build.rs builds them and the host's tests run them.
    let mut args = vec!["test", "--workspace"];
    for plugin in [
        "kpx-plugin-iptables",
        "kpx-plugin-nftables",
        "kpx-plugin-ipvs",
        "kpx-plugin-schedulers",
        "kpx-plugin-hostile",
        "kpx-plugin-nftables-v0-2",
        "kpx-plugin-first",
        "kpx-plugin-wasi-probe",
        "kpx-plugin-hot-v1",
        "kpx-plugin-hot-v2",
        "kpx-plugin-ext-probe",
        "kpx-plugin-ext-v0-2",
    ] {
        args.extend(["--exclude", plugin]);
    }
    args.extend(extra.iter().map(String::as_str));
    cargo(&args)
}

/// The benchmark: release builds of kpx and kpx-bench, then the run.
fn bench(extra: &[String]) -> Result<()> {
    setup::prerequisites()?;
    cargo(&["build", "--release", "-p", "kpx-host", "-p", "kpx-bench"])?;
    let mut args = vec!["--kpx".to_string(), "target/release/kpx".to_string()];
    args.extend(extra.iter().cloned());
    eprintln!("+ target/release/kpx-bench {}", args.join(" "));
    let ok = Command::new("target/release/kpx-bench").args(&args).status().context("run kpx-bench")?.success();
    if !ok {
        bail!("kpx-bench failed");
    }
    Ok(())
}

pub fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("+ cargo {}", args.join(" "));
    let mut command = Command::new(cargo);
    // A CI build starts from a clean clone and never rebuilds: incremental
    // state would only cost disk (about 1.2 GB here).
    if std::env::var_os("CI").is_some() && std::env::var_os("CARGO_INCREMENTAL").is_none() {
        command.env("CARGO_INCREMENTAL", "0");
    }
    let status = command.args(args).status().context("run cargo")?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}
