//! IPVS through kpx's generic-netlink client, in a real kernel with real
//! traffic. This machine's kernel has no ip_vs: the test boots Debian's
//! kernel under qemu (tests/ipvs-vm/run.sh) and runs itself inside
//! (`KPX_IN_GUEST` set); on a kernel with ip_vs it runs here directly,
//! in network namespaces.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use kpx::kernel::ipvs::msg::SVC_F_PERSISTENT;
use kpx::kernel::ipvs::{Destination, Ipvs, Service, ServiceKey};
use kpx_netlab::node::NodeLab;
use kpx_netlab::{Reply, Request};
use std::os::unix::fs::DirBuilderExt;

use crate::support::{
    ClientLoop, GUEST_PLUGIN_CACHE, HoldServers, KPX, hold, in_guest, kpx_args, lab_or_skip, run_dirs, write_manifest,
};

const TCP: u16 = 6;

/// Whether IPVS is here: this is the guest, or this kernel has ip_vs.
fn ipvs_here() -> bool {
    in_guest() || Ipvs::open().is_ok()
}

/// Runs `test` where IPVS is: here if this kernel has it (or this is the
/// guest), else inside the qemu guest with `files` copied in; a skip only
/// when qemu cannot run.
pub fn where_ipvs_is(name: &str, files: &[&Path], test: fn()) {
    where_ipvs_is_sending_back(name, files, None, test)
}

/// [`where_ipvs_is`], and the guest's newly compiled plugins in
/// `send_back` (one of `files`) are kept on the host for the next boot.
fn where_ipvs_is_sending_back(name: &str, files: &[&Path], send_back: Option<&Path>, test: fn()) {
    if ipvs_here() {
        return test();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ipvs-vm");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/ipvs-vm/run.sh");
    let t = Instant::now();
    let mut command = std::process::Command::new(script);
    if let Some(dir) = send_back {
        command.env("KPX_VM_SEND_BACK", dir);
    }
    let out = command
        .arg(&work)
        .arg(&exe)
        .args(files)
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
            // The guest's figures: its lines that say "ipvs: ", and the
            // churn test's.
            for line in console.lines() {
                // (The first line of a test's output follows its name.)
                if let Some(at) = line.find("churn ipvs:").or_else(|| line.find("ipvs: ")) {
                    eprintln!("  guest: {}", &line[at..]);
                }
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
    ServiceKey::new("10.96.0.10".parse().unwrap(), TCP, port)
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
    let after = tcp(&lab, "10.96.0.10:80");
    assert!(!after.starts_with("be"), "a deleted service still answers: {after}");
}

#[test]
fn ipvs_client_in_a_real_kernel() {
    where_ipvs_is("ipvs::ipvs_client_in_a_real_kernel", &[], client_checks);
}

fn ipvs_in(lab: &NodeLab) -> Vec<(Service, Vec<Destination>)> {
    node_ipvs(lab, |ipvs| {
        let mut out = Vec::new();
        for s in ipvs.services().unwrap() {
            let d = ipvs.destinations(&s.key).unwrap();
            out.push((s, d));
        }
        out.sort_by_key(|(s, _)| (s.key.address, s.key.port));
        out
    })
}

fn manifest(name: &str, ip: &str, extra_spec: &str, svc_ann: &str, eps: &[&str], slice_ann: &str) -> String {
    let mut text = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: test\n{svc_ann}spec:\n  clusterIP: {ip}\n{extra_spec}  ports:\n  - {{name: tcp, port: 80, targetPort: 8080, protocol: TCP, nodePort: 30080}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-1\n  namespace: test\n  labels: {{kubernetes.io/service-name: {name}}}\n{slice_ann}addressType: IPv4\nports:\n- {{name: tcp, port: 8080, protocol: TCP}}\nendpoints:\n"
    );
    for ep in eps {
        text.push_str(&format!("- addresses: [{ep}]\n  conditions: {{ready: true}}\n"));
    }
    text
}

fn mode_checks() {
    let Some(lab) = lab_or_skip(2, "kpx_ipvs_mode_in_a_real_kernel") else {
        return;
    };
    let (dir, manifests) = run_dirs("ipvs-mode");
    let be: Vec<String> = lab.backends.iter().map(|b| b.ip.clone()).collect();
    let (be1, be2) = (be[0].as_str(), be[1].as_str());
    // be1 runs on this node: its hairpin through the Service is masqueraded.
    let local_be1 = |text: String| {
        text.replace(
            &format!("- addresses: [{be1}]\n  conditions: {{ready: true}}\n"),
            &format!("- addresses: [{be1}]\n  conditions: {{ready: true}}\n  nodeName: node\n"),
        )
    };
    write_manifest(
        &manifests.join("web.yaml"),
        &local_be1(manifest("web", "10.96.0.10", "  type: NodePort\n", "", &[be1, be2], "")),
    );
    // A LoadBalancer open to the client's address only.
    let lb_spec = "  type: LoadBalancer\n  loadBalancerSourceRanges: [192.168.100.2/32]\n";
    write_manifest(
        &manifests.join("lb.yaml"),
        &manifest("lb", "10.96.0.14", lb_spec, "", &[be1, be2], "")
            .replace("nodePort: 30080", "nodePort: 30084")
            .replace("---\n", "status:\n  loadBalancer: {ingress: [{ip: 10.100.0.1}]}\n---\n"),
    );
    let weights = format!("  annotations: {{kpx.dev/weights: \"{be1}=3,{be2}=1\"}}\n");
    let wrr = "  annotations: {kpx.dev/scheduler: wrr}\n";
    write_manifest(
        &manifests.join("wrr.yaml"),
        &manifest("wrr", "10.96.0.11", "", wrr, &[be1, be2], &weights).replace("nodePort: 30080", "nodePort: 30081"),
    );
    let _hold = HoldServers::start(&lab);
    write_manifest(
        &manifests.join("hold.yaml"),
        &manifest("hold", "10.96.0.13", "", "", &[be1, be2], "")
            .replace("nodePort: 30080", "nodePort: 30083")
            .replace("8080", "9090"),
    );
    // An external IP that is the node's own address: served, but never put
    // on kube-ipvs0 (KUBE-IPVS-FILTER would close the node's other ports).
    let ext_spec = format!("  externalIPs: [{}]\n", kpx_netlab::node::NODE_IP);
    write_manifest(
        &manifests.join("ext.yaml"),
        &manifest("ext", "10.96.0.16", &ext_spec, "", &[be1], "").replace("nodePort: 30080", "nodePort: 30086"),
    );
    // A slot plan: its firewall marks survive a restart (below).
    write_manifest(
        &manifests.join("maglev.yaml"),
        &manifest("maglev", "10.96.0.17", "", "  annotations: {kpx.dev/scheduler: maglev}\n", &[be1, be2], "")
            .replace("nodePort: 30080", "nodePort: 30087"),
    );
    // UDP: a leaving real server goes at once, flows or not.
    let udp = |eps: &[&str]| {
        manifest("udp", "10.96.0.15", "", "", eps, "")
            .replace("nodePort: 30080", "nodePort: 30085")
            .replace("protocol: TCP", "protocol: UDP")
    };
    write_manifest(&manifests.join("udp.yaml"), &udp(&[be1, be2]));
    let sticky = "  sessionAffinity: ClientIP\n";
    write_manifest(
        &manifests.join("sticky.yaml"),
        &manifest("sticky", "10.96.0.12", sticky, "", &[be1, be2], "").replace("nodePort: 30080", "nodePort: 30082"),
    );
    // Other software's virtual servers: one in --ipvs-exclude-cidrs, a
    // firewall-mark one as keepalived writes it (mark 1), one in kpx's mark
    // range but not of kpx's shape. No sync and no --cleanup touches them.
    let foreign_service =
        |key: ServiceKey, scheduler: &str| Service { key, scheduler: scheduler.into(), flags: 0, timeout: 0 };
    let any = "0.0.0.0".parse().unwrap();
    let foreign = vec![
        foreign_service(ServiceKey::new("172.30.0.1".parse().unwrap(), TCP, 443), "rr"),
        foreign_service(ServiceKey::fwmark(&any, 1), "rr"),
        foreign_service(ServiceKey::fwmark(&any, 0x3f00), "wlc"),
    ];
    let f = foreign.clone();
    node_ipvs(&lab, move |ipvs| f.iter().for_each(|s| ipvs.add_service(s).unwrap()));
    let foreign_keys: std::collections::BTreeSet<ServiceKey> = foreign.iter().map(|s| s.key.clone()).collect();
    let args = kpx_args(
        &manifests,
        &["--proxy-mode", "ipvs", "--ipvs-exclude-cidrs=172.30.0.0/16", "--vmodule=sync=4,kernel::ipvs=4"],
    );
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(240)), "no sync:\n{}", kpx.log());
    for line in kpx.log().lines().filter(|l| l.contains("ERROR") || l.contains("WARN")) {
        eprintln!("ipvs: kpx said: {line}");
    }
    let table = ipvs_in(&lab);
    for (s, d) in &table {
        eprintln!(
            "ipvs: {} {}:{} {} -> {:?}",
            s.scheduler,
            s.key.address,
            s.key.port,
            s.flags,
            d.iter().map(|d| (d.address, d.weight)).collect::<Vec<_>>()
        );
    }
    let find = |ip: &str, port: u16| {
        table.iter().find(|(s, _)| s.key.address.to_string() == ip && s.key.port == port).cloned()
    };
    let (web, web_dests) = find("10.96.0.10", 80).expect("the cluster IP's virtual server");
    assert_eq!((web.scheduler.as_str(), web_dests.len()), ("rr", 2));
    let node_ip = kpx_netlab::node::NODE_IP;
    assert!(find(node_ip, 30080).is_some(), "the node port's virtual server on the node's address");
    let (wrr_vs, wrr_dests) = find("10.96.0.11", 80).expect("wrr");
    assert_eq!(wrr_vs.scheduler, "wrr");
    let mut weights: Vec<u32> = wrr_dests.iter().map(|d| d.weight).collect();
    weights.sort();
    assert_eq!(weights, vec![1, 3], "kpx.dev/weights in IPVS");
    let (sticky_vs, _) = find("10.96.0.12", 80).expect("sticky");
    assert_eq!((sticky_vs.flags & kpx::kernel::ipvs::msg::SVC_F_PERSISTENT, sticky_vs.timeout), (1, 10800));

    // Real traffic: rr alternates, the node port answers, wrr 3:1, affinity sticks.
    let seen: Vec<String> = (0..4).map(|_| tcp(&lab, "10.96.0.10:80")).collect();
    eprintln!("ipvs: kpx rr {seen:?}");
    assert!(seen.windows(2).all(|w| w[0] != w[1] && w[0].starts_with("be")), "rr: {seen:?}");
    let np = tcp(&lab, &format!("{node_ip}:30080"));
    assert!(np.starts_with("be"), "node port: {np}");
    let seen: Vec<String> = (0..8).map(|_| tcp(&lab, "10.96.0.11:80")).collect();
    assert_eq!(seen.iter().filter(|s| *s == "be1").count(), 6, "wrr 3:1: {seen:?}");
    let seen: Vec<String> = (0..4).map(|_| tcp(&lab, "10.96.0.12:80")).collect();
    assert!(seen.iter().all(|s| s == &seen[0]), "ClientIP affinity: {seen:?}");
    helper_rules_checks(&lab);

    // An endpoint leaves while a connection to it is open: drained at
    // weight 0, not cut; a Service leaves: its virtual servers and its
    // address go.
    let (held_by, held) = hold(&lab, "10.96.0.13:80");
    let other = if held_by == "be1" { be2 } else { be1 };
    let synced = kpx.log().matches("synced rules family=IPv4").count();
    write_manifest(&manifests.join("web.yaml"), &manifest("web", "10.96.0.10", "  type: NodePort\n", "", &[be1], ""));
    write_manifest(
        &manifests.join("hold.yaml"),
        &manifest("hold", "10.96.0.13", "", "", &[other], "")
            .replace("nodePort: 30080", "nodePort: 30083")
            .replace("8080", "9090"),
    );
    std::fs::remove_file(manifests.join("sticky.yaml")).unwrap();
    // Flows to both UDP endpoints first: IPVS keeps an entry for each.
    for _ in 0..4 {
        let _ = kpx_netlab::udp_request(&lab.client, "10.96.0.15:80", Duration::from_secs(2));
    }
    write_manifest(&manifests.join("udp.yaml"), &udp(&[be1]));
    assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(60)), "{}", kpx.log());
    // A sync may have started before the last file was written, and one
    // change may come a sync after another (the source's events can reach
    // two syncs); within a sync IPVS is written Service by Service, so a
    // read can land between two of them: wait until the table shows all
    // four changes, well within the source's 60 s full re-read (so a
    // lost inotify note is not covered up by it).
    let gone_ip = lab.backends.iter().find(|b| b.name == held_by).unwrap().ip.clone();
    let t = Instant::now();
    let table = loop {
        let table = ipvs_in(&lab);
        let udp_done = table.iter().any(|(s, d)| s.key.address.to_string() == "10.96.0.15" && d.len() == 1);
        let applied = udp_done
            && !table.iter().any(|(s, _)| s.key.address.to_string() == "10.96.0.12")
            && table.iter().any(|(s, d)| {
                s.key.address.to_string() == "10.96.0.13"
                    && d.iter().any(|d| d.address.to_string() == gone_ip && d.weight == 0)
            })
            && table.iter().any(|(s, d)| {
                s.key.address.to_string() == "10.96.0.10"
                    && d.iter().all(|d| d.address.to_string() == be1 || d.weight == 0)
            });
        assert!(
            applied || t.elapsed() < Duration::from_secs(30),
            "the four changes did not all reach IPVS within 30 s: {table:?}\n{}",
            kpx.log()
        );
        if applied {
            break table;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_millis(500));
    let find = |ip: &str, port: u16| {
        table.iter().find(|(s, _)| s.key.address.to_string() == ip && s.key.port == port).cloned()
    };
    let (_, udp_dests) = find("10.96.0.15", 80).unwrap();
    let udp_left: Vec<String> = udp_dests.iter().map(|d| d.address.to_string()).collect();
    eprintln!("ipvs: UDP real servers after be2 left: {udp_left:?}");
    assert_eq!(udp_left, [be1], "a UDP real server goes at once, not drained");
    let (_, hold_dests) = find("10.96.0.13", 80).unwrap();
    let gone = lab.backends.iter().find(|b| b.name == held_by).unwrap().ip.clone();
    let draining = hold_dests.iter().find(|d| d.address.to_string() == gone);
    eprintln!(
        "ipvs: hold after {held_by} left: {:?}",
        hold_dests.iter().map(|d| (d.address, d.weight, d.active)).collect::<Vec<_>>()
    );
    assert!(
        draining.is_some_and(|d| d.weight == 0 && d.active >= 1),
        "the endpoint with an open connection must stay at weight 0 until it closes: {hold_dests:?}"
    );
    let fresh: Vec<String> = (0..3).map(|_| hold(&lab, "10.96.0.13:80").0).collect();
    assert!(fresh.iter().all(|f| *f != held_by), "a draining endpoint took new connections: {fresh:?}");
    drop(held);
    // be2 served connections that IPVS still tracks (TIME_WAIT): it is
    // drained at weight 0, not cut, and goes once they are gone.
    let (_, web_dests) = find("10.96.0.10", 80).unwrap();
    let weights: Vec<(String, u32, u32)> =
        web_dests.iter().map(|d| (d.address.to_string(), d.weight, d.active + d.inactive)).collect();
    eprintln!("ipvs: after be2 left web: {weights:?}");
    assert!(weights.iter().any(|(a, w, _)| a == be1 && *w == 1), "{weights:?}");
    assert!(
        weights.iter().all(|(a, w, conns)| a == be1 || (*w == 0 && *conns > 0)),
        "a leaving endpoint must be drained at weight 0 while it has connections, else removed: {weights:?}\n{}",
        kpx.log()
    );
    assert!(find("10.96.0.12", 80).is_none(), "the deleted Service's virtual server stayed");
    let addrs = lab.node.ip(&["-4", "addr", "show", "dev", "kube-ipvs0"]).unwrap();
    assert!(addrs.contains("10.96.0.10") && !addrs.contains("10.96.0.12"), "kube-ipvs0: {addrs}");
    let seen: Vec<String> = (0..3).map(|_| tcp(&lab, "10.96.0.10:80")).collect();
    assert!(seen.iter().all(|s| s == "be1"), "after be2 left: {seen:?}");
    assert!(!kpx.log().contains("sync failed"), "{}", kpx.log());
    let table_keys = |lab: &NodeLab| -> std::collections::BTreeSet<ServiceKey> {
        ipvs_in(lab).into_iter().map(|(s, _)| s.key).collect()
    };
    let before = table_keys(&lab);
    assert!(before.is_superset(&foreign_keys), "other software's services went: {before:?}");
    // kpx killed (SIGKILL) with a client opening connections all along:
    // the virtual servers it left serve while it is down and resyncs. The
    // client gives a connect 3 s, not 1 s: in this emulated guest the
    // restarted kpx's first full write takes about 17 s (1.15 MB), and
    // 1-2 of ~3,800 connects timed out at 1 s during it, which a resent
    // SYN would have saved (docs/RELIABILITY.md, "kpx killed and
    // restarted"); such are counted and printed as slow, and none may fail.
    let client = ClientLoop::start_with(&lab, "10.96.0.10:80", Duration::from_secs(3));
    std::thread::sleep(Duration::from_millis(500));
    drop(kpx);
    let killed = Instant::now();
    std::thread::sleep(Duration::from_millis(500));

    // A restart converges from what the kernel holds: the same table (the
    // slot plan's firewall marks kept), no failed sync, traffic served.
    assert!(before.iter().any(|k| k.fwmark != 0 && !foreign_keys.contains(k)), "no slot plan's marks: {before:?}");
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx-again.log")).expect("start kpx again");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(240)), "no sync:\n{}", kpx.log());
    std::thread::sleep(Duration::from_millis(500));
    let after = table_keys(&lab);
    let kpxs = |keys: &std::collections::BTreeSet<ServiceKey>| -> Vec<ServiceKey> {
        keys.iter().filter(|k| !foreign_keys.contains(*k)).cloned().collect()
    };
    assert_eq!(kpxs(&after), kpxs(&before), "the table after a restart");
    assert!(after.is_superset(&foreign_keys), "other software's services went at the restart: {after:?}");
    let seen: Vec<String> = (0..3).map(|_| tcp(&lab, "10.96.0.10:80")).collect();
    assert!(seen.iter().all(|s| s == "be1"), "after the restart: {seen:?}");
    assert!(!kpx.log().contains("sync failed"), "{}", kpx.log());
    std::thread::sleep(Duration::from_millis(500));
    let outcomes = client.outcomes();
    let failures = client.failures();
    let slow = client.slow();
    drop(client);
    let failed = outcomes.iter().filter(|o| o.2.is_none()).count();
    let to_be1 = outcomes.iter().filter(|o| o.2.as_deref() == Some("be1")).count();
    eprintln!(
        "ipvs: {} connections through the kill and restart, {failed} failed, {} slow (over 1 s), {to_be1} to be1",
        outcomes.len(),
        slow.len()
    );
    for (at, why) in &failures {
        eprintln!("ipvs: a connection failed {:?} after the kill: {why}", at.saturating_duration_since(killed));
    }
    for (at, how) in &slow {
        eprintln!("ipvs: a connection was slow {:?} after the kill: {how}", at.saturating_duration_since(killed));
    }
    assert_eq!(failed, 0, "{failed} connections failed through the restart:\n{}", kpx.log());
    assert_eq!(to_be1 + failed, outcomes.len(), "a connection went elsewhere than be1");
    assert!(outcomes.len() > 20, "the client loop hardly ran: {}", outcomes.len());
    drop(kpx);

    // --cleanup: kpx's virtual servers and kube-ipvs0 go; other software's
    // (the excluded range, the firewall marks that are not kpx's) stay.
    let cleanup = kpx_args(&manifests, &["--cleanup", "--ipvs-exclude-cidrs=172.30.0.0/16"]);
    let mut done = lab.start_kpx(KPX.as_ref(), &cleanup, &dir.join("cleanup.log")).expect("kpx --cleanup");
    let t = Instant::now();
    while done.is_running() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(table_keys(&lab), foreign_keys, "after --cleanup:\n{}", done.log());
    assert!(lab.node.ip(&["link", "show", "kube-ipvs0"]).is_err(), "kube-ipvs0 survived --cleanup");
    let sets = lab.node.exec(&["ipset", "list", "-n"]).unwrap();
    assert!(!sets.contains("KUBE-") && !sets.contains("KPX-"), "ipsets survived --cleanup: {sets}");
    let rules = lab.node.exec(&["iptables-save"]).unwrap();
    assert!(!rules.contains("KUBE-") && !rules.contains("KPX-"), "iptables rules survived --cleanup:\n{rules}");
    eprintln!("ipvs: kpx in ipvs mode passed");
}

fn request(lab: &NodeLab, from: Option<&str>, to: &str) -> Reply {
    let from = from.map(|f| f.parse().unwrap());
    Request { to: to.parse().unwrap(), from, timeout: Duration::from_secs(3) }.tcp(&lab.client)
}

/// upstream's ipsets and helper iptables rules, with real traffic:
/// masquerading of off-cluster clients, hairpin, the LoadBalancer source
/// ranges, and kube-ipvs0's addresses closed but on Service ports.
fn helper_rules_checks(lab: &NodeLab) {
    let list = |set: &str| lab.node.exec(&["ipset", "list", set]).unwrap_or_else(|e| format!("{e}"));
    for (set, entry) in [
        ("KUBE-CLUSTER-IP", "10.96.0.10,tcp:80"),
        ("KUBE-LOOP-BACK", "10.244.1.5,tcp:8080,10.244.1.5"),
        ("KUBE-NODE-PORT-TCP", "30080"),
        ("KUBE-LOAD-BALANCER-FW", "10.100.0.1,tcp:80"),
        ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "10.100.0.1,tcp:80,192.168.100.2"),
        ("KUBE-IPVS-IPS", "10.100.0.1"),
    ] {
        let text = list(set);
        assert!(
            text.lines().any(|l| l.trim() == entry || l.trim().starts_with(&format!("{entry} "))),
            "{set}:\n{text}"
        );
    }
    let rules = lab.node.exec(&["iptables-save"]).unwrap();
    eprintln!("ipvs: {} iptables rules in ipvs mode", rules.lines().filter(|l| l.starts_with("-A")).count());

    // An off-cluster client is masqueraded (the backend sees the node).
    match request(lab, None, "10.96.0.10:80") {
        Reply::Answer { seen_from, .. } => {
            eprintln!("ipvs: client via the cluster IP seen from {seen_from}");
            assert!(seen_from.starts_with("10.244."), "not masqueraded: seen from {seen_from}");
        }
        other => panic!("cluster IP: {other:?}"),
    }
    // Hairpin: be1 reaching itself through the Service is masqueraded.
    let be1 = &lab.backends[0];
    let hairpin: Vec<Reply> = (0..4)
        .map(|_| {
            let r = Request { to: "10.96.0.10:80".parse().unwrap(), from: None, timeout: Duration::from_secs(3) };
            r.tcp(&be1.ns)
        })
        .collect();
    eprintln!("ipvs: hairpin {hairpin:?}");
    assert!(hairpin.iter().all(|r| r.server().is_some()), "hairpin: {hairpin:?}");
    for r in &hairpin {
        if let Reply::Answer { server, seen_from } = r
            && server == "be1"
        {
            assert_eq!(seen_from, "10.244.1.1", "be1 to itself must come from the node");
        }
    }
    // Source ranges: the client's address passes, another is dropped.
    lab.client.ip(&["addr", "add", "192.168.100.3/24", "dev", "eth0"]).unwrap();
    let allowed = request(lab, None, "10.100.0.1:80");
    let other = request(lab, Some("192.168.100.3"), "10.100.0.1:80");
    let other_cluster_ip = request(lab, Some("192.168.100.3"), "10.96.0.14:80");
    eprintln!("ipvs: LB from the range {allowed:?}, from outside {other:?}, its cluster IP {other_cluster_ip:?}");
    assert!(allowed.server().is_some(), "the allowed source: {allowed:?}");
    assert_eq!(other, Reply::Timeout, "a source outside loadBalancerSourceRanges must be dropped");
    assert!(other_cluster_ip.server().is_some(), "the ranges apply to the LB address only: {other_cluster_ip:?}");
    // The node itself may not reach the LB address (its address is in no
    // source range): KUBE-IPVS-OUT-FILTER drops it at OUTPUT.
    let from_node =
        Request { to: "10.100.0.1:80".parse().unwrap(), from: None, timeout: Duration::from_secs(3) }.tcp(&lab.node);
    eprintln!("ipvs: the node to the firewalled LB {from_node:?}");
    assert_eq!(from_node, Reply::Timeout, "the node must not pass the LB's source ranges");
    // What kpx wrote reads back: every line of its chains is a rule kpx writes.
    let d = kpx::syntax::iptables::Dialect { family: kpx_rules::model::IpFamily::V4, masquerade_mark: 0x4000 };
    let dump = kpx::kernel::iptables::parse::parse_dump(&rules, d);
    for table in dump.tables.values() {
        for (chain, lines) in &table.rules {
            for line in lines {
                if let kpx::kernel::iptables::parse::Line::Foreign { text, reason } = line {
                    assert!(!chain.starts_with("KUBE-"), "{chain}: {text}: {reason}");
                }
            }
        }
    }
    assert!(rules.contains("-A KUBE-IPVS-OUT-FILTER -s 10.100.0.1/32 -m ipvs"), "{rules}");
    // kube-ipvs0's addresses: a node listener answers on the node's
    // address, not on a Service address.
    let _node_server = kpx_netlab::EchoServer::start(&lab.node, "node", "0.0.0.0:9999").unwrap();
    let direct = request(lab, None, &format!("{}:9999", kpx_netlab::node::NODE_IP));
    let through_vip = request(lab, None, "10.96.0.10:9999");
    eprintln!("ipvs: node listener direct {direct:?}, through a Service address {through_vip:?}");
    assert_eq!(direct.server(), Some("node"), "the node's own port, with its address an external IP: {direct:?}");
    let bound = lab.node.ip(&["-4", "addr", "show", "dev", "kube-ipvs0"]).unwrap();
    assert!(!bound.contains(kpx_netlab::node::NODE_IP), "the node's own address on kube-ipvs0: {bound}");
    let ext = request(lab, None, &format!("{}:80", kpx_netlab::node::NODE_IP));
    assert_eq!(ext.server(), Some("be1"), "the external IP that is the node's: {ext:?}");
    assert_eq!(through_vip, Reply::Refused, "KUBE-IPVS-FILTER must reject other ports on Service addresses");
}

/// [`where_ipvs_is`] for a test that runs kpx: the guest gets kpx, the
/// plugins compiled in earlier guests, and `extra` files.
pub fn kpx_where_ipvs_is(name: &str, extra: &[std::path::PathBuf], test: fn()) {
    if ipvs_here() {
        return test();
    }
    // `plugin_cache()` in the guest: created here on first use (0700,
    // as kpx would), then filled from what the guests send back.
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join(GUEST_PLUGIN_CACHE);
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&cache).expect("the guest's plugin cache");
    // Each build of a plugin adds a file; one compiled over a week ago
    // goes (copied into every boot, the directory would only grow), and a
    // guest that still needs it compiles it again.
    let week_ago = std::time::SystemTime::now() - Duration::from_secs(7 * 24 * 3600);
    for entry in std::fs::read_dir(&cache).expect("the guest's plugin cache").flatten() {
        if entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < week_ago) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let mut files = vec![std::path::PathBuf::from(KPX), cache.clone()];
    files.extend(extra.iter().cloned());
    let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    where_ipvs_is_sending_back(name, &refs, Some(&cache), test);
}

#[test]
fn kpx_ipvs_mode_in_a_real_kernel() {
    kpx_where_ipvs_is("ipvs::kpx_ipvs_mode_in_a_real_kernel", &[], mode_checks);
}

/// Where the kernel has no ip_vs, ipvs mode says so and exits non-zero
/// (upstream falls back to iptables; kpx does not change mode silently).
#[test]
fn ipvs_mode_without_ip_vs_exits_with_the_reason() {
    if Ipvs::open().is_ok() || in_guest() {
        return eprintln!("this kernel has ip_vs: nothing to refuse");
    }
    let Some(lab) = lab_or_skip(1, "ipvs_mode_without_ip_vs_exits_with_the_reason") else {
        return;
    };
    let (dir, manifests) = run_dirs("ipvs-missing");
    let args = kpx_args(&manifests, &["--proxy-mode", "ipvs"]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    let t = Instant::now();
    while kpx.is_running() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!kpx.is_running(), "kpx kept running without ip_vs:\n{}", kpx.log());
    assert!(kpx.log().contains("ipvs mode needs the kernel's IPVS"), "{}", kpx.log());
}

/// The hostile backend in ipvs mode, through the real component and the
/// contract: what it asks for beyond the state is refused by the host's
/// check before any kernel write (the check runs first in every sync).
#[test]
fn hostile_virtual_servers_are_refused() {
    use kpx::kernel::ipvs::dataplane::{IpvsDataplane, Timeouts};
    use kpx::validate::Scope;
    use kpx_rules::model::{Cluster, Endpoint, IpFamily, Node, Protocol, ProxyMode, ServicePort, Settings};
    use kpx_rules::ops::Ruleset;

    let bytes = std::fs::read(format!("{}/kpx_plugin_hostile.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
    let runtime = kpx::runtime::Runtime::new(kpx::runtime::Limits::default(), None).unwrap();
    let plugin = runtime.load_backend("hostile", &bytes).unwrap();
    for (name, reason) in [
        ("hostile-ipvs-address", "neither a Service destination"),
        ("hostile-ipvs-real", "no endpoint of the state"),
        ("hostile-ipvs-scheduler", "IPVS has no scheduler"),
        ("hostile-ipvs-slots", "slot table"),
    ] {
        let settings = Settings::new(IpFamily::V4, ProxyMode::Ipvs);
        let mut svc = ServicePort::new("test", name, "", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![Endpoint::ready("10.244.1.5".parse().unwrap(), 8080)]);
        svc.cluster_ip = Some("10.96.0.10".parse().unwrap());
        let mut scope = Scope::default();
        scope.count(IpFamily::V4, &svc, true);
        let mut instance = plugin.instantiate(&settings).unwrap();
        instance.reset(&Node::default(), &Cluster::default(), &[svc]).unwrap();
        let Ruleset::Ipvs(r) = instance.render(true, 2).unwrap() else { panic!("{name}: not an ipvs ruleset") };
        let iptables =
            kpx::kernel::iptables::IptablesKernel::new(IpFamily::V4, Box::new(kpx::kernel::SystemExec::default()));
        let d = IpvsDataplane::new(IpFamily::V4, iptables, Vec::new(), Timeouts::default());
        let refusal = d.check("hostile", &settings, &r, &scope).expect_err(name);
        assert!(refusal.reason.contains(reason), "{name}: {}", refusal.reason);
    }
}

/// ipvs mode's ipsets and iptables rules in this kernel (no ip_vs needed):
/// the restore script builds upstream's sets and swaps out entries nobody
/// wants (a foreign one, a leftover), the rules that test them read back
/// from iptables-save as the typed rules written, and --cleanup's script
/// removes both.
#[test]
fn ipvs_sets_and_rules_round_trip_in_the_kernel() {
    use std::collections::BTreeSet;

    use kpx::kernel::iptables::IptablesKernel;
    use kpx::kernel::iptables::parse::{Line, parse_dump};
    use kpx::kernel::iptables::render::payload;
    use kpx::kernel::ipvs::sets::{Kind, NodeFacts, Sets, destroy_script};
    use kpx::kernel::{Exec, SystemExec};
    use kpx::syntax::iptables::Dialect;
    use kpx_rules::model::{Endpoint, IpFamily, LocalTraffic, Protocol, ProxyMode, ServicePort, Settings};
    use kpx_rules::ops::iptables::{Rule, Table};

    if kpx_netlab::run("ipset", &["version"]).is_err() {
        return eprintln!("SKIPPED ipvs_sets_and_rules_round_trip_in_the_kernel: no ipset tool");
    }
    let Ok(mut lab) = kpx_netlab::Lab::new() else {
        return eprintln!("SKIPPED ipvs_sets_and_rules_round_trip_in_the_kernel: no network namespaces");
    };
    let ns = lab.add("sets").unwrap();
    let mut svc = ServicePort::new("test", "web", "", Protocol::Tcp, 80)
        .with_cluster_endpoints(vec![Endpoint::ready("10.244.1.5".parse().unwrap(), 8080)]);
    svc.cluster_ip = Some("10.96.0.10".parse().unwrap());
    svc.node_port = 30080;
    svc.external_ips = vec!["192.0.2.7".parse().unwrap()];
    svc.load_balancer_ips = vec!["198.51.100.1".parse().unwrap()];
    svc.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
    svc.endpoints[0].conditions.is_local = true;
    let bound: BTreeSet<std::net::IpAddr> = ["10.96.0.10".parse().unwrap()].into();
    // A node address inside the source range: no KUBE-IPVS-OUT-FILTER rule
    // (its ipvs match needs ip_vs, which this kernel lacks).
    let node_addresses = ["203.0.113.5".parse().unwrap()];
    let sets = Sets::desired(IpFamily::V4, [&svc], &NodeFacts { node_addresses: &node_addresses, bound: &bound });
    let mut settings = Settings::new(IpFamily::V4, ProxyMode::Ipvs);
    settings.local_traffic = LocalTraffic::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]);
    let frame = kpx::kernel::ipvs::iptables::frame(&settings, &sets, Vec::new());
    let d = Dialect { family: IpFamily::V4, masquerade_mark: settings.masquerade_mark() };
    let script = sets.restore_script();
    let (text, _) = payload(&frame, &Default::default(), &[], d, None);
    let jumps = frame.jumps.clone();
    let (saved, dump_text, after_cleanup) = ns
        .enter(move || {
            let exec = SystemExec::default();
            exec.run("ipset", &["restore"], Some(script.as_bytes())).expect("ipset restore");
            // Someone else's entry: the next sync drops it.
            exec.run("ipset", &["add", "KUBE-CLUSTER-IP", "10.96.9.9,udp:53"], None).unwrap();
            exec.run("ipset", &["restore"], Some(script.as_bytes())).expect("ipset restore again");
            let saved = exec.run("ipset", &["save"], None).unwrap();
            let kernel = IptablesKernel::new(IpFamily::V4, Box::new(SystemExec::default()));
            kernel.apply(&text).expect("iptables-restore of the ipvs rules");
            kernel.ensure_jumps(&jumps, d).expect("the jumps");
            let dump_text = kernel.save().unwrap();
            kernel.cleanup().expect("iptables cleanup");
            let names = exec.run("ipset", &["list", "-n"], None).unwrap();
            exec.run("ipset", &["restore"], Some(destroy_script(&names).as_bytes())).unwrap();
            let after = (exec.run("ipset", &["list", "-n"], None).unwrap(), kernel.save().unwrap());
            (saved, dump_text, after)
        })
        .unwrap();
    let adds: BTreeSet<&str> = saved.lines().filter(|l| l.starts_with("add ")).collect();
    let want: BTreeSet<&str> = [
        "add KUBE-LOOP-BACK 10.244.1.5,tcp:8080,10.244.1.5",
        "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80",
        "add KUBE-EXTERNAL-IP 192.0.2.7,tcp:80",
        "add KUBE-LOAD-BALANCER 198.51.100.1,tcp:80",
        "add KUBE-LOAD-BALANCER-FW 198.51.100.1,tcp:80",
        "add KUBE-LOAD-BALANCER-SOURCE-CIDR 198.51.100.1,tcp:80,203.0.113.0/24",
        "add KUBE-LOAD-BALANCER-SOURCE-IP 198.51.100.1,tcp:80,198.51.100.1",
        "add KUBE-NODE-PORT-TCP 30080",
        "add KUBE-IPVS-IPS 10.96.0.10",
    ]
    .into();
    assert_eq!(adds, want, "ipset save:\n{saved}");
    let created = saved.lines().filter(|l| l.starts_with("create ")).count();
    assert_eq!(created, Kind::ALL.len(), "every set and no scratch set left:\n{saved}");

    // Read back: every rule of the frame, typed, no foreign line.
    let dump = parse_dump(&dump_text, d);
    let mut back: Vec<String> = Vec::new();
    for table in Table::ALL {
        for (chain, lines) in &dump.tables[&table].rules {
            for l in lines {
                match l {
                    Line::Rule(r) if r.chain.starts_with("KUBE-") => back.push(format!("{:?}", r.clone().canonical())),
                    Line::Rule(r) => assert!(frame.jumps.iter().any(|j| j.chain == r.chain), "{chain}: {r:?}"),
                    Line::Foreign { text, reason } => panic!("{text}: {reason}"),
                }
            }
        }
    }
    let mut want: Vec<String> = frame.rules.iter().map(|r| format!("{:?}", Rule::canonical(r.clone()))).collect();
    back.sort();
    want.sort();
    assert_eq!(back, want, "iptables-save:\n{dump_text}");
    let (sets_left, rules_left) = after_cleanup;
    assert!(sets_left.trim().is_empty(), "sets after cleanup: {sets_left}");
    assert!(!rules_left.contains("KUBE-"), "rules after cleanup:\n{rules_left}");
}

/// Someone clears IPVS (`ipvsadm -C`), flushes a chain or deletes
/// kube-ipvs0 under kpx in ipvs mode: its periodic check finds it
/// (`IpvsDataplane::lost`) and a full sync puts it back, or a partial
/// sync finds it gone and writes it again (`take_repaired`); either way
/// kpx says so and counts it once, within about a sync period (plus the
/// guest's slow syncs).
fn lost_objects_checks() {
    let Some(lab) = lab_or_skip(1, "ipvs_mode_restores_lost_objects_and_keeps_up_with_churn (lost objects)") else {
        return;
    };
    const PERIOD: Duration = Duration::from_secs(3);
    let (dir, manifests) = run_dirs("ipvs-lost");
    let web = "10.96.0.10:80";
    let be1 = lab.backends[0].ip.clone();
    write_manifest(&manifests.join("web.yaml"), &manifest("web", "10.96.0.10", "", "", &[&be1], ""));
    let args = kpx_args(&manifests, &["--proxy-mode", "ipvs", "--ipvs-sync-period", "3s"]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(240)), "no sync:\n{}", kpx.log());
    assert_eq!(tcp(&lab, web), "be1", "{}", kpx.log());
    // Two quiet periods: nothing reported lost.
    std::thread::sleep(2 * PERIOD + Duration::from_millis(500));
    assert!(!kpx.log().contains("the kernel lost"), "a false alarm:\n{}", kpx.log());

    let virtual_servers = || node_ipvs(&lab, |ipvs| ipvs.services().unwrap().len());
    let held = virtual_servers();
    assert!(held > 0, "kpx wrote no virtual server");
    type Damage<'a> = (&'a str, Box<dyn Fn() + 'a>, Box<dyn Fn() -> bool + 'a>);
    let damages: Vec<Damage> = vec![
        (
            "IPVS cleared (ipvsadm -C)",
            Box::new(|| node_ipvs(&lab, |ipvs| ipvs.flush().unwrap())),
            Box::new(|| virtual_servers() == held),
        ),
        (
            "nat KUBE-SERVICES flushed",
            Box::new(|| {
                lab.node.exec(&["iptables", "-t", "nat", "-F", "KUBE-SERVICES"]).unwrap();
            }),
            Box::new(|| lab.node.exec(&["iptables", "-t", "nat", "-S", "KUBE-SERVICES"]).unwrap().contains("-A ")),
        ),
        (
            "kube-ipvs0 deleted",
            Box::new(|| lab.node.ip(&["link", "del", "kube-ipvs0"]).map(|_| ()).unwrap()),
            Box::new(|| lab.node.ip(&["addr", "show", "dev", "kube-ipvs0"]).is_ok_and(|a| a.contains("10.96.0.10/32"))),
        ),
    ];
    for (i, (what, damage, restored)) in damages.iter().enumerate() {
        // Right after a pass: not in the middle of a sync's reads and
        // writes (IPVS cleared between a sync's dump of the virtual
        // servers and its writes fails that sync, which is retried).
        let passes = kpx.log().matches("sync pass done").count();
        assert!(kpx.wait_for_log("sync pass done", passes + 1, PERIOD + Duration::from_secs(30)), "{}", kpx.log());
        damage();
        assert!(!restored(), "{what}: the damage did nothing");
        let t = Instant::now();
        let noticed = kpx.wait_for_log("the kernel lost kube-proxy's rules", i + 1, PERIOD + Duration::from_secs(30));
        assert!(noticed, "{what}: not noticed:\n{}", kpx.log());
        let noticed_after = t.elapsed();
        while !restored() && t.elapsed() < PERIOD + Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(restored(), "{what}: not restored:\n{}", kpx.log());
        assert_eq!(tcp(&lab, web), "be1", "{what}: the Service after the restore:\n{}", kpx.log());
        eprintln!("ipvs: {what}: noticed after {noticed_after:.1?}, restored after {:.1?}", t.elapsed());
    }
    let (_, metrics) = crate::servers::get(&lab.node, "127.0.0.1:10249", "/metrics").expect("metrics");
    let counted = metrics.lines().find(|l| l.starts_with("kpx_kernel_rules_lost_total")).unwrap_or_default();
    assert_eq!(counted, format!("kpx_kernel_rules_lost_total {}", damages.len()), "{metrics}");
    assert!(!kpx.log().contains("sync failed"), "{}", kpx.log());
    eprintln!("ipvs: lost objects were noticed and restored");
}

/// Two checks in one guest boot (a boot is about a minute of the test
/// command): lost objects, then churn under live traffic
/// (tests/all/churn.rs).
#[test]
fn ipvs_mode_restores_lost_objects_and_keeps_up_with_churn() {
    kpx_where_ipvs_is("ipvs::ipvs_mode_restores_lost_objects_and_keeps_up_with_churn", &[], || {
        lost_objects_checks();
        crate::churn::churn("ipvs");
    });
}
