//! ipvs mode's ipsets: upstream's sets (names, types, comments), their
//! entries computed by the host from the state (never from a plugin), and
//! the `ipset restore` script that brings the kernel's sets to them.
//!
//! Every set is refilled through a scratch set of the same type and an
//! atomic `swap`, so entries that are no longer wanted — kpx's leftovers
//! of any age, or anyone else's — are gone after one sync, and the
//! iptables rules that test a set never see it half written.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write};
use std::net::IpAddr;

use kpx_rules::model::{Cidr, IpFamily, Protocol, ServicePort};

/// The kernel's longest set name (IPSET_MAXNAMELEN - 1).
pub const MAX_NAME: usize = 31;

/// An ipset type, as `ipset create` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetType {
    HashIp,
    HashIpPort,
    HashIpPortIp,
    HashIpPortNet,
    BitmapPort,
}

impl SetType {
    pub fn as_str(self) -> &'static str {
        match self {
            SetType::HashIp => "hash:ip",
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashIpPortIp => "hash:ip,port,ip",
            SetType::HashIpPortNet => "hash:ip,port,net",
            SetType::BitmapPort => "bitmap:port",
        }
    }
}

/// One of upstream's sets (pkg/proxy/ipvs/ipset.go).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    LoopBack,
    ClusterIp,
    ExternalIp,
    ExternalIpLocal,
    LoadBalancer,
    LoadBalancerLocal,
    LoadBalancerFw,
    LoadBalancerSourceIp,
    LoadBalancerSourceCidr,
    NodePortTcp,
    NodePortLocalTcp,
    NodePortUdp,
    NodePortLocalUdp,
    NodePortSctp,
    NodePortLocalSctp,
    HealthCheckNodePort,
    IpvsIps,
    /// kpx's own: the virtual servers whose slot plan the host executes
    /// (nat KUBE-SERVICES jumps to KPX-IPVS-SLOTS for these only).
    Slotted,
}

impl Kind {
    pub const ALL: [Kind; 18] = [
        Kind::LoopBack,
        Kind::ClusterIp,
        Kind::ExternalIp,
        Kind::ExternalIpLocal,
        Kind::LoadBalancer,
        Kind::LoadBalancerLocal,
        Kind::LoadBalancerFw,
        Kind::LoadBalancerSourceIp,
        Kind::LoadBalancerSourceCidr,
        Kind::NodePortTcp,
        Kind::NodePortLocalTcp,
        Kind::NodePortUdp,
        Kind::NodePortLocalUdp,
        Kind::NodePortSctp,
        Kind::NodePortLocalSctp,
        Kind::HealthCheckNodePort,
        Kind::IpvsIps,
        Kind::Slotted,
    ];

    /// The IPv4 name, the type and upstream's comment.
    fn info(self) -> (&'static str, SetType, &'static str) {
        use SetType::*;
        match self {
            Kind::LoopBack => (
                "KUBE-LOOP-BACK",
                HashIpPortIp,
                "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
            ),
            Kind::ClusterIp => {
                ("KUBE-CLUSTER-IP", HashIpPort, "Kubernetes service cluster ip + port for masquerade purpose")
            }
            Kind::ExternalIp => (
                "KUBE-EXTERNAL-IP",
                HashIpPort,
                "Kubernetes service external ip + port for masquerade and filter purpose",
            ),
            Kind::ExternalIpLocal => (
                "KUBE-EXTERNAL-IP-LOCAL",
                HashIpPort,
                "Kubernetes service external ip + port with externalTrafficPolicy=local",
            ),
            Kind::LoadBalancer => ("KUBE-LOAD-BALANCER", HashIpPort, "Kubernetes service lb portal"),
            Kind::LoadBalancerLocal => (
                "KUBE-LOAD-BALANCER-LOCAL",
                HashIpPort,
                "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
            ),
            Kind::LoadBalancerFw => (
                "KUBE-LOAD-BALANCER-FW",
                HashIpPort,
                "Kubernetes service load balancer ip + port for load balancer with sourceRange",
            ),
            Kind::LoadBalancerSourceIp => (
                "KUBE-LOAD-BALANCER-SOURCE-IP",
                HashIpPortIp,
                "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
            ),
            Kind::LoadBalancerSourceCidr => (
                "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                HashIpPortNet,
                "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
            ),
            Kind::NodePortTcp => {
                ("KUBE-NODE-PORT-TCP", BitmapPort, "Kubernetes nodeport TCP port for masquerade purpose")
            }
            Kind::NodePortLocalTcp => (
                "KUBE-NODE-PORT-LOCAL-TCP",
                BitmapPort,
                "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
            ),
            Kind::NodePortUdp => {
                ("KUBE-NODE-PORT-UDP", BitmapPort, "Kubernetes nodeport UDP port for masquerade purpose")
            }
            Kind::NodePortLocalUdp => (
                "KUBE-NODE-PORT-LOCAL-UDP",
                BitmapPort,
                "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
            ),
            Kind::NodePortSctp => (
                "KUBE-NODE-PORT-SCTP-HASH",
                HashIpPort,
                "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
            ),
            Kind::NodePortLocalSctp => (
                "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
                HashIpPort,
                "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
            ),
            Kind::HealthCheckNodePort => {
                ("KUBE-HEALTH-CHECK-NODE-PORT", BitmapPort, "Kubernetes health check node port")
            }
            Kind::IpvsIps => ("KUBE-IPVS-IPS", HashIp, "Addresses on the ipvs interface"),
            Kind::Slotted => ("KPX-IPVS-SLOTTED", HashIpPort, "kpx: virtual servers whose slot plan the host runs"),
        }
    }

    /// The set's name in a family: IPv6 sets are `KUBE-6-…` (kpx's own
    /// `KPX-6-…`), cut to the kernel's 31 characters (as upstream does, so
    /// that both proxies name the same sets).
    pub fn name(self, family: IpFamily) -> String {
        let base = self.info().0;
        match family {
            IpFamily::V4 => base.to_string(),
            IpFamily::V6 => {
                let mut name = match base.strip_prefix("KUBE-") {
                    Some(rest) => format!("KUBE-6-{rest}"),
                    None => base.replacen("KPX-", "KPX-6-", 1),
                };
                name.truncate(MAX_NAME);
                name
            }
        }
    }

    pub fn set_type(self) -> SetType {
        self.info().1
    }

    pub fn comment(self) -> &'static str {
        self.info().2
    }

    /// The scratch set a sync fills before swapping it in: named from the
    /// set's name (FNV-1a), so that one a crash left behind has the same
    /// type whatever order later versions list the sets in.
    fn scratch_name(self, family: IpFamily) -> String {
        let hash = self.name(family).bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
        format!("KPX-SCRATCH-{hash:08x}")
    }
}

/// One entry, in a set of the matching type. Every value is typed: the
/// script is written from them here, never from text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Entry {
    Ip(IpAddr),
    IpPort(IpAddr, Protocol, u16),
    IpPortIp(IpAddr, Protocol, u16, IpAddr),
    IpPortNet(IpAddr, Protocol, u16, Cidr),
    Port(u16),
}

impl fmt::Display for Entry {
    /// `ipset add` syntax (IPv6 addresses bare, as ipset takes them).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entry::Ip(ip) => write!(f, "{ip}"),
            Entry::IpPort(ip, p, port) => write!(f, "{ip},{}:{port}", p.as_str()),
            Entry::IpPortIp(ip, p, port, ip2) => write!(f, "{ip},{}:{port},{ip2}", p.as_str()),
            Entry::IpPortNet(ip, p, port, net) => write!(f, "{ip},{}:{port},{net}", p.as_str()),
            Entry::Port(port) => write!(f, "{port}"),
        }
    }
}

/// The sets of one family, as a sync wants them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sets {
    pub family: IpFamily,
    pub entries: BTreeMap<Kind, BTreeSet<Entry>>,
    /// Firewalled load-balancer destinations whose source ranges hold no
    /// address of the node: the node's own connections to them are
    /// dropped (KUBE-IPVS-OUT-FILTER; they never pass filter INPUT).
    pub no_node_access: BTreeSet<(IpAddr, Protocol, u16)>,
}

/// What the sets are computed from besides the Service ports.
pub struct NodeFacts<'a> {
    /// The addresses node ports are served on (SCTP node-port entries).
    pub node_addresses: &'a [IpAddr],
    /// The addresses bound to kube-ipvs0 (KUBE-IPVS-IPS).
    pub bound: &'a BTreeSet<IpAddr>,
}

impl Sets {
    pub fn is_empty(&self, kind: Kind) -> bool {
        self.entries.get(&kind).is_none_or(BTreeSet::is_empty)
    }

    pub fn add(&mut self, kind: Kind, entry: Entry) {
        self.entries.entry(kind).or_default().insert(entry);
    }

    /// upstream's entries for these service ports (syncProxyRules).
    pub fn desired<'a>(family: IpFamily, ports: impl IntoIterator<Item = &'a ServicePort>, node: &NodeFacts) -> Sets {
        let mut sets = Sets { family, entries: BTreeMap::new(), no_node_access: BTreeSet::new() };
        for ip in node.bound.iter().filter(|ip| family.matches(ip)) {
            sets.add(Kind::IpvsIps, Entry::Ip(*ip));
        }
        for svc in ports {
            let Some(view) = svc.view(family) else { continue };
            let p = svc.protocol;
            // Hairpin: a local endpoint reaching itself through the Service.
            for e in svc.endpoints.iter().filter(|e| e.conditions.is_local && family.matches(&e.ip)) {
                sets.add(Kind::LoopBack, Entry::IpPortIp(e.ip, p, e.port, e.ip));
            }
            sets.add(Kind::ClusterIp, Entry::IpPort(view.cluster_ip, p, svc.port));
            for ip in &view.external_ips {
                let kind = if view.external_local { Kind::ExternalIpLocal } else { Kind::ExternalIp };
                sets.add(kind, Entry::IpPort(*ip, p, svc.port));
            }
            let ranges: Vec<&Cidr> = svc.load_balancer_source_ranges.iter().filter(|c| c.family() == family).collect();
            for ip in &view.load_balancer_ips {
                let entry = Entry::IpPort(*ip, p, svc.port);
                sets.add(Kind::LoadBalancer, entry);
                if view.external_local {
                    sets.add(Kind::LoadBalancerLocal, entry);
                }
                // Ranges of this family only (as upstream's service info
                // holds them); a zero-length one opens the address to all
                // (and hash:ip,port,net refuses a /0: upstream leaves it out).
                if ranges.is_empty() || ranges.iter().any(|r| r.prefix_len == 0) {
                    continue;
                }
                sets.add(Kind::LoadBalancerFw, entry);
                for range in &ranges {
                    sets.add(Kind::LoadBalancerSourceCidr, Entry::IpPortNet(*ip, p, svc.port, **range));
                }
                // The node reaches its own LB address from that address
                // (it is on kube-ipvs0): let it, when a range holds the node.
                if ranges.iter().any(|r| node.node_addresses.iter().any(|a| r.contains(a))) {
                    sets.add(Kind::LoadBalancerSourceIp, Entry::IpPortIp(*ip, p, svc.port, *ip));
                } else {
                    sets.no_node_access.insert((*ip, p, svc.port));
                }
            }
            if svc.node_port != 0 {
                let (all, local) = match p {
                    Protocol::Tcp => (Kind::NodePortTcp, Kind::NodePortLocalTcp),
                    Protocol::Udp => (Kind::NodePortUdp, Kind::NodePortLocalUdp),
                    Protocol::Sctp => (Kind::NodePortSctp, Kind::NodePortLocalSctp),
                };
                let entries: Vec<Entry> = match p {
                    Protocol::Sctp => node
                        .node_addresses
                        .iter()
                        .filter(|a| family.matches(a))
                        .map(|a| Entry::IpPort(*a, p, svc.node_port))
                        .collect(),
                    _ => vec![Entry::Port(svc.node_port)],
                };
                for e in entries {
                    sets.add(all, e);
                    if view.external_local {
                        sets.add(local, e);
                    }
                }
            }
            if svc.health_check_node_port != 0 {
                sets.add(Kind::HealthCheckNodePort, Entry::Port(svc.health_check_node_port));
            }
        }
        sets
    }

    /// The `ipset restore` script: every set created where missing, each
    /// one's scratch set filled and swapped in, the scratch set destroyed.
    pub fn restore_script(&self) -> String {
        let mut out = String::new();
        for kind in Kind::ALL {
            let name = kind.name(self.family);
            let scratch = kind.scratch_name(self.family);
            create(&mut out, kind, &name, self.family);
            create(&mut out, kind, &scratch, self.family);
            let _ = writeln!(out, "flush {scratch}");
            for entry in self.entries.get(&kind).into_iter().flatten() {
                let _ = writeln!(out, "add {scratch} {entry} -exist");
            }
            let _ = writeln!(out, "swap {scratch} {name}");
            let _ = writeln!(out, "destroy {scratch}");
        }
        out
    }
}

/// `create NAME TYPE …` with upstream's parameters (`-exist`: a set that
/// is already there with them is kept).
fn create(out: &mut String, kind: Kind, name: &str, family: IpFamily) {
    let ty = kind.set_type();
    let _ = match ty {
        SetType::BitmapPort => writeln!(out, "create {name} {} range 0-65535 -exist", ty.as_str()),
        _ => {
            let family = match family {
                IpFamily::V4 => "inet",
                IpFamily::V6 => "inet6",
            };
            writeln!(out, "create {name} {} family {family} hashsize 1024 maxelem 65536 -exist", ty.as_str())
        }
    };
}

/// `--cleanup`: destroys every set kpx (and upstream's ipvs mode)
/// creates, in both families. A node without the ipset tool has none.
/// The number of sets destroyed.
pub fn cleanup(exec: &dyn crate::kernel::Exec) -> crate::kernel::Result<usize> {
    let existing = match exec.run("ipset", &["list", "-n"], None) {
        Ok(names) => names,
        Err(crate::kernel::Error::Spawn { .. }) => return Ok(0),
        Err(e) => return Err(e),
    };
    let script = destroy_script(&existing);
    if !script.is_empty() {
        exec.run("ipset", &["restore"], Some(script.as_bytes()))?;
    }
    Ok(script.lines().count())
}

/// The script that destroys every set kpx (and upstream's ipvs mode)
/// creates, in both families, with their scratch sets, of those in
/// `existing` (`ipset list -n`).
pub fn destroy_script(existing: &str) -> String {
    let have: BTreeSet<&str> = existing.lines().map(str::trim).collect();
    let mut out = String::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        for kind in Kind::ALL {
            for name in [kind.name(family), kind.scratch_name(family)] {
                if have.contains(name.as_str()) {
                    let _ = writeln!(out, "destroy {name}");
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpx_rules::model::{Endpoint, TrafficPolicy};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn names_are_upstreams_and_fit_the_kernel() {
        assert_eq!(Kind::LoadBalancerSourceCidr.name(IpFamily::V4), "KUBE-LOAD-BALANCER-SOURCE-CIDR");
        // upstream's truncation of "KUBE-6-LOAD-BALANCER-SOURCE-CIDR".
        assert_eq!(Kind::LoadBalancerSourceCidr.name(IpFamily::V6), "KUBE-6-LOAD-BALANCER-SOURCE-CID");
        assert_eq!(Kind::NodePortTcp.name(IpFamily::V6), "KUBE-6-NODE-PORT-TCP");
        assert_eq!(Kind::Slotted.name(IpFamily::V6), "KPX-6-IPVS-SLOTTED");
        // Unique across both families: the kernel's set names are global.
        let mut names = BTreeSet::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            for kind in Kind::ALL {
                for name in [kind.name(family), kind.scratch_name(family)] {
                    assert!(name.len() <= MAX_NAME, "{name}");
                    assert!(names.insert(name.clone()), "{name} twice");
                }
            }
        }
    }

    fn web() -> ServicePort {
        let mut local = Endpoint::ready(ip("10.244.1.5"), 8080);
        local.conditions.is_local = true;
        let mut s = ServicePort::new("test", "web", "http", Protocol::Tcp, 80)
            .with_cluster_endpoints(vec![local, Endpoint::ready(ip("10.244.2.5"), 8080)]);
        s.cluster_ip = Some(ip("10.96.0.10"));
        s.node_port = 30080;
        s.external_ips = vec![ip("192.0.2.7")];
        s.load_balancer_ips = vec![ip("198.51.100.1"), ip("fd00::1")];
        s.load_balancer_source_ranges = vec!["203.0.113.0/24".parse().unwrap(), "192.168.100.0/24".parse().unwrap()];
        s.external_traffic_policy = TrafficPolicy::Local;
        s.health_check_node_port = 31000;
        s
    }

    #[test]
    fn entries_follow_upstream() {
        let bound: BTreeSet<IpAddr> = [ip("10.96.0.10"), ip("fd00::10")].into();
        let node = NodeFacts { node_addresses: &[ip("192.168.100.1")], bound: &bound };
        let sets = Sets::desired(IpFamily::V4, [&web()], &node);
        let get = |k: Kind| sets.entries.get(&k).map(|s| s.iter().map(ToString::to_string).collect::<Vec<_>>());
        assert_eq!(get(Kind::IpvsIps).unwrap(), ["10.96.0.10"]);
        assert_eq!(get(Kind::LoopBack).unwrap(), ["10.244.1.5,tcp:8080,10.244.1.5"]);
        assert_eq!(get(Kind::ClusterIp).unwrap(), ["10.96.0.10,tcp:80"]);
        assert_eq!(get(Kind::ExternalIpLocal).unwrap(), ["192.0.2.7,tcp:80"]);
        assert_eq!(get(Kind::ExternalIp), None);
        assert_eq!(get(Kind::LoadBalancer).unwrap(), ["198.51.100.1,tcp:80"]);
        assert_eq!(get(Kind::LoadBalancerLocal).unwrap(), ["198.51.100.1,tcp:80"]);
        assert_eq!(get(Kind::LoadBalancerFw).unwrap(), ["198.51.100.1,tcp:80"]);
        assert_eq!(
            get(Kind::LoadBalancerSourceCidr).unwrap(),
            ["198.51.100.1,tcp:80,192.168.100.0/24", "198.51.100.1,tcp:80,203.0.113.0/24"]
        );
        // A range holds the node's address: the node may reach the LB.
        assert_eq!(get(Kind::LoadBalancerSourceIp).unwrap(), ["198.51.100.1,tcp:80,198.51.100.1"]);
        assert_eq!(get(Kind::NodePortTcp).unwrap(), ["30080"]);
        assert_eq!(get(Kind::NodePortLocalTcp).unwrap(), ["30080"]);
        assert_eq!(get(Kind::HealthCheckNodePort).unwrap(), ["31000"]);

        // IPv6: the LB address of that family; its source ranges are all
        // IPv4, so none applies to it (upstream keeps ranges per family).
        let v6 = Sets::desired(IpFamily::V6, [&web()], &node);
        assert!(v6.is_empty(Kind::ClusterIp), "no IPv6 cluster IP: nothing of it is programmed");
        let mut dual = web();
        dual.cluster_ip = Some(ip("fd00::10"));
        let v6 = Sets::desired(IpFamily::V6, [&dual], &node);
        let get6 = |k: Kind| v6.entries.get(&k).map(|s| s.iter().map(ToString::to_string).collect::<Vec<_>>());
        assert_eq!(get6(Kind::LoadBalancerFw), None);
        assert_eq!(get6(Kind::LoadBalancerSourceCidr), None);
        // 0.0.0.0/0 opens the address: no firewall entry (and no /0 entry,
        // which the kernel would refuse, failing the whole restore).
        let mut open = web();
        open.load_balancer_source_ranges.push("0.0.0.0/0".parse().unwrap());
        let sets = Sets::desired(IpFamily::V4, [&open], &node);
        assert!(sets.is_empty(Kind::LoadBalancerFw) && sets.is_empty(Kind::LoadBalancerSourceCidr));
        assert_eq!(get6(Kind::IpvsIps).unwrap(), ["fd00::10"]);
    }

    #[test]
    fn sctp_node_ports_are_per_node_address() {
        let mut s = ServicePort::new("test", "s", "", Protocol::Sctp, 7777);
        s.cluster_ip = Some(ip("10.96.0.20"));
        s.node_port = 30777;
        let bound = BTreeSet::new();
        let node = NodeFacts { node_addresses: &[ip("192.168.100.1"), ip("10.0.0.1"), ip("fd00::2")], bound: &bound };
        let sets = Sets::desired(IpFamily::V4, [&s], &node);
        let got: Vec<String> = sets.entries[&Kind::NodePortSctp].iter().map(ToString::to_string).collect();
        assert_eq!(got, ["10.0.0.1,sctp:30777", "192.168.100.1,sctp:30777"]);
        assert!(sets.is_empty(Kind::NodePortTcp));
    }

    #[test]
    fn the_script_swaps_every_set_in_whole() {
        let bound = BTreeSet::new();
        let node = NodeFacts { node_addresses: &[], bound: &bound };
        let script = Sets::desired(IpFamily::V4, [&web()], &node).restore_script();
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(
            &lines[..6],
            [
                "create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536 -exist",
                "create KPX-SCRATCH-22988fb3 hash:ip,port,ip family inet hashsize 1024 maxelem 65536 -exist",
                "flush KPX-SCRATCH-22988fb3",
                "add KPX-SCRATCH-22988fb3 10.244.1.5,tcp:8080,10.244.1.5 -exist",
                "swap KPX-SCRATCH-22988fb3 KUBE-LOOP-BACK",
                "destroy KPX-SCRATCH-22988fb3",
            ]
        );
        assert!(lines.contains(&"create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 -exist"));
        // Every set is swapped, the empty ones too (that is how they empty).
        assert_eq!(lines.iter().filter(|l| l.starts_with("swap ")).count(), Kind::ALL.len());
    }
}
