//! Hot reload: a component file replaced while kpx runs is tried on the
//! live state and switched to, with a client loop running throughout; a
//! replacement that does not fit is refused and the running component
//! keeps serving.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::schedulers::write_service;
use crate::support::*;

fn test_plugin(file: &str) -> Vec<u8> {
    std::fs::read(format!("{}/{file}", env!("KPX_TEST_PLUGIN_DIR"))).unwrap()
}

/// Replaces `path` as an operator's tooling would: a new file renamed
/// over the old one.
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The backends that answered the connections started after `since`, and
/// how many failed. A connection whose source port an earlier one of the
/// loop used is left out of the answers: the kernel reopens a recently
/// closed conntrack entry for the same 4-tuple with its old NAT binding
/// (the test prints how many ports came back), so it shows the endpoint
/// of the rules then, not now.
fn answered_since(client: &ClientLoop, since: Instant) -> (Vec<String>, usize) {
    let mut used = std::collections::HashSet::new();
    let mut answers = Vec::new();
    let mut failed = 0;
    for (t, port, answer) in client.outcomes() {
        let fresh = used.insert(port);
        if t < since {
            continue;
        }
        match answer {
            None => failed += 1,
            Some(a) if fresh => answers.push(a),
            Some(_) => {}
        }
    }
    (answers, failed)
}

/// `hot` v1 (round robin, a kpx:proxier 0.2.0 component) replaced by v2
/// (maglev, 0.4.0) while one client opens connections back to back: its
/// connections rotate over the endpoints, then all land on one (maglev
/// keeps a client on its endpoint), with no failed connection. A file that
/// is no component, and one that no longer exports `hot`, are refused and
/// v2 keeps serving.
#[test]
fn a_replaced_scheduler_takes_over_with_no_failed_connection() {
    scheduler_swap("nftables");
}

/// The same in userspace mode, where the component picks every
/// connection the relay accepts.
#[test]
fn a_replaced_scheduler_picks_the_next_connection_in_userspace_mode() {
    scheduler_swap("userspace");
}

fn scheduler_swap(mode: &str) {
    let Some(lab) = lab_or_skip(3, &format!("scheduler hot reload ({mode})")) else {
        return;
    };
    let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    let (dir, manifests) = run_dirs("reload-scheduler");
    let file = dir.join("hot.wasm");
    std::fs::write(&file, test_plugin("kpx_plugin_hot_v1.wasm")).unwrap();
    write_service(&manifests, "web", "10.96.0.10", &[("kpx.dev/scheduler", "hot")], &eps, &[]);
    let plugin = format!("ext={}", file.display());
    let args = kpx_args(&manifests, &["--proxy-mode", mode, "--scheduler-plugin", &plugin]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());

    let client = ClientLoop::start(&lab, "10.96.0.10:80");
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let (v1, _) = answered_since(&client, t0);
    let v1_spread: BTreeSet<&String> = v1.iter().collect();
    assert!(v1_spread.len() == 3, "round robin: one client's connections rotate over 3 endpoints: {v1_spread:?}");

    let synced = kpx.log().matches("synced rules family=IPv4").count();
    let swapped = Instant::now();
    replace(&file, &test_plugin("kpx_plugin_hot_v2.wasm"));
    assert!(
        kpx.wait_for_log("replaced component applied", 1, Duration::from_secs(10)),
        "v2 was not applied:\n{}",
        kpx.log()
    );
    assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(10)), "{}", kpx.log());
    let applied = Instant::now();
    eprintln!("v2 applied {:?} after the file was replaced", applied - swapped);
    std::thread::sleep(Duration::from_millis(1500));
    let (v2, _) = answered_since(&client, applied);
    let v2_spread: BTreeSet<&String> = v2.iter().collect();
    assert!(
        v2.len() >= 50 && v2_spread.len() == 1,
        "maglev: one client, one endpoint: {} connections to {v2_spread:?}",
        v2.len()
    );

    for (bytes, why) in [
        (b"\0asm garbage".to_vec(), "cannot load"),
        (test_plugin("kpx_plugin_first.wasm"), "no longer exports the scheduler \"hot\""),
    ] {
        let refusals = kpx.log().matches("replaced component refused").count();
        replace(&file, &bytes);
        assert!(
            kpx.wait_for_log("replaced component refused", refusals + 1, Duration::from_secs(10)),
            "not refused:\n{}",
            kpx.log()
        );
        assert!(kpx.log().contains(why), "want {why:?} in:\n{}", kpx.log());
    }
    let after_refusals = Instant::now();
    std::thread::sleep(Duration::from_millis(1000));
    let (kept, _) = answered_since(&client, after_refusals);
    let kept_spread: BTreeSet<&String> = kept.iter().collect();
    assert_eq!(kept_spread, v2_spread, "v2 keeps serving after the refused replacements");

    let (all, failed) = answered_since(&client, t0);
    let outcomes = client.outcomes();
    drop(client);
    let ports: std::collections::HashSet<u16> = outcomes.iter().map(|(_, p, _)| *p).collect();
    eprintln!(
        "source ports used again within the run: {} of {} connections",
        outcomes.len() - ports.len(),
        outcomes.len()
    );
    eprintln!(
        "hot reload ({mode}): {} connections, {failed} failed; v1 reached {v1_spread:?}, v2 {v2_spread:?}",
        all.len() + failed
    );
    assert_eq!(failed, 0, "connections failed during the swaps");
    assert!(kpx.log().contains("component=scheduler:ext"), "{}", kpx.log());
}

/// `--backend-plugin` replaced while traffic flows: a backend that would
/// serve no Service (here the hostile one while a Service named
/// `hostile-empty` exists: it renders nothing, which the host's checks
/// accept) is refused by the coverage trace, one of another mode by the
/// host's trial; once `hostile-empty` is gone, the same file touched again
/// is tried again and applied. No connection fails, the rules stay.
#[test]
fn a_replaced_backend_is_tried_before_it_serves() {
    let Some(lab) = lab_or_skip(2, "a_replaced_backend_is_tried_before_it_serves") else {
        return;
    };
    let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    let (dir, manifests) = run_dirs("reload-backend");
    let file = dir.join("backend.wasm");
    std::fs::write(&file, kpx::runtime::builtin::get("iptables").unwrap()).unwrap();
    write_service(&manifests, "web", "10.96.0.10", &[], &eps, &[]);
    write_service(&manifests, "hostile-empty", "10.96.0.20", &[], &eps[..1], &[]);
    let args = kpx_args(&manifests, &["--proxy-mode", "iptables", "--backend-plugin", file.to_str().unwrap()]);
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    let client = ClientLoop::start(&lab, "10.96.0.10:80");
    let t0 = Instant::now();

    let hostile = test_plugin("kpx_plugin_hostile.wasm");
    replace(&file, &hostile);
    assert!(kpx.wait_for_log("replaced component refused", 1, Duration::from_secs(10)), "{}", kpx.log());
    assert!(kpx.log().contains("would no longer send"), "{}", kpx.log());
    replace(&file, kpx::runtime::builtin::get("nftables").unwrap());
    assert!(kpx.wait_for_log("replaced component refused", 2, Duration::from_secs(10)), "{}", kpx.log());
    let log = kpx.log();
    let refusal = log.lines().filter(|l| l.contains("replaced component refused")).nth(1).unwrap_or_default();
    assert!(refusal.contains("nftables") && refusal.contains("iptables"), "the refusal names both modes: {refusal}");

    let synced = kpx.log().matches("synced rules family=IPv4").count();
    std::fs::remove_file(manifests.join("hostile-empty.yaml")).unwrap();
    assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(10)), "{}", kpx.log());
    replace(&file, &hostile);
    assert!(kpx.wait_for_log("replaced component applied", 1, Duration::from_secs(10)), "{}", kpx.log());
    std::thread::sleep(Duration::from_millis(1000));
    let (answered, failed) = answered_since(&client, t0);
    drop(client);
    let reached: BTreeSet<&String> = answered.iter().collect();
    eprintln!("backend reload: {} connections, {failed} failed, reached {reached:?}", answered.len() + failed);
    assert_eq!(failed, 0, "connections failed during the swaps");
    assert_eq!(reached.len(), 2, "both endpoints keep serving: {reached:?}");
    assert!(kernel_rules(&lab).contains("KUBE-SVC-"), "the rules stay");
}

/// A replacement that passes the trial but whose first write fails (here
/// iptables-restore made to fail for IPv4 while a marker file exists) is
/// rolled back in every family (here IPv6's write succeeds, IPv4's
/// fails: both come back): the previous component serves again, and
/// once the kernel takes writes again its syncs succeed; no connection
/// fails, as the failed write changed nothing.
#[test]
fn a_replacement_whose_first_write_fails_is_rolled_back() {
    let Some(lab) = lab_or_skip(2, "a_replacement_whose_first_write_fails_is_rolled_back") else {
        return;
    };
    let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    let (dir, manifests) = run_dirs("reload-rollback");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let marker = dir.join("fail-writes");
    let real = ["/usr/sbin/iptables-restore", "/sbin/iptables-restore"].into_iter().find(|p| Path::new(p).exists());
    let wrapper = bin.join("iptables-restore");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nif [ -e {} ]; then echo 'iptables-restore: injected failure' >&2; exit 1; fi\nexec {} \"$@\"\n",
            marker.display(),
            real.expect("iptables-restore")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());

    let file = dir.join("backend.wasm");
    std::fs::write(&file, kpx::runtime::builtin::get("iptables").unwrap()).unwrap();
    write_service(&manifests, "web", "10.96.0.10", &[], &eps, &[]);
    // The wrapper is the iptables on PATH (not iptables-nft-restore).
    let plugin = file.to_str().unwrap();
    let args =
        kpx_args(&manifests, &["--proxy-mode", "iptables", "--backend-plugin", plugin, "--iptables-backend", "system"]);
    let mut kpx =
        lab.start_kpx_with_env(KPX.as_ref(), &args, &dir.join("kpx.log"), &[("PATH", &path)]).expect("start kpx");
    assert!(kpx.wait_for_log("synced rules family=IPv4", 1, Duration::from_secs(20)), "{}", kpx.log());
    let client = ClientLoop::start(&lab, "10.96.0.10:80");
    let t0 = Instant::now();

    std::fs::write(&marker, "").unwrap();
    replace(&file, &test_plugin("kpx_plugin_hostile.wasm"));
    assert!(kpx.wait_for_log("replaced component applied", 1, Duration::from_secs(10)), "{}", kpx.log());
    assert!(kpx.wait_for_log("the previous component is back", 1, Duration::from_secs(10)), "{}", kpx.log());
    assert!(kpx.log().contains("injected failure"), "{}", kpx.log());
    let synced = kpx.log().matches("synced rules family=IPv4").count();
    std::fs::remove_file(&marker).unwrap();
    assert!(kpx.wait_for_log("synced rules family=IPv4", synced + 1, Duration::from_secs(15)), "{}", kpx.log());
    // (The replaced and the previous backend write the same rules for this
    // state: the log's rollback line, and syncs succeeding afterwards, are
    // what show the switch back.)
    let after = kpx.log();
    let tail = &after[after.rfind("the previous component is back").unwrap()..];
    assert!(!tail.contains("replaced component applied"), "{tail}");
    std::thread::sleep(Duration::from_millis(500));
    let (answered, failed) = answered_since(&client, t0);
    drop(client);
    eprintln!("rollback: {} connections, {failed} failed", answered.len() + failed);
    assert_eq!(failed, 0, "connections failed");
}

/// The `--backend-plugin` path swapped to a symlink to a FIFO nobody
/// writes, then to /proc/kmsg (which never ends for a blocking reader):
/// each is refused with its reason and counted, and a Service added
/// afterwards is programmed within one sync period (the sync loop never
/// reads the file).
#[test]
fn a_file_that_would_block_never_stops_the_sync_loop() {
    let Some(lab) = lab_or_skip(1, "a_file_that_would_block_never_stops_the_sync_loop") else {
        return;
    };
    let eps: Vec<&str> = lab.backends.iter().map(|b| b.ip.as_str()).collect();
    let (dir, manifests) = run_dirs("reload-block");
    let file = dir.join("backend.wasm");
    std::fs::write(&file, kpx::runtime::builtin::get("iptables").unwrap()).unwrap();
    write_service(&manifests, "web", "10.96.0.10", &[], &eps, &[]);
    let args = kpx_args(
        &manifests,
        &["--proxy-mode", "iptables", "--backend-plugin", file.to_str().unwrap(), "--iptables-sync-period", "5s"],
    );
    let mut kpx = lab.start_kpx(KPX.as_ref(), &args, &dir.join("kpx.log")).expect("start kpx");
    assert!(kpx.wait_for_log("sync pass done ok=true", 1, Duration::from_secs(20)), "{}", kpx.log());

    let fifo = dir.join("never-written");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut targets = vec![(fifo.clone(), "not a regular file but a FIFO")];
    if std::fs::File::open("/proc/kmsg").is_ok() {
        targets.push(("/proc/kmsg".into(), "cannot read it"));
    }
    for (i, (target, why)) in targets.iter().enumerate() {
        let link = dir.join("backend.link");
        std::os::unix::fs::symlink(target, &link).unwrap();
        std::fs::rename(&link, &file).unwrap();
        assert!(
            kpx.wait_for_log("replaced component refused", i + 1, Duration::from_secs(10)),
            "{}: not refused:\n{}",
            target.display(),
            kpx.log()
        );
        let refusal =
            kpx.log().lines().filter(|l| l.contains("replaced component refused")).nth(i).unwrap().to_string();
        assert!(refusal.contains(why), "want {why:?}: {refusal}");
        // A Service added now is programmed within one sync period.
        let name = format!("added{i}");
        let ip = format!("10.96.0.{}", 20 + i);
        let added = Instant::now();
        write_service(&manifests, &name, &ip, &[], &eps, &[]);
        let target_addr = format!("{ip}:80");
        while request(&lab, Proto::Tcp, &target_addr).server().is_none() {
            assert!(added.elapsed() < Duration::from_secs(5), "{name} not programmed in 5 s:\n{}", kpx.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("{}: refused ({why}); {name} programmed in {:?}", target.display(), added.elapsed());
    }
    let (_, metrics) = crate::servers::get(&lab.node, "127.0.0.1:10249", "/metrics").expect("metrics");
    let refused = format!("kpx_plugin_reloads_total{{component=\"backend\",outcome=\"refused\"}} {}", targets.len());
    assert!(metrics.contains(&refused), "want {refused} in:\n{metrics}");
    assert!(kpx.is_running(), "{}", kpx.log());
}
