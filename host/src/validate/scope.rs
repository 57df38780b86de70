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

use super::dense::DenseMap;
use std::hash::Hash;
use std::net::IpAddr;

use kpx_rules::model::{IpFamily, Protocol, ServicePort};

/// A fact as it is counted: an IPv4 one (or one with no address) packed
/// into two words, so that a counted set costs 12 bytes an entry, not 24
/// (at 30k Services x 10, each of the two endpoint sets was 13 MB of the
/// host's heap in a heaptrack profile). Distinct facts of one type pack
/// to distinct words, and `unpack` gives the fact back.
pub trait Fact: Hash + Eq + Clone {
    fn pack(&self) -> Option<[u32; 2]>;
    fn unpack(w: [u32; 2]) -> Self;
}

fn protocol_word(p: Protocol) -> u32 {
    match p {
        Protocol::Tcp => 1,
        Protocol::Udp => 2,
        Protocol::Sctp => 3,
    }
}

fn protocol_of(w: u32) -> Protocol {
    match w {
        1 => Protocol::Tcp,
        2 => Protocol::Udp,
        _ => Protocol::Sctp,
    }
}

fn v4(ip: &IpAddr) -> Option<u32> {
    match ip {
        IpAddr::V4(a) => Some(u32::from(*a)),
        IpAddr::V6(_) => None,
    }
}

fn ip_of(w: u32) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::from(w))
}

impl Fact for IpAddr {
    fn pack(&self) -> Option<[u32; 2]> {
        Some([v4(self)?, 0])
    }
    fn unpack(w: [u32; 2]) -> IpAddr {
        ip_of(w[0])
    }
}

impl Fact for u16 {
    fn pack(&self) -> Option<[u32; 2]> {
        Some([u32::from(*self), 0])
    }
    fn unpack(w: [u32; 2]) -> u16 {
        w[0] as u16
    }
}

impl Fact for (Protocol, u16) {
    fn pack(&self) -> Option<[u32; 2]> {
        Some([protocol_word(self.0), u32::from(self.1)])
    }
    fn unpack(w: [u32; 2]) -> (Protocol, u16) {
        (protocol_of(w[0]), w[1] as u16)
    }
}

impl Fact for (IpAddr, u16) {
    fn pack(&self) -> Option<[u32; 2]> {
        Some([v4(&self.0)?, u32::from(self.1)])
    }
    fn unpack(w: [u32; 2]) -> (IpAddr, u16) {
        (ip_of(w[0]), w[1] as u16)
    }
}

impl Fact for (IpAddr, Protocol, u16) {
    fn pack(&self) -> Option<[u32; 2]> {
        Some([v4(&self.0)?, protocol_word(self.1) << 16 | u32::from(self.2)])
    }
    fn unpack(w: [u32; 2]) -> (IpAddr, Protocol, u16) {
        (ip_of(w[0]), protocol_of(w[1] >> 16), w[1] as u16)
    }
}

/// A multiset that remembers what left it.
#[derive(Debug, Clone)]
pub struct Counted<K> {
    /// Facts that pack, by their words, in the order they came.
    packed: DenseMap<[u32; 2], u32>,
    /// The others (IPv6).
    other: HashMap<K, u32>,
    removed: HashSet<K>,
}

impl<K> Default for Counted<K> {
    fn default() -> Self {
        Counted { packed: DenseMap::default(), other: HashMap::new(), removed: HashSet::new() }
    }
}

impl<K: Fact> Counted<K> {
    pub fn contains(&self, k: &K) -> bool {
        match k.pack() {
            Some(w) => self.packed.contains_key(&w),
            None => self.other.contains_key(k),
        }
    }

    pub fn add(&mut self, k: K) {
        // Most adds come with nothing removed (a full sync's, every
        // endpoint of every port): no second hash for them. In a profile
        // of a 10k x 10 first sync, that lookup was a third of counting.
        if !self.removed.is_empty() {
            self.removed.remove(&k);
        }
        match k.pack() {
            Some(w) => *self.packed.get_or_insert_with(w, || 0) += 1,
            None => *self.other.entry(k).or_default() += 1,
        }
    }

    /// Takes back one [`Counted::add`]; the key leaves with the last.
    pub fn remove(&mut self, k: &K) {
        let gone = match k.pack() {
            Some(w) => match self.packed.get(&w) {
                None => false,
                Some(n) if n > 1 => {
                    self.packed.insert(w, n - 1);
                    false
                }
                Some(_) => self.packed.remove(&w).is_some(),
            },
            None => Self::take_one(&mut self.other, k),
        };
        if gone {
            self.removed.insert(k.clone());
        }
    }

    /// One count less; whether that was the last.
    fn take_one<Q: Hash + Eq>(counts: &mut HashMap<Q, u32>, k: &Q) -> bool {
        let Some(n) = counts.get_mut(k) else { return false };
        *n -= 1;
        if *n > 0 {
            return false;
        }
        counts.remove(k);
        true
    }

    pub fn len(&self) -> usize {
        self.packed.len() + self.other.len()
    }

    /// Every key present.
    pub fn iter(&self) -> impl Iterator<Item = K> + '_ {
        self.packed.keys().map(|w| K::unpack(*w)).chain(self.other.keys().cloned())
    }

    pub fn is_empty(&self) -> bool {
        self.packed.is_empty() && self.other.is_empty()
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
    /// Node ports that came (back) since the last [`Scope::forget_removed`]:
    /// with `node_ports.removed()`, what a sync changed of them.
    pub node_ports_added: HashSet<(Protocol, u16)>,
    pub health_check_ports: Counted<u16>,
    pub cluster_ips: Counted<IpAddr>,
    pub endpoints: Counted<EndpointAddr>,
    pub endpoint_ips: Counted<IpAddr>,
    /// The sum over the ports counted in of their endpoints and two: what
    /// a backend's own sets and maps may number (upstream's shape has an
    /// affinity set per endpoint of each ClientIP Service port, and a map
    /// or two per port).
    pub endpoint_slots: usize,
}

impl Scope {
    /// Counts in (or, with `add` false, out) one service port's facts.
    pub fn count(&mut self, family: IpFamily, port: &ServicePort, add: bool) {
        let slots = port.endpoints.len() + 2;
        self.endpoint_slots =
            if add { self.endpoint_slots.saturating_add(slots) } else { self.endpoint_slots.saturating_sub(slots) };
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
            if add {
                if !self.node_ports.contains(&np) {
                    self.node_ports_added.insert(np);
                }
                self.node_ports.add(np)
            } else {
                self.node_ports.remove(&np)
            }
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
        self.node_ports_added.clear();
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

    #[test]
    fn facts_pack_to_distinct_words_and_come_back() {
        let ips: Vec<IpAddr> = ["0.0.0.0", "10.0.0.1", "255.255.255.255"].iter().map(|s| s.parse().unwrap()).collect();
        let protocols = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
        let ports = [0u16, 1, 80, 65535];
        fn round_trip<K: Fact + std::fmt::Debug>(facts: &[K]) {
            let words: HashSet<[u32; 2]> = facts.iter().map(|f| f.pack().unwrap()).collect();
            assert_eq!(words.len(), facts.len(), "{facts:?}");
            for f in facts {
                assert_eq!(&K::unpack(f.pack().unwrap()), f);
            }
        }
        round_trip(&ips);
        round_trip(&ports);
        let np: Vec<(Protocol, u16)> = protocols.iter().flat_map(|&p| ports.iter().map(move |&n| (p, n))).collect();
        round_trip(&np);
        let eps: Vec<(IpAddr, u16)> = ips.iter().flat_map(|&ip| ports.iter().map(move |&n| (ip, n))).collect();
        round_trip(&eps);
        let ds: Vec<Destination> = eps.iter().flat_map(|&(ip, n)| protocols.iter().map(move |&p| (ip, p, n))).collect();
        round_trip(&ds);

        // IPv6 facts are counted as they are, beside the packed ones.
        let mut c: Counted<EndpointAddr> = Counted::default();
        let (v4, v6): (EndpointAddr, EndpointAddr) =
            (("10.0.0.1".parse().unwrap(), 80), ("fd00::1".parse().unwrap(), 80));
        for e in [v4, v6, v6] {
            c.add(e);
        }
        assert_eq!((c.len(), c.packed.len(), c.other.len()), (2, 1, 1));
        let mut all: Vec<EndpointAddr> = c.iter().collect();
        all.sort();
        assert_eq!(all, vec![v4, v6]);
        c.remove(&v6);
        assert!(c.contains(&v6) && c.removed().count() == 0);
        c.remove(&v6);
        c.remove(&v4);
        assert!(c.is_empty());
        let mut gone: Vec<&EndpointAddr> = c.removed().collect();
        gone.sort();
        assert_eq!(gone, vec![&v4, &v6]);
    }
}
