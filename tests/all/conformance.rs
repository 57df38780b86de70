//! `kpx conformance` on every built-in component (the command CI runs on
//! them), and on components that must fail it: the kit has to be able to
//! say no.

use std::process::Command;

use crate::support::{KPX, plugin_cache};

/// Runs `kpx conformance ARGS`: (exit code, output).
fn conformance(args: &[&str]) -> (i32, String) {
    let cache = plugin_cache();
    let out = Command::new(KPX)
        .arg("conformance")
        .args(["--plugin-cache-dir", &cache])
        .args(args)
        .output()
        .expect("run kpx conformance");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// The table's row for `feature`: (pass, fail, skip).
fn row(text: &str, feature: &str) -> (usize, usize, usize) {
    let line = text.lines().find(|l| l.starts_with(feature)).unwrap_or_else(|| panic!("no row {feature:?}:\n{text}"));
    let n: Vec<usize> = line[feature.len()..].split_whitespace().take(3).map(|x| x.parse().unwrap()).collect();
    (n[0], n[1], n[2])
}

fn passes(component: &str) -> String {
    let (code, text) = conformance(&[component]);
    eprintln!("{text}");
    assert_eq!(code, 0, "{component} fails the conformance kit:\n{text}");
    assert!(text.lines().last().unwrap_or("").starts_with("PASS: "), "{text}");
    text
}

#[test]
fn the_built_in_iptables_backend_passes_conformance() {
    let text = passes("builtin:iptables");
    assert!(text.contains("backend component (kpx:proxier 0.3.0), iptables rules"), "{text}");
    let flows: usize =
        text.lines().filter(|l| l.starts_with("flows (tracer)")).map(|l| row(l, l.split("  ").next().unwrap()).0).sum();
    assert!(flows >= 60, "only {flows} flows traced");
    assert!(row(&text, "contract: partial renders pass the host's checks").0 >= 70, "{text}");
}

#[test]
fn the_built_in_nftables_backend_passes_conformance() {
    let text = passes("builtin:nftables");
    assert!(row(&text, "flows (tracer): 16-session-affinity").0 == 3, "{text}");
}

/// ipvs rules are checked by the host, not traced: the flows are left to
/// the kernel (the guest's conformance test), and the table says so.
#[test]
fn the_built_in_ipvs_backend_passes_conformance() {
    let text = passes("builtin:ipvs");
    assert!(text.contains("ipvs rules: the tracer walks iptables and nftables rules"), "{text}");
    assert!(row(&text, "every case's full render passes the host's checks").0 >= 25, "{text}");
}

/// A promise row that ran checks and failed none.
fn kept(text: &str, feature: &str) {
    let (pass, fail, _) = row(text, feature);
    assert!(pass > 0 && fail == 0, "{feature}: {pass} passed, {fail} failed:\n{text}");
}

/// Each built-in name states its promises, and the kit checks exactly
/// those: dh, which sends every client of one Service address to one
/// endpoint, promises sticky and not spread; lblc promises nothing.
#[test]
fn the_built_in_schedulers_pass_conformance() {
    let text = passes("builtin:schedulers");
    assert!(text.contains("scheduler component (kpx:proxier 0.4.0)"), "{text}");
    for feature in [
        "rr: promises spread",
        "wrr: promises spread, weighted",
        "dh: promises sticky",
        "lblc: promises nothing",
        "maglev: promises spread, weighted, sticky, minimal-disruption",
        "rr: rotates exactly",
    ] {
        assert_eq!(row(&text, feature), (1, 0, 0), "{feature}:\n{text}");
    }
    for feature in [
        "rr: spread: equal endpoints take at least half their fair share",
        "wrr: weighted: shares follow the weights (3:1 within ±5 points)",
        "wlc: weighted: shares follow the weights (3:1 within ±5 points)",
        "lc: least-loaded: new connections go to the least loaded endpoint",
        "sed: least-loaded: new connections go to the least loaded endpoint",
        "nq: least-loaded: new connections go to the least loaded endpoint",
        "sh: sticky: one client, one endpoint",
        "dh: sticky: one client, one endpoint",
        "maglev: minimal-disruption: one of 4 endpoints gone moves at most 1/4 + 2 points of clients",
    ] {
        kept(&text, feature);
    }
    // A promise not stated is not checked; the names' own checks are not
    // run again where a promise covers them.
    let absent = [
        "dh: spread",
        "lblc: spread",
        "rr: sticky",
        "wrr: shares follow",
        "lc: new connections",
        "maglev: one of 4 endpoints gone",
    ];
    for absent in absent {
        assert!(!text.lines().any(|l| l.starts_with(absent)), "a row {absent:?}:\n{text}");
    }
    assert!(text.contains("random: plans in ipvs mode: refuses ipvs mode"), "{text}");
}

/// `first` sends everything to the first candidate that may take it: it
/// promises priority, which passes, and is not checked for spreading; its
/// rotation, which ipvs mode cannot run, fails its ipvs plans (non-zero
/// exit), and the priority row skips that mode rather than fail it again.
#[test]
fn a_failover_scheduler_passes_priority_and_fails_plans_ipvs_cannot_run() {
    let first = format!("{}/kpx_plugin_first.wasm", env!("KPX_TEST_PLUGIN_DIR"));
    let (code, text) = conformance(&[&first]);
    eprintln!("{text}");
    assert_eq!(code, 1, "{text}");
    assert_eq!(row(&text, "first: promises priority"), (1, 0, 0), "{text}");
    let (pass, fail, skip) =
        row(&text, "first: priority: each connection goes to the first candidate that may take it");
    assert!(pass >= 3 && fail == 0 && skip == 1, "{text}");
    assert!(!text.lines().any(|l| l.starts_with("first: spread")), "no spread row for first:\n{text}");
    assert_eq!(row(&text, "first: plans in ipvs mode").1, 12, "{text}");
    assert!(text.lines().last().unwrap().starts_with("FAIL: "), "{text}");
}

/// A 0.2.0 scheduler (the hot-reload test's version 1, round robin)
/// states no promises: the kit says so, checks it as spreading, and it
/// passes.
#[test]
fn a_0_2_0_scheduler_is_checked_as_spreading() {
    let hot = format!("{}/kpx_plugin_hot_v1.wasm", env!("KPX_TEST_PLUGIN_DIR"));
    let text = passes(&hot);
    assert!(text.contains("scheduler component (kpx:proxier 0.2.0)"), "{text}");
    let stated = "hot: promises spread (kpx:proxier 0.2.0 states none: checked as spreading)";
    assert_eq!(row(&text, stated), (1, 0, 0), "{text}");
    // Its iptables and nftables plans and its picks spread; ipvs mode runs
    // IPVS's rr, the kernel's own spread (skipped, not failed).
    assert_eq!(row(&text, "hot: spread: equal endpoints take at least half their fair share"), (3, 0, 1), "{text}");
}

/// A component built against WASI (as wasm32-wasip2 toolchains build
/// them) is checked like any other; its clock and exit calls trap under
/// the deny-all WASI and fail their rows.
#[test]
fn a_wasi_component_is_checked_under_deny_all_wasi() {
    let probe = format!("{}/kpx_plugin_wasi_probe.wasm", env!("KPX_TEST_PLUGIN_DIR"));
    let (code, text) = conformance(&[&probe]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("scheduler component"), "{text}");
    assert!(text.contains("the plugin called wasi:clocks/monotonic-clock@0.2.12#now"), "{text}");
}

#[test]
fn what_is_not_a_component_is_refused_with_the_reason() {
    let (code, text) = conformance(&["builtin:nope"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("no built-in component is named \"nope\""), "{text}");
    let (code, text) = conformance(&["/etc/hostname"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("/etc/hostname"), "{text}");
    let (code, text) = conformance(&["--mode", "userspace", "builtin:iptables"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--mode \"userspace\""), "{text}");
}

/// The two example extensions pass the kit (the rate limit with its
/// annotation on every Service, so it returns rules); the probe passes
/// when it behaves, and fails naming the host's refusal when it names a
/// port the state does not have or rejects before dispatch.
#[test]
fn extensions_are_checked_and_a_hostile_one_fails() {
    let dir = env!("KPX_TEST_PLUGIN_DIR");
    let ratelimit = format!("{dir}/kpx_example_ratelimit.wasm");
    let text = {
        let (code, text) = conformance(&[&ratelimit, "--extension-annotation", "new-connections-per-second=5"]);
        assert_eq!(code, 0, "{text}");
        text
    };
    assert!(text.contains("extension component"), "{text}");
    let objects = "contract: the rules lay out into kernel objects of both modes";
    let (pass, fail, _) = row(&text, objects);
    assert!(pass > 0 && fail == 0, "the annotated Services got rules: {text}");
    // Without its annotation the rate limit returns no rules: each state's
    // layout check is skipped, and the note gives the SKIP column's count.
    let (code, text) = conformance(&[&ratelimit]);
    assert_eq!(code, 0, "{text}");
    let (_, _, skipped) = row(&text, objects);
    let note =
        format!("  {objects}: {skipped} skipped: the state (case, mode, family) got no rules from the extension");
    assert!(skipped > 1 && text.contains(&note), "want {note:?} in:\n{text}");
    passes(&format!("{dir}/kpx_example_conncount.wasm"));

    let probe = format!("{dir}/kpx_plugin_ext_probe.wasm");
    let (code, text) = conformance(&[&probe, "--extension-param", "do=count"]);
    assert_eq!(code, 0, "{text}");
    for (what, why) in [
        ("unknown-service", "\"nope/nope:none\" is not a service port of the state"),
        ("reject-at-dispatch", "reject is only possible at the service attachment"),
    ] {
        let (code, text) = conformance(&[&probe, "--extension-param", &format!("do={what}")]);
        assert_eq!(code, 1, "{what}: {text}");
        assert!(text.contains(why), "{what}: {text}");
        assert!(row(&text, "contract: the host accepts the rules").1 > 0, "{text}");
    }
    // --mode picks the real-traffic flows' mode: without --kernel it is refused, as --backend-param always is.
    let (code, text) = conformance(&[&probe, "--mode", "nftables"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--mode \"nftables\" picks the mode of --kernel's real-traffic flows"), "{text}");
    let (code, text) = conformance(&[&probe, "--backend-param", "x=y"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("extension component: --backend-param is for backends"), "{text}");
    let (code, text) = conformance(&[&probe, "--kernel", "--mode", "ipvs"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("an extension runs in the iptables and nftables modes"), "{text}");
}

/// `kpx conformance --kernel` on an extension: real connections through
/// its rules beside the mode's built-in backend, from clients inside and
/// outside the prefix it rejects (ext-probe's `do=reject-documentation`:
/// 192.0.2.0/24 and 2001:db8::/32, after kube-proxy's choice), each
/// outcome what its rules say, and its `rejected` counters right.
fn extension_in_the_kernel(mode: &str) {
    if !crate::conformance_kernel::lab_available(&format!("an extension's real traffic ({mode})")) {
        return;
    }
    let probe = format!("{}/kpx_plugin_ext_probe.wasm", env!("KPX_TEST_PLUGIN_DIR"));
    let (code, text) =
        conformance(&[&probe, "--kernel", "--mode", mode, "--extension-param", "do=reject-documentation"]);
    eprintln!("{text}");
    assert_eq!(code, 0, "{text}");
    let rows = |prefix: &str| -> Vec<(usize, usize, usize)> {
        text.lines().filter(|l| l.starts_with(prefix)).map(|l| row(l, l.split("  ").next().unwrap())).collect()
    };
    for family in ["IPv4", "IPv6"] {
        let flows = rows(&format!("extension flows (kernel, {mode}, {family}): "));
        assert!(!flows.is_empty(), "no {family} rows:\n{text}");
        assert!(flows.iter().all(|(pass, fail, _)| *pass > 0 && *fail == 0), "{family}:\n{text}");
    }
    let counters = rows(&format!("extension counters (kernel, {mode}): "));
    assert!(counters.len() >= 5 && counters.iter().all(|(pass, fail, _)| *pass > 0 && *fail == 0), "{text}");
}

#[test]
fn an_extension_carries_real_traffic_as_its_rules_say_in_nftables_mode() {
    extension_in_the_kernel("nftables");
}

#[test]
fn an_extension_carries_real_traffic_as_its_rules_say_in_iptables_mode() {
    extension_in_the_kernel("iptables");
}

/// The kit can say no: kpx runs the probe counting only (`do=count`)
/// while the expectations are its `do=reject-documentation` rules, so the
/// clients in 192.0.2.0/24 are answered where they should be refused, and
/// the counters are not the ones the rules name.
#[test]
fn a_kernel_that_disagrees_with_the_extensions_rules_fails_the_flows() {
    use kpx::conformance::{Report, extension_kernel};
    if !crate::conformance_kernel::lab_available("an extension's real traffic, disagreeing") {
        return;
    }
    let probe = format!("{}/kpx_plugin_ext_probe.wasm", env!("KPX_TEST_PLUGIN_DIR"));
    let cache = plugin_cache();
    let runtime = kpx::runtime::Runtime::new(kpx::runtime::Limits::default(), Some(cache.clone().into())).unwrap();
    let plugin = runtime.load_extension("ext-probe", &std::fs::read(&probe).unwrap()).unwrap();
    let rules = [("do".to_string(), "reject-documentation".to_string())];
    let counting = [("do".to_string(), "count".to_string())];
    let setup = extension_kernel::Setup {
        plugin: &plugin,
        file: std::path::Path::new(&probe),
        parameters: &rules,
        run_parameters: Some(&counting[..]),
        annotations: &[],
        kpx: std::path::Path::new(KPX),
        cache: Some(std::path::Path::new(&cache)),
    };
    let mut report = Report::default();
    let nftables = kpx_rules::model::ProxyMode::Nftables;
    extension_kernel::check_cases(&mut report, &runtime, &setup, &[nftables], &["01-clusterip.yaml"]);
    let failures = report.failure_lines();
    eprintln!("{}", failures.join("\n"));
    assert!(
        failures
            .iter()
            .any(|f| f.contains("from 192.0.2.") && f.contains("want refused") && f.contains("saw answered by")),
        "a client the rules reject was answered, and that fails:\n{}",
        failures.join("\n")
    );
    assert!(failures.iter().any(|f| f.contains("counter rejected of ns1/")), "{}", failures.join("\n"));
    assert!(failures.iter().any(|f| f.contains("counter seen of ns1/")), "{}", failures.join("\n"));
}

/// Backends the kit must refuse: the hostile test backend told by its
/// parameter (`--backend-param`, which reaches it in its settings as kpx
/// passes it) to serve nothing, or to DNAT to an address no endpoint has.
#[test]
fn hostile_backends_fail_conformance() {
    let hostile = format!("{}/kpx_plugin_hostile.wasm", env!("KPX_TEST_PLUGIN_DIR"));
    let (code, text) = conformance(&[&hostile, "--mode", "nftables", "--backend-param", "hostile=empty"]);
    assert_eq!(code, 1, "{text}");
    let (pass, fail, _) = row(&text, "flows (tracer): 01-clusterip");
    assert!(fail > 0 && pass == 0, "serving nothing fails the flows: {text}");
    let (code, text) = conformance(&[&hostile, "--mode", "iptables", "--backend-param", "hostile=dnat"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("which is not an endpoint of the state") || text.contains("not an endpoint"), "{text}");
    // Without the parameter it is the mode's own generator, and passes.
    let (code, text) = conformance(&[&hostile, "--mode", "nftables"]);
    assert_eq!(code, 0, "{text}");
}
