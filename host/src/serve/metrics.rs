//! `/metrics`: upstream's `kubeproxy_*` metrics (names, types, labels and
//! buckets as kube-proxy registers them) and kpx's `kpx_plugin_*`, with
//! the Prometheus project's Rust client.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use kpx_rules::model::{IpFamily, ProxyMode};

use crate::source::{Kind, Refusals};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

/// Upstream's `ip_family` label: "IPv4" or "IPv6" (`v1.IPFamily`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabel {
    pub ip_family: String,
}

impl FamilyLabel {
    pub fn of(family: IpFamily) -> FamilyLabel {
        FamilyLabel { ip_family: family_name(family).to_string() }
    }
}

/// `v1.IPFamily`'s spelling.
pub fn family_name(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    pub ip_family: String,
    pub table: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    pub ip_family: String,
    pub traffic_policy: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabel {
    pub ip_family: String,
    /// "TCP", "UDP" or "SCTP" (`v1.Protocol`).
    pub protocol: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabel {
    pub plugin: String,
}

/// The kind of an object a source refused: `Service`, `EndpointSlice`,
/// `Node`, `ServiceCIDR`, or `unknown` (a document that names no kind kpx
/// reads, or is not YAML).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// Why a userspace relay was refused: `total`, `client` or `port`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// A component file replaced while kpx runs, and what became of it.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabel {
    /// `backend`, `scheduler:NAME` or `extension:NAME` (`reload::Role::label`).
    pub component: String,
    /// One of [`RELOAD_OUTCOMES`].
    pub outcome: String,
}

/// What `kpx_plugin_reloads_total` counts per component: a replacement
/// switched to, one refused (the running component kept), and one whose
/// first sync pass failed, so that the replaced component came back (an
/// extension's switch stands whatever the pass did: it has no rollback).
pub const RELOAD_OUTCOMES: [&str; 3] = ["applied", "refused", "rolled-back"];

/// One named counter of an extension's rules.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExtensionCounterLabel {
    pub extension: String,
    /// The service port's key (`namespace/name:port`).
    pub service: String,
    pub counter: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExtensionLabel {
    pub extension: String,
}

/// The most `kpx_extension_counter` series kpx exports: what one scrape
/// of /metrics can hold (each series is under 300 bytes: about 3 MiB).
/// Counters named past it are counted, not exported
/// (`kpx_extension_counter_series_dropped`).
pub const MAX_EXTENSION_SERIES: usize = 10_000;

/// The extensions' series: the counters their rules name (a series goes
/// with its counter), and their failures.
#[derive(Default)]
pub struct ExtensionSeries {
    named: std::collections::BTreeSet<(String, String, String)>,
}

impl ExtensionSeries {
    /// `counted`: (extension, service, counter, packets since the last
    /// update) of every named counter, every family's; `failed`:
    /// (extension, failed syncs since the last update).
    pub fn update(&mut self, m: &Metrics, counted: Vec<(String, String, String, u64)>, failed: Vec<(String, u64)>) {
        let label = |(extension, service, counter): &(String, String, String)| ExtensionCounterLabel {
            extension: extension.clone(),
            service: service.clone(),
            counter: counter.clone(),
        };
        // Series already exported first (they keep their place), then new
        // ones, within the bound.
        let (old, new): (Vec<_>, Vec<_>) =
            counted.into_iter().map(|(e, s, c, n)| ((e, s, c), n)).partition(|(key, _)| self.named.contains(key));
        let mut named = std::collections::BTreeSet::new();
        let mut dropped = 0;
        for (key, packets) in old.into_iter().chain(new) {
            if named.len() >= MAX_EXTENSION_SERIES {
                dropped += 1;
                continue;
            }
            m.extension_counter.get_or_create(&label(&key)).inc_by(packets);
            named.insert(key);
        }
        m.extension_series_dropped.set(dropped as i64);
        for gone in self.named.difference(&named) {
            m.extension_counter.remove(&label(gone));
        }
        self.named = named;
        for (extension, n) in failed {
            m.extension_failures.get_or_create(&ExtensionLabel { extension }).inc_by(n);
        }
    }
}

type FloatGauge = Gauge<f64, AtomicU64>;
/// A histogram per label set, each with the family's buckets.
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// upstream's sync latency buckets: `ExponentialBuckets(0.001, 2, 15)`.
fn sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// upstream's network programming buckets, `MergeBuckets` of 0.25 s steps
/// to 0.5 s, seconds to 59, 5 s steps to 115, 30 s steps to 300
/// (component-base's `MergeBuckets` starts them with 0).
fn programming_histogram() -> Histogram {
    let mut b = vec![0.0, 0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    Histogram::new(b)
}

/// Which optional families a node registers: upstream's nfacct-based
/// iptables counters exist only where nfacct objects can be made.
#[derive(Debug, Clone, Copy, Default)]
pub struct Optional {
    pub nfacct: bool,
}

/// Every metric kpx exports; cheap to update from the sync thread.
/// Upstream's families carry `ip_family` where its per-family proxiers
/// set it (pkg/proxy/metrics; docs/UPSTREAM.md and
/// tests/upstream/metrics.txt have the table they are checked against).
pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histograms<FamilyLabel>,
    pub full_sync_duration: Histograms<FamilyLabel>,
    pub partial_sync_duration: Histograms<FamilyLabel>,
    pub last_sync_timestamp: Family<FamilyLabel, FloatGauge>,
    pub last_queued_timestamp: Family<FamilyLabel, FloatGauge>,
    pub endpoint_changes_total: Counter,
    pub endpoint_changes_pending: Gauge,
    pub service_changes_total: Counter,
    pub service_changes_pending: Gauge,
    pub iptables_restore_failures: Family<FamilyLabel, Counter>,
    pub iptables_partial_restore_failures: Family<FamilyLabel, Counter>,
    pub iptables_total: Family<TableLabel, Gauge>,
    pub iptables_last: Family<TableLabel, Gauge>,
    /// upstream's nfacct counter of the INVALID drop (iptables mode).
    pub ct_state_invalid_dropped: Counter,
    /// upstream's nfacct counter of localhost node-port connections (iptables mode).
    pub localhost_nodeports_accepted: Counter,
    pub nftables_sync_failures: Family<FamilyLabel, Counter>,
    pub nftables_cleanup_failures: Family<FamilyLabel, Counter>,
    pub localhost_nodeport_listeners: Family<FamilyLabel, Gauge>,
    pub localhost_nodeport_listener_failures: Family<FamilyLabel, Counter>,
    pub localhost_nodeport_rejected: Family<ProtocolLabel, Counter>,
    /// kpx's: IPVS writes the kernel refused (upstream's ipvs mode counts
    /// only its iptables-restore failures).
    pub ipvs_sync_failures: Counter,
    pub healthz: Family<CodeLabel, Counter>,
    pub livez: Family<CodeLabel, Counter>,
    pub network_programming: Histograms<FamilyLabel>,
    pub no_local_endpoints: Family<PolicyLabel, Gauge>,
    pub conntrack_reconcile_duration: Histograms<FamilyLabel>,
    pub conntrack_deleted: Family<FamilyLabel, Counter>,
    pub plugin_calls: Family<PluginLabel, Counter>,
    pub plugin_fuel: Family<PluginLabel, Counter>,
    pub plugin_traps: Family<PluginLabel, Counter>,
    pub plugin_refusals: Family<PluginLabel, Counter>,
    pub plugin_reloads: Family<ReloadLabel, Counter>,
    pub extension_counter: Family<ExtensionCounterLabel, Counter>,
    pub extension_failures: Family<ExtensionLabel, Counter>,
    pub extension_series_dropped: Gauge,
    pub plugin_render_duration: Histogram,
    pub validation_duration: Histogram,
    pub rules_lost: Counter,
    /// kpx's: endpoints left out by --iptables-max-endpoints-per-port.
    pub endpoints_not_programmed: Gauge,
    /// kpx's: objects a source refused or dropped, by kind (each logged
    /// with its kind, namespace/name and why).
    pub objects_refused: Family<KindLabel, Counter>,
}

impl Metrics {
    /// The metrics of `mode`, registered per mode as upstream's
    /// `RegisterMetrics(mode)` does.
    pub fn new(mode: ProxyMode) -> Metrics {
        Metrics::with(mode, Optional::default())
    }

    /// [`Metrics::new`], with the optional families this node supports.
    pub fn with(mode: ProxyMode, optional: Optional) -> Metrics {
        let mut r = Registry::default();
        let histograms = || Family::new_with_constructor(sync_histogram as fn() -> Histogram);
        let m = Metrics {
            sync_duration: histograms(),
            full_sync_duration: histograms(),
            partial_sync_duration: histograms(),
            last_sync_timestamp: Family::default(),
            last_queued_timestamp: Family::default(),
            endpoint_changes_total: Counter::default(),
            endpoint_changes_pending: Gauge::default(),
            service_changes_total: Counter::default(),
            service_changes_pending: Gauge::default(),
            iptables_restore_failures: Family::default(),
            iptables_partial_restore_failures: Family::default(),
            iptables_total: Family::default(),
            iptables_last: Family::default(),
            ct_state_invalid_dropped: Counter::default(),
            localhost_nodeports_accepted: Counter::default(),
            nftables_sync_failures: Family::default(),
            nftables_cleanup_failures: Family::default(),
            localhost_nodeport_listeners: Family::default(),
            localhost_nodeport_listener_failures: Family::default(),
            localhost_nodeport_rejected: Family::default(),
            ipvs_sync_failures: Counter::default(),
            healthz: Family::default(),
            livez: Family::default(),
            network_programming: Family::new_with_constructor(programming_histogram as fn() -> Histogram),
            no_local_endpoints: Family::default(),
            conntrack_reconcile_duration: histograms(),
            conntrack_deleted: Family::default(),
            plugin_calls: Family::default(),
            plugin_fuel: Family::default(),
            plugin_traps: Family::default(),
            plugin_refusals: Family::default(),
            plugin_reloads: Family::default(),
            extension_counter: Family::default(),
            extension_failures: Family::default(),
            extension_series_dropped: Gauge::default(),
            plugin_render_duration: sync_histogram(),
            validation_duration: sync_histogram(),
            rules_lost: Counter::default(),
            endpoints_not_programmed: Gauge::default(),
            objects_refused: Family::default(),
            registry: Registry::default(),
        };
        // Every kind's series from the start, at 0.
        for kind in [Kind::Service, Kind::EndpointSlice, Kind::Node, Kind::ServiceCidr] {
            drop(m.objects_refused.get_or_create(&KindLabel { kind: kind.as_str().to_string() }));
        }
        // The client appends `_total` to counters; upstream's help
        // strings carry their stability level.
        let alpha = |help: &str| format!("[ALPHA] {help}");
        // Every mode (upstream's "core kube-proxy metrics for all backends").
        r.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            alpha("SyncProxyRules latency in seconds"),
            m.sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            alpha("The last time a sync of proxy rules was queued"),
            m.last_queued_timestamp.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            alpha("The last time proxy rules were successfully synced"),
            m.last_sync_timestamp.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            alpha("Pending proxy rules Endpoint changes"),
            m.endpoint_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            alpha("Cumulative proxy rules Endpoint changes"),
            m.endpoint_changes_total.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            alpha("Pending proxy rules Service changes"),
            m.service_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            alpha("Cumulative proxy rules Service changes"),
            m.service_changes_total.clone(),
        );
        r.register("kubeproxy_proxy_healthz", alpha("Cumulative proxy healthz HTTP status"), m.healthz.clone());
        r.register("kubeproxy_proxy_livez", alpha("Cumulative proxy livez HTTP status"), m.livez.clone());
        r.register(
            "kubeproxy_network_programming_duration_seconds",
            alpha("In Cluster Network Programming Latency in seconds"),
            m.network_programming.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            alpha("Number of services with a Local traffic policy and no endpoints"),
            m.no_local_endpoints.clone(),
        );
        let full_and_partial = |r: &mut Registry| {
            r.register(
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                alpha("SyncProxyRules latency in seconds for full resyncs"),
                m.full_sync_duration.clone(),
            );
            r.register(
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                alpha("SyncProxyRules latency in seconds for partial resyncs"),
                m.partial_sync_duration.clone(),
            );
        };
        let restore_failures = |r: &mut Registry| {
            r.register(
                "kubeproxy_sync_proxy_rules_iptables_restore_failures",
                alpha("Cumulative proxy iptables restore failures"),
                m.iptables_restore_failures.clone(),
            );
        };
        let conntrack = |r: &mut Registry| {
            r.register(
                "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                alpha("ReconcileConntrackFlowsLatency latency in seconds"),
                m.conntrack_reconcile_duration.clone(),
            );
            r.register(
                "kubeproxy_conntrack_reconciler_deleted_entries",
                alpha("Cumulative conntrack flows deleted by conntrack reconciler"),
                m.conntrack_deleted.clone(),
            );
        };
        match mode {
            // userspace mode writes its REDIRECT rules with iptables-restore too.
            ProxyMode::Iptables | ProxyMode::Userspace => {
                full_and_partial(&mut r);
                restore_failures(&mut r);
                r.register(
                    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures",
                    alpha("Cumulative proxy iptables partial restore failures"),
                    m.iptables_partial_restore_failures.clone(),
                );
                r.register(
                    "kubeproxy_sync_proxy_rules_iptables_total",
                    alpha("Total number of iptables rules owned by kube-proxy"),
                    m.iptables_total.clone(),
                );
                r.register(
                    "kubeproxy_sync_proxy_rules_iptables_last",
                    alpha("Number of iptables rules written by kube-proxy in last sync"),
                    m.iptables_last.clone(),
                );
                if mode == ProxyMode::Iptables && optional.nfacct {
                    r.register(
                        "kubeproxy_iptables_ct_state_invalid_dropped_packets",
                        alpha("packets dropped by iptables to work around conntrack problems"),
                        m.ct_state_invalid_dropped.clone(),
                    );
                    r.register(
                        "kubeproxy_iptables_localhost_nodeports_accepted_packets",
                        alpha("Number of packets accepted on nodeports of loopback interface"),
                        m.localhost_nodeports_accepted.clone(),
                    );
                }
                conntrack(&mut r);
            }
            ProxyMode::Nftables => {
                full_and_partial(&mut r);
                r.register(
                    "kubeproxy_sync_proxy_rules_nftables_sync_failures",
                    alpha("Cumulative proxy nftables sync failures"),
                    m.nftables_sync_failures.clone(),
                );
                r.register(
                    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
                    alpha("Cumulative proxy nftables cleanup failures"),
                    m.nftables_cleanup_failures.clone(),
                );
                r.register(
                    "kubeproxy_nftables_localhost_nodeport_listeners",
                    alpha("Number of localhost NodePort listeners of the localhost NodePort proxy"),
                    m.localhost_nodeport_listeners.clone(),
                );
                r.register(
                    "kubeproxy_nftables_localhost_nodeport_listener_creation_failures",
                    alpha("Cumulative localhost NodePort listeners the localhost NodePort proxy failed to create"),
                    m.localhost_nodeport_listener_failures.clone(),
                );
                r.register(
                    "kubeproxy_nftables_localhost_nodeport_rejected_packets",
                    alpha(
                        "Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running",
                    ),
                    m.localhost_nodeport_rejected.clone(),
                );
                conntrack(&mut r);
            }
            ProxyMode::Ipvs => {
                restore_failures(&mut r);
                r.register(
                    "kpx_sync_proxy_rules_ipvs_sync_failures",
                    "Cumulative IPVS writes the kernel refused",
                    m.ipvs_sync_failures.clone(),
                );
                conntrack(&mut r);
            }
        }
        r.register("kpx_plugin_traps", "Plugin calls that trapped (the instance is replaced)", m.plugin_traps.clone());
        r.register("kpx_plugin_refusals", "Rulesets of a plugin the host refused", m.plugin_refusals.clone());
        r.register(
            "kpx_plugin_reloads",
            "Component files replaced while kpx ran, applied or refused (the running component kept)",
            m.plugin_reloads.clone(),
        );
        r.register(
            "kpx_extension_counter",
            "New connection attempts an extension's rules counted, per service port and counter name: a connection the rule lets through or rejects counts once, a dropped one counts each SYN the client retries (read from the kernel every 2 s; a series goes when no rule names its counter)",
            m.extension_counter.clone(),
        );
        r.register(
            "kpx_extension_counter_series_dropped",
            "Counters extensions' rules named that kpx_extension_counter does not export (more than its 10,000 series)",
            m.extension_series_dropped.clone(),
        );
        r.register(
            "kpx_extension_failures",
            "Syncs in which an extension failed (its error or trap, refused rules, or the kernel write); its last good rules stayed",
            m.extension_failures.clone(),
        );
        r.register(
            "kpx_plugin_render_duration_seconds",
            "Time in the plugin per sync (apply and render)",
            m.plugin_render_duration.clone(),
        );
        r.register(
            "kpx_validation_duration_seconds",
            "Time the host spent checking a plugin's ruleset and rendering it into the kernel's syntax or messages per sync",
            m.validation_duration.clone(),
        );
        r.register(
            "kpx_kernel_rules_lost",
            "Times the periodic check found kube-proxy's rules deleted or flushed by someone else (a full sync wrote them again)",
            m.rules_lost.clone(),
        );
        if mode == ProxyMode::Iptables {
            r.register(
                "kpx_endpoints_not_programmed",
                "Endpoints of service ports over --iptables-max-endpoints-per-port that this node does not program",
                m.endpoints_not_programmed.clone(),
            );
        }
        r.register(
            "kpx_objects_refused",
            "Objects a source refused or dropped, by kind: not valid, not what the API server accepts, not decodable, or defined twice (each logged with its kind, namespace/name and why; the last good version stays)",
            m.objects_refused.clone(),
        );
        r.register("kpx_plugin_calls", "Calls into a plugin", m.plugin_calls.clone());
        r.register(
            "kpx_plugin_fuel_used",
            "Fuel (about one unit per WebAssembly instruction) plugin calls used",
            m.plugin_fuel.clone(),
        );
        Metrics { registry: r, ..m }
    }

    /// `kpx_plugin_reloads_total`'s series of one watched component file
    /// (`component` as `reload::Role::label` names it), at 0 for each
    /// outcome it can have (`rolls_back`: whether a failed first pass
    /// brings the replaced component back), so that they are there from
    /// the start rather than from the first reload. A series that already
    /// counts keeps its count.
    pub fn expect_reloads(&self, component: &str, rolls_back: bool) {
        for outcome in RELOAD_OUTCOMES.iter().filter(|o| rolls_back || **o != "rolled-back") {
            let label = ReloadLabel { component: component.to_string(), outcome: outcome.to_string() };
            drop(self.plugin_reloads.get_or_create(&label));
        }
    }

    /// Where the sources count the objects they refuse
    /// (`kpx_objects_refused_total{kind}`).
    pub fn refusals(&self) -> Refusals {
        let refused = self.objects_refused.clone();
        Refusals::new(move |kind| {
            refused.get_or_create(&KindLabel { kind: kind.to_string() }).inc();
        })
    }

    /// userspace mode: the relays' refusals by reason (counted by the
    /// relays' budget, `userspace::budget`).
    pub fn register_relay_refusals(&mut self, family: Family<ReasonLabel, Counter>) {
        self.registry.register(
            "kpx_userspace_relays_refused",
            "userspace mode: connections closed and UDP datagrams dropped over the relay budget (all relays, a client address's share, a port's share)",
            family,
        );
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("encoding to a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// Every family of `mode` with a sample in each family's label sets.
    fn touched(mode: ProxyMode) -> String {
        let m = Metrics::with(mode, Optional { nfacct: true });
        let f = FamilyLabel::of(IpFamily::V4);
        let table = TableLabel { ip_family: "IPv4".into(), table: "nat".into() };
        let code = CodeLabel { code: "200".into() };
        m.sync_duration.get_or_create(&f).observe(0.003);
        m.full_sync_duration.get_or_create(&f).observe(0.003);
        m.partial_sync_duration.get_or_create(&f).observe(0.003);
        m.last_sync_timestamp.get_or_create(&f).set(1.0);
        m.last_queued_timestamp.get_or_create(&f).set(1.0);
        m.endpoint_changes_total.inc();
        m.service_changes_total.inc();
        m.iptables_restore_failures.get_or_create(&f).inc();
        m.iptables_partial_restore_failures.get_or_create(&f).inc();
        m.iptables_total.get_or_create(&table).set(1);
        m.iptables_last.get_or_create(&table).set(1);
        m.nftables_sync_failures.get_or_create(&f).inc();
        m.nftables_cleanup_failures.get_or_create(&f).inc();
        m.localhost_nodeport_listeners.get_or_create(&f).set(1);
        m.localhost_nodeport_listener_failures.get_or_create(&f).inc();
        let udp = ProtocolLabel { ip_family: "IPv4".into(), protocol: "UDP".into() };
        m.localhost_nodeport_rejected.get_or_create(&udp).inc();
        m.healthz.get_or_create(&code).inc();
        m.livez.get_or_create(&code).inc();
        m.network_programming.get_or_create(&f).observe(1.5);
        let policy = PolicyLabel { ip_family: "IPv4".into(), traffic_policy: "internal".into() };
        m.no_local_endpoints.get_or_create(&policy).set(1);
        m.conntrack_reconcile_duration.get_or_create(&f).observe(0.01);
        m.conntrack_deleted.get_or_create(&f).inc();
        m.encode()
    }

    /// A family as served: (type, label names, buckets).
    type Served = (String, BTreeSet<String>, Vec<f64>);

    /// The `kubeproxy_*` families of an OpenMetrics text, by the name
    /// their samples carry (a counter's with `_total`).
    fn families(text: &str) -> BTreeMap<String, Served> {
        let mut out: BTreeMap<String, Served> = BTreeMap::new();
        let mut base_of: BTreeMap<String, String> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("a TYPE line");
                let exposed = if kind == "counter" { format!("{name}_total") } else { name.to_string() };
                out.insert(exposed.clone(), (kind.to_string(), BTreeSet::new(), Vec::new()));
                base_of.insert(name.to_string(), exposed);
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            let (name, labels) = match line.split_once('{') {
                Some((n, rest)) => (n, rest.split_once('}').expect("closed labels").0),
                None => (line.split_whitespace().next().unwrap(), ""),
            };
            let base = ["_bucket", "_count", "_sum", "_total", "_created"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| base_of.contains_key(*b)))
                .unwrap_or(name);
            let Some(exposed) = base_of.get(base) else { continue };
            let entry = out.get_mut(exposed).expect("declared");
            for pair in labels.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').expect("a label");
                if k == "le" {
                    let v = v.trim_matches('"');
                    if v != "+Inf" && name.ends_with("_bucket") && !entry.2.contains(&v.parse::<f64>().unwrap()) {
                        entry.2.push(v.parse().unwrap());
                    }
                } else {
                    entry.1.insert(k.to_string());
                }
            }
        }
        out.retain(|name, _| name.starts_with("kubeproxy_"));
        out
    }

    fn buckets(spec: &str) -> Vec<f64> {
        match spec {
            "exp15" => (0..15).map(|i| 0.001 * f64::from(1u32 << i)).collect(),
            "netprog" => {
                let mut b = vec![0.0, 0.25, 0.5];
                b.extend((1..=59).map(f64::from));
                b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
                b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
                b
            }
            _ => Vec::new(),
        }
    }

    /// The families kpx serves on /metrics in each upstream mode are
    /// upstream's (tests/upstream/metrics.txt: name, type, labels,
    /// buckets, mode), but for the differences listed there as deliberate.
    #[test]
    fn families_match_upstreams_table() {
        let table = include_str!("../../../tests/upstream/metrics.txt");
        let mut upstream: Vec<(String, Served, Vec<String>)> = Vec::new();
        let mut deliberate: BTreeSet<(String, String)> = BTreeSet::new();
        for line in table.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let cols: Vec<&str> = line.split('|').map(str::trim).collect();
            if cols[0] == "deliberate" {
                for mode in cols[2].split(',') {
                    deliberate.insert((cols[1].to_string(), mode.to_string()));
                }
                continue;
            }
            let labels = cols[2].split(',').filter(|l| *l != "-").map(String::from).collect();
            let modes = match cols[4] {
                "all" => vec!["iptables".into(), "nftables".into(), "ipvs".into()],
                m => m.split(',').map(String::from).collect(),
            };
            upstream.push((cols[0].to_string(), (cols[1].to_string(), labels, buckets(cols[3])), modes));
        }
        assert!(upstream.len() >= 26, "the table has {} rows", upstream.len());
        let mut differences = Vec::new();
        for mode in [ProxyMode::Iptables, ProxyMode::Nftables, ProxyMode::Ipvs] {
            let served = families(&touched(mode));
            let want: BTreeMap<&str, &Served> = upstream
                .iter()
                .filter(|(_, _, modes)| modes.iter().any(|m| m == mode.as_str()))
                .map(|(n, s, _)| (n.as_str(), s))
                .collect();
            for (name, w) in &want {
                match served.get(*name) {
                    None => differences.push(format!("{mode}: {name} is not served")),
                    Some(s) if s != *w => differences.push(format!("{mode}: {name} is {s:?}, upstream's {w:?}")),
                    Some(_) => {}
                }
            }
            for name in served.keys().filter(|n| !want.contains_key(n.as_str())) {
                differences
                    .push(format!("{mode}: {name} is served, upstream registers it in other modes or not at all"));
            }
            differences.retain(|d| {
                let listed = deliberate.iter().any(|(n, m)| d.starts_with(&format!("{m}: {n} ")));
                !(listed && d.starts_with(mode.as_str()))
            });
        }
        assert!(
            differences.is_empty(),
            "differences from upstream not listed as deliberate:\n{}",
            differences.join("\n")
        );
    }

    /// Without nfacct (a kernel without nfnetlink_acct), the two nfacct
    /// families are not served, as upstream's nil collectors.
    #[test]
    fn nfacct_families_only_where_nfacct_works() {
        let without = Metrics::with(ProxyMode::Iptables, Optional { nfacct: false }).encode();
        assert!(!without.contains("kubeproxy_iptables_ct_state_invalid_dropped_packets"), "{without}");
        let with = Metrics::with(ProxyMode::Iptables, Optional { nfacct: true }).encode();
        assert!(with.contains("# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets counter"), "{with}");
    }

    /// The listed differences are real: a deliberate row that no longer
    /// differs is stale.
    #[test]
    fn deliberate_rows_still_differ() {
        let served = families(&touched(ProxyMode::Nftables));
        assert!(served.contains_key("kubeproxy_sync_partial_proxy_rules_duration_seconds"));
    }

    /// What the sources refuse is counted by kind, every known kind's
    /// series there from the start.
    #[test]
    fn refused_objects_are_counted_by_kind() {
        let m = Metrics::new(ProxyMode::Iptables);
        let text = m.encode();
        assert!(text.contains("# TYPE kpx_objects_refused counter"), "{text}");
        for kind in ["Service", "EndpointSlice", "Node", "ServiceCIDR"] {
            assert!(text.contains(&format!("kpx_objects_refused_total{{kind=\"{kind}\"}} 0")), "{kind}: {text}");
        }
        let refusals = m.refusals();
        refusals.count(Some(Kind::Service));
        refusals.clone().count(Some(Kind::Service));
        refusals.count(Some(Kind::EndpointSlice));
        refusals.count(None);
        let text = m.encode();
        for want in [
            "kpx_objects_refused_total{kind=\"Service\"} 2",
            "kpx_objects_refused_total{kind=\"EndpointSlice\"} 1",
            "kpx_objects_refused_total{kind=\"unknown\"} 1",
            "kpx_objects_refused_total{kind=\"Node\"} 0",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        // A default one counts nowhere.
        Refusals::default().count(Some(Kind::Service));
        assert!(m.encode().contains("kpx_objects_refused_total{kind=\"Service\"} 2"));
    }

    /// `kpx_plugin_reloads_total` is exposed under that name, and a
    /// component's series expected at start are at 0 for each outcome it
    /// can have until a reload counts in one.
    #[test]
    fn reload_series_are_there_at_zero_once_expected() {
        let m = Metrics::new(ProxyMode::Nftables);
        assert!(!m.encode().contains("kpx_plugin_reloads_total{"), "no series before a component is expected");
        m.expect_reloads("backend", true);
        m.expect_reloads("scheduler:mine", true);
        m.expect_reloads("extension:deny", false);
        let text = m.encode();
        assert!(text.contains("# TYPE kpx_plugin_reloads counter"), "{text}");
        let series = |text: &str| text.lines().filter(|l| l.starts_with("kpx_plugin_reloads_total{")).count();
        assert_eq!(series(&text), 3 + 3 + 2, "{text}");
        for component in ["backend", "scheduler:mine", "extension:deny"] {
            for outcome in ["applied", "refused"] {
                let want = format!("kpx_plugin_reloads_total{{component=\"{component}\",outcome=\"{outcome}\"}} 0");
                assert!(text.contains(&want), "{want}: {text}");
            }
        }
        assert!(text.contains("kpx_plugin_reloads_total{component=\"backend\",outcome=\"rolled-back\"} 0"), "{text}");
        assert!(!text.contains("component=\"extension:deny\",outcome=\"rolled-back\""), "{text}");
        // A count stays when the series is expected again.
        let applied = ReloadLabel { component: "backend".into(), outcome: "applied".into() };
        m.plugin_reloads.get_or_create(&applied).inc();
        m.expect_reloads("backend", true);
        let text = m.encode();
        assert!(text.contains("kpx_plugin_reloads_total{component=\"backend\",outcome=\"applied\"} 1"), "{text}");
        assert_eq!(series(&text), 8, "{text}");
    }

    /// The extensions' counter series stop at MAX_EXTENSION_SERIES; those
    /// already exported keep their place, the rest are counted.
    #[test]
    fn extension_series_are_bounded() {
        let m = Metrics::with(ProxyMode::Nftables, Optional { nfacct: true });
        let counted = |from: usize, n: usize| -> Vec<(String, String, String, u64)> {
            (from..from + n).map(|i| ("ext".to_string(), format!("ns/s{i:06}:80"), "c".to_string(), 1)).collect()
        };
        let mut series = ExtensionSeries::default();
        series.update(&m, counted(0, MAX_EXTENSION_SERIES + 5), Vec::new());
        let text = m.encode();
        assert_eq!(text.matches("kpx_extension_counter_total{").count(), MAX_EXTENSION_SERIES);
        assert!(text.contains("kpx_extension_counter_series_dropped 5"), "dropped counted");
        // Newcomers listed first do not push out the exported ones.
        let mut next = counted(MAX_EXTENSION_SERIES + 100, 10);
        next.extend(counted(0, MAX_EXTENSION_SERIES));
        series.update(&m, next, Vec::new());
        let text = m.encode();
        assert_eq!(text.matches("kpx_extension_counter_total{").count(), MAX_EXTENSION_SERIES);
        assert!(text.contains("service=\"ns/s000000:80\""), "an exported series stays");
        assert!(!text.contains(&format!("s{:06}", MAX_EXTENSION_SERIES + 100)));
        assert!(text.contains("kpx_extension_counter_series_dropped 10"));
    }
}
