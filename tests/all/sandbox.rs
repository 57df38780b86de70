//! A hostile backend (plugins/hostile) in both modes: it traps, loops,
//! exhausts memory, floods output, and asks, through the typed contract,
//! for everything a plugin must not get (rules outside Services, DNAT to
//! strangers or departed endpoints, host chains, bad names and text). Each
//! is refused with its reason; the kernel's rules stay as they were
//! (iptables-save without counters, `nft list ruleset`), a Service and an
//! ssh-like listener on the node keep answering, and kpx recovers when the
//! state is sane again.

use std::time::{Duration, Instant};

use kpx_netlab::node::{NODE_IP, NodeLab};
use kpx_netlab::{EchoServer, Reply, tcp_request};

use crate::support::*;

fn hostile_wasm() -> String {
    format!("{}/kpx_plugin_hostile.wasm", env!("KPX_TEST_PLUGIN_DIR"))
}

fn hostile_service(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: tcp, port: 80, protocol: TCP}}]\n"
    )
}

/// (Service name, what the log must say in iptables mode, in nftables mode).
const CASES: &[(&str, &str, &str)] = &[
    ("hostile-trap", "render trapped", "render trapped"),
    ("hostile-loop", "ran out of fuel", "ran out of fuel"),
    ("hostile-memory", "render trapped", "render trapped"),
    ("hostile-huge", "more than the limit", "more than the limit"),
    ("hostile-comment", "printable ASCII only", "printable ASCII only"),
    ("hostile-name", "at most 28 bytes", "names have 1 to 200 bytes"),
    ("hostile-scope", "port 22 is not a node port of the state", ":22 tcp is not the address, protocol and port"),
    ("hostile-dnat", "192.0.2.66:80, which is not an endpoint", "192.0.2.66:80, which is not an endpoint"),
    ("hostile-departed", "10.244.1.5:8080, which is not an endpoint", "10.244.1.5:8080, which is not an endpoint"),
    (
        "hostile-kept",
        "kept from an earlier sync, it DNATs to 10.244.1.5:8080",
        "10.244.1.5:8080, which has left the state",
    ),
    ("hostile-host", "hooks or in the plugin's own chains", "nat-prerouting is the host's"),
    ("hostile-interface", "interface names", "interface names"),
    ("hostile-reject", "Reject is not allowed in the nat table", "reject is the host's"),
    (
        "hostile-affinity",
        "recent list \"SSH\" is not named like one of the plugin's",
        "affinity-internal is not one of the plugin's affinity sets",
    ),
    // iptables-restore commits table by table, so kpx refuses loops itself;
    // nf_tables refuses a reachable loop in the transaction it applies
    // whole (no nftables case: "" skips it).
    ("hostile-jumploop", "the plugin's chains jump in a loop", ""),
    // A hook kept by a ruleset that writes into it (nftables has no hooks).
    ("hostile-keephooks", "in a hook the ruleset keeps", ""),
];

/// The node's rules as the mode's tool prints them (no counters, no handles).
fn rules(lab: &NodeLab, mode: &str) -> String {
    match mode {
        "iptables" => kernel_rules(lab),
        _ => lab.node.exec(&["nft", "list", "ruleset"]).expect("nft list ruleset"),
    }
}

fn ssh_answers(lab: &NodeLab) -> bool {
    matches!(tcp_request(&lab.client, &format!("{NODE_IP}:22"), Duration::from_millis(800)), Reply::Answer { server, .. } if server == "ssh")
}

fn run(mode: &str) {
    let test = format!("hostile_plugin_never_changes_the_kernel ({mode})");
    let Some(lab) = lab_or_skip(2, &test) else {
        return;
    };
    let _ssh = EchoServer::start(&lab.node, "ssh", &format!("{NODE_IP}:22")).expect("an ssh-like listener on the node");
    let (dir, manifests) = run_dirs(&format!("sandbox-{mode}"));
    let (be1, be2) = (&lab.backends[0].ip, &lab.backends[1].ip);
    write_web(&manifests, &[be1]);
    let plugin = hostile_wasm();
    let args = kpx_args(
        &manifests,
        &[
            "--proxy-mode",
            mode,
            "--backend-plugin",
            &plugin,
            "--plugin-fuel",
            "300000000",
            "--plugin-memory-limit-mib",
            "128",
            "--plugin-max-output-mib",
            "8",
            "--iptables-min-sync-period",
            "100ms",
        ],
    );
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    // The whole first pass: `nft list ruleset` shows the IPv6 table too,
    // written after the IPv4 one (CI once took the rules between the two).
    assert!(kpx.wait_for_log("sync pass done ok=true", 1, Duration::from_secs(20)), "no sync:\n{}", kpx.log());
    assert_eq!(servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 5).keys().collect::<Vec<_>>(), ["be1"]);
    assert!(ssh_answers(&lab), "the node's ssh-like listener must answer before anything happens");
    let good_rules = rules(&lab, mode);

    for (i, (name, in_iptables, in_nftables)) in CASES.iter().enumerate() {
        let symptom = if mode == "iptables" { in_iptables } else { in_nftables };
        if symptom.is_empty() {
            continue;
        }
        let file = manifests.join(format!("{name}.yaml"));
        let before = kpx.log().matches(symptom).count();
        write_manifest(&file, &hostile_service(name, &format!("10.96.1.{}", i + 1)));
        // Also replace the real endpoint: be1 leaves the state (what
        // `departed` and `kept` need), and nothing of it may reach the
        // kernel while the plugin misbehaves.
        write_web(&manifests, &[be2]);
        assert!(
            kpx.wait_for_log(symptom, before + 1, Duration::from_secs(15)),
            "{mode} {name}: expected {symptom:?} in the log:\n{}",
            kpx.log()
        );
        assert!(kpx.is_running(), "{mode} {name} brought kpx down:\n{}", kpx.log());
        if *name == "hostile-kept" {
            // Refused in the partial sync; the full resync that follows
            // writes the state as it is: be1 gone, be2 in, nothing stale.
            let t0 = Instant::now();
            while rules(&lab, mode).contains(be1.as_str()) && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(
                !rules(&lab, mode).contains(be1.as_str()),
                "{mode}: the departed endpoint stayed:\n{}",
                rules(&lab, mode)
            );
            assert_eq!(servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 5).keys().collect::<Vec<_>>(), ["be2"]);
            assert!(ssh_answers(&lab), "{mode} {name}: the node's ssh-like listener stopped answering");
        } else {
            assert_eq!(rules(&lab, mode), good_rules, "{mode} {name} changed the kernel's rules");
            let seen = servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 5);
            assert_eq!(seen.keys().collect::<Vec<_>>(), ["be1"], "{mode} {name}: Service traffic changed");
            assert!(ssh_answers(&lab), "{mode} {name}: the node's ssh-like listener stopped answering");
        }
        // Sane again: the real endpoint back first, then the hostile
        // Service gone, so no sync in between can program anything else.
        write_web(&manifests, &[be1]);
        std::fs::remove_file(&file).unwrap();
        let synced = kpx.log().matches("synced rules family=IPv4").count();
        assert!(
            kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(15)),
            "{mode} {name}: no recovery:\n{}",
            kpx.log()
        );
        let t0 = Instant::now();
        while rules(&lab, mode) != good_rules && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(rules(&lab, mode), good_rules, "{mode} {name}: rules after recovery");
        eprintln!("{mode} {name}: refused ({symptom}); kernel, Service and ssh unchanged; recovered");
    }
    // After recovery, a real change reaches the kernel again.
    write_web(&manifests, &[be2]);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if servers_seen(&lab, Proto::Tcp, "10.96.0.10:80", 3).keys().collect::<Vec<_>>() == ["be2"] {
            return;
        }
    }
    panic!("{mode}: changes no longer apply after the hostile episodes:\n{}", kpx.log());
}

#[test]
fn hostile_plugin_never_changes_the_kernel_iptables() {
    run("iptables");
}

#[test]
fn hostile_plugin_never_changes_the_kernel_nftables() {
    run("nftables");
}
