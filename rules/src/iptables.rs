//! The iptables backend: upstream kube-proxy's chain layout, rendered as an
//! `iptables-restore --noflush` payload. plugins/iptables/README.md lists
//! which names are public.

mod service;
mod table;

pub use table::Table;

use std::collections::{BTreeMap, BTreeSet};

use crate::service_set::ServiceSet;

use crate::model::{Backend, Change, Cluster, IpFamily, Node, NodePortAddresses, Ruleset, ServicePort, Settings};

/// nat table chains kube-proxy owns and rewrites on every sync.
pub const NAT_CHAINS: [&str; 4] = ["KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"];
/// filter table chains kube-proxy owns and rewrites on every sync.
pub const FILTER_CHAINS: [&str; 5] =
    ["KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL"];
/// Prefixes of the per-service and per-endpoint chains.
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"];

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
const SERVICE_PORTALS_NEW: &[&str] =
    &["-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals"];
const SERVICE_PORTALS: &[&str] = &["-m", "comment", "--comment", "kubernetes service portals"];
const FIREWALL: &[&str] =
    &["-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes load balancer firewall"];

const fn jump(table: &'static str, from: &'static str, to: &'static str, matches: &'static [&'static str]) -> Jump {
    Jump { table, from, to, matches }
}

/// upstream's `iptablesJumpChains`: the only rules kpx puts in built-in chains.
pub const JUMPS: &[Jump] = &[
    jump("filter", "INPUT", "KUBE-EXTERNAL-SERVICES", EXTERNAL_PORTALS),
    jump("filter", "FORWARD", "KUBE-EXTERNAL-SERVICES", EXTERNAL_PORTALS),
    jump("filter", "INPUT", "KUBE-NODEPORTS", &["-m", "comment", "--comment", "kubernetes health check service ports"]),
    jump("filter", "FORWARD", "KUBE-SERVICES", SERVICE_PORTALS_NEW),
    jump("filter", "OUTPUT", "KUBE-SERVICES", SERVICE_PORTALS_NEW),
    jump("filter", "FORWARD", "KUBE-FORWARD", &["-m", "comment", "--comment", "kubernetes forwarding rules"]),
    jump("filter", "INPUT", "KUBE-PROXY-FIREWALL", FIREWALL),
    jump("filter", "OUTPUT", "KUBE-PROXY-FIREWALL", FIREWALL),
    jump("filter", "FORWARD", "KUBE-PROXY-FIREWALL", FIREWALL),
    jump("nat", "OUTPUT", "KUBE-SERVICES", SERVICE_PORTALS),
    jump("nat", "PREROUTING", "KUBE-SERVICES", SERVICE_PORTALS),
    jump("nat", "POSTROUTING", "KUBE-POSTROUTING", &["-m", "comment", "--comment", "kubernetes postrouting rules"]),
];

const LOCALNET: &[&str] = &[];

/// The kubelet-style firewall against martian localnet traffic, needed when
/// localhost node ports are on (IPv4 only): upstream's
/// `iptablesKubeletJumpChains`.
pub const LOCALNET_JUMPS: &[Jump] =
    &[jump("filter", "INPUT", "KUBE-FIREWALL", LOCALNET), jump("filter", "OUTPUT", "KUBE-FIREWALL", LOCALNET)];

/// The jumps the host keeps for these settings.
pub fn jumps_for(settings: &Settings) -> Vec<Jump> {
    let mut out = JUMPS.to_vec();
    if localhost_nodeports(settings) {
        out.extend_from_slice(LOCALNET_JUMPS);
    }
    out
}

/// Node ports answer on 127.0.0.1 (IPv4 with --iptables-localhost-nodeports,
/// when node ports listen on all local addresses or on a loopback range).
pub fn localhost_nodeports(settings: &Settings) -> bool {
    settings.family == IpFamily::V4
        && settings.localhost_nodeports
        && match &settings.nodeport_addresses {
            NodePortAddresses::All => true,
            NodePortAddresses::Only(cidrs) => cidrs.iter().any(|c| c.addr.is_loopback()),
        }
}

/// Above this many endpoints, per-endpoint rules carry no comments.
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// The arguments of an iptables-restore rule line, honouring the double
/// quotes (and backslash escapes inside them) iptables-restore understands;
/// `None` when a quote is not closed.
pub fn split_args(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut current = String::new();
    let (mut in_quotes, mut has_token) = (false, false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                has_token = true;
            }
            '\\' if in_quotes => current.extend(chars.next()),
            c if c.is_whitespace() && !in_quotes => {
                if has_token {
                    out.push(std::mem::take(&mut current));
                    has_token = false;
                }
            }
            c => {
                current.push(c);
                has_token = true;
            }
        }
    }
    if in_quotes {
        return None;
    }
    if has_token {
        out.push(current);
    }
    Some(out)
}

/// upstream's `%0.10f` of 1/n, the probability of the i-th of n endpoints.
fn probability(remaining: usize) -> String {
    format!("{:.10}", 1.0 / remaining as f64)
}

/// The iptables rule generator for one IP family.
#[derive(Debug)]
pub struct IptablesProxier {
    settings: Settings,
    node: Node,
    services: ServiceSet,
    /// The nat chains each service owned at the last render.
    rendered: BTreeMap<String, Vec<String>>,
    /// Large-cluster mode at the last render; a flip rewrites everything.
    large_cluster: Option<bool>,
}

impl IptablesProxier {
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    fn render_fixed(&self, filter: &mut Table, nat: &mut Table) {
        let mark = format!("{:#x}", self.settings.masquerade_mark());
        if localhost_nodeports(&self.settings) {
            filter.chain("KUBE-FIREWALL");
            filter.rule("-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP");
        }
        if !self.settings.conntrack_tcp_be_liberal {
            filter.rule("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP");
        }
        filter.rule(&format!(
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
        ));
        filter.rule("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT");
        nat.rule(&format!("-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN"));
        nat.rule(&format!("-A KUBE-POSTROUTING -j MARK --xor-mark {mark}"));
        let random = if self.settings.masquerade_random_fully { " --random-fully" } else { "" };
        nat.rule(&format!(
            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{random}"
        ));
        nat.rule(&format!("-A KUBE-MARK-MASQ -j MARK --or-mark {mark}"));
    }

    /// The last rule of nat KUBE-SERVICES: node ports on local addresses.
    fn render_nodeports_jump(&self, nat: &mut Table) {
        let comment = "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\"";
        let family = self.settings.family;
        let NodePortAddresses::Only(only) = &self.settings.nodeport_addresses else {
            let except = match family {
                IpFamily::V6 => " ! -d ::1/128",
                IpFamily::V4 if !localhost_nodeports(&self.settings) => " ! -d 127.0.0.0/8",
                IpFamily::V4 => "",
            };
            nat.rule(&format!("{comment} -m addrtype --dst-type LOCAL{except} -j KUBE-NODEPORTS"));
            return;
        };
        // The host resolved --nodeport-addresses to this node's addresses.
        for cidr in only.iter().filter(|c| c.family() == family) {
            if cidr.addr.is_loopback() && !localhost_nodeports(&self.settings) {
                continue;
            }
            nat.rule(&format!("{comment} -d {} -j KUBE-NODEPORTS", cidr.addr));
        }
    }

    fn render_payload(&mut self, full: bool) -> String {
        let total: usize = self.services.values().map(|s| s.endpoints.len()).sum();
        let large_cluster = total > LARGE_CLUSTER_ENDPOINTS;
        let full = full || self.large_cluster != Some(large_cluster);
        self.large_cluster = Some(large_cluster);
        let changed = self.services.take_changed();

        let mut filter = Table::new("filter");
        let mut nat = Table::new("nat");
        for chain in FILTER_CHAINS {
            filter.chain(chain);
        }
        for chain in NAT_CHAINS {
            nat.chain(chain);
        }
        self.render_fixed(&mut filter, &mut nat);

        let ctx = service::Context { settings: &self.settings, node: &self.node, large_cluster };
        let mut rendered = BTreeMap::new();
        for (key, svc) in self.services.iter() {
            let write = full || changed.contains(key);
            let chains = service::write(&ctx, svc, write, &mut filter, &mut nat);
            let chains = if write { chains } else { self.rendered.get(key).cloned().unwrap_or_default() };
            if !chains.is_empty() {
                rendered.insert(key.clone(), chains);
            }
        }
        // Chains a service no longer owns: flush and delete them. The host
        // removes leftovers the kernel holds from before this instance.
        let empty = Vec::new();
        for (key, old) in &self.rendered {
            if !(full || changed.contains(key)) {
                continue;
            }
            let current: BTreeSet<&String> = rendered.get(key).unwrap_or(&empty).iter().collect();
            for chain in old.iter().filter(|c| !current.contains(c)) {
                nat.delete_chain(chain);
            }
        }
        self.render_nodeports_jump(&mut nat);

        self.rendered = rendered;
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
            services: ServiceSet::default(),
            rendered: BTreeMap::new(),
            large_cluster: None,
        }
    }

    fn reset(&mut self, node: Node, _cluster: Cluster, services: Vec<ServicePort>) {
        self.node = node;
        self.services.replace(services);
    }

    fn apply(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Upsert(svc) => self.services.upsert(svc),
                Change::Remove(key) => self.services.remove(key),
                Change::Cluster(_) => {}
                Change::Node(node) => {
                    // The node's address decides KUBE-FW- rules: rewrite all.
                    self.services.mark_all_changed();
                    self.node = node;
                }
            }
        }
    }

    fn render(&mut self, full: bool) -> Result<Ruleset, String> {
        Ok(Ruleset::Iptables(self.render_payload(full)))
    }
}

#[cfg(test)]
mod tests;
