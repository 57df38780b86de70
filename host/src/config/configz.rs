//! `/configz`: the configuration in effect, as upstream's
//! `KubeProxyConfiguration` (see config/file.rs for the typed form that
//! --config reads).

use std::time::Duration;

use super::{Config, DetectLocalMode, Source, format_duration};

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
