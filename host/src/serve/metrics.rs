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

use kpx_rules::model::ProxyMode;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TableLabel {
    pub table: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    pub traffic_policy: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabel {
    pub plugin: String,
}

/// A component file replaced while kpx runs, and what became of it.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabel {
    /// `backend`, or `scheduler:NAME`.
    pub component: String,
    /// `applied` or `refused`.
    pub outcome: String,
}

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
        let mut named = std::collections::BTreeSet::new();
        for (extension, service, counter, packets) in counted {
            let key = (extension, service, counter);
            m.extension_counter.get_or_create(&label(&key)).inc_by(packets);
            named.insert(key);
        }
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

fn sync_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 15)
}

/// upstream's network programming buckets: 0.25 s to 5 min.
fn programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
}

/// Every metric kpx exports; cheap to update from the sync thread.
pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    pub full_sync_duration: Histogram,
    pub partial_sync_duration: Histogram,
    pub last_sync_timestamp: FloatGauge,
    pub last_queued_timestamp: FloatGauge,
    pub endpoint_changes_total: Counter,
    pub endpoint_changes_pending: Gauge,
    pub service_changes_total: Counter,
    pub service_changes_pending: Gauge,
    pub iptables_restore_failures: Counter,
    pub nftables_sync_failures: Counter,
    /// kpx's: IPVS writes the kernel refused (upstream's ipvs mode has no such counter).
    pub ipvs_sync_failures: Counter,
    pub healthz: Family<CodeLabel, Counter>,
    pub livez: Family<CodeLabel, Counter>,
    pub network_programming: Histogram,
    pub iptables_total: Family<TableLabel, Gauge>,
    pub no_local_endpoints: Family<PolicyLabel, Gauge>,
    pub plugin_calls: Family<PluginLabel, Counter>,
    pub plugin_fuel: Family<PluginLabel, Counter>,
    pub plugin_traps: Family<PluginLabel, Counter>,
    pub plugin_refusals: Family<PluginLabel, Counter>,
    pub plugin_reloads: Family<ReloadLabel, Counter>,
    pub extension_counter: Family<ExtensionCounterLabel, Counter>,
    pub extension_failures: Family<ExtensionLabel, Counter>,
    pub plugin_render_duration: Histogram,
    pub validation_duration: Histogram,
    pub conntrack_reconcile_duration: Histogram,
    pub conntrack_deleted: Counter,
    pub rules_lost: Counter,
    /// kpx's: endpoints left out by --iptables-max-endpoints-per-port.
    pub endpoints_not_programmed: Gauge,
}

impl Metrics {
    /// The metrics of `mode` (the other mode's failure counter is not
    /// registered, as upstream registers per mode).
    pub fn new(mode: ProxyMode) -> Metrics {
        let mut r = Registry::default();
        // The client appends `_total` to counters.
        let m = Metrics {
            sync_duration: Histogram::new(sync_buckets()),
            full_sync_duration: Histogram::new(sync_buckets()),
            partial_sync_duration: Histogram::new(sync_buckets()),
            last_sync_timestamp: FloatGauge::default(),
            last_queued_timestamp: FloatGauge::default(),
            endpoint_changes_total: Counter::default(),
            endpoint_changes_pending: Gauge::default(),
            service_changes_total: Counter::default(),
            service_changes_pending: Gauge::default(),
            iptables_restore_failures: Counter::default(),
            nftables_sync_failures: Counter::default(),
            ipvs_sync_failures: Counter::default(),
            healthz: Family::default(),
            livez: Family::default(),
            network_programming: Histogram::new(programming_buckets()),
            iptables_total: Family::default(),
            no_local_endpoints: Family::default(),
            plugin_calls: Family::default(),
            plugin_fuel: Family::default(),
            plugin_traps: Family::default(),
            plugin_refusals: Family::default(),
            plugin_reloads: Family::default(),
            extension_counter: Family::default(),
            extension_failures: Family::default(),
            plugin_render_duration: Histogram::new(sync_buckets()),
            validation_duration: Histogram::new(sync_buckets()),
            conntrack_reconcile_duration: Histogram::new(sync_buckets()),
            conntrack_deleted: Counter::default(),
            rules_lost: Counter::default(),
            endpoints_not_programmed: Gauge::default(),
            registry: Registry::default(),
        };
        r.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            m.sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            m.full_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            m.partial_sync_duration.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            m.last_sync_timestamp.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            m.last_queued_timestamp.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            m.endpoint_changes_total.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            m.endpoint_changes_pending.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            m.service_changes_total.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            m.service_changes_pending.clone(),
        );
        match mode {
            // userspace mode writes its REDIRECT rules with iptables-restore too.
            ProxyMode::Iptables | ProxyMode::Userspace => {
                r.register(
                    "kubeproxy_sync_proxy_rules_iptables_restore_failures",
                    "Cumulative proxy iptables restore failures",
                    m.iptables_restore_failures.clone(),
                );
                r.register(
                    "kubeproxy_sync_proxy_rules_iptables_total",
                    "Total number of iptables rules owned by kube-proxy",
                    m.iptables_total.clone(),
                );
            }
            ProxyMode::Nftables => r.register(
                "kubeproxy_sync_proxy_rules_nftables_sync_failures",
                "Cumulative proxy nftables sync failures",
                m.nftables_sync_failures.clone(),
            ),
            ProxyMode::Ipvs => r.register(
                "kpx_sync_proxy_rules_ipvs_sync_failures",
                "Cumulative IPVS writes the kernel refused",
                m.ipvs_sync_failures.clone(),
            ),
        }
        r.register("kubeproxy_proxy_healthz", "Cumulative proxy healthz HTTP status", m.healthz.clone());
        r.register("kubeproxy_proxy_livez", "Cumulative proxy livez HTTP status", m.livez.clone());
        r.register("kpx_plugin_traps", "Plugin calls that trapped (the instance is replaced)", m.plugin_traps.clone());
        r.register("kpx_plugin_refusals", "Rulesets of a plugin the host refused", m.plugin_refusals.clone());
        r.register(
            "kpx_plugin_reloads",
            "Component files replaced while kpx ran, applied or refused (the running component kept)",
            m.plugin_reloads.clone(),
        );
        r.register(
            "kpx_extension_counter",
            "New connections an extension's rules counted, per service port and counter name (read from the kernel every 2 s; a series goes when no rule names its counter)",
            m.extension_counter.clone(),
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
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            m.network_programming.clone(),
        );
        r.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            m.no_local_endpoints.clone(),
        );
        r.register(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "Cleanup of stale UDP and SCTP conntrack entries: latency in seconds",
            m.conntrack_reconcile_duration.clone(),
        );
        r.register(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative stale conntrack entries deleted",
            m.conntrack_deleted.clone(),
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
        r.register("kpx_plugin_calls", "Calls into a plugin", m.plugin_calls.clone());
        r.register(
            "kpx_plugin_fuel_used",
            "Fuel (about one unit per WebAssembly instruction) plugin calls used",
            m.plugin_fuel.clone(),
        );
        Metrics { registry: r, ..m }
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

    #[test]
    fn names_and_types_as_upstream() {
        let m = Metrics::new(ProxyMode::Nftables);
        m.endpoint_changes_total.inc();
        m.healthz.get_or_create(&CodeLabel { code: "200".into() }).inc();
        m.sync_duration.observe(0.003);
        let text = m.encode();
        assert!(!text.contains("iptables_restore_failures"), "iptables metrics only in iptables mode");
        for line in [
            "# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\"} 1",
            "kubeproxy_sync_proxy_rules_duration_seconds_count 1",
            "# TYPE kubeproxy_sync_proxy_rules_endpoint_changes counter",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
            "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total 0",
            "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
    }
}
