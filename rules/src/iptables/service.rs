//! The rules of one service port: upstream's `syncProxyRules` loop body.
//!
//! - nat `KUBE-SERVICES` captures the cluster IP (to the internal policy
//!   chain), external IPs and load-balancer IPs (to `KUBE-EXT-`, or to
//!   `KUBE-FW-` when source ranges apply); nat `KUBE-NODEPORTS` the node port;
//! - `KUBE-EXT-` masquerades (Cluster policy) or short-circuits pod and
//!   node traffic (Local policy) before the external policy chain;
//! - `KUBE-SVC-` / `KUBE-SVL-` pick an endpoint (affinity first);
//!   `KUBE-SEP-` masquerades hairpin traffic and DNATs;
//! - filter REJECTs when there are no endpoints at all, and DROPs when a
//!   Local policy has no local endpoints.

use std::collections::BTreeSet;

use super::Table;
use crate::hash::{endpoint_chain, service_chain};
use crate::model::{Endpoint, LocalTraffic, Node, ServicePort, Settings};

/// What every service's rules depend on.
pub struct Context<'a> {
    pub settings: &'a Settings,
    pub node: &'a Node,
    /// Above 1000 endpoints: per-endpoint rules carry no comment.
    pub large_cluster: bool,
}

impl Context<'_> {
    /// `-s <pod cidr>` / `-i <bridge>`: traffic from a local pod.
    fn if_local(&self) -> Option<String> {
        self.local_match().map(|(flag, value)| format!("{flag} {value}"))
    }

    /// `! -s <pod cidr>` / `! -i <bridge>`: traffic not from a local pod.
    fn if_not_local(&self) -> Option<String> {
        self.local_match().map(|(flag, value)| format!("! {flag} {value}"))
    }

    fn local_match(&self) -> Option<(&'static str, String)> {
        match &self.settings.local_traffic {
            LocalTraffic::None => None,
            LocalTraffic::Cidrs(cidrs) => {
                cidrs.iter().find(|c| c.family() == self.settings.family).map(|c| ("-s", c.to_string()))
            }
            LocalTraffic::BridgeInterface(name) => Some(("-i", name.clone())),
            LocalTraffic::InterfaceNamePrefix(prefix) => Some(("-i", format!("{prefix}+"))),
        }
    }

    /// `-m comment --comment <text>`, left out in large-cluster mode.
    fn comment(&self, text: &str) -> String {
        if self.large_cluster { String::new() } else { format!(" -m comment --comment {text}") }
    }
}

fn quoted(text: &str) -> String {
    format!("\"{text}\"")
}

/// Writes one service port's rules; its own chains only when `write_chains`.
/// Returns the nat chains it owns (when written; else empty and the caller
/// keeps the previous list).
pub fn write(ctx: &Context, svc: &ServicePort, write_chains: bool, filter: &mut Table, nat: &mut Table) -> Vec<String> {
    let family = ctx.settings.family;
    let Some(view) = svc.view(family) else {
        return Vec::new();
    };
    let key = svc.key.as_str();
    let proto = svc.protocol.as_str();
    let port = svc.port;
    let cluster_ip = view.cluster_ip;
    let (cluster_eps, local_eps) = (&view.cluster_endpoints, &view.local_endpoints);
    let (ext_ips, lb_ips) = (&view.external_ips, &view.load_balancer_ips);
    let (has_endpoints, externally_accessible) = (view.has_endpoints, view.externally_accessible);
    let (itp_local, etp_local) = (view.internal_local, view.external_local);
    let (has_internal, has_external) = (view.has_internal(), view.has_external());

    let svc_chain = service_chain("KUBE-SVC-", key, proto);
    let svl_chain = service_chain("KUBE-SVL-", key, proto);
    let ext_chain = service_chain("KUBE-EXT-", key, proto);
    let fw_chain = service_chain("KUBE-FW-", key, proto);

    let uses_cluster_chain = !cluster_eps.is_empty() && (!itp_local || (externally_accessible && !etp_local));
    let uses_local_chain = !local_eps.is_empty() && (itp_local || etp_local);
    let internal_chain = if itp_local { &svl_chain } else { &svc_chain };
    let external_policy_chain = if etp_local { &svl_chain } else { &svc_chain };
    let uses_fw = has_endpoints && !lb_ips.is_empty() && !svc.load_balancer_source_ranges.is_empty();
    let lb_chain = if uses_fw { &fw_chain } else { &ext_chain };
    let uses_ext_chain = has_endpoints && externally_accessible;

    let (internal_filter, external_filter) = if !has_endpoints {
        let c = quoted(&format!("{key} has no endpoints"));
        (("REJECT", c.clone()), ("REJECT", c))
    } else {
        let c = quoted(&format!("{key} has no local endpoints"));
        (("DROP", c.clone()), ("DROP", c))
    };
    let dst = |ip: &dyn std::fmt::Display| format!("-m {proto} -p {proto} -d {ip} --dport {port}");

    // Cluster IP.
    if has_internal {
        nat.rule(&format!(
            "-A KUBE-SERVICES -m comment --comment {} {} -j {internal_chain}",
            quoted(&format!("{key} cluster IP")),
            dst(&cluster_ip)
        ));
    } else {
        let (target, comment) = &internal_filter;
        filter.rule(&format!("-A KUBE-SERVICES -m comment --comment {comment} {} -j {target}", dst(&cluster_ip)));
    }
    // External IPs.
    for ip in ext_ips {
        if has_endpoints {
            nat.rule(&format!(
                "-A KUBE-SERVICES -m comment --comment {} {} -j {ext_chain}",
                quoted(&format!("{key} external IP")),
                dst(ip)
            ));
        }
        if !has_external {
            let (target, comment) = &external_filter;
            filter.rule(&format!("-A KUBE-EXTERNAL-SERVICES -m comment --comment {comment} {} -j {target}", dst(ip)));
        }
    }
    // Load-balancer IPs.
    for ip in lb_ips {
        if has_endpoints {
            nat.rule(&format!(
                "-A KUBE-SERVICES -m comment --comment {} {} -j {lb_chain}",
                quoted(&format!("{key} loadbalancer IP")),
                dst(ip)
            ));
        }
        if uses_fw {
            filter.rule(&format!(
                "-A KUBE-PROXY-FIREWALL -m comment --comment {} {} -j DROP",
                quoted(&format!("{key} traffic not accepted by {fw_chain}")),
                dst(ip)
            ));
        }
    }
    if !has_external {
        for ip in lb_ips {
            let (target, comment) = &external_filter;
            filter.rule(&format!("-A KUBE-EXTERNAL-SERVICES -m comment --comment {comment} {} -j {target}", dst(ip)));
        }
    }
    // Node port.
    if svc.node_port != 0 {
        if has_endpoints {
            nat.rule(&format!(
                "-A KUBE-NODEPORTS -m comment --comment {key} -m {proto} -p {proto} --dport {} -j {ext_chain}",
                svc.node_port
            ));
        }
        if !has_external {
            let (target, comment) = &external_filter;
            filter.rule(&format!(
                "-A KUBE-EXTERNAL-SERVICES -m comment --comment {comment} -m addrtype --dst-type LOCAL -m {proto} -p {proto} --dport {} -j {target}",
                svc.node_port
            ));
        }
    }
    // Health-check node port.
    if svc.health_check_node_port != 0 {
        filter.rule(&format!(
            "-A KUBE-NODEPORTS -m comment --comment {} -m tcp -p tcp --dport {} -j ACCEPT",
            quoted(&format!("{key} health check node port")),
            svc.health_check_node_port
        ));
    }

    if !write_chains {
        return Vec::new();
    }
    let mut owned = Vec::new();

    // Internal traffic: masquerade off-cluster sources.
    if has_internal {
        let args = format!("-m comment --comment {} {}", quoted(&format!("{key} cluster IP")), dst(&cluster_ip));
        if ctx.settings.masquerade_all {
            nat.rule(&format!("-A {internal_chain} {args} -j KUBE-MARK-MASQ"));
        } else if let Some(not_local) = ctx.if_not_local() {
            nat.rule(&format!("-A {internal_chain} {args} {not_local} -j KUBE-MARK-MASQ"));
        }
    }
    // External traffic.
    if uses_ext_chain {
        nat.chain(&ext_chain);
        owned.push(ext_chain.clone());
        if !etp_local {
            nat.rule(&format!(
                "-A {ext_chain} -m comment --comment {} -j KUBE-MARK-MASQ",
                quoted(&format!("masquerade traffic for {key} external destinations"))
            ));
        } else {
            if let Some(local) = ctx.if_local() {
                nat.rule(&format!(
                    "-A {ext_chain} -m comment --comment {} {local} -j {svc_chain}",
                    quoted(&format!("pod traffic for {key} external destinations"))
                ));
            }
            nat.rule(&format!(
                "-A {ext_chain} -m comment --comment {} -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
                quoted(&format!("masquerade LOCAL traffic for {key} external destinations"))
            ));
            nat.rule(&format!(
                "-A {ext_chain} -m comment --comment {} -m addrtype --src-type LOCAL -j {svc_chain}",
                quoted(&format!("route LOCAL traffic for {key} external destinations"))
            ));
        }
        if has_external {
            nat.rule(&format!("-A {ext_chain} -j {external_policy_chain}"));
        }
    }
    // Load-balancer source ranges.
    if uses_fw {
        nat.chain(&fw_chain);
        owned.push(fw_chain.clone());
        let args = format!("-A {fw_chain} -m comment --comment {}", quoted(&format!("{key} loadbalancer IP")));
        let node_ip = ctx.node.addresses.iter().find(|ip| family.matches(ip));
        let mut allow_from_node = false;
        for cidr in svc.load_balancer_source_ranges.iter().filter(|c| c.family() == family) {
            nat.rule(&format!("{args} -s {cidr} -j {ext_chain}"));
            allow_from_node |= node_ip.is_some_and(|ip| cidr.contains(ip));
        }
        if allow_from_node {
            for ip in lb_ips {
                nat.rule(&format!("{args} -s {ip} -j {ext_chain}"));
            }
        }
        nat.rule(&format!(
            "-A {fw_chain} -m comment --comment {}",
            quoted(&format!("other traffic to {key} will be dropped by KUBE-PROXY-FIREWALL"))
        ));
    }

    let sep = |ep: &Endpoint| endpoint_chain(key, proto, &ep.host_port());
    if uses_cluster_chain {
        nat.chain(&svc_chain);
        owned.push(svc_chain.clone());
        write_endpoint_choice(ctx, svc, &svc_chain, cluster_eps, &sep, nat);
    }
    if uses_local_chain {
        nat.chain(&svl_chain);
        owned.push(svl_chain.clone());
        write_endpoint_choice(ctx, svc, &svl_chain, local_eps, &sep, nat);
    }
    // Endpoint chains, for every endpoint some policy chain can reach.
    let mut reachable: Vec<&Endpoint> = Vec::new();
    let mut seen = BTreeSet::new();
    let reach_cluster = if uses_cluster_chain { cluster_eps.as_slice() } else { &[] };
    let reach_local = if uses_local_chain { local_eps.as_slice() } else { &[] };
    for ep in reach_cluster.iter().chain(reach_local) {
        if seen.insert((ep.ip, ep.port)) {
            reachable.push(ep);
        }
    }
    for ep in reachable {
        let chain = sep(ep);
        nat.chain(&chain);
        let comment = ctx.comment(key);
        nat.rule(&format!("-A {chain}{comment} -s {} -j KUBE-MARK-MASQ", ep.ip));
        let affinity =
            if svc.affinity_timeout_seconds > 0 { format!(" -m recent --name {chain} --set") } else { String::new() };
        nat.rule(&format!(
            "-A {chain}{comment}{affinity} -m {proto} -p {proto} -j DNAT --to-destination {}",
            ep.host_port()
        ));
        owned.push(chain);
    }
    owned
}

/// upstream's `writeServiceToEndpointRules`: affinity checks, then the
/// statistic rules with p = 1/(n-i).
fn write_endpoint_choice(
    ctx: &Context,
    svc: &ServicePort,
    chain: &str,
    endpoints: &[&Endpoint],
    sep: &dyn Fn(&Endpoint) -> String,
    nat: &mut Table,
) {
    let key = &svc.key;
    if svc.affinity_timeout_seconds > 0 {
        for ep in endpoints {
            let target = sep(ep);
            let comment = ctx.comment(&quoted(&format!("{key} -> {}", ep.host_port())));
            nat.rule(&format!(
                "-A {chain}{comment} -m recent --name {target} --rcheck --seconds {} --reap -j {target}",
                svc.affinity_timeout_seconds
            ));
        }
    }
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let comment = ctx.comment(&quoted(&format!("{key} -> {}", ep.host_port())));
        let target = sep(ep);
        if i + 1 < n {
            nat.rule(&format!(
                "-A {chain}{comment} -m statistic --mode random --probability {} -j {target}",
                super::probability(n - i)
            ));
        } else {
            nat.rule(&format!("-A {chain}{comment} -j {target}"));
        }
    }
}
