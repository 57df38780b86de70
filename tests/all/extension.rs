//! Extensions with real traffic: the two examples of examples/ loaded
//! with `--extension`, in the iptables and nftables modes. The rate limit
//! drops a Service's new connections beyond its annotation's rate (and
//! only that Service's); the counters on /metrics count exactly the
//! connections that were made and dropped.

use std::time::{Duration, Instant};

use kpx_netlab::node::NodeLab;

use crate::schedulers::write_service;
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
fn counter_reaches(lab: &NodeLab, extension: &str, service: &str, counter: &str, want: u64) -> Option<u64> {
    let labels = format!("extension=\"{extension}\",service=\"{service}\",counter=\"{counter}\"");
    let t0 = Instant::now();
    let mut last = None;
    while t0.elapsed() < Duration::from_secs(8) {
        let (_, text) = wait_status(&lab.node, "127.0.0.1:10249", "/metrics", 200);
        last = text
            .lines()
            .find(|l| l.starts_with("kpx_extension_counter{") && l.contains(&labels))
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
    let (made, failed, _) = attempts(&lab, "10.96.0.10:80", 10);
    assert_eq!((made, failed), (10, 0), "no limit once the annotation is removed");
    assert_eq!(count("conncount", "test/limited:tcp", "accepted", (made + 3) as u64).map(|c| c >= 13), Some(true));
    drop(kpx);
}
