//! The iptables backend: upstream kube-proxy's chain layout, rendered as an
//! `iptables-restore --noflush` payload. plugins/iptables/README.md lists
//! which names are public.

mod table;

pub use table::Table;

use std::collections::{BTreeMap, BTreeSet};

use crate::hash::{endpoint_chain, service_chain};
use crate::model::{Backend, Change, Endpoint, LocalTraffic, Node, Ruleset, ServicePort, Settings};

/// nat table chains kube-proxy owns and rewrites on every sync.
pub const NAT_CHAINS: [&str; 4] = [
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
];
/// filter table chains kube-proxy owns and rewrites on every sync.
pub const FILTER_CHAINS: [&str; 5] = [
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-NODEPORTS",
    "KUBE-PROXY-FIREWALL",
];
/// Prefixes of the per-service and per-endpoint chains.
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

/// A rule the host keeps in a built-in chain, jumping to one of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jump {
    pub table: &'static str,
    pub from: &'static str,
    pub to: &'static str,
    /// Match arguments before `-j`, exactly as given to `iptables -I`.
    pub matches: &'static [&'static str],
}

const EXTERNAL_PORTALS: &[&str] = &[
    "-m",
    "conntrack",
    "--ctstate",
    "NEW",
    "-m",
    "comment",
    "--comment",
    "kubernetes externally-visible service portals",
];
const SERVICE_PORTALS_NEW: &[&str] = &[
    "-m",
    "conntrack",
    "--ctstate",
    "NEW",
    "-m",
    "comment",
    "--comment",
    "kubernetes service portals",
];
const SERVICE_PORTALS: &[&str] = &["-m", "comment", "--comment", "kubernetes service portals"];
const FIREWALL: &[&str] = &[
    "-m",
    "conntrack",
    "--ctstate",
    "NEW",
    "-m",
    "comment",
    "--comment",
    "kubernetes load balancer firewall",
];

const fn jump(
    table: &'static str,
    from: &'static str,
    to: &'static str,
    matches: &'static [&'static str],
) -> Jump {
    Jump {
        table,
        from,
        to,
        matches,
    }
}

/// upstream's `iptablesJumpChains`: the only rules kpx puts in built-in chains.
pub const JUMPS: &[Jump] = &[
    jump(
        "filter",
        "INPUT",
        "KUBE-EXTERNAL-SERVICES",
        EXTERNAL_PORTALS,
    ),
    jump(
        "filter",
        "FORWARD",
        "KUBE-EXTERNAL-SERVICES",
        EXTERNAL_PORTALS,
    ),
    jump(
        "filter",
        "INPUT",
        "KUBE-NODEPORTS",
        &[
            "-m",
            "comment",
            "--comment",
            "kubernetes health check service ports",
        ],
    ),
    jump("filter", "FORWARD", "KUBE-SERVICES", SERVICE_PORTALS_NEW),
    jump("filter", "OUTPUT", "KUBE-SERVICES", SERVICE_PORTALS_NEW),
    jump(
        "filter",
        "FORWARD",
        "KUBE-FORWARD",
        &["-m", "comment", "--comment", "kubernetes forwarding rules"],
    ),
    jump("filter", "INPUT", "KUBE-PROXY-FIREWALL", FIREWALL),
    jump("filter", "OUTPUT", "KUBE-PROXY-FIREWALL", FIREWALL),
    jump("filter", "FORWARD", "KUBE-PROXY-FIREWALL", FIREWALL),
    jump("nat", "OUTPUT", "KUBE-SERVICES", SERVICE_PORTALS),
    jump("nat", "PREROUTING", "KUBE-SERVICES", SERVICE_PORTALS),
    jump(
        "nat",
        "POSTROUTING",
        "KUBE-POSTROUTING",
        &["-m", "comment", "--comment", "kubernetes postrouting rules"],
    ),
];

/// upstream's `%0.10f` of 1/n, the probability of the i-th of n endpoints.
fn probability(remaining: usize) -> String {
    format!("{:.10}", 1.0 / remaining as f64)
}

/// The iptables rule generator for one IP family.
#[derive(Debug)]
pub struct IptablesProxier {
    settings: Settings,
    node: Node,
    services: BTreeMap<String, ServicePort>,
    /// Keys upserted or removed since the last render.
    changed: BTreeSet<String>,
    /// The nat chains each service owned at the last render.
    rendered: BTreeMap<String, Vec<String>>,
}

impl IptablesProxier {
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// `! -s <pod cidr>` (or the interface form) for "not from a local pod".
    fn if_not_local(&self) -> Option<String> {
        match &self.settings.local_traffic {
            LocalTraffic::None => None,
            LocalTraffic::Cidrs(cidrs) => cidrs
                .iter()
                .find(|c| c.family() == self.settings.family)
                .map(|c| format!("! -s {c}")),
            LocalTraffic::BridgeInterface(name) => Some(format!("! -i {name}")),
            LocalTraffic::InterfaceNamePrefix(prefix) => Some(format!("! -i {prefix}+")),
        }
    }

    fn render_fixed(&self, filter: &mut Table, nat: &mut Table) {
        let mark = format!("{:#x}", self.settings.masquerade_mark());
        if !self.settings.conntrack_tcp_be_liberal {
            filter.rule("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP");
        }
        filter.rule(&format!(
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
        ));
        filter.rule("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT");
        nat.rule(&format!(
            "-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN"
        ));
        nat.rule(&format!("-A KUBE-POSTROUTING -j MARK --xor-mark {mark}"));
        let random = if self.settings.masquerade_random_fully {
            " --random-fully"
        } else {
            ""
        };
        nat.rule(&format!(
            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{random}"
        ));
        nat.rule(&format!("-A KUBE-MARK-MASQ -j MARK --or-mark {mark}"));
    }

    /// Rules for one service port. Its own chains are written only when
    /// `write_chains`; the returned list names them either way.
    fn render_service(
        &self,
        svc: &ServicePort,
        write_chains: bool,
        filter: &mut Table,
        nat: &mut Table,
    ) -> Vec<String> {
        let Some(cluster_ip) = svc.cluster_ip.filter(|ip| self.settings.family.matches(ip)) else {
            return Vec::new();
        };
        let proto = svc.protocol.as_str();
        let key = &svc.key;
        let dst = format!("-m {proto} -p {proto} -d {cluster_ip} --dport {}", svc.port);
        let endpoints: Vec<&Endpoint> = svc.cluster_endpoints().collect();
        if endpoints.is_empty() {
            filter.rule(&format!(
                "-A KUBE-SERVICES -m comment --comment \"{key} has no endpoints\" {dst} -j REJECT"
            ));
            return Vec::new();
        }
        let svc_chain = service_chain("KUBE-SVC-", key, proto);
        nat.rule(&format!(
            "-A KUBE-SERVICES -m comment --comment \"{key} cluster IP\" {dst} -j {svc_chain}"
        ));

        let sep_chains: Vec<String> = endpoints
            .iter()
            .map(|ep| endpoint_chain(key, proto, &ep.host_port()))
            .collect();
        if write_chains {
            nat.chain(&svc_chain);
            if self.settings.masquerade_all {
                nat.rule(&format!("-A {svc_chain} -m comment --comment \"{key} cluster IP\" {dst} -j KUBE-MARK-MASQ"));
            } else if let Some(not_local) = self.if_not_local() {
                nat.rule(&format!(
                    "-A {svc_chain} -m comment --comment \"{key} cluster IP\" {dst} {not_local} -j KUBE-MARK-MASQ"
                ));
            }
            let n = endpoints.len();
            for (i, (ep, sep)) in endpoints.iter().zip(&sep_chains).enumerate() {
                let hp = ep.host_port();
                if i + 1 < n {
                    nat.rule(&format!(
                        "-A {svc_chain} -m comment --comment \"{key} -> {hp}\" -m statistic --mode random --probability {} -j {sep}",
                        probability(n - i)
                    ));
                } else {
                    nat.rule(&format!(
                        "-A {svc_chain} -m comment --comment \"{key} -> {hp}\" -j {sep}"
                    ));
                }
            }
            for (ep, sep) in endpoints.iter().zip(&sep_chains) {
                nat.chain(sep);
                nat.rule(&format!(
                    "-A {sep} -m comment --comment {key} -s {} -j KUBE-MARK-MASQ",
                    ep.ip
                ));
                nat.rule(&format!(
                    "-A {sep} -m comment --comment {key} -m {proto} -p {proto} -j DNAT --to-destination {}",
                    ep.host_port()
                ));
            }
        }
        let mut chains = Vec::with_capacity(1 + sep_chains.len());
        chains.push(svc_chain);
        chains.extend(sep_chains);
        chains
    }

    fn render_payload(&mut self, full: bool) -> String {
        let mut filter = Table::new("filter");
        let mut nat = Table::new("nat");
        for chain in FILTER_CHAINS {
            filter.chain(chain);
        }
        for chain in NAT_CHAINS {
            nat.chain(chain);
        }
        self.render_fixed(&mut filter, &mut nat);

        let mut rendered = BTreeMap::new();
        for (key, svc) in &self.services {
            let write = full || self.changed.contains(key);
            let chains = self.render_service(svc, write, &mut filter, &mut nat);
            if !chains.is_empty() {
                rendered.insert(key.clone(), chains);
            }
        }
        // Chains a service no longer owns: flush and delete them. The host
        // removes leftovers the kernel holds from before this instance.
        let empty = Vec::new();
        for (key, old) in &self.rendered {
            if !(full || self.changed.contains(key)) {
                continue;
            }
            let current: BTreeSet<&String> = rendered.get(key).unwrap_or(&empty).iter().collect();
            for chain in old.iter().filter(|c| !current.contains(c)) {
                nat.delete_chain(chain);
            }
        }
        let mut nodeports = String::from(
            "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL",
        );
        match self.settings.family {
            crate::model::IpFamily::V6 => nodeports.push_str(" ! -d ::1/128"),
            crate::model::IpFamily::V4 if !self.settings.localhost_nodeports => {
                nodeports.push_str(" ! -d 127.0.0.0/8")
            }
            crate::model::IpFamily::V4 => {}
        }
        nodeports.push_str(" -j KUBE-NODEPORTS");
        nat.rule(&nodeports);

        self.rendered = rendered;
        self.changed.clear();
        let mut out = filter.finish();
        out.push_str(&nat.finish());
        out
    }
}

impl Backend for IptablesProxier {
    fn new(settings: Settings) -> Self {
        IptablesProxier {
            settings,
            node: Node::default(),
            services: BTreeMap::new(),
            changed: BTreeSet::new(),
            rendered: BTreeMap::new(),
        }
    }

    fn reset(&mut self, node: Node, services: Vec<ServicePort>) {
        self.node = node;
        self.changed.extend(self.services.keys().cloned());
        self.services = services.into_iter().map(|s| (s.key.clone(), s)).collect();
        self.changed.extend(self.services.keys().cloned());
    }

    fn apply(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Upsert(svc) => {
                    self.changed.insert(svc.key.clone());
                    self.services.insert(svc.key.clone(), svc);
                }
                Change::Remove(key) => {
                    self.services.remove(&key);
                    self.changed.insert(key);
                }
                Change::Node(node) => self.node = node,
            }
        }
    }

    fn render(&mut self, full: bool) -> Result<Ruleset, String> {
        Ok(Ruleset::Iptables(self.render_payload(full)))
    }
}

#[cfg(test)]
mod tests;
