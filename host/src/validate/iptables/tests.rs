use super::*;
use std::collections::BTreeMap;

fn ctx() -> Context {
    let mut existing = BTreeMap::new();
    existing.insert("nat".to_string(), ["KUBE-SVC-OLD".to_string()].into_iter().collect());
    Context {
        plugin: "test".into(),
        endpoints: [("10.1.0.5".parse().unwrap(), 8080), ("fd00::5".parse().unwrap(), 80)].into_iter().collect(),
        existing_chains: existing,
    }
}

const GOOD: &str = "*filter
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -m comment --comment \"ns/a has no endpoints\" -m tcp -p tcp -d 10.96.0.2 --dport 80 -j REJECT
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-SEP-A - [0:0]
:KUBE-SEP-GONE - [0:0]
-A KUBE-SERVICES -m comment --comment \"ns/b cluster IP\" -m tcp -p tcp -d 10.96.0.3 --dport 80 -j KUBE-SVC-A
-A KUBE-SERVICES -d 10.96.0.4 -j KUBE-SVC-OLD
-A KUBE-SVC-A -j KUBE-SEP-A
-A KUBE-SEP-A -m tcp -p tcp -j DNAT --to-destination 10.1.0.5:8080
-X KUBE-SEP-GONE
COMMIT
";

#[test]
fn accepts_kube_proxy_shapes() {
    check_iptables(GOOD, &ctx()).unwrap();
    check_iptables(
        "*nat\n:KUBE-SEP-6 - [0:0]\n-A KUBE-SEP-6 -p tcp -j DNAT --to-destination [fd00::5]:80\nCOMMIT\n",
        &ctx(),
    )
    .unwrap();
}

fn refused(payload: &str) -> Rejected {
    check_iptables(payload, &ctx()).expect_err("must be refused")
}

#[test]
fn refuses_foreign_chains_tables_and_targets() {
    let cases = [
        ("*filter\n:KUBE-X - [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n", 3, "is not a KUBE- chain"),
        ("*filter\n:INPUT DROP [0:0]\nCOMMIT\n", 2, "is not a KUBE- chain"),
        ("*raw\nCOMMIT\n", 1, "not one kube-proxy uses"),
        ("*nat\n:KUBE-X - [0:0]\n-A KUBE-X -j SNAT --to-source 1.2.3.4\nCOMMIT\n", 3, "target \"SNAT\""),
        ("*nat\n:KUBE-X - [0:0]\n-I KUBE-X -j ACCEPT\nCOMMIT\n", 3, "command -I"),
        ("*nat\n-A KUBE-SERVICES -j ACCEPT\nCOMMIT\n", 2, "not declared"),
        ("*nat\n:KUBE-X - [0:0]\n-A KUBE-X -j KUBE-NOWHERE\nCOMMIT\n", 3, "neither exists"),
        ("*nat\n:KUBE-X - [0:0]\n-A KUBE-X -m owner --uid-owner 0 -j ACCEPT\nCOMMIT\n", 3, "module \"owner\""),
        ("*nat\n:KUBE-X - [0:0]\n-A KUBE-X -j ACCEPT\n", 3, "not committed"),
        ("*nat\n-X KUBE-SVC-OLD\nCOMMIT\n", 2, "declared (flushed)"),
    ];
    for (payload, line, reason) in cases {
        let err = refused(payload);
        assert_eq!(err.line, line, "{payload}: {err}");
        assert!(err.reason.contains(reason), "{payload}: {err}");
        assert!(err.to_string().contains("plugin test"), "{err}");
    }
}

#[test]
fn refuses_dnat_to_non_endpoints() {
    let err =
        refused("*nat\n:KUBE-SEP-X - [0:0]\n-A KUBE-SEP-X -p tcp -j DNAT --to-destination 192.0.2.66:80\nCOMMIT\n");
    assert!(err.reason.contains("not an endpoint"), "{err}");
    let err =
        refused("*nat\n:KUBE-SEP-X - [0:0]\n-A KUBE-SEP-X -p tcp -j DNAT --to-destination 10.1.0.5:9999\nCOMMIT\n");
    assert!(err.reason.contains("not an endpoint"), "{err}");
    let err =
        refused("*nat\n:KUBE-SEP-X - [0:0]\n-A KUBE-SEP-X -p tcp -j DNAT --to-destination 10.1.0.5-10.1.0.9\nCOMMIT\n");
    assert!(err.reason.contains("ADDRESS:PORT"), "{err}");
    let err = refused("*filter\n:KUBE-X - [0:0]\n-A KUBE-X -p tcp -j DNAT --to-destination 10.1.0.5:8080\nCOMMIT\n");
    assert!(err.reason.contains("outside the nat table"), "{err}");
}
