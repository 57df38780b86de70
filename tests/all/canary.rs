//! Someone else deletes or flushes kube-proxy's rules (a firewall reload,
//! an operator's `iptables -F`): kpx notices at its next periodic check
//! (upstream's canary, extended to flushed chains: kernel/iptables.rs and
//! kernel/nftables.rs, `lost`) and a full sync writes everything again,
//! within one sync period. Real kernel, real traffic.

use std::time::{Duration, Instant};

use crate::support::*;

const WEB: &str = "10.96.0.10:80";
const PERIOD: Duration = Duration::from_secs(3);

/// Waits until the Service answers again; how long that took.
fn served_again(lab: &kpx_netlab::node::NodeLab, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if request(lab, Proto::Tcp, WEB).server().is_some() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn lost_rules_come_back(mode: &str, damages: &[(&str, &[&str])]) {
    let Some(lab) = lab_or_skip(1, &format!("lost_rules_come_back_{mode}")) else { return };
    let (dir, manifests) = run_dirs(&format!("canary-{mode}"));
    write_web(&manifests, &[&lab.backends[0].ip]);
    let period = format!("{}s", PERIOD.as_secs());
    let args = kpx_args(&manifests, &["--proxy-mode", mode, "--iptables-sync-period", &period]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    assert_eq!(request(&lab, Proto::Tcp, WEB).server(), Some("be1"));

    // Two periods of quiet: the checks find nothing lost (no full sync
    // for nothing).
    std::thread::sleep(2 * PERIOD + Duration::from_millis(500));
    assert!(!kpx.log().contains("the kernel lost"), "{mode}: a false alarm:\n{}", kpx.log());

    for (i, (what, command)) in damages.iter().enumerate() {
        lab.node.exec(command).unwrap_or_else(|e| panic!("{mode}: {what}: {e}"));
        assert_eq!(
            request(&lab, Proto::Tcp, WEB).server(),
            None,
            "{mode}: after {what} the Service should not answer (the damage did nothing?)"
        );
        let back = served_again(&lab, PERIOD + Duration::from_secs(3));
        eprintln!("{mode}: {what}: the Service answers again after {back:?} (sync period {PERIOD:?})");
        assert!(kpx.wait_for_log("the kernel lost kube-proxy's rules", i + 1, Duration::from_secs(1)), "{}", kpx.log());
        let back = back.unwrap_or_else(|| panic!("{mode}: {what}: not restored:\n{}", kpx.log()));
        // Within one sync period, and the time of a full sync.
        assert!(back <= PERIOD + Duration::from_secs(2), "{mode}: {what}: restored after {back:?}");
    }
    let (_, metrics) = crate::servers::get(&lab.node, "127.0.0.1:10249", "/metrics").expect("metrics");
    let counted = metrics.lines().find(|l| l.starts_with("kpx_kernel_rules_lost_total")).unwrap_or_default();
    assert_eq!(counted, format!("kpx_kernel_rules_lost_total {}", damages.len()), "{metrics}");
}

#[test]
fn lost_rules_come_back_iptables() {
    lost_rules_come_back(
        "iptables",
        &[
            ("nat flushed", &["iptables", "-t", "nat", "-F"]),
            ("KUBE-SERVICES flushed", &["iptables", "-t", "nat", "-F", "KUBE-SERVICES"]),
        ],
    );
}

#[test]
fn lost_rules_come_back_nftables() {
    lost_rules_come_back(
        "nftables",
        &[
            ("the table deleted", &["nft", "delete", "table", "ip", "kube-proxy"]),
            ("the table flushed", &["nft", "flush", "table", "ip", "kube-proxy"]),
            ("chain services flushed", &["nft", "flush", "chain", "ip", "kube-proxy", "services"]),
        ],
    );
}
