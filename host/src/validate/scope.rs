//! What of the state a plugin's rules may refer to: the Service
//! destinations, node ports, health-check ports, cluster IPs and
//! endpoints of the service ports the host sent it. Kept up to date port
//! by port (each fact counted once per port that has it), with the facts
//! that left the state since the last successful sync, so that rules kept
//! in the kernel from an earlier sync can be checked against them.

// foldhash, seeded at random per process, not SipHash: the checks hash
// every element a plugin returns (SipHash cost a sixth of a 10k-Service
// full sync's checks), and no plugin can observe the seed.
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use std::hash::Hash;
use std::net::IpAddr;

use kpx_rules::model::{IpFamily, Protocol, ServicePort};

/// A multiset that remembers what left it.
#[derive(Debug, Clone)]
pub struct Counted<K> {
    counts: HashMap<K, u32>,
    removed: HashSet<K>,
}

impl<K> Default for Counted<K> {
    fn default() -> Self {
        Counted { counts: HashMap::new(), removed: HashSet::new() }
    }
}

impl<K: Hash + Eq + Clone> Counted<K> {
    pub fn contains(&self, k: &K) -> bool {
        self.counts.contains_key(k)
    }

    pub fn add(&mut self, k: K) {
        // Most adds come with nothing removed (a full sync's, every
        // endpoint of every port): no second hash for them. In a profile
        // of a 10k x 10 first sync, that lookup was a third of counting.
        if !self.removed.is_empty() {
            self.removed.remove(&k);
        }
        *self.counts.entry(k).or_default() += 1;
    }

    /// Takes back one [`Counted::add`]; the key leaves with the last.
    pub fn remove(&mut self, k: &K) {
        if let Some(n) = self.counts.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(k);
                self.removed.insert(k.clone());
            }
        }
    }

    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Every key present.
    pub fn iter(&self) -> impl Iterator<Item = &K> {
        self.counts.keys()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Keys that left since the last [`Counted::forget_removed`].
    pub fn removed(&self) -> impl Iterator<Item = &K> {
        self.removed.iter()
    }

    pub fn forget_removed(&mut self) {
        self.removed.clear();
    }
}

/// A Service destination: a cluster, external or load-balancer IP with
/// its Service port's protocol and port.
pub type Destination = (IpAddr, Protocol, u16);
/// An endpoint: where DNAT may send a connection.
pub type EndpointAddr = (IpAddr, u16);

/// The state's facts for one IP family.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    pub destinations: Counted<Destination>,
    pub node_ports: Counted<(Protocol, u16)>,
    pub health_check_ports: Counted<u16>,
    pub cluster_ips: Counted<IpAddr>,
    pub endpoints: Counted<EndpointAddr>,
    pub endpoint_ips: Counted<IpAddr>,
}

impl Scope {
    /// Counts in (or, with `add` false, out) one service port's facts.
    pub fn count(&mut self, family: IpFamily, port: &ServicePort, add: bool) {
        let Some(view) = port.view(family) else {
            // No cluster IP of this family: nothing of it is programmed,
            // but its endpoints are still its own.
            for e in &port.endpoints {
                self.count_endpoint((e.ip, e.port), add);
            }
            return;
        };
        let proto = port.protocol;
        let mut destinations = vec![(view.cluster_ip, proto, port.port)];
        destinations.extend(view.external_ips.iter().chain(&view.load_balancer_ips).map(|ip| (*ip, proto, port.port)));
        for d in destinations {
            if add { self.destinations.add(d) } else { self.destinations.remove(&d) }
        }
        if add {
            self.cluster_ips.add(view.cluster_ip)
        } else {
            self.cluster_ips.remove(&view.cluster_ip)
        }
        if port.node_port != 0 {
            let np = (proto, port.node_port);
            if add { self.node_ports.add(np) } else { self.node_ports.remove(&np) }
        }
        if port.health_check_node_port != 0 {
            let hc = port.health_check_node_port;
            if add { self.health_check_ports.add(hc) } else { self.health_check_ports.remove(&hc) }
        }
        for e in &port.endpoints {
            self.count_endpoint((e.ip, e.port), add);
        }
    }

    fn count_endpoint(&mut self, e: EndpointAddr, add: bool) {
        if add {
            self.endpoints.add(e);
            self.endpoint_ips.add(e.0);
        } else {
            self.endpoints.remove(&e);
            self.endpoint_ips.remove(&e.0);
        }
    }

    /// After a successful sync: what left is no longer news.
    pub fn forget_removed(&mut self) {
        self.destinations.forget_removed();
        self.node_ports.forget_removed();
        self.health_check_ports.forget_removed();
        self.cluster_ips.forget_removed();
        self.endpoints.forget_removed();
        self.endpoint_ips.forget_removed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::Endpoint;

    fn port(name: &str, ip: &str, eps: &[&str]) -> ServicePort {
        let eps = eps.iter().map(|e| Endpoint::ready(e.parse().unwrap(), 8080)).collect();
        let mut p = ServicePort::new("ns", name, "", Protocol::Tcp, 80).with_cluster_endpoints(eps);
        p.cluster_ip = Some(ip.parse().unwrap());
        p.node_port = 30080;
        p
    }

    #[test]
    fn facts_shared_by_two_ports_stay_until_both_let_go() {
        let mut s = Scope::default();
        let (a, b) = (port("a", "172.30.0.1", &["10.1.0.1", "10.1.0.2"]), port("b", "172.30.0.2", &["10.1.0.2"]));
        s.count(IpFamily::V4, &a, true);
        s.count(IpFamily::V4, &b, true);
        let ep = ("10.1.0.2".parse().unwrap(), 8080);
        assert!(s.endpoints.contains(&ep) && s.node_ports.contains(&(Protocol::Tcp, 30080)));
        s.count(IpFamily::V4, &a, false);
        assert!(s.endpoints.contains(&ep), "b still has it");
        assert_eq!(s.endpoints.removed().count(), 1, "10.1.0.1 left");
        assert!(s.node_ports.contains(&(Protocol::Tcp, 30080)), "b has the same node port");
        s.count(IpFamily::V4, &b, false);
        assert!(s.endpoints.is_empty() && s.destinations.is_empty() && s.node_ports.is_empty());
        s.forget_removed();
        assert_eq!(s.endpoints.removed().count(), 0);
    }
}
