//! What one service port contributes: elements of the dispatch maps, the
//! endpoint maps, the check sets; and, with ClientIP affinity, its own
//! chains (see affinity.rs). The semantics are upstream's (as in the
//! iptables generator), expressed as elements instead of chains.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::affinity;
use super::{Contribution, Element, Fam, Names};
use crate::model::{Endpoint, Node, Protocol, ServicePort, Settings};

/// What an endpoint map is for; each has one select chain and one map per
/// endpoint count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Purpose {
    /// Cluster IP traffic (internal traffic policy).
    Internal,
    /// External IPs and load-balancer IPs (external traffic policy).
    External,
    /// External IPs and LB IPs for pod and node traffic under a Local
    /// external policy (all cluster endpoints).
    Shortcut,
    /// Node ports (external traffic policy).
    NodePortExternal,
    /// Node ports for node traffic under a Local external policy.
    NodePortShortcut,
}

impl Purpose {
    pub const ALL: [Purpose; 5] =
        [Purpose::Internal, Purpose::External, Purpose::Shortcut, Purpose::NodePortExternal, Purpose::NodePortShortcut];

    pub fn name(self) -> &'static str {
        match self {
            Purpose::Internal => "internal",
            Purpose::External => "external",
            Purpose::Shortcut => "shortcut",
            Purpose::NodePortExternal => "nodeport-external",
            Purpose::NodePortShortcut => "nodeport-shortcut",
        }
    }

    /// Keyed by destination address (else by protocol and node port only).
    pub fn keyed_by_address(self) -> bool {
        matches!(self, Purpose::Internal | Purpose::External | Purpose::Shortcut)
    }

    pub fn select_chain(self) -> String {
        format!("select-{}", self.name())
    }

    pub fn affinity_map(self) -> String {
        format!("affinity-{}", self.name())
    }

    /// The lookup key expression, without the numgen part.
    pub fn key_expr(self, fam: Fam) -> String {
        if self.keyed_by_address() {
            format!("{} daddr . meta l4proto . th dport", fam.name())
        } else {
            "meta l4proto . th dport".into()
        }
    }
}

/// One endpoint map: a purpose, a protocol and an endpoint count.
pub type CountMap = (Purpose, Protocol, usize);

/// The map of endpoints for `proto` services with `n` endpoints.
pub fn count_map((purpose, proto, n): CountMap) -> String {
    format!("{}-{proto}-{n}", purpose.name())
}

/// One map per protocol: the data half is spelled `<proto> dport`, which
/// makes nft add an implicit `meta l4proto <proto>` to the rule that uses
/// it (right for that map only). `th dport` cannot be used: nft 1.0.6
/// cannot read such a map back ("conflicting protocols specified: ip vs.
/// th"), which breaks every later transaction on the table.
pub fn count_map_declaration(fam: Fam, map: CountMap) -> String {
    let (purpose, proto, n) = map;
    format!(
        "{} {} {{ typeof {} . numgen random mod {n} : {} daddr . {proto} dport ; }}",
        fam.cmd("add", "map"),
        count_map(map),
        purpose.key_expr(fam),
        fam.name()
    )
}

/// The select-chain rule for one endpoint count: pick slot `numgen random
/// mod n`, DNAT to what the map holds for it (a miss falls through).
pub fn count_rule(fam: Fam, map: CountMap) -> String {
    let (purpose, _, n) = map;
    format!(
        "{} {} dnat {} to {} . numgen random mod {n} map @{}",
        fam.cmd("add", "rule"),
        purpose.select_chain(),
        fam.name(),
        purpose.key_expr(fam),
        count_map(map)
    )
}

pub struct Context<'a> {
    pub settings: &'a Settings,
    pub node: &'a Node,
    pub names: &'a Names,
}

/// `ip . port` as map data.
fn endpoint_value(ep: &Endpoint) -> String {
    format!("{} . {}", ep.ip, ep.port)
}

pub fn contribution(ctx: &Context, svc: &ServicePort) -> Contribution {
    let fam = Fam(ctx.settings.family);
    let family = ctx.settings.family;
    let mut c = Contribution::default();
    let Some(view) = svc.view(family) else {
        return c;
    };
    let el = |set: &str, key: String, value: Option<String>| Element {
        set: ctx.names.get(set),
        key: key.into(),
        value: value.map(Into::into),
    };
    let proto = svc.protocol.as_str();
    let port = svc.port;
    let cluster_ip = view.cluster_ip;
    let (cluster_eps, local_eps) = (&view.cluster_endpoints, &view.local_endpoints);
    let (ext_ips, lb_ips) = (&view.external_ips, &view.load_balancer_ips);
    let (has_endpoints, externally_accessible) = (view.has_endpoints, view.externally_accessible);
    let (itp_local, etp_local) = (view.internal_local, view.external_local);
    let (internal_eps, external_eps) = (view.internal_endpoints(), view.external_endpoints());
    let (has_internal, has_external) = (view.has_internal(), view.has_external());
    let filter_verdict = if has_endpoints { "drop" } else { "goto reject-chain" };
    let tuple = |ip: &IpAddr| format!("{ip} . {proto} . {port}");
    let affinity = svc.affinity_timeout_seconds > 0;
    let chains = affinity.then(|| affinity::chains(fam, svc, cluster_eps, local_eps));

    c.elements.push(el("cluster-ips", cluster_ip.to_string(), None));

    // Which endpoint set a capture uses.
    #[derive(Clone, Copy)]
    enum Set {
        Cluster,
        Local,
    }
    let eps_of = |set: Set| match set {
        Set::Cluster => cluster_eps,
        Set::Local => local_eps,
    };
    let endpoints_for = |purpose: Purpose, key: String, set: Set, c: &mut Contribution| {
        let eps = eps_of(set);
        if eps.is_empty() {
            return;
        }
        if let Some(chains) = &chains {
            let chain = match set {
                Set::Cluster => &chains.cluster,
                Set::Local => &chains.local,
            };
            c.elements.push(el(&purpose.affinity_map(), key, Some(format!("goto {chain}"))));
            return;
        }
        let map = (purpose, svc.protocol, eps.len());
        c.counts.insert(map);
        for (i, ep) in eps.iter().enumerate() {
            c.elements.push(el(&count_map(map), format!("{key} . {i}"), Some(endpoint_value(ep))));
        }
    };
    let internal_set = if itp_local { Set::Local } else { Set::Cluster };
    let external_set = if etp_local { Set::Local } else { Set::Cluster };

    // Cluster IP.
    if has_internal {
        c.elements.push(el("service-ips", tuple(&cluster_ip), Some("goto cluster-ip".into())));
        endpoints_for(Purpose::Internal, tuple(&cluster_ip), internal_set, &mut c);
    } else {
        c.elements.push(el("no-endpoint-services", tuple(&cluster_ip), Some(filter_verdict.into())));
    }
    let external_chain = if etp_local { "external-local" } else { "external-cluster" };
    // External IPs and load-balancer IPs.
    for ip in ext_ips.iter().chain(lb_ips) {
        if has_endpoints {
            c.elements.push(el("service-ips", tuple(ip), Some(format!("goto {external_chain}"))));
            endpoints_for(Purpose::External, tuple(ip), external_set, &mut c);
            if etp_local {
                endpoints_for(Purpose::Shortcut, tuple(ip), Set::Cluster, &mut c);
            }
        }
        if !has_external {
            c.elements.push(el("no-endpoint-services", tuple(ip), Some(filter_verdict.into())));
        }
    }
    // Load-balancer source ranges.
    let ranges: Vec<_> = svc.load_balancer_source_ranges.iter().filter(|r| r.family() == family).collect();
    if has_endpoints && !lb_ips.is_empty() && !ranges.is_empty() {
        let node_ip = ctx.node.addresses.iter().find(|ip| family.matches(ip));
        let from_node = ranges.iter().any(|r| node_ip.is_some_and(|ip| r.contains(ip)));
        for ip in lb_ips {
            c.elements.push(el("firewall-ips", tuple(ip), None));
            for r in &ranges {
                c.elements.push(el("firewall-allow", format!("{} . {r}", tuple(ip)), None));
            }
            if from_node {
                c.elements.push(el("firewall-allow", format!("{} . {ip}", tuple(ip)), None));
            }
        }
    }
    // Node port.
    if svc.node_port != 0 {
        let np = format!("{proto} . {}", svc.node_port);
        if has_endpoints {
            let chain = if etp_local { "nodeport-local" } else { "nodeport-cluster" };
            c.elements.push(el("service-nodeports", np.clone(), Some(format!("goto {chain}"))));
            endpoints_for(Purpose::NodePortExternal, np.clone(), external_set, &mut c);
            if etp_local {
                endpoints_for(Purpose::NodePortShortcut, np.clone(), Set::Cluster, &mut c);
            }
        }
        if !has_external {
            c.elements.push(el("no-endpoint-nodeports", np, Some(filter_verdict.into())));
        }
    }
    // Hairpin: an endpoint reaching itself through the service.
    let mut reachable: BTreeSet<IpAddr> = BTreeSet::new();
    if has_internal {
        reachable.extend(internal_eps.iter().map(|e| e.ip));
    }
    if has_endpoints && externally_accessible {
        reachable.extend(external_eps.iter().map(|e| e.ip));
        if etp_local {
            reachable.extend(cluster_eps.iter().map(|e| e.ip));
        }
    }
    for ip in reachable {
        c.elements.push(el("hairpin", format!("{ip} . {ip}"), None));
    }
    if let Some(chains) = chains {
        c.objects = chains.objects;
    }
    c
}
