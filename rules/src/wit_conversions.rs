//! Conversions between the rule model and the types that `bindgen!`
//! (wasmtime, host side) and `wit_bindgen::generate!` (guest side) generate
//! for `kpx:proxier/types`. Both generators give the types the same names
//! and shapes, so one macro writes the conversions for either side.

/// Defines `to_wit_*` / `from_wit_*` functions for the generated `types`
/// module at the given path, e.g.
/// `kpx_rules::wit_conversions!(crate::bindings::kpx::proxier::types);`
#[macro_export]
macro_rules! wit_conversions {
    ($($seg:ident)::+) => {
        #[allow(dead_code)]
        pub(crate) mod wit_convert {
            use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
            use $($seg)::+ as wit;
            use $crate::model;

            pub fn to_wit_ip(ip: &IpAddr) -> wit::IpAddress {
                match ip {
                    IpAddr::V4(v4) => wit::IpAddress::V4(u32::from(*v4)),
                    IpAddr::V6(v6) => {
                        let w = u128::from(*v6);
                        wit::IpAddress::V6(((w >> 96) as u32, (w >> 64) as u32, (w >> 32) as u32, w as u32))
                    }
                }
            }

            pub fn from_wit_ip(ip: &wit::IpAddress) -> IpAddr {
                match ip {
                    wit::IpAddress::V4(w) => IpAddr::V4(Ipv4Addr::from(*w)),
                    wit::IpAddress::V6((a, b, c, d)) => IpAddr::V6(Ipv6Addr::from(
                        (u128::from(*a) << 96) | (u128::from(*b) << 64) | (u128::from(*c) << 32) | u128::from(*d),
                    )),
                }
            }

            pub fn to_wit_cidr(c: &model::Cidr) -> wit::Cidr {
                wit::Cidr { address: to_wit_ip(&c.addr), prefix_len: c.prefix_len }
            }

            pub fn from_wit_cidr(c: &wit::Cidr) -> model::Cidr {
                model::Cidr { addr: from_wit_ip(&c.address), prefix_len: c.prefix_len }
            }

            fn to_wit_protocol(p: model::Protocol) -> wit::Protocol {
                match p {
                    model::Protocol::Tcp => wit::Protocol::Tcp,
                    model::Protocol::Udp => wit::Protocol::Udp,
                    model::Protocol::Sctp => wit::Protocol::Sctp,
                }
            }

            fn from_wit_protocol(p: wit::Protocol) -> model::Protocol {
                match p {
                    wit::Protocol::Tcp => model::Protocol::Tcp,
                    wit::Protocol::Udp => model::Protocol::Udp,
                    wit::Protocol::Sctp => model::Protocol::Sctp,
                }
            }

            fn to_wit_policy(p: model::TrafficPolicy) -> wit::TrafficPolicy {
                match p {
                    model::TrafficPolicy::Cluster => wit::TrafficPolicy::Cluster,
                    model::TrafficPolicy::Local => wit::TrafficPolicy::Local,
                }
            }

            fn from_wit_policy(p: wit::TrafficPolicy) -> model::TrafficPolicy {
                match p {
                    wit::TrafficPolicy::Cluster => model::TrafficPolicy::Cluster,
                    wit::TrafficPolicy::Local => model::TrafficPolicy::Local,
                }
            }

            fn to_wit_endpoints(eps: &[model::Endpoint]) -> wit::Endpoints {
                let mut out = wit::Endpoints {
                    address_words: Vec::with_capacity(eps.len()),
                    ports: Vec::with_capacity(eps.len()),
                    conditions: Vec::with_capacity(eps.len()),
                    zone_index: Vec::with_capacity(eps.len()),
                    zones: Vec::new(),
                    weights: Vec::with_capacity(eps.len()),
                };
                for ep in eps {
                    match ep.ip {
                        IpAddr::V4(v4) => out.address_words.push(u32::from(v4)),
                        IpAddr::V6(v6) => {
                            let w = u128::from(v6);
                            out.address_words.extend([(w >> 96) as u32, (w >> 64) as u32, (w >> 32) as u32, w as u32]);
                        }
                    }
                    out.ports.push(ep.port);
                    let c = [
                        (ep.conditions.ready, wit::EndpointConditions::READY),
                        (ep.conditions.serving, wit::EndpointConditions::SERVING),
                        (ep.conditions.terminating, wit::EndpointConditions::TERMINATING),
                        (ep.conditions.is_local, wit::EndpointConditions::IS_LOCAL),
                    ]
                    .into_iter()
                    .filter(|(on, _)| *on)
                    .fold(wit::EndpointConditions::empty(), |all, (_, flag)| all | flag);
                    out.conditions.push(c);
                    let zone = match &ep.zone {
                        None => 0,
                        Some(z) => match out.zones.iter().position(|known| **known == **z) {
                            Some(i) => i as u16 + 1,
                            None => {
                                out.zones.push(z.to_string());
                                out.zones.len() as u16
                            }
                        },
                    };
                    out.zone_index.push(zone);
                    out.weights.push(ep.weight);
                }
                out
            }

            fn from_wit_endpoints(eps: wit::Endpoints) -> Vec<model::Endpoint> {
                let n = eps.ports.len();
                let stride = if n > 0 && eps.address_words.len() == 4 * n { 4 } else { 1 };
                (0..n)
                    .filter_map(|i| {
                        let words = eps.address_words.get(i * stride..(i + 1) * stride)?;
                        let ip = if stride == 4 {
                            from_wit_ip(&wit::IpAddress::V6((words[0], words[1], words[2], words[3])))
                        } else {
                            IpAddr::V4(Ipv4Addr::from(words[0]))
                        };
                        let c = eps.conditions.get(i).copied().unwrap_or(wit::EndpointConditions::empty());
                        let zone = match eps.zone_index.get(i).copied().unwrap_or(0) {
                            0 => None,
                            z => eps.zones.get(usize::from(z) - 1).map(|z| z.as_str().into()),
                        };
                        Some(model::Endpoint {
                            ip,
                            port: eps.ports[i],
                            conditions: model::Conditions {
                                ready: c.contains(wit::EndpointConditions::READY),
                                serving: c.contains(wit::EndpointConditions::SERVING),
                                terminating: c.contains(wit::EndpointConditions::TERMINATING),
                                is_local: c.contains(wit::EndpointConditions::IS_LOCAL),
                            },
                            zone,
                            weight: eps.weights.get(i).copied().unwrap_or(1),
                        })
                    })
                    .collect()
            }

            /// For a backend or a scheduler: no annotations.
            pub fn to_wit_service_port(s: &model::ServicePort) -> wit::ServicePort {
                to_wit_service_port_with(s, Vec::new())
            }

            /// With the annotations one receiver may see.
            pub fn to_wit_service_port_with(s: &model::ServicePort, annotations: Vec<(String, String)>) -> wit::ServicePort {
                wit::ServicePort {
                    key: s.key.clone(),
                    namespace: s.namespace.clone(),
                    name: s.name.clone(),
                    port_name: s.port_name.clone(),
                    protocol: to_wit_protocol(s.protocol),
                    cluster_ip: s.cluster_ip.as_ref().map(to_wit_ip),
                    port: s.port,
                    node_port: s.node_port,
                    external_ips: s.external_ips.iter().map(to_wit_ip).collect(),
                    load_balancer_ips: s.load_balancer_ips.iter().map(to_wit_ip).collect(),
                    load_balancer_source_ranges: s.load_balancer_source_ranges.iter().map(to_wit_cidr).collect(),
                    external_traffic_policy: to_wit_policy(s.external_traffic_policy),
                    internal_traffic_policy: to_wit_policy(s.internal_traffic_policy),
                    health_check_node_port: s.health_check_node_port,
                    affinity_timeout_seconds: s.affinity_timeout_seconds,
                    endpoints: to_wit_endpoints(&s.endpoints),
                    cluster_endpoints: s.cluster_endpoints.clone(),
                    local_endpoints: s.local_endpoints.clone(),
                    cluster_plan: s.cluster_plan.as_ref().map(to_wit_plan),
                    local_plan: s.local_plan.as_ref().map(to_wit_plan),
                    annotations,
                }
            }

            pub fn from_wit_service_port(s: wit::ServicePort) -> model::ServicePort {
                model::ServicePort {
                    key: s.key,
                    namespace: s.namespace,
                    name: s.name,
                    port_name: s.port_name,
                    protocol: from_wit_protocol(s.protocol),
                    cluster_ip: s.cluster_ip.as_ref().map(from_wit_ip),
                    port: s.port,
                    node_port: s.node_port,
                    external_ips: s.external_ips.iter().map(from_wit_ip).collect(),
                    load_balancer_ips: s.load_balancer_ips.iter().map(from_wit_ip).collect(),
                    load_balancer_source_ranges: s.load_balancer_source_ranges.iter().map(from_wit_cidr).collect(),
                    external_traffic_policy: from_wit_policy(s.external_traffic_policy),
                    internal_traffic_policy: from_wit_policy(s.internal_traffic_policy),
                    health_check_node_port: s.health_check_node_port,
                    affinity_timeout_seconds: s.affinity_timeout_seconds,
                    scheduler: None,
                    endpoints: from_wit_endpoints(s.endpoints),
                    cluster_endpoints: s.cluster_endpoints,
                    local_endpoints: s.local_endpoints,
                    cluster_plan: s.cluster_plan.map(from_wit_plan),
                    local_plan: s.local_plan.map(from_wit_plan),
                    annotations: s.annotations,
                }
            }

            pub fn to_wit_slot_table(t: &model::SlotTable) -> wit::SlotTable {
                wit::SlotTable {
                    field: match t.field {
                        model::HashField::Source => wit::HashField::Source,
                        model::HashField::Destination => wit::HashField::Destination,
                    },
                    seed: t.seed,
                    rows: t.rows,
                    cols: t.cols,
                    slots: t.slots.clone(),
                }
            }

            pub fn from_wit_slot_table(t: wit::SlotTable) -> model::SlotTable {
                model::SlotTable {
                    field: match t.field {
                        wit::HashField::Source => model::HashField::Source,
                        wit::HashField::Destination => model::HashField::Destination,
                    },
                    seed: t.seed,
                    rows: t.rows,
                    cols: t.cols,
                    slots: t.slots,
                }
            }

            pub fn to_wit_plan(p: &model::Plan) -> wit::Plan {
                match p {
                    model::Plan::Weighted(w) => wit::Plan::Weighted(w.clone()),
                    model::Plan::Sequence(s) => wit::Plan::Sequence(s.clone()),
                    model::Plan::Slots(t) => wit::Plan::Slots(to_wit_slot_table(t)),
                    model::Plan::Kernel(k) => wit::Plan::Kernel(wit::KernelPlan {
                        scheduler: k.scheduler.clone(),
                        weights: k.weights.clone(),
                        flags: k.flags,
                    }),
                }
            }

            pub fn from_wit_plan(p: wit::Plan) -> model::Plan {
                match p {
                    wit::Plan::Weighted(w) => model::Plan::Weighted(w),
                    wit::Plan::Sequence(s) => model::Plan::Sequence(s),
                    wit::Plan::Slots(t) => model::Plan::Slots(from_wit_slot_table(t)),
                    wit::Plan::Kernel(k) => model::Plan::Kernel(model::KernelPlan {
                        scheduler: k.scheduler,
                        weights: k.weights,
                        flags: k.flags,
                    }),
                }
            }

            pub fn to_wit_node(n: &model::Node) -> wit::Node {
                wit::Node {
                    name: n.name.clone(),
                    addresses: n.addresses.iter().map(to_wit_ip).collect(),
                    zone: n.zone.clone(),
                    labels: n.labels.clone(),
                    pod_cidrs: n.pod_cidrs.iter().map(to_wit_cidr).collect(),
                }
            }

            pub fn from_wit_node(n: wit::Node) -> model::Node {
                model::Node {
                    name: n.name,
                    addresses: n.addresses.iter().map(from_wit_ip).collect(),
                    zone: n.zone,
                    labels: n.labels,
                    pod_cidrs: n.pod_cidrs.iter().map(from_wit_cidr).collect(),
                }
            }

            pub fn to_wit_settings(s: &model::Settings) -> wit::Settings {
                wit::Settings {
                    family: match s.family {
                        model::IpFamily::V4 => wit::IpFamily::Ipv4,
                        model::IpFamily::V6 => wit::IpFamily::Ipv6,
                    },
                    mode: match s.mode {
                        model::ProxyMode::Iptables => wit::ProxyMode::Iptables,
                        model::ProxyMode::Nftables => wit::ProxyMode::Nftables,
                        model::ProxyMode::Ipvs => wit::ProxyMode::Ipvs,
                        model::ProxyMode::Userspace => wit::ProxyMode::Userspace,
                    },
                    local_traffic: match &s.local_traffic {
                        model::LocalTraffic::None => wit::LocalTraffic::None,
                        model::LocalTraffic::Cidrs(c) => wit::LocalTraffic::Cidrs(c.iter().map(to_wit_cidr).collect()),
                        model::LocalTraffic::BridgeInterface(i) => wit::LocalTraffic::BridgeInterface(i.clone()),
                        model::LocalTraffic::InterfaceNamePrefix(p) => wit::LocalTraffic::InterfaceNamePrefix(p.clone()),
                    },
                    masquerade_all: s.masquerade_all,
                    masquerade_bit: s.masquerade_bit,
                    masquerade_random_fully: s.masquerade_random_fully,
                    nodeport_addresses: match &s.nodeport_addresses {
                        model::NodePortAddresses::All => wit::NodeportAddresses::All,
                        model::NodePortAddresses::Only(c) => wit::NodeportAddresses::Only(c.iter().map(to_wit_cidr).collect()),
                    },
                    localhost_nodeports: s.localhost_nodeports,
                    conntrack_tcp_be_liberal: s.conntrack_tcp_be_liberal,
                    extra: s.extra.clone(),
                }
            }

            pub fn from_wit_settings(s: wit::Settings) -> model::Settings {
                model::Settings {
                    family: match s.family {
                        wit::IpFamily::Ipv4 => model::IpFamily::V4,
                        wit::IpFamily::Ipv6 => model::IpFamily::V6,
                    },
                    mode: match s.mode {
                        wit::ProxyMode::Iptables => model::ProxyMode::Iptables,
                        wit::ProxyMode::Nftables => model::ProxyMode::Nftables,
                        wit::ProxyMode::Ipvs => model::ProxyMode::Ipvs,
                        wit::ProxyMode::Userspace => model::ProxyMode::Userspace,
                    },
                    local_traffic: match s.local_traffic {
                        wit::LocalTraffic::None => model::LocalTraffic::None,
                        wit::LocalTraffic::Cidrs(c) => model::LocalTraffic::Cidrs(c.iter().map(from_wit_cidr).collect()),
                        wit::LocalTraffic::BridgeInterface(i) => model::LocalTraffic::BridgeInterface(i),
                        wit::LocalTraffic::InterfaceNamePrefix(p) => model::LocalTraffic::InterfaceNamePrefix(p),
                    },
                    masquerade_all: s.masquerade_all,
                    masquerade_bit: s.masquerade_bit,
                    masquerade_random_fully: s.masquerade_random_fully,
                    nodeport_addresses: match s.nodeport_addresses {
                        wit::NodeportAddresses::All => model::NodePortAddresses::All,
                        wit::NodeportAddresses::Only(c) => model::NodePortAddresses::Only(c.iter().map(from_wit_cidr).collect()),
                    },
                    localhost_nodeports: s.localhost_nodeports,
                    conntrack_tcp_be_liberal: s.conntrack_tcp_be_liberal,
                    extra: s.extra,
                    localhost_nodeport_rejects: Vec::new(),
                    nfacct: false,
                }
            }

            pub fn to_wit_cluster(c: &model::Cluster) -> wit::Cluster {
                wit::Cluster { service_cidrs: c.service_cidrs.iter().map(to_wit_cidr).collect() }
            }

            pub fn from_wit_cluster(c: wit::Cluster) -> model::Cluster {
                model::Cluster { service_cidrs: c.service_cidrs.iter().map(from_wit_cidr).collect() }
            }

            pub fn to_wit_change(c: &model::Change) -> wit::Change {
                match c {
                    model::Change::Upsert(s) => wit::Change::Upsert(to_wit_service_port(s)),
                    model::Change::Remove(k) => wit::Change::Remove(k.clone()),
                    model::Change::Node(n) => wit::Change::Node(to_wit_node(n)),
                    model::Change::Cluster(c) => wit::Change::Cluster(to_wit_cluster(c)),
                }
            }

            pub fn from_wit_change(c: wit::Change) -> model::Change {
                match c {
                    wit::Change::Upsert(s) => model::Change::Upsert(from_wit_service_port(s)),
                    wit::Change::Remove(k) => model::Change::Remove(k),
                    wit::Change::Node(n) => model::Change::Node(from_wit_node(n)),
                    wit::Change::Cluster(c) => model::Change::Cluster(from_wit_cluster(c)),
                }
            }
        }
    };
}
