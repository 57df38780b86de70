use super::*;
use kpx_rules::model::{Cluster, IpFamily, Protocol, ProxyMode, Settings};

fn hostile_bytes() -> Vec<u8> {
    std::fs::read(format!("{}/kpx_plugin_hostile.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap()
}

fn runtime(limits: Limits) -> Runtime {
    Runtime::new(limits, None).unwrap()
}

fn service(name: &str) -> ServicePort {
    let mut s = ServicePort::new("t", name, "", Protocol::Tcp, 80);
    s.cluster_ip = Some("10.96.0.1".parse().unwrap());
    s
}

/// Replaces `from` by `to` (same length) in the component's bytes.
fn patch(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let at = bytes.windows(from.len()).position(|w| w == from).expect("marker present");
    let mut out = bytes.to_vec();
    out[at..at + to.len()].copy_from_slice(to);
    out
}

#[test]
fn builtin_plugin_carries_a_supported_version() {
    for mode in ["iptables", "nftables", "ipvs"] {
        let bytes = builtin::get(mode).unwrap();
        assert_eq!(read_contract_version(bytes).unwrap().as_deref(), Some("0.3.0"), "{mode}");
    }
    // Schedulers state their promises: 0.4.0.
    assert_eq!(read_contract_version(builtin::get("schedulers").unwrap()).unwrap().as_deref(), Some("0.4.0"));
}

fn nftables_v0_2_bytes() -> Vec<u8> {
    std::fs::read(format!("{}/kpx_plugin_nftables_v0_2.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap()
}

/// Ports of every shape, some changed, some removed: what the two
/// contract versions must carry alike.
fn versions_state() -> (Vec<ServicePort>, Vec<Change>) {
    use kpx_rules::model::{Endpoint, TrafficPolicy};
    let ep = |ip: &str| Endpoint::ready(ip.parse().unwrap(), 8080);
    let mut ports = Vec::new();
    for i in 0..40u16 {
        let mut p =
            ServicePort::new("ns", &format!("svc-{i}"), if i % 3 == 0 { "" } else { "http" }, Protocol::Tcp, 80);
        p.cluster_ip = (i % 7 != 0).then(|| format!("10.96.0.{}", i + 1).parse().unwrap());
        p.node_port = if i % 2 == 0 { 30000 + i } else { 0 };
        if i % 5 == 0 {
            p.external_ips = vec![format!("192.0.2.{i}").parse().unwrap()];
            p.load_balancer_ips = vec![format!("198.51.100.{i}").parse().unwrap()];
            p.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
            p.external_traffic_policy = TrafficPolicy::Local;
            p.health_check_node_port = 31000 + i;
        }
        p.affinity_timeout_seconds = if i % 4 == 0 { 600 } else { 0 };
        let mut eps: Vec<Endpoint> = (0..i % 4).map(|k| ep(&format!("10.244.{i}.{k}"))).collect();
        if let Some(first) = eps.first_mut() {
            first.conditions.is_local = true;
            first.zone = Some("zone-a".into());
        }
        p = p.with_cluster_endpoints(eps);
        p.local_endpoints = if p.endpoints.is_empty() { vec![] } else { vec![0] };
        ports.push(p);
    }
    let mut changed = ports[3].clone();
    changed.endpoints.push(ep("10.244.99.1"));
    changed.cluster_endpoints.push(changed.endpoints.len() as u32 - 1);
    let added = ServicePort::new("ns", "new", "", Protocol::Udp, 53).with_cluster_endpoints(vec![ep("10.244.98.1")]);
    let changes = vec![
        Change::Upsert(changed),
        Change::Remove(ports[5].key.clone()),
        // Upserted, then removed in the same batch: gone.
        Change::Upsert(ports[6].clone()),
        Change::Remove(ports[6].key.clone()),
        // Removed, then upserted: there.
        Change::Remove(ports[7].key.clone()),
        Change::Upsert(ports[7].clone()),
        Change::Upsert(added),
        Change::Node(Node { name: "node-a".into(), zone: "zone-a".into(), ..Node::default() }),
        Change::Cluster(Cluster { service_cidrs: vec!["10.96.0.0/16".parse().unwrap()] }),
    ];
    (ports, changes)
}

/// The same generator behind contract 0.2.0 (records) and 0.3.0 (a
/// port table, and a change batch of each port's net change): the same
/// rules, full and partial.
#[test]
fn contract_versions_carry_the_same_state() {
    let rt = runtime(Limits::default());
    let v2 = rt.load_backend("nftables-v0-2", &nftables_v0_2_bytes()).unwrap();
    let v3 = rt.load_backend("nftables", builtin::get("nftables").unwrap()).unwrap();
    let settings = Settings::new(IpFamily::V4, ProxyMode::Nftables);
    let (ports, changes) = versions_state();
    let renders = |plugin: &BackendPlugin| {
        let mut i = plugin.instantiate(&settings).unwrap();
        i.reset(&Node::default(), &Cluster::default(), &ports).unwrap();
        let full = i.render(true, 100).unwrap();
        i.apply(&changes).unwrap();
        let partial = i.render(false, 100).unwrap();
        let full_after = i.render(true, 100).unwrap();
        (full, partial, full_after)
    };
    let (a, b) = (renders(&v2), renders(&v3));
    assert_eq!(a.0, b.0, "full render");
    assert_eq!(a.1, b.1, "partial render after the changes");
    assert_eq!(a.2, b.2, "full render after the changes");
    assert_ne!(a.0, a.2, "the changes changed something");
}

#[test]
fn incompatible_or_unmarked_plugins_are_refused_before_compiling() {
    let rt = runtime(Limits::default());
    let bytes = builtin::get("iptables").unwrap();
    let future = patch(bytes, b"kpx:proxier-version0.3.0", b"kpx:proxier-version9.9.9");
    let err = rt.load_backend("future", &future).err().unwrap();
    assert!(matches!(err, Error::IncompatibleVersion { .. }), "{err}");
    assert!(err.to_string().contains("built for kpx:proxier 9.9.9, this kpx supports 0.2.0, 0.3.0"), "{err}");
    // A 0.3.0 component marked 0.2.0 has not 0.2.0's exports.
    let mislabelled = patch(bytes, b"kpx:proxier-version0.3.0", b"kpx:proxier-version0.2.0");
    let err = rt.load_backend("mislabelled", &mislabelled).err().unwrap();
    assert!(matches!(err, Error::Load { .. }), "{err}");
    // 0.4.0 has schedulers and extensions only.
    let later = patch(bytes, b"kpx:proxier-version0.3.0", b"kpx:proxier-version0.4.0");
    let err = rt.load_backend("later", &later).err().unwrap();
    assert!(
        err.to_string().contains("kpx:proxier 0.4.0 has no backend world (backends are built for 0.3.0 or 0.2.0)"),
        "{err}"
    );
    // 0.1.0 returned kernel text: refused, and the message says why.
    let old = patch(bytes, b"kpx:proxier-version0.3.0", b"kpx:proxier-version0.1.0");
    let err = rt.load_backend("old", &old).err().unwrap();
    assert!(err.to_string().contains("never released") && err.to_string().contains("typed rules"), "{err}");
    let unmarked = patch(bytes, b"kpx:proxier-version", b"kpx:proxier-vers1on");
    assert!(matches!(rt.load_backend("unmarked", &unmarked), Err(Error::MissingVersion { .. })));
    assert!(matches!(rt.load_backend("junk", b"\0asm junk"), Err(Error::Load { .. })));
}

/// Each loader refuses the other two kinds as such, read from their
/// exports: the error names the kind found and the kind asked for.
#[test]
fn a_component_of_another_kind_is_refused_naming_both_kinds() {
    let rt = runtime(Limits::default());
    let probe = std::fs::read(format!("{}/kpx_plugin_ext_probe.wasm", env!("KPX_TEST_PLUGIN_DIR"))).unwrap();
    let scheduler = builtin::get("schedulers").unwrap();
    // A 0.3.0 backend and a 0.2.0 one.
    let (backend, old_backend) = (builtin::get("iptables").unwrap(), nftables_v0_2_bytes());
    let wrong = |err: Error| match err {
        Error::WrongKind { found, expected, .. } => (found, expected),
        other => panic!("want WrongKind, got {other}"),
    };
    assert_eq!(wrong(rt.load_extension("s", scheduler).err().unwrap()), (Kind::Scheduler, Kind::Extension));
    assert_eq!(wrong(rt.load_backend("s", scheduler).err().unwrap()), (Kind::Scheduler, Kind::Backend));
    assert_eq!(wrong(rt.load_scheduler("b", backend).err().unwrap()), (Kind::Backend, Kind::Scheduler));
    assert_eq!(wrong(rt.load_scheduler("b", &old_backend).err().unwrap()), (Kind::Backend, Kind::Scheduler));
    assert_eq!(wrong(rt.load_extension("b", backend).err().unwrap()), (Kind::Backend, Kind::Extension));
    assert_eq!(wrong(rt.load_scheduler("e", &probe).err().unwrap()), (Kind::Extension, Kind::Scheduler));
    let err = rt.load_backend("probe", &probe).err().unwrap();
    assert_eq!(err.to_string(), "plugin probe is an extension component, not a backend component");
    // Each loads as its own kind.
    assert!(rt.load_extension("e", &probe).is_ok() && rt.load_scheduler("s", scheduler).is_ok());
    assert!(rt.load_backend("b", &old_backend).is_ok());
}

fn hostile_render(limits: Limits, name: &str, mode: ProxyMode) -> (Error, PluginStats) {
    let plugin = runtime(limits).load_backend("hostile", &hostile_bytes()).unwrap();
    let mut instance = plugin.instantiate(&Settings::new(IpFamily::V4, mode)).unwrap();
    instance.reset(&Node::default(), &Cluster::default(), &[service(name)]).unwrap();
    let err = instance.render(true, 1).expect_err("hostile render must fail");
    let stats = PluginStats::default();
    stats.traps.store(plugin.stats().traps.load(Ordering::Relaxed), Ordering::Relaxed);
    stats.failures.store(plugin.stats().failures.load(Ordering::Relaxed), Ordering::Relaxed);
    (err, stats)
}

#[test]
fn traps_are_caught_and_counted() {
    let (err, stats) = hostile_render(Limits::default(), "hostile-trap", ProxyMode::Iptables);
    assert!(err.needs_fresh_instance(), "{err}");
    assert!(err.to_string().contains("plugin hostile: render trapped"), "{err}");
    assert_eq!(stats.traps.load(Ordering::Relaxed), 1);
}

#[test]
fn endless_loops_run_out_of_fuel() {
    let limits = Limits { fuel_base: 50_000_000, ..Limits::default() };
    let t0 = std::time::Instant::now();
    let (err, _) = hostile_render(limits, "hostile-loop", ProxyMode::Iptables);
    assert!(err.to_string().contains("ran out of fuel"), "{err}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn memory_is_bounded() {
    let limits = Limits { memory_bytes: 32 << 20, ..Limits::default() };
    let (err, _) = hostile_render(limits, "hostile-memory", ProxyMode::Nftables);
    assert!(err.needs_fresh_instance(), "{err}");
}

#[test]
fn output_is_capped_in_both_modes() {
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables] {
        let limits = Limits { max_output_bytes: 1 << 20, ..Limits::default() };
        let (err, stats) = hostile_render(limits, "hostile-huge", mode);
        assert!(matches!(err, Error::OutputTooLarge { .. }), "{mode}: {err}");
        assert!(err.needs_fresh_instance(), "the instance is left mid-call");
        assert_eq!(stats.failures.load(Ordering::Relaxed), 1);
    }
}

#[test]
fn a_fresh_instance_after_a_trap_works() {
    let plugin = runtime(Limits::default()).load_backend("hostile", &hostile_bytes()).unwrap();
    let settings = Settings::new(IpFamily::V4, ProxyMode::Iptables);
    let mut bad = plugin.instantiate(&settings).unwrap();
    bad.reset(&Node::default(), &Cluster::default(), &[service("hostile-trap")]).unwrap();
    assert!(bad.render(true, 1).is_err());
    let mut fresh = plugin.instantiate(&settings).unwrap();
    fresh.reset(&Node::default(), &Cluster::default(), &[service("fine")]).unwrap();
    let Ok(kpx_rules::ops::Ruleset::Iptables(rules)) = fresh.render(true, 1) else { panic!("no iptables rules") };
    assert!(
        rules
            .rules
            .iter()
            .any(|r| r.matches.contains(&kpx_rules::ops::iptables::Match::comment("t/fine has no endpoints")))
    );
    assert_eq!(plugin.stats().instances.load(Ordering::Relaxed), 2);
}

#[test]
fn a_plugin_importing_anything_else_is_not_loaded() {
    // The same component, its one import renamed to an interface kpx does
    // not offer (every occurrence, so that the binary stays valid). WASI
    // imports get the deny-all WASI instead (runtime::wasi).
    let bytes = builtin::get("iptables").unwrap();
    let (from, to): (&[u8], &[u8]) = (b"kpx:proxier/log@0.2.0", b"evil:cli/stdout@0.2.0");
    let mut wasi = bytes.to_vec();
    let mut n = 0;
    while let Some(at) = wasi.windows(from.len()).position(|w| w == from) {
        wasi[at..at + to.len()].copy_from_slice(to);
        n += 1;
    }
    assert!(n > 0, "the log import is named in the component");
    let err = runtime(Limits::default()).load_backend("evil", &wasi).err().expect("a foreign import is refused");
    assert!(matches!(err, Error::Load { .. }), "{err}");
    assert!(err.to_string().contains("evil:cli/stdout@0.2.0"), "the message names the import: {err}");
}

#[test]
fn log_lines_are_budgeted_per_call_cut_and_kept_on_one_line() {
    let mut state = PluginState {
        plugin: Arc::from("t"),
        limits: StoreLimitsBuilder::new().build(),
        log_budget: LOG_LINES_PER_CALL,
        log_dropping: false,
        random: wasi::RANDOM_SEED,
    };
    let kept = (0..LOG_LINES_PER_CALL + 50).filter(|_| state.take_log_budget()).count();
    assert_eq!(kept, LOG_LINES_PER_CALL as usize);
    state.refill_log_budget();
    assert!(state.take_log_budget(), "a new call has a new budget");
    let line = log_line(&format!("ok\n2026-01-01 ERROR kpx: forged\u{1b}[2J{}", "x".repeat(10_000)));
    assert!(!line.contains('\n') && !line.contains('\u{1b}') && line.contains("ok\\n2026"), "{line}");
    assert!(line.len() <= MAX_LOG_LINE + 3 && line.ends_with("..."));
}
