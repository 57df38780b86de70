//! The plugin author's path, run as written: docs/plugins.md's command
//! blocks and files, in order, from an empty directory (a new plugin crate,
//! its unit tests, its component, `kpx conformance`, `kpx demo` with it,
//! the reference sections' tests of every plan and of an allow-list), and
//! the out-of-tree example (examples/maglev-scheduler) built apart,
//! checked and carrying real traffic.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::schedulers::{client_addresses, tcp_from, write_service};
use crate::support::*;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// A command with the outer cargo's build settings removed, and kpx on
/// the PATH.
fn clean(mut cmd: Command) -> Command {
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let bin = Path::new(KPX).parent().unwrap();
    cmd.env("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default()));
    cmd
}

/// The guide as one bash script: its ```sh blocks, and its ```rust
/// file=PATH blocks written where they say, in order.
fn guide_script(guide: &str) -> (String, usize) {
    let mut script = String::from("set -euo pipefail\n");
    let mut blocks = 0;
    let mut lines = guide.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        let body = body.join("\n");
        if info == "sh" {
            script.push_str(&body);
            script.push('\n');
            blocks += 1;
        } else if let Some(file) = info.strip_prefix("rust file=") {
            assert!(!body.contains("KPX_GUIDE_EOF"), "the guide's file holds the heredoc marker");
            script.push_str(&format!(
                "mkdir -p \"$(dirname {file})\"\ncat > {file} <<'KPX_GUIDE_EOF'\n{body}\nKPX_GUIDE_EOF\n"
            ));
            blocks += 1;
        }
    }
    (script, blocks)
}

#[test]
fn the_plugin_guide_runs_as_written() {
    if !nix::unistd::geteuid().is_root() {
        return eprintln!("SKIPPED the_plugin_guide_runs_as_written: its kpx demo step needs root");
    }
    let guide = std::fs::read_to_string(workspace().join("docs/plugins.md")).unwrap();
    let (script, blocks) = guide_script(&guide);
    assert!(blocks >= 6, "the guide has {blocks} runnable blocks");
    let (dir, _) = run_dirs("guide");
    let work = dir.join("work");
    std::fs::create_dir(&work).unwrap();
    let t0 = Instant::now();
    let out = clean(Command::new("bash")).arg("-c").arg(&script).current_dir(&work).output().unwrap();
    let took = t0.elapsed();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "the guide's commands failed (after {took:?})");
    eprintln!("the guide, from an empty directory: {blocks} blocks in {:.0} s (builds included)", took.as_secs_f64());
    assert!(text.contains("test result: ok. 2 passed"), "the guide's unit tests");
    for test in ["every_plan_and_the_modes_that_run_it", "the_bounds_kpx_checks", "only_the_listed_sources_pass"] {
        assert!(text.contains(&format!("test {test} ... ok")), "the guide's test {test}");
    }
    assert!(text.lines().any(|l| l.starts_with("PASS: ")), "kpx conformance passes the guide's scheduler");
    assert_eq!(text.lines().filter(|l| l.starts_with("PASS: ")).count(), 2, "and the extension template: {text}");
    let objects = text
        .lines()
        .find(|l| l.starts_with("contract: the rules lay out into kernel objects of both modes"))
        .and_then(|l| l.split_whitespace().rev().nth(3)?.parse::<usize>().ok());
    assert!(objects.is_some_and(|n| n > 0), "the annotated template returned rules the kit checked: {objects:?}");
    let clients: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("client ")).collect();
    assert_eq!(clients.len(), 8, "{text}");
    let mut reached = BTreeSet::new();
    for line in &clients {
        let answers: Vec<&str> = line.split("-> ").nth(1).unwrap().split(", ").collect();
        assert!(answers.len() == 3 && answers.iter().all(|a| *a == answers[0] && a.starts_with("be")), "{line}");
        reached.insert(answers[0].to_string());
    }
    assert!(reached.len() >= 2, "the clients spread: {reached:?}");
}

/// Every fenced block of the guide is one its run covers (```sh, ```rust
/// file=PATH) or not code (```text, ```yaml): a Rust or shell example in
/// another form would go unchecked. Needs no root.
#[test]
fn every_block_of_the_guide_is_run_or_plain_text() {
    let guide = std::fs::read_to_string(workspace().join("docs/plugins.md")).unwrap();
    let mut lines = guide.lines();
    let mut infos = Vec::new();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else { continue };
        lines.by_ref().take_while(|l| !l.starts_with("```")).for_each(drop);
        infos.push(info.to_string());
    }
    let run = |info: &str| info == "sh" || info.starts_with("rust file=");
    let stray: Vec<&String> =
        infos.iter().filter(|i| !run(i.as_str()) && !matches!(i.as_str(), "text" | "yaml")).collect();
    assert!(stray.is_empty(), "blocks of docs/plugins.md the guide's run skips: {stray:?}");
    let (_, blocks) = guide_script(&guide);
    assert_eq!(blocks, infos.iter().filter(|i| run(i.as_str())).count(), "{infos:?}");
    for file in ["src/lib.rs", "tests/plans.rs", "tests/allowlist.rs"] {
        assert!(infos.iter().any(|i| *i == format!("rust file={file}")), "the guide writes {file}: {infos:?}");
    }
}

/// examples/maglev-scheduler: its own workspace and lock file, built with
/// its one command, passes `kpx conformance`, and loaded into a running
/// kpx keeps each client on one endpoint while clients spread.
#[test]
fn the_out_of_tree_maglev_example_passes_conformance_and_carries_traffic() {
    let example = workspace().join("examples/maglev-scheduler");
    let t0 = Instant::now();
    let status = clean(Command::new("cargo")).args(["test", "--locked"]).current_dir(&example).status().unwrap();
    assert!(status.success(), "examples/maglev-scheduler's unit tests failed");
    let status = clean(Command::new("cargo")).args(["plugin", "--locked"]).current_dir(&example).status().unwrap();
    assert!(status.success(), "building examples/maglev-scheduler failed");
    eprintln!("examples/maglev-scheduler tested and built in {:.0} s", t0.elapsed().as_secs_f64());
    let wasm = example.join("target/wasm32-unknown-unknown/release/maglev_scheduler.wasm");
    let out = Command::new(KPX).args(["conformance", wasm.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(out.status.success(), "the example fails conformance");
    assert!(text.contains("maglev: one of 4 endpoints gone remaps at most 1/4 + 2 points of clients"), "{text}");

    let Some(lab) = lab_or_skip(3, "the_out_of_tree_maglev_example carrying traffic") else {
        return;
    };
    let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    let (dir, manifests) = run_dirs("maglev-example");
    write_service(&manifests, "web", "10.96.0.10", &[("kpx.dev/scheduler", "maglev")], &eps, &[]);
    let plugin = format!("ext={}", wasm.display());
    let args = kpx_args(&manifests, &["--proxy-mode", "nftables", "--scheduler-plugin", &plugin]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    assert!(kpx.log().contains("scheduler component: [\"maglev\"] plugin=ext"), "{}", kpx.log());
    let mut per_client: BTreeMap<std::net::IpAddr, String> = BTreeMap::new();
    for c in client_addresses(&lab, 12) {
        let answers: Vec<String> = (0..3).map(|_| tcp_from(&lab, Some(c), "10.96.0.10:80")).collect();
        assert!(answers.iter().all(|a| a == &answers[0] && a.starts_with("be")), "client {c}: {answers:?}");
        per_client.insert(c, answers[0].clone());
    }
    let spread: BTreeSet<&String> = per_client.values().collect();
    eprintln!("maglev example: 12 clients reached {spread:?}");
    assert!(spread.len() >= 2, "{per_client:?}");
}
