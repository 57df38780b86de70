//! kpx reading the Kubernetes API (the list/watch server of tests/listwatch
//! in the node's namespace), with the real kernel and real traffic:
//! Services and endpoints created, changed and deleted through the API
//! reach the rules; a dropped watch, a 410 Gone, 500s and a server restart
//! relist without a flush and without one failed connection; and the same
//! objects through --manifests and through the API program byte-identical
//! rules.

use std::path::Path;
use std::time::{Duration, Instant};

use kpx_listwatch::{ENDPOINT_SLICES, ListWatch, NODES, Resource, SERVICES};
use kpx_netlab::Reply;
use kpx_netlab::node::NodeLab;
use serde_json::Value;

use crate::support::*;

const WEB: &str = "10.96.0.10:80";

/// The server, listening on the node's loopback (where kpx runs).
fn start_server(lab: &NodeLab) -> ListWatch {
    let listener = listen(lab, 0);
    ListWatch::start(listener).expect("start the list/watch server")
}

fn listen(lab: &NodeLab, port: u16) -> std::net::TcpListener {
    lab.node.ip(&["link", "set", "lo", "up"]).expect("loopback up");
    lab.node
        .enter(move || std::net::TcpListener::bind(("127.0.0.1", port)))
        .expect("enter the node namespace")
        .expect("bind the server")
}

/// Every document of a YAML text, as the JSON a client would send.
fn documents(yaml: &str) -> Vec<Value> {
    yaml.split("\n---\n").map(|d| serde_saphyr::from_str::<Value>(d).expect("test YAML")).collect()
}

fn resource_of(object: &Value) -> Resource {
    match object["kind"].as_str() {
        Some("Service") => SERVICES,
        Some("EndpointSlice") => ENDPOINT_SLICES,
        Some("Node") => NODES,
        other => panic!("no resource for {other:?}"),
    }
}

fn put(server: &ListWatch, yaml: &str) {
    for o in documents(yaml) {
        server.apply(resource_of(&o), o).expect("the server takes the object");
    }
}

const NODE: &str = "apiVersion: v1\nkind: Node\nmetadata: {name: node}\n";

fn web(ips: &[&str]) -> String {
    format!("{}---\n{}", service("web", "10.96.0.10"), slice("web", ips))
}

fn kpx_api_args(dir: &Path, server: &ListWatch, mode: &str) -> Vec<String> {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    node_args(&["--kubeconfig", kubeconfig.to_str().unwrap()], &["--proxy-mode", mode])
}

/// The mode's rules as the kernel lists them.
fn rules(lab: &NodeLab, mode: &str) -> String {
    match mode {
        "iptables" => kernel_rules(lab),
        _ => lab.node.exec(&["nft", "list", "ruleset"]).expect("nft list ruleset"),
    }
}

/// Waits until the kernel's rules do (or do not) mention `text`.
fn wait_rules(lab: &NodeLab, mode: &str, text: &str, present: bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(15) {
        if rules(lab, mode).contains(text) == present {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Waits until `to` is answered by `server` (a Service's rules can reach
/// the kernel before its endpoints do).
fn wait_served(lab: &NodeLab, to: &str, server: &str) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(15) {
        if matches!(request(lab, Proto::Tcp, to), Reply::Answer { server: s, .. } if s == server) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn follows_the_api_through_faults(mode: &str) {
    let Some(lab) = lab_or_skip(2, &format!("api_source_follows_changes_and_faults ({mode})")) else {
        return;
    };
    let (dir, _) = run_dirs(&format!("api-{mode}"));
    let (be1, be2) = (lab.backends[0].ip.clone(), lab.backends[1].ip.clone());
    let server = start_server(&lab);
    // Lists come in pages of one: every list of more than one object
    // crosses continue tokens.
    server.set_max_page(1);
    put(&server, NODE);
    put(&server, &web(&[&be1]));
    let mut kpx = lab.start_kpx(KPX.as_ref(), &kpx_api_args(&dir, &server, mode), &dir.join("kpx.log")).unwrap();
    assert!(
        kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)),
        "{mode}: no sync:\n{}",
        kpx.log()
    );
    assert_eq!(servers_seen(&lab, Proto::Tcp, WEB, 10), [("be1".to_string(), 10)].into(), "{mode}");

    // A change through the API: be2 joins.
    put(&server, &slice("web", &[&be1, &be2]));
    assert!(wait_served(&lab, WEB, "be2"), "{mode}: be2 never served:\n{}", kpx.log());
    let seen = servers_seen(&lab, Proto::Tcp, WEB, 30);
    assert_eq!(seen.keys().cloned().collect::<Vec<_>>(), ["be1", "be2"], "{mode}: {seen:?}");

    // A Service created, then deleted.
    put(&server, &format!("{}---\n{}", service("api2", "10.96.0.11"), slice("api2", &[&be2])));
    assert!(wait_served(&lab, "10.96.0.11:80", "be2"), "{mode}: api2 never served:\n{}", kpx.log());
    assert_eq!(servers_seen(&lab, Proto::Tcp, "10.96.0.11:80", 5), [("be2".to_string(), 5)].into(), "{mode}");
    assert!(server.delete(SERVICES, "test", "api2"));
    assert!(server.delete(ENDPOINT_SLICES, "test", "api2-1"));
    assert!(wait_rules(&lab, mode, "10.96.0.11", false), "{mode}: api2 stayed in the kernel");
    assert!(!matches!(request(&lab, Proto::Tcp, "10.96.0.11:80"), Reply::Answer { .. }), "{mode}: api2 still answers");

    // Faults, with a client opening connections to web all along.
    let lists_before = server.count("list", "/services");
    let client = ClientLoop::start(&lab, WEB);
    std::thread::sleep(Duration::from_millis(500));
    server.drop_watches();
    std::thread::sleep(Duration::from_millis(1500));
    // 410: the watches are cut and, while they reconnect (slowly), a
    // change is made and the history compacted past it: the resumed
    // watches get 410 Gone and kpx must list again.
    server.set_delay(Duration::from_millis(1500));
    server.drop_watches();
    std::thread::sleep(Duration::from_millis(300));
    put(&server, &format!("{}---\n{}", service("api3", "10.96.0.12"), slice("api3", &[&be1])));
    server.compact();
    // And the next requests fail: the relist starts through 500s.
    server.fail_next(3, 500);
    // The relist is slow too (1.5 s a response), so that a source which
    // dropped its objects when a relist starts would have them synced away.
    let t0 = Instant::now();
    while server.count("list", "/services") == lists_before && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    server.set_delay(Duration::ZERO);
    let lists_after_410 = server.count("list", "/services");
    assert!(lists_after_410 > lists_before, "{mode}: no relist after the 410:\n{}", kpx.log());
    assert!(
        wait_served(&lab, "10.96.0.12:80", "be1"),
        "{mode}: the change behind the 410 never arrived:\n{}",
        kpx.log()
    );
    // 500s on the next requests.
    server.fail_next(4, 500);
    server.drop_watches();
    std::thread::sleep(Duration::from_millis(3000));
    // A restart: down for two seconds, a change made meanwhile (as another
    // API server replica would take it), up again on the same port; the
    // watches resume from their resource versions.
    let port: u16 = server.url().rsplit(':').next().unwrap().parse().unwrap();
    server.stop();
    put(&server, &format!("{}---\n{}", service("api4", "10.96.0.13"), slice("api4", &[&be2])));
    std::thread::sleep(Duration::from_millis(2000));
    server.resume(listen(&lab, port)).expect("restart the server");
    assert!(
        wait_served(&lab, "10.96.0.13:80", "be2"),
        "{mode}: a change made during the outage never arrived:\n{}",
        kpx.log()
    );
    std::thread::sleep(Duration::from_millis(500));
    let outcomes = client.outcomes();
    let failed = outcomes.iter().filter(|(_, _, a)| a.is_none()).count();
    eprintln!(
        "{mode}: {} connections through the faults, {failed} failed; lists of services: {lists_before} before, {lists_after_410} after the 410, {} at the end; requests: {}",
        outcomes.len(),
        server.count("list", "/services"),
        server.requests().len()
    );
    assert_eq!(failed, 0, "{mode}: connections failed during the faults: {:?}\n{}", client.failures(), kpx.log());
    drop(client);
    assert!(outcomes.len() > 200, "{mode}: the client loop hardly ran");
    assert_eq!(servers_seen(&lab, Proto::Tcp, "10.96.0.12:80", 5), [("be1".to_string(), 5)].into(), "{mode}");
    assert_eq!(servers_seen(&lab, Proto::Tcp, "10.96.0.13:80", 5), [("be2".to_string(), 5)].into(), "{mode}");
    let log = kpx.log();
    assert!(!log.contains("sync failed"), "{mode}: a sync failed:\n{log}");
    assert!(kpx.is_running(), "{mode}: kpx exited:\n{log}");
    // deploy/'s ClusterRole grants exactly what this run asked for.
    let requests = server.requests();
    crate::deploy::check_cluster_role(&requests);
    // Upstream's selectors, on every list and watch of their kinds; lists
    // were paginated.
    for r in &requests {
        let wanted = match r.resource.as_str() {
            "/services" | "discovery.k8s.io/endpointslices" => {
                "labelSelector=!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
            }
            "/nodes" => "fieldSelector=metadata.name=node",
            _ => continue,
        };
        assert!(r.query.contains(wanted), "{mode}: {} {} without {wanted}: {}", r.verb, r.resource, r.query);
    }
    assert!(
        requests.iter().any(|r| r.verb == "list" && r.query.contains("continue=")),
        "{mode}: no list was paginated"
    );
}

#[test]
fn api_source_follows_changes_and_faults_iptables() {
    follows_the_api_through_faults("iptables");
}

#[test]
fn api_source_follows_changes_and_faults_nftables() {
    follows_the_api_through_faults("nftables");
}

/// A change of web's Service that kpx cannot decode (`ports` not a list),
/// then a relist that lists it so: each time it is refused in the log
/// (warn) with its kind, namespace/name and the decode error, never as an
/// empty ApiError, and counted; web's last good version stays programmed.
fn an_undecodable_object_keeps_its_last_good_version(mode: &str) {
    let Some(lab) = lab_or_skip(1, &format!("an_undecodable_object_keeps_its_last_good_version ({mode})")) else {
        return;
    };
    let (dir, _) = run_dirs(&format!("api-undecodable-{mode}"));
    let be1 = lab.backends[0].ip.clone();
    let server = start_server(&lab);
    put(&server, NODE);
    put(&server, &web(&[&be1]));
    let mut kpx = lab.start_kpx(KPX.as_ref(), &kpx_api_args(&dir, &server, mode), &dir.join("kpx.log")).unwrap();
    assert!(
        kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)),
        "{mode}: no sync:\n{}",
        kpx.log()
    );
    assert!(wait_served(&lab, WEB, "be1"), "{mode}: web never served:\n{}", kpx.log());
    let mut bad = documents(&service("web", "10.96.0.10")).remove(0);
    bad["spec"]["ports"] = Value::from("not-a-list");
    server.apply(SERVICES, bad).expect("the server takes the object");
    assert!(kpx.wait_for_log("cannot be decoded", 1, Duration::from_secs(15)), "{mode}: not refused:\n{}", kpx.log());
    // A relist: the watches cut and resumed (slowly) from before a change
    // and a compaction, so that they get 410 Gone and list again.
    let lists_before = server.count("list", "/services");
    server.set_delay(Duration::from_millis(1500));
    server.drop_watches();
    std::thread::sleep(Duration::from_millis(300));
    put(&server, &format!("{}---\n{}", service("api5", "10.96.0.15"), slice("api5", &[&be1])));
    server.compact();
    let t0 = Instant::now();
    while server.count("list", "/services") == lists_before && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    server.set_delay(Duration::ZERO);
    assert!(server.count("list", "/services") > lists_before, "{mode}: no relist:\n{}", kpx.log());
    assert!(wait_served(&lab, "10.96.0.15:80", "be1"), "{mode}: the relist never applied:\n{}", kpx.log());
    assert!(
        kpx.wait_for_log("cannot be decoded", 2, Duration::from_secs(15)),
        "{mode}: the relist did not refuse it:\n{}",
        kpx.log()
    );
    let seen = servers_seen(&lab, Proto::Tcp, WEB, 5);
    assert_eq!(seen, [("be1".to_string(), 5)].into(), "{mode}: web's last good version is not served");
    let log = kpx.log();
    for line in log.lines().filter(|l| l.contains("cannot be decoded")) {
        assert!(line.contains("WARN"), "{mode}: {line}");
        assert!(line.contains("rejected: Service test/web cannot be decoded"), "{mode}: {line}");
        assert!(line.contains("invalid type: string \"not-a-list\", expected a sequence"), "{mode}: {line}");
    }
    assert!(!log.contains("ApiError: : "), "{mode}: an empty ApiError was logged:\n{log}");
    let (_, metrics) = crate::servers::get(&lab.node, "127.0.0.1:10249", "/metrics").expect("metrics");
    let counted = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kpx_objects_refused_total{kind=\"Service\"} "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(counted.is_some_and(|n| n >= 2), "{mode}: counted {counted:?}:\n{metrics}");
    assert!(kpx.is_running(), "{mode}: kpx exited:\n{log}");
}

#[test]
fn an_undecodable_object_keeps_its_last_good_version_iptables() {
    an_undecodable_object_keeps_its_last_good_version("iptables");
}

#[test]
fn an_undecodable_object_keeps_its_last_good_version_nftables() {
    an_undecodable_object_keeps_its_last_good_version("nftables");
}

/// Services of several shapes (NodePort, external IPs, a load balancer with
/// source ranges and a Local policy, session affinity), their slices, and
/// the node.
fn cluster(be1: &str, be2: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Node
metadata: {{name: node, labels: {{topology.kubernetes.io/zone: a}}}}
spec: {{podCIDR: 10.244.0.0/24, podCIDRs: [10.244.0.0/24]}}
status: {{addresses: [{{type: InternalIP, address: 10.0.0.1}}]}}
---
{}---
{}---
apiVersion: v1
kind: Service
metadata: {{name: lb, namespace: test, annotations: {{kubectl.kubernetes.io/last-applied-configuration: "{{}}"}}}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.20
  externalIPs: [192.0.2.7]
  externalTrafficPolicy: Local
  healthCheckNodePort: 31000
  loadBalancerSourceRanges: [198.51.100.0/24]
  sessionAffinity: ClientIP
  selector: {{app: lb}}
  ports:
  - {{name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}}
status:
  loadBalancer: {{ingress: [{{ip: 203.0.113.9}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: lb-1
  namespace: test
  labels: {{kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
- {{addresses: [{be1}], conditions: {{ready: true}}, nodeName: node, zone: a, targetRef: {{kind: Pod, name: lb-a, namespace: test}}}}
- {{addresses: [{be2}], conditions: {{ready: true}}, nodeName: other, zone: b}}
---
apiVersion: v1
kind: Service
metadata: {{name: headless, namespace: test, labels: {{service.kubernetes.io/headless: ""}}}}
spec: {{clusterIP: None, ports: [{{port: 80}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: elsewhere, namespace: test, labels: {{service.kubernetes.io/service-proxy-name: other-proxy}}}}
spec: {{clusterIP: 10.96.0.30, ports: [{{port: 80}}]}}
"#,
        service("web", "10.96.0.10"),
        slice("web", &[be1, be2]),
    )
}

fn same_rules_from_both_sources(mode: &str) {
    let Some(lab) = lab_or_skip(2, &format!("manifests_and_api_program_the_same_rules ({mode})")) else {
        return;
    };
    let (dir, manifests) = run_dirs(&format!("same-{mode}"));
    let (be1, be2) = (lab.backends[0].ip.clone(), lab.backends[1].ip.clone());
    let text = cluster(&be1, &be2);
    write_manifest(&manifests.join("cluster.yaml"), &text);
    let synced = |kpx: &mut kpx_netlab::node::Kpx| {
        assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)), "{mode}:\n{}", kpx.log());
    };
    let from_manifests = {
        let mut kpx = lab
            .start_kpx(KPX.as_ref(), &kpx_args(&manifests, &["--proxy-mode", mode]), &dir.join("manifests.log"))
            .unwrap();
        synced(&mut kpx);
        rules(&lab, mode)
    };
    lab.node.exec(&[KPX, "--cleanup"]).expect("kpx --cleanup");
    assert!(!rules(&lab, mode).contains("10.96.0.10"), "{mode}: cleanup left rules");
    // --cleanup leaves the localnet guard (kubelet's chain too); gone, the
    // second start lays out the node as the first did.
    for command in [
        &["-D", "INPUT", "-j", "KUBE-FIREWALL"][..],
        &["-D", "OUTPUT", "-j", "KUBE-FIREWALL"],
        &["-F", "KUBE-FIREWALL"],
        &["-X", "KUBE-FIREWALL"],
    ] {
        let mut args = vec!["iptables", "-t", "filter"];
        args.extend_from_slice(command);
        let _ = lab.node.exec(&args);
    }
    let server = start_server(&lab);
    put(&server, &text);
    let from_api = {
        let mut kpx = lab.start_kpx(KPX.as_ref(), &kpx_api_args(&dir, &server, mode), &dir.join("api.log")).unwrap();
        synced(&mut kpx);
        rules(&lab, mode)
    };
    for wanted in ["10.96.0.10", "10.96.0.20", "203.0.113.9", "192.0.2.7", "30080"] {
        assert!(from_api.contains(wanted), "{mode}: {wanted} is not programmed:\n{from_api}");
    }
    assert!(!from_api.contains("10.96.0.30"), "{mode}: another proxy's Service is programmed");
    assert!(
        from_manifests == from_api,
        "{mode}: the rules differ:\n--- manifests\n{from_manifests}\n--- API\n{from_api}"
    );
}

#[test]
fn manifests_and_api_program_the_same_rules_iptables() {
    same_rules_from_both_sources("iptables");
}

#[test]
fn manifests_and_api_program_the_same_rules_nftables() {
    same_rules_from_both_sources("nftables");
}
