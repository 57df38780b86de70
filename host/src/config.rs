//! Command-line flags with kube-proxy's names and defaults, validated into
//! a [`Config`]. Bad values are refused with the flag's name.

mod duration;

pub use duration::{format_duration, parse_duration};

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kpx_rules::model::{Cidr, ProxyMode};

/// Why the flags cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag has a value kpx refuses; exit with this message.
    #[error("invalid value {value:?} for --{flag}: {reason}")]
    InvalidFlag { flag: &'static str, value: String, reason: String },
    /// The host name could not be read and --hostname-override is empty.
    #[error("cannot determine the node name: {0} (set --hostname-override)")]
    NodeName(std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// kpx: a Kubernetes service proxy whose proxy modes are sandboxed WebAssembly components.
/// The command line: kube-proxy's flags, or a kpx subcommand.
#[derive(Debug, Parser)]
#[command(name = "kpx", version = crate::VERSION_TEXT, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub flags: Flags,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Explain where a packet goes through this node's live rules.
    Trace(TraceArgs),
}

/// `kpx trace --from IP --to IP:PORT/PROTO [--mode M]`.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// The packet's source address (one of the node's own means the node sends it).
    #[arg(long)]
    pub from: std::net::IpAddr,
    /// Destination as IP:PORT/PROTO, e.g. 10.96.0.10:80/tcp or [fd00::10]:53/udp.
    #[arg(long)]
    pub to: String,
    /// The interface the packet arrives on (for interface-based local detection).
    #[arg(long = "in-interface")]
    pub in_interface: Option<String>,
    /// Which mode's rules to read: iptables or nftables.
    #[arg(long, default_value = "iptables")]
    pub mode: String,
    /// The masquerade mark bit kpx runs with (--iptables-masquerade-bit).
    #[arg(long = "iptables-masquerade-bit", default_value_t = 14)]
    pub masquerade_bit: u8,
}

#[derive(Debug, Parser)]
#[command(name = "kpx", version = crate::VERSION_TEXT)]
pub struct Flags {
    /// Which proxy mode to use: 'iptables' (default) or 'nftables'.
    #[arg(long = "proxy-mode", default_value = "iptables")]
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

    /// Comma-separated CIDRs (or "primary") of the node addresses that accept NodePort traffic; empty means all local addresses.
    #[arg(long = "nodeport-addresses", default_value = "", value_delimiter = ',')]
    pub nodeport_addresses: Vec<String>,

    /// If false, kpx disables the legacy behaviour of allowing NodePort services to be accessed via localhost (iptables mode, IPv4 only).
    #[arg(long = "iptables-localhost-nodeports", default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub iptables_localhost_nodeports: bool,

    /// Enable liberal TCP conntrack (nf_conntrack_tcp_be_liberal = 1); packets in INVALID state are then not dropped.
    #[arg(long = "conntrack-tcp-be-liberal", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
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
    #[arg(long, default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub cleanup: bool,

    /// Overrides kpx's idea of the node's primary IP (0.0.0.0 or :: leaves it to the Node object).
    #[arg(long = "bind-address", default_value = "0.0.0.0")]
    pub bind_address: String,

    /// SNAT all traffic sent via Service cluster IPs.
    #[arg(long = "masquerade-all", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
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

    /// Number for the log level verbosity (0-10).
    #[arg(long = "v", short = 'v', default_value_t = 2)]
    pub verbosity: u8,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: ProxyMode,
    pub source: Source,
    /// --healthz-bind-address (None: disabled).
    pub healthz_bind_address: Option<std::net::SocketAddr>,
    /// --metrics-bind-address (None: disabled).
    pub metrics_bind_address: Option<std::net::SocketAddr>,
    pub node_name: String,
    pub cluster_cidrs: Vec<Cidr>,
    pub detect_local_mode: DetectLocalMode,
    pub nodeport_addresses: NodePortAddresses,
    pub localhost_nodeports: bool,
    pub conntrack_tcp_be_liberal: bool,
    pub conntrack: Conntrack,
    pub cleanup: bool,
    /// --bind-address when it names an address.
    pub bind_address: Option<std::net::IpAddr>,
    pub masquerade_all: bool,
    pub masquerade_bit: u8,
    pub min_sync_period: Duration,
    pub sync_period: Duration,
    pub backend_plugin: Option<PathBuf>,
    pub plugin_cache_dir: PathBuf,
    pub plugin_limits: crate::runtime::Limits,
    pub verbosity: u8,
}

/// Where kpx reads Kubernetes objects from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// --manifests.
    Manifests(PathBuf),
    /// The Kubernetes API.
    Api(ApiConfig),
}

/// How to reach the Kubernetes API server.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiConfig {
    /// --kubeconfig; None: --master alone, or the in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// --master.
    pub master: Option<String>,
    /// Requests per second (0: unlimited) and burst.
    pub qps: f32,
    pub burst: u32,
    /// --config-sync-period: how often the source re-reads the whole state
    /// from its cache (the informers' resync).
    pub resync: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetectLocalMode {
    /// No local-traffic detection (ClusterCIDR mode without --cluster-cidr).
    None,
    /// Sources inside --cluster-cidr are local.
    ClusterCidr,
    /// Sources inside the Node's spec.podCIDRs are local.
    NodeCidr,
    /// Traffic arriving on this bridge is local.
    BridgeInterface(String),
    /// Traffic arriving on interfaces with this prefix is local.
    InterfaceNamePrefix(String),
}

/// kube-proxy's conntrack settings; zero leaves a value as the kernel has it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Conntrack {
    pub max_per_core: u32,
    pub min: u32,
    pub tcp_established: std::time::Duration,
    pub tcp_close_wait: std::time::Duration,
    pub udp: std::time::Duration,
    pub udp_stream: std::time::Duration,
}

/// --nodeport-addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePortAddresses {
    pub cidrs: Vec<Cidr>,
    /// "primary" was given: the node's primary IP of each family.
    pub primary: bool,
}

impl NodePortAddresses {
    pub fn match_all(&self) -> bool {
        self.cidrs.is_empty() && !self.primary
    }
}

fn invalid(flag: &'static str, value: &str, reason: impl Into<String>) -> Error {
    Error::InvalidFlag { flag, value: value.to_string(), reason: reason.into() }
}

impl Config {
    /// `/configz`: the configuration in effect, under upstream's
    /// `KubeProxyConfiguration` field names.
    pub fn configz(&self) -> serde_json::Value {
        let d = |d: Duration| format_duration(d);
        let addr = |a: Option<std::net::SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
        let (detect_local_mode, bridge, prefix) = match &self.detect_local_mode {
            DetectLocalMode::None => ("", "", ""),
            DetectLocalMode::ClusterCidr => ("ClusterCIDR", "", ""),
            DetectLocalMode::NodeCidr => ("NodeCIDR", "", ""),
            DetectLocalMode::BridgeInterface(b) => ("BridgeInterface", b.as_str(), ""),
            DetectLocalMode::InterfaceNamePrefix(p) => ("InterfaceNamePrefix", "", p.as_str()),
        };
        let mut node_port_addresses: Vec<String> =
            self.nodeport_addresses.cidrs.iter().map(|c| c.to_string()).collect();
        if self.nodeport_addresses.primary {
            node_port_addresses.push("primary".into());
        }
        let client = match &self.source {
            Source::Api(api) => serde_json::json!({
                "kubeconfig": api.kubeconfig.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                "qps": api.qps, "burst": api.burst, "contentType": "application/json",
            }),
            Source::Manifests(_) => serde_json::json!({}),
        };
        serde_json::json!({"kubeproxy.config.k8s.io": {
            "kind": "KubeProxyConfiguration",
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "mode": self.mode.as_str(),
            "hostnameOverride": self.node_name,
            "bindAddress": self.bind_address.map(|a| a.to_string()).unwrap_or_else(|| "0.0.0.0".into()),
            "healthzBindAddress": addr(self.healthz_bind_address),
            "metricsBindAddress": addr(self.metrics_bind_address),
            "clusterCIDR": self.cluster_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
            "detectLocalMode": detect_local_mode,
            "detectLocal": {"bridgeInterface": bridge, "interfaceNamePrefix": prefix},
            "nodePortAddresses": node_port_addresses,
            "clientConnection": client,
            "configSyncPeriod": match &self.source { Source::Api(api) => d(api.resync), Source::Manifests(_) => String::new() },
            "syncPeriod": d(self.sync_period),
            "minSyncPeriod": d(self.min_sync_period),
            "iptables": {
                "masqueradeAll": self.masquerade_all,
                "masqueradeBit": self.masquerade_bit,
                "localhostNodePorts": self.localhost_nodeports,
                "syncPeriod": d(self.sync_period),
                "minSyncPeriod": d(self.min_sync_period),
            },
            "conntrack": {
                "maxPerCore": self.conntrack.max_per_core,
                "min": self.conntrack.min,
                "tcpEstablishedTimeout": d(self.conntrack.tcp_established),
                "tcpCloseWaitTimeout": d(self.conntrack.tcp_close_wait),
                "tcpBeLiberal": self.conntrack_tcp_be_liberal,
                "udpTimeout": d(self.conntrack.udp),
                "udpStreamTimeout": d(self.conntrack.udp_stream),
            },
        }})
    }
}

/// A server's `IP:PORT` (`[IPv6]:PORT`; an IP alone takes the default
/// port; empty disables it), with the port the deprecated `--*-port` flag
/// sets (0 disables).
fn server_address(
    flag: &'static str,
    value: &str,
    default_port: u16,
    (port_flag, port): (&'static str, Option<i32>),
) -> Result<Option<std::net::SocketAddr>> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let mut addr = match value.parse::<std::net::SocketAddr>() {
        Ok(a) => a,
        Err(_) => match value.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
            Ok(ip) => std::net::SocketAddr::new(ip, default_port),
            Err(_) => {
                return Err(invalid(flag, value, "an IP:PORT ([IPv6]:PORT for IPv6), an IP, or empty to disable"));
            }
        },
    };
    if let Some(port) = port {
        tracing::warn!("--{port_flag} is deprecated (kube-proxy replaced it with --{flag}); using it");
        match u16::try_from(port) {
            Ok(0) => return Ok(None),
            Ok(p) => addr.set_port(p),
            Err(_) => return Err(invalid(port_flag, &port.to_string(), "a port in 0..65535 (0 disables)")),
        }
    }
    Ok(Some(addr))
}

impl Flags {
    /// --manifests, or the API server as --kubeconfig / --master / the
    /// in-cluster configuration name it.
    fn source(&self) -> Result<Source> {
        if let Some(path) = &self.manifests {
            for (flag, value) in [("kubeconfig", &self.kubeconfig), ("master", &self.master)] {
                if !value.is_empty() {
                    return Err(invalid(flag, value, "kpx reads either --manifests or the API server, not both"));
                }
            }
            return Ok(Source::Manifests(path.clone()));
        }
        match self.kube_api_content_type.as_str() {
            "application/json" | "application/vnd.kubernetes.protobuf" => {}
            other => {
                return Err(invalid(
                    "kube-api-content-type",
                    other,
                    "application/json or application/vnd.kubernetes.protobuf (kpx's client speaks JSON either way)",
                ));
            }
        }
        if self.kube_api_qps.is_nan() {
            return Err(invalid("kube-api-qps", "NaN", "a number"));
        }
        // As client-go: 0 means the defaults (5 QPS, burst 10); a negative
        // QPS turns the limit off.
        let qps = if self.kube_api_qps == 0.0 { 5.0 } else { self.kube_api_qps.max(0.0) };
        let burst = match self.kube_api_burst {
            0 => 10,
            b if b < 0 => {
                return Err(invalid("kube-api-burst", &b.to_string(), "must not be negative"));
            }
            b => b as u32,
        };
        let resync = parse_duration(&self.config_sync_period)
            .map_err(|e| invalid("config-sync-period", &self.config_sync_period, e))?;
        if resync.is_zero() {
            return Err(invalid("config-sync-period", &self.config_sync_period, "must be greater than 0"));
        }
        Ok(Source::Api(ApiConfig {
            kubeconfig: (!self.kubeconfig.is_empty()).then(|| PathBuf::from(&self.kubeconfig)),
            master: (!self.master.is_empty()).then(|| self.master.clone()),
            qps,
            burst,
            resync,
        }))
    }

    pub fn validate(self) -> Result<Config> {
        let mode: ProxyMode = self
            .proxy_mode
            .parse()
            .map_err(|_| invalid("proxy-mode", &self.proxy_mode, "this kpx supports: iptables, nftables"))?;
        let node_name = if self.hostname_override.trim().is_empty() {
            std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(Error::NodeName)?.trim().to_lowercase()
        } else {
            self.hostname_override.trim().to_lowercase()
        };
        let mut cluster_cidrs: Vec<Cidr> = Vec::new();
        for part in self.cluster_cidr.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let cidr: Cidr = part.parse().map_err(|e| invalid("cluster-cidr", &self.cluster_cidr, format!("{e}")))?;
            if cluster_cidrs.iter().any(|c| c.family() == cidr.family()) {
                return Err(invalid("cluster-cidr", &self.cluster_cidr, "at most one CIDR per IP family"));
            }
            cluster_cidrs.push(cidr);
        }
        let detect_local_mode = match self.detect_local_mode.as_str() {
            "" | "ClusterCIDR" if cluster_cidrs.is_empty() => DetectLocalMode::None,
            "" | "ClusterCIDR" => DetectLocalMode::ClusterCidr,
            "NodeCIDR" => DetectLocalMode::NodeCidr,
            "BridgeInterface" => {
                let name = self.pod_bridge_interface.trim();
                if name.is_empty() {
                    return Err(invalid(
                        "pod-bridge-interface",
                        name,
                        "required with --detect-local-mode BridgeInterface",
                    ));
                }
                check_interface_name("pod-bridge-interface", name)?;
                DetectLocalMode::BridgeInterface(name.to_string())
            }
            "InterfaceNamePrefix" => {
                let prefix = self.pod_interface_name_prefix.trim();
                if prefix.is_empty() {
                    return Err(invalid(
                        "pod-interface-name-prefix",
                        prefix,
                        "required with --detect-local-mode InterfaceNamePrefix",
                    ));
                }
                check_interface_name("pod-interface-name-prefix", prefix)?;
                DetectLocalMode::InterfaceNamePrefix(prefix.to_string())
            }
            other => {
                return Err(invalid(
                    "detect-local-mode",
                    other,
                    "want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix",
                ));
            }
        };
        let mut nodeport_addresses = NodePortAddresses::default();
        for item in self.nodeport_addresses.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            if item == "primary" {
                nodeport_addresses.primary = true;
                continue;
            }
            let cidr: Cidr = item.parse().map_err(|e| invalid("nodeport-addresses", item, format!("{e}")))?;
            nodeport_addresses.cidrs.push(cidr);
        }
        if nodeport_addresses.primary && !nodeport_addresses.cidrs.is_empty() {
            return Err(invalid(
                "nodeport-addresses",
                &self.nodeport_addresses.join(","),
                "\"primary\" cannot be combined with CIDRs",
            ));
        }
        let non_negative = |flag: &'static str, value: i32| {
            u32::try_from(value).map_err(|_| invalid(flag, &value.to_string(), "must be greater than or equal to 0"))
        };
        let duration = |flag: &'static str, text: &str| parse_duration(text).map_err(|e| invalid(flag, text, e));
        let conntrack = Conntrack {
            max_per_core: non_negative("conntrack-max-per-core", self.conntrack_max_per_core)?,
            min: non_negative("conntrack-min", self.conntrack_min)?,
            tcp_established: duration("conntrack-tcp-timeout-established", &self.conntrack_tcp_timeout_established)?,
            tcp_close_wait: duration("conntrack-tcp-timeout-close-wait", &self.conntrack_tcp_timeout_close_wait)?,
            udp: duration("conntrack-udp-timeout", &self.conntrack_udp_timeout)?,
            udp_stream: duration("conntrack-udp-timeout-stream", &self.conntrack_udp_timeout_stream)?,
        };
        let bind_address = match self.bind_address.trim() {
            "" => None,
            text => {
                let ip: std::net::IpAddr =
                    text.parse().map_err(|_| invalid("bind-address", text, "not an IP address"))?;
                (!ip.is_unspecified()).then_some(ip)
            }
        };
        if !(0..=31).contains(&self.iptables_masquerade_bit) {
            return Err(invalid(
                "iptables-masquerade-bit",
                &self.iptables_masquerade_bit.to_string(),
                "must be within [0, 31]",
            ));
        }
        let min_sync_period = parse_duration(&self.iptables_min_sync_period)
            .map_err(|e| invalid("iptables-min-sync-period", &self.iptables_min_sync_period, e))?;
        let sync_period = parse_duration(&self.iptables_sync_period)
            .map_err(|e| invalid("iptables-sync-period", &self.iptables_sync_period, e))?;
        if sync_period.is_zero() {
            return Err(invalid("iptables-sync-period", &self.iptables_sync_period, "must be greater than 0"));
        }
        if min_sync_period > sync_period {
            return Err(invalid(
                "iptables-min-sync-period",
                &self.iptables_min_sync_period,
                "must not exceed --iptables-sync-period",
            ));
        }
        if self.plugin_memory_limit_mib < 16 {
            return Err(invalid("plugin-memory-limit-mib", &self.plugin_memory_limit_mib.to_string(), "at least 16"));
        }
        let source = self.source()?;
        let healthz_bind_address = server_address(
            "healthz-bind-address",
            &self.healthz_bind_address,
            10256,
            ("healthz-port", self.healthz_port),
        )?;
        let metrics_bind_address = server_address(
            "metrics-bind-address",
            &self.metrics_bind_address,
            10249,
            ("metrics-port", self.metrics_port),
        )?;
        Ok(Config {
            mode,
            source,
            healthz_bind_address,
            metrics_bind_address,
            node_name,
            cluster_cidrs,
            detect_local_mode,
            nodeport_addresses,
            localhost_nodeports: self.iptables_localhost_nodeports,
            conntrack_tcp_be_liberal: self.conntrack_tcp_be_liberal,
            conntrack,
            cleanup: self.cleanup,
            bind_address,
            masquerade_all: self.masquerade_all,
            masquerade_bit: self.iptables_masquerade_bit as u8,
            min_sync_period,
            sync_period,
            backend_plugin: self.backend_plugin,
            plugin_cache_dir: self.plugin_cache_dir,
            plugin_limits: crate::runtime::Limits {
                memory_bytes: self.plugin_memory_limit_mib << 20,
                fuel_base: self.plugin_fuel,
                fuel_per_object: 200_000,
                max_output_bytes: self.plugin_max_output_mib << 20,
            },
            verbosity: self.verbosity,
        })
    }
}

/// Linux interface names: 1 to 15 bytes, no '/', ':' or white space.
/// Interface names go into rules: the validator's alphabet applies.
fn check_interface_name(flag: &'static str, name: &str) -> Result<()> {
    match kpx_rules::ops::iptables::interface_name_problem(name) {
        Some(why) => Err(invalid(flag, name, why)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(c.nodeport_addresses.match_all());
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
            (vec!["--nodeport-addresses", "primary,10.0.0.0/8"], "nodeport-addresses"),
            (vec!["--bind-address", "node-a"], "bind-address"),
            (vec!["--conntrack-max-per-core", "-1"], "conntrack-max-per-core"),
            (vec!["--conntrack-min", "-5"], "conntrack-min"),
            (vec!["--conntrack-tcp-timeout-established", "1d"], "conntrack-tcp-timeout-established"),
            (vec!["--conntrack-tcp-timeout-close-wait", "-1s"], "conntrack-tcp-timeout-close-wait"),
            (vec!["--conntrack-udp-timeout", "x"], "conntrack-udp-timeout"),
            (vec!["--conntrack-udp-timeout-stream", "5"], "conntrack-udp-timeout-stream"),
        ] {
            let err = flags(&args).validate().unwrap_err().to_string();
            assert!(err.contains(&format!("--{flag}")), "{err}");
        }
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

    #[test]
    fn cluster_cidr_enables_detection() {
        let c = flags(&["--cluster-cidr", "10.0.0.0/8,fd00::/48"]).validate().unwrap();
        assert_eq!(c.detect_local_mode, DetectLocalMode::ClusterCidr);
        assert_eq!(c.cluster_cidrs.len(), 2);
    }
}
