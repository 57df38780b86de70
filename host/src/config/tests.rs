use super::*;
use crate::cli::{Cli, CliError};
use clap::Parser;
use kpx_rules::model::IpFamily;

fn cli(args: &[&str]) -> std::result::Result<Cli, CliError> {
    Cli::from_args(std::iter::once("kpx").chain(args.iter().copied()).map(std::ffi::OsString::from))
}

/// Every flag in the seed documents (kube-proxy v1.12, v1.16, v1.33),
/// with a value it takes. None may be an unknown argument.
const SEED_FLAGS: &[&str] = &[
    "--add_dir_header=true",
    "--alsologtostderr=false",
    "--azure-container-registry-config=",
    "--bind-address=0.0.0.0",
    "--bind-address-hard-fail=false",
    "--cleanup=false",
    "--cleanup-ipvs=true",
    "--cluster-cidr=10.244.0.0/16",
    "--config-sync-period=15m0s",
    "--conntrack-max-per-core=32768",
    "--conntrack-min=131072",
    "--conntrack-tcp-be-liberal=false",
    "--conntrack-tcp-timeout-close-wait=1h0m0s",
    "--conntrack-tcp-timeout-established=24h0m0s",
    "--conntrack-udp-timeout=0s",
    "--conntrack-udp-timeout-stream=0s",
    "--detect-local-mode=ClusterCIDR",
    "--feature-gates=AllAlpha=false",
    "--healthz-bind-address=0.0.0.0:10256",
    "--healthz-port=10256",
    "--hostname-override=node-a",
    "--init-only=false",
    "--iptables-localhost-nodeports=true",
    "--iptables-masquerade-bit=14",
    "--iptables-min-sync-period=1s",
    "--iptables-sync-period=30s",
    "--ipvs-exclude-cidrs=10.0.0.0/8",
    "--ipvs-min-sync-period=1s",
    "--ipvs-scheduler=rr",
    "--ipvs-strict-arp=false",
    "--ipvs-sync-period=30s",
    "--ipvs-tcp-timeout=0s",
    "--ipvs-tcpfin-timeout=0s",
    "--ipvs-udp-timeout=0s",
    "--kube-api-burst=10",
    "--kube-api-content-type=application/vnd.kubernetes.protobuf",
    "--kube-api-qps=5",
    "--kubeconfig=/k",
    "--log-flush-frequency=5s",
    "--log-text-info-buffer-size=0",
    "--log-text-split-stream=false",
    "--log_backtrace_at=:0",
    "--log_dir=",
    "--log_file=",
    "--log_file_max_size=1800",
    "--logging-format=text",
    "--logtostderr=true",
    "--masquerade-all=false",
    "--master=",
    "--metrics-bind-address=127.0.0.1:10249",
    "--metrics-port=10249",
    "--nodeport-addresses=",
    "--one_output=false",
    "--oom-score-adj=-999",
    "--pod-bridge-interface=",
    "--pod-interface-name-prefix=",
    "--profiling=false",
    "--proxy-mode=iptables",
    "--proxy-port-range=",
    "--show-hidden-metrics-for-version=",
    "--skip_headers=false",
    "--skip_log_headers=false",
    "--stderrthreshold=2",
    "--udp-timeout=250ms",
    "--v=2",
    "--vmodule=",
    "--write-config-to=",
];

#[test]
fn every_seed_flag_is_known() {
    for flag in SEED_FLAGS {
        let parsed = cli(&[flag]);
        assert!(parsed.is_ok(), "{flag}: {}", parsed.err().unwrap());
    }
    let all = cli(SEED_FLAGS).unwrap();
    let c = all.flags.validate().unwrap();
    assert_eq!(c.mode, ProxyMode::Iptables);
    assert_eq!(c.extra.oom_score_adj, -999);
}

#[test]
fn parses_as_kubernetes_components_do() {
    // --flag=value and --flag value; `_` as `-`; the last one wins.
    let f = cli(&["--hostname_override=a", "--proxy-mode", "iptables", "--proxy_mode=nftables"]).unwrap().flags;
    assert_eq!((f.hostname_override.as_str(), f.proxy_mode.as_str()), ("a", "nftables"));
    // Go booleans; a bare boolean flag is true.
    for (arg, want) in [
        ("--masquerade-all", true),
        ("--masquerade-all=TRUE", true),
        ("--masquerade-all=t", true),
        ("--masquerade-all=1", true),
        ("--masquerade-all=False", false),
        ("--masquerade-all=0", false),
    ] {
        assert_eq!(cli(&[arg]).unwrap().flags.masquerade_all, want, "{arg}");
    }
    assert!(cli(&["--masquerade-all=yes"]).is_err());
    // klog's -v both ways.
    assert_eq!(cli(&["-v", "4"]).unwrap().flags.verbosity, 4);
    assert_eq!(cli(&["--v=5"]).unwrap().flags.verbosity, 5);
    // An unknown flag is an error.
    assert!(cli(&["--no-such-flag=1"]).is_err());
}

#[test]
fn modes_and_flags_without_effect_say_why() {
    let err = |args: &[&str]| {
        let mut all = vec!["--manifests=/x", "--hostname-override=n"];
        all.extend_from_slice(args);
        cli(&all).unwrap().flags.validate().unwrap_err().to_string()
    };
    assert!(err(&["--proxy-mode=ipvs", "--ipvs-scheduler=evil"]).contains("IPVS has no such scheduler"));
    assert!(err(&["--proxy-mode=ipvs", "--ipvs-min-sync-period=40s"]).contains("must not exceed --ipvs-sync-period"));
    assert!(err(&["--ipvs-tcp-timeout=forever"]).contains("ipvs-tcp-timeout"));
    assert!(err(&["--ipvs-udp-timeout=600h"]).contains("kernel's limit"));
    let ipvs = cli(&[
        "--manifests=/x",
        "--hostname-override=n",
        "--proxy-mode=ipvs",
        "--ipvs-scheduler=sh",
        "--ipvs-sync-period=20s",
        "--ipvs-min-sync-period=2s",
        "--ipvs-tcp-timeout=15m",
        "--ipvs-udp-timeout=45s",
        "--ipvs-exclude-cidrs=10.0.0.0/8",
        "--ipvs-strict-arp",
    ])
    .unwrap()
    .flags
    .validate()
    .unwrap();
    assert_eq!(
        (ipvs.mode, ipvs.sync_period, ipvs.min_sync_period),
        (ProxyMode::Ipvs, Duration::from_secs(20), Duration::from_secs(2))
    );
    assert_eq!(
        (ipvs.ipvs.scheduler.as_str(), ipvs.ipvs.tcp_timeout, ipvs.ipvs.udp_timeout, ipvs.ipvs.strict_arp),
        ("sh", 900, 45, true)
    );
    assert_eq!(ipvs.ipvs.exclude_cidrs, vec!["10.0.0.0/8".parse::<Cidr>().unwrap()]);
    assert!(err(&["--proxy-mode=kernelspace"]).contains("Windows only"));
    assert!(err(&["--profiling"]).contains("no Go profiler"));
    assert!(err(&["--feature-gates=Bogus"]).contains("feature-gates"));
    assert!(err(&["--oom-score-adj=1001"]).contains("oom-score-adj"));
    assert!(err(&["--ipvs-sync-period=0s"]).contains("ipvs-sync-period"));
    assert!(err(&["--proxy-port-range=9-1"]).contains("proxy-port-range"));
    assert!(err(&["--healthz-bind-address=nowhere"]).contains("healthz-bind-address"));
    let ok = |args: &[&str]| {
        let mut all = vec!["--manifests=/x", "--hostname-override=n"];
        all.extend_from_slice(args);
        cli(&all).unwrap().flags.validate().unwrap()
    };
    assert_eq!(ok(&["--healthz-port=0"]).healthz_bind_address, None, "0 disables, as v1.12 documents");
    assert_eq!(ok(&["--metrics-port=9000"]).metrics_bind_address, Some("127.0.0.1:9000".parse().unwrap()));
    assert_eq!(ok(&["--healthz-bind-address="]).healthz_bind_address, None);
    assert_eq!(ok(&["--proxy-mode="]).mode, ProxyMode::Iptables, "empty: the platform default");
}

/// kubeadm's ConfigMap `config.conf` (v1.33), as `kubeadm init` writes it.
const KUBEADM_CONFIG: &str = include_str!("../../../tests/kubeadm-config.conf");

#[test]
fn a_kubeadm_config_file_runs_unchanged() {
    let dir = std::env::temp_dir().join(format!("kpx-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.conf");
    std::fs::write(&path, KUBEADM_CONFIG).unwrap();
    let path = path.to_str().unwrap().to_string();
    // kubeadm's DaemonSet passes --config and --hostname-override; a
    // flag the file covers is ignored, as upstream ignores it.
    let parsed =
        cli(&[&format!("--config={path}"), "--hostname-override=node-7", "--masquerade-all", "--v=4"]).unwrap();
    let c = parsed.flags.validate().unwrap();
    assert_eq!(c.mode, ProxyMode::Iptables);
    assert_eq!(c.node_name, "node-7");
    assert_eq!(c.cluster_cidrs, vec!["10.244.0.0/16".parse().unwrap()]);
    assert_eq!(c.detect_local_mode, DetectLocalMode::ClusterCidr);
    assert!(!c.masquerade_all, "--masquerade-all is ignored with --config");
    assert_eq!(c.verbosity, 4, "logging flags still apply");
    // /flagz lists the command line as given, --config or not.
    let flag = |name: &str| c.flagz.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    assert_eq!(flag("hostname-override"), Some("node-7"));
    assert_eq!(flag("masquerade-all"), Some("true"));
    assert_eq!(flag("iptables-sync-period"), Some("30s"), "a flag not given shows its default");
    assert_eq!((c.sync_period, c.min_sync_period), (Duration::from_secs(30), Duration::from_secs(1)));
    assert_eq!(c.masquerade_bit, 14);
    assert!(c.localhost_nodeports);
    assert_eq!(c.conntrack.max_per_core, 32768);
    assert_eq!(c.conntrack.tcp_established, Duration::from_secs(86400));
    assert_eq!(c.healthz_bind_address, Some("0.0.0.0:10256".parse().unwrap()));
    assert_eq!(c.metrics_bind_address, Some("127.0.0.1:10249".parse().unwrap()));
    assert_eq!(c.extra.oom_score_adj, -999);
    match &c.source {
        Source::Api(api) => {
            assert_eq!(api.kubeconfig.as_deref(), Some(std::path::Path::new("/var/lib/kube-proxy/kubeconfig.conf")));
            assert_eq!((api.qps, api.burst, api.resync), (5.0, 10, Duration::from_secs(900)));
        }
        other => panic!("{other:?}"),
    }
    // Values in the file are used; an unknown field is refused by name.
    let tuned = KUBEADM_CONFIG.replace("mode: \"\"", "mode: nftables").replace(
        "  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nnodePortAddresses",
        "  masqueradeBit: 9\n  minSyncPeriod: 2s\n  syncPeriod: 1m\nnodePortAddresses",
    );
    assert_ne!(tuned.matches("masqueradeBit: 9").count(), 0, "the test edits the nftables section");
    std::fs::write(&path, &tuned).unwrap();
    let c = cli(&[&format!("--config={path}")]).unwrap().flags.validate().unwrap();
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert_eq!(
        (c.masquerade_bit, c.min_sync_period, c.sync_period),
        (9, Duration::from_secs(2), Duration::from_secs(60))
    );
    // An unknown field is ignored with a warning naming it (newer
    // kubeadm versions write fields an older proxy lacks).
    std::fs::write(
        &path,
        KUBEADM_CONFIG
            .replace("portRange", "portRnage")
            .replace("  syncPeriod: 0s\nipvs", "  syncPeriod: 0s\n  snatNodeInternalIP: null\n  futureField: 1\nipvs"),
    )
    .unwrap();
    let parsed = cli(&[&format!("--config={path}")]).unwrap();
    assert!(parsed.warnings.iter().any(|w| w.contains("unknown field portRnage")), "{:?}", parsed.warnings);
    assert!(parsed.warnings.iter().any(|w| w.contains("unknown field iptables.futureField")), "{:?}", parsed.warnings);
    assert!(!parsed.warnings.iter().any(|w| w.contains("snatNodeInternalIP")), "{:?}", parsed.warnings);
    // Flags the file replaces are reported; --master and a non-empty
    // --hostname-override still apply.
    std::fs::write(&path, KUBEADM_CONFIG).unwrap();
    let parsed = cli(&[
        &format!("--config={path}"),
        "--masquerade-all",
        "--master=http://10.0.0.1:8080",
        "--hostname-override=",
    ])
    .unwrap();
    assert!(parsed.warnings.iter().any(|w| w.contains("ignoring --masquerade-all")), "{:?}", parsed.warnings);
    assert_eq!(parsed.flags.master, "http://10.0.0.1:8080");
    // In nftables mode the nftables section counts, not the iptables one;
    // an explicit 0s conntrack timeout leaves the kernel's value.
    let nft = KUBEADM_CONFIG
        .replace("mode: \"\"", "mode: nftables")
        .replace(
            "  masqueradeAll: false\n  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs",
            "  masqueradeAll: true\n  masqueradeBit: 3\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs",
        )
        .replace("tcpEstablishedTimeout: null", "tcpEstablishedTimeout: 0s");
    assert!(nft.contains("masqueradeBit: 3"), "the test edits the iptables section");
    std::fs::write(&path, &nft).unwrap();
    let c = cli(&[&format!("--config={path}")]).unwrap().flags.validate().unwrap();
    assert_eq!((c.mode, c.masquerade_all, c.masquerade_bit), (ProxyMode::Nftables, false, 14));
    assert_eq!(c.conntrack.tcp_established, Duration::ZERO);
    std::fs::write(&path, KUBEADM_CONFIG.replace("v1alpha1", "v1alpha2")).unwrap();
    assert!(cli(&[&format!("--config={path}")]).err().unwrap().to_string().contains("apiVersion"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn flags(args: &[&str]) -> Flags {
    let mut all = vec!["kpx", "--manifests", "/x", "--hostname-override", "node-a"];
    all.extend_from_slice(args);
    Flags::try_parse_from(all).unwrap()
}

#[test]
fn defaults_as_upstream() {
    let c = flags(&[]).validate().unwrap();
    assert_eq!(c.min_sync_period, Duration::from_secs(1));
    assert_eq!(c.sync_period, Duration::from_secs(30));
    assert_eq!(c.masquerade_bit, 14);
    assert_eq!(c.detect_local_mode, DetectLocalMode::None);
    assert_eq!(c.node_name, "node-a");
    assert!(c.localhost_nodeports);
    assert!(!c.conntrack_tcp_be_liberal);
    assert!(c.nodeport_addresses.is_empty());
    assert_eq!(c.bind_address, None);
}

#[test]
fn bad_values_name_the_flag() {
    for (args, flag) in [
        (vec!["--iptables-masquerade-bit", "32"], "iptables-masquerade-bit"),
        (vec!["--iptables-masquerade-bit", "-1"], "iptables-masquerade-bit"),
        (vec!["--iptables-sync-period", "0"], "iptables-sync-period"),
        (vec!["--iptables-min-sync-period", "soon"], "iptables-min-sync-period"),
        (vec!["--cluster-cidr", "10.0.0.0/99"], "cluster-cidr"),
        (vec!["--proxy-mode", "carrier-pigeon"], "proxy-mode"),
        (vec!["--detect-local-mode", "Magic"], "detect-local-mode"),
        (vec!["--detect-local-mode", "BridgeInterface"], "pod-bridge-interface"),
        (vec!["--detect-local-mode", "InterfaceNamePrefix"], "pod-interface-name-prefix"),
        (vec!["--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "a/b"], "pod-bridge-interface"),
        (vec!["--nodeport-addresses", "10.0.0.0/33"], "nodeport-addresses"),
        (vec!["--nodeport-addresses", "primary,10.0.0.0/8,primary"], "nodeport-addresses"),
        (vec!["--nodeport-addresses", "Localhost"], "nodeport-addresses"),
        (vec!["--bind-address", "node-a"], "bind-address"),
        (vec!["--conntrack-max-per-core", "-1"], "conntrack-max-per-core"),
        (vec!["--conntrack-min", "-5"], "conntrack-min"),
        (vec!["--conntrack-tcp-timeout-established", "1d"], "conntrack-tcp-timeout-established"),
        (vec!["--conntrack-tcp-timeout-close-wait", "-1s"], "conntrack-tcp-timeout-close-wait"),
        (vec!["--conntrack-udp-timeout", "x"], "conntrack-udp-timeout"),
        (vec!["--conntrack-udp-timeout-stream", "5"], "conntrack-udp-timeout-stream"),
        (vec!["--proxy-mode", "ipvs", "--feature-gates", "KubeProxyIPVS=false"], "proxy-mode"),
        (vec!["--feature-gates", "PreferSameTrafficDistribution=false"], "feature-gates"),
        (vec!["--log-flush-frequency", "0"], "log-flush-frequency"),
        (vec!["--log-flush-frequency", "-1s"], "log-flush-frequency"),
    ] {
        let err = flags(&args).validate().unwrap_err().to_string();
        assert!(err.contains(&format!("--{flag}")), "{err}");
    }
}

/// kube-proxy's --help lists --log-flush-frequency (component-base's
/// logs flags); kpx's does too, with upstream's default.
#[test]
fn help_lists_log_flush_frequency() {
    use clap::CommandFactory;
    let help = Flags::command().render_long_help().to_string();
    assert!(help.contains("--log-flush-frequency"), "{help}");
    assert!(help.contains("Maximum number of seconds between log flushes"), "{help}");
    assert!(help.contains("[default: 5s]"), "{help}");
    let config =
        Cli::from_args(["kpx", "--log-flush-frequency=2s", "--hostname-override=n"].map(Into::into)).unwrap().flags;
    assert_eq!(config.log_flush_frequency, "2s");
}

#[test]
fn iptables_flags_parse() {
    let c = flags(&[
        "--nodeport-addresses",
        "192.168.0.0/16,fd00::/64",
        "--iptables-localhost-nodeports=false",
        "--conntrack-tcp-be-liberal",
        "--detect-local-mode",
        "InterfaceNamePrefix",
        "--pod-interface-name-prefix",
        "veth",
        "--bind-address",
        "192.168.0.2",
    ])
    .validate()
    .unwrap();
    assert_eq!(c.nodeport_addresses.cidrs.len(), 2);
    assert!(!c.localhost_nodeports);
    assert!(c.conntrack_tcp_be_liberal);
    assert_eq!(c.detect_local_mode, DetectLocalMode::InterfaceNamePrefix("veth".into()));
    assert_eq!(c.bind_address, Some("192.168.0.2".parse().unwrap()));
    let c = flags(&["--nodeport-addresses", "primary"]).validate().unwrap();
    assert!(c.nodeport_addresses.primary);
    let c = flags(&["--detect-local-mode", "ClusterCIDR"]).validate().unwrap();
    assert_eq!(c.detect_local_mode, DetectLocalMode::None, "upstream: no --cluster-cidr, no detection");
}

/// KEP-6032 (v1.37): `primary`, `localhost` and `all`, alone or mixed
/// with each other and with CIDRs; a keyword at most once.
#[test]
fn nodeport_address_keywords_mix_with_cidrs() {
    let parse = |s: &str| NodePortAddresses::parse(s.split(','));
    let npa = parse("primary,localhost,192.168.0.0/16").unwrap();
    assert!(npa.primary);
    let cidrs: Vec<String> = npa.cidrs.iter().map(|c| c.to_string()).collect();
    assert_eq!(cidrs, ["127.0.0.0/8", "::1/128", "192.168.0.0/16"]);
    assert_eq!(npa.given, ["primary", "localhost", "192.168.0.0/16"]);
    assert!(npa.explicit_loopback(IpFamily::V4) && npa.explicit_loopback(IpFamily::V6));
    let all = parse("all").unwrap();
    assert_eq!(all.cidrs.iter().map(|c| c.prefix_len).collect::<Vec<_>>(), [0, 0]);
    assert!(!all.explicit_loopback(IpFamily::V4), "0.0.0.0/0 holds loopback but is not loopback");
    assert!(parse("127.0.0.1/32").unwrap().explicit_loopback(IpFamily::V4));
    assert!(!parse("127.0.0.1/32").unwrap().explicit_loopback(IpFamily::V6));
    assert!(parse("").unwrap().is_empty());
    let err = parse("localhost,all,localhost").unwrap_err();
    assert!(err.contains("duplicate value \"localhost\""), "{err}");
    let err = parse("Localhost").unwrap_err();
    assert!(err.contains("one of the keywords 'primary', 'localhost', 'all'"), "{err}");
    // The flag as a whole: mixed values are valid; /configz shows them as given.
    let c = flags(&["--nodeport-addresses", "primary,10.0.0.0/8"]).validate().unwrap();
    assert!(c.nodeport_addresses.primary && c.nodeport_addresses.cidrs.len() == 1);
    let z = c.configz();
    assert_eq!(z["kubeproxy.config.k8s.io"]["nodePortAddresses"], serde_json::json!(["primary", "10.0.0.0/8"]));
}

#[test]
fn cluster_cidr_enables_detection() {
    let c = flags(&["--cluster-cidr", "10.0.0.0/8,fd00::/48"]).validate().unwrap();
    assert_eq!(c.detect_local_mode, DetectLocalMode::ClusterCidr);
    assert_eq!(c.cluster_cidrs.len(), 2);
}

#[test]
fn extensions_are_named_parametrised_and_refused_with_the_reason() {
    let c = flags(&["--extension", "limit=/x/l.wasm,default=5, action = drop", "--extension", "count2=/x/c.wasm"])
        .validate()
        .unwrap();
    assert_eq!(c.extensions.len(), 2);
    assert_eq!(c.extensions[0].name, "limit");
    assert_eq!(c.extensions[0].path, std::path::PathBuf::from("/x/l.wasm"));
    assert_eq!(c.extensions[0].parameters, [("default".into(), "5".into()), ("action".into(), "drop".into())]);
    for (bad, why) in [
        ("limit", "NAME=FILE.wasm"),
        ("=/x.wasm", "NAME=FILE.wasm"),
        ("Limit=/x.wasm", "lower-case letter"),
        ("ratelimiter1=/x.wasm", "at most 10 bytes"),
        ("a-b=/x.wasm", "lower-case letter"),
        ("a=/x.wasm,novalue", "a parameter: \"novalue\" is not key=value"),
    ] {
        let e = flags(&["--extension", bad]).validate().unwrap_err().to_string();
        assert!(e.contains(why) && e.contains("--extension"), "{bad}: {e}");
    }
    let e = flags(&["--extension", "a=/1.wasm", "--extension", "a=/2.wasm"]).validate().unwrap_err().to_string();
    assert!(e.contains("the name a is taken"), "{e}");
}

#[test]
fn the_config_file_names_plugins_in_its_kpx_section() {
    let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nkpx:\n  schedulerPlugins: [\"mine=/etc/kpx/s.wasm\"]\n  extensions: [\"ratelimit=/etc/kpx/r.wasm,default=5\"]\n  pluginCacheDir: /var/cache/x\n  colour: red\n";
    with_config_file("kpx", text, |config| {
        let parsed = cli(&[config]).unwrap();
        assert!(parsed.warnings.iter().any(|w| w.contains("unknown field kpx.colour")), "{:?}", parsed.warnings);
        let c = parsed.flags.validate().unwrap();
        assert_eq!(c.scheduler_plugins, [("mine".to_string(), std::path::PathBuf::from("/etc/kpx/s.wasm"))]);
        assert_eq!(c.extensions[0].name, "ratelimit");
        assert_eq!(c.extensions[0].parameters, [("default".to_string(), "5".to_string())]);
        assert_eq!(c.plugin_cache_dir, std::path::PathBuf::from("/var/cache/x"));
        // The command line, given too, wins.
        let c = cli(&[config, "--extension", "count=/x.wasm"]).unwrap().flags.validate().unwrap();
        assert_eq!(c.extensions.len(), 1);
        assert_eq!(c.extensions[0].name, "count");
    });
}

/// `check` with `--config=PATH` of a file holding `text`, removed after.
fn with_config_file(tag: &str, text: &str, check: impl FnOnce(&str)) {
    let dir = std::env::temp_dir().join(format!("kpx-config-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.yaml");
    std::fs::write(&path, text).unwrap();
    check(&format!("--config={}", path.display()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_endpoint_bound_is_iptables_modes_and_0_lifts_it() {
    let bound = |args: &[&str]| flags(args).validate().unwrap().max_endpoints_per_port;
    assert_eq!(bound(&["--proxy-mode", "iptables"]), None, "upstream's default: every endpoint");
    assert_eq!(bound(&["--proxy-mode", "iptables", "--iptables-max-endpoints-per-port", "5000"]), Some(5000));
    assert_eq!(bound(&["--proxy-mode", "iptables", "--iptables-max-endpoints-per-port", "20000"]), Some(20000));
    assert_eq!(bound(&["--proxy-mode", "iptables", "--iptables-max-endpoints-per-port", "0"]), None);
    assert_eq!(bound(&["--proxy-mode", "nftables"]), None);
    assert_eq!(bound(&["--proxy-mode", "ipvs"]), None);
    assert!(cli(&["--iptables-max-endpoints-per-port", "-1"]).is_err());

    let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nkpx:\n  iptablesMaxEndpointsPerPort: 700\n";
    with_config_file("bound", text, |config| {
        assert_eq!(cli(&[config]).unwrap().flags.validate().unwrap().max_endpoints_per_port, Some(700));
        let given = cli(&[config, "--iptables-max-endpoints-per-port=900"]).unwrap();
        assert_eq!(given.flags.validate().unwrap().max_endpoints_per_port, Some(900));
    });
}

#[test]
fn the_iptables_backend_is_auto_unless_named() {
    let backend = |args: &[&str]| flags(args).validate().map(|c| c.iptables_backend);
    assert_eq!(backend(&[]).unwrap(), None, "auto: decided at start");
    assert_eq!(backend(&["--iptables-backend", "legacy"]).unwrap(), Some(IptablesBackend::Legacy));
    assert_eq!(backend(&["--iptables-backend=nft"]).unwrap(), Some(IptablesBackend::Nft));
    assert_eq!(backend(&["--iptables-backend=system"]).unwrap(), Some(IptablesBackend::System));
    assert!(cli(&["--iptables-backend=xtables"]).is_err());
    let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nkpx:\n  iptablesBackend: legacy\n";
    with_config_file("backend", text, |config| {
        assert_eq!(cli(&[config]).unwrap().flags.validate().unwrap().iptables_backend, Some(IptablesBackend::Legacy));
        let given = cli(&[config, "--iptables-backend=nft"]).unwrap();
        assert_eq!(given.flags.validate().unwrap().iptables_backend, Some(IptablesBackend::Nft));
    });
    let text = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nkpx:\n  iptablesBackend: xtables\n";
    with_config_file("backend-bad", text, |config| {
        let e = cli(&[config]).unwrap().flags.validate().unwrap_err().to_string();
        assert!(e.contains("--iptables-backend") && e.contains("xtables"), "{e}");
    });
}
