//! The flag set: kube-proxy's command-line flags with their names and
//! defaults, as clap parses them, before validation makes a [`Config`](super::Config) of them.

use std::path::PathBuf;

use clap::Parser;

#[derive(Debug, Clone, Parser)]
#[command(name = "kpx", disable_version_flag = true, args_override_self = true)]
pub struct Flags {
    /// --version, --version=raw prints version information and quits; --version=vX.Y.Z... sets the reported version (kpx reports its own).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub version: Option<String>,

    /// Which proxy mode to use: 'iptables', 'nftables', 'ipvs' or 'userspace'. Blank (the default): the best available, iptables, falling back to userspace when iptables mode's own needs are missing (kube-proxy v1.12's rule).
    #[arg(long = "proxy-mode", default_value = "")]
    pub proxy_mode: String,

    /// kpx: read objects from a YAML or JSON file, or a directory of them
    /// (v1 Service, discovery.k8s.io/v1 EndpointSlice, v1 Node, networking.k8s.io/v1
    /// ServiceCIDR), watched for changes, instead of the Kubernetes API.
    #[arg(long)]
    pub manifests: Option<PathBuf>,

    /// Path to kubeconfig file with authorization information (the master location can be overridden by --master).
    #[arg(long, default_value = "")]
    pub kubeconfig: String,

    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long, default_value = "")]
    pub master: String,

    /// QPS to use while talking with the Kubernetes API server.
    #[arg(long = "kube-api-qps", default_value_t = 5.0)]
    pub kube_api_qps: f32,

    /// Burst to use while talking with the Kubernetes API server.
    #[arg(long = "kube-api-burst", default_value_t = 10, allow_negative_numbers = true)]
    pub kube_api_burst: i32,

    /// Content type of requests sent to the API server.
    #[arg(long = "kube-api-content-type", default_value = "application/vnd.kubernetes.protobuf")]
    pub kube_api_content_type: String,

    /// How often configuration from the API server is refreshed. Must be greater than 0.
    #[arg(long = "config-sync-period", default_value = "15m0s", allow_hyphen_values = true)]
    pub config_sync_period: String,

    /// The IP address with port for the health check server to serve on (set to '0.0.0.0:10256' for all IPv4 interfaces and '[::]:10256' for all IPv6 interfaces). Set empty to disable.
    #[arg(long = "healthz-bind-address", default_value = "0.0.0.0:10256")]
    pub healthz_bind_address: String,

    /// The IP address with port for the metrics server to serve on (set to '0.0.0.0:10249' for all IPv4 interfaces and '[::]:10249' for all IPv6 interfaces). Set empty to disable.
    #[arg(long = "metrics-bind-address", default_value = "127.0.0.1:10249")]
    pub metrics_bind_address: String,

    /// Deprecated (kube-proxy v1.12-v1.16): the port of the health check server; 0 disables it. Use --healthz-bind-address.
    #[arg(long = "healthz-port", allow_negative_numbers = true)]
    pub healthz_port: Option<i32>,

    /// Deprecated (kube-proxy v1.12-v1.16): the port of the metrics server; 0 disables it. Use --metrics-bind-address.
    #[arg(long = "metrics-port", allow_negative_numbers = true)]
    pub metrics_port: Option<i32>,

    /// If non-empty, will be used as the name of the Node that kpx is running on.
    #[arg(long = "hostname-override", default_value = "")]
    pub hostname_override: String,

    /// The CIDR range of the pods in the cluster (a comma-separated dual-stack pair allowed).
    #[arg(long = "cluster-cidr", default_value = "")]
    pub cluster_cidr: String,

    /// Mode to use to detect local traffic: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix.
    #[arg(long = "detect-local-mode", default_value = "")]
    pub detect_local_mode: String,

    /// A bridge interface name; with --detect-local-mode BridgeInterface, traffic arriving on it is local.
    #[arg(long = "pod-bridge-interface", default_value = "")]
    pub pod_bridge_interface: String,

    /// An interface name prefix; with --detect-local-mode InterfaceNamePrefix, traffic arriving on a matching interface is local.
    #[arg(long = "pod-interface-name-prefix", default_value = "")]
    pub pod_interface_name_prefix: String,

    /// A list of CIDR ranges that contain valid node IPs, and any of the keywords 'primary' (the node's primary IPs, from the Node object), 'localhost' (the node's loopback addresses) and 'all' (all addresses), in any combination. Connections to NodePort services are only accepted on node IPs in one of the ranges. Empty: all local addresses in iptables and ipvs modes, 'primary' in nftables mode. In nftables mode, with the KubeProxyNFTablesLocalhostNodePorts feature gate (on by default), localhost node ports are rejected, or relayed by kpx when an explicitly loopback range (such as 'localhost') is given.
    #[arg(long = "nodeport-addresses", default_value = "", value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,

    /// If false, kpx disables the legacy behaviour of allowing NodePort services to be accessed via localhost (iptables mode, IPv4 only).
    #[arg(long = "iptables-localhost-nodeports", default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub iptables_localhost_nodeports: bool,

    /// Enable liberal TCP conntrack (nf_conntrack_tcp_be_liberal = 1); packets in INVALID state are then not dropped.
    #[arg(long = "conntrack-tcp-be-liberal", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub conntrack_tcp_be_liberal: bool,

    /// Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore --conntrack-min).
    #[arg(long = "conntrack-max-per-core", default_value_t = 32768, allow_negative_numbers = true)]
    pub conntrack_max_per_core: i32,

    /// Minimum number of conntrack entries to allocate, regardless of --conntrack-max-per-core.
    #[arg(long = "conntrack-min", default_value_t = 131072, allow_negative_numbers = true)]
    pub conntrack_min: i32,

    /// Idle timeout for established TCP connections (0 to leave as-is).
    #[arg(long = "conntrack-tcp-timeout-established", default_value = "24h0m0s", allow_hyphen_values = true)]
    pub conntrack_tcp_timeout_established: String,

    /// NAT timeout for TCP connections in the CLOSE_WAIT state.
    #[arg(long = "conntrack-tcp-timeout-close-wait", default_value = "1h0m0s", allow_hyphen_values = true)]
    pub conntrack_tcp_timeout_close_wait: String,

    /// Idle timeout for UNREPLIED UDP connections (0 to leave as-is).
    #[arg(long = "conntrack-udp-timeout", default_value = "0s", allow_hyphen_values = true)]
    pub conntrack_udp_timeout: String,

    /// Idle timeout for ASSURED UDP connections (0 to leave as-is).
    #[arg(long = "conntrack-udp-timeout-stream", default_value = "0s", allow_hyphen_values = true)]
    pub conntrack_udp_timeout_stream: String,

    /// If true, remove the rules kpx (or kube-proxy) created, and exit.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub cleanup: bool,

    /// Overrides kpx's idea of the node's primary IP (0.0.0.0 or :: leaves it to the Node object).
    #[arg(long = "bind-address", default_value = "0.0.0.0")]
    pub bind_address: String,

    /// SNAT all traffic sent via Service cluster IPs.
    #[arg(long = "masquerade-all", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub masquerade_all: bool,

    /// The bit of the fwmark space to mark packets requiring SNAT with. Must be within [0, 31].
    #[arg(long = "iptables-masquerade-bit", default_value_t = 14, allow_negative_numbers = true)]
    pub iptables_masquerade_bit: i32,

    /// The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'); 0 resyncs on every change.
    #[arg(long = "iptables-min-sync-period", default_value = "1s", allow_hyphen_values = true)]
    pub iptables_min_sync_period: String,

    /// An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-syncing operations are performed. Must be greater than 0.
    #[arg(long = "iptables-sync-period", default_value = "30s", allow_hyphen_values = true)]
    pub iptables_sync_period: String,

    /// kpx: a backend component (.wasm) to use instead of the mode's built-in one.
    #[arg(long = "backend-plugin")]
    pub backend_plugin: Option<PathBuf>,

    /// kpx: a parameter of the backend component, KEY=VALUE (repeatable); it reads it from its settings as `param.KEY`.
    #[arg(long = "backend-param", action = clap::ArgAction::Append)]
    pub backend_param: Vec<String>,

    /// kpx: a scheduler component, NAME=FILE.wasm (repeatable); its schedulers are chosen by the kpx.dev/scheduler annotation and take precedence over built-in ones of the same name.
    #[arg(long = "scheduler-plugin", action = clap::ArgAction::Append)]
    pub scheduler_plugin: Vec<String>,

    /// kpx: an extension component, NAME=FILE.wasm[,key=value...] (repeatable; iptables and nftables modes): NAME ([a-z][a-z0-9]*, at most 10 bytes) names its chains KUBE-X-NAME-*, its nftables table kpx-NAME and its Service annotations ext.kpx.dev/NAME.*; the key=value pairs are its parameters.
    #[arg(long = "extension", action = clap::ArgAction::Append)]
    pub extension: Vec<String>,

    /// kpx: where compiled plugins are cached.
    #[arg(long = "plugin-cache-dir", default_value = "/var/cache/kpx")]
    pub plugin_cache_dir: PathBuf,

    /// kpx: memory limit of one plugin instance, in MiB.
    #[arg(long = "plugin-memory-limit-mib", default_value_t = 1024)]
    pub plugin_memory_limit_mib: u64,

    /// kpx: base fuel (about one unit per WebAssembly instruction) of one plugin call; the host adds a share per object in the state.
    #[arg(long = "plugin-fuel", default_value_t = 2_000_000_000)]
    pub plugin_fuel: u64,

    /// kpx: largest ruleset a plugin may return, in MiB.
    #[arg(long = "plugin-max-output-mib", default_value_t = 256)]
    pub plugin_max_output_mib: u64,

    /// The path to the configuration file (a KubeProxyConfiguration).
    #[arg(long, default_value = "")]
    pub config: String,

    /// If set, write the default configuration values to this file and exit.
    #[arg(long = "write-config-to", default_value = "")]
    pub write_config_to: String,

    /// If true, perform any initialization steps that must run with full root privileges, and then exit.
    #[arg(long = "init-only", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub init_only: bool,

    /// A set of key=value pairs that describe feature gates for alpha/experimental features.
    #[arg(long = "feature-gates", default_value = "")]
    pub feature_gates: String,

    /// The oom-score-adj value for the kpx process. Values must be within the range [-1000, 1000].
    #[arg(long = "oom-score-adj", default_value_t = -999, allow_negative_numbers = true)]
    pub oom_score_adj: i32,

    /// If true kpx will treat failure to bind to a port as fatal and exit.
    #[arg(long = "bind-address-hard-fail", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub bind_address_hard_fail: bool,

    /// If true enables profiling via web interface on /debug/pprof handler (Go's; kpx has none: only false is accepted).
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub profiling: bool,

    /// The previous version for which you want to show hidden metrics (kpx hides none).
    #[arg(long = "show-hidden-metrics-for-version", default_value = "")]
    pub show_hidden_metrics_for_version: String,

    /// The ipvs scheduler type when proxy mode is ipvs.
    #[arg(long = "ipvs-scheduler", default_value = "")]
    pub ipvs_scheduler: String,

    /// The maximum interval of how often ipvs rules are refreshed. Must be greater than 0.
    #[arg(long = "ipvs-sync-period", default_value = "30s", allow_hyphen_values = true)]
    pub ipvs_sync_period: String,

    /// The minimum interval of how often the ipvs rules can be refreshed as endpoints and services change.
    #[arg(long = "ipvs-min-sync-period", default_value = "1s", allow_hyphen_values = true)]
    pub ipvs_min_sync_period: String,

    /// A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.
    #[arg(long = "ipvs-exclude-cidrs", default_value = "", value_delimiter = ',')]
    pub ipvs_exclude_cidrs: Vec<String>,

    /// Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2.
    #[arg(long = "ipvs-strict-arp", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub ipvs_strict_arp: bool,

    /// The timeout for idle IPVS TCP connections, 0 to leave as-is.
    #[arg(long = "ipvs-tcp-timeout", default_value = "0s", allow_hyphen_values = true)]
    pub ipvs_tcp_timeout: String,

    /// The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is.
    #[arg(long = "ipvs-tcpfin-timeout", default_value = "0s", allow_hyphen_values = true)]
    pub ipvs_tcpfin_timeout: String,

    /// The timeout for IPVS UDP packets, 0 to leave as-is.
    #[arg(long = "ipvs-udp-timeout", default_value = "0s", allow_hyphen_values = true)]
    pub ipvs_udp_timeout: String,

    /// Deprecated (kube-proxy v1.12): if true, clean up IPVS rules before running.
    #[arg(long = "cleanup-ipvs", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub cleanup_ipvs: Option<bool>,

    /// Range of host ports (beginPort-endPort, single port or beginPort+offset, inclusive) that may be consumed to proxy service traffic (userspace mode).
    #[arg(long = "proxy-port-range", default_value = "")]
    pub proxy_port_range: String,

    /// How long an idle UDP connection will be kept open (userspace mode).
    #[arg(long = "udp-timeout", default_value = "250ms", allow_hyphen_values = true)]
    pub udp_timeout: String,

    /// kpx: in iptables mode, the most endpoints one service port programs (0, the default: every endpoint, as kube-proxy). Every rule in the nat table costs each later change of any Service (the kernel validates every reachable rule at each commit: with 100,000 endpoints behind one port, another Service's change takes 5x as long); over the bound a port keeps its local endpoints and a stable share of the others, and says so in the log and in kpx_endpoints_not_programmed.
    #[arg(long = "iptables-max-endpoints-per-port", default_value_t = 0)]
    pub iptables_max_endpoints_per_port: usize,

    /// kpx: the iptables kpx runs: auto (the default: as kube-proxy's image chooses, nft where kubelet's KUBE-IPTABLES-HINT chain is in nft's mangle table, legacy where it is in legacy's, else the backend holding more rules, nft on a tie), nft (iptables-nft), legacy (iptables-legacy), or system (iptables as found on PATH).
    #[arg(long = "iptables-backend", default_value = "auto", value_parser = ["auto", "nft", "legacy", "system"])]
    pub iptables_backend: String,

    /// kpx, deprecated: in nftables mode, adds 'localhost' to --nodeport-addresses (upstream's way since v1.37), so that kpx's TCP relay serves node ports on 127.0.0.1 and ::1.
    #[arg(long = "localhost-nodeports-proxy", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub localhost_nodeports_proxy: bool,

    /// Removed from kube-proxy (v1.12-v1.16 documented it): the Azure container registry configuration; no effect.
    #[arg(long = "azure-container-registry-config", default_value = "")]
    pub azure_container_registry_config: String,

    /// klog: log to standard error instead of files.
    #[arg(long = "logtostderr", default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub logtostderr: bool,

    /// klog: log to standard error as well as files (no effect when -logtostderr=true).
    #[arg(long = "alsologtostderr", default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub alsologtostderr: bool,

    /// klog: if non-empty, use this log file (no effect when -logtostderr=true).
    #[arg(long = "log-file", default_value = "")]
    pub log_file: String,

    /// klog: if non-empty, write log files in this directory (no effect when -logtostderr=true).
    #[arg(long = "log-dir", default_value = "")]
    pub log_dir: String,

    /// klog: comma-separated list of pattern=N settings for file-filtered logging (kpx: module=N, e.g. sync=4).
    #[arg(long, default_value = "")]
    pub vmodule: String,

    /// Sets the log format: text or json.
    #[arg(long = "logging-format", default_value = "text")]
    pub logging_format: String,

    /// klog's formatting and flushing flags, accepted for compatibility;
    /// kpx's log lines have their own format and are not buffered.
    #[arg(long = "add-dir-header", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub add_dir_header: Option<bool>,
    #[arg(long = "skip-headers", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub skip_headers: Option<bool>,
    #[arg(long = "skip-log-headers", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub skip_log_headers: Option<bool>,
    #[arg(long = "one-output", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub one_output: Option<bool>,
    #[arg(long = "log-text-split-stream", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = go_bool, action = clap::ArgAction::Set)]
    pub log_text_split_stream: Option<bool>,
    #[arg(long = "stderrthreshold", hide = true)]
    pub stderrthreshold: Option<String>,
    #[arg(long = "log-backtrace-at", hide = true)]
    pub log_backtrace_at: Option<String>,
    #[arg(long = "log-file-max-size", hide = true)]
    pub log_file_max_size: Option<u64>,
    /// Maximum number of seconds between log flushes (kpx writes each log line at once: accepted and checked, no effect).
    #[arg(long = "log-flush-frequency", default_value = "5s", allow_hyphen_values = true)]
    pub log_flush_frequency: String,
    #[arg(long = "log-text-info-buffer-size", hide = true)]
    pub log_text_info_buffer_size: Option<String>,

    /// Number for the log level verbosity (0-10).
    #[arg(long = "v", short = 'v', default_value_t = 2)]
    pub verbosity: u8,

    /// Every flag with its value as given, or its default, for /flagz
    /// (filled by [`crate::cli::Cli::from_args`]).
    #[arg(skip)]
    pub flagz: Vec<(String, String)>,
}

/// Go's `strconv.ParseBool`, which Kubernetes' boolean flags use.
pub fn go_bool(text: &str) -> std::result::Result<bool, String> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(format!("{other:?} is not a boolean (1, t, T, true, TRUE, True, 0, f, F, false, FALSE, False)")),
    }
}

impl Flags {
    /// The node's name: --hostname-override, else the host name the kernel
    /// reports (upstream's defaulting step, and the one read from the host
    /// that validation needs).
    pub fn node_name(&self) -> super::Result<String> {
        Ok(if self.hostname_override.trim().is_empty() {
            std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(super::Error::NodeName)?.trim().to_lowercase()
        } else {
            self.hostname_override.trim().to_lowercase()
        })
    }

    /// Every flag at its default.
    pub fn defaults() -> Flags {
        Flags::parse_from(["kpx"])
    }

    /// Copies one flag's value (by its clap id) from `other` if it is one
    /// that --config does not override; false for the others.
    pub(crate) fn copy_arg(&mut self, other: &Flags, id: &str) -> bool {
        match id {
            // As upstream: a non-empty --hostname-override wins over the file.
            "hostname_override" => {
                if !other.hostname_override.trim().is_empty() {
                    self.hostname_override = other.hostname_override.clone();
                }
            }
            "master" => self.master = other.master.clone(),
            "version" => self.version = other.version.clone(),
            "verbosity" => self.verbosity = other.verbosity,
            "vmodule" => self.vmodule = other.vmodule.clone(),
            "logtostderr" => self.logtostderr = other.logtostderr,
            "alsologtostderr" => self.alsologtostderr = other.alsologtostderr,
            "log_file" => self.log_file = other.log_file.clone(),
            "log_dir" => self.log_dir = other.log_dir.clone(),
            "logging_format" => self.logging_format = other.logging_format.clone(),
            "log_flush_frequency" => self.log_flush_frequency = other.log_flush_frequency.clone(),
            "manifests" => self.manifests = other.manifests.clone(),
            "backend_plugin" => self.backend_plugin = other.backend_plugin.clone(),
            "backend_param" => self.backend_param = other.backend_param.clone(),
            "scheduler_plugin" => self.scheduler_plugin = other.scheduler_plugin.clone(),
            "extension" => self.extension = other.extension.clone(),
            "plugin_cache_dir" => self.plugin_cache_dir = other.plugin_cache_dir.clone(),
            "plugin_memory_limit_mib" => self.plugin_memory_limit_mib = other.plugin_memory_limit_mib,
            "plugin_fuel" => self.plugin_fuel = other.plugin_fuel,
            "plugin_max_output_mib" => self.plugin_max_output_mib = other.plugin_max_output_mib,
            "iptables_max_endpoints_per_port" => {
                self.iptables_max_endpoints_per_port = other.iptables_max_endpoints_per_port
            }
            "iptables_backend" => self.iptables_backend = other.iptables_backend.clone(),
            "config" => self.config = other.config.clone(),
            "cleanup" => self.cleanup = other.cleanup,
            "write_config_to" => self.write_config_to = other.write_config_to.clone(),
            "init_only" => self.init_only = other.init_only,
            _ => return false,
        }
        true
    }
}
