//! The ipvs generator: upstream's ipvs proxier's virtual servers, as
//! typed values. Every Service destination becomes a virtual server: the
//! cluster IP with the internal policy's endpoints; external and
//! load-balancer IPs with the external policy's; the node port on each
//! node address node ports are served on (`--nodeport-addresses`). The
//! scheduler is the plan's (a kernel plan) or `--ipvs-scheduler`'s (the
//! host passes it as the setting `ipvs-scheduler`, default rr); weights
//! come from the plan or the endpoints (`--ipvs-scheduler` rr with
//! unequal weights runs as wrr: rr would ignore them); ClientIP affinity
//! is IPVS persistence. A slot plan (mh, maglev) goes with its virtual
//! server for the host to execute (a table over the destination is the
//! one endpoint it names for that address). A destination without endpoints keeps its virtual
//! server with no real servers: IPVS answers port-unreachable (kube-
//! proxy's REJECT) and the last endpoints are drained, not cut.
//! LoadBalancer source ranges are the host's: its ipsets and iptables
//! rules filter the load-balancer IPs' traffic before IPVS sees it.

use std::net::IpAddr;

use crate::backend::Backend;
use crate::model::{
    Change, Cluster, Endpoint, HashField, Node, NodePortAddresses, Plan, ProxyMode, ServicePort, Settings,
};
use crate::ops::Ruleset as AnyRuleset;
use crate::ops::ipvs::{RealServer, Ruleset, VirtualServer};
use crate::service_set::ServiceSet;

/// upstream's default `--ipvs-scheduler`.
pub const DEFAULT_SCHEDULER: &str = "rr";

pub struct IpvsProxier {
    settings: Settings,
    node: Node,
    services: ServiceSet,
}

impl IpvsProxier {
    fn scheduler(&self) -> &str {
        self.settings.extra("ipvs-scheduler").filter(|s| !s.is_empty()).unwrap_or(DEFAULT_SCHEDULER)
    }

    /// The node addresses node ports are served on: the host resolves
    /// `--nodeport-addresses` (by default every address of the node but
    /// loopback and kube-ipvs0's) to host CIDRs; with none resolved, the
    /// Node's own addresses.
    fn node_port_addresses(&self) -> Vec<IpAddr> {
        let family = self.settings.family;
        let mut out: Vec<IpAddr> = match &self.settings.nodeport_addresses {
            NodePortAddresses::Only(cidrs) => cidrs.iter().filter(|c| c.is_host()).map(|c| c.addr).collect(),
            NodePortAddresses::All => self.node.addresses.clone(),
        };
        out.retain(|ip| family.matches(ip));
        out.sort();
        out.dedup();
        out
    }

    fn virtual_servers(&self, svc: &ServicePort, out: &mut Vec<VirtualServer>) {
        let Some(view) = svc.view(self.settings.family) else { return };
        let plan_for = |local: bool| if local { view.local_plan } else { view.cluster_plan };
        let server = |address: IpAddr, port: u16, eps: &[&Endpoint], plan: Option<&Plan>| {
            let plan = plan.filter(|p| p.check(eps.len()).is_ok());
            // A table over the destination picks one endpoint per address.
            let one;
            let (eps, slots) = match plan {
                Some(Plan::Slots(t)) if t.field == HashField::Destination => {
                    one = [eps[t.candidate_of(address) as usize]];
                    (&one[..], None)
                }
                Some(Plan::Slots(t)) => (eps, Some(t.clone())),
                _ => (eps, None),
            };
            let (mut scheduler, flags, mut weights): (String, u8, Vec<u32>) = match plan {
                Some(Plan::Kernel(k)) => (k.scheduler.clone(), k.flags, k.weights.clone()),
                _ => (self.scheduler().to_string(), 0, eps.iter().map(|e| u32::from(e.weight)).collect()),
            };
            // As the other modes: every weight 0 is no weighting at all.
            if weights.iter().all(|&w| w == 0) {
                weights.iter_mut().for_each(|w| *w = 1);
            }
            if scheduler == "rr" && weights.iter().any(|&w| w != weights[0]) {
                scheduler = "wrr".into();
            }
            VirtualServer {
                address,
                protocol: svc.protocol,
                port,
                scheduler,
                scheduler_flags: flags,
                persistence_seconds: svc.affinity_timeout_seconds,
                reals: eps
                    .iter()
                    .zip(weights)
                    .map(|(e, weight)| RealServer { ip: e.ip, port: e.port, weight })
                    .collect(),
                slots,
            }
        };
        // Endpoints only while some endpoint serves (upstream's
        // hasEndpoints), else none: port-unreachable.
        fn usable<'a>(serving: bool, eps: &[&'a Endpoint]) -> Vec<&'a Endpoint> {
            if serving { eps.to_vec() } else { Vec::new() }
        }
        let internal = usable(view.has_endpoints, view.internal_endpoints());
        out.push(server(view.cluster_ip, svc.port, &internal, plan_for(view.internal_local)));
        let (external, plan) = (usable(view.has_endpoints, view.external_endpoints()), plan_for(view.external_local));
        for &ip in view.external_ips.iter().chain(&view.load_balancer_ips) {
            out.push(server(ip, svc.port, &external, plan));
        }
        if svc.node_port != 0 {
            for ip in self.node_port_addresses() {
                out.push(server(ip, svc.node_port, &external, plan));
            }
        }
    }
}

impl Backend for IpvsProxier {
    fn new(settings: Settings) -> Self {
        IpvsProxier { settings, node: Node::default(), services: ServiceSet::default() }
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
                Change::Node(node) => self.node = node,
                Change::Cluster(_) => {}
            }
        }
    }

    /// Always the whole table: the host reconciles the kernel's to it.
    fn render(&mut self, _full: bool) -> Result<AnyRuleset, String> {
        if self.settings.mode != ProxyMode::Ipvs {
            return Err(format!("the ipvs backend cannot render {} rules", self.settings.mode));
        }
        self.services.clear_changed();
        let mut services = Vec::new();
        for svc in self.services.values() {
            self.virtual_servers(svc, &mut services);
        }
        Ok(AnyRuleset::Ipvs(Ruleset { services }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, IpFamily, KernelPlan, Protocol, TrafficPolicy};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn render(settings: Settings, node: Node, svc: ServicePort) -> Vec<VirtualServer> {
        let mut p = IpvsProxier::new(settings);
        p.reset(node, Cluster::default(), vec![svc]);
        match p.render(true).unwrap() {
            AnyRuleset::Ipvs(r) => r.services,
            other => panic!("{other:?}"),
        }
    }

    fn web() -> ServicePort {
        let mut svc = ServicePort::new("ns", "web", "http", Protocol::Tcp, 80).with_cluster_endpoints(vec![
            Endpoint::ready(ip("10.244.1.5"), 8080),
            Endpoint::ready(ip("10.244.2.5"), 8080),
        ]);
        svc.cluster_ip = Some(ip("10.96.0.10"));
        svc
    }

    #[test]
    fn cluster_ip_node_port_and_external_ips() {
        let mut settings = Settings::new(IpFamily::V4, ProxyMode::Ipvs);
        settings.extra.push(("ipvs-scheduler".into(), "wlc".into()));
        let node = Node { addresses: vec![ip("192.168.1.10"), ip("fd00::1")], ..Node::default() };
        settings.nodeport_addresses = NodePortAddresses::All;
        let mut svc = web();
        svc.node_port = 30080;
        svc.external_ips = vec![ip("203.0.113.7")];
        svc.affinity_timeout_seconds = 600;
        svc.endpoints[1].weight = 3;
        let vs = render(settings, node, svc);
        let addrs: Vec<(IpAddr, u16)> = vs.iter().map(|v| (v.address, v.port)).collect();
        assert_eq!(addrs, vec![(ip("10.96.0.10"), 80), (ip("203.0.113.7"), 80), (ip("192.168.1.10"), 30080)]);
        assert!(vs.iter().all(|v| v.scheduler == "wlc" && v.persistence_seconds == 600));
        assert_eq!(vs[0].reals.iter().map(|r| r.weight).collect::<Vec<_>>(), vec![1, 3]);
    }

    #[test]
    fn kernel_plans_and_local_policies() {
        let mut svc = web();
        svc.node_port = 30080;
        svc.external_traffic_policy = TrafficPolicy::Local;
        svc.endpoints[0].conditions.is_local = true;
        svc.local_endpoints = vec![0];
        svc.cluster_plan = Some(Plan::Kernel(KernelPlan { scheduler: "sh".into(), weights: vec![2, 1], flags: 0b01 }));
        let mut settings = Settings::new(IpFamily::V4, ProxyMode::Ipvs);
        settings.nodeport_addresses = NodePortAddresses::Only(vec!["192.168.1.10/32".parse().unwrap()]);
        let vs = render(settings, Node::default(), svc);
        assert_eq!((vs[0].scheduler.as_str(), vs[0].scheduler_flags), ("sh", 1));
        assert_eq!(vs[0].reals.len(), 2);
        // The node port serves the local endpoint only, with the default.
        assert_eq!((vs[1].port, vs[1].reals.len(), vs[1].scheduler.as_str()), (30080, 1, "rr"));
    }

    #[test]
    fn no_endpoints_keep_an_empty_virtual_server() {
        let mut svc = web();
        svc.endpoints.clear();
        svc.cluster_endpoints.clear();
        let vs = render(Settings::new(IpFamily::V4, ProxyMode::Ipvs), Node::default(), svc);
        assert_eq!((vs.len(), vs[0].reals.len()), (1, 0));
    }

    #[test]
    fn weights_make_rr_wrr() {
        let mut svc = web();
        svc.endpoints[0].weight = 3;
        svc.load_balancer_ips = vec![ip("198.51.100.1")];
        svc.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap()];
        let vs = render(Settings::new(IpFamily::V4, ProxyMode::Ipvs), Node::default(), svc.clone());
        // The LB IP is served; the host's firewall applies the ranges.
        assert_eq!(vs.iter().map(|v| v.address).collect::<Vec<_>>(), vec![ip("10.96.0.10"), ip("198.51.100.1")]);
        assert_eq!(vs[0].scheduler, "wrr");
        svc.endpoints.iter_mut().for_each(|e| e.weight = 0);
        let vs = render(Settings::new(IpFamily::V4, ProxyMode::Ipvs), Node::default(), svc);
        assert_eq!((vs[0].scheduler.as_str(), vs[0].reals[0].weight), ("rr", 1));
    }
}
