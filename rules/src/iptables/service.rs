//! The rules of one service port: upstream's `syncProxyRules` loop body,
//! as typed rules.
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

use std::collections::{BTreeMap, btree_map};
use std::net::IpAddr;

use crate::hash::endpoint_chain;
use crate::model::{
    Cidr, Endpoint, HashField, LocalTraffic, Node, Plan, ProxyMode, ServicePort, ServiceView, Settings,
};
use crate::ops::iptables::{AddressMatch, Hook, InterfaceMatch, Match, Rule, Ruleset, Table, Target};
use crate::ops::probability_units;

/// What every service's rules depend on.
pub struct Context<'a> {
    pub settings: &'a Settings,
    pub node: &'a Node,
    /// Above 1000 endpoints: per-endpoint rules carry no comment.
    pub large_cluster: bool,
    /// `probabilities[n]`: [`crate::ops::probability_one_in`]`(n)`, for
    /// every endpoint count of the render (its float formatting is slow).
    pub probabilities: &'a [u32],
}

impl Context<'_> {
    /// `-s <pod cidr>` / `-i <bridge>`: traffic from a local pod (or, with
    /// `negate`, not from one).
    fn local_match(&self, negate: bool) -> Option<Match> {
        local_traffic_match(self.settings, negate)
    }

    /// A comment, left out (and not formatted) in large-cluster mode.
    fn endpoint_comment(&self, text: impl FnOnce() -> String) -> Option<Match> {
        (!self.large_cluster).then(|| Match::Comment(text()))
    }
}

/// `-s <pod cidr>` / `-i <bridge>`: traffic from a local pod (or, with
/// `negate`, not from one); None when local traffic is not detected.
pub fn local_traffic_match(settings: &Settings, negate: bool) -> Option<Match> {
    match &settings.local_traffic {
        LocalTraffic::None => None,
        LocalTraffic::Cidrs(cidrs) => cidrs
            .iter()
            .find(|c| c.family() == settings.family)
            .map(|c| Match::Source(AddressMatch { negate, cidr: *c })),
        LocalTraffic::BridgeInterface(name) => {
            Some(Match::InInterface(InterfaceMatch { negate, name: name.clone(), prefix: false }))
        }
        LocalTraffic::InterfaceNamePrefix(prefix) => {
            Some(Match::InInterface(InterfaceMatch { negate, name: prefix.clone(), prefix: true }))
        }
    }
}

/// A slot table over the source address as xt_cluster tests, in order:
/// (candidate, matches) for one rule per slot (a row whose slots agree:
/// one rule for the row); with `catch_all_last`, the last one has no test
/// (for terminating targets: it catches what is left). Without it, every
/// packet matches exactly one rule. The same hash as nftables' `jhash`
/// and the plan's [`crate::plan::SlotTable::slot_of`].
pub fn slot_matches(table: &crate::plan::SlotTable, catch_all_last: bool) -> Vec<(u32, Vec<Match>)> {
    let (rows, cols) = (usize::from(table.rows), usize::from(table.cols));
    let mut rules = Vec::new();
    for row in 0..rows {
        let row_match =
            (rows > 1).then(|| Match::ClusterHash { total: table.rows, node: row as u8 + 1, seed: table.row_seed() });
        let slots = &table.slots[row * cols..(row + 1) * cols];
        if slots.iter().all(|&c| c == slots[0]) {
            rules.push((slots[0], row_match.into_iter().collect::<Vec<_>>()));
            continue;
        }
        for (col, &c) in slots.iter().enumerate() {
            let col_match = Match::ClusterHash { total: table.cols, node: col as u8 + 1, seed: table.seed };
            rules.push((c, row_match.iter().cloned().chain([col_match]).collect()));
        }
    }
    if let Some(last) = rules.last_mut().filter(|_| catch_all_last) {
        last.1.clear();
    }
    rules
}

/// `-p PROTO -d IP --dport PORT` with a comment first, as upstream orders them.
fn to_destination(svc: &ServicePort, comment: String, ip: IpAddr, port: u16) -> [Match; 4] {
    [Match::Comment(comment), Match::Protocol(svc.protocol), Match::destination_ip(ip), Match::DestinationPort(port)]
}

/// Writes one service port's rules; its own chains only when `write_chains`.
/// `hash` is [`crate::hash::service_hash`] of its key and protocol.
/// Returns the nat chains it owns (when written; else empty and the caller
/// keeps the previous list).
pub fn write(ctx: &Context, svc: &ServicePort, hash: &str, write_chains: bool, out: &mut Ruleset) -> Vec<String> {
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

    let named = |prefix: &str| [prefix, hash].concat();
    let svc_chain = named("KUBE-SVC-");
    let svl_chain = named("KUBE-SVL-");
    let ext_chain = named("KUBE-EXT-");
    let fw_chain = named("KUBE-FW-");

    // upstream's usesClusterPolicyChain: cluster endpoints and
    // UsesClusterEndpoints (an external Local policy still short-circuits
    // pod and node traffic to them).
    let uses_cluster_chain = !cluster_eps.is_empty() && (!itp_local || externally_accessible);
    let uses_local_chain = !local_eps.is_empty() && (itp_local || etp_local);
    let internal_chain = if itp_local { &svl_chain } else { &svc_chain };
    let external_policy_chain = if etp_local { &svl_chain } else { &svc_chain };
    let uses_fw = has_endpoints && !lb_ips.is_empty() && !svc.load_balancer_source_ranges.is_empty();
    let lb_chain = if uses_fw { &fw_chain } else { &ext_chain };
    let uses_ext_chain = has_endpoints && externally_accessible;

    let (filter_target, filter_comment) =
        if !has_endpoints { (Target::Reject, "has no endpoints") } else { (Target::Drop, "has no local endpoints") };
    let filter_comment = || format!("{key} {filter_comment}");
    let filtered = |hook: Hook, ip: IpAddr| {
        Rule::hook(hook).with_all(to_destination(svc, filter_comment(), ip, port)).target(filter_target.clone())
    };

    // Cluster IP.
    if has_internal {
        out.push(
            Rule::hook(Hook::NatServices)
                .with_all(to_destination(svc, format!("{key} cluster IP"), cluster_ip, port))
                .jump(internal_chain),
        );
    } else {
        out.push(filtered(Hook::FilterServices, cluster_ip));
    }
    // External IPs.
    for &ip in ext_ips {
        if has_endpoints {
            out.push(
                Rule::hook(Hook::NatServices)
                    .with_all(to_destination(svc, format!("{key} external IP"), ip, port))
                    .jump(&ext_chain),
            );
        }
        if !has_external {
            out.push(filtered(Hook::FilterExternalServices, ip));
        }
    }
    // Load-balancer IPs.
    for &ip in lb_ips {
        if has_endpoints {
            out.push(
                Rule::hook(Hook::NatServices)
                    .with_all(to_destination(svc, format!("{key} loadbalancer IP"), ip, port))
                    .jump(lb_chain),
            );
        }
        if uses_fw {
            out.push(
                Rule::hook(Hook::FilterFirewall)
                    .with_all(to_destination(svc, format!("{key} traffic not accepted by {fw_chain}"), ip, port))
                    .target(Target::Drop),
            );
        }
    }
    if !has_external {
        for &ip in lb_ips {
            out.push(filtered(Hook::FilterExternalServices, ip));
        }
    }
    // Node port.
    if svc.node_port != 0 {
        if has_endpoints {
            out.push(
                Rule::hook(Hook::NatNodePorts)
                    .with(Match::Comment(key.to_string()))
                    .with(Match::Protocol(svc.protocol))
                    .with(Match::DestinationPort(svc.node_port))
                    .jump(&ext_chain),
            );
        }
        if !has_external {
            out.push(
                Rule::hook(Hook::FilterExternalServices)
                    .with(Match::Comment(filter_comment()))
                    .with(Match::DestinationTypeLocal { negate: false })
                    .with(Match::Protocol(svc.protocol))
                    .with(Match::DestinationPort(svc.node_port))
                    .target(filter_target.clone()),
            );
        }
    }
    // Health-check node port.
    if svc.health_check_node_port != 0 {
        out.push(
            Rule::hook(Hook::FilterNodePorts)
                .with(Match::Comment(format!("{key} health check node port")))
                .with(Match::Protocol(crate::model::Protocol::Tcp))
                .with(Match::DestinationPort(svc.health_check_node_port))
                .target(Target::Accept),
        );
    }

    if !write_chains {
        return Vec::new();
    }
    let mut owned = Vec::new();
    let nat = |chain: &str| Rule::chain(Table::Nat, chain);

    // Internal traffic: masquerade off-cluster sources.
    if has_internal {
        let rule = nat(internal_chain).with_all(to_destination(svc, format!("{key} cluster IP"), cluster_ip, port));
        if ctx.settings.masquerade_all {
            out.push(rule.target(Target::MarkForMasquerade));
        } else if let Some(not_local) = ctx.local_match(true) {
            out.push(rule.with(not_local).target(Target::MarkForMasquerade));
        }
    }
    // External traffic.
    if uses_ext_chain {
        out.declare(Table::Nat, &ext_chain);
        owned.push(ext_chain.clone());
        if !etp_local {
            out.push(
                nat(&ext_chain)
                    .with(Match::comment(format!("masquerade traffic for {key} external destinations")))
                    .target(Target::MarkForMasquerade),
            );
        } else {
            if let Some(local) = ctx.local_match(false) {
                out.push(
                    nat(&ext_chain)
                        .with(Match::comment(format!("pod traffic for {key} external destinations")))
                        .with(local)
                        .jump(&svc_chain),
                );
            }
            out.push(
                nat(&ext_chain)
                    .with(Match::comment(format!("masquerade LOCAL traffic for {key} external destinations")))
                    .with(Match::SourceTypeLocal { negate: false })
                    .target(Target::MarkForMasquerade),
            );
            out.push(
                nat(&ext_chain)
                    .with(Match::comment(format!("route LOCAL traffic for {key} external destinations")))
                    .with(Match::SourceTypeLocal { negate: false })
                    .jump(&svc_chain),
            );
        }
        if has_external {
            out.push(nat(&ext_chain).jump(external_policy_chain));
        }
    }
    // Load-balancer source ranges.
    if uses_fw {
        out.declare(Table::Nat, &fw_chain);
        owned.push(fw_chain.clone());
        let comment = || Match::comment(format!("{key} loadbalancer IP"));
        let node_ip = ctx.node.addresses.iter().find(|ip| family.matches(ip));
        let mut allow_from_node = false;
        for cidr in svc.load_balancer_source_ranges.iter().filter(|c| c.family() == family) {
            out.push(
                nat(&fw_chain)
                    .with(comment())
                    .with(Match::Source(AddressMatch { negate: false, cidr: *cidr }))
                    .jump(&ext_chain),
            );
            allow_from_node |= node_ip.is_some_and(|ip| cidr.contains(ip));
        }
        if allow_from_node {
            for &ip in lb_ips {
                out.push(nat(&fw_chain).with(comment()).with(Match::source_ip(ip)).jump(&ext_chain));
            }
        }
        out.push(
            nat(&fw_chain)
                .with(Match::comment(format!("other traffic to {key} will be dropped by KUBE-PROXY-FIREWALL"))),
        );
    }

    // Endpoint chains, for every endpoint some policy chain can reach,
    // each name hashed once.
    let reach_cluster = if uses_cluster_chain { cluster_eps.as_slice() } else { &[] };
    let reach_local = if uses_local_chain { local_eps.as_slice() } else { &[] };
    let mut reachable: Vec<&Endpoint> = Vec::with_capacity(reach_cluster.len() + reach_local.len());
    let mut names: BTreeMap<(IpAddr, u16), String> = BTreeMap::new();
    for ep in reach_cluster.iter().chain(reach_local) {
        if let btree_map::Entry::Vacant(slot) = names.entry((ep.ip, ep.port)) {
            slot.insert(endpoint_chain(key, proto, &ep.host_port()));
            reachable.push(ep);
        }
    }
    let sep = |ep: &Endpoint| -> &str { names.get(&(ep.ip, ep.port)).map_or("", String::as_str) };
    if uses_cluster_chain {
        out.declare(Table::Nat, &svc_chain);
        owned.push(svc_chain.clone());
        let choice = Choice { chain: &svc_chain, endpoints: cluster_eps, plan: view.cluster_plan };
        write_endpoint_choice(ctx, svc, &view, &choice, &sep, out);
    }
    if uses_local_chain {
        out.declare(Table::Nat, &svl_chain);
        owned.push(svl_chain.clone());
        let choice = Choice { chain: &svl_chain, endpoints: local_eps, plan: view.local_plan };
        write_endpoint_choice(ctx, svc, &view, &choice, &sep, out);
    }
    for ep in reachable {
        let chain = sep(ep).to_string();
        out.declare(Table::Nat, &chain);
        let comment = ctx.endpoint_comment(|| key.to_string());
        out.push(
            nat(&chain)
                .with_all(comment.clone())
                .with(Match::Source(AddressMatch { negate: false, cidr: Cidr::host(ep.ip) }))
                .target(Target::MarkForMasquerade),
        );
        let affinity = (svc.affinity_timeout_seconds > 0).then(|| Match::RecentSet { name: chain.clone() });
        out.push(
            nat(&chain)
                .with_all(comment)
                .with_all(affinity)
                .with(Match::Protocol(svc.protocol))
                .target(Target::Dnat(ep.ip, ep.port)),
        );
        owned.push(chain);
    }
    owned
}

/// One policy chain's choice: its endpoints and their plan.
struct Choice<'a, 'e> {
    chain: &'a str,
    endpoints: &'a [&'e Endpoint],
    plan: Option<&'a Plan>,
}

/// upstream's `writeServiceToEndpointRules`: affinity checks, then the
/// choice. Without a plan (or with a uniform one), upstream's statistic
/// rules with p = 1/(n-i); otherwise the plan's:
/// - weighted: `statistic random` with p = w_i / (the weights not yet passed);
/// - sequence: `statistic nth` rules, the k-th with `--every (len-k)`, so
///   connections rotate exactly through the sequence;
/// - slots over the source: xt_cluster matches (nftables' jhash), one rule
///   per slot (iptables 1.8 takes one hash value per match);
/// - slots over the destination: the destinations are known, so each
///   gets its slot's endpoint here (`-d`), and any other destination
///   (a node port on an unlisted local address) the first slot's.
fn write_endpoint_choice<'e>(
    ctx: &Context,
    svc: &ServicePort,
    view: &ServiceView,
    choice: &Choice<'_, 'e>,
    sep: &dyn Fn(&Endpoint) -> &'e str,
    out: &mut Ruleset,
) {
    let key = &svc.key;
    let (chain, endpoints) = (choice.chain, choice.endpoints);
    if svc.affinity_timeout_seconds > 0 {
        for ep in endpoints {
            let target = sep(ep);
            out.push(
                Rule::chain(Table::Nat, chain)
                    .with_all(ctx.endpoint_comment(|| format!("{key} -> {}", ep.host_port())))
                    .with(Match::RecentCheck {
                        name: target.to_string(),
                        seconds: svc.affinity_timeout_seconds,
                        reap: true,
                    })
                    .jump(target),
            );
        }
    }
    let n = endpoints.len();
    let to = |i: usize, matches: Vec<Match>| {
        let ep = endpoints[i];
        Rule::chain(Table::Nat, chain)
            .with_all(ctx.endpoint_comment(|| format!("{key} -> {}", ep.host_port())))
            .with_all(matches)
            .jump(sep(ep))
    };
    match choice.plan.filter(|p| !p.is_uniform(n) && p.check(n).is_ok() && p.runs_in(ProxyMode::Iptables)) {
        None | Some(Plan::Kernel(_)) => {
            for i in 0..n {
                let chance = (i + 1 < n).then(|| Match::StatisticRandom(ctx.probabilities[n - i]));
                out.push(to(i, chance.into_iter().collect()));
            }
        }
        Some(Plan::Weighted(weights)) => {
            let mut left: u32 = weights.iter().sum();
            let last = weights.iter().rposition(|&w| w > 0).unwrap_or(0);
            for (i, &w) in weights.iter().enumerate().filter(|(_, w)| **w > 0) {
                let chance =
                    (i < last).then(|| Match::StatisticRandom(probability_units(f64::from(w) / f64::from(left))));
                out.push(to(i, chance.into_iter().collect()));
                left -= w;
            }
        }
        Some(Plan::Sequence(sequence)) => {
            let len = sequence.len() as u32;
            for (k, &c) in sequence.iter().enumerate() {
                let nth = (k + 1 < sequence.len()).then(|| Match::StatisticNth { every: len - k as u32, packet: 0 });
                out.push(to(c as usize, nth.into_iter().collect()));
            }
        }
        Some(Plan::Slots(table)) if table.field == HashField::Source => {
            for (c, matches) in slot_matches(table, true) {
                out.push(to(c as usize, matches));
            }
        }
        Some(Plan::Slots(table)) => {
            let destinations = std::iter::once(view.cluster_ip)
                .chain(view.external_ips.iter().copied())
                .chain(view.load_balancer_ips.iter().copied())
                .chain(if svc.node_port != 0 { ctx.node.addresses.clone() } else { Vec::new() });
            let mut seen = Vec::new();
            for ip in destinations.filter(|ip| ctx.settings.family.matches(ip)) {
                if !seen.contains(&ip) {
                    seen.push(ip);
                    out.push(to(table.candidate_of(ip) as usize, vec![Match::destination_ip(ip)]));
                }
            }
            out.push(to(table.slots[0] as usize, Vec::new()));
        }
    }
}
