//! Stale UDP conntrack entries in the real kernel (kernel/conntrack/stale.rs):
//! a long-lived UDP flow, one client socket sending from one port as a DNS
//! client does, keeps sending while the endpoint it was sent to is removed
//! from the Service. Conntrack would keep sending it to that endpoint
//! (whose server still answers, as a pod's does while it terminates) for
//! as long as datagrams keep coming; after the sync that removes it, every
//! datagram reaches the remaining endpoint.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;

/// Replies of one UDP flow: when each came and who sent it.
struct UdpFlow {
    stop: Arc<AtomicBool>,
    replies: Arc<Mutex<Vec<(Instant, String)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    port: u16,
}

impl UdpFlow {
    /// One socket in the client's namespace sending to `to` every 10 ms.
    fn start(lab: &kpx_netlab::node::NodeLab, to: &str) -> UdpFlow {
        let to: std::net::SocketAddr = to.parse().unwrap();
        let socket = lab.client.enter(move || UdpSocket::bind("0.0.0.0:0")).unwrap().unwrap();
        socket.connect(to).unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let port = socket.local_addr().unwrap().port();
        let (stop, replies) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let (s, r) = (stop.clone(), replies.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while !s.load(Ordering::Relaxed) {
                let _ = socket.send(b"hi");
                let deadline = Instant::now() + Duration::from_millis(10);
                while Instant::now() < deadline {
                    if let Ok(n) = socket.recv(&mut buf) {
                        let text = String::from_utf8_lossy(&buf[..n]);
                        let server = text.split_whitespace().next().unwrap_or_default().to_string();
                        r.lock().unwrap().push((Instant::now(), server));
                    }
                }
            }
        });
        UdpFlow { stop, replies, thread: Some(thread), port }
    }

    fn replies(&self) -> Vec<(Instant, String)> {
        self.replies.lock().unwrap().clone()
    }
}

impl Drop for UdpFlow {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn a_udp_flow_leaves_a_removed_endpoint(mode: &str) {
    let test = format!("a_udp_flow_leaves_a_removed_endpoint_{mode}");
    let Some(lab) = lab_or_skip(2, &test) else { return };
    let (dir, manifests) = run_dirs(&format!("conntrack-{mode}"));
    let ips: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    write_web(&manifests, &ips);
    let args = kpx_args(&manifests, &["--proxy-mode", mode]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());

    let flow = UdpFlow::start(&lab, "10.96.0.10:80");
    let started = Instant::now();
    while flow.replies().len() < 20 && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let replies = flow.replies();
    let Some((_, first)) = replies.first().cloned() else { panic!("{mode}: the flow got no reply:\n{}", kpx.log()) };
    assert!(replies.iter().all(|(_, s)| *s == first), "{mode}: one flow, one endpoint: {replies:?}");
    let (gone, stays) = if first == "be1" { (ips[0], ips[1]) } else { (ips[1], ips[0]) };
    let stays_name = if first == "be1" { "be2" } else { "be1" };
    eprintln!("{mode}: the flow from port {} goes to {first} ({gone}); removing it", flow.port);

    // The reconcile reads only UDP entries, the kernel filtering the dump
    // (CTA_FILTER): with TCP connections in the table too, a dump of UDP
    // holds none of them and holds the flow.
    for _ in 0..5 {
        assert!(request(&lab, Proto::Tcp, "10.96.0.10:80").server().is_some(), "{mode}: TCP through the Service");
    }
    let port = flow.port;
    let (all, udp) = lab
        .node
        .enter(|| {
            use kpx::kernel::conntrack::table::{dump, dump_protocols};
            let v4 = kpx_rules::model::IpFamily::V4;
            (dump(v4).unwrap(), dump_protocols(v4, &[17]).unwrap())
        })
        .unwrap();
    assert!(all.iter().any(|(o, _)| o.0 == 6), "{mode}: no TCP entry in the table to filter out");
    let (udp, filtered) = udp;
    assert!(filtered, "{mode}: this kernel (5.8 or later) did not filter the dump by protocol");
    assert!(udp.iter().all(|(o, _)| o.0 == 17), "{mode}: the UDP dump holds other protocols");
    assert!(udp.iter().any(|(o, _)| o.2 == port), "{mode}: the UDP dump lacks the flow from port {port}: {udp:?}");
    eprintln!("{mode}: the table holds {} entries, the UDP dump {}", all.len(), udp.len());

    // The endpoint leaves the Service; its server keeps answering.
    let synced = kpx.log().matches("synced rules family=IPv4").count();
    let removed = Instant::now();
    write_web(&manifests, &[stays]);
    assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(10)), "{}", kpx.log());
    assert!(
        kpx.wait_for_log("deleted stale conntrack entries family=IPv4", 1, Duration::from_secs(5)),
        "{mode}: no stale entry deleted:\n{}",
        kpx.log()
    );
    let cleaned = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let replies = flow.replies();
    let after: Vec<&(Instant, String)> = replies.iter().filter(|(t, _)| *t > cleaned).collect();
    let first_moved = replies.iter().find(|(t, s)| *t > removed && s == stays_name).map(|(t, _)| *t - removed);
    eprintln!(
        "{mode}: {} replies in the 500 ms after the cleanup, all from {stays_name}: {}; the first from it {:?} after the edit",
        after.len(),
        after.iter().all(|(_, s)| s == stays_name),
        first_moved
    );
    assert!(after.len() >= 20, "{mode}: the flow stopped: {} replies after the cleanup", after.len());
    assert!(
        after.iter().all(|(_, s)| s == stays_name),
        "{mode}: a datagram reached the removed endpoint after the sync: {after:?}"
    );
    // The deletion came with the sync that removed the endpoint, not a
    // later one (the sync period here is the default 30 s).
    assert!(cleaned - removed < Duration::from_secs(5), "{mode}: cleaned {:?} after the edit", cleaned - removed);
}

#[test]
fn a_udp_flow_leaves_a_removed_endpoint_iptables() {
    a_udp_flow_leaves_a_removed_endpoint("iptables");
}

#[test]
fn a_udp_flow_leaves_a_removed_endpoint_nftables() {
    a_udp_flow_leaves_a_removed_endpoint("nftables");
}
