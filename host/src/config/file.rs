//! `--config FILE`: a `KubeProxyConfiguration`
//! (`kubeproxy.config.k8s.io/v1alpha1`), YAML or JSON, with upstream's
//! field names. It is read into the same flag values the command line
//! sets, so one validation serves both. Fields left empty, zero or null
//! take upstream's defaults, as its defaulting does. An unknown field is
//! ignored with a warning naming it, as upstream falls back to lenient
//! decoding (newer kubeadm versions write fields older proxies lack).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::Flags;

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub bind_address: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub bind_address_hard_fail: Option<bool>,
    pub enable_profiling: Option<bool>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub hostname_override: Option<String>,
    pub client_connection: Option<ClientConnection>,
    pub iptables: Option<Iptables>,
    pub ipvs: Option<Ipvs>,
    pub nftables: Option<Nftables>,
    pub winkernel: Option<serde_json::Value>,
    pub windows_run_as_service: Option<bool>,
    pub oom_score_adj: Option<i32>,
    pub mode: Option<String>,
    pub port_range: Option<String>,
    /// Older versions (userspace mode).
    pub udp_idle_timeout: Option<String>,
    /// Older versions (a cgroup for the process); no effect.
    pub resource_container: Option<String>,
    pub conntrack: Option<Conntrack>,
    pub config_sync_period: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub show_hidden_metrics_for_version: Option<String>,
    pub detect_local_mode: Option<String>,
    pub detect_local: Option<DetectLocal>,
    pub logging: Option<Logging>,
    /// Newer versions: the mode-independent sync periods.
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    /// kpx's own settings (kube-proxy warns of the field and ignores it):
    /// the plugin flags, in their command-line syntax.
    pub kpx: Option<Kpx>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientConnection {
    pub kubeconfig: Option<String>,
    pub accept_content_types: Option<String>,
    pub content_type: Option<String>,
    pub qps: Option<f32>,
    pub burst: Option<i32>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Iptables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub localhost_node_ports: Option<bool>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    /// Newer versions (no effect in kpx yet).
    #[serde(rename = "snatNodeInternalIP")]
    pub snat_node_internal_ip: Option<bool>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ipvs {
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    pub scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    pub tcp_timeout: Option<String>,
    pub tcp_fin_timeout: Option<String>,
    pub udp_timeout: Option<String>,
    /// Older versions.
    pub masquerade_all: Option<bool>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nftables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub sync_period: Option<String>,
    pub min_sync_period: Option<String>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Conntrack {
    /// Older versions: an absolute maximum.
    pub max: Option<i32>,
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<String>,
    pub tcp_close_wait_timeout: Option<String>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<String>,
    pub udp_stream_timeout: Option<String>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DetectLocal {
    pub bridge_interface: Option<String>,
    pub interface_name_prefix: Option<String>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Logging {
    pub format: Option<String>,
    pub flush_frequency: Option<serde_json::Value>,
    pub verbosity: Option<u8>,
    pub vmodule: Option<serde_json::Value>,
    pub options: Option<serde_json::Value>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// The `kpx:` section: `--backend-plugin`, `--scheduler-plugin`,
/// `--extension`, `--plugin-cache-dir` and
/// `--iptables-max-endpoints-per-port`, each value as on the command line
/// (which, given there too, wins).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Kpx {
    pub backend_plugin: Option<String>,
    /// `KEY=VALUE` each.
    pub backend_params: Option<Vec<String>>,
    /// `NAME=FILE.wasm` each.
    pub scheduler_plugins: Option<Vec<String>>,
    /// `NAME=FILE.wasm[,key=value...]` each.
    pub extensions: Option<Vec<String>>,
    pub plugin_cache_dir: Option<String>,
    /// `--iptables-max-endpoints-per-port`.
    pub iptables_max_endpoints_per_port: Option<usize>,
    /// `--iptables-backend`.
    pub iptables_backend: Option<String>,
    /// Fields this version does not know.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// Why a configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read --config {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("--config {path}: {message}")]
    Invalid { path: String, message: String },
}

const API_VERSIONS: &[&str] = &["kubeproxy.config.k8s.io/v1alpha1"];

/// Parses a configuration file's text.
pub fn parse(path: &str, text: &str) -> Result<KubeProxyConfiguration, Error> {
    let invalid = |message: String| Error::Invalid { path: path.to_string(), message };
    let config: KubeProxyConfiguration = serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
    match config.api_version.as_deref() {
        Some(v) if API_VERSIONS.contains(&v) => {}
        other => {
            return Err(invalid(format!(
                "apiVersion {:?}: kpx reads {}",
                other.unwrap_or(""),
                API_VERSIONS.join(" or ")
            )));
        }
    }
    if config.kind.as_deref() != Some("KubeProxyConfiguration") {
        return Err(invalid(format!(
            "kind {:?}: expected KubeProxyConfiguration",
            config.kind.as_deref().unwrap_or("")
        )));
    }
    Ok(config)
}

/// Sets `value` when the file gives a non-empty one (empty means default).
fn set_str(to: &mut String, value: &Option<String>) {
    if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
        *to = v.to_string();
    }
}

/// Durations: a zero one means the default, as upstream's defaulting does.
fn set_duration(to: &mut String, value: &Option<String>) {
    if let Some(v) = value.as_deref().filter(|v| !v.is_empty() && super::parse_duration(v) != Ok(Default::default())) {
        *to = v.to_string();
    }
}

impl KubeProxyConfiguration {
    /// Every field the file sets that this version does not know, by path.
    pub fn unknown_fields(&self) -> Vec<String> {
        let mut out: Vec<String> = self.unknown.keys().cloned().collect();
        let mut nested = |section: &str, fields: Option<&BTreeMap<String, serde_json::Value>>| {
            out.extend(fields.into_iter().flat_map(|m| m.keys()).map(|k| format!("{section}.{k}")));
        };
        nested("clientConnection", self.client_connection.as_ref().map(|c| &c.unknown));
        nested("iptables", self.iptables.as_ref().map(|c| &c.unknown));
        nested("ipvs", self.ipvs.as_ref().map(|c| &c.unknown));
        nested("nftables", self.nftables.as_ref().map(|c| &c.unknown));
        nested("conntrack", self.conntrack.as_ref().map(|c| &c.unknown));
        nested("detectLocal", self.detect_local.as_ref().map(|c| &c.unknown));
        nested("logging", self.logging.as_ref().map(|c| &c.unknown));
        nested("kpx", self.kpx.as_ref().map(|c| &c.unknown));
        out
    }

    /// The flag values this configuration stands for, on top of `flags`
    /// (the defaults).
    pub fn apply(&self, flags: &mut Flags) {
        if let Some(k) = &self.kpx {
            if let Some(p) = k.backend_plugin.as_deref().filter(|p| !p.is_empty()) {
                flags.backend_plugin = Some(p.into());
            }
            if let Some(p) = &k.backend_params {
                flags.backend_param = p.clone();
            }
            if let Some(s) = &k.scheduler_plugins {
                flags.scheduler_plugin = s.clone();
            }
            if let Some(e) = &k.extensions {
                flags.extension = e.clone();
            }
            if let Some(d) = k.plugin_cache_dir.as_deref().filter(|d| !d.is_empty()) {
                flags.plugin_cache_dir = d.into();
            }
            if let Some(n) = k.iptables_max_endpoints_per_port {
                flags.iptables_max_endpoints_per_port = n;
            }
            if let Some(b) = k.iptables_backend.as_deref().filter(|b| !b.is_empty()) {
                flags.iptables_backend = b.to_string();
            }
        }
        if let Some(gates) = &self.feature_gates {
            flags.feature_gates = gates.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
        }
        set_str(&mut flags.bind_address, &self.bind_address);
        set_str(&mut flags.healthz_bind_address, &self.healthz_bind_address);
        set_str(&mut flags.metrics_bind_address, &self.metrics_bind_address);
        if let Some(v) = self.bind_address_hard_fail {
            flags.bind_address_hard_fail = v;
        }
        if let Some(v) = self.enable_profiling {
            flags.profiling = v;
        }
        set_str(&mut flags.cluster_cidr, &self.cluster_cidr);
        set_str(&mut flags.hostname_override, &self.hostname_override);
        if let Some(c) = &self.client_connection {
            set_str(&mut flags.kubeconfig, &c.kubeconfig);
            set_str(&mut flags.kube_api_content_type, &c.content_type);
            if let Some(q) = c.qps.filter(|q| *q != 0.0) {
                flags.kube_api_qps = q;
            }
            if let Some(b) = c.burst.filter(|b| *b != 0) {
                flags.kube_api_burst = b;
            }
        }
        set_str(&mut flags.proxy_mode, &self.mode);
        // As upstream's conversion: nftables mode reads its own section,
        // every other mode the iptables one (localhost node ports are
        // iptables' only).
        let nftables = self.mode.as_deref() == Some("nftables");
        match (&self.iptables, &self.nftables) {
            (Some(i), _) if !nftables => {
                if let Some(b) = i.masquerade_bit {
                    flags.iptables_masquerade_bit = b;
                }
                if let Some(v) = i.masquerade_all {
                    flags.masquerade_all = v;
                }
                if let Some(v) = i.localhost_node_ports {
                    flags.iptables_localhost_nodeports = v;
                }
                set_duration(&mut flags.iptables_sync_period, &i.sync_period);
                set_duration(&mut flags.iptables_min_sync_period, &i.min_sync_period);
            }
            (_, Some(n)) if nftables => {
                if let Some(b) = n.masquerade_bit {
                    flags.iptables_masquerade_bit = b;
                }
                if let Some(v) = n.masquerade_all {
                    flags.masquerade_all = v;
                }
                set_duration(&mut flags.iptables_sync_period, &n.sync_period);
                set_duration(&mut flags.iptables_min_sync_period, &n.min_sync_period);
            }
            _ => {}
        }
        set_duration(&mut flags.iptables_sync_period, &self.sync_period);
        set_duration(&mut flags.iptables_min_sync_period, &self.min_sync_period);
        if let Some(i) = &self.ipvs {
            set_duration(&mut flags.ipvs_sync_period, &i.sync_period);
            set_duration(&mut flags.ipvs_min_sync_period, &i.min_sync_period);
            set_str(&mut flags.ipvs_scheduler, &i.scheduler);
            if let Some(c) = &i.exclude_cidrs {
                flags.ipvs_exclude_cidrs = c.clone();
            }
            if let Some(v) = i.strict_arp {
                flags.ipvs_strict_arp = v;
            }
            set_duration(&mut flags.ipvs_tcp_timeout, &i.tcp_timeout);
            set_duration(&mut flags.ipvs_tcpfin_timeout, &i.tcp_fin_timeout);
            set_duration(&mut flags.ipvs_udp_timeout, &i.udp_timeout);
        }
        if let Some(v) = self.oom_score_adj {
            flags.oom_score_adj = v;
        }
        set_str(&mut flags.proxy_port_range, &self.port_range);
        set_duration(&mut flags.udp_timeout, &self.udp_idle_timeout);
        if let Some(c) = &self.conntrack {
            if let Some(v) = c.max_per_core {
                flags.conntrack_max_per_core = v;
            }
            if let Some(v) = c.min {
                flags.conntrack_min = v;
            }
            // Null means the default; an explicit 0 leaves the kernel's value.
            set_str(&mut flags.conntrack_tcp_timeout_established, &c.tcp_established_timeout);
            set_str(&mut flags.conntrack_tcp_timeout_close_wait, &c.tcp_close_wait_timeout);
            if let Some(v) = c.tcp_be_liberal {
                flags.conntrack_tcp_be_liberal = v;
            }
            set_duration(&mut flags.conntrack_udp_timeout, &c.udp_timeout);
            set_duration(&mut flags.conntrack_udp_timeout_stream, &c.udp_stream_timeout);
        }
        set_duration(&mut flags.config_sync_period, &self.config_sync_period);
        if let Some(a) = &self.node_port_addresses {
            flags.nodeport_addresses = a.clone();
        }
        set_str(&mut flags.show_hidden_metrics_for_version, &self.show_hidden_metrics_for_version);
        set_str(&mut flags.detect_local_mode, &self.detect_local_mode);
        if let Some(d) = &self.detect_local {
            set_str(&mut flags.pod_bridge_interface, &d.bridge_interface);
            set_str(&mut flags.pod_interface_name_prefix, &d.interface_name_prefix);
        }
        if let Some(l) = &self.logging {
            if let Some(v) = l.verbosity.filter(|v| *v > 0) {
                flags.verbosity = v;
            }
            set_str(&mut flags.logging_format, &l.format);
            // Upstream's `flushFrequency`: a duration string, or
            // nanoseconds; zero is the default (5s), as component-base's
            // defaulting makes it.
            match &l.flush_frequency {
                Some(serde_json::Value::String(d)) if super::parse_duration(d).map_or(true, |d| !d.is_zero()) => {
                    flags.log_flush_frequency = d.clone()
                }
                Some(serde_json::Value::Number(n)) if n.as_i64() != Some(0) => {
                    flags.log_flush_frequency = format!("{}ns", n.as_i64().unwrap_or(-1));
                }
                _ => {}
            }
        }
    }
}
