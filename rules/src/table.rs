//! Contract 0.3.0's `port-table`: the service ports of a reset, or of an
//! apply's upserts, column by column. Bulk data crosses the component
//! boundary as a few lists of scalars; a list of records holding strings
//! and lists costs one call into the guest per string and per list (about
//! 14 per port: 22 ms of a 10k-Service reset against 3.5 for the same
//! generator's native reset).
//!
//! [`PortTable`] is the plain Rust shape of the WIT record, shared by the
//! host, which [`encode`]s the ports it sends, and kpx-sdk, which
//! [`decode`]s them into the model the generators read. The decoder trusts
//! nothing: the conformance kit hands tables to third-party plugins, and a
//! malformed table is refused with the column and the index named.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::model::{Cidr, Conditions, Endpoint, IpFamily, Protocol, ServicePort, TrafficPolicy};
use crate::plan::Plan;

/// Bits of [`PortTable::flags`].
pub mod flag {
    /// The port's Service has a cluster IP of the table's family.
    pub const HAS_CLUSTER_IP: u8 = 1;
    /// externalTrafficPolicy: Local.
    pub const EXTERNAL_LOCAL: u8 = 2;
    /// internalTrafficPolicy: Local.
    pub const INTERNAL_LOCAL: u8 = 4;
    pub const ALL: u8 = HAS_CLUSTER_IP | EXTERNAL_LOCAL | INTERNAL_LOCAL;
}

/// Bits of [`PortTable::endpoint_conditions`].
pub mod condition {
    pub const READY: u8 = 1;
    pub const SERVING: u8 = 2;
    pub const TERMINATING: u8 = 4;
    pub const IS_LOCAL: u8 = 8;
    pub const ALL: u8 = READY | SERVING | TERMINATING | IS_LOCAL;
}

/// Service ports column by column: entry i of each per-port column
/// describes port i. Per-port lists are `(ends, values)` pairs: port i's
/// values run from `ends[i - 1]` (0 for the first) to `ends[i]`, and ends
/// count items (an address is one item of one word for IPv4, four for
/// IPv6, most significant first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortTable {
    pub family: IpFamily,
    /// Every string end to end; string i runs from `text_ends[i - 1]` to
    /// `text_ends[i]`.
    pub text: String,
    pub text_ends: Vec<u32>,
    /// Per port: string indices (the key is derived from them).
    pub namespaces: Vec<u32>,
    pub names: Vec<u32>,
    pub port_names: Vec<u32>,
    /// Per port: 0 TCP, 1 UDP, 2 SCTP.
    pub protocols: Vec<u8>,
    pub ports: Vec<u16>,
    pub node_ports: Vec<u16>,
    pub health_check_node_ports: Vec<u16>,
    pub affinity_seconds: Vec<u32>,
    /// Per port: [`flag`] bits.
    pub flags: Vec<u8>,
    /// Per port: its cluster IP's words, zero without one.
    pub cluster_ips: Vec<u32>,
    pub external_ip_ends: Vec<u32>,
    pub external_ips: Vec<u32>,
    pub load_balancer_ip_ends: Vec<u32>,
    pub load_balancer_ips: Vec<u32>,
    pub source_range_ends: Vec<u32>,
    pub source_range_words: Vec<u32>,
    pub source_range_prefixes: Vec<u8>,
    /// Every port's endpoints end to end, one entry per endpoint in each
    /// column after `endpoint_ends`.
    pub endpoint_ends: Vec<u32>,
    pub endpoint_words: Vec<u32>,
    pub endpoint_ports: Vec<u16>,
    /// [`condition`] bits.
    pub endpoint_conditions: Vec<u8>,
    /// String index plus one; 0: no zone.
    pub endpoint_zones: Vec<u32>,
    pub endpoint_weights: Vec<u16>,
    /// Positions in the port's own endpoints.
    pub cluster_endpoint_ends: Vec<u32>,
    pub cluster_endpoints: Vec<u32>,
    pub local_endpoint_ends: Vec<u32>,
    pub local_endpoints: Vec<u32>,
    /// Only the ports that have one: (port index, plan), port indices
    /// strictly increasing.
    pub cluster_plans: Vec<(u32, Plan)>,
    pub local_plans: Vec<(u32, Plan)>,
}

/// Why a table was refused (or could not be built).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableError {
    /// The column, as the WIT record names it.
    pub column: &'static str,
    /// The entry of that column.
    pub index: usize,
    pub why: String,
}

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "port-table {}[{}]: {}", self.column, self.index, self.why)
    }
}

impl std::error::Error for TableError {}

fn err(column: &'static str, index: usize, why: impl Into<String>) -> TableError {
    TableError { column, index, why: why.into() }
}

fn stride(family: IpFamily) -> usize {
    match family {
        IpFamily::V4 => 1,
        IpFamily::V6 => 4,
    }
}

fn protocol_code(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 0,
        Protocol::Udp => 1,
        Protocol::Sctp => 2,
    }
}

/// The longest string a table holds, in bytes: a decoded port holds its
/// namespace, name and port name twice (and its key), so a table cannot
/// decode to more than a few kilobytes per port (Kubernetes' own limits
/// are 253 for a name, 63 for a label value).
pub const MAX_STRING: usize = 1024;

fn len_u32(n: usize, column: &'static str) -> Result<u32, TableError> {
    u32::try_from(n).map_err(|_| err(column, n, "more than 2^32 - 1 entries"))
}

/// The table under construction.
struct Encoder {
    t: PortTable,
    /// The last namespace and name written, reused by the next port
    /// (ports come in key order: a Service's ports, a namespace's
    /// Services, are neighbours).
    last: [Option<u32>; 2],
    /// Zones written so far, and their string indices.
    zones: std::collections::HashMap<Box<str>, u32>,
}

impl Encoder {
    fn string(&mut self, s: &str) -> Result<u32, TableError> {
        if s.len() > MAX_STRING {
            return Err(err(
                "text",
                self.t.text_ends.len(),
                format!("a string of {} bytes (at most {MAX_STRING})", s.len()),
            ));
        }
        self.t.text.push_str(s);
        let end = len_u32(self.t.text.len(), "text")?;
        self.t.text_ends.push(end);
        len_u32(self.t.text_ends.len() - 1, "text-ends")
    }

    fn string_at(&self, i: u32) -> &str {
        let end = self.t.text_ends[i as usize] as usize;
        let start = if i == 0 { 0 } else { self.t.text_ends[i as usize - 1] as usize };
        &self.t.text[start..end]
    }

    /// A namespace (slot 0) or name (slot 1), reusing the previous port's.
    fn repeated(&mut self, slot: usize, s: &str) -> Result<u32, TableError> {
        if let Some(i) = self.last[slot]
            && self.string_at(i) == s
        {
            return Ok(i);
        }
        let i = self.string(s)?;
        self.last[slot] = Some(i);
        Ok(i)
    }

    fn zone(&mut self, zone: Option<&str>) -> Result<u32, TableError> {
        let Some(zone) = zone else { return Ok(0) };
        if let Some(&i) = self.zones.get(zone) {
            return Ok(i + 1);
        }
        let i = self.string(zone)?;
        self.zones.insert(zone.into(), i);
        Ok(i + 1)
    }
}

/// Appends `ip`'s words to `words`, entry `index` of `column`.
fn push_address(
    family: IpFamily,
    words: &mut Vec<u32>,
    ip: &IpAddr,
    column: &'static str,
    index: usize,
) -> Result<(), TableError> {
    match (family, ip) {
        (IpFamily::V4, IpAddr::V4(a)) => words.push(u32::from(*a)),
        (IpFamily::V6, IpAddr::V6(a)) => {
            let o = a.octets();
            words.extend((0..4).map(|w| u32::from_be_bytes([o[4 * w], o[4 * w + 1], o[4 * w + 2], o[4 * w + 3]])));
        }
        _ => return Err(err(column, index, format!("{ip} is not of the table's family"))),
    }
    Ok(())
}

/// Appends a port's addresses to `words`; the column's end after them.
fn push_addresses(
    family: IpFamily,
    words: &mut Vec<u32>,
    ips: impl IntoIterator<Item = IpAddr>,
    column: &'static str,
) -> Result<u32, TableError> {
    for ip in ips {
        let at = words.len() / stride(family);
        push_address(family, words, &ip, column, at)?;
    }
    len_u32(words.len() / stride(family), column)
}

/// The table of `ports`, for an instance of `family`. Fails only on a
/// port holding an address of the other family, or on sizes past 2^32.
pub fn encode<'a>(family: IpFamily, ports: impl IntoIterator<Item = &'a ServicePort>) -> Result<PortTable, TableError> {
    let mut e = Encoder { t: PortTable::empty(family), last: [None, None], zones: Default::default() };
    for (i, p) in ports.into_iter().enumerate() {
        e.port(i, p).map_err(|mut error| {
            error.why = format!("{}: {}", p.key, error.why);
            error
        })?;
    }
    Ok(e.t)
}

impl Encoder {
    /// Port `i`'s entries in every column.
    fn port(&mut self, i: usize, p: &ServicePort) -> Result<(), TableError> {
        let family = self.t.family;
        let e = self;
        let namespace = e.repeated(0, &p.namespace)?;
        let name = e.repeated(1, &p.name)?;
        let port_name = e.string(&p.port_name)?;
        let t = &mut e.t;
        t.namespaces.push(namespace);
        t.names.push(name);
        t.port_names.push(port_name);
        t.protocols.push(protocol_code(p.protocol));
        t.ports.push(p.port);
        t.node_ports.push(p.node_port);
        t.health_check_node_ports.push(p.health_check_node_port);
        t.affinity_seconds.push(p.affinity_timeout_seconds);
        let mut flags = 0;
        if p.cluster_ip.is_some() {
            flags |= flag::HAS_CLUSTER_IP;
        }
        if p.external_traffic_policy == TrafficPolicy::Local {
            flags |= flag::EXTERNAL_LOCAL;
        }
        if p.internal_traffic_policy == TrafficPolicy::Local {
            flags |= flag::INTERNAL_LOCAL;
        }
        t.flags.push(flags);
        match &p.cluster_ip {
            Some(ip) => push_address(family, &mut t.cluster_ips, ip, "cluster-ips", i)?,
            None => t.cluster_ips.extend(std::iter::repeat_n(0, stride(family))),
        }
        let end = push_addresses(family, &mut t.external_ips, p.external_ips.iter().copied(), "external-ips")?;
        t.external_ip_ends.push(end);
        let end =
            push_addresses(family, &mut t.load_balancer_ips, p.load_balancer_ips.iter().copied(), "load-balancer-ips")?;
        t.load_balancer_ip_ends.push(end);
        let ranges = p.load_balancer_source_ranges.iter().map(|c| c.addr);
        let end = push_addresses(family, &mut t.source_range_words, ranges, "source-range-words")?;
        t.source_range_ends.push(end);
        t.source_range_prefixes.extend(p.load_balancer_source_ranges.iter().map(|c| c.prefix_len));
        for ep in &p.endpoints {
            let zone = e.zone(ep.zone.as_deref())?;
            let t = &mut e.t;
            let at = t.endpoint_ports.len();
            push_address(family, &mut t.endpoint_words, &ep.ip, "endpoint-words", at)?;
            t.endpoint_ports.push(ep.port);
            let c = &ep.conditions;
            t.endpoint_conditions.push(
                [
                    (c.ready, condition::READY),
                    (c.serving, condition::SERVING),
                    (c.terminating, condition::TERMINATING),
                    (c.is_local, condition::IS_LOCAL),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .fold(0, |all, (_, bit)| all | bit),
            );
            t.endpoint_zones.push(zone);
            t.endpoint_weights.push(ep.weight);
        }
        let t = &mut e.t;
        t.endpoint_ends.push(len_u32(t.endpoint_ports.len(), "endpoint-ends")?);
        t.cluster_endpoints.extend_from_slice(&p.cluster_endpoints);
        t.cluster_endpoint_ends.push(len_u32(t.cluster_endpoints.len(), "cluster-endpoint-ends")?);
        t.local_endpoints.extend_from_slice(&p.local_endpoints);
        t.local_endpoint_ends.push(len_u32(t.local_endpoints.len(), "local-endpoint-ends")?);
        let at = len_u32(i, "namespaces")?;
        if let Some(plan) = &p.cluster_plan {
            t.cluster_plans.push((at, plan.clone()));
        }
        if let Some(plan) = &p.local_plan {
            t.local_plans.push((at, plan.clone()));
        }
        Ok(())
    }
}

impl PortTable {
    /// A table of no ports.
    pub fn empty(family: IpFamily) -> PortTable {
        PortTable {
            family,
            text: String::new(),
            text_ends: Vec::new(),
            namespaces: Vec::new(),
            names: Vec::new(),
            port_names: Vec::new(),
            protocols: Vec::new(),
            ports: Vec::new(),
            node_ports: Vec::new(),
            health_check_node_ports: Vec::new(),
            affinity_seconds: Vec::new(),
            flags: Vec::new(),
            cluster_ips: Vec::new(),
            external_ip_ends: Vec::new(),
            external_ips: Vec::new(),
            load_balancer_ip_ends: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_range_ends: Vec::new(),
            source_range_words: Vec::new(),
            source_range_prefixes: Vec::new(),
            endpoint_ends: Vec::new(),
            endpoint_words: Vec::new(),
            endpoint_ports: Vec::new(),
            endpoint_conditions: Vec::new(),
            endpoint_zones: Vec::new(),
            endpoint_weights: Vec::new(),
            cluster_endpoint_ends: Vec::new(),
            cluster_endpoints: Vec::new(),
            local_endpoint_ends: Vec::new(),
            local_endpoints: Vec::new(),
            cluster_plans: Vec::new(),
            local_plans: Vec::new(),
        }
    }

    /// How many ports the table holds.
    pub fn len(&self) -> usize {
        self.namespaces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
    }
}

/// Checked views of a table's columns.
struct Reader<'a> {
    t: &'a PortTable,
    stride: usize,
}

impl<'a> Reader<'a> {
    /// A per-port column: exactly one entry per port.
    fn per_port<T>(&self, column: &'static str, values: &[T], per: usize) -> Result<(), TableError> {
        let want = self.t.len() * per;
        if values.len() != want {
            return Err(err(
                column,
                values.len(),
                format!("{} entries for {} ports (want {want})", values.len(), self.t.len()),
            ));
        }
        Ok(())
    }

    /// Ends: one per port, never decreasing, the last one `items`.
    fn ends(&self, column: &'static str, ends: &[u32], items: usize) -> Result<(), TableError> {
        self.per_port(column, ends, 1)?;
        let mut last = 0;
        for (i, &end) in ends.iter().enumerate() {
            if end < last {
                return Err(err(column, i, format!("end {end} before the previous end {last}")));
            }
            last = end;
        }
        if last as usize != items {
            return Err(err(
                column,
                ends.len().saturating_sub(1),
                format!("last end {last}, but the values hold {items}"),
            ));
        }
        Ok(())
    }

    /// Port `i`'s range of an ends column (checked by `ends`).
    fn range(ends: &[u32], i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 { 0 } else { ends[i - 1] as usize };
        start..ends[i] as usize
    }

    fn string(&self, column: &'static str, i: usize, index: u32) -> Result<&'a str, TableError> {
        let t = self.t;
        let k = index as usize;
        let Some(&end) = t.text_ends.get(k) else {
            return Err(err(column, i, format!("string {index} of {}", t.text_ends.len())));
        };
        let start = if k == 0 { 0 } else { t.text_ends[k - 1] };
        let s = t
            .text
            .get(start as usize..end as usize)
            .ok_or_else(|| err("text-ends", k, "not a string of text (past its end, or inside a character)"))?;
        if s.len() > MAX_STRING {
            return Err(err("text-ends", k, format!("a string of {} bytes (at most {MAX_STRING})", s.len())));
        }
        Ok(s)
    }

    fn address(&self, words: &[u32], item: usize) -> IpAddr {
        let w = &words[item * self.stride..(item + 1) * self.stride];
        match self.t.family {
            IpFamily::V4 => IpAddr::V4(Ipv4Addr::from(w[0])),
            IpFamily::V6 => {
                let mut o = [0u8; 16];
                for (k, word) in w.iter().enumerate() {
                    o[4 * k..4 * k + 4].copy_from_slice(&word.to_be_bytes());
                }
                IpAddr::V6(Ipv6Addr::from(o))
            }
        }
    }
}

/// The ports a table describes, in its order, each with its key derived
/// from its namespace, name and port name (and no annotations and no
/// scheduler: a backend sees neither).
pub fn decode(t: &PortTable) -> Result<Vec<ServicePort>, TableError> {
    let r = Reader { t, stride: stride(t.family) };
    let n = t.len();
    // The text's ends: never decreasing, within the text (character
    // boundaries are checked where a string is read).
    let mut last = 0;
    for (i, &end) in t.text_ends.iter().enumerate() {
        if end < last || !t.text.is_char_boundary(end as usize) {
            return Err(err("text-ends", i, format!("end {end} (previous {last}, text of {} bytes)", t.text.len())));
        }
        if (end - last) as usize > MAX_STRING {
            return Err(err("text-ends", i, format!("a string of {} bytes (at most {MAX_STRING})", end - last)));
        }
        last = end;
    }
    r.per_port("names", &t.names, 1)?;
    r.per_port("port-names", &t.port_names, 1)?;
    r.per_port("protocols", &t.protocols, 1)?;
    r.per_port("ports", &t.ports, 1)?;
    r.per_port("node-ports", &t.node_ports, 1)?;
    r.per_port("health-check-node-ports", &t.health_check_node_ports, 1)?;
    r.per_port("affinity-seconds", &t.affinity_seconds, 1)?;
    r.per_port("flags", &t.flags, 1)?;
    r.per_port("cluster-ips", &t.cluster_ips, r.stride)?;
    let words = |v: &[u32], column| {
        if !v.len().is_multiple_of(r.stride) {
            return Err(err(column, v.len(), format!("{} words, not whole addresses", v.len())));
        }
        Ok(v.len() / r.stride)
    };
    r.ends("external-ip-ends", &t.external_ip_ends, words(&t.external_ips, "external-ips")?)?;
    r.ends("load-balancer-ip-ends", &t.load_balancer_ip_ends, words(&t.load_balancer_ips, "load-balancer-ips")?)?;
    let ranges = words(&t.source_range_words, "source-range-words")?;
    r.ends("source-range-ends", &t.source_range_ends, ranges)?;
    if t.source_range_prefixes.len() != ranges {
        return Err(err(
            "source-range-prefixes",
            t.source_range_prefixes.len(),
            format!("want one per range ({ranges})"),
        ));
    }
    let max_prefix = 32 * r.stride as u8;
    if let Some(i) = t.source_range_prefixes.iter().position(|&p| p > max_prefix) {
        return Err(err(
            "source-range-prefixes",
            i,
            format!("prefix {} over {max_prefix}", t.source_range_prefixes[i]),
        ));
    }
    let endpoints = t.endpoint_ports.len();
    r.ends("endpoint-ends", &t.endpoint_ends, endpoints)?;
    if words(&t.endpoint_words, "endpoint-words")? != endpoints {
        return Err(err("endpoint-words", t.endpoint_words.len(), format!("want {endpoints} addresses")));
    }
    for (column, len) in [
        ("endpoint-conditions", t.endpoint_conditions.len()),
        ("endpoint-zones", t.endpoint_zones.len()),
        ("endpoint-weights", t.endpoint_weights.len()),
    ] {
        if len != endpoints {
            return Err(err(column, len, format!("want one per endpoint ({endpoints})")));
        }
    }
    r.ends("cluster-endpoint-ends", &t.cluster_endpoint_ends, t.cluster_endpoints.len())?;
    r.ends("local-endpoint-ends", &t.local_endpoint_ends, t.local_endpoints.len())?;
    for (column, plans) in [("cluster-plans", &t.cluster_plans), ("local-plans", &t.local_plans)] {
        let mut next = 0;
        for (k, (port, _)) in plans.iter().enumerate() {
            if (*port as usize) < next || *port as usize >= n {
                return Err(err(
                    column,
                    k,
                    format!("port {port}: not after the previous plan's, or past the {n} ports"),
                ));
            }
            next = *port as usize + 1;
        }
    }

    let mut out = Vec::with_capacity(n);
    let (mut cluster_plans, mut local_plans) = (t.cluster_plans.iter().peekable(), t.local_plans.iter().peekable());
    for i in 0..n {
        let namespace = r.string("namespaces", i, t.namespaces[i])?;
        let name = r.string("names", i, t.names[i])?;
        let port_name = r.string("port-names", i, t.port_names[i])?;
        let protocol = match t.protocols[i] {
            0 => Protocol::Tcp,
            1 => Protocol::Udp,
            2 => Protocol::Sctp,
            other => return Err(err("protocols", i, format!("{other} is no protocol (0 TCP, 1 UDP, 2 SCTP)"))),
        };
        let flags = t.flags[i];
        if flags & !flag::ALL != 0 {
            return Err(err("flags", i, format!("unknown bits {:#04x}", flags & !flag::ALL)));
        }
        let cluster_words = &t.cluster_ips[i * r.stride..(i + 1) * r.stride];
        let cluster_ip = if flags & flag::HAS_CLUSTER_IP != 0 {
            Some(r.address(&t.cluster_ips, i))
        } else if cluster_words.iter().any(|&w| w != 0) {
            return Err(err("cluster-ips", i, "words for a port whose flags say it has no cluster IP"));
        } else {
            None
        };
        let policy = |bit| if flags & bit != 0 { TrafficPolicy::Local } else { TrafficPolicy::Cluster };
        let addresses =
            |ends: &[u32], words: &[u32]| Reader::range(ends, i).map(|k| r.address(words, k)).collect::<Vec<_>>();
        let mut port = ServicePort::new(namespace, name, port_name, protocol, t.ports[i]);
        port.cluster_ip = cluster_ip;
        port.node_port = t.node_ports[i];
        port.health_check_node_port = t.health_check_node_ports[i];
        port.affinity_timeout_seconds = t.affinity_seconds[i];
        port.external_traffic_policy = policy(flag::EXTERNAL_LOCAL);
        port.internal_traffic_policy = policy(flag::INTERNAL_LOCAL);
        port.external_ips = addresses(&t.external_ip_ends, &t.external_ips);
        port.load_balancer_ips = addresses(&t.load_balancer_ip_ends, &t.load_balancer_ips);
        port.load_balancer_source_ranges = Reader::range(&t.source_range_ends, i)
            .map(|k| Cidr { addr: r.address(&t.source_range_words, k), prefix_len: t.source_range_prefixes[k] })
            .collect();
        let own = Reader::range(&t.endpoint_ends, i);
        let count = own.len();
        let mut endpoints = Vec::with_capacity(count);
        for k in own {
            let c = t.endpoint_conditions[k];
            if c & !condition::ALL != 0 {
                return Err(err("endpoint-conditions", k, format!("unknown bits {:#04x}", c & !condition::ALL)));
            }
            let zone = match t.endpoint_zones[k] {
                0 => None,
                z => Some(Box::from(r.string("endpoint-zones", k, z - 1)?)),
            };
            endpoints.push(Endpoint {
                ip: r.address(&t.endpoint_words, k),
                port: t.endpoint_ports[k],
                conditions: Conditions {
                    ready: c & condition::READY != 0,
                    serving: c & condition::SERVING != 0,
                    terminating: c & condition::TERMINATING != 0,
                    is_local: c & condition::IS_LOCAL != 0,
                },
                zone,
                weight: t.endpoint_weights[k],
            });
        }
        port.endpoints = endpoints;
        let positions = |column, ends: &[u32], values: &[u32]| {
            let range = Reader::range(ends, i);
            let own = &values[range.clone()];
            match own.iter().position(|&p| p as usize >= count) {
                Some(k) => {
                    Err(err(column, range.start + k, format!("endpoint {} of port {i}, which has {count}", own[k])))
                }
                None => Ok(own.to_vec()),
            }
        };
        port.cluster_endpoints = positions("cluster-endpoints", &t.cluster_endpoint_ends, &t.cluster_endpoints)?;
        port.local_endpoints = positions("local-endpoints", &t.local_endpoint_ends, &t.local_endpoints)?;
        port.cluster_plan = cluster_plans.next_if(|(p, _)| *p as usize == i).map(|(_, plan)| plan.clone());
        port.local_plan = local_plans.next_if(|(p, _)| *p as usize == i).map(|(_, plan)| plan.clone());
        out.push(port);
    }
    Ok(out)
}

/// `$to { extra fields, every scalar column of $from moved }`: the columns
/// the two sides' records share by name and type, written once.
#[doc(hidden)]
#[macro_export]
macro_rules! __kpx_table_columns {
    ($from:ident, $($to:ident)::+ { $($extra:tt)* }) => {
        $($to)::+ {
            $($extra)*,
            text: $from.text,
            text_ends: $from.text_ends,
            namespaces: $from.namespaces,
            names: $from.names,
            port_names: $from.port_names,
            protocols: $from.protocols,
            ports: $from.ports,
            node_ports: $from.node_ports,
            health_check_node_ports: $from.health_check_node_ports,
            affinity_seconds: $from.affinity_seconds,
            flags: $from.flags,
            cluster_ips: $from.cluster_ips,
            external_ip_ends: $from.external_ip_ends,
            external_ips: $from.external_ips,
            load_balancer_ip_ends: $from.load_balancer_ip_ends,
            load_balancer_ips: $from.load_balancer_ips,
            source_range_ends: $from.source_range_ends,
            source_range_words: $from.source_range_words,
            source_range_prefixes: $from.source_range_prefixes,
            endpoint_ends: $from.endpoint_ends,
            endpoint_words: $from.endpoint_words,
            endpoint_ports: $from.endpoint_ports,
            endpoint_conditions: $from.endpoint_conditions,
            endpoint_zones: $from.endpoint_zones,
            endpoint_weights: $from.endpoint_weights,
            cluster_endpoint_ends: $from.cluster_endpoint_ends,
            cluster_endpoints: $from.cluster_endpoints,
            local_endpoint_ends: $from.local_endpoint_ends,
            local_endpoints: $from.local_endpoints,
        }
    };
}

/// Defines `to_wit_table` / `from_wit_table` in a module `wit_table`,
/// between [`PortTable`] and the `port-table` record that `bindgen!`
/// (host) or `wit_bindgen::generate!` (guest) generates in the `tables`
/// module at the first path, with the `types` module at the second path
/// (whose `wit_convert` conversions, from [`crate::wit_conversions!`],
/// must be in scope as `wit_convert`). Columns are moved, not copied.
#[macro_export]
macro_rules! table_conversions {
    ($($tables:ident)::+, $($types:ident)::+) => {
        #[allow(dead_code)]
        pub(crate) mod wit_table {
            use $($tables)::+ as wit;
            use $($types)::+ as wt;
            use $crate::model::IpFamily;
            use $crate::table::PortTable;
            use super::wit_convert::{from_wit_plan, to_wit_plan};

            pub fn to_wit_table(t: PortTable) -> wit::PortTable {
                let plans = |v: Vec<(u32, $crate::plan::Plan)>| v.iter().map(|(i, p)| (*i, to_wit_plan(p))).collect();
                let family = match t.family {
                    IpFamily::V4 => wt::IpFamily::Ipv4,
                    IpFamily::V6 => wt::IpFamily::Ipv6,
                };
                $crate::__kpx_table_columns!(t, wit::PortTable { family, cluster_plans: plans(t.cluster_plans), local_plans: plans(t.local_plans) })
            }

            pub fn from_wit_table(t: wit::PortTable) -> PortTable {
                let plans = |v: Vec<(u32, wt::Plan)>| v.into_iter().map(|(i, p)| (i, from_wit_plan(p))).collect();
                let family = match t.family {
                    wt::IpFamily::Ipv4 => IpFamily::V4,
                    wt::IpFamily::Ipv6 => IpFamily::V6,
                };
                $crate::__kpx_table_columns!(t, PortTable { family, cluster_plans: plans(t.cluster_plans), local_plans: plans(t.local_plans) })
            }
        }
    };
}

#[cfg(test)]
mod tests;
