//! Assembles kpx from a [`Config`]: plugin runtime, one proxier per IP
//! family, the manifest source, and the sync loop.

mod components;

use crate::reload::{Role, Watcher};
use std::path::Path;
use std::sync::Arc;

use kpx_rules::model::{IpFamily, ProxyMode};

use crate::config::{Config, IptablesBackend, Source, gates};
use crate::kernel::iptables::backend::{self, Backend};
use crate::kernel::iptables::{IptablesDataplane, IptablesKernel};
use crate::kernel::ipvs::dataplane::{IpvsDataplane, Timeouts};
use crate::kernel::nftables::{NftablesDataplane, NftablesKernel};
use crate::kernel::sysctl::Sysctl;
use crate::kernel::{Dataplane, SystemExec};
use crate::runtime::Runtime;
use crate::runtime::load::LoadError;
use crate::serve::health::ProxyHealth;
use crate::serve::metrics::ReasonLabel;
use crate::serve::service_health::Bind;
use crate::serve::{Endpoints, Telemetry};
use crate::source::manifests::ManifestSource;
use crate::state::State;
use crate::sync::planner::Planner;
use crate::sync::{self, FamilyProxier, Periods, Proxier};
use crate::userspace::balancer::Picker;
use crate::userspace::localhost::LocalhostNodePorts;
use crate::userspace::{Relays, UserspaceProxier, budget};
use prometheus_client::metrics::{counter::Counter, family::Family};

pub use components::{load_backend, load_extensions, load_schedulers};
use components::{load_backend_file, load_schedulers_from_files};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A component cannot be loaded at start; kpx exits.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The manifests cannot be read at start; kpx exits.
    #[error(transparent)]
    Source(#[from] crate::source::manifests::Error),
    /// No API client can be configured; kpx exits.
    #[error(transparent)]
    Api(#[from] crate::source::api::Error),
    /// --write-config-to cannot be written.
    #[error("cannot write --write-config-to {path}: {source}")]
    WriteConfig { path: String, source: std::io::Error },
    /// A server cannot start; kpx exits.
    #[error(transparent)]
    Serve(#[from] crate::serve::Error),
    /// The API source's runtime cannot start.
    #[error("cannot start the API source's runtime: {0}")]
    Runtime(std::io::Error),
    /// `--proxy-mode ipvs` on a kernel without ip_vs: kpx exits non-zero.
    #[error(
        "ipvs mode needs the kernel's IPVS (ip_vs module): {0}; load ip_vs or use --proxy-mode nftables or iptables"
    )]
    NoIpvs(String),
    #[error("ipvs mode needs the ipset tool (Debian package ipset) for upstream's ipsets: {0}")]
    NoIpset(String),
    /// The object source stopped (its thread ended or panicked): kpx exits
    /// non-zero so that its supervisor restarts it; the kernel keeps the
    /// last rules written.
    #[error("the object source stopped: {0}")]
    SourceStopped(String),
}

/// The plugin runtime `config` asks for.
pub fn plugin_runtime(config: &Config) -> Result<Runtime, Error> {
    Ok(Runtime::new(config.plugin_limits, Some(config.plugin_cache_dir.clone())).map_err(LoadError::from)?)
}

/// The families this node can proxy: IPv4, and IPv6 where the kernel has it.
pub fn families() -> Vec<IpFamily> {
    let mut out = vec![IpFamily::V4];
    if Path::new("/proc/net/if_inet6").exists() {
        out.push(IpFamily::V6);
    }
    out
}

/// The iptables binaries kpx runs (`--iptables-backend`): named, or
/// read from the node's tables as kube-proxy's image does
/// ([`backend::detect`]); logged with the reason.
pub fn iptables_backend(config: &Config) -> Backend {
    let (chosen, why) = match config.iptables_backend {
        Some(IptablesBackend::System) => (Backend::System, "--iptables-backend=system".to_string()),
        Some(IptablesBackend::Nft) => (Backend::Nft, "--iptables-backend=nft".to_string()),
        Some(IptablesBackend::Legacy) => (Backend::Legacy, "--iptables-backend=legacy".to_string()),
        None => backend::detect(&SystemExec::default()),
    };
    tracing::info!(backend = %chosen, "iptables backend: {} ({why})", chosen.tool(IpFamily::V4, "iptables"));
    chosen
}

/// The iptables tools of `family` with `backend`.
fn iptables(family: IpFamily, backend: Backend) -> IptablesKernel {
    IptablesKernel::new(family, Box::new(SystemExec::default())).with_backend(backend)
}

/// The mode's kernel side for one family (the rule modes).
fn dataplane(config: &Config, family: IpFamily, backend: Backend) -> Dataplane {
    match config.mode {
        ProxyMode::Iptables => Dataplane::Iptables(IptablesDataplane::new(iptables(family, backend))),
        ProxyMode::Nftables => Dataplane::Nftables(NftablesDataplane::new(NftablesKernel::new(family))),
        ProxyMode::Ipvs => {
            let i = &config.ipvs;
            let timeouts = Timeouts { tcp: i.tcp_timeout, tcp_fin: i.tcpfin_timeout, udp: i.udp_timeout };
            Dataplane::Ipvs(IpvsDataplane::new(family, iptables(family, backend), i.exclude_cidrs.clone(), timeouts))
        }
        ProxyMode::Userspace => unreachable!("userspace mode has no backend dataplane"),
    }
}

/// upstream's oldest iptables requirement (`-C` and `-w`).
const IPTABLES_MIN: (u32, u32, u32) = (1, 4, 11);

/// The version `iptables --version` prints (`iptables v1.8.10 (nf_tables)`).
fn iptables_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((parts.next()??, parts.next()??, parts.next().flatten().unwrap_or(0)))
}

/// upstream's v1.12 rule for a blank `--proxy-mode`: the best mode
/// available, iptables, unless its own needs are missing (upstream's
/// `CanUseIPTablesProxier`: iptables 1.4.11 or later, and the kernel's
/// `route_localnet`), then userspace. The mode and why.
pub fn default_mode(iptables: Result<String, String>, route_localnet: bool) -> (ProxyMode, String) {
    let version = match iptables {
        // userspace mode writes iptables rules too: without the tool, the
        // best mode available is nftables (nf_tables over netlink).
        Err(e) => return (ProxyMode::Nftables, format!("cannot run iptables --version ({e}); nftables needs no tool")),
        Ok(text) => iptables_version(&text),
    };
    match version {
        None => (ProxyMode::Userspace, "iptables --version names no version".into()),
        Some(v) if v < IPTABLES_MIN => (
            ProxyMode::Userspace,
            format!("iptables {}.{}.{} is older than 1.4.11 (iptables mode needs -C and -w)", v.0, v.1, v.2),
        ),
        Some(_) if !route_localnet => {
            (ProxyMode::Userspace, "the kernel has no net.ipv4.conf.all.route_localnet".into())
        }
        Some(v) => (ProxyMode::Iptables, format!("iptables {}.{}.{} and route_localnet are here", v.0, v.1, v.2)),
    }
}

/// Applies [`default_mode`] to a blank `--proxy-mode` on this node.
fn choose_default_mode(config: &mut Config, backend: Backend) {
    if !config.mode_defaulted {
        return;
    }
    use crate::kernel::Exec;
    let tool = backend.tool(IpFamily::V4, "iptables");
    let iptables = SystemExec::default().run(&tool, &["--version"], None).map_err(|e| e.to_string());
    let route_localnet = Path::new("/proc/sys/net/ipv4/conf/all/route_localnet").exists();
    let (mode, why) = default_mode(iptables, route_localnet);
    tracing::info!(mode = %mode, "--proxy-mode is blank: {mode} ({why})");
    // KEP-5343 (v1.37): kube-proxy warns that its Linux default is to
    // move from iptables to nftables; kpx follows when it does.
    tracing::warn!(
        "--proxy-mode is not set: the default proxy mode on Linux (iptables) will change to nftables in a future release; set --proxy-mode (or mode in the configuration file) to the mode you want"
    );
    config.mode = mode;
}

/// `--init-only`: the setup that needs full root privileges (conntrack
/// sysctls), then exit.
pub fn init(config: &Config) {
    crate::kernel::conntrack::apply(
        &config.conntrack,
        config.conntrack_tcp_be_liberal,
        &crate::kernel::conntrack::Globals::default(),
    );
}

/// upstream's iptables proxier: whether the node's conntrack is liberal
/// decides the INVALID drop, read after the sysctls are written (so
/// `--conntrack-tcp-be-liberal`, or an operator's own setting, counts).
fn read_node_tcp_be_liberal(config: &mut Config) {
    let liberal = Sysctl::default()
        .get("net.netfilter.nf_conntrack_tcp_be_liberal")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|v| v != 0);
    if liberal && config.mode == ProxyMode::Iptables {
        tracing::info!("nf_conntrack_tcp_be_liberal set, not installing DROP rules for INVALID packets");
    }
    config.node_tcp_be_liberal = liberal;
}

/// `--write-config-to`: the configuration in effect, as a
/// KubeProxyConfiguration YAML file.
pub fn write_config(config: &Config, path: &Path) -> Result<(), Error> {
    let body = config.configz()["kubeproxy.config.k8s.io"].clone();
    let text = serde_saphyr::to_string(&body).expect("a JSON value is YAML");
    std::fs::write(path, text).map_err(|source| Error::WriteConfig { path: path.display().to_string(), source })
}

/// `--oom-score-adj`, written to the process as upstream does.
fn set_oom_score_adj(value: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", value.to_string()) {
        tracing::warn!("cannot set oom_score_adj to {value}: {e}");
    }
}

/// Runs kpx until the source stops, which is an error.
pub fn run(mut config: Config) -> Result<(), Error> {
    set_oom_score_adj(config.extra.oom_score_adj);
    let tables = iptables_backend(&config);
    choose_default_mode(&mut config, tables);
    if config.mode == ProxyMode::Ipvs {
        // upstream's words since v1.35 (KEP-5495), at error level; its
        // Node event is not sent (kpx's role has no Events).
        tracing::error!(
            "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead."
        );
        // Upstream falls back to iptables here; kpx refuses instead: an
        // operator who asked for IPVS gets it or a clear failure.
        if let Err(e) = crate::kernel::ipvs::Ipvs::open() {
            return Err(Error::NoIpvs(e.to_string()));
        }
        // upstream too needs ipset (6.0 or later: IPv6 sets) in ipvs mode.
        use crate::kernel::Exec;
        if let Err(e) = SystemExec::default().run("ipset", &["version"], None) {
            return Err(Error::NoIpset(e.to_string()));
        }
    }
    // Components that do not fit stop kpx before it touches the kernel.
    let plugin_runtime = Arc::new(plugin_runtime(&config)?);
    let (schedulers, scheduler_digests) = load_schedulers_from_files(&plugin_runtime, &config.scheduler_plugins)?;
    let (backend, backend_digest) = match config.mode {
        ProxyMode::Userspace => (None, None),
        _ => {
            let (plugin, digest) = load_backend_file(&config, &plugin_runtime)?;
            (Some(Arc::new(plugin)), digest)
        }
    };
    let (extensions, extension_digests) = load_extensions(&plugin_runtime, &config)?;
    init(&config);
    read_node_tcp_be_liberal(&mut config);
    if config.mode == ProxyMode::Iptables {
        // upstream's iptables mode counts in two nfacct objects where the
        // node has nfacct; without, its rules and metrics go without.
        use crate::kernel::nfacct;
        match nfacct::ensure(&[nfacct::CT_STATE_INVALID_DROPPED, nfacct::LOCALHOST_NODEPORTS_ACCEPTED]) {
            Ok(()) => config.nfacct = true,
            Err(e) => tracing::warn!("nfacct objects cannot be made, nfacct based metrics won't be available: {e}"),
        }
    }
    remove_other_backend(tables);
    remove_other_modes(config.mode, config.masquerade_bit, tables);
    // Extensions no longer configured, and configured ones' objects of the
    // other rule mode (kpx ran in it before): they would keep acting on
    // destinations the state no longer vouches for.
    let configured: Vec<String> = config.extensions.iter().map(|e| e.name.clone()).collect();
    for family in families() {
        match crate::extension::remove(family, tables, config.mode, &configured) {
            Ok(removed) => log_removed_extensions(family, config.mode, &removed),
            Err(e) => tracing::warn!(
                %family,
                "cannot remove the objects of extensions no longer configured, or left from another proxy mode: {e}"
            ),
        }
    }
    raise_open_files_limit();
    let config = Arc::new(config);
    // userspace mode's relays: a runtime of their own, apart from the
    // sync loop (kept alive by this frame while kpx runs).
    let relaying = config.mode == ProxyMode::Userspace || families().into_iter().any(|f| config.localhost_relay(f));
    let relay_runtime = match relaying {
        true => Some(
            tokio::runtime::Builder::new_multi_thread()
                // A thread per core, up to 4: a connection's two directions
                // run in one task.
                .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get().min(4)))
                .thread_name("relay")
                .enable_all()
                .build()
                .map_err(Error::Runtime)?,
        ),
        false => None,
    };
    let picker = Arc::new(Picker::new(schedulers.clone()));
    // The relays' budget, and its refusals' counters (served below).
    let relay_refusals: Family<ReasonLabel, Counter> = Family::default();
    let refusal = |reason: &str| relay_refusals.get_or_create(&ReasonLabel { reason: reason.into() }).clone();
    let counters = budget::Counters { total: refusal("total"), client: refusal("client"), port: refusal("port") };
    let budget = budget::Budget::new(budget::Limits::here(), counters);
    // An established connection's conntrack timeout (0: left as is, the
    // kernel's default of five days).
    let tcp_idle = match config.conntrack.tcp_established {
        d if d.is_zero() => std::time::Duration::from_secs(5 * 86_400),
        d => d,
    };
    let relays = relay_runtime
        .as_ref()
        .map(|r| Relays::new(r.handle().clone(), config.userspace.udp_timeout, tcp_idle, budget.clone()));
    let proxiers: Vec<Proxier> = match &relays {
        Some(relays) if config.mode == ProxyMode::Userspace => {
            tracing::info!(mode = %config.mode, node = %config.node_name, "starting");
            families()
                .into_iter()
                .map(|family| {
                    Proxier::Userspace(Box::new(UserspaceProxier::new(
                        config.clone(),
                        family,
                        relays.clone(),
                        picker.clone(),
                        iptables(family, tables),
                    )))
                })
                .collect()
        }
        _ => {
            let plugin = backend.expect("loaded above in the rule modes");
            tracing::info!(mode = %config.mode, plugin = plugin.name(), node = %config.node_name, "starting");
            families()
                .into_iter()
                .map(|family| {
                    Proxier::Rules(
                        Box::new(
                            FamilyProxier::new(
                                config.clone(),
                                family,
                                plugin.clone(),
                                Planner::new(config.mode, family, schedulers.clone()),
                                dataplane(&config, family, tables).with_max_bytes(
                                    usize::try_from(config.plugin_limits.max_output_bytes).unwrap_or(usize::MAX),
                                ),
                                Sysctl::default(),
                            )
                            .with_extensions(
                                extensions
                                    .iter()
                                    .map(|e| {
                                        crate::extension::ExtensionProxier::new(e.clone(), family, config.mode, tables)
                                    })
                                    .collect(),
                            ),
                        ),
                        relays.as_ref().filter(|_| config.localhost_relay(family)).map(|r| {
                            tracing::info!(
                                family = %family,
                                "localhost node ports are relayed by kpx (--nodeport-addresses names loopback); each connection goes to the endpoint the Service's scheduler picks (kpx.dev/scheduler), where kube-proxy picks at random"
                            );
                            Box::new(LocalhostNodePorts::new(family, r.clone(), picker.clone()))
                        }),
                    )
                })
                .collect()
        }
    };
    let families: Vec<IpFamily> = proxiers.iter().map(Proxier::family).collect();
    // upstream: a change not programmed within twice the sync period is unhealthy.
    let health = match config.source {
        Source::Manifests(_) => ProxyHealth::new(2 * config.sync_period, families).node_optional(),
        Source::Api(_) => ProxyHealth::new(2 * config.sync_period, families),
    };
    let optional = crate::serve::metrics::Optional { nfacct: config.nfacct };
    let gates = &config.extra.feature_gates;
    let (flagz, statusz) = (gates.enabled(gates::COMPONENT_FLAGZ), gates.enabled(gates::COMPONENT_STATUSZ));
    let mut paths = vec!["/configz", "/healthz", "/metrics", "/proxyMode"];
    paths.extend(flagz.then_some("/flagz"));
    paths.extend(statusz.then_some("/statusz"));
    paths.sort_unstable();
    let pages = crate::serve::zpages::Zpages::new(config.flagz.clone(), env!("CARGO_PKG_VERSION"), paths);
    let zpages = crate::serve::Zpages { pages, flagz, statusz };
    let mut telemetry = Telemetry::new(health, config.mode, optional, config.configz().to_string()).with_zpages(zpages);
    if relays.is_some() {
        telemetry = telemetry.with_relay_refusals(relay_refusals);
    }
    let telemetry = Arc::new(telemetry);
    // The source counts what it refuses in the metrics: made first.
    let refusals = telemetry.metrics.refusals();
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = match &config.source {
        Source::Manifests(path) => {
            let source = ManifestSource::new(path)?.counting(refusals);
            std::thread::Builder::new().name("manifests".into()).spawn(move || source.run(tx))
        }
        Source::Api(api) => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(Error::Runtime)?;
            let client = runtime.block_on(crate::source::api::client(api))?;
            let node = config.node_name.clone();
            std::thread::Builder::new()
                .name("api".into())
                .spawn(move || runtime.block_on(crate::source::api::run(client, node, tx, refusals)))
        }
    }
    .expect("spawn the source thread");
    // No address selected (or none readable): every address, as upstream
    // falls back to. `primary` is not known before the Node: every
    // address too (docs/UPSTREAM.md).
    let npa = &config.nodeport_addresses;
    let every = npa.primary || npa.cidrs.is_empty() || npa.cidrs.iter().any(|c| c.prefix_len == 0);
    let selected = if every { Vec::new() } else { nodeport_listen_addresses(&config) };
    let service_health = if selected.is_empty() { Bind::All } else { Bind::Addresses(selected) };
    crate::serve::start(
        telemetry.clone(),
        Endpoints {
            healthz: config.healthz_bind_address,
            metrics: config.metrics_bind_address,
            service_health,
            hard_fail: config.extra.bind_address_hard_fail,
        },
    )?;
    let periods = Periods { min: config.min_sync_period, max: config.sync_period };
    // Component files replaced while kpx runs are tried and switched to.
    let mut files: Vec<(Role, std::path::PathBuf, [u8; 32])> = Vec::new();
    if let (Some(path), Some(digest)) = (&config.backend_plugin, backend_digest) {
        files.push((Role::Backend, path.clone(), digest));
    }
    for (index, ((name, path), digest)) in config.scheduler_plugins.iter().zip(scheduler_digests).enumerate() {
        files.push((Role::Scheduler { index, name: name.clone() }, path.clone(), digest));
    }
    for (index, (e, digest)) in config.extensions.iter().zip(extension_digests).enumerate() {
        let role = Role::Extension { index, name: e.name.clone(), parameters: e.parameters.clone() };
        files.push((role, e.path.clone(), digest));
    }
    // Each configured component's reload series, at 0 until a reload
    // (a rollback is a rules proxier's: not an extension's, nor
    // userspace mode's).
    for (role, _, _) in &files {
        let rolls_back = !matches!(role, Role::Extension { .. }) && config.mode != ProxyMode::Userspace;
        telemetry.metrics.expect_reloads(&role.label(), rolls_back);
    }
    let watcher = Watcher::new(plugin_runtime, files);
    let external_ips = config.extra.feature_gates.enabled(gates::ALLOW_SERVICE_EXTERNAL_IPS);
    if !external_ips {
        tracing::warn!("the AllowServiceExternalIPs feature gate is off: Services' externalIPs are not programmed");
    }
    let state = State::new(config.node_name.clone()).allow_external_ips(external_ips);
    sync::run(state, rx, proxiers, periods, &telemetry, Some(watcher));
    Err(source_stopped(thread))
}

/// Says what [`crate::extension::remove`] removed at start in `mode`: the
/// objects of extensions no longer configured, apart from the other rule
/// mode's objects of extensions still configured.
fn log_removed_extensions(family: IpFamily, mode: ProxyMode, removed: &crate::extension::Removed) {
    if !removed.unconfigured.is_empty() {
        tracing::info!(%family, "removed the objects of extensions no longer configured: {:?}", removed.unconfigured);
    }
    for (name, other) in &removed.other_mode {
        tracing::info!(
            %family,
            extension = %name,
            "removed the {other} objects of extension {name}, left from a run in {other} mode: it is still configured, and its {mode} objects stay"
        );
    }
}

/// The node's addresses that --nodeport-addresses selects (health-check
/// node ports listen there, as upstream's do).
fn nodeport_listen_addresses(config: &Config) -> Vec<std::net::IpAddr> {
    let local = crate::kernel::interfaces::local_addresses().unwrap_or_else(|e| {
        tracing::error!("cannot read the node's addresses for health-check node ports: {e}");
        Vec::new()
    });
    local.into_iter().filter(|ip| config.nodeport_addresses.cidrs.iter().any(|c| c.contains(ip))).collect()
}

/// The sync loop ends only when the source's thread has: why it did.
fn source_stopped(thread: std::thread::JoinHandle<()>) -> Error {
    let why = match thread.join() {
        Ok(()) => "it ended".to_string(),
        Err(panic) => {
            match panic.downcast_ref::<String>().map(String::as_str).or(panic.downcast_ref::<&str>().copied()) {
                Some(message) => format!("it panicked: {message}"),
                None => "it panicked".to_string(),
            }
        }
    };
    Error::SourceStopped(why)
}

/// What kube-proxy (or an earlier kpx) left in the iptables backend kpx
/// does not use, removed at start: its chains there would keep catching
/// Services' packets beside kpx's own (an image that always wrote through
/// iptables-nft, on a node whose kubelet uses legacy). Read without
/// creating a table; nothing is done when that backend's tools are
/// missing or it holds none of kube-proxy's chains.
fn remove_other_backend(chosen: Backend) {
    let other = match chosen {
        Backend::Nft => Backend::Legacy,
        Backend::Legacy => Backend::Nft,
        Backend::System => return,
    };
    for family in families() {
        let kernel = iptables(family, other);
        match kernel.holds_own_chains() {
            Ok(true) => {}
            Ok(false) | Err(crate::kernel::Error::Spawn { .. }) => continue,
            Err(e) => {
                tracing::warn!(%family, "cannot read {}: {e}", other.tool(family, "iptables-save"));
                continue;
            }
        }
        match kernel.cleanup() {
            Ok(n) => tracing::warn!(
                %family,
                chains = n,
                "removed kube-proxy's chains from {}: kpx writes through {}",
                other.tool(family, "iptables"),
                chosen.tool(family, "iptables")
            ),
            Err(e) => {
                tracing::warn!(%family, "cannot remove kube-proxy's chains from {}: {e}", other.tool(family, "iptables"))
            }
        }
    }
}

/// What the other modes left on this node, removed before this one starts
/// (as upstream does): userspace mode removes the rule modes' chains, the
/// nftables table and IPVS virtual servers; the others remove userspace
/// mode's chains. Failures are logged: the mode's own sync goes on.
fn remove_other_modes(mode: ProxyMode, masquerade_bit: u8, backend: Backend) {
    if mode == ProxyMode::Userspace {
        // IPVS virtual servers and kube-ipvs0 would keep answering (and
        // make the Service addresses local); then upstream's ipsets.
        match crate::kernel::ipvs::dataplane::cleanup(&[], 1 << masquerade_bit) {
            Ok(0) | Err(_) => {}
            Ok(n) => tracing::info!(services = n, "removed ipvs mode's virtual servers and kube-ipvs0"),
        }
    }
    for family in families() {
        let kernel = iptables(family, backend);
        let removed = if mode == ProxyMode::Userspace { kernel.remove_rule_modes() } else { kernel.remove_userspace() };
        match removed {
            Ok(0) => {}
            Ok(n) => tracing::info!(%family, chains = n, "removed another mode's iptables chains"),
            // No iptables on this node (nftables mode): nothing was left there.
            Err(crate::kernel::Error::Spawn { .. }) => {}
            Err(e) => tracing::warn!(%family, "cannot remove another mode's iptables chains: {e}"),
        }
        if mode == ProxyMode::Userspace
            && let Ok(true) = NftablesKernel::new(family).delete_table()
        {
            tracing::info!(%family, "removed nftables mode's table kube-proxy");
        }
    }
    if mode == ProxyMode::Userspace
        && let Ok(n @ 1..) = crate::kernel::ipvs::sets::cleanup(&SystemExec::default())
    {
        tracing::info!(sets = n, "removed ipvs mode's ipsets");
    }
}

/// Raises the open-files limit to its hard limit, as Go programs
/// (upstream's kube-proxy) do at start: a relayed connection takes six
/// descriptors (two sockets, two pipes).
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::warn!("cannot raise the open-files limit from {soft} to {hard}: {e}");
    }
}

/// `--cleanup`: removes kube-proxy's iptables chains and jumps (both
/// families), its nftables tables, and its IPVS virtual servers (outside
/// `--ipvs-exclude-cidrs`) with kube-ipvs0, then returns.
pub fn cleanup(config: &Config) -> Result<(), crate::kernel::Error> {
    let backend = iptables_backend(config);
    remove_other_backend(backend);
    match crate::kernel::ipvs::dataplane::cleanup(&config.ipvs.exclude_cidrs, 1 << config.masquerade_bit) {
        Ok(0) => {}
        Ok(n) => tracing::info!(services = n, "removed IPVS virtual servers and kube-ipvs0"),
        Err(e) => tracing::warn!("cannot remove IPVS virtual servers: {e}"),
    }
    for family in families() {
        let removed = iptables(family, backend).cleanup()?;
        tracing::info!(%family, chains = removed, "removed iptables rules");
    }
    // After the rules that test them: a set in use cannot be destroyed.
    match crate::kernel::ipvs::sets::cleanup(&SystemExec::default()) {
        Ok(0) => {}
        Ok(n) => tracing::info!(sets = n, "removed ipvs mode's ipsets"),
        Err(e) => tracing::warn!("cannot remove ipvs mode's ipsets: {e}"),
    }
    for family in families() {
        // Nothing kept: every extension removed counts as unconfigured.
        match crate::extension::remove(family, backend, ProxyMode::Userspace, &[]) {
            Ok(removed) if removed.is_empty() => {}
            Ok(removed) => tracing::info!(%family, "removed the objects of extensions {:?}", removed.unconfigured),
            Err(e) => tracing::warn!(%family, "cannot remove the extensions' objects: {e}"),
        }
    }
    for family in families() {
        // No table (or no nf_tables at all) is fine: nothing to remove.
        match NftablesKernel::new(family).delete_table() {
            Ok(true) => tracing::info!(%family, "removed nftables table kube-proxy"),
            Ok(false) => {}
            Err(e) => tracing::warn!(%family, "cannot remove nftables table kube-proxy: {e}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blank_mode_is_iptables_unless_its_needs_are_missing() {
        let ok = |v: &str| Ok::<String, String>(v.to_string());
        assert_eq!(default_mode(ok("iptables v1.8.10 (nf_tables)"), true).0, ProxyMode::Iptables);
        assert_eq!(default_mode(ok("iptables v1.4.11"), true).0, ProxyMode::Iptables);
        let (mode, why) = default_mode(ok("iptables v1.4.10"), true);
        assert_eq!(
            (mode, why.as_str()),
            (ProxyMode::Userspace, "iptables 1.4.10 is older than 1.4.11 (iptables mode needs -C and -w)")
        );
        let (mode, why) = default_mode(ok("iptables v1.8.7 (legacy)"), false);
        assert_eq!((mode, why.as_str()), (ProxyMode::Userspace, "the kernel has no net.ipv4.conf.all.route_localnet"));
        let (mode, why) = default_mode(Err("cannot run iptables: No such file".into()), true);
        assert_eq!(mode, ProxyMode::Nftables);
        assert!(why.contains("No such file"), "{why}");
        assert_eq!(default_mode(ok("something else"), true).0, ProxyMode::Userspace);
    }

    #[test]
    fn a_source_that_stops_is_an_error_that_says_why() {
        let (tx, rx) = std::sync::mpsc::channel::<crate::source::Event>();
        let thread = std::thread::spawn(move || {
            let _tx = tx;
            panic!("manifest parser blew up");
        });
        // The sync loop returns when the source's sender is gone.
        let telemetry = Telemetry::new(
            ProxyHealth::new(std::time::Duration::from_secs(2), Vec::new()),
            ProxyMode::Iptables,
            Default::default(),
            "{}".into(),
        );
        sync::run(
            State::new("n"),
            rx,
            Vec::new(),
            Periods { min: Default::default(), max: std::time::Duration::from_secs(1) },
            &telemetry,
            None,
        );
        let err = source_stopped(thread);
        assert!(matches!(err, Error::SourceStopped(_)));
        assert_eq!(err.to_string(), "the object source stopped: it panicked: manifest parser blew up");
    }
}
