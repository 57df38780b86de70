//! Command-line flags with kube-proxy's names and defaults, validated into
//! a [`Config`]. Bad values are refused with the flag's name.

mod duration;
pub mod file;
mod flags;
pub mod gates;

pub use duration::{format_duration, parse_duration};
pub use flags::{Flags, go_bool};

use std::path::PathBuf;
use std::time::Duration;

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

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub mode: ProxyMode,
    /// `--proxy-mode` was blank: upstream's v1.12 rule picks the mode at
    /// start (iptables, or userspace when iptables mode's own needs are
    /// missing; `app::default_mode`).
    pub mode_defaulted: bool,
    /// userspace mode's flags.
    pub userspace: Userspace,
    pub source: Source,
    pub extra: Extra,
    /// --healthz-bind-address (None: disabled).
    pub healthz_bind_address: Option<std::net::SocketAddr>,
    /// --metrics-bind-address (None: disabled).
    pub metrics_bind_address: Option<std::net::SocketAddr>,
    pub node_name: String,
    pub cluster_cidrs: Vec<Cidr>,
    pub detect_local_mode: DetectLocalMode,
    pub nodeport_addresses: NodePortAddresses,
    pub localhost_nodeports: bool,
    /// iptables mode's bound on the endpoints one service port programs
    /// (`--iptables-max-endpoints-per-port`); None: no bound, or another mode.
    pub max_endpoints_per_port: Option<usize>,
    /// `--iptables-backend`; None: auto, decided at start (`app::run`).
    pub iptables_backend: Option<IptablesBackend>,
    /// `--conntrack-tcp-be-liberal`: kpx sets nf_conntrack_tcp_be_liberal.
    pub conntrack_tcp_be_liberal: bool,
    /// Whether the node's nf_conntrack_tcp_be_liberal is set, read once
    /// after the sysctls are written (`app::run`), as upstream's iptables
    /// proxier reads it: iptables mode then drops no INVALID packets.
    /// Until read, what the flag makes it.
    pub node_tcp_be_liberal: bool,
    /// Whether the node has the nfacct objects iptables mode counts in
    /// (made at start, `app::run`).
    pub nfacct: bool,
    pub conntrack: Conntrack,
    /// Every flag with its value as given or its default (/flagz).
    pub flagz: Vec<(String, String)>,
    pub cleanup: bool,
    /// --bind-address when it names an address.
    pub bind_address: Option<std::net::IpAddr>,
    pub masquerade_all: bool,
    pub masquerade_bit: u8,
    pub min_sync_period: Duration,
    pub sync_period: Duration,
    /// ipvs mode's flags.
    pub ipvs: Ipvs,
    pub backend_plugin: Option<PathBuf>,
    /// `--backend-param KEY=VALUE`, in the order given.
    pub backend_params: Vec<(String, String)>,
    /// `--scheduler-plugin NAME=FILE`, in the order given.
    pub scheduler_plugins: Vec<(String, PathBuf)>,
    /// `--extension NAME=FILE[,key=value...]`, in the order given.
    pub extensions: Vec<ExtensionSpec>,
    pub plugin_cache_dir: PathBuf,
    pub plugin_limits: crate::runtime::Limits,
    pub verbosity: u8,
}

/// The iptables binaries (`--iptables-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IptablesBackend {
    /// `iptables`, as found on PATH.
    System,
    /// `iptables-nft`.
    Nft,
    /// `iptables-legacy`.
    Legacy,
}

/// userspace mode's flags (`--proxy-port-range`, `--udp-timeout`) and
/// kpx's `--localhost-nodeports-proxy`.
#[derive(Debug, Clone, PartialEq)]
pub struct Userspace {
    /// The ports listeners take, inclusive; None: any port the kernel
    /// hands out (upstream's default, an empty range).
    pub port_range: Option<(u16, u16)>,
    /// A UDP session idle this long ends.
    pub udp_timeout: Duration,
    /// nftables mode: node ports on 127.0.0.1 served by kpx's TCP relay.
    pub localhost_nodeports_proxy: bool,
}

impl Default for Userspace {
    fn default() -> Userspace {
        Userspace { port_range: None, udp_timeout: Duration::from_millis(250), localhost_nodeports_proxy: false }
    }
}

/// `--ipvs-*`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ipvs {
    /// `--ipvs-scheduler` ("" = rr).
    pub scheduler: String,
    pub strict_arp: bool,
    pub exclude_cidrs: Vec<Cidr>,
    /// Seconds; 0 keeps the kernel's.
    pub tcp_timeout: u32,
    pub tcpfin_timeout: u32,
    pub udp_timeout: u32,
}

/// What the compatibility flags set (see `Flags::check_compatibility_flags`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extra {
    /// Written to /proc/self/oom_score_adj at start.
    pub oom_score_adj: i32,
    pub feature_gates: gates::Gates,
    /// A server that cannot bind ends kpx (else it is logged and skipped).
    pub bind_address_hard_fail: bool,
    /// Set the kernel up (conntrack sysctls) and exit.
    pub init_only: bool,
    /// Write the configuration in effect here and exit.
    pub write_config_to: Option<PathBuf>,
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
    /// --config-sync-period: upstream's informer resync period (validated,
    /// shown in /configz; kpx's level-based state needs no replay).
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

/// --nodeport-addresses: CIDRs and upstream's keywords (KEP-6032, v1.37):
/// `primary` (the node's primary address of each family), `localhost`
/// (127.0.0.0/8 and ::1/128) and `all` (0.0.0.0/0 and ::/0), in any mix.
/// Each family uses its own CIDRs; a family with none, or with a /0,
/// accepts node ports on every address (upstream's `NewNodePortAddresses`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePortAddresses {
    /// The CIDRs, `localhost` and `all` expanded.
    pub cidrs: Vec<Cidr>,
    /// `primary` was given (resolved per family once the Node is known).
    pub primary: bool,
    /// The values as given (for /configz and /flagz).
    pub given: Vec<String>,
}

impl NodePortAddresses {
    /// Parses the flag's values: keywords (case-sensitive, each at most
    /// once, as upstream's validation) and CIDRs.
    pub fn parse<'a>(items: impl IntoIterator<Item = &'a str>) -> std::result::Result<NodePortAddresses, String> {
        let mut out = NodePortAddresses::default();
        for item in items.into_iter().map(str::trim).filter(|s| !s.is_empty()) {
            let keyword = matches!(item, "primary" | "localhost" | "all");
            if keyword && out.given.iter().any(|g| g == item) {
                return Err(format!("duplicate value {item:?}"));
            }
            match item {
                "primary" => out.primary = true,
                "localhost" => {
                    out.cidrs.extend(["127.0.0.0/8", "::1/128"].map(|c| c.parse::<Cidr>().expect("loopback")))
                }
                "all" => out.cidrs.extend(["0.0.0.0/0", "::/0"].map(|c| c.parse::<Cidr>().expect("everything"))),
                // upstream validates with ParseCIDRSloppy (leading zeros).
                cidr => out.cidrs.push(Cidr::parse_sloppy(cidr).map_err(|e| {
                    format!("{cidr:?}: {e}: must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'")
                })?),
            }
            out.given.push(item.to_string());
        }
        Ok(out)
    }

    /// Nothing given: every address (iptables and ipvs modes; nftables
    /// mode defaults to `primary`).
    pub fn is_empty(&self) -> bool {
        self.cidrs.is_empty() && !self.primary
    }

    /// Whether some CIDR of `family`'s is loopback itself (its network
    /// address is): KEP-6032's "explicit loopback" that starts nftables
    /// mode's localhost node-port relay. `all` is not one.
    pub fn explicit_loopback(&self, family: kpx_rules::model::IpFamily) -> bool {
        self.cidrs.iter().any(|c| c.family() == family && c.network().is_loopback())
    }
}

fn invalid(flag: &'static str, value: &str, reason: impl Into<String>) -> Error {
    Error::InvalidFlag { flag, value: value.to_string(), reason: reason.into() }
}

impl Config {
    /// Whether kpx relays node ports on `family`'s loopback address: nftables
    /// mode, the `KubeProxyNFTablesLocalhostNodePorts` gate on, and
    /// --nodeport-addresses naming a loopback range of the family (KEP-6032).
    pub fn localhost_relay(&self, family: kpx_rules::model::IpFamily) -> bool {
        self.mode == ProxyMode::Nftables
            && self.extra.feature_gates.enabled(gates::NFTABLES_LOCALHOST_NODEPORTS)
            && self.nodeport_addresses.explicit_loopback(family)
    }

    /// The protocols whose node ports on `family`'s loopback are refused and
    /// counted (KEP-6032): UDP and SCTP, and TCP too unless relayed.
    pub fn localhost_rejects(&self, family: kpx_rules::model::IpFamily) -> Vec<kpx_rules::model::Protocol> {
        use kpx_rules::model::Protocol;
        if self.mode != ProxyMode::Nftables || !self.extra.feature_gates.enabled(gates::NFTABLES_LOCALHOST_NODEPORTS) {
            return Vec::new();
        }
        if self.localhost_relay(family) {
            vec![Protocol::Udp, Protocol::Sctp]
        } else {
            vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        }
    }

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
        let node_port_addresses = &self.nodeport_addresses.given;
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

/// `beginPort-endPort`, `port` or `beginPort+offset` (upstream's PortRange).
fn port_range_ok(text: &str) -> bool {
    port_range(text).is_some()
}

/// The inclusive range `text` names (upstream's PortRange: `a-b`, `a`, or
/// `a+offset` for a..=a+offset); `0-0` and `0` are the empty range (any
/// port), which is also None's meaning to callers.
fn port_range(text: &str) -> Option<Option<(u16, u16)>> {
    let port = |s: &str| s.trim().parse::<u16>().ok();
    let (a, b) = match (text.split_once('-'), text.split_once('+')) {
        (Some((a, b)), None) => (port(a)?, port(b)?),
        (None, Some((a, b))) => {
            let a = port(a)?;
            (a, a.checked_add(port(b)?)?)
        }
        (None, None) => (port(text)?, port(text)?),
        _ => return None,
    };
    match (a, b) {
        (0, 0) => Some(None),
        (0, _) => None,
        (a, b) if a <= b => Some(Some((a, b))),
        _ => None,
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
        if self.kube_api_qps.is_nan() || (self.kube_api_qps > 0.0 && self.kube_api_qps < 0.001) {
            return Err(invalid(
                "kube-api-qps",
                &self.kube_api_qps.to_string(),
                "0 (default), a negative number (no limit), or at least 0.001",
            ));
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

    /// The flags kpx accepts for compatibility: validated, and either in
    /// effect (oom-score-adj, feature gates, logging, the hard-fail bind),
    /// kept for the mode they belong to (ipvs, userspace: upstream ignores
    /// them in other modes too), or without effect with a warning saying so.
    fn check_compatibility_flags(&self) -> Result<Extra> {
        if !(-1000..=1000).contains(&self.oom_score_adj) {
            return Err(invalid("oom-score-adj", &self.oom_score_adj.to_string(), "must be within [-1000, 1000]"));
        }
        if self.profiling {
            return Err(invalid("profiling", "true", "kpx has no Go profiler (/debug/pprof); profile it with perf"));
        }
        let (feature_gates, unknown) =
            gates::parse(&self.feature_gates).map_err(|e| invalid("feature-gates", &self.feature_gates, e))?;
        if !unknown.is_empty() {
            tracing::warn!("--feature-gates: kpx does not know {} (accepted; no effect)", unknown.join(", "));
        }
        for (flag, value) in [
            ("ipvs-sync-period", &self.ipvs_sync_period),
            ("ipvs-min-sync-period", &self.ipvs_min_sync_period),
            ("ipvs-tcp-timeout", &self.ipvs_tcp_timeout),
            ("ipvs-tcpfin-timeout", &self.ipvs_tcpfin_timeout),
            ("ipvs-udp-timeout", &self.ipvs_udp_timeout),
            ("udp-timeout", &self.udp_timeout),
        ] {
            parse_duration(value).map_err(|e| invalid(flag, value, e))?;
        }
        if parse_duration(&self.ipvs_sync_period).is_ok_and(|d| d.is_zero()) {
            return Err(invalid("ipvs-sync-period", &self.ipvs_sync_period, "must be greater than 0"));
        }
        for c in self.ipvs_exclude_cidrs.iter().filter(|c| !c.is_empty()) {
            Cidr::parse_sloppy(c).map_err(|e| invalid("ipvs-exclude-cidrs", c, e.to_string()))?;
        }
        if !self.proxy_port_range.is_empty() && !port_range_ok(&self.proxy_port_range) {
            return Err(invalid(
                "proxy-port-range",
                &self.proxy_port_range,
                "beginPort-endPort, a single port, or beginPort+offset",
            ));
        }
        match self.logging_format.as_str() {
            "text" | "json" => {}
            other => return Err(invalid("logging-format", other, "text or json")),
        }
        if !self.azure_container_registry_config.is_empty() {
            tracing::warn!(
                "--azure-container-registry-config has no effect (kube-proxy never read it, and removed it)"
            );
        }
        if self.cleanup_ipvs.is_some() {
            tracing::warn!(
                "--cleanup-ipvs is deprecated (kube-proxy removed it); --cleanup removes kpx's IPVS objects"
            );
        }
        if !self.show_hidden_metrics_for_version.is_empty() {
            tracing::info!("--show-hidden-metrics-for-version: kpx hides no metrics");
        }
        let cosmetic = [
            ("add-dir-header", self.add_dir_header.is_some()),
            ("skip-headers", self.skip_headers.is_some()),
            ("skip-log-headers", self.skip_log_headers.is_some()),
            ("one-output", self.one_output.is_some()),
            ("log-text-split-stream", self.log_text_split_stream.is_some()),
            ("stderrthreshold", self.stderrthreshold.is_some()),
            ("log-backtrace-at", self.log_backtrace_at.is_some()),
            ("log-file-max-size", self.log_file_max_size.is_some()),
            ("log-text-info-buffer-size", self.log_text_info_buffer_size.is_some()),
        ];
        // Upstream refuses a flush frequency that is not positive since
        // v1.35 (kubernetes/kubernetes#133540).
        match parse_duration(&self.log_flush_frequency) {
            Ok(d) if !d.is_zero() => {}
            Ok(_) => return Err(invalid("log-flush-frequency", &self.log_flush_frequency, "must be positive")),
            Err(e) => return Err(invalid("log-flush-frequency", &self.log_flush_frequency, e)),
        }
        for (flag, given) in cosmetic {
            if given {
                tracing::info!(
                    "--{flag} (klog) is accepted for compatibility; kpx's log format and flushing are its own"
                );
            }
        }
        Ok(Extra {
            oom_score_adj: self.oom_score_adj,
            feature_gates,
            bind_address_hard_fail: self.bind_address_hard_fail,
            init_only: self.init_only,
            write_config_to: (!self.write_config_to.is_empty()).then(|| PathBuf::from(&self.write_config_to)),
        })
    }

    pub fn validate(self) -> Result<Config> {
        let mode: ProxyMode = match self.proxy_mode.as_str() {
            // upstream: empty means the platform's default.
            "" => ProxyMode::Iptables,
            "kernelspace" => return Err(invalid("proxy-mode", "kernelspace", "Windows only")),
            other => other
                .parse()
                .map_err(|_| invalid("proxy-mode", other, "this kpx supports: iptables, nftables, ipvs, userspace"))?,
        };
        let node_name = if self.hostname_override.trim().is_empty() {
            std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(Error::NodeName)?.trim().to_lowercase()
        } else {
            self.hostname_override.trim().to_lowercase()
        };
        let mut cluster_cidrs: Vec<Cidr> = Vec::new();
        for part in self.cluster_cidr.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let cidr =
                Cidr::parse_sloppy(part).map_err(|e| invalid("cluster-cidr", &self.cluster_cidr, format!("{e}")))?;
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
        let nodeport_addresses = NodePortAddresses::parse(self.nodeport_addresses.iter().map(String::as_str))
            .map_err(|e| invalid("nodeport-addresses", &self.nodeport_addresses.join(","), e))?;
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
        // ipvs mode's periods are --ipvs-(min-)sync-period, as upstream's.
        let (min_flag, min_text, max_flag, max_text): (&'static str, &String, &'static str, &String) =
            if mode == ProxyMode::Ipvs {
                ("ipvs-min-sync-period", &self.ipvs_min_sync_period, "ipvs-sync-period", &self.ipvs_sync_period)
            } else {
                (
                    "iptables-min-sync-period",
                    &self.iptables_min_sync_period,
                    "iptables-sync-period",
                    &self.iptables_sync_period,
                )
            };
        let min_sync_period = parse_duration(min_text).map_err(|e| invalid(min_flag, min_text, e))?;
        let sync_period = parse_duration(max_text).map_err(|e| invalid(max_flag, max_text, e))?;
        if sync_period.is_zero() {
            return Err(invalid(max_flag, max_text, "must be greater than 0"));
        }
        if min_sync_period > sync_period {
            return Err(invalid(min_flag, min_text, format!("must not exceed --{max_flag}")));
        }
        // The kernel takes IPVS timeouts up to INT_MAX jiffies (24.8 days at HZ=1000).
        let seconds = |flag: &'static str, text: &str| -> Result<u32> {
            let d = parse_duration(text).map_err(|e| invalid(flag, text, e))?;
            u32::try_from(d.as_secs())
                .ok()
                .filter(|s| *s <= 2_147_483)
                .ok_or_else(|| invalid(flag, text, "at most 2147483s (the kernel's limit)"))
        };
        let ipvs = Ipvs {
            scheduler: self.ipvs_scheduler.trim().to_string(),
            strict_arp: self.ipvs_strict_arp,
            exclude_cidrs: self
                .ipvs_exclude_cidrs
                .iter()
                .filter(|c| !c.is_empty())
                .map(|c| Cidr::parse_sloppy(c).map_err(|e| invalid("ipvs-exclude-cidrs", c, e.to_string())))
                .collect::<Result<_>>()?,
            tcp_timeout: seconds("ipvs-tcp-timeout", &self.ipvs_tcp_timeout)?,
            tcpfin_timeout: seconds("ipvs-tcpfin-timeout", &self.ipvs_tcpfin_timeout)?,
            udp_timeout: seconds("ipvs-udp-timeout", &self.ipvs_udp_timeout)?,
        };
        if mode == ProxyMode::Ipvs
            && !ipvs.scheduler.is_empty()
            && !kpx_rules::plan::IPVS_SCHEDULERS.contains(&ipvs.scheduler.as_str())
        {
            return Err(invalid(
                "ipvs-scheduler",
                &ipvs.scheduler,
                format!("IPVS has no such scheduler (it has {})", kpx_rules::plan::IPVS_SCHEDULERS.join(", ")),
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
        let extra = self.check_compatibility_flags()?;
        if mode == ProxyMode::Ipvs && !extra.feature_gates.enabled(gates::KUBE_PROXY_IPVS) {
            // KEP-5495: with the gate off, ipvs is refused as an unknown mode.
            return Err(invalid(
                "proxy-mode",
                "ipvs",
                "the KubeProxyIPVS feature gate is off (ipvs mode is deprecated since v1.35; use nftables)",
            ));
        }
        let mut scheduler_plugins: Vec<(String, PathBuf)> = Vec::new();
        for value in &self.scheduler_plugin {
            let (name, file) = value
                .split_once('=')
                .filter(|(n, f)| !n.is_empty() && !f.is_empty())
                .ok_or_else(|| invalid("scheduler-plugin", value, "NAME=FILE.wasm"))?;
            if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') || name.len() > 32 {
                return Err(invalid("scheduler-plugin", value, "NAME is 1 to 32 of a-z, 0-9 and '-'"));
            }
            if scheduler_plugins.iter().any(|(n, _)| n == name) || name == "schedulers" {
                return Err(invalid("scheduler-plugin", value, format!("the name {name} is taken")));
            }
            scheduler_plugins.push((name.to_string(), PathBuf::from(file)));
        }
        let extensions = self.extension.iter().map(|v| extension_spec(v)).collect::<Result<Vec<_>, _>>()?;
        let backend_params = self
            .backend_param
            .iter()
            .map(|v| crate::wellknown::pair(v).ok_or_else(|| invalid("backend-param", v, "KEY=VALUE")))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, e) in extensions.iter().enumerate() {
            if extensions[..i].iter().any(|o| o.name == e.name) {
                return Err(invalid("extension", &self.extension[i], format!("the name {} is taken", e.name)));
            }
        }
        let userspace = Userspace {
            port_range: port_range(&self.proxy_port_range).flatten(),
            udp_timeout: parse_duration(&self.udp_timeout).map_err(|e| invalid("udp-timeout", &self.udp_timeout, e))?,
            localhost_nodeports_proxy: self.localhost_nodeports_proxy,
        };
        if userspace.udp_timeout.is_zero() {
            return Err(invalid("udp-timeout", &self.udp_timeout, "must be greater than 0"));
        }
        if userspace.localhost_nodeports_proxy && mode != ProxyMode::Nftables {
            return Err(invalid(
                "localhost-nodeports-proxy",
                "true",
                "only for --proxy-mode nftables (iptables mode serves localhost node ports itself; ipvs mode has none)",
            ));
        }
        // (A --config file's value has not met clap's list.)
        let iptables_backend = match self.iptables_backend.as_str() {
            "auto" => None,
            "nft" => Some(IptablesBackend::Nft),
            "legacy" => Some(IptablesBackend::Legacy),
            "system" => Some(IptablesBackend::System),
            other => return Err(invalid("iptables-backend", other, "want auto, nft, legacy or system")),
        };
        let mut nodeport_addresses = nodeport_addresses;
        if userspace.localhost_nodeports_proxy {
            // kpx's flag from before KEP-6032 (v1.37): what upstream's
            // `--nodeport-addresses primary,localhost` does now, with the
            // same relay. It adds `localhost` (to `primary`, the default).
            tracing::warn!(
                "--localhost-nodeports-proxy is deprecated: it adds 'localhost' to --nodeport-addresses, which is how kube-proxy (v1.37+) and kpx serve localhost node ports in nftables mode"
            );
            if !extra.feature_gates.enabled(gates::NFTABLES_LOCALHOST_NODEPORTS) {
                tracing::warn!(
                    "--localhost-nodeports-proxy has no effect: the KubeProxyNFTablesLocalhostNodePorts feature gate is off"
                );
            }
            if nodeport_addresses.is_empty() {
                nodeport_addresses.primary = true;
                nodeport_addresses.given.push("primary".into());
            }
            if !nodeport_addresses.given.iter().any(|g| g == "localhost") {
                let more = NodePortAddresses::parse(["localhost"]).expect("a keyword");
                nodeport_addresses.cidrs.extend(more.cidrs);
                nodeport_addresses.given.push("localhost".into());
            }
        }
        Ok(Config {
            mode,
            mode_defaulted: self.proxy_mode.is_empty(),
            userspace,
            source,
            extra,
            healthz_bind_address,
            metrics_bind_address,
            node_name,
            cluster_cidrs,
            detect_local_mode,
            nodeport_addresses,
            localhost_nodeports: self.iptables_localhost_nodeports,
            max_endpoints_per_port: (mode == ProxyMode::Iptables && self.iptables_max_endpoints_per_port > 0)
                .then_some(self.iptables_max_endpoints_per_port),
            iptables_backend,
            conntrack_tcp_be_liberal: self.conntrack_tcp_be_liberal,
            node_tcp_be_liberal: self.conntrack_tcp_be_liberal,
            nfacct: false,
            conntrack,
            flagz: self.flagz.clone(),
            cleanup: self.cleanup,
            bind_address,
            masquerade_all: self.masquerade_all,
            masquerade_bit: self.iptables_masquerade_bit as u8,
            min_sync_period,
            sync_period,
            ipvs,
            backend_plugin: self.backend_plugin,
            backend_params,
            scheduler_plugins,
            extensions,
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

/// `--extension NAME=FILE.wasm[,key=value...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionSpec {
    pub name: String,
    pub path: PathBuf,
    pub parameters: Vec<(String, String)>,
}

fn extension_spec(value: &str) -> Result<ExtensionSpec, Error> {
    let (first, rest) = value.split_once(',').unwrap_or((value, ""));
    let (name, file) = first
        .split_once('=')
        .filter(|(n, f)| !n.is_empty() && !f.is_empty())
        .ok_or_else(|| invalid("extension", value, "NAME=FILE.wasm[,key=value...]"))?;
    if let Some(problem) = crate::runtime::extension::name_problem(name) {
        return Err(invalid("extension", value, problem));
    }
    let parameters =
        crate::wellknown::pairs(rest).map_err(|e| invalid("extension", value, format!("a parameter: {e}")))?;
    Ok(ExtensionSpec { name: name.to_string(), path: PathBuf::from(file), parameters })
}

#[cfg(test)]
mod tests;
