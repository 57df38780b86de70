//! Real kernel, real packets: kpx in a node namespace programs iptables,
//! and a client namespace sends TCP and UDP to a ClusterIP.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kpx_netlab::Reply;
use kpx_netlab::node::NodeLab;

use crate::support::*;

const WEB: &str = "10.96.0.10:80";
const EMPTY: &str = "10.96.0.11:80";

fn start(lab: &NodeLab, dir: &std::path::Path) -> kpx_netlab::node::Kpx {
    let args = kpx_args(&dir.join("manifests"), &[]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(
        kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)),
        "kpx did not sync:\n{}",
        kpx.log()
    );
    kpx
}

/// Packets counted by the REJECT rule of the Service without endpoints.
fn reject_packets(lab: &NodeLab) -> u64 {
    let saved = lab.node.exec(&["iptables-save", "-c", "-t", "filter"]).expect("iptables-save -c");
    let line = saved
        .lines()
        .find(|l| l.contains("-A KUBE-SERVICES") && l.contains("10.96.0.11/32") && l.contains("REJECT"))
        .unwrap_or_else(|| panic!("no REJECT rule for {EMPTY}:\n{saved}"));
    let counters = line.strip_prefix('[').and_then(|l| l.split_once(']')).map(|(c, _)| c);
    counters.and_then(|c| c.split_once(':')).and_then(|(p, _)| p.parse().ok()).unwrap_or(0)
}

/// Polls until `done` holds for a round of requests; the time it took.
fn time_until(
    lab: &NodeLab,
    proto: Proto,
    limit: Duration,
    done: impl Fn(&std::collections::BTreeMap<String, usize>) -> bool,
) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit + Duration::from_secs(3) {
        if done(&servers_seen(lab, proto, WEB, 12)) {
            return Some(t0.elapsed());
        }
    }
    None
}

#[test]
fn clusterip_tcp_udp_reject_and_endpoint_changes() {
    let Some(lab) = lab_or_skip(3, "clusterip_tcp_udp_reject_and_endpoint_changes") else {
        return;
    };
    let names: Vec<String> = lab.lab.namespaces().iter().map(|n| n.name.clone()).collect();
    let (dir, manifests) = run_dirs("kernel-iptables");
    let (be1, be2, be3) = (&lab.backends[0].ip, &lab.backends[1].ip, &lab.backends[2].ip);
    write_web(&manifests, &[be1, be2]);
    write_manifest(&manifests.join("empty.yaml"), &service("empty", "10.96.0.11"));
    let kpx = start(&lab, &dir);

    // Every backend is reached, over TCP and UDP, masqueraded to the node's
    // address on the backend's link (the client is outside the cluster CIDR).
    for proto in [Proto::Tcp, Proto::Udp] {
        let mut servers = BTreeSet::new();
        for _ in 0..40 {
            match request(&lab, proto, WEB) {
                Reply::Answer { server, seen_from } => {
                    let i = &server[2..];
                    assert_eq!(seen_from, format!("10.244.{i}.1"), "{proto:?} from {server} not masqueraded");
                    servers.insert(server);
                }
                other => panic!("{proto:?} request to {WEB} failed: {other:?}\n{}", kpx.log()),
            }
        }
        assert_eq!(servers, BTreeSet::from(["be1".to_string(), "be2".to_string()]), "{proto:?}");
    }

    // Localhost node ports (on by default) need route_localnet.
    let route_localnet = lab.node.exec(&["cat", "/proc/sys/net/ipv4/conf/all/route_localnet"]).unwrap();
    assert_eq!(route_localnet.trim(), "1", "route_localnet not set for localhost node ports");

    // `kpx trace` explains the same from the live rules.
    let explained = lab.node.exec(&[KPX, "trace", "--from", "192.168.100.2", "--to", "10.96.0.10:80/tcp"]).unwrap();
    eprintln!("kpx trace:\n{explained}");
    for needle in ["10.244.1.5:8080", "10.244.2.5:8080", "KUBE-SVC-", "masqueraded", "path 2 of 2"] {
        assert!(explained.contains(needle), "kpx trace output lacks {needle:?}:\n{explained}");
    }
    let explained = lab.node.exec(&[KPX, "trace", "--from", "192.168.100.2", "--to", "10.96.0.11:80/udp"]).unwrap();
    assert!(explained.contains("verdict: REJECT"), "{explained}");
    eprintln!("kpx trace:\n{explained}");

    // Hairpin: a backend reaching itself through the service is
    // masqueraded to the node, or its reply would never return.
    let be1_ns = lab.backends[0].ns.clone();
    let mut hairpin = None;
    for _ in 0..40 {
        let reply = kpx_netlab::tcp_request(&be1_ns, WEB, Duration::from_millis(800));
        if let Reply::Answer { server, seen_from } = reply
            && server == "be1"
        {
            hairpin = Some(seen_from);
            break;
        }
    }
    assert_eq!(hairpin.as_deref(), Some("10.244.1.1"), "hairpin connection not answered or not masqueraded");

    // No endpoints: refused at once, not a time-out.
    for proto in [Proto::Tcp, Proto::Udp] {
        let t0 = Instant::now();
        let reply = request(&lab, proto, EMPTY);
        assert_eq!(reply, Reply::Refused, "{proto:?} to a service without endpoints; rules:\n{}", kernel_rules(&lab));
        assert!(t0.elapsed() < Duration::from_millis(500), "{proto:?} refusal took {:?}", t0.elapsed());
    }

    // Partial syncs edit kube-proxy's top-level chains in place: the
    // other Services' rules there keep their counters (a rewrite of the
    // chain would zero them).
    let rejected = reject_packets(&lab);
    assert!(rejected > 0, "the refusals did not go through the REJECT rule:\n{}", kernel_rules(&lab));

    // An endpoint added in the manifest shows in traffic within 2 s.
    let t0 = Instant::now();
    write_web(&manifests, &[be1, be2, be3]);
    let added = time_until(&lab, Proto::Tcp, Duration::from_secs(2), |seen| seen.contains_key("be3"));
    let added = added.map(|_| t0.elapsed());
    eprintln!("endpoint added -> traffic: {added:?}");
    assert!(added.is_some_and(|d| d <= Duration::from_secs(2)), "be3 not reached within 2 s: {added:?}\n{}", kpx.log());

    // An endpoint removed is gone from traffic within 2 s.
    let t0 = Instant::now();
    write_web(&manifests, &[be2, be3]);
    let removed =
        time_until(&lab, Proto::Udp, Duration::from_secs(2), |seen| !seen.contains_key("be1") && seen.len() == 2);
    let removed = removed.map(|_| t0.elapsed());
    eprintln!("endpoint removed -> traffic: {removed:?}");
    assert!(
        removed.is_some_and(|d| d <= Duration::from_secs(2)),
        "be1 still reached after 2 s: {removed:?}\n{}",
        kpx.log()
    );

    assert!(
        reject_packets(&lab) >= rejected,
        "filter KUBE-SERVICES was rewritten by a partial sync (counter {} -> {})",
        rejected,
        reject_packets(&lab)
    );

    // Deleting the Service's file removes its rules and chains.
    std::fs::remove_file(manifests.join("web.yaml")).unwrap();
    let t0 = Instant::now();
    while kernel_rules(&lab).contains("test/web") && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let rules = kernel_rules(&lab);
    assert!(!rules.contains("test/web") && !rules.contains("KUBE-SEP-"), "stale rules after delete:\n{rules}");
    assert!(request(&lab, Proto::Tcp, WEB).server().is_none(), "a deleted service still answers");

    drop(kpx);
    drop(lab);
    let left = kpx_netlab::run("ip", &["netns", "list"]).unwrap();
    for name in names {
        assert!(!left.contains(&name), "namespace {name} left behind");
    }
}

#[test]
fn conntrack_tcp_be_liberal_sets_the_sysctl_and_keeps_invalid_packets() {
    let Some(lab) = lab_or_skip(1, "conntrack_tcp_be_liberal_sets_the_sysctl_and_keeps_invalid_packets") else {
        return;
    };
    let (dir, manifests) = run_dirs("be-liberal");
    write_web(&manifests, &[&lab.backends[0].ip]);
    let args = kpx_args(
        &manifests,
        &[
            "--conntrack-tcp-be-liberal",
            "--iptables-localhost-nodeports=false",
            "--conntrack-tcp-timeout-established",
            "2h",
            "--conntrack-udp-timeout",
            "45s",
        ],
    );
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    let liberal = lab.node.exec(&["cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"]).unwrap();
    assert_eq!(liberal.trim(), "1");
    let rules = kernel_rules(&lab);
    assert!(!rules.contains("INVALID"), "INVALID packets still dropped:\n{rules}");
    assert!(!rules.contains("KUBE-FIREWALL"), "localnet firewall without localhost node ports:\n{rules}");
    let localnet = lab.node.exec(&["cat", "/proc/sys/net/ipv4/conf/all/route_localnet"]).unwrap();
    assert_eq!(localnet.trim(), "0", "route_localnet set though localhost node ports are off");
    assert_eq!(request(&lab, Proto::Tcp, WEB).server(), Some("be1"));
    for (name, want) in [("nf_conntrack_tcp_timeout_established", "7200"), ("nf_conntrack_udp_timeout", "45")] {
        let got = lab.node.exec(&["cat", &format!("/proc/sys/net/netfilter/{name}")]).unwrap();
        assert_eq!(got.trim(), want, "{name}");
    }

    // --cleanup removes every chain and jump kpx made, in both families.
    drop(kpx);
    lab.node.exec(&[KPX, "--cleanup"]).expect("kpx --cleanup");
    for save in ["iptables-save", "ip6tables-save"] {
        let left = lab.node.exec(&[save]).unwrap();
        assert!(!left.contains("KUBE-"), "{save} after --cleanup:\n{left}");
    }
    assert!(request(&lab, Proto::Tcp, WEB).server().is_none(), "the service still answers after --cleanup");
}

/// upstream's iptables proxier decides the INVALID drop from the node's
/// nf_conntrack_tcp_be_liberal as it finds it after the sysctls are set:
/// an operator's own setting counts as the flag does.
#[test]
fn a_node_with_liberal_conntrack_gets_no_invalid_drop() {
    let Some(lab) = lab_or_skip(1, "a_node_with_liberal_conntrack_gets_no_invalid_drop") else {
        return;
    };
    let (dir, manifests) = run_dirs("node-liberal");
    write_web(&manifests, &[&lab.backends[0].ip]);
    let args = kpx_args(&manifests, &[]);
    for (liberal, dropped) in [("0", true), ("1", false)] {
        lab.node
            .exec(&["sysctl", "-q", "-w", &format!("net.netfilter.nf_conntrack_tcp_be_liberal={liberal}")])
            .unwrap();
        let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join(format!("kpx-{liberal}.log"))).expect("start kpx");
        assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
        let rules = kernel_rules(&lab);
        assert_eq!(
            rules.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID"),
            dropped,
            "be_liberal={liberal}:\n{rules}"
        );
        if !dropped {
            assert!(
                kpx.log().contains("nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets")
            );
        }
        assert_eq!(request(&lab, Proto::Tcp, WEB).server(), Some("be1"));
        drop(kpx);
    }
}

/// `--iptables-max-endpoints-per-port 2` with three ready endpoints: each
/// port is served by two of them (the same two for TCP and UDP: the
/// choice hashes address and target port), the warning names each port,
/// and when the Service is back within the bound every endpoint serves.
#[test]
fn a_port_over_the_endpoint_bound_is_served_by_a_stable_share() {
    let Some(lab) = lab_or_skip(3, "a_port_over_the_endpoint_bound_is_served_by_a_stable_share") else {
        return;
    };
    let (dir, manifests) = run_dirs("kernel-iptables-bound");
    let (be1, be2, be3) = (&lab.backends[0].ip, &lab.backends[1].ip, &lab.backends[2].ip);
    write_web(&manifests, &[be1, be2, be3]);
    let args = kpx_args(&manifests, &["--proxy-mode", "iptables", "--iptables-max-endpoints-per-port", "2"]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());

    let mut shares = Vec::new();
    for proto in [Proto::Tcp, Proto::Udp] {
        let seen = servers_seen(&lab, proto, WEB, 40);
        assert_eq!(seen.values().sum::<usize>(), 40, "{proto:?}: {seen:?}");
        assert!(seen.keys().all(|s| s.starts_with("be")), "{proto:?}: not every request answered: {seen:?}");
        assert_eq!(seen.len(), 2, "{proto:?}: two endpoints serve: {seen:?}");
        shares.push(seen.into_keys().collect::<BTreeSet<String>>());
    }
    assert_eq!(shares[0], shares[1], "TCP and UDP keep the same endpoints");
    let log = kpx.log();
    for port in ["test/web:tcp", "test/web:udp"] {
        assert!(
            log.lines().any(|l| l.contains("WARN") && l.contains(port) && l.contains("programs 2 of its 3 endpoints")),
            "the bound on {port} is not named:\n{log}"
        );
    }

    // Back within the bound (one of the kept endpoints goes): the two
    // left, the one that was left out among them, serve, and kpx says so.
    let ip_of = |name: &str| lab.backends.iter().find(|b| b.name == name).map(|b| b.ip.as_str()).unwrap();
    let gone = shares[0].first().unwrap().clone();
    let left: Vec<&str> = ["be1", "be2", "be3"].into_iter().filter(|n| *n != gone).collect();
    let before = log.matches("synced rules family=IPv4").count();
    write_web(&manifests, &left.iter().map(|n| ip_of(n)).collect::<Vec<_>>());
    assert!(kpx.wait_for_log("synced rules family=IPv4", before + 1, Duration::from_secs(20)), "{}", kpx.log());
    let seen = servers_seen(&lab, Proto::Tcp, WEB, 30);
    let want: BTreeSet<String> = left.iter().map(|n| n.to_string()).collect();
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), want, "{seen:?}");
    assert!(
        kpx.log().lines().any(|l| l.contains("test/web:tcp") && l.contains("back within")),
        "the port back within the bound is not said:\n{}",
        kpx.log()
    );
}

/// upstream's nfacct counters (iptables mode): the INVALID drop and
/// localhost node-port connections count in nfacct objects, which
/// /metrics reports (`kubeproxy_iptables_*_packets_total`).
#[test]
fn nfacct_counts_localhost_nodeport_connections() {
    let Some(lab) = lab_or_skip(1, "nfacct_counts_localhost_nodeport_connections") else {
        return;
    };
    let (dir, manifests) = run_dirs("nfacct");
    let service = "apiVersion: v1\nkind: Service\nmetadata: {name: np, namespace: test}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.40\n  ports:\n  - {name: tcp, port: 80, nodePort: 30080, protocol: TCP}\n";
    write_manifest(&manifests.join("np.yaml"), &format!("{service}---\n{}", slice("np", &[&lab.backends[0].ip])));
    let mut kpx = lab.start_kpx(KPX.as_ref(), &kpx_args(&manifests, &[]), &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    // (iptables-save prints two spaces after --nfacct-name.)
    let rules = kernel_rules(&lab);
    assert!(
        rules.contains("--ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP"),
        "{rules}"
    );
    assert!(rules.contains("--ctorigdst 127.0.0.0/8 -m nfacct --nfacct-name  localhost_nps_accepted_pkts"), "{rules}");
    let metric = |name: &str| {
        let (_, text) = crate::servers::wait_status(&lab.node, "127.0.0.1:10249", "/metrics", 200);
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
    };
    let accepted = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total";
    std::thread::sleep(Duration::from_millis(2500));
    let before = metric(accepted).expect("the family is served where nfacct works");
    for _ in 0..3 {
        let reply = kpx_netlab::tcp_request(&lab.node, "127.0.0.1:30080", Duration::from_secs(2));
        assert_eq!(reply.server(), Some("be1"), "localhost node port: {reply:?}");
    }
    // A connection to the node's own address is not a localhost one.
    let own = format!("{}:30080", kpx_netlab::node::NODE_IP);
    assert_eq!(kpx_netlab::tcp_request(&lab.node, &own, Duration::from_secs(2)).server(), Some("be1"));
    // Read every 2 s.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(metric(accepted), Some(before + 3.0), "three localhost connections, their first packets");
    assert_eq!(metric("kubeproxy_iptables_ct_state_invalid_dropped_packets_total"), Some(0.0));
    drop(kpx);
}

/// The image's backend choice (`--iptables-backend=auto`, kube-proxy's
/// image's iptables-wrappers v2 logic) on a node that holds legacy rules
/// and on one that holds nft rules: kpx writes where kubelet's marker
/// chain is, or where the rules are when there is none; its rules work
/// there (a real request) and nothing lands in the other backend. What an
/// earlier image left in the other backend (a stale DNAT for the very
/// Service, in kube-proxy's chains) is removed at start.
#[test]
fn the_iptables_backend_is_the_nodes_as_the_image_chooses() {
    if std::process::Command::new("iptables-legacy").arg("--version").output().is_err() {
        // The tests' setup installs Debian's iptables, which has both.
        panic!("iptables-legacy is missing: run cargo xtask setup");
    }
    let legacy_rule = ["-t", "filter", "-A", "INPUT", "-s", "192.0.2.1/32", "-j", "DROP"];
    let hint = ["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"];
    let stale_chain = ["-t", "nat", "-N", "KUBE-SERVICES"];
    let stale_jump = ["-t", "nat", "-I", "OUTPUT", "-j", "KUBE-SERVICES"];
    let stale_prerouting = ["-t", "nat", "-I", "PREROUTING", "-j", "KUBE-SERVICES"];
    let stale_dnat = [
        "-t",
        "nat",
        "-A",
        "KUBE-SERVICES",
        "-d",
        "10.96.0.10/32",
        "-p",
        "tcp",
        "--dport",
        "80",
        "-j",
        "DNAT",
        "--to-destination",
        "192.0.2.99:8080",
    ];
    // (name, what the node holds: tool and arguments, the backend kpx picks, why)
    type Setup<'a> = Vec<(&'a str, &'a [&'a str])>;
    let cases: [(&str, Setup, &str, &str); 3] = [
        (
            "legacy-hint",
            vec![
                ("iptables-legacy", &hint[..]),
                ("iptables-nft", &stale_chain[..]),
                ("iptables-nft", &stale_dnat[..]),
                ("iptables-nft", &stale_jump[..]),
                ("iptables-nft", &stale_prerouting[..]),
            ],
            "legacy",
            "kubelet's KUBE-IPTABLES-HINT chain is in iptables-legacy's tables",
        ),
        (
            "nft-hint",
            vec![("iptables-nft", &hint[..]), ("iptables-legacy", &legacy_rule[..])],
            "nft",
            "kubelet's KUBE-IPTABLES-HINT chain is in iptables-nft's mangle table",
        ),
        (
            "legacy-rules",
            vec![("iptables-legacy", &legacy_rule[..])],
            "legacy",
            "no kubelet marker chain; iptables-legacy holds more rules (1) than iptables-nft (0)",
        ),
    ];
    for (tag, setup, chosen, why) in cases {
        let Some(lab) = lab_or_skip(1, "the_iptables_backend_is_the_nodes_as_the_image_chooses") else {
            return;
        };
        for (tool, args) in &setup {
            let mut all = vec![*tool];
            all.extend_from_slice(args);
            lab.node.exec(&all).unwrap_or_else(|e| panic!("{tag}: {all:?}: {e}"));
        }
        let (dir, manifests) = run_dirs(&format!("backend-{tag}"));
        write_web(&manifests, &[&lab.backends[0].ip]);
        let mut kpx = start(&lab, &dir);
        assert!(kpx.wait_for_log("synced rules family=IPv6", 1, Duration::from_secs(20)), "{tag}:\n{}", kpx.log());
        assert!(kpx.log().contains(&format!("iptables backend: iptables-{chosen} ({why})")), "{tag}:\n{}", kpx.log());
        let other = if chosen == "nft" { "legacy" } else { "nft" };
        for family in ["iptables", "ip6tables"] {
            let ours = lab.node.exec(&[&format!("{family}-{chosen}-save")]).unwrap();
            assert!(ours.contains(":KUBE-SERVICES"), "{tag}: {family}-{chosen}-save:\n{ours}");
            let theirs = lab.node.exec(&[&format!("{family}-{other}-save")]).unwrap();
            assert!(!theirs.contains("KUBE-"), "{tag}: kube-proxy's chains in {family}-{other}:\n{theirs}");
        }
        if tag == "legacy-hint" {
            assert!(kpx.log().contains("removed kube-proxy's chains from iptables-nft"), "{}", kpx.log());
        }
        // The stale DNAT (to 192.0.2.99) would take the request, were it left.
        assert_eq!(request(&lab, Proto::Tcp, WEB).server(), Some("be1"), "{tag}");
        drop(kpx);
    }
}
