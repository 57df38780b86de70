//! Validation: the flag set made a [`Config`], group by group, each
//! refusing a bad value with the flag's name. Nothing here reads from the
//! host: the node name's read is [`Flags::node_name`]'s, taken first.

use std::path::PathBuf;
use std::time::Duration;

use kpx_rules::model::{Cidr, ProxyMode};

use super::{
    ApiConfig, Config, Conntrack, DetectLocalMode, Error, ExtensionSpec, Extra, Flags, IptablesBackend, Ipvs,
    NodePortAddresses, Result, Source, Userspace, gates, parse_duration,
};

fn invalid(flag: &'static str, value: &str, reason: impl Into<String>) -> Error {
    Error::InvalidFlag { flag, value: value.to_string(), reason: reason.into() }
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

    /// The validated configuration, or the first flag that is wrong. The
    /// groups are checked in the order kube-proxy reports them; the node
    /// name is read (the one read from the host) after the mode.
    pub fn validate(self) -> Result<Config> {
        let mode = mode(&self)?;
        let node_name = self.node_name()?;
        config(self, mode, node_name)
    }
}

/// The flags, with the mode and node name already taken, as a [`Config`]:
/// each group in turn, without reading anything from the host.
fn config(flags: Flags, mode: ProxyMode, node_name: String) -> Result<Config> {
    let f = &flags;
    let (cluster_cidrs, detect_local_mode) = local_detection(f)?;
    let nodeport_addresses = NodePortAddresses::parse(f.nodeport_addresses.iter().map(String::as_str))
        .map_err(|e| invalid("nodeport-addresses", &f.nodeport_addresses.join(","), e))?;
    let conntrack = conntrack(f)?;
    let bind_address = bind_address(f)?;
    masquerade_bit(f)?;
    let (min_sync_period, sync_period) = periods(f, mode)?;
    let ipvs = ipvs(f, mode)?;
    plugin_memory(f)?;
    let source = f.source()?;
    let (healthz_bind_address, metrics_bind_address) = servers(f)?;
    let extra = f.check_compatibility_flags()?;
    if mode == ProxyMode::Ipvs && !extra.feature_gates.enabled(gates::KUBE_PROXY_IPVS) {
        // KEP-5495: with the gate off, ipvs is refused as an unknown mode.
        return Err(invalid(
            "proxy-mode",
            "ipvs",
            "the KubeProxyIPVS feature gate is off (ipvs mode is deprecated since v1.35; use nftables)",
        ));
    }
    let (scheduler_plugins, extensions, backend_params) = plugins(f)?;
    let userspace = userspace(f, mode)?;
    let iptables_backend = iptables_backend(f)?;
    let nodeport_addresses = localhost_nodeports(&userspace, &extra, nodeport_addresses);
    Ok(Config {
        mode,
        mode_defaulted: flags.proxy_mode.is_empty(),
        userspace,
        source,
        extra,
        healthz_bind_address,
        metrics_bind_address,
        node_name,
        cluster_cidrs,
        detect_local_mode,
        nodeport_addresses,
        localhost_nodeports: flags.iptables_localhost_nodeports,
        max_endpoints_per_port: (mode == ProxyMode::Iptables && flags.iptables_max_endpoints_per_port > 0)
            .then_some(flags.iptables_max_endpoints_per_port),
        iptables_backend,
        conntrack_tcp_be_liberal: flags.conntrack_tcp_be_liberal,
        node_tcp_be_liberal: flags.conntrack_tcp_be_liberal,
        nfacct: false,
        conntrack,
        flagz: flags.flagz.clone(),
        cleanup: flags.cleanup,
        bind_address,
        masquerade_all: flags.masquerade_all,
        masquerade_bit: flags.iptables_masquerade_bit as u8,
        min_sync_period,
        sync_period,
        ipvs,
        plugin_limits: crate::runtime::Limits {
            memory_bytes: flags.plugin_memory_limit_mib << 20,
            fuel_base: flags.plugin_fuel,
            max_output_bytes: flags.plugin_max_output_mib << 20,
            // No flag sets it: runtime's default is the one constant.
            ..crate::runtime::Limits::default()
        },
        verbosity: flags.verbosity,
        backend_plugin: flags.backend_plugin,
        backend_params,
        scheduler_plugins,
        extensions,
        plugin_cache_dir: flags.plugin_cache_dir,
    })
}

/// --proxy-mode.
fn mode(f: &Flags) -> Result<ProxyMode> {
    match f.proxy_mode.as_str() {
        // upstream: empty means the platform's default.
        "" => Ok(ProxyMode::Iptables),
        "kernelspace" => Err(invalid("proxy-mode", "kernelspace", "Windows only")),
        other => other
            .parse()
            .map_err(|_| invalid("proxy-mode", other, "this kpx supports: iptables, nftables, ipvs, userspace")),
    }
}

/// --cluster-cidr and --detect-local-mode with its interface flags.
fn local_detection(f: &Flags) -> Result<(Vec<Cidr>, DetectLocalMode)> {
    let mut cluster_cidrs: Vec<Cidr> = Vec::new();
    for part in f.cluster_cidr.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let cidr = Cidr::parse_sloppy(part).map_err(|e| invalid("cluster-cidr", &f.cluster_cidr, format!("{e}")))?;
        if cluster_cidrs.iter().any(|c| c.family() == cidr.family()) {
            return Err(invalid("cluster-cidr", &f.cluster_cidr, "at most one CIDR per IP family"));
        }
        cluster_cidrs.push(cidr);
    }
    let detect_local_mode = match f.detect_local_mode.as_str() {
        "" | "ClusterCIDR" if cluster_cidrs.is_empty() => DetectLocalMode::None,
        "" | "ClusterCIDR" => DetectLocalMode::ClusterCidr,
        "NodeCIDR" => DetectLocalMode::NodeCidr,
        "BridgeInterface" => {
            let name = f.pod_bridge_interface.trim();
            if name.is_empty() {
                return Err(invalid("pod-bridge-interface", name, "required with --detect-local-mode BridgeInterface"));
            }
            check_interface_name("pod-bridge-interface", name)?;
            DetectLocalMode::BridgeInterface(name.to_string())
        }
        "InterfaceNamePrefix" => {
            let prefix = f.pod_interface_name_prefix.trim();
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
    Ok((cluster_cidrs, detect_local_mode))
}

/// The --conntrack-* sizes and timeouts.
fn conntrack(f: &Flags) -> Result<Conntrack> {
    let non_negative = |flag: &'static str, value: i32| {
        u32::try_from(value).map_err(|_| invalid(flag, &value.to_string(), "must be greater than or equal to 0"))
    };
    let duration = |flag: &'static str, text: &str| parse_duration(text).map_err(|e| invalid(flag, text, e));
    Ok(Conntrack {
        max_per_core: non_negative("conntrack-max-per-core", f.conntrack_max_per_core)?,
        min: non_negative("conntrack-min", f.conntrack_min)?,
        tcp_established: duration("conntrack-tcp-timeout-established", &f.conntrack_tcp_timeout_established)?,
        tcp_close_wait: duration("conntrack-tcp-timeout-close-wait", &f.conntrack_tcp_timeout_close_wait)?,
        udp: duration("conntrack-udp-timeout", &f.conntrack_udp_timeout)?,
        udp_stream: duration("conntrack-udp-timeout-stream", &f.conntrack_udp_timeout_stream)?,
    })
}

/// --bind-address: None for empty or unspecified.
fn bind_address(f: &Flags) -> Result<Option<std::net::IpAddr>> {
    Ok(match f.bind_address.trim() {
        "" => None,
        text => {
            let ip: std::net::IpAddr = text.parse().map_err(|_| invalid("bind-address", text, "not an IP address"))?;
            (!ip.is_unspecified()).then_some(ip)
        }
    })
}

/// --iptables-masquerade-bit.
fn masquerade_bit(f: &Flags) -> Result<()> {
    if !(0..=31).contains(&f.iptables_masquerade_bit) {
        return Err(invalid(
            "iptables-masquerade-bit",
            &f.iptables_masquerade_bit.to_string(),
            "must be within [0, 31]",
        ));
    }
    Ok(())
}

/// The mode's (min) sync periods, as (min_sync_period, sync_period).
fn periods(f: &Flags, mode: ProxyMode) -> Result<(Duration, Duration)> {
    // ipvs mode's periods are --ipvs-(min-)sync-period, as upstream's.
    let (min_flag, min_text, max_flag, max_text): (&'static str, &String, &'static str, &String) =
        if mode == ProxyMode::Ipvs {
            ("ipvs-min-sync-period", &f.ipvs_min_sync_period, "ipvs-sync-period", &f.ipvs_sync_period)
        } else {
            ("iptables-min-sync-period", &f.iptables_min_sync_period, "iptables-sync-period", &f.iptables_sync_period)
        };
    let min_sync_period = parse_duration(min_text).map_err(|e| invalid(min_flag, min_text, e))?;
    let sync_period = parse_duration(max_text).map_err(|e| invalid(max_flag, max_text, e))?;
    if sync_period.is_zero() {
        return Err(invalid(max_flag, max_text, "must be greater than 0"));
    }
    if min_sync_period > sync_period {
        return Err(invalid(min_flag, min_text, format!("must not exceed --{max_flag}")));
    }
    Ok((min_sync_period, sync_period))
}

/// The --ipvs-* flags (the scheduler checked in ipvs mode only).
fn ipvs(f: &Flags, mode: ProxyMode) -> Result<Ipvs> {
    // The kernel takes IPVS timeouts up to INT_MAX jiffies (24.8 days at HZ=1000).
    let seconds = |flag: &'static str, text: &str| -> Result<u32> {
        let d = parse_duration(text).map_err(|e| invalid(flag, text, e))?;
        u32::try_from(d.as_secs())
            .ok()
            .filter(|s| *s <= 2_147_483)
            .ok_or_else(|| invalid(flag, text, "at most 2147483s (the kernel's limit)"))
    };
    let ipvs = Ipvs {
        scheduler: f.ipvs_scheduler.trim().to_string(),
        strict_arp: f.ipvs_strict_arp,
        exclude_cidrs: f
            .ipvs_exclude_cidrs
            .iter()
            .filter(|c| !c.is_empty())
            .map(|c| Cidr::parse_sloppy(c).map_err(|e| invalid("ipvs-exclude-cidrs", c, e.to_string())))
            .collect::<Result<_>>()?,
        tcp_timeout: seconds("ipvs-tcp-timeout", &f.ipvs_tcp_timeout)?,
        tcpfin_timeout: seconds("ipvs-tcpfin-timeout", &f.ipvs_tcpfin_timeout)?,
        udp_timeout: seconds("ipvs-udp-timeout", &f.ipvs_udp_timeout)?,
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
    Ok(ipvs)
}

/// --plugin-memory-limit-mib's floor.
fn plugin_memory(f: &Flags) -> Result<()> {
    if f.plugin_memory_limit_mib < 16 {
        return Err(invalid("plugin-memory-limit-mib", &f.plugin_memory_limit_mib.to_string(), "at least 16"));
    }
    Ok(())
}

/// The healthz and metrics addresses.
type Servers = (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>);

/// --healthz-bind-address and --metrics-bind-address, with their
/// deprecated --*-port flags.
fn servers(f: &Flags) -> Result<Servers> {
    let healthz_bind_address =
        server_address("healthz-bind-address", &f.healthz_bind_address, 10256, ("healthz-port", f.healthz_port))?;
    let metrics_bind_address =
        server_address("metrics-bind-address", &f.metrics_bind_address, 10249, ("metrics-port", f.metrics_port))?;
    Ok((healthz_bind_address, metrics_bind_address))
}

/// The scheduler plugins, extensions and backend parameters.
type Plugins = (Vec<(String, PathBuf)>, Vec<ExtensionSpec>, Vec<(String, String)>);

/// --scheduler-plugin, --extension and --backend-param.
fn plugins(f: &Flags) -> Result<Plugins> {
    let mut scheduler_plugins: Vec<(String, PathBuf)> = Vec::new();
    for value in &f.scheduler_plugin {
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
    let extensions = f.extension.iter().map(|v| extension_spec(v)).collect::<Result<Vec<_>, _>>()?;
    let backend_params = f
        .backend_param
        .iter()
        .map(|v| crate::wellknown::pair(v).ok_or_else(|| invalid("backend-param", v, "KEY=VALUE")))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, e) in extensions.iter().enumerate() {
        if extensions[..i].iter().any(|o| o.name == e.name) {
            return Err(invalid("extension", &f.extension[i], format!("the name {} is taken", e.name)));
        }
    }
    Ok((scheduler_plugins, extensions, backend_params))
}

/// userspace mode's flags, and --localhost-nodeports-proxy's mode.
fn userspace(f: &Flags, mode: ProxyMode) -> Result<Userspace> {
    let userspace = Userspace {
        port_range: port_range(&f.proxy_port_range).flatten(),
        udp_timeout: parse_duration(&f.udp_timeout).map_err(|e| invalid("udp-timeout", &f.udp_timeout, e))?,
        localhost_nodeports_proxy: f.localhost_nodeports_proxy,
    };
    if userspace.udp_timeout.is_zero() {
        return Err(invalid("udp-timeout", &f.udp_timeout, "must be greater than 0"));
    }
    if userspace.localhost_nodeports_proxy && mode != ProxyMode::Nftables {
        return Err(invalid(
            "localhost-nodeports-proxy",
            "true",
            "only for --proxy-mode nftables (iptables mode serves localhost node ports itself; ipvs mode has none)",
        ));
    }
    Ok(userspace)
}

/// --iptables-backend: None for auto.
fn iptables_backend(f: &Flags) -> Result<Option<IptablesBackend>> {
    // (A --config file's value has not met clap's list.)
    Ok(match f.iptables_backend.as_str() {
        "auto" => None,
        "nft" => Some(IptablesBackend::Nft),
        "legacy" => Some(IptablesBackend::Legacy),
        "system" => Some(IptablesBackend::System),
        other => return Err(invalid("iptables-backend", other, "want auto, nft, legacy or system")),
    })
}

/// --nodeport-addresses with what the deprecated
/// --localhost-nodeports-proxy adds to it.
fn localhost_nodeports(
    userspace: &Userspace,
    extra: &Extra,
    mut nodeport_addresses: NodePortAddresses,
) -> NodePortAddresses {
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
    nodeport_addresses
}

/// Linux interface names: 1 to 15 bytes, no '/', ':' or white space.
/// Interface names go into rules: the validator's alphabet applies.
fn check_interface_name(flag: &'static str, name: &str) -> Result<()> {
    match kpx_rules::ops::iptables::interface_name_problem(name) {
        Some(why) => Err(invalid(flag, name, why)),
        None => Ok(()),
    }
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
