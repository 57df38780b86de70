//! nftables mode in the real kernel: traffic, `kpx trace --mode nftables`
//! on the live table, incremental transactions, and --cleanup removing
//! the kube-proxy tables and nothing else.

use std::time::{Duration, Instant};

use kpx_netlab::Reply;

use crate::support::*;

const WEB: &str = "10.96.0.10:80";

#[test]
fn nftables_traffic_trace_and_cleanup() {
    let Some(lab) = lab_or_skip(2, "nftables_traffic_trace_and_cleanup") else {
        return;
    };
    let (dir, manifests) = run_dirs("kernel-nftables");
    let (be1, be2) = (&lab.backends[0].ip, &lab.backends[1].ip);
    write_web(&manifests, &[be1]);
    write_manifest(&manifests.join("empty.yaml"), &service("empty", "10.96.0.11"));
    // A table of someone else's, which --cleanup must leave alone.
    lab.node.exec(&["nft", "add", "table", "ip", "someone-else"]).unwrap();
    let args = kpx_args(&manifests, &["--proxy-mode", "nftables"]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());

    assert_eq!(request(&lab, Proto::Tcp, WEB).server(), Some("be1"));
    assert_eq!(request(&lab, Proto::Udp, WEB).server(), Some("be1"));
    assert_eq!(request(&lab, Proto::Tcp, "10.96.0.11:80"), Reply::Refused);
    // As upstream's nftables mode (kubernetes/kubernetes#122663): no
    // `ct state invalid drop`, liberal conntrack or not.
    let table = lab.node.exec(&["nft", "list", "table", "ip", "kube-proxy"]).unwrap();
    assert!(!table.contains("invalid"), "nftables mode drops INVALID packets:\n{table}");

    // An endpoint added: an incremental transaction, in traffic within 2 s.
    let t0 = Instant::now();
    write_web(&manifests, &[be1, be2]);
    let mut seen_be2 = None;
    while t0.elapsed() < Duration::from_secs(4) {
        if request(&lab, Proto::Tcp, WEB).server() == Some("be2") {
            seen_be2 = Some(t0.elapsed());
            break;
        }
    }
    eprintln!("nftables: endpoint added -> traffic: {seen_be2:?}");
    assert!(seen_be2.is_some_and(|d| d <= Duration::from_secs(2)), "{}", kpx.log());
    assert!(kpx.wait_for_log("full=false", 1, Duration::from_secs(5)), "no incremental sync:\n{}", kpx.log());

    // kpx trace reads the live table.
    let explained = lab
        .node
        .exec(&[KPX, "trace", "--mode", "nftables", "--from", "192.168.100.2", "--to", "10.96.0.10:80/tcp"])
        .unwrap();
    eprintln!("kpx trace --mode nftables:\n{explained}");
    for needle in ["10.244.1.5:8080", "10.244.2.5:8080", "masqueraded", "select-internal", "service-ips"] {
        assert!(explained.contains(needle), "kpx trace lacks {needle:?}:\n{explained}");
    }
    let explained = lab
        .node
        .exec(&[KPX, "trace", "--mode", "nftables", "--from", "192.168.100.2", "--to", "10.96.0.11:80/tcp"])
        .unwrap();
    assert!(explained.contains("verdict: REJECT"), "{explained}");

    // A Service of 5,000 endpoints: the hairpin set (an element per
    // endpoint address) is sized at the next full sync (the ServiceCIDR's,
    // below) for twice its elements.
    let ips = |from: usize, n: usize| -> Vec<String> {
        (from..from + n).map(|i| format!("10.245.{}.{}", i / 250, 1 + i % 250)).collect()
    };
    let big = ips(0, 5000);
    let big: Vec<&str> = big.iter().map(String::as_str).collect();
    write_manifest(
        &manifests.join("big.yaml"),
        &format!("{}---\n{}", service("big", "10.96.0.12"), slice("big", &big)),
    );

    // A ServiceCIDR that arrives while kpx runs reaches the kernel (its
    // unallocated addresses are dropped), and its removal lifts the drop.
    let cidr = manifests.join("service-cidr.yaml");
    write_manifest(
        &cidr,
        "apiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec: {cidrs: [10.96.0.0/16]}\n",
    );
    let drops = || {
        let chain = lab.node.exec(&["nft", "list", "chain", "ip", "kube-proxy", "cluster-ips-check"]).unwrap();
        chain.contains("ip daddr 10.96.0.0/16 drop")
    };
    let until = |want: bool| {
        let t0 = Instant::now();
        while drops() != want && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(100));
        }
        drops() == want
    };
    assert!(until(true), "the ServiceCIDR never reached the kernel:\n{}", kpx.log());
    assert!(request(&lab, Proto::Tcp, WEB).server().is_some(), "allocated addresses still answer");
    std::fs::remove_file(&cidr).unwrap();
    assert!(until(false), "the ServiceCIDR's drop stayed after it was deleted:\n{}", kpx.log());

    // 6,000 more endpoints: hairpin would outgrow its size within the
    // partial sync, so the change is written as a full sync that sizes it
    // again, and nothing fails on the way.
    let hairpin = || lab.node.exec(&["nft", "list", "set", "ip", "kube-proxy", "hairpin"]).unwrap();
    let size = |text: &str| text.lines().find_map(|l| l.trim().strip_prefix("size ")?.parse::<u32>().ok());
    assert_eq!(size(&hairpin()), Some(10_004), "hairpin sized at the ServiceCIDR's full syncs");
    let more = ips(5000, 6000);
    let more: Vec<&str> = more.iter().map(String::as_str).collect();
    write_manifest(
        &manifests.join("more.yaml"),
        &format!("{}---\n{}", service("more", "10.96.0.13"), slice("more", &more)),
    );
    assert!(kpx.wait_for_log("past its size", 1, Duration::from_secs(10)), "no resize:\n{}", kpx.log());
    let t0 = Instant::now();
    while size(&hairpin()).is_none_or(|n| n < 22_000) && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let held = hairpin();
    assert_eq!(size(&held), Some(22_004), "hairpin sized again for 11,002 elements");
    assert!(held.contains("10.245.43.250"), "the last endpoint is not in hairpin");
    assert!(!kpx.log().contains("sync failed"), "{}", kpx.log());
    assert!(request(&lab, Proto::Tcp, WEB).server().is_some());

    // --cleanup: the kube-proxy tables go, nothing else does.
    drop(kpx);
    lab.node.exec(&[KPX, "--cleanup"]).expect("kpx --cleanup");
    let tables = lab.node.exec(&["nft", "list", "tables"]).unwrap();
    assert!(!tables.contains("kube-proxy"), "{tables}");
    assert!(tables.contains("table ip someone-else"), "--cleanup removed a foreign table: {tables}");
}
