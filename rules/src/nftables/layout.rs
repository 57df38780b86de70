//! The fixed part of the table: base chains, the shared chains, the sets
//! and maps. Its size depends on nothing but the settings.

use super::elements::Purpose;
use super::{Element, Fam, Names, element_commands};
use crate::model::{Cluster, LocalTraffic, NodePortAddresses, Settings};

/// Base chains: (name, type, hook, priority). Numeric priorities: nft
/// accepts `dstnat` / `srcnat` only on some hooks (dstnat = -100,
/// filter = 0, srcnat = 100).
pub const BASE_CHAINS: &[(&str, &str, &str, &str)] = &[
    ("filter-prerouting-pre-dnat", "filter", "prerouting", "-110"),
    ("filter-output-pre-dnat", "filter", "output", "-110"),
    ("filter-input", "filter", "input", "0"),
    ("filter-forward", "filter", "forward", "0"),
    ("filter-output", "filter", "output", "0"),
    ("nat-prerouting", "nat", "prerouting", "-100"),
    ("nat-output", "nat", "output", "-100"),
    ("nat-postrouting", "nat", "postrouting", "100"),
];

/// Regular chains every table has.
pub const CHAINS: &[&str] = &[
    "services",
    "service-endpoints-check",
    "nodeport-endpoints-check",
    "reject-chain",
    "firewall-check",
    "cluster-ips-check",
    "mark-for-masquerade",
    "masquerading",
    "cluster-ip",
    "external-cluster",
    "external-local",
    "nodeport-cluster",
    "nodeport-local",
];

pub struct Layout<'a> {
    pub fam: Fam,
    pub settings: &'a Settings,
    pub cluster: &'a Cluster,
}

impl Layout<'_> {
    fn add(&self, what: &str) -> String {
        self.fam.cmd("add", what)
    }

    fn node_ports_only(&self) -> Option<&Vec<crate::model::Cidr>> {
        match &self.settings.nodeport_addresses {
            NodePortAddresses::All => None,
            NodePortAddresses::Only(cidrs) => Some(cidrs),
        }
    }

    pub fn declarations(&self) -> Vec<String> {
        let (fam, addr) = (self.fam, self.fam.addr_type());
        let mut out = Vec::new();
        for (name, kind, hook, priority) in BASE_CHAINS {
            out.push(format!("{} {name} {{ type {kind} hook {hook} priority {priority} ; }}", self.add("chain")));
        }
        for name in CHAINS.iter().map(|c| c.to_string()).chain(Purpose::ALL.iter().map(|p| p.select_chain())) {
            out.push(format!("{} {name}", self.add("chain")));
        }
        let tuple = format!("{addr} . inet_proto . inet_service");
        let sets = [
            ("set", "cluster-ips", format!("type {addr} ; comment \"Active ClusterIPs\" ;")),
            ("set", "nodeport-ips", format!("type {addr} ; comment \"IPs that accept NodePort traffic\" ;")),
            ("set", "service-cidrs", format!("type {addr} ; flags interval ; comment \"ServiceCIDR ranges\" ;")),
            ("map", "service-ips", format!("type {tuple} : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ;")),
            ("map", "service-nodeports", "type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ;".into()),
            ("map", "no-endpoint-services", format!("type {tuple} : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ;")),
            ("map", "no-endpoint-nodeports", "type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ;".into()),
            ("set", "firewall-ips", format!("type {tuple} ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ;")),
            ("set", "firewall-allow", format!("type {tuple} . {addr} ; flags interval ; comment \"destinations and sources allowed by LoadBalancerSourceRanges\" ;")),
            ("set", "hairpin", format!("type {addr} . {addr} ; comment \"endpoint . endpoint: traffic an endpoint sends itself\" ;")),
        ];
        for (kind, name, body) in sets {
            out.push(format!("{} {name} {{ {body} }}", self.add(kind)));
        }
        for p in Purpose::ALL {
            let key = if p.keyed_by_address() { tuple.clone() } else { "inet_proto . inet_service".into() };
            out.push(format!("{} {} {{ type {key} : verdict ; }}", self.add("map"), p.affinity_map()));
        }
        let _ = fam;
        out
    }

    /// `iifname "x"` / `ip saddr 10.0.0.0/8`, negated or not.
    fn local_match(&self, negate: bool) -> Option<String> {
        let not = if negate { "!= " } else { "" };
        match &self.settings.local_traffic {
            LocalTraffic::None => None,
            LocalTraffic::Cidrs(cidrs) => cidrs
                .iter()
                .find(|c| c.family() == self.settings.family)
                .map(|c| format!("{} saddr {not}{c}", self.fam.name())),
            LocalTraffic::BridgeInterface(name) => Some(format!("iifname {not}\"{name}\"")),
            LocalTraffic::InterfaceNamePrefix(prefix) => Some(format!("iifname {not}\"{prefix}*\"")),
        }
    }

    pub fn rules(&self) -> Vec<String> {
        let f = self.fam.name();
        let r = |chain: &str, rule: String| format!("{} {chain} {rule}", self.fam.cmd("add", "rule"));
        let mark = format!("{:#x}", self.settings.masquerade_mark());
        let tuple = format!("{f} daddr . meta l4proto . th dport");
        let mut out = vec![
            r("filter-prerouting-pre-dnat", "ct state new jump firewall-check".into()),
            r("filter-output-pre-dnat", "ct state new jump firewall-check".into()),
            r("filter-input", "ct state new jump nodeport-endpoints-check".into()),
            r("filter-input", "ct state new jump service-endpoints-check".into()),
        ];
        if !self.settings.conntrack_tcp_be_liberal {
            out.push(r("filter-forward", "ct state invalid drop".into()));
        }
        out.extend([
            r("filter-forward", "ct state new jump service-endpoints-check".into()),
            r("filter-forward", "ct state new jump cluster-ips-check".into()),
            r("filter-output", "ct state new jump service-endpoints-check".into()),
            r("filter-output", "ct state new jump cluster-ips-check".into()),
            r("nat-prerouting", "jump services".into()),
            r("nat-output", "jump services".into()),
            r("nat-postrouting", "jump masquerading".into()),
            r("services", format!("{tuple} vmap @service-ips")),
        ]);
        let node_port_capture = match self.node_ports_only() {
            None => format!("fib daddr type local {f} daddr != {}", self.fam.loopback()),
            Some(_) => format!("{f} daddr @nodeport-ips"),
        };
        out.extend([
            r("services", format!("{node_port_capture} meta l4proto . th dport vmap @service-nodeports")),
            r("service-endpoints-check", format!("{tuple} vmap @no-endpoint-services")),
            r(
                "nodeport-endpoints-check",
                format!("{node_port_capture} meta l4proto . th dport vmap @no-endpoint-nodeports"),
            ),
            r("reject-chain", "reject".into()),
            r("firewall-check", format!("{tuple} @firewall-ips {tuple} . {f} saddr != @firewall-allow drop")),
            r("cluster-ips-check", format!("{f} daddr @cluster-ips reject")),
            r("cluster-ips-check", format!("{f} daddr @service-cidrs drop")),
            r("mark-for-masquerade", format!("meta mark set meta mark or {mark}")),
            r("masquerading", format!("{f} saddr . {f} daddr @hairpin jump mark-for-masquerade")),
            r("masquerading", format!("meta mark & {mark} == 0 return")),
            r("masquerading", format!("meta mark set meta mark xor {mark}")),
            r("masquerading", "masquerade fully-random".into()),
        ]);
        // Cluster IPs: masquerade off-cluster sources.
        if self.settings.masquerade_all {
            out.push(r("cluster-ip", "jump mark-for-masquerade".into()));
        } else if let Some(not_local) = self.local_match(true) {
            out.push(r("cluster-ip", format!("{not_local} jump mark-for-masquerade")));
        }
        out.push(r("cluster-ip", "goto select-internal".into()));
        // External destinations, Cluster policy: always masquerade.
        for (chain, select) in
            [("external-cluster", "select-external"), ("nodeport-cluster", "select-nodeport-external")]
        {
            out.push(r(chain, "jump mark-for-masquerade".into()));
            out.push(r(chain, format!("goto {select}")));
        }
        // Local policy: pod and node traffic short-circuit to all endpoints.
        for (chain, shortcut, select) in [
            ("external-local", "select-shortcut", "select-external"),
            ("nodeport-local", "select-nodeport-shortcut", "select-nodeport-external"),
        ] {
            if let Some(local) = self.local_match(false) {
                out.push(r(chain, format!("{local} goto {shortcut}")));
            }
            out.push(r(chain, "fib saddr type local jump mark-for-masquerade".into()));
            out.push(r(chain, format!("fib saddr type local goto {shortcut}")));
            out.push(r(chain, format!("goto {select}")));
        }
        // Select chains: affinity Services first, then the endpoint maps.
        for p in Purpose::ALL {
            out.push(r(&p.select_chain(), format!("{} vmap @{}", p.key_expr(self.fam), p.affinity_map())));
        }
        out
    }

    /// Elements that come from the settings and the cluster.
    pub fn static_elements(&self, names: &Names) -> Vec<String> {
        let mut elements = Vec::new();
        if let Some(cidrs) = self.node_ports_only() {
            for c in cidrs.iter().filter(|c| c.family() == self.settings.family) {
                elements.push(Element { set: names.get("nodeport-ips"), key: c.addr.to_string().into(), value: None });
            }
        }
        for c in self.cluster.service_cidrs.iter().filter(|c| c.family() == self.settings.family) {
            elements.push(Element { set: names.get("service-cidrs"), key: c.to_string().into(), value: None });
        }
        element_commands(self.fam, "add", &elements)
    }
}
