use super::*;
use crate::hash::{endpoint_chain, service_chain};
use crate::model::{Cluster, Endpoint, IpFamily, LocalTraffic, Protocol, TrafficPolicy};

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint::ready(ip.parse().unwrap(), port)
}

fn svc(ns: &str, name: &str, port_name: &str, ip: &str, port: u16, eps: Vec<Endpoint>) -> ServicePort {
    let mut s = ServicePort::new(ns, name, port_name, Protocol::Tcp, port).with_cluster_endpoints(eps);
    s.cluster_ip = Some(ip.parse().unwrap());
    s
}

fn proxier() -> IptablesProxier {
    let mut settings = Settings::new(IpFamily::V4, "iptables");
    settings.local_traffic = LocalTraffic::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]);
    settings.masquerade_random_fully = false;
    IptablesProxier::new(settings)
}

fn text(p: &mut IptablesProxier, full: bool) -> String {
    match p.render(full).unwrap() {
        Ruleset::Iptables(t) => t,
        other => panic!("unexpected {other:?}"),
    }
}

/// The nat rules of upstream's TestTracePacket sample, line for line.
#[test]
fn matches_upstream_sample() {
    let mut p = proxier();
    p.reset(
        Node::default(),
        Cluster::default(),
        vec![svc("ns4", "svc4", "p80", "172.30.0.44", 80, vec![ep("10.180.0.4", 80), ep("10.180.0.5", 80)])],
    );
    let out = text(&mut p, true);
    for line in [
        ":KUBE-SVC-4SW47YFZTEDKD3PK - [0:0]",
        ":KUBE-SEP-UKSFD7AGPMPPLUHC - [0:0]",
        ":KUBE-SEP-C6EBXVWJJZMIWKLZ - [0:0]",
        "-A KUBE-SERVICES -m comment --comment \"ns4/svc4:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK",
        "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ",
        "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 -> 10.180.0.4:80\" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC",
        "-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment \"ns4/svc4:p80 -> 10.180.0.5:80\" -j KUBE-SEP-C6EBXVWJJZMIWKLZ",
        "-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ",
        "-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
    ] {
        assert!(out.lines().any(|l| l == line), "missing line {line}\nin:\n{out}");
    }
    let last_nat_rule = out.lines().rev().nth(1).unwrap();
    assert!(last_nat_rule.contains("-j KUBE-NODEPORTS"), "nodeports jump must be last: {last_nat_rule}");
}

#[test]
fn probabilities_as_upstream() {
    let mut p = proxier();
    let eps = (1..=4).map(|i| ep(&format!("10.1.0.{i}"), 8080)).collect();
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "s", "", "172.30.0.1", 80, eps)]);
    let out = text(&mut p, true);
    let probs: Vec<&str> =
        out.lines().filter_map(|l| l.split("--probability ").nth(1)).map(|r| r.split(' ').next().unwrap()).collect();
    assert_eq!(probs, ["0.2500000000", "0.3333333333", "0.5000000000"]);
}

#[test]
fn no_endpoints_rejects_in_filter() {
    let mut p = proxier();
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "empty", "http", "172.30.0.9", 80, vec![])]);
    let out = text(&mut p, true);
    let filter = out.split("*nat").next().unwrap();
    assert!(filter.contains(
        "-A KUBE-SERVICES -m comment --comment \"ns/empty:http has no endpoints\" -m tcp -p tcp -d 172.30.0.9 --dport 80 -j REJECT"
    ));
    assert!(!out.contains("KUBE-SVC-"));
}

#[test]
fn partial_render_writes_only_changed_chains_and_deletes_stale() {
    let mut p = proxier();
    let a = svc("ns", "a", "", "172.30.0.1", 80, vec![ep("10.1.0.1", 80)]);
    let b = svc("ns", "b", "", "172.30.0.2", 80, vec![ep("10.1.0.2", 80), ep("10.1.0.3", 80)]);
    p.reset(Node::default(), Cluster::default(), vec![a.clone(), b.clone()]);
    let _ = text(&mut p, true);

    // Nothing changed: only the top-level chains, but every service's jump.
    let idle = text(&mut p, false);
    assert!(!idle.contains(":KUBE-SVC-"), "{idle}");
    assert_eq!(idle.matches("-A KUBE-SERVICES -m comment --comment \"ns/").count(), 2);

    // b loses an endpoint: b's chains rewritten, its stale SEP deleted, a untouched.
    let b2 = svc("ns", "b", "", "172.30.0.2", 80, vec![ep("10.1.0.2", 80)]);
    p.apply(vec![Change::Upsert(b2)]);
    let out = text(&mut p, false);
    let a_chain = service_chain("KUBE-SVC-", "ns/a", "tcp");
    let b_chain = service_chain("KUBE-SVC-", "ns/b", "tcp");
    let stale = endpoint_chain("ns/b", "tcp", "10.1.0.3:80");
    assert!(!out.contains(&format!(":{a_chain}")));
    assert!(out.contains(&format!(":{b_chain}")));
    assert!(out.contains(&format!("-X {stale}\n")), "{out}");

    // a removed: its chains deleted, its jump gone.
    p.apply(vec![Change::Remove("ns/a".into())]);
    let out = text(&mut p, false);
    assert!(out.contains(&format!("-X {a_chain}\n")));
    assert!(!out.contains(&format!("-j {a_chain}")));
}

#[test]
fn ipv6_brackets_dnat_and_skips_other_family() {
    let mut settings = Settings::new(IpFamily::V6, "iptables");
    settings.masquerade_all = true;
    let mut p = IptablesProxier::new(settings);
    p.reset(
        Node::default(),
        Cluster::default(),
        vec![
            svc("ns", "v6", "", "fd00::10", 80, vec![ep("fd00:1::5", 8080)]),
            svc("ns", "v4", "", "172.30.0.1", 80, vec![ep("10.0.0.1", 80)]),
        ],
    );
    let out = text(&mut p, true);
    assert!(out.contains("-j DNAT --to-destination [fd00:1::5]:8080"), "{out}");
    assert!(out.contains("-d fd00::10 --dport 80 -j KUBE-MARK-MASQ"));
    assert!(!out.contains("172.30.0.1"));
    assert!(out.contains("! -d ::1/128 -j KUBE-NODEPORTS"));
}

#[test]
fn large_cluster_mode_drops_per_endpoint_comments() {
    let mut p = proxier();
    let many: Vec<Endpoint> =
        (0..1001).map(|i| ep(&format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256), 80)).collect();
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "big", "", "172.30.0.9", 80, many)]);
    let out = text(&mut p, true);
    let sep_rules: Vec<&str> = out.lines().filter(|l| l.starts_with("-A KUBE-SEP-")).collect();
    assert_eq!(sep_rules.len(), 2002);
    assert!(sep_rules.iter().all(|l| !l.contains("--comment")), "large-cluster SEP rules carry comments");
    assert!(out.contains("cluster IP\" -m tcp -p tcp -d 172.30.0.9"), "service-level comments stay");

    // At 1000 endpoints, comments are back, and the flip rewrites every chain.
    let mut p = proxier();
    let some: Vec<Endpoint> = (0..1000).map(|i| ep(&format!("10.1.{}.{}", i / 256, i % 256), 80)).collect();
    p.reset(Node::default(), Cluster::default(), vec![svc("ns", "big", "", "172.30.0.9", 80, some)]);
    let out = text(&mut p, true);
    assert!(out.lines().filter(|l| l.starts_with("-A KUBE-SEP-")).all(|l| l.contains("--comment ns/big")));
}

#[test]
fn masquerade_bit_moves_the_mark() {
    let mut settings = Settings::new(IpFamily::V4, "iptables");
    settings.masquerade_bit = 10;
    let mut p = IptablesProxier::new(settings);
    p.reset(Node::default(), Cluster::default(), vec![]);
    let out = text(&mut p, true);
    assert!(out.contains("-A KUBE-MARK-MASQ -j MARK --or-mark 0x400\n"), "{out}");
    assert!(out.contains("-m mark ! --mark 0x400/0x400 -j RETURN"));
    assert!(!out.contains("0x4000"));
}

#[test]
fn tcp_be_liberal_keeps_invalid_packets() {
    let mut settings = Settings::new(IpFamily::V4, "iptables");
    let mut p = IptablesProxier::new(settings.clone());
    p.reset(Node::default(), Cluster::default(), vec![]);
    assert!(text(&mut p, true).contains("--ctstate INVALID -j DROP"));
    settings.conntrack_tcp_be_liberal = true;
    let mut p = IptablesProxier::new(settings);
    p.reset(Node::default(), Cluster::default(), vec![]);
    assert!(!text(&mut p, true).contains("INVALID"));
}

#[test]
fn health_check_node_ports_are_accepted_in_filter() {
    let mut p = proxier();
    let mut s = svc("ns", "local", "p", "172.30.0.9", 80, vec![ep("10.1.0.1", 80)]);
    s.node_port = 30080;
    s.health_check_node_port = 30000;
    s.external_traffic_policy = TrafficPolicy::Local;
    p.reset(Node::default(), Cluster::default(), vec![s]);
    let out = text(&mut p, true);
    let filter = out.split("*nat").next().unwrap();
    assert!(filter.contains(
        "-A KUBE-NODEPORTS -m comment --comment \"ns/local:p health check node port\" -m tcp -p tcp --dport 30000 -j ACCEPT"
    ));
    assert!(filter.contains(
        "\"ns/local:p has no local endpoints\" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j DROP"
    ));
}

#[test]
fn localhost_nodeports_need_the_localnet_firewall_jumps() {
    let v4 = Settings::new(IpFamily::V4, "iptables");
    assert!(jumps_for(&v4).iter().any(|j| j.to == "KUBE-FIREWALL"));
    let mut off = v4.clone();
    off.localhost_nodeports = false;
    assert!(!jumps_for(&off).iter().any(|j| j.to == "KUBE-FIREWALL"));
    assert!(!jumps_for(&Settings::new(IpFamily::V6, "iptables")).iter().any(|j| j.to == "KUBE-FIREWALL"));
}

#[test]
fn splits_quoted_comments() {
    assert_eq!(
        split_args(r#"-A X -m comment --comment "a b" -j Y"#).unwrap(),
        ["-A", "X", "-m", "comment", "--comment", "a b", "-j", "Y"]
    );
    assert!(split_args(r#"-A X --comment "open"#).is_none());
    assert_eq!(split_args(r#"--comment """#).unwrap(), ["--comment", ""]);
}
