//! Extensions with real traffic: the two examples of examples/ loaded
//! with `--extension`, in the iptables and nftables modes. The rate limit
//! drops a Service's new connections beyond its annotation's rate (and
//! only that Service's); the counters on /metrics count exactly the
//! connections that were made and dropped.

use std::time::{Duration, Instant};

use kpx_netlab::node::NodeLab;

use crate::schedulers::{client_addresses, tcp_from, write_service};
use crate::servers::wait_status;
use crate::support::*;

fn example(file: &str) -> String {
    format!("{}/{file}", env!("KPX_TEST_PLUGIN_DIR"))
}

/// Connection attempts to `to`, one after another, each given 150 ms (a
/// dropped SYN is retransmitted only after 1 s, so an attempt is one new
/// connection): (made, failed, seconds taken).
fn attempts(lab: &NodeLab, to: &str, n: usize) -> (usize, usize, f64) {
    let t0 = Instant::now();
    let made = (0..n)
        .filter(|_| {
            matches!(
                kpx_netlab::tcp_request(&lab.client, to, Duration::from_millis(150)),
                kpx_netlab::Reply::Answer { .. }
            )
        })
        .count();
    (made, n - made, t0.elapsed().as_secs_f64())
}

/// `kpx_extension_counter` of (extension, service, counter), once /metrics has it at `want`
/// (read every 2 s); the last value seen if it never gets there.
pub(crate) fn counter_reaches(lab: &NodeLab, extension: &str, service: &str, counter: &str, want: u64) -> Option<u64> {
    let labels = format!("extension=\"{extension}\",service=\"{service}\",counter=\"{counter}\"");
    let t0 = Instant::now();
    let mut last = None;
    while t0.elapsed() < Duration::from_secs(8) {
        let (_, text) = wait_status(&lab.node, "127.0.0.1:10249", "/metrics", 200);
        last = text
            .lines()
            .find(|l| l.starts_with("kpx_extension_counter_total{") && l.contains(&labels))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok());
        if last == Some(want) {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    last
}

#[test]
fn rate_limit_and_counters_extensions_in_nftables_mode() {
    extensions_with_traffic("nftables");
}

#[test]
fn rate_limit_and_counters_extensions_in_iptables_mode() {
    extensions_with_traffic("iptables");
}

fn extensions_with_traffic(mode: &str) {
    let Some(lab) = lab_or_skip(2, &format!("extensions ({mode})")) else {
        return;
    };
    let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    let (dir, manifests) = run_dirs(&format!("extension-{mode}"));
    let limit = [("ext.kpx.dev/ratelimit.new-connections-per-second", "1"), ("ext.kpx.dev/ratelimit.burst", "3")];
    write_service(&manifests, "limited", "10.96.0.10", &limit, &eps, &[]);
    write_service(&manifests, "free", "10.96.0.11", &[], &eps, &[]);
    let ratelimit = format!("ratelimit={}", example("kpx_example_ratelimit.wasm"));
    let conncount = format!("conncount={}", example("kpx_example_conncount.wasm"));
    let args = kpx_args(&manifests, &["--proxy-mode", mode, "--extension", &ratelimit, "--extension", &conncount]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());

    // The extensions' own objects, and nothing of theirs elsewhere.
    let objects = match mode {
        "nftables" => lab.node.exec(&["nft", "list", "ruleset"]).unwrap(),
        _ => lab.node.exec(&["iptables-save"]).unwrap(),
    };
    for want in match mode {
        "nftables" => ["table ip kpx-ratelimit", "table ip kpx-conncount"],
        _ => [":KUBE-X-RATELIMIT-DISPATCH", ":KUBE-X-CONNCOUNT-SERVICE"],
    } {
        assert!(objects.contains(want), "{want} missing:\n{objects}");
    }

    let (free_made, free_failed, _) = attempts(&lab, "10.96.0.11:80", 20);
    assert_eq!((free_made, free_failed), (20, 0), "an unannotated Service is not limited");
    let (made, dropped, took) = attempts(&lab, "10.96.0.10:80", 20);
    eprintln!("{mode}: limited to 1/s, burst 3: {made} made, {dropped} dropped in {took:.2} s");
    // The burst, plus what the bucket refilled while the attempts ran.
    let most = 3 + took.ceil() as usize + 1;
    assert!((3..=most).contains(&made), "{made} connections made in {took:.2} s (want 3 to {most})");

    let count = |ext, svc, c, want| counter_reaches(&lab, ext, svc, c, want);
    assert_eq!(count("ratelimit", "test/limited:tcp", "dropped", dropped as u64), Some(dropped as u64));
    assert_eq!(count("conncount", "test/limited:tcp", "accepted", made as u64), Some(made as u64));
    assert_eq!(count("conncount", "test/free:tcp", "accepted", 20), Some(20));

    // The annotation gone, the limit goes with it.
    let synced = kpx.log().matches("synced rules family=IPv4").count();
    write_service(&manifests, "limited", "10.96.0.10", &[], &eps, &[]);
    assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(20)), "{}", kpx.log());
    let (after, failed, _) = attempts(&lab, "10.96.0.10:80", 10);
    assert_eq!((after, failed), (10, 0), "no limit once the annotation is removed");
    let total = (made + after) as u64;
    assert_eq!(count("conncount", "test/limited:tcp", "accepted", total), Some(total));
    drop(kpx);

    // --cleanup finds every extension's objects by their names alone.
    lab.node.exec(&[KPX, "--cleanup"]).expect("kpx --cleanup");
    let nft = lab.node.exec(&["nft", "list", "ruleset"]).unwrap();
    let ipt = lab.node.exec(&["iptables-save"]).unwrap();
    assert!(!nft.contains("kpx-ratelimit") && !nft.contains("kpx-conncount"), "{nft}");
    assert!(!ipt.contains("KUBE-X-"), "{ipt}");
}

fn probe(name: &str, what: &str) -> String {
    format!("{name}={},do={what}", example("kpx_plugin_ext_probe.wasm"))
}

/// Hostile and broken extensions, all in one kpx: each is refused or
/// stopped with a message naming it and why, counted in
/// `kpx_extension_failures`, and writes nothing; kube-proxy's rules and a
/// well-behaved extension beside them work on.
#[test]
fn broken_extensions_are_refused_and_the_rest_works_on() {
    for mode in ["nftables", "iptables"] {
        broken_extensions(mode);
    }
}

fn broken_extensions(mode: &str) {
    let Some(lab) = lab_or_skip(2, &format!("broken extensions ({mode})")) else {
        return;
    };
    let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    let (dir, manifests) = run_dirs(&format!("extension-broken-{mode}"));
    write_service(&manifests, "web", "10.96.0.10", &[], &eps, &[]);
    let broken = [
        ("unknown", "unknown-service", "\"nope/nope:none\" is not a service port of the state"),
        ("rejectd", "reject-at-dispatch", "reject is only possible at the service attachment"),
        ("badctr", "bad-counter", "a counter's name is [a-z0-9_]"),
        ("family", "wrong-family", "the source is not an IPv4 CIDR"),
        ("toomany", "too-many", "an extension may return at most 262144 rules"),
        ("error", "error", "asked to fail"),
        // The panic message is the panic hook's own line (checked below).
        ("panic", "panic", "render trapped: wasm trap"),
        ("spin", "spin", "ran out of fuel"),
    ];
    let mut args = vec!["--proxy-mode".to_string(), mode.into(), "--extension".into(), probe("good", "count")];
    for (name, what, _) in broken {
        args.extend(["--extension".to_string(), probe(name, what)]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let args = kpx_args(&manifests, &args);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(30)), "{}", kpx.log());

    let (made, failed, _) = attempts(&lab, "10.96.0.10:80", 10);
    assert_eq!((made, failed), (10, 0), "kube-proxy's rules work beside the broken extensions");
    assert_eq!(counter_reaches(&lab, "good", "test/web:tcp", "seen", 10), Some(10));
    let log = kpx.log();
    let tables = lab.node.exec(&["nft", "list", "tables"]).unwrap();
    let chains = lab.node.exec(&["iptables-save"]).unwrap();
    let (_, metrics) = wait_status(&lab.node, "127.0.0.1:10249", "/metrics", 200);
    for (name, _, why) in broken {
        let line = log
            .lines()
            .find(|l| l.contains("extension failed") && l.contains(&format!("extension=\"{name}\"")))
            .unwrap_or_else(|| panic!("no failure logged for {name}:\n{log}"));
        assert!(line.contains(why), "{name}: want {why:?} in {line}");
        assert!(!tables.contains(&format!("kpx-{name}")), "{name} wrote a table:\n{tables}");
        let prefix = format!("KUBE-X-{}-", name.to_uppercase());
        assert!(!chains.contains(&format!("-j {prefix}")), "{name} wrote rules:\n{chains}");
        let failures = metrics
            .lines()
            .find(|l| l.starts_with(&format!("kpx_extension_failures_total{{extension=\"{name}\"}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
        assert!(failures.is_some_and(|n| n >= 1), "{name}: failures {failures:?}");
    }
    assert!(log.contains("asked to panic"), "the panic's message reaches the log:\n{log}");
    let good = if mode == "nftables" { tables.contains("kpx-good") } else { chains.contains("KUBE-X-GOOD-DISPATCH") };
    assert!(good, "{tables}\n{chains}");
    assert!(metrics.contains("kpx_extension_failures_total{extension=\"good\"} 0"), "{metrics}");
    drop(kpx);
}

/// An extension that drops every new connection it may: every Service's
/// (through its cluster IP and its node port), and nothing else (the
/// node's own server on the Service's port number still answers). Then
/// one that rejects after kube-proxy's choice: refused at once, not timed
/// out.
#[test]
fn an_extension_reaches_service_traffic_only() {
    for mode in ["nftables", "iptables"] {
        let Some(lab) = lab_or_skip(1, &format!("extension scope ({mode})")) else {
            return;
        };
        let ep = lab.backends[0].ip.clone();
        let (dir, manifests) = run_dirs(&format!("extension-scope-{mode}"));
        write_manifest(
            &manifests.join("web.yaml"),
            &format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: test}}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.10\n  ports:\n  - {{name: tcp, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}}\n---\n{}",
                slice("web", &[ep.as_str()])
            ),
        );
        let node = kpx_netlab::node::NODE_IP;
        let node_server = format!("{node}:80");
        let _server = kpx_netlab::EchoServer::start(&lab.node, "node", &node_server).expect("a server on the node");
        let run = |what: &str| {
            let ext = probe("probe", what);
            // nftables mode serves node ports on the node's primary IPs by
            // default, and the lab has no Node object: name the link's
            // range (iptables mode: every local address).
            let mut args = vec!["--proxy-mode", mode, "--extension", &ext];
            if mode == "nftables" {
                args.extend(["--nodeport-addresses", "192.168.100.0/24"]);
            }
            let args = kpx_args(&manifests, &args);
            let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join(format!("kpx-{what}.log"))).expect("start kpx");
            assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
            kpx
        };
        let free = attempts(&lab, &format!("{node}:30080"), 3).0;
        assert_eq!(free, 0, "{mode}: nothing serves the node port before kpx");
        let kpx = run("count");
        assert_eq!(attempts(&lab, &format!("{node}:30080"), 3).0, 3, "{mode}: the node port works");
        drop(kpx);

        let kpx = run("drop-all");
        let (made, _, _) = attempts(&lab, "10.96.0.10:80", 5);
        assert_eq!(made, 0, "{mode}: the Service's connections are dropped");
        let (made, _, _) = attempts(&lab, &format!("{node}:30080"), 5);
        assert_eq!(made, 0, "{mode}: and those to its node port");
        let (other, _, _) = attempts(&lab, &node_server, 5);
        assert_eq!(other, 5, "{mode}: the node's own server on port 80 is not the extension's");
        drop(kpx);

        let kpx = run("reject-all");
        let (made, _, took) = attempts(&lab, "10.96.0.10:80", 5);
        assert_eq!(made, 0, "{mode}: rejected after kube-proxy's choice");
        assert!(took < 0.5, "{mode}: rejected at once, not dropped: 5 attempts took {took:.2} s");
        // Answered with a TCP reset, which the kernel does not rate limit
        // as it does ICMP errors (after about six quick ones from a host,
        // one a second): 30 attempts in a row are each refused.
        let replies: Vec<kpx_netlab::Reply> = (0..30)
            .map(|_| kpx_netlab::tcp_request(&lab.client, "10.96.0.10:80", Duration::from_millis(150)))
            .collect();
        let refused = replies.iter().filter(|r| matches!(r, kpx_netlab::Reply::Refused)).count();
        assert_eq!(refused, 30, "{mode}: each of 30 quick attempts refused at once: {replies:?}");
        assert_eq!(attempts(&lab, &node_server, 3).0, 3, "{mode}: the node's own server still answers");
        drop(kpx);
    }
}

/// Replaces `path` as an operator's tooling would: a new file renamed over the old one.
fn replace(path: &std::path::Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// An extension's file replaced while kpx runs: the counting component
/// gives way to the rate limit (which reads the same annotations, by the
/// configured name), and a file that is not an extension is refused with
/// the limit still in force.
#[test]
fn a_replaced_extension_takes_over() {
    let Some(lab) = lab_or_skip(1, "extension hot reload") else {
        return;
    };
    let ep = lab.backends[0].ip.clone();
    let (dir, manifests) = run_dirs("extension-reload");
    let limit = [("ext.kpx.dev/vendor.new-connections-per-second", "1"), ("ext.kpx.dev/vendor.burst", "1")];
    write_service(&manifests, "web", "10.96.0.10", &limit, &[ep.as_str()], &[]);
    let file = dir.join("vendor.wasm");
    std::fs::write(&file, std::fs::read(example("kpx_example_conncount.wasm")).unwrap()).unwrap();
    let vendor = format!("vendor={}", file.display());
    let args = kpx_args(&manifests, &["--proxy-mode", "nftables", "--extension", &vendor]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    let (made, _, _) = attempts(&lab, "10.96.0.10:80", 8);
    assert_eq!(made, 8, "counting limits nothing");
    // The reload series are there before any reload, at 0 (an extension
    // has no rollback).
    let (_, metrics) = wait_status(&lab.node, "127.0.0.1:10249", "/metrics", 200);
    for outcome in ["applied", "refused"] {
        let zero = format!("kpx_plugin_reloads_total{{component=\"extension:vendor\",outcome=\"{outcome}\"}} 0");
        assert!(metrics.contains(&zero), "want {zero} in:\n{metrics}");
    }
    assert!(!metrics.contains("component=\"extension:vendor\",outcome=\"rolled-back\""), "{metrics}");

    let synced = kpx.log().matches("synced rules family=IPv4").count();
    replace(&file, &std::fs::read(example("kpx_example_ratelimit.wasm")).unwrap());
    assert!(kpx.wait_for_log("replaced component applied", 1, Duration::from_secs(10)), "{}", kpx.log());
    assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(10)), "{}", kpx.log());
    let (made, dropped, took) = attempts(&lab, "10.96.0.10:80", 8);
    eprintln!("after the swap: {made} made, {dropped} dropped in {took:.2} s");
    assert!(made >= 1 && made <= 2 + took.ceil() as usize, "the rate limit took over: {made} of 8 made in {took:.2} s");
    assert!(kpx.log().contains("component=extension:vendor"), "{}", kpx.log());

    replace(&file, &std::fs::read(format!("{}/kpx_plugin_first.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap());
    assert!(kpx.wait_for_log("replaced component refused", 1, Duration::from_secs(10)), "{}", kpx.log());
    let said =
        format!("--extension {} is a scheduler component; --extension takes an extension component", file.display());
    let log = kpx.log();
    let refusal = log.lines().find(|l| l.contains("replaced component refused")).unwrap_or_default();
    assert!(refusal.contains("the running one keeps serving") && refusal.contains(&said), "want {said:?}: {refusal}");
    std::thread::sleep(Duration::from_millis(1500));
    let (made, _, took) = attempts(&lab, "10.96.0.10:80", 8);
    assert!(made <= 2 + took.ceil() as usize, "the limit stays after the refusal: {made} of 8 in {took:.2} s");
    let (_, metrics) = wait_status(&lab.node, "127.0.0.1:10249", "/metrics", 200);
    for outcome in ["applied", "refused"] {
        let counted = format!("kpx_plugin_reloads_total{{component=\"extension:vendor\",outcome=\"{outcome}\"}} 1");
        assert!(metrics.contains(&counted), "want {counted} in:\n{metrics}");
    }
    drop(kpx);
}

/// An extension's accept ends its own rules for the connection, and
/// nothing else, in both modes: a rule accepting one client before a rule
/// dropping every source lets that client through kube-proxy's rules to
/// an endpoint (its DNAT still applies), while another client is dropped,
/// each counted once per attempt. A second extension beside it still sees
/// the accepted connections (an accept that skipped more than its own
/// rules would hide them from it whenever it runs after the first).
#[test]
fn an_accept_rule_ends_the_extensions_rules_only() {
    for mode in ["nftables", "iptables"] {
        let Some(lab) = lab_or_skip(2, &format!("extension accept ({mode})")) else {
            return;
        };
        let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
        let (dir, manifests) = run_dirs(&format!("extension-accept-{mode}"));
        write_service(&manifests, "web", "10.96.0.10", &[], &eps, &[]);
        let clients = client_addresses(&lab, 2);
        let (accepted, other) = (clients[0], clients[1]);
        let gate = format!("{},from={accepted}/32", probe("gate", "accept-from"));
        let count = probe("count", "count");
        let args = kpx_args(&manifests, &["--proxy-mode", mode, "--extension", &count, "--extension", &gate]);
        let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
        assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
        // The accept as written: a return from the port chain (counted: a
        // goto to the counter chain, whose rule returns), never an accept.
        let objects = match mode {
            "nftables" => lab.node.exec(&["nft", "list", "table", "ip", "kpx-gate"]).unwrap(),
            _ => lab.node.exec(&["iptables-save", "-t", "mangle"]).unwrap(),
        };
        // (nft lists a /32 as its address, iptables-save with /32.)
        let source = accepted.to_string();
        let lines: Vec<&str> = objects.lines().map(str::trim_end).filter(|l| l.contains(&source)).collect();
        let written = match mode {
            "nftables" => lines.iter().any(|l| l.ends_with(" return")),
            _ => lines.iter().any(|l| l.starts_with("-A KUBE-X-GATE-") && l.contains(" -g KUBE-X-GATE-")),
        };
        assert!(written, "{mode}: the accept of {source}:\n{objects}");
        let verdict = objects.lines().map(str::trim_end).any(|l| l.contains("-j ACCEPT") || l.ends_with(" accept"));
        assert!(!verdict, "{mode}: never an accept verdict:\n{objects}");

        for _ in 0..3 {
            let answer = tcp_from(&lab, Some(accepted), "10.96.0.10:80");
            assert!(answer.starts_with("be"), "{mode}: the accepted client reaches an endpoint: {answer}");
            let dropped = tcp_from(&lab, Some(other), "10.96.0.10:80");
            assert_eq!(dropped, "Timeout", "{mode}: another client is dropped");
        }
        let counted = |extension, counter, want| counter_reaches(&lab, extension, "test/web:tcp", counter, want);
        assert_eq!(counted("gate", "accepted", 3), Some(3), "{mode}: each accepted connection once");
        assert_eq!(counted("gate", "dropped", 3), Some(3), "{mode}: each dropped attempt");
        // 3 if it runs after the gate (the dropped ones never reach it), 6 before.
        let seen = counted("count", "seen", 3);
        assert!(seen.is_some_and(|n| n >= 3), "{mode}: the other extension sees the accepted ones: {seen:?}");
        drop(kpx);
    }
}

/// An extension that refuses its parameters when kpx loads it stops kpx
/// at start, in both modes, before it writes a rule: kpx exits with an
/// error naming the flag, the file and the parameter.
#[test]
fn refused_extension_parameters_stop_kpx_at_start() {
    let Some(lab) = lab_or_skip(1, "refused_extension_parameters_stop_kpx_at_start") else {
        return;
    };
    let file = example("kpx_plugin_ext_probe.wasm");
    for mode in ["nftables", "iptables"] {
        let (_, manifests) = run_dirs(&format!("extension-parameters-{mode}"));
        write_service(&manifests, "web", "10.96.0.10", &[], &[lab.backends[0].ip.as_str()], &[]);
        let ext = probe("probe", "nonsense");
        let args = kpx_args(&manifests, &["--proxy-mode", mode, "--extension", &ext]);
        // Bounded: a kpx that went on would otherwise hold the test.
        let out = lab.node.command("timeout").arg("30").arg(KPX).args(&args).env("NO_COLOR", "1").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stopped = !out.status.success() && out.status.code() != Some(124);
        assert!(stopped, "{mode}: kpx must stop with an error at start: {:?}\n{stderr}", out.status);
        let said = format!("--extension probe={file}: the component refuses its parameters: do=nonsense");
        assert!(stderr.contains(&said), "{mode}: want {said:?} in:\n{stderr}");
        assert!(!stderr.contains("synced rules"), "{mode}:\n{stderr}");
        let nft = lab.node.exec(&["nft", "list", "ruleset"]).unwrap_or_default();
        let written = kernel_rules(&lab).contains("KUBE-") || nft.contains("kube-proxy") || nft.contains("kpx-probe");
        assert!(!written, "{mode}: rules written:\n{nft}\n{}", kernel_rules(&lab));
    }
}

/// A replaced extension file whose component refuses the flag's
/// parameters is refused: the running one keeps serving, and the refusal
/// is logged with the component's reason and counted.
#[test]
fn a_replaced_extension_that_refuses_its_parameters_is_refused() {
    let Some(lab) = lab_or_skip(1, "a_replaced_extension_that_refuses_its_parameters_is_refused") else {
        return;
    };
    let ep = lab.backends[0].ip.clone();
    let (dir, manifests) = run_dirs("extension-reload-parameters");
    write_service(&manifests, "web", "10.96.0.10", &[], &[ep.as_str()], &[]);
    let file = dir.join("vendor.wasm");
    std::fs::write(&file, std::fs::read(example("kpx_plugin_ext_probe.wasm")).unwrap()).unwrap();
    let vendor = format!("vendor={},do=drop-all", file.display());
    let args = kpx_args(&manifests, &["--proxy-mode", "nftables", "--extension", &vendor]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    assert_eq!(attempts(&lab, "10.96.0.10:80", 3).0, 0, "the probe drops the Service's connections");

    // The rate limit takes default= and action= only: not do=drop-all.
    replace(&file, &std::fs::read(example("kpx_example_ratelimit.wasm")).unwrap());
    assert!(kpx.wait_for_log("replaced component refused", 1, Duration::from_secs(10)), "{}", kpx.log());
    let log = kpx.log();
    let refusal = log.lines().find(|l| l.contains("replaced component refused")).unwrap_or_default();
    let said = format!(
        "--extension vendor={}: the component refuses its parameters: unknown parameter do=drop-all",
        file.display()
    );
    assert!(refusal.contains("the running one keeps serving") && refusal.contains(&said), "want {said:?}: {refusal}");
    assert_eq!(attempts(&lab, "10.96.0.10:80", 3).0, 0, "the probe still drops them");
    let (_, metrics) = wait_status(&lab.node, "127.0.0.1:10249", "/metrics", 200);
    for (outcome, n) in [("applied", 0), ("refused", 1)] {
        let counted = format!("kpx_plugin_reloads_total{{component=\"extension:vendor\",outcome=\"{outcome}\"}} {n}");
        assert!(metrics.contains(&counted), "want {counted} in:\n{metrics}");
    }
    drop(kpx);
}

/// A component given to the flag of another kind stops kpx before it
/// writes a rule, in both modes and for every role, the log naming the
/// flag, the file, the kind found and the kind the flag takes: a
/// scheduler given to `--extension`, an extension given to
/// `--backend-plugin` or to `--scheduler-plugin`.
#[test]
fn a_component_of_the_wrong_kind_stops_kpx_at_start() {
    let Some(lab) = lab_or_skip(1, "a_component_of_the_wrong_kind_stops_kpx_at_start") else {
        return;
    };
    let (scheduler, probe) = (example("kpx_plugin_first.wasm"), example("kpx_plugin_ext_probe.wasm"));
    let (vendor, mine) = (format!("vendor={scheduler}"), format!("mine={probe}"));
    let cases = [
        (["--extension", vendor.as_str()], &scheduler, "a scheduler", "an extension"),
        (["--backend-plugin", probe.as_str()], &probe, "an extension", "a backend"),
        (["--scheduler-plugin", mine.as_str()], &probe, "an extension", "a scheduler"),
    ];
    for mode in ["nftables", "iptables"] {
        for ([flag, value], file, found, takes) in &cases {
            let (dir, manifests) = run_dirs(&format!("wrong-kind-{mode}"));
            write_service(&manifests, "web", "10.96.0.10", &[], &[lab.backends[0].ip.as_str()], &[]);
            let args = kpx_args(&manifests, &["--proxy-mode", mode, *flag, *value]);
            let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
            let t0 = Instant::now();
            while kpx.is_running() && t0.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(!kpx.is_running(), "{mode}: kpx went on with {flag} {value}:\n{}", kpx.log());
            let log = kpx.log();
            let want = format!("{flag} {file} is {found} component; {flag} takes {takes} component");
            assert!(log.contains(&want), "{mode}: want {want:?} in:\n{log}");
            assert!(!log.contains("synced rules") && !log.contains("replaced component"), "{mode}:\n{log}");
            let nft = lab.node.exec(&["nft", "list", "ruleset"]).unwrap_or_default();
            assert!(!kernel_rules(&lab).contains("KUBE-") && !nft.contains("kube-proxy"), "{mode}: rules written");
        }
    }
}

/// What an extension left outlives kpx as it should, in both modes: a
/// restarted kpx reconciles its objects (the counts go on from the
/// kernel's), an extension whose file is missing at start does not hold
/// kube-proxy's rules back and loads once the file appears, and the
/// objects of an extension no longer configured are removed at start.
#[test]
fn extension_objects_across_restarts() {
    for mode in ["nftables", "iptables"] {
        let Some(lab) = lab_or_skip(1, &format!("extension restarts ({mode})")) else {
            return;
        };
        let ep = lab.backends[0].ip.clone();
        let (dir, manifests) = run_dirs(&format!("extension-restart-{mode}"));
        write_service(&manifests, "web", "10.96.0.10", &[], &[ep.as_str()], &[]);
        let file = dir.join("count.wasm");
        std::fs::write(&file, std::fs::read(example("kpx_example_conncount.wasm")).unwrap()).unwrap();
        let count = format!("count={}", file.display());
        let args = kpx_args(&manifests, &["--proxy-mode", mode, "--extension", &count]);
        let start = |log: &str| {
            let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join(log)).expect("start kpx");
            assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
            kpx
        };
        let kpx = start("kpx-1.log");
        assert_eq!(attempts(&lab, "10.96.0.10:80", 6).0, 6);
        assert_eq!(counter_reaches(&lab, "count", "test/web:tcp", "accepted", 6), Some(6));
        drop(kpx);

        // Restarted: the kernel's count goes on.
        let kpx = start("kpx-2.log");
        assert_eq!(attempts(&lab, "10.96.0.10:80", 4).0, 4);
        assert_eq!(
            counter_reaches(&lab, "count", "test/web:tcp", "accepted", 10),
            Some(10),
            "{mode}: kept across a restart"
        );
        drop(kpx);

        // A run in the other mode, the extension still configured: the
        // objects it left in this mode go, said as this mode's leftovers,
        // not as those of an extension no longer configured.
        let other = if mode == "nftables" { "iptables" } else { "nftables" };
        let switched = kpx_args(&manifests, &["--proxy-mode", other, "--extension", &count]);
        let mut kpx = lab.start_kpx(KPX.as_ref(), &switched, &dir.join("kpx-switch.log")).expect("start kpx");
        assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
        let log = kpx.log();
        let said = format!("removed the {mode} objects of extension count, left from a run in {mode} mode");
        let stay = format!("it is still configured, and its {other} objects stay");
        assert!(log.contains(&said) && log.contains(&stay), "{other}: want {said:?} and {stay:?} in:\n{log}");
        assert!(!log.contains("no longer configured"), "{other}: count is still configured:\n{log}");
        drop(kpx);

        // The file gone at start: kube-proxy's rules first, the extension's
        // old objects gone (nothing good to keep), and the extension back
        // once its file is.
        let held = || {
            let nft = lab.node.exec(&["nft", "list", "tables"]).unwrap();
            let ipt = lab.node.exec(&["iptables-save"]).unwrap();
            nft.contains("kpx-count") || ipt.contains(":KUBE-X-COUNT-")
        };
        std::fs::remove_file(&file).unwrap();
        let mut kpx = start("kpx-3.log");
        assert!(kpx.log().contains("extension not loaded"), "{}", kpx.log());
        assert!(!held(), "{mode}: the unloaded extension's old objects are removed");
        assert_eq!(attempts(&lab, "10.96.0.10:80", 3).0, 3, "{mode}: Services work without the extension");
        let synced = kpx.log().matches("synced rules family=IPv4").count();
        std::fs::write(&file, std::fs::read(example("kpx_example_conncount.wasm")).unwrap()).unwrap();
        assert!(kpx.wait_for_log("replaced component applied", 1, Duration::from_secs(10)), "{}", kpx.log());
        assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(10)), "{}", kpx.log());
        assert!(held(), "{mode}: the loaded extension wrote its objects");
        drop(kpx);

        // No longer configured: removed at start.
        let bare = kpx_args(&manifests, &["--proxy-mode", mode]);
        let mut kpx = lab.start_kpx(KPX.as_ref(), &bare, &dir.join("kpx-4.log")).expect("start kpx");
        assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
        let nft = lab.node.exec(&["nft", "list", "tables"]).unwrap();
        let ipt = lab.node.exec(&["iptables-save"]).unwrap();
        assert!(!nft.contains("kpx-count") && !ipt.contains("KUBE-X-COUNT"), "{mode}:\n{nft}\n{ipt}");
        assert!(kpx.log().contains("no longer configured"), "{}", kpx.log());
        drop(kpx);
    }
}

/// Every kind of match, object and verdict the host writes for an
/// extension, in both families and both modes, as the kernel takes it:
/// written into a fresh namespace (the kernel refuses a malformed
/// expression), listed back by nft and iptables-save as what it says,
/// rewritten, and removed.
#[test]
fn every_extension_object_is_accepted_by_the_kernel() {
    use kpx::extension::iptables::IptablesWriter;
    use kpx::extension::layout::build;
    use kpx::extension::nftables::NftablesWriter;
    use kpx_rules::model::{Cidr, IpFamily, NodePortAddresses, Protocol, ProxyMode, ServicePort, Settings};
    use kpx_rules::ops::extension::{Action, Attachment, Rate, Rule, Ruleset, SourceMatch};
    let Some(lab) = lab_or_skip(1, "extension objects in the kernel") else {
        return;
    };
    for family in [IpFamily::V4, IpFamily::V6] {
        let v4 = family == IpFamily::V4;
        let ip = |a: &str, b: &str| -> std::net::IpAddr { if v4 { a.parse().unwrap() } else { b.parse().unwrap() } };
        let mut port = ServicePort::new("ns", "web", "", Protocol::Tcp, 80);
        port.cluster_ip = Some(ip("10.96.0.10", "fd00:96::10"));
        port.external_ips = vec![ip("192.0.2.10", "2001:db8::10")];
        port.load_balancer_ips = vec![ip("198.51.100.10", "2001:db8:1::10")];
        port.node_port = 30080;
        let ports = std::collections::BTreeMap::from([(port.key.clone(), Box::new(port))]);
        let source = SourceMatch {
            negate: true,
            cidr: Cidr { addr: ip("10.1.0.0", "fd00:1::"), prefix_len: if v4 { 16 } else { 64 } },
        };
        let rule = |attachment, action, counter: &str| Rule {
            attachment,
            service: "ns/web".into(),
            source: Some(source),
            over_rate: Some(Rate { per_second: 100, burst: 200 }),
            counter: Some(counter.into()),
            action,
        };
        let rules = Ruleset {
            rules: vec![
                rule(Attachment::Firewall, Action::Continue, "lb"),
                rule(Attachment::BeforeDispatch, Action::Accept, "accepted"),
                rule(Attachment::BeforeDispatch, Action::Drop, "dropped"),
                rule(Attachment::Service, Action::Reject, "rejected"),
            ],
        };
        for mode in [ProxyMode::Nftables, ProxyMode::Iptables] {
            for nodeports in [
                NodePortAddresses::All,
                NodePortAddresses::Only(vec![Cidr {
                    addr: ip("192.168.100.0", "fd00:100::"),
                    prefix_len: if v4 { 24 } else { 64 },
                }]),
            ] {
                let mut settings = Settings::new(family, mode);
                settings.nodeport_addresses = nodeports.clone();
                let layout = build("objs", &settings, &rules, &ports, &Default::default());
                let what = format!("{family} {mode} {nodeports:?}");
                let (write, empty) = (layout.clone(), kpx::extension::layout::Layout::default());
                let listing = match mode {
                    ProxyMode::Nftables => {
                        let done = lab.node.enter(move || {
                            let mut w = NftablesWriter::new("objs", family);
                            w.write(&write, true).map_err(|e| e.to_string())?;
                            // Rewritten from what it holds, then emptied.
                            w.write(&write, true).map_err(|e| e.to_string())?;
                            Ok::<_, String>(())
                        });
                        done.unwrap().unwrap_or_else(|e| panic!("{what}: {e}"));
                        let table = if v4 { "ip" } else { "ip6" };
                        lab.node.exec(&["nft", "list", "table", table, "kpx-objs"]).unwrap()
                    }
                    _ => {
                        let done = lab.node.enter(move || {
                            let mut w =
                                IptablesWriter::new("objs", family, Box::new(kpx::kernel::SystemExec::default()));
                            w.write(&write, true).map_err(|e| e.to_string())?;
                            w.write(&write, true).map_err(|e| e.to_string())?;
                            Ok::<_, String>(())
                        });
                        done.unwrap().unwrap_or_else(|e| panic!("{what}: {e}"));
                        lab.node.exec(&[if v4 { "iptables-save" } else { "ip6tables-save" }]).unwrap()
                    }
                };
                let wants: Vec<&str> = match mode {
                    ProxyMode::Nftables => vec![
                        if v4 { "ct original ip daddr 10.96.0.10" } else { "ct original ip6 daddr fd00:96::10" },
                        "ct original proto-dst 80",
                        if v4 { "ip saddr != 10.1.0.0/16" } else { "ip6 saddr != fd00:1::/64" },
                        "limit name \"l-",
                        "counter name \"c-",
                        "reject",
                        "drop",
                        "goto p-",
                        // The accept.
                        "\" return",
                        "iifname != \"lo\"",
                        "ct status dnat",
                        "fib daddr type local",
                        "rate over 100/second burst 200 packets",
                    ],
                    _ => vec![
                        "--ctorigdst",
                        "--ctorigdstport 80",
                        "--hashlimit-above 100/sec --hashlimit-burst 200",
                        "-j REJECT",
                        "-j DROP",
                        "-g KUBE-X-OBJS-",
                        // The accept's (and the continue's) counter chain.
                        "-j RETURN",
                        "! -i lo",
                        "--ctstate DNAT",
                        "-m addrtype --dst-type LOCAL",
                    ],
                };
                for want in wants {
                    assert!(listing.contains(want), "{what}: {want:?} missing from:\n{listing}");
                }
                if let NodePortAddresses::Only(_) = nodeports {
                    let want = if mode == ProxyMode::Nftables { "30080" } else { "--ctorigdstport 30080" };
                    assert!(listing.contains(want), "{what}: the node port's entries:\n{listing}");
                }
                let gone = lab.node.enter(move || match mode {
                    ProxyMode::Nftables => {
                        let mut w = NftablesWriter::new("objs", family);
                        w.write(&empty, true).map_err(|e| e.to_string())?;
                        w.cleanup().map(|_| ()).map_err(|e| e.to_string())
                    }
                    _ => {
                        let mut w = IptablesWriter::new("objs", family, Box::new(kpx::kernel::SystemExec::default()));
                        w.write(&empty, true).map_err(|e| e.to_string())?;
                        w.cleanup().map(|_| ()).map_err(|e| e.to_string())
                    }
                });
                gone.unwrap().unwrap_or_else(|e| panic!("{what}: removing: {e}"));
            }
        }
    }
    let nft = lab.node.exec(&["nft", "list", "ruleset"]).unwrap();
    let ipt = lab.node.exec(&["iptables-save"]).unwrap() + &lab.node.exec(&["ip6tables-save"]).unwrap();
    assert!(!nft.contains("kpx-objs") && !ipt.contains("KUBE-X-OBJS"), "left behind:\n{nft}\n{ipt}");
}

/// Someone flushes an extension's counter chain and deletes one of its
/// jumps: the next full write (as after a restart or a failure, and every
/// hour) puts the counter chain's rule back and the jumps in their order
/// (the firewall's before dispatch).
#[test]
fn a_full_write_repairs_flushed_extension_chains() {
    use kpx::extension::iptables::IptablesWriter;
    use kpx::extension::layout::build;
    use kpx_rules::model::{IpFamily, Protocol, ProxyMode, ServicePort, Settings};
    use kpx_rules::ops::extension::{Action, Attachment, Rule, Ruleset};
    let Some(lab) = lab_or_skip(1, "extension repair") else {
        return;
    };
    let mut port = ServicePort::new("ns", "web", "", Protocol::Tcp, 80);
    port.cluster_ip = Some("10.96.0.10".parse().unwrap());
    port.load_balancer_ips = vec!["198.51.100.10".parse().unwrap()];
    let ports = std::collections::BTreeMap::from([(port.key.clone(), Box::new(port))]);
    let rule = |attachment| Rule {
        attachment,
        service: "ns/web".into(),
        source: None,
        over_rate: None,
        counter: Some("n".into()),
        action: Action::Drop,
    };
    let rules = Ruleset { rules: vec![rule(Attachment::Firewall), rule(Attachment::BeforeDispatch)] };
    let layout = build("fix", &Settings::new(IpFamily::V4, ProxyMode::Iptables), &rules, &ports, &Default::default());
    let write = |layout: kpx::extension::layout::Layout| {
        lab.node
            .enter(move || {
                let mut w = IptablesWriter::new("fix", IpFamily::V4, Box::new(kpx::kernel::SystemExec::default()));
                w.write(&layout, true).map_err(|e| e.to_string())
            })
            .unwrap()
            .unwrap()
    };
    write(layout.clone());
    let mangle = || lab.node.exec(&["iptables-save", "-t", "mangle"]).unwrap();
    let before = mangle();
    let counter_chains: Vec<String> = before
        .lines()
        .filter(|l| l.starts_with("-A KUBE-X-FIX-") && l.ends_with("-j DROP"))
        .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
        .collect();
    assert!(!counter_chains.is_empty(), "{before}");
    let jumps = |text: &str| -> Vec<String> {
        text.lines().filter(|l| l.starts_with("-A PREROUTING") && l.contains("KUBE-X-FIX-")).map(String::from).collect()
    };
    let order = jumps(&before);
    assert!(order.len() == 2 && order[0].contains("-FIREWALL") && order[1].contains("-DISPATCH"), "{before}");
    for c in &counter_chains {
        lab.node.exec(&["iptables", "-t", "mangle", "-F", c]).unwrap();
    }
    // The firewall's jump is the chain's first rule.
    lab.node.exec(&["iptables", "-t", "mangle", "-D", "PREROUTING", "1"]).unwrap();
    assert_eq!(jumps(&mangle()).len(), 1);

    write(layout);
    let after = mangle();
    for c in &counter_chains {
        assert!(after.contains(&format!("-A {c} -j DROP")), "{c} refilled:\n{after}");
    }
    let order = jumps(&after);
    assert!(order.len() == 2 && order[0].contains("-FIREWALL") && order[1].contains("-DISPATCH"), "{after}");
    lab.node
        .enter(|| {
            IptablesWriter::new("fix", IpFamily::V4, Box::new(kpx::kernel::SystemExec::default())).cleanup().unwrap()
        })
        .unwrap();
}

/// While an extension fails, its last good rules stay, but only for the
/// ports the state still holds: a Service deleted meanwhile takes its
/// objects with it (its address may go to another Service next).
#[test]
fn a_failing_extension_keeps_its_last_good_rules_on_the_current_state() {
    let Some(lab) = lab_or_skip(1, "extension fall-back") else {
        return;
    };
    let ep = lab.backends[0].ip.clone();
    let (dir, manifests) = run_dirs("extension-fallback");
    write_service(&manifests, "web", "10.96.0.10", &[], &[ep.as_str()], &[]);
    write_service(&manifests, "other", "10.96.0.11", &[], &[ep.as_str()], &[]);
    let dropper = probe("probe", "drop-all");
    let args = kpx_args(&manifests, &["--proxy-mode", "nftables", "--extension", &dropper]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    let table = || lab.node.exec(&["nft", "list", "table", "ip", "kpx-probe"]).unwrap();
    let before = table();
    assert!(before.contains("10.96.0.10") && before.contains("10.96.0.11"), "{before}");

    // Failing from now on; meanwhile `other` goes.
    let synced = kpx.log().matches("synced rules family=IPv4").count();
    write_service(&manifests, "fail-now", "10.96.0.12", &[], &[ep.as_str()], &[]);
    std::fs::remove_file(manifests.join("other.yaml")).unwrap();
    assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(20)), "{}", kpx.log());
    assert!(kpx.wait_for_log("fail-now asks me to fail", 1, Duration::from_secs(10)), "{}", kpx.log());
    let t0 = Instant::now();
    let mut after = table();
    while after.contains("10.96.0.11") && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        after = table();
    }
    assert!(after.contains("10.96.0.10"), "web's rule stays while the extension fails:\n{after}");
    assert!(!after.contains("10.96.0.11"), "the deleted Service's goes:\n{after}");
    assert!(!after.contains("10.96.0.12"), "the new Service gets none from a failing extension:\n{after}");
    assert_eq!(attempts(&lab, "10.96.0.10:80", 3).0, 0, "web is still dropped");
    assert_eq!(attempts(&lab, "10.96.0.12:80", 3).0, 3, "kube-proxy's rules for the new Service are written");
    drop(kpx);
}

/// A Service whose external IP is the node's address, on the number that
/// is another Service's node port: its connections are its own, and the
/// node-port Service's rate limit leaves them alone (kube-proxy sends them
/// to the external IP's Service; the extension must not count them as the
/// node port's).
#[test]
fn a_node_port_limit_leaves_another_services_address_alone() {
    for mode in ["nftables", "iptables"] {
        let Some(lab) = lab_or_skip(1, &format!("node-port exemption ({mode})")) else {
            return;
        };
        let ep = lab.backends[0].ip.clone();
        let node = kpx_netlab::node::NODE_IP;
        let (dir, manifests) = run_dirs(&format!("extension-exempt-{mode}"));
        write_manifest(
            &manifests.join("web.yaml"),
            &format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: test\n  annotations: {{ext.kpx.dev/ratelimit.new-connections-per-second: \"1\", ext.kpx.dev/ratelimit.burst: \"1\"}}\nspec:\n  type: NodePort\n  clusterIP: 10.96.0.10\n  ports:\n  - {{name: tcp, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}}\n---\n{}",
                slice("web", &[ep.as_str()])
            ),
        );
        write_manifest(
            &manifests.join("other.yaml"),
            &format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: other, namespace: test}}\nspec:\n  clusterIP: 10.96.0.11\n  externalIPs: [{node}]\n  ports:\n  - {{name: tcp, port: 30080, targetPort: 8080, protocol: TCP}}\n---\n{}",
                slice("other", &[ep.as_str()])
            ),
        );
        let ratelimit = format!("ratelimit={}", example("kpx_example_ratelimit.wasm"));
        let mut args = vec!["--proxy-mode", mode, "--extension", &ratelimit];
        if mode == "nftables" {
            args.extend(["--nodeport-addresses", "192.168.100.0/24"]);
        }
        let args = kpx_args(&manifests, &args);
        let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
        assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
        let (made, _, _) = attempts(&lab, &format!("{node}:30080"), 8);
        assert_eq!(made, 8, "{mode}: the external IP's Service is not limited by web's node port");
        let (made, _, took) = attempts(&lab, "10.96.0.10:80", 8);
        assert!(made <= 2 + took.ceil() as usize, "{mode}: web itself is limited: {made} of 8 in {took:.2} s");
        drop(kpx);
    }
}
