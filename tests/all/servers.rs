//! kpx's HTTP endpoints, scraped from a real kpx reading the list/watch
//! server: `/healthz` and `/livez` (not ready until the Node is known; the
//! node's deletion taint; upstream's JSON bodies), `/metrics` values after real syncs,
//! `/proxyMode`, `/configz`, and a Service's health-check node port as a
//! cloud load balancer probes it.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use kpx_listwatch::{ENDPOINT_SLICES, ListWatch, NODES, SERVICES};
use kpx_netlab::Ns;
use serde_json::{Value, json};

use crate::support::*;

/// kubeadm's `config.conf` as `kubeadm init` writes it (v1.33).
const KUBEADM_CONFIG: &str = include_str!("../kubeadm-config.conf");

/// GET over HTTP/1.0 from inside `ns`: (status, body).
pub(crate) fn get(ns: &Ns, addr: &str, path: &str) -> Option<(u16, String)> {
    let (addr, request) = (addr.to_string(), format!("GET {path} HTTP/1.0\r\nHost: kpx\r\n\r\n"));
    ns.enter(move || -> Option<(u16, String)> {
        let mut s = std::net::TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(request.as_bytes()).ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Some((status, body))
    })
    .ok()
    .flatten()
}

/// Polls until `get` answers with `status`.
pub(crate) fn wait_status(ns: &Ns, addr: &str, path: &str, status: u16) -> (u16, String) {
    let t0 = Instant::now();
    loop {
        let got = get(ns, addr, path);
        match got {
            Some((s, body)) if s == status => return (s, body),
            other if t0.elapsed() > Duration::from_secs(20) => {
                panic!("{addr}{path}: wanted {status}, last answer {other:?}")
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A metric's value in the exposition (the first sample of that name and labels).
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.parse().ok()))
}

/// The EndpointSlice of `lb`, with the controller's change time `age` ago.
fn slice_on(node: &str, ip: &str, age: Duration) -> Value {
    let changed = std::time::SystemTime::now() - age;
    let changed = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(changed.try_into().unwrap());
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "lb-1", "namespace": "test", "labels": {"kubernetes.io/service-name": "lb"},
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": changed}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}, "nodeName": node}]
    })
}

fn servers_answer(mode: &str) {
    let Some(lab) = lab_or_skip(1, &format!("servers_answer_with_real_values ({mode})")) else {
        return;
    };
    let (dir, _) = run_dirs(&format!("servers-{mode}"));
    let be1 = lab.backends[0].ip.clone();
    lab.node.ip(&["link", "set", "lo", "up"]).unwrap();
    let listener = lab.node.enter(|| std::net::TcpListener::bind("127.0.0.1:0")).unwrap().unwrap();
    let server = ListWatch::start(listener).unwrap();
    server.apply(NODES, json!({"metadata": {"name": "node"}})).unwrap();
    server
        .apply(
            SERVICES,
            json!({
                "metadata": {"name": "lb", "namespace": "test"},
                "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.20", "externalTrafficPolicy": "Local",
                         "healthCheckNodePort": 31000,
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}]}
            }),
        )
        .unwrap();
    server.apply(ENDPOINT_SLICES, slice_on("node", &be1, Duration::from_secs(3600))).unwrap();
    // The initial lists are slow: kpx is alive but not ready meanwhile.
    server.set_delay(Duration::from_secs(3));
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    // kpx runs as kubeadm runs kube-proxy: --config with kubeadm's
    // config.conf (its every field, zero values meaning the defaults) and
    // --hostname-override.
    let config = dir.join("config.conf");
    std::fs::write(
        &config,
        KUBEADM_CONFIG
            .replace("/var/lib/kube-proxy/kubeconfig.conf", kubeconfig.to_str().unwrap())
            .replace("mode: \"\"", &format!("mode: {mode}"))
            .replace("10.244.0.0/16", kpx_netlab::node::CLUSTER_CIDR),
    )
    .unwrap();
    let args: Vec<String> = [
        format!("--config={}", config.display()),
        "--hostname-override=node".into(),
        format!("--plugin-cache-dir={}", plugin_cache()),
    ]
    .into();
    let started = Instant::now();
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).unwrap();
    let health = "127.0.0.1:10256";
    let (code, body) = wait_status(&lab.node, health, "/livez", 200);
    // A second on, the lists are still held back by the server's delay.
    std::thread::sleep(Duration::from_secs(1));
    let before = get(&lab.node, health, "/healthz").expect("/healthz answers");
    // upstream's NodeEligible is false while the Node is unknown.
    assert_eq!(before.0, 503, "{mode}: ready before the Node is known: {before:?}");
    assert!(body.starts_with("{\"lastUpdated\":\"") && body.contains("\",\"currentTime\":\""), "{code} {body}");
    assert!(body.ends_with(",\"healthy\":true}"), "alive, nothing synced yet: {body}");
    server.set_delay(Duration::ZERO);
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)), "{mode}:\n{}", kpx.log());
    let (_, body) = wait_status(&lab.node, health, "/healthz", 200);
    assert!(body.contains("\"nodeEligible\":true,\"healthy\":true,\"status\":{\"IPv4\":{"), "{body}");

    // The health-check node port, probed from outside the node.
    let probe = format!("{}:31000", kpx_netlab::node::NODE_IP);
    let (_, body) = wait_status(&lab.client, &probe, "/", 200);
    assert_eq!(
        body,
        "{\n\t\"service\": {\n\t\t\"namespace\": \"test\",\n\t\t\"name\": \"lb\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}"
    );
    // The endpoint moves to another node: this node has none left.
    // A change that happened after kpx started (network programming
    // leaves out older ones; the annotation has whole seconds).
    std::thread::sleep(Duration::from_secs(4).saturating_sub(started.elapsed()));
    server.apply(ENDPOINT_SLICES, slice_on("other", &be1, Duration::from_secs(1))).unwrap();
    let (_, body) = wait_status(&lab.client, &probe, "/", 503);
    assert!(body.contains("\"localEndpoints\": 0,"), "{body}");

    // Metrics after real syncs.
    let metrics = "127.0.0.1:10249";
    let (_, text) = wait_status(&lab.node, metrics, "/metrics", 200);
    // Per family, as upstream's proxiers label them (ip_family).
    let v4 = "ip_family=\"IPv4\"";
    let last = sample(&text, &format!("kubeproxy_sync_proxy_rules_last_timestamp_seconds{{{v4}}}"))
        .expect("last sync timestamp");
    assert!(
        sample(&text, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"}").is_some(),
        "{mode}: IPv6's proxier reports its own:\n{text}"
    );
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(now - last < 60.0 && last <= now + 1.0, "{mode}: last sync {last}, now {now}");
    let syncs =
        sample(&text, &format!("kubeproxy_sync_proxy_rules_duration_seconds_count{{{v4}}}")).expect("sync count");
    assert!(syncs >= 2.0, "{mode}: {syncs} syncs counted");
    assert!(
        sample(&text, &format!("kubeproxy_sync_full_proxy_rules_duration_seconds_count{{{v4}}}")).unwrap_or(0.0) >= 1.0
    );
    let endpoint_changes =
        sample(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_total").expect("endpoint changes");
    assert!(endpoint_changes >= 2.0, "{mode}: {endpoint_changes} endpoint changes (two slices were written)");
    assert_eq!(sample(&text, "kubeproxy_sync_proxy_rules_service_changes_total"), Some(1.0), "{mode}:\n{text}");
    // The first slice changed an hour before kpx started (it came with the
    // initial list: upstream leaves such changes out); the second changed
    // 1 s before it was written: one latency of 1-2 s and a little.
    // The slice is IPv4's: IPv4's proxier programmed it.
    let programming = |what: &str| sample(&text, &format!("kubeproxy_network_programming_duration_seconds_{what}"));
    assert_eq!(programming(&format!("count{{{v4}}}")), Some(1.0), "{mode}:\n{text}");
    // (The client writes `le` first.)
    assert_eq!(programming(&format!("bucket{{le=\"0.5\",{v4}}}")), Some(0.0), "{text}");
    assert_eq!(programming(&format!("bucket{{le=\"0.0\",{v4}}}")), Some(0.0), "upstream's leading 0 bucket:\n{text}");
    assert_eq!(programming("count{ip_family=\"IPv6\"}"), None, "{mode}: no IPv6 change was programmed");
    let sum = programming(&format!("sum{{{v4}}}")).unwrap_or(0.0);
    assert!((1.0..10.0).contains(&sum), "{mode}: network programming took {sum} s");
    // lb's only endpoint is on another node now: one external Local
    // policy without local endpoints.
    let no_local = |p: &str| {
        sample(&text, &format!("kubeproxy_sync_proxy_rules_no_local_endpoints_total{{{v4},traffic_policy=\"{p}\"}}"))
    };
    assert_eq!((no_local("internal"), no_local("external")), (Some(0.0), Some(1.0)), "{mode}:\n{text}");
    let plugin = |m: &str| sample(&text, &format!("{m}{{plugin=\"{mode}\"}}")).unwrap_or(0.0);
    assert!(plugin("kpx_plugin_calls_total") >= 3.0, "{mode}: instantiate, reset, render at least:\n{text}");
    assert!(plugin("kpx_plugin_fuel_used_total") > 1000.0, "{mode}:\n{text}");
    assert!(sample(&text, "kubeproxy_proxy_healthz_total{code=\"503\"}").unwrap_or(0.0) >= 1.0, "{text}");
    assert!(sample(&text, "kubeproxy_proxy_healthz_total{code=\"200\"}").unwrap_or(0.0) >= 1.0, "{text}");
    let (own, other) = match mode {
        "iptables" => ("kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "nftables_sync_failures"),
        _ => ("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "iptables_restore_failures"),
    };
    // No failure, no series yet (a labelled family prints nothing until
    // its first label set, as upstream's vectors).
    assert_eq!(sample(&text, &format!("{own}{{{v4}}}")), None, "{mode}: {own}");
    if mode == "iptables" {
        // The rules kube-proxy owns, per family and table, as the kernel
        // lists them.
        for (family, save) in [("IPv4", "iptables-save"), ("IPv6", "ip6tables-save")] {
            let dump = lab.node.exec(&[save]).unwrap();
            let mut table = "";
            let mut counted = std::collections::BTreeMap::new();
            for line in dump.lines() {
                if let Some(t) = line.strip_prefix('*') {
                    table = t;
                } else if line.starts_with("-A KUBE-") {
                    *counted.entry(table.to_string()).or_insert(0.0) += 1.0;
                }
            }
            for t in ["filter", "nat"] {
                let name = format!("kubeproxy_sync_proxy_rules_iptables_total{{ip_family=\"{family}\",table=\"{t}\"}}");
                assert_eq!(sample(&text, &name), counted.get(t).copied(), "{family} {t}:\n{dump}");
            }
            let last = format!("kubeproxy_sync_proxy_rules_iptables_last{{ip_family=\"{family}\",table=\"nat\"}}");
            assert!(sample(&text, &last).is_some(), "{family}: rules the last sync wrote:\n{text}");
        }
    }
    assert!(!text.contains(other), "{mode}: the other mode's metric is exported");
    assert_eq!(get(&lab.node, metrics, "/proxyMode").map(|(_, b)| b), Some(mode.to_string()));
    let (_, configz) = wait_status(&lab.node, metrics, "/configz", 200);
    let configz: Value = serde_json::from_str(&configz).expect("configz is JSON");
    assert_eq!(configz["kubeproxy.config.k8s.io"]["mode"], mode);
    assert_eq!(configz["kubeproxy.config.k8s.io"]["healthzBindAddress"], "0.0.0.0:10256");
    assert_eq!(configz["kubeproxy.config.k8s.io"]["kind"], "KubeProxyConfiguration");
    assert_eq!(configz["kubeproxy.config.k8s.io"]["apiVersion"], "kubeproxy.config.k8s.io/v1alpha1");
    // component-base's zpages (ComponentFlagz, ComponentStatusz: beta, on).
    let (_, flagz) = wait_status(&lab.node, metrics, "/flagz", 200);
    let warning = "Warning: This endpoint is not meant to be machine parseable";
    assert!(flagz.starts_with(&format!("\nkube-proxy flags\n{warning}")), "{flagz}");
    assert!(flagz.lines().any(|l| l.starts_with("hostname-override") && l.ends_with("node")), "{flagz}");
    let (_, statusz) = wait_status(&lab.node, metrics, "/statusz", 200);
    assert!(statusz.starts_with(&format!("\nkube-proxy statusz\n{warning}")), "{statusz}");
    let paths = statusz.lines().find(|l| l.starts_with("Paths")).unwrap_or_default();
    assert!(paths.ends_with("/configz /flagz /healthz /metrics /proxyMode /statusz"), "{statusz}");

    // The autoscaler taints the node for deletion: /healthz fails, /livez not.
    server
        .apply(
            NODES,
            json!({"metadata": {"name": "node"},
                   "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}}),
        )
        .unwrap();
    let (_, body) = wait_status(&lab.node, health, "/healthz", 503);
    assert!(body.contains("\"nodeEligible\":false,\"healthy\":true"), "{body}");
    assert_eq!(get(&lab.node, health, "/livez").map(|(s, _)| s), Some(200));
    assert!(kpx.is_running(), "{}", kpx.log());
}

#[test]
fn servers_answer_with_real_values_iptables() {
    servers_answer("iptables");
}

#[test]
fn servers_answer_with_real_values_nftables() {
    servers_answer("nftables");
}

/// One source (127.0.0.2) holds 2,000 idle connections to kpx's servers
/// (`/healthz`, `/metrics` and a Service's health-check node port), and
/// another (127.0.0.3) trickles request heads a byte a second on 16
/// connections to each; meanwhile every probe from a third source
/// (127.0.0.4) to each server is answered within 100 ms. The idle
/// source keeps at most its share (16 per server); the rest are closed as
/// they are accepted, and the trickling heads are cut off at the header
/// deadline (3 s).
#[test]
fn servers_hold_against_idle_and_slow_clients() {
    use std::net::{SocketAddr, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(lab) = lab_or_skip(1, "servers_hold_against_idle_and_slow_clients") else {
        return;
    };
    let (dir, manifests) = run_dirs("servers-hold");
    lab.node.ip(&["link", "set", "lo", "up"]).unwrap();
    let be1 = lab.backends[0].ip.clone();
    write_manifest(
        &manifests.join("lb.yaml"),
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: lb, namespace: test}}\nspec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.20\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 31000\n  ports: [{{name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: lb-1\n  namespace: test\n  labels: {{kubernetes.io/service-name: lb}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n- addresses: [{be1}]\n  conditions: {{ready: true}}\n  nodeName: node\n"
        ),
    );
    let args = kpx_args(&manifests, &["--proxy-mode", "nftables"]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("sync pass done ok=true", 1, Duration::from_secs(20)), "{}", kpx.log());
    let servers: [(&str, &str); 3] =
        [("127.0.0.1:10256", "/healthz"), ("127.0.0.1:10249", "/metrics"), ("127.0.0.1:31000", "/")];
    for (addr, path) in servers {
        wait_status(&lab.node, addr, path, 200);
    }
    // This process holds the idle source's sockets.
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();

    fn connect(from: &str, to: &str) -> std::io::Result<TcpStream> {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        s.bind(&SocketAddr::new(from.parse().unwrap(), 0).into())?;
        s.connect_timeout(&to.parse::<SocketAddr>().unwrap().into(), Duration::from_secs(2))?;
        Ok(s.into())
    }
    let addrs: Vec<String> = servers.iter().map(|(a, _)| a.to_string()).collect();
    let idle: Vec<TcpStream> = lab
        .node
        .enter({
            let addrs = addrs.clone();
            move || (0..2000).filter_map(|i| connect("127.0.0.2", &addrs[i % 3]).ok()).collect()
        })
        .unwrap();
    let trickle_stop = Arc::new(AtomicBool::new(false));
    let trickler = {
        let (ns, addrs, stop) = (lab.node.clone(), addrs.clone(), trickle_stop.clone());
        std::thread::spawn(move || {
            ns.enter(move || {
                let mut conns: Vec<TcpStream> =
                    addrs.iter().flat_map(|a| (0..16).filter_map(|_| connect("127.0.0.3", a).ok())).collect();
                let opened = conns.len();
                let head = b"GET /healthz HTTP/1.1\r\nHost: kpx\r\n";
                let mut sent = 0;
                let t0 = Instant::now();
                while !stop.load(Ordering::Acquire) && !conns.is_empty() {
                    let byte = [head[sent % head.len()]];
                    conns.retain_mut(|s| s.write_all(&byte).is_ok());
                    sent += 1;
                    std::thread::sleep(Duration::from_secs(1));
                }
                (opened, conns.len(), t0.elapsed())
            })
            .unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let probes = servers.map(|(a, p)| (a.to_string(), p.to_string()));
    let (slowest, answered) = lab
        .node
        .enter(move || {
            let (mut slowest, mut answered) = (Duration::ZERO, 0);
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(6) {
                for (addr, path) in &probes {
                    let start = Instant::now();
                    let mut s = connect("127.0.0.4", addr).expect("probe connects");
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: kpx\r\n\r\n").as_bytes()).unwrap();
                    let mut text = String::new();
                    s.read_to_string(&mut text).unwrap_or_else(|e| panic!("probe of {addr}{path}: {e}"));
                    assert!(
                        text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
                        "{addr}{path}: {text}"
                    );
                    slowest = slowest.max(start.elapsed());
                    answered += 1;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (slowest, answered)
        })
        .unwrap();
    // The idle source: at most 16 per server still open after the probes.
    let still_open = idle
        .iter()
        .filter(|s| {
            s.set_nonblocking(true).unwrap();
            matches!(s.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        })
        .count();
    trickle_stop.store(true, Ordering::Release);
    let (opened, unclosed, took) = trickler.join().unwrap();
    eprintln!(
        "{} idle connections made, {still_open} still open after 6 s; {opened} trickling, {unclosed} not cut off after {took:?}; {answered} probes, slowest {slowest:?}",
        idle.len()
    );
    assert!(idle.len() >= 1900, "the idle source's connections were made (into the backlog or accepted)");
    assert_eq!(still_open, 0, "idle connections outlived the header deadline");
    assert_eq!(unclosed, 0, "trickling heads were not cut off");
    assert!(answered >= 30, "{answered} probes");
    assert!(slowest < Duration::from_millis(100), "a probe took {slowest:?}");
    assert!(kpx.is_running(), "{}", kpx.log());
}
