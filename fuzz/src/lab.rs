//! The state the contract targets check hostile rulesets against, and the
//! built-in generators' rules for it: the starting point the fuzzer edits.
//!
//! Addresses and ports are small numbers (0.0.0.1, ::101, port 1): the
//! host looks them up in hash maps, where coverage gives the fuzzer no
//! gradient, and bytes it has not chosen read as zeros, so small values
//! are the ones it meets.

use std::net::IpAddr;
use std::sync::OnceLock;

use kpx::kernel::iptables::dialect;
use kpx::syntax::iptables::Dialect;
use kpx::validate::Scope;
use kpx_rules::backend::Backend;
use kpx_rules::iptables::IptablesProxier;
use kpx_rules::model::{
    Cidr, Cluster, Endpoint, IpFamily, LocalTraffic, Node, Protocol, ProxyMode, ServicePort, Settings, TrafficPolicy,
};
use kpx_rules::nftables::NftablesProxier;
use kpx_rules::ops::Ruleset;
use kpx_rules::ops::iptables::Ruleset as IptRuleset;
use kpx_rules::ops::nftables::Transaction;

/// One family's state and the built-in generators' full renders of it.
pub struct Lab {
    pub family: IpFamily,
    pub iptables_settings: Settings,
    pub nftables_settings: Settings,
    pub node: Node,
    pub services: Vec<ServicePort>,
    pub scope: Scope,
    pub iptables: IptRuleset,
    pub nftables: Transaction,
    /// The nftables generator's partial renders after `nftables`, one per
    /// change of [`changes`] (within the scope: a map move, objects
    /// flushed, firewall elements removed).
    pub nftables_partials: Vec<Transaction>,
}

impl Lab {
    /// The lab of a family, built once.
    pub fn of(family: IpFamily) -> &'static Lab {
        static V4: OnceLock<Lab> = OnceLock::new();
        static V6: OnceLock<Lab> = OnceLock::new();
        match family {
            IpFamily::V4 => V4.get_or_init(|| Lab::new(IpFamily::V4)),
            IpFamily::V6 => V6.get_or_init(|| Lab::new(IpFamily::V6)),
        }
    }

    /// The address numbered `n` in this family (0.0.0.n, or ::n+0x100).
    pub fn ip(&self, n: u8) -> IpAddr {
        match self.family {
            IpFamily::V4 => IpAddr::from([0, 0, 0, n]),
            IpFamily::V6 => IpAddr::from(std::net::Ipv6Addr::from(0x100u128 + u128::from(n))),
        }
    }

    pub fn dialect(&self) -> Dialect {
        dialect(&self.iptables_settings)
    }

    pub fn masquerade_mark(&self) -> u32 {
        self.nftables_settings.masquerade_mark()
    }

    fn new(family: IpFamily) -> Lab {
        let mut lab = Lab {
            family,
            iptables_settings: settings(family, ProxyMode::Iptables),
            nftables_settings: settings(family, ProxyMode::Nftables),
            node: Node::default(),
            services: Vec::new(),
            scope: Scope::default(),
            iptables: IptRuleset::default(),
            nftables: Transaction::default(),
            nftables_partials: Vec::new(),
        };
        lab.node = Node {
            name: "node".into(),
            addresses: vec![lab.ip(20)],
            zone: String::new(),
            labels: Vec::new(),
            pod_cidrs: Vec::new(),
        };
        lab.services = services(&lab);
        for s in &lab.services {
            lab.scope.count(family, s, true);
        }
        let mut ipt = IptablesProxier::new(lab.iptables_settings.clone());
        ipt.reset(lab.node.clone(), Cluster::default(), lab.services.clone());
        let Ok(Ruleset::Iptables(rs)) = ipt.render(true) else { panic!("the iptables generator renders iptables") };
        lab.iptables = rs;
        let mut nft = NftablesProxier::new(lab.nftables_settings.clone());
        nft.reset(lab.node.clone(), Cluster::default(), lab.services.clone());
        let Ok(Ruleset::Nftables(tx)) = nft.render(true) else { panic!("the nftables generator renders nftables") };
        lab.nftables = tx;
        for change in changes(&lab) {
            let mut nft = NftablesProxier::new(lab.nftables_settings.clone());
            nft.reset(lab.node.clone(), Cluster::default(), lab.services.clone());
            let _ = nft.render(true);
            nft.apply(vec![kpx_rules::model::Change::Upsert(change)]);
            let Ok(Ruleset::Nftables(tx)) = nft.render(false) else {
                panic!("the nftables generator renders nftables")
            };
            lab.nftables_partials.push(tx);
        }
        lab
    }
}

fn settings(family: IpFamily, mode: ProxyMode) -> Settings {
    let mut s = Settings::new(family, mode);
    let pods = match family {
        IpFamily::V4 => "0.0.0.0/28",
        IpFamily::V6 => "::100/124",
    };
    s.local_traffic = LocalTraffic::Cidrs(vec![pods.parse().expect("a CIDR")]);
    s
}

/// Three Services that between them use every kind of rule: a TCP one
/// with a node port, an external IP and two endpoints (one local), a UDP
/// one with session affinity, and a load balancer with source ranges and
/// the Local traffic policy.
fn services(lab: &Lab) -> Vec<ServicePort> {
    let ep = |n: u8, port: u16, local: bool| {
        let mut e = Endpoint::ready(lab.ip(n), port);
        e.conditions.is_local = local;
        e
    };
    let mut web = ServicePort::new("ns", "web", "", Protocol::Tcp, 1)
        .with_cluster_endpoints(vec![ep(4, 5, false), ep(5, 5, true)]);
    web.cluster_ip = Some(lab.ip(1));
    web.node_port = 2;
    web.external_ips = vec![lab.ip(3)];
    web.local_endpoints = vec![1];
    let mut dns = ServicePort::new("ns", "dns", "dns", Protocol::Udp, 6).with_cluster_endpoints(vec![ep(7, 7, false)]);
    dns.cluster_ip = Some(lab.ip(6));
    dns.affinity_timeout_seconds = 10800;
    let mut lb = ServicePort::new("ns", "lb", "", Protocol::Sctp, 8).with_cluster_endpoints(vec![ep(10, 8, true)]);
    lb.cluster_ip = Some(lab.ip(8));
    lb.load_balancer_ips = vec![lab.ip(9)];
    lb.load_balancer_source_ranges =
        vec![Cidr { addr: lab.ip(0), prefix_len: if lab.ip(0).is_ipv4() { 28 } else { 124 } }];
    lb.external_traffic_policy = TrafficPolicy::Local;
    lb.node_port = 11;
    lb.health_check_node_port = 12;
    lb.local_endpoints = vec![0];
    vec![web, dns, lb]
}

/// Changes to the lab's Services that stay within its scope: web down to
/// one endpoint (its elements move to another map), dns without session
/// affinity (its objects flushed and deleted), lb without source ranges.
fn changes(lab: &Lab) -> Vec<ServicePort> {
    let mut web = lab.services[0].clone();
    web.cluster_endpoints.truncate(1);
    web.local_endpoints.clear();
    let mut dns = lab.services[1].clone();
    dns.affinity_timeout_seconds = 0;
    let mut lb = lab.services[2].clone();
    lb.load_balancer_source_ranges.clear();
    vec![web, dns, lb]
}
