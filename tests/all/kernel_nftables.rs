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

/// An operator saving and restoring the node's firewall
/// (`nft list ruleset > saved; nft -f saved`) with kpx's nftables mode
/// running: every kind of object it writes, in both families (endpoint
/// maps picked by numgen, slot tables by numgen and jhash, affinity,
/// source ranges, node ports and the localhost refusals with their
/// counters, and extensions' tables) loads back into a fresh namespace,
/// lists again as the same text, and `nft -j` reads it.
#[test]
fn the_nodes_saved_ruleset_loads_back() {
    let Some(lab) = lab_or_skip(2, "the_nodes_saved_ruleset_loads_back") else {
        return;
    };
    let (dir, manifests) = run_dirs("relist");
    let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    use crate::schedulers::write_service;
    write_service(&manifests, "plain", "10.96.0.30", &[], &eps, &[]);
    write_service(&manifests, "rr", "10.96.0.31", &[("kpx.dev/scheduler", "rr")], &eps, &[]);
    write_service(&manifests, "maglev", "10.96.0.32", &[("kpx.dev/scheduler", "maglev")], &eps, &[]);
    write_service(&manifests, "sh", "10.96.0.33", &[("kpx.dev/scheduler", "sh")], &eps, &[]);
    write_service(
        &manifests,
        "limited",
        "10.96.0.34",
        &[("ext.kpx.dev/ratelimit.new-connections-per-second", "5")],
        &eps,
        &[],
    );
    let v4 = |ips: &[&str]| ips.iter().map(|ip| format!("  - {{addresses: [\"{ip}\"]}}\n")).collect::<String>();
    let more = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: sticky, namespace: test}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.35\n  clusterIPs: [10.96.0.35, \"fd00:96::35\"]\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  sessionAffinity: ClientIP\n  loadBalancerSourceRanges: [192.168.100.0/24, \"fd00:100::/64\"]\n  ports:\n  - {{name: tcp, port: 80, targetPort: 8080, nodePort: 30090, protocol: TCP}}\n  - {{name: udp, port: 53, targetPort: 8080, nodePort: 30091, protocol: UDP}}\nstatus: {{loadBalancer: {{ingress: [{{ip: 198.51.100.7}}, {{ip: \"2001:db8:51::7\"}}]}}}}\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: sticky-v4, namespace: test, labels: {{kubernetes.io/service-name: sticky}}}}\naddressType: IPv4\nports: [{{name: tcp, port: 8080, protocol: TCP}}, {{name: udp, port: 8080, protocol: UDP}}]\nendpoints:\n{}---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: sticky-v6, namespace: test, labels: {{kubernetes.io/service-name: sticky}}}}\naddressType: IPv6\nports: [{{name: tcp, port: 8080, protocol: TCP}}, {{name: udp, port: 8080, protocol: UDP}}]\nendpoints:\n  - {{addresses: [\"fd00:244:1::5\"], nodeName: node}}\n  - {{addresses: [\"fd00:244:2::5\"]}}\n",
        v4(&eps)
    );
    write_manifest(&manifests.join("sticky.yaml"), &more);
    let example = |f: &str| format!("{}/{f}", env!("KPX_TEST_PLUGIN_DIR"));
    let ratelimit = format!("ratelimit={}", example("kpx_example_ratelimit.wasm"));
    let conncount = format!("conncount={}", example("kpx_example_conncount.wasm"));
    // Rejects: a TCP port's with a reset, a UDP port's with ICMP; before
    // them a counted accept (a return from the port chain).
    let rejects = format!("rejects={},do=reject-documentation", example("kpx_plugin_ext_probe.wasm"));
    let args = kpx_args(
        &manifests,
        &["--proxy-mode", "nftables", "--extension", &ratelimit, "--extension", &conncount, "--extension", &rejects],
    );
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv6", 1, Duration::from_secs(30)), "{}", kpx.log());
    // Traffic first, so that counters and affinity sets hold something.
    assert!(request(&lab, Proto::Tcp, "10.96.0.35:80").server().is_some(), "{}", kpx.log());
    let _ = kpx_netlab::tcp_request(&lab.node, "127.0.0.1:30090", Duration::from_secs(1));
    let listing = lab.node.exec(&["nft", "list", "ruleset"]).unwrap();
    for kind in [
        "table ip kube-proxy",
        "table ip6 kube-proxy",
        "table ip kpx-ratelimit",
        "table ip kpx-conncount",
        "table ip6 kpx-rejects",
        "meta l4proto tcp counter name",
        "reject with tcp reset",
        // The UDP port's: ICMP port unreachable, which nft lists bare.
        "\" reject\n",
        "typeof ip daddr . meta l4proto . th dport . numgen random mod 2 : ip daddr . tcp dport",
        "typeof numgen inc mod 2 : verdict",
        // maglev's slots over jhash, which nft cannot list as typeof.
        "typeof numgen random mod 32 . numgen random mod 32 : verdict",
        "counter localhost-nodeport-reject-tcp",
        "flags interval",
        "timeout 3h",
    ] {
        assert!(listing.contains(kind), "the ruleset has no {kind:?}:\n{listing}");
    }
    let accept = |l: &str| l.contains("saddr 192.0.2.128/25 counter name \"c-") && l.trim_end().ends_with(" return");
    assert!(listing.lines().any(accept), "the probe's counted accept, a return:\n{listing}");
    crate::support::nft_relist(&listing).unwrap_or_else(|e| panic!("{e}\n(saved from)\n{listing}"));

    // A partial sync that declares maps the table did not hold (a Service
    // of five endpoints, another of seven): they load back too.
    let more: Vec<String> = (1..=7).map(|i| format!("10.244.77.{i}")).collect();
    let more: Vec<&str> = more.iter().map(String::as_str).collect();
    let partial = "synced rules family=IPv4 full=false";
    let before = kpx.log().matches(partial).count();
    write_service(&manifests, "five", "10.96.0.36", &[], &more[..5], &[]);
    write_service(&manifests, "seven", "10.96.0.37", &[], &more, &[]);
    // (One partial sync or two: polled until both are there.)
    let wanted = ["numgen random mod 5", "numgen random mod 7"];
    let t0 = std::time::Instant::now();
    let listing = loop {
        let listing = lab.node.exec(&["nft", "list", "ruleset"]).unwrap();
        if wanted.iter().all(|m| listing.contains(m)) || t0.elapsed() > Duration::from_secs(20) {
            break listing;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for map in wanted {
        assert!(listing.contains(map), "no {map:?} after 20 s:\n{listing}\n{}", kpx.log());
    }
    let log = kpx.log();
    assert!(log.matches(partial).count() > before, "written by partial syncs:\n{log}");
    assert!(!log.contains("sync failed"), "{log}");
    crate::support::nft_relist(&listing)
        .unwrap_or_else(|e| panic!("after a partial sync: {e}\n(saved from)\n{listing}"));
    drop(kpx);
}
