//! The plugin author's path, run as written: docs/plugins.md's command
//! blocks and files, in order, from an empty directory (a new plugin crate,
//! its unit tests, its component, `kpx conformance`, `kpx demo` with it,
//! the reference sections' tests of every plan and of an allow-list), and
//! the out-of-tree examples (examples/maglev-scheduler,
//! examples/failover-scheduler, examples/allowlist-extension) built apart,
//! checked and carrying real traffic.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::extension::counter_reaches;
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
    assert!(text.contains("maglev: promises spread, weighted, sticky, minimal-disruption"), "{text}");
    let disruption = "maglev: minimal-disruption: one of 4 endpoints gone moves at most 1/4 + 2 points of clients";
    assert!(text.lines().any(|l| l.starts_with(disruption) && l.ends_with("pass")), "{text}");

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
    let mut per_client: BTreeMap<IpAddr, String> = BTreeMap::new();
    for c in client_addresses(&lab, 12) {
        let answers: Vec<String> = (0..3).map(|_| tcp_from(&lab, Some(c), "10.96.0.10:80")).collect();
        assert!(answers.iter().all(|a| a == &answers[0] && a.starts_with("be")), "client {c}: {answers:?}");
        per_client.insert(c, answers[0].clone());
    }
    let spread: BTreeSet<&String> = per_client.values().collect();
    eprintln!("maglev example: 12 clients reached {spread:?}");
    assert!(spread.len() >= 2, "{per_client:?}");
}

/// examples/failover-scheduler: a priority (failover) scheduler built out
/// of tree with its one command, passing `kpx conformance` (its `priority`
/// promise checked, and no spread asked of it), and in a running kpx
/// (nftables mode) sending every connection to the lowest address however
/// the slice lists them, then, as that endpoint is drained (weight 0) and
/// the next one removed, to the next.
#[test]
fn the_out_of_tree_failover_example_passes_conformance_and_fails_over() {
    let example = workspace().join("examples/failover-scheduler");
    let t0 = Instant::now();
    let status = clean(Command::new("cargo")).args(["test", "--locked"]).current_dir(&example).status().unwrap();
    assert!(status.success(), "examples/failover-scheduler's unit tests failed");
    let status = clean(Command::new("cargo")).args(["plugin", "--locked"]).current_dir(&example).status().unwrap();
    assert!(status.success(), "building examples/failover-scheduler failed");
    eprintln!("examples/failover-scheduler tested and built in {:.0} s", t0.elapsed().as_secs_f64());
    let wasm = example.join("target/wasm32-unknown-unknown/release/failover_scheduler.wasm");
    let out = Command::new(KPX).args(["conformance", wasm.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(out.status.success(), "the example fails conformance");
    assert!(text.lines().any(|l| l.starts_with("failover: promises priority") && l.ends_with("pass")), "{text}");
    let priority = "failover: priority: each connection goes to the first candidate that may take it";
    assert!(text.lines().any(|l| l.starts_with(priority) && l.ends_with("pass")), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("failover: spread")), "no spread asked of it:\n{text}");

    let Some(lab) = lab_or_skip(3, "the_out_of_tree_failover_example failing over") else {
        return;
    };
    // be3, be2, be1: the slice's order is not the candidates'.
    let eps: Vec<&str> = lab.backends.iter().rev().map(|b| b.ip.as_str()).collect();
    let (dir, manifests) = run_dirs("failover-example");
    let scheduler = [("kpx.dev/scheduler", "failover")];
    write_service(&manifests, "db", "10.96.0.10", &scheduler, &eps, &[]);
    let plugin = format!("ext={}", wasm.display());
    let args = kpx_args(&manifests, &["--proxy-mode", "nftables", "--scheduler-plugin", &plugin]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    assert!(kpx.log().contains("scheduler component: [\"failover\"] plugin=ext"), "{}", kpx.log());
    let all_on = |name: &str| BTreeMap::from([(name.to_string(), 12usize)]);
    let seen = servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 12);
    assert_eq!(seen, all_on("be1"), "the lowest address takes every connection\n{}", kpx.log());

    // be1 drained, then be2 gone from the slice: the next takes over.
    let drained = [("kpx.dev/weights", "10.244.1.5=0")];
    let without_be2: Vec<&str> = eps.iter().copied().filter(|ip| *ip != "10.244.2.5").collect();
    for (endpoints, want) in [(&eps, "be2"), (&without_be2, "be3")] {
        let synced = kpx.log().matches("synced rules family=IPv4").count();
        write_service(&manifests, "db", "10.96.0.10", &scheduler, endpoints, &drained);
        assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(10)), "{}", kpx.log());
        let seen = servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 12);
        assert_eq!(seen, all_on(want), "endpoints {endpoints:?}, be1 drained\n{}", kpx.log());
    }
    eprintln!("failover example: be1 took every connection, then be2 (be1 drained), then be3 (be2 gone)");
}

/// examples/allowlist-extension: an extension built out of tree (its own
/// workspace and lock file) with its one command, passing `kpx
/// conformance` with an allow-list on every Service of the kit's states
/// and with an unusable one, and loaded into a running kpx in both rule
/// modes: a listed client reaches the guarded Service and an unlisted one
/// does not (each attempt counted as `denied`), a Service without the
/// annotation answers both, and one whose list has a typo answers no one.
#[test]
fn the_out_of_tree_allowlist_example_passes_conformance_and_guards_a_service() {
    let example = workspace().join("examples/allowlist-extension");
    let t0 = Instant::now();
    let status = clean(Command::new("cargo")).args(["test", "--locked"]).current_dir(&example).status().unwrap();
    assert!(status.success(), "examples/allowlist-extension's unit tests failed");
    let status = clean(Command::new("cargo")).args(["plugin", "--locked"]).current_dir(&example).status().unwrap();
    assert!(status.success(), "building examples/allowlist-extension failed");
    eprintln!("examples/allowlist-extension tested and built in {:.0} s", t0.elapsed().as_secs_f64());
    let wasm = example.join("target/wasm32-unknown-unknown/release/allowlist_extension.wasm");
    // A list that fits (two accepts and the drop a port for IPv4, one and
    // the drop for IPv6), and one with a typo (one drop-all rule a port).
    for list in ["allow=10.1.0.0/16,192.168.7.9,2001:db8::/32", "allow=10.1.0.0/16,10.1.2.300"] {
        let out = Command::new(KPX)
            .args(["conformance", wasm.to_str().unwrap(), "--extension-annotation", list])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("{text}");
        assert!(out.status.success(), "the example fails conformance with {list}");
        let laid_out = text
            .lines()
            .find(|l| l.starts_with("contract: the rules lay out into kernel objects of both modes"))
            .and_then(|l| l.split_whitespace().rev().nth(3)?.parse::<usize>().ok());
        assert!(laid_out.is_some_and(|n| n > 0), "{list}: the kit checked rules the example returned: {laid_out:?}");
    }

    for mode in ["nftables", "iptables"] {
        let Some(lab) = lab_or_skip(2, &format!("the_out_of_tree_allowlist_example carrying traffic ({mode})")) else {
            return;
        };
        let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
        let (dir, manifests) = run_dirs(&format!("allowlist-example-{mode}"));
        // 192.168.100.100 to .105: .100, .102 and .103 listed.
        let clients = client_addresses(&lab, 6);
        let listed: Vec<IpAddr> =
            ["192.168.100.100", "192.168.100.102", "192.168.100.103"].iter().map(|a| a.parse().unwrap()).collect();
        let list = "192.168.100.100, 192.168.100.102/31, fd00:100::/64";
        write_service(&manifests, "guarded", "10.96.0.10", &[("ext.kpx.dev/allow.allow", list)], &eps, &[]);
        write_service(&manifests, "open", "10.96.0.11", &[], &eps, &[]);
        let typo = [("ext.kpx.dev/allow.allow", "192.168.100.100, 192.168.100.300")];
        write_service(&manifests, "typo", "10.96.0.12", &typo, &eps, &[]);
        let ext = format!("allow={}", wasm.display());
        let args = kpx_args(&manifests, &["--proxy-mode", mode, "--extension", &ext]);
        let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
        assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
        let objects = match mode {
            "nftables" => lab.node.exec(&["nft", "list", "ruleset"]).unwrap(),
            _ => lab.node.exec(&["iptables-save"]).unwrap(),
        };
        let want = if mode == "nftables" { "table ip kpx-allow" } else { ":KUBE-X-ALLOW-DISPATCH" };
        assert!(objects.contains(want), "{mode}: {want} missing:\n{objects}");

        let mut denied = 0u64;
        for c in &clients {
            let answer = tcp_from(&lab, Some(*c), "10.96.0.10:80");
            if listed.contains(c) {
                assert!(answer.starts_with("be"), "{mode}: listed client {c} to the guarded Service: {answer}");
            } else {
                assert_eq!(answer, "Timeout", "{mode}: unlisted client {c} to the guarded Service: dropped");
                denied += 1;
            }
            let open = tcp_from(&lab, Some(*c), "10.96.0.11:80");
            assert!(open.starts_with("be"), "{mode}: client {c} to the Service without a list: {open}");
            let closed = tcp_from(&lab, Some(*c), "10.96.0.12:80");
            assert_eq!(closed, "Timeout", "{mode}: client {c} to the Service whose list has a typo: dropped");
        }
        assert_eq!(denied, 3, "{mode}: {clients:?}");
        let count = |service, counter, want| counter_reaches(&lab, "allow", service, counter, want);
        assert_eq!(count("test/guarded:tcp", "denied", denied), Some(denied), "{mode}: each unlisted attempt");
        assert_eq!(count("test/typo:tcp", "denied_unusable_list", 6), Some(6), "{mode}: each attempt");
        let why = "test/typo: annotation allow: \"192.168.100.300\" is not an IP address or a CIDR";
        assert!(kpx.log().contains(why), "{mode}: the typo is logged:\n{}", kpx.log());
        eprintln!("{mode}: allowlist example: 3 listed clients in, 3 unlisted dropped and counted, the typo closed");
    }

    // The same extension in `kpx demo`: its eight clients (192.168.100.100
    // to .107) through the web Service, which lists the demo's own client
    // and .100/31; the others dropped and counted.
    let list = "ext.kpx.dev/allow.allow=192.168.100.2,192.168.100.100/31";
    let ext = format!("allow={}", wasm.display());
    let out = Command::new(KPX)
        .args(["demo", "--proxy-mode", "nftables", "--extension", &ext, "--annotation", list])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kpx demo --extension failed");
    let client = |ip: &str| text.lines().find(|l| l.contains(&format!("client {ip} "))).unwrap_or_default().to_string();
    for ip in ["192.168.100.100", "192.168.100.101"] {
        assert!(client(ip).contains("-> be"), "listed {ip}: {}", client(ip));
    }
    for ip in ["192.168.100.102", "192.168.100.107"] {
        assert!(client(ip).contains("-> Timeout, Timeout, Timeout"), "unlisted {ip}: {}", client(ip));
    }
    let denied = text
        .lines()
        .find(|l| {
            l.contains("kpx_extension_counter_total{") && l.contains("service=\"demo/web:http\",counter=\"denied\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(denied.is_some_and(|n| n >= 18), "6 unlisted clients, 3 TCP attempts each, counted: {denied:?}\n{text}");
}
