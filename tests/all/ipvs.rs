//! IPVS through kpx's generic-netlink client, in a real kernel with real
//! traffic. This machine's kernel has no ip_vs: the test boots Debian's
//! kernel under qemu (tests/ipvs-vm/run.sh) and runs itself inside
//! (`KPX_IN_GUEST` set); on a kernel with ip_vs it runs here directly,
//! in network namespaces.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use kpx::kernel::ipvs::msg::SVC_F_PERSISTENT;
use kpx::kernel::ipvs::{Destination, Ipvs, Service, ServiceKey};
use kpx_netlab::node::NodeLab;
use kpx_netlab::{Reply, Request};

use crate::support::lab_or_skip;

const TCP: u16 = 6;

fn in_guest() -> bool {
    std::env::var_os("KPX_IN_GUEST").is_some()
}

/// Runs `test` where IPVS is: here if this kernel has it (or this is the
/// guest), else inside the qemu guest; a skip only when qemu cannot run.
fn where_ipvs_is(name: &str, test: fn()) {
    if in_guest() || Ipvs::open().is_ok() {
        return test();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ipvs-vm");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ipvs-vm/run.sh");
    let t = std::time::Instant::now();
    let out = std::process::Command::new(script)
        .arg(&work)
        .arg(&exe)
        .arg("--")
        .arg(&exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .output()
        .expect("run tests/ipvs-vm/run.sh");
    let console = String::from_utf8_lossy(&out.stdout);
    let host = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            let ran = console.contains(&format!("test {name} ...")) && console.contains("test result: ok. 1 passed");
            assert!(ran, "the guest exited 0 without running {name}:\n{console}\n{host}");
            eprintln!("{name}: passed in the qemu guest ({:.0} s with the boot)", t.elapsed().as_secs_f64());
            for line in console.lines().filter(|l| l.starts_with("ipvs:")) {
                eprintln!("  guest: {line}");
            }
        }
        Some(97) => {
            let why = host.lines().rev().find(|l| l.contains("KPX-VM-UNAVAILABLE")).unwrap_or("qemu cannot run");
            eprintln!("SKIPPED {name}: {why}");
        }
        other => panic!("{name} failed in the qemu guest (exit {other:?}):\n--- console\n{console}\n--- host\n{host}"),
    }
}

fn tcp(lab: &NodeLab, to: &str) -> String {
    let request = Request { to: to.parse().unwrap(), from: None, timeout: Duration::from_secs(5) };
    match request.tcp(&lab.client) {
        Reply::Answer { server, .. } => server,
        other => format!("{other:?}"),
    }
}

fn key(port: u16) -> ServiceKey {
    ServiceKey { address: "10.96.0.10".parse().unwrap(), protocol: TCP, port }
}

/// Runs IPVS calls inside the node's namespace (IPVS is per namespace).
fn node_ipvs<T: Send + 'static>(lab: &NodeLab, f: impl FnOnce(&mut Ipvs) -> T + Send + 'static) -> T {
    lab.node.enter(move || f(&mut Ipvs::open().expect("IPVS in the node's namespace"))).expect("enter the node")
}

fn client_checks() {
    let Some(lab) = lab_or_skip(2, "ipvs_client_in_a_real_kernel") else {
        return;
    };
    lab.node.ip(&["link", "add", "kube-ipvs0", "type", "dummy"]).expect("a dummy link");
    lab.node.ip(&["addr", "add", "10.96.0.10/32", "dev", "kube-ipvs0"]).unwrap();
    let be: Vec<IpAddr> = lab.backends.iter().map(|b| b.ip.parse().unwrap()).collect();
    let (be1, be2) = (be[0], be[1]);

    // Services and destinations written and read back as written.
    let rr = Service { key: key(80), scheduler: "rr".into(), flags: 0, timeout: 0 };
    let wrr = Service { key: key(81), scheduler: "wrr".into(), flags: 0, timeout: 0 };
    let sticky = Service { key: key(82), scheduler: "sh".into(), flags: SVC_F_PERSISTENT, timeout: 60 };
    let (s1, s2, s3) = (rr.clone(), wrr.clone(), sticky.clone());
    let (read, dests) = node_ipvs(&lab, move |ipvs| {
        ipvs.flush().unwrap();
        ipvs.set_timeouts(900, 120, 300).unwrap();
        for s in [&s1, &s2, &s3] {
            ipvs.add_service(s).unwrap();
        }
        ipvs.add_destination(&s1.key, &Destination::new(be1, 8080, 1)).unwrap();
        ipvs.add_destination(&s1.key, &Destination::new(be2, 8080, 1)).unwrap();
        ipvs.add_destination(&s2.key, &Destination::new(be1, 8080, 3)).unwrap();
        ipvs.add_destination(&s2.key, &Destination::new(be2, 8080, 1)).unwrap();
        ipvs.add_destination(&s3.key, &Destination::new(be1, 8080, 1)).unwrap();
        ipvs.add_destination(&s3.key, &Destination::new(be2, 8080, 1)).unwrap();
        let mut read = ipvs.services().unwrap();
        read.sort_by_key(|s| s.key.port);
        (read, ipvs.destinations(&s2.key).unwrap())
    });
    assert_eq!(read, vec![rr.clone(), wrr.clone(), sticky.clone()], "services read back");
    let mut weights: Vec<(IpAddr, u32)> = dests.iter().map(|d| (d.address, d.weight)).collect();
    weights.sort();
    assert_eq!(weights, vec![(be1, 3), (be2, 1)], "destinations read back");

    // rr rotates; wrr 3:1 is three of every four; sh keeps one client.
    let seen: Vec<String> = (0..6).map(|_| tcp(&lab, "10.96.0.10:80")).collect();
    eprintln!("ipvs: rr {seen:?}");
    for k in 1..6 {
        assert_ne!(seen[k], seen[k - 1], "rr through the kernel: {seen:?}");
    }
    let seen: Vec<String> = (0..8).map(|_| tcp(&lab, "10.96.0.10:81")).collect();
    eprintln!("ipvs: wrr 3:1 {seen:?}");
    assert_eq!(seen.iter().filter(|s| *s == "be1").count(), 6, "wrr 3:1: {seen:?}");
    let seen: Vec<String> = (0..4).map(|_| tcp(&lab, "10.96.0.10:82")).collect();
    eprintln!("ipvs: sh + persistence {seen:?}");
    assert!(seen.iter().all(|s| s == &seen[0] && s.starts_with("be")), "sh: {seen:?}");

    // Weight 0: no new connections; the active counts are read back.
    let k = rr.key.clone();
    let counts = node_ipvs(&lab, move |ipvs| {
        ipvs.update_destination(&k, &Destination::new(be1, 8080, 0)).unwrap();
        ipvs.destinations(&k).unwrap()
    });
    assert!(counts.iter().any(|d| d.address == be1 && d.weight == 0), "{counts:?}");
    assert!(counts.iter().map(|d| d.active + d.inactive).sum::<u32>() > 0, "connection counts: {counts:?}");
    let seen: Vec<String> = (0..4).map(|_| tcp(&lab, "10.96.0.10:80")).collect();
    assert!(seen.iter().all(|s| s == "be2"), "weight 0 still takes connections: {seen:?}");

    // Deletions; a missing service is the kernel's ESRCH, named.
    let (k, k2) = (rr.key.clone(), wrr.key.clone());
    let left = node_ipvs(&lab, move |ipvs| {
        ipvs.delete_destination(&k, &Destination::new(be2, 8080, 0)).unwrap();
        ipvs.delete_service(&k).unwrap();
        let again = ipvs.delete_service(&k).unwrap_err().to_string();
        ipvs.delete_service(&k2).unwrap();
        (ipvs.services().unwrap(), again)
    });
    assert_eq!(left.0, vec![sticky], "after deletions");
    assert!(left.1.contains("10.96.0.10:80"), "{}", left.1);
    assert!(tcp(&lab, "10.96.0.10:80") != "be2", "a deleted service still answers");
}

#[test]
fn ipvs_client_in_a_real_kernel() {
    where_ipvs_is("ipvs::ipvs_client_in_a_real_kernel", client_checks);
}
