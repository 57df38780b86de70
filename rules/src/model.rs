//! The rule model: what every backend is given, mirroring the WIT types of
//! `kpx:proxier` in plain Rust. The host builds it from Kubernetes objects;
//! the SDK converts it to and from the component boundary.

use std::fmt;
use std::net::IpAddr;

// The settings name the mode, and a service port its plans: the model
// names them too, so that what every backend is given reads from one path.
pub use crate::mode::ProxyMode;
pub use crate::plan::{HashField, KernelPlan, Plan, SlotTable};

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Lower-case name, as iptables and upstream's hashes spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An address as Kubernetes' `ParseIPSloppy` reads one (Go 1.16's
/// parser, forked): an IPv4 address may have leading zeros in its parts,
/// any number of them, read as decimal (`10.096.0.010` is 10.96.0.10). The API server has refused them in new objects since
/// v1.36 (StrictIPCIDRValidation), but older objects keep them, and
/// kube-proxy programs them.
pub fn parse_ip_sloppy(text: &str) -> Option<std::net::IpAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<std::net::IpAddr>() {
        // An IPv4-mapped IPv6 address is IPv4, as Go's `To4` reads it.
        return Some(ip.to_canonical());
    }
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() != 4 || parts.iter().any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(&parts) {
        *o = p.parse().ok()?;
    }
    Some(std::net::IpAddr::V4(std::net::Ipv4Addr::from(octets)))
}

#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(addr: &IpAddr) -> IpFamily {
        match addr {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn matches(self, addr: &IpAddr) -> bool {
        IpFamily::of(addr) == self
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        })
    }
}

/// An address prefix such as `10.0.0.0/8`.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

impl Cidr {
    /// The one-address prefix of `ip` (/32 or /128).
    /// One address: /32 or /128.
    pub fn is_host(&self) -> bool {
        self.prefix_len == if self.addr.is_ipv4() { 32 } else { 128 }
    }

    pub fn host(ip: IpAddr) -> Cidr {
        Cidr { addr: ip, prefix_len: if ip.is_ipv4() { 32 } else { 128 } }
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.addr)
    }

    /// Longest prefix length of the family (32 or 128).
    pub fn max_len(&self) -> u8 {
        if self.addr.is_ipv4() { 32 } else { 128 }
    }

    /// The prefix's first address (its address with the host bits cleared).
    pub fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(v4) => {
                let bits = u32::from(self.prefix_len.min(32));
                let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let bits = u32::from(self.prefix_len.min(128));
                let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        }
    }

    /// The prefix's last address.
    pub fn last(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(v4) => {
                let bits = u32::from(self.prefix_len.min(32));
                let host = if bits == 0 { u32::MAX } else { u32::MAX.checked_shr(bits).unwrap_or(0) };
                IpAddr::V4((u32::from(v4) | host).into())
            }
            IpAddr::V6(v6) => {
                let bits = u32::from(self.prefix_len.min(128));
                let host = if bits == 0 { u128::MAX } else { u128::MAX.checked_shr(bits).unwrap_or(0) };
                IpAddr::V6((u128::from(v6) | host).into())
            }
        }
    }

    pub fn contains(&self, ip: &IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let bits = u32::from(self.prefix_len.min(32));
                let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
                u32::from(net) & mask == u32::from(*ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let bits = u32::from(self.prefix_len.min(128));
                let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
                u128::from(net) & mask == u128::from(*ip) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// Why a string is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrParseError(pub String);

impl fmt::Display for CidrParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid CIDR {:?}: want ADDRESS/PREFIX-LENGTH", self.0)
    }
}

impl std::error::Error for CidrParseError {}

impl Cidr {
    /// A CIDR as Kubernetes' `ParseCIDRSloppy` reads one: the address as
    /// [`parse_ip_sloppy`] reads it (`203.0.113.000/025` is
    /// 203.0.113.0/25), for old objects' values.
    pub fn parse_sloppy(text: &str) -> Result<Cidr, CidrParseError> {
        let err = || CidrParseError(text.to_string());
        let (addr, len) = text.trim().split_once('/').ok_or_else(err)?;
        let mapped = addr.parse::<std::net::Ipv6Addr>().is_ok_and(|a| a.to_ipv4_mapped().is_some());
        let addr = parse_ip_sloppy(addr).ok_or_else(err)?;
        if mapped {
            // ::ffff:a.b.c.d/N is IPv4's /(N-96), as Go's family of it.
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| (96..=128).contains(l) && len.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(err)?;
            return format!("{addr}/{}", len - 96).parse().map_err(|_| err());
        }
        format!("{addr}/{len}").parse().map_err(|_| err())
    }
}

impl std::str::FromStr for Cidr {
    type Err = CidrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CidrParseError(s.to_string());
        let (addr, len) = s.trim().split_once('/').ok_or_else(err)?;
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        // Digits only (Rust's integers also take a sign).
        if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let prefix_len: u8 = len.parse().map_err(|_| err())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(err());
        }
        Ok(Cidr { addr, prefix_len })
    }
}

/// EndpointSlice conditions and locality of one endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Conditions {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub is_local: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub conditions: Conditions,
    pub zone: Option<Box<str>>,
    /// From the EndpointSlice annotation `kpx.dev/weights` (default 1).
    pub weight: u16,
}

impl Endpoint {
    /// A ready, serving endpoint on another node with no zone.
    pub fn ready(ip: IpAddr, port: u16) -> Self {
        Endpoint {
            ip,
            port,
            conditions: Conditions { ready: true, serving: true, terminating: false, is_local: false },
            zone: None,
            weight: 1,
        }
    }

    /// `ip:port`, or `[ip]:port` for IPv6: the form upstream hashes and DNATs to.
    pub fn host_port(&self) -> String {
        join_host_port(&self.ip, self.port)
    }
}

/// The inverse of [`join_host_port`]: `ip:port` or `[ip]:port`.
pub fn split_host_port(text: &str) -> Option<(IpAddr, u16)> {
    let (ip, port) = match text.strip_prefix('[') {
        Some(rest) => rest.split_once("]:")?,
        None => text.rsplit_once(':')?,
    };
    Some((ip.parse().ok()?, port.parse().ok()?))
}

/// Go's `net.JoinHostPort` for an address and a port. IPv4 is written
/// digit by digit: this runs once per endpoint per render, and the
/// formatting machinery is several times slower (in WebAssembly most).
pub fn join_host_port(ip: &IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let mut out = String::with_capacity(21);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                push_decimal(&mut out, u32::from(octet));
            }
            out.push(':');
            push_decimal(&mut out, u32::from(port));
            out
        }
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// Appends `n` in decimal.
fn push_decimal(out: &mut String, n: u32) {
    let mut digits = [0u8; 10];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        out.push(char::from(d));
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TrafficPolicy {
    #[default]
    Cluster,
    Local,
}

/// One port of one Service, for one IP family, with its endpoints already
/// categorised by the host (cluster and local sets are indices into
/// `endpoints`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// `namespace/name:port-name`, or `namespace/name` for an unnamed port.
    pub key: String,
    pub namespace: String,
    pub name: String,
    pub port_name: String,
    pub protocol: Protocol,
    pub cluster_ip: Option<IpAddr>,
    pub port: u16,
    /// 0 when none.
    pub node_port: u16,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    pub load_balancer_source_ranges: Vec<Cidr>,
    pub external_traffic_policy: TrafficPolicy,
    pub internal_traffic_policy: TrafficPolicy,
    /// 0 when none.
    pub health_check_node_port: u16,
    /// 0 means no ClientIP affinity.
    pub affinity_timeout_seconds: u32,
    /// The scheduler the Service selects (host-side: not sent to
    /// backends, which get the plans). One copy for every port of the
    /// Service: the host parses the annotations once, when it stores the
    /// Service, and each port holds a pointer to what they say (200 KiB
    /// of parameters on 2,000 ports held 874 MB when each port had a copy).
    pub scheduler: Option<std::sync::Arc<SchedulerChoice>>,
    pub endpoints: Vec<Endpoint>,
    pub cluster_endpoints: Vec<u32>,
    pub local_endpoints: Vec<u32>,
    /// How to choose among `cluster_endpoints`; None: uniform random.
    pub cluster_plan: Option<Plan>,
    /// How to choose among `local_endpoints`; None: uniform random.
    pub local_plan: Option<Plan>,
    /// In the host: the Service's `ext.kpx.dev/` annotations, full keys,
    /// sorted. In an extension: its own (`ext.kpx.dev/<name>.` removed).
    /// Backends and schedulers get none.
    pub annotations: Vec<(String, String)>,
}

/// A Service's scheduler: `kpx.dev/scheduler` and `kpx.dev/scheduler-params`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SchedulerChoice {
    pub name: String,
    pub parameters: Vec<(String, String)>,
}

impl ServicePort {
    /// A port with no addresses, no endpoints and default policies; callers
    /// fill in what their Service has.
    pub fn new(namespace: &str, name: &str, port_name: &str, protocol: Protocol, port: u16) -> Self {
        ServicePort {
            key: Self::key_for(namespace, name, port_name),
            namespace: namespace.into(),
            name: name.into(),
            port_name: port_name.into(),
            protocol,
            cluster_ip: None,
            port,
            node_port: 0,
            external_ips: vec![],
            load_balancer_ips: vec![],
            load_balancer_source_ranges: vec![],
            external_traffic_policy: TrafficPolicy::Cluster,
            internal_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: 0,
            affinity_timeout_seconds: 0,
            scheduler: None,
            endpoints: vec![],
            cluster_endpoints: vec![],
            local_endpoints: vec![],
            cluster_plan: None,
            local_plan: None,
            annotations: vec![],
        }
    }

    /// Its cluster IP, external IPs and load-balancer IPs.
    pub fn addresses(&self) -> impl Iterator<Item = &IpAddr> {
        self.cluster_ip.iter().chain(&self.external_ips).chain(&self.load_balancer_ips)
    }

    /// Replaces the endpoints, all of them usable cluster-wide.
    pub fn with_cluster_endpoints(mut self, endpoints: Vec<Endpoint>) -> Self {
        self.cluster_endpoints = (0..endpoints.len() as u32).collect();
        self.local_endpoints.clear();
        self.endpoints = endpoints;
        self
    }

    /// The key upstream's `ServicePortName.String()` gives.
    pub fn key_for(namespace: &str, name: &str, port_name: &str) -> String {
        // Not `format!`: a plugin's reset builds one key per port.
        let mut key = String::with_capacity(namespace.len() + name.len() + port_name.len() + 2);
        key.push_str(namespace);
        key.push('/');
        key.push_str(name);
        if !port_name.is_empty() {
            key.push(':');
            key.push_str(port_name);
        }
        key
    }

    /// The work this port is for a backend: itself, its endpoints and the
    /// entries of its plans (what the plugin's fuel scales with).
    pub fn size(&self) -> usize {
        let plan = |p: &Option<Plan>| p.as_ref().map_or(0, Plan::size);
        1 + self.endpoints.len() + plan(&self.cluster_plan) + plan(&self.local_plan)
    }

    /// The endpoints cluster-wide traffic may use.
    pub fn cluster_endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.cluster_endpoints.iter().filter_map(|&i| self.endpoints.get(i as usize))
    }

    /// The endpoints Local traffic policies may use.
    pub fn local_endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.local_endpoints.iter().filter_map(|&i| self.endpoints.get(i as usize))
    }
}

/// The decisions about one service port that every mode makes the same
/// way (upstream's proxier logic), for one IP family.
#[derive(Clone, Debug)]
pub struct ServiceView<'a> {
    pub cluster_ip: IpAddr,
    pub cluster_endpoints: Vec<&'a Endpoint>,
    pub local_endpoints: Vec<&'a Endpoint>,
    /// Some endpoint is ready, or serving and terminating (upstream's
    /// hasEndpoints: REJECT without, DROP for an empty Local policy).
    pub has_endpoints: bool,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    /// A node port, an external IP or a load-balancer IP.
    pub externally_accessible: bool,
    /// internalTrafficPolicy Local.
    pub internal_local: bool,
    /// externalTrafficPolicy Local, for an externally accessible Service.
    pub external_local: bool,
    /// The plans over `cluster_endpoints` and `local_endpoints` (None:
    /// uniform random).
    pub cluster_plan: Option<&'a Plan>,
    pub local_plan: Option<&'a Plan>,
}

impl ServiceView<'_> {
    /// The endpoints cluster-IP traffic uses.
    pub fn internal_endpoints(&self) -> &[&Endpoint] {
        if self.internal_local { &self.local_endpoints } else { &self.cluster_endpoints }
    }

    /// The endpoints external traffic uses.
    pub fn external_endpoints(&self) -> &[&Endpoint] {
        if self.external_local { &self.local_endpoints } else { &self.cluster_endpoints }
    }

    pub fn has_internal(&self) -> bool {
        self.has_endpoints && !self.internal_endpoints().is_empty()
    }

    pub fn has_external(&self) -> bool {
        self.has_endpoints && !self.external_endpoints().is_empty()
    }
}

impl ServicePort {
    /// The view for one family; None without a cluster IP of that family.
    pub fn view(&self, family: IpFamily) -> Option<ServiceView<'_>> {
        let cluster_ip = self.cluster_ip.filter(|ip| family.matches(ip))?;
        let external_ips: Vec<IpAddr> = self.external_ips.iter().filter(|ip| family.matches(ip)).copied().collect();
        let load_balancer_ips: Vec<IpAddr> =
            self.load_balancer_ips.iter().filter(|ip| family.matches(ip)).copied().collect();
        let externally_accessible = self.node_port != 0 || !external_ips.is_empty() || !load_balancer_ips.is_empty();
        Some(ServiceView {
            cluster_ip,
            cluster_endpoints: self.cluster_endpoints().collect(),
            local_endpoints: self.local_endpoints().collect(),
            has_endpoints: self
                .endpoints
                .iter()
                .any(|e| e.conditions.ready || (e.conditions.serving && e.conditions.terminating)),
            external_ips,
            load_balancer_ips,
            externally_accessible,
            internal_local: self.internal_traffic_policy == TrafficPolicy::Local,
            external_local: self.external_traffic_policy == TrafficPolicy::Local && externally_accessible,
            cluster_plan: self.cluster_plan.as_ref(),
            local_plan: self.local_plan.as_ref(),
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    /// Addresses of the instance's family; the first is the primary.
    pub addresses: Vec<IpAddr>,
    pub zone: String,
    pub labels: Vec<(String, String)>,
    pub pod_cidrs: Vec<Cidr>,
}

/// Cluster-wide facts for one family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cluster {
    /// ServiceCIDR ranges.
    pub service_cidrs: Vec<Cidr>,
}

/// How traffic from local pods is recognised (`--detect-local-mode`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalTraffic {
    #[default]
    None,
    Cidrs(Vec<Cidr>),
    BridgeInterface(String),
    InterfaceNamePrefix(String),
}

/// Which node addresses accept node-port traffic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// Every local address.
    #[default]
    All,
    /// Only these (possibly none).
    Only(Vec<Cidr>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub family: IpFamily,
    pub mode: ProxyMode,
    pub local_traffic: LocalTraffic,
    pub masquerade_all: bool,
    pub masquerade_bit: u8,
    pub masquerade_random_fully: bool,
    pub nodeport_addresses: NodePortAddresses,
    pub localhost_nodeports: bool,
    pub conntrack_tcp_be_liberal: bool,
    pub extra: Vec<(String, String)>,
    /// Host only (not in the contract): nftables mode's node ports on
    /// loopback refused and counted, by protocol (KEP-6032); TCP is left
    /// out when kpx relays localhost node ports.
    pub localhost_nodeport_rejects: Vec<Protocol>,
    /// Host only: iptables mode counts its INVALID drops and localhost
    /// node-port connections in nfacct objects (the node has nfacct).
    pub nfacct: bool,
}

impl Settings {
    /// Upstream's defaults for a family.
    pub fn new(family: IpFamily, mode: ProxyMode) -> Settings {
        Settings {
            family,
            mode,
            local_traffic: LocalTraffic::None,
            masquerade_all: false,
            masquerade_bit: 14,
            masquerade_random_fully: true,
            nodeport_addresses: NodePortAddresses::All,
            localhost_nodeports: true,
            conntrack_tcp_be_liberal: false,
            extra: Vec::new(),
            localhost_nodeport_rejects: Vec::new(),
            nfacct: false,
        }
    }

    /// The masquerade mark, `1 << masquerade_bit`.
    pub fn masquerade_mark(&self) -> u32 {
        1u32 << u32::from(self.masquerade_bit.min(31))
    }

    /// The mark bits below the masquerade bit, where iptables hash-mark
    /// targets put their slot.
    pub fn hash_slot_mask(&self) -> u32 {
        self.masquerade_mark() - 1
    }

    /// A value from `extra`.
    pub fn extra(&self, key: &str) -> Option<&str> {
        self.extra.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// Nearly every change is an upsert, so boxing it would cost an allocation
/// per change to save space in the rare others.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Upsert(ServicePort),
    Remove(String),
    Node(Node),
    Cluster(Cluster),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kubernetes' ParseIPSloppy (upstream's TestBadIPs programs
    /// 172.30.0.041 as 172.30.0.41).
    #[test]
    fn sloppy_addresses_read_as_kubernetes_reads_them() {
        let ip = |s: &str| parse_ip_sloppy(s).map(|a| a.to_string());
        assert_eq!(ip("172.30.0.041").as_deref(), Some("172.30.0.41"));
        assert_eq!(ip("010.180.000.001").as_deref(), Some("10.180.0.1"));
        assert_eq!(ip(" 10.0.0.1 ").as_deref(), Some("10.0.0.1"));
        assert_eq!(ip("fd00::1").as_deref(), Some("fd00::1"));
        assert_eq!(ip("1.2.3.0001").as_deref(), Some("1.2.3.1"), "Go's dtoi takes any number of zeros");
        for bad in ["1.2.3", "1.2.3.256", "1.2.3.00256", "1.2.3.x", "", "1..2.3", "1.2.3.+1"] {
            assert_eq!(ip(bad), None, "{bad}");
        }
        // And CIDRs (ParseCIDRSloppy), as TestBadIPs' source range.
        let cidr = |s: &str| Cidr::parse_sloppy(s).map(|c| c.to_string()).ok();
        assert_eq!(cidr("203.0.113.000/025").as_deref(), Some("203.0.113.0/25"));
        assert_eq!(cidr(" 10.0.0.0/8").as_deref(), Some("10.0.0.0/8"));
        assert_eq!(cidr("fd00::/64").as_deref(), Some("fd00::/64"));
        assert_eq!(ip("::ffff:10.96.0.3").as_deref(), Some("10.96.0.3"), "IPv4-mapped is IPv4");
        assert_eq!(cidr("::ffff:10.0.0.0/104").as_deref(), Some("10.0.0.0/8"));
        for bad in ["203.0.113.000", "203.0.113.0/33", "203.0.113.0/x", "1.2.3/8", "10.0.0.0/+8", "::ffff:10.0.0.0/90"]
        {
            assert_eq!(cidr(bad), None, "{bad}");
        }
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn an_endpoint_is_48_bytes() {
        // Ten per port at 30k Services are 300k of them in the host's
        // state (and the plugin's); 56 bytes with the zone a `String`.
        assert_eq!(std::mem::size_of::<Endpoint>(), 48);
    }

    #[test]
    fn cidr_parse_and_contains() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains(&"10.1.2.3".parse().unwrap()));
        assert!(!c.contains(&"11.1.2.3".parse().unwrap()));
        assert!(!c.contains(&"::1".parse().unwrap()));
        let c6: Cidr = "fd00::/64".parse().unwrap();
        assert!(c6.contains(&"fd00::5".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("10.0.0.0".parse::<Cidr>().is_err());
        assert_eq!(c.to_string(), "10.0.0.0/8");
    }

    #[test]
    fn keys_as_upstream() {
        assert_eq!(ServicePort::key_for("ns", "svc", "p80"), "ns/svc:p80");
        assert_eq!(ServicePort::key_for("ns", "svc", ""), "ns/svc");
    }

    #[test]
    fn join_host_port_brackets_v6() {
        assert_eq!(join_host_port(&"fd00::1".parse().unwrap(), 80), "[fd00::1]:80");
        assert_eq!(join_host_port(&"10.0.0.1".parse().unwrap(), 80), "10.0.0.1:80");
        for (ip, port) in [("0.0.0.0", 0), ("255.255.255.255", 65535), ("1.20.100.9", 8080), ("10.0.10.100", 1)] {
            let addr: IpAddr = ip.parse().unwrap();
            assert_eq!(join_host_port(&addr, port), format!("{addr}:{port}"));
        }
    }
}
