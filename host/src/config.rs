//! Command-line flags with kube-proxy's names and defaults, validated into
//! a [`Config`]. Bad values are refused with the flag's name.

mod configz;
mod duration;
pub mod file;
mod flags;
pub mod gates;
mod validate;

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
}

/// `--extension NAME=FILE.wasm[,key=value...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionSpec {
    pub name: String,
    pub path: PathBuf,
    pub parameters: Vec<(String, String)>,
}

#[cfg(test)]
mod tests;
